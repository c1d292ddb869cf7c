#!/usr/bin/env python
"""Summarise training runs from their stored ``metrics.csv`` into one results CSV; ``--check`` fails on a stale one.

``python tools/summarize_runs.py docs/fashion_mnist/runs.yaml`` reads the manifest (what each run was:
its command, machine, date, and the per-epoch ``metrics.csv`` the trainer wrote, copied under ``docs/``)
and writes ``docs/fashion_mnist/runs.csv`` beside it: one row per run, every figure computed from the
metrics file, so a table rendered from it (``tools/render_docs.py``) cannot drift from the run.
``--check`` (``tests/test_docs.py``, in CI) changes nothing and exits 1 when the CSV differs.

Derived columns (empty where the metrics file has no such column): ``epochs``; ``train_minutes`` (sum of
``epoch_time``: training only, not evaluation or start-up); ``wall_minutes`` (the last row's
``elapsed_minutes``: the trainer's own clock, start-up, evaluation and every resume included; empty for runs
whose metrics file predates that column: a wall time is never typed into the manifest);
``s_per_epoch_min`` / ``_max`` (epochs after
the first, which includes compilation); ``top1_final`` / ``top1_best`` (the per-epoch evaluation split:
validation for runs with a validation split, the test set for the older runs, as the manifest's
``eval_split`` says); ``ema_top1_final``; ``test_top1`` / ``ema_test_top1`` (the test set once, at the
end); ``val_loss_final`` / ``val_loss_min`` and ``val_loss_min_epoch`` (1-based).
"""
import argparse
import csv
import io
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from render_docs import write_generated  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST_KEYS = ('name', 'group', 'metrics', 'eval_split', 'command', 'machine', 'date')
DERIVED = ('epochs', 'train_minutes', 'wall_minutes', 's_per_epoch_min', 's_per_epoch_max', 'top1_final', 'top1_best',
           'ema_top1_final', 'test_top1', 'ema_test_top1', 'val_loss_final', 'val_loss_min', 'val_loss_min_epoch')


def _floats(rows: list, column: str) -> list:
    return [float(r[column]) for r in rows if r.get(column) not in (None, '')]


def derive(metrics_path: str) -> dict:
    """The figures of one run from its per-epoch ``metrics.csv`` (path relative to the repository root).

    Raises:
        FileNotFoundError: no such metrics file. ValueError: it has no rows or no ``epoch_time`` column.
    """
    with open(os.path.join(ROOT, metrics_path)) as f:
        rows = list(csv.DictReader(f))
    if not rows or 'epoch_time' not in rows[0]:
        raise ValueError(f'{metrics_path}: expected a trainer metrics.csv with an epoch_time column and one row per '
                         f'epoch')
    times, top1, loss = _floats(rows, 'epoch_time'), _floats(rows, 'top1'), _floats(rows, 'val_loss')
    later = times[1:] or times
    wall = _floats(rows, 'elapsed_minutes')
    out = dict(epochs=len(rows), train_minutes=round(sum(times) / 60, 1),
               wall_minutes=round(wall[-1], 1) if wall else '',
               s_per_epoch_min=round(min(later)), s_per_epoch_max=round(max(later)),
               top1_final=top1[-1] if top1 else '', top1_best=max(top1) if top1 else '')
    for column in ('ema_top1', 'test_top1', 'ema_test_top1'):
        values = _floats(rows, column)
        out[column if column != 'ema_top1' else 'ema_top1_final'] = values[-1] if values else ''
    if loss:
        best = min(range(len(loss)), key=loss.__getitem__)
        out.update(val_loss_final=round(loss[-1], 3), val_loss_min=round(loss[best], 3), val_loss_min_epoch=best + 1)
    else:
        out.update(val_loss_final='', val_loss_min='', val_loss_min_epoch='')
    return out


def summarize(manifest_path: str) -> str:
    """The results CSV (text) for a manifest: its keys, then the derived columns, one row per run.

    Raises:
        KeyError: a run in the manifest lacks one of ``MANIFEST_KEYS``, or types a derived figure (the message
            names run and key).
    """
    with open(manifest_path) as f:
        runs = yaml.safe_load(f)['runs']
    typed = [r.get('name', '?') for r in runs if set(r) & set(DERIVED)]
    if typed:
        raise KeyError(f'{manifest_path}: runs {typed} type a figure the metrics file gives ({", ".join(DERIVED)}): '
                       'remove it from the manifest')
    extra = sorted({k for r in runs for k in r} - set(MANIFEST_KEYS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*MANIFEST_KEYS, *extra, *DERIVED], lineterminator='\n')
    writer.writeheader()
    for run in runs:
        missing = [k for k in MANIFEST_KEYS if k not in run]
        if missing:
            raise KeyError(f"{manifest_path}: run {run.get('name', '?')!r} lacks {missing}: add them to the manifest")
        writer.writerow({**{k: run.get(k, '') for k in extra}, **{k: run[k] for k in MANIFEST_KEYS},
                         **derive(run['metrics'])})
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('manifests', nargs='*', default=['docs/fashion_mnist/runs.yaml', 'docs/mae/runs.yaml'],
                    help='run manifests (YAML, relative to the repository root); each writes <dir>/runs.csv')
    ap.add_argument('--check', action='store_true', help='change nothing; exit 1 if a runs.csv is stale')
    args = ap.parse_args(argv)
    outputs = {os.path.join(os.path.dirname(os.path.join(ROOT, m)), 'runs.csv'): summarize(os.path.join(ROOT, m))
               for m in args.manifests}
    return write_generated(outputs, args.check, 'python tools/summarize_runs.py')


if __name__ == '__main__':
    from tkvision.cli import run_cli  # the rule every command shares: a user error is one line, exit 2
    sys.exit(run_cli(main))
