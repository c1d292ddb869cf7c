"""Output directories: one run per directory, never overwritten, locked while a run writes to it.

A run owns ``cfg['output']``. Starting a run in a directory that already holds a run's files fails
with a message naming the directory and the two ways out (``--resume`` to continue it, or another
``--output``); a directory that holds only the ``config.yaml`` of a run killed before its first
checkpoint is not a run to protect (there is nothing to continue), so it may start again there: we chose failing over
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
"""
import fcntl
import os
import socket

from ..utils.errors import RunError
from ..utils.files import FILE_MODE

__all__ = ['LOCK_NAME', 'RunDirLock', 'claim_output_dir', 'run_files']

LOCK_NAME = '.lock'
#: What a run writes before its first checkpoint (``config.yaml``; TensorBoard's folder).
_BEFORE_FIRST_CHECKPOINT = (LOCK_NAME, 'config.yaml', 'tb')


def run_files(out: str) -> list:
    """The files of ``out`` that hold a run's work (all but the lock, ``config.yaml`` and ``tb/``), sorted."""
    if not os.path.isdir(out):
        return []
    return sorted(f for f in os.listdir(out) if f not in _BEFORE_FIRST_CHECKPOINT)


class RunDirLock:
    """The held lock of one output directory; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd

    def release(self):
        """Unlock and close the lock file; a second call does nothing."""
        if self.fd is not None:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def claim_output_dir(out: str, resume: bool) -> RunDirLock:
    """Create ``out`` if needed and lock it for this run.

    Args:
        out: the run's output directory.
        resume: the run continues the one in ``out`` (its files are expected there).

    Raises:
        RunError: another process holds the lock (its host and pid are named), or ``out`` already
            holds a run's files (:func:`run_files`) and ``resume`` is false.
    """
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)  # less the umask, as every file tkvision writes
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 256, 0).decode(errors='replace').strip() or 'another process'
        os.close(fd)
        raise RunError(f'output directory {out} is in use by a running job ({holder}); wait for it to end, '
                       'or pass another --output') from None
    others = run_files(out)
    if others and not resume:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)
        through_make = (' (through make: make train ARGS=--resume, or make train ARGS="--output runs/another")'
                        if os.environ.get('MAKELEVEL') else '')
        raise RunError(f'output directory {out} already holds a run ({", ".join(sorted(others)[:4])}'
                       f'{", ..." if len(others) > 4 else ""}); continue it with --resume, or pass another --output'
                       + through_make)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'host {socket.gethostname()} pid {os.getpid()}\n'.encode(), 0)
    return RunDirLock(path, fd)
