"""The benchmark's arithmetic: FLOPs per image against the analytic count, ratios against the counterpart."""
import pytest

from tkvision.experiments.benchmark import COUNTERPARTS, benchmark_models


def tokenformer_infer_flops(d=192, depth=12, n=192, n_ffn=768, tokens=197, patches=196, patch_dim=768, classes=1000):
    """2 FLOPs per multiply-add: each Pattention costs 2 T n (d_in + d_out); attention 4 T^2 d (QK^T and AV)."""
    stem = 2 * patches * n * (patch_dim + d)
    block = 2 * tokens * (4 * n * 2 * d + n_ffn * 2 * d) + 4 * tokens ** 2 * d
    return stem + depth * block + 2 * d * classes


def test_flops_and_ratio():
    rows = benchmark_models(['tokenformer_vit_ti16', 'vit_tiny_patch16_224'], modes=('infer',), batch_size=2,
                            warmup=1, steps=1, repeats=2, memory=False, log=lambda *_: None)
    ours, vit = rows
    assert ours['gflops_per_img'] * 1e9 == pytest.approx(tokenformer_infer_flops(), rel=1e-6)
    assert ours['ratio'] == pytest.approx(ours['img_per_s'] / vit['img_per_s'])
    assert ours['tflops_per_s'] == pytest.approx(ours['gflops_per_img'] * ours['img_per_s'] / 1e3)
    assert 'ratio' not in vit and COUNTERPARTS['tokenformer_vit_ti16'] == 'vit_tiny_patch16_224'


def test_profile_breakdown_accounts_for_the_step():
    from tkvision.experiments.benchmark import profile_breakdown
    rows = profile_breakdown(['tokenformer_vit_ti16'], batch_size=1, log=lambda *_: None)
    shares = {r['category']: r['share'] for r in rows}
    assert abs(sum(shares.values()) - 1) < 1e-6
    assert max(shares, key=shares.get) == 'matmul'  # Pattention's two matmuls dominate, as in a Linear
    assert shares.get('score normalisation / GELU', 0) > 0


def test_saved_activations_lean_path_keeps_less():
    """The lean backward keeps one [T, n] tensor per Pattention instead of three (pattention_memory.py)."""
    import timm
    import torch

    from tkvision.experiments.benchmark import saved_activation_mib
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_tokens=128)
    x = torch.randn(4, 3, 32, 32)
    mib = {}
    for lean in (False, True):
        m = timm.create_model('tokenformer_vit_ti16', **kw)
        for mod in m.modules():
            if hasattr(mod, 'lean_backward'):
                mod.lean_backward = lean
        mib[lean] = saved_activation_mib(m, x)
    scores = 4 * 17 * (128 * 4 + 512) * 2 * 4 / 2 ** 20  # [B*N, n] fp32 per Pattention of 2 blocks
    assert mib[False] - mib[True] == pytest.approx(2 * scores, rel=0.1)


def test_model_spec_options_reach_the_model_and_keep_the_counterpart():
    from tkvision.experiments.benchmark import COUNTERPARTS, parse_model_spec
    assert parse_model_spec('tokenformer_vit_b16_matched@fused_qkv=true@depth=2') == (
        'tokenformer_vit_b16_matched', dict(fused_qkv=True, depth=2))
    assert 'tokenformer_vit_b16_matched' in COUNTERPARTS
    with pytest.raises(ValueError, match='key=value'):
        parse_model_spec('tokenformer_vit_b16_matched@fused_qkv')
