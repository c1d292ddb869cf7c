"""timm's NaFlex loader in our trainer: images of any resolution and aspect ratio as padded patch sequences.

timm's ``create_naflex_loader`` (``train.py --naflex-loader``) packs each training batch to one of the
sequence lengths ``naflex_train_seq_lens`` (batch sizes scaled so that a batch holds about ``batch_size x
max(naflex_train_seq_lens)`` patches) and, with ``naflex_patch_sizes``, draws the patch size per batch; the
evaluation loader resizes every image to at most ``naflex_max_seq_len`` patches. Batches are timm's patch
dictionaries (``patches [B, L, p*p*C]`` normalised, ``patch_coord [B, L, 2]``, ``patch_valid [B, L]``).

What this module adds to timm's pieces, so that a run keeps what our map-style loader gives
(`tkvision.data.loader`):

- exact resume mid-epoch with any ``num_workers``: the epoch's batch schedule (timm's, drawn from
  ``seed + epoch``) can start at batch ``k`` (`ResumableNaFlexDataset`), and every sample's
  augmentation is seeded from ``(seed, epoch, index)`` (`NaFlexImages`), never from a worker's state;
- our datasets (Fashion-MNIST, folders, tars, Hugging Face) as the PIL images timm's transforms take.

Source: ``timm.data.naflex_loader`` / ``naflex_dataset`` (timm 1.0.31), ``train.py``'s NaFlex options.
"""
import random
from functools import partial
from typing import Any, List, Optional, Union, cast

import numpy as np
import torch
from PIL import Image
from timm.data import create_naflex_loader, create_transform
from timm.data.naflex_dataset import NaFlexMapDatasetWrapper
from timm.data.naflex_loader import _worker_init
from timm.data.readers.shared_count import SharedCount
from timm.layers import to_2tuple
from torch.utils.data import DataLoader, Dataset, Subset

from .config import DataConfig
from ..utils.seeding import derive_seed

__all__ = ['NaFlexImages', 'ResumableNaFlexDataset', 'NaFlexPreprocessor', 'build_naflex_loader']


def _decoded(image):
    """An albumentations-style transform that keeps the decoded uint8 array as it is."""
    return dict(image=image)


def _innermost(dataset):
    while hasattr(dataset, 'dataset'):
        dataset = dataset.dataset
    return dataset


class NaFlexImages(Dataset):
    """One of our datasets (`tkvision.data.build_dataset`: Fashion-MNIST, folder, tar, Hugging Face;
    ``Subset`` carve-outs included) as timm's NaFlex loader takes it: ``(PIL image, label)``, or
    ``(transform(image), label)`` once timm sets ``transform`` (its evaluation loader does).

    The wrapped dataset's own transform is replaced by the identity (timm's transforms resize, crop and
    normalise). ``seed``: each item first seeds Python's, NumPy's and torch's generators from
    ``derive_seed(seed, epoch, index)`` (``epoch`` read from `epoch`, shared with the loader's
    workers), so a sample's augmentation does not depend on the worker that draws it; None: no seeding
    (evaluation). An unreadable image (``('bad', path)`` from a reader) is skipped and counted, as our other
    loaders do: its path goes to `unreadable` (drained per batch by the loader); in training it raises
    ``OSError`` naming the file, which timm's wrapper skips; in evaluation (``transform`` set) the item is
    ``(None, path)``, which the collate leaves out (`build_naflex_loader`).
    """

    def __init__(self, dataset: Dataset, seed: Optional[int] = None):
        _innermost(dataset).transform = _decoded
        self.dataset, self.seed, self.transform = dataset, seed, None
        self.epoch: Optional[SharedCount] = None  # set by ResumableNaFlexDataset
        self.unreadable: List[str] = []  # paths of the unreadable images met since the last batch (this process's)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style: torch's Dataset declares no __len__

    def __getitem__(self, index: int) -> tuple:
        if self.seed is not None:
            s = derive_seed(self.seed, self.epoch.value if self.epoch is not None else 0, index)
            random.seed(s)
            np.random.seed(s)
            torch.manual_seed(s)
        image, label = self.dataset[index]
        if isinstance(image, str):
            self.unreadable.append(str(label))
            if self.transform is not None:
                return None, str(label)
            raise OSError(f'unreadable image {label}')
        array = np.asarray(image)
        if array.ndim == 3 and array.shape[-1] == 1:  # a grey image as [H, W, 1]: PIL takes [H, W]
            array = array[..., 0]
        image = Image.fromarray(array)
        return (self.transform(image) if self.transform is not None else image), int(label)


class ResumableNaFlexDataset(NaFlexMapDatasetWrapper):
    """timm's ``NaFlexMapDatasetWrapper`` that can start an epoch at batch ``k`` and says its length.

    The epoch's schedule (sequence length, batch size, patch size and sample indices of every batch) is
    timm's, drawn from ``seed + epoch`` alone; ``set_epoch(epoch, skip_batches=k)`` drops its first ``k``
    batches before they are dealt to the workers, so a resumed run sees exactly the batches an
    uninterrupted one would, in the same order. Items: ``(batch dict, labels [B], unreadable paths)``: the
    images timm's wrapper skipped while building the batch, counted as our other loaders count them.
    """

    def __init__(self, images: NaFlexImages, **kwargs: Any):
        super().__init__(images, **kwargs)
        self.skip = SharedCount(0)
        images.epoch = self.shared_epoch

    @property
    def batches_per_epoch(self) -> int:
        """Batches of one whole epoch on this rank (``tkvision.data.batches_per_epoch``)."""
        return len(self)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Make the next iteration yield epoch ``epoch`` from its batch ``skip_batches`` on."""
        super().set_epoch(epoch)
        self.skip.value = skip_batches

    def _prepare_epoch_batches(self, epoch: int):
        return super()._prepare_epoch_batches(epoch)[self.skip.value:]

    def __iter__(self):
        images = cast(NaFlexImages, self.base_dataset)  # what __init__ wraps
        for batch, labels in super().__iter__():
            bad, images.unreadable[:] = list(images.unreadable), []
            yield batch, labels, bad


class NaFlexPreprocessor:
    """The device step of a NaFlex batch (the patches are normalised by timm's transforms already): every
    tensor of the dictionary moved to ``device`` (``seq_len``, an int, stays). Called as
    `BatchPreprocessor` is."""

    def __init__(self, device: Union[str, torch.device]):
        self.device = torch.device(device)

    def __call__(self, batch: dict, train: bool = False) -> dict:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _collate_with_bad(collate, batch):
    """timm's evaluation collate over the readable items; the unreadable ones' paths returned beside
    (``(None, empty labels, paths)`` when none is readable)."""
    bad = [path for image, path in batch if image is None]
    good = [item for item in batch if item[0] is not None]
    if not good:
        return None, torch.zeros(0, dtype=torch.long), bad
    batch, labels = collate(good)
    return batch, labels, bad


def build_naflex_loader(
        dataset: Dataset,
        data: DataConfig,
        train: bool,
        seed: int,
        patch_size: int,
        rank: int = 0,
        world_size: int = 1,
        pin_memory: bool = False,
) -> DataLoader:
    """A NaFlex loader of ``dataset`` (one of `build_dataset`'s) for the resolved data
    section ``data``: items ``(batch dict, labels [B], [])`` as the module docstring says.

    Training: `ResumableNaFlexDataset` with timm's training transform (RandomResizedCrop over
    ``rrc_scale`` or none, ``hflip``, ``auto_augment``, ``interpolation``, ``mean`` / ``std``; no colour
    jitter), sequence lengths ``naflex_train_seq_lens``, patch size ``patch_size`` or one of
    ``naflex_patch_sizes`` per batch. Evaluation: timm's ``create_naflex_loader`` at ``naflex_max_seq_len``
    and ``patch_size``, ``batch_size`` images a batch, each rank every ``world_size``-th image. ``pin_memory``:
    page-locked batches, for a GPU (the run's device decides).

    Raises:
        ValueError: from timm, a patch size or sequence length it cannot use (its words).
    """
    if not train and world_size > 1:  # each rank its share, as our other evaluation loaders (summed metrics)
        dataset = Subset(dataset, range(rank, len(dataset), world_size))  # type: ignore[arg-type]  # map-style
    images = NaFlexImages(dataset, seed=seed if train else None)
    image = data.image_settings()
    if not train:
        loader = cast(DataLoader, create_naflex_loader(  # a DataLoader without timm's prefetcher
            images, patch_size=patch_size, max_seq_len=data.naflex_max_seq_len, batch_size=data.batch_size,
            is_training=False, num_workers=data.num_workers, pin_memory=pin_memory, interpolation=image.interpolation,
            mean=image.mean, std=image.std, use_prefetcher=False))
        loader.collate_fn = partial(_collate_with_bad, loader.collate_fn)
        return loader
    low, high = data.rrc_scale or (1.0, 1.0)
    transform_factory = partial(
        # timm's NaFlex crop keeps the image's aspect ratio up to a factor in `ratio`; no rrc_scale: whole image
        create_transform, is_training=True, naflex=True, scale=(low, high),
        ratio=(3 / 4, 4 / 3) if data.rrc_scale else (1.0, 1.0), hflip=data.hflip, vflip=0.,
        color_jitter=None,  # type: ignore[arg-type]  # timm's annotation leaves out its own None: no jitter
        auto_augment=data.auto_augment, interpolation=image.interpolation, mean=image.mean, std=image.std,
        use_prefetcher=False)
    sizes = data.naflex_patch_sizes
    wrapper = ResumableNaFlexDataset(
        images, transform_factory=transform_factory, patch_size=None if sizes else to_2tuple(patch_size),
        patch_size_choices=sizes or None, seq_lens=tuple(data.naflex_train_seq_lens),
        max_tokens_per_batch=data.batch_size * max(data.naflex_train_seq_lens), seed=seed,
        distributed=world_size > 1, rank=rank, world_size=world_size)
    return DataLoader(wrapper, batch_size=None, num_workers=data.num_workers, pin_memory=pin_memory,
                      worker_init_fn=partial(_worker_init, worker_seeding='all'),
                      persistent_workers=data.num_workers > 0)
