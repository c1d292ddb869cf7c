#!/usr/bin/env python
"""Train a TokenFormer ViT: ``python tools/train.py --config configs/... [--data-dir D] [--resume] [--key value ...]``.

Thin wrapper over :func:`tkvision.train.main` (also installed as ``tkvision-train``); run under
``torchrun --nproc_per_node N`` for distributed training.
"""
import sys

from tkvision.train import main

if __name__ == '__main__':
    sys.exit(main())
