"""Evaluation: top-1 / top-5 accuracy, loss and throughput over a dataset, on one or many processes.

``tools/validate.py`` / ``tkvision-validate`` evaluate a weights file (``.safetensors`` or a
training checkpoint) on an ImageNet-layout ``val`` folder or the Fashion-MNIST test set.
"""
import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .checkpoint import adapt_state_dict, load_state_dict_file, load_weights
from .config import load_config
from .data import BatchPreprocessor, build_dataset, build_loader, resolve_data_cfg, train_class_map
from .growth import grow_to_checkpoint
from .runtime import build_model, cli, init_distributed, setup_threads

__all__ = ['evaluate', 'evaluate_mae', 'mask_noise', 'main']


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device, preprocess, amp=None) -> dict:
    """Top-1 / top-5 accuracy (%), mean cross-entropy and img/s of ``model`` over ``loader``.

    ``loader`` yields ``(uint8 images [B, C, H, W], labels [B], bad_paths)``
    (:func:`tkvision.data.collate_skip_bad`); ``preprocess`` (a :class:`tkvision.data.BatchPreprocessor`)
    moves and normalises the images. Under ``torch.distributed`` the sums are reduced over ranks
    (each rank sees its own shard). One host synchronisation at the end.

    Returns:
        ``dict(top1, top5, loss, count, img_per_s, skipped)``; ``skipped`` counts unreadable images.
    """
    model.eval()
    totals = torch.zeros(5, dtype=torch.float64, device=device)  # correct1, correct5, loss_sum, count, skipped
    start = time.perf_counter()
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(amp)
    for images, labels, bad in loader:
        totals[4] += len(bad)
        if images is None:
            continue
        images, labels = preprocess(images), labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(images)
        logits = logits.float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = top5 == labels[:, None]
        totals[0] += hits[:, 0].sum()
        totals[1] += hits.any(dim=1).sum()
        totals[2] += F.cross_entropy(logits, labels, reduction='sum')
        totals[3] += len(labels)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    elapsed = time.perf_counter() - start
    c1, c5, loss, n, skipped = totals.tolist()
    n = max(n, 1)
    return dict(top1=100 * c1 / n, top5=100 * c5 / n, loss=loss / n, count=int(n), img_per_s=n / elapsed,
                skipped=int(skipped))


def mask_noise(batch_index: int, batch_size: int, num_patches: int, seed: int = 0) -> torch.Tensor:
    """The fixed masking noise ``[batch_size, num_patches]`` of validation batch ``batch_index`` (CPU
    generator seeded with ``(seed, batch_index)``), so every evaluation masks the same patches."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + batch_index)
    return torch.rand(batch_size, num_patches, generator=g)


@torch.no_grad()
def evaluate_mae(model: torch.nn.Module, loader, device, preprocess, amp=None, seed: int = 0) -> dict:
    """Mean MAE reconstruction loss of ``model`` (a :class:`tkvision.models.mae.MaskedAutoencoder`,
    possibly DDP / compiled) over ``loader``, with the same masks at every call (:func:`mask_noise`),
    weighted by images and reduced over ranks.

    Returns:
        ``dict(loss, count, img_per_s, skipped)``.
    """
    inner = getattr(model, 'module', getattr(model, '_orig_mod', model))
    inner = getattr(inner, '_orig_mod', inner)
    num_patches = inner.grid_size[0] * inner.grid_size[1]
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss_sum, count, skipped
    start = time.perf_counter()
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(amp)
    for i, (images, _labels, bad) in enumerate(loader):
        totals[2] += len(bad)
        if images is None:
            continue
        images = preprocess(images)
        noise = mask_noise(i, len(images), num_patches, seed).to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(images, None, noise)[0]
        totals[0] += loss.double() * len(images)
        totals[1] += len(images)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    loss, n, skipped = totals.tolist()
    return dict(loss=loss / max(n, 1), count=int(n), img_per_s=n / (time.perf_counter() - start),
                skipped=int(skipped))


def main(argv=None) -> int:
    """``tkvision-validate`` / ``tools/validate.py``: evaluate a weights file; see ``--help``. A user
    error (missing file, weights that do not fit, bad setting) is one line on stderr, exit 2."""
    return cli(_main, argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description='Evaluate a TokenFormer (or any timm) model on a val set.')
    ap.add_argument('--model', help='timm model name (default: the config\'s)')
    ap.add_argument('--checkpoint', required=True, help='.safetensors weights or a training .pth checkpoint')
    ap.add_argument('--config', help='training config (data, img_size, mean/std, model_kwargs)')
    ap.add_argument('--data-dir', help='ImageNet folder with val/, or Fashion-MNIST files')
    ap.add_argument('--no-ema', action='store_true', help='use the model weights, not EMA, of a .pth checkpoint')
    args, rest = ap.parse_known_args(argv)
    overrides = list(rest) + (['--data_dir', args.data_dir] if args.data_dir else [])
    if args.model:
        overrides += ['--model', args.model]
    cfg = resolve_data_cfg(load_config(args.config, overrides))
    setup_threads(cfg)
    rank, world, device = init_distributed(cfg)
    ds = build_dataset(cfg, 'val', rank, world, class_to_idx=train_class_map(cfg))
    model = build_model(cfg)
    # a run that grew during training: its config builds the model it started from
    weights = adapt_state_dict(model, load_state_dict_file(args.checkpoint, not args.no_ema))
    grown = grow_to_checkpoint(model, weights)
    if grown and not rank:
        print(f'grown to the checkpoint\'s size (old, new): {grown}')
    load_weights(model, args.checkpoint, state_dict=weights)
    model.to(device)
    loader = build_loader(ds, cfg, train=False, rank=rank, world_size=world)
    res = evaluate(model, loader, device, BatchPreprocessor(cfg['mean'], cfg['std'], device), cfg['amp'])
    if rank:
        return 0
    print(f"{cfg['model']} on {res['count']} images: top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  "
          f"loss {res['loss']:.4f}  {res['img_per_s']:.0f} img/s" +
          (f"  (skipped {res['skipped']} unreadable images)" if res['skipped'] else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
