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
``mae``, ``data``, ``optim``, ``elastic``, ``growth``); each builder receives only its section
(`section`): ``build_dataset`` the data keys, ``build_optimizer`` the optimisation keys, and so
on. Files stay flat, so every config of earlier releases reads unchanged.

What each key allows is in `tkvision.engine.config_rules` (``tests/test_config.py`` holds the
rules and the defaults to the same keys). Recipe values in ``configs/imagenet/`` come from the MAE
paper, Appendix A.2 (table in ``docs/reference/background.md``, "Recipes").
"""
import copy
import os
import re
from typing import Any, List, Optional, Sequence, Tuple, Union

import yaml

from ..utils.errors import ConfigError
from .config_rules import INTERPOLATIONS, SCHEDULERS, resolve_accum_steps, validate_config
from .recipes import config_path

__all__ = ['SECTIONS', 'DEFAULTS', 'RENAMED', 'SCHEDULERS', 'INTERPOLATIONS', 'RESUME_MUTABLE', 'section',
           'load_config', 'parse_overrides', 'merge', 'migrate', 'config_changes', 'resolve_lr',
           'resolve_accum_steps', 'ConfigError']

#: Every config key with its default, by section. Units: epochs are passes over the training set;
#: lr values are per-step learning rates of the global batch; sizes are pixels.
SECTIONS = {
    'run': {
        # 'classify' (supervised), 'mae' (masked-autoencoder pretraining, no labels read) or
        # 'linprobe' (frozen encoder from init_from, BatchNorm + linear head: MAE's linear probing)
        'task': 'classify',
        'seed': 0,
        'device': None,              # null: cuda if available else cpu
        'threads': None,             # torch.set_num_threads on CPU
        'amp': None,                 # null, 'bf16' or 'fp16'
        'tf32': True,                # CUDA: TF32 matmuls and convolutions for float32 work
        'output': 'runs/default',
        'eval_every': 1,             # epochs
        'save_every': 1,             # epochs
        'checkpoint_every_steps': None,    # also write last.pth every N optimizer updates (mid-epoch)
        'checkpoint_every_minutes': None,  # also write last.pth when this much time passed since the last one
        'tensorboard': False,
        'log_interval': 50,          # optimizer updates between progress updates, loss checks and signal checks
        'dist_timeout_minutes': 10,  # a collective that waits this long for a rank fails the job (a rank that died)
        'progress': True,
    },
    'model': {
        'model': 'tokenformer_vit_ti16',
        'model_kwargs': {},          # passed to timm.create_model (img_size, patch_size, num_tokens, ...)
        'drop_path_rate': 0.0,
        'init_from': None,           # weights file to start from (.safetensors / .pth); grown to fit
        'freeze_loaded_tokens': False,  # with init_from: train only the tokens appended to the loaded ones (+ head)
        'grad_checkpointing': False,
        'compile': 'auto',           # torch.compile the model: true, false, or 'auto' (on for CUDA, where a TokenFormer
                                     # trains at 0.85x ViT-B compiled against 0.37x eager; off on a CPU, where
                                     # compiling costs what it saves over the quick recipe: docs/performance.md)
        'backward_mode': 'closed_form',  # Pattention's Θ (tkvision.layers.BACKWARD_MODES): 'closed_form', 'compiled'
                                         # (the closed form through torch.compile, one pass each way), 'lean'
                                         # (least activation memory), 'autograd' (reference)
    },
    'mae': {                         # MAE pretraining (task: mae; tkvision.models.mae)
        'mask_ratio': 0.75,          # fraction of patches masked per image
        'norm_pix_loss': True,       # regress per-patch normalised pixels
        'decoder': {                 # MAE's decoder: 512 wide, 8 blocks, 16 heads
            'embed_dim': 512,
            'depth': 8,
            'num_heads': 16,
            'num_tokens': None,      # TokenFormer decoder: parameter tokens per Pattention (null: embed_dim)
            'kind': None,            # 'tokenformer' or 'vit' (null: TokenFormer for a TokenFormer encoder)
        },
        'recon_images': 8,           # validation images in the reconstruction.png written at the end
    },
    'data': {
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
        'batch_size': 128,           # per process
        'num_workers': 0,
        'train_subset': None,        # use only the first N training images (tests, quick probes)
        'val_subset': None,
        # validation images held out of train (stratified, the same for every run; tkvision.data.datasets):
        # null: 1/6 for Fashion-MNIST (10k of 60k; its 10k test images become the test split), 0 otherwise
        # (the dataset's own val/ validates, no test split)
        'val_split_fraction': None,
        # timm's NaFlex loader (tkvision.data.naflex; a NaFlex model: naflexvit_tokenformer_*, timm's naflexvit_*):
        # every image at its own aspect ratio as a padded patch sequence, the patch size drawn per batch
        'naflex_loader': False,
        'naflex_train_seq_lens': [128, 256, 576, 784, 1024],  # a batch's length, drawn per batch (timm's)
        'naflex_max_seq_len': 576,   # evaluation: every image resized to at most this many patches
        'naflex_patch_sizes': None,  # patch sizes drawn uniformly per training batch; null: the model's
        'naflex_loss_scale': 'linear',  # each batch's loss x (its images / batch_size): 'linear', 'sqrt', 'none'
    },
    'optim': {
        'epochs': 10,
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
        'parameter_token_weight_decay': None,  # weight decay of Pattention key/value tokens; null: weight_decay
        'parameter_token_lr_scale': 1.0,       # lr multiplier of Pattention key/value tokens
        'clip_grad': None,
        'clip_mode': 'norm',         # timm dispatch_clip_grad: 'norm', 'value' or 'agc'
        'smoothing': 0.1,
        'mixup': 0.0,
        'cutmix': 0.0,
        'mixup_prob': 1.0,
        'mixup_switch_prob': 0.5,
        'model_ema': False,
        'model_ema_decay': 0.9999,
    },
    'elastic': {                     # nested prefix training (tkvision.growth.elastic, docs/elastic.md)
        'elastic_fractions': [],     # fractions of every Pattention's tokens each step may train, e.g.
                                     # [0.25, 0.5, 0.75, 1.0]; []: off. Evaluation reports each (top1@0.25, ...)
        'elastic_sampling': 'largest_plus_random',  # 'all', 'random' or 'largest_plus_random' (SAMPLING)
        'elastic_tau': 'kept',       # τ of a prefix of k tokens: 'kept' (the whole layer's) or 'follow' (Eq. 5's √k)
        'elastic_nesting': 'all',    # the Pattentions a prefix shrinks: 'all', 'ffn' (MatFormer's choice) or
                                     # 'no_attention' (the patch stem and the FFNs)
        'elastic_start': 0.0,        # fraction of the training steps in which only the whole model trains (the
                                     # smaller prefixes start after it)
    },
    'distillation': {                # soft targets (tkvision.engine.loss, docs/elastic.md)
        'distillation': 'none',      # 'none'; 'inplace': an elastic run's smaller prefixes learn from the whole
                                     # model's detached predictions in the same step; 'teacher': the model learns
                                     # from the predictions of the trained model in `teacher`
        'distillation_temperature': 1.0,   # softmax temperature T of both sides; the KL term is scaled by T²
        'distillation_task_weight': 0.0,   # a distilled loss = w x label loss + (1 - w) x KL (timm's
                                           # LogitDistillationTask, complementary weights)
        'teacher': None,             # distillation 'teacher': a finished run's weights file (its folder's
                                     # config.yaml builds the model)
    },
    'growth': {
        'growth': {                  # growth during training (tkvision.growth)
            'every_epochs': None,    # grow at the end of every k-th epoch
            'add_tokens': {},        # per kind: {patch, qkv, proj, ffn}
            'until_epoch': None,     # no growth at or after this epoch
            'key_init': 'zeros',
            'value_init': 'normal',
            # a progressive recipe: grow to `to` before epoch `at_epoch` (a registered variant, or
            # {kind: tokens}; {mlp_hidden: N} widens a timm ViT by Net2Net), each stage with its own
            # schedule: re-warm for `warmup_epochs` to lr x `lr_scale`, decay to min_lr at the stage's
            # end (tkvision.engine.optim). [{at_epoch: 100, to: tokenformer_vit_b16, warmup_epochs: 5}, ...]
            'schedule': [],
            'stage_lr': 'restart',       # 'restart': every stage its own warmup + decay to min_lr;
                                         # 'continue': one schedule over the run, re-warmed briefly after each step
            'optimizer_state': 'keep',   # at a schedule step: 'keep' the old rows' moments or 'reset' the optimizer
            'freeze_old_tokens': False,  # after a schedule step: train only the new tokens (+ head), paper §5
            'tau': 'keep',               # 'keep': grown layers keep their τ (function-preserving); 'recompute':
                                         # τ of a layer built at the new size (sqrt(n)), as a model from scratch
            'eval_after_step': False,    # evaluate right after each growth step: the loss jump (metrics.csv
                                         # val_loss_after_growth, top1_after_growth)
        },
    },
}

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


def section(cfg: dict, name: str) -> dict:
    """The keys of section ``name`` (`SECTIONS`) of the flat config ``cfg``, as a new dict; for
    ``'growth'`` the growth mapping itself (``every_epochs``, ``schedule``, ...).

    Raises:
        KeyError: an unknown section name.
    """
    if name == 'growth':
        return dict(cfg['growth'])
    return {key: cfg[key] for key in SECTIONS[name]}


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
    lines = {}
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
        base: dict = None,
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


def resolve_lr(optim: dict, batch_size: int, world_size: int = 1) -> float:
    """Peak lr of the optim section ``optim``: ``lr`` if set, else ``blr * global_batch / 256`` (MAE's linear
    scaling rule), the global batch being ``batch_size`` x accumulation steps x ``world_size`` processes."""
    if optim['lr'] is not None:
        return float(optim['lr'])
    return optim['blr'] * batch_size * resolve_accum_steps(optim, batch_size, world_size) * world_size / 256


def migrate(cfg: dict) -> dict:
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
    allowed, forbidden = [], []
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
