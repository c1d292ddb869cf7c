"""The TokenFormer block (paper Eq. 6-11): multi-head attention whose Q, K, V and output projections
are Pattentions, and an FFN that is one Pattention. Used by ``tokenformer_vit_*``, the Ring x Token
family's shared block and the MAE decoder.
"""
from functools import partial
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale
from torch import nn

from .pattention import Pattention
from .pattention_autograd import l2_norm_gelu

__all__ = ['Attention', 'Block']


class Attention(nn.Module):
    """Multi-head self-attention with Pattention projections (Eq. 8-10).

    Q, K, V = Pattention_q/k/v(x) (token-parameter attention, each ``num_tokens_qkv`` tokens),
    softmax token-token attention per head through ``F.scaled_dot_product_attention`` (scale
    1/√head_dim, Eq. 9), output projection Pattention_o (``num_tokens_proj`` tokens).
    ``qk_norm``: a LayerNorm over each head's channels of q and k before the dot product.
    ``key_std`` / ``value_std``: initial std of the four Pattentions' key / value parameter tokens.
    ``fused_qkv``: compute the three score matrices with one GEMM (:meth:`qkv_fused`; same
    parameters and checkpoints, same outputs as the three Pattentions, which stay the reference).
    ``[B, N, dim] -> [B, N, dim]``.
    """

    def __init__(self, dim, num_heads, num_tokens_qkv, num_tokens_proj, score_norm='l2_norm_gelu',
                 value_std=0.02, key_std=0.02, qk_norm=False, attn_drop=0., proj_drop=0., fused_qkv=False):
        super().__init__()
        self.fused_qkv = fused_qkv
        if dim % num_heads:
            raise ValueError(f'embed_dim {dim} must be divisible by num_heads {num_heads}')
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        pattn = partial(Pattention, dim, dim, score_norm=score_norm, key_std=key_std, value_std=value_std)
        self.q, self.k, self.v = (pattn(num_tokens_qkv, kind='qkv') for _ in range(3))
        # qk_norm (timm, x-transformers): LayerNorm of q and k over each head's channels
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = attn_drop
        self.proj = pattn(num_tokens_proj, kind='proj')
        self.proj_drop = nn.Dropout(proj_drop)

    def qkv_fused(self, x) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V with one score GEMM: ``x [B, N, d]`` against the concatenated key tokens ``[3n, d]``,
        each third normalised over its own n tokens with its own τ (Eq. 5) in one call, then one batched
        matmul of the three thirds (strided views of the scores, ``[3, B·N, n]``) with the stacked value
        tokens ``[3, n, d]``. Equals ``(self.q(x), self.k(x), self.v(x))`` in value and gradient
        (``tests/test_model_options.py``); needs equal token counts (growth grows the three together)."""
        q, k, v = self.q, self.k, self.v
        B, N, _ = x.shape
        n = q.key_param_tokens.shape[0]
        scores = F.linear(x, torch.cat([q.key_param_tokens, k.key_param_tokens, v.key_param_tokens]))
        tau = torch.stack([q.tau, k.tau, v.tau]).view(3, 1)
        s = self._normalize_thirds(scores.view(B * N, 3, n), tau)  # [B·N, 3, n]
        values = torch.stack([q.value_param_tokens, k.value_param_tokens, v.value_param_tokens])  # [3, n, d]
        out = torch.bmm(s.transpose(0, 1), values).view(3, B, N, -1)
        return out[0], out[1], out[2]

    def _normalize_thirds(self, scores: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting() and self.q._backward_path(scores) == 'closed_form':
            return l2_norm_gelu(scores, tau, self.q.eps)  # the closed-form backward, as the Pattentions take it
        return self.q.score_normalization(scores, tau, self.q.eps)

    def forward(self, x, attn_mask: Optional[torch.Tensor] = None):
        """``x [B, N, dim]`` -> ``[B, N, dim]``; ``attn_mask`` as ``F.scaled_dot_product_attention`` takes it
        (bool, True = attend, or float added to the scores; broadcast to ``[B, heads, N, N]``)."""
        B, N, C = x.shape
        if self.fused_qkv:
            q, k, v = self.qkv_fused(x)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = self.q_norm(q.view(B, N, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(B, N, self.num_heads, self.head_dim)).transpose(1, 2)
        v = v.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop if self.training else 0.)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    """Pre-norm TokenFormer block (Eq. 6-7, 11): ``x + Attn(LN(x))``, then ``h + FFN(LN(h))``.

    The FFN is a single Pattention with ``num_tokens_ffn`` tokens: its GELU-normalised scores are
    the only nonlinearity. Block LayerNorms are non-parametric unless ``norm_weight`` /
    ``norm_bias`` (paper Table 5). ``init_values``: LayerScale (Touvron et al. 2021, timm's
    ``LayerScale``), each branch multiplied by a learned per-channel ``gamma`` initialised to it.
    ``key_std`` / ``value_std``: initial std of every Pattention's key / value parameter tokens.
    """

    def __init__(self, dim, num_heads, num_tokens_qkv, num_tokens_proj, num_tokens_ffn,
                 score_norm='l2_norm_gelu', value_std=0.02, key_std=0.02, norm_weight=False, norm_bias=False,
                 qk_norm=False, init_values=None, proj_drop=0., attn_drop=0., drop_path=0., fused_qkv=False):
        super().__init__()
        if norm_bias and not norm_weight:
            raise ValueError('block_norm_bias=True needs block_norm_weight=True (Table 5 has no bias-only row)')
        norm = partial(nn.LayerNorm, dim, eps=1e-5, elementwise_affine=norm_weight, bias=norm_bias)
        self.norm1 = norm()
        self.attn = Attention(dim, num_heads, num_tokens_qkv, num_tokens_proj, score_norm, value_std, key_std,
                              qk_norm=qk_norm, attn_drop=attn_drop, proj_drop=proj_drop, fused_qkv=fused_qkv)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm()
        self.ffn = Pattention(dim, dim, num_tokens_ffn, score_norm=score_norm, key_std=key_std, value_std=value_std,
                              kind='ffn')
        self.ffn_drop = nn.Dropout(proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x, attn_mask: Optional[torch.Tensor] = None):
        """Pre-norm residual block, ``x [B, N, dim] -> [B, N, dim]``; ``attn_mask`` as the attention's."""
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask)))
        return x + self.drop_path2(self.ls2(self.ffn_drop(self.ffn(self.norm2(x)))))
