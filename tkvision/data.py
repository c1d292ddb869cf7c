"""Datasets, transforms and loaders for training and evaluation.

- Fashion-MNIST (Xiao et al. 2017), held in memory as uint8 arrays, read from the Debian package
  ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/*.gz``, idx format) or from
  ``data_dir``; torchvision's download only when asked (``download: true``).
- The dataset specs timm's ``create_dataset`` knows, read through timm's readers: ``folder`` (or
  ``imagenet``: ``<data_dir>/train/<class>/*``, ``<data_dir>/val/<class>/*``, timm's
  ``ReaderImageFolder``), ``tar`` (``<data_dir>/train.tar`` / ``val.tar`` holding ``<class>/<image>``,
  timm's ``ReaderImageInTar``), ``hfds/<name>`` (a Hugging Face dataset, a local folder or a
  cached one, split ``train`` / ``validation``, timm's ``ReaderHfds``; package ``datasets``), and
  ``wds/<name>`` (WebDataset shards in ``data_dir``, streamed by :mod:`tkvision.shards`; package
  ``webdataset``). On every format an image that cannot be decoded (truncated, not an image, a
  decompression bomb) is skipped and counted, never fatal. The evaluation split uses the training
  split's class-to-index map; a class present in only one split is an error naming it.
- Unset ``img_size``, ``mean``, ``std``, ``crop_pct`` and ``interpolation`` come from the model's
  ``pretrained_cfg`` through ``timm.data.resolve_data_config`` (:func:`resolve_data_cfg`), or from
  Fashion-MNIST's statistics for that dataset.

Augmentation (the MAE / MMPretrain supervised recipe, ``shared/reference/README.md``, "Recipes"):
albumentations for RandomResizedCrop (bicubic), translation and flip, timm's RandAugment
(``rand-m9-mstd0.5-inc1``) for the op albumentations lacks. Workers return **uint8** batches (a
quarter of float32's bytes through shared memory and the host-to-device copy); normalisation and
random erasing run on the device in :class:`BatchPreprocessor`, as timm's ``PrefetchLoader`` does;
mixup/cutmix and label smoothing are applied per batch in :mod:`tkvision.train` with timm's ``Mixup``.

Reproducibility: each training sample's augmentation is seeded from ``(seed, epoch, sample index)``
(:func:`sample_seed`, passed by :class:`ResumableSampler` with the index), never from a worker's
own random state, so the augmentations do not depend on ``num_workers`` and a run resumed in the
middle of an epoch sees exactly the images an uninterrupted run would.
"""
import gzip
import hashlib
import io
import os
import random

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
import timm.data
from timm.data.auto_augment import rand_augment_transform
from timm.data.random_erasing import RandomErasing
from timm.data.readers import create_reader
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, default_collate
from torch.utils.data.distributed import DistributedSampler

from .runtime import UsageError

__all__ = ['FASHION_MNIST_DIR', 'FASHION_MNIST_STATS', 'load_fashion_mnist', 'ArrayDataset', 'ReaderDataset',
           'build_transform', 'decode_image', 'resolve_data_cfg', 'build_dataset', 'build_loader', 'set_loader_epoch',
           'batches_per_epoch', 'dataset_size', 'dataset_classes', 'train_class_map', 'collate_skip_bad', 'sample_seed', 'seed_sample', 'ResumableSampler',
           'SeededDataset', 'BatchPreprocessor']

#: Where the Debian package ``dataset-fashion-mnist`` installs the data.
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
_FMNIST_FILES = {'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
                 'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')}
#: Fashion-MNIST's image size and pixel statistics (the data keys' defaults for that dataset).
FASHION_MNIST_STATS = dict(img_size=28, mean=[0.2860], std=[0.3530], crop_pct=1.0, interpolation='bicubic')
#: Data keys resolved from the model's pretrained_cfg (or FASHION_MNIST_STATS) when null.
DATA_CFG_KEYS = ('img_size', 'mean', 'std', 'crop_pct', 'interpolation')
_BAD_IMAGE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_HOW_TO_GET_FMNIST = ('install it with `apt-get update && apt-get install -y dataset-fashion-mnist` '
                      f'(files under {FASHION_MNIST_DIR}), pass --data-dir with the four idx files, '
                      'or set download: true to use torchvision\'s download')


def _read_idx(path: str) -> np.ndarray:
    """Read an idx file (optionally gzipped): big-endian header, then uint8 data."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], 'big') for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(split: str = 'train', data_dir=None, download: bool = False):
    """Fashion-MNIST ``split`` ('train': 60k, 'test': 10k) as ``(images uint8 [N, 28, 28], labels int64 [N])``.

    Looks in ``data_dir`` (if given), then :data:`FASHION_MNIST_DIR`, for the idx files, plain or
    ``.gz``. With ``download`` and nothing found, uses torchvision's ``FashionMNIST(download=True)``
    into ``data_dir`` (or ``./data``).

    Raises:
        FileNotFoundError: the files are not found, naming the paths searched and how to get them.
        ValueError: unknown split.
    """
    if split not in _FMNIST_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    searched = [d for d in (data_dir, FASHION_MNIST_DIR) if d]
    for d in searched:
        paths = []
        for name in _FMNIST_FILES[split]:
            found = [p for p in (os.path.join(d, name), os.path.join(d, name + '.gz')) if os.path.isfile(p)]
            paths.append(found[0] if found else None)
        if all(paths):
            return _read_idx(paths[0]).copy(), _read_idx(paths[1]).astype(np.int64)
    if download:
        from torchvision.datasets import FashionMNIST
        ds = FashionMNIST(data_dir or 'data', train=split == 'train', download=True)
        return ds.data.numpy(), ds.targets.numpy().astype(np.int64)
    raise FileNotFoundError(f'Fashion-MNIST {split} files {_FMNIST_FILES[split]} not found in '
                            f'{" or ".join(searched)}: {_HOW_TO_GET_FMNIST}')


class ArrayDataset(Dataset):
    """In-memory images ``uint8 [N, H, W]`` or ``[N, H, W, C]`` with labels; items are
    ``(transform(image) [C, H, W] float32, label int)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform=None):
        self.images = images if images.ndim == 4 else images[..., None]
        self.labels, self.transform = labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(image=self.images[i])['image'], int(self.labels[i])


try:
    import simplejpeg
except ImportError:  # optional: PIL decodes everything, ~1.6x slower on JPEGs (docs/data.md)
    simplejpeg = None


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes -> uint8 RGB array ``[H, W, 3]``.

    JPEGs go through ``simplejpeg`` (libjpeg-turbo, accurate DCT and upsampling: the same pixels as
    PIL's decoder, measured 1.6x faster in docs/data.md) when it is installed, everything else
    through PIL. Images over twice PIL's ``MAX_IMAGE_PIXELS`` are refused as PIL refuses them.

    Raises:
        OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError: undecodable bytes
        (the datasets catch these, skip the image and count it).
    """
    if simplejpeg is not None and data[:2] == b'\xff\xd8':
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        if Image.MAX_IMAGE_PIXELS and height * width > 2 * Image.MAX_IMAGE_PIXELS:
            raise Image.DecompressionBombError(f'{height} x {width} pixels: a decompression bomb?')
        return simplejpeg.decode_jpeg(data, colorspace='RGB')
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert('RGB'))


class ReaderDataset(Dataset):
    """A map-style dataset over a timm reader (``timm.data.readers.create_reader``: image folder, tar,
    Hugging Face dataset): items are ``(transform(image) [C, H, W] uint8, label)``, or ``('bad', name)``
    for an image that cannot be decoded, which :func:`collate_skip_bad` drops and counts.

    Attributes:
        reader: the timm reader (``class_to_idx``, ``filename(i)``).
    """

    def __init__(self, reader, transform=None):
        self.reader, self.transform = reader, transform

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        source, label = self.reader[i][:2]
        try:
            with source:
                image = decode_image(source.read())
        except _BAD_IMAGE:
            return ('bad', str(self.reader.filename(i)))
        return self.transform(image=image)['image'], label


def collate_skip_bad(batch):
    """Collate ``(image, label)`` pairs, dropping ``('bad', path)`` items.

    Returns:
        ``(images [B', C, H, W], labels [B'], bad_paths list[str])``; ``images`` is None when
        every item of the batch was unreadable.
    """
    bad = [item[1] for item in batch if isinstance(item[0], str)]
    good = [item for item in batch if not isinstance(item[0], str)]
    if not good:
        return None, None, bad
    images, labels = default_collate(good)
    return images, labels, bad


class _PILOp:
    """A PIL-image transform applied to uint8 HWC arrays (picklable, for DataLoader workers)."""

    def __init__(self, op):
        self.op = op

    def __call__(self, img, **_):
        return np.asarray(self.op(Image.fromarray(img)))


#: RandAugment magnitude cap: timm clips the noisy magnitude (m9, mstd 0.5) to 10, where its increasing
#: Posterize keeps 4 - int(10 / 10 * 4) = 0 bits, which Pillow >= 11 rejects (ValueError) about once in
#: 40 Posterize draws. Capping just below 10 keeps >= 1 bit and changes the other ops by <= 0.1%.
RAND_AUGMENT_MAGNITUDE_MAX = 9.99


def _rand_augment_op(config_str: str, img_size: int, mean):
    """timm's RandAugment (PIL) as an albumentations op on uint8 HWC arrays (see RAND_AUGMENT_MAGNITUDE_MAX)."""
    hparams = dict(translate_const=int(img_size * 0.45), img_mean=tuple(round(255 * m) for m in mean))
    if 'mmax' not in config_str:
        hparams['magnitude_max'] = RAND_AUGMENT_MAGNITUDE_MAX
    ra = rand_augment_transform(config_str, hparams)
    return A.Lambda(image=_PILOp(ra), name='rand_augment')


_CV2_INTERPOLATION = {'bicubic': cv2.INTER_CUBIC, 'bilinear': cv2.INTER_LINEAR, 'nearest': cv2.INTER_NEAREST,
                      'area': cv2.INTER_AREA, 'lanczos': cv2.INTER_LANCZOS4}


def _interpolations(name: str, train: bool) -> list:
    """cv2 codes for ``name``; timm's 'random' is bilinear or bicubic drawn per image (bicubic at eval)."""
    if name == 'random':
        return [cv2.INTER_LINEAR, cv2.INTER_CUBIC] if train else [cv2.INTER_CUBIC]
    if name not in _CV2_INTERPOLATION:
        raise ValueError(f"interpolation must be one of {', '.join(list(_CV2_INTERPOLATION) + ['random'])}, got {name!r}")
    return [_CV2_INTERPOLATION[name]]


def build_transform(cfg: dict, train: bool, resize: bool = True) -> A.Compose:
    """albumentations pipeline of ``cfg``: uint8 HWC array -> uint8 tensor ``[C, img_size, img_size]``.

    Train: RandomResizedCrop(img_size, rrc_scale, interpolation) → random translation
    (``crop_padding`` > 0: zero-pad each side by ``crop_padding`` px and RandomCrop img_size back,
    i.e. a uniform shift of up to ``crop_padding`` px per axis, as torchvision's
    ``RandomCrop(padding=...)``) → HorizontalFlip(hflip) → RandAugment(auto_augment) → tensor.
    Eval: resize the short side to img_size / crop_pct, center crop img_size (as timm's eval
    transform for a model's ``pretrained_cfg``) → tensor. ``resize=False`` (data already at img_size,
    e.g. Fashion-MNIST) skips crop and resize when ``rrc_scale`` is null. Normalisation and random
    erasing are not here: :class:`BatchPreprocessor` applies them on the device.

    Raises:
        ValueError: an unknown ``interpolation`` (the message lists the valid names).
    """
    cfg = resolve_data_cfg(cfg)
    size, mean = cfg['img_size'], tuple(cfg['mean'])
    interps = _interpolations(cfg['interpolation'], train)

    def one_of(make):  # 'random' interpolation: one op per mode, one drawn per image
        ops = [make(i) for i in interps]
        return ops[0] if len(ops) == 1 else A.OneOf(ops, p=1.0)
    ops = []
    if train:
        if cfg['rrc_scale']:
            ops.append(one_of(lambda i: A.RandomResizedCrop((size, size), scale=tuple(cfg['rrc_scale']), interpolation=i)))
        elif resize:
            ops.append(one_of(lambda i: A.Resize(size, size, interpolation=i)))
        if cfg['crop_padding']:
            pad = size + 2 * cfg['crop_padding']
            ops += [A.PadIfNeeded(pad, pad, border_mode=cv2.BORDER_CONSTANT, fill=0),
                    A.RandomCrop(size, size)]
        if cfg['hflip']:
            ops.append(A.HorizontalFlip(p=cfg['hflip']))
        if cfg['auto_augment']:
            ops.append(_rand_augment_op(cfg['auto_augment'], size, mean))
    elif resize:
        ops += [A.SmallestMaxSize(max_size=int(size / cfg['crop_pct']), interpolation=interps[0]),
                A.CenterCrop(size, size)]
    ops.append(ToTensorV2())
    return A.Compose(ops, seed=cfg['seed'])


class BatchPreprocessor:
    """Device-side step of the input pipeline: uint8 ``[B, C, H, W]`` → normalised float32, then
    (training) timm's ``RandomErasing(mode='pixel')``, which fills each erased box with per-pixel
    N(0, 1) noise in normalised space, as timm's and MAE's recipes do.

    Args:
        mean, std: per-channel values in [0, 1] units (timm's ``IMAGENET_DEFAULT_MEAN`` style).
        reprob: random-erasing probability per image (0: off).
        device: where the batches are processed (copies are non-blocking from pinned memory).
    """

    def __init__(self, mean, std, device, reprob: float = 0.0):
        self.device = torch.device(device)
        self.mean = torch.tensor(mean, device=self.device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=self.device).view(1, -1, 1, 1) * 255
        self.erase = (RandomErasing(reprob, mode='pixel', device=self.device.type) if reprob else None)

    def __call__(self, images: torch.Tensor, train: bool = False) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
        return self.erase(x) if (train and self.erase is not None) else x


def resolve_data_cfg(cfg: dict) -> dict:
    """``cfg`` with every null data key (:data:`DATA_CFG_KEYS`) filled in: from
    :data:`FASHION_MNIST_STATS` for Fashion-MNIST, else from the model's ``pretrained_cfg`` with
    ``timm.data.resolve_data_config`` (the model is built on the meta device: no memory, no weights);
    ``img_size`` from ``model_kwargs['img_size']`` when given. Keys the config sets are kept."""
    unset = [k for k in DATA_CFG_KEYS if cfg[k] is None]
    if not unset:
        return cfg
    if cfg['dataset'] == 'fashion_mnist':
        found = dict(FASHION_MNIST_STATS, img_size=cfg['model_kwargs'].get('img_size', 28))
    else:
        from .runtime import build_model
        with torch.device('meta'):
            model = build_model(cfg)
        dc = timm.data.resolve_data_config(args={}, model=model)
        found = dict(img_size=cfg['model_kwargs'].get('img_size', dc['input_size'][-1]), mean=list(dc['mean']),
                     std=list(dc['std']), crop_pct=dc['crop_pct'], interpolation=dc['interpolation'])
    return dict(cfg, **{k: found[k] for k in unset})


def _split_names(cfg, split):
    """timm's split names: Hugging Face datasets call the evaluation split 'validation'."""
    if split == 'val' and cfg['dataset'].startswith('hfds/'):
        return 'validation'
    return split


def _check_same_classes(train_classes, val_classes, where: str):
    only_train = sorted(set(train_classes) - set(val_classes))
    only_val = sorted(set(val_classes) - set(train_classes))
    if only_train or only_val:
        raise UsageError(f'{where}: the training and evaluation splits must have the same classes; '
                         + (f'only in train: {only_train}' if only_train else '')
                         + ('; ' if only_train and only_val else '')
                         + (f'only in val: {only_val}' if only_val else ''))


def _reader(cfg: dict, split: str, class_to_idx=None):
    """A timm reader for ``folder`` / ``imagenet``, ``tar`` and ``hfds/...`` datasets."""
    name, root = cfg['dataset'], cfg['data_dir']
    if name.startswith('hfds/'):
        try:
            return create_reader(name, root=root, split=_split_names(cfg, split), class_map=class_to_idx)
        except ImportError as e:
            raise ImportError('hfds/ datasets need the datasets package: pip install "tkvision[hfds]"') from e
    path = os.path.join(root, split + ('.tar' if name == 'tar' else ''))
    if not os.path.exists(path):
        layout = ('<data_dir>/train.tar and val.tar holding <class>/<image>' if name == 'tar' else
                  'ImageNet layout: <data_dir>/train/<class>/*.JPEG, <data_dir>/val/<class>/*')
        raise FileNotFoundError(f'{path} not found: expected {layout}')
    if name != 'tar' and class_to_idx is not None:
        _check_same_classes(class_to_idx, [e.name for e in os.scandir(path) if e.is_dir()], path)
    reader = create_reader('', root=path, class_map=class_to_idx if name != 'tar' else None)
    if name == 'tar' and class_to_idx is not None:
        _check_same_classes(class_to_idx, reader.class_name_to_idx, path)
        if reader.class_name_to_idx != class_to_idx:
            reader = create_reader('', root=path, class_map=class_to_idx)
    if len(reader) == 0:
        raise FileNotFoundError(f'no images found in {path}')
    return reader


def dataset_classes(ds) -> dict:
    """``{class name: index}`` of a dataset built by :func:`build_dataset` (None for Fashion-MNIST)."""
    while isinstance(ds, (Subset, SeededDataset)):
        ds = ds.dataset
    if isinstance(ds, ReaderDataset):
        reader = ds.reader
        return getattr(reader, 'class_to_idx', None) or getattr(reader, 'class_name_to_idx', None)
    if getattr(ds, 'classes', None):
        return {c: i for i, c in enumerate(ds.classes)}
    return None


def build_dataset(cfg: dict, split: str, rank: int = 0, world_size: int = 1, class_to_idx=None) -> Dataset:
    """Training (``split='train'``) or evaluation (``'val'``) dataset of ``cfg`` (data keys resolved).

    Fashion-MNIST's 'val' is its 10k test set. ``train_subset`` / ``val_subset`` keep the first N
    items (for quick probes and tests; Fashion-MNIST's order is class-mixed). ``class_to_idx``: the
    training split's map, which the evaluation split must share. ``rank`` / ``world_size`` matter
    for streamed shards only (each rank reads its own).

    Raises:
        FileNotFoundError: missing data, naming the path and how to get it.
        ValueError: the splits' classes differ (the classes are named).
    """
    cfg = resolve_data_cfg(cfg)
    train = split == 'train'
    limit = cfg['train_subset' if train else 'val_subset']
    name = cfg['dataset']
    if name == 'fashion_mnist':
        images, labels = load_fashion_mnist('train' if train else 'test', cfg['data_dir'], cfg['download'])
        ds = ArrayDataset(images, labels, build_transform(cfg, train, resize=cfg['img_size'] != images.shape[1]))
    elif not cfg['data_dir'] and not name.startswith('hfds/'):
        raise FileNotFoundError(f'dataset {name} needs data_dir (--data-dir /path/to/data with train and val)')
    elif name.startswith('wds/'):
        from .shards import ShardStream
        ds = ShardStream(cfg['data_dir'], split, build_transform(cfg, train), train=train,
                         batch_size=cfg['batch_size'], num_workers=cfg['num_workers'], rank=rank, world=world_size,
                         seed=cfg['seed'], limit=limit)
        if class_to_idx is not None and ds.classes:
            from .shards import read_info
            counts = read_info(cfg['data_dir'])['splits']
            _check_same_classes(counts['train']['class_counts'], counts[split]['class_counts'], cfg['data_dir'])
        return ds
    else:
        ds = ReaderDataset(_reader(cfg, split, class_to_idx), build_transform(cfg, train))
    return Subset(ds, range(min(limit, len(ds)))) if limit else ds


def train_class_map(cfg: dict):
    """The training split's ``{class: index}`` without reading it whole (for evaluation alone): the
    sorted class folders of ``<data_dir>/train``, or a shard manifest's class list; None otherwise."""
    if cfg['dataset'] in ('folder', 'imagenet') and cfg['data_dir'] and os.path.isdir(os.path.join(cfg['data_dir'], 'train')):
        names = sorted(e.name for e in os.scandir(os.path.join(cfg['data_dir'], 'train')) if e.is_dir())
        return {c: i for i, c in enumerate(names)}
    if cfg['dataset'].startswith('wds/'):
        from .shards import read_info
        names = read_info(cfg['data_dir']).get('classes')
        return {c: i for i, c in enumerate(names)} if names else None
    return None


def dataset_size(ds) -> int:
    """Images in one epoch of ``ds`` over all ranks (a stream's ``num_samples``)."""
    return getattr(ds, 'num_samples', None) or len(ds)


def sample_seed(seed: int, epoch: int, index) -> int:
    """32-bit seed of one sample's augmentation: a hash of ``(seed, epoch, index)``, so it depends
    on nothing else (not on the worker, nor on how many samples came before)."""
    digest = hashlib.blake2b(f'{seed}/{epoch}/{index}'.encode(), digest_size=4).digest()
    return int.from_bytes(digest, 'little')


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (disjoint per-rank shards, reshuffled per epoch from ``seed``) that yields
    ``(index, sample_seed)`` pairs for :class:`SeededDataset` and can start an epoch part-way.

    ``set_epoch(epoch, start=k)`` skips the first ``k`` samples of this rank's order for that epoch
    (a resumed run skips the batches it already consumed); the next ``set_epoch`` starts from 0.
    """

    def __init__(self, dataset, num_replicas=1, rank=0, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0):
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self):
        order = list(super().__iter__())[self.start:]
        return iter([(i, sample_seed(self.seed, self.epoch, i)) for i in order])

    def __len__(self):
        return self.num_samples - self.start


def seed_sample(transform, seed: int, epoch: int, index):
    """Seed one sample's augmentation from (seed, epoch, index): albumentations' generators of
    ``transform`` and Python's / NumPy's global ones, which timm's RandAugment draws from."""
    _seed_transform(transform, sample_seed(seed, epoch, index))


def _seed_transform(transform, seed: int):
    random.seed(seed)
    np.random.seed(seed)
    transform.set_random_seed(seed)


class SeededDataset(Dataset):
    """Wraps a dataset whose items take ``(index, seed)``: seeds the transform (albumentations'
    generators, and Python's / NumPy's global ones that timm's RandAugment draws from) before
    reading item ``index``. Items are those of the wrapped dataset."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, seed = key
        ds = self.dataset
        while hasattr(ds, 'dataset'):
            ds = ds.dataset
        _seed_transform(ds.transform, seed)
        return self.dataset[index]


def build_loader(ds: Dataset, cfg: dict, train: bool, rank: int = 0, world_size: int = 1) -> DataLoader:
    """DataLoader of ``ds`` yielding ``(uint8 images [B, C, H, W], labels [B], bad_paths)``.

    Training: :class:`ResumableSampler` over :class:`SeededDataset` (order and augmentation depend
    only on seed, epoch and sample index: exact resume, any ``num_workers``), incomplete last batch
    dropped; a shard stream orders itself (:mod:`tkvision.shards`). Evaluation: each rank takes
    items ``rank::world_size`` (a stream: its own shards) so summed metrics count every item once.
    Pinned memory on CUDA for non-blocking copies; workers persist across epochs for map-style data
    (a stream's workers restart each epoch to learn the epoch).
    """
    workers = cfg['num_workers']
    if isinstance(ds, IterableDataset):
        return DataLoader(ds, batch_size=cfg['batch_size'], num_workers=workers, collate_fn=collate_skip_bad,
                          drop_last=train, pin_memory=torch.cuda.is_available())
    if train:
        sampler, ds = ResumableSampler(ds, num_replicas=world_size, rank=rank, seed=cfg['seed']), SeededDataset(ds)
    else:
        sampler, ds = None, Subset(ds, range(rank, len(ds), world_size))
    return DataLoader(ds, batch_size=cfg['batch_size'], sampler=sampler, shuffle=False, drop_last=train,
                      num_workers=workers, collate_fn=collate_skip_bad, persistent_workers=workers > 0,
                      pin_memory=torch.cuda.is_available())


def batches_per_epoch(loader: DataLoader) -> int:
    """Training batches per rank in one epoch of a :func:`build_loader` loader."""
    if isinstance(loader.dataset, IterableDataset):
        return loader.dataset.batches_per_epoch
    return loader.sampler.num_samples // loader.batch_size


def set_loader_epoch(loader: DataLoader, epoch: int, start_batch: int = 0):
    """Make ``loader`` yield epoch ``epoch`` from its batch ``start_batch`` on (a resumed run)."""
    if isinstance(loader.dataset, IterableDataset):
        loader.dataset.set_epoch(epoch, skip_batches=start_batch)
    else:
        loader.sampler.set_epoch(epoch, start=start_batch * loader.batch_size)
