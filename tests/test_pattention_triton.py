"""The fused Triton Pattention (``tkvision/layers/pattention_triton.py``, opt-in ``fused_kernel=True``)
against the plain path, the reference: on the CPU under ``TRITON_INTERPRET=1`` (CI has no GPU), in a
fresh process, since Triton reads that variable when the kernels are defined.

Sizes are chosen so that every tile is ragged (70 tokens, 40 input features, 75 parameter tokens, 36
outputs against 64 x 64 x 32 tiles) and one input row is all zeros (the norm's ε branch). What this
cannot check: bf16 and the GPU's tensor cores (the interpreter computes in NumPy), and speed."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tkvision.layers.pattention import Pattention

from .helpers import ROOT

_CHECK = r'''
import json, torch, timm
import tkvision.layers.pattention_triton as kernels
from tkvision.layers.pattention import Pattention

def rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())

calls = []
fused_function = kernels.pattention_fused
kernels.pattention_fused = lambda *args: calls.append(1) or fused_function(*args)

torch.manual_seed(0)
layer = Pattention(40, 36, 75, value_std=0.5, key_std=0.5).double()
x = torch.randn(2, 35, 40, dtype=torch.float64)
x[1, 3] = 0  # an all-zero row: ‖A‖ < ε
grad_out = torch.randn(2, 35, 36, dtype=torch.float64)
results = {}
for name, fused, dtype in (('reference', False, torch.float64), ('fused', True, torch.float32)):
    m = Pattention(40, 36, 75).to(dtype)
    m.load_state_dict(layer.state_dict())
    m.fused_kernel = fused
    xi = x.detach().to(dtype).requires_grad_()
    out = m(xi)
    out.backward(grad_out.to(dtype))
    results[name] = [out, xi.grad, m.key_param_tokens.grad, m.value_param_tokens.grad]
layer_errors = [rel(a, b) for a, b in zip(results['fused'], results['reference'])]

kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=24, num_classes=5)
model = timm.create_model('tokenformer_vit_ti16', **kw)
images, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 4])
model_runs = {}
for name, fused, dtype in (('reference', False, torch.float64), ('plain', False, torch.float32),
                           ('fused', True, torch.float32)):
    model.to(dtype)
    for m in model.modules():
        if isinstance(m, Pattention):
            m.fused_kernel = fused
    model.zero_grad()
    calls.clear()
    logits = model(images.to(dtype))
    torch.nn.functional.cross_entropy(logits, labels).backward()
    model_runs[name] = [logits.detach()] + [p.grad.clone() for p in model.parameters()]
errors = {name: max(rel(a, b) for a, b in zip(model_runs[name], model_runs['reference']))
          for name in ('plain', 'fused')}
plain_layers = sum(type(m) is Pattention for m in model.modules())
print(json.dumps(dict(layer=layer_errors, model=errors, count=len(model_runs['fused']), calls=len(calls),
                      plain_layers=plain_layers)))
'''


@pytest.fixture(scope='module')
def interpreted():
    """The errors of the fused path against the plain one, measured in a TRITON_INTERPRET=1 process."""
    res = subprocess.run([sys.executable, '-c', _CHECK], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET='1'), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_fused_kernels_equal_the_plain_path_in_value_and_gradient(interpreted):
    """float32 kernels against the float64 plain path: output, dX, dK_P and dV_P within float32 rounding
    (relative error of the whole tensor), the zero row included."""
    output, grad_x, grad_keys, grad_values = interpreted['layer']
    assert max(output, grad_x, grad_keys, grad_values) < 2e-6


def test_a_model_with_fused_kernels_trains_as_the_plain_one(interpreted):
    """Every Pattention of a TokenFormer switched to the kernels (the patch embedding, a subclass with
    its own scores, keeps the plain path): logits and every parameter's gradient as close to the float64
    model as the plain float32 model's are (the largest relative error over the tensors)."""
    errors = interpreted['model']
    assert interpreted['calls'] == interpreted['plain_layers'] == 10  # 2 blocks x (Q, K, V, proj, FFN)
    assert interpreted['count'] > 20 and errors['fused'] < max(4 * errors['plain'], 1e-6) and errors['fused'] < 1e-4


def test_the_fused_kernel_off_a_gpu_says_what_to_do():
    if os.environ.get('TRITON_INTERPRET') == '1':
        pytest.skip('this process interprets Triton on the CPU, which is what the error would tell the user to do')
    layer = Pattention(8, 4, 6, fused_kernel=True)
    with pytest.raises(RuntimeError, match='CUDA tensor.*TRITON_INTERPRET=1'):
        layer(torch.randn(2, 8))
