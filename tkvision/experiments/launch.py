"""Where a sweep's points run: in this process, or as submitit jobs on this machine or on a SLURM cluster.

- `Launcher`: the executor and the resources of each point's job (``--executor``, ``--gpus-per-node``, ...,
  or a ``launcher:`` block of a YAML file: `read_launcher_file`).
- `launch_points`: run or submit every point that is neither finished nor queued or running already. Each
  point is one `tkvision.experiments.points.PointJob`, whatever the executor:

  - ``inline``: one after another in this process (the reference: the simplest way, what the studies use);
  - ``local``: submitit's ``LocalExecutor``, each point a job of its own process(es), ``parallel`` at a time;
  - ``slurm``: one SLURM job array through submitit (``executor.batch()``), ``array_parallelism`` tasks at a
    time, each task a point of ``nodes`` x ``tasks_per_node`` processes; ``#SBATCH --requeue`` and submitit's
    ``--signal=USR2@90`` let a pre-empted or timed-out task checkpoint and requeue itself.

- `point_status`: a point's state read from its folder and the scheduler (``tkvision-sweep --status``).

Every submission is recorded in ``<out>/jobs.json`` (point -> executor, job id, time); a point whose last job
is still queued or running is not submitted again, so rerunning the same command after the submitting
process died launches nothing twice. submitit writes each job's pickled callable and result under
``<out>/submitit/``, created readable by its owner only; nothing of tkvision reads them.
"""
import contextlib
import csv
import dataclasses
import fcntl
import json
import os
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import submitit
import yaml

from ..engine.checkpoint import LAST_CHECKPOINT
from ..engine.runlog import METRICS_FILE
from ..engine.rundir import output_dir_in_use
from ..utils.errors import ConfigError, RunError
from ..utils.files import atomic_write
from .points import FAILED_FILE, RESULT_FILE, PointJob, SweepPoint

__all__ = ['Launcher', 'EXECUTORS', 'read_launcher_file', 'launch_points', 'point_status', 'PointStatus',
           'read_manifest', 'read_jobs', 'JOBS_FILE', 'MANIFEST_FILE', 'SUBMITIT_FOLDER']

EXECUTORS = ('inline', 'local', 'slurm')
#: Each point's submitted jobs, in the sweep's folder.
JOBS_FILE = 'jobs.json'
#: The sweep's points (configs, grid values, seeds) and overrides, in the sweep's folder.
MANIFEST_FILE = 'sweep.json'
#: submitit's folder in the sweep's folder: job scripts, logs, pickled callables and results (private).
SUBMITIT_FOLDER = 'submitit'
#: SLURM states of a job that will still run (``squeue``/``sacct`` names); submitit says UNKNOWN before the
#: accounting knows a job just submitted.
_SLURM_ALIVE = {'PENDING', 'RUNNING', 'REQUEUED', 'REQUEUE_HOLD', 'REQUEUE_FED', 'CONFIGURING', 'COMPLETING',
                'RESIZING', 'SUSPENDED', 'SIGNALING', 'STAGE_OUT', 'UNKNOWN'}


@dataclasses.dataclass(frozen=True)
class Launcher:
    """How each point of a sweep runs.

    Args:
        executor: ``inline`` (this process), ``local`` (submitit's local executor) or ``slurm``.
        parallel: points at a time on the local executor.
        nodes: nodes per point (SLURM).
        gpus_per_node: GPUs per node of a point (0: a CPU point).
        tasks_per_node: processes per node of a point (default: one per GPU, else 1); more than one makes the
            point one distributed training job.
        cpus_per_task: CPU cores per process (SLURM; None: the cluster's default).
        timeout_min: the time limit of a job in minutes; a point that reaches it checkpoints and is requeued
            (submitit's ``max_num_timeout`` times, `max_timeouts`).
        partition: the SLURM partition (None: the cluster's default).
        array_parallelism: array tasks running at once (SLURM; None: submitit's default, 256).
        slurm_options: further ``#SBATCH`` options as ``(name, value)`` pairs (``account``, ``qos``).
        max_timeouts: time-outs after which a point is not requeued again (pre-emptions do not count).
        signal_delay_s: seconds before the time limit at which SLURM sends submitit's USR2 (submitit's
            ``slurm_signal_delay_s``; None: its 90). A point checkpoints and is requeued on it; a short limit
            (a test's) needs a short delay.
    """
    executor: str = 'inline'
    parallel: int = 1
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    timeout_min: int = 1440
    partition: Optional[str] = None
    array_parallelism: Optional[int] = None
    slurm_options: Tuple[Tuple[str, str], ...] = ()
    max_timeouts: int = 3
    signal_delay_s: Optional[int] = None

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ConfigError(f'--executor {self.executor!r}: use one of {", ".join(EXECUTORS)}')
        for name in ('parallel', 'nodes', 'timeout_min', 'tasks_per_node', 'cpus_per_task', 'array_parallelism',
                     'signal_delay_s'):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f'launcher {name}: {value!r} is not an integer >= 1')
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ConfigError(f'launcher gpus_per_node: {self.gpus_per_node!r} is not an integer >= 0')
        if self.executor != 'slurm' and self.nodes > 1:
            raise ConfigError(f'launcher nodes: {self.nodes} nodes need --executor slurm (the {self.executor} '
                              'executor runs on this machine)')
        if self.executor == 'inline' and self.processes_per_node > 1:
            raise ConfigError(f'{self.processes_per_node} processes per point need --executor local or slurm (inline '
                              'runs each point in this one process)')

    @property
    def processes_per_node(self) -> int:
        """``tasks_per_node``, else one per GPU, else 1."""
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    def executor_parameters(self) -> Dict[str, Any]:
        """The parameters of ``submitit.AutoExecutor.update_parameters`` for this launcher."""
        params: Dict[str, Any] = dict(timeout_min=self.timeout_min, tasks_per_node=self.processes_per_node,
                                      gpus_per_node=self.gpus_per_node, name='tkvision-sweep')
        if self.executor == 'slurm':
            params.update(nodes=self.nodes, slurm_additional_parameters=dict(self.slurm_options, requeue=True))
            if self.cpus_per_task:
                params['cpus_per_task'] = self.cpus_per_task
            if self.partition:
                params['slurm_partition'] = self.partition
            if self.array_parallelism:
                params['slurm_array_parallelism'] = self.array_parallelism
            if self.signal_delay_s:
                params['slurm_signal_delay_s'] = self.signal_delay_s
        return params


def read_launcher_file(path: str) -> Dict[str, Any]:
    """The ``launcher:`` block of the YAML file ``path``: `Launcher` fields by name (``slurm_options`` a
    mapping).

    Raises:
        ConfigError: no such file, no ``launcher:`` mapping in it, or a key `Launcher` does not have (named).
    """
    try:
        with open(path) as f:
            block = (yaml.safe_load(f) or {}).get('launcher')
    except OSError as error:
        raise ConfigError(f'--launcher {path}: cannot read it ({error.strerror})') from None
    if not isinstance(block, dict):
        raise ConfigError(f'--launcher {path}: the file needs a mapping under "launcher:" (e.g. launcher: '
                          '{gpus_per_node: 8, timeout_min: 4320})')
    known = {f.name for f in dataclasses.fields(Launcher)}
    for name in block:
        if name not in known:
            raise ConfigError(f'--launcher {path}: unknown key launcher.{name}; known: {", ".join(sorted(known))}')
    if 'slurm_options' in block:
        block['slurm_options'] = tuple((str(k), str(v)) for k, v in dict(block['slurm_options']).items())
    return block


def read_manifest(out: str) -> Dict[str, Any]:
    """``<out>/sweep.json``: ``points`` (`SweepPoint` records, in the sweep's order) and ``extra`` overrides.

    Raises:
        RunError: ``out`` holds no sweep (named).
    """
    path = os.path.join(out, MANIFEST_FILE)
    if not os.path.exists(path):
        raise RunError(f'{out} holds no sweep ({MANIFEST_FILE} is missing): pass the --out of a tkvision-sweep run')
    with open(path) as f:
        return json.load(f)


def _write_manifest(out: str, points: Sequence[SweepPoint], extra: Sequence[str]) -> None:
    """Add ``points`` to the manifest (the earlier ones first, each point once)."""
    old = read_manifest(out)['points'] if os.path.exists(os.path.join(out, MANIFEST_FILE)) else []
    keys = {SweepPoint.from_dict(p).key for p in old}
    records = old + [p.to_dict() for p in points if p.key not in keys]
    atomic_write(os.path.join(out, MANIFEST_FILE), lambda f: json.dump(dict(points=records, extra=list(extra)), f,
                                                                       indent=1), text=True)


def read_jobs(out: str) -> Dict[str, List[Dict[str, str]]]:
    """``<out>/jobs.json``: each point's (`SweepPoint.key`) submitted jobs, oldest first: ``executor``,
    ``job_id``, ``submitted`` (UTC, ISO 8601). Empty for a sweep that ran in its own process."""
    return _JobBook(out).jobs


@contextlib.contextmanager
def _submitter_lock(out: str) -> Iterator[None]:
    """Hold ``<out>/.sweep.lock`` while submitting, so two sweep commands on one folder cannot both submit a
    point (the lock goes with the process, however it ends).

    Raises:
        RunError: another process holds it.
    """
    os.makedirs(out, exist_ok=True)
    fd = os.open(os.path.join(out, '.sweep.lock'), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunError(f'another tkvision-sweep is submitting to {out}; wait for it, or watch it with '
                       f'tkvision-sweep --status {out}') from None
    try:
        yield
    finally:
        os.close(fd)


class _JobBook:
    """``<out>/jobs.json``: each point's submitted jobs, the latest last."""

    def __init__(self, out: str):
        self.path = os.path.join(out, JOBS_FILE)
        self.jobs: Dict[str, List[Dict[str, str]]] = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.jobs = json.load(f)

    def latest(self, key: str) -> Optional[Dict[str, str]]:
        return self.jobs[key][-1] if self.jobs.get(key) else None

    def add(self, key: str, executor: str, job_id: str) -> Dict[str, str]:
        entry = dict(executor=executor, job_id=str(job_id), submitted=datetime.now(timezone.utc).isoformat())
        self.jobs.setdefault(key, []).append(entry)
        atomic_write(self.path, lambda f: json.dump(self.jobs, f, indent=1), text=True)
        return entry


def _submitit_folder(out: str) -> str:
    """``<out>/submitit``, created readable and writable by its owner only (it holds pickles)."""
    folder = os.path.join(out, SUBMITIT_FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def _job_state(out: str, entry: Optional[Dict[str, str]]) -> str:
    """The scheduler's word for a recorded job: a SLURM state (``RUNNING``, ``PENDING``, ...), ``RUNNING`` for
    a local job whose submitit controller process is alive, ``GONE`` otherwise (or for no job)."""
    if entry is None:
        return 'GONE'
    if entry['executor'] == 'slurm':
        state = submitit.SlurmJob(os.path.join(out, SUBMITIT_FOLDER, '%j'), entry['job_id']).state.upper()
        return state if state in _SLURM_ALIVE else 'GONE'
    try:  # a local job's id is its controller's pid: alive while that process runs submitit's controller
        with open(f"/proc/{int(entry['job_id'])}/cmdline", 'rb') as f:
            return 'RUNNING' if b'submitit.local._local' in f.read() else 'GONE'
    except (OSError, ValueError):
        return 'GONE'


def _executor(out: str, launcher: Launcher) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=os.path.join(_submitit_folder(out), '%j'), cluster=launcher.executor,
                                     slurm_max_num_timeout=launcher.max_timeouts,
                                     local_max_num_timeout=launcher.max_timeouts)
    executor.update_parameters(**launcher.executor_parameters())
    return executor


def launch_points(
        points: Sequence[SweepPoint],
        out: str,
        launcher: Launcher,
        extra: Sequence[str] = (),
        log: Callable[..., None] = print,
        poll_seconds: float = 1.0,
) -> None:
    """Run (``inline``, ``local``: until every point has ended) or submit (``slurm``: returns once the array is
    queued) each point that is neither finished nor queued or running in a recorded job.

    Raises:
        RunError: another sweep command is submitting to ``out``.
        Preempted: (``inline``) a signal stopped the point in this process, its ``last.pth`` written: the sweep
            stops there; rerunning continues it.
    """
    with _submitter_lock(out):
        _write_manifest(out, points, extra)
        book = _JobBook(out)
        todo, waiting = [], []
        for point in points:
            if os.path.exists(os.path.join(point.directory(out), RESULT_FILE)):
                log(f'[skip] {point.key}: finished')
            elif (entry := book.latest(point.key)) is not None and _job_state(out, entry) != 'GONE':
                log(f'[wait] {point.key}: job {entry["job_id"]} is queued or running')
                waiting.append(point)
            else:
                todo.append(point)
        if launcher.executor == 'inline':
            for point in todo:
                log(f'[run ] {point.key} -> {point.directory(out)}')
                _log_record(PointJob(point, out, extra)(), point, log)
        elif launcher.executor == 'slurm':
            _submit_array(todo, out, launcher, extra, book, log)
        else:
            _run_local(todo, waiting, out, launcher, extra, book, log, poll_seconds)


def _log_record(record: Dict[str, Any], point: SweepPoint, log: Callable[..., None]) -> None:
    if record.get('status') == 'failed':
        log(f'[fail] {point.key}: {record["error"]}')


def _submit_array(todo: Sequence[SweepPoint], out: str, launcher: Launcher, extra: Sequence[str], book: _JobBook,
                  log: Callable[..., None]) -> None:
    if not todo:
        return
    executor = _executor(out, launcher)
    with executor.batch():
        jobs = [executor.submit(PointJob(point, out, extra)) for point in todo]
    for point, job in zip(todo, jobs):
        book.add(point.key, 'slurm', job.job_id)
        log(f'[sbmt] {point.key}: job {job.job_id}')
    log(f'submitted {len(jobs)} points as SLURM array {jobs[0].job_id.split("_")[0]}; watch it with '
        f'tkvision-sweep --status {out}, gather it with tkvision-sweep --collect {out}')


def _run_local(todo: Sequence[SweepPoint], waiting: Sequence[SweepPoint], out: str, launcher: Launcher,
               extra: Sequence[str], book: _JobBook, log: Callable[..., None], poll_seconds: float) -> None:
    """Keep ``launcher.parallel`` local jobs running (the ones a killed earlier command left count) until every
    point has ended."""
    executor = _executor(out, launcher) if todo else None
    pending, active = list(todo), list(waiting)
    own: Dict[str, submitit.Job] = {}
    while pending or active:
        still = []
        for point in active:
            job = own.get(point.key)
            if (job.state == 'RUNNING') if job is not None else _job_state(out, book.latest(point.key)) != 'GONE':
                still.append(point)
            else:
                _log_end(point, out, log)
        active = still
        while pending and len(active) < launcher.parallel and executor is not None:
            point = pending.pop(0)
            job = executor.submit(PointJob(point, out, extra))
            own[point.key] = job
            book.add(point.key, 'local', job.job_id)
            log(f'[run ] {point.key}: local job {job.job_id} -> {point.directory(out)}')
            active.append(point)
        if active:
            time.sleep(poll_seconds)


def _log_end(point: SweepPoint, out: str, log: Callable[..., None]) -> None:
    state = point_status(out, point, None)
    if state.state != 'finished':
        log(f'[{state.state[:4]}] {point.key}: {state.detail}')


@dataclasses.dataclass(frozen=True)
class PointStatus:
    """A point's state: ``finished``, ``running``, ``queued``, ``failed``, ``stopped`` (a ``last.pth`` to
    continue from, no job) or ``not started``; ``detail`` says more (validation top-1, epoch, job, error)."""
    state: str
    detail: str


def _progress(run_dir: str) -> str:
    """``epoch k, val top-1 x.xx`` from the point's ``metrics.csv`` (nothing before its first epoch)."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return 'no epoch finished yet'
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return 'no epoch finished yet'
    top1, loss = rows[-1].get('top1'), rows[-1].get('val_loss')
    if top1 not in (None, ''):
        return f'{len(rows)} epochs done, val top-1 {float(top1):.2f}'
    return f'{len(rows)} epochs done' + (f', val loss {float(loss):.4f}' if loss not in (None, '') else '')


def point_status(out: str, point: SweepPoint, jobs: Optional[Dict[str, List[Dict[str, str]]]]) -> PointStatus:
    """The state of ``point`` of the sweep in ``out``, from its folder and (``jobs``: ``jobs.json``'s content,
    None to read it) the scheduler."""
    run_dir = point.directory(out)
    result = os.path.join(run_dir, RESULT_FILE)
    if os.path.exists(result):
        with open(result) as f:
            record = json.load(f)
        top1, loss = record.get('top1'), record.get('val_loss')
        return PointStatus('finished', f'val top-1 {top1:.2f}' if top1 is not None else
                           f'val loss {loss:.4f}' if loss is not None else 'finished')
    entries = (_JobBook(out).jobs if jobs is None else jobs).get(point.key)
    entry = entries[-1] if entries else None
    state = _job_state(out, entry)
    holder = output_dir_in_use(run_dir) if os.path.isdir(run_dir) else None
    job = f" (job {entry['job_id']})" if entry else ''
    if holder or state == 'RUNNING':
        return PointStatus('running', _progress(run_dir) + job)
    if state != 'GONE':
        words = 'submitted, not listed by sacct yet' if state == 'UNKNOWN' else state.lower()
        return PointStatus('queued', f'{words}{job}')
    if os.path.exists(os.path.join(run_dir, FAILED_FILE)):
        with open(os.path.join(run_dir, FAILED_FILE)) as f:
            return PointStatus('failed', json.load(f).get('error', '?'))
    if os.path.exists(os.path.join(run_dir, LAST_CHECKPOINT)):
        return PointStatus('stopped', f'{_progress(run_dir)}; rerun the sweep command to continue it from last.pth')
    return PointStatus('not started', 'ended before its first checkpoint' + job if entry else 'not submitted')
