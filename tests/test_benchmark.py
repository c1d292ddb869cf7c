"""The benchmark's arithmetic: FLOPs per image against the analytic count, ratios against the counterpart."""
import os
import pytest
import torch

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
    from tkvision.experiments.profile import profile_breakdown
    rows = profile_breakdown(['tokenformer_vit_ti16'], batch_size=1, log=lambda *_: None)
    shares = {r['category']: r['share'] for r in rows}
    assert abs(sum(shares.values()) - 1) < 1e-6
    assert max(shares, key=shares.get) == 'matmul'  # Pattention's two matmuls dominate, as in a Linear
    assert shares.get('score normalisation / GELU', 0) > 0


def test_saved_activations_of_each_backward_path():
    """Per Pattention, plain autograd keeps three [T, n] tensors (A, Z, S), the closed form two (Z, S), the
    lean backward one (A) (pattention_autograd.py)."""
    import timm
    import torch

    from tkvision.experiments.benchmark import saved_activation_mib
    from tkvision.layers import set_backward_mode
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_tokens=128)
    x = torch.randn(4, 3, 32, 32)
    mib = {}
    for path in ('autograd', 'closed_form', 'lean'):
        m = timm.create_model('tokenformer_vit_ti16', **kw)
        set_backward_mode(m, path)
        mib[path] = saved_activation_mib(m, x)
    scores = 4 * 17 * (128 * 4 + 512) * 2 * 4 / 2 ** 20  # [B*N, n] fp32 per Pattention of 2 blocks
    assert mib['autograd'] - mib['closed_form'] == pytest.approx(scores, rel=0.1)
    assert mib['autograd'] - mib['lean'] == pytest.approx(2 * scores, rel=0.1)


def test_counting_saved_activations_frees_the_graph():
    """Measuring a model's saved activations must not keep its forward graph alive: a pack hook that
    returned the op's own output closed a cycle through C++ (output -> grad_fn -> packed output) that
    Python's gc cannot free, so each measurement leaked a graph, and on the H200 the report's later parts
    ran out of its 139 GiB."""
    import gc
    import weakref

    import timm
    import torch

    from tkvision.experiments.benchmark import saved_activation_mib
    m = timm.create_model('tokenformer_vit_ti16', img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                          num_tokens=16)
    outputs = []  # weak references to every module's output: a leaked graph keeps those it saved alive
    for module in m.modules():
        module.register_forward_hook(lambda mod, args, out: outputs.append(weakref.ref(out)))
    x = torch.randn(2, 3, 32, 32)
    for amp in (None, torch.bfloat16):
        assert saved_activation_mib(m, x, amp) > 0
    gc.collect()
    assert len(outputs) > 20 and not [r for r in outputs if r() is not None]


def test_a_gpu_profile_counts_each_kernel_once():
    """On a GPU the profiler lists each kernel twice: inside the operator that launched it (its
    ``self_device_time_total``) and as an event of its own. The H200 report of 2026-11-27 summed both,
    so its step came to 2.2x the step and 'other' (the kernel events) to 64%. Only operators count."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from tkvision.experiments.profile import category_ms

    def event(key, device_type, device_us, cpu_us):
        return SimpleNamespace(key=key, device_type=device_type, self_device_time_total=device_us,
                               self_cpu_time_total=cpu_us)
    events = [event('aten::mm', DeviceType.CPU, 3000, 50), event('nvjet_hsh_128x256_gemm', DeviceType.CUDA, 3000, 0),
              event('aten::gelu', DeviceType.CPU, 1000, 20), event('vectorized_elementwise_kernel', DeviceType.CUDA,
                                                                   1000, 0)]
    assert category_ms(events, on_gpu=True, steps=2) == {'matmul': 1.5, 'score normalisation / GELU': 0.5}
    assert category_ms(events, on_gpu=False, steps=1) == {'matmul': 0.05, 'other': 0.0,
                                                          'score normalisation / GELU': 0.02}


def test_ratios_against_a_reference_are_paired_per_round(monkeypatch):
    """``--reference``: each round's ratio is taken within the round, so a machine that slows down between
    rounds does not bias it: a model 2x faster in every round of a drifting clock is 2.0x in each."""
    import torch

    from tkvision.experiments import benchmark as bench
    clock = iter([0, 1, 1, 1.5,  10, 14, 14, 16,  20, 20.5, 20.5, 20.75])  # rounds: A=1, B=0.5; 4, 2; 0.5, 0.25
    monkeypatch.setattr(bench.time, 'perf_counter', lambda: next(clock))
    monkeypatch.setattr(bench, 'ModelStep', lambda name, *a: type('S', (), dict(
        name=name, params=1, model=torch.nn.Linear(1, 1), x=None, amp=None, flops_per_image=lambda self: 1.,
        __call__=lambda self: None))())
    rows = bench.benchmark_models(['a', 'b'], modes=('infer',), batch_size=1, warmup=0, steps=1, repeats=3,
                                  memory=False, reference='a')
    assert [r['ratio'] for r in rows] == [1.0, 2.0] and rows[1]['ratio_runs'] == '2.000 2.000 2.000'
    with pytest.raises(ValueError, match='--reference c is not one of --models'):
        bench.benchmark_models(['a', 'b'], modes=('infer',), reference='c')


def test_model_spec_options_reach_the_model_and_keep_the_counterpart():
    from tkvision.experiments.benchmark import COUNTERPARTS, parse_model_spec
    assert parse_model_spec('tokenformer_vit_b16_matched@qk_norm=true@depth=2') == (
        'tokenformer_vit_b16_matched', dict(qk_norm=True, depth=2))
    assert 'tokenformer_vit_b16_matched' in COUNTERPARTS
    with pytest.raises(ValueError, match='key=value'):
        parse_model_spec('tokenformer_vit_b16_matched@qk_norm')


def test_a_cpu_training_benchmark_that_cannot_fit_is_refused_before_it_runs(monkeypatch):
    """B/16 training at batch 32 peaked at 13.5 GB RSS with no warning; on a smaller machine
    the kernel kills it without a word. The estimate is refused, naming the figures and the fix, before
    a step runs; above half of what is available it warns."""
    import torch

    from tkvision.experiments import benchmark as bench
    from tkvision.utils.errors import UsageError
    tiny = 'tokenformer_vit_ti16@img_size=32@patch_size=8@embed_dim=32@depth=2@num_heads=2@num_tokens=16'
    steps = []
    monkeypatch.setattr(bench.ModelStep, '__call__', lambda self: steps.append(1))
    monkeypatch.setattr(bench, 'available_memory_mib', lambda: 0.5)
    with pytest.raises(UsageError, match=r'batch 8 needs about .* GiB .* available: lower --batch-size'):
        bench.benchmark_models([tiny], modes=('train',), batch_size=8, memory=False)
    assert steps == []
    runner = bench.ModelStep(tiny, 'train', 8, torch.device('cpu'), None, False)
    monkeypatch.setattr(bench, 'available_memory_mib', lambda: float('inf'))
    need = bench.check_train_memory([runner], 8, log=lambda m: None)
    warned = []
    monkeypatch.setattr(bench, 'available_memory_mib', lambda: need * 1.5)
    bench.check_train_memory([runner], 8, log=warned.append)
    assert warned and warned[0].startswith('warning: the CPU training benchmark at batch 8')
    # the estimate: 4 float32 copies of the parameters + twice the activations, from a batch-1 forward
    params = sum(p.numel() for p in runner.model.parameters())
    assert need == pytest.approx(16 * params / 2 ** 20 + 2 * 8 * bench.saved_activation_mib(runner.model, runner.x[:1]))


def test_score_norm_benchmark_times_eq5_and_gelu():
    """The score-normalisation benchmark times what its rows name: every Θ variant computes Eq. 5,
    GELU(A · √n / ‖A‖₂), and its gradient, against float64 math written out here, and the first variant is
    the erf GELU; its ratios are paired per round against that GELU."""
    import math

    import torch

    from studies.performance.layer_benchmark import benchmark_score_norm, score_norm_variants
    n = 9
    a = torch.randn(5, n, dtype=torch.float64)
    grad = torch.randn(5, n, dtype=torch.float64)

    def gelu(x):
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    def eq5(x):
        return gelu(x * math.sqrt(n) / x.norm(dim=-1, keepdim=True))

    variants = score_norm_variants(n, compile_=False)
    assert len(variants) == 3
    for (name, fn), reference in zip(variants.items(), (gelu, eq5, eq5)):
        x = a.float().requires_grad_()
        fn(x).backward(grad.float())
        x64 = a.clone().requires_grad_()
        expected = reference(x64)
        expected.backward(grad)
        torch.testing.assert_close(fn(a.float()).double(), expected.detach(), rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-5, msg=name)
    rows = benchmark_score_norm(tokens=8, num_tokens=n, steps=1, repeats=3, compile_=False, log=lambda *_: None)
    assert rows[0]['vs_gelu'] == 1.0 and rows[0]['ratio_runs'] == '1.000 1.000 1.000'
    assert [r['variant'] for r in rows] == list(variants)


def test_the_loader_comparison_is_like_for_like_and_pairs_the_rounds(tmp_path, monkeypatch):
    """``--parts loader``: our loader and timm's ``create_loader`` (with its default prefetcher, and without)
    read the same JPEG folder with the ImageNet recipe's 224 px crops, one pass each (every image once), and
    all three deliver normalised float32 batches: ours and timm's prefetching loader normalise uint8 batches on
    the device, timm's without the prefetcher in its workers. The reported ratio is the median of the per-round
    ratios against timm's prefetching loader."""
    import statistics

    from studies.performance import data_benchmark as bench
    root = bench.make_jpeg_folder(str(tmp_path / 'jpeg'), n_images=24, classes=2, size=(250, 188))
    cfg = bench.resolve_run_config(bench.load_config(
        bench._RECIPE, dict(data_dir=root, batch_size=8, model='tokenformer_vit_b16'))).to_dict()
    for name, build in bench.LOADERS.items():
        batches = list(build(root, cfg, 0))
        assert sum(len(b[0]) for b in batches) == 24, name
        assert all(b[0].shape[1:] == (3, 224, 224) and b[0].dtype == torch.float32 for b in batches), name
        assert -3 < float(batches[0][0].mean()) < 3, name  # normalised, not 0..255
    rates = iter([300.0, 100.0, 150.0, 200.0, 100.0, 50.0, 500.0, 100.0, 250.0])  # ours, timm, timm (no prefetcher)
    monkeypatch.setattr(bench, '_epoch_rate', lambda loader, warm_batches: next(rates))
    ours, timm, unprefetched = bench.benchmark_loaders(root, workers=(1,), repeats=3, log=lambda *a: None)
    assert ours['loader'] == 'tkvision' and ours['vs_timm'] == statistics.median([3.0, 2.0, 5.0]) == 3.0
    assert ours['vs_timm_no_prefetcher'] == statistics.median([2.0, 4.0, 2.0]) == 2.0
    assert ours['img_per_s'] == 300.0 and timm['img_per_s'] == 100.0 and ours['ratio_runs'] == '3.000 2.000 5.000'
    assert unprefetched['loader'] == 'timm (no prefetcher)' and 'Pillow' in timm['resize'] and 'OpenCV' in ours['resize']


@pytest.mark.parametrize('module, call', [
    ('studies.performance.trainer_vs_timm',
     lambda m, tmp: m.ours('tokenformer_vit_ti16', str(tmp), str(tmp / 'o'), 1, 1)),
    ('studies.naflex.naflex_timm_train',
     lambda m, tmp: m.run_one(str(tmp), str(tmp), 'naflexvit_tokenformer_ti16', 0, 1, str(tmp / 'o'))),
])
def test_the_timm_comparisons_run_their_commands_from_the_repository_root(module, call, tmp_path, monkeypatch):
    """The studies that train with our trainer and with timm's ``train.py`` start each in the repository's
    root, from any current folder, so ``tools/train.py`` and ``-m tkvision.cli.timm_script`` resolve (after
    the move to ``studies/<study>/`` they ran in ``studies/``, where neither exists)."""
    import importlib
    import os

    class Started(Exception):
        pass

    def run(cmd, cwd=None, **kwargs):
        script = cmd[1] if cmd[1] != '-m' else cmd[2].replace('.', os.sep) + '.py'
        assert os.path.isfile(os.path.join(cwd, script)), (cwd, script)
        raise Started

    study = importlib.import_module(module)
    monkeypatch.setattr(study.subprocess, 'run', run)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Started):
        call(study, tmp_path)


def test_profile_categories_follow_the_backward_node_and_the_optimizer_scope():
    """Θ's closed-form backward runs plain elementwise operators (``aten::mul``, ``aten::sum``...), and AdamW
    too: each counts by what ran it (the backward node; the optimizer's step), a compiled model's fused kernels
    by the operations they fuse, the fold's key centring as layer norm."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from tkvision.experiments.profile import category_ms

    def event(key, parent=None, us=1000):
        return SimpleNamespace(key=key, name=key, cpu_parent=parent, device_type=DeviceType.CPU,
                               self_cpu_time_total=us, self_device_time_total=0)
    theta = event('autograd::engine::evaluate_function: _L2NormGELUBackward', us=0)
    gemm = event('autograd::engine::evaluate_function: MmBackward0', us=0)
    step = event('Optimizer.step#AdamW.step', us=0)
    events = [event('aten::mul', theta), event('aten::sum', theta), event('aten::mm', gemm), event('aten::mul_', step),
              event('aten::addcmul_', event('aten::lerp_', step)), event('aten::mean'), event('aten::sub'),
              event('cpp_fused_gelu_linalg_vector_norm_mul_0'), event('cpp_fused_native_layer_norm_1'),
              event('aten::mul', event('autograd::engine::evaluate_function: SubBackward0', us=0)),
              event('aten::copy_'), theta, gemm, step]
    assert category_ms(events, on_gpu=False, steps=1) == {
        'score normalisation / GELU': 3.0, 'matmul': 1.0, 'optimizer (AdamW)': 2.0, 'layer norm (or its fold)': 4.0,
        'other': 1.0}


def test_the_models_part_divides_achieved_flops_by_the_measured_peak(monkeypatch):
    """``--parts peak models``: the peak (float32 on a CPU) is measured first and each model row gains its MFU,
    achieved TFLOP/s over that peak."""
    from types import SimpleNamespace

    from tkvision.experiments import benchmark_parts

    monkeypatch.setattr(benchmark_parts, 'matmul_peak_tflops', lambda device, dtype, size: 0.2)
    monkeypatch.setattr(benchmark_parts, 'benchmark_models', lambda *a, **k: [
        dict(model='tokenformer_vit_ti16', mode='train', ratio=0.9, mem_ratio=1.0, saved_ratio=1.0, tflops_per_s=0.05)])
    args = SimpleNamespace(device='cpu', models=['tokenformer_vit_ti16'], mode=['train'], batch_size=2, amp=None,
                           compile=False, steps=1, repeats=1, no_memory=True, reference=None)
    peak, _ = benchmark_parts.PARTS['peak'](args)
    rows, _ = benchmark_parts.PARTS['models'](args)
    assert peak[0]['dtype'] == 'float32' and peak[0]['peak_gflops'] == pytest.approx(200.0)
    assert rows[0]['mfu'] == pytest.approx(0.25)
    assert list(benchmark_parts.PARTS)[:2] == ['peak', 'models']


def test_the_matmul_peak_is_the_rate_of_products_of_the_given_size():
    """A real measurement on this CPU, against the FLOP count of one product: positive and below what two
    cores could do at 100 GHz each."""
    from tkvision.experiments.benchmark import matmul_peak_tflops
    rate = matmul_peak_tflops(torch.device('cpu'), torch.float32, 256, products=2, repeats=3)
    assert 0 < rate < 2 * 100e9 * 64 / 1e12


def test_the_benchmark_says_which_files_it_wrote_and_refuses_a_batch_larger_than_memory(tmp_path, capsys):
    """``--parts peak`` said it wrote a ``.csv`` and wrote none; ``--batch-size 100000`` was a raw allocator error
    before the memory check. The message lists the files there are; the batch is refused naming the flag."""
    from tkvision.cli.experiments import benchmark_main
    out = str(tmp_path / 'bench')
    assert benchmark_main(['--parts', 'peak', '--device', 'cpu', '--out', out]) == 0
    assert f'wrote {out}.md / .json' in capsys.readouterr().out and not os.path.exists(out + '.csv')
    code = benchmark_main(['--models', 'vit_tiny_patch16_224', '--mode', 'infer', '--parts', 'models', '--device',
                           'cpu', '--batch-size', '100000', '--no-memory', '--out', out])
    err = capsys.readouterr().err
    assert code == 2 and 'Traceback' not in err and 'error: --batch-size 100000: one batch of 3 x 224 x 224' in err


@pytest.mark.slow
def test_the_gpu_attribution_script_runs_every_part_on_a_cpu(tmp_path):
    """``make gpu-attribution``'s script, on tiny shapes on the CPU (no GPU in CI): each part writes its rows into
    the JSON and Markdown files, so the first call on a lent GPU is known to run."""
    import json
    import subprocess
    import sys
    from .helpers import ROOT
    out = str(tmp_path / 'attr')
    res = subprocess.run([sys.executable, '-m', 'studies.performance.gpu_attribution', '--device', 'cpu', '--tiny',
                          '--batch', '4', '--steps', '1', '--repeats', '1', '--out', out], cwd=ROOT, capture_output=True,
                         text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    (path,) = [p for p in os.listdir(tmp_path) if p.endswith('.json')]
    found = json.load(open(tmp_path / path))
    assert found['card'] == 'cpu' and {r['part'] for r in found['attribution']} == {
        'matmul', 'attention', 'theta_gelu_forward', 'theta_gelu_backward', 'rest', 'total'}
    assert {r['what'] for r in found['models']} >= {'train compiled default', 'train compiled max-autotune',
                                                    'infer compiled default', 'train eager'}
    assert {r['layer'] for r in found['layers']} == {'pattention closed_form', 'pattention lean',
                                                     'pattention autograd', 'timm Mlp'}
