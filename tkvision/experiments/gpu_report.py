"""One command that measures everything on a lent GPU (issue 28): ``make bench-gpu`` =
``python tools/gpu_report.py --out docs/bench/gpu`` (under 10 minutes on one H100).

It writes one markdown report (and its JSON) with, in order, each part saved as soon as it is measured:

1. the card, driver, torch and CUDA versions, the date, and the card's dense bf16 peak
   (:data:`BF16_PEAK_TFLOPS`, NVIDIA's data sheets);
2. train and inference img/s, peak memory and achieved TFLOP/s (model FLOPs:
   :func:`tkvision.experiments.benchmark.flop_counter`) of each TokenFormer† of :data:`PAIRS` and its
   timm ViT, bf16 autocast, eager and ``torch.compile``d, with fused Q/K/V on and off and the lean
   backward on (the CUDA default) and off, as ratios to the ViT of the same run;
3. whether each figure meets the issue's :data:`TARGETS`;
4. a ``torch.profiler`` table of one B/16† training step, grouped as in ``docs/performance.md``
   (:data:`tkvision.experiments.benchmark.PROFILE_CATEGORIES`);
5. an MAE pretraining step around the TokenFormer† (img/s);
6. an end-to-end run of the trainer (``torchrun`` with one process, bf16, compile) on a folder of
   JPEGs made from Fashion-MNIST by :func:`tkvision.data.fashion_mnist.write_image_folder`.

``--device cpu --tiny --compile-modes eager`` runs the same code on tiny models on a CPU in about a
minute; ``tests/test_gpu_report.py`` does so in CI, so the command cannot rot before a GPU is lent.

Dependencies: PyTorch, timm and (for ``--compile-modes compiled``) Triton; the end-to-end part also
needs albumentations (the trainer's augmentations). Without it that part is reported as skipped with
the wheels to carry: ``albumentations>=2.0.8`` and its requirements (``albucore``,
``opencv-python-headless``, ``pydantic``, ``pydantic-core``, ``annotated-types``, ``typing-inspection``,
``stringzilla``, ``simsimd``).
"""
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from ..data.fashion_mnist import write_image_folder
from ..models._helpers import input_shape
from ..models.mae import create_mae
from ..utils.files import atomic_write
from .benchmark import _markdown, _sync, _time, benchmark_models, machine_info, parse_model_spec, profile_breakdown

__all__ = ['BF16_PEAK_TFLOPS', 'PAIRS', 'TINY_PAIRS', 'TARGETS', 'card_info', 'throughput', 'check_targets',
           'mae_step', 'end_to_end', 'gpu_report']

#: Dense (no sparsity) bf16 tensor-core peak in TFLOP/s by a fragment of the card's name, first match
#: wins (NVIDIA data sheets: H100 SXM 989.4, H100 PCIe 756, H200 989.4, A100 312, L40S 362).
BF16_PEAK_TFLOPS = (('H100 PCIe', 756.0), ('H100', 989.4), ('H200', 989.4), ('A100', 312.0), ('L40S', 362.0))
#: (TokenFormer†, its timm ViT, batch size) of the report.
PAIRS = (('tokenformer_vit_b16_matched', 'vit_base_patch16_224', 256),
         ('tokenformer_vit_l16_matched', 'vit_large_patch16_224', 128))
_TINY = '@img_size=32@patch_size=8@embed_dim=32@depth=2@num_heads=2'
#: The CPU stand-in of :data:`PAIRS` (``--tiny``).
TINY_PAIRS = (('tokenformer_vit_ti16' + _TINY + '@num_tokens=16', 'vit_tiny_patch16_224' + _TINY, 4),)
#: The issue's targets, per pair, for the compiled bf16 training step of the plain TokenFormer†.
TARGETS = dict(train_ratio=0.95, mem_ratio=1.0, peak_share=0.30)
#: The TokenFormer variants timed beside the plain one.
VARIANTS = ('', '@fused_qkv=true', '@lean_backward=false')


def card_info(device: torch.device) -> dict:
    """``dict(card, driver, torch, cuda, date, peak_tflops)`` (``peak_tflops`` None when the card is
    not in :data:`BF16_PEAK_TFLOPS`, or on a CPU)."""
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


def throughput(pairs, device, compile_modes, steps, repeats, peak_tflops=None, log=print) -> list:
    """Rows of :func:`tkvision.experiments.benchmark.benchmark_models` (bf16) for every pair, mode and
    compile mode, each with ``pair, compiled, ratio`` (img/s over the pair's ViT in the same run and
    mode), ``mem_ratio`` and ``peak_share`` (achieved TFLOP/s over the card's peak; None off a GPU)."""
    rows = []
    for tokenformer, vit, batch in pairs:
        for compiled in compile_modes:
            log(f'--- {tokenformer} vs {vit}, batch {batch}, {compiled}')
            models = [tokenformer + v for v in VARIANTS] + [vit]
            got = benchmark_models(models, ('train', 'infer'), batch, device, 'bf16', compiled == 'compiled',
                                   steps=steps, repeats=repeats, memory=False, log=log)
            base = {r['mode']: r for r in got if r['model'] == vit}
            for r in got:
                r.update(pair=parse_model_spec(tokenformer)[0], compiled=compiled,
                         ratio=r['img_per_s'] / base[r['mode']]['img_per_s'],
                         mem_ratio=r['peak_mem_mib'] / base[r['mode']]['peak_mem_mib'],
                         peak_share=r['tflops_per_s'] / peak_tflops if peak_tflops else None)
            rows += got
    return rows


def check_targets(rows, pairs) -> list:
    """The issue's :data:`TARGETS` for each pair's plain TokenFormer†, compiled bf16 training (eager
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
                (f">= {TARGETS['peak_share']:.0%} of the card's bf16 peak ({r['compiled']})", r['peak_share'],
                 None if r['peak_share'] is None else r['peak_share'] >= TARGETS['peak_share'])):
            out.append(dict(pair=r['pair'], target=target, value=value, met=ok))
    return out


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


def _train_command(folder: str, out: str, device, tiny: bool, compiled: bool) -> list:
    """The ``torchrun`` command line of the end-to-end run."""
    model = ['--model', 'tokenformer_vit_ti16', '--model_kwargs', '{img_size: 32, patch_size: 8, embed_dim: 32, '
             'depth: 2, num_heads: 2, num_tokens: 16, num_classes: 10}', '--batch_size', '16', '--epochs', '1'] if tiny else \
        ['--model', 'tokenformer_vit_b16_matched', '--model_kwargs', '{num_classes: 10}', '--batch_size', '256',
         '--epochs', '3', '--num_workers', '8']
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1',
            '-m', 'tkvision.cli.train', '--dataset', 'folder', '--data-dir', folder, '--output', out,
            '--device', device.type, '--amp', 'bf16', '--compile', str(compiled).lower(), '--warmup_epochs', '0.5',
            '--progress', 'false', *model]


def end_to_end(device, work: str, tiny: bool, compiled: bool, log=print) -> dict:
    """The trainer end to end (``torchrun``, one process, bf16) on a folder of Fashion-MNIST JPEGs
    written into ``work`` (224 px, 500 training / 100 validation images per class; tiny: 32 px, 8 / 2).

    Returns:
        ``dict(command, wall_s, img_per_s, val_top1, epochs)``, or ``dict(skipped=reason)`` without
        albumentations (the trainer's augmentations).

    Raises:
        subprocess.CalledProcessError: the run failed (its output was printed).
    """
    if importlib.util.find_spec('albumentations') is None:
        return dict(skipped='albumentations is not installed: carry albumentations>=2.0.8 and its requirements '
                            '(see tkvision/experiments/gpu_report.py)')
    folder = os.path.join(work, 'fashion_mnist_jpeg')
    size, train, val = (32, 8, 2) if tiny else (224, 500, 100)
    write_image_folder(folder, size, train, val)
    cmd = _train_command(folder, os.path.join(work, 'run'), device, tiny, compiled)
    log(' '.join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    with open(os.path.join(work, 'run', 'metrics.csv')) as f:
        rows = list(csv.DictReader(f))
    return dict(command=' '.join(cmd[2:]), wall_s=wall, img_per_s=float(rows[-1]['img_per_s']),
                val_top1=float(rows[-1]['top1']), epochs=len(rows))


def _render(info: dict, parts: dict, command: str) -> str:
    """The report's markdown."""
    md = [f"# GPU report: {info['card']}", '', f"Card: {info['card']}  \nDriver: {info['driver']}  \n"
          f"torch {info['torch']} (CUDA {info['cuda']})  \nDate: {info['date']}  \nbf16 peak: "
          f"{info['peak_tflops'] or 'unknown'} TFLOP/s  \nCommand: `{command}`", '']
    if 'throughput' in parts:
        md += ['## Throughput (bf16; ratio and mem_ratio: over the ViT of the same run)', '',
               _markdown(parts['throughput'], ['model', 'mode', 'compiled', 'batch_size', 'img_per_s', 'ratio',
                                               'peak_mem_mib', 'mem_ratio', 'tflops_per_s', 'peak_share']), '']
    if 'targets' in parts:
        md += ['## Targets', '', _markdown(parts['targets'], ['pair', 'target', 'value', 'met']), '']
    if 'profile' in parts:
        md += ['## Where a B/16† training step goes (torch.profiler self time, bf16)', '',
               _markdown(parts['profile'], ['model', 'category', 'ms', 'share']), '']
    if 'mae' in parts:
        md += ['## MAE pretraining step', '', _markdown(parts['mae'], ['model', 'batch_size', 'compiled', 'img_per_s']), '']
    if 'end_to_end' in parts:
        md += ['## The trainer end to end', '', _markdown([parts['end_to_end']], list(parts['end_to_end'])), '']
    return '\n'.join(md) + '\n'


def gpu_report(device='cuda', out='docs/bench/gpu', tiny=False, compile_modes=('eager', 'compiled'), steps=3,
               repeats=3, command='', log=print) -> dict:
    """Measure the parts of the module docstring and write ``<out>_<date>.md`` / ``.json`` after each
    one (a later failure loses nothing measured). Returns ``dict(info, parts, path)``."""
    device = torch.device(device)
    info = card_info(device)
    pairs = TINY_PAIRS if tiny else PAIRS
    path = f"{out}_{info['date'][:10]}"
    parts = {}

    def save():
        atomic_write(path + '.md', lambda f: f.write(_render(info, parts, command)), text=True)
        atomic_write(path + '.json', lambda f: json.dump(dict(info=info, parts=parts), f, indent=1), text=True)

    parts['throughput'] = throughput(pairs, device, compile_modes, steps, repeats, info['peak_tflops'], log)
    parts['targets'] = check_targets(parts['throughput'], pairs)
    save()
    parts['profile'] = profile_breakdown([pairs[0][0]], min(pairs[0][2], 64), device, log=log, amp='bf16')
    save()
    compiled = 'compiled' in compile_modes
    decoder = TINY_MAE_DECODER if tiny else MAE_DECODER
    parts['mae'] = [mae_step(pairs[0][0], pairs[0][2], device, compiled, decoder, steps, repeats)]
    save()
    with tempfile.TemporaryDirectory() as work:
        parts['end_to_end'] = end_to_end(device, work, tiny, compiled, log)
    save()
    log(f'wrote {path}.md / .json')
    return dict(info=info, parts=parts, path=path)
