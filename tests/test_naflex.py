"""The NaFlex TokenFormer: timm's NaFlex contract on a TokenFormer, held against the fixed-grid
family (an independent implementation of the same function on a full grid) in float64."""
import pytest
import timm
import torch
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import patchify_image

from tkvision.growth import grow
from tkvision.models.naflex_tokenformer import NaFlexTokenFormer, checkpoint_filter_fn

KW = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=10)


def _pair(fixed_only=None, **kwargs):
    """A fixed-grid TokenFormer (with ``fixed_only`` kwargs too) and the NaFlex one holding its weights
    (float64, eval)."""
    torch.manual_seed(0)
    fixed = timm.create_model('tokenformer_vit_ti16', **dict(KW, **kwargs, **(fixed_only or {}))).double().eval()
    flex = timm.create_model('naflexvit_tokenformer_ti16', **dict(KW, **kwargs)).double().eval()
    flex.load_state_dict(checkpoint_filter_fn(fixed.state_dict(), flex))
    return fixed, flex


def _batch(images, patch_size=7, max_seq_len=None):
    """timm's NaFlex collation of ``images`` (each ``[C, H, W]``): the loader's patch dictionary."""
    samples = []
    for img in images:
        patches, coord, valid = patchify_image(img, (patch_size, patch_size))
        samples.append((dict(patches=patches, patch_coord=coord, patch_valid=valid), 0))
    batch, _ = NaFlexCollator(max_seq_len or max(s[0]['patches'].shape[0] for s in samples))(samples)
    return {k: v.double() if k == 'patches' else v for k, v in batch.items() if k != 'seq_len'}


@torch.no_grad()
def test_fixed_grid_weights_give_the_same_outputs_on_a_full_grid():
    """Images and the loader's patch dictionary both give the fixed-grid model's logits; the checkpoint's
    own tensors are left as they were (timm's filter adds to the class token in place)."""
    fixed, flex = _pair()
    cls_before = fixed.cls_token.clone()
    x = torch.randn(3, 1, 28, 28, dtype=torch.float64)
    expected = fixed(x)
    torch.testing.assert_close(flex(x), expected, rtol=0, atol=1e-12)
    # the patch dictionary's path: timm resamples the position grid per image in float32
    torch.testing.assert_close(flex(_batch(list(x))), expected, rtol=0, atol=1e-6)
    assert torch.equal(fixed.cls_token, cls_before)


@torch.no_grad()
@pytest.mark.parametrize('global_pool', ['token', 'avg'])
def test_padding_tokens_change_nothing_in_attention_or_pooling(global_pool):
    """Images of other sizes and aspect ratios packed into one padded batch: each row equals that image
    alone, whatever the padding slots hold."""
    _, flex = _pair(global_pool=global_pool, class_token=global_pool == 'token')
    images = [torch.randn(1, h, w, dtype=torch.float64) for h, w in ((28, 28), (14, 42), (21, 7))]
    alone = torch.cat([flex(_batch([img])) for img in images])
    packed = _batch(images, max_seq_len=20)
    packed['patches'][~packed['patch_valid']] = 1e3 * torch.randn_like(packed['patches'][~packed['patch_valid']])
    torch.testing.assert_close(flex(packed), alone, rtol=0, atol=1e-9)


@torch.no_grad()
def test_another_patch_size_equals_the_fixed_grid_model_with_set_input_size():
    """14 x 14 patches (the loader's variable patch size) against key tokens resampled as FlexiViT does
    equal the fixed-grid model after ``set_input_size(patch_size=14)`` (conv stem, resampled kernel)."""
    fixed, flex = _pair(fixed_only=dict(dynamic_img_size=True))
    x = torch.randn(2, 1, 28, 28, dtype=torch.float64)
    fixed.set_input_size(patch_size=14)
    patches = [patchify_image(img, (14, 14), flatten_patches=False) for img in x]
    batch = dict(patches=torch.stack([p for p, _, _ in patches]), patch_coord=torch.stack([c for _, c, _ in patches]),
                 patch_valid=torch.stack([v for _, _, v in patches]))
    assert batch['patches'].shape == (2, 4, 14, 14, 1)
    torch.testing.assert_close(flex(batch), fixed(x), rtol=0, atol=1e-6)  # float32 position grid (timm)


def test_growth_with_zero_keys_keeps_the_function_on_a_padded_batch():
    """Eq. 12-13 on the NaFlex family: every kind grown with zero keys, same logits (and the grown model
    has the new token counts)."""
    _, flex = _pair()
    batch = _batch([torch.randn(1, 28, 14, dtype=torch.float64), torch.randn(1, 7, 28, dtype=torch.float64)])
    with torch.no_grad():
        before = flex(batch)
    grow(flex, patch=4, qkv=8, proj=8, ffn=16)
    assert (flex.embeds.proj.num_tokens, flex.blocks[0].attn.q.num_tokens, flex.blocks[1].ffn.num_tokens) == (20, 24, 80)
    with torch.no_grad():
        torch.testing.assert_close(flex(batch), before, rtol=0, atol=1e-12)


def test_bad_patches_and_options_that_would_be_ignored_are_refused():
    """A patch length that is no square patch names in_chans; NaFlexVit options that configure layers a
    TokenFormer has not (an MLP ratio, biases, the attention pool) are refused, not ignored."""
    flex = NaFlexTokenFormer(**{k: v for k, v in KW.items()})
    bad = dict(patches=torch.randn(1, 4, 50), patch_coord=torch.zeros(1, 4, 2, dtype=torch.long),
               patch_valid=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r'patches of 50 values are not q x q x 1 \(in_chans\)'):
        flex(bad)
    with pytest.raises(TypeError, match=r'not a list: stack a list of images with torch.stack'):  # was AttributeError
        flex([torch.randn(1, 28, 28)])
    with pytest.raises(ValueError, match=r'mlp_ratio=2.0: a NaFlex TokenFormer has no Linear'):
        NaFlexTokenFormer(**KW, mlp_ratio=2.0)
    with pytest.raises(ValueError, match=r"qkv_bias=True"):
        NaFlexTokenFormer(**KW, qkv_bias=True)
    with pytest.raises(ValueError, match=r"global_pool='map'"):
        NaFlexTokenFormer(**KW, global_pool='map')


def test_the_family_is_registered_beside_timms_naflexvit_with_the_fixed_grid_token_counts():
    """``timm.list_models('naflexvit*')`` lists ours; B/16† has the fixed-grid B/16†'s parameters but for
    the class token's position embedding (folded into the class token)."""
    assert {'naflexvit_tokenformer_ti16', 'naflexvit_tokenformer_b16', 'naflexvit_tokenformer_b16_matched'} <= \
        set(timm.list_models('naflexvit*'))
    flex = timm.create_model('naflexvit_tokenformer_b16_matched', device='meta')
    fixed = timm.create_model('tokenformer_vit_b16_matched', device='meta')
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(fixed) - count(flex) == 768


@torch.no_grad()
def test_timms_pretrained_path_loads_a_fixed_grid_weights_file(tmp_path):
    """``create_model('naflexvit_tokenformer_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=...))``
    with the fixed-grid family's ``.safetensors`` (our trainer's output format): timm's loader runs our
    filter, and the NaFlex model gives the fixed-grid logits on a full grid."""
    from safetensors.torch import save_file
    torch.manual_seed(0)
    fixed = timm.create_model('tokenformer_vit_ti16', **KW).eval()
    path = str(tmp_path / 'fixed.safetensors')
    save_file(fixed.state_dict(), path)
    flex = timm.create_model('naflexvit_tokenformer_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                             **KW).eval()
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(flex(x), fixed(x), rtol=0, atol=1e-5)


def test_timms_naflex_loader_trains_the_family_on_real_images(tmp_path):
    """What ``train.py --naflex-loader`` runs: timm's ``create_naflex_loader`` over an ImageNet-layout folder
    of real Fashion-MNIST JPEGs, drawing sequence lengths and patch sizes per batch, feeds our model; 20
    updates lower the loss on a fixed batch of the validation loader (a full 64 px grid, 8 px patches)."""
    from timm.data import create_dataset
    from timm.data.naflex_loader import create_naflex_loader

    from .helpers import make_imagenet_folder
    root = make_imagenet_folder(tmp_path / 'imagenet', classes=3, train_per_class=8, val_per_class=4, size=64)
    common = dict(max_seq_len=64, batch_size=4, num_workers=0, use_prefetcher=False, device='cpu', pin_memory=False,
                  persistent_workers=False)
    train_loader = create_naflex_loader(create_dataset('', root=f'{root}/train'), is_training=True, seed=0,
                                        patch_size_choices=[8, 16], train_seq_lens=(16, 36, 64), **common)
    val = next(iter(create_naflex_loader(create_dataset('', root=f'{root}/val'), patch_size=8, **common)))
    torch.manual_seed(0)
    model = timm.create_model('naflexvit_tokenformer_ti16', patch_size=8, embed_dim=32, depth=2, num_heads=2,
                              num_tokens=16, num_classes=3, pos_embed_grid_size=(8, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    with torch.no_grad():
        before = loss_fn(model.eval()(val[0]), val[1]).item()
    shapes = set()
    model.train()
    for _ in range(3):
        for inputs, targets in train_loader:
            shapes.add(tuple(inputs['patches'].shape[1:]))
            opt.zero_grad()
            loss_fn(model(inputs), targets).backward()
            opt.step()
    with torch.no_grad():
        after = loss_fn(model.eval()(val[0]), val[1]).item()
    assert len({s[0] for s in shapes}) > 1  # several sequence lengths
    assert {s[1:] for s in shapes} >= {(8, 8, 3), (16, 16, 3)}  # both patch sizes, unflattened [N, p, p, C]
    assert after < before - 0.05, (before, after)


@torch.no_grad()
def test_export_and_local_dir_rebuild_a_grown_model(tmp_path):
    """``export_model`` (``tools/export.py``'s writer: timm's ``save_for_hf`` with the token counts) and
    ``create_model('local-dir:...', pretrained=True)`` give back the grown NaFlex model, outputs equal."""
    from tkvision.engine.export import export_model
    _, flex = _pair()
    grow(flex, qkv=8, ffn=16)
    flex = flex.float()
    export_model(flex, str(tmp_path / 'exported'), model_args={k: v for k, v in KW.items() if k != 'num_classes'})
    back = timm.create_model(f"local-dir:{tmp_path / 'exported'}", pretrained=True).eval()
    assert type(back) is NaFlexTokenFormer
    batch = _batch([torch.randn(1, 14, 28, dtype=torch.float64)])
    batch['patches'] = batch['patches'].float()
    torch.testing.assert_close(back(batch), flex(batch), rtol=0, atol=1e-6)


def test_our_trainer_trains_the_family_on_fixed_size_images(tmp_path):
    """``tools/train.py --model naflexvit_tokenformer_ti16`` died in the input check (the model has no
    ``patch_embed``); it now takes plain Fashion-MNIST images and learns."""
    from tkvision.engine.trainer import train
    from tkvision.models._helpers import input_shape

    from .helpers import fmnist_cfg
    assert input_shape(NaFlexTokenFormer(**KW)) == (1, None)  # any size
    res = train(fmnist_cfg(tmp_path, model='naflexvit_tokenformer_ti16', epochs=2))
    assert res['top1'] > 25, res['top1']  # 512 validation images: chance is 10 ± 1.3


def test_the_mixed_size_fashion_mnist_folder_has_every_size_in_every_class(tmp_path):
    """``tools/make_subset.py --src fashion-mnist --sizes 32x32 48x96 96x48``: the k-th image of each class
    gets the k-th size in turn (upscaled to cover it, centre-cropped), so each class has each resolution and
    aspect ratio; a malformed size is a one-line error naming it, and nothing is written."""
    import collections
    import subprocess
    import sys

    from PIL import Image

    from .helpers import ROOT
    out = tmp_path / 'mixed'
    res = subprocess.run([sys.executable, 'tools/make_subset.py', '--src', 'fashion-mnist', '--sizes', '32x32', '48x96',
                          '96x48', '--train-per-class', '6', '--val-per-class', '3', '--out', str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for split, per_class in (('train', 6), ('val', 3)):
        for folder in sorted((out / split).iterdir()):
            sizes = collections.Counter(Image.open(f).size for f in sorted(folder.iterdir()))  # (width, height)
            assert sizes == collections.Counter([(32, 32), (96, 48), (48, 96)] * (per_class // 3)), folder
    bad = subprocess.run([sys.executable, 'tools/make_subset.py', '--src', 'fashion-mnist', '--sizes', '48by96',
                          '--out', str(tmp_path / 'bad')], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "'48by96' is not HEIGHTxWIDTH" in bad.stderr
    assert not (tmp_path / 'bad').exists()


def _naflex_run_cfg(tmp_path, name, **overrides):
    from .helpers import fmnist_cfg
    return fmnist_cfg(tmp_path, **{**dict(
        model='naflexvit_tokenformer_ti16', naflex_loader=True, naflex_train_seq_lens=[9, 16, 25], naflex_max_seq_len=16,
        rrc_scale=[0.5, 1.0], train_subset=512, val_subset=128, epochs=2, checkpoint_every_steps=1,
        output=str(tmp_path / name)), **overrides})


@pytest.mark.slow  # two runs and a resume: 27-28 s in make test
def test_our_trainer_reads_timms_naflex_loader_and_resumes_mid_epoch_exactly(tmp_path, monkeypatch):
    """``naflex_loader: true``: batches of 9, 16 or 25 patches (batch sizes scaled to the length), the patch size
    drawn per batch from 7 and 14. A run with 2 loader workers that crashes after the 3rd update of its second
    epoch and is resumed ends bit-identical to an uninterrupted run with no workers: the schedule is timm's,
    drawn from seed and epoch, and every sample's augmentation is seeded from (seed, epoch, index)."""
    from tkvision.engine import clock as clock_mod
    from tkvision.engine.trainer import train
    full = train(_naflex_run_cfg(tmp_path, 'full', num_workers=0, naflex_patch_sizes=[7, 14]))
    cfg = _naflex_run_cfg(tmp_path, 'broken', num_workers=2, naflex_patch_sizes=[7, 14])
    real = clock_mod.save_training_checkpoint

    def crash(state, path):
        real(state, path)
        if state['epochs_done'] == 1 and state['batches_done'] == 3:
            raise KeyboardInterrupt('pre-empted')
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', crash)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(clock_mod, 'save_training_checkpoint', real)
    resumed = train(cfg, resume=True)
    a, b = full['model'].state_dict(), resumed['model'].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed['top1'] == full['top1'] and resumed['test_top1'] == full['test_top1']


def test_naflex_loss_scale_and_options_the_naflex_loader_would_ignore_are_refused(tmp_path):
    """timm's --naflex-loss-scale weights a batch by its images over batch_size (or the square root); mixup,
    random erasing, crop padding, MAE and a fixed-grid model are refused with the key named."""
    from tkvision.engine.run_data import naflex_loss_scale
    from tkvision.engine.trainer import train
    from tkvision.utils.errors import ConfigError
    assert (naflex_loss_scale('linear', 96, 64), naflex_loss_scale('sqrt', 16, 64), naflex_loss_scale('none', 9, 64)) == (
        1.5, 0.5, 1.0)
    for key, value in (('mixup', 0.8), ('reprob', 0.25), ('crop_padding', 2)):
        with pytest.raises(ConfigError, match=f'{key} .* with naflex_loader'):
            train(_naflex_run_cfg(tmp_path, key, **{key: value}))
    with pytest.raises(ConfigError, match='naflex_loss_scale must be one of'):
        train(_naflex_run_cfg(tmp_path, 'scale', naflex_loss_scale='cubic'))
    with pytest.raises(ConfigError, match='tokenformer_vit_ti16 takes no NaFlex patch dictionaries'):
        train(_naflex_run_cfg(tmp_path, 'fixed', model='tokenformer_vit_ti16'))
    assert not any((tmp_path / name / 'last.pth').exists() for name in ('mixup', 'reprob', 'scale', 'fixed'))


def test_the_fixed_grid_is_resampled_from_its_trained_table_at_every_evaluation_length():
    """docs/naflex.md evaluates the fixed-grid TokenFormer at 16, 36, 64 and 144 patches: each length is a
    copy resampled from the trained position table (at its own length: that table, unchanged), never from the
    previous length's, and the trained model keeps its size."""
    from studies.naflex.naflex_experiment import at_length
    m = timm.create_model('tokenformer_vit_ti16', img_size=48, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                          num_tokens=8, global_pool='avg').eval()
    trained = m.pos_embed.detach().clone()
    small = at_length(m, 16)
    same = at_length(m, 36)
    assert small.patch_embed.grid_size == (4, 4) and small(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    assert torch.equal(same.pos_embed, trained) and torch.equal(m.pos_embed, trained)
    assert m.patch_embed.grid_size == (6, 6)


@pytest.mark.slow
def test_two_ranks_under_torchrun_read_the_naflex_loader_and_resume_exactly(tmp_path):
    """``naflex_loader`` under torchrun (2 CPU ranks, gloo): timm's distributed NaFlex wrapper gives every rank half
    the images and the same number of batches (else DDP would hang at the epoch's end), and a run stopped by SIGTERM
    in the middle of an epoch and resumed under torchrun ends with the weights of an uninterrupted one."""
    from .helpers import TINY_FMNIST, assert_torchrun_resumes_exactly

    def args_for(out):
        return ['--model', 'naflexvit_tokenformer_ti16', '--model_kwargs', str(TINY_FMNIST).replace("'", ''),
                '--naflex_loader', 'true', '--naflex_train_seq_lens', '[9, 16, 25]', '--naflex_max_seq_len', '16',
                '--naflex_patch_sizes', '[7, 14]', '--rrc_scale', '[0.5, 1.0]', '--epochs', '2', '--batch_size', '32',
                '--train_subset', '768', '--val_subset', '128', '--threads', '1', '--progress', 'false',
                '--checkpoint_every_steps', '1', '--output', out]
    log, state = assert_torchrun_resumes_exactly(tmp_path, args_for,
                                                 lambda s: s['epochs_done'] == 1 and s['batches_done'] >= 2)
    # each rank its half: one process makes 14 updates of these 768 images an epoch (tools/train.py, same flags)
    assert '768 train / 128 val images, 2 process(es) on cpu (gloo), global batch 64, 7 updates/epoch' in log, log
    assert state['epochs_done'] == 1


def test_bad_naflex_inputs_are_refused_naming_the_shapes():
    """An empty sequence, tensors of a patch dictionary that disagree in shape (a ``patch_coord`` shorter than
    ``patches``, which timm's NaFlexViT accepts), patches without coordinates, a dictionary without patches and
    an image whose size is not a multiple of the patch size: each a ValueError naming the shapes."""
    m = timm.create_model('naflexvit_tokenformer_ti16', depth=1, embed_dim=24, num_heads=3, num_tokens=8, img_size=28,
                          patch_size=7, in_chans=1, num_classes=10).eval()
    p = 7 * 7
    coord, valid = torch.zeros(2, 4, 2, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool)
    cases = [
        (dict(patches=torch.randn(2, 0, p), patch_coord=coord[:, :0], patch_valid=valid[:, :0]), 'empty sequence'),
        (dict(patches=torch.randn(2, 4, p), patch_coord=coord[:, :3], patch_valid=valid),
         r'patch_coord has shape \(2, 3, 2\); patches \(2, 4, 49\) need patch_coord of shape \(2, 4, 2\)'),
        (dict(patches=torch.randn(2, 4, p), patch_coord=coord, patch_valid=valid[:1]), 'patch_valid has shape'),
        (dict(image=torch.randn(2, 1, 28, 28)), "needs 'patches'"),
        (torch.randn(2, 4, p), "patches without 'patch_coord'"),
        (torch.randn(2, 1, 30, 30), 'a 30 x 30 image is not a multiple of the patch size 7'),
        (torch.randn(2, 3, 28, 28), 'the images have 3 channels; the model takes 1'),
    ]
    for x, words in cases:
        with pytest.raises(ValueError, match=words):
            m(x)
    assert m(dict(patches=torch.randn(2, 4, p), patch_coord=coord, patch_valid=valid)).shape == (2, 10)
