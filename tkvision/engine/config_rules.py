"""The checks that join config keys (`check_joined_keys`): what no single key's rule can say (each key's own rule is
declared with its field, in the section of the component that reads it: `tkvision.utils.config_fields`).
"""
import math

import timm

from ..layers import PATTENTION_KINDS
from ..utils.config_fields import is_number as _is_num
from ..utils.errors import ConfigError
from .optim import SCHEDULE_STEP, OptimConfig, resolve_accum_steps

__all__ = ['check_joined_keys', 'NAFLEX_REFUSES']


def check_joined_keys(
        cfg: dict,
        optim: OptimConfig,
) -> None:
    """The rules that join keys of the flat config ``cfg`` (each key's own rule already checked): token kinds of
    ``growth.add_tokens``, the growth schedule (its step defaults filled in), mean and std of one length, the crop
    range, the decoder's heads, what ``linprobe``, ``freeze_loaded_tokens``, the NaFlex loader and distillation
    need; ``optim`` (the optim section of ``cfg``) for the accumulation steps.

    Raises:
        ConfigError: the first rule broken, naming the keys and what to set.
    """
    for kind, n in cfg['growth']['add_tokens'].items():
        if kind not in PATTENTION_KINDS:
            raise ConfigError(f'growth.add_tokens: unknown token kind {kind!r}; kinds are '
                              f'{", ".join(PATTENTION_KINDS)}')
        if not (_is_num(n) and float(n).is_integer() and n >= 0):
            raise ConfigError(f'growth.add_tokens.{kind} must be an integer >= 0, got {n!r}')
    _validate_growth_schedule(cfg)
    if cfg['mean'] is not None and cfg['std'] is not None and len(cfg['mean']) != len(cfg['std']):
        raise ConfigError(f"mean and std must have one value per channel, got {len(cfg['mean'])} and {len(cfg['std'])}")
    if cfg['rrc_scale'] and cfg['rrc_scale'][0] > cfg['rrc_scale'][1]:
        raise ConfigError(f"rrc_scale must be [min, max] with min <= max, got {cfg['rrc_scale']!r}")
    if cfg['decoder']['embed_dim'] % cfg['decoder']['num_heads']:
        raise ConfigError(f"decoder.embed_dim {cfg['decoder']['embed_dim']} must be divisible by decoder.num_heads "
                          f"{cfg['decoder']['num_heads']}")
    if cfg['task'] == 'linprobe' and not cfg['init_from']:
        raise ConfigError('task linprobe needs init_from (the pretrained encoder to probe)')
    if cfg['freeze_loaded_tokens'] and not cfg['init_from']:
        raise ConfigError('freeze_loaded_tokens needs init_from (the tokens to freeze are the ones loaded from it)')
    _validate_naflex(cfg)
    _validate_distillation(cfg)
    resolve_accum_steps(optim, cfg['batch_size'], 1)


def _validate_distillation(cfg: dict):
    """Distillation's keys against the task: each names what it needs."""
    mode = cfg['distillation']
    if mode != 'none' and cfg['task'] == 'mae':
        raise ConfigError(f"distillation {mode!r} needs class predictions; task mae has none: set distillation: none")
    if (mode == 'teacher') != (cfg['teacher'] is not None):
        raise ConfigError("distillation 'teacher' and the key teacher go together: set teacher to a finished run's "
                          'weights file (e.g. runs/x/last.safetensors) with distillation: teacher, or neither')


#: What the NaFlex loader cannot do (``tkvision.data.naflex``): ``{key: why}`` for keys that must stay off.
NAFLEX_REFUSES = {
    'mixup': 'mixup on patch dictionaries is not wired into our trainer (timm train.py has NaFlexMixup)',
    'cutmix': 'mixup on patch dictionaries is not wired into our trainer (timm train.py has NaFlexMixup)',
    'reprob': "random erasing works on image tensors; timm's NaFlex transforms hand over patches",
    'crop_padding': "timm's NaFlex transforms crop by rrc_scale only",
}


def _validate_naflex(cfg: dict):
    """The NaFlex loader's keys: integral lengths and patch sizes, and no option it would ignore."""
    if not cfg['naflex_loader']:
        return
    for key in ('naflex_train_seq_lens', 'naflex_patch_sizes'):
        if cfg[key] is None:
            continue
        if not all(float(v).is_integer() for v in cfg[key]):
            raise ConfigError(f'{key} must be whole numbers, got {cfg[key]!r}')
        cfg[key] = [int(v) for v in cfg[key]]
    if cfg['task'] != 'classify':
        raise ConfigError(f"naflex_loader trains classifiers; task {cfg['task']!r} reads fixed-size images: set "
                          'naflex_loader: false')
    for key, why in NAFLEX_REFUSES.items():
        if cfg[key]:
            raise ConfigError(f'{key} {cfg[key]!r} with naflex_loader: {why}; set {key}: 0')


def _place_by_fraction(step, epochs: int, where: str):
    """``step`` with ``at_fraction`` (a fraction of the run's ``epochs``) replaced by ``at_epoch``, the nearest
    epoch (halves round up), so that a recipe keeps its stage placement when its budget changes; any other step
    as it is.

    Raises:
        ConfigError: both ``at_epoch`` and ``at_fraction``, a fraction outside (0, 1), or one that lands on epoch
            0 or the last epoch (named with the epoch it gives).
    """
    if not (isinstance(step, dict) and 'at_fraction' in step):
        return step
    fraction = step['at_fraction']
    if 'at_epoch' in step:
        raise ConfigError(f'{where} gives both at_epoch and at_fraction: place the step by one of them')
    if not (_is_num(fraction) and 0 < fraction < 1):
        raise ConfigError(f'{where}.at_fraction must be a number in (0, 1), a fraction of the {epochs} epochs, '
                          f'got {fraction!r}')
    epoch = math.floor(fraction * epochs + 0.5)
    if not 1 <= epoch <= epochs - 1:
        raise ConfigError(f'{where}.at_fraction {fraction} of {epochs} epochs is epoch {epoch}: a growth step '
                          f'needs an epoch before and after it (1 .. {epochs - 1})')
    placed = {k: v for k, v in step.items() if k != 'at_fraction'}
    placed['at_epoch'] = epoch
    return placed


def _validate_growth_options(growth: dict, steps: list):
    """The ``growth`` options that go with a schedule or against one.

    Raises:
        ConfigError: a schedule together with ``growth.every_epochs``, or ``growth.freeze_old_tokens`` /
            ``growth.new_token_lr_scale`` without a schedule.
    """
    if steps and growth['every_epochs']:
        raise ConfigError('growth.schedule and growth.every_epochs both grow the model: use one of them')
    if growth['freeze_old_tokens'] and not steps:
        raise ConfigError('growth.freeze_old_tokens freezes the tokens of earlier stages: it needs growth.schedule '
                          '(to train only new tokens of a grown checkpoint, use freeze_loaded_tokens with init_from)')
    if growth['new_token_lr_scale'] != 1.0 and not steps:
        raise ConfigError(f"growth.new_token_lr_scale {growth['new_token_lr_scale']} scales the lr of the tokens a "
                          'growth.schedule step appends: it needs growth.schedule')


def _validate_growth_schedule(cfg: dict):
    """Check ``growth.schedule``, place each step given by ``at_fraction`` at its epoch and fill each step's
    defaults (`SCHEDULE_STEP`).

    Raises:
        ConfigError: a step that is not a mapping, an unknown or missing key (named), a bad ``at_fraction``
            (`_place_by_fraction`), ``at_epoch`` not increasing within ``1 .. epochs - 1``, a ``warmup_epochs``
            not shorter than its stage, a bad ``to``, or a growth option that contradicts the schedule
            (`_validate_growth_options`).
    """
    g = cfg['growth']
    g['schedule'] = steps = [_place_by_fraction(step, cfg['epochs'], f'growth.schedule[{i}]')
                             for i, step in enumerate(g['schedule'])]
    _validate_growth_options(g, steps)
    prev = 0
    first = steps[0].get('at_epoch') if steps and isinstance(steps[0], dict) else None
    if _is_num(first) and cfg['warmup_epochs'] >= first:
        raise ConfigError(f"warmup_epochs {cfg['warmup_epochs']} must be shorter than the first stage of "
                          f'growth.schedule ({first} epochs)')
    for i, step in enumerate(steps):
        where = f'growth.schedule[{i}]'
        if not isinstance(step, dict):
            raise ConfigError(f'{where} must be a mapping {{at_epoch or at_fraction, to[, warmup_epochs, lr_scale]}}, '
                              f'got {step!r}')
        unknown = sorted(set(step) - set(SCHEDULE_STEP))
        if unknown:
            keys = ', '.join(['at_epoch', 'at_fraction'] + [k for k in SCHEDULE_STEP if k != 'at_epoch'])
            raise ConfigError(f'{where}: unknown key {unknown[0]!r}; keys are {keys}')
        missing = [k for k, v in SCHEDULE_STEP.items() if v is None and k not in step]
        if missing:
            alternative = " (or 'at_fraction', a fraction of the epochs)" if missing[0] == 'at_epoch' else ''
            raise ConfigError(f'{where}: missing {missing[0]!r}{alternative}')
        for k, v in SCHEDULE_STEP.items():
            step.setdefault(k, v)
        at = step['at_epoch']
        if not (_is_num(at) and float(at).is_integer() and prev < at < cfg['epochs']):
            raise ConfigError(f'{where}.at_epoch must be an integer in {prev + 1} .. {cfg["epochs"] - 1} (increasing, '
                              f'before the last epoch), got {at!r}')
        step['at_epoch'] = prev = int(at)
    for i, step in enumerate(steps):
        where, at = f'growth.schedule[{i}]', step['at_epoch']
        end = steps[i + 1]['at_epoch'] if i + 1 < len(steps) else cfg['epochs']
        if not (_is_num(step['warmup_epochs']) and 0 <= step['warmup_epochs'] < end - at):
            raise ConfigError(f"{where}.warmup_epochs must be >= 0 and shorter than its stage, got "
                              f"{step['warmup_epochs']!r}")
        if not (_is_num(step['lr_scale']) and step['lr_scale'] > 0):
            raise ConfigError(f"{where}.lr_scale must be a number > 0, got {step['lr_scale']!r}")
        to = step['to']
        if isinstance(to, dict):
            for kind, n in to.items():
                if kind not in PATTENTION_KINDS + ('mlp_hidden',):
                    raise ConfigError(f'{where}.to: unknown kind {kind!r}; kinds are {", ".join(PATTENTION_KINDS)} '
                                      '(or mlp_hidden for a timm ViT)')
                if not (_is_num(n) and float(n).is_integer() and n >= 1):
                    raise ConfigError(f'{where}.to.{kind} must be an integer >= 1, got {n!r}')
        elif not (isinstance(to, str) and to):
            raise ConfigError(f'{where}.to must be a registered variant name or a mapping {{kind: tokens}}, got {to!r}')
        elif not timm.is_model(to):
            raise ConfigError(f'{where}.to: {to!r} is not a registered model (timm.list_models("tokenformer_*") '
                              'lists them)')
