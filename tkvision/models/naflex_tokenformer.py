"""NaFlex TokenFormer: a TokenFormer ViT on patch sequences of any resolution and aspect ratio.

A TokenFormer whose blocks are [`Block`][tkvision.layers.block.Block] (every projection a Pattention) and whose
stem is a `FlexPatchPattention`, inside timm's ``NaFlexVit``: it takes what
NaFlexViT takes, the patch dictionary of timm's NaFlex loader (``patches [B, N, p*p*C]``, ``patch_coord
[B, N, 2]``, ``patch_valid [B, N]``) or plain images ``[B, C, H, W]``; padding tokens are masked in
attention and in pooling, position embeddings are NaFlexViT's (a learned grid resampled to each
image's grid), and patches of another square size are scored against resampled key tokens.

Why it fits: a Pattention acts on each token alone, so only the patch embedding and the position
embedding see the grid; everything else is the fixed-grid family's, parameter for parameter, and a
fixed-grid checkpoint loads (`checkpoint_filter_fn`) and gives the same outputs on a full grid.

Papers: `TokenFormer` (Wang et al. 2024, arXiv:2410.23168, Eq. 4-11); `Patch n' Pack: NaViT`
(Dehghani et al. 2023, arXiv:2307.06304: packed sequences of any aspect ratio, masked attention and
pooling); `FlexiViT` (Beyer et al. 2023, arXiv:2212.08013: one model for every patch size by
resampling the patch-embedding kernel). The contract is timm's ``timm.models.naflexvit`` and
``timm.data.create_naflex_loader``.

Layout follows timm's model files: model class, checkpoint filter, cfgs, entrypoints; the layers live in
`tkvision.layers`.
"""
import contextlib
import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, naflexvit, register_model
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from ..layers import Block, FlexPatchPattention
from ._helpers import check_arguments, check_positive
from .tokenformer_vit import TokenCounts, block_token_counts, create_tokenformer
from .tokenformer_vit import checkpoint_filter_fn as fixed_grid_filter

__all__ = ['NaFlexTokenFormer', 'checkpoint_filter_fn']

#: NaFlexVitCfg values of a TokenFormer: no biases (Pattentions have none), a class token pooled as in
#: the fixed-grid family, no init rescaling of Linear projections that do not exist here, the position grid of
#: the default 224 px at 16 px patches (NaFlexViT's default is 256 px).
TOKENFORMER_CFG: Dict[str, Any] = dict(
    qkv_bias=False, proj_bias=False, class_token=True, global_pool='token', fix_init=False, embed_proj_type='linear',
    pos_embed='learned', pos_embed_grid_size=(14, 14))

#: NaFlexVitCfg fields a TokenFormer cannot honour (they configure Linear / MLP / EVA layers), with the
#: value it runs with: anything else is refused rather than silently ignored.
UNSUPPORTED = dict(mlp_ratio=4.0, qkv_bias=False, proj_bias=False, attn_type='standard', rope_type='',
                   swiglu_mlp=False, attn_gated=False, num_kv_heads=None, attn_only_layer_scale=False,
                   embed_proj_type='linear', input_norm_layer=None, embed_norm_layer=None, norm_layer=None,
                   act_layer=None, block_fn=None, mlp_layer=None, attn_layer=None, scale_mlp_norm=False,
                   scale_attn_inner_norm=False, fix_init=False, enable_patch_interpolator=False,
                   patchify_channels_last=True, pre_norm=False)


class NaFlexTokenFormer(NaFlexVit):
    """TokenFormer ViT in timm's NaFlex contract (any resolution, aspect ratio and square patch size).

    Args:
        cfg: a ``NaFlexVitCfg`` (default: `TOKENFORMER_CFG` over NaFlexViT's defaults); keyword
            arguments that name its fields (``patch_size``, ``embed_dim``, ``depth``, ``num_heads``,
            ``global_pool``, ``reg_tokens``, ``pos_embed``, ``pos_embed_grid_size``, ``qk_norm``,
            ``init_values``, ``drop_path_rate``, ...) override it.
        in_chans: input channels (as timm).
        num_classes: classifier outputs (as timm).
        img_size: the default image size (an int, or height and width); sets the learned position grid
            (``img_size / patch_size``) unless ``pos_embed_grid_size`` is given.
        num_tokens: shorthand as in [`TokenFormerViT`][tkvision.models.tokenformer_vit.TokenFormerViT]: patch
            embedding, Q/K/V and output projection ``num_tokens`` parameter tokens, the FFN ``4 * num_tokens``;
            ``num_tokens_patch`` / ``_qkv`` / ``_proj`` / ``_ffn`` override each (the block kinds take one count or
            one per block, as the fixed-grid family).
        score_norm: every Pattention's Θ, as the fixed-grid family's.
        key_std: initial std of the blocks' key parameter tokens, as the fixed-grid family's.
        value_std: initial std of the blocks' value parameter tokens, as the fixed-grid family's.
        block_norm_weight: a learnable LayerNorm weight in the blocks, as the fixed-grid family's.
        block_norm_bias: a learnable LayerNorm bias in the blocks, as the fixed-grid family's.
        block_norm_fold: fold the blocks' LayerNorms into the keys where exact, as the fixed-grid family's.

    Shapes: ``forward(dict(patches [B, N, p*p*C], patch_coord [B, N, 2], patch_valid [B, N]))`` or
    ``forward([B, C, H, W])`` -> ``[B, num_classes]``; ``forward_features`` returns NaFlexVit's
    (``{'patches', 'patch_valid'}`` in NaFlex mode, ``[B, num_prefix_tokens + N, embed_dim]`` otherwise).

    Raises:
        ValueError: a NaFlexVit option that configures layers a TokenFormer does not have (``mlp_ratio``,
            biases, RoPE / EVA attention, SwiGLU, ``global_pool='map'``, ...), named.
        TypeError: an unknown keyword (timm's message).
    """

    def __init__(
            self,
            cfg: Optional[NaFlexVitCfg] = None,
            in_chans: int = 3,
            num_classes: int = 1000,
            img_size: Optional[Union[int, Tuple[int, int]]] = None,
            num_tokens: int = 768,
            num_tokens_patch: Optional[int] = None,
            num_tokens_qkv: TokenCounts = None,
            num_tokens_proj: TokenCounts = None,
            num_tokens_ffn: TokenCounts = None,
            score_norm: str = 'l2_norm_gelu',
            key_std: float = 0.02,
            value_std: Optional[float] = None,
            block_norm_weight: bool = False,
            block_norm_bias: bool = False,
            block_norm_fold: bool = True,
            device: Optional[Union[str, torch.device]] = None,
            dtype: Optional[torch.dtype] = None,
            **kwargs: Any,
    ):
        check_arguments(NaFlexTokenFormer.__init__, locals())
        check_positive(key_std=key_std, value_std=value_std)
        if img_size is not None and 'pos_embed_grid_size' not in kwargs:
            kwargs['pos_embed_grid_size'] = None  # NaFlexVit then derives the grid from img_size
        cfg = dataclasses.replace(cfg or NaFlexVitCfg(**TOKENFORMER_CFG), **kwargs)
        _check_supported(cfg)
        blocks = block_token_counts(cfg.depth, num_tokens, num_tokens_qkv, num_tokens_proj, num_tokens_ffn)
        self.num_tokens_patch = num_tokens_patch or num_tokens
        for name in ('num_tokens_qkv', 'num_tokens_proj', 'num_tokens_ffn'):
            counts = [b[name] for b in blocks]
            setattr(self, name, counts[0] if len(set(counts)) == 1 else counts)
        shared = dict(
            score_norm=score_norm,
            value_std=2 / (cfg.depth * math.sqrt(cfg.embed_dim)) if value_std is None else value_std,
            key_std=key_std,
            norm_weight=block_norm_weight,
            norm_bias=block_norm_bias,
            norm_fold=block_norm_fold,
        )
        # our layers take no device argument: build them under the device, as timm's factory does
        with torch.device(device) if device is not None else contextlib.nullcontext():
            super().__init__(dataclasses.replace(cfg, block_fn=_block_builder(shared, blocks)), in_chans=in_chans,
                             num_classes=num_classes, img_size=img_size, device=device, dtype=dtype)
            patch = self.embeds.patch_size
            if patch[0] != patch[1]:
                raise ValueError(f'patch_size {patch}: the NaFlex TokenFormer takes square patches')
            # timm types the stem's proj as a Linear; ours scores patches against key tokens in its place
            self.embeds.proj = FlexPatchPattention(  # type: ignore[assignment]
                in_chans, patch[0], cfg.embed_dim, self.num_tokens_patch, score_norm, dtype=dtype)
            self.in_chans = in_chans

    def forward(
            self,
            x: Union[torch.Tensor, Dict[str, torch.Tensor]],
            patch_coord: Optional[torch.Tensor] = None,
            patch_valid: Optional[torch.Tensor] = None,
            attn_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """NaFlexVit's forward, after
        [`check_inputs`][tkvision.models.naflex_tokenformer.NaFlexTokenFormer.check_inputs] (a bad input is one error
        naming what is wrong)."""
        if not is_fx_symbolic_tracing():
            self.check_inputs(x, patch_coord, patch_valid)
        return super().forward(x, patch_coord, patch_valid, attn_mask)

    @torch.jit.ignore
    def check_inputs(
            self,
            x: torch.Tensor,
            patch_coord: Optional[torch.Tensor] = None,
            patch_valid: Optional[torch.Tensor] = None,
    ) -> None:
        """Refuse an input NaFlexVit would fail on cryptically, or accept wrongly.

        Raises:
            ValueError: a patch dictionary without ``patches``, or whose tensors disagree in shape (a
                ``patch_coord`` shorter than ``patches`` included, which timm's NaFlexViT accepts), an empty
                sequence, patches without their coordinates, or an image whose size is not a multiple of the
                patch size, or of other channels; each named with the shapes and what is expected.
            TypeError: neither a tensor nor a dictionary (a list of images, say).
        """
        if not isinstance(x, (dict, torch.Tensor)):
            raise TypeError(f'the NaFlex TokenFormer takes images [batch, channels, height, width] or the NaFlex '
                            f"loader's dictionary (patches, patch_coord, patch_valid), not a {type(x).__name__}: "
                            'stack a list of images with torch.stack, or batch patches with timm\'s NaFlexCollator')
        if isinstance(x, dict):
            if 'patches' not in x:
                raise ValueError(f"a NaFlex input dictionary needs 'patches' (keys given: {', '.join(x) or 'none'})")
            patches, patch_coord, patch_valid = x['patches'], x.get('patch_coord', patch_coord), x.get('patch_valid',
                                                                                                      patch_valid)
        elif x.dim() == 4:
            _check_image(x, self.embeds.patch_size[0], self.in_chans, self.embeds.dynamic_img_pad)
            return
        else:
            patches = x
        if patches.dim() not in (3, 5):
            raise ValueError(f'patches must be [batch, sequence, p*p*channels] or [batch, sequence, p, p, channels], '
                             f'got shape {tuple(patches.shape)}; an image is [batch, channels, height, width]')
        if patches.shape[1] == 0:
            raise ValueError('patches hold an empty sequence (0 patches an image): give at least one patch')
        if patch_coord is None:
            raise ValueError("patches without 'patch_coord' [batch, sequence, 2]: pass the NaFlex loader's dictionary "
                             '(patches, patch_coord, patch_valid), or images [batch, channels, height, width]')
        expected = dict(patch_coord=(*patches.shape[:2], 2), patch_valid=tuple(patches.shape[:2]))
        for name, tensor in (('patch_coord', patch_coord), ('patch_valid', patch_valid)):
            if tensor is not None and tuple(tensor.shape) != expected[name]:
                raise ValueError(f'{name} has shape {tuple(tensor.shape)}; patches {tuple(patches.shape)} need '
                                 f'{name} of shape {expected[name]} (one entry per patch)')

    @torch.jit.ignore
    def checkpoint_filter(self, state_dict: dict) -> dict:
        """``state_dict`` adapted by `checkpoint_filter_fn` (what `tkvision.models.adapt_state_dict`,
        and so the trainer's ``init_from`` and ``tools/validate.py``, apply to any model with this method)."""
        return checkpoint_filter_fn(state_dict, self)


def _check_image(x: torch.Tensor, patch: int, channels: int, padded: bool):
    """An image batch ``[B, C, H, W]`` the stem can cut: ``channels`` channels, sides a multiple of ``patch``
    (unless ``padded``: ``dynamic_img_pad`` pads them)."""
    _, c, h, w = x.shape
    if c != channels:
        raise ValueError(f'the images have {c} channels; the model takes {channels} (in_chans)')
    if (h % patch or w % patch) and not padded:
        fit = ' x '.join(str(max(patch, s // patch * patch)) for s in (h, w))
        raise ValueError(f'a {h} x {w} image is not a multiple of the patch size {patch}: resize or crop it (to {fit}, '
                         'say), or give the NaFlex loader\'s patch dictionaries, which take any size')


def _check_supported(cfg: NaFlexVitCfg):
    """Raise ValueError naming the first NaFlexVit option a TokenFormer would have to ignore."""
    for name, value in UNSUPPORTED.items():
        if getattr(cfg, name) != value:
            raise ValueError(f'{name}={getattr(cfg, name)!r}: a NaFlex TokenFormer has no Linear / MLP / EVA layers '
                             f'that this option configures (it runs with {name}={value!r})')
    if cfg.global_pool == 'map':
        raise ValueError("global_pool='map': the attention pool is a Linear / MLP head; use 'token' or 'avg'")


def _block_builder(shared: dict, tokens: List[Dict[str, int]]):
    """A ``block_fn`` for NaFlexVit, which builds its blocks in order: the i-th call builds a TokenFormer
    [`Block`][tkvision.layers.block.Block] from the arguments NaFlexVit passes (the ones a TokenFormer has: heads,
    qk_norm, LayerScale, dropouts, drop path), ``shared`` (normalisation, init, norms) and ``tokens[i]``
    (the block's token counts)."""
    counts = iter(tokens)

    def build(dim, num_heads, qk_norm=False, init_values=None, proj_drop=0., attn_drop=0., drop_path=0.,
              **linear_layers):  # mlp_ratio, biases, norm / act / mlp layers: refused in _check_supported
        mine = next(counts)
        return Block(dim, num_heads, qk_norm=qk_norm, init_values=init_values, proj_drop=proj_drop,
                     attn_drop=attn_drop, drop_path=drop_path, **shared, num_tokens_qkv=mine['num_tokens_qkv'],
                     num_tokens_proj=mine['num_tokens_proj'], num_tokens_ffn=mine['num_tokens_ffn'])
    return build


def checkpoint_filter_fn(state_dict: dict, model: NaFlexTokenFormer) -> dict:
    """Adapt a checkpoint to ``model`` (timm's ``pretrained_filter_fn``): the fixed-grid family's layout
    (``patch_embed.proj.weight [n, C, p, p]``, ``pos_embed [1, prefix + N, d]``, ``cls_token``) becomes
    this one's by timm's own NaFlexViT filter (key tokens flattened channels-last, the class token's
    position embedding folded into the class token, the grid as ``[1, h, w, d]``); EMA / ``module.``
    wrappers are unwrapped first. A NaFlex checkpoint passes through. The input is not modified.
    """
    state_dict = dict(fixed_grid_filter(state_dict, None))
    if 'pos_embed' in state_dict or any(k.startswith('patch_embed.') for k in state_dict):
        for key in ('cls_token', 'reg_token'):  # timm's filter adds to them in place
            if key in state_dict:
                state_dict[key] = state_dict[key].clone()
        state_dict = naflexvit.checkpoint_filter_fn(state_dict, model)
    return state_dict


def _cfg(url='', **kwargs):
    return {
        'url': url, 'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None, 'crop_pct': 0.875,
        'interpolation': 'bicubic', 'fixed_input_size': False, 'mean': IMAGENET_DEFAULT_MEAN,
        'std': IMAGENET_DEFAULT_STD, 'first_conv': 'embeds.proj', 'classifier': 'head', 'license': 'apache-2.0',
        'paper_ids': 'arXiv:2410.23168', 'paper_name': 'TokenFormer', **kwargs,
    }


# No weights are published: pretrained=True needs a local file (a fixed-grid family's loads too).
default_cfgs = generate_default_cfgs({
    'naflexvit_tokenformer_ti16.untrained': _cfg(),
    'naflexvit_tokenformer_b16.untrained': _cfg(),
    'naflexvit_tokenformer_b16_matched.untrained': _cfg(),
})


@register_model
def naflexvit_tokenformer_ti16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """NaFlex TokenFormer-Ti/16: d 192, 12 blocks, 3 heads, 192 / 768 tokens (tokenformer_vit_ti16's)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, num_tokens=192)
    return create_tokenformer(NaFlexTokenFormer, 'naflexvit_tokenformer_ti16', pretrained, checkpoint_filter_fn,
                              **dict(args, **kwargs))


@register_model
def naflexvit_tokenformer_b16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """NaFlex TokenFormer-B/16: d 768, 12 blocks, 12 heads, 768 / 3072 tokens (tokenformer_vit_b16's)."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=768)
    return create_tokenformer(NaFlexTokenFormer, 'naflexvit_tokenformer_b16', pretrained, checkpoint_filter_fn,
                              **dict(args, **kwargs))


@register_model
def naflexvit_tokenformer_b16_matched(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """NaFlex TokenFormer-B/16†: ViT-B/16's parameter count, 576 / 2304 tokens (tokenformer_vit_b16_matched's)."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=576)
    return create_tokenformer(NaFlexTokenFormer, 'naflexvit_tokenformer_b16_matched', pretrained,
                              checkpoint_filter_fn, **dict(args, **kwargs))
