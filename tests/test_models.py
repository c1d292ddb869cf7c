"""The TokenFormer ViT family: parameter counts, init, and the behaviours timm's model tests check."""
import math

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

from tkvision.engine.checkpoint import load_fitting_weights, read_weights, save_weights
from tkvision.utils.errors import WeightsMismatchError
from tkvision.layers import PatchEmbed, Pattention
from tkvision.models import TokenFormerViT

VARIANTS = {  # name: (embed_dim, depth, n_qkv = n_proj = n_patch, n_ffn)
    'tokenformer_vit_ti16': (192, 12, 192, 768),
    'tokenformer_vit_s16': (384, 12, 384, 1536),
    'tokenformer_vit_b16': (768, 12, 768, 3072),
    'tokenformer_vit_b16_matched': (768, 12, 576, 2304),
    'tokenformer_vit_l16': (1024, 24, 1024, 4096),
    'tokenformer_vit_l16_matched': (1024, 24, 768, 3072),
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def formula(d, depth, n, n_ffn, classes=1000, patch=16, chans=3):
    """Each Pattention d_in -> d_out with n tokens has n (d_in + d_out) weights (reference README)."""
    blocks = depth * (4 * n * 2 * d + n_ffn * 2 * d)
    stem = n * (chans * patch * patch + d)
    return blocks + stem + d + 197 * d + 2 * d + d * classes + classes  # + cls, pos, final norm, head


def test_registered():
    assert set(timm.list_models('tokenformer_vit*')) == set(VARIANTS)
    assert set(timm.list_models('tokenformer_ring*')) == {f'tokenformer_ring_vit_{s}_patch16_224' for s in ('small', 'base', 'base_wide')}


@pytest.mark.parametrize('name', VARIANTS)
def test_param_count_matches_formula(name):
    with torch.device('meta'):
        model = timm.create_model(name)
    assert n_params(model) == formula(*VARIANTS[name])


def test_matched_variants_match_vit():
    with torch.device('meta'):
        for ours, theirs in (('tokenformer_vit_b16_matched', 'vit_base_patch16_224'),
                             ('tokenformer_vit_l16_matched', 'vit_large_patch16_224')):
            a, b = n_params(timm.create_model(ours)), n_params(timm.create_model(theirs))
            assert abs(a / b - 1) < 0.015, (ours, a, b)


def test_fashion_mnist_shape_kwargs():
    model = timm.create_model('tokenformer_vit_ti16', img_size=28, patch_size=4, in_chans=1, num_classes=10)
    assert model.patch_embed.grid_size == (7, 7)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_token_count_kwargs_and_norm_switches(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', **dict(tiny_kwargs, num_tokens_patch=5, num_tokens_qkv=6,
                                                         num_tokens_proj=7, num_tokens_ffn=9,
                                                         block_norm_weight=True, score_norm='softmax'))
    blk = m.blocks[0]
    assert (m.patch_embed.proj.num_tokens, blk.attn.q.num_tokens, blk.attn.proj.num_tokens, blk.ffn.num_tokens) == (5, 6, 7, 9)
    assert blk.norm1.weight is not None and blk.norm1.bias is None and blk.ffn.score_norm == 'softmax'
    plain = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    assert plain.blocks[0].norm1.weight is None and plain.norm.weight is not None  # final norm affine
    with pytest.raises(ValueError, match='block_norm_bias'):
        timm.create_model('tokenformer_vit_ti16', block_norm_bias=True, **tiny_kwargs)


def test_only_pattention_projections():
    """Patch embedding, Q/K/V, output projection and FFN are Pattentions; the head is the only Linear."""
    m = timm.create_model('tokenformer_vit_ti16', img_size=32, patch_size=8, depth=2)
    linears = [n for n, mod in m.named_modules() if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d))]
    assert linears == ['head']
    assert sum(isinstance(mod, Pattention) for mod in m.modules()) == 1 + 2 * 5


def test_init_stds():
    torch.manual_seed(0)
    m = timm.create_model('tokenformer_vit_s16', depth=4)
    d, depth = 384, 4
    blk = m.blocks[0]
    assert abs(blk.ffn.key_param_tokens.std().item() - 0.02) < 1e-3
    assert abs(blk.ffn.value_param_tokens.std().item() - 2 / (depth * math.sqrt(d))) < 1e-3
    assert abs(m.patch_embed.proj.value_param_tokens.std().item() - 0.02) < 1e-3
    assert abs(m.pos_embed.std().item() - 0.02) < 2e-3 and m.cls_token.abs().max() < 1e-4
    assert m.head.bias.abs().sum() == 0 and abs(m.head.weight.std().item() - 0.02) < 2e-3


@pytest.mark.parametrize('name', ['tokenformer_vit_ti16', 'tokenformer_ring_vit_small_patch16_224',
                                  'naflexvit_tokenformer_ti16'])
@pytest.mark.parametrize('set_std, kept_std', [('key_std', 'value_std'), ('value_std', 'key_std')])
def test_key_and_value_std_set_every_block_token_and_leave_the_stem(name, set_std, kept_std):
    """``key_std`` / ``value_std`` (levers of docs/comparison.md) reach the key / value tokens of Q, K, V, proj
    and FFN in every block, shared or not; the patch embedding keeps the public code's 0.02 and the other kind
    keeps its default (keys 0.02, values 2 / (depth √d))."""
    torch.manual_seed(0)
    m = timm.create_model(name, img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, num_tokens=192,
                          **{set_std: 0.2})
    default = dict(key_std=0.02, value_std=2 / (2 * math.sqrt(192)))
    for std_name, expected in ((set_std, 0.2), (kept_std, default[kept_std])):
        suffix = std_name.replace('_std', '_param_tokens')
        tokens = {n: p for n, p in m.named_parameters() if n.endswith(suffix) and n.startswith(('blocks', 'shared'))}
        assert len(tokens) == (5 if 'ring' in name else 10)
        for n, p in tokens.items():
            assert abs(p.std().item() - expected) < 0.05 * expected, n
    stem = m.embeds.proj if 'naflex' in name else m.patch_embed.proj
    assert abs(stem.weight.std().item() - 0.02) < 2e-3  # the stem's keys


@pytest.mark.parametrize('init', [dict(key_std=0.1), dict(value_std=0.1)])
def test_a_checkpoint_written_under_either_init_std_loads_into_the_other_with_the_same_outputs(init):
    """key_std and value_std are initialisations only (docs/comparison.md's levers): a model built with
    another std takes a checkpoint of the default one strictly and computes the same function, so making one
    a default would break no stored checkpoint."""
    kwargs = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=96, depth=2, num_heads=3, num_tokens=72, num_classes=10)
    torch.manual_seed(0)
    written = timm.create_model('tokenformer_vit_ti16', **kwargs).eval()
    other = timm.create_model('tokenformer_vit_ti16', **init, **kwargs).eval()
    tokens = 'key_param_tokens' if 'key_std' in init else 'value_param_tokens'
    assert not torch.equal(getattr(other.blocks[0].ffn, tokens), getattr(written.blocks[0].ffn, tokens))
    other.load_state_dict(written.state_dict(), strict=True)
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(other(x), written(x), rtol=0, atol=0)


def test_default_cfg_names_exist(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    cfg = m.pretrained_cfg
    modules = dict(m.named_modules())
    assert isinstance(modules[cfg['first_conv']], Pattention)
    assert cfg['classifier'] + '.weight' in m.state_dict()
    assert m.num_features == m.head_hidden_size == 32
    assert set(m.no_weight_decay()) <= set(n for n, _ in m.named_parameters())


def test_forward_features_head_and_classifier(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 17, 32)
    assert m.forward_head(feats, pre_logits=True).shape == (2, 32)
    torch.testing.assert_close(m.forward_head(feats), m(x))
    assert m.get_classifier() is m.head
    m.reset_classifier(3)
    assert m(x).shape == (2, 3)
    m.reset_classifier(0, 'avg')
    torch.testing.assert_close(m(x), feats[:, 1:].mean(1))


def test_global_pool_avg_uses_fc_norm(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', global_pool='avg', **tiny_kwargs).eval()
    assert isinstance(m.norm, torch.nn.Identity) and isinstance(m.fc_norm, torch.nn.LayerNorm)
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), m.fc_norm(feats[:, 1:].mean(1)))


def test_group_matcher_drives_layer_decay(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    opt = create_optimizer_v2(m, 'adamw', lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g['lr_scale'] for g in opt.param_groups})
    assert len(scales) == 4  # stem, 2 blocks, head/norm
    no_wd = {id(p) for g in opt.param_groups if g['weight_decay'] == 0 for p in g['params']}
    assert id(m.pos_embed) in no_wd and id(m.cls_token) in no_wd and id(m.head.bias) in no_wd
    assert id(m.blocks[0].ffn.key_param_tokens) not in no_wd


def test_forward_intermediates_and_prune(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    final, inter = m.forward_intermediates(x)
    assert len(inter) == 2 and inter[0].shape == (2, 32, 4, 4)
    torch.testing.assert_close(final, m.forward_features(x))
    nlc = m.forward_intermediates(x, indices=[0], output_fmt='NLC', intermediates_only=True)
    assert nlc[0].shape == (2, 16, 32)
    torch.testing.assert_close(nlc[0].transpose(1, 2).reshape(2, 32, 4, 4), inter[0])
    kept = m.prune_intermediate_layers([0])
    assert kept == [0] and len(m.blocks) == 1 and isinstance(m.head, torch.nn.Identity)


def test_features_only(tiny_kwargs):
    m = timm.create_model('tokenformer_vit_ti16', features_only=True, out_indices=(0, 1), **tiny_kwargs)
    feats = m(torch.randn(2, 3, 32, 32))
    assert [f.shape for f in feats] == [(2, 32, 4, 4)] * 2
    assert m.feature_info.channels() == [32, 32]


def test_dynamic_img_size(tiny_kwargs):
    """At the native size a dynamic_img_size model equals the fixed-size one with the same weights; at
    another size its position embedding is timm's bicubic resample of the native one. (This test used
    to compare the dynamic model with itself: ``load_state_dict(...) and m(...)``.)"""
    m = timm.create_model('tokenformer_vit_ti16', dynamic_img_size=True, **tiny_kwargs).eval()
    fixed = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    fixed.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(m.forward_features(x), fixed.forward_features(x), rtol=0, atol=0)
        assert m(torch.randn(1, 3, 48, 64)).shape == (1, 7)
        tokens = m.patch_embed(torch.randn(1, 3, 48, 64))
        resampled = timm.layers.resample_abs_pos_embed(m.pos_embed, new_size=(6, 8), old_size=(4, 4),
                                                       num_prefix_tokens=1)
        expected = torch.cat([m.cls_token, tokens], 1) + resampled
        torch.testing.assert_close(m._pos_embed(tokens, (6, 8)), expected)
    with pytest.raises(Exception, match='does not match'):
        fixed(torch.randn(1, 3, 48, 48))


def test_pretrained_needs_a_file(tiny_kwargs):
    with pytest.raises(RuntimeError, match='No pretrained weights are published'):
        timm.create_model('tokenformer_vit_ti16', pretrained=True, **tiny_kwargs)


@pytest.mark.parametrize('ext', ['safetensors', 'pth'])
def test_pretrained_from_local_file(tmp_path, tiny_kwargs, ext):
    torch.manual_seed(0)
    src = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    path = str(tmp_path / f'w.{ext}')
    if ext == 'safetensors':
        save_weights(src.state_dict(), path)
    else:
        torch.save({'model': src.state_dict(), 'epoch': 3}, path)
    m = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                          **tiny_kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(m(x), src(x))


def test_pretrained_resamples_pos_embed_and_adapts_channels(tmp_path, tiny_kwargs):
    src = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    path = str(tmp_path / 'w.safetensors')
    save_weights(src.state_dict(), path)
    kw = dict(tiny_kwargs, img_size=48, in_chans=1)
    m = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=path), **kw)
    assert m.pos_embed.shape == (1, 37, 32)
    # grey = sum of the RGB filters (timm's adapt_input_conv on first_conv = patch_embed.proj)
    k_src = src.patch_embed.proj.weight.sum(1, keepdim=True)
    torch.testing.assert_close(m.patch_embed.proj.weight.detach(), k_src.detach())


def test_first_release_checkpoints_still_load(tmp_path, tiny_kwargs):
    """The first release stored the stem's key tokens as patch_embed.proj.key_param_tokens [n, C*p*p]."""
    src = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    state = src.state_dict()
    w = state.pop('patch_embed.proj.weight')
    state['patch_embed.proj.key_param_tokens'] = w.reshape(w.shape[0], -1)
    path = str(tmp_path / 'old.safetensors')
    save_weights(state, path)
    x = torch.randn(2, 3, 32, 32)
    m = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                          **tiny_kwargs).eval()
    torch.testing.assert_close(m(x), src(x))
    m2 = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs).eval()
    load_fitting_weights(m2, read_weights(path), path)
    torch.testing.assert_close(m2(x), src(x))


def test_mismatched_weights_name_the_tensors(tmp_path, tiny_kwargs):
    src = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    path = str(tmp_path / 'w.safetensors')
    save_weights(src.state_dict(), path)
    # more FFN tokens than the file (no growth makes it fit) and another head
    other = timm.create_model('tokenformer_vit_ti16', **dict(tiny_kwargs, num_tokens_ffn=80, num_classes=5))
    with pytest.raises(WeightsMismatchError) as e:
        load_fitting_weights(other, read_weights(path), path)
    msg = str(e.value)
    assert 'blocks.0.ffn.key_param_tokens: checkpoint (64, 32) vs model (80, 32)' in msg and 'head.weight' in msg
    assert path in msg


def test_is_a_tokenformer(tiny_kwargs):
    assert isinstance(timm.create_model('tokenformer_vit_ti16', **tiny_kwargs), TokenFormerViT)


def test_grown_trained_model_round_trips_through_local_dir(tmp_path):
    """Train with growth, export (EMA and raw) as timm's save_for_hf folder, reload with local-dir:."""
    from tests.helpers import fmnist_cfg
    from tkvision.engine import trainer as train_mod
    from tkvision.engine.export import export_checkpoint
    g = dict(every_epochs=1, add_tokens=dict(qkv=8, ffn=16))
    res = train_mod.train(fmnist_cfg(tmp_path, epochs=2, growth=g, model_ema=True, model_ema_decay=0.5))
    ckpt_path = str(tmp_path / 'run' / 'last.pth')
    x = torch.randn(3, 1, 28, 28)
    state = torch.load(ckpt_path, weights_only=True)
    for use_ema, key in ((True, 'model_ema'), (False, 'model')):
        out = str(tmp_path / f'export_{key}')
        info = export_checkpoint(ckpt_path, out, use_ema=use_ema)
        assert info['source'] == ('ema' if use_ema else 'model') and info['token_counts']['qkv'] == 24
        m = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
        assert growth_counts(m) == dict(patch=16, qkv=24, proj=16, ffn=80) and m.num_classes == 10
        ref = res['model'].__class__  # same family
        assert isinstance(m, ref)
        for k, v in state[key].items():
            assert torch.equal(m.state_dict()[k], v), k
    # timm's checkpoint_path loads our safetensors for a model built at that size
    m = timm.create_model('tokenformer_vit_ti16', checkpoint_path=str(tmp_path / 'run' / 'best.safetensors'),
                          num_classes=10, **dict(TINY_FMNIST_GROWN))
    assert torch.isfinite(m.eval()(x)).all()


def growth_counts(m):
    from tkvision.growth import token_counts
    return token_counts(m)


TINY_FMNIST_GROWN = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_tokens=16,
                         num_tokens_qkv=24, num_tokens_ffn=80)


def test_the_stem_takes_a_patch_size_as_timm_gives_it():
    """timm's stems take ``patch_size=(16, 16)``; ``tkvision.layers.PatchEmbed`` multiplied the tuple into its key
    size and failed. A square pair is the int (same keys, same tokens); a patch that is not square is refused by name
    (the key tokens are square filters)."""
    torch.manual_seed(0)
    as_int = PatchEmbed(32, 8, in_chans=3, embed_dim=16, num_tokens=8)
    torch.manual_seed(0)
    as_pair = PatchEmbed(32, (8, 8), in_chans=3, embed_dim=16, num_tokens=8)
    assert as_pair.patch_size == (8, 8) and as_pair.grid_size == (4, 4) and as_pair.num_patches == 16
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(as_pair(x), as_int(x))
    with pytest.raises(ValueError, match=r'patch_size \(8, 4\): a TokenFormer stem takes square patches'):
        PatchEmbed(32, (8, 4), in_chans=3, embed_dim=16, num_tokens=8)
