"""Training configs: YAML files with one inheritance mechanism (``_base_``) and CLI overrides.

A config file is a YAML mapping. Its optional ``_base_`` key names another YAML file (relative to
the file that names it); the file's keys are merged over the base's, recursively for mappings.
Every key must exist in :data:`DEFAULTS`; an unknown key is an error that names it and the file.
Command-line overrides ``--key value`` (``--growth.every_epochs 2`` for nested keys) are parsed
with YAML rules (``1e-3`` is a float, ``[0.9, 0.95]`` a list, ``null`` None).

Recipe values in ``configs/imagenet/`` come from the MAE paper, Appendix A.2 (table in
``shared/reference/README.md``, "Recipes").
"""
import copy
import os
import re

import yaml

__all__ = ['DEFAULTS', 'RULES', 'SCHEDULE_STEP', 'RESUME_MUTABLE', 'SCHEDULERS', 'INTERPOLATIONS', 'ConfigError', 'load_config',
           'validate_config', 'config_changes', 'parse_overrides', 'merge', 'resolve_lr', 'resolve_accum_steps']


class ConfigError(ValueError):
    """A config file or override that cannot be used (unknown key, bad value, missing base)."""


#: Every config key with its default. Units: epochs are passes over the training set; lr values
#: are per-step learning rates of the global batch; sizes are pixels.
DEFAULTS = {
    # task: 'classify' (supervised), 'mae' (masked-autoencoder pretraining, no labels read) or
    # 'linprobe' (frozen encoder from init_from, BatchNorm + linear head: MAE's linear probing)
    'task': 'classify',
    # model
    'model': 'tokenformer_vit_ti16',
    'model_kwargs': {},          # passed to timm.create_model (img_size, patch_size, num_tokens, ...)
    'drop_path_rate': 0.0,
    'init_from': None,           # weights file to start from (.safetensors / .pth); grown to fit
    'freeze_old_tokens': False,  # with init_from: train only the appended parameter tokens (+ head)
    'grad_checkpointing': False,
    'compile': False,
    # MAE pretraining (task: mae; tkvision.models.mae)
    'mask_ratio': 0.75,          # fraction of patches masked per image
    'norm_pix_loss': True,       # regress per-patch normalised pixels
    'decoder': {                 # MAE's decoder: 512 wide, 8 blocks, 16 heads
        'embed_dim': 512,
        'depth': 8,
        'num_heads': 16,
        'num_tokens': None,      # TokenFormer decoder: parameter tokens per Pattention (null: embed_dim)
        'kind': None,            # 'tokenformer' or 'vit' (null: TokenFormer for a TokenFormer encoder)
    },
    'recon_images': 8,           # task mae: validation images in the reconstruction.png written at the end
    # data
    'dataset': 'fashion_mnist',  # 'fashion_mnist', 'folder' (= 'imagenet': train/<class>/*, val/<class>/*),
                                 # 'tar', 'wds/<name>' (WebDataset shards), 'hfds/<name>' (Hugging Face)
    'data_dir': None,
    'download': False,           # fashion_mnist only: torchvision download when the Debian package is absent
    # null: from the model's pretrained_cfg (timm.data.resolve_data_config), or Fashion-MNIST's statistics
    'img_size': None,
    'mean': None,
    'std': None,
    'crop_pct': None,
    'interpolation': None,       # one of INTERPOLATIONS; 'random' draws one per image (timm)
    'rrc_scale': [0.08, 1.0],    # RandomResizedCrop area range; null: no crop
    'crop_padding': 0,           # random translation: zero-pad each side by this many px, random crop back
                                 # to img_size (torchvision RandomCrop(padding=...)); 0: off
    'hflip': 0.5,
    'auto_augment': None,        # timm RandAugment string, e.g. rand-m9-mstd0.5-inc1
    'reprob': 0.0,               # random erasing probability (timm RandomErasing, mode 'pixel', on device)
    'num_workers': 0,
    'train_subset': None,        # use only the first N training images (tests, quick probes)
    'val_subset': None,
    # optimisation
    'epochs': 10,
    'batch_size': 128,           # per process
    'accum_steps': 1,            # gradient accumulation: global batch = batch_size * accum_steps * world
    'global_batch_size': None,   # if set, accum_steps = global_batch_size / (batch_size * world)
    'opt': 'adamw',
    'opt_betas': [0.9, 0.999],
    'opt_eps': 1.0e-8,
    'lr': None,                  # absolute lr; null: blr * global_batch / 256
    'blr': 1.0e-3,
    'sched': 'cosine',           # timm scheduler name (SCHEDULERS), stepped per optimizer update
    'min_lr': 1.0e-6,            # the lr of the last update (cosine, tanh, poly)
    'warmup_epochs': 1.0,        # linear warmup from warmup_lr to lr, then the schedule
    'warmup_lr': 1.0e-6,
    'decay_epochs': 90,          # step: decay interval; wsd / rsqrt: decay length (a fraction if < 1)
    'decay_milestones': [90, 180, 270],  # multistep
    'decay_rate': 0.1,           # step / multistep: factor per decay; poly: the power
    'weight_decay': 0.05,
    'layer_decay': None,         # layer-wise lr decay (fine-tuning), e.g. 0.65
    'clip_grad': None,
    'clip_mode': 'norm',         # timm dispatch_clip_grad: 'norm', 'value' or 'agc'
    'smoothing': 0.1,
    'mixup': 0.0,
    'cutmix': 0.0,
    'mixup_prob': 1.0,
    'mixup_switch_prob': 0.5,
    'model_ema': False,
    'model_ema_decay': 0.9999,
    'amp': None,                 # null, 'bf16' or 'fp16'
    'tf32': True,                # CUDA: TF32 matmuls and convolutions for float32 work
    # growth during training (tkvision.growth)
    'growth': {
        'every_epochs': None,    # grow at the end of every k-th epoch
        'add_tokens': {},        # per kind: {patch, qkv, proj, ffn}
        'until_epoch': None,     # no growth at or after this epoch
        'key_init': 'zeros',
        'value_init': 'normal',
        # a progressive recipe: grow to `to` before epoch `at_epoch` (a registered variant, or
        # {kind: tokens}; {mlp_hidden: N} widens a timm ViT by Net2Net), each stage with its own
        # schedule: re-warm for `warmup_epochs` to lr x `lr_scale`, decay to min_lr at the stage's
        # end (tkvision.optim). [{at_epoch: 100, to: tokenformer_vit_b16, warmup_epochs: 5}, ...]
        'schedule': [],
        'stage_lr': 'restart',       # 'restart': every stage its own warmup + decay to min_lr (tkvision.optim);
                                     # 'continue': one schedule over the run, re-warmed briefly after each step
        'optimizer_state': 'keep',   # at a schedule step: 'keep' the old rows' moments or 'reset' the optimizer
        'freeze_old_tokens': False,  # after a schedule step: train only the new tokens (+ head), paper §5
    },
    # run
    'seed': 0,
    'device': None,              # null: cuda if available else cpu
    'threads': None,             # torch.set_num_threads on CPU
    'output': 'runs/default',
    'eval_every': 1,             # epochs
    'save_every': 1,             # epochs
    'checkpoint_every_steps': None,    # also write last.pth every N optimizer updates (mid-epoch)
    'checkpoint_every_minutes': None,  # also write last.pth when this much time passed since the last one
    'tensorboard': False,
    'log_interval': 50,          # optimizer updates between progress updates, loss checks and signal checks
    'progress': True,
}


#: Interpolation names accepted by ``interpolation`` (timm's names; 'random' picks one per image).
INTERPOLATIONS = ('bicubic', 'bilinear', 'nearest', 'area', 'lanczos', 'random')
#: timm schedulers usable per optimizer update (``timm.scheduler.create_scheduler_v2``; 'plateau'
#: steps per epoch on a metric and is not offered).
SCHEDULERS = ('cosine', 'tanh', 'poly', 'step', 'multistep', 'wsd', 'rsqrt', 'constant')
#: Keys a resumed run may change (the schedule is rebuilt at the current update); every other key
#: must equal the checkpoint's, since it fixes the model, the data or the order of the samples.
RESUME_MUTABLE = frozenset({
    'epochs', 'lr', 'blr', 'min_lr', 'sched', 'warmup_epochs', 'warmup_lr', 'decay_epochs', 'decay_milestones',
    'decay_rate', 'clip_grad', 'clip_mode', 'eval_every', 'save_every', 'checkpoint_every_steps',
    'checkpoint_every_minutes', 'log_interval', 'progress', 'tensorboard', 'num_workers', 'threads', 'device',
    'data_dir', 'download', 'val_subset', 'output', 'compile', 'grad_checkpointing', 'tf32', 'init_from',
    'recon_images'})


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


#: What each key allows (``growth.*`` for the growth section). Checked by :func:`validate_config`.
RULES = {
    'task': _rule(None, choices=('classify', 'mae', 'linprobe')),
    'mask_ratio': _rule('num', 0, 1, hi_open=True), 'norm_pix_loss': _rule('bool'),
    'decoder.embed_dim': _rule('int', 1), 'decoder.depth': _rule('int', 1), 'decoder.num_heads': _rule('int', 1),
    'decoder.num_tokens': _rule('int', 1, null=True), 'decoder.kind': _rule(None, choices=(None, 'tokenformer', 'vit')),
    'recon_images': _rule('int', 0),
    'model': _rule('str'), 'model_kwargs': _rule('map'), 'drop_path_rate': _rule('num', 0, 1, hi_open=True),
    'init_from': _rule('str', null=True), 'freeze_old_tokens': _rule('bool'), 'grad_checkpointing': _rule('bool'),
    'compile': _rule('bool'),
    'dataset': (lambda v: isinstance(v, str) and (v in ('fashion_mnist', 'imagenet', 'folder', 'tar') or (
        v.split('/')[0] in ('wds', 'hfds') and len(v.split('/', 1)[-1]) > 0 and '/' in v)),
        "'fashion_mnist', 'folder' (or 'imagenet'), 'tar', 'wds/<name>' or 'hfds/<name>'"),
    'data_dir': _rule('str', null=True), 'download': _rule('bool'), 'img_size': _rule('int', 1, null=True),
    'mean': _rule('nums', null=True), 'std': _rule('nums', 0, lo_open=True, null=True),
    'crop_pct': _rule('num', 0, 1, lo_open=True, null=True), 'interpolation': _rule(None, choices=INTERPOLATIONS + (None,)),
    'rrc_scale': _rule('nums', 0, 1, lo_open=True, length=2, null=True), 'crop_padding': _rule('int', 0),
    'hflip': _rule('num', 0, 1), 'auto_augment': _rule('str', null=True), 'reprob': _rule('num', 0, 1),
    'num_workers': _rule('int', 0), 'train_subset': _rule('int', 1, null=True), 'val_subset': _rule('int', 1, null=True),
    'epochs': _rule('int', 1), 'batch_size': _rule('int', 1), 'accum_steps': _rule('int', 1),
    'global_batch_size': _rule('int', 1, null=True), 'opt': _rule('str'), 'opt_betas': _rule('nums', 0, 1, hi_open=True),
    'opt_eps': _rule('num', 0, lo_open=True), 'lr': _rule('num', 0, lo_open=True, null=True),
    'blr': _rule('num', 0, lo_open=True), 'sched': _rule(None, choices=SCHEDULERS), 'min_lr': _rule('num', 0),
    'warmup_epochs': _rule('num', 0), 'warmup_lr': _rule('num', 0), 'decay_epochs': _rule('num', 0, lo_open=True),
    'decay_milestones': _rule('nums', 0), 'decay_rate': _rule('num', 0, lo_open=True),
    'weight_decay': _rule('num', 0), 'layer_decay': _rule('num', 0, 1, lo_open=True, null=True),
    'clip_grad': _rule('num', 0, lo_open=True, null=True), 'clip_mode': _rule(None, choices=('norm', 'value', 'agc')),
    'smoothing': _rule('num', 0, 1, hi_open=True), 'mixup': _rule('num', 0), 'cutmix': _rule('num', 0),
    'mixup_prob': _rule('num', 0, 1), 'mixup_switch_prob': _rule('num', 0, 1), 'model_ema': _rule('bool'),
    'model_ema_decay': _rule('num', 0, 1, hi_open=True), 'amp': _rule(None, choices=(None, 'bf16', 'fp16')),
    'tf32': _rule('bool'),
    'growth.every_epochs': _rule('int', 1, null=True), 'growth.add_tokens': _rule('map'),
    'growth.until_epoch': _rule('int', 1, null=True), 'growth.key_init': _rule(None, choices=('zeros', 'normal')),
    'growth.value_init': _rule(None, choices=('zeros', 'normal')),
    'growth.schedule': (lambda v: isinstance(v, list), 'a list of steps {at_epoch, to[, warmup_epochs, lr_scale]}'),
    'growth.optimizer_state': _rule(None, choices=('keep', 'reset')),
    'growth.stage_lr': _rule(None, choices=('restart', 'continue')), 'growth.freeze_old_tokens': _rule('bool'),
    'seed': _rule('int', 0), 'device': _rule('str', null=True), 'threads': _rule('int', 1, null=True),
    'output': _rule('str'), 'eval_every': _rule('int', 1), 'save_every': _rule('int', 1),
    'checkpoint_every_steps': _rule('int', 1, null=True),
    'checkpoint_every_minutes': _rule('num', 0, lo_open=True, null=True), 'tensorboard': _rule('bool'),
    'log_interval': _rule('int', 1), 'progress': _rule('bool'),
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
    from .growth import ALL_KINDS
    for kind, n in cfg['growth']['add_tokens'].items():
        if kind not in ALL_KINDS:
            raise ConfigError(f'growth.add_tokens: unknown token kind {kind!r}; kinds are {", ".join(ALL_KINDS)}')
        if not (_is_num(n) and float(n).is_integer() and n >= 0):
            raise ConfigError(f'growth.add_tokens.{kind} must be an integer >= 0, got {n!r}')
    _validate_growth_schedule(cfg)
    if cfg['mean'] is not None and cfg['std'] is not None and len(cfg['mean']) != len(cfg['std']):
        raise ConfigError(f"mean and std must have one value per channel, got {len(cfg['mean'])} and {len(cfg['std'])}")
    if cfg['warmup_epochs'] >= cfg['epochs']:
        raise ConfigError(f"warmup_epochs must be < epochs ({cfg['epochs']}), got {cfg['warmup_epochs']!r}")
    if cfg['rrc_scale'] and cfg['rrc_scale'][0] > cfg['rrc_scale'][1]:
        raise ConfigError(f"rrc_scale must be [min, max] with min <= max, got {cfg['rrc_scale']!r}")
    if cfg['decoder']['embed_dim'] % cfg['decoder']['num_heads']:
        raise ConfigError(f"decoder.embed_dim {cfg['decoder']['embed_dim']} must be divisible by decoder.num_heads "
                          f"{cfg['decoder']['num_heads']}")
    if cfg['task'] == 'linprobe' and not cfg['init_from']:
        raise ConfigError('task linprobe needs init_from (the pretrained encoder to probe)')
    if cfg['freeze_old_tokens'] and not cfg['init_from']:
        raise ConfigError('freeze_old_tokens needs init_from (the tokens to freeze are the ones loaded from it)')
    resolve_accum_steps(cfg, 1)
    return cfg


#: Keys of one ``growth.schedule`` step and their defaults (None: required).
SCHEDULE_STEP = {'at_epoch': None, 'to': None, 'warmup_epochs': 0.0, 'lr_scale': 1.0}


def _validate_growth_schedule(cfg: dict):
    """Check ``growth.schedule`` and fill each step's defaults (:data:`SCHEDULE_STEP`).

    Raises:
        ConfigError: a step that is not a mapping, an unknown or missing key (named), ``at_epoch``
            not increasing within ``1 .. epochs - 1``, a ``warmup_epochs`` not shorter than its stage,
            a bad ``to``, or a schedule together with ``growth.every_epochs``.
    """
    from .growth import ALL_KINDS
    g = cfg['growth']
    steps, prev = g['schedule'], 0
    if steps and g['every_epochs']:
        raise ConfigError('growth.schedule and growth.every_epochs both grow the model: use one of them')
    if g['freeze_old_tokens'] and not steps:
        raise ConfigError('growth.freeze_old_tokens freezes the tokens of earlier stages: it needs growth.schedule '
                          '(to train only new tokens of a grown checkpoint, use freeze_old_tokens with init_from)')
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
            raise ConfigError(f"{where}.warmup_epochs must be >= 0 and shorter than its stage, got {step['warmup_epochs']!r}")
        if not (_is_num(step['lr_scale']) and step['lr_scale'] > 0):
            raise ConfigError(f"{where}.lr_scale must be a number > 0, got {step['lr_scale']!r}")
        to = step['to']
        if isinstance(to, dict):
            for kind, n in to.items():
                if kind not in ALL_KINDS + ('mlp_hidden',):
                    raise ConfigError(f'{where}.to: unknown kind {kind!r}; kinds are {", ".join(ALL_KINDS)} '
                                      '(or mlp_hidden for a timm ViT)')
                if not (_is_num(n) and float(n).is_integer() and n >= 1):
                    raise ConfigError(f'{where}.to.{kind} must be an integer >= 1, got {n!r}')
        elif not (isinstance(to, str) and to):
            raise ConfigError(f'{where}.to must be a registered variant name or a mapping {{kind: tokens}}, got {to!r}')
        else:
            import timm
            if not timm.is_model(to):
                raise ConfigError(f'{where}.to: {to!r} is not a registered model (timm.list_models("tokenformer_*") '
                                  'lists them)')


_SCI = re.compile(r'[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+')


def _coerce(value):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; treat such scientific literals as floats."""
    return float(value) if isinstance(value, str) and _SCI.fullmatch(value) else value


def merge(base: dict, over: dict, where: str = 'config', schema: dict = DEFAULTS) -> dict:
    """Recursively merge ``over`` into a copy of ``base``, checking keys against ``schema``.

    Mappings merge key by key (so a child config or ``--model_kwargs {score_norm: softmax}`` changes
    one model kwarg and keeps the others); ``model_kwargs`` and ``growth.add_tokens`` are free
    mappings whose keys are checked by the functions they are passed to.

    Raises:
        ConfigError: a key of ``over`` not in ``schema``, naming it and ``where``.
    """
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key not in schema:
            raise ConfigError(f'unknown config key {key!r} in {where}; known keys: {", ".join(sorted(schema))}')
        if isinstance(schema[key], dict) and isinstance(value, dict):
            # a free mapping (empty in the schema) merges key by key without checks
            sub_schema = schema[key] or {**(out.get(key) or {}), **value}
            out[key] = merge(out.get(key) or {}, value, f'{where}:{key}', sub_schema)
        else:
            out[key] = copy.deepcopy(_coerce(value))
    return out


def _read_yaml(path: str, seen=()) -> dict:
    if path in seen:
        raise ConfigError(f'_base_ cycle: {" -> ".join(seen + (path,))}')
    if not os.path.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: a config must be a YAML mapping')
    base = data.pop('_base_', None)
    if base is None:
        return merge(DEFAULTS, data, path)
    base_cfg = _read_yaml(os.path.normpath(os.path.join(os.path.dirname(path), base)), seen + (path,))
    return merge(base_cfg, data, path)


def parse_overrides(args) -> dict:
    """``['--lr', '1e-3', '--growth.every_epochs', '2']`` → ``{'lr': 1e-3, 'growth': {'every_epochs': 2}}``.

    Also accepts ``--key=value``. Values are parsed as YAML.

    Raises:
        ConfigError: an argument that is not ``--key`` or a key without a value.
    """
    out, i = {}, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith('--'):
            raise ConfigError(f'expected --key value, got {arg!r}')
        if '=' in arg:
            key, raw = arg[2:].split('=', 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f'override {arg} has no value')
            key, raw = arg[2:], args[i + 1]
            i += 2
        key = key.replace('-', '_')
        node = out
        *parents, leaf = key.split('.')
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _coerce(yaml.safe_load(raw))
    return out


def load_config(path=None, overrides=None) -> dict:
    """Config from ``path`` (or the defaults) with ``overrides`` (a dict or ``--key value`` list).

    Raises:
        ConfigError: unknown key (named), missing file, ``_base_`` cycle, or a value of the wrong type
            or range (:func:`validate_config`).
    """
    cfg = _read_yaml(path) if path else copy.deepcopy(DEFAULTS)
    if overrides:
        if not isinstance(overrides, dict):
            overrides = parse_overrides(list(overrides))
        cfg = merge(cfg, overrides, 'command line')
    return validate_config(cfg)


def resolve_accum_steps(cfg: dict, world_size: int = 1) -> int:
    """Gradient-accumulation steps: ``global_batch_size / (batch_size * world_size)`` when
    ``global_batch_size`` is set, else ``accum_steps``.

    Raises:
        ConfigError: ``global_batch_size`` not a multiple of ``batch_size * world_size``.
    """
    if not cfg['global_batch_size']:
        return int(cfg['accum_steps'])
    per_step = cfg['batch_size'] * world_size
    if cfg['global_batch_size'] % per_step:
        raise ConfigError(f"global_batch_size {cfg['global_batch_size']} is not a multiple of batch_size x processes "
                          f"= {cfg['batch_size']} x {world_size}")
    return cfg['global_batch_size'] // per_step


def resolve_lr(cfg: dict, world_size: int = 1) -> float:
    """Peak lr: ``cfg['lr']`` if set, else ``blr * global_batch / 256`` (MAE's linear scaling rule)."""
    if cfg['lr'] is not None:
        return float(cfg['lr'])
    return cfg['blr'] * cfg['batch_size'] * resolve_accum_steps(cfg, world_size) * world_size / 256


def config_changes(old: dict, new: dict):
    """What differs between a checkpoint's config ``old`` and the config ``new`` of a resumed run.

    Returns:
        ``(allowed, forbidden)``: two lists of ``'key old -> new'`` strings; ``allowed`` holds the
        keys of :data:`RESUME_MUTABLE`, ``forbidden`` every other changed key (``model_kwargs`` and
        ``growth`` are compared as a whole under their top-level name).
    """
    allowed, forbidden = [], []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            (allowed if key in RESUME_MUTABLE else forbidden).append(f'{key} {a!r} -> {b!r}')
    return allowed, forbidden
