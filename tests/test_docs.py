"""Every generated table in README.md and docs/ equals its results file (tools/render_docs.py): a
figure changed in a results file and not in the docs, or typed into a table by hand, fails CI."""
import csv
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from .helpers import ROOT


def _tool(name: str = 'render_docs'):
    """``tools/<name>.py`` loaded as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, f'{ROOT}/tools/{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_table_equals_its_results_file():
    res = subprocess.run([sys.executable, 'tools/render_docs.py', '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_a_table_typed_by_hand_is_caught(tmp_path):
    """The check can fail: a table whose figure differs from its CSV by one digit is reported stale,
    and rendering restores the file's figure."""
    docs = _tool()
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
    docs = _tool()
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
    docs = _tool()
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
    runs = _tool('summarize_runs')
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


def test_model_table_equals_what_the_code_builds(monkeypatch, capsys):
    """docs/models.csv (the README's model tables) holds today's parameter counts, built on meta
    (``python tools/model_table.py --check``, run in this process)."""
    monkeypatch.chdir(ROOT)
    assert _tool('model_table').main(['--check']) == 0, capsys.readouterr().out


def test_a_figure_the_row_lacks_renders_as_a_dash(tmp_path):
    """A baseline row has no ratio to itself: an empty or NaN value shows as – under any format spec."""
    docs = _tool()
    source = tmp_path / 'r.json'
    source.write_text('{"rows": [{"model": "a", "ratio": 0.9871}, {"model": "b", "ratio": NaN}, {"model": "c"}]}')
    table = docs.render(f'{source}#rows | model={{model}} | ratio={{ratio:.3f}}')
    assert table.splitlines()[2:] == ['| a | 0.987 |', '| b | – |', '| c | – |']


def _comparison_report(configs, report, reference, out, arguments, monkeypatch, capsys):
    """``python -m studies.comparison.comparison CONFIGS --from-points REPORT/points.csv --report-dir OUT`` as the
    docs pages give it, run from the repository root in this process (its imports are paid once per worker, not
    once per report); fails with what it printed on stderr unless it exits 0."""
    from studies.comparison.comparison import main
    monkeypatch.chdir(ROOT)
    code = main([*configs, '--from-points', f'{report}/points.csv', '--report-dir', str(out),
                 '--reference', reference, *arguments])
    assert code == 0, capsys.readouterr().err[-2000:]


@pytest.mark.parametrize('configs, report, reference', [
    (['studies/comparison/configs/*.yaml'], 'docs/comparison', 'vit_equal_width'),
    (['studies/comparison/configs/tokenformer_equal_params.yaml', 'studies/comparison/configs/levers/*.yaml'],
     'docs/comparison/levers', 'tokenformer_equal_params'),
    (['studies/comparison/configs/long/*.yaml'], 'docs/comparison/long', 'vit_equal_width'),
    (['studies/cifar10/configs/quick/tokenformer.yaml', 'studies/cifar10/configs/quick/vit.yaml'],
     'docs/cifar10/quick', 'vit'),
    (['studies/cifar10/configs/long/tokenformer_p4.yaml', 'studies/cifar10/configs/long/tokenformer_p8.yaml',
      'studies/cifar10/configs/long/vit_p4.yaml', 'studies/cifar10/configs/long/token_lr_quarter_p4.yaml'],
     'docs/cifar10/long', 'tokenformer_p4'),
    (['studies/cifar10/configs/screen/*.yaml'], 'docs/cifar10/screen', 'p8_w96_e12'),
    (['studies/cifar10/configs/quick/tokenformer.yaml', 'studies/cifar10/configs/quick/growth/*.yaml'],
     'docs/cifar10/growth', 'tokenformer'),
    (['studies/cifar10/configs/quick/tokenformer.yaml', 'studies/cifar10/configs/quick/ablations/*.yaml'],
     'docs/cifar10/ablations', 'tokenformer'),
    (['studies/cifar10/configs/quick/tokenformer.yaml', 'studies/cifar10/configs/quick/levers/*.yaml'],
     'docs/cifar10/levers', 'tokenformer'),
    (['studies/cifar10/configs/quick/tokenformer.yaml', 'studies/cifar10/configs/quick/augment/*.yaml'],
     'docs/cifar10/augment', 'tokenformer'),
    (['studies/cifar10/configs/mae/finetune.yaml', 'studies/cifar10/configs/mae/scratch.yaml'],
     'docs/cifar10/mae', 'scratch')],
    ids=['comparison', 'levers', 'long', 'cifar10_quick', 'cifar10_long', 'cifar10_screen', 'cifar10_growth',
         'cifar10_ablations', 'cifar10_levers', 'cifar10_augment', 'cifar10_mae'])
def test_comparison_results_are_derived_from_the_stored_points(tmp_path, monkeypatch, capsys, configs, report,
                                                                 reference):
    """docs/comparison/results.csv, levers/results.csv and long/results.csv (docs/comparison.md's tables), CIFAR-10's
    quick, long and screen results (docs/cifar10.md's) and the paired.csv beside each are what today's code makes of the stored per-seed points and the configs: parameters
    and GFLOPs counted, means, spreads, ratios and the seed-by-seed differences."""
    _comparison_report(configs, report, reference, tmp_path, [], monkeypatch, capsys)
    for name in ('results.csv', 'paired.csv'):
        with open(f'{ROOT}/{report}/{name}') as stored, open(tmp_path / name) as derived:
            assert derived.read() == stored.read(), name


@pytest.mark.parametrize('configs, report, reference, arguments, files', [
    (['studies/comparison/configs/long/*.yaml'], 'docs/comparison/long', 'vit_equal_width',
     ['--curve-epochs', '6', '12', '18', '36', '60', '75'], ['curves.csv']),
    (['studies/cifar10/configs/long/tokenformer_p4.yaml', 'studies/cifar10/configs/long/tokenformer_p8.yaml',
      'studies/cifar10/configs/long/vit_p4.yaml', 'studies/cifar10/configs/long/token_lr_quarter_p4.yaml'],
     'docs/cifar10/long', 'tokenformer_p4',
     ['--curve-epochs', '5', '10', '20', '30', '--time-to', '80'],
     ['curves.csv', 'time_to.csv'])],
    ids=['comparison_long', 'cifar10_long'])
def test_long_curves_are_derived_from_the_kept_metrics(tmp_path, monkeypatch, capsys, configs, report, reference,
                                                       arguments, files):
    """docs/comparison/long/curves.csv (docs/comparison.md §3's curve table), and CIFAR-10's long curves and time
    to 80% (docs/cifar10.md), are what today's code reads from the runs' metrics files kept beside the points (the
    commands in those pages)."""
    _comparison_report(configs, report, reference, tmp_path, arguments, monkeypatch, capsys)
    for name in files:
        with open(f'{ROOT}/{report}/{name}') as stored, open(tmp_path / name) as derived:
            assert derived.read() == stored.read(), name


def test_cifar10_mae_compute_is_derived_and_the_scratch_arm_matches_it(tmp_path):
    """docs/cifar10/mae/compute.csv (docs/cifar10.md's MAE section) is what today's code counts from the configs,
    and scratch.yaml trains for the whole number of epochs nearest the MAE arm's compute (pretraining plus
    fine-tuning), as its header says: within half an epoch of it."""
    res = subprocess.run([sys.executable, '-m', 'studies.cifar10.mae_compute', '--report-dir', str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(f'{ROOT}/docs/cifar10/mae/compute.csv') as stored, open(tmp_path / 'compute.csv') as derived:
        assert derived.read() == stored.read()
    with open(tmp_path / 'compute.csv') as f:
        rows = {r['arm']: r for r in csv.DictReader(f)}
    scratch, mae = rows['scratch'], rows['pretrain + finetune']
    per_epoch = float(scratch['train_tflops']) / int(scratch['epochs'])
    assert abs(float(scratch['train_tflops']) - float(mae['train_tflops'])) <= per_epoch / 2


def test_cifar10_mae_keeps_the_pretraining_curve_and_names_a_missing_run(tmp_path):
    """``--out`` copies the finished pretraining point's metrics.csv and result.json byte for byte beside
    compute.csv (``runs/`` does not travel); an unfinished point or a folder without it is one line naming the
    files, exit 2, and nothing is written."""
    from studies.cifar10.mae_compute import main
    run = tmp_path / 'sweep' / 'pretrain' / 'seed0'
    run.mkdir(parents=True)
    (run / 'metrics.csv').write_bytes(b'epoch,train_loss,val_loss\n0,0.83,0.77\n')
    assert main(['--report-dir', str(tmp_path / 'report'), '--out', str(tmp_path / 'sweep')]) == 2  # unfinished
    assert not (tmp_path / 'report' / 'pretrain_metrics.csv').exists()
    (run / 'result.json').write_bytes(b'{"config": "pretrain", "commit": "abc1234"}')
    assert main(['--report-dir', str(tmp_path / 'report'), '--out', str(tmp_path / 'sweep')]) == 0
    for name in ('metrics.csv', 'result.json'):
        assert (tmp_path / 'report' / f'pretrain_{name}').read_bytes() == (run / name).read_bytes()
    assert main(['--report-dir', str(tmp_path / 'other'), '--out', str(tmp_path / 'empty')]) == 2
    assert not (tmp_path / 'other' / 'pretrain_metrics.csv').exists()


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


def test_every_figure_typed_by_hand_is_listed_by_its_context():
    """In the README, every hand-written page under docs/, the configs' headers and the docstrings the API page
    renders, each figure outside a rendered marker is listed in tests/typed_figures.csv by the words around it; a
    listed context no longer in its text is reported too (remove the row)."""
    from .typed_figures import documents, listed, loose_figures
    loose, stale = loose_figures(documents(), listed())
    assert loose == [], 'a figure typed by hand: render it from its results file, or list it with its source\n' + \
        '\n'.join(loose)
    assert stale == [], 'listed contexts no longer on their page: remove the rows\n' + '\n'.join(stale)


def test_every_listed_figure_names_its_source():
    """Each row of tests/typed_figures.csv says where its figure comes from (a setting, a paper's table, a closed
    form, an archived run's file): an empty source fails, naming the row."""
    from .typed_figures import listed
    assert [r for r in listed() if not r['source'].strip()] == []


#: Each form the check must catch, as a planted sentence (the figure it must report).
PLANTED = [
    ('The planted run reached 61 % of the baseline.', '61'),
    ('The planted run is 2x faster.', '2'),
    ('The planted run trains at 1,334 img/s.', '1,334'),
    ('The planted run is .61x the baseline.', '.61'),
    ('The planted run printed `val top-1 91.23` at the end.', '91.23'),
    ('The planted run printed:\n\n```\nepoch 6: val top-1 91.23\n```\n', '91.23'),
    ('The planted run is sixty percent of the baseline.', 'sixty percent'),
    ('The planted run trains three times faster.', 'three times'),
    ('The planted run is twice as fast.', 'twice as'),
    ('The planted run trains at 1e3 img/s.', '1e3'),
    ('The planted run reached 88-89% top-1.', '88-89'),
    ('The planted run trains 4 times faster.', '4'),
    ('The planted run reached 88 percent.', '88'),
    ('The planted run is 2 points ahead.', '2'),
    ('The planted run took 13 min.', '13'),
    ('The planted run took a third of the time.', 'a third'),
    ('The planted run is half a point ahead.', 'half a'),
    ('The planted run is 0,9x the baseline.', '0,9'),
]


@pytest.mark.parametrize('where', ['docs/comparison.md', 'docs/comparison/levers/notes.md',
                                   'docs/performance_archive.md', 'docs/reference/background.md', 'README.md',
                                   'docs/guide/training.md',
                                   'tkvision/configs/fashion_mnist/long.yaml',
                                   'docstring tkvision.layers.pattention.Pattention',
                                   'docstring tkvision.engine.healing', 'DEVELOPERS.md', 'mkdocs.yml', 'Makefile'])
def test_each_planted_form_is_caught_on_every_kind_of_page(where):
    """A results page, a notes page, the archive, a reference page, the README, the guide, a config's header, a
    docstring the site renders and one it does not, DEVELOPERS.md, mkdocs.yml and the Makefile: each planted form is
    reported there, and only it."""
    from .typed_figures import documents, listed, loose_figures
    docs, rows = documents(), listed()
    assert where in docs
    for sentence, figure in PLANTED:
        planted = dict(docs, **{where: docs[where] + '\n\n' + sentence + '\n'})
        loose, _ = loose_figures(planted, rows)
        assert [line.split(' in "')[0] for line in loose] == [f'{where}: {figure}'], (sentence, loose)


def test_a_figure_in_a_tables_header_or_below_a_configs_header_is_caught(tmp_path):
    """A generated table's cells are rendered but its headers are typed into the marker by hand: a figure there is
    reported. A config's comments below its header and at the end of a line are read as its header is."""
    from .typed_figures import _comments, documents, listed, loose_figures
    docs, rows = documents(), listed()
    table = ('<!-- table docs/ablations/results.csv | point={config} | top-1 at 88%={top1_mean} -->\n| point | top-1 at '
             '88% |\n|---|---|\n<!-- end table -->\n')
    planted = dict(docs, **{'docs/ablations.md': docs['docs/ablations.md'] + '\n' + table})
    assert [line.split(' in "')[0] for line in loose_figures(planted, rows)[0]] == ['docs/ablations.md: 88']
    config = tmp_path / 'planted.yaml'
    config.write_text('# The header.\nepochs: 6\n# Below it: the run took 13 min.\nlr: 0.002  # 3x the old one\n')
    assert _comments(str(config)) == ' The header.\n Below it: the run took 13 min.\n 3x the old one\n'


def test_a_listed_figure_reused_elsewhere_on_its_page_is_caught():
    """The list is keyed by the words around a figure, not by the page: the paper's 82.5 listed in one sentence of
    docs/comparison.md does not cover an 82.5 planted in another."""
    from .typed_figures import documents, listed, loose_figures
    docs, rows = documents(), listed()
    assert any(r['where'] == 'docs/comparison.md' and '82.5' in r['context'] for r in rows)
    planted = dict(docs, **{'docs/comparison.md': docs['docs/comparison.md'] + '\nOur run reached 82.5 on test.\n'})
    assert [line.split(' in "')[0] for line in loose_figures(planted, rows)[0]] == ['docs/comparison.md: 82.5']


def test_settings_shapes_and_the_interval_rule_are_not_figures():
    """What is not a measurement is not counted: a value given to a key, an option or a call in code, a shape
    (``4 x 4``), the project's "95% interval", a count of images, a section number, a date, a version; in a config's
    header a figure equal to one of the config's own numbers, but not another."""
    from .typed_figures import figures, readable_text, settings_spared
    text = readable_text('Set `key_std: 0.1` or `--lr 0.002`; ```python\nwith prefix(model, 0.5):\n    pass\n```\n'
                         'a 4 x 4 grid, its 95% interval, the 10,000 held-out training images, §4.3, 2026-12-04, '
                         'torch 2.14.1, `top1@0.25`.')
    assert figures(text) == []
    header = readable_text('Drop path 0.1 (its setting); the run reached 91.23.')
    found = settings_spared('tkvision/configs/fashion_mnist/long.yaml', header, figures(header))
    assert [f for f, _, _ in found] == ['91.23']


def test_an_inline_value_can_be_the_gap_or_the_ratio_of_two_rows(tmp_path):
    """``A minus B`` and ``A over B`` combine the columns of the one row each side keeps (what a sentence's "2.1 points
    below" or "0.29x the parameters" says), checked against the arithmetic done here."""
    docs = _tool()
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


#: Parameter counts typed into the pages: (page, figure in millions) -> the config whose model it counts.
PARAMETER_COUNTS = {
    ('README.md', '0.90'): 'configs/fashion_mnist/quick.yaml',
    ('docs/index.md', '0.90'): 'configs/fashion_mnist/quick.yaml',
    ('docs/guide/training.md', '0.9'): 'configs/fashion_mnist/quick.yaml',
    ('docs/mae.md', '0.90'): 'configs/fashion_mnist/mae_finetune.yaml',
    ('docs/mae.md', '1.05'): 'configs/fashion_mnist/mae_pretrain.yaml',
    ('tkvision/configs/cifar10/quick.yaml', '0.69'): 'configs/cifar10/quick.yaml',
    ('tkvision/configs/cifar10/long.yaml', '0.31'): 'configs/cifar10/long.yaml',
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


def test_the_long_recipe_reported_is_chosen_on_validation_by_the_stated_rule():
    """The README's long-recipe row reported a recipe picked on one seed while another at the same compute
    validated higher on three. ``tools/headline.py`` now states the rule and applies it: of the TokenFormer recipes
    at the ViT's compute run on 3 seeds, the highest validation mean; a higher one on fewer seeds or at more compute
    is not chosen, and the test split plays no part."""
    import csv
    headline = _tool('headline')
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


def test_the_cifar10_long_recipe_row_is_a_shape_and_a_lever_gets_its_own_row(tmp_path, monkeypatch):
    """CIFAR-10's long screen chooses among shapes (``tokenformer_p4``, ``tokenformer_p8``); a lever run beside them
    (``token_lr_quarter_p4``) that validates higher was taken for the recipe and compared with itself as its own
    "twin". The recipe row keeps the best shape against ``vit_p4``; the lever is a row of its own against the same
    twin."""
    headline = _tool('headline')
    monkeypatch.setattr(headline, 'ROOT', str(tmp_path))
    folder = tmp_path / 'docs' / 'cifar10' / 'long'
    folder.mkdir(parents=True)
    columns = 'config,epochs,seeds,top1_mean,top1_std,test_top1_mean,test_top1_std'
    (folder / 'results.csv').write_text(f'{columns}\ntokenformer_p4,30,1,67.0,,65.0,\ntokenformer_p8,60,1,64.0,,64.5,\n'
                                        'vit_p4,30,1,73.0,,73.5,\ntoken_lr_quarter_p4,30,1,70.0,,69.0,\n')
    (folder / 'points.csv').write_text('config,seed,test_top1,machine,commit\ntokenformer_p4,0,65.0,m,a\n'
                                       'tokenformer_p8,0,64.5,m,a\nvit_p4,0,73.5,m,a\ntoken_lr_quarter_p4,0,69.0,m,b\n')
    rows = {r['key']: r for r in headline._cifar10_long()}
    assert (rows['cifar10_long']['tokenformer'], rows['cifar10_long']['vit']) == ('65.00', '73.50')
    assert rows['cifar10_long']['difference'] == '-8.50' and '`tokenformer_p4`' in rows['cifar10_long']['question']
    lever = rows['cifar10_long_token_lr']
    assert (lever['tokenformer'], lever['vit'], lever['difference']) == ('69.00', '73.50', '-4.50')
    assert lever['question'].endswith("1 seed each; its seeds ran on other code than the ViT's")
    (folder / 'results.csv').write_text(f'{columns}\ntokenformer_p4,30,1,67.0,,65.0,\n')
    assert [r['key'] for r in headline._cifar10_long()] == ['cifar10_long']
    assert headline._cifar10_long()[0]['vit'] == '–'


def test_the_headline_gap_is_the_one_its_page_prints(tmp_path, monkeypatch):
    """The long CIFAR-10 row said -7.89 while docs/cifar10.md's compare marker said "behind by 7.88 points": the
    headline subtracted the results file's two-decimal means (65.60 - 73.49), the marker rounded the per-seed gap
    twice (to 8 digits, then to 2: -7.885000000000005 -> -7.885 -> -7.88). Both now round the float gap once, as the
    results file's gap is; the reference is that float's exact decimal value, rounded by `decimal`."""
    from decimal import ROUND_HALF_EVEN, Decimal

    from tkvision.experiments.intervals import compare_words
    headline = _tool('headline')
    monkeypatch.setattr(headline, 'ROOT', str(tmp_path))
    folder = tmp_path / 'docs' / 'cifar10' / 'long'
    folder.mkdir(parents=True)
    (folder / 'results.csv').write_text('config,epochs,seeds,top1_mean,top1_std,test_top1_mean,test_top1_std\n'
                                        'tokenformer_p4,30,2,67.32,0.17,65.6,0.43\nvit_p4,30,1,73.8,,73.49,\n')
    (folder / 'points.csv').write_text('config,seed,test_top1,machine,commit\ntokenformer_p4,0,65.3,m,a\n'
                                       'tokenformer_p4,1,65.91,m,a\nvit_p4,0,73.49,m,a\n')
    exact = Decimal((65.3 + 65.91) / 2 - 73.49).quantize(Decimal('0.01'), rounding=ROUND_HALF_EVEN)
    assert str(exact) == '-7.89'
    assert compare_words([65.3, 65.91], [73.49], 'points', short=True) == 'behind by 7.89 points'
    assert headline._cifar10_long()[0]['difference'] == '-7.89'
    with pytest.raises(ValueError, match="no rows of config 'vit_p8'"):
        headline._gap(str(folder / 'points.csv'), 'tokenformer_p4', 'vit_p8')


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
    headline = _tool('headline')
    monkeypatch.setattr(headline, 'ROOT', str(tmp_path))
    (tmp_path / 'points.csv').write_text('config,seed,machine,commit\nmlp,0,Xeon,b\nmlp,1,Xeon,b\nvit,0,EPYC,a\n'
                                         'same,0,EPYC,a\n')
    assert headline._apart('points.csv', 'mlp', 'vit') == "; its seeds ran on other CPUs and other code than the ViT's"
    assert headline._apart('points.csv', 'same', 'vit') == ''
    # one CPU written two ways (by the run, with its threads, and from its page) is the same CPU, as for the marker
    (tmp_path / 'points.csv').write_text('config,seed,machine,commit\n'
                                         'mlp,0,"AMD EPYC, 2 cores, torch 2.14.1, 1 threads",a\n'
                                         'vit,0,2-core AMD EPYC VM (as its page says),a\n')
    assert headline._apart('points.csv', 'mlp', 'vit') == ''


def _planted_compare(tmp_path, left: list, right: list, **columns) -> str:
    """``render_compare`` of two planted points files: ``left`` and ``right`` one top-1 per seed, ``columns``
    (``machine=('a', 'b')``) a value per side."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    import render_docs
    path = tmp_path / 'points.csv'
    names = sorted(columns)
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['side', 'seed', 'top1', *names])
        for side, values in (('a', left), ('b', right)):
            writer.writerows([side, seed, v, *(columns[n][side == 'b'] for n in names)]
                             for seed, v in enumerate(values))
    relative = os.path.relpath(path, ROOT)
    return render_docs.render_compare(f'{relative}?side=a vs {relative}?side=b | top1 | points')


def test_a_comparison_takes_its_verb_from_the_interval_and_says_when_its_sides_ran_apart(tmp_path):
    """The compare marker: no "ahead" or "behind" unless the 95% interval (Welch, the project's rule in
    tkvision/experiments/intervals.py) excludes 0, checked against the closed form; a pair from two machines or two commits
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
    # the same CPU, one row recorded by the run and one filled from its page, other threads: not "different CPUs"
    same = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2],
                            machine=('AMD EPYC, 2 cores, torch 2.14.1+cu130, 1 threads',
                                     '2-core AMD EPYC VM (as its page says)'))
    assert 'different CPUs' not in same
    other = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2],
                             machine=('AMD EPYC, 2 cores, torch 2.14.1+cu130, 1 threads',
                                      '2-core Intel Xeon VM (as its page says)'))
    assert other.endswith('(on different CPUs)')
    both = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2], machine=('AMD EPYC', 'Intel Xeon'),
                            commit=('abc1234', 'def5678'))
    assert both.endswith('3 and 3 seeds) (on different CPUs, different code)')
    # two rows filled in after their runs, written at other commits: the code that ran them is not known either way
    backfilled = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2],
                                  commit=('unknown (row written at abc1234)', 'unknown (row written at def5678)'))
    assert backfilled.endswith('3 and 3 seeds) (code not recorded)')
    half = _planted_compare(tmp_path, [85.1, 85.2, 85.3], [84.0, 84.1, 84.2], machine=('AMD EPYC', 'unknown'),
                            commit=('abc1234', 'unknown (row written at abc1234)'))
    assert half.endswith('3 and 3 seeds) (CPUs and code not recorded)')


def test_a_row_filled_in_after_its_run_says_so_in_its_commit():
    """A points row whose machine was not recorded by its run ("unknown", or typed "(as its page says)") holds a
    commit that is not the run's either: its cell says ``unknown (row written at <commit>)``, so no reader (nor the
    compare marker) takes the commit that wrote the row for the code that ran it (docs/comparison.md)."""
    paths = sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*points*.csv'), recursive=True))
    filled = []
    for path in paths:
        with open(path, encoding='utf-8') as f:
            for row in csv.DictReader(f):
                machine = row.get('machine') or 'unknown'
                if machine == 'unknown' or '(as its page says)' in machine:
                    filled.append((os.path.relpath(path, ROOT), row.get('config'), row.get('seed'), row['commit']))
    assert len(filled) >= 90  # docs/comparison's three files
    wrong = [row for row in filled if not re.fullmatch(r'unknown \(row written at [0-9a-f]{7,40}\)', row[3])]
    assert not wrong, wrong


def test_the_growth_chains_wall_clock_is_the_ratio_of_the_kept_minutes():
    """docs/growth/chains.csv's wall clock is each chain's mean final minutes (chains_curves.csv) over the mean
    minutes of the 16-token runs trained beside it (chains_scratch.csv), and those runs end at the size report's
    top-1 to the digit, as docs/growth.md says."""
    import statistics
    read = lambda name: list(csv.DictReader(open(os.path.join(ROOT, 'docs', 'growth', name), encoding='utf-8')))
    scratch = read('chains_scratch.csv')
    assert len(scratch) == 3 and all(r['top1'] == r['size_report_top1'] for r in scratch)
    denominator = statistics.mean(float(r['minutes']) for r in scratch)
    curves = read('chains_curves.csv')
    for row in read('chains.csv'):
        last = max(int(r['epoch']) for r in curves if r['arm'] == row['arm'])
        finals = [float(r['minutes']) for r in curves if r['arm'] == row['arm'] and int(r['epoch']) == last]
        assert float(row['wall_vs_largest']) == round(statistics.mean(finals) / denominator, 3), row['arm']


def test_every_comparative_word_typed_by_hand_is_listed_by_its_context():
    """Outside a compare marker (whose verb its 95% interval gives), each comparative word in the README, DEVELOPERS.md,
    a hand-written page under docs/ or a config's comments is listed in tests/typed_words.csv by the words around it,
    with the interval, table or rule that supports it; a listed context no longer on its page is reported too."""
    from .typed_words import listed, loose_words, word_documents
    loose, stale = loose_words(word_documents(), listed())
    assert loose == [], 'a comparative word typed by hand: use a compare marker, or list it with its source\n' + \
        '\n'.join(loose)
    assert stale == [], 'listed contexts no longer on their page: remove the rows\n' + '\n'.join(stale)
    assert [r for r in listed() if not r['source'].strip()] == []


#: Each comparative form the word check must catch, as a planted sentence (the word it must report).
PLANTED_WORDS = [
    ('The planted arm is better than the reference.', 'better'),
    ('The planted arm beats the reference.', 'beats'),
    ('The planted arm is ahead of the reference.', 'ahead'),
    ('The planted arm trails the reference.', 'trails'),
    ('The planted arm is level with the reference.', 'is level'),
    ('The planted arm holds up at 16 patches.', 'holds up'),
    ('In the planted run the paper\'s order holds.', 'holds'),
    ('The planted arm scores lower on test.', 'lower'),
    ('The planted arm matches the reference.', 'matches'),
]


@pytest.mark.parametrize('where', ['README.md', 'docs/comparison.md', 'DEVELOPERS.md',
                                   'tkvision/configs/fashion_mnist/long.yaml'])
def test_each_planted_comparative_word_is_caught(where):
    """Each planted verdict is reported on the README, a results page, DEVELOPERS.md and a config's comments; the same
    word inside a compare marker or in code is not."""
    from .typed_words import listed, loose_words, word_documents
    docs, rows = word_documents(), listed()
    for sentence, word in PLANTED_WORDS:
        planted = dict(docs, **{where: docs[where] + '\n\n' + sentence + '\n'})
        loose, _ = loose_words(planted, rows)
        assert [line.split(' in "')[0] for line in loose] == [f'{where}: {word}'], (sentence, loose)
    inside = ('<!-- compare docs/comparison/points.csv?config=a vs docs/comparison/points.csv?config=b | top1 | points '
              '-->ahead by 1.00 points<!-- end --> and `best.safetensors`\n')
    assert loose_words(dict(docs, **{where: docs[where] + '\n' + inside}), rows)[0] == []
