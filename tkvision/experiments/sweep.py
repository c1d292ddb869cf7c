"""Ablation sweeps: run configs x seeds, resumably, and tabulate the results (paper Tables 4-5 style).

``python tools/sweep.py configs/ablations/fashion_mnist/*.yaml --seeds 0 1 2 --out runs/ablations``

Each (config, seed) point trains into ``<out>/<config name>/seed<k>/`` with the training code of
`tkvision.engine.trainer`; a point whose ``result.json`` exists is skipped (resumable), a point that
fails is recorded with its error and the sweep goes on. ``--launcher torchrun --nproc-per-node 8``
runs each point as its own ``torchrun`` job; ``--print-commands`` only prints the commands (for a
cluster scheduler). The table (``results.md``, ``results.csv``) has mean ± std top-1 over seeds,
parameters, img/s and time per point; ``results.png`` is a bar chart with the spread.
"""
import csv
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import traceback
from typing import Callable, Optional, Sequence

import torch

from ..engine.checkpoint import LAST_CHECKPOINT, METRICS_FILE
from ..engine.config import load_config
from ..engine.plotting import plt
from ..engine.trainer import train
from ..utils.errors import EXIT_PREEMPTED, Preempted
from ..utils.files import atomic_write

__all__ = ['run_sweep', 'summarize', 'expand_configs', 'point_dir', 'mean_std', 'plus_minus']


def point_dir(out: str, config: str, seed: int) -> str:
    """``<out>/<config name>/seed<k>``: where a point trains and writes ``result.json``."""
    return os.path.join(out, os.path.splitext(os.path.basename(config))[0], f'seed{seed}')


def _prepare_point_dir(run_dir) -> list:
    """``['--resume']`` when an interrupted point left a checkpoint to continue from; a point that
    failed before its first checkpoint is started again from an empty folder (the trainer never
    writes into a folder that holds another run)."""
    if os.path.isfile(os.path.join(run_dir, LAST_CHECKPOINT)):
        return ['--resume']
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    return []


def _command(config, seed, run_dir, launcher, nproc, extra):
    args = ['tools/train.py', '--config', config, '--seed', str(seed), '--output', run_dir, '--progress', 'false',
            *extra]
    if launcher == 'torchrun':
        return ['torchrun', f'--nproc_per_node={nproc}', *args]
    return [sys.executable, *args]


def _timing(rows: list) -> dict:
    """``img_per_s`` (mean over epochs) and ``minutes`` of a finished run from its ``metrics.csv`` rows:
    the last row's ``elapsed_minutes``, the whole run's wall time across resumes
    (`elapsed_seconds`); rows written before that column have
    the sum of the epochs' training time (``epoch_time``, evaluation not counted)."""
    last = rows[-1].get('elapsed_minutes')
    minutes = float(last) if last not in (None, '') else sum(float(r['epoch_time']) for r in rows) / 60
    return dict(img_per_s=statistics.mean(float(r['img_per_s']) for r in rows), minutes=minutes)


def _run_point(config, seed, run_dir, extra):
    """Train one point in this process; returns the result record."""
    cfg = load_config(config, ['--seed', str(seed), '--output', run_dir, '--progress', 'false', *extra])
    res = train(cfg, resume=bool(_prepare_point_dir(run_dir)))
    return dict(top1=res['top1'], best_top1=res['best_top1'], test_top1=res['test_top1'],
                params=sum(p.numel() for p in res['model'].parameters()), **_timing(res['history']),
                threads=torch.get_num_threads())


def run_sweep(
        configs: Sequence[str],
        seeds: Sequence[int],
        out: str,
        launcher: str = 'local',
        nproc: int = 1,
        print_commands: bool = False,
        extra: Sequence[str] = (),
        log: Callable[..., None] = print,
) -> list:
    """Run every (config, seed) not yet finished; returns all records (finished, new, failed).

    A record: ``config, seed, status ('ok' | 'failed'), top1, best_top1, test_top1, params, img_per_s,
    minutes, error``: ``top1`` / ``best_top1`` on the validation split, ``test_top1`` on the test split
    (evaluated once, at the end; None when the dataset has none: `tkvision.data.has_test_split`);
    ``img_per_s`` and ``minutes`` (the whole run's, a resumed one's parts summed): `_timing`.
    ``result.json`` in the point's folder marks it finished.

    Raises:
        Preempted: SIGTERM / SIGUSR1 stopped a point (its ``last.pth`` written; with ``launcher='torchrun'``,
            the point exited with `EXIT_PREEMPTED`): the sweep stops there, so a
            scheduler's preemption or a user's ``kill`` ends it, and rerunning resumes that point.
    """
    records = []
    for config in configs:
        for seed in seeds:
            run_dir = point_dir(out, config, seed)
            done = os.path.join(run_dir, 'result.json')
            name = os.path.splitext(os.path.basename(config))[0]
            if os.path.exists(done):
                with open(done) as f:
                    records.append(json.load(f))
                log(f'[skip] {name} seed {seed}: finished')
                continue
            cmd = _command(config, seed, run_dir, launcher, nproc, list(extra))
            if print_commands:
                print(shlex.join(cmd))
                continue
            log(f'[run ] {name} seed {seed} -> {run_dir}')
            rec = dict(config=name, seed=seed)
            try:
                if launcher == 'local':
                    rec.update(_run_point(config, seed, run_dir, list(extra)))
                else:
                    proc = subprocess.run(cmd + _prepare_point_dir(run_dir))
                    if proc.returncode == EXIT_PREEMPTED:
                        raise Preempted(f'{name} seed {seed} stopped by a signal; state saved under {run_dir}')
                    proc.check_returncode()
                    with open(os.path.join(run_dir, METRICS_FILE)) as f:
                        rows = list(csv.DictReader(f))
                    rec.update(top1=float(rows[-1]['top1']), test_top1=float(rows[-1].get('test_top1') or 'nan'),
                               best_top1=max(float(r['top1']) for r in rows if r.get('top1')), **_timing(rows))
                rec['status'] = 'ok'
                atomic_write(done, lambda f: json.dump(rec, f), text=True)
            except Preempted:
                log(f'[stop] {name} seed {seed}: preempted; rerun the same command to resume it')
                raise
            except Exception as e:  # a failed point is reported, not fatal
                rec.update(status='failed', error=f'{type(e).__name__}: {e}'.splitlines()[0][:200])
                log(f'[fail] {name} seed {seed}: {rec["error"]}')
                if os.environ.get('TKVISION_DEBUG') == '1':  # the traceback, as --debug shows a command's
                    traceback.print_exc()
            records.append(rec)
    return records


def _write_tables(rows: list, records: Sequence[dict], out: str):
    """``results_points.csv`` (every finished config and seed), ``results.csv`` and ``results.md`` in ``out``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'results_points.csv'), 'w',
              newline='') as f:  # every (config, seed): paired comparisons
        w = csv.DictWriter(f, fieldnames=['config', 'seed', 'top1', 'test_top1', 'minutes'], extrasaction='ignore')
        w.writeheader()
        w.writerows(r for r in records if r.get('status') == 'ok')
    with open(os.path.join(out, 'results.csv'), 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['config'])
        w.writeheader()
        w.writerows(rows)
    lines = ['| config | val top-1 (%) mean ± std | test top-1 (%) mean ± std | seeds | params | img/s | min/run | '
             'failed |',
             '|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['config']} | {plus_minus(r['top1_mean'], r['top1_std'])} | "
                     f"{plus_minus(r['test_top1_mean'], r['test_top1_std'])} | {r['seeds']} | {r['params']} | "
                     f"{r['img_per_s']:.0f} | {r['minutes']:.1f} | {r['failed']} |")
    with open(os.path.join(out, 'results.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def mean_std(values: list, digits: Optional[int] = None) -> tuple:
    """Mean and sample standard deviation (``statistics.stdev``, n - 1 in the denominator) of one figure over
    seeds, each rounded to ``digits`` decimals when given. One value has no spread: its std is None (an empty
    cell in a CSV, null in JSON, – in the docs' tables), not 0.0, which would claim seeds that agree. Every
    report of several seeds (sweep, comparison, growth, NaFlex) takes its spreads from here.

    Raises:
        statistics.StatisticsError: ``values`` is empty.
    """
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else None
    if digits is not None:
        mean, std = round(mean, digits), (None if std is None else round(std, digits))
    return mean, std


def plus_minus(mean: float, std: Sequence[float], spec: str = '.2f') -> str:
    """A report's ``'mean ± std'`` cell (``spec`` formats the mean, e.g. ``'+.2f'`` for a delta); ``'mean
    (one seed)'`` where `mean_std` gave no spread."""
    return f'{mean:{spec}} (one seed)' if std is None else f'{mean:{spec}} ± {std:.2f}'


def summarize(records: Sequence[dict], out: str, title: str = 'Ablation sweep') -> list:
    """Write ``results.csv`` / ``results.md`` / ``results.png`` (bars) / ``results_params.png`` (top-1 against
    parameters) and ``results_points.csv`` (every finished config and seed) in ``out``; returns one row per config:
    ``config, seeds, top1_mean, top1_std, test_top1_mean, test_top1_std, params, img_per_s, minutes, failed``
    (``top1``: the validation split's, on which a winner is chosen; ``test_top1``: reported beside it, nan
    without a test split)."""

    rows = []
    for config in dict.fromkeys(r['config'] for r in records):
        ok = [r for r in records if r['config'] == config and r.get('status') == 'ok']
        failed = [r for r in records if r['config'] == config and r.get('status') != 'ok']
        top1 = mean_std([r['top1'] for r in ok] or [float('nan')])
        test = mean_std([r['test_top1'] for r in ok if r.get('test_top1') is not None] or [float('nan')])
        rows.append(dict(config=config, seeds=' '.join(str(r['seed']) for r in ok),
                         top1_mean=top1[0], top1_std=top1[1], test_top1_mean=test[0], test_top1_std=test[1],
                         params=ok[0]['params'] if ok and 'params' in ok[0] else '',
                         img_per_s=statistics.mean(r['img_per_s'] for r in ok) if ok else float('nan'),
                         minutes=statistics.mean(r['minutes'] for r in ok) if ok else float('nan'),
                         failed='; '.join(f"seed {r['seed']}: {r.get('error', '?')}" for r in failed)))
    _write_tables(rows, records, out)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    ax.bar(range(len(rows)), [r['top1_mean'] for r in rows], yerr=[r['top1_std'] or 0 for r in rows], capsize=4,
           color='tab:blue')
    ax.set_xticks(range(len(rows)), [r['config'] for r in rows], rotation=30, ha='right')
    finite = [r['top1_mean'] for r in rows if r['top1_mean'] == r['top1_mean']]
    if finite:
        ax.set_ylim(min(finite) - 2, max(finite) + 1)
    ax.set(ylabel='validation top-1 (%)', title=title)
    ax.grid(axis='y', alpha=.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'results.png'), dpi=100)
    plt.close(fig)
    points = [r for r in rows if r['params'] != '' and r['top1_mean'] == r['top1_mean']]
    if points:  # accuracy against size: the parameter-efficiency view (RingFormer's Tables 2-3)
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for r in points:
            ax.errorbar(r['params'] / 1e3, r['top1_mean'], yerr=r['top1_std'] or 0, fmt='o', capsize=4)
            ax.annotate(r['config'], (r['params'] / 1e3, r['top1_mean']), textcoords='offset points', xytext=(5, 4),
                        fontsize=8)
        ax.set(xscale='log', xlabel='parameters (thousands, log scale)', ylabel='validation top-1 (%), mean ± std',
               title=title)
        ax.grid(alpha=.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, 'results_params.png'), dpi=100)
        plt.close(fig)
    return rows


def expand_configs(patterns: Sequence[str]) -> list:
    """Config files of the sweep: each pattern's glob matches (sorted), or the pattern itself; shared
    bases (``_base_*.yaml``, names starting with ``_``) are not points."""
    configs = [c for pattern in patterns for c in sorted(glob.glob(pattern)) or [pattern]]
    return [c for c in configs if not os.path.basename(c).startswith('_')]
