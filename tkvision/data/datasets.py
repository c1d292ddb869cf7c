"""Datasets of a config's data section: Fashion-MNIST in memory, the formats timm's ``create_dataset``
knows (``folder`` = ``imagenet``, ``tar``, ``hfds/<name>``) through timm's readers, and WebDataset
shards (``wds/<name>``, :mod:`.shards`).

- ``folder`` / ``imagenet``: ``<data_dir>/train/<class>/*``, ``<data_dir>/val/<class>/*`` (timm's
  ``ReaderImageFolder``); ``tar``: ``<data_dir>/train.tar`` / ``val.tar`` holding ``<class>/<image>``
  (``ReaderImageInTar``); ``hfds/<name>``: a Hugging Face dataset, split ``train`` / ``validation``
  (``ReaderHfds``; package ``datasets``); ``wds/<name>``: shards in ``data_dir`` (package ``webdataset``).
"""
import os

from torch.utils.data import Dataset, Subset

from .fashion_mnist import ArrayDataset, load_fashion_mnist
from .loader import SeededDataset
from .readers import ReaderDataset, check_same_classes, create_split_reader
from .shards import ShardStream, read_info
from .transforms import build_transform

__all__ = ['build_dataset', 'train_class_map', 'dataset_size', 'dataset_classes']


def dataset_classes(dataset) -> dict:
    """``{class name: index}`` of a dataset built by :func:`build_dataset` (None for Fashion-MNIST)."""
    while isinstance(dataset, (Subset, SeededDataset)):
        dataset = dataset.dataset
    if isinstance(dataset, ReaderDataset):
        reader = dataset.reader
        return getattr(reader, 'class_to_idx', None) or getattr(reader, 'class_name_to_idx', None)
    if getattr(dataset, 'classes', None):
        return {c: i for i, c in enumerate(dataset.classes)}
    return None


def build_dataset(data: dict, split: str, seed: int, rank: int = 0, world_size: int = 1, class_to_idx=None) -> Dataset:
    """Training (``split='train'``) or evaluation (``'val'``) dataset of the data section ``data``
    (resolved: :func:`~tkvision.data.transforms.resolve_data_cfg`); ``seed``: the run's seed.

    Fashion-MNIST's 'val' is its 10k test set. ``train_subset`` / ``val_subset`` keep the first N
    items (for quick probes and tests; Fashion-MNIST's order is class-mixed). ``class_to_idx``: the
    training split's map, which the evaluation split must share. ``rank`` / ``world_size`` matter
    for streamed shards only (each rank reads its own).

    Raises:
        FileNotFoundError: missing data, naming the path and how to get it.
        UsageError: the splits' classes differ (the classes are named).
    """
    cfg = data
    train = split == 'train'
    limit = cfg['train_subset' if train else 'val_subset']
    name = cfg['dataset']
    if name == 'fashion_mnist':
        images, labels = load_fashion_mnist('train' if train else 'test', cfg['data_dir'], cfg['download'])
        ds = ArrayDataset(images, labels, build_transform(cfg, train, seed, resize=cfg['img_size'] != images.shape[1]))
    elif not cfg['data_dir'] and not name.startswith('hfds/'):
        raise FileNotFoundError(f'dataset {name} needs data_dir (--data-dir /path/to/data with train and val)')
    elif name.startswith('wds/'):
        ds = ShardStream(cfg['data_dir'], split, build_transform(cfg, train, seed), train=train,
                         batch_size=cfg['batch_size'], num_workers=cfg['num_workers'], rank=rank, world=world_size,
                         seed=seed, limit=limit)
        if class_to_idx is not None and ds.classes:
            counts = read_info(cfg['data_dir'])['splits']
            check_same_classes(counts['train']['class_counts'], counts[split]['class_counts'], cfg['data_dir'])
        return ds
    else:
        ds = ReaderDataset(create_split_reader(cfg, split, class_to_idx), build_transform(cfg, train, seed))
    return Subset(ds, range(min(limit, len(ds)))) if limit else ds


def train_class_map(data: dict):
    """For the data section ``data``, the training split's ``{class: index}`` without reading it whole (for evaluation alone): the
    sorted class folders of ``<data_dir>/train``, or a shard manifest's class list; None otherwise."""
    cfg = data
    if cfg['dataset'] in ('folder', 'imagenet') and cfg['data_dir'] and os.path.isdir(os.path.join(cfg['data_dir'], 'train')):
        names = sorted(e.name for e in os.scandir(os.path.join(cfg['data_dir'], 'train')) if e.is_dir())
        return {c: i for i, c in enumerate(names)}
    if cfg['dataset'].startswith('wds/'):
        names = read_info(cfg['data_dir']).get('classes')
        return {c: i for i, c in enumerate(names)} if names else None
    return None


def dataset_size(dataset) -> int:
    """Images in one epoch of ``dataset`` over all ranks (a stream's ``num_samples``)."""
    return getattr(dataset, 'num_samples', None) or len(dataset)
