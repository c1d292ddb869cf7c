"""``tools/train.py`` (``tkvision-train``) and ``tools/validate.py`` (``tkvision-validate``)."""
import argparse
import os
import sys
import time
from typing import Optional, Sequence, Tuple, Union

import torch.distributed as dist

from ..data import BatchPreprocessor, build_dataset, build_loader, dataset_classes, train_class_map
from ..engine.checkpoint import BEST_WEIGHTS, LAST_CHECKPOINT, LAST_WEIGHTS, checkpoint_config, model_for_checkpoint
from ..engine.config import DEFAULTS, load_config, parse_overrides, read_run_config, resolve_run_config
from ..engine.distributed import init_distributed, setup_threads
from ..engine.recipes import format_recipes, list_recipes
from ..engine.runlog import CONFIG_FILE, CURVES_FILE, METRICS_FILE, RECONSTRUCTION_FILE
from ..engine.tasks import EvalContext, RunFiles, task_named
from ..engine.trainer import check_model_input, train
from .common import run_cli

__all__ = ['parse_train_args', 'train_main', 'validate_main']


class _ListRecipes(argparse.Action):
    """``--list-recipes``: print the shipped recipes and exit, as ``--help`` does."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(format_recipes(list_recipes()))
        parser.exit()


def parse_train_args(argv: Optional[Sequence[str]] = None) -> Tuple[dict, Union[None, bool, str]]:
    """``--config``, ``--data-dir``, ``--resume [PATH]``, ``--list-recipes``; every other ``--key value``
    overrides the config. ``--resume`` without ``--config`` starts from the checkpoint's own config.

    Returns:
        ``(cfg, resume)``. Raises ConfigError: a bad key or value (named).
    """
    ap = argparse.ArgumentParser(
        description='Train a TokenFormer ViT (or any timm model).', allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='Every config key is also an option, over the recipe: --KEY VALUE, the value read as YAML; a dotted\n'
               'key reaches into a section. For example:\n'
               '  tkvision-train --config fashion_mnist/quick --epochs 10 --lr 1e-3 --output runs/mine\n'
               "  tkvision-train --config fashion_mnist/quick --model_kwargs '{num_tokens: 96}'\n"
               '  tkvision-train --config imagenet/tokenformer_vit_b16 --init_from mae/last.safetensors\n'
               'Every key, its default and its rule: docs/reference/config.md (the docs site\'s "Config keys").')
    ap.add_argument('--config',
                    help='YAML recipe: a file, or the name of a shipped recipe (imagenet/tokenformer_vit_b16)')
    ap.add_argument('--list-recipes', action=_ListRecipes, help='list the shipped recipes (name, what each reproduces, '
                    'its figures) and exit')
    ap.add_argument('--data-dir', help='dataset root (ImageNet folder with train/ and val/)')
    ap.add_argument('--resume', nargs='?', const=True, default=None,
                    help='continue from <output>/last.pth, or from PATH')
    args, rest = ap.parse_known_args(argv)
    if args.data_dir:
        rest += ['--data_dir', args.data_dir]
    base = None
    if args.resume and not args.config:  # continue the run as it was configured, not from the defaults
        path = args.resume if isinstance(args.resume, str) else os.path.join(
            parse_overrides(rest).get('output', DEFAULTS['output']), LAST_CHECKPOINT)
        if os.path.isfile(path):
            base = checkpoint_config(path)
    return load_config(args.config, rest, base=base), args.resume


def _done_message(res: dict, minutes: float) -> str:
    """The task's closing lines (``tkvision.engine.tasks.Task.done_message``) with the run folder's files."""
    out = res['output']
    files = RunFiles(best=os.path.join(out, BEST_WEIGHTS), last=os.path.join(out, LAST_WEIGHTS),
                     state=os.path.join(out, LAST_CHECKPOINT), curves=os.path.join(out, CURVES_FILE),
                     metrics=os.path.join(out, METRICS_FILE), reconstructions=os.path.join(out, RECONSTRUCTION_FILE))
    return task_named(res['task']).done_message(res, minutes, files)


def _train(argv) -> int:
    cfg, resume = parse_train_args(argv)
    t0 = time.perf_counter()
    res = train(cfg, resume=resume)  # Preempted: run_cli returns EXIT_PREEMPTED
    if (not dist.is_initialized() or dist.get_rank() == 0) and (res['top1'] is not None or res['val_loss'] is not None):
        print(_done_message(res, (time.perf_counter() - t0) / 60))
    return 0


def train_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-train`` / ``tools/train.py``: one line per user error (``--debug`` for the traceback);
    exit 0 when done, 2 on a bad setting, `EXIT_PREEMPTED` after a
    stop signal's checkpoint."""
    return run_cli(_train, argv)


def _validate(argv) -> int:
    ap = argparse.ArgumentParser(description='Evaluate a TokenFormer (or any timm) model on a val set.')
    ap.add_argument('--model', help='timm model name (default: the config\'s)')
    ap.add_argument('--checkpoint', required=True, help='.safetensors weights or a training .pth checkpoint')
    ap.add_argument('--config',
                    help="training config (data, img_size, mean/std, model_kwargs; default: a last.pth's own, or "
                         "the config.yaml of the weights' run folder)")
    ap.add_argument('--data-dir', help='ImageNet folder with val/, or Fashion-MNIST files')
    ap.add_argument('--no-ema', action='store_true', help='use the model weights, not EMA, of a .pth checkpoint')
    ap.add_argument('--split', choices=('val', 'test'), default='val',
                    help="'val': the validation split (carved from train when val_split_fraction > 0, as "
                         "Fashion-MNIST's and CIFAR-10's default); 'test': the dataset's own evaluation split in that "
                         'case')
    ap.add_argument('--out', metavar='FOLDER', help="write the task's report of the evaluation into FOLDER (a "
                    "classifier's per_class.csv, confusion_matrix.csv and confusion_matrix.png)")
    args, rest = ap.parse_known_args(argv)
    # a run folder's config.yaml reads as a checkpoint's: what it trained with that was since removed is done
    base_of_run = read_run_config(args.config) if args.config and os.path.basename(args.config) == CONFIG_FILE \
        else None
    overrides = list(rest) + (['--data_dir', args.data_dir] if args.data_dir else [])
    if args.model:
        overrides += ['--model', args.model]
    config = resolve_run_config(load_config(None if base_of_run else args.config, overrides,
                                            base=base_of_run or _run_config(args.checkpoint)))
    task = task_named(config.run.task)
    setup_threads(config.process)
    processes = init_distributed(config.process)
    rank, world, device, data, seed = processes.rank, processes.world, processes.device, config.data, config.run.seed
    ds = build_dataset(data, args.split, seed, rank, world, class_to_idx=train_class_map(data))
    # a run that grew during training: its config builds the model it started from, grown to the file's size
    model, grown = model_for_checkpoint(config.to_dict(), args.checkpoint, use_ema=not args.no_ema)
    check_model_input(model, config.model.model, data)
    if grown and not rank:
        print(f'grown to the checkpoint\'s size (old, new): {grown}')
    loader = build_loader(ds, data, train=False, seed=seed, rank=rank, world_size=world,
                          pin_memory=processes.plan.pin_memory)
    context = EvalContext(device, BatchPreprocessor(*data.mean_std(), device), processes.plan.autocast_dtype, seed)
    res = task.evaluate(model.to(device), loader, context)
    if rank:
        return 0
    print(task.validate_line(config.model.model, res, args.split) +
          (f"  (skipped {res['skipped']} unreadable images)" if res['skipped'] else ''))
    if args.out:
        classes = dataset_classes(ds) or train_class_map(data) or {}
        names = sorted(classes, key=lambda name: classes[name])
        task.report(res, names, lambda name: os.path.join(args.out, name), args.split)
        print(f'wrote the report of {args.split} into {args.out}')
    return 0


def _run_config(checkpoint: str) -> Optional[dict]:
    """The config of a weights file's run: a ``last.pth``'s own, or the ``config.yaml`` of the folder it lies in
    (as ``tkvision-train`` wrote it); None for a file outside a run folder."""
    if checkpoint.endswith('.pth'):
        return checkpoint_config(checkpoint)
    beside = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), CONFIG_FILE)
    return read_run_config(beside) if os.path.isfile(beside) else None


def validate_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-validate`` / ``tools/validate.py``: evaluate a weights file; see ``--help``. A user
    error (missing file, weights that do not fit, bad setting) is one line on stderr, exit 2."""
    return run_cli(_validate, argv)


if __name__ == '__main__':  # torchrun -m tkvision.cli.train (the GPU report's end-to-end run, studies/performance)
    sys.exit(train_main())
