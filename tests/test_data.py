"""Datasets as timm names them (folder, tar, wds/ shards, hfds/), shards written by make_shards, class
maps shared by the splits, unreadable images skipped and counted everywhere, data config from the model."""
import csv
import io
import json
import os
import tarfile

import pytest
import torch
from PIL import Image

from tkvision.cli.train import train_main
from tkvision.engine import clock as clock_mod, trainer as train_mod
from tkvision.engine.run_data import RunData
from tkvision.engine.config import load_config
from tkvision.engine.config import resolve_run_config
from tkvision.cli.train import validate_main
from tkvision.data.shards import INFO_NAME, ShardStream, make_shards

from .helpers import dataset_of, make_imagenet_folder, transform_of

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_tokens=8, num_classes=3)


def _truncate_copy(src, dst, keep=60):
    with open(src, 'rb') as f, open(dst, 'wb') as g:
        g.write(f.read()[:keep])


@pytest.fixture(scope='module')
def jpeg_root(tmp_path_factory):
    """3 classes x 12 train / 4 val Fashion-MNIST JPEGs at 40 px, plus one truncated JPEG in train."""
    root = make_imagenet_folder(tmp_path_factory.mktemp('data') / 'imnet', classes=3, train_per_class=12,
                                val_per_class=4, size=40)
    _truncate_copy(os.path.join(root, 'train', 'n00000001', 'img_0.JPEG'),
                   os.path.join(root, 'train', 'n00000001', 'truncated.JPEG'))
    return root


@pytest.fixture(scope='module')
def shards(jpeg_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('shards') / 'fmnist-wds')
    make_shards(jpeg_root, out, max_count=8, progress=False)
    return out


def _cfg(tmp_path, dataset, data_dir, **kw):
    base = dict(model='tokenformer_vit_ti16', model_kwargs=TINY, dataset=dataset, data_dir=data_dir, img_size=32,
                rrc_scale=[0.5, 1.0], hflip=0.5, epochs=2, warmup_epochs=0.5, batch_size=4, lr=2e-3, threads=1,
                progress=False, output=str(tmp_path / 'run'))
    base.update(kw)
    return load_config(None, base)


def test_make_shards_writes_original_bytes_labels_and_manifest(jpeg_root, shards):
    info = json.load(open(os.path.join(shards, INFO_NAME)))
    train = info['splits']['train']
    assert info['classes'] == ['n00000000', 'n00000001', 'n00000002'] and info['total'] == 37 + 12
    assert train['num_samples'] == 37 and train['filenames'] == [f'train-00000{i}.tar' for i in range(5)]
    assert train['shard_lengths'] == [8, 8, 8, 8, 5] and train['class_counts'] == {
        'n00000000': 12, 'n00000001': 13, 'n00000002': 12}
    assert info['splits']['val']['class_counts'] == {c: 4 for c in info['classes']}
    originals = {}
    for c, name in enumerate(info['classes']):
        for f in os.listdir(os.path.join(jpeg_root, 'train', name)):
            originals[open(os.path.join(jpeg_root, 'train', name, f), 'rb').read()] = c
    seen = 0
    for shard in train['filenames']:
        with tarfile.open(os.path.join(shards, shard)) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            if name.endswith('.jpeg'):
                label = int(members[name[:-len('jpeg')] + 'cls'])
                assert originals[data] == label  # the file's own bytes, under its class
                seen += 1
    assert seen == 37
    with pytest.raises(FileExistsError):
        make_shards(jpeg_root, shards, progress=False)


def test_shard_stream_gives_each_rank_disjoint_shards_and_evaluation_every_sample(shards):
    def keys(rank, world, train):
        ds = ShardStream(shards, 'train' if train else 'val', lambda image: dict(image=image), train=train,
                         batch_size=2, rank=rank, world=world)
        ds.set_epoch(1)
        ds._decode = lambda s: s['__key__']
        return list(ds)
    r0, r1 = keys(0, 2, True), keys(1, 2, True)
    assert len(r0) == len(r1) == 37 // 4 * 2 and not set(r0) & set(r1)
    v0, v1 = keys(0, 2, False), keys(1, 2, False)
    assert not set(v0) & set(v1) and len(v0) + len(v1) == 12


def test_train_validate_and_resume_mid_epoch_from_shards(tmp_path, shards, monkeypatch, capsys):
    """Streamed shards with 2 loader workers: a run that crashes after a mid-epoch checkpoint and is
    resumed ends bit-identical to an uninterrupted run; the truncated JPEG in a shard is skipped and counted."""
    kw = dict(num_workers=2, checkpoint_every_steps=1, log_interval=1, batch_size=2)
    full = train_mod.train(_cfg(tmp_path, 'wds/fmnist', shards, output=str(tmp_path / 'full'), **kw))
    rows = list(csv.DictReader(open(tmp_path / 'full' / 'metrics.csv')))
    assert sum(int(r['skipped']) for r in rows) >= 1 and full['top1'] is not None
    real, calls = clock_mod.save_training_checkpoint, []

    def crash(obj, path):
        real(obj, path)
        calls.append(obj['batches_done'])
        if obj['epochs_done'] == 1 and obj['batches_done'] == 3:
            raise KeyboardInterrupt('pre-empted')
    cfg = _cfg(tmp_path, 'wds/fmnist', shards, output=str(tmp_path / 'broken'), **kw)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', crash)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(cfg)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real)
    resumed = train_mod.train(cfg, resume=True)
    assert 'batch 3' in capsys.readouterr().out
    a, b = full['model'].state_dict(), resumed['model'].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    validate_main(['--config', str(tmp_path / 'broken' / 'config.yaml'), '--checkpoint',
                   str(tmp_path / 'broken' / 'last.pth')])
    assert 'on 12 val images' in capsys.readouterr().out


def test_folder_and_tar_skip_and_count_unreadable_images(tmp_path, jpeg_root):
    for split in ('train', 'val'):
        with tarfile.open(tmp_path / f'{split}.tar', 'w') as tf:
            tf.add(os.path.join(jpeg_root, split), arcname='.')
    for dataset, data_dir in (('folder', jpeg_root), ('tar', str(tmp_path))):
        cfg = _cfg(tmp_path, dataset, data_dir, batch_size=1, epochs=1, output=str(tmp_path / dataset))
        ds = dataset_of(cfg, 'train')
        items = [ds[i] for i in range(len(ds))]
        bad = [x for x in items if isinstance(x[0], str)]
        assert len(items) == 37 and len(bad) == 1 and 'truncated' in bad[0][1], dataset
        assert sorted(y for x, y in items if not isinstance(x, str)) == [0] * 12 + [1] * 12 + [2] * 12
        res = train_mod.train(cfg)
        rows = list(csv.DictReader(open(os.path.join(cfg['output'], 'metrics.csv'))))
        assert int(rows[0]['skipped']) == 1 and res['top1'] is not None, dataset


def test_local_hugging_face_dataset_trains_validates_and_resumes(tmp_path, capsys):
    datasets = pytest.importorskip('datasets')
    from tkvision.data import load_fashion_mnist
    images, labels = load_fashion_mnist('train')
    root = tmp_path / 'hf'
    names = ['T-shirt', 'Trouser', 'Pullover']
    for split, offset, n in (('train', 0, 48), ('validation', 48, 12)):
        rows = dict(image=[], label=[])
        for i in range(offset, 2000):
            if labels[i] < 3 and len(rows['label']) < n:
                buf = io.BytesIO()
                Image.fromarray(images[i]).convert('RGB').save(buf, format='JPEG')
                rows['image'].append(dict(bytes=buf.getvalue(), path=None))
                rows['label'].append(int(labels[i]))
        features = datasets.Features(image=datasets.Image(), label=datasets.ClassLabel(names=names))
        os.makedirs(root / 'data', exist_ok=True)
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(root / 'data' / f'{split}-00000.parquet'))
    cfg = _cfg(tmp_path, f'hfds/{root}', None, epochs=2, rrc_scale=None)
    train_mod.train(dict(cfg, epochs=1))
    res = train_mod.train(cfg, resume=True)
    assert len(res['history']) == 2 and res['top1'] is not None
    validate_main(['--config', str(tmp_path / 'run' / 'config.yaml'), '--checkpoint', str(tmp_path / 'run' / 'last.pth')])
    assert f"on 12 val images: top-1 {res['top1']:.2f}%" in capsys.readouterr().out
    x, y = dataset_of(cfg, 'val')[0]
    assert x.shape == (3, 32, 32) and y in (0, 1, 2)


def test_splits_with_different_classes_are_an_error_naming_them(tmp_path):
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=4, val_per_class=2, size=32)
    os.rename(os.path.join(root, 'val', 'n00000002'), os.path.join(root, 'val', 'n00000009'))
    with pytest.raises(ValueError, match=r"only in train: \['n00000002'\].*only in val: \['n00000009'\]"):
        train_mod.train(_cfg(tmp_path, 'folder', root))
    assert not os.path.exists(tmp_path / 'run' / 'last.pth')


def test_val_uses_the_training_class_map(tmp_path):
    """val lacking nothing but listed in another order on disk still scores class c as class c."""
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=4, val_per_class=2, size=32)
    cfg = _cfg(tmp_path, 'folder', root)
    train_ds = dataset_of(cfg, 'train')
    from tkvision.data import dataset_classes
    val = dataset_of(cfg, 'val', class_to_idx=dataset_classes(train_ds))
    assert sorted(y for _, y in (val[i] for i in range(len(val)))) == [0, 0, 1, 1, 2, 2]


def test_data_config_comes_from_the_model_without_a_recipe(tmp_path, capsys):
    cfg = resolve_run_config(load_config(None, dict(model='tokenformer_vit_s16', dataset='folder')))
    data = cfg.data
    assert data.img_size == 224 and data.mean == (0.485, 0.456, 0.406) and data.interpolation == 'bicubic'
    import timm
    assert data.crop_pct == timm.models.get_pretrained_cfg('tokenformer_vit_s16').crop_pct
    kept = resolve_run_config(load_config(None, dict(model='tokenformer_vit_s16', dataset='folder', img_size=64)))
    assert kept.data.img_size == 64
    root = make_imagenet_folder(tmp_path / 'imnet', classes=2, train_per_class=4, val_per_class=2, size=48)
    assert train_main(['--model', 'tokenformer_vit_ti16', '--model_kwargs', '{embed_dim: 32, depth: 1, num_heads: 2, '
                           'num_tokens: 8}', '--dataset', 'folder', '--data-dir', root, '--epochs', '1',
                           '--warmup_epochs', '0.5', '--batch_size', '4', '--threads', '1', '--progress', 'false',
                           '--output', str(tmp_path / 'run')]) == 0
    assert 'final validation top-1' in capsys.readouterr().out
    saved = load_config(str(tmp_path / 'run' / 'config.yaml'))
    assert saved['img_size'] == 224 and saved['std'] == [0.229, 0.224, 0.225]


def test_random_interpolation_draws_bilinear_or_bicubic():
    cfg = load_config(None, dict(dataset='folder', img_size=32, interpolation='random', rrc_scale=[0.5, 1.0]))
    t = transform_of(cfg, train=True)
    crop = t.transforms[0]
    assert {op.interpolation for op in crop.transforms} == {1, 2}  # cv2.INTER_LINEAR, cv2.INTER_CUBIC
    import numpy as np
    assert t(image=np.zeros((40, 40, 3), np.uint8))['image'].shape == (3, 32, 32)


def test_make_subset_draws_classes_and_images_by_seed_as_folder_or_shards(tmp_path):
    from tkvision.cli.data import make_subset_main as subset_main
    from tkvision.data.subset import PRESETS, make_subset
    root = make_imagenet_folder(tmp_path / 'imnet', classes=5, train_per_class=6, val_per_class=3, size=32)
    counts = make_subset(root, str(tmp_path / 'a'), num_classes=3, train_per_class=4, val_per_class=2, seed=1)
    again = make_subset(root, str(tmp_path / 'b'), num_classes=3, train_per_class=4, val_per_class=2, seed=1)
    assert counts == again and len(counts['train']) == 3 and set(counts['train'].values()) == {4}
    assert sorted(os.listdir(tmp_path / 'a' / 'train')) == sorted(counts['train'])
    for c in counts['train']:
        assert os.listdir(tmp_path / 'a' / 'train' / c) == os.listdir(tmp_path / 'b' / 'train' / c)
    assert subset_main(['--src', root, '--out', str(tmp_path / 's'), '--num-classes', '2', '--train-per-class', '5',
                        '--val-per-class', '1', '--format', 'shards']) == 0
    info = json.load(open(tmp_path / 's' / INFO_NAME))
    assert info['splits']['train']['num_samples'] == 10 and info['splits']['val']['num_samples'] == 2
    assert PRESETS['imagenet-small'] == (100, 1000, 50)
    assert subset_main(['--src', root, '--out', str(tmp_path / 'c'), '--num-classes', '9']) == 2  # only 5 classes


def test_fast_jpeg_decoding_gives_pils_pixels_and_refuses_bombs(jpeg_root, tmp_path):
    """decode_image (simplejpeg for JPEGs) returns exactly PIL's pixels, so the augmentation
    distribution does not change with the decoder; a JPEG header claiming a huge image is refused."""
    import numpy as np
    from tkvision import data
    pytest.importorskip('simplejpeg')
    from studies.performance.data_benchmark import make_jpeg_folder
    root = make_jpeg_folder(str(tmp_path / 'big'), n_images=4, classes=2)
    paths = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    for path in paths:
        raw = open(path, 'rb').read()
        assert np.array_equal(data.decode_image(raw), np.asarray(Image.open(path).convert('RGB')))
    raw = bytearray(open(paths[0], 'rb').read())
    sof = raw.index(b'\xff\xc0') + 5  # baseline frame header: height, width (16-bit big endian)
    raw[sof:sof + 4] = (60000).to_bytes(2, 'big') + (60000).to_bytes(2, 'big')
    with pytest.raises(Image.DecompressionBombError):
        data.decode_image(bytes(raw))


# --- the validation split: choices on validation, the test set once ---------------------

def test_fashion_mnist_validation_is_a_fixed_stratified_holdout_of_train(tmp_path):
    """The default holds out 1,000 training images per class (10k of 60k), the same for every seed,
    disjoint from the 50k that train; the test split is the 10k t10k files, untouched."""
    from tkvision.data import load_fashion_mnist
    images, labels = load_fashion_mnist('train')
    test_images, _ = load_fashion_mnist('test')
    splits = {}
    for seed in (0, 5):
        cfg = load_config(None, dict(seed=seed, output=str(tmp_path / 'r')))
        splits[seed] = [dataset_of(cfg, s) for s in ('train', 'val', 'test')]
    train, val, test = splits[0]
    assert (len(train), len(val), len(test)) == (50000, 10000, 10000)
    assert set(train.indices).isdisjoint(val.indices) and len(set(train.indices) | set(val.indices)) == 60000
    assert sorted(torch.bincount(torch.as_tensor(labels[val.indices])).tolist()) == [1000] * 10
    assert val.indices == splits[5][1].indices  # not the run's seed: every run validates on the same images
    assert bytes(test.images[..., 0].tobytes()) == test_images.tobytes()


def test_val_split_fraction_carves_a_folder_dataset_and_its_val_becomes_the_test_split(tmp_path):
    root = make_imagenet_folder(tmp_path / 'in', classes=3, train_per_class=6, val_per_class=2, size=32)
    cfg = load_config(None, dict(dataset='folder', data_dir=str(root), model_kwargs={'img_size': 32},
                                 val_split_fraction=0.5, output=str(tmp_path / 'r')))
    train, val, test = (dataset_of(cfg, s) for s in ('train', 'val', 'test'))
    assert (len(train), len(val), len(test)) == (9, 9, 6)
    targets = [t for _, t in train.dataset.reader.samples]
    assert sorted(targets[i] for i in val.indices) == [0] * 3 + [1] * 3 + [2] * 3


def test_no_test_split_without_a_holdout_and_a_holdout_that_empties_a_class_is_named(tmp_path):
    from tkvision.utils.errors import ConfigError
    cfg = load_config(None, dict(val_split_fraction=0, output=str(tmp_path / 'r')))
    assert len(dataset_of(cfg, 'val')) == 10000  # the t10k files validate, as in earlier releases
    with pytest.raises(ConfigError, match='no test split'):
        dataset_of(cfg, 'test')
    root = make_imagenet_folder(tmp_path / 'in', classes=2, train_per_class=2, val_per_class=1, size=32)
    cfg = load_config(None, dict(dataset='folder', data_dir=str(root), model_kwargs={'img_size': 32},
                                 val_split_fraction=0.1, output=str(tmp_path / 'r')))
    with pytest.raises(ConfigError, match='val_split_fraction 0.1 leaves class 0 .2 images. with 0 validation'):
        dataset_of(cfg, 'train')


def test_the_trainer_reports_validation_each_epoch_and_the_test_split_once(tmp_path, monkeypatch):
    """``top1`` is the validation split's every epoch; ``test_top1`` appears in the last row only, and
    the test split is read once (counted)."""
    calls = []
    real = RunData.test_loader
    monkeypatch.setattr(RunData, 'test_loader', lambda self: calls.append(1) or real(self))
    res = train_mod.train(load_config(None, dict(model_kwargs={'img_size': 28, 'patch_size': 7, 'in_chans': 1,
                                                               'embed_dim': 16, 'depth': 1, 'num_heads': 1,
                                                               'num_tokens': 8},
                                                 epochs=2, batch_size=64, train_subset=256, val_subset=128,
                                                 threads=1, progress=False, output=str(tmp_path / 'r'))))
    with open(tmp_path / 'r' / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    assert calls == [1] and rows[0]['test_top1'] == '' and float(rows[1]['test_top1']) == res['test_top1']
    assert 0 < res['test_top1'] < 100 and res['top1'] == float(rows[1]['top1'])


def test_a_data_source_registered_by_name_trains_from_a_config(tmp_path, monkeypatch):
    """A new data source is one ``register_data_source`` call (DEVELOPERS.md, "Config ownership"): its name
    validates in a config, ``build_dataset`` reads its splits (the validation split carved from its training images,
    stratified), its fixed class count sizes the head, and a run trains on it. A name no source reads is refused
    naming the registered ones."""
    import numpy as np

    from tkvision.data import ArrayDataset, build_dataset, build_transform, default_num_classes, registry
    from tkvision.engine.config import ConfigError, section

    def images(split):
        rng = np.random.default_rng(0 if split == 'train' else 1)
        labels = np.arange(40) % 4
        return (rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), labels)

    def split(data, name, seed, class_to_idx, rank, world_size):
        return ArrayDataset(*images(name), build_transform(data, name == 'train', seed))

    def carve(data, train, seed, class_to_idx):
        x, y = images('train')
        return ArrayDataset(x, y, build_transform(data, train, seed)), y.tolist()
    monkeypatch.setitem(registry._SOURCES, 'toy', registry.DataSource(split, carve, needs_data_dir=False,
                                                                       num_classes=4, channels=1))
    keys = dict(dataset='toy', val_split_fraction=0.25, img_size=28, mean=[0.5], std=[0.25], crop_pct=1.0,
                interpolation='bilinear', rrc_scale=None, hflip=0.0)
    data = section(load_config(None, keys), 'data')
    train, val = build_dataset(data, 'train', 0), build_dataset(data, 'val', 0)
    # stratified: a quarter of each class's 10 images, rounded down, validates
    assert (len(train), len(val), default_num_classes(data)) == (32, 8, 4)
    assert sorted(int(val[i][1]) for i in range(len(val))) == [0, 0, 1, 1, 2, 2, 3, 3]
    result = train_mod.train(load_config(None, dict(keys, model_kwargs=dict(img_size=28, patch_size=7, in_chans=1,
                                                                            embed_dim=16, depth=1, num_heads=2,
                                                                            num_tokens=8),
                                                    epochs=1, batch_size=10, output=str(tmp_path / 'run'),
                                                    progress=False, threads=1)))
    assert result['model'].num_classes == 4 and result['top1'] is not None
    with pytest.raises(ConfigError, match=r"dataset must be a registered data source .*got 'toys'"):
        load_config(None, dict(keys, dataset='toys'))
