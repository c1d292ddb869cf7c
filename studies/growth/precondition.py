"""Growth's precondition, measured before any chain: a setting where the largest size is clearly better than half
of it (docs/growth.md, "Where a bigger model is better").

    python -m studies.growth.precondition --seeds 0 1 2        # trains what has not finished, then reports
    python -m studies.growth.precondition --report             # the report from the finished runs only

Candidate (a): parameter tokens as the binding capacity. The quick recipe's model (width 96, 6 blocks, 3 heads,
7 px patches, 6 epochs) with n tokens per Q/K/V/proj Pattention (4n per FFN), n in `SIZES`, each from scratch
(``studies/growth/configs/precondition/tokens_<n>.yaml``), through the sweep (`run_sweep`: a finished point is
skipped, a stopped one resumes). The report writes ``docs/growth/precondition.csv`` (one row per size: seeds,
final validation top-1 mean and std, test top-1 once per run, training FLOPs per image and for the run),
``precondition_curves.csv`` (every epoch's validation top-1 against the cumulative training TFLOPs, per size
and seed) and ``precondition.png`` (those curves). The test for each pair of sizes (the largest ``L`` and ``L/2``):
``error(L/2) - error(L) >= 1.5`` points on the means of 3 seeds, and the curves cross (at the compute of the
smaller one's whole run, it is ahead of the larger one's curve there, ``at_half_compute``; the larger is ahead at
the end).
"""
import argparse
import csv
import os
import statistics
import sys

from studies.growth.growth_experiment import train_flops_per_image
from tkvision.cli import run_cli
from tkvision.engine.config import load_config
from tkvision.engine.plotting import plt
from tkvision.experiments.points import point_dir
from tkvision.experiments.sweep import run_sweep
from tkvision.utils.files import atomic_write

__all__ = ['SIZES', 'CONFIGS', 'IMAGES', 'GAP', 'curve_rows', 'size_rows', 'write_report', 'main']

#: Parameter tokens per Q/K/V/proj Pattention (4x per FFN) of candidate (a).
SIZES = (4, 8, 16, 32, 64)
CONFIGS = 'studies/growth/configs/precondition/tokens_{}.yaml'
#: Training images per epoch (the quick recipe's 50k).
IMAGES = 50000
#: The precondition: error(L/2) - error(L) of at least this many points.
GAP = 1.5


def curve_rows(out: str, seeds) -> list:
    """Every finished run's epochs: ``dict(tokens, seed, epoch, top1, cumulative_tflops)``."""
    rows = []
    for n in SIZES:
        config = CONFIGS.format(n)
        flops = train_flops_per_image(load_config(config))
        for seed in seeds:
            metrics = os.path.join(point_dir(out, config, seed), 'metrics.csv')
            if not os.path.isfile(os.path.join(point_dir(out, config, seed), 'result.json')):
                continue
            with open(metrics) as f:
                for r in csv.DictReader(f):
                    epoch = int(r['epoch'])
                    rows.append(dict(tokens=n, seed=seed, epoch=epoch + 1, top1=float(r['top1']),
                                     test_top1=float(r['test_top1']) if r.get('test_top1') else None,
                                     cumulative_tflops=flops * IMAGES * (epoch + 1) / 1e12))
    return rows


def size_rows(curves: list) -> list:
    """One row per size: seeds, final validation top-1 mean / std, test top-1 mean, the run's training TFLOPs, and
    against the next size up (twice the tokens) the validation gap and whether the curves cross."""
    rows = []
    for n in SIZES:
        finals = [r for r in curves if r['tokens'] == n and r['epoch'] == max(c['epoch'] for c in curves)]
        if not finals:
            continue
        top1 = [r['top1'] for r in finals]
        rows.append(dict(tokens=n, seeds=len(finals), top1_mean=round(statistics.mean(top1), 2),
                         top1_std=round(statistics.stdev(top1), 2) if len(top1) > 1 else None,
                         test_top1_mean=round(statistics.mean(r['test_top1'] for r in finals), 2),
                         train_tflops=round(finals[0]['cumulative_tflops'], 2)))
    for small, large in zip(rows, rows[1:]):
        large['gap_to_half'] = round(large['top1_mean'] - small['top1_mean'], 2)
        at = _at_compute(curves, large['tokens'], small['train_tflops'])
        large['at_half_compute'] = None if at is None else round(at, 2)
        large['half_ahead_at_its_compute'] = at is not None and small['top1_mean'] > at
        large['precondition_met'] = large['gap_to_half'] >= GAP and large['half_ahead_at_its_compute'] \
            and large['seeds'] >= 3
    return rows


def _at_compute(curves: list, tokens: int, tflops: float):
    """The mean validation top-1 of size ``tokens`` at ``tflops`` cumulative training TFLOPs, linear between its
    epochs (None before its first epoch)."""
    epochs = sorted({r['epoch'] for r in curves if r['tokens'] == tokens})
    points = [(statistics.mean(r['cumulative_tflops'] for r in curves if r['tokens'] == tokens and r['epoch'] == e),
               statistics.mean(r['top1'] for r in curves if r['tokens'] == tokens and r['epoch'] == e))
              for e in epochs]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= tflops <= x1:
            return y0 + (y1 - y0) * (tflops - x0) / (x1 - x0)
    return None


def write_report(curves: list, sizes: list, folder: str = 'docs/growth') -> list:
    """``precondition.csv``, ``precondition_curves.csv`` and ``precondition.png`` in ``folder`` (atomic). Returns
    the paths."""
    paths = [os.path.join(folder, name) for name in ('precondition.csv', 'precondition_curves.csv',
                                                     'precondition.png')]
    for path, rows in zip(paths, (sizes, curves)):
        keys = list(dict.fromkeys(k for r in rows for k in r))

        def write(f, rows=rows, keys=keys):
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        atomic_write(path, write, text=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in SIZES:
        for seed in sorted({r['seed'] for r in curves if r['tokens'] == n}):
            mine = [r for r in curves if r['tokens'] == n and r['seed'] == seed]
            ax.plot([r['cumulative_tflops'] for r in mine], [r['top1'] for r in mine], marker='o', ms=3,
                    label=f'{n} tokens' if seed == min(r['seed'] for r in curves if r['tokens'] == n) else None,
                    color=plt.cm.viridis(SIZES.index(n) / (len(SIZES) - 1)))
    ax.set_xscale('log')
    ax.set_xlabel('cumulative training TFLOPs')
    ax.set_ylabel('validation top-1 (%)')
    ax.set_title('From scratch, the quick recipe: n tokens per Pattention')
    ax.legend()
    fig.tight_layout()
    atomic_write(paths[2], lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)
    return paths


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description="Growth's precondition: the size curve of candidate (a).")
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/growth_precondition')
    ap.add_argument('--report', action='store_true', help='report the finished runs; train nothing')
    ap.add_argument('--report-dir', default='docs/growth')
    args, extra = ap.parse_known_args(argv)
    if not args.report:
        run_sweep([CONFIGS.format(n) for n in SIZES], args.seeds, args.out, extra=['--progress', 'false', *extra])
    curves = curve_rows(args.out, args.seeds)
    sizes = size_rows(curves)
    for row in sizes:
        print(row)
    print('wrote ' + ', '.join(write_report(curves, sizes, args.report_dir)))
    return 0


def main(argv=None) -> int:
    """``python -m studies.growth.precondition``: see the module docstring."""
    return run_cli(_main, argv)


if __name__ == '__main__':
    sys.exit(main())
