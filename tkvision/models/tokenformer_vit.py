"""TokenFormer Vision Transformer.

A ViT whose every linear projection (patch embedding, Q/K/V, attention output, FFN) is a
:class:`~tkvision.layers.Pattention` over learnable key/value parameter tokens.

Paper: `TokenFormer: Rethinking Transformer Scaling with Tokenized Model Parameters`
    - https://arxiv.org/abs/2410.23168 (Wang et al. 2024); block: Eq. 6-11 and Fig. 2;
      ImageNet-1K: Table 2; ablations: Tables 4-5.

Differences from the paper, all documented in the README ("Model family"):
    - The stem is a Pattention over flattened 16x16 patches (the paper does not say whether the
      stem is a conv or a Pattention; ``shared/reference/README.md``, "Vision model").
    - Token counts follow the paper's scheme (n_ffn = 4 n_qkv); the B/16 count is 115.35M where the
      paper reports 109M, which no simple token choice reproduces.

Layout follows timm's model files: model class, checkpoint filter, cfgs, entrypoints; the layers
(:class:`~tkvision.layers.PatchEmbed`, :class:`~tkvision.layers.Block`) live in :mod:`tkvision.layers`,
where the recurrent families and the MAE decoder reuse them.
"""
import contextlib
import math
import os
from typing import List, Optional, Tuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._manipulate import adapt_input_conv, checkpoint_seq
from timm.models._builder import resolve_pretrained_cfg

from ..layers import Block, PatchEmbed, Pattention
from ._helpers import file_shapes
from ._vit_contract import ViTContract

__all__ = ['TokenFormerViT', 'checkpoint_filter_fn']


class TokenFormerViT(ViTContract, nn.Module):
    """TokenFormer Vision Transformer (paper Fig. 2, Table 2), timm-compatible.

    Args:
        img_size: input size in pixels (int or (H, W)).
        patch_size: patch size p in pixels.
        in_chans: input channels.
        num_classes: classifier outputs (0: no head, ``forward`` returns pooled features).
        global_pool: ``'token'`` (class token), ``'avg'`` (mean of patch tokens) or ``''``.
        embed_dim: token width d.
        depth: number of blocks.
        num_heads: attention heads (head_dim = d / num_heads).
        num_tokens: shorthand: Q/K/V, output projection and patch embedding use ``num_tokens``
            parameter tokens, the FFN ``4 * num_tokens``; the ``num_tokens_*`` kwargs override.
        num_tokens_patch / num_tokens_qkv / num_tokens_proj / num_tokens_ffn: per-kind token counts.
        score_norm: Pattention normalisation (see :mod:`tkvision.layers.pattention`).
        key_std: initial std of the blocks' key parameter tokens (the public code's 0.02). Eq. 5's
            scores are invariant to the keys' scale, so it sets how far an optimizer step turns them:
            AdamW moves a key by about ``lr`` whatever its size (a lever of docs/comparison.md).
        value_std: initial std of the blocks' value parameter tokens; None (default): the public code's
            2 / (depth √embed_dim). Unlike the keys' it sets the outputs' scale (a lever of docs/comparison.md).
        tau_scale: every Pattention's τ (Eq. 5), the patch embedding's included, is ``tau_scale`` times
            its default (√n of its own n): above 1 the GELU sees larger normalised scores (more
            nonlinear), below 1 smaller (closer to linear). A lever of docs/comparison.md.
        learn_tau: make every Pattention's τ a learned scalar started at that value
            (:meth:`~tkvision.layers.Pattention.make_tau_learnable`; same checkpoint keys, so a fixed-τ
            checkpoint loads). Such layers train through plain autograd, not the closed-form backward.
        block_norm_weight / block_norm_bias: learnable LayerNorm weight / bias in blocks (Table 5).
        fc_norm: LayerNorm after pooling instead of before (default: True for ``'avg'``, as in
            timm and MAE fine-tuning).
        class_token: prepend a learned class token (``False`` needs ``global_pool='avg'`` or ``''``).
        reg_tokens: learned register tokens after the class token (Darcet et al. 2023), excluded
            from pooling.
        no_embed_class: the position embedding covers the patches only, not the class / register
            tokens (timm's ``no_embed_class``).
        pos_embed: ``'learn'`` (learned, timm's init), ``'sincos'`` (fixed 2-D sin-cos over the patch
            grid, as MAE: a buffer saved as ``pos_embed``, zeros for prefix tokens) or ``'none'``.
        qk_norm: LayerNorm of q and k per head (timm's ``qk_norm``).
        init_values: LayerScale init of both block branches (timm's ``init_values``); None: off.
        fused_qkv: one GEMM for the Q/K/V scores (:meth:`Attention.qkv_fused`); same parameters and
            checkpoints. Off by default: on CUDA the three separate Pattentions take the lean backward.
        dynamic_img_size: accept any input size divisible by p, resampling the position embedding.
        drop_rate / pos_drop_rate / proj_drop_rate / attn_drop_rate / drop_path_rate: dropouts and
            stochastic depth (linearly increasing over depth).

    Shapes: ``forward_features``: ``[B, C, H, W] -> [B, num_prefix_tokens + N, embed_dim]``
    (``num_prefix_tokens`` = class token + registers); ``forward_head``: that ``-> [B, num_classes]``.

    Initialisation (tested in ``tests/test_models.py``): in blocks, key tokens N(0, key_std²) and value
    tokens N(0, value_std²), by default 0.02 and 2 / (depth √d), both the public TokenFormer code's; patch-embedding key and value
    tokens N(0, 0.02²); position embedding trunc-normal 0.02 and class token N(0, 1e-6²) and head
    weight trunc-normal 0.02, bias 0 (timm's ViT).
    """

    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, global_pool='token',
                 embed_dim=768, depth=12, num_heads=12, num_tokens=768, num_tokens_patch=None,
                 num_tokens_qkv=None, num_tokens_proj=None, num_tokens_ffn=None, score_norm='l2_norm_gelu',
                 key_std=0.02, value_std=None, tau_scale=1.0, learn_tau=False, block_norm_weight=False, block_norm_bias=False,
                 fc_norm=None, class_token=True, reg_tokens=0, no_embed_class=False, pos_embed='learn',
                 qk_norm=False, init_values=None, fused_qkv=False, dynamic_img_size=False, drop_rate=0.,
                 pos_drop_rate=0., proj_drop_rate=0., attn_drop_rate=0., drop_path_rate=0.):
        super().__init__()
        if global_pool not in ('', 'avg', 'token'):
            raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if depth < 1:
            raise ValueError(f'depth must be >= 1, got {depth}')
        if global_pool == 'token' and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if not tau_scale > 0:
            raise ValueError(f'tau_scale must be > 0 (a multiple of the default τ = √n), got {tau_scale!r}')
        self.num_classes, self.global_pool, self.in_chans = num_classes, global_pool, in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        if pos_embed not in ('learn', 'sincos', 'none'):
            raise ValueError(f"pos_embed must be 'learn', 'sincos' or 'none', got {pos_embed!r}")
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = (1 if class_token else 0) + reg_tokens
        self.has_class_token, self.dynamic_img_size = class_token, dynamic_img_size
        self.no_embed_class, self.pos_embed_type = no_embed_class, pos_embed
        self.num_tokens_patch = num_tokens_patch or num_tokens
        self.num_tokens_qkv = num_tokens_qkv or num_tokens
        self.num_tokens_proj = num_tokens_proj or num_tokens
        self.num_tokens_ffn = num_tokens_ffn or 4 * num_tokens
        self.grad_checkpointing = False

        self.patch_embed = self._build_patch_embed(img_size, patch_size, in_chans, embed_dim, score_norm,
                                                   strict_img_size=not dynamic_img_size)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        embed_len = num_patches if no_embed_class else num_patches + self.num_prefix_tokens
        if pos_embed == 'learn':
            self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, embed_dim))
        elif pos_embed == 'sincos':  # a fixed table: a buffer (saved under the same key), not a gradient-less parameter
            self.register_buffer('pos_embed', torch.zeros(1, embed_len, embed_dim))
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(pos_drop_rate)
        dpr = torch.linspace(0, drop_path_rate, depth, device='cpu').tolist()
        value_std = 2 / (depth * math.sqrt(embed_dim)) if value_std is None else value_std
        self.blocks = self._build_blocks(depth, dpr, dict(
            dim=embed_dim, num_heads=num_heads, num_tokens_qkv=self.num_tokens_qkv, num_tokens_proj=self.num_tokens_proj,
            num_tokens_ffn=self.num_tokens_ffn, score_norm=score_norm, value_std=value_std, key_std=key_std,
            norm_weight=block_norm_weight, norm_bias=block_norm_bias, qk_norm=qk_norm, init_values=init_values, proj_drop=proj_drop_rate,
            attn_drop=attn_drop_rate, fused_qkv=fused_qkv))
        self.feature_info = [dict(module=f'blocks.{i}', num_chs=embed_dim, reduction=patch_size)
                             for i in range(depth)]
        use_fc_norm = global_pool == 'avg' if fc_norm is None else fc_norm
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if not use_fc_norm else nn.Identity()
        self.fc_norm = nn.LayerNorm(embed_dim, eps=1e-6) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()
        self._set_tau(tau_scale, learn_tau)

    def _set_tau(self, tau_scale: float, learn_tau: bool):
        """Scale every Pattention's τ by ``tau_scale`` and make it learned with ``learn_tau`` (class docstring)."""
        for module in self.modules():
            if isinstance(module, Pattention):
                with torch.no_grad():
                    module.tau.mul_(tau_scale)
                if learn_tau:
                    module.make_tau_learnable()

    def _build_patch_embed(self, img_size, patch_size, in_chans, embed_dim, score_norm, strict_img_size):
        """The stem (a subclass may build another): a Pattention patch embedding."""
        return PatchEmbed(img_size, patch_size, in_chans, embed_dim, self.num_tokens_patch, score_norm,
                          strict_img_size=strict_img_size)

    def _build_blocks(self, depth: int, dpr: List[float], block_kwargs: dict) -> nn.Module:
        """``depth`` TokenFormer blocks (a subclass may build another trunk, e.g. the recurrent
        families of :mod:`tkvision.models.ringformer`); ``dpr``: drop-path rate per block."""
        return nn.Sequential(*[Block(**block_kwargs, drop_path=dpr[i]) for i in range(depth)])

    def init_weights(self):
        """timm ViT init for the non-Pattention parameters (Pattentions init themselves); the fixed
        sin-cos position embedding of ``pos_embed='sincos'`` (timm's ``build_sincos2d_pos_embed``)."""
        if self.pos_embed is not None and self.pos_embed_type == 'learn':
            trunc_normal_(self.pos_embed, std=.02)
        elif self.pos_embed is not None:
            with torch.no_grad():
                self.pos_embed.copy_(self.sincos_table())
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=.02)
            nn.init.zeros_(self.head.bias)

    @torch.jit.ignore
    def no_weight_decay(self):
        """Parameter names that get no weight decay (timm convention); 1-d params are excluded too. A
        fixed sin-cos position table is a buffer, not a parameter, and is not listed."""
        return {n for n in ('pos_embed', 'cls_token', 'reg_token') if isinstance(getattr(self, n), nn.Parameter)}

    @torch.jit.ignore
    def group_matcher(self, coarse=False):
        """Parameter groups for timm's layer-wise lr decay: stem, one group per block, then final norm."""
        return dict(stem=r'^cls_token|^reg_token|^pos_embed|^patch_embed',
                    blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable=True):
        """Recompute block activations in backward (same outputs, less memory)."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The classifier head (``nn.Identity`` when ``num_classes=0``), timm's contract."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """Replace the head with a fresh ``Linear(embed_dim, num_classes)`` (Identity for 0), on the
        device and in the dtype and train / eval mode of the model; ``global_pool`` None keeps the pooling."""
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ('', 'avg', 'token') or (global_pool == 'token' and not self.has_class_token):
                raise ValueError(f'unsupported global_pool {global_pool!r}')
            self.global_pool = global_pool
        ref = self.patch_embed.proj.weight
        self.head = (nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype).train(self.training)
                     if num_classes > 0 else nn.Identity())

    def _pos_embed(self, x, grid_size: Tuple[int, int]):
        """Add the position embedding and prepend the class / register tokens (before or after the
        addition, as ``no_embed_class`` says, like timm's ViT)."""
        pos_embed = self.pos_embed
        if pos_embed is not None and self.dynamic_img_size:
            pos_embed = resample_abs_pos_embed(pos_embed, new_size=grid_size, old_size=self.patch_embed.grid_size,
                                               num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens)
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        if self.no_embed_class:
            if pos_embed is not None:
                x = x + pos_embed
            if len(prefix) > 0:
                x = torch.cat(prefix + [x], dim=1)
        else:
            if len(prefix) > 0:
                x = torch.cat(prefix + [x], dim=1)
            if pos_embed is not None:
                x = x + pos_embed
        return self.pos_drop(x)

    @torch.jit.unused
    def _run_block(self, blk, x, attn_mask: Optional[torch.Tensor] = None):
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint(blk, x, attn_mask, use_reentrant=False)
        return blk(x, attn_mask)

    def forward_features(self, x, attn_mask: Optional[torch.Tensor] = None):
        """``[B, in_chans, H, W] -> [B, num_prefix_tokens + N, embed_dim]`` (after the final norm);
        ``attn_mask`` as timm's ViT takes it (``F.scaled_dot_product_attention``'s, over all tokens)."""
        grid = self.patch_embed.dynamic_feat_size(x.shape[-2:])
        x = self._pos_embed(self.patch_embed(x), grid)
        return self.norm(self.forward_blocks(x, attn_mask))

    def forward_blocks(self, x, attn_mask: Optional[torch.Tensor] = None):
        """The trunk, ``[B, N', C] -> [B, N', C]`` (gradient checkpointing per block when enabled): what
        a family overrides to change the trunk, and what :class:`~tkvision.models.mae.MaskedAutoencoder`
        runs on the visible tokens."""
        if attn_mask is not None:  # nn.Sequential passes one argument: run the blocks one by one
            for blk in self.blocks:
                if self.grad_checkpointing and not torch.jit.is_scripting():
                    x = checkpoint(blk, x, attn_mask, use_reentrant=False)
                else:
                    x = blk(x, attn_mask)
            return x
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)

    def forward_head(self, x, pre_logits: bool = False):
        """Pool, fc_norm, dropout, classifier: ``[B, N', C] -> [B, num_classes]`` (``[B, C]`` if
        ``pre_logits``)."""
        if self.global_pool == 'avg':
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        elif self.global_pool == 'token':
            x = x[:, 0]
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x, attn_mask: Optional[torch.Tensor] = None):
        """Images ``[B, in_chans, H, W]`` -> logits ``[B, num_classes]`` (features ``[B, embed_dim]`` when
        ``num_classes=0``); ``attn_mask`` as in :meth:`forward_features`."""
        return self.forward_head(self.forward_features(x, attn_mask))

    @torch.jit.ignore
    def checkpoint_filter(self, state_dict: dict) -> dict:
        """``state_dict`` adapted to this model by the family's :func:`checkpoint_filter_fn` and
        :func:`adapt_input_channels` (what :func:`tkvision.models.adapt_state_dict` applies to any model
        that has this method)."""
        return adapt_input_channels(checkpoint_filter_fn(state_dict, self), self)


def checkpoint_filter_fn(state_dict, model: TokenFormerViT):
    """Adapt a TokenFormer ViT checkpoint to ``model`` (timm's ``pretrained_filter_fn``).

    Unwraps ``{'state_dict_ema' | 'model_ema' | 'state_dict' | 'model': ...}`` (EMA first, as
    timm), reads the first release's layout (patch-embedding key tokens as
    ``patch_embed.proj.key_param_tokens [n, C*p*p]``, now the filter bank ``patch_embed.proj.weight
    [n, C, p, p]``), resamples ``pos_embed`` to the model's patch grid (timm's
    ``resample_abs_pos_embed``). Other input channels are timm's loader's to adapt (``first_conv``),
    or :func:`adapt_input_channels`'s on our own path.
    Everything else passes through; shape mismatches are reported by
    :func:`tkvision.models.check_fit` / ``load_state_dict``.
    """
    for key in ('state_dict_ema', 'model_ema', 'state_dict', 'model'):
        if isinstance(state_dict.get(key), dict):
            state_dict = state_dict[key]
            break
    state_dict = {k.removeprefix('module.'): v for k, v in state_dict.items()}
    if model is None:
        return state_dict
    pos = state_dict.get('pos_embed')
    if pos is not None and model.pos_embed is not None and pos.shape != model.pos_embed.shape:
        state_dict['pos_embed'] = resample_abs_pos_embed(
            pos, new_size=model.patch_embed.grid_size,
            num_prefix_tokens=0 if model.no_embed_class else model.num_prefix_tokens)
    p = model.patch_embed.patch_size[0]
    legacy = state_dict.pop('patch_embed.proj.key_param_tokens', None)
    if legacy is not None:
        state_dict['patch_embed.proj.weight'] = legacy.reshape(legacy.shape[0], -1, p, p)
    return state_dict


def adapt_input_channels(state_dict: dict, model: TokenFormerViT) -> dict:
    """The stem's filter bank (``first_conv`` + ``.weight``) adapted to ``model.in_chans`` with timm's
    ``adapt_input_conv`` (timm's pretrained path does this itself after the filter)."""
    weight = state_dict.get('patch_embed.proj.weight')
    if weight is not None and weight.shape[1] != model.in_chans:
        state_dict['patch_embed.proj.weight'] = adapt_input_conv(model.in_chans, weight)
    return state_dict


def _create_tokenformer_vit(variant, pretrained=False, model_cls=None, device=None, dtype=None, **kwargs):
    """``build_model_with_cfg`` of ``model_cls`` (default :class:`TokenFormerViT`; the recurrent families
    pass theirs) with our checkpoint filter, a clear error when no weights file is given, and a local
    file's own head size. ``device`` / ``dtype``: timm's factory arguments (``create_model(...,
    device='meta', dtype=torch.bfloat16)``): the model is built under ``torch.device(device)``, so its
    tensors are created there (no CPU copy of a large model first), then cast to ``dtype``."""
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = _build(variant, pretrained, model_cls, **kwargs)
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    return model


def _build(variant, pretrained, model_cls, **kwargs):
    if pretrained:
        cfg = resolve_pretrained_cfg(variant, pretrained_cfg=kwargs.get('pretrained_cfg'),
                                     pretrained_cfg_overlay=kwargs.get('pretrained_cfg_overlay'))
        if not (cfg.file or cfg.url or cfg.hf_hub_id or cfg.state_dict):
            raise RuntimeError(
                f'No pretrained weights are published for {variant}. Train one (tools/train.py) and load it '
                f"with pretrained=True, pretrained_cfg_overlay=dict(file='path/to/model.safetensors').")
        overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
        if cfg.file and os.path.isfile(cfg.file):
            # timm drops the head when the cfg's num_classes (1000) differs from the model's, and adapts
            # (or warns about) the stem by the cfg's input channels: a local file says both itself.
            shapes = file_shapes(cfg.file, ('head.weight', 'patch_embed.proj.weight'))
            if 'num_classes' not in overlay:  # (local-dir: config.json says)
                overlay['num_classes'] = shapes.get('head.weight', (0,))[0]
            if 'patch_embed.proj.weight' in shapes:
                overlay['input_size'] = (shapes['patch_embed.proj.weight'][1], *cfg.input_size[1:])
            kwargs['pretrained_cfg_overlay'] = overlay
    out_indices = kwargs.pop('out_indices', 3)
    return build_model_with_cfg(
        model_cls or TokenFormerViT, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'), **kwargs)


def _cfg(url='', **kwargs):
    return {
        'url': url, 'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': 'patch_embed.proj', 'classifier': 'head', 'license': 'apache-2.0',
        'paper_ids': 'arXiv:2410.23168', 'paper_name': 'TokenFormer', **kwargs,
    }


# No weights are published: every cfg has an empty url (pretrained=True needs a local file).
default_cfgs = generate_default_cfgs({
    'tokenformer_vit_ti16.untrained': _cfg(),
    'tokenformer_vit_s16.untrained': _cfg(),
    'tokenformer_vit_b16.untrained': _cfg(),
    'tokenformer_vit_b16_matched.untrained': _cfg(),
    'tokenformer_vit_l16.untrained': _cfg(),
    'tokenformer_vit_l16_matched.untrained': _cfg(),
})


@register_model
def tokenformer_vit_ti16(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-Ti/16: d 192, 12 blocks, 3 heads, 192 / 768 tokens (qkv, proj, patch / ffn)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, num_tokens=192)
    return _create_tokenformer_vit('tokenformer_vit_ti16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_s16(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-S/16: d 384, 12 blocks, 6 heads, 384 / 1536 tokens."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, num_tokens=384)
    return _create_tokenformer_vit('tokenformer_vit_s16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_b16(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-B/16 (Table 2, 'Ours 109M' row): d 768, 12 blocks, 12 heads, 768 / 3072 tokens."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=768)
    return _create_tokenformer_vit('tokenformer_vit_b16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_b16_matched(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-B/16† (Table 2, 86M): ViT-B/16's parameter count, 576 / 2304 tokens."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=576)
    return _create_tokenformer_vit('tokenformer_vit_b16_matched', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_l16(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-L/16 (Table 2, 407M): d 1024, 24 blocks, 16 heads, 1024 / 4096 tokens."""
    args = dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, num_tokens=1024)
    return _create_tokenformer_vit('tokenformer_vit_l16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_l16_matched(pretrained=False, **kwargs) -> TokenFormerViT:
    """TokenFormer-L/16† (Table 2, 307M): ViT-L/16's parameter count, 768 / 3072 tokens."""
    args = dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, num_tokens=768)
    return _create_tokenformer_vit('tokenformer_vit_l16_matched', pretrained, **dict(args, **kwargs))
