"""TokenFormer against the ViT it replaces, on equal footing (paper Table 2 at the scale we can
run): the results files of ``docs/comparison.md``.

``python -m studies.comparison.comparison studies/comparison/configs/*.yaml --seeds 0 1 2 --out runs/comparison
--report-dir docs/comparison`` trains every (config, seed) point through
[`run_sweep`][tkvision.experiments.sweep.run_sweep] (finished points are skipped), then writes three files into
``--report-dir``:

- ``points.csv``: one row per finished (config, seed): validation top-1 (what a choice is made on), test
  top-1 (evaluated once, at the end), img/s and the wall minutes of that run (a resumed run's parts summed:
  the sweep's record).
- ``paired.csv``: every ordered pair of configs, their differences seed by seed (`paired_rows`).
- ``results.csv``: one row per config: model, parameter tokens, epochs, trainable parameters, training
  GFLOPs per image (forward + backward, counted by ``FlopCounterMode``: `train_flops_per_image`),
  the run's training TFLOPs (GFLOPs x images x epochs), img/s and minutes (means over seeds), validation
  and test top-1 (mean and sample std over seeds; one seed's std is empty), and the img/s, minutes and
  compute of each row as a ratio to the reference row (``--reference``, timm's ViT), and ``changes``: what
  the config sets otherwise than the reference's (`config_changes_from`), the settings column of the
  levers' table.

``--time`` trains nothing to the end: it times each config's training in our trainer alone (one
epoch over ``--time-images`` images, the configs interleaved, ``--repeats`` rounds, the median) into
``speed.csv``, the ratios an equal-wall-clock budget is set from (the sweep's own img/s share the
machine with whatever else runs; these runs must not).

``--report-only`` trains nothing and reports the points finished so far (while others still train).
A report keeps the points an earlier ``points.csv`` in ``--report-dir`` holds unless they are measured
again (`merge_points`): ``runs/`` does not travel between machines, the points file does.
``--from-points docs/comparison/points.csv`` re-derives ``results.csv`` from the stored points with the
current code (``tests/test_docs.py`` does, so the file cannot drift from the points and the configs).

``--curve-epochs 6 12 ...`` with a report from the runs keeps each point's ``metrics.csv`` in ``--report-dir`` as
``<config>_seed<k>_metrics.csv`` (`keep_metrics`) and writes ``curves.csv`` from those files
(`curve_rows`: validation top-1 and training loss at those epochs), with
``--from-points`` too (from the metrics files beside the points file). ``--time-to 80`` with them also writes
``time_to.csv`` (`time_to_rows`): when each run's validation top-1 first reached that figure, in epochs and wall
minutes, or that it never did.
"""
import argparse
import csv
import datetime
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile

import torch

from studies.growth.growth_experiment import train_flops_per_image
from tkvision.cli import run_cli
from tkvision.data import split_size
from tkvision.engine.config import TrainConfig, load_config, model_for_config, resolve_run_config, section
from tkvision.engine.trainer import train
from tkvision.experiments.benchmark import machine_info
from tkvision.experiments.points import PROVENANCE_KEYS, point_dir, with_provenance
from tkvision.experiments.sweep import expand_configs, mean_std, run_sweep
from tkvision.utils.errors import UsageError
from tkvision.utils.files import atomic_write

__all__ = ['run_comparison', 'collect_points', 'config_changes_from', 'time_configs', 'speed_rows', 'write_speed',
           'points_from_records', 'read_points', 'merge_points', 'comparison_rows', 'write_report', 'keep_metrics',
           'curve_rows', 'write_curves', 'time_to_rows', 'write_time_to', 'paired_rows']

#: Columns of ``points.csv``.
POINT_COLUMNS = ['config', 'seed', 'top1', 'test_top1', 'img_per_s', 'minutes']
#: What ran each point (its record's ``machine`` and ``commit``; ``unknown`` where a point was recorded without
#: them): written after `POINT_COLUMNS`, so the docs' compare marker can say when two sides differ.
PROVENANCE_COLUMNS = list(PROVENANCE_KEYS)


def _name(config: str) -> str:
    return os.path.splitext(os.path.basename(config))[0]


def points_from_records(records: list) -> list:
    """The finished sweep records as ``points.csv`` rows (failed points are left out)."""
    return [with_provenance({**{k: r[k] for k in POINT_COLUMNS}, **{k: r.get(k) for k in PROVENANCE_COLUMNS}})
            for r in records if r.get('status') == 'ok']


def read_points(path: str) -> list:
    """The rows of a stored ``points.csv``, figures as floats and seeds as ints.

    Raises:
        UsageError: a file without `POINT_COLUMNS`, or a row whose figure is not a number (file and row
            named).
    """
    with open(path) as f:
        reader = csv.DictReader(f)
        missing = [c for c in POINT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UsageError(f'{path} is not a points file: it lacks the columns {", ".join(missing)} (a points.csv '
                             f'has {", ".join(POINT_COLUMNS)})')
        rows = []
        for line, r in enumerate(reader, 2):
            try:
                rows.append(with_provenance({**r, 'seed': int(r['seed']),
                                             **{k: float(r[k]) for k in POINT_COLUMNS[2:]}}))
            except (TypeError, ValueError):
                raise UsageError(f'{path}, row {line}: a seed or figure that is not a number ({dict(r)})') from None
        return rows


#: `_model_counts` of each model already counted in this process, by what builds it.
_COUNTED: dict = {}


def _model_counts(resolved: TrainConfig) -> tuple:
    """(trainable parameters, training GFLOPs per image) of ``resolved``'s model, counted once per model in a
    process: the configs of a study that change only the recipe (rates, initialisation, augmentation) build the
    same model, and counting its FLOPs runs it forward and backward."""
    key = repr((resolved.run.task, resolved.model, resolved.mae, resolved.data))
    if key not in _COUNTED:
        with torch.device('meta'):
            params = sum(p.numel() for p in model_for_config(resolved).parameters() if p.requires_grad)
        _COUNTED[key] = params, train_flops_per_image(resolved.to_dict()) / 1e9
    return _COUNTED[key]


def _config_row(config: str, points: list) -> dict:
    """One ``results.csv`` row: what the config trains (read from the file) and its seeds' figures."""
    resolved = resolve_run_config(load_config(config))
    cfg = resolved.to_dict()
    params, gflops = _model_counts(resolved)
    images = split_size(section(cfg, 'data'), 'train', cfg['seed'])  # after the validation carve-out
    top1, test = mean_std([p['top1'] for p in points], 2), mean_std([p['test_top1'] for p in points], 2)
    return dict(config=_name(config), model=cfg['model'], num_tokens=cfg['model_kwargs'].get('num_tokens', ''),
                embed_dim=cfg['model_kwargs'].get('embed_dim', ''), epochs=cfg['epochs'], params=params,
                train_gflops_per_image=gflops, train_tflops=gflops * images * cfg['epochs'] / 1e3,
                seeds=len(points), img_per_s=round(statistics.mean(p['img_per_s'] for p in points), 1),
                minutes=round(statistics.mean(p['minutes'] for p in points), 2),
                top1_mean=top1[0], top1_std=top1[1], test_top1_mean=test[0], test_top1_std=test[1])


def config_changes_from(reference: dict, cfg: dict) -> str:
    """What config ``cfg`` sets otherwise than ``reference`` (both as
    [`load_config`][tkvision.engine.config.load_config] returns them, defaults filled in): ``'key=value'`` per
    differing top-level key and per differing ``model_kwargs`` entry (named by the entry alone), sorted, joined by
    ``'; '``; ``'key=(unset)'`` for a model kwarg only the reference sets; ``''`` when nothing differs. ``output``
    (where a run is written) is not a setting."""
    changes = []
    for key in sorted(set(reference) | set(cfg)):
        old, new = reference.get(key), cfg.get(key)
        if key == 'output' or old == new:
            continue
        if key == 'model_kwargs':
            old, new = old or {}, new or {}
            changes += [f"{k}={new.get(k, '(unset)')}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        else:
            changes.append(f'{key}={new}')
    return '; '.join(sorted(changes))


def comparison_rows(configs: list, points: list, reference: str) -> list:
    """One row per config that has finished points, in ``configs``' order, with ``*_vs_reference``
    ratios (img/s, minutes, training compute) to the row named ``reference``, the differences of its seed means
    of validation and test top-1 from the reference's (``top1_gap``, ``test_top1_gap``, points, from the unrounded
    means), and the ``changes`` its config makes to the reference's (`config_changes_from`).

    Raises:
        UsageError: no finished point of the reference config (the ratios would have no base).
    """
    rows = [_config_row(c, [p for p in points if p['config'] == _name(c)]) for c in configs
            if any(p['config'] == _name(c) for p in points)]
    base = next((r for r in rows if r['config'] == reference), None)
    if base is None:
        raise UsageError(f'--reference {reference}: no finished point of that config (configs with points: '
                         f"{', '.join(r['config'] for r in rows) or 'none'}): train it, or report from a points file")
    paths = {_name(c): c for c in configs}
    reference_cfg = load_config(paths[reference])
    mean = {(name, key): statistics.mean(p[key] for p in points if p['config'] == name)
            for name in {r['config'] for r in rows} for key in ('top1', 'test_top1')}
    for r in rows:
        r.update(img_per_s_vs_reference=round(r['img_per_s'] / base['img_per_s'], 3),
                 minutes_vs_reference=round(r['minutes'] / base['minutes'], 3),
                 compute_vs_reference=round(r['train_tflops'] / base['train_tflops'], 3),
                 top1_gap=round(mean[r['config'], 'top1'] - mean[reference, 'top1'], 2),
                 test_top1_gap=round(mean[r['config'], 'test_top1'] - mean[reference, 'test_top1'], 2),
                 changes=config_changes_from(reference_cfg, load_config(paths[r['config']])))
    return rows


def paired_rows(points: list) -> list:
    """Every ordered pair of configs with seeds in common: ``dict(config, against, seeds, top1_diffs,
    test_top1_diffs, top1_higher)``, the differences seed by seed (``config`` minus ``against``, points, two
    decimals, ``'+0.43, +0.40, +0.67'`` in seed order), and in how many of those seeds ``config`` validates higher.
    What a sentence's "paired: +0.43, +0.40, +0.67" or "below it in every paired seed" renders from
    (``paired.csv``)."""
    by_config: dict = {}
    for p in points:
        by_config.setdefault(p['config'], {})[p['seed']] = p
    rows = []
    for config, mine in by_config.items():
        for against, theirs in by_config.items():
            seeds = sorted(set(mine) & set(theirs))
            if against == config or not seeds:
                continue
            diffs = {key: [mine[s][key] - theirs[s][key] for s in seeds] for key in ('top1', 'test_top1')}
            rows.append(dict(config=config, against=against, seeds=' '.join(map(str, seeds)),
                             top1_diffs=', '.join(f'{d:+.2f}' for d in diffs['top1']),
                             test_top1_diffs=', '.join(f'{d:+.2f}' for d in diffs['test_top1']),
                             top1_higher=sum(d > 0 for d in diffs['top1'])))
    return rows


def _write_csv(path: str, rows: list, columns: list):
    def write(f):
        w = csv.DictWriter(f, fieldnames=columns, lineterminator='\n')
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)


def merge_points(stored: list, new: list) -> list:
    """``stored`` points (an earlier ``points.csv``) updated by ``new`` ones: a (config, seed) measured again
    takes the new row, every other stored row stays. Runs live under ``runs/``, which a fresh checkout lacks,
    so a report written from the runs finished today must not drop the points finished on another machine.
    Rows are ordered by each config's first appearance, then by seed."""
    merged = {(p['config'], p['seed']): p for p in stored}
    merged.update({(p['config'], p['seed']): p for p in new})
    order = list(dict.fromkeys(config for config, _ in merged))
    return [merged[k] for k in sorted(merged, key=lambda k: (order.index(k[0]), k[1]))]


def write_report(configs: list, points: list, report_dir: str, reference: str, write_points: bool = True) -> list:
    """Write ``results.csv`` (and ``points.csv`` unless ``write_points`` is False) into ``report_dir``;
    returns the result rows. With ``write_points``, the points already in ``report_dir/points.csv`` are
    kept where ``points`` does not measure them again (`merge_points`), and the results are taken
    over all of them."""
    os.makedirs(report_dir, exist_ok=True)
    stored = os.path.join(report_dir, 'points.csv')
    if write_points and os.path.isfile(stored):
        points = merge_points(read_points(stored), points)
    rows = comparison_rows(configs, points, reference)
    if write_points:
        _write_csv(os.path.join(report_dir, 'points.csv'), [with_provenance(p) for p in points],
                   POINT_COLUMNS + PROVENANCE_COLUMNS)
    if rows:
        _write_csv(os.path.join(report_dir, 'results.csv'), rows, list(rows[0]))
        paired = paired_rows([p for p in points if p['config'] in {r['config'] for r in rows}])
        _write_csv(os.path.join(report_dir, 'paired.csv'), paired, list(paired[0]) if paired else ['config'])
    return rows


def collect_points(configs: list, seeds: list, out: str) -> list:
    """The finished points under ``out`` (each ``<config>/seed<k>/result.json`` the sweep wrote), trained or
    not: what ``--report-only`` reports while other points are still training."""
    records = []
    for config in configs:
        for seed in seeds:
            path = os.path.join(point_dir(out, config, seed), 'result.json')
            if os.path.isfile(path):
                with open(path) as f:
                    records.append(json.load(f))
    return points_from_records(records)


def run_comparison(configs: list, seeds: list, out: str, report_dir: str, reference: str, extra=(), log=print) -> list:
    """Train the points not yet finished ([`run_sweep`][tkvision.experiments.sweep.run_sweep] under ``out``),
    then `write_report` from every finished one; returns the result rows."""
    records = run_sweep(configs, seeds, out, extra=extra, log=log)
    return write_report(configs, points_from_records(records), report_dir, reference)


def time_configs(configs: list, images: int, repeats: int, reference: str, log=print) -> list:
    """Training img/s of each config in our trainer: ``repeats`` rounds, each training every config for one
    epoch over its first ``images`` training images (configs interleaved, so a slow spell of the machine
    hits them all); rows as `speed_rows` makes them, with the ``machine`` and ``date``.

    Raises:
        ValueError: ``reference`` is not one of ``configs``.
    """
    names = [_name(c) for c in configs]
    if reference not in names:
        raise ValueError(f"--reference {reference} is not one of the timed configs ({', '.join(names)})")
    runs = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for config, name in zip(configs, names):
                cfg = load_config(config, dict(epochs=1, warmup_epochs=0, train_subset=images, val_subset=images // 10,
                                               output=os.path.join(tmp, f'{name}_{r}'), progress=False))
                runs[name].append(train(cfg)['history'][-1]['img_per_s'])
                log(f'[time] {name} round {r + 1}/{repeats}: {runs[name][-1]:.0f} img/s')
    stamp = dict(machine=machine_info(torch.device('cpu')), date=datetime.date.today().isoformat())
    return [dict(row, **stamp) for row in speed_rows(configs, runs, images, reference)]


def speed_rows(configs: list, runs: dict, images: int, reference: str) -> list:
    """One row per config from ``runs`` (``{config name: [img/s of each round]}``): ``config, model,
    num_tokens, images, repeats, img_per_s`` (median), ``img_per_s_runs`` ('a b c'), and
    ``img_per_s_vs_reference``: the median over rounds of the ratio to ``reference`` in the same round
    (paired, so a machine that slows down during the rounds does not bias it)."""
    rows = []
    for config in configs:
        name, cfg = _name(config), load_config(config)
        ratios = [a / b for a, b in zip(runs[name], runs[reference])]
        rows.append(dict(config=name, model=cfg['model'], num_tokens=cfg['model_kwargs'].get('num_tokens', ''),
                         images=images, repeats=len(runs[name]), img_per_s=round(statistics.median(runs[name]), 1),
                         img_per_s_runs=' '.join(f'{v:.1f}' for v in runs[name]),
                         img_per_s_vs_reference=round(statistics.median(ratios), 3)))
    return rows


def write_speed(rows: list, report_dir: str):
    """``speed.csv`` in ``report_dir`` (`time_configs`' rows)."""
    os.makedirs(report_dir, exist_ok=True)
    _write_csv(os.path.join(report_dir, 'speed.csv'), rows, list(rows[0]))


def keep_metrics(configs: list, seeds: list, out: str, report_dir: str) -> list:
    """Copy each finished point's ``metrics.csv`` (one row per epoch) from ``out`` into ``report_dir`` as
    ``<config>_seed<k>_metrics.csv``: ``runs/`` does not travel, and the curves are drawn from these copies.
    Returns the paths written."""
    kept = []
    for config in configs:
        for seed in seeds:
            run = point_dir(out, config, seed)
            if os.path.isfile(os.path.join(run, 'result.json')):
                kept.append(os.path.join(report_dir, f'{_name(config)}_seed{seed}_metrics.csv'))
                atomic_write(kept[-1], lambda tmp: shutil.copyfile(os.path.join(run, 'metrics.csv'), tmp))
    return kept


#: What ``curves.csv`` shows of each run: (``metrics.csv`` column, decimals): validation top-1 (%), training loss.
CURVE_QUANTITIES = (('top1', 2), ('train_loss', 3))


def curve_rows(metrics_dir: str, epochs: list) -> list:
    """One row per (quantity, run) of `CURVE_QUANTITIES` from the ``<point>_metrics.csv`` files in
    ``metrics_dir``: ``point``, ``quantity`` (the metrics column) and ``epoch_<e>`` for each of ``epochs``
    (1-based, as the trainer prints them), the raw weights' figures after that epoch. Quantity-major, points in
    name order.

    Raises:
        ValueError: a metrics file without one of ``epochs`` (named with the epochs it has).
    """
    runs = _kept_metrics(metrics_dir)
    for point, by_epoch in runs.items():
        missing = [e for e in epochs if e not in by_epoch]
        if missing:
            raise ValueError(f'{os.path.join(metrics_dir, point)}_metrics.csv has no epoch {missing} (it has '
                             f'1..{max(by_epoch, default=0)}): choose --curve-epochs the runs reached')
    return [dict(point=point, quantity=column, **{f'epoch_{e}': round(float(rows[e][column]), decimals)
                                                  for e in epochs})
            for column, decimals in CURVE_QUANTITIES for point, rows in runs.items()]


def _kept_metrics(metrics_dir: str) -> dict:
    """``{point: {epoch (1-based): metrics row}}`` of each ``<point>_metrics.csv`` in ``metrics_dir``, in name
    order."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(metrics_dir, '*_metrics.csv'))):
        with open(path) as f:
            runs[os.path.basename(path)[:-len('_metrics.csv')]] = {int(r['epoch']) + 1: r for r in csv.DictReader(f)}
    return runs


def time_to_rows(metrics_dir: str, target: float) -> list:
    """One row per ``<point>_metrics.csv`` in ``metrics_dir``: how long its run took to reach ``target`` (%)
    validation top-1. The test split is read once, at a run's end, so the held-out validation images are the curve
    a time to a figure can be read from.

    Returns rows of ``point``, ``target``, ``epoch`` (the first, 1-based, whose top-1 is at least ``target``) and
    ``minutes`` (the run's ``elapsed_minutes`` then: wall clock from its start, evaluation included, a resumed
    run's parts summed), both empty when no epoch reached it, then ``best_top1`` and ``epochs`` (how many ran).
    """
    rows = []
    for point, by_epoch in _kept_metrics(metrics_dir).items():
        reached = next((e for e in sorted(by_epoch) if float(by_epoch[e]['top1']) >= target), None)
        rows.append(dict(point=point, target=target, epoch='' if reached is None else reached,
                         minutes='' if reached is None else round(float(by_epoch[reached]['elapsed_minutes']), 1),
                         best_top1=max(float(r['top1']) for r in by_epoch.values()), epochs=len(by_epoch)))
    return rows


def write_time_to(metrics_dir: str, target: float, report_dir: str) -> list:
    """``time_to.csv`` in ``report_dir`` (`time_to_rows` of ``metrics_dir``); returns the rows."""
    return _write_rows(time_to_rows(metrics_dir, target), report_dir, 'time_to.csv')


def write_curves(metrics_dir: str, epochs: list, report_dir: str) -> list:
    """``curves.csv`` in ``report_dir`` (`curve_rows` of ``metrics_dir``); returns the rows."""
    return _write_rows(curve_rows(metrics_dir, epochs), report_dir, 'curves.csv')


def _write_rows(rows: list, report_dir: str, name: str) -> list:
    """``rows`` as ``report_dir/name`` (their keys the columns; nothing written for no rows); returns them."""
    os.makedirs(report_dir, exist_ok=True)
    if rows:
        _write_csv(os.path.join(report_dir, name), rows, list(rows[0]))
    return rows


def main(argv=None) -> int:
    """``python -m studies.comparison.comparison``; see ``--help``
    . Prints the result rows; exit 2 on a bad setting,
    `EXIT_PREEMPTED` when a signal stopped a point (rerun to resume it)."""
    return run_cli(_comparison, argv)


def _comparison(argv) -> int:
    ap = argparse.ArgumentParser(description='TokenFormer against ViT at equal parameters, compute and time.')
    ap.add_argument('configs', nargs='+', help='config files (globs are expanded; _base_ files are skipped)')
    ap.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    ap.add_argument('--out', default='runs/comparison', help='where the runs train (finished points are skipped)')
    ap.add_argument('--report-dir', default='docs/comparison', help='where points.csv and results.csv go')
    ap.add_argument('--reference', default='vit_equal_width', help='the row the ratios are taken against')
    ap.add_argument('--from-points', metavar='POINTS_CSV', help='train nothing: re-derive results.csv from a '
                    'stored points.csv (python -m studies.comparison.comparison studies/comparison/configs/*.yaml '
                    '--from-points docs/comparison/points.csv)')
    ap.add_argument('--report-only', action='store_true', help='train nothing: report the finished points under --out')
    ap.add_argument('--time', action='store_true', help='only time one epoch of each config, alone, into speed.csv')
    ap.add_argument('--time-images', type=int, default=12800, help='--time: training images per timed epoch')
    ap.add_argument('--repeats', type=int, default=3, help='--time: rounds (configs interleaved); the median')
    ap.add_argument('--curve-epochs', nargs='+', type=int, help='also keep each point\'s metrics.csv in --report-dir '
                    '(<point>_metrics.csv) and write curves.csv: validation top-1 and training loss at these epochs '
                    '(with --from-points: from the metrics files beside its file)')
    ap.add_argument('--time-to', type=float, metavar='TOP1', help='with --curve-epochs: also write time_to.csv, when '
                    'each run\'s validation top-1 (%%) first reached TOP1, in epochs and wall minutes')
    args, extra = ap.parse_known_args(argv)
    if args.time_to is not None and not args.curve_epochs:
        raise UsageError('--time-to reads the metrics files that --curve-epochs keeps: pass --curve-epochs too')
    configs = expand_configs(args.configs)
    metrics_dir = args.report_dir
    if args.time:
        rows = time_configs(configs, args.time_images, args.repeats, args.reference)
        write_speed(rows, args.report_dir)
    elif args.from_points:
        rows = write_report(configs, read_points(args.from_points), args.report_dir, args.reference, write_points=False)
        metrics_dir = os.path.dirname(args.from_points)
    else:
        if args.report_only:
            rows = write_report(configs, collect_points(configs, args.seeds, args.out), args.report_dir, args.reference)
        else:
            rows = run_comparison(configs, args.seeds, args.out, args.report_dir, args.reference, extra)
        if args.curve_epochs:
            keep_metrics(configs, args.seeds, args.out, args.report_dir)
    if args.curve_epochs:
        write_curves(metrics_dir, args.curve_epochs, args.report_dir)
    if args.time_to is not None:
        write_time_to(metrics_dir, args.time_to, args.report_dir)
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == '__main__':
    sys.exit(main())
