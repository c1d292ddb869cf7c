"""RingFormer ViT and Ring x Token: the paper's parameter counts, level signals against a direct
computation and zero at init, growth exactness of the shared tokens, loading, the mean attention distance."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

import tkvision  # noqa: F401
from tkvision import growth
from studies.ringformer.attention_distance import mean_attention_distance
from tkvision.layers import Pattention
from tkvision.models.ringformer import Level, LevelSignal, attend_with_level_tokens

from .helpers import ROOT, fmnist_cfg

TINY = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=3, num_heads=2, num_classes=10)


def _trainable(m):
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


@pytest.mark.parametrize('name,paper', [('ringformer_vit_small_patch16_224', 4.40e6),  # Table 2
                                        ('ringformer_vit_base_patch16_224', 12.02e6),  # Table 3
                                        ('ringformer_vit_base_wide_patch16_224', 31.95e6)])  # Table 3, upscaled
def test_parameter_counts_match_the_paper(name, paper):
    with torch.device('meta'):
        m = timm.create_model(name)
    assert abs(_trainable(m) - paper) / paper < 0.0015 * 10  # within 1.5%: measured exact to the printed digits
    assert round(_trainable(m) / 1e6, 2) == round(paper / 1e6, 2)
    assert m.blocks[0].signals['q'].down.weight.shape == (m.embed_dim // 16, m.embed_dim)  # rank d / 16


def test_ring_x_token_signal_kinds_cost_the_same():
    with torch.device('meta'):
        a = timm.create_model('tokenformer_ring_vit_base_patch16_224', level_signal='lowrank')
        b = timm.create_model('tokenformer_ring_vit_base_patch16_224', level_signal='tokens')
    assert _trainable(a) == _trainable(b)


def _perturb(model, std=0.05):
    """Non-zero level signals and level keys (they are zero at init), for tests that must see them."""
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.startswith('blocks.') and p.requires_grad:
                p.add_(std * torch.randn_like(p))
    return model


@pytest.mark.parametrize('name,kw', [('ringformer_vit_small_patch16_224', {}),
                                     ('tokenformer_ring_vit_small_patch16_224', dict(num_tokens=16)),
                                     ('tokenformer_ring_vit_small_patch16_224', dict(num_tokens=16, level_signal='tokens'))])
def test_at_init_every_level_is_the_plain_shared_block(name, kw):
    torch.manual_seed(0)
    model = timm.create_model(name, **TINY, **kw).eval()
    plain = timm.create_model(name, **TINY, **dict(kw, level_signal='none')).eval()
    missing = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing.missing_keys and all('signals' in k or k.endswith(('_keys', '_values'))
                                            for k in missing.unexpected_keys)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        _, a = model.forward_intermediates(x, output_fmt='NLC')
        _, b = plain.forward_intermediates(x, output_fmt='NLC')
        for level_a, level_b in zip(a, b):
            torch.testing.assert_close(level_a, level_b, rtol=0, atol=1e-6)
        _perturb(model)
        assert not torch.allclose(model(x), plain(x), atol=1e-4)  # the signals are live once trained


def test_plain_shared_block_equals_a_direct_computation():
    """RingFormer at init: per level x + Attn(LN_i(x)) then + FFN(LN_i(x)) with the shared Linear layers."""
    torch.manual_seed(0)
    m = timm.create_model('ringformer_vit_small_patch16_224', **TINY).eval()
    x = torch.randn(2, 17, 32)
    attn, mlp = m.shared.attn, m.shared.ffn
    ref = x
    for lv in m.blocks:
        h = F.layer_norm(ref, (32,), lv.norm1.weight, lv.norm1.bias, 1e-6)
        q, k, v = (t.view(2, 17, 2, 16).transpose(1, 2) for t in (attn.q(h), attn.k(h), attn.v(h)))
        o = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v
        ref = ref + attn.proj(o.transpose(1, 2).reshape(2, 17, 32))
        h = F.layer_norm(ref, (32,), lv.norm2.weight, lv.norm2.bias, 1e-6)
        ref = ref + mlp.fc2(F.gelu(mlp.fc1(h)))
    with torch.no_grad():
        torch.testing.assert_close(m.forward_blocks(x), ref, rtol=1e-5, atol=1e-5)


def test_level_signals_are_eq_6_and_7_and_level_tokens_one_normalisation():
    torch.manual_seed(0)
    sig = LevelSignal(8, 8, 2)
    assert torch.count_nonzero(sig.up.weight) == 0
    torch.nn.init.normal_(sig.up.weight)
    lv = Level(8, 'lowrank', rank=2, dims=dict(q=(8, 8), k=(8, 8), v=(8, 8)))
    for s in lv.signals.values():
        torch.nn.init.normal_(s.up.weight)
    W = torch.nn.Linear(8, 8)
    x = torch.randn(3, 8)
    M = lv.signals['q'].up.weight @ lv.signals['q'].down.weight  # A Bᵀ, [d, d]
    torch.testing.assert_close(lv.project('q', W, x), W(x) + x @ M.T)  # Q_i = W_Q x + M_Qi x
    Mf = lv.signals['ffn'].up.weight @ lv.signals['ffn'].down.weight
    torch.testing.assert_close(lv.ffn(W, x), W(x + x @ Mf.T))  # FFN(x + M_F x)
    # level tokens: the shared Pattention with the level's tokens appended, tau unchanged
    shared = Pattention(8, 8, 6)
    keys, values = torch.randn(2, 8), torch.randn(2, 8)
    joined = Pattention(8, 8, 8, tau=shared.tau.item())
    with torch.no_grad():
        joined.key_param_tokens.copy_(torch.cat([shared.key_param_tokens, keys]))
        joined.value_param_tokens.copy_(torch.cat([shared.value_param_tokens, values]))
    torch.testing.assert_close(attend_with_level_tokens(shared, x, keys, values), joined(x))


@pytest.mark.parametrize('signal', ['lowrank', 'tokens'])
def test_growing_the_shared_tokens_with_zero_keys_is_exact_for_every_level(signal):
    torch.manual_seed(0)
    m = _perturb(timm.create_model('tokenformer_ring_vit_small_patch16_224', **TINY, num_tokens=16,
                                   level_signal=signal)).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        before = m.forward_intermediates(x, output_fmt='NLC')[1]
    counts = growth.token_counts(m)
    assert counts == dict(patch=16, qkv=16, proj=16, ffn=64)
    growth.grow(m, patch=4, qkv=8, proj=8, ffn=16)
    assert m.shared.attn.q.num_tokens == 24 and m.num_tokens_qkv == 24 and m.shared.ffn.num_tokens == 80
    with torch.no_grad():
        after = m.forward_intermediates(x, output_fmt='NLC')[1]
    for a, b in zip(before, after):
        assert (a - b).abs().max() < 1e-6


def test_grow_offline_and_during_training_and_load_through_timm(tmp_path):
    name = 'tokenformer_ring_vit_small_patch16_224'
    kw = dict(TINY, num_tokens=16, level_signal='tokens')
    cfg = fmnist_cfg(tmp_path, model=name, model_kwargs=kw, epochs=2, train_subset=256, val_subset=64,
                     growth=dict(every_epochs=1, add_tokens=dict(qkv=8, ffn=16)))
    from tkvision.engine.trainer import train
    res = train(cfg)
    assert growth.token_counts(res['model'])['qkv'] == 24 and growth.token_counts(res['model'])['ffn'] == 80
    path = os.path.join(cfg['output'], 'last.safetensors')
    grown = str(tmp_path / 'grown.safetensors')
    from tkvision.engine.checkpoint import grow_weights_file
    from tkvision.engine.config import load_config
    report = grow_weights_file(path, load_config(None, dict(model=name, model_kwargs=kw)), grown, add=dict(qkv=8))
    assert report['qkv'] == (24, 32)
    # timm's pretrained path loads our safetensors (the file's head size kept)
    m = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path),
                          **dict(kw, num_tokens_qkv=24, num_tokens_ffn=80)).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(m(x), res['model'].eval()(x))


def test_mean_attention_distance_equals_a_direct_computation():
    """On timm's ViT (fused qkv, [B, H, N, hd] layout) and on RingFormer (ours, per level)."""
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, in_chans=1, depth=2, num_classes=0).eval()
    x = torch.randn(3, 1, 32, 32)
    mad = mean_attention_distance(vit, x)
    assert mad.shape == (2, 3)
    # direct: recompute block 0's attention from its qkv projection
    with torch.no_grad():
        t = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        blk = vit.blocks[0]
        qkv = blk.attn.qkv(blk.norm1(t)).reshape(3, 17, 3, 3, 64).permute(2, 0, 3, 1, 4)
        a = torch.softmax(qkv[0] @ qkv[1].transpose(-1, -2) / 8.0, -1)[:, :, 1:, 1:]
    a = a / a.sum(-1, keepdim=True)
    pos = torch.tensor([(8.0 * (i // 4), 8.0 * (i % 4)) for i in range(16)])
    dist = torch.cdist(pos, pos)
    expect = (a * dist).sum(-1).mean(dim=(0, 2)).numpy()
    np.testing.assert_allclose(mad[0], expect, rtol=1e-5)
    assert (mad >= 0).all() and (mad <= math.hypot(24, 24)).all()
    ring = timm.create_model('ringformer_vit_small_patch16_224', **TINY)
    assert mean_attention_distance(ring, torch.randn(2, 1, 28, 28)).shape == (3, 2)  # one row per level


def test_attention_distance_tool_writes_the_plot(tmp_path):
    cfg = fmnist_cfg(tmp_path, model='ringformer_vit_small_patch16_224', model_kwargs=TINY, epochs=1,
                     train_subset=128, val_subset=64)
    from tkvision.engine.trainer import train
    train(cfg)
    import yaml
    cfg_path = str(tmp_path / 'c.yaml')
    with open(cfg_path, 'w') as f:
        yaml.safe_dump({k: cfg[k] for k in ('model', 'model_kwargs', 'output', 'rrc_scale', 'threads')}, f)
    out, js = str(tmp_path / 'mad.png'), str(tmp_path / 'mad.json')
    r = subprocess.run([sys.executable, '-m', 'studies.ringformer.attention_distance', '--config', cfg_path,
                        '--num-images', '32', '--out', out, '--json', js], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    import json
    values = json.load(open(js))['ringformer_vit_small_patch16_224']
    assert np.array(values).shape == (3, 2) and os.path.getsize(out) > 1000
