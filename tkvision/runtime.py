"""Run-time helpers shared by training, evaluation and the tools: processes, devices, seeds, models.

- :func:`init_distributed`: one process, ``torchrun``, or a SLURM launch (``srun`` sets
  ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``), through timm's
  ``init_distributed_device_so`` (NCCL on CUDA, gloo on CPU).
- :func:`all_ranks_agree`: one collective that turns a failure on any rank into a failure on all,
  so no rank waits forever in a collective its peer never reaches.
- :func:`step_seed`: the main process's random state for one micro-batch (drop path, mixup, random
  erasing), a hash of ``(seed, epoch, batch, rank)``, so a resumed run draws what an uninterrupted
  run would.
- :func:`cli`: command-line error handling: a user's mistake is one line on stderr (exit 2), the
  traceback only with ``--debug``.
"""
import hashlib
import sys
import traceback

import timm
import torch
import torch.distributed as dist
from timm.utils import random_seed
from timm.utils.distributed import init_distributed_device_so

from .checkpoint import WeightsMismatchError
from .config import ConfigError

__all__ = ['RunError', 'UsageError', 'USER_ERRORS', 'init_distributed', 'setup_threads', 'build_model', 'step_seed', 'seed_step',
           'all_ranks_agree', 'cli']


class RunError(RuntimeError):
    """A run that cannot start or continue as asked (output directory in use, nothing to resume, ...)."""


class UsageError(ValueError):
    """Data or arguments that cannot be used as given (splits with different classes, too few shards, ...)."""


#: Errors caused by the user's input: printed as one line by :func:`cli`.
USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, WeightsMismatchError, RunError, UsageError)


def setup_threads(cfg: dict):
    """``torch.set_num_threads(cfg['threads'])`` when set (1-2 threads measured fastest on small CPUs)."""
    if cfg['threads']:
        torch.set_num_threads(int(cfg['threads']))


def init_distributed(cfg: dict):
    """Start ``torch.distributed`` when launched by torchrun or SLURM, pick the device, set TF32.

    The device is ``cfg['device']``, else ``cuda:<local rank>`` when CUDA is available, else CPU.
    TF32 matmuls and cuDNN convolutions follow ``cfg['tf32']`` (on by default: float32 work on
    Ampere and later GPUs runs on the tensor cores at ~10 mantissa bits).

    Returns:
        ``(rank, world_size, device)``.
    """
    device = cfg['device'] or ('cuda' if torch.cuda.is_available() else 'cpu')
    info = init_distributed_device_so(device=device)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = cfg['tf32']
        torch.backends.cudnn.allow_tf32 = cfg['tf32']
    return info['global_rank'], info['world_size'], torch.device(info['device'])


def build_model(cfg: dict, num_classes=None) -> torch.nn.Module:
    """The model ``cfg`` trains: ``timm.create_model(cfg['model'], drop_path_rate=..., **cfg['model_kwargs'])``,
    or for ``task: mae`` a :class:`tkvision.models.mae.MaskedAutoencoder` around that model as encoder
    (``mask_ratio``, ``norm_pix_loss``, ``decoder``).

    ``num_classes`` defaults to the dataset's (10 for Fashion-MNIST, else 1000) unless
    ``model_kwargs`` sets it.
    """
    kwargs = dict(cfg['model_kwargs'])
    if cfg['drop_path_rate']:
        kwargs['drop_path_rate'] = cfg['drop_path_rate']
    if cfg.get('task') == 'mae':
        from .models.mae import create_mae
        d = cfg['decoder']
        return create_mae(cfg['model'], decoder=dict(embed_dim=d['embed_dim'], depth=d['depth'], num_heads=d['num_heads']),
                          mask_ratio=cfg['mask_ratio'], norm_pix_loss=cfg['norm_pix_loss'],
                          decoder_num_tokens=d['num_tokens'], decoder_kind=d['kind'], **kwargs)
    kwargs.setdefault('num_classes', num_classes or (10 if cfg['dataset'] == 'fashion_mnist' else 1000))
    return timm.create_model(cfg['model'], **kwargs)


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """31-bit seed of the main process's random draws for micro-batch ``batch`` of ``epoch``."""
    digest = hashlib.blake2b(f'step/{seed}/{epoch}/{batch}'.encode(), digest_size=4).digest()
    return int.from_bytes(digest, 'little') >> 1


def seed_step(seed: int, epoch: int, batch: int, rank: int = 0):
    """Seed Python, NumPy and torch (timm's ``random_seed``) for one micro-batch on ``rank``."""
    random_seed(step_seed(seed, epoch, batch), rank)


def all_ranks_agree(ok: bool, device) -> bool:
    """True when ``ok`` holds on every rank (one all-reduce under torch.distributed, else ``ok``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0


def cli(fn, argv=None) -> int:
    """Run ``fn(argv)`` for a command-line tool: errors from :data:`USER_ERRORS` print one line
    ``error: ...`` on stderr and return 2; other errors propagate with their traceback.
    ``--debug`` anywhere in ``argv`` shows the traceback for every error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = '--debug' in argv
    if debug:
        argv.remove('--debug')
    try:
        return fn(argv)
    except USER_ERRORS as e:
        if debug:
            traceback.print_exc()
        print(f'error: {e}  (--debug shows the traceback)', file=sys.stderr)
        return 2
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
