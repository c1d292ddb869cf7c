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

__all__ = ['DEFAULTS', 'ConfigError', 'load_config', 'parse_overrides', 'merge', 'resolve_lr', 'resolve_accum_steps']


class ConfigError(ValueError):
    """A config file or override that cannot be used (unknown key, bad value, missing base)."""


#: Every config key with its default. Units: epochs are passes over the training set; lr values
#: are per-step learning rates of the global batch; sizes are pixels.
DEFAULTS = {
    # model
    'model': 'tokenformer_vit_ti16',
    'model_kwargs': {},          # passed to timm.create_model (img_size, patch_size, num_tokens, ...)
    'drop_path_rate': 0.0,
    'init_from': None,           # weights file to start from (.safetensors / .pth); grown to fit
    'freeze_old_tokens': False,  # with init_from: train only the appended parameter tokens (+ head)
    'grad_checkpointing': False,
    'compile': False,
    # data
    'dataset': 'fashion_mnist',  # 'fashion_mnist' or 'imagenet' (folder layout train/<class>/*)
    'data_dir': None,
    'download': False,           # fashion_mnist only: torchvision download when the Debian package is absent
    'img_size': 28,
    'mean': [0.2860],
    'std': [0.3530],
    'crop_pct': 0.875,
    'interpolation': 'bicubic',
    'rrc_scale': [0.08, 1.0],    # RandomResizedCrop area range; null: no crop
    'crop_padding': 0,           # random translation: zero-pad each side by this many px, random crop back
                                 # to img_size (torchvision RandomCrop(padding=...)); 0: off
    'hflip': 0.5,
    'auto_augment': None,        # timm RandAugment string, e.g. rand-m9-mstd0.5-inc1
    'reprob': 0.0,               # random erasing probability
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
    'min_lr': 1.0e-6,
    'warmup_epochs': 1.0,
    'warmup_lr': 1.0e-6,
    'weight_decay': 0.05,
    'layer_decay': None,         # layer-wise lr decay (fine-tuning), e.g. 0.65
    'clip_grad': None,
    'smoothing': 0.1,
    'mixup': 0.0,
    'cutmix': 0.0,
    'mixup_prob': 1.0,
    'mixup_switch_prob': 0.5,
    'model_ema': False,
    'model_ema_decay': 0.9999,
    'amp': None,                 # null, 'bf16' or 'fp16'
    # growth during training (tkvision.growth)
    'growth': {
        'every_epochs': None,    # grow at the end of every k-th epoch
        'add_tokens': {},        # per kind: {patch, qkv, proj, ffn}
        'until_epoch': None,     # no growth at or after this epoch
        'key_init': 'zeros',
        'value_init': 'normal',
    },
    # run
    'seed': 0,
    'device': None,              # null: cuda if available else cpu
    'threads': None,             # torch.set_num_threads on CPU
    'output': 'runs/default',
    'eval_every': 1,
    'save_every': 1,
    'tensorboard': False,
    'log_interval': 50,
    'progress': True,
}


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
        ConfigError: unknown key (named), missing file, or ``_base_`` cycle.
    """
    cfg = _read_yaml(path) if path else copy.deepcopy(DEFAULTS)
    if overrides:
        if not isinstance(overrides, dict):
            overrides = parse_overrides(list(overrides))
        cfg = merge(cfg, overrides, 'command line')
    if cfg['amp'] not in (None, 'bf16', 'fp16'):
        raise ConfigError(f"amp must be null, 'bf16' or 'fp16', got {cfg['amp']!r}")
    if cfg['dataset'] not in ('fashion_mnist', 'imagenet'):
        raise ConfigError(f"dataset must be 'fashion_mnist' or 'imagenet', got {cfg['dataset']!r}")
    return cfg


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
