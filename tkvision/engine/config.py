"""Training configs: YAML files with one inheritance mechanism (``_base_``), CLI overrides, and the
sections each builder receives.

A config file is a YAML mapping of flat keys (``lr: 1e-3``, ``model_kwargs: {...}``). Its optional
``_base_`` key names another YAML file (relative to the file that names it); the file's keys are
merged over the base's, recursively for mappings. Every key must exist in `DEFAULTS`; an
unknown key is an error that names it and the file. Command-line overrides ``--key value``
(``--growth.every_epochs 2`` for nested keys) are parsed with YAML rules (``1e-3`` is a float,
``[0.9, 0.95]`` a list, ``null`` None). Keys renamed since an earlier release (`RENAMED`) are
read under their new name, in files, on the command line and in checkpoints.

**Sections.** The keys are grouped as a reader meets them (`SECTIONS`: ``run``, ``model``,
``mae``, ``data``, ``optim``, ``elastic``, ``distillation``, ``growth``). A validated config becomes typed,
frozen sections once, at the edge of training (`TrainConfig`, `section`: `tkvision.config_sections`,
where each key's type, default and meaning are); each builder receives only its section: ``build_dataset``
a ``DataConfig``, ``build_optimizer`` an ``OptimConfig``, and so on. Files stay flat, so every config of
earlier releases reads unchanged.

What each key allows is in `tkvision.engine.config_rules` (``tests/test_config.py`` holds the
rules and the defaults to the same keys). Recipe values in ``configs/imagenet/`` come from the MAE
paper, Appendix A.2 (table in ``docs/reference/background.md``, "Recipes").
"""
import copy
import dataclasses
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import yaml

from ..data import resolve_data_cfg
from ..utils.errors import ConfigError
from .config_rules import INTERPOLATIONS, SCHEDULERS, resolve_accum_steps, validate_config
from ..config_sections import SECTION_CLASSES, OptimConfig, TrainConfig, section, section_defaults
from .recipes import config_path

__all__ = ['TrainConfig', 'SECTIONS', 'DEFAULTS', 'RENAMED', 'SCHEDULERS', 'INTERPOLATIONS', 'RESUME_MUTABLE',
           'section', 'load_config', 'resolve_run_config', 'parse_overrides', 'merge', 'migrate', 'config_changes',
           'resolve_lr', 'resolve_accum_steps', 'ConfigError']

#: Every config key with its default, by section: ``{section: {key: default}}``, read from the typed sections
#: (`tkvision.config_sections`, where each key's type and meaning are); the growth section is the one
#: key ``growth``, a mapping.
SECTIONS = {name: ({'growth': section_defaults(cls)} if name == 'growth' else section_defaults(cls))
            for name, cls in SECTION_CLASSES.items()}

#: Every key with its default (the sections merged; files and checkpoints hold this flat form).
DEFAULTS = {key: value for keys in SECTIONS.values() for key, value in keys.items()}

#: Keys renamed since an earlier release: ``{old name: new name}``; the old name still reads.
RENAMED = {'freeze_old_tokens': 'freeze_loaded_tokens'}  # one name per concept: growth.freeze_old_tokens differs

#: Keys a resumed run may change (the schedule is rebuilt at the current update); every other key
#: must equal the checkpoint's, since it fixes the model, the data or the order of the samples.
RESUME_MUTABLE = frozenset({
    'epochs', 'lr', 'blr', 'min_lr', 'sched', 'warmup_epochs', 'warmup_lr', 'decay_epochs', 'decay_milestones',
    'decay_rate', 'clip_grad', 'clip_mode', 'eval_every', 'save_every', 'checkpoint_every_steps',
    'checkpoint_every_minutes', 'log_interval', 'progress', 'tensorboard', 'num_workers', 'threads', 'device',
    'dist_timeout_minutes',
    'data_dir', 'download', 'val_subset', 'output', 'compile', 'grad_checkpointing', 'tf32', 'init_from',
    'recon_images', 'backward_mode'})


_SCI = re.compile(r'[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+')


def _coerce(value):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; treat such scientific literals as floats."""
    return float(value) if isinstance(value, str) and _SCI.fullmatch(value) else value


def merge(
        base: dict,
        over: dict,
        where: str = 'config',
        schema: dict = DEFAULTS,
) -> dict:
    """Recursively merge ``over`` into a copy of ``base``, checking keys against ``schema``.

    Mappings merge key by key (so a child config or ``--model_kwargs {score_norm: softmax}`` changes
    one model kwarg and keeps the others); ``model_kwargs`` and ``growth.add_tokens`` are free
    mappings whose keys are checked by the functions they are passed to.

    Raises:
        ConfigError: a key of ``over`` not in ``schema``, naming it and ``where``.
    """
    out = copy.deepcopy(base)
    for key, value in over.items():
        if schema is DEFAULTS and key in RENAMED:  # a key of an older release: its new name
            key = RENAMED[key]
        if key not in schema:
            raise ConfigError(f'unknown config key {key!r} in {where}; known keys: {", ".join(sorted(schema))}')
        if isinstance(schema[key], dict) and isinstance(value, dict):
            # a free mapping (empty in the schema) merges key by key without checks
            sub_schema = schema[key] or {**(out.get(key) or {}), **value}
            out[key] = merge(out.get(key) or {}, value, f'{where}:{key}', sub_schema)
        else:
            out[key] = copy.deepcopy(_coerce(value))
    return out


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _mapping_without_repeats(loader, node, deep=False):
    lines: Dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in lines:
            raise ConfigError(f'key {key!r} is given twice (lines {lines[key]} and {key_node.start_mark.line + 1})')
        lines[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def _read_yaml(path: str, seen=()) -> dict:
    if path in seen:
        raise ConfigError(f'_base_ cycle: {" -> ".join(seen + (path,))}')
    if not os.path.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    with open(path) as f:
        try:
            data = yaml.load(f, Loader=_StrictLoader) or {}
        except yaml.YAMLError as e:  # the parser's own words name the line and column
            raise ConfigError(f'{path} is not valid YAML: ' + ' '.join(str(e).split())) from None
        except ConfigError as e:
            raise ConfigError(f'{path}: {e}') from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: a config must be a YAML mapping')
    base = data.pop('_base_', None)
    if base is None:
        return merge(DEFAULTS, data, path)
    base_cfg = _read_yaml(os.path.normpath(os.path.join(os.path.dirname(path), base)), seen + (path,))
    return merge(base_cfg, data, path)


def parse_overrides(args: Any) -> dict:
    """``['--lr', '1e-3', '--growth.every_epochs', '2']`` → ``{'lr': 1e-3, 'growth': {'every_epochs': 2}}``.

    Also accepts ``--key=value``. Values are parsed as YAML.

    Raises:
        ConfigError: an argument that is not ``--key``, a key without a value, or a value YAML cannot read (a
            ``!!python`` tag included: nothing is constructed), named.
    """
    out: Dict[str, Any] = {}
    i = 0
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
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as error:  # a value YAML cannot read, or a tag safe_load refuses to construct
            problem = getattr(error, 'problem', None) or str(error).splitlines()[0]
            raise ConfigError(f'--{key}: the value {raw!r} is not YAML this config reads ({problem}); quote a string, '
                              "write a list as '[1, 2]', and no '!!' tags") from None
        node[leaf] = _coerce(value)
    return out


def load_config(
        path: Optional[str] = None,
        overrides: Union[None, dict, Sequence[str]] = None,
        base: Optional[dict] = None,
) -> dict:
    """Config from ``path`` (or ``base``, a config such as a checkpoint's, or the defaults) with
    ``overrides`` (a dict or ``--key value`` list). ``path``: a YAML file, or the name of a shipped
    recipe (``imagenet/tokenformer_vit_b16``: `tkvision.engine.recipes.config_path`).

    Raises:
        ConfigError: unknown key (named), missing file, ``_base_`` cycle, or a value of the wrong type
            or range (`validate_config`).
    """
    cfg = _read_yaml(config_path(path)) if path else merge(DEFAULTS, base or {}, 'base config')
    if overrides:
        if not isinstance(overrides, dict):
            overrides = parse_overrides(list(overrides))
        cfg = merge(cfg, overrides, 'command line')
    return validate_config(cfg)


def resolve_run_config(cfg: Union[Mapping[str, Any], TrainConfig]) -> TrainConfig:
    """The edge of a run: the flat config ``cfg`` (or the flat form of a `TrainConfig`) validated once and turned
    into typed, frozen sections, with the data section's null keys filled from the model
    (`tkvision.data.resolve_data_cfg`).

    A flat mapping that names only some keys is read as a YAML file is: the defaults fill the rest
    (`load_config`).

    Raises:
        ConfigError: a bad value or an unknown key (named); a `TrainConfig` whose section is not of its class.
    """
    if isinstance(cfg, TrainConfig):
        for name, cls in SECTION_CLASSES.items():
            part = getattr(cfg, name)
            if not isinstance(part, cls):
                raise ConfigError(f'TrainConfig({name}=...) must be a {cls.__name__}, got a {type(part).__name__}: '
                                  f'build it as {cls.__name__}(...) (tkvision.config_sections)')
        flat = validate_config(copy.deepcopy(cfg.to_dict()))
    else:
        flat = validate_config(merge(DEFAULTS, copy.deepcopy(dict(cfg)), 'the config mapping'))
    config = TrainConfig.from_dict(flat)
    return dataclasses.replace(config, data=resolve_data_cfg(config.data, config.model.model,
                                                             config.model.model_kwargs))


def resolve_lr(
        optim: OptimConfig,
        batch_size: int,
        world_size: int = 1,
) -> float:
    """Peak lr of the optim section ``optim``: ``lr`` if set, else ``blr * global_batch / 256`` (MAE's linear
    scaling rule), the global batch being ``batch_size`` x accumulation steps x ``world_size`` processes."""
    if optim.lr is not None:
        return float(optim.lr)
    return optim.blr * batch_size * resolve_accum_steps(optim, batch_size, world_size) * world_size / 256


def migrate(cfg: Mapping[str, Any]) -> dict:
    """A config saved by an earlier release (a checkpoint's) with today's key names (`RENAMED`)
    and today's defaults for keys it did not have; ``val_split_fraction`` 0 where it is absent (earlier
    releases validated on the dataset's own evaluation split)."""
    return merge(DEFAULTS, {'val_split_fraction': 0.0, **cfg}, 'checkpoint config')


def config_changes(old: dict, new: dict) -> Tuple[List[str], List[str]]:
    """What differs between a checkpoint's config ``old`` and the config ``new`` of a resumed run.

    Returns:
        ``(allowed, forbidden)``: two lists of ``'key old -> new'`` strings; ``allowed`` holds the
        keys of `RESUME_MUTABLE`, ``forbidden`` every other changed key (``model_kwargs`` and
        ``growth`` are compared as a whole under their top-level name). ``model_kwargs`` that only
        gains ``num_classes`` is allowed: it states the head the checkpoint has (the trainer refuses
        any other head before loading), as a run written when the default head was another needs.
    """
    allowed: List[str] = []
    forbidden: List[str] = []
    old = migrate(old)
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            mutable = key in RESUME_MUTABLE or (key == 'model_kwargs' and _only_num_classes_added(a, b))
            (allowed if mutable else forbidden).append(f'{key} {a!r} -> {b!r}')
    return allowed, forbidden


def _only_num_classes_added(old, new) -> bool:
    return (isinstance(old, dict) and isinstance(new, dict) and 'num_classes' not in old
            and {k: v for k, v in new.items() if k != 'num_classes'} == old)
