"""Distillation and the elastic training choices of ``tkvision/engine/loss.py`` (docs/elastic.md): the loss
arithmetic on known logits, in-place distillation's gradients against a float64 autograd reference, the
sandwich rule, the delayed start, nesting by kind, a teacher from a finished run, and the keys' errors."""
import math
import re
import shutil

import pytest
import timm
import torch

from tkvision.engine import loop as loop_mod, trainer as train_mod
from tkvision.engine.checkpoint import load_training_checkpoint
from tkvision.engine.config import ConfigError, load_config, section
from tkvision.engine.distributed import Processes, device_plan
from tkvision.engine.loss import RunLoss, distillation_loss
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


def _loss(**distillation):
    cfg = load_config(None, dict(smoothing=0.0, **distillation))
    loss = RunLoss('classify', section(cfg, 'optim'), section(cfg, 'elastic'), section(cfg, 'distillation'), 0, 10,
                   torch.device('cpu'))
    loss.set_classes(4)
    return loss


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
    loss = _loss(distillation_temperature=temperature, distillation_task_weight=0.3)
    assert loss(student.float(), labels, teacher.float()).item() == pytest.approx(0.3 * ce + 0.7 * expected, rel=1e-5)
    assert loss(student.float(), labels).item() == pytest.approx(ce, rel=1e-6)  # no soft target: the labels alone


def test_inplace_distillation_teaches_each_prefix_from_the_whole_models_detached_predictions():
    """One elastic step with ``distillation: inplace`` (prefixes [whole, 1/2]): the gradients equal those of
    CE(whole(x), y) + KL(prefix(x) || stop_gradient(whole(x))) computed in float64 with autograd, so the
    prefix's loss moves no parameter through the teacher's side."""
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', **KW).double()
    x = torch.randn(6, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (6,))
    whole = model(x)
    with elastic.prefix(model, 0.5):
        half = model(x)
    reference = torch.nn.functional.cross_entropy(whole, y) + _kl_autograd(half, whole.detach(), 2.0)
    expected = torch.autograd.grad(reference, list(model.parameters()))
    cfg = load_config(None, dict(smoothing=0.0, elastic_fractions=[0.5, 1.0], distillation='inplace',
                                 distillation_temperature=2.0))
    loss = RunLoss('classify', section(cfg, 'optim'), section(cfg, 'elastic'), section(cfg, 'distillation'), 0, 1,
                   torch.device('cpu'))
    loss.set_classes(10)
    state = _ModelState(model)
    data = _Data()
    loop_mod._forward_backward(state, data, loss, x, y, None, scale=1.0, sync_grads=True, prefixes=[None, 0.5])
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-12)
    assert state.meter['loss_sum'].item() == pytest.approx(reference.item() * 6 / 2, rel=1e-9)


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
    processes = Processes(0, 1, device_plan('cpu'))

    @staticmethod
    def preprocess(images, train):
        return images


def test_the_sandwich_rule_trains_the_largest_the_smallest_and_one_between():
    """'sandwich': every step the largest and the smallest fraction, largest first, and one of those between
    drawn uniformly (counted over 3,000 draws against 1/2 each)."""
    g = torch.Generator().manual_seed(0)
    draws = [tuple(elastic.step_fractions([0.25, 0.5, 0.75, 1.0], 'sandwich', g)) for _ in range(3000)]
    assert {(d[0], d[2]) for d in draws} == {(1.0, 0.25)} and all(len(d) == 3 for d in draws)
    assert abs(sum(d[1] == 0.5 for d in draws) / 3000 - 0.5) < 0.03
    assert elastic.step_fractions([0.5, 1.0], 'sandwich', g) == [1.0, 0.5]


def test_the_smaller_prefixes_start_after_elastic_start_of_the_steps():
    """``elastic_start: 0.5`` over 2 epochs of 10 steps: the first 10 steps train the whole model alone, every
    later one the whole model and one smaller prefix."""
    cfg = load_config(None, dict(epochs=2, elastic_fractions=[0.25, 0.5, 1.0], elastic_start=0.5))
    loss = RunLoss('classify', section(cfg, 'optim'), section(cfg, 'elastic'), section(cfg, 'distillation'), 0, 10,
                   torch.device('cpu'))
    steps = [loss.step_prefixes(epoch, batch) for epoch in range(2) for batch in range(10)]
    assert steps[:10] == [[None]] * 10
    assert all(s[0] is None and len(s) == 2 and s[1] in (0.25, 0.5) for s in steps[10:])


@pytest.mark.parametrize('nesting, shrunk', [('all', {'patch', 'qkv', 'proj', 'ffn'}), ('ffn', {'ffn'}),
                                             ('no_attention', {'patch', 'ffn'})])
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
    teacher = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'teacher'), epochs=1))
    path = str(tmp_path / 'teacher' / 'last.safetensors')
    keys = dict(distillation='teacher', teacher=path, epochs=2, checkpoint_every_steps=5)
    student = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'student'), **keys))
    plain = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'plain'), epochs=2))
    assert teacher['top1'] is not None and student['history'][-1]['train_loss'] != plain['history'][-1]['train_loss']
    train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'crashed'), **keys), saves=2)
    assert_same_training_state(tmp_path / 'student' / 'last.pth', tmp_path / 'crashed' / 'last.pth')


def test_inplace_distilled_elastic_training_resumes_bit_identically(tmp_path, monkeypatch):
    """The sandwich rule with in-place distillation and a delayed start, crashed after a checkpoint and resumed,
    ends with the uninterrupted run's weights, optimizer and EMA; each prefix is reported."""
    keys = dict(elastic_fractions=[0.25, 0.5, 1.0], elastic_sampling='sandwich', distillation='inplace',
                elastic_start=0.25, distillation_temperature=2.0, epochs=2, model_ema=True, checkpoint_every_steps=5)
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **keys))
    assert {'top1@0.25', 'top1@0.5'} <= set(full['history'][-1])
    train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'crashed'), **keys), saves=2)
    assert_same_training_state(tmp_path / 'full' / 'last.pth', tmp_path / 'crashed' / 'last.pth')


@pytest.mark.parametrize('keys, message', [
    (dict(distillation='inplace'), "distillation 'inplace' teaches an elastic run's smaller prefixes"),
    (dict(distillation='inplace', elastic_fractions=[0.5, 1.0], elastic_sampling='random'),
     "needs the whole model, its teacher, in every step"),
    (dict(distillation='teacher'), "distillation 'teacher' and the key teacher go together"),
    (dict(teacher='runs/x/last.safetensors'), "distillation 'teacher' and the key teacher go together"),
    (dict(elastic_start=0.5), 'elastic_start delays the smaller prefixes of an elastic run'),
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
    from tkvision.engine.build import model_for_config
    from tkvision.engine.checkpoint import save_weights, save_yaml
    from tkvision.engine.config import resolve_run_config

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
