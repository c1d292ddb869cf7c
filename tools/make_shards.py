#!/usr/bin/env python
"""Write WebDataset tar shards of an ImageNet-layout folder:
``python tools/make_shards.py --src /data/imagenet --out /data/imagenet-wds [--max-count 10000]``.

Thin wrapper over `tkvision.cli.data.make_shards_main` (also installed as ``tkvision-make-shards``).
"""
import sys

from tkvision.cli.data import make_shards_main as main

if __name__ == '__main__':
    sys.exit(main())
