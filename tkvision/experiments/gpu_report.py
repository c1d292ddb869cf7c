"""One command that measures everything on a lent GPU (issues 28 and 37): ``make bench-gpu`` =
``python tools/gpu_report.py --out docs/bench/gpu``; ``--budget-minutes`` fits it to a lease.

It writes one markdown report (and its JSON) with, in order, each part saved as soon as it is measured:

1. the card, driver, torch and CUDA versions, the date, the card's dense bf16 peak from NVIDIA's data
   sheets (:data:`BF16_PEAK_TFLOPS`) and measured in the same run (:func:`measured_peak_tflops`);
2. train and inference img/s, peak memory (:func:`tkvision.experiments.benchmark.benchmark_models`: the
   allocator's peak of one step, counting only the model's own tensors) and achieved TFLOP/s (model
   FLOPs) of each TokenFormer of :data:`PAIRS` and its timm ViT, bf16 autocast, eager (with the
   :data:`VARIANTS`: fused Q/K/V, autograd's backward instead of the lean one, the paper's B/16) and
   ``torch.compile``d (the plain TokenFormer† and the ViT), as ratios to the ViT of the same run; then
   parts of their own, so a failure loses nothing else, each with its own ViT: B/16† training compiled
   with the closed-form backward beside the lean one (``compiled_closed_form``), and through the fused
   Triton kernels (``@fused_kernel=true``) eager beside the plain path (``eager_fused``) and compiled
   (``compiled_fused``); and one Pattention layer at B/16†'s sizes, plain against the fused kernels
   with each of the tile choices of :mod:`.gpu_fused` (``fused_tiles``);
3. whether each figure meets issue 37's :data:`TARGETS` (shares of the measured peak);
4. a ``torch.profiler`` table of one B/16† training step, grouped as in ``docs/performance.md``;
5. the lean backward against autograd's (:func:`lean_backward_check`): gradient error next to bf16's
   own, saved activations, peak memory, graph breaks under ``torch.compile``;
6. the trainer end to end (:func:`.gpu_end_to_end.end_to_end`): ``torchrun``, the ImageNet recipe of the B/16†
   (bf16, compile, EMA, gradient accumulation) on a folder of 224 px Fashion-MNIST JPEGs, one epoch,
   then ``--resume`` for three more; each epoch's ``data_wait`` says whether the loader kept up;
7. an MAE pretraining step around the TokenFormer† (img/s).

Parts run in :func:`_schedule`'s order (what the issue asks first); with ``--budget-minutes`` a part
whose estimate (:data:`ESTIMATE_S`, seconds on an H100) would overrun is recorded as skipped, and a part
that fails is recorded with its error while the rest go on. ``--device cpu --tiny --compile-modes
eager`` runs the same code on tiny models on a CPU in about a minute; ``tests/test_gpu_report.py`` does
so in CI, so the command cannot rot before a GPU is lent.

Dependencies: PyTorch, timm and (for ``--compile-modes compiled``) Triton; the end-to-end part also
needs albumentations and simplejpeg (the trainer's data path). Without albumentations that part is
reported as skipped with the wheels to carry: ``albumentations>=2.0.8`` and its requirements
(``albucore``, ``opencv-python-headless``, ``pydantic``, ``pydantic-core``, ``annotated-types``,
``typing-inspection``, ``stringzilla``, ``simsimd``), and ``simplejpeg``.
"""
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

from ..layers.pattention import Pattention
from ..models._helpers import input_shape
from ..models.mae import create_mae
from ..utils.files import atomic_write
from .benchmark import (_markdown, _Step, _sync, _time, benchmark_models, machine_info, parse_model_spec,
                        profile_breakdown, saved_activation_mib)
from .gpu_end_to_end import end_to_end
from .gpu_fused import fused_tiles

__all__ = ['BF16_PEAK_TFLOPS', 'PAIRS', 'TINY_PAIRS', 'TARGETS', 'card_info', 'measured_peak_tflops', 'throughput',
           'check_targets', 'lean_backward_check', 'mae_step', 'gpu_report']

#: Dense (no sparsity) bf16 tensor-core peak in TFLOP/s by a fragment of the card's name, first match
#: wins (NVIDIA data sheets: H100 SXM 989.4, H100 PCIe 756, H200 989.4, A100 312, L40S 362).
BF16_PEAK_TFLOPS = (('H100 PCIe', 756.0), ('H100', 989.4), ('H200', 989.4), ('A100', 312.0), ('L40S', 362.0))
#: (TokenFormer†, its timm ViT, batch size) of the report.
PAIRS = (('tokenformer_vit_b16_matched', 'vit_base_patch16_224', 256),
         ('tokenformer_vit_l16_matched', 'vit_large_patch16_224', 128))
_TINY = '@img_size=32@patch_size=8@embed_dim=32@depth=2@num_heads=2'
#: The CPU stand-in of :data:`PAIRS` (``--tiny``).
TINY_PAIRS = (('tokenformer_vit_ti16' + _TINY + '@num_tokens=16', 'vit_tiny_patch16_224' + _TINY, 4),)
#: Issue 37's targets, per pair, for the compiled bf16 training step of the plain TokenFormer†: img/s
#: and peak memory as ratios to the ViT, achieved TFLOP/s as a share of the peak measured in the run.
TARGETS = dict(train_ratio=1.0, mem_ratio=1.0, peak_share=0.40)
#: The TokenFormer options timed beside the plain one in eager mode (each compiled model costs a
#: minute or more of compilation, so only the plain one is compiled).
VARIANTS = ('', '@fused_qkv=true', '@lean_backward=false')
#: Other models timed in a pair's eager part: beside B/16†, the paper's B/16 (its own token counts).
_PAIR_EXTRAS = {'tokenformer_vit_b16_matched': ('tokenformer_vit_b16',)}
#: Seconds each part took, or was expected to take, on the H200s of 2026-11-27/28 (compilation included):
#: what ``--budget-minutes`` weighs before starting a part.
ESTIMATE_S = dict(peak=10, eager=45, compiled_train=120, compiled_fused=100, eager_fused=40,
                  compiled_closed_form=180, fused_tiles=60, compiled_infer=60, large_eager=45, large_compiled=170,
                  profile=20, lean=30, end_to_end=170, mae=30)


def card_info(device: torch.device) -> dict:
    """``dict(card, driver, torch, cuda, date, peak_tflops)`` (``peak_tflops``: the data sheet's, None
    when the card is not in :data:`BF16_PEAK_TFLOPS`, or on a CPU)."""
    info = dict(card=machine_info(device), driver='-', torch=torch.__version__, cuda=torch.version.cuda or '-',
                date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), peak_tflops=None)
    if device.type == 'cuda':
        info['card'] = torch.cuda.get_device_name(device)
        try:
            info['driver'] = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                            capture_output=True, text=True, check=True).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            info['driver'] = 'unknown (nvidia-smi failed)'
        info['peak_tflops'] = next((p for name, p in BF16_PEAK_TFLOPS if name in info['card']), None)
    return info


def measured_peak_tflops(device: torch.device, size: int = 8192, products: int = 5, repeats: int = 7) -> float:
    """The card's bf16 matrix rate now, in TFLOP/s: the median over ``repeats`` timings of ``products``
    products of two random ``size`` x ``size`` bf16 matrices (``2 size³`` FLOPs each), after three
    warm-ups. Random, not zero, data: zeros run faster on some cards. The ceiling that issue 37's
    "share of the measured bf16 peak" divides by."""
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(products):
            a @ b
        _sync(device)
        times.append((time.perf_counter() - t0) / products)
    return 2 * size ** 3 / statistics.median(times) / 1e12


def throughput(pair, device, compiled: bool, modes, steps, repeats, peak_tflops=None, variants=VARIANTS,
               extras=True, log=print) -> list:
    """Rows of :func:`tkvision.experiments.benchmark.benchmark_models` (bf16) of one pair ``(tokenformer,
    vit, batch_size)`` in ``modes``: the TokenFormer with each of ``variants`` (and, for B/16†, the
    paper's B/16, unless ``extras`` is False or ``compiled``), then the ViT; each row with ``pair,
    compiled, ratio`` (img/s over the ViT's in the same run and mode), ``mem_ratio`` and ``peak_share``
    (achieved TFLOP/s over ``peak_tflops``; None without one)."""
    tokenformer, vit, batch = pair
    log(f"--- {tokenformer} vs {vit}, batch {batch}, {'compiled' if compiled else 'eager'}, {'/'.join(modes)}")
    extra = () if compiled or not extras else _PAIR_EXTRAS.get(tokenformer, ())
    models = [tokenformer + v for v in variants] + list(extra) + [vit]
    got = benchmark_models(models, modes, batch, device, 'bf16', compiled, steps=steps, repeats=repeats,
                           memory=False, log=log)
    base = {r['mode']: r for r in got if r['model'] == vit}
    for r in got:
        r.update(pair=parse_model_spec(tokenformer)[0], compiled='compiled' if compiled else 'eager',
                 ratio=r['img_per_s'] / base[r['mode']]['img_per_s'],
                 mem_ratio=r['peak_mem_mib'] / base[r['mode']]['peak_mem_mib'],
                 peak_share=r['tflops_per_s'] / peak_tflops if peak_tflops else None)
    return got


def check_targets(rows, pairs) -> list:
    """Issue 37's :data:`TARGETS` for each pair's plain TokenFormer†, compiled bf16 training (eager
    when nothing was compiled): ``dict(pair, target, value, met)``; ``met`` None when not measurable."""
    out = []
    for tokenformer, _, _ in pairs:
        mine = [r for r in rows if r['model'] == tokenformer and r['mode'] == 'train']
        r = next((x for x in mine if x['compiled'] == 'compiled'), mine[0] if mine else None)
        if r is None:
            continue
        for target, value, ok in (
                (f"train img/s >= {TARGETS['train_ratio']}x ViT ({r['compiled']})", r['ratio'],
                 r['ratio'] >= TARGETS['train_ratio']),
                (f"peak memory <= {TARGETS['mem_ratio']}x ViT ({r['compiled']})", r['mem_ratio'],
                 r['mem_ratio'] <= TARGETS['mem_ratio'] if r['mem_ratio'] == r['mem_ratio'] else None),
                (f">= {TARGETS['peak_share']:.0%} of the measured bf16 peak ({r['compiled']})", r['peak_share'],
                 None if r['peak_share'] is None else r['peak_share'] >= TARGETS['peak_share'])):
            out.append(dict(pair=r['pair'], target=target, value=value, met=ok))
    return out


def _set_backward(model, lean: bool, closed_form: bool):
    for m in model.modules():
        if isinstance(m, Pattention):
            m.lean_backward, m.closed_form_backward = lean, closed_form


def _gradients(model, x, y, amp) -> tuple:
    """(float32 gradients of every parameter, allocator peak MiB of the step over what was allocated
    before it (NaN off CUDA)) of one cross-entropy forward and backward."""
    model.zero_grad(set_to_none=True)
    cuda = x.device.type == 'cuda'
    if cuda:
        torch.cuda.synchronize(x.device)
        before = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
    with torch.autocast(x.device.type, dtype=amp or torch.float32, enabled=amp is not None):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    peak = (torch.cuda.max_memory_allocated(x.device) - before) / 2 ** 20 if cuda else float('nan')
    return [p.grad.float().clone() for p in model.parameters()], peak


def lean_backward_check(spec: str, batch_size: int, device, compiled: bool, log=print) -> dict:
    """The lean backward (``lean_backward``, the CUDA default) against autograd's (``L2NormGELU``, the
    reference), on ``spec`` at ``batch_size``, bf16 autocast, the same weights and batch.

    Returns:
        ``dict(grad_error, bf16_error, saved_mib_lean, saved_mib_autograd, peak_mib_lean,
        peak_mib_autograd, graph_breaks)``: ``grad_error`` is the relative error
        ``‖g_lean − g_autograd‖ / ‖g_autograd‖`` of all parameters' gradients together, ``bf16_error``
        the same between autograd's bf16 gradients and its float32 ones (autocast off): bf16's own
        error, the tolerance the lean path must stay within. ``saved_mib_*``: activations kept for
        backward; ``peak_mib_*``: the step's allocator peak over what was allocated before it.
        ``graph_breaks``: of ``torch._dynamo.explain`` on the lean path's training forward (0: compile
        keeps it whole), None unless ``compiled``.
    """
    name = parse_model_spec(spec)[0]
    torch.manual_seed(0)
    model = _Step(spec, 'train', batch_size, device, 'bf16', False).model  # the benchmark's own model build
    channels, hw = input_shape(model)
    x = torch.randn(batch_size, channels, *hw, device=device)
    y = torch.randint(0, model.num_classes, (batch_size,), device=device)
    out, grads = {}, {}
    for path, lean, amp in (('autograd', False, torch.bfloat16), ('lean', True, torch.bfloat16),
                            ('float32', False, None)):
        _set_backward(model, lean, False)
        grads[path], peak = _gradients(model, x, y, amp)
        if amp is not None:
            out[f'peak_mib_{path}'] = peak
            out[f'saved_mib_{path}'] = saved_activation_mib(model, x, amp)

    def error(a, b):  # all parameters together: a parameter with a near-zero gradient does not dominate
        difference = sum((u - v).square().sum() for u, v in zip(a, b))
        return float((difference / sum(v.square().sum() for v in b)).sqrt())

    out.update(grad_error=error(grads['lean'], grads['autograd']),
               bf16_error=error(grads['autograd'], grads['float32']))
    out['graph_breaks'] = None
    if compiled:
        _set_backward(model, True, False)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            explained = torch._dynamo.explain(model)(x)
        out['graph_breaks'] = explained.graph_break_count
        log(f'lean backward under torch.compile: {explained.graph_count} graph(s), {explained.graph_break_count} '
            f'break(s) {[str(r.reason) for r in explained.break_reasons][:3]}')
    log(f"lean backward: grad error {out['grad_error']:.2e} (bf16's own {out['bf16_error']:.2e}), saved "
        f"{out['saved_mib_lean']:.0f} vs {out['saved_mib_autograd']:.0f} MiB")
    return dict(model=name, batch_size=batch_size, **out)


#: The MAE decoder of the report (MAE's 8-block, 512-wide one) and of its tiny CPU stand-in.
MAE_DECODER, TINY_MAE_DECODER = 'base', dict(embed_dim=32, depth=1, num_heads=2)


def mae_step(encoder_spec: str, batch_size: int, device, compiled: bool, decoder=MAE_DECODER, steps=3,
             repeats=3) -> dict:
    """img/s of one MAE pretraining step (mask 0.75, bf16, AdamW) around ``encoder_spec``
    (``name@key=value``) with ``decoder`` (a ``DECODER_PRESETS`` name or ``dict(embed_dim, depth,
    num_heads)``; default MAE's 8-block 512-wide one); ``dict(model, batch_size, compiled, img_per_s)``."""
    name, kwargs = parse_model_spec(encoder_spec)
    model = create_mae(name, decoder=decoder, **kwargs).to(device).train()
    channels, hw = input_shape(model.encoder)
    x = torch.randn(batch_size, channels, *hw, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fn = torch.compile(model) if compiled else model

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = fn(x)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)

    seconds = _time(step, steps, repeats)
    return dict(model=f'MAE({encoder_spec})', batch_size=batch_size, compiled=compiled, img_per_s=batch_size / seconds)


def _measured(info: dict) -> str:
    peak = info.get('measured_peak_tflops')
    return 'not measured in this call (no peak part)' if peak is None else \
        f'{peak:.0f} TFLOP/s (measured, random 8192² bf16 products)'


def _render(info: dict, parts: dict, command: str) -> str:
    """The report's markdown."""
    md = [f"# GPU report: {info['card']}", '', f"Card: {info['card']}  \nDriver: {info['driver']}  \n"
          f"torch {info['torch']} (CUDA {info['cuda']})  \nDate: {info['date']}  \nbf16 peak: "
          f"{info['peak_tflops'] or 'unknown'} TFLOP/s (data sheet), {_measured(info)}  \nCommand: `{command}`", '']
    if parts.get('throughput'):
        md += ['## Throughput (bf16; ratio and mem_ratio: over the ViT of the same run; peak_share: of the '
               'measured peak)', '', _markdown(parts['throughput'], [
                   'model', 'mode', 'compiled', 'batch_size', 'img_per_s', 'ratio', 'peak_mem_mib', 'mem_ratio',
                   'saved_mib', 'tflops_per_s', 'peak_share']), '']
    if parts.get('targets'):
        md += ['## Targets', '', _markdown(parts['targets'], ['pair', 'target', 'value', 'met']), '']
    if parts.get('profile'):
        md += ['## Where a B/16† training step goes (torch.profiler self time, bf16)', '',
               _markdown(parts['profile'], ['model', 'category', 'ms', 'share']), '']
    if parts.get('lean'):
        md += ['## The lean backward against autograd (bf16)', '', _markdown(parts['lean'], list(parts['lean'][0])), '']
    if 'end_to_end' in parts:
        e2e = parts['end_to_end']
        md += ['## The trainer end to end', '', f"`{e2e.get('command', '')}`", '',
               _markdown(e2e.get('legs', [e2e]), list((e2e.get('legs') or [e2e])[0])), '']
        if e2e.get('epochs'):
            md += [_markdown(e2e['epochs'], list(e2e['epochs'][-1])), '']
    if parts.get('fused_tiles'):
        md += ['## One Pattention layer, bf16 forward and backward: the plain path against the fused kernels', '',
               _markdown(parts['fused_tiles'],
                         ['layer', 'rows', 'path', 'tiles', 'train_ms', 'ratio', 'relative_error']), '']
    if parts.get('mae'):
        md += ['## MAE pretraining step', '',
               _markdown(parts['mae'], ['model', 'batch_size', 'compiled', 'img_per_s']), '']
    if parts.get('skipped'):
        md += ['## Not measured', '', _markdown(parts['skipped'], ['part', 'reason']), '']
    return '\n'.join(md) + '\n'



#: Parts that need ``--compile-modes compiled``.
_COMPILED_PARTS = ('compiled_train', 'compiled_fused', 'compiled_closed_form', 'compiled_infer', 'large_compiled')
#: Parts that run the fused Triton kernels: a GPU, or the CPU under ``TRITON_INTERPRET=1``.
_TRITON_PARTS = ('compiled_fused', 'eager_fused', 'fused_tiles')


def _parts(pairs, device, tiny: bool, compiled: bool, steps: int, repeats: int, info: dict, data_dir, log) -> list:
    """``[(part, run(parts))]`` in the order the report runs them: the issue's first question (B/16†
    against ViT-B, training, compiled) first, then what it asks next; each ``run`` adds to ``parts``."""
    big = pairs[0]

    def rows(pair, use_compile, modes, variants=('',), extras=True):
        return lambda parts: parts['throughput'].extend(throughput(
            pair, device, use_compile, modes, steps, repeats, info.get('measured_peak_tflops'), variants, extras,
            log))

    def peak(parts):
        info['measured_peak_tflops'] = measured_peak_tflops(device, 8192 if device.type == 'cuda' else 256)
        log(f"measured bf16 peak: {info['measured_peak_tflops']:.0f} TFLOP/s")

    def e2e(parts):
        with tempfile.TemporaryDirectory() as work:
            parts['end_to_end'] = end_to_end(device, work, tiny, compiled, data_dir, log)

    plan = [('peak', peak), ('eager', rows(big, False, ('train', 'infer'), VARIANTS)),
            ('compiled_train', rows(big, True, ('train',))),
            # each path against the plain (lean) one and the ViT of the same run; the fused kernels last,
            # since a fault in a kernel of our own can leave the CUDA context unusable for what follows
            ('compiled_closed_form', rows(big, True, ('train',), ('', '@lean_backward=false'))),
            ('eager_fused', rows(big, False, ('train',), ('', '@fused_kernel=true'), extras=False)),
            ('compiled_fused', rows(big, True, ('train',), ('@fused_kernel=true',))),
            ('fused_tiles', lambda parts: parts.update(fused_tiles=fused_tiles(device, tiny, steps, repeats,
                                                                               log=log)))]
    plan += [('large_eager', rows(pairs[1], False, ('train', 'infer')))] if len(pairs) > 1 else []
    plan += [('profile', lambda parts: parts.update(profile=profile_breakdown(
                 [big[0]], min(big[2], 64), device, log=log, amp='bf16'))),
             ('lean', lambda parts: parts.update(lean=[lean_backward_check(big[0], min(big[2], 64), device, compiled,
                                                                           log)])),
             ('end_to_end', e2e), ('compiled_infer', rows(big, True, ('infer',)))]
    plan += [('large_compiled', rows(pairs[1], True, ('train',)))] if len(pairs) > 1 else []
    decoder = TINY_MAE_DECODER if tiny else MAE_DECODER
    plan += [('mae', lambda parts: parts.update(mae=[mae_step(big[0], big[2], device, False, decoder, steps,
                                                              repeats)]))]
    return plan


def _release(device):
    """Free what a part left behind before the next: models caught in reference cycles, the compiled
    graphs ``torch.compile`` caches (they hold their models), the allocator's cached blocks."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def gpu_report(device='cuda', out='docs/bench/gpu', tiny=False, compile_modes=('eager', 'compiled'), steps=3,
               repeats=3, command='', budget_minutes=None, data_dir=None, parts_to_run=None, log=print) -> dict:
    """Measure the parts of the module docstring and write ``<out>_<date>.md`` / ``.json`` after each
    one (a later failure loses nothing measured). ``budget_minutes``: skip a part whose
    :data:`ESTIMATE_S` would end it past the budget; ``parts_to_run``: the names of :data:`ESTIMATE_S`
    to run (default all; a lease too short for all takes them in two calls); ``data_dir``:
    Fashion-MNIST's idx files for the end-to-end run (default: the Debian package's). A part that
    raises is logged with its traceback and listed under "Not measured" with its error; the others go
    on. Returns ``dict(info, parts, path)``."""
    device = torch.device(device)
    info = card_info(device)
    pairs = TINY_PAIRS if tiny else PAIRS
    path = f"{out}_{info['date'][:10]}"
    parts = dict(throughput=[], skipped=[])
    compiled = 'compiled' in compile_modes
    end = None if budget_minutes is None else time.monotonic() + 60 * budget_minutes
    for key, run in _parts(pairs, device, tiny, compiled, steps, repeats, info, data_dir, log):
        if parts_to_run is not None and key not in parts_to_run:
            continue
        if key in _COMPILED_PARTS and not compiled:
            parts['skipped'].append(dict(part=key, reason='not asked (--compile-modes has no compiled)'))
        elif key in _TRITON_PARTS and device.type != 'cuda' and os.environ.get('TRITON_INTERPRET') != '1':
            parts['skipped'].append(dict(part=key, reason='the fused kernels need CUDA (or TRITON_INTERPRET=1)'))
        elif end is not None and time.monotonic() + ESTIMATE_S[key] > end:
            parts['skipped'].append(dict(part=key, reason=f'--budget-minutes {budget_minutes}: its estimated '
                                                          f'{ESTIMATE_S[key]} s would overrun it'))
        else:
            t0 = time.monotonic()
            try:
                run(parts)
            except Exception as e:  # noqa: BLE001 - one failed part must not lose the others
                log(traceback.format_exc())
                parts['skipped'].append(dict(part=key, reason=f'failed: {type(e).__name__}: {e}'[:400]))
            _release(device)
            log(f'part {key}: {time.monotonic() - t0:.0f} s'
                + (f', {torch.cuda.memory_allocated(device) / 2 ** 30:.1f} GiB still allocated' if device.type == 'cuda'
                   else ''))
        parts['targets'] = check_targets(parts['throughput'], pairs)
        atomic_write(path + '.md', lambda f: f.write(_render(info, parts, command)), text=True)
        atomic_write(path + '.json', lambda f: json.dump(dict(info=info, parts=parts), f, indent=1), text=True)
    log(f'wrote {path}.md / .json')
    return dict(info=info, parts=parts, path=path)
