"""Runs that heal themselves (``tkvision.engine.healing``): an injected NaN or loss spike rolls the run back to its
snapshot and skips the window, and the run ends bit-identical (every tensor of its weights and of ``last.pth``) to a
reference run told from the start to skip the same micro-batches (``skip_batches``): on one process, on two under
torchrun with loader workers, and when killed during the rollback and resumed. The injection is a test hook
(``tests/poison.py``)."""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tkvision.engine import checkpoint as ckpt
from tkvision.engine import trainer as train_mod
from tkvision.engine.config import ConfigError

from . import poison
from .helpers import ROOT, TINY_FMNIST, fmnist_cfg, free_port

#: 1024 training images in batches of 64: 16 updates an epoch; a check point every 4.
KEYS = dict(epochs=2, log_interval=4, mixup=0.8, drop_path_rate=0.1, model_ema=True)


def _events(out) -> list:
    with open(os.path.join(out, 'rollbacks.csv')) as f:
        return list(csv.DictReader(f))


def _assert_same_tensors(out_a, out_b):
    """Every tensor of the weights and of ``last.pth`` (model, optimizer, EMA, scaler) is bit-identical."""
    a, b = load_file(os.path.join(out_a, 'last.safetensors')), load_file(os.path.join(out_b, 'last.safetensors'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (ckpt.load_training_checkpoint(os.path.join(o, 'last.pth')) for o in (out_a, out_b))
    for part in ('model', 'model_ema'):
        assert (sa[part] is None) == (sb[part] is None), part
        assert all(torch.equal(sa[part][k], sb[part][k]) for k in sa[part] or {}), part
    flat = [torch.utils._pytree.tree_leaves(s['optimizer']['state']) for s in (sa, sb)]
    assert len(flat[0]) == len(flat[1]) and all(torch.equal(x, y) for x, y in zip(*flat))
    assert sa['num_updates'] == sb['num_updates'] and sa['scaler'] == sb['scaler']


@pytest.mark.parametrize('kind', ['nonfinite', 'spike'])
def test_an_injected_nan_or_spike_heals_bit_identical_to_a_run_that_skips_its_window(tmp_path, monkeypatch, kind,
                                                                                     capsys):
    """A NaN at micro-batch 10 of epoch 1 (or a loss 50 times its size at micro-batch 6 of epoch 2): the check after
    it rolls back to the snapshot of the check before and skips the micro-batches between, said in one line and
    kept in ``rollbacks.csv``; the run ends equal, tensor for tensor, to one given those micro-batches as
    ``skip_batches`` from the start (and different from a run that trained them)."""
    at, factor = ((0, 9), math.nan) if kind == 'nonfinite' else ((1, 5), 50.0)
    poison.install({at: factor}, monkeypatch.setattr)
    healing = (dict(on_nonfinite='rollback') if kind == 'nonfinite' else
               dict(on_spike='rollback', spike_factor=3.0, spike_window=4))
    healed = fmnist_cfg(tmp_path, output=str(tmp_path / 'healed'), **KEYS, **healing)
    train_mod.train(healed)
    err = capsys.readouterr().err
    (event,) = _events(healed['output'])
    assert event['reason'] == kind and int(event['first']) <= at[1] + 1 <= int(event['last'])
    assert f"rollback 1 of at most 5: " in err and f"skipping micro-batches {event['first']}-{event['last']}" in err
    reference = fmnist_cfg(tmp_path, output=str(tmp_path / 'reference'), **KEYS,
                           skip_batches=[[int(event['epoch']), int(event['first']), int(event['last'])]])
    train_mod.train(reference)
    _assert_same_tensors(healed['output'], reference['output'])
    state = ckpt.load_training_checkpoint(os.path.join(healed['output'], 'last.pth'))
    assert state['healing']['skips'] == [[int(event['epoch']), int(event['first']), int(event['last'])]]


def test_the_cap_ends_a_run_naming_every_event(tmp_path, monkeypatch):
    """A NaN in every window (the data at fault): after ``max_rollbacks`` events the run ends, naming them."""
    poison.install({(0, b): math.nan for b in range(16)}, monkeypatch.setattr)
    cfg = fmnist_cfg(tmp_path, **KEYS, on_nonfinite='rollback', max_rollbacks=2)
    with pytest.raises(Exception, match=r'3 rollbacks, more than max_rollbacks 2: the data or the recipe is at fault'):
        train_mod.train(cfg)


def test_stop_is_todays_behaviour_and_a_spike_stop_names_the_loss(tmp_path, monkeypatch):
    poison.install({(0, 9): 50.0}, monkeypatch.setattr)
    with pytest.raises(Exception, match=r'the training loss spiked at update \d+ \(epoch 1\): .*x its running mean'):
        train_mod.train(fmnist_cfg(tmp_path, **KEYS, on_spike='stop', spike_window=4))
    with pytest.raises(ConfigError, match='skip_batches must be a list of'):
        train_mod.train(fmnist_cfg(tmp_path, skip_batches=[[1, 5, 2]]))


def _torchrun(tmp_path, out, extra=(), env_poison=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([poison.sitecustomize_dir(str(tmp_path / 'site')), ROOT]))
    if env_poison:
        env[poison.ENV] = json.dumps(env_poison)
    args = ['--model_kwargs', str(TINY_FMNIST), '--rrc_scale', 'null', '--batch_size', '32', '--train_subset', '1024',
            '--val_subset', '128', '--threads', '1', '--progress', 'false', '--num_workers', '2', '--output', out,
            '--epochs', '2', '--log_interval', '4', '--mixup', '0.8', '--drop_path_rate', '0.1', *extra]
    return subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port',
                             str(free_port()), os.path.join(ROOT, 'tools/train.py'), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
def test_two_processes_with_workers_heal_exactly_even_when_killed_during_the_rollback(tmp_path):
    """Two processes under torchrun (gloo), two loader workers each, a spike on one rank's micro-batch (the losses
    are averaged over the ranks, so both take the same decision): killed (SIGKILL to the whole job) as the rollback's
    record appears, then resumed, the run ends bit-identical to the reference that skips the same window."""
    healed, reference = str(tmp_path / 'healed'), str(tmp_path / 'reference')
    keys = ['--on_spike', 'rollback', '--spike_factor', '3', '--spike_window', '4']
    p = _torchrun(tmp_path, healed, keys, {'0,9': 50.0})
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(healed, 'rollbacks.csv')):
        assert p.poll() is None and time.time() < deadline, p.communicate()[0][-3000:]
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    log = _torchrun(tmp_path, healed, keys + ['--resume'], {'0,9': 50.0}).communicate(timeout=600)[0]
    assert 'resumed from' in log, log[-3000:]
    (event,) = _events(healed)
    skip = f"[[{event['epoch']}, {event['first']}, {event['last']}]]"
    log = _torchrun(tmp_path, reference, ['--skip_batches', skip]).communicate(timeout=600)[0]
    assert 'Traceback' not in log, log[-3000:]
    _assert_same_tensors(healed, reference)
