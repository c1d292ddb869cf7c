"""Restart-to-first-update time of a compiled run resumed with and without its compile cache (``compile_cache.bin``,
``tkvision.engine.runlog.RunLog.save_compile_cache``): the figure ``docs/reliability.md`` gives for "compile once".

``python -m studies.performance.compile_cache --out docs/bench/cpu_compile_cache`` trains the Fashion-MNIST quick
recipe's TokenFormer (``configs/fashion_mnist/quick.yaml``'s model) with ``compile: true`` until its first
checkpoint and stops it (SIGTERM), then, ``--repeats`` times each in alternation, resumes a copy of that folder with
its cache and a copy without it, each in a new process whose caches on disk start empty (a requeue on another node),
and times from the process's start to the next checkpoint (``checkpoint_every_steps: 1``: the first update after the
restart). Writes ``<out>_<date>.csv`` (one row per restart) and ``.md`` (medians, the ratio) with the machine and
the date.
"""
import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from tkvision.cli import run_cli
from tkvision.experiments.benchmark import code_commit, machine_info, markdown_table
from tkvision.utils.files import atomic_write, write_stamped_csv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 96, depth: 6, num_heads: 3, num_tokens: 96}'


def _args(out: str, model: str) -> list:
    return [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), '--model_kwargs', model, '--rrc_scale', 'null',
            '--epochs', '1', '--batch_size', '64', '--train_subset', '2048', '--val_subset',
            '128', '--threads', '2', '--progress', 'false', '--compile', 'true', '--output', out]


def _fresh_caches(folder: str) -> dict:
    """The environment of a process whose torch.compile caches on disk start empty (inductor's and Triton's, which
    otherwise persist in /tmp between processes on one machine): a requeued job on another node, as
    ``compile_cache.bin`` is for."""
    return dict(os.environ, TORCHINDUCTOR_CACHE_DIR=folder + '_inductor', TRITON_CACHE_DIR=folder + '_triton')


def _wait_for_update(path: str, p: subprocess.Popen, after: float) -> None:
    """Until ``path`` is written later than ``after`` (polled every 20 ms); fails if ``p`` ends first."""
    while not (os.path.exists(path) and os.path.getmtime(path) > after):
        if p.poll() is not None:
            raise RuntimeError(p.communicate()[0][-2000:])
        time.sleep(0.02)


def restart_seconds(folder: str, model: str, cached: bool) -> float:
    """Seconds from a resumed process's start to its first checkpoint (the first update after the restart)."""
    if not cached:
        os.remove(os.path.join(folder, 'compile_cache.bin'))
    checkpoint = os.path.join(folder, 'last.pth')
    start = time.time()
    p = subprocess.Popen(_args(folder, model) + ['--resume', '--checkpoint_every_steps', '1'], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_fresh_caches(folder))
    _wait_for_update(checkpoint, p, start)
    seconds = time.time() - start
    p.send_signal(signal.SIGKILL)
    p.communicate()
    return seconds


def measure(model: str, repeats: int) -> list:
    """Rows ``dict(restart, cache, seconds)``: ``repeats`` restarts each way, alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        first = os.path.join(tmp, 'first')
        p = subprocess.Popen(_args(first, model) + ['--checkpoint_every_steps', '4'], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_fresh_caches(tmp))
        _wait_for_update(os.path.join(first, 'last.pth'), p, 0)
        p.send_signal(signal.SIGTERM)
        p.communicate()
        rows = []
        for r in range(repeats):
            for cached in (True, False):
                copy = os.path.join(tmp, f'copy_{r}_{cached}')
                shutil.copytree(first, copy)
                rows.append(dict(restart=r + 1, cache='with' if cached else 'without',
                                 seconds=round(restart_seconds(copy, model, cached), 2)))
                print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='docs/bench/cpu_compile_cache', help='prefix of the .csv and .md written')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--model-kwargs', default=MODEL, help='the TokenFormer timed (YAML mapping)')
    a = ap.parse_args(argv)
    rows = measure(a.model_kwargs, a.repeats)
    date = datetime.date.today().isoformat()
    stamp = dict(machine=machine_info(torch.device('cpu')), date=date, commit=code_commit())
    path = f'{a.out}_{date}'

    write_stamped_csv(path + '.csv', rows, stamp)
    with_cache = statistics.median(r['seconds'] for r in rows if r['cache'] == 'with')
    without = statistics.median(r['seconds'] for r in rows if r['cache'] == 'without')
    columns = ['cache', 'median seconds to the first update', 'restarts']
    table = markdown_table([dict(zip(columns, ('with', f'{with_cache:.1f}', a.repeats))),
                            dict(zip(columns, ('without', f'{without:.1f}', a.repeats)))], columns)
    text = (f'# Restart to first update, compiled, with and without the compile cache\n\n{stamp["machine"]}, '
            f'{date}, commit {stamp["commit"]}; `python -m studies.performance.compile_cache`; model '
            f'`{a.model_kwargs}`.\n\n{table}\n\nRatio: {with_cache / without:.2f} of the time without the cache.\n')
    atomic_write(path + '.md', lambda f: f.write(text), text=True)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2 (tkvision.cli.run_cli)
