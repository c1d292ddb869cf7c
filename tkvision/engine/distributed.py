"""Processes and devices: what training, evaluation and the tools share about where they run.

- `init_distributed`: one process, ``torchrun``, or a SLURM launch (``srun`` sets
  ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``), through timm's
  ``init_distributed_device_so`` (NCCL on CUDA, gloo on CPU).
- `all_ranks_agree`: one collective that turns a failure on any rank into a failure on all,
  so no rank waits forever in a collective its peer never reaches.
- `setup_threads`: the CPU threads of this process.
- `Processes`: this process's rank, the number of processes and the device, as every stage of a run
  reads them.
"""
import dataclasses
import os
import warnings
from datetime import timedelta
from typing import Union

import torch
import torch.distributed as dist
from timm.utils.distributed import init_distributed_device_so

from ..config_sections import RunConfig

__all__ = ['Processes', 'init_distributed', 'setup_threads', 'available_cores', 'all_ranks_agree', 'is_peer_failure']


@dataclasses.dataclass(frozen=True)
class Processes:
    """Where a run's process stands among its job's processes.

    Attributes:
        rank: this process's global rank, 0 to ``world - 1``.
        world: the number of processes of the job.
        device: this process's device.
    """
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the process that prints and writes the run's files."""
        return self.rank == 0


def available_cores() -> int:
    """Cores this process may use: its CPU affinity (not the machine's count), shared among the
    processes of this node (``LOCAL_WORLD_SIZE``, set by torchrun); at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get('LOCAL_WORLD_SIZE', 1))))


def setup_threads(run: RunConfig) -> None:
    """``torch.set_num_threads`` for the config's run section: ``threads`` when set, else
    ``available_cores``, so OpenMP threads never outnumber the cores (OpenMP threads that spin
    waiting for a busy core slow every update many times over).

    Warns (UserWarning) when ``threads`` exceeds `available_cores`: the run goes on as asked,
    many times slower, so the warning names the core count and the value to set instead."""
    cores = available_cores()
    threads = int(run.threads) if run.threads else cores
    if threads > cores:
        warnings.warn(f'threads: {threads} is more than the {cores} cores this process may use: threads '
                      f'that outnumber the cores run many times slower; set threads: {cores}, or leave it '
                      f'unset to use them all', stacklevel=2)
    torch.set_num_threads(threads)


def init_distributed(run: RunConfig) -> Processes:
    """Start ``torch.distributed`` when launched by torchrun or SLURM, pick the device, set TF32.

    ``run``: the config's run section. The device is ``run.device``, else ``cuda:<local rank>`` when CUDA is
        available, else CPU.
    TF32 matmuls and cuDNN convolutions follow ``run['tf32']`` (on by default: float32 work on
    Ampere and later GPUs runs on the tensor cores at ~10 mantissa bits).
    A collective that waits longer than ``run.dist_timeout_minutes`` for another rank fails
    (``torch.distributed.set_timeout``), so a rank whose peer died ends instead of waiting for ever; within one
    torchrun the agent ends the job sooner, as soon as it sees a worker die (``docs/reliability.md``).

    Returns:
        `Processes`.
    """
    device = run.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    info = init_distributed_device_so(device=device)
    if dist.is_available() and dist.is_initialized():
        dist.set_timeout(timedelta(minutes=run.dist_timeout_minutes))
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = run['tf32']
        torch.backends.cudnn.allow_tf32 = run['tf32']
    return Processes(info['global_rank'], info['world_size'], torch.device(info['device']))


def all_ranks_agree(ok: bool, device: Union[str, torch.device]) -> bool:
    """True when ``ok`` holds on every rank (one all-reduce under torch.distributed, else ``ok``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0


#: What gloo and NCCL say when a collective's peer process is gone or silent.
_PEER_FAILURES = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe', 'timed out', 'Timed out',
                  'NCCL communicator was aborted', 'remote process exited')


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error``, raised by a collective, says that another rank of the job died or stopped answering
    (``torch.distributed.DistBackendError``, or gloo's and NCCL's wording of it), rather than a fault of this
    rank's own work."""
    if isinstance(error, getattr(dist, 'DistBackendError', ())):
        return True
    text = str(error)
    return any(fragment in text for fragment in _PEER_FAILURES)
