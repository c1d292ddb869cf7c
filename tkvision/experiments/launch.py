"""Where a sweep's points run: in this process, or as submitit jobs on this machine or on a SLURM cluster.

- ``tkvision.experiments.launcher.Launcher``: the executor and the resources of each point's job (``--executor``,
  ``--gpus-per-node``, ..., or a ``launcher:`` block of a YAML file).
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
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import submitit
import yaml

from ..engine.checkpoint import LAST_CHECKPOINT
from ..engine.config import load_config, read_run_config, resolve_run_config
from ..engine.runlog import CONFIG_FILE, METRICS_FILE
from ..engine.rundir import output_dir_in_use
from ..utils.errors import ConfigError, RunError
from ..utils.files import atomic_write
from .points import FAILED_FILE, RESULT_FILE, PointJob, SweepPoint, point_record_problem, read_record
from .launcher import Launcher
from .scheduler import SACCT_LAG_SECONDS, alive, scheduler_call, slurm_queue_state, slurm_state

__all__ = ['launch_points', 'point_status', 'PointStatus',
           'read_manifest', 'read_jobs', 'check_settings', 'JOBS_FILE', 'MANIFEST_FILE', 'SUBMITIT_FOLDER']

#: Each point's submitted jobs, in the sweep's folder.
JOBS_FILE = 'jobs.json'
#: The sweep's points (configs, grid values, seeds) and overrides, in the sweep's folder.
MANIFEST_FILE = 'sweep.json'
#: submitit's folder in the sweep's folder: job scripts, logs, pickled callables and results (private).
SUBMITIT_FOLDER = 'submitit'
def read_manifest(out: str) -> Dict[str, Any]:
    """``<out>/sweep.json``: ``points`` (`SweepPoint` records, in the sweep's order) and ``extra`` overrides.

    Raises:
        RunError: ``out`` holds no sweep (named).
    """
    path = os.path.join(out, MANIFEST_FILE)
    if not os.path.lexists(path):
        raise RunError(f'{out} holds no sweep ({MANIFEST_FILE} is missing): pass the --out of a tkvision-sweep run')
    manifest = _read_json(path, 'the sweep\'s record')
    if not (isinstance(manifest, dict) and isinstance(manifest.get('points'), list)):
        raise RunError(f'{path} is not a sweep\'s record (no list of points): restore it, or pass another --out')
    for i, point in enumerate(manifest['points']):
        problem = point_record_problem(point)
        if problem:
            raise RunError(f'{path}: point {i} {problem}: restore the file, or pass another --out')
    return manifest


def _read_json(path: str, what: str):
    """The JSON of ``path``, a file of the sweep's own.

    Raises:
        RunError: a link, or a file that is not JSON (cut, binary, a pickle), naming it and ``what`` it should be.
    """
    try:
        if os.path.islink(path):
            raise ValueError('a symbolic link')
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise RunError(f'{path} is not {what} ({str(error).splitlines()[0][:80]}): restore or remove it') from None


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
        if os.path.lexists(self.path):
            jobs = _read_json(self.path, "the sweep's record of its jobs")
            if not (isinstance(jobs, dict) and all(isinstance(v, list) and all(
                    isinstance(e, dict) and {'executor', 'job_id'} <= set(e) for e in v) for v in jobs.values())):
                raise RunError(f'{self.path} is not the sweep\'s record of its jobs: restore or remove it (a job still '
                               'queued may then be submitted again)')
            self.jobs = jobs

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
    if os.path.islink(folder):
        raise RunError(f'{folder} is a symbolic link (to {os.readlink(folder)!r}): the sweep keeps its jobs\' files '
                       'in a folder of its own; remove the link')
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def _job_state(out: str, entry: Optional[Dict[str, str]]) -> str:
    """The scheduler's word for a recorded job: its SLURM state from ``sacct`` (``RUNNING``, ``PENDING``,
    ``CANCELLED``, ...; ``UNKNOWN`` while the accounting does not list a job just submitted), ``RUNNING`` for a local
    job whose submitit controller process is alive, ``GONE`` otherwise (or for no job).

    Raises:
        RunError: ``sacct`` is missing, fails or does not answer within `SCHEDULER_SECONDS` (named, one line).
    """
    if entry is None:
        return 'GONE'
    if entry['executor'] == 'slurm':
        state = slurm_state(entry['job_id'])
        if state is None:  # the accounting has no record: ask the controller, which knows a job just submitted
            queued = slurm_queue_state(entry['job_id'])
            if queued is not None:
                return queued or 'GONE'
            submitted = datetime.fromisoformat(entry.get('submitted', '1970-01-01T00:00:00+00:00'))
            recent = (datetime.now(timezone.utc) - submitted).total_seconds() < SACCT_LAG_SECONDS
            return 'UNKNOWN' if recent else 'GONE'
        return state
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
    for point in points:  # every point's folder checked before anything is created or removed
        point.check_directory(out)
    with _submitter_lock(out):
        check_settings(points, out, extra)
        book = _JobBook(out)
        todo, waiting = [], []
        for point in points:
            if os.path.exists(os.path.join(point.directory(out), RESULT_FILE)):
                read_record(os.path.join(point.directory(out), RESULT_FILE))
                log(f'[skip] {point.key}: finished')
            elif (entry := book.latest(point.key)) is not None and alive(_job_state(out, entry)):
                log(f'[wait] {point.key}: job {entry["job_id"]} is queued or running')
                waiting.append(point)
            else:
                todo.append(point)
        _write_manifest(out, points, extra)
        if launcher.executor == 'inline':
            for point in todo:
                log(f'[run ] {point.key} -> {point.directory(out)}')
                _log_record(PointJob(point, out, extra)(), point, log)
        elif launcher.executor == 'slurm':
            _submit_array(todo, out, launcher, extra, book, log)
        else:
            _run_local(todo, waiting, out, launcher, extra, book, log, poll_seconds)


def check_settings(points: Sequence[SweepPoint], out: str, extra: Sequence[str]) -> None:
    """Refuse to continue a sweep folder whose points trained (or began) with other settings than this command
    gives them: a rerun with ``--epochs 2``, or another config file of the same name, would skip the finished points
    and report their old results as the new settings'. Each point that has a ``config.yaml`` is compared key by key
    (its folder, seed and progress bar aside).

    Raises:
        ConfigError: naming each key that differs, the values then and now, and a point of each.
    """
    differ: Dict[str, str] = {}
    for point in points:
        recorded = os.path.join(point.directory(out), CONFIG_FILE)
        if not os.path.isfile(recorded):
            continue
        then = read_run_config(recorded)
        now = resolve_run_config(load_config(point.config, [
            '--seed', str(point.seed), '--output', point.directory(out), '--progress', 'false', *extra,
            *point.overrides()])).to_dict()
        for key in sorted(set(then) | set(now)):
            if key not in ('output', 'progress') and then.get(key) != now.get(key) and key not in differ:
                differ[key] = f'{key}: {then.get(key)!r} then, {now.get(key)!r} now (point {point.key})'
    if differ:
        raise ConfigError(f'{out} holds points trained with other settings than this command gives: '
                          + '; '.join(differ.values()) + '. Pass another --out, or the settings they trained with; '
                          'nothing was changed')


def _log_record(record: Dict[str, Any], point: SweepPoint, log: Callable[..., None]) -> None:
    if record.get('status') == 'failed':
        log(f'[fail] {point.key}: {record["error"]}')


def _submit_array(todo: Sequence[SweepPoint], out: str, launcher: Launcher, extra: Sequence[str], book: _JobBook,
                  log: Callable[..., None]) -> None:
    """Submit ``todo`` as one SLURM job array (``sbatch``, bounded by `SCHEDULER_SECONDS`)."""
    if not todo:
        return

    def submit() -> list:
        executor = _executor(out, launcher)
        with executor.batch():
            return [executor.submit(PointJob(point, out, extra)) for point in todo]
    jobs = scheduler_call(submit, 'sbatch (submitit, the job array)')
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
            if (job.state == 'RUNNING') if job is not None else alive(_job_state(out, book.latest(point.key))):
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
    _remove_unformatted_folder(out)


def _remove_unformatted_folder(out: str) -> None:
    """Remove the empty ``submitit/%j`` folder that submitit's local controller creates from the unformatted
    folder name (its jobs' files go to ``submitit/<job id>/``), so the sweep folder holds only what a reader needs."""
    folder = os.path.join(out, SUBMITIT_FOLDER, '%j')
    if os.path.isdir(folder) and not os.path.islink(folder) and not os.listdir(folder):
        os.rmdir(folder)


def _log_end(point: SweepPoint, out: str, log: Callable[..., None]) -> None:
    state = point_status(out, point, None)
    if state.state != 'finished':
        log(f'[{state.state[:4]}] {point.key}: {state.detail}')


@dataclasses.dataclass(frozen=True)
class PointStatus:
    """A point's state: ``finished``, ``running``, ``queued``, ``cancelled`` (its job cancelled: a rerun submits it
    again), ``failed``, ``stopped`` (a ``last.pth`` to continue from, no job) or ``not started``; ``detail`` says more
    (validation top-1, epoch, job, error)."""
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
        record = read_record(result)
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
    if alive(state):
        words = 'submitted, not listed by sacct yet' if state == 'UNKNOWN' else state.lower()
        return PointStatus('queued', f'{words}{job}')
    if state == 'CANCELLED':
        return PointStatus('cancelled', f'job {entry["job_id"] if entry else "?"} was cancelled; rerun the sweep '
                                        'command to submit it again')
    if os.path.exists(os.path.join(run_dir, FAILED_FILE)):
        return PointStatus('failed', str(read_record(os.path.join(run_dir, FAILED_FILE)).get('error', '?')))
    if os.path.exists(os.path.join(run_dir, LAST_CHECKPOINT)):
        return PointStatus('stopped', f'{_progress(run_dir)}; rerun the sweep command to continue it from last.pth')
    if entry and not os.path.isdir(run_dir):
        return PointStatus('not started', f"job {entry['job_id']} ended before it started (cancelled while queued?); "
                                          'rerun the sweep command to submit it again')
    return PointStatus('not started', 'ended before its first checkpoint' + job if entry else 'not submitted')
