"""Building the model a config describes, from its ``model`` section (and ``mae`` section for
``task: mae``)."""
import contextlib
import json
import os
from typing import Any, Optional

import timm
import torch

from ..config_sections import DataConfig, MaeConfig, ModelConfig, TrainConfig
from ..data import train_class_map
from ..models import create_mae, input_shape
from ..utils.errors import ConfigError

__all__ = ['build_model', 'create_model', 'model_for_config', 'check_model_input', 'default_num_classes']


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



def check_model_input(
        model: ModelConfig,
        data: DataConfig,
) -> None:
    """Refuse, before any work, a model (the model section) that cannot take the data section's images:
    Fashion-MNIST's are ``img_size`` px with one channel, every other dataset's decode to three (RGB,
    ``tkvision.data.decode_image``), and another input would only fail at the first batch (the model is built
    on the meta device: no memory).

    Raises:
        ConfigError: naming both shapes and the model_kwargs that fit.
    """
    with torch.device('meta'):
        net = create_model(model.model, **{k: v for k, v in model.model_kwargs.items() if k != 'num_classes'})
    channels, size = input_shape(net)
    if data.dataset != 'fashion_mnist':
        if channels != 3:
            raise ConfigError(f'dataset {data.dataset} gives RGB images (3 channels); {model.model} as configured '
                              f'takes {channels}: set model_kwargs {{in_chans: 3}} (or leave in_chans unset)')
        return
    if channels == 1 and size in (None, (data.img_size,) * 2):
        return
    shown = f'{size[0]} x {size[1]} px' if size else 'any size'
    raise ConfigError(f"Fashion-MNIST images are {data.img_size} x {data.img_size} px, 1 channel; "
                      f"{model.model} "
                      f"as configured takes {shown}, {channels} channels: set model_kwargs "
                      "{img_size: 28, patch_size: 7, in_chans: 1} (as configs/fashion_mnist/quick.yaml does)")


def default_num_classes(data: DataConfig) -> int:
    """Classes of the data section's dataset when ``model_kwargs`` does not say: 10 for Fashion-MNIST; for a
    class-folder dataset (``folder``, ``imagenet``) or shards with a class list, the classes of its training split
    (`train_class_map`: a 3-class folder gets a 3-way head, not ImageNet's); else
    1000 (ImageNet-1K, the timm default)."""
    if data.dataset == 'fashion_mnist':
        return 10
    classes = train_class_map(data)
    return len(classes) if classes else 1000


def model_for_config(
        config: TrainConfig,
        num_classes: Optional[int] = None,
) -> torch.nn.Module:
    """`build_model` of a whole config: its model section, its MAE section when ``task`` is
    ``mae``, and ``num_classes`` (default: `default_num_classes`)."""
    mae = config.mae if config.run.task == 'mae' else None
    return build_model(config.model, mae, num_classes or default_num_classes(config.data))
