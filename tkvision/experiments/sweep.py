"""Ablation sweeps: configs x grid values x seeds, run where the user says, tabulated (paper Tables 4-5 style).

``tkvision-sweep configs/ablations/fashion_mnist/*.yaml --seeds 0 1 2 --out runs/ablations``
``tkvision-sweep configs/ablations/imagenet/norm_gelu_l2.yaml --grid score_norm=l2_norm_gelu,l1_norm_gelu,softmax
--executor slurm --gpus-per-node 8 --out runs/table4``

Each point (`tkvision.experiments.points.SweepPoint`) trains into ``<out>/<name>/seed<k>/`` through
`tkvision.experiments.points.PointJob`, in this process or as a submitit job
(`tkvision.experiments.launch`); a finished point (its ``result.json``) is never run again, a point that fails
is recorded with its error and the others go on. `collect` writes the table from whatever has finished
(``results.md``, ``results.csv``: mean ± std top-1 over seeds, parameters, img/s and time per point;
``results.png``, a bar chart with the spread); `summarize` is the table of given records.
"""
import csv
import glob
import os
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..engine.plotting import plt
from .launch import launch_points, read_manifest
from .launcher import Launcher
from ..utils.files import atomic_write
from .points import FAILED_FILE, RESULT_FILE, SweepPoint, read_record, sweep_points, with_provenance

__all__ = ['run_sweep', 'collect', 'point_records', 'summarize', 'expand_configs', 'mean_std', 'plus_minus']


def point_records(out: str, points: Sequence[SweepPoint]) -> List[Dict]:
    """The record of each point that has ended, in order: its ``result.json`` (``status: 'ok'``) or its
    ``failed.json`` (``status: 'failed'``, ``error``). A record: ``config`` (the point's name), ``seed``,
    ``status``, ``top1``, ``best_top1`` (validation), ``test_top1`` (the test split, once at the end; None
    without one), ``params``, ``img_per_s``, ``minutes`` (the whole run's, across resumes), ``threads``."""
    records = []
    for point in points:
        for name in (RESULT_FILE, FAILED_FILE):
            path = os.path.join(point.directory(out), name)
            if os.path.lexists(path):
                records.append(read_record(path, required=('config', 'seed')))
                break
    return records


def run_sweep(
        configs: Sequence[str],
        seeds: Sequence[int],
        out: str,
        *,
        grid: Sequence[str] = (),
        launcher: Optional[Launcher] = None,
        extra: Sequence[str] = (),
        log: Callable[..., None] = print,
) -> List[Dict]:
    """Run (or submit: ``launcher.executor == 'slurm'``) every point of ``configs`` x ``grid`` x ``seeds`` not yet
    finished; returns the records of the points that have ended (`point_records`).

    Args:
        configs: config files (or shipped recipe names).
        seeds: the seeds of each point.
        out: the sweep's folder.
        grid: ``key=v1,v2`` items (`tkvision.experiments.points.parse_grid`).
        launcher: where and how each point runs (default: this process, one point after another).
        extra: overrides for every point (``['--epochs', '3']``).
        log: where progress lines go.

    Raises:
        ConfigError: a bad grid item or launcher setting.
        RunError: another sweep command is submitting to ``out``.
        Preempted: (in this process) SIGTERM / SIGUSR1 / SIGUSR2 stopped a point, its ``last.pth`` written: the
            sweep stops there, and rerunning the same command resumes that point.
    """
    points = sweep_points(configs, seeds, grid)
    launch_points(points, out, launcher or Launcher(), extra, log)
    return point_records(out, points)


def collect(out: str, title: str = 'Ablation sweep') -> Tuple[List[Dict], int]:
    """The table of the sweep in ``out`` from whatever has ended (`summarize`); returns its rows and the number
    of points not ended yet.

    Raises:
        RunError: ``out`` holds no sweep.
    """
    points = [SweepPoint.from_dict(p) for p in read_manifest(out)['points']]
    records = point_records(out, points)
    return summarize(records, out, title), len(points) - len(records)


def _write_tables(rows: list, records: Sequence[dict], out: str):
    """``results_points.csv`` (every finished config and seed), ``results.csv`` and ``results.md`` in ``out``, each
    replaced atomically (a link planted in its place is replaced, never written through)."""
    os.makedirs(out, exist_ok=True)

    def points(f):  # every (config, seed): paired comparisons
        w = csv.DictWriter(f, fieldnames=['config', 'seed', 'top1', 'test_top1', 'val_loss', 'minutes', 'machine',
                                          'commit'], extrasaction='ignore')
        w.writeheader()  # machine and commit: what ran each seed ('unknown' for a point recorded without them)
        w.writerows(with_provenance(r) for r in records if r.get('status') == 'ok')
    atomic_write(os.path.join(out, 'results_points.csv'), points, text=True)

    def table(f):
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['config'])
        w.writeheader()
        w.writerows(rows)
    atomic_write(os.path.join(out, 'results.csv'), table, text=True)
    loss = any(r['val_loss_mean'] == r['val_loss_mean'] and r['top1_mean'] != r['top1_mean'] for r in rows)
    lines = ['| config | val top-1 (%) mean ± std | test top-1 (%) mean ± std | ' + ('val loss mean ± std | ' if loss
                                                                                  else '')
             + 'seed ids | params | img/s | training min per seed | failed |',
             '|---|---|---|---|---|---|---|---|' + ('---|' if loss else '')]
    for r in rows:
        cell = f"{plus_minus(r['val_loss_mean'], r['val_loss_std'], '.4f')} | " if loss else ''
        lines.append(f"| {r['config']} | {plus_minus(r['top1_mean'], r['top1_std'])} | "
                     f"{plus_minus(r['test_top1_mean'], r['test_top1_std'])} | {cell}{r['seed_ids']} | {r['params']} | "
                     f"{r['img_per_s']:.0f} | {r['minutes']:.1f} | {r['failed']} |")
    atomic_write(os.path.join(out, 'results.md'), lambda f: f.write('\n'.join(lines) + '\n'), text=True)


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
    return f'{mean:{spec}} (one seed)' if std is None else f"{mean:{spec}} ± {std:{spec.lstrip('+')}}"


def summarize(records: Sequence[dict], out: str, title: str = 'Ablation sweep') -> list:
    """Write ``results.csv`` / ``results.md`` / ``results.png`` (bars) / ``results_params.png`` (top-1 against
    parameters) and ``results_points.csv`` (every finished config and seed) in ``out``; returns one row per config:
    ``config, seeds, seed_ids, top1_mean, top1_std, test_top1_mean, test_top1_std, val_loss_mean, val_loss_std,
    params, img_per_s, minutes, failed`` (``seeds``: how many finished, as in every results file; ``seed_ids``: which,
    ``'0 1'``; ``top1``: the validation split's, on which a winner is chosen; ``test_top1``: reported beside it, nan
    without a test split; ``val_loss``: the final validation loss, the measure of an MAE point, which has no top-1;
    ``minutes``: the mean over its seeds of one seed's training time across resumes, not the sweep's wall time,
    which points sharing the machine stretch)."""

    rows = []
    for config in dict.fromkeys(r['config'] for r in records):
        ok = [r for r in records if r['config'] == config and r.get('status') == 'ok']
        failed = [r for r in records if r['config'] == config and r.get('status') != 'ok']
        top1 = mean_std([r['top1'] for r in ok if r.get('top1') is not None] or [float('nan')])
        test = mean_std([r['test_top1'] for r in ok if r.get('test_top1') is not None] or [float('nan')])
        loss = mean_std([r['val_loss'] for r in ok if r.get('val_loss') is not None] or [float('nan')])
        rows.append(dict(config=config, seeds=len(ok), seed_ids=' '.join(str(r['seed']) for r in ok),
                         top1_mean=top1[0], top1_std=top1[1], test_top1_mean=test[0], test_top1_std=test[1],
                         val_loss_mean=loss[0], val_loss_std=loss[1],
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
    atomic_write(os.path.join(out, 'results.png'), lambda tmp: fig.savefig(tmp, dpi=100, format='png'))
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
        atomic_write(os.path.join(out, 'results_params.png'), lambda tmp: fig.savefig(tmp, dpi=100, format='png'))
        plt.close(fig)
    return rows


def expand_configs(patterns: Sequence[str]) -> list:
    """Config files of the sweep: each pattern's glob matches (sorted), or the pattern itself; shared
    bases (``_base_*.yaml``, names starting with ``_``) are not points."""
    configs = [c for pattern in patterns for c in sorted(glob.glob(pattern)) or [pattern]]
    return [c for c in configs if not os.path.basename(c).startswith('_')]
