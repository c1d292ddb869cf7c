"""Optimizer and learning-rate schedule of a run: timm's ``create_optimizer_v2`` and ``create_scheduler_v2``.

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
"""
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

__all__ = ['build_optimizer', 'build_scheduler']


def build_optimizer(model: torch.nn.Module, cfg: dict, lr: float) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2``: ``cfg['opt']`` at peak ``lr``, no weight decay on 1-d parameters,
    the class token and the position embedding (the model's ``no_weight_decay``), layer-wise lr decay
    with ``layer_decay`` (the model's ``group_matcher``)."""
    return create_optimizer_v2(model, opt=cfg['opt'], lr=lr, weight_decay=cfg['weight_decay'],
                               betas=tuple(cfg['opt_betas']), eps=cfg['opt_eps'], layer_decay=cfg['layer_decay'])


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: dict, lr: float, updates_per_epoch: int):
    """The lr schedule of ``cfg`` (``sched``, ``epochs``, ``warmup_epochs``, ``min_lr``, ...) in updates.

    Sets every param group's peak (``initial_lr``) to ``lr`` first, so a resumed run with a new
    ``lr`` schedules from the new peak; layer-wise decay's ``lr_scale`` is applied by timm. After
    building, the optimizer's lr is that of update 0; call ``scheduler.step_update(u)`` to move to
    update ``u``.

    Returns:
        a timm scheduler (``step_update(num_updates)``).
    """
    total = cfg['epochs'] * updates_per_epoch
    warmup = min(round(cfg['warmup_epochs'] * updates_per_epoch), total - 1)
    for group in optimizer.param_groups:
        group['initial_lr'] = lr
        group['lr'] = lr
    decay = cfg['decay_epochs']
    decay = decay if (cfg['sched'] in ('wsd', 'rsqrt') and decay < 1) else decay * updates_per_epoch
    # Everything in updates (updates_per_epoch=1): integral warmup and lengths, no float rounding.
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=cfg['sched'], num_epochs=max(total - 1 - warmup, 1), warmup_epochs=warmup,
        warmup_lr=cfg['warmup_lr'], warmup_prefix=True, min_lr=cfg['min_lr'], decay_epochs=decay,
        decay_milestones=[m * updates_per_epoch for m in cfg['decay_milestones']], decay_rate=cfg['decay_rate'],
        step_on_epochs=False, updates_per_epoch=1)
    scheduler.step_update(0)
    return scheduler
