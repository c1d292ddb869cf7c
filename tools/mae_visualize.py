#!/usr/bin/env python
"""MAE reconstructions: ``python tools/mae_visualize.py --checkpoint RUN/last.pth --out recon.png``.

Thin wrapper over `tkvision.cli.weights.mae_visualize_main` (also installed as ``tkvision-mae-visualize``).
"""
import sys

from tkvision.cli.weights import mae_visualize_main as main

if __name__ == '__main__':
    sys.exit(main())
