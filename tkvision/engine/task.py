"""What a run trains, by name: the ``task`` key's values as objects each stage asks (``classify``, ``mae``,
``linprobe``), so that no other module compares a task's name and a new task is one `Task` here.

A `Task` says what the model is (a classifier, or a masked autoencoder around it: MAE, He et al. 2022, "Masked
Autoencoders Are Scalable Vision Learners", https://arxiv.org/abs/2111.06377), what a step learns from (labels, or
the model's own reconstruction error), how evaluation scores it and which weights are best (highest validation
top-1, or lowest validation reconstruction loss), and what it needs of the rest of the config (`Task.check`). The
step itself is ``tkvision.engine.loss.TrainTask``'s, which holds one.
"""
import dataclasses
from typing import Dict, Mapping, Tuple

from ..utils.errors import ConfigError

__all__ = ['Task', 'TASKS', 'task_named']


@dataclasses.dataclass(frozen=True)
class Task:
    """One value of the ``task`` key.

    Attributes:
        name: the key's value.
        reconstructs: the model is a masked autoencoder around ``model`` (the ``mae`` section builds it): its loss
            is its own reconstruction error, no label is read, evaluation reports the validation reconstruction loss
            with fixed masks, and the run ends with ``reconstruction.png``.
        probes: the ``init_from`` encoder is frozen and only MAE's BatchNorm + linear head trains (MAE, App. A.3).
        description: what it trains, in words (``--help`` and the config reference).
    """
    name: str
    reconstructs: bool = False
    probes: bool = False
    description: str = ''

    @property
    def predicts_classes(self) -> bool:
        """Whether the model gives class logits (labels, mixup, distillation, top-1, a test split, a teacher)."""
        return not self.reconstructs

    @property
    def best(self) -> Tuple[str, str]:
        """``(metric, mode)`` that picks the best weights: ``('top1', 'max')``, or ``('val_loss', 'min')``."""
        return ('val_loss', 'min') if self.reconstructs else ('top1', 'max')

    def check(self, cfg: Mapping) -> None:
        """The keys of the flat config ``cfg`` this task needs or refuses.

        Raises:
            ConfigError: ``linprobe`` without ``init_from``; distillation or the NaFlex loader without class
                predictions (``mae``) or with a frozen encoder (``linprobe``: the NaFlex loader), each named.
        """
        if self.probes and not cfg['init_from']:
            raise ConfigError(f'task {self.name} needs init_from (the pretrained encoder to probe)')
        if cfg['distillation'] != 'none' and not self.predicts_classes:
            raise ConfigError(f"distillation {cfg['distillation']!r} needs class predictions; task {self.name} has "
                              'none: set distillation: none')
        if cfg['naflex_loader'] and (self.reconstructs or self.probes):
            raise ConfigError(f'naflex_loader trains classifiers; task {self.name!r} reads fixed-size images: set '
                              'naflex_loader: false')


#: Every task by name: the ``task`` key's allowed values.
TASKS: Dict[str, Task] = {t.name: t for t in (
    Task('classify', description='a classifier on labels (supervised)'),
    Task('mae', reconstructs=True, description='masked-autoencoder pretraining (no labels read)'),
    Task('linprobe', probes=True, description="the init_from encoder frozen, MAE's BatchNorm + linear head trained"),
)}


def task_named(name: str) -> Task:
    """The `Task` of the ``task`` key's value ``name``.

    Raises:
        ConfigError: a name that is no task, naming the ones there are.
    """
    if name not in TASKS:
        raise ConfigError(f"task {name!r} is not a task; tasks are {', '.join(TASKS)}")
    return TASKS[name]
