"""The code path a CUDA run takes, traced without a GPU.

Two devices stand in for a GPU:

- **Fake CUDA** (``torch._subclasses.FakeTensorMode``): tensors that claim ``device='cuda:0'`` and
  carry only shape, dtype and device. The trainer's update runs on them as on a GPU: the uint8 batch
  normalised on the device (``BatchPreprocessor``), the forward under ``torch.autocast('cuda',
  bfloat16)`` (the recipe's ``amp: bf16``) with the default closed-form backward (eager: ``compile:
  false``; the default ``compile: 'auto'`` compiles on CUDA, which this file checks without running), the
  loss and the run's meters, then the optimizer step (AdamW, the schedule) and the EMA update
  (``ModelEmaV3``), all built by :class:`tkvision.engine.state.TrainState` for ``device='cuda'``. This
  catches a tensor created on the CPU inside ``forward`` (fake tensors refuse to mix devices), a host
  synchronisation (``.item()``, ``.cpu()``, ``bool(tensor)``, ``.tolist()``: a fake tensor has no value
  and raises ``DataDependentOutputException``) and a dtype mismatch under autocast.
- **Meta** tensors for the backward: PyTorch's autograd engine asks the CUDA driver for a context of
  the device of every gradient (``hasPrimaryContext``), which fails without a GPU, so the backward of
  fake CUDA tensors cannot run here. On the meta device it runs through the same autograd functions
  (the lean backward forced on), and a host synchronisation or a CPU tensor in the backward raises
  there too (both hand-written backwards).

What this cannot catch, and why: a missing CUDA or bf16 *kernel* (fake and meta tensors run the
operators' shape functions, never the kernels: a first GPU run, ``make bench-gpu``, checks those);
autocast's casts inside the backward (meta tensors have no autocast; the lean backward's equality
with autograd under CPU bf16 autocast is ``tests/test_pattention.py::
test_lean_backward_under_autocast_matches_reference``); ``torch.compile`` on CUDA (inductor needs the
device to generate its kernels) and NCCL DDP (needs GPUs). Autocast for ``'cuda'`` turns itself off
without a GPU, so the fake run tells ``torch.autocast`` that CUDA and bf16 are available (two
monkeypatched probes); nothing else is patched.
"""
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tkvision.data import BatchPreprocessor
from tkvision.engine import loop as loop_mod
from tkvision.engine.config import load_config, resolve_run_config
from tkvision.engine.distributed import Processes, device_plan
from tkvision.engine.loss import TrainTask
from tkvision.engine.optim import RunOptim, resolve_lr
from tkvision.engine.runlog import RunLog
from tkvision.engine.tasks import task_named
from tkvision.engine.trainer import build_state
from tkvision.layers.pattention import Pattention
from tkvision.models.ringformer import RingFormerViT

TINY = dict(img_size=32, patch_size=8, in_chans=3, embed_dim=32, depth=2, num_heads=2)
FAMILIES = {
    'tokenformer': dict(model='tokenformer_vit_ti16', model_kwargs=dict(TINY, num_tokens=16)),
    'ringformer': dict(model='ringformer_vit_small_patch16_224', model_kwargs=dict(TINY, num_classes=10)),
    'ring_x_token': dict(model='tokenformer_ring_vit_small_patch16_224', model_kwargs=dict(TINY, num_classes=10)),
    'mae': dict(model='tokenformer_vit_ti16', model_kwargs=dict(TINY, num_tokens=16), task='mae',
                decoder=dict(embed_dim=32, depth=1, num_heads=2), mask_ratio=0.75, norm_pix_loss=True),
}


def _config(tmp_path, family: str, **overrides) -> dict:
    """The run config of ``family`` as a CUDA recipe sets it: bf16 autocast, EMA, label smoothing."""
    cfg = dict(FAMILIES[family], dataset='folder', data_dir=str(tmp_path), amp='bf16', model_ema=True,
               model_ema_decay=0.99, smoothing=0.1, epochs=2, warmup_epochs=0.5, batch_size=4, output=str(tmp_path / 'r'),
               compile=False)
    return resolve_run_config(load_config(None, dict(cfg, **overrides)))


def _state(cfg):
    optim = RunOptim(cfg.optim, cfg.growth, lr=resolve_lr(cfg.optim, cfg.data.batch_size),
                     updates_per_epoch=10)
    state = build_state(cfg, optim, Processes(0, 1, device_plan('cpu', compile=cfg.model.compile)))
    state.run_optim = optim  # for _onto, which rebuilds the optimizer on the new device
    state.compile_setting = cfg.model.compile  # for _onto, which takes the new device's plan
    return state


def _onto(state, device: str):
    """Move a ``TrainState`` built on the CPU onto ``device`` (fake ``cuda`` or ``meta``) as
    ``TrainState`` builds one there: the device's plan taken, model and EMA moved, optimizer, schedule, meters and forward
    wrapper rebuilt by its own methods. It cannot be built there directly: the model's constructor reads
    a ``torch.linspace`` as Python floats (as timm's ViT does), and timm's ``ModelEmaV3`` creates a
    random generator on the model's device (for stochastic rounding), which needs a CUDA driver and
    does not exist for meta."""
    state.device = torch.device(device)
    state.plan = device_plan(device, compile=state.compile_setting)
    state.model.to(state.device)
    state.ema.module.to(state.device)
    state.optimizer = state.run_optim.optimizer(state.model, state.grown_from)
    state.scheduler = state.run_optim.scheduler(state.optimizer, state.num_updates)
    state.reset_meter()
    state.wrap()
    return state


def _parts(cfg: dict, device: str, optim):
    """The parts one update reads (no data loader): the preprocessing of a ``tkvision.engine.run_data.RunData``,
    a ``tkvision.engine.loss.TrainTask`` of the config, the run's optimisation and the processes of ``device``
    with the config's precision."""
    processes = Processes(0, 1, device_plan(device, cfg.process.amp))
    data = SimpleNamespace(preprocess=BatchPreprocessor(cfg.data.mean, cfg.data.std, device))
    task = TrainTask(cfg.loss, task_named(cfg.run.task), cfg.run.seed, 10)
    return loop_mod._Step(data, task, optim, None, processes, RunLog('unused', [], main=False, epochs=1))


class _RecordingScaler:
    """Stands in for the (disabled, bf16) GradScaler on fake CUDA: records the loss it is asked to
    scale; its ``backward`` is not run (see the module docstring)."""

    def __init__(self, real):
        self.real, self.losses = real, []

    def scale(self, loss):
        self.losses.append(loss)
        return SimpleNamespace(backward=lambda: None)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _fake_cuda(monkeypatch):
    """A FakeTensorMode in which ``torch.autocast('cuda', bfloat16)`` is on, as on a GPU."""
    monkeypatch.setattr(torch.cuda.amp.common, 'amp_definitely_not_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    return FakeTensorMode(allow_non_fake_inputs=True)


@pytest.mark.parametrize('family', FAMILIES)
def test_a_training_update_on_fake_cuda_stays_on_the_device_without_a_host_sync(tmp_path, monkeypatch, family):
    """One trainer update (preprocess, bf16 forward with the closed-form backward, loss, meters, optimizer,
    schedule, EMA) on tensors that claim ``cuda:0``: nothing leaves the device, nothing synchronises."""
    cfg = _config(tmp_path, family)
    state = _state(cfg)
    with _fake_cuda(monkeypatch):
        _one_update(cfg, _onto(state, 'cuda'))


def _one_update(cfg: dict, state):
    parts = _parts(cfg, 'cuda', state.run_optim)
    state.scaler = _RecordingScaler(state.scaler)
    layers = [m for m in state.model.modules() if isinstance(m, Pattention)]
    assert bool(layers) == (cfg.model.model != 'ringformer_vit_small_patch16_224')  # RingFormer: linear layers
    assert all(m._training_backward() == 'closed_form' for m in layers)  # the default, on CUDA as on a CPU
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)  # as the loader gives them, on the host
    labels = torch.randint(0, 10, (4,))
    assert parts.processes.plan.autocast_dtype == (torch.bfloat16 if cfg.process.amp == 'bf16' else None)
    loop_mod._forward_backward(state, parts, images, labels, 0, 0, scale=1.0, sync_grads=True)
    (loss,) = state.scaler.losses
    assert loss.device.type == 'cuda' and loss.dtype == torch.float32 and loss.shape == ()
    assert state.meter['loss_sum'].device.type == 'cuda' and state.meter['nonfinite'].device.type == 'cuda'
    for p in state.model.parameters():  # the autograd engine cannot run here: gradients as a backward leaves them
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    parts.optim.step(state)
    state.ema.update(state.model, step=state.num_updates)
    params = list(state.model.parameters()) + list(state.ema.module.parameters())
    assert all(p.device.type == 'cuda' and p.dtype == torch.float32 for p in params)
    assert state.num_updates == 1


@pytest.mark.parametrize('family', FAMILIES)
def test_the_bf16_forward_on_fake_cuda_computes_the_score_norm_in_float32(tmp_path, monkeypatch, family):
    """Under ``autocast('cuda', bfloat16)`` the Pattention GEMMs run in bf16 while the score
    normalisation takes float32 (Eq. 5's norm over the tokens would lose the small scores in bf16)."""
    cfg = _config(tmp_path, family)
    state = _state(cfg)
    with _fake_cuda(monkeypatch):
        _bf16_forward(_onto(state, 'cuda'))


def _bf16_forward(state):
    seen = []
    for m in state.model.modules():
        if isinstance(m, Pattention):
            m.register_forward_hook(lambda mod, args, out: seen.append((args[0].dtype, out.dtype)))
    x = torch.randn(2, 3, 32, 32, device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        out = state.model(x)
    out = out[0] if isinstance(out, tuple) else out
    assert out.device.type == 'cuda' and all(o == torch.bfloat16 for _, o in seen)
    assert bool(seen) == (not isinstance(state.model, RingFormerViT))  # RingFormer: linear layers


@pytest.mark.parametrize('backward_mode', ['closed_form', 'lean'])
@pytest.mark.parametrize('family', FAMILIES)
def test_a_full_training_step_on_meta_runs_the_hand_written_backwards(tmp_path, monkeypatch, family, backward_mode):
    """Forward, backward (through each hand-written backward), optimizer and EMA on the meta device: every
    trainable parameter gets a gradient of its own shape and dtype, and no step needs a value (a host sync
    raises on meta)."""
    cfg = _config(tmp_path, family, amp=None, backward_mode=backward_mode)
    state = _onto(_state(cfg), 'meta')
    assert all(m.backward_mode == backward_mode for m in state.model.modules() if isinstance(m, Pattention))
    x = torch.randn(4, 3, 32, 32, device='meta')
    if cfg.run.task == 'mae':
        loss = state.model(x)[0]
    else:
        loss = torch.nn.functional.cross_entropy(state.model(x), torch.zeros(4, dtype=torch.long, device='meta'))
    loss.backward()
    trainable = [(n, p) for n, p in state.model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None or p.grad.shape != p.shape or p.grad.dtype != p.dtype]
    assert not missing, missing
    state.optimizer.step()
    state.ema.update(state.model, step=1)
    assert all(p.device.type == 'meta' for p in state.ema.module.parameters())


@pytest.mark.parametrize('compile_', ['auto', True, False])
def test_a_cuda_run_compiles_by_default_and_a_cpu_run_does_not(tmp_path, monkeypatch, compile_):
    """``compile: 'auto'`` (the default every recipe keeps) compiles the forward on CUDA, where a TokenFormer
    trains at 0.85x ViT-B compiled against 0.37x eager, and not on a CPU; true / false force it. The eager
    path is the closed-form backward either way."""
    cfg = _config(tmp_path, 'tokenformer', compile=compile_)
    state = _state(cfg)
    assert isinstance(state.net, torch._dynamo.eval_frame.OptimizedModule) == (compile_ is True)
    with _fake_cuda(monkeypatch):
        _onto(state, 'cuda')  # wrap() again, on a device that claims CUDA (compiling waits for the first call)
    assert isinstance(state.net, torch._dynamo.eval_frame.OptimizedModule) == (compile_ in ('auto', True))
    assert all(m.backward_mode == 'closed_form' for m in state.model.modules() if isinstance(m, Pattention))
    assert load_config(None, {})['compile'] == 'auto'


@pytest.mark.parametrize('bug', ['cpu_tensor', 'item', 'bool'])
def test_the_fake_cuda_update_catches_the_bugs_a_first_gpu_run_finds(tmp_path, monkeypatch, bug):
    """The probe can fail: a Pattention forward that adds a tensor made on the CPU, reads a value
    (``.item()``) or branches on a tensor (``bool``) raises on fake CUDA, as it would fail (or stall
    the GPU) in a real run."""
    real = Pattention.forward

    def planted(self, x):
        out = real(self, x)
        if bug == 'cpu_tensor':
            return out + torch.ones(out.shape[-1], device='cpu')
        if bug == 'item':
            return out * out.abs().max().item()
        return out if bool(out.sum() > 0) else -out

    cfg = _config(tmp_path, 'tokenformer')
    state = _state(cfg)
    monkeypatch.setattr(Pattention, 'forward', planted)
    with pytest.raises(Exception, match='device|DataDependent|_local_scalar_dense|item'):
        with _fake_cuda(monkeypatch):
            _one_update(cfg, _onto(state, 'cuda'))
