"""Elastic TokenFormers: one model that runs at any prefix of its parameter tokens.

Growth appends parameter tokens (paper §3.3, Eq. 12-13); this is the other direction. A Pattention
``Θ(X K_Pᵀ) V_P`` restricted to its first k key/value tokens, ``Θ(X K_P[:k]ᵀ) V_P[:k]``, is a Pattention of
k tokens, so the first k tokens of every Pattention (patch stem, Q, K, V, output, FFN) form a smaller
TokenFormer nested in the larger one, and growth adds to the same ordering (new tokens come last). A
model trained for it ([`SAMPLING`][tkvision.growth.elastic.SAMPLING], the ``elastic_*`` config keys) serves several
budgets from one training run, as MatFormer does for a ViT's FFN widths (Devvrit et al., NeurIPS 2023,
https://arxiv.org/abs/2310.07707, §3: nested FFN blocks trained jointly, and §3.2 Mix'n'Match: per-layer granularities
chosen after training).

A *prefix* is given as:

- a fraction ``f`` in (0, 1]: every elastic layer runs with ``round(f * n)`` of its n tokens (at least 1);
- a list of fractions, one per block (Mix'n'Match); layers outside the blocks (the stem) take the first
  block's;
- a mapping ``{layer name: tokens}``;
- ``None``: every token (the full model).

What a fraction shrinks is the *nesting* ([`NESTING`][tkvision.growth.elastic.NESTING]): every Pattention (``'all'``,
the default), or only the FFNs' (``'ffn'``: MatFormer's choice, the like-for-like comparison with its ViT). Layers
outside the nesting keep every token at every prefix.

An *elastic layer* is any module with ``num_tokens``, a settable ``prefix_tokens`` (``None`` or k),
``parameters_per_token`` and ``truncate(k)``: every [`Pattention`][tkvision.layers.pattention.Pattention] is one (so is
the nested MLP of the MatFormer-style ViT the elastic study compares against, ``studies/elastic``). Running at a
prefix slices the parameters (no copy);
[`extract_prefix`][tkvision.growth.elastic.extract_prefix] copies a prefix out as a standalone model that
``timm.create_model`` builds with the matching ``num_tokens_*``
([`prefix_model_kwargs`][tkvision.growth.elastic.prefix_model_kwargs]).

A prefix runs with the whole layer's τ, which keeps a grown layer's first k tokens' function. Scaling τ with k
(Eq. 5's √k for √n) was measured and removed: trained for it at the quick recipe it gave every prefix the lower
validation top-1, and post hoc it was no better (``docs/elastic.md``, ``CHANGELOG.md``).
"""
import contextlib
import copy
import itertools
import re
from typing import Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union, cast

import torch
from timm.utils import unwrap_model
from torch import nn

__all__ = ['SAMPLING', 'NESTING', 'Prefix', 'ElasticLayer', 'elastic_layers', 'prefix_counts',
           'set_prefix', 'prefix', 'extract_prefix', 'prefix_model_kwargs', 'prefix_parameters', 'step_fractions',
           'mix_n_match', 'monotone_prefixes']

SAMPLING = ('all', 'random', 'largest_plus_random')
"""How a training step picks the granularities it trains (the ``elastic_sampling`` config key): ``'all'``: every
fraction, losses summed (MatFormer's joint objective); ``'random'``: one fraction drawn uniformly;
``'largest_plus_random'``: the largest fraction plus one other drawn uniformly."""

NESTING = {'all': ('patch', 'qkv', 'proj', 'ffn'), 'ffn': ('ffn',)}
"""Which Pattentions a prefix shrinks (the ``elastic_nesting`` config key), as token kinds: ``'all'`` every one;
``'ffn'`` the FFNs' only (what MatFormer nests, https://arxiv.org/abs/2310.07707 §3)."""

Prefix = Union[None, float, Sequence[float], Mapping[str, int]]
"""A prefix: a fraction, one fraction per block, ``{layer name: tokens}``, or None (every token)."""

_BLOCK = re.compile(r'(?:^|\.)blocks\.(\d+)\.')


class ElasticLayer(Protocol):
    """A layer that runs at a prefix of its tokens, known by its ``prefix_tokens`` attribute: a
    [`Pattention`][tkvision.layers.pattention.Pattention], or another model's nested layer (the MatFormer ViT's
    MLP of ``studies/elastic``)."""

    prefix_tokens: Optional[int]

    @property
    def num_tokens(self) -> int:
        """n, the layer's tokens (all of them, whatever the prefix)."""

    @property
    def parameters_per_token(self) -> int:
        """Parameters one token holds."""

    def truncate(self, num_tokens: int) -> object:
        """Keep the first ``num_tokens`` tokens only, in place."""


def elastic_layers(model: nn.Module) -> Dict[str, ElasticLayer]:
    """``{module name: layer}`` of every elastic layer of ``model`` (wrappers peeled with timm's
    ``unwrap_model``), in module order: the modules with a ``prefix_tokens`` attribute (`ElasticLayer`)."""
    return {n: cast(ElasticLayer, m) for n, m in unwrap_model(model).named_modules() if hasattr(m, 'prefix_tokens')}


def _require_elastic_layers(model: nn.Module, layers: Dict[str, ElasticLayer]):
    """Refuse a model without elastic layers (a timm ViT): it has nothing to run at a prefix."""
    if not layers:
        raise ValueError(f'{type(unwrap_model(model)).__name__} has no parameter tokens (no elastic layer): only a '
                         'TokenFormer runs at a prefix of its tokens')


def _check_fraction(f, where: str) -> float:
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise ValueError(f'{where} must be a fraction in (0, 1], got {f!r}')
    return float(f)


def _block_index(name: str) -> Optional[int]:
    match = _BLOCK.search(name)
    return int(match.group(1)) if match else None


def _nested(layer: ElasticLayer, nesting: str) -> bool:
    """Whether a prefix shrinks ``layer`` under ``nesting`` ([`NESTING`][tkvision.growth.elastic.NESTING]; a layer
    without a ``kind``, such as the MatFormer ViT's nested MLP, is always nested)."""
    kind = getattr(layer, 'kind', None)
    return kind is None or kind in NESTING[nesting]


def _check_nesting(nesting: str):
    if nesting not in NESTING:
        raise ValueError(f'unknown elastic nesting {nesting!r}; choose one of {", ".join(NESTING)}')


def prefix_counts(model: nn.Module, prefix: Prefix, nesting: str = 'all') -> Dict[str, int]:
    """``{layer name: tokens}`` of ``prefix`` (module docstring) for every elastic layer of ``model``; a fraction
    shrinks only the layers of ``nesting`` ([`NESTING`][tkvision.growth.elastic.NESTING]), the others keep every token.

    Raises:
        ValueError: a fraction outside (0, 1], or a string (a command line's ``'0.5'``: convert it first); a
            per-block list whose length is not the model's number of blocks; a mapping naming a layer the
            model does not have, or a count outside 1..n (named); a prefix of a model without parameter
            tokens (a timm ViT), which has nothing to run at a prefix; an unknown ``nesting``.
    """
    _check_nesting(nesting)
    layers = elastic_layers(model)
    if prefix is None:
        return {name: layer.num_tokens for name, layer in layers.items()}
    if isinstance(prefix, (str, bytes)):
        raise ValueError(f'prefix must be a fraction in (0, 1], one fraction per block, or {{layer name: tokens}}; '
                         f'got the string {prefix!r}: pass float({prefix!r})')
    _require_elastic_layers(model, layers)
    if isinstance(prefix, Mapping):
        unknown = sorted(set(prefix) - set(layers))
        if unknown:
            raise ValueError(f'no elastic layer {unknown[0]!r} in the model (its layers: {", ".join(layers)})')
        out = {name: layer.num_tokens for name, layer in layers.items()}
        for name, k in prefix.items():
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= layers[name].num_tokens:
                raise ValueError(f'{name}: a prefix of {k!r} tokens; the layer has {layers[name].num_tokens}')
            out[name] = k
        return out
    if isinstance(prefix, (int, float)):
        per_block, default = None, _check_fraction(prefix, 'prefix')
    else:
        per_block = [_check_fraction(f, f'prefix[{i}]') for i, f in enumerate(prefix)]
        depth = 1 + max((i for i in map(_block_index, layers) if i is not None), default=-1)
        if len(per_block) != depth:
            raise ValueError(f'a per-block prefix needs one fraction per block ({depth}), got {len(per_block)}')
        default = per_block[0]
    out = {}
    for name, layer in layers.items():
        block = _block_index(name)
        f = default if per_block is None or block is None else per_block[block]
        f = f if _nested(layer, nesting) else 1.0
        out[name] = max(1, min(layer.num_tokens, round(f * layer.num_tokens)))
    return out


def set_prefix(
        model: nn.Module,
        prefix: Prefix,
        nesting: str = 'all',
) -> Dict[str, int]:
    """Run ``model`` at ``prefix`` (module docstring) until the next call; ``None`` restores every token.
    No weights are copied. ``nesting``: the layers a fraction shrinks
    ([`NESTING`][tkvision.growth.elastic.NESTING]). Returns [`prefix_counts`][tkvision.growth.elastic.prefix_counts].

    Raises:
        ValueError: as [`prefix_counts`][tkvision.growth.elastic.prefix_counts]; then nothing is changed.
    """
    counts = prefix_counts(model, prefix, nesting)
    for name, layer in elastic_layers(model).items():
        k = counts[name]
        layer.prefix_tokens = None if k == layer.num_tokens else k
    return counts


@contextlib.contextmanager
def prefix(
        model: nn.Module,
        prefix: Prefix,
        nesting: str = 'all',
) -> Iterator[Dict[str, int]]:
    """``with prefix(model, 0.5): logits = model(x)``: [`set_prefix`][tkvision.growth.elastic.set_prefix] inside the
    block, the layers' previous prefixes restored after it (also on an error). Yields
    [`prefix_counts`][tkvision.growth.elastic.prefix_counts]."""
    layers = elastic_layers(model)
    before = {name: layer.prefix_tokens for name, layer in layers.items()}
    try:
        yield set_prefix(model, prefix, nesting)
    finally:
        for name, layer in layers.items():
            layer.prefix_tokens = before[name]


def extract_prefix(
        model: nn.Module,
        prefix: Optional[Prefix] = None,
        nesting: str = 'all',
) -> nn.Module:
    """A standalone copy of ``model`` at ``prefix`` (with ``nesting`` as
    [`set_prefix`][tkvision.growth.elastic.set_prefix]; default: the prefix it runs at now): every elastic layer keeps
    its first k tokens and its τ ([`truncate`][tkvision.layers.pattention.Pattention.truncate]), and the
    model's ``num_tokens_*`` say its new counts (one per kind, or one per block after a per-block prefix), so the copy
    equals ``timm.create_model(name, **prefix_model_kwargs(copy), ...)`` loaded with its state dict, and gives the
    prefix's outputs. ``model`` is not changed.

    Raises:
        ValueError: as ``prefix_counts``, and for a model without parameter tokens whatever ``prefix``.
    """
    _require_elastic_layers(model, elastic_layers(model))
    out = copy.deepcopy(unwrap_model(model))
    if prefix is not None:
        set_prefix(out, prefix, nesting)
    for layer in elastic_layers(out).values():
        layer.truncate(layer.prefix_tokens or layer.num_tokens)
    _sync_count_attributes(out)
    return out


def _sync_count_attributes(model: nn.Module):
    """Set the model's ``num_tokens_<kind>`` to its layers' counts: one int per kind, or a list of one
    count per block where the blocks differ (the model's constructor takes either)."""
    inner = getattr(model, 'encoder', model)
    for kind, counts in _counts_by_kind(inner).items():
        attr = f'num_tokens_{kind}'
        if hasattr(inner, attr):
            per_block = [counts[b] for b in sorted(counts, key=lambda b: -1 if b is None else b)]
            setattr(inner, attr, per_block[0] if len(set(per_block)) == 1 else per_block)


def _counts_by_kind(model: nn.Module) -> Dict[str, Dict[Optional[int], int]]:
    """``{kind: {block index (None outside the blocks): tokens}}`` of the model's Pattentions.

    Raises:
        ValueError: two layers of one kind in one block with different counts (a per-layer prefix of ``q`` but not
            of ``k`` and ``v``): the model's constructor takes one count per kind and block, so no model of that
            shape can be built.
    """
    out: Dict[str, Dict[Optional[int], int]] = {}
    seen: Dict[Tuple[str, Optional[int]], str] = {}
    for name, layer in elastic_layers(model).items():
        kind = getattr(layer, 'kind', None)
        if kind is None:
            continue
        block, counts = _block_index(name), out.setdefault(kind, {})
        if counts.get(block, layer.num_tokens) != layer.num_tokens:
            raise ValueError(f'{seen[kind, block]} has {counts[block]} tokens and {name} {layer.num_tokens}: layers of '
                             f'kind {kind} in one block take one count (the model is built with num_tokens_{kind} '
                             'per block); give them the same prefix')
        counts[block], seen[kind, block] = layer.num_tokens, name
    return out


def prefix_model_kwargs(model: nn.Module) -> dict:
    """The ``num_tokens_*`` keyword arguments that build ``model``'s shape with ``timm.create_model``
    (e.g. of an [`extract_prefix`][tkvision.growth.elastic.extract_prefix] copy): ``dict(num_tokens_patch=18,
    num_tokens_qkv=18, ...)``, a list per block where the blocks differ."""
    inner = getattr(unwrap_model(model), 'encoder', unwrap_model(model))
    return {f'num_tokens_{kind}': getattr(inner, f'num_tokens_{kind}')
            for kind in ('patch', 'qkv', 'proj', 'ffn') if hasattr(inner, f'num_tokens_{kind}')}


def prefix_parameters(model: nn.Module, prefix: Prefix, nesting: str = 'all') -> int:
    """Parameters of ``model`` at ``prefix`` under ``nesting`` ([`NESTING`][tkvision.growth.elastic.NESTING]; of its
    [`extract_prefix`][tkvision.growth.elastic.extract_prefix] copy), counted without copying: every parameter, less
    the rows of the tokens the prefix leaves out."""
    total = sum(p.numel() for p in unwrap_model(model).parameters())
    counts = prefix_counts(model, prefix, nesting)
    for name, layer in elastic_layers(model).items():
        total -= (layer.num_tokens - counts[name]) * layer.parameters_per_token
    return total


def step_fractions(fractions: Sequence[float], sampling: str, generator: torch.Generator) -> List[float]:
    """The fractions one training step trains ([`SAMPLING`][tkvision.growth.elastic.SAMPLING]), largest first, drawn
    with ``generator`` (so a resumed run draws the same).

    Raises:
        ValueError: an unknown ``sampling``, or no fractions.
    """
    if sampling not in SAMPLING:
        raise ValueError(f'unknown elastic_sampling {sampling!r}; choose one of {", ".join(SAMPLING)}')
    ordered = sorted(set(fractions), reverse=True)
    if not ordered:
        raise ValueError('elastic training needs at least one fraction')
    if sampling == 'all' or len(ordered) == 1:
        return ordered
    if sampling == 'random':
        return [ordered[int(torch.randint(len(ordered), (), generator=generator))]]
    rest = ordered[1:]
    return [ordered[0], rest[int(torch.randint(len(rest), (), generator=generator))]]


def monotone_prefixes(depth: int, fractions: Sequence[float]) -> List[List[float]]:
    """Every per-block prefix whose fraction never decreases with depth (MatFormer §4.1.1's finding for
    Mix'n'Match: sub-models whose granularity grows slowly across layers do best), drawn from
    ``fractions``: C(depth + g - 1, g - 1) lists for g fractions."""
    ordered = sorted(set(fractions))
    return [list(c) for c in itertools.combinations_with_replacement(ordered, depth)]


def mix_n_match(
        model: nn.Module,
        fractions: Sequence[float],
        max_parameters: int,
        nesting: str = 'all',
) -> List[float]:
    """MatFormer's rule of thumb for Mix'n'Match (§4.1.1): the per-block prefix of most parameters within
    ``max_parameters``, among those whose fraction never decreases with depth; of equal sizes the one
    that changes fraction least often (the flattest).

    Returns:
        one fraction per block.

    Raises:
        ValueError: no prefix built from ``fractions`` fits ``max_parameters`` (the smallest's size named).
    """
    depth = 1 + max((i for i in map(_block_index, elastic_layers(model)) if i is not None), default=-1)
    candidates = [(prefix_parameters(model, p, nesting), p) for p in monotone_prefixes(depth, fractions)]
    fitting = [(n, p) for n, p in candidates if n <= max_parameters]
    if not fitting:
        smallest = min(n for n, _ in candidates)
        raise ValueError(f'no prefix fits {max_parameters:,} parameters; the smallest has {smallest:,}')
    changes = lambda p: sum(a != b for a, b in zip(p, p[1:]))  # noqa: E731
    return max(fitting, key=lambda c: (c[0], -changes(c[1])))[1]
