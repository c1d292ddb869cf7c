#!/usr/bin/env python
"""The README's "how good" table, ``docs/headline.csv``, derived from the results files of the results pages;
``--check`` fails when the file differs from what they give (``tests/test_docs.py``).

``python tools/headline.py`` rewrites it. Each row: the question, the TokenFormer's figure, the ViT's, their
difference or ratio, the results file it comes from, and the results page that opens with it; ``key`` names
the row for a figure quoted in a sentence (``tools/render_docs.py``'s inline values). Growth's exactness is
measured here, on the current code: a TokenFormer grown with zero keys, against itself before growth
(float32, eval).
"""
import argparse
import csv
import io
import json
import os
import statistics
import sys

from tkvision.experiments.intervals import gap_interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The long CIFAR-10 recipe's per-seed points (`_cifar10_long`).
LONG_POINTS = 'docs/cifar10/long/points.csv'
COLUMNS = ['key', 'question', 'tokenformer', 'vit', 'difference', 'source', 'page']


def _rows(path: str) -> list:
    with open(os.path.join(ROOT, path)) as f:
        return list(csv.DictReader(f))


def _pm(mean, std) -> str:
    return f'{float(mean):.2f}' + ('' if std in ('', None) else f' ± {float(std):.2f}')


def _gap(points: str, left: str, right: str, right_points: str = '', column: str = 'test_top1') -> str:
    """``'+1.23'``: the mean of ``column`` over the per-seed rows of config ``left`` in the points file ``points`` less
    that over config ``right``'s (in ``right_points`` where given), rounded once by the project's one rule
    (`tkvision.experiments.intervals.gap_interval`), as the pages' compare markers and the results files' gaps are: a
    difference of the results files' two-decimal means can be off by one in its last digit, and the headline would
    then disagree with the page it links to.

    Raises:
        ValueError: a side whose points file has no row of its config (named, with what to rerun).
    """
    def seeds(path: str, config: str) -> list:
        values = [float(r[column]) for r in _rows(path) if r['config'] == config]
        if not values:
            raise ValueError(f'{path} has no rows of config {config!r}: rerun the report that writes it')
        return values
    return f'{gap_interval(seeds(points, left), seeds(right_points or points, right), digits=2)[0]:+.2f}'


def _apart(points: str, left: str, right: str) -> str:
    """``'; its seeds ran on other CPUs and other code than the ViT's'`` (or the part that applies) when the per-seed
    rows of configs ``left`` and ``right`` in ``points`` name other machines or commits, ``' (code not recorded)'``
    where a row does not name what ran it (`render_docs.provenance_split`); ``''`` when they agree."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from render_docs import WHAT, provenance_split  # beside this file: the words mean what the marker's mean
    rows = _rows(points)
    differ, unknown = provenance_split([[r for r in rows if r['config'] == config] for config in (left, right)])
    text = f"; its seeds ran on {' and '.join('other ' + WHAT[key] for key in differ)} than the ViT's" if differ else ''
    return text + (f" ({' and '.join(WHAT[key] for key in unknown)} not recorded)" if unknown else '')


def _comparison() -> list:
    short = {r['config']: r for r in _rows('docs/comparison/results.csv')}
    t, v = short['tokenformer_equal_params'], short['vit_equal_width']
    rows = [dict(key='quick',
                 question=f"Fashion-MNIST, quick recipe ({t['epochs']} epochs), equal parameters and compute "
                          f"({int(t['params']) / 1e6:.2f}M, {t['num_tokens']} tokens; make train's model has 96): "
                          f"test top-1 %, {t['seeds']} seeds",
                 tokenformer=_pm(t['test_top1_mean'], t['test_top1_std']), vit=_pm(v['test_top1_mean'],
                                                                                   v['test_top1_std']),
                 difference=_gap('docs/comparison/points.csv', t['config'], v['config']),
                 source='docs/comparison/results.csv')]
    mlp = short.get('tokenformer_plain_gelu')
    if mlp is not None:
        rows.append(dict(key='plain_mlp',
                         question='The same, each Pattention a plain GELU MLP (score_norm: gelu, no normalisation): '
                                  f"validation top-1 %, {mlp['seeds']} seeds; the difference is against the ViT (the "
                                  f"TokenFormer with its normalisation: {_pm(t['top1_mean'], t['top1_std'])})"
                                  + _apart('docs/comparison/points.csv', 'tokenformer_plain_gelu', 'vit_equal_width'),
                         tokenformer=_pm(mlp['top1_mean'], mlp['top1_std']),
                         vit=_pm(v['top1_mean'], v['top1_std']),
                         difference=_gap('docs/comparison/points.csv', mlp['config'], v['config'], column='top1'),
                         source='docs/comparison/results.csv'))
    long = {r['config']: r for r in _rows('docs/comparison/long/results.csv')}
    t, v = chosen_long_recipe(long), long['vit_equal_width']
    rows.append(dict(key='long_mean',
                     question=f"Long recipe (75 epochs), equal parameters, the recipe chosen on validation "
                              f"(`{t['config']}`): test top-1 %, {t['seeds']} seeds",
                     tokenformer=_pm(t['test_top1_mean'], t['test_top1_std']),
                     vit=_pm(v['test_top1_mean'], v['test_top1_std']),
                     difference=_gap('docs/comparison/long/points.csv', t['config'], v['config']),
                     source='docs/comparison/long/results.csv'))
    points = _rows('docs/comparison/long/points.csv')
    tokenformers = [p for p in points if not p['config'].startswith('vit')]
    best = max(tokenformers, key=lambda p: float(p['top1']))
    vit_best = max((p for p in points if p['config'] == 'vit_equal_width'), key=lambda p: float(p['top1']))
    compute = {r['config']: r for r in _rows('docs/comparison/long/results.csv')}
    ours, theirs = compute[best['config']], compute['vit_equal_width']
    rows.append(dict(key='long_best',
                     question=f"Long recipe, the best run of {len(tokenformers)} TokenFormer runs against the ViT's "
                              'best of 3, both chosen on validation: test top-1 % (wall minutes; parameters; training '
                              'compute)',
                     tokenformer=f"{float(best['test_top1']):.2f} ({float(best['minutes']):.0f} min; "
                                 f"{int(ours['params']) / 1e6:.2f}M; {float(ours['compute_vs_reference']):.2f}x the "
                                 "ViT's)",
                     vit=f"{float(vit_best['test_top1']):.2f} ({float(vit_best['minutes']):.0f} min; "
                         f"{int(theirs['params']) / 1e6:.2f}M)",
                     difference=f"{float(best['test_top1']) - float(vit_best['test_top1']):+.2f}",
                     source='docs/comparison/long/points.csv'))
    return [dict(row, page='comparison') for row in rows]


#: The long recipe's choice: among the TokenFormer recipes at the ViT's training compute (within this factor) run on
#: at least this many seeds, the one of the highest validation mean (the test split is not looked at).
LONG_CHOICE_COMPUTE, LONG_CHOICE_SEEDS = 1.05, 3


def chosen_long_recipe(long: dict) -> dict:
    """The ``docs/comparison/long/results.csv`` row the long recipe's headline reports (`LONG_CHOICE_COMPUTE`,
    `LONG_CHOICE_SEEDS`): chosen on validation alone, by a rule written down once the validation means were
    known."""
    candidates = [r for c, r in long.items() if not c.startswith('vit')
                  and float(r['compute_vs_reference']) <= LONG_CHOICE_COMPUTE and int(r['seeds']) >= LONG_CHOICE_SEEDS]
    return max(candidates, key=lambda r: float(r['top1_mean']))


#: The latest GPU report of B/16† against ViT-B (``make bench-gpu``; ``docs/performance.md``, GPU section).
GPU_REPORT = 'docs/bench/gpu_b16_compiled_2026-12-04.json'


def _gpu() -> dict:
    with open(os.path.join(ROOT, GPU_REPORT)) as f:
        report = json.load(f)
    rows = {(r['model'], r['compiled']): r for r in report['parts']['throughput'] if r['mode'] == 'train'}
    compiled, eager = rows[('tokenformer_vit_b16_matched', 'compiled')], rows[('tokenformer_vit_b16_matched', 'eager')]
    vit = rows[('vit_base_patch16_224', 'compiled')]
    return dict(key='gpu_step',
                question=f"Training step on one {report['info']['card']} (bf16, compiled, batch 256; the defaults): "
                         "B/16† (`tokenformer_vit_b16_matched`: the paper's B/16 at ViT-B's parameter count) against "
                         'ViT-B, img/s (eager ratio)',
                tokenformer=f"{compiled['img_per_s']:.0f}", vit=f"{vit['img_per_s']:.0f}",
                difference=f"{compiled['ratio']:.3f}x ({eager['ratio']:.2f}x eager)",
                source=GPU_REPORT, page='performance')


#: The CPU benchmark of the quick recipe's width (eager, and compiled), and the model specs it compares.
CPU_EAGER = 'docs/bench/cpu_quick_b128_2026-11-29.json'
CPU_COMPILED = 'docs/bench/cpu_quick_compile_b128_2026-11-29.json'
QUICK_WIDTH = 'img_size=28@patch_size=7@in_chans=1@embed_dim=96@depth=6@num_heads=3'
CPU_VIT, CPU_TOKENFORMER = f'vit_tiny_patch16_224@{QUICK_WIDTH}', f'tokenformer_vit_ti16@{QUICK_WIDTH}@num_tokens=72'


def _cpu() -> dict:
    """The training step at the quick recipe's width on the 2-core CPU: the shipped defaults against the ViT,
    eager (img/s and MFU of both) and compiled (the ratio)."""
    def train_rows(path):
        with open(os.path.join(ROOT, path)) as f:
            report = json.load(f)
        return {r['model']: r for r in report['models'] if r['mode'] == 'train'}
    eager, compiled = train_rows(CPU_EAGER), train_rows(CPU_COMPILED)
    ours, vit = eager[CPU_TOKENFORMER], eager[CPU_VIT]
    return dict(key='cpu_step',
                question='Training step on a 2-core CPU at the quick recipe\'s width (float32, batch 128; equal '
                         'parameters, the defaults): img/s (model FLOP utilisation); ratio: the median of rounds '
                         'timed in pairs',
                tokenformer=f"{ours['img_per_s']:.0f} ({ours['mfu']:.0%})",
                vit=f"{vit['img_per_s']:.0f} ({vit['mfu']:.0%})",
                difference=f"{ours['ratio']:.3f}x eager ({compiled[CPU_TOKENFORMER]['ratio']:.3f}x compiled)",
                source=CPU_EAGER, page='performance')


def _growth() -> dict:
    import timm
    import torch

    import tkvision
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', img_size=32, patch_size=8, embed_dim=64, depth=2,
                              num_heads=2, num_tokens=32, num_classes=10).eval()
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        tkvision.grow(model, patch=16, qkv=32, proj=32, ffn=128)
        after = model(x)
    error = (after - before).abs().max().item()
    return dict(key='growth',
                question='Growth by zero-key parameter tokens (32 to 64 tokens, FFN 128 to 256): largest change of '
                         'a logit, float32', tokenformer=f'{error:.1e}' if error else '0 (exact)', vit='–',
                difference='–', source='tools/headline.py (measured on the current code)', page='growth')


def _code_note(method: str) -> str:
    """``'; ...'`` naming the commits of ``method``'s runs and of its twins trained alone when they differ (rows
    that mix code say so), from ``docs/elastic/points.csv``; ``''`` when every run of both ran on one commit."""
    points = _rows('docs/elastic/points.csv')
    ran = {side: sorted({r['commit'] for r in points if r['method'] == side}) for side in (method, 'independent')}
    if ran[method] == ran['independent'] and len(ran[method]) == 1:
        return ''
    return (f"; the elastic runs ran on commits {', '.join(ran[method])}, the twins on "
            f"{', '.join(ran['independent'])}: other code (the LayerNorm folded, the same function; "
            'docs/elastic.md)')


def _elastic() -> list:
    """The elastic row: of the elastic TokenFormers nesting every Pattention at no more than the ``elastic``
    run's training compute, the one of the best mean validation gap to its twins (chosen on validation)."""
    path = 'docs/elastic/results.csv'
    if not os.path.exists(os.path.join(ROOT, path)):
        return []
    rows = _rows(path)
    budget = max((float(r['compute_vs_largest']) for r in rows if r['method'] == 'elastic'), default=None)
    gaps = {}
    for r in rows:
        if r['method'].startswith('elastic') and r['gap_to_twin'] not in ('', None) and budget is not None \
                and float(r['compute_vs_largest']) <= budget:
            gaps.setdefault(r['method'], []).append(float(r['gap_to_twin']))
    if not gaps:
        return []
    method = max(gaps, key=lambda m: statistics.mean(gaps[m]))
    whole = next(r for r in rows if r['method'] == method and r['prefix'] == '1.0')
    alone = {r['prefix']: float(r['test_top1_mean']) for r in rows
             if r['method'] == 'independent' and r['test_top1_mean'] not in ('', None)}
    test = [float(r['test_top1_mean']) - alone[r['prefix']] for r in rows
            if r['method'] == method and r['prefix'] in alone]
    question = (f'Fashion-MNIST, quick recipe: one elastic TokenFormer ({method}, the best on validation of the '
                'variants at most elastic\'s compute; trained at '
                f"{float(whole['compute_vs_largest']):.2f}x the compute of the largest alone) at 1/4, 1/2, 3/4 and all "
                f"of its tokens against 4 trained alone, {whole['seeds']} seeds: top-1 gap, points, mean over the 4 "
                'sizes (difference: the worst size)' + _code_note(method))
    return [dict(key='elastic', question=question + ', validation', tokenformer=f'{statistics.mean(gaps[method]):+.2f}',
                 vit='–', difference=f'{min(gaps[method]):+.2f} worst', source=path, page='elastic'),
            dict(key='elastic_test', question='The same on the test split', tokenformer=f'{statistics.mean(test):+.2f}',
                 vit='–', difference=f'{min(test):+.2f} worst', source=path, page='elastic')]


def _cifar10() -> list:
    """CIFAR-10 (JPEG copy) first: the quick recipe's TokenFormer against its ViT twin, with the public code's
    parameter-token learning rate and with the recipe's (a quarter of it), then the long recipe's rows
    (`_cifar10_long`), from ``docs/cifar10/``."""
    quick = {r['config']: r for r in _rows('docs/cifar10/quick/results.csv')}
    t, v = quick['tokenformer'], quick['vit']
    rows = [dict(key='cifar10_quick',
                 question=f"CIFAR-10 (JPEG copy), quick recipe ({t['epochs']} epochs), equal parameters and compute "
                          f"({int(t['params']) / 1e6:.2f}M, {t['num_tokens']} tokens): test top-1 %, {t['seeds']} "
                          'seeds' + _apart('docs/cifar10/quick/points.csv', 'tokenformer', 'vit'),
                 tokenformer=_pm(t['test_top1_mean'], t['test_top1_std']),
                 vit=_pm(v['test_top1_mean'], v['test_top1_std']),
                 difference=_gap('docs/cifar10/quick/points.csv', t['config'], v['config']),
                 source='docs/cifar10/quick/results.csv')]
    lever = {r['config']: r for r in _rows('docs/cifar10/levers/results.csv')}['token_lr_quarter']
    rows.append(dict(key='cifar10_quick_token_lr',
                     question="The same, the parameter tokens at a quarter of the learning rate "
                              "(parameter_token_lr_scale: 0.25, chosen on validation: configs/cifar10/quick.yaml's "
                              f"default): test top-1 %, {lever['seeds']} seeds",
                     tokenformer=_pm(lever['test_top1_mean'], lever['test_top1_std']),
                     vit=_pm(v['test_top1_mean'], v['test_top1_std']),
                     difference=_gap('docs/cifar10/levers/points.csv', lever['config'], v['config'],
                                     'docs/cifar10/quick/points.csv'),
                     source='docs/cifar10/levers/results.csv'))
    rows += _cifar10_long()
    return [dict(row, page='cifar10') for row in rows]


def _cifar10_long() -> list:
    """The long recipe's TokenFormer (the better on validation of the long screen's ``tokenformer_*`` shapes)
    against its ViT twin once that has run, and, once it has run, the same TokenFormer with its parameter tokens at
    a quarter of the learning rate (``token_lr_quarter_p4``, a lever, not a shape: never the recipe), from
    ``docs/cifar10/long/``."""
    long_rows = {r['config']: r for r in _rows('docs/cifar10/long/results.csv')}
    long = max((r for c, r in long_rows.items() if c.startswith('tokenformer_')), key=lambda r: float(r['top1_mean']))
    twin = long_rows.get(long['config'].replace('tokenformer', 'vit', 1))  # tokenformer_p4's twin is vit_p4
    rows = [dict(key='cifar10_long',
                 question=f"CIFAR-10 (JPEG copy), long recipe ({long['epochs']} epochs, `{long['config']}`, "
                          f"chosen on validation): test top-1 %, {_seeds(long)}" + _against(long, twin),
                 tokenformer=_pm(long['test_top1_mean'], long['test_top1_std']),
                 vit='–' if twin is None else _pm(twin['test_top1_mean'], twin['test_top1_std']),
                 difference='–' if twin is None else _gap(LONG_POINTS, long['config'], twin['config']),
                 source='docs/cifar10/long/results.csv')]
    lever = long_rows.get('token_lr_quarter_' + long['config'].removeprefix('tokenformer_'))
    if lever is not None and twin is not None:
        rows.append(dict(key='cifar10_long_token_lr',
                         question='The same, the parameter tokens at a quarter of the learning rate (not the '
                                  f"recipe's default): test top-1 %, {_seeds(lever)}" + _against(lever, twin),
                         tokenformer=_pm(lever['test_top1_mean'], lever['test_top1_std']),
                         vit=_pm(twin['test_top1_mean'], twin['test_top1_std']),
                         difference=_gap(LONG_POINTS, lever['config'], twin['config']),
                         source='docs/cifar10/long/results.csv'))
    return rows


def _seeds(row: dict) -> str:
    return f"{row['seeds']} seed" + ('' if row['seeds'] == '1' else 's')


def _against(row: dict, twin) -> str:
    """How ``row``'s seeds stand to its ViT twin's: ``'; its ViT twin not run yet'``, ``' each'``, or the twin's
    count, then `_apart`'s words for runs on other machines or code."""
    if twin is None:
        return '; its ViT twin not run yet'
    return ((' each' if twin['seeds'] == row['seeds'] else f" and {twin['seeds']} (the ViT)")
            + _apart(LONG_POINTS, row['config'], twin['config']))


def headline_rows() -> list:
    """Every row of ``docs/headline.csv``, in order: CIFAR-10's first."""
    return _cifar10() + _comparison() + [_cpu(), _gpu(), _growth()] + _elastic()


def render(rows: list) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--check', action='store_true', help='write nothing; exit 1 if docs/headline.csv is stale')
    args = ap.parse_args(argv)
    path = os.path.join(ROOT, 'docs', 'headline.csv')
    text = render(headline_rows())
    current = open(path).read() if os.path.exists(path) else None
    if current == text:
        return 0
    if args.check:
        print('docs/headline.csv: stale: run python tools/headline.py', file=sys.stderr)
        return 1
    with open(path, 'w') as f:
        f.write(text)
    print('docs/headline.csv: updated')
    return 0


if __name__ == '__main__':
    from tkvision.cli import run_cli  # the rule every command shares: a user error is one line, exit 2
    sys.exit(run_cli(main))
