"""The base of every task (the ``task`` key's values): what a stage of a run may ask of what it trains.

timm's ``timm.task`` has one ``TrainingTask`` subclass per task, each owning its forward and loss; torchtitan's
``Validator`` owns evaluation. Here a `Task` owns both for one kind of run, and every stage asks it instead of
branching on the task's name:

- **the model** around the backbone (`Task.build_model`, `Task.prepare`, `Task.init_weights`);
- **the step**: its `Objective` (targets and loss) from the loss section's values (`StepSettings`);
- **evaluation**: `Task.evaluate` on a loader, the metric columns of a ``metrics.csv`` row (`Task.columns`,
  `Task.prefix_columns`, `Task.after_growth`), the figure that picks the best weights (`Task.best`, `Task.score`),
  the test split's columns (`Task.test_columns`) and the report of the final evaluation (`Task.report`);
- **the end of a run**: its pictures (`Task.end_of_run`) and its closing message (`Task.done_message`);
- **the tools**: what ``tkvision-validate`` prints (`Task.validate_line`), what ``tkvision-export`` and
  ``tkvision-mae-visualize`` accept (`Task.check_export`, `Task.check_reconstructions`), whether a run's weights can
  teach another (`Task.check_teacher`), and the keys it needs or refuses (`Task.check`: a teacher, the NaFlex
  loader, mixup).

A new task is one module with a `Task` subclass under `register_task` (``DEVELOPERS.md``, "A task").
"""
import dataclasses
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Protocol, Sequence, Tuple

import torch

from ...utils.errors import ConfigError, UsageError
from ..build import MaeConfig, ModelConfig, build_model

__all__ = ['Task', 'Objective', 'StepSettings', 'EvalContext', 'RunFiles', 'register_task', 'TASKS', 'task_named']


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What the ``loss`` section says of a step's targets, as values (``tkvision.engine.loss.LossConfig.step``):
    label smoothing, timm's Mixup / CutMix, and distillation's temperature and task weight."""
    smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    distillation_temperature: float = 1.0
    distillation_task_weight: float = 0.0


class Objective(Protocol):
    """A step's targets and loss (`Task.objective`)."""

    def targets(self, images: Any, labels: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        """The micro-batch ``(images, labels)`` the forward sees and the loss compares with (mixed, or as given)."""

    def loss(self, output: Any, labels: torch.Tensor, teacher: Optional[torch.Tensor]) -> torch.Tensor:
        """The scalar loss of the model's ``output`` against ``labels`` (and a teacher's logits, or None)."""


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """Where and how a run evaluates: the device, the batches' preprocessing (uint8 images -> normalised floats), the
    autocast dtype of its precision (None: float32), and its seed (fixed masks and draws)."""
    device: torch.device
    preprocess: Callable
    autocast_dtype: Optional[torch.dtype] = None
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """The paths a closing message names (the run folder's files, ``tkvision.engine.checkpoint`` and
    ``tkvision.engine.runlog`` name them)."""
    best: str
    last: str
    state: str
    curves: str
    metrics: str
    reconstructions: str


class Task:
    """One value of the ``task`` key (module docstring). Subclasses set the class attributes and override what
    differs; the defaults are a model of ``model`` that predicts ``num_classes`` outputs.

    Attributes:
        name: the key's value.
        description: what it trains, in words (``--help`` and the config reference).
        best: ``(column, mode)`` of the figure that picks the best weights: ``('top1', 'max')`` or
            ``('val_loss', 'min')``.
    """
    name: ClassVar[str] = ''
    description: ClassVar[str] = ''
    best: ClassVar[Tuple[str, str]] = ('val_loss', 'min')

    def check(self, cfg: Mapping[str, Any]) -> None:
        """Refuse the keys of the flat config ``cfg`` this task cannot use, each named with what to set. The default
        refuses distillation and mixup / CutMix, which only a classifier uses (label smoothing, on by default for a
        classifier, is left unused: its key says so).

        Raises:
            ConfigError: naming the key.
        """
        if cfg['distillation'] != 'none':
            raise ConfigError(f"distillation {cfg['distillation']!r} needs class predictions; task {self.name} has "
                              'none: set distillation: none')
        for key in ('mixup', 'cutmix'):
            if cfg.get(key):
                raise ConfigError(f'{key} {cfg[key]} mixes class labels; task {self.name} has none: set {key}: 0')

    def build_model(self, model: ModelConfig, mae: MaeConfig, num_classes: int) -> torch.nn.Module:
        """The model this task trains around the backbone of the ``model`` section (``mae``: the MAE section, read by
        the masked autoencoder), with ``num_classes`` outputs when it predicts classes."""
        return build_model(model, None, num_classes)

    def prepare(self, net: torch.nn.Module) -> None:
        """Change the built model once its ``init_from`` weights are loaded (a linear probe freezes it)."""

    def init_weights(
            self,
            weights: Mapping[str, torch.Tensor],
            encoder: Callable[[], Dict[str, Any]],
    ) -> Optional[Dict[str, Any]]:
        """What ``init_from`` loads of a masked autoencoder's ``weights``: ``encoder()`` (its encoder, named and
        adapted: ``tkvision.models.mae.encoder_weights``) for a task that trains a classifier, or None to load the
        whole file (a masked autoencoder continues its own)."""
        return encoder()

    def objective(self, settings: StepSettings, num_classes: int) -> Objective:
        """The step's targets and loss."""
        raise NotImplementedError

    def evaluate(self, net: torch.nn.Module, loader: Any, context: EvalContext) -> Dict[str, Any]:
        """``net`` over ``loader``: a dict with at least ``loss`` (the validation loss), ``count`` and ``skipped``."""
        raise NotImplementedError

    def columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        """The ``metrics.csv`` columns of an evaluation ``result`` of the run's model (``source`` ``'model'``) or of
        its EMA (``'ema'``). The default: the validation loss and the images skipped."""
        if source == 'ema':
            return dict(ema_val_loss=result['loss'])
        return dict(val_loss=result['loss'], val_skipped=result['skipped'])

    def score(self, result: Mapping[str, Any]) -> float:
        """The figure of `best` in an evaluation ``result``."""
        return result['loss']

    def prefix_columns(self, fraction: float, result: Mapping[str, Any], split: str = '') -> Dict[str, Any]:
        """The column of an elastic prefix's evaluation: ``{'<split>val_loss@0.25': ...}`` by default."""
        return {f'{split}val_loss@{fraction:g}': result['loss']}

    def after_growth(self, result: Mapping[str, Any]) -> Dict[str, Any]:
        """The columns of the evaluation right after a growth step (``eval_after_step``)."""
        return dict(val_loss_after_growth=result['loss'])

    def test_columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        """The test split's columns of an evaluation ``result`` (``source``: ``'model'``, ``'ema'`` or ``'best'``):
        ``test_loss``, ``ema_test_loss``, ``best_test_loss`` by default."""
        return {f"{dict(model='test', ema='ema_test', best='best_test')[source]}_loss": result['loss']}

    def curves(self, train_label: str) -> Tuple[Sequence[Tuple[str, str]], Optional[Tuple[str, str, Any]]]:
        """The panels of ``curves.png`` (``tkvision.engine.plotting.plot_curves``): the loss series ``(column,
        legend)``, and a metric's panel ``(title, axis label, series)`` or None; ``train_label``: the training loss's
        legend (``tkvision.engine.loss.LossConfig.train_loss_label``)."""
        return (('train_loss', train_label), ('val_loss', 'val loss')), None

    def report(
            self,
            result: Mapping[str, Any],
            classes: Sequence[str],
            path: Callable[[str], str],
            split: str,
    ) -> None:
        """Write the files of a final evaluation ``result`` on ``split`` (a finished run's test split, else its
        validation split; ``tkvision-validate --out``): ``path(name)`` is each file's path, ``classes`` the class names
        in label order. The default writes nothing."""

    def end_of_run(
            self,
            model: torch.nn.Module,
            dataset: Any,
            mean_std: Tuple,
            path: Callable[[str], str],
            mae: MaeConfig,
            device: torch.device,
    ) -> None:
        """The pictures a finished run writes besides its curves (rank 0): ``path(name)`` is the run log's path of a
        file of the run's folder."""

    def done_message(self, result: Mapping[str, Any], minutes: float, files: RunFiles) -> str:
        """The lines ``tkvision-train`` prints at the end of a run."""
        return (f"done in {minutes:.1f} min: final validation loss {result['val_loss']:.4f}\n"
                f'  weights: {files.best} (the best validated weights; last: {files.last}, state: {files.state})\n'
                f'  curves:  {files.curves}\n  metrics: {files.metrics}')

    def validate_line(self, model_name: str, result: Mapping[str, Any], split: str) -> str:
        """The line ``tkvision-validate`` prints of an evaluation ``result`` on ``split``."""
        return (f"{model_name} ({self.name}) on {result['count']} {split} images: loss {result['loss']:.4f}  "
                f"{result['img_per_s']:.0f} img/s")

    def check_export(self, checkpoint: str) -> None:
        """Refuse to export the weights of this task's run (``tkvision-export``); the default exports them."""

    def check_teacher(self, path: str) -> None:
        """Refuse this task's run as a teacher (``distillation: teacher``) when its model gives no class logits.

        Raises:
            ConfigError: naming ``path``.
        """
        raise ConfigError(f'teacher: {path} is a {self.name} run\'s: its model predicts no classes; give a finished '
                          'classifier run\'s weights')

    def check_reconstructions(self, checkpoint: str) -> None:
        """Refuse ``tkvision-mae-visualize`` for a run whose model draws no reconstructions.

        Raises:
            UsageError: naming the checkpoint and its task.
        """
        raise UsageError(f'{checkpoint} is not an MAE run (task {self.name!r}): it has no reconstructions to draw')


#: Every task by name: the ``task`` key's allowed values (`register_task` fills it).
TASKS: Dict[str, Task] = {}


def register_task(cls: type) -> type:
    """Class decorator: make an instance of the `Task` subclass ``cls`` the task of ``task: <cls.name>``.

    Raises:
        ValueError: ``cls`` is no Task subclass, has no name, or its name is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task) and cls.name):
        raise ValueError(f'register_task takes a Task subclass with a name, got {cls!r}')
    if cls.name in TASKS:
        raise ValueError(f'task {cls.name!r} is registered already')
    TASKS[cls.name] = cls()
    return cls


def task_named(name: str) -> Task:
    """The `Task` of the ``task`` key's value ``name``.

    Raises:
        ConfigError: a name that is no task, naming the ones there are.
    """
    if name not in TASKS:
        raise ConfigError(f"task {name!r} is not a task; tasks are {', '.join(TASKS)}")
    return TASKS[name]
