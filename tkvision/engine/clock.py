"""The run's clock and signals: when a run checks its loss, agrees on a stop signal and writes its checkpoint.

`RunClock` is the part of a run that decides *when*: a stop signal from SLURM or torchrun (the run
saves and stops at its next check), a checkpoint every ``checkpoint_every_steps`` updates or
``checkpoint_every_minutes`` minutes, and the host synchronisation that finds a NaN / inf loss. It is given the run
section's timing values, not the section.
"""
import os
import signal
import sys
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..utils.errors import NonFiniteLossError
from .checkpoint import save_training_checkpoint
from .distributed import Processes
from .healing import Healer, RolledBack
from .state import TrainState

__all__ = ['RunClock', 'STOP_SIGNALS']

#: What SLURM and torchrun send before stopping a job (SIGTERM, SIGUSR1), and submitit's pre-emption and
#: time-out signal (SIGUSR2, ``tkvision.experiments.points.PointJob``): the run checkpoints and exits.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class RunClock:
    """When a run checks, saves and stops.

    Args:
        processes: this process among the job's (``tkvision.engine.distributed.Processes``).
        checkpoint_path: the run's ``last.pth``.
        log_interval: updates between checks (``log_interval``).
        every_steps: ``checkpoint_every_steps`` (None: off).
        every_minutes: ``checkpoint_every_minutes`` (None: off).
        before_save: called with the state before each checkpoint is written, on every rank (the run log's
            ``flush``: the updates a checkpoint covers reach the trackers before it exists).
        healer: what a failed check does (``tkvision.engine.healing.Healer``: stop, or roll back and skip); None:
            stop on a non-finite loss.

    Attributes:
        stop_signal: the name of the stop signal received (``'SIGTERM'``, ``'SIGINT'`` for Ctrl-C), or None.
        checked_update: the update up to which the loss is known finite.
        last_save: ``time.monotonic()`` of the last checkpoint.
    """

    def __init__(
            self,
            processes: Processes,
            checkpoint_path: str,
            *,
            log_interval: int = 50,
            every_steps: Optional[int] = None,
            every_minutes: Optional[float] = None,
            before_save: Optional[Callable[[TrainState], None]] = None,
            healer: Optional[Healer] = None,
    ):
        self.log_interval, self.every_steps, self.every_minutes = log_interval, every_steps, every_minutes
        self.before_save = before_save
        self.healer = healer or Healer.stopping(log_interval, processes.world)
        self.processes, self.checkpoint_path = processes, checkpoint_path
        self.stop_signal: Optional[str] = None
        self.last_save = time.monotonic()
        self.checked_update = 0

    def on_signal(self, signum: int, _frame: object) -> None:
        """Signal handler: remember the signal; the loop saves its state and stops at its next check
        (every update on one process)."""
        self.stop_signal = signal.Signals(signum).name

    def on_interrupt(self, signum: int, frame: object) -> None:
        """SIGINT handler (Ctrl-C at a terminal): the first is a stop request like SIGTERM's (the run saves at its
        next check, every update on one process, and exits 130); it hands SIGINT back to Python's default, so a
        second Ctrl-C raises ``KeyboardInterrupt`` at once and aborts without saving."""
        self.on_signal(signum, frame)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.processes.main:
            print('\nCtrl-C: saving at the next update, then stopping (press Ctrl-C again to abort without saving)',
                  file=sys.stderr, flush=True)

    def save(self, state: TrainState) -> None:
        """Write ``last.pth`` of ``state`` (a ``tkvision.engine.state.TrainState``; rank 0, atomic; called on every
        rank: the running epoch's sums are reduced over the processes first) and restart the checkpoint clock."""
        meter = state.reduced_meter()
        if self.before_save is not None:
            self.before_save(state)
        if self.healer.active:  # a rollback never goes behind the last checkpoint
            self.healer.snapshot(state)
        if self.processes.main:
            save_training_checkpoint(dict(state.state_dict(meter), healing=self.healer.state_dict()),
                                     self.checkpoint_path)
        self.last_save = time.monotonic()

    def check(self, state: TrainState, force: bool = False) -> bool:
        """At a sync point (every ``log_interval`` / ``checkpoint_every_steps`` updates, or ``force``):
        one host synchronisation that checks the loss of the updates since the last check on every
        rank, agrees on a stop signal and on a time-based checkpoint, and writes it if due.

        Args:
            state: the run's ``tkvision.engine.state.TrainState`` (its update count and loss meter).
            force: check now whatever the update count (the end of an epoch); saves nothing by itself.

        Returns:
            True when the run must stop (a stop signal on any rank); the checkpoint is then written.

        Raises:
            NonFiniteLossError: a NaN / inf loss since the last check (nothing is saved after it), or the healer's
                stop error on a spike (``SpikeError``).
            RolledBack: the healer rolled the run back to its snapshot (``on_nonfinite`` / ``on_spike: rollback``).
        """
        u, world = state.num_updates, self.processes.world
        step_due = self.every_steps is not None and u % self.every_steps == 0
        if not (force or step_due or u % self.log_interval == 0 or (world == 1 and self.stop_signal)):
            return False
        time_due = self.every_minutes is not None and time.monotonic() - self.last_save >= 60 * self.every_minutes
        flags = torch.cat([state.meter['nonfinite'].float().view(1),
                           torch.tensor([float(bool(self.stop_signal)), float(time_due)],
                                        device=self.processes.device)])
        if world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        nonfinite, stop, time_due = (bool(v) for v in flags.tolist())
        last = (f'the last good checkpoint is {self.checkpoint_path}' if os.path.isfile(self.checkpoint_path)
                else 'no checkpoint was written before it')
        healer = self.healer
        if nonfinite and healer.on_nonfinite == 'stop' and not healer.watches_spikes:
            raise NonFiniteLossError(f'the training loss became NaN or infinite between updates '
                                     f'{self.checked_update + 1} and {u} (epoch {state.epochs_done + 1}); stopping: '
                                     f'{last}. Try a lower lr, clip_grad: 1.0, amp: bf16 instead of fp16, or '
                                     'on_nonfinite: rollback')
        event = healer.inspect(nonfinite, state.epochs_done, self.processes.device) if (
            nonfinite or healer.watches_spikes) else None
        if event is not None:
            if healer.action(event) != 'rollback':
                raise healer.stop_error(event, last)
            raise RolledBack(healer.roll_back(state, event, state.batches_done))
        self.checked_update = u
        if healer.due(u):
            healer.snapshot(state)
        if (step_due or time_due or stop) and not force:
            self.save(state)
        return stop
