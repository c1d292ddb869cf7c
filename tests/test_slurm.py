"""The cluster path against a real SLURM: Debian's Slurm 22.05 on this host, two nodes (two slurmd), accounting
through slurmdbd and MariaDB, started by ``tools/slurm/local_cluster.sh up`` (``make test-slurm`` runs it, these
tests, then ``down``). The sweeps' job arrays and ``tools/slurm_train.sbatch`` are submitted with the real ``sbatch``,
watched through the real ``sacct``, pre-empted with SLURM's own signals (``scancel --signal``), timed out by their
limit, and met by the scheduler's own faults (slurmctld restarted, a slurmd killed under a job, a task cancelled);
every requeued run ends bit-identical to its uninterrupted twin. Processes, not GPUs: the trainer runs on the CPU
(gloo), each node's 8 GPUs being null devices that let a script's ``--gpus-per-node`` through."""
import csv
import glob
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
from tkvision.experiments.points import PointJob, SweepPoint

from .helpers import ROOT, TINY_FMNIST

pytestmark = pytest.mark.slurm

CLUSTER = os.environ.get('TKVISION_SLURM_DIR', '/tmp/tkvision-slurm')
SCRIPT = os.path.join(ROOT, 'tools', 'slurm', 'local_cluster.sh')
#: A short point: two epochs of 1024 images (a few seconds).
SHORT = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=2, warmup_epochs=0.5,
             batch_size=64, lr=2e-3, train_subset=1024, val_subset=256, threads=1)
#: A long point: six epochs of 32768 images (about a minute alone, two beside the other jobs), long enough to be
#: signalled, timed out and failed under while it trains.
LONG = dict(SHORT, epochs=6, train_subset=32768, checkpoint_every_steps=16)


def _sh(*command, timeout=60, check=True) -> str:
    p = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode:
        raise AssertionError(f'{" ".join(command)}: {p.stdout}{p.stderr}')
    return p.stdout


def _wait(predicate, seconds: float, what: str, every: float = 0.5, last=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f'waited {seconds:.0f} s for {what}' + (f'; last: {last[-1]}' if last else ''))


def _nodes() -> list:
    return _sh('sinfo', '-h', '-N', '-o', '%N').split()


@pytest.fixture(scope='module', autouse=True)
def cluster():
    """The cluster of ``tools/slurm/local_cluster.sh``, its configuration in ``SLURM_CONF`` for every command and
    job of these tests (jobs inherit it). It must be up: ``make test-slurm`` starts it."""
    conf = os.path.join(CLUSTER, 'slurm.conf')
    if not os.path.exists(conf):
        pytest.fail(f'no local cluster in {CLUSTER}: run make test-slurm (tools/slurm/local_cluster.sh up)')
    before = os.environ.get('SLURM_CONF')
    os.environ['SLURM_CONF'] = conf
    states = set(_sh('sinfo', '-h', '-o', '%t').split())
    assert states <= {'idle', 'mix', 'alloc'} and len(_nodes()) == 2, states
    yield
    if before is None:
        os.environ.pop('SLURM_CONF')
    else:
        os.environ['SLURM_CONF'] = before


def _config(tmp_path, name: str, **keys) -> str:
    path = tmp_path / f'{name}.yaml'
    path.write_text(yaml.safe_dump(keys))
    return str(path)


def _jobs(out: str) -> dict:
    return json.load(open(os.path.join(out, 'jobs.json')))


def _epochs(run_dir: str) -> int:
    path = os.path.join(run_dir, 'metrics.csv')
    return len(list(csv.DictReader(open(path)))) if os.path.exists(path) else 0


def _restarts(job: str) -> int:
    found = re.search(r'Restarts=(\d+)', _sh('scontrol', 'show', 'job', job))
    return int(found.group(1)) if found else -1


def _same_weights(a: str, b: str):
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), (a, b)


def _log(out: str, job: str) -> str:
    return ''.join(open(p).read() for p in sorted(glob.glob(os.path.join(out, 'submitit', job, '*_log.out'))))


@pytest.fixture(scope='module')
def long_points(tmp_path_factory):
    """The long point as a sweep with a 2-minute limit and submitit's signal 70 s before it (it cannot finish in one
    job), submitted first so that it trains while the other long-point tests run; and the same point trained here,
    uninterrupted: the twin each must equal. ``submit(name, *options)`` submits the point as a sweep of its own."""
    root = tmp_path_factory.mktemp('long')
    config = _config(root, 'long', **LONG)

    def submit(name: str, *options: str) -> str:
        out = str(root / name)
        assert sweep_main([config, '--out', out, '--executor', 'slurm', '--cpus-per-task', '1', *options]) == 0
        return out
    host = sorted(_nodes(), key=lambda n: n == 'localhost')[0]  # not the node a test fails
    timeout = submit('timeout', '--timeout-min', '2', '--signal-delay-s', '70', '--max-timeouts', '10',
                     '--slurm-option', f'nodelist={host}')
    twin = str(root / 'twin')
    PointJob(SweepPoint(config, 0), twin)()
    return dict(timeout=timeout, submit=submit, twin=os.path.join(twin, 'long', 'seed0', 'last.safetensors'))


def _job_of(out: str) -> str:
    [(_, entries)] = _jobs(out).items()
    return entries[-1]['job_id']


def test_a_sweep_is_one_job_array_watched_through_sacct_and_collected_as_inline(tmp_path, capsys):
    """4 grid points x 2 seeds: one job array, two tasks at a time, with the requeue and the signal in its sbatch
    file; the same command again submits nothing; ``--status`` shows queued and running points from the scheduler's
    answers; slurmctld killed and started again while the array runs loses no point and runs none twice, and
    ``--status`` is right at once (a controller that stops, as a restart of its host or service does; one killed
    outright loses the state it had not saved, SLURM's own limit); ``--collect`` gives the inline sweep's table, digit for digit."""
    config = _config(tmp_path, 'short', **SHORT)
    launcher = tmp_path / 'cluster.yaml'  # a --launcher file's resources, under the command line's
    launcher.write_text(yaml.safe_dump(dict(launcher=dict(partition='debug', timeout_min=4320, cpus_per_task=2,
                                                          slurm_options=dict(comment='tkvision-test')))))
    grid = ['--grid', 'lr=0.002,0.001', 'smoothing=0.1,0.0', '--seeds', '0', '1']
    out = str(tmp_path / 'array')
    args = [config, *grid, '--out', out, '--executor', 'slurm', '--launcher', str(launcher), '--array-parallelism',
            '2', '--cpus-per-task', '1', '--timeout-min', '30']
    assert sweep_main(args) == 0
    printed = capsys.readouterr().out
    jobs = {key: entries[-1]['job_id'] for key, entries in _jobs(out).items()}
    array = {job.split('_')[0] for job in jobs.values()}
    assert len(jobs) == 8 and len(array) == 1 and printed.count('[sbmt]') == 8, printed
    [script] = glob.glob(os.path.join(out, 'submitit', '*', '*_submission.sh'))
    lines = open(script).read().splitlines()
    for line in ('#SBATCH --array=0-7%2', '#SBATCH --requeue', '#SBATCH --signal=USR2@90', '#SBATCH --open-mode=append',
                 '#SBATCH --partition=debug', '#SBATCH --time=30', '#SBATCH --cpus-per-task=1',
                 '#SBATCH --comment=tkvision-test'):
        assert line in lines, (line, lines)
    assert sweep_main(args) == 0  # while the array runs: nothing submitted again
    again = capsys.readouterr().out
    assert '[sbmt]' not in again and again.count('[wait]') + again.count('[skip]') == 8 and _jobs(out).keys() == \
        jobs.keys() and all(len(e) == 1 for e in _jobs(out).values()), again
    seen = set()

    def status() -> str:
        assert sweep_main(['--status', out]) == 0
        text = capsys.readouterr().out
        seen.update(re.findall(r'^\S+ +\d +(queued|running|finished)', text, re.M))
        return text
    _wait(lambda: status() and {'queued', 'running'} <= seen, 120, 'queued and running points')
    ctld = int(open(os.path.join(CLUSTER, 'run', 'slurmctld.pid')).read())
    os.kill(ctld, signal.SIGTERM)  # the controller goes down (it saves its state) while the array runs
    _wait(lambda: not os.path.exists(f'/proc/{ctld}'), 60, 'slurmctld to stop')
    _sh(SCRIPT, 'up', timeout=180)
    assert re.search(r'\d+ (queued|running|finished)', status())  # right after the restart
    _wait(lambda: all(os.path.exists(os.path.join(out, k.rsplit('/', 1)[0], k.rsplit('/', 1)[1], 'result.json'))
                      for k in jobs), 600, 'every point of the array to finish', every=2)
    array_id = array.pop()

    def ended() -> list:  # a task writes result.json just before its job ends
        states = _sh('sacct', '-j', array_id, '-X', '-n', '-P', '-o', 'JobID,State').split()
        return states if not [s for s in states if s.split('|')[1] in ('PENDING', 'RUNNING', 'COMPLETING')] else []
    states = _wait(ended, 60, 'the array\'s tasks to end')
    assert len(states) == 8 and all(s.endswith('|COMPLETED') for s in states), ' '.join(states)
    for key, job in jobs.items():
        assert _log(out, job).count('updates/epoch') == 1, key  # trained once, never twice
        assert _epochs(os.path.join(out, *key.rsplit('/', 1))) == 2
    assert sweep_main(['--collect', out]) == 0
    inline = str(tmp_path / 'inline')
    assert sweep_main([config, *grid, '--out', inline]) == 0
    capsys.readouterr()
    timing = {'img_per_s', 'minutes'}
    for a, b in zip(csv.DictReader(open(os.path.join(out, 'results.csv'))),
                    csv.DictReader(open(os.path.join(inline, 'results.csv'))), strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}


def test_a_point_preempted_by_slurms_signal_is_requeued_and_ends_as_its_twin(long_points):
    """``scancel --signal=USR2`` on the point's job, as ``--signal=USR2@90`` sends before a time limit or a
    pre-emption: submitit checkpoints and requeues it, the scheduler restarts it (its restart count), it continues
    from its ``last.pth`` and ends with its uninterrupted twin's weights, tensor for tensor."""
    host = sorted(_nodes(), key=lambda n: n == 'localhost')[0]
    out = long_points['submit']('usr2', '--slurm-option', f'nodelist={host}')
    run_dir, job = os.path.join(out, 'long', 'seed0'), _job_of(out)
    _wait(lambda: _epochs(run_dir) >= 1, 300, 'the point to finish an epoch')
    _sh('scancel', '--signal=USR2', job)
    _wait(lambda: os.path.exists(os.path.join(run_dir, 'result.json')), 600, 'the point to finish', every=2)
    assert _restarts(job) >= 1 and 'resumed from' in _log(out, job)
    _same_weights(os.path.join(run_dir, 'last.safetensors'), long_points['twin'])
    assert len(_jobs(out)['long/seed0']) == 1  # requeued by the scheduler, not submitted again


def test_a_node_that_fails_under_a_point_requeues_it_and_it_resumes_exactly(long_points):
    """The second node's slurmd killed with the point's processes (a node that went down): once the node is back,
    the scheduler requeues the job, and the point continues from its ``last.pth`` to its twin's weights."""
    node = sorted(_nodes(), key=lambda n: n == 'localhost')[1]
    out = long_points['submit']('node', '--slurm-option', f'nodelist={node}')
    run_dir, job = os.path.join(out, 'long', 'seed0'), _job_of(out)
    _wait(lambda: _epochs(run_dir) >= 1, 300, 'the point to finish an epoch')
    pidfile = os.path.join(CLUSTER, 'run', f'slurmd-{node}.pid')
    pid = int(open(pidfile).read())
    raw = re.search(r'JobId=(\d+)', _sh('scontrol', 'show', 'job', job)).group(1)  # an array task's own id
    steps = _sh('pgrep', '-f', f'slurmstepd: \\[{raw}\\.', check=False).split()
    for p in [pid, *map(int, steps)]:
        os.kill(p, signal.SIGKILL)
    subprocess.run(['pkill', '-KILL', '-f', out], capture_output=True)  # the point's own: submitit's worker names out
    _wait(lambda: node in _sh('sinfo', '-h', '-N', '-t', 'down', '-o', '%N'), 120, 'the node to be down')
    _sh(SCRIPT, 'up', timeout=180)
    _wait(lambda: os.path.exists(os.path.join(run_dir, 'result.json')), 900, 'the point to finish', every=2)
    assert _restarts(job) >= 1 and 'resumed from' in _log(out, job)
    _same_weights(os.path.join(run_dir, 'last.safetensors'), long_points['twin'])


def test_a_point_whose_time_limit_is_shorter_than_its_training_ends_as_its_twin(long_points):
    """A 2-minute limit with submitit's signal 70 s before it: the point checkpoints at the signal, is requeued,
    and finishes after one or more requeues with its twin's weights."""
    out = long_points['timeout']
    run_dir, job = os.path.join(out, 'long', 'seed0'), _job_of(out)
    _wait(lambda: os.path.exists(os.path.join(run_dir, 'result.json')), 900, 'the point to finish', every=2)
    assert _restarts(job) >= 1 and 'resumed from' in _log(out, job), _log(out, job)
    _same_weights(os.path.join(run_dir, 'last.safetensors'), long_points['twin'])


def test_a_task_cancelled_while_queued_shows_as_ended_and_only_it_is_submitted_again(tmp_path, capsys):
    """The second task of a two-point array cancelled at once, while it waits behind the first: Slurm 22.05 then
    keeps no record of it (``sacct``, ``squeue`` and ``scontrol`` all forget it), so ``--status`` asks the controller
    and says at once that it ended before it started, not "queued" until the accounting's lag runs out; the same
    command submits it alone again. A task cancelled once the accounting lists it shows as cancelled."""
    # LONG's training (about a minute): a point cancelled once the accounting lists it as started must still be
    # training when the scheduler's signals arrive, or a SHORT point could end first under load, rightly reported
    # finished
    config = _config(tmp_path, 'short', **dict(SHORT, epochs=6, train_subset=32768))
    out = str(tmp_path / 'cancel')
    args = [config, '--grid', 'lr=0.002,0.001', '--out', out, '--executor', 'slurm', '--array-parallelism', '1',
            '--cpus-per-task', '1']
    assert sweep_main(args) == 0
    capsys.readouterr()
    second = _jobs(out)['short-lr=0.001/seed0'][-1]['job_id']
    _sh('scancel', second)  # pending behind the first (one task at a time)
    first = os.path.join(out, 'short-lr=0.002', 'seed0', 'result.json')
    _wait(lambda: os.path.exists(first), 300, 'the first point to finish')
    assert sweep_main(['--status', out]) == 0
    text = capsys.readouterr().out
    assert re.search(rf'short-lr=0.001 +0 +not started +job {second} ended before it started .*rerun the sweep '
                     'command', text), text
    assert sweep_main(args) == 0
    printed = capsys.readouterr().out
    assert '[skip] short-lr=0.002/seed0: finished' in printed and printed.count('[sbmt]') == 1
    assert len(_jobs(out)['short-lr=0.001/seed0']) == 2 and len(_jobs(out)['short-lr=0.002/seed0']) == 1
    again = _jobs(out)['short-lr=0.001/seed0'][-1]['job_id']
    # one sacct call a poll: with two, the first could answer "" (not listed yet, so "not PENDING") and the second
    # "PENDING", and the job was cancelled while pending, which the accounting may still show as queued for a moment
    _wait(lambda: _sh('sacct', '-j', again, '-X', '-n', '-P', '-o', 'State').strip() not in ('', 'PENDING'), 60,
          'sacct to list the new job as started')
    _sh('scancel', again)
    assert sweep_main(['--status', out]) == 0
    text = capsys.readouterr().out
    assert re.search(rf'short-lr=0.001 +0 +(cancelled +job {again} was cancelled|running)', text), text
    seen: list = []

    def cancelled() -> bool:
        sweep_main(['--status', out])
        seen.append(capsys.readouterr().out + _sh('sacct', '-j', again, '-X', '-n', '-P', '-o', 'State') +
                    _sh('pgrep', '-af', out, check=False))  # what it said, the accounting, any process left
        return any(line.startswith('short-lr=0.001') and 'cancelled' in line for line in seen[-1].splitlines())

    _wait(cancelled, 120, 'the cancelled job to show as cancelled', last=seen)


def test_a_stopped_controller_is_one_line_not_a_hang(tmp_path, capsys, monkeypatch):
    """slurmctld stopped (SIGSTOP: it holds its port and answers nothing): ``sbatch`` of a sweep and ``--status``'s
    ``sacct`` give up after the bound, each in one line naming the command, and nothing is recorded as submitted."""
    from tkvision.experiments import scheduler
    monkeypatch.setattr(scheduler, 'SCHEDULER_SECONDS', 8)
    config = _config(tmp_path, 'short', **SHORT)
    out = str(tmp_path / 'stuck')
    ctld = int(open(os.path.join(CLUSTER, 'run', 'slurmctld.pid')).read())
    os.kill(ctld, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert sweep_main([config, '--out', out, '--executor', 'slurm']) == 2
        seconds = time.monotonic() - started
        # sbatch's own timeout may answer first (its line on stderr, then ours); either way one line of ours, in time
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith('error: sbatch') and ('did not answer within 8 s' in err[-1] or 'timed out' in
                                                         err[-1]) and seconds < 30, (seconds, err)
        assert not [line for line in err[:-1] if not line.startswith('sbatch: error')], err
        assert not os.path.exists(os.path.join(out, 'jobs.json'))
    finally:
        os.kill(ctld, signal.SIGCONT)


def test_up_again_while_one_node_runs_a_job_returns_at_once(tmp_path):
    """``local_cluster.sh up`` on a running cluster where one node is busy (``alloc``) and the other ``idle``, as a
    restarted controller finds it mid-sweep: every node answers, so ``up`` returns in seconds, not a 60 s failure."""
    busy = _nodes()[0]
    job = _sh('sbatch', '--parsable', '--exclusive', '-w', busy, '-o', str(tmp_path / 'sleep.log'), '--wrap',
              'sleep 300').strip()
    try:
        _wait(lambda: _sh('squeue', '-h', '-j', job, '-o', '%T').strip() == 'RUNNING', 60, 'the sleep job to run')
        states = dict(line.split() for line in _sh('sinfo', '-h', '-N', '-o', '%N %t').splitlines())
        assert states[busy] == 'alloc' and set(states.values()) == {'alloc', 'idle'}, states
        started = time.monotonic()
        _sh(SCRIPT, 'up', timeout=120)
        assert time.monotonic() - started < 30
    finally:
        _sh('scancel', job, check=False)
        _wait(lambda: _job_done(job), 60, 'the sleep job to end')


def _sbatch_train(tmp_path, name: str, env_extra=()) -> tuple:
    """``sbatch tools/slurm_train.sbatch`` as a user of a CPU partition submits it: the script unmodified, its
    nodes and cores (``--nodes 2 --cpus-per-task 2``, ``GPUS=2`` processes per node) on the command line, the tiny
    recipe in ``CONFIG``. Returns ``(job id, output folder, log)``."""
    config = _config(tmp_path, f'{name}_recipe', **dict(SHORT, epochs=3, train_subset=8192, log_interval=8,
                                                         progress=False))
    out = str(tmp_path / name)
    env = dict(os.environ, CONFIG=config, DATA='/usr/share/datasets/fashion-mnist', OUT=out, GPUS='2',
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'], **dict(env_extra))
    log = str(tmp_path / f'{name}.log')
    job = subprocess.run(['sbatch', '--parsable', '--nodes', '2', '--cpus-per-task', '2', '--output', log,
                          os.path.join(ROOT, 'tools', 'slurm_train.sbatch')], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), check=True, timeout=60).stdout.strip()
    return job, out, log


def _job_done(job: str) -> bool:
    return _sh('squeue', '-h', '-j', job, check=False).strip() == ''


def test_the_multi_node_sbatch_script_trains_and_its_requeued_job_ends_as_its_twin(tmp_path):
    """``tools/slurm_train.sbatch`` for real, on 2 nodes of 2 processes: it trains to the end. The same job sent
    ``scancel --signal=USR1 --batch`` mid-epoch (what ``--signal=B:USR1@600`` sends): the script's trap hands it to
    every worker, all 4 ranks save at the same update and exit 75, the job requeues itself, and the requeued job
    continues by itself (no ``--resume``) to the uninterrupted job's weights, tensor for tensor."""
    twin, twin_out, twin_log = _sbatch_train(tmp_path, 'twin')
    _wait(lambda: _job_done(twin), 600, 'the uninterrupted job to end', every=2)
    text = open(twin_log).read()
    assert '4 process(es) on cpu (gloo)' in text and 'done in' in text, text
    job, out, log = _sbatch_train(tmp_path, 'stopped')
    _wait(lambda: _epochs(out) >= 1, 600, 'an epoch of the job', every=0.2)
    _sh('scancel', '--signal=USR1', '--batch', job)  # early in the second epoch (32 updates, a check every 8)
    _wait(lambda: _job_done(job) and 'done in' in open(log).read(), 900, 'the requeued job to end', every=2)
    text = open(log).read()
    assert text.count('stopped by SIGUSR1') == 4, text  # every rank, at the same update
    stopped = set(re.findall(r'stopped by SIGUSR1 at update (\d+)', text))
    assert len(stopped) == 1 and 32 < int(stopped.pop()) < 64, text  # mid-epoch, every rank at one update
    assert 'restarted by the launcher: resuming' in text and _restarts(job) >= 1
    _same_weights(os.path.join(out, 'last.safetensors'), os.path.join(twin_out, 'last.safetensors'))
