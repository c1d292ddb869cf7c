"""``make test-gpu`` (``tkvision-check-gpu``) cannot rot before a GPU is lent: its dry run takes every item's
command line on the CPU, with tiny models, and each must pass; the GPU commands are what a user runs there."""
import json
import os
import re
import subprocess
import sys

import pytest

from tkvision.experiments import gpu_check


@pytest.mark.slow
def test_the_dry_run_passes_every_item_and_writes_its_report(tmp_path):
    work, out = tmp_path / 'work', tmp_path / 'bench' / 'gpu_check'
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), 'tkvision-check-gpu'), '--device', 'cpu',
                             '--dry-run', '--work', str(work), '--out', str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(('PASS', 'FAIL', 'SKIPPED'))]
    assert sorted(line.split()[1] for line in lines) == sorted(gpu_check.ITEMS)
    assert all(line.startswith('PASS') for line in lines), result.stdout
    report = json.load(open(next(p for p in (tmp_path / 'bench').iterdir() if p.suffix == '.json')))
    assert [item['item'] for item in report['items']] == list(gpu_check.ITEMS) and report['machine']
    recipe = next(item for item in report['items'] if item['item'] == 'recipe')
    assert recipe['img_per_s'] > 0 and 0 <= recipe['data_wait'] <= 1 and recipe['peak_mem_mib'] > 0
    # every top-1 a line prints carries its unit (the elastic line printed 'val 100' beside '12.5%')
    tops = [item['note'] for item in report['items'] if 'top-1' in item['note'] or ': val' in item['note']]
    assert len(tops) >= 6 and all(re.search(r'top-1 [\d.]+%', note) for note in tops), tops


def test_on_a_gpu_the_recipe_is_the_b16_recipe_compiled_at_224_px(tmp_path):
    """What the GPU check runs: the shipped B/16† recipe as it is (bf16, compile auto, its augmentations and EMA) at
    224 px under torchrun; the other items eager at Ti/16; nothing of the dry run's sizes."""
    check = gpu_check._Check('cuda', 'gpu', str(tmp_path / 'images'), str(tmp_path))
    recipe = check.recipe()
    assert recipe[:8] == [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1',
                          '-m', 'tkvision.cli.train']
    assert recipe[recipe.index('--config') + 1] == 'imagenet/tokenformer_vit_b16_matched'
    assert '--compile' not in recipe and '--model' not in recipe and '--img_size' not in recipe
    commands = gpu_check._commands(check)
    assert set(gpu_check.ITEMS) - {'recipe', 'stop_resume'} <= set(commands)
    for item in ('mae', 'mae_finetune', 'naflex', 'ringformer', 'growth', 'elastic'):
        command = commands[item][0]
        assert command[command.index('--compile') + 1] == 'false' and '--img_size' not in command, item
    assert gpu_check._torchrun_probe('cuda')[-1] == 'cuda:0' and 'nccl' == gpu_check._backend('cuda')


def test_a_failed_item_names_its_error_and_what_needs_it_is_skipped(tmp_path, monkeypatch):
    failed = gpu_check._result('mae', (2, 'epoch 1\nerror: amp: bf16 needs a GPU with bfloat16\n', 3.0, 900.0), None,
                               gpu_check._has('never'))
    assert failed.status == 'fail' and failed.note == 'exit 2: error: amp: bf16 needs a GPU with bfloat16'
    assert failed.line().startswith('FAIL    mae')
    monkeypatch.setattr(gpu_check, '_one', lambda item, commands, log_path: failed)
    results = gpu_check.check_gpu('cpu', str(tmp_path / 'w'), dry_run=True, items=['mae_finetune'], log=lambda _: None)
    assert [(r.item, r.status) for r in results] == [('mae', 'fail'), ('mae_finetune', 'skipped')]
    assert results[1].note == 'needs mae, which did not pass'


def test_a_check_never_writes_into_a_folder_that_holds_files(tmp_path):
    (tmp_path / 'earlier.txt').write_text('kept')
    with pytest.raises(FileExistsError, match='is not empty'):
        gpu_check.check_gpu('cpu', str(tmp_path), dry_run=True)
    assert (tmp_path / 'earlier.txt').read_text() == 'kept'


def test_on_a_machine_without_a_gpu_the_check_names_its_cpu_dry_run(capsys):
    """``make test-gpu`` where there is no GPU: one line naming the CPU dry run to run instead (exit 2)."""
    import torch

    from tkvision.cli.experiments import check_gpu_main
    if torch.cuda.is_available():  # a GPU machine runs the real check: this one is about the others
        return
    assert check_gpu_main(['--device', 'cuda']) == 2
    err = capsys.readouterr().err
    assert 'no CUDA device here' in err and 'make test-gpu ARGS="--device cpu --dry-run"' in err
    assert len(err.strip().splitlines()) == 1


def test_a_check_cut_short_keeps_the_lines_it_measured(tmp_path, monkeypatch):
    """A lease that runs out kills the check mid-item: the report already holds every item that ended (the
    2026-12-04 H200 check lost its first 3 lines this way before the report was written per item)."""
    def one(item, commands, log_path):
        if item == 'mae_finetune':
            raise KeyboardInterrupt  # the kill
        return gpu_check.CheckResult(item, 'pass', seconds=1.0)
    monkeypatch.setattr(gpu_check, '_one', one)
    prefix = str(tmp_path / 'bench' / 'gpu_check')
    with pytest.raises(KeyboardInterrupt):
        gpu_check.check_gpu('cpu', str(tmp_path / 'w'), dry_run=True, items=['mae_finetune'], log=lambda _: None,
                            report=lambda results: gpu_check.write_check_report(results, prefix, 'cpu', 'check'))
    [path] = [p for p in (tmp_path / 'bench').iterdir() if p.suffix == '.json']
    assert [(i['item'], i['status']) for i in json.load(open(path))['items']] == [('mae', 'pass')]


def test_items_that_need_the_recipe_report_the_stop_and_resume_it_ran(tmp_path, monkeypatch):
    """The recipe is checked by SIGTERM and ``--resume``, so asking for ``validate`` runs ``stop_resume`` too: its
    line must be in the results and the report (the 2026-12-04 H200 check printed PASS for it and dropped it)."""
    def recipe_items(c, log):
        return [gpu_check.CheckResult('recipe', 'pass', seconds=2.0),
                gpu_check.CheckResult('stop_resume', 'pass', seconds=3.0)]
    monkeypatch.setattr(gpu_check, '_recipe_items', recipe_items)
    monkeypatch.setattr(gpu_check, '_one', lambda item, commands, log_path: gpu_check.CheckResult(item, 'pass'))
    reports = []
    results = gpu_check.check_gpu('cpu', str(tmp_path / 'w'), dry_run=True, items=['validate'], log=lambda _: None,
                                  report=reports.append)
    assert [r.item for r in results] == ['recipe', 'stop_resume', 'validate']
    assert [r.item for r in reports[-1]] == ['recipe', 'stop_resume', 'validate']


def test_a_run_that_ends_before_it_can_be_stopped_returns_its_own_status(tmp_path):
    """The stop-and-resume item's run can end by itself before a mid-epoch checkpoint is seen (the dry run trains in
    under a second): its exit status and output come back, as `_run`'s, instead of an error from reaping it twice."""
    log = str(tmp_path / 'recipe.log')
    code, output, seconds, rss = gpu_check._run_until_checkpoint(
        [sys.executable, '-c', 'import sys; print("trained"); sys.exit(3)'], log, str(tmp_path / 'never.pth'))
    assert code == 3 and 'trained' in output and 'stopped by SIGTERM' not in output
    assert seconds > 0 and rss > 0
