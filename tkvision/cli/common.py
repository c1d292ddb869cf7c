"""What every tool shares: one-line errors (:func:`run_cli`)."""
import errno
import sys
import traceback

import torch.distributed as dist

from ..utils.errors import EXIT_PREEMPTED, USER_ERRORS, Preempted

__all__ = ['run_cli']

#: Errors of the machine a user can fix (disk full, quota, read-only or forbidden path): one line too.
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EISDIR, errno.ENOTDIR)


def run_cli(tool, argv=None) -> int:
    """Run ``tool(argv)`` for a command-line tool: errors from :data:`~tkvision.utils.errors.USER_ERRORS`
    and the machine's errors a user fixes (disk full, read-only or forbidden path) print one line
    ``error: ...`` on stderr and return 2; a run stopped by SIGTERM / SIGUSR1 (``Preempted``, its state saved)
    prints why and returns :data:`~tkvision.utils.errors.EXIT_PREEMPTED`; other errors propagate with their
    traceback. ``--debug`` anywhere in ``argv`` shows the traceback for every error. A process group
    left open (a torchrun launch) is destroyed on the way out."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = '--debug' in argv
    if debug:
        argv.remove('--debug')
    try:
        return tool(argv)
    except Preempted as e:
        print(str(e), file=sys.stderr)
        return EXIT_PREEMPTED
    except (*USER_ERRORS, OSError) as e:
        if not isinstance(e, USER_ERRORS) and e.errno not in _ENVIRONMENT_ERRNOS:
            raise
        if debug:
            traceback.print_exc()
        print(f'error: {e}  (--debug shows the traceback)', file=sys.stderr)
        return 2
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
