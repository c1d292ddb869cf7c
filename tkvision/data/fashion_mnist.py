"""Fashion-MNIST (Xiao et al. 2017), held in memory as uint8 arrays, read from the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/*.gz``, idx format) or from
``data_dir``; torchvision's download only when asked (``download: true``).
"""
import gzip
import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import Dataset

from ..utils.errors import UsageError

__all__ = ['FASHION_MNIST_DIR', 'FASHION_MNIST_STATS', 'FASHION_MNIST_VAL_FRACTION', 'FASHION_MNIST_CLASSES',
           'write_image_folder', 'parse_sizes', 'load_fashion_mnist', 'ArrayDataset']

#: Where the Debian package ``dataset-fashion-mnist`` installs the data.
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
_FMNIST_FILES = {'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
                 'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte')}
#: Fashion-MNIST's image size and pixel statistics (the data keys' defaults for that dataset).
FASHION_MNIST_STATS = dict(img_size=28, mean=[0.2860], std=[0.3530], crop_pct=1.0, interpolation='bicubic')
#: Fashion-MNIST's default validation hold-out: 1/6 of the 60k training images = 10,000 (1,000 per class),
#: the size of its test set (``val_split_fraction``; `tkvision.data.datasets`).
FASHION_MNIST_VAL_FRACTION = 1 / 6
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


def load_fashion_mnist(
        split: str = 'train',
        data_dir: Optional[str] = None,
        download: bool = False,
) -> Tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` ('train': 60k, 'test': 10k) as ``(images uint8 [N, 28, 28], labels int64 [N])``.

    Looks in ``data_dir`` (if given), then `FASHION_MNIST_DIR`, for the idx files, plain or
    ``.gz``. With ``download`` and nothing found, uses torchvision's ``FashionMNIST(download=True)``
    into ``data_dir`` (or ``./data``).

    Raises:
        FileNotFoundError: ``data_dir`` does not exist, or the files are not found, naming the paths
            searched and how to get them.
        ValueError: unknown split.
    """
    if split not in _FMNIST_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if data_dir and not os.path.isdir(data_dir) and not download:
        raise FileNotFoundError(f'--data-dir {data_dir} is not a folder (for Fashion-MNIST: a folder with the four '
                                'idx files, or leave it unset to use the Debian package)')
    searched = [d for d in (data_dir, FASHION_MNIST_DIR) if d]
    for d in searched:
        paths = []
        for name in _FMNIST_FILES[split]:
            paths += [p for p in (os.path.join(d, name), os.path.join(d, name + '.gz')) if os.path.isfile(p)][:1]
        if len(paths) == len(_FMNIST_FILES[split]):
            return _read_idx(paths[0]).copy(), _read_idx(paths[1]).astype(np.int64)
    if download:
        from torchvision.datasets import FashionMNIST
        ds = FashionMNIST(data_dir or 'data', train=split == 'train', download=True)
        return ds.data.numpy(), ds.targets.numpy().astype(np.int64)
    raise FileNotFoundError(f'Fashion-MNIST {split} files {_FMNIST_FILES[split]} not found in '
                            f'{" or ".join(searched)}: {_HOW_TO_GET_FMNIST}')


class ArrayDataset(Dataset):
    """In-memory images ``uint8 [N, H, W]`` or ``[N, H, W, C]`` with labels (a NumPy array: class indices, or
    numbers for a regression); items are ``(transform(image) [C, H, W] uint8, label)`` (without a transform, the
    ``[H, W, C]`` uint8 image), the label a Python int or float.

    Attributes:
        classes: the class names in label order (what ``tkvision.data.dataset_classes`` reports), or empty.
    """

    def __init__(
            self,
            images: np.ndarray,
            labels: np.ndarray,
            transform: Optional[Callable] = None,
            classes: Sequence[str] = (),
    ):
        self.images = images if images.ndim == 4 else images[..., None]
        self.labels, self.transform, self.classes = labels, transform, tuple(classes)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple:
        label = self.labels[i].item()  # a Python int (a class), or a float (a regression's number)
        if self.transform is None:
            return self.images[i], label
        return self.transform(image=self.images[i])['image'], label


#: Fashion-MNIST's class names (Xiao et al. 2017, Table 1), in label order, as folder names.
FASHION_MNIST_CLASSES = ('t-shirt_top', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag',
                         'ankle_boot')


def parse_sizes(text: str) -> list:
    """``'32x32 48x96'`` (or ``['32x32', '48x96']``) -> ``[(32, 32), (48, 96)]``, each ``HEIGHTxWIDTH`` in px.

    Raises:
        UsageError: an item is not two positive integers joined by ``x``; the message names it.
    """
    items = text.split() if isinstance(text, str) else list(text)
    sizes = []
    for item in items:
        h, sep, w = str(item).partition('x')
        if not (sep and h.isdigit() and w.isdigit() and int(h) > 0 and int(w) > 0):
            raise UsageError(f'image size {item!r} is not HEIGHTxWIDTH in px (e.g. 48x96)')
        sizes.append((int(h), int(w)))
    if not sizes:
        raise UsageError('no image size given: pass HEIGHTxWIDTH items, e.g. 32x32 48x96')
    return sizes


def _resized(image: np.ndarray, height: int, width: int):
    """The 28 x 28 image upscaled (bicubic) to cover ``height x width`` and centre-cropped to it, as RGB."""
    from PIL import Image
    side = max(height, width)
    img = Image.fromarray(image).convert('RGB').resize((side, side), Image.Resampling.BICUBIC)
    top, left = (side - height) // 2, (side - width) // 2
    return img.crop((left, top, left + width, top + height))


def write_image_folder(
        out: str,
        size: int = 224,
        train_per_class: int = 100,
        val_per_class: int = 20,
        data_dir: Optional[str] = None,
        sizes: Optional[Sequence[Tuple[int, int]]] = None,
) -> dict:
    """Write Fashion-MNIST as an ImageNet-layout folder of RGB JPEGs (``<out>/train/<class>/*.JPEG``
    from the training images, ``<out>/val/<class>/*.JPEG`` from the test images; the first
    ``train_per_class`` / ``val_per_class`` of each class), upscaled to ``size`` px (bicubic): real
    images for the folder / ImageNet code paths (GPU end-to-end runs, benchmarks) where ImageNet is
    not reachable. The folder is written under a temporary name and renamed when complete.

    ``sizes``: a list of ``(height, width)`` in px instead of ``size``: the k-th image of each class
    gets ``sizes[k % len(sizes)]`` (upscaled to cover it, centre-cropped to its aspect ratio), so every
    class has every resolution and aspect ratio in equal share: the mixed-size folders NaFlex models
    train and are evaluated on.

    Returns:
        ``{'train': n, 'val': n}`` images written.

    Raises:
        FileExistsError: ``out`` exists (nothing is overwritten).
        FileNotFoundError: as `load_fashion_mnist`.
    """
    from ..utils.files import atomic_folder
    if os.path.exists(out):
        raise FileExistsError(f'{out} exists: choose a new folder for the Fashion-MNIST images')
    sizes = list(sizes) if sizes else [(size, size)]
    counts: Dict[str, int] = {}

    def write(tmp):
        for split, source, per_class in (('train', 'train', train_per_class), ('val', 'test', val_per_class)):
            images, labels = load_fashion_mnist(source, data_dir)
            counts[split] = 0
            for c, name in enumerate(FASHION_MNIST_CLASSES):
                folder = os.path.join(tmp, split, name)
                os.makedirs(folder)
                for k, i in enumerate(np.flatnonzero(labels == c)[:per_class]):
                    img = _resized(images[i], *sizes[k % len(sizes)])
                    img.save(os.path.join(folder, f'{source}_{i:05d}.JPEG'), quality=90)
                    counts[split] += 1
    atomic_folder(out, write)
    return counts
