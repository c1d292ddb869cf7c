"""Mean attention distance (MAD) per head and layer, as in ViT (Dosovitskiy et al. 2020, Fig. 7) and
RingFormer's Fig. 3: for every query patch, the image-space distance to every key patch weighted by
the attention it gets, averaged over queries and images.

Works for ``tokenformer_vit_*``, ``ringformer_vit_*``, ``tokenformer_ring_vit_*`` (one row per level) and
timm's ``vit_*``: q and k are read by forward hooks on each attention module's ``q_norm`` / ``k_norm``
(Identity unless ``qk_norm``; timm's ViT has them too), and the attention is recomputed as
``softmax(q kᵀ / √head_dim)``. Prefix tokens (class, registers) are dropped from queries and keys and
each query's weights over the patches renormalised to sum to 1. Distances are in input pixels
(patch-grid distance times the patch size).

``python -m studies.ringformer.attention_distance --config C --checkpoint W --num-images 500 --out mad.png``
(`tkvision.cli`).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from timm.utils import unwrap_model
from torch.utils.data import Subset

from tkvision.cli import run_cli
from tkvision.data import BatchPreprocessor, build_dataset, build_loader, train_class_map
from tkvision.engine.checkpoint import BEST_WEIGHTS, model_for_checkpoint
from tkvision.engine.config import load_config, section
from tkvision.engine.distributed import setup_threads
from tkvision.engine.plotting import plt
from tkvision.engine.config import resolve_run_config

__all__ = ['attention_maps', 'mean_attention_distance', 'dataset_mad', 'plot_mad']


def _layout(attn_module) -> str:
    """``'BNHD'`` for tkvision's attention (q_norm over ``[B, N, H, hd]``), ``'BHND'`` for timm's."""
    return 'BNHD' if type(attn_module).__module__.startswith('tkvision.') else 'BHND'


@torch.no_grad()
def attention_maps(model: torch.nn.Module, images: torch.Tensor) -> list:
    """Softmax attention of every attention call of one forward pass, in call order (layers, or
    levels of a recurrent model): a list of ``[B, heads, T, T]`` tensors (T tokens, prefix included).

    Raises:
        ValueError: the model has no attention module with ``q_norm`` and ``k_norm``.
    """
    qs, ks, handles = [], [], []
    for name, m in model.named_modules():
        if hasattr(m, 'q_norm') and hasattr(m, 'k_norm') and hasattr(m, 'num_heads'):
            layout = _layout(m)
            handles.append(m.q_norm.register_forward_hook(lambda mod, i, o, lay=layout: qs.append((o, lay))))
            handles.append(m.k_norm.register_forward_hook(lambda mod, i, o, lay=layout: ks.append((o, lay))))
    if not handles:
        raise ValueError(f'{type(model).__name__} has no attention module with q_norm / k_norm to read')
    try:
        model.eval()(images)
    finally:
        for h in handles:
            h.remove()
    maps = []
    for (q, lay), (k, _) in zip(qs, ks):
        if lay == 'BNHD':
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        maps.append(torch.softmax((q.float() @ k.float().transpose(-2, -1)) * q.shape[-1] ** -0.5, dim=-1))
    return maps


def mean_attention_distance(model: torch.nn.Module, images: torch.Tensor) -> np.ndarray:
    """MAD in pixels, ``[layers (or levels), heads]``, averaged over ``images [B, C, H, W]`` (normalised).

    Raises:
        ValueError: see `attention_maps`.
    """
    inner = unwrap_model(model)
    gh, gw = inner.patch_embed.grid_size
    p = inner.patch_embed.patch_size[0]
    n_prefix = inner.num_prefix_tokens
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing='ij')
    pos = torch.stack([ys.flatten(), xs.flatten()], dim=1).float() * p
    dist = torch.cdist(pos, pos)  # [N, N] pixels
    out = []
    for attn in attention_maps(model, images):
        a = attn[:, :, n_prefix:, n_prefix:].cpu()
        a = a / a.sum(dim=-1, keepdim=True)
        out.append((a * dist).sum(-1).mean(dim=(0, 2)).numpy())  # [heads]
    return np.stack(out)


def plot_mad(results: dict, path: str, title: str = 'Mean attention distance'):
    """Scatter of MAD (pixels) per head against layer / level, one panel per model (``{label: [L, H]}``)."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.6 * len(results), 3.4), squeeze=False, sharey=True)
    for ax, (label, mad) in zip(axes[0], results.items()):
        for h in range(mad.shape[1]):
            ax.scatter(np.arange(1, mad.shape[0] + 1), mad[:, h], s=14, label=f'head {h + 1}')
        ax.set(title=label, xlabel='layer / level')
        ax.grid(alpha=.3)
    axes[0, 0].set_ylabel('mean attention distance (px)')
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def dataset_mad(cfg: dict, checkpoint: str, num_images: int, batch_size: int) -> np.ndarray:
    """MAD ``[layers (or levels), heads]`` of the model of ``cfg`` with the weights of ``checkpoint``
    (grown to the checkpoint's size if its run grew:
    [`tkvision.engine.checkpoint.model_for_checkpoint`][tkvision.engine.checkpoint.model_for_checkpoint]), averaged
    over the first ``num_images`` validation images of ``cfg``'s dataset.

    Raises:
        FileNotFoundError, WeightsMismatchError: a missing checkpoint, or one of another model (named).
    """
    cfg = resolve_run_config(dict(cfg, batch_size=batch_size)).to_dict()
    setup_threads(section(cfg, 'process'))
    model, _ = model_for_checkpoint(cfg, checkpoint)
    data = section(cfg, 'data')
    ds = build_dataset(data, 'val', cfg['seed'], class_to_idx=train_class_map(data))
    ds = Subset(ds, range(min(num_images, len(ds))))  # the first images: any class mix will do for a distance
    prep = BatchPreprocessor(cfg['mean'], cfg['std'], torch.device('cpu'))
    total, count = 0, 0
    for images, _, _ in build_loader(ds, data, train=False, seed=cfg['seed']):
        if images is None:
            continue
        total = total + mean_attention_distance(model, prep(images)) * len(images)
        count += len(images)
    return total / max(count, 1)


def _attention_distance(argv) -> int:
    ap = argparse.ArgumentParser(description='Mean attention distance per head and layer (ViT Fig. 7, RingFormer Fig. '
                                             '3).')
    ap.add_argument('--config', action='append', required=True,
                    help='training config of a model (repeat for several models, one panel each)')
    ap.add_argument('--checkpoint', action='append', default=[],
                    help='weights for each --config, in order (default: <output>/best.safetensors of the config)')
    ap.add_argument('--label', action='append', default=[], help='panel title for each --config (default: model name)')
    ap.add_argument('--num-images', type=int, default=500)
    ap.add_argument('--batch-size', type=int, default=100)
    ap.add_argument('--out', required=True, help='output PNG')
    ap.add_argument('--json', help='also write the [layer, head] values as JSON')
    args = ap.parse_args(argv)
    results = {}
    for i, config in enumerate(args.config):
        cfg = load_config(config)
        weights = args.checkpoint[i] if i < len(args.checkpoint) else os.path.join(cfg['output'], BEST_WEIGHTS)
        label = args.label[i] if i < len(args.label) else cfg['model']
        results[label] = dataset_mad(cfg, weights, args.num_images, args.batch_size)
        print(f'{label}: MAD per layer (mean over heads, px): ' + ' '.join(f'{v:.1f}' for v in results[label].mean(1)))
    plot_mad(results, args.out, title=f'Mean attention distance ({args.num_images} validation images)')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({k: v.round(4).tolist() for k, v in results.items()}, f, indent=1)
    print(f'wrote {args.out}')
    return 0


def main(argv=None) -> int:
    """``python -m studies.ringformer.attention_distance``: see ``--help``; user errors are one line."""
    return run_cli(_attention_distance, argv)


if __name__ == '__main__':
    sys.exit(main())
