#!/usr/bin/env python
"""Ablation sweep: ``python tools/sweep.py configs/ablations/fashion_mnist/*.yaml --seeds 0 1 --out runs/ablations``.

Thin wrapper over :func:`tkvision.sweep.main` (also installed as ``tkvision-sweep``).
"""
import sys

from tkvision.sweep import main

if __name__ == '__main__':
    sys.exit(main())
