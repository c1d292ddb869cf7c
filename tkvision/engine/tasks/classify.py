"""``task: classify``: a classifier on labels (supervised), the default task.

Its step: timm's Mixup / CutMix and the criterion (soft-target cross-entropy, label smoothing or plain
cross-entropy); with a teacher (``distillation: teacher``), timm's logit distillation (``timm.task.
LogitDistillationTask``, complementary weights): ``w · CE(s, y) + (1 - w) · T² · KL(softmax(t / T) || softmax(s /
T))`` averaged over the batch, ``w`` = ``distillation_task_weight`` (0: the soft targets alone), ``T`` =
``distillation_temperature`` (Hinton et al., "Distilling the Knowledge in a Neural Network", 2015, §2: the T² keeps
the gradients' scale). Its evaluation: top-1 / top-5 (the best weights: the highest validation top-1), and on the
test split the per-class top-1 and the confusion matrix (`per_class_rows`, `write_confusion`).
"""
import csv
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

from ...utils.files import atomic_write
from ..evaluate import evaluate
from .base import EvalContext, RunFiles, StepSettings, Task, register_task

__all__ = ['ClassifyTask', 'ClassifierObjective', 'distillation_loss', 'per_class_rows', 'write_confusion',
           'PER_CLASS_FILE', 'CONFUSION_FILE', 'CONFUSION_PICTURE']

#: The files a classification run writes at its end, and ``tkvision-validate --out`` into its folder.
PER_CLASS_FILE, CONFUSION_FILE, CONFUSION_PICTURE = 'per_class.csv', 'confusion_matrix.csv', 'confusion_matrix.png'


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


class ClassifierObjective:
    """A classifier's step (module docstring).

    Args:
        settings: the loss section's values.
        num_classes: the classifier's outputs (Mixup's one-hot targets).
    """

    def __init__(self, settings: StepSettings, num_classes: int):
        self.temperature, self.task_weight = settings.distillation_temperature, settings.distillation_task_weight
        self.mixup: Optional[Mixup] = None
        if settings.mixup > 0 or settings.cutmix > 0:
            self.mixup = Mixup(mixup_alpha=settings.mixup, cutmix_alpha=settings.cutmix, prob=settings.mixup_prob,
                               switch_prob=settings.mixup_switch_prob, label_smoothing=settings.smoothing,
                               num_classes=num_classes)
            self.criterion: torch.nn.Module = SoftTargetCrossEntropy()
        elif settings.smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(settings.smoothing)
        else:
            self.criterion = torch.nn.CrossEntropyLoss()

    def targets(self, images: Any, labels: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        """``(images, labels)`` mixed by timm's Mixup / CutMix when the recipe says (which needs an even batch: an odd
        one, after a skipped image, loses its last image)."""
        if self.mixup is None:
            return images, labels
        if len(images) % 2:
            images, labels = images[:-1], labels[:-1]
        return self.mixup(images, labels)

    def loss(self, output: torch.Tensor, labels: torch.Tensor,
             teacher: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss of ``output`` logits ``[B, classes]`` against ``labels`` (class indices ``[B]`` or mixed soft labels
        ``[B, classes]``): the criterion, or with ``teacher`` logits ``[B, classes]`` the distilled loss."""
        if teacher is None:
            return self.criterion(output, labels)
        soft = distillation_loss(output, teacher, self.temperature)
        if self.task_weight == 0:
            return soft
        return self.task_weight * self.criterion(output, labels) + (1 - self.task_weight) * soft


def per_class_rows(confusion: torch.Tensor, classes: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per true class of a confusion matrix ``[C, K]`` (rows: the true classes, columns: every predicted
    output, K >= C): its name, its images and its top-1 in percent (empty for a class without images)."""
    counts = confusion.sum(dim=1)
    return [dict(index=i, name=classes[i] if i < len(classes) else str(i), images=int(counts[i]),
                 top1=f'{100 * float(confusion[i, i]) / float(counts[i]):.2f}' if counts[i] else '')
            for i in range(confusion.shape[0])]


def write_confusion(
        confusion: torch.Tensor,
        classes: Sequence[str],
        path: Callable[[str], str],
        split: str,
) -> None:
    """Write `PER_CLASS_FILE`, `CONFUSION_FILE` (true class by row, predicted by column, counts) and
    `CONFUSION_PICTURE` (the matrix normalised by row) of ``confusion`` ``[C, C]`` measured on ``split``; ``path(name)``
    gives each file's path (the run log's, or a folder's), each written atomically. A head wider than the dataset's
    ``classes`` (an old run's 1000-way head on 3 class folders) is reported over those classes, with a column
    ``other`` counting the predictions of the outputs beyond them."""
    from ..plotting import confusion_figure
    n = len(classes) or confusion.shape[0]
    names = [classes[i] if i < len(classes) else str(i) for i in range(n)]
    rows = per_class_rows(confusion[:n], names)
    other = confusion[:n, n:].sum(dim=1).tolist() if confusion.shape[1] > n else None
    square = confusion[:n, :n]

    def per_class(f):
        writer = csv.DictWriter(f, fieldnames=['index', 'name', 'images', 'top1', 'split'])
        writer.writeheader()
        writer.writerows(dict(r, split=split) for r in rows)

    def matrix(f):
        writer = csv.writer(f)
        writer.writerow(['true \\ predicted'] + names + (['other'] if other is not None else []))
        for i, (name, row) in enumerate(zip(names, square.tolist())):
            writer.writerow([name] + [int(v) for v in row] + ([int(other[i])] if other is not None else []))
    atomic_write(path(PER_CLASS_FILE), per_class, text=True)
    atomic_write(path(CONFUSION_FILE), matrix, text=True)
    confusion_figure(square, names, f'confusion matrix ({split} split)', path(CONFUSION_PICTURE))


@register_task
class ClassifyTask(Task):
    """``task: classify`` (module docstring)."""
    name = 'classify'
    description = 'a classifier on labels (supervised)'
    best = ('top1', 'max')

    def check(self, cfg: Mapping[str, Any]) -> None:
        """A classifier takes every loss key; nothing to refuse."""

    def objective(self, settings: StepSettings, num_classes: int) -> ClassifierObjective:
        return ClassifierObjective(settings, num_classes)

    def evaluate(self, net: torch.nn.Module, loader: Any, context: EvalContext) -> Dict[str, Any]:
        """``tkvision.engine.evaluate.evaluate``: top-1, top-5, loss and the confusion matrix."""
        return evaluate(net, loader, context.device, context.preprocess, context.autocast_dtype)

    def columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        if source == 'ema':
            return dict(ema_top1=result['top1'], ema_top5=result['top5'])
        return dict(top1=result['top1'], top5=result['top5'], val_loss=result['loss'], val_skipped=result['skipped'])

    def score(self, result: Mapping[str, Any]) -> float:
        return result['top1']

    def prefix_columns(self, fraction: float, result: Mapping[str, Any], split: str = '') -> Dict[str, Any]:
        return {f'{split}top1@{fraction:g}': result['top1']}

    def after_growth(self, result: Mapping[str, Any]) -> Dict[str, Any]:
        return dict(val_loss_after_growth=result['loss'], top1_after_growth=result['top1'])

    def test_columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        if source == 'ema':
            return dict(ema_test_top1=result['top1'])
        if source == 'best':
            return dict(best_test_top1=result['top1'])
        return dict(test_top1=result['top1'], test_top5=result['top5'])

    def curves(self, train_label: str) -> Tuple[Sequence[Tuple[str, str]], Optional[Tuple[str, str, Any]]]:
        return ((('train_loss', train_label), ('val_loss', 'val loss (cross-entropy)')),
                ('accuracy', 'top-1 (%)', (('top1', 'val top-1'), ('ema_top1', 'EMA val top-1'))))

    def report(
            self,
            result: Mapping[str, Any],
            classes: Sequence[str],
            path: Callable[[str], str],
            split: str,
    ) -> None:
        """`PER_CLASS_FILE`, `CONFUSION_FILE` and `CONFUSION_PICTURE` of ``result``'s confusion matrix."""
        write_confusion(result['confusion'], classes, path, split)

    def done_message(self, result: Mapping[str, Any], minutes: float, files: RunFiles) -> str:
        last = files.last + (' (EMA weights)' if result.get('ema') else '')
        best = (f"{'EMA' if result.get('best_source') == 'ema' else 'raw'} weights of epoch {result['best_epoch'] + 1}"
                if result.get('best_epoch') is not None else 'the best validated weights')
        test = ''
        if result.get('test_top1') is not None:  # the figure of the file named first, then the other weights'
            others = [f"last raw weights {result['test_top1']:.2f}%"] + (
                [f"last EMA weights {result['ema_test_top1']:.2f}%"] if result.get('ema_test_top1') is not None
                else [])
            if result.get('best_test_top1') is not None:
                test = (f"\n  test top-1 {result['best_test_top1']:.2f}% of {os.path.basename(files.best)} ({best}; "
                        f"{', '.join(others)}; the test split, evaluated once)")
            else:  # the best weights are another run folder's (resumed from its checkpoint)
                test = f"\n  test top-1 (the test split, evaluated once): {', '.join(others)}"
        per_class = os.path.join(os.path.dirname(files.metrics), PER_CLASS_FILE)
        return (f"done in {minutes:.1f} min: final validation top-1 {result['top1']:.2f}% (best "
                f"{result['best_top1']:.2f}%){test}\n"
                f"  weights: {files.best} ({best}; last: {last}, state: {files.state})\n  curves:  {files.curves}\n"
                f"  metrics: {files.metrics}\n  per class: {per_class} (and the confusion matrix beside it)")

    def validate_line(self, model_name: str, result: Mapping[str, Any], split: str) -> str:
        return (f"{model_name} on {result['count']} {split} images: top-1 {result['top1']:.2f}%  "
                f"top-5 {result['top5']:.2f}%  loss {result['loss']:.4f}  {result['img_per_s']:.0f} img/s")

    def check_teacher(self, path: str) -> None:
        """A classifier's run teaches: nothing to refuse."""
