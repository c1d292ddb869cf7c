"""Progressive scaling: grow a TokenFormer by appending key/value parameter tokens (paper §3.3).

    K_P^scale = [K_P^old, K_P^new],  V_P^scale = [V_P^old, V_P^new]      (Eq. 12)
    O = Pattention(X, K_P^scale, V_P^scale)                              (Eq. 13)

With zero-initialised new keys and τ held fixed, every Pattention's output is unchanged
(Appendix B), so a grown model computes the same function as the old one, except under
``score_norm='softmax'`` where exp(0) = 1 gives the new tokens weight (a warning is raised).

Kinds of Pattention (``TOKEN_KINDS``): ``patch`` (patch embedding), ``qkv`` (Q, K, V of every block),
``proj`` (attention output) and ``ffn``; an MAE decoder (:mod:`tkvision.models.mae`) adds
``decoder_embed``, ``decoder_qkv``, ``decoder_proj``, ``decoder_ffn`` and ``decoder_pred``
(``DECODER_KINDS``), grown apart from the encoder's.

Optimizer state when growing during training: AdamW's moments of the old tokens are kept and the
new rows start at zero (the student report, ``shared/papers/001``, resets the whole optimizer
instead, ``growth.optimizer_state: reset``; on the Fashion-MNIST chain the two ended within the seed
spread, docs/growth.md). The step count is kept, so Adam's bias correction treats the new rows' zero
moments as warmed up: their first updates are small, which suits function-preserving growth.

Net2Net (Chen et al. 2016, https://arxiv.org/abs/1511.05641; the baseline of the paper's §4.3 and
Eq. 14): :func:`net2net_widen` widens the MLP hidden layer of a plain timm ViT without changing its
function: new hidden units copy existing ones (fc1 rows duplicated) and each copied unit's outgoing
fc2 column is split among its copies. It lets the same growth schedule (``growth.schedule`` with
``to: {mlp_hidden: N}``) run for a ViT, the baseline of ``docs/growth.md``.
"""
import argparse
import copy as copy_module
import os
import sys

import timm
import torch

from .checkpoint import adapt_state_dict, check_fit, load_state_dict_file, save_weights
from .layers import Pattention
from .models.tokenformer_vit import TOKEN_KINDS

__all__ = ['TOKEN_KINDS', 'DECODER_KINDS', 'ALL_KINDS', 'layer_kind', 'pattention_layers', 'token_counts', 'target_counts', 'grow',
           'grow_optimizer_state', 'grow_training_state', 'model_size', 'target_size', 'schedule_sizes', 'grow_to', 'checkpoint_size', 'grow_to_checkpoint', 'net2net_widen',
           'load_grown_state_dict', 'freeze_old_tokens', 'grow_checkpoint', 'main']


#: Kinds of the Pattentions of an MAE decoder (``decoder.embed``, ``decoder.blocks.*``, ``decoder.pred``).
DECODER_KINDS = ('decoder_embed', 'decoder_qkv', 'decoder_proj', 'decoder_ffn', 'decoder_pred')
#: Every kind growth knows.
ALL_KINDS = TOKEN_KINDS + DECODER_KINDS


def layer_kind(name: str) -> str:
    """Kind (``ALL_KINDS``) of the Pattention module called ``name`` in a TokenFormer ViT or an MAE.

    Raises:
        ValueError: a name that is none of patch embedding, q/k/v, attention output or FFN (or an
            MAE decoder's embed / prediction).
    """
    head, _, rest = name.partition('.')
    if head == 'decoder':
        return 'decoder_' + (rest if rest in ('embed', 'pred') else layer_kind(rest))
    if 'patch_embed' in name.split('.'):
        return 'patch'
    if name.endswith('.ffn'):
        return 'ffn'
    if name.endswith('.attn.proj'):
        return 'proj'
    if name.rsplit('.', 1)[-1] in ('q', 'k', 'v'):
        return 'qkv'
    raise ValueError(f'cannot tell the kind of Pattention {name!r}')


def pattention_layers(model: torch.nn.Module) -> dict:
    """``{module name: (kind, Pattention)}`` for every Pattention in ``model`` (DDP/compile unwrapped)."""
    model = getattr(model, 'module', getattr(model, '_orig_mod', model))
    return {n: (layer_kind(n), m) for n, m in model.named_modules() if isinstance(m, Pattention)}


def token_counts(model: torch.nn.Module) -> dict:
    """``{kind: num_tokens}`` of ``model``.

    Raises:
        ValueError: layers of one kind with different counts (then use per-layer growth).
    """
    counts = {}
    for name, (kind, layer) in pattention_layers(model).items():
        if counts.setdefault(kind, layer.num_tokens) != layer.num_tokens:
            raise ValueError(f'{kind} layers have different token counts ({name}: {layer.num_tokens})')
    return counts


def target_counts(variant: str, **model_kwargs) -> dict:
    """``{kind: num_tokens}`` of the registered ``variant`` (built on the meta device, no memory)."""
    with torch.device('meta'):
        return token_counts(timm.create_model(variant, **model_kwargs))


def grow(model: torch.nn.Module, patch: int = 0, qkv: int = 0, proj: int = 0, ffn: int = 0, to=None,
         key_init: str = 'zeros', value_init: str = 'normal', copy: bool = False, **decoder) -> torch.nn.Module:
    """Append parameter tokens to every Pattention of ``model``, by kind.

    Args:
        model: a TokenFormer model (``tokenformer_vit_*``, or an MAE around one).
        patch, qkv, proj, ffn: number of tokens to append to each layer of that kind.
        **decoder: the same for an MAE decoder's kinds (``decoder_qkv=...``, see ``DECODER_KINDS``).
        to: alternatively, a target: a registered variant name or ``{kind: total num_tokens}``; the
            appended count is target minus current (the other counts are then ignored).
        key_init, value_init: init of the new rows (``'zeros'`` or ``'normal'``), see
            :meth:`Pattention.grow`. Zero keys (default) preserve the function exactly.
        copy: grow a deep copy and leave ``model`` untouched; otherwise grow **in place** (the
            parameters are replaced, so an optimizer must be remapped with :func:`grow_optimizer_state`).

    Returns:
        The grown model (``model`` itself unless ``copy``). Its ``num_tokens_<kind>`` attributes
        are updated so ``token_counts`` and re-creation agree.

    Raises:
        ValueError: a target smaller than the current count (shrinking is not growth), or an
        unknown kind in ``to`` or ``decoder``.
    """
    unknown = set(decoder) - set(DECODER_KINDS)
    if unknown:
        raise ValueError(f'unknown token kinds {sorted(unknown)}; kinds are {ALL_KINDS}')
    if copy:
        model = copy_module.deepcopy(model)
    add = dict(dict.fromkeys(ALL_KINDS, 0), patch=patch, qkv=qkv, proj=proj, ffn=ffn, **decoder)
    if to is not None:
        target = target_counts(to) if isinstance(to, str) else dict(to)
        unknown = set(target) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f'unknown token kinds {sorted(unknown)}; kinds are {ALL_KINDS}')
        current = token_counts(model)
        add = {k: target.get(k, current[k]) - current[k] for k in current}
        shrink = {k: (current[k], target[k]) for k in add if add[k] < 0}
        if shrink:
            raise ValueError(f'target has fewer tokens than the model (current, target): {shrink}')
    for name, (kind, layer) in pattention_layers(model).items():
        layer.grow(add[kind], key_init=key_init, value_init=value_init)
    _sync_token_attrs(model)
    return model


def _sync_token_attrs(model: torch.nn.Module):
    """Set the ``num_tokens_<kind>`` attributes of the model (or of an MAE's encoder) to its counts,
    so ``token_counts`` and re-creation from those attributes agree."""
    inner = getattr(model, 'module', getattr(model, '_orig_mod', model))
    inner = getattr(inner, 'encoder', inner)
    for kind, n in token_counts(model).items():
        if hasattr(inner, f'num_tokens_{kind}'):
            setattr(inner, f'num_tokens_{kind}', n)


def grow_optimizer_state(optimizer: torch.optim.Optimizer, old_to_new: dict, expand=None):
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


def grow_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ema_model=None,
                        key_init: str = 'zeros', value_init: str = 'normal', to=None, **add) -> dict:
    """Grow a model in the middle of training, with the state that trains it (paper §3.3).

    ``model`` grows in place by ``add`` (``{kind: tokens}``) or to ``to`` (see :func:`grow`); the
    optimizer is remapped to the new parameters (:func:`grow_optimizer_state`: old rows keep their
    moments, new rows start at zero); the EMA copy, if any, grows to the same counts and takes the
    new rows from the live model (an average of rows that did not exist would be meaningless). Call
    it with the same torch seed on every rank so all ranks append identical tokens.

    A model without Pattentions (a timm ViT) is widened by Net2Net instead, ``to={'mlp_hidden': N}``
    (:func:`net2net_widen`); its optimizer moments follow the copied units and the EMA copy is
    widened with the same units.

    Returns:
        :func:`model_size` after growth (``{kind: num_tokens}`` or ``{'mlp_hidden': N}``).
    """
    layers = pattention_layers(model)
    if not layers:
        return _widen_training_state(model, optimizer, ema_model, to)
    before = {n: (m.keys, m.value_param_tokens) for n, (_, m) in layers.items()}
    grow(model, key_init=key_init, value_init=value_init, to=to, **add)
    old_to_new = {}
    for n, (_, m) in pattention_layers(model).items():
        old_to_new[before[n][0]] = m.keys
        old_to_new[before[n][1]] = m.value_param_tokens
    grow_optimizer_state(optimizer, old_to_new)
    counts = token_counts(model)
    if ema_model is not None:
        grow(ema_model, to=counts, key_init='zeros', value_init='zeros')
        live = pattention_layers(model)
        with torch.no_grad():
            for n, (_, m) in pattention_layers(ema_model).items():
                n_old = before[n][0].shape[0]
                m.keys[n_old:] = live[n][1].keys[n_old:]
                m.value_param_tokens[n_old:] = live[n][1].value_param_tokens[n_old:]
    return counts


def _mlps(model: torch.nn.Module) -> dict:
    """``{name: timm Mlp}`` of ``model`` (DDP / compile unwrapped)."""
    from timm.layers import Mlp
    model = getattr(model, 'module', getattr(model, '_orig_mod', model))
    return {n: m for n, m in model.named_modules() if isinstance(m, Mlp)}


def model_size(model: torch.nn.Module) -> dict:
    """What growth changes: :func:`token_counts` of a TokenFormer, ``{'mlp_hidden': N}`` of a
    model without Pattentions whose MLPs are timm ``Mlp`` (a ViT), ``{}`` for anything else.

    Raises:
        ValueError: MLPs of different hidden sizes (or token counts that differ within a kind).
    """
    if pattention_layers(model):
        return token_counts(model)
    sizes = {m.fc1.out_features for m in _mlps(model).values()}
    if len(sizes) > 1:
        raise ValueError(f'the MLPs have different hidden sizes {sorted(sizes)}')
    return {'mlp_hidden': sizes.pop()} if sizes else {}


def target_size(to) -> dict:
    """The :func:`model_size` a growth target names: a registered variant's token counts, or the
    mapping itself (``{kind: tokens}`` or ``{'mlp_hidden': N}``)."""
    return target_counts(to) if isinstance(to, str) else dict(to)


def schedule_sizes(size: dict, schedule: list) -> list:
    """The :func:`model_size` of every stage of a ``growth.schedule``, starting from ``size``: a step's
    ``to`` (:func:`target_size`) overrides the kinds it names."""
    sizes = [dict(size)]
    for step in schedule:
        sizes.append({**sizes[-1], **target_size(step['to'])})
    return sizes


def grow_to(model: torch.nn.Module, size: dict) -> torch.nn.Module:
    """Grow ``model`` in place to ``size`` (a :func:`model_size`), e.g. before loading a checkpoint
    of a run that grew during training (the loaded weights then replace the new rows / units)."""
    if 'mlp_hidden' in size:
        net2net_widen(model, size['mlp_hidden'])
        return model
    return grow(model, to=size)


def checkpoint_size(model: torch.nn.Module, state_dict: dict) -> dict:
    """The :func:`model_size` of the model ``state_dict`` was saved from, read from its Pattention key
    tensors (or its MLPs' fc1 rows), for a ``model`` of the same architecture (``state_dict`` already
    adapted with :func:`~tkvision.checkpoint.adapt_state_dict`). Layers absent from it are left out."""
    layers = pattention_layers(model)
    if layers:
        size = {}
        for name, (kind, layer) in layers.items():
            t = state_dict.get(f'{name}.{layer.key_name}')
            if t is not None:
                size[kind] = max(size.get(kind, 0), t.shape[0])
        return size
    rows = {state_dict[f'{n}.fc1.weight'].shape[0] for n in _mlps(model) if f'{n}.fc1.weight' in state_dict}
    return {'mlp_hidden': max(rows)} if rows else {}


def grow_to_checkpoint(model: torch.nn.Module, state_dict: dict) -> dict:
    """Grow ``model`` in place to the size of ``state_dict`` when that is larger in every grown kind
    (the weights of a run that grew during training, evaluated with the run's config, which builds
    the model it started from). Returns ``{kind: (old, new)}`` of what grew, ``{}`` if nothing did."""
    current, saved = model_size(model), checkpoint_size(model, state_dict)
    if not saved or any(saved.get(k, v) < v for k, v in current.items()) or saved == current:
        return {}
    grow_to(model, saved)
    return {k: (current[k], saved[k]) for k in saved if saved[k] != current.get(k)}


def net2net_widen(model: torch.nn.Module, mlp_hidden: int, split: str = 'random', plan=None) -> dict:
    """Widen every timm ``Mlp`` (fc1 -> act -> fc2) of ``model`` to ``mlp_hidden`` units, in place,
    keeping the function (Net2WiderNet, Chen et al. 2016; paper Eq. 14, §4.3).

    For hidden size h -> H, unit j < h stays and unit j >= h copies a unit g(j) drawn uniformly from
    [0, h) (torch's global RNG): fc1's row and bias of g(j) are duplicated, and fc2's column of each
    copied unit k is shared among its copies with weights summing to 1, so
    ``fc2(act(fc1(x)))`` is unchanged (x: ``[..., in_features]``).

    Args:
        model: a module holding timm ``Mlp`` blocks (a timm ViT, ``vit_*``), or DDP / compiled one.
        mlp_hidden: the new hidden size H (>= the current h).
        split: ``'even'``: each copy gets 1/c of the column (Net2Net's form; the copies then stay
            identical under training unless noise is added); ``'random'`` (default): random shares
            (uniform in [0.5, 1.5], normalised to sum 1 per unit), still exact, and the copies get
            different gradients, which breaks their symmetry.
        plan: the return value of an earlier call, to widen another copy of the model (an EMA
            copy) with the same units and shares.

    Returns:
        ``{mlp name: (source unit index [H], share [H])}``: the plan.

    Raises:
        ValueError: no timm ``Mlp`` in the model, an ``Mlp`` with a hidden norm (not
            function-preserving here), or ``mlp_hidden`` smaller than a current hidden size.
    """
    mlps = _mlps(model)
    if not mlps:
        raise ValueError('net2net_widen needs timm Mlp blocks (fc1 -> act -> fc2), e.g. a timm vit_*; found none')
    if split not in ('even', 'random'):
        raise ValueError(f"split must be 'even' or 'random', got {split!r}")
    plan = dict(plan or {})
    for name, mlp in mlps.items():
        h = mlp.fc1.out_features
        if mlp_hidden < h:
            raise ValueError(f'{name}: mlp_hidden {mlp_hidden} is smaller than the current hidden size {h}')
        if not isinstance(mlp.norm, torch.nn.Identity):
            raise ValueError(f'{name}: an Mlp with a hidden norm cannot be widened function-preservingly here')
        if name not in plan:
            if mlp_hidden == h:
                continue
            device = mlp.fc1.weight.device
            idx = torch.cat([torch.arange(h), torch.randint(h, (mlp_hidden - h,))]).to(device)
            r = (torch.rand(mlp_hidden) + 0.5 if split == 'random' else torch.ones(mlp_hidden)).to(device)
            total = torch.zeros(h, device=device).index_add_(0, idx, r)
            plan[name] = (idx, r / total[idx])
        idx, share = plan[name]
        with torch.no_grad():
            fc1 = torch.nn.Linear(mlp.fc1.in_features, len(idx), bias=mlp.fc1.bias is not None).to(mlp.fc1.weight)
            fc1.weight.copy_(mlp.fc1.weight[idx])
            if fc1.bias is not None:
                fc1.bias.copy_(mlp.fc1.bias[idx])
            fc2 = torch.nn.Linear(len(idx), mlp.fc2.out_features, bias=mlp.fc2.bias is not None).to(mlp.fc2.weight)
            fc2.weight.copy_(mlp.fc2.weight[:, idx] * share)
        fc2.bias = mlp.fc2.bias  # unchanged: the same parameter (its optimizer state stays valid)
        mlp.fc1, mlp.fc2 = fc1, fc2
    return plan


def _widen_training_state(model, optimizer, ema_model, to) -> dict:
    """:func:`grow_training_state` for a ViT: Net2Net widening, moments gathered by copied unit."""
    if not to or set(to) != {'mlp_hidden'}:
        raise ValueError(f"a model without Pattentions grows by Net2Net only: to={{'mlp_hidden': N}}, got {to!r}")
    before = {n: (m.fc1.weight, m.fc1.bias, m.fc2.weight) for n, m in _mlps(model).items()}
    plan = net2net_widen(model, to['mlp_hidden'])
    after, old_to_new, expand = _mlps(model), {}, {}
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


def load_grown_state_dict(model: torch.nn.Module, state_dict: dict) -> dict:
    """Load a smaller TokenFormer's weights into ``model``: old tokens into the first rows.

    As the public TokenFormer code does: every Pattention key / value tensor of the checkpoint with
    fewer rows than the model's is copied into the model's first rows; the remaining rows keep the
    model's own init (zero the model's new keys first for exact function preservation, as
    :func:`grow_checkpoint` does). τ is taken from the checkpoint, so the grown layers keep the old τ
    (Appendix B). Everything else must fit exactly.

    Returns:
        ``{tensor name: (old rows, new rows)}`` of what was grown.

    Raises:
        WeightsMismatchError: tensors that differ other than by appended rows (listed).
    """
    state_dict = adapt_state_dict(model, state_dict)
    own = model.state_dict()
    merged, grown = dict(state_dict), {}
    token_tensors = {f'{n}.{name}' for n, (_, m) in pattention_layers(model).items()
                     for name in (m.key_name, 'value_param_tokens')}
    for key, value in state_dict.items():
        if (key in token_tensors and value.shape[1:] == own[key].shape[1:] and value.shape[0] < own[key].shape[0]):
            full = own[key].clone()
            full[:value.shape[0]] = value
            merged[key] = full
            grown[key] = (value.shape[0], own[key].shape[0])
    check_fit(model, merged, 'checkpoint')
    model.load_state_dict(merged)
    _sync_token_attrs(model)
    return grown


def freeze_old_tokens(model: torch.nn.Module, old_counts: dict, optimizer=None, trainable=('head',)):
    """Parameter-efficient tuning (paper §5): train only appended tokens and ``trainable`` modules.

    Non-Pattention parameters outside ``trainable`` get ``requires_grad=False``; in each Pattention,
    gradients of the first ``old_counts[kind]`` rows are zeroed by a hook, and (with ``optimizer``)
    those rows are restored after every step, so weight decay cannot move them either.

    Args:
        old_counts: ``{kind: rows to freeze}``, e.g. the pre-growth :func:`token_counts`.
        optimizer: the optimizer that will train the model (for the post-step restore).

    Returns:
        The list of hook handles (remove them to unfreeze).
    """
    handles, frozen = [], []
    layers = pattention_layers(model)
    pattention_params = {id(p) for _, layer in layers.values() for p in layer.parameters()}
    inner = getattr(model, 'module', model)
    for name, param in inner.named_parameters():
        if id(param) not in pattention_params and not any(name.startswith(t + '.') for t in trainable):
            param.requires_grad_(False)
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


def grow_checkpoint(checkpoint: str, model: str, out: str, to=None, add=None, key_init='zeros',
                    value_init='normal', model_kwargs=None) -> dict:
    """Grow a weights file on disk: build ``model`` (the checkpoint's architecture), load
    ``checkpoint``, grow to ``to`` (variant name or counts) or by ``add`` (``{kind: m}``), and write
    ``out`` as safetensors (atomic). Returns ``{kind: (old, new)}``.

    ``model_kwargs`` (e.g. ``img_size``, ``num_classes``) must describe the checkpoint's model.
    """
    net = timm.create_model(model, **(model_kwargs or {}))
    state = adapt_state_dict(net, load_state_dict_file(checkpoint))
    check_fit(net, state, checkpoint)
    net.load_state_dict(state)
    before = token_counts(net)
    grow(net, to=to, key_init=key_init, value_init=value_init, **(add or {}))
    after = token_counts(net)
    save_weights(net.state_dict(), out, metadata=dict(grown_from=checkpoint, token_counts=after))
    return {k: (before[k], after[k]) for k in before}


def main(argv=None) -> int:
    """``tkvision-grow`` / ``tools/grow.py``: grow a weights file; see ``--help``. Refuses to write over
    its input and to take ``--to`` together with ``--add-<kind>``; user errors are one line (exit 2)."""
    from .runtime import cli
    return cli(_main, argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description='Grow a TokenFormer checkpoint by appending parameter tokens.')
    ap.add_argument('--checkpoint', required=True, help='.safetensors or .pth of the small model')
    ap.add_argument('--model', required=True, help='registered variant of the checkpoint, e.g. tokenformer_vit_b16_matched')
    ap.add_argument('--to', help='target variant whose token counts to grow to, e.g. tokenformer_vit_b16')
    for kind in TOKEN_KINDS:
        ap.add_argument(f'--add-{kind}', type=int, default=0, help=f'tokens to append to every {kind} Pattention')
    ap.add_argument('--key-init', default='zeros', choices=['zeros', 'normal'])
    ap.add_argument('--value-init', default='normal', choices=['zeros', 'normal'])
    ap.add_argument('--model-kwargs', default='{}', help="YAML mapping, e.g. '{img_size: 28, in_chans: 1}'")
    ap.add_argument('--out', required=True, help='output .safetensors')
    args = ap.parse_args(argv)
    import yaml
    add = {k: getattr(args, f'add_{k}') for k in TOKEN_KINDS}
    if args.to is None and not any(add.values()):
        ap.error('give --to VARIANT or at least one --add-<kind> N')
    if args.to is not None and any(add.values()):
        ap.error('give either --to VARIANT or --add-<kind> N, not both (--to sets every count)')
    if os.path.abspath(args.out) == os.path.abspath(args.checkpoint):
        ap.error(f'--out {args.out} is the input checkpoint; write the grown weights to another file')
    report = grow_checkpoint(args.checkpoint, args.model, args.out, to=args.to, add=add, key_init=args.key_init,
                             value_init=args.value_init, model_kwargs=yaml.safe_load(args.model_kwargs))
    for kind, (old, new) in report.items():
        print(f'{kind:6s} {old:6d} -> {new:6d} tokens')
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
