#!/usr/bin/env python
"""Our trainer against timm's ``train.py`` (issue 26, item 5): same model, data, augmentation, batch,
optimizer, schedule and epochs, run one after the other on this machine; img/s of training and the
final validation top-1 of each, as a ratio.

``python tools/trainer_vs_timm.py --timm-dir path/to/pytorch-image-models --out docs/bench/trainer_vs_timm``

The data is Fashion-MNIST written as a 32 px JPEG folder (600 training / 100 validation images per
class, ``tools/make_subset.py --src fashion-mnist``); the model a TokenFormer of the quick recipe's
width (d 96, 6 blocks, 96 tokens, 8 px patches). Augmentation on both sides: RandomResizedCrop
(0.08-1), flip 0.5, no colour jitter, no erasing, no mixup; AdamW lr 2e-3, weight decay 0.05, cosine
without warmup, label smoothing 0.1, batch 128, one loader worker. timm's script runs through
``python -m tkvision.cli.timm_script``. img/s: ours, the epoch's training images over its training
seconds (``metrics.csv``); timm's, the running average its log prints at each epoch's last batch;
the figure is the mean over epochs. Time alone: the load beside it changes both.
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tkvision.data.fashion_mnist import write_image_folder  # noqa: E402
from tkvision.experiments.benchmark import machine_info  # noqa: E402

KWARGS = dict(img_size=32, patch_size=8, embed_dim=96, depth=6, num_heads=3, num_tokens=96)


def ours(data, out, epochs, threads) -> dict:
    kwargs = '{' + ', '.join(f'{k}: {v}' for k, v in dict(KWARGS, num_classes=10).items()) + '}'
    cmd = [sys.executable, 'tools/train.py', '--model', 'tokenformer_vit_ti16', '--model_kwargs', kwargs,
           '--dataset', 'folder', '--data-dir', data, '--val_split_fraction', '0', '--img_size', '32',
           '--crop_pct', '1.0', '--rrc_scale', '[0.08, 1.0]', '--hflip', '0.5', '--batch_size', '128',
           '--epochs', str(epochs), '--opt', 'adamw', '--lr', '2e-3', '--weight_decay', '0.05', '--sched', 'cosine',
           '--warmup_epochs', '0', '--smoothing', '0.1', '--reprob', '0', '--num_workers', '1',
           '--threads', str(threads), '--output', out, '--progress', 'false']
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    with open(os.path.join(out, 'metrics.csv')) as f:
        rows = list(csv.DictReader(f))
    return dict(img_per_s=sum(float(r['img_per_s']) for r in rows) / len(rows), top1=float(rows[-1]['top1']),
                command=' '.join(cmd[1:]))


def timms(timm_dir, data, out, epochs, threads) -> dict:
    args = [*(f'{k}={v}' for k, v in KWARGS.items())]
    cmd = [sys.executable, '-m', 'tkvision.cli.timm_script', os.path.join(timm_dir, 'train.py'), '--data-dir', data,
           '--train-split', 'train', '--val-split', 'val', '--model', 'tokenformer_vit_ti16', '--model-kwargs', *args,
           '--num-classes', '10', '--input-size', '3', '32', '32', '--crop-pct', '1.0', '-b', '128',
           '--epochs', str(epochs), '--opt', 'adamw', '--lr', '2e-3', '--weight-decay', '0.05', '--sched', 'cosine',
           '--warmup-epochs', '0', '--smoothing', '0.1', '--scale', '0.08', '1', '--hflip', '0.5',
           '--color-jitter', '0', '--reprob', '0', '--mixup', '0', '--cutmix', '0', '-j', '1', '--no-prefetcher',
           '--device', 'cpu', '--output', out]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    log = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, env=env)
    text = log.stdout + log.stderr
    rates = {}
    for m in re.finditer(r'Train: (\d+) \[.*?\(\d+%\)\].*?\(\d+\.\d+s,\s*([\d.]+)/s\)', text):
        rates[int(m.group(1))] = float(m.group(2))  # the last line of each epoch wins
    (summary,) = [os.path.join(d, 'summary.csv') for d, _, files in os.walk(out) if 'summary.csv' in files]
    with open(summary) as f:
        rows = list(csv.DictReader(f))
    return dict(img_per_s=sum(rates.values()) / len(rates), top1=float(rows[-1]['eval_top1']), command=' '.join(cmd[1:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--timm-dir', required=True, help="a checkout of timm's repository (its train.py)")
    ap.add_argument('--data', default='runs/fashion_mnist_jpeg32', help='the JPEG folder (written if missing)')
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--out', default='docs/bench/trainer_vs_timm')
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        write_image_folder(args.data, 32, 600, 100)
    with tempfile.TemporaryDirectory() as tmp:
        a = ours(os.path.abspath(args.data), os.path.join(tmp, 'ours'), args.epochs, args.threads)
        b = timms(os.path.abspath(args.timm_dir), os.path.abspath(args.data), os.path.join(tmp, 'timm'), args.epochs,
                  args.threads)
    result = dict(machine=machine_info(torch.device('cpu')), date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                  command='python tools/trainer_vs_timm.py ' + ' '.join(argv if argv is not None else sys.argv[1:]),
                  rows=[dict(trainer='tkvision (tools/train.py)', **a), dict(trainer="timm's train.py", **b)],
                  ratio=a['img_per_s'] / b['img_per_s'])
    with open(args.out + '.json', 'w') as f:
        json.dump(result, f, indent=1)
    print(f"tkvision {a['img_per_s']:.0f} img/s (top-1 {a['top1']:.2f}%), timm {b['img_per_s']:.0f} img/s "
          f"(top-1 {b['top1']:.2f}%): ratio {result['ratio']:.3f}; wrote {args.out}.json")
    return 0


if __name__ == '__main__':
    sys.exit(main())
