#!/usr/bin/env python
"""Build an ImageNet-layout subset (N classes, K images per class) as a folder or as shards:
``python tools/make_subset.py --src /data/imagenet --out /data/imagenet-100 --preset imagenet-small``.

Thin wrapper over `tkvision.cli.data.make_subset_main` (also installed as ``tkvision-make-subset``).
"""
import sys

from tkvision.cli.data import make_subset_main as main

if __name__ == '__main__':
    sys.exit(main())
