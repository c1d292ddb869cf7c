"""timm's ViT contract beyond ``forward`` (timm ``models/vision_transformer.py``): intermediate features,
pruning, a new input or patch size, the patch size. A mixin of
[`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT], so every family built on it (the recurrent ones
too) has it; ``tests/test_timm_clients.py`` holds it to timm's ViT's behaviour.

The model it is mixed into has timm's ViT attributes: ``patch_embed`` (``img_size``, ``patch_size``,
``grid_size``, ``set_input_size``, ``dynamic_feat_size``), ``blocks``, ``norm``, ``pos_embed``
(``pos_embed_type``), ``num_prefix_tokens``, ``no_embed_class``, ``embed_dim``, and ``_pos_embed``,
``_run_block``.
"""
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple, Union

import torch
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models._features import feature_take_indices
from torch import nn

from ..layers import PatchEmbed

__all__ = ['ViTContract']


class ViTContract:
    """``get_patch_size``, ``set_input_size``, ``forward_intermediates``, ``prune_intermediate_layers``.

    The attributes below are the model's: the model sets them, the type checker reads what this uses of them
    (under ``TYPE_CHECKING``: TorchScript reads a module class's annotations as attribute types)."""

    if TYPE_CHECKING:
        patch_embed: Union[PatchEmbed, TimmPatchEmbed]  # ours, or timm's conv stem (RingFormer)
        blocks: Union[nn.Sequential, nn.ModuleList]  # a recurrent family's levels: a ModuleList
        norm: nn.Module
        fc_norm: nn.Module
        pos_embed: Optional[torch.Tensor]
        pos_embed_type: str
        num_prefix_tokens: int
        no_embed_class: bool
        embed_dim: int
        feature_info: List[dict]
        _pos_embed: Callable[[torch.Tensor, Tuple[int, int]], torch.Tensor]
        _run_block: Callable[[nn.Module, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
        reset_classifier: Callable[[int, Optional[str]], None]

    @torch.jit.ignore
    def get_patch_size(self) -> Tuple[int, int]:
        """The stem's patch size ``(p_h, p_w)`` in pixels."""
        return self.patch_embed.patch_size

    @torch.no_grad()
    def sincos_table(self) -> torch.Tensor:
        """The fixed 2-D sin-cos position table of the current patch grid (timm's
        ``build_sincos2d_pos_embed``, as MAE), zeros for the prefix tokens it covers: ``[1, L, embed_dim]``."""
        grid = build_sincos2d_pos_embed(list(self.patch_embed.grid_size), self.embed_dim)
        prefix = 0 if self.no_embed_class else self.num_prefix_tokens
        return torch.cat([grid.new_zeros(prefix, self.embed_dim), grid]).unsqueeze(0).to(self.pos_embed)

    @torch.jit.ignore
    def set_input_size(self, img_size=None, patch_size=None):
        """Change the input size and / or the patch size in place, as timm's ViT does: the stem changes
        ([`tkvision.layers.PatchEmbed.set_input_size`][tkvision.layers.patch_embed.PatchEmbed.set_input_size]: a new
        patch size resamples the key tokens, keeping the scores of resized patches), a learned position embedding is
        resampled to the new grid (timm's ``resample_abs_pos_embed``), a sin-cos one is rebuilt for it.

        Raises:
            ValueError: an image size not divisible by the patch size.
        """
        previous = tuple(self.patch_embed.grid_size)
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if self.pos_embed is not None and tuple(self.patch_embed.grid_size) != previous:
            if self.pos_embed_type == 'sincos':  # a buffer: assigning replaces it
                self.pos_embed = self.sincos_table()
            else:
                prefix = 0 if self.no_embed_class else self.num_prefix_tokens
                self.pos_embed = nn.Parameter(resample_abs_pos_embed(
                    self.pos_embed.detach(), new_size=list(self.patch_embed.grid_size), old_size=list(previous),
                    num_prefix_tokens=prefix), requires_grad=self.pos_embed.requires_grad)
        for info in self.feature_info:
            info['reduction'] = self.patch_embed.patch_size[0]

    def forward_intermediates(self, x, indices: Optional[Union[int, List[int]]] = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW', intermediates_only: bool = False, output_dict: bool = False,
                              attn_mask: Optional[torch.Tensor] = None):
        """Features of selected blocks (levels of a recurrent model), as timm's ViT.

        Args:
            indices: last n blocks if int, all if None, these block indices if a list.
            norm: apply the final norm to each intermediate.
            output_fmt: ``'NCHW'`` (``[B, C, H/p, W/p]``) or ``'NLC'`` (``[B, N, C]``).
            output_dict: return ``{'image_intermediates', ['image_intermediates_prefix'], ['image_features']}``
                as timm's ViT does.
            attn_mask: as ``forward_features`` takes it.
        Returns:
            intermediates (list) if ``intermediates_only``, else (final features, intermediates); or the dict.
        Raises:
            ValueError: unknown ``output_fmt``.
        """
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        B, _, height, width = x.shape
        grid = self.patch_embed.dynamic_feat_size((height, width))
        x = self._pos_embed(self.patch_embed(x), grid)
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, blk in enumerate(blocks):
            x = self._run_block(blk, x, attn_mask)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        prefix = [y[:, :self.num_prefix_tokens] for y in intermediates]
        intermediates = [y[:, self.num_prefix_tokens:] for y in intermediates]
        if output_fmt == 'NCHW':
            intermediates = [y.reshape(B, grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if output_dict:
            out = dict(image_intermediates=intermediates)
            if return_prefix_tokens and self.num_prefix_tokens:
                out['image_intermediates_prefix'] = prefix
            if not intermediates_only:
                out['image_features'] = self.norm(x)
            return out
        if return_prefix_tokens and self.num_prefix_tokens:
            intermediates = list(zip(intermediates, prefix))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop blocks after the last of ``indices`` (and optionally norm / head); returns the kept indices."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, '')
        return take_indices
