"""How the files beside this script were written, with the code of commit e4849f2 (before the package
was reorganised into rooms):

    git worktree add /tmp/before e4849f2
    PYTHONPATH=/tmp/before python tests/data/legacy_e4849f2/make_fixture.py /tmp/fixture

then ``classify/last.pth``, ``classify/last.safetensors``, ``mae/last.pth``, ``mae/last.safetensors`` and
``expected.safetensors`` were copied here as ``classify_last.pth`` etc. Both runs grow during training
(``growth.every_epochs: 1``) and keep an EMA, so loading them exercises migration and growth.
"""
import os
import sys

import torch
from safetensors.torch import save_file

import tkvision  # noqa: F401  (the old package, from PYTHONPATH)
from tkvision import growth
from tkvision.config import load_config
from tkvision.data import load_fashion_mnist
from tkvision.runtime import build_model
from tkvision.checkpoint import load_state
from tkvision.train import train

out = sys.argv[1]
tiny = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1, num_heads=2, num_tokens=8)
common = dict(model='tokenformer_vit_ti16', model_kwargs=tiny, rrc_scale=None, epochs=2, batch_size=32, lr=2e-3,
              warmup_epochs=0.5, train_subset=128, val_subset=64, threads=1, progress=False, model_ema=True)
train(load_config(None, dict(common, output=out + '/classify',
                             growth=dict(every_epochs=1, add_tokens=dict(qkv=4, ffn=8)))))
train(load_config(None, dict(common, task='mae', output=out + '/mae', mask_ratio=0.5, recon_images=0,
                             decoder=dict(embed_dim=16, depth=1, num_heads=2, num_tokens=8),
                             growth=dict(every_epochs=1, add_tokens=dict(qkv=4, decoder_ffn=8)))))

# the outputs the old code computes from the EMA weights: logits, and MAE predictions with fixed noise
images, _ = load_fashion_mnist('test')
x = (torch.from_numpy(images[:4]).float()[:, None] - 0.2860 * 255) / (0.3530 * 255)
expected = dict(images=x)
for task in ('classify', 'mae'):
    ckpt = load_state(os.path.join(out, task, 'last.pth'))
    model = build_model(ckpt['config'])
    growth.grow(model, to=ckpt['token_counts'])
    model.load_state_dict(ckpt['model_ema'])
    with torch.no_grad():
        if task == 'classify':
            expected['classify_logits'] = model.eval()(x)
        else:
            noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(0))
            expected['mae_pred'] = model.eval()(x, None, noise)[1]
save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(out, 'expected.safetensors'))
