"""The run log: every file and scalar a run writes besides its checkpoints, named here once, and the one answer to
what a run's folder may hold before its first checkpoint (``tkvision.engine.rundir`` asks `RunLog.early_files`).

Files of a run's folder written by the log (rank 0; the checkpoints are ``tkvision.engine.checkpoint``'s)::

    config.yaml         the resolved config (flat keys), at the start
    metrics.csv         a row per epoch (the columns of `RunLog.epoch`), rewritten atomically
    curves.png          loss and top-1 against the epoch, at the end
    reconstruction.png  an MAE's reconstructions, at the end (``tkvision.engine.reconstruction``)
    trackers.json       each logger's run id and how far it has logged: a resumed run continues the same tracker run
    rollbacks.csv       each rollback of a healed run (``tkvision.engine.healing``): the update, the loss, the reason,
                        the update it went back to and the micro-batches skipped
    resumes.csv         each resume (``--resume``, a torchrun restart, a requeue): the checkpoint's update and epochs
                        done, the UTC time and the host, so a stopped and continued run says so in its files
    compile_cache.bin   with ``compile: true``, torch.compile's caches (``torch.compiler.save_cache_artifacts``)
                        beside each checkpoint, loaded on resume when torch, the device and the model still match
    per_class.csv, confusion_matrix.csv/.png   a classifier's report of its final evaluation (the task's)
    tb/, wandb/, ...    each logger's own files (``tkvision.engine.loggers``: ``Logger.files``)

Scalars sent to the loggers, on one step axis, the optimizer update:

- every update: ``train/loss`` (the update's mean loss over rank 0's micro-batches) and ``train/lr``;
- every ``log_interval`` updates: ``train/img_per_s`` (rank 0's images times the processes, per second) and
  ``train/data_wait`` (the share of that time rank 0 waited for the loader), over the updates since the last;
- every epoch: each number of its ``metrics.csv`` row as ``epoch/<column>`` (``epoch/top1``, ``epoch/val_loss``),
  at the update that ends the epoch.

A resumed run continues each tracker run (``trackers.json`` keeps their ids) and logs from its checkpoint's update
on; what a killed attempt had logged past that update each tracker keeps once by its own rule (TensorBoard's
``purge_step`` hides the earlier attempt's events from there on, W&B keeps a run's steps increasing, MLflow's logger
skips the steps its store holds), and since resume is exact the values are the same. A logger that fails mid-run
(its server gone) costs one warning and is dropped; the run goes on.
"""
import csv
import json
import os
import socket
import sys
import time
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Type

import torch
import yaml
from tqdm import tqdm

from ..utils.errors import ConfigError, RunError
from ..utils.files import atomic_write, folder_path
from .healing import event_line
from .loggers import FAILED, FINISHED, LOGGERS, PREEMPTED, Logger, logger_class
from .plotting import Series, plot_curves
from .state import TrainState

__all__ = ['RunLog', 'CONFIG_FILE', 'METRICS_FILE', 'CURVES_FILE', 'RECONSTRUCTION_FILE', 'TRACKERS_FILE',
           'COMPILE_CACHE_FILE', 'ROLLBACKS_FILE', 'RESUMES_FILE',
           'save_yaml', 'save_rows', 'FINISHED', 'FAILED', 'PREEMPTED']

CONFIG_FILE = 'config.yaml'
METRICS_FILE = 'metrics.csv'
CURVES_FILE = 'curves.png'
RECONSTRUCTION_FILE = 'reconstruction.png'
TRACKERS_FILE = 'trackers.json'
COMPILE_CACHE_FILE = 'compile_cache.bin'
ROLLBACKS_FILE = 'rollbacks.csv'
RESUMES_FILE = 'resumes.csv'


def save_yaml(obj: object, path: str) -> None:
    """Write ``obj`` as YAML atomically (keys in their order)."""
    atomic_write(path, lambda f: yaml.safe_dump(obj, f, sort_keys=False), text=True)


def save_rows(rows: list, path: str) -> None:
    """Write a list of dicts as CSV atomically; the columns are every key, in order of appearance."""
    keys: List[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]

    def write(f):
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write, text=True)


class RunLog:
    """What a run writes besides its checkpoints (module docstring); rank 0 writes, the other ranks' logs do
    nothing.

    Args:
        out: the run's folder.
        loggers: the ``loggers`` key: backends' names (``tkvision.engine.loggers.LOGGERS``).
        main: whether this process is rank 0.
        epochs: the run's epochs (the printed line's ``epoch 3/6``).

    Raises:
        ConfigError: an unknown logger, or one whose client is not installed (the extra named), on every rank,
            before any work.

    Attributes:
        history: the ``metrics.csv`` rows so far (rank 0).
    """

    def __init__(
            self,
            out: str,
            loggers: Sequence[str],
            main: bool,
            epochs: int,
    ):
        self.out, self.main, self.epochs = out, main, epochs
        self.classes = [logger_class(name) for name in loggers]
        for cls in self.classes:
            cls.check()
        self.history: List[dict] = []
        self.loggers: Dict[str, Logger] = {}
        self._pending: List[tuple] = []
        self._mark: Optional[tuple] = None
        self._since: Optional[tuple] = None

    @staticmethod
    def early_files(loggers: Sequence[str]) -> FrozenSet[str]:
        """The names a run's folder may hold before its first checkpoint: ``config.yaml``, ``trackers.json`` and the
        files of the ``loggers`` and of every other registered logger (``Logger.files``: a rerun with other loggers
        starts there too). A folder holding no more (and the lock) is a run killed before its first checkpoint:
        nothing to continue, so it may start again there.

        Raises:
            ConfigError: an unknown name in ``loggers``."""
        named = [logger_class(n) for n in loggers]
        return frozenset({CONFIG_FILE, TRACKERS_FILE}.union(*(cls.files for cls in set(named) | set(LOGGERS.values()))))

    def path(self, name: str) -> str:
        """``<output>/<name>`` of a file written whole, under the run folder's rule (``tkvision.utils.files``: inside
        the folder, through ``atomic_write``, which replaces a link at the name and never follows it).

        Raises:
            UnsafePathError: ``name`` leaves the folder, or a link stands there (named, one line).
        """
        return folder_path(self.out, name, 'write')

    def start(self, config: Mapping[str, Any], resumed: Optional[TrainState]) -> None:
        """Write ``config.yaml`` and start each logger (rank 0). ``resumed``: a resumed run's state (its ``metrics.csv``
        rows of the epochs it holds are kept, its tracker runs continued from its update), None for a new run."""
        if not self.main:
            return
        for cls in self.classes:  # what the loggers write into in place: no link, no shared hard link
            for name in cls.files:
                folder_path(self.out, name, 'in_place')
        save_yaml(dict(config), self.path(CONFIG_FILE))
        self.read_history(resumed.epochs_done if resumed else None)
        if resumed is not None:
            self._record_resume(resumed)
        records = self._read_records(required=resumed is not None)
        for cls in self.classes:
            record, update = records.get(cls.name), resumed.num_updates if resumed else 0
            before = set(os.listdir(self.out))
            logger = self._guard(cls.name, lambda: cls(self.out, config, record, update))
            if isinstance(logger, Logger):
                self.loggers[cls.name] = logger
            self._check_declared(cls, before)
        self._write_records()

    def _record_resume(self, resumed: TrainState) -> None:
        """Append this resume to ``resumes.csv`` (rewritten whole, atomically, with the earlier ones)."""
        rows: List[dict] = []
        if os.path.isfile(os.path.join(self.out, RESUMES_FILE)):
            with open(folder_path(self.out, RESUMES_FILE, 'read'), newline='') as f:
                rows = list(csv.DictReader(f))
        rows.append(dict(update=resumed.num_updates, epochs_done=resumed.epochs_done,
                         time=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), host=socket.gethostname()))
        save_rows(rows, self.path(RESUMES_FILE))

    def _check_declared(self, cls: Type[Logger], before: set) -> None:
        """Refuse a logger that wrote into the run's folder a name it does not declare (``Logger.files``): a run
        killed before its first checkpoint could not start again there (its folder would look like a run's).

        Raises:
            ConfigError: naming the logger, the file and what to add.
        """
        added = sorted(set(os.listdir(self.out)) - before - set(cls.files) - {TRACKERS_FILE}
                       - {n for n in os.listdir(self.out) if n.startswith('.') and n.endswith('.tmp')})
        if added:
            raise ConfigError(f"logger {cls.name} wrote {', '.join(added)} into {self.out} without declaring it in its "
                              f'files (Logger.files): add it there, so that a run killed before its first checkpoint '
                              'can start again in its folder')

    def read_history(self, epochs_done: Optional[int]) -> None:
        """`history` from ``metrics.csv``: its rows of the first ``epochs_done`` epochs (a resumed run's; None: a new
        run, no rows; rank 0)."""
        self.history = []
        if self.main and epochs_done is not None and os.path.isfile(self.path(METRICS_FILE)):
            with open(folder_path(self.out, METRICS_FILE, 'read')) as f:
                self.history = [r for r in csv.DictReader(f) if int(r['epoch']) < epochs_done]

    def mark(self, state: TrainState) -> None:
        """Where the running epoch's sums stand (the loop calls it as it starts or resumes an epoch): the next
        update's loss is what they gain."""
        meter = state.meter
        self._mark = (meter['loss_sum'].clone(), meter['seen'])
        self._since = (meter['seen'], meter['seconds'], meter['data_seconds'])

    def update(self, state: TrainState) -> None:
        """After optimizer update ``state.num_updates``: keep its loss (a tensor on the device: no host
        synchronisation) and lr for the next `flush`."""
        if not (self.loggers and self._mark is not None):
            return
        meter = state.meter
        loss_sum, seen = self._mark
        loss = (meter['loss_sum'] - loss_sum) / max(meter['seen'] - seen, 1)
        self._pending.append((state.num_updates, loss, state.optimizer.param_groups[0]['lr']))
        self._mark = (meter['loss_sum'].clone(), meter['seen'])

    def flush(self, state: TrainState) -> None:
        """Send the updates kept since the last flush (one host synchronisation, at the loop's sync points), with
        the throughput and data wait since then, and have every logger write out what it holds (``Logger.flush``).
        The clock calls it before each checkpoint: what a checkpoint covers is in the trackers first, so a kill at
        any moment after it loses no update (a resume re-sends only the updates after it, which each tracker keeps
        once)."""
        if self._pending:
            self._send_pending(state)
        for name, logger in list(self.loggers.items()):
            self._guard(name, logger.flush)

    def _send_pending(self, state: TrainState) -> None:
        updates, losses, lrs = zip(*self._pending)
        self._pending = []
        for update, loss, lr in zip(updates, torch.stack(losses).tolist(), lrs):
            self._send(update, {'train/loss': loss, 'train/lr': lr})
        meter = state.meter
        if self._since is not None and meter['seconds'] > self._since[1]:
            seconds = meter['seconds'] - self._since[1]
            self._send(updates[-1], {'train/img_per_s': (meter['seen'] - self._since[0]) * state.world / seconds,
                                     'train/data_wait': min((meter['data_seconds'] - self._since[2]) / seconds, 1.0)})
        self._since = (meter['seen'], meter['seconds'], meter['data_seconds'])

    def epoch(self, row: dict, state: TrainState) -> None:
        """Append epoch ``row`` to ``metrics.csv`` (atomically rewritten), send its numbers to the loggers at the
        epoch's last update (after the updates kept until then) and print its line (rank 0)."""
        if not self.main:
            return
        if self._pending:
            self._send_pending(state)
        self.history.append(row)
        save_rows(self.history, self.path(METRICS_FILE))
        numbers = {f'epoch/{k}': v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._send(state.num_updates, numbers)
        self.flush(state)
        tqdm.write(epoch_line(row, self.epochs))

    def curves(self, title: str, losses: Series, metric: Optional[Tuple[str, str, Series]] = None) -> None:
        """Draw ``curves.png`` of the history (rank 0; nothing before a first epoch): the ``losses`` and ``metric``
        panels the task names (``tkvision.engine.tasks.Task.curves``; ``tkvision.engine.plotting.plot_curves``)."""
        if self.main and self.history:
            plot_curves(self.history, self.path(CURVES_FILE), title=title, losses=losses, metric=metric)

    def finish(self, status: str, state: Optional[TrainState], best_weights: str) -> None:
        """Send what is kept and close every logger, on every way out of a run: `FINISHED`, `FAILED` or `PREEMPTED`
        (``state``: the run's, for what is kept; None when it never started). Each logger's failure is a warning."""
        if state is not None:
            self.flush(state)
        summary = {'output': os.path.abspath(self.out)}
        if os.path.isfile(best_weights):
            summary['best_weights'] = os.path.abspath(best_weights)
        for name, logger in list(self.loggers.items()):
            self._guard(name, lambda: logger.finish(status, summary))
        self.loggers = {}

    def rolled_back(
            self,
            event: Mapping[str, Any],
            events: Sequence[Mapping[str, Any]],
            cap: int,
            state: TrainState,
    ) -> None:
        """After a rollback (``tkvision.engine.healing``): the updates kept since the snapshot are dropped (they were
        undone), and rank 0 says it in one line, rewrites ``rollbacks.csv`` with every event so far and sends
        ``event/rollback`` (the event's count) to every logger at the update the run went back to."""
        self._pending = []
        self.mark(state)
        if not self.main:
            return
        print(event_line(dict(event), len(events), cap), file=sys.stderr, flush=True)
        save_rows([dict(e) for e in events], self.path(ROLLBACKS_FILE))
        self._send(int(event['back_to']), {'event/rollback': float(len(events))})
        for name, logger in list(self.loggers.items()):
            self._guard(name, logger.flush)

    def save_compile_cache(self, key: Mapping[str, str]) -> None:
        """Write ``compile_cache.bin`` (rank 0): a JSON line of ``key`` (what the caches hold good for: torch, the
        device, the model) and the bytes of ``torch.compiler.save_cache_artifacts()``, atomically, when those changed
        since the last write; nothing before anything was compiled."""
        if not self.main:
            return
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None or artifacts[0] == getattr(self, '_compile_cache', None):
            return
        self._compile_cache = artifacts[0]
        head = (json.dumps(dict(key), sort_keys=True) + '\n').encode()

        def write(tmp: str) -> None:
            with open(tmp, 'wb') as f:
                f.write(head + artifacts[0])
        atomic_write(self.path(COMPILE_CACHE_FILE), write)

    def load_compile_cache(self, key: Mapping[str, str]) -> str:
        """Load ``compile_cache.bin`` into torch.compile's caches (``torch.compiler.load_cache_artifacts``) when its
        key equals ``key``, on every rank (each compiles); returns one line saying what happened ('' without a file).
        A cache holds compiled code: like the run's other files it is read only from the run's own folder (no link);
        resume only folders you trust, or set ``compile_cache: false``."""
        path = os.path.join(self.out, COMPILE_CACHE_FILE)
        if not os.path.isfile(path):
            return ''
        with open(folder_path(self.out, COMPILE_CACHE_FILE, 'read'), 'rb') as f:
            head, _, data = f.read().partition(b'\n')
        try:
            saved = json.loads(head)
        except ValueError:
            return f'compile cache ignored: {path} has no readable key (a cut file?); compiling again'
        differ = sorted(k for k in set(saved) | set(key) if saved.get(k) != key.get(k))
        if differ:
            what = ', '.join(f'{k} {saved.get(k)!r} -> {key.get(k)!r}' for k in differ)
            return f'compile cache ignored: made for another setting ({what[:200]}); compiling again'
        torch.compiler.load_cache_artifacts(data)
        self._compile_cache = data
        return f'compile cache loaded from {path} ({len(data) / 1e6:.1f} MB): compiled code is reused'

    def _send(self, step: int, scalars: Mapping[str, float]) -> None:
        """``scalars`` to each logger at update ``step``."""
        for name, logger in list(self.loggers.items()):
            self._guard(name, lambda: logger.log(scalars, step))

    def _guard(self, name: str, call):
        """``call()``, or on an error one warning and logger ``name`` dropped (False returned)."""
        try:
            result = call()
        except Exception as error:  # a tracker's failure (a server gone) must not cost the run
            reason = str(error).splitlines()[0][:200] if str(error) else ''
            print(f'warning: logger {name} failed ({type(error).__name__}: {reason}); it is off for the rest of this '
                  'run', file=sys.stderr)
            self.loggers.pop(name, None)
            return False
        return True if result is None else result

    def _read_records(self, required: bool) -> Dict[str, dict]:
        """The tracker runs to continue (``trackers.json``): a resumed run's, or those of an attempt killed before its
        first checkpoint that this start takes over (so its tracker runs are continued, not left behind). A record
        written in another folder (a copied run folder) is not continued: its tracker runs are the original's.

        Raises:
            RunError: (``required``, a resume) the file is unreadable, not a mapping, or a link: the trackers' runs
                to continue are unknown, and starting new ones would split the history (nothing is changed).
        """
        path = os.path.join(self.out, TRACKERS_FILE)
        if not os.path.lexists(path):
            return {}
        try:
            with open(folder_path(self.out, TRACKERS_FILE, 'read')) as f:
                records = json.load(f)
            if not (isinstance(records, dict) and all(isinstance(v, dict) for v in records.values())):
                raise ValueError('not a mapping of logger names to records')
        except (OSError, ValueError) as error:
            if not required:
                return {}
            raise RunError(f'{path} cannot be read ({str(error).splitlines()[0][:120]}): the tracker runs this run '
                           'continues are unknown, so nothing was changed; restore the file, or remove it to start new '
                           'tracker runs (scalars.jsonl and metrics.csv keep their lines)') from None
        folder = records.pop('folder', {}).get('path')
        if folder is not None and folder != os.path.realpath(self.out):
            print(f'note: {path} was written in {folder}: this copy starts new tracker runs', file=sys.stderr)
            return {}
        return records

    def _write_records(self) -> None:
        if not self.loggers:
            return
        records = {'folder': {'path': os.path.realpath(self.out)}}  # a copied folder's trackers are the original's
        for name, logger in list(self.loggers.items()):
            record = self._guard(name, logger.record)
            if isinstance(record, dict):
                records[name] = record
        atomic_write(self.path(TRACKERS_FILE), lambda f: json.dump(records, f, indent=1), text=True)


def epoch_line(row: Mapping[str, Any], epochs: int) -> str:
    """The printed line of an epoch's ``metrics.csv`` row (of ``epochs``)."""
    skipped = row['skipped'] + row.get('val_skipped', 0)
    return (f"epoch {row['epoch'] + 1}/{epochs}  train loss {row['train_loss']:.4f}  "
            + (f"val top-1 {row['top1']:.2f}%  top-5 {row['top5']:.2f}%  " if 'top1' in row else '')
            + (f"val loss {row['val_loss']:.4f}  " if 'top1' not in row and 'val_loss' in row else '')
            + (f"ema top-1 {row['ema_top1']:.2f}%  " if 'ema_top1' in row else '')
            + ''.join(f"{k} {v:.2f}%  " for k, v in row.items() if k.startswith('top1@'))
            + ''.join(f"{k} {v:.4f}  " for k, v in row.items() if k.startswith('val_loss@'))
            + (f"test top-1 {row['test_top1']:.2f}% (once, at the end)  " if 'test_top1' in row else '')
            + f"{row['img_per_s']:.0f} img/s  {row['epoch_time']:.1f}s (data wait {row['data_wait']:.0%})"
            + (f'  skipped {skipped} unreadable images' if skipped else '')
            + (f"  grew to {row['grown']}" if 'grown' in row else ''))
