"""The TokenFormer block (paper Eq. 6-11): multi-head attention whose Q, K, V and output projections
are Pattentions, and an FFN that is one Pattention. Used by ``tokenformer_vit_*``, the NaFlex family,
the Ring x Token family's shared block and the MAE decoder.
"""
import math
from functools import partial
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale
from torch import nn

from .pattention import Pattention, score_norm_entry

__all__ = ['Attention', 'Block', 'split_heads', 'attend_heads', 'head_norms']


def head_norms(dim: int, num_heads: int, qk_norm: bool) -> Tuple[int, nn.Module, nn.Module]:
    """``(head_dim, q_norm, k_norm)`` of an attention of width ``dim`` with ``num_heads`` heads: the per-head
    LayerNorms of queries and keys (timm's ``qk_norm``), or identities; shared by every attention of the package.

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``.
    """
    if dim % num_heads:
        raise ValueError(f'embed_dim {dim} must be divisible by num_heads {num_heads}')
    head_dim = dim // num_heads
    return head_dim, _norm(head_dim, qk_norm), _norm(head_dim, qk_norm)


def _norm(head_dim: int, qk_norm: bool) -> nn.Module:
    return nn.LayerNorm(head_dim) if qk_norm else nn.Identity()


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Projected tokens ``[B, N, C]`` as ``num_heads`` heads, ``[B, N, heads, C / heads]`` (a view; ``q_norm`` and
    ``k_norm`` act on it, where the attention-distance study reads q and k)."""
    B, N, C = x.shape
    return x.view(B, N, num_heads, C // num_heads)


def attend_heads(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.,
) -> torch.Tensor:
    """Scaled dot-product attention of heads ``[B, N, heads, d]`` (`split_heads`; ``F.scaled_dot_product_attention``:
    softmax of ``q kᵀ / √d``, ``attn_mask`` as it takes it), merged back to ``[B, N, heads · d]``; shared by every
    attention of the package (this module's `Attention`, ``tkvision.models.ringformer.RecurrentAttention``)."""
    B, N, H, D = q.shape
    x = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask,
                                       dropout_p=dropout_p)
    return x.transpose(1, 2).reshape(B, N, H * D)


class Attention(nn.Module):
    """Multi-head self-attention with Pattention projections (Eq. 8-10), ``[B, N, dim] -> [B, N, dim]``.

    Q, K, V = Pattention_q/k/v(x) (token-parameter attention, each ``num_tokens_qkv`` tokens),
    softmax token-token attention per head through ``F.scaled_dot_product_attention`` (scale
    1/√head_dim, Eq. 9), output projection Pattention_o (``num_tokens_proj`` tokens).

    Args:
        dim: token width d.
        num_heads: attention heads (``head_dim = dim / num_heads``).
        num_tokens_qkv: parameter tokens of each of Q, K, V.
        num_tokens_proj: parameter tokens of the output projection.
        score_norm: the Pattentions' Θ.
        value_std: initial std of the four Pattentions' value parameter tokens.
        key_std: initial std of their key parameter tokens.
        qk_norm: a LayerNorm over each head's channels of q and k before the dot product (timm's).
        attn_drop: dropout of the attention weights.
        proj_drop: dropout of the output.

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``.
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            num_tokens_qkv: int,
            num_tokens_proj: int,
            score_norm: str = 'l2_norm_gelu',
            value_std: float = 0.02,
            key_std: float = 0.02,
            qk_norm: bool = False,
            attn_drop: float = 0.,
            proj_drop: float = 0.,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim, self.q_norm, self.k_norm = head_norms(dim, num_heads, qk_norm)
        pattention = partial(Pattention, dim, dim, score_norm=score_norm, key_std=key_std, value_std=value_std)
        self.q = pattention(num_tokens_qkv, kind='qkv')
        self.k = pattention(num_tokens_qkv, kind='qkv')
        self.v = pattention(num_tokens_qkv, kind='qkv')
        self.attn_drop = attn_drop
        self.proj = pattention(num_tokens_proj, kind='proj')
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
            self,
            x: torch.Tensor,
            attn_mask: Optional[torch.Tensor] = None,
            key_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``x [B, N, dim]`` -> ``[B, N, dim]``.

        Args:
            x: input tokens ``[B, N, dim]``.
            attn_mask: as ``F.scaled_dot_product_attention`` takes it (bool, True = attend, or float added
                to the scores; broadcast to ``[B, heads, N, N]``), or None.
            key_scale: ``[dim]`` or None: a folded LayerNorm's weight, passed to the Q, K and V
                Pattentions (``tkvision.layers.Pattention.score_keys``).
        """
        q = self.q_norm(split_heads(self.q(x, key_scale), self.num_heads))
        k = self.k_norm(split_heads(self.k(x, key_scale), self.num_heads))
        v = split_heads(self.v(x, key_scale), self.num_heads)
        x = attend_heads(q, k, v, attn_mask, self.attn_drop if self.training else 0.)
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    """Pre-norm TokenFormer block (Eq. 6-7, 11): ``x + Attn(LN(x))``, then ``h + FFN(LN(h))``.

    The FFN is a single Pattention with ``num_tokens_ffn`` tokens: its GELU-normalised scores are
    the only nonlinearity.

    **The LayerNorm fold** (``norm_fold``, on by default where it is exact). With a scale-invariant Θ
    (``SCORE_NORMS[score_norm].scale_invariant``: the default ``l2_norm_gelu``, and ``l1_norm_gelu``) a
    Pattention's output does not change when its input token is scaled, so a LayerNorm without bias
    reduces to its mean subtraction, which is linear and moves into the keys:
    ``LN(x) · Kᵀ = ((x − mean(x)) / σ(x)) · Kᵀ = (x · K_cᵀ) / σ(x)`` with ``K_c`` each key token (times the
    LayerNorm's weight, if any) centred over its ``dim`` entries, and Θ removes the 1/σ(x). Θ's floor ε
    on ‖A‖ is scaled by √(LayerNorm ε), the smallest σ(x), so that a token whose variance is far below the
    LayerNorm's ε (a freshly initialised class token) is treated as before. The block then runs no
    LayerNorm: Q, K, V and the FFN read the residual stream with centred keys (``Pattention.centre_keys``).
    Outputs and every gradient equal the explicit LayerNorm's up to rounding, and the parameters are the
    same, so a checkpoint loads either way (``tests/test_norm_fold.py``). A LayerNorm bias, or the
    ``gelu_l2_norm`` and ``softmax`` Θ, break the invariance: the block then keeps the explicit LayerNorm
    whatever ``norm_fold`` says. In low precision the fold multiplies the uncentred residual stream, whose
    rounding is relative to its own size rather than to its spread: set ``norm_fold=False`` if a bf16 run
    loses accuracy.

    Args:
        dim: token width d (as the [`Attention`][tkvision.layers.block.Attention]'s).
        num_heads: attention heads.
        num_tokens_qkv: parameter tokens of each of Q, K, V.
        num_tokens_proj: parameter tokens of the attention's output projection.
        score_norm: every Pattention's Θ.
        qk_norm: a LayerNorm over each head's channels of q and k (timm's).
        num_tokens_ffn: parameter tokens of the FFN Pattention.
        value_std: initial std of every Pattention's value parameter tokens.
        key_std: initial std of every Pattention's key parameter tokens.
        norm_weight: a learnable LayerNorm weight (paper Table 5; non-parametric by default, as the public
            TokenFormer code).
        norm_bias: a learnable LayerNorm bias (needs ``norm_weight``).
        norm_fold: fold the LayerNorms into the keys where that is exact (above); False keeps them
            explicit (the reference).
        init_values: LayerScale (Touvron et al. 2021, timm's ``LayerScale``): each branch multiplied by a
            learned per-channel ``gamma`` initialised to it; None: off.
        proj_drop: dropout of the attention's output.
        attn_drop: dropout of the attention weights.
        drop_path: stochastic depth of both branches.

    Raises:
        ValueError: ``norm_bias`` without ``norm_weight``, or heads that do not divide ``dim``.
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            num_tokens_qkv: int,
            num_tokens_proj: int,
            num_tokens_ffn: int,
            score_norm: str = 'l2_norm_gelu',
            value_std: float = 0.02,
            key_std: float = 0.02,
            norm_weight: bool = False,
            norm_bias: bool = False,
            norm_fold: bool = True,
            qk_norm: bool = False,
            init_values: Optional[float] = None,
            proj_drop: float = 0.,
            attn_drop: float = 0.,
            drop_path: float = 0.,
    ):
        super().__init__()
        if norm_bias and not norm_weight:
            raise ValueError('block_norm_bias=True needs block_norm_weight=True (Table 5 has no bias-only row)')
        norm = partial(nn.LayerNorm, dim, eps=1e-5, elementwise_affine=norm_weight, bias=norm_bias)
        self.norm1 = norm()
        self.attn = Attention(
            dim,
            num_heads,
            num_tokens_qkv,
            num_tokens_proj,
            score_norm=score_norm,
            value_std=value_std,
            key_std=key_std,
            qk_norm=qk_norm,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm()
        self.ffn = Pattention(dim, dim, num_tokens_ffn, score_norm=score_norm, key_std=key_std, value_std=value_std,
                              kind='ffn')
        self.ffn_drop = nn.Dropout(proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm_fold = bool(norm_fold) and not norm_bias and score_norm_entry(score_norm).scale_invariant
        if self.norm_fold:
            for layer in (self.attn.q, self.attn.k, self.attn.v, self.ffn):
                layer.centre_keys = True
                # Θ's floor on ‖A‖ now applies to σ(x)·‖A‖: scale it by the smallest σ(x), √(LayerNorm ε)
                layer.eps = layer.eps * math.sqrt(self.norm1.eps)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pre-norm residual block, ``x [B, N, dim] -> [B, N, dim]``; ``attn_mask`` as the attention's."""
        if self.norm_fold:  # the LayerNorms live in the keys (class docstring)
            x = x + self.drop_path1(self.ls1(self.attn(x, attn_mask, self.norm1.weight)))
            return x + self.drop_path2(self.ls2(self.ffn_drop(self.ffn(x, self.norm2.weight))))
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask)))
        return x + self.drop_path2(self.ls2(self.ffn_drop(self.ffn(self.norm2(x)))))
