#!/usr/bin/env python
"""Grow a checkpoint: ``python tools/grow.py --checkpoint small.safetensors --model M --to BIGGER
--out grown.safetensors``.

Thin wrapper over `tkvision.cli.weights.grow_main` (also installed as ``tkvision-grow``).
"""
import sys

from tkvision.cli.weights import grow_main as main

if __name__ == '__main__':
    sys.exit(main())
