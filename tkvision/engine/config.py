"""Training configs: the sections that assemble a run's config (`TrainConfig`), YAML files with one inheritance
mechanism (``_base_``), command-line overrides, and old checkpoints' configs.

**Sections.** Each section is the ``Config`` of the one component that reads it and is declared in that component's
module (torchtitan's rule): ``run`` (`RunConfig`, the trainer's own keys: task, seed, output, evaluation, saving,
checkpoint timing, logging; here, with the assembly, because checkpoints below the trainer read configs too),
``process`` (``tkvision.engine.distributed.ProcessConfig``), ``model`` and ``mae``
(``tkvision.engine.build``), ``data`` (``tkvision.data.config.DataConfig``), ``optim`` and ``growth``
(``tkvision.engine.optim``), ``loss`` (``tkvision.engine.loss.LossConfig``). Each field says its type, default,
meaning, allowed values and whether a resumed run may change it (`tkvision.utils.config_fields`); `DEFAULTS`,
`RULES` and `RESUME_MUTABLE` are read from the fields, and ``docs/reference/config.md`` is rendered from them
(``tools/render_reference.py``). A validated config becomes typed, frozen sections once, at the edge of training
(`resolve_run_config`); only the trainer sees the whole, and each part receives its section.

**Files.** A config file is a YAML mapping of flat keys (``lr: 1e-3``, ``model_kwargs: {...}``): each key maps to
one field, whatever its section, so every file of earlier releases reads unchanged. Its optional ``_base_`` key
names another YAML file (relative to the file that names it); the file's keys are merged over the base's,
recursively for mappings. Every key must exist in `DEFAULTS`; an unknown key is an error that names it and the
file. Command-line overrides ``--key value`` (``--growth.every_epochs 2`` for nested keys) are parsed with YAML
rules (``1e-3`` is a float, ``[0.9, 0.95]`` a list, ``null`` None). Keys renamed since an earlier release
(`RENAMED`) are read under their new name; keys and values removed (`RETIRED_KEYS`, `RETIRED_VALUES`) are refused
in files and on the command line with what to use, and dropped from old checkpoints' configs where they hold what
today's code does. The checks that join keys are in `tkvision.engine.config_rules`. Recipe values in
``configs/imagenet/`` come from the MAE paper, Appendix A.2 (table in ``docs/reference/background.md``,
"Recipes").
"""
import copy
import dataclasses
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import torch
import yaml

from ..data import DataConfig, default_num_classes, resolve_data_cfg
from ..utils.config_fields import (boolean, choice, field_rules, integer, key, number, plain_value, resume_mutable,
                                   rule, section_defaults, section_from_mapping, string)
from ..utils.errors import ConfigError
from .build import MaeConfig, ModelConfig
from .config_history import RENAMED, REPLACED_KEYS, RETIRED_KEYS, RETIRED_VALUES
from .config_rules import check_joined_keys
from .distributed import ProcessConfig
from .loggers import LOGGERS
from .healing import HealingConfig
from .loss import LossConfig
from .optim import GrowthConfig, OptimConfig
from .recipes import config_path
from .tasks import TASKS, task_named

__all__ = ['RunConfig', 'TrainConfig', 'SECTION_CLASSES', 'SECTIONS', 'DEFAULTS', 'RULES', 'RESUME_MUTABLE',
           'RENAMED', 'RETIRED_KEYS', 'REPLACED_KEYS', 'RETIRED_VALUES', 'section', 'load_config', 'validate_config',
           'resolve_run_config', 'read_run_config', 'model_for_config', 'parse_overrides', 'merge', 'migrate',
           'config_changes', 'ConfigError']


def _is_logger_list(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and all(isinstance(v, str) and v in LOGGERS for v in value)
            and len(set(value)) == len(value))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What a run trains, where it writes, and when it evaluates, saves and reports (the ``run`` section): the
    trainer's own keys (``tkvision.engine.trainer``)."""

    task: str = key('classify', allowed=choice(*TASKS))
    """What is trained (``tkvision.engine.tasks.TASKS``, a class each): ``'classify'`` (supervised), ``'mae'``
    (masked-autoencoder pretraining, no labels read), ``'linprobe'`` (the ``init_from`` encoder frozen, BatchNorm +
    linear head: MAE's linear probing) or ``'regress'`` (one number per image, least squares)."""
    seed: int = key(0, allowed=integer(0))
    """The run's seed: initial weights, data order, augmentation and every random draw derive from it."""
    output: str = key('runs/default', allowed=string(), resume=True)
    """The run's folder (checkpoints, weights, metrics.csv, config.yaml); a run never writes into another's."""
    eval_every: int = key(1, allowed=integer(1), resume=True)
    """Epochs between evaluations on the validation split (the last epoch always evaluates)."""
    save_every: int = key(1, allowed=integer(1), resume=True)
    """Epochs between checkpoints (``last.pth``; the last epoch always saves)."""
    checkpoint_every_steps: Optional[int] = key(None, allowed=integer(1, null=True), resume=True)
    """Also write ``last.pth`` every N optimizer updates (mid-epoch); null: off."""
    checkpoint_every_minutes: Optional[float] = key(None, allowed=number(0, lo_open=True, null=True), resume=True)
    """Also write ``last.pth`` when this many minutes passed since the last one; null: off."""
    loggers: Tuple[str, ...] = key((), allowed=rule(_is_logger_list, f"a list of loggers ({', '.join(LOGGERS)})"),
                                   resume=True)
    """Where the run's scalars go besides ``metrics.csv``, any number at once (``tkvision.engine.loggers``):
    ``jsonl`` (``<output>/scalars.jsonl``, a JSON object per step), ``tensorboard`` (``<output>/tb``), ``wandb``
    (Weights & Biases), ``mlflow``; e.g. ``[jsonl, tensorboard, wandb]``.
    Each needs its extra (``pip install 'tkvision[wandb]'``); a resumed run continues the same tracker runs."""
    run_name: Optional[str] = key(None, allowed=string(null=True), resume=True)
    """The run's name in the trackers (W&B's run name, MLflow's ``run_name``); null: the output folder's name."""
    log_interval: int = key(50, allowed=integer(1), resume=True)
    """Optimizer updates between progress updates, loss checks and signal checks."""
    progress: bool = key(True, allowed=boolean(), resume=True)
    """Show a progress bar per epoch (rank 0)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole training config as typed, frozen sections, built from a validated flat config by `from_dict`;
    `to_dict` gives the flat form back (what ``config.yaml`` and every ``last.pth`` hold)."""

    run: RunConfig = RunConfig()
    """What runs, where it writes; when it evaluates, saves and reports (the trainer's)."""
    process: ProcessConfig = ProcessConfig()
    """Where the processes run (``tkvision.engine.distributed``)."""
    model: ModelConfig = ModelConfig()
    """The network (``tkvision.engine.build``)."""
    mae: MaeConfig = MaeConfig()
    """MAE pretraining, read with ``task: mae`` (``tkvision.engine.build``)."""
    data: DataConfig = DataConfig()
    """The images and their batches (``tkvision.data``)."""
    optim: OptimConfig = OptimConfig()
    """The optimizer, its schedule, clipping and EMA (``tkvision.engine.optim``)."""
    loss: LossConfig = LossConfig()
    """What a step learns from: targets, elastic prefixes, distillation (``tkvision.engine.loss``)."""
    growth: GrowthConfig = GrowthConfig()
    """Growth during training (``tkvision.engine.optim``)."""
    healing: HealingConfig = HealingConfig()
    """What a non-finite or spiking loss does: stop, or roll back and skip (``tkvision.engine.healing``)."""

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> 'TrainConfig':
        """The sections of the flat config ``cfg``, which must be validated already (`validate_config`;
        `load_config` returns one).

        Raises:
            KeyError: a key of a section missing from ``cfg``.
        """
        return cls(**{name: section(cfg, name) for name in SECTION_CLASSES})

    def to_dict(self) -> Dict[str, Any]:
        """The flat config: every key of every section at the top (the ``growth`` mapping under ``growth``),
        lists and dicts as a YAML file writes them."""
        flat: Dict[str, Any] = {}
        for name in SECTION_CLASSES:
            values = plain_value(getattr(self, name))
            flat.update({'growth': values} if name == 'growth' else values)
        return flat


#: The sections in the order a reader meets them: ``{name: class}``.
SECTION_CLASSES: Dict[str, type] = {f.name: cast(type, f.type) for f in dataclasses.fields(TrainConfig)}


def section(
        cfg: Mapping[str, Any],
        name: str,
) -> Any:
    """Section ``name`` of the flat config ``cfg`` (a validated config: `load_config`), as its frozen class of
    `SECTION_CLASSES` (``'growth'``: a ``GrowthConfig`` of the ``growth`` mapping).

    Raises:
        KeyError: an unknown section name, or a key of the section missing from ``cfg``.
    """
    return section_from_mapping(SECTION_CLASSES[name], cfg['growth'] if name == 'growth' else cfg)


def _keyed(name: str, table: Mapping[str, Any]) -> Dict[str, Any]:
    return {('growth.' if name == 'growth' else '') + k: v for k, v in table.items()}


#: Every config key with its default, by section: ``{section: {key: default}}``, read from the fields; the growth
#: section is the one key ``growth``, a mapping.
SECTIONS = {name: ({'growth': section_defaults(cls)} if name == 'growth' else section_defaults(cls))
            for name, cls in SECTION_CLASSES.items()}

#: Every key with its default (the sections merged; files and checkpoints hold this flat form).
DEFAULTS = {k: value for keys in SECTIONS.values() for k, value in keys.items()}

#: What each key allows (``growth.*``, ``decoder.*`` dotted), read from the fields: ``{key: Rule}``.
RULES = {k: r for name, cls in SECTION_CLASSES.items() for k, r in _keyed(name, field_rules(cls)).items()}

#: Keys a resumed run may change (the schedule is rebuilt at the current update), read from the fields; every
#: other key must equal the checkpoint's, since it fixes the model, the data or the order of the samples.
RESUME_MUTABLE = frozenset(k for name, cls in SECTION_CLASSES.items() for k in _keyed(name, dict.fromkeys(
    resume_mutable(cls))))

def model_for_config(
        config: Union[TrainConfig, Mapping[str, Any]],
        num_classes: Optional[int] = None,
) -> torch.nn.Module:
    """The model of a whole config (a `TrainConfig`, or a flat config such as a checkpoint's, `migrate`d first), as
    its task builds it (``tkvision.engine.tasks.Task.build_model``: the model section, with the MAE section for
    ``task: mae``), with ``num_classes`` (default: ``tkvision.data.default_num_classes`` of its data section)."""
    if not isinstance(config, TrainConfig):
        config = TrainConfig.from_dict(migrate(config))
    return task_named(config.run.task).build_model(config.model, config.mae,
                                                   num_classes or default_num_classes(config.data))


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
    for name, value in over.items():
        if schema is DEFAULTS and name in RENAMED:  # a key of an older release: its new name
            name = RENAMED[name]
        if schema is DEFAULTS and name in RETIRED_KEYS:
            raise ConfigError(f'{name} was removed: {RETIRED_KEYS[name][1]} (in {where})')
        if schema is DEFAULTS and name in REPLACED_KEYS:
            raise ConfigError(f'{name} was replaced: {REPLACED_KEYS[name][0]} (in {where})')
        if name not in schema:
            raise ConfigError(f'unknown config key {name!r} in {where}; known keys: {", ".join(sorted(schema))}')
        if isinstance(schema[name], dict) and not isinstance(value, dict) and schema is DEFAULTS:
            raise ConfigError(f'{name} must be a mapping (in {where}), got {value!r}: write {name}: {{key: value}} in '
                              f'a file, or --{name}.key value on the command line')
        if isinstance(schema[name], dict) and isinstance(value, dict):
            # a free mapping (empty in the schema) merges key by key without checks
            sub_schema = schema[name] or {**(out.get(name) or {}), **value}
            out[name] = merge(out.get(name) or {}, value, f'{where}:{name}', sub_schema)
        else:
            out[name] = copy.deepcopy(_coerce(value))
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


def read_run_config(path: str) -> dict:
    """The ``config.yaml`` a run wrote into its folder, read as a checkpoint's config is (`migrate`: keys and values
    removed since it trained are dropped or set to today's default), so a finished run's model still builds (a
    teacher, validation), whatever it trained with.

    Raises:
        ConfigError: no such file, a file that is not YAML or not a mapping, or a key no release had (named).
    """
    if not os.path.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    with open(path) as f:
        try:
            data = yaml.load(f, Loader=_StrictLoader) or {}
        except (yaml.YAMLError, ConfigError) as e:
            raise ConfigError(f'{path} is not a run\'s config.yaml: ' + ' '.join(str(e).split())) from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: a run\'s config.yaml is a YAML mapping')
    return migrate(data)


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


def validate_config(cfg: Mapping[str, Any]) -> dict:
    """Check every key of the flat config ``cfg`` against its field's rule (`RULES`), refuse a removed value
    (`RETIRED_VALUES`), then the rules that join keys (``tkvision.engine.config_rules.check_joined_keys``).

    Returns:
        a normalised copy (``cfg`` is left as it was): each value as its rule stores it (``Rule.normalize``:
        ``300.0`` of an integer key as ``300``), the growth schedule's steps placed and filled
        (``tkvision.engine.optim.check_growth``).

    Raises:
        ConfigError: the first bad value, naming the key, the value and what is allowed (or what replaced it).
    """
    out: Dict[str, Any] = copy.deepcopy(dict(cfg))
    for (name, value), why in RETIRED_VALUES.items():
        if out.get(name) == value:
            raise ConfigError(f'{name}: {value!r} was removed: {why}')
    for name, allowed in RULES.items():
        parent, _, leaf = name.rpartition('.')
        node = out[parent] if parent else out
        value = node[leaf]
        if not allowed.check(value):
            raise ConfigError(f'{name} must be {allowed.words}, got {value!r}')
        node[leaf] = allowed.normalize(value)
    return check_joined_keys(out, section(out, 'optim'))


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
                                  f'build it as {cls.__name__}(...) ({cls.__module__})')
        flat = validate_config(cfg.to_dict())
    else:
        flat = validate_config(merge(DEFAULTS, dict(cfg), 'the config mapping'))
    config = TrainConfig.from_dict(flat)
    return dataclasses.replace(config, data=resolve_data_cfg(config.data, config.model.model,
                                                             config.model.model_kwargs))


def migrate(cfg: Mapping[str, Any]) -> dict:
    """A config saved by an earlier release (a checkpoint's) with today's key names (`RENAMED`)
    and today's defaults for keys it did not have; ``val_split_fraction`` 0 where it is absent (earlier
    releases validated on the dataset's own evaluation split); keys replaced since (`REPLACED_KEYS`) translated; keys
    removed since (`RETIRED_KEYS`) dropped and values removed since (`RETIRED_VALUES`) set to today's default, so
    that a finished run's config still builds its model (validation, export, a teacher). A resume refuses a removed
    key or value the run trained with: `config_changes` compares the config as it was saved."""
    kept = {name: value for name, value in cfg.items() if name not in RETIRED_KEYS and name not in REPLACED_KEYS}
    for name, (_, translate) in REPLACED_KEYS.items():
        if name in cfg:
            kept.update(translate(cfg[name]))
    for name, value in RETIRED_VALUES:  # what it trained with is done; what reads it (validate, a teacher) builds
        if kept.get(name) == value:
            kept[name] = DEFAULTS[name]
    return merge(DEFAULTS, {'val_split_fraction': 0.0, **kept}, 'checkpoint config')


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
    forbidden = [f'{name} {old[name]!r} -> removed ({why})' for name, (today, why) in RETIRED_KEYS.items()
                 if name in old and old[name] != today]
    forbidden += [f'{name} {value!r} -> removed ({why})' for (name, value), why in RETIRED_VALUES.items()
                  if old.get(name) == value]
    old = migrate(old)
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b and not any(item.startswith(f'{name} ') for item in forbidden):
            mutable = name in RESUME_MUTABLE or (name == 'model_kwargs' and _only_num_classes_added(a, b))
            (allowed if mutable else forbidden).append(f'{name} {a!r} -> {b!r}')
    return allowed, forbidden


def _only_num_classes_added(old, new) -> bool:
    return (isinstance(old, dict) and isinstance(new, dict) and 'num_classes' not in old
            and {k: v for k, v in new.items() if k != 'num_classes'} == old)
