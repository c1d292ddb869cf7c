"""MAE pretraining and fine-tuning: masking, the loss against a direct computation, exact
encoder transfer, exact resume, growth exactness under MAE, linear probing, the reconstruction tool."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import timm
from tkvision.layers import PATTENTION_KINDS
import torch
from PIL import Image
from safetensors.torch import load_file

from tkvision import growth
from tkvision.engine import clock as clock_mod, trainer as train_mod
from tkvision.engine.config import ConfigError, load_config
from tkvision.engine.evaluate import mask_noise
from tkvision.models.mae import (create_mae, encoder_weights, linear_probe, patchify, random_masking,
                                 unpatchify)

from .helpers import ROOT, TINY_FMNIST, assert_same_training_state, dataset_of, fmnist_cfg

#: 7 x 7 = 49 patches of 4 px on 28 px images.
ENC = dict(TINY_FMNIST, patch_size=4)
DEC = dict(embed_dim=32, depth=1, num_heads=2)


def _mae(encoder='tokenformer_vit_ti16', **kw):
    torch.manual_seed(0)
    enc = dict(ENC) if encoder.startswith('tokenformer') else dict(img_size=28, patch_size=4, in_chans=1,
                                                                    embed_dim=32, depth=2, num_heads=2)
    enc.update(kw)
    return create_mae(encoder, decoder=DEC, **enc).eval()


@pytest.mark.parametrize('ratio', [0.0, 0.5, 0.75, 0.9])
def test_masking_keeps_round_n_patches_per_sample_and_restores_order(ratio):
    torch.manual_seed(1)
    B, N, D = 5, 49, 3
    x = torch.randn(B, N, D)
    visible, mask, ids_restore = random_masking(x, ratio)
    keep = round(N * (1 - ratio))
    assert visible.shape == (B, keep, D)
    assert torch.equal(mask.sum(1), torch.full((B,), float(N - keep)))
    for b in range(B):  # the visible tokens are exactly the unmasked patches, each once
        kept = torch.nonzero(mask[b] == 0).flatten()
        assert sorted(visible[b, :, 0].tolist()) == sorted(x[b, kept, 0].tolist())
    # appending the masked tokens and gathering with ids_restore gives back the patch order
    shuffled = torch.cat([visible, torch.full((B, N - keep, D), float('nan'))], dim=1)
    restored = torch.gather(shuffled, 1, ids_restore.unsqueeze(-1).expand(-1, -1, D))
    assert torch.equal(restored[mask == 0], x[mask == 0])
    assert torch.isnan(restored[mask == 1]).all()
    assert not torch.equal(mask[0], mask[1]) or ratio == 0  # per-sample masks
    with pytest.raises(ValueError, match='mask_ratio'):
        random_masking(x, 1.0)


def test_patchify_is_inverted_by_unpatchify_and_orders_patches_in_raster_order():
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float).view(2, 3, 8, 12)
    p = patchify(x, 4)
    assert p.shape == (2, 6, 48)
    assert torch.equal(unpatchify(p, 4, (2, 3), 3), x)
    assert torch.equal(p[1, 4].view(4, 4, 3), x[1, :, 4:8, 4:8].permute(1, 2, 0))  # patch (row 1, col 1)


@pytest.mark.parametrize('norm_pix_loss', [True, False])
def test_loss_is_the_mse_on_masked_patches_only(norm_pix_loss):
    model = _mae(norm_pix_loss=norm_pix_loss)
    x = torch.randn(3, 1, 28, 28)
    noise = mask_noise(0, 3, 49)
    loss, pred, mask = model(x, 0.75, noise)
    # direct computation, patch by patch, in float64
    total, count = 0.0, 0
    for b in range(3):
        for n in range(49):
            r, c = divmod(n, 7)
            target = x[b, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4].double().flatten()
            if norm_pix_loss:
                target = (target - target.mean()) / (target.var(unbiased=True) + 1e-6).sqrt()
            if mask[b, n]:
                total += ((pred[b, n].double() - target) ** 2).mean().item()
                count += 1
    assert count == 3 * 37
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
    # visible patches do not count: changing their prediction target leaves the loss unchanged
    x2 = x.clone()
    b, n = torch.nonzero(mask == 0)[0].tolist()
    r, c = divmod(n, 7)
    model2 = _mae(norm_pix_loss=norm_pix_loss)
    assert model2.forward_loss(x2, pred, mask) == loss
    x2[b, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 5.0
    assert model2.forward_loss(x2, pred, mask).item() == pytest.approx(loss.item(), rel=1e-6)


def load_encoder(model, state_dict):
    """What ``init_from`` an MAE checkpoint does (tkvision.engine.checkpoint.load_init_weights), in memory."""
    encoder = encoder_weights(model, state_dict)
    return dict(encoder, grown=growth.load_grown_state_dict(model, encoder['weights']))


def _unshuffled_encoder(model, x):
    latent, mask, ids_restore = model.forward_encoder(x, 0.0, mask_noise(0, len(x), 49))
    P = model.encoder.num_prefix_tokens
    patches = torch.gather(latent[:, P:], 1, ids_restore.unsqueeze(-1).expand(-1, -1, latent.shape[-1]))
    return torch.cat([latent[:, :P], patches], dim=1)


@pytest.mark.parametrize('encoder', ['tokenformer_vit_ti16', 'vit_tiny_patch16_224', 'tokenformer_ring_vit_small_patch16_224'])
def test_finetune_model_takes_the_encoder_exactly(encoder):
    mae = _mae(encoder)
    for p in mae.parameters():  # make every tensor non-trivial
        p.data.add_(0.01 * torch.randn_like(p))
    weights = mae.state_dict()
    kwargs = dict(ENC) if encoder.startswith('tokenformer') else dict(img_size=28, patch_size=4, in_chans=1,
                                                                       embed_dim=32, depth=2, num_heads=2)
    clf = timm.create_model(encoder, num_classes=10, **kwargs).eval()
    report = load_encoder(clf, weights)
    assert all(k.startswith('decoder.') for k in report['dropped'])
    assert report['kept_init'] == ['head.bias', 'head.weight']
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(clf.forward_features(x), _unshuffled_encoder(mae, x), atol=1e-6)


def test_finetune_with_avg_pool_drops_the_norm_resamples_pos_embed_and_grows_tokens():
    mae = _mae()
    weights = mae.state_dict()
    clf = timm.create_model('tokenformer_vit_ti16', num_classes=10, global_pool='avg',
                            **dict(ENC, img_size=32, num_tokens=24)).eval()  # 8x8 grid, more tokens
    report = load_encoder(clf, weights)
    assert {'encoder.norm.weight', 'encoder.norm.bias'} <= set(report['dropped'])  # fc_norm replaces it
    assert set(report['kept_init']) == {'head.weight', 'head.bias', 'fc_norm.weight', 'fc_norm.bias'}
    assert report['grown']['blocks.0.attn.q.key_param_tokens'] == (16, 24)
    assert torch.equal(clf.blocks[0].attn.q.keys[:16], mae.encoder.blocks[0].attn.q.keys)
    expect = timm.layers.resample_abs_pos_embed(mae.encoder.pos_embed.detach(), new_size=[8, 8], num_prefix_tokens=1)
    assert torch.allclose(clf.pos_embed, expect)
    with pytest.raises(ValueError, match='not an MAE checkpoint'):
        load_encoder(clf, clf.state_dict())


def test_growth_with_zero_keys_leaves_the_mae_loss_unchanged():
    model = _mae()
    x = torch.randn(4, 1, 28, 28)
    noise = mask_noise(3, 4, 49)
    with torch.no_grad():
        before = model(x, 0.75, noise)
    counts = growth.token_counts(model)
    assert set(counts) == set(PATTENTION_KINDS)
    growth.grow(model, qkv=8, ffn=16, patch=4, decoder_qkv=8, decoder_ffn=8, decoder_embed=4, decoder_pred=4)
    after_counts = growth.token_counts(model)
    assert after_counts['qkv'] == counts['qkv'] + 8 and after_counts['decoder_qkv'] == counts['decoder_qkv'] + 8
    assert after_counts['proj'] == counts['proj'] and after_counts['decoder_proj'] == counts['decoder_proj']
    with torch.no_grad():
        after = model(x, 0.75, noise)
    assert abs(after[0].item() - before[0].item()) < 1e-6
    assert torch.allclose(after[1], before[1], atol=1e-6)
    with pytest.raises(ValueError, match='unknown token kinds'):
        growth.grow(model, decoder_mlp=3)


def _stop_at(monkeypatch, update):
    """Make the run receive SIGTERM (as the trainer records it) right after optimizer update ``update``."""
    real = clock_mod.RunClock.check

    def check(clock, state, force=False):
        if state.num_updates == update and not force:
            clock.stop_signal = 'SIGTERM'
        return real(clock, state, force)
    monkeypatch.setattr(clock_mod.RunClock, 'check', check)


def test_mae_run_with_growth_resumes_bit_identical_and_finetunes(tmp_path, monkeypatch, capsys):
    """MAE pretraining that grows encoder and decoder tokens after epoch 1, stopped mid-epoch 2 and
    resumed, ends with the weights of an uninterrupted run; its encoder then fine-tunes."""
    common = dict(task='mae', model_kwargs=ENC, decoder=DEC, epochs=2, train_subset=512, val_subset=128,
                  reprob=0.0, drop_path_rate=0.1, growth=dict(every_epochs=1, add_tokens=dict(qkv=4, decoder_ffn=8)))
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **common))
    assert full['top1'] is None and full['val_loss'] < 1.2
    with monkeypatch.context() as m:
        _stop_at(m, 8 + 3)  # 8 updates per epoch: mid-epoch 2, after the growth step
        with pytest.raises(train_mod.Preempted):
            train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'broken'), **common))
    train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'broken'), **common), resume=True)
    a, b = load_file(str(tmp_path / 'full' / 'last.safetensors')), load_file(str(tmp_path / 'broken' / 'last.safetensors'))
    assert a['encoder.blocks.0.attn.q.key_param_tokens'].shape[0] == ENC['num_tokens'] + 4
    assert a['decoder.blocks.0.ffn.key_param_tokens'].shape[0] == 4 * DEC['embed_dim'] + 8
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    picture = Image.open(tmp_path / 'full' / 'reconstruction.png')
    assert picture.size == (4 * 28 * 4, 8 * 28 * 4)  # 4 columns, 8 images, enlarged 4x

    capsys.readouterr()
    ft = fmnist_cfg(tmp_path, output=str(tmp_path / 'ft'), model_kwargs=dict(ENC, num_tokens=ENC['num_tokens'] + 4),
                    epochs=1, train_subset=256, val_subset=128, init_from=str(tmp_path / 'full' / 'last.safetensors'))
    res = train_mod.train(ft)
    out = capsys.readouterr().out
    assert 'MAE encoder from' in out and 'decoder.*' in out, out
    assert res['top1'] is not None


def test_linear_probe_trains_only_the_batchnorm_linear_head(tmp_path):
    mae = _mae()
    path = str(tmp_path / 'mae.safetensors')
    from tkvision.engine.checkpoint import save_weights
    save_weights(mae.state_dict(), path)
    cfg = fmnist_cfg(tmp_path, task='linprobe', model_kwargs=ENC, init_from=path, epochs=1, train_subset=256,
                     val_subset=64, opt='lars', lr=0.1, weight_decay=0.0, warmup_epochs=0.5)
    res = train_mod.train(cfg)
    model = res['model']
    bn, fc = model.head
    assert isinstance(bn, torch.nn.BatchNorm1d) and bn.weight is None and bn.running_mean.abs().sum() > 0
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {'head.1.weight', 'head.1.bias'}
    enc = {k[len('encoder.'):]: v for k, v in mae.state_dict().items() if k.startswith('encoder.')}
    for k, v in model.state_dict().items():
        if k in enc:
            assert torch.equal(v, enc[k]), k
    with pytest.raises(ValueError, match='Linear head'):
        linear_probe(torch.nn.Module())


def test_mae_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match='linprobe needs init_from'):
        load_config(None, dict(task='linprobe'))
    with pytest.raises(ConfigError, match="unknown config key 'width'"):
        load_config(None, dict(decoder=dict(width=3)))
    with pytest.raises(ConfigError, match='mask_ratio'):
        load_config(None, dict(mask_ratio=1.0))
    with pytest.raises(ConfigError, match='decoder.embed_dim 30 must be divisible'):
        load_config(None, dict(decoder=dict(embed_dim=30, num_heads=4)))
    with pytest.raises(ConfigError, match="unknown token kind 'decoder_mlp'"):
        load_config(None, dict(growth=dict(add_tokens=dict(decoder_mlp=2))))


@pytest.mark.slow
def test_visualize_tool_writes_the_grid_and_pastes_visible_patches(tmp_path):
    from tkvision.engine.reconstruction import reconstruct
    model = _mae()
    x = torch.randn(2, 1, 28, 28)
    masked, recon, pasted = reconstruct(model, x)
    _, _, mask = model(x, None, mask_noise(0, 2, 49))
    m = unpatchify(mask.unsqueeze(-1).expand(-1, -1, 16), 4, (7, 7), 1).bool()
    assert torch.equal(pasted[~m], x[~m]) and torch.equal(pasted[m], recon[m]) and (masked[m] == 0).all()

    cfg = fmnist_cfg(tmp_path, task='mae', model_kwargs=ENC, decoder=DEC, epochs=1, train_subset=128, val_subset=64,
                     recon_images=0)
    train_mod.train(cfg)
    out = str(tmp_path / 'recon.png')
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'tools/mae_visualize.py'), '--checkpoint',
                        os.path.join(cfg['output'], 'last.pth'), '--num-images', '3', '--out', out],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(cfg['output'], 'reconstruction.png'))  # recon_images: 0
    img = np.asarray(Image.open(out))
    assert img.shape == (3 * 28 * 4, 4 * 28 * 4, 3)
    # column 1 (the original) is the first validation images, un-normalised
    ds = dataset_of(cfg, 'val')
    first = np.asarray(ds[0][0])[0]
    assert np.abs(img[:28 * 4:4, :28 * 4:4, 0].astype(int) - first.astype(int)).max() <= 1
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'tools/mae_visualize.py'), '--checkpoint',
                        os.path.join(cfg['output'], 'last.safetensors'), '--out', out], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and 'needs --config' in r.stderr


_KILL_AFTER_GROWTH = '''
import json, os, signal, sys
from tkvision.engine import clock, trainer
from tkvision.engine.config import load_config
real = clock.save_training_checkpoint

def save(state, path):  # the first checkpoint written mid-epoch 2, after the growth step: then SIGKILL
    real(state, path)
    if state['epochs_done'] == 1 and state['batches_done'] > 0:
        os.kill(os.getpid(), signal.SIGKILL)

clock.save_training_checkpoint = save
trainer.train(load_config(None, json.loads(sys.argv[1])))
'''


@pytest.mark.slow
def test_mae_killed_by_sigkill_after_a_decoder_growth_step_resumes_bit_identical(tmp_path):
    """An MAE run growing its encoder and decoder after epoch 1, killed with SIGKILL (no
    handler runs, the lock file stays) just after a mid-epoch-2 checkpoint, resumes to the state of an
    uninterrupted run: model, EMA, optimizer, counters and grown sizes bit-identical."""
    common = dict(task='mae', model_kwargs=ENC, decoder=DEC, epochs=2, train_subset=512, val_subset=128, reprob=0.0,
                  model_ema=True, model_ema_decay=0.9, checkpoint_every_steps=3, threads=1, progress=False,
                  rrc_scale=None, batch_size=64, growth=dict(every_epochs=1, add_tokens=dict(qkv=4, decoder_ffn=8)))
    full = train_mod.train(load_config(None, dict(common, output=str(tmp_path / 'full'))))
    killed = dict(common, output=str(tmp_path / 'killed'))
    child = subprocess.run([sys.executable, '-c', _KILL_AFTER_GROWTH, json.dumps(killed)], cwd=ROOT,
                           capture_output=True, text=True)
    assert child.returncode == -9, child.stderr[-2000:]
    from tkvision.engine.checkpoint import load_training_checkpoint
    at_kill = load_training_checkpoint(str(tmp_path / 'killed' / 'last.pth'))
    assert at_kill['epochs_done'] == 1 and at_kill['batches_done'] > 0
    assert at_kill['token_counts'] == growth.model_size(full['model'])  # grown before the kill
    train_mod.train(load_config(None, killed), resume=True)
    assert_same_training_state(tmp_path / 'full' / 'last.pth', tmp_path / 'killed' / 'last.pth')
