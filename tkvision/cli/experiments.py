"""Command lines of the experiment drivers: ``tools/benchmark.py``, ``tools/sweep.py``,
``tools/comparison.py``, ``tools/growth_experiment.py`` and ``tools/attention_distance.py`` (and their
``tkvision-*`` scripts)."""
import argparse
import fnmatch
import json
import os
import sys

import torch

from ..engine.checkpoint import BEST_WEIGHTS
from ..engine.config import load_config
from ..experiments.attention_distance import dataset_mad, plot_mad
from ..experiments.benchmark_parts import PARTS, run_benchmark
from ..experiments.comparison import (collect_points, keep_metrics, read_points, run_comparison, time_configs,
                                      write_curves, write_report, write_speed)
from ..experiments.growth_experiment import plan_runs, report, run_all
from ..experiments.naflex_experiment import run_experiment
from ..experiments.sweep import expand_configs, run_sweep, summarize
from .common import run_cli

__all__ = ['benchmark_main', 'sweep_main', 'comparison_main', 'growth_experiment_main', 'attention_distance_main']


def benchmark_main(argv=None) -> int:
    """``tkvision-benchmark`` / ``tools/benchmark.py``; see ``--help``. Writes ``<out>.md``, ``.csv``, ``.json``."""
    ap = argparse.ArgumentParser(description='Benchmark TokenFormer ViTs against timm ViTs.')
    ap.add_argument('--models', nargs='+', default=['tokenformer_vit_b16_matched', 'vit_base_patch16_224'],
                    help='timm names, optionally with options: tokenformer_vit_b16_matched@fused_qkv=true')
    ap.add_argument('--reference', help='one of --models: every ratio is taken against it, paired per round '
                    '(default: each TokenFormer against its timm counterpart, medians of the rounds)')
    ap.add_argument('--mode', nargs='+', default=['infer', 'train'], choices=['infer', 'train'])
    ap.add_argument('--batch-size', type=int, default=64)
    ap.add_argument('--amp', choices=['bf16', 'fp16'])
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--threads', type=int, help='torch.set_num_threads on CPU')
    ap.add_argument('--steps', type=int, default=2, help='steps per timed round')
    ap.add_argument('--repeats', type=int, default=5, help='interleaved rounds; the median is reported')
    ap.add_argument('--parts', nargs='+', default=list(PARTS), choices=list(PARTS))
    ap.add_argument('--profile-batch-size', type=int, default=8)
    ap.add_argument('--score-shape', type=int, nargs=2, metavar=('TOKENS', 'NUM_TOKENS'),
                    help="--parts score_norm: the scores Θ normalises (default: benchmark_score_norm's, the quick recipe's)")
    ap.add_argument('--no-memory', action='store_true', help='skip the CPU peak-RSS child processes')
    ap.add_argument('--data-root', help='--parts data: an ImageNet-layout folder (default: Fashion-MNIST JPEGs)')
    ap.add_argument('--data-images', type=int, default=256, help='--parts data: images decoded per round')
    ap.add_argument('--workers', type=int, nargs='+', default=[1, 2], help='--parts data: loader worker counts')
    ap.add_argument('--out', default='runs/benchmark', help='prefix for .md / .csv / .json results')
    args = ap.parse_args(argv)
    run_benchmark(args, 'python tools/benchmark.py ' + ' '.join(argv if argv is not None else sys.argv[1:]))
    return 0


def sweep_main(argv=None) -> int:
    """``tkvision-sweep`` / ``tools/sweep.py``; see ``--help``. Exit 1 when every point failed, 2 on a bad setting,
    :data:`~tkvision.utils.errors.EXIT_PREEMPTED` when a signal stopped a point (rerun to resume it)."""
    return run_cli(_sweep, argv)


def _sweep(argv) -> int:
    ap = argparse.ArgumentParser(description='Run ablation configs over seeds and tabulate the results.')
    ap.add_argument('configs', nargs='+', help='config files (globs are expanded)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0])
    ap.add_argument('--out', default='runs/ablations')
    ap.add_argument('--launcher', choices=['local', 'torchrun'], default='local')
    ap.add_argument('--nproc-per-node', type=int, default=1)
    ap.add_argument('--print-commands', action='store_true', help='print one command per point and exit')
    ap.add_argument('--title', default='Ablation sweep')
    args, extra = ap.parse_known_args(argv)
    configs = expand_configs(args.configs)
    records = run_sweep(configs, args.seeds, args.out, args.launcher, args.nproc_per_node, args.print_commands, extra)
    if args.print_commands:
        return 0
    rows = summarize(records, args.out, args.title)
    with open(os.path.join(args.out, 'results.md')) as f:
        print(f.read())
    print(f'wrote {args.out}/results.md, results.csv, results.png')
    return 1 if any(r['failed'] for r in rows) and not any(r['seeds'] for r in rows) else 0


def comparison_main(argv=None) -> int:
    """``tkvision-comparison`` / ``tools/comparison.py``; see ``--help``
    (:mod:`tkvision.experiments.comparison`). Prints the result rows; exit 2 on a bad setting,
    :data:`~tkvision.utils.errors.EXIT_PREEMPTED` when a signal stopped a point (rerun to resume it)."""
    return run_cli(_comparison, argv)


def _comparison(argv) -> int:
    ap = argparse.ArgumentParser(description='TokenFormer against ViT at equal parameters, compute and time.')
    ap.add_argument('configs', nargs='+', help='config files (globs are expanded; _base_ files are skipped)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/comparison', help='where the runs train (finished points are skipped)')
    ap.add_argument('--report-dir', default='docs/comparison', help='where points.csv and results.csv go')
    ap.add_argument('--reference', default='vit_equal_width', help='the row the ratios are taken against')
    ap.add_argument('--from-points', metavar='POINTS_CSV', help='train nothing: re-derive results.csv from a '
                    'stored points.csv (python tools/comparison.py configs/comparison/fashion_mnist/*.yaml '
                    '--from-points docs/comparison/points.csv)')
    ap.add_argument('--report-only', action='store_true', help='train nothing: report the finished points under --out')
    ap.add_argument('--time', action='store_true', help='only time one epoch of each config, alone, into speed.csv')
    ap.add_argument('--time-images', type=int, default=12800, help='--time: training images per timed epoch')
    ap.add_argument('--repeats', type=int, default=3, help='--time: rounds (configs interleaved); the median')
    ap.add_argument('--curve-epochs', nargs='+', type=int, help='also keep each point\'s metrics.csv in --report-dir '
                    '(<point>_metrics.csv) and write curves.csv: validation top-1 and training loss at these epochs '
                    '(with --from-points: from the metrics files beside its file)')
    args, extra = ap.parse_known_args(argv)
    configs = expand_configs(args.configs)
    metrics_dir = args.report_dir
    if args.time:
        rows = time_configs(configs, args.time_images, args.repeats, args.reference)
        write_speed(rows, args.report_dir)
    elif args.from_points:
        rows = write_report(configs, read_points(args.from_points), args.report_dir, args.reference, write_points=False)
        metrics_dir = os.path.dirname(args.from_points)
    else:
        if args.report_only:
            rows = write_report(configs, collect_points(configs, args.seeds, args.out), args.report_dir, args.reference)
        else:
            rows = run_comparison(configs, args.seeds, args.out, args.report_dir, args.reference, extra)
        if args.curve_epochs:
            keep_metrics(configs, args.seeds, args.out, args.report_dir)
    if args.curve_epochs:
        write_curves(metrics_dir, args.curve_epochs, args.report_dir)
    for r in rows:
        print(json.dumps(r))
    return 0


def growth_experiment_main(argv=None) -> int:
    """``tools/growth_experiment.py``; see ``--help``."""
    ap = argparse.ArgumentParser(description='Growth chains vs from-scratch training at equal compute (Fig. 3).')
    ap.add_argument('--out', default='runs/growth_chain')
    ap.add_argument('--plan', default='chain', choices=['chain', 'ablations', 'tau', 'shapes'])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    ap.add_argument('--scratch-epochs', type=int, help="epochs of the from-scratch runs (default: the chain's)")
    ap.add_argument('--part', default='0/1', help='i/n: run only every n-th run, starting at i (one process per core)')
    ap.add_argument('--only', nargs='+', help='run only these runs (names as --print-runs lists them; * wildcards)')
    ap.add_argument('--report', action='store_true', help='only write the report from finished runs')
    ap.add_argument('--from-results', metavar='RESULTS_JSON',
                    help="with --report: the per-seed results of a stored results.json instead of runs under --out "
                         "(python tools/growth_experiment.py --report --from-results docs/growth/results.json --out docs/growth)")
    ap.add_argument('--print-runs', action='store_true', help='list the runs of the plan and exit')
    args, rest = ap.parse_known_args(argv)
    if not args.report:
        runs = plan_runs(args.plan, args.seeds, rest, args.scratch_epochs)
        if args.only:
            runs = [r for r in runs if any(fnmatch.fnmatch(r[0], pat) for pat in args.only)]
        if args.print_runs:
            for name, seed, cfg in runs:
                print(f"{name} seed {seed}: {cfg['epochs']} epochs")
            return 0
        i, n = (int(x) for x in args.part.split('/'))
        run_all(runs, args.out, (i, n))
    stored = None
    if args.from_results:
        with open(args.from_results) as f:
            stored = json.load(f)['results']
    print(report(args.out, stored))
    print(f'wrote {args.out}/report.md, results.json, accuracy_vs_compute.png')
    return 0


def naflex_experiment_main(argv=None) -> int:
    """``tools/naflex_experiment.py``; see ``--help`` (:mod:`tkvision.experiments.naflex_experiment`)."""
    ap = argparse.ArgumentParser(description='The NaFlex TokenFormer against NaFlexViT and the fixed grid, trained '
                                 'by our trainer on mixed-size Fashion-MNIST, evaluated at unseen lengths and aspects.')
    ap.add_argument('configs', nargs='*', default=['configs/naflex/fashion_mnist_mixed/*.yaml'],
                    help='config files (globs are expanded; _base_ files are skipped)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/naflex', help='where the runs train (finished points are skipped)')
    ap.add_argument('--report', default='docs/naflex/ours.json', help='the results file docs/naflex.md renders')
    ap.add_argument('--data-dir', default='runs/fashion_mnist_mixed_6k', help="the configs' data_dir (written if missing)")
    ap.add_argument('--unseen-dir', default='runs/fashion_mnist_unseen_aspect', help='the 3:1 / 1:3 test images')
    args = ap.parse_args(argv)
    result = run_experiment(expand_configs(args.configs), args.seeds, args.out, args.report, args.data_dir,
                            args.unseen_dir)
    for row in result['training_means'] + result['length_means']:
        print(json.dumps(row))
    return 0


def _attention_distance(argv) -> int:
    ap = argparse.ArgumentParser(description='Mean attention distance per head and layer (ViT Fig. 7, RingFormer Fig. 3).')
    ap.add_argument('--config', action='append', required=True,
                    help='training config of a model (repeat for several models, one panel each)')
    ap.add_argument('--checkpoint', action='append', default=[],
                    help='weights for each --config, in order (default: <output>/best.safetensors of the config)')
    ap.add_argument('--label', action='append', default=[], help='panel title for each --config (default: model name)')
    ap.add_argument('--num-images', type=int, default=500)
    ap.add_argument('--batch-size', type=int, default=100)
    ap.add_argument('--out', required=True, help='output PNG')
    ap.add_argument('--json', help='also write the [layer, head] values as JSON')
    args = ap.parse_args(argv)
    results = {}
    for i, config in enumerate(args.config):
        cfg = load_config(config)
        weights = args.checkpoint[i] if i < len(args.checkpoint) else os.path.join(cfg['output'], BEST_WEIGHTS)
        label = args.label[i] if i < len(args.label) else cfg['model']
        results[label] = dataset_mad(cfg, weights, args.num_images, args.batch_size)
        print(f'{label}: MAD per layer (mean over heads, px): ' + ' '.join(f'{v:.1f}' for v in results[label].mean(1)))
    plot_mad(results, args.out, title=f'Mean attention distance ({args.num_images} validation images)')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({k: v.round(4).tolist() for k, v in results.items()}, f, indent=1)
    print(f'wrote {args.out}')
    return 0


def attention_distance_main(argv=None) -> int:
    """``tools/attention_distance.py`` / ``tkvision-attention-distance``: see ``--help``; user errors are one line."""
    return run_cli(_attention_distance, argv)
