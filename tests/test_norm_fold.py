"""The LayerNorm fold (``block_norm_fold``, ``tkvision/layers/block.py``): with a scale-invariant Θ a block's
LayerNorm without bias moves into the keys of the Pattentions it feeds. Each test holds the folded model to the
same model with explicit LayerNorms (``block_norm_fold=False``, the reference) in float64: logits and the
gradient of every parameter, for both families, at an elastic prefix, after growth, and with a learnable
LayerNorm weight; and that the fold leaves the explicit norm in place where it would not be exact."""
import pytest
import timm
import torch

from tkvision import growth
from tkvision.growth import elastic
from tkvision.layers import SCORE_NORMS, Block
from tkvision.models import create_mae

KW = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=24, depth=2, num_heads=3, num_tokens=12, num_classes=10)
NAFLEX = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, num_tokens=12, num_classes=10)


def _pair(family: str, **kwargs):
    """The folded model and the explicit-LayerNorm one with the same float64 parameters; the LayerNorm weights,
    if any, drawn away from their init of ones so that their gradient is tested too."""
    torch.manual_seed(0)
    folded = timm.create_model(family, **kwargs).double()
    with torch.no_grad():
        for name, p in folded.named_parameters():
            if '.norm' in name and name.endswith('weight'):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    explicit = timm.create_model(family, block_norm_fold=False, **kwargs).double()
    explicit.load_state_dict(folded.state_dict())
    return folded, explicit


def _logits_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    logits = model(x)
    (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_same_function_and_gradients(folded, explicit, x):
    logits, grads = _logits_and_grads(folded, x)
    ref_logits, ref_grads = _logits_and_grads(explicit, x)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def _images(in_chans=1, size=28):
    return torch.randn(3, in_chans, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize('options', [{}, dict(block_norm_weight=True), dict(score_norm='l1_norm_gelu'),
                                     dict(qk_norm=True, init_values=0.1)])
def test_the_fold_gives_the_explicit_layernorms_logits_and_gradients(options):
    folded, explicit = _pair('tokenformer_vit_ti16', **KW, **options)
    assert all(block.norm_fold for block in folded.blocks) and not any(b.norm_fold for b in explicit.blocks)
    assert_same_function_and_gradients(folded, explicit, _images())


def test_the_fold_is_exact_in_the_naflex_family_on_padded_patch_batches():
    folded, explicit = _pair('naflexvit_tokenformer_ti16', **NAFLEX)
    images = _images(3, 32)
    patches = images.unfold(2, 8, 8).unfold(3, 8, 8).permute(0, 2, 3, 4, 5, 1).reshape(3, 16, 8 * 8 * 3)
    coord = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing='ij'), -1).reshape(1, 16, 2)
    valid = torch.ones(3, 16, dtype=torch.bool)
    valid[1, 9:] = False  # a shorter image, padded
    batch = dict(patches=patches, patch_coord=coord.expand(3, -1, -1), patch_valid=valid)
    assert all(block.norm_fold for block in folded.blocks)
    assert_same_function_and_gradients(folded, explicit, batch)


@pytest.mark.parametrize('prefix', [0.5, [0.25, 1.0]])
def test_the_fold_is_exact_at_an_elastic_prefix(prefix):
    folded, explicit = _pair('tokenformer_vit_ti16', **KW, block_norm_weight=True)
    x = _images()
    with elastic.prefix(folded, prefix), elastic.prefix(explicit, prefix):
        assert_same_function_and_gradients(folded, explicit, x)


def test_the_fold_is_exact_after_growth_and_the_grown_model_keeps_its_function():
    folded, explicit = _pair('tokenformer_vit_ti16', **KW)
    x = _images()
    with torch.no_grad():
        before = folded(x)
    for model in (folded, explicit):
        growth.grow(model, patch=4, qkv=4, proj=4, ffn=8)
    explicit.load_state_dict(folded.state_dict())  # the new value tokens are random draws
    with torch.no_grad():
        torch.testing.assert_close(folded(x), before, rtol=1e-10, atol=1e-12)
    assert_same_function_and_gradients(folded, explicit, x)


def test_the_fold_is_exact_in_the_mae_decoder_and_encoder():
    def mae(fold):
        torch.manual_seed(0)
        return create_mae('tokenformer_vit_ti16', decoder=dict(embed_dim=12, depth=1, num_heads=2), num_tokens=8,
                          img_size=28, patch_size=7, in_chans=1, embed_dim=24, depth=2, num_heads=3,
                          block_norm_fold=fold).double()
    folded, explicit = mae(True), mae(False)
    for block in explicit.decoder.blocks:  # the decoder's blocks fold by default; build the reference's explicit
        block.norm_fold = False
        for layer in (block.attn.q, block.attn.k, block.attn.v, block.ffn):
            layer.centre_keys = False
    explicit.load_state_dict(folded.state_dict())
    x, noise = _images(), torch.rand(3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    losses = []
    for model in (folded, explicit):
        model.zero_grad(set_to_none=True)
        loss = model(x, 0.75, noise)[0]
        loss.backward()
        losses.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(losses[0][0], losses[1][0], rtol=1e-10, atol=1e-12)
    for name, grad in losses[0][1].items():
        torch.testing.assert_close(grad, losses[1][1][name], rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize('score_norm, bias', [('gelu_l2_norm', False), ('softmax', False), ('l2_norm_gelu', True)])
def test_where_the_fold_is_not_exact_the_block_keeps_its_explicit_layernorm(score_norm, bias):
    block = Block(24, 3, 8, 8, 16, score_norm=score_norm, norm_weight=bias, norm_bias=bias).double()
    assert not block.norm_fold and not block.ffn.centre_keys
    assert SCORE_NORMS[score_norm].scale_invariant != (score_norm != 'l2_norm_gelu')
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    h = x + block.attn(torch.nn.functional.layer_norm(x, (24,), block.norm1.weight, block.norm1.bias, 1e-5))
    expected = h + block.ffn(torch.nn.functional.layer_norm(h, (24,), block.norm2.weight, block.norm2.bias, 1e-5))
    torch.testing.assert_close(block(x), expected)


def test_a_checkpoint_loads_either_way_and_torchscript_runs_the_fold():
    folded, _ = _pair('tokenformer_vit_ti16', **KW)
    explicit = timm.create_model('tokenformer_vit_ti16', block_norm_fold=False, **KW).double()
    assert explicit.load_state_dict(folded.state_dict(), strict=True)
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(folded.eval())(x), explicit.eval()(x), rtol=1e-10, atol=1e-12)
