"""Shared test fixtures: tiny models (seconds on a 2-core CPU), one thread for steady timing."""
import pytest
import torch

import tkvision  # noqa: F401  (registers the models)

torch.set_num_threads(1)

#: A tiny TokenFormer: 2 blocks, d 32, on 32x32 RGB images with 8x8 patches (16 patches).
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=7)


@pytest.fixture
def tiny_kwargs():
    return dict(TINY)
