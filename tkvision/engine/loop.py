"""The epoch loop: batches, gradient accumulation, optimizer updates, and the sync points where a
run checks its loss, agrees on a stop signal and writes its checkpoint.

`train_one_epoch` receives each part of a run it reads: the state it trains and saves
(``tkvision.engine.state.TrainState``), the data (``tkvision.engine.run_data.RunData``), the loss
(``tkvision.engine.loss.RunLoss``) and the clock (``tkvision.engine.clock.RunClock``), MAE's
``engine_pretrain.train_one_epoch`` shape: the epoch function gets what it uses and returns a dict of
averaged stats.

Mixed precision is branch-free (nanoGPT's form): ``torch.autocast(enabled=dtype is not None)`` and a
``GradScaler`` that is a no-op unless fp16, both as the device's plan says
(``tkvision.engine.distributed.DevicePlan``).
"""
import contextlib
import itertools
import time
from typing import List, Optional

import torch
import torch.distributed as dist
from timm.utils import dispatch_clip_grad, random_seed
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ..config_sections import OptimConfig
from ..data import set_loader_epoch
from ..growth import elastic
from ..utils.errors import ConfigError, NonFiniteLossError, Preempted
from ..utils.memory import is_out_of_memory
from ..utils.seeding import derive_seed
from .clock import RunClock
from .loss import RunLoss
from .run_data import RunData
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
        loss: RunLoss,
        clock: RunClock,
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
        loss: the step's targets and prefixes.
        clock: checks, checkpoints and stop signals.
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
    set_loader_epoch(data.train_loader, epoch, start_batch=state.batches_done)
    state.optimizer.zero_grad(set_to_none=True)
    state.net.train()
    bar = tqdm(total=data.batches_per_epoch, initial=state.batches_done, desc=f"epoch {epoch + 1}/{epochs}",
               leave=False, disable=not (data.processes.main and progress), dynamic_ncols=True)
    try:  # the bar's line is cleared on every way out, so a stop message starts on its own line
        _run_batches(state, data, loss, clock, epoch, data.processes.plan.autocast_dtype, bar)
    finally:
        bar.close()
    clock.check(state, force=True)
    return _epoch_stats(state, data.processes)


def _run_batches(state: TrainState, data: RunData, loss: RunLoss, clock: RunClock, epoch: int, amp_dtype, bar):
    """The micro-batches of ``epoch`` from ``state.batches_done``: forward, backward, updates, checks."""
    n, accum, meter = data.batches_per_epoch, data.accum, state.meter
    t0 = time.perf_counter() - meter['seconds']
    batches = iter(data.train_loader)
    for i in itertools.count(state.batches_done):
        waited = time.perf_counter()  # the host blocks here only when the loader is behind the device
        batch = next(batches, None)
        meter['data_seconds'] += time.perf_counter() - waited
        if batch is None:
            break
        images, labels, bad = batch
        seed_step(data.seed, epoch, i, data.processes.rank)
        meter['skipped'] += len(bad)
        update = (i + 1) % accum == 0 or i + 1 == n
        if images is not None:
            try:
                _forward_backward(state, data, loss, images, labels, amp_dtype,
                                  scale=1.0 / _window(i, n, accum) * data.loss_scale(len(labels)),
                                  sync_grads=update, prefixes=loss.step_prefixes(epoch, i))
            except Exception as error:  # an allocation failure is the config's: say which key, in one line
                if not is_out_of_memory(error):
                    raise
                raise _out_of_memory(data, loss, error) from None
        bar.update(1)
        if not update:
            continue
        _optimizer_step(state, loss.optim)
        state.batches_done = i + 1
        meter['seconds'] = time.perf_counter() - t0
        if clock.check(state):
            raise Preempted(f'stopped by {clock.stop_signal} at update {state.num_updates}; state saved to '
                            f'{clock.checkpoint_path}: continue with --resume')
        if bar.n and state.num_updates % clock.log_interval == 0 and not bar.disable:
            bar.set_postfix(loss=f"{meter['loss_sum'].item() / max(meter['seen'], 1):.3f}",
                            lr=f"{state.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{meter['seen'] * data.processes.world / max(meter['seconds'], 1e-9):.0f}")


def _out_of_memory(data: RunData, loss: RunLoss, error: BaseException) -> ConfigError:
    """The one-line error for a training step that could not allocate its memory: the keys that set it."""
    keys = 'batch_size' + (', naflex_train_seq_lens' if data.data.naflex_loader else '')
    accum = ('; keep the global batch with global_batch_size (the steps accumulate)'
             if not loss.optim.global_batch_size else '')
    reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
    return ConfigError(f"a training step of batch_size {data.data.batch_size} ran out of memory on "
                       f'{data.processes.device} ({reason}): lower {keys}{accum}, or set grad_checkpointing: true')


def _epoch_stats(state: TrainState, processes) -> dict:
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


def _forward_backward(state: TrainState, data: RunData, loss: RunLoss, images, labels, amp_dtype, scale: float,
                      sync_grads: bool, prefixes: List[Optional[float]]):
    """Forward and backward of one micro-batch at each of ``prefixes`` (``[None]``: the whole model; an
    elastic run's step fractions, largest first), their losses summed (MatFormer's joint objective); each
    forward's targets are the labels or, with distillation, soft predictions (``RunLoss.soft_target``: the
    whole model's logits of this step are the smaller prefixes' teacher). The meter records the losses' mean.
    Gradients are all-reduced once, after the last backward of an update."""
    device = data.processes.device
    images = data.preprocess(images, train=True)
    if loss.task != 'mae':
        images, labels = loss.targets(images, labels.to(device, non_blocking=True))
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        teacher, whole = loss.teacher_logits(images), None
    for j, fraction in enumerate(prefixes):
        if loss.elastic_step:
            loss.set_prefix(state.model, fraction)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            output = state.net(images)  # an MAE draws its masks from the micro-batch's seed (exact resume)
            value = loss(output, labels, loss.soft_target(fraction, whole, teacher))
        if fraction is None and loss.task != 'mae':
            whole = output.detach()
        state.meter['nonfinite'] |= ~torch.isfinite(value.detach())
        state.meter['loss_sum'] += value.detach().double() * len(labels) / len(prefixes)
        last = j + 1 == len(prefixes)
        net = state.net
        with net.no_sync() if isinstance(net, DDP) and not (sync_grads and last) else contextlib.nullcontext():
            state.scaler.scale(value * scale).backward()
    if loss.elastic_step:  # every token and the layers' own τ, as evaluation and checkpoints expect
        elastic.set_prefix(state.model, None)
    state.meter['seen'] += len(labels)


def _optimizer_step(state: TrainState, optim: OptimConfig):
    """One optimizer update of ``state`` with the optimisation section's gradient clipping; then the schedule
    and the EMA follow."""
    if optim.clip_grad:
        state.scaler.unscale_(state.optimizer)
        dispatch_clip_grad(state.model.parameters(), optim.clip_grad, mode=optim.clip_mode)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.num_updates += 1
    state.scheduler.step_update(state.num_updates)
    if state.ema is not None:
        state.ema.update(state.model, step=state.num_updates)
