"""How much memory a device can give: the one owner of that reading (the model benchmark's and the
NaFlex loader's refusals of work that cannot fit, before the kernel kills the process without a word), and
of telling an allocation failure from other errors.

On a CPU the figure is the least of what the machine has free (``MemAvailable``), what the process's address
space may still grow by (``ulimit -v``, ``RLIMIT_AS``) and what its control group may still use (cgroup v2
``memory.max`` less ``memory.current``: a container's limit, SLURM's ``--mem``).
"""
import os
import resource
from typing import Union

import torch

__all__ = ['available_memory_bytes', 'is_out_of_memory']


def _meminfo_available() -> float:
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('MemAvailable')) * 1024.
    except (OSError, StopIteration, ValueError):
        return float('inf')


def _address_space_left() -> float:
    """``RLIMIT_AS`` less the process's address space now (``VmSize``); inf without a limit."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return float('inf')
    try:
        with open('/proc/self/status') as f:
            used = next(int(line.split()[1]) for line in f if line.startswith('VmSize')) * 1024.
    except (OSError, StopIteration, ValueError):
        used = 0.
    return max(0., limit - used)


def _cgroup_left() -> float:
    """cgroup v2 ``memory.max`` less ``memory.current`` of this process's group; inf without a limit."""
    try:
        with open('/proc/self/cgroup') as f:
            path = next(line.strip().split(':', 2)[2] for line in f if line.startswith('0::'))
        folder = os.path.join('/sys/fs/cgroup', path.lstrip('/'))
        with open(os.path.join(folder, 'memory.max')) as f:
            limit = f.read().strip()
        if limit == 'max':
            return float('inf')
        with open(os.path.join(folder, 'memory.current')) as f:
            return max(0., float(limit) - float(f.read()))
    except (OSError, StopIteration, ValueError, IndexError):
        return float('inf')


def available_memory_bytes(device: Union[str, torch.device]) -> float:
    """Bytes ``device`` can give now: on CUDA the allocator's free memory (``torch.cuda.mem_get_info``), on a
    CPU the least of ``MemAvailable``, the address space left under ``RLIMIT_AS`` and the control group's
    memory left (module docstring); inf where none can be read."""
    device = torch.device(device)
    if device.type == 'cuda':
        return float(torch.cuda.mem_get_info(device)[0])
    return min(_meminfo_available(), _address_space_left(), _cgroup_left())


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: CUDA's ``OutOfMemoryError``, or the CPU allocator's
    ``RuntimeError`` ("can't allocate memory", which a ``ulimit -v`` or a cgroup limit also give), or a
    ``MemoryError``."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or 'out of memory' in text)
