"""Growth's precondition, measured before any chain: a setting where a size beats half of it by the gap rule below
(docs/growth.md, "Where a bigger model is better").

    python -m studies.growth.precondition --seeds 0 1 2                   # candidate (a): trains, then reports
    python -m studies.growth.precondition --candidate mae --seeds 0 1 2   # candidate (b)
    python -m studies.growth.precondition --candidate mae --report        # the report from finished runs only
    python -m studies.growth.precondition --report --curves docs/growth/precondition_curves.csv  # from the file

Each candidate is a size curve: the same model with n parameter tokens per Q/K/V/proj Pattention (4n per FFN),
n in the candidate's sizes, each size from scratch, trained through the sweep (`run_sweep`: a finished point is
skipped, a stopped one resumes; ``--executor local --parallel 2`` runs two at once).

- (a) ``tokens``: the quick recipe's classifier (width 96, 6 blocks, 3 heads, 7 px patches, 6 epochs), measured by
  validation top-1 (``studies/growth/configs/precondition/tokens_<n>.yaml``).
- (b) ``mae``: the Fashion-MNIST MAE recipe's encoder (4 px patches, mask ratio 0.75, a fixed 64-wide decoder,
  4 epochs), measured by its validation reconstruction loss (``mae_tokens_<n>.yaml``).
- (b, longer) ``mae_long``: (b)'s two largest sizes for 12 epochs, three times the budget, where (b)'s last doubling
  fell just short of the gap rule (``mae_long_tokens_<n>.yaml``).

The report writes ``docs/growth/precondition<suffix>.csv`` (one row per size: seeds, the final validation metric's
mean and std, test top-1 once per run for (a), training FLOPs of the run), ``precondition<suffix>_curves.csv``
(every epoch's validation metric against cumulative training TFLOPs, per size and seed) and
``precondition<suffix>.png`` (those curves). The test for each pair of sizes (``L`` and ``L/2``, 3 seeds):

- the gap: ``error(L/2) - error(L) >= 1.5`` points of top-1; for a loss, ``loss(L/2) - loss(L)`` at least
  `LOSS_GAP_SIGMAS` pooled seed standard deviations (1.5 points is that many of candidate (a)'s 0.41-point seed
  standard deviation at 32 and 64 tokens in its first pass), and at least `LOSS_GAP_RELATIVE` of ``loss(L/2)``, so
  that a gap the seeds resolve but a user would not notice does not pass;
- the crossing: at the compute of the smaller size's whole run, the larger size's curve is behind the smaller
  one's final value (``at_half_compute``), and it ends ahead.

Every report also rewrites ``docs/growth/pays.csv`` (`write_pays`): one row per (setting, size from scratch of 3
seeds) of the three candidates, (c) being the long recipe's TokenFormer runs of one recipe at 72, 96 and 128 tokens
that the comparison study measured (``docs/comparison/long``), with the largest size's advantage and its 95%
interval, and ``precondition_long.png``, (c)'s size curve. docs/growth.md renders both.
"""
import argparse
import csv
import math
import os
import statistics
import sys
from typing import NamedTuple, Optional

import torch
from matplotlib.ticker import NullFormatter

from tkvision.experiments.intervals import gap_interval
from studies.growth.growth_experiment import train_flops_per_image
from tkvision.cli import run_cli
from tkvision.engine.config import load_config, model_for_config
from tkvision.engine.plotting import plt
from tkvision.experiments.benchmark import flop_counter
from tkvision.experiments.launcher import Launcher
from tkvision.experiments.points import point_dir, provenance, with_provenance
from tkvision.experiments.sweep import run_sweep
from tkvision.utils.files import atomic_write

__all__ = ['Candidate', 'CANDIDATES', 'IMAGES', 'GAP', 'LOSS_GAP_SIGMAS', 'LOSS_GAP_RELATIVE', 'PAYS_SEEDS',
           'mae_flops_per_image', 'LONG_SIZES', 'curve_rows', 'read_curves', 'size_rows', 'write_report', 'pays_rows',
           'plot_long', 'write_pays', 'main']

#: Training images per epoch (the 50k of the 60k that are not held out for validation).
IMAGES = 50000
#: The precondition on top-1: error(L/2) - error(L) of at least this many points.
GAP = 1.5
#: The precondition on a loss: loss(L/2) - loss(L) of at least this many pooled seed standard deviations
#: (1.5 points over the 0.41-point seed standard deviation at 64 tokens of candidate (a)'s first pass, on the Intel
#: Xeon VM, when the rule was set).
LOSS_GAP_SIGMAS = 3.7
#: ... and of at least this fraction of loss(L/2).
LOSS_GAP_RELATIVE = 0.01
#: The seeds a size needs for a row of ``docs/growth/pays.csv``; a size with fewer stays in its own report.
PAYS_SEEDS = 3


def mae_flops_per_image(cfg: dict) -> float:
    """Forward + backward FLOPs of one MAE training image for ``cfg``'s model (``FlopCounterMode``): the encoder
    on the visible patches, the decoder on all of them, the loss on the masked ones."""
    model = model_for_config(cfg)
    size = cfg['model_kwargs'].get('img_size', cfg['img_size'] or 224)
    x = torch.randn(2, cfg['model_kwargs'].get('in_chans', 3), size, size)
    with flop_counter() as fc:
        model(x)[0].backward()
    return fc.get_total_flops() / 2


class Candidate(NamedTuple):
    """One candidate setting of the precondition: its size configs, the validation metric that measures it and
    whether higher is better, the FLOP count of one training image, and the report's file suffix."""
    name: str
    configs: str
    sizes: tuple
    metric: str
    higher_is_better: bool
    flops_per_image: object
    suffix: str
    label: str
    title: str


CANDIDATES = {
    'tokens': Candidate('tokens', 'studies/growth/configs/precondition/tokens_{}.yaml', (4, 8, 16, 32, 64), 'top1',
                        True, train_flops_per_image, '', 'validation top-1 (%)',
                        'From scratch, the quick recipe: n tokens per Pattention'),
    'mae': Candidate('mae', 'studies/growth/configs/precondition/mae_tokens_{}.yaml', (8, 16, 32, 64, 128),
                     'val_loss', False, mae_flops_per_image, '_mae', 'validation reconstruction loss',
                     'From scratch, MAE pretraining: n tokens per Pattention'),
    'mae_long': Candidate('mae_long', 'studies/growth/configs/precondition/mae_long_tokens_{}.yaml', (64, 128),
                          'val_loss', False, mae_flops_per_image, '_mae_long', 'validation reconstruction loss',
                          'From scratch, MAE for 12 epochs: n tokens per Pattention'),
}


def curve_rows(candidate: Candidate, out: str, seeds) -> list:
    """Every finished run's epochs: ``dict(tokens, seed, epoch, <metric>, test_top1, cumulative_tflops)``, with
    the candidate's validation metric (``top1`` or ``val_loss``) under its own name."""
    rows = []
    for n in candidate.sizes:
        config = candidate.configs.format(n)
        flops = candidate.flops_per_image(load_config(config))
        for seed in seeds:
            folder = point_dir(out, config, seed)
            if not os.path.isfile(os.path.join(folder, 'result.json')):
                continue
            ran = provenance(folder)
            with open(os.path.join(folder, 'metrics.csv')) as f:
                for r in csv.DictReader(f):
                    epoch = int(r['epoch'])
                    value = {candidate.metric: float(r[candidate.metric])}
                    rows.append(dict(tokens=n, seed=seed, epoch=epoch + 1, **value,
                                     test_top1=float(r['test_top1']) if r.get('test_top1') else None,
                                     cumulative_tflops=flops * IMAGES * (epoch + 1) / 1e12, **ran))
    return rows


def read_curves(candidate: Candidate, path: str) -> list:
    """The rows of a ``precondition<suffix>_curves.csv`` that `write_report` wrote, in `curve_rows`' form: the report
    rebuilt from the per-seed curves on file when the runs' folders are gone.

    Raises:
        FileNotFoundError: no file at ``path``.
        KeyError: a column the candidate's rows need is missing (names it).
    """
    with open(path, encoding='utf-8') as f:
        return [with_provenance(dict(tokens=int(r['tokens']), seed=int(r['seed']), epoch=int(r['epoch']),
                     **{candidate.metric: float(r[candidate.metric])},
                     test_top1=float(r['test_top1']) if r.get('test_top1') else None,
                     cumulative_tflops=float(r['cumulative_tflops']), machine=r.get('machine'),
                     commit=r.get('commit'))) for r in csv.DictReader(f)]


def _gap_needed(candidate: Candidate, small: dict, large: dict) -> Optional[float]:
    """The gap ``large`` needs over ``small`` (the module docstring's gap rule); None for a loss without two seeds
    a side."""
    if candidate.higher_is_better:
        return GAP
    stds = [r[candidate.metric + '_std'] for r in (small, large) if r[candidate.metric + '_std'] is not None]
    if len(stds) < 2:
        return None
    pooled = math.sqrt((stds[0] ** 2 + stds[1] ** 2) / 2)
    return max(LOSS_GAP_SIGMAS * pooled, LOSS_GAP_RELATIVE * small[candidate.metric + '_mean'])


def size_rows(candidate: Candidate, curves: list) -> list:
    """One row per size: seeds, final validation metric mean / std, test top-1 mean (a classifier), the run's
    training TFLOPs, and against the size below (half the tokens) the gap (positive: the larger is better) with its
    95% interval (``gap_low``, ``gap_high``; two seeds a side or more),
    the larger size's value at the smaller one's compute, and whether the precondition is met. Every gap and
    threshold is computed from the unrounded per-seed values; only what the row shows is rounded."""
    rows, metric = [], candidate.metric
    last = max((c['epoch'] for c in curves), default=0)
    digits = 2 if candidate.higher_is_better else 4
    per_seed, exact = {}, {}
    for n in candidate.sizes:
        finals = [r for r in curves if r['tokens'] == n and r['epoch'] == last]
        if not finals:
            continue
        values = per_seed[n] = [r[metric] for r in finals]
        exact[n] = {'tokens': n, metric + '_mean': statistics.mean(values),
                    metric + '_std': statistics.stdev(values) if len(values) > 1 else None}
        tests = [r['test_top1'] for r in finals if r['test_top1'] is not None]
        rows.append({'tokens': n, 'seeds': len(finals), metric + '_mean': round(statistics.mean(values), digits),
                     metric + '_std': round(statistics.stdev(values), digits) if len(values) > 1 else None,
                     'test_top1_mean': round(statistics.mean(tests), 2) if tests else None,
                     'train_tflops': round(finals[0]['cumulative_tflops'], 2)})
    sign = 1 if candidate.higher_is_better else -1
    for small, large in zip(rows, rows[1:]):
        small_mean, large_mean = exact[small['tokens']][metric + '_mean'], exact[large['tokens']][metric + '_mean']
        gap = sign * (large_mean - small_mean)
        large['gap_to_half'] = round(gap, digits)
        pair = (per_seed[large['tokens']], per_seed[small['tokens']])
        if min(map(len, pair)) > 1:  # the gap's 95% interval (Welch), the larger size's advantage
            _, large['gap_low'], large['gap_high'] = gap_interval(*(pair if sign > 0 else pair[::-1]), digits=digits)
        at = _at_compute(curves, metric, large['tokens'], small['train_tflops'])
        large['at_half_compute'] = None if at is None else round(at, digits)
        large['half_ahead_at_its_compute'] = at is not None and sign * (small_mean - at) > 0
        needed = _gap_needed(candidate, exact[small['tokens']], exact[large['tokens']])
        if not candidate.higher_is_better:
            large['gap_needed'] = None if needed is None else round(needed, digits)
        enough_seeds = min(large['seeds'], small['seeds']) >= 3
        large['precondition_met'] = (needed is not None and gap >= needed
                                     and large['half_ahead_at_its_compute'] and enough_seeds)
    return rows


def _at_compute(curves: list, metric: str, tokens: int, tflops: float) -> Optional[float]:
    """The mean validation ``metric`` of size ``tokens`` at ``tflops`` cumulative training TFLOPs, linear between its
    epochs (None before its first epoch)."""
    epochs = sorted({r['epoch'] for r in curves if r['tokens'] == tokens})
    points = [(statistics.mean(r['cumulative_tflops'] for r in curves if r['tokens'] == tokens and r['epoch'] == e),
               statistics.mean(r[metric] for r in curves if r['tokens'] == tokens and r['epoch'] == e))
              for e in epochs]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= tflops <= x1:
            return y0 + (y1 - y0) * (tflops - x0) / (x1 - x0)
    return None


def write_report(candidate: Candidate, curves: list, sizes: list, folder: str = 'docs/growth') -> list:
    """``precondition<suffix>.csv``, ``precondition<suffix>_curves.csv`` and ``precondition<suffix>.png`` in
    ``folder`` (atomic). Returns the paths."""
    stem = os.path.join(folder, 'precondition' + candidate.suffix)
    paths = [stem + '.csv', stem + '_curves.csv', stem + '.png']
    for path, rows in zip(paths, (sizes, curves)):
        keys = list(dict.fromkeys(k for r in rows for k in r))

        def write(f, rows=rows, keys=keys):
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        atomic_write(path, write, text=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, n in enumerate(candidate.sizes):
        for seed in sorted({r['seed'] for r in curves if r['tokens'] == n}):
            mine = [r for r in curves if r['tokens'] == n and r['seed'] == seed]
            first = seed == min(r['seed'] for r in curves if r['tokens'] == n)
            ax.plot([r['cumulative_tflops'] for r in mine], [r[candidate.metric] for r in mine], marker='o', ms=3,
                    label=f'{n} tokens' if first else None, color=plt.cm.viridis(i / (len(candidate.sizes) - 1)))
    ax.set_xscale('log')
    ax.xaxis.set_minor_formatter(NullFormatter())  # the labelled minor ticks of a short log axis overlap
    ax.set_xlabel('cumulative training TFLOPs')
    ax.set_ylabel(candidate.label)
    ax.set_title(candidate.title)
    ax.legend()
    fig.tight_layout()
    atomic_write(paths[2], lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)
    return paths


#: Candidate (c), the long recipe (75 epochs): its TokenFormer runs of one recipe at three sizes, measured by the
#: comparison study (docs/comparison/long/results.csv, points.csv: config -> tokens per Pattention).
LONG_SIZES = {'tokenformer_token_lr_quarter': 72, 'tokenformer_num_tokens_96': 96, 'tokenformer_num_tokens_128': 128}
LONG = 'docs/comparison/long'


def _read_csv(path: str) -> list:
    with open(path, encoding='utf-8') as f:
        return list(csv.DictReader(f))


def _pays_setting(setting: str, metric: str, higher: bool, finals: dict, tflops: dict, minutes: dict,
                  met: dict) -> list:
    """The rows of one setting, each size of at least `PAYS_SEEDS` seeds: ``finals`` ``{tokens: [final value per
    seed]}``, ``tflops`` / ``minutes`` ``{tokens: per run}`` (``minutes`` may be empty), ``met`` ``{tokens:
    precondition_met}``. The gap is the largest size's advantage over this one (positive: the largest is better)
    with its 95% interval (Welch); ``target_met`` belongs to a grown chain's rows (`_chain_pays_rows`), None here."""
    largest = max(finals)
    digits = 2 if higher else 4
    rows = []
    for n in sorted(n for n in finals if len(finals[n]) >= PAYS_SEEDS):
        values, best = finals[n], finals[largest]
        mean, std = statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None
        gap = low = high = None
        if n != largest:
            signed = (best, values) if higher else (values, best)
            gap, low, high = gap_interval(*signed, digits=digits)
        rows.append(dict(setting=setting, arm=f'from scratch, {n} tokens', tokens=n, seeds=len(values),
                         metric=metric, mean=round(mean, digits), std=None if std is None else round(std, digits),
                         gap_to_largest=gap, gap_low=low, gap_high=high,
                         flops_vs_largest=round(tflops[n] / tflops[largest], 3),
                         wall_vs_largest=round(minutes[n] / minutes[largest], 3) if minutes else None,
                         precondition_met=met.get(n, False), target_met=None))
    return rows


def pays_rows(folder: str = 'docs/growth') -> list:
    """``docs/growth/pays.csv``'s rows: for each candidate setting every size from scratch (`_pays_setting`), from
    the precondition reports in ``folder`` ((a), (b)) and the long recipe's comparison files ((c)). ``precondition_met``
    is the size-row test of the module docstring against the size below; for (c), whose sizes are 72, 96 and 128
    tokens, 128 against 72 (1.78x the tokens, more than half)."""
    rows = []
    for key, setting in (('tokens', '(a) parameter tokens, quick recipe'), ('mae', '(b) MAE pretraining')):
        candidate = CANDIDATES[key]
        stem = os.path.join(folder, 'precondition' + candidate.suffix)
        if not os.path.isfile(stem + '.csv'):
            continue
        curves, sizes = _read_csv(stem + '_curves.csv'), _read_csv(stem + '.csv')
        last = max(int(r['epoch']) for r in curves)
        finals: dict = {}
        for r in curves:
            if int(r['epoch']) == last:
                finals.setdefault(int(r['tokens']), []).append(float(r[candidate.metric]))
        tflops = {int(r['tokens']): float(r['train_tflops']) for r in sizes}
        met = {int(r['tokens']): r.get('precondition_met') == 'True' for r in sizes}
        rows += _pays_setting(setting, 'validation ' + ('top-1' if candidate.higher_is_better else 'loss'),
                              candidate.higher_is_better, finals, tflops, {}, met)
    results = {r['config']: r for r in _read_csv(os.path.join(LONG, 'results.csv'))}
    finals = {}
    for r in _read_csv(os.path.join(LONG, 'points.csv')):
        if r['config'] in LONG_SIZES:
            finals.setdefault(LONG_SIZES[r['config']], []).append(float(r['top1']))
    by_tokens = {n: results[c] for c, n in LONG_SIZES.items()}
    long = _pays_setting('(c) the long recipe, 75 epochs', 'validation top-1', True, finals,
                         {n: float(r['train_tflops']) for n, r in by_tokens.items()},
                         {n: float(r['minutes']) for n, r in by_tokens.items()}, {})
    for row in long:
        if row['tokens'] == max(LONG_SIZES.values()):
            smallest = next(r for r in long if r['tokens'] == min(LONG_SIZES.values()))
            row['precondition_met'] = smallest['gap_to_largest'] >= GAP and min(row['seeds'], smallest['seeds']) >= 3
    return rows + long + _chain_pays_rows(folder)


def _chain_pays_rows(folder: str) -> list:
    """The grown chains' rows (``chains.csv``, written by ``python -m studies.growth.pays``), each against 16 tokens
    from scratch, that setting's largest size: its advantage over the chain, the interval turned to match."""
    path = os.path.join(folder, 'chains.csv')
    if not os.path.isfile(path):
        return []
    def number(value: str, sign: float = 1.0) -> Optional[float]:
        return None if value == '' else sign * float(value)

    rows = []
    for r in _read_csv(path):
        rows.append(dict(setting='(a) grown into 16 tokens', arm=r['arm'], tokens=16, seeds=int(r['seeds']),
                         metric='validation top-1', mean=float(r['top1_mean']), std=number(r['top1_std']),
                         gap_to_largest=number(r['gap_to_largest'], -1.0), gap_low=number(r['gap_high'], -1.0),
                         gap_high=number(r['gap_low'], -1.0), flops_vs_largest=float(r['flops_vs_largest']),
                         wall_vs_largest=number(r['wall_vs_largest']), precondition_met=None,
                         target_met=r['target_met'] == 'True'))
    return rows


def plot_long(folder: str = 'docs/growth') -> str:
    """``folder/precondition_long.png``: candidate (c)'s size curve, every seed's validation top-1 against cumulative
    training TFLOPs (per-image FLOPs from the comparison's results.csv, 50k images an epoch). Returns its path."""
    results = {r['config']: r for r in _read_csv(os.path.join(LONG, 'results.csv'))}
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (config, n) in enumerate(LONG_SIZES.items()):
        flops = float(results[config]['train_gflops_per_image']) * 1e9
        for seed in range(3):
            path = os.path.join(LONG, f'{config}_seed{seed}_metrics.csv')
            if not os.path.isfile(path):
                continue
            rows = _read_csv(path)
            ax.plot([flops * IMAGES * (int(r['epoch']) + 1) / 1e12 for r in rows], [float(r['top1']) for r in rows],
                    lw=1, label=f'{n} tokens' if seed == 0 else None, color=plt.cm.viridis(i / (len(LONG_SIZES) - 1)))
    ax.set_xscale('log')
    ax.set_ylim(85, 92.5)
    ax.set_xlim(20, None)
    ax.set_xlabel('cumulative training TFLOPs')
    ax.set_ylabel('validation top-1 (%)')
    ax.set_title('From scratch, the long recipe (75 epochs): n tokens per Pattention')
    ax.legend()
    fig.tight_layout()
    path = os.path.join(folder, 'precondition_long.png')
    atomic_write(path, lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)
    return path


def write_pays(folder: str = 'docs/growth') -> str:
    """Write `pays_rows` to ``folder/pays.csv`` (atomic) and candidate (c)'s plot (`plot_long`); returns the csv's
    path."""
    plot_long(folder)
    rows = pays_rows(folder)
    path = os.path.join(folder, 'pays.csv')

    def write(f):
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)
    return path


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description="Growth's precondition: the size curve of one candidate setting.")
    ap.add_argument('--candidate', choices=sorted(CANDIDATES), default='tokens')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default=None, help='the sweep folder (default: runs/growth_precondition[_mae])')
    ap.add_argument('--report', action='store_true', help='report the finished runs; train nothing')
    ap.add_argument('--report-dir', default='docs/growth')
    ap.add_argument('--curves', default=None, help='the per-seed curves file to report from (the '
                                                   'runs\' folders gone), e.g. docs/growth/precondition_curves.csv')
    ap.add_argument('--executor', choices=('inline', 'local'), default='inline',
                    help='where the points run (tkvision-sweep --executor)')
    ap.add_argument('--parallel', type=int, default=1, help='points at a time with --executor local')
    args, extra = ap.parse_known_args(argv)
    candidate = CANDIDATES[args.candidate]
    out = args.out or 'runs/growth_precondition' + candidate.suffix
    if not args.report and not args.curves:
        run_sweep([candidate.configs.format(n) for n in candidate.sizes], args.seeds, out,
                  launcher=Launcher(executor=args.executor, parallel=args.parallel),
                  extra=['--progress', 'false', *extra])
    curves = read_curves(candidate, args.curves) if args.curves else curve_rows(candidate, out, args.seeds)
    sizes = size_rows(candidate, curves)
    for row in sizes:
        print(row)
    print('wrote ' + ', '.join(write_report(candidate, curves, sizes, args.report_dir) + [write_pays(args.report_dir)]))
    return 0


def main(argv=None) -> int:
    """``python -m studies.growth.precondition``: see the module docstring."""
    return run_cli(_main, argv)


if __name__ == '__main__':
    sys.exit(main())
