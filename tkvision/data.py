"""Datasets, transforms and loaders for training and evaluation.

- Fashion-MNIST (Xiao et al. 2017), held in memory as uint8 arrays, read from the Debian package
  ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/*.gz``, idx format) or from
  ``data_dir``; torchvision's download only when asked (``download: true``).
- ImageNet folder layout (``<data_dir>/train/<class>/*``, ``<data_dir>/val/<class>/*``) with
  unreadable images skipped and counted, never fatal.

Augmentation (the MAE / MMPretrain supervised recipe, ``shared/reference/README.md``, "Recipes"):
albumentations for RandomResizedCrop (bicubic), flip, normalisation and random erasing, timm's
RandAugment (``rand-m9-mstd0.5-inc1``) for the op albumentations lacks; mixup/cutmix and label
smoothing are applied per batch in :mod:`tkvision.train` with timm's ``Mixup``.
"""
import gzip
import os

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
from timm.data.auto_augment import rand_augment_transform
from torch.utils.data import DataLoader, Dataset, Subset, default_collate
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

__all__ = ['FASHION_MNIST_DIR', 'load_fashion_mnist', 'ArrayDataset', 'ImageFolderDataset', 'build_transform',
           'build_dataset', 'build_loader', 'collate_skip_bad']

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
        except (OSError, ValueError, SyntaxError):
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


def build_transform(cfg: dict, train: bool, resize: bool = True) -> A.Compose:
    """albumentations pipeline of ``cfg`` producing float tensors ``[C, img_size, img_size]``.

    Train: RandomResizedCrop(img_size, rrc_scale, bicubic) → random translation (``crop_padding`` > 0:
    zero-pad each side by ``crop_padding`` px and RandomCrop img_size back, i.e. a uniform shift of
    up to ``crop_padding`` px per axis, as torchvision's ``RandomCrop(padding=...)``) →
    HorizontalFlip(hflip) → RandAugment(auto_augment) → Normalize(mean, std) → Erasing(reprob) → tensor.
    Eval: resize the short side to img_size / crop_pct, center crop img_size (as timm's eval
    transform for a model's ``pretrained_cfg``) → Normalize → tensor. ``resize=False`` (data
    already at img_size, e.g. Fashion-MNIST) skips crop and resize when ``rrc_scale`` is null.
    """
    size, mean, std = cfg['img_size'], tuple(cfg['mean']), tuple(cfg['std'])
    interp = {'bicubic': cv2.INTER_CUBIC, 'bilinear': cv2.INTER_LINEAR}[cfg['interpolation']]
    ops = []
    if train:
        if cfg['rrc_scale']:
            ops.append(A.RandomResizedCrop((size, size), scale=tuple(cfg['rrc_scale']), interpolation=interp))
        elif resize:
            ops.append(A.Resize(size, size, interpolation=interp))
        if cfg['crop_padding']:
            pad = size + 2 * cfg['crop_padding']
            ops += [A.PadIfNeeded(pad, pad, border_mode=cv2.BORDER_CONSTANT, fill=0),
                    A.RandomCrop(size, size)]
        if cfg['hflip']:
            ops.append(A.HorizontalFlip(p=cfg['hflip']))
        if cfg['auto_augment']:
            ops.append(_rand_augment_op(cfg['auto_augment'], size, mean))
    elif resize:
        ops += [A.SmallestMaxSize(max_size=int(size / cfg['crop_pct']), interpolation=interp),
                A.CenterCrop(size, size)]
    ops.append(A.Normalize(mean=mean, std=std, max_pixel_value=255.0))
    if train and cfg['reprob']:
        ops.append(A.Erasing(p=cfg['reprob'], fill='random'))
    ops.append(ToTensorV2())
    return A.Compose(ops, seed=cfg['seed'])


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


def build_loader(ds: Dataset, cfg: dict, train: bool, rank: int = 0, world_size: int = 1) -> DataLoader:
    """DataLoader of ``ds``: shuffled per epoch by a ``DistributedSampler`` (also on one process, so the
    order depends only on seed and epoch: exact resume) when ``train``; for evaluation each rank takes
    items ``rank::world_size`` so summed metrics count every item once."""
    if train:
        sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg['seed'],
                                     drop_last=True)
    else:
        sampler, ds = None, Subset(ds, range(rank, len(ds), world_size))
    return DataLoader(ds, batch_size=cfg['batch_size'], sampler=sampler, shuffle=False, drop_last=train,
                      num_workers=cfg['num_workers'], collate_fn=collate_skip_bad,
                      persistent_workers=cfg['num_workers'] > 0, pin_memory=torch.cuda.is_available())
