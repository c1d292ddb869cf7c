"""Evaluation: top-1 / top-5 accuracy, loss and throughput over a dataset, on one or many processes;
the MAE reconstruction loss with fixed masks.

``tools/validate.py`` / ``tkvision-validate`` (`tkvision.cli`) evaluate a weights file
(``.safetensors`` or a training checkpoint) on an ImageNet-layout ``val`` folder or the
Fashion-MNIST test set.
"""
import time
from typing import Callable, Iterable, Optional, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.utils import unwrap_model

from ..utils.seeding import derive_seed

__all__ = ['evaluate', 'evaluate_mae', 'mask_noise']


@torch.no_grad()
def evaluate(
        model: torch.nn.Module,
        loader: Iterable,
        device: Union[str, torch.device],
        preprocess: Callable,
        autocast_dtype: Optional[torch.dtype] = None,
) -> dict:
    """Top-1 / top-5 accuracy (%), mean cross-entropy and img/s of ``model`` over ``loader``, under
    ``torch.autocast`` of ``autocast_dtype`` (None: float32), the training precision of the device's plan
    (``tkvision.engine.distributed.DevicePlan.autocast_dtype``).

    ``loader`` yields ``(uint8 images [B, C, H, W], labels [B], bad_paths)``
    (`tkvision.data.collate_skip_bad`); ``preprocess`` (a `tkvision.data.BatchPreprocessor`)
    moves and normalises the images. Under ``torch.distributed`` the sums are reduced over ranks
    (each rank sees its own shard). One host synchronisation at the end.

    Returns:
        ``dict(top1, top5, loss, count, img_per_s, skipped, confusion)``; ``skipped`` counts unreadable images;
        ``confusion`` is the confusion matrix, int64 ``[classes, classes]`` on the CPU (row: the true class, column:
        the predicted one; None when no batch was seen).
    """
    model.eval()
    device = torch.device(device)
    totals = torch.zeros(5, dtype=torch.float64, device=device)  # correct1, correct5, loss_sum, count, skipped
    confusion: Optional[torch.Tensor] = None
    start = time.perf_counter()
    dtype = autocast_dtype
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
        classes = logits.shape[1]
        pairs = torch.bincount(labels * classes + top5[:, 0], minlength=classes * classes).view(classes, classes)
        confusion = pairs if confusion is None else confusion + pairs
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
        confusion = _sum_over_ranks(confusion, device)
    elapsed = time.perf_counter() - start
    c1, c5, loss, n, skipped = totals.tolist()
    n = max(n, 1)
    return dict(top1=100 * c1 / n, top5=100 * c5 / n, loss=loss / n, count=int(n), img_per_s=n / elapsed,
                skipped=int(skipped), confusion=None if confusion is None else confusion.cpu())


def _sum_over_ranks(confusion: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """A confusion matrix summed over the ranks, one of which may have seen no batch (its matrix None)."""
    size = torch.tensor([0 if confusion is None else confusion.shape[0]], device=device)
    dist.all_reduce(size, op=dist.ReduceOp.MAX)
    classes = int(size.item())
    if classes == 0:
        return None
    if confusion is None:
        confusion = torch.zeros(classes, classes, dtype=torch.int64, device=device)
    dist.all_reduce(confusion)
    return confusion


def mask_noise(
        batch_index: int,
        batch_size: int,
        num_patches: int,
        seed: int = 0,
) -> torch.Tensor:
    """The fixed masking noise ``[batch_size, num_patches]`` of validation batch ``batch_index`` (CPU
    generator seeded from ``('mae_val', seed, batch_index)``), so every evaluation masks the same patches."""
    g = torch.Generator().manual_seed(derive_seed('mae_val', seed, batch_index))
    return torch.rand(batch_size, num_patches, generator=g)


@torch.no_grad()
def evaluate_mae(
        model: torch.nn.Module,
        loader: Iterable,
        device: Union[str, torch.device],
        preprocess: Callable,
        autocast_dtype: Optional[torch.dtype] = None,
        seed: int = 0,
) -> dict:
    """Mean MAE reconstruction loss of ``model`` (a
    [`tkvision.models.mae.MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder], possibly DDP / compiled) over
    ``loader``, with the same masks at every call (`mask_noise`), weighted by images and reduced over ranks.

    Returns:
        ``dict(loss, count, img_per_s, skipped)``.
    """
    inner = unwrap_model(model)
    num_patches = inner.grid_size[0] * inner.grid_size[1]
    model.eval()
    device = torch.device(device)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss_sum, count, skipped
    start = time.perf_counter()
    dtype = autocast_dtype
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
