"""Output directories: one run per directory, never overwritten, locked while a run writes to it.

A run owns ``cfg['output']``. Starting a run in a directory that already holds a run's files fails
with a message naming the directory and the two ways out (``--resume`` to continue it, or another
``--output``); a directory that holds only the ``config.yaml`` of a run killed before its first
checkpoint (what ``tkvision.engine.runlog.RunLog.early_files`` names: its config and its loggers' files) is not a run
to protect (there is nothing to continue), so it may start again there: we chose failing over
timm's ``<output>/<date>-<model>`` subdirectories because a
pre-empted job that is requeued with ``--resume`` must find its own files at a fixed path.

While a run writes, it holds an exclusive POSIX record lock (``fcntl.lockf``) on ``<output>/.lock``
(which also names its host and process id). The lock belongs to the process, is not inherited by
its DataLoader workers (a ``flock`` would be, and would outlive a killed trainer until its workers
noticed), and is released by the kernel when the process ends, however it ends (SIGKILL included):
a killed run can be resumed at once, while a second run started on the same directory fails
immediately, naming the holder. POSIX locks are honoured across machines on NFS (through its lock
manager), Lustre and GPFS; where they are not, the emptiness check still stops a second run that
starts after the first wrote anything.

A checkpoint is written to a temporary file beside it (``.last.pth.<random>.tmp``,
``tkvision.utils.files.atomic_write``) and renamed when complete, so a kill during the write leaves the
previous checkpoint intact and that temporary behind (up to a checkpoint's size). Whoever next claims the
directory removes them: holding the lock, it knows that no other run writes there, and the temporaries
are not a run's work (``run_files`` leaves them out).

A job whose launcher restarts its workers after a failure (``torchrun --max-restarts``; a requeued SLURM job)
continues by itself: the lock file also names the job that claimed the directory (``job_identity``), and a
restarted process (``RESTART_COUNTS``) of that very job resumes its checkpoint without ``--resume``
(``restarts_this_run``). The job is one no other job can share: a SLURM job id (a requeued job keeps it), or
torchrun's agent process (the parent that restarts its workers) by host, process id and start time, never a
user-chosen ``--rdzv-id`` or a shell that exported a restart count. An attempt that was refused never claimed the
directory, so its restart is refused too. A first start still starts fresh, and a directory another job wrote is
still refused.

The lock file is opened without following a symbolic link and must be a regular file: a link or a FIFO planted
as ``.lock`` is refused, naming it, and nothing it points to is written; a ``.lock`` with other hard links (a
``cp -al`` snapshot of the folder) is replaced by a file of its own first, so the other names are not written.

POSIX locks do not exclude their own process, and closing any descriptor of the file releases all of the process's
locks on it: this process therefore also keeps the folders it holds (`RunDirLock`, by device and inode), so a second
``Trainer`` on a folder a first one holds is refused, and releasing one claim never drops another's lock. A lock that
nobody keeps (a dropped ``Trainer``) is released when it is collected.
"""
import errno
import fcntl
import os
import re
import socket
import stat
import weakref
from typing import Collection, Optional, Tuple, Union

from ..utils.errors import RunError
from ..utils.files import FILE_MODE
from .distributed import Processes, all_ranks_agree

__all__ = ['LOCK_NAME', 'RESTART_COUNTS', 'RunDirLock', 'claim_output', 'claim_output_dir',
           'run_files', 'remove_stale_temporaries',
           'job_identity', 'restarts_this_run', 'output_dir_in_use']

LOCK_NAME = '.lock'


#: Environment variables by which a launcher tells a worker it was restarted (a count above 0): torchrun's
#: elastic agent (``--max-restarts``) and SLURM (a requeued job).
RESTART_COUNTS = ('TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT')

#: A temporary file of an interrupted atomic write (``tkvision.utils.files.atomic_write``).
_TEMPORARY = re.compile(r'^\..+\.tmp$')


def run_files(out: str, early: Collection[str]) -> list:
    """The files of ``out`` that hold a run's work, sorted: all but the lock, the temporaries of interrupted writes
    and ``early``, what a run writes before its first checkpoint (``tkvision.engine.runlog.RunLog.early_files``:
    its config and its loggers' files)."""
    if not os.path.isdir(out):
        return []
    return sorted(f for f in os.listdir(out) if f != LOCK_NAME and f not in early and not _TEMPORARY.match(f))


def remove_stale_temporaries(out: str) -> list:
    """Remove the temporary files that interrupted writes left in ``out`` (module docstring); call it only
    while holding ``out``'s lock, when no other writer can be at work there. Returns the names removed."""
    removed = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if _TEMPORARY.match(name) and os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
            removed.append(name)
    return removed


def _process(pid: int) -> Optional[str]:
    """``host:pid:start`` of process ``pid`` (its start time in clock ticks since boot, ``/proc/<pid>/stat``):
    a name no other process, now or later, shares; None where it cannot be read."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            start = f.read().rsplit(')', 1)[1].split()[19]  # field 22, counted after the command's name
    except (OSError, IndexError):
        return None
    return f'{socket.gethostname()}:{pid}:{start}'


def _torchrun_agent() -> Optional[str]:
    """`_process` of this worker's torchrun agent (its parent, which restarts it), or None when this process was
    not started by one (a ``TORCHELASTIC_*`` variable exported in a shell does not make its parent an agent)."""
    if 'TORCHELASTIC_RUN_ID' not in os.environ:
        return None
    parent = os.getppid()
    try:
        with open(f'/proc/{parent}/cmdline', 'rb') as f:
            command = f.read().decode(errors='replace')
    except OSError:
        return None
    if 'torch.distributed.run' not in command and 'torchrun' not in command:
        return None
    return _process(parent)


def job_identity() -> str:
    """What stays the same when a launcher restarts this job's workers and no other job shares: the SLURM job
    id; else torchrun's agent process (the workers' parent, by host, pid and start time: a rendezvous id is the
    user's and two jobs may share it); else this process."""
    if os.environ.get('SLURM_JOB_ID'):
        return f"slurm {os.environ['SLURM_JOB_ID']}"
    agent = _torchrun_agent()
    if agent is not None:
        return f'torchrun agent {agent}'
    return f'process {_process(os.getpid()) or f"{socket.gethostname()}:{os.getpid()}"}'


def _restarted() -> bool:
    """Whether a launcher restarted this process: a requeued SLURM job, or a worker its torchrun agent started
    again (a restart count above 0 from the launcher itself, not from a shell)."""
    def count(name: str) -> int:
        value = os.environ.get(name, '0')
        return int(value) if value.isdigit() else 0
    if os.environ.get('SLURM_JOB_ID') and count('SLURM_RESTART_COUNT') > 0:
        return True
    return count('TORCHELASTIC_RESTART_COUNT') > 0 and _torchrun_agent() is not None


def restarts_this_run(out: str, checkpoint: str) -> bool:
    """True when this process is a launcher's restart (``RESTART_COUNTS``) of the job that last held
    ``out`` (its lock file names ``job_identity``) and that job left ``checkpoint`` (a file name in
    ``out``): the run then resumes by itself. False for a first start, or a directory another job wrote."""
    lock, path = os.path.join(out, LOCK_NAME), os.path.join(out, checkpoint)
    if not (_restarted() and os.path.isfile(path) and os.path.isfile(lock)):
        return False
    with open(lock, errors='replace') as f:
        holder = f.read()
    return f' job {job_identity()}\n' in holder


#: The output folders this process holds, by ``(st_dev, st_ino)`` (the module docstring: POSIX locks do not exclude
#: their own process).
_HELD: 'weakref.WeakValueDictionary[Tuple[int, int], RunDirLock]' = weakref.WeakValueDictionary()


def _unlock(fd: int) -> None:
    try:
        fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class RunDirLock:
    """The held lock of one output directory; `release` (or its collection, or process exit) frees it.

    Args:
        path: the lock file.
        fd: its open descriptor, locked.
        folder: ``(st_dev, st_ino)`` of the output folder, under which this process keeps it.
    """

    def __init__(self, path: str, fd: int, folder: Tuple[int, int] = (0, 0)):
        self.path, self.folder = path, folder
        self.fd: Optional[int] = fd
        self._finalizer = weakref.finalize(self, _unlock, fd)
        _HELD[folder] = self

    def release(self) -> None:
        """Unlock and close the lock file, and let this process claim the folder again; a second call does
        nothing."""
        if self.fd is not None:
            self._finalizer()
            self.fd = None
            if _HELD.get(self.folder) is self:
                del _HELD[self.folder]


def claim_output_dir(
        out: str,
        resume: bool,
        early: Collection[str] = (),
        checkpoint: Optional[str] = None,
) -> RunDirLock:
    """Create ``out`` if needed and lock it for this run.

    Args:
        out: the run's output directory.
        resume: the run continues the one in ``out`` (its files are expected there).
        early: what a run writes before its first checkpoint (`run_files`): a folder holding no more is no run to
            protect.
        checkpoint: the file name of the run's checkpoint (``last.pth``): a refusal says ``--resume`` only where
            ``out`` holds one (a run stopped before it, by a full disk say, cannot be continued).

    Raises:
        RunError: another process holds the lock (its host and pid are named), or ``out`` already
            holds a run's files (`run_files`) and ``resume`` is false.

    The temporaries of interrupted writes in ``out`` are removed once the lock is held
    (``remove_stale_temporaries``).
    """
    if os.path.islink(out) and not os.path.isdir(out):
        raise RunError(f'output {out} is a symbolic link to {os.readlink(out)!r}, which is no folder (missing, or a '
                       'loop): remove the link or pass another --output')
    os.makedirs(out, exist_ok=True)
    folder = (os.stat(out).st_dev, os.stat(out).st_ino)
    if _HELD.get(folder) is not None:
        raise RunError(f'output directory {out} is held by another run of this process (a Trainer not finished or '
                       'closed): train() or close() it first, or pass another --output')
    path = os.path.join(out, LOCK_NAME)
    fd = _open_lock(path)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 256, 0).decode(errors='replace').strip() or 'another process'
        os.close(fd)
        raise RunError(f'output directory {out} is in use by a running job ({holder}); wait for it to end, '
                       'or pass another --output') from None
    others = run_files(out, early)
    if others and not resume:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)
        files = f'{", ".join(sorted(others)[:4])}{", ..." if len(others) > 4 else ""}'
        if checkpoint is not None and not os.path.isfile(os.path.join(out, checkpoint)):
            raise RunError(f'output directory {out} holds the files of a run that stopped before its first checkpoint '
                           f'({files}; no {checkpoint}), so nothing can continue it: remove them to train there from '
                           'the start, or pass another --output')
        through_make = (' (through make: make train ARGS=--resume, or make train ARGS="--output runs/another")'
                        if os.environ.get('MAKELEVEL') else '')
        raise RunError(f'output directory {out} already holds a run ({files}); continue it with --resume, or pass '
                       'another --output' + through_make)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'host {socket.gethostname()} pid {os.getpid()} job {job_identity()}\n'.encode(), 0)
    remove_stale_temporaries(out)
    return RunDirLock(path, fd, folder)


def output_dir_in_use(out: str) -> Optional[str]:
    """The holder of ``out``'s lock (``host ... pid ... job ...``, as `claim_output_dir` writes it) while a run
    holds it, else None (no lock file, or nobody holding it). Ask from another process than the run's: POSIX
    locks do not exclude their own process, and closing the probe's descriptor would release the run's lock."""
    path = os.path.join(out, LOCK_NAME)
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return os.pread(fd, 256, 0).decode(errors='replace').strip() or 'another process'
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _open_lock(path: str) -> int:
    """The lock file's descriptor, opened read-write (created less the umask, as every file tkvision writes)
    without following a symbolic link and without blocking on a FIFO.

    Raises:
        RunError: ``path`` is a symbolic link, or not a regular file (a FIFO, a device, a folder), named.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, FILE_MODE)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR) or os.path.islink(path):
            raise RunError(f'{path} is not a lock file of tkvision (a symbolic link or a folder): nothing was written '
                           'through it; remove it, or pass another --output') from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunError(f'{path} is not a regular file (a FIFO or a device): tkvision locks a file of its own '
                       'there; remove it, or pass another --output')
    if os.fstat(fd).st_nlink > 1:  # a hard link: writing the holder would write its other names; take a file of our own
        os.close(fd)
        os.unlink(path)
        return _open_lock(path)
    return fd


def claim_output(
        output: str,
        processes: Processes,
        checkpoint: str,
        resume: Union[None, bool, str],
        early: Collection[str] = (),
) -> Tuple[Optional[RunDirLock], Union[None, bool, str]]:
    """Claim ``output`` for a run of ``processes`` (a ``tkvision.engine.distributed.Processes``): rank 0 locks it
    ([`claim_output_dir`][tkvision.engine.rundir.claim_output_dir]); every rank fails if it could not. A run resumed
    from another directory's checkpoint writes into ``output`` as a new run does: it must hold no other run. A
    launcher's restart of the job that wrote ``output``'s ``checkpoint`` (a file name) resumes it without being
    told ([`restarts_this_run`][tkvision.engine.rundir.restarts_this_run]; rank 0 decides, every rank follows).

    Args:
        output: the run's output directory.
        processes: this process among the job's.
        checkpoint: the file name of the run's checkpoint in ``output`` (``last.pth``).
        resume: the ``resume`` argument of ``tkvision.engine.trainer.train``: None, True or a checkpoint path.
        early: what a run writes before its first checkpoint (`run_files`).

    Returns:
        ``(lock, resume)``: the lock (rank 0; None elsewhere) and ``resume``, True where the restart decided it.

    Raises:
        RunError: the directory holds another run, or another process holds its lock (on every rank).
    """
    main, device = processes.rank == 0, processes.device
    restarted = main and not resume and restarts_this_run(output, checkpoint)
    if not all_ranks_agree(not restarted, device):  # rank 0 found its own job's checkpoint: every rank resumes
        resume = True
        if main:
            print(f'restarted by the launcher: resuming {os.path.join(output, checkpoint)} (no --resume needed)')
    in_place = resume is True or (isinstance(resume, str) and os.path.abspath(os.path.dirname(resume)) ==
                                  os.path.abspath(output))
    lock, error = None, None
    if main:
        try:
            lock = claim_output_dir(output, resume=in_place, early=early, checkpoint=checkpoint)
        except RunError as e:
            error = e
    if not all_ranks_agree(error is None, device):
        raise error or RunError('rank 0 could not claim the output directory (see its message)')
    return lock, resume
