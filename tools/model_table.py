#!/usr/bin/env python
"""Write the models' sizes, parameter counts and the ImageNet growth chains' compute; ``--check`` fails on a stale file.

``python tools/model_table.py`` builds every model below on the meta device (no memory, seconds) and
writes ``docs/models.csv`` (width, depth, heads, parameter-token counts, trainable parameters, beside
the paper's printed figure and the timm ViT it is compared with) and ``docs/growth/imagenet_chains.csv``
(each ImageNet growth config's stages and its training compute as a fraction of its largest model
trained from scratch for the same epochs, from training FLOPs per image counted by
``torch.utils.flop_counter`` on one 224-px image, forward + backward). The README's and docs' tables are
rendered from them (``tools/render_docs.py``). ``--check`` (``tests/test_docs.py``, in CI) changes nothing
and exits 1 when a figure in either file is not what the code builds today.

Paper figures: TokenFormer Table 2 (https://arxiv.org/abs/2410.23168; params in millions, ImageNet top-1 in
parentheses), RingFormer Tables 2-3.
"""
import argparse
import csv
import io
import os
import sys

import timm
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkvision  # noqa: E402,F401  (registers the models)
from tkvision.engine.config import load_config  # noqa: E402
from tkvision.experiments.benchmark import flop_counter  # noqa: E402
from tkvision.layers import Pattention  # noqa: E402
from render_docs import write_generated  # noqa: E402

OUT = os.path.join(ROOT, 'docs', 'models.csv')
CHAINS_OUT = os.path.join(ROOT, 'docs', 'growth', 'imagenet_chains.csv')
CHAIN_CONFIGS = ('configs/imagenet/growth_tokenformer_vit_b16_matched_to_b16.yaml',
                 'configs/imagenet/growth_tokenformer_vit_l16_matched_to_l16.yaml')
# (family, model, paper's printed figure, timm model it is compared with)
MODELS = (
    ('tokenformer', 'tokenformer_vit_ti16', '', 'vit_tiny_patch16_224'),
    ('tokenformer', 'tokenformer_vit_s16', '', 'vit_small_patch16_224'),
    ('tokenformer', 'tokenformer_vit_b16', '109M (82.5%)', 'vit_base_patch16_224'),
    ('tokenformer', 'tokenformer_vit_b16_matched', '86M (82.1%)', 'vit_base_patch16_224'),
    ('tokenformer', 'tokenformer_vit_l16', '407M (83.1%)', 'vit_large_patch16_224'),
    ('tokenformer', 'tokenformer_vit_l16_matched', '307M (83.0%)', 'vit_large_patch16_224'),
    ('recurrent', 'ringformer_vit_small_patch16_224', '4.4M (Table 2)', ''),
    ('recurrent', 'ringformer_vit_base_patch16_224', '12.02M (Table 3)', ''),
    ('recurrent', 'ringformer_vit_base_wide_patch16_224', '31.95M (Table 3, RingFormer^s)', ''),
    ('recurrent', 'tokenformer_ring_vit_small_patch16_224', '', ''),
    ('recurrent', 'tokenformer_ring_vit_base_patch16_224', '', ''),
    ('recurrent', 'tokenformer_ring_vit_base_wide_patch16_224', '', ''),
)

def trainable_millions(model: torch.nn.Module) -> float:
    """Trainable parameters in millions (frozen buffers and frozen sin-cos tables excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6


def describe(family: str, name: str, paper: str, baseline: str) -> dict:
    """One row of the table for timm model ``name``, built on the meta device."""
    with torch.device('meta'):
        model = timm.create_model(name)
    tokens = {}
    for module in model.modules():
        if isinstance(module, Pattention):
            tokens.setdefault(module.kind, module.num_tokens)
    heads = next(m.num_heads for m in model.modules() if hasattr(m, 'num_heads') and m is not model)
    fc1 = next((m.fc1 for m in model.modules() if hasattr(m, 'fc1')), None)
    row = dict(family=family, model=name, num_classes=model.num_classes, embed_dim=model.embed_dim,
               depth=len(model.blocks), num_heads=heads, qkv_tokens=tokens.get('qkv', ''),
               ffn_tokens=tokens.get('ffn', ''), ffn_hidden=fc1.out_features if fc1 is not None else '',
               params_m=f'{trainable_millions(model):.2f}', paper=paper, timm_model=baseline,
               timm_params_m='', ratio_to_timm='')
    if baseline:
        with torch.device('meta'):
            reference = trainable_millions(timm.create_model(baseline))
        row.update(timm_params_m=f'{reference:.2f}', ratio_to_timm=f'{trainable_millions(model) / reference:.3f}')
    return row


def train_gflops_per_image(name: str, img_size: int = 224) -> float:
    """Forward + backward GFLOPs of one training image (2 FLOPs per multiply-add), counted on meta."""
    with torch.device('meta'):
        model = timm.create_model(name)
        with flop_counter() as counter:
            logits = model(torch.randn(1, 3, img_size, img_size))
            F.cross_entropy(logits, torch.zeros(1, dtype=torch.long)).backward()
    return counter.get_total_flops() / 1e9


def chain_row(config: str) -> dict:
    """One growth config: its stages (model and epochs) and compute against its last model from scratch."""
    cfg = load_config(os.path.join(ROOT, config))
    models, starts = [cfg['model']], [0]
    for step in cfg['growth']['schedule']:
        models.append(step['to'])
        starts.append(step['at_epoch'])
    epochs = [b - a for a, b in zip(starts, starts[1:] + [cfg['epochs']])]
    flops = [train_gflops_per_image(m, cfg['img_size']) for m in models]
    fraction = sum(e * f for e, f in zip(epochs, flops)) / (cfg['epochs'] * flops[-1])
    return dict(config=config, chain=' → '.join(f'{m} {e} epochs' for m, e in zip(models, epochs)),
                gflops_per_image=' / '.join(f'{f:.1f}' for f in flops), fraction_of_scratch=f'{fraction:.3f}')


def _csv(rows: list) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def tables() -> dict:
    """``{path: CSV text}`` of ``docs/models.csv`` (every model in ``MODELS``) and the chains' file."""
    return {OUT: _csv([describe(*spec) for spec in MODELS]), CHAINS_OUT: _csv([chain_row(c) for c in CHAIN_CONFIGS])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--check', action='store_true', help='change nothing; exit 1 if a file is stale')
    args = ap.parse_args(argv)
    return write_generated(tables(), args.check, 'python tools/model_table.py')


if __name__ == '__main__':
    from tkvision.cli import run_cli  # the rule every command shares: a user error is one line, exit 2
    sys.exit(run_cli(main))
