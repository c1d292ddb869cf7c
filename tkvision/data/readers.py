"""Reading images: decoding bytes (`decode_image`), timm's readers for ``folder`` / ``imagenet``,
``tar`` and ``hfds/...`` datasets (`create_split_reader`), the map-style `ReaderDataset`
over them, and `collate_skip_bad`, which drops and counts the images that cannot be decoded.

On every format an image that cannot be decoded (truncated, not an image, a decompression bomb) is
skipped and counted, never fatal. The evaluation split uses the training split's class-to-index
map; a class present in only one split is an error naming it.
"""
import io
import os
from typing import Callable, Dict, Iterable, Optional, Sequence

import numpy as np
from PIL import Image
from timm.data.readers import create_reader
from timm.data.readers.reader import Reader
from torch.utils.data import Dataset, default_collate

from .config import DataConfig
from ..utils.errors import UsageError

__all__ = ['BAD_IMAGE', 'decode_image', 'ReaderDataset', 'data_root', 'collate_skip_bad', 'create_split_reader',
           'check_same_classes']

#: PIL modes of 16-bit (and 32-bit integer) grey images, whose 0..65535 levels map to 0..255.
_WIDE_GREY = ('I;16', 'I;16B', 'I;16L', 'I;16N', 'I')
#: What decoding an unreadable image raises (caught, the image skipped and counted).
BAD_IMAGE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)

try:
    import simplejpeg
except ImportError:  # optional: PIL decodes everything, slower on JPEGs (docs/data.md)
    simplejpeg = None


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes -> uint8 RGB array ``[H, W, 3]``.

    16-bit grey images (PNG, TIFF) are scaled to 8 bits (level / 257), not clipped. JPEGs go through ``simplejpeg``
    (libjpeg-turbo, accurate DCT and upsampling: the same pixels as
    PIL's decoder, and faster: docs/data.md's decoder table) when it is installed, everything else
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
        if img.mode in _WIDE_GREY:  # PIL's convert('RGB') clips these at 255: rescale the 16-bit range
            grey = np.round(np.asarray(img, dtype=np.float64) / 257).clip(0, 255).astype(np.uint8)
            return np.repeat(grey[..., None], 3, axis=-1)
        return np.asarray(img.convert('RGB'))


class ReaderDataset(Dataset):
    """A map-style dataset over a timm reader (``timm.data.readers.create_reader``: image folder, tar,
    Hugging Face dataset): items are ``(transform(image) [C, H, W] uint8, label)`` (without a transform, the
    decoded ``[H, W, C]`` uint8 array), or ``('bad', name)``
    for an image that cannot be decoded, which `collate_skip_bad` drops and counts.

    Attributes:
        reader: the timm reader (``class_to_idx``, ``filename(i)``).
    """

    def __init__(self, reader: Reader, transform: Optional[Callable] = None):
        self.reader, self.transform = reader, transform

    def __len__(self) -> int:
        return len(self.reader)  # type: ignore[arg-type]  # every timm reader has __len__; its base class does not say

    def __getitem__(self, i: int) -> tuple:
        source, label = self.reader[i][:2]  # type: ignore[index]  # as above: __getitem__
        try:
            with source:
                image = decode_image(source.read())
        except BAD_IMAGE:
            return ('bad', str(self.reader.filename(i)))
        if self.transform is None:
            return image, label
        return self.transform(image=image)['image'], label


def data_root(data: DataConfig) -> str:
    """The data section's ``data_dir``, which every dataset but Fashion-MNIST and ``hfds/`` needs.

    Raises:
        FileNotFoundError: none given, saying how to give it.
    """
    if not data.data_dir:
        raise FileNotFoundError(f'dataset {data.dataset} needs data_dir (--data-dir /path/to/data with train and val)')
    return data.data_dir


def collate_skip_bad(batch: Sequence[tuple]) -> tuple:
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


def _split_names(data, split):
    """timm's split names: Hugging Face datasets call the evaluation split 'validation'."""
    if split == 'val' and data.dataset.startswith('hfds/'):
        return 'validation'
    return split


def _hfds_reader(data: DataConfig, split: str, class_to_idx=None):
    """timm's Hugging Face reader of ``split``; for the evaluation split (``class_to_idx`` given) the
    classes that images of each split carry are compared: a dataset's ``ClassLabel`` lists the union
    of its splits' classes, so comparing the maps alone misses a class only one split has.

    Raises:
        FileNotFoundError: the dataset has no such split (its splits are named).
        UsageError: the splits' images carry different classes (named).
    """
    name = _split_names(data, split)
    try:
        try:
            reader = create_reader(data.dataset, root=data.data_dir, split=name, class_map=class_to_idx)
        except ValueError as e:  # datasets: 'Unknown split "validation". Should be one of [...]'
            if 'split' not in str(e).lower():
                raise
            raise FileNotFoundError(f"{data.dataset} has no split {name!r}: {e}") from None
        if class_to_idx is not None:
            train = create_reader(data.dataset, root=data.data_dir, split='train')
            where = f"{data.dataset} (train and {name})"
            check_same_classes(_present_classes(train), _present_classes(reader), where)
    except ImportError as e:
        raise ImportError('hfds/ datasets need the datasets package: pip install "tkvision[hfds]"') from e
    return reader


def _present_classes(reader) -> list:
    """The class names that the images of a timm Hugging Face reader carry (its label column only); a label
    its ``ClassLabel`` has no name for (a class only another split lists) as ``'class <i> (unnamed)'``."""
    labels = reader.dataset.select_columns([reader.label_key]).unique(reader.label_key)
    feature = reader.dataset.features[reader.label_key]
    names = getattr(feature, 'names', None)
    if names is None:
        return sorted(str(i) for i in labels)
    return sorted(names[int(i)] if 0 <= int(i) < len(names) else f'class {int(i)} (unnamed)' for i in labels)


def _refuse_empty_classes(folder: str, class_folders: list, samples: list):
    """A class folder of ``folder`` (one split) without an image would be missing from the split's
    classes (timm's reader lists classes by their images) and then reported as a class of the other
    split only: name it here, from the images timm's reader found (``samples``: ``[(path, target)]``)."""
    holding = {os.path.relpath(path, folder).split(os.sep)[0] for path, _ in samples}
    empty = sorted(set(class_folders) - holding)
    if empty:
        split = os.path.basename(os.path.normpath(folder))
        raise UsageError(f'{split}/{empty[0]} holds no image (in {os.path.dirname(os.path.normpath(folder))}): '
                         'add images or remove the folder')


def check_same_classes(train_classes: Iterable[str], val_classes: Iterable[str], where: str) -> None:
    """Check that two splits name the same classes (their label indices depend on it).

    Args:
        train_classes: class names of each split (any iterables of str).
        val_classes: class names of each split (any iterables of str).
        where: what the message names (the data section and split) so the user knows which folder to fix.

    Raises:
        UsageError: a class is in one split only; the message lists those of each side.
    """
    only_train = sorted(set(train_classes) - set(val_classes))
    only_val = sorted(set(val_classes) - set(train_classes))
    if only_train or only_val:
        raise UsageError(f'{where}: the training and evaluation splits must have the same classes; '
                         + (f'only in train: {only_train}' if only_train else '')
                         + ('; ' if only_train and only_val else '')
                         + (f'only in val: {only_val}' if only_val else ''))


def create_split_reader(data: DataConfig, split: str, class_to_idx: Optional[Dict[str, int]] = None) -> Reader:
    """A timm reader of ``split`` for the ``folder`` / ``imagenet``, ``tar`` and ``hfds/...`` datasets of the
    data section ``data``.

    Raises:
        FileNotFoundError: the split's folder or tar is missing (the expected layout is named), or empty.
        UsageError: the split's classes differ from ``class_to_idx``'s (named).
        ImportError: ``hfds/`` without the ``datasets`` package.
    """
    name = data.dataset
    if name.startswith('hfds/'):
        return _hfds_reader(data, split, class_to_idx)
    path = os.path.join(data_root(data), split + ('.tar' if name == 'tar' else ''))
    if not os.path.exists(path):
        layout = ('<data_dir>/train.tar and val.tar holding <class>/<image>' if name == 'tar' else
                  'ImageNet layout: <data_dir>/train/<class>/*.JPEG, <data_dir>/val/<class>/*')
        raise FileNotFoundError(f'{path} not found: expected {layout}')
    folders = [e.name for e in os.scandir(path) if e.is_dir()] if name != 'tar' else []
    if name != 'tar' and class_to_idx is not None:
        check_same_classes(class_to_idx, folders, path)
    try:
        reader = create_reader('', root=path, class_map=class_to_idx if name != 'tar' else None)
    except RuntimeError as e:  # timm's "Found 0 images in subfolders of ..."
        raise FileNotFoundError(f'no images found in {path}: {e}') from None
    if name != 'tar':
        _refuse_empty_classes(path, folders, reader.samples)
    if name == 'tar' and class_to_idx is not None:
        check_same_classes(class_to_idx, reader.class_name_to_idx, path)
        if reader.class_name_to_idx != class_to_idx:
            reader = create_reader('', root=path, class_map=class_to_idx)
    if len(reader) == 0:
        raise FileNotFoundError(f'no images found in {path}')
    return reader
