"""Training and evaluation end to end on real data (Fashion-MNIST subsets and real JPEG folders)."""
import csv
import os
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file

from tkvision.cli.train import parse_train_args
from tkvision.engine import checkpoint as ckpt
from tkvision.engine import trainer as train_mod
from tkvision.engine.config import load_config
from tkvision.data import load_fashion_mnist
from tkvision.cli.train import validate_main

from .helpers import ROOT, TINY_FMNIST, dataset_of, fmnist_cfg, free_port, make_imagenet_folder, transform_of


def test_fashion_mnist_learns_and_writes_outputs(tmp_path, capsys):
    cfg = fmnist_cfg(tmp_path, epochs=3, train_subset=8192, lr=3e-3, model_ema=True, model_ema_decay=0.9)
    res = train_mod.train(cfg)
    out = cfg['output']
    assert res['top1'] > 70, res  # 10 classes: chance is 10%
    with open(os.path.join(out, 'metrics.csv')) as f:
        rows = list(csv.DictReader(f))
    assert [int(r['epoch']) for r in rows] == [0, 1, 2]
    assert float(rows[-1]['train_loss']) < float(rows[0]['train_loss'])
    assert {'top1', 'top5', 'ema_top1', 'img_per_s', 'epoch_time', 'lr'} <= set(rows[0])
    for name in ('best.safetensors', 'last.safetensors', 'last.pth', 'curves.png', 'config.yaml'):
        assert os.path.isfile(os.path.join(out, name)), name
    with open(os.path.join(out, 'curves.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert 'val top-1' in capsys.readouterr().out
    # exported weights load through timm and reproduce the run's final accuracy
    m = timm.create_model('tokenformer_vit_ti16', pretrained=True, num_classes=10,
                          pretrained_cfg_overlay=dict(file=os.path.join(out, 'best.safetensors')), **TINY_FMNIST)
    state = load_file(os.path.join(out, 'best.safetensors'))
    for k, v in m.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_validate_tool_matches_training_eval(tmp_path, capsys):
    cfg = fmnist_cfg(tmp_path, epochs=1)
    res = train_mod.train(cfg)
    capsys.readouterr()
    validate_main(['--config', os.path.join(cfg['output'], 'config.yaml'),
                   '--checkpoint', os.path.join(cfg['output'], 'last.pth')])
    out = capsys.readouterr().out
    assert f"top-1 {res['top1']:.2f}%" in out and 'on 512 val images' in out


def test_missing_fashion_mnist_names_path_and_fix(tmp_path, monkeypatch):
    monkeypatch.setattr('tkvision.data.fashion_mnist.FASHION_MNIST_DIR', str(tmp_path / 'nowhere'))
    with pytest.raises(FileNotFoundError, match=r'nowhere.*apt-get install -y dataset-fashion-mnist'):
        load_fashion_mnist('train')


def test_missing_imagenet_dir_names_path(tmp_path):
    cfg = load_config(None, dict(dataset='imagenet', data_dir=str(tmp_path / 'imnet')))
    with pytest.raises(FileNotFoundError, match=r'imnet/train not found.*train/<class>'):
        dataset_of(cfg, 'train')


def test_corrupt_images_are_skipped_and_counted(tmp_path, capsys):
    root = make_imagenet_folder(tmp_path / 'imnet', classes=2, train_per_class=6, val_per_class=3, size=32)
    bad = os.path.join(root, 'train', 'n00000000', 'broken.JPEG')
    with open(bad, 'wb') as f:
        f.write(b'not a jpeg at all')
    with open(os.path.join(root, 'val', 'n00000001', 'truncated.JPEG'), 'wb') as f:
        f.write(open(os.path.join(root, 'val', 'n00000001', 'img_0.JPEG'), 'rb').read()[:40])
    # a decompression bomb (PIL raises DecompressionBombError, not OSError): 200 Mpx of 1-bit PNG, a few kB
    from PIL import Image
    Image.new('1', (20000, 10000)).save(os.path.join(root, 'train', 'n00000001', 'bomb.png'))
    cfg = load_config(None, dict(dataset='imagenet', data_dir=root, img_size=32, mean=[.5, .5, .5], std=[.5, .5, .5],
                                 model='tokenformer_vit_ti16', threads=1, progress=False, epochs=1, warmup_epochs=0.5, batch_size=2,  # 14 train files: every one read
                                 model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                                   num_tokens=8, num_classes=2), output=str(tmp_path / 'run')))
    res = train_mod.train(cfg)
    rows = list(csv.DictReader(open(os.path.join(cfg['output'], 'metrics.csv'))))
    assert int(rows[0]['skipped']) == 2 and int(rows[0]['val_skipped']) == 1  # broken + bomb in train, one in val
    assert 'skipped 3 unreadable images' in capsys.readouterr().out
    assert res['top1'] is not None


def test_imagenet_recipe_tiny_variant_224px(tmp_path, capsys):
    """The ImageNet path on real JPEGs: full recipe augmentations at 224 px, train, resume, validate."""
    root = make_imagenet_folder(tmp_path / 'imnet', classes=3, train_per_class=8, val_per_class=4, size=80)
    tiny = dict(embed_dim=32, depth=2, num_heads=2, num_tokens=16)
    args = ['--config', os.path.join(ROOT, 'configs/imagenet/tokenformer_vit_b16.yaml'), '--data-dir', root,
            '--model_kwargs', str(tiny).replace("'", ''), '--batch_size', '4', '--global_batch_size', '8',
            '--epochs', '2', '--warmup_epochs', '0.5', '--num_workers', '0', '--amp', 'null', '--threads', '1',
            '--model_ema_decay', '0.9', '--progress', 'false', '--output', str(tmp_path / 'run')]
    cfg, _ = parse_train_args(args)
    assert cfg['auto_augment'] == 'rand-m9-mstd0.5-inc1' and cfg['mixup'] == 0.8 and cfg['reprob'] == 0.25
    ds = dataset_of(cfg, 'train')
    x, y = ds[0]
    assert x.shape == (3, 224, 224) and x.dtype == torch.uint8 and y == 0  # workers ship uint8
    res = train_mod.train(dict(cfg, epochs=1))
    assert res['top1'] is not None
    res2 = train_mod.train(cfg, resume=True)  # epoch 2 from the epoch-1 checkpoint
    assert 'resumed from' in capsys.readouterr().out
    state = ckpt.load_training_checkpoint(os.path.join(cfg['output'], 'last.pth'))
    assert state['epochs_done'] == 2 and state['model_ema'] is not None and state['config']['model'] == 'tokenformer_vit_b16'
    validate_main(['--config', os.path.join(cfg['output'], 'config.yaml'), '--checkpoint',
                   os.path.join(cfg['output'], 'best.safetensors')])
    assert 'on 12 val images' in capsys.readouterr().out
    assert res2['history'][-1]['epoch'] == 1


def test_checkpoint_write_is_atomic(tmp_path):
    """The one atomic write (binary, as last.pth; text, as metrics.csv): a write that dies (a kill, a
    full disk) leaves the old file intact and no temporary file behind."""
    from tkvision.utils.files import atomic_write
    path = str(tmp_path / 'last.pth')
    atomic_write(path, lambda tmp: torch.save({'epoch': 1, 'w': torch.ones(3)}, tmp))

    def crash(tmp):
        with open(tmp, 'wb') as fh:
            fh.write(b'partial')
        raise KeyboardInterrupt('killed mid-write')

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert torch.load(path, weights_only=True)['epoch'] == 1
    text = str(tmp_path / 'metrics.csv')
    atomic_write(text, lambda f: f.write('epoch\n0\n'), text=True)

    def disk_full(f):
        f.write('epoch\n0\n1')
        raise OSError(28, 'No space left on device')

    with pytest.raises(OSError, match='No space'):
        atomic_write(text, disk_full, text=True)
    assert open(text).read() == 'epoch\n0\n'
    assert sorted(os.listdir(tmp_path)) == ['last.pth', 'metrics.csv']  # no temp file left behind


def test_checkpoint_refuses_pickled_code(tmp_path):
    path = str(tmp_path / 'evil.pth')
    torch.save({'model': {}, 'hook': os.system}, path)
    with pytest.raises(Exception, match='holds pickled Python objects.*not loaded, since unpickling could run code'):
        ckpt.load_training_checkpoint(path)


@pytest.mark.slow  # two torchrun ranks with growth: 26 s alone on 2 cores, over 30 beside another test
def test_torchrun_two_cpu_ranks_end_identical(tmp_path):
    script = tmp_path / 'ddp_job.py'
    script.write_text(f'''
import hashlib, os, sys, torch
sys.path.insert(0, {ROOT!r})
from tkvision.engine.config import load_config
from tkvision.engine.trainer import train
from tests.helpers import TINY_FMNIST
cfg = load_config(None, dict(model_kwargs=TINY_FMNIST, rrc_scale=None, epochs=2, batch_size=32, lr=2e-3,
                             train_subset=512, val_subset=256, threads=1, progress=False, output={str(tmp_path / "run")!r},
                             growth=dict(every_epochs=1, add_tokens=dict(qkv=4, ffn=8))))
res = train(cfg)
h = hashlib.sha256()
for k, v in sorted(res['model'].state_dict().items()):
    h.update(k.encode()); h.update(v.detach().numpy().tobytes())
with open(os.path.join({str(tmp_path)!r}, 'rank%s.sha' % os.environ['RANK']), 'w') as f:
    f.write(h.hexdigest() + ' %d' % res['model'].blocks[0].attn.q.num_tokens)
''')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()), str(script)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r0, r1 = (open(tmp_path / f'rank{r}.sha').read() for r in (0, 1))
    assert r0 == r1 and r0.endswith(' 20')  # grown once (16 + 4 qkv tokens) identically on both ranks
    assert os.path.isfile(tmp_path / 'run' / 'last.pth') and os.path.isfile(tmp_path / 'run' / 'metrics.csv')


def test_rand_augment_never_posterizes_to_zero_bits():
    """timm's m9-mstd0.5 RandAugment can draw magnitude 10 -> Posterize(0 bits), which Pillow rejects."""
    import numpy as np
    cfg = load_config(None, dict(dataset='imagenet', img_size=32, mean=[.5] * 3, std=[.5] * 3,
                                 auto_augment='rand-n8-m9-mstd0.5-inc1', rrc_scale=None))
    t = transform_of(cfg, train=True)
    img = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    for seed in range(300):  # ~8 ops x 300 draws: several magnitude-10 Posterize draws without the cap
        t.set_random_seed(seed)
        assert t(image=img)['image'].shape == (3, 32, 32)


def test_rand_augment_hands_the_tensor_conversion_a_writable_array():
    """RandAugment runs on PIL images; the array it returns must be writable, or ``ToTensorV2``'s
    ``torch.from_numpy`` warns in every loader worker (Pillow's buffer is read-only)."""
    import numpy as np

    from tkvision.data.transforms import _rand_augment_op
    op = _rand_augment_op('rand-n2-m9-mstd0.5-inc1', 32, (0.5, 0.5, 0.5))
    img = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    out = op(image=img)['image']
    assert out.dtype == np.uint8 and out.shape == (32, 32, 3) and out.flags.writeable


def test_crop_padding_is_a_zero_filled_shift_of_at_most_the_padding():
    """crop_padding: p gives the image shifted by (dy, dx) in [-p, p]^2, vacated pixels 0 (background),
    every shift reachable; the eval transform is untouched."""
    import numpy as np
    cfg = load_config(None, dict(img_size=28, rrc_scale=None, hflip=0.0, crop_padding=2))
    t = transform_of(cfg, train=True, resize=False)
    img = np.random.default_rng(0).integers(1, 256, (28, 28, 1), dtype=np.uint8)
    padded = np.pad(img[..., 0], 2)
    shifts = set()
    for seed in range(200):
        t.set_random_seed(seed)
        out = t(image=img)['image'][0].numpy()
        match = [(dy, dx) for dy in range(5) for dx in range(5)
                 if np.array_equal(out, padded[dy:dy + 28, dx:dx + 28])]
        assert len(match) == 1, 'output is not a zero-filled shift of the input'
        shifts.add(match[0])
    assert shifts == {(dy, dx) for dy in range(5) for dx in range(5)}
    ev = transform_of(cfg, train=False, resize=False)
    assert np.array_equal(ev(image=img)['image'][0].numpy(), img[..., 0])


@pytest.mark.slow
def test_bf16_autocast_and_grad_checkpointing_train_like_fp32(tmp_path):
    """The recipe's bf16 autocast and gradient checkpointing options reach about the same accuracy as fp32."""
    ref = train_mod.train(fmnist_cfg(tmp_path, epochs=2, train_subset=4096, output=str(tmp_path / 'fp32')))
    low = train_mod.train(fmnist_cfg(tmp_path, epochs=2, train_subset=4096, amp='bf16', grad_checkpointing=True,
                                     output=str(tmp_path / 'bf16')))
    # chance is 10%; 2 epochs of 4096 images reach 52-59% over seeds and validation splits
    assert ref['top1'] > 45 and abs(low['top1'] - ref['top1']) < 5, (ref['top1'], low['top1'])
