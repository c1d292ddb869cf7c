"""Shared test fixtures: tiny models (seconds on a 2-core CPU), one thread for steady timing.

With ``TKVISION_NO_SKIPS=1`` (set by ``make test``, which installs every test extra) a run with any
skipped test fails: a broken install of an extra must not pass CI green by skipping its tests.
"""
import os

import pytest
import torch

import tkvision  # noqa: F401  (registers the models)

torch.set_num_threads(1)

#: A tiny TokenFormer: 2 blocks, d 32, on 32x32 RGB images with 8x8 patches (16 patches).
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=7)


@pytest.fixture
def tiny_kwargs():
    return dict(TINY)


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin('terminalreporter')
    skipped = reporter.stats.get('skipped', []) if reporter is not None else []
    if skipped and os.environ.get('TKVISION_NO_SKIPS') and exitstatus == 0:
        reporter.write_line(f'{len(skipped)} test(s) skipped under TKVISION_NO_SKIPS=1: ' +
                            ', '.join(r.nodeid for r in skipped[:5]) + ' -- install the test extras', red=True)
        session.exitstatus = 1
