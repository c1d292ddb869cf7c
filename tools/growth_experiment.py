#!/usr/bin/env python
"""Grown vs from-scratch TokenFormers on Fashion-MNIST: ``python tools/growth_experiment.py [--epochs 4 ...]``.

Thin wrapper over :func:`tkvision.growth_experiment.main`; see docs/growth.md.
"""
import sys

from tkvision.growth_experiment import main

if __name__ == '__main__':
    sys.exit(main())
