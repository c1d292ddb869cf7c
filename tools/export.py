#!/usr/bin/env python
"""Export a training checkpoint as a timm ``save_for_hf`` folder (``timm.create_model('local-dir:PATH')``):
``python tools/export.py --checkpoint runs/x/last.pth --out exported/x [--no-ema]``.

Thin wrapper over `tkvision.cli.weights.export_main` (also installed as ``tkvision-export``).
"""
import sys

from tkvision.cli.weights import export_main as main

if __name__ == '__main__':
    sys.exit(main())
