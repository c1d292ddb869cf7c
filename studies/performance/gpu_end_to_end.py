"""Part 6 of the GPU report (`gpu_report`): the trainer end to end on a lent GPU, as a user
runs it (``torchrun``, an ImageNet recipe, a JPEG folder, one epoch, then ``--resume``)."""
import csv
import importlib.util
import os
import subprocess
import sys
import time

from studies import portable_command
from tkvision.data.fashion_mnist import write_image_folder

__all__ = ['E2E_RECIPE', 'end_to_end']


#: The recipe the end-to-end run trains, and its overrides: a short run (one epoch, then three more
#: after a resume; EMA decay for ~40 updates) at a global batch of 256 in micro-batches of 128, so the
#: trainer accumulates gradients over 2; the tiny CPU stand-in at 32 px.
E2E_RECIPE = 'imagenet/tokenformer_vit_b16_matched'
_E2E = ['--model_kwargs', '{num_classes: 10}', '--batch_size', '128', '--global_batch_size', '256',
        '--num_workers', '12']
_E2E_TINY = ['--model', 'tokenformer_vit_ti16', '--model_kwargs', '{img_size: 32, patch_size: 8, embed_dim: 32, '
             'depth: 2, num_heads: 2, num_tokens: 16, num_classes: 10}', '--img_size', '32', '--batch_size', '8',
             '--global_batch_size', '16', '--num_workers', '0']


def _train_command(folder: str, out: str, device, tiny: bool, compiled: bool, epochs: int, resume: bool) -> list:
    """The ``torchrun`` command line of one leg of the end-to-end run."""
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1',
            '-m', 'tkvision.cli.train', '--config', E2E_RECIPE, '--data-dir', folder, '--output', out,
            '--device', device.type, '--compile', str(compiled).lower(), '--epochs', str(epochs),
            '--warmup_epochs', '0.5', '--model_ema_decay', '0.99', '--progress', 'false',
            *(_E2E_TINY if tiny else _E2E), *(['--resume'] if resume else [])]


def _number(text: str):
    """A metrics.csv cell as the number it holds (an int for a whole number), else the text."""
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and text.lstrip('-').isdigit() else value


def end_to_end(device, work: str, tiny: bool, compiled: bool, data_dir=None, log=print) -> dict:
    """The trainer end to end: ``torchrun`` (one process) trains `E2E_RECIPE` (bf16, EMA,
    gradient accumulation over 2, ``compiled``) on a folder of Fashion-MNIST JPEGs written into ``work``
    (224 px, 500 training / 100 validation images per class; tiny: 32 px, 8 / 2; from ``data_dir`` or
    the Debian package) for one epoch, then ``--resume`` continues the same run to four epochs (tiny:
    two), validating every epoch.

    Returns:
        ``dict(command, legs=[{wall_s}], epochs=[metrics.csv rows])``: each epoch's row holds
        ``data_wait``, the share of its time the trainer waited for the loader (whether the loader
        keeps the GPU busy; the H200 run of 2026-11-27 predates it and sampled ``nvidia-smi``'s
        utilisation instead, which start-up and compiling dominated); or ``dict(skipped=reason)``
        without albumentations (the trainer's augmentations).

    Raises:
        subprocess.CalledProcessError: a leg failed (its output was printed).
    """
    if importlib.util.find_spec('albumentations') is None:
        return dict(skipped='albumentations is not installed: carry albumentations>=2.0.8 and its requirements '
                            '(see studies/performance/gpu_report.py)')
    folder, out = os.path.join(work, 'fashion_mnist_jpeg'), os.path.join(work, 'run')
    size, train, val = (32, 8, 2) if tiny else (224, 500, 100)
    write_image_folder(folder, size, train, val, data_dir=data_dir)
    legs = []
    for epochs, resume in ((1, False), (2 if tiny else 4, True)):
        cmd = _train_command(folder, out, device, tiny, compiled, epochs, resume)
        log(' '.join(cmd))
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        legs.append(dict(wall_s=time.perf_counter() - t0))
    with open(os.path.join(out, 'metrics.csv')) as f:
        rows = [{k: _number(v) for k, v in row.items() if v != ''} for row in csv.DictReader(f)]
    return dict(command=portable_command(cmd[2:]), legs=legs, epochs=rows)
