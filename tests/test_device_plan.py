"""Every choice a run takes from its device, driven for ``cuda`` and for ``cpu`` without a GPU.

``tkvision.engine.distributed.device_plan`` takes them in one place; each test checks one choice against what
PyTorch's documentation says the device needs (NCCL only runs on CUDA, TF32 and pinned memory are CUDA's, DDP's
``device_ids`` name one CUDA device, masked SDPA is fused on CUDA), and that whether the *machine* has CUDA
changes none of them (``torch.cuda.is_available`` reported True here). The start-up path that takes these
choices is ``tests/test_cuda_startup.py``'s.
"""
import dataclasses

import pytest
import torch

from tkvision.engine.distributed import ProcessConfig
from tkvision.engine import distributed
from tkvision.engine.config import load_config, resolve_run_config
from tkvision.engine.distributed import Processes, device_plan, init_distributed
from tkvision.engine.optim import RunOptim
from tkvision.engine.run_data import check_naflex_memory
from tkvision.engine.trainer import build_state
from tkvision.utils.errors import ConfigError


@pytest.fixture
def gpu_machine(monkeypatch):
    """A machine that has CUDA, as far as our code can tell (no tensor is put on it here)."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *args, **kwargs: True)


def test_a_cuda_device_plans_nccl_tf32_pinned_memory_compile_and_its_ddp_device(gpu_machine):
    plan = device_plan('cuda:3', amp='bf16')
    assert plan.device == torch.device('cuda:3') and plan.backend == 'nccl'
    assert plan.tf32 and plan.pin_memory and plan.compile and plan.fused_masked_attention
    assert plan.ddp_device_ids == (3,)
    assert plan.autocast_dtype == torch.bfloat16 and not plan.grad_scaler


def test_a_cpu_device_plans_the_cpu_way_on_a_machine_with_cuda(gpu_machine):
    plan = device_plan('cpu', amp='bf16')
    assert plan.device == torch.device('cpu') and plan.backend == 'gloo'
    assert not (plan.tf32 or plan.pin_memory or plan.compile or plan.fused_masked_attention)
    assert plan.ddp_device_ids is None
    assert plan.autocast_dtype == torch.bfloat16  # CPU autocast runs bf16 as well


@pytest.mark.parametrize('device', ['cpu', 'cuda:0'])
def test_the_keys_decide_what_the_device_allows(gpu_machine, device):
    assert not device_plan(device, tf32=False).tf32
    assert device_plan(device, compile=True).compile and not device_plan(device, compile=False).compile
    fp16 = device_plan(device, amp='fp16')
    assert fp16.autocast_dtype == torch.float16 and fp16.grad_scaler
    full = device_plan(device, amp=None)
    assert full.autocast_dtype is None and not full.grad_scaler


def test_bf16_on_a_gpu_without_it_is_refused_naming_the_key_and_what_to_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *args, **kwargs: False)
    with pytest.raises(ConfigError, match='amp: bf16 needs a GPU with bfloat16.*set amp: fp16'):
        device_plan('cuda:0', amp='bf16')
    assert device_plan('cpu', amp='bf16').autocast_dtype == torch.bfloat16


def test_an_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="amp: 'fp8' is not a precision"):
        device_plan('cpu', amp='fp8')


@pytest.mark.parametrize('device, tf32, expected', [('cuda', True, True), ('cuda', False, False),
                                                    ('cpu', True, 'untouched'), ('cpu', False, 'untouched')])
def test_process_set_up_sets_tf32_on_cuda_only(gpu_machine, monkeypatch, device, tf32, expected):
    """``init_distributed`` of one process (no launcher: no process group, no CUDA call) with the run's device: the
    TF32 flags follow ``tf32`` on CUDA, and a CPU run leaves them as they were."""
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'SLURM_PROCID', 'SLURM_NTASKS'):
        monkeypatch.delenv(name, raising=False)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    before = not tf32  # the flags as something else set them
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = before
    try:
        processes = init_distributed(ProcessConfig(device=device, tf32=tf32))
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert processes.device == torch.device(device) and processes.world == 1 and processes.main
    assert flags == ((before, before) if expected == 'untouched' else (expected, expected))


def test_init_distributed_hands_timm_the_plans_backend(gpu_machine, monkeypatch):
    seen = []

    def init(device, dist_backend=None, dist_url=None):
        seen.append((device, dist_backend))
        return dict(device=device, global_rank=0, local_rank=0, world_size=1, distributed=False)

    monkeypatch.setattr(distributed, 'init_distributed_device_so', init)
    init_distributed(ProcessConfig(device='cpu'))
    init_distributed(ProcessConfig(device='cuda:1', tf32=False))
    assert seen == [('cpu', 'gloo'), ('cuda:1', 'nccl')]


def _state(tmp_path, plan, **settings):
    cfg = resolve_run_config(load_config(None, dict(
        model='tokenformer_vit_ti16', dataset='folder', data_dir=str(tmp_path), epochs=1, output=str(tmp_path / 'r'),
        model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_tokens=8,
                          num_classes=3), **settings)))
    return build_state(cfg, RunOptim(cfg.optim, cfg.growth, lr=1e-3, updates_per_epoch=1), Processes(0, 1, plan))


def test_the_state_compiles_and_scales_as_the_plan_says(tmp_path):
    eager = _state(tmp_path, device_plan('cpu', compile='auto'))
    assert eager.net is eager.model and not eager.scaler.is_enabled()
    compiled = _state(tmp_path, device_plan('cpu', amp='fp16', compile=True))
    assert isinstance(compiled.net, torch._dynamo.eval_frame.OptimizedModule) and compiled.net._orig_mod is \
        compiled.model  # compiled lazily: nothing runs here
    assert compiled.scaler.is_enabled()


@pytest.mark.parametrize('fused', [True, False])
def test_the_naflex_memory_check_counts_the_scores_only_where_attention_is_unfused(monkeypatch, fused):
    """A batch of 8 images at 2,000 patches in a 2-block, 3-head, 192-wide model needs at least
    8 x (2000² mask + 16 x 2000 x 192 x 2 activations) x 4 B = 0.49 GiB fused, and 2 x 3 heads x 2000² scores
    and probabilities more unfused (1.20 GiB in all): with 1 GiB free, only the fused device fits."""
    from types import SimpleNamespace
    monkeypatch.setattr(distributed, 'available_memory_bytes', lambda device: 2 ** 30)
    data = SimpleNamespace(batch_size=8, naflex_train_seq_lens=[256], naflex_max_seq_len=2000)
    net = SimpleNamespace(blocks=[SimpleNamespace(attn=SimpleNamespace(num_heads=3))] * 2, embed_dim=192)
    plan = dataclasses.replace(device_plan('cpu'), fused_masked_attention=fused)
    if fused:
        check_naflex_memory(data, net, plan)
    else:
        with pytest.raises(ConfigError, match='naflex_max_seq_len: a batch of 8 images at 2000 patches'):
            check_naflex_memory(data, net, plan)
