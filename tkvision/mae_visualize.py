"""Reconstruction pictures of a masked autoencoder, as in MAE's Figures 2-4.

One row per validation image: the original, the masked input (masked patches grey), the
reconstruction, and the reconstruction with the visible patches pasted back. With
``norm_pix_loss`` the decoder predicts per-patch normalised pixels; they are shown with each
patch's true mean and standard deviation put back (what MAE's own pictures of such models do), so
the picture shows structure, not the patch means.

``tools/mae_visualize.py --checkpoint RUN/last.pth --out recon.png`` (the run's config is in the
checkpoint); the trainer writes ``reconstruction.png`` at the end of every ``task: mae`` run.
"""
import argparse
import sys

import numpy as np
import torch
from PIL import Image

from .checkpoint import load_state, load_state_dict_file
from .config import load_config
from .data import BatchPreprocessor, build_dataset, resolve_data_cfg
from .evaluate import mask_noise
from .growth import grow, pattention_layers, token_counts
from .models.mae import MaskedAutoencoder, patchify, unpatchify
from .runtime import build_model, cli, setup_threads

__all__ = ['reconstruct', 'reconstruction_grid', 'save_reconstructions', 'main']


@torch.no_grad()
def reconstruct(model: MaskedAutoencoder, images: torch.Tensor, mask_ratio=None, seed: int = 0):
    """``images [B, C, H, W]`` (normalised) -> ``(masked, recon, pasted)``, each ``[B, C, H, W]`` in
    the same normalised space; the masks are those of validation batch 0 (:func:`mask_noise`)."""
    model.eval()
    p = model.patch_size
    noise = mask_noise(0, len(images), model.grid_size[0] * model.grid_size[1], seed).to(images.device)
    _, pred, mask = model(images, mask_ratio, noise)
    pred = pred.float()
    if model.norm_pix_loss:
        target = patchify(images.float(), p)
        pred = pred * (target.var(dim=-1, keepdim=True) + 1e-6) ** .5 + target.mean(dim=-1, keepdim=True)
    C = images.shape[1]
    recon = unpatchify(pred, p, model.grid_size, C)
    m = unpatchify(mask.unsqueeze(-1).expand(-1, -1, p * p * C), p, model.grid_size, C)
    grey = torch.zeros_like(images)
    return images * (1 - m) + grey * m, recon, images * (1 - m) + recon * m


def reconstruction_grid(model: MaskedAutoencoder, images: torch.Tensor, mean, std, mask_ratio=None,
                        scale: int = 4) -> np.ndarray:
    """A ``[B·H·scale, 4·W·scale, 3]`` uint8 picture: per image, original | masked | reconstruction |
    reconstruction + visible patches, un-normalised with ``mean`` / ``std`` (per channel) and
    enlarged ``scale`` times (nearest)."""
    cols = [images, *reconstruct(model, images, mask_ratio)]
    mean = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    rows = torch.cat([((c.float() * std + mean).clamp(0, 1)) for c in cols], dim=3)  # [B, C, H, 4W]
    grid = torch.cat(list(rows), dim=1)  # [C, B*H, 4W]
    if grid.shape[0] == 1:
        grid = grid.expand(3, -1, -1)
    grid = grid.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    return (grid.permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)


def save_reconstructions(model: MaskedAutoencoder, dataset, cfg: dict, path: str, num_images: int = 8, device='cpu'):
    """Write :func:`reconstruction_grid` of the first ``num_images`` images of ``dataset`` (items
    ``(uint8 image [C, H, W], label)``) to the PNG ``path``."""
    images = torch.stack([torch.as_tensor(dataset[i][0]) for i in range(min(num_images, len(dataset)))])
    images = BatchPreprocessor(cfg['mean'], cfg['std'], torch.device(device))(images)
    Image.fromarray(reconstruction_grid(model, images, cfg['mean'], cfg['std'], cfg['mask_ratio'])).save(path)


def main(argv=None) -> int:
    """``tools/mae_visualize.py`` / ``tkvision-mae-visualize``: see ``--help``; user errors are one line, exit 2."""
    return cli(_main, argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description='Reconstructions of an MAE checkpoint on validation images.')
    ap.add_argument('--checkpoint', required=True, help='last.pth of a task: mae run, or .safetensors with --config')
    ap.add_argument('--config', help='the run\'s config (needed for a .safetensors file)')
    ap.add_argument('--data-dir', help='dataset root, if not the config\'s')
    ap.add_argument('--num-images', type=int, default=8)
    ap.add_argument('--mask-ratio', type=float, help='default: the config\'s')
    ap.add_argument('--out', required=True, help='output PNG')
    args = ap.parse_args(argv)
    overrides = {'data_dir': args.data_dir} if args.data_dir else {}
    if args.mask_ratio is not None:
        overrides['mask_ratio'] = args.mask_ratio
    if args.checkpoint.endswith('.pth') and not args.config:
        ckpt = load_state(args.checkpoint)
        cfg = load_config(None, {**ckpt['config'], **overrides})
        weights = ckpt['model_ema'] or ckpt['model']
    else:
        if not args.config:
            ap.error('a .safetensors checkpoint needs --config (the run\'s config.yaml)')
        cfg = load_config(args.config, overrides)
        weights = load_state_dict_file(args.checkpoint)
    if cfg['task'] != 'mae':
        ap.error(f"{args.checkpoint} is not an MAE run (task {cfg['task']!r})")
    cfg = resolve_data_cfg(cfg)
    setup_threads(cfg)
    model = build_model(cfg)
    counts = _counts_of(model, weights)
    if token_counts(model) != counts:  # a run that grew during training
        grow(model, to=counts)
    model.load_state_dict(weights)
    save_reconstructions(model, build_dataset(cfg, 'val', 0, 1), cfg, args.out, args.num_images)
    print(f'wrote {args.out} ({args.num_images} validation images, mask ratio {cfg["mask_ratio"]})')
    return 0


def _counts_of(model, weights: dict) -> dict:
    """``{kind: num_tokens}`` of ``weights`` for ``model``'s Pattentions (a grown run's checkpoint)."""
    return {kind: weights[f'{name}.{layer.key_name}'].shape[0] for name, (kind, layer) in pattention_layers(model).items()}


if __name__ == '__main__':
    sys.exit(main())
