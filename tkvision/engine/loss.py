"""The training step: what a step learns from, at which prefixes of an elastic model, and from which teacher.

`TrainTask` is a task in timm's sense (``timm.task``: the object that owns a step's forward passes and returns their
losses): the loop hands it the preprocessed images and labels and back-propagates what it yields, knowing nothing
of task names, prefixes or distillation. It owns the ``loss`` section, `LossConfig`, declared here, and asks the
run's task (``tkvision.engine.tasks``) for the step's targets and loss (its ``Objective``: a classifier's Mixup /
CutMix, label smoothing and logit distillation, a masked autoencoder's reconstruction error, a regression's squared
error). It adds what every task shares:

- the prefixes an elastic step trains (``tkvision.growth.elastic.step_fractions``, drawn from a stream of their own
  so a resumed run draws the same) and the ones evaluation reports;
- the teacher's logits (``distillation: teacher``: a finished run's weights, the control that separates what a
  teacher gives from what nesting gives), which the objective combines with its own loss.
"""
import dataclasses
from typing import Callable, ContextManager, Generator, List, NamedTuple, Optional, Tuple

import torch

from ..growth import elastic
from ..models import input_shape
from ..utils.config_fields import choice, is_number, key, number, rule, string
from ..utils.errors import ConfigError
from ..utils.seeding import derive_seed
from .tasks import StepSettings, Task

__all__ = ['LossConfig', 'TrainTask', 'StepLoss', 'check_teacher']


def _is_fractions(value) -> bool:
    return isinstance(value, (list, tuple)) and all(is_number(f) and 0 < f <= 1 for f in value)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """What a step learns from (the ``loss`` section): the targets' regularisers, the elastic prefixes and
    distillation (module docstring; ``docs/elastic.md``)."""

    smoothing: float = key(0.1, allowed=number(0, 1, hi_open=True))
    """Label smoothing of a classifier's cross-entropy (tasks without class labels, ``mae`` and ``regress``, leave it
    unused)."""
    mixup: float = key(0.0, allowed=number(0))
    """Mixup's alpha (timm's ``Mixup``); 0: off."""
    cutmix: float = key(0.0, allowed=number(0))
    """CutMix's alpha; 0: off."""
    mixup_prob: float = key(1.0, allowed=number(0, 1))
    """Probability that a batch is mixed."""
    mixup_switch_prob: float = key(0.5, allowed=number(0, 1))
    """Probability that a mixed batch uses CutMix rather than Mixup when both are on."""
    elastic_fractions: Tuple[float, ...] = key((), allowed=rule(_is_fractions, 'a list of fractions in (0, 1] (empty: '
                                                                               'off)'))
    """Fractions of every Pattention's tokens a step may train, e.g. ``[0.25, 0.5, 0.75, 1.0]``; empty: off.
    Evaluation reports each (``top1@0.25``, ...)."""
    elastic_sampling: str = key('largest_plus_random', allowed=choice(*elastic.SAMPLING))
    """Which prefixes a step trains: ``'all'``, ``'random'`` or ``'largest_plus_random'``."""
    elastic_nesting: str = key('all', allowed=choice(*elastic.NESTING))
    """The Pattentions a prefix shrinks: ``'all'`` or ``'ffn'`` (MatFormer's choice)."""
    distillation: str = key('none', allowed=choice('none', 'teacher'))
    """``'none'``, or ``'teacher'``: the model learns from the predictions of the trained model in ``teacher``."""
    distillation_temperature: float = key(1.0, allowed=number(0, lo_open=True))
    """Softmax temperature T of both sides; the KL term is scaled by T²."""
    distillation_task_weight: float = key(0.0, allowed=number(0, 1))
    """A distilled loss = w x label loss + (1 - w) x KL (timm's ``LogitDistillationTask``, complementary
    weights)."""
    teacher: Optional[str] = key(None, allowed=string(null=True))
    """``distillation: teacher``: a finished run's weights file (its folder's ``config.yaml`` builds the
    model)."""

    def step(self) -> StepSettings:
        """What this section says of a step's targets, as values for the task's objective
        (``tkvision.engine.tasks.Task.objective``)."""
        return StepSettings(smoothing=self.smoothing, mixup=self.mixup, cutmix=self.cutmix,
                            mixup_prob=self.mixup_prob, mixup_switch_prob=self.mixup_switch_prob,
                            distillation_temperature=self.distillation_temperature,
                            distillation_task_weight=self.distillation_task_weight)

    def train_loss_label(self) -> str:
        """The legend of the training loss: what made it differ from the plain cross-entropy, if anything."""
        parts = ([f'label smoothing {self.smoothing:g}'] if self.smoothing else []) + \
            [name for name in ('mixup', 'cutmix') if getattr(self, name)]
        return 'train loss' + (f" (as trained: {', '.join(parts)})" if parts else '')


def check_teacher(
        teacher: torch.nn.Module,
        num_classes: int,
        in_chans: Optional[int],
) -> None:
    """Refuse a teacher whose logits or input are not the student's (before any work: they would fail at the first
    step with a shape error).

    Raises:
        ConfigError: other classes than ``num_classes``, or other input channels than ``in_chans`` (when given).
    """
    classes = getattr(teacher, 'num_classes', None)
    if classes is not None and classes != num_classes:
        raise ConfigError(f'teacher: its model predicts {classes} classes and this run\'s {num_classes}: distil '
                          'from a run of the same classes')
    channels = input_shape(teacher)[0] if in_chans is not None else None
    if channels is not None and channels != in_chans:
        raise ConfigError(f'teacher: its model takes {channels}-channel images and this run\'s {in_chans}: distil from '
                          'a run of the same images')


class StepLoss(NamedTuple):
    """One forward's loss of a step (`TrainTask.losses`): ``value`` (a scalar tensor to back-propagate),
    ``images`` it saw, ``forwards`` in the step (the meter averages over them) and whether it is the ``last``."""
    value: torch.Tensor
    images: int
    forwards: int
    last: bool


class TrainTask:
    """The training task of a run (module docstring).

    Args:
        loss: the config's loss section.
        task: what is trained (``tkvision.engine.tasks.Task``): it gives the step's objective (targets and loss).
        seed: the run's seed (the elastic draws' stream).
        num_classes: the classifier's outputs (Mixup's one-hot targets; unused by other tasks).
        teacher: the trained model to distil from (``distillation: teacher``; in eval mode, no gradients), or None.

    Attributes:
        objective: the task's ``tkvision.engine.tasks.Objective`` (``targets`` and ``loss``).

    Raises:
        ConfigError: ``distillation: teacher`` without a teacher, or a teacher of other classes.
    """

    def __init__(
            self,
            loss: LossConfig,
            task: Task,
            seed: int,
            num_classes: int,
            teacher: Optional[torch.nn.Module] = None,
    ):
        self.task, self.seed, self.teacher = task, seed, teacher
        self.fractions, self.sampling = loss.elastic_fractions, loss.elastic_sampling
        self.nesting = loss.elastic_nesting
        self.train_loss_label = loss.train_loss_label()
        if (loss.distillation == 'teacher') != (teacher is not None):
            raise ConfigError("distillation: teacher needs the teacher's model (key teacher: a finished run's weights)")
        self.objective = task.objective(loss.step(), num_classes)

    @property
    def eval_fractions(self) -> List[float]:
        """The prefixes below the whole model that evaluation reports (``top1@0.25``, ...), smallest first."""
        return [f for f in sorted(set(self.fractions)) if f < 1]

    def prefix(self, model: torch.nn.Module, fraction: Optional[float]) -> ContextManager:
        """``with task.prefix(model, 0.5):`` runs ``model`` at that prefix with the run's nesting
        (``tkvision.growth.elastic.prefix``)."""
        return elastic.prefix(model, fraction, self.nesting)

    def step_prefixes(self, epoch: int, batch: int) -> List[Optional[float]]:
        """The prefixes micro-batch ``batch`` of ``epoch`` trains, largest first: ``[None]`` (the whole model),
        or an elastic run's fractions (``tkvision.growth.elastic.step_fractions``; 1 written None), drawn from a
        stream of their own (``derive_seed('elastic', seed, epoch, batch)``), so a resumed run draws the same."""
        if not self.fractions:
            return [None]
        generator = torch.Generator().manual_seed(derive_seed('elastic', self.seed, epoch, batch))
        chosen = elastic.step_fractions(self.fractions, self.sampling, generator)
        return [None if f == 1 else f for f in chosen]

    def losses(
            self,
            net: torch.nn.Module,
            model: torch.nn.Module,
            images: torch.Tensor,
            labels: torch.Tensor,
            autocast: Callable[[], ContextManager],
            epoch: int,
            batch: int,
    ) -> Generator[StepLoss, None, None]:
        """The losses of one micro-batch's forward passes, one per prefix the step trains (MatFormer's joint
        objective: the caller back-propagates each as it comes), largest first.

        Args:
            net: what runs the forward (the model, or its DDP / compiled wrapper).
            model: the model itself (its prefixes are set on it).
            images: preprocessed images ``[B, C, H, W]`` (or a NaFlex patch dictionary) on the device.
            labels: the labels ``[B]`` on the device (class indices; a regression's numbers).
            autocast: a new ``torch.autocast`` context of the run's precision per call.
            epoch: the epoch, counted from 0 (the prefixes' draw).
            batch: the micro-batch within it.

        Yields:
            `StepLoss`; the model runs at every token again once the last is yielded (or the caller stops).
        """
        images, labels = self.objective.targets(images, labels)
        with autocast():
            teacher = self._teacher_logits(images)
        prefixes = self.step_prefixes(epoch, batch)
        try:
            for j, fraction in enumerate(prefixes):
                if self.fractions:
                    elastic.set_prefix(model, fraction, self.nesting)
                with autocast():
                    output = net(images)  # an MAE draws its masks from the micro-batch's seed (exact resume)
                    value = self.objective.loss(output, labels, teacher)
                yield StepLoss(value, len(labels), len(prefixes), j + 1 == len(prefixes))
        finally:
            if self.fractions:  # every token, as evaluation and checkpoints expect
                elastic.set_prefix(model, None)

    def _teacher_logits(self, images: torch.Tensor) -> Optional[torch.Tensor]:
        if self.teacher is None:
            return None
        with torch.no_grad():
            return self.teacher(images)
