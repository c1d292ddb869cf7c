"""Datasets of a config's data section, each kind read by the data source registered under its name
(``tkvision.data.registry``; a new source is one ``register_data_source`` call): Fashion-MNIST and CIFAR-10
(``cifar10``: `tkvision.data.cifar10`) in memory, the
formats timm's ``create_dataset`` knows (``folder`` = ``imagenet``, ``tar``, ``hfds/<name>``) through timm's
readers, and WebDataset shards (``wds/<name>``, `shards`).

- ``folder`` / ``imagenet``: ``<data_dir>/train/<class>/*``, ``<data_dir>/val/<class>/*`` (timm's
  ``ReaderImageFolder``); ``tar``: ``<data_dir>/train.tar`` / ``val.tar`` holding ``<class>/<image>``
  (``ReaderImageInTar``); ``hfds/<name>``: a Hugging Face dataset, split ``train`` / ``validation``
  (``ReaderHfds``; package ``datasets``); ``wds/<name>``: shards in ``data_dir`` (package ``webdataset``).

**Validation and test.** Choices (best checkpoint, recipe, sweep winner) are made on a validation
split; a test split is evaluated once, at the end. With ``val_split_fraction`` > 0 the validation
split is carved from the training images (stratified, the same images for every run and seed:
`holdout_indices`) and the dataset's own evaluation split (Fashion-MNIST's 10k test images, a
folder's ``val/``) becomes the test split. Fashion-MNIST's default is 1/6: 10,000 of its 60,000
training images (1,000 per class) validate, 50,000 train; CIFAR-10's is 1/10: 5,000 of its 50,000 (500 per
class) validate, 45,000 train, and its 10,000 test images are the test split. With 0 the dataset's own evaluation split
validates and there is no test split (ImageNet's convention: its ``val/`` is what papers report).
"""
import os
import tarfile
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
from torch.utils.data import Dataset, Subset

from .config import DataConfig
from ..utils.errors import ConfigError, UsageError
from ..utils.seeding import derive_seed
from .cifar10 import CIFAR10_CLASSES, CIFAR10_STATS, CIFAR10_VAL_FRACTION, load_cifar10
from .fashion_mnist import (FASHION_MNIST_CLASSES, FASHION_MNIST_STATS, FASHION_MNIST_VAL_FRACTION, ArrayDataset,
                            load_fashion_mnist)
from .loader import SeededDataset
from .registry import DataSource, data_source, data_source_names, register_data_source
from .readers import ReaderDataset, check_same_classes, create_split_reader, data_root
from .shards import ShardStream, read_info
from .transforms import build_transform

__all__ = ['build_dataset', 'holdout_indices', 'stratified_subset', 'dataset_labels', 'has_test_split',
           'train_class_map', 'default_num_classes', 'data_source_of', 'dataset_size', 'dataset_classes', 'split_size']

SPLITS = ('train', 'val', 'test')


def dataset_classes(dataset: Dataset) -> Optional[Dict[str, int]]:
    """``{class name: index}`` of a dataset built by `build_dataset` (None for Fashion-MNIST)."""
    while isinstance(dataset, (Subset, SeededDataset)):
        dataset = dataset.dataset
    if isinstance(dataset, ReaderDataset):
        reader = dataset.reader
        return getattr(reader, 'class_to_idx', None) or getattr(reader, 'class_name_to_idx', None)
    classes = getattr(dataset, 'classes', None)  # a shard stream's class list
    if classes:
        return {c: i for i, c in enumerate(classes)}
    return None


def holdout_indices(labels: Union[Sequence[int], np.ndarray], fraction: float) -> Tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)`` of a stratified hold-out: of each class's images, ``round(fraction * n)``
    validate, chosen by a generator seeded from ``('val_split',)`` alone, so every run and seed holds out
    the same images. Both index arrays are sorted (int64).

    Raises:
        ConfigError: a class would keep no training image, or give no validation image (named).
    """
    classes = np.asarray(labels)
    rng = np.random.default_rng(derive_seed('val_split'))
    held = []
    for c in np.unique(classes):
        members = np.flatnonzero(classes == c)
        k = int(round(fraction * len(members)))
        if k == 0 or k == len(members):
            raise ConfigError(f'val_split_fraction {fraction} leaves class {c} ({len(members)} images) with '
                              f'{k} validation images: choose a fraction that holds out at least one and keeps one')
        held.append(rng.permutation(members)[:k])
    val = np.sort(np.concatenate(held))
    return np.setdiff1d(np.arange(len(classes)), val), val


def stratified_subset(labels: Union[Sequence[int], np.ndarray], size: int) -> np.ndarray:
    """Indices (sorted, int64) of ``size`` of the items whose classes are ``labels``, each class in proportion to
    its share and every class kept: the items of each class are put in an order drawn by a generator seeded from
    ``('subset',)`` alone, and the k-th item of a class of n ranks at k / n among all; the ``size`` first ranks are
    taken (ties by index). Every run and seed draws the same items, and a larger subset holds a smaller one.
    ``size`` at least the number of items gives them all.

    Raises:
        ValueError: ``size`` is smaller than the number of classes (one item of each could not be kept).
    """
    classes = np.asarray(labels)
    if size >= len(classes):
        return np.arange(len(classes), dtype=np.int64)
    present = np.unique(classes)
    if size < len(present):
        raise ValueError(f'a subset of {size} cannot keep each of the {len(present)} classes: give at least '
                         f'{len(present)}')
    rng = np.random.default_rng(derive_seed('subset'))
    rank = np.empty(len(classes), dtype=np.float64)
    for c in present:
        members = rng.permutation(np.flatnonzero(classes == c))
        rank[members] = np.arange(len(members)) / len(members)
    return np.sort(np.argsort(rank, kind='stable')[:size]).astype(np.int64)


def dataset_labels(dataset: Dataset) -> np.ndarray:
    """The class index of every item of a map-style ``dataset`` built by `build_dataset` (or a ``Subset`` of one, or
    any dataset with torchvision's ``targets`` attribute), read without decoding an image.

    Raises:
        UsageError: a dataset that says nothing of its labels, naming its type and what to add.
    """
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[np.asarray(dataset.indices, dtype=np.int64)]
    if isinstance(dataset, ArrayDataset):
        return np.asarray(dataset.labels)
    if isinstance(dataset, ReaderDataset):
        return np.asarray(_reader_labels(dataset.reader))
    targets = getattr(dataset, 'targets', None)
    if targets is not None:
        return np.asarray(targets)
    raise UsageError(f'a {type(dataset).__name__} does not say its labels, which a stratified train_subset or '
                     'val_subset is drawn by: give it a `targets` attribute (a label per item, as torchvision\'s '
                     'datasets have), or leave the subset keys null')


def _subset(ds: Dataset, limit: Optional[int], key: str) -> Dataset:
    """``ds`` itself, or its stratified subset of ``limit`` items (`stratified_subset`) for the data key ``key``."""
    if not limit or limit >= len(ds):  # type: ignore[arg-type]  # map-style: __len__
        return ds
    labels = dataset_labels(ds)
    try:
        chosen = stratified_subset(labels, limit)
    except ValueError as e:
        raise ConfigError(f'{key} {limit}: {e}') from None
    return Subset(ds, chosen.tolist())


def has_test_split(data: DataConfig) -> bool:
    """Whether the data section ``data`` has a test split (its validation split is carved from train)."""
    return bool(data.val_split_fraction)


def _reader_labels(reader) -> list:
    """The class index of every image of a timm reader, without decoding images."""
    if getattr(reader, 'targets', None) is not None:
        return list(reader.targets)
    if getattr(reader, 'samples', None) is not None:
        return [target for _, target in reader.samples]
    return list(reader.dataset[reader.label_key])  # Hugging Face: one column read


def _array_source(load: Callable[..., Tuple[np.ndarray, np.ndarray]],
                  classes: Sequence[str]) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """The ``split`` and ``carve`` functions of an in-memory source: ``load(split, data_dir, download)`` gives
    ``(images uint8 [N, H, W(, C)], labels)`` of its ``'train'`` and ``'test'`` splits; ``classes`` in label order."""
    def split(data: DataConfig, split: str, seed: int, class_to_idx, rank: int, world_size: int):
        images, labels = load('train' if split == 'train' else 'test', data.data_dir, data.download)
        transform = build_transform(data, split == 'train', seed, resize=data.img_size != images.shape[1])
        return ArrayDataset(images, labels, transform, classes=classes)

    def carve(data: DataConfig, train: bool, seed: int, class_to_idx):
        images, labels = load('train', data.data_dir, data.download)
        transform = build_transform(data, train, seed, resize=data.img_size != images.shape[1])
        return ArrayDataset(images, labels, transform, classes=classes), labels.tolist()
    return split, carve


def _reader_split(data: DataConfig, split: str, seed: int, class_to_idx, rank: int, world_size: int):
    return ReaderDataset(create_split_reader(data, split, class_to_idx), build_transform(data, split == 'train', seed))


def _reader_carve(data: DataConfig, train: bool, seed: int, class_to_idx):
    reader = create_split_reader(data, 'train', class_to_idx if not train else None)
    return ReaderDataset(reader, build_transform(data, train, seed)), _reader_labels(reader)


def _folder_classes(data: DataConfig) -> Optional[Dict[str, int]]:
    root = data.data_dir
    if root and os.path.isdir(os.path.join(root, 'train')):
        names = sorted(e.name for e in os.scandir(os.path.join(root, 'train')) if e.is_dir())
        return {c: i for i, c in enumerate(names)}
    return None


def _tar_classes(data: DataConfig) -> Optional[Dict[str, int]]:
    """The classes of ``<data_dir>/train.tar`` (``<class>/<image>`` members) from its headers alone, sorted as timm's
    tar reader sorts them (about 1.6 s for CIFAR-10's 50,000 members)."""
    path = os.path.join(data.data_dir or '', 'train.tar')
    if not (data.data_dir and os.path.isfile(path)):
        return None
    with tarfile.open(path) as archive:
        names = {m.name.removeprefix('./').split('/')[0] for m in archive if m.isfile() and '/' in m.name}
    return {c: i for i, c in enumerate(sorted(names))} or None


def _shard_split(data: DataConfig, split: str, seed: int, class_to_idx, rank: int, world_size: int):
    train = split == 'train'
    ds = ShardStream(data_root(data), split, build_transform(data, train, seed), train=train,
                     batch_size=data.batch_size, num_workers=data.num_workers, rank=rank,
                     world=world_size, seed=seed, limit=data.train_subset if train else data.val_subset)
    if class_to_idx is not None and ds.classes:
        counts = read_info(data_root(data))['splits']
        check_same_classes(counts['train']['class_counts'], counts[split]['class_counts'], data_root(data))
    return ds


def _shard_classes(data: DataConfig) -> Optional[Dict[str, int]]:
    listed = read_info(data_root(data)).get('classes')
    return {c: i for i, c in enumerate(listed)} if listed else None


#: The built-in sources (``tkvision.data.registry``): Fashion-MNIST and CIFAR-10 in memory, timm's readers,
#: WebDataset shards.
#: The class counts are the published splits': Fashion-MNIST 6,000 / 1,000 a class
#: (https://github.com/zalandoresearch/fashion-mnist), CIFAR-10 5,000 / 1,000
#: (https://www.cs.toronto.edu/~kriz/cifar.html); tests/test_cifar10.py holds split_size equal to the images read.
register_data_source('fashion_mnist', DataSource(*_array_source(load_fashion_mnist, FASHION_MNIST_CLASSES),
                                                 needs_data_dir=False, num_classes=10, channels=1,
                                                 image_settings=FASHION_MNIST_STATS,
                                                 val_split_fraction=FASHION_MNIST_VAL_FRACTION,
                                                 class_counts={'train': (6000,) * 10, 'test': (1000,) * 10}))
register_data_source('cifar10', DataSource(*_array_source(load_cifar10, CIFAR10_CLASSES), needs_data_dir=False,
                                           num_classes=10, channels=3, image_settings=CIFAR10_STATS,
                                           val_split_fraction=CIFAR10_VAL_FRACTION,
                                           class_counts={'train': (5000,) * 10, 'test': (1000,) * 10}))
for _name in ('folder', 'imagenet'):
    register_data_source(_name, DataSource(_reader_split, _reader_carve, class_map=_folder_classes))
register_data_source('tar', DataSource(_reader_split, _reader_carve, class_map=_tar_classes))
register_data_source('hfds', DataSource(_reader_split, _reader_carve, needs_data_dir=False, prefix=True))
register_data_source('wds', DataSource(_shard_split, None, class_map=_shard_classes, prefix=True))


def _source(data: DataConfig) -> DataSource:
    source = data_source(data.dataset)
    if source is None:
        raise ConfigError(f"dataset {data.dataset!r}: no data source reads it; registered: "
                          f"{', '.join(data_source_names())} (tkvision.data.registry)")
    return source


def _carve(data: DataConfig, split: str, seed: int, class_to_idx):
    """The ``split`` of a dataset whose validation split is carved from its training images."""
    source = _source(data)
    if source.carve is None:
        raise ConfigError(f'val_split_fraction: shards ({data.dataset}) are streamed and cannot be split here; write a '
                          'val split into the shards (tools/make_shards.py from a folder with train/ and val/), or '
                          'set 0')
    train = split == 'train'
    ds, classes = source.carve(data, train, seed, class_to_idx)
    train_idx, val_idx = holdout_indices(classes, data.val_split_fraction or 0.0)
    return Subset(ds, (train_idx if train else val_idx).tolist())


def build_dataset(
        data: DataConfig,
        split: str,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        class_to_idx: Optional[Dict[str, int]] = None,
) -> Dataset:
    """The ``split`` (``'train'``, ``'val'`` or ``'test'``) of the data section ``data`` (resolved:
    `resolve_data_cfg`); ``seed``: the run's seed.

    ``'val'`` is carved from the training images when ``val_split_fraction`` > 0 (the module
    docstring), else the dataset's own evaluation split; ``'test'`` exists only in the first case.
    ``train_subset`` / ``val_subset`` keep a stratified subset of N items of the training / validation split
    (`stratified_subset`: every class in its share, the same items for every run and seed; a streamed shard split
    reads its first N). ``class_to_idx``: the training
    split's map, which the evaluation splits must share. ``rank`` / ``world_size`` matter for
    streamed shards only (each rank reads its own).

    Raises:
        FileNotFoundError: missing data, naming the path and how to get it.
        UsageError: the splits' classes differ (the classes are named).
        ConfigError: an unknown split; ``'test'`` without ``val_split_fraction``; a carve-out of shards; a subset
            smaller than the number of classes.
    """
    if split not in SPLITS:
        raise ConfigError(f'split must be one of {SPLITS}, got {split!r}')
    name, source = data.dataset, _source(data)
    if not data.data_dir and source.needs_data_dir:
        raise FileNotFoundError(f'dataset {name} needs data_dir (--data-dir /path/to/data with train and val)')
    if split == 'test' and not has_test_split(data):
        raise ConfigError(f'{name} has no test split with val_split_fraction 0: its own evaluation split validates')
    if has_test_split(data) and split != 'test':
        ds = _carve(data, split, seed, class_to_idx)
    else:
        ds = source.split(data, 'train' if split == 'train' else 'val', seed, class_to_idx, rank, world_size)
    if not (hasattr(ds, '__getitem__') or hasattr(ds, '__iter__')):
        raise UsageError(f'the data source of dataset {name!r} gave no dataset for its {split!r} split (its split '
                         f'function returned {type(ds).__name__}): it must return a torch Dataset')
    if isinstance(ds, ShardStream):
        return ds
    if split == 'test':
        return ds
    return _subset(ds, data.train_subset if split == 'train' else data.val_subset, f'{split}_subset')


def train_class_map(data: DataConfig) -> Optional[Dict[str, int]]:
    """For the data section ``data``, the training split's ``{class: index}`` without reading it whole (for
    evaluation alone): the sorted class folders of ``<data_dir>/train``, or a shard manifest's class list (the
    source's ``class_map``); None otherwise."""
    return _source(data).class_map(data)


def data_source_of(data: DataConfig) -> DataSource:
    """The source that reads the data section's dataset (``tkvision.data.registry.DataSource``: its channels, the
    image settings it fixes, its classes).

    Raises:
        ConfigError: no source reads the dataset, naming the registered ones.
    """
    return _source(data)


def default_num_classes(data: DataConfig) -> int:
    """Classes of the data section's dataset when ``model_kwargs`` does not say: the source's fixed count (10 for
    Fashion-MNIST); for a class-folder dataset (``folder``, ``imagenet``) or shards with a class list, the classes
    of its training split (`train_class_map`: a 3-class folder gets a 3-way head, not ImageNet's); else 1000
    (ImageNet-1K, the timm default)."""
    source = _source(data)
    if source.num_classes is not None:
        return source.num_classes
    classes = train_class_map(data)
    return len(classes) if classes else 1000


def split_size(data: DataConfig, split: str, seed: int) -> int:
    """Images of the ``split`` of the data section ``data`` (resolved), as ``len(build_dataset(data, split, seed))``
    gives them (a stream's ``num_samples``), after the validation carve-out and ``train_subset`` / ``val_subset``.
    A published dataset (the source's ``class_counts``: Fashion-MNIST, CIFAR-10) is counted from its class counts
    alone, with no file read, so a report can count the images a config trains on a machine without the data.

    Raises:
        what `build_dataset` raises, for a source counted from its files.
    """
    counts = _source(data).class_counts
    if counts is None or split not in SPLITS or (split == 'test' and not has_test_split(data)):
        return dataset_size(build_dataset(data, split, seed))  # counted from the files, or build_dataset's error
    own = 'test' if (split == 'test' or (split == 'val' and not has_test_split(data))) else 'train'
    labels = np.repeat(np.arange(len(counts[own])), counts[own])
    if own == 'train' and has_test_split(data):
        train_idx, val_idx = holdout_indices(labels, data.val_split_fraction or 0.0)
        labels = labels[train_idx if split == 'train' else val_idx]
    limit = None if split == 'test' else (data.train_subset if split == 'train' else data.val_subset)
    return min(limit, len(labels)) if limit else len(labels)


def dataset_size(dataset: Dataset) -> int:
    """Images in one epoch of ``dataset`` over all ranks (a stream's ``num_samples``)."""
    return getattr(dataset, 'num_samples', None) or len(dataset)  # type: ignore[arg-type]  # map-style: __len__
