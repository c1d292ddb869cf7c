#!/usr/bin/env python
"""Measure TokenFormer† against timm's ViT on a lent GPU, one markdown report: ``make bench-gpu``.

Thin wrapper over :func:`tkvision.cli.experiments.gpu_report_main` (also installed as ``tkvision-gpu-report``).
"""
import sys

from tkvision.cli.experiments import gpu_report_main as main

if __name__ == '__main__':
    sys.exit(main())
