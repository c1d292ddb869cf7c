#!/usr/bin/env python
"""Check a GPU machine before real work: ``python tools/check_gpu.py [--dry-run] [--out docs/bench/gpu_check]``.

Thin wrapper over `tkvision.cli.experiments.check_gpu_main` (also installed as ``tkvision-check-gpu``; ``make
test-gpu``).
"""
import sys

from tkvision.cli.experiments import check_gpu_main as main

if __name__ == '__main__':
    sys.exit(main())
