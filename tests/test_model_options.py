"""The options modern ViTs have (timm's names and semantics), each against a direct computation, and
growth exact with all of them on."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F

from tkvision import growth
from tkvision.layers import Pattention

BASE = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=5)


def _model(**kw):
    torch.manual_seed(0)
    return timm.create_model('tokenformer_vit_ti16', **dict(BASE, **kw)).eval()


def test_qk_norm_is_a_layernorm_of_q_and_k_per_head():
    attn = _model(qk_norm=True).blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)  # make the affine part matter
        attn.k_norm.bias.uniform_(-0.1, 0.1)
    x = torch.randn(2, 17, 32)
    B, N, H, D = 2, 17, 2, 16
    q = F.layer_norm(attn.q(x).view(B, N, H, D), (D,), attn.q_norm.weight, attn.q_norm.bias).transpose(1, 2)
    k = F.layer_norm(attn.k(x).view(B, N, H, D), (D,), attn.k_norm.weight, attn.k_norm.bias).transpose(1, 2)
    v = attn.v(x).view(B, N, H, D).transpose(1, 2)
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1)
    ref = attn.proj((a @ v).transpose(1, 2).reshape(B, N, H * D))
    torch.testing.assert_close(attn(x), ref)


def test_register_tokens_follow_the_class_token_and_are_not_pooled():
    m = _model(reg_tokens=3, global_pool='avg')
    x = torch.randn(2, 3, 32, 32)
    patches = m.patch_embed(x)
    tokens = m._pos_embed(patches, (4, 4))
    ref = torch.cat([m.cls_token.expand(2, -1, -1), m.reg_token.expand(2, -1, -1), patches], 1) + m.pos_embed
    torch.testing.assert_close(tokens, ref)
    feats = m.forward_features(x)
    assert feats.shape == (2, 1 + 3 + 16, 32) and m.num_prefix_tokens == 4
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), m.fc_norm(feats[:, 4:].mean(1)))
    assert 'reg_token' in m.no_weight_decay()


def test_layer_scale_multiplies_each_branch_by_gamma():
    blk = _model(init_values=0.1).blocks[0]
    assert torch.equal(blk.ls1.gamma, torch.full((32,), 0.1)) and torch.equal(blk.ls2.gamma, torch.full((32,), 0.1))
    with torch.no_grad():
        blk.ls2.gamma.uniform_(0, 1)
    x = torch.randn(2, 17, 32)
    h = x + blk.ls1.gamma * blk.attn(blk.norm1(x))
    torch.testing.assert_close(blk(x), h + blk.ls2.gamma * blk.ffn(blk.norm2(h)))


def test_no_class_token_with_average_pooling():
    m = _model(class_token=False, global_pool='avg')
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert m.cls_token is None and feats.shape == (2, 16, 32) and m.pos_embed.shape == (1, 16, 32)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), m.fc_norm(feats.mean(1)))
    with pytest.raises(ValueError, match='class_token'):
        _model(class_token=False, global_pool='token')


def test_no_embed_class_adds_position_to_patches_only():
    m = _model(no_embed_class=True, reg_tokens=2)
    patches = m.patch_embed(torch.randn(2, 3, 32, 32))
    assert m.pos_embed.shape == (1, 16, 32)
    ref = torch.cat([m.cls_token.expand(2, -1, -1), m.reg_token.expand(2, -1, -1), patches + m.pos_embed], 1)
    torch.testing.assert_close(m._pos_embed(patches, (4, 4)), ref)


def test_sincos_position_embedding_is_fixed_2d_sin_cos():
    m = _model(pos_embed='sincos', img_size=48)  # a 6 x 6 grid
    pe = m.pos_embed
    assert not pe.requires_grad and pe.shape == (1, 37, 32) and not pe[0, 0].any()  # class token: no position
    omega = 10000 ** (-torch.arange(8) / 8)  # d / 4 frequencies
    rows = []
    for i in range(6):
        for j in range(6):
            rows.append(torch.cat([torch.sin(i * omega), torch.sin(j * omega), torch.cos(i * omega), torch.cos(j * omega)]))
    torch.testing.assert_close(pe[0, 1:], torch.stack(rows))
    assert 'pos_embed' not in [n for n, p in m.named_parameters() if p.requires_grad]


def test_no_position_embedding():
    m = _model(pos_embed='none')
    patches = m.patch_embed(torch.randn(2, 3, 32, 32))
    assert m.pos_embed is None
    torch.testing.assert_close(m._pos_embed(patches, (4, 4)), torch.cat([m.cls_token.expand(2, -1, -1), patches], 1))
    with pytest.raises(ValueError, match="'learn', 'sincos' or 'none'"):
        _model(pos_embed='rope')


def test_fc_norm_with_the_class_token_normalises_after_pooling():
    m = _model(fc_norm=True)
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert isinstance(m.norm, torch.nn.Identity)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), m.fc_norm(feats[:, 0]))


def test_growth_stays_exact_with_every_option_on():
    m = _model(qk_norm=True, reg_tokens=2, init_values=0.1, no_embed_class=True, pos_embed='sincos',
               class_token=True, global_pool='avg', fc_norm=True)
    x = torch.randn(3, 3, 32, 32)
    before = m(x)
    growth.grow(m, patch=4, qkv=8, proj=8, ffn=16)
    assert growth.token_counts(m) == dict(patch=20, qkv=24, proj=24, ffn=80)
    assert (m(x) - before).abs().max().item() <= 1e-6


def test_tau_scale_multiplies_every_pattentions_default_tau_stem_included():
    """``tau_scale`` (a lever of docs/comparison.md): each Pattention's τ is the scale times √n of its own n
    (Eq. 5), the patch embedding's too, and the output is Eq. 5 with that τ (float64, by hand)."""
    m = _model(tau_scale=2.0, num_tokens_ffn=24).double()
    layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, Pattention)}
    assert len(layers) == 1 + 2 * 5
    for name, layer in layers.items():
        assert layer.tau.item() == pytest.approx(2.0 * math.sqrt(layer.num_tokens), rel=1e-6), name
    ffn = m.blocks[0].ffn
    x = torch.randn(5, 32, dtype=torch.float64)
    x = x - x.mean(-1, keepdim=True)  # what the block's LayerNorm hands its FFN (folded: it centres the keys)
    a = x @ ffn.key_param_tokens.T
    want = F.gelu(a * 2.0 * math.sqrt(24) / a.norm(dim=-1, keepdim=True)) @ ffn.value_param_tokens
    torch.testing.assert_close(ffn(x), want)
    with pytest.raises(ValueError, match='tau_scale'):
        _model(tau_scale=0.0)


def _loss_with_tau(model, tau, x, value):
    """The test's loss with one τ set to ``value``."""
    with torch.no_grad():
        tau.fill_(value)
        return model(x).sin().sum().item()


def test_learned_tau_gets_the_finite_difference_gradient_in_every_pattention():
    """``learn_tau``: τ is a parameter of every Pattention (same state-dict keys) and its gradient matches a
    central difference of the loss in float64 (the hand-written backwards give τ none, so a learned τ must
    not take them)."""
    m = _model(learn_tau=True).double().train()
    names = [n for n, _ in m.named_parameters() if n.endswith('.tau')]
    assert len(names) == 1 + 2 * 5 and not [n for n, _ in m.named_buffers() if n.endswith('tau')]
    assert set(m.state_dict()) == set(_model().state_dict())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    m(x).sin().sum().backward()
    for name in ('patch_embed.proj.tau', 'blocks.0.attn.k.tau', 'blocks.1.ffn.tau'):
        tau = m.get_parameter(name)
        t0, h = tau.item(), 1e-5
        numeric = (_loss_with_tau(m, tau, x, t0 + h) - _loss_with_tau(m, tau, x, t0 - h)) / (2 * h)
        _loss_with_tau(m, tau, x, t0)
        assert tau.grad.item() == pytest.approx(numeric, rel=1e-5, abs=1e-9), name


def test_a_fixed_tau_checkpoint_loads_into_a_learned_tau_model_with_the_same_outputs():
    """A lever becomes a default only if stored checkpoints still load and give the same outputs."""
    written = _model()
    learned = _model(learn_tau=True, key_std=0.3)
    learned.load_state_dict(written.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(learned(x), written(x), rtol=0, atol=0)
    assert isinstance(learned.blocks[0].ffn.tau, torch.nn.Parameter)


def test_a_learned_tau_gets_no_weight_decay_and_survives_growth():
    """timm's optimizer factory leaves a 0-d τ out of weight decay; growth with ``tau='recompute'`` sets a
    learned τ to √n of the new n and keeps it a parameter."""
    from tkvision.engine.config import load_config, section
    from tkvision.engine.optim import build_optimizer
    m = _model(learn_tau=True)
    optim = section(load_config(None, dict(opt='adamw', weight_decay=0.05, warmup_epochs=0, epochs=1)), 'optim')
    optimizer = build_optimizer(m, optim, lr=1e-3)
    decay_of = {id(p): g['weight_decay'] for g in optimizer.param_groups for p in g['params']}
    taus = [p for n, p in m.named_parameters() if n.endswith('.tau')]
    assert taus and all(decay_of[id(p)] == 0 for p in taus)
    growth.grow(m, ffn=16, tau='recompute')
    assert isinstance(m.blocks[0].ffn.tau, torch.nn.Parameter)
    assert m.blocks[0].ffn.tau.item() == pytest.approx(math.sqrt(80))
