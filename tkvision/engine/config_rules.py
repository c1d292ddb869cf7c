"""What each config key allows (`RULES`) and the checks that join keys (`validate_config`).

``tests/test_config.py`` holds `RULES` and `tkvision.engine.config.DEFAULTS` to the same
keys, so a new key gets a rule and a default or the test fails.
"""
import math

import timm

from ..layers import BACKWARD_MODES, PATTENTION_KINDS
from ..utils.errors import ConfigError
from ..config_sections import OptimConfig, section

__all__ = ['RULES', 'SCHEDULE_STEP', 'INTERPOLATIONS', 'SCHEDULERS', 'validate_config', 'resolve_accum_steps']

#: Interpolation names accepted by ``interpolation`` (timm's names; 'random' picks one per image).
INTERPOLATIONS = ('bicubic', 'bilinear', 'nearest', 'area', 'lanczos', 'random')
#: timm schedulers usable per optimizer update (``timm.scheduler.create_scheduler_v2``; 'plateau'
#: steps per epoch on a metric and is not offered).
SCHEDULERS = ('cosine', 'tanh', 'poly', 'step', 'multistep', 'wsd', 'rsqrt', 'constant')


def _is_num(v):
    """A finite number (a bool is not one; ``.inf`` and ``.nan`` would only fail later, as NaN losses)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _rule(kind, lo=None, hi=None, lo_open=False, hi_open=False, null=False, choices=None, length=None):
    """A value check and the words that say what it allows (used in the error message)."""
    if choices is not None:
        return (lambda v: v in choices), 'one of ' + ', '.join('null' if c is None else repr(c) for c in choices)

    def bounds_ok(x):
        return ((lo is None or (x > lo if lo_open else x >= lo)) and (hi is None or (x < hi if hi_open else x <= hi)))

    words = {'int': 'an integer', 'num': 'a number', 'bool': 'true or false', 'str': 'a string', 'map': 'a mapping',
             'nums': f'a list of {length or "one or more"} numbers'}[kind]
    if lo is not None:
        words += f" {'>' if lo_open else '>='} {lo}"
    if hi is not None:
        words += f"{' and' if lo is not None else ''} {'<' if hi_open else '<='} {hi}"

    def check(v):
        if v is None:
            return null
        if kind == 'int':
            return _is_num(v) and float(v).is_integer() and bounds_ok(v)
        if kind == 'num':
            return _is_num(v) and bounds_ok(v)
        if kind == 'bool':
            return isinstance(v, bool)
        if kind == 'str':
            return isinstance(v, str) and v != ''
        if kind == 'map':
            return isinstance(v, dict)
        return (isinstance(v, (list, tuple)) and len(v) > 0 and (length is None or len(v) == length)
                and all(_is_num(x) and bounds_ok(x) for x in v))
    return check, words + (' or null' if null else '')


def _is_dataset(v) -> bool:
    """A dataset name: one of the built-in kinds, or ``wds/<name>`` / ``hfds/<name>`` with a name."""
    if not isinstance(v, str):
        return False
    kind, _, name = v.partition('/')
    return v in ('fashion_mnist', 'imagenet', 'folder', 'tar') or (kind in ('wds', 'hfds') and name != '')


#: What each key allows (``growth.*`` for the growth section). Checked by `validate_config`.
RULES = {
    'task': _rule(None, choices=('classify', 'mae', 'linprobe')),
    'mask_ratio': _rule('num', 0, 1, lo_open=True, hi_open=True),
    'norm_pix_loss': _rule('bool'),
    'decoder.embed_dim': _rule('int', 1),
    'decoder.depth': _rule('int', 1),
    'decoder.num_heads': _rule('int', 1),
    'decoder.num_tokens': _rule('int', 1, null=True),
    'decoder.kind': _rule(None, choices=(None, 'tokenformer', 'vit')),
    'recon_images': _rule('int', 0),
    'model': _rule('str'),
    'model_kwargs': _rule('map'),
    'drop_path_rate': _rule('num', 0, 1, hi_open=True),
    'init_from': _rule('str', null=True),
    'freeze_loaded_tokens': _rule('bool'),
    'grad_checkpointing': _rule('bool'),
    'compile': _rule(None, choices=(True, False, 'auto')),
    'backward_mode': _rule(None, choices=BACKWARD_MODES),
    'dataset': (_is_dataset, "'fashion_mnist', 'folder' (or 'imagenet'), 'tar', 'wds/<name>' or 'hfds/<name>'"),
    'data_dir': _rule('str', null=True),
    'download': _rule('bool'),
    'img_size': _rule('int', 1, null=True),
    'mean': _rule('nums', null=True),
    'std': _rule('nums', 0, lo_open=True, null=True),
    'crop_pct': _rule('num', 0, 1, lo_open=True, null=True),
    'interpolation': _rule(None, choices=INTERPOLATIONS + (None,)),
    'rrc_scale': _rule('nums', 0, 1, lo_open=True, length=2, null=True),
    'crop_padding': _rule('int', 0),
    'hflip': _rule('num', 0, 1),
    'auto_augment': _rule('str', null=True),
    'reprob': _rule('num', 0, 1),
    'num_workers': _rule('int', 0),
    'train_subset': _rule('int', 1, null=True),
    'val_subset': _rule('int', 1, null=True),
    'val_split_fraction': _rule('num', 0, 1, hi_open=True, null=True),
    'naflex_loader': _rule('bool'),
    'naflex_train_seq_lens': _rule('nums', 1),
    'naflex_max_seq_len': _rule('int', 1),
    'naflex_patch_sizes': _rule('nums', 1, null=True),
    'naflex_loss_scale': _rule(None, choices=('linear', 'sqrt', 'none')),
    'epochs': _rule('int', 1),
    'batch_size': _rule('int', 1),
    'accum_steps': _rule('int', 1),
    'global_batch_size': _rule('int', 1, null=True),
    'opt': _rule('str'),
    'opt_betas': _rule('nums', 0, 1, hi_open=True),
    'opt_eps': _rule('num', 0, lo_open=True),
    'lr': _rule('num', 0, lo_open=True, null=True),
    'blr': _rule('num', 0, lo_open=True),
    'sched': _rule(None, choices=SCHEDULERS),
    'min_lr': _rule('num', 0),
    'warmup_epochs': _rule('num', 0),
    'warmup_lr': _rule('num', 0),
    'decay_epochs': _rule('num', 0, lo_open=True),
    'decay_milestones': _rule('nums', 0),
    'decay_rate': _rule('num', 0, lo_open=True),
    'weight_decay': _rule('num', 0),
    'layer_decay': _rule('num', 0, 1, lo_open=True, null=True),
    'parameter_token_weight_decay': _rule('num', 0, null=True),
    'parameter_token_lr_scale': _rule('num', 0, lo_open=True),
    'clip_grad': _rule('num', 0, lo_open=True, null=True),
    'clip_mode': _rule(None, choices=('norm', 'value', 'agc')),
    'smoothing': _rule('num', 0, 1, hi_open=True),
    'mixup': _rule('num', 0),
    'cutmix': _rule('num', 0),
    'mixup_prob': _rule('num', 0, 1),
    'mixup_switch_prob': _rule('num', 0, 1),
    'model_ema': _rule('bool'),
    'model_ema_decay': _rule('num', 0, 1, hi_open=True),
    'amp': _rule(None, choices=(None, 'bf16', 'fp16')),
    'tf32': _rule('bool'),
    'elastic_fractions': (lambda v: isinstance(v, list) and all(_is_num(f) and 0 < f <= 1 for f in v),
                          'a list of fractions in (0, 1] (empty: off)'),
    'elastic_sampling': _rule(None, choices=('all', 'random', 'largest_plus_random', 'sandwich')),
    'elastic_tau': _rule(None, choices=('kept', 'follow')),
    'elastic_nesting': _rule(None, choices=('all', 'ffn', 'no_attention')),
    'elastic_start': _rule('num', 0, 1, hi_open=True),
    'distillation': _rule(None, choices=('none', 'inplace', 'teacher')),
    'distillation_temperature': _rule('num', 0, lo_open=True),
    'distillation_task_weight': _rule('num', 0, 1),
    'teacher': _rule('str', null=True),
    'growth.every_epochs': _rule('int', 1, null=True),
    'growth.add_tokens': _rule('map'),
    'growth.until_epoch': _rule('int', 1, null=True),
    'growth.key_init': _rule(None, choices=('zeros', 'normal')),
    'growth.tau': _rule(None, choices=('keep', 'recompute')),
    'growth.eval_after_step': _rule('bool'),
    'growth.value_init': _rule(None, choices=('zeros', 'normal')),
    'growth.schedule': (lambda v: isinstance(v, list), 'a list of steps {at_epoch, to[, warmup_epochs, lr_scale]}'),
    'growth.optimizer_state': _rule(None, choices=('keep', 'reset')),
    'growth.stage_lr': _rule(None, choices=('restart', 'continue')),
    'growth.freeze_old_tokens': _rule('bool'),
    'seed': _rule('int', 0),
    'device': _rule('str', null=True),
    'threads': _rule('int', 1, null=True),
    'output': _rule('str'),
    'eval_every': _rule('int', 1),
    'save_every': _rule('int', 1),
    'checkpoint_every_steps': _rule('int', 1, null=True),
    'checkpoint_every_minutes': _rule('num', 0, lo_open=True, null=True),
    'tensorboard': _rule('bool'),
    'log_interval': _rule('int', 1),
    'dist_timeout_minutes': _rule('num', 0.1, 10080),  # 6 seconds to a week: gloo and NCCL take milliseconds
    'progress': _rule('bool'),
}


def validate_config(cfg: dict) -> dict:
    """Check the type and range of every key of ``cfg`` (and the few rules that join two keys).

    Integral floats (``300.0``) become ints. Returns ``cfg``.

    Raises:
        ConfigError: the first bad value, naming the key, the value and what is allowed.
    """
    for key, (check, allowed) in RULES.items():
        parent, _, leaf = key.rpartition('.')
        node = cfg[parent] if parent else cfg
        value = node[leaf]
        if not check(value):
            raise ConfigError(f'{key} must be {allowed}, got {value!r}')
        if allowed.startswith('an integer') and value is not None:
            node[leaf] = int(value)
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
    resolve_accum_steps(section(cfg, 'optim'), cfg['batch_size'], 1)
    return cfg


def _validate_distillation(cfg: dict):
    """Distillation's keys against the task and the elastic keys: each names what it needs."""
    mode = cfg['distillation']
    if mode != 'none' and cfg['task'] == 'mae':
        raise ConfigError(f"distillation {mode!r} needs class predictions; task mae has none: set distillation: none")
    if mode == 'inplace' and len(set(cfg['elastic_fractions']) - {1, 1.0}) == 0:
        raise ConfigError("distillation 'inplace' teaches an elastic run's smaller prefixes from its whole model; "
                          'set elastic_fractions (e.g. [0.25, 0.5, 0.75, 1.0]) or distillation: none')
    if mode == 'inplace' and (1 not in cfg['elastic_fractions'] or cfg['elastic_sampling'] == 'random'):
        raise ConfigError("distillation 'inplace' needs the whole model, its teacher, in every step: 1.0 in "
                          "elastic_fractions and elastic_sampling other than 'random'")
    if (mode == 'teacher') != (cfg['teacher'] is not None):
        raise ConfigError("distillation 'teacher' and the key teacher go together: set teacher to a finished run's "
                          'weights file (e.g. runs/x/last.safetensors) with distillation: teacher, or neither')
    if cfg['elastic_start'] and not cfg['elastic_fractions']:
        raise ConfigError('elastic_start delays the smaller prefixes of an elastic run; set elastic_fractions, or '
                          'elastic_start: 0')


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


#: Keys of one ``growth.schedule`` step and their defaults (None: required).
SCHEDULE_STEP = {'at_epoch': None, 'to': None, 'warmup_epochs': 0.0, 'lr_scale': 1.0}


def _validate_growth_schedule(cfg: dict):
    """Check ``growth.schedule`` and fill each step's defaults (`SCHEDULE_STEP`).

    Raises:
        ConfigError: a step that is not a mapping, an unknown or missing key (named), ``at_epoch``
            not increasing within ``1 .. epochs - 1``, a ``warmup_epochs`` not shorter than its stage,
            a bad ``to``, or a schedule together with ``growth.every_epochs``.
    """
    g = cfg['growth']
    steps, prev = g['schedule'], 0
    if steps and g['every_epochs']:
        raise ConfigError('growth.schedule and growth.every_epochs both grow the model: use one of them')
    if g['freeze_old_tokens'] and not steps:
        raise ConfigError('growth.freeze_old_tokens freezes the tokens of earlier stages: it needs growth.schedule '
                          '(to train only new tokens of a grown checkpoint, use freeze_loaded_tokens with init_from)')
    first = steps[0].get('at_epoch') if steps and isinstance(steps[0], dict) else None
    if _is_num(first) and cfg['warmup_epochs'] >= first:
        raise ConfigError(f"warmup_epochs {cfg['warmup_epochs']} must be shorter than the first stage of "
                          f'growth.schedule ({first} epochs)')
    for i, step in enumerate(steps):
        where = f'growth.schedule[{i}]'
        if not isinstance(step, dict):
            raise ConfigError(f'{where} must be a mapping {{at_epoch, to[, warmup_epochs, lr_scale]}}, got {step!r}')
        unknown = sorted(set(step) - set(SCHEDULE_STEP))
        if unknown:
            raise ConfigError(f'{where}: unknown key {unknown[0]!r}; keys are {", ".join(SCHEDULE_STEP)}')
        missing = [k for k, v in SCHEDULE_STEP.items() if v is None and k not in step]
        if missing:
            raise ConfigError(f'{where}: missing {missing[0]!r}')
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


def resolve_accum_steps(
        optim: OptimConfig,
        batch_size: int,
        world_size: int = 1,
) -> int:
    """Gradient-accumulation steps of the optim section ``optim``: ``global_batch_size / (batch_size *
    world_size)`` when ``global_batch_size`` is set, else ``accum_steps``.

    Raises:
        ConfigError: ``global_batch_size`` not a multiple of ``batch_size * world_size``.
    """
    if not optim.global_batch_size:
        return int(optim.accum_steps)
    per_step = batch_size * world_size
    if optim.global_batch_size % per_step:
        raise ConfigError(f'global_batch_size {optim.global_batch_size} is not a multiple of batch_size x processes '
                          f'= {batch_size} x {world_size}')
    return optim.global_batch_size // per_step
