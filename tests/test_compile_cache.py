"""Compile once (``compile_cache.bin``, ``tkvision.engine.runlog.RunLog.save_compile_cache``): a compiled run keeps
torch.compile's caches beside its checkpoint and a resume loads them when torch, the device and the model still
match, else says in one line why not; the resumed run ends as an uninterrupted one does."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tkvision.engine import trainer as train_mod

from .helpers import fmnist_cfg, train_crash_resume


@pytest.mark.slow
def test_a_compiled_run_keeps_its_caches_and_a_resume_loads_them_or_says_why_not(tmp_path, monkeypatch, capsys):
    cfg = fmnist_cfg(tmp_path, epochs=1, train_subset=256, val_subset=64, compile=True, checkpoint_every_steps=2)
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'inductor'))
    resumed = train_crash_resume(monkeypatch, cfg, saves=1)
    out = capsys.readouterr().out
    path = os.path.join(cfg['output'], 'compile_cache.bin')
    key = json.loads(open(path, 'rb').read().split(b'\n', 1)[0])
    assert key['torch'] == torch.__version__ and key['device'] == 'cpu' and 'tokenformer_vit_ti16' in key['model']
    assert 'compile cache loaded from' in out, out
    uninterrupted = train_mod.train(dict(cfg, output=str(tmp_path / 'whole')))
    a, b = load_file(os.path.join(cfg['output'], 'last.safetensors')), load_file(tmp_path / 'whole' / 'last.safetensors')
    assert all(torch.equal(a[k], b[k]) for k in a) and resumed['top1'] == uninterrupted['top1']
    head, _, data = open(path, 'rb').read().partition(b'\n')
    stale = dict(json.loads(head), torch='0.0.0')
    open(path, 'wb').write(json.dumps(stale).encode() + b'\n' + data)
    train_mod.train(dict(cfg, epochs=2), resume=True)
    assert "compile cache ignored: made for another setting (torch '0.0.0' -> " in capsys.readouterr().out
