"""Loaders: the order of the samples and the seeds of their augmentations.

Reproducibility: each training sample's augmentation is seeded from ``(seed, epoch, sample index)``
(`tkvision.utils.seeding.derive_seed`, passed by `ResumableSampler` with the index),
never from a worker's own random state, so the augmentations do not depend on ``num_workers`` and a
run resumed in the middle of an epoch sees exactly the images an uninterrupted run would.
"""
import random
from typing import Any, Callable, Optional, Protocol, Tuple, Union, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset
from torch.utils.data.distributed import DistributedSampler

from .config import DataConfig
from ..utils.seeding import derive_seed
from .readers import collate_skip_bad

__all__ = ['ResumableSampler', 'SeededDataset', 'seed_sample', 'build_loader', 'batches_per_epoch',
           'set_loader_epoch']


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (disjoint per-rank shards, reshuffled per epoch from ``seed``) that yields
    ``(index, derive_seed(seed, epoch, index))`` pairs for `SeededDataset` and can start an epoch part-way.

    ``set_epoch(epoch, start=k)`` skips the first ``k`` samples of this rank's order for that epoch
    (a resumed run skips the batches it already consumed); the next ``set_epoch`` starts from 0.
    """

    def __init__(
            self,
            dataset: Dataset,
            num_replicas: int = 1,
            rank: int = 0,
            seed: int = 0,
    ):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle for ``epoch`` and skip its first ``start`` samples of this rank (a resumed epoch)."""
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self):
        order = list(super().__iter__())[self.start:]
        return iter([(i, derive_seed(self.seed, self.epoch, i)) for i in order])

    def __len__(self):
        return self.num_samples - self.start


def seed_sample(
        transform: Optional[Callable],
        seed: int,
        epoch: int,
        index: int,
) -> None:
    """Seed one sample's augmentation from (seed, epoch, index): albumentations' generators of
    ``transform`` and Python's / NumPy's global ones, which timm's RandAugment draws from."""
    _seed_transform(transform, derive_seed(seed, epoch, index))


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

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style: torch's Dataset declares no __len__

    def __getitem__(self, key: Tuple[int, int]) -> Any:
        index, seed = key
        ds: Any = self.dataset
        while hasattr(ds, 'dataset'):  # through Subsets to the dataset that holds the transform
            ds = ds.dataset
        _seed_transform(ds.transform, seed)
        return self.dataset[index]


def build_loader(
        dataset: Dataset,
        data: DataConfig,
        train: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        pin_memory: bool = False,
) -> DataLoader:
    """DataLoader of ``dataset`` with the data section's ``batch_size`` and ``num_workers``, yielding
    ``(uint8 images [B, C, H, W], labels [B], bad_paths)``.

    Training: `ResumableSampler` over `SeededDataset` (order and augmentation depend
    only on seed, epoch and sample index: exact resume, any ``num_workers``), incomplete last batch
    dropped; a shard stream orders itself (`tkvision.shards`). Evaluation: each rank takes
    items ``rank::world_size`` (a stream: its own shards) so summed metrics count every item once.
    ``pin_memory``: page-locked batches for non-blocking copies to a GPU (the run's device decides:
    ``tkvision.engine.distributed.DevicePlan``); workers persist across epochs for map-style data (a stream's
    workers restart each epoch to learn the epoch).
    """
    workers = data.num_workers
    if isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=data.batch_size, num_workers=workers, collate_fn=collate_skip_bad,
                          drop_last=train, pin_memory=pin_memory)
    if train:
        sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
        dataset = SeededDataset(dataset)
    else:
        size = len(dataset)  # type: ignore[arg-type]  # map-style: __len__
        sampler, dataset = None, Subset(dataset, range(rank, size, world_size))
    return DataLoader(dataset, batch_size=data.batch_size, sampler=sampler, shuffle=False, drop_last=train,
                      num_workers=workers, collate_fn=collate_skip_bad, persistent_workers=workers > 0,
                      pin_memory=pin_memory)


class EpochStream(Protocol):
    """A stream that orders its own epochs (``tkvision.data.shards.ShardStream``, the NaFlex training stream)."""

    batches_per_epoch: int

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Yield epoch ``epoch`` next, from its batch ``skip_batches`` on."""


def _training_order(loader: DataLoader) -> Union[EpochStream, Tuple[ResumableSampler, int]]:
    """What orders the epochs of a training loader of `build_loader` (or the NaFlex loader): its stream, or its
    sampler and batch size.

    Raises:
        TypeError: a loader whose epochs nothing here orders (not a training loader of ours).
    """
    dataset, sampler = loader.dataset, loader.sampler
    if isinstance(dataset, IterableDataset) and getattr(dataset, 'batches_per_epoch', None) is not None:
        return cast(EpochStream, dataset)  # a training stream: it has the attributes (checked)
    if isinstance(sampler, ResumableSampler) and loader.batch_size:
        return sampler, loader.batch_size
    raise TypeError('not a training loader of tkvision.data.build_loader: its epochs have no resumable order')


def batches_per_epoch(loader: DataLoader) -> int:
    """Training batches per rank in one epoch of a `build_loader` loader.

    Raises:
        TypeError: another loader.
    """
    order = _training_order(loader)
    if isinstance(order, tuple):
        sampler, batch_size = order
        return sampler.num_samples // batch_size
    return order.batches_per_epoch


def set_loader_epoch(loader: DataLoader, epoch: int, start_batch: int = 0) -> None:
    """Make ``loader`` yield epoch ``epoch`` from its batch ``start_batch`` on (a resumed run).

    Raises:
        TypeError: another loader.
    """
    order = _training_order(loader)
    if isinstance(order, tuple):
        sampler, batch_size = order
        sampler.set_epoch(epoch, start=start_batch * batch_size)
    else:
        order.set_epoch(epoch, skip_batches=start_batch)
