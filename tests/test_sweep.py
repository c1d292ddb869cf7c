"""Ablation sweep tool and growth experiment: resumable, failures reported, tables and charts written."""
import csv
import json
import os

import yaml

from tkvision.growth_experiment import run_experiment
from tkvision.sweep import main as sweep_main

from .helpers import TINY_FMNIST


def _write(path, cfg):
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_sweep_runs_skips_finished_and_reports_failures(tmp_path, capsys):
    base = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=1, warmup_epochs=0.5, batch_size=64,
                lr=2e-3, train_subset=512, val_subset=256, threads=1)
    (tmp_path / '_base_.yaml').write_text(yaml.safe_dump(base))
    good = _write(tmp_path / 'l1.yaml', {'_base_': '_base_.yaml', 'model_kwargs': {'score_norm': 'l1_norm_gelu'}})
    _write(tmp_path / 'broken.yaml', {'_base_': '_base_.yaml', 'model_kwargs': {'score_norm': 'cubic'}})
    out = str(tmp_path / 'sweep')
    assert sweep_main([str(tmp_path / '*.yaml'), '--seeds', '0', '1', '--out', out]) == 0
    rows = list(csv.DictReader(open(os.path.join(out, 'results.csv'))))
    assert [r['config'] for r in rows] == ['broken', 'l1']  # _base_ is not a point
    broken, l1 = rows
    assert 'unknown score_norm' in broken['failed'] and broken['seeds'] == ''
    assert l1['seeds'] == '0 1' and 10 < float(l1['top1_mean']) <= 100 and float(l1['top1_std']) >= 0
    seed_results = [json.load(open(os.path.join(out, 'l1', f'seed{s}', 'result.json')))['top1'] for s in (0, 1)]
    assert abs(float(l1['top1_mean']) - sum(seed_results) / 2) < 1e-6
    assert open(os.path.join(out, 'results.png'), 'rb').read(4) == b'\x89PNG'
    assert open(os.path.join(out, 'results_params.png'), 'rb').read(4) == b'\x89PNG'
    capsys.readouterr()
    sweep_main([good, '--seeds', '0', '1', '--out', out])  # finished points are skipped
    assert capsys.readouterr().out.count('[skip]') == 2
    sweep_main([good, '--seeds', '5', '--out', out, '--print-commands'])
    assert '--seed 5' in capsys.readouterr().out


def test_growth_experiment_reports_compute(tmp_path):
    cfg = _write(tmp_path / 'small.yaml', dict(model='tokenformer_vit_ti16', model_kwargs=dict(TINY_FMNIST, num_tokens=8),
                                               rrc_scale=None, batch_size=64, lr=2e-3, train_subset=512,
                                               val_subset=256, threads=1, progress=False))
    runs = run_experiment(cfg, str(tmp_path / 'exp'), epochs=2, grow_epochs=1,
                          large_tokens=dict(qkv=16, proj=16, ffn=64), online_steps=1)
    assert set(runs) == {'small', 'grown', 'large', 'online'}
    # the grown run starts from the small run's compute and adds one epoch at the large size
    per_epoch_large = runs['large']['compute'] / 2
    assert abs(runs['grown']['compute'] - (runs['small']['compute'] + per_epoch_large)) < 1e-3 * per_epoch_large
    assert runs['small']['compute'] < runs['online']['compute'] < runs['large']['compute']
    assert runs['grown']['points'][0] == runs['small']['points'][-1]
    for name in ('report.md', 'results.json', 'accuracy_vs_compute.png'):
        assert os.path.isfile(tmp_path / 'exp' / name)
