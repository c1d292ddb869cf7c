"""Pattention (paper Eq. 4-5) against a direct float64 implementation, and its invariants."""
import math
import re

import pytest
import timm
import torch
import torch.nn.functional as F

import tkvision.layers.pattention as pattention_module
from tkvision import growth
from tkvision.layers import SCORE_NORMS, Normalize, Pattention, default_tau, normalize_scores, register_score_norm

#: Normalisations whose zero-initialised new keys leave the output unchanged (from the registry).
ZERO_KEY_EXACT = [name for name, entry in SCORE_NORMS.items() if entry.zero_key_exact]
NOT_EXACT = [name for name, entry in SCORE_NORMS.items() if not entry.zero_key_exact]


def gelu_erf(z):
    return 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))


def reference(x, K, V, score_norm, tau):
    """Eq. 4-5 written out element by element (float64): S_ij = f(A_ij * tau / norm_i), O = S V."""
    x, K, V = x.double(), K.double(), V.double()
    A = torch.einsum('...d,nd->...n', x, K)
    if score_norm == 'l2_norm_gelu':
        S = gelu_erf(A * tau / torch.sqrt((A ** 2).sum(-1, keepdim=True)))
    elif score_norm == 'l1_norm_gelu':
        S = gelu_erf(A * tau / A.abs().sum(-1, keepdim=True))
    elif score_norm == 'gelu_l2_norm':
        G = gelu_erf(A)
        S = G * tau / torch.sqrt((G ** 2).sum(-1, keepdim=True))
    elif score_norm == 'softmax':
        E = torch.exp(A)
        S = E / E.sum(-1, keepdim=True) * tau
    elif score_norm == 'gelu':  # the plain MLP: no normalisation
        S = gelu_erf(A * tau)
    else:  # a newly registered normalisation needs its own reference here
        raise NotImplementedError(f'write the float64 reference of score_norm {score_norm!r}')
    return torch.einsum('...n,nd->...d', S, V)


@pytest.mark.parametrize('score_norm', SCORE_NORMS)
def test_matches_eq5_reference(score_norm):
    torch.manual_seed(0)
    layer = Pattention(12, 20, num_tokens=9, score_norm=score_norm, key_std=0.5, value_std=0.5)
    x = torch.randn(3, 5, 12)
    out = layer(x)
    ref = reference(x, layer.key_param_tokens, layer.value_param_tokens, score_norm, layer.tau.item())
    assert out.shape == (3, 5, 20)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_default_tau_and_shapes():
    assert default_tau('l2_norm_gelu', 64) == 8.0
    assert default_tau('gelu_l2_norm', 64) == 8.0
    assert default_tau('l1_norm_gelu', 64) == 64.0
    assert default_tau('softmax', 64) == 64.0
    assert default_tau('gelu', 64) == 1.0
    layer = Pattention(4, 6, num_tokens=16)
    assert layer.key_param_tokens.shape == (16, 4) and layer.value_param_tokens.shape == (16, 6)
    assert not any('bias' in n for n, _ in layer.named_parameters())
    assert layer(torch.randn(2, 3, 7, 4)).shape == (2, 3, 7, 6)  # any leading dims


def test_tau_recorded_in_state_dict_and_restored():
    a = Pattention(4, 4, num_tokens=16, tau=3.5)
    sd = a.state_dict()
    assert sd['tau'].item() == 3.5
    b = Pattention(4, 4, num_tokens=16)  # default tau 4.0
    b.load_state_dict(sd)
    assert b.tau.item() == 3.5
    x = torch.randn(5, 4)
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize('score_norm', ZERO_KEY_EXACT)
def test_zero_keys_preserve_output_with_fixed_tau(score_norm):
    torch.manual_seed(0)
    layer = Pattention(16, 8, num_tokens=32, score_norm=score_norm).eval()
    x = torch.randn(4, 10, 16)
    before = layer(x)
    tau = layer.tau.item()
    layer.grow(32, key_init='zeros', value_init='normal')
    assert layer.num_tokens == 64 and layer.tau.item() == tau  # tau not recomputed
    assert (layer(x) - before).abs().max().item() <= 1e-6


def test_recomputing_tau_would_break_preservation():
    """Why tau is a fixed buffer: with tau = sqrt(n + m) the grown output differs (reference README)."""
    torch.manual_seed(0)
    layer = Pattention(16, 8, num_tokens=32)
    x = torch.randn(10, 16)
    before = layer(x)
    layer.grow(32)
    layer.tau.fill_(math.sqrt(64))
    assert (layer(x) - before).abs().max().item() > 1e-3


@pytest.mark.parametrize('score_norm', NOT_EXACT)
def test_softmax_growth_warns_and_changes_output(score_norm):
    torch.manual_seed(0)
    layer = Pattention(8, 8, num_tokens=8, score_norm=score_norm)
    x = torch.randn(3, 8)
    before = layer(x)
    with pytest.warns(UserWarning, match=score_norm):
        layer.grow(8)
    assert (layer(x) - before).abs().max().item() > 1e-4


def test_grow_keeps_old_rows_and_inits_new():
    torch.manual_seed(0)
    layer = Pattention(8, 6, num_tokens=4)
    k, v = layer.key_param_tokens.detach().clone(), layer.value_param_tokens.detach().clone()
    layer.grow(3, key_init='normal', value_init='zeros')
    assert torch.equal(layer.key_param_tokens[:4], k) and torch.equal(layer.value_param_tokens[:4], v)
    assert layer.key_param_tokens[4:].abs().sum() > 0 and layer.value_param_tokens[4:].abs().sum() == 0
    with pytest.raises(ValueError, match='key_init'):
        layer.grow(1, key_init='ones')
    with pytest.raises(ValueError, match='>= 0'):
        layer.grow(-1)


@pytest.mark.parametrize('score_norm', SCORE_NORMS)
def test_zero_input_row_gives_no_nan(score_norm):
    layer = Pattention(8, 8, num_tokens=16, score_norm=score_norm)
    out = layer(torch.zeros(2, 3, 8))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_is_finite_and_close(dtype):
    torch.manual_seed(0)
    layer = Pattention(64, 64, num_tokens=128)
    x = torch.randn(4, 16, 64) * 30  # large scores: float32 normalisation keeps them in range
    x[0, 0] = 0
    ref = layer(x)
    with torch.autocast('cpu', dtype=dtype):
        out = layer(x)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() / ref.abs().max() < 0.05


def test_extra_repr_and_bad_args():
    r = repr(Pattention(4, 6, num_tokens=9))
    for s in ('in_features=4', 'out_features=6', 'num_tokens=9', 'score_norm=l2_norm_gelu', 'tau=3'):
        assert s in r
    with pytest.raises(ValueError, match='unknown score_norm'):
        Pattention(4, 4, 4, score_norm='relu')
    with pytest.raises(ValueError, match='positive'):
        Pattention(4, 4, 0)


def test_init_std():
    torch.manual_seed(0)
    layer = Pattention(256, 256, num_tokens=512, key_std=0.02, value_std=0.005)
    assert abs(layer.key_param_tokens.std().item() - 0.02) < 0.001
    assert abs(layer.value_param_tokens.std().item() - 0.005) < 0.0003


HAND_WRITTEN = {mode: dict(backward_mode=mode) for mode in ('lean', 'closed_form')}
PLAIN = dict(backward_mode='autograd')


@pytest.mark.parametrize('path', HAND_WRITTEN)
@pytest.mark.parametrize('shape', [(3, 5, 12), (7, 12)])
def test_hand_written_backward_equals_reference_autograd(shape, path):
    """Each hand-written backward (pattention_autograd.py) against plain autograd of Eq. 5, float64."""
    torch.manual_seed(0)
    ref = Pattention(12, 10, num_tokens=9, key_std=0.5, value_std=0.5, **PLAIN).double()
    fast = Pattention(12, 10, num_tokens=9, **HAND_WRITTEN[path]).double()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(*shape, dtype=torch.float64)
    x[0].zero_()  # an all-zero row: the clamped-norm branch
    grads = []
    for layer in (ref, fast):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append((out.detach(), xi.grad, layer.key_param_tokens.grad, layer.value_param_tokens.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: fast(x), (torch.randn(2, 12, dtype=torch.float64, requires_grad=True),))


def test_the_default_backward_paths():
    """The defaults a user gets: the closed form in training (on every device), the plain path in
    inference and for the other normalisations; an unknown mode is refused by name."""
    layer = Pattention(4, 4, 3)
    assert layer.backward_mode == 'closed_form'
    assert layer._training_backward() == 'closed_form'
    with torch.no_grad():
        assert layer._training_backward() == 'autograd'
    assert Pattention(4, 4, 3, score_norm='gelu_l2_norm')._training_backward() == 'autograd'
    assert Pattention(4, 4, 3, backward_mode='autograd')._training_backward() == 'autograd'
    assert Pattention(4, 4, 3, backward_mode='lean')._training_backward() == 'lean'
    with torch.no_grad():  # inference: the plain path, whatever the mode
        assert Pattention(4, 4, 3, backward_mode='lean')._training_backward() == 'autograd'
    with pytest.raises(ValueError, match="unknown backward_mode 'fast'; choose one of closed_form, lean, autograd"):
        Pattention(4, 4, 3, backward_mode='fast')


def test_the_removed_compiled_mode_is_refused_saying_what_to_use():
    """``'compiled'`` lost to ``'closed_form'`` (CHANGELOG.md): a layer or model asked for it says what replaces it."""
    from tkvision.layers import set_backward_mode
    with pytest.raises(ValueError, match="'compiled' was removed .*use 'closed_form'.*compile: true"):
        Pattention(4, 4, 3, backward_mode='compiled')
    with pytest.raises(ValueError, match="'compiled' was removed"):
        set_backward_mode(torch.nn.Sequential(Pattention(4, 4, 3)), 'compiled')


@pytest.mark.parametrize('path', HAND_WRITTEN)
def test_hand_written_backward_under_autocast_matches_reference(path):
    torch.manual_seed(0)
    ref = Pattention(32, 16, num_tokens=24, **PLAIN)
    fast = Pattention(32, 16, num_tokens=24, **HAND_WRITTEN[path])
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8, 32)
    outs = []
    for layer in (ref, fast):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = layer(x)
        out.float().sum().backward()
        outs.append((out.float(), layer.key_param_tokens.grad, layer.value_param_tokens.grad))
    for a, b in zip(*outs):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_closed_form_backward_with_tau_zero_gives_zero_gradient_not_nan():
    layer = Pattention(6, 5, 4, tau=0.0, **HAND_WRITTEN['closed_form']).double()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_the_docstring_table_is_the_registry():
    """Every row of Pattention's table (name, default tau, exactness, scale invariance) is a registry entry
    and back."""
    rows = re.findall(r'^``(\w+)``\s+.*?\s{2,}(√n|n|1)\s+(yes|no)\s+(yes|no)\s*$', pattention_module.__doc__, re.M)
    table = {name: (tau, exact, invariant) for name, tau, exact, invariant in rows}
    assert set(table) == set(SCORE_NORMS)
    for name, (tau, exact, invariant) in table.items():
        assert default_tau(name, 64) == {'√n': 8.0, 'n': 64.0, '1': 1.0}[tau], name
        assert SCORE_NORMS[name].zero_key_exact == (exact == 'yes'), name
        assert SCORE_NORMS[name].scale_invariant == (invariant == 'yes'), name


@pytest.mark.parametrize('score_norm', list(SCORE_NORMS))
def test_scale_invariance_as_the_registry_states_it(score_norm):
    """Θ(c·A) = Θ(A) for c > 0 exactly where the registry says so (what the LayerNorm fold relies on)."""
    scores = torch.randn(5, 12, dtype=torch.float64)
    tau = default_tau(score_norm, 12)
    same = torch.allclose(normalize_scores(3.7 * scores, score_norm, tau), normalize_scores(scores, score_norm, tau),
                          rtol=1e-12, atol=1e-12)
    assert same == SCORE_NORMS[score_norm].scale_invariant


@pytest.mark.parametrize('tau', [None, 2.0])
def test_an_unknown_score_norm_is_refused_at_construction_whatever_tau(tau):
    with pytest.raises(ValueError, match="unknown score_norm 'typo'; choose one of " + ', '.join(SCORE_NORMS)):
        Pattention(4, 4, num_tokens=8, score_norm='typo', tau=tau)
    with pytest.raises(ValueError, match='unknown Pattention kind'):
        Pattention(4, 4, num_tokens=8, kind='mlp')


def test_a_registered_normalisation_works_in_every_model_path(monkeypatch):
    """Adding a normalisation is one registration in layers/ (a throw-away example: L2 + ReLU): the
    models build with it, TorchScript scripts it, growth is exact as its flag says, tests see it."""
    monkeypatch.setattr(pattention_module, 'SCORE_NORMS', dict(SCORE_NORMS))
    monkeypatch.setattr('tkvision.layers.SCORE_NORMS', pattention_module.SCORE_NORMS)

    @register_score_norm('l2_norm_relu', default_tau=math.sqrt, zero_key_exact=True)
    class L2NormReLU(Normalize):
        def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
            return F.relu(a * (tau / torch.linalg.vector_norm(a, dim=-1, keepdim=True).clamp_min(eps)))

    assert 'l2_norm_relu' in pattention_module.SCORE_NORMS and default_tau('l2_norm_relu', 49) == 7.0
    with pytest.raises(ValueError, match='already registered'):
        register_score_norm('l2_norm_relu', default_tau=float, zero_key_exact=False)(L2NormReLU)
    torch.manual_seed(0)
    m = timm.create_model('tokenformer_vit_ti16', img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                          num_tokens=16, score_norm='l2_norm_relu').eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = m(x)
        torch.testing.assert_close(torch.jit.script(m)(x), before)
        growth.grow(m, qkv=8, ffn=16)
        assert (m(x) - before).abs().max().item() <= 1e-6


def test_repr_of_a_model_built_on_the_meta_device():
    """Printing a model built on the meta device (how parameter counts and shape checks build the large
    variants) used to raise 'Tensor.item() cannot be called on meta tensors' on tau."""
    with torch.device('meta'):
        layer = Pattention(4, 6, num_tokens=9)
    assert 'tau=meta' in repr(layer) and 'num_tokens=9' in repr(layer)
