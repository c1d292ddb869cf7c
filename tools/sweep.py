#!/usr/bin/env python
"""Ablation sweep: ``python tools/sweep.py configs/ablations/fashion_mnist/*.yaml --seeds 0 1 --out runs/ablations``.

Thin wrapper over `tkvision.cli.experiments.sweep_main` (also installed as ``tkvision-sweep``).
"""
import sys

from tkvision.cli.experiments import sweep_main as main

if __name__ == '__main__':
    sys.exit(main())
