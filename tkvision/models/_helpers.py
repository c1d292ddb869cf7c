"""Weights in and out of a model, as timm's ``models/_helpers.py``: read a weights file without
unpickling code, adapt it with the model family's checkpoint filter, check that it fits.

Growth (`tkvision.growth`) and the run-checkpoint owner (`tkvision.engine.checkpoint`)
build on these; the models use them to read a local file's head size.
"""
import os
import pickle
from typing import Any, Optional, Tuple

import torch
from safetensors import SafetensorError
from timm.models import load_state_dict as timm_load_state_dict
from timm.utils import unwrap_model

from ..utils.errors import UsageError, WeightsMismatchError, is_refused_pickle, refused_pickle

__all__ = ['load_state_dict_file', 'file_shapes', 'adapt_state_dict', 'check_fit', 'input_shape', 'check_arguments',
           'check_positive']


def load_state_dict_file(path: str, use_ema: bool = True) -> dict:
    """Model weights from ``.safetensors`` or a ``.pth``, through timm's ``load_state_dict``
    (``weights_only=True``: nothing is unpickled but tensors and plain containers; a training
    checkpoint's EMA weights win when ``use_ema``; ``module.`` prefixes removed).

    Raises:
        FileNotFoundError: no file at ``path``. UsageError: a file that cannot be read (truncated, not
            a weights file), naming it. UnsafeFileError: a file that holds pickled objects other than tensors
            (refused, never run).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'weights file not found: {path}')
    try:
        return timm_load_state_dict(path, use_ema=use_ema, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, SafetensorError) as e:
        if is_refused_pickle(e):  # weights_only refused code in the file (as torch or timm says it): never run it
            raise refused_pickle(path, e) from None
        raise UsageError(f'{path} is not a readable weights file (truncated, or not a .safetensors / torch file): '
                         + str(e).splitlines()[0]) from None


def file_shapes(path: str, names) -> dict:
    """``{name: shape}`` of the tensors ``names`` that a weights file holds (a .safetensors is read without
    loading the rest; a .pth through `load_state_dict_file`, EMA first)."""
    if path.endswith('.safetensors'):
        from safetensors import safe_open
        with safe_open(path, 'pt') as f:
            return {n: tuple(f.get_slice(n).get_shape()) for n in names if n in f.keys()}
    state = load_state_dict_file(path)
    return {n: tuple(state[n].shape) for n in names if n in state}


def adapt_state_dict(model: torch.nn.Module, state_dict: dict) -> dict:
    """``state_dict`` through ``model.checkpoint_filter`` (the family's ``checkpoint_filter_fn``:
    earlier layouts, position-embedding size, input channels), as timm's ``pretrained=True`` path
    applies it; a copy of ``state_dict`` for models without that method (timm's own)."""
    model = unwrap_model(model)
    adapt = getattr(model, 'checkpoint_filter', None)
    return adapt(dict(state_dict)) if adapt is not None else dict(state_dict)


def check_fit(model: torch.nn.Module, state_dict: dict, source: str = 'checkpoint'):
    """Raise `WeightsMismatchError` unless ``state_dict`` has exactly
    the model's tensors and shapes; the message names every missing, unexpected and mis-shaped
    tensor (with both shapes) and ``source`` (the file)."""
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


def input_shape(model: torch.nn.Module) -> Tuple[int, Optional[Tuple[int, ...]]]:
    """``(channels, (H, W) or None)`` a ViT-like model takes: its stem's input channels and, when the
    stem checks the size (timm's ``strict_img_size``, ours without ``dynamic_img_size``), the image size.
    A NaFlex model (timm's ``embeds`` stem) takes any size: ``(in_chans, None)``."""
    vit: Any = model  # a ViT by its attributes: ours or timm's
    if not hasattr(vit, 'patch_embed') and hasattr(vit, 'embeds'):
        return vit.in_chans, None
    stem = vit.patch_embed
    channels = getattr(vit, 'in_chans', None) or stem.proj.weight.shape[1]
    strict = getattr(stem, 'strict_img_size', True) and not getattr(model, 'dynamic_img_size', False)
    return channels, (tuple(stem.img_size) if strict and getattr(stem, 'img_size', None) else None)


def check_arguments(fn, values: dict):
    """Refuse the arguments of ``fn`` (a typed constructor) whose value does not have the annotated type:
    ``bool`` only ``True`` / ``False`` (``'maybe'`` is not true), ``int`` an integer, ``float`` a finite
    number, ``str`` a string, each optionally ``None`` (``Optional[...]``). Other annotations are the
    constructor's own to check.

    Raises:
        ValueError: the first argument of the wrong type, naming it, the value and what it takes.
    """
    import inspect
    import math
    import typing
    hints = typing.get_type_hints(fn)
    for name in inspect.signature(fn).parameters:
        if name not in values or name not in hints:
            continue
        value, hint = values[name], hints[name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) is typing.Union and type(None) in args and len(args) == 2
        kind = next(a for a in args if a is not type(None)) if optional else hint
        if value is None and optional:
            continue
        words = {bool: 'true or false', int: 'an integer', float: 'a finite number', str: 'a string'}.get(kind)
        if words is None:
            continue
        ok = {bool: isinstance(value, bool),
              int: isinstance(value, int) and not isinstance(value, bool),
              float: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
              str: isinstance(value, str)}[kind]
        if not ok:
            raise ValueError(f'{name} must be {words}{" or None" if optional else ""}, got {name}={value!r}')


def check_positive(**values):
    """Refuse a value that is not a finite number > 0 (``None`` passes: a default), naming it.

    Raises:
        ValueError: naming the argument and the value.
    """
    import math
    for name, value in values.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f'{name} must be a number > 0, got {name}={value!r}')
