"""The state of a training run: everything that is saved and restored (timm's ``CheckpointSaver``
saves the same set together: one object owns the run's state).

`TrainState` holds the model, optimizer, scheduler, scaler, EMA, counters and the best evaluation, and owns the
``last.pth`` format: `TrainState.state_dict` writes it, `TrainState.restore` reads the state's own parts back
(`tkvision.engine.checkpoint` owns the files). It keeps no config section and builds nothing it is given: the
optimizer and the schedule are built by `tkvision.engine.optim.RunOptim` over the model of
``tkvision.engine.trainer.build_train_model``, and rebuilt by it after a growth step and on resume (who owns what:
`optim.py` and `tkvision.engine.checkpoint` import this module, never the reverse).
"""
import math
import time
import warnings
from types import MappingProxyType
from typing import Mapping, Optional, Protocol, Tuple, TypedDict, cast

import torch
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import growth
from .distributed import Processes

__all__ = ['TrainState', 'UpdateSchedule', 'EpochMeter', 'FORMAT_VERSION']


class EpochMeter(TypedDict):
    """The running epoch's sums (`TrainState.meter`).

    Attributes:
        loss_sum: the summed training loss x images, a float64 tensor on the device (no host sync per step).
        nonfinite: a bool tensor on the device: whether a loss since the last check was NaN or infinite.
        seen: images trained this epoch.
        skipped: unreadable images skipped this epoch.
        seconds: training seconds this epoch.
        data_seconds: the seconds of those spent waiting for the loader.
    """
    loss_sum: torch.Tensor
    nonfinite: torch.Tensor
    seen: int
    skipped: int
    seconds: float
    data_seconds: float


class UpdateSchedule(Protocol):
    """What the state needs of a learning-rate schedule: timm's schedulers and
    `tkvision.engine.optim.StagedScheduler` / ``RewarmScheduler`` set the lr of update ``num_updates``."""

    def step_update(self, num_updates: int, metric: Optional[float] = None) -> None:
        """Set every param group's lr for optimizer update ``num_updates`` (counted from the run's start)."""


#: Version of the ``last.pth`` format (`TrainState.state_dict`; files without the key are version 1).
FORMAT_VERSION = 1


class TrainState:
    """Everything a run needs to continue exactly, with `state_dict` (and `RunOptim.resume` to load it).

    Args:
        model: the model being trained (``tkvision.engine.trainer.build_train_model``), on ``processes.device``.
        optimizer: its optimizer (`tkvision.engine.optim.RunOptim.optimizer`).
        scheduler: the lr schedule of that optimizer (`tkvision.engine.optim.RunOptim.scheduler`).
        processes: this process among the job's (``tkvision.engine.distributed.Processes``): where the model
            lives, and its device's plan for the scaler, ``torch.compile`` and DDP.
        best: ``(column, mode)`` of the evaluation that picks the best weights, the task's
            (``tkvision.engine.tasks.Task.best``): ``('top1', 'max')``, ``('val_loss', 'min')``.
        ema_decay: the EMA's decay per update, or None for no EMA (``model_ema``).
        config_record: the whole config, read-only, written into every ``last.pth`` (a resumed run compares
            its own with it); nothing here reads settings from it.
        started: ``time.monotonic()`` when this process began the run (its set-up counts; default: now).
        grown_from: ``{tensor: (old, new)}`` of the ``init_from`` weights grown to fit
            (``tkvision.engine.trainer.build_train_model``).
        init_report: what ``init_from`` loaded and dropped.
        inputs: ``{key: {'path', 'sha256'}}`` of the files the run started from (``teacher``, ``init_from``), written
            into every checkpoint so a resume can tell whether they changed (``tkvision.engine.trainer.run_inputs``).

    Attributes:
        model, optimizer, scheduler, scaler (a no-op unless fp16), ema (``ModelEmaV3`` or None).
        net: the model as the forward pass runs it (compiled and/or DDP-wrapped: `wrap`).
        epochs_done: completed epochs. batches_done: micro-batches of epoch ``epochs_done`` already
            trained (always at an optimizer-update boundary). num_updates: optimizer updates so far.
        best: ``dict(<column>, epoch, source)`` of the best evaluation (the highest top-1, or the lowest validation
            loss: the ``best`` argument). meter: the running epoch's sums.
        seconds_before: wall seconds the run had spent before this process took it over (0 for a new run;
            the checkpoint's ``elapsed_seconds`` on resume): see `elapsed_seconds`.
        grown_from, init_report, inputs: as given.
    """

    def __init__(
            self,
            model: torch.nn.Module,
            optimizer: torch.optim.Optimizer,
            scheduler: UpdateSchedule,
            *,
            processes: Processes,
            best: Tuple[str, str],
            ema_decay: Optional[float] = None,
            config_record: Optional[Mapping] = None,
            started: Optional[float] = None,
            grown_from: Optional[dict] = None,
            init_report: str = '',
            inputs: Optional[Mapping[str, Mapping[str, str]]] = None,
    ):
        self.device, self.world, self.plan = processes.device, processes.world, processes.plan
        self.rank = processes.rank
        self.config_record = MappingProxyType(dict(config_record or {}))
        self.seconds_before, self._started = 0.0, time.monotonic() if started is None else started
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grown_from, self.init_report = dict(grown_from or {}), init_report
        self.inputs = {key: dict(value) for key, value in (inputs or {}).items()}
        self.epochs_done = self.batches_done = self.num_updates = 0
        self.global_batch: Optional[int] = None  # images per update over every process (set by the trainer)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.plan.grad_scaler)
        self.ema = ModelEmaV3(self.model, decay=ema_decay) if ema_decay is not None else None
        metric, mode = best
        self.best = {metric: math.inf if mode == 'min' else -1.0, 'epoch': -1, 'source': 'model'}
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
        this was counted resumes with 0): an `EpochMeter`."""
        self.meter = EpochMeter(loss_sum=torch.tensor(float(loss_sum), device=self.device, dtype=torch.float64),
                          nonfinite=torch.zeros((), device=self.device, dtype=torch.bool),
                          seen=seen, skipped=skipped, seconds=seconds, data_seconds=data_seconds)

    def wrap(self) -> None:
        """(Re)build the compiled / DDP forward (``self.net``) over the current parameters, as the device's plan
        says (``compile``, ``ddp_device_ids``)."""
        net = self.model
        if self.plan.compile:  # typed as returning a callable; for a module it is an OptimizedModule, a module too
            net = cast(torch.nn.Module, torch.compile(self.model))
        if self.world > 1:
            ids = self.plan.ddp_device_ids
            # DDP lays its buckets out again after the first step of each wrapper (in the gradients' order), and a
            # sum over 3 or more processes depends on the layout by the last bit: a run resumed mid-way would step
            # once in the first layout where the uninterrupted run was in the second. find_unused_parameters keeps
            # the first layout for good (torch's Reducer never rebuilds it then), so a resume is bit-identical.
            with warnings.catch_warnings():
                warnings.filterwarnings('ignore', message='.*find_unused_parameters=True.*')
                net = DDP(net, device_ids=list(ids) if ids is not None else None, find_unused_parameters=True)
        self.net = net

    def reduced_meter(self) -> dict:
        """The running epoch's sums over every process (one all-reduce: call it on every rank, at a sync point), as
        ``state_dict``'s ``meter`` holds them; this process's seconds."""
        m = self.meter
        sums = torch.tensor([m['loss_sum'].item(), m['seen'], m['skipped']], dtype=torch.float64, device=self.device)
        if self.world > 1:
            torch.distributed.all_reduce(sums)
        loss_sum, seen, skipped = sums.tolist()
        return dict(loss_sum=loss_sum, seen=int(seen), skipped=int(skipped), seconds=m['seconds'],
                    data_seconds=m['data_seconds'])

    def state_dict(self, meter: Optional[dict] = None) -> dict:
        """The ``last.pth`` format: everything a run needs to continue exactly.

        Keys: ``model`` (state dict), ``optimizer``, ``scaler`` (GradScaler), ``model_ema`` (state dict or
        None), ``epochs_done`` (completed epochs), ``batches_done`` (micro-batches of epoch ``epochs_done``
        already trained, at an update boundary), ``num_updates`` (optimizer updates), ``best`` (the best
        evaluation: ``dict(top1 | val_loss, epoch, source)``), ``token_counts`` (``growth.model_size``: the
        size the model had grown to), ``config`` (the flat config), ``meter`` (the running epoch's sums over
        every process, `reduced_meter`, or this process's: ``loss_sum``, ``seen``, ``skipped``; rank 0's ``seconds``,
        ``data_seconds``), ``inputs`` (the files it started from,
        with their sha256: ``teacher``, ``init_from``), ``elapsed_seconds`` (the run's wall
        seconds so far, all processes that trained it: `elapsed_seconds`; files without it count from their
        resume), ``world_size`` (the processes that wrote it) and ``global_batch`` (images per update over them: a
        resume on another number of processes keeps it), ``format_version``
        (`FORMAT_VERSION`). The scheduler is not saved:
        it is rebuilt from the config at ``num_updates``, so changed schedule keys take effect on resume.
        """
        m = self.meter
        meter = meter or dict(loss_sum=m['loss_sum'].item(), seen=m['seen'], skipped=m['skipped'],
                              seconds=m['seconds'], data_seconds=m['data_seconds'])
        return dict(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                    scaler=self.scaler.state_dict(), model_ema=self.ema.module.state_dict() if self.ema else None,
                    epochs_done=self.epochs_done, batches_done=self.batches_done, num_updates=self.num_updates,
                    best=self.best, token_counts=self.size(), config=dict(self.config_record),
                    meter=meter,
                    inputs=self.inputs, elapsed_seconds=self.elapsed_seconds(), world_size=self.world,
                    global_batch=self.global_batch, format_version=FORMAT_VERSION)

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
        meter = checkpoint['meter']
        # the saved sums are every process's (RunClock.save reduces them): rank 0 carries them on, the others from 0
        self.reset_meter(**(meter if self.rank == 0 else dict(meter, loss_sum=0.0, seen=0, skipped=0)))
