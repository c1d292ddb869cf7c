"""What a sweep costs per point beyond its training: the same points run in this process and as jobs of
submitit's local executor, timed alternately, and the table gathered from the folder.

``python -m studies.performance.sweep_overhead --repeats 3`` writes ``docs/sweeps/overhead.csv`` (one row per
executor: seconds per point, median and range over the repeats; for ``local`` its overhead over ``inline``,
which is submission, a new process's start-up and imports, and the wait for the poll that sees the job end;
``collect_seconds``: `tkvision.experiments.sweep.collect` on the finished folder), with the machine, its
load average before the runs and the date. docs/guide/sweeps.md renders from it.

Each point is a tiny TokenFormer for one epoch of 512 Fashion-MNIST images (about a second of training), so
the per-point cost a real sweep pays once per point stands out.
"""
import argparse
import csv
import os
import statistics
import tempfile
import time
from datetime import date

import torch
import yaml

from tkvision.cli import run_cli
from tkvision.experiments.benchmark import machine_info
from tkvision.experiments.launch import Launcher
from tkvision.experiments.sweep import collect, run_sweep

from .. import ROOT

OUT = os.path.join(ROOT, 'docs', 'sweeps', 'overhead.csv')
POINT = dict(model='tokenformer_vit_ti16', rrc_scale=None, epochs=1, warmup_epochs=0.5, batch_size=64, lr=2e-3,
             train_subset=512, val_subset=256, threads=1,
             model_kwargs=dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                               num_tokens=16))


def time_sweep(executor: str, points: int, folder: str) -> float:
    """Seconds per point of a sweep of ``points`` grid points (learning rates) run by ``executor`` in ``folder``."""
    config = os.path.join(folder, 'point.yaml')
    with open(config, 'w') as f:
        yaml.safe_dump(POINT, f)
    grid = ['lr=' + ','.join(f'{0.001 * (k + 1):g}' for k in range(points))]
    start = time.perf_counter()
    records = run_sweep([config], [0], os.path.join(folder, executor), grid=grid,
                        launcher=Launcher(executor=executor), log=lambda *a: None)
    seconds = time.perf_counter() - start
    if len(records) != points or any(r['status'] != 'ok' for r in records):
        raise RuntimeError(f'{executor}: {len(records)} of {points} points finished: {records}')
    return seconds / points


def main(argv=None) -> int:
    """The command (``--help``): a user error is one line, exit 2 (`tkvision.cli.run_cli`)."""
    return run_cli(_main, argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--points', type=int, default=4)
    ap.add_argument('--out', default=OUT)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    times = {'inline': [], 'local': []}
    collect_seconds = []
    for repeat in range(args.repeats):
        order = ('inline', 'local') if repeat % 2 == 0 else ('local', 'inline')
        for executor in order:
            with tempfile.TemporaryDirectory() as folder:
                times[executor].append(time_sweep(executor, args.points, folder))
                start = time.perf_counter()
                collect(os.path.join(folder, executor))
                collect_seconds.append(time.perf_counter() - start)
        print(f"repeat {repeat + 1}: inline {times['inline'][-1]:.2f} s/point, local {times['local'][-1]:.2f} s/point")
    inline = statistics.median(times['inline'])
    rows = []
    for executor, values in times.items():
        rows.append(dict(executor=executor, points=args.points, repeats=args.repeats,
                         seconds_per_point=round(statistics.median(values), 2),
                         seconds_min=round(min(values), 2), seconds_max=round(max(values), 2),
                         overhead_per_point=round(statistics.median(values) - inline, 2),
                         collect_seconds=round(statistics.median(collect_seconds), 2),
                         machine=machine_info(torch.device('cpu')), load_before=round(load, 2),
                         date=date.today().isoformat()))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
