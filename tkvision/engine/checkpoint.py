"""Checkpoints: the one owner of what a run writes, under which name, and how it is read back.

Checkpoint files of a run directory (names: the constants below; the config, metrics, pictures and loggers' files
are the run log's, ``tkvision.engine.runlog``)::

    last.pth            the training state (format: ``tkvision.engine.state.TrainState.state_dict``), every
                        ``save_every`` epochs, every ``checkpoint_every_steps`` updates, every
                        ``checkpoint_every_minutes`` and on SIGTERM / SIGUSR1
    last.safetensors    the weights at the last epoch: the EMA weights when EMA is on (the metadata's
                        ``source`` says which), loadable by ``timm.create_model(name, pretrained=True,
                        pretrained_cfg_overlay=dict(file=...))``
    best.safetensors    the weights of the best evaluation (`keep_best`; ``source``, ``epoch``
                        and the metric in the metadata)
    .lock               the run's lock (``tkvision.engine.rundir``)

Every file is written atomically (`tkvision.utils.files.atomic_write`): a crash leaves the old
file or the new one. Reading never unpickles code: ``torch.load(weights_only=True)`` or safetensors.

Every reader of a model's weights (resume, ``init_from``, validate, export, the MAE pictures, the
attention-distance tool, growing a file) goes through `load_fitting_weights`: adapt with the
family's checkpoint filter, grow the model to the checkpoint's size if the run grew, check the fit
(naming every tensor that differs), load.
"""
import errno
import json
import os
import pickle
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
from safetensors.torch import save_file

from ..growth import grow, grow_to_checkpoint, load_grown_state_dict, token_counts
from ..models import adapt_state_dict, check_fit, encoder_weights, is_mae_state_dict, load_state_dict_file
from ..utils.errors import ConfigError, UsageError, refused_pickle
from ..utils.files import atomic_write, safetensors_os_errors
from .config import migrate, model_for_config, read_run_config
from .runlog import CONFIG_FILE
from .tasks import Task, task_named
from .state import FORMAT_VERSION

__all__ = ['LAST_CHECKPOINT', 'LAST_WEIGHTS', 'BEST_WEIGHTS', 'FORMAT_VERSION', 'save_training_checkpoint',
           'load_training_checkpoint', 'checkpoint_config', 'save_weights', 'keep_best',
           'read_weights', 'load_fitting_weights', 'model_for_checkpoint', 'load_teacher', 'load_init_weights',
           'grow_weights_file']

LAST_CHECKPOINT = 'last.pth'
LAST_WEIGHTS = 'last.safetensors'
BEST_WEIGHTS = 'best.safetensors'


def save_training_checkpoint(checkpoint: Mapping[str, Any], path: str) -> None:
    """Write a ``last.pth`` dict (``tkvision.engine.state.TrainState.state_dict``: the format) to ``path``
    atomically (``torch.save``).

    Raises:
        OSError: ``ENOSPC`` for a full disk, ``EIO`` for another failed write (``path`` left as it was; the commands
            print either as one line).
    """
    had_one = os.path.isfile(path)
    try:
        atomic_write(path, lambda tmp: torch.save(dict(checkpoint), tmp))
    except RuntimeError as error:  # torch's writer says a failed write in its own words, two chained tracebacks
        # on a full disk its zip writer ends with "unexpected pos N vs M" (its own count of bytes against the file's)
        if not any(words in str(error).lower() for words in ('write', 'unexpected pos', 'inline_container')):
            raise
        folder = os.path.dirname(os.path.abspath(path))
        usage = os.statvfs(folder)
        full = usage.f_bavail * usage.f_frsize < 2 ** 26  # under 64 MiB left: the disk, not a fault of the file
        raise OSError(errno.ENOSPC if full else errno.EIO,
                      f'{"No space left on the device" if full else "The file system failed"} writing {path} '
                      f'({str(error).splitlines()[-1][:120]}); ' + ('the previous checkpoint is kept: make room, then '
                      'continue with --resume' if had_one else 'no checkpoint was written yet: make room, then run '
                      'the same command again')) from None


def load_training_checkpoint(path: str, map_location: Union[str, torch.device] = 'cpu', mmap: bool = False) -> dict:
    """A ``last.pth`` (``weights_only=True``), its config migrated to today's keys
    (`tkvision.engine.config.migrate`) and, under ``saved_config``, as it was saved (what a resume compares:
    ``tkvision.engine.config.config_changes`` refuses a removed key or value the run trained with).

    Raises:
        FileNotFoundError: no file at ``path``. UsageError: a truncated file, or not a training checkpoint.
        UnsafeFileError: a file that holds pickled objects other than tensors (refused, never run).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    try:
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except RuntimeError as e:  # not a zip file: mmap cannot read it, the unpickler can tell what it is
            if not (mmap and 'mmap can only be used' in str(e)):
                raise
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused code in the file: never run it
        raise refused_pickle(path, e) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise UsageError(f'{path} is not a readable training checkpoint (truncated, or not a torch file): '
                         + str(e).splitlines()[0]) from None
    if not isinstance(ckpt, dict) or 'config' not in ckpt:
        raise UsageError(f'{path} is not a training checkpoint of tkvision (no config in it); '
                         'for a weights file use --config or --model')
    ckpt['saved_config'] = ckpt['config']
    ckpt['config'] = migrate(ckpt['config'])
    return ckpt


def checkpoint_config(path: str) -> dict:
    """The config of a ``last.pth`` (migrated), without reading its tensors: the file is memory-mapped
    (``torch.load(mmap=True)``), so only the small config is read, however large the checkpoint.

    Raises:
        as `load_training_checkpoint`.
    """
    return load_training_checkpoint(path, mmap=True)['config']


def save_weights(state_dict: dict, path: str, metadata: Optional[dict] = None) -> None:
    """Write a model state dict as ``.safetensors`` atomically (tensors made contiguous, on CPU);
    ``metadata`` values are stored as strings. Equal tensors and metadata give a byte-identical file (the
    metadata's keys sorted: safetensors writes them in a per-process random order), so files compare by hash.

    Raises:
        OSError: ``ENOSPC`` for a full disk (``path`` left as it was), and the file system's other errors.
    """
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    meta = {k: str(v) for k, v in (metadata or {}).items()}

    def write(tmp: str) -> None:
        save_file(tensors, tmp, metadata=meta)
        _sort_metadata(tmp)
    with safetensors_os_errors(path):
        atomic_write(path, write)


def _sort_metadata(path: str) -> None:
    """Rewrite the ``__metadata__`` of the safetensors file at ``path`` with its keys sorted, in place: the same
    header length (compact JSON of the same content), so no offset moves."""
    with open(path, 'r+b') as f:
        size = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(size))
        if '__metadata__' not in header:
            return
        header['__metadata__'] = dict(sorted(header['__metadata__'].items()))
        text = json.dumps(header, separators=(',', ':'), ensure_ascii=False).encode()
        if len(text) > size:  # another escaping than safetensors': leave the file as it was written
            return
        f.seek(8)
        f.write(text.ljust(size, b' '))


def keep_best(
        best: dict,
        candidates: list,
        metric: str,
        mode: str,
        path: Optional[str] = None,
        metadata: Optional[dict] = None,
) -> dict:
    """The best evaluation so far, saving the winner's weights to ``path`` when it improves (timm's
    ``CheckpointSaver`` keeps the top-k by one metric the same way).

    Args:
        best: the best so far, ``{metric: value, 'epoch': e, 'source': s}``.
        candidates: ``[(source, value, model)]`` of this evaluation (``'model'``, ``'ema'``).
        metric: the metric's name (``'top1'``, ``'val_loss'``).
        mode: ``'max'`` or ``'min'``.
        path: where to save the winner's weights (None: do not save, e.g. on ranks other than 0).
        metadata: stored with the weights, with the source, epoch and metric added.

    Returns:
        ``best`` updated (a new dict) when a candidate beats it, else ``best``.

    Raises:
        ValueError: ``mode`` is not ``'max'`` or ``'min'``.
    """
    if mode not in ('max', 'min'):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    pick = max if mode == 'max' else min
    source, value, model = pick(candidates, key=lambda c: c[1])
    if not (value > best[metric] if mode == 'max' else value < best[metric]):
        return best
    epoch = (metadata or {}).get('epoch', best.get('epoch'))
    best = {metric: value, 'epoch': epoch, 'source': source}
    if path is not None:
        save_weights(model.state_dict(), path, metadata={**(metadata or {}), metric: value, 'source': source})
    return best


def read_weights(path: str, use_ema: bool = True) -> dict:
    """The model weights in ``path``: a ``.safetensors``, a ``last.pth`` (its EMA weights when
    ``use_ema`` and it has them) or another ``.pth`` state dict (timm's ``load_state_dict``).

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    return load_state_dict_file(path, use_ema)


def load_fitting_weights(model: torch.nn.Module, state_dict: dict, source: str = 'checkpoint') -> dict:
    """Load ``state_dict`` into ``model``: adapt it with the family's checkpoint filter, grow the model
    to the checkpoint's size when the run grew during training (`tkvision.growth.grow_to_checkpoint`),
    check the fit, load strictly.

    Returns:
        ``{kind: (old, new)}`` of what grew (``{}`` when nothing did).

    Raises:
        WeightsMismatchError: tensors that still differ, each named with both shapes; ``source`` (the
            file) is named too.
    """
    weights = adapt_state_dict(model, state_dict)
    grown = grow_to_checkpoint(model, weights)
    check_fit(model, weights, source)
    model.load_state_dict(weights)
    return grown


def model_for_checkpoint(
        cfg: Mapping[str, Any],
        path: str,
        use_ema: bool = True,
) -> Tuple[torch.nn.Module, dict]:
    """The model of the flat config ``cfg`` (a checkpoint's or a run folder's; `migrate`d first) with the weights
    of ``path`` loaded (`load_fitting_weights`). A
    classifier gets the file's head size unless ``model_kwargs`` sets ``num_classes``.

    Returns:
        ``(model, grown)``: the model (on the CPU, train mode as built) and ``{kind: (old, new)}``.

    Raises:
        FileNotFoundError: no file. WeightsMismatchError: weights of another model (tensors named).
    """
    weights = read_weights(path, use_ema)
    head = weights.get('head.weight')
    model = model_for_config(cfg, None if head is None else head.shape[0])
    return model, load_fitting_weights(model, weights, path)


def load_teacher(
        path: str,
        device: torch.device,
) -> torch.nn.Module:
    """The trained model of the weights file ``path`` (a finished run's ``last.safetensors`` or
    ``best.safetensors``), built by the ``config.yaml`` beside it, in eval mode without gradients, on ``device``:
    the teacher of ``distillation: teacher`` (``tkvision.engine.loss``).

    Raises:
        ConfigError: no such file, no ``config.yaml`` beside it, or a run whose model gives no class logits (its
            task's ``check_teacher``: a masked autoencoder's; the key ``teacher`` named).
        WeightsMismatchError: weights the folder's config does not build.
    """
    config_file = os.path.join(os.path.dirname(os.path.abspath(path)), CONFIG_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f'teacher: no weights file {path}; give a finished run\'s last.safetensors')
    if not os.path.isfile(config_file):
        raise ConfigError(f'teacher: {path} has no {CONFIG_FILE} beside it to build its model; give the weights of '
                          'a run folder written by tkvision-train')
    config = read_run_config(config_file)
    task_named(config['task']).check_teacher(path)
    model, _ = model_for_checkpoint(config, path, use_ema=False)
    model.requires_grad_(False)
    return model.eval().to(device)


def load_init_weights(model: torch.nn.Module, path: str, task: Task) -> Tuple[dict, str]:
    """``init_from``: start ``model`` from the weights at ``path``: an MAE checkpoint's encoder for a
    classifier (`tkvision.models.mae.encoder_weights`), else a same-size or smaller model's
    weights; a smaller TokenFormer's tokens go into the first rows
    ([`tkvision.growth.load_grown_state_dict`][tkvision.growth.tokens.load_grown_state_dict]).

    Returns:
        ``(grown, report)``: ``{tensor name: (old rows, new rows)}`` and a line saying what was loaded.

    Raises:
        FileNotFoundError: no file. WeightsMismatchError: tensors that do not fit (named).
    """
    weights = read_weights(path)
    encoder = task.init_weights(weights, lambda: encoder_weights(model, weights)) if is_mae_state_dict(weights) \
        else None
    if encoder is not None:
        grown = load_grown_state_dict(model, encoder['weights'])
        report = (f"MAE encoder from {path}: loaded {len(encoder['loaded'])} tensors, dropped "
                  f"{len(encoder['dropped'])} ({_names(encoder['dropped'])}), kept the init of "
                  f"{_names(encoder['kept_init']) or 'nothing'}")
        return grown, report
    grown = load_grown_state_dict(model, weights)
    return grown, f'init_from {path}' + (f', grown from init_from: {grown}' if grown else '')


def _names(names, limit: int = 4) -> str:
    """``a, b, c, d and 3 more`` (module-level prefixes merged: ``decoder.*``)."""
    heads = []
    for n in names:
        parts = n.split('.')
        head = '.'.join(parts[:2 if parts[0] == 'encoder' else 1]) + ('.*' if '.' in n else '')
        if head not in heads:
            heads.append(head)
    return ', '.join(heads[:limit]) + (f' and {len(heads) - limit} more' if len(heads) > limit else '')


def grow_weights_file(
        checkpoint: str,
        cfg: dict,
        out: str,
        to: Union[None, str, Dict[str, int]] = None,
        add: Optional[Dict[str, int]] = None,
        key_init: str = 'zeros',
        value_init: str = 'normal',
) -> dict:
    """Grow a weights file on disk: build the model of ``cfg`` (the checkpoint's architecture: ``model``,
    ``model_kwargs``), load ``checkpoint`` (`load_fitting_weights`), grow to ``to`` (variant name
    or counts) or by ``add`` (``{kind: m}``), and write ``out`` as safetensors (atomic).

    Returns:
        ``{kind: (old, new)}``.

    Raises:
        FileExistsError: ``out`` is ``checkpoint``. FileNotFoundError, WeightsMismatchError: as
            [`model_for_checkpoint`][tkvision.engine.checkpoint.model_for_checkpoint]. ValueError: a target smaller
            than the model.
    """
    if os.path.abspath(out) == os.path.abspath(checkpoint):
        raise FileExistsError(f'--out {out} is the input checkpoint; write the grown weights to another file')
    net, _ = model_for_checkpoint(cfg, checkpoint)
    before = token_counts(net)
    # add holds token counts by kind only (mypy cannot tell its keys from grow's other keywords)
    grow(net, to=to, key_init=key_init, value_init=value_init, **(add or {}))  # type: ignore[arg-type]
    after = token_counts(net)
    save_weights(net.state_dict(), out, metadata=dict(grown_from=checkpoint, token_counts=after))
    return {k: (before[k], after[k]) for k in before}
