"""The checks that join config keys (`check_joined_keys`): what no single key's rule can say (each key's own rule is
declared with its field, in the section of the component that reads it: `tkvision.utils.config_fields`).
"""
from typing import Any, Mapping

from ..utils.errors import ConfigError
from .optim import OptimConfig, check_growth, resolve_accum_steps
from .tasks import task_named

__all__ = ['check_joined_keys', 'NAFLEX_REFUSES']


def check_joined_keys(
        cfg: Mapping[str, Any],
        optim: OptimConfig,
) -> dict:
    """The rules that join keys of the flat config ``cfg`` (each key's own rule already checked): the growth
    section's (``tkvision.engine.optim.check_growth``: its schedule placed and filled), mean and std of one length,
    the crop range, the decoder's heads, what the task needs (``tkvision.engine.tasks.Task.check``), what
    ``freeze_loaded_tokens``, the NaFlex loader and distillation need; ``optim`` (the optim section of ``cfg``) for
    the accumulation steps.

    Returns:
        a normalised copy of ``cfg`` (``cfg`` is left as it was): the growth section checked and filled, the NaFlex
        lengths as integers.

    Raises:
        ConfigError: the first rule broken, naming the keys and what to set.
    """
    cfg = dict(cfg, growth=check_growth(cfg['growth'], cfg['epochs'], cfg['warmup_epochs']))
    if cfg['mean'] is not None and cfg['std'] is not None and len(cfg['mean']) != len(cfg['std']):
        raise ConfigError(f"mean and std must have one value per channel, got {len(cfg['mean'])} and {len(cfg['std'])}")
    if cfg['rrc_scale'] and cfg['rrc_scale'][0] > cfg['rrc_scale'][1]:
        raise ConfigError(f"rrc_scale must be [min, max] with min <= max, got {cfg['rrc_scale']!r}")
    if cfg['decoder']['embed_dim'] % cfg['decoder']['num_heads']:
        raise ConfigError(f"decoder.embed_dim {cfg['decoder']['embed_dim']} must be divisible by decoder.num_heads "
                          f"{cfg['decoder']['num_heads']}")
    task_named(cfg['task']).check(cfg)
    if cfg['freeze_loaded_tokens'] and not cfg['init_from']:
        raise ConfigError('freeze_loaded_tokens needs init_from (the tokens to freeze are the ones loaded from it)')
    cfg = _validate_naflex(cfg)
    _validate_distillation(cfg)
    resolve_accum_steps(optim, cfg['batch_size'], 1)
    return cfg


def _validate_distillation(cfg: dict):
    """Distillation's keys: the teacher and its mode go together."""
    mode = cfg['distillation']
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


def _validate_naflex(cfg: dict) -> dict:
    """The NaFlex loader's keys: integral lengths and patch sizes (``cfg`` with them as integers), and no option it
    would ignore."""
    if not cfg['naflex_loader']:
        return cfg
    cfg = dict(cfg)
    for key in ('naflex_train_seq_lens', 'naflex_patch_sizes'):
        if cfg[key] is None:
            continue
        if not all(float(v).is_integer() for v in cfg[key]):
            raise ConfigError(f'{key} must be whole numbers, got {cfg[key]!r}')
        cfg[key] = [int(v) for v in cfg[key]]
    for key, why in NAFLEX_REFUSES.items():
        if cfg[key]:
            raise ConfigError(f'{key} {cfg[key]!r} with naflex_loader: {why}; set {key}: 0')
    return cfg
