"""The parts of ``tools/benchmark.py`` (:data:`PARTS`) and its results files: each part measures one thing
(models against their timm counterparts, a Pattention against the layers it replaces, Θ against GELU, where a
step goes, data loading) and :func:`run_benchmark` writes ``<out>.md / .csv / .json`` with the machine, the
date and the command after each part, so a later failure loses nothing measured.
"""
import csv
import json
import time

import torch

from ..utils.files import atomic_write
from .benchmark import COUNTERPARTS, _markdown, benchmark_models, machine_info, parse_model_spec, profile_breakdown
from .layer_benchmark import benchmark_pattention, benchmark_score_norm

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


def _models_part(args) -> tuple:
    rows = benchmark_models(args.models, args.mode, args.batch_size, args.device, args.amp, args.compile,
                            steps=args.steps, repeats=args.repeats, memory=not args.no_memory, reference=args.reference)
    for r in rows:
        if args.reference is not None:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {args.reference}: {r['ratio']:.3f}x img/s (paired rounds "
                  f"{r['ratio_runs']})")
        elif 'ratio' in r:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {COUNTERPARTS[parse_model_spec(r['model'])[0]]}: "
                  f"{r['ratio']:.3f}x img/s, {r['mem_ratio']:.2f}x peak memory, "
                  f"{r['saved_ratio']:.2f}x activations saved for backward")
    columns = ['ratio_runs'] if args.reference is not None else []
    return rows, ['### Models', _markdown(rows, ['model', 'mode', 'batch_size', 'img_per_s', 'ratio', *columns, 'step_ms',
                                                  'params', 'gflops_per_img', 'tflops_per_s', 'peak_mem_mib',
                                                  'mem_ratio', 'saved_mib', 'saved_ratio', 'spread']), '']


def _pattention_part(args) -> tuple:
    rows = benchmark_pattention()
    return rows, ['### Pattention vs the layers it replaces (ViT-B shapes, fp32)',
                  _markdown(rows, ['layer', 'pass', 'ms', 'gflops', 'gflop_per_s']), '']


def _profile_part(args) -> tuple:
    rows = profile_breakdown(args.models, args.profile_batch_size, args.device)
    return rows, [f'### Where a training step goes (torch.profiler self time, batch {args.profile_batch_size})',
                  _markdown(rows, ['model', 'category', 'ms', 'share']), '']


def _data_part(args) -> tuple:
    from .data_benchmark import benchmark_data  # albumentations: only this part needs it (GPU images lack it)
    tables = benchmark_data(args.data_root, args.data_images, tuple(args.workers))
    return tables, ['### JPEG decoding, one thread', _markdown(tables['decode'], ['decoder', 'img_per_s']), '',
                    '### Training augmentation at 224 px, one thread',
                    _markdown(tables['augment'], ['pipeline', 'img_per_s']), '',
                    '### DataLoader: decode + augmentation + uint8 batches',
                    _markdown(tables['loader'], ['source', 'workers', 'img_per_s', 'img_per_s_per_worker']), '']


def _score_norm_part(args) -> tuple:
    shape = dict(zip(('tokens', 'num_tokens'), args.score_shape or ()))  # none given: the function's default
    rows = benchmark_score_norm(**shape, repeats=args.repeats, device=args.device)
    where = f'[{shape["tokens"]}, {shape["num_tokens"]}]' if shape else "the quick recipe's"
    return rows, [f'### Θ against GELU over {where} scores, forward + backward',
                  _markdown(rows, ['variant', 'us', 'vs_gelu', 'ratio_runs']), '']


#: The parts of a benchmark run, in the order they run.
PARTS = {'models': _models_part, 'pattention': _pattention_part, 'score_norm': _score_norm_part,
         'profile': _profile_part, 'data': _data_part}


def run_benchmark(args, command: str) -> dict:
    """Run the parts ``args.parts`` (:data:`PARTS`) with the options of ``tools/benchmark.py`` (its
    parsed arguments ``args``), writing ``<args.out>.md / .csv / .json`` with the machine, the date
    and ``command`` after each part. Returns ``{part: rows}``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device(args.device))
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f'{info}\n{stamp}\n{command}')
    md = [f'Machine: {info}  \nDate: {stamp}  \nCommand: `{command}`\n']
    results = {}
    for name, part in PARTS.items():
        if name in args.parts:
            results[name], lines = part(args)
            md += lines
            _save_results(args.out, md, results, dict(machine=info, date=stamp, command=command))
    print(f'wrote {args.out}.md / .csv / .json')
    return results
