#!/usr/bin/env python
"""Grown vs from-scratch TokenFormers on Fashion-MNIST: ``python tools/growth_experiment.py [--epochs 4 ...]``.

Thin wrapper over :func:`tkvision.cli.experiments.growth_experiment_main`; see docs/growth.md.
"""
import sys

from tkvision.cli.experiments import growth_experiment_main as main

if __name__ == '__main__':
    sys.exit(main())
