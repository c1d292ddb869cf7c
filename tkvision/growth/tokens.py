"""Progressive scaling: grow a TokenFormer by appending key/value parameter tokens (paper §3.3).

    K_P^scale = [K_P^old, K_P^new],  V_P^scale = [V_P^old, V_P^new]      (Eq. 12)
    O = Pattention(X, K_P^scale, V_P^scale)                              (Eq. 13)

With zero-initialised new keys and τ held fixed, every Pattention's output is unchanged
(Appendix B), so a grown model computes the same function as the old one, except under a
normalisation that is not ``zero_key_exact`` (``softmax``: exp(0) = 1 gives the new tokens weight;
a warning is raised).

Layers are grouped by their ``kind`` (`tkvision.layers.PATTENTION_KINDS`), which the model
that builds each Pattention sets: ``patch``, ``qkv``, ``proj``, ``ffn``, and an MAE decoder's
``decoder_embed``, ``decoder_qkv``, ``decoder_proj``, ``decoder_ffn``, ``decoder_pred``.

What a size is (`model_size`): ``{kind: num_tokens}`` for a TokenFormer, ``{'mlp_hidden': N}``
for a timm ViT widened by Net2Net (`net2net`).
"""
import copy as copy_module
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import timm
import torch
from timm.utils import unwrap_model

from ..layers import DECODER_KINDS, PATTENTION_KINDS, Pattention
from ..layers.pattention import default_tau
from ..models import adapt_state_dict, check_fit
from .net2net import mlps, net2net_widen

__all__ = ['pattention_layers', 'token_counts', 'target_counts', 'grow', 'model_size', 'target_size',
           'schedule_sizes', 'check_reachable', 'grow_to', 'checkpoint_size', 'grow_to_checkpoint',
           'load_grown_state_dict']


def pattention_layers(model: torch.nn.Module) -> dict:
    """``{module name: (kind, Pattention)}`` for every Pattention in ``model`` (DDP / compile / EMA
    wrappers peeled with timm's ``unwrap_model``).

    Raises:
        ValueError: a Pattention without a ``kind`` (a model must set it when building the layer).
    """
    layers = {n: m for n, m in unwrap_model(model).named_modules() if isinstance(m, Pattention)}
    unnamed = [n for n, m in layers.items() if m.kind is None]
    if unnamed:
        raise ValueError(f'Pattention {unnamed[0]} has no kind: the model that builds it must pass kind=... '
                         f'(one of {", ".join(PATTENTION_KINDS)}) so growth knows which count it belongs to')
    return {n: (m.kind, m) for n, m in layers.items()}


def token_counts(model: torch.nn.Module) -> dict:
    """``{kind: num_tokens}`` of ``model``.

    Raises:
        ValueError: layers of one kind with different counts (then use per-layer growth).
    """
    counts: Dict[str, int] = {}
    for name, (kind, layer) in pattention_layers(model).items():
        if counts.setdefault(kind, layer.num_tokens) != layer.num_tokens:
            raise ValueError(f'{kind} layers have different token counts ({name}: {layer.num_tokens})')
    return counts


def target_counts(variant: str, **model_kwargs: Any) -> dict:
    """``{kind: num_tokens}`` of the registered ``variant`` (built on the meta device, no memory)."""
    with torch.device('meta'):
        return token_counts(timm.create_model(variant, **model_kwargs))


def grow(
        model: torch.nn.Module,
        patch: int = 0,
        qkv: int = 0,
        proj: int = 0,
        ffn: int = 0,
        to: Union[None, str, Dict[str, int]] = None,
        key_init: str = 'zeros',
        value_init: str = 'normal',
        copy: bool = False,
        tau: str = 'keep',
        **decoder: int,
) -> torch.nn.Module:
    """Append parameter tokens to every Pattention of ``model``, by kind.

    Args:
        model: a TokenFormer model (``tokenformer_vit_*``, or an MAE around one).
        patch: tokens to append to the patch embedding's Pattention.
        qkv: tokens to append to each Q, K and V Pattention.
        proj: tokens to append to each attention output projection.
        ffn: tokens to append to each FFN Pattention.
        **decoder: the same for an MAE decoder's kinds (``decoder_qkv=...``, see ``DECODER_KINDS``).
        to: alternatively, a target: a registered variant name or ``{kind: total num_tokens}``; the
            appended count is target minus current (the other counts are then ignored).
        key_init: init of the new key rows (``'zeros'`` or ``'normal'``), see
            [`Pattention.grow`][tkvision.layers.pattention.Pattention.grow]. Zero keys (default) preserve the
            function exactly.
        value_init: init of the new value rows (``'zeros'`` or ``'normal'``).
        copy: grow a deep copy and leave ``model`` untouched; otherwise grow **in place** (the
            parameters are replaced, so an optimizer must be remapped with `grow_optimizer_state`).
        tau: ``'keep'`` (default): every layer keeps its τ, so zero keys preserve the function exactly;
            ``'recompute'``: a grown layer takes the τ a layer built at its new size has
            ([`default_tau`][tkvision.layers.pattention.default_tau], √n for Eq. 5): the parametrisation of
            the model from scratch at that size, not function-preserving (the scores' scale changes).

    Returns:
        The grown model (``model`` itself unless ``copy``). Its ``num_tokens_<kind>`` attributes
        are updated so ``token_counts`` and re-creation agree.

    Raises:
        ValueError: a target smaller than the current count (shrinking is not growth), or an
            unknown kind in ``to`` or ``decoder``.
    """
    unknown = set(decoder) - set(DECODER_KINDS)
    if unknown:
        raise ValueError(f'unknown token kinds {sorted(unknown)}; kinds are {PATTENTION_KINDS}')
    if copy:
        model = copy_module.deepcopy(model)
    add = dict(dict.fromkeys(PATTENTION_KINDS, 0), patch=patch, qkv=qkv, proj=proj, ffn=ffn, **decoder)
    if to is not None:
        target = target_counts(to) if isinstance(to, str) else dict(to)
        unknown = set(target) - set(PATTENTION_KINDS)
        if unknown:
            raise ValueError(f'unknown token kinds {sorted(unknown)}; kinds are {PATTENTION_KINDS}')
        current = token_counts(model)
        add = {k: target.get(k, current[k]) - current[k] for k in current}
        shrink = {k: (current[k], target[k]) for k in add if add[k] < 0}
        if shrink:
            raise ValueError(f'target has fewer tokens than the model (current, target): {shrink}')
    if tau not in ('keep', 'recompute'):
        raise ValueError(f"tau must be 'keep' or 'recompute', got {tau!r}")
    for name, (kind, layer) in pattention_layers(model).items():
        layer.grow(add[kind], key_init=key_init, value_init=value_init)
        if tau == 'recompute' and add[kind]:
            with torch.no_grad():  # τ may be a learned parameter (Pattention.make_tau_learnable)
                layer.tau.fill_(default_tau(layer.score_norm, layer.num_tokens))
    _sync_token_attrs(model)
    return model


def _sync_token_attrs(model: torch.nn.Module):
    """Set the ``num_tokens_<kind>`` attributes of the model (or of an MAE's encoder) to its counts,
    so ``token_counts`` and re-creation from those attributes agree."""
    inner = unwrap_model(model)
    inner = getattr(inner, 'encoder', inner)
    for kind, n in token_counts(model).items():
        if hasattr(inner, f'num_tokens_{kind}'):
            setattr(inner, f'num_tokens_{kind}', n)


def model_size(model: torch.nn.Module) -> dict:
    """What growth changes: [`token_counts`][tkvision.growth.tokens.token_counts] of a TokenFormer, ``{'mlp_hidden':
    N}`` of a model without Pattentions whose MLPs are timm ``Mlp`` (a ViT), ``{}`` for anything else.

    Raises:
        ValueError: MLPs of different hidden sizes (or token counts that differ within a kind).
    """
    if pattention_layers(model):
        return token_counts(model)
    sizes = {m.fc1.out_features for m in mlps(model).values()}
    if len(sizes) > 1:
        raise ValueError(f'the MLPs have different hidden sizes {sorted(sizes)}')
    return {'mlp_hidden': sizes.pop()} if sizes else {}


def target_size(to: Union[str, Mapping[str, int]]) -> dict:
    """The `model_size` a growth target names: a registered variant's token counts, or the
    mapping itself (``{kind: tokens}`` or ``{'mlp_hidden': N}``)."""
    return target_counts(to) if isinstance(to, str) else dict(to)


def schedule_sizes(size: dict, schedule: list) -> list:
    """The `model_size` of every stage of a ``growth.schedule``, starting from ``size``: a step's
    ``to`` (`target_size`) overrides the kinds it names."""
    sizes = [dict(size)]
    for step in schedule:
        sizes.append({**sizes[-1], **target_size(step['to'])})
    return sizes


def check_reachable(size: Mapping[str, int], schedule: Sequence[Mapping[str, Any]] = (),
                    add_tokens: Optional[Mapping[str, int]] = None) -> None:
    """Check that a model of `model_size` ``size`` can take every step of a ``growth.schedule``
    (each ``to`` as `target_size` reads it) and the kinds of ``growth.add_tokens``, before any
    training: a TokenFormer grows by the token kinds it has, to counts no smaller than its own; a timm
    ViT only by ``mlp_hidden``, to a width no smaller than its own.

    Raises:
        ValueError: the first target that cannot be reached, naming ``growth.schedule[i].to`` (or
            ``growth.add_tokens``), the kind and why.
    """
    current = dict(size)
    for kind in add_tokens or {}:
        if kind not in current:
            raise ValueError(f'growth.add_tokens.{kind}: the model has no {kind} Pattention '
                             f'(its kinds: {", ".join(current) or "none"})')
    for i, step in enumerate(schedule):
        where, target = f'growth.schedule[{i}].to', target_size(step['to'])
        if 'mlp_hidden' in target and 'mlp_hidden' not in current:
            raise ValueError(f'{where}: mlp_hidden widens a timm ViT by Net2Net; this model grows by parameter '
                             f'tokens (kinds {", ".join(current) or "none"})')
        unknown = sorted(set(target) - set(current))
        if unknown:
            reason = ('has no Pattention (a timm ViT grows by Net2Net: to: {mlp_hidden: N})' if 'mlp_hidden' in current
                      else f'has no {", ".join(unknown)} Pattention')
            raise ValueError(f'{where}: {", ".join(unknown)}: the model {reason}')
        for kind, n in target.items():
            if n < current[kind]:
                words = (f'{n} is smaller than the current hidden size {current[kind]}' if kind == 'mlp_hidden'
                         else f'{n} is fewer tokens than the model has ({current[kind]}); growth only adds')
                raise ValueError(f'{where}.{kind}: {words}')
        current.update(target)


def grow_to(model: torch.nn.Module, size: dict) -> torch.nn.Module:
    """Grow ``model`` in place to ``size`` (a `model_size`), e.g. before loading a checkpoint
    of a run that grew during training (the loaded weights then replace the new rows / units)."""
    if 'mlp_hidden' in size:
        net2net_widen(model, size['mlp_hidden'])
        return model
    return grow(model, to=size)


def checkpoint_size(model: torch.nn.Module, state_dict: dict) -> dict:
    """The `model_size` of the model ``state_dict`` was saved from, read from its Pattention key
    tensors (or its MLPs' fc1 rows), for a ``model`` of the same architecture (``state_dict`` already
    adapted with `adapt_state_dict`). Layers absent from it are left out."""
    layers = pattention_layers(model)
    if layers:
        size: Dict[str, int] = {}
        for name, (kind, layer) in layers.items():
            t = state_dict.get(f'{name}.{layer.key_name}')
            if t is not None:
                size[kind] = max(size.get(kind, 0), t.shape[0])
        return size
    rows = {state_dict[f'{n}.fc1.weight'].shape[0] for n in mlps(model) if f'{n}.fc1.weight' in state_dict}
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


def load_grown_state_dict(model: torch.nn.Module, state_dict: dict) -> dict:
    """Load a smaller TokenFormer's weights into ``model``: old tokens into the first rows.

    As the public TokenFormer code does: every Pattention key / value tensor of the checkpoint with
    fewer rows than the model's is copied into the model's first rows; the remaining rows keep the
    model's own init (zero the model's new keys first for exact function preservation, as
    `tkvision.engine.checkpoint.grow_weights_file` does). τ is taken from the checkpoint, so the grown layers
    keep the old τ
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
