"""Distillation and the elastic training choices of ``tkvision/engine/loss.py`` (docs/elastic.md): the loss
arithmetic on known logits, an elastic step's gradients through the task and the loop against a float64 autograd
reference, the removed options' errors, nesting by kind, a teacher from a finished run, and the keys' errors."""
import math
import os
import re
import shutil

import pytest
import timm
import torch

from tkvision.engine import loop as loop_mod, trainer as train_mod
from tkvision.engine.checkpoint import load_training_checkpoint
from tkvision.engine.config import ConfigError, load_config, section
from tkvision.engine.distributed import Processes, device_plan
from tkvision.engine.loss import TrainTask
from tkvision.engine.tasks.classify import distillation_loss
from tkvision.engine.runlog import RunLog
from tkvision.engine.tasks import TASKS
from tkvision.growth import elastic

from .helpers import assert_same_training_state, fmnist_cfg, train_crash_resume

KW = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=24, depth=2, num_heads=3, num_tokens=16, num_classes=10)


def _kl_by_hand(student, teacher, temperature):
    """T² · mean over rows of Σ_c p_t,c (log p_t,c − log p_s,c), in float64 with math's exp and log."""
    total = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        s = [v / temperature for v in s_row]
        t = [v / temperature for v in t_row]
        log_zs = math.log(sum(math.exp(v) for v in s))
        log_zt = math.log(sum(math.exp(v) for v in t))
        total += sum(math.exp(tc - log_zt) * ((tc - log_zt) - (sc - log_zs)) for sc, tc in zip(s, t))
    return temperature ** 2 * total / len(student)


def _task(**keys):
    cfg = load_config(None, dict(smoothing=0.0, **keys))
    return TrainTask(section(cfg, 'loss'), TASKS['classify'], 0, 4)


@pytest.mark.parametrize('temperature', [1.0, 2.5])
def test_the_distillation_loss_is_t_squared_kl_of_the_softened_predictions(temperature):
    """Known logits: the KL term equals T² KL(softmax(t/T) || softmax(s/T)) worked out with math; a student
    equal to its teacher costs 0; a mixed loss is w · CE + (1 − w) · KL."""
    student = torch.tensor([[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0]], dtype=torch.float64)
    teacher = torch.tensor([[1.0, 0.0, 0.0, -1.0], [-0.5, 2.0, 1.0, 0.0]], dtype=torch.float64)
    expected = _kl_by_hand(student, teacher, temperature)
    assert distillation_loss(student, teacher, temperature).item() == pytest.approx(expected, rel=1e-6)
    assert distillation_loss(teacher, teacher, temperature).item() == pytest.approx(0.0, abs=1e-7)
    labels = torch.tensor([0, 2])
    ce = -sum(math.log(math.exp(row[y]) / sum(math.exp(v) for v in row))
              for row, y in zip(student.tolist(), labels.tolist())) / 2
    task = _task(distillation_temperature=temperature, distillation_task_weight=0.3)
    assert task.objective.loss(student.float(), labels, teacher.float()).item() == pytest.approx(0.3 * ce + 0.7 * expected,
                                                                                       rel=1e-5)
    assert task.objective.loss(student.float(), labels, None).item() == pytest.approx(ce, rel=1e-6)  # no teacher: the labels alone


def test_an_elastic_step_through_the_task_and_the_loop_sums_each_prefixs_loss():
    """One elastic step (``elastic_sampling: all``, prefixes [whole, 1/2]) through ``TrainTask.losses`` and the
    loop's backward: the gradients equal those of CE(whole(x), y) + CE(prefix(x), y) in float64 autograd
    (MatFormer's joint objective), the meter holds the losses' mean, and the model runs at every token after."""
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', **KW).double()
    x = torch.randn(6, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (6,))
    whole = torch.nn.functional.cross_entropy(model(x), y)
    with elastic.prefix(model, 0.5):
        half = torch.nn.functional.cross_entropy(model(x), y)
    expected = torch.autograd.grad(whole + half, list(model.parameters()))
    cfg = load_config(None, dict(smoothing=0.0, elastic_fractions=[0.5, 1.0], elastic_sampling='all'))
    task = TrainTask(section(cfg, 'loss'), TASKS['classify'], 0, 10)
    state = _ModelState(model)
    parts = loop_mod._Step(_Data(), task, None, None, Processes(0, 1, device_plan('cpu')),
                           RunLog('unused', [], main=False, epochs=1))
    loop_mod._forward_backward(state, parts, x, y, 0, 0, scale=1.0, sync_grads=True)
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-12)
    assert state.meter['loss_sum'].item() == pytest.approx((whole + half).item() * 6 / 2, rel=1e-9)
    assert state.meter['seen'] == 6 and all(layer.prefix_tokens is None
                                            for layer in elastic.elastic_layers(model).values())


def _kl_autograd(student, teacher, temperature):
    p_t = torch.softmax(teacher / temperature, -1)
    return temperature ** 2 * (p_t * (p_t.log() - torch.log_softmax(student / temperature, -1))).sum(-1).mean()


class _ModelState:
    """The parts of a TrainState one forward/backward reads."""

    def __init__(self, model):
        self.model = self.net = model
        self.scaler = torch.amp.GradScaler('cpu', enabled=False)
        self.meter = dict(loss_sum=torch.zeros((), dtype=torch.float64), nonfinite=torch.zeros((), dtype=torch.bool),
                          seen=0)


class _Data:
    @staticmethod
    def preprocess(images, train):
        return images


@pytest.mark.parametrize('keys, words', [
    (dict(distillation='inplace'), "distillation: 'inplace' was removed: in-place distillation was lower"),
    (dict(elastic_sampling='sandwich'), "elastic_sampling: 'sandwich' was removed"),
    (dict(elastic_nesting='no_attention'), "elastic_nesting: 'no_attention' was removed"),
    (dict(backward_mode='compiled'), "backward_mode: 'compiled' was removed: it never beat closed_form"),
    (dict(elastic_tau='kept'), "elastic_tau was removed: prefixes keep the whole layer's tau"),
    (dict(elastic_start=0.1), 'elastic_start was removed: the smaller prefixes train from the first step'),
])
def test_a_removed_option_is_refused_in_one_line_saying_what_to_use(tmp_path, keys, words):
    """The options that lost (docs/elastic.md, docs/performance.md) are gone; a file or a command line that names
    one gets a ConfigError saying so and what to use, before any work."""
    path = tmp_path / 'old.yaml'
    path.write_text(''.join(f'{k}: {v}\n' for k, v in keys.items()))
    for load in (lambda: load_config(str(path)), lambda: load_config(None, [f'--{k}={v}' for k, v in keys.items()])):
        with pytest.raises(ConfigError, match=re.escape(words)):
            load()


def test_an_old_checkpoint_config_with_a_removed_key_reads_and_resumes_only_as_today():
    """A checkpoint written before the removal holds ``elastic_tau: kept`` and ``elastic_start: 0.0`` (what today's
    code does): its config reads, and resumes unchanged. One that trained with a delayed start or in-place
    distillation is refused on resume, naming the key."""
    from tkvision.engine.config import config_changes, migrate
    today = load_config(None)
    old = dict(today, elastic_tau='kept', elastic_start=0.0)
    assert migrate(old) == today and config_changes(old, today) == ([], [])
    _, forbidden = config_changes(dict(today, elastic_start=0.1), today)
    assert forbidden == ["elastic_start 0.1 -> removed (the smaller prefixes train from the first step (a delayed "
                         "start was measured only together with in-place distillation, lower on the means, "
                         "docs/elastic.md); delete the key)"]
    _, forbidden = config_changes(dict(today, distillation='inplace'), today)
    assert len(forbidden) == 1 and forbidden[0].startswith("distillation 'inplace' -> removed (in-place")


@pytest.mark.parametrize('removed', [dict(elastic_start=0.2), dict(elastic_tau='follow'),
                                     dict(distillation='inplace')])
def test_a_run_that_trained_with_a_removed_option_is_refused_on_resume_and_still_serves(tmp_path, removed):
    """A ``last.pth`` whose config holds a removed key or value it trained with (a delayed start, tau following the
    prefix, in-place distillation): resuming it is refused naming the key (its config is compared as saved, before
    migration drops the key), while the finished model still validates (``tkvision-validate`` of its ``last.pth``,
    and of its ``last.safetensors`` through the folder's ``config.yaml``) and serves as a teacher."""
    import yaml

    from tkvision.cli.train import validate_main
    from tkvision.engine.checkpoint import load_teacher
    cfg = fmnist_cfg(tmp_path, epochs=1, train_subset=128, val_subset=64)
    train_mod.train(cfg)
    out = cfg['output']
    ckpt = torch.load(os.path.join(out, 'last.pth'), weights_only=True)
    ckpt['config'] = dict(ckpt['config'], **removed)
    torch.save(ckpt, os.path.join(out, 'last.pth'))
    written = yaml.safe_load(open(os.path.join(out, 'config.yaml')))
    with open(os.path.join(out, 'config.yaml'), 'w') as f:
        yaml.safe_dump(dict(written, **removed), f)
    name = next(iter(removed))
    with pytest.raises(ConfigError, match=f'cannot change when resuming.*{name} .* -> removed'):
        train_mod.train(dict(cfg, epochs=2), resume=True)
    assert validate_main(['--checkpoint', os.path.join(out, 'last.pth'), '--val_subset', '64']) == 0
    assert validate_main(['--checkpoint', os.path.join(out, 'last.safetensors'), '--val_subset', '64']) == 0
    teacher = load_teacher(os.path.join(out, 'last.safetensors'), torch.device('cpu'))
    assert teacher.num_classes == 10 and not teacher.training


@pytest.mark.parametrize('nesting, shrunk', [('all', {'patch', 'qkv', 'proj', 'ffn'}), ('ffn', {'ffn'})])
def test_nesting_shrinks_only_its_kinds_and_counts_their_parameters(nesting, shrunk):
    """A fraction shrinks the Pattentions of the nesting's kinds and leaves the others whole; the prefix's
    parameters are the extracted copy's, and the copy gives the prefix's logits."""
    model = timm.create_model('tokenformer_vit_ti16', **KW).eval()
    counts = elastic.prefix_counts(model, 0.25, nesting)
    for name, layer in elastic.elastic_layers(model).items():
        expected = round(0.25 * layer.num_tokens) if layer.kind in shrunk else layer.num_tokens
        assert counts[name] == expected, name
    copy = elastic.extract_prefix(model, 0.25, nesting=nesting)
    assert elastic.prefix_parameters(model, 0.25, nesting) == sum(p.numel() for p in copy.parameters())
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad(), elastic.prefix(model, 0.25, nesting=nesting):
        torch.testing.assert_close(copy(x), model(x))
    with pytest.raises(ValueError, match="unknown elastic nesting 'mlp'"):
        elastic.prefix_counts(model, 0.25, 'mlp')


def test_a_twin_distilled_from_a_finished_run_learns_from_its_predictions(tmp_path, monkeypatch):
    """``distillation: teacher`` builds the teacher from a finished run's weights and config.yaml; a run that
    learns from it alone (task weight 0) differs from the same run on labels, and resumes bit-identically."""
    small = dict(train_subset=512, val_subset=256)  # 8 steps an epoch: two checkpoints in the student's 16
    teacher = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'teacher'), epochs=1, **small))
    path = str(tmp_path / 'teacher' / 'last.safetensors')
    keys = dict(distillation='teacher', teacher=path, epochs=2, checkpoint_every_steps=5, **small)
    student = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'student'), **keys))
    plain = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'plain'), epochs=2, **small))
    assert teacher['top1'] is not None and student['history'][-1]['train_loss'] != plain['history'][-1]['train_loss']
    train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'crashed'), **keys), saves=2)
    assert_same_training_state(tmp_path / 'student' / 'last.pth', tmp_path / 'crashed' / 'last.pth')


@pytest.mark.slow
def test_elastic_training_with_every_prefix_each_step_resumes_bit_identically(tmp_path, monkeypatch):
    """Every prefix each step (``elastic_sampling: all``) with an EMA, crashed after a checkpoint and resumed, ends
    with the uninterrupted run's weights, optimizer and EMA; each prefix is reported."""
    keys = dict(elastic_fractions=[0.25, 0.5, 1.0], elastic_sampling='all', epochs=2, model_ema=True,
                checkpoint_every_steps=5)
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **keys))
    assert {'top1@0.25', 'top1@0.5'} <= set(full['history'][-1])
    train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'crashed'), **keys), saves=2)
    assert_same_training_state(tmp_path / 'full' / 'last.pth', tmp_path / 'crashed' / 'last.pth')


@pytest.mark.parametrize('keys, message', [
    (dict(distillation='teacher'), "distillation 'teacher' and the key teacher go together"),
    (dict(teacher='runs/x/last.safetensors'), "distillation 'teacher' and the key teacher go together"),
    (dict(distillation='teacher', teacher='nowhere/last.safetensors'), 'teacher: no weights file'),
    (dict(distillation_temperature=0), 'distillation_temperature must be a number > 0'),
    (dict(elastic_nesting='mlp', elastic_fractions=[0.5, 1.0]), 'elastic_nesting must be one of'),
])
def test_distillation_keys_are_checked_before_any_work(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        train_mod.train(fmnist_cfg(tmp_path, **keys))


def test_a_resume_whose_teacher_changed_is_refused_naming_the_file(tmp_path, monkeypatch, capsys):
    """The teacher's weights file replaced by another run's between a kill and ``--resume``: the run went on,
    silently, towards other targets. The checkpoint records the teacher's sha256 (and init_from's): the resume is
    refused naming the file; a changed ``init_from`` (read once, at the start) only says so."""
    first = fmnist_cfg(tmp_path, output=str(tmp_path / 'teacher'), epochs=1)
    train_mod.train(first)
    train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'other'), epochs=1, seed=5))
    path = str(tmp_path / 'teacher' / 'last.safetensors')
    cfg = fmnist_cfg(tmp_path, output=str(tmp_path / 'student'), distillation='teacher', teacher=path, epochs=2,
                     init_from=path)
    from tkvision.engine import clock as clock_mod
    real = clock_mod.save_training_checkpoint

    def killed(checkpoint, where):  # killed right after the first checkpoint
        real(checkpoint, where)
        raise KeyboardInterrupt('killed')
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', killed)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(cfg)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real)
    saved = load_training_checkpoint(str(tmp_path / 'student' / 'last.pth'))['inputs']
    assert saved['teacher']['path'] == path and len(saved['teacher']['sha256']) == 64
    shutil.copyfile(tmp_path / 'other' / 'last.safetensors', path)
    with pytest.raises(ConfigError, match=rf'teacher: {re.escape(path)} is not the file this run started from'):
        train_mod.train(cfg, resume=True)
    # init_from alone: read once, at the start, so the resume goes on and says so
    plain = fmnist_cfg(tmp_path, output=str(tmp_path / 'tuned'), epochs=2, init_from=path)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', killed)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(plain)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real)
    shutil.copyfile(tmp_path / 'teacher' / 'best.safetensors', path)
    capsys.readouterr()
    assert train_mod.train(plain, resume=True)['epochs'] == 2
    assert f'note: init_from: {path} is not the file this run started from' in capsys.readouterr().out


@pytest.mark.parametrize('teacher_kwargs, words', [
    (dict(num_classes=3), 'teacher: its model predicts 3 classes and this run\'s 10'),
    (dict(in_chans=3), 'teacher: its model takes 3-channel images and this run\'s 1'),
    (dict(task='mae'), 'is a masked autoencoder\'s (task: mae'),
])
def test_a_teacher_that_cannot_teach_this_run_is_refused_before_any_work(tmp_path, teacher_kwargs, words):
    """A teacher of 3 classes for a 10-class run, of 3-channel images for 1-channel ones, or an MAE: a raw
    RuntimeError / AttributeError at the first step. Each is one ConfigError naming the mismatch, before a step."""
    from tkvision.engine.checkpoint import save_weights
    from tkvision.engine.runlog import save_yaml
    from tkvision.engine.config import model_for_config, resolve_run_config

    from .helpers import TINY_FMNIST
    task = teacher_kwargs.pop('task', 'classify')
    folder = tmp_path / 'teacher'
    folder.mkdir()
    kwargs = dict(TINY_FMNIST, **teacher_kwargs)
    teacher_cfg = load_config(None, dict(model='tokenformer_vit_ti16', model_kwargs=kwargs, task=task,
                                         decoder=dict(embed_dim=32, depth=1, num_heads=2)))
    save_yaml(teacher_cfg, str(folder / 'config.yaml'))
    save_weights(model_for_config(resolve_run_config(teacher_cfg)).state_dict(), str(folder / 'last.safetensors'))
    cfg = fmnist_cfg(tmp_path, distillation='teacher', teacher=str(folder / 'last.safetensors'), epochs=1)
    with pytest.raises(ConfigError, match=re.escape(words)):
        train_mod.train(cfg)
    assert not (tmp_path / 'run' / 'last.pth').exists()
