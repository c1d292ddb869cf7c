"""The epoch loop: batches, gradient accumulation, optimizer updates, and the sync points where a
run checks its loss, agrees on a stop signal and writes its checkpoint.

:class:`RunContext` is what a run uses but does not save (config, processes, data, loss, stop
handling); :class:`~tkvision.engine.state.TrainState` is what it saves. :func:`train_one_epoch`
receives both (MAE's ``engine_pretrain.train_one_epoch`` shape: the epoch function gets what it
uses and returns a dict of averaged stats).

Mixed precision is branch-free (nanoGPT's form): ``torch.autocast(enabled=amp is not None)`` and a
``GradScaler`` that is a no-op unless fp16.
"""
import contextlib
import itertools
import math
import os
import signal
import time
from typing import List, Optional

import cv2
import torch
import torch.distributed as dist
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import dispatch_clip_grad, random_seed
from tqdm import tqdm

from ..data import (BatchPreprocessor, batches_per_epoch, build_dataset, build_loader, dataset_classes, dataset_size,
                    set_loader_epoch)
from ..data.naflex import NaFlexPreprocessor, build_naflex_loader
from ..growth import elastic
from ..utils.errors import ConfigError, NonFiniteLossError, Preempted
from ..utils.memory import available_memory_bytes, is_out_of_memory
from ..utils.seeding import derive_seed
from .build import build_model
from .checkpoint import LAST_CHECKPOINT, save_training_checkpoint
from .config import resolve_accum_steps
from .evaluate import AMP_DTYPES
from .state import TrainState

__all__ = ['RunContext', 'train_one_epoch', 'seed_step', 'naflex_patch_size', 'check_naflex_memory',
           'naflex_loss_scale', 'NonFiniteLossError', 'Preempted', 'STOP_SIGNALS']

#: What SLURM and torchrun send before stopping a job: the run checkpoints and exits.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _ignore_stop_signals(_worker_id):
    """DataLoader workers leave SIGTERM / SIGUSR1 to the main process, which stops them itself after
    checkpointing (SLURM signals every process of a job step), and decode with one OpenCV thread
    (torch already gives them one): workers x threads must not oversubscribe the cores."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    cv2.setNumThreads(1)


def seed_step(seed: int, epoch: int, batch: int, rank: int = 0):
    """Seed Python, NumPy and torch (timm's ``random_seed``) for micro-batch ``batch`` of ``epoch`` on
    ``rank``, from ``derive_seed('step', seed, epoch, batch)`` (31 bits: timm adds the rank)."""
    random_seed(derive_seed('step', seed, epoch, batch, bits=31), rank)


class RunContext:
    """What a run uses but does not save: its run, data, optimisation and elastic sections, processes, data,
    loss, output and stop handling.

    Args:
        run, data, optim, elastic, model: those sections of the config (:func:`tkvision.engine.config.section`;
            ``model`` only to read a NaFlex model's patch size).
        rank, world, device: this process, the number of processes, its device.

    Raises:
        ConfigError: a training set smaller than one global batch, or an epoch without a full batch.
        FileNotFoundError, UsageError: missing data, splits with different classes (named).
    """

    def __init__(self, run: dict, data: dict, optim: dict, elastic: dict, model: dict, rank: int, world: int,
                 device):
        self.run_section, self.data, self.optim, self.elastic = run, data, optim, elastic
        self.rank, self.world, self.device = rank, world, device
        self.seed, self.task, self.epochs, self.amp = run['seed'], run['task'], optim['epochs'], run['amp']
        self.model_name = model['model']
        self.main = rank == 0
        self.out = run['output']
        self.checkpoint_path = os.path.join(self.out, LAST_CHECKPOINT)
        self.accum = resolve_accum_steps(optim, data['batch_size'], world)
        self.naflex_patch_size = naflex_patch_size(model, data, device) if data['naflex_loader'] else None
        self._build_data()
        self.preprocess = (NaFlexPreprocessor(device) if data['naflex_loader'] else
                           BatchPreprocessor(data['mean'], data['std'], device, reprob=data['reprob']))
        self.amp_dtype = AMP_DTYPES[run['amp']]
        self.mixup = self.criterion = None  # set by set_loss once the model (and its num_classes) exists
        self.stop_signal = None
        self.last_save = time.monotonic()
        self.checked_update = 0  # the loss is known finite up to this update
        self.writer = None
        self._test_loader = None  # built by test_loader(), at the end of a run

    def _build_data(self):
        data, rank, world = self.data, self.rank, self.world
        self.train_ds = build_dataset(data, 'train', self.seed, rank, world)
        self.val_ds = build_dataset(data, 'val', self.seed, rank, world, class_to_idx=dataset_classes(self.train_ds))
        global_batch = data['batch_size'] * self.accum * world
        if dataset_size(self.train_ds) < global_batch:
            raise ConfigError(f'the training set has {dataset_size(self.train_ds)} images, fewer than one global batch '
                              f"({global_batch} = batch_size {data['batch_size']} x accum_steps {self.accum} x "
                              f'{world} processes): lower batch_size or raise train_subset')
        self.train_loader = self._loader(self.train_ds, train=True)
        self.train_loader.worker_init_fn = _ignore_stop_signals
        self.val_loader = self._loader(self.val_ds, train=False)
        self.batches_per_epoch = batches_per_epoch(self.train_loader)
        if self.batches_per_epoch < 1:
            raise ConfigError(f"one epoch holds no full batch of {data['batch_size']} per process and loader worker: "
                              'lower batch_size or num_workers')
        self.updates_per_epoch = math.ceil(self.batches_per_epoch / self.accum)

    def test_loader(self):
        """A loader of the test split (:func:`tkvision.data.build_dataset` ``'test'``), built when asked
        for: the trainer asks once, at the end of a run (kept for :meth:`close`)."""
        ds = build_dataset(self.data, 'test', self.seed, self.rank, self.world,
                           class_to_idx=dataset_classes(self.train_ds))
        self._test_loader = self._loader(ds, train=False)
        return self._test_loader

    def _loader(self, dataset, train: bool):
        """Our map-style / shard loader (:func:`tkvision.data.build_loader`), or timm's NaFlex loader
        (:func:`tkvision.data.naflex.build_naflex_loader`) with ``naflex_loader``."""
        data, seed = self.data, self.seed
        if self.naflex_patch_size:
            return build_naflex_loader(dataset, data, train, seed, self.naflex_patch_size, self.rank, self.world)
        return build_loader(dataset, data, train=train, seed=seed, rank=self.rank, world_size=self.world)

    def step_prefixes(self, epoch: int, batch: int) -> List[Optional[float]]:
        """The prefixes micro-batch ``batch`` of ``epoch`` trains: ``[None]`` (the whole model), or an
        elastic run's fractions (:func:`tkvision.growth.elastic.step_fractions`), drawn from a stream of
        their own (``derive_seed('elastic', seed, epoch, batch)``), so a resumed run draws the same."""
        fractions = self.elastic['elastic_fractions']
        if not fractions:
            return [None]
        generator = torch.Generator().manual_seed(derive_seed('elastic', self.seed, epoch, batch))
        chosen = elastic.step_fractions(fractions, self.elastic['elastic_sampling'], generator)
        return [None if f == 1 else f for f in chosen]

    def set_loss(self, num_classes: int):
        """``mixup`` and ``criterion`` of a classifier with ``num_classes`` outputs: timm's Mixup/CutMix
        with soft-target cross-entropy, label smoothing, or plain cross-entropy."""
        optim = self.optim
        if optim['mixup'] > 0 or optim['cutmix'] > 0:
            self.mixup = Mixup(mixup_alpha=optim['mixup'], cutmix_alpha=optim['cutmix'], prob=optim['mixup_prob'],
                               switch_prob=optim['mixup_switch_prob'], label_smoothing=optim['smoothing'],
                               num_classes=num_classes)
            self.criterion = SoftTargetCrossEntropy()
        elif optim['smoothing'] > 0:
            self.criterion = LabelSmoothingCrossEntropy(optim['smoothing'])
        else:
            self.criterion = torch.nn.CrossEntropyLoss()

    def on_signal(self, signum, _frame):
        """Signal handler: remember the signal; the loop saves its state and stops at its next check
        (every update on one process)."""
        self.stop_signal = signal.Signals(signum).name

    def close(self):
        """Stop the loaders' worker processes, on every way out of a run (an error included).

        Persistent workers live in ``loader._iterator`` until it is dropped; its shutdown sets their
        done event and joins them. Without this, an error leaves them waiting, and since they ignore
        SIGTERM (:func:`_ignore_stop_signals`) multiprocessing's exit handler waits for them forever.
        """
        for loader in (self.train_loader, self.val_loader, self._test_loader):
            if loader is None:
                continue
            iterator = getattr(loader, '_iterator', None)
            loader._iterator = None
            if iterator is not None and hasattr(iterator, '_shutdown_workers'):
                iterator._shutdown_workers()

    def save(self, state: TrainState):
        """Write ``last.pth`` (rank 0, atomic) and restart the checkpoint clock."""
        if self.main:
            save_training_checkpoint(state, self.checkpoint_path)
        self.last_save = time.monotonic()

    def check(self, state: TrainState, force: bool = False) -> bool:
        """At a sync point (every ``log_interval`` / ``checkpoint_every_steps`` updates, or ``force``):
        one host synchronisation that checks the loss of the updates since the last check on every
        rank, agrees on a stop signal and on a time-based checkpoint, and writes it if due.

        Returns:
            True when the run must stop (a stop signal on any rank); the checkpoint is then written.

        Raises:
            NonFiniteLossError: a NaN / inf loss since the last check (nothing is saved after it).
        """
        run, u = self.run_section, state.num_updates
        every = run['checkpoint_every_steps']
        step_due = bool(every) and u % every == 0
        if not (force or step_due or u % run['log_interval'] == 0 or (self.world == 1 and self.stop_signal)):
            return False
        minutes = run['checkpoint_every_minutes']
        time_due = bool(minutes) and time.monotonic() - self.last_save >= 60 * minutes
        flags = torch.cat([state.meter['nonfinite'].float().view(1),
                           torch.tensor([float(bool(self.stop_signal)), float(time_due)], device=self.device)])
        if self.world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        nonfinite, stop, time_due = (bool(v) for v in flags.tolist())
        if nonfinite:
            last = (f'the last good checkpoint is {self.checkpoint_path}' if os.path.isfile(self.checkpoint_path)
                    else 'no checkpoint was written before it')
            raise NonFiniteLossError(f'the training loss became NaN or infinite between updates '
                                     f'{self.checked_update + 1} and {u} (epoch {state.epochs_done + 1}); stopping: '
                                     f'{last}. Try a lower lr, clip_grad: 1.0, or amp: bf16 instead of fp16')
        self.checked_update = u
        if (step_due or time_due or stop) and not force:
            self.save(state)
        return stop


def naflex_patch_size(model: dict, data: dict, device='cpu') -> int:
    """The patch size of the model section's model (built on the meta device), which NaFlex evaluation batches
    use; the data section's sequence lengths checked against ``device``'s memory (:func:`check_naflex_memory`).

    Raises:
        ConfigError: ``naflex_loader`` with a model that takes no NaFlex patch dictionaries, or lengths that
            cannot fit.
    """
    with torch.device('meta'):
        net = build_model(model)
    patch = getattr(getattr(net, 'embeds', None), 'patch_size', None)
    if patch is None:
        raise ConfigError(f"naflex_loader: {model['model']} takes no NaFlex patch dictionaries; use a NaFlex model "
                          '(naflexvit_tokenformer_ti16, timm naflexvit_*) or set naflex_loader: false')
    check_naflex_memory(data, net, device)
    return patch[0]


def check_naflex_memory(data: dict, net: torch.nn.Module, device):
    """Refuse, before any work, NaFlex sequence lengths whose batch cannot fit in ``device``'s memory: the
    longest training length (timm packs ``batch_size`` images of it into a batch) and the evaluation length,
    each at ``batch_size`` images. The bound is a floor, so nothing that fits is refused: the attention mask
    (``L²`` per image), on a CPU one block's attention scores and probabilities (``2 x heads x L²``: the CPU
    runs masked attention unfused), and the tokens' activations over the blocks (``16 x L x embed_dim`` per
    image and block), in float32, against what the process may allocate
    (``tkvision.utils.memory.available_memory_bytes``: free memory, ``ulimit -v``, a cgroup's limit).

    Raises:
        ConfigError: naming the key, the length, the memory it needs at least and what is available.
    """
    blocks = len(net.blocks)
    heads = getattr(net.blocks[0].attn, 'num_heads', 1)
    # on a CPU attention runs unfused with a mask: scores and probabilities, heads x L² each, exist at once
    score_copies = 0 if torch.device(device).type == 'cuda' else 2 * heads
    have = available_memory_bytes(device)
    for key, length in (('naflex_train_seq_lens', max(data['naflex_train_seq_lens'])),
                        ('naflex_max_seq_len', data['naflex_max_seq_len'])):
        need = data['batch_size'] * ((1 + score_copies) * length ** 2 + 16 * length * net.embed_dim * blocks) * 4.
        if need > have:
            raise ConfigError(f"{key}: a batch of {data['batch_size']} images at {length} patches needs at least "
                              f'{need / 2 ** 30:,.1f} GiB (an image\'s {length}² attention mask, '
                              + (f'{heads} heads x {length}² attention scores and probabilities, ' if score_copies
                                 else '') +
                              f'and its activations); {have / 2 ** 30:,.1f} GiB is available to this process on '
                              f'{torch.device(device)}: lower {key} or batch_size')


def naflex_loss_scale(mode: str, images: int, batch_size: int) -> float:
    """timm ``train.py --naflex-loss-scale``: a NaFlex batch of ``images`` (their number varies with the
    batch's sequence length) weighs ``images / batch_size`` (``'linear'``), its square root (``'sqrt'``) or 1."""
    ratio = images / batch_size
    return {'linear': ratio, 'sqrt': ratio ** 0.5, 'none': 1.0}[mode]


def _window(i: int, n: int, accum: int) -> int:
    """Micro-batches in the accumulation window of batch ``i`` of an ``n``-batch epoch: ``accum``, or
    the remainder for the epoch's last window (windows never cross an epoch boundary)."""
    return min(accum, n - (i // accum) * accum)


def train_one_epoch(run: RunContext, state: TrainState, epoch: int) -> dict:
    """Train epoch ``epoch`` from micro-batch ``state.batches_done`` to its end.

    Each accumulation window of ``w`` micro-batches scales its losses by ``1 / w`` and ends in one
    optimizer update, so the last, partial window of an epoch is a full-weight update of its own
    batches. Host synchronisations happen only at :meth:`RunContext.check` points.

    Returns:
        ``dict(train_loss, img_per_s, epoch_time, data_wait, lr, skipped)`` over the whole epoch (all
        ranks); ``data_wait``: the share of ``epoch_time`` the training process spent waiting for the
        next batch from the loader (ranks averaged): near 0 when the loader keeps up with the device.

    Raises:
        Preempted: a stop signal arrived (the checkpoint is written first).
        NonFiniteLossError: see :meth:`RunContext.check`.
    """
    set_loader_epoch(run.train_loader, epoch, start_batch=state.batches_done)
    state.optimizer.zero_grad(set_to_none=True)
    state.net.train()
    bar = tqdm(total=run.batches_per_epoch, initial=state.batches_done, desc=f"epoch {epoch + 1}/{run.epochs}",
               leave=False,
               disable=not (run.main and run.run_section['progress']), dynamic_ncols=True)
    try:  # the bar's line is cleared on every way out, so a stop message starts on its own line
        _run_batches(run, state, epoch, bar)
    finally:
        bar.close()
    run.check(state, force=True)
    return _epoch_stats(run, state)


def _run_batches(run: RunContext, state: TrainState, epoch: int, bar):
    """The micro-batches of ``epoch`` from ``state.batches_done``: forward, backward, updates, checks."""
    n, accum, meter = run.batches_per_epoch, run.accum, state.meter
    t0 = time.perf_counter() - meter['seconds']
    batches = iter(run.train_loader)
    for i in itertools.count(state.batches_done):
        waited = time.perf_counter()  # the host blocks here only when the loader is behind the device
        batch = next(batches, None)
        meter['data_seconds'] += time.perf_counter() - waited
        if batch is None:
            break
        images, labels, bad = batch
        seed_step(run.seed, epoch, i, run.rank)
        meter['skipped'] += len(bad)
        update = (i + 1) % accum == 0 or i + 1 == n
        if images is not None:
            try:
                _forward_backward(run, state, images, labels, scale=1.0 / _window(i, n, accum), sync_grads=update,
                                  prefixes=run.step_prefixes(epoch, i))
            except Exception as error:  # an allocation failure is the config's: say which key, in one line
                if not is_out_of_memory(error):
                    raise
                raise _out_of_memory(run, error) from None
        bar.update(1)
        if not update:
            continue
        _optimizer_step(run, state)
        state.batches_done = i + 1
        meter['seconds'] = time.perf_counter() - t0
        if run.check(state):
            raise Preempted(f'stopped by {run.stop_signal} at update {state.num_updates}; state saved to '
                            f'{run.checkpoint_path}: continue with --resume')
        if bar.n and state.num_updates % run.run_section['log_interval'] == 0 and not bar.disable:
            bar.set_postfix(loss=f"{meter['loss_sum'].item() / max(meter['seen'], 1):.3f}",
                            lr=f"{state.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{meter['seen'] * run.world / max(meter['seconds'], 1e-9):.0f}")


def _out_of_memory(run: RunContext, error: BaseException) -> ConfigError:
    """The one-line error for a training step that could not allocate its memory: the keys that set it."""
    keys = 'batch_size' + (', naflex_train_seq_lens' if run.data['naflex_loader'] else '')
    accum = ('; keep the global batch with global_batch_size (the steps accumulate)'
             if not run.optim['global_batch_size'] else '')
    reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
    return ConfigError(f"a training step of batch_size {run.data['batch_size']} ran out of memory on {run.device} "
                       f'({reason}): lower {keys}{accum}, or set grad_checkpointing: true')


def _epoch_stats(run: RunContext, state: TrainState) -> dict:
    """The epoch's averages over every rank (one all-reduce)."""
    meter = state.meter
    stats = torch.tensor([meter['loss_sum'].item(), meter['seen'], meter['skipped'], meter['data_seconds']],
                         dtype=torch.float64, device=run.device)
    if run.world > 1:
        dist.all_reduce(stats)
    loss_sum, seen, skipped, data_seconds = stats.tolist()
    seconds = max(meter['seconds'], 1e-9)
    return dict(train_loss=loss_sum / max(seen, 1), img_per_s=seen / seconds, epoch_time=meter['seconds'],
                data_wait=min(data_seconds / run.world / seconds, 1.0), lr=state.optimizer.param_groups[0]['lr'],
                skipped=int(skipped))


def _forward_backward(run: RunContext, state: TrainState, images, labels, scale: float, sync_grads: bool,
                      prefixes: List[Optional[float]]):
    """Forward and backward of one micro-batch at each of ``prefixes`` (``[None]``: the whole model; an
    elastic run's step fractions), their losses summed (MatFormer's joint objective); the meter records
    their mean. Gradients are all-reduced once, after the last backward of an update."""
    if isinstance(images, dict):  # a NaFlex batch: as many images as labels, fewer for longer sequences
        scale *= naflex_loss_scale(run.data['naflex_loss_scale'], len(labels), run.data['batch_size'])
    images = run.preprocess(images, train=True)
    if run.task != 'mae':
        labels = labels.to(run.device, non_blocking=True)
        if run.mixup is not None:
            if len(images) % 2:  # timm's Mixup needs an even batch (a skipped image can make it odd)
                images, labels = images[:-1], labels[:-1]
            images, labels = run.mixup(images, labels)
    elastic_step = prefixes != [None]
    for j, fraction in enumerate(prefixes):
        if elastic_step:
            elastic.set_prefix(state.model, fraction, run.elastic['elastic_tau'])
        with torch.autocast(run.device.type, dtype=run.amp_dtype, enabled=run.amp_dtype is not None):
            if run.task == 'mae':  # the masks are drawn from the micro-batch's seed (exact resume)
                loss = state.net(images)[0]
            else:
                loss = run.criterion(state.net(images), labels)
        state.meter['nonfinite'] |= ~torch.isfinite(loss.detach())
        state.meter['loss_sum'] += loss.detach().double() * len(labels) / len(prefixes)
        last = j + 1 == len(prefixes)
        with state.net.no_sync() if run.world > 1 and not (sync_grads and last) else contextlib.nullcontext():
            state.scaler.scale(loss * scale).backward()
    if elastic_step:
        elastic.set_prefix(state.model, None)
    state.meter['seen'] += len(labels)


def _optimizer_step(run: RunContext, state: TrainState):
    if run.optim['clip_grad']:
        state.scaler.unscale_(state.optimizer)
        dispatch_clip_grad(state.model.parameters(), run.optim['clip_grad'], mode=run.optim['clip_mode'])
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.num_updates += 1
    state.scheduler.step_update(state.num_updates)
    if state.ema is not None:
        state.ema.update(state.model, step=state.num_updates)
