"""The data of a run: its datasets, loaders and on-device preprocessing, built from the data section.

`RunData` is what the epoch loop and evaluation read to get batches: the training and validation
loaders (and the test loader, built once at the end), the preprocessing that turns a loader's uint8 batch
into normalised float images on the device, and the batch arithmetic (accumulation steps, batches and
updates per epoch). NaFlex loaders (timm's variable-resolution patch batches) are built here too, with the
memory check that refuses lengths that cannot fit before any work.
"""
import math
import signal
from typing import Iterable, Optional

import cv2
import torch
from torch.utils.data import DataLoader, Dataset

from ..data import (BatchPreprocessor, DataConfig, batches_per_epoch, build_dataset, build_loader, dataset_classes,
                    dataset_size, has_test_split)
from ..data.naflex import NaFlexPreprocessor, build_naflex_loader
from ..utils.errors import ConfigError
from .clock import STOP_SIGNALS
from .distributed import DevicePlan, Processes, device_plan

__all__ = ['RunData', 'naflex_patch_size', 'check_naflex_memory', 'naflex_loss_scale']


def _ignore_stop_signals(_worker_id):
    """DataLoader workers leave SIGTERM / SIGUSR1 and Ctrl-C's SIGINT to the main process, which stops them itself
    after checkpointing (SLURM signals every process of a job step, a terminal every process of its foreground
    group), and decode with one OpenCV thread (torch already gives them one): workers x threads must not
    oversubscribe the cores."""
    for s in STOP_SIGNALS + (signal.SIGINT,):
        signal.signal(s, signal.SIG_IGN)
    cv2.setNumThreads(1)


class RunData:
    """A run's datasets, loaders and preprocessing.

    Args:
        data: the config's data section (``tkvision.data.DataConfig``).
        accum: micro-batches per optimizer update (``tkvision.engine.config.resolve_accum_steps``).
        seed: the run's seed (sample order and augmentation draws).
        processes: this process among the job's (``tkvision.engine.distributed.Processes``).
        model: the model the batches feed, read only with ``naflex_loader`` (its patch size and shape).
        global_batch_key: the global batch is set by ``global_batch_size`` (accumulation makes it up): the key a
            too-small training set names.

    Attributes:
        train_ds: the training split.
        val_ds: the validation split.
        train_loader: the training split's loader.
        val_loader: the validation split's loader.
        preprocess: ``preprocess(images, train)`` to normalised float images on the device.
        batches_per_epoch: micro-batches of one epoch per process.
        updates_per_epoch: optimizer updates of one epoch.
        global_batch: images per optimizer update over every process.
        batch_size: images per process and micro-batch (``batch_size``).
        has_test_split: whether the dataset has a test split (``tkvision.data.has_test_split``).
        mean_std: ``(mean, std)`` the images are normalised with.

    Raises:
        ConfigError: a training set smaller than one global batch, or an epoch without a full batch.
        FileNotFoundError, UsageError: missing data, splits with different classes (named).
    """

    def __init__(
            self,
            data: DataConfig,
            accum: int,
            seed: int,
            processes: Processes,
            model: Optional[torch.nn.Module] = None,
            global_batch_key: bool = False,
    ):
        self._data, self.accum, self.seed, self.processes = data, accum, seed, processes
        self.batch_size, self.has_test_split, self.mean_std = data.batch_size, has_test_split(data), data.mean_std()
        self.naflex_patch_size = None
        if data.naflex_loader:
            if model is None:
                raise ValueError('RunData with naflex_loader needs the model it feeds (model=)')
            self.naflex_patch_size = naflex_patch_size(model, data, processes.plan)
        self.preprocess = (NaFlexPreprocessor(processes.device) if data.naflex_loader else
                           BatchPreprocessor(*self.mean_std, processes.device, reprob=data.reprob))
        self._test_loader: Optional[DataLoader] = None  # built by test_loader(), at the end of a run
        self.train_ds = build_dataset(data, 'train', seed, processes.rank, processes.world)
        self.val_ds = build_dataset(data, 'val', seed, processes.rank, processes.world,
                                    class_to_idx=dataset_classes(self.train_ds))
        self.global_batch = data.batch_size * accum * processes.world
        if dataset_size(self.train_ds) < self.global_batch:
            lower = 'global_batch_size' if global_batch_key else 'batch_size'
            raise ConfigError(f'the training set has {dataset_size(self.train_ds)} images, fewer than one global batch '
                              f"({self.global_batch} = batch_size {data.batch_size} x accum_steps {accum} x "
                              f'{processes.world} processes): lower {lower} or raise train_subset')
        self.train_loader = self._loader(self.train_ds, train=True)
        self.val_loader = self._loader(self.val_ds, train=False)
        self.batches_per_epoch = batches_per_epoch(self.train_loader)
        if self.batches_per_epoch < 1:
            raise ConfigError(f"one epoch holds no full batch of {data.batch_size} per process and loader worker: "
                              'lower batch_size or num_workers')
        self.updates_per_epoch = math.ceil(self.batches_per_epoch / accum)

    def test_loader(self) -> Iterable:
        """A loader of the test split (``tkvision.data.build_dataset`` ``'test'``), built when asked for: the
        trainer asks once, at the end of a run (kept for `close`)."""
        ds = build_dataset(self._data, 'test', self.seed, self.processes.rank, self.processes.world,
                           class_to_idx=dataset_classes(self.train_ds))
        loader = self._loader(ds, train=False)
        self._test_loader = loader
        return loader

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        """Our map-style / shard loader (``tkvision.data.build_loader``), or timm's NaFlex loader
        (``tkvision.data.naflex.build_naflex_loader``) with ``naflex_loader``."""
        rank, world = self.processes.rank, self.processes.world
        pin = self.processes.plan.pin_memory
        if self.naflex_patch_size:
            loader = build_naflex_loader(dataset, self._data, train, self.seed, self.naflex_patch_size, rank, world,
                                         pin_memory=pin)
            if not train:  # timm's evaluation loader seeds its workers in its own worker_init_fn
                return loader
        else:
            loader = build_loader(dataset, self._data, train=train, seed=self.seed, rank=rank, world_size=world,
                                  pin_memory=pin)
        loader.worker_init_fn = _ignore_stop_signals
        return loader

    def loss_scale(self, images: int) -> float:
        """The weight of a training batch of ``images`` images: 1, or for a NaFlex batch (whose images vary in
        number with its sequence length) `naflex_loss_scale` of ``naflex_loss_scale``."""
        if not self._data.naflex_loader:
            return 1.0
        return naflex_loss_scale(self._data.naflex_loss_scale, images, self._data.batch_size)

    def close(self) -> None:
        """Stop the loaders' worker processes, on every way out of a run (an error included).

        Persistent workers live in ``loader._iterator`` until it is dropped; its shutdown sets their
        done event and joins them. Without this, an error leaves them waiting, and since they ignore
        SIGTERM (`_ignore_stop_signals`) multiprocessing's exit handler waits for them forever.
        """
        for loader in (self.train_loader, self.val_loader, self._test_loader):
            if loader is None:
                continue
            iterator = getattr(loader, '_iterator', None)
            loader._iterator = None
            if iterator is not None and hasattr(iterator, '_shutdown_workers'):
                iterator._shutdown_workers()


def naflex_patch_size(
        net: torch.nn.Module,
        data: DataConfig,
        plan: Optional[DevicePlan] = None,
) -> int:
    """The patch size of ``net`` (a NaFlex ViT, on any device, the meta device included), which NaFlex evaluation
    batches use; the data section's sequence lengths checked against the memory of the plan's device
    (`check_naflex_memory`; default: the CPU's).

    Raises:
        ConfigError: ``naflex_loader`` with a model that takes no NaFlex patch dictionaries, or lengths that
            cannot fit.
    """
    patch = getattr(getattr(net, 'embeds', None), 'patch_size', None)
    if patch is None:
        name = getattr(net, 'pretrained_cfg', {}).get('architecture', type(net).__name__)
        raise ConfigError(f"naflex_loader: {name} takes no NaFlex patch dictionaries; use a NaFlex model "
                          '(naflexvit_tokenformer_ti16, timm naflexvit_*) or set naflex_loader: false')
    check_naflex_memory(data, net, plan or device_plan('cpu'))
    return patch[0]


def check_naflex_memory(
        data: DataConfig,
        net: torch.nn.Module,
        plan: DevicePlan,
) -> None:
    """Refuse, before any work, NaFlex sequence lengths whose batch cannot fit in the memory of ``plan``'s device
    (``DevicePlan.available_memory``): the
    longest training length (timm packs ``batch_size`` images of it into a batch) and the evaluation length,
    each at ``batch_size`` images. The bound is a floor, so nothing that fits is refused: the attention mask
    (``L²`` per image), where masked attention runs unfused (``DevicePlan.fused_masked_attention`` false: a CPU)
    one block's attention scores and probabilities (``2 x heads x L²``), and the tokens' activations over the
    blocks (``16 x L x embed_dim`` per image and block), in float32, against what the process may allocate (free
    memory, ``ulimit -v``, a cgroup's limit). ``net``: any NaFlex ViT (its ``blocks``, their ``attn.num_heads``
    and its ``embed_dim``, read by name: the family is any of timm's).

    Raises:
        ConfigError: naming the key, the length, the memory it needs at least and what is available.
    """
    layers, width = getattr(net, 'blocks'), int(getattr(net, 'embed_dim'))
    blocks, heads = len(layers), getattr(layers[0].attn, 'num_heads', 1)
    # unfused masked attention (a CPU): scores and probabilities, heads x L² each, exist at once
    score_copies = 0 if plan.fused_masked_attention else 2 * heads
    have = plan.available_memory()
    for key, length in (('naflex_train_seq_lens', max(data.naflex_train_seq_lens)),
                        ('naflex_max_seq_len', data.naflex_max_seq_len)):
        need = data.batch_size * ((1 + score_copies) * length ** 2 + 16 * length * width * blocks) * 4.
        if need > have:
            raise ConfigError(f"{key}: a batch of {data.batch_size} images at {length} patches needs at least "
                              f'{need / 2 ** 30:,.1f} GiB (an image\'s {length}² attention mask, '
                              + (f'{heads} heads x {length}² attention scores and probabilities, ' if score_copies
                                 else '') +
                              f'and its activations); {have / 2 ** 30:,.1f} GiB is available to this process on '
                              f'{plan.device}: lower {key} or batch_size')


def naflex_loss_scale(mode: str, images: int, batch_size: int) -> float:
    """timm ``train.py --naflex-loss-scale``: a NaFlex batch of ``images`` (their number varies with the
    batch's sequence length) weighs ``images / batch_size`` (``'linear'``), its square root (``'sqrt'``) or 1."""
    ratio = images / batch_size
    return {'linear': ratio, 'sqrt': ratio ** 0.5, 'none': 1.0}[mode]
