"""How a run optimises: the optimizer and lr schedule of the optim section, and the growth section's steps.

[`RunOptim`][tkvision.engine.run_optim.RunOptim] builds the optimizer and the schedule over a
``tkvision.engine.state.TrainState``'s model, rebuilds them after a growth step and on resume, and applies the
growth steps, so that the model, the optimizer's moments, the EMA and the frozen rows always move together. It
keeps the two config sections it reads; the state keeps only what is saved (timm keeps the same split: its
``train.py`` builds the optimizer and scheduler from ``args``, ``CheckpointSaver`` saves the state).
"""
from typing import Mapping, Optional, Sequence

import torch

from .. import growth
from ..config_sections import GrowthConfig, OptimConfig
from ..growth import elastic
from ..utils.errors import ConfigError, RunError
from .optim import build_optimizer, build_scheduler

__all__ = ['RunOptim']


class RunOptim:
    """The optimizer and schedule of a run, and its growth steps (module docstring).

    Args:
        optim: the config's optim section.
        growth: its growth section.
        lr: the peak learning rate (`tkvision.engine.config.resolve_lr`).
        updates_per_epoch: optimizer updates per epoch (the schedule's unit).
        freeze_loaded_tokens: train only the tokens appended to the ``init_from`` weights (and the head).

    Attributes:
        freeze_handles: the hooks that freeze the rows of the stage before (``growth.freeze_old_tokens``).
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
        self.optim, self.growth, self.lr, self.updates_per_epoch = optim, growth, lr, updates_per_epoch
        self.freeze_loaded_tokens = freeze_loaded_tokens
        self.freeze_handles = []

    def check(
            self,
            model: torch.nn.Module,
            name: str,
            elastic_fractions: Sequence[float] = (),
    ) -> None:
        """Refuse, before any work, what needs parameter tokens on a model without, and a growth target the
        model cannot reach.

        Raises:
            ConfigError: ``elastic_fractions`` or ``growth.freeze_old_tokens`` on ``model`` (registered as
                ``name``) without parameter tokens, or a growth target it cannot reach (named).
        """
        if elastic_fractions and not elastic.elastic_layers(model):
            raise ConfigError(f'elastic_fractions needs a model with parameter tokens (a TokenFormer); {name} has none')
        if self.growth.freeze_old_tokens and not growth.pattention_layers(model):
            raise ConfigError(f'growth.freeze_old_tokens needs a TokenFormer (parameter tokens to freeze); {name} '
                              'has none')
        try:  # every growth target checked before any work
            growth.check_reachable(growth.model_size(model), self.growth.schedule,
                                   self.growth.add_tokens if self.growth.every_epochs else None)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def optimizer(self, state: object) -> torch.optim.Optimizer:
        """The optimizer of the optim section over ``state.model``; with ``freeze_loaded_tokens``, the rows
        loaded by ``init_from`` (``state.grown_from``; everything but the head) frozen."""
        opt = build_optimizer(state.model, self.optim, self.lr)
        if self.freeze_loaded_tokens:
            layers = growth.pattention_layers(state.model)
            frozen = {layers[k.rsplit('.', 1)[0]][0]: old for k, (old, _) in state.grown_from.items()}
            growth.freeze_old_tokens(state.model, frozen, opt)
        return opt

    def scheduler(self, state: object) -> object:
        """The lr schedule of ``state.optimizer`` at update ``state.num_updates``."""
        scheduler = build_scheduler(state.optimizer, self.optim, self.growth, self.lr, self.updates_per_epoch)
        scheduler.step_update(state.num_updates)
        return scheduler

    def due(
            self,
            epochs: int,
            epoch: int,
    ) -> Mapping:
        """What grows after ``epoch`` (of ``epochs``): the ``schedule`` step at ``epoch + 1``, ``{'add': ...}``
        of ``every_epochs``, or ``{}``."""
        g = self.growth
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
            state: object,
            due: Mapping,
            seed: int,
    ) -> dict:
        """Grow ``state``'s model, optimizer state and EMA as ``due`` says (``{'add': {kind: n}}`` or a
        ``growth.schedule`` step), the same new tokens on every rank (``seed``); rewrap.

        After a schedule step the optimizer is rebuilt if ``growth.optimizer_state`` is ``'reset'``,
        the old tokens are frozen if ``growth.freeze_old_tokens``, and the staged lr schedule moves
        on to the new stage (`tkvision.engine.optim`).

        Returns:
            the model's `tkvision.growth.model_size` after the step.
        """
        torch.manual_seed(seed)
        g = self.growth
        before = state.size()
        counts = growth.grow_training_state(state.model, state.optimizer, state.ema.module if state.ema else None,
                                            key_init=g.key_init, value_init=g.value_init, to=due.get('to'),
                                            tau=g.tau, **due.get('add', {}))
        if 'at_epoch' in due:
            self._unfreeze_stage()  # a reset optimizer covers every parameter, as one built at the start does
            if g.optimizer_state == 'reset':
                state.optimizer = self.optimizer(state)
            self._freeze_stage(state, before)
            state.scheduler = self.scheduler(state)
        state.wrap()
        return counts

    def resume(
            self,
            state: object,
            checkpoint: dict,
            path: str = 'the checkpoint',
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
        counts, g = state.size(), self.growth
        if counts != checkpoint['token_counts']:
            if not (g.every_epochs or g.schedule):
                raise RunError(f"checkpoint token counts {checkpoint['token_counts']} differ from the model's "
                               f'{counts}, and the config grows nothing during training')
            growth.grow_to(state.model, checkpoint['token_counts'])
            if state.ema is not None:
                growth.grow_to(state.ema.module, checkpoint['token_counts'])
        state.model.load_state_dict(checkpoint['model'])
        state.optimizer = self.optimizer(state)
        # the stages reached so far; the current one freezes the size of the one before
        sizes = growth.schedule_sizes(counts, [s for s in g.schedule if s['at_epoch'] <= checkpoint['epochs_done']])
        if len(sizes) > 1:
            self._freeze_stage(state, sizes[-2])
        state.optimizer.load_state_dict(checkpoint['optimizer'])
        state.restore(checkpoint)
        state.scheduler = self.scheduler(state)
        state.wrap()

    def _unfreeze_stage(self):
        """Undo `_freeze_stage` (hooks removed, gradients back)."""
        for h in self.freeze_handles:
            h.remove()
        self.freeze_handles = []

    def _freeze_stage(self, state, old_size: Optional[dict]):
        """``growth.freeze_old_tokens``: train only the rows appended since ``old_size`` (+ head)."""
        if not self.growth.freeze_old_tokens:
            return
        self._unfreeze_stage()
        self.freeze_handles = growth.freeze_old_tokens(state.model, old_size, state.optimizer)


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
