"""The context of a run: what it uses but does not save, by concern.

[`RunContext`][tkvision.engine.context.RunContext] holds a run's processes, its data
(``tkvision.engine.run_data.RunData``), its task (``tkvision.engine.loss.TrainTask``), its clock
(``tkvision.engine.clock.RunClock``), its optimisation (``tkvision.engine.optim.RunOptim``) and its evaluation
(``tkvision.engine.run_eval.RunEvaluator``), each built by the trainer from the config sections it reads
(``tkvision.engine.trainer``); ``tkvision.engine.state.TrainState`` holds what is saved. Only the trainer takes the
context: every stage it calls receives the parts it uses.
"""
import dataclasses
from typing import Optional, Protocol

from .clock import RunClock
from .distributed import Processes
from .loss import TrainTask
from .optim import RunOptim
from .run_data import RunData
from .run_eval import RunEvaluator

__all__ = ['RunContext', 'ScalarWriter']


class ScalarWriter(Protocol):
    """What the trainer writes scalars to: TensorBoard's ``SummaryWriter`` (an optional extra, imported only when
    ``tensorboard: true``)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        """Record ``scalar_value`` under ``tag`` at ``global_step`` (the epoch, counted from 1)."""

    def close(self) -> None:
        """Flush and close the log."""


@dataclasses.dataclass
class RunContext:
    """What a run uses but does not save, by concern, and the few values of the run section the trainer itself
    reads (kept as values: the context hands on no config section).

    Attributes:
        processes: this process among the job's.
        data: datasets, loaders, preprocessing.
        task: each step's forward passes and losses (its targets, prefixes and teacher).
        clock: checks, checkpoints, stop signals.
        optim: the optimizer and schedule, rebuilt after growth and on resume; the growth steps.
        evaluator: the evaluation after an epoch.
        model_name: the model's registry name.
        epochs: the run's epochs.
        warmup_epochs: the schedule's warmup (the start-up note of a warmup longer than the run).
        out: the run's output folder (``output``).
        seed: the run's seed (growth's new tokens).
        eval_every: epochs between evaluations.
        save_every: epochs between checkpoints.
        progress: whether each epoch shows a progress bar.
        tensorboard: whether rank 0 writes TensorBoard scalars.
        writer: TensorBoard's ``SummaryWriter`` (rank 0 with ``tensorboard: true``), else None.
    """
    processes: Processes
    data: RunData
    task: TrainTask
    clock: RunClock
    optim: RunOptim
    evaluator: RunEvaluator
    model_name: str
    epochs: int
    warmup_epochs: float
    out: str
    seed: int
    eval_every: int
    save_every: int
    progress: bool
    tensorboard: bool
    writer: Optional[ScalarWriter] = None

    @property
    def main(self) -> bool:
        """Whether this process is rank 0 (it prints and writes the run's files)."""
        return self.processes.main
