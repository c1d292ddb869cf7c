"""The scheduler's commands as the sweep calls them: each bounded in time, each failure one line naming the command
(`scheduler_call`), and the states of a SLURM job read from ``sacct`` (`slurm_state`, `alive`).

submitit calls ``sbatch`` with no time limit and passes over a failing ``sacct`` ("status may be inaccurate"), so a
stuck controller would hang a sweep holding its lock, and a sweep that cannot see its jobs would wait on them for
ever; here neither can (``docs/reliability.md``, "A sweep folder is as safe as a run folder").
"""
import os
import subprocess
import threading
from typing import Any, Callable, List, Optional

from ..utils.errors import RunError

__all__ = ['SLURM_ENDED', 'SCHEDULER_SECONDS', 'SACCT_LAG_SECONDS', 'scheduler_call', 'slurm_state',
           'slurm_queue_state', 'alive']

#: SLURM states of a job that has ended for good (``sacct``'s names): its point may be submitted again. Any other
#: state (PENDING, RUNNING, REQUEUED, STOPPED, SUSPENDED, a state this list does not know, or none yet) counts as a
#: job that will still run: a point is never submitted while its job may come back.
SLURM_ENDED = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'BOOT_FAIL', 'DEADLINE',
               'PREEMPTED', 'REVOKED'}
#: Seconds a scheduler command (``sbatch``, ``sacct``) may take before the sweep gives up on it, in one line.
SCHEDULER_SECONDS = 60
#: Seconds after its submission during which a job the accounting does not list yet counts as queued.
SACCT_LAG_SECONDS = 300


def alive(state: str) -> bool:
    """Whether a job of that state (``tkvision.experiments.launch``) may still run its point."""
    return state != 'GONE' and state not in SLURM_ENDED


def slurm_state(job_id: str) -> Optional[str]:
    """``sacct``'s state of the SLURM job (or array task) ``job_id`` (``CANCELLED by 0`` read as ``CANCELLED``), or
    None when the accounting lists no such job.

    Raises:
        RunError: ``sacct`` is missing, fails or does not answer within `SCHEDULER_SECONDS` (named, one line).
    """
    command = ['sacct', '-j', str(job_id), '-X', '-n', '-P', '-o', 'JobID,State']
    output = scheduler_call(lambda: subprocess.run(command, capture_output=True, text=True, timeout=SCHEDULER_SECONDS,
                                               check=True).stdout, ' '.join(command))
    for line in output.splitlines():
        found, _, state = line.partition('|')
        if found.strip() == str(job_id):
            return state.split()[0] if state.split() else 'UNKNOWN'
    return None


def slurm_queue_state(job_id: str) -> Optional[str]:
    """``squeue``'s state of the SLURM job (or array task) ``job_id`` (``PENDING``, ``RUNNING``, ...), ``''`` when the
    controller holds no such job, or None when ``squeue`` cannot answer (missing, failing, not in time).

    The controller answers at once where the accounting may lag, so a job it does not hold and ``sacct`` does not list
    has ended without a record: Slurm 22.05 keeps none for an array task cancelled before it was first scheduled
    (seen on the cluster of ``tools/slurm/local_cluster.sh``; ``tests/test_slurm.py``).
    """
    command = ['squeue', '-h', '-j', str(job_id), '-o', '%i|%T']
    try:
        process = scheduler_call(lambda: subprocess.run(command, capture_output=True, text=True,
                                                        timeout=SCHEDULER_SECONDS), ' '.join(command))
    except RunError:
        return None
    if process.returncode:  # an id it never held or has forgotten: "Invalid job id specified"
        return '' if 'invalid job id' in process.stderr.lower() else None
    for line in process.stdout.splitlines():
        found, _, state = line.partition('|')
        if found.strip() == str(job_id) and state.strip():
            return state.split()[0]
    return ''


def scheduler_call(call: Callable[[], Any], command: str, seconds: float = SCHEDULER_SECONDS) -> Any:
    """``call()`` (a call of a scheduler command), bounded by ``seconds`` (in a thread of its own: submitit's
    ``sbatch`` call has no time limit; its stuck child is then killed).

    Raises:
        RunError: the command is missing, fails, prints what cannot be read, or does not answer in time: one line
            naming it.
    """
    done: List[Any] = []
    failed: List[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as error:  # handed to the caller's thread
            failed.append(error)
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    name = command.split()[0]
    if worker.is_alive():
        subprocess.run(['pkill', '-KILL', '-P', str(os.getpid()), '-x', name], capture_output=True)
        raise RunError(f'{command} did not answer within {seconds:.0f} s: is the SLURM controller up (sinfo)? Nothing '
                       'more was submitted; rerun the same command once it answers')
    if failed:
        error = failed[0]
        if isinstance(error, subprocess.TimeoutExpired):
            raise RunError(f'{command} did not answer within {seconds:.0f} s: is the SLURM controller up (sinfo)? '
                           'Rerun the same command once it answers') from None
        if isinstance(error, FileNotFoundError):
            raise RunError(f'{name} is not on PATH: the slurm executor needs SLURM\'s commands (sbatch, srun, '
                           'sacct, scancel); run where they are, or use --executor local') from None
        words = getattr(error, 'stderr', None) or str(error)
        first = next((line for line in str(words).splitlines() if line.strip()), type(error).__name__)
        raise RunError(f'{command} failed: {first.strip()[:200]}') from None
    return done[0]
