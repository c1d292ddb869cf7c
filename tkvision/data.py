"""Datasets, transforms and loaders for training and evaluation.

- Fashion-MNIST (Xiao et al. 2017), held in memory as uint8 arrays, read from the Debian package
  ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/*.gz``, idx format) or from
  ``data_dir``; torchvision's download only when asked (``download: true``).
- ImageNet folder layout (``<data_dir>/train/<class>/*``, ``<data_dir>/val/<class>/*``) with
  unreadable images skipped and counted, never fatal.

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
import os
import random

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
from timm.data.auto_augment import rand_augment_transform
from timm.data.random_erasing import RandomErasing
from torch.utils.data import DataLoader, Dataset, Subset, default_collate
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

__all__ = ['FASHION_MNIST_DIR', 'load_fashion_mnist', 'ArrayDataset', 'ImageFolderDataset', 'build_transform',
           'build_dataset', 'build_loader', 'collate_skip_bad', 'sample_seed', 'ResumableSampler', 'SeededDataset',
           'BatchPreprocessor']

#: Where the Debian package ``dataset-fashion-mnist`` installs the data.
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
_FMNIST_FILES = {'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
                 'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')}
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


class ImageFolderDataset(Dataset):
    """ImageNet-style folder ``root/<class>/<image>`` (classes sorted, as torchvision's ImageFolder).

    Items are ``(transform(image) [3, H, W], label)``; an image that cannot be decoded yields
    ``('bad', path)`` instead, which :func:`collate_skip_bad` drops and counts.

    Raises:
        FileNotFoundError: ``root`` missing or without class folders / images, naming the path.
    """

    def __init__(self, root: str, transform=None):
        if not os.path.isdir(root):
            raise FileNotFoundError(f'image folder {root} not found: expected {root}/<class>/<image> '
                                    '(ImageNet layout: <data_dir>/train/<class>/*.JPEG, <data_dir>/val/<class>/*)')
        try:
            self.classes, self.class_to_idx = find_classes(root)
            self.samples = make_dataset(root, self.class_to_idx, extensions=IMG_EXTENSIONS)
        except FileNotFoundError as e:
            raise FileNotFoundError(f'{root}: {e}') from e
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        try:
            with Image.open(path) as img:
                image = np.asarray(img.convert('RGB'))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            return ('bad', path)
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


def build_dataset(cfg: dict, split: str) -> Dataset:
    """Training (``split='train'``) or evaluation (``'val'``) dataset of ``cfg``.

    Fashion-MNIST's 'val' is its 10k test set. ``train_subset`` / ``val_subset`` keep the first N
    items (for quick probes and tests; Fashion-MNIST's order is class-mixed).

    Raises:
        FileNotFoundError: missing data, naming the path and how to get it.
    """
    train = split == 'train'
    if cfg['dataset'] == 'fashion_mnist':
        images, labels = load_fashion_mnist('train' if train else 'test', cfg['data_dir'], cfg['download'])
        ds = ArrayDataset(images, labels, build_transform(cfg, train, resize=cfg['img_size'] != images.shape[1]))
    else:
        if not cfg['data_dir']:
            raise FileNotFoundError('dataset imagenet needs data_dir (--data-dir /path/to/imagenet with train/ and val/)')
        ds = ImageFolderDataset(os.path.join(cfg['data_dir'], split), build_transform(cfg, train))
    limit = cfg['train_subset' if train else 'val_subset']
    return Subset(ds, range(min(limit, len(ds)))) if limit else ds


def sample_seed(seed: int, epoch: int, index: int) -> int:
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
        random.seed(seed)
        np.random.seed(seed)
        ds = self.dataset
        while hasattr(ds, 'dataset'):
            ds = ds.dataset
        if hasattr(ds.transform, 'set_random_seed'):
            ds.transform.set_random_seed(seed)
        return self.dataset[index]


def build_loader(ds: Dataset, cfg: dict, train: bool, rank: int = 0, world_size: int = 1) -> DataLoader:
    """DataLoader of ``ds`` yielding ``(uint8 images [B, C, H, W], labels [B], bad_paths)``.

    Training: :class:`ResumableSampler` over :class:`SeededDataset` (order and augmentation depend
    only on seed, epoch and sample index: exact resume, any ``num_workers``), incomplete last batch
    dropped. Evaluation: each rank takes items ``rank::world_size`` so summed metrics count every item
    once. Pinned memory on CUDA for non-blocking copies; persistent workers.
    """
    if train:
        sampler, ds = ResumableSampler(ds, num_replicas=world_size, rank=rank, seed=cfg['seed']), SeededDataset(ds)
    else:
        sampler, ds = None, Subset(ds, range(rank, len(ds), world_size))
    return DataLoader(ds, batch_size=cfg['batch_size'], sampler=sampler, shuffle=False, drop_last=train,
                      num_workers=cfg['num_workers'], collate_fn=collate_skip_bad,
                      persistent_workers=cfg['num_workers'] > 0, pin_memory=torch.cuda.is_available())
