"""The points of a sweep and the one way a point is trained, whatever runs it.

- `SweepPoint`: one (config file, grid values, seed); its folder ``<out>/<name>/seed<k>`` and its row name
  ``<config stem>[-key=value...]``.
- `parse_grid` / `sweep_points`: ``--grid score_norm=l2_norm_gelu,softmax norm_fold=true,false`` over config
  files, the cartesian product, in the order configs -> grid -> seeds.
- `PointJob`: the callable every executor runs (this process, submitit's local executor, a SLURM array task),
  as the MAE and DeiT ``submitit_*.py`` launchers do: it trains the point with `tkvision.engine.trainer.train`,
  continues from the point's own ``last.pth`` when one is there, writes ``result.json`` (or ``failed.json``
  with the error) and, when submitit's pre-emption or time-out signal stopped it, hands that signal back to
  submitit so the job is requeued (https://github.com/facebookincubator/submitit, ``docs/checkpointing.md``).
"""
import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import threading
import traceback
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import submitit
import torch
import yaml

from ..engine.checkpoint import LAST_CHECKPOINT
from ..engine.clock import STOP_SIGNALS
from ..engine.config import DEFAULTS, load_config
from ..engine.rundir import output_dir_in_use
from ..engine.trainer import train
from ..utils.errors import ConfigError, Preempted, RunError
from ..utils.files import atomic_write
from .benchmark import code_commit, machine_info

__all__ = ['SweepPoint', 'PointJob', 'provenance', 'with_provenance', 'PROVENANCE_KEYS', 'grid_axes', 'parse_grid',
           'sweep_points', 'point_dir', 'read_record', 'point_record_problem', 'RESULT_FILE', 'FAILED_FILE',
           'SWEEP_OWNED_KEYS']

#: The longest file name, in bytes, of the file systems a sweep writes to (ext4, XFS, Lustre, GPFS, NFS).
NAME_MAX = 255
#: The most points one sweep command takes: a grid past it is a typing error (a value list pasted where one was
#: meant), refused before anything is listed or submitted.
MAX_POINTS = 10000

#: A finished point's record, in its folder.
RESULT_FILE = 'result.json'
#: A failed point's record (``error``: the exception's first line), in its folder; removed when it is retried.
FAILED_FILE = 'failed.json'


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One training run of a sweep.

    Args:
        config: the config file (a path, or a shipped recipe's name).
        seed: the run's ``seed``.
        grid: ``(key, value)`` pairs set on top of the config, values as typed on the command line (YAML, as
            ``--key value`` overrides read them). A key the flat config does not have is a model keyword
            (``score_norm`` is ``model_kwargs.score_norm``); a dotted key names a nested one.
    """
    config: str
    seed: int
    grid: Tuple[Tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """The row of the results table: the config's file name without ``.yaml``, then ``-key=value`` for each
        grid value (``norm_softmax-norm_fold=false``)."""
        stem = os.path.splitext(os.path.basename(self.config))[0]
        return stem + ''.join(f'-{key}={value}' for key, value in self.grid)

    @property
    def key(self) -> str:
        """``<name>/seed<k>``: the point in the sweep's records (``jobs.json``, ``sweep.json``)."""
        return f'{self.name}/seed{self.seed}'

    def directory(self, out: str) -> str:
        """``<out>/<name>/seed<k>``: where the point trains and writes ``result.json``."""
        return os.path.join(out, self.name, f'seed{self.seed}')

    def check_directory(self, out: str) -> str:
        """`directory`, once it is known to be a folder under ``out`` reached without a symbolic link: its name has
        no ``.`` / ``..`` / empty part (a grid value such as ``/../victim`` would lead out of the sweep), and no
        part of it below ``out`` is a link (a planted link would lead elsewhere). Nothing is created or removed.

        Raises:
            ConfigError: naming the point, the path and what to do.
        """
        relative = os.path.join(self.name, f'seed{self.seed}')
        parts = relative.split(os.sep)
        if os.path.isabs(relative) or any(part in ('', '.', '..') for part in parts):
            raise ConfigError(f'point {self.key}: its folder {os.path.join(out, relative)} would not be a folder of '
                              f'the sweep {out} (a grid value makes an empty, "." or ".." part): use values without '
                              '"/.." and "//"; nothing was created or removed')
        shown = repr(self.key if len(self.key) <= 60 else self.key[:50] + '...')  # one line, whatever the value
        if any(ord(char) < 32 or ord(char) == 127 for char in out + relative):
            raise ConfigError(f'point {shown}: its folder holds a control character (a newline in --out {out!r} or '
                              'in a grid value would end a line of the job script): remove it; nothing was created '
                              'or removed')
        long = [len(os.fsencode(part)) for part in parts if len(os.fsencode(part)) > NAME_MAX]
        if long:
            raise ConfigError(f'point {shown}: its folder name is {long[0]} bytes, over the {NAME_MAX} a file name may '
                              'have: shorten the grid value (put a long value in a config file and sweep over config '
                              'files); nothing was created or removed')
        path = out
        for part in parts:
            path = os.path.join(path, part)
            if os.path.islink(path):
                raise ConfigError(f'point {self.key}: {path} is a symbolic link (to {os.readlink(path)!r}); a sweep '
                                  'trains only in its own folders: remove the link, or pass another --out; nothing '
                                  'was created or removed')
        return os.path.join(out, relative)

    def overrides(self) -> List[str]:
        """The grid values as ``--key value`` overrides (`tkvision.engine.config.parse_overrides`)."""
        args = []
        for key, value in self.grid:
            top = key.split('.', 1)[0]
            args += [f'--{key if top in DEFAULTS else "model_kwargs." + key}', value]
        return args

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready record (``sweep.json``); `SweepPoint.from_dict` reads it back."""
        return dict(config=self.config, seed=self.seed, grid=[list(pair) for pair in self.grid])

    @classmethod
    def from_dict(cls, record: Dict[str, Any]) -> 'SweepPoint':
        """The point of a `SweepPoint.to_dict` record.

        Raises:
            ValueError: a record that is not one (`point_record_problem` says what).
        """
        problem = point_record_problem(record)
        if problem:
            raise ValueError(f'a sweep point record {problem}')
        return cls(record['config'], record['seed'], tuple((k, v) for k, v in record.get('grid', ())))


def point_record_problem(record: Any) -> str:
    """What makes ``record`` no `SweepPoint.to_dict` record (``'has the seed \\'zero\\', not an integer'``), or
    ``''`` for a good one: a JSON object with a string ``config``, an integer ``seed`` and ``grid`` a list of
    ``[key, value]`` string pairs."""
    if not isinstance(record, dict):
        return f'is {type(record).__name__}, not an object'
    if not isinstance(record.get('config'), str):
        return f'has the config {record.get("config")!r}, not a file name'
    if not isinstance(record.get('seed'), int) or isinstance(record.get('seed'), bool):
        return f'has the seed {record.get("seed")!r}, not an integer'
    grid = record.get('grid', [])
    if not (isinstance(grid, list) and all(isinstance(pair, list) and len(pair) == 2
                                           and all(isinstance(x, str) for x in pair) for pair in grid)):
        return f'has the grid {grid!r}, not a list of [key, value] strings'
    return ''


def point_dir(out: str, config: str, seed: int) -> str:
    """``<out>/<config name>/seed<k>``: the folder of a point without grid values (`SweepPoint.directory`)."""
    return SweepPoint(config, seed).directory(out)


#: Grid keys a point may not set: the sweep sets them itself (``--out``, ``--seeds``).
SWEEP_OWNED_KEYS = {'output': '--out', 'seed': '--seeds'}


def _split_values(values: str) -> List[str]:
    """``values`` split at the commas outside brackets, braces and quotes (YAML flow items: ``[0.5,1.0],[1.0]`` is two
    values)."""
    items, depth, quote, start = [], 0, '', 0
    for i, char in enumerate(values):
        if quote:
            quote = '' if char == quote else quote
        elif char in '\'"':
            quote = char
        elif char in '[{':
            depth += 1
        elif char in ']}':
            depth -= 1
        elif char == ',' and depth == 0:
            items.append(values[start:i])
            start = i + 1
    items.append(values[start:])
    return [item.strip() for item in items]


def grid_axes(items: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """The axes of ``key=v1,v2,...`` items, in their order: ``(key, [value, ...])`` each, split as YAML flow items
    (``elastic_fractions=[0.5,1.0],[1.0]`` is two values) but not yet read as YAML (`parse_grid` does), so a grid's
    size is known cheaply before its values are read.

    Raises:
        ConfigError: an item without ``=`` or without a value, a key given twice, or a key the sweep sets itself
            (``output``, ``seed``), each named.
    """
    axes: List[Tuple[str, List[str]]] = []
    for item in items:
        key, sep, values = item.partition('=')
        choices = _split_values(values) if values else []
        if not sep or not key or not choices or '' in choices:
            raise ConfigError(f'--grid {item!r}: write key=value1,value2 (e.g. score_norm=l2_norm_gelu,softmax)')
        if key in SWEEP_OWNED_KEYS:
            raise ConfigError(f'--grid {item!r}: the sweep sets {key} itself; use {SWEEP_OWNED_KEYS[key]}')
        if key in (k for k, _ in axes):
            raise ConfigError(f'--grid: the key {key!r} is given twice; list all its values in one item')
        axes.append((key, choices))
    return axes


def parse_grid(items: Sequence[str]) -> List[Tuple[Tuple[str, str], ...]]:
    """Every combination of `grid_axes` ``items`` (the cartesian product, the first key slowest); ``[()]`` for no
    items. Values are YAML flow items, as ``--key value`` overrides read them.

    Raises:
        ConfigError: a bad item (`grid_axes`), or a value YAML cannot read (named, with its item).
    """
    axes = grid_axes(items)
    for (key, choices), item in zip(axes, items):
        for value in choices:
            try:
                yaml.safe_load(value)
            except yaml.YAMLError as error:
                raise ConfigError(f'--grid {item!r}: the value {value!r} is not YAML '
                                  f'({getattr(error, "problem", None) or "unreadable"}); quote it') from None
    return [tuple(zip([k for k, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def sweep_points(configs: Sequence[str], seeds: Sequence[int], grid: Sequence[str] = ()) -> List[SweepPoint]:
    """The sweep's points: each config, each combination of ``grid`` (`parse_grid`), each seed, in that order.

    Raises:
        ConfigError: a bad ``grid`` item (`parse_grid`), no seed, or more than `MAX_POINTS` points (counted before
            a value is read or a point made).
    """
    if not seeds:
        raise ConfigError('--seeds: give at least one seed')
    sizes = [len(values) for _, values in grid_axes(grid)]
    count = len(configs) * len(seeds) * math.prod(sizes)
    if count > MAX_POINTS:
        raise ConfigError(f'the sweep has {count} points ({len(configs)} config(s) x {" x ".join(map(str, sizes))} '
                          f'grid values x {len(seeds)} seed(s)), over the {MAX_POINTS} one command takes: split it '
                          'into several sweeps, or check the --grid values; nothing was submitted')
    return [SweepPoint(config, seed, values) for config in configs for values in parse_grid(grid) for seed in seeds]


def read_record(path: str, required: Sequence[str] = ()) -> Dict[str, Any]:
    """A point's ``result.json`` or ``failed.json`` (a JSON object, as `PointJob` writes it; a study's runs write
    fewer fields), its fields of the types `PointJob` writes.

    Args:
        path: the file.
        required: fields it must hold (a sweep's table needs ``config`` and ``seed``).

    Raises:
        RunError: a file that is not one (cut, binary, not JSON, not an object, a link, a field missing or of another
            type), naming it, the field and what to do.
    """
    try:
        if os.path.islink(path):
            raise ValueError('a symbolic link')
        with open(path, encoding='utf-8') as f:
            record = json.load(f)
        if not isinstance(record, dict):
            raise ValueError('not a JSON object')
        _check_fields(record, required)
    except (OSError, ValueError) as error:
        raise RunError(f'{path} is not a point\'s record ({str(error).splitlines()[0][:80]}): remove it, and the '
                       'point is trained again by the next run of the sweep command') from None
    return record


#: The fields of a point's record a table reads, and the types each may hold (a record from before a field existed
#: lacks it; ``None``: a run without that figure, e.g. no test split).
_RECORD_FIELDS = dict(config=(str,), seed=(int,), status=(str,), error=(str,), top1=(int, float, type(None)),
                      best_top1=(int, float, type(None)), test_top1=(int, float, type(None)),
                      val_loss=(int, float, type(None)), params=(int,), img_per_s=(int, float), minutes=(int, float))


def _check_fields(record: Dict[str, Any], required: Sequence[str]):
    """Raise ``ValueError`` naming the first field of ``record`` that is missing (of ``required``) or of a type
    `_RECORD_FIELDS` does not allow (``"top1": "high"``; a bool is no number)."""
    for key in required:
        if key not in record:
            raise ValueError(f'no "{key}"')
    for key, types in _RECORD_FIELDS.items():
        if key in record and (not isinstance(record[key], types) or isinstance(record[key], bool)):
            raise ValueError(f'"{key}" is {record[key]!r}')


def _timing(rows: list) -> dict:
    """``img_per_s`` (mean over epochs) and ``minutes`` of a finished run from its ``metrics.csv`` rows:
    the last row's ``elapsed_minutes``, the whole run's wall time across resumes."""
    last = rows[-1].get('elapsed_minutes')
    minutes = float(last) if last not in (None, '') else sum(float(r['epoch_time']) for r in rows) / 60
    return dict(img_per_s=statistics.mean(float(r['img_per_s']) for r in rows), minutes=minutes)


def _in_submitit_job() -> bool:
    """Whether this process is a task that submitit started (it sets ``SUBMITIT_EXECUTOR``)."""
    return bool(os.environ.get('SUBMITIT_EXECUTOR'))


#: What ran a point, in its record and in every per-seed results file.
PROVENANCE_KEYS = ('machine', 'commit')


def with_provenance(row: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``row`` whose `PROVENANCE_KEYS` are ``'unknown'`` where it lacks them or holds them empty (a point
    recorded, or a file written, before they existed)."""
    return {**row, **{key: str(row.get(key) or 'unknown') for key in PROVENANCE_KEYS}}


def provenance(run_dir: str) -> Dict[str, str]:
    """``dict(machine, commit)``: what trained the point in ``run_dir``, from its ``result.json`` (`PointJob` records
    `tkvision.experiments.benchmark.machine_info` and `code_commit`); ``'unknown'`` for a run without that file or
    recorded before these fields existed. The results files carry both, so a comparison can say when its two
    sides ran on different CPUs or code (``tools/render_docs.py``, the compare marker)."""
    path = os.path.join(run_dir, RESULT_FILE)
    record = read_record(path) if os.path.isfile(path) else {}
    return {key: value for key, value in with_provenance(record).items() if key in PROVENANCE_KEYS}


@contextlib.contextmanager
def _stopping_until_training(run_dir: str) -> Iterator[None]:
    """Within the block, a stop signal stops the point at once (raises `Preempted`) until the trainer sets its own
    handler (which saves ``last.pth`` first); the previous handlers come back on the way out.

    submitit's job passes over SIGTERM ("Bypassing signal SIGTERM", https://github.com/facebookincubator/submitit,
    ``submitit/core/job_environment.py``) from before it calls the point, so without this a ``kill`` that lands
    while the point loads its data and builds its model is lost: the point trains on after its sweep has stopped.
    Nothing has been trained since the point's last checkpoint then, so nothing is lost by stopping. Under SLURM
    the block does nothing: there a SIGTERM is the scheduler's (a requeue, which submitit's own SIGUSR2 handler
    may be in the middle of, or a cancel), and SLURM's SIGKILL follows it (``KillWait``). submitit's own
    pre-emption signal (SIGUSR2) is left to submitit everywhere.
    """
    if threading.current_thread() is not threading.main_thread() or os.environ.get('SUBMITIT_EXECUTOR') == 'slurm':
        yield  # signal handlers are the main thread's only
        return

    def stop(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        raise Preempted(f'stopped by {name} before training started ({run_dir}: nothing trained since its last '
                        'checkpoint); rerun the sweep command to continue', name)
    submitit_own = f'SIG{submitit.JobEnvironment.USR_SIG}' if _in_submitit_job() else None  # it requeues the job
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS if s.name != submitit_own}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class PointJob:
    """Train one `SweepPoint`: what every executor runs, in this process or as a submitit job.

    A finished point (its ``result.json``) is returned as it is, never trained again; a point with a
    ``last.pth`` continues from it at the saved update (the trainer's resume: the result is bit-identical to an
    uninterrupted run); otherwise its folder is emptied and the point starts. A point that raises is recorded in
    ``failed.json`` (the error's first line) and returned with ``status: 'failed'``, so the other points go on.
    In a submitit job of several tasks the torch.distributed environment is exported from submitit's
    (``submitit.helpers.TorchDistributedEnvironment``), so the point is one distributed training job.

    Args:
        point: the point.
        out: the sweep's folder.
        extra: overrides for every point (``--epochs 3``).

    Raises:
        RunError: another process is training the point (its folder's lock is held): nothing is touched.
        Preempted: SIGTERM / SIGUSR1 / SIGUSR2 stopped the point (its ``last.pth`` written). Under submitit,
            submitit's own signal is first handed back to submitit, which calls `PointJob.checkpoint` and
            requeues the job. A stop signal before the trainer has set its handler (while the data loads) stops
            the point at once, with nothing to save.
    """

    def __init__(self, point: SweepPoint, out: str, extra: Sequence[str] = ()):
        self.point, self.out, self.extra = point, out, list(extra)

    def __call__(self) -> Dict[str, Any]:
        run_dir = self.point.check_directory(self.out)
        done = os.path.join(run_dir, RESULT_FILE)
        if os.path.exists(done):
            return read_record(done)
        rank = 0
        if _in_submitit_job() and submitit.JobEnvironment().num_tasks > 1:
            rank = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False).rank
        holder = output_dir_in_use(run_dir) if rank == 0 and os.path.isdir(run_dir) else None
        if holder:  # a duplicate job: it must neither train nor record anything in that folder
            raise RunError(f'{run_dir} is being trained by another job ({holder}); this one leaves it alone')
        record: Dict[str, Any] = dict(config=self.point.name, seed=self.point.seed)
        try:
            with _stopping_until_training(run_dir):
                record.update(self._train(run_dir), status='ok')
        except Preempted as stop:
            if _in_submitit_job() and stop.signal_name == f'SIG{submitit.JobEnvironment.USR_SIG}':
                # the trainer restored submitit's handler: it checkpoints this callable and requeues the job
                signal.raise_signal(signal.Signals[stop.signal_name])
            raise
        except Exception as error:  # a failed point is recorded, not fatal to the sweep
            record.update(status='failed', error=f'{type(error).__name__}: {error}'.splitlines()[0][:200])
            if os.environ.get('TKVISION_DEBUG') == '1':
                traceback.print_exc()
            if rank == 0:
                atomic_write(os.path.join(run_dir, FAILED_FILE), lambda f: json.dump(record, f), text=True)
            return record
        if rank == 0:
            atomic_write(done, lambda f: json.dump(record, f), text=True)
        return record

    def _train(self, run_dir: str) -> Dict[str, Any]:
        resume = os.path.isfile(os.path.join(run_dir, LAST_CHECKPOINT))
        if not resume and os.path.isdir(run_dir):
            self.point.check_directory(self.out)  # checked again right before: only the sweep's own folder goes
            shutil.rmtree(run_dir)  # a point that failed before its first checkpoint starts again, empty
        elif os.path.exists(os.path.join(run_dir, FAILED_FILE)):
            os.remove(os.path.join(run_dir, FAILED_FILE))
        cfg = load_config(self.point.config, ['--seed', str(self.point.seed), '--output', run_dir,
                                              '--progress', 'false', *self.extra, *self.point.overrides()])
        result = train(cfg, resume=resume)
        return dict(top1=result['top1'], best_top1=result['best_top1'], test_top1=result['test_top1'],
                    val_loss=result['val_loss'], params=sum(p.numel() for p in result['model'].parameters()),
                    **_timing(result['history']), threads=torch.get_num_threads(),
                    machine=machine_info(next(result['model'].parameters()).device), commit=code_commit())

    def checkpoint(self, *args: Any, **kwargs: Any) -> Optional[submitit.helpers.DelayedSubmission]:
        """Called by submitit on its pre-emption or time-out signal: requeue this same point, which then
        continues from its ``last.pth`` (written by the trainer before the signal was handed on)."""
        return submitit.helpers.DelayedSubmission(PointJob(self.point, self.out, self.extra))
