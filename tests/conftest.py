"""Shared test fixtures: tiny models (seconds on a 2-core CPU), one thread for steady timing.

With ``TKVISION_NO_SKIPS=1`` (set by ``make test``, which installs every test extra) a run with any
skipped test fails: a broken install of an extra must not pass CI green by skipping its tests.

With ``TKVISION_SLOW_SECONDS=N`` a test not marked ``slow`` whose call took more than N seconds fails the run, named
with its time. ``setup.cfg``'s ``slow`` marker is for a test of 20 s or more alone on 2 cores; ``make test`` runs the
suite on both cores (``pytest -n 2``, where two tests share them) and sets 30 (VMs differ by up to 2x); the budget of
the whole suite is ``DEVELOPERS.md``'s. With ``TKVISION_BUDGET_SECONDS=N`` a session whose wall time passed N seconds
fails, naming its five slowest tests (``make test`` sets 1.5 times its budget, ``make test-slow`` twice it: Makefile).
"""
import os
import time

import pytest
import torch

import tkvision  # noqa: F401  (registers the models)

torch.set_num_threads(1)

#: A tiny TokenFormer: 2 blocks, d 32, on 32x32 RGB images with 8x8 patches (16 patches).
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=7)


@pytest.fixture
def tiny_kwargs():
    return dict(TINY)


_SLOW: dict = {}
_TIMES: dict = {}
_START = time.monotonic()


def pytest_runtest_logreport(report):
    """Keep the call time of each test not marked ``slow`` that passed (in the controller under pytest-xdist)."""
    if report.when == 'call' and report.passed and 'slow' not in report.keywords:
        _SLOW[report.nodeid] = report.duration
    if report.when == 'call':
        _TIMES[report.nodeid] = report.duration


def _check_budget(session, reporter) -> None:
    """With ``TKVISION_BUDGET_SECONDS=N``: a session (in the controller) whose wall time passed N seconds fails,
    naming its five slowest tests, so the test that breaks a tier's budget is named in CI."""
    budget = float(os.environ.get('TKVISION_BUDGET_SECONDS') or 0)
    wall = time.monotonic() - _START
    if budget and wall > budget and reporter is not None and not hasattr(session.config, 'workerinput'):
        slowest = sorted(_TIMES.items(), key=lambda item: -item[1])[:5]
        reporter.write_line(f'the tests took {wall:.0f} s, past their budget of {budget:g} s (make the slowest '
                            'cheaper, or mark a test of 20 s or more slow): ' +
                            ', '.join(f'{n} ({d:.0f} s)' for n, d in slowest), red=True)
        session.exitstatus = 1


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin('terminalreporter')
    skipped = reporter.stats.get('skipped', []) if reporter is not None else []
    if skipped and os.environ.get('TKVISION_NO_SKIPS') and exitstatus == 0:
        reporter.write_line(f'{len(skipped)} test(s) skipped under TKVISION_NO_SKIPS=1: ' +
                            ', '.join(r.nodeid for r in skipped[:5]) + ' -- install the test extras', red=True)
        session.exitstatus = 1
    _check_budget(session, reporter)
    limit = float(os.environ.get('TKVISION_SLOW_SECONDS') or 0)
    over = sorted((d, n) for n, d in _SLOW.items() if limit and d > limit)
    if over and reporter is not None and not hasattr(session.config, 'workerinput'):
        reporter.write_line(f'{len(over)} test(s) not marked slow took more than {limit:g} s (mark them '
                            '@pytest.mark.slow, or make them cheaper): ' +
                            ', '.join(f'{n} ({d:.0f} s)' for d, n in reversed(over)), red=True)
        session.exitstatus = 1
