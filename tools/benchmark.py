#!/usr/bin/env python
"""Benchmark TokenFormer vs timm ViT: ``python tools/benchmark.py --models M1 M2 --mode infer train --batch-size 64``.

Thin wrapper over `tkvision.cli.experiments.benchmark_main` (also installed as ``tkvision-benchmark``).
"""
import sys

from tkvision.cli.experiments import benchmark_main as main

if __name__ == '__main__':
    sys.exit(main())
