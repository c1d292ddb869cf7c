#!/usr/bin/env python
"""Write WebDataset tar shards of an ImageNet-layout folder:
``python tools/make_shards.py --src /data/imagenet --out /data/imagenet-wds [--max-count 10000]``.

Thin wrapper over :func:`tkvision.shards.main` (also installed as ``tkvision-make-shards``).
"""
import sys

from tkvision.shards import main

if __name__ == '__main__':
    sys.exit(main())
