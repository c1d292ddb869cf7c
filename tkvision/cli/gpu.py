"""Command line of ``tools/gpu_report.py`` (``make bench-gpu``, ``tkvision-gpu-report``), apart from the
other experiment drivers: it imports only what the report needs, so it runs on a GPU image that has
PyTorch, timm and Triton but not albumentations or OpenCV (the trainer's augmentation stack)."""
import argparse
import sys

import torch

from ..experiments.gpu_report import ESTIMATE_S, gpu_report

__all__ = ['gpu_report_main']


def gpu_report_main(argv=None) -> int:
    """``tkvision-gpu-report`` / ``tools/gpu_report.py`` (``make bench-gpu``); see ``--help`` and
    :mod:`tkvision.experiments.gpu_report`. Writes ``<out>_<date>.md`` and ``.json``."""
    ap = argparse.ArgumentParser(description='Measure TokenFormer against timm ViT on a GPU: one markdown report.')
    ap.add_argument('--device', default='cuda', help="'cuda' (the report), or 'cpu' with --tiny (its CI check)")
    ap.add_argument('--out', default='docs/bench/gpu', help='prefix of the report; the date is appended')
    ap.add_argument('--tiny', action='store_true', help='tiny models and images (the CPU check of the command)')
    ap.add_argument('--compile-modes', nargs='+', default=['eager', 'compiled'], choices=['eager', 'compiled'])
    ap.add_argument('--steps', type=int, default=3, help='steps per timed round')
    ap.add_argument('--repeats', type=int, default=3, help='interleaved rounds; the median is reported')
    ap.add_argument('--budget-minutes', type=float, default=None,
                    help="skip a part whose estimated seconds would overrun this (a lent GPU's lease)")
    ap.add_argument('--data-dir', default=None,
                    help="Fashion-MNIST's idx files for the end-to-end run (default: the Debian package's)")
    ap.add_argument('--parts', nargs='+', default=None, choices=sorted(ESTIMATE_S),
                    help='run only these parts (default: all, in the order of the module docstring)')
    args = ap.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        ap.error('no CUDA device here: run on a GPU machine, or pass --device cpu --tiny to check the command')
    command = 'python tools/gpu_report.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    gpu_report(args.device, args.out, args.tiny, tuple(args.compile_modes), args.steps, args.repeats, command,
               args.budget_minutes, args.data_dir, args.parts)
    return 0
