"""Share a trained model as timm users do: timm's ``save_for_hf`` folder, loadable with
``timm.create_model('local-dir:PATH', pretrained=True)`` (after ``import tkvision``) or pushed to a hub.

The folder holds ``model.safetensors`` and ``config.json`` (``architecture``, ``num_classes``,
``pretrained_cfg`` and ``model_args``). ``model_args`` carries the model's current token counts
(``num_tokens_patch / _qkv / _proj / _ffn``), so a model grown during or after training is rebuilt
at its grown size; each Pattention's τ, fixed at its first size (Appendix B), comes back from the
weights.
"""

import os
from typing import Optional

import timm
import torch

from ..growth import token_counts
from ..utils.errors import ConfigError, UsageError
from ..utils.files import atomic_folder, holds_files, safetensors_os_errors
from .checkpoint import load_training_checkpoint, model_for_checkpoint
from .config import load_config
from .tasks import task_named

__all__ = ['EXPORT_FILES', 'export_model', 'export_checkpoint', 'check_export_target']

#: The files an export writes (timm's ``save_for_hf`` with safetensors): all ``--force`` may replace.
EXPORT_FILES = frozenset({'model.safetensors', 'config.json'})


def check_export_target(out: str, force: bool) -> None:
    """Refuse, before any work, an export folder that holds files: without ``force`` any; with ``force``
    any file an export did not write (`EXPORT_FILES`), so ``--force`` replaces an earlier export and
    never removes a run's checkpoint, its config, its metrics, a live run's ``.lock``, or anything else.

    Raises:
        FileExistsError: ``out`` holds files and not ``force``.
        UsageError: ``force`` but ``out`` holds files of something other than an export (listed).
    """
    if not holds_files(out):
        return
    if not force:
        raise FileExistsError(f'{out} already exists and holds files; export to a new folder (or --force to replace '
                              'an earlier export there)')
    if not os.path.isdir(out):
        raise UsageError(f'{out} is a file, not an export folder; --force replaces only an earlier export')
    # a run's own files first: they say what the folder is
    others = sorted(set(os.listdir(out)) - EXPORT_FILES, key=lambda n: (n not in ('last.pth', 'config.yaml'), n))
    if others:
        raise UsageError(f'{out} holds files an export did not write ({", ".join(others[:6])}'
                         f'{", ..." if len(others) > 6 else ""}): --force replaces only an earlier export, never a '
                         'run or anything else; export into another folder')


def export_model(
        model: torch.nn.Module,
        out: str,
        model_args: Optional[dict] = None,
        data_config: Optional[dict] = None,
        force: bool = False,
) -> str:
    """Write ``model`` to the folder ``out`` with timm's ``save_for_hf`` (safetensors), atomically
    (`tkvision.utils.files.atomic_folder`: a full disk or a kill leaves no half-written folder);
    returns ``out``.

    Args:
        model_args: construction kwargs to record besides timm's own (TokenFormer token counts are
            added here). data_config: preprocessing to record (``mean``, ``std``, ``crop_pct``, ...).
        force: replace an ``out`` that already holds files.

    Raises:
        FileExistsError, UsageError: as `check_export_target`.
    """
    check_export_target(out, force)
    args = dict(model_args or {})
    try:
        args.update({f'num_tokens_{kind}': n for kind, n in token_counts(model).items()})
    except ValueError:  # not a model with uniform token counts per kind (or no Pattention at all)
        pass
    with safetensors_os_errors(out):
        atomic_folder(out, lambda tmp: timm.models.save_for_hf(model, tmp, model_args=args, safe_serialization=True,
                                                              data_config=data_config), replace=force)
    return out


def export_checkpoint(
        checkpoint: str,
        out: str,
        use_ema: bool = True,
        model: Optional[str] = None,
        model_kwargs: Optional[dict] = None,
        force: bool = False,
) -> dict:
    """Export a training checkpoint (``last.pth``: its config names the model) or a weights file
    (``.safetensors``, with ``model`` and ``model_kwargs``) as a ``save_for_hf`` folder; a run that
    grew is exported at its grown size
    ([`tkvision.engine.checkpoint.model_for_checkpoint`][tkvision.engine.checkpoint.model_for_checkpoint]).

    Args:
        use_ema: take the EMA weights of a ``.pth`` that has them (else the raw ones).
        force: replace an ``out`` that already holds files (else refused before any work).

    Returns:
        ``dict(out, source, token_counts, task)``, ``source`` being ``'ema'`` or ``'model'``, ``task`` the run's.

    Raises:
        FileNotFoundError: no checkpoint. ConfigError: a weights file without ``model``, or ``model_kwargs``
            that is not a mapping. UsageError: an MAE checkpoint (no classifier to export), or an ``out`` that
            `check_export_target` refuses. WeightsMismatchError: weights that do not fit the model.
    """
    check_export_target(out, force)
    if model_kwargs is not None and not isinstance(model_kwargs, dict):
        raise ConfigError(f'--model-kwargs must be a YAML mapping such as "{{img_size: 28, in_chans: 1}}", '
                          f'got {model_kwargs!r}')
    kwargs = dict(model_kwargs or {})
    data_config, source = None, 'model'
    if checkpoint.endswith('.pth'):
        state = load_training_checkpoint(checkpoint)
        cfg = state['config']
        task_named(cfg['task']).check_export(checkpoint)
        cfg = dict(cfg, model=model or cfg['model'], model_kwargs={**cfg['model_kwargs'], **kwargs}, drop_path_rate=0.0)
        source = 'ema' if use_ema and state.get('model_ema') else 'model'
        data_config = {k: cfg[k] for k in ('mean', 'std', 'crop_pct', 'interpolation') if cfg.get(k) is not None}
    elif not model:
        raise ConfigError('a weights file needs --model (and --model-kwargs for a non-default shape)')
    else:
        cfg = load_config(None, dict(model=model, model_kwargs=kwargs))
    net, _ = model_for_checkpoint(cfg, checkpoint, use_ema=source == 'ema')
    model_args = {k: v for k, v in cfg['model_kwargs'].items() if k != 'pretrained_cfg_overlay'}
    export_model(net.eval(), out, model_args=model_args, data_config=data_config, force=force)
    return dict(out=out, source=source, token_counts=token_counts(net), task=cfg['task'])
