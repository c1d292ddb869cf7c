"""One command that measures TokenFormer against timm's ViT on a lent GPU: ``make bench-gpu`` =
``python -m studies.performance.gpu_report --out docs/bench/gpu``; ``--budget-minutes`` fits it to a lease.

It writes one markdown report (and its JSON) with, in order, each part saved as soon as it is measured:

1. the card, driver, torch and CUDA versions, the date, the card's dense bf16 peak from NVIDIA's data
   sheets (`BF16_PEAK_TFLOPS`) and measured in the same run (`measured_peak_tflops`);
2. train and inference img/s, peak memory
   ([`tkvision.experiments.benchmark.benchmark_models`][tkvision.experiments.benchmark.benchmark_models]: the
   allocator's peak of one step, counting only the model's own tensors) and achieved TFLOP/s (model FLOPs) of each
   TokenFormer of `PAIRS` and its timm ViT, bf16 autocast, eager (with the ``VARIANTS``: the explicit LayerNorm, Θ
   compiled and the lean backward beside the defaults, the paper's B/16) and ``torch.compile``d, as ratios to the ViT
   of the same run; B/16† compiled with the lean backward beside the default (``compiled_lean``);
3. whether each figure meets the `TARGETS` (shares of the measured peak);
4. a ``torch.profiler`` table of one B/16† training step, grouped as in ``docs/performance.md``;
5. the lean backward against autograd's (`lean_backward_check`): gradient error next to bf16's
   own, saved activations, peak memory, graph breaks under ``torch.compile``;
6. the trainer end to end (`studies.performance.gpu_end_to_end.end_to_end`): ``torchrun``, the
   ImageNet recipe of the B/16† (bf16, compile, EMA, gradient accumulation) on a folder of 224 px
   Fashion-MNIST JPEGs, one epoch, then ``--resume`` for three more; each epoch's ``data_wait`` says
   whether the loader kept up;
7. an MAE pretraining step around the TokenFormer† (img/s).

**Each part runs in a process of its own** (``python -m studies.performance.gpu_report --run-part``): what
a part allocates, caches or leaks (compiled graphs, the allocator's blocks, a CUDA context a fault left
unusable) ends with it, so one part's memory never fails the next, and a part that fails or is killed
is recorded with its error while the others keep their rows. Parts run in `_plan`'s order; with
``--budget-minutes`` a part whose estimate (`ESTIMATE_S`, seconds on an H200) would overrun is
recorded as skipped. ``--device cpu --tiny --compile-modes eager`` runs the same code on tiny models on a
CPU in about a minute; ``tests/test_gpu_report.py`` does so in CI, so the command cannot rot before a GPU
is lent.

Dependencies: PyTorch, timm and (for ``--compile-modes compiled``) Triton; the end-to-end part also
needs albumentations and simplejpeg (the trainer's data path). Without albumentations that part is
reported as skipped with the wheels to carry: ``albumentations>=2.0.8`` and its requirements
(``albucore``, ``opencv-python-headless``, ``pydantic``, ``pydantic-core``, ``annotated-types``,
``typing-inspection``, ``stringzilla``, ``simsimd``), and ``simplejpeg``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

from studies.performance.gpu_end_to_end import end_to_end
from tkvision.cli import run_cli
from tkvision.experiments.benchmark import (ModelStep, benchmark_models, machine_info, markdown_table,
                                            matmul_peak_tflops, parse_model_spec, saved_activation_mib, synchronize,
                                            time_call)
from tkvision.experiments.profile import profile_breakdown
from tkvision.layers import set_backward_mode
from tkvision.models import input_shape
from tkvision.models.mae import create_mae
from tkvision.utils.files import atomic_write

__all__ = ['BF16_PEAK_TFLOPS', 'PAIRS', 'TINY_PAIRS', 'TARGETS', 'VARIANTS', 'ESTIMATE_S', 'card_info',
           'measured_peak_tflops', 'throughput', 'check_targets', 'lean_backward_check', 'mae_step', 'run_part',
           'gpu_report', 'main']

#: Dense (no sparsity) bf16 tensor-core peak in TFLOP/s by a fragment of the card's name, first match
#: wins (NVIDIA data sheets: H100 SXM 989.4, H100 PCIe 756, H200 989.4, A100 312, L40S 362).
BF16_PEAK_TFLOPS = (('H100 PCIe', 756.0), ('H100', 989.4), ('H200', 989.4), ('A100', 312.0), ('L40S', 362.0))
#: (TokenFormer†, its timm ViT, batch size) of the report.
PAIRS = (('tokenformer_vit_b16_matched', 'vit_base_patch16_224', 256),
         ('tokenformer_vit_l16_matched', 'vit_large_patch16_224', 128))
_TINY = '@img_size=32@patch_size=8@embed_dim=32@depth=2@num_heads=2'
#: The CPU stand-in of `PAIRS` (``--tiny``).
TINY_PAIRS = (('tokenformer_vit_ti16' + _TINY + '@num_tokens=16', 'vit_tiny_patch16_224' + _TINY, 4),)
#: The targets, per pair, for the compiled bf16 training step of the plain TokenFormer†: img/s
#: and peak memory as ratios to the ViT, achieved TFLOP/s as a share of the peak measured in the run.
TARGETS = dict(train_ratio=1.0, mem_ratio=1.0, peak_share=0.40)
#: The TokenFormer options timed beside the default one in eager mode (each compiled model costs a
#: minute or more of compilation, so only the default one is compiled in the pairs' parts).
VARIANTS = ('', '@block_norm_fold=false', '@backward_mode=lean')
#: Other models timed in a pair's eager part: beside B/16†, the paper's B/16 (its own token counts).
_PAIR_EXTRAS = {'tokenformer_vit_b16_matched': ('tokenformer_vit_b16',)}
#: Seconds each part took, or was expected to take, on the H200s of 2026-11-27/28 (compilation included):
#: what ``--budget-minutes`` weighs before starting a part.
ESTIMATE_S = dict(peak=10, eager=45, compiled_train=120, compiled_lean=180, compiled_infer=60, large_eager=45,
                  large_compiled=170, profile=20, lean=30, end_to_end=170, mae=30)


def card_info(device: torch.device) -> dict:
    """``dict(card, driver, torch, cuda, date, peak_tflops)`` (``peak_tflops``: the data sheet's, None
    when the card is not in `BF16_PEAK_TFLOPS`, or on a CPU)."""
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
    """The card's bf16 matrix rate now, in TFLOP/s (``tkvision.experiments.benchmark.matmul_peak_tflops``
    in bf16): the ceiling the target "share of the measured bf16 peak" divides by."""
    return matmul_peak_tflops(device, torch.bfloat16, size, products, repeats)


def throughput(pair, device, compiled: bool, modes, steps, repeats, peak_tflops=None, variants=VARIANTS,
               extras=True, log=print) -> list:
    """Rows of [`tkvision.experiments.benchmark.benchmark_models`][tkvision.experiments.benchmark.benchmark_models]
    (bf16) of one pair ``(tokenformer, vit, batch_size)`` in ``modes``: the TokenFormer with each of ``variants``
    (and, for B/16†, the paper's B/16, unless ``extras`` is False or ``compiled``), then the ViT; each row with
    ``pair, compiled, ratio`` (img/s over the ViT's in the same run and mode), ``mem_ratio`` and ``peak_share``
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
    """`TARGETS` for each pair's plain TokenFormer†, compiled bf16 training (eager
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
    """The lean backward (``backward_mode='lean'``) against autograd's (``L2NormGELU``, the reference), on
    ``spec`` at ``batch_size``, bf16 autocast, the same weights and batch.

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
    model = ModelStep(spec, 'train', batch_size, device, 'bf16', False).model  # the benchmark's own model build
    channels, hw = input_shape(model)
    x = torch.randn(batch_size, channels, *hw, device=device)
    y = torch.randint(0, model.num_classes, (batch_size,), device=device)
    out, grads = {}, {}
    for path, mode, amp in (('autograd', 'autograd', torch.bfloat16), ('lean', 'lean', torch.bfloat16),
                            ('float32', 'autograd', None)):
        set_backward_mode(model, mode)
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
        set_backward_mode(model, 'lean')
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
        synchronize(device)

    seconds = time_call(step, steps, repeats)
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
               'measured peak)', '', markdown_table(parts['throughput'], [
                   'model', 'mode', 'compiled', 'batch_size', 'img_per_s', 'ratio', 'peak_mem_mib', 'mem_ratio',
                   'saved_mib', 'tflops_per_s', 'peak_share']), '']
    if parts.get('targets'):
        md += ['## Targets', '', markdown_table(parts['targets'], ['pair', 'target', 'value', 'met']), '']
    if parts.get('profile'):
        md += ['## Where a B/16† training step goes (torch.profiler self time, bf16)', '',
               markdown_table(parts['profile'], ['model', 'category', 'ms', 'share']), '']
    if parts.get('lean'):
        md += ['## The lean backward against autograd (bf16)', '', markdown_table(parts['lean'],
                                                                                  list(parts['lean'][0])), '']
    if 'end_to_end' in parts:
        e2e = parts['end_to_end']
        md += ['## The trainer end to end', '', f"`{e2e.get('command', '')}`", '',
               markdown_table(e2e.get('legs', [e2e]), list((e2e.get('legs') or [e2e])[0])), '']
        if e2e.get('epochs'):
            md += [markdown_table(e2e['epochs'], list(e2e['epochs'][-1])), '']
    if parts.get('mae'):
        md += ['## MAE pretraining step', '',
               markdown_table(parts['mae'], ['model', 'batch_size', 'compiled', 'img_per_s']), '']
    if parts.get('skipped'):
        md += ['## Not measured', '', markdown_table(parts['skipped'], ['part', 'reason']), '']
    return '\n'.join(md) + '\n'



#: Parts that need ``--compile-modes compiled``.
_COMPILED_PARTS = ('compiled_train', 'compiled_lean', 'compiled_infer', 'large_compiled')


def _plan(pairs, tiny: bool) -> list:
    """``[(part, fn(device, compiled, steps, repeats, info, data_dir, log) -> dict of report entries)]`` in
    the order the report runs them: B/16† against ViT-B first, then what follows from it."""
    big = pairs[0]

    def rows(pair, use_compile, modes, variants=('',), extras=True):
        def run(device, compiled, steps, repeats, info, data_dir, log):
            return dict(throughput=throughput(pair, device, use_compile, modes, steps, repeats,
                                              info.get('measured_peak_tflops'), variants, extras, log))
        return run

    def peak(device, compiled, steps, repeats, info, data_dir, log):
        tflops = measured_peak_tflops(device, 8192 if device.type == 'cuda' else 256)
        log(f'measured bf16 peak: {tflops:.0f} TFLOP/s')
        return dict(info=dict(measured_peak_tflops=tflops))

    def profile(device, compiled, steps, repeats, info, data_dir, log):
        return dict(profile=profile_breakdown([big[0]], min(big[2], 64), device, log=log, amp='bf16'))

    def lean(device, compiled, steps, repeats, info, data_dir, log):
        return dict(lean=[lean_backward_check(big[0], min(big[2], 64), device, compiled, log)])

    def e2e(device, compiled, steps, repeats, info, data_dir, log):
        with tempfile.TemporaryDirectory() as work:
            return dict(end_to_end=end_to_end(device, work, tiny, compiled, data_dir, log))

    def mae(device, compiled, steps, repeats, info, data_dir, log):
        decoder = TINY_MAE_DECODER if tiny else MAE_DECODER
        return dict(mae=[mae_step(big[0], big[2], device, False, decoder, steps, repeats)])

    plan = [('peak', peak), ('eager', rows(big, False, ('train', 'infer'), VARIANTS)),
            ('compiled_train', rows(big, True, ('train',))),
            ('compiled_lean', rows(big, True, ('train',), ('', '@backward_mode=lean')))]
    plan += [('large_eager', rows(pairs[1], False, ('train', 'infer')))] if len(pairs) > 1 else []
    plan += [('profile', profile), ('lean', lean), ('end_to_end', e2e), ('compiled_infer', rows(big, True, ('infer',)))]
    plan += [('large_compiled', rows(pairs[1], True, ('train',)))] if len(pairs) > 1 else []
    return plan + [('mae', mae)]


def run_part(part: str, device, tiny: bool, compiled: bool, steps: int, repeats: int, info: dict, data_dir,
             log=print) -> dict:
    """Measure one part of the report in this process: the report entries it adds (``throughput`` rows,
    ``profile``, ``lean``, ``end_to_end``, ``mae``, or ``info`` updates).

    Raises:
        KeyError: an unknown part.
    """
    plan = dict(_plan(TINY_PAIRS if tiny else PAIRS, tiny))
    return plan[part](torch.device(device), compiled, steps, repeats, info, data_dir, log)


def _child_command(part: str, args: dict, info_path: str, out_path: str) -> list:
    """The command line that measures ``part`` in a process of its own (`main`'s ``--run-part``)."""
    return [sys.executable, '-m', 'studies.performance.gpu_report', '--run-part', part, '--device', args['device'],
            '--steps', str(args['steps']), '--repeats', str(args['repeats']), '--info', info_path,
            '--part-out', out_path, *(['--tiny'] if args['tiny'] else []),
            *(['--compile-modes', 'eager', 'compiled'] if args['compiled'] else ['--compile-modes', 'eager']),
            *(['--data-dir', args['data_dir']] if args['data_dir'] else [])]


def _run_in_child(part: str, args: dict, info: dict, log=print) -> dict:
    """Run ``part`` in a fresh process (its memory ends with it) and return its entries.

    Raises:
        RuntimeError: the process failed or was killed, with the last lines it printed.
    """
    with tempfile.TemporaryDirectory() as work:
        info_path, out_path = os.path.join(work, 'info.json'), os.path.join(work, 'part.json')
        with open(info_path, 'w') as f:
            json.dump(info, f)
        proc = subprocess.run(_child_command(part, args, info_path, out_path), capture_output=True, text=True)
        log(proc.stdout.rstrip())
        if proc.returncode != 0 or not os.path.isfile(out_path):
            tail = ' | '.join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f'the part\'s process exited with status {proc.returncode}: {tail}')
        with open(out_path) as f:
            return json.load(f)


def _merge(parts: dict, info: dict, entries: dict):
    """Add one part's entries to the report: ``throughput`` rows appended, ``info`` updated, the rest set."""
    for key, value in entries.items():
        if key == 'throughput':
            parts['throughput'].extend(value)
        elif key == 'info':
            info.update(value)
        else:
            parts[key] = value


def gpu_report(device='cuda', out='docs/bench/gpu', tiny=False, compile_modes=('eager', 'compiled'), steps=3,
               repeats=3, command='', budget_minutes=None, data_dir=None, parts_to_run=None, log=print,
               runner=_run_in_child) -> dict:
    """Measure the parts of the module docstring, each in a process of its own (``runner``), and write
    ``<out>_<date>.md`` / ``.json`` after each one (a later failure loses nothing measured).

    Args:
        budget_minutes: skip a part whose `ESTIMATE_S` would end it past the budget.
        parts_to_run: the names of `ESTIMATE_S` to run (default all; a lease too short for all takes
            them in two calls).
        data_dir: Fashion-MNIST's idx files for the end-to-end run (default: the Debian package's).
        runner: ``runner(part, args, info, log) -> entries``; a part whose runner raises is logged and listed
            under "Not measured" with its error, and the others go on.

    Returns:
        ``dict(info, parts, path)``.
    """
    info = card_info(torch.device(device))
    pairs = TINY_PAIRS if tiny else PAIRS
    path = f"{out}_{info['date'][:10]}"
    parts = dict(throughput=[], skipped=[])
    compiled = 'compiled' in compile_modes
    args = dict(device=device, tiny=tiny, compiled=compiled, steps=steps, repeats=repeats, data_dir=data_dir)
    end = None if budget_minutes is None else time.monotonic() + 60 * budget_minutes
    for key, _ in _plan(pairs, tiny):
        if parts_to_run is not None and key not in parts_to_run:
            continue
        if key in _COMPILED_PARTS and not compiled:
            parts['skipped'].append(dict(part=key, reason='not asked (--compile-modes has no compiled)'))
        elif end is not None and time.monotonic() + ESTIMATE_S[key] > end:
            parts['skipped'].append(dict(part=key, reason=f'--budget-minutes {budget_minutes}: its estimated '
                                                          f'{ESTIMATE_S[key]} s would overrun it'))
        else:
            t0 = time.monotonic()
            try:
                _merge(parts, info, runner(key, args, info, log))
            except Exception as e:  # noqa: BLE001 - one failed part must not lose the others
                log(traceback.format_exc())
                parts['skipped'].append(dict(part=key, reason=f'failed: {type(e).__name__}: {e}'[:400]))
            log(f'part {key}: {time.monotonic() - t0:.0f} s')
        parts['targets'] = check_targets(parts['throughput'], pairs)
        atomic_write(path + '.md', lambda f: f.write(_render(info, parts, command)), text=True)
        atomic_write(path + '.json', lambda f: json.dump(dict(info=info, parts=parts), f, indent=1), text=True)
    log(f'wrote {path}.md / .json')
    return dict(info=info, parts=parts, path=path)


def main(argv=None) -> int:
    """``python -m studies.performance.gpu_report`` (``make bench-gpu``); see ``--help``. Writes
    ``<out>_<date>.md`` and ``.json``; with ``--run-part`` (the report's own child processes) measures one
    part into ``--part-out``."""
    ap = argparse.ArgumentParser(description='Measure TokenFormer against timm ViT on a GPU: one markdown report.')
    ap.add_argument('--device', default='cuda', choices=['cuda', 'cpu'],
                    help="'cuda' (the report), or 'cpu' with --tiny (its CI check)")
    ap.add_argument('--out', default='docs/bench/gpu', help='prefix of the report; the date is appended')
    ap.add_argument('--tiny', action='store_true', help='tiny models and images (the CPU check of the command)')
    ap.add_argument('--compile-modes', nargs='+', default=['eager', 'compiled'], choices=['eager', 'compiled'])
    ap.add_argument('--steps', type=int, default=3, help='steps per timed round')
    ap.add_argument('--repeats', type=int, default=3, help='interleaved rounds; the median is reported')
    ap.add_argument('--budget-minutes', type=float, default=None,
                    help="skip a part whose estimated seconds would overrun this (a lent GPU's lease)")
    ap.add_argument('--data-dir', default=None,
                    help="Fashion-MNIST's idx files for the end-to-end run (default: the Debian package's)")
    ap.add_argument('--parts', nargs='+', default=None, choices=sorted(ESTIMATE_S),
                    help='run only these parts (default: all, in the order of the module docstring)')
    ap.add_argument('--run-part', choices=sorted(ESTIMATE_S), help=argparse.SUPPRESS)
    ap.add_argument('--info', help=argparse.SUPPRESS)
    ap.add_argument('--part-out', help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        ap.error('no CUDA device here: run on a GPU machine, or pass --device cpu --tiny to check the command')
    if args.run_part:
        with open(args.info) as f:
            info = json.load(f)
        entries = run_part(args.run_part, args.device, args.tiny, 'compiled' in args.compile_modes, args.steps,
                           args.repeats, info, args.data_dir)
        atomic_write(args.part_out, lambda f: json.dump(entries, f), text=True)
        return 0
    command = 'python -m studies.performance.gpu_report ' + ' '.join(argv if argv is not None else sys.argv[1:])
    gpu_report(args.device, args.out, args.tiny, tuple(args.compile_modes), args.steps, args.repeats, command,
               args.budget_minutes, args.data_dir, args.parts)
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2; a pre-empted run says how to resume
