"""The context of a run: what it uses but does not save, by concern.

[`RunContext`][tkvision.engine.context.RunContext] holds a run's processes, its data
(``tkvision.engine.run_data.RunData``), its loss (``tkvision.engine.loss.RunLoss``) and its clock
(``tkvision.engine.clock.RunClock``), each built from the config sections it reads by
[`build_context`][tkvision.engine.context.build_context]; ``tkvision.engine.state.TrainState`` holds what is saved.
"""
import dataclasses
import os
from typing import Optional, Protocol

from ..config_sections import TrainConfig
from .checkpoint import LAST_CHECKPOINT
from .clock import RunClock
from .config import resolve_accum_steps, resolve_lr
from .distributed import Processes
from .loss import RunLoss
from .optim import RunOptim
from .run_data import RunData

__all__ = ['RunContext', 'ScalarWriter', 'build_context']


class ScalarWriter(Protocol):
    """What the trainer writes scalars to: TensorBoard's ``SummaryWriter`` (an optional extra, imported only when
    ``tensorboard: true``)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        """Record ``scalar_value`` under ``tag`` at ``global_step`` (the epoch, counted from 1)."""

    def close(self) -> None:
        """Flush and close the log."""


@dataclasses.dataclass
class RunContext:
    """What a run uses but does not save, by concern: its processes, data, loss and clock, and the few values of
    the run section the trainer itself reads (kept as values: the context hands on no config section). Each stage
    receives the parts it reads (the epoch loop: data, loss, clock; ``tkvision.engine.run_eval``: the context);
    ``tkvision.engine.state.TrainState`` holds what is saved.

    Attributes:
        processes: this process among the job's.
        data: datasets, loaders, preprocessing.
        loss: the step's targets and prefixes.
        clock: checks, checkpoints, stop signals.
        optim: the optimizer and schedule, rebuilt after growth and on resume; the growth steps.
        model_name: the model's registry name.
        epochs: the run's epochs.
        task: ``'classify'``, ``'mae'`` or ``'linprobe'``.
        out: the run's output folder (``output``).
        seed: the run's seed (growth's new tokens, MAE's evaluation masks).
        amp: ``None``, ``'bf16'`` or ``'fp16'``.
        eval_every: epochs between evaluations.
        save_every: epochs between checkpoints.
        progress: whether each epoch shows a progress bar.
        tensorboard: whether rank 0 writes TensorBoard scalars.
        writer: TensorBoard's ``SummaryWriter`` (rank 0 with ``tensorboard: true``), else None.
    """
    processes: Processes
    data: RunData
    loss: RunLoss
    clock: RunClock
    optim: RunOptim
    model_name: str
    epochs: int
    task: str
    out: str
    seed: int
    amp: Optional[str]
    eval_every: int
    save_every: int
    progress: bool
    tensorboard: bool
    writer: Optional[ScalarWriter] = None

    @property
    def main(self) -> bool:
        """Whether this process is rank 0 (it prints and writes the run's files)."""
        return self.processes.main


def build_context(
        config: TrainConfig,
        processes: Processes,
) -> RunContext:
    """The run's data, loss, clock and optimisation, each built from the sections it reads.

    Args:
        config: a resolved config (``tkvision.engine.trainer.resolve_run_config``).
        processes: this process among the job's.

    Raises:
        ConfigError: as ``RunData`` and ``RunLoss`` (a batch larger than the data, a teacher that cannot load).
    """
    run, optim = config.run, config.optim
    accum = resolve_accum_steps(optim, config.data.batch_size, processes.world)
    data = RunData(config.data, config.model, accum, run.seed, processes)
    loss = RunLoss(run.task, optim, config.elastic, config.distillation, run.seed, data.batches_per_epoch,
                   processes.device)
    clock = RunClock(run, processes, os.path.join(run.output, LAST_CHECKPOINT))
    run_optim = RunOptim(optim, config.growth, lr=resolve_lr(optim, config.data.batch_size, processes.world),
                         updates_per_epoch=data.updates_per_epoch,
                         freeze_loaded_tokens=config.model.freeze_loaded_tokens)
    return RunContext(processes, data, loss, clock, run_optim, config.model.model, optim.epochs, task=run.task,
                      out=run.output, seed=run.seed, amp=run.amp, eval_every=run.eval_every,
                      save_every=run.save_every, progress=run.progress, tensorboard=run.tensorboard)
