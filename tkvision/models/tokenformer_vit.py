"""TokenFormer Vision Transformer.

A ViT whose every linear projection (patch embedding, Q/K/V, attention output, FFN) is a
[`Pattention`][tkvision.layers.pattention.Pattention] over learnable key/value parameter tokens.

Paper: `TokenFormer: Rethinking Transformer Scaling with Tokenized Model Parameters`
    - https://arxiv.org/abs/2410.23168 (Wang et al. 2024); block: Eq. 6-11 and Fig. 2;
      ImageNet-1K: Table 2; ablations: Tables 4-5.

Choices where the paper is silent (``docs/background.md``):
    - The stem is a Pattention over flattened 16x16 patches (the paper does not say whether its
      stem is a conv or a Pattention).
    - Token counts follow the paper's scheme (n_ffn = 4 n_qkv); the B/16 count is 115.35M where the
      paper reports 109M, which no simple token choice reproduces.

Layout follows timm's model files: model class, checkpoint filter, builder, cfgs, entrypoints; the layers
([`PatchEmbed`][tkvision.layers.patch_embed.PatchEmbed], [`Block`][tkvision.layers.block.Block]) live in
`tkvision.layers`, where the recurrent families, the NaFlex family and the MAE decoder reuse them.
"""
import contextlib
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.layers import resample_abs_pos_embed, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg
from timm.models._manipulate import adapt_input_conv
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import Block, PatchEmbed, Pattention
from ._helpers import check_arguments, check_positive, file_shapes
from ._vit_contract import ViTContract

__all__ = ['TokenFormerViT', 'TokenCounts', 'block_token_counts', 'checkpoint_filter_fn', 'adapt_input_channels',
           'create_tokenformer', 'tokenformer_cfg']

#: A Pattention kind's token count: one for every block, or one per block (a Mix'n'Match sub-model of an
#: elastic model, [`tkvision.growth.elastic`][tkvision.growth.elastic]).
TokenCounts = Union[int, Sequence[int], None]
#: A model's trunk: a ``Sequential`` of blocks, or a recurrent family's ``ModuleList`` of levels.
Blocks = Union[nn.Sequential, nn.ModuleList]


def block_token_counts(
        depth: int,
        num_tokens: int,
        num_tokens_qkv: TokenCounts = None,
        num_tokens_proj: TokenCounts = None,
        num_tokens_ffn: TokenCounts = None,
) -> List[Dict[str, int]]:
    """Each block's ``dict(num_tokens_qkv, num_tokens_proj, num_tokens_ffn)``: a kind's own count (an int,
    or a list of ``depth`` ints, one per block), else ``num_tokens`` (``4 * num_tokens`` for the FFN, the
    paper's n_ffn = 4 n_qkv).

    Raises:
        ValueError: ``num_tokens`` < 1, a list whose length is not ``depth``, or a count < 1 (named).
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f'num_tokens must be a positive integer, got num_tokens={num_tokens!r}')
    defaults = dict(num_tokens_qkv=num_tokens, num_tokens_proj=num_tokens, num_tokens_ffn=4 * num_tokens)
    given = dict(num_tokens_qkv=num_tokens_qkv, num_tokens_proj=num_tokens_proj, num_tokens_ffn=num_tokens_ffn)
    per_block = {}
    for name, value in given.items():
        value = defaults[name] if value is None else value
        counts = [value] * depth if isinstance(value, int) else list(value)
        if len(counts) != depth:
            raise ValueError(f'{name} must be one count or one per block ({depth}), got {len(counts)}: {value!r}')
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
            raise ValueError(f'{name} must be a positive integer (or one per block), got {name}={value!r}')
        per_block[name] = counts
    return [{name: counts[i] for name, counts in per_block.items()} for i in range(depth)]


def _one_or_per_block(counts: List[int]) -> Union[int, List[int]]:
    """``counts[0]`` when every block has it, else the list (how the model states its ``num_tokens_*``)."""
    return counts[0] if len(set(counts)) == 1 else list(counts)


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
        num_tokens_patch: the patch embedding's tokens.
        num_tokens_qkv: tokens of each of Q, K, V: one count for every block or a list of one per block
            (`TokenCounts`; a Mix'n'Match sub-model exported by
            [`tkvision.growth.elastic.extract_prefix`][tkvision.growth.elastic.extract_prefix]).
        num_tokens_proj: tokens of the attention's output projection, one count or one per block.
        num_tokens_ffn: tokens of the FFN, one count or one per block.
        score_norm: Pattention normalisation (see `tkvision.layers.pattention`).
        key_std: initial std of the blocks' key parameter tokens (the public code's 0.02). Eq. 5's
            scores are invariant to the keys' scale, so it sets how far an optimizer step turns them:
            AdamW moves a key by about ``lr`` whatever its size (a lever of docs/comparison.md).
        value_std: initial std of the blocks' value parameter tokens; None (default): the public code's
            2 / (depth √embed_dim). Unlike the keys' it sets the outputs' scale (a lever of docs/comparison.md).
        tau_scale: every Pattention's τ (Eq. 5), the patch embedding's included, is ``tau_scale`` times
            its default (√n of its own n): above 1 the GELU sees larger normalised scores (more
            nonlinear), below 1 smaller (closer to linear). A lever of docs/comparison.md.
        learn_tau: make every Pattention's τ a learned scalar started at that value
            ([`make_tau_learnable`][tkvision.layers.pattention.Pattention.make_tau_learnable]; same checkpoint keys,
            so a fixed-τ checkpoint loads). Such layers train through plain autograd, not the closed-form backward.
        block_norm_weight: a learnable LayerNorm weight in the blocks (Table 5).
        block_norm_bias: a learnable LayerNorm bias in the blocks (needs ``block_norm_weight``).
        block_norm_fold: fold each block's LayerNorms into the keys of the Pattentions they feed where that
            is exact (a scale-invariant ``score_norm`` and no LayerNorm bias; ``tkvision.layers.Block``):
            the same function and gradients with two fewer passes over the activations per block. False:
            the explicit LayerNorms (the reference). Checkpoints load either way (same parameters).
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
        dynamic_img_size: accept any input size divisible by p, resampling the position embedding.
        drop_rate: dropout before the head.
        pos_drop_rate: dropout after adding the position embedding.
        proj_drop_rate: dropout of the attention's and the FFN's outputs.
        attn_drop_rate: dropout of the attention weights.
        drop_path_rate: stochastic depth, linearly increasing over depth to this rate.

    Shapes: ``forward_features``: ``[B, C, H, W] -> [B, num_prefix_tokens + N, embed_dim]``
    (``num_prefix_tokens`` = class token + registers); ``forward_head``: that ``-> [B, num_classes]``.

    Initialisation (tested in ``tests/test_models.py``): in blocks, key tokens N(0, key_std²) and value
    tokens N(0, value_std²), by default 0.02 and 2 / (depth √d), both the public TokenFormer code's; patch-embedding
    key and value
    tokens N(0, 0.02²); position embedding trunc-normal 0.02 and class token N(0, 1e-6²) and head
    weight trunc-normal 0.02, bias 0 (timm's ViT).
    """

    def __init__(
            self,
            img_size: Union[int, Tuple[int, int]] = 224,
            patch_size: int = 16,
            in_chans: int = 3,
            num_classes: int = 1000,
            global_pool: str = 'token',
            embed_dim: int = 768,
            depth: int = 12,
            num_heads: int = 12,
            num_tokens: int = 768,
            num_tokens_patch: Optional[int] = None,
            num_tokens_qkv: TokenCounts = None,
            num_tokens_proj: TokenCounts = None,
            num_tokens_ffn: TokenCounts = None,
            score_norm: str = 'l2_norm_gelu',
            key_std: float = 0.02,
            value_std: Optional[float] = None,
            tau_scale: float = 1.0,
            learn_tau: bool = False,
            block_norm_weight: bool = False,
            block_norm_bias: bool = False,
            block_norm_fold: bool = True,
            fc_norm: Optional[bool] = None,
            class_token: bool = True,
            reg_tokens: int = 0,
            no_embed_class: bool = False,
            pos_embed: str = 'learn',
            qk_norm: bool = False,
            init_values: Optional[float] = None,
            dynamic_img_size: bool = False,
            drop_rate: float = 0.,
            pos_drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            attn_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
    ):
        super().__init__()
        check_arguments(TokenFormerViT.__init__, locals())
        check_positive(embed_dim=embed_dim, num_heads=num_heads, patch_size=patch_size, key_std=key_std,
                       value_std=value_std)
        if global_pool not in ('', 'avg', 'token'):
            raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if depth < 1:
            raise ValueError(f'depth must be >= 1, got {depth}')
        if global_pool == 'token' and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if not tau_scale > 0:
            raise ValueError(f'tau_scale must be > 0 (a multiple of the default τ = √n), got {tau_scale!r}')
        if pos_embed not in ('learn', 'sincos', 'none'):
            raise ValueError(f"pos_embed must be 'learn', 'sincos' or 'none', got {pos_embed!r}")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = (1 if class_token else 0) + reg_tokens
        self.has_class_token = class_token
        self.dynamic_img_size = dynamic_img_size
        self.no_embed_class = no_embed_class
        self.pos_embed_type = pos_embed
        blocks = block_token_counts(depth, num_tokens, num_tokens_qkv, num_tokens_proj, num_tokens_ffn)
        self.num_tokens_patch = num_tokens_patch or num_tokens
        for name in ('num_tokens_qkv', 'num_tokens_proj', 'num_tokens_ffn'):
            setattr(self, name, _one_or_per_block([b[name] for b in blocks]))
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
        block_kwargs = dict(
            dim=embed_dim,
            num_heads=num_heads,
            score_norm=score_norm,
            value_std=2 / (depth * math.sqrt(embed_dim)) if value_std is None else value_std,
            key_std=key_std,
            norm_weight=block_norm_weight,
            norm_bias=block_norm_bias,
            norm_fold=block_norm_fold,
            qk_norm=qk_norm,
            init_values=init_values,
            proj_drop=proj_drop_rate,
            attn_drop=attn_drop_rate,
        )
        self.blocks = self._build_blocks(depth, dpr, block_kwargs, blocks)
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

    def _build_patch_embed(
            self,
            img_size: Union[int, Tuple[int, int]],
            patch_size: int,
            in_chans: int,
            embed_dim: int,
            score_norm: str,
            strict_img_size: bool,
    ) -> Union[PatchEmbed, TimmPatchEmbed]:
        """The stem (a subclass may build another, as timm's conv stem): a Pattention patch embedding."""
        return PatchEmbed(img_size, patch_size, in_chans, embed_dim, self.num_tokens_patch, score_norm,
                          strict_img_size=strict_img_size)

    def _build_blocks(self, depth: int, dpr: List[float], block_kwargs: dict, tokens: List[Dict[str,
                                                                                                int]]) -> Blocks:
        """``depth`` TokenFormer blocks (a subclass may build another trunk, e.g. the recurrent
        families of `tkvision.models.ringformer`); ``dpr``: drop-path rate per block; ``tokens``: each
        block's token counts (`block_token_counts`)."""
        return nn.Sequential(*[Block(**block_kwargs, num_tokens_qkv=t['num_tokens_qkv'],
                                     num_tokens_proj=t['num_tokens_proj'], num_tokens_ffn=t['num_tokens_ffn'],
                                     drop_path=dpr[i]) for i, t in enumerate(tokens)])

    def init_weights(self) -> None:
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
    def no_weight_decay(self) -> set:
        """Parameter names that get no weight decay (timm convention); 1-d params are excluded too. A
        fixed sin-cos position table is a buffer, not a parameter, and is not listed."""
        return {n for n in ('pos_embed', 'cls_token', 'reg_token') if isinstance(getattr(self, n), nn.Parameter)}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups for timm's layer-wise lr decay: stem, one group per block, then final norm."""
        return dict(stem=r'^cls_token|^reg_token|^pos_embed|^patch_embed',
                    blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward (same outputs, less memory)."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The classifier head (``nn.Identity`` when ``num_classes=0``), timm's contract."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
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
    def _run_block(self, block: nn.Module, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One block of the trunk, recomputed in backward when gradient checkpointing is on (TorchScript
        cannot pass a module as an argument: a scripted model runs the blocks in
        [`forward_blocks`][tkvision.models.tokenformer_vit.TokenFormerViT.forward_blocks])."""
        if self.grad_checkpointing:
            return checkpoint(block, x, attn_mask, use_reentrant=False)
        return block(x, attn_mask)

    def forward_features(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B, in_chans, H, W] -> [B, num_prefix_tokens + N, embed_dim]`` (after the final norm);
        ``attn_mask`` as timm's ViT takes it (``F.scaled_dot_product_attention``'s, over all tokens)."""
        grid = self.patch_embed.dynamic_feat_size((x.shape[-2], x.shape[-1]))
        x = self._pos_embed(self.patch_embed(x), grid)
        return self.norm(self.forward_blocks(x, attn_mask))

    def forward_blocks(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The trunk, ``[B, N', C] -> [B, N', C]``, block by block (`_run_block`): what a family
        overrides to change the trunk, and what [`MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] runs on the
        visible tokens."""
        if torch.jit.is_scripting():
            for block in self.blocks:
                x = block(x, attn_mask)
            return x
        for block in self.blocks:
            x = self._run_block(block, x, attn_mask)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool, fc_norm, dropout, classifier: ``[B, N', C] -> [B, num_classes]`` (``[B, C]`` if
        ``pre_logits``)."""
        if self.global_pool == 'avg':
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        elif self.global_pool == 'token':
            x = x[:, 0]
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Images ``[B, in_chans, H, W]`` -> logits ``[B, num_classes]`` (features ``[B, embed_dim]`` when
        ``num_classes=0``); ``attn_mask`` as in
        [`forward_features`][tkvision.models.tokenformer_vit.TokenFormerViT.forward_features]."""
        return self.forward_head(self.forward_features(x, attn_mask))

    @torch.jit.ignore
    def checkpoint_filter(self, state_dict: dict) -> dict:
        """``state_dict`` adapted to this model by the family's `checkpoint_filter_fn` and
        `adapt_input_channels` (what `tkvision.models.adapt_state_dict` applies to any model
        that has this method)."""
        return adapt_input_channels(checkpoint_filter_fn(state_dict, self), self)


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: Optional[TokenFormerViT]) -> Dict[str, torch.Tensor]:
    """Adapt a TokenFormer ViT checkpoint to ``model`` (timm's ``pretrained_filter_fn``).

    Unwraps ``{'state_dict_ema' | 'model_ema' | 'state_dict' | 'model': ...}`` (EMA first, as
    timm), reads the first release's layout (patch-embedding key tokens as
    ``patch_embed.proj.key_param_tokens [n, C*p*p]``, now the filter bank ``patch_embed.proj.weight
    [n, C, p, p]``), resamples ``pos_embed`` to the model's patch grid (timm's
    ``resample_abs_pos_embed``). Other input channels are timm's loader's to adapt (``first_conv``),
    or `adapt_input_channels`'s on our own path. ``model`` None: only the unwrapping (another family's filter
    reads the layout itself). Everything else passes through; shape mismatches are reported by
    `tkvision.models.check_fit` / ``load_state_dict``.
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


def create_tokenformer(
        model_cls: type,
        variant: str,
        pretrained: bool = False,
        filter_fn: Callable = checkpoint_filter_fn,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None,
        **kwargs: Any,
) -> nn.Module:
    """Build a TokenFormer family's ``variant`` with timm's ``build_model_with_cfg`` (the builder every
    family's entrypoints share: fixed-grid, NaFlex, recurrent).

    Beyond timm's: a clear error when ``pretrained=True`` finds no weights (none are published); a local
    weights file (``pretrained_cfg_overlay=dict(file=...)``) states its own head size and input channels,
    which timm would otherwise take from the cfg (dropping a head that is not 1000 wide, re-folding a stem
    that is not 3-channel); ``device`` / ``dtype``: timm's factory arguments (``create_model(...,
    device='meta', dtype=torch.bfloat16)``): the model is built under ``torch.device(device)``, so its
    tensors are created there (no CPU copy of a large model first), then cast to ``dtype``.

    Args:
        model_cls: the family's model class.
        variant: its registered name.
        filter_fn: its checkpoint filter (timm's ``pretrained_filter_fn``).
        kwargs: the model's arguments and timm's (``pretrained_cfg_overlay``, ``out_indices``,
            ``features_only``, ...).

    Raises:
        RuntimeError: ``pretrained=True`` without a weights file, naming how to give one.
    """
    if pretrained:
        kwargs['pretrained_cfg_overlay'] = _local_file_overlay(variant, kwargs)
    out_indices = kwargs.pop('out_indices', 3)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model: nn.Module = build_model_with_cfg(model_cls, variant, pretrained, pretrained_filter_fn=filter_fn,
                                                feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
                                                **kwargs)
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    return model


def _local_file_overlay(variant: str, kwargs: dict) -> dict:
    """The ``pretrained_cfg_overlay`` of a pretrained build: a local file's own head size and input
    channels added (the keys the caller gave win)."""
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=kwargs.get('pretrained_cfg'),
                                 pretrained_cfg_overlay=kwargs.get('pretrained_cfg_overlay'))
    if not (cfg.file or cfg.url or cfg.hf_hub_id or cfg.state_dict):
        raise RuntimeError(
            f'No pretrained weights are published for {variant}. Train one (tkvision-train) and load it '
            f"with pretrained=True, pretrained_cfg_overlay=dict(file='path/to/model.safetensors').")
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    if cfg.file and os.path.isfile(cfg.file):
        stem = f"{cfg.first_conv}.weight"
        shapes = file_shapes(cfg.file, ('head.weight', stem))
        overlay.setdefault('num_classes', shapes.get('head.weight', (0,))[0])
        # a conv-shaped stem says its channels; a row-shaped one (NaFlex) has the model's
        channels = shapes[stem][1] if len(shapes.get(stem, ())) == 4 else kwargs.get('in_chans', 3)
        overlay.setdefault('input_size', (channels, *cfg.input_size[1:]))
    return overlay


def tokenformer_cfg(url: str = '', **kwargs: Any) -> dict:
    """timm's pretrained cfg of a TokenFormer family's variant (ImageNet defaults; ``kwargs`` override)."""
    return {
        'url': url, 'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': 'patch_embed.proj', 'classifier': 'head', 'license': 'apache-2.0',
        'paper_ids': 'arXiv:2410.23168', 'paper_name': 'TokenFormer', **kwargs,
    }


# No weights are published: every cfg has an empty url (pretrained=True needs a local file).
default_cfgs = generate_default_cfgs({
    'tokenformer_vit_ti16.untrained': tokenformer_cfg(),
    'tokenformer_vit_s16.untrained': tokenformer_cfg(),
    'tokenformer_vit_b16.untrained': tokenformer_cfg(),
    'tokenformer_vit_b16_matched.untrained': tokenformer_cfg(),
    'tokenformer_vit_l16.untrained': tokenformer_cfg(),
    'tokenformer_vit_l16_matched.untrained': tokenformer_cfg(),
})


@register_model
def tokenformer_vit_ti16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-Ti/16: d 192, 12 blocks, 3 heads, 192 / 768 tokens (qkv, proj, patch / ffn)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, num_tokens=192)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_ti16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_s16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-S/16: d 384, 12 blocks, 6 heads, 384 / 1536 tokens."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, num_tokens=384)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_s16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_b16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-B/16 (Table 2, 'Ours 109M' row): d 768, 12 blocks, 12 heads, 768 / 3072 tokens."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=768)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_b16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_b16_matched(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-B/16† (Table 2, 86M): ViT-B/16's parameter count, 576 / 2304 tokens."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, num_tokens=576)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_b16_matched', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_l16(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-L/16 (Table 2, 407M): d 1024, 24 blocks, 16 heads, 1024 / 4096 tokens."""
    args = dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, num_tokens=1024)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_l16', pretrained, **dict(args, **kwargs))


@register_model
def tokenformer_vit_l16_matched(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """TokenFormer-L/16† (Table 2, 307M): ViT-L/16's parameter count, 768 / 3072 tokens."""
    args = dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, num_tokens=768)
    return create_tokenformer(TokenFormerViT, 'tokenformer_vit_l16_matched', pretrained, **dict(args, **kwargs))
