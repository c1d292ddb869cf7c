"""Tasks as classes (``tkvision.engine.tasks``): a classification run's per-class top-1 and confusion matrix against
an independent count, and the fourth task, ``regress``, trained, resumed, validated and exported through the same
commands, each message naming it."""
import csv
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tkvision.cli.train import train_main, validate_main
from tkvision.cli.weights import export_main
from tkvision.data import build_dataset, registry
from tkvision.data.fashion_mnist import ArrayDataset
from tkvision.data.transforms import build_transform
from tkvision.engine.config import load_config, resolve_run_config
from tkvision.engine.tasks import TASKS, Task
from tkvision.engine.trainer import build_train_model

from .helpers import TINY_FMNIST

TINY_ARGS = ['--model_kwargs', str(TINY_FMNIST), '--batch_size', '64', '--threads', '1', '--progress', 'false']


def test_a_classification_run_writes_per_class_top1_and_the_confusion_matrix_of_its_test_split(tmp_path, capsys):
    """``per_class.csv`` and ``confusion_matrix.csv`` of the last weights on the test split equal a count made here
    from ``last.safetensors``'s predictions, and their diagonal gives the run's ``test_top1``; the PNG is beside."""
    out = tmp_path / 'run'
    assert train_main(['--config', 'fashion_mnist/quick', '--epochs', '1', '--train_subset', '640', '--val_subset',
                       '128', '--output', str(out)] + TINY_ARGS) == 0
    assert 'per class: ' in capsys.readouterr().out
    config = resolve_run_config(load_config(str(out / 'config.yaml')))
    model, _, _ = build_train_model(config.model, config.mae, 10, TASKS['classify'], torch.device('cpu'))
    model.load_state_dict(load_file(out / 'last.safetensors'))
    test = build_dataset(config.data, 'test', config.run.seed)
    images = torch.stack([torch.as_tensor(test[i][0]) for i in range(len(test))]).float()
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) * 255 for v in config.data.mean_std())
    with torch.no_grad():
        predicted = model.eval()((images - mean) / std).argmax(1).numpy()
    labels = np.array([test[i][1] for i in range(len(test))])
    expected = np.zeros((10, 10), dtype=int)
    np.add.at(expected, (labels, predicted), 1)
    with open(out / 'confusion_matrix.csv') as f:
        rows = list(csv.reader(f))
    assert rows[0][1:] == ['t-shirt_top', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag',
                           'ankle_boot']
    assert np.array_equal(np.array([[int(v) for v in r[1:]] for r in rows[1:]]), expected)
    with open(out / 'per_class.csv') as f:
        per_class = list(csv.DictReader(f))
    assert [int(r['images']) for r in per_class] == [1000] * 10 and {r['split'] for r in per_class} == {'test'}
    assert [float(r['top1']) for r in per_class] == pytest.approx(100 * np.diag(expected) / 1000, abs=0.005)
    with open(out / 'metrics.csv') as f:
        test_top1 = float(list(csv.DictReader(f))[-1]['test_top1'])
    assert test_top1 == pytest.approx(100 * np.trace(expected) / 10000)
    assert (out / 'confusion_matrix.png').stat().st_size > 1000

    report = tmp_path / 'report'
    assert validate_main(['--checkpoint', str(out / 'last.safetensors'), '--split', 'test', '--out',
                          str(report)]) == 0
    with open(report / 'confusion_matrix.csv') as f:
        assert list(csv.reader(f)) == rows  # tkvision-validate writes the same report of the same weights


def _numbers(split):
    """A toy regression: 28 x 28 grey images whose label is their mean brightness in [0, 1]."""
    rng = np.random.default_rng(0 if split == 'train' else 1)
    images = rng.integers(0, 256, (192 if split == 'train' else 64, 28, 28), dtype=np.uint8)
    images[: len(images) // 2] //= 3  # half of them darker: something to learn
    return images, images.reshape(len(images), -1).mean(1) / 255


@pytest.fixture
def numbers_source(monkeypatch):
    def split(data, name, seed, class_to_idx, rank, world_size):
        return ArrayDataset(*_numbers(name), build_transform(data, name == 'train', seed, resize=False))
    monkeypatch.setitem(registry._SOURCES, 'numbers', registry.DataSource(split, None, needs_data_dir=False, channels=1,
                                                                           num_classes=1))
    return ['--dataset', 'numbers', '--img_size', '28', '--mean', '[0.5]', '--std', '[0.25]', '--crop_pct', '1.0',
            '--interpolation', 'bilinear', '--rrc_scale', 'null', '--hflip', '0', '--smoothing', '0']


def test_regress_the_fourth_task_trains_resumes_validates_and_exports_naming_itself(tmp_path, capsys,
                                                                                   numbers_source):
    """``task: regress`` (one module, ``tkvision/engine/tasks/regress.py``): a one-output head, the MSE and mean
    absolute error in ``metrics.csv`` (the lowest validation MSE picks the best weights), a resume that continues, and
    ``tkvision-validate`` / ``tkvision-export`` / the end-of-run message that say regression, not MAE."""
    out = tmp_path / 'run'
    args = ['--task', 'regress', '--output', str(out), '--lr', '1e-3'] + TINY_ARGS + numbers_source
    assert train_main(args + ['--epochs', '1']) == 0
    first = capsys.readouterr().out
    assert train_main(args + ['--epochs', '2', '--resume']) == 0
    done = capsys.readouterr().out
    assert 'resumed from' in done and 'regression, final validation MSE' in done and 'reconstruction' not in done
    with open(out / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['epoch'] for r in rows] == ['0', '1'] and 'top1' not in rows[0]
    images, labels = _numbers('val')
    assert float(rows[-1]['val_loss']) < float(np.var(labels)) * 4  # finite, and on the labels' scale
    assert float(rows[-1]['val_abs_error']) ** 2 <= float(rows[-1]['val_loss']) + 1e-9  # Jensen: MAE^2 <= MSE
    weights = load_file(out / 'best.safetensors')
    assert weights['head.weight'].shape[0] == 1 and 'regression' in first
    assert validate_main(['--checkpoint', str(out / 'last.pth')]) == 0
    line = capsys.readouterr().out
    assert '(regression) on 64 val images: MSE' in line
    assert float(line.split('MSE ')[1].split()[0]) == pytest.approx(float(rows[-1]['val_loss']), rel=1e-3)
    assert export_main(['--checkpoint', str(out / 'last.pth'), '--out', str(tmp_path / 'export')]) == 0
    assert 'of a task regress run' in capsys.readouterr().out


def test_a_regression_refuses_what_only_a_classifier_uses(tmp_path, numbers_source, capsys):
    for extra, key in ((['--mixup', '0.8'], 'mixup'), (['--distillation', 'teacher', '--teacher', 'x'], 'distillation')):
        assert train_main(['--task', 'regress', '--output', str(tmp_path / key)] + TINY_ARGS + numbers_source +
                          extra) == 2
        err = capsys.readouterr().err
        assert f'{key} ' in err and 'task regress has none' in err and len(err.strip().splitlines()) == 1


def test_every_task_says_what_a_stage_asks():
    """Each registered task is a `Task` subclass with its name, description and best-weights rule, and overrides the
    step and the evaluation (the base has none: a task without them would fail at its first step)."""
    assert set(TASKS) == {'classify', 'mae', 'linprobe', 'regress'}
    for name, task in TASKS.items():
        assert isinstance(task, Task) and task.name == name and task.description
        assert task.best[1] in ('min', 'max')
        assert type(task).objective is not Task.objective and type(task).evaluate is not Task.evaluate
