#!/usr/bin/env python
"""Mean attention distance: ``python tools/attention_distance.py --config C [--checkpoint W] --out mad.png``.

Thin wrapper over :func:`tkvision.cli.experiments.attention_distance_main` (also installed as ``tkvision-attention-distance``).
"""
import sys

from tkvision.cli.experiments import attention_distance_main as main

if __name__ == '__main__':
    sys.exit(main())
