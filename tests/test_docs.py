"""Every generated table in README.md and docs/ equals its results file (tools/render_docs.py): a
figure changed in a results file and not in the docs, or typed into a table by hand, fails CI."""
import csv
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .helpers import ROOT


def _render_docs():
    spec = importlib.util.spec_from_file_location('render_docs', f'{ROOT}/tools/render_docs.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_table_equals_its_results_file():
    res = subprocess.run([sys.executable, 'tools/render_docs.py', '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_a_table_typed_by_hand_is_caught(tmp_path):
    """The check can fail: a table whose figure differs from its CSV by one digit is reported stale,
    and rendering restores the file's figure."""
    docs = _render_docs()
    source = tmp_path / 'r.csv'
    source.write_text('config,top1_mean,seeds\nnorm_gelu_l2,86.554,0 1 2\n')
    spec = f'{source} | point={{config}} | top-1={{top1_mean:.2f}} | seeds={{seeds}}'
    good = f'<!-- table {spec} -->\n| point | top-1 | seeds |\n|---|---|---|\n| norm_gelu_l2 | 86.55 | 0 1 2 |\n<!-- end table -->'
    assert docs.update(good) == (good, [])
    edited = good.replace('86.55', '86.56')
    new, stale = docs.update('intro\n' + edited + '\nafter\n')
    assert stale == [spec] and new == 'intro\n' + good + '\nafter\n'


def test_a_figure_typed_into_a_sentence_is_caught_and_needs_one_row(tmp_path):
    """An inline value is held to its row like a table: a hand-edited figure is stale and rendering restores
    the file's; filters that keep two rows are an error naming the file and the count."""
    docs = _render_docs()
    source = tmp_path / 'r.csv'
    source.write_text('config,top1_std\nvit,0.0412\ntokenformer,0.3204\n')
    good = f'the ViT varies by <!-- value {source}?config=vit | {{top1_std:.2f}} -->0.04<!-- end --> points'
    assert docs.update(good) == (good, [])
    new, stale = docs.update(good.replace('0.04<', '0.4<'))
    assert new == good and len(stale) == 1
    with pytest.raises(docs.SpecError, match=r'doc.md:1: .*r.csv has 2 rows that match'):
        docs.update(f'<!-- value {source} | {{top1_std}} -->x<!-- end -->', 'doc.md')


def test_a_json_results_file_of_another_shape_is_a_named_error(tmp_path):
    """A table reading ``file.json#models`` from a file whose top level is a list: a raw ``TypeError``; now the
    renderer's error naming the file and the key."""
    docs = _render_docs()
    source = tmp_path / 'r.json'
    source.write_text('[{"model": "vit", "top1": 1.0}]')
    with pytest.raises(docs.SpecError, match=r"r\.json holds list where the key 'models' needs an object"):
        docs.update(f'<!-- value {source}#models?model=vit | {{top1}} -->x<!-- end -->', 'doc.md')


def test_every_runs_csv_equals_its_metrics_files():
    """docs/*/runs.csv (the source of the README's training tables) is what tools/summarize_runs.py
    derives from the stored metrics.csv files today."""
    res = subprocess.run([sys.executable, 'tools/summarize_runs.py', '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_run_summary_is_computed_from_the_metrics_file(tmp_path):
    """The derived figures against a hand computation on a three-epoch file: training minutes are the
    sum of epoch_time, s/epoch skips the first (compiling) epoch, best and final top-1, the lowest loss's
    1-based epoch; a missing column is empty; a manifest entry without its machine is refused by name."""
    spec = importlib.util.spec_from_file_location('summarize_runs', f'{ROOT}/tools/summarize_runs.py')
    runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runs)
    metrics = tmp_path / 'm.csv'
    metrics.write_text('epoch,epoch_time,top1,val_loss,test_top1\n0,100,80.0,0.5,\n1,50,85.5,0.4,\n2,70,85.0,0.45,84.1\n')
    got = runs.derive(str(metrics))
    assert got['epochs'] == 3 and got['train_minutes'] == round(220 / 60, 1)
    assert (got['s_per_epoch_min'], got['s_per_epoch_max']) == (50, 70)
    assert (got['top1_final'], got['top1_best'], got['test_top1']) == (85.0, 85.5, 84.1)
    assert (got['val_loss_min'], got['val_loss_min_epoch'], got['val_loss_final']) == (0.4, 2, 0.45)
    assert got['ema_top1_final'] == ''
    manifest = tmp_path / 'runs.yaml'
    manifest.write_text(f'runs:\n  - {{name: a, group: g, metrics: {metrics}, eval_split: val, command: c, date: d}}\n')
    with pytest.raises(KeyError, match=r"'a' lacks \['machine'\]"):
        runs.summarize(str(manifest))


def test_model_table_equals_what_the_code_builds():
    """docs/models.csv (the README's model tables) holds today's parameter counts, built on meta."""
    res = subprocess.run([sys.executable, 'tools/model_table.py', '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_figure_the_row_lacks_renders_as_a_dash(tmp_path):
    """A baseline row has no ratio to itself: an empty or NaN value shows as – under any format spec."""
    docs = _render_docs()
    source = tmp_path / 'r.json'
    source.write_text('{"rows": [{"model": "a", "ratio": 0.9871}, {"model": "b", "ratio": NaN}, {"model": "c"}]}')
    table = docs.render(f'{source}#rows | model={{model}} | ratio={{ratio:.3f}}')
    assert table.splitlines()[2:] == ['| a | 0.987 |', '| b | – |', '| c | – |']


@pytest.mark.parametrize('configs, report, reference', [
    (['studies/comparison/configs/*.yaml'], 'docs/comparison', 'vit_equal_width'),
    (['studies/comparison/configs/tokenformer_equal_params.yaml', 'studies/comparison/configs/levers/*.yaml'],
     'docs/comparison/levers', 'tokenformer_equal_params'),
    (['studies/comparison/configs/long/*.yaml'], 'docs/comparison/long', 'vit_equal_width')],
    ids=['comparison', 'levers', 'long'])
def test_comparison_results_are_derived_from_the_stored_points(tmp_path, configs, report, reference):
    """docs/comparison/results.csv, levers/results.csv and long/results.csv (docs/comparison.md's tables) are what today's code
    makes of the stored per-seed points and the configs: parameters and GFLOPs counted, means, spreads and
    ratios."""
    res = subprocess.run([sys.executable, '-m', 'studies.comparison.comparison', *configs, '--from-points', f'{report}/points.csv',
                          '--report-dir', str(tmp_path), '--reference', reference],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(f'{ROOT}/{report}/results.csv') as stored, open(tmp_path / 'results.csv') as derived:
        assert derived.read() == stored.read()


def test_long_curves_are_derived_from_the_kept_metrics(tmp_path):
    """docs/comparison/long/curves.csv (docs/comparison.md §3's curve table) is what today's code reads from the
    runs' metrics files kept beside the points (the command in docs/comparison.md)."""
    res = subprocess.run([sys.executable, '-m', 'studies.comparison.comparison', 'studies/comparison/configs/long/*.yaml',
                          '--from-points', 'docs/comparison/long/points.csv', '--report-dir', str(tmp_path),
                          '--reference', 'vit_equal_width', '--curve-epochs', '6', '12', '18', '36', '60', '75'],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(f'{ROOT}/docs/comparison/long/curves.csv') as stored, open(tmp_path / 'curves.csv') as derived:
        assert derived.read() == stored.read()


def test_naflex_means_are_derived_from_the_stored_runs():
    """docs/naflex/ours.json's means (docs/naflex.md's tables) are what today's code makes of its per-run rows."""
    from studies.naflex.naflex_experiment import _training_means, summarize_rows
    with open(os.path.join(ROOT, 'docs', 'naflex', 'ours.json')) as f:
        stored = json.load(f)
    assert summarize_rows(stored['lengths']) == stored['length_means']
    assert _training_means(stored['training']) == stored['training_means']
    assert {r['config'] for r in stored['training']} == {'tokenformer', 'naflexvit', 'tokenformer_fixed_grid'}


@pytest.mark.parametrize('tool', ['tools/render_reference.py', 'tools/headline.py'])
def test_generated_pages_equal_what_the_code_and_results_files_give(tool):
    """The config-key and command reference pages, the site's home page and the README's headline table are
    generated (from the config's own tables, the console scripts' --help, README.md and the results files):
    a stale one fails, naming the command that regenerates it."""
    res = subprocess.run([sys.executable, tool, '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_docstring_cross_reference_names_an_object_that_exists():
    """Docstrings link with mkdocstrings' autorefs (``[`shown`][tkvision.full.path]``), which the strict site
    build resolves against the rendered API; here every such target, rendered or not, imports to an object, and
    no Sphinx role (``:func:`...```), which the site shows as raw text, is left in the package."""
    import ast
    import importlib
    import re
    link = re.compile(r'\]\[([A-Za-z_][\w.]*)\]')
    role = re.compile(r':(func|class|data|meth|mod|attr|exc|obj):`')
    missing, roles = [], []
    for top in ('tkvision', 'studies', 'tools'):
        for path in sorted(glob.glob(os.path.join(ROOT, top, '**', '*.py'), recursive=True)):
            tree = ast.parse(open(path, encoding='utf-8').read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    where = f'{os.path.relpath(path, ROOT)}:{getattr(node, "lineno", "?")}'
                    roles += [where] if role.search(node.value) else []
                    for target in link.findall(node.value):
                        if not _importable(importlib, target):
                            missing.append(f'{where}: {target}')
    assert not missing and not roles, (missing, roles)


def _importable(importlib, dotted: str) -> bool:
    parts = dotted.split('.')
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


#: Decimals typed into the prose of a results page's checked part, each with where it comes from: targets and
#: settings, not measurements (a measured figure is an inline value marker that a results file renders).
TYPED_DECIMALS = {
    ('docs/comparison.md', '0.3'): "the quick recipe's seed spread, as docs/comparison.md §1 measures it",
    ('docs/comparison.md', '82.5'): 'TokenFormer paper (arXiv:2410.23168), Table 2: TokenFormer-B/16 on ImageNet',
    ('docs/comparison.md', '82.3'): 'TokenFormer paper (arXiv:2410.23168), Table 2: ViT-B/16 (MAE) on ImageNet',
    ('docs/comparison.md', '82.1'): 'TokenFormer paper (arXiv:2410.23168), Table 2: the 86M-parameter TokenFormer-B/16 (B/16†)',
    ('docs/comparison.md', '7.4'): 'the sentence\'s arithmetic: 6 epochs / 0.81, the rendered speed ratio',
    ('docs/comparison.md', '0.834'): 'the speed table before the closed form: git show b2fdac0:docs/comparison/speed.csv',
    ('docs/comparison.md', '0.640'): 'the speed table before the closed form: git show b2fdac0:docs/comparison/speed.csv',
    ('docs/elastic.md', '0.3'): 'the target: every prefix within 0.3 validation points of its twin',
    ('docs/elastic.md', '1.5'): "the target: at most 1.5x the largest model's training compute",
    ('docs/elastic.md', '1.3'): "the stretch target: at most 1.3x the largest model's training compute",
    ('docs/mae.md', '0.75'): "settings: MAE's mask ratio (configs/fashion_mnist/mae_pretrain.yaml), ViT-L's and the "
                             'Fashion-MNIST fine-tune\'s layer decay (configs/imagenet/mae_finetune_vit_large_patch16_224.yaml, '
                             'configs/fashion_mnist/mae_finetune.yaml)',
    ('docs/mae.md', '0.9'): "a setting: AdamW's beta1 of MAE's pretraining (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/mae.md', '0.95'): "a setting: AdamW's beta2 of MAE's pretraining (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/mae.md', '0.05'): "a setting: MAE's pretraining weight decay (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/mae.md', '0.2'): "a setting: MAE's RandomResizedCrop lower bound (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/mae.md', '0.65'): "a setting: ViT-B's layer decay in MAE's fine-tuning (configs/imagenet/_base_mae_finetune.yaml)",
    ('docs/ringformer.md', '65.91'): 'RingFormer paper, Table 3 (arXiv:2502.13181): its upscaled RingFormer',
    ('docs/ringformer.md', '65.65'): 'RingFormer paper, Table 3 (arXiv:2502.13181): its ViT',
    ('docs/ringformer.md', '19.03'): "RingFormer paper's GFLOPs of its RingFormer (arXiv:2502.13181)",
    ('docs/ringformer.md', '17.64'): "RingFormer paper's GFLOPs of its ViT (arXiv:2502.13181)",
    ('docs/ringformer.md', '14.06'):
        'closed form: the mean distance between the centres of a 4 x 4 grid of 7-px patches, all pairs',
    ('docs/ringformer.md', '12.5'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '14.5'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '13.2'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '12.6'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '14.3'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '15.1'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '15.9'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '13.8'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ringformer.md', '14.7'):
        'the mean attention distances of docs/ringformer/mad_fmnist.json (levels x heads; the sentence says which)',
    ('docs/ablations.md', '0.8'):
        'TokenFormer paper (arXiv:2410.23168), Table 4: GELU + L2 82.5 against GELU + L1 81.7 on ImageNet',
    ('docs/ablations.md', '82.5'):
        'TokenFormer paper (arXiv:2410.23168), Table 5: the non-parametric and weight-only LayerNorms',
    ('docs/ablations.md', '82.6'):
        'TokenFormer paper (arXiv:2410.23168), Table 5: the LayerNorm with weight and bias',
    ('docs/ablations.md', '0.6'):
        "the largest top1_std of docs/ablations/options_results.csv (the base's and fc_norm's)",
    ('docs/performance.md', '0.08'):
        "a setting of the trainer comparison: RandomResizedCrop's lower bound (studies/performance/trainer_vs_timm.py)",
    ('docs/performance.md', '0.1'):
        'a setting of the trainer comparison: label smoothing (studies/performance/trainer_vs_timm.py)',
    ('docs/performance.md', '0.5'):
        'a py-spy profile of one run, not kept as a file (the sentence gives its command)',
    ('docs/performance.md', '1.0'):
        "the speed target: 1.0x the ViT's img/s",
    ('docs/performance.md', '0.43'):
        'docs/bench/gpu_h200_part2_2026-11-27.json, parts.lean: saved_mib_lean / saved_mib_autograd (0.43) and peak_mib_lean / peak_mib_autograd (0.49), one row',
    ('docs/performance.md', '0.49'):
        'docs/bench/gpu_h200_part2_2026-11-27.json, parts.lean: saved_mib_lean / saved_mib_autograd (0.43) and peak_mib_lean / peak_mib_autograd (0.49), one row',
    ('docs/performance.md', '2.5'):
        'docs/bench/gpu_h200_part2_2026-11-27.json, parts.end_to_end.legs: gpu_util of the first process',
    ('docs/performance.md', '7.9'):
        'docs/bench/gpu_h200_part2_2026-11-27.json, parts.end_to_end.legs: gpu_util of the resumed process',
    ('docs/performance.md', '0.75'):
        "a setting: the MAE step's mask ratio (studies/performance/gpu_report.py)",
    ('docs/growth.md', '1.5'):
        "two sources: the first recipe's per-epoch test dips after each step (docs/growth/results.json, results: each run's points), and Net2Net's share range [0.5, 1.5] (tkvision/growth/net2net.py)",
    ('docs/growth.md', '0.02'):
        "a setting: the public code's N(0, 0.02²) key init (the ablation's keys_normal arm)",
    ('docs/growth.md', '0.999'):
        "a setting: AdamW's default beta2 of these runs (configs/ablations/fashion_mnist/_base_.yaml)",
    ('docs/growth.md', '0.95'):
        "a setting: the ImageNet recipes' beta2 (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/growth.md', '0.25'):
        "a setting: the chain's re-warm of 0.25 epoch (configs/fashion_mnist/growth_chain.yaml)",
    ('docs/growth.md', '3.5'):
        'docs/growth/tau/results.json, tau_rows: top1_jumps of tau recomputed (-2.25, -2.09, -3.49)',
    ('docs/growth.md', '0.06'):
        'docs/growth/tau/results.json, tau_rows: loss_jumps of tau recomputed (+0.058, +0.056, +0.090)',
    ('docs/growth.md', '0.09'):
        'docs/growth/tau/results.json, tau_rows: loss_jumps of tau recomputed (+0.058, +0.056, +0.090)',
    ('docs/growth.md', '0.5'):
        "settings: warmup of 0.5 epoch (configs/ablations/fashion_mnist/_base_.yaml); Net2Net's share range",
    ('docs/growth.md', '0.05'):
        'a setting: weight decay 0.05 (configs/ablations/fashion_mnist/_base_.yaml)',
    ('docs/growth.md', '0.1'):
        'a setting: label smoothing 0.1 (configs/ablations/fashion_mnist/_base_.yaml)',
    ('docs/growth.md', '8.3'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '15.0'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '28.4'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '55.1'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '11.3'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '14.6'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '21.3'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '34.7'):
        'docs/growth/results.json, results.<chain>[0].flops_per_image / 1e6 (the four stages of the TokenFormer and ViT chains)',
    ('docs/growth.md', '0.19'):
        "docs/growth/report_60k.md: the chain's 87.82 against 88.01 from scratch, one seed",
    ('docs/growth.md', '0.4'):
        'the spread of the 2-seed settings table: docs/growth/results.json, ablation_rows, delta_std up to 0.34',
    ('docs/growth.md', '4.3'):
        'a section number of the TokenFormer paper (§4.3, in a heading)',
    ('README.md', '3.10'): "a requirement: setup.cfg's python_requires",
    ('docs/index.md', '3.10'): "a requirement: setup.cfg's python_requires",
    ('README.md', '0.90'): 'a parameter count: PARAMETER_COUNTS (configs/fashion_mnist/quick.yaml)',
    ('docs/index.md', '0.90'): 'a parameter count: PARAMETER_COUNTS (configs/fashion_mnist/quick.yaml)',
    ('docs/guide/training.md', '0.9'): 'a parameter count: PARAMETER_COUNTS (configs/fashion_mnist/quick.yaml)',
    ('docs/mae.md', '0.90'): 'a parameter count: PARAMETER_COUNTS (configs/fashion_mnist/mae_finetune.yaml)',
    ('docs/mae.md', '1.05'): 'a parameter count: PARAMETER_COUNTS (configs/fashion_mnist/mae_pretrain.yaml)',
    ('docs/mae.md', '1.5'): "a setting: MAE's base lr 1.5e-4 (configs/imagenet/_base_mae_pretrain.yaml)",
    ('docs/performance.md', '0.90'):
        "the speed target 0.90x the ViT's img/s, and the first trainer comparison's ratio: git show "
        '74c3633:docs/bench/trainer_vs_timm.json (0.899)',
    ('docs/performance.md', '0.99'):
        'a rerun of the trainer comparison on another VM, not kept as a file (the sentence says so)',
    ('docs/performance.md', '7.08'): 'closed form: 12 x 768² = 7,077,888 multiply-adds per token per block',
    ('docs/growth.md', '1.6'): "closed form: the sentence's Adam step ratio at j = 1, t = 313, β1 0.9, β2 0.999 (1.640)",
    ('docs/growth.md', '3.4'): "closed form: the sentence's Adam step ratio, its largest over j = 1..50 at β2 0.999 (3.406)",
    ('docs/growth.md', '0.45'): "closed form: the sentence's Adam step ratio at j = 1, β2 0.95 (0.447)",
    ('docs/growth.md', '1.1'): "closed form: the sentence's Adam step ratio, its largest at β2 0.95 (1.097)",
    ('docs/data.md', '0.5'): "a setting: timm's RandAugment string rand-m9-mstd0.5",
    ('docs/reliability.md', '2.14'): 'the pinned torch version (Makefile)',
    ('docs/guide/growth.md', '3.3'): 'a section number of the TokenFormer paper (§3.3)',
    ('docs/guide/growth.md', '0.02'): "a setting: the public code's N(0, 0.02²) key init",
    ('docs/guide/models.md', '0.02'): "a setting: the public code's N(0, 0.02²) init",
    ('docs/guide/models.md', '113.2'):
        "closed form: tokenformer_vit_b16's 12 blocks with n_ffn = 4 x n_qkv (docs/reference/background.md)",
    ('docs/ringformer.md', '4.40'): 'RingFormer paper, Table 2 (arXiv:2502.13181): its RingFormer-S parameters, which '
                                    'tests/test_ringformer.py reproduces',
    ('docs/ringformer.md', '12.02'): 'RingFormer paper, Table 3 (arXiv:2502.13181): its RingFormer-B parameters, which '
                                     'tests/test_ringformer.py reproduces',
    ('docs/ringformer.md', '31.95'): 'RingFormer paper, Table 3 (arXiv:2502.13181): its upscaled RingFormer parameters, '
                                     'which tests/test_ringformer.py reproduces',
    ('docs/ablations.md', '79.6'): 'TokenFormer paper (arXiv:2410.23168), Table 4: exp + L1 on ImageNet',
    ('docs/ablations.md', '81.7'): 'TokenFormer paper (arXiv:2410.23168), Table 4: GELU + L1 on ImageNet',
    ('docs/growth.md', '3.7'): 'a setting: LOSS_GAP_SIGMAS of studies/growth/precondition.py (the loss gap rule)',
    ('docs/growth.md', '1.78'): 'closed form: 128 / 72 tokens per Pattention, the long recipe sizes compared',
    ('docs/growth.md', '0.75'): "a setting: MAE's mask ratio (configs/fashion_mnist/mae_pretrain.yaml)",
    ('docs/guide/sweeps.md', '22.05'): "a version: Debian 12's Slurm (tools/slurm/local_cluster.sh)",
    ('docs/guide/imagenet.md', '22.05'): "a version: Debian 12's Slurm (tools/slurm/local_cluster.sh)",
}
#: The parts of the pages held to TYPED_DECIMALS: (page, first heading, heading that ends it or None): the README,
#: the docs' home page, the results pages and the user guide.
CHECKED_PARTS = [(page, None, None) for page in (
    'README.md', 'docs/index.md', 'docs/comparison.md', 'docs/elastic.md', 'docs/mae.md', 'docs/naflex.md',
    'docs/ringformer.md', 'docs/ablations.md', 'docs/performance.md', 'docs/growth.md', 'docs/data.md',
    'docs/reliability.md', *sorted(f'docs/guide/{name}' for name in os.listdir(os.path.join(ROOT, 'docs', 'guide'))))]


#: A decimal typed by hand: not part of a longer number (a version ``2.14.1``), whatever follows it (a unit, ``x``,
#: ``k``, ``M``, ``e``, ``²``, a full stop).
TYPED_DECIMAL = r'(?<![\d.])\d+\.\d+(?!\.?\d)'


def typed_decimals(text: str) -> list:
    """The decimals of ``text`` outside rendered tables, inline value markers, code and links: figures typed by
    hand, a hand-typed table's cells included."""
    import re
    text = re.sub(r'<!-- table .*? -->.*?<!-- end table -->', '', text, flags=re.S)
    text = re.sub(r'<!-- (?:value|compare) .*? -->.*?<!-- end -->', '', text, flags=re.S)
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    text = re.sub(r'<!--.*?-->', '', text, flags=re.S)
    found = []
    for line in text.splitlines():
        line = re.sub(r'`[^`]*`', '', re.sub(r'\]\([^)]*\)', ']', line))
        line = re.sub(r'\b\d{4}\.\d{4,5}\b', '', line)  # an arXiv identifier
        found += re.findall(TYPED_DECIMAL, line)
    return found


def loose_decimals(root: str = ROOT) -> list:
    """``'page: decimal'`` for each decimal typed into a checked part (`CHECKED_PARTS`) of the pages under ``root``
    that `TYPED_DECIMALS` does not list."""
    loose = []
    for page, first, last in CHECKED_PARTS:
        text = open(os.path.join(root, page), encoding='utf-8').read()
        if first:
            text = text[text.index(first):text.index(last) if last else None]
        key = page + ('#' + first.split()[1].rstrip('.') if first else '')
        loose += [f'{key}: {d}' for d in typed_decimals(text) if (key, d) not in TYPED_DECIMALS]
    return loose


def test_results_pages_type_no_figure_a_results_file_does_not_hold():
    """In the checked parts of the pages every decimal outside a rendered table or an inline value (which a results
    file renders, held equal by the test above) is listed in TYPED_DECIMALS with its source."""
    loose = loose_decimals()
    assert loose == [], loose


def test_an_inline_value_can_be_the_gap_or_the_ratio_of_two_rows(tmp_path):
    """``A minus B`` and ``A over B`` combine the columns of the one row each side keeps (what a sentence's "2.1 points
    below" or "0.29x the parameters" says), checked against the arithmetic done here."""
    docs = _render_docs()
    path = tmp_path / 'r.csv'
    path.write_text('config,top1,params,note\nvit,85.55,305034,a\nring,83.43,68682,b\none cosine over the chain,84.8,1,c\n')
    both = f'{path}?config=ring minus {path}?config=vit'
    assert docs.render_value(f'{both} | {{top1:+.2f}}') == f'{83.43 - 85.55:+.2f}' == '-2.12'
    assert docs.render_value(f'{path}?config=ring over {path}?config=vit | {{params:.2f}}') == f'{68682 / 305034:.2f}'
    # the word joins two sources only: inside a filter value it is text
    assert docs.render_value(f'{path}?config=one cosine over the chain minus {path}?config=vit | {{top1:+.2f}}') == '-0.75'
    with pytest.raises(KeyError):  # a text column has no difference
        docs.render_value(f'{both} | {{note}}')
    with pytest.raises(docs.SpecError, match='3 rows'):
        docs.render_value(f'{path} minus {path}?config=vit | {{top1}}')


def test_a_typed_figure_in_a_checked_part_is_caught():
    rendered = '<!-- table x.csv | a={a} -->\n| a |\n|---|\n| 1.5 |\n<!-- end table -->\n'
    assert typed_decimals(f'the gap is 0.92 points\n{rendered}<!-- value x | {{a}} -->0.5<!-- end --> `0.1`') == ['0.92']
    # followed by a unit, a multiplier, a full stop or a power; a hand-typed table's cells; not a version
    text = ('0.90x eager, 2.5k img/s, 7.08M adds, 1.5e-3, 3.2² and 0.837.\n| arm | 84.12 |\n'
            'torch 2.14.1, see [the run](runs/0.5.csv)')
    assert typed_decimals(text) == ['0.90', '2.5', '7.08', '1.5', '3.2', '0.837', '84.12']


#: Parameter counts typed into the pages: (page, figure in millions) -> the config whose model it counts.
PARAMETER_COUNTS = {
    ('README.md', '0.90'): 'configs/fashion_mnist/quick.yaml',
    ('docs/index.md', '0.90'): 'configs/fashion_mnist/quick.yaml',
    ('docs/guide/training.md', '0.9'): 'configs/fashion_mnist/quick.yaml',
    ('docs/mae.md', '0.90'): 'configs/fashion_mnist/mae_finetune.yaml',
    ('docs/mae.md', '1.05'): 'configs/fashion_mnist/mae_pretrain.yaml',
}


def test_the_parameter_counts_typed_in_the_pages_are_the_models():
    """Each typed parameter count, rounded as typed, is the count of its config's model (built on the meta device)
    and appears on its page followed by ``M``."""
    import torch
    from tkvision.engine.config import load_config, model_for_config
    for (page, figure), config in PARAMETER_COUNTS.items():
        with torch.device('meta'):
            params = sum(p.numel() for p in model_for_config(load_config(os.path.join(ROOT, config))).parameters())
        digits = len(figure.split('.')[1])
        assert f'{params / 1e6:.{digits}f}' == figure, (page, config, params)
        assert f'{figure}M' in open(os.path.join(ROOT, page), encoding='utf-8').read(), page


def test_a_figure_planted_in_every_checked_page_is_caught(tmp_path, monkeypatch):
    """The check covers README.md, docs/index.md, every results page and the user guide: a measured figure planted
    in any one of them fails it."""
    import shutil
    pages = sorted({page for page, _, _ in CHECKED_PARTS})
    assert {'README.md', 'docs/index.md', 'docs/guide/growth.md'} <= set(pages)
    for page in pages:
        root = tmp_path / page.replace('/', '_')
        for other in pages:
            (root / other).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(ROOT, other), root / other)
        with open(root / page, 'a', encoding='utf-8') as f:
            f.write('\nThe planted run reached 91.23x the baseline.\n')
        assert loose_decimals(str(root)) == [f'{page}: 91.23'], page


def test_the_long_recipe_reported_is_chosen_on_validation_by_the_stated_rule():
    """The README's long-recipe row reported a recipe picked on one seed while another at the same compute
    validated higher on three. ``tools/headline.py`` now states the rule and applies it: of the TokenFormer recipes
    at the ViT's compute run on 3 seeds, the highest validation mean; a higher one on fewer seeds or at more compute
    is not chosen, and the test split plays no part."""
    import csv
    spec = importlib.util.spec_from_file_location('headline', f'{ROOT}/tools/headline.py')
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    with open(f'{ROOT}/docs/comparison/long/results.csv', encoding='utf-8') as f:
        long = {r['config']: r for r in csv.DictReader(f)}
    eligible = [r for c, r in long.items() if not c.startswith('vit') and int(r['seeds']) >= 3
                and float(r['compute_vs_reference']) <= 1.05]
    best = max(float(r['top1_mean']) for r in eligible)
    assert float(headline.chosen_long_recipe(long)['top1_mean']) == best
    assert headline.chosen_long_recipe(long)['config'] == 'tokenformer_token_lr_quarter_token_decay'
    planted = dict(long, one_seed=dict(long['tokenformer_token_lr_quarter'], config='one_seed', seeds='1',
                                       top1_mean='99.0'),
                   costly=dict(long['tokenformer_token_lr_quarter'], config='costly', compute_vs_reference='1.5',
                               top1_mean='99.0'),
                   test_only=dict(long['tokenformer_token_lr_quarter'], config='test_only', test_top1_mean='99.0'))
    assert headline.chosen_long_recipe(planted)['config'] == 'tokenformer_token_lr_quarter_token_decay'


def test_every_points_file_says_what_ran_each_row():
    """The per-seed files the compare marker reads keep a machine and a commit on every row (``unknown`` where it
    was not recorded), so a comparison of two sides that ran apart says so (docs/comparison.md and the others)."""
    paths = sorted(set(glob.glob(os.path.join(ROOT, 'docs', '**', '*points*.csv'), recursive=True))
                   | set(glob.glob(os.path.join(ROOT, 'docs', '**', '*_curves.csv'), recursive=True)))
    assert len(paths) >= 9
    for path in paths:
        with open(path, encoding='utf-8') as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r.get('machine') and r.get('commit') for r in rows), path


def test_the_retired_elastic_arms_keep_their_seeds_beside_their_means():
    """docs/elastic/retired.csv (arms removed from the library, measured at commit dd0e6dd) is what its per-seed rows
    in retired_points.csv give: seeds, means and sample standard deviations, so the compare marker can read them."""
    import statistics
    with open(os.path.join(ROOT, 'docs/elastic/retired_points.csv'), encoding='utf-8') as f:
        points = list(csv.DictReader(f))
    with open(os.path.join(ROOT, 'docs/elastic/retired.csv'), encoding='utf-8') as f:
        retired = list(csv.DictReader(f))
    assert len(retired) == 15
    for row in retired:
        seeds = [p for p in points if (p['method'], p['prefix']) == (row['method'], row['prefix'])]
        for column in ('top1', 'test_top1'):
            values = [float(p[column]) for p in seeds]
            assert len(values) == int(row['seeds']), row
            assert round(statistics.mean(values), 2) == float(row[column + '_mean']), (row, column)
            assert round(statistics.stdev(values), 2) == float(row[column + '_std']), (row, column)


def test_the_headline_says_when_a_row_compares_seeds_run_apart(tmp_path, monkeypatch):
    """The plain-MLP row set seeds from an Intel Xeon VM and later code against the ViT's from the AMD EPYC VM
    without a word: the headline now reads the points' machine and commit and says which differ."""
    spec = importlib.util.spec_from_file_location('headline', f'{ROOT}/tools/headline.py')
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    monkeypatch.setattr(headline, 'ROOT', str(tmp_path))
    (tmp_path / 'points.csv').write_text('config,seed,machine,commit\nmlp,0,Xeon,b\nmlp,1,Xeon,b\nvit,0,EPYC,a\n'
                                         'same,0,EPYC,a\n')
    assert headline._apart('points.csv', 'mlp', 'vit') == "; its seeds ran on other CPUs and other code than the ViT's"
    assert headline._apart('points.csv', 'same', 'vit') == ''


def _planted_compare(tmp_path, left: list, right: list, **columns) -> str:
    """``render_compare`` of two planted points files: ``left`` and ``right`` one top-1 per seed, ``columns``
    (``machine=('a', 'b')``) a value per side."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    import render_docs
    path = tmp_path / 'points.csv'
    names = sorted(columns)
    rows = [','.join(['side', 'seed', 'top1', *names])]
    for side, values in (('a', left), ('b', right)):
        rows += [','.join([side, str(seed), str(v), *(columns[n][side == 'b'] for n in names)])
                 for seed, v in enumerate(values)]
    path.write_text('\n'.join(rows) + '\n')
    relative = os.path.relpath(path, ROOT)
    return render_docs.render_compare(f'{relative}?side=a vs {relative}?side=b | top1 | points')


def test_a_comparison_takes_its_verb_from_the_interval_and_says_when_its_sides_ran_apart(tmp_path):
    """The compare marker: no "ahead" or "behind" unless the 95% interval (Welch, the project's rule in
    studies/intervals.py) excludes 0, checked against the closed form; a pair from two machines or two commits
    says so by itself."""
    from scipy import stats
    # [1, 2, 3] against [0, 1, 2]: gap 1, each variance 1, so se = sqrt(2/3), Welch's df = 4
    half = stats.t.ppf(0.975, 4) * (2 / 3) ** 0.5
    level = _planted_compare(tmp_path, [1, 2, 3], [0, 1, 2])
    assert level == f'level within the seed spread (+1.00 points, 95% interval {1 - half:+.2f} to {1 + half:+.2f}; ' \
                    '3 and 3 seeds)'
    means_only = _planted_compare(tmp_path, [80.0, 82.0, 84.0], [79.0, 79.5, 80.0])
    assert means_only.startswith('ahead on the means only (+2.50 points') and 'ahead by' not in means_only
    ahead = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2])
    assert ahead.startswith('ahead by 1.10 points (95% interval +0.')
    behind = _planted_compare(tmp_path, [84.0, 84.1, 84.2], [85.1, 85.2, 85.3])
    assert behind.startswith('behind by 1.10 points')
    apart = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2], machine=('AMD EPYC', 'Intel Xeon'),
                             commit=('abc1234', 'abc1234'))
    assert apart.endswith('(on different CPUs)') and 'different code' not in apart
    code = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2], commit=('abc1234', 'def5678'))
    assert code.endswith('(different code)')
