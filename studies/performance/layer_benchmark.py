"""Layer and data benchmarks of ``docs/performance.md``: one Pattention against the ``Linear`` layers it
replaces (``--parts pattention``), its score normalisation Θ (Eq. 5) against the GELU a ViT applies to as
many elements (``--parts score_norm``), forward and backward, with ``tkvision.experiments.benchmark``'s timing
helpers (warm-up, then rounds and their median; Θ's variants interleaved within each round and paired
against the GELU), and data loading (``--parts data``: `studies.performance.data_benchmark`); the
library's own parts (``models``, ``profile``) run beside them.

    python -m studies.performance.layer_benchmark --parts score_norm --out docs/bench/cpu_score_norm
"""
import statistics
import sys

import torch
import torch.nn.functional as F

from tkvision.cli import run_cli
from tkvision.cli.common import non_negative_int, positive_int
from tkvision.cli.experiments import benchmark_parser, parse_benchmark_args
from tkvision.experiments.benchmark import flop_counter, markdown_table, time_call, time_rounds
from tkvision.experiments.benchmark_parts import PARTS as LIBRARY_PARTS
from tkvision.experiments.benchmark_parts import run_benchmark
from tkvision.layers import Pattention

__all__ = ['benchmark_pattention', 'score_norm_variants', 'benchmark_score_norm']


def benchmark_pattention(tokens=64 * 197, dim=768, num_tokens=576, mlp_ratio=4, steps=3, repeats=5, log=print):
    """One Pattention (d -> d, ``num_tokens``) vs the ``Linear(d, d)`` it replaces in attention and the
    ``Linear -> GELU -> Linear`` MLP (d -> 4d -> d) that an FFN Pattention with 4x tokens replaces,
    at ViT-B shapes (``tokens`` = batch 64 x 197), fp32, forward and forward+backward.

    Returns rows ``layer, pass, ms, gflops, gflop_per_s``.
    """
    x = torch.randn(tokens, dim, requires_grad=True)
    layers = {
        f'Linear({dim},{dim})': torch.nn.Linear(dim, dim),
        f'Pattention({dim},{dim},n={num_tokens})': Pattention(dim, dim, num_tokens),
        f'MLP({dim},{mlp_ratio * dim},{dim})': torch.nn.Sequential(torch.nn.Linear(dim, mlp_ratio * dim),
                                                                   torch.nn.GELU(),
                                                             torch.nn.Linear(mlp_ratio * dim, dim)),
        f'Pattention({dim},{dim},n={mlp_ratio * num_tokens})': Pattention(dim, dim, mlp_ratio * num_tokens),
    }
    rows = []
    for name, layer in layers.items():
        for kind in ('forward', 'forward+backward'):
            def fn():
                if kind == 'forward':
                    with torch.no_grad():
                        layer(x)
                else:
                    layer(x).sum().backward()
            with flop_counter() as fc:
                fn()
            t = time_call(fn, steps, repeats)
            rows.append(dict(layer=name, **{'pass': kind}, ms=1000 * t, gflops=fc.get_total_flops() / 1e9,
                             gflop_per_s=fc.get_total_flops() / t / 1e9))
            log(f'{name:34s} {kind:17s} {1000 * t:8.2f} ms  {rows[-1]["gflop_per_s"]:7.1f} GFLOP/s')
    return rows


class _ScoreNormStep:
    """Forward + backward of one elementwise-over-scores function of ``a [tokens, n]`` (a timed runner)."""

    def __init__(self, name, fn, a, grad):
        self.name, self.fn, self.a, self.grad = name, fn, a, grad

    def __call__(self):
        self.a.grad = None
        self.fn(self.a).backward(self.grad)


def score_norm_variants(num_tokens: int, device='cpu', compile_: bool = True) -> dict:
    """``{name: fn}``, each ``fn(a [..., num_tokens]) -> same shape``: the ViT's GELU over its hidden units
    and Θ of Eq. 5 (``l2_norm_gelu``, the default τ = √n) differentiated three ways: the closed form (the
    default, ``tkvision/layers/pattention_autograd.py``), plain autograd (the reference, `L2NormGELU`) and
    ``torch.compile`` of the plain one (inductor fuses its passes; ``compile_=False`` leaves it out); τ is a
    0-d tensor on ``device``, as a Pattention's buffer."""
    from tkvision.layers.pattention import L2NormGELU, default_tau
    from tkvision.layers.pattention_autograd import l2_norm_gelu
    tau = torch.tensor(default_tau('l2_norm_gelu', num_tokens), device=device)
    eps, plain = 1e-6, L2NormGELU()
    variants = {'GELU (the ViT MLP\'s activation)': F.gelu,
                'Θ closed form (the default)': lambda a: l2_norm_gelu(a, tau, eps),
                'Θ plain autograd (reference)': lambda a: plain(a, tau, eps)}
    if compile_:
        variants['Θ plain autograd, torch.compile'] = torch.compile(lambda a: plain(a, tau, eps), dynamic=False)
    return variants


def benchmark_score_norm(tokens=128 * 17, num_tokens=72, steps=50, repeats=7, device='cpu', compile_=True,
                         log=print) -> list:
    """Forward + backward over one Pattention's scores ``[tokens, num_tokens]`` (default: the quick recipe's
    batch 128 x 17 tokens and the equal-parameter 72 parameter tokens), fp32 on ``device``, for each of
    `score_norm_variants`, interleaved over ``repeats`` rounds of ``steps`` calls (compilation is
    done in the warm-up). What a Θ costs beyond the GELU a ViT applies to as many elements is the part of
    the TokenFormer step no GEMM explains (``docs/performance.md``).

    Returns rows ``variant, us`` (median µs per forward + backward), ``vs_gelu`` (median over rounds of
    the time over GELU's in the same round) and ``ratio_runs`` (each round's).
    """
    device = torch.device(device)
    a = torch.randn(tokens, num_tokens, device=device, requires_grad=True)
    grad = torch.randn(tokens, num_tokens, device=device)
    variants = score_norm_variants(num_tokens, device, compile_)
    runners = [_ScoreNormStep(name, fn, a, grad) for name, fn in variants.items()]
    times = time_rounds(runners, device, warmup=3, steps=steps, repeats=repeats)
    gelu = times[runners[0].name]
    rows = []
    for r in runners:
        paired = [t / g for t, g in zip(times[r.name], gelu)]
        rows.append(dict(variant=r.name, tokens=tokens, num_tokens=num_tokens,
                         us=1e6 * statistics.median(times[r.name]), vs_gelu=statistics.median(paired),
                         ratio_runs=' '.join(f'{v:.3f}' for v in paired)))
        log(f"{r.name:36s} {rows[-1]['us']:9.1f} us  {rows[-1]['vs_gelu']:.3f}x GELU's time")
    return rows


def _pattention_part(args) -> tuple:
    rows = benchmark_pattention()
    return rows, ['### Pattention vs the layers it replaces (ViT-B shapes, fp32)',
                  markdown_table(rows, ['layer', 'pass', 'ms', 'gflops', 'gflop_per_s']), '']


def _score_norm_part(args) -> tuple:
    shape = dict(zip(('tokens', 'num_tokens'), args.score_shape or ()))  # none given: the function's default
    rows = benchmark_score_norm(**shape, repeats=args.repeats, device=args.device)
    where = f'[{shape["tokens"]}, {shape["num_tokens"]}]' if shape else "the quick recipe's"
    return rows, [f'### Θ against GELU over {where} scores, forward + backward',
                  markdown_table(rows, ['variant', 'us', 'vs_gelu', 'ratio_runs']), '']


def _data_part(args) -> tuple:
    from studies.performance.data_benchmark import benchmark_data  # albumentations: only this part needs it
    tables = benchmark_data(args.data_root, args.data_images, tuple(args.workers))
    return tables, ['### JPEG decoding, one thread', markdown_table(tables['decode'], ['decoder', 'img_per_s']), '',
                    '### Training augmentation at 224 px, one thread',
                    markdown_table(tables['augment'], ['pipeline', 'img_per_s']), '',
                    '### DataLoader: decode + augmentation + uint8 batches',
                    markdown_table(tables['loader'], ['source', 'workers', 'img_per_s', 'img_per_s_per_worker']), '']


def _loader_part(args) -> tuple:
    from studies.performance.data_benchmark import benchmark_loaders  # albumentations: only this part needs it
    rows = benchmark_loaders(args.data_root, args.data_images, tuple(args.workers), repeats=args.repeats)
    return rows, ['### Our training loader against timm\'s create_loader (ImageNet recipe augmentations)',
                  markdown_table(rows, ['loader', 'workers', 'resize', 'img_per_s', 'img_per_s_per_worker', 'vs_timm',
                                        'vs_timm_no_prefetcher',
                                        'ratio_runs']), '']


#: The library's parts and the study's, in the order they run.
PARTS = {**LIBRARY_PARTS, 'pattention': _pattention_part, 'score_norm': _score_norm_part, 'data': _data_part,
         'loader': _loader_part}


def main(argv=None) -> int:
    """``python -m studies.performance.layer_benchmark``: ``tkvision-benchmark``'s options and parts, and these;
    user errors are one line (exit 2)."""
    return run_cli(_main, argv)


def _main(argv) -> int:
    ap = benchmark_parser(PARTS)
    ap.add_argument('--score-shape', type=positive_int, nargs=2, metavar=('TOKENS', 'NUM_TOKENS'),
                    help="--parts score_norm: the scores Θ normalises (default: the quick recipe's)")
    ap.add_argument('--data-root', help='--parts data: an ImageNet-layout folder (default: Fashion-MNIST JPEGs)')
    ap.add_argument('--data-images', type=positive_int, default=256, help='--parts data: images decoded per round')
    ap.add_argument('--workers', type=non_negative_int, nargs='+', default=[1, 2],
                    help='--parts data: loader worker counts')
    args = parse_benchmark_args(ap, argv)
    command = 'python -m studies.performance.layer_benchmark ' + ' '.join(argv)
    run_benchmark(args, command, PARTS)
    return 0


if __name__ == '__main__':
    sys.exit(main())
