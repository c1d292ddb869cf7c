"""The options modern ViTs have (timm's names and semantics), each against a direct computation, and
growth exact with all of them on."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F

from tkvision import growth
from tkvision.layers import SCORE_NORMS

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


@pytest.mark.parametrize('score_norm', SCORE_NORMS)
def test_fused_qkv_equals_the_three_pattentions_in_value_and_gradient(score_norm):
    """Issue 19's lever: one score GEMM for Q/K/V; the separate Pattentions stay the reference."""
    torch.manual_seed(0)
    kw = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_tokens=16,
              num_classes=10, score_norm=score_norm)
    ref = timm.create_model('tokenformer_vit_ti16', **kw)
    fused = timm.create_model('tokenformer_vit_ti16', fused_qkv=True, **kw)
    fused.load_state_dict(ref.state_dict())  # same parameters, same checkpoint keys
    with torch.no_grad():  # distinct taus per projection must be kept apart
        ref.blocks[0].attn.k.tau.mul_(1.5)
        fused.blocks[0].attn.k.tau.mul_(1.5)
    x = torch.randn(3, 1, 28, 28)
    a, b = ref(x), fused(x)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    a.square().sum().backward()
    b.square().sum().backward()
    for (n, p), (_, q) in zip(ref.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_fused_qkv_growth_stays_exact_and_scripts():
    torch.manual_seed(0)
    m = timm.create_model('tokenformer_vit_ti16', img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2,
                          num_heads=2, num_tokens=16, num_classes=10, fused_qkv=True).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        before = m(x)
        growth.grow(m, qkv=8, ffn=16)
        torch.testing.assert_close(m(x), before, rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.jit.script(m)(x), before, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='fused_qkv'):
        timm.create_model('tokenformer_ring_vit_small_patch16_224', fused_qkv=True, depth=1, img_size=32)
