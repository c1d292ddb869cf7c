"""Ablation sweep tool and growth experiment: resumable, failures reported, tables and charts written."""
import csv
import json
import os
import subprocess

import pytest
import yaml

from studies.growth.growth_experiment import plan_runs, report, run_all
from tkvision.cli.experiments import sweep_main

from .helpers import ROOT, TINY_FMNIST


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
    printed = capsys.readouterr()
    assert '[fail] broken/seed0: ConfigError' in printed.out + printed.err
    assert 'Traceback' not in printed.out + printed.err  # a failed point is its one line (TKVISION_DEBUG=1: more)
    rows = list(csv.DictReader(open(os.path.join(out, 'results.csv'))))
    assert [r['config'] for r in rows] == ['broken', 'l1']  # _base_ is not a point
    broken, l1 = rows
    assert 'unknown score_norm' in broken['failed'] and broken['seeds'] == '0' and broken['seed_ids'] == ''
    assert l1['seeds'] == '2' and l1['seed_ids'] == '0 1' and 10 < float(l1['top1_mean']) <= 100 and float(l1['top1_std']) >= 0
    seed_results = [json.load(open(os.path.join(out, 'l1', f'seed{s}', 'result.json')))['top1'] for s in (0, 1)]
    # every seed says what ran it, so a comparison can name a change of machine or code
    points = list(csv.DictReader(open(os.path.join(out, 'results_points.csv'))))
    head = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True)
    dirty = subprocess.run(['git', '-C', ROOT, 'diff', '--quiet', 'HEAD', '--'], capture_output=True).returncode == 1
    assert {p['commit'] for p in points} == {head.stdout.strip() + ('-dirty' if dirty else '')}
    cpu = next(line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo') if line.startswith('model name'))
    assert len(points) == 2 and all(p['machine'].startswith(f'{cpu}, {os.cpu_count()} cores, torch ') for p in points)
    assert abs(float(l1['top1_mean']) - sum(seed_results) / 2) < 1e-6
    assert open(os.path.join(out, 'results.png'), 'rb').read(4) == b'\x89PNG'
    assert open(os.path.join(out, 'results_params.png'), 'rb').read(4) == b'\x89PNG'
    capsys.readouterr()
    sweep_main([good, '--seeds', '0', '1', '--out', out])  # finished points are skipped
    assert capsys.readouterr().out.count('[skip]') == 2
    # the options of the home-made launcher are refused with what replaced them
    assert sweep_main([good, '--out', out, '--print-commands']) == 2
    assert '--executor slurm' in capsys.readouterr().err
    assert sweep_main([good, '--out', out, '--launcher', 'torchrun']) == 2
    assert '--executor local' in capsys.readouterr().err


def test_a_sweep_of_mae_points_reports_their_validation_loss(tmp_path, capsys):
    """An MAE point has no top-1: the sweep records its final validation reconstruction loss, tabulates it with
    the sample std over seeds and shows it in --status (the table crashed on the missing top-1 before)."""
    cfg = _write(tmp_path / 'mae.yaml', dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, task='mae',
                                             decoder=dict(embed_dim=16, depth=1, num_heads=2), mask_ratio=0.75,
                                             rrc_scale=None, epochs=1, warmup_epochs=0.5, batch_size=64, lr=1e-3,
                                             train_subset=256, val_subset=128, threads=1))
    out = str(tmp_path / 'sweep')
    assert sweep_main([cfg, '--seeds', '0', '1', '--out', out]) == 0
    losses = []
    for seed in (0, 1):
        with open(os.path.join(out, 'mae', f'seed{seed}', 'metrics.csv')) as f:
            losses.append(float(list(csv.DictReader(f))[-1]['val_loss']))
    row, = csv.DictReader(open(os.path.join(out, 'results.csv')))
    assert float(row['val_loss_mean']) == pytest.approx(sum(losses) / 2, abs=1e-6)
    assert float(row['val_loss_std']) == pytest.approx(abs(losses[0] - losses[1]) / 2 ** 0.5, abs=1e-6)
    assert row['top1_mean'] == 'nan' and row['failed'] == ''
    assert 'val loss mean ± std' in open(os.path.join(out, 'results.md')).read()
    capsys.readouterr()
    assert sweep_main(['--status', out]) == 0
    assert f'val loss {losses[0]:.4f}' in capsys.readouterr().out


def test_growth_experiment_counts_compute_per_stage_and_reports(tmp_path):
    """A 2-stage chain and both sizes from scratch: compute per epoch is the FLOPs/image of that epoch's
    size times the images; the report answers the question and draws the plot; finished runs are skipped."""
    fam = _write(tmp_path / 'tf.yaml', dict(model='tokenformer_vit_ti16', model_kwargs=dict(TINY_FMNIST, num_tokens=8),
                                            rrc_scale=None, batch_size=64, lr=2e-3, warmup_epochs=0.5, epochs=2,
                                            train_subset=256, val_subset=128, threads=1,
                                            growth=dict(schedule=[dict(at_epoch=1, to=dict(qkv=16, proj=16, ffn=64))])))
    out = str(tmp_path / 'exp')
    runs = plan_runs('chain', [0], families={'tokenformer': fam})
    assert run_all(runs, out) == 3 and run_all(runs, out) == 0  # the second call skips all three
    chain = json.load(open(os.path.join(out, 'tokenformer_chain', 'seed0', 'result.json')))
    big = json.load(open(os.path.join(out, 'tokenformer_scratch_16-64', 'seed0', 'result.json')))
    f_small, f_big = chain['flops_per_image']
    assert f_small < f_big == big['flops_per_image'][0]
    assert abs(chain['compute'] - 256 * (f_small + f_big)) < 1e-6 * chain['compute']
    assert abs(big['compute'] - 256 * 2 * f_big) < 1e-6 * big['compute']
    assert [p[1] for p in chain['points']] == [float(r['top1']) for r in csv.DictReader(
        open(os.path.join(out, 'tokenformer_chain', 'seed0', 'metrics.csv')))]
    text = report(out)
    assert 'tokenformer: from scratch the largest size (16-64)' in text and f"{100 * chain['compute'] / big['compute']:.0f}%" in text
    assert open(os.path.join(out, 'accuracy_vs_compute.png'), 'rb').read(4) == b'\x89PNG'
    # The docs' tables come from results.json's rows; --from-results rebuilds the report without the runs.
    stored = json.load(open(os.path.join(out, 'results.json')))
    rows = {r['name']: r for r in stored['run_rows']}
    assert abs(rows['tokenformer_chain']['of_largest'] - 100 * chain['compute'] / big['compute']) < 1e-9
    assert rows['tokenformer_chain']['size'].endswith('→ 16-64') and rows['tokenformer_scratch_16-64']['of_largest'] == 100
    assert report(str(tmp_path / 'again'), stored['results']) == text
    # one seed has no spread: none in results.json (– in docs/growth.md), '(one seed)' in the report, not ± 0.00
    assert rows['tokenformer_chain']['top1_std'] is None and '(one seed)' in text and '± 0.00' not in text


def test_a_preempted_point_stops_the_sweep_instead_of_training_the_next(tmp_path, monkeypatch, capsys):
    """SIGTERM (a scheduler's preemption, a user's ``kill``) stops the trainer with its state saved; the
    sweep in this process must stop there too, with the preemption exit status, not record a failure and train
    the next point (it did: the signal read as a failed point)."""
    from tkvision.engine.trainer import EXIT_PREEMPTED, Preempted
    from tkvision.experiments import sweep
    from tkvision.experiments.points import PointJob
    calls = []

    def preempted(job, run_dir):
        calls.append(job.point.key)
        raise Preempted(f'stopped by SIGTERM; state saved to {run_dir}/last.pth', 'SIGTERM')
    monkeypatch.setattr(PointJob, '_train', preempted)
    configs = [_write(tmp_path / name, dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST))
               for name in ('a.yaml', 'b.yaml')]
    with pytest.raises(Preempted):
        sweep.run_sweep(configs, [0, 1], str(tmp_path / 'out'), log=lambda *a: None)
    assert calls == ['a/seed0']
    assert not os.path.exists(tmp_path / 'out' / 'a' / 'seed0' / 'result.json')
    assert sweep_main([*configs, '--seeds', '0', '--out', str(tmp_path / 'out')]) == EXIT_PREEMPTED
    assert calls == ['a/seed0'] * 2 and 'stopped by SIGTERM' in capsys.readouterr().err


def test_a_stop_signal_while_a_point_starts_stops_it_instead_of_being_passed_over(tmp_path, monkeypatch):
    """submitit's job sets SIGTERM to be passed over ("Bypassing signal SIGTERM") before it calls the point, and the
    trainer sets its own handler only once the data and model are built: a ``kill`` of a local sweep that landed in
    that window was lost, and the point trained on, orphaned, after its sweep had stopped. It must stop the point,
    nothing recorded, submitit's handler back in place for its own exit."""
    import signal
    from tkvision.engine.trainer import Preempted
    from tkvision.experiments import points

    def bypass(signum, frame):  # what submitit's job sets for SIGTERM
        pass
    original = points.load_config

    def killed_while_loading(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return original(*args, **kwargs)
    monkeypatch.setattr(points, 'load_config', killed_while_loading)
    config = _write(tmp_path / 'a.yaml', dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None,
                                              epochs=1, warmup_epochs=0.5, batch_size=64, train_subset=256,
                                              val_subset=128, threads=1))
    out = str(tmp_path / 'out')
    previous = signal.signal(signal.SIGTERM, bypass)
    try:
        with pytest.raises(Preempted, match='SIGTERM') as stop:
            points.PointJob(points.sweep_points([config], [0])[0], out)()
        assert signal.getsignal(signal.SIGTERM) is bypass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.value.signal_name == 'SIGTERM' and 'rerun' in str(stop.value)
    assert not os.path.exists(os.path.join(out, 'a', 'seed0', 'result.json'))


def test_comparison_rows_take_means_spreads_and_ratios_to_the_reference(tmp_path):
    """docs/comparison.md's rows: mean and sample std over seeds (none for one seed), compute = counted GFLOPs x
    training images x epochs, and each ratio against the reference (ViT) row, here from hand-written points."""
    from studies.comparison.comparison import comparison_rows
    base = dict(model_kwargs=dict(TINY_FMNIST), rrc_scale=None, batch_size=64, train_subset=512, threads=1)
    tf = _write(tmp_path / 'tf.yaml', dict(base, model='tokenformer_vit_ti16', epochs=2))
    vit_kwargs = {k: v for k, v in TINY_FMNIST.items() if k != 'num_tokens'}
    vit = _write(tmp_path / 'vit.yaml', dict(base, model='vit_tiny_patch16_224', model_kwargs=vit_kwargs, epochs=3))
    points = [dict(config='tf', seed=0, top1=80.0, test_top1=79.0, img_per_s=100.0, minutes=2.0),
              dict(config='tf', seed=1, top1=82.0, test_top1=80.0, img_per_s=300.0, minutes=4.0),
              dict(config='vit', seed=0, top1=84.0, test_top1=83.0, img_per_s=400.0, minutes=1.5)]
    rows = {r['config']: r for r in comparison_rows([tf, vit], points, reference='vit')}
    assert (rows['tf']['top1_mean'], rows['tf']['top1_std']) == (81.0, 1.41)  # sqrt(2)
    assert (rows['tf']['img_per_s_vs_reference'], rows['tf']['minutes_vs_reference']) == (0.5, 2.0)
    assert rows['tf']['train_tflops'] == rows['tf']['train_gflops_per_image'] * 512 * 2 / 1e3
    flops_ratio = (2 * rows['tf']['train_gflops_per_image']) / (3 * rows['vit']['train_gflops_per_image'])
    assert abs(rows['tf']['compute_vs_reference'] - flops_ratio) < 2e-3
    assert rows['vit']['seeds'] == 1 and rows['vit']['top1_std'] is None  # one seed: no spread, not 0.0
    # the settings column: what each config sets otherwise than the reference's, the reference's own empty
    assert rows['vit']['changes'] == ''
    assert rows['tf']['changes'] == 'epochs=2; model=tokenformer_vit_ti16; num_tokens=' + str(TINY_FMNIST['num_tokens'])
    with pytest.raises(ValueError, match='--reference vit2: no finished point'):
        comparison_rows([tf, vit], points, reference='vit2')


def test_the_settings_column_names_each_changed_key_and_model_kwarg_and_no_output():
    """The levers' table says what each lever changed: differing top-level keys and model kwargs by name
    (a kwarg only the reference sets reads ``(unset)``), sorted; where a run is written is not a setting."""
    from studies.comparison.comparison import config_changes_from
    reference = dict(model='m', epochs=6, output='runs/a', model_kwargs=dict(num_tokens=72, tau_scale=2.0))
    lever = dict(model='m', epochs=6, output='runs/b', parameter_token_lr_scale=0.25,
                 model_kwargs=dict(num_tokens=72, key_std=0.1))
    assert config_changes_from(reference, lever) == 'key_std=0.1; parameter_token_lr_scale=0.25; tau_scale=(unset)'
    assert config_changes_from(reference, dict(reference, output='runs/c')) == ''


def test_a_report_keeps_the_stored_points_it_does_not_measure_again(tmp_path):
    """A fresh checkout has docs/comparison/levers/points.csv but not the runs behind it: reporting today's
    runs keeps every stored (config, seed) that was not run again and replaces the ones that were."""
    from studies.comparison.comparison import read_points, write_report
    base = dict(model_kwargs=dict(TINY_FMNIST), rrc_scale=None, batch_size=64, train_subset=512, threads=1,
                model='tokenformer_vit_ti16', epochs=1)
    ref, lever = _write(tmp_path / 'ref.yaml', base), _write(tmp_path / 'lever.yaml', dict(base, epochs=2))
    report = tmp_path / 'report'
    report.mkdir()
    (report / 'points.csv').write_text('config,seed,top1,test_top1,img_per_s,minutes\n'
                                       'ref,0,80.0,79.0,100.0,1.0\nref,1,82.0,81.0,100.0,1.0\n')
    today = [dict(config='lever', seed=0, top1=90.0, test_top1=89.0, img_per_s=50.0, minutes=2.0, machine='AMD EPYC',
                  commit='abc1234'),
             dict(config='ref', seed=1, top1=84.0, test_top1=83.0, img_per_s=100.0, minutes=1.0)]
    rows = {r['config']: r for r in write_report([ref, lever], today, str(report), reference='ref')}
    assert [(p['config'], p['seed'], p['top1']) for p in read_points(str(report / 'points.csv'))] == [
        ('ref', 0, 80.0), ('ref', 1, 84.0), ('lever', 0, 90.0)]
    # what ran each point travels with it; a point recorded without it says 'unknown', never a blank
    assert [(p['machine'], p['commit']) for p in read_points(str(report / 'points.csv'))] == [
        ('unknown', 'unknown'), ('unknown', 'unknown'), ('AMD EPYC', 'abc1234')]
    assert rows['ref']['top1_mean'] == 82.0 and rows['ref']['seeds'] == 2 and rows['lever']['seeds'] == 1


def test_curves_read_the_kept_metrics_at_one_based_epochs_and_name_a_missing_one(tmp_path):
    """docs/comparison.md's curve table: the trainer's metrics.csv counts epochs from 0 and prints them from 1;
    ``--curve-epochs 2`` is the second row. A run that stopped short is named, not read as another epoch."""
    from studies.comparison.comparison import curve_rows
    header = 'epoch,train_loss,top1\n'
    (tmp_path / 'a_seed0_metrics.csv').write_text(header + '0,1.0,50.0\n1,0.81234,61.256\n2,0.7,70.0\n')
    (tmp_path / 'b_seed0_metrics.csv').write_text(header + '0,2.0,40.0\n1,1.5,45.0\n')
    assert curve_rows(str(tmp_path), [1, 2]) == [
        dict(point='a_seed0', quantity='top1', epoch_1=50.0, epoch_2=61.26),
        dict(point='b_seed0', quantity='top1', epoch_1=40.0, epoch_2=45.0),
        dict(point='a_seed0', quantity='train_loss', epoch_1=1.0, epoch_2=0.812),
        dict(point='b_seed0', quantity='train_loss', epoch_1=2.0, epoch_2=1.5)]
    with pytest.raises(ValueError, match=r'b_seed0_metrics.csv has no epoch \[3\] \(it has 1..2\)'):
        curve_rows(str(tmp_path), [1, 3])


def test_time_to_a_figure_is_the_first_epoch_that_reached_it_or_none(tmp_path):
    """docs/cifar10.md's time to 80%: the first epoch (1-based) whose validation top-1 is at least the target, and
    the run's elapsed minutes then (not the epoch's own time, nor the best epoch's); a run that never reached it
    has empty cells, not its last epoch. Hand-made curves: a reaches 80 at its second epoch (exactly 80.0) and
    passes it again later; b never does."""
    from studies.comparison.comparison import time_to_rows
    header = 'epoch,top1,elapsed_minutes\n'
    (tmp_path / 'a_seed0_metrics.csv').write_text(header + '0,79.99,10.0\n1,80.0,21.04\n2,79.0,30.0\n3,85.5,40.0\n')
    (tmp_path / 'b_seed0_metrics.csv').write_text(header + '0,50.0,5.0\n1,67.44,9.0\n')
    assert time_to_rows(str(tmp_path), 80.0) == [
        dict(point='a_seed0', target=80.0, epoch=2, minutes=21.0, best_top1=85.5, epochs=4),
        dict(point='b_seed0', target=80.0, epoch='', minutes='', best_top1=67.44, epochs=2)]


def test_one_seed_is_reported_without_a_spread_and_several_with_the_sample_std(tmp_path):
    """A single seed's std is None (an empty cell, – in the docs), never 0.0, which would claim that seeds
    agree; several seeds' is the sample std (n - 1), here checked against hand arithmetic. The sweep's and
    the NaFlex experiment's tables wrote 0.0 for one seed."""
    from studies.naflex.naflex_experiment import summarize_rows
    from tkvision.experiments.sweep import mean_std, summarize
    assert mean_std([80.0, 82.0, 84.0]) == (82.0, 2.0) and mean_std([81.234], 2) == (81.23, None)
    records = [dict(config='a', seed=0, status='ok', top1=80.0, test_top1=79.0, params=10, img_per_s=5.0, minutes=1.0),
               dict(config='a', seed=1, status='ok', top1=83.0, test_top1=80.0, params=10, img_per_s=5.0, minutes=1.0),
               dict(config='b', seed=0, status='ok', top1=70.0, test_top1=69.0, params=20, img_per_s=4.0, minutes=2.0)]
    rows = {r['config']: r for r in summarize(records, str(tmp_path))}
    assert abs(rows['a']['top1_std'] - 4.5 ** 0.5) < 1e-12 and rows['b']['top1_std'] is None
    stored = {r['config']: r for r in csv.DictReader(open(tmp_path / 'results.csv'))}
    assert stored['b']['top1_std'] == stored['b']['test_top1_std'] == ''
    table = (tmp_path / 'results.md').read_text()
    assert '| b | 70.00 (one seed) | 69.00 (one seed) |' in table and '| a | 81.50 ± 2.12 | 79.50 ± 0.71 | 0 1 |' in table
    # the columns say what they hold: which seeds (a count is results.csv's seeds), one seed's training minutes
    assert '| seed ids | params | img/s | training min per seed | failed |' in table
    assert stored['a']['seeds'] == '2' and stored['a']['seed_ids'] == '0 1'
    lengths = [dict(config='c', test_set='val', length=64, top1=60.0, img_per_s=9.0)]
    assert summarize_rows(lengths)[0]['top1_std'] is None


def test_a_resumed_points_minutes_count_the_time_before_its_preemption(tmp_path, monkeypatch):
    """A point stopped after its first epoch's checkpoint and finished by a rerun reports the minutes of
    both parts, as ``result.json`` and the reports' minutes column (and their ratios) read it: the sweep
    reported only the last part's wall time (a 75-epoch long-recipe run resumed for its last five epochs
    said 10.5 minutes instead of ~150)."""
    import time

    from tkvision.engine import clock as clock_mod
    from tkvision.engine.state import TrainState
    from tkvision.experiments import sweep
    base = dict(model='tokenformer_vit_ti16', model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=2, warmup_epochs=0.5,
                batch_size=64, lr=2e-3, train_subset=256, val_subset=64, threads=1)
    config = _write(tmp_path / 'point.yaml', base)
    out, real_save, pause = str(tmp_path / 'sweep'), clock_mod.save_training_checkpoint, 4.0

    real_state = TrainState.state_dict

    def slow(state, *args):  # the first part takes `pause` seconds longer before its first checkpoint
        time.sleep(pause)
        return real_state(state, *args)

    def crash(checkpoint, path):  # then the process dies
        real_save(checkpoint, path)
        raise KeyboardInterrupt('simulated crash after the first checkpoint')

    monkeypatch.setattr(TrainState, 'state_dict', slow)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', crash)
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep([config], [0], out, log=lambda *a: None)
    first = time.perf_counter() - t0
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real_save)
    monkeypatch.setattr(TrainState, 'state_dict', real_state)
    t0 = time.perf_counter()
    [record] = sweep.run_sweep([config], [0], out, log=lambda *a: None)
    second = time.perf_counter() - t0
    assert record['status'] == 'ok'
    # the first part's pause counted; more than the rerun's own wall time (all the old code counted), no more
    # than both parts' wall time
    assert 60 * record['minutes'] >= pause and second < 60 * record['minutes'] <= first + second


def test_provenance_reads_what_ran_a_point_from_its_record(tmp_path):
    """The study reports (precondition, chains, elastic) take each run's machine and commit from its
    ``result.json``; a run without one, or recorded before the fields existed, is 'unknown', never blank."""
    from tkvision.experiments.points import provenance
    (tmp_path / 'new').mkdir()
    (tmp_path / 'new' / 'result.json').write_text(json.dumps(dict(top1=80.0, machine='AMD EPYC, 2 cores',
                                                                   commit='abc1234')))
    (tmp_path / 'old').mkdir()
    (tmp_path / 'old' / 'result.json').write_text(json.dumps(dict(top1=80.0)))
    assert provenance(str(tmp_path / 'new')) == dict(machine='AMD EPYC, 2 cores', commit='abc1234')
    assert provenance(str(tmp_path / 'old')) == provenance(str(tmp_path / 'none')) == dict(machine='unknown',
                                                                                           commit='unknown')


def test_paired_differences_are_taken_seed_by_seed_over_the_common_seeds():
    """``paired.csv``'s rows (what a notes page's "paired: +0.43, ..." renders from): each ordered pair, only the
    seeds both have, ``config`` minus ``against`` in seed order, and how many seeds it validates higher."""
    from studies.comparison.comparison import paired_rows
    points = [dict(config='a', seed=s, top1=t, test_top1=u)
              for s, t, u in ((0, 88.5, 87.0), (1, 88.0, 87.5), (2, 89.0, 86.0))]
    points += [dict(config='b', seed=s, top1=t, test_top1=u) for s, t, u in ((1, 88.25, 87.0), (2, 89.5, 86.25))]
    rows = {(r['config'], r['against']): r for r in paired_rows(points)}
    assert set(rows) == {('a', 'b'), ('b', 'a')}
    assert rows['a', 'b'] == dict(config='a', against='b', seeds='1 2', top1_diffs='-0.25, -0.50',
                                  test_top1_diffs='+0.50, -0.25', top1_higher=0)
    assert rows['b', 'a']['top1_diffs'] == '+0.25, +0.50' and rows['b', 'a']['top1_higher'] == 2


def test_a_training_override_before_the_configs_is_not_read_as_a_config():
    """``tkvision-sweep --threads 1 a.yaml --seeds 0 1 2``, as the CIFAR-10 configs' headers write it: ``1`` is the
    value of the override ``--threads`` (it was taken for a config named "1", whose points all failed), the
    seeds are three, and ``--threads=1``, ``--debug`` and the sweep's own options keep their meaning."""
    from tkvision.cli.experiments import parse_sweep_args
    args, extra = parse_sweep_args(['--out', 'o', '--threads', '1', 'a.yaml', '--debug', 'b.yaml', '--seeds', '0',
                                    '1', '2', '--epochs=3', '--parallel', '2'])
    assert args.configs == ['a.yaml', 'b.yaml'] and args.seeds == [0, 1, 2] and args.out == 'o'
    assert args.parallel == 2 and extra == ['--threads', '1', '--debug', '--epochs=3']
