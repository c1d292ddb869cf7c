"""Building the model a config describes, from its ``model`` section (and ``mae`` section for
``task: mae``)."""
import contextlib
import json
import os
from typing import Any

import timm
import torch

from ..data import train_class_map
from ..models import create_mae
from ..utils.errors import ConfigError
from .config import section

__all__ = ['build_model', 'create_model', 'model_for_config', 'default_num_classes']


def build_model(model: dict, mae: dict = None, num_classes: int = 1000) -> torch.nn.Module:
    """``timm.create_model(model['model'], drop_path_rate=..., **model['model_kwargs'])``, or with an
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
    kwargs = dict(model['model_kwargs'])
    if model['drop_path_rate']:
        kwargs['drop_path_rate'] = model['drop_path_rate']
    if mae is not None:
        d = mae['decoder']
        with _refusals_as_config_errors(f"model_kwargs or the mae keys of {model['model']}"):
            return create_mae(model['model'], decoder=dict(embed_dim=d['embed_dim'], depth=d['depth'],
                                                           num_heads=d['num_heads']),
                              mask_ratio=mae['mask_ratio'], norm_pix_loss=mae['norm_pix_loss'],
                              decoder_num_tokens=d['num_tokens'], decoder_kind=d['kind'], **kwargs)
    kwargs.setdefault('num_classes', num_classes)
    return create_model(model['model'], **kwargs)


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



def default_num_classes(data: dict) -> int:
    """Classes of the data section's dataset when ``model_kwargs`` does not say: 10 for Fashion-MNIST; for a
    class-folder dataset (``folder``, ``imagenet``) or shards with a class list, the classes of its training split
    (`train_class_map`: a 3-class folder gets a 3-way head, not ImageNet's); else
    1000 (ImageNet-1K, the timm default)."""
    if data['dataset'] == 'fashion_mnist':
        return 10
    classes = train_class_map(data)
    return len(classes) if classes else 1000


def model_for_config(cfg: dict, num_classes: int = None) -> torch.nn.Module:
    """`build_model` of a whole config: its model section, its MAE section when ``task`` is
    ``mae``, and ``num_classes`` (default: `default_num_classes`)."""
    mae = section(cfg, 'mae') if cfg['task'] == 'mae' else None
    return build_model(section(cfg, 'model'), mae, num_classes or default_num_classes(section(cfg, 'data')))
