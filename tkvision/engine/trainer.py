"""Training: the MAE supervised recipe, MAE pretraining and fine-tuning, linear probing (and small
real-data recipes) on one process or many.

[`Trainer`][tkvision.engine.trainer.Trainer] is the run (torchtitan's ``Trainer``,
https://github.com/pytorch/torchtitan/blob/main/torchtitan/train.py): it keeps its config (``TrainConfig``) and
reads it in place, builds every part from the sections it reads and keeps them as attributes: the processes, the
data (``tkvision.engine.run_data.RunData``), the task (``tkvision.engine.loss.TrainTask``), the clock
(``tkvision.engine.clock.RunClock``), the optimisation (``tkvision.engine.optim.RunOptim``), the evaluation
(``tkvision.engine.run_eval.RunEvaluator``), the state that is saved (``tkvision.engine.state.TrainState``) and the
run log that owns every other file and scalar the run writes (``tkvision.engine.runlog.RunLog``, with the loggers of
the ``loggers`` key). [`train`][tkvision.engine.trainer.train] is the public entry point: ``Trainer(cfg,
resume).train()``.

``task`` selects what is trained (``tkvision.engine.tasks``, one class each): ``classify`` (a classifier on
labels), ``mae`` (a [`MaskedAutoencoder`][tkvision.models.mae.MaskedAutoencoder] around ``model``; the loss is the
reconstruction error, labels are not used, evaluation reports the validation reconstruction loss with fixed masks,
and ``reconstruction.png`` is written at the end), ``linprobe`` (the ``init_from`` encoder frozen, MAE's BatchNorm +
linear head trained) or ``regress`` (one number per image, least squares). The trainer asks the task; it names none.
``init_from`` an MAE checkpoint loads its encoder (`tkvision.engine.checkpoint.load_init_weights`, reporting what was
loaded and dropped).

Glue over timm and PyTorch: ``timm.create_model``, ``create_optimizer_v2`` and ``create_scheduler_v2``
(`optim`), ``timm.data.Mixup``, timm's label-smoothing / soft-target losses, ``timm.utils.ModelEmaV3``,
``dispatch_clip_grad``, ``torch.autocast``, ``DistributedDataParallel`` under ``torchrun`` or SLURM, tqdm,
TensorBoard, Weights & Biases and MLflow.

An epoch is ``tkvision.engine.loop.train_one_epoch``, ``tkvision.engine.run_eval.RunEvaluator.epoch`` and
``RunLog.epoch``. What a pre-empted or killed run does, and which files it writes, is decided by `checkpoint` and
`runlog`: ``--resume`` continues at the exact update with the same data order and random draws, so the result is
bit-identical to an uninterrupted run for any ``num_workers``, and each tracker run is continued, not restarted.
"""
import os
import signal
import time
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from timm.utils import random_seed

from .. import growth
from ..data import DataConfig, data_source_of, dataset_size, default_num_classes
from ..layers import set_backward_mode
from ..models import input_shape
from ..utils.errors import EXIT_PREEMPTED, ConfigError, RunError
from ..utils.files import file_sha256
from ..utils.seeding import derive_seed
from .build import MaeConfig, ModelConfig
from .checkpoint import (BEST_WEIGHTS, LAST_CHECKPOINT, LAST_WEIGHTS, load_init_weights, load_teacher,
                         load_training_checkpoint, save_weights)
from .clock import STOP_SIGNALS, RunClock
from .healing import Healer
from .config import TrainConfig, config_changes, resolve_run_config
from .distributed import Processes, init_distributed, is_peer_failure, setup_threads
from .loop import NonFiniteLossError, Preempted, train_one_epoch
from .loss import TrainTask, check_teacher
from .optim import RunOptim, resolve_accum_steps, resolve_lr
from .run_data import RunData
from .run_eval import RunEvaluator
from .rundir import claim_output, run_files
from .runlog import FAILED, FINISHED, PREEMPTED, RunLog
from .state import TrainState
from .tasks import Task, task_named

__all__ = ['Trainer', 'train', 'build_train_model', 'check_model_input', 'build_state', 'TrainState',
           'NonFiniteLossError', 'Preempted', 'EXIT_PREEMPTED']


class Trainer:
    """One training run: its config, its parts and its outputs (module docstring).

    Building it validates the config once, starts the processes, builds the model once (before any work, so a model
    that cannot take the data's images is refused first), claims the output folder (rank 0 locks it; every rank
    fails if one does), builds the parts in the order that fixes the random draws and, with ``resume``, loads the
    checkpoint. `train` runs the epochs left.

    Args:
        cfg: a flat config (``tkvision.engine.config.load_config``) or a ``TrainConfig``; validated here, once, into
            typed sections.
        resume: a ``last.pth`` path, ``True`` for ``<output>/last.pth``, or None (a launcher's restart of this very
            job resumes by itself: ``tkvision.engine.rundir.claim_output``).

    Attributes:
        config: the resolved ``TrainConfig``, read in place.
        task: what is trained (``tkvision.engine.tasks.Task``).
        processes: this process among the job's.
        data, step, clock, optim, evaluator, state, log: the run's parts (module docstring); ``step`` is the
            ``TrainTask`` (each step's forward passes and losses).

    Raises:
        ConfigError: a bad setting, a model that cannot take the data's images, a logger whose client is missing,
            or a key that cannot change on resume (named).
        RunError: the output folder holds another run or is locked by a running one; nothing to resume.
        FileNotFoundError: missing data or ``init_from`` (naming the path and how to get it).
    """

    def __init__(self, cfg: Union[Mapping[str, Any], TrainConfig], resume: Union[None, bool, str] = None):
        started = time.monotonic()  # the run's clock (TrainState.elapsed_seconds) counts the set-up too
        if not isinstance(cfg, (Mapping, TrainConfig)):
            raise ConfigError(f'Trainer takes a config: a mapping (tkvision.engine.config.load_config'
                              f"('fashion_mnist/quick') reads a recipe or a file) or a TrainConfig, not "
                              f'{type(cfg).__name__} {cfg!r:.60}')
        self.config = config = resolve_run_config(cfg)
        self.task = task_named(config.run.task)
        self.threads = setup_threads(config.process)
        self.processes = init_distributed(config.process, config.model.compile)
        self.log = RunLog(config.run.output, config.run.loggers, self.processes.main, config.optim.epochs)
        random_seed(config.run.seed)  # the same initial weights on every rank (a teacher's build draws first)
        teacher = load_teacher(config.loss.teacher, self.processes.device) if config.loss.teacher else None
        built = build_train_model(config.model, config.mae, default_num_classes(config.data), self.task,
                                  self.processes.device)
        check_model_input(built[0], config.model.model, config.data)
        self.lock, resume = claim_output(config.run.output, self.processes, LAST_CHECKPOINT, resume,
                                         RunLog.early_files(config.run.loggers))
        try:
            self.accum = self._accum(resume)
            self._build(built, teacher, started)
            self.resumed_epochs = self._resume(resume) if resume else None
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise
        self.clock.checked_update = self.state.num_updates
        self.finished_before = self.state.epochs_done >= config.optim.epochs
        if self.finished_before:  # a finished run's files are left as they are
            self.log.read_history(self.resumed_epochs)
        else:
            self.log.start(self.state.config_record, self.state if self.resumed_epochs is not None else None)
            self._announce()

    def _build(self, built: Tuple[torch.nn.Module, dict, str], teacher: Optional[torch.nn.Module],
               started: float) -> None:
        """The parts, each from the sections it reads: data, clock, optimisation, state, step and evaluation."""
        config, processes, out = self.config, self.processes, self.config.run.output
        data, optim, seed = config.data, config.optim, config.run.seed
        self.data = RunData(data, self.accum, seed, processes, model=built[0],
                            global_batch_key=optim.global_batch_size is not None)
        self.clock = RunClock(processes, os.path.join(out, LAST_CHECKPOINT), log_interval=config.run.log_interval,
                              every_steps=config.run.checkpoint_every_steps,
                              every_minutes=config.run.checkpoint_every_minutes, before_save=self._before_checkpoint,
                              healer=Healer(config.healing, config.run.log_interval, processes.world))
        self.optim = RunOptim(optim, config.growth, lr=resolve_lr(optim, data.batch_size, processes.world,
                                                                  self.data.global_batch),
                              updates_per_epoch=self.data.updates_per_epoch,
                              freeze_loaded_tokens=config.model.freeze_loaded_tokens)
        self.state = build_state(config, self.optim, processes, started, built=built)
        self.state.global_batch = self.data.global_batch
        num_classes = int(getattr(self.state.model, 'num_classes', 0))  # every timm classifier has it; an MAE none
        if teacher is not None:
            check_teacher(teacher, num_classes, input_shape(self.state.model)[0])
        self.step = TrainTask(config.loss, self.task, seed, num_classes, teacher)
        self.evaluator = RunEvaluator(self.data, self.step, processes, seed, config.model.model,
                                      os.path.join(out, BEST_WEIGHTS), self.log.path)

    def _accum(self, resume: Union[None, bool, str]) -> int:
        """Micro-batches per update: the config's (``resolve_accum_steps``), or for a run resumed from a checkpoint
        written by another number of processes, what keeps that run's global batch: ``global batch / (batch_size x
        processes)``, each process taking its share of every global batch.

        Raises:
            RunError: the checkpoint's global batch is not a multiple of ``batch_size`` x this job's processes.
        """
        optim, data, world = self.config.optim, self.config.data, self.processes.world
        accum = resolve_accum_steps(optim, data.batch_size, world)
        path = self._checkpoint_path() if resume is True else resume
        if not (resume and os.path.isfile(str(path))):
            return accum
        saved = torch.load(str(path), map_location='cpu', weights_only=True, mmap=True)
        saved_world = saved.get('world_size', world)
        global_batch = saved.get('global_batch') or data.batch_size * accum * saved_world
        if saved_world == world:
            return accum
        if global_batch % (data.batch_size * world):
            raise RunError(f'{path} was trained with a global batch of {global_batch} on {saved_world} process(es); '
                           f'{world} process(es) of batch_size {data.batch_size} cannot make it up (it is no multiple '
                           f'of {data.batch_size * world}): resume on a number of processes that divides it')
        return global_batch // (data.batch_size * world)

    def _checkpoint_path(self) -> str:
        """The run's ``last.pth``."""
        return os.path.join(self.config.run.output, LAST_CHECKPOINT)

    def _rescale_position(self, saved_world: int) -> None:
        """A checkpoint of ``saved_world`` processes resumed on this job's: the epoch's position counted in this job's
        micro-batches (the samples done are the same: the global order is one sequence, each process taking every
        ``world``-th sample), and one line saying what is and is not the same."""
        world, data = self.processes.world, self.data
        self.state.batches_done = self.state.batches_done * saved_world // world
        if self.processes.main:
            print(f'resumed on {world} process(es) a run of {saved_world}: the global batch stays {data.global_batch} '
                  f'(batch_size {self.config.data.batch_size} x accumulation {data.accum} x {world} process(es)) and '
                  'every update takes the same samples; the per-micro-batch random draws (mixup, drop path) and '
                  'the order gradients are summed in differ, so the run is not bit-identical to one that stayed')

    def _before_checkpoint(self, state: TrainState) -> None:
        """What a checkpoint covers goes out first: the run log's kept updates to the trackers, and with ``compile``
        the compile caches (``compile_cache.bin``)."""
        self.log.flush(state)
        if self.processes.plan.compile and self.config.model.compile_cache:
            self.log.save_compile_cache(self._compile_key())

    def _compile_key(self) -> Dict[str, str]:
        """What compiled code holds good for: torch, the device and the model (its name, keywords, MAE section and
        Pattention's backward mode), as text."""
        device = self.processes.device
        name = torch.cuda.get_device_name(device) if device.type == 'cuda' else device.type
        model = self.config.model
        return dict(torch=torch.__version__, device=name, model=f'{model.model} {dict(model.model_kwargs)} '
                    f'{model.backward_mode} {model.drop_path_rate} {self.config.mae}')

    def _resume(self, resume: Union[bool, str]) -> Optional[int]:
        """Load the checkpoint into the state; check and report config changes. Returns the epochs it holds, or None
        when a run killed before its first checkpoint (``resume`` True) starts from scratch."""
        out, main = self.config.run.output, self.processes.main
        path = self.clock.checkpoint_path if resume is True else str(resume)
        if not os.path.isfile(path):
            if resume is True and not run_files(out, RunLog.early_files(self.config.run.loggers)):
                if main:
                    print(f'no checkpoint yet in {out}: starting the run from scratch')
                return None
            stopped = resume is True and run_files(out, RunLog.early_files(self.config.run.loggers))
            raise RunError(f'nothing to resume: no checkpoint at {path}' + (
                f' ({out} holds a run that stopped before its first one): remove its files to train there from the '
                'start, or pass another --output' if stopped else ''))
        ckpt = load_training_checkpoint(path)
        saved_world = ckpt.get('world_size', self.processes.world)
        _check_inputs(ckpt.get('inputs', {}), self.state.inputs, main)
        allowed, forbidden = config_changes(ckpt['saved_config'], dict(self.state.config_record))
        if forbidden:
            raise ConfigError('these keys cannot change when resuming (they fix the model, the data or the sample '
                              'order; start a new run with another --output instead): ' + '; '.join(forbidden))
        self.optim.resume(self.state, ckpt, path)
        self.clock.healer.load_state_dict(ckpt.get('healing', {}))
        if saved_world != self.processes.world:
            self._rescale_position(saved_world)
        if self.processes.plan.compile and self.config.model.compile_cache:
            said = self.log.load_compile_cache(self._compile_key())
            if main and said:
                print(said)
        if main:
            print(f'resumed from {path} at epoch {self.state.epochs_done + 1}, batch {self.state.batches_done}, update '
                  f'{self.state.num_updates}' + ('; changed: ' + '; '.join(allowed) if allowed else ''))
        return self.state.epochs_done

    def _announce(self) -> None:
        """Print the run's one-line summary (rank 0)."""
        if not self.processes.main:
            return
        epochs, warmup = self.config.optim.epochs, self.config.optim.warmup_epochs
        if warmup >= epochs:  # a smoke test's default warmup: accepted, and said
            print(f'note: warmup_epochs {warmup} >= epochs {epochs}: the warmup takes the whole run '
                  '(the lr rises to its peak at the last update and never decays)')
        n_params = sum(p.numel() for p in self.state.model.parameters())
        data, processes = self.data, self.processes
        print(f"{self.config.model.model}: {n_params / 1e6:.2f}M params, {dataset_size(data.train_ds)} train / "
              f"{dataset_size(data.val_ds)} val images, {processes.world} process(es) on {processes.device}"
              f"{_backend()}, global batch {data.global_batch}, {data.updates_per_epoch} updates/epoch, "
              f"lr {self.optim.lr:.3g}, task {self.task.name}"
              + (f', {self.threads}' if processes.device.type == 'cpu' else '')
              + (f'\n{self.state.init_report}' if self.state.init_report else ''))

    def train(self) -> dict:
        """Train the epochs left; returns ``dict(top1, top5, best_top1, val_loss, test_top1, ema_test_top1,
        best_test_top1, best_source, best_epoch, epochs, output, model, history, ema)`` (as `train`). The loggers are
        closed, the loaders stopped and the folder unlocked on every way out.

        Raises:
            NonFiniteLossError: NaN/inf loss (update range named; the last checkpoint is left intact).
            Preempted: SIGTERM / SIGUSR1 / SIGUSR2, or a first Ctrl-C (SIGINT), arrived; ``last.pth`` was written
                first.
            KeyboardInterrupt: a second Ctrl-C, at once (nothing saved since the last checkpoint).
            RunError: another process of the job ended during a collective.
        """
        previous = {s: signal.signal(s, self.clock.on_signal) for s in STOP_SIGNALS}
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, self.clock.on_interrupt)
        status = FAILED
        try:
            if self.finished_before and self.processes.main:
                print(f"nothing to train: {self.clock.checkpoint_path} has finished all {self.config.optim.epochs} "
                      f"epochs (best {_best_words(self.state.best)}); pass --epochs N with N > "
                      f"{self.config.optim.epochs} to continue")
            self._train_epochs()
            if not self.finished_before:
                self._finish()
            status = FINISHED
        except Preempted:
            status = PREEMPTED
            raise
        finally:
            self.data.close()
            self.log.finish(status, self.state, self.evaluator.best_path)
            if self.lock is not None:
                self.lock.release()
            # last: a stop signal while the trackers finish is only recorded, not handed to a handler that stops
            for s, h in previous.items():
                signal.signal(s, h)
        return self._result()

    def close(self) -> None:
        """Release the output folder without training (`train` releases it on every way out; a dropped ``Trainer``
        releases it when collected); a second call does nothing."""
        if self.lock is not None:
            self.lock.release()

    def _train_epochs(self) -> None:
        """Every epoch left (a peer that died mid-collective: one line, not gloo's or NCCL's traceback)."""
        try:
            for epoch in range(self.state.epochs_done, self.config.optim.epochs):
                self._epoch(epoch)
        except RuntimeError as error:
            if self.processes.world > 1 and is_peer_failure(error):
                raise RunError(f'rank {self.processes.rank}: another process of this job ended or stopped answering '
                               f'during a collective ({str(error).splitlines()[0][:160]}); the job stops here '
                               f'(torchrun names the process that failed); continue it with --resume from '
                               f'{self.clock.checkpoint_path}') from None
            raise

    def _epoch(self, epoch: int) -> None:
        """Train, evaluate, grow, log and checkpoint epoch ``epoch``; stop after a checkpoint on a signal."""
        state, clock, run, epochs = self.state, self.clock, self.config.run, self.config.optim.epochs
        row = dict(epoch=epoch, **train_one_epoch(state, self.data, self.step, self.optim, clock, self.processes,
                                                  self.log, epoch, epochs=epochs, progress=run.progress))
        last_epoch = epoch + 1 == epochs
        if (epoch + 1) % run.eval_every == 0 or last_epoch:
            row.update(self.evaluator.epoch(state, epoch, last_epoch))
        row['tokens'] = sum(growth.model_size(state.model).values())
        row.update(self.processes.plan.peak_memory())  # CUDA: the allocator's peak of the epoch, in MiB
        row['elapsed_minutes'] = state.elapsed_seconds() / 60  # the whole run's, across resumes
        row.update(self._grow_if_due(epoch))
        state.epochs_done, state.batches_done = epoch + 1, 0
        self.log.epoch(row, state)
        state.reset_meter()
        stop = clock.check(state, force=True)  # all ranks agree on a signal that came during evaluation
        if (epoch + 1) % run.save_every == 0 or last_epoch or stop:
            clock.save(state)
            if self.processes.main:
                weights = state.ema.module if state.ema else state.model
                save_weights(weights.state_dict(), os.path.join(run.output, LAST_WEIGHTS),
                             metadata=dict(model=self.config.model.model, epoch=epoch,
                                           source='ema' if state.ema else 'model'))
        if stop:
            raise Preempted(f'stopped by {clock.stop_signal} after epoch {epoch + 1}; state saved to '
                            f'{clock.checkpoint_path}: continue with --resume', clock.stop_signal)

    def _grow_if_due(self, epoch: int) -> dict:
        """Grow after ``epoch`` if the growth section says so; the row's ``grown`` (and, with ``eval_after_step``,
        the step's loss jump: ``val_loss_after_growth``, ``top1_after_growth``)."""
        due = self.optim.due(self.config.optim.epochs, epoch)
        if not due:
            return {}
        # new tokens drawn from their own stream: the same on every rank, unrelated to the data's
        seed = derive_seed('growth', self.config.run.seed, epoch + 1, bits=31)
        row = dict(grown=str(self.optim.grow(self.state, due, seed=seed)))
        if self.optim.eval_after_step:  # the step's loss jump (tau: recompute)
            row.update(self.task.after_growth(self.evaluator.net(self.state.net, self.data.val_loader)))
        return row

    def _finish(self) -> None:
        """The pictures at the end of a run (rank 0): the curves the task names, and the task's own (an MAE's
        reconstructions)."""
        self.log.curves(f'{self.config.model.model} ({self.task.name})',
                        *self.task.curves(self.config.loss.train_loss_label()))
        state = self.state
        if self.processes.main:
            self.task.end_of_run(state.ema.module if state.ema else state.model, self.data.val_ds, self.data.mean_std,
                                 self.log.path, self.config.mae, self.processes.device)

    def _result(self) -> dict:
        history, state = self.log.history, self.state
        last = history[-1] if history else {}
        columns = {k: _number(v) for k, v in last.items() if _is_number(v)}
        return dict(columns, task=self.task.name, top1=_number(last.get('top1')), top5=_number(last.get('top5')),
                    best_top1=state.best.get('top1'),
                    val_loss=_number(last.get('val_loss')), test_top1=_number(last.get('test_top1')),
                    ema_test_top1=_number(last.get('ema_test_top1')),
                    best_test_top1=_number(last.get('best_test_top1')), best_source=state.best.get('source'),
                    best_epoch=state.best.get('epoch'), epochs=self.config.optim.epochs, output=self.config.run.output,
                    model=state.model, history=history, ema=state.ema is not None)


def train(
        cfg: Union[Mapping[str, Any], TrainConfig],
        resume: Union[None, bool, str] = None,
) -> dict:
    """Train as ``cfg`` says (``Trainer(cfg, resume).train()``); returns ``dict(top1, top5, best_top1, val_loss,
    test_top1, ema_test_top1, best_test_top1, best_source, best_epoch, epochs, output, model, history, ema)``:
    ``top1`` / ``top5`` / ``best_top1`` on the validation split; ``test_top1`` / ``ema_test_top1`` /
    ``best_test_top1`` on the test split (None without one: ``tkvision.data.has_test_split``) of the last raw
    weights, the last EMA weights and the weights saved as ``best.safetensors`` (``best_source``: ``'model'`` or
    ``'ema'``, of epoch ``best_epoch``, counted from 0); ``ema``: whether ``last.safetensors`` holds EMA weights
    (``top1`` is the raw model's); ``task``: the task's name; and every other number of the last ``metrics.csv`` row
    under its column's name (a task's own columns: ``val_abs_error``).

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
        Preempted: SIGTERM / SIGUSR1 / SIGUSR2 arrived; ``last.pth`` was written first.
        FileNotFoundError: missing data (naming the path and how to get it).
    """
    return Trainer(cfg, resume).train()


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
        mae: MaeConfig,
        num_classes: int,
        task: Task,
        device: torch.device,
) -> Tuple[torch.nn.Module, dict, str]:
    """The model a run trains, on ``device``: the task's around the model section's backbone
    (``tkvision.engine.tasks.Task.build_model``: a masked autoencoder of the ``mae`` section for ``task: mae``),
    started from ``init_from`` (grown to fit), changed as the task says once loaded (``Task.prepare``: a linear
    probe freezes it), with ``grad_checkpointing`` and Pattention's ``backward_mode`` set.

    Returns:
        ``(model, grown_from, init_report)``: ``{tensor: (old, new)}`` of the ``init_from`` weights grown to fit,
        and a line saying what ``init_from`` loaded and dropped (empty without one).

    Raises:
        ConfigError: a model that refuses its kwargs (`build_model`); ``grad_checkpointing`` for a model without
            timm's ``set_grad_checkpointing``.
        FileNotFoundError, WeightsMismatchError: an ``init_from`` file that is missing or does not fit.
    """
    if model.backward_mode == 'fused' and device.type != 'cuda' and os.environ.get('TRITON_INTERPRET') != '1':
        raise ConfigError("backward_mode: fused runs Triton kernels on a CUDA device; this run's device is "
                          f'{device.type}: set backward_mode: closed_form')
    net = task.build_model(model, mae, num_classes).to(device)
    grown_from: Dict[str, Tuple[int, int]] = {}
    init_report = ''
    if model.init_from:
        grown_from, init_report = load_init_weights(net, model.init_from, task)
    task.prepare(net)
    if model.grad_checkpointing:
        set_grad_checkpointing = getattr(net, 'set_grad_checkpointing', None)
        if not callable(set_grad_checkpointing):
            raise ConfigError(f'grad_checkpointing: {model.model} has no set_grad_checkpointing (timm\'s API for '
                              'it); set grad_checkpointing: false')
        set_grad_checkpointing(True)
    set_backward_mode(net, model.backward_mode)
    return net, grown_from, init_report


def check_model_input(
        net: torch.nn.Module,
        model_name: str,
        data: DataConfig,
) -> None:
    """Refuse, before any work, a model ``net`` (``model_name``, as configured) that cannot take the data section's
    images (they would only fail at the first batch): the channels its source gives
    (``tkvision.data.registry.DataSource.channels``: Fashion-MNIST's 1, a decoded image's 3) and the size the data
    section's transforms make (``img_size``), for a model whose stem checks its input size (not a NaFlex model, nor
    one with ``dynamic_img_size``). A masked autoencoder is checked by its encoder.

    Raises:
        ConfigError: naming both channel counts or both sizes and the keys that make them agree; a ``mean`` or
            ``std`` of another length than the model's channels.
    """
    source = data_source_of(data)
    channels, size = input_shape(getattr(net, 'encoder', net))
    height, width = size if size is not None else (data.img_size, data.img_size)
    size_differs = (height, width) != (data.img_size, data.img_size)
    if channels != source.channels and size_differs:
        raise ConfigError(f"dataset {data.dataset}'s images are {data.img_size} x {data.img_size} px, "
                          f'{source.channels} channel(s) (img_size {data.img_size}); {model_name} as configured takes '
                          f'{height} x {width} px, {channels} channels: set model_kwargs {{img_size: '
                          f'{data.img_size}, in_chans: {source.channels}}} and a patch_size that divides it')
    if channels != source.channels:
        images = 'RGB images (3 channels)' if source.channels == 3 else f'{source.channels}-channel images'
        raise ConfigError(f'dataset {data.dataset} gives {images}; {model_name} as configured takes {channels}: set '
                          f'model_kwargs {{in_chans: {source.channels}}}'
                          + (' (or leave in_chans unset)' if source.channels == 3 else ''))
    if size_differs:
        raise ConfigError(f'{model_name} as configured takes {height} x {width} px images and the data section '
                          f'makes them {data.img_size} x {data.img_size} (img_size {data.img_size}): set img_size: '
                          f'{height} to feed the model its size, or model_kwargs {{img_size: {data.img_size}}} (with '
                          'a patch_size that divides it) to build the model for the data')
    for key, values in (('mean', data.mean), ('std', data.std)):
        if values is not None and len(values) != channels:
            raise ConfigError(f'{key} has {len(values)} value(s) and {model_name} takes {channels}-channel images: '
                              f'give one per channel (or leave {key} null: the model\'s, or the dataset\'s)')


def build_state(
        config: TrainConfig,
        optim: RunOptim,
        processes: Processes,
        started: Optional[float] = None,
        built: Optional[Tuple[torch.nn.Module, dict, str]] = None,
) -> TrainState:
    """The ``TrainState`` (model, optimizer, schedule, EMA, scaler) of a resolved run config
    (``resolve_run_config``): the model of `build_train_model` (``built``: its result, when the caller built it
    already), checked against what the optim, growth and loss sections need of it, then the optimizer and schedule
    from ``optim``.

    Args:
        config: a config as ``resolve_run_config`` returns it.
        optim: the run's optimizer and schedule (``tkvision.engine.optim.RunOptim``).
        processes: this process among the job's, with its device's plan (where the model and optimizer live,
            the scaler, compile and DDP).
        started: ``time.monotonic()`` when the run began; now when ``None``.
        built: ``(model, grown_from, init_report)`` of `build_train_model`, or None to build it here.
    """
    task = task_named(config.run.task)
    model, grown_from, init_report = built or build_train_model(config.model, config.mae,
                                                                default_num_classes(config.data), task,
                                                                processes.device)
    optim.check(model, config.model.model, config.loss.elastic_fractions)
    optimizer = optim.optimizer(model, grown_from)
    ema = config.optim
    return TrainState(model, optimizer, optim.scheduler(optimizer), processes=processes, best=task.best,
                      ema_decay=ema.model_ema_decay if ema.model_ema else None, config_record=config.to_dict(),
                      started=started, grown_from=grown_from, init_report=init_report, inputs=run_inputs(config))


def _backend() -> str:
    """`` (nccl)`` / `` (gloo)``: the process group's backend under a launcher, else nothing."""
    return f' ({dist.get_backend()})' if dist.is_available() and dist.is_initialized() else ''


def _number(v):
    return None if v in (None, '') else float(v)


def _is_number(v) -> bool:
    """Whether a ``metrics.csv`` value reads as a number (the last row's columns a task's message may name)."""
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return not isinstance(v, bool)


def _best_words(best: dict) -> str:
    return f"top-1 {best['top1']:.2f}%" if 'top1' in best else f"val loss {best['val_loss']:.4f}"

