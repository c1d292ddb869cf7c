"""The epoch loop: batches, gradient accumulation, optimizer updates, and the sync points where a
run checks its loss, agrees on a stop signal and writes its checkpoint.

`train_one_epoch` receives each part of a run it reads: the state it trains and saves
(``tkvision.engine.state.TrainState``), the data (``tkvision.engine.run_data.RunData``), the task that owns each
step's forward passes and losses (``tkvision.engine.loss.TrainTask``: the loop knows no task names, prefixes or
distillation), the optimizer's update (``tkvision.engine.optim.RunOptim.step``), the clock
(``tkvision.engine.clock.RunClock``) and the processes, MAE's ``engine_pretrain.train_one_epoch`` shape: the epoch
function gets what it uses and returns a dict of averaged stats.

Mixed precision is branch-free (nanoGPT's form): ``torch.autocast(enabled=dtype is not None)`` and a
``GradScaler`` that is a no-op unless fp16, both as the device's plan says
(``tkvision.engine.distributed.DevicePlan``).
"""
import contextlib
import itertools
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from timm.utils import random_seed
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ..data import set_loader_epoch
from ..utils.errors import ConfigError, NonFiniteLossError, Preempted
from ..utils.memory import is_out_of_memory
from ..utils.seeding import derive_seed
from .clock import RunClock
from .distributed import Processes
from .healing import RolledBack
from .loss import TrainTask
from .optim import RunOptim
from .run_data import RunData
from .runlog import RunLog
from .state import TrainState

__all__ = ['train_one_epoch', 'seed_step', 'NonFiniteLossError', 'Preempted']


def seed_step(
        seed: int,
        epoch: int,
        batch: int,
        rank: int = 0,
) -> None:
    """Seed Python, NumPy and torch (timm's ``random_seed``) for micro-batch ``batch`` of ``epoch`` on
    ``rank``, from ``derive_seed('step', seed, epoch, batch)`` (31 bits: timm adds the rank)."""
    random_seed(derive_seed('step', seed, epoch, batch, bits=31), rank)


def _window(i: int, n: int, accum: int) -> int:
    """Micro-batches in the accumulation window of batch ``i`` of an ``n``-batch epoch: ``accum``, or
    the remainder for the epoch's last window (windows never cross an epoch boundary)."""
    return min(accum, n - (i // accum) * accum)


def train_one_epoch(
        state: TrainState,
        data: RunData,
        task: TrainTask,
        optim: RunOptim,
        clock: RunClock,
        processes: Processes,
        log: RunLog,
        epoch: int,
        *,
        epochs: int,
        progress: bool = True,
) -> dict:
    """Train epoch ``epoch`` (of ``epochs``) from micro-batch ``state.batches_done`` to its end.

    Each accumulation window of ``w`` micro-batches scales its losses by ``1 / w`` and ends in one
    optimizer update, so the last, partial window of an epoch is a full-weight update of its own
    batches. Host synchronisations happen only at ``clock.check`` points.

    Args:
        state: what is trained and saved.
        data: the loaders and preprocessing.
        task: each step's forward passes and losses.
        optim: the optimizer's update (clipping, schedule, EMA).
        clock: checks, checkpoints and stop signals.
        processes: this process among the job's (its device and its precision plan).
        log: the run log (each update's loss and lr, sent at the sync points).
        epoch: the epoch, counted from 0.
        epochs: the run's epochs (for the progress bar).
        progress: show a progress bar (rank 0 only).

    Returns:
        ``dict(train_loss, img_per_s, epoch_time, data_wait, lr, skipped)`` over the whole epoch (all
        ranks); ``data_wait``: the share of ``epoch_time`` the training process spent waiting for the
        next batch from the loader (ranks averaged): near 0 when the loader keeps up with the device.

    Raises:
        Preempted: a stop signal arrived (the checkpoint is written first).
        NonFiniteLossError: see ``RunClock.check``.
        ConfigError: a step ran out of memory (the keys to lower named).
    """
    healer = clock.healer
    if healer.active:
        healer.snapshot(state)  # the epoch's start: a rollback never crosses into the epoch before
    while True:
        set_loader_epoch(data.train_loader, epoch, start_batch=state.batches_done)
        state.optimizer.zero_grad(set_to_none=True)
        state.net.train()
        bar = tqdm(total=data.batches_per_epoch, initial=state.batches_done, desc=f"epoch {epoch + 1}/{epochs}",
                   leave=False, disable=not (processes.main and progress), dynamic_ncols=True)
        try:  # the bar's line is cleared on every way out, so a stop message starts on its own line
            _run_batches(state, _Step(data, task, optim, clock, processes, log), epoch, bar)
            clock.check(state, force=True)
            return _epoch_stats(state, processes)
        except RolledBack as rolled:  # back at the snapshot: its window is skipped from now on
            bar.close()
            log.rolled_back(rolled.event, healer.events, healer.max_events, state)
            clock.save(state)  # the rollback's state and skips, so a kill from here on resumes past it
        finally:
            bar.close()


class _Step(NamedTuple):
    """The parts one micro-batch uses (`train_one_epoch`'s arguments)."""
    data: RunData
    task: TrainTask
    optim: RunOptim
    clock: RunClock
    processes: Processes
    log: RunLog


def _run_batches(state: TrainState, parts: _Step, epoch: int, bar):
    """The micro-batches of ``epoch`` from ``state.batches_done``: forward, backward, updates, checks."""
    data, clock, processes, log = parts.data, parts.clock, parts.processes, parts.log
    n, accum, meter, healer = data.batches_per_epoch, data.accum, state.meter, clock.healer
    t0 = time.perf_counter() - meter['seconds']
    log.mark(state)
    healer.mark(meter)
    trained = 0  # micro-batches of the current accumulation window that trained (not skipped)
    batches = iter(data.train_loader)
    for i in itertools.count(state.batches_done):
        waited = time.perf_counter()  # the host blocks here only when the loader is behind the device
        batch = next(batches, None)
        meter['data_seconds'] += time.perf_counter() - waited
        if batch is None:
            break
        images, labels, bad = batch
        seed_step(data.seed, epoch, i, processes.rank)
        meter['skipped'] += len(bad)
        update = (i + 1) % accum == 0 or i + 1 == n
        skip = healer.skipped(epoch, i)  # a rolled-back window, or skip_batches: loaded, not trained
        trained += not skip
        if images is not None and not skip:
            try:
                _forward_backward(state, parts, images, labels, epoch, i, sync_grads=update,
                                  scale=1.0 / _window(i, n, accum) * data.loss_scale(len(labels)))
            except Exception as error:  # an allocation failure is the config's: say which key, in one line
                if not is_out_of_memory(error):
                    raise
                raise _out_of_memory(data, parts.optim, processes, error) from None
        bar.update(1)
        if not update:
            continue
        if not trained:  # a whole window skipped: no update, only the position moves
            state.batches_done = i + 1
            continue
        trained = 0
        parts.optim.step(state)
        state.batches_done = i + 1
        meter['seconds'] = time.perf_counter() - t0
        log.update(state)
        healer.update(state.num_updates, meter)
        if clock.check(state):
            raise Preempted(f'stopped by {clock.stop_signal} at update {state.num_updates}; state saved to '
                            f'{clock.checkpoint_path}: continue with --resume', clock.stop_signal)
        if state.num_updates % clock.log_interval == 0:  # a sync point already: the kept updates cost no other
            log.flush(state)
        if bar.n and state.num_updates % clock.log_interval == 0 and not bar.disable:
            bar.set_postfix(loss=f"{meter['loss_sum'].item() / max(meter['seen'], 1):.3f}",
                            lr=f"{state.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{meter['seen'] * processes.world / max(meter['seconds'], 1e-9):.0f}")


def _out_of_memory(data: RunData, optim: RunOptim, processes: Processes, error: BaseException) -> ConfigError:
    """The one-line error for a training step that could not allocate its memory: the keys that set it."""
    keys = 'batch_size' + (', naflex_train_seq_lens' if data.naflex_patch_size else '')
    accum = ('; keep the global batch with global_batch_size (the steps accumulate)'
             if not optim.sets_global_batch else '')
    reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
    return ConfigError(f"a training step of batch_size {data.batch_size} ran out of memory on "
                       f'{processes.device} ({reason}): lower {keys}{accum}, or set grad_checkpointing: true')


def _epoch_stats(state: TrainState, processes: Processes) -> dict:
    """The epoch's averages over every rank (one all-reduce)."""
    meter = state.meter
    stats = torch.tensor([meter['loss_sum'].item(), meter['seen'], meter['skipped'], meter['data_seconds']],
                         dtype=torch.float64, device=processes.device)
    if processes.world > 1:
        dist.all_reduce(stats)
    loss_sum, seen, skipped, data_seconds = stats.tolist()
    seconds = max(meter['seconds'], 1e-9)
    return dict(train_loss=loss_sum / max(seen, 1), img_per_s=seen / seconds, epoch_time=meter['seconds'],
                data_wait=min(data_seconds / processes.world / seconds, 1.0),
                lr=state.optimizer.param_groups[0]['lr'], skipped=int(skipped))


def _forward_backward(state: TrainState, parts: _Step, images, labels, epoch: int, batch: int, *, scale: float,
                      sync_grads: bool):
    """Forward and backward of one micro-batch: the task yields each forward's loss (one per prefix of an elastic
    step, MatFormer's joint objective), each back-propagated as it comes, scaled by ``scale``; the meter records
    their mean. Gradients are all-reduced once, after the last backward of an update."""
    device, dtype = parts.processes.device, parts.processes.plan.autocast_dtype
    images = parts.data.preprocess(images, train=True)
    labels = labels.to(device, non_blocking=True)

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
    net = state.net
    with contextlib.closing(parts.task.losses(net, state.model, images, labels, autocast, epoch, batch)) as losses:
        for loss in losses:
            state.meter['nonfinite'] |= ~torch.isfinite(loss.value.detach())
            state.meter['loss_sum'] += loss.value.detach().double() * loss.images / loss.forwards
            synced = sync_grads and loss.last
            with net.no_sync() if isinstance(net, DDP) and not synced else contextlib.nullcontext():
                state.scaler.scale(loss.value * scale).backward()
            if loss.last:
                state.meter['seen'] += loss.images
