"""How a run optimises: the optimizer, its learning-rate schedule and its update step (timm's
``create_optimizer_v2``, ``create_scheduler_v2``, ``dispatch_clip_grad``, ``ModelEmaV3``), and the growth steps; the
two sections it reads, `OptimConfig` (``optim``) and `GrowthConfig` (``growth``), are declared here.

[`RunOptim`][tkvision.engine.optim.RunOptim] builds the optimizer and the schedule over a
``tkvision.engine.state.TrainState``'s model, rebuilds them after a growth step and on resume, and applies the
growth steps, so that the model, the optimizer's moments, the EMA and the frozen rows always move together. It
keeps the two config sections it reads; the state keeps only what is saved (timm keeps the same split: its
``train.py`` builds the optimizer and scheduler from ``args``, ``CheckpointSaver`` saves the state).

The schedule is stepped once per optimizer update and counted in updates. With ``U`` updates in the
run (``epochs x updates_per_epoch``) and ``W = round(warmup_epochs x updates_per_epoch)``, update
``u`` (0-based) runs at

    u < W:   warmup_lr + u (lr - warmup_lr) / W                               (linear warmup)
    u >= W:  the schedule over the remaining updates, u - W = 0 .. U - 1 - W

so the warmup lasts exactly ``warmup_epochs`` and, for the decaying schedules (cosine, tanh,
poly), the last update runs at ``min_lr``: cosine gives
``min_lr + (lr - min_lr) (1 + cos(pi (u - W) / (U - 1 - W))) / 2``. (timm's ``warmup_prefix``
places the warmup before the schedule's ``t_initial`` steps; setting ``t_initial = U - 1 - W`` makes
the last update the end of the cosine, where the first version of this trainer stopped ``W``
updates before it.)

With a growth schedule (``growth.schedule``, `tkvision.growth`), the run is cut into stages at
the steps' ``at_epoch``. ``growth.stage_lr: continue`` (default): one schedule over the whole run, as without
growth; after a step the scheduled lr is multiplied by ``lr_scale x (t + 1) / (W + 1)`` for the stage's first
``W = warmup_epochs x updates_per_epoch`` updates (``t = 0 .. W - 1``, a short linear re-warm) and by ``lr_scale``
after them. ``growth.stage_lr: restart``: each stage gets the schedule above over its own updates, so every stage
ends at ``min_lr`` (an annealed model of that size, as each model of the paper's Fig. 3 chain); stage 0 warms up for
``warmup_epochs`` to ``lr``, the stage after a step re-warms for the step's ``warmup_epochs`` to ``lr x lr_scale``.
"""
import dataclasses
import math
from types import MappingProxyType
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import timm
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from timm.utils import dispatch_clip_grad
from torch.utils.hooks import RemovableHandle

from .. import growth
from ..growth import elastic
from ..layers import PATTENTION_KINDS, Pattention
from ..utils.config_fields import (boolean, choice, integer, is_number, key, mapping, number, numbers, rule,
                                   string)
from ..utils.errors import ConfigError, RunError
from .state import TrainState, UpdateSchedule

__all__ = ['OptimConfig', 'GrowthConfig', 'check_growth', 'SCHEDULERS', 'SCHEDULE_STEP', 'resolve_lr',
           'resolve_accum_steps', 'RunOptim', 'build_optimizer', 'split_parameter_tokens', 'build_scheduler',
           'StagedScheduler', 'RewarmScheduler', 'growth_stages']

#: timm schedulers usable per optimizer update (``timm.scheduler.create_scheduler_v2``; 'plateau'
#: steps per epoch on a metric and is not offered).
SCHEDULERS = ('cosine', 'tanh', 'poly', 'step', 'multistep', 'wsd', 'rsqrt', 'constant')
#: Keys of one ``growth.schedule`` step and their defaults (None: required). ``at_fraction`` (a fraction of the
#: run's epochs) may stand for ``at_epoch``: the config check places the step at the nearest epoch.
SCHEDULE_STEP = {'at_epoch': None, 'to': None, 'warmup_epochs': 0.0, 'lr_scale': 1.0}
#: ``growth.schedule`` is a list; each step's keys are checked with the run's epochs (`check_growth`).
SCHEDULE_RULE = rule(lambda v: isinstance(v, (list, tuple)),
                     'a list of steps {at_epoch or at_fraction, to[, warmup_epochs, lr_scale]}')


def _is_optimizer(value) -> bool:
    from timm.optim import list_optimizers
    return isinstance(value, str) and value.lower() in list_optimizers()


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its schedule, gradient clipping and the EMA (the ``optim`` section), a ``Config`` of this
    module. Epochs are passes over the training set; learning rates are per update of the global batch."""

    epochs: int = key(10, allowed=integer(1), resume=True)
    """Passes over the training set."""
    accum_steps: int = key(1, allowed=integer(1))
    """Gradient accumulation: global batch = ``batch_size`` x ``accum_steps`` x processes."""
    global_batch_size: Optional[int] = key(None, allowed=integer(1, null=True))
    """If set, ``accum_steps`` = ``global_batch_size`` / (``batch_size`` x processes)."""
    opt: str = key('adamw', allowed=rule(_is_optimizer, "a timm optimizer name (timm.optim.list_optimizers(): "
                                                         "'adamw', 'sgd', 'lamb', ...)"))
    """A timm optimizer name (``timm.optim.create_optimizer_v2``; ``timm.optim.list_optimizers()``)."""
    opt_betas: Tuple[float, ...] = key((0.9, 0.999), allowed=numbers(0, 1, hi_open=True))
    """The optimizer's betas."""
    opt_eps: float = key(1.0e-8, allowed=number(0, lo_open=True))
    """The optimizer's epsilon."""
    lr: Optional[float] = key(None, allowed=number(0, lo_open=True, null=True), resume=True)
    """The peak learning rate; null: ``blr`` x global batch / 256 (MAE's linear scaling rule)."""
    blr: float = key(1.0e-3, allowed=number(0, lo_open=True), resume=True)
    """Base learning rate per 256 images of the global batch (used when ``lr`` is null)."""
    sched: str = key('cosine', allowed=choice(*SCHEDULERS), resume=True)
    """A timm scheduler name (``SCHEDULERS``), stepped per optimizer update."""
    min_lr: float = key(1.0e-6, allowed=number(0), resume=True)
    """The learning rate of the last update (cosine, tanh, poly)."""
    warmup_epochs: float = key(1.0, allowed=number(0), resume=True)
    """Linear warmup from ``warmup_lr`` to the peak, then the schedule."""
    warmup_lr: float = key(1.0e-6, allowed=number(0), resume=True)
    """The learning rate the warmup starts from."""
    decay_epochs: float = key(90, allowed=number(0, lo_open=True), resume=True)
    """``step``: epochs between decays; ``wsd`` / ``rsqrt``: the decay's length (a fraction of the run if < 1)."""
    decay_milestones: Tuple[float, ...] = key((90, 180, 270), allowed=numbers(0), resume=True)
    """``multistep``: the epochs at which the learning rate decays."""
    decay_rate: float = key(0.1, allowed=number(0, lo_open=True), resume=True)
    """``step`` / ``multistep``: the factor of each decay; ``poly``: the power."""
    weight_decay: float = key(0.05, allowed=number(0))
    """Decoupled weight decay (AdamW's); biases and norms get none (timm)."""
    layer_decay: Optional[float] = key(None, allowed=number(0, 1, lo_open=True, null=True))
    """Layer-wise learning-rate decay for fine-tuning, e.g. 0.65; null: off."""
    parameter_token_weight_decay: Optional[float] = key(None, allowed=number(0, null=True))
    """Weight decay of Pattention's key and value parameter tokens; null: ``weight_decay``."""
    parameter_token_lr_scale: float = key(1.0, allowed=number(0, lo_open=True))
    """Learning-rate multiplier of Pattention's key and value parameter tokens."""
    clip_grad: Optional[float] = key(None, allowed=number(0, lo_open=True, null=True), resume=True)
    """Clip gradients at this value (``clip_mode``); null: off."""
    clip_mode: str = key('norm', allowed=choice('norm', 'value', 'agc'), resume=True)
    """timm's ``dispatch_clip_grad``: ``'norm'``, ``'value'`` or ``'agc'``."""
    model_ema: bool = key(False, allowed=boolean())
    """Keep an exponential moving average of the weights (timm's ``ModelEmaV3``), evaluated beside the model."""
    model_ema_decay: float = key(0.9999, allowed=number(0, 1, hi_open=True))
    """The EMA's decay per update."""


@dataclasses.dataclass(frozen=True)
class GrowthConfig:
    """Growth during training (`tkvision.growth`; the ``growth`` mapping, written ``growth: {...}`` in a file
    and ``--growth.every_epochs 2`` on the command line), a ``Config`` of this module: `RunOptim` applies its
    steps and rebuilds the optimizer and schedule around them."""

    every_epochs: Optional[int] = key(None, allowed=integer(1, null=True))
    """Grow at the end of every k-th epoch by ``add_tokens``; null: off."""
    add_tokens: Mapping[str, int] = key(allowed=mapping(), default_factory=lambda: MappingProxyType({}))
    """Tokens appended per kind at each such step: ``{patch, qkv, proj, ffn}``."""
    until_epoch: Optional[int] = key(None, allowed=integer(1, null=True))
    """No ``every_epochs`` growth at or after this epoch; null: until the end."""
    key_init: str = key('zeros', allowed=choice('zeros', 'normal'))
    """Initial key tokens of a growth step: ``'zeros'`` (function-preserving) or ``'normal'``."""
    value_init: str = key('normal', allowed=choice('zeros', 'normal'))
    """Initial value tokens of a growth step: ``'zeros'`` or ``'normal'``."""
    schedule: Tuple[Mapping[str, Any], ...] = key((), allowed=SCHEDULE_RULE)
    """A progressive recipe: grow to ``to`` before epoch ``at_epoch`` (a registered variant, or ``{kind:
    tokens}``; ``{mlp_hidden: N}`` widens a timm ViT by Net2Net), or at ``at_fraction`` of the run's epochs (the
    nearest epoch, so the placement holds when ``epochs`` changes); after the step re-warm for ``warmup_epochs`` to
    lr x ``lr_scale`` (``stage_lr``). E.g. ``[{at_fraction: 0.3, to: tokenformer_vit_b16, warmup_epochs: 5}]``."""
    stage_lr: str = key('continue', allowed=choice('restart', 'continue'))
    """``'continue'``: one schedule over the run, re-warmed briefly after each step (the default: the higher
    validation top-1 of the two, ``docs/growth.md``); ``'restart'``: every stage its own warmup and decay to
    ``min_lr``."""
    optimizer_state: str = key('keep', allowed=choice('keep', 'reset'))
    """At a schedule step: ``'keep'`` the old rows' moments or ``'reset'`` the optimizer."""
    freeze_old_tokens: bool = key(False, allowed=boolean())
    """After a schedule step: train only the new tokens (and the head), the paper's §5."""
    new_token_lr_scale: float = key(1.0, allowed=number(0, 100, lo_open=True))  # beyond 100x: a NaN, not a recipe
    """After a schedule step, the tokens appended at that step train at this multiple of the lr until the next
    step (`tkvision.growth.scale_new_token_updates`; Variance Transfer, arXiv 2306.12700); 1.0: the same lr."""
    tau: str = key('keep', allowed=choice('keep', 'recompute'))
    """``'keep'``: grown layers keep their τ (function-preserving); ``'recompute'``: τ of a layer built at the
    new size (√n), as a model from scratch."""
    eval_after_step: bool = key(False, allowed=boolean())
    """Evaluate right after each growth step: the loss jump (``metrics.csv``'s ``val_loss_after_growth``,
    ``top1_after_growth``)."""


def check_growth(
        growth: Mapping[str, Any],
        epochs: int,
        warmup_epochs: float,
) -> dict:
    """The growth section's checks that its keys' own rules cannot make (the run's ``epochs`` and ``warmup_epochs``
    joined in): the token kinds of ``add_tokens``, each ``schedule`` step's keys, its place (``at_fraction`` placed
    at the nearest epoch, `SCHEDULE_STEP`'s defaults filled in) and the options that go with a schedule.

    Args:
        growth: the config's ``growth`` mapping (each key's own rule checked).
        epochs: the run's epochs.
        warmup_epochs: the run's warmup.

    Returns:
        a normalised copy of ``growth`` (the mapping given is left as it was): the schedule's steps placed by epoch,
        with every key.

    Raises:
        ConfigError: an unknown kind or a bad count in ``add_tokens``; a step that is not a mapping, an unknown or
            missing key (named), a bad ``at_fraction`` (`_place_by_fraction`), ``at_epoch`` not increasing within
            ``1 .. epochs - 1``, a ``warmup_epochs`` not shorter than its stage, a bad ``to``; a growth option that
            contradicts the schedule (`_check_growth_options`).
    """
    for kind, n in growth['add_tokens'].items():
        if kind not in PATTENTION_KINDS:
            raise ConfigError(f'growth.add_tokens: unknown token kind {kind!r}; kinds are '
                              f'{", ".join(PATTENTION_KINDS)}')
        if not (is_number(n) and float(n).is_integer() and n >= 0):
            raise ConfigError(f'growth.add_tokens.{kind} must be an integer >= 0, got {n!r}')
    steps = [_place_by_fraction(step, epochs, f'growth.schedule[{i}]') for i, step in enumerate(growth['schedule'])]
    _check_growth_options(growth, steps)
    first = steps[0].get('at_epoch') if steps and isinstance(steps[0], dict) else None
    if first is not None and is_number(first) and warmup_epochs >= first:
        raise ConfigError(f'warmup_epochs {warmup_epochs} must be shorter than the first stage of growth.schedule '
                          f'({first} epochs)')
    steps = _step_epochs(steps, epochs)
    for i, step in enumerate(steps):
        end = steps[i + 1]['at_epoch'] if i + 1 < len(steps) else epochs
        _check_step(step, f'growth.schedule[{i}]', end)
    return dict(growth, schedule=steps)


def _step_epochs(steps: list, epochs: int) -> list:
    """Each step as a new mapping with every key of `SCHEDULE_STEP` (defaults filled), its ``at_epoch`` an integer.

    Raises:
        ConfigError: a step that is not a mapping, an unknown or missing key, or ``at_epoch`` not increasing within
            ``1 .. epochs - 1``.
    """
    out, prev = [], 0
    for i, step in enumerate(steps):
        where = f'growth.schedule[{i}]'
        if not isinstance(step, Mapping):
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
        step = {**SCHEDULE_STEP, **step}
        at = step['at_epoch']
        if not (is_number(at) and float(at).is_integer() and prev < at < epochs):
            raise ConfigError(f'{where}.at_epoch must be an integer in {prev + 1} .. {epochs - 1} (increasing, '
                              f'before the last epoch), got {at!r}')
        step['at_epoch'] = prev = int(at)
        out.append(step)
    return out


def _check_step(step: Mapping[str, Any], where: str, end: int) -> None:
    """One placed step's warmup (shorter than its stage, which ends at epoch ``end``), lr scale and target.

    Raises:
        ConfigError: naming the step's key and what it allows.
    """
    if not (is_number(step['warmup_epochs']) and 0 <= step['warmup_epochs'] < end - step['at_epoch']):
        raise ConfigError(f"{where}.warmup_epochs must be >= 0 and shorter than its stage, got "
                          f"{step['warmup_epochs']!r}")
    if not (is_number(step['lr_scale']) and step['lr_scale'] > 0):
        raise ConfigError(f"{where}.lr_scale must be a number > 0, got {step['lr_scale']!r}")
    to = step['to']
    if isinstance(to, Mapping):
        for kind, n in to.items():
            if kind not in PATTENTION_KINDS + ('mlp_hidden',):
                raise ConfigError(f'{where}.to: unknown kind {kind!r}; kinds are {", ".join(PATTENTION_KINDS)} '
                                  '(or mlp_hidden for a timm ViT)')
            if not (is_number(n) and float(n).is_integer() and n >= 1):
                raise ConfigError(f'{where}.to.{kind} must be an integer >= 1, got {n!r}')
    elif not (isinstance(to, str) and to):
        raise ConfigError(f'{where}.to must be a registered variant name or a mapping {{kind: tokens}}, got {to!r}')
    elif not timm.is_model(to):
        raise ConfigError(f'{where}.to: {to!r} is not a registered model (timm.list_models("tokenformer_*") '
                          'lists them)')


def _place_by_fraction(step, epochs: int, where: str):
    """``step`` with ``at_fraction`` (a fraction of the run's ``epochs``) replaced by ``at_epoch``, the nearest
    epoch (halves round up), so that a recipe keeps its stage placement when its budget changes; any other step
    as it is.

    Raises:
        ConfigError: both ``at_epoch`` and ``at_fraction``, a fraction outside (0, 1), or one that lands on epoch
            0 or the last epoch (named with the epoch it gives).
    """
    if not (isinstance(step, Mapping) and 'at_fraction' in step):
        return step
    fraction = step['at_fraction']
    if 'at_epoch' in step:
        raise ConfigError(f'{where} gives both at_epoch and at_fraction: place the step by one of them')
    if not (is_number(fraction) and 0 < fraction < 1):
        raise ConfigError(f'{where}.at_fraction must be a number in (0, 1), a fraction of the {epochs} epochs, '
                          f'got {fraction!r}')
    epoch = math.floor(fraction * epochs + 0.5)
    if not 1 <= epoch <= epochs - 1:
        raise ConfigError(f'{where}.at_fraction {fraction} of {epochs} epochs is epoch {epoch}: a growth step '
                          f'needs an epoch before and after it (1 .. {epochs - 1})')
    placed = {k: v for k, v in step.items() if k != 'at_fraction'}
    placed['at_epoch'] = epoch
    return placed


def _check_growth_options(growth: Mapping[str, Any], steps: list):
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


def resolve_lr(
        optim: OptimConfig,
        batch_size: int,
        world_size: int = 1,
        global_batch: Optional[int] = None,
) -> float:
    """Peak lr of the optim section ``optim``: ``lr`` if set, else ``blr * global_batch / 256`` (MAE's linear
    scaling rule), the global batch being ``global_batch`` when given (a run resumed on another number of processes
    keeps its own), else ``batch_size`` x accumulation steps x ``world_size`` processes."""
    if optim.lr is not None:
        return float(optim.lr)
    return optim.blr * (global_batch or batch_size * resolve_accum_steps(optim, batch_size, world_size) *
                        world_size) / 256



def build_optimizer(
        model: torch.nn.Module,
        optim: OptimConfig,
        lr: float,
) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2`` of the config's optim section: ``opt`` at peak ``lr``, no weight decay on 1-d
    parameters, the class token and the position embedding (the model's ``no_weight_decay``), layer-wise lr decay
    with ``layer_decay`` (the model's ``group_matcher``). ``parameter_token_weight_decay`` (None: the
    run's ``weight_decay``) and ``parameter_token_lr_scale`` (1.0) set the weight decay and scale the lr of
    every Pattention's key and value parameter tokens (the levers of docs/comparison.md):
    `split_parameter_tokens`.
    AdamW's decay is decoupled and scaled by the group's lr (each step multiplies a weight by
    ``1 - lr * weight_decay``), so ``parameter_token_lr_scale`` scales the tokens' effective decay too."""
    optimizer = create_optimizer_v2(model, opt=optim.opt, lr=lr, weight_decay=optim.weight_decay,
                                    betas=tuple(optim.opt_betas), eps=optim.opt_eps,
                                    layer_decay=optim.layer_decay)
    weight_decay, lr_scale = optim.parameter_token_weight_decay, optim.parameter_token_lr_scale
    if weight_decay is None and lr_scale == 1.0:
        return optimizer  # the groups timm makes, unchanged (and so the checkpoints of earlier runs)
    return split_parameter_tokens(optimizer, model, weight_decay, lr_scale)


def split_parameter_tokens(
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        weight_decay: Optional[float],
        lr_scale: float,
) -> torch.optim.Optimizer:
    """Split every param group of ``optimizer`` in place, before its first step, in two: the group's other
    parameters, unchanged, then the key / value parameter tokens of ``model``'s Pattentions (paper Eq. 4's
    K_P and V_P) with ``weight_decay`` (None: the group's) and the group's ``lr_scale`` times ``lr_scale``
    (timm's schedulers multiply each group's lr by its ``lr_scale``). Returns ``optimizer``.

    Raises:
        ValueError: the optimizer has already stepped (its state would not follow the new groups)."""
    if optimizer.state:
        raise ValueError('split_parameter_tokens needs an optimizer that has not stepped yet')
    tokens = {id(p) for m in model.modules() if isinstance(m, Pattention) for p in (m.keys, m.value_param_tokens)}
    groups = list(optimizer.param_groups)
    optimizer.param_groups.clear()
    for group in groups:
        rest = [p for p in group['params'] if id(p) not in tokens]
        mine = [p for p in group['params'] if id(p) in tokens]
        if rest:
            optimizer.add_param_group(dict(group, params=rest))
        if mine:
            decay = group['weight_decay'] if weight_decay is None else weight_decay
            optimizer.add_param_group(dict(group, params=mine, lr_scale=group.get('lr_scale', 1.0) * lr_scale,
                                           weight_decay=decay))
    return optimizer


def growth_stages(
        optim: OptimConfig,
        growth: Optional[GrowthConfig],
) -> list:
    """``[(start_epoch, end_epoch, warmup_epochs, lr_scale)]``: the stages of the growth section's
    schedule over the optim section's epochs (one stage, the whole run, without one or without ``growth``)."""
    steps = growth.schedule if growth else ()
    bounds = [0] + [s['at_epoch'] for s in steps] + [optim.epochs]
    warm = [optim.warmup_epochs] + [s.get('warmup_epochs', 0) for s in steps]
    scale = [1.0] + [s.get('lr_scale', 1.0) for s in steps]
    return [(bounds[i], bounds[i + 1], warm[i], scale[i]) for i in range(len(steps) + 1)]


class StagedScheduler:
    """One timm scheduler per growth stage; ``step_update(u)`` runs the stage that holds update ``u``
    at ``u`` minus the stage's first update (see the module docstring).

    Args:
        schedulers: ``[(first update of the stage, timm scheduler)]`` in order.
    """

    def __init__(self, schedulers: list):
        self.schedulers = schedulers

    def step_update(self, num_updates: int, metric: Optional[float] = None) -> None:
        """Set the lr for update ``num_updates`` (counted from the run's start) from the stage it falls in."""
        start, sched = [s for s in self.schedulers if s[0] <= num_updates][-1]
        sched.step_update(num_updates - start, metric)


class RewarmScheduler:
    """``growth.stage_lr: continue``: one timm schedule over the run; after each growth step its lr is
    scaled by the step's ``lr_scale`` and ramped up linearly over the step's warmup (module docstring).

    Args:
        base: the run's timm scheduler.
        optimizer: the optimizer it drives.
        steps: ``[(first update of the stage, warmup updates W, lr_scale)]`` in order.
    """

    def __init__(self, base: UpdateSchedule, optimizer: torch.optim.Optimizer, steps: list):
        self.base, self.optimizer, self.steps = base, optimizer, steps

    def step_update(self, num_updates: int, metric: Optional[float] = None) -> None:
        """Set the base schedule's lr for update ``num_updates``, then scale it by the last growth step's
        ``lr_scale``, ramped up over that step's warmup updates."""
        self.base.step_update(num_updates, metric)
        past = [s for s in self.steps if s[0] <= num_updates]
        if past:
            start, warm, scale = past[-1]
            t = num_updates - start
            factor = scale * ((t + 1) / (warm + 1) if t < warm else 1.0)
            for group in self.optimizer.param_groups:
                group['lr'] *= factor


def build_scheduler(
        optimizer: torch.optim.Optimizer,
        optim: OptimConfig,
        growth: Optional[GrowthConfig],
        lr: float,
        updates_per_epoch: int,
) -> UpdateSchedule:
    """The lr schedule of the optim section (``sched``, ``epochs``, ``warmup_epochs``, ``min_lr``, ...) in updates;
    with ``growth.schedule``, a `StagedScheduler` of one such schedule per stage
    (``growth.stage_lr: restart``) or a `RewarmScheduler` (``continue``).

    Sets every param group's peak (``initial_lr``) to ``lr`` first, so a resumed run with a new
    ``lr`` schedules from the new peak; layer-wise decay's ``lr_scale`` is applied by timm. After
    building, the optimizer's lr is that of update 0; call ``scheduler.step_update(u)`` to move to
    update ``u``.

    Returns:
        a timm scheduler or `StagedScheduler` (``step_update(num_updates)``).
    """
    stages = growth_stages(optim, growth)
    if len(stages) > 1 and growth is not None and growth.stage_lr == 'continue':
        base = _stage_scheduler(optimizer, optim, lr, optim.epochs * updates_per_epoch,
                                optim.warmup_epochs * updates_per_epoch, updates_per_epoch)
        rewarm = RewarmScheduler(base, optimizer, [(start * updates_per_epoch, round(warm * updates_per_epoch), scale)
                                                   for start, _, warm, scale in stages[1:]])
        rewarm.step_update(0)
        return rewarm
    if len(stages) == 1:
        return _stage_scheduler(optimizer, optim, lr, optim.epochs * updates_per_epoch,
                                optim.warmup_epochs * updates_per_epoch, updates_per_epoch)
    scheds = [(start * updates_per_epoch,
               _stage_scheduler(optimizer, optim, lr * scale, (end - start) * updates_per_epoch,
                                warm * updates_per_epoch, updates_per_epoch))
              for start, end, warm, scale in stages]
    staged = StagedScheduler(scheds)
    staged.step_update(0)
    return staged


def _stage_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, lr: float, total: int, warmup: float,
                     updates_per_epoch: int) -> Scheduler:
    """A timm scheduler of ``total`` updates, ``warmup`` of them linear warmup to ``lr``."""
    warmup = min(round(warmup), total - 1)
    for group in optimizer.param_groups:
        group['initial_lr'] = lr
        group['lr'] = lr
    decay = optim.decay_epochs
    decay = decay if (optim.sched in ('wsd', 'rsqrt') and decay < 1) else decay * updates_per_epoch
    # Everything in updates (updates_per_epoch=1): integral warmup and lengths, no float rounding.
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=optim.sched, num_epochs=max(total - 1 - warmup, 1), warmup_epochs=warmup,
        warmup_lr=optim.warmup_lr, warmup_prefix=True, min_lr=optim.min_lr, decay_epochs=decay,
        decay_milestones=[math.ceil(m * updates_per_epoch) for m in optim.decay_milestones],  # t >= m exactly
        decay_rate=optim.decay_rate,
        step_on_epochs=False, updates_per_epoch=1)
    scheduler.step_update(0)
    return scheduler



class RunOptim:
    """The optimizer and schedule of a run, and its growth steps (module docstring).

    Args:
        optim: the config's optim section.
        growth: its growth section.
        lr: the peak learning rate (`resolve_lr`).
        updates_per_epoch: optimizer updates per epoch (the schedule's unit).
        freeze_loaded_tokens: train only the tokens appended to the ``init_from`` weights (and the head).

    Attributes:
        stage_handles: the hooks of the current growth stage: those that freeze the rows of the stage before
            (``growth.freeze_old_tokens``) and those that step its new rows at ``growth.new_token_lr_scale``.
        sets_global_batch: whether the optim section fixes the global batch (``global_batch_size``).
        eval_after_step: whether the run evaluates right after each growth step (``growth.eval_after_step``).
    """

    def __init__(
            self,
            optim: OptimConfig,
            growth: GrowthConfig,
            *,
            lr: float,
            updates_per_epoch: int,
            freeze_loaded_tokens: bool = False,
    ):
        self._optim, self._growth, self.lr, self.updates_per_epoch = optim, growth, lr, updates_per_epoch
        self.freeze_loaded_tokens = freeze_loaded_tokens
        self.sets_global_batch = optim.global_batch_size is not None
        self.eval_after_step = growth.eval_after_step
        self.stage_handles: List[RemovableHandle] = []

    def check(
            self,
            model: torch.nn.Module,
            name: str,
            elastic_fractions: Sequence[float] = (),
    ) -> None:
        """Refuse, before any work, what needs parameter tokens on a model without, and a growth target the
        model cannot reach.

        Raises:
            ConfigError: ``elastic_fractions``, ``growth.freeze_old_tokens`` or ``growth.new_token_lr_scale`` on
                ``model`` (registered as
                ``name``) without parameter tokens, or a growth target it cannot reach (named).
        """
        if elastic_fractions and not elastic.elastic_layers(model):
            raise ConfigError(f'elastic_fractions needs a model with parameter tokens (a TokenFormer); {name} has none')
        if self._growth.freeze_old_tokens and not growth.pattention_layers(model):
            raise ConfigError(f'growth.freeze_old_tokens needs a TokenFormer (parameter tokens to freeze); {name} '
                              'has none')
        if self._growth.new_token_lr_scale != 1.0 and not growth.pattention_layers(model):
            raise ConfigError(f'growth.new_token_lr_scale needs a TokenFormer (new parameter tokens); {name} has none')
        try:  # every growth target checked before any work
            growth.check_reachable(growth.model_size(model), self._growth.schedule,
                                   self._growth.add_tokens if self._growth.every_epochs else None)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def optimizer(self, model: torch.nn.Module, grown_from: Mapping[str, Tuple[int, int]]) -> torch.optim.Optimizer:
        """The optimizer of the optim section over ``model``; with ``freeze_loaded_tokens``, the rows loaded by
        ``init_from`` (``grown_from``: ``{tensor: (old rows, new rows)}``; everything but the head) frozen."""
        opt = build_optimizer(model, self._optim, self.lr)
        if self.freeze_loaded_tokens:
            layers = growth.pattention_layers(model)
            frozen = {layers[k.rsplit('.', 1)[0]][0]: old for k, (old, _) in grown_from.items()}
            growth.freeze_old_tokens(model, frozen, opt)
        return opt

    def scheduler(self, optimizer: torch.optim.Optimizer, num_updates: int = 0) -> UpdateSchedule:
        """The lr schedule of ``optimizer``, set for update ``num_updates``."""
        scheduler = build_scheduler(optimizer, self._optim, self._growth, self.lr, self.updates_per_epoch)
        scheduler.step_update(num_updates)
        return scheduler

    def step(self, state: TrainState) -> None:
        """One optimizer update of ``state``: gradients unscaled and clipped as the optim section says
        (``clip_grad``, ``clip_mode``: timm's ``dispatch_clip_grad``), the scaler's step, then the schedule and the
        EMA follow."""
        if self._optim.clip_grad:
            state.scaler.unscale_(state.optimizer)
            dispatch_clip_grad(state.model.parameters(), self._optim.clip_grad, mode=self._optim.clip_mode)
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.optimizer.zero_grad(set_to_none=True)
        state.num_updates += 1
        state.scheduler.step_update(state.num_updates)
        if state.ema is not None:
            state.ema.update(state.model, step=state.num_updates)

    def due(
            self,
            epochs: int,
            epoch: int,
    ) -> Mapping:
        """What grows after ``epoch`` (of ``epochs``): the ``schedule`` step at ``epoch + 1``, ``{'add': ...}``
        of ``every_epochs``, or ``{}``."""
        g = self._growth
        for step in g.schedule:
            if step['at_epoch'] == epoch + 1:
                return step
        k = g.every_epochs
        if not k or not g.add_tokens or (epoch + 1) % k or epoch + 1 >= epochs:
            return {}
        if g.until_epoch is not None and epoch + 1 >= g.until_epoch:
            return {}
        return dict(add=dict(g.add_tokens))

    def grow(
            self,
            state: TrainState,
            due: Mapping,
            seed: int,
    ) -> dict:
        """Grow ``state``'s model, optimizer state and EMA as ``due`` says (``{'add': {kind: n}}`` or a
        ``growth.schedule`` step), the same new tokens on every rank (``seed``); rewrap.

        After a schedule step the optimizer is rebuilt if ``growth.optimizer_state`` is ``'reset'``,
        the old tokens are frozen if ``growth.freeze_old_tokens``, the new ones step at
        ``growth.new_token_lr_scale``, and the staged lr schedule moves
        on to the new stage (`build_scheduler`).

        Returns:
            the model's `tkvision.growth.model_size` after the step.
        """
        torch.manual_seed(seed)
        g = self._growth
        before = state.size()
        counts = growth.grow_training_state(state.model, state.optimizer, state.ema.module if state.ema else None,
                                            key_init=g.key_init, value_init=g.value_init, to=due.get('to'),
                                            tau=g.tau, **due.get('add', {}))
        if 'at_epoch' in due:
            self._end_stage()  # a reset optimizer covers every parameter, as one built at the start does
            if g.optimizer_state == 'reset':
                state.optimizer = self.optimizer(state.model, state.grown_from)
            self._start_stage(state, before)
            state.scheduler = self.scheduler(state.optimizer, state.num_updates)
        state.wrap()
        return counts

    def resume(
            self,
            state: TrainState,
            checkpoint: dict,
            path: str,
    ) -> None:
        """Restore ``state`` from a ``last.pth`` dict (read from ``path``, named in errors): the model grown to
        the checkpoint's size, the optimizer rebuilt over it (the stage's rows frozen again) and its moments
        loaded, then the state's own parts (``TrainState.restore``); the schedule is rebuilt from the current
        config at the saved update, so changed schedule keys take effect from here on.

        Raises:
            RunError: the checkpoint's token counts differ from the model's and no growth during training
                explains it; its classifier has another number of classes than the model (`_check_head`).
        """
        _check_head(state.model, checkpoint['model'], path)
        counts, g = state.size(), self._growth
        if counts != checkpoint['token_counts']:
            if not (g.every_epochs or g.schedule):
                raise RunError(f"checkpoint token counts {checkpoint['token_counts']} differ from the model's "
                               f'{counts}, and the config grows nothing during training')
            growth.grow_to(state.model, checkpoint['token_counts'])
            if state.ema is not None:
                growth.grow_to(state.ema.module, checkpoint['token_counts'])
        state.model.load_state_dict(checkpoint['model'])
        state.optimizer = self.optimizer(state.model, state.grown_from)
        # the stages reached so far; the current one freezes (or scales) past the size of the one before
        sizes = growth.schedule_sizes(counts, [s for s in g.schedule if s['at_epoch'] <= checkpoint['epochs_done']])
        if len(sizes) > 1:
            self._start_stage(state, sizes[-2])
        state.optimizer.load_state_dict(checkpoint['optimizer'])
        state.restore(checkpoint)
        state.scheduler = self.scheduler(state.optimizer, state.num_updates)
        state.wrap()

    def _end_stage(self):
        """Undo `_start_stage` (hooks removed, gradients back)."""
        for h in self.stage_handles:
            h.remove()
        self.stage_handles = []

    def _start_stage(self, state: TrainState, old_size: Mapping[str, int]):
        """The hooks of a stage whose rows past ``old_size`` are new: ``growth.freeze_old_tokens`` trains only
        those rows (+ head), ``growth.new_token_lr_scale`` steps them at that multiple of the lr."""
        self._end_stage()
        if self._growth.freeze_old_tokens:
            self.stage_handles += growth.freeze_old_tokens(state.model, old_size, state.optimizer)
        if self._growth.new_token_lr_scale != 1.0:
            self.stage_handles += growth.scale_new_token_updates(state.model, old_size, state.optimizer,
                                                                 self._growth.new_token_lr_scale)


def _check_head(model: torch.nn.Module, weights: dict, path: str):
    """Refuse, naming the key to set, a checkpoint whose classifier ``head.weight`` (``[classes, embed_dim]``)
    has another number of classes than ``model`` (built from the config), such as a checkpoint with timm's
    1000-way head resumed on a class folder of fewer classes; PyTorch's own size-mismatch error does not say
    what to do.

    Raises:
        RunError: naming ``path``, both class counts and ``model_kwargs: {num_classes: N}``.
    """
    head, classes = weights.get('head.weight'), getattr(model, 'num_classes', None)
    if head is None or classes is None or head.shape[0] == classes:
        return
    raise RunError(f'{path} holds a classifier of {head.shape[0]} classes; the model of this config has {classes} '
                   f'(model_kwargs.num_classes, else the dataset\'s classes): to continue this run set '
                   f'model_kwargs: {{num_classes: {head.shape[0]}}}')
