"""Natural images: CIFAR-10 read from the shared JPEG archives (never extracted into the repository), from class
folders and from torchvision's pickled batches; and the three defects the first natural-image run met (a model's size
against the recipe's transform, a tar dataset's head, class-sorted subsets)."""
import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from tkvision.cli.train import train_main
from tkvision.data import build_dataset, default_num_classes, split_size
from tkvision.data import cifar10
from tkvision.data.datasets import dataset_labels, stratified_subset
from tkvision.engine.config import load_config, resolve_run_config, section
from tkvision.utils.errors import ConfigError, UsageError

from .helpers import dataset_of

#: The shared CIFAR-10 archives beside the checkout (``TKVISION_CIFAR10`` overrides); CI has them.
CIFAR10_DIR = os.environ.get('TKVISION_CIFAR10', os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data',
                                                              'cifar10'))
TINY32 = dict(img_size=32, patch_size=8, in_chans=3, embed_dim=16, depth=1, num_heads=2, num_tokens=8)


@pytest.fixture(scope='module')
def cifar_dir():
    if not os.path.isfile(os.path.join(CIFAR10_DIR, 'train.tar')):
        pytest.skip(f'CIFAR-10 archives not found in {CIFAR10_DIR} (set TKVISION_CIFAR10)')
    return CIFAR10_DIR


def _jpeg(color, size=32) -> bytes:
    buf = io.BytesIO()
    Image.new('RGB', (size, size), color).save(buf, format='JPEG', quality=95)
    return buf.getvalue()


def _write_tar(path, members):
    with tarfile.open(path, 'w') as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def sorted_tar(tmp_path):
    """A class-sorted ``tar`` dataset (as CIFAR-10's and ImageNet's archives are): 3 classes, 12 training and 4
    validation 32 px images each, the class in the pixels' colour."""
    colours = {'ant': (200, 30, 30), 'bee': (30, 200, 30), 'cow': (30, 30, 200)}
    for split, per_class in (('train', 12), ('val', 4)):
        _write_tar(tmp_path / f'{split}.tar', [(f'{c}/{i:04d}.jpg', _jpeg(rgb)) for c, rgb in colours.items()
                                               for i in range(per_class)])
    return str(tmp_path)


# --- the three defects of the first natural-image run ------------------------------------------------------------

def test_a_model_of_another_size_than_the_transform_is_refused_in_one_line_before_any_work(sorted_tar, tmp_path,
                                                                                          capsys):
    """The quick recipe's 28 px transform against a 32 px model: one line naming both sizes, no run folder (it
    was an AssertionError traceback from the patch embedding at the first batch)."""
    out = tmp_path / 'run'
    rc = train_main(['--config', 'fashion_mnist/quick', '--dataset', 'tar', '--data_dir', sorted_tar,
                     '--model_kwargs', str(TINY32), '--epochs', '1', '--output', str(out), '--progress', 'false'])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert 'takes 32 x 32 px images and the data section makes them 28 x 28' in err
    assert 'set img_size: 32' in err and 'Traceback' not in err and len(err.strip().splitlines()) == 1


def test_a_tar_dataset_gets_a_head_of_its_classes(sorted_tar, tmp_path):
    """A 3-class tar archive trains a 3-way head (it got ImageNet's 1000)."""
    cfg = load_config(None, dict(dataset='tar', data_dir=sorted_tar, model_kwargs=TINY32, img_size=32, epochs=1,
                                 batch_size=12, threads=1, progress=False, output=str(tmp_path / 'run')))
    assert default_num_classes(section(cfg, 'data')) == 3
    from tkvision.engine.trainer import train
    assert train(cfg)['model'].num_classes == 3


def test_subsets_of_a_class_sorted_archive_keep_every_class_in_its_share(sorted_tar, tmp_path):
    """``train_subset`` 9 / ``val_subset`` 6 of class-sorted archives: 3 / 2 images of each class, the same images
    for every seed (they were the first 9 and 6: one class, and validation printed 100%)."""
    picked = {}
    for seed in (0, 3):
        cfg = load_config(None, dict(dataset='tar', data_dir=sorted_tar, model_kwargs=TINY32, img_size=32,
                                     train_subset=9, val_subset=6, seed=seed, output=str(tmp_path / 'r')))
        picked[seed] = [dataset_of(cfg, split) for split in ('train', 'val')]
    train, val = picked[0]
    assert np.bincount(dataset_labels(train)).tolist() == [3, 3, 3]
    assert np.bincount(dataset_labels(val)).tolist() == [2, 2, 2]
    assert train.indices == picked[3][0].indices and val.indices == picked[3][1].indices
    assert sorted({int(train[i][1]) for i in range(len(train))}) == [0, 1, 2]  # what the loader reads agrees


def test_stratified_subset_against_the_share_of_each_class():
    """Each class gets its share of ``size`` within one item, all classes are kept, a larger subset holds a
    smaller one, and fewer items than classes are refused."""
    labels = np.repeat([0, 1, 2, 3], [50, 30, 15, 5])
    for size in (4, 10, 37, 99):
        chosen = stratified_subset(labels, size)
        counts = np.bincount(labels[chosen], minlength=4)
        share = size * np.array([50, 30, 15, 5]) / 100
        assert len(chosen) == size and (counts >= 1).all() and (np.abs(counts - share) <= 1).all()
    assert set(stratified_subset(labels, 10)) <= set(stratified_subset(labels, 37))
    assert np.array_equal(stratified_subset(labels, 37), stratified_subset(labels, 37))
    assert np.array_equal(stratified_subset(labels, 100), np.arange(100))
    with pytest.raises(ValueError, match='a subset of 3 cannot keep each of the 4 classes'):
        stratified_subset(labels, 3)


def test_a_subset_smaller_than_the_classes_is_refused_naming_the_key(sorted_tar, tmp_path):
    cfg = load_config(None, dict(dataset='tar', data_dir=sorted_tar, model_kwargs=TINY32, img_size=32, val_subset=2,
                                 output=str(tmp_path / 'r')))
    with pytest.raises(ConfigError, match='val_subset 2: a subset of 2 cannot keep each of the 3 classes'):
        dataset_of(cfg, 'val')


# --- CIFAR-10 ------------------------------------------------------------------------------------------------------

def test_cifar10_from_the_archives_has_its_splits_classes_and_pixels(cifar_dir):
    """50,000 / 10,000 images, 5,000 / 1,000 a class in CIFAR-10's label order, each image the archive member's
    JPEG as PIL decodes it; the recorded channel statistics are those of the training images (float64 here)."""
    images, labels = cifar10.load_cifar10('train', cifar_dir)
    test_images, test_labels = cifar10.load_cifar10('test', cifar_dir)
    assert images.shape == (50000, 32, 32, 3) and test_images.shape == (10000, 32, 32, 3)
    assert np.bincount(labels).tolist() == [5000] * 10 and np.bincount(test_labels).tolist() == [1000] * 10
    with tarfile.open(os.path.join(cifar_dir, 'val.tar')) as archive:
        names = sorted(m.name for m in archive if m.isfile())
        for k in (0, 4321, 9999):
            with archive.extractfile(names[k]) as f:
                reference = np.asarray(Image.open(io.BytesIO(f.read())).convert('RGB'))
            assert np.array_equal(test_images[k], reference)
            assert cifar10.CIFAR10_CLASSES[test_labels[k]] == names[k].split('/')[0]
    np.testing.assert_allclose(cifar10.CIFAR10_STATS['mean'], images.mean((0, 1, 2), dtype=np.float64) / 255,
                               atol=5e-5)
    np.testing.assert_allclose(cifar10.CIFAR10_STATS['std'], images.std((0, 1, 2), dtype=np.float64) / 255, atol=5e-5)


def test_cifar10_validation_is_500_a_class_held_out_of_train_and_the_test_images_are_the_test_split(cifar_dir,
                                                                                                   tmp_path):
    cfg = load_config(None, dict(dataset='cifar10', data_dir=cifar_dir, model_kwargs=TINY32,
                                 output=str(tmp_path / 'r')))
    config = resolve_run_config(cfg)
    assert (config.data.img_size, config.data.val_split_fraction) == (32, 0.1)
    assert tuple(config.data.mean) == tuple(cifar10.CIFAR10_STATS['mean'])
    train, val, test = (build_dataset(config.data, s, 0) for s in ('train', 'val', 'test'))
    assert (len(train), len(val), len(test)) == (45000, 5000, 10000)
    assert [split_size(config.data, s, 0) for s in ('train', 'val', 'test')] == [45000, 5000, 10000]
    assert np.bincount(dataset_labels(val)).tolist() == [500] * 10 and set(train.indices).isdisjoint(val.indices)
    assert default_num_classes(config.data) == 10


def test_a_cifar10_config_counts_its_images_without_the_files(cifar_dir, tmp_path):
    """A report counts the images a config trains where the data is absent (CI's checkout has no data/cifar10):
    `split_size` from CIFAR-10's published class counts equals the images `build_dataset` reads, subsets included."""
    def data(data_dir, **keys):
        return resolve_run_config(load_config(None, dict(dataset='cifar10', data_dir=data_dir, model_kwargs=TINY32,
                                                         output=str(tmp_path / 'r'), **keys))).data
    for keys in (dict(train_subset=1000, val_subset=300), dict(val_split_fraction=0.0, val_subset=999)):
        real, absent = data(cifar_dir, **keys), data(str(tmp_path / 'nowhere'), **keys)
        splits = ('train', 'val', 'test') if real.val_split_fraction else ('train', 'val')
        assert [split_size(absent, s, 0) for s in splits] == [len(build_dataset(real, s, 0)) for s in splits]
    with pytest.raises(FileNotFoundError, match='nowhere is not a folder'):
        build_dataset(absent, 'train', 0)


def test_cifar10_reads_class_folders_and_torchvisions_batches_alike(cifar_dir, tmp_path):
    """The same images from an extracted folder (``train/``, ``test/``) and from torchvision's pickled batches that
    this test writes in that format (the original files' protocol and ``latin1`` strings)."""
    images, labels = cifar10.load_cifar10('test', cifar_dir)
    keep = np.concatenate([np.flatnonzero(labels == c)[:3] for c in range(10)])
    with tarfile.open(os.path.join(cifar_dir, 'val.tar')) as archive:
        names = sorted(m.name for m in archive if m.isfile())
        for split in ('train', 'test'):
            for k in keep:
                os.makedirs(tmp_path / 'folder' / split / names[k].split('/')[0], exist_ok=True)
                with archive.extractfile(names[k]) as f, open(tmp_path / 'folder' / split / names[k], 'wb') as g:
                    g.write(f.read())
    folder_images, folder_labels = cifar10.load_cifar10('test', str(tmp_path / 'folder'))
    assert np.array_equal(folder_images, images[keep]) and np.array_equal(folder_labels, labels[keep])

    batches = tmp_path / 'batches' / 'cifar-10-batches-py'
    batches.mkdir(parents=True)
    rows = images[keep].transpose(0, 3, 1, 2).reshape(len(keep), -1)  # the original's [N, 3072] channel planes
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
        with open(batches / name, 'wb') as f:
            pickle.dump({b'batch_label': b'x', b'labels': labels[keep].tolist(), b'data': rows,
                         b'filenames': [b'a.png'] * len(keep)}, f, protocol=2)
    for split, batches in (('train', 5), ('test', 1)):
        got_images, got_labels = cifar10.load_cifar10(split, str(tmp_path / 'batches'))
        assert np.array_equal(got_images, np.concatenate([images[keep]] * batches))
        assert np.array_equal(got_labels, np.tile(labels[keep], batches))


def test_cifar10_refuses_a_batch_file_that_would_run_code(tmp_path):
    class Planted:
        def __reduce__(self):
            return (os.system, (f'touch {tmp_path / "ran"}',))
    folder = tmp_path / 'cifar-10-batches-py'
    folder.mkdir()
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
        with open(folder / name, 'wb') as f:
            pickle.dump({'data': Planted(), 'labels': [0]}, f, protocol=2)
    with pytest.raises(UsageError, match=r'data_batch_1 is not a CIFAR-10 batch file .*posix.system'):
        cifar10.load_cifar10('train', str(tmp_path))
    assert not (tmp_path / 'ran').exists()


def test_cifar10_without_its_files_says_where_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match='train.tar and val.tar .*cifar-10-batches-py.*download: true'):
        cifar10.load_cifar10('train', str(tmp_path))
    with pytest.raises(FileNotFoundError, match='dataset cifar10 needs data_dir'):
        cifar10.load_cifar10('train', None)


def test_cifar10_trains_from_the_archives_with_a_ten_way_head(cifar_dir, tmp_path, capsys):
    out = tmp_path / 'run'
    rc = train_main(['--config', 'cifar10/quick', '--data_dir', cifar_dir, '--model_kwargs', str(TINY32),
                     '--epochs', '1', '--train_subset', '200', '--val_subset', '100', '--batch_size', '50',
                     '--auto_augment', 'null', '--output', str(out), '--progress', 'false', '--threads', '1'])
    text = capsys.readouterr().out
    assert rc == 0 and '200 train / 100 val images' in text
    import csv
    with open(out / 'metrics.csv') as f:
        row = list(csv.DictReader(f))[-1]
    assert 0 <= float(row['test_top1']) <= 100 and float(row['top1']) < 100


def test_the_recorded_statistics_are_those_the_stats_command_wrote():
    """``CIFAR10_STATS`` rounds ``docs/cifar10/stats.csv`` (``tkvision-data-stats --dataset cifar10``) to 4 places."""
    import csv
    with open(os.path.join(os.path.dirname(__file__), '..', 'docs', 'cifar10', 'stats.csv')) as f:
        rows = list(csv.DictReader(f))
    assert [round(float(r['mean']), 4) for r in rows] == cifar10.CIFAR10_STATS['mean']
    assert [round(float(r['std']), 4) for r in rows] == cifar10.CIFAR10_STATS['std']
