"""Runs that heal themselves: a non-finite or spiking loss rolls the run back to an in-memory snapshot and skips the
micro-batches of the offending window, with no one awake (the ``healing`` section, `HealingConfig`).

PaLM's authors did this by hand ("restart from a checkpoint roughly 100 steps before the spike, and skip roughly
200-500 data batches", Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311, §5.1); torchtitan, big_vision and
Lightning stop or flag. Here, with ``on_nonfinite: rollback`` or ``on_spike: rollback``:

- the run keeps a **snapshot** in host memory (model, optimizer, EMA, grad scaler, the running epoch's sums, the
  update counters, the spike detector's history; the random draws are seeded per micro-batch and sample, so they need
  none) at the start of each epoch, every ``snapshot_every`` updates at a check point, and at every checkpoint;
- at each check point (every ``log_interval`` updates, before any checkpoint) every process takes the same decision
  from the same numbers: the loss of each update since the last check, averaged over the processes (one
  all-reduce), is an **event** when it is not finite, or when it exceeds ``spike_factor`` times the mean of the last
  ``spike_window`` accepted updates;
- on an event the run **restores** the snapshot, records the micro-batches from the snapshot to the check point as
  skipped (``rollbacks.csv`` and every checkpoint hold them), writes a checkpoint and trains on from the snapshot,
  skipping them; each event is one line on the console and one scalar in every tracker (at the update rolled back
  to); more than ``max_rollbacks`` events end the run, naming them all (the data or the recipe is at fault).

Exactness: a healed run ends bit-identical to a run given the same skips from the start (``skip_batches``), since
what a micro-batch draws depends only on the seed, its epoch and its index (``tkvision.utils.seeding``), and the
snapshot is the state that run has at the same point (``tests/test_healing.py``).
"""
import copy
import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from ..utils.config_fields import choice, integer, key, number, rule
from ..utils.errors import NonFiniteLossError, RunError

__all__ = ['HealingConfig', 'Healer', 'RolledBack', 'SpikeError', 'event_line']


def _is_ranges(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(r, (list, tuple)) and len(r) == 3 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                             for v in r) and r[1] <= r[2] for r in value)


@dataclasses.dataclass(frozen=True)
class HealingConfig:
    """What a run does on a non-finite or spiking loss (the ``healing`` section; module docstring)."""

    on_nonfinite: str = key('stop', allowed=choice('stop', 'rollback'), resume=True)
    """A NaN or infinite loss (or gradient norm): ``'stop'`` (name the last good checkpoint) or ``'rollback'``."""
    on_spike: str = key('off', allowed=choice('off', 'stop', 'rollback'), resume=True)
    """A loss above ``spike_factor`` times its running mean: ``'off'``, ``'stop'`` or ``'rollback'``."""
    spike_factor: float = key(3.0, allowed=number(1, lo_open=True), resume=True)
    """How far above the running mean of the training loss an update's loss is a spike."""
    spike_window: int = key(50, allowed=integer(2), resume=True)
    """Updates in the running mean (no spike is called before it holds that many)."""
    snapshot_every: Optional[int] = key(None, allowed=integer(1, null=True), resume=True)
    """Updates between in-memory snapshots, at check points (null: every ``log_interval``); also at each epoch's
    start and at every checkpoint."""
    max_rollbacks: int = key(5, allowed=integer(1), resume=True)
    """Events a run may roll back from; one more ends it, naming them all."""
    skip_batches: Tuple[Tuple[int, int, int], ...] = key((), allowed=rule(
        _is_ranges, 'a list of [epoch, first, last] micro-batch ranges, each counted from 1, first <= last'),
        resume=True)
    """Micro-batches never trained, ``[[epoch, first, last], ...]`` (counted from 1, inclusive): PaLM's manual skip,
    and the reference a healed run equals."""


class RolledBack(Exception):
    """Raised out of a check point after the run was rolled back (the loop restarts its epoch from the snapshot)."""

    def __init__(self, event: dict):
        super().__init__(event['reason'])
        self.event = event


class SpikeError(RunError):
    """The training loss spiked and ``on_spike`` is ``stop``; the message names the update, the loss and its running
    mean, and what to set to heal it."""


class Healer:
    """The rollbacks of one run (module docstring).

    Args:
        config: the healing section.
        log_interval: updates between check points (the default ``snapshot_every``).
        world: the job's processes (the losses are averaged over them at each check).

    Attributes:
        events: every event so far, ``dict(update, epoch, loss, mean, reason, back_to, first, last)`` (epoch and
            micro-batches counted from 1, as printed).
    """

    def __init__(self, config: HealingConfig, log_interval: int, world: int = 1):
        self.on_nonfinite, self.on_spike = config.on_nonfinite, config.on_spike
        self.factor, self.window, self.max_events = config.spike_factor, config.spike_window, config.max_rollbacks
        self.snapshot_every = config.snapshot_every or log_interval
        self.world = world
        self.events: List[dict] = []
        self.history: List[float] = []
        self._skips = [(e - 1, first - 1, last - 1) for e, first, last in config.skip_batches]
        self._pending: List[Tuple[int, torch.Tensor]] = []
        self._mark: Optional[Tuple[torch.Tensor, int]] = None
        self._snapshot: Optional[Dict[str, Any]] = None

    @classmethod
    def stopping(cls, log_interval: int, world: int = 1) -> 'Healer':
        """The section's defaults: stop on a non-finite loss, no spike watch, no snapshot."""
        return cls(HealingConfig(), log_interval, world)

    @property
    def active(self) -> bool:
        """Whether anything rolls back (else the run keeps today's behaviour and takes no snapshot)."""
        return self.on_nonfinite == 'rollback' or self.on_spike == 'rollback'

    @property
    def watches_spikes(self) -> bool:
        return self.on_spike != 'off'

    def skipped(self, epoch: int, batch: int) -> bool:
        """Whether micro-batch ``batch`` of ``epoch`` (both from 0) is one the run does not train."""
        return any(e == epoch and first <= batch <= last for e, first, last in self._skips)

    def mark(self, meter: Mapping[str, Any]) -> None:
        """Where the running epoch's sums stand as an epoch starts or resumes (the next update's loss is what they
        gain)."""
        self._mark = (meter['loss_sum'].clone(), meter['seen'])

    def update(self, num_updates: int, meter: Mapping[str, Any]) -> None:
        """After optimizer update ``num_updates``: keep its mean loss (a tensor on the device: no host sync)."""
        if not self.watches_spikes or self._mark is None:
            return
        loss_sum, seen = self._mark
        self._pending.append((num_updates, (meter['loss_sum'] - loss_sum) / max(meter['seen'] - seen, 1)))
        self._mark = (meter['loss_sum'].clone(), meter['seen'])

    def inspect(self, nonfinite: bool, epoch: int, device: torch.device) -> Optional[dict]:
        """At a check point (every process, the same ``nonfinite`` already agreed): the event among the updates kept
        since the last check, or None (their losses then join the running mean).

        Returns:
            ``dict(update, epoch, loss, mean, reason)`` (``reason``: ``'nonfinite'`` or ``'spike'``) or None.
        """
        pending, self._pending = self._pending, []
        losses: List[float] = []
        if pending:
            stacked = torch.stack([loss.double() for _, loss in pending]).to(device)
            if self.world > 1:
                dist.all_reduce(stacked)
                stacked /= self.world
            losses = stacked.tolist()
        if nonfinite:
            bad = next(((u, v) for (u, _), v in zip(pending, losses) if not math.isfinite(v)), (None, math.nan))
            return dict(update=bad[0], epoch=epoch + 1, loss=bad[1], mean=self._mean(), reason='nonfinite')
        for (update, _), loss in zip(pending, losses):
            mean = self._mean()
            if len(self.history) >= self.window and loss > self.factor * mean:
                return dict(update=update, epoch=epoch + 1, loss=loss, mean=mean, reason='spike')
            self.history = (self.history + [loss])[-self.window:]
        return None

    def _mean(self) -> float:
        return sum(self.history) / len(self.history) if self.history else math.nan

    def action(self, event: dict) -> str:
        """``'stop'`` or ``'rollback'``: what the section says of ``event``."""
        return self.on_nonfinite if event['reason'] == 'nonfinite' else self.on_spike

    def stop_error(self, event: dict, checkpoint: str) -> RunError:
        """The error that ends a run on ``event`` with ``on_* : stop``."""
        if event['reason'] == 'nonfinite':
            return NonFiniteLossError(f"the training loss became NaN or infinite at update {event['update']} (epoch "
                                      f"{event['epoch']}); stopping: the last good checkpoint is {checkpoint}. Try a "
                                      'lower lr, clip_grad: 1.0, amp: bf16 instead of fp16, or on_nonfinite: rollback')
        return SpikeError(f"the training loss spiked at update {event['update']} (epoch {event['epoch']}): "
                          f"{event['loss']:.4g}, {event['loss'] / event['mean']:.1f}x its running mean "
                          f"{event['mean']:.4g}; stopping: the last good checkpoint is {checkpoint}. Set on_spike: "
                          'rollback to skip the window and go on, or raise spike_factor')

    def snapshot(self, state: Any) -> None:
        """Keep ``state`` (a ``tkvision.engine.state.TrainState``) in host memory: the rollback's target."""
        def host(value):
            return value.detach().to('cpu', copy=True) if isinstance(value, torch.Tensor) else copy.deepcopy(value)
        meter = state.meter
        self._snapshot = dict(
            model=tree_map(host, state.model.state_dict()), optimizer=tree_map(host, state.optimizer.state_dict()),
            ema=tree_map(host, state.ema.module.state_dict()) if state.ema else None,
            scaler=state.scaler.state_dict(), epochs_done=state.epochs_done, batches_done=state.batches_done,
            num_updates=state.num_updates, history=list(self.history),
            meter=dict(meter, loss_sum=meter['loss_sum'].clone(), nonfinite=meter['nonfinite'].clone()))

    def due(self, num_updates: int) -> bool:
        """Whether a check point at ``num_updates`` takes a snapshot."""
        return self.active and num_updates % self.snapshot_every == 0

    def roll_back(self, state: Any, event: dict, batches_done: int) -> dict:
        """Restore the snapshot into ``state``, record the micro-batches from it up to ``batches_done`` (the check
        point's position) as skipped, and return ``event`` completed (``back_to``, ``first``, ``last``).

        Raises:
            RunError: more than ``max_rollbacks`` events, naming them all; or no snapshot to go back to.
        """
        snap = self._snapshot
        if snap is None:
            raise RunError(f"{event['reason']} at update {event['update']}: no snapshot to roll back to")
        epoch = snap['epochs_done']
        event = dict(event, back_to=snap['num_updates'], first=snap['batches_done'] + 1, last=batches_done)
        self.events.append(event)
        if len(self.events) > self.max_events:
            raise RunError(f'{len(self.events)} rollbacks, more than max_rollbacks {self.max_events}: the data or the '
                           'recipe is at fault, not one batch; the events: '
                           + '; '.join(_words(e) for e in self.events))
        self._skips.append((epoch, snap['batches_done'], batches_done - 1))
        state.model.load_state_dict(snap['model'])
        state.optimizer.load_state_dict(snap['optimizer'])
        if state.ema is not None and snap['ema'] is not None:
            state.ema.module.load_state_dict(snap['ema'])
        state.scaler.load_state_dict(snap['scaler'])
        state.epochs_done, state.batches_done, state.num_updates = epoch, snap['batches_done'], snap['num_updates']
        state.scheduler.step_update(state.num_updates)
        state.meter = dict(snap['meter'], loss_sum=snap['meter']['loss_sum'].clone(),
                           nonfinite=snap['meter']['nonfinite'].clone())
        self.history = list(snap['history'])
        self._pending, self._mark = [], (state.meter['loss_sum'].clone(), state.meter['seen'])
        return event

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the events, the skipped ranges (from 1, inclusive) and the running mean's
        history."""
        return dict(events=list(self.events), skips=[[e + 1, f + 1, last + 1] for e, f, last in self._skips],
                    history=list(self.history))

    def load_state_dict(self, saved: dict) -> None:
        """Take a checkpoint's `state_dict` back (its skips replace the config's, which they include)."""
        self.events = list(saved.get('events', []))
        self.history = list(saved.get('history', []))
        self._skips = [(e - 1, f - 1, last - 1) for e, f, last in saved.get('skips', [])] or self._skips


def _words(event: dict) -> str:
    """One event in words (the console line and the cap's message)."""
    what = ('a NaN or infinite loss' if event['reason'] == 'nonfinite' else
            f"loss {event['loss']:.4g}, {event['loss'] / event['mean']:.1f}x its running mean {event['mean']:.4g}")
    return (f"{what} at update {event['update']} (epoch {event['epoch']}): back to update {event['back_to']}, "
            f"skipping micro-batches {event['first']}-{event['last']} of epoch {event['epoch']}")


def event_line(event: dict, events: int, cap: int) -> str:
    """The console's line for ``event``, the ``events``-th of at most ``cap``."""
    return f'rollback {events} of at most {cap}: {_words(event)}'

