"""Training: the MAE supervised recipe, MAE pretraining and fine-tuning, linear probing (and small
real-data recipes) on one process or many.

``task`` selects what is trained: ``classify`` (a classifier on labels), ``mae`` (a
:class:`~tkvision.models.mae.MaskedAutoencoder` around ``model``; the loss is the reconstruction
error, labels are not used, evaluation reports the validation reconstruction loss with fixed masks,
and ``reconstruction.png`` is written at the end) or ``linprobe`` (the ``init_from`` encoder frozen,
MAE's BatchNorm + linear head trained). ``init_from`` an MAE checkpoint loads its encoder
(:func:`tkvision.models.mae.load_encoder`, reporting what was loaded and dropped).

Glue over timm and PyTorch: ``timm.create_model``, ``create_optimizer_v2`` and ``create_scheduler_v2``
(:mod:`tkvision.optim`), ``timm.data.Mixup``, timm's label-smoothing / soft-target losses,
``timm.utils.ModelEmaV3``, ``dispatch_clip_grad``, ``torch.autocast`` with a ``GradScaler`` that is
a no-op unless fp16, ``DistributedDataParallel`` under ``torchrun`` or SLURM, tqdm and TensorBoard.

The loop is three pieces around one state object: :func:`train_one_epoch` (the batches, gradient
accumulation, the optimizer steps), :func:`evaluate_and_keep_best` and :func:`log_epoch`;
:class:`TrainState` holds everything that is saved (model, optimizer, scheduler, scaler, EMA,
counters, best) and restores itself.

What a pre-empted or killed run does: ``last.pth`` is written atomically at every ``save_every``
epochs, every ``checkpoint_every_steps`` updates, when ``checkpoint_every_minutes`` have passed,
and on SIGTERM or SIGUSR1 (what SLURM and torchrun send before stopping a job), after which the
run exits with :data:`EXIT_PREEMPTED`. ``--resume`` continues at the exact update: the sampler
skips the batches already trained and every random draw is seeded from (seed, epoch, sample or
batch index), so the result is bit-identical to an uninterrupted run for any ``num_workers``.

Outputs in ``cfg['output']`` (rank 0 only): ``config.yaml``, ``last.pth`` (full state),
``last.safetensors`` and ``best.safetensors`` (weights), ``metrics.csv``, ``curves.png``, ``tb/``.
"""
import argparse
import csv
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import yaml
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3, dispatch_clip_grad, random_seed
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from . import growth
from .checkpoint import atomic_save, load_state, load_state_dict_file, save_weights
from .config import ConfigError, config_changes, load_config, resolve_accum_steps, resolve_lr, validate_config
from .data import (BatchPreprocessor, batches_per_epoch, build_dataset, build_loader, dataset_classes, dataset_size,
                   resolve_data_cfg, set_loader_epoch)
from .evaluate import evaluate, evaluate_mae
from .models import mae
from .optim import build_optimizer, build_scheduler
from .plotting import plot_curves
from .rundir import claim_output_dir
from .runtime import RunError, all_ranks_agree, build_model, cli, init_distributed, seed_step, setup_threads

__all__ = ['train', 'TrainState', 'train_one_epoch', 'evaluate_and_keep_best', 'log_epoch', 'NonFiniteLossError',
           'Preempted', 'EXIT_PREEMPTED', 'main']

#: Exit status after a checkpoint written on SIGTERM / SIGUSR1 (sysexits' EX_TEMPFAIL: "try again").
EXIT_PREEMPTED = 75
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message gives the update range and, if one
    exists, the last good checkpoint."""


class Preempted(RuntimeError):
    """The run was asked to stop (SIGTERM / SIGUSR1); its state was saved to ``last.pth``."""


def _ignore_stop_signals(_worker_id):
    """DataLoader workers leave SIGTERM / SIGUSR1 to the main process, which stops them itself after
    checkpointing (SLURM signals every process of a job step)."""
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


class TrainState:
    """Everything a run needs to continue exactly, with :meth:`state_dict` / :meth:`load_state_dict`.

    Attributes:
        model, optimizer, scheduler, scaler (a no-op unless fp16), ema (``ModelEmaV3`` or None).
        epochs_done: completed epochs. batches_done: micro-batches of epoch ``epochs_done`` already
            trained (always at an optimizer-update boundary). num_updates: optimizer updates so far.
        best: ``dict(top1, epoch, source)`` of the best evaluation (``val_loss`` for ``task: mae``). meter: the running epoch's sums.
    """

    def __init__(self, cfg: dict, device, world: int, updates_per_epoch: int):
        self.cfg, self.device, self.world, self.updates_per_epoch = cfg, device, world, updates_per_epoch
        self.model = build_model(cfg).to(device)
        self.grown_from, self.init_report = {}, ''
        self.freeze_handles = []  # growth.freeze_old_tokens: hooks of the current stage
        if cfg['growth']['freeze_old_tokens'] and not growth.pattention_layers(self.model):
            raise ConfigError(f"growth.freeze_old_tokens needs a TokenFormer (parameter tokens to freeze); "
                              f"{cfg['model']} has none")
        if cfg['init_from']:
            self._init_from(cfg['init_from'])
        if cfg['task'] == 'linprobe':
            mae.linear_probe(self.model)
        if cfg['grad_checkpointing']:
            self.model.set_grad_checkpointing(True)
        self.lr = resolve_lr(cfg, world)
        self.optimizer = self._make_optimizer()
        self.scheduler = build_scheduler(self.optimizer, cfg, self.lr, updates_per_epoch)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg['amp'] == 'fp16')
        self.ema = ModelEmaV3(self.model, decay=cfg['model_ema_decay']) if cfg['model_ema'] else None
        self.epochs_done = self.batches_done = self.num_updates = 0
        # the best evaluation: highest top-1, or for MAE the lowest validation reconstruction loss
        self.best = (dict(val_loss=math.inf, epoch=-1, source='model') if cfg['task'] == 'mae'
                     else dict(top1=-1.0, epoch=-1, source='model'))
        self.reset_meter()
        self.wrap()

    def _init_from(self, path: str):
        """Start from the weights at ``path``: an MAE checkpoint's encoder for a classifier
        (:func:`~tkvision.models.mae.load_encoder`), else a same-size or smaller model's weights
        (smaller TokenFormers are grown into the first rows, :func:`~tkvision.growth.load_grown_state_dict`)."""
        weights = load_state_dict_file(path)
        if mae.is_mae_state_dict(weights) and self.cfg['task'] != 'mae':
            rep = mae.load_encoder(self.model, weights)
            self.grown_from = rep['grown']
            self.init_report = (f"MAE encoder from {path}: loaded {len(rep['loaded'])} tensors, dropped "
                                f"{len(rep['dropped'])} ({_names(rep['dropped'])}), kept the init of "
                                f"{_names(rep['kept_init']) or 'nothing'}")
        else:
            self.grown_from = growth.load_grown_state_dict(self.model, weights)
            self.init_report = f'init_from {path}' + (f', grown from init_from: {self.grown_from}' if self.grown_from else '')

    def _make_optimizer(self):
        opt = build_optimizer(self.model, self.cfg, self.lr)
        if self.cfg['freeze_old_tokens']:
            frozen = {growth.layer_kind(k.rsplit('.', 1)[0]): old for k, (old, _) in self.grown_from.items()}
            growth.freeze_old_tokens(self.model, frozen, opt)
        return opt

    def reset_meter(self, loss_sum=0.0, seen=0, skipped=0, seconds=0.0):
        """The running epoch's sums: loss (on the device, no host sync per step), images, skipped images."""
        self.meter = dict(loss_sum=torch.tensor(float(loss_sum), device=self.device, dtype=torch.float64),
                          nonfinite=torch.zeros((), device=self.device, dtype=torch.bool),
                          seen=seen, skipped=skipped, seconds=seconds)

    def wrap(self):
        """(Re)build the compiled / DDP forward (``self.net``) over the current parameters."""
        net = torch.compile(self.model) if self.cfg['compile'] else self.model
        if self.world > 1:
            net = DDP(net, device_ids=[self.device.index] if self.device.type == 'cuda' else None)
        self.net = net

    def grow(self, due: dict, seed: int):
        """Grow model, optimizer state and EMA as ``due`` says (``{'add': {kind: n}}`` or a
        ``growth.schedule`` step), the same new tokens on every rank; rewrap.

        After a schedule step the optimizer is rebuilt if ``growth.optimizer_state`` is ``'reset'``,
        the old tokens are frozen if ``growth.freeze_old_tokens``, and the staged lr schedule moves
        on to the new stage (:mod:`tkvision.optim`). Returns :func:`~tkvision.growth.model_size`.
        """
        torch.manual_seed(seed)
        g = self.cfg['growth']
        before = growth.model_size(self.model)
        counts = growth.grow_training_state(self.model, self.optimizer, self.ema.module if self.ema else None,
                                            key_init=g['key_init'], value_init=g['value_init'], to=due.get('to'),
                                            **due.get('add', {}))
        if 'at_epoch' in due:
            if g['optimizer_state'] == 'reset':
                self.optimizer = self._make_optimizer()
            self._freeze_stage(before)
            self.scheduler = build_scheduler(self.optimizer, self.cfg, self.lr, self.updates_per_epoch)
            self.scheduler.step_update(self.num_updates)
        self.wrap()
        return counts

    def _freeze_stage(self, old_size: dict):
        """``growth.freeze_old_tokens``: train only the rows appended since ``old_size`` (+ head)."""
        if not self.cfg['growth']['freeze_old_tokens']:
            return
        for h in self.freeze_handles:
            h.remove()
        self.freeze_handles = growth.freeze_old_tokens(self.model, old_size, self.optimizer)

    def state_dict(self) -> dict:
        m = self.meter
        return dict(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                    scaler=self.scaler.state_dict(), model_ema=self.ema.module.state_dict() if self.ema else None,
                    epochs_done=self.epochs_done, batches_done=self.batches_done, num_updates=self.num_updates,
                    best=self.best, token_counts=growth.model_size(self.model), config=self.cfg,
                    meter=dict(loss_sum=m['loss_sum'].item(), seen=m['seen'], skipped=m['skipped'],
                               seconds=m['seconds']))

    def load_state_dict(self, state: dict):
        """Restore from :meth:`state_dict`; the schedule is rebuilt from the current config at the
        saved update, so changed schedule keys take effect from here on.

        Raises:
            RunError: the checkpoint's token counts differ from the model's and no growth during
                training explains it.
        """
        counts, g = growth.model_size(self.model), self.cfg['growth']
        if counts != state['token_counts']:
            if not (g['every_epochs'] or g['schedule']):
                raise RunError(f"checkpoint token counts {state['token_counts']} differ from the model's {counts}, "
                               'and the config grows nothing during training')
            growth.grow_to(self.model, state['token_counts'])
            if self.ema is not None:
                growth.grow_to(self.ema.module, state['token_counts'])
        self.model.load_state_dict(state['model'])
        self.optimizer = self._make_optimizer()
        # the stages reached so far; the current one freezes the size of the one before
        sizes = growth.schedule_sizes(counts, [s for s in g['schedule'] if s['at_epoch'] <= state['epochs_done']])
        if len(sizes) > 1:
            self._freeze_stage(sizes[-2])
        self.optimizer.load_state_dict(state['optimizer'])
        self.scaler.load_state_dict(state['scaler'])
        if self.ema is not None and state['model_ema']:
            self.ema.module.load_state_dict(state['model_ema'])
        self.epochs_done, self.batches_done = state['epochs_done'], state['batches_done']
        self.num_updates, self.best = state['num_updates'], state['best']
        self.reset_meter(**state['meter'])
        self.scheduler = build_scheduler(self.optimizer, self.cfg, self.lr, self.updates_per_epoch)
        self.scheduler.step_update(self.num_updates)
        self.wrap()


class _Run:
    """What a run uses but does not save: config, processes, data, loss, output and stop handling."""

    def __init__(self, cfg, rank, world, device):
        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        self.main = rank == 0
        self.out = cfg['output']
        self.ckpt_path = os.path.join(self.out, 'last.pth')
        self.train_ds = build_dataset(cfg, 'train', rank, world)
        self.val_ds = build_dataset(cfg, 'val', rank, world, class_to_idx=dataset_classes(self.train_ds))
        self.accum = resolve_accum_steps(cfg, world)
        global_batch = cfg['batch_size'] * self.accum * world
        if dataset_size(self.train_ds) < global_batch:
            raise ConfigError(f'the training set has {dataset_size(self.train_ds)} images, fewer than one global batch '
                              f"({global_batch} = batch_size {cfg['batch_size']} x accum_steps {self.accum} x "
                              f'{world} processes): lower batch_size or raise train_subset')
        self.train_loader = build_loader(self.train_ds, cfg, train=True, rank=rank, world_size=world)
        self.train_loader.worker_init_fn = _ignore_stop_signals
        self.val_loader = build_loader(self.val_ds, cfg, train=False, rank=rank, world_size=world)
        self.batches_per_epoch = batches_per_epoch(self.train_loader)
        if self.batches_per_epoch < 1:
            raise ConfigError(f"one epoch holds no full batch of {cfg['batch_size']} per process and loader worker: "
                              'lower batch_size or num_workers')
        self.updates_per_epoch = math.ceil(self.batches_per_epoch / self.accum)
        self.preprocess = BatchPreprocessor(cfg['mean'], cfg['std'], device, reprob=cfg['reprob'])
        self.amp_dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(cfg['amp'])
        self.mixup = self.criterion = None  # set by _start once the model (and its num_classes) exists
        self.stop_signal = None
        self.last_save = time.monotonic()
        self.checked_update = 0  # the loss is known finite up to this update
        self.writer = None

    def on_signal(self, signum, _frame):
        self.stop_signal = signal.Signals(signum).name

    def save(self, state: TrainState):
        """Write ``last.pth`` (rank 0, atomic) and restart the checkpoint clock."""
        if self.main:
            atomic_save(state.state_dict(), self.ckpt_path)
        self.last_save = time.monotonic()

    def check(self, state: TrainState, force: bool = False) -> bool:
        """At a sync point (every ``log_interval`` / ``checkpoint_every_steps`` updates, or ``force``):
        one host synchronisation that checks the loss of the updates since the last check on every
        rank, agrees on a stop signal and on a time-based checkpoint, and writes it if due.

        Returns:
            True when the run must stop (a stop signal on any rank); the checkpoint is then written.

        Raises:
            NonFiniteLossError: a NaN / inf loss since the last check (nothing is saved after it).
        """
        cfg, u = self.cfg, state.num_updates
        every = cfg['checkpoint_every_steps']
        step_due = bool(every) and u % every == 0
        if not (force or step_due or u % cfg['log_interval'] == 0 or (self.world == 1 and self.stop_signal)):
            return False
        minutes = cfg['checkpoint_every_minutes']
        time_due = bool(minutes) and time.monotonic() - self.last_save >= 60 * minutes
        flags = torch.cat([state.meter['nonfinite'].float().view(1),
                           torch.tensor([float(bool(self.stop_signal)), float(time_due)], device=self.device)])
        if self.world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        nonfinite, stop, time_due = (bool(v) for v in flags.tolist())
        if nonfinite:
            last = (f'the last good checkpoint is {self.ckpt_path}' if os.path.isfile(self.ckpt_path)
                    else 'no checkpoint was written before it')
            raise NonFiniteLossError(f'the training loss became NaN or infinite between updates {self.checked_update + 1} '
                                     f'and {u} (epoch {state.epochs_done + 1}); stopping: {last}')
        self.checked_update = u
        if (step_due or time_due or stop) and not force:
            self.save(state)
        return stop


def _loss(cfg: dict, num_classes: int):
    """``(mixup or None, criterion)``: timm's Mixup/CutMix with soft-target cross-entropy, label
    smoothing, or plain cross-entropy."""
    if cfg['mixup'] > 0 or cfg['cutmix'] > 0:
        return (Mixup(mixup_alpha=cfg['mixup'], cutmix_alpha=cfg['cutmix'], prob=cfg['mixup_prob'],
                      switch_prob=cfg['mixup_switch_prob'], label_smoothing=cfg['smoothing'], num_classes=num_classes),
                SoftTargetCrossEntropy())
    if cfg['smoothing'] > 0:
        return None, LabelSmoothingCrossEntropy(cfg['smoothing'])
    return None, torch.nn.CrossEntropyLoss()


def _window(i: int, n: int, accum: int) -> int:
    """Micro-batches in the accumulation window of batch ``i`` of an ``n``-batch epoch: ``accum``, or
    the remainder for the epoch's last window (windows never cross an epoch boundary)."""
    return min(accum, n - (i // accum) * accum)


def train_one_epoch(run: _Run, state: TrainState, epoch: int) -> dict:
    """Train epoch ``epoch`` from micro-batch ``state.batches_done`` to its end.

    Each accumulation window of ``w`` micro-batches scales its losses by ``1 / w`` and ends in one
    optimizer update, so the last, partial window of an epoch is a full-weight update of its own
    batches. Host synchronisations happen only at :meth:`_Run.check` points.

    Returns:
        ``dict(train_loss, img_per_s, epoch_time, lr, skipped)`` over the whole epoch (all ranks).

    Raises:
        Preempted: a stop signal arrived (the checkpoint is written first).
        NonFiniteLossError: see :meth:`_Run.check`.
    """
    cfg, n, accum, meter = run.cfg, run.batches_per_epoch, run.accum, state.meter
    set_loader_epoch(run.train_loader, epoch, start_batch=state.batches_done)
    state.optimizer.zero_grad(set_to_none=True)
    state.net.train()
    bar = tqdm(total=n, initial=state.batches_done, desc=f"epoch {epoch + 1}/{cfg['epochs']}", leave=False,
               disable=not (run.main and cfg['progress']), dynamic_ncols=True)
    t0 = time.perf_counter() - meter['seconds']
    for i, (images, labels, bad) in enumerate(run.train_loader, start=state.batches_done):
        seed_step(cfg['seed'], epoch, i, run.rank)
        meter['skipped'] += len(bad)
        update = (i + 1) % accum == 0 or i + 1 == n
        if images is not None:
            _forward_backward(run, state, images, labels, scale=1.0 / _window(i, n, accum), sync_grads=update)
        bar.update(1)
        if not update:
            continue
        _optimizer_step(run, state)
        state.batches_done = i + 1
        meter['seconds'] = time.perf_counter() - t0
        if run.check(state):
            raise Preempted(f'stopped by {run.stop_signal} at update {state.num_updates}; state saved to '
                            f'{run.ckpt_path}: continue with --resume')
        if bar.n and state.num_updates % cfg['log_interval'] == 0 and not bar.disable:
            bar.set_postfix(loss=f"{meter['loss_sum'].item() / max(meter['seen'], 1):.3f}",
                            lr=f"{state.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{meter['seen'] * run.world / max(meter['seconds'], 1e-9):.0f}")
    bar.close()
    run.check(state, force=True)
    stats = torch.tensor([meter['loss_sum'].item(), meter['seen'], meter['skipped']], dtype=torch.float64,
                         device=run.device)
    if run.world > 1:
        dist.all_reduce(stats)
    loss_sum, seen, skipped = stats.tolist()
    return dict(train_loss=loss_sum / max(seen, 1), img_per_s=seen / max(meter['seconds'], 1e-9),
                epoch_time=meter['seconds'], lr=state.optimizer.param_groups[0]['lr'], skipped=int(skipped))


def _forward_backward(run: _Run, state: TrainState, images, labels, scale: float, sync_grads: bool):
    images = run.preprocess(images, train=True)
    if run.cfg['task'] == 'mae':  # the masks are drawn from the micro-batch's seed (exact resume)
        with torch.autocast(run.device.type, dtype=run.amp_dtype, enabled=run.amp_dtype is not None):
            loss = state.net(images)[0]
    else:
        labels = labels.to(run.device, non_blocking=True)
        if run.mixup is not None:
            if len(images) % 2:  # timm's Mixup needs an even batch (a skipped image can make it odd)
                images, labels = images[:-1], labels[:-1]
            images, labels = run.mixup(images, labels)
        with torch.autocast(run.device.type, dtype=run.amp_dtype, enabled=run.amp_dtype is not None):
            loss = run.criterion(state.net(images), labels)
    state.meter['nonfinite'] |= ~torch.isfinite(loss.detach())
    state.meter['loss_sum'] += loss.detach().double() * len(images)
    state.meter['seen'] += len(images)
    if run.world > 1 and not sync_grads:
        with state.net.no_sync():
            state.scaler.scale(loss * scale).backward()
    else:
        state.scaler.scale(loss * scale).backward()


def _optimizer_step(run: _Run, state: TrainState):
    if run.cfg['clip_grad']:
        state.scaler.unscale_(state.optimizer)
        dispatch_clip_grad(state.model.parameters(), run.cfg['clip_grad'], mode=run.cfg['clip_mode'])
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.num_updates += 1
    state.scheduler.step_update(state.num_updates)
    if state.ema is not None:
        state.ema.update(state.model, step=state.num_updates)


def evaluate_and_keep_best(run: _Run, state: TrainState, epoch: int) -> dict:
    """Evaluate the model (and the EMA model); save ``best.safetensors`` when either beats the best.

    Returns:
        ``dict(top1, top5, val_loss, val_skipped[, ema_top1, ema_top5])``; for ``task: mae``
        ``dict(val_loss, val_skipped[, ema_val_loss])`` (reconstruction loss, the same masks every time).
    """
    if run.cfg['task'] == 'mae':
        return _evaluate_mae_and_keep_best(run, state, epoch)
    ev = evaluate(state.net, run.val_loader, run.device, run.preprocess, run.cfg['amp'])
    res = dict(top1=ev['top1'], top5=ev['top5'], val_loss=ev['loss'], val_skipped=ev['skipped'])
    candidates = [('model', ev['top1'], state.model)]
    if state.ema is not None:
        ev_ema = evaluate(state.ema.module, run.val_loader, run.device, run.preprocess, run.cfg['amp'])
        res.update(ema_top1=ev_ema['top1'], ema_top5=ev_ema['top5'])
        candidates.append(('ema', ev_ema['top1'], state.ema.module))
    source, top1, net = max(candidates, key=lambda c: c[1])
    if top1 > state.best['top1']:
        state.best = dict(top1=top1, epoch=epoch, source=source)
        if run.main:
            save_weights(net.state_dict(), os.path.join(run.out, 'best.safetensors'),
                         metadata=dict(model=run.cfg['model'], epoch=epoch, top1=top1, source=source))
    return res


def _evaluate_mae_and_keep_best(run: _Run, state: TrainState, epoch: int) -> dict:
    ev = evaluate_mae(state.net, run.val_loader, run.device, run.preprocess, run.cfg['amp'], run.cfg['seed'])
    res = dict(val_loss=ev['loss'], val_skipped=ev['skipped'])
    candidates = [('model', ev['loss'], state.model)]
    if state.ema is not None:
        ev_ema = evaluate_mae(state.ema.module, run.val_loader, run.device, run.preprocess, run.cfg['amp'],
                              run.cfg['seed'])
        res['ema_val_loss'] = ev_ema['loss']
        candidates.append(('ema', ev_ema['loss'], state.ema.module))
    source, loss, net = min(candidates, key=lambda c: c[1])
    if loss < state.best['val_loss']:
        state.best = dict(val_loss=loss, epoch=epoch, source=source)
        if run.main:
            save_weights(net.state_dict(), os.path.join(run.out, 'best.safetensors'),
                         metadata=dict(model=run.cfg['model'], task='mae', epoch=epoch, val_loss=loss, source=source))
    return res


def _names(names, limit: int = 4) -> str:
    """``a, b, c, d and 3 more`` (module-level prefixes merged: ``decoder.*``)."""
    heads = []
    for n in names:
        parts = n.split('.')
        head = '.'.join(parts[:2 if parts[0] == 'encoder' else 1]) + ('.*' if '.' in n else '')
        if head not in heads:
            heads.append(head)
    return ', '.join(heads[:limit]) + (f' and {len(heads) - limit} more' if len(heads) > limit else '')


def _growth_due(cfg: dict, epoch: int) -> dict:
    """What grows after ``epoch``: the ``growth.schedule`` step at ``epoch + 1``, ``{'add': ...}`` of
    ``growth.every_epochs``, or ``{}``."""
    g = cfg['growth']
    for step in g['schedule']:
        if step['at_epoch'] == epoch + 1:
            return step
    k = g['every_epochs']
    if not k or not g['add_tokens'] or (epoch + 1) % k or epoch + 1 >= cfg['epochs']:
        return {}
    if g['until_epoch'] is not None and epoch + 1 >= g['until_epoch']:
        return {}
    return dict(add=dict(g['add_tokens']))


def log_epoch(run: _Run, history: list, res: dict):
    """Append ``res`` to ``metrics.csv`` (atomically rewritten), TensorBoard and one printed line (rank 0)."""
    if not run.main:
        return
    history.append(res)
    _write_metrics(os.path.join(run.out, 'metrics.csv'), history)
    if run.writer is not None:
        for k, v in res.items():
            if isinstance(v, (int, float)):
                run.writer.add_scalar(k, v, res['epoch'] + 1)
    skipped = res['skipped'] + res.get('val_skipped', 0)
    tqdm.write(f"epoch {res['epoch'] + 1}/{run.cfg['epochs']}  train loss {res['train_loss']:.4f}  "
               + (f"val top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  " if 'top1' in res else '')
               + (f"val loss {res['val_loss']:.4f}  " if 'top1' not in res and 'val_loss' in res else '')
               + (f"ema top-1 {res['ema_top1']:.2f}%  " if 'ema_top1' in res else '')
               + f"{res['img_per_s']:.0f} img/s  {res['epoch_time']:.1f}s"
               + (f'  skipped {skipped} unreadable images' if skipped else '')
               + (f"  grew to {res['grown']}" if 'grown' in res else ''))


def _write_metrics(path, history):
    keys = []
    for row in history:
        keys += [k for k in row if k not in keys]
    tmp = path + '.tmp'
    with open(tmp, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(history)
    os.replace(tmp, path)


def _resume(run: _Run, state: TrainState, resume) -> list:
    """Load the checkpoint into ``state``; check and report config changes; return the metrics history."""
    path = run.ckpt_path if resume is True else resume
    if not os.path.isfile(path):
        raise RunError(f'nothing to resume: no checkpoint at {path}')
    ckpt = load_state(path)
    allowed, forbidden = config_changes(ckpt['config'], run.cfg)
    if forbidden:
        raise ConfigError('these keys cannot change when resuming (they fix the model, the data or the sample '
                          'order; start a new run with another --output instead): ' + '; '.join(forbidden))
    state.load_state_dict(ckpt)
    if run.main:
        print(f'resumed from {path} at epoch {state.epochs_done + 1}, batch {state.batches_done}, update '
              f'{state.num_updates}' + ('; changed: ' + '; '.join(allowed) if allowed else ''))
    metrics = os.path.join(run.out, 'metrics.csv')
    if not (run.main and os.path.exists(metrics)):
        return []
    with open(metrics) as f:
        return [r for r in csv.DictReader(f) if int(r['epoch']) < state.epochs_done]


def _start(cfg: dict, resume):
    """Processes, output directory (locked, rank 0), data and state; every rank fails if one does."""
    cfg = resolve_data_cfg(validate_config(cfg))
    setup_threads(cfg)
    rank, world, device = init_distributed(cfg)
    lock, error = None, None
    if rank == 0:
        try:
            lock = claim_output_dir(cfg['output'], resume=bool(resume))
        except RunError as e:
            error = e
    if not all_ranks_agree(error is None, device):
        raise error or RunError('rank 0 could not claim the output directory (see its message)')
    try:
        random_seed(cfg['seed'])  # the same initial weights on every rank
        run = _Run(cfg, rank, world, device)
        state = TrainState(cfg, device, world, run.updates_per_epoch)
        if cfg['task'] != 'mae':
            run.mixup, run.criterion = _loss(cfg, state.model.num_classes)
        history = _resume(run, state, resume) if resume else []
        run.checked_update = state.num_updates
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if run.main:
        atomic_yaml(cfg, os.path.join(run.out, 'config.yaml'))
        if cfg['tensorboard']:
            from torch.utils.tensorboard import SummaryWriter
            run.writer = SummaryWriter(os.path.join(run.out, 'tb'))
        n_params = sum(p.numel() for p in state.model.parameters())
        print(f"{cfg['model']}: {n_params / 1e6:.2f}M params, {dataset_size(run.train_ds)} train / "
              f"{dataset_size(run.val_ds)} val images, "
              f"{world} process(es) on {device}, global batch {cfg['batch_size'] * run.accum * world}, "
              f"{run.updates_per_epoch} updates/epoch, lr {state.lr:.3g}, task {cfg['task']}"
              + (f'\n{state.init_report}' if state.init_report else ''))
    return cfg, run, state, history, lock


def atomic_yaml(obj, path: str):
    """Write ``obj`` as YAML through a temporary file and a rename."""
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        yaml.safe_dump(obj, f, sort_keys=False)
    os.replace(tmp, path)


def train(cfg: dict, resume=None) -> dict:
    """Train as ``cfg`` says; returns ``dict(top1, top5, best_top1, epochs, output, model, history)``.

    Args:
        cfg: a config from :func:`tkvision.config.load_config` (checked again here).
        resume: a ``last.pth`` path, ``True`` for ``<output>/last.pth``, or None. The run continues at
            the saved update (mid-epoch included) with the same data order and random draws, so the
            result equals an uninterrupted run's. Keys of :data:`tkvision.config.RESUME_MUTABLE`
            may differ from the checkpoint's (reported); any other difference is an error.

    Raises:
        ConfigError: a bad setting, or a key that cannot change on resume (named).
        RunError: the output directory holds another run or is locked by a running one.
        NonFiniteLossError: NaN/inf loss (update range named; the last checkpoint is left intact).
        Preempted: SIGTERM / SIGUSR1 arrived; ``last.pth`` was written first.
        FileNotFoundError: missing data (naming the path and how to get it).
    """
    cfg, run, state, history, lock = _start(cfg, resume)
    previous = {s: signal.signal(s, run.on_signal) for s in _STOP_SIGNALS}
    try:
        if state.epochs_done >= cfg['epochs'] and run.main:
            print(f"nothing to train: {run.ckpt_path} has finished all {cfg['epochs']} epochs "
                  f"(best {_best_words(state.best)}); pass --epochs N with N > {cfg['epochs']} to continue")
        for epoch in range(state.epochs_done, cfg['epochs']):
            res = dict(epoch=epoch, **train_one_epoch(run, state, epoch))
            last_epoch = epoch + 1 == cfg['epochs']
            if (epoch + 1) % cfg['eval_every'] == 0 or last_epoch:
                res.update(evaluate_and_keep_best(run, state, epoch))
            res['tokens'] = sum(growth.model_size(state.model).values())
            add = _growth_due(cfg, epoch)
            if add:
                # a different, reproducible seed for every growth step, the same on every rank
                res['grown'] = str(state.grow(add, seed=cfg['seed'] + 7919 * (epoch + 1)))
            state.epochs_done, state.batches_done = epoch + 1, 0
            state.reset_meter()
            log_epoch(run, history, res)
            stop = run.check(state, force=True)  # all ranks agree on a signal that came during evaluation
            if (epoch + 1) % cfg['save_every'] == 0 or last_epoch or stop:
                run.save(state)
                if run.main:
                    save_weights((state.ema.module if state.ema else state.model).state_dict(),
                                 os.path.join(run.out, 'last.safetensors'), metadata=dict(model=cfg['model'], epoch=epoch))
            if stop:
                raise Preempted(f'stopped by {run.stop_signal} after epoch {epoch + 1}; state saved to '
                                f'{run.ckpt_path}: continue with --resume')
        if run.main and history:
            plot_curves(history, os.path.join(run.out, 'curves.png'), title=f"{cfg['model']} ({cfg['task']})")
        if run.main and cfg['task'] == 'mae' and cfg['recon_images']:
            from .mae_visualize import save_reconstructions
            save_reconstructions(state.ema.module if state.ema else state.model, run.val_ds, cfg,
                                 os.path.join(run.out, 'reconstruction.png'), cfg['recon_images'], run.device)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if run.writer is not None:
            run.writer.close()
        if lock is not None:
            lock.release()
    last = history[-1] if history else {}
    return dict(top1=_num(last.get('top1')), top5=_num(last.get('top5')), best_top1=state.best.get('top1'),
                val_loss=_num(last.get('val_loss')), epochs=cfg['epochs'], output=run.out, model=state.model,
                history=history)


def _num(v):
    return None if v in (None, '') else float(v)


def _best_words(best: dict) -> str:
    return f"top-1 {best['top1']:.2f}%" if 'top1' in best else f"val loss {best['val_loss']:.4f}"


def parse_args(argv=None):
    """``--config``, ``--data-dir``, ``--resume [PATH]``; every other ``--key value`` overrides the config."""
    ap = argparse.ArgumentParser(description='Train a TokenFormer ViT (or any timm model).', allow_abbrev=False)
    ap.add_argument('--config', help='YAML recipe (configs/...)')
    ap.add_argument('--data-dir', help='dataset root (ImageNet folder with train/ and val/)')
    ap.add_argument('--resume', nargs='?', const=True, default=None,
                    help='continue from <output>/last.pth, or from PATH')
    args, rest = ap.parse_known_args(argv)
    if args.data_dir:
        rest += ['--data_dir', args.data_dir]
    return load_config(args.config, rest), args.resume


def _main(argv) -> int:
    cfg, resume = parse_args(argv)
    t0 = time.perf_counter()
    try:
        res = train(cfg, resume=resume)
    except Preempted as e:
        print(str(e), file=sys.stderr)
        return EXIT_PREEMPTED
    if (not dist.is_initialized() or dist.get_rank() == 0) and res['top1'] is None and res['val_loss'] is not None:
        out = res['output']
        print(f"done in {(time.perf_counter() - t0) / 60:.1f} min: final val reconstruction loss "
              f"{res['val_loss']:.4f}\n  weights: {os.path.join(out, 'last.safetensors')} (fine-tune with "
              f"init_from: {os.path.join(out, 'last.safetensors')})\n  reconstructions: "
              f"{os.path.join(out, 'reconstruction.png')}\n  curves:  {os.path.join(out, 'curves.png')}")
    elif (not dist.is_initialized() or dist.get_rank() == 0) and res['top1'] is not None:
        out = res['output']
        print(f"done in {(time.perf_counter() - t0) / 60:.1f} min: final test top-1 {res['top1']:.2f}% "
              f"(best {res['best_top1']:.2f}%)\n  weights: {os.path.join(out, 'best.safetensors')} "
              f"(last: {os.path.join(out, 'last.safetensors')}, state: {os.path.join(out, 'last.pth')})\n"
              f"  curves:  {os.path.join(out, 'curves.png')}\n  metrics: {os.path.join(out, 'metrics.csv')}")
    return 0


def main(argv=None) -> int:
    """``tkvision-train`` / ``tools/train.py``: one line per user error (``--debug`` for the traceback);
    exit 0 when done, 2 on a bad setting, :data:`EXIT_PREEMPTED` after a stop signal's checkpoint."""
    return cli(_main, argv)


if __name__ == '__main__':
    sys.exit(main())
