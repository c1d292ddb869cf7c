"""What a timm user meets (bugs found by using timm's scripts), each with a test that failed before its fix."""
import logging

import pytest
import timm
import torch

from tkvision.engine.checkpoint import save_weights


SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


@pytest.mark.parametrize('name', ['ringformer_vit_small_patch16_224', 'tokenformer_ring_vit_small_patch16_224'])
def test_a_local_files_head_is_kept_by_the_small_recurrent_variants(tmp_path, name):
    """The entrypoints passed num_classes=100 themselves, so a 10-class file got a random 100-class head."""
    src = timm.create_model(name, num_classes=10, **SMALL).eval()
    path = str(tmp_path / 'w.safetensors')
    save_weights(src.state_dict(), path)
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), src(x))
    assert timm.create_model(name, **SMALL).num_classes == 100  # the variant's own default (ImageNet-small)


@pytest.mark.parametrize('name', ['ringformer_vit_small_patch16_224', 'tokenformer_ring_vit_small_patch16_224'])
def test_layer_decay_gives_the_shared_block_the_last_levels_scale(name):
    """The shared block, used at every level, got the first level's scale (0.65^7 of the lr, ~0.05 here);
    it now takes the deepest level's, the largest any level has."""
    from timm.optim import create_optimizer_v2
    model = timm.create_model(name, **SMALL)
    opt = create_optimizer_v2(model, 'adamw', lr=1.0, layer_decay=0.65)
    scale = {id(p): g['lr_scale'] for g in opt.param_groups for p in g['params']}
    shared = {scale[id(p)] for p in model.shared.parameters()}
    last_level = {scale[id(p)] for p in model.blocks[-1].parameters()}
    assert shared == last_level and len(shared) == 1
    assert shared.pop() > max(scale[id(p)] for p in model.blocks[0].parameters())


def test_last_safetensors_says_whose_weights_it_holds(tmp_path, capsys):
    """With EMA on, last.safetensors holds the EMA weights while the printed top-1 is the raw model's;
    the file's metadata and the end-of-run message say so."""
    from tkvision.cli.train import train_main
    out = str(tmp_path / 'run')
    assert train_main(['--output', out, '--model_kwargs', '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 16, '
                       'depth: 1, num_heads: 2, num_tokens: 8}', '--rrc_scale', 'null', '--epochs', '1',
                       '--warmup_epochs', '0.5', '--train_subset', '128', '--val_subset', '64', '--batch_size', '32',
                       '--threads', '1', '--progress', 'false', '--model_ema', 'true']) == 0
    from safetensors import safe_open
    with safe_open(f'{out}/last.safetensors', 'pt') as f:
        assert f.metadata()['source'] == 'ema'
    assert 'last.safetensors (EMA weights)' in capsys.readouterr().out


def test_loading_with_other_in_chans_warns_nothing_misleading(tmp_path, caplog):
    """timm warned that the input conv "already matches" because our filter had adapted it first."""
    src = timm.create_model('tokenformer_vit_ti16', num_tokens=8, **SMALL)
    path = str(tmp_path / 'w.safetensors')
    save_weights(src.state_dict(), path)
    with caplog.at_level(logging.WARNING):
        m = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                              in_chans=1, num_tokens=8, **SMALL)
    assert m.patch_embed.proj.weight.shape[1] == 1
    torch.testing.assert_close(m.patch_embed.proj.weight, src.patch_embed.proj.weight.sum(1, keepdim=True))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize('name', ['ringformer_vit_small_patch16_224', 'tokenformer_ring_vit_small_patch16_224',
                                  'tokenformer_vit_ti16'])
def test_every_parameter_gets_a_gradient_as_timms_own_test_asks(name):
    """timm's backward test fails a model with a parameter that gets no gradient: the fixed sin-cos
    table was a frozen Parameter. It is a buffer now, under the same state-dict key."""
    kwargs = dict(SMALL, pos_embed='sincos') if name.startswith('tokenformer_vit') else SMALL
    model = timm.create_model(name, **kwargs)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert 'pos_embed' in model.state_dict() and 'pos_embed' in dict(model.named_buffers())


FAMILIES = ['tokenformer_vit_ti16', 'ringformer_vit_small_patch16_224', 'tokenformer_ring_vit_small_patch16_224']


def _vit_and(name, **kwargs):
    """Ours and timm's ViT at the same small shape."""
    torch.manual_seed(0)
    ours = timm.create_model(name, num_classes=5, **SMALL, **kwargs).eval()
    vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                            num_classes=5).eval()
    return ours, vit


@pytest.mark.parametrize('name', FAMILIES)
def test_get_patch_size_and_set_input_size_behave_as_timms_vit(name):
    ours, vit = _vit_and(name)
    assert ours.get_patch_size() == tuple(vit.patch_embed.patch_size) == (8, 8)
    learned = name.startswith('tokenformer_vit')
    before = ours.pos_embed.detach().clone()
    ours.set_input_size(img_size=48)
    vit.set_input_size(img_size=48)
    assert ours.patch_embed.grid_size == vit.patch_embed.grid_size == (6, 6) and ours.pos_embed.shape == vit.pos_embed.shape
    if learned:  # resampled as timm resamples
        expected = timm.layers.resample_abs_pos_embed(before, new_size=[6, 6], old_size=[4, 4], num_prefix_tokens=1)
        torch.testing.assert_close(ours.pos_embed.detach(), expected)
    else:  # sin-cos: the table a model built at 48 px has
        fresh = timm.create_model(name, **dict(SMALL, img_size=48))
        torch.testing.assert_close(ours.pos_embed, fresh.pos_embed)
    with torch.no_grad():
        assert ours(torch.randn(2, 3, 48, 48)).shape == vit(torch.randn(2, 3, 48, 48)).shape


def test_a_new_patch_size_resamples_the_key_tokens_as_flexivit_resamples_a_conv_stem():
    ours, _ = _vit_and('tokenformer_vit_ti16')
    weight = ours.patch_embed.proj.weight.detach().clone()
    ours.set_input_size(patch_size=4)
    torch.testing.assert_close(ours.patch_embed.proj.weight.detach(), timm.layers.resample_patch_embed(weight, [4, 4]))
    assert ours.get_patch_size() == (4, 4) and ours.patch_embed.grid_size == (8, 8)
    with torch.no_grad():
        assert ours.forward_features(torch.randn(1, 3, 32, 32)).shape == (1, 65, 32)
    with pytest.raises(ValueError, match='divisible by patch_size 5'):
        ours.set_input_size(patch_size=5)


@pytest.mark.parametrize('name', FAMILIES)
def test_forward_intermediates_as_a_dict_and_with_an_attention_mask_as_timms_vit(name):
    ours, vit = _vit_and(name)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for flags in (dict(), dict(return_prefix_tokens=True), dict(intermediates_only=True)):
            mine, theirs = ours.forward_intermediates(x, output_dict=True, **flags), vit.forward_intermediates(
                x, output_dict=True, **flags)
            assert set(mine) == set(theirs), flags
        as_list = ours.forward_intermediates(x)
        as_dict = ours.forward_intermediates(x, output_dict=True)
        torch.testing.assert_close(as_dict['image_features'], as_list[0])
        torch.testing.assert_close(as_dict['image_intermediates'][-1], as_list[1][-1])
        n = 17  # class token + 16 patches
        open_mask = torch.zeros(2, 1, n, n)
        torch.testing.assert_close(ours.forward_features(x, attn_mask=open_mask), ours.forward_features(x), rtol=0, atol=0)
        hide_last = torch.ones(n, n, dtype=torch.bool)
        hide_last[:, -1] = False  # no token attends to the last patch
        masked = ours.forward_features(x, attn_mask=hide_last)
        assert not torch.allclose(masked, ours.forward_features(x))
        torch.testing.assert_close(ours.forward_intermediates(x, attn_mask=hide_last)[0], masked)
        assert vit.forward_features(x, attn_mask=hide_last).shape == masked.shape


# --- timm's scripts as clients ------------------------------------------------------------------

def test_the_timm_script_shim_registers_our_models_and_passes_the_arguments(tmp_path):
    """``python -m tkvision.cli.timm_script script.py ARGS`` runs a timm script as ``__main__`` with our
    families registered; a missing script is a one-line error, exit 2."""
    import subprocess
    import sys

    from .helpers import ROOT
    script = tmp_path / 'train.py'
    script.write_text('import sys, timm\nif __name__ == "__main__":\n'
                      '    m = timm.create_model(sys.argv[2], img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=1)\n'
                      '    print(sys.argv[1:], type(m).__name__)\n')
    out = subprocess.run([sys.executable, '-m', 'tkvision.cli.timm_script', str(script), '--model', 'tokenformer_vit_ti16'],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['--model', 'tokenformer_vit_ti16'] TokenFormerViT"
    bad = subprocess.run([sys.executable, '-m', 'tkvision.cli.timm_script', str(tmp_path / 'nope.py')], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and 'is not a file' in bad.stderr and 'pytorch-image-models' in bad.stderr


def test_timms_script_entry_points_train_and_validate_our_models(tmp_path):
    """What timm's ``train.py`` and ``validate.py`` call, on our model and real images (Fashion-MNIST
    JPEGs in ImageNet layout; timm's scripts are not in its wheel and CI downloads nothing):
    ``validate.py``'s path (``create_model``, ``load_checkpoint`` of our trainer's ``best.safetensors``,
    ``resolve_data_config``, ``create_dataset``, ``create_loader``) gives our trainer's validation top-1
    to the digit; ``train.py``'s path (``create_optimizer_v2`` with ``layer_decay``,
    ``create_scheduler_v2``, ``ModelEmaV3``, ``create_loader(is_training=True)``) trains it."""
    from timm.data import create_dataset, create_loader, resolve_data_config
    from timm.models import load_checkpoint
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import ModelEmaV3, accuracy

    from tkvision.data.fashion_mnist import write_image_folder
    from tkvision.engine import trainer as train_mod
    from tkvision.engine.config import load_config
    root = tmp_path / 'fm'
    write_image_folder(str(root), size=32, train_per_class=12, val_per_class=5)
    kwargs = dict(SMALL, num_tokens=16, num_classes=10)
    ours = train_mod.train(load_config(None, dict(
        model='tokenformer_vit_ti16', model_kwargs=kwargs, dataset='folder', data_dir=str(root), crop_pct=1.0,
        val_split_fraction=0, rrc_scale=None, epochs=2, batch_size=12, warmup_epochs=0.5, lr=2e-3, threads=1,
        progress=False, output=str(tmp_path / 'run'))))

    model = timm.create_model('tokenformer_vit_ti16', **kwargs)
    load_checkpoint(model, str(tmp_path / 'run' / 'best.safetensors'))
    config = resolve_data_config({'crop_pct': 1.0, 'img_size': 32}, model=model)  # validate.py --img-size 32
    loader = create_loader(create_dataset('', root=str(root / 'val')), input_size=config['input_size'], batch_size=8,
                           use_prefetcher=False, interpolation=config['interpolation'], mean=config['mean'],
                           std=config['std'], crop_pct=config['crop_pct'], num_workers=0)
    model.eval()
    with torch.no_grad():
        correct = sum(accuracy(model(x), y, topk=(1,))[0].item() * len(y) / 100 for x, y in loader)
    assert f'{100 * correct / 50:.2f}' == f"{ours['best_top1']:.2f}"

    optimizer = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05, layer_decay=0.65)
    scheduler, epochs = create_scheduler_v2(optimizer, 'cosine', num_epochs=2, warmup_epochs=1, warmup_lr=1e-5)
    ema = ModelEmaV3(model, decay=0.9)
    train_loader = create_loader(create_dataset('', root=str(root / 'train')), input_size=config['input_size'],
                                 batch_size=8, is_training=True, use_prefetcher=False, no_aug=True,
                                 mean=config['mean'], std=config['std'], num_workers=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    for epoch in range(epochs):
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model)
        scheduler.step(epoch + 1)
    assert epochs == 2 and torch.isfinite(loss)
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not torch.equal(ema.module.head.weight, model.head.weight)
    scales = sorted({g['lr_scale'] for g in optimizer.param_groups})
    assert scales[0] < scales[-1] == 1.0  # layer decay: the stem's groups are scaled down
