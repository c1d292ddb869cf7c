"""Checkpoints written by the previous release (commit e4849f2, before the package was reorganised)
still load, resume and give the same outputs; and the weights of a run that grew during training load
in every tool (validate, export, mae_visualize, attention_distance).

``tests/data/legacy_e4849f2/`` holds two tiny runs of that commit, both grown during training
(``growth.every_epochs: 1``) with EMA, and the outputs its code computed from them
(``expected.safetensors``); ``make_fixture.py`` there is the script that wrote them.
"""
import os
import shutil

import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file

from tkvision import growth
from studies.ringformer.attention_distance import main as attention_distance_main
from tkvision.cli.train import validate_main
from tkvision.cli.weights import export_main, mae_visualize_main
from tkvision.engine.checkpoint import load_training_checkpoint, model_for_checkpoint
from tkvision.engine.config import load_config
from tkvision.engine.trainer import train

from .helpers import ROOT

LEGACY = os.path.join(ROOT, 'tests', 'data', 'legacy_e4849f2')
EXPECTED = load_file(os.path.join(LEGACY, 'expected.safetensors'))
#: What the runs grew to (their configs build the starting size: 8 tokens, 32 FFN tokens).
GROWN = dict(patch=8, qkv=12, proj=8, ffn=40)


def _legacy(name):
    return os.path.join(LEGACY, name)


def _run_config(tmp_path, task='classify') -> str:
    """The legacy run's config as a YAML file (what its ``config.yaml`` held), output in ``tmp_path``."""
    cfg = dict(load_training_checkpoint(_legacy(f'{task}_last.pth'))['config'], output=str(tmp_path / 'out'))
    path = tmp_path / f'{task}.yaml'
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_legacy_classifier_loads_grown_with_the_outputs_its_code_computed():
    ckpt = load_training_checkpoint(_legacy('classify_last.pth'))
    assert ckpt['config']['freeze_loaded_tokens'] is False  # the renamed key, migrated
    for path in (_legacy('classify_last.pth'), _legacy('classify_last.safetensors')):
        model, grown = model_for_checkpoint(ckpt['config'], path)
        assert growth.token_counts(model) == GROWN and grown == {'qkv': (8, 12), 'ffn': (32, 40)}
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(EXPECTED['images']), EXPECTED['classify_logits'], rtol=0, atol=1e-6)


def test_a_legacy_mae_loads_grown_with_the_predictions_its_code_computed():
    ckpt = load_training_checkpoint(_legacy('mae_last.pth'))
    model, _ = model_for_checkpoint(ckpt['config'], _legacy('mae_last.safetensors'))
    assert growth.token_counts(model)['decoder_ffn'] == 40
    noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, pred, _ = model.eval()(EXPECTED['images'], None, noise)
    torch.testing.assert_close(pred, EXPECTED['mae_pred'], rtol=0, atol=1e-6)


def test_a_legacy_training_checkpoint_resumes(tmp_path):
    """A last.pth of the previous release continues (one more epoch) under today's trainer."""
    shutil.copy(_legacy('classify_last.pth'), tmp_path / 'last.pth')
    cfg = load_config(None, dict(epochs=3, output=str(tmp_path)), base=load_training_checkpoint(str(tmp_path / 'last.pth'))['config'])
    res = train(cfg, resume=True)
    assert [r['epoch'] for r in res['history']] == [2] and growth.token_counts(res['model']) == GROWN


def test_validate_loads_a_grown_run(tmp_path, capsys):
    assert validate_main(['--checkpoint', _legacy('classify_last.pth')]) == 0
    out = capsys.readouterr().out
    assert 'grown to the checkpoint' in out and 'on 64 val images: top-1' in out
    assert validate_main(['--config', _run_config(tmp_path), '--checkpoint', _legacy('classify_last.safetensors')]) == 0


def test_export_writes_a_grown_run_at_its_size(tmp_path):
    out = str(tmp_path / 'exported')
    assert export_main(['--checkpoint', _legacy('classify_last.pth'), '--out', out]) == 0
    model = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(EXPECTED['images']), EXPECTED['classify_logits'], rtol=0, atol=1e-6)


def test_mae_visualize_draws_a_grown_run(tmp_path):
    out = str(tmp_path / 'recon.png')
    assert mae_visualize_main(['--checkpoint', _legacy('mae_last.pth'), '--out', out, '--num-images', '2']) == 0
    assert Image.open(out).size == (4 * 28 * 4, 2 * 28 * 4)


def test_attention_distance_reads_a_grown_run(tmp_path, capsys):
    """Before the checkpoint owner, this tool loaded weights without growing the model first and
    stopped with WeightsMismatchError on any run that grew during training."""
    out = str(tmp_path / 'mad.png')
    assert attention_distance_main(['--config', _run_config(tmp_path), '--checkpoint', _legacy('classify_last.safetensors'),
                                    '--num-images', '8', '--batch-size', '8', '--out', out]) == 0
    assert os.path.isfile(out) and 'MAD per layer' in capsys.readouterr().out


def test_two_identical_runs_write_byte_identical_weights_files(tmp_path):
    """safetensors writes its metadata in a per-process random order, so two identical runs' weights files had
    other sha256 digests (and the same run's weights compared unequal by hash). Their keys are sorted now."""
    import hashlib

    from tkvision.engine.trainer import train

    from .helpers import fmnist_cfg
    digests = []
    for name in ('a', 'b'):
        train(fmnist_cfg(tmp_path, output=str(tmp_path / name), epochs=1, train_subset=256, val_subset=64))
        digests.append({f: hashlib.sha256((tmp_path / name / f).read_bytes()).hexdigest()
                        for f in ('last.safetensors', 'best.safetensors')})
    assert digests[0] == digests[1]
