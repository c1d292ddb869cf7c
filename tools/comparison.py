#!/usr/bin/env python
"""TokenFormer against ViT on equal footing: ``python tools/comparison.py configs/comparison/fashion_mnist/*.yaml
--seeds 0 1 2 --out runs/comparison --report-dir docs/comparison`` (docs/comparison.md).

Thin wrapper over :func:`tkvision.cli.experiments.comparison_main` (also installed as ``tkvision-comparison``).
"""
import sys

from tkvision.cli.experiments import comparison_main as main

if __name__ == '__main__':
    sys.exit(main())
