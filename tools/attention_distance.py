#!/usr/bin/env python
"""Mean attention distance: ``python tools/attention_distance.py --config C [--checkpoint W] --out mad.png``.

Thin wrapper over :func:`tkvision.attention_distance.main` (also installed as ``tkvision-attention-distance``).
"""
import sys

from tkvision.attention_distance import main

if __name__ == '__main__':
    sys.exit(main())
