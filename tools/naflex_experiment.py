#!/usr/bin/env python
"""The NaFlex TokenFormer against NaFlexViT and the fixed-grid TokenFormer, trained by our trainer on
mixed-size Fashion-MNIST and evaluated at unseen lengths and aspect ratios: ``python tools/naflex_experiment.py
--seeds 0 1 2`` (docs/naflex.md).

Thin wrapper over :func:`tkvision.cli.experiments.naflex_experiment_main`.
"""
import sys

from tkvision.cli.experiments import naflex_experiment_main as main

if __name__ == '__main__':
    sys.exit(main())
