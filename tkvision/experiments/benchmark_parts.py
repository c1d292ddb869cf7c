"""The parts of ``tkvision-benchmark`` (`PARTS`) and its results files: each part measures one thing
(models against their timm counterparts; where a training step goes) and `run_benchmark` writes
``<out>.md / .csv / .json`` with the machine, the date and the command after each part, so a later failure
loses nothing measured. The layer and data benchmarks of ``docs/performance.md`` add their own parts
(``studies/performance``).
"""
import csv
import json
import time
from typing import Any, Optional

import torch

from ..utils.files import atomic_write
from .benchmark import (
    COUNTERPARTS,
    benchmark_models,
    machine_info,
    markdown_table,
    matmul_peak_tflops,
    parse_model_spec,
)
from .profile import profile_breakdown

__all__ = ['PARTS', 'run_benchmark']


def _save_results(out: str, md: list, results: dict, header: dict):
    """``<out>.md``, ``<out>.json`` and (with models) ``<out>.csv``, atomically: written after every
    part, so a later failure loses nothing measured."""
    atomic_write(out + '.md', lambda f: f.write('\n'.join(md)), text=True)
    atomic_write(out + '.json', lambda f: json.dump(dict(**header, **results), f, indent=1), text=True)
    if 'models' in results:
        def write(f):
            w = csv.DictWriter(f, fieldnames=sorted({k for r in results['models'] for k in r}))
            w.writeheader()
            w.writerows(results['models'])
        atomic_write(out + '.csv', write, text=True)


def _peak_part(args) -> tuple:
    """The machine's matrix-multiply peak (float32 on a CPU, bf16 on a GPU), kept on ``args`` so that the
    models part divides each model's achieved FLOP/s by it (``mfu``)."""
    device = torch.device(args.device)
    dtype, size = (torch.bfloat16, 8192) if device.type == 'cuda' else (torch.float32, 2048)
    args.peak_tflops = matmul_peak_tflops(device, dtype, size)
    row = dict(dtype=str(dtype).removeprefix('torch.'), size=size, threads=torch.get_num_threads(),
               peak_tflops=args.peak_tflops, peak_gflops=1000 * args.peak_tflops)
    print(f"PEAK {row['dtype']} {size}x{size} matrix product: {row['peak_gflops']:.1f} GFLOP/s")
    return [row], ['### Matrix-multiply peak (the MFU denominator)',
                   markdown_table([row], ['dtype', 'size', 'threads', 'peak_gflops']), '']


def _models_part(args) -> tuple:
    rows = benchmark_models(args.models, args.mode, args.batch_size, args.device, args.amp, args.compile,
                            steps=args.steps, repeats=args.repeats, memory=not args.no_memory, reference=args.reference)
    peak = getattr(args, 'peak_tflops', None)
    for r in rows:
        if peak:
            r['mfu'] = r['tflops_per_s'] / peak
    for r in rows:
        if args.reference is not None:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {args.reference}: {r['ratio']:.3f}x img/s (paired rounds "
                  f"{r['ratio_runs']})")
        elif 'ratio' in r:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {COUNTERPARTS[parse_model_spec(r['model'])[0]]}: "
                  f"{r['ratio']:.3f}x img/s, {r['mem_ratio']:.2f}x peak memory, "
                  f"{r['saved_ratio']:.2f}x activations saved for backward")
    columns = (['ratio_runs'] if args.reference is not None else []) + (['mfu'] if peak else [])
    return rows, ['### Models', markdown_table(rows, ['model', 'mode', 'batch_size', 'img_per_s', 'ratio', *columns,
                                                      'step_ms',
                                                  'params', 'gflops_per_img', 'tflops_per_s', 'peak_mem_mib',
                                                  'mem_ratio', 'saved_mib', 'saved_ratio', 'spread']), '']


def _profile_part(args) -> tuple:
    rows = profile_breakdown(args.models, args.profile_batch_size, args.device, compile_=args.compile)
    compiled = ', compiled' if args.compile else ''
    title = f'### Where a training step goes (torch.profiler self time, batch {args.profile_batch_size}{compiled})'
    return rows, [title,
                  markdown_table(rows, ['model', 'category', 'ms', 'share']), '']


#: The parts of a benchmark run, in the order they run (the peak first: the models part reads it).
PARTS = {'peak': _peak_part, 'models': _models_part, 'profile': _profile_part}


def run_benchmark(args: Any, command: str, parts: Optional[dict] = None) -> dict:
    """Run the parts ``args.parts`` of ``parts`` (default `PARTS`; each ``fn(args) -> (rows, markdown
    lines)``) with the options of ``tkvision-benchmark`` (its parsed arguments ``args``), writing
    ``<args.out>.md / .csv / .json`` with the machine, the date and ``command`` after each part. Returns
    ``{part: rows}``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device(args.device))
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f'{info}\n{stamp}\n{command}')
    md = [f'Machine: {info}  \nDate: {stamp}  \nCommand: `{command}`\n']
    results = {}
    for name, part in (parts or PARTS).items():
        if name in args.parts:
            results[name], lines = part(args)
            md += lines
            _save_results(args.out, md, results, dict(machine=info, date=stamp, command=command))
    print(f"wrote {args.out}.md{' / .csv' if 'models' in results else ''} / .json")
    return results
