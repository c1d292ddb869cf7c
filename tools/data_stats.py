#!/usr/bin/env python
"""A dataset's per-channel mean and standard deviation over its training split:
``python tools/data_stats.py --dataset cifar10 --data_dir data/cifar10 --out docs/cifar10/stats.csv``.

Thin wrapper over `tkvision.cli.data.data_stats_main` (also installed as ``tkvision-data-stats``).
"""
import sys

from tkvision.cli.data import data_stats_main as main

if __name__ == '__main__':
    sys.exit(main())
