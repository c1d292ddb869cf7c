"""The TokenFormer stem: a Pattention over image patches whose key tokens are a conv filter bank
(`PatchPattention`, the fixed-grid family's), or rows over pre-cut patches of any patch size
(`FlexPatchPattention`, the NaFlex family's).

Design choice where the paper is silent (``docs/reference/background.md``, "The vision model"): the patch
embedding is a Pattention over flattened ``p x p`` patches with ``num_tokens`` tokens.
"""
import math
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import resample_patch_embed, to_2tuple
from timm.layers.patch_embed import PatchEmbedResamplerFixedOrigSize
from torch import nn

from .pattention import Pattention

__all__ = ['PatchPattention', 'FlexPatchPattention', 'PatchEmbed']


class _SquarePatchPattention(Pattention):
    """What both patch Pattentions share: key tokens over square ``p x p`` patches of ``in_chans`` channels
    (``in_chans * p * p`` entries each), kind ``patch``.

    Args:
        in_chans: the image's channels.
        patch_size: p, the side of a square patch in pixels.
        out_features: the width of the patch tokens (``embed_dim``).
        num_tokens: n, the key/value parameter tokens.
        score_norm: Θ (`tkvision.layers.pattention.SCORE_NORMS`); other keywords go to `Pattention`.
    """

    key_name = 'weight'
    if TYPE_CHECKING:  # K_P under this name (set by Pattention); TorchScript reads class annotations
        weight: nn.Parameter

    def __init__(
            self,
            in_chans: int,
            patch_size: int,
            out_features: int,
            num_tokens: int,
            score_norm: str = 'l2_norm_gelu',
            **kwargs: Any,
    ):
        kwargs.setdefault('kind', 'patch')
        super().__init__(in_chans * patch_size * patch_size, out_features, num_tokens, score_norm, **kwargs)
        self.in_chans, self.patch_size = in_chans, patch_size


class PatchPattention(_SquarePatchPattention):
    """The patch embedding's Pattention, its key tokens stored as a conv filter bank.

    ``[B, C, H, W] -> [B, H/p * W/p, out_features]``. The scores of Eq. 4 for the flattened
    ``p x p`` patches, ``A = X K_Pᵀ``, are one stride-``p`` convolution of the image with the key
    tokens viewed as ``n`` filters: ``weight`` ``[n, C, p, p]`` is K_P. This makes the stem what timm
    expects of a ViT's ``first_conv`` (``patch_embed.proj.weight``): ``adapt_input_conv`` changes its
    input channels when a checkpoint is loaded with another ``in_chans``, and growth appends filters.
    Θ and V_P are the base class's. Arguments: ``in_chans``, ``patch_size`` (p, square patches),
    ``out_features``, ``num_tokens``, ``score_norm`` and Pattention's keywords.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        p = self.patch_size
        self.weight = nn.Parameter(self.weight.detach().view(self.num_tokens, self.in_chans, p, p))

    def scores(self, x: torch.Tensor, key_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """A for every patch over the active key tokens: ``[B, C, H, W] -> [B, H/p * W/p, k]``
        (``key_scale`` over the flattened ``C x p x p`` entries, as ``Pattention.fold_keys``)."""
        weight = self.active(self.weight)
        if key_scale is not None or self.centre_keys:
            weight = self.fold_keys(weight.flatten(1), key_scale).view_as(weight)
        return F.conv2d(x, weight, stride=self.patch_size).flatten(2).transpose(1, 2)


class FlexPatchPattention(_SquarePatchPattention):
    """The patch embedding's Pattention on patches cut beforehand, of any square patch size (NaFlex).

    ``[B, N, ph * pw * C] -> [B, N, out_features]``, patches flattened channels-last ``(ph, pw, C)`` as
    timm's NaFlex loader and ``batch_patchify`` cut them. ``weight`` ``[n, p * p * C]`` is K_P in that
    layout, at the base patch size ``p``. Patches of another size ``q`` (``q * q * C`` values) are scored
    against the key tokens resampled to ``q`` as FlexiViT resamples a patch-embedding kernel (timm's
    ``PatchEmbedResamplerFixedOrigSize``, pseudo-inverse resize: FlexiViT Sec. 3.4; its resize matrix is
    cached per patch size, so a batch of another size does not recompute it), so a patch resized with the
    same interpolation keeps its scores A = X K_Pᵀ; V_P and τ are the same for every patch size. Arguments as
    `PatchPattention`'s.

    Raises:
        ValueError (in forward): a patch length that is not ``q * q * in_chans`` for an integer ``q``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        p = self.patch_size
        self.resampler = PatchEmbedResamplerFixedOrigSize((p, p))  # no state in the state dict

    def keys_for(self, patch_length: int) -> torch.Tensor:
        """The active K_P for patches of ``patch_length`` values: ``weight`` itself at the base size, else
        resampled (``[k, patch_length]``)."""
        weight = self.active(self.weight)
        if patch_length == weight.shape[1]:
            return weight
        q = math.isqrt(patch_length // self.in_chans)
        if q * q * self.in_chans != patch_length:
            raise ValueError(f'patches of {patch_length} values are not q x q x {self.in_chans} (in_chans) for any '
                             f'integer q: cut square patches, channels last')
        p, n = self.patch_size, weight.shape[0]
        kernel = weight.reshape(n, p, p, self.in_chans).permute(0, 3, 1, 2)  # channels-last rows -> [n, C, p, p]
        return self.resampler(kernel, [q, q]).permute(0, 2, 3, 1).reshape(n, patch_length)

    def scores(self, x: torch.Tensor, key_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """A for every patch over the active key tokens: ``[B, N, q * q * C] -> [B, N, k]`` (``key_scale``
        as ``Pattention.fold_keys``)."""
        return F.linear(x, self.fold_keys(self.keys_for(x.shape[-1]), key_scale))


def _square(patch_size: Union[int, Tuple[int, int]]) -> int:
    """The side of a square patch given as timm gives it (``16`` or ``(16, 16)``).

    Raises:
        ValueError: a patch that is not square (a Pattention stem's key tokens are square filters).
    """
    p = to_2tuple(patch_size)
    if p[0] != p[1]:
        raise ValueError(f'patch_size {tuple(p)}: a TokenFormer stem takes square patches only')
    return int(p[0])


class PatchEmbed(nn.Module):
    """Image to patch tokens with a Pattention: ``[B, C, H, W] -> [B, H/p * W/p, embed_dim]``
    (`PatchPattention`, ``num_tokens`` key/value tokens over the ``C x p x p`` patches).

    Raises:
        ValueError (at construction): ``img_size`` not divisible by ``patch_size``.
        AssertionError (in forward): input size differs from ``img_size`` while ``strict_img_size``,
            or is not a multiple of ``patch_size``.
    """

    def __init__(
            self,
            img_size: Union[int, Tuple[int, int]] = 224,
            patch_size: Union[int, Tuple[int, int]] = 16,
            in_chans: int = 3,
            embed_dim: int = 768,
            num_tokens: int = 768,
            score_norm: str = 'l2_norm_gelu',
            strict_img_size: bool = True,
    ):
        super().__init__()
        p = _square(patch_size)
        self.img_size: Tuple[int, int] = to_2tuple(img_size)
        self.patch_size: Tuple[int, int] = (p, p)
        self.grid_size, self.num_patches = self._grid(self.img_size, p)
        self.in_chans, self.strict_img_size = in_chans, strict_img_size
        self.proj = PatchPattention(in_chans, p, embed_dim, num_tokens, score_norm=score_norm)

    @staticmethod
    def _grid(img_size: Tuple[int, int], p: int) -> Tuple[Tuple[int, int], int]:
        """The patch grid of ``img_size`` and its patches, refusing a size ``p`` does not divide."""
        if img_size[0] % p or img_size[1] % p:
            raise ValueError(f'img_size {img_size} must be divisible by patch_size {p}')
        grid = (img_size[0] // p, img_size[1] // p)
        return grid, grid[0] * grid[1]

    @torch.jit.ignore
    def set_input_size(
            self,
            img_size: Optional[Union[int, Tuple[int, int]]] = None,
            patch_size: Optional[Union[int, Tuple[int, int]]] = None,
    ) -> None:
        """Change the input size and / or the patch size in place (timm's ``PatchEmbed.set_input_size``).

        A new patch size resamples the key tokens as FlexiViT resamples a conv stem (timm's
        ``resample_patch_embed``, pseudo-inverse resize), so the scores A = X K_Pᵀ of a patch resized
        with the same interpolation are kept; V_P and τ do not change.

        Raises:
            ValueError: an image size not divisible by the patch size.
        """
        if patch_size is not None and to_2tuple(patch_size) != self.patch_size:
            p = _square(patch_size)
            with torch.no_grad():
                weight = resample_patch_embed(self.proj.weight, [p, p])
            self.proj.weight = nn.Parameter(weight, requires_grad=self.proj.weight.requires_grad)
            self.proj.patch_size, self.proj.in_features, self.patch_size = p, weight[0].numel(), (p, p)
        if img_size is not None:
            self.img_size = to_2tuple(img_size)
        self.grid_size, self.num_patches = self._grid(self.img_size, self.patch_size[0])

    def dynamic_feat_size(self, img_size: Tuple[int, int]) -> Tuple[int, int]:
        """Patch grid ``(H/p, W/p)`` of an image of ``img_size = (H, W)`` pixels."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, in_chans, H, W]`` -> ``[B, H/p * W/p, embed_dim]``, raising as the class docstring says."""
        _, _, H, W = x.shape
        p = self.patch_size[0]
        if self.strict_img_size:
            torch._assert((H == self.img_size[0]) & (W == self.img_size[1]),
                          f'Input size ({H}x{W}) does not match the model ({self.img_size[0]}x{self.img_size[1]}); '
                          'create the model with img_size=... or dynamic_img_size=True')
        else:
            torch._assert((H % p == 0) & (W % p == 0), f'Input size ({H}x{W}) must be divisible by patch size {p}')
        return self.proj(x)
