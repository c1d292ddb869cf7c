"""A sweep folder as safe as a run folder: a point's folder stays under the sweep's and is reached without links,
the sweep's own files are written atomically and read in one line when they are not what they should be, a rerun
with other settings is refused, and every scheduler command is bounded (each a test that failed before)."""
import json
import os
import pickle
import subprocess

import pytest
import yaml

from tkvision.cli.experiments import sweep_main
from tkvision.experiments import scheduler
from tkvision.experiments.launcher import Launcher
from tkvision.experiments.points import parse_grid, sweep_points
from tkvision.utils.errors import ConfigError, RunError

from .helpers import TINY_FMNIST

POINT = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=1, warmup_epochs=0.5,
             batch_size=64, lr=2e-3, train_subset=128, val_subset=64, threads=1)


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / 'sw.yaml'
    path.write_text(yaml.safe_dump(POINT))
    return str(path)


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err
    for word in words:
        assert word in err, (word, err)


def test_a_grid_value_with_dot_dot_never_touches_a_folder_outside_the_sweep(tmp_path, config, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs('victim/seed0')
    open('victim/seed0/precious.txt', 'w').write('x')
    assert sweep_main([config, '--grid', 'lr=/x,/../../victim', '--out', 'S']) == 2
    _one_line(capsys, 'would not be a folder of the sweep', 'nothing was created or removed')
    assert os.listdir('victim/seed0') == ['precious.txt'] and not os.path.exists('S')


def test_a_link_at_a_points_name_is_refused_and_nothing_behind_it_is_removed(tmp_path, config, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs('VD/seed0')
    open('VD/seed0/keep.txt', 'w').write('x')
    os.makedirs('S')
    os.symlink(os.path.abspath('VD'), 'S/sw-lr=0.002')
    assert sweep_main([config, '--grid', 'lr=0.002', '--out', 'S']) == 2
    _one_line(capsys, 'S/sw-lr=0.002 is a symbolic link', 'nothing was created or removed')
    assert os.listdir('VD/seed0') == ['keep.txt']


def test_collect_replaces_planted_links_and_never_writes_through_them(tmp_path, config, capsys):
    """A finished sweep whose result files were replaced by links to a victim: ``--collect`` replaces the links
    with its files (atomic replace) and the victim keeps its content; a ``submitit/`` link is refused, named."""
    out = str(tmp_path / 'S')
    assert sweep_main([config, '--out', out]) == 0
    victim = tmp_path / 'victim.txt'
    victim.write_text('mine')
    for name in ('results.md', 'results.csv', 'results_points.csv', 'results.png'):
        os.remove(os.path.join(out, name))
        os.symlink(victim, os.path.join(out, name))
    assert sweep_main(['--collect', out]) == 0
    assert victim.read_text() == 'mine'
    assert not any(os.path.islink(os.path.join(out, n)) for n in ('results.md', 'results.csv', 'results.png'))
    capsys.readouterr()
    target = tmp_path / 'elsewhere'
    target.mkdir(mode=0o755)
    os.symlink(target, os.path.join(out, 'submitit'))
    assert sweep_main([config, '--grid', 'lr=0.001', '--out', out, '--executor', 'local']) == 2
    _one_line(capsys, 'submitit is a symbolic link')
    assert oct(target.stat().st_mode & 0o777) == '0o755' and os.listdir(target) == []


def test_a_rerun_with_other_settings_is_refused_and_the_record_kept(tmp_path, config, capsys):
    out = str(tmp_path / 'S')
    assert sweep_main([config, '--out', out]) == 0
    record = open(os.path.join(out, 'sweep.json')).read()
    capsys.readouterr()
    assert sweep_main([config, '--out', out, '--epochs', '2']) == 2
    _one_line(capsys, 'holds points trained with other settings', 'epochs: 1 then, 2 now (point sw/seed0)')
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'sw.yaml').write_text(yaml.safe_dump(dict(POINT, lr=1e-3)))  # another file of the same name
    assert sweep_main([str(other / 'sw.yaml'), '--out', out]) == 2
    _one_line(capsys, 'lr: 0.002 then, 0.001 now')
    assert open(os.path.join(out, 'sweep.json')).read() == record


def test_scheduler_commands_are_bounded_and_answer_in_one_line(monkeypatch):
    """A stuck command (``sleep`` standing for an ``sbatch`` that never answers) is given up after the bound and
    killed; a missing ``sacct`` and a failing one are one line naming the command (the real scheduler's faults are
    in tests/test_slurm.py)."""
    with pytest.raises(RunError, match=r'sleep 30 did not answer within 1 s'):
        scheduler.scheduler_call(lambda: subprocess.run(['sleep', '30']), 'sleep 30', seconds=1)
    monkeypatch.setenv('PATH', '/nonexistent')
    with pytest.raises(RunError, match=r'sacct is not on PATH'):
        scheduler.slurm_state('123_4')
    with pytest.raises(RunError, match=r'false failed'):
        scheduler.scheduler_call(lambda: subprocess.run(['/bin/false'], check=True, capture_output=True, text=True),
                          'false')


def _finished_sweep(tmp_path, config) -> str:
    out = str(tmp_path / 'S')
    assert sweep_main([config, '--out', out]) == 0
    return out


@pytest.mark.parametrize('name', ['sweep.json', 'jobs.json', 'sw/seed0/result.json', 'sw/seed0/failed.json'])
@pytest.mark.parametrize('content', ['cut', 'binary', 'pickle', 'link', 'shape'])
def test_the_sweeps_own_files_when_not_what_they_should_be_are_one_line(tmp_path, config, capsys, name, content):
    """``sweep.json``, ``jobs.json`` or a point's ``result.json`` cut, binary, a pickle, a link or of the wrong shape:
    the rerun and ``--status`` answer in one line naming the file (exit 2), nothing changed; a ``failed.json`` is the
    record of a point that is retried anyway: the rerun trains the point again and replaces it."""
    out = _finished_sweep(tmp_path, config)
    path = os.path.join(out, name)
    if name.endswith('failed.json'):
        os.remove(os.path.join(out, 'sw/seed0/result.json'))
    if os.path.lexists(path):
        os.remove(path)
    if content == 'pickle':
        open(path, 'wb').write(pickle.dumps({'points': []}))
    elif content == 'link':
        (tmp_path / 'text.txt').write_text('hello')
        os.symlink(tmp_path / 'text.txt', path)
    elif content == 'binary':
        open(path, 'wb').write(b'\x00\xff\xfe')
    else:
        open(path, 'w').write(dict(cut='{"points": [{"con', shape='[1, 2, 3]')[content])
    capsys.readouterr()
    if name.endswith('failed.json'):
        assert sweep_main([config, '--out', out]) == 0
        assert json.load(open(os.path.join(out, 'sw/seed0/result.json')))['status'] == 'ok'
        return
    for args in ([config, '--out', out], ['--status', out]):
        assert sweep_main(args) == 2
        _one_line(capsys, os.path.basename(name))


@pytest.mark.parametrize('content', ['{"points": [{"con', 'launcher: !!python/object/apply:os.system ["echo hi"]',
                                     'launcher: [1, 2]', 'launcher: {slurm_options: [a, b]}'])
def test_a_launcher_file_that_is_not_one_is_one_line(tmp_path, config, capsys, content):
    bad = tmp_path / 'launch.yaml'
    bad.write_text(content)
    assert sweep_main([config, '--launcher', str(bad), '--out', str(tmp_path / 'S')]) == 2
    _one_line(capsys, str(bad))


def test_grid_items_extend_parse_yaml_lists_and_refuse_the_sweeps_own_keys(tmp_path, config, capsys):
    points = sweep_points([config], [0], ['elastic_fractions=[0.5,1.0],[1.0]', 'lr=0.001,0.002'])
    assert [p.grid for p in points] == [
        (('elastic_fractions', '[0.5,1.0]'), ('lr', '0.001')), (('elastic_fractions', '[0.5,1.0]'), ('lr', '0.002')),
        (('elastic_fractions', '[1.0]'), ('lr', '0.001')), (('elastic_fractions', '[1.0]'), ('lr', '0.002'))]
    from tkvision.cli.experiments import sweep_parser
    args, _ = sweep_parser().parse_known_args([config, '--grid', 'lr=1,2', '--grid', 'smoothing=0.1,0.0'])
    assert args.grid == ['lr=1,2', 'smoothing=0.1,0.0']  # a second --grid adds its key, it does not replace
    for key, use in (('output', '--out'), ('seed', '--seeds')):
        with pytest.raises(ConfigError, match=f'the sweep sets {key} itself; use {use}'):
            parse_grid([f'{key}=a,b'])
    with pytest.raises(ConfigError, match="is not YAML"):
        parse_grid(['lr=[1,'])


@pytest.mark.parametrize('fields, words', [
    (dict(slurm_options=(('account', 'vision\n#SBATCH --array=0-99'),)), 'holds a control character'),
    (dict(partition='gpu\nhostname'), 'holds a control character'),
    (dict(slurm_options=(('requeue', 'false'),)), 'requeue: the sweep sets it itself'),
    (dict(slurm_options=(('signal', 'USR1@1'),)), 'signal: the sweep sets it itself'),
])
def test_launcher_options_that_would_rewrite_the_sbatch_file_are_refused(fields, words):
    with pytest.raises(ConfigError, match=words):
        Launcher(executor='slurm', **fields)


def test_unknown_and_stopped_slurm_states_count_as_alive():
    """A point is submitted again only when its job has ended for good: STOPPED, SUSPENDED or a state this release
    does not know may come back."""
    for state in ('STOPPED', 'SUSPENDED', 'PENDING', 'REQUEUED', 'UNKNOWN', 'SOME_NEW_STATE'):
        assert scheduler.alive(state), state
    for state in ('COMPLETED', 'CANCELLED', 'FAILED', 'TIMEOUT', 'NODE_FAIL', 'GONE'):
        assert not scheduler.alive(state), state


@pytest.mark.parametrize('name, edit, words', [
    ('sweep.json', ('"seed": 0', '"seed": "zero"'), ['sweep.json', "seed 'zero'"]),
    ('sw/seed0/result.json', None, ['result.json', 'no "config"']),
    ('sw/seed0/result.json', ('"top1": ', '"top1": "high", "was": '), ['result.json', "\"top1\" is 'high'"]),
])
def test_collect_of_records_with_wrong_fields_is_one_line_naming_file_and_field(tmp_path, config, capsys, name, edit,
                                                                                   words):
    """A record that is JSON of the right shape but a wrong field (a seed ``"zero"``, a result of ``{}``, a top-1 of
    ``"high"``): ``--collect`` answers in one line naming the file and the field (exit 2), and writes no table."""
    out = _finished_sweep(tmp_path, config)
    path = os.path.join(out, name)
    text = open(path).read()
    os.remove(os.path.join(out, 'results.csv'))
    open(path, 'w').write('{}' if edit is None else text.replace(*edit, 1))
    capsys.readouterr()
    assert sweep_main(['--collect', out]) == 2
    _one_line(capsys, *words)
    assert not os.path.exists(os.path.join(out, 'results.csv'))


@pytest.mark.parametrize('args, words', [
    (['--grid', 'lr=0.' + '1' * 300], ['308 bytes, over the 255']),
    (['--grid', 'lr=' + ','.join(map(str, range(100))), 'smoothing=' + ','.join(map(str, range(100))),
      'weight_decay=' + ','.join(map(str, range(100)))], ['1000000 points', 'over the 10000']),
    (['--grid', 'lr="0.1\n0.2"'], ['control character']),
])
def test_a_sweep_whose_points_cannot_be_folders_is_refused_before_anything_is_made(tmp_path, config, capsys, args,
                                                                                     words):
    """A grid value that makes a folder name over 255 bytes, a grid of a million points (refused at once, not after
    listing them), and a newline in a folder name (it would end a line of the sbatch script): one line, exit 2,
    no folder made."""
    out = str(tmp_path / 'S')
    assert sweep_main([config, *args, '--out', out]) == 2
    _one_line(capsys, *words)
    assert not os.path.exists(out)


def test_a_newline_in_out_never_reaches_a_job_script(tmp_path, config, capsys):
    out = str(tmp_path / 'S\ntouch pwned')
    assert sweep_main([config, '--out', out, '--executor', 'slurm']) == 2
    _one_line(capsys, 'control character')
    assert os.listdir(tmp_path) == ['sw.yaml']
