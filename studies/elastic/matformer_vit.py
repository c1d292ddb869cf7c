"""A MatFormer-style ViT: timm's VisionTransformer whose MLPs run at any prefix of their hidden units.

MatFormer (Devvrit et al., NeurIPS 2023, https://arxiv.org/abs/2310.07707, §3) nests the FFN of every
block: granularity i uses the first m_i hidden units, ``FFN_i(x) = σ(x W1[:m_i]ᵀ) W2[:, :m_i]``, and all
granularities are trained together. `NestedMlp` is timm's ``Mlp`` with that prefix; it follows
the elastic-layer protocol of [`tkvision.growth.elastic`][tkvision.growth.elastic] (a hidden unit plays the part of a
parameter token), so tkvision's elastic training, evaluation and extraction run on this model unchanged.

Importing this module registers ``matformer_vit_tiny_patch16_224`` with timm (the study's baseline, built on
timm's own ``VisionTransformer`` and ``Mlp``).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer, vit_tiny_patch16_224
from torch import nn

__all__ = ['NestedMlp']


class NestedMlp(Mlp):
    """timm's ``Mlp`` (fc1, activation, fc2) run with its first ``prefix_tokens`` hidden units, or all of
    them (``None``): ``[..., in_features] -> [..., out_features]``. The slices are views (no copy).

    Raises:
        ValueError: an MLP with a norm over its hidden units (it cannot be sliced), or a gated MLP.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.norm, nn.Identity):
            raise ValueError('a NestedMlp has no norm over its hidden units (it would not slice)')
        self.prefix_tokens: Optional[int] = None

    @property
    def num_tokens(self) -> int:
        """Hidden units (MatFormer's d_ff)."""
        return self.fc1.out_features

    @property
    def parameters_per_token(self) -> int:
        """Parameters of one hidden unit: its fc1 row and bias, its fc2 column."""
        return self.fc1.in_features + (self.fc1.bias is not None) + self.fc2.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features] -> [..., out_features]`` through the active hidden units."""
        k = self.prefix_tokens
        if k is None:
            return super().forward(x)
        bias = self.fc1.bias[:k] if self.fc1.bias is not None else None
        x = self.drop1(self.act(F.linear(x, self.fc1.weight[:k], bias)))
        return self.drop2(F.linear(x, self.fc2.weight[:, :k], self.fc2.bias))

    @torch.no_grad()
    def truncate(self, num_tokens: int) -> 'NestedMlp':
        """Keep only the first ``num_tokens`` hidden units, in place (the prefix as a plain ``Mlp``)."""
        fc1, fc2 = self.fc1, self.fc2
        self.fc1 = nn.Linear(fc1.in_features, num_tokens, bias=fc1.bias is not None).to(fc1.weight)
        self.fc2 = nn.Linear(num_tokens, fc2.out_features, bias=fc2.bias is not None).to(fc2.weight)
        self.fc1.weight.copy_(fc1.weight[:num_tokens])
        self.fc2.weight.copy_(fc2.weight[:, :num_tokens])
        if fc1.bias is not None:
            self.fc1.bias.copy_(fc1.bias[:num_tokens])
        if fc2.bias is not None:
            self.fc2.bias.copy_(fc2.bias)
        self.prefix_tokens = None
        return self


@register_model
def matformer_vit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """timm's ``vit_tiny_patch16_224`` with `NestedMlp` MLPs (a MatFormer ViT, MatViT)."""
    return vit_tiny_patch16_224(pretrained=pretrained, mlp_layer=NestedMlp, **kwargs)
