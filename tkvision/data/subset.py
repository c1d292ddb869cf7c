"""ImageNet-layout subsets for quick work: N classes (chosen by seed or listed), K images per class.

Presets (``PRESETS``): ``imagenet-small`` is the RingFormer paper's ImageNet-small
(RingFormer, arXiv:2502.13181, App. A.1): 100 classes, 1,000 training and 50 validation images per
class. The subset is written as a folder (files copied, or symbolic links with ``link=True``) or as
WebDataset shards (`tkvision.data.shards.make_shards`).
"""
import os
import random
import shutil
import tempfile
from typing import Dict, Optional, Sequence

from ..utils.errors import UsageError
from .shards import make_shards

__all__ = ['PRESETS', 'make_subset']

#: name -> (classes, train images per class, val images per class)
PRESETS = {'imagenet-small': (100, 1000, 50)}


def _images(folder):
    from timm.data.readers.img_extensions import get_img_extensions
    exts = get_img_extensions()
    return sorted(f for f in os.listdir(folder) if os.path.splitext(f)[1].lower() in exts)


def make_subset(
        src: str,
        out: str,
        num_classes: Optional[int] = None,
        classes: Optional[Sequence[str]] = None,
        train_per_class: Optional[int] = None,
        val_per_class: Optional[int] = None,
        seed: int = 0,
        fmt: str = 'folder',
        link: bool = False,
) -> dict:
    """Write a subset of ``src`` (``<src>/train/<class>/*``, ``<src>/val/<class>/*``) to ``out``.

    Args:
        num_classes: classes drawn (by ``seed``) from ``src/train``'s; or ``classes``: the names.
        train_per_class: training images drawn per class (by ``seed``); None keeps all. A class with fewer
            keeps what it has (reported in the returned counts).
        val_per_class: validation images drawn per class, as ``train_per_class``.
        fmt: ``'folder'`` (ImageNet layout) or ``'shards'`` (WebDataset, with ``_info.json``).
        link: symbolic links instead of copies (folder format).

    Returns:
        ``{split: {class: images}}``.

    Raises:
        FileNotFoundError: ``src`` lacks train/ or a listed class. FileExistsError: ``out`` exists.
        ValueError: more classes asked than ``src`` has, or an unknown ``fmt``.
    """
    if fmt not in ('folder', 'shards'):
        raise UsageError(f"fmt must be 'folder' or 'shards', got {fmt!r}")
    if os.path.exists(out):
        raise FileExistsError(f'{out} already exists; write the subset to a new folder')
    train_dir = os.path.join(src, 'train')
    if not os.path.isdir(train_dir):
        raise FileNotFoundError(f'{train_dir} not found: expected ImageNet layout <src>/train/<class>/*')
    available = sorted(e.name for e in os.scandir(train_dir) if e.is_dir())
    rng = random.Random(seed)
    if classes is None:
        if num_classes is None or num_classes > len(available):
            raise UsageError(f'asked for {num_classes} classes; {src} has {len(available)}')
        classes = sorted(rng.sample(available, num_classes))
    missing = sorted(set(classes) - set(available))
    if missing:
        raise FileNotFoundError(f'classes not in {train_dir}: {missing}')
    folder = tempfile.mkdtemp(prefix='subset-') if fmt == 'shards' else out
    counts: Dict[str, Dict[str, int]] = {}
    for split, per_class in (('train', train_per_class), ('val', val_per_class)):
        counts[split] = {}
        for c in classes:
            src_dir = os.path.join(src, split, c)
            files = _images(src_dir) if os.path.isdir(src_dir) else []
            if per_class is not None and len(files) > per_class:
                files = sorted(rng.sample(files, per_class))
            dst_dir = os.path.join(folder, split, c)
            os.makedirs(dst_dir, exist_ok=True)
            for f in files:
                s, d = os.path.abspath(os.path.join(src_dir, f)), os.path.join(dst_dir, f)
                os.symlink(s, d) if (link or fmt == 'shards') else shutil.copy2(s, d)
            counts[split][c] = len(files)
    if fmt == 'shards':
        try:
            make_shards(folder, out)
        finally:
            shutil.rmtree(folder)
    return counts
