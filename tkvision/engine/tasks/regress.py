"""``task: regress``: one number per image fitted by least squares, the worked example of adding a task
(``DEVELOPERS.md``, "A task"). The model's head has one output; its loss is the mean squared error against the
labels read as numbers (a data source whose labels are floats: ``tkvision.data.registry``); evaluation reports the
validation MSE (``val_loss``, the best weights: the lowest) and the mean absolute error (``val_abs_error``), and the
same on a test split (``test_loss``, ``test_abs_error``).
"""
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..build import MaeConfig, ModelConfig, build_model
from .base import EvalContext, RunFiles, StepSettings, Task, register_task

__all__ = ['RegressTask', 'LeastSquaresObjective']


class LeastSquaresObjective:
    """The mean squared error of the model's one output ``[B, 1]`` against the labels ``[B]`` as float32."""

    def targets(self, images: Any, labels: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        return images, labels

    def loss(self, output: torch.Tensor, labels: torch.Tensor, teacher: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.mse_loss(output.float().squeeze(-1), labels.float())


@register_task
class RegressTask(Task):
    """``task: regress`` (module docstring). It refuses what only a classifier uses (the base's `Task.check`)."""
    name = 'regress'
    description = 'one number per image fitted by least squares (labels read as numbers)'
    best = ('val_loss', 'min')

    def build_model(self, model: ModelConfig, mae: MaeConfig, num_classes: int) -> torch.nn.Module:
        """The backbone with a head of one output, whatever the dataset's classes."""
        return build_model(model, None, 1)

    def objective(self, settings: StepSettings, num_classes: int) -> LeastSquaresObjective:
        return LeastSquaresObjective()

    @torch.no_grad()
    def evaluate(self, net: torch.nn.Module, loader: Any, context: EvalContext) -> Dict[str, Any]:
        """The mean squared and absolute errors of ``net`` over ``loader`` (float64 sums, reduced over ranks)."""
        net.eval()
        totals = torch.zeros(4, dtype=torch.float64, device=context.device)  # squared, absolute, count, skipped
        start = time.perf_counter()
        for images, labels, bad in loader:
            totals[3] += len(bad)
            if images is None:
                continue
            images, labels = context.preprocess(images), labels.to(context.device).double()
            with torch.autocast(context.device.type, dtype=context.autocast_dtype,
                                enabled=context.autocast_dtype is not None):
                output = net(images)
            error = output.double().squeeze(-1) - labels
            totals[0] += (error ** 2).sum()
            totals[1] += error.abs().sum()
            totals[2] += len(labels)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(totals)
        squared, absolute, n, skipped = totals.tolist()
        n = max(n, 1)
        return dict(loss=squared / n, abs_error=absolute / n, count=int(n), skipped=int(skipped),
                    img_per_s=n / (time.perf_counter() - start))

    def columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        if source == 'ema':
            return dict(ema_val_loss=result['loss'], ema_val_abs_error=result['abs_error'])
        return dict(val_loss=result['loss'], val_abs_error=result['abs_error'], val_skipped=result['skipped'])

    def test_columns(self, result: Mapping[str, Any], source: str = 'model') -> Dict[str, Any]:
        prefix = {'model': 'test', 'ema': 'ema_test', 'best': 'best_test'}[source]
        return {f'{prefix}_loss': result['loss'], f'{prefix}_abs_error': result['abs_error']}

    def curves(self, train_label: str) -> Tuple[Sequence[Tuple[str, str]], Optional[Tuple[str, str, Any]]]:
        return ((('train_loss', 'train loss (MSE)'), ('val_loss', 'val loss (MSE)')),
                ('mean absolute error', 'mean absolute error', (('val_abs_error', 'val'),
                                                                ('ema_val_abs_error', 'EMA val'))))

    def done_message(self, result: Mapping[str, Any], minutes: float, files: RunFiles) -> str:
        test = ''
        if result.get('test_loss') is not None:
            test = (f"\n  test MSE {result['test_loss']:.4f}, mean absolute error {result['test_abs_error']:.4f} (the "
                    'last weights; the test split, evaluated once)')
        return (f"done in {minutes:.1f} min: regression, final validation MSE {result['val_loss']:.4f}, mean absolute "
                f"error {result['val_abs_error']:.4f}{test}\n"
                f'  weights: {files.best} (the lowest validation MSE; last: {files.last}, state: {files.state})\n'
                f'  curves:  {files.curves}\n  metrics: {files.metrics}')

    def validate_line(self, model_name: str, result: Mapping[str, Any], split: str) -> str:
        return (f"{model_name} (regression) on {result['count']} {split} images: MSE {result['loss']:.5g}  mean "
                f"absolute error {result['abs_error']:.5g}  {result['img_per_s']:.0f} img/s")
