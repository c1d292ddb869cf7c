"""What every tool shares: one-line errors (`run_cli`) and the argument types that refuse a bad value
before any work (`positive_int`, `yaml_mapping`, `device_name`, ...)."""
import argparse
import errno
import os
import sys
import traceback
from typing import Callable, Optional, Sequence

import torch.distributed as dist
import yaml

from ..utils.errors import EXIT_INTERRUPTED, USER_ERRORS, Preempted, exit_status

__all__ = ['run_cli', 'DEBUG_ENV', 'positive_int', 'non_negative_int', 'yaml_mapping', 'device_name']

#: Errors of the machine a user can fix (disk full, quota, read-only or forbidden path): one line too.
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EISDIR, errno.ENOTDIR,
                       errno.EIO)


#: Set to 1 to see the traceback of a user error too (as ``--debug`` does).
DEBUG_ENV = 'TKVISION_DEBUG'


def run_cli(tool: Callable[[Optional[Sequence[str]]], int], argv: Optional[Sequence[str]] = None) -> int:
    """Run ``tool(argv)`` for a command-line tool, with the rule every tkvision command shares: errors from
    `USER_ERRORS` and the machine's errors a user fixes (disk full, read-only or
    forbidden path) print one line ``error: ...`` on stderr and return 2; a run stopped by SIGTERM / SIGUSR1
    (``Preempted``, its state saved) prints why and returns `EXIT_PREEMPTED` (`EXIT_INTERRUPTED` for a first
    Ctrl-C); a second Ctrl-C, which aborts at once (``KeyboardInterrupt``), prints one line and returns
    `EXIT_INTERRUPTED`;
    any other error is a defect of ours and propagates with its traceback; a reader that closed the pipe
    (``tkvision-train --list-recipes | head``) ends the command quietly, exit 0. ``--debug`` anywhere in ``argv``,
    or ``TKVISION_DEBUG=1``, shows the traceback of a user error too. A process group left open (a torchrun
    launch) is destroyed on the way out."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = '--debug' in argv or os.environ.get(DEBUG_ENV) == '1'
    if '--debug' in argv:
        argv.remove('--debug')
    try:
        try:
            return tool(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except SystemExit as e:  # argparse's refusal of an argument (its usage and one error line, printed) or --help
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    except BrokenPipeError:  # the reader has what it wanted; what is left to print goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Preempted as e:
        print(str(e), file=sys.stderr)
        return exit_status(e)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print('interrupted by Ctrl-C: stopped at once, nothing saved since the last checkpoint', file=sys.stderr)
        return EXIT_INTERRUPTED
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


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (argparse then reports a bad value in one line, exit 2)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse ``type``: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected an integer >= {low}, got {text!r}') from None
    if value < low:
        raise argparse.ArgumentTypeError(f'expected an integer >= {low}, got {value}')
    return value


def yaml_mapping(text: str) -> dict:
    """An argparse ``type``: a YAML mapping such as ``'{img_size: 28, in_chans: 1}'`` (empty: ``{}``)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f'not valid YAML ({" ".join(str(e).split())})') from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a YAML mapping such as "{{img_size: 28, in_chans: 1}}", got '
                                         f'{text!r}')
    return value


def device_name(text: str) -> str:
    """An argparse ``type``: ``cpu``, ``cuda`` or ``cuda:N``, refusing CUDA where there is none."""
    import torch
    if text == 'cpu':
        return text
    if text != 'cuda' and not (text.startswith('cuda:') and text[5:].isdigit()):
        raise argparse.ArgumentTypeError(f"expected 'cpu', 'cuda' or 'cuda:N', got {text!r}")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f'{text}: no CUDA device here; use --device cpu')
    return text
