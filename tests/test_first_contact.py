"""What a new user meets first, each fixed with a test that failed before."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from tkvision.engine import trainer as train_mod
from tkvision.engine.config import load_config
from tkvision.utils.errors import ConfigError, RunError

from .helpers import ROOT, fmnist_cfg, wait_for_checkpoint


def test_a_run_without_a_recipe_says_what_the_model_needs_before_any_work(tmp_path):
    """``tools/train.py --output runs/x`` (Fashion-MNIST and tokenformer_vit_ti16 at 224 px, 3 channels)
    died at the first batch with "Input size (28x28) does not match the model (224x224)"."""
    with pytest.raises(ConfigError, match=r'28 x 28 px, 1 channel.*224 x 224 px, 3 channels.*in_chans: 1'):
        train_mod.train(load_config(None, dict(output=str(tmp_path / 'run'), threads=1)))
    assert not os.path.exists(tmp_path / 'run' / 'last.pth')


def test_a_yaml_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """PyYAML silently keeps the last of two equal keys."""
    path = tmp_path / 'twice.yaml'
    path.write_text('epochs: 2\nlr: 1.0e-3\nepochs: 3\n')
    with pytest.raises(ConfigError, match=r"twice.yaml: key 'epochs' is given twice \(lines 1 and 3\)"):
        load_config(str(path))
    tabs = tmp_path / 'tabs.yaml'
    tabs.write_text('model_kwargs:\n\timg_size: 28\n')
    with pytest.raises(ConfigError, match='tabs.yaml is not valid YAML'):
        load_config(str(tabs))


def test_a_second_run_through_make_is_told_the_make_way_out(tmp_path, monkeypatch):
    cfg = fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64)
    train_mod.train(cfg)
    monkeypatch.setenv('MAKELEVEL', '1')
    with pytest.raises(RunError, match=re.escape('make train ARGS=--resume') + '.*' + re.escape('ARGS="--output')):
        train_mod.train(cfg)


def test_a_one_epoch_smoke_run_without_a_recipe_warmup_is_accepted(tmp_path, capsys):
    """``--epochs 1`` failed with "warmup_epochs must be < epochs (1), got 1.0" (the default warmup):
    a warmup as long as the run now takes the whole run, and the run says so."""
    res = train_mod.train(fmnist_cfg(tmp_path, epochs=1, warmup_epochs=1.0, train_subset=128, val_subset=64))
    assert res['top1'] is not None and 'the warmup takes the whole run' in capsys.readouterr().out
    with pytest.raises(ConfigError, match='warmup_epochs'):  # a growth stage's warmup must still fit its stage
        fmnist_cfg(tmp_path, epochs=2, growth=dict(schedule=[dict(at_epoch=1, to={'qkv': 32}, warmup_epochs=1.0)]))


def test_the_curves_say_which_losses_were_trained(tmp_path):
    """curves.png called the train loss "as trained: smoothing, mixup" with both off."""
    from tkvision.engine.config import section
    cfg = load_config(None, dict(smoothing=0.0))
    assert section(cfg, 'loss').train_loss_label() == 'train loss'
    assert section(load_config(None, dict(smoothing=0.1, cutmix=1.0)), 'loss').train_loss_label() == \
        'train loss (as trained: label smoothing 0.1, cutmix)'


def test_the_default_threads_follow_the_cores_this_process_may_use(monkeypatch):
    """The default took the machine's core count; with fewer cores allowed (affinity, several local
    processes) the OpenMP threads oversubscribed them."""
    from tkvision.engine.distributed import ProcessConfig
    from tkvision.engine.distributed import available_cores, setup_threads
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1, 2, 3})
        monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
        assert available_cores() == 2
        setup_threads(ProcessConfig(threads=None))
        assert torch.get_num_threads() == 2
        monkeypatch.setenv('LOCAL_WORLD_SIZE', '8')
        setup_threads(ProcessConfig(threads=None))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_pre_empted_run_says_so_on_its_own_line(tmp_path):
    """The exit-75 message was glued to the progress bar's line."""
    args = [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), '--output', str(tmp_path / 'run'),
            '--model_kwargs', '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 32, depth: 1, num_heads: 2, '
            'num_tokens: 16}', '--rrc_scale', 'null', '--epochs', '50', '--warmup_epochs', '0.5', '--train_subset', '4096',
            '--val_subset', '64', '--batch_size', '8', '--threads', '1', '--log_interval', '1',
            '--checkpoint_every_steps', '20']
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # training, not starting: a fixed 12 s wait sent SIGTERM before the handlers were set on a loaded runner
    wait_for_checkpoint(str(tmp_path / 'run' / 'last.pth'), p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == train_mod.EXIT_PREEMPTED, err[-2000:]
    assert re.search(r'(^|[\r\n])stopped by SIGTERM', err), err[-300:]


def test_train_help_says_every_config_key_is_an_option_and_its_examples_parse(capsys):
    """``tkvision-train --help`` lists four options of its own; it must also say that every config key is one, where
    the keys are, and show examples a user can copy: each one parses to the config it names."""
    import shlex

    from tkvision.cli.train import parse_train_args
    with pytest.raises(SystemExit):
        parse_train_args(['--help'])
    text = capsys.readouterr().out
    assert 'Every config key is also an option' in text and 'docs/reference/config.md' in text
    examples = [line.split('tkvision-train', 1)[1] for line in text.splitlines() if line.startswith('  tkvision-train')]
    assert len(examples) >= 3, text
    for example in examples:
        cfg, resume = parse_train_args(shlex.split(example))
        options = dict(zip(shlex.split(example)[::2], shlex.split(example)[1::2]))
        assert resume is None and cfg['epochs'] == int(options.get('--epochs', cfg['epochs'])), example
        if '--model_kwargs' in options:
            assert cfg['model_kwargs']['num_tokens'] == 96
        if '--init_from' in options:
            assert cfg['init_from'] == options['--init_from']


def test_the_default_threads_leave_the_cores_other_work_keeps_busy(monkeypatch):
    """Beside another CPU-bound job the 2-thread default ran several times slower than 1 thread: the default now
    takes the free cores, measured once at the start, and says so. ``busy_cores`` reads the kernel's counters: a
    busy loop pinned to one core reads as (nearly) one busy core."""
    import subprocess

    from tkvision.engine import distributed
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    monkeypatch.delenv('LOCAL_WORLD_SIZE', raising=False)
    monkeypatch.setattr(distributed, 'busy_cores', lambda cpus, seconds=0.3: 1.1)
    assert distributed.default_threads() == (1, '2 cores, 1.1 busy with other work at start')
    monkeypatch.setattr(distributed, 'busy_cores', lambda cpus, seconds=0.3: 0.2)
    assert distributed.default_threads() == (2, '2 cores, idle at start')
    monkeypatch.undo()
    loop = subprocess.Popen([sys.executable, '-c', 'import os; os.sched_setaffinity(0, {0})\nwhile True: pass'])
    try:
        import time
        time.sleep(0.5)
        assert distributed.busy_cores([0], seconds=0.5) > 0.8
    finally:
        loop.kill()
        loop.wait()
