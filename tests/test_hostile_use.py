"""Hostile use, round three: each probe run through the command a user runs (its ``main(argv)``, or the
process), ending in the right outcome or one line on stderr naming the key, file or value and what to do
(exit 2), never a traceback for a user's mistake, never a file lost."""
import os
import subprocess
import sys

import pytest
import torch

from tkvision.cli.train import train_main, validate_main
from tkvision.cli.weights import export_main, grow_main, mae_visualize_main
from tkvision.engine import rundir

from .helpers import ROOT, TINY_FMNIST

TINY = "{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 32, depth: 2, num_heads: 2, num_tokens: 16}"
COMMON = ['--model_kwargs', TINY, '--rrc_scale', 'null', '--epochs', '1', '--batch_size', '64', '--train_subset', '256',
          '--val_subset', '128', '--threads', '1', '--progress', 'false']


def _one_line_error(capsys, code: int, *words):
    """The command returned 2 and its last line on stderr is the error, holding ``words``: no traceback (an
    argument argparse refuses is its usage, then the one error line)."""
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and 'Traceback' not in err and lines and 'error:' in lines[-1], err
    for word in words:
        assert word in lines[-1], (word, err)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """A finished classifier run and a finished MAE run (tiny, 256 Fashion-MNIST images)."""
    root = tmp_path_factory.mktemp('runs')
    assert train_main(['--output', str(root / 'run'), *COMMON]) == 0
    assert train_main(['--output', str(root / 'mae'), '--task', 'mae', '--decoder',
                       '{embed_dim: 32, depth: 1, num_heads: 2}', *COMMON]) == 0
    return root


def _listing(folder) -> dict:
    return {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}


def test_export_force_never_removes_a_run_or_a_live_runs_files(runs, tmp_path, capsys):
    """``--force`` onto the checkpoint's own run folder deleted the run; onto a folder where a run is training
    it deleted its config, lock and checkpoint. Now it replaces an earlier export only, and names what it
    refuses to touch."""
    run = runs / 'run'
    before = _listing(run)
    code = export_main(['--checkpoint', str(run / 'last.pth'), '--out', str(run), '--force'])
    _one_line_error(capsys, code, 'holds files an export did not write', 'last.pth', 'never a run')
    assert _listing(run) == before
    live = tmp_path / 'live'
    lock = rundir.claim_output_dir(str(live), resume=False)  # a run holds the folder
    try:
        (live / 'config.yaml').write_text('model: x\n')
        code = export_main(['--checkpoint', str(run / 'last.pth'), '--out', str(live), '--force'])
        _one_line_error(capsys, code, '.lock', 'config.yaml')
        assert sorted(os.listdir(live)) == ['.lock', 'config.yaml']
    finally:
        lock.release()
    out = tmp_path / 'export'
    assert export_main(['--checkpoint', str(run / 'last.pth'), '--out', str(out)]) == 0
    assert export_main(['--checkpoint', str(run / 'last.pth'), '--out', str(out), '--force', '--no-ema']) == 0
    assert sorted(os.listdir(out)) == ['config.json', 'model.safetensors']


def test_export_force_onto_a_link_to_an_earlier_export_replaces_it_through_the_link(runs, tmp_path):
    """``--force`` onto a symbolic link to an earlier export failed with "Is a directory ... .old" and left an
    empty ``.old`` folder. Now the export the link points to is replaced, the link stays, nothing is left over."""
    first = tmp_path / 'export_v1'
    assert export_main(['--checkpoint', str(runs / 'run' / 'last.pth'), '--out', str(first)]) == 0
    (first / 'model.safetensors').write_bytes(b'stale')  # so that the replacement can be told from the original
    link = tmp_path / 'latest'
    link.symlink_to(first, target_is_directory=True)
    assert export_main(['--checkpoint', str(runs / 'run' / 'last.pth'), '--out', str(link), '--force']) == 0
    assert link.is_symlink() and os.path.realpath(link) == str(first)
    assert (first / 'model.safetensors').stat().st_size > 1000 and (first / 'config.json').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['export_v1', 'latest']  # no .old, no .tmp


@pytest.mark.parametrize('key, value, words', [
    ('--naflex_max_seq_len', '1000000', ['naflex_max_seq_len', 'GiB', 'lower naflex_max_seq_len or batch_size']),
    ('--naflex_train_seq_lens', '[100000]', ['naflex_train_seq_lens', 'at 100000 patches', 'GiB']),
])
def test_naflex_lengths_that_cannot_fit_in_memory_are_refused_before_any_work(tmp_path, capsys, key, value, words):
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--model', 'naflexvit_tokenformer_ti16',
                       '--naflex_loader', 'true', key, value])
    _one_line_error(capsys, code, *words)
    assert not (tmp_path / 'r' / 'last.pth').exists()


def test_naflex_loader_skips_and_counts_unreadable_images_in_training_and_evaluation(tmp_path):
    """One unreadable validation image crashed the run at its first evaluation, and unreadable training
    images were skipped uncounted; both are now skipped and counted, as every other format does."""
    from tkvision.engine.trainer import train

    from .helpers import fmnist_cfg, make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'folder', classes=2, train_per_class=16, val_per_class=4, size=28)
    for split in ('train', 'val'):
        (tmp_path / 'folder' / split / 'n00000000' / 'broken.JPEG').write_bytes(b'\xff\xd8 not a jpeg')
    cfg = fmnist_cfg(tmp_path, dataset='folder', data_dir=root, model='naflexvit_tokenformer_ti16',
                     model_kwargs=dict(TINY_FMNIST, in_chans=3, num_classes=2), naflex_loader=True,
                     naflex_train_seq_lens=[9, 16], naflex_max_seq_len=16, train_subset=None, val_subset=None,
                     batch_size=8, epochs=1, img_size=28)
    row = train(cfg)['history'][-1]
    assert int(row['skipped']) == 1 and int(row['val_skipped']) == 1


@pytest.mark.parametrize('override, words', [
    (['--model_kwargs', "{learn_tau: maybe}"], ['learn_tau must be true or false', "'maybe'"]),
    (['--model_ema', 'maybe'], ["model_ema must be true or false, got 'maybe'"]),
    (['--parameter_token_weight_decay', '.inf'], ['parameter_token_weight_decay must be a number >= 0', 'inf']),
    (['--model_kwargs', '{key_std: -0.1}'], ['key_std must be a number > 0', '-0.1']),
    (['--model_kwargs', '{key_std: .nan}'], ['key_std must be a finite number', 'nan']),
    (['--model', 'ringformer_vit_small_patch16_224', '--model_kwargs', '{embed_dim: 0, img_size: 28, in_chans: 1}'],
     ['embed_dim must be a number > 0']),
    (['--model', 'ringformer_vit_small_patch16_224', '--model_kwargs', '{rank: 0, img_size: 28, in_chans: 1}'],
     ['rank must be an integer >= 1']),
    (['--lr', '[1'], ["--lr: the value '[1' is not YAML this config reads", "expected ',' or ']'"]),  # yaml traceback
    (['--lr', '!!python/object/apply:os.system ["touch pwned"]'], ['--lr: the value', 'could not determine a constructor',
                                                                  "no '!!' tags"]),
    (['--dist_timeout_minutes', '1e12'], ['dist_timeout_minutes must be a number >= 0.1 and <= 10080']),
    (['--dist_timeout_minutes', '1e-9'], ['dist_timeout_minutes must be a number >= 0.1']),
])
def test_values_that_could_only_fail_later_are_refused_naming_the_key(tmp_path, capsys, override, words):
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, *override])
    _one_line_error(capsys, code, *words)


def test_a_one_channel_model_on_rgb_images_is_refused_before_any_work(tmp_path, capsys):
    """``--dataset imagenet`` (a folder of RGB JPEGs) with the 1-channel Fashion-MNIST model: a raw conv RuntimeError
    at the first batch; now one line naming in_chans."""
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'folder', classes=2, train_per_class=4, val_per_class=2, size=28)
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--dataset', 'imagenet', '--data-dir', root,
                       '--img_size', '28', '--train_subset', 'null', '--val_subset', 'null'])
    _one_line_error(capsys, code, 'dataset imagenet gives RGB images (3 channels)', 'in_chans: 3')


def test_a_typed_config_built_in_python_gets_the_errors_a_yaml_file_gets(tmp_path):
    """``train(TrainConfig(data=OptimConfig()))`` or ``data={'batch_size': 64}``: ``KeyError: 'dataset'``;
    ``train({'lr': 1e-3})``: ``KeyError: 'task'``. A wrong section is named; a partial mapping is read as a YAML
    file of those keys (the defaults fill the rest) and a bad key in it is named."""
    from tkvision.engine.config import TrainConfig, resolve_run_config
    from tkvision.engine.optim import OptimConfig
    from tkvision.utils.errors import ConfigError
    for data in (OptimConfig(), {'batch_size': 64}):
        with pytest.raises(ConfigError, match=r'TrainConfig\(data=...\) must be a DataConfig, got a '):
            resolve_run_config(TrainConfig(data=data))
    assert resolve_run_config({'lr': 1e-3}).optim.lr == 1e-3
    with pytest.raises(ConfigError, match="unknown config key 'lrr' in the config mapping"):
        resolve_run_config({'lrr': 1e-3})  # the message names where: the config mapping


def test_the_weights_commands_answer_user_errors_in_one_line(runs, tmp_path, capsys):
    weights = str(runs / 'run' / 'best.safetensors')
    code = grow_main(['--checkpoint', weights, '--model', 'tokenformer_vit_ti16', '--model-kwargs', TINY,
                      '--add-qkv', '-4', '--out', str(tmp_path / 'g.safetensors')])
    _one_line_error(capsys, code, '--add-qkv', 'expected an integer >= 0, got -4')
    code = grow_main(['--checkpoint', weights, '--model', 'no_such_model', '--add-qkv', '4',
                      '--out', str(tmp_path / 'g.safetensors')])
    _one_line_error(capsys, code, "unknown model 'no_such_model'")
    code = export_main(['--checkpoint', str(runs / 'mae' / 'last.pth'), '--out', str(tmp_path / 'e1')])
    _one_line_error(capsys, code, 'masked-autoencoder checkpoint', 'fine-tune it first')
    code = export_main(['--checkpoint', str(runs / 'run' / 'last.pth'), '--out', str(tmp_path / 'e2'),
                        '--model-kwargs', '[1]'])
    _one_line_error(capsys, code, '--model-kwargs', 'expected a YAML mapping')
    code = validate_main(['--checkpoint', str(runs / 'mae' / 'last.pth')])  # its task's evaluation, not an error
    assert code == 0 and '(masked autoencoder) on 128 val images: reconstruction loss' in capsys.readouterr().out
    code = mae_visualize_main(['--checkpoint', str(runs / 'mae' / 'last.pth'), '--num-images', '0',
                               '--out', str(tmp_path / 'x.png')])
    _one_line_error(capsys, code, '--num-images', 'expected an integer >= 1, got 0')


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_no_folder(runs, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')
    monkeypatch.setattr(safetensors.torch, 'save_file', full)
    monkeypatch.setattr('tkvision.engine.checkpoint.save_file', full)
    code = export_main(['--checkpoint', str(runs / 'run' / 'last.pth'), '--out', str(tmp_path / 'e')])
    assert code == 2 and 'Traceback' not in capsys.readouterr().err
    assert not (tmp_path / 'e').exists()


def test_training_on_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    """safetensors reports a full disk as its own error (a traceback); the trainer says it in one line, and the
    ``last.pth`` written before it is intact."""
    from safetensors import SafetensorError

    from tkvision.engine import checkpoint
    real, calls = checkpoint.save_file, []

    def fills_up(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # the first epoch's best and last weights go through; the second epoch's do not
            raise SafetensorError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
        return real(*args, **kwargs)
    monkeypatch.setattr(checkpoint, 'save_file', fills_up)
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--epochs', '2'])
    _one_line_error(capsys, code, 'No space left on the device', 'safetensors')
    state = checkpoint.load_training_checkpoint(str(tmp_path / 'r' / 'last.pth'))
    assert state['epochs_done'] >= 1


def test_a_nan_loss_is_one_line_naming_the_updates_and_what_to_try(tmp_path, capsys, monkeypatch):
    from timm.loss import LabelSmoothingCrossEntropy
    real = LabelSmoothingCrossEntropy.forward
    monkeypatch.setattr(LabelSmoothingCrossEntropy, 'forward', lambda self, x, t: real(self, x, t) * float('nan'))
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON])
    _one_line_error(capsys, code, 'NaN or infinite between updates 1 and 4', 'Try a lower lr')


def test_a_refused_pickle_is_one_line_in_every_command_that_reads_it(runs, tmp_path, capsys):
    """A ``.pth`` holding code is never unpickled: before, 27-33 lines of traceback; now one line naming the
    file and how to convert one the user trusts."""
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ('echo pwned',))
    evil = tmp_path / 'evil' / 'last.pth'
    evil.parent.mkdir()
    torch.save({'model': {}, 'config': {}, 'hook': os.system}, evil)
    raw = tmp_path / 'raw' / 'last.pth'  # a plain pickle, not torch's zip format: it read as "truncated" before
    raw.parent.mkdir()
    raw.write_bytes(pickle.dumps({'model': Evil(), 'config': {}}))
    for path in (evil, raw):
        commands = [(train_main, ['--output', str(path.parent), '--resume', str(path)]),
                    (validate_main, ['--checkpoint', str(path)]),
                    (export_main, ['--checkpoint', str(path), '--out', str(tmp_path / 'e')]),
                    (mae_visualize_main, ['--checkpoint', str(path), '--out', str(tmp_path / 'x.png')]),
                    (grow_main, ['--checkpoint', str(path), '--model', 'tokenformer_vit_ti16', '--to',
                                 'tokenformer_vit_s16', '--out', str(tmp_path / 'g.safetensors')])]
        for main, argv in commands:  # one wording everywhere (timm's loader words its refusal otherwise)
            _one_line_error(capsys, main(argv), str(path), 'holds pickled Python objects', 'was not loaded',
                            'weights_only=False')


@pytest.mark.parametrize('args, words', [
    (['--models', 'no_such_model'], ["unknown model 'no_such_model'"]),
    (['--batch-size', '0'], ['--batch-size', 'expected an integer >= 1, got 0']),
    (['--batch-size', '-3'], ['--batch-size', 'expected an integer >= 1, got -3']),
    (['--steps', '0'], ['--steps', 'expected an integer >= 1, got 0']),
    (['--device', 'cuda'], ['--device', 'no CUDA device here']),
])
def test_the_benchmark_refuses_bad_arguments_in_one_line(args, words):
    res = subprocess.run([sys.executable, 'tools/benchmark.py', '--models', 'tokenformer_vit_ti16', *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 2 and 'Traceback' not in res.stderr and all(w in res.stderr for w in words), res.stderr


@pytest.mark.slow
def test_the_studies_and_developer_tools_answer_bad_input_in_one_line(tmp_path):
    """The GPU report on a device it does not know, the comparison on an empty run folder or a malformed points
    file, and the docs renderer on a corrupt results file: each names the argument or file."""
    def run(*args):
        res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
        return res.stderr
    assert "--device: invalid choice: 'tpu'" in run('-m', 'studies.performance.gpu_report', '--device', 'tpu')
    configs = 'studies/comparison/configs/*.yaml'
    assert 'no finished point' in run('-m', 'studies.comparison.comparison', configs, '--report-only', '--out',
                                      str(tmp_path / 'none'), '--report-dir', str(tmp_path / 'rep'))
    bad = tmp_path / 'points.csv'
    bad.write_text('a,b\n1,2\n')
    assert f'{bad} is not a points file' in run('-m', 'studies.comparison.comparison', configs, '--from-points',
                                                str(bad), '--report-dir', str(tmp_path / 'rep'))
    # each was a traceback: a negative score shape, a twins file that is not UTF-8, an empty metrics file
    assert "--score-shape: expected an integer >= 1, got -4" in run('-m', 'studies.performance.layer_benchmark',
                                                                    '--parts', 'score_norm', '--score-shape', '-4', '0')
    latin = tmp_path / 'twins.csv'
    latin.write_bytes('config,top1\nn\xe9e,1\n'.encode('latin-1'))
    assert f'--twins {latin} is not a UTF-8 CSV file' in run('-m', 'studies.elastic.elastic_study', 'report-long',
                                                              '--twins', str(latin), '--no-speed')



def test_every_study_answers_a_user_error_in_one_line(tmp_path):
    """Every study's command (``python -m studies.<study>.<module>``) runs under the trainer's rule: the
    elastic report on a folder with no finished run names the folder and what to run, in one line, exit 2
    (it was a ``min()`` traceback); and each study module's command goes through ``run_cli``, so a sweep
    stopped by SIGTERM says how to resume instead of printing the ``Preempted`` traceback."""
    import ast
    import glob
    res = subprocess.run([sys.executable, '-m', 'studies.elastic.elastic_study', 'report', '--runs',
                          str(tmp_path / 'none'), '--report-dir', str(tmp_path / 'rep'), '--no-speed'],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
    assert f'--runs {tmp_path / "none"}: no finished run' in res.stderr and 'train' in res.stderr
    for path in glob.glob(f'{ROOT}/studies/*/*.py'):
        tree = ast.parse(open(path).read())
        entry = [node for node in tree.body
                 if isinstance(node, ast.If) and "__name__ == '__main__'" in ast.unparse(node.test)]
        mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == 'main']
        calls = {n.func.id for node in entry + mains for n in ast.walk(node)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not entry or 'run_cli' in calls, f'{path}: its command does not go through tkvision.cli.run_cli'

def test_the_elastic_study_names_a_cut_metrics_file_and_fails_when_every_point_failed(tmp_path):
    """``report`` on a finished run whose ``metrics.csv`` is empty was an IndexError; ``train`` whose every point
    failed exited 0."""
    runs = tmp_path / 'runs'
    point = runs / 'elastic' / 'seed0'
    point.mkdir(parents=True)
    (point / 'result.json').write_text('{}')
    (point / 'metrics.csv').write_text('')
    res = subprocess.run([sys.executable, '-m', 'studies.elastic.elastic_study', 'report', '--runs', str(runs),
                          '--seeds', '0', '--report-dir', str(tmp_path / 'rep'), '--no-speed'], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
    assert f"{point / 'metrics.csv'} holds no epoch" in res.stderr and 'rerun the point' in res.stderr
    bad = tmp_path / 'bad.yaml'
    bad.write_text('model: no_such_model\nepochs: 1\n')
    res = subprocess.run([sys.executable, '-m', 'studies.elastic.elastic_study', 'train', '--configs', str(bad),
                          '--seeds', '0', '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True, text=True)
    last = res.stderr.strip().splitlines()[-1]  # the sweep logs each failed point's traceback, then this line
    assert res.returncode == 2 and last.startswith('error: every point failed (1): bad seed 0'), res.stderr


def test_the_docs_renderer_names_a_corrupt_results_file(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location('render_docs', f'{ROOT}/tools/render_docs.py')
    render_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_docs)
    corrupt = tmp_path / 'results.json'
    corrupt.write_text('{"rows": [')
    with pytest.raises(render_docs.SpecError, match=f'{corrupt} is not readable'):
        render_docs.update(f'<!-- table {corrupt}#rows | a={{a}} -->\n<!-- end table -->\n', 'page.md')
    wrong = tmp_path / 'wrong.json'  # a field of the wrong type: a traceback before
    for content, found in (('{"models": "notalist"}', 'str'), ('{"models": [1, {"a": 2}]}', 'a list holding int')):
        wrong.write_text(content)
        with pytest.raises(render_docs.SpecError, match=f'page.md:1: {wrong}#models holds {found} where the table needs '
                                                        'a list of rows'):
            render_docs.update(f'<!-- table {wrong}#models | a={{a}} -->\n<!-- end table -->\n', 'page.md')


def test_a_hugging_face_split_with_a_class_train_lacks_is_named(tmp_path, capsys):
    import io

    import datasets
    from PIL import Image

    from tkvision.data import load_fashion_mnist
    images, labels = load_fashion_mnist('train')
    for split, names in (('train', ['a', 'b', 'c']), ('validation', ['a', 'b', 'c', 'd'])):
        rows = dict(image=[], label=[])
        for i in range(3000):
            if labels[i] < len(names) and len(rows['label']) < 40:
                buffer = io.BytesIO()
                Image.fromarray(images[i]).convert('RGB').save(buffer, format='JPEG')
                rows['image'].append(dict(bytes=buffer.getvalue(), path=None))
                rows['label'].append(int(labels[i]))
        features = datasets.Features(image=datasets.Image(), label=datasets.ClassLabel(names=names))
        (tmp_path / 'hf' / 'data').mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / 'hf' / 'data' /
                                                                            f'{split}-00000.parquet'))
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--dataset', f"hfds/{tmp_path / 'hf'}",
                       '--model_kwargs', TINY.replace('in_chans: 1', 'in_chans: 3'), '--train_subset', 'null',
                       '--val_subset', 'null', '--batch_size', '8'])
    _one_line_error(capsys, code, '(train and validation)', "only in val: ['class 3 (unnamed)']")


def test_a_truncated_config_json_of_a_local_dir_export_is_named(runs, tmp_path):
    from tkvision.engine.build import create_model
    from tkvision.utils.errors import ConfigError
    out = tmp_path / 'export'
    assert export_main(['--checkpoint', str(runs / 'run' / 'last.pth'), '--out', str(out)]) == 0
    text = (out / 'config.json').read_text()
    for cut in (text[:len(text) // 2], ''):  # truncated, and empty
        (out / 'config.json').write_text(cut)
        with pytest.raises(ConfigError, match=f"{out}/config.json is not valid JSON .*export the model again"):
            create_model(f'local-dir:{out}', pretrained=True)


@pytest.mark.parametrize('mask, file_mode, folder_mode', [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_every_file_a_run_and_an_export_write_follows_the_umask(runs, tmp_path, mask, file_mode, folder_mode):
    """One policy (tkvision/utils/files.py): files 0666 and folders 0777 less the umask. Before, a run's files
    were 0600 (the temporary files' mode), its curves and lock 0644 and an export folder 0700."""
    old = os.umask(mask)
    try:
        assert train_main(['--output', str(tmp_path / 'run'), *COMMON]) == 0
        assert export_main(['--checkpoint', str(tmp_path / 'run' / 'last.pth'), '--out', str(tmp_path / 'e')]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [*(tmp_path / 'run').iterdir(), *(tmp_path / 'e').iterdir()]}
    assert set(modes.values()) == {file_mode}, {k: oct(v) for k, v in modes.items()}
    assert {(tmp_path / 'run').stat().st_mode & 0o777, (tmp_path / 'e').stat().st_mode & 0o777} == {folder_mode}


def test_the_last_line_gives_the_test_top1_of_the_file_it_names_first(tmp_path, capsys):
    """With EMA on, the trainer printed the raw weights' test top-1 and then named ``best.safetensors``, which
    held the EMA weights: validating the named file gave a figure never on screen. Now the figure printed
    beside ``best.safetensors`` is the one ``tkvision-validate --split test`` reproduces from it."""
    import re
    out = tmp_path / 'ema'
    args = ['--output', str(out), *COMMON, '--epochs', '2', '--model_ema', 'true', '--model_ema_decay', '0.9']
    assert train_main(args) == 0
    printed = capsys.readouterr().out
    match = re.search(r'test top-1 (\d+\.\d\d)% of best\.safetensors \((EMA|raw) weights of epoch (\d)', printed)
    assert match and 'last raw weights' in printed and 'last EMA weights' in printed, printed
    assert validate_main(['--checkpoint', str(out / 'best.safetensors'), '--config', str(out / 'config.yaml'),
                          '--split', 'test', '--no-ema']) == 0
    validated = re.search(r'top-1 (\d+\.\d\d)%', capsys.readouterr().out)
    assert validated.group(1) == match.group(1)


def test_naflex_lengths_are_checked_counting_the_mask_and_the_scores_a_cpu_keeps(tmp_path, capsys):
    """At ``naflex_max_seq_len 5000`` the check passed (it counted one copy of the attention scores and no mask)
    and the run died seconds later in an allocator traceback; on this 24 GiB machine it is refused up front."""
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--model', 'naflexvit_tokenformer_ti16',
                       '--naflex_loader', 'true', '--naflex_max_seq_len', '5000'])
    _one_line_error(capsys, code, 'naflex_max_seq_len', 'attention mask', 'scores and probabilities',
                    'lower naflex_max_seq_len or batch_size')


def test_the_memory_a_process_may_use_is_what_its_limits_leave(tmp_path):
    """``ulimit -v`` (an address-space limit, as a cluster's job limits set) bounds what the NaFlex check and the
    benchmark count as available, not only the machine's free memory."""
    code = ('import resource; from tkvision.utils.memory import available_memory_bytes\n'
            'vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024\n'
            'resource.setrlimit(resource.RLIMIT_AS, (vm + 2 ** 30, resource.RLIM_INFINITY))\n'
            'print(available_memory_bytes("cpu") / 2 ** 30)')
    res = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and 0 < float(res.stdout) <= 1.0, res.stderr


def test_a_batch_that_does_not_fit_is_one_line_naming_batch_size(tmp_path, capsys, monkeypatch):
    """A ``batch_size`` too large for the machine ended in a raw allocator traceback at the first step; now one
    line names the key to lower, and a failure of another kind still propagates as it is."""
    from tkvision.engine import loop

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                           'tried to allocate 94371840000 bytes. Error code 12 (Cannot allocate memory)')
    monkeypatch.setattr(loop, '_forward_backward', no_memory)
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON])
    _one_line_error(capsys, code, 'batch_size 64 ran out of memory on cpu', "can't allocate memory", 'lower batch_size')
    monkeypatch.setattr(loop, '_forward_backward', lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        train_main(['--output', str(tmp_path / 'r2'), *COMMON])


def test_a_listing_read_by_head_ends_quietly():
    """``tkvision-train --list-recipes | head``: the lines, then a ``BrokenPipeError`` traceback and exit 1. The
    listing now ends quietly when its reader closes the pipe."""
    tool = os.path.join(os.path.dirname(sys.executable), 'tkvision-train')
    result = subprocess.run(f'{tool} --list-recipes | head -n 1; echo "status ${{PIPESTATUS[0]}}"', shell=True,
                            executable='/bin/bash', capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == 'status 0' and len(result.stdout.splitlines()) == 2, result.stdout
    assert result.stderr == '', result.stderr


@pytest.mark.parametrize('message', [
    '[enforce fail at inline_container.cc:664] . unexpected pos 2048 vs 1967\n'
    'PytorchStreamWriter failed writing file data/0: file write failed',
    '[enforce fail at inline_container.cc:672] . unexpected pos 39104 vs 38996',  # torch 2.14.1 on a full tmpfs
])
def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_keeps_the_previous(tmp_path, capsys, monkeypatch,
                                                                                    message):
    """torch's writer reports a full disk as two chained tracebacks of its own, in either of its words (the second
    is what a real 200 KiB tmpfs gave, with no "write" in it); the trainer says it in one line naming the file and
    what to do, and the ``last.pth`` of the first epoch is intact."""
    import torch

    from tkvision.engine import checkpoint
    real, calls = torch.save, []

    def fills_up(obj, path, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the first epoch's checkpoint goes through; the second's does not
            try:
                raise OSError(28, 'No space left on device')
            except OSError:
                raise RuntimeError(message)
        return real(obj, path, *args, **kwargs)
    monkeypatch.setattr(checkpoint.torch, 'save', fills_up)
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, '--epochs', '2'])
    _one_line_error(capsys, code, 'last.pth', message.splitlines()[-1][:60], 'previous checkpoint is kept')
    assert checkpoint.load_training_checkpoint(str(tmp_path / 'r' / 'last.pth'))['epochs_done'] == 1


def test_a_full_disk_at_the_first_checkpoint_says_how_to_start_again(tmp_path, capsys, monkeypatch):
    """A full disk at the first ``last.pth`` (a 200 KiB tmpfs gave torch's "unexpected pos"): the message does not
    promise a previous checkpoint, and the same command again, with or without ``--resume``, says that the folder
    holds a run that stopped before its first checkpoint and what to do (it used to advise ``--resume``, which then
    said only "nothing to resume"); once the files are removed, it trains."""
    import shutil

    import torch

    from tkvision.engine import checkpoint

    real = torch.save

    def full(obj, path, *args, **kwargs):
        raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 39104 vs 38996')
    monkeypatch.setattr(checkpoint.torch, 'save', full)
    out = str(tmp_path / 'r')
    _one_line_error(capsys, train_main(['--output', out, *COMMON]), 'last.pth', 'no checkpoint was written yet',
                    'run the same command again')
    monkeypatch.setattr(checkpoint.torch, 'save', real)
    _one_line_error(capsys, train_main(['--output', out, *COMMON]), 'stopped before its first checkpoint',
                    'remove them')
    _one_line_error(capsys, train_main(['--output', out, *COMMON, '--resume']), 'nothing to resume',
                    'stopped before its first one', 'remove its files')
    shutil.rmtree(out)
    assert train_main(['--output', out, *COMMON]) == 0


@pytest.mark.parametrize('args, words', [
    (['--growth', '5'], 'growth must be a mapping'),
    (['--decoder', 'abc'], 'decoder must be a mapping'),
    (['--opt', 'abc'], 'opt must be a timm optimizer name'),
    (['--auto_augment', 'abc'], 'auto_augment must be a timm RandAugment string'),
    (['--mean', '[0.5, 0.5]'], 'mean has 2 value(s)'),
    (['--device', 'meta'], "device must be 'cpu', 'cuda', 'cuda:N' or null"),
    (['--device', 'mps'], "device must be 'cpu', 'cuda', 'cuda:N' or null"),
    (['--device', 'xla'], "device must be 'cpu', 'cuda', 'cuda:N' or null"),
    (['--device', 'garbage'], "device must be 'cpu', 'cuda', 'cuda:N' or null"),
    (['--device', 'cuda:-1'], "device must be 'cpu', 'cuda', 'cuda:N' or null"),
    (['--device', 'cuda'], 'device cuda: no CUDA device here; set device: cpu'),
    (['--growth.new_token_lr_scale', '1e30'], 'growth.new_token_lr_scale must be a number > 0 and <= 100'),
    (['--global_batch_size', '512'], 'lower global_batch_size or raise train_subset'),
])
def test_a_setting_the_trainer_cannot_use_is_one_line_before_any_work(tmp_path, capsys, args, words):
    """Each failed late, in timm or torch, or as a TypeError, or gave advice that did not help; each is one line
    naming the key, before any work (nothing written)."""
    code = train_main(['--output', str(tmp_path / 'r'), *COMMON, *args])
    _one_line_error(capsys, code, words)
    assert not os.path.exists(tmp_path / 'r' / 'last.pth')


def test_a_data_source_is_registered_under_a_name_and_gives_a_dataset(tmp_path):
    from tkvision.data.registry import _SOURCES, DataSource, register_data_source
    from tkvision.engine.config import load_config
    from tkvision.engine.trainer import train
    from tkvision.utils.errors import UsageError
    for name in (None, 123, '', 'a/b'):
        with pytest.raises(ValueError, match='non-empty name'):
            register_data_source(name, DataSource(lambda *a: None))
    register_data_source('nothing', DataSource(lambda *a: None, needs_data_dir=False, num_classes=10, channels=1,
                                               image_settings=dict(img_size=28, mean=[0.5], std=[0.5], crop_pct=1.0,
                                                                   interpolation='bicubic')))
    try:
        cfg = load_config(None, dict(dataset='nothing', output=str(tmp_path / 'r'), threads=1, rrc_scale=None,
                                     model_kwargs=TINY_FMNIST))
        with pytest.raises(UsageError, match="dataset 'nothing' gave no dataset for its 'train' split"):
            train(cfg)
    finally:
        _SOURCES.pop('nothing')


def test_resuming_a_finished_run_leaves_its_files_as_they_are(tmp_path, capsys):
    """``--resume`` of a finished run says there is nothing to train and rewrites nothing (its config.yaml, curves
    and metrics as the run left them)."""
    out = tmp_path / 'r'
    assert train_main(['--output', str(out), *COMMON]) == 0
    files = ('config.yaml', 'curves.png', 'metrics.csv', 'last.pth', 'last.safetensors')
    before = {f: ((out / f).read_bytes(), os.stat(out / f).st_mtime_ns) for f in files}
    capsys.readouterr()
    assert train_main(['--output', str(out), *COMMON, '--resume']) == 0
    assert 'nothing to train' in capsys.readouterr().out
    assert {f: ((out / f).read_bytes(), os.stat(out / f).st_mtime_ns) for f in files} == before
