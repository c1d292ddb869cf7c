"""Masked autoencoder (MAE) pretraining of TokenFormer ViTs, and of timm's ViT as the baseline.

Paper: `Masked Autoencoders Are Scalable Vision Learners` - https://arxiv.org/abs/2111.06377
(He et al. 2022): §3 (masking, encoder on visible patches, decoder, loss), App. A.1 (recipe);
the facts used here are in ``docs/reference/background.md`` ("MAE self-supervised pretraining").

    mask:    per sample, keep the ``round(N (1 - mask_ratio))`` patches with the smallest uniform noise
    encoder: the ViT's patch embedding + position embedding, then its blocks and final norm on the
             class / register tokens and the visible patches only
    decoder: embed (d -> d_dec), a learned mask token for every masked patch, fixed 2-D sin-cos
             position embeddings, ``depth`` blocks, norm, prediction (d_dec -> p·p·C)
    loss:    mean squared error on the masked patches only, against per-patch normalised pixels
             (``norm_pix_loss``: (x - mean) / sqrt(var + 1e-6) over each patch)

The encoder is any model of the family (``tokenformer_vit_*``) or timm's ``vit_*`` (both expose
``patch_embed``, ``cls_token``, ``reg_token``, ``pos_embed``, ``blocks``, ``norm``); it is held as
``self.encoder``, so its weights are the ``encoder.*`` tensors of an MAE checkpoint and load into a
classifier through `encoder_weights` (``init_from`` in a config: `tkvision.engine.checkpoint`). The
decoder is made of the family's TokenFormer blocks
(Pattention projections) for a TokenFormer encoder and of timm's ViT blocks for timm's ViT (MAE's
own decoder), ``decoder_kind`` says which.

Growth: the decoder's Pattentions are the kinds ``decoder_embed``, ``decoder_qkv``,
``decoder_proj``, ``decoder_ffn`` and ``decoder_pred`` (`tkvision.growth`), growable apart
from the encoder's ``patch``, ``qkv``, ``proj``, ``ffn``.

Layout as timm's model files: helpers -> decoder -> model -> checkpoint filter -> factories.
"""
import math
from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple, Union

import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models._manipulate import checkpoint_seq
from timm.models.vision_transformer import Block as ViTBlock
from torch import nn

from ..layers import Block as TokenFormerBlock
from ..layers import Pattention

__all__ = ['MaskedAutoencoder', 'MAEDecoder', 'random_masking', 'patchify', 'unpatchify', 'patch_targets',
           'create_mae', 'is_mae_state_dict', 'encoder_weights', 'linear_probe', 'DECODER_PRESETS',
           'mae_tokenformer_vit_b16', 'mae_tokenformer_vit_b16_matched', 'mae_tokenformer_vit_l16',
           'mae_tokenformer_vit_l16_matched', 'mae_vit_base_patch16_224', 'mae_vit_large_patch16_224']

#: Decoder sizes: ``base`` is MAE's (512 wide, 8 blocks, 16 heads, for B, L and H alike); the
#: smaller ones are ours, for tiny encoders and tests.
DECODER_PRESETS = {
    'base': dict(embed_dim=512, depth=8, num_heads=16),
    'small': dict(embed_dim=256, depth=4, num_heads=8),
    'tiny': dict(embed_dim=64, depth=2, num_heads=4),
}


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[B, C, H, W] -> [B, N, p·p·C]``, patches in raster order, each flattened as (row, col, channel)
    (MAE's ``patchify``).

    Raises:
        ValueError: H or W not divisible by ``patch_size``.
    """
    B, C, H, W = images.shape
    p = patch_size
    if H % p or W % p:
        raise ValueError(f'image size {H}x{W} is not divisible by patch size {p}')
    x = images.reshape(B, C, H // p, p, W // p, p)
    return torch.einsum('nchpwq->nhwpqc', x).reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(
        patches: torch.Tensor,
        patch_size: int,
        grid: Tuple[int, int],
        in_chans: int,
) -> torch.Tensor:
    """Inverse of `patchify`: ``[B, N, p·p·C] -> [B, C, gh·p, gw·p]``."""
    B = patches.shape[0]
    p, (gh, gw) = patch_size, grid
    x = patches.reshape(B, gh, gw, p, p, in_chans)
    return torch.einsum('nhwpqc->nchpwq', x).reshape(B, in_chans, gh * p, gw * p)


def patch_targets(
        images: torch.Tensor,
        patch_size: int,
        norm_pix_loss: bool = True,
        eps: float = 1e-6,
) -> torch.Tensor:
    """What the decoder predicts: ``[B, N, p·p·C]`` pixels, each patch normalised to zero mean and unit
    variance when ``norm_pix_loss`` (MAE §3, "with normalised pixels": (x - mean) / sqrt(var + eps),
    the variance unbiased as in MAE's code)."""
    target = patchify(images.float(), patch_size)
    if norm_pix_loss:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + eps) ** .5
    return target


def random_masking(
        x: torch.Tensor,
        mask_ratio: float,
        noise: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample random masking by argsort of uniform noise (MAE §3, "Masking").

    Args:
        x: patch tokens ``[B, N, D]``.
        mask_ratio: fraction of patches to remove, in [0, 1).
        noise: ``[B, N]`` noise to sort (default ``torch.rand``, from the global generator); patches
            with the smallest noise are kept.

    Returns:
        ``(x_visible [B, K, D], mask [B, N] (1 = masked, 0 = kept), ids_restore [B, N])`` with
        ``K = round(N (1 - mask_ratio))``; ``ids_restore`` puts the shuffled sequence back in patch
        order (``gather(shuffled, 1, ids_restore)``).

    Raises:
        ValueError: ``mask_ratio`` outside [0, 1), or ``noise`` of the wrong shape.
    """
    B, N, D = x.shape
    if not 0 <= mask_ratio < 1:
        raise ValueError(f'mask_ratio must be in [0, 1), got {mask_ratio}')
    keep = int(round(N * (1 - mask_ratio)))
    if noise is None:
        noise = torch.rand(B, N, device=x.device)
    elif noise.shape != (B, N):
        raise ValueError(f'noise must have shape {(B, N)}, got {tuple(noise.shape)}')
    ids_shuffle = torch.argsort(noise.to(x.device), dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :keep]
    x_visible = torch.gather(x, 1, ids_keep.unsqueeze(-1).expand(-1, -1, D))
    mask = torch.ones(B, N, device=x.device)
    mask[:, :keep] = 0
    return x_visible, torch.gather(mask, 1, ids_restore), ids_restore


class MAEDecoder(nn.Module):
    """MAE's light decoder: ``[B, P + K, d_enc]`` encoded tokens (P prefix, K visible) and
    ``ids_restore [B, N]`` -> predicted patches ``[B, N, p·p·C]``.

    ``kind='tokenformer'``: embed and prediction are Pattentions (``num_tokens`` tokens) and the
    blocks are TokenFormer blocks (``num_tokens`` Q/K/V/proj tokens, ``4 num_tokens`` FFN tokens);
    ``kind='vit'``: MAE's own decoder (Linear embed and prediction, timm's ViT blocks, MLP ratio 4).
    Position embeddings: fixed 2-D sin-cos over the patch grid (zeros for the prefix tokens), a
    buffer so checkpoints carry them.

    Raises:
        ValueError: unknown ``kind``, or ``embed_dim`` not divisible by ``num_heads``.
    """

    if TYPE_CHECKING:  # a registered buffer; TorchScript reads class annotations as attribute types
        pos_embed: torch.Tensor

    def __init__(
            self,
            encoder_dim: int,
            num_patches_grid: Tuple[int, int],
            num_prefix_tokens: int,
            out_dim: int,
            embed_dim: int = 512,
            depth: int = 8,
            num_heads: int = 16,
            num_tokens: Optional[int] = None,
            kind: str = 'tokenformer',
            score_norm: str = 'l2_norm_gelu',
    ):
        super().__init__()
        if kind not in ('tokenformer', 'vit'):
            raise ValueError(f"decoder kind must be 'tokenformer' or 'vit', got {kind!r}")
        if embed_dim % num_heads:
            raise ValueError(f'decoder embed_dim {embed_dim} must be divisible by num_heads {num_heads}')
        self.kind, self.num_prefix_tokens = kind, num_prefix_tokens
        n = num_tokens or embed_dim
        self.num_tokens = n
        if kind == 'tokenformer':
            value_std = 2 / (depth * math.sqrt(embed_dim))
            self.embed: nn.Module = Pattention(encoder_dim, embed_dim, n, score_norm=score_norm, kind='decoder_embed')
            self.blocks = nn.Sequential(*[
                TokenFormerBlock(embed_dim, num_heads, n, n, 4 * n, score_norm=score_norm, value_std=value_std)
                for _ in range(depth)])
            for m in self.blocks.modules():  # the blocks' qkv / proj / ffn, grown apart from the encoder's
                if isinstance(m, Pattention) and m.kind is not None:
                    m.kind = 'decoder_' + m.kind
            self.pred: nn.Module = Pattention(embed_dim, out_dim, n, score_norm=score_norm, kind='decoder_pred')
        else:
            self.embed = nn.Linear(encoder_dim, embed_dim)
            self.blocks = nn.Sequential(*[
                ViTBlock(embed_dim, num_heads, mlp_ratio=4., qkv_bias=True, norm_layer=nn.LayerNorm)
                for _ in range(depth)])
            self.pred = nn.Linear(embed_dim, out_dim)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        grid = build_sincos2d_pos_embed(list(num_patches_grid), embed_dim)
        pos = torch.cat([torch.zeros(num_prefix_tokens, embed_dim), grid]).unsqueeze(0)
        self.register_buffer('pos_embed', pos)  # fixed: a buffer, saved under the same key
        self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        nn.init.normal_(self.mask_token, std=.02)
        if kind == 'vit':
            self.apply(_init_vit_decoder)

    def forward(self, x: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """``x [B, P + K, d_enc]`` (prefix, then the K visible patches in shuffled order) and
        ``ids_restore [B, N]`` (each patch's place in that order) -> predicted pixels ``[B, N, p·p·C]``
        in the image's patch order; mask tokens fill the N - K masked places (MAE §3, "MAE decoder")."""
        x = self.embed(x)
        P = self.num_prefix_tokens
        B, N = ids_restore.shape
        mask_tokens = self.mask_token.expand(B, N + P - x.shape[1], -1).to(x.dtype)
        patches = torch.cat([x[:, P:], mask_tokens], dim=1)
        patches = torch.gather(patches, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        x = torch.cat([x[:, :P], patches], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.pred(x)[:, P:]


def _init_vit_decoder(m):
    # MAE's decoder init: xavier-uniform Linear weights, zero biases, unit LayerNorms
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


class MaskedAutoencoder(nn.Module):
    """A masked autoencoder around a ViT encoder (MAE §3).

    Args:
        encoder: a ``tokenformer_vit_*`` or timm ``vit_*`` model with a fixed image size (its head is
            not used; build it with ``num_classes=0``).
        decoder_embed_dim: decoder width (MAE: 512; `DECODER_PRESETS`).
        decoder_depth: decoder blocks (MAE: 8).
        decoder_num_heads: decoder attention heads (MAE: 16).
        decoder_num_tokens: parameter tokens of the decoder's Pattentions (default: its width).
        decoder_kind: ``'tokenformer'`` or ``'vit'`` (default: TokenFormer for an encoder with
            Pattentions, MAE's ViT decoder otherwise).
        mask_ratio: default fraction of patches masked (MAE: 0.75).
        norm_pix_loss: regress per-patch normalised pixels (MAE's default for its best results).
        sincos_pos_embed: replace the encoder's position embedding by fixed 2-D sin-cos (MAE's
            encoder), frozen; fine-tuning then trains it as a learned one.

    ``forward(images [B, C, H, W], mask_ratio=None, noise=None) -> (loss, pred [B, N, p·p·C],
    mask [B, N])``; ``images`` normalised as the encoder expects.

    Raises:
        ValueError: an encoder without the ViT attributes, with ``dynamic_img_size``, or without
            square patches; a ``mask_ratio`` that masks no patch or leaves none visible.
    """

    def __init__(
            self,
            encoder: nn.Module,
            decoder_embed_dim: int = 512,
            decoder_depth: int = 8,
            decoder_num_heads: int = 16,
            decoder_num_tokens: Optional[int] = None,
            decoder_kind: Optional[str] = None,
            mask_ratio: float = 0.75,
            norm_pix_loss: bool = True,
            sincos_pos_embed: bool = True,
    ):
        super().__init__()
        missing = [a for a in ('patch_embed', 'cls_token', 'pos_embed', 'blocks', 'norm', 'num_prefix_tokens')
                   if not hasattr(encoder, a)]
        if missing:
            raise ValueError(f'{type(encoder).__name__} is not a ViT encoder: it has no {", ".join(missing)}')
        if getattr(encoder, 'dynamic_img_size', False):
            raise ValueError('the MAE encoder needs a fixed image size (dynamic_img_size=False)')
        vit: Any = encoder  # a ViT by its attributes (checked above): ours or timm's
        pe = vit.patch_embed
        ph, pw = pe.patch_size
        if ph != pw:
            raise ValueError(f'MAE needs square patches, got {pe.patch_size}')
        self.encoder = encoder
        self.patch_size, self.grid_size = ph, tuple(pe.grid_size)
        num_patches = self.grid_size[0] * self.grid_size[1]
        visible = int(round(num_patches * (1 - mask_ratio)))
        if not 0 < visible < num_patches:  # no masked patch: nothing to learn; none visible: nothing to encode
            raise ValueError(f'mask_ratio {mask_ratio} leaves {visible} of {num_patches} patches visible: pretraining '
                             f'needs at least one masked and one visible patch (mask between 1 and {num_patches - 1})')
        self.in_chans = getattr(encoder, 'in_chans', None) or pe.proj.weight.shape[1]
        self.mask_ratio, self.norm_pix_loss = mask_ratio, norm_pix_loss
        if sincos_pos_embed and vit.pos_embed is not None:
            with torch.no_grad():
                grid = build_sincos2d_pos_embed(list(self.grid_size), vit.pos_embed.shape[-1])
                vit.pos_embed.zero_()[0, vit.pos_embed.shape[1] - grid.shape[0]:] = grid
            vit.pos_embed.requires_grad_(False)
        pattention = next((m for m in encoder.modules() if isinstance(m, Pattention)), None)
        if decoder_kind is None:  # a TokenFormer decoder for an encoder made of Pattentions
            decoder_kind = 'vit' if pattention is None else 'tokenformer'
        score_norm = 'l2_norm_gelu' if pattention is None else pattention.score_norm
        self.decoder = MAEDecoder(vit.embed_dim, self.grid_size, vit.num_prefix_tokens,
                                  self.patch_size ** 2 * self.in_chans, decoder_embed_dim, decoder_depth,
                                  decoder_num_heads, decoder_num_tokens, decoder_kind, score_norm=score_norm)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        """Encoder's class / register tokens and position embedding, and the mask token (timm convention)."""
        enc = {f'encoder.{n}' for n in ('pos_embed', 'cls_token', 'reg_token')
               if isinstance(getattr(self.encoder, n, None), torch.nn.Parameter)}
        return enc | {'decoder.mask_token'}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute the encoder's block activations in backward."""
        enc: Any = self.encoder  # a ViT by its attributes (checked at construction): timm's method
        enc.set_grad_checkpointing(enable)

    def forward_encoder(
            self,
            images: torch.Tensor,
            mask_ratio: float,
            noise: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, C, H, W] -> (latent [B, P + K, d], mask [B, N], ids_restore [B, N])``: the visible
        patches (in shuffled order) after the prefix tokens, through the encoder's blocks and norm."""
        enc: Any = self.encoder  # a ViT by its attributes (checked at construction)
        x = enc.patch_embed(images)
        P = enc.num_prefix_tokens
        pos = enc.pos_embed
        prefix_pos = None
        if pos is not None:
            patch_pos = pos if enc.no_embed_class else pos[:, P:]
            prefix_pos = None if enc.no_embed_class else pos[:, :P]
            x = x + patch_pos
        x, mask, ids_restore = random_masking(x, mask_ratio, noise)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (enc.cls_token, getattr(enc, 'reg_token', None))
                  if t is not None]
        if prefix:
            tokens = torch.cat(prefix, dim=1)
            if prefix_pos is not None:
                tokens = tokens + prefix_pos
            x = torch.cat([tokens, x], dim=1)
        x = enc.pos_drop(x)
        x = getattr(enc, 'norm_pre', nn.Identity())(x)
        if hasattr(enc, 'forward_blocks'):  # a tkvision family's trunk, recurrent ones included
            x = enc.forward_blocks(x)
        elif getattr(enc, 'grad_checkpointing', False) and not torch.jit.is_scripting():
            x = checkpoint_seq(enc.blocks, x)
        else:
            x = enc.blocks(x)
        return enc.norm(x), mask, ids_restore

    def forward_loss(self, images: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean over masked patches of the per-patch mean squared error (MAE §3, "Reconstruction
        target"); float32. ``images [B, C, H, W]``, ``pred [B, N, p·p·C]``, ``mask [B, N]``."""
        target = patch_targets(images, self.patch_size, self.norm_pix_loss)
        loss = ((pred.float() - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum().clamp_min(1)

    def forward(
            self,
            images: torch.Tensor,
            mask_ratio: Optional[float] = None,
            noise: Optional[torch.Tensor] = None,
    ) -> tuple:
        """``images [B, C, H, W]`` -> ``(loss, pred [B, N, p·p·C], mask [B, N])`` (1 = masked):
        ``mask_ratio`` defaults to the model's; ``noise [B, N]`` fixes which patches are kept (the
        lowest), random otherwise. Raises as
        [`forward_encoder`][tkvision.models.mae.MaskedAutoencoder.forward_encoder] does."""
        ratio = self.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore = self.forward_encoder(images, ratio, noise)
        pred = self.decoder(latent, ids_restore)
        return self.forward_loss(images, pred, mask), pred, mask


def is_mae_state_dict(state_dict: dict) -> bool:
    """True for the weights of a [`MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] (``encoder.*`` and
    ``decoder.*`` tensors)."""
    return any(k.startswith('encoder.') for k in state_dict) and any(k.startswith('decoder.') for k in state_dict)


def encoder_weights(model: nn.Module, state_dict: dict) -> dict:
    """The weights of an MAE checkpoint's encoder, arranged for the classifier ``model`` (fine-tuning
    or linear probing); nothing is loaded here (`tkvision.engine.checkpoint.load_init_weights`
    loads them, growing token rows when ``model`` has more).

    Takes the ``encoder.*`` tensors, drops the decoder (``decoder.*``, mask token included); the
    classifier's ``head`` and ``fc_norm`` keep their init when the encoder has none (MAE fine-tuning:
    global average pooling + a fresh ``fc_norm``), and the encoder's final ``norm`` is dropped when
    the model has none. The position embedding is resampled to the model's patch grid (timm's
    ``resample_abs_pos_embed``).

    Returns:
        ``dict(weights={name: tensor}, loaded=[names], dropped=[names], kept_init=[names])``.

    Raises:
        ValueError: ``state_dict`` is not an MAE checkpoint.
    """
    if not is_mae_state_dict(state_dict):
        raise ValueError('not an MAE checkpoint: no encoder.* and decoder.* tensors')
    enc = {k[len('encoder.'):]: v for k, v in state_dict.items() if k.startswith('encoder.')}
    dropped = sorted(k for k in state_dict if not k.startswith('encoder.'))
    own = model.state_dict()
    for k in sorted(set(enc) - set(own)):
        if k.startswith('norm.'):
            dropped.append('encoder.' + k)
            del enc[k]
    kept_init = sorted(k for k in set(own) - set(enc) if k.split('.')[0] in ('head', 'fc_norm'))
    enc.update({k: own[k] for k in kept_init})
    pos = enc.get('pos_embed')
    if pos is not None and 'pos_embed' in own and pos.shape != own['pos_embed'].shape:
        vit: Any = model  # a ViT by its attributes: ours or timm's
        prefix = 0 if getattr(vit, 'no_embed_class', False) else vit.num_prefix_tokens
        enc['pos_embed'] = resample_abs_pos_embed(pos, new_size=list(vit.patch_embed.grid_size),
                                                  num_prefix_tokens=prefix)
    loaded = sorted(k for k in enc if k not in kept_init)
    return dict(weights=enc, loaded=loaded, dropped=dropped, kept_init=kept_init)


def linear_probe(model: nn.Module) -> nn.Module:
    """MAE's linear probing (App. A.3): freeze every parameter of the classifier ``model`` except a new
    head ``Sequential(BatchNorm1d(num_features, affine=False, eps=1e-6), the old Linear head)``
    (BatchNorm without affine parameters normalises the frozen features). In place; returns ``model``.

    Raises:
        ValueError: a model without a Linear ``head``.
    """
    head = getattr(model, 'head', None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f'linear probing needs a model with a Linear head, got {type(head).__name__}')
    for p in model.parameters():
        p.requires_grad_(False)
    model.head = nn.Sequential(nn.BatchNorm1d(head.in_features, affine=False, eps=1e-6), head)
    head.requires_grad_(True)
    return model


def create_mae(
        encoder: str,
        decoder: Union[str, Mapping[str, int]] = 'base',
        mask_ratio: float = 0.75,
        norm_pix_loss: bool = True,
        decoder_num_tokens: Optional[int] = None,
        decoder_kind: Optional[str] = None,
        **encoder_kwargs: Any,
) -> MaskedAutoencoder:
    """``MaskedAutoencoder(timm.create_model(encoder, num_classes=0, **encoder_kwargs), ...)``.

    Args:
        encoder: a registered model name (``tokenformer_vit_b16``, ``vit_base_patch16_224``, ...).
        decoder: a `DECODER_PRESETS` name or ``dict(embed_dim, depth, num_heads)``.

    Raises:
        ValueError: unknown decoder preset.
    """
    if isinstance(decoder, str):
        if decoder not in DECODER_PRESETS:
            raise ValueError(f'unknown decoder preset {decoder!r}; presets: {", ".join(DECODER_PRESETS)}')
        decoder = DECODER_PRESETS[decoder]
    encoder_kwargs['num_classes'] = 0
    net = timm.create_model(encoder, **encoder_kwargs)
    return MaskedAutoencoder(net, decoder['embed_dim'], decoder['depth'], decoder['num_heads'], decoder_num_tokens,
                             decoder_kind, mask_ratio, norm_pix_loss)


def mae_tokenformer_vit_b16(**kwargs: Any) -> MaskedAutoencoder:
    """MAE with a TokenFormer-B/16 encoder (768 / 3072 tokens) and MAE's base decoder (512, 8, 16)."""
    return create_mae('tokenformer_vit_b16', **kwargs)


def mae_tokenformer_vit_b16_matched(**kwargs: Any) -> MaskedAutoencoder:
    """MAE with a TokenFormer-B/16† encoder (ViT-B's parameter count) and MAE's base decoder."""
    return create_mae('tokenformer_vit_b16_matched', **kwargs)


def mae_tokenformer_vit_l16(**kwargs: Any) -> MaskedAutoencoder:
    """MAE with a TokenFormer-L/16 encoder and MAE's base decoder."""
    return create_mae('tokenformer_vit_l16', **kwargs)


def mae_tokenformer_vit_l16_matched(**kwargs: Any) -> MaskedAutoencoder:
    """MAE with a TokenFormer-L/16† encoder (ViT-L's parameter count) and MAE's base decoder."""
    return create_mae('tokenformer_vit_l16_matched', **kwargs)


def mae_vit_base_patch16_224(**kwargs: Any) -> MaskedAutoencoder:
    """The baseline: MAE's ViT-B/16 (timm's ``vit_base_patch16_224``) with MAE's ViT decoder."""
    return create_mae('vit_base_patch16_224', **kwargs)


def mae_vit_large_patch16_224(**kwargs: Any) -> MaskedAutoencoder:
    """The baseline: MAE's ViT-L/16 (timm's ``vit_large_patch16_224``) with MAE's ViT decoder."""
    return create_mae('vit_large_patch16_224', **kwargs)
