"""``task: mae``: masked-autoencoder pretraining (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners",
https://arxiv.org/abs/2111.06377): a [`MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] around ``model``
(the ``mae`` section builds it). Its loss is its own reconstruction error and no label is read; evaluation reports
the reconstruction loss with fixed masks on the validation split (the best weights: the lowest) and once on a test
split (``test_loss``), and the run ends with ``reconstruction.png``.
"""
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

from ...utils.errors import ConfigError, UsageError
from ..build import MaeConfig, ModelConfig, build_model
from ..evaluate import evaluate_mae
from ..reconstruction import save_reconstructions
from ..runlog import RECONSTRUCTION_FILE
from .base import EvalContext, RunFiles, StepSettings, Task, register_task

__all__ = ['MaeTask', 'ReconstructionObjective']


class ReconstructionObjective:
    """A masked autoencoder's step: the images as they come, and the model's own loss (its output's first item; it
    draws its masks from the micro-batch's seed, for an exact resume)."""

    def targets(self, images: Any, labels: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        return images, labels

    def loss(self, output: Any, labels: torch.Tensor, teacher: Optional[torch.Tensor] = None) -> torch.Tensor:
        return output[0]


@register_task
class MaeTask(Task):
    """``task: mae`` (module docstring)."""
    name = 'mae'
    description = 'masked-autoencoder pretraining (no labels read)'
    best = ('val_loss', 'min')

    def check(self, cfg: Mapping[str, Any]) -> None:
        """Refuse what a masked autoencoder cannot use: distillation and mixup / CutMix (the base's) and the NaFlex
        loader (it reads fixed-size images).

        Raises:
            ConfigError: naming the key.
        """
        super().check(cfg)
        if cfg['naflex_loader']:
            raise ConfigError(f'naflex_loader trains classifiers; task {self.name!r} reads fixed-size images: set '
                              'naflex_loader: false')

    def build_model(self, model: ModelConfig, mae: MaeConfig, num_classes: int) -> torch.nn.Module:
        return build_model(model, mae, num_classes)

    def init_weights(
            self,
            weights: Mapping[str, torch.Tensor],
            encoder: Callable[[], Dict[str, Any]],
    ) -> Optional[Dict[str, Any]]:
        """A masked autoencoder's ``init_from`` loads the whole file (the encoder and the decoder)."""
        return None

    def objective(self, settings: StepSettings, num_classes: int) -> ReconstructionObjective:
        return ReconstructionObjective()

    def evaluate(self, net: torch.nn.Module, loader: Any, context: EvalContext) -> Dict[str, Any]:
        """``tkvision.engine.evaluate.evaluate_mae``: the reconstruction loss with the run's fixed masks."""
        return evaluate_mae(net, loader, context.device, context.preprocess, context.autocast_dtype, context.seed)

    def curves(self, train_label: str) -> Tuple[Sequence[Tuple[str, str]], Optional[Tuple[str, str, Any]]]:
        return (('train_loss', 'train reconstruction loss'), ('val_loss', 'val reconstruction loss (fixed masks)'),
                ('ema_val_loss', 'EMA val reconstruction loss')), None

    def end_of_run(
            self,
            model: torch.nn.Module,
            dataset: Any,
            mean_std: Tuple,
            path: Callable[[str], str],
            mae: MaeConfig,
            device: torch.device,
    ) -> None:
        """``reconstruction.png``: the first ``recon_images`` validation images, masked and reconstructed."""
        if mae.recon_images:
            mean, std = mean_std
            save_reconstructions(model, dataset, mean, std, path(RECONSTRUCTION_FILE), mae.recon_images,
                                 mae.mask_ratio, device)

    def done_message(self, result: Mapping[str, Any], minutes: float, files: RunFiles) -> str:
        return (f"done in {minutes:.1f} min: final val reconstruction loss {result['val_loss']:.4f}\n"
                f"  weights: {files.last} (fine-tune with init_from: {files.last})\n"
                f"  reconstructions: {files.reconstructions}\n  curves:  {files.curves}")

    def validate_line(self, model_name: str, result: Mapping[str, Any], split: str) -> str:
        return (f"{model_name} (masked autoencoder) on {result['count']} {split} images: reconstruction loss "
                f"{result['loss']:.4f} (the run's fixed masks)  {result['img_per_s']:.0f} img/s")

    def check_export(self, checkpoint: str) -> None:
        raise UsageError(f'{checkpoint} is a masked-autoencoder checkpoint (task: mae), not a classifier: fine-tune it '
                         'first (a classifier config with init_from: its last.safetensors), then export that run')

    def check_teacher(self, path: str) -> None:
        raise ConfigError(f"teacher: {path} is a masked autoencoder's (task: mae): it predicts pixels, not classes; "
                          "give a finished classifier run's weights")

    def check_reconstructions(self, checkpoint: str) -> None:
        """An MAE run draws its reconstructions: nothing to refuse."""
