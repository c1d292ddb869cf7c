"""The elastic study (docs/elastic.md): one TokenFormer trained at nested prefixes of its parameter tokens
against TokenFormers trained alone at those sizes, post-hoc truncation of a normally trained one, and a
MatFormer-style ViT, on Fashion-MNIST at the quick recipe; and one at the long recipe against the long runs.

    python -m studies.elastic.elastic_study train --seeds 0 1 2     # the runs (finished ones skipped)
    python -m studies.elastic.elastic_study report                  # docs/elastic/*.csv and the plot
    python -m studies.elastic.elastic_study report-long             # docs/elastic/long*

``train`` runs the points in this process through tkvision's sweep
([`tkvision.experiments.sweep.run_sweep`][tkvision.experiments.sweep.run_sweep]), with the MatFormer ViT of
``matformer_vit.py`` registered. ``report`` reads the finished runs under ``--runs`` and writes, into
``--report-dir``:

- ``points.csv``: one row per (method, seed, prefix): parameters of the prefix, its validation top-1 (the
  last epoch's: what a choice is made on) and test top-1 (evaluated once). Methods: ``elastic`` (and its
  variants ``elastic_random``, ``elastic_all``: their own configs), ``independent``
  (``tokenformer_tokens_<n>``, one run per size), ``post_hoc_tau_kept`` (the 72-token independent run's weights
  evaluated at each prefix with the full layer's τ), ``matformer_vit``,
  and ``mix_n_match`` (per-block prefixes of the elastic run chosen by MatFormer's rule of thumb,
  [`tkvision.growth.elastic.mix_n_match`][tkvision.growth.elastic.mix_n_match], under budgets between the uniform
  sizes).
- ``results.csv``: per (method, prefix): parameters, training compute (forward + backward FLOPs per image
  counted by `tkvision.experiments.benchmark.train_flops_per_image`, times the images the recipe
  trains, the elastic runs' mix of prefixes included) as a ratio to the largest TokenFormer trained alone,
  the validation and test top-1 (mean and sample std over seeds), and the gap to the independently trained
  twin of the same size (validation, with its 95% interval: `gap_interval`).
- ``speed.csv``: inference img/s of each exported sub-model (`export_speed_rows`: the elastic TokenFormer's, the
  FFN-only one's and the MatFormer ViT's), and ``top1_vs_img_per_s.png`` from it (`plot_speed`); the long
  report's img/s of each exported sub-model's architecture (`extract_prefix` then
  timm's builder: the same shapes) against the independently trained twin's, batch 256, timed interleaved.
- ``top1_vs_params.png``: validation top-1 against parameters, one line per method.
- ``meta.json``: the machine, the date, the seeds and the command of the report.

Points a rerun has not finished yet are left out (the report says how many seeds each row has).

``report-long`` reads the long-recipe elastic run (``configs/long/elastic_128.yaml``, trained with ``train
--configs studies/elastic/configs/long/elastic_128.yaml --seeds 0 --out runs/elastic_long``) and sets each
of its prefixes against the long run of that size in docs/comparison/long/results.csv: ``long.csv``
(`long_rows`, with the exported prefixes' img/s), ``long_top1_vs_params.png`` and ``long_meta.json``.
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time

import torch

import studies.elastic.matformer_vit  # noqa: F401  (registers matformer_vit_tiny_patch16_224 with timm)
from studies import ROOT, portable_command
from tkvision.experiments.intervals import gap_interval
from tkvision.cli import run_cli
from tkvision.data import BatchPreprocessor, build_dataset, build_loader, dataset_classes, split_size
from tkvision.engine.checkpoint import LAST_WEIGHTS, model_for_checkpoint
from tkvision.engine.runlog import METRICS_FILE
from tkvision.engine.config import TrainConfig, load_config, resolve_run_config, section
from tkvision.engine.evaluate import evaluate
from tkvision.engine.plotting import plt
from tkvision.experiments.benchmark import (benchmark_models, forward_flops_per_image, machine_info,
                                            train_flops_per_image)
from tkvision.experiments.points import PROVENANCE_KEYS, point_dir, provenance, with_provenance
from tkvision.experiments.sweep import expand_configs, mean_std, run_sweep
from tkvision.growth import elastic
from tkvision.utils.errors import RunError, UsageError
from tkvision.utils.files import atomic_write

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, 'configs')
#: The prefixes every method is evaluated at (fractions of every Pattention's tokens, or of the MLPs' units).
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
#: The independently trained twins: tokens of the Q/K/V/proj/patch Pattentions (the FFN has 4x).
TWINS = {0.25: 'tokenformer_tokens_18', 0.5: 'tokenformer_tokens_36', 0.75: 'tokenformer_tokens_54',
         1.0: 'tokenformer_tokens_72'}
#: The twins distilled from the independently trained largest twin of their seed (``distillation: teacher``):
#: what a teacher alone gives a TokenFormer of each size.
DISTILLED_TWINS = {0.25: 'tokenformer_tokens_18_distilled', 0.5: 'tokenformer_tokens_36_distilled',
                   0.75: 'tokenformer_tokens_54_distilled'}
#: Elastic training runs: config name -> method name in the tables.
ELASTIC = {'elastic': 'elastic', 'elastic_random': 'elastic_random', 'elastic_all': 'elastic_all',
           'elastic_ffn': 'elastic_ffn', 'matformer_vit': 'matformer_vit'}
#: Methods whose prefixes have other sizes than the twins' (only the MLPs or FFNs shrink): set against the
#: others by parameters, not against a twin.
OTHER_SIZES = ('matformer_vit', 'elastic_ffn')
#: The long recipe's elastic run (128 tokens) and the independent long runs at its prefixes, whose figures are
#: read from the long comparison's results (docs/comparison/long/results.csv): fraction -> config name.
LONG_CONFIG = os.path.join(CONFIGS, 'long', 'elastic_128.yaml')
LONG_TWINS = {0.5625: 'tokenformer_token_lr_quarter', 0.75: 'tokenformer_num_tokens_96',
              1.0: 'tokenformer_num_tokens_128'}
LONG_RESULTS = os.path.join(ROOT, 'docs', 'comparison', 'long', 'results.csv')
POINT_COLUMNS = ['method', 'config', 'seed', 'prefix', 'params', 'top1', 'test_top1', 'machine', 'commit']


def teacher_weights(out: str, seed: int) -> str:
    """The weights a ``distillation: teacher`` config of seed ``seed`` learns from: the independently trained
    largest twin of the same seed under ``out``."""
    return os.path.join(point_dir(out, TWINS[1.0], seed), LAST_WEIGHTS)


def _distilled_from_teacher(config: str) -> bool:
    return load_config(config)['distillation'] == 'teacher'


def train(configs, seeds, out, threads: int = None) -> list:
    """Train every (config, seed) not yet finished, seed by seed (so each seed's points land together); the
    configs distilled from a teacher after the others, from that seed's largest twin
    (`teacher_weights`, trained first when it is among ``configs``). ``threads``: each run's CPU threads
    (the configs' when None).

    Returns:
        every record of the sweeps (``tkvision.experiments.sweep.run_sweep``).

    Raises:
        RunError: every point failed (each point's error named), so that a run of nothing exits non-zero.
    """
    records, extra = [], ['--threads', str(threads)] if threads else []
    distilled = [c for c in configs if _distilled_from_teacher(c)]
    plain = [c for c in configs if c not in distilled]
    for seed in seeds:
        records += run_sweep(plain, [seed], out, extra=extra)
        if distilled:
            records += run_sweep(distilled, [seed], out, extra=extra + ['--teacher', teacher_weights(out, seed)])
    failed = [r for r in records if r.get('status') != 'ok']
    if records and len(failed) == len(records):
        raise RunError(f'every point failed ({len(failed)}): ' + '; '.join(
            f"{os.path.basename(r['config'])} seed {r['seed']}: {r.get('error', '?')}" for r in failed[:3])
            + ('; ...' if len(failed) > 3 else '') + f' (records under {out})')
    return records


def _run_config(path: str, seed: int, runs: str) -> dict:
    """The resolved config of the point (``path``, ``seed``) as the sweep trains it under ``runs``."""
    return resolve_run_config(load_config(path, {'seed': seed, 'output': point_dir(runs, path, seed)})).to_dict()


def _config(name: str, seed: int, runs: str) -> dict:
    return _run_config(os.path.join(CONFIGS, f'{name}.yaml'), seed, runs)


def _last_row(run_dir: str):
    """The last epoch's metrics of a finished run (its ``result.json`` written), else None."""
    if not os.path.isfile(os.path.join(run_dir, 'result.json')):
        return None
    path = os.path.join(run_dir, METRICS_FILE)
    with open(path, encoding='utf-8', errors='strict') as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise UsageError(f'{path} holds no epoch though the run is marked finished (result.json): the file was '
                         'cut short; rerun the point (delete its folder, then train again)')
    return rows[-1]


def elastic_points(runs: str, seeds) -> list:
    """Rows of `POINT_COLUMNS` for the elastic runs (each prefix as the run reported it) and the
    independently trained twins."""
    rows = []
    for seed in seeds:
        for method, twins in (('independent', TWINS), ('independent_distilled', DISTILLED_TWINS)):
            for fraction, name in twins.items():
                last = _last_row(point_dir(runs, name, seed))
                if last:
                    model = _model(name, seed, runs)
                    rows.append(dict(method=method, config=name, seed=seed, prefix=fraction,
                                     params=sum(p.numel() for p in model.parameters()), top1=float(last['top1']),
                                     test_top1=float(last['test_top1']), **provenance(point_dir(runs, name, seed))))
        for name, method in ELASTIC.items():
            last = _last_row(point_dir(runs, name, seed))
            if not last:
                continue
            model, nesting = _model(name, seed, runs), _config(name, seed, runs)['elastic_nesting']
            for fraction in FRACTIONS:
                key = '' if fraction == 1 else f'@{fraction:g}'
                rows.append(dict(method=method, config=name, seed=seed, prefix=fraction,
                                 params=elastic.prefix_parameters(model, fraction, nesting),
                                 top1=float(last[f'top1{key}']), test_top1=float(last[f'test_top1{key}']),
                                 **provenance(point_dir(runs, name, seed))))
    return rows


def _model(name: str, seed: int, runs: str) -> torch.nn.Module:
    return _last_weights(_config(name, seed, runs))


def _last_weights(cfg: dict) -> torch.nn.Module:
    """The finished run's last weights in its model
    ([`tkvision.engine.checkpoint.model_for_checkpoint`][tkvision.engine.checkpoint.model_for_checkpoint])."""
    return model_for_checkpoint(cfg, os.path.join(cfg['output'], LAST_WEIGHTS))[0]


def _evaluate_at(model, cfg: dict, prefix) -> tuple:
    """Validation and test top-1 of ``model`` at ``prefix`` on ``cfg``'s data."""
    data = section(cfg, 'data')
    train_ds = build_dataset(data, 'train', cfg['seed'])
    out = []
    for split in ('val', 'test'):
        ds = build_dataset(data, split, cfg['seed'], class_to_idx=dataset_classes(train_ds))
        loader = build_loader(ds, data, train=False, seed=cfg['seed'])
        with elastic.prefix(model, prefix):
            out.append(evaluate(model, loader, torch.device('cpu'), BatchPreprocessor(cfg['mean'], cfg['std'],
                                                                                      torch.device('cpu')))['top1'])
    return tuple(out)


def post_hoc_points(runs: str, seeds) -> list:
    """The 72-token independent run's weights evaluated at each prefix (post-hoc truncation) with the whole
    layer's τ (``post_hoc_tau_kept``; τ following k, ``post_hoc``, was removed with ``elastic_tau``: its rows are in
    ``docs/elastic/retired.csv``)."""
    rows = []
    for seed in seeds:
        name = TWINS[1.0]
        if not _last_row(point_dir(runs, name, seed)):
            continue
        cfg = _config(name, seed, runs)
        model = _model(name, seed, runs)
        for fraction in FRACTIONS[:-1]:
            val, test = _evaluate_at(model, cfg, fraction)
            rows.append(dict(method='post_hoc_tau_kept', config=name, seed=seed, prefix=fraction,
                             params=elastic.prefix_parameters(model, fraction), top1=val, test_top1=test))
    return rows


def mix_n_match_points(runs: str, seeds) -> list:
    """Per-block prefixes of the ``elastic`` run chosen by MatFormer's rule of thumb under budgets halfway
    between the uniform sizes; ``prefix`` holds the per-block fractions."""
    rows = []
    for seed in seeds:
        if not _last_row(point_dir(runs, 'elastic', seed)):
            continue
        cfg = _config('elastic', seed, runs)
        model = _model('elastic', seed, runs)
        sizes = [elastic.prefix_parameters(model, f) for f in FRACTIONS]
        for low, high in zip(sizes, sizes[1:]):
            chosen = elastic.mix_n_match(model, FRACTIONS, (low + high) // 2)
            val, test = _evaluate_at(model, cfg, chosen)
            rows.append(dict(method='mix_n_match', config='elastic', seed=seed,
                             prefix=' '.join(f'{f:g}' for f in chosen),
                             params=elastic.prefix_parameters(model, chosen), top1=val, test_top1=test))
    return rows


def training_compute(cfg: dict, teacher: dict = None) -> float:
    """Training FLOPs of a run of ``cfg`` (a resolved config; counted forward + backward per image, times the
    training images and epochs), with an elastic run's expected mix of prefixes per step and, for
    ``distillation: teacher``, the forward of ``teacher`` (the teacher's resolved config) on every image."""
    images = split_size(section(cfg, 'data'), 'train', cfg['seed']) * cfg['epochs']
    extra = forward_flops_per_image(teacher) if cfg['distillation'] == 'teacher' else 0.0
    fractions = sorted(set(cfg['elastic_fractions']), reverse=True)
    if not fractions:
        return (train_flops_per_image(cfg) + extra) * images
    flops = {f: train_flops_per_image(cfg, None if f == 1 else f) for f in fractions}
    per_step = {'all': sum(flops.values()), 'random': statistics.mean(flops.values()),
                'largest_plus_random': flops[fractions[0]] + statistics.mean(flops[f] for f in fractions[1:])
                }[cfg['elastic_sampling']]
    return (per_step + extra) * images


def summarize(points: list, compute: dict) -> list:
    """``results.csv`` rows: per (method, prefix) the mean and std over seeds, the training compute as a ratio
    to the largest TokenFormer trained alone, and the validation gap to the independently trained twin of the
    same prefix with its 95% interval (`gap_interval`, from the unrounded seeds). No gap for the methods
    of `OTHER_SIZES`, whose prefixes have other sizes: compare them by parameters. A last row,
    ``independent`` at prefix ``all``, is the compute of training the four sizes separately."""
    reference = compute.get(TWINS[1.0])
    twins = {p['prefix']: [] for p in points if p['method'] == 'independent'}
    for p in points:
        if p['method'] == 'independent':
            twins[p['prefix']].append(p['top1'])
    out = []
    for row in _means(points):
        config = row['config']
        row['compute_vs_largest'] = round(compute[config] / reference, 3) if reference and config in compute else None
        twin = None if row['method'] in OTHER_SIZES or isinstance(row['prefix'], str) else twins.get(row['prefix'])
        mine = [p['top1'] for p in points if (p['method'], p['config'], p['prefix']) ==
                (row['method'], row['config'], row['prefix'])]
        gap, low, high = gap_interval(mine, twin) if twin else (None, None, None)
        if row['method'] == 'independent':  # a twin against itself: 0 by definition, no interval to read
            low = high = None
        row.update(gap_to_twin=gap, gap_low=low, gap_high=high)
        out.append(row)
    if reference and all(c in compute for c in TWINS.values()):
        out.append(dict(method='independent', config='all four sizes', prefix='all',
                        compute_vs_largest=round(sum(compute[c] for c in TWINS.values()) / reference, 3)))
    return out


def _means(points: list) -> list:
    keys = list(dict.fromkeys((p['method'], p['config'], p['prefix']) for p in points))
    rows = []
    for method, config, prefix in keys:
        group = [p for p in points if (p['method'], p['config'], p['prefix']) == (method, config, prefix)]
        top1, test = mean_std([p['top1'] for p in group], 2), mean_std([p['test_top1'] for p in group], 2)
        rows.append(dict(method=method, config=config, prefix=prefix, seeds=len(group),
                         params=round(statistics.mean(p['params'] for p in group)), top1_mean=top1[0],
                         top1_std=top1[1], test_top1_mean=test[0], test_top1_std=test[1]))
    return rows


def speed_rows(cfg: dict, model: torch.nn.Module, fractions=FRACTIONS, batch_size: int = 256,
               repeats: int = 5) -> list:
    """Inference img/s of the architectures of ``model``'s exported prefixes (`extract_prefix`, then
    timm's builder: the twins' shapes) at ``fractions``, against the whole model's, timed interleaved in one
    run; ``cfg`` is the run's resolved config (model name and keyword arguments, threads)."""
    base = cfg['model'] + ''.join(f'@{k}={v}' for k, v in cfg['model_kwargs'].items() if not k.startswith('num_'))
    specs = {}
    for fraction in fractions:
        sub = elastic.extract_prefix(model, fraction)
        specs[base + ''.join(f'@{k}={v}' for k, v in elastic.prefix_model_kwargs(sub).items())] = fraction
    torch.set_num_threads(cfg['threads'] or torch.get_num_threads())
    rows = benchmark_models(list(specs), modes=('infer',), batch_size=batch_size, repeats=repeats, memory=False,
                            reference=list(specs)[-1])
    return [dict(prefix=specs[r['model']], model=r['model'], img_per_s=round(r['img_per_s']),
                 vs_whole_model=round(r['ratio'], 3), machine=machine_info(torch.device('cpu'))) for r in rows]


#: The nested families timed as exported sub-models: method -> config (a method not named here runs at the
#: shapes of the family whose nesting it shares: every TokenFormer nesting all its Pattentions at the twins').
SPEED_FAMILIES = {'elastic': 'elastic', 'elastic_ffn': 'elastic_ffn', 'matformer_vit': 'matformer_vit'}


class _Inference:
    """A timed runner (``tkvision.experiments.benchmark.time_rounds``): one forward of a module on a batch."""

    def __init__(self, name: str, module: torch.nn.Module, images: torch.Tensor):
        self.name, self.module, self.images = name, module.eval(), images

    def __call__(self):
        with torch.inference_mode():
            return self.module(self.images)


def export_speed_rows(seed: int, runs: str, batch_size: int = 256, repeats: int = 5) -> list:
    """Inference img/s of every exported sub-model (`extract_prefix` at each of `FRACTIONS`, under the
    config's nesting) of each family of `SPEED_FAMILIES`, timed interleaved in one run on the CPU. Speed
    depends on the shapes alone, so the models are built from their configs (no trained weights are read).

    Returns:
        rows ``method, prefix, params, img_per_s, vs_whole_model`` (the ratio to that family's whole model).
    """
    from tkvision.engine.config import model_for_config
    from tkvision.experiments.benchmark import time_rounds
    runners, meta = [], {}
    for method, name in SPEED_FAMILIES.items():
        cfg = _config(name, seed, runs)
        torch.manual_seed(0)
        model = model_for_config(TrainConfig.from_dict(cfg))
        size = cfg['model_kwargs']['img_size']
        images = torch.randn(batch_size, cfg['model_kwargs'].get('in_chans', 3), size, size)
        for fraction in FRACTIONS:
            sub = elastic.extract_prefix(model, fraction, nesting=cfg['elastic_nesting'])
            runners.append(_Inference(f'{method}@{fraction:g}', sub, images))
            meta[runners[-1].name] = (method, fraction, sum(p.numel() for p in sub.parameters()))
    times = time_rounds(runners, torch.device('cpu'), warmup=2, steps=3, repeats=repeats)
    speed = {name: batch_size / statistics.median(t) for name, t in times.items()}
    rows = []
    for name, (method, fraction, params) in meta.items():
        rows.append(dict(method=method, prefix=fraction, params=params, img_per_s=round(speed[name]),
                         vs_whole_model=round(speed[name] / speed[f'{method}@1'], 3),
                         machine=machine_info(torch.device('cpu'))))
    return rows


def plot_speed(results: list, speed: list, path: str):
    """Validation top-1 against the inference img/s of the exported sub-model, one line per method (mean ±
    std over seeds): a TokenFormer nesting every Pattention runs at the twins' shapes (the ``elastic`` row of
    ``speed``), the FFN-only one and the MatFormer ViT at their own."""
    family = lambda method: method if method in SPEED_FAMILIES else 'elastic'  # noqa: E731
    rate = {(r['method'], float(r['prefix'])): r['img_per_s'] for r in speed}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = [m for m in dict.fromkeys(r['method'] for r in results if r.get('params'))
               if not m.startswith(('post_hoc', 'mix_n_match'))]
    for i, method in enumerate(methods):
        rows = [r for r in results if r['method'] == method and (family(method), r['prefix']) in rate]
        rows.sort(key=lambda r: rate[family(method), r['prefix']])
        ax.errorbar([rate[family(method), r['prefix']] for r in rows], [r['top1_mean'] for r in rows],
                    yerr=[r['top1_std'] or 0 for r in rows], marker='o', capsize=3, label=method, color=f'C{i % 10}')
    ax.set(xlabel='inference img/s of the exported sub-model (CPU, batch 256)', ylabel='validation top-1 (%)',
           title='Fashion-MNIST, quick recipe: accuracy against speed')
    _save_figure(fig, ax, path, legend_size=7)


def _save_figure(fig, ax, path: str, legend_size: int):
    """Grid and legend on ``ax``, then ``fig`` written to ``path`` (100 dpi) and closed."""
    ax.grid(alpha=.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(results: list, path: str):
    """Validation top-1 against parameters, one line per method (mean ± std over seeds): the whole range on
    the left (post-hoc truncation collapses), the methods that train for their prefixes on the right."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    rows_with_size = [r for r in results if r.get('params')]
    methods = list(dict.fromkeys(r['method'] for r in rows_with_size))
    color = {method: f'C{i % 10}' for i, method in enumerate(methods)}  # one colour per method in both panels
    for ax, zoom in zip(axes, (False, True)):
        for method in methods:
            if zoom and method.startswith('post_hoc'):
                continue
            rows = sorted((r for r in rows_with_size if r['method'] == method), key=lambda r: r['params'])
            ax.errorbar([r['params'] / 1e3 for r in rows], [r['top1_mean'] for r in rows],
                        yerr=[r['top1_std'] or 0 for r in rows], marker='o', capsize=3, label=method,
                        color=color[method], linestyle='none' if method == 'mix_n_match' else '-')
        ax.set(xlabel='parameters (thousands)', ylabel='validation top-1 (%)',
               title='post-hoc truncation and trained prefixes' if not zoom else 'trained for their sizes')
        ax.grid(alpha=.3)
        ax.legend(fontsize=8)
    fig.suptitle('Fashion-MNIST, quick recipe: one elastic TokenFormer against separate ones')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _write_csv(rows: list, path: str, columns=None):
    def write(f):
        w = csv.DictWriter(f, fieldnames=columns or list(rows[0]), extrasaction='ignore')
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)


def read_points(path: str) -> list:
    """The rows of an earlier ``points.csv`` (``report --keep-points``), numbers parsed.

    Raises:
        UsageError: the file is missing, is not UTF-8, or lacks a column of `POINT_COLUMNS` (``machine`` and
            ``commit`` aside: a file without them reads as ``'unknown'``).
    """
    if not os.path.isfile(path):
        raise UsageError(f'--keep-points {path}: no such file; give an earlier report\'s points.csv')
    try:
        with open(path, encoding='utf-8') as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError:
        raise UsageError(f'--keep-points {path} is not UTF-8 text (an earlier report\'s points.csv is): give that '
                         'file, or save this one as UTF-8') from None
    needed = set(POINT_COLUMNS) - set(PROVENANCE_KEYS)  # a file written before them: 'unknown'
    if rows and needed - set(rows[0]):
        raise UsageError(f'--keep-points {path} lacks the columns {sorted(needed - set(rows[0]))}')
    number = lambda v: float(v) if any(c in v for c in '.e') else int(v)  # noqa: E731
    return [with_provenance({**r, 'seed': int(r['seed']),
                             'prefix': number(r['prefix']) if ' ' not in r['prefix'] else r['prefix'],
                             'params': int(r['params']), 'top1': float(r['top1']), 'test_top1': float(r['test_top1'])})
            for r in rows]


def report(runs: str, seeds, out: str, speed: bool = True, keep_points: str = None) -> list:
    """Write the report files of the module docstring into ``out``; returns the ``results.csv`` rows. With
    ``keep_points`` (an earlier ``points.csv``), its rows of (config, seed) pairs that have no finished run
    under ``runs`` are kept: a report of new arms set against runs trained earlier, whose folders are gone.

    Raises:
        UsageError: no run of ``seeds`` under ``runs`` has finished (and nothing is kept).
    """
    os.makedirs(out, exist_ok=True)
    points = elastic_points(runs, seeds) + post_hoc_points(runs, seeds) + mix_n_match_points(runs, seeds)
    if keep_points:
        fresh = {(p['config'], p['seed']) for p in points}
        points = [p for p in read_points(keep_points) if (p['config'], p['seed']) not in fresh
                  and p['seed'] in seeds] + points
    order = {m: i for i, m in enumerate(['independent', 'independent_distilled', *ELASTIC.values(),
                                         'post_hoc_tau_kept', 'mix_n_match'])}
    points.sort(key=lambda p: (order.get(p['method'], len(order)), str(p['prefix']), p['seed']))
    if not points:
        raise UsageError(f'--runs {runs}: no finished run of seeds {list(seeds)} there; train them first '
                         '(python -m studies.elastic.elastic_study train)')
    # a point kept from a file written before the machine and commit columns: 'unknown'
    _write_csv([with_provenance(p) for p in points], os.path.join(out, 'points.csv'), POINT_COLUMNS)
    finished = {p['config'] for p in points}
    seed = min(p['seed'] for p in points)
    compute = {name: training_compute(_config(name, seed, runs), _config(TWINS[1.0], seed, runs))
               for name in finished}
    results = summarize(points, compute)
    _write_csv(results, os.path.join(out, 'results.csv'))
    plot(results, os.path.join(out, 'top1_vs_params.png'))
    if speed:
        _write_csv(export_speed_rows(seed, runs), os.path.join(out, 'speed.csv'))
    with open(os.path.join(out, 'speed.csv'), encoding='utf-8') as f:
        timed = [dict(r, prefix=float(r['prefix']), img_per_s=float(r['img_per_s'])) for r in csv.DictReader(f)]
    if timed and 'method' in timed[0]:
        plot_speed(results, timed, os.path.join(out, 'top1_vs_img_per_s.png'))
    meta = dict(machine=machine_info(torch.device('cpu')), date=time.strftime('%Y-%m-%d', time.gmtime()),
                seeds=sorted({p['seed'] for p in points}),
                command='python -m studies.elastic.elastic_study ' + portable_command(sys.argv[1:]))
    atomic_write(os.path.join(out, 'meta.json'), lambda f: json.dump(meta, f, indent=1), text=True)
    return results


def _read_long_twins(path: str) -> dict:
    """The rows of the long-recipe comparison's ``results.csv`` for `LONG_TWINS`, by config name.

    Raises:
        UsageError: the file is missing, or lacks a twin's row (the file and the config named).
    """
    if not os.path.isfile(path):
        raise UsageError(f'--twins {path}: no such file; it is the long comparison\'s results.csv '
                         '(python -m studies.comparison.comparison, see docs/comparison.md)')
    try:
        with open(path, encoding='utf-8') as f:
            rows = {r.get('config'): r for r in csv.DictReader(f)}
    except UnicodeDecodeError as error:
        raise UsageError(f'--twins {path} is not a UTF-8 CSV file ({error.reason} at byte {error.start}): give the '
                         "long comparison's results.csv") from None
    missing = [name for name in LONG_TWINS.values() if name not in rows]
    if missing:
        raise UsageError(f'--twins {path} has no row for {", ".join(missing)}: the long runs of those sizes '
                         'must be on file before the elastic run is set against them')
    return rows


def long_rows(run_dir: str, cfg: dict, model: torch.nn.Module, twins: dict) -> list:
    """``long.csv`` rows: the finished long-recipe elastic run at each of its prefixes (validation top-1 of
    the last epoch, test top-1 read once, both of the raw weights as the twins' are) against the independent
    long run of that size (``twins``: `_read_long_twins`): parameters, training compute as a ratio to
    the whole-size run alone (both counted by `train_flops_per_image` over the same images and epochs,
    the elastic run's expected mix of prefixes included), and the gaps (elastic minus the twins' seed mean).
    A last row, ``independent`` at prefix ``all``, is the three sizes trained separately."""
    last = _last_row(run_dir)
    largest = float(twins[LONG_TWINS[1.0]]['train_tflops'])
    compute = training_compute(cfg) / 1e12 / largest
    rows = []
    for fraction, name in LONG_TWINS.items():
        key, twin = '' if fraction == 1 else f'@{fraction:g}', twins[name]
        top1, test = float(last[f'top1{key}']), float(last[f'test_top1{key}'])
        rows.append(dict(method='elastic', prefix=fraction, tokens=min(elastic.prefix_counts(model, fraction).values()),
                         params=elastic.prefix_parameters(model, fraction), top1=top1, test_top1=test,
                         compute_vs_largest=round(compute, 3), twin=name, twin_params=int(twin['params']),
                         twin_seeds=int(twin['seeds']), twin_top1_mean=float(twin['top1_mean']),
                         twin_test_top1_mean=float(twin['test_top1_mean']),
                         twin_compute_vs_largest=round(float(twin['train_tflops']) / largest, 3),
                         gap_to_twin=round(top1 - float(twin['top1_mean']), 2),
                         test_gap_to_twin=round(test - float(twin['test_top1_mean']), 2)))
    rows.append(dict(method='independent', prefix='all', compute_vs_largest=round(
        sum(float(twins[name]['train_tflops']) for name in LONG_TWINS.values()) / largest, 3)))
    return rows


def report_long(runs: str, seed: int, twins_path: str, out: str, speed: bool = True) -> list:
    """Write ``long.csv`` (`long_rows`, with each prefix's exported img/s from `speed_rows` unless
    ``speed`` is False), ``long_top1_vs_params.png`` (`plot_long`) and ``long_meta.json`` into ``out``;
    returns the ``long.csv`` rows.

    Raises:
        UsageError: the long run of ``seed`` under ``runs`` has not finished, or ``twins_path`` lacks a twin.
    """
    twins = _read_long_twins(twins_path)
    run_dir = point_dir(runs, LONG_CONFIG, seed)
    if _last_row(run_dir) is None:
        raise UsageError(f'--runs {runs}: the long elastic run of seed {seed} has not finished ({run_dir} has no '
                         'result.json); continue it with the command in the header of '
                         f'{os.path.relpath(LONG_CONFIG)}')
    cfg = _run_config(LONG_CONFIG, seed, runs)
    model = _last_weights(cfg)
    os.makedirs(out, exist_ok=True)
    rows = long_rows(run_dir, cfg, model, twins)
    timed = {r['prefix']: r for r in speed_rows(cfg, model, tuple(LONG_TWINS))} if speed else {}
    for row in rows:
        row.update(img_per_s=timed.get(row['prefix'], {}).get('img_per_s'),
                   img_per_s_vs_whole_model=timed.get(row['prefix'], {}).get('vs_whole_model'))
    _write_csv(rows, os.path.join(out, 'long.csv'), list(rows[0]))
    plot_long(rows, twins, os.path.join(out, 'long_top1_vs_params.png'))
    meta = dict(machine=machine_info(torch.device('cpu')), date=time.strftime('%Y-%m-%d', time.gmtime()),
                seeds=[seed], command='python -m studies.elastic.elastic_study ' + portable_command(sys.argv[1:]))
    atomic_write(os.path.join(out, 'long_meta.json'), lambda f: json.dump(meta, f, indent=1), text=True)
    return rows


def plot_long(rows: list, twins: dict, path: str):
    """Validation top-1 against parameters at the long recipe: the elastic run's prefixes (one seed) and the
    independent long runs (mean ± sample std over their seeds)."""
    sized = [r for r in rows if r['method'] == 'elastic']
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([r['params'] / 1e6 for r in sized], [r['top1'] for r in sized], marker='o', label='elastic (one run)')
    ax.errorbar([r['twin_params'] / 1e6 for r in sized], [r['twin_top1_mean'] for r in sized],
                yerr=[float(twins[r['twin']]['top1_std'] or 0) for r in sized], marker='s', capsize=3,
                label='independent long runs (mean ± std of seeds)')
    ax.set(xlabel='parameters (millions)', ylabel='validation top-1 (%)',
           title='Fashion-MNIST, long recipe: one elastic model\nagainst a model trained per size')
    _save_figure(fig, ax, path, legend_size=8)


def main(argv=None) -> int:
    """``python -m studies.elastic.elastic_study {train,report}``; see ``--help``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    t = sub.add_parser('train', help='train the points not yet finished')
    t.add_argument('--configs', nargs='+', default=[os.path.join(CONFIGS, '*.yaml')])
    t.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    t.add_argument('--out', default='runs/elastic')
    t.add_argument('--threads', type=int, default=None, help="each run's CPU threads (default: the configs')")
    r = sub.add_parser('report', help='write docs/elastic/ from the finished runs')
    r.add_argument('--runs', default='runs/elastic')
    r.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    r.add_argument('--report-dir', default='docs/elastic')
    r.add_argument('--no-speed', action='store_true', help='skip timing the exported sub-models')
    r.add_argument('--keep-points', default=None,
                   help="an earlier points.csv whose rows without a finished run under --runs are kept")
    g = sub.add_parser('report-long', help='write docs/elastic/long* from the finished long run')
    g.add_argument('--runs', default='runs/elastic_long')
    g.add_argument('--seed', type=int, default=0)
    g.add_argument('--twins', default=LONG_RESULTS, help="the long comparison's results.csv")
    g.add_argument('--report-dir', default='docs/elastic')
    g.add_argument('--no-speed', action='store_true', help='skip timing the exported sub-models')
    args = parser.parse_args(argv)
    if args.command == 'train':
        train(expand_configs(args.configs), args.seeds, args.out, args.threads)
    elif args.command == 'report':
        for row in report(args.runs, args.seeds, args.report_dir, speed=not args.no_speed,
                          keep_points=args.keep_points):
            print(row)
    else:
        for row in report_long(args.runs, args.seed, args.twins, args.report_dir, speed=not args.no_speed):
            print(row)
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
