import os, sys, shutil, torch
sys.path.insert(0, '/tmp/before')
import tkvision
assert tkvision.__file__.startswith('/tmp/before'), tkvision.__file__
from tkvision.config import load_config
from tkvision.train import train
tiny = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1, num_heads=2, num_tokens=8)
common = dict(model='tokenformer_vit_ti16', model_kwargs=tiny, rrc_scale=None, epochs=2, batch_size=32, lr=2e-3,
              warmup_epochs=0.5, train_subset=128, val_subset=64, threads=1, progress=False, model_ema=True)
out = '/tmp/fixture'
cfg = load_config(None, dict(common, output=out + '/classify',
                             growth=dict(every_epochs=1, add_tokens=dict(qkv=4, ffn=8))))
train(cfg)
cfg = load_config(None, dict(common, task='mae', output=out + '/mae', mask_ratio=0.5, recon_images=0,
                             decoder=dict(embed_dim=16, depth=1, num_heads=2, num_tokens=8),
                             growth=dict(every_epochs=1, add_tokens=dict(qkv=4, decoder_ffn=8))))
train(cfg)
