"""How much memory a device can give: the one owner of that reading (the model benchmark's and the
NaFlex loader's refusals of work that cannot fit, before the kernel kills the process without a word)."""
import torch

__all__ = ['available_memory_bytes']


def available_memory_bytes(device) -> float:
    """Bytes ``device`` can give now: on CUDA the allocator's free memory (``torch.cuda.mem_get_info``), on a
    CPU ``MemAvailable`` of ``/proc/meminfo`` (what the kernel can give without swapping); inf where neither
    can be read."""
    device = torch.device(device)
    if device.type == 'cuda':
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('MemAvailable')) * 1024.
    except (OSError, StopIteration):
        return float('inf')
