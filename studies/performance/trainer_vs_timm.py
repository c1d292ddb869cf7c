#!/usr/bin/env python
"""Our trainer against timm's ``train.py``: same model, data, augmentation, batch,
optimizer, schedule and epochs, run one after the other on this machine; img/s of training and the
final validation top-1 of each, and our img/s as a ratio to timm's.

``python -m studies.performance.trainer_vs_timm --timm-dir path/to/pytorch-image-models --repeats 3
--out docs/bench/trainer_vs_timm``

The data is Fashion-MNIST written as a 32 px JPEG folder (600 training / 100 validation images per
class, ``tools/make_subset.py --src fashion-mnist``); the models (``--models``) a TokenFormer of the quick
recipe's width (d 96, 6 blocks, 96 tokens, 8 px patches) and timm's ViT of the same width, depth and
heads. Augmentation on both sides: RandomResizedCrop (0.08-1), flip 0.5, no colour jitter, no erasing,
no mixup; AdamW lr 2e-3, weight decay 0.05, cosine without warmup, label smoothing 0.1, batch 128, one
loader worker. timm's script runs through ``python -m tkvision.cli.timm_script``. img/s: ours, the
epoch's training images over its training seconds (``metrics.csv``); timm's, the running average its
log prints at each epoch's last batch; the figure is the mean over epochs. Each of ``--repeats`` rounds
runs every (model, trainer) once, the trainers' order alternating between rounds; a row's img/s is the
median over rounds, a model's ratio the median of its rounds' paired ratios (the VM's speed drifts
between minutes, so only pairs taken side by side compare). Time alone: the load beside it changes both.
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
from tkvision.utils.files import atomic_write

WIDTH = dict(img_size=32, patch_size=8, embed_dim=96, depth=6, num_heads=3)
#: model -> its keyword arguments, the same on both sides
MODELS = {'tokenformer_vit_ti16': dict(WIDTH, num_tokens=96), 'vit_tiny_patch16_224': WIDTH}


def ours(model, data, out, epochs, threads) -> dict:
    kwargs = '{' + ', '.join(f'{k}: {v}' for k, v in dict(MODELS[model], num_classes=10).items()) + '}'
    cmd = [sys.executable, 'tools/train.py', '--model', model, '--model_kwargs', kwargs,
           '--dataset', 'folder', '--data-dir', data, '--val_split_fraction', '0', '--img_size', '32',
           '--crop_pct', '1.0', '--rrc_scale', '[0.08, 1.0]', '--hflip', '0.5', '--batch_size', '128',
           '--epochs', str(epochs), '--opt', 'adamw', '--lr', '2e-3', '--weight_decay', '0.05', '--sched', 'cosine',
           '--warmup_epochs', '0', '--smoothing', '0.1', '--reprob', '0', '--num_workers', '1',
           '--threads', str(threads), '--output', out, '--progress', 'false']
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    with open(os.path.join(out, 'metrics.csv')) as f:
        rows = list(csv.DictReader(f))
    return dict(img_per_s=sum(float(r['img_per_s']) for r in rows) / len(rows), top1=float(rows[-1]['top1']),
                command=portable_command(cmd[1:]))


def timms(model, timm_dir, data, out, epochs, threads) -> dict:
    args = [*(f'{k}={v}' for k, v in MODELS[model].items())]
    cmd = [sys.executable, '-m', 'tkvision.cli.timm_script', os.path.join(timm_dir, 'train.py'), '--data-dir', data,
           '--train-split', 'train', '--val-split', 'val', '--model', model, '--model-kwargs', *args,
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
    return dict(img_per_s=sum(rates.values()) / len(rates), top1=float(rows[-1]['eval_top1']),
                command=' '.join(cmd[1:]))


TRAINERS = {'tkvision (tkvision-train)': ours, "timm's train.py": timms}


def run_rounds(models, timm_dir, data, epochs, threads, repeats, log=print) -> dict:
    """``{(model, trainer): [result of each round]}``, trainers alternating their order between rounds."""
    runs = {(m, t): [] for m in models for t in TRAINERS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for model in models:
                order = list(TRAINERS) if r % 2 == 0 else list(TRAINERS)[::-1]
                for trainer in order:
                    out = os.path.join(tmp, f'{model}_{r}_{len(runs[model, trainer])}_{trainer[:4]}')
                    args = (model, data, out) if TRAINERS[trainer] is ours else (model, timm_dir, data, out)
                    runs[model, trainer].append(TRAINERS[trainer](*args, epochs, threads))
                    log(f"[round {r + 1}/{repeats}] {model} {trainer}: {runs[model, trainer][-1]['img_per_s']:.0f} "
                        f"img/s")
    return runs


def summarize(runs: dict) -> tuple:
    """Rows (model, trainer, median img/s, each round's img/s, last round's top-1, command) and one ratio
    per model: the median over rounds of our img/s over timm's in the same round."""
    rows, ratios = [], []
    for (model, trainer), results in runs.items():
        rates = [r['img_per_s'] for r in results]
        rows.append(dict(model=model, trainer=trainer, img_per_s=statistics.median(rates),
                         img_per_s_runs=' '.join(f'{v:.0f}' for v in rates), top1=results[-1]['top1'],
                         command=results[-1]['command']))
    for model in dict.fromkeys(m for m, _ in runs):
        ours_, timm_ = (runs[model, t] for t in TRAINERS)
        paired = [a['img_per_s'] / b['img_per_s'] for a, b in zip(ours_, timm_)]
        ratios.append(dict(model=model, ratio=statistics.median(paired),
                           ratio_runs=' '.join(f'{v:.3f}' for v in paired)))
    return rows, ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument('--timm-dir', required=True, help="a checkout of timm's repository (its train.py)")
    ap.add_argument('--data', default='runs/fashion_mnist_jpeg32', help='the JPEG folder (written if missing)')
    ap.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--repeats', type=int, default=3, help='rounds; medians are reported')
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--out', default='docs/bench/trainer_vs_timm')
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        write_image_folder(args.data, 32, 600, 100)
    runs = run_rounds(args.models, os.path.abspath(args.timm_dir), os.path.abspath(args.data), args.epochs,
                      args.threads, args.repeats)
    rows, ratios = summarize(runs)
    result = dict(machine=machine_info(torch.device('cpu')), date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                  command='python -m studies.performance.trainer_vs_timm '
                          + ' '.join(argv if argv is not None else sys.argv[1:]),
                  rows=rows, ratios=ratios)
    atomic_write(args.out + '.json', lambda f: json.dump(result, f, indent=1), text=True)
    for r in ratios:
        print(f"{r['model']}: tkvision / timm img/s {r['ratio']:.3f} (rounds {r['ratio_runs']})")
    print(f'wrote {args.out}.json')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
