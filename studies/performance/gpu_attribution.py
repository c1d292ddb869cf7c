"""Where the B/16† training step loses to ViT-B on a GPU, in one call: ``make gpu-attribution`` (on a lent H100 or
H200, about 10 minutes) writes ``docs/bench/gpu_attribution_<card>_<date>.json`` and ``.md``:

1. **attribution**: the PyTorch profiler's kernels of one compiled bf16 training step of each model (batch 256 by
   default), each summed into matrix products, attention, Θ and GELU (score normalisation and the activation), and
   the rest (layer norms, residual adds, the optimizer, copies); Θ's forward is a forward pass's share of it (profiled
   on its own, with the autograd graph built), its backward what the whole step adds to that; the difference of each
   between the models is printed, as the share of the step it explains;
2. **model timings**: compiled training and compiled inference (and eager training) img/s and peak memory of each
   model, rounds interleaved, with Inductor's own options on the training step: ``mode="max-autotune"`` (Triton GEMM
   templates, into whose prologue and epilogue Inductor fuses, ``prologue_fusion`` / ``epilogue_fusion``, on by
   default in this torch) and ``aggressive_fusion`` with ``benchmark_fusion``;
3. **layer timings**: one Pattention of B/16†'s FFN shape (768 -> 2,304 tokens -> 768 over 256 x 197 tokens) in each
   ``backward_mode`` (``fused``: the Triton op of ``tkvision/layers/pattention_triton.py``) against timm's ``Mlp``
   (768 -> 3,072 -> 768, GELU), forward and backward, bf16, eager and compiled.

Each part writes the files as it ends, so a lease cut short keeps what was measured. ``--device cpu --tiny`` runs
every part on tiny shapes (``tests/test_benchmark.py`` does, so the script is known to run before a GPU is lent).
"""
import argparse
import datetime
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import timm
import torch
import torch.nn.functional as F

import tkvision  # noqa: F401  (registers the models)
from tkvision.cli import run_cli
from tkvision.experiments.benchmark import code_commit, machine_info, markdown_table, synchronize
from tkvision.layers import Pattention
from tkvision.utils.files import atomic_write

MODELS = {'tokenformer': 'tokenformer_vit_b16_matched', 'vit': 'vit_base_patch16_224'}
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
#: Kernel-name fragments of each category, first match wins (profiler names of cuBLAS, CUTLASS, Triton and
#: Inductor kernels; on a CPU, the operators').
CATEGORIES = (
    ('attention', ('flash', 'fmha', 'attention', 'scaled_dot', 'cudnn')),
    ('rest', ('layer_norm', 'native_layer_norm', 'adam', 'foreach', 'optimizer')),
    ('matmul', ('gemm', 'cutlass', 'xmma', 'cublas', 'aten::mm', 'aten::addmm', 'aten::bmm', 'tem_fused', 'mm_',
                'aten::linear', 'aten::matmul')),
    ('theta_gelu', ('vector_norm', 'linalg', 'gelu', 'erf', 'pattention', 'norm', 'rsqrt')),
)
#: Inductor settings of the training step: ``(name, torch.compile mode, inductor config)``.
INDUCTOR_VARIANTS = (
    ('default', None, {}),
    ('max-autotune', 'max-autotune', {}),
    ('aggressive_fusion', None, {'aggressive_fusion': True, 'benchmark_fusion': True}),
)


def category(name: str) -> str:
    """The category of a kernel (or, on a CPU, an operator) by its name (`CATEGORIES`; else ``rest``)."""
    lowered = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in lowered for k in keys)), 'rest')


class Step:
    """One model's compiled (or eager) bf16 step on random images: ``train`` (forward, backward, AdamW), ``forward``
    (a training forward with the autograd graph built, no backward) or ``infer``."""

    def __init__(self, name: str, batch: int, device: torch.device, compiled: bool, tiny: bool,
                 mode: Optional[str] = None, backward_mode: Optional[str] = None):
        kwargs = dict(TINY, num_tokens=48) if tiny and 'tokenformer' in name else dict(TINY) if tiny else {}
        if backward_mode:
            kwargs['backward_mode'] = backward_mode
        self.model = timm.create_model(name, **kwargs).to(device)
        size = self.model.patch_embed.img_size
        self.x = torch.randn(batch, 3, *size, device=device)
        self.y = torch.randint(0, self.model.num_classes, (batch,), device=device)
        self.fn = torch.compile(self.model, mode=mode) if compiled else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=device.type == 'cuda')
        self.device = device

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def train(self) -> None:
        self.model.train()
        with self._autocast():
            loss = F.cross_entropy(self.fn(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def forward(self) -> None:
        self.model.train()
        with self._autocast():
            F.cross_entropy(self.fn(self.x), self.y)

    def infer(self) -> None:
        self.model.eval()
        with self._autocast(), torch.inference_mode():
            self.fn(self.x)


def profile_ms(run: Callable[[], None], device: torch.device, steps: int) -> Dict[str, float]:
    """``{category: ms per call}`` of ``run``'s kernels (a GPU's device time; a CPU's operators' self time), after
    two warm-up calls."""
    from torch.profiler import ProfilerActivity, profile
    run()
    run()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            run()
        synchronize(device)
    totals: Dict[str, float] = {}
    for ev in prof.key_averages():
        on_device = device.type == 'cuda' and ev.device_type == torch.autograd.DeviceType.CUDA
        if device.type == 'cuda' and not on_device:
            continue
        us = ev.self_device_time_total if on_device else ev.self_cpu_time_total
        totals[category(ev.key)] = totals.get(category(ev.key), 0.0) + us / 1000 / steps
    return totals


def attribution(batch: int, device: torch.device, tiny: bool, steps: int) -> List[dict]:
    """Rows ``model, part, ms`` (``matmul``, ``attention``, ``theta_gelu_forward``, ``theta_gelu_backward``,
    ``rest``, ``total``) of a compiled training step of each model."""
    rows = []
    for key, name in MODELS.items():
        step = Step(name, batch, device, True, tiny)
        whole, forward = profile_ms(step.train, device, steps), profile_ms(step.forward, device, steps)
        parts = dict(matmul=whole.get('matmul', 0.0), attention=whole.get('attention', 0.0),
                     theta_gelu_forward=forward.get('theta_gelu', 0.0),
                     theta_gelu_backward=whole.get('theta_gelu', 0.0) - forward.get('theta_gelu', 0.0),
                     rest=whole.get('rest', 0.0))
        parts['total'] = sum(whole.values())
        rows += [dict(model=key, part=part, ms=round(ms, 3)) for part, ms in parts.items()]
        del step
        _empty(device)
    return rows


def _empty(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def timed(run: Callable[[], None], device: torch.device, steps: int, repeats: int) -> float:
    """Median seconds per call over ``repeats`` rounds of ``steps`` calls, after three warm-up calls."""
    for _ in range(3):
        run()
    synchronize(device)
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            run()
        synchronize(device)
        rounds.append((time.perf_counter() - start) / steps)
    return sorted(rounds)[len(rounds) // 2]


def _peak_mib(run: Callable[[], None], device: torch.device) -> Optional[float]:
    if device.type != 'cuda':
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2 ** 20


def model_timings(batch: int, device: torch.device, tiny: bool, steps: int, repeats: int,
                  variants=INDUCTOR_VARIANTS) -> List[dict]:
    """Rows ``model, what, img_per_s, peak_mib`` of compiled training (each Inductor variant), compiled inference
    and eager training."""
    import torch._inductor.config as inductor
    rows = []
    for key, name in MODELS.items():
        plans = [(f'train compiled {v}', 'train', True, mode, config) for v, mode, config in variants]
        plans += [('infer compiled default', 'infer', True, None, {}), ('train eager', 'train', False, None, {})]
        for what, kind, compiled, mode, config in plans:
            torch._dynamo.reset()
            with inductor.patch(config):
                step = Step(name, batch, device, compiled, tiny, mode)
                run = getattr(step, kind)
                seconds = timed(run, device, steps, repeats)
                rows.append(dict(model=key, what=what, img_per_s=round(batch / seconds, 1),
                                 peak_mib=_peak_mib(run, device)))
            del step, run
            _empty(device)
    return rows


def layer_timings(tokens: int, device: torch.device, steps: int, repeats: int, tiny: bool) -> List[dict]:
    """Rows ``layer, compiled, ms`` of forward and backward of one FFN: a Pattention in each backward mode and timm's
    ``Mlp`` of the same shapes, over ``tokens`` rows, bf16."""
    from timm.layers import Mlp
    width, n, hidden = (64, 192, 256) if tiny else (768, 2304, 3072)
    layers = {f'pattention {mode}': Pattention(width, width, n, backward_mode=mode)
              for mode in ('closed_form', 'lean', 'autograd') + (('fused',) if device.type == 'cuda' else ())}
    layers['timm Mlp'] = Mlp(width, hidden)
    x = torch.randn(tokens, width, device=device, requires_grad=True)
    rows = []
    for name, layer in layers.items():
        layer = layer.to(device)
        for compiled in (False, True):
            torch._dynamo.reset()
            fn = torch.compile(layer) if compiled else layer

            def step():
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    fn(x).float().square().mean().backward()
            rows.append(dict(layer=name, compiled=compiled, ms=round(1000 * timed(step, device, steps, repeats), 3)))
    return rows


def _write(out: str, info: dict, parts: dict) -> None:
    atomic_write(out + '.json', lambda f: json.dump(dict(info, **parts), f, indent=1), text=True)
    lines = [f"# Where B/16† loses to ViT-B: {info['card']}, torch {info['torch']}, {info['date']}\n",
             f"`{info['command']}`; commit {info['commit']}; batch {info['batch']}, bf16; one run.\n"]
    for name, cols in (('attribution', ['model', 'part', 'ms']), ('models', ['model', 'what', 'img_per_s', 'peak_mib']),
                       ('layers', ['layer', 'compiled', 'ms'])):
        if name in parts:
            lines += [f'## {name}\n', markdown_table(parts[name], cols), '']
    atomic_write(out + '.md', lambda f: f.write('\n'.join(lines)), text=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--tiny', action='store_true', help='tiny shapes (a CPU check that every part runs)')
    ap.add_argument('--parts', nargs='+', default=['attribution', 'models', 'layers'])
    ap.add_argument('--out', default='docs/bench/gpu_attribution', help='prefix; the card and the date are added')
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        print('error: no CUDA device here; use --device cpu --tiny for a dry run', file=sys.stderr)
        return 2
    card = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    date = datetime.date.today().isoformat()
    command = 'python -m studies.performance.gpu_attribution ' + ' '.join(argv or sys.argv[1:])
    info = dict(card=card, machine=machine_info(device), torch=torch.__version__, date=date, commit=code_commit(),
                batch=a.batch, command=command)
    out = f"{a.out}_{card.replace(' ', '_')}_{date}"
    parts: dict = {}
    runs = dict(attribution=lambda: attribution(a.batch, device, a.tiny, a.steps),
                models=lambda: model_timings(a.batch, device, a.tiny, a.steps, a.repeats),
                layers=lambda: layer_timings(a.batch * 197 if not a.tiny else 256, device, a.steps, a.repeats, a.tiny))
    for part in a.parts:
        parts[part] = runs[part]()
        for row in parts[part]:
            print(part, row, flush=True)
        _write(out, info, parts)
    print(f'wrote {out}.json and .md')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))  # a user error is one line, exit 2 (tkvision.cli.run_cli)
