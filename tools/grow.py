#!/usr/bin/env python
"""Grow a checkpoint: ``python tools/grow.py --checkpoint small.safetensors --model M --to BIGGER --out grown.safetensors``.

Thin wrapper over :func:`tkvision.growth.main` (also installed as ``tkvision-grow``).
"""
import sys

from tkvision.growth import main

if __name__ == '__main__':
    sys.exit(main())
