"""Training: the MAE supervised recipe (and small real-data recipes) on one process or many.

Glue over timm and PyTorch: ``timm.create_model``, ``timm.optim.create_optimizer_v2`` (AdamW, no
weight decay on 1-d parameters, class token and position embedding; layer-wise lr decay),
``timm.scheduler.CosineLRScheduler`` stepped per optimizer update, ``timm.data.Mixup``, timm's
label-smoothing / soft-target losses, ``timm.utils.ModelEmaV3``, ``torch.autocast``,
``DistributedDataParallel`` under ``torchrun`` (NCCL on GPU, gloo on CPU), tqdm and TensorBoard.

Outputs in ``cfg['output']`` (rank 0 only): ``config.yaml``, ``last.pth`` (full training state,
written atomically every ``save_every`` epochs), ``last.safetensors`` and ``best.safetensors``
(weights), ``metrics.csv``, ``curves.png``, and ``tb/`` with ``tensorboard: true``.
"""
import argparse
import contextlib
import csv
import os
import random
import sys
import time

import numpy as np
import timm
import torch
import torch.distributed as dist
import yaml
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from . import growth
from .checkpoint import atomic_save, load_state, load_state_dict_file, save_weights
from .config import ConfigError, load_config, resolve_accum_steps, resolve_lr
from .data import build_dataset, build_loader
from .evaluate import evaluate
from .plotting import plot_curves

__all__ = ['train', 'build_model', 'resolve_device', 'setup_threads', 'NonFiniteLossError', 'main']


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message gives the step and the last good checkpoint."""


def setup_threads(cfg: dict):
    """``torch.set_num_threads(cfg['threads'])`` when set (see README: 2 threads measured faster here)."""
    if cfg['threads']:
        torch.set_num_threads(int(cfg['threads']))


def resolve_device(cfg: dict, local_rank: int = 0) -> torch.device:
    """``cfg['device']`` or ``cuda:<local_rank>`` when CUDA is available, else CPU."""
    if cfg['device']:
        return torch.device(cfg['device'])
    return torch.device(f'cuda:{local_rank}') if torch.cuda.is_available() else torch.device('cpu')


def build_model(cfg: dict, pretrained_file=None, num_classes=None) -> torch.nn.Module:
    """``timm.create_model(cfg['model'], drop_path_rate=..., **cfg['model_kwargs'])``.

    ``num_classes`` defaults to the dataset's (10 for Fashion-MNIST) unless ``model_kwargs`` sets it.
    """
    kwargs = dict(cfg['model_kwargs'])
    kwargs.setdefault('num_classes', num_classes or (10 if cfg['dataset'] == 'fashion_mnist' else 1000))
    if cfg['drop_path_rate']:
        kwargs['drop_path_rate'] = cfg['drop_path_rate']
    if pretrained_file:
        kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=pretrained_file))
    return timm.create_model(cfg['model'], **kwargs)


def _seed_all(seed: int):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def _reseed_transform(ds, seed: int):
    while hasattr(ds, 'dataset'):
        ds = ds.dataset
    if hasattr(ds.transform, 'set_random_seed'):
        ds.transform.set_random_seed(seed)


def _setup_distributed(cfg):
    world = int(os.environ.get('WORLD_SIZE', 1))
    rank, local_rank = int(os.environ.get('RANK', 0)), int(os.environ.get('LOCAL_RANK', 0))
    device = resolve_device(cfg, local_rank)
    if world > 1 and not dist.is_initialized():
        if device.type == 'cuda':
            torch.cuda.set_device(device)
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo')
    return rank, world, device


class _Run:
    """State of one training run (model, optimizer, ...) with the operations that rebuild it after growth."""

    def __init__(self, cfg, rank, world, device):
        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        self.model = build_model(cfg).to(device)
        self.grown_from = {}
        if cfg['init_from']:
            state = load_state_dict_file(cfg['init_from'])
            self.grown_from = growth.load_grown_state_dict(self.model, state)
        self.frozen_counts = None
        if cfg['freeze_old_tokens']:
            if not cfg['init_from']:
                raise ValueError('freeze_old_tokens needs init_from (the tokens to freeze come from it)')
            self.frozen_counts = {growth.layer_kind(k.rsplit('.', 1)[0]): old
                                  for k, (old, _) in self.grown_from.items()}
        if cfg['grad_checkpointing']:
            self.model.set_grad_checkpointing(True)
        self.lr = resolve_lr(cfg, world)
        self.optimizer = self._make_optimizer()
        self.ema = ModelEmaV3(self.model, decay=cfg['model_ema_decay']) if cfg['model_ema'] else None
        self.wrap()

    def _make_optimizer(self):
        cfg = self.cfg
        opt = create_optimizer_v2(self.model, opt=cfg['opt'], lr=self.lr, weight_decay=cfg['weight_decay'],
                                  betas=tuple(cfg['opt_betas']), eps=cfg['opt_eps'], layer_decay=cfg['layer_decay'])
        if self.frozen_counts is not None:
            self.freeze_handles = growth.freeze_old_tokens(self.model, self.frozen_counts, opt)
        return opt

    def wrap(self):
        """(Re)build the DDP / compiled forward over the current parameters."""
        net = self.model
        if self.cfg['compile']:
            net = torch.compile(net)
        if self.world > 1:
            net = DDP(net, device_ids=[self.device.index] if self.device.type == 'cuda' else None)
        self.net = net

    def grow(self, add: dict, seed: int):
        """Grow model (and EMA) in place by ``add``, remap optimizer state, rebuild DDP. Same on all ranks."""
        g = self.cfg['growth']
        before = {n: (m.key_param_tokens, m.value_param_tokens) for n, (_, m) in growth.pattention_layers(self.model).items()}
        torch.manual_seed(seed)  # identical new tokens on every rank
        growth.grow(self.model, key_init=g['key_init'], value_init=g['value_init'], **add)
        old_to_new = {}
        for n, (_, m) in growth.pattention_layers(self.model).items():
            old_to_new[before[n][0]] = m.key_param_tokens
            old_to_new[before[n][1]] = m.value_param_tokens
        growth.grow_optimizer_state(self.optimizer, old_to_new)
        if self.ema is not None:
            growth.grow(self.ema.module, to=growth.token_counts(self.model), key_init='zeros', value_init='zeros')
            live_layers = growth.pattention_layers(self.model)
            for n, (_, m) in growth.pattention_layers(self.ema.module).items():  # EMA starts from the new rows
                live = live_layers[n][1]
                k_old = before[n][0].shape[0]
                m.key_param_tokens.data[k_old:] = live.key_param_tokens.data[k_old:]
                m.value_param_tokens.data[k_old:] = live.value_param_tokens.data[k_old:]
        self.wrap()

    def state(self, epoch, scheduler, scaler, best):
        return dict(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                    scheduler=scheduler.state_dict(), scaler=scaler.state_dict() if scaler else None,
                    model_ema=self.ema.module.state_dict() if self.ema else None, epoch=epoch, best=best,
                    token_counts=growth.token_counts(self.model), config=self.cfg)

    def load(self, state, scheduler, scaler):
        if growth.token_counts(self.model) != state['token_counts']:  # the checkpoint was saved after growth
            growth.grow(self.model, to=state['token_counts'])
            if self.ema is not None:
                growth.grow(self.ema.module, to=state['token_counts'])
        self.model.load_state_dict(state['model'])
        self.optimizer = self._make_optimizer()
        self.optimizer.load_state_dict(state['optimizer'])
        scheduler.optimizer = self.optimizer
        scheduler.load_state_dict(state['scheduler'])
        if scaler is not None and state['scaler']:
            scaler.load_state_dict(state['scaler'])
        if self.ema is not None and state['model_ema']:
            self.ema.module.load_state_dict(state['model_ema'])
        self.wrap()


def _growth_due(cfg, epoch) -> dict:
    g = cfg['growth']
    k = g['every_epochs']
    if not k or not g['add_tokens'] or (epoch + 1) % k:
        return {}
    if g['until_epoch'] is not None and epoch + 1 >= g['until_epoch']:
        return {}
    return dict(g['add_tokens'])


def train(cfg: dict, resume=None) -> dict:
    """Train as ``cfg`` says; returns ``dict(top1, top5, best_top1, epochs, output, model)``.

    Args:
        cfg: a config from :func:`tkvision.config.load_config`.
        resume: a ``last.pth`` path, ``True`` for ``<output>/last.pth``, or None. The run continues
            from the end of the checkpoint's epoch with the same data order and random state, so
            the result equals an uninterrupted run's.

    Raises:
        NonFiniteLossError: NaN/inf loss (the step is named; the last checkpoint is left intact).
        FileNotFoundError: missing data (naming the path and how to get it) or resume checkpoint.
    """
    unknown = set(cfg['growth']['add_tokens']) - set(growth.TOKEN_KINDS)
    if unknown:
        raise ConfigError(f'unknown token kinds {sorted(unknown)} in growth.add_tokens; kinds are {growth.TOKEN_KINDS}')
    setup_threads(cfg)
    rank, world, device = _setup_distributed(cfg)
    main_proc = rank == 0
    out = cfg['output']
    _seed_all(cfg['seed'])
    train_ds, val_ds = build_dataset(cfg, 'train'), build_dataset(cfg, 'val')
    train_loader = build_loader(train_ds, cfg, train=True, rank=rank, world_size=world)
    val_loader = build_loader(val_ds, cfg, train=False, rank=rank, world_size=world)
    run = _Run(cfg, rank, world, device)
    accum = resolve_accum_steps(cfg, world)
    steps_per_epoch = max(len(train_loader) // accum, 1)
    scheduler = CosineLRScheduler(run.optimizer, t_initial=cfg['epochs'] * steps_per_epoch, lr_min=cfg['min_lr'],
                                  warmup_t=int(cfg['warmup_epochs'] * steps_per_epoch), warmup_lr_init=cfg['warmup_lr'],
                                  warmup_prefix=True, t_in_epochs=False)
    amp_dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(cfg['amp'])
    scaler = torch.amp.GradScaler(device.type) if cfg['amp'] == 'fp16' else None
    num_classes = run.model.num_classes
    mixup = None
    if cfg['mixup'] > 0 or cfg['cutmix'] > 0:
        mixup = Mixup(mixup_alpha=cfg['mixup'], cutmix_alpha=cfg['cutmix'], prob=cfg['mixup_prob'],
                      switch_prob=cfg['mixup_switch_prob'], label_smoothing=cfg['smoothing'], num_classes=num_classes)
        criterion = SoftTargetCrossEntropy()
    elif cfg['smoothing'] > 0:
        criterion = LabelSmoothingCrossEntropy(cfg['smoothing'])
    else:
        criterion = torch.nn.CrossEntropyLoss()

    start_epoch, best, history = 0, dict(top1=-1.0, epoch=-1, source='model'), []
    if resume:
        path = os.path.join(out, 'last.pth') if resume is True else resume
        state = load_state(path)
        run.load(state, scheduler, scaler)
        start_epoch, best = state['epoch'] + 1, state['best']
        if main_proc:
            print(f'resumed from {path} at epoch {start_epoch}')
    metrics_path = os.path.join(out, 'metrics.csv')
    writer = None
    if main_proc:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, 'config.yaml'), 'w') as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        if start_epoch and os.path.exists(metrics_path):
            with open(metrics_path) as f:
                history = [r for r in csv.DictReader(f) if int(r['epoch']) < start_epoch]
        if cfg['tensorboard']:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(os.path.join(out, 'tb'))
        n_params = sum(p.numel() for p in run.model.parameters())
        print(f"{cfg['model']}: {n_params / 1e6:.2f}M params, {len(train_ds)} train / {len(val_ds)} val images, "
              f"{world} process(es) on {device}, global batch {cfg['batch_size'] * accum * world}, "
              f"lr {run.lr:.3g}" + (f", grown from init_from: {run.grown_from}" if run.grown_from else ''))

    res = {}
    num_updates = start_epoch * steps_per_epoch
    for epoch in range(start_epoch, cfg['epochs']):
        seed = cfg['seed'] + 1000 * epoch + rank
        _seed_all(seed)
        _reseed_transform(train_ds, seed)
        train_loader.sampler.set_epoch(epoch)
        run.net.train()
        t0, seen, skipped, loss_sum = time.perf_counter(), 0, 0, torch.zeros((), device=device)
        bar = tqdm(train_loader, desc=f'epoch {epoch + 1}/{cfg["epochs"]}', disable=not (main_proc and cfg['progress']),
                   dynamic_ncols=True, leave=False)
        for i, (images, labels, bad) in enumerate(bar):
            skipped += len(bad)
            if images is None:
                continue
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if mixup is not None:
                if len(images) % 2:  # timm's Mixup needs an even batch (a skipped image can make it odd)
                    images, labels = images[:-1], labels[:-1]
                images, labels = mixup(images, labels)
            update = (i + 1) % accum == 0
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = criterion(run.net(images), labels)
            finite = torch.isfinite(loss.detach()).float()
            if world > 1:
                dist.all_reduce(finite, op=dist.ReduceOp.MIN)
            if not finite.item():
                raise NonFiniteLossError(
                    f'loss is {loss.item()} at step {num_updates} (epoch {epoch + 1}, batch {i}); stopping. '
                    f'The last good checkpoint is {os.path.join(out, "last.pth")}')
            scaled = loss / accum
            ctx = run.net.no_sync() if (world > 1 and not update) else contextlib.nullcontext()
            with ctx:
                (scaler.scale(scaled) if scaler else scaled).backward()
            if update:
                if scaler:
                    scaler.unscale_(run.optimizer)
                if cfg['clip_grad']:
                    torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg['clip_grad'])
                if scaler:
                    scaler.step(run.optimizer)
                    scaler.update()
                else:
                    run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
                num_updates += 1
                scheduler.step_update(num_updates)
                if run.ema is not None:
                    run.ema.update(run.model, step=num_updates)
            loss_sum += loss.detach() * len(images)
            seen += len(images)
            if main_proc and cfg['progress'] and i % cfg['log_interval'] == 0:
                bar.set_postfix(loss=f'{loss.item():.3f}', lr=f"{run.optimizer.param_groups[0]['lr']:.2e}",
                                img_s=f'{seen * world / (time.perf_counter() - t0):.0f}')
        train_time = time.perf_counter() - t0
        stats = torch.tensor([loss_sum.item(), seen, skipped], dtype=torch.float64, device=device)
        if world > 1:
            dist.all_reduce(stats)
        train_loss, seen_all, skipped_all = stats[0].item() / max(stats[1].item(), 1), int(stats[1]), int(stats[2])
        res = dict(epoch=epoch, train_loss=train_loss, img_per_s=seen_all / train_time, epoch_time=train_time,
                   lr=run.optimizer.param_groups[0]['lr'], skipped=skipped_all)
        last_epoch = epoch + 1 == cfg['epochs']
        if (epoch + 1) % cfg['eval_every'] == 0 or last_epoch:
            ev = evaluate(run.net, val_loader, device, cfg['amp'])
            res.update(top1=ev['top1'], top5=ev['top5'], val_loss=ev['loss'], skipped=skipped_all + ev['skipped'])
            candidates = [('model', ev['top1'], run.model)]
            if run.ema is not None:
                ev_ema = evaluate(run.ema.module, val_loader, device, cfg['amp'])
                res.update(ema_top1=ev_ema['top1'], ema_top5=ev_ema['top5'])
                candidates.append(('ema', ev_ema['top1'], run.ema.module))
            source, top1, net = max(candidates, key=lambda c: c[1])
            if top1 > best['top1'] and main_proc:
                best = dict(top1=top1, epoch=epoch, source=source)
                save_weights(net.state_dict(), os.path.join(out, 'best.safetensors'),
                             metadata=dict(model=cfg['model'], epoch=epoch, top1=top1, source=source))
            elif top1 > best['top1']:
                best = dict(top1=top1, epoch=epoch, source=source)
        res['tokens'] = sum(growth.token_counts(run.model).values())
        add = _growth_due(cfg, epoch) if not last_epoch else {}
        if add:
            run.grow(add, seed=cfg['seed'] + 7919 * (epoch + 1))
            res['grown'] = str(growth.token_counts(run.model))
        if main_proc:
            history.append(res)
            _write_metrics(metrics_path, history)
            if writer is not None:
                for k, v in res.items():
                    if isinstance(v, (int, float)):
                        writer.add_scalar(k, v, epoch + 1)
            line = (f"epoch {epoch + 1}/{cfg['epochs']}  train loss {train_loss:.4f}  "
                    + (f"val top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  " if 'top1' in res else '')
                    + (f"ema top-1 {res['ema_top1']:.2f}%  " if 'ema_top1' in res else '')
                    + f"{res['img_per_s']:.0f} img/s  {train_time:.1f}s"
                    + (f"  skipped {res['skipped']} unreadable images" if res['skipped'] else '')
                    + (f"  grew to {res['grown']}" if add else ''))
            tqdm.write(line)
            if (epoch + 1) % cfg['save_every'] == 0 or last_epoch:
                atomic_save(run.state(epoch, scheduler, scaler, best), os.path.join(out, 'last.pth'))
                save_weights((run.ema.module if run.ema else run.model).state_dict(),
                             os.path.join(out, 'last.safetensors'), metadata=dict(model=cfg['model'], epoch=epoch))
    if main_proc and history:
        plot_curves(history, os.path.join(out, 'curves.png'), title=cfg['model'])
    if writer is not None:
        writer.close()
    return dict(top1=res.get('top1'), top5=res.get('top5'), best_top1=best['top1'], epochs=cfg['epochs'],
                output=out, model=run.model, history=history)


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


def main(argv=None):
    """``tkvision-train`` / ``tools/train.py``; prints the final accuracy and where the outputs are."""
    cfg, resume = parse_args(argv)
    t0 = time.perf_counter()
    res = train(cfg, resume=resume)
    if int(os.environ.get('RANK', 0)) == 0:
        out = res['output']
        print(f"done in {(time.perf_counter() - t0) / 60:.1f} min: final test top-1 {res['top1']:.2f}% "
              f"(best {res['best_top1']:.2f}%)\n  weights: {os.path.join(out, 'best.safetensors')} "
              f"(last: {os.path.join(out, 'last.safetensors')}, state: {os.path.join(out, 'last.pth')})\n"
              f"  curves:  {os.path.join(out, 'curves.png')}\n  metrics: {os.path.join(out, 'metrics.csv')}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    sys.exit(main())
