"""The loss of a run: what a training step learns from, and at which prefixes of an elastic model.

`RunLoss` owns the targets of a step: timm's Mixup / CutMix, the criterion (soft-target
cross-entropy, label smoothing or plain cross-entropy), the prefixes an elastic step trains
(``tkvision.growth.elastic.step_fractions``, drawn from a stream of their own so a resumed run draws the
same), and distillation from soft predictions:

- ``'inplace'``: in an elastic step the whole model learns from the labels and every smaller prefix from the
  whole model's detached predictions of the same images (in-place distillation: Yu and Huang, "Universally
  Slimmable Networks", ICCV 2019, §3.3, https://arxiv.org/abs/1903.05134; Yu et al., "BigNAS", ECCV 2020,
  https://arxiv.org/abs/2003.11142);
- ``'teacher'``: the model learns from a trained model's predictions (``teacher``: a finished run's
  weights): the control that separates what the teacher gives from what nesting gives.

A distilled loss is timm's logit distillation (``timm.task.LogitDistillationTask``, complementary weights):
``w · CE(s, y) + (1 - w) · T² · KL(softmax(t / T) || softmax(s / T))`` averaged over the batch, with ``w`` =
``distillation_task_weight`` (0: the soft targets alone) and ``T`` = ``distillation_temperature`` (Hinton et
al., "Distilling the Knowledge in a Neural Network", 2015, §2: the T² keeps the gradients' scale).
"""
import os
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

from ..config_sections import DistillationConfig, ElasticConfig, OptimConfig
from ..growth import elastic
from ..models import input_shape
from ..utils.errors import ConfigError
from ..utils.seeding import derive_seed
from .checkpoint import CONFIG_FILE, model_for_checkpoint
from .config import load_config

__all__ = ['RunLoss', 'distillation_loss', 'load_teacher']


def distillation_loss(
        logits: torch.Tensor,
        teacher_logits: torch.Tensor,
        temperature: float,
) -> torch.Tensor:
    """``T² · KL(softmax(teacher / T) || softmax(logits / T))``, summed over classes and averaged over the
    batch (``F.kl_div(..., reduction='batchmean', log_target=True)``, as timm's ``LogitDistillationTask``).

    Args:
        logits: the student's logits, ``[B, classes]``.
        teacher_logits: the teacher's, ``[B, classes]`` (detached by the caller).
        temperature: T > 0.

    Returns:
        a scalar tensor, in float32 for half-precision logits (autocast's), else in the logits' dtype.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    student = F.log_softmax(logits.to(dtype) / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    return F.kl_div(student, teacher, reduction='batchmean', log_target=True) * temperature ** 2


def load_teacher(
        path: str,
        device: torch.device,
) -> torch.nn.Module:
    """The trained model of the weights file ``path`` (a finished run's ``last.safetensors`` or
    ``best.safetensors``), built by the ``config.yaml`` beside it, in eval mode without gradients, on ``device``.

    Raises:
        ConfigError: no such file, or no ``config.yaml`` beside it (the key ``teacher`` named).
        WeightsMismatchError: weights the folder's config does not build.
    """
    config_file = os.path.join(os.path.dirname(os.path.abspath(path)), CONFIG_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f'teacher: no weights file {path}; give a finished run\'s last.safetensors')
    if not os.path.isfile(config_file):
        raise ConfigError(f'teacher: {path} has no {CONFIG_FILE} beside it to build its model; give the weights of '
                          'a run folder written by tkvision-train')
    config = load_config(config_file)
    if config['task'] == 'mae':
        raise ConfigError(f"teacher: {path} is a masked autoencoder's (task: mae in {config_file}): it predicts "
                          'pixels, not classes; give a finished classifier run\'s weights')
    model, _ = model_for_checkpoint(config, path, use_ema=False)
    model.requires_grad_(False)
    return model.eval().to(device)


def _check_teacher(teacher: torch.nn.Module, num_classes: int, in_chans: Optional[int]) -> None:
    """Refuse a teacher whose logits or input are not the student's (before any work: they would fail at the first
    step with a shape error)."""
    classes = getattr(teacher, 'num_classes', None)
    if classes is not None and classes != num_classes:
        raise ConfigError(f'teacher: its model predicts {classes} classes and this run\'s {num_classes}: distil '
                          'from a run of the same classes')
    channels = input_shape(teacher)[0] if in_chans is not None else None
    if channels is not None and channels != in_chans:
        raise ConfigError(f'teacher: its model takes {channels}-channel images and this run\'s {in_chans}: distil from '
                          'a run of the same images')


class RunLoss:
    """What a training step learns from (module docstring).

    Args:
        task: ``'classify'``, ``'mae'`` or ``'linprobe'`` (MAE's loss is the model's own).
        optim: the config's optimisation section (``smoothing``, ``mixup``, ``cutmix``, ...).
        elastic: the elastic section (``elastic_fractions``, ``elastic_sampling``, ``elastic_tau``,
            ``elastic_nesting``, ``elastic_start``).
        distillation: the distillation section.
        seed: the run's seed (the elastic draws' stream).
        steps_per_epoch: micro-batches of one epoch (``elastic_start`` counts them).
        device: where the teacher runs.

    Raises:
        ConfigError, WeightsMismatchError: a ``teacher`` that cannot be loaded (`load_teacher`).
    """

    def __init__(
            self,
            task: str,
            optim: OptimConfig,
            elastic: ElasticConfig,
            distillation: DistillationConfig,
            seed: int,
            steps_per_epoch: int,
            device: torch.device,
    ):
        self.task, self.optim, self.elastic, self.seed = task, optim, elastic, seed
        self.mode = distillation.distillation
        self.temperature = distillation.distillation_temperature
        self.task_weight = distillation.distillation_task_weight
        self.steps_per_epoch = steps_per_epoch
        self.elastic_step = bool(self.elastic.elastic_fractions)
        self.teacher = None
        if self.mode == 'teacher':
            if not distillation.teacher:
                raise ConfigError('distillation: teacher needs teacher: the path of the teacher\'s weights or run')
            self.teacher = load_teacher(distillation.teacher, device)
        # set by set_classes once the model (and its num_classes) exists
        self.mixup: Optional[Mixup] = None
        self.criterion: Optional[torch.nn.Module] = None

    def set_classes(self, num_classes: int, in_chans: Optional[int] = None) -> None:
        """``mixup`` and ``criterion`` of a classifier with ``num_classes`` outputs taking ``in_chans``-channel
        images: timm's Mixup/CutMix with soft-target cross-entropy, label smoothing, or plain cross-entropy.

        Raises:
            ConfigError: a ``teacher`` that cannot teach this classifier (other classes, other input channels).
        """
        if self.teacher is not None:
            _check_teacher(self.teacher, num_classes, in_chans)
        optim = self.optim
        if optim.mixup > 0 or optim.cutmix > 0:
            self.mixup = Mixup(mixup_alpha=optim.mixup, cutmix_alpha=optim.cutmix, prob=optim.mixup_prob,
                               switch_prob=optim.mixup_switch_prob, label_smoothing=optim.smoothing,
                               num_classes=num_classes)
            self.criterion = SoftTargetCrossEntropy()
        elif optim.smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(optim.smoothing)
        else:
            self.criterion = torch.nn.CrossEntropyLoss()

    def targets(self, images: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` of a classifier's step: mixed by timm's Mixup / CutMix when the recipe says
        (which needs an even batch: an odd one, after a skipped image, loses its last image)."""
        if self.mixup is None:
            return images, labels
        if len(images) % 2:
            images, labels = images[:-1], labels[:-1]
        return self.mixup(images, labels)

    def step_prefixes(self, epoch: int, batch: int) -> List[Optional[float]]:
        """The prefixes micro-batch ``batch`` of ``epoch`` trains, largest first: ``[None]`` (the whole model),
        or an elastic run's fractions (``tkvision.growth.elastic.step_fractions``; 1 written None), drawn from a
        stream of their own (``derive_seed('elastic', seed, epoch, batch)``), so a resumed run draws the same.
        Within the first ``elastic_start`` of the training steps only the whole model trains."""
        fractions = self.elastic.elastic_fractions
        if not fractions:
            return [None]
        epochs = self.optim.epochs
        if epoch * self.steps_per_epoch + batch < self.elastic.elastic_start * epochs * self.steps_per_epoch:
            return [None]
        generator = torch.Generator().manual_seed(derive_seed('elastic', self.seed, epoch, batch))
        chosen = elastic.step_fractions(fractions, self.elastic.elastic_sampling, generator)
        return [None if f == 1 else f for f in chosen]

    def set_prefix(self, model: torch.nn.Module, fraction: Optional[float]) -> None:
        """Run ``model`` at ``fraction`` of an elastic step (None: every token) with the run's τ and nesting."""
        elastic.set_prefix(model, fraction, self.elastic.elastic_tau, self.elastic.elastic_nesting)

    def teacher_logits(self, images: torch.Tensor) -> Optional[torch.Tensor]:
        """The teacher's logits of ``images`` (``distillation: teacher``), else None."""
        if self.teacher is None:
            return None
        with torch.no_grad():
            return self.teacher(images)

    def __call__(
            self,
            output,
            labels: Optional[torch.Tensor],
            soft_target: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The loss of a forward's ``output``.

        Args:
            output: the model's logits ``[B, classes]``, or for ``task: mae`` its ``(loss, ...)`` tuple.
            labels: the targets of `targets` (class indices ``[B]`` or mixed soft labels ``[B, classes]``).
            soft_target: teacher logits ``[B, classes]`` to distil from (detached), or None: the labels alone.
        """
        if self.task == 'mae':
            return output[0]
        if self.criterion is None:
            raise RuntimeError('RunLoss.set_classes(num_classes) comes before the first loss of a classifier')
        if soft_target is None:
            return self.criterion(output, labels)
        soft = distillation_loss(output, soft_target, self.temperature)
        if self.task_weight == 0:
            return soft
        return self.task_weight * self.criterion(output, labels) + (1 - self.task_weight) * soft

    def soft_target(
            self,
            fraction: Optional[float],
            whole_logits: Optional[torch.Tensor],
            teacher_logits: Optional[torch.Tensor],
    ) -> Optional[torch.Tensor]:
        """What the forward at ``fraction`` distils from: the teacher's logits (``'teacher'``), the whole model's
        detached logits of this step for a smaller prefix (``'inplace'``), else None (the labels)."""
        if self.mode == 'teacher':
            return teacher_logits
        if self.mode == 'inplace' and fraction is not None:
            return whole_logits
        return None
