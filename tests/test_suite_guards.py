"""The suite's own guards, which keep it inside its budget as it grows (tests/conftest.py): a tier past its budget
fails naming its slowest test, and a test over the slow marker's limit fails unless marked."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = 'import time\n\n\ndef test_sleeps():\n    time.sleep(1.5)\n\n\ndef test_returns():\n    pass\n'


def _pytest(tmp_path, **env):
    (tmp_path / 'test_probe.py').write_text(PROBE)
    return subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'tests.conftest', '-p', 'no:cacheprovider',
                           '--rootdir', str(tmp_path), str(tmp_path / 'test_probe.py')],
                          cwd=ROOT, env={**os.environ, 'TKVISION_BUDGET_SECONDS': '', 'TKVISION_SLOW_SECONDS': '',
                                         **env}, capture_output=True, text=True)


@pytest.mark.slow
def test_a_tier_past_its_budget_fails_naming_its_slowest_test(tmp_path):
    res = _pytest(tmp_path, TKVISION_BUDGET_SECONDS='1')
    assert res.returncode == 1, res.stdout[-2000:]
    line = next(x for x in res.stdout.splitlines() if 'past their budget of 1 s' in x)
    assert line.split(': ', 1)[1].startswith('test_probe.py::test_sleeps ('), line
    assert _pytest(tmp_path, TKVISION_BUDGET_SECONDS='600').returncode == 0


def test_an_unmarked_test_over_the_slow_limit_fails_naming_it(tmp_path):
    res = _pytest(tmp_path, TKVISION_SLOW_SECONDS='1')
    assert res.returncode == 1 and 'not marked slow took more than 1 s' in res.stdout, res.stdout[-2000:]
    assert 'test_probe.py::test_sleeps' in res.stdout and 'test_returns' not in res.stdout.split('more than 1 s')[1]
