"""``tools/make_shards.py`` (``tkvision-make-shards``), ``tools/make_subset.py`` (``tkvision-make-subset``) and
``tools/data_stats.py`` (``tkvision-data-stats``)."""
import argparse
import csv
import datetime
import os
from typing import Optional, Sequence

from ..data.fashion_mnist import parse_sizes, write_image_folder
from ..data.shards import INFO_NAME, make_shards
from ..data.subset import PRESETS, make_subset
from .common import run_cli

__all__ = ['make_shards_main', 'make_subset_main', 'data_stats_main']


def _make_shards(argv) -> int:
    ap = argparse.ArgumentParser(description='Write WebDataset tar shards of an ImageNet-layout folder.')
    ap.add_argument('--src', required=True, help='folder with <split>/<class>/<image>')
    ap.add_argument('--out', required=True, help='shard folder to create')
    ap.add_argument('--splits', nargs='+', default=['train', 'val'])
    ap.add_argument('--max-count', type=int, default=10000, help='images per shard at most')
    ap.add_argument('--max-size', type=float, default=1e9, help='bytes per shard at most')
    a = ap.parse_args(argv)
    m = make_shards(a.src, a.out, tuple(a.splits), a.max_count, a.max_size)
    for split, s in m['splits'].items():
        print(f"{split}: {s['num_samples']} images in {len(s['filenames'])} shards, {len(s['class_counts'])} classes")
    print(f"wrote {os.path.join(a.out, INFO_NAME)}")
    return 0


def make_shards_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-make-shards`` / ``tools/make_shards.py``: see ``--help``; user errors are one line (exit 2)."""
    return run_cli(_make_shards, argv)


def _make_subset(argv) -> int:
    ap = argparse.ArgumentParser(description='Write an ImageNet-layout subset as a folder or shards.')
    ap.add_argument('--src', required=True, help="ImageNet-layout folder (train/, val/), or 'fashion-mnist': write "
                    'Fashion-MNIST as such a folder of RGB JPEGs at --size px (train/ from its training images, '
                    'val/ from its test images; --train-per-class / --val-per-class of each class)')
    ap.add_argument('--size', type=int, default=224, help="--src fashion-mnist: image size in px")
    ap.add_argument('--sizes', nargs='+', help='--src fashion-mnist: several HEIGHTxWIDTH sizes instead of --size '
                    '(e.g. 32x32 48x96 96x48 64x64), taken in turn within each class: mixed resolutions and '
                    'aspect ratios for NaFlex models')
    ap.add_argument('--out', required=True, help='new folder for the subset')
    ap.add_argument('--preset', choices=sorted(PRESETS), help='classes and images per class of a named subset')
    ap.add_argument('--num-classes', type=int)
    ap.add_argument('--classes', help='file with one class name per line (instead of --num-classes)')
    ap.add_argument('--train-per-class', type=int)
    ap.add_argument('--val-per-class', type=int)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--format', default='folder', choices=['folder', 'shards'])
    ap.add_argument('--link', action='store_true', help='symbolic links instead of copies')
    a = ap.parse_args(argv)
    if a.src == 'fashion-mnist':
        sizes = parse_sizes(a.sizes) if a.sizes else [(a.size, a.size)]
        counts = write_image_folder(a.out, a.size, a.train_per_class or 100, a.val_per_class or 20, sizes=sizes)
        shown = ' '.join(f'{h}x{w}' for h, w in sizes)
        print(f"wrote {a.out}: {counts['train']} train / {counts['val']} val Fashion-MNIST JPEGs at {shown} px")
        return 0
    n, k_train, k_val = PRESETS.get(a.preset, (a.num_classes, a.train_per_class, a.val_per_class))
    classes = None
    if a.classes:
        with open(a.classes) as f:
            classes = [ln.strip() for ln in f if ln.strip()]
    counts = make_subset(a.src, a.out, n, classes, k_train, k_val, a.seed, a.format, a.link)
    for split, per in counts.items():
        print(f'{split}: {sum(per.values())} images in {len(per)} classes (fewest {min(per.values())})')
    print(f'wrote {a.out}')
    return 0


def make_subset_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-make-subset`` / ``tools/make_subset.py``: see ``--help``; user errors are one line (exit 2)."""
    return run_cli(_make_subset, argv)


def _data_stats(argv) -> int:
    from ..data.cifar10 import channel_stats, load_cifar10
    from ..data.fashion_mnist import load_fashion_mnist
    from ..experiments.benchmark import code_commit, machine_info
    from ..utils.files import atomic_write
    import torch
    loaders = {'cifar10': load_cifar10, 'fashion_mnist': load_fashion_mnist}
    ap = argparse.ArgumentParser(description="The per-channel mean and standard deviation of a dataset's training "
                                 'split in [0, 1] units (what its data source records as its mean and std).')
    ap.add_argument('--dataset', required=True, choices=sorted(loaders), help='an in-memory data source')
    ap.add_argument('--data_dir', '--data-dir', help='where the dataset is (as the data_dir key)')
    ap.add_argument('--out', help='a CSV file to write the figures into (with machine, date and commit)')
    a = ap.parse_args(argv)
    images, _ = loaders[a.dataset]('train', a.data_dir)
    stats = channel_stats(images if images.ndim == 4 else images[..., None])
    rows = [dict(dataset=a.dataset, split='train', images=len(images), channel=c, mean=f'{m:.6f}', std=f'{s:.6f}',
                 date=datetime.date.today().isoformat(), machine=machine_info(torch.device('cpu')),
                 commit=code_commit(), command=f'tkvision-data-stats --dataset {a.dataset}')
            for c, (m, s) in enumerate(zip(stats['mean'], stats['std']))]
    for row in rows:
        print(f"{a.dataset} train, channel {row['channel']}: mean {row['mean']}, std {row['std']} "
              f"({row['images']} images)")
    if a.out:
        def write(f):
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        atomic_write(a.out, write, text=True)
        print(f'wrote {a.out}')
    return 0


def data_stats_main(argv: Optional[Sequence[str]] = None) -> int:
    """``tkvision-data-stats`` / ``tools/data_stats.py``: a dataset's channel statistics (see ``--help``); user
    errors are one line (exit 2)."""
    return run_cli(_data_stats, argv)
