"""The project's one atomic file write: a temporary file in the target's folder, then ``os.replace``
(atomic on POSIX), so a crash, a full disk or a kill leaves either the old file or the new one,
never a half-written file under the final name; `atomic_folder` does the same for a folder of
files (an exported model).

**The run folder's rule** (every file a run writes, ``docs/reliability.md``; `folder_path` applies it):

1. *Where*: a run writes only inside its folder: a name that leaves it (``..``, an absolute path) is refused, and so is
   a symbolic link at a name it writes into in place or reads on resume.
2. *How*: a file written whole goes through `atomic_write` (a temporary beside it, then renamed over the name), so a
   kill leaves the old file or the new one, a symbolic link at the name is replaced, never followed, and a hard
   link's other names keep their content. A file or folder written into in place (a logger's folder, a SQLite store,
   the lock, an appended log) is checked at the start: a symbolic link is refused in one line, and a file with other
   hard links (a ``cp -al`` snapshot) is first replaced by a private copy, so the snapshot stays as it was.
3. *What a resume reads*: regular files of its own folder only, never through a link.

**File modes.** Every file and folder tkvision writes (a run's checkpoints, weights, metrics, plots and lock,
an export, a sweep's tables) gets the mode any program's new file gets: ``0666`` for a file and ``0777`` for a
folder, less the process's umask (``0644`` / ``0755`` under the usual ``022``). The temporary files the writes
go through are created private (``0600``, Python's ``mkstemp``) and given that mode before they take the
final name. Set a stricter umask (``umask 077``) to keep runs private.
"""
import contextlib
import csv
import errno
import hashlib
import os
import shutil
import tempfile
from typing import Callable, Dict, Iterator, List

from .errors import UnsafePathError

__all__ = ['atomic_write', 'write_stamped_csv', 'atomic_folder', 'holds_files', 'umask', 'FILE_MODE', 'FOLDER_MODE',
           'safetensors_os_errors', 'file_sha256', 'folder_path', 'UnsafePathError']

#: The modes of new files and folders before the umask (module docstring).
FILE_MODE, FOLDER_MODE = 0o666, 0o777


def umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status`` on Linux; elsewhere set and
    restored at once)."""
    try:
        with open('/proc/self/status') as f:
            return int(next(line.split()[1] for line in f if line.startswith('Umask:')), 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def atomic_write(path: str, write: Callable, text: bool = False) -> None:
    """Write ``path`` atomically.

    Args:
        path: the final file name (its folder is created if missing).
        write: ``write(tmp_path)`` for writers that take a path (``torch.save``, safetensors'
            ``save_file``), or, with ``text=True``, ``write(file)`` given an open text file.
        text: open the temporary file for ``write`` (UTF-8 text, ``newline=''``).

    Raises:
        whatever ``write`` or the file system raises (``OSError`` for a full disk); the temporary
        file is removed first and ``path`` is left as it was.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    try:
        if text:
            with os.fdopen(fd, 'w', encoding='utf-8', newline='') as f:
                write(f)
        else:
            os.close(fd)
            write(tmp)
        os.chmod(tmp, FILE_MODE & ~umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def safetensors_os_errors(path: str) -> Iterator[None]:
    """safetensors reports the file system's errors as its own ``SafetensorError``: a full disk becomes the
    ``OSError(ENOSPC)`` it is (which the commands print as one line), naming ``path``."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - SafetensorError is a bare Exception subclass of the Rust binding
        if type(e).__name__ == 'SafetensorError' and ('code: 28' in str(e) or 'No space left' in str(e)):
            raise OSError(errno.ENOSPC, f'No space left on the device writing {path} (safetensors: {e})') from None
        raise


def folder_path(folder: str, name: str, use: str = 'read') -> str:
    """``<folder>/<name>`` under the run folder's rule (module docstring), for ``use``:

    - ``'write'``: a file written whole (through `atomic_write`): a symbolic link at ``name`` itself is replaced by the
      rename, never followed; one above it, below ``folder``, is refused;
    - ``'read'``: a file a resume reads: a symbolic link at ``name`` or above it is refused;
    - ``'in_place'``: a file or folder written into (a database, an appended log, a logger's folder): as ``'read'``,
      and a regular file there with other hard links is first replaced by a private copy of itself (the other names
      keep theirs).

    Raises:
        UnsafePathError: ``name`` leaves ``folder``, or a link stands where ``use`` allows none (named, with what to
            do).
        ValueError: an unknown ``use``.
    """
    if use not in ('read', 'write', 'in_place'):
        raise ValueError(f"use must be 'read', 'write' or 'in_place', got {use!r}")
    parts = os.path.normpath(name).split(os.sep)
    if os.path.isabs(name) or '..' in parts:
        raise UnsafePathError(f'{name!r} is not a name inside the run folder {folder}: a run writes only there')
    path = folder
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        if os.path.islink(path) and not (use == 'write' and i == len(parts) - 1):
            raise UnsafePathError(f'{path} is a symbolic link (to {os.readlink(path)!r}): a run writes and reads only '
                                  'inside its own folder, never through a link; remove the link (or pass another '
                                  '--output)')
    if use == 'in_place' and os.path.isfile(path) and os.stat(path).st_nlink > 1:
        _private_copy(path)
    return path


def _private_copy(path: str) -> None:
    """Replace the file ``path``, which has other hard links, by a copy of its own (atomically: a temporary, then a
    rename), so that writing into it leaves the other names' content as it was."""
    atomic_write(path, lambda tmp: shutil.copyfile(path, tmp))


def file_sha256(path: str) -> str:
    """The sha256 of the file at ``path`` (hex), read in 1 MiB chunks.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def holds_files(path: str) -> bool:
    """True when ``path`` is a file, or a folder that is not empty."""
    return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))


def atomic_folder(path: str, write: Callable, replace: bool = False) -> None:
    """Write the folder ``path`` atomically: ``write(tmp_folder)`` fills a temporary folder beside it,
    which is then renamed to ``path``, so a failed write (a full disk, a kill) leaves no folder that
    looks complete.

    Args:
        path: the final folder; a symbolic link is followed, so the folder it points to is written and the link
            stays. write: ``write(tmp_folder)``.
        replace: replace a ``path`` that already holds files (the old folder goes only after the new one
            is complete); otherwise such a ``path`` is refused.

    Raises:
        FileExistsError: ``path`` holds files and not ``replace`` (checked before writing anything).
        whatever ``write`` raises; the temporary folder is removed and ``path`` is left as it was.
    """
    path = os.path.realpath(path)  # a link to an earlier export: replace the folder it points to, keep the link
    if holds_files(path) and not replace:
        raise FileExistsError(f'{path} already exists and holds files; write to a new folder (or pass --force '
                              'to replace it)')
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    try:
        write(tmp)
        mask = umask()
        for folder, _, files in os.walk(tmp):  # whatever the writer created, the one policy (module docstring)
            os.chmod(folder, FOLDER_MODE & ~mask)
            for name in files:
                os.chmod(os.path.join(folder, name), FILE_MODE & ~mask)
        old = None
        if os.path.isdir(path) and os.listdir(path):
            old = tmp[:-len('.tmp')] + '.old'  # unique as tmp is; made by the rename itself, so nothing is left over
            os.replace(path, old)
        elif os.path.isdir(path):
            os.rmdir(path)
        os.replace(tmp, path)
        if old:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_stamped_csv(path: str, rows: List[dict], stamp: Dict[str, str]) -> None:
    """``rows`` to the CSV file ``path`` through `atomic_write`, each with the columns of ``stamp`` (machine, date,
    commit: where and on what code a benchmark measured them) after its own; the columns are the first row's.

    Raises:
        IndexError: ``rows`` is empty.
    """
    def write(f):
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) + list(stamp))
        writer.writeheader()
        writer.writerows(dict(row, **stamp) for row in rows)
    atomic_write(path, write, text=True)
