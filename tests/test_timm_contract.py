"""timm's model contract (the checks of timm's own tests/test_models.py that apply to a ViT), run over
every registered variant of the three families (TokenFormer, RingFormer, Ring x Token) at its real
width, heads and token counts, with 2 blocks (levels) and 64 px inputs to keep the suite fast. Our own
test code, written from reading timm's. TorchScript: the TokenFormer family only (the recurrent
families pass a level module to the shared block, which TorchScript cannot script)."""
import pytest
import timm
import torch

import tkvision  # noqa: F401  (registers the models)

TOKENFORMER = timm.list_models('tokenformer_vit*')
RECURRENT = timm.list_models('ringformer_vit*') + timm.list_models('tokenformer_ring_vit*')
VARIANTS = TOKENFORMER + RECURRENT
SMALL = dict(depth=2, img_size=64)


def _model(name, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **dict(SMALL, **kw))


def test_every_variant_is_covered():
    assert len(TOKENFORMER) >= 6 and 'tokenformer_vit_b16_matched' in TOKENFORMER
    assert len(RECURRENT) == 6 and 'tokenformer_ring_vit_base_patch16_224' in RECURRENT


@pytest.mark.parametrize('name', VARIANTS)
def test_default_cfg_forward_features_head_and_classifier(name):
    m = _model(name).eval()
    cfg, state = m.pretrained_cfg, m.state_dict()
    assert cfg['first_conv'] + '.weight' in state and cfg['classifier'] + '.weight' in state
    assert state[cfg['first_conv'] + '.weight'].ndim == 4  # a conv filter bank [n, C, p, p]
    assert state[cfg['classifier'] + '.weight'].shape[0] == cfg['num_classes'] == m.num_classes
    x = torch.randn(2, 3, 64, 64)
    feats = m.forward_features(x)
    assert feats.shape == (2, m.num_prefix_tokens + 16, m.num_features)
    assert m.forward_head(feats, pre_logits=True).shape == (2, m.head_hidden_size)
    out = m(x)
    assert out.shape == (2, cfg['num_classes']) and torch.isfinite(out).all()
    m.reset_classifier(0)
    assert m(x).shape == (2, m.num_features)


@pytest.mark.parametrize('name', VARIANTS)
def test_backward_reaches_every_parameter_and_checkpointing_is_equal(name):
    m = _model(name)
    x = torch.randn(2, 3, 64, 64)
    out = m(x)
    out.sum().backward()
    assert not [n for n, p in m.named_parameters() if p.grad is None and p.requires_grad]
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    m.zero_grad()
    m.set_grad_checkpointing(True)
    out2 = m(x)
    out2.sum().backward()
    torch.testing.assert_close(out2, out)
    for n, g in grads.items():
        torch.testing.assert_close(m.get_parameter(n).grad, g, msg=n)
    if name in RECURRENT:
        m.set_grad_checkpointing(True)
        m.reset_classifier(0)  # per-level intermediates under checkpointing equal the plain ones
        _, inter = m.forward_intermediates(x)
        m.set_grad_checkpointing(False)
        for a, b in zip(inter, m.forward_intermediates(x)[1]):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize('name', VARIANTS)
def test_features_only_and_intermediates(name):
    m = _model(name).eval()
    x = torch.randn(2, 3, 64, 64)
    final, inter = m.forward_intermediates(x)
    assert len(inter) == 2 and inter[-1].shape == (2, m.embed_dim, 4, 4)
    torch.testing.assert_close(final, m.forward_features(x))
    fm = _model(name, features_only=True, out_indices=(0, 1)).eval()
    fm.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith(('head', 'norm', 'fc_norm'))},
                       strict=False)
    feats = fm(x)
    assert [f.shape for f in feats] == [(2, m.embed_dim, 4, 4)] * 2
    assert fm.feature_info.channels() == [m.embed_dim] * 2


@pytest.mark.parametrize('name', VARIANTS)
def test_torchscript_or_torch_export_and_fx_equal_eager(name):
    """TorchScript for the TokenFormer family; ``torch.export`` (TorchScript's successor) for the
    recurrent families, which TorchScript cannot script (a level module is an argument of the shared
    block) and which ``tools/timm_upstream_tests.py`` excludes from timm's TorchScript test as timm
    excludes its own such models (``EXCLUDE_JIT_FILTERS``). The exported program also runs at another
    batch size (a dynamic batch dimension)."""
    m = _model(name).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = m(x)
        if name in TOKENFORMER:
            torch.testing.assert_close(torch.jit.script(m)(x), ref)
        else:
            batch = torch.export.Dim('batch', min=1, max=64)
            exported = torch.export.export(m, (x,), dynamic_shapes=({0: batch},)).module()
            torch.testing.assert_close(exported(x), ref)
            x3 = torch.randn(3, 3, 64, 64)
            torch.testing.assert_close(exported(x3), m(x3))
        torch.testing.assert_close(torch.fx.symbolic_trace(m)(x), ref)


def test_in_chans_adaptation_through_timms_loader(tmp_path):
    """timm's pretrained path adapts first_conv + '.weight' itself when in_chans differs."""
    from tkvision.engine.checkpoint import save_weights
    src = _model('tokenformer_vit_s16')
    path = str(tmp_path / 'w.safetensors')
    save_weights(src.state_dict(), path)
    grey = timm.create_model('tokenformer_vit_s16', pretrained=True, in_chans=1,
                             pretrained_cfg_overlay=dict(file=path), **SMALL)
    torch.testing.assert_close(grey.patch_embed.proj.weight, src.patch_embed.proj.weight.sum(1, keepdim=True))
    assert grey(torch.randn(1, 1, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize('backward_mode', ['closed_form', 'lean'])
def test_compile_fullgraph_forward_and_backward(backward_mode):
    """torch.compile captures the whole model, forward and backward, in one graph (no graph break);
    aot_eager runs the captured graphs without code generation, so the test stays fast on CPU."""
    import torch._dynamo
    torch._dynamo.reset()
    m = _model('tokenformer_vit_ti16', embed_dim=64, num_heads=2, num_tokens=16)
    tkvision.layers.set_backward_mode(m, backward_mode)
    x = torch.randn(2, 3, 64, 64)
    ref = m(x)
    ref.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    out = torch.compile(m, fullgraph=True, backend='aot_eager')(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], msg=n)


@pytest.mark.parametrize('name', VARIANTS)
def test_onnx_export_matches_eager(name, tmp_path):
    """torch.onnx.export (dynamo exporter) of every variant, run by onnxruntime, equals eager within 1e-4."""
    ort = pytest.importorskip('onnxruntime', reason='onnxruntime is in the test extra: pip install -e ".[test]"')
    pytest.importorskip('onnxscript', reason='the dynamo ONNX exporter needs onnxscript (test extra)')
    import warnings
    m = _model(name).eval()
    x = torch.randn(2, 3, 64, 64)
    path = str(tmp_path / 'model.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m, (x,), dynamo=True, verbose=False).save(path)
    sess = ort.InferenceSession(path)
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), m(x).detach(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('name', VARIANTS)
def test_no_weight_decay_names_parameters_only(name):
    """timm's contract (its ``_assert_model_api_contract``): every ``no_weight_decay()`` entry is a
    parameter; the recurrent families' fixed sin-cos table is a buffer and is not listed (it was, and
    timm's upstream test failed on it)."""
    m = _model(name)
    assert set(m.no_weight_decay()) <= {n for n, _ in m.named_parameters()}
    assert ('pos_embed' in m.no_weight_decay()) == isinstance(m.pos_embed, torch.nn.Parameter)


@pytest.mark.parametrize('name', ['tokenformer_vit_s16', 'ringformer_vit_small_patch16_224',
                                  'tokenformer_ring_vit_small_patch16_224'])
def test_timms_factory_device_and_dtype(name):
    """``create_model(..., device=, dtype=)`` (timm's factory arguments) puts every parameter and
    buffer there; ``reset_classifier`` keeps the model's device, dtype and eval mode."""
    m = timm.create_model(name, device='meta', dtype=torch.bfloat16, **SMALL).eval()
    tensors = [*m.named_parameters(), *m.named_buffers()]
    assert {t.device.type for _, t in tensors} == {'meta'}
    assert {t.dtype for _, t in m.named_parameters()} == {torch.bfloat16}
    m.to(dtype=torch.float64)
    m.reset_classifier(3)
    assert m.head.weight.device.type == 'meta' and m.head.weight.dtype == torch.float64 and not m.head.training
    with pytest.raises(TypeError):
        timm.create_model(name, device='meta', not_a_model_arg=1)
