"""Command lines of the sweep and the model benchmark: ``tkvision-sweep`` and ``tkvision-benchmark`` (and
``tools/sweep.py``, ``tools/benchmark.py``)."""
import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

import timm
import torch

from ..experiments.benchmark import parse_model_spec
from ..experiments.benchmark_parts import PARTS, run_benchmark
from ..experiments.launch import point_status, read_jobs, read_manifest
from ..experiments.launcher import EXECUTORS, Launcher, read_launcher_file
from ..experiments.points import SweepPoint
from ..experiments.sweep import collect, expand_configs, run_sweep
from ..utils.errors import EXIT_PREEMPTED, ConfigError, UsageError
from .common import device_name, positive_int, run_cli

__all__ = ['benchmark_parser', 'parse_benchmark_args', 'benchmark_main', 'sweep_main', 'sweep_parser',
           'parse_sweep_args', 'check_gpu_main']


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
    `EXIT_PREEMPTED` when a point was stopped by a signal and is left to continue (rerun the same command)."""
    return run_cli(_sweep, argv)


#: Options of earlier releases, each refused with what replaced it.
_REMOVED_OPTIONS = {
    '--print-commands': 'submit the points with --executor slurm (one SLURM job array), or run them here with '
                        '--executor local',
    '--nproc-per-node': 'give a point several processes with --tasks-per-node N (or --gpus-per-node N) and '
                        '--executor local or slurm',
}


def sweep_parser() -> argparse.ArgumentParser:
    """The arguments of ``tkvision-sweep`` (unknown ``--key value`` pairs are overrides for every point)."""
    ap = argparse.ArgumentParser(description='Run configs x grid values x seeds, here or on a SLURM cluster through '
                                             'submitit, and tabulate the results (docs/guide/sweeps.md).')
    ap.add_argument('configs', nargs='*', help='config files (globs are expanded)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0], metavar='SEED',
                    help='the seeds each config (and grid value) trains with, one run each (default: 0)')
    ap.add_argument('--grid', nargs='+', action='extend', default=[], metavar='KEY=V1,V2',
                    help='the cartesian product of these values over each config (a key the config does not '
                         'have is a model keyword: score_norm=l2_norm_gelu,softmax; values are YAML flow items: '
                         'elastic_fractions=[0.5,1.0],[1.0]); repeatable')
    ap.add_argument('--out', default='runs/ablations', help='the sweep folder: each point trains in '
                    'OUT/<config>/seed<k>, and a rerun of the same command continues the points left (default: '
                    'runs/ablations)')
    ap.add_argument('--status', metavar='OUT', help='print the state of each point of the sweep in OUT and exit')
    ap.add_argument('--collect', metavar='OUT', help='write the table of OUT from the finished points and exit')
    ap.add_argument('--title', default='Ablation sweep', help='the heading of the results table OUT/results.md '
                    "(default: 'Ablation sweep')")
    group = ap.add_argument_group('where the points run (or a launcher: block in --launcher FILE.yaml)')
    group.add_argument('--launcher', metavar='FILE', help='a YAML file whose launcher: block sets the options below '
                                                          '(the command line wins)')
    group.add_argument('--executor', choices=EXECUTORS, default=None,
                       help='inline: here, one point after another (default); local: submitit jobs on this '
                            'machine; slurm: one SLURM job array')
    for flag, kind, what in (('--parallel', positive_int, 'local: points at a time (1)'),
                             ('--nodes', positive_int, 'nodes per point (1)'),
                             ('--gpus-per-node', int, 'GPUs per node of a point (0)'),
                             ('--tasks-per-node', positive_int, 'processes per node of a point (one per GPU)'),
                             ('--cpus-per-task', positive_int, 'CPU cores per process (SLURM default)'),
                             ('--timeout-min', positive_int, 'time limit of a job; it is then checkpointed and '
                                                             'requeued (1440)'),
                             ('--partition', str, 'SLURM partition'),
                             ('--array-parallelism', positive_int, 'SLURM array tasks at once (256)'),
                             ('--max-timeouts', positive_int, 'time-outs before a point is not requeued (3)'),
                             ('--signal-delay-s', positive_int, 'SLURM: seconds before the time limit at which a '
                                                                'point is signalled to checkpoint and requeue (90)')):
        group.add_argument(flag, type=kind, default=None, help=what)
    group.add_argument('--slurm-option', action='append', default=[], metavar='NAME=VALUE',
                       help='a further #SBATCH option (account=..., qos=...); repeatable')
    return ap


#: Options that take no value: ``--debug`` (`run_cli`'s) and the trainer's ``--resume`` without a path.
_FLAGS = ('--debug', '--resume')


def parse_sweep_args(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """``tkvision-sweep``'s arguments and the training overrides among them: an option the sweep does not know
    (``--threads 1``, ``--epochs=3``) is an override for every point and takes the one value after it, so that
    value is never read as a config file (argparse alone took ``1`` for a config named "1").

    Returns:
        The parsed sweep options and the overrides, in their order (``['--threads', '1', '--epochs=3']``).
    """
    parser = sweep_parser()
    known = {flag for action in parser._actions for flag in action.option_strings}
    own, extra = [], []
    tokens = iter(argv)
    for token in tokens:
        name = token.split('=', 1)[0]
        if token.startswith('--') and name not in known:
            extra.append(token)
            if '=' not in token and name not in _FLAGS:
                value = next(tokens, None)
                if value is not None:
                    extra.append(value)
        else:
            own.append(token)
    return parser.parse_args(own), extra


def _launcher(args: argparse.Namespace) -> Launcher:
    """The `Launcher` of the command line over the ``--launcher`` file's block."""
    if args.launcher in ('local', 'torchrun'):
        raise ConfigError(f'--launcher {args.launcher} was removed: --executor inline runs the points here, '
                          '--executor local as submitit jobs (--tasks-per-node N for several processes)')
    fields = read_launcher_file(args.launcher) if args.launcher else {}
    for name in ('executor', 'parallel', 'nodes', 'gpus_per_node', 'tasks_per_node', 'cpus_per_task', 'timeout_min',
                 'partition', 'array_parallelism', 'max_timeouts', 'signal_delay_s'):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    for option in args.slurm_option:
        name, sep, value = option.partition('=')
        if not sep or not name:
            raise ConfigError(f'--slurm-option {option!r}: write NAME=VALUE (account=myaccount)')
        fields['slurm_options'] = (*fields.get('slurm_options', ()), (name, value))
    return Launcher(**fields)


def _print_status(out: str) -> int:
    manifest = read_manifest(out)
    jobs = read_jobs(out)
    points = [SweepPoint.from_dict(p) for p in manifest['points']]
    width = max([len(p.name) for p in points] + [5])
    print(f"{'point':<{width}}  seed  {'state':<11}  detail")
    states = []
    for point in points:
        state = point_status(out, point, jobs)
        states.append(state.state)
        print(f'{point.name:<{width}}  {point.seed:>4}  {state.state:<11}  {state.detail}')
    print(', '.join(f'{states.count(s)} {s}' for s in dict.fromkeys(states)))
    return 0


def _sweep(argv) -> int:
    for option, replacement in _REMOVED_OPTIONS.items():
        if option in argv:
            raise ConfigError(f'{option} was removed: {replacement}')
    args, extra = parse_sweep_args(argv)
    if args.status:
        return _print_status(args.status)
    if args.collect:
        rows, unfinished = collect(args.collect, args.title)
        return _print_table(args.collect, rows, unfinished)
    if not args.configs:
        raise ConfigError('give config files (or --status OUT / --collect OUT)')
    launcher = _launcher(args)
    records = run_sweep(expand_configs(args.configs), args.seeds, args.out, grid=args.grid, launcher=launcher,
                        extra=extra)
    if launcher.executor == 'slurm':
        return 0
    rows, unfinished = collect(args.out, args.title)
    code = _print_table(args.out, rows, unfinished)
    if unfinished:
        print(f'{unfinished} points stopped before the end; rerun the same command to continue them '
              f'(tkvision-sweep --status {args.out} lists them)', file=sys.stderr)
        return EXIT_PREEMPTED
    return code if records else 1


def _print_table(out: str, rows: list, unfinished: int) -> int:
    with open(os.path.join(out, 'results.md')) as f:
        print(f.read())
    print(f'wrote {out}/results.md, results.csv, results.png' + (f' ({unfinished} points not ended yet)'
                                                                if unfinished else ''))
    return 1 if rows and any(r['failed'] for r in rows) and not any(r['seeds'] for r in rows) else 0


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
    ap.add_argument('--device', default='cuda',
                    help="the GPU to check: 'cuda' or 'cuda:N'; 'cpu' with --dry-run checks the commands themselves")
    ap.add_argument('--dry-run', action='store_true', help='tiny models at 32 px on the CPU (about a minute)')
    ap.add_argument('--items', nargs='+', choices=ITEMS, help='these items only (and the ones they need)')
    ap.add_argument('--work', help='a new folder for the images, runs and logs (default: a temporary one)')
    ap.add_argument('--out', help='write the lines as OUT_<date>.json and .md, e.g. docs/bench/gpu_check')
    args = ap.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        raise UsageError(f'{args.device}: no CUDA device here. On a machine without a GPU, the CPU dry run checks '
                         'the commands: make test-gpu ARGS="--device cpu --dry-run" (tkvision-check-gpu --device cpu '
                         '--dry-run)')
    try:
        args.device = device_name(args.device)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f'--device {error}') from None
    work = args.work or tempfile.mkdtemp(prefix='tkvision-gpu-check-')
    print(f'checking {args.device} in {work} (each item\'s log: {work}/logs)')
    command = 'tkvision-check-gpu ' + ' '.join(argv)
    written: list = []

    def report(results) -> None:  # after each item: a check cut short (a lease that ran out) keeps its lines
        written[:] = write_check_report(results, args.out, args.device, command)
    results = check_gpu(args.device, work, args.dry_run, args.items, report=report if args.out else None)
    if written:
        print('wrote ' + ', '.join(written))
    return 1 if any(r.status == 'fail' for r in results) else 0
