#!/usr/bin/env python
"""Run timm's own model tests (``tests/test_models.py`` of the installed timm release) on our families.

``python tools/timm_upstream_tests.py [--models small|all] [-- extra pytest args]``

The test file comes from the source distribution of the installed timm version on the package
registry (``pip download timm==<version> --no-binary :all:``; cached under ``.cache/``), unchanged but
for the two lists timm itself uses to exclude its own models from tests that do not apply to them:

- ``NON_STD_FILTERS`` gets ``tokenformer_*`` and ``ringformer_*``: ViTs, whose features are tokens
  ``[B, N, C]`` rather than a feature map, as timm lists its own ``vit_*`` (the NaFlex family,
  ``naflexvit_tokenformer_*``, falls under timm's own ``naflexvit*`` and ``*naflex*`` patterns);
- ``EXCLUDE_JIT_FILTERS`` gets ``ringformer_*`` and ``tokenformer_ring_*``: the recurrent families pass a
  level module to their shared block as an argument, which TorchScript cannot script (timm excludes its
  ``hiera_*`` / ``*naflex*`` the same way); ``tests/test_timm_contract.py`` tests ``torch.export`` for them.

A ``conftest.py`` beside the copy imports `tkvision` (which registers the families). ``--models
small`` (default) runs the smallest variant of each family (``make test-timm-upstream``, in CI);
``all`` every registered variant (B and L sizes: long on a CPU). Exit status: pytest's.
"""
import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile

import timm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUR_NON_STD = ("'tokenformer_*'", "'ringformer_*'")
OUR_NO_JIT = ("'ringformer_*'", "'tokenformer_ring_*'")
SELECTIONS = {
    'small': 'tokenformer_vit_ti16 or naflexvit_tokenformer_ti16 or ringformer_vit_small_patch16_224 or '
             'tokenformer_ring_vit_small_patch16_224',
    'all': 'tokenformer or ringformer',
}


def upstream_test_file(cache: str) -> str:
    """``tests/test_models.py`` of the installed timm release, from its source distribution (cached)."""
    version = timm.__version__
    path = os.path.join(cache, f'timm-{version}-test_models.py')
    if os.path.isfile(path):
        return path
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--no-binary', ':all:',
                        f'timm=={version}', '-d', tmp], check=True)
        (sdist,) = [f for f in os.listdir(tmp) if f.endswith('.tar.gz')]
        with tarfile.open(os.path.join(tmp, sdist)) as tar:
            member = tar.getmember(f'timm-{version}/tests/test_models.py')
            text = tar.extractfile(member).read().decode()
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)
    return path


def with_our_exclusions(text: str) -> str:
    """``text`` with our patterns added to timm's ``NON_STD_FILTERS`` and ``EXCLUDE_JIT_FILTERS``.

    Raises:
        RuntimeError: a list is not found (timm changed its test file: the exclusions need a look).
    """
    for name, patterns in (('NON_STD_FILTERS', OUR_NON_STD), ('EXCLUDE_JIT_FILTERS', OUR_NO_JIT)):
        text, n = re.subn(rf'^{name} = \[', f"{name} = [{', '.join(patterns)}, ", text, count=1, flags=re.M)
        if n != 1:
            raise RuntimeError(f'{name} not found in timm {timm.__version__} tests/test_models.py')
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--models', choices=sorted(SELECTIONS), default='small')
    ap.add_argument('--cache', default=os.path.join(ROOT, '.cache'))
    args, pytest_args = ap.parse_known_args(argv)
    source = upstream_test_file(args.cache)
    with tempfile.TemporaryDirectory() as tmp:
        with open(source) as f, open(os.path.join(tmp, 'test_models.py'), 'w') as out:
            out.write(with_our_exclusions(f.read()))
        with open(os.path.join(tmp, 'conftest.py'), 'w') as f:
            f.write('import tkvision  # noqa: F401  (registers our families with timm)\n\n\n'
                    'def pytest_configure(config):\n'
                    "    for mark in ('base', 'cfg', 'cfg_nonstd', 'torchscript', 'features', 'fxforward', "
                    "'fxbackward'):\n"
                    "        config.addinivalue_line('markers', mark)\n")
        cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-W', 'ignore', '--rootdir', tmp,
               os.path.join(tmp, 'test_models.py'), '-k', SELECTIONS[args.models], *pytest_args]
        return subprocess.run(cmd, cwd=tmp).returncode


if __name__ == '__main__':
    from tkvision.cli import run_cli  # the rule every command shares: a user error is one line, exit 2
    sys.exit(run_cli(main))
