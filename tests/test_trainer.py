"""The trainer on a pre-emptible cluster: schedule, accumulation, exact resume from any step with
workers, runs that never overwrite each other, settings checked up front, no per-step host syncs."""
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
from timm.loss import LabelSmoothingCrossEntropy

from tkvision.engine import checkpoint as ckpt
from tkvision.engine import loop as loop_mod, trainer as train_mod
from tkvision.engine.config import ConfigError, load_config
from tkvision.engine.distributed import Processes, device_plan
from tkvision.engine.runlog import RunLog
from tkvision.utils.errors import RunError

from .helpers import (ROOT, TINY_FMNIST, assert_torchrun_resumes_exactly, dataset_of, fmnist_cfg, free_port,
                      torchrun_train, wait_for_checkpoint)


@pytest.fixture
def record_lr(monkeypatch):
    """The lr of every optimizer update (and how many losses were computed since the previous one)."""
    lrs, windows, calls = [], [], [0]
    real_step, real_loss = torch.optim.AdamW.step, LabelSmoothingCrossEntropy.forward

    def step(self, *a, **kw):
        lrs.append(self.param_groups[0]['lr'])
        windows.append(calls[0])
        calls[0] = 0
        return real_step(self, *a, **kw)

    def loss(self, *a, **kw):
        calls[0] += 1
        return real_loss(self, *a, **kw)
    monkeypatch.setattr(torch.optim.AdamW, 'step', step)
    monkeypatch.setattr(LabelSmoothingCrossEntropy, 'forward', loss)
    return lrs, windows


def _cosine(u, total, warmup, peak, min_lr, warmup_lr):
    if u < warmup:
        return warmup_lr + u * (peak - warmup_lr) / warmup
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * (u - warmup) / (total - 1 - warmup)))


def test_lr_of_every_update_is_the_closed_form_and_ends_at_min_lr(tmp_path, record_lr):
    lrs, _ = record_lr
    cfg = fmnist_cfg(tmp_path, epochs=3, warmup_epochs=0.5, lr=2e-3, min_lr=1e-5, warmup_lr=1e-6)
    train_mod.train(cfg)
    total, warmup = 3 * 16, 8  # 1024 images / 64 per batch = 16 updates per epoch
    assert len(lrs) == total
    expected = [_cosine(u, total, warmup, 2e-3, 1e-5, 1e-6) for u in range(total)]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert lrs[warmup] == pytest.approx(2e-3) and lrs[-1] == pytest.approx(1e-5)


def test_other_timm_schedules_are_selectable(tmp_path, record_lr):
    lrs, _ = record_lr
    train_mod.train(fmnist_cfg(tmp_path, epochs=3, warmup_epochs=0.5, lr=2e-3, sched='step', decay_epochs=1,
                               decay_rate=0.5))
    # warmup 8 updates, then halved every 16 updates counted after the warmup
    assert lrs[8:24] == pytest.approx([2e-3] * 16) and lrs[24:40] == pytest.approx([1e-3] * 16)


def test_accumulation_windows_end_with_the_epoch(tmp_path, record_lr):
    """16 batches per epoch, accum_steps 3: windows 3,3,3,3,3,1 in every epoch; nothing carries over."""
    _, windows = record_lr
    train_mod.train(fmnist_cfg(tmp_path, epochs=2, accum_steps=3, warmup_epochs=0.5))
    assert windows == [3, 3, 3, 3, 3, 1] * 2


def test_partial_window_loss_scale():
    assert [loop_mod._window(i, 16, 3) for i in range(16)] == [3] * 15 + [1]
    assert [loop_mod._window(i, 5, 2) for i in range(5)] == [2, 2, 2, 2, 1]


def _cli(args, **kw):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, 'tools/train.py')] + args, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _args(out, workers, epochs=2):
    """Every random draw of the recipe: translation, flip, erasing, mixup/cutmix, drop path."""
    return ['--model_kwargs', str(TINY_FMNIST).replace("'", ''), '--rrc_scale', 'null', '--crop_padding', '2',
            '--hflip', '0.5', '--reprob', '0.25', '--mixup', '0.8', '--cutmix', '1.0', '--drop_path_rate', '0.1',
            '--epochs', str(epochs), '--batch_size', '32', '--lr', '2e-3', '--train_subset', '2048',
            '--val_subset', '256', '--threads', '1', '--progress', 'false', '--num_workers', str(workers),
            '--checkpoint_every_steps', '5', '--output', out]


@pytest.mark.slow
def test_sigkill_and_sigterm_mid_epoch_with_workers_resume_bit_identical(tmp_path):
    """An uninterrupted run with 0 workers against one with 2 workers that is SIGKILLed in the middle of
    epoch 1, resumed, stopped by SIGTERM in the middle of epoch 2 (checkpoint written, exit 75) and
    resumed again: the final weights are bit-identical."""
    full, broken = str(tmp_path / 'full'), str(tmp_path / 'broken')
    p = _cli(_args(full, workers=0))
    assert p.wait(timeout=600) == 0, p.stdout.read()
    path = os.path.join(broken, 'last.pth')

    p = _cli(_args(broken, workers=2))
    wait_for_checkpoint(path, p, lambda s: s['epochs_done'] == 0 and s['batches_done'] >= 10)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert ckpt.load_training_checkpoint(path)['epochs_done'] == 0, 'the run finished its first epoch before it was killed'

    p = _cli(_args(broken, workers=2) + ['--resume'])
    wait_for_checkpoint(path, p, lambda s: s['epochs_done'] == 1 and s['batches_done'] >= 10)
    p.send_signal(signal.SIGTERM)
    log = p.communicate(timeout=300)[0]
    assert p.returncode == train_mod.EXIT_PREEMPTED and 'stopped by SIGTERM' in log, log
    stopped = ckpt.load_training_checkpoint(path)
    assert stopped['epochs_done'] == 1 and 0 < stopped['batches_done'] < 64, 'not stopped mid-epoch'
    assert stopped['batches_done'] == stopped['num_updates'] - 64  # the checkpoint is the stop's, not a periodic one

    p = _cli(_args(broken, workers=2) + ['--resume'])
    log = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and f"batch {stopped['batches_done']}" in log, log
    a, b = load_file(os.path.join(full, 'last.safetensors')), load_file(os.path.join(broken, 'last.safetensors'))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma = open(os.path.join(full, 'metrics.csv')).read().splitlines()
    mb = open(os.path.join(broken, 'metrics.csv')).read().splitlines()
    col = ma[0].split(',').index('train_loss')
    assert [r.split(',')[col] for r in ma[1:]] == [r.split(',')[col] for r in mb[1:]]


def test_augmentation_depends_on_sample_not_worker():
    from tkvision.data import ResumableSampler, SeededDataset
    cfg = load_config(None, dict(rrc_scale=[0.5, 1.0], img_size=28, hflip=0.5, crop_padding=2, train_subset=64))
    ds = SeededDataset(dataset_of(cfg, 'train'))
    sampler = ResumableSampler(ds.dataset, seed=0)
    sampler.set_epoch(3)
    keys = list(sampler)
    first = [ds[k][0] for k in keys[:8]]
    again = [ds[k][0] for k in reversed(keys[:8])][::-1]  # another order: same images
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    sampler.set_epoch(3, start=5)
    assert list(sampler) == keys[5:]
    sampler.set_epoch(4)
    other_epoch = {i: s for i, s in sampler}
    assert any(other_epoch[i] != s for i, s in keys)


def test_rerun_in_a_used_output_dir_fails_naming_both_ways_out(tmp_path):
    cfg = fmnist_cfg(tmp_path, epochs=1, warmup_epochs=0.5)
    train_mod.train(cfg)
    before = {f: os.path.getmtime(os.path.join(cfg['output'], f)) for f in os.listdir(cfg['output'])}
    with pytest.raises(RunError, match=r'already holds a run.*--resume.*another --output'):
        train_mod.train(cfg)
    assert before == {f: os.path.getmtime(os.path.join(cfg['output'], f)) for f in os.listdir(cfg['output'])}


def test_second_run_on_a_locked_dir_fails_at_once_naming_the_holder(tmp_path):
    """A run in progress (a `Trainer` of this process, which holds its folder until it has trained) and
    ``tools/train.py --resume`` on the same folder from another process: the second exits 2 before any work, with a
    one-line error that names the holder's host and pid, and the folder stays the first run's."""
    holder = train_mod.Trainer(fmnist_cfg(tmp_path, epochs=1))
    try:
        t0 = time.time()
        second = _cli(_args(holder.config.run.output, workers=0, epochs=50) + ['--resume'])
        log = second.communicate(timeout=120)[0]
    finally:
        holder.close()
    assert second.returncode == 2 and time.time() - t0 < 60
    assert 'in use by a running job (host ' in log and f'pid {os.getpid()}' in log and 'Traceback' not in log, log


def test_resume_with_longer_schedule_rebuilds_it_and_reports_the_change(tmp_path, record_lr, capsys):
    lrs, _ = record_lr
    cfg = fmnist_cfg(tmp_path, epochs=2, warmup_epochs=0.5, min_lr=1e-6)
    train_mod.train(cfg)
    del lrs[:]
    res = train_mod.train(dict(cfg, epochs=4), resume=True)
    assert 'changed: epochs 2 -> 4' in capsys.readouterr().out
    assert len(res['history']) == 4 and len(lrs) == 32
    expected = [_cosine(u, 64, 8, 2e-3, 1e-6, 1e-6) for u in range(32, 64)]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-12)  # not stuck at min_lr
    with pytest.raises(ConfigError, match=r"cannot change when resuming.*model_kwargs"):
        train_mod.train(dict(cfg, epochs=5, model_kwargs=dict(TINY_FMNIST, num_tokens=8)), resume=True)


def test_resume_of_a_finished_run_says_so(tmp_path, capsys):
    from tkvision.cli.train import train_main
    args = _args(str(tmp_path / 'run'), workers=0, epochs=1) + ['--warmup_epochs', '0.5', '--train_subset', '256']
    assert train_main(args) == 0
    capsys.readouterr()
    assert train_main(args + ['--resume']) == 0
    out = capsys.readouterr().out
    assert 'nothing to train' in out and '--epochs N' in out and 'final validation top-1' in out, out


@pytest.mark.parametrize('override, key', [
    (['--save_every', '0'], 'save_every'), (['--eval_every', '0'], 'eval_every'), (['--epochs', '-1'], 'epochs'),
    (['--epochs', '1.5'], 'epochs'), (['--lr', 'abc'], 'lr'), (['--accum_steps', '0'], 'accum_steps'),
    (['--interpolation', 'cubic'], 'interpolation'), (['--checkpoint_every_steps', '0'], 'checkpoint_every_steps'),
    (['--batch_size', '64', '--train_subset', '32'], 'train_subset'), (['--growth.add_tokens', '{mlp: 8}'], 'mlp')])
def test_bad_settings_are_one_line_errors_before_any_work(tmp_path, capsys, override, key):
    from tkvision.cli.train import train_main as main
    out = str(tmp_path / 'run')
    model = ['--model_kwargs', str(TINY_FMNIST).replace("'", '')]  # a model that takes Fashion-MNIST's images
    assert main(['--output', out, '--epochs', '2', *model, *override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and key in err[0], err
    assert not os.path.exists(os.path.join(out, 'last.pth')) and not os.path.exists(os.path.join(out, 'metrics.csv'))
    assert main(['--output', out, '--epochs', '2', *model, *override, '--debug']) == 2
    assert 'Traceback' in capsys.readouterr().err


def test_command_line_error_is_one_line_without_traceback(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'tools/train.py'), '--epochs', '-1'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        'error: epochs must be an integer >= 1, got -1  (--debug shows the traceback)'], p.stderr


def test_nan_names_a_checkpoint_only_if_one_exists(tmp_path, monkeypatch):
    real = LabelSmoothingCrossEntropy.forward
    calls = [0]

    def poisoned(after):
        def forward(self, x, target):
            calls[0] += 1
            loss = real(self, x, target)
            return loss * float('nan') if calls[0] > after else loss
        return forward
    monkeypatch.setattr(LabelSmoothingCrossEntropy, 'forward', poisoned(3))
    with pytest.raises(train_mod.NonFiniteLossError, match='between updates 1 and 16.*no checkpoint was written'):
        train_mod.train(fmnist_cfg(tmp_path, epochs=3, output=str(tmp_path / 'a')))
    assert not os.path.exists(tmp_path / 'a' / 'last.pth')
    calls[0] = 0
    monkeypatch.setattr(LabelSmoothingCrossEntropy, 'forward', poisoned(16 + 3))
    cfg = fmnist_cfg(tmp_path, epochs=3, output=str(tmp_path / 'b'))
    with pytest.raises(train_mod.NonFiniteLossError, match=f"between updates 17 and 32.*last good checkpoint is "
                                                           f"{cfg['output']}/last.pth"):
        train_mod.train(cfg)
    state = ckpt.load_training_checkpoint(os.path.join(cfg['output'], 'last.pth'))
    assert state['epochs_done'] == 1 and all(torch.isfinite(v).all() for v in state['model'].values())


def test_no_host_synchronisation_per_step(tmp_path, monkeypatch):
    """tkvision's own device-to-host reads are as many for 16 updates as for 48 between log intervals.
    (Only calls made by tkvision's code are counted: AdamW's ``step`` counter, read with ``.item()``
    inside torch, lives on the CPU and does not wait for the device.)"""
    import tkvision
    package = os.path.dirname(tkvision.__file__)
    counts = []
    for n in (1024, 3072):
        seen = [0]
        for name in ('item', 'tolist', 'cpu', '__bool__', 'numpy'):
            real = getattr(torch.Tensor, name)

            def counted(self, *a, _real=real, **kw):
                seen[0] += sys._getframe(1).f_code.co_filename.startswith(package)
                return _real(self, *a, **kw)
            monkeypatch.setattr(torch.Tensor, name, counted)
        train_mod.train(fmnist_cfg(tmp_path, epochs=1, warmup_epochs=0.5, train_subset=n, log_interval=100,
                                   val_subset=64, output=str(tmp_path / f'n{n}')))
        monkeypatch.undo()
        counts.append(seen[0])
    assert counts[0] == counts[1], counts


def test_batches_are_uint8_until_the_device_and_erasing_is_per_pixel_normal():
    from tkvision.data import BatchPreprocessor, build_dataset, build_loader
    from tkvision.engine.config import resolve_run_config
    cfg = resolve_run_config(load_config(None, dict(train_subset=256, batch_size=64)))
    data = cfg.data
    assert data.mean == (0.2860,) and data.img_size == 28  # Fashion-MNIST's statistics
    images, labels, bad = next(iter(build_loader(build_dataset(data, 'train', 0), data, train=True, seed=0)))
    assert images.dtype == torch.uint8 and images.shape == (64, 1, 28, 28) and not bad
    prep = BatchPreprocessor(data.mean, data.std, 'cpu')
    expected = (images.float() / 255 - data.mean[0]) / data.std[0]
    assert torch.allclose(prep(images), expected, atol=1e-6)
    torch.manual_seed(0)
    erased = BatchPreprocessor([0.5], [0.5], 'cpu', reprob=1.0)(torch.full((64, 1, 28, 28), 255, dtype=torch.uint8),
                                                                train=True)
    noise = erased[erased != 1.0]  # every un-erased pixel is (1 - 0.5) / 0.5 = 1
    assert noise.numel() > 64 * 20 and abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05


def test_grow_tool_refuses_to_overwrite_its_input_and_contradictory_arguments(tmp_path, capsys):
    import timm
    from tkvision.engine.checkpoint import save_weights
    from tkvision.cli.weights import grow_main
    path = str(tmp_path / 'small.safetensors')
    save_weights(timm.create_model('tokenformer_vit_ti16', **TINY_FMNIST).state_dict(), path)
    before = open(path, 'rb').read()
    kw = ['--model', 'tokenformer_vit_ti16', '--model-kwargs', str(TINY_FMNIST).replace("'", '')]
    assert grow_main(['--checkpoint', path, '--out', path, '--add-qkv', '8', *kw]) == 2  # a one-line error
    assert 'is the input checkpoint' in capsys.readouterr().err and open(path, 'rb').read() == before
    assert grow_main(['--checkpoint', path, '--out', str(tmp_path / 'g.safetensors'), '--to', 'tokenformer_vit_s16',
                      '--add-qkv', '8', *kw]) == 2
    assert 'not both' in capsys.readouterr().err and not os.path.exists(tmp_path / 'g.safetensors')


def test_slurm_launch_of_two_cpu_processes_trains_identically(tmp_path):
    """What `srun --ntasks 2 python tools/train.py ...` sets (no torchrun): SLURM_PROCID / NTASKS / LOCALID."""
    script = tmp_path / 'job.py'
    script.write_text(f'''
import hashlib, os, sys
sys.path.insert(0, {ROOT!r})
from tkvision.engine.config import load_config
from tkvision.engine.trainer import train
from tests.helpers import TINY_FMNIST
cfg = load_config(None, dict(model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=1, warmup_epochs=0.5, batch_size=32,
                             lr=2e-3, train_subset=512, val_subset=128, threads=1, progress=False,
                             output={str(tmp_path / "run")!r}))
res = train(cfg)
import torch.distributed as dist
h = hashlib.sha256()
for k, v in sorted(res['model'].state_dict().items()):
    h.update(k.encode()); h.update(v.detach().numpy().tobytes())
open(os.path.join({str(tmp_path)!r}, 'rank%d.sha' % dist.get_rank()), 'w').write(h.hexdigest() + ' %d' % dist.get_world_size())
''')
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    port = str(free_port())  # one rendezvous for both tasks (a port each hung until the timeout)
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(env, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS='2',
                                                  MASTER_ADDR='127.0.0.1', MASTER_PORT=port))
             for r in (0, 1)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    r0, r1 = (open(tmp_path / f'rank{r}.sha').read() for r in (0, 1))
    assert r0 == r1 and r0.endswith(' 2')
    assert os.path.isfile(tmp_path / 'run' / 'last.pth')


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [2, 3])
def test_torchrun_forwards_sigterm_all_ranks_checkpoint_and_resume_exactly(tmp_path, nproc):
    """CPU ranks under torchrun: SIGTERM to torchrun reaches every worker, which stop at the same update in the
    middle of an epoch and write one checkpoint; resumed under torchrun, the weights equal an uninterrupted torchrun
    run's, and so does the epoch's training loss. Three ranks: the order of a sum of three gradients matters by the
    last bit, so DDP's bucket layout must be the same after a resume as in the uninterrupted run (it was not: DDP
    lays out its buckets again after its first step), and each rank's share of the running epoch's loss must be
    counted once (the checkpoint held rank 0's, and every rank took it back)."""
    _, state = assert_torchrun_resumes_exactly(tmp_path, lambda out: [*_args(out, workers=0), '--log_interval', '2'],
                                               lambda s: s['batches_done'] >= 5, nproc=nproc)
    assert state['epochs_done'] < 2 and 0 < state['batches_done'] < 32


def test_data_wait_is_the_share_of_the_epoch_spent_waiting_for_the_loader(monkeypatch):
    """``data_wait`` in metrics.csv answers whether the loader keeps the device busy (a GPU report could not
    tell on the H200): the seconds the training process blocks on the next batch over the epoch's
    seconds. A loader that takes 50 ms per batch beside 10 ms steps is waited on for most of the epoch."""
    from types import SimpleNamespace

    class SlowLoader:
        def __iter__(self):
            for _ in range(4):
                time.sleep(0.05)
                yield torch.zeros(1), torch.zeros(1), []

    monkeypatch.setattr(loop_mod, '_forward_backward', lambda *args, **kwargs: time.sleep(0.01))
    meter = dict(loss_sum=torch.tensor(0.0, dtype=torch.float64), seen=4, skipped=0, seconds=0.0, data_seconds=0.0)
    state = SimpleNamespace(meter=meter, batches_done=0, num_updates=0,
                            optimizer=SimpleNamespace(param_groups=[dict(lr=1.0)]))
    processes = Processes(0, 1, device_plan('cpu'))
    data = SimpleNamespace(seed=0, batches_per_epoch=4, accum=1, train_loader=SlowLoader(), loss_scale=lambda images: 1.0)
    optim = SimpleNamespace(step=lambda state: None)
    from tkvision.engine.healing import Healer
    clock = SimpleNamespace(log_interval=1, check=lambda state: False, healer=Healer.stopping(1))
    parts = loop_mod._Step(data, None, optim, clock, processes, RunLog('unused', [], main=False, epochs=1))
    loop_mod._run_batches(state, parts, 0, SimpleNamespace(update=lambda n: None, n=0, disable=True))
    assert 0.2 <= meter['data_seconds'] <= meter['seconds'] and state.batches_done == 4
    stats = loop_mod._epoch_stats(state, processes)
    assert stats['data_wait'] == pytest.approx(meter['data_seconds'] / meter['seconds']) and stats['data_wait'] > 0.6


def test_the_model_is_built_once_and_the_trainer_reads_its_config_in_place(tmp_path, monkeypatch):
    """A run builds its model once (``timm.create_model`` is called once: the model the input check refuses is the
    one that trains), and the ``Trainer`` keeps its parts and its ``TrainConfig`` as attributes (torchtitan's
    shape), no copies of its values beside them."""
    import timm

    from tkvision.engine.config import TrainConfig
    calls = []
    real = timm.create_model

    def counting(name, **kwargs):
        calls.append(name)
        return real(name, **kwargs)
    monkeypatch.setattr(timm, 'create_model', counting)
    trainer = train_mod.Trainer(fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64))
    trainer.train()
    assert calls == ['tokenformer_vit_ti16']
    assert isinstance(trainer.config, TrainConfig) and trainer.config.optim.epochs == 1
    for part in ('processes', 'data', 'step', 'clock', 'optim', 'evaluator', 'state', 'log', 'task'):
        assert getattr(trainer, part) is not None, part
    assert not hasattr(trainer, 'epochs') and not hasattr(trainer, 'out')


def test_a_global_batch_the_new_process_count_cannot_make_up_is_refused_naming_both(tmp_path):
    """A checkpoint of 2 processes whose global batch (96) one process of batch_size 64 cannot make up: refused in one
    line naming both and what to do; the checkpoint is left as it was. Every ``last.pth`` records the processes that
    wrote it and its global batch."""
    cfg = fmnist_cfg(tmp_path, epochs=2, train_subset=128, val_subset=64)
    path = os.path.join(cfg['output'], 'last.pth')
    train_mod.train(dict(cfg, epochs=1))
    state = torch.load(path, weights_only=True)
    assert (state['world_size'], state['global_batch']) == (1, 64)
    torch.save(dict(state, world_size=2, global_batch=96), path)
    before = open(path, 'rb').read()
    with pytest.raises(RunError, match=r'global batch of 96 on 2 process\(es\); 1 process\(es\) of batch_size 64 '
                                       r'cannot make it up'):
        train_mod.train(cfg, resume=True)
    assert open(path, 'rb').read() == before


def _updates(folder, first, last, batch, global_batch) -> dict:
    """``{update: sorted sample indices}`` of updates ``first`` to ``last`` (from 1) from the sampler orders recorded
    in ``folder`` (`tests.poison.log_samples`): rank r's micro-batch m of an epoch is its order's m-th slice of
    ``batch``; an update is ``global_batch / (batch x world)`` consecutive micro-batches of every rank."""
    found: dict = {}
    for name in os.listdir(folder):
        rec = json.load(open(os.path.join(folder, name)))
        accum = global_batch // (batch * rec['world'])
        per_epoch = (len(rec['order']) + rec['start']) // batch // accum
        for j in range(len(rec['order']) // batch):
            micro = rec['start'] // batch + j
            update = rec['epoch'] * per_epoch + micro // accum + 1
            if first <= update <= last:
                found.setdefault(update, set()).update(rec['order'][j * batch:(j + 1) * batch])
    return {u: sorted(v) for u, v in found.items()}


@pytest.mark.slow
def test_a_run_resumes_on_another_number_of_processes_with_the_same_samples_per_update(tmp_path):
    """2 -> 1 -> 2 processes (gloo): stopped (SIGTERM) mid-epoch on two, resumed on one (each update now two
    micro-batches of one process), stopped in the next epoch, resumed on two: every update trains the samples the
    uninterrupted two-process run's update does, the global batch and its lr stay, and with every random draw off
    the losses stay within 0.001 of the uninterrupted run's and the weights within 0.001 of their norm (the order
    of the gradients' sum differs, so not bit for bit; 2.5e-6 measured on 2026-12-06)."""
    from . import poison
    env_for = {}
    for run in ('full', 'moved'):
        (tmp_path / f'{run}_samples').mkdir()
        env_for[run] = dict(os.environ, PYTHONPATH=os.pathsep.join([poison.sitecustomize_dir(str(tmp_path / 'site')),
                                                                   ROOT]),
                            **{poison.SAMPLES_ENV: str(tmp_path / f'{run}_samples')})
    # every random draw off (the augmentations draw per loader stream, mixup and drop path per micro-batch and
    # process, so they differ on another process count by design): the losses differ only by the order in which
    # gradients are summed
    calm = ['--hflip', '0', '--reprob', '0', '--crop_padding', '0', '--mixup', '0', '--cutmix', '0',
            '--drop_path_rate', '0', '--log_interval', '1']
    args = lambda out: _args(out, workers=0) + calm  # noqa: E731
    full, moved = str(tmp_path / 'full'), str(tmp_path / 'moved')
    assert torchrun_train(args(full), env=env_for['full']).wait(timeout=600) == 0
    checkpoint = os.path.join(moved, 'last.pth')
    stops = []
    for nproc, until, extra in ((2, lambda s: s['num_updates'] >= 5, []), (1, lambda s: s['epochs_done'] == 1 and
                                                                            s['batches_done'] >= 8, ['--resume'])):
        p = torchrun_train(args(moved), extra, env=env_for['moved'], nproc=nproc)
        wait_for_checkpoint(checkpoint, p, until)
        p.send_signal(signal.SIGTERM)
        log = p.communicate(timeout=300)[0]
        assert 'stopped by SIGTERM' in log, log[-2000:]
        stops.append(ckpt.load_training_checkpoint(checkpoint)['num_updates'])
    log = torchrun_train(args(moved), ['--resume'], env=env_for['moved']).communicate(timeout=600)[0]
    assert 'resumed on 2 process(es) a run of 1: the global batch stays 64' in log, log[-3000:]
    total = ckpt.load_training_checkpoint(checkpoint)['num_updates']
    want = _updates(str(tmp_path / 'full_samples'), 1, total, 32, 64)
    got = _updates(str(tmp_path / 'moved_samples'), 1, total, 32, 64)
    assert len(want) == total == 2 * 32 and got == want and len(want[1]) == 64
    rows = [list(csv.DictReader(open(os.path.join(run, 'metrics.csv')))) for run in (full, moved)]
    for a, b in zip(*rows):
        assert abs(float(a['train_loss']) - float(b['train_loss'])) < 1e-3 and abs(float(a['val_loss']) -
                                                                                    float(b['val_loss'])) < 1e-3
    a, b = load_file(os.path.join(full, 'last.safetensors')), load_file(os.path.join(moved, 'last.safetensors'))
    distance = math.sqrt(sum(float((a[k] - b[k]).double().square().sum()) for k in a))
    size = math.sqrt(sum(float(a[k].double().square().sum()) for k in a))
    print(f'relative distance of the weights after 2 -> 1 -> 2 processes: {distance / size:.3g}')
    assert distance / size < 1e-3


@pytest.mark.slow
def test_ctrl_c_saves_the_run_says_how_to_continue_and_resume_is_bit_identical(tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group, loader workers included) in the middle of
    an epoch: the run saves at the next update, says how to continue in one line and exits 130; ``--resume`` then
    ends bit-identical to an uninterrupted run (it saved nothing and printed a traceback before)."""
    full, broken = str(tmp_path / 'full'), str(tmp_path / 'broken')
    p = _cli(_args(full, workers=0, epochs=1))
    assert p.wait(timeout=600) == 0, p.stdout.read()
    path = os.path.join(broken, 'last.pth')
    p = _cli(_args(broken, workers=2, epochs=1), start_new_session=True)
    wait_for_checkpoint(path, p, lambda s: s['batches_done'] >= 10)
    os.killpg(p.pid, signal.SIGINT)
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 130 and 'Traceback' not in log, log
    assert 'Ctrl-C: saving at the next update' in log and 'stopped by SIGINT at update' in log
    assert 'continue with --resume' in log
    stopped = ckpt.load_training_checkpoint(path)
    at = int(log.split('stopped by SIGINT at update ')[1].split(';')[0])
    assert 10 <= stopped['batches_done'] == at < 64  # the stop's own checkpoint, mid-epoch
    p = _cli(_args(broken, workers=2, epochs=1) + ['--resume'])
    log = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and f"batch {stopped['batches_done']}" in log, log
    a, b = load_file(os.path.join(full, 'last.safetensors')), load_file(os.path.join(broken, 'last.safetensors'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_ctrl_c_aborts_at_once_in_one_line(tmp_path, capsys):
    """After the first Ctrl-C the run's handler gives SIGINT back to Python, so a second raises KeyboardInterrupt
    where the run is; the command prints one line and exits 130 (a 25-line traceback before)."""
    from tkvision.cli.common import run_cli
    from tkvision.engine.clock import RunClock
    clock = RunClock(Processes(0, 1, device_plan(torch.device('cpu'))), str(tmp_path / 'last.pth'))
    previous = signal.signal(signal.SIGINT, clock.on_interrupt)
    try:
        signal.raise_signal(signal.SIGINT)
        assert clock.stop_signal == 'SIGINT' and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)

    def interrupted(argv):
        raise KeyboardInterrupt
    assert run_cli(interrupted, []) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ('interrupted by Ctrl-C: stopped at once, nothing saved since the last '
                                            'checkpoint') and 'Traceback' not in err
