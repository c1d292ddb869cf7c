"""``task: linprobe``: MAE's linear probing (He et al. 2022, App. A.3, https://arxiv.org/abs/2111.06377): the
``init_from`` encoder frozen, a BatchNorm without affine parameters and the linear head trained
(``tkvision.models.mae.linear_probe``). Otherwise a classifier (`tkvision.engine.tasks.classify.ClassifyTask`).
"""
from typing import Any, Mapping

import torch

from ...models.mae import linear_probe
from ...utils.errors import ConfigError
from .base import register_task
from .classify import ClassifyTask

__all__ = ['LinprobeTask']


@register_task
class LinprobeTask(ClassifyTask):
    """``task: linprobe`` (module docstring)."""
    name = 'linprobe'
    description = "the init_from encoder frozen, MAE's BatchNorm + linear head trained"

    def check(self, cfg: Mapping[str, Any]) -> None:
        """Refuse a probe without the encoder it probes, or with the NaFlex loader (it reads fixed-size images).

        Raises:
            ConfigError: naming the key.
        """
        if not cfg['init_from']:
            raise ConfigError(f'task {self.name} needs init_from (the pretrained encoder to probe)')
        if cfg['naflex_loader']:
            raise ConfigError(f'naflex_loader trains classifiers end to end; task {self.name!r} reads fixed-size '
                              'images: set naflex_loader: false')

    def prepare(self, net: torch.nn.Module) -> None:
        """Freeze the loaded encoder and put MAE's BatchNorm before the head."""
        linear_probe(net)
