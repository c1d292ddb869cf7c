"""Tools that read a trained model's weights: ``tools/grow.py`` (``tkvision-grow``), ``tools/export.py``
(``tkvision-export``) and ``tools/mae_visualize.py`` (``tkvision-mae-visualize``). Each loads the
weights through [`tkvision.engine.checkpoint.model_for_checkpoint`][tkvision.engine.checkpoint.model_for_checkpoint],
so a run that grew during training loads at its grown size."""
import argparse
from typing import Optional, Sequence

from ..data import build_dataset
from ..engine.checkpoint import checkpoint_config, grow_weights_file, model_for_checkpoint
from ..engine.config import load_config
from ..engine.distributed import setup_threads
from ..engine.tasks import task_named
from ..engine.export import export_checkpoint
from ..engine.reconstruction import save_reconstructions
from ..engine.config import resolve_run_config
from ..layers import ENCODER_KINDS
from .common import non_negative_int, positive_int, run_cli, yaml_mapping

__all__ = ['grow_main', 'export_main', 'mae_visualize_main']


def _grow(argv) -> int:
    ap = argparse.ArgumentParser(description='Grow a TokenFormer checkpoint by appending parameter tokens.')
    ap.add_argument('--checkpoint', required=True, help='.safetensors or .pth of the small model')
    ap.add_argument('--model', required=True,
                    help='registered variant of the checkpoint, e.g. tokenformer_vit_b16_matched')
    ap.add_argument('--to', help='target variant whose token counts to grow to, e.g. tokenformer_vit_b16')
    for kind in ENCODER_KINDS:
        ap.add_argument(f'--add-{kind}', type=non_negative_int, default=0,
                        help=f'tokens to append to every {kind} Pattention')
    ap.add_argument('--key-init', default='zeros', choices=['zeros', 'normal'])
    ap.add_argument('--value-init', default='normal', choices=['zeros', 'normal'])
    ap.add_argument('--model-kwargs', type=yaml_mapping, default={},
                    help="YAML mapping, e.g. '{img_size: 28, in_chans: 1}'")
    ap.add_argument('--out', required=True, help='output .safetensors')
    args = ap.parse_args(argv)
    add = {k: getattr(args, f'add_{k}') for k in ENCODER_KINDS}
    if args.to is None and not any(add.values()):
        ap.error('give --to VARIANT or at least one --add-<kind> N')
    if args.to is not None and any(add.values()):
        ap.error('give either --to VARIANT or --add-<kind> N, not both (--to sets every count)')
    cfg = load_config(None, dict(model=args.model, model_kwargs=args.model_kwargs))
    report = grow_weights_file(args.checkpoint, cfg, args.out, to=args.to, add=add, key_init=args.key_init,
                               value_init=args.value_init)
    for kind, (old, new) in report.items():
        print(f'{kind:6s} {old:6d} -> {new:6d} tokens')
    print(f'wrote {args.out}')
    return 0


def grow_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-grow`` / ``tools/grow.py``: grow a weights file; see ``--help``. Refuses to write over
    its input and to take ``--to`` together with ``--add-<kind>``; user errors are one line (exit 2)."""
    return run_cli(_grow, argv)


def _export(argv) -> int:
    ap = argparse.ArgumentParser(description="Export a trained model as a timm 'local-dir:' / hub folder.")
    ap.add_argument('--checkpoint', required=True, help='training checkpoint (last.pth) or .safetensors weights')
    ap.add_argument('--out', required=True, help='new folder: model.safetensors + config.json')
    ap.add_argument('--no-ema', action='store_true', help='export the raw weights of a .pth, not its EMA')
    ap.add_argument('--model', help='architecture (needed for .safetensors)')
    ap.add_argument('--model-kwargs', type=yaml_mapping, default={},
                    help="YAML mapping, e.g. '{img_size: 28, in_chans: 1}'")
    ap.add_argument('--force', action='store_true',
                    help='replace an earlier export in --out (never a run, nor any file an export did not write)')
    a = ap.parse_args(argv)
    res = export_checkpoint(a.checkpoint, a.out, use_ema=not a.no_ema, model=a.model,
                            model_kwargs=a.model_kwargs, force=a.force)
    print(f"exported the {res['source']} weights of a task {res['task']} run ({res['token_counts']}) to {res['out']}: "
          f"timm.create_model('local-dir:{res['out']}', pretrained=True) after import tkvision")
    return 0


def export_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-export`` / ``tools/export.py``: see ``--help``; user errors are one line (exit 2)."""
    return run_cli(_export, argv)


def _mae_visualize(argv) -> int:
    ap = argparse.ArgumentParser(description='Reconstructions of an MAE checkpoint on validation images.')
    ap.add_argument('--checkpoint', required=True, help='last.pth of a task: mae run, or .safetensors with --config')
    ap.add_argument('--config', help='the run\'s config (needed for a .safetensors file)')
    ap.add_argument('--data-dir', help='dataset root, if not the config\'s')
    ap.add_argument('--num-images', type=positive_int, default=8)
    ap.add_argument('--mask-ratio', type=float, help='default: the config\'s')
    ap.add_argument('--out', required=True, help='output PNG')
    args = ap.parse_args(argv)
    overrides = {'data_dir': args.data_dir} if args.data_dir else {}
    if args.mask_ratio is not None:
        overrides['mask_ratio'] = args.mask_ratio
    if args.checkpoint.endswith('.pth') and not args.config:
        cfg = load_config(None, overrides, base=checkpoint_config(args.checkpoint))
    elif not args.config:
        ap.error('a .safetensors checkpoint needs --config (the run\'s config.yaml)')
    else:
        cfg = load_config(args.config, overrides)
    task_named(cfg['task']).check_reconstructions(args.checkpoint)
    config = resolve_run_config(cfg)
    setup_threads(config.process)
    model, _ = model_for_checkpoint(config.to_dict(), args.checkpoint)  # the EMA weights of a last.pth that has them
    data, mask_ratio = config.data, config.mae.mask_ratio
    dataset = build_dataset(data, 'val', config.run.seed)
    save_reconstructions(model, dataset, *data.mean_std(), args.out, args.num_images, mask_ratio)
    print(f'wrote {args.out} ({args.num_images} validation images, mask ratio {mask_ratio})')
    return 0


def mae_visualize_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tools/mae_visualize.py`` / ``tkvision-mae-visualize``: see ``--help``; user errors are one line, exit 2."""
    return run_cli(_mae_visualize, argv)
