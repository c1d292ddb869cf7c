"""The input pipeline, measured: JPEG decoders, augmentation libraries, folder vs shards, workers.

``python -m studies.performance.layer_benchmark --parts data`` runs `benchmark_data`, ``--parts loader``
`benchmark_loaders` (our training loader against timm's ``create_loader``). Images are real: Fashion-MNIST
images upscaled to 500 x 375 (ImageNet's typical size) and written as JPEGs (quality 90) in an
ImageNet-layout folder and as WebDataset shards of it, unless ``root`` names a folder of your own.
The augmentation is the ImageNet recipe's (``tkvision/configs/imagenet/_base_mae_supervised.yaml``:
RandomResizedCrop 224 bicubic, flip, RandAugment m9-mstd0.5); workers hand uint8 batches over.
"""
import io
import os
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform

from studies import ROOT
from tkvision.data import (BatchPreprocessor, build_dataset, build_loader, build_transform, load_fashion_mnist,
                           set_loader_epoch)
from tkvision.data.shards import make_shards
from tkvision.engine.config import load_config, section
from tkvision.engine.config import resolve_run_config

__all__ = ['LOADERS', 'benchmark_data', 'benchmark_loaders', 'make_jpeg_folder']

_RECIPE = 'tkvision/configs/imagenet/_base_mae_supervised.yaml'


def make_jpeg_folder(root: str, n_images: int = 256, classes: int = 4, size=(500, 375)) -> str:
    """``root/{train,val}/<class>/*.JPEG``: Fashion-MNIST images upscaled to ``size`` (quality 90)."""
    images, labels = load_fashion_mnist('train')
    for split, n in (('train', n_images), ('val', classes)):
        for c in range(classes):
            os.makedirs(os.path.join(root, split, f'n{c:08d}'), exist_ok=True)
        for i in range(n):
            c = int(labels[i]) % classes
            img = Image.fromarray(images[i]).convert('RGB').resize(size, Image.BICUBIC)
            img.save(os.path.join(root, split, f'n{c:08d}', f'{split}_{i}.JPEG'), quality=90)
    return root


def _rate(fn, items, repeats):
    best = float('inf')
    for _ in range(repeats):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - t0)
    return len(items) / best


def _decoders():
    import torchvision.io
    out = {'PIL (Image.open + convert RGB)': lambda b: np.asarray(Image.open(io.BytesIO(b)).convert('RGB')),
           'torchvision.io.decode_jpeg': lambda b: torchvision.io.decode_jpeg(
               torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=torchvision.io.ImageReadMode.RGB)}
    try:
        import simplejpeg
        out['simplejpeg.decode_jpeg'] = lambda b: simplejpeg.decode_jpeg(b, colorspace='RGB')
    except ImportError:
        pass
    return out


def _loader_rate(cfg, workers, batches, dataset):
    data = section(dict(cfg, num_workers=workers, dataset=dataset), 'data')
    loader = build_loader(build_dataset(data, 'train', cfg['seed']), data, train=True, seed=cfg['seed'])
    set_loader_epoch(loader, 0)
    it = iter(loader)
    for _ in range(max(workers, 1)):  # every worker started and through its first batch
        next(it)
    t0, n = time.perf_counter(), 0
    for _, (images, _, _) in zip(range(batches - max(workers, 1)), it):
        n += len(images)
    rate = n / (time.perf_counter() - t0)
    del it, loader
    return rate


def benchmark_data(root=None, n_images=256, workers=(1, 2), batch_size=32, repeats=3, log=print) -> dict:
    """Three tables: ``decode`` (JPEG decoders, one thread), ``augment`` (albumentations vs timm's
    ``create_transform`` on decoded images, one thread), ``loader`` (decode + augmentation + collation
    through the DataLoader from a folder and from shards, for each worker count: img/s in all and
    per worker). Returns ``{table: rows}``.
    """
    torch.set_num_threads(1)
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix='tkvision-data-bench-')
        root = make_jpeg_folder(os.path.join(tmp, 'jpeg'), n_images)
    shards = os.path.join(tmp or tempfile.mkdtemp(), 'shards')
    make_shards(root, shards, max_count=max(n_images // 8, 1), progress=False)
    files = []
    for d, _, names in os.walk(os.path.join(root, 'train')):
        files += [os.path.join(d, f) for f in sorted(names)]
    blobs = [open(f, 'rb').read() for f in files[:n_images]]
    tables = dict(decode=[], augment=[], loader=[])
    for name, fn in _decoders().items():  # (tkvision.data.decode_image takes the simplejpeg path when installed)
        rate = _rate(fn, blobs, repeats)
        tables['decode'].append(dict(decoder=name, img_per_s=rate))
        log(f'decode  {name:34s} {rate:8.1f} img/s')
    recipe = load_config(os.path.join(ROOT, _RECIPE), dict(data_dir=root, batch_size=batch_size,
                                                           model='tokenformer_vit_b16'))
    cfg = resolve_run_config(recipe).to_dict()
    arrays = [np.asarray(Image.open(io.BytesIO(b)).convert('RGB')) for b in blobs]
    ours = build_transform(section(cfg, 'data'), train=True, seed=cfg['seed'])
    # mmax9: timm's own pipeline otherwise hits its Posterize-0-bits crash with Pillow >= 11 (tkvision.data)
    theirs = create_transform(224, is_training=True, auto_augment='rand-m9-mstd0.5-inc1-mmax9', interpolation='bicubic')
    pil = [Image.fromarray(a) for a in arrays]
    for name, fn, items in (('albumentations + timm RandAugment (tkvision)', lambda a: ours(image=a)['image'], arrays),
                            ('timm create_transform (torchvision ops)', theirs, pil)):
        rate = _rate(fn, items, repeats)
        tables['augment'].append(dict(pipeline=name, img_per_s=rate))
        log(f'augment {name:46s} {rate:8.1f} img/s')
    batches = n_images // batch_size
    for dataset, data_dir in (('folder', root), ('wds/bench', shards)):
        for w in workers:
            rate = _loader_rate(dict(cfg, data_dir=data_dir), w, batches, dataset)
            tables['loader'].append(dict(source=dataset.split('/')[0], workers=w, img_per_s=rate,
                                         img_per_s_per_worker=rate / w))
            log(f'loader  {dataset:10s} {w} worker(s) {rate:8.1f} img/s ({rate / w:.1f} per worker)')
    return tables


def _timm_loader(root: str, cfg: dict, workers: int, prefetch: bool):
    """timm's ``create_loader`` over ``root/train`` with the ImageNet recipe's training transforms (as
    ``cfg``'s data section gives them): RandomResizedCrop 224 bicubic (Pillow's, on PIL images), flip,
    RandAugment; random erasing is left out of every loader (ours applies it on the device, after the loader).
    ``prefetch``: timm's default ``use_prefetcher=True`` on the CPU, whose workers hand uint8 batches and whose
    ``PrefetchLoader`` normalises them to float32 on the device, as ours does; False: its workers normalise
    and ship float32. timm's RandAugment gets a magnitude cap of 9 (``-mmax9``; its string takes an integer,
    ours is 9.99, ``tkvision.data.transforms.RAND_AUGMENT_MAGNITUDE_MAX``): uncapped, its Posterize at
    magnitude 10 keeps 0 bits, which Pillow >= 11 refuses."""
    from timm.data import create_dataset, create_loader
    dataset = create_dataset('', root=os.path.join(root, 'train'), is_training=True)
    return create_loader(dataset, input_size=(3, cfg['img_size'], cfg['img_size']), batch_size=cfg['batch_size'],
                         is_training=True, use_prefetcher=prefetch, device=torch.device('cpu'),
                         scale=tuple(cfg['rrc_scale']), interpolation=cfg['interpolation'],
                         auto_augment=cfg['auto_augment'] + '-mmax9', re_prob=0., mean=tuple(cfg['mean']),
                         std=tuple(cfg['std']), num_workers=workers, persistent_workers=False)


def _ours_loader(root: str, cfg: dict, workers: int):
    """Our training loader (OpenCV's bicubic resize through albumentations) and the float32 normalisation on
    the device that the trainer applies to its uint8 batches (``tkvision.data.BatchPreprocessor``), so
    that it delivers what timm's prefetching loader delivers."""
    data = section(dict(cfg, num_workers=workers, data_dir=root, dataset='folder'), 'data')
    loader = build_loader(build_dataset(data, 'train', cfg['seed']), data, train=True, seed=cfg['seed'])
    set_loader_epoch(loader, 0)
    preprocess = BatchPreprocessor(cfg['mean'], cfg['std'], torch.device('cpu'))
    return ((preprocess(images, train=True), targets) for images, targets, _ in loader)


#: The loaders compared: ours, timm's with its default prefetching (the like-for-like figure), and timm's
#: without it (workers normalise and ship float32).
LOADERS = {'tkvision': _ours_loader,
           'timm': lambda root, cfg, workers: _timm_loader(root, cfg, workers, prefetch=True),
           'timm (no prefetcher)': lambda root, cfg, workers: _timm_loader(root, cfg, workers, prefetch=False)}


def _epoch_rate(loader, warm_batches: int) -> float:
    """img/s over one pass of ``loader`` after its first ``warm_batches`` (worker start-up excluded)."""
    it, n = iter(loader), 0
    for _ in range(warm_batches):
        next(it)
    t0 = time.perf_counter()
    for batch in it:
        n += len(batch[0])
    rate = n / (time.perf_counter() - t0)
    del it
    return rate


def benchmark_loaders(root=None, n_images=1024, workers=(1, 2), batch_size=32, repeats=3, log=print) -> list:
    """Our training loader (``tkvision.data.build_loader``: simplejpeg decoding, albumentations with
    OpenCV's bicubic resize, uint8 batches normalised to float32 on the device) against timm's
    ``create_loader`` (PIL decoding, torchvision transforms with Pillow's bicubic resize) with its default
    prefetcher (uint8 batches normalised on the device: like for like) and without it (``LOADERS``), with
    the ImageNet recipe's augmentations, on ImageNet-like JPEGs (Fashion-MNIST upscaled to 500 x 375,
    quality 90, unless ``root`` is given), for each worker count; the loaders interleaved over ``repeats``
    rounds of one pass each, on the CPU.

    Returns:
        rows ``loader, workers, resize, img_per_s, img_per_s_per_worker`` (medians over the rounds) and, on our
        rows, ``vs_timm`` (the median over rounds of our img/s over timm's prefetching loader's in the same
        round), ``vs_timm_no_prefetcher`` and ``ratio_runs``.
    """
    import statistics
    torch.set_num_threads(1)
    if root is None:
        root = make_jpeg_folder(os.path.join(tempfile.mkdtemp(prefix='tkvision-loader-bench-'), 'jpeg'), n_images)
    recipe = load_config(os.path.join(ROOT, _RECIPE), dict(data_dir=root, batch_size=batch_size,
                                                           model='tokenformer_vit_b16'))
    cfg = resolve_run_config(recipe).to_dict()
    resize = {'tkvision': 'OpenCV bicubic (albumentations)', 'timm': 'Pillow bicubic (torchvision)',
              'timm (no prefetcher)': 'Pillow bicubic (torchvision)'}
    rows = []
    for w in workers:
        rates = {name: [] for name in LOADERS}
        for _ in range(repeats):
            for name, build in LOADERS.items():
                rates[name].append(_epoch_rate(build(root, cfg, w), warm_batches=max(w, 1)))
        for name in LOADERS:
            rate = statistics.median(rates[name])
            row = dict(loader=name, workers=w, resize=resize[name], img_per_s=rate, img_per_s_per_worker=rate / w)
            if name == 'tkvision':
                paired = [a / b for a, b in zip(rates['tkvision'], rates['timm'])]
                unpaired = [a / b for a, b in zip(rates['tkvision'], rates['timm (no prefetcher)'])]
                row.update(vs_timm=statistics.median(paired), vs_timm_no_prefetcher=statistics.median(unpaired),
                           ratio_runs=' '.join(f'{r:.3f}' for r in paired))
            rows.append(row)
            log(f'loader {name:21s} {w} worker(s) {rate:8.1f} img/s ({rate / w:.1f} per worker)')
    return rows
