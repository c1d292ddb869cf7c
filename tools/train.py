#!/usr/bin/env python
"""Train a TokenFormer ViT: ``python tools/train.py --config configs/... [--data-dir D] [--resume] [--key value ...]``.

Thin wrapper over `tkvision.cli.train.train_main` (also installed as ``tkvision-train``); run under
``torchrun --nproc_per_node N`` for distributed training.
"""
import sys

from tkvision.cli.train import train_main as main

if __name__ == '__main__':
    sys.exit(main())
