"""RingFormer ViT, and the recurrent TokenFormer (Ring x Token).

Paper: `RingFormer: Rethinking Recurrent Transformer with Adaptive Level Signals`
    - https://arxiv.org/abs/2502.13181 (Heo, Fozilov et al.): §3 (Eq. 4-7),
      Fig. 1, App. A.1; ImageNet-small Table 2, ImageNet-1K Table 3.

One shared pre-norm block is applied ``depth`` times ("levels"). Level i has its own LayerNorms before
attention and before the FFN and its own input-dependent *level signals*:

    Q_i = W_Q x + M_Qi x,   K_i = W_K x + M_Ki x,   V_i = W_V x + M_Vi x             (Eq. 6)
    FFN_i(x) = σ((x + M_Fi x) W_up) W_down                                          (Eq. 7)
    M_i = A_i B_iᵀ, A_i, B_i ∈ R^{d x r}, r = d / 16                                (Eq. 5)

with the output-side factor A_i zero-initialised (LoRA's init), so at init every signal is 0 and
every level computes the plain shared block.

``ringformer_vit_*``: the paper's model, Linear projections (W_Q, W_K, W_V with bias, as ViT), a
conv patch embedding, a class token and fixed 2-D sin-cos position embeddings: the paper's parameter
counts (4.40M, 12.02M, 31.95M) are reproduced exactly only without a learned position embedding
(``tests/test_ringformer.py``; the README, "RingFormer", has the arithmetic).

``tokenformer_ring_vit_*`` (Ring x Token, new): the shared block is a TokenFormer block (Pattention
Q, K, V, output and FFN; ``tkvision.models.tokenformer_vit``) and the stem a Pattention, so the
shared parameter tokens serve every level and grow for all levels at once (``tkvision.grow``).
Two kinds of level signal (``level_signal``):

- ``'lowrank'``: RingFormer's M_i x above, added after the shared Pattentions Q/K/V and to the FFN's input;
- ``'tokens'``: *level parameter tokens*: level i appends ``level_tokens`` key/value tokens of its own
  to each shared Pattention (Q, K, V, output; ``4 level_tokens`` to the FFN), one normalisation over
  shared + level scores: ``Θ([x K_Pᵀ, x K_iᵀ]) [V_P; V_i]``. The level keys are zero-initialised,
  so their scores are 0 and (for the GELU normalisations) every level starts as the shared block.
  The default ``level_tokens = num_tokens / 32`` costs what the low-rank signals cost (d²/2 per level at
  n = d).

Block LayerNorms (Ring x Token): per level and affine, as RingFormer's; TokenFormer's non-parametric
norms would make the levels' norms identical, leaving the signals as the only level-specific parameters.

Layout follows ``tokenformer_vit.py``: layers -> model -> checkpoint filter -> cfgs -> entrypoints. The
model class is [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT] with another stem and trunk.
"""
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from timm.layers import PatchEmbed as ConvPatchEmbed
from timm.models import generate_default_cfgs, register_model
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import Pattention
from ..layers.block import attend_heads, head_norms, split_heads
from .tokenformer_vit import Blocks, TokenFormerViT, create_tokenformer, tokenformer_cfg

__all__ = ['LevelSignal', 'Level', 'RecurrentAttention', 'RingBlock', 'RingFormerViT', 'TokenRingViT',
           'LEVEL_SIGNALS']

#: Kinds of level signal of the Ring x Token family.
LEVEL_SIGNALS = ('lowrank', 'tokens')


class LevelSignal(nn.Module):
    """RingFormer's low-rank level signal ``g(x) = M x = A (Bᵀ x)`` (Eq. 5), ``[..., d_in] -> [..., d_out]``.

    ``down`` (Bᵀ, ``[r, d_in]``) is initialised as a Linear layer, ``up`` (A, ``[d_out, r]``) with zeros,
    so g = 0 at init (LoRA's init, which the paper follows).
    """

    def __init__(self, in_features: int, out_features: int, rank: int):
        super().__init__()
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = nn.Linear(rank, out_features, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_in] -> [..., d_out]``: ``A (Bᵀ x)``."""
        return self.up(self.down(x))


def attend_with_level_tokens(
        layer: Pattention,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
) -> torch.Tensor:
    """A shared Pattention extended by one level's key/value tokens: ``Θ([x K_Pᵀ, x K_iᵀ]) [V_P; V_i]``,
    one normalisation (``layer``'s Θ and τ) over shared and level scores. ``x [..., d_in]``,
    ``keys [m, d_in]``, ``values [m, d_out]`` -> ``[..., d_out]``."""
    scores = torch.cat([layer.scores(x), F.linear(x, keys)], dim=-1)
    shared_values = layer.active(layer.value_param_tokens)
    return layer.score_normalization(scores, layer.tau, layer.eps) @ torch.cat([shared_values, values])


class Level(nn.Module):
    """What belongs to one level of the recurrence: LayerNorms before attention and FFN, drop path, and
    the level signals of the projections named in ``dims`` (``{'q': (d_in, d_out), ...}``).

    ``kind='lowrank'``: `LevelSignal` of rank ``rank`` for q, k, v and ffn; ``kind='tokens'``:
    ``tokens[name]`` key/value tokens per shared Pattention (``<name>_keys`` zero-init,
    ``<name>_values`` N(0, value_std²)); ``kind='none'`` (or None): no signal (a plain shared block).
    """

    def __init__(
            self,
            dim: int,
            kind: Optional[str],
            rank: int = 0,
            tokens: Optional[dict] = None,
            dims: Optional[dict] = None,
            drop_path: float = 0.,
            value_std: float = 0.02,
    ):
        super().__init__()
        if kind not in (None, 'none') + LEVEL_SIGNALS:
            raise ValueError(f"level_signal must be one of {LEVEL_SIGNALS} or 'none', got {kind!r}")
        if (kind == 'tokens' and tokens is None) or (kind in ('lowrank', 'tokens') and dims is None):
            raise ValueError(f'level_signal {kind!r} needs the layers\' dims'
                             + (' and tokens' if kind == 'tokens' else ''))
        dims, tokens = dims or {}, tokens or {}
        self.kind = kind
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.signals = nn.ModuleDict()
        if kind == 'lowrank':
            for name in ('q', 'k', 'v', 'ffn'):
                d_in, d_out = dims[name] if name != 'ffn' else (dim, dim)
                self.signals[name] = LevelSignal(d_in, d_out, rank)
        elif kind == 'tokens':
            for name, m in tokens.items():
                d_in, d_out = dims[name]
                self.register_parameter(f'{name}_keys', nn.Parameter(torch.zeros(m, d_in)))
                self.register_parameter(f'{name}_values', nn.Parameter(torch.randn(m, d_out) * value_std))
        self.token_names = tuple(tokens) if kind == 'tokens' else ()

    def project(self, name: str, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)`` at this level: plus the low-rank signal (Eq. 6), or with the level's tokens."""
        if name in self.token_names:
            return attend_with_level_tokens(_pattention(layer), x, *self._level_tokens(name))
        out = layer(x)
        if name in self.signals:
            out = out + self.signals[name](x)
        return out

    def ffn(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The shared FFN at this level: ``layer(x + M_F x)`` (Eq. 7), or with the level's tokens."""
        if 'ffn' in self.token_names:
            return attend_with_level_tokens(_pattention(layer), x, *self._level_tokens('ffn'))
        if 'ffn' in self.signals:
            x = x + self.signals['ffn'](x)
        return layer(x)

    def _level_tokens(self, name: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """This level's key and value tokens for the shared layer ``name``."""
        return self.get_parameter(f'{name}_keys'), self.get_parameter(f'{name}_values')


def _pattention(layer: nn.Module) -> Pattention:
    """``layer``, which level tokens extend: a Pattention (the Ring x Token family's shared layers)."""
    if not isinstance(layer, Pattention):
        raise TypeError(f'level tokens extend a Pattention, not a {type(layer).__name__}')
    return layer


class RecurrentAttention(nn.Module):
    """Multi-head self-attention whose Q/K/V/output projections are shared across levels and steered by
    the calling `Level`: ``q = level.project('q', self.q, x)`` and so on. ``q``, ``k``, ``v``,
    ``proj``: Linear layers (RingFormer) or Pattentions (Ring x Token). ``[B, N, d] -> [B, N, d]``.
    ``q_norm`` / ``k_norm`` (Identity unless ``qk_norm``) are where the mean-attention-distance study
    (``studies/ringformer/attention_distance.py``) reads q and k."""

    def __init__(
            self,
            dim: int,
            num_heads: int,
            q: nn.Module,
            k: nn.Module,
            v: nn.Module,
            proj: nn.Module,
            qk_norm: bool = False,
            attn_drop: float = 0.,
            proj_drop: float = 0.,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim, self.q_norm, self.k_norm = head_norms(dim, num_heads, qk_norm)
        self.q, self.k, self.v, self.proj = q, k, v, proj
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, level: Level, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [B, N, d] -> [B, N, d]`` at ``level``; ``attn_mask`` as ``F.scaled_dot_product_attention``
        takes it."""
        q = self.q_norm(split_heads(level.project('q', self.q, x), self.num_heads))
        k = self.k_norm(split_heads(level.project('k', self.k, x), self.num_heads))
        v = split_heads(level.project('v', self.v, x), self.num_heads)
        x = attend_heads(q, k, v, attn_mask, self.attn_drop if self.training else 0.)
        return self.proj_drop(level.project('proj', self.proj, x))


class RingBlock(nn.Module):
    """The shared pre-norm block, run once per level (Fig. 1d): ``x + Attn_i(LN1_i(x))``, then
    ``h + FFN_i(LN2_i(h))``, the norms and signals of level i. ``[B, N, d] -> [B, N, d]``."""

    def __init__(self, attn: RecurrentAttention, ffn: nn.Module, ffn_drop: float = 0.):
        super().__init__()
        self.attn, self.ffn = attn, ffn
        self.ffn_drop = nn.Dropout(ffn_drop)

    def forward(self, x: torch.Tensor, level: Level, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [B, N, d] -> [B, N, d]``, the shared block run as ``level``."""
        x = x + level.drop_path(self.attn(level.norm1(x), level, attn_mask))
        return x + level.drop_path(self.ffn_drop(level.ffn(self.ffn, level.norm2(x))))


def _check_rank(rank):
    """A level signal's rank: None (the default, ``embed_dim // 16``) or an integer >= 1."""
    if rank is not None and not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
        raise ValueError(f'rank must be an integer >= 1 (or None for embed_dim // 16), got rank={rank!r}')


class _RecurrentViT(TokenFormerViT):
    """A ViT whose trunk is one shared `RingBlock` (``self.shared``) run over ``self.blocks``, an
    ``nn.ModuleList`` of ``depth`` `Level` s. Everything else (stem, position embedding, class
    and register tokens, pooling, head, ``forward_intermediates`` per level, ``features_only``,
    gradient checkpointing per level) is [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT]'s.
    TorchScript is not supported (a level is passed to the shared block as an argument); fx and ``torch.compile``
    are."""

    if TYPE_CHECKING:  # set by each family's _build_blocks
        shared: RingBlock

    def _run_block(self, level: nn.Module, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The shared block at ``level`` (the trunk runs the levels in order)."""
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint(self.shared, x, level, attn_mask, use_reentrant=False)
        return self.shared(x, level, attn_mask)

    @torch.jit.ignore
    def group_matcher(self, coarse=False):
        """Layer-wise lr decay groups: stem, one group per level, final norm. The shared block, used at
        every level, is in the last level's group: its lr scale is the largest any level has (with it
        in the first level's group, ``layer_decay`` 0.65 left 7.08M of RingFormer-B's 12.17M
        parameters at ~0.006x the lr)."""
        return dict(stem=r'^cls_token|^reg_token|^pos_embed|^patch_embed',
                    blocks=[(r'^blocks\.(\d+)', None), (r'^shared', (len(self.blocks) - 1,)), (r'^norm', (99999,))])


class RingFormerViT(_RecurrentViT):
    """RingFormer ViT (paper §3, Fig. 1d; App. A.1), timm-compatible.

    Args (besides [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT]'s stem, pooling, head and dropout
        arguments): embed_dim, depth (levels), num_heads, mlp_ratio: the shared block's width, recurrences, heads,
            FFN hidden size ``mlp_ratio * embed_dim``.
        rank: rank r of the level signals (default ``embed_dim // 16``, the paper's).
        level_signal: ``'lowrank'`` (RingFormer) or ``'none'`` (no signals: a recurrent Transformer with
            per-level norms only, for ablations).
        qkv_bias: biases of W_Q, W_K, W_V (ViT's, default True).
        pos_embed: default ``'sincos'`` (fixed; the paper's parameter counts have no learned one).

    Shapes as [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT]. Raises ValueError: embed_dim not
    divisible by num_heads, or an unknown ``level_signal``.
    """

    def __init__(
            self,
            embed_dim: int = 768,
            depth: int = 12,
            num_heads: int = 12,
            mlp_ratio: float = 4.,
            rank: Optional[int] = None,
            level_signal: str = 'lowrank',
            qkv_bias: bool = True,
            pos_embed: str = 'sincos',
            **kwargs: Any,
    ):
        _check_rank(rank)
        self._ring: Dict[str, Any] = dict(mlp_ratio=mlp_ratio, rank=max(1, embed_dim // 16) if rank is None else rank,
                          level_signal=level_signal, qkv_bias=qkv_bias)
        super().__init__(embed_dim=embed_dim, depth=depth, num_heads=num_heads, pos_embed=pos_embed, **kwargs)

    def _build_patch_embed(self, img_size: Union[int, Tuple[int, int]], patch_size: int, in_chans: int,
                           embed_dim: int, score_norm: str, strict_img_size: bool) -> ConvPatchEmbed:
        return ConvPatchEmbed(img_size, patch_size, in_chans, embed_dim, strict_img_size=strict_img_size,
                              dynamic_img_pad=False)

    def _build_blocks(self, depth: int, dpr: List[float], kw: dict, tokens: List[Dict[str, int]]) -> Blocks:
        r, d = self._ring, kw['dim']
        hidden = round(d * r["mlp_ratio"])
        linear = lambda: nn.Linear(d, d, bias=r['qkv_bias'])  # noqa: E731
        attn = RecurrentAttention(d, kw['num_heads'], linear(), linear(), linear(), nn.Linear(d, d),
                                  qk_norm=kw['qk_norm'], attn_drop=kw['attn_drop'], proj_drop=kw['proj_drop'])
        self.shared = RingBlock(attn, Mlp(d, hidden, drop=kw['proj_drop']))
        dims = dict(q=(d, d), k=(d, d), v=(d, d))
        return nn.ModuleList([Level(d, r['level_signal'], r['rank'], dims=dims, drop_path=dpr[i])
                              for i in range(depth)])

    def init_weights(self) -> None:
        """The TokenFormer init, then timm ViT's init of the shared Linear layers (RingFormer's own)."""
        super().init_weights()
        if hasattr(self, 'shared'):
            for m in self.shared.modules():  # timm ViT's init of the Linear layers
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)


class TokenRingViT(_RecurrentViT):
    """Ring x Token: a recurrent TokenFormer, one shared TokenFormer block (Pattention Q/K/V/output/FFN)
    run ``depth`` times with per-level affine LayerNorms and level signals.

    Args (besides [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT]'s, whose ``num_tokens*`` size the
        shared Pattentions and the stem): level_signal: ``'lowrank'`` (RingFormer's M_i x, rank ``rank``, default
        ``embed_dim // 16``) or
            ``'tokens'`` (``level_tokens`` key/value tokens per level for Q, K, V and output, four
            times as many for the FFN; default ``num_tokens_qkv // 32``), or ``'none'``.
        pos_embed: default ``'sincos'``, as RingFormer.

    Growth ([`tkvision.growth.grow`][tkvision.growth.tokens.grow]): the shared Pattentions are the kinds ``patch``,
    ``qkv``, ``proj``, ``ffn``, so every level gains the same new tokens; level tokens are not grown.
    Raises ValueError as [`RingFormerViT`][tkvision.models.ringformer.RingFormerViT].
    """

    def __init__(
            self,
            level_signal: str = 'lowrank',
            rank: Optional[int] = None,
            level_tokens: Optional[bool] = None,
            pos_embed: str = 'sincos',
            **kwargs: Any,
    ):
        _check_rank(rank)
        if level_tokens is not None and not (isinstance(level_tokens, int) and level_tokens >= 1):
            raise ValueError(f'level_tokens must be an integer >= 1 or None, got level_tokens={level_tokens!r}')
        self._ring: Dict[str, Any] = dict(level_signal=level_signal, rank=rank, level_tokens=level_tokens)
        super().__init__(pos_embed=pos_embed, **kwargs)

    def _build_blocks(self, depth: int, dpr: List[float], kw: dict, tokens: List[Dict[str, int]]) -> Blocks:
        if any(t != tokens[0] for t in tokens):
            raise ValueError('the recurrent trunk shares one block across levels: give one token count per kind')
        r, d = self._ring, kw['dim']
        pattn = lambda n, kind: Pattention(d, d, n, score_norm=kw['score_norm'], key_std=kw['key_std'],  # noqa: E731
                                           value_std=kw['value_std'], kind=kind)
        n_qkv, n_proj, n_ffn = (tokens[0][f'num_tokens_{kind}'] for kind in ('qkv', 'proj', 'ffn'))
        attn = RecurrentAttention(d, kw['num_heads'], pattn(n_qkv, 'qkv'), pattn(n_qkv, 'qkv'), pattn(n_qkv, 'qkv'),
                                  pattn(n_proj, 'proj'), qk_norm=kw['qk_norm'], attn_drop=kw['attn_drop'],
                                  proj_drop=kw['proj_drop'])
        self.shared = RingBlock(attn, pattn(n_ffn, 'ffn'), ffn_drop=kw['proj_drop'])
        m = max(1, n_qkv // 32) if r['level_tokens'] is None else r['level_tokens']
        per_level = dict(q=m, k=m, v=m, proj=m, ffn=4 * m)
        dims = dict.fromkeys(('q', 'k', 'v', 'proj', 'ffn'), (d, d))
        rank = max(1, d // 16) if r['rank'] is None else r['rank']
        return nn.ModuleList([Level(d, r['level_signal'], rank, tokens=per_level, dims=dims, drop_path=dpr[i],
                                    value_std=kw['value_std']) for i in range(depth)])


def _create(cls, variant, pretrained=False, **kwargs):
    return create_tokenformer(cls, variant, pretrained, **kwargs)


def _ring_cfg(**kwargs):
    return tokenformer_cfg(paper_ids='arXiv:2502.13181', paper_name='RingFormer', **kwargs)


default_cfgs = generate_default_cfgs({
    'ringformer_vit_small_patch16_224.untrained': _ring_cfg(num_classes=100),
    'ringformer_vit_base_patch16_224.untrained': _ring_cfg(),
    'ringformer_vit_base_wide_patch16_224.untrained': _ring_cfg(),
    'tokenformer_ring_vit_small_patch16_224.untrained': _ring_cfg(num_classes=100),
    'tokenformer_ring_vit_base_patch16_224.untrained': _ring_cfg(),
    'tokenformer_ring_vit_base_wide_patch16_224.untrained': _ring_cfg(),
})


@register_model
def ringformer_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """RingFormer, ImageNet-small (Table 2): d 512, FFN 2048, 6 levels, 8 heads, 100 classes: 4.40M (paper 4.4M)."""
    args = dict(patch_size=16, embed_dim=512, depth=6, num_heads=8)  # 100 classes: the cfg's (a file's head wins)
    return _create(RingFormerViT, 'ringformer_vit_small_patch16_224', pretrained, **dict(args, **kwargs))


@register_model
def ringformer_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """RingFormer, ImageNet-1K (Table 3): d 768, FFN 3072, 12 levels, 12 heads: 12.02M (paper 12.02M)."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create(RingFormerViT, 'ringformer_vit_base_patch16_224', pretrained, **dict(args, **kwargs))


@register_model
def ringformer_vit_base_wide_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """RingFormer^s, upscaled (Table 3): d 1284, FFN 5120, 12 levels, 12 heads, rank 80: 31.95M (paper 31.95M)."""
    args = dict(patch_size=16, embed_dim=1284, depth=12, num_heads=12, mlp_ratio=5120 / 1284)
    return _create(RingFormerViT, 'ringformer_vit_base_wide_patch16_224', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_ring_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> TokenRingViT:
    """Ring x Token at RingFormer's ImageNet-small size: d 512, 6 levels, 8 heads, 512 / 2048 shared tokens."""
    args = dict(patch_size=16, embed_dim=512, depth=6, num_heads=8, num_tokens=512)  # 100 classes: the cfg's
    return _create(TokenRingViT, 'tokenformer_ring_vit_small_patch16_224', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_ring_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> TokenRingViT:
    """Ring x Token at RingFormer-B size: d 768, 12 levels, 12 heads, 768 / 3072 shared tokens."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=768)
    return _create(TokenRingViT, 'tokenformer_ring_vit_base_patch16_224', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_ring_vit_base_wide_patch16_224(pretrained: bool = False, **kwargs: Any) -> TokenRingViT:
    """Ring x Token upscaled as RingFormer^s: d 1284, 12 levels, 12 heads, 1284 / 5136 shared tokens."""
    args = dict(patch_size=16, embed_dim=1284, depth=12, num_heads=12, num_tokens=1284)
    return _create(TokenRingViT, 'tokenformer_ring_vit_base_wide_patch16_224', pretrained, **dict(args, **kwargs))
