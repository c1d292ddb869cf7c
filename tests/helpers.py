"""Helpers shared by the training tests: tiny configs and a small ImageNet-layout folder of real JPEGs."""
import csv
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from tkvision.data import build_dataset, build_loader, build_transform, load_fashion_mnist
from tkvision.engine import checkpoint as ckpt
from tkvision.engine.config import load_config, section
from tkvision.engine.config import resolve_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A tiny TokenFormer for 28x28 Fashion-MNIST (16 patches, d 32, 2 blocks): ~700 img/s train on one core.
TINY_FMNIST = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_tokens=16)


def fmnist_cfg(tmp_path, **overrides):
    """A Fashion-MNIST config over the first 1024 training / 512 test images, one thread, no progress bar."""
    base = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=2,
                batch_size=64, lr=2e-3, warmup_epochs=0.5, train_subset=1024, val_subset=512, threads=1,
                progress=False, output=str(tmp_path / 'run'))
    base.update(overrides)
    return load_config(None, base)


def make_imagenet_folder(root, classes=3, train_per_class=8, val_per_class=4, size=64):
    """ImageNet layout (``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG``) of real Fashion-MNIST images,
    upscaled to ``size`` px and written as RGB JPEGs. Returns ``root``."""
    images, labels = load_fashion_mnist('train')
    for split, per_class, offset in (('train', train_per_class, 0), ('val', val_per_class, train_per_class)):
        for c in range(classes):
            folder = os.path.join(root, split, f'n{c:08d}')
            os.makedirs(folder, exist_ok=True)
            idx = np.flatnonzero(labels == c)[offset:offset + per_class]
            for j, i in enumerate(idx):
                img = Image.fromarray(images[i]).convert('RGB').resize((size, size), Image.BICUBIC)
                img.save(os.path.join(folder, f'img_{j}.JPEG'), quality=90)
    return str(root)


def train_crash_resume(monkeypatch, cfg, saves: int) -> dict:
    """Train ``cfg``, simulate a crash (KeyboardInterrupt) right after its ``saves``-th checkpoint is
    written, resume from it and return the resumed run's result."""
    import pytest

    from tkvision.engine import clock as clock_mod, trainer as train_mod
    real_save, calls = clock_mod.save_training_checkpoint, []

    def crash(obj, path):
        real_save(obj, path)
        calls.append(path)
        if len(calls) == saves:
            raise KeyboardInterrupt('simulated crash')

    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', crash)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(cfg)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real_save)
    return train_mod.train(cfg, resume=True)


def dataset_of(cfg, split, **kwargs):
    """``build_dataset`` of a whole config: its resolved data section and seed."""
    config = resolve_run_config(cfg)
    return build_dataset(config.data, split, config.run.seed, **kwargs)


def transform_of(cfg, train, **kwargs):
    """``build_transform`` of a whole config: its resolved data section and seed."""
    config = resolve_run_config(cfg)
    return build_transform(config.data, train, config.run.seed, **kwargs)


def loader_of(ds, cfg, train, **kwargs):
    """``build_loader`` of a whole config: its data section and seed."""
    return build_loader(ds, section(cfg, 'data'), train, cfg['seed'], **kwargs)


def _same(a, b, where: str):
    """Recursive bit-equality of checkpoint pieces (tensors, dicts, lists, numbers), naming the first difference."""
    import torch
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f'{where}: keys differ'
        for k in a:
            _same(a[k], b[k], f'{where}.{k}')
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f'{where}: lengths differ'
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f'{where}[{i}]')
    else:
        assert a == b, f'{where}: {a!r} != {b!r}'


def assert_same_training_state(path_a, path_b):
    """Two ``last.pth`` files hold bit-identical training state: model, EMA, optimizer (moments, step
    counts and param groups: the schedule's lr and the frozen rows' groups), GradScaler, counters, the
    best evaluation and the grown size (``token_counts``). The time meter and the output path differ
    between runs and are not compared."""
    from tkvision.engine.checkpoint import load_training_checkpoint
    a, b = load_training_checkpoint(str(path_a)), load_training_checkpoint(str(path_b))
    for key in ('model', 'model_ema', 'optimizer', 'scaler', 'epochs_done', 'batches_done', 'num_updates', 'best',
                'token_counts'):
        _same(a[key], b[key], key)
    _same({k: v for k, v in a['meter'].items() if k != 'seconds'}, {k: v for k, v in b['meter'].items() if k != 'seconds'},
          'meter')


def wait_for_checkpoint(path, p, after=lambda state: True, timeout=300) -> dict:
    """The training state of the first ``path`` checkpoint written while ``p`` runs for which ``after(state)``
    holds (polled every 50 ms). Raises AssertionError, with the run's output, when ``p`` ends or ``timeout``
    seconds pass first."""
    deadline, seen = time.time() + timeout, None
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(path) and os.path.getmtime(path) != seen:
            seen = os.path.getmtime(path)
            state = ckpt.load_training_checkpoint(path)
            if after(state):
                return state
        time.sleep(0.05)
    raise AssertionError('no such checkpoint before the run ended: ' + (p.stdout.read() if p.poll() is not None else ''))


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the kernel's choice): tests run side by side (pytest-xdist) never share one."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def torchrun_train(args, extra=(), env=None, nproc: int = 2) -> subprocess.Popen:
    """``tools/train.py args extra`` under torchrun with ``nproc`` CPU ranks (gloo) on a free port (in ``env``, default
    this process's); output piped, as text."""
    return subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(nproc),
                             '--master_port', str(free_port()), os.path.join(ROOT, 'tools/train.py'), *args, *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def assert_torchrun_resumes_exactly(tmp_path, args_for, stop_when, nproc: int = 2) -> tuple:
    """Train ``args_for(out)`` under torchrun with ``nproc`` ranks uninterrupted, then again stopped by SIGTERM to
    torchrun at the first checkpoint with ``stop_when(state)``, then resumed (each on a free port);
    asserts every rank stopped, the resume ran, its final weights equal the uninterrupted run's bit for bit and its
    ``metrics.csv`` figures (the training loss of the epoch it stopped in included) are the same.
    Returns ``(uninterrupted run's output, the stopped run's checkpoint state)``."""
    full, stopped = str(tmp_path / 'full'), str(tmp_path / 'stopped')
    p = torchrun_train(args_for(full), nproc=nproc)
    full_log = p.communicate(timeout=600)[0]
    assert p.returncode == 0, full_log
    p = torchrun_train(args_for(stopped), nproc=nproc)
    wait_for_checkpoint(os.path.join(stopped, 'last.pth'), p, stop_when)
    p.send_signal(signal.SIGTERM)
    log = p.communicate(timeout=300)[0]
    assert p.returncode != 0 and log.count('stopped by SIGTERM') == nproc, log  # every rank, then torchrun fails
    state = ckpt.load_training_checkpoint(os.path.join(stopped, 'last.pth'))
    p = torchrun_train(args_for(stopped), ['--resume'], nproc=nproc)
    log = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and 'resumed from' in log, log
    a, b = load_file(os.path.join(full, 'last.safetensors')), load_file(os.path.join(stopped, 'last.safetensors'))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    figures = ('epoch', 'train_loss', 'top1', 'val_loss')
    rows = [[{k: r.get(k) for k in figures} for r in csv.DictReader(open(os.path.join(run, 'metrics.csv')))]
            for run in (full, stopped)]
    assert rows[0] == rows[1], rows
    return full_log, state
