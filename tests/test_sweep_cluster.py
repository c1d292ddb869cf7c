"""Sweeps through submitit without SLURM: grids from the command line, points as submitit jobs on this machine
(pre-empted and requeued, failing, resubmitted after the submitting process died), and the SLURM job array
checked from the sbatch file submitit writes, with stand-ins for SLURM's commands."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tkvision.cli.experiments import sweep_main
from tkvision.experiments.points import PointJob, SweepPoint, parse_grid, sweep_points
from tkvision.utils.errors import ConfigError

from .helpers import TINY_FMNIST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Four epochs of 4096 images: long enough (a few seconds) that a signal sent after the first epoch lands mid-run.
POINT = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=4, warmup_epochs=0.5,
             batch_size=64, lr=2e-3, train_subset=4096, val_subset=256, threads=1)


def _config(tmp_path, name='point.yaml', **overrides):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(dict(POINT, **overrides)))
    return str(path)


def _sweep_process(args):
    """``tkvision-sweep ARGS`` as its own process, as a user starts it."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, 'tools', 'sweep.py'), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(predicate, seconds=120.0, what='the condition'):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f'waited {seconds:.0f} s for {what}')


def _jobs(out):
    path = os.path.join(out, 'jobs.json')
    return json.load(open(path)) if os.path.exists(path) else {}


def _epochs_done(run_dir):
    path = os.path.join(run_dir, 'metrics.csv')
    return len(list(csv.DictReader(open(path)))) if os.path.exists(path) else 0


def _task_pid(controller_pid):
    """The training process of a local job: the child of submitit's controller."""
    children = subprocess.run(['pgrep', '-P', str(controller_pid)], capture_output=True, text=True).stdout.split()
    return int(children[0]) if children else None


def test_a_grid_is_the_cartesian_product_named_by_its_values():
    """``--grid a=1,2 b=x,y``: four points per config and seed, first key slowest; names and folders carry the
    values; a key the flat config lacks is a model keyword; bad items are refused by name."""
    assert parse_grid([]) == [()]
    assert parse_grid(['lr=1e-3,2e-3', 'score_norm=softmax,l1_norm_gelu']) == [
        (('lr', '1e-3'), ('score_norm', 'softmax')), (('lr', '1e-3'), ('score_norm', 'l1_norm_gelu')),
        (('lr', '2e-3'), ('score_norm', 'softmax')), (('lr', '2e-3'), ('score_norm', 'l1_norm_gelu'))]
    points = sweep_points(['cfg/norm.yaml'], [0, 1], ['norm_fold=true,false'])
    assert [p.key for p in points] == ['norm-norm_fold=true/seed0', 'norm-norm_fold=true/seed1',
                                       'norm-norm_fold=false/seed0', 'norm-norm_fold=false/seed1']
    assert points[2].directory('out') == os.path.join('out', 'norm-norm_fold=false', 'seed0')
    assert SweepPoint('c.yaml', 0, (('lr', '0.1'), ('score_norm', 'softmax'), ('model_kwargs.depth', '3'))
                      ).overrides() == ['--lr', '0.1', '--model_kwargs.score_norm', 'softmax',
                                        '--model_kwargs.depth', '3']
    assert SweepPoint.from_dict(json.loads(json.dumps(points[3].to_dict()))) == points[3]
    for bad, words in (('lr', 'key=value1,value2'), ('lr=', 'key=value1,value2'), ('=1,2', 'key=value1')):
        with pytest.raises(ConfigError, match=words):
            parse_grid([bad])
    with pytest.raises(ConfigError, match="'lr' is given twice"):
        parse_grid(['lr=1', 'lr=2'])


@pytest.mark.slow
def test_local_points_requeued_after_preemption_end_bit_identical_and_a_failure_is_recorded(tmp_path):
    """Three grid points and a bad one (lr -1) on submitit's local executor. The first is sent SIGUSR2 mid-run, as
    submitit's controller and SLURM signal a job they pre-empt or time out: it saves its state, submitit
    requeues it, and it continues from its last.pth to the same weights, bit for bit, as the point trained
    without interruption. The broken point is recorded with its error; the others finish; --status and
    --collect read the folder."""
    config = _config(tmp_path)
    out = str(tmp_path / 'sweep')
    proc = _sweep_process([config, '--grid', 'lr=0.002,0.001,0.003,-1', '--seeds', '0', '--out', out,
                           '--executor', 'local'])
    first = os.path.join(out, 'point-lr=0.002', 'seed0')
    _wait_for(lambda: _epochs_done(first) >= 1, what='the first point to finish an epoch')
    task = _task_pid(int(_jobs(out)['point-lr=0.002/seed0'][-1]['job_id']))
    os.kill(task, signal.SIGUSR2)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    log = open(os.path.join(out, 'submitit', _jobs(out)['point-lr=0.002/seed0'][-1]['job_id'],
                            f"{_jobs(out)['point-lr=0.002/seed0'][-1]['job_id']}_0_log.out")).read()
    assert 'Requeued job' in log and 'resumed from' in log and 'at epoch 1' not in log.split('resumed from')[0]
    rows = {r['config']: r for r in csv.DictReader(open(os.path.join(out, 'results.csv')))}
    assert list(rows) == ['point-lr=0.002', 'point-lr=0.001', 'point-lr=0.003', 'point-lr=-1']
    assert all(rows[f'point-lr={lr}']['seed_ids'] == '0' for lr in ('0.001', '0.002', '0.003'))
    assert 'lr must be a number > 0' in rows['point-lr=-1']['failed'] and rows['point-lr=-1']['seeds'] == '0'
    assert len(_jobs(out)['point-lr=0.002/seed0']) == 1  # requeued by submitit, not submitted again
    # the uninterrupted reference: the same point, trained in this process
    reference = str(tmp_path / 'reference')
    record = PointJob(SweepPoint(config, 0, (('lr', '0.002'),)), reference)()
    assert record['top1'] == json.load(open(os.path.join(first, 'result.json')))['top1']
    resumed = load_file(os.path.join(first, 'last.safetensors'))
    straight = load_file(os.path.join(reference, 'point-lr=0.002', 'seed0', 'last.safetensors'))
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)
    status = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'sweep.py'), '--status', out], cwd=ROOT,
                            capture_output=True, text=True).stdout
    assert re.search(r'point-lr=0.002 +0 +finished +val top-1', status), status
    assert re.search(r'point-lr=-1 +0 +failed +ConfigError: lr must be a number > 0', status), status
    assert status.strip().endswith('3 finished, 1 failed')
    assert oct(os.stat(os.path.join(out, 'submitit')).st_mode & 0o777) == '0o700'  # its pickles: the owner's only
    assert '%j' not in os.listdir(os.path.join(out, 'submitit'))  # submitit's unformatted folder, empty: removed


@pytest.mark.slow
def test_rerunning_after_the_submitting_process_was_killed_launches_nothing_twice(tmp_path, capsys):
    """The submitting process dies (SIGKILL) while its first point's job runs: the job goes on, and the same
    command run again waits for it instead of submitting it again, then runs the point not yet started."""
    config = _config(tmp_path)
    out = str(tmp_path / 'sweep')
    args = [config, '--grid', 'lr=0.002,0.001', '--seeds', '0', '--out', out, '--executor', 'local']
    proc = _sweep_process(args)
    first = os.path.join(out, 'point-lr=0.002', 'seed0')
    _wait_for(lambda: _epochs_done(first) >= 1, what='the first point to finish an epoch')
    proc.kill()
    proc.wait()
    job = _jobs(out)['point-lr=0.002/seed0'][-1]['job_id']
    assert sweep_main(['--status', out]) == 0
    status = capsys.readouterr().out
    assert re.search(rf'point-lr=0.002 +0 +running +\d epochs done, val top-1 [\d.]+ \(job {job}\)', status), status
    assert re.search(r'point-lr=0.001 +0 +not started +not submitted', status), status
    assert sweep_main(args) == 0
    printed = capsys.readouterr().out
    assert f'[wait] point-lr=0.002/seed0: job {job}' in printed
    jobs = _jobs(out)
    assert [e['job_id'] for e in jobs['point-lr=0.002/seed0']] == [job] and len(jobs['point-lr=0.001/seed0']) == 1
    assert all(os.path.exists(os.path.join(out, name, 'seed0', 'result.json')) for name in ('point-lr=0.002',
                                                                                             'point-lr=0.001'))


def test_launcher_settings_are_checked_before_anything_runs(tmp_path, capsys):
    """A launcher key the file should not have, nodes without SLURM, several processes inline: one line each,
    exit 2, nothing written."""
    config = _config(tmp_path)
    bad = tmp_path / 'bad.yaml'
    bad.write_text(yaml.safe_dump(dict(launcher=dict(gpus=8))))
    out = str(tmp_path / 'sweep')
    for args, words in (([config, '--launcher', str(bad)], 'unknown key launcher.gpus'),
                        ([config, '--executor', 'local', '--nodes', '2'], 'need --executor slurm'),
                        ([config, '--tasks-per-node', '2'], 'need --executor local or slurm'),
                        (['--collect', str(tmp_path / 'nothing')], 'holds no sweep')):
        assert sweep_main([*args, '--out', out]) == 2
        assert words in capsys.readouterr().err
    assert not os.path.exists(out)


@pytest.mark.slow
def test_a_point_of_two_processes_is_one_distributed_training_job(tmp_path):
    """``--tasks-per-node 2`` on the local executor: submitit starts two processes of the point, which join one
    process group (gloo on a CPU) from submitit's environment and train one run: one result, a global batch of
    two processes' batches."""
    config = _config(tmp_path, epochs=1, train_subset=1024)
    out = str(tmp_path / 'sweep')
    proc = _sweep_process([config, '--seeds', '0', '--out', out, '--executor', 'local', '--tasks-per-node', '2'])
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    job = _jobs(out)['point/seed0'][-1]['job_id']
    log = open(os.path.join(out, 'submitit', job, f'{job}_0_log.out')).read()
    assert '2 process(es) on cpu (gloo), global batch 128' in log, log
    assert json.load(open(os.path.join(out, 'point', 'seed0', 'result.json')))['status'] == 'ok'
