"""Command lines of the sweep and the model benchmark: ``tkvision-sweep`` and ``tkvision-benchmark`` (and
``tools/sweep.py``, ``tools/benchmark.py``)."""
import argparse
import os
from typing import Optional, Sequence

import timm
import torch

from ..experiments.benchmark import parse_model_spec
from ..experiments.benchmark_parts import PARTS, run_benchmark
from ..experiments.sweep import expand_configs, run_sweep, summarize
from .common import device_name, positive_int, run_cli

__all__ = ['benchmark_parser', 'parse_benchmark_args', 'benchmark_main', 'sweep_main', 'check_gpu_main']


def benchmark_parser(parts: dict = PARTS) -> argparse.ArgumentParser:
    """The arguments of ``tkvision-benchmark`` (``parts``: the parts ``--parts`` chooses from)."""
    ap = argparse.ArgumentParser(description='Benchmark TokenFormer ViTs against timm ViTs.')
    ap.add_argument('--models', nargs='+', default=['tokenformer_vit_b16_matched', 'vit_base_patch16_224'],
                    help='timm names, optionally with options: tokenformer_vit_b16_matched@backward_mode=lean')
    ap.add_argument('--reference', help='one of --models: every ratio is taken against it, paired per round '
                    '(default: each TokenFormer against its timm counterpart, medians of the rounds)')
    ap.add_argument('--mode', nargs='+', default=['infer', 'train'], choices=['infer', 'train'])
    ap.add_argument('--batch-size', type=positive_int, default=64)
    ap.add_argument('--amp', choices=['bf16', 'fp16'])
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--device', type=device_name, default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--threads', type=positive_int, help='torch.set_num_threads on CPU')
    ap.add_argument('--steps', type=positive_int, default=2, help='steps per timed round')
    ap.add_argument('--repeats', type=positive_int, default=5, help='interleaved rounds; the median is reported')
    ap.add_argument('--parts', nargs='+', default=list(parts), choices=list(parts))
    ap.add_argument('--profile-batch-size', type=positive_int, default=8)
    ap.add_argument('--no-memory', action='store_true', help='skip the CPU peak-RSS child processes')
    ap.add_argument('--out', default='runs/benchmark', help='prefix for .md / .csv / .json results')
    return ap


def parse_benchmark_args(ap: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """``ap``'s arguments, a model that timm does not know refused by name (one line, exit 2)."""
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if not timm.is_model(parse_model_spec(m)[0])]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}: timm.list_models('tokenformer*') lists ours (import tkvision first)")
    return args


def benchmark_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-benchmark`` / ``tools/benchmark.py``; see ``--help``. Writes ``<out>.md``, ``.csv``, ``.json``;
    a user error is one line (exit 2)."""
    return run_cli(_benchmark, argv)


def _benchmark(argv) -> int:
    args = parse_benchmark_args(benchmark_parser(), argv)
    run_benchmark(args, 'tkvision-benchmark ' + ' '.join(argv))
    return 0


def sweep_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-sweep`` / ``tools/sweep.py``; see ``--help``. Exit 1 when every point failed, 2 on a bad setting,
    `EXIT_PREEMPTED` when a signal stopped a point (rerun to resume it)."""
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


def check_gpu_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-check-gpu`` / ``tools/check_gpu.py`` / ``make test-gpu``: what a user runs on a GPU machine, one
    line each (`tkvision.experiments.gpu_check`); exit 0 when every item passed, 1 when one failed, 2 on a bad
    setting."""
    return run_cli(_check_gpu, argv)


def _check_gpu(argv) -> int:
    import tempfile

    from ..experiments.gpu_check import ITEMS, check_gpu, write_check_report
    ap = argparse.ArgumentParser(description='Check a GPU machine: the recipe, MAE, NaFlex, RingFormer, growth, '
                                             'elastic, torchrun, stop and resume, validate, export.')
    ap.add_argument('--device', type=device_name, default='cuda')
    ap.add_argument('--dry-run', action='store_true', help='tiny models at 32 px on the CPU (about a minute)')
    ap.add_argument('--items', nargs='+', choices=ITEMS, help='these items only (and the ones they need)')
    ap.add_argument('--work', help='a new folder for the images, runs and logs (default: a temporary one)')
    ap.add_argument('--out', help='write the lines as OUT_<date>.json and .md, e.g. docs/bench/gpu_check')
    args = ap.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix='tkvision-gpu-check-')
    print(f'checking {args.device} in {work} (each item\'s log: {work}/logs)')
    results = check_gpu(args.device, work, args.dry_run, args.items)
    if args.out:
        command = 'tkvision-check-gpu ' + ' '.join(argv)
        print('wrote ' + ', '.join(write_check_report(results, args.out, args.device, command)))
    return 1 if any(r.status == 'fail' for r in results) else 0
