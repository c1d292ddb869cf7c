"""The state of a training run: everything that is saved and restored (timm's ``CheckpointSaver``
saves the same set together: one object owns the run's state).

`TrainState` holds the model, optimizer, scheduler, scaler, EMA, counters and the best
evaluation; its ``state_dict`` is the ``last.pth`` format of
`tkvision.engine.checkpoint.training_checkpoint`. It also applies growth steps, so that the
model, the optimizer's moments, the EMA and the frozen rows always move together.
"""
import math
import time
from types import MappingProxyType
from typing import Mapping, Optional, Sequence, Union

import torch
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config_sections import GrowthConfig, MaeConfig, ModelConfig, OptimConfig
from .. import growth
from ..growth import elastic
from ..layers import set_backward_mode
from ..models.mae import linear_probe
from ..utils.errors import ConfigError, RunError
from .build import build_model
from .checkpoint import load_init_weights, training_checkpoint
from .optim import build_optimizer, build_scheduler

__all__ = ['TrainState']


class TrainState:
    """Everything a run needs to continue exactly, with `state_dict` / `load_state_dict`.

    Args:
        model: the config's model section (`tkvision.config_sections.ModelConfig`).
        optim: its optimisation section.
        growth: its growth section.
        task: ``'classify'``, ``'mae'`` or ``'linprobe'``.
        amp: ``None``, ``'bf16'`` or ``'fp16'``.
        num_classes: the classifier's outputs unless ``model_kwargs`` says (`default_num_classes`).
        lr: the peak learning rate (`resolve_lr`).
        device: where the model lives.
        world: number of processes.
        updates_per_epoch: optimizer updates per epoch (for the schedule).
        mae: the MAE section, for ``task: mae``.
        elastic_fractions: the ``elastic_fractions`` key.
        config_record: the whole config, read-only, written into every ``last.pth`` (a resumed run compares
            its own with it); nothing here reads settings from it.
        started: ``time.monotonic()`` when this process began the run (its set-up counts; default: now).

    Attributes:
        model, optimizer, scheduler, scaler (a no-op unless fp16), ema (``ModelEmaV3`` or None).
        net: the model as the forward pass runs it (compiled and/or DDP-wrapped: `wrap`).
        epochs_done: completed epochs. batches_done: micro-batches of epoch ``epochs_done`` already
            trained (always at an optimizer-update boundary). num_updates: optimizer updates so far.
        best: ``dict(top1 | val_loss, epoch, source)`` of the best evaluation (highest top-1, or for
            ``task: mae`` the lowest validation reconstruction loss). meter: the running epoch's sums.
        seconds_before: wall seconds the run had spent before this process took it over (0 for a new run;
            the checkpoint's ``elapsed_seconds`` on resume): see `elapsed_seconds`.

    Raises:
        ConfigError: ``growth.freeze_old_tokens`` or ``elastic_fractions`` on a model without parameter tokens.
        FileNotFoundError, WeightsMismatchError: an ``init_from`` file that is missing or does not fit.
    """

    def __init__(
            self,
            model: ModelConfig,
            optim: OptimConfig,
            growth: GrowthConfig,
            *,
            task: str,
            amp: Optional[str],
            num_classes: int,
            lr: float,
            device: Union[str, torch.device],
            world: int,
            updates_per_epoch: int,
            mae: Optional[MaeConfig] = None,
            elastic_fractions: Sequence[float] = (),
            config_record: Mapping = None,
            started: float = None,
    ):
        self.model_section, self.optim, self.growth, self.task = model, optim, growth, task
        self.device, self.world, self.updates_per_epoch, self.lr = device, world, updates_per_epoch, lr
        self.config_record = MappingProxyType(dict(config_record or {}))
        self.seconds_before, self._started = 0.0, time.monotonic() if started is None else started
        self.model = build_model(model, mae, num_classes).to(device)
        self.grown_from, self.init_report = {}, ''
        self.freeze_handles = []  # growth.freeze_old_tokens: hooks of the current stage
        self._check_parameter_tokens(elastic_fractions)
        if model.init_from:
            self.grown_from, self.init_report = load_init_weights(self.model, model.init_from, task)
        if task == 'linprobe':
            linear_probe(self.model)
        if model.grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        set_backward_mode(self.model, model.backward_mode)
        self.epochs_done = self.batches_done = self.num_updates = 0
        self.optimizer = self._make_optimizer()
        self.scheduler = self._make_scheduler()
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == 'fp16')
        self.ema = ModelEmaV3(self.model, decay=optim.model_ema_decay) if optim.model_ema else None
        self.best = (dict(val_loss=math.inf, epoch=-1, source='model') if task == 'mae'
                     else dict(top1=-1.0, epoch=-1, source='model'))
        self.reset_meter()
        self.wrap()

    def _check_parameter_tokens(self, elastic_fractions):
        """Refuse, before any work, what needs parameter tokens on a model without, and a growth target the
        model cannot reach."""
        name = self.model_section.model
        if elastic_fractions and not elastic.elastic_layers(self.model):
            raise ConfigError(f'elastic_fractions needs a model with parameter tokens (a TokenFormer); {name} has none')
        if self.growth.freeze_old_tokens and not growth.pattention_layers(self.model):
            raise ConfigError(f'growth.freeze_old_tokens needs a TokenFormer (parameter tokens to freeze); {name} '
                              'has none')
        try:  # every growth target checked before any work
            growth.check_reachable(self.size(), self.growth.schedule,
                                   self.growth.add_tokens if self.growth.every_epochs else None)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _make_optimizer(self):
        """The optimizer of the optim section; with ``freeze_loaded_tokens``, the rows loaded by
        ``init_from`` (and everything but the head) frozen."""
        opt = build_optimizer(self.model, self.optim, self.lr)
        if self.model_section.freeze_loaded_tokens:
            layers = growth.pattention_layers(self.model)
            frozen = {layers[k.rsplit('.', 1)[0]][0]: old for k, (old, _) in self.grown_from.items()}
            growth.freeze_old_tokens(self.model, frozen, opt)
        return opt

    def _make_scheduler(self):
        """The lr schedule at update ``num_updates``."""
        scheduler = build_scheduler(self.optimizer, self.optim, self.growth, self.lr,
                                    self.updates_per_epoch)
        scheduler.step_update(self.num_updates)
        return scheduler

    def elapsed_seconds(self) -> float:
        """Wall seconds of the whole run so far, in every process that trained it (model building,
        training, evaluation and checkpoints included; work lost to a crash after the last checkpoint is
        not): what a run that was stopped and resumed would have taken uninterrupted, plus set-up."""
        return self.seconds_before + time.monotonic() - self._started

    def size(self) -> dict:
        """`tkvision.growth.model_size` of the live model (what a growth step changes)."""
        return growth.model_size(self.model)

    def reset_meter(
            self,
            loss_sum: float = 0.0,
            seen: int = 0,
            skipped: int = 0,
            seconds: float = 0.0,
            data_seconds: float = 0.0,
    ) -> None:
        """The running epoch's sums: loss (on the device, no host sync per step), images, skipped images,
        training seconds and the seconds of those spent waiting for the loader (a checkpoint written before
        this was counted resumes with 0)."""
        self.meter = dict(loss_sum=torch.tensor(float(loss_sum), device=self.device, dtype=torch.float64),
                          nonfinite=torch.zeros((), device=self.device, dtype=torch.bool),
                          seen=seen, skipped=skipped, seconds=seconds, data_seconds=data_seconds)

    def compiled(self) -> bool:
        """Whether the forward is compiled: ``compile`` true, or ``'auto'`` on CUDA."""
        compile_ = self.model_section.compile
        return compile_ is True or (compile_ == 'auto' and self.device.type == 'cuda')

    def wrap(self) -> None:
        """(Re)build the compiled / DDP forward (``self.net``) over the current parameters."""
        net = torch.compile(self.model) if self.compiled() else self.model
        if self.world > 1:
            net = DDP(net, device_ids=[self.device.index] if self.device.type == 'cuda' else None)
        self.net = net

    def grow(self, due: dict, seed: int) -> dict:
        """Grow model, optimizer state and EMA as ``due`` says (``{'add': {kind: n}}`` or a
        ``growth.schedule`` step), the same new tokens on every rank (``seed``); rewrap.

        After a schedule step the optimizer is rebuilt if ``growth.optimizer_state`` is ``'reset'``,
        the old tokens are frozen if ``growth.freeze_old_tokens``, and the staged lr schedule moves
        on to the new stage (`tkvision.engine.optim`). Returns `size`.
        """
        torch.manual_seed(seed)
        g = self.growth
        before = self.size()
        counts = growth.grow_training_state(self.model, self.optimizer, self.ema.module if self.ema else None,
                                            key_init=g.key_init, value_init=g.value_init, to=due.get('to'),
                                            tau=g.tau, **due.get('add', {}))
        if 'at_epoch' in due:
            self._unfreeze_stage()  # a reset optimizer covers every parameter, as one built at the start does
            if g.optimizer_state == 'reset':
                self.optimizer = self._make_optimizer()
            self._freeze_stage(before)
            self.scheduler = self._make_scheduler()
        self.wrap()
        return counts

    def _unfreeze_stage(self):
        """Undo `_freeze_stage` (hooks removed, gradients back)."""
        for h in self.freeze_handles:
            h.remove()
        self.freeze_handles = []

    def _freeze_stage(self, old_size: dict):
        """``growth.freeze_old_tokens``: train only the rows appended since ``old_size`` (+ head)."""
        if not self.growth.freeze_old_tokens:
            return
        self._unfreeze_stage()
        self.freeze_handles = growth.freeze_old_tokens(self.model, old_size, self.optimizer)

    def state_dict(self) -> dict:
        """The ``last.pth`` dict (`tkvision.engine.checkpoint.training_checkpoint`)."""
        return training_checkpoint(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict`; the schedule is rebuilt from the current config at the
        saved update, so changed schedule keys take effect from here on.

        Raises:
            RunError: the checkpoint's token counts differ from the model's and no growth during
                training explains it.
        """
        counts, g = self.size(), self.growth
        if counts != state['token_counts']:
            if not (g.every_epochs or g.schedule):
                raise RunError(f"checkpoint token counts {state['token_counts']} differ from the model's {counts}, "
                               'and the config grows nothing during training')
            growth.grow_to(self.model, state['token_counts'])
            if self.ema is not None:
                growth.grow_to(self.ema.module, state['token_counts'])
        self.model.load_state_dict(state['model'])
        self.optimizer = self._make_optimizer()
        # the stages reached so far; the current one freezes the size of the one before
        sizes = growth.schedule_sizes(counts, [s for s in g.schedule if s['at_epoch'] <= state['epochs_done']])
        if len(sizes) > 1:
            self._freeze_stage(sizes[-2])
        self.optimizer.load_state_dict(state['optimizer'])
        self.scaler.load_state_dict(state['scaler'])
        if self.ema is not None and state['model_ema']:
            self.ema.module.load_state_dict(state['model_ema'])
        self.epochs_done, self.batches_done = state['epochs_done'], state['batches_done']
        self.num_updates, self.best = state['num_updates'], state['best']
        self.seconds_before = state.get('elapsed_seconds', 0.0)  # checkpoints before the key: from here on
        self.reset_meter(**state['meter'])
        self.scheduler = self._make_scheduler()
        self.wrap()
