#!/usr/bin/env python
"""MAE reconstructions: ``python tools/mae_visualize.py --checkpoint RUN/last.pth --out recon.png``.

Thin wrapper over :func:`tkvision.mae_visualize.main` (also installed as ``tkvision-mae-visualize``).
"""
import sys

from tkvision.mae_visualize import main

if __name__ == '__main__':
    sys.exit(main())
