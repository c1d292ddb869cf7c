"""Growth into the one setting that met the precondition: candidate (a)'s quick-recipe model grown 4 -> 8 -> 16
parameter tokens per Pattention, against 16 tokens from scratch (docs/growth.md, "Growing into it").

    python -m studies.growth.pays --seeds 0 1 2 --executor local --parallel 2 --threads 1   # trains, then reports
    python -m studies.growth.pays --report           # the report from finished runs only

The arms are `CHAINS` (``studies/growth/configs/pays/*.yaml``): the chain, and the same chain with the new tokens at
3x the learning rate (``growth.new_token_lr_scale``). The sizes from scratch are candidate (a)'s runs
(``python -m studies.growth.precondition --seeds 0 1 2``, its ``docs/growth/precondition_curves.csv``); for the wall
clock the 16-token runs are trained again in this sweep, beside the chains under the same load (two runs at a time,
one thread each: ``--executor local --parallel 2 --threads 1``), and give the same top-1 to the digit.

The report writes ``docs/growth/chains.csv`` (one row per arm: seeds, final validation top-1 mean and std, test top-1
mean read once, the gap to 16 tokens from scratch with its 95% interval, cumulative training FLOPs and wall clock
as fractions of the 16-token run's, and whether the target is met: within one seed standard deviation of 16 tokens
from scratch for at most `FLOPS_TARGET` of its FLOPs and `WALL_TARGET` of its wall clock),
``chains_curves.csv`` (every epoch of every chain), ``chains_scratch.csv`` (each 16-token run trained again here:
its final top-1 beside the size report's, its minutes: the wall clock's denominator) and ``chains.png`` (the chains'
curves over the sizes' curves), then rewrites ``docs/growth/pays.csv`` (`studies.growth.precondition.write_pays`).
"""
import argparse
import csv
import os
import statistics
import sys

from tkvision.experiments.intervals import gap_interval
from studies.growth.precondition import write_pays
from tkvision.cli import run_cli
from tkvision.engine.config import load_config
from tkvision.engine.plotting import plt
from tkvision.experiments.launch import Launcher
from tkvision.experiments.points import point_dir, provenance
from tkvision.experiments.sweep import run_sweep
from tkvision.utils.files import atomic_write

__all__ = ['CHAINS', 'SIZES', 'LARGEST', 'FLOPS_TARGET', 'WALL_TARGET', 'chain_curves', 'scratch_rows', 'chain_rows',
           'main']

#: Arm name -> its config.
CHAINS = {'grown 4 → 8 → 16 tokens': 'studies/growth/configs/pays/chain_4_to_16.yaml',
          'grown 4 → 8 → 16 tokens, new tokens at 3x the lr':
              'studies/growth/configs/pays/chain_4_to_16_new_token_lr_3.yaml'}
#: Tokens per Pattention of the chain's stages, first to last.
SIZES = (4, 8, 16)
LARGEST = 16
#: The target's bounds, as fractions of the largest size's run from scratch.
FLOPS_TARGET = 0.6
WALL_TARGET = 0.7
SCRATCH_CONFIG = 'studies/growth/configs/precondition/tokens_{}.yaml'


def _read_csv(path: str) -> list:
    with open(path, encoding='utf-8') as f:
        return list(csv.DictReader(f))


def _epoch_tflops(folder: str) -> dict:
    """``{tokens: training TFLOPs of one epoch}`` of each stage size, from candidate (a)'s size report."""
    epochs = load_config(SCRATCH_CONFIG.format(LARGEST))['epochs']
    return {int(r['tokens']): float(r['train_tflops']) / epochs
            for r in _read_csv(os.path.join(folder, 'precondition.csv')) if int(r['tokens']) in SIZES}


def chain_curves(out: str, seeds, folder: str = 'docs/growth') -> list:
    """Every finished chain run's epochs: ``dict(arm, seed, epoch, tokens, top1, test_top1, cumulative_tflops,
    minutes)``, the stage of each epoch from the config's growth steps."""
    per_epoch, rows = _epoch_tflops(folder), []
    for arm, config in CHAINS.items():
        starts = [s['at_epoch'] for s in load_config(config)['growth']['schedule']]
        for seed in seeds:
            run = point_dir(out, config, seed)
            if not os.path.isfile(os.path.join(run, 'result.json')):
                continue
            total, ran = 0.0, provenance(run)
            for r in _read_csv(os.path.join(run, 'metrics.csv')):
                epoch = int(r['epoch'])
                tokens = SIZES[sum(epoch >= s for s in starts)]
                total += per_epoch[tokens]
                rows.append(dict(arm=arm, seed=seed, epoch=epoch + 1, tokens=tokens, top1=float(r['top1']),
                                 test_top1=float(r['test_top1']) if r['test_top1'] else None,
                                 cumulative_tflops=round(total, 4),
                                 minutes=round(float(r['elapsed_minutes']), 2), **ran))
    return rows


def scratch_rows(scratch_runs: str, seeds, folder: str = 'docs/growth') -> list:
    """16 tokens from scratch, trained again in this sweep beside the chains (the wall clock's denominator): per
    finished seed ``dict(seed, top1, test_top1, minutes, size_report_top1, machine, commit)``, ``top1`` its final
    validation top-1 and ``size_report_top1`` the same seed's in candidate (a)'s size report
    (``precondition_curves.csv``), which the chains' gap is measured against."""
    curves = [r for r in _read_csv(os.path.join(folder, 'precondition_curves.csv')) if int(r['tokens']) == LARGEST]
    last = max(int(r['epoch']) for r in curves)
    reported = {int(r['seed']): float(r['top1']) for r in curves if int(r['epoch']) == last}
    rows = []
    for seed in seeds:
        run = point_dir(scratch_runs, SCRATCH_CONFIG.format(LARGEST), seed)
        if not os.path.isfile(os.path.join(run, 'result.json')):
            continue
        final = _read_csv(os.path.join(run, 'metrics.csv'))[-1]
        rows.append(dict(seed=seed, top1=float(final['top1']),
                         test_top1=float(final['test_top1']) if final.get('test_top1') else None,
                         minutes=round(float(final['elapsed_minutes']), 2), size_report_top1=reported.get(seed),
                         **provenance(run)))
    return rows


def chain_rows(curves: list, scratch: list, folder: str = 'docs/growth') -> list:
    """One row per arm of ``curves`` (`chain_curves`): against 16 tokens from scratch (its size report's finals;
    ``scratch``, `scratch_rows`, gives the wall clock), the gap (negative: the chain is lower) with its 95% interval
    (Welch), FLOPs and wall clock as fractions, and the target."""
    sizes = [r for r in _read_csv(os.path.join(folder, 'precondition_curves.csv')) if int(r['tokens']) == LARGEST]
    last_epoch = max(int(r['epoch']) for r in sizes)
    finals_from_scratch = [float(r['top1']) for r in sizes if int(r['epoch']) == last_epoch]
    scratch_minutes = statistics.mean(r['minutes'] for r in scratch) if scratch else None
    scratch_tflops = _epoch_tflops(folder)[LARGEST] * load_config(SCRATCH_CONFIG.format(LARGEST))['epochs']
    rows = []
    for arm in CHAINS:
        mine = [r for r in curves if r['arm'] == arm]
        if not mine:
            continue
        last = max(r['epoch'] for r in mine)
        finals = [r for r in mine if r['epoch'] == last]
        top1 = [r['top1'] for r in finals]
        gap, low, high = gap_interval(top1, finals_from_scratch, digits=2)
        wall = statistics.mean(r['minutes'] for r in finals)
        row = dict(arm=arm, seeds=len(finals), top1_mean=round(statistics.mean(top1), 2),
                   top1_std=round(statistics.stdev(top1), 2) if len(top1) > 1 else None,
                   test_top1_mean=round(statistics.mean(r['test_top1'] for r in finals), 2),
                   scratch_top1_mean=round(statistics.mean(finals_from_scratch), 2),
                   scratch_top1_std=round(statistics.stdev(finals_from_scratch), 2),
                   gap_to_largest=gap, gap_low=low, gap_high=high,
                   flops_vs_largest=round(finals[0]['cumulative_tflops'] / scratch_tflops, 3),
                   wall_vs_largest=round(wall / scratch_minutes, 3) if scratch_minutes else None)
        row['target_met'] = bool(len(finals) >= 3 and gap >= -row['scratch_top1_std']
                                 and row['flops_vs_largest'] <= FLOPS_TARGET
                                 and row['wall_vs_largest'] is not None and row['wall_vs_largest'] <= WALL_TARGET)
        rows.append(row)
    return rows


def _write_csv(path: str, rows: list):
    def write(f):
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)


def _plot(curves: list, folder: str) -> str:
    """``chains.png``: each chain's seeds over the sizes from scratch (validation top-1 against cumulative TFLOPs)."""
    sizes = _read_csv(os.path.join(folder, 'precondition_curves.csv'))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, n in enumerate(SIZES):
        for seed in sorted({r['seed'] for r in sizes if int(r['tokens']) == n}):
            mine = [r for r in sizes if int(r['tokens']) == n and r['seed'] == seed]
            label = f'{n} tokens from scratch' if seed == '0' else None
            ax.plot([float(r['cumulative_tflops']) for r in mine], [float(r['top1']) for r in mine], lw=1,
                    color=plt.cm.viridis(i / (len(SIZES) - 1)), label=label)
    for arm, style in zip(CHAINS, ('k-', 'r--')):
        for seed in sorted({r['seed'] for r in curves if r['arm'] == arm}):
            mine = [r for r in curves if r['arm'] == arm and r['seed'] == seed]
            ax.plot([r['cumulative_tflops'] for r in mine], [r['top1'] for r in mine], style, marker='o', ms=3,
                    label=arm if seed == min(r['seed'] for r in curves if r['arm'] == arm) else None)
    ax.set_ylim(70, None)
    ax.set_xlabel('cumulative training TFLOPs')
    ax.set_ylabel('validation top-1 (%)')
    ax.set_title('Grown 4 → 8 → 16 tokens against the sizes from scratch')
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(folder, 'chains.png')
    atomic_write(path, lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)
    return path


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description='Growth into the setting that met the precondition.')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/growth_pays')
    ap.add_argument('--report', action='store_true', help='report the finished runs; train nothing')
    ap.add_argument('--report-dir', default='docs/growth')
    ap.add_argument('--executor', choices=('inline', 'local'), default='inline')
    ap.add_argument('--parallel', type=int, default=1)
    args, extra = ap.parse_known_args(argv)
    if not args.report:
        run_sweep(list(CHAINS.values()) + [SCRATCH_CONFIG.format(LARGEST)], args.seeds, args.out,
                  launcher=Launcher(executor=args.executor, parallel=args.parallel),
                  extra=['--progress', 'false', *extra])
    curves = chain_curves(args.out, args.seeds, args.report_dir)
    scratch = scratch_rows(args.out, args.seeds, args.report_dir)
    rows = chain_rows(curves, scratch, args.report_dir)
    for row in rows:
        print(row)
    written = {'chains.csv': rows, 'chains_curves.csv': curves, 'chains_scratch.csv': scratch}
    for name, content in written.items():
        _write_csv(os.path.join(args.report_dir, name), content)
    print('wrote ' + ', '.join([os.path.join(args.report_dir, f) for f in written]
                               + [_plot(curves, args.report_dir), write_pays(args.report_dir)]))
    return 0


def main(argv=None) -> int:
    """``python -m studies.growth.pays``: see the module docstring."""
    return run_cli(_main, argv)


if __name__ == '__main__':
    sys.exit(main())
