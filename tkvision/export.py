"""Share a trained model as timm users do: timm's ``save_for_hf`` folder, loadable with
``timm.create_model('local-dir:PATH', pretrained=True)`` (after ``import tkvision``) or pushed to a hub.

The folder holds ``model.safetensors`` and ``config.json`` (``architecture``, ``num_classes``,
``pretrained_cfg`` and ``model_args``). ``model_args`` carries the model's current token counts
(``num_tokens_patch / _qkv / _proj / _ffn``), so a model grown during or after training is rebuilt
at its grown size; each Pattention's τ, fixed at its first size (Appendix B), comes back from the
weights.
"""
import argparse
import os

import timm
import torch

from . import growth
from .checkpoint import adapt_state_dict, check_fit, load_state, load_state_dict_file

__all__ = ['export_model', 'export_checkpoint', 'main']


def export_model(model: torch.nn.Module, out: str, model_args: dict = None, data_config: dict = None) -> str:
    """Write ``model`` to ``out`` with timm's ``save_for_hf`` (safetensors); returns ``out``.

    Args:
        model_args: construction kwargs to record besides timm's own (TokenFormer token counts are
            added here). data_config: preprocessing to record (``mean``, ``std``, ``crop_pct``, ...).

    Raises:
        FileExistsError: ``out`` already holds a ``config.json``.
    """
    if os.path.exists(os.path.join(out, 'config.json')):
        raise FileExistsError(f'{out} already holds an exported model; export to another folder')
    args = dict(model_args or {})
    try:
        args.update({f'num_tokens_{kind}': n for kind, n in growth.token_counts(model).items()})
    except ValueError:  # not a model with uniform token counts per kind (or no Pattention at all)
        pass
    timm.models.save_for_hf(model, out, model_args=args, safe_serialization=True, data_config=data_config)
    return out


def export_checkpoint(checkpoint: str, out: str, use_ema: bool = True, model: str = None, model_kwargs=None) -> dict:
    """Export a training checkpoint (``last.pth``: its config names the model) or a weights file
    (``.safetensors``, with ``model`` and ``model_kwargs``) as a ``save_for_hf`` folder.

    Args:
        use_ema: take the EMA weights of a ``.pth`` that has them (else the raw ones).

    Returns:
        ``dict(out, source, token_counts)``, ``source`` being ``'ema'`` or ``'model'``.

    Raises:
        FileNotFoundError: no checkpoint. ValueError: a weights file without ``model``.
        WeightsMismatchError: weights that do not fit the model (listed).
    """
    from .runtime import build_model
    kwargs = dict(model_kwargs or {})
    data_config = None
    if checkpoint.endswith('.pth'):
        state = load_state(checkpoint)
        cfg = state['config']
        model = model or cfg['model']
        kwargs = {**cfg['model_kwargs'], **kwargs}
        net = build_model(dict(cfg, model=model, model_kwargs=kwargs, drop_path_rate=0.0))
        source = 'ema' if use_ema and state.get('model_ema') else 'model'
        weights = state['model_ema' if source == 'ema' else 'model']
        counts = state.get('token_counts')
        data_config = {k: cfg[k] for k in ('mean', 'std', 'crop_pct', 'interpolation') if cfg.get(k) is not None}
    else:
        if not model:
            raise ValueError('a weights file needs --model (and --model-kwargs for a non-default shape)')
        net, source, counts = timm.create_model(model, **kwargs), 'model', None
        weights = load_state_dict_file(checkpoint)
    if counts and counts != growth.token_counts(net):
        growth.grow(net, to=counts)
    weights = adapt_state_dict(net, weights)
    check_fit(net, weights, checkpoint)
    net.load_state_dict(weights)
    export_model(net.eval(), out, model_args={k: v for k, v in kwargs.items() if k != 'pretrained_cfg_overlay'},
                 data_config=data_config)
    return dict(out=out, source=source, token_counts=growth.token_counts(net))


def main(argv=None) -> int:
    """``tkvision-export`` / ``tools/export.py``: see ``--help``."""
    from .runtime import cli

    def run(args):
        import yaml
        ap = argparse.ArgumentParser(description="Export a trained model as a timm 'local-dir:' / hub folder.")
        ap.add_argument('--checkpoint', required=True, help='training checkpoint (last.pth) or .safetensors weights')
        ap.add_argument('--out', required=True, help='new folder: model.safetensors + config.json')
        ap.add_argument('--no-ema', action='store_true', help='export the raw weights of a .pth, not its EMA')
        ap.add_argument('--model', help='architecture (needed for .safetensors)')
        ap.add_argument('--model-kwargs', default='{}', help="YAML mapping, e.g. '{img_size: 28, in_chans: 1}'")
        a = ap.parse_args(args)
        res = export_checkpoint(a.checkpoint, a.out, use_ema=not a.no_ema, model=a.model,
                                model_kwargs=yaml.safe_load(a.model_kwargs))
        print(f"exported the {res['source']} weights ({res['token_counts']}) to {res['out']}: "
              f"timm.create_model('local-dir:{res['out']}', pretrained=True) after import tkvision")
        return 0
    return cli(run, argv)
