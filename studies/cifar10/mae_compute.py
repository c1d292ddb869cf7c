"""MAE on CIFAR-10 (JPEG copy) at equal training compute: what each arm of ``studies/cifar10/configs/mae/`` costs.

The question of docs/mae.md asked on natural images: does MAE pretraining (``pretrain.yaml``, no labels) followed
by fine-tuning (``finetune.yaml``) beat the same model trained from scratch (``scratch.yaml``) for the training
compute of the two together? The accuracy side is the comparison report of the fine-tuned and the scratch runs
(``python -m studies.comparison.comparison``, docs/cifar10.md gives the command); this module writes the compute
side, which that report cannot count (it knows classifiers only):

``python -m studies.cifar10.mae_compute --report-dir docs/cifar10/mae`` writes ``compute.csv``: one row per
arm (``pretrain``, ``finetune``, ``pretrain + finetune``, ``scratch``) with its epochs, training images per epoch,
forward + backward GFLOPs per training image (``FlopCounterMode``: the MAE encoder on the visible patches and the
decoder on all of them; the classifier on all patches), the run's training TFLOPs and its ratio to the scratch
arm's. The figures come from the configs alone, so ``tests/test_docs.py`` re-derives the file. With ``--out
runs/cifar10_mae`` (the sweep's folder) it also keeps the pretraining run's ``metrics.csv`` (its validation
reconstruction loss per epoch) and its record (``result.json``: machine, commit, minutes) as
``pretrain_metrics.csv`` and ``pretrain_result.json`` beside it: ``runs/`` does not travel.
"""
import argparse
import csv
import os
import shutil
import sys

from studies.growth.growth_experiment import train_flops_per_image
from studies.growth.precondition import mae_flops_per_image
from tkvision.cli import run_cli
from tkvision.data import split_size
from tkvision.engine.config import load_config, resolve_run_config, section
from tkvision.experiments.points import point_dir
from tkvision.utils.errors import UsageError
from tkvision.utils.files import atomic_write

__all__ = ['CONFIGS', 'compute_rows', 'write_compute', 'keep_pretraining_metrics', 'main']

#: The three arms' configs (the fine-tuning loads the pretraining run's encoder).
CONFIGS = {arm: f'studies/cifar10/configs/mae/{arm}.yaml' for arm in ('pretrain', 'finetune', 'scratch')}
#: Columns of ``compute.csv``.
COLUMNS = ['arm', 'epochs', 'images', 'train_gflops_per_image', 'train_tflops', 'compute_vs_scratch']


def _arm_row(arm: str, path: str) -> dict:
    cfg = resolve_run_config(load_config(path)).to_dict()
    flops = mae_flops_per_image(cfg) if cfg['task'] == 'mae' else train_flops_per_image(cfg)
    images = split_size(section(cfg, 'data'), 'train', cfg['seed'])
    return dict(arm=arm, epochs=cfg['epochs'], images=images, train_gflops_per_image=round(flops / 1e9, 4),
                train_tflops=round(flops * images * cfg['epochs'] / 1e12, 2))


def compute_rows(configs: dict = CONFIGS) -> list:
    """The rows of ``compute.csv`` for ``configs`` (``{'pretrain' | 'finetune' | 'scratch': config path}``): each
    arm, then ``pretrain + finetune`` (the MAE arm's total: its epochs and GFLOPs per image empty, its TFLOPs the
    sum of the rounded two), each with ``compute_vs_scratch`` (its TFLOPs over the scratch arm's, 3 decimals).

    Raises:
        KeyError: ``configs`` lacks one of the three arms. ConfigError: a config that does not load (named).
    """
    rows = {arm: _arm_row(arm, configs[arm]) for arm in ('pretrain', 'finetune', 'scratch')}
    total = dict(arm='pretrain + finetune', epochs='', images='', train_gflops_per_image='',
                 train_tflops=round(rows['pretrain']['train_tflops'] + rows['finetune']['train_tflops'], 2))
    ordered = [rows['pretrain'], rows['finetune'], total, rows['scratch']]
    return [dict(r, compute_vs_scratch=round(r['train_tflops'] / rows['scratch']['train_tflops'], 3))
            for r in ordered]


def write_compute(rows: list, report_dir: str) -> str:
    """``compute.csv`` of ``rows`` in ``report_dir``, written atomically; returns its path."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, 'compute.csv')

    def write(f):
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator='\n')
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)
    return path


def keep_pretraining_metrics(out: str, report_dir: str, seed: int = 0) -> list:
    """Copy the pretraining point's ``metrics.csv`` and ``result.json`` from the sweep folder ``out``
    (``<out>/pretrain/seed<seed>/``) to ``<report_dir>/pretrain_metrics.csv`` and ``pretrain_result.json``,
    each atomically; returns the new paths.

    Raises:
        UsageError: the point has not finished (its files named): run its sweep first. Nothing is copied then.
    """
    run = point_dir(out, CONFIGS['pretrain'], seed)
    names = {'metrics.csv': 'pretrain_metrics.csv', 'result.json': 'pretrain_result.json'}
    missing = [os.path.join(run, name) for name in names if not os.path.isfile(os.path.join(run, name))]
    if missing:
        raise UsageError(f'{" and ".join(missing)} do not exist: run the pretraining sweep into {out} first')
    kept = []
    for name, new in names.items():
        kept.append(os.path.join(report_dir, new))
        atomic_write(kept[-1], lambda tmp, name=name: shutil.copyfile(os.path.join(run, name), tmp))
    return kept


def main(argv=None) -> int:
    """``python -m studies.cifar10.mae_compute --report-dir DIR [--out SWEEP]``: write ``DIR/compute.csv`` from the
    configs (and keep the pretraining's record from ``SWEEP``); exit 0, or 2 with one line on a bad config or
    folder."""
    return run_cli(_mae, argv)


def _mae(argv) -> int:
    ap = argparse.ArgumentParser(description='The training compute of the CIFAR-10 MAE arms, from their configs.')
    ap.add_argument('--report-dir', default='docs/cifar10/mae', help='where compute.csv goes')
    ap.add_argument('--out', help='the sweep folder of the runs: also keep its pretraining metrics.csv')
    args = ap.parse_args(argv)
    print(write_compute(compute_rows(), args.report_dir))
    if args.out:
        print('\n'.join(keep_pretraining_metrics(args.out, args.report_dir)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
