"""Model benchmarks: TokenFormer against timm's ViT (throughput, FLOPs, memory, where a step goes), and the
timing helpers the layer benchmarks (``layer_benchmark.py``) share; ``benchmark_parts.py`` runs them as
``tools/benchmark.py``'s parts, ``data_benchmark.py`` times data loading.

``python tools/benchmark.py --models tokenformer_vit_b16_matched vit_base_patch16_224 --mode infer train
--batch-size 64 [--amp bf16] [--compile] [--device cuda] [--out docs/bench]``

Method: every model is built and warmed up, then the models are timed interleaved (A B A B ...),
``--repeats`` rounds of ``--steps`` steps each; the figure is the median round. Each TokenFormer is
reported as a ratio to its timm counterpart from the same run (`COUNTERPARTS`). FLOPs per
image come from ``torch.utils.flop_counter.FlopCounterMode`` (matmul-class ops and attention; a
multiply-add is 2 FLOPs); achieved FLOP/s = FLOPs per image x img/s. Peak memory: on GPU the CUDA
allocator's peak of one step, counting the model's own tensors only (`_cuda_step_peak_mib`); on
CPU the peak RSS of a fresh child process running the same steps (RSS cannot be reset in-process).
"""
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..growth import elastic
from ..layers import BACKWARD_MODES, Pattention
from ..models import input_shape
from ..utils.errors import UsageError
from ..utils.memory import available_memory_bytes
from ..utils.precision import AMP_DTYPES

__all__ = ['COUNTERPARTS', 'ModelStep', 'forward_flops_per_image',
           'parse_model_spec', 'available_memory_mib', 'check_train_memory',
           'matmul_peak_tflops',
           'flop_counter', 'train_flops_per_image', 'saved_activation_mib', 'benchmark_models',
           'machine_info', 'code_commit', 'synchronize', 'time_rounds', 'time_call', 'markdown_table']

#: timm ViT each TokenFormer is compared with (same width and depth; ``_matched``: same parameter count).
COUNTERPARTS = {
    'tokenformer_vit_ti16': 'vit_tiny_patch16_224', 'tokenformer_vit_s16': 'vit_small_patch16_224',
    'tokenformer_vit_b16': 'vit_base_patch16_224', 'tokenformer_vit_b16_matched': 'vit_base_patch16_224',
    'tokenformer_vit_l16': 'vit_large_patch16_224', 'tokenformer_vit_l16_matched': 'vit_large_patch16_224',
}


def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` that also counts SDPA's CPU flash kernels (torch counts only the CUDA ones),
    so CPU and GPU FLOPs per image agree."""
    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward})


def train_flops_per_image(cfg: dict, prefix: Optional[elastic.Prefix] = None) -> float:
    """Forward + backward FLOPs of one training image of ``cfg``'s model, counted by `flop_counter`
    (a multiply-add is 2 FLOPs), at ``prefix`` of an elastic model
    ([`tkvision.growth.elastic`][tkvision.growth.elastic], under the config's ``elastic_nesting``; None: every
    token)."""
    return _flops_per_image(cfg, prefix, backward=True)


def forward_flops_per_image(cfg: dict) -> float:
    """Forward FLOPs of one image of ``cfg``'s whole model (what a distillation teacher costs a step)."""
    return _flops_per_image(cfg, None, backward=False)


def _flops_per_image(cfg: dict, prefix: elastic.Prefix, backward: bool) -> float:
    from ..engine.config import TrainConfig, model_for_config  # the engine's stack (albumentations, matplotlib)
    model = model_for_config(TrainConfig.from_dict(cfg))  # only here: the model benchmark runs on images that lack it
    size = cfg['model_kwargs'].get('img_size', cfg['img_size'] or 224)
    x = torch.randn(2, cfg['model_kwargs'].get('in_chans', 3), size, size)
    with elastic.prefix(model, prefix, nesting=cfg.get('elastic_nesting', 'all')), flop_counter() as counter:
        loss = F.cross_entropy(model(x), torch.zeros(2, dtype=torch.long))
        if backward:
            loss.backward()
    return counter.get_total_flops() / 2


def machine_info(device: torch.device) -> str:
    """One line naming the machine: CPU model and cores (or GPU name), torch version, threads."""
    if device.type == 'cuda':
        return f'{torch.cuda.get_device_name(device)}, torch {torch.__version__}'
    cpu = platform.processor() or 'cpu'
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        pass
    return f'{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads'


def code_commit() -> str:
    """The git commit of the tkvision checkout that is running (``git rev-parse --short HEAD``), with ``-dirty``
    when its tracked files differ from that commit; ``'unknown'`` for an installed wheel or without git. What the
    results files' ``commit`` column holds for a run, so that a comparison can say when two sides ran different
    code (``tools/render_docs.py``, the compare marker)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(root, '.git')):
        return 'unknown'
    try:
        head = subprocess.run(['git', '-C', root, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(['git', '-C', root, 'diff', '--quiet', 'HEAD', '--'], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 'unknown'
    if head.returncode != 0 or not head.stdout.strip():
        return 'unknown'
    return head.stdout.strip() + ('-dirty' if dirty.returncode == 1 else '')


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def matmul_peak_tflops(
        device: torch.device,
        dtype: torch.dtype,
        size: int,
        products: int = 3,
        repeats: int = 5,
) -> float:
    """The machine's matrix-multiply rate now, in TFLOP/s: the median over ``repeats`` timings of
    ``products`` products of two random ``size`` x ``size`` matrices of ``dtype`` (``2 size³`` FLOPs each),
    after two warm-ups, with the threads ``torch`` has. Random, not zero, data: zeros run faster on some
    hardware. The ceiling a model's achieved FLOP/s is divided by for its model FLOP utilisation (MFU):
    on a CPU float32, on a GPU bf16.

    Args:
        device: where to multiply.
        dtype: the matrices' dtype (``torch.float32`` on a CPU, ``torch.bfloat16`` on a GPU).
        size: the matrices' side, large enough that the product is compute-bound (2048 on a CPU, 8192 on a
            GPU).
        products: products per timing.
        repeats: timings; the median is reported.
    """
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(products):
            a @ b
        synchronize(device)
        times.append((time.perf_counter() - t0) / products)
    return 2 * size ** 3 / statistics.median(times) / 1e12


def parse_model_spec(spec: str) -> Tuple[str, dict]:
    """``'name@key=value@key2=value2'`` -> ``(name, {key: value, ...})`` (values parsed as YAML), so a
    benchmark can compare a model option, e.g. ``tokenformer_vit_b16_matched@qk_norm=true``.
    ``backward_mode`` is set on every Pattention of the model (``@backward_mode=lean``; ``autograd``: the
    reference; `tkvision.layers.BACKWARD_MODES`).

    Raises:
        ValueError: an option that is not ``key=value``.
    """
    import yaml
    name, *opts = spec.split('@')
    kwargs = {}
    for opt in opts:
        key, sep, value = opt.partition('=')
        if not sep:
            raise ValueError(f'model option {opt!r} of {spec!r} is not key=value')
        kwargs[key] = yaml.safe_load(value)
    return name, kwargs


class ModelStep:
    """One timed unit of work for a model: an inference forward or a full training step (AdamW), on
    random inputs of the model's own size.

    Args:
        name: a model spec (`parse_model_spec`).
        mode: ``'infer'`` or ``'train'``.
        batch_size: images per step.
        device: where it runs.
        amp: ``'bf16'``, ``'fp16'`` or None.
        compile_: ``torch.compile`` the model.

    Raises:
        ValueError: an unknown ``backward_mode``; timm's errors for an unknown model or argument.
        UsageError: one input batch larger than the memory the device can give.
    """

    def __init__(
            self,
            name: str,
            mode: str,
            batch_size: int,
            device: torch.device,
            amp: Optional[str],
            compile_: bool,
    ):
        self.name, self.mode, self.device = name, mode, device
        base, kwargs = parse_model_spec(name)
        backward_mode = kwargs.pop('backward_mode', None)
        if backward_mode is not None and backward_mode not in BACKWARD_MODES:
            raise ValueError(f'{name}: backward_mode must be one of {", ".join(BACKWARD_MODES)}')
        self.model = timm.create_model(base, **kwargs).to(device)
        for m in self.model.modules():
            if isinstance(m, Pattention) and backward_mode is not None:
                m.backward_mode = backward_mode
        self.params = sum(p.numel() for p in self.model.parameters())
        channels, hw = input_shape(self.model)  # the model's own size (pretrained_cfg keeps 224 for img_size=32)
        size = hw or getattr(self.model, 'pretrained_cfg')['input_size'][1:]  # every timm model has one
        need, have = 4. * batch_size * channels * size[0] * size[1], available_memory_bytes(device)
        if need > have:  # the input batch alone: refused before the allocator fails on it
            raise UsageError(f'--batch-size {batch_size}: one batch of {channels} x {size[0]} x {size[1]} images needs '
                             f'{need / 2 ** 30:,.1f} GiB, and {have / 2 ** 30:,.1f} GiB is available on {device}: '
                             'lower --batch-size')
        self.x = torch.randn(batch_size, channels, *size, device=device)
        self.y = torch.randint(0, 1000, (batch_size,), device=device)
        self.amp = AMP_DTYPES.get(amp)
        self.fn = torch.compile(self.model) if compile_ else self.model
        if mode == 'train':
            self.model.train()
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def __call__(self):
        """One step: a forward (``infer``) or forward, backward and optimizer update (``train``)."""
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            if self.mode == 'infer':
                with torch.inference_mode():
                    return self.fn(self.x)
            loss = F.cross_entropy(self.fn(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def flops_per_image(self) -> float:
        """FLOPs of one image of a step (`flop_counter`; training: forward and backward)."""
        with flop_counter() as counter:
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                if self.mode == 'infer':
                    with torch.no_grad():
                        self.model(self.x)
                else:
                    F.cross_entropy(self.model(self.x), self.y).backward()
        self.model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / len(self.x)


def saved_activation_mib(model: torch.nn.Module, x: torch.Tensor, amp: Optional[torch.dtype] = None) -> float:
    """MiB that autograd keeps for backward in one forward of ``model`` on ``x``, parameters excluded
    (unique storages, counted through ``torch.autograd.graph.saved_tensors_hooks``): the activation
    memory of a training step, independent of the allocator."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        # detached: a hook that returns an op's own output closes a cycle (output -> grad_fn -> the
        # packed output) through C++ that Python's gc cannot see, and every graph would leak
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
            model(x)
    return sum(seen.values()) / 2 ** 20


def _cuda_step_peak_mib(runner, device) -> float:
    """Allocator peak of one step of ``runner`` in MiB, counting only its own tensors: the peak over
    what was allocated before the step (activations, gradients, temporaries, the output) plus its
    parameters and optimizer state. The other models of the run stay allocated beside it; counting
    them too would pull every ratio towards 1."""
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner()
    synchronize(device)
    own = list(runner.model.parameters())
    if runner.mode == 'train':
        own += [t for state in runner.opt.state.values() for t in state.values() if torch.is_tensor(t)]
    own_bytes = sum(t.numel() * t.element_size() for t in own)
    return (torch.cuda.max_memory_allocated(device) - before + own_bytes) / 2 ** 20


def _peak_rss_child(name, mode, batch_size, steps) -> float:
    """Peak RSS (MiB) of a fresh process that builds ``name`` and runs ``steps`` steps of ``mode`` on CPU."""
    code = (f'import resource, torch, tkvision.experiments.benchmark as b; '
            f'torch.set_num_threads({torch.get_num_threads()}); '
            f's = b.ModelStep({name!r}, {mode!r}, {batch_size}, torch.device("cpu"), None, False)\n'
            f'for _ in range({steps}): s()\n'
            'print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def available_memory_mib() -> float:
    """What a CPU can give without swapping, in MiB (`tkvision.utils.memory.available_memory_bytes`)."""
    return available_memory_bytes('cpu') / 2 ** 20


def check_train_memory(runners: Sequence, batch_size: int, log: Callable[..., None] = print) -> float:
    """Refuse, before any timed step, a CPU training benchmark that would not fit in memory: every
    model's weights, gradients and AdamW moments (4 copies of its parameters) plus twice the largest
    model's activations kept for backward (measured at batch 1, times ``batch_size``; twice: the
    backward holds the gradients of those activations beside them). For B/16† and ViT-B at batch 32
    this gives about 15 GiB. Above half of what is
    available a warning is printed. Returns the estimate in MiB.

    Raises:
        UsageError: the estimate exceeds the available memory (the figures and what to lower are named);
            the kernel would otherwise kill the process without a word.
    """
    states = sum(4 * r.params * 4 for r in runners) / 2 ** 20
    activations = 2 * max(saved_activation_mib(r.model.train(), r.x[:1], r.amp) for r in runners) * batch_size
    need, have = states + activations, available_memory_mib()
    words = (f'the CPU training benchmark at batch {batch_size} needs about {need / 1024:.1f} GiB ({states / 1024:.1f} '
             f'GiB weights + gradients + AdamW state, {activations / 1024:.1f} GiB activations), and '
             f'{have / 1024:.1f} GiB is available')
    if need > have:
        raise UsageError(words + ': lower --batch-size, or benchmark fewer --models at a time')
    if need > have / 2:
        log(f'warning: {words}')
    return need


def time_rounds(
        runners: Sequence,
        device: torch.device,
        warmup: int,
        steps: int,
        repeats: int,
) -> dict:
    """``{name: [seconds per step of each round]}``: ``warmup`` steps each, then ``repeats`` rounds in
    which every runner runs ``steps`` steps, interleaved (A B A B ...)."""
    for r in runners:
        for _ in range(warmup):
            r()
    synchronize(device)
    times: Dict[str, List[float]] = {r.name: [] for r in runners}
    for _ in range(repeats):
        for r in runners:
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                r()
            synchronize(device)
            times[r.name].append((time.perf_counter() - t0) / steps)
    return times


def benchmark_models(
        models: Sequence[str],
        modes: Sequence[str] = ('infer', 'train'),
        batch_size: int = 64,
        device: Union[str, torch.device] = 'cpu',
        amp: Optional[str] = None,
        compile_: bool = False,
        warmup: int = 2,
        steps: int = 2,
        repeats: int = 5,
        memory: bool = True,
        reference: Optional[str] = None,
        log: Callable[..., None] = print,
) -> list:
    """Interleaved throughput of ``models`` per mode; returns one dict per (model, mode).

    Each dict: ``model, mode, batch_size, img_per_s, step_ms, params, gflops_per_img, tflops_per_s,
    peak_mem_mib`` and, for models with a timm counterpart in the run, ``ratio`` (img/s over the
    counterpart's) and ``mem_ratio``. With ``reference`` (one of ``models``, options included) every
    row's ``ratio`` is instead the median over rounds of its img/s over the reference's in the same
    round (paired: a machine whose speed drifts between rounds does not bias it), with each round's
    ratio in ``ratio_runs``.

    Raises:
        ValueError: ``reference`` is not one of ``models``.
    """
    if reference is not None and reference not in models:
        raise ValueError(f'--reference {reference} is not one of --models ({", ".join(models)})')
    device = torch.device(device)
    rows = []
    for mode in modes:
        runners = [ModelStep(m, mode, batch_size, device, amp, compile_) for m in models]
        if mode == 'train' and device.type == 'cpu':
            check_train_memory(runners, batch_size, log)
        flops = {r.name: r.flops_per_image() for r in runners}
        times = time_rounds(runners, device, warmup, steps, repeats)
        for r in runners:
            step = statistics.median(times[r.name])
            if device.type == 'cuda':
                mem = _cuda_step_peak_mib(r, device)
            else:
                mem = _peak_rss_child(r.name, mode, batch_size, 2) if memory else float('nan')
            saved = saved_activation_mib(r.model.train(), r.x, r.amp) if mode == 'train' else float('nan')
            row = dict(model=r.name, mode=mode, batch_size=batch_size, img_per_s=batch_size / step, saved_mib=saved,
                       step_ms=1000 * step, params=r.params, gflops_per_img=flops[r.name] / 1e9,
                       tflops_per_s=flops[r.name] * batch_size / step / 1e12, peak_mem_mib=mem,
                       spread=(max(times[r.name]) - min(times[r.name])) / step)
            if reference is not None:
                paired = [b / a for a, b in zip(times[r.name], times[reference])]  # img/s over the reference's
                row.update(ratio=statistics.median(paired), ratio_runs=' '.join(f'{v:.3f}' for v in paired))
            rows.append(row)
            log(f"{mode:5s} {r.name:32s} {row['img_per_s']:8.1f} img/s  {row['step_ms']:8.1f} ms/step  "
                f"{row['tflops_per_s'] * 1000:7.1f} GFLOP/s  {mem:8.0f} MiB")
        del runners
    by_key = {(r['model'], r['mode']): r for r in rows}
    for measured in rows if reference is None else ():
        base = by_key.get((COUNTERPARTS.get(parse_model_spec(measured['model'])[0]), measured['mode']))
        if base:
            measured['ratio'] = measured['img_per_s'] / base['img_per_s']
            measured['mem_ratio'] = measured['peak_mem_mib'] / base['peak_mem_mib']
            measured['saved_ratio'] = measured['saved_mib'] / base['saved_mib']
    return rows


def time_call(fn: Callable[[], object], steps: int, repeats: int) -> float:
    """Median seconds of one call of ``fn`` over ``repeats`` rounds of ``steps`` calls, after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - t0) / steps)
    return statistics.median(out)


def markdown_table(rows: list, cols: list) -> str:
    """A Markdown table of ``rows`` (dicts) with columns ``cols`` (floats to 3 significant digits)."""
    def fmt(v):
        return f'{v:.3g}' if isinstance(v, float) else str(v)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    lines += ['| ' + ' | '.join(fmt(r.get(c, '')) for c in cols) + ' |' for r in rows]
    return '\n'.join(lines)
