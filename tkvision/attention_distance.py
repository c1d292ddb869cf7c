"""Mean attention distance (MAD) per head and layer, as in ViT (Dosovitskiy et al. 2020, Fig. 7) and
RingFormer's Fig. 3: for every query patch, the image-space distance to every key patch weighted by
the attention it gets, averaged over queries and images.

Works for ``tokenformer_vit_*``, ``ringformer_vit_*``, ``tokenformer_ring_vit_*`` (one row per level) and
timm's ``vit_*``: q and k are read by forward hooks on each attention module's ``q_norm`` / ``k_norm``
(Identity unless ``qk_norm``; timm's ViT has them too), and the attention is recomputed as
``softmax(q kᵀ / √head_dim)``. Prefix tokens (class, registers) are dropped from queries and keys and
each query's weights over the patches renormalised to sum to 1. Distances are in input pixels
(patch-grid distance times the patch size).

``tools/attention_distance.py --config C --checkpoint W --num-images 500 --out mad.png``.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

from .checkpoint import load_weights
from .config import load_config
from .data import BatchPreprocessor, build_dataset, build_loader, resolve_data_cfg, train_class_map
from .runtime import build_model, cli, setup_threads

__all__ = ['attention_maps', 'mean_attention_distance', 'plot_mad', 'main']


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
        ValueError: see :func:`attention_maps`.
    """
    inner = getattr(model, 'module', model)
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
    from .plotting import plt
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


def main(argv=None) -> int:
    """``tools/attention_distance.py`` / ``tkvision-attention-distance``: see ``--help``; user errors are one line."""
    return cli(_main, argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description='Mean attention distance per head and layer (ViT Fig. 7, RingFormer Fig. 3).')
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
        cfg = resolve_data_cfg(load_config(config, {'val_subset': args.num_images, 'batch_size': args.batch_size}))
        setup_threads(cfg)
        model = build_model(cfg)
        weights = args.checkpoint[i] if i < len(args.checkpoint) else os.path.join(cfg['output'], 'best.safetensors')
        load_weights(model, weights)
        device = torch.device('cpu')
        ds = build_dataset(cfg, 'val', 0, 1, class_to_idx=train_class_map(cfg))
        prep = BatchPreprocessor(cfg['mean'], cfg['std'], device)
        total, count = 0, 0
        for images, _, _ in build_loader(ds, cfg, train=False):
            if images is None:
                continue
            total = total + mean_attention_distance(model, prep(images)) * len(images)
            count += len(images)
        label = args.label[i] if i < len(args.label) else cfg['model']
        results[label] = total / count
        print(f'{label}: MAD per layer (mean over heads, px): ' + ' '.join(f'{v:.1f}' for v in results[label].mean(1)))
    plot_mad(results, args.out, title=f'Mean attention distance ({count} validation images)')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({k: v.round(4).tolist() for k, v in results.items()}, f, indent=1)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
