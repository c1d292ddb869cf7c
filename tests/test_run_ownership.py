"""A run folder belongs to the job that claimed it: another job's restart never takes it, a lock planted as a
link or a FIFO never writes through, and an output that is a broken link is refused by name
(``tkvision.engine.rundir``, ``docs/reliability.md``)."""
import hashlib
import os
import subprocess
import sys

import pytest

from tkvision.cli.train import train_main

from .helpers import ROOT
from .test_hostile_use import COMMON, _one_line_error


def _digests(folder) -> dict:
    """sha256 of every file of ``folder`` (the run's work: what must not change)."""
    return {name: hashlib.sha256(open(os.path.join(folder, name), 'rb').read()).hexdigest()
            for name in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, name))}


def _torchrun(out: str, port: int, *extra: str) -> subprocess.CompletedProcess:
    """``torchrun --rdzv-id exp1 --max-restarts 1`` of a tiny run into ``out`` (one node, one process, c10d)."""
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node', '1',
                           '--rdzv-backend', 'c10d', '--rdzv-endpoint', f'127.0.0.1:{port}', '--rdzv-id', 'exp1',
                           '--max-restarts', '1', os.path.join(ROOT, 'tools/train.py'), *COMMON, '--output', out,
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE='1'))


@pytest.mark.slow
def test_another_torchrun_job_with_the_same_rdzv_id_never_takes_a_finished_run(tmp_path):
    """Job B, the same command with another lr and more epochs and one rendezvous id, was refused at its first start
    and its restart (torchrun restarts a failed worker) then resumed and rewrote job A's run. Now B's restart is
    refused too: B never claimed the folder, and B's agent is not A's. A's files are unchanged, byte for byte."""
    out = str(tmp_path / 'ar_7')
    first = _torchrun(out, 29433)
    assert first.returncode == 0, first.stdout + first.stderr
    before = _digests(out)
    second = _torchrun(out, 29434, '--epochs', '3', '--lr', '0.01')
    log = second.stdout + second.stderr
    assert second.returncode != 0 and 'resuming' not in log, log
    assert log.count('already holds a run') >= 2, log  # the first start and its restart
    assert _digests(out) == before


def test_a_restart_count_exported_in_a_shell_does_not_make_a_second_run_a_restart(tmp_path, monkeypatch, capsys):
    """``export TORCHELASTIC_RESTART_COUNT=1`` in a shell, then two runs into one folder: the second resumed and
    rewrote the first (the "job" was the parent shell). No launcher started it: it is refused as a new run."""
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'none')
    out = str(tmp_path / 'run')
    assert train_main([*COMMON, '--output', out]) == 0
    before = _digests(out)
    capsys.readouterr()
    code = train_main([*COMMON, '--output', out, '--epochs', '2'])
    _one_line_error(capsys, code, 'already holds a run')
    assert _digests(out) == before


@pytest.mark.parametrize('plant', ['symlink', 'fifo'])
def test_a_lock_planted_as_a_link_or_a_fifo_is_refused_and_writes_nothing(tmp_path, capsys, plant):
    """``ln -s /some/victim.txt OUT/.lock`` made the run write its lock text into the victim (exit 0); a FIFO was a
    raw ``OSError: [Errno 22]``. Both are refused in one line naming the lock, and the victim is unchanged."""
    out, victim = tmp_path / 'out', tmp_path / 'victim.txt'
    out.mkdir()
    victim.write_text('precious')
    if plant == 'symlink':
        os.symlink(victim, out / '.lock')
    else:
        os.mkfifo(out / '.lock')
    code = train_main([*COMMON, '--output', str(out)])
    _one_line_error(capsys, code, str(out / '.lock'))
    assert victim.read_text() == 'precious' and not (out / 'last.pth').exists()


@pytest.mark.parametrize('link', ['dangling', 'loop'])
def test_an_output_that_is_a_broken_link_is_refused_by_name(tmp_path, capsys, link):
    out = tmp_path / 'out'
    os.symlink(tmp_path / 'missing' if link == 'dangling' else out, out)
    code = train_main([*COMMON, '--output', str(out)])
    _one_line_error(capsys, code, f'output {out} is a symbolic link', 'no folder')
