"""Where a training step's time goes: the PyTorch profiler's operators, each counted under what runs it.

[`profile_breakdown`][tkvision.experiments.profile.profile_breakdown] profiles a few training steps of each model and
sums the operators' time by category (`PROFILE_CATEGORIES`): an operator run by a backward node counts as that
node's category (Θ's closed-form backward as Θ, not as the elementwise operators it is made of), an operator
inside the optimizer's step as the optimizer. ``tools/benchmark.py --parts profile`` prints the table.
"""
from typing import Callable, Dict, Iterable, Optional, Sequence, Union

import torch

from .benchmark import ModelStep, synchronize

__all__ = ['PROFILE_CATEGORIES', 'BACKWARD_CATEGORIES', 'OPTIMIZER_SCOPE', 'category_ms', 'profile_breakdown']


#: Profiler op-name categories for `profile_breakdown` (first match wins; the rest is 'other').
PROFILE_CATEGORIES = (
    ('matmul', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::linear', 'aten::matmul', 'mkl_linear')),
    ('attention (SDPA)', ('scaled_dot_product',)),
    ('layer norm (or its fold)', ('layer_norm', 'aten::mean', 'aten::sub')),
    ('score normalisation / GELU', ('aten::gelu', 'aten::linalg_vector_norm', 'aten::norm', 'aten::clamp',
                                    'aten::masked_fill', 'aten::div', 'aten::mul', 'aten::erf', 'aten::exp',
                                    'aten::where', 'aten::sum', 'aten::reciprocal', 'aten::linalg_vecdot',
                                    'aten::addcmul', 'L2NormGELU', 'gelu')),
)
"""``(category, fragments of an operator's name)``, first match wins; the rest is ``other``. Kernels of a
``torch.compile``'d model (``cpp_fused_...`` on a CPU) are named after the operations they fuse, so a fused
layer norm counts as layer norm and a fused score normalisation or GELU as that. The fold's key centring
(``aten::mean`` / ``aten::sub``) counts as layer norm, the work it replaces."""


#: ``(category, fragments of a backward node's name)``: an operator run by the autograd engine for that node
#: (``autograd::engine::evaluate_function: <node>``) counts in the node's category, so the products and sums
#: of Θ's closed-form backward count as Θ, not as the elementwise operators they are.
BACKWARD_CATEGORIES = (
    ('matmul', ('MmBackward', 'AddmmBackward', 'BmmBackward', 'LinearBackward', 'MatmulBackward')),
    ('attention (SDPA)', ('ScaledDotProduct',)),
    ('layer norm (or its fold)', ('LayerNormBackward', 'MeanBackward', 'SubBackward')),
    ('score normalisation / GELU', ('GeluBackward', 'L2NormGELU', 'LinalgVectorNormBackward', 'ClampMinBackward',
                                    'DivBackward', 'WhereBackward')),
)


#: Every operator under this scope is the optimizer's (``torch.optim`` names its step so).
OPTIMIZER_SCOPE = 'Optimizer.step'


def _category(ev) -> str:
    """The category of one profiler event (``PROFILE_CATEGORIES``): the optimizer's for anything under
    its step; else matrix products, attention and layer norm by the operator's own name; else the backward
    node that ran it (``BACKWARD_CATEGORIES``); else the operator's name; else ``other``."""
    node, parent = None, getattr(ev, 'cpu_parent', None)
    while parent is not None:
        if OPTIMIZER_SCOPE in parent.name:
            return 'optimizer (AdamW)'
        if node is None and parent.name.startswith('autograd::engine::evaluate_function: '):
            node = parent.name
        parent = parent.cpu_parent
    if OPTIMIZER_SCOPE in ev.key:
        return 'optimizer (AdamW)'
    own = next((c for c, keys in PROFILE_CATEGORIES if any(k in ev.key for k in keys)), 'other')
    if own in ('matmul', 'attention (SDPA)') or node is None:
        return own
    return next((c for c, keys in BACKWARD_CATEGORIES if any(k in node for k in keys)), own)


def category_ms(events: Iterable, on_gpu: bool, steps: int) -> dict:
    """``{category: ms per step}`` of profiler ``events`` (``prof.events()``, whose parents say what ran an
    operator; ``key_averages()`` rows work too, by name alone) by ``_category``.

    On a GPU each operator's ``self_device_time_total`` already holds the kernels it launched, and
    the kernels also appear as events of their own (device type CUDA, named after the kernel): only
    operator events are counted, or every kernel would count twice ('other' would hold the kernels). On a CPU:
    ``self_cpu_time_total`` of every event."""
    from torch.autograd import DeviceType
    totals: Dict[str, float] = {}
    for ev in events:
        if on_gpu and ev.device_type != DeviceType.CPU:
            continue
        cat = _category(ev)
        us = ev.self_device_time_total if on_gpu else ev.self_cpu_time_total
        totals[cat] = totals.get(cat, 0.0) + us / 1000 / steps
    return totals


def profile_breakdown(
        models: Sequence[str],
        batch_size: int = 8,
        device: Union[str, torch.device] = 'cpu',
        log: Callable[..., None] = print,
        steps: int = 3,
        amp: Optional[str] = None,
        compile_: bool = False,
) -> list:
    """Self time of a training step per op category (``PROFILE_CATEGORIES``), per model, summed over
    ``steps`` profiled steps after two warm-up steps (several steps smooth out OS noise); ``amp``:
    ``'bf16'`` / ``'fp16'`` autocast or None; ``compile_``: the model ``torch.compile``'d (its fused kernels
    counted by what they fuse).

    Returns rows ``model, category, ms, share`` (``ms``: per step; share of the steps' total self time).
    """
    from torch.profiler import ProfilerActivity, profile
    device = torch.device(device)
    rows = []
    for name in models:
        step = ModelStep(name, 'train', batch_size, device, amp, compile_)
        step()
        step()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
        with profile(activities=acts) as prof:
            for _ in range(steps):
                step()
            synchronize(device)
        totals = category_ms(prof.events(), device.type == 'cuda', steps)
        total = sum(totals.values())
        for cat, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
            rows.append(dict(model=name, category=cat, ms=ms, share=ms / total))
            log(f'{name:32s} {cat:28s} {ms:9.1f} ms  {100 * ms / total:5.1f}%')
        del step
    return rows
