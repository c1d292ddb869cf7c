"""Data: datasets and readers, transforms, loaders and samplers, decoding, shards and subsets.

- `fashion_mnist`: Fashion-MNIST in memory (the Debian package ``dataset-fashion-mnist``);
- `readers`: decoding (bad images skipped and counted) and timm's readers;
- `transforms`: albumentations pipelines, the device-side `BatchPreprocessor`, and
  `resolve_data_cfg` (null data keys from the model's ``pretrained_cfg``);
- `loader`: samplers and loaders whose augmentations depend only on (seed, epoch, index);
- `datasets`: `build_dataset` of a config's data section;
- `shards`, `subset`: WebDataset shards and ImageNet-layout subsets.

Every builder takes the config's data section (`tkvision.data.config.DataConfig`) and, where
it draws random numbers, the run's seed.
"""
from .config import DataConfig
from .datasets import (build_dataset, data_source_of, dataset_classes, dataset_size, default_num_classes, split_size,
                       has_test_split, holdout_indices, train_class_map)
from .fashion_mnist import FASHION_MNIST_DIR, FASHION_MNIST_STATS, ArrayDataset, load_fashion_mnist
from .loader import ResumableSampler, SeededDataset, batches_per_epoch, build_loader, seed_sample, set_loader_epoch
from .readers import ReaderDataset, collate_skip_bad, decode_image
from .transforms import DATA_CFG_KEYS, BatchPreprocessor, build_transform, resolve_data_cfg

__all__ = ['DataConfig', 'default_num_classes', 'data_source_of',
           'FASHION_MNIST_DIR', 'FASHION_MNIST_STATS', 'load_fashion_mnist', 'ArrayDataset', 'ReaderDataset',
           'build_transform', 'decode_image', 'resolve_data_cfg', 'build_dataset', 'has_test_split',
           'holdout_indices', 'build_loader', 'set_loader_epoch', 'batches_per_epoch', 'dataset_size', 'split_size',
           'dataset_classes', 'train_class_map', 'collate_skip_bad', 'seed_sample', 'ResumableSampler',
           'SeededDataset', 'BatchPreprocessor', 'DATA_CFG_KEYS']
