"""Checkpoints: atomic writes, safe loading, and clear errors for weights that do not fit.

- Training state (``last.pth``): one ``torch.save`` dict of model, optimizer, scheduler, scaler,
  EMA, epoch and config, written to a temporary file in the same folder and renamed over the old
  one (``os.replace`` is atomic on POSIX), so a crash leaves either the old or the new file.
- Model weights (``best.safetensors``, ``last.safetensors``): safetensors, loadable by
  ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=...))``.
- Loading never unpickles code: ``torch.load(weights_only=True)`` or safetensors.
"""
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file
from timm.models import load_state_dict as timm_load_state_dict

__all__ = ['atomic_save', 'save_weights', 'load_state', 'load_state_dict_file', 'adapt_state_dict', 'check_fit',
           'load_weights',
           'WeightsMismatchError']


class WeightsMismatchError(ValueError):
    """Weights that do not fit a model; the message lists missing, unexpected and mis-shaped tensors."""


def _atomic(path: str, write):
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_save(obj, path: str):
    """``torch.save(obj, path)`` through a temporary file and an atomic rename."""
    _atomic(path, lambda tmp: torch.save(obj, tmp))


def save_weights(state_dict: dict, path: str, metadata: dict = None):
    """Write a model state dict as ``.safetensors`` atomically (tensors made contiguous, on CPU)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    _atomic(path, lambda tmp: save_file(tensors, tmp, metadata={k: str(v) for k, v in (metadata or {}).items()}))


def load_state(path: str, map_location='cpu') -> dict:
    """Load a ``.pth`` training checkpoint with ``weights_only=True``.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    return torch.load(path, map_location=map_location, weights_only=True)


def load_state_dict_file(path: str, use_ema: bool = True) -> dict:
    """Model weights from ``.safetensors`` or a ``.pth``, through timm's ``load_state_dict``
    (``weights_only=True``; a training checkpoint's EMA weights win when ``use_ema``; ``module.``
    prefixes removed).

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'weights file not found: {path}')
    return timm_load_state_dict(path, use_ema=use_ema, weights_only=True)


def adapt_state_dict(model: torch.nn.Module, state_dict: dict) -> dict:
    """``state_dict`` through the checkpoint filter of ``model``'s family (``checkpoint_filter_fn`` in
    its tkvision model module: earlier layouts, position-embedding size, input channels), as timm's
    ``pretrained=True`` path applies it; unchanged for other models."""
    module = sys.modules.get(type(model).__module__)
    fn = getattr(module, 'checkpoint_filter_fn', None) if type(model).__module__.startswith('tkvision.') else None
    return fn(dict(state_dict), model) if fn else state_dict


def check_fit(model: torch.nn.Module, state_dict: dict, source: str = 'checkpoint'):
    """Raise :class:`WeightsMismatchError` unless ``state_dict`` has exactly the model's tensors and shapes.

    The message names every missing, unexpected and mis-shaped tensor (with both shapes).
    """
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    shapes = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}'
              for k in sorted(set(own) & set(state_dict)) if own[k].shape != state_dict[k].shape]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append('shape differs:\n  ' + '\n  '.join(shapes))
        if missing:
            parts.append('missing from the checkpoint:\n  ' + '\n  '.join(missing))
        if unexpected:
            parts.append('not in the model:\n  ' + '\n  '.join(unexpected))
        raise WeightsMismatchError(f'{source} does not fit the model:\n' + '\n'.join(parts))


def load_weights(model: torch.nn.Module, path: str, use_ema: bool = True, state_dict=None) -> torch.nn.Module:
    """Load weights from ``path`` into ``model`` strictly, after ``check_fit``; returns ``model``.
    ``state_dict``: the file's tensors when already read (``path`` then only names it in errors).

    Raises:
        FileNotFoundError: no file. WeightsMismatchError: tensors differ (listed).
    """
    state_dict = adapt_state_dict(model, load_state_dict_file(path, use_ema) if state_dict is None else state_dict)
    check_fit(model, state_dict, path)
    model.load_state_dict(state_dict)
    return model
