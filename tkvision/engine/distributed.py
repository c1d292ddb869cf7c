"""Processes and devices: what training, evaluation and the tools share about where they run.

- `DevicePlan` / `device_plan`: every choice a run takes from its device (the process-group backend, TF32,
  pinned memory, ``compile: auto``, DDP's ``device_ids``, autocast's dtype, the gradient scaler, how masked
  attention counts in the memory check), taken once, from the run's device and never from whether the machine
  has CUDA: a ``device: cpu`` run on a GPU machine is a CPU run. ``tests/test_device_plan.py`` drives it for
  ``cuda`` and ``cpu``.
- `init_distributed`: one process, ``torchrun``, or a SLURM launch (``srun`` sets
  ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``), through timm's
  ``init_distributed_device_so`` with the plan's backend (NCCL on CUDA, gloo on a CPU).
- `all_ranks_agree`: one collective that turns a failure on any rank into a failure on all,
  so no rank waits forever in a collective its peer never reaches.
- `setup_threads`: the CPU threads of this process (null ``threads``: the cores free at start, `default_threads`).
- `Processes`: this process's rank, the number of processes and its device's plan, as every stage of a run
  reads them.
"""
import dataclasses
import os
import time
import warnings
from datetime import timedelta
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from timm.utils.distributed import init_distributed_device_so

from ..utils.config_fields import boolean, choice, integer, key, number, rule
from ..utils.errors import ConfigError
from ..utils.memory import available_memory_bytes
from ..utils.precision import AMP_DTYPES

__all__ = ['ProcessConfig', 'DevicePlan', 'device_plan', 'Processes', 'init_distributed', 'setup_threads',
           'available_cores', 'busy_cores', 'default_threads', 'all_ranks_agree', 'is_peer_failure']


def _is_device(value) -> bool:
    """``cpu``, ``cuda``, ``cuda:N`` (N >= 0) or null: the devices a run trains on."""
    return value is None or value in ('cpu', 'cuda') or (isinstance(value, str) and value.startswith('cuda:')
                                                        and value[5:].isdigit())


@dataclasses.dataclass(frozen=True)
class ProcessConfig:
    """Where and how the processes run (the ``process`` section): the ``Config`` of this module, read by
    `setup_threads`, `init_distributed` and `device_plan`."""

    device: Optional[str] = key(None, allowed=rule(_is_device, "'cpu', 'cuda', 'cuda:N' or null"), resume=True)
    """Where the model runs (``'cpu'``, ``'cuda'``, ``'cuda:1'``); null: CUDA if available, else the CPU."""
    threads: Optional[int] = key(None, allowed=integer(1, null=True), resume=True)
    """``torch.set_num_threads``; null: the cores this process may use (its affinity, shared among a node's
    processes) less those other work keeps busy when the run starts (`default_threads`; the start-up line says the
    choice). A float's last digits depend on the thread count: set it to repeat a run's digits exactly."""
    amp: Optional[str] = key(None, allowed=choice(None, 'bf16', 'fp16'))
    """Mixed precision: null (float32), ``'bf16'`` or ``'fp16'`` (with a gradient scaler)."""
    tf32: bool = key(True, allowed=boolean(), resume=True)
    """CUDA: TF32 matmuls and convolutions for float32 work."""
    dist_timeout_minutes: float = key(10, allowed=number(0.1, 10080), resume=True)  # 6 s to a week: collectives take ms
    """Minutes a collective waits for another process before the job fails (a process that died)."""

@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Every choice a run makes from the device it runs on (`device_plan` takes them, in one place).

    Attributes:
        device: the device.
        backend: the ``torch.distributed`` process-group backend: ``'nccl'`` on CUDA, ``'gloo'`` on a CPU.
        tf32: whether float32 matmuls and cuDNN convolutions run on TF32 tensor cores (CUDA with ``tf32: true``;
            a CPU has none, and its run leaves PyTorch's flags as they are).
        pin_memory: whether loaders return page-locked batches (CUDA: the copy to the GPU overlaps compute); a
            CPU run pins nothing.
        compile: whether the model is ``torch.compile``'d: ``compile: true``, or ``'auto'`` on CUDA.
        ddp_device_ids: ``DistributedDataParallel``'s ``device_ids``: ``(index,)`` on CUDA, None on a CPU.
        autocast_dtype: ``torch.autocast``'s dtype for ``amp`` (``tkvision.utils.precision.AMP_DTYPES``), None for
            float32.
        grad_scaler: whether the gradient scaler scales the loss (``amp: fp16``, on either device).
        fused_masked_attention: whether attention with a mask (NaFlex padding) runs fused, without its
            ``heads x L²`` scores and probabilities in memory (CUDA's SDPA kernels), or unfused (a CPU): what
            the NaFlex memory check counts.
    """
    device: torch.device
    backend: str
    tf32: bool
    pin_memory: bool
    compile: bool
    ddp_device_ids: Optional[Tuple[int, ...]]
    autocast_dtype: Optional[torch.dtype]
    grad_scaler: bool
    fused_masked_attention: bool

    def available_memory(self) -> float:
        """Bytes the device can give now (``tkvision.utils.memory.available_memory_bytes``)."""
        return available_memory_bytes(self.device)

    def peak_memory(self) -> Dict[str, float]:
        """``{'peak_mem_mib': MiB}``: the CUDA allocator's peak since the last call (then reset), a figure of
        ``metrics.csv``; ``{}`` on a CPU, whose allocator keeps no peak."""
        if self.device.type != 'cuda':
            return {}
        peak = torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        torch.cuda.reset_peak_memory_stats(self.device)
        return dict(peak_mem_mib=peak)

    def set_tf32(self) -> None:
        """Set PyTorch's TF32 flags (matmul and cuDNN) to `tf32` on CUDA; on a CPU leave them as they are."""
        if self.device.type == 'cuda':
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32


def device_plan(
        device: Union[str, torch.device],
        amp: Optional[str] = None,
        tf32: bool = True,
        compile: Union[bool, str] = 'auto',
) -> DevicePlan:
    """The `DevicePlan` of a run on ``device`` with the config's ``amp``, ``tf32`` and ``compile`` keys (their
    defaults here are the config's). Only the device decides: never whether the machine has CUDA.

    Raises:
        ConfigError: ``amp: bf16`` on a CUDA device without bf16 (before Ampere), naming ``amp: fp16``; an
            ``amp`` that is none of ``tkvision.utils.precision.AMP_DTYPES``.
    """
    device = torch.device(device)
    if amp not in AMP_DTYPES:
        raise ConfigError(f'amp: {amp!r} is not a precision; use null (float32), bf16 or fp16')
    cuda = device.type == 'cuda'
    if cuda and amp == 'bf16' and not torch.cuda.is_bf16_supported():
        raise ConfigError(f'amp: bf16 needs a GPU with bfloat16 (Ampere or later); {device} has none: set amp: fp16 '
                          '(with the gradient scaler) or null')
    return DevicePlan(device=device, backend='nccl' if cuda else 'gloo', tf32=cuda and bool(tf32), pin_memory=cuda,
                      compile=compile is True or (compile == 'auto' and cuda),
                      ddp_device_ids=(device.index,) if cuda and device.index is not None else None,
                      autocast_dtype=AMP_DTYPES[amp], grad_scaler=amp == 'fp16', fused_masked_attention=cuda)


@dataclasses.dataclass(frozen=True)
class Processes:
    """Where a run's process stands among its job's processes, and its device's plan.

    Attributes:
        rank: this process's global rank, 0 to ``world - 1``.
        world: the number of processes of the job.
        plan: the choices its device makes (`DevicePlan`).
    """
    rank: int
    world: int
    plan: DevicePlan

    @property
    def device(self) -> torch.device:
        """This process's device."""
        return self.plan.device

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the process that prints and writes the run's files."""
        return self.rank == 0


def available_cores() -> int:
    """Cores this process may use: its CPU affinity (not the machine's count), shared among the
    processes of this node (``LOCAL_WORLD_SIZE``, set by torchrun); at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get('LOCAL_WORLD_SIZE', 1))))


def busy_cores(cpus: Sequence[int], seconds: float = 0.3) -> float:
    """How many of the CPUs ``cpus`` other work keeps busy: their non-idle share of ``seconds`` of wall time, read
    from the kernel's counters (``/proc/stat``, Linux) before and after, times their number; 0 where those are not
    readable. The calling process should be idle meanwhile (it sleeps)."""
    def ticks() -> Dict[int, Tuple[int, int]]:
        out = {}
        with open('/proc/stat') as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith('cpu') and name[3:].isdigit() and int(name[3:]) in cpus:
                    values = [int(v) for v in fields[:8]]
                    out[int(name[3:])] = (sum(values), values[3] + values[4])  # total, idle + iowait
        return out
    try:
        before = ticks()
        time.sleep(seconds)
        after = ticks()
    except (OSError, ValueError):
        return 0.0
    total = sum(after[c][0] - before[c][0] for c in after if c in before)
    idle = sum(after[c][1] - before[c][1] for c in after if c in before)
    return len(after) * (1 - idle / total) if total > 0 else 0.0


def default_threads() -> Tuple[int, str]:
    """The thread count of a run that leaves ``threads`` null, and why, in words for its start-up line: the cores
    this process may use (`available_cores`), less those other work kept busy when it started (`busy_cores`,
    measured once, rounded to the nearest core), at least 1. Threads that outnumber the free cores do not add
    speed but wait for one another: beside one other CPU-bound job, 2 threads on 2 cores ran several times slower
    than 1 (``docs/bench/cpu_threads.md``). Under torchrun the node's processes share the cores and nothing is
    measured (they start together)."""
    cores = available_cores()
    if int(os.environ.get('LOCAL_WORLD_SIZE', 1)) > 1 or not hasattr(os, 'sched_getaffinity'):
        return cores, f'{cores} of the cores shared by this node\'s processes'
    busy = busy_cores(sorted(os.sched_getaffinity(0)))
    threads = max(1, min(cores, round(cores - busy)))
    if threads == cores:
        return threads, f'{cores} cores, idle at start'
    return threads, f'{cores} cores, {busy:.1f} busy with other work at start'


def setup_threads(process: ProcessConfig) -> str:
    """``torch.set_num_threads`` for the config's process section: ``threads`` when set, else `default_threads`
    (the free cores at start), so OpenMP threads never outnumber the cores (OpenMP threads that spin waiting for a
    busy core slow every update many times over).

    Returns:
        the choice in words, for the run's start-up line (``'threads 1 (2 cores, 1.0 busy with other work at start;
        set threads to override)'``).

    Warns (UserWarning) when ``threads`` exceeds `available_cores`: the run goes on as asked,
    many times slower, so the warning names the core count and the value to set instead."""
    cores = available_cores()
    if process.threads:
        threads, why = int(process.threads), 'the threads key'
    else:
        threads, reason = default_threads()
        why = f'{reason}; set threads to override'
    if threads > cores:
        warnings.warn(f'threads: {threads} is more than the {cores} cores this process may use: threads '
                      f'that outnumber the cores run many times slower; set threads: {cores}, or leave it '
                      f'unset to use the free ones', stacklevel=2)
    torch.set_num_threads(threads)
    return f'threads {threads} ({why})'


def init_distributed(process: ProcessConfig, compile: Union[bool, str] = 'auto') -> Processes:
    """Start ``torch.distributed`` when launched by torchrun or SLURM, pick the device, take its plan, set TF32.

    ``process``: the config's process section; ``compile``: the model section's ``compile`` key. The device is
    ``process.device``, else ``cuda:<local rank>`` when CUDA is available, else CPU (the one choice the machine
    makes); every other choice follows the device (`device_plan`). On CUDA, TF32 matmuls and cuDNN convolutions
    follow ``process.tf32`` (on by default: float32 work on Ampere and later GPUs runs on the tensor cores at ~10
    mantissa bits).
    A collective that waits longer than ``process.dist_timeout_minutes`` for another rank fails
    (``torch.distributed.set_timeout``), so a rank whose peer died ends instead of waiting for ever; within one
    torchrun the agent ends the job sooner, as soon as it sees a worker die (``docs/reliability.md``).

    Returns:
        `Processes`.

    Raises:
        ConfigError: a CUDA device where there is none; as `device_plan` (checked before the process group starts).
    """
    device = process.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise ConfigError(f'device {device}: no CUDA device here; set device: cpu (or leave it null: CUDA where '
                          'there is one, else the CPU)')
    backend = device_plan(device, process.amp, process.tf32, compile).backend
    info = init_distributed_device_so(device=device, dist_backend=backend)
    if dist.is_available() and dist.is_initialized():
        dist.set_timeout(timedelta(minutes=process.dist_timeout_minutes))
    plan = device_plan(info['device'], process.amp, process.tf32, compile)  # with the index torchrun's local rank gave
    plan.set_tf32()
    return Processes(info['global_rank'], info['world_size'], plan)


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
