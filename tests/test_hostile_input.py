"""Hostile input on first contact: odd images, absurd model kwargs, odd paths. Each
ends in correct behaviour or a one-line error that names the key, path or tensor."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from tkvision.data import decode_image
from tkvision.engine import trainer as train_mod
from tkvision.engine.config import load_config
from tkvision.utils.errors import ConfigError

from .helpers import fmnist_cfg

TINY = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_tokens=8, num_classes=3)


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def _odd_images():
    """One of each image a real folder holds, keyed by file name."""
    grey = np.random.RandomState(0).randint(0, 255, (40, 40), dtype=np.uint8)
    rgb = Image.fromarray(np.stack([grey] * 3, -1))
    exif = rgb.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees to view"
    return {
        'grey.png': _encode(Image.fromarray(grey), 'PNG'),
        'cmyk.jpg': _encode(Image.fromarray(np.stack([grey] * 4, -1), 'CMYK'), 'JPEG'),
        'sixteen.png': _encode(Image.fromarray(grey.astype(np.uint16) * 257), 'PNG'),
        'palette.png': _encode(Image.fromarray(grey).convert('P'), 'PNG'),
        'rgba.png': _encode(Image.fromarray(np.stack([grey] * 4, -1), 'RGBA'), 'PNG'),
        'exif.jpg': _encode(rgb.resize((40, 20)), 'JPEG', exif=exif),
        'one_pixel.png': _encode(Image.fromarray(grey[:1, :1]), 'PNG'),
        'zero_bytes.jpg': b'',
    }


def test_every_kind_of_image_decodes_or_is_skipped_and_counted(tmp_path):
    """Grey, CMYK, 16-bit, palette, RGBA, EXIF-rotated and 1x1 images train; a zero-byte file is skipped
    and counted; a class with a single image is a class."""
    root = tmp_path / 'odd'
    for split in ('train', 'val'):
        for c, names in enumerate((list(_odd_images()), ['grey.png'], ['palette.png'])):
            folder = root / split / f'class{c}'
            folder.mkdir(parents=True)
            for name in names:
                (folder / name).write_bytes(_odd_images()[name])
    cfg = fmnist_cfg(tmp_path, dataset='folder', data_dir=str(root), img_size=32, model_kwargs=TINY, rrc_scale=[0.5, 1.0],
                     train_subset=None, val_subset=None, batch_size=2, epochs=1)
    res = train_mod.train(cfg)
    row = res['history'][-1]
    assert int(row['skipped']) == 1 and int(row['val_skipped']) == 1 and res['top1'] is not None


def test_exif_orientation_is_read_as_timm_reads_it():
    """Like timm's loader (``Image.open(...).convert('RGB')``), the EXIF orientation is not applied, so
    timm's validate.py scores our checkpoints on the same pixels."""
    data = _odd_images()['exif.jpg']
    timm_pixels = np.asarray(Image.open(io.BytesIO(data)).convert('RGB'))
    assert np.array_equal(decode_image(data), timm_pixels) and timm_pixels.shape == (20, 40, 3)


@pytest.mark.parametrize('kwargs, words', [(dict(depth=0), 'depth must be >= 1'),
                                           (dict(num_heads=3), 'must be divisible by num_heads 3'),
                                           (dict(num_tokens=0), 'num_tokens=0'),
                                           (dict(patch_size=5), 'must be divisible by patch_size 5'),
                                           (dict(no_such_kwarg=1), 'no_such_kwarg')])
def test_absurd_model_kwargs_are_refused_naming_the_kwarg(tmp_path, kwargs, words):
    with pytest.raises(ConfigError, match=f'model_kwargs of tokenformer_vit_ti16: .*{words}'):
        train_mod.train(fmnist_cfg(tmp_path, model_kwargs={**TINY, 'img_size': 28, 'in_chans': 1, 'patch_size': 7, **kwargs}))


def test_a_data_dir_that_is_a_file_is_named(tmp_path):
    path = tmp_path / 'a_file'
    path.write_text('not a folder')
    with pytest.raises(FileNotFoundError, match='a_file'):
        train_mod.train(fmnist_cfg(tmp_path, data_dir=str(path)))


def test_an_output_path_with_unicode_and_spaces_works(tmp_path):
    out = tmp_path / 'runs é x' / 'ça va'
    res = train_mod.train(fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64, output=str(out)))
    assert res['top1'] is not None and (out / 'last.pth').is_file()


def test_a_missing_base_config_is_named(tmp_path):
    path = tmp_path / 'child.yaml'
    path.write_text('_base_: ../nowhere/_base_.yaml\nepochs: 2\n')
    with pytest.raises(ConfigError, match='config file not found: .*nowhere/_base_.yaml'):
        load_config(str(path))


def test_a_weights_file_of_another_family_is_refused_naming_the_tensors(tmp_path, capsys):
    """validate (and export, mae_visualize, attention_distance: the same loader) on a timm ViT's weights."""
    import timm
    from tkvision.cli.train import validate_main
    from tkvision.engine.checkpoint import save_weights
    path = str(tmp_path / 'vit.safetensors')
    save_weights(timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1, num_classes=10).state_dict(),
                 path)
    cfg = tmp_path / 'cfg.yaml'
    cfg.write_text('model_kwargs: {img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 16, depth: 1, num_heads: 2, '
                   'num_tokens: 8}\nval_subset: 16\nthreads: 1\n')
    assert validate_main(['--config', str(cfg), '--checkpoint', path]) == 2
    err = capsys.readouterr().err
    assert 'vit.safetensors does not fit the model' in err and 'blocks.0.attn.q.key_param_tokens' in err


def test_a_run_killed_between_a_growth_step_and_its_checkpoint_resumes_bit_identically(tmp_path, monkeypatch):
    """The step happened, the checkpoint after it did not: the resumed run replays that epoch, grows the
    same tokens again (seeded by derive_seed) and ends as the uninterrupted run."""
    import torch
    from tkvision.engine.runlog import RunLog
    g = dict(schedule=[dict(at_epoch=2, to={'qkv': 24, 'ffn': 96}, warmup_epochs=0.25, lr_scale=0.5)])
    common = dict(epochs=3, train_subset=256, val_subset=64, growth=g, model_ema=True)
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **common))
    real = RunLog.epoch

    def killed_after_growing(log, row, state):
        if 'grown' in row:
            raise KeyboardInterrupt('killed after the growth step, before its checkpoint')
        real(log, row, state)
    cfg = fmnist_cfg(tmp_path, output=str(tmp_path / 'killed'), **common)
    monkeypatch.setattr(RunLog, 'epoch', killed_after_growing)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(cfg)
    monkeypatch.setattr(RunLog, 'epoch', real)
    resumed = train_mod.train(cfg, resume=True)
    a, b = full['model'].state_dict(), resumed['model'].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_a_changed_growth_schedule_is_refused_naming_it(tmp_path):
    g = dict(schedule=[dict(at_epoch=1, to={'qkv': 24})])
    cfg = fmnist_cfg(tmp_path, epochs=2, train_subset=128, val_subset=64, growth=g)
    train_mod.train(cfg)
    changed = dict(cfg, epochs=3, growth=dict(cfg['growth'], schedule=[dict(cfg['growth']['schedule'][0], to={'qkv': 32})]))
    with pytest.raises(ConfigError, match='cannot change when resuming.*growth'):
        train_mod.train(changed, resume=True)


@pytest.mark.parametrize('change, tensor', [(dict(patch_size=4), 'patch_embed.proj.weight'),
                                            (dict(embed_dim=32), 'cls_token'),
                                            (dict(depth=2), 'blocks.1')])
def test_init_from_an_mae_of_another_shape_names_the_tensors(tmp_path, change, tensor):
    """An MAE encoder of another patch size, width or depth: a WeightsMismatchError naming the tensors."""
    from tkvision.engine.checkpoint import save_weights
    from tkvision.models import create_mae
    from tkvision.utils.errors import WeightsMismatchError
    enc = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1, num_heads=2, num_tokens=8)
    mae = create_mae('tokenformer_vit_ti16', decoder=dict(embed_dim=16, depth=1, num_heads=2), **enc)
    path = str(tmp_path / 'mae.safetensors')
    save_weights(mae.state_dict(), path)
    cfg = fmnist_cfg(tmp_path, model_kwargs={**enc, **change}, init_from=path, train_subset=128, val_subset=64)
    with pytest.raises(WeightsMismatchError, match=tensor.replace('.', r'\.')):
        train_mod.train(cfg)


def test_a_shard_listed_in_the_manifest_but_missing_is_named(tmp_path):
    import shutil
    from tkvision.data.shards import make_shards
    from tkvision.utils.errors import UsageError
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'jpeg', classes=2, train_per_class=6, val_per_class=2, size=32)
    shards = str(tmp_path / 'shards')
    make_shards(root, shards, max_count=4, progress=False)
    os.remove(os.path.join(shards, 'train-000001.tar'))
    cfg = fmnist_cfg(tmp_path, dataset='wds/x', data_dir=shards, img_size=32, model_kwargs=TINY, rrc_scale=None,
                     train_subset=None, val_subset=None, batch_size=2)
    with pytest.raises(UsageError, match='train-000001.tar is listed in _info.json but missing'):
        train_mod.train(cfg)
    shutil.rmtree(shards)


def test_a_hugging_face_dataset_without_the_split_is_named(tmp_path):
    """A dataset with a train split only: asking for its evaluation split names the dataset and split."""
    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'hf', classes=2, train_per_class=4, val_per_class=1, size=28)
    import shutil
    shutil.rmtree(os.path.join(root, 'val'))
    cfg = fmnist_cfg(tmp_path, dataset=f'hfds/{root}', img_size=28, model_kwargs=dict(TINY, img_size=28, patch_size=7),
                     train_subset=None, val_subset=None, batch_size=2)
    with pytest.raises(FileNotFoundError, match="has no split 'validation'"):
        train_mod.train(cfg)
