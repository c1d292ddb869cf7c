"""Growing a model in the middle of training, with the state that trains it: optimizer moments,
the EMA copy, frozen old tokens (paper §3.3 and §5).

Optimizer state: AdamW's moments of the old tokens are kept and the new rows start at zero (a student
re-implementation resets the whole optimizer instead, ``docs/reference/background.md``:
``growth.optimizer_state: reset``; on the Fashion-MNIST chain the two ended within the seed spread,
docs/growth.md). The step count is kept, so Adam's bias correction divides the new rows' moments by ~1
instead of by the small ``1 - β^k`` of a fresh start; how large their first updates then are depends on β2
(docs/growth.md).
"""
from typing import Dict, List, Mapping, Optional, Sequence, Union

import torch
from timm.utils import unwrap_model
from torch.utils.hooks import RemovableHandle

from .net2net import mlps, net2net_widen
from .tokens import grow, model_size, pattention_layers, token_counts

__all__ = ['grow_optimizer_state', 'grow_training_state', 'freeze_old_tokens', 'scale_new_token_updates']


def grow_optimizer_state(optimizer: torch.optim.Optimizer, old_to_new: dict, expand: Optional[dict] = None) -> None:
    """Point ``optimizer`` at grown parameters, keeping the old rows' state and zero-filling new rows.

    Args:
        optimizer: e.g. AdamW, whose ``param_groups`` hold the pre-growth parameters.
        old_to_new: ``{old parameter: new parameter}`` (new has ≥ rows along dim 0).
        expand: ``{old parameter: fn(state tensor) -> new state tensor}`` to use instead of the
            first-rows copy for those parameters (Net2Net gathers the copied units' moments).

    Every tensor state entry with the old parameter's shape (AdamW's ``exp_avg``, ``exp_avg_sq``)
    is copied into the first rows of a zero tensor of the new shape (or passed through ``expand``);
    scalars (``step``) are kept.
    """
    def first_rows(old, new, value):
        grown = value.new_zeros(new.shape)
        grown[:old.shape[0]] = value
        return grown

    expand = expand or {}
    for group in optimizer.param_groups:
        group['params'] = [old_to_new.get(p, p) for p in group['params']]
    for old, new in old_to_new.items():
        if old not in optimizer.state:
            continue
        state = optimizer.state.pop(old)
        fn = expand.get(old, lambda value: first_rows(old, new, value))
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == old.shape:
                state[key] = fn(value)
        optimizer.state[new] = state


def grow_training_state(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        ema_model: Optional[torch.nn.Module] = None,
        key_init: str = 'zeros',
        value_init: str = 'normal',
        to: Union[None, str, Dict[str, int]] = None,
        tau: str = 'keep',
        **add: int,
) -> dict:
    """Grow a model in the middle of training, with the state that trains it (paper §3.3).

    ``model`` grows in place by ``add`` (``{kind: tokens}``) or to ``to`` (see [`grow`][tkvision.growth.tokens.grow]);
    the optimizer is remapped to the new parameters (`grow_optimizer_state`: old rows keep their moments, new rows
    start at zero); the EMA copy, if any, grows to the same counts and takes the new rows from the live model (an
    average of rows that did not exist would be meaningless); ``tau`` as [`grow`][tkvision.growth.tokens.grow] says,
    for both. Call it with the same torch seed on every rank so all ranks append identical tokens.

    A model without Pattentions (a timm ViT) is widened by Net2Net instead, ``to={'mlp_hidden': N}``
    ([`net2net_widen`][tkvision.growth.net2net.net2net_widen]); its optimizer moments follow the copied units and the
    EMA copy is widened with the same units.

    Returns:
        `model_size` after growth (``{kind: num_tokens}`` or ``{'mlp_hidden': N}``).
    """
    layers = pattention_layers(model)
    if not layers:
        return _widen_training_state(model, optimizer, ema_model, to)
    before = {n: (m.keys, m.value_param_tokens) for n, (_, m) in layers.items()}
    # add holds token counts by kind only (mypy cannot tell its keys from grow's other keywords)
    grow(model, key_init=key_init, value_init=value_init, to=to, tau=tau, **add)  # type: ignore[arg-type]
    old_to_new = {}
    for n, (_, m) in pattention_layers(model).items():
        old_to_new[before[n][0]] = m.keys
        old_to_new[before[n][1]] = m.value_param_tokens
    grow_optimizer_state(optimizer, old_to_new)
    counts = token_counts(model)
    if ema_model is not None:
        grow(ema_model, to=counts, key_init='zeros', value_init='zeros', tau=tau)
        live = pattention_layers(model)
        with torch.no_grad():
            for n, (_, m) in pattention_layers(ema_model).items():
                n_old = before[n][0].shape[0]
                m.keys[n_old:] = live[n][1].keys[n_old:]
                m.value_param_tokens[n_old:] = live[n][1].value_param_tokens[n_old:]
    return counts


def _widen_training_state(model, optimizer, ema_model, to) -> dict:
    """`grow_training_state` for a ViT: Net2Net widening, moments gathered by copied unit."""
    if not to or set(to) != {'mlp_hidden'}:
        raise ValueError(f"a model without Pattentions grows by Net2Net only: to={{'mlp_hidden': N}}, got {to!r}")
    before = {n: (m.fc1.weight, m.fc1.bias, m.fc2.weight) for n, m in mlps(model).items()}
    plan = net2net_widen(model, to['mlp_hidden'])
    after, old_to_new, expand = mlps(model), {}, {}
    for name, (idx, _) in plan.items():  # (old parameter, new parameter, dim of the hidden units)
        new = after[name]
        for old, param, dim in zip(before[name], (new.fc1.weight, new.fc1.bias, new.fc2.weight), (0, 0, 1)):
            if old is not None:
                old_to_new[old] = param
                expand[old] = lambda value, dim=dim, idx=idx: value.index_select(dim, idx)
    grow_optimizer_state(optimizer, old_to_new, expand)
    if ema_model is not None:
        net2net_widen(ema_model, to['mlp_hidden'], plan=plan)
    return model_size(model)


class _Unfreeze:
    """A handle whose ``remove()`` gives frozen parameters their gradients back."""

    def __init__(self, params):
        self.params = params

    def remove(self):
        for param in self.params:
            param.requires_grad_(True)


def freeze_old_tokens(
        model: torch.nn.Module,
        old_counts: Mapping[str, int],
        optimizer: Optional[torch.optim.Optimizer] = None,
        trainable: Sequence[str] = ('head',),
) -> list:
    """Parameter-efficient tuning (paper §5): train only appended tokens and ``trainable`` modules.

    Non-Pattention parameters outside ``trainable`` get ``requires_grad=False``; in each Pattention,
    gradients of the first ``old_counts[kind]`` rows are zeroed by a hook, and (with ``optimizer``)
    those rows are restored after every step, so weight decay cannot move them either.

    Args:
        old_counts: ``{kind: rows to freeze}``, e.g. the pre-growth
            [`token_counts`][tkvision.growth.tokens.token_counts].
        optimizer: the optimizer that will train the model (for the post-step restore).

    Returns:
        The list of handles; removing them all unfreezes (the hooks go, and the parameters frozen here
        get ``requires_grad=True`` back).
    """
    handles: List[Union[_Unfreeze, RemovableHandle]] = []
    frozen = []
    layers = pattention_layers(model)
    pattention_params = {id(p) for _, layer in layers.values() for p in layer.parameters()}
    inner = unwrap_model(model)
    stopped = [param for name, param in inner.named_parameters() if param.requires_grad
               and id(param) not in pattention_params and not any(name.startswith(t + '.') for t in trainable)]
    for param in stopped:
        param.requires_grad_(False)
    handles.append(_Unfreeze(stopped))
    for name, (kind, layer) in layers.items():
        n_old = old_counts.get(kind, 0)
        for param in (layer.keys, layer.value_param_tokens):
            def zero_old(grad, n_old=n_old):
                grad = grad.clone()
                grad[:n_old] = 0
                return grad
            handles.append(param.register_hook(zero_old))
            frozen.append((param, param.detach()[:n_old].clone()))
    if optimizer is not None:
        def restore(opt, args, kwargs):
            with torch.no_grad():
                for param, rows in frozen:
                    param[:rows.shape[0]] = rows
        handles.append(optimizer.register_step_post_hook(restore))
    return handles


def scale_new_token_updates(
        model: torch.nn.Module,
        old_counts: Mapping[str, int],
        optimizer: torch.optim.Optimizer,
        lr_scale: float,
) -> list:
    """Step the rows appended since ``old_counts`` at ``lr_scale`` times the learning rate; every other row and
    parameter steps as before.

    A new token's rows share a tensor with the old ones, so no param group can give them a learning rate of their
    own. Instead each optimizer step's change of the new rows of every Pattention's key and value parameter tokens
    is multiplied by ``lr_scale``. For an optimizer whose update is the lr times something the lr does not change
    (SGD, Adam's and AdamW's moment updates, AdamW's decoupled decay), this is exactly a separate param group at
    ``lr_scale`` x the lr: ``tests/test_growth_schedule.py`` holds the two equal. Variance Transfer (Yuan et al.
    2023, arXiv 2306.12700) gives the new parameters of a grown network a learning rate of their own.

    Args:
        old_counts: ``{kind: rows}`` of the stage before, e.g. the pre-growth
            [`token_counts`][tkvision.growth.tokens.token_counts]; rows past it are the new ones.
        optimizer: the optimizer that trains ``model`` (its step gets a pre- and a post-hook).
        lr_scale: the multiple (> 0) of the learning rate for the new rows.

    Returns:
        The two hook handles; removing them restores plain steps.

    Raises:
        ValueError: ``lr_scale`` is not positive.
    """
    if not lr_scale > 0:
        raise ValueError(f'lr_scale must be positive, got {lr_scale}')
    rows = [(param, old_counts.get(kind, 0)) for kind, layer in pattention_layers(model).values()
            for param in (layer.keys, layer.value_param_tokens)]
    rows = [(param, n_old) for param, n_old in rows if param.shape[0] > n_old]
    before: List[torch.Tensor] = []

    def remember(opt, args, kwargs):
        before[:] = [param.detach()[n_old:].clone() for param, n_old in rows]

    def scale(opt, args, kwargs):
        with torch.no_grad():
            for (param, n_old), old in zip(rows, before):
                new = param[n_old:]
                new.copy_(old + lr_scale * (new - old))
        before.clear()

    return [optimizer.register_step_pre_hook(remember), optimizer.register_step_post_hook(scale)]
