"""The state of a training run: everything that is saved and restored (timm's ``CheckpointSaver``
saves the same set together: one object owns the run's state).

`TrainState` holds the model, optimizer, scheduler, scaler, EMA, counters and the best
evaluation; its ``state_dict`` is the ``last.pth`` format of
`tkvision.engine.checkpoint.training_checkpoint`. It keeps no config section: the optimizer, the schedule and
the growth steps are `tkvision.engine.optim.RunOptim`'s, which rebuilds them over the state's model.
"""
import math
import time
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

import torch
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import growth
from ..config_sections import MaeConfig, ModelConfig
from ..layers import set_backward_mode
from ..models.mae import linear_probe
from .build import build_model
from .checkpoint import load_init_weights, training_checkpoint
from .distributed import Processes
from .optim import RunOptim

__all__ = ['TrainState']


class TrainState:
    """Everything a run needs to continue exactly, with `state_dict` (and `RunOptim.resume` to load it).

    Args:
        model: the config's model section (`tkvision.config_sections.ModelConfig`), read here only: the state
            keeps none of it.
        optim: the run's optimizer and schedule (`tkvision.engine.optim.RunOptim`), built over the model
            here; the state does not keep it.
        task: ``'classify'``, ``'mae'`` or ``'linprobe'``.
        num_classes: the classifier's outputs unless ``model_kwargs`` says (`default_num_classes`).
        processes: this process among the job's (``tkvision.engine.distributed.Processes``): where the model
            lives, and its device's plan for the scaler, ``torch.compile`` and DDP.
        ema_decay: the EMA's decay per update, or None for no EMA (``model_ema``).
        mae: the MAE section, for ``task: mae``.
        elastic_fractions: the ``elastic_fractions`` key (checked against the model).
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
        grown_from: ``{layer: (old, new)}`` of the ``init_from`` weights grown to fit; init_report: what
            ``init_from`` loaded and dropped.

    Raises:
        ConfigError: ``growth.freeze_old_tokens`` or ``elastic_fractions`` on a model without parameter tokens.
        FileNotFoundError, WeightsMismatchError: an ``init_from`` file that is missing or does not fit.
    """

    def __init__(
            self,
            model: ModelConfig,
            optim: RunOptim,
            *,
            task: str,
            num_classes: int,
            processes: Processes,
            ema_decay: Optional[float] = None,
            mae: Optional[MaeConfig] = None,
            elastic_fractions: Sequence[float] = (),
            config_record: Mapping = None,
            started: float = None,
    ):
        self.task, self.device, self.world, self.plan = task, processes.device, processes.world, processes.plan
        self.config_record = MappingProxyType(dict(config_record or {}))
        self.seconds_before, self._started = 0.0, time.monotonic() if started is None else started
        self.model = build_model(model, mae, num_classes).to(self.device)
        self.grown_from, self.init_report = {}, ''
        optim.check(self.model, model.model, elastic_fractions)
        if model.init_from:
            self.grown_from, self.init_report = load_init_weights(self.model, model.init_from, task)
        if task == 'linprobe':
            linear_probe(self.model)
        if model.grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        set_backward_mode(self.model, model.backward_mode)
        self.epochs_done = self.batches_done = self.num_updates = 0
        self.optimizer = optim.optimizer(self)
        self.scheduler = optim.scheduler(self)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.plan.grad_scaler)
        self.ema = ModelEmaV3(self.model, decay=ema_decay) if ema_decay is not None else None
        self.best = (dict(val_loss=math.inf, epoch=-1, source='model') if task == 'mae'
                     else dict(top1=-1.0, epoch=-1, source='model'))
        self.reset_meter()
        self.wrap()

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

    def wrap(self) -> None:
        """(Re)build the compiled / DDP forward (``self.net``) over the current parameters, as the device's plan
        says (``compile``, ``ddp_device_ids``)."""
        net = torch.compile(self.model) if self.plan.compile else self.model
        if self.world > 1:
            ids = self.plan.ddp_device_ids
            net = DDP(net, device_ids=list(ids) if ids is not None else None)
        self.net = net

    def state_dict(self) -> dict:
        """The ``last.pth`` dict (`tkvision.engine.checkpoint.training_checkpoint`)."""
        return training_checkpoint(self)

    def restore(self, checkpoint: dict) -> None:
        """The state's own parts of a ``last.pth`` dict: the scaler, the EMA weights, the counters, the best
        evaluation, the run's elapsed seconds and the running epoch's sums. The model and the optimizer come
        first, from `tkvision.engine.optim.RunOptim.resume` (they may need growing)."""
        self.scaler.load_state_dict(checkpoint['scaler'])
        if self.ema is not None and checkpoint['model_ema']:
            self.ema.module.load_state_dict(checkpoint['model_ema'])
        self.epochs_done, self.batches_done = checkpoint['epochs_done'], checkpoint['batches_done']
        self.num_updates, self.best = checkpoint['num_updates'], checkpoint['best']
        self.seconds_before = checkpoint.get('elapsed_seconds', 0.0)  # checkpoints before the key: from here on
        self.reset_meter(**checkpoint['meter'])
