"""The thread count's default against a pinned 2 on a 2-core machine, alone and beside a second CPU-bound job: the
figure behind ``threads: null`` (``tkvision.engine.distributed.default_threads``) in ``docs/performance.md``.

``python -m studies.performance.threads_benchmark --out docs/bench/cpu_threads`` trains the Fashion-MNIST quick
recipe (``configs/fashion_mnist/quick.yaml``) for one epoch over ``--images`` training images, ``--repeats`` times for
each setting (``threads: null``, the default, and ``threads: 2``) alone and beside a busy loop of one Python process
(a second CPU-bound job), the settings interleaved, and reads each run's training img/s from its ``metrics.csv`` and
its thread choice from its start-up line. Writes ``<out>_<date>.csv`` (one row per run) and ``.md`` (medians, the
ratio of the default to 2 threads in each condition) with the machine and the date. Run it on an otherwise idle
machine: its own busy loop is the only other load it means to measure.
"""
import argparse
import csv
import datetime
import os
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


def one_run(folder: str, threads: str, images: int) -> tuple:
    """``(img/s, start-up line's thread choice)`` of one epoch of the quick recipe with ``threads`` (``'null'``: the
    default)."""
    res = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'train.py'), '--config', 'fashion_mnist/quick',
                          '--epochs', '1', '--train_subset', str(images), '--val_subset', '256', '--threads', threads,
                          '--progress', 'false', '--output', folder], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stdout[-2000:] + res.stderr[-2000:])
    with open(os.path.join(folder, 'metrics.csv')) as f:
        img_per_s = float(list(csv.DictReader(f))[-1]['img_per_s'])
    choice = next(line for line in res.stdout.splitlines() if 'threads' in line).rsplit(', threads ', 1)[-1]
    return img_per_s, 'threads ' + choice


def measure(images: int, repeats: int) -> list:
    """Rows ``condition, setting, round, img_per_s, chosen``: each setting in each condition, rounds interleaved."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for condition in ('alone', 'beside a busy process'):
            busy = (subprocess.Popen([sys.executable, '-c', 'while True: pass']) if condition != 'alone' else None)
            try:
                time.sleep(1.0)
                for r in range(repeats):
                    for setting in ('null', '2'):
                        folder = os.path.join(tmp, f'{len(rows)}')
                        img_per_s, chosen = one_run(folder, setting, images)
                        rows.append(dict(condition=condition, setting=f'threads: {setting}', round=r + 1,
                                         img_per_s=round(img_per_s, 1), chosen=chosen))
                        print(rows[-1], flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    return rows


def summary(rows: list) -> list:
    """Per condition and setting: the median img/s; per condition, the default's ratio to 2 threads."""
    out = []
    for condition in dict.fromkeys(r['condition'] for r in rows):
        medians = {s: statistics.median(r['img_per_s'] for r in rows if r['condition'] == condition and
                                        r['setting'] == s) for s in ('threads: null', 'threads: 2')}
        for setting, value in medians.items():
            out.append({'condition': condition, 'setting': setting, 'median img/s': f'{value:.0f}',
                        'default / 2 threads': f"{medians['threads: null'] / medians['threads: 2']:.2f}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='docs/bench/cpu_threads')
    ap.add_argument('--images', type=int, default=6400, help='training images per timed epoch')
    ap.add_argument('--repeats', type=int, default=3)
    a = ap.parse_args(argv)
    rows = measure(a.images, a.repeats)
    date = datetime.date.today().isoformat()
    stamp = dict(machine=machine_info(torch.device('cpu')).rsplit(', ', 1)[0], date=date, commit=code_commit())
    path = f'{a.out}_{date}'

    write_stamped_csv(path + '.csv', rows, stamp)
    cols = ['condition', 'setting', 'median img/s', 'default / 2 threads']
    text = (f'# The thread default beside another job\n\n{stamp["machine"]}, {date}, commit {stamp["commit"]}; '
            f'`python -m studies.performance.threads_benchmark`; the quick recipe, one epoch of {a.images} images, '
            f'{a.repeats} rounds a setting.\n\n{markdown_table(summary(rows), cols)}\n')
    atomic_write(path + '.md', lambda f: f.write(text), text=True)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2 (tkvision.cli.run_cli)
