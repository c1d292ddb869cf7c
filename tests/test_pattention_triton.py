"""The fused Triton Pattention (``tkvision/layers/pattention_triton.py``, ``backward_mode: fused``) on the CPU under
Triton's interpreter: its output and the gradients of X, K_P and V_P against float64 math at odd sizes (a batch of one,
n and d not multiples of the 32-wide tiles, a long row of 2,304 tokens as the B/16 FFN's, a row whose scores are all
zero), in float32 and bfloat16; growth, an elastic prefix and a folded LayerNorm through it; ``torch.compile`` keeping
the op whole and ``torch.export`` seeing the plain path.

Each case runs in a process of its own with ``TRITON_INTERPRET=1`` (Triton reads it when a kernel is defined), which
prints the largest relative errors as JSON; the tolerances are stated here: float32 1e-5 of the reference's largest
magnitude, bfloat16 3e-2 (its 8-bit mantissa over sums of up to 2,304 products)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from .helpers import ROOT

TOLERANCE = {'float32': 1e-5, 'bfloat16': 3e-2}

PRELUDE = textwrap.dedent('''
    import json, torch
    from tkvision.layers.pattention_triton import fused_l2_norm_gelu

    def reference(x, k, v, tau, eps):
        a = x @ k.t()
        return torch.nn.functional.gelu(a * (tau / a.norm(dim=-1, keepdim=True).clamp_min(eps))) @ v

    def relative(a, b):
        return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

    def check(shape, dtype, zero_row=False):
        b, t, d, n, e = shape
        g = torch.Generator().manual_seed(sum(shape))
        x = torch.randn(b, t, d, generator=g).to(dtype)
        if zero_row:
            x[0, 0] = 0
        k = (0.3 * torch.randn(n, d, generator=g)).to(dtype)
        v = (0.3 * torch.randn(n, e, generator=g)).to(dtype)
        tau = torch.tensor(float(n) ** 0.5)
        inputs = [z.clone().requires_grad_() for z in (x, k, v)]
        out = fused_l2_norm_gelu(*inputs, tau, 1e-6)
        grad = torch.randn(out.shape, generator=g).to(dtype)
        out.backward(grad)
        wide = [z.double().requires_grad_() for z in (x, k, v)]
        expected = reference(*wide, tau.double(), 1e-6)
        expected.backward(grad.double())
        return dict(out=relative(out, expected), **{f'd{name}': relative(z.grad, w.grad)
                                                     for name, z, w in zip('xkv', inputs, wide)})
''')


def _run(body: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, '-c', PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_the_fused_op_matches_float64_math_at_odd_sizes(dtype):
    """(batch, tokens, d, n, e): a batch of one with 37 tokens, n = 45 and d = 20 across tile edges, a row of zero
    scores (the norm below ε: dA = r dZ), and 2,304 parameter tokens (the B/16 FFN's n) on 3 rows."""
    errors = _run(f'''
        cases = {{'one_batch': ((1, 37, 20, 45, 24), False), 'zero_row': ((2, 5, 33, 70, 9), True),
                 'long_rows': ((1, 3, 16, 2304, 8), False)}}
        print(json.dumps({{name: check(shape, torch.{dtype}, zero) for name, (shape, zero) in cases.items()}}))
    ''')
    for case, values in errors.items():
        for what, error in values.items():
            assert error <= TOLERANCE[dtype], (case, what, error)


def test_growth_a_prefix_and_a_folded_layernorm_go_through_the_fused_op_unchanged():
    """A block with its LayerNorm folded into the keys, grown by 8 zero-key tokens per Pattention and run at half of
    its tokens: ``backward_mode: fused`` gives the outputs and parameter gradients of ``closed_form`` (float32)."""
    errors = _run('''
        import copy
        import timm, tkvision
        from tkvision.growth import elastic, grow
        from tkvision.layers import set_backward_mode
        torch.manual_seed(0)
        model = timm.create_model('tokenformer_vit_ti16', img_size=16, patch_size=8, embed_dim=32, depth=1,
                                  num_heads=2, num_tokens=24, num_classes=5)
        grow(model, qkv=8, proj=8, ffn=8)
        x = torch.randn(2, 3, 16, 16)
        found = {}
        for fraction in (None, 0.5):
            results = {}
            for mode in ('closed_form', 'fused'):
                net = copy.deepcopy(model)
                set_backward_mode(net, mode)
                with elastic.prefix(net, fraction):
                    out = net(x)
                    out.square().sum().backward()
                results[mode] = (out, {k: p.grad for k, p in net.named_parameters() if p.grad is not None})
            (a, ga), (b, gb) = results['fused'], results['closed_form']
            found[str(fraction)] = max([relative(a, b.double())] + [relative(ga[k], gb[k].double()) for k in gb])
            assert ga.keys() == gb.keys()
        print(json.dumps(found))
    ''')
    assert all(error <= 1e-4 for error in errors.values()), errors


def test_compile_keeps_the_op_whole_and_export_sees_the_plain_path():
    """``torch.compile(fullgraph=True)`` of a fused Pattention (its fake kernel and autograd registered: no graph
    break) gives the eager values; ``torch.export`` of the layer holds no ``tkvision`` op (the plain path)."""
    found = _run('''
        from tkvision.layers import Pattention
        layer = Pattention(20, 12, 40, backward_mode='fused')
        x = torch.randn(2, 7, 20, requires_grad=True)
        eager = layer(x)
        compiled = torch.compile(layer, backend='aot_eager', fullgraph=True)(x)
        compiled.sum().backward()
        program = torch.export.export(layer.eval(), (x.detach(),))
        print(json.dumps(dict(compiled=relative(compiled, eager.double()), grad=bool(x.grad is not None),
                              exported='tkvision' in str(program.graph))))
    ''')
    assert found['compiled'] <= 1e-6 and found['grad'] and not found['exported'], found


def test_fused_on_a_cpu_run_is_refused_in_one_line(tmp_path, capsys):
    from tkvision.cli.train import train_main
    assert train_main(['--output', str(tmp_path / 'r'), '--backward_mode', 'fused', '--train_subset', '128',
                       '--val_subset', '64', '--epochs', '1', '--progress', 'false']) == 2
    err = capsys.readouterr().err
    assert 'backward_mode: fused runs Triton kernels on a CUDA device' in err and len(err.strip().splitlines()) == 1
