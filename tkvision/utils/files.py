"""The project's one atomic file write: a temporary file in the target's folder, then ``os.replace``
(atomic on POSIX), so a crash, a full disk or a kill leaves either the old file or the new one,
never a half-written file under the final name."""
import os
import tempfile

__all__ = ['atomic_write']


def atomic_write(path: str, write, text: bool = False):
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
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
