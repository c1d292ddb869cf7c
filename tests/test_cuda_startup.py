"""The real start-up path of ``tkvision-train`` and ``tkvision-validate`` on a machine that has CUDA, with the
run on the CPU (``--device cpu``), so it runs here without a GPU.

A ``sitecustomize.py`` on ``PYTHONPATH`` makes ``torch.cuda.is_available()`` answer True to tkvision's and timm's
code in every process the commands start (their loader workers included), as on any GPU machine; PyTorch's own
code still gets the truth, since what it does once it believes in CUDA (an optimizer step's CUDA-graph check, a
loader's pinning thread) needs a driver. A loader asked to pin memory then warns that no accelerator is found:
the output must not say so. Each command is
the installed console script, run as a user runs it: process and device set-up, the model, the first updates, a
checkpoint, ``--resume``, then ``tkvision-validate`` of the checkpoint. The run must behave as on a CPU-only
machine: its training state after the resume is bit-identical to the same two commands run in this process,
where CUDA is not reported. What a CUDA *device* decides (TF32, pinned memory, compile, DDP, the backend,
autocast, the scaler, the memory check) is ``tests/test_device_plan.py``'s.
"""
import csv
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import TINY_FMNIST, assert_same_training_state
from tkvision.engine.config import load_config
from tkvision.engine.trainer import train

BIN = os.path.dirname(sys.executable)
SITECUSTOMIZE = """\
import sys
import torch
_truth = torch.cuda.is_available
def is_available():  # what a GPU machine answers, to our code and timm's; every tensor of the run stays on the CPU
    caller = sys._getframe(1).f_globals.get('__name__', '')
    return caller.split('.')[0] in ('tkvision', 'timm') or _truth()
torch.cuda.is_available = is_available
"""
#: What PyTorch's loader says when it is asked to pin memory on a machine without a driver.
PINNED = "'pin_memory' argument is set as true"
#: A tiny classifier over 256 Fashion-MNIST images: 4 updates an epoch (the commands' start-up is what is tested, and
#: on a loaded 2-core runner each start costs most of the test).
CLASSIFIER = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, train_subset=256, val_subset=128,
                  batch_size=64, epochs=1, warmup_epochs=0.5, threads=1, progress=False, num_workers=1)
#: Its masked autoencoder: MAE's recipe shape at tiny size.
MAE = dict(CLASSIFIER, task='mae', decoder=dict(embed_dim=32, depth=1, num_heads=2), mask_ratio=0.75,
           norm_pix_loss=True, recon_images=0)


def _flags(settings: dict) -> list:
    """``--key value`` arguments of ``settings`` (mappings as YAML flow mappings)."""
    flags = []
    for key, value in settings.items():
        if isinstance(value, dict):
            value = '{' + ', '.join(f'{k}: {v}' for k, v in value.items()) + '}'
        flags += [f'--{key}', str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def _on_a_gpu_machine(tmp_path, command: str, *args) -> str:
    """Run the console script ``command`` with CUDA reported available; its output (asserted exit 0)."""
    fake = tmp_path / 'gpu_machine'
    fake.mkdir(exist_ok=True)
    (fake / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ.get('PYTHONPATH', '')]))
    result = subprocess.run([os.path.join(BIN, command), *args], env=env, capture_output=True, text=True,
                            timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and PINNED not in output, output
    return output


def _train_then_resume(tmp_path, settings: dict, out: str) -> str:
    """One epoch, then ``--resume`` with two, on the GPU machine; both commands' output."""
    args = ['--config', 'fashion_mnist/quick', '--device', 'cpu', *_flags(settings), '--output', out]
    first = _on_a_gpu_machine(tmp_path, 'tkvision-train', *args)
    resumed = _on_a_gpu_machine(tmp_path, 'tkvision-train', *args, '--resume', '--epochs', '2')
    assert 'resumed from' in resumed and 'changed: epochs 1 -> 2' in resumed, resumed
    return first + resumed


def _here(settings: dict, out: str) -> None:
    """The same two commands in this process (CUDA not reported): the reference."""
    cfg = load_config('fashion_mnist/quick', dict(settings, device='cpu', output=out))
    train(cfg)
    train(load_config('fashion_mnist/quick', dict(settings, device='cpu', output=out, epochs=2)), resume=True)


def _last_top1(out: str) -> float:
    with open(os.path.join(out, 'metrics.csv')) as f:
        return float(list(csv.DictReader(f))[-1]['top1'])


@pytest.mark.slow
def test_a_classifier_starts_resumes_and_validates_on_a_gpu_machine_as_on_a_cpu_one(tmp_path):
    gpu, cpu = str(tmp_path / 'on_gpu_machine'), str(tmp_path / 'here')
    log = _train_then_resume(tmp_path, CLASSIFIER, gpu)
    assert 'on cpu' in log, log
    _here(CLASSIFIER, cpu)
    assert_same_training_state(os.path.join(gpu, 'last.pth'), os.path.join(cpu, 'last.pth'))
    out = _on_a_gpu_machine(tmp_path, 'tkvision-validate', '--checkpoint', os.path.join(gpu, 'last.pth'),
                            '--device', 'cpu', '--num_workers', '1')
    top1 = float(re.search(r'top-1 ([\d.]+)%', out).group(1))
    assert top1 == pytest.approx(_last_top1(gpu), abs=0.006), out  # the same weights on the same split


@pytest.mark.slow
def test_mae_pretrains_resumes_and_fine_tunes_on_a_gpu_machine(tmp_path):
    pretrained = str(tmp_path / 'mae')
    log = _train_then_resume(tmp_path, MAE, pretrained)
    assert 'task mae' in log and 'val loss' in log, log
    weights = os.path.join(pretrained, 'last.safetensors')
    tuned = str(tmp_path / 'tuned')
    log = _on_a_gpu_machine(tmp_path, 'tkvision-train', '--config', 'fashion_mnist/quick', '--device', 'cpu',
                            *_flags(CLASSIFIER), '--init_from', weights, '--output', tuned)
    assert f'MAE encoder from {weights}' in log, log
    out = _on_a_gpu_machine(tmp_path, 'tkvision-validate', '--checkpoint', os.path.join(tuned, 'best.safetensors'),
                            '--config', os.path.join(tuned, 'config.yaml'), '--device', 'cpu')
    assert 'top-1' in out, out
