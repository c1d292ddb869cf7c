"""Does growth pay? The paper's Fig. 3 chain at Fashion-MNIST scale, with a Net2Net-grown ViT beside it.

    python -m studies.growth.growth_experiment --out runs/growth_chain --seeds 0 1 2                  # chains + scratch
    python -m studies.growth.growth_experiment --out runs/growth_chain --plan ablations --seeds 0 1  # a step's levers
    python -m studies.growth.growth_experiment --out runs/growth_chain --report          # tables and plot only

A *chain* is one trainer run of a progressive recipe (``growth.schedule``, `tkvision.train`): the
TokenFormer chain ``configs/fashion_mnist/growth_chain.yaml`` appends parameter tokens at every step
(paper §3.3); the ViT chain ``configs/fashion_mnist/growth_chain_vit.yaml`` widens a timm ViT's MLP by
Net2Net ([`tkvision.growth.net2net_widen`][tkvision.growth.net2net.net2net_widen], paper §4.3). Against each chain,
every size it passes through is trained *from scratch* for the chain's whole length (``--scratch-epochs`` to change
it), as in Fig. 3. The ``ablations`` plan reruns the TokenFormer chain with one growth setting changed from a fixed
first recipe (`ABLATION_BASE`, `ABLATIONS`), and the ViT chain with that recipe.

Compute is counted as before: training FLOPs per image of the model at the size of that epoch
(``torch.utils.flop_counter``: forward + backward) times the training images, cumulated per epoch.
Every run is a trainer run in ``<out>/<run>/seed<k>`` (``result.json`` when finished), so an
interrupted experiment continues where it stopped and ``--part i/n`` splits the runs over processes
(one per core). The report (``report.md``, ``results.json``, ``accuracy_vs_compute.png``) opens with
the fraction of the largest model's from-scratch compute at which the chain reaches that model's
accuracy.
"""
import argparse
import copy
import fnmatch
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from tkvision.cli import run_cli
from tkvision.engine.checkpoint import LAST_CHECKPOINT
from tkvision.engine.config import TrainConfig, load_config, model_for_config, validate_config
from tkvision.engine.plotting import plt
from tkvision.engine.trainer import train
from tkvision.experiments.benchmark import flop_counter
from tkvision.experiments.sweep import mean_std, plus_minus
from tkvision.growth import model_size, schedule_sizes
from tkvision.utils.files import atomic_write

__all__ = ['FAMILIES', 'ABLATION_BASE', 'ABLATIONS', 'TAU_VARIANTS', 'SHAPES', 'train_flops_per_image', 'stage_sizes',
           'size_kwargs', 'plan_runs', 'run_all', 'report']

#: The chain recipe of each family.
FAMILIES = {'tokenformer': 'configs/fashion_mnist/growth_chain.yaml',
            'vit': 'configs/fashion_mnist/growth_chain_vit.yaml'}

#: The growth settings every ablation starts from (the first recipe: each stage restarts its schedule,
#: re-warming for a quarter epoch to half the peak lr; zero keys, moments kept, all tokens trained), so
#: the ablations do not move when the chain recipe changes: (growth overrides, step overrides).
ABLATION_BASE = ({'stage_lr': 'restart', 'key_init': 'zeros', 'optimizer_state': 'keep', 'freeze_old_tokens': False},
                 {'warmup_epochs': 0.25, 'lr_scale': 0.5})

#: What makes a growth step work : name -> (what changes, growth overrides, step overrides)
#: on top of `ABLATION_BASE` (``base``: nothing changed; the ViT chain runs ``base`` only).
ABLATIONS = {
    'base': ('the first recipe: restart per stage, re-warm 0.25 epoch to x0.5 peak', {}, {}),
    'keys_normal': ("new keys N(0, 0.02²) instead of zeros (the public code's init)", {'key_init': 'normal'}, {}),
    'moments_reset': ('optimizer reset at every step (as a student re-implementation did)',
                      {'optimizer_state': 'reset'}, {}),
    'freeze_old': ('only the new tokens (+ head) trained after a step (`freeze_old_tokens`, paper §5)',
                   {'freeze_old_tokens': True}, {}),
    'no_rewarm': ('no re-warm after a step', {}, {'warmup_epochs': 0}),
    'long_rewarm': ('re-warm of 1 epoch', {}, {'warmup_epochs': 1.0}),
    'peak_full': ('re-warm to the full peak lr (x1.0)', {}, {'lr_scale': 1.0}),
    'peak_quarter': ('re-warm to a quarter of the peak lr (x0.25)', {}, {'lr_scale': 0.25}),
    'continue': ('one cosine over the chain, re-warm 0.25 epoch (`stage_lr: continue`; the recipe now)',
                 {'stage_lr': 'continue'}, {'lr_scale': 1.0}),
    'continue_no_rewarm': ('one cosine over the chain, no re-warm', {'stage_lr': 'continue'},
                           {'lr_scale': 1.0, 'warmup_epochs': 0}),
}

#: τ at a growth step (``--plan tau``): name -> (what, growth overrides) on the chain
#: recipe of the config file, each evaluated right after every step (the loss jump). The chain keeps
#: the τ of its starting size (√16 = 4 for Q/K/V/proj, √64 = 8 for the FFN); a model built at the
#: chain's last size has √128 and √512: ``tau_recompute`` gives the grown layers that τ at each step.
TAU_VARIANTS = {
    'tau_keep': ('τ kept at each step (the chain; function-preserving)', {'tau': 'keep', 'eval_after_step': True}),
    'tau_recompute': ('τ recomputed at each step (√n of the new size; not function-preserving)',
                      {'tau': 'recompute', 'eval_after_step': True}),
}

#: Chain shapes (``--plan shapes``): name -> (what, config overrides, growth step epochs), on the chain
#: recipe of the config file; measured against the same from-scratch runs.
SHAPES = {
    'late': ('stages of 1-1-1-3 epochs (6 in all)', {'epochs': 6}, [1, 2, 3]),
}


def train_flops_per_image(cfg: dict) -> float:
    """Forward + backward FLOPs of one training image for ``cfg``'s model (``FlopCounterMode``)."""
    model = model_for_config(TrainConfig.from_dict(cfg))
    size = cfg['model_kwargs'].get('img_size', cfg['img_size'] or 224)
    x = torch.randn(2, cfg['model_kwargs'].get('in_chans', 3), size, size)
    with flop_counter() as fc:
        F.cross_entropy(model(x), torch.zeros(2, dtype=torch.long)).backward()
    return fc.get_total_flops() / 2


def stage_sizes(cfg: dict) -> list:
    """`model_size` of every stage of ``cfg``'s growth schedule, first to last."""
    with torch.device('meta'):
        return schedule_sizes(model_size(model_for_config(TrainConfig.from_dict(cfg))), cfg['growth']['schedule'])


def size_kwargs(model_kwargs: dict, size: dict) -> dict:
    """``model_kwargs`` for a model built at ``size`` (``num_tokens_<kind>``, or ``mlp_ratio`` from
    ``mlp_hidden`` for a ViT)."""
    if 'mlp_hidden' in size:
        return dict(model_kwargs, mlp_ratio=size['mlp_hidden'] / model_kwargs['embed_dim'])
    return dict(model_kwargs, **{f'num_tokens_{k}': v for k, v in size.items()})


def _size_name(size: dict) -> str:
    return '-'.join(str(size[k]) for k in ('qkv', 'ffn') if k in size) or str(size.get('mlp_hidden'))


def plan_runs(plan: str, seeds, overrides=(), scratch_epochs=None, families=FAMILIES) -> list:
    """``[(run name, seed, config)]`` of ``plan``: ``'chain'`` (each family's chain and every stage size
    from scratch), ``'ablations'`` (the TokenFormer chain with each of `ABLATIONS`), ``'tau'`` (the
    TokenFormer chain with each of `TAU_VARIANTS`) or ``'shapes'`` (each family's chain with its
    steps moved, `SHAPES`)."""
    runs = []
    for family, path in families.items():
        chain = load_config(path, list(overrides))
        if plan == 'shapes':
            for name, (_, over, at) in SHAPES.items():
                cfg = dict(copy.deepcopy(chain), **over)
                cfg['growth']['schedule'] = [dict(step, at_epoch=a) for step, a in zip(cfg['growth']['schedule'], at)]
                runs += [(f'{family}_chain_{name}', seed, cfg) for seed in seeds]
            continue
        if plan == 'ablations':
            variants = {name: ({**ABLATION_BASE[0], **g}, {**ABLATION_BASE[1], **s})
                        for name, (_, g, s) in ABLATIONS.items() if family == 'tokenformer' or name == 'base'}
        elif plan == 'tau':
            variants = {name: (g, {}) for name, (_, g) in TAU_VARIANTS.items() if family == 'tokenformer'}
        else:
            variants = {'': ({}, {})}
        for name, (g_over, s_over) in variants.items():
            cfg = copy.deepcopy(chain)
            cfg['growth'].update(g_over)
            cfg['growth']['schedule'] = [dict(step, **s_over) for step in cfg['growth']['schedule']]
            runs += [(f'{family}_chain' + (f'_{name}' if name else ''), seed, cfg) for seed in seeds]
        if plan in ('ablations', 'tau'):
            continue
        for size in stage_sizes(chain):
            cfg = copy.deepcopy(chain)
            cfg['growth']['schedule'] = []
            cfg['model_kwargs'] = size_kwargs(cfg['model_kwargs'], size)
            cfg['epochs'] = scratch_epochs or chain['epochs']
            runs += [(f'{family}_scratch_{_size_name(size)}', seed, cfg) for seed in seeds]
    return runs


def _run_dir(out, name, seed):
    return os.path.join(out, name, f'seed{seed}')


def run_all(runs, out: str, part=(0, 1), log=print) -> int:
    """Train every run of ``runs`` whose index is ``part[0]`` mod ``part[1]``; skip finished ones
    (``result.json``), resume interrupted ones (``last.pth``). Returns the number trained."""
    n = 0
    for i, (name, seed, cfg) in enumerate(runs):
        if i % part[1] != part[0]:
            continue
        rd = _run_dir(out, name, seed)
        if os.path.isfile(os.path.join(rd, 'result.json')):
            log(f'[skip] {name} seed {seed}: finished')
            continue
        cfg = validate_config(dict(copy.deepcopy(cfg), seed=seed, output=rd, progress=False))
        log(f'[run] {name} seed {seed} -> {rd}')
        res = train(cfg, resume=True if os.path.isfile(os.path.join(rd, LAST_CHECKPOINT)) else None)
        sizes = stage_sizes(cfg)
        flops = [train_flops_per_image(dict(cfg, model_kwargs=size_kwargs(cfg['model_kwargs'], s))) for s in sizes]
        bounds = [s['at_epoch'] for s in cfg['growth']['schedule']]
        n_train = cfg['train_subset'] or 60000
        total, points = 0.0, []
        for row in res['history']:
            stage = sum(int(row['epoch']) >= b for b in bounds)
            total += flops[stage] * n_train
            points.append((total, float(row['top1'])))
        jumps = [(float(r['val_loss']), float(r['val_loss_after_growth']), float(r['top1']),
                  float(r['top1_after_growth']))
                 for r in res['history'] if r.get('val_loss_after_growth') not in (None, '')]
        result = dict(name=name, seed=seed, top1=res['top1'], test_top1=res['test_top1'], jumps=jumps,
                      compute=total, points=points,
                      stage_ends=[b - 1 for b in bounds] + [cfg['epochs'] - 1], sizes=sizes,
                      flops_per_image=flops, schedule=cfg['growth']['schedule'],
                      growth={k: v for k, v in cfg['growth'].items() if k != 'schedule'})
        atomic_write(os.path.join(rd, 'result.json'), lambda f: json.dump(result, f, indent=1), text=True)
        n += 1
    return n


def _load_results(out: str) -> dict:
    """``{run name: [result of each seed]}`` of the finished runs under ``out``."""
    results = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        for seed_dir in sorted(os.listdir(os.path.join(out, name))) if os.path.isdir(os.path.join(out, name)) else []:
            path = os.path.join(out, name, seed_dir, 'result.json')
            if os.path.isfile(path):
                with open(path) as f:
                    results.setdefault(name, []).append(json.load(f))
    return results


def _mean_curve(seed_results):
    """Per-epoch (compute, mean top-1, min, max) over seeds (compute is the same for every seed)."""
    n = min(len(r['points']) for r in seed_results)
    return [(seed_results[0]['points'][e][0], statistics.mean(r['points'][e][1] for r in seed_results),
             min(r['points'][e][1] for r in seed_results), max(r['points'][e][1] for r in seed_results))
            for e in range(n)]


def answer(results: dict, family: str, chain: str = 'chain') -> dict:
    """How the ``family`` chain compares with its largest size from scratch (means over seeds).

    Returns ``dict(target, chain_final, chain_compute, scratch_compute, reach_fraction,
    scratch_fraction_for_chain)``: ``reach_fraction`` is the compute fraction (of the largest model's
    from-scratch run) at the first epoch where the chain's mean top-1 reaches the scratch model's final
    mean, None if it never does; ``scratch_fraction_for_chain`` the fraction at which the scratch run's
    mean curve first reaches the chain's final mean (None if never). ``chain``: the run name after the
    family (``chain_late`` for a `SHAPES` chain)."""
    chain = results.get(f'{family}_{chain}')
    scratch_names = [n for n in results if n.startswith(f'{family}_scratch_')]
    if not chain or not scratch_names:
        return {}
    largest = max(scratch_names, key=lambda n: results[n][0]['flops_per_image'][0])
    sc, ch = _mean_curve(results[largest]), _mean_curve(chain)
    target, full = sc[-1][1], sc[-1][0]
    reach = next((c / full for c, m, _, _ in ch if m >= target), None)
    back = next((c / full for c, m, _, _ in sc if m >= ch[-1][1]), None)
    return dict(largest=largest, target=target, chain_final=ch[-1][1], chain_compute=ch[-1][0], scratch_compute=full,
                reach_fraction=reach, scratch_fraction_for_chain=back, seeds=len(chain))


def _sentence(a: dict, family: str) -> str:
    if not a:
        return f'{family}: no finished runs'
    pct = lambda x: f'{100 * x:.0f}%'  # noqa: E731
    head = (f"{family}: from scratch the largest size ({a['largest'].split('_scratch_')[1]}) reaches "
            f"{a['target']:.2f}%; the chain ends at {a['chain_final']:.2f}% after "
            f"{pct(a['chain_compute'] / a['scratch_compute'])} "
            f"of that compute (means of {a['seeds']} seeds)")
    if a['reach_fraction'] is not None:
        return head + (f"; it first reaches {a['target']:.2f}% at **{pct(a['reach_fraction'])}** of the "
                       f"from-scratch compute.")
    tail = (f"; it does **not** reach {a['target']:.2f}%" +
            (f" (from scratch passes the chain's final accuracy at {pct(a['scratch_fraction_for_chain'])} of its "
             f"compute)."
             if a['scratch_fraction_for_chain'] is not None else '.'))
    return head + tail


def _size(sizes: dict) -> str:
    """A stage's size as the tables print it: ``qkv-ffn`` tokens (TokenFormer) or the MLP hidden width (ViT)."""
    return f"{sizes['qkv']}-{sizes['ffn']}" if 'qkv' in sizes else str(sizes['mlp_hidden'])


def run_rows(results: dict) -> list:
    """One row per run name (chains first, then from scratch by size): ``name, family, group ('main':
    the chains and every size from scratch, 'ablation': the settings of `ABLATIONS`), size,
    seeds, stage_top1 (mean top-1 at each stage end, as text), top1, top1_std, compute_tflops,
    of_largest (percent of the compute of the family's largest size from scratch)``."""
    order = sorted(results, key=lambda n: (n.split('_')[0], '_scratch_' in n, results[n][0]['flops_per_image'][0], n))
    largest_compute = {family: answer(results,
                                      family).get('scratch_compute') for family in {n.split('_')[0] for n in results}}
    rows = []
    for name in order:
        rs, family = results[name], name.split('_')[0]
        largest = largest_compute[family]
        m, s = mean_std([r['top1'] for r in rs])
        main = '_scratch_' in name or name in (f'{family}_chain', *(f'{family}_chain_{k}' for k in SHAPES))
        rows.append(dict(
            name=name, family=family, group='main' if main else 'ablation',
            size=' → '.join(_size(x) for x in rs[0]['sizes']), seeds=len(rs),
            stage_top1=' → '.join(f'{statistics.mean(r["points"][e][1] for r in rs):.2f}'
                                  for e in rs[0]['stage_ends']),
            top1=m, top1_std=s, compute_tflops=rs[0]['compute'] / 1e12,
            of_largest=100 * rs[0]['compute'] / largest if largest else math.nan))
    return rows


def ablation_rows(results: dict) -> list:
    """One row per `ABLATIONS` setting with finished runs: ``setting, seeds, top1, top1_std, delta,
    delta_std, test_top1, test_top1_std, test_delta, test_delta_std``, the deltas paired by seed against
    ``tokenformer_chain_base`` (the first recipe). ``top1`` is the split evaluated every epoch (validation
    when the run has one); the test columns are NaN for runs without a validation split."""
    base = {r['seed']: r for r in results.get('tokenformer_chain_base', [])}
    rows = []
    for name, (what, _, _) in ABLATIONS.items():
        rs = results.get(f'tokenformer_chain_{name}')
        if not rs:
            continue
        row = dict(setting=what, seeds=len(rs))
        for key, prefix in (('top1', ''), ('test_top1', 'test_')):
            values = [r.get(key) for r in rs]
            paired = [r[key] - base[r['seed']][key] for r in rs if r.get(key) is not None
                      and base.get(r['seed'], {}).get(key) is not None]
            m, s = mean_std(values) if None not in values else (math.nan, math.nan)
            dm, ds = mean_std(paired) if paired else (math.nan, math.nan)
            row.update({f'{prefix}top1': m, f'{prefix}top1_std': s, f'{prefix}delta': dm, f'{prefix}delta_std': ds})
        rows.append(row)
    return rows


def report(out: str, results: dict = None) -> str:
    """Write ``report.md``, ``results.json`` and ``accuracy_vs_compute.png`` under ``out`` from the
    finished runs there, or from ``results`` (the ``results`` of a stored ``results.json``: the docs'
    tables are re-rendered from it without the runs); returns the report's text. ``results.json`` holds
    the per-seed results, the answers and the rows of every table (``run_rows``, ``ablation_rows``,
    ``tau_rows``), which ``docs/growth.md`` renders (``tools/render_docs.py``)."""
    results = _load_results(out) if results is None else results
    lines = ['## Answer', '']
    for family in FAMILIES:
        lines.append('- ' + _sentence(answer(results, family), family))
        for name, (what, _, _) in SHAPES.items():
            if f'{family}_chain_{name}' in results:
                lines.append('- ' + _sentence(answer(results, family, f'chain_{name}'), f'{family}, chain {what}'))
    tables = dict(run_rows=run_rows(results), ablation_rows=ablation_rows(results), tau_rows=tau_rows(results))
    lines += ['', '## Runs (top-1 %, mean ± std over seeds; compute in TFLOPs)', '',
              '| run | seeds | top-1 at each stage end | final top-1 | compute |', '|---|---|---|---|---|']
    for r in tables['run_rows']:
        lines.append(f"| {r['name']} | {r['seeds']} | {r['stage_top1']} | {plus_minus(r['top1'], r['top1_std'])} | "
                     f"{r['compute_tflops']:.1f} |")
    lines += ['', '## What makes a growth step work (TokenFormer chain, one setting changed from the first recipe)', '',
              '| setting | seeds | final top-1 | Δ vs the first recipe (same seeds) |', '|---|---|---|---|']
    for r in tables['ablation_rows']:
        lines.append(f"| {r['setting']} | {r['seeds']} | {plus_minus(r['top1'], r['top1_std'])} | "
                     f"{plus_minus(r['delta'], r['delta_std'], '+.2f')} |")
    lines += _tau_lines(tables['tau_rows'])
    text = '\n'.join(lines) + '\n'
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write(text)
    answers = {f'{k}_{c}': answer(results, k, c) for k in FAMILIES for c in ['chain'] + [f'chain_{n}' for n in SHAPES]}
    with open(os.path.join(out, 'results.json'), 'w') as f:
        json.dump(dict(results=results, answers=answers, **tables), f, indent=1)
    _plot(results, os.path.join(out, 'accuracy_vs_compute.png'))
    return text


def tau_rows(results: dict) -> list:
    """One row per `TAU_VARIANTS` setting with finished runs: ``setting, seeds, val_top1,
    val_top1_std, test_top1, test_top1_std, delta_val, delta_val_std, delta_test, delta_test_std,
    loss_jumps, top1_jumps``: the deltas are paired by seed against ``tau_keep``; the jumps are each
    step's change of the validation loss / top-1 (after the step minus before it), means over seeds, as text."""
    keep = {r['seed']: r for r in results.get('tokenformer_chain_tau_keep', [])}
    rows = []
    for name, (what, _) in TAU_VARIANTS.items():
        rs = results.get(f'tokenformer_chain_{name}')
        if not rs:
            continue
        (m, s), (tm, ts) = mean_std([r['top1'] for r in rs]), mean_std([r['test_top1'] for r in rs])
        steps = range(min(len(r['jumps']) for r in rs))
        (dv, dvs), (dt, dts) = (mean_std([r[key] - keep[r['seed']][key] for r in rs if r['seed'] in keep] or [math.nan])
                                for key in ('top1', 'test_top1'))
        rows.append(dict(
            setting=what, seeds=len(rs), val_top1=m, val_top1_std=s, test_top1=tm, test_top1_std=ts,
            delta_val=dv, delta_val_std=dvs, delta_test=dt, delta_test_std=dts,
            loss_jumps=', '.join(f"{statistics.mean(r['jumps'][i][1] - r['jumps'][i][0] for r in rs):+.3f}"
                                 for i in steps),
            top1_jumps=', '.join(f"{statistics.mean(r['jumps'][i][3] - r['jumps'][i][2] for r in rs):+.2f}"
                                 for i in steps)))
    return rows


def _tau_lines(rows: list) -> list:
    """The report's τ table from `tau_rows`' rows."""
    if not rows:
        return []
    lines = ['', '## τ at a growth step (TokenFormer chain; validation split, test once)', '',
             '| setting | seeds | final val top-1 | final test top-1 | val loss jump at each step | val top-1 jump at '
             'each step |',
             '|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['setting']} | {r['seeds']} | {plus_minus(r['val_top1'], r['val_top1_std'])} | "
                     f"{plus_minus(r['test_top1'], r['test_top1_std'])} | {r['loss_jumps']} | {r['top1_jumps']} |")
    return lines


def _plot(results: dict, path: str):
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8), sharey=True)
    for ax, family in zip(axes, FAMILIES):
        names = [n for n in results if n.startswith(f'{family}_scratch_')]
        names.sort(key=lambda n: results[n][0]['flops_per_image'][0])
        cmap = plt.get_cmap('Blues')
        for i, name in enumerate(names):
            curve = _mean_curve(results[name])
            ax.plot([c / 1e12 for c, *_ in curve], [m for _, m, _, _ in curve],
                    color=cmap(0.35 + 0.65 * i / max(len(names) - 1, 1)),
                    marker='.', label=f"from scratch, {name.split('_scratch_')[1]}")
        chain = results.get(f'{family}_chain')
        if chain:
            curve = _mean_curve(chain)
            xs = [c / 1e12 for c, *_ in curve]
            ax.plot(xs, [m for _, m, _, _ in curve], color='tab:red', lw=2, marker='o', ms=3,
                    label='grown chain' + (' (Net2Net)' if family == 'vit' else ' (new tokens)'))
            ax.fill_between(xs, [lo for *_, lo, _ in curve], [hi for *_, hi in curve], color='tab:red', alpha=.2)
            for e in chain[0]['stage_ends'][:-1]:
                ax.axvline(xs[e], color='tab:red', ls=':', lw=.8)
        for name, (what, _, _) in SHAPES.items():
            late = results.get(f'{family}_chain_{name}')
            if late:
                curve = _mean_curve(late)
                ax.plot([c / 1e12 for c, *_ in curve], [m for _, m, _, _ in curve], color='tab:orange', ls='--',
                        marker='o', ms=3, label=f'grown chain, {what}')
        ax.set(xlabel='cumulative training compute (TFLOPs)', title=f'{family}: chain vs from scratch (Fashion-MNIST)')
        ax.grid(alpha=.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc='lower right')
    ax = axes[2]  # both families on one axis: each chain against its largest size from scratch
    for family, color in zip(FAMILIES, ('tab:red', 'tab:green')):
        a = answer(results, family)
        if not a:
            continue
        for name, ls, label in ((f'{family}_chain', '-', 'grown chain'), (a['largest'], ':', 'largest from scratch')):
            curve = _mean_curve(results[name])
            ax.plot([c / 1e12 for c, *_ in curve], [m for _, m, _, _ in curve], color=color, ls=ls, marker='o', ms=3,
                    label=f'{family}: {label}')
    ax.set(xlabel='cumulative training compute (TFLOPs)', title='both: chain vs largest size from scratch')
    ax.grid(alpha=.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc='lower right')
    axes[0].set_ylabel('test top-1 (%)')
    lo = min((m for rs in results.values() for _, m, _, _ in _mean_curve(rs)[1:]), default=80)
    axes[0].set_ylim(max(lo - 1, 0), None)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """``python -m studies.growth.growth_experiment``; see ``--help``."""
    ap = argparse.ArgumentParser(description='Growth chains vs from-scratch training at equal compute (Fig. 3).')
    ap.add_argument('--out', default='runs/growth_chain')
    ap.add_argument('--plan', default='chain', choices=['chain', 'ablations', 'tau', 'shapes'])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    ap.add_argument('--scratch-epochs', type=int, help="epochs of the from-scratch runs (default: the chain's)")
    ap.add_argument('--part', default='0/1', help='i/n: run only every n-th run, starting at i (one process per core)')
    ap.add_argument('--only', nargs='+', help='run only these runs (names as --print-runs lists them; * wildcards)')
    ap.add_argument('--report', action='store_true', help='only write the report from finished runs')
    ap.add_argument('--from-results', metavar='RESULTS_JSON',
                    help="with --report: the per-seed results of a stored results.json instead of runs under --out "
                         "(python -m studies.growth.growth_experiment --report --from-results "
                         "docs/growth/results.json --out docs/growth)")
    ap.add_argument('--print-runs', action='store_true', help='list the runs of the plan and exit')
    args, rest = ap.parse_known_args(argv)
    if not args.report:
        runs = plan_runs(args.plan, args.seeds, rest, args.scratch_epochs)
        if args.only:
            runs = [r for r in runs if any(fnmatch.fnmatch(r[0], pat) for pat in args.only)]
        if args.print_runs:
            for name, seed, cfg in runs:
                print(f"{name} seed {seed}: {cfg['epochs']} epochs")
            return 0
        i, n = (int(x) for x in args.part.split('/'))
        run_all(runs, args.out, (i, n))
    stored = None
    if args.from_results:
        with open(args.from_results) as f:
            stored = json.load(f)['results']
    print(report(args.out, stored))
    print(f'wrote {args.out}/report.md, results.json, accuracy_vs_compute.png')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
