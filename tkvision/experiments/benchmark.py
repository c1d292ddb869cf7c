"""Benchmarks: TokenFormer against timm's ViT, Pattention against the layers it replaces, its score
normalisation Θ against a GELU, and data loading.

``python tools/benchmark.py --models tokenformer_vit_b16_matched vit_base_patch16_224 --mode infer train
--batch-size 64 [--amp bf16] [--compile] [--device cuda] [--out docs/bench]``

Method: every model is built and warmed up, then the models are timed interleaved (A B A B ...),
``--repeats`` rounds of ``--steps`` steps each; the figure is the median round. Each TokenFormer is
reported as a ratio to its timm counterpart from the same run (:data:`COUNTERPARTS`). FLOPs per
image come from ``torch.utils.flop_counter.FlopCounterMode`` (matmul-class ops and attention; a
multiply-add is 2 FLOPs); achieved FLOP/s = FLOPs per image x img/s. Peak memory: the CUDA allocator's peak on GPU;
on CPU the peak RSS of a fresh child process running the same steps (RSS cannot be reset in-process).
"""
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..models._helpers import input_shape
from ..layers import Pattention
from ..utils.errors import UsageError
from ..utils.files import atomic_write

__all__ = ['COUNTERPARTS', 'parse_model_spec', 'available_memory_mib', 'check_train_memory', 'flop_counter', 'saved_activation_mib', 'benchmark_models', 'profile_breakdown',
           'benchmark_pattention', 'benchmark_score_norm', 'score_norm_variants', 'machine_info', 'run_benchmark']

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


def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def parse_model_spec(spec: str):
    """``'name@key=value@key2=value2'`` -> ``(name, {key: value, ...})`` (values parsed as YAML), so a
    benchmark can compare a model option, e.g. ``tokenformer_vit_b16_matched@fused_qkv=true``.
    ``lean_backward`` and ``closed_form_backward`` are set on every Pattention of the model
    (``@lean_backward=false@closed_form_backward=false``: autograd's backward, the reference; the
    defaults are the lean one on CUDA, the closed-form one on CPU)."""
    import yaml
    name, *opts = spec.split('@')
    kwargs = {}
    for opt in opts:
        key, sep, value = opt.partition('=')
        if not sep:
            raise ValueError(f'model option {opt!r} of {spec!r} is not key=value')
        kwargs[key] = yaml.safe_load(value)
    return name, kwargs


class _Step:
    """One timed unit of work for a model: an inference forward or a full training step."""

    def __init__(self, name, mode, batch_size, device, amp, compile_):
        self.name, self.mode, self.device = name, mode, device
        base, kwargs = parse_model_spec(name)
        paths = dict(lean_backward=kwargs.pop('lean_backward', 'auto'),
                     closed_form_backward=kwargs.pop('closed_form_backward', True))
        self.model = timm.create_model(base, **kwargs).to(device)
        for m in self.model.modules():
            if isinstance(m, Pattention):
                for key, value in paths.items():
                    setattr(m, key, value)
        self.params = sum(p.numel() for p in self.model.parameters())
        channels, hw = input_shape(self.model)  # the model's own size (pretrained_cfg keeps 224 for img_size=32)
        self.x = torch.randn(batch_size, channels, *(hw or self.model.pretrained_cfg['input_size'][1:]), device=device)
        self.y = torch.randint(0, 1000, (batch_size,), device=device)
        self.amp = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(amp)
        self.fn = torch.compile(self.model) if compile_ else self.model
        if mode == 'train':
            self.model.train()
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def __call__(self):
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            if self.mode == 'infer':
                with torch.inference_mode():
                    return self.fn(self.x)
            loss = F.cross_entropy(self.fn(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def flops_per_image(self) -> float:
        with flop_counter() as counter:
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                if self.mode == 'infer':
                    with torch.no_grad():
                        self.model(self.x)
                else:
                    F.cross_entropy(self.model(self.x), self.y).backward()
        self.model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / len(self.x)


def saved_activation_mib(model: torch.nn.Module, x: torch.Tensor, amp=None) -> float:
    """MiB that autograd keeps for backward in one forward of ``model`` on ``x``, parameters excluded
    (unique storages, counted through ``torch.autograd.graph.saved_tensors_hooks``): the activation
    memory of a training step, independent of the allocator."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
            model(x)
    return sum(seen.values()) / 2 ** 20


def _peak_rss_child(name, mode, batch_size, steps) -> float:
    """Peak RSS (MiB) of a fresh process that builds ``name`` and runs ``steps`` steps of ``mode`` on CPU."""
    code = (f'import resource, torch, tkvision.experiments.benchmark as b; torch.set_num_threads({torch.get_num_threads()}); '
            f's = b._Step({name!r}, {mode!r}, {batch_size}, torch.device("cpu"), None, False)\n'
            f'for _ in range({steps}): s()\n'
            'print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def available_memory_mib() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in MiB (what the kernel can give without swapping); inf
    where the file does not exist."""
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('MemAvailable')) / 1024
    except (OSError, StopIteration):
        return float('inf')


def check_train_memory(runners, batch_size: int, log=print) -> float:
    """Refuse, before any timed step, a CPU training benchmark that would not fit in memory: every
    model's weights, gradients and AdamW moments (4 copies of its parameters) plus twice the largest
    model's activations kept for backward (measured at batch 1, times ``batch_size``; twice: the
    backward holds the gradients of those activations beside them). For B/16† and ViT-B at batch 32
    this gives about 15 GiB, where 13.5 GB peak RSS was measured (issue 27). Above half of what is
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


def _time_rounds(runners, device, warmup: int, steps: int, repeats: int) -> dict:
    """``{name: [seconds per step of each round]}``: ``warmup`` steps each, then ``repeats`` rounds in
    which every runner runs ``steps`` steps, interleaved (A B A B ...)."""
    for r in runners:
        for _ in range(warmup):
            r()
    _sync(device)
    times = {r.name: [] for r in runners}
    for _ in range(repeats):
        for r in runners:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                r()
            _sync(device)
            times[r.name].append((time.perf_counter() - t0) / steps)
    return times


def benchmark_models(models, modes=('infer', 'train'), batch_size=64, device='cpu', amp=None, compile_=False,
                     warmup=2, steps=2, repeats=5, memory=True, reference=None, log=print) -> list:
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
        runners = [_Step(m, mode, batch_size, device, amp, compile_) for m in models]
        if mode == 'train' and device.type == 'cpu':
            check_train_memory(runners, batch_size, log)
        flops = {r.name: r.flops_per_image() for r in runners}
        times = _time_rounds(runners, device, warmup, steps, repeats)
        for r in runners:
            step = statistics.median(times[r.name])
            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(device)
                r()
                _sync(device)
                mem = torch.cuda.max_memory_allocated(device) / 2 ** 20
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
    for r in rows if reference is None else ():
        base = by_key.get((COUNTERPARTS.get(parse_model_spec(r['model'])[0]), r['mode']))
        if base:
            r['ratio'] = r['img_per_s'] / base['img_per_s']
            r['mem_ratio'] = r['peak_mem_mib'] / base['peak_mem_mib']
            r['saved_ratio'] = r['saved_mib'] / base['saved_mib']
    return rows


#: Profiler op-name categories for :func:`profile_breakdown` (first match wins; the rest is 'other').
PROFILE_CATEGORIES = (
    ('matmul', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::linear', 'aten::matmul')),
    ('attention (SDPA)', ('scaled_dot_product',)),
    ('optimizer (AdamW)', ('aten::_foreach', 'aten::lerp', 'aten::addcdiv', 'aten::addcmul', 'aten::sqrt',
                           'aten::mul_', 'aten::add_', 'aten::div_')),
    ('score normalisation / GELU', ('aten::gelu', 'aten::linalg_vector_norm', 'aten::norm', 'aten::clamp',
                                    'aten::masked_fill', 'aten::div', 'aten::mul', 'aten::erf', 'aten::exp',
                                    'aten::where', 'aten::sum', 'aten::reciprocal')),
    ('layer norm', ('layer_norm',)),
)


def profile_breakdown(models, batch_size=8, device='cpu', log=print, steps=3, amp=None) -> list:
    """Self time of a training step per op category (``PROFILE_CATEGORIES``), per model, summed over
    ``steps`` profiled steps after one warm-up step (several steps smooth out OS noise); ``amp``:
    ``'bf16'`` / ``'fp16'`` autocast or None.

    Returns rows ``model, category, ms, share`` (``ms``: per step; share of the steps' total self time).
    """
    from torch.profiler import ProfilerActivity, profile
    device = torch.device(device)
    rows = []
    for name in models:
        step = _Step(name, 'train', batch_size, device, amp, False)
        step()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
        with profile(activities=acts) as prof:
            for _ in range(steps):
                step()
            _sync(device)
        totals = {}
        for ev in prof.key_averages():
            cat = next((c for c, keys in PROFILE_CATEGORIES if any(k in ev.key for k in keys)), 'other')
            us = ev.self_device_time_total if device.type == 'cuda' else ev.self_cpu_time_total
            totals[cat] = totals.get(cat, 0.0) + us / 1000 / steps
        total = sum(totals.values())
        for cat, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
            rows.append(dict(model=name, category=cat, ms=ms, share=ms / total))
            log(f'{name:32s} {cat:28s} {ms:9.1f} ms  {100 * ms / total:5.1f}%')
        del step
    return rows


def _time(fn, steps, repeats):
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        out.append((time.perf_counter() - t0) / steps)
    return statistics.median(out)


def benchmark_pattention(tokens=64 * 197, dim=768, num_tokens=576, mlp_ratio=4, steps=3, repeats=5, log=print):
    """One Pattention (d -> d, ``num_tokens``) vs the ``Linear(d, d)`` it replaces in attention and the
    ``Linear -> GELU -> Linear`` MLP (d -> 4d -> d) that an FFN Pattention with 4x tokens replaces,
    at ViT-B shapes (``tokens`` = batch 64 x 197), fp32, forward and forward+backward.

    Returns rows ``layer, pass, ms, gflops, gflop_per_s``.
    """
    x = torch.randn(tokens, dim, requires_grad=True)
    layers = {
        f'Linear({dim},{dim})': torch.nn.Linear(dim, dim),
        f'Pattention({dim},{dim},n={num_tokens})': Pattention(dim, dim, num_tokens),
        f'MLP({dim},{mlp_ratio * dim},{dim})': torch.nn.Sequential(torch.nn.Linear(dim, mlp_ratio * dim), torch.nn.GELU(),
                                                             torch.nn.Linear(mlp_ratio * dim, dim)),
        f'Pattention({dim},{dim},n={mlp_ratio * num_tokens})': Pattention(dim, dim, mlp_ratio * num_tokens),
    }
    rows = []
    for name, layer in layers.items():
        for kind in ('forward', 'forward+backward'):
            def fn():
                if kind == 'forward':
                    with torch.no_grad():
                        layer(x)
                else:
                    layer(x).sum().backward()
            with flop_counter() as fc:
                fn()
            t = _time(fn, steps, repeats)
            rows.append(dict(layer=name, **{'pass': kind}, ms=1000 * t, gflops=fc.get_total_flops() / 1e9,
                             gflop_per_s=fc.get_total_flops() / t / 1e9))
            log(f'{name:34s} {kind:17s} {1000 * t:8.2f} ms  {rows[-1]["gflop_per_s"]:7.1f} GFLOP/s')
    return rows


class _ScoreNormStep:
    """Forward + backward of one elementwise-over-scores function of ``a [tokens, n]`` (a timed runner)."""

    def __init__(self, name, fn, a, grad):
        self.name, self.fn, self.a, self.grad = name, fn, a, grad

    def __call__(self):
        self.a.grad = None
        self.fn(self.a).backward(self.grad)


def score_norm_variants(num_tokens: int, device='cpu', compile_: bool = True) -> dict:
    """``{name: fn}``, each ``fn(a [..., num_tokens]) -> same shape``: the ViT's GELU over its hidden units
    and Θ of Eq. 5 (``l2_norm_gelu``, the default τ = √n) differentiated three ways: the closed form (the
    CPU default, ``pattention_autograd.py``), plain autograd (the reference, :class:`L2NormGELU`) and
    ``torch.compile`` of the plain one (inductor fuses its passes; ``compile_=False`` leaves it out); τ is a
    0-d tensor on ``device``, as a Pattention's buffer."""
    from ..layers.pattention import L2NormGELU
    from ..layers.pattention_autograd import l2_norm_gelu
    tau, eps, plain = torch.tensor(num_tokens ** 0.5, device=device), 1e-6, L2NormGELU()
    variants = {'GELU (the ViT MLP\'s activation)': F.gelu,
                'Θ closed form (CPU default)': lambda a: l2_norm_gelu(a, tau, eps),
                'Θ plain autograd (reference)': lambda a: plain(a, tau, eps)}
    if compile_:
        variants['Θ plain autograd, torch.compile'] = torch.compile(lambda a: plain(a, tau, eps), dynamic=False)
    return variants


def benchmark_score_norm(tokens=128 * 17, num_tokens=72, steps=50, repeats=7, device='cpu', compile_=True,
                         log=print) -> list:
    """Forward + backward over one Pattention's scores ``[tokens, num_tokens]`` (default: the quick recipe's
    batch 128 x 17 tokens and the equal-parameter 72 parameter tokens), fp32 on ``device``, for each of
    :func:`score_norm_variants`, interleaved over ``repeats`` rounds of ``steps`` calls (compilation is
    done in the warm-up). What a Θ costs beyond the GELU a ViT applies to as many elements is the part of
    the TokenFormer step no GEMM explains (``docs/performance.md``).

    Returns rows ``variant, us`` (median µs per forward + backward), ``vs_gelu`` (median over rounds of
    the time over GELU's in the same round) and ``ratio_runs`` (each round's).
    """
    device = torch.device(device)
    a = torch.randn(tokens, num_tokens, device=device, requires_grad=True)
    grad = torch.randn(tokens, num_tokens, device=device)
    variants = score_norm_variants(num_tokens, device, compile_)
    runners = [_ScoreNormStep(name, fn, a, grad) for name, fn in variants.items()]
    times = _time_rounds(runners, device, warmup=3, steps=steps, repeats=repeats)
    gelu = times[runners[0].name]
    rows = []
    for r in runners:
        paired = [t / g for t, g in zip(times[r.name], gelu)]
        rows.append(dict(variant=r.name, tokens=tokens, num_tokens=num_tokens,
                         us=1e6 * statistics.median(times[r.name]), vs_gelu=statistics.median(paired), ratio_runs=' '.join(f'{v:.3f}' for v in paired)))
        log(f"{r.name:36s} {rows[-1]['us']:9.1f} us  {rows[-1]['vs_gelu']:.3f}x GELU's time")
    return rows


def _markdown(rows, cols):
    def fmt(v):
        return f'{v:.3g}' if isinstance(v, float) else str(v)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    lines += ['| ' + ' | '.join(fmt(r.get(c, '')) for c in cols) + ' |' for r in rows]
    return '\n'.join(lines)


def _save_results(out: str, md: list, results: dict, header: dict):
    """``<out>.md``, ``<out>.json`` and (with models) ``<out>.csv``, atomically: written after every
    part, so a later failure loses nothing measured."""
    atomic_write(out + '.md', lambda f: f.write('\n'.join(md)), text=True)
    atomic_write(out + '.json', lambda f: json.dump(dict(**header, **results), f, indent=1), text=True)
    if 'models' in results:
        def write(f):
            w = csv.DictWriter(f, fieldnames=sorted({k for r in results['models'] for k in r}))
            w.writeheader()
            w.writerows(results['models'])
        atomic_write(out + '.csv', write, text=True)


def _models_part(args) -> tuple:
    rows = benchmark_models(args.models, args.mode, args.batch_size, args.device, args.amp, args.compile,
                            steps=args.steps, repeats=args.repeats, memory=not args.no_memory, reference=args.reference)
    for r in rows:
        if args.reference is not None:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {args.reference}: {r['ratio']:.3f}x img/s (paired rounds "
                  f"{r['ratio_runs']})")
        elif 'ratio' in r:
            print(f"HEADLINE {r['mode']:5s} {r['model']} / {COUNTERPARTS[parse_model_spec(r['model'])[0]]}: "
                  f"{r['ratio']:.3f}x img/s, {r['mem_ratio']:.2f}x peak memory, "
                  f"{r['saved_ratio']:.2f}x activations saved for backward")
    columns = ['ratio_runs'] if args.reference is not None else []
    return rows, ['### Models', _markdown(rows, ['model', 'mode', 'batch_size', 'img_per_s', 'ratio', *columns, 'step_ms',
                                                  'params', 'gflops_per_img', 'tflops_per_s', 'peak_mem_mib',
                                                  'mem_ratio', 'saved_mib', 'saved_ratio', 'spread']), '']


def _pattention_part(args) -> tuple:
    rows = benchmark_pattention()
    return rows, ['### Pattention vs the layers it replaces (ViT-B shapes, fp32)',
                  _markdown(rows, ['layer', 'pass', 'ms', 'gflops', 'gflop_per_s']), '']


def _profile_part(args) -> tuple:
    rows = profile_breakdown(args.models, args.profile_batch_size, args.device)
    return rows, [f'### Where a training step goes (torch.profiler self time, batch {args.profile_batch_size})',
                  _markdown(rows, ['model', 'category', 'ms', 'share']), '']


def _data_part(args) -> tuple:
    from .data_benchmark import benchmark_data  # albumentations: only this part needs it (GPU images lack it)
    tables = benchmark_data(args.data_root, args.data_images, tuple(args.workers))
    return tables, ['### JPEG decoding, one thread', _markdown(tables['decode'], ['decoder', 'img_per_s']), '',
                    '### Training augmentation at 224 px, one thread',
                    _markdown(tables['augment'], ['pipeline', 'img_per_s']), '',
                    '### DataLoader: decode + augmentation + uint8 batches',
                    _markdown(tables['loader'], ['source', 'workers', 'img_per_s', 'img_per_s_per_worker']), '']


def _score_norm_part(args) -> tuple:
    tokens, num_tokens = args.score_shape
    rows = benchmark_score_norm(tokens, num_tokens, repeats=args.repeats, device=args.device)
    return rows, [f'### Θ against GELU over [{tokens}, {num_tokens}] scores, forward + backward',
                  _markdown(rows, ['variant', 'us', 'vs_gelu', 'ratio_runs']), '']


#: The parts of a benchmark run, in the order they run.
PARTS = {'models': _models_part, 'pattention': _pattention_part, 'score_norm': _score_norm_part,
         'profile': _profile_part, 'data': _data_part}


def run_benchmark(args, command: str) -> dict:
    """Run the parts ``args.parts`` (:data:`PARTS`) with the options of ``tools/benchmark.py`` (its
    parsed arguments ``args``), writing ``<args.out>.md / .csv / .json`` with the machine, the date
    and ``command`` after each part. Returns ``{part: rows}``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device(args.device))
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    print(f'{info}\n{stamp}\n{command}')
    md = [f'Machine: {info}  \nDate: {stamp}  \nCommand: `{command}`\n']
    results = {}
    for name, part in PARTS.items():
        if name in args.parts:
            results[name], lines = part(args)
            md += lines
            _save_results(args.out, md, results, dict(machine=info, date=stamp, command=command))
    print(f'wrote {args.out}.md / .csv / .json')
    return results
