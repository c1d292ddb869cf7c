"""Building the model a config describes: the ``model`` section (``ModelConfig``) and, for ``task: mae``, the
``mae`` section (``MaeConfig``, with its ``DecoderConfig``), the ``Config`` of this module
(`tkvision.utils.config_fields`)."""
import contextlib
import dataclasses
import json
import os
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

import timm
import torch

from ..layers import BACKWARD_MODES
from ..models import create_mae
from ..utils.config_fields import boolean, choice, integer, key, mapping, number, string
from ..utils.errors import ConfigError

__all__ = ['ModelConfig', 'DecoderConfig', 'MaeConfig', 'build_model', 'create_model']


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network: its registry name, its arguments, and how it runs (the ``model`` section)."""

    model: str = key('tokenformer_vit_ti16', allowed=string())
    """A name ``timm.create_model`` knows (``tokenformer_vit_b16``, timm's ``vit_base_patch16_224``, ...)."""
    model_kwargs: Mapping[str, Any] = key(allowed=mapping(), default_factory=lambda: MappingProxyType({}))
    """Passed to ``timm.create_model`` (``img_size``, ``patch_size``, ``num_tokens``, ``num_classes``, ...)."""
    drop_path_rate: float = key(0.0, allowed=number(0, 1, hi_open=True))
    """Stochastic depth: the drop rate of the last block (timm's linear rule over the blocks)."""
    init_from: Optional[str] = key(None, allowed=string(null=True), resume=True)
    """A weights file to start from (``.safetensors`` / ``.pth``; an MAE checkpoint gives its encoder); a
    smaller TokenFormer's tokens are grown to fit."""
    freeze_loaded_tokens: bool = key(False, allowed=boolean())
    """With ``init_from``: train only the tokens appended to the loaded ones (and the head)."""
    grad_checkpointing: bool = key(False, allowed=boolean(), resume=True)
    """Recompute each block's activations in the backward pass (less memory, more time)."""
    compile: Union[bool, str] = key('auto', allowed=choice(True, False, 'auto'), resume=True)
    """``torch.compile`` the model: true, false, or ``'auto'`` (on for CUDA, where a TokenFormer trains at
    0.85x ViT-B compiled against 0.37x eager; off on a CPU, where compiling costs what it saves over the quick
    recipe: docs/performance.md)."""
    compile_cache: bool = key(True, allowed=boolean(), resume=True)
    """With ``compile``: keep torch.compile's caches beside ``last.pth`` (``compile_cache.bin``) and load them on
    resume when torch, the device and the model still match, so a restart does not compile again
    (``docs/reliability.md``); the file holds compiled code: resume only folders you trust."""
    backward_mode: str = key('closed_form', allowed=choice(*BACKWARD_MODES), resume=True)
    """Pattention's Θ (``tkvision.layers.BACKWARD_MODES``): ``'closed_form'``, ``'lean'`` (least activation
    memory), ``'autograd'`` (reference), ``'fused'`` (Triton kernels, forward and backward, on a CUDA device:
    ``tkvision/layers/pattention_triton.py``; not yet measured to win)."""


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """MAE's decoder (the ``decoder`` key of the ``mae`` section): 512 wide, 8 blocks, 16 heads by default."""

    embed_dim: int = key(512, allowed=integer(1))
    """Width of the decoder's tokens."""
    depth: int = key(8, allowed=integer(1))
    """Decoder blocks."""
    num_heads: int = key(16, allowed=integer(1))
    """Attention heads per decoder block (``embed_dim`` must divide by it)."""
    num_tokens: Optional[int] = key(None, allowed=integer(1, null=True))
    """A TokenFormer decoder's parameter tokens per Pattention; null: ``embed_dim``."""
    kind: Optional[str] = key(None, allowed=choice(None, 'tokenformer', 'vit'))
    """``'tokenformer'`` or ``'vit'``; null: a TokenFormer decoder for a TokenFormer encoder, else a ViT's."""


@dataclasses.dataclass(frozen=True)
class MaeConfig:
    """Masked-autoencoder pretraining (``task: mae``; `tkvision.models.mae`) (the ``mae`` section)."""

    mask_ratio: float = key(0.75, allowed=number(0, 1, lo_open=True, hi_open=True))
    """Fraction of each image's patches masked."""
    norm_pix_loss: bool = key(True, allowed=boolean())
    """Regress each patch's pixels normalised by their own mean and variance (MAE's default)."""
    decoder: DecoderConfig = dataclasses.field(default_factory=DecoderConfig)
    """The decoder's shape."""
    recon_images: int = key(8, allowed=integer(0), resume=True)
    """Validation images in the ``reconstruction.png`` written at the end; 0: none."""



def build_model(
        model: ModelConfig,
        mae: Optional[MaeConfig] = None,
        num_classes: int = 1000,
) -> torch.nn.Module:
    """``timm.create_model(model.model, drop_path_rate=..., **model.model_kwargs)``, or with an
    ``mae`` section a [`tkvision.models.mae.MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] around that
    model as encoder (``mask_ratio``, ``norm_pix_loss``, ``decoder``).

    Args:
        model: the config's model section.
        mae: its MAE section, for ``task: mae``; None otherwise.
        num_classes: classifier outputs unless ``model_kwargs`` sets ``num_classes``.

    Raises:
        ConfigError: the model refuses its kwargs (an unknown kwarg, depth 0, heads that do not divide
            ``embed_dim``, a mask ratio with nothing to learn, ...): the message names the model and
            repeats the model's own words.
    """
    kwargs = dict(model.model_kwargs)
    if model.drop_path_rate:
        kwargs['drop_path_rate'] = model.drop_path_rate
    if mae is not None:
        d = mae.decoder
        with _refusals_as_config_errors(f"model_kwargs or the mae keys of {model.model}"):
            return create_mae(model.model, decoder=dict(embed_dim=d.embed_dim, depth=d.depth,
                                                           num_heads=d.num_heads),
                              mask_ratio=mae.mask_ratio, norm_pix_loss=mae.norm_pix_loss,
                              decoder_num_tokens=d.num_tokens, decoder_kind=d.kind, **kwargs)
    kwargs.setdefault('num_classes', num_classes)
    return create_model(model.model, **kwargs)


def create_model(name: str, **kwargs: Any) -> torch.nn.Module:
    """``timm.create_model(name, **kwargs)``, its refusals (an unknown kwarg, a value it rejects) as
    `ConfigError` naming ``model_kwargs`` and the model.

    Raises:
        ConfigError: an unknown model name (timm's registry, ``local-dir:`` / ``hf-hub:`` names aside), or a
            keyword the model refuses.
    """
    if ':' not in name and not timm.is_model(name):
        raise ConfigError(f"unknown model {name!r}: timm.list_models('tokenformer*') lists ours (import tkvision "
                          'first), timm.list_models() every one')
    folder = name.partition('local-dir:')[2]
    with _refusals_as_config_errors(f'model_kwargs of {name}', os.path.join(folder, 'config.json')):
        return timm.create_model(name, **kwargs)


@contextlib.contextmanager
def _refusals_as_config_errors(where: str, config_json: str = 'config.json'):
    try:
        yield
    except json.JSONDecodeError as e:  # a local-dir: export whose config.json does not parse
        raise ConfigError(f'{where}: {config_json} is not valid JSON ({e}): export the model again') from None
    except (TypeError, ValueError) as e:  # the model's own words follow the key
        raise ConfigError(f'{where}: {e}') from e
