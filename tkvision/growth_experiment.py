"""Does growth pay? Grown vs from-scratch TokenFormers at equal compute (paper Fig. 3 / Table 7, small scale).

``python tools/growth_experiment.py --config configs/fashion_mnist/growth_experiment.yaml --out runs/growth``

Runs, all with the trainer of :mod:`tkvision.train` on the same data and seed:

(a) ``small``: the small model from scratch for ``epochs`` epochs;
(b) ``grown``: (a)'s final weights grown to the large token counts (zero keys: the same function,
    :func:`tkvision.growth.grow_checkpoint`) and trained ``grow_epochs`` more epochs;
(c) ``large``: the large model from scratch for ``epochs`` epochs;
(d) ``online``: the small model grown during training (``growth`` config section) to the large size in
    ``online_steps`` equal steps at the ends of the first epochs, for ``epochs`` epochs in all.

Compute is counted as training FLOPs: per-image FLOPs of one training step of the model at its size
at that epoch (``torch.utils.flop_counter``: forward + backward matmul-class FLOPs) times the images
seen. The report (``report.md``, ``results.json``) gives test top-1 and cumulative compute per run;
``accuracy_vs_compute.png`` plots top-1 against cumulative compute per epoch, in the style of Fig. 3.
"""
import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

from .benchmark import flop_counter
from .config import load_config, resolve_lr
from .growth import grow_checkpoint
from .runtime import build_model
from .train import train

__all__ = ['train_flops_per_image', 'run_experiment', 'main']


def train_flops_per_image(cfg: dict) -> float:
    """Forward + backward FLOPs of one training image for ``cfg``'s model (as counted by FlopCounterMode)."""
    model = build_model(cfg)
    size = cfg['model_kwargs'].get('img_size', cfg['img_size'] or 224)
    x = torch.randn(2, model.in_chans, size, size)
    with flop_counter() as fc:
        F.cross_entropy(model(x), torch.zeros(2, dtype=torch.long)).backward()
    return fc.get_total_flops() / 2


def _points(history, flops_by_tokens, offset=0.0, n_train=60000):
    """(cumulative training FLOPs, top-1) after each epoch, the FLOPs/image looked up by model size."""
    pts, total = [], offset
    for row in history:
        total += flops_by_tokens[int(row['tokens'])] * n_train
        if row.get('top1') not in (None, ''):
            pts.append((total, float(row['top1'])))
    return pts, total


def run_experiment(cfg_path: str, out: str, epochs: int, grow_epochs: int, large_tokens: dict, online_steps: int,
                   overrides=(), grow_lr_scale: float = 0.25, log=print) -> dict:
    """Run (a)-(d) of the module docstring; returns ``{run: dict(top1, compute, points)}`` and writes the report.

    ``grow_lr_scale`` scales the peak lr of (b)'s continued training: (a) ends annealed, and restarting
    at the full peak lr throws that away (measured: see docs/growth.md).
    """
    base = load_config(cfg_path, list(overrides))
    small_cfg = dict(copy.deepcopy(base), epochs=epochs, output=os.path.join(out, 'small'))
    large_kwargs = dict(base['model_kwargs'], **{f'num_tokens_{k}': v for k, v in large_tokens.items()})
    large_cfg = dict(copy.deepcopy(base), epochs=epochs, model_kwargs=large_kwargs, output=os.path.join(out, 'large'))
    n_train = base['train_subset'] or 60000
    flops = {}

    def note(cfg):
        from .growth import token_counts
        with torch.device('meta'):
            n = sum(token_counts(build_model(cfg)).values())
        flops.setdefault(n, train_flops_per_image(cfg))

    note(small_cfg)
    note(large_cfg)
    runs = {}
    res = train(small_cfg)
    pts, total = _points(res['history'], flops, n_train=n_train)
    runs['small'] = dict(top1=res['top1'], compute=total, points=pts, epochs=epochs)
    log(f"(a) small from scratch: {res['top1']:.2f}% after {total / 1e12:.1f} TFLOPs")

    grown_path = os.path.join(out, 'small_grown.safetensors')
    grow_checkpoint(os.path.join(out, 'small', 'last.safetensors'), small_cfg['model'], grown_path,
                    to=large_tokens, model_kwargs=dict(small_cfg['model_kwargs'], num_classes=res['model'].num_classes))
    grown_cfg = dict(copy.deepcopy(large_cfg), epochs=grow_epochs, init_from=grown_path,
                     lr=resolve_lr(base) * grow_lr_scale,
                     warmup_epochs=min(base['warmup_epochs'], grow_epochs / 4), output=os.path.join(out, 'grown'))
    res_g = train(grown_cfg)
    pts_g, total_g = _points(res_g['history'], flops, offset=total, n_train=n_train)
    runs['grown'] = dict(top1=res_g['top1'], compute=total_g, points=[runs['small']['points'][-1]] + pts_g,
                         epochs=f'{epochs} + {grow_epochs}')
    log(f"(b) grown + {grow_epochs} epochs: {res_g['top1']:.2f}% after {total_g / 1e12:.1f} TFLOPs")

    res_l = train(large_cfg)
    pts_l, total_l = _points(res_l['history'], flops, n_train=n_train)
    runs['large'] = dict(top1=res_l['top1'], compute=total_l, points=pts_l, epochs=epochs)
    log(f"(c) large from scratch: {res_l['top1']:.2f}% after {total_l / 1e12:.1f} TFLOPs")

    if online_steps:
        from .growth import token_counts
        with torch.device('meta'):
            small_counts = token_counts(build_model(small_cfg))
        n_steps = online_steps
        add = {k: (v - small_counts[k]) // n_steps for k, v in large_tokens.items()}
        online_cfg = dict(copy.deepcopy(small_cfg), output=os.path.join(out, 'online'),
                          growth=dict(base['growth'], every_epochs=1, until_epoch=n_steps + 1, add_tokens=add))
        for n in range(n_steps + 1):  # every intermediate size's FLOPs
            cfg_n = dict(copy.deepcopy(small_cfg), model_kwargs=dict(
                small_cfg['model_kwargs'], **{f'num_tokens_{k}': small_counts[k] + n * a for k, a in add.items()}))
            note(cfg_n)
        res_o = train(online_cfg)
        pts_o, total_o = _points(res_o['history'], flops, n_train=n_train)
        runs['online'] = dict(top1=res_o['top1'], compute=total_o, points=pts_o, epochs=epochs)
        log(f"(d) grown online in {online_steps} steps: {res_o['top1']:.2f}% after {total_o / 1e12:.1f} TFLOPs")
    _report(runs, out, flops)
    return runs


def _report(runs, out, flops):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    labels = {'small': '(a) small, from scratch', 'grown': '(b) small → grown (zero keys), continued',
              'large': '(c) large, from scratch', 'online': '(d) grown during training'}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, r in runs.items():
        xs, ys = zip(*r['points'])
        ax.plot([x / 1e12 for x in xs], ys, marker='o', label=labels[name])
    ax.set(xlabel='cumulative training compute (TFLOPs)', ylabel='test top-1 (%)',
           title='Fashion-MNIST: accuracy vs training compute')
    ax.grid(alpha=.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'accuracy_vs_compute.png'), dpi=100)
    plt.close(fig)
    lines = ['| run | epochs | test top-1 (%) | training compute (TFLOPs) |', '|---|---|---|---|']
    for name, r in runs.items():
        lines.append(f"| {labels[name]} | {r['epochs']} | {r['top1']:.2f} | {r['compute'] / 1e12:.1f} |")
    lines.append('')
    lines.append('FLOPs per training image by total parameter tokens: ' +
                 ', '.join(f'{n} tokens: {f / 1e6:.1f} MFLOPs' for n, f in sorted(flops.items())))
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with open(os.path.join(out, 'results.json'), 'w') as f:
        json.dump(dict(runs=runs, flops_per_image=flops), f, indent=1)


def main(argv=None):
    """``tools/growth_experiment.py``; see ``--help``."""
    ap = argparse.ArgumentParser(description='Grown vs from-scratch TokenFormers at equal compute.')
    ap.add_argument('--config', default='configs/fashion_mnist/growth_experiment.yaml', help='the small model recipe')
    ap.add_argument('--out', default='runs/growth_experiment')
    ap.add_argument('--epochs', type=int, default=4, help='epochs of (a), (c) and (d)')
    ap.add_argument('--grow-epochs', type=int, default=2, help='epochs of (b) after growing')
    ap.add_argument('--grow-lr-scale', type=float, default=0.25, help='peak lr of (b) relative to the recipe\'s')
    ap.add_argument('--large-tokens', default='{qkv: 64, proj: 64, ffn: 256}',
                    help='YAML mapping: token counts of the large model per kind')
    ap.add_argument('--online-steps', type=int, default=2,
                    help='(d) grows in this many equal steps, at the ends of the first epochs; 0 skips (d)')
    args, rest = ap.parse_known_args(argv)
    import yaml
    runs = run_experiment(args.config, args.out, args.epochs, args.grow_epochs, yaml.safe_load(args.large_tokens),
                          args.online_steps, rest, args.grow_lr_scale)
    with open(os.path.join(args.out, 'report.md')) as f:
        print(f.read())
    print(f'wrote {args.out}/report.md, results.json, accuracy_vs_compute.png')
    return 0 if runs else 1


if __name__ == '__main__':
    sys.exit(main())
