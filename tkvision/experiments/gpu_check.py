"""One command that checks a GPU machine before real work: ``make test-gpu`` (``tkvision-check-gpu``).

It runs, on one GPU, what a user runs there, each as its command line and for a few hundred updates, on a
synthetic ImageNet-layout folder of JPEGs it writes itself (10 classes of coloured shapes, so a classifier
learns something and nothing is downloaded), and prints one line per item: pass or fail, img/s, the share of
the time spent waiting for the loader, peak memory (the GPU's allocator peak on CUDA, the process's resident
peak on a CPU) and seconds. The items (`ITEMS`):

- ``recipe``: the B/16† ImageNet recipe (``imagenet/tokenformer_vit_b16_matched``: 224 px, bf16, compiled,
  RandAugment, mixup / CutMix, random erasing, EMA) under ``torchrun --nproc_per_node 1``;
- ``torchrun``: ``torchrun --nproc_per_node 1`` of a process that starts the device's process group (NCCL on CUDA)
  and all-reduces on the device, as every rank of a multi-GPU job does;
- ``stop_resume``: SIGTERM to ``torchrun`` after the first mid-epoch checkpoint, then ``--resume`` to the end;
- ``validate``: ``tkvision-validate`` of its ``last.pth``; ``export``: ``tkvision-export`` of it, loaded back with
  ``timm.create_model('local-dir:...')``;
- ``mae`` / ``mae_finetune``: MAE pretraining, then fine-tuning from its weights (``init_from``);
- ``naflex``: the NaFlex TokenFormer on timm's NaFlex loader; ``ringformer``: RingFormer;
- ``growth``: a growth step mid-run (``growth.schedule`` after the first epoch);
- ``elastic``: an elastic run, each prefix validated.

All but the recipe run eager (``--compile false``) at Ti/16 size; the compiled recipe and its stop and resume still
take most of the check's time (each item's seconds on one H200: ``docs/bench/gpu_check_2026-12-04.md``, where the
``recipe`` line times the resumed part and ``stop_resume`` the whole).
``--dry-run`` runs the same items on the CPU with tiny models at 32 px in about a minute: CI runs it
(``tests/test_gpu_check.py``), so the command cannot rot before a GPU is lent. ``--out PREFIX`` writes the
lines as ``PREFIX_<date>.json`` and ``.md`` (e.g. ``docs/bench/gpu_check``). The trainer's augmentations need
albumentations: without it every training item is reported as skipped, naming what to install.
"""
import dataclasses
import datetime
import importlib.util
import json
import os
import re

import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ..utils.files import atomic_write
from .benchmark import machine_info

__all__ = ['ITEMS', 'CheckResult', 'write_synthetic_folder', 'check_gpu', 'write_check_report']

#: The items, in the order they run (module docstring).
ITEMS = ('recipe', 'torchrun', 'stop_resume', 'validate', 'export', 'mae', 'mae_finetune', 'naflex', 'ringformer',
         'growth', 'elastic')
CLASSES = 10

@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of a check: images of ``img_size`` px, per class ``train_per_class`` / ``val_per_class``,
    ``batch_size`` per update, ``epochs``, ``workers`` loader processes, and the arguments ``extra`` every
    training command adds."""
    img_size: int
    train_per_class: int
    val_per_class: int
    batch_size: int
    epochs: int
    workers: int
    extra: Tuple[str, ...] = ()


#: On the GPU (224 px, 200 updates of 64 images each) and for ``--dry-run`` (CPU, 32 px, tiny).
SIZES = {'gpu': Sizes(224, 320, 20, batch_size=64, epochs=4, workers=8),
         'dry': Sizes(32, 16, 4, batch_size=8, epochs=2, workers=0, extra=('--img_size', '32'))}
#: The model of every item but the recipe, eager: Ti/16 on the GPU, a 2-block d 32 one in a dry run.
SMALL = {'gpu': dict(model_kwargs='{num_classes: 10}'),
         'dry': dict(model_kwargs='{img_size: 32, patch_size: 8, embed_dim: 32, depth: 2, num_heads: 2, '
                                  'num_tokens: 16, num_classes: 10}')}


@dataclasses.dataclass
class CheckResult:
    """One item's line of the report.

    Attributes:
        item: its name (`ITEMS`).
        status: ``'pass'``, ``'fail'`` or ``'skipped'``.
        img_per_s: training images per second of its last epoch (``metrics.csv``), or None.
        data_wait: the share of that epoch spent waiting for the loader, or None.
        peak_mem_mib: the GPU allocator's peak in MiB (CUDA), else the process's resident peak, or None.
        seconds: wall seconds of its commands.
        note: what was checked, or the first line of the error.
    """
    item: str
    status: str
    img_per_s: Optional[float] = None
    data_wait: Optional[float] = None
    peak_mem_mib: Optional[float] = None
    seconds: float = 0.0
    note: str = ''

    def line(self) -> str:
        """The printed line: status, item, img/s, data wait (%), peak memory (MiB), seconds and the note, as
        ``PASS recipe <img/s> img/s data wait <share>% peak <MiB> MiB <seconds> s (note)``."""
        def shown(value, fmt):
            return '-' if value is None else format(value, fmt)
        return (f'{self.status.upper():7s} {self.item:13s} {shown(self.img_per_s, ".0f"):>7s} img/s  data wait '
                f'{shown(self.data_wait, ".0%"):>4s}  peak {shown(self.peak_mem_mib, ".0f"):>7s} MiB  '
                f'{self.seconds:5.0f} s  {self.note}')


def write_synthetic_folder(
        root: str,
        size: int,
        train_per_class: int,
        val_per_class: int,
        seed: int = 0,
) -> str:
    """An ImageNet-layout folder (``<root>/train/<class>/*.JPEG``, ``<root>/val/<class>/*.JPEG``) of ``size`` px
    RGB JPEGs: class k is a disc of hue k/10 on a noisy background, at a random place and radius, so the classes
    are learnable and no data is needed. Returns ``root``."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    for split, count in (('train', train_per_class), ('val', val_per_class)):
        for c in range(CLASSES):
            folder = os.path.join(root, split, f'n{c:08d}')
            os.makedirs(folder, exist_ok=True)
            colour = np.array(Image.new('HSV', (1, 1), (int(255 * c / CLASSES), 220, 230)).convert('RGB'))[0, 0]
            for i in range(count):
                image = rng.integers(0, 90, (size, size, 3)).astype(np.uint8)
                (cy, cx), r = rng.uniform(0.3, 0.7, 2) * size, rng.uniform(0.15, 0.3) * size
                image[(yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2] = colour
                Image.fromarray(image).save(os.path.join(folder, f'{split}_{i:05d}.JPEG'), quality=90)
    return root


def _cli(name: str) -> List[str]:
    """The command line of the tool ``name``: its console script (``tkvision-<name>``, installed with the package),
    else ``tools/<name>.py`` of the checkout this package is in (a lent GPU runs the working tree)."""
    script = os.path.join(os.path.dirname(sys.executable), f'tkvision-{name}')
    if os.path.exists(script):
        return [script]
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, os.path.join(checkout, 'tools', f'{name.replace("-", "_")}.py')]


@dataclasses.dataclass
class _Check:
    """What one check runs on: the device, the sizes (`SIZES`), the synthetic folder and a work folder."""
    device: str
    mode: str
    folder: str
    work: str

    @property
    def sizes(self) -> Sizes:
        return SIZES[self.mode]

    def out(self, item: str) -> str:
        return os.path.join(self.work, item)

    def common(self, item: str) -> List[str]:
        """The arguments every training command of ``item`` takes."""
        s = self.sizes
        return ['--data-dir', self.folder, '--output', self.out(item), '--device', self.device, '--epochs',
                str(s.epochs), '--batch_size', str(s.batch_size), '--num_workers', str(s.workers),
                '--warmup_epochs', '0.5', '--model_ema_decay', '0.99', '--progress', 'false', *s.extra]

    def small(self, item: str, config: str, *args: str, kwargs: Optional[str] = None) -> List[str]:
        """``tkvision-train`` of the small eager model (`SMALL`) on ``config``, then ``args``."""
        return [*_cli('train'), '--config', config, *self.common(item), '--compile', 'false',
                '--global_batch_size', 'null', '--model_kwargs', kwargs or SMALL[self.mode]['model_kwargs'], *args]

    def recipe(self, *args: str) -> List[str]:
        """``torchrun --nproc_per_node 1`` of the B/16† recipe (the tiny model in a dry run), then ``args``."""
        tiny = [] if self.mode == 'gpu' else ['--model', 'tokenformer_vit_ti16']
        kwargs = SMALL[self.mode]['model_kwargs']
        s = self.sizes
        return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1', '-m',
                'tkvision.cli.train', '--config', 'imagenet/tokenformer_vit_b16_matched', *self.common('recipe'),
                *tiny, '--model_kwargs', kwargs, '--global_batch_size', str(2 * s.batch_size),
                '--checkpoint_every_steps', str(max(2, s.train_per_class * CLASSES // s.batch_size // 8)),
                *args]


def _run(command: Sequence[str], log_path: str) -> tuple:
    """Run ``command`` to its end, its output into ``log_path``: ``(exit status, output, seconds, resident peak
    MiB of the process)``."""
    t0 = time.perf_counter()
    with open(log_path, 'ab') as log:
        log.write(('$ ' + ' '.join(command) + '\n').encode())
        log.flush()  # before the child writes to the same file
        p = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    with open(log_path, errors='replace') as f:
        return p.returncode, f.read(), time.perf_counter() - t0, usage.ru_maxrss / 1024


def _run_until_checkpoint(command: Sequence[str], log_path: str, checkpoint: str, timeout: float = 900) -> tuple:
    """Run ``command``, send SIGTERM once ``checkpoint`` holds a mid-epoch state (as a pre-empted job is told to
    stop), and wait for its end: `_run`'s tuple. A run that ends before a mid-epoch checkpoint is seen returns its
    own exit status (its output then lacks "stopped by SIGTERM", which `_recipe_items` reports as a failure).

    The child is reaped only by ``os.wait4`` (``WNOHANG`` while polling): ``Popen.poll`` would reap a run that ended
    by itself and leave no status or resource usage to collect. The poll is every 20 ms because the dry run trains
    its two epochs in well under a second on a CPU."""
    from ..engine.checkpoint import load_training_checkpoint
    t0, seen = time.perf_counter(), None
    with open(log_path, 'ab') as log:
        log.write(('$ ' + ' '.join(command) + '\n').encode())
        log.flush()  # before the child writes to the same file
        p = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        while pid == 0 and time.perf_counter() - t0 < timeout:
            if os.path.isfile(checkpoint) and os.path.getmtime(checkpoint) != seen:
                seen = os.path.getmtime(checkpoint)
                if load_training_checkpoint(checkpoint)['batches_done'] > 0:
                    p.send_signal(signal.SIGTERM)
                    break
            time.sleep(0.02)
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid == 0:
            _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    with open(log_path, errors='replace') as f:
        return p.returncode, f.read(), time.perf_counter() - t0, usage.ru_maxrss / 1024


def _last_row(out: str) -> dict:
    """The last row of a run's ``metrics.csv`` (``{}`` without one)."""
    import csv
    path = os.path.join(out, 'metrics.csv')
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else {}


def _error_line(output: str) -> str:
    """The line of ``output`` that says what went wrong (the last ``error: ...`` or exception line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith('error:') or re.match(r'^[A-Za-z_.]+(Error|Exception)\b', line)]
    return (said or lines or ['no output'])[-1][:200]


def _result(item: str, run: tuple, out: Optional[str], passed: Callable[[str, dict], Optional[str]]) -> CheckResult:
    """The `CheckResult` of ``run`` (`_run`'s tuple): ``passed(output, last metrics row)`` returns the note of a
    pass, or None for a failure; img/s, data wait and the GPU's peak come from the run's ``metrics.csv``."""
    code, output, seconds, rss = run
    row = _last_row(out) if out else {}
    note = passed(output, row) if code == 0 else None
    number = (lambda key: float(row[key]) if row.get(key) not in (None, '') else None)
    return CheckResult(item, 'pass' if note is not None else 'fail', number('img_per_s'), number('data_wait'),
                       number('peak_mem_mib') or rss, seconds,
                       note if note is not None else f'exit {code}: {_error_line(output)}')


def _has(*words: str) -> Callable[[str, dict], Optional[str]]:
    """A ``passed`` test of `_result`: every one of ``words`` in the output; the note names the first."""
    return lambda output, row: (f'said {words[0]!r}' if all(w in output for w in words) else None)


def _validated(output: str, row: dict) -> Optional[str]:
    """A ``passed`` test of `_result` for ``tkvision-validate``: the top-1 it printed."""
    match = re.search(r'top-1 [\d.]+%', output)
    return match.group(0) + ' on the val split' if match else None


def _row_has(column: str, note: str, unit: str = '') -> Callable[[str, dict], Optional[str]]:
    """A ``passed`` test of `_result`: the last metrics row has a value in ``column`` (shown with ``unit``)."""
    return lambda output, row: (f'{note} {float(row[column]):.4g}{unit}' if row.get(column) else None)


_PROBE = ('import sys, torch, torch.distributed as dist; from tkvision.engine.distributed import device_plan; '
          'plan = device_plan(sys.argv[1]); dist.init_process_group(plan.backend); '
          't = torch.ones(1, device=plan.device); dist.all_reduce(t); '
          'print("backend", dist.get_backend(), "all_reduce", t.item()); dist.destroy_process_group()')


def _backend(device: str) -> str:
    return 'nccl' if device.startswith('cuda') else 'gloo'


def _torchrun_probe(device: str) -> List[str]:
    """``torchrun --nproc_per_node 1`` of a process that starts the device's process group (NCCL on CUDA: one process
    under torchrun trains without one, as timm's) and all-reduces a tensor on the device."""
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1', '--no-python',
            sys.executable, '-c', _PROBE, device if ':' in device or device == 'cpu' else f'{device}:0']


def _recipe_items(c: _Check, log: Callable[[str], None]) -> List[CheckResult]:
    """``recipe`` and ``stop_resume``: the recipe under torchrun, stopped by SIGTERM after its first mid-epoch
    checkpoint, then resumed to its last epoch."""
    out, logs = c.out('recipe'), os.path.join(c.work, 'logs', 'recipe.log')
    stopped = _run_until_checkpoint(c.recipe(), logs, os.path.join(out, 'last.pth'))
    resumed = _run(c.recipe('--resume'), logs)
    epochs = c.sizes.epochs
    finished = _result('recipe', resumed, out, lambda output, row: (
        f"{epochs} epochs, val top-1 {float(row['top1']):.1f}%" if row.get('epoch') == str(epochs - 1) else None))
    stop_ok = 'stopped by SIGTERM' in stopped[1] and 'resumed from' in resumed[1] and finished.status == 'pass'
    stop = CheckResult('stop_resume', 'pass' if stop_ok else 'fail', seconds=stopped[2] + resumed[2],
                       note='SIGTERM, checkpoint, --resume to the end' if stop_ok else _error_line(resumed[1]))
    for result in (finished, stop):
        log(result.line())
    return [finished, stop]


def _commands(c: _Check) -> Dict[str, tuple]:
    """``{item: (command, output folder or None, passed)}`` of the items that are one command each."""
    dry = c.mode == 'dry'
    last, exported = os.path.join(c.out('recipe'), 'last.pth'), c.out('export')
    decoder = '{embed_dim: 32, depth: 1, num_heads: 2}' if dry else '{embed_dim: 128, depth: 2, num_heads: 4}'
    lens, longest = ('[4, 9, 16]', '16') if dry else ('[64, 144, 196]', '196')
    ring = ('{img_size: 32, patch_size: 8, embed_dim: 32, depth: 2, num_heads: 2, num_classes: 10}' if dry
            else '{num_classes: 10}')
    grown = '{qkv: 24, proj: 24, ffn: 96}' if dry else '{qkv: 256, proj: 256, ffn: 1024}'
    ti = ('--model', 'tokenformer_vit_ti16')
    base = 'imagenet/tokenformer_vit_b16_matched'
    top1 = _row_has('top1', 'val top-1', '%')
    return {
        'validate': ([*_cli('validate'), '--checkpoint', last, '--device', c.device, '--num_workers',
                      str(c.sizes.workers)], None, _validated),
        'export': ([*_cli('export'), '--checkpoint', last, '--out', exported], None, _has('exported')),
        'torchrun': (_torchrun_probe(c.device), None, _has(f'backend {_backend(c.device)}', 'all_reduce 1.0')),
        'export_load': ([sys.executable, '-c', 'import sys, timm, tkvision; m = timm.create_model("local-dir:" + '
                         'sys.argv[1]); print("loaded", sum(p.numel() for p in m.parameters()))', exported], None,
                        _has('loaded')),
        'mae': (c.small('mae', 'imagenet/mae_pretrain_tokenformer_vit_b16_matched', *ti, '--decoder', decoder,
                        '--eval_every', '1', '--recon_images', '0'), c.out('mae'),
                _row_has('val_loss', 'val reconstruction loss')),
        'mae_finetune': (c.small('mae_finetune', 'imagenet/mae_finetune_tokenformer_vit_b16_matched', *ti,
                                 '--init_from', os.path.join(c.out('mae'), 'last.safetensors')),
                         c.out('mae_finetune'), top1),
        'naflex': (c.small('naflex', base, '--model', 'naflexvit_tokenformer_ti16', '--naflex_loader', 'true',
                           '--naflex_train_seq_lens', lens, '--naflex_max_seq_len', longest, '--mixup', '0',
                           '--cutmix', '0', '--reprob', '0'), c.out('naflex'), top1),
        'ringformer': (c.small('ringformer', 'imagenet/ringformer_in100_ringformer', kwargs=ring),
                       c.out('ringformer'), top1),
        'growth': (c.small('growth', base, *ti, '--growth', f'{{schedule: [{{at_epoch: 1, to: {grown}}}]}}'),
                   c.out('growth'), lambda output, row: ('grew mid-run' if 'grew to' in output else None)),
        'elastic': (c.small('elastic', base, *ti, '--elastic_fractions', '[0.25, 0.5, 1.0]'), c.out('elastic'),
                    _row_has('top1@0.25', 'a quarter of the tokens: val top-1', '%')),
    }


#: Items that read another's output, and which.
NEEDS = {'stop_resume': 'recipe', 'validate': 'recipe', 'export': 'recipe',
         'mae_finetune': 'mae'}


def check_gpu(
        device: str = 'cuda',
        work: str = 'runs/gpu_check',
        dry_run: bool = False,
        items: Optional[Sequence[str]] = None,
        log: Callable[[str], None] = print,
        report: Optional[Callable[[List[CheckResult]], None]] = None,
) -> List[CheckResult]:
    """Run the check's ``items`` (default: every one of `ITEMS`) on ``device``, in ``work`` (the synthetic folder,
    each item's run folder and its log under ``work/logs``), printing each line as it ends (``log``).

    Args:
        device: ``'cuda'`` (``'cuda:N'``) or ``'cpu'``.
        work: a new or empty folder.
        dry_run: the tiny sizes (`SIZES`): the same commands on a CPU in about a minute.
        log: called with each item's printed line as it ends.
        report: called with the results so far, in order, after each item (a lease that runs out keeps them).

    Returns:
        one `CheckResult` per item, in order; an item whose input failed is ``'skipped'``.

    Raises:
        FileExistsError: ``work`` is not empty (a check never writes over an earlier one's files).
        ValueError: an unknown item.
    """
    unknown = sorted(set(items or ()) - set(ITEMS))
    if unknown:
        raise ValueError(f'unknown items {unknown}; the items are {", ".join(ITEMS)}')
    if os.path.isdir(work) and os.listdir(work):
        raise FileExistsError(f'{work} is not empty: give the check a new folder (--work)')
    wanted = [i for i in ITEMS if items is None or i in items or any(NEEDS.get(j) == i for j in items)]
    if 'recipe' in wanted and 'stop_resume' not in wanted:
        # The recipe is checked by stopping and resuming it, so its stop_resume line comes free: report it.
        wanted.insert(wanted.index('recipe') + 1, 'stop_resume')
    mode = 'dry' if dry_run else 'gpu'
    os.makedirs(os.path.join(work, 'logs'), exist_ok=True)
    s = SIZES[mode]
    c = _Check(device, mode, write_synthetic_folder(os.path.join(work, 'images'), s.img_size, s.train_per_class,
                                                    s.val_per_class), work)
    if importlib.util.find_spec('albumentations') is None:
        return [CheckResult(i, 'skipped', note='albumentations is not installed (the trainer\'s augmentations): '
                                               'pip install albumentations') for i in wanted]
    results: Dict[str, CheckResult] = {}
    commands = _commands(c)
    for item in wanted:
        if item in results:
            continue
        need = NEEDS.get(item)
        if need is not None and results.get(need, CheckResult(need, 'fail')).status != 'pass':
            results[item] = CheckResult(item, 'skipped', note=f'needs {need}, which did not pass')
            log(results[item].line())
        elif item == 'recipe':
            results.update({r.item: r for r in _recipe_items(c, log)})
        else:
            results[item] = _one(item, commands, os.path.join(work, 'logs', f'{item}.log'))
            log(results[item].line())
        if report is not None:
            report([results[i] for i in wanted if i in results])
    return [results[i] for i in wanted]


def _one(item: str, commands: Dict[str, tuple], log_path: str) -> CheckResult:
    """The result of an item of `_commands` (``export`` also loads what it wrote with ``timm.create_model``)."""
    command, out, passed = commands[item]
    result = _result(item, _run(command, log_path), out, passed)
    if item == 'export' and result.status == 'pass':
        command, out, passed = commands['export_load']
        loaded = _result(item, _run(command, log_path), out, passed)
        loaded.seconds += result.seconds
        return dataclasses.replace(loaded, note='exported; timm.create_model("local-dir:...") loads it'
                                   if loaded.status == 'pass' else loaded.note)
    return result


def write_check_report(
        results: Sequence[CheckResult],
        prefix: str,
        device: str,
        command: str,
) -> List[str]:
    """Write ``results`` as ``<prefix>_<YYYY-MM-DD>.json`` (``machine``, ``date``, ``command``, ``items``) and
    ``.md`` (the same lines as a table), atomically. Returns the two paths."""
    import torch
    date = datetime.date.today().isoformat()
    base = f'{prefix}_{date}'
    folder = os.path.dirname(base)
    if folder:
        os.makedirs(folder, exist_ok=True)
    info = dict(machine=machine_info(torch.device(device)), date=date, command=command,
                items=[dataclasses.asdict(r) for r in results])
    atomic_write(base + '.json', lambda f: json.dump(info, f, indent=1), text=True)
    rows = ['| item | status | img/s | data wait | peak MiB | seconds | note |', '|---|---|---|---|---|---|---|']
    rows += [f'| {r.item} | {r.status} | {_cell(r.img_per_s, ".0f")} | {_cell(r.data_wait, ".1%")} | '
             f'{_cell(r.peak_mem_mib, ".0f")} | {r.seconds:.0f} | {r.note} |' for r in results]
    text = f'# GPU check, {date}\n\nMachine: {info["machine"]}. Command: `{command}`.\n\n' + '\n'.join(rows) + '\n'
    atomic_write(base + '.md', lambda f: f.write(text), text=True)
    return [base + '.json', base + '.md']


def _cell(value: Optional[float], fmt: str) -> str:
    return '–' if value is None else format(value, fmt)
