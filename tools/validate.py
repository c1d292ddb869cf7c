#!/usr/bin/env python
"""Evaluate weights: ``python tools/validate.py --model M --checkpoint W [--config C] [--data-dir D]``.

Thin wrapper over `tkvision.cli.train.validate_main` (also installed as ``tkvision-validate``).
"""
import sys

from tkvision.cli.train import validate_main as main

if __name__ == '__main__':
    sys.exit(main())
