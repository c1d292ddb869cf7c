"""The exceptions tkvision raises for input a user can fix: each message names the key, path or
tensor and what to do. Command-line tools print them as one line (`tkvision.cli`, exit 2). And
`Preempted`, a run stopped by a signal with its state saved (tools exit `EXIT_PREEMPTED`).

A leaf module: every part of the package may import it; it imports nothing of tkvision.
"""
import pickle
from typing import Optional

__all__ = ['ConfigError', 'RunError', 'UnsafePathError', 'UsageError', 'WeightsMismatchError', 'UnsafeFileError',
           'NonFiniteLossError', 'USER_ERRORS', 'Preempted', 'EXIT_PREEMPTED', 'EXIT_INTERRUPTED', 'exit_status',
           'refused_pickle', 'is_refused_pickle']


class ConfigError(ValueError):
    """A config file or override that cannot be used (unknown key, bad value, missing base)."""


class RunError(RuntimeError):
    """A run that cannot start or continue as asked (output directory in use, nothing to resume, ...)."""


class UnsafePathError(RunError):
    """A name of a run's folder the run must not write or read through (``tkvision.utils.files.folder_path``: a
    symbolic link, a name outside the folder); the message names it and says what to do."""


class UsageError(ValueError):
    """Data or arguments that cannot be used as given (splits with different classes, too few shards, ...)."""


class WeightsMismatchError(ValueError):
    """Weights that do not fit a model; the message lists missing, unexpected and mis-shaped tensors."""


class UnsafeFileError(UsageError):
    """A ``.pth`` file that holds pickled Python objects other than tensors and plain containers: it is not
    loaded, since unpickling it could run code (`refused_pickle` words the message)."""


class NonFiniteLossError(RunError):
    """The training loss became NaN or infinite; the message gives the update range, the last good
    checkpoint if one exists, and what to try."""


def is_refused_pickle(error: BaseException) -> bool:
    """Whether ``error`` is ``torch.load(weights_only=True)`` refusing a file's pickled objects, as torch raises
    it (``pickle.UnpicklingError``) or as timm's checkpoint loader re-raises it (a ``RuntimeError`` saying that
    ``weights_only=True`` blocked the load)."""
    text = str(error)
    return isinstance(error, pickle.UnpicklingError) or ('weights_only' in text and 'blocked' in text)


def refused_pickle(path: str, error: Exception) -> UnsafeFileError:
    """The one-line error for a file ``torch.load(weights_only=True)`` refused (``error``), naming ``path``, the
    object it refused and how to convert a file the user trusts."""
    chain = [error, error.__cause__, error.__context__]  # timm re-raises torch's refusal: the cause names it
    text = '\n'.join(str(e) for e in chain if e is not None)
    what = next((line.strip() for line in text.splitlines() if 'GLOBAL' in line or 'Unsupported' in line), '')
    return UnsafeFileError(f'{path} holds pickled Python objects, not only tensors ({what or type(error).__name__}); '
                           'it was not loaded, since unpickling could run code. If you trust it, load it with '
                           'torch.load(path, weights_only=False) and save its tensors with safetensors')


#: Errors caused by the user's input: printed as one line by the command-line tools.
USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, WeightsMismatchError, RunError, UsageError)


class Preempted(RuntimeError):
    """The run was asked to stop (SIGTERM / SIGUSR1 / SIGUSR2, or a first Ctrl-C: SIGINT); its state was saved to
    ``last.pth``. Not a user error: rerunning the same command with ``--resume`` continues it.

    Args:
        message: what stopped and where the state is.
        signal_name: the signal that stopped the run (``'SIGUSR2'``), when one did.
    """

    def __init__(self, message: str, signal_name: Optional[str] = None):
        super().__init__(message)
        self.signal_name = signal_name


#: Exit status after a checkpoint written on SIGTERM / SIGUSR1 (sysexits' EX_TEMPFAIL: "try again").
EXIT_PREEMPTED = 75
#: Exit status after Ctrl-C (SIGINT), the shell's 128 + 2, whether the state was saved (a first Ctrl-C) or not (a
#: second one, which aborts at once).
EXIT_INTERRUPTED = 130


def exit_status(stop: Preempted) -> int:
    """The exit status of a run stopped by ``stop``: `EXIT_INTERRUPTED` for Ctrl-C, else `EXIT_PREEMPTED`."""
    return EXIT_INTERRUPTED if stop.signal_name == 'SIGINT' else EXIT_PREEMPTED
