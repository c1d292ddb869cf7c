"""The NaFlex TokenFormer against NaFlexViT and the fixed-grid TokenFormer, trained by our trainer on
Fashion-MNIST at mixed resolutions and aspect ratios, evaluated at sequence lengths and aspect ratios none
of them trained on (``docs/naflex.md``, "Trained by our trainer").

``python -m studies.naflex.naflex_experiment --seeds 0 1 2 --out runs/naflex --report docs/naflex/ours.json``:

1. writes the data if missing (`write_image_folder`): the training folder
   (``SIZES``; its ``val/`` is the test split, the validation split is carved from ``train/``) and a folder
   of the same test images at aspect ratios 3:1 and 1:3 (``UNSEEN_SIZES``), which no model trains on;
2. trains every (config, seed) of ``studies/naflex/configs/`` not yet finished
   ([`run_sweep`][tkvision.experiments.sweep.run_sweep]): validation top-1 at the last epoch, test top-1 once;
3. evaluates each finished run's last weights on both test folders at every length of ``LENGTHS``
   (patches of 8 px): a NaFlex model through the NaFlex evaluation loader at that ``naflex_max_seq_len``
   (each image resized to fit, aspect kept), the fixed-grid one resized to the square of that many patches
   through ``set_input_size`` (its only way to change resolution): top-1 and img/s (batch 32, 2 threads);
4. writes ``--report``: one row per run and length, per-config means and sample stds over seeds, the
   machine, the date and the command.
"""
import argparse
import copy
import dataclasses
import datetime
import json
import math
import os
import statistics
import sys

import torch

from studies import portable_command
from tkvision.cli import run_cli
from tkvision.data import BatchPreprocessor, build_dataset, build_loader
from tkvision.data.fashion_mnist import write_image_folder
from tkvision.data.naflex import NaFlexPreprocessor, build_naflex_loader
from tkvision.engine.checkpoint import LAST_WEIGHTS, model_for_checkpoint
from tkvision.engine.config import load_config, section
from tkvision.engine.evaluate import evaluate
from tkvision.engine.run_data import naflex_patch_size
from tkvision.experiments.benchmark import machine_info
from tkvision.experiments.points import point_dir
from tkvision.experiments.sweep import expand_configs, mean_std, run_sweep
from tkvision.utils.files import atomic_write

__all__ = ['SIZES', 'UNSEEN_SIZES', 'LENGTHS', 'write_data', 'at_length', 'evaluate_run', 'summarize_rows',
           'run_experiment']

#: (height, width) in px of the training and test images (every class has each in equal share).
SIZES = [(32, 32), (48, 96), (96, 48), (64, 64)]
#: Aspect ratios no model trains on: the same test images at 3:1 and 1:3.
UNSEEN_SIZES = [(40, 120), (120, 40)]
#: Evaluation sequence lengths (patches of 8 px); training saw 16, 24 and 36 (the fixed grid 36).
LENGTHS = (16, 36, 64, 144)


def write_data(data_dir: str, unseen_dir: str, log=print):
    """The training folder (6,000 / 1,000 images at `SIZES`) and the unseen-aspect test folder (the same
    1,000 test images at `UNSEEN_SIZES`), each written only if missing."""
    if not os.path.isdir(data_dir):
        log(f'writing {data_dir}: {write_image_folder(data_dir, train_per_class=600, val_per_class=100, sizes=SIZES)}')
    if not os.path.isdir(unseen_dir):  # one training image per class: a reader needs every class folder filled
        log(f'writing {unseen_dir}: '
            f'{write_image_folder(unseen_dir, train_per_class=1, val_per_class=100, sizes=UNSEEN_SIZES)}')


def at_length(model, length: int):
    """A copy of the fixed-grid ``model`` taking ``length`` patches: square images of ``patch x sqrt(length)`` px
    (`set_input_size` resamples its position embedding). A copy, so that every length is resampled from
    the trained table and not from the last length's."""
    side = model.patch_embed.patch_size[0] * math.isqrt(length)
    resized = copy.deepcopy(model)
    resized.set_input_size(img_size=side)
    return resized


def _test_loader(cfg: dict, data_dir: str, length: int, model):
    """``(model, loader, preprocess)`` for the test images of ``data_dir`` (its ``val/``) at ``length`` patches."""
    data = dataclasses.replace(section(cfg, 'data'), data_dir=data_dir, val_split_fraction=0, batch_size=32,
                               num_workers=0, naflex_max_seq_len=length, val_subset=None)
    if cfg['naflex_loader']:
        ds = build_dataset(data, 'val', cfg['seed'])
        loader = build_naflex_loader(ds, data, False, cfg['seed'], naflex_patch_size(model, data))
        return model, loader, NaFlexPreprocessor('cpu')
    model = at_length(model, length)
    data = dataclasses.replace(data, img_size=model.patch_embed.img_size[0])
    ds = build_dataset(data, 'val', cfg['seed'])
    return model, build_loader(ds, data, False, cfg['seed']), BatchPreprocessor(cfg['mean'], cfg['std'], 'cpu')


def evaluate_run(run_dir: str, test_dirs: dict, lengths=LENGTHS) -> list:
    """Rows ``config, seed, test_set, length, top1, img_per_s`` of the run in ``run_dir`` (its
    ``config.yaml`` and ``last.safetensors``) on every folder of ``test_dirs`` (``{name: folder}``) at every
    length.

    Raises:
        FileNotFoundError: the run has no config or weights (it did not finish).
    """
    cfg = load_config(os.path.join(run_dir, 'config.yaml'))
    model, _ = model_for_checkpoint(cfg, os.path.join(run_dir, LAST_WEIGHTS))
    model.eval()
    rows = []
    for name, folder in test_dirs.items():
        for length in lengths:
            sized, loader, preprocess = _test_loader(cfg, folder, length, model)
            with torch.inference_mode():
                res = evaluate(sized, loader, torch.device('cpu'), preprocess)
            rows.append(dict(config=os.path.basename(os.path.dirname(run_dir)), seed=cfg['seed'], test_set=name,
                             length=length, top1=round(res['top1'], 2), img_per_s=round(res['img_per_s'], 1)))
    return rows


def summarize_rows(rows: list, keys=('config', 'test_set', 'length')) -> list:
    """Means and sample stds over seeds of ``top1`` and ``img_per_s`` for each ``keys`` group, in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, group in groups.items():
        top1 = mean_std([r['top1'] for r in group], 2)
        out.append(dict(zip(keys, key), seeds=len(group), top1_mean=top1[0], top1_std=top1[1],
                        img_per_s=round(statistics.mean(r['img_per_s'] for r in group), 1)))
    return out


def run_experiment(configs: list, seeds: list, out: str, report: str, data_dir: str, unseen_dir: str,
                   log=print) -> dict:
    """Steps 1-4 of the module docstring; returns the report written to ``report``."""
    write_data(data_dir, unseen_dir, log)
    records = [r for r in run_sweep(configs, seeds, out, extra=['--data-dir', data_dir],
                                    log=log) if r.get('status') == 'ok']
    training = [dict(config=r['config'], seed=r['seed'], params=r['params'], val_top1=r['top1'],
                     test_top1=r['test_top1'], train_img_per_s=round(r['img_per_s'], 1)) for r in records]
    rows = []
    for config in configs:
        for seed in seeds:
            run_dir = point_dir(out, config, seed)
            if os.path.isfile(os.path.join(run_dir, 'result.json')):
                log(f'[eval] {run_dir}')
                rows += evaluate_run(run_dir, {'mixed': data_dir, 'unseen_aspect': unseen_dir})
    result = dict(training=training, training_means=_training_means(training), lengths=rows,
                  length_means=summarize_rows(rows), machine=machine_info(torch.device('cpu')),
                  date=datetime.date.today().isoformat(),
                  command=portable_command(['python', '-m', 'studies.naflex.naflex_experiment', *sys.argv[1:]]))
    atomic_write(report, lambda f: json.dump(result, f, indent=1), text=True)
    return result


def _training_means(training: list) -> list:
    """Per config: parameters, seeds, validation and test top-1 (mean, sample std) and training img/s."""
    out = []
    for config in dict.fromkeys(r['config'] for r in training):
        group = [r for r in training if r['config'] == config]
        val, test = mean_std([r['val_top1'] for r in group], 2), mean_std([r['test_top1'] for r in group], 2)
        out.append(dict(config=config, params=group[0]['params'], seeds=len(group),
                        val_top1_mean=val[0], val_top1_std=val[1], test_top1_mean=test[0], test_top1_std=test[1],
                        train_img_per_s=round(statistics.mean(r['train_img_per_s'] for r in group), 1)))
    return out


def main(argv=None) -> int:
    """``python -m studies.naflex.naflex_experiment``; see ``--help``."""
    ap = argparse.ArgumentParser(description='The NaFlex TokenFormer against NaFlexViT and the fixed grid, trained '
                                 'by our trainer on mixed-size Fashion-MNIST, evaluated at unseen lengths and aspects.')
    ap.add_argument('configs', nargs='*', default=['studies/naflex/configs/*.yaml'],
                    help='config files (globs are expanded; _base_ files are skipped)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/naflex', help='where the runs train (finished points are skipped)')
    ap.add_argument('--report', default='docs/naflex/ours.json', help='the results file docs/naflex.md renders')
    ap.add_argument('--data-dir', default='runs/fashion_mnist_mixed_6k',
                    help="the configs' data_dir (written if missing)")
    ap.add_argument('--unseen-dir', default='runs/fashion_mnist_unseen_aspect', help='the 3:1 / 1:3 test images')
    args = ap.parse_args(argv)
    result = run_experiment(expand_configs(args.configs), args.seeds, args.out, args.report, args.data_dir,
                            args.unseen_dir)
    for row in result['training_means'] + result['length_means']:
        print(json.dumps(row))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
