"""Training: the MAE supervised recipe, MAE pretraining and fine-tuning, linear probing (and small
real-data recipes) on one process or many.

``task`` selects what is trained: ``classify`` (a classifier on labels), ``mae`` (a
[`MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] around ``model``; the loss is the reconstruction
error, labels are not used, evaluation reports the validation reconstruction loss with fixed masks,
and ``reconstruction.png`` is written at the end) or ``linprobe`` (the ``init_from`` encoder frozen,
MAE's BatchNorm + linear head trained). ``init_from`` an MAE checkpoint loads its encoder
(`tkvision.engine.checkpoint.load_init_weights`, reporting what was loaded and dropped).

Glue over timm and PyTorch: ``timm.create_model``, ``create_optimizer_v2`` and ``create_scheduler_v2``
(`optim`), ``timm.data.Mixup``, timm's label-smoothing / soft-target losses,
``timm.utils.ModelEmaV3``, ``dispatch_clip_grad``, ``torch.autocast``, ``DistributedDataParallel``
under ``torchrun`` or SLURM, tqdm and TensorBoard.

[`train`][tkvision.engine.trainer.train] strings together three pieces around one state object:
``tkvision.engine.loop.train_one_epoch``, ``tkvision.engine.run_eval.RunEvaluator.epoch`` and
`log_epoch`; `TrainState` holds everything that is saved. What a pre-empted or killed run does, and which
files it writes, is decided by `checkpoint`: ``--resume`` continues at the exact update with the same data
order and random draws, so the result is bit-identical to an uninterrupted run for any ``num_workers``.
"""
import csv
import os
import signal
import time
from typing import Any, Mapping, Union

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
from timm.utils import random_seed
from tqdm import tqdm

from .. import growth
from ..data import DataConfig, data_source_channels, dataset_size, default_num_classes
from ..layers import set_backward_mode
from ..models import input_shape
from ..models.mae import linear_probe
from ..utils.errors import EXIT_PREEMPTED, ConfigError, RunError
from ..utils.files import file_sha256
from ..utils.seeding import derive_seed
from .build import MaeConfig, ModelConfig, build_model, create_model
from .checkpoint import (
    BEST_WEIGHTS,
    CONFIG_FILE,
    CURVES_FILE,
    LAST_CHECKPOINT,
    LAST_WEIGHTS,
    METRICS_FILE,
    RECONSTRUCTION_FILE,
    load_init_weights,
    load_teacher,
    load_training_checkpoint,
    save_rows,
    save_weights,
    save_yaml,
)
from .clock import STOP_SIGNALS, RunClock
from .config import TrainConfig, config_changes, resolve_run_config
from .context import RunContext
from .distributed import Processes, init_distributed, is_peer_failure, setup_threads
from .loop import NonFiniteLossError, Preempted, train_one_epoch
from .loss import TrainTask, check_teacher
from .optim import RunOptim, resolve_accum_steps, resolve_lr
from .plotting import plot_curves
from .reconstruction import save_reconstructions
from .run_data import RunData
from .run_eval import RunEvaluator
from .rundir import claim_output, run_files
from .state import TrainState

__all__ = ['train', 'log_epoch', 'build_train_model', 'check_model_input', 'TrainState', 'NonFiniteLossError',
           'Preempted', 'EXIT_PREEMPTED']


def log_epoch(run: RunContext, history: list, row: dict) -> None:
    """Append ``row`` to ``metrics.csv`` (atomically rewritten), TensorBoard and one printed line (rank 0)."""
    if not run.main:
        return
    history.append(row)
    save_rows(history, os.path.join(run.out, METRICS_FILE))
    if run.writer is not None:
        for k, v in row.items():
            if isinstance(v, (int, float)):
                run.writer.add_scalar(k, v, row['epoch'] + 1)
    skipped = row['skipped'] + row.get('val_skipped', 0)
    tqdm.write(f"epoch {row['epoch'] + 1}/{run.epochs}  train loss {row['train_loss']:.4f}  "
               + (f"val top-1 {row['top1']:.2f}%  top-5 {row['top5']:.2f}%  " if 'top1' in row else '')
               + (f"val loss {row['val_loss']:.4f}  " if 'top1' not in row and 'val_loss' in row else '')
               + (f"ema top-1 {row['ema_top1']:.2f}%  " if 'ema_top1' in row else '')
               + ''.join(f"{k} {v:.2f}%  " for k, v in row.items() if k.startswith('top1@'))
               + ''.join(f"{k} {v:.4f}  " for k, v in row.items() if k.startswith('val_loss@'))
               + (f"test top-1 {row['test_top1']:.2f}% (once, at the end)  " if 'test_top1' in row else '')
               + f"{row['img_per_s']:.0f} img/s  {row['epoch_time']:.1f}s (data wait {row['data_wait']:.0%})"
               + (f'  skipped {skipped} unreadable images' if skipped else '')
               + (f"  grew to {row['grown']}" if 'grown' in row else ''))


def _resume(run: RunContext, state: TrainState, resume) -> list:
    """Load the checkpoint into ``state``; check and report config changes; return the metrics history."""
    path = run.clock.checkpoint_path if resume is True else resume
    if not os.path.isfile(path):
        if resume is True and not run_files(run.out):  # killed before its first checkpoint, or new: start it
            if run.main:
                print(f'no checkpoint yet in {run.out}: starting the run from scratch')
            return []
        raise RunError(f'nothing to resume: no checkpoint at {path}')
    ckpt = load_training_checkpoint(path)
    _check_inputs(ckpt.get('inputs', {}), state.inputs, run.main)
    allowed, forbidden = config_changes(ckpt['config'], dict(state.config_record))
    if forbidden:
        raise ConfigError('these keys cannot change when resuming (they fix the model, the data or the sample '
                          'order; start a new run with another --output instead): ' + '; '.join(forbidden))
    run.optim.resume(state, ckpt, path)
    if run.main:
        print(f'resumed from {path} at epoch {state.epochs_done + 1}, batch {state.batches_done}, update '
              f'{state.num_updates}' + ('; changed: ' + '; '.join(allowed) if allowed else ''))
    metrics = os.path.join(run.out, METRICS_FILE)
    if not (run.main and os.path.exists(metrics)):
        return []
    with open(metrics) as f:
        return [r for r in csv.DictReader(f) if int(r['epoch']) < state.epochs_done]


def run_inputs(config: TrainConfig) -> dict:
    """``{key: {'path', 'sha256'}}`` of the files a run is started from and reads (``teacher``, ``init_from``): what
    a resume checks has not changed under the run (`_check_inputs`)."""
    files = dict(teacher=config.loss.teacher if config.loss.distillation == 'teacher' else None,
                 init_from=config.model.init_from)
    return {key: dict(path=path, sha256=file_sha256(path)) for key, path in files.items()
            if path and os.path.isfile(path)}


def _check_inputs(saved: Mapping, now: Mapping, main: bool) -> None:
    """Refuse a resume whose teacher changed since the run started (its predictions are the targets of every
    step); a changed ``init_from`` only says so, as it is read once, at the start (the weights come from the
    checkpoint). A checkpoint without the record (before it) is not checked.

    Raises:
        ConfigError: the teacher's file differs from the one the run started with (named, both digests).
    """
    for key, before in saved.items():
        after = now.get(key)
        if after is None or after['sha256'] == before['sha256']:
            continue
        what = (f"{key}: {after['path']} is not the file this run started from (sha256 {before['sha256'][:12]}... "
                f"then, {after['sha256'][:12]}... now)")
        if key == 'teacher':
            raise ConfigError(f'{what}: its predictions are every step\'s targets, so the run would not continue as '
                              'it began; put the file back, or start a new run with another --output')
        if main:
            print(f'note: {what}; it is read only at the start, so the resumed run is unaffected')


def build_train_model(
        model: ModelConfig,
        mae: Optional[MaeConfig],
        num_classes: int,
        task: str,
        device: torch.device,
) -> Tuple[torch.nn.Module, dict, str]:
    """The model a run trains, on ``device``: the model section's (around an MAE for ``task: mae``), started from
    ``init_from`` (grown to fit), linear-probe ready for ``task: linprobe``, with ``grad_checkpointing`` and
    Pattention's ``backward_mode`` set.

    Returns:
        ``(model, grown_from, init_report)``: ``{tensor: (old, new)}`` of the ``init_from`` weights grown to fit,
        and a line saying what ``init_from`` loaded and dropped (empty without one).

    Raises:
        ConfigError: a model that refuses its kwargs (`build_model`); ``grad_checkpointing`` for a model without
            timm's ``set_grad_checkpointing``.
        FileNotFoundError, WeightsMismatchError: an ``init_from`` file that is missing or does not fit.
    """
    net = build_model(model, mae, num_classes).to(device)
    grown_from: Dict[str, Tuple[int, int]] = {}
    init_report = ''
    if model.init_from:
        grown_from, init_report = load_init_weights(net, model.init_from, task)
    if task == 'linprobe':
        linear_probe(net)
    if model.grad_checkpointing:
        set_grad_checkpointing = getattr(net, 'set_grad_checkpointing', None)
        if not callable(set_grad_checkpointing):
            raise ConfigError(f'grad_checkpointing: {model.model} has no set_grad_checkpointing (timm\'s API for '
                              'it); set grad_checkpointing: false')
        set_grad_checkpointing(True)
    set_backward_mode(net, model.backward_mode)
    return net, grown_from, init_report


def check_model_input(
        model: ModelConfig,
        data: DataConfig,
) -> None:
    """Refuse, before any work, a model (the model section) that cannot take the data section's images:
    Fashion-MNIST's are ``img_size`` px with one channel, every other dataset's decode to three (RGB,
    ``tkvision.data.decode_image``), and another input would only fail at the first batch (the model is built
    on the meta device: no memory).

    Raises:
        ConfigError: naming both shapes and the model_kwargs that fit.
    """
    with torch.device('meta'):
        net = create_model(model.model, **{k: v for k, v in model.model_kwargs.items() if k != 'num_classes'})
    channels, size = input_shape(net)
    if data.dataset != 'fashion_mnist':
        want = data_source_channels(data)
        if channels != want:
            images = 'RGB images (3 channels)' if want == 3 else f'{want}-channel images'
            raise ConfigError(f'dataset {data.dataset} gives {images}; {model.model} as configured '
                              f'takes {channels}: set model_kwargs {{in_chans: {want}}}'
                              + (' (or leave in_chans unset)' if want == 3 else ''))
        return
    if channels == 1 and size in (None, (data.img_size,) * 2):
        return
    shown = f'{size[0]} x {size[1]} px' if size else 'any size'
    raise ConfigError(f"Fashion-MNIST images are {data.img_size} x {data.img_size} px, 1 channel; "
                      f"{model.model} "
                      f"as configured takes {shown}, {channels} channels: set model_kwargs "
                      "{img_size: 28, patch_size: 7, in_chans: 1} (as configs/fashion_mnist/quick.yaml does)")


def build_state(
        config: TrainConfig,
        optim: RunOptim,
        processes: Processes,
        started: float | None = None,
) -> TrainState:
    """The ``TrainState`` (model, optimizer, schedule, EMA, scaler) of a resolved run config
    (``resolve_run_config``): the model from its model section (`build_train_model`), checked against what the
    optim, growth and loss sections need of it, then the optimizer and schedule from ``optim``.

    Args:
        config: a config as ``resolve_run_config`` returns it.
        optim: the run's optimizer and schedule (``tkvision.engine.optim.RunOptim``).
        processes: this process among the job's, with its device's plan (where the model and optimizer live,
            the scaler, compile and DDP).
        started: ``time.monotonic()`` when the run began; now when ``None``.
    """
    task, ema = config.run.task, config.optim
    model, grown_from, init_report = build_train_model(config.model, config.mae if task == 'mae' else None,
                                                       default_num_classes(config.data), task, processes.device)
    optim.check(model, config.model.model, config.loss.elastic_fractions)
    optimizer = optim.optimizer(model, grown_from)
    return TrainState(model, optimizer, optim.scheduler(optimizer), processes=processes, task=task,
                      ema_decay=ema.model_ema_decay if ema.model_ema else None, config_record=config.to_dict(),
                      started=started, grown_from=grown_from, init_report=init_report, inputs=run_inputs(config))


def _build(config: TrainConfig, processes: Processes, started: float) -> Tuple[RunContext, TrainState]:
    """The run's parts, each from the sections it reads, in the order that fixes the random draws: data, teacher,
    clock, optimisation, the state (the model's initial weights), the task and the evaluation.

    Raises:
        ConfigError: as ``RunData`` (a batch larger than the data), a teacher that cannot load or teach this model.
    """
    run, optim, out = config.run, config.optim, config.run.output
    accum = resolve_accum_steps(optim, config.data.batch_size, processes.world)
    naflex_model = None
    if config.data.naflex_loader:  # its patch size and shape, on the meta device: no memory
        with torch.device('meta'):
            naflex_model = build_model(config.model)
    data = RunData(config.data, accum, run.seed, processes, model=naflex_model)
    teacher = load_teacher(config.loss.teacher, processes.device) if config.loss.teacher is not None else None
    clock = RunClock(processes, os.path.join(out, LAST_CHECKPOINT), log_interval=run.log_interval,
                     every_steps=run.checkpoint_every_steps, every_minutes=run.checkpoint_every_minutes)
    run_optim = RunOptim(optim, config.growth, lr=resolve_lr(optim, config.data.batch_size, processes.world),
                         updates_per_epoch=data.updates_per_epoch,
                         freeze_loaded_tokens=config.model.freeze_loaded_tokens)
    state = build_state(config, run_optim, processes, started)
    num_classes = int(getattr(state.model, 'num_classes', 0))  # every timm classifier has it; an MAE has none
    if teacher is not None:
        check_teacher(teacher, num_classes, input_shape(state.model)[0])
    task = TrainTask(config.loss, run.task, run.seed, num_classes, teacher)
    evaluator = RunEvaluator(data, task, processes.device, config.process.amp, run.seed, config.model.model,
                             os.path.join(out, BEST_WEIGHTS), processes.main)
    context = RunContext(processes, data, task, clock, run_optim, evaluator, config.model.model, optim.epochs,
                         warmup_epochs=optim.warmup_epochs, out=out, seed=run.seed, eval_every=run.eval_every,
                         save_every=run.save_every, progress=run.progress, tensorboard=run.tensorboard)
    return context, state


def _start(cfg: Union[Mapping[str, Any], TrainConfig], resume):
    """Processes, output directory (locked, rank 0), data, task, clock and state; every rank fails if one does.
    The whole config is validated here, once, and each part receives the typed sections it reads."""
    started = time.monotonic()  # the run's clock (TrainState.elapsed_seconds) counts the set-up too
    config = resolve_run_config(cfg)
    check_model_input(config.model, config.data)
    setup_threads(config.process)
    processes = init_distributed(config.process, config.model.compile)
    lock, resume = claim_output(config.run.output, processes, LAST_CHECKPOINT, resume)
    try:
        random_seed(config.run.seed)  # the same initial weights on every rank
        run, state = _build(config, processes, started)
        history = _resume(run, state, resume) if resume else []
        run.clock.checked_update = state.num_updates
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if run.main:
        _announce(run, state)
    return run, state, history, lock, config.mae


def _announce(run: RunContext, state: TrainState):
    """Write ``config.yaml``, open TensorBoard, print the run's one-line summary (rank 0)."""
    save_yaml(dict(state.config_record), os.path.join(run.out, CONFIG_FILE))
    if run.tensorboard:
        from torch.utils.tensorboard import SummaryWriter  # optional extra: imported only when asked for
        run.writer = SummaryWriter(os.path.join(run.out, 'tb'))
    warmup = run.warmup_epochs
    if warmup >= run.epochs:  # a smoke test's default warmup: accepted, and said
        print(f'note: warmup_epochs {warmup} >= epochs {run.epochs}: the warmup takes the whole run '
              '(the lr rises to its peak at the last update and never decays)')
    n_params = sum(p.numel() for p in state.model.parameters())
    data = run.data
    print(f"{run.model_name}: {n_params / 1e6:.2f}M params, {dataset_size(data.train_ds)} train / "
          f"{dataset_size(data.val_ds)} val images, "
          f"{run.processes.world} process(es) on {run.processes.device}{_backend()}, global batch {data.global_batch}, "
          f"{data.updates_per_epoch} updates/epoch, lr {run.optim.lr:.3g}, task {run.task.name}"
          + (f'\n{state.init_report}' if state.init_report else ''))


def _train_epochs(run: RunContext, state: TrainState, history: list):
    """Every epoch left: train, evaluate, grow, log, checkpoint; stop after a checkpoint on a signal."""
    clock = run.clock
    for epoch in range(state.epochs_done, run.epochs):
        row = dict(epoch=epoch, **train_one_epoch(state, run.data, run.task, run.optim, clock, run.processes, epoch,
                                                  epochs=run.epochs, progress=run.progress))
        last_epoch = epoch + 1 == run.epochs
        if (epoch + 1) % run.eval_every == 0 or last_epoch:
            row.update(run.evaluator.epoch(state, epoch, last_epoch))
        row['tokens'] = sum(growth.model_size(state.model).values())
        row.update(run.processes.plan.peak_memory())  # CUDA: the allocator's peak of the epoch, in MiB
        row['elapsed_minutes'] = state.elapsed_seconds() / 60  # the whole run's, across resumes
        row.update(_grow_if_due(run, state, epoch))
        state.epochs_done, state.batches_done = epoch + 1, 0
        state.reset_meter()
        log_epoch(run, history, row)
        stop = clock.check(state, force=True)  # all ranks agree on a signal that came during evaluation
        if (epoch + 1) % run.save_every == 0 or last_epoch or stop:
            clock.save(state)
            if run.main:
                source = 'ema' if state.ema else 'model'
                save_weights((state.ema.module if state.ema else state.model).state_dict(),
                             os.path.join(run.out, LAST_WEIGHTS), metadata=dict(model=run.model_name, epoch=epoch,
                                                                                source=source))
        if stop:
            raise Preempted(f'stopped by {clock.stop_signal} after epoch {epoch + 1}; state saved to '
                            f'{clock.checkpoint_path}: continue with --resume', clock.stop_signal)


def _grow_if_due(run: RunContext, state: TrainState, epoch: int) -> dict:
    """Grow after ``epoch`` if the growth section says so; the row's ``grown`` (and, with ``eval_after_step``,
    the step's loss jump: ``val_loss_after_growth``, ``top1_after_growth``)."""
    due = run.optim.due(run.epochs, epoch)
    if not due:
        return {}
    # new tokens drawn from their own stream: the same on every rank, unrelated to the data's
    row = dict(grown=str(run.optim.grow(state, due, seed=derive_seed('growth', run.seed, epoch + 1, bits=31))))
    if run.optim.eval_after_step and run.task.name != 'mae':  # the step's loss jump (tau: recompute)
        after = run.evaluator.net(state.net, run.data.val_loader)
        row.update(val_loss_after_growth=after['loss'], top1_after_growth=after['top1'])
    return row


def _finish(run: RunContext, state: TrainState, history: list, mae: MaeConfig):
    """The pictures at the end of a run (rank 0): loss and accuracy curves; an MAE's reconstructions (``mae``:
    the MAE section)."""
    if not run.main:
        return
    if history:
        plot_curves(history, os.path.join(run.out, CURVES_FILE), title=f'{run.model_name} ({run.task.name})',
                    train_label=run.task.train_loss_label)
    if run.task.name == 'mae' and mae.recon_images:
        save_reconstructions(state.ema.module if state.ema else state.model, run.data.val_ds, *run.data.mean_std,
                             os.path.join(run.out, RECONSTRUCTION_FILE), mae.recon_images, mae.mask_ratio,
                             run.processes.device)


def train(
        cfg: Union[Mapping[str, Any], TrainConfig],
        resume: Union[None, bool, str] = None,
) -> dict:
    """Train as ``cfg`` says; returns ``dict(top1, top5, best_top1, val_loss, test_top1, ema_test_top1,
    best_test_top1, best_source, best_epoch, epochs, output, model, history, ema)``: ``top1`` / ``top5`` /
    ``best_top1`` on the validation split; ``test_top1`` / ``ema_test_top1`` / ``best_test_top1`` on the test
    split (None without one: ``tkvision.data.has_test_split``) of the last raw weights, the last EMA
    weights and the weights saved as ``best.safetensors`` (``best_source``: ``'model'`` or ``'ema'``, of epoch
    ``best_epoch``, counted from 0); ``ema``: whether ``last.safetensors`` holds EMA weights (``top1`` is the
    raw model's).

    Args:
        cfg: a flat config from [`tkvision.engine.config.load_config`][tkvision.engine.config.load_config], or a
            [`TrainConfig`][tkvision.engine.config.TrainConfig]; validated here, once, into typed sections.
        resume: a ``last.pth`` path, ``True`` for ``<output>/last.pth``, or None. The run continues at
            the saved update (mid-epoch included) with the same data order and random draws, so the
            result equals an uninterrupted run's. Keys of `tkvision.engine.config.RESUME_MUTABLE`
            may differ from the checkpoint's (reported); any other difference is an error.

    Raises:
        ConfigError: a bad setting, or a key that cannot change on resume (named).
        RunError: the output directory holds another run or is locked by a running one.
        NonFiniteLossError: NaN/inf loss (update range named; the last checkpoint is left intact).
        Preempted: SIGTERM / SIGUSR1 arrived; ``last.pth`` was written first.
        FileNotFoundError: missing data (naming the path and how to get it).
    """
    run, state, history, lock, mae = _start(cfg, resume)
    previous = {s: signal.signal(s, run.clock.on_signal) for s in STOP_SIGNALS}
    try:
        if state.epochs_done >= run.epochs and run.main:
            print(f"nothing to train: {run.clock.checkpoint_path} has finished all {run.epochs} epochs "
                  f"(best {_best_words(state.best)}); pass --epochs N with N > {run.epochs} to continue")
        try:
            _train_epochs(run, state, history)
        except RuntimeError as error:  # a peer that died mid-collective: one line, not gloo's or NCCL's traceback
            if run.processes.world > 1 and is_peer_failure(error):
                raise RunError(f'rank {run.processes.rank}: another process of this job ended or stopped answering '
                               f'during a collective ({str(error).splitlines()[0][:160]}); the job stops here '
                               f'(torchrun names the process that failed); continue it with --resume from '
                               f'{run.clock.checkpoint_path}') from None
            raise
        _finish(run, state, history, mae)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        run.data.close()
        if run.writer is not None:
            run.writer.close()
        if lock is not None:
            lock.release()
    last = history[-1] if history else {}
    return dict(top1=_number(last.get('top1')), top5=_number(last.get('top5')), best_top1=state.best.get('top1'),
                val_loss=_number(last.get('val_loss')), test_top1=_number(last.get('test_top1')),
                ema_test_top1=_number(last.get('ema_test_top1')), best_test_top1=_number(last.get('best_test_top1')),
                best_source=state.best.get('source'), best_epoch=state.best.get('epoch'),
                epochs=run.epochs, output=run.out, model=state.model,
                history=history, ema=state.ema is not None)


def _backend() -> str:
    """`` (nccl)`` / `` (gloo)``: the process group's backend under a launcher, else nothing."""
    return f' ({dist.get_backend()})' if dist.is_available() and dist.is_initialized() else ''


def _number(v):
    return None if v in (None, '') else float(v)


def _best_words(best: dict) -> str:
    return f"top-1 {best['top1']:.2f}%" if 'top1' in best else f"val loss {best['val_loss']:.4f}"

