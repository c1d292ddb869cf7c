"""The run folder's rule (``tkvision/utils/files.py``, ``docs/reliability.md``): a run writes only inside its folder and
never through a link; whole files through an atomic rename; in-place files (a logger's folder, the SQLite store, the
lock) checked at the start. And one process, one claim per folder: two ``Trainer`` objects cannot share one."""
import csv
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from tkvision.engine.config import load_config
from tkvision.engine.rundir import output_dir_in_use
from tkvision.engine.trainer import Trainer, train
from tkvision.utils.errors import RunError
from tkvision.utils.files import UnsafePathError, folder_path

from .helpers import ROOT, TINY_FMNIST


def _cfg(out, **keys):
    return load_config(None, dict(dict(model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=1, batch_size=64,
                                       train_subset=256, val_subset=64, threads=1, progress=False, output=str(out)),
                                  **keys))


def _sha(path) -> str:
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
    """A finished one-epoch run with the jsonl and MLflow loggers (a SQLite store in its folder)."""
    out = tmp_path_factory.mktemp('finished') / 'run'
    os.environ.pop('MLFLOW_TRACKING_URI', None)
    train(_cfg(out, loggers=['jsonl', 'mlflow']))
    return out


def _copy(run, to, hard=False):
    subprocess.run(['cp', '-al' if hard else '-a', str(run), str(to)], check=True)
    return to


def test_two_trainers_on_one_folder_in_one_process_are_refused_and_the_lock_stays(tmp_path):
    """``Trainer(cfg)`` then ``Trainer({**cfg, lr: 0.01})`` on the same folder: the second is refused (it claimed the
    folder, and its release dropped the first's lock, so the first overwrote the second's finished files); the first
    still holds the folder, seen from another process; once it has trained, the folder can be claimed again."""
    cfg = _cfg(tmp_path / 'run')
    first = Trainer(cfg)
    with pytest.raises(RunError, match='held by another run of this process'):
        Trainer({**cfg, 'lr': 0.01})
    probe = [sys.executable, '-c', 'import sys; from tkvision.engine.rundir import output_dir_in_use; '
             f'print(output_dir_in_use({str(tmp_path / "run")!r}))']
    held = subprocess.run(probe, capture_output=True, text=True, cwd=ROOT).stdout
    assert f'pid {os.getpid()}' in held
    first.train()
    assert output_dir_in_use(str(tmp_path / 'run')) is None
    Trainer({**cfg, 'epochs': 2}, resume=True).close()  # claimed again after the first released it


def test_curves_written_through_a_planted_link_leave_the_outside_file_alone(finished, tmp_path):
    """In a finished run's copy, ``curves.png`` replaced by a symbolic link to a file outside and, in another copy, by
    a hard link to one: ``--epochs 2 --resume`` writes its own curves and the outside files keep their bytes."""
    for kind in ('symbolic', 'hard'):
        run = _copy(finished, tmp_path / kind)
        outside = tmp_path / f'{kind}_outside.txt'
        outside.write_text('not a picture')
        os.remove(run / 'curves.png')
        (os.symlink if kind == 'symbolic' else os.link)(outside, run / 'curves.png')
        train(_cfg(run, loggers=['jsonl', 'mlflow'], epochs=2), resume=True)
        assert outside.read_text() == 'not a picture'
        assert not os.path.islink(run / 'curves.png') and os.stat(run / 'curves.png').st_nlink == 1


@pytest.mark.parametrize('name', ['tb', 'mlflow.db'])
def test_a_planted_link_where_a_logger_writes_is_refused_in_one_line(tmp_path, name, capsys):
    """``tb/`` or ``mlflow.db`` planted as a link to a folder or file outside: the run is refused before any work,
    naming the link, and nothing is written into the target (event files, a SQLite store)."""
    from tkvision.cli.train import train_main
    out, target = tmp_path / 'run', tmp_path / 'target'
    out.mkdir()
    target.mkdir() if name == 'tb' else target.write_bytes(b'')
    os.symlink(target, out / name)
    loggers = '[tensorboard]' if name == 'tb' else '[mlflow]'
    assert train_main(['--output', str(out), '--loggers', loggers, '--model_kwargs', str(TINY_FMNIST),
                       '--train_subset', '256', '--val_subset', '64', '--epochs', '1', '--progress', 'false']) == 2
    err = capsys.readouterr().err
    assert f'{out / name} is a symbolic link' in err and len(err.strip().splitlines()) == 1
    assert (os.listdir(target) if name == 'tb' else target.read_bytes()) in ([], b'')


def test_a_hard_linked_snapshot_resumed_leaves_the_original_as_it_was(finished, tmp_path):
    """``cp -al`` of a finished run (every file a hard link), resumed for one more epoch: the original's files keep
    their bytes (its SQLite store and curves were written in place, its lock truncated)."""
    original = _copy(finished, tmp_path / 'original')
    before = {name: _sha(original / name) for name in os.listdir(original) if os.path.isfile(original / name)}
    snapshot = _copy(original, tmp_path / 'snapshot', hard=True)
    train(_cfg(snapshot, loggers=['jsonl', 'mlflow'], epochs=2), resume=True)
    after = {name: _sha(original / name) for name in before}
    assert after == before


def test_folder_path_refuses_names_that_leave_the_folder_and_links_below_it(tmp_path):
    (tmp_path / 'real').mkdir()
    os.symlink(tmp_path / 'real', tmp_path / 'linked')
    assert folder_path(str(tmp_path), 'real/file') == str(tmp_path / 'real' / 'file')
    for name, use in (('../escape', 'write'), ('/etc/passwd', 'write'), ('linked/file', 'write'), ('linked', 'read'),
                      ('linked', 'in_place')):
        with pytest.raises(UnsafePathError):
            folder_path(str(tmp_path), name, use)
    assert folder_path(str(tmp_path), 'linked', 'write') == str(tmp_path / 'linked')  # replaced by the rename
    shared = tmp_path / 'shared.db'
    shared.write_text('store')
    os.link(shared, tmp_path / 'other_name.db')
    folder_path(str(tmp_path), 'shared.db', 'in_place')
    assert os.stat(shared).st_nlink == 1 and (tmp_path / 'other_name.db').read_text() == 'store'
    shutil.rmtree(tmp_path / 'real')


def test_a_stopped_and_continued_run_says_each_resume_in_its_files(tmp_path, monkeypatch):
    """``resumes.csv`` holds one row per resume with the checkpoint's update and epochs: a run crashed after its
    first checkpoint (the end of epoch 1 of 2, 4 updates of 64 images) and continued twice lists both resumes; a run
    never resumed has no such file."""
    from tkvision.engine.runlog import RESUMES_FILE

    from .helpers import train_crash_resume
    cfg = _cfg(tmp_path / 'run', epochs=2)
    train_crash_resume(monkeypatch, cfg, saves=1)
    train(dict(cfg, epochs=3), resume=True)
    with open(tmp_path / 'run' / RESUMES_FILE) as f:
        rows = list(csv.DictReader(f))
    assert [(r['update'], r['epochs_done']) for r in rows] == [('4', '1'), ('8', '2')]
    assert all(r['time'].endswith('Z') and r['host'] for r in rows)
    train(_cfg(tmp_path / 'new'))
    assert not (tmp_path / 'new' / RESUMES_FILE).exists()
