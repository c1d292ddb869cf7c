"""Hostile input on first contact (issue 27's probes): odd images, absurd model kwargs, odd paths. Each
ends in correct behaviour or a one-line error that names the key, path or tensor."""
import io

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
