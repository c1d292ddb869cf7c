#!/usr/bin/env python
"""The NaFlex TokenFormer against timm's NaFlexViT, both trained by timm's own ``train.py --naflex-loader``
one command per (model, seed) through ``python -m tkvision.cli.timm_script``, on Fashion-MNIST
written at mixed resolutions and aspect ratios.

``python -m studies.naflex.naflex_timm_train --timm-dir path/to/pytorch-image-models --seeds 0 1 2
--out docs/naflex/timm_train``

Data: ``tools/make_subset.py --src fashion-mnist --sizes 32x32 48x96 96x48 64x64 --train-per-class 200
--val-per-class 50`` (2,000 training images, 500 held-out images from Fashion-MNIST's test set; written if
missing). Models of equal width, depth and heads (d 96, 6 blocks, 3 heads): ``naflexvit_tokenformer_ti16``
with 72 tokens (the † rule) and ``naflexvit_base_patch16_gap`` with ``enable_patch_interpolator=True`` (without
it timm's model cannot take the loader's 8 px patches). Recipe, the same for both: sequence lengths 16 / 24 /
36 patches, patch sizes 8 and 16 drawn per batch, batch 32 at the longest sequence, AdamW 2e-3, weight decay
0.05, one warmup epoch, cosine, label smoothing 0.1, no mixup or erasing, 10 epochs, one loader worker, CPU.
Nothing is chosen on the held-out images: the table reports the last epoch's top-1 (and the best, for what
it is worth), means and sample std over seeds. Writes ``<out>.json``: one row per run, per-model means,
machine, date, command.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from studies import ROOT, portable_command
from tkvision.cli import run_cli
from tkvision.data.fashion_mnist import write_image_folder
from tkvision.experiments.benchmark import machine_info
from tkvision.experiments.sweep import mean_std
from tkvision.utils.files import atomic_write

SIZES = [(32, 32), (48, 96), (96, 48), (64, 64)]
WIDTH = ['embed_dim=96', 'depth=6', 'num_heads=3']
#: model -> its --model-kwargs
MODELS = {'naflexvit_tokenformer_ti16': WIDTH + ['num_tokens=72'],
          'naflexvit_base_patch16_gap': WIDTH + ['enable_patch_interpolator=True']}
RECIPE = ['--num-classes', '10', '--naflex-loader', '--naflex-train-seq-lens', '16', '24', '36', '--naflex-max-seq-len',
          '36', '--naflex-patch-sizes', '8', '16', '-b', '32', '--opt', 'adamw', '--lr', '2e-3', '--weight-decay',
          '0.05',
          '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--sched', 'cosine', '--smoothing', '0.1', '--reprob', '0',
          '--mixup', '0', '--cutmix', '0', '-j', '1', '--device', 'cpu', '--log-interval', '20']


def run_one(timm_dir, data, model, seed, epochs, out) -> dict:
    """Train ``model`` with timm's ``train.py --naflex-loader``; its parameters, last and best held-out top-1
    and its mean training img/s (the rate its log prints at each epoch's last batch)."""
    cmd = [sys.executable, '-m', 'tkvision.cli.timm_script', os.path.join(timm_dir, 'train.py'), '--data-dir', data,
           '--train-split', 'train', '--val-split', 'val', '--model', model, '--model-kwargs', *MODELS[model], *RECIPE,
           '--epochs', str(epochs), '--seed', str(seed), '--output', out]
    log = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    text = log.stdout + log.stderr
    params = int(re.search(r'param count:\s*(\d+)', text).group(1))
    rates = {}
    for m in re.finditer(r'Train: (\d+) \[.*?\(\d+%\)\].*?\(\d+\.\d+s,\s*([\d.]+)/s\)', text):
        rates[int(m.group(1))] = float(m.group(2))  # the last line of each epoch wins
    (summary,) = [os.path.join(d, 'summary.csv') for d, _, files in os.walk(out) if 'summary.csv' in files]
    with open(summary) as f:
        top1 = [float(r['eval_top1']) for r in csv.DictReader(f)]
    return dict(model=model, seed=seed, params=params, epochs=epochs, top1_last=top1[-1], top1_best=max(top1),
                img_per_s=round(sum(rates.values()) / max(len(rates), 1), 1),
                command='python ' + portable_command(cmd[1:]).replace(out, '<out>'))


def means(rows: list) -> list:
    """Per model: seeds, parameters, mean and sample std of the last and best top-1, mean img/s."""
    out = []
    for model in dict.fromkeys(r['model'] for r in rows):
        mine = [r for r in rows if r['model'] == model]
        row = dict(model=model, seeds=len(mine), params=mine[0]['params'])
        for key in ('top1_last', 'top1_best'):
            row[key + '_mean'], row[key + '_std'] = mean_std([r[key] for r in mine], 2)
        row['img_per_s'] = round(statistics.mean(r['img_per_s'] for r in mine), 1)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument('--timm-dir', required=True, help="a checkout of timm's repository (its train.py)")
    ap.add_argument('--data', default='runs/fashion_mnist_mixed',
                    help='the mixed-size JPEG folder (written if missing)')
    ap.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--epochs', type=int, default=10)
    ap.add_argument('--out', default='docs/naflex/timm_train')
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        write_image_folder(args.data, train_per_class=200, val_per_class=50, sizes=SIZES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for model in args.models:
                rows.append(run_one(os.path.abspath(args.timm_dir), os.path.abspath(args.data), model, seed,
                                    args.epochs, os.path.join(tmp, f'{model}_{seed}')))
                print(f"{model} seed {seed}: top-1 {rows[-1]['top1_last']:.1f} (best {rows[-1]['top1_best']:.1f}), "
                      f"{rows[-1]['img_per_s']:.0f} img/s")
    result = dict(machine=machine_info(torch.device('cpu')), date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                  command=portable_command(['python', '-m', 'studies.naflex.naflex_timm_train',
                                            *(argv if argv is not None else sys.argv[1:])]),
                  runs=rows, models=means(rows))
    atomic_write(args.out + '.json', lambda f: json.dump(result, f, indent=1), text=True)
    print(f'wrote {args.out}.json')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
