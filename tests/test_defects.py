"""Defects found by hostile use of the features, one test each: runs that could not finish,
hung, or lost or corrupted data. Each failed on the code before its fix."""
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from tkvision.engine import trainer as train_mod
from tkvision.utils.errors import ConfigError, RunError

from .helpers import fmnist_cfg, train_crash_resume


def _steps(*steps):
    return [dict(at_epoch=at, to=to, warmup_epochs=0.25, lr_scale=0.5) for at, to in steps]


def test_1_reset_and_freeze_over_two_steps_resumes_after_the_second(tmp_path, monkeypatch):
    """optimizer_state: reset + freeze_old_tokens + two steps: killed after the second step's checkpoint,
    the run resumes (it stopped with "parameter group that doesn't match") and ends bit-identical."""
    g = dict(schedule=_steps((1, {'qkv': 24}), (2, {'ffn': 96})), optimizer_state='reset', freeze_old_tokens=True)
    common = dict(epochs=3, train_subset=256, val_subset=64, growth=g)
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **common))
    resumed = train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'broken'), **common), saves=2)
    a, b = full['model'].state_dict(), resumed['model'].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('model, to, words', [
    ('tokenformer_vit_ti16', {'qkv': 8}, 'fewer tokens'),
    ('tokenformer_vit_ti16', {'mlp_hidden': 128}, 'mlp_hidden'),
    ('vit_tiny_patch16_224', {'qkv': 32}, 'has no Pattention'),
    ('vit_tiny_patch16_224', {'mlp_hidden': 16}, 'smaller'),
])
def test_2_growth_targets_the_model_cannot_reach_are_refused_before_training(tmp_path, model, to, words):
    kwargs = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=1, num_heads=2)
    if model.startswith('tokenformer'):
        kwargs['num_tokens'] = 16
    else:
        kwargs['mlp_ratio'] = 1.0
    cfg = fmnist_cfg(tmp_path, model=model, model_kwargs=kwargs, epochs=2, growth=dict(schedule=_steps((1, to))))
    with pytest.raises(ConfigError, match=rf'growth.schedule\[0\]\.to.*{words}') as e:
        train_mod.train(cfg)
    assert not os.path.exists(os.path.join(cfg['output'], 'last.pth')), 'refused before any training'
    assert 'epoch' not in str(e.value).split('growth.schedule')[0]


def test_11_resume_into_another_runs_output_is_refused(tmp_path):
    """``--resume A/last.pth --output B`` used to overwrite run B's files; B must be empty (or A's own)."""
    a = fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64, output=str(tmp_path / 'a'))
    b = dict(a, output=str(tmp_path / 'b'))
    train_mod.train(a)
    train_mod.train(b)
    before = {f: open(os.path.join(b['output'], f), 'rb').read() for f in os.listdir(b['output']) if f != '.lock'}
    with pytest.raises(RunError, match='already holds a run'):
        train_mod.train(dict(b, epochs=2), resume=os.path.join(a['output'], 'last.pth'))
    after = {f: open(os.path.join(b['output'], f), 'rb').read() for f in os.listdir(b['output']) if f != '.lock'}
    assert after == before
    res = train_mod.train(dict(a, epochs=2, output=str(tmp_path / 'c')), resume=os.path.join(a['output'], 'last.pth'))
    assert [r['epoch'] for r in res['history']] == [1]  # into an empty folder: allowed


def test_12_a_run_killed_before_its_first_checkpoint_can_start_again(tmp_path, monkeypatch, capsys):
    """Killed before its first checkpoint, a run leaves config.yaml only; a restart (and a requeued
    ``--resume``) must start it from scratch, not refuse forever."""
    cfg = fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt('node failure')
    with monkeypatch.context() as m:
        m.setattr('tkvision.engine.trainer.train_one_epoch', killed)
        with pytest.raises(KeyboardInterrupt):
            train_mod.train(cfg)
    assert sorted(os.listdir(cfg['output'])) == ['.lock', 'config.yaml']
    assert train_mod.train(cfg, resume=True)['top1'] is not None
    assert 'no checkpoint yet' in capsys.readouterr().out
    os.remove(os.path.join(cfg['output'], 'last.pth'))
    for f in ('best.safetensors', 'last.safetensors', 'metrics.csv', 'curves.png', 'per_class.csv',
              'confusion_matrix.csv', 'confusion_matrix.png'):
        os.remove(os.path.join(cfg['output'], f))
    assert train_mod.train(cfg)['top1'] is not None  # a plain restart too


@pytest.mark.parametrize('ratio', [0.0, 0.01, 0.99])
def test_13_mae_mask_ratios_that_leave_nothing_to_learn_are_refused(tmp_path, ratio):
    """mask_ratio 0 trained nothing and reported loss 0.0000 with exit 0; 16 patches here: 0.01 masks
    none, 0.99 leaves none visible."""
    with pytest.raises(ConfigError, match='mask_ratio'):  # the config (0) or the model (0.01, 0.99) refuses
        train_mod.train(fmnist_cfg(tmp_path, task='mae', mask_ratio=ratio, decoder=dict(embed_dim=16, depth=1, num_heads=2)))
    assert not os.path.exists(os.path.join(tmp_path, 'run', 'last.pth'))


def _export_source(tmp_path):
    from tkvision.engine.checkpoint import save_weights
    import timm
    kwargs = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1, num_heads=2, num_tokens=8, num_classes=10)
    path = str(tmp_path / 'w.safetensors')
    save_weights(timm.create_model('tokenformer_vit_ti16', **kwargs).state_dict(), path)
    return ['--checkpoint', path, '--model', 'tokenformer_vit_ti16', '--model-kwargs', str(kwargs).replace("'", '')]


def test_7_export_never_writes_over_a_folder_that_holds_files(tmp_path, capsys):
    """A folder with a model.safetensors but no config.json was silently overwritten."""
    from tkvision.cli.weights import export_main
    out = tmp_path / 'exported'
    out.mkdir()
    (out / 'model.safetensors').write_bytes(b'somebody else\'s model')
    assert export_main([*_export_source(tmp_path), '--out', str(out)]) == 2
    assert 'already exists and holds files' in capsys.readouterr().err
    assert (out / 'model.safetensors').read_bytes() == b'somebody else\'s model'
    assert export_main([*_export_source(tmp_path), '--out', str(out), '--force']) == 0
    assert (out / 'config.json').is_file() and (out / 'model.safetensors').stat().st_size > 100


def test_8_a_full_disk_during_export_leaves_no_folder_that_looks_valid(tmp_path, monkeypatch, capsys):
    """Export left model.safetensors and a 0-byte config.json, then refused to redo it."""
    import timm
    from tkvision.cli.weights import export_main
    real = timm.models.save_for_hf

    def disk_full(model, folder, **kwargs):
        open(os.path.join(folder, 'model.safetensors'), 'wb').write(b'partial')
        open(os.path.join(folder, 'config.json'), 'w').close()
        raise OSError(28, 'No space left on device')
    out = tmp_path / 'exported'
    monkeypatch.setattr(timm.models, 'save_for_hf', disk_full)
    assert export_main([*_export_source(tmp_path), '--out', str(out)]) == 2
    assert capsys.readouterr().err.count('\n') == 1  # one line: "error: [Errno 28] No space left on device"
    assert not out.exists() and [f for f in os.listdir(tmp_path) if f.startswith('.')] == []
    monkeypatch.setattr(timm.models, 'save_for_hf', real)
    assert export_main([*_export_source(tmp_path), '--out', str(out)]) == 0  # the retry works
    assert timm.create_model(f'local-dir:{out}', pretrained=True).num_classes == 10


def test_9_sixteen_bit_grayscale_pngs_keep_their_grey_levels(tmp_path):
    """They were binarised (every nonzero pixel 255) and trained on with ``skipped 0``."""
    import io
    from tkvision.data import decode_image
    levels = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    buffer = io.BytesIO()
    Image.fromarray(levels).save(buffer, format='PNG')
    image = decode_image(buffer.getvalue())
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    expected = np.round(levels / 257).astype(np.uint8)  # 65535 -> 255, linearly
    assert np.array_equal(image[..., 0], expected) and np.array_equal(image[..., 2], expected)
    assert len(np.unique(image)) > 200


@pytest.fixture(scope='module')
def shard_folder(tmp_path_factory):
    from tkvision.data.shards import make_shards
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path_factory.mktemp('defects') / 'jpeg', classes=2, train_per_class=12,
                                val_per_class=4, size=32)
    out = str(tmp_path_factory.mktemp('defects') / 'shards')
    make_shards(root, out, max_count=6, progress=False)  # train-000000 .. 000003, val-000000 .. 000001
    return out


def _shard_cfg(tmp_path, data_dir, **kw):
    from tkvision.engine.config import load_config
    tiny = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_tokens=8, num_classes=2)
    base = dict(model='tokenformer_vit_ti16', model_kwargs=tiny, dataset='wds/defects', data_dir=data_dir, img_size=32,
                rrc_scale=None, epochs=1, warmup_epochs=0.5, batch_size=2, threads=1, progress=False,
                output=str(tmp_path / 'run'))
    return load_config(None, dict(base, **kw))


def _damaged_copy(shard_folder, tmp_path, shard, damage):
    import shutil
    folder = str(tmp_path / 'shards')
    shutil.copytree(shard_folder, folder)
    path = os.path.join(folder, shard)
    data = open(path, 'rb').read()
    open(path, 'wb').write(damage(data))
    return folder


@pytest.mark.parametrize('split', ['train', 'val'])
def test_3_a_shard_truncated_in_the_middle_is_skipped_and_counted(tmp_path, shard_folder, split):
    """It killed the run with tarfile.ReadError, in training or at evaluation."""
    folder = _damaged_copy(shard_folder, tmp_path, f'{split}-000000.tar', lambda d: d[:len(d) // 2 + 100])
    res = train_mod.train(_shard_cfg(tmp_path, folder))
    row = res['history'][-1]
    assert int(row['skipped' if split == 'train' else 'val_skipped']) >= 1 and res['top1'] is not None


@pytest.mark.parametrize('damage, words', [(lambda d: b'', 'is empty (0 bytes)'),
                                           (lambda d: b'\0' * 10240, 'holds no sample'),
                                           (lambda d: b'not a tar file at all' * 40, 'is not a readable tar')])
def test_5_an_empty_or_unreadable_shard_is_refused_before_training(tmp_path, shard_folder, damage, words):
    """A worker whose only shard was an empty tar spun at 100% CPU forever; a 0-byte shard killed the run."""
    from tkvision.utils.errors import UsageError
    folder = _damaged_copy(shard_folder, tmp_path, 'train-000002.tar', damage)
    with pytest.raises(UsageError, match=re.escape(f'train-000002.tar {words}')):
        train_mod.train(_shard_cfg(tmp_path, folder, num_workers=2))


def test_4_10_an_uncaught_error_with_loader_workers_exits(tmp_path):
    """With num_workers > 0 the error was printed and the process never exited (workers ignored the
    SIGTERM Python stops them with); an out-of-memory batch hung the same way."""
    import subprocess
    import sys
    from .helpers import ROOT
    args = [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), '--output', str(tmp_path / 'run'),
            '--model_kwargs', '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 32, depth: 1, num_heads: 2, '
            'num_tokens: 16}', '--rrc_scale', 'null', '--epochs', '2', '--warmup_epochs', '0.5', '--train_subset', '256',
            '--val_subset', '64', '--batch_size', '32', '--num_workers', '2', '--threads', '1', '--progress', 'false',
            '--log_interval', '4', '--lr', '1e12']  # a NaN loss: an error the CLI does not catch
    # The clock starts at the error, not at the launch: a loaded runner's slow start is not the defect, a process
    # that stays after its error is.
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if 'NaN or infinite' in line:
            break
    try:
        seen.append(p.communicate(timeout=60)[1])  # the rest of its output, read so a full pipe cannot hold it
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail('the trainer did not exit within 60 s after its error: ' + ''.join(seen)[-2000:])
    assert p.returncode != 0 and 'NaN or infinite' in ''.join(seen), ''.join(seen)[-2000:]


def test_6_a_hugging_face_validation_class_the_training_split_lacks_is_named_before_training(tmp_path):
    """The class check covered folders and tar only: an ``hfds/`` validation split with a class that no
    training image has was trained and scored without a word (the issue saw a KeyError)."""
    from tkvision.utils.errors import UsageError
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'hf', classes=3, train_per_class=8, val_per_class=2, size=28)
    os.rename(os.path.join(root, 'val'), os.path.join(root, 'validation'))  # Hugging Face's split name
    import shutil
    shutil.rmtree(os.path.join(root, 'train', 'n00000002'))  # a class the training split lacks
    cfg = fmnist_cfg(tmp_path, dataset=f'hfds/{root}', img_size=28, model_kwargs=dict(img_size=28, patch_size=7, embed_dim=16,
                     depth=1, num_heads=2, num_tokens=8, num_classes=3), train_subset=None, val_subset=None, batch_size=4)
    with pytest.raises(UsageError, match=r"only in val: \['n00000002'\]"):
        train_mod.train(cfg)
    assert not os.path.exists(os.path.join(cfg['output'], 'last.pth'))


def test_also_malformed_yaml_and_truncated_checkpoints_are_one_line_errors(tmp_path, capsys):
    from tkvision.cli.train import train_main, validate_main
    bad = tmp_path / 'bad.yaml'
    bad.write_text('epochs: 2\nlr: [1e-3\n')
    assert train_main(['--config', str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'bad.yaml' in err and 'line' in err
    for name in ('last.pth', 'w.safetensors'):
        path = tmp_path / name
        path.write_bytes(b'PK\x03\x04 truncated' if name.endswith('.pth') else b'\x10\x00\x00\x00\x00\x00\x00\x00{"a":')
        assert validate_main(['--checkpoint', str(path), '--model', 'tokenformer_vit_ti16']) == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and name in err and 'not a readable' in err, err


def test_also_a_fashion_mnist_data_dir_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='nowhere'):
        train_mod.train(fmnist_cfg(tmp_path, data_dir=str(tmp_path / 'nowhere')))


def test_also_an_empty_class_folder_is_named_as_empty(tmp_path):
    """It was reported as a class "only in val"."""
    from tkvision.utils.errors import UsageError
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=4, val_per_class=2, size=32)
    for f in os.listdir(os.path.join(root, 'train', 'n00000001')):
        os.remove(os.path.join(root, 'train', 'n00000001', f))
    cfg = fmnist_cfg(tmp_path, dataset='folder', data_dir=root, img_size=32, model_kwargs=dict(
        img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_tokens=8, num_classes=3),
        train_subset=None, val_subset=None, batch_size=4)
    with pytest.raises(UsageError, match=r"train/n00000001 holds no image"):
        train_mod.train(cfg)


def test_also_resume_with_only_output_uses_the_runs_own_config(tmp_path, capsys):
    """``tools/train.py --resume --output runs/x`` compared the checkpoint against the defaults."""
    from tkvision.cli.train import train_main
    out = str(tmp_path / 'run')
    args = ['--output', out, '--model_kwargs', '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 16, depth: 1, '
            'num_heads: 2, num_tokens: 8}', '--rrc_scale', 'null', '--epochs', '1', '--warmup_epochs', '0.5',
            '--train_subset', '128', '--val_subset', '64', '--batch_size', '32', '--threads', '1', '--progress', 'false']
    assert train_main(args) == 0
    assert train_main(['--resume', '--output', out, '--epochs', '2']) == 0
    assert 'changed: epochs 1 -> 2' in capsys.readouterr().out


def test_also_make_shards_refuses_a_max_count_below_one(tmp_path, capsys):
    from tkvision.cli.data import make_shards_main
    assert make_shards_main(['--src', str(tmp_path), '--out', str(tmp_path / 's'), '--max-count', '0']) == 2
    assert '--max-count' in capsys.readouterr().err and not os.path.exists(tmp_path / 's')


def test_also_a_class_folder_without_num_classes_gets_a_head_of_its_classes(tmp_path):
    """A 3-class folder trained without ``model_kwargs.num_classes`` got ImageNet's 1000-way head (the
    note); Fashion-MNIST keeps 10, a dataset whose classes cannot be listed keeps timm's 1000."""
    from tkvision.engine.config import TrainConfig, load_config, model_for_config
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=2, val_per_class=1, size=32)
    tiny = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_tokens=8)
    for dataset, data_dir, expected in (('folder', root, 3), ('imagenet', root, 3), ('fashion_mnist', None, 10),
                                        ('hfds/some/dataset', None, 1000)):
        cfg = load_config(None, dict(model='tokenformer_vit_ti16', model_kwargs=tiny, dataset=dataset, data_dir=data_dir))
        assert model_for_config(TrainConfig.from_dict(cfg)).num_classes == expected, dataset
    cfg = load_config(None, dict(model='tokenformer_vit_ti16', model_kwargs=dict(tiny, num_classes=5), dataset='folder',
                                 data_dir=root))
    assert model_for_config(TrainConfig.from_dict(cfg)).num_classes == 5  # model_kwargs still decides when it says


def test_also_a_run_with_the_old_1000_way_head_on_a_class_folder_resumes(tmp_path, monkeypatch):
    """A run on a class folder without ``model_kwargs.num_classes`` written before 2687330 holds a 1000-way head;
    today's default gives the folder's 3 classes. Resuming such a run says what to set (it raised PyTorch's bare
    size mismatch), and resumes once the config sets ``num_classes: 1000`` (that change was refused as a new model)."""
    import pytest
    from tkvision.engine import trainer
    from tkvision.engine.config import load_config
    from tkvision.utils.errors import RunError
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=4, val_per_class=2, size=32)
    tiny = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_tokens=8)
    run = dict(model='tokenformer_vit_ti16', dataset='folder', data_dir=str(root), epochs=2, batch_size=4, threads=1,
               progress=False, output=str(tmp_path / 'run'), img_size=32, rrc_scale=None)
    with monkeypatch.context() as old_release:
        old_release.setattr(trainer, 'default_num_classes', lambda data: 1000)
        trainer.train(load_config(None, dict(run, model_kwargs=tiny, epochs=1)))
    with pytest.raises(RunError, match=r'1000 classes.*model_kwargs.*num_classes: 1000'):
        trainer.train(load_config(None, dict(run, model_kwargs=tiny)), resume=True)
    result = trainer.train(load_config(None, dict(run, model_kwargs=dict(tiny, num_classes=1000))), resume=True)
    assert result['epochs'] == 2 and result['model'].num_classes == 1000
