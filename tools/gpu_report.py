#!/usr/bin/env python
"""Measure TokenFormer† against timm's ViT on a lent GPU, one markdown report: ``make bench-gpu``.

Thin wrapper over :func:`tkvision.cli.gpu.gpu_report_main` (also installed as ``tkvision-gpu-report``).
"""
import sys

from tkvision.cli.gpu import gpu_report_main as main

if __name__ == '__main__':
    sys.exit(main())
