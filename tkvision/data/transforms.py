"""Transforms: the albumentations pipeline that workers run on uint8 images, the device-side
`BatchPreprocessor`, and `resolve_data_cfg`, which fills the data keys a config leaves
null from the model's ``pretrained_cfg``.

Augmentation (the MAE / MMPretrain supervised recipe, ``docs/reference/background.md``, "Recipes"):
albumentations for RandomResizedCrop (bicubic), translation and flip, timm's RandAugment
(``rand-m9-mstd0.5-inc1``) for the op albumentations lacks. Workers return **uint8** batches (a
quarter of float32's bytes through shared memory and the host-to-device copy); normalisation and
random erasing run on the device in `BatchPreprocessor`, as timm's ``PrefetchLoader`` does;
mixup/cutmix and label smoothing are applied per batch by the trainer with timm's ``Mixup``.

albumentations and OpenCV are imported where a pipeline is built, so the rest of `tkvision.data`
(Fashion-MNIST, readers, `resolve_data_cfg`) imports without them: a GPU image without
albumentations runs the GPU report (``studies/performance/gpu_report.py``).
"""
import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import numpy as np
import timm
import timm.data
import torch
from PIL import Image
from timm.data.auto_augment import rand_augment_transform
from timm.data.random_erasing import RandomErasing

from ..utils.config_fields import frozen_value
from .config import DataConfig, ImageSettings
from .registry import data_source

if TYPE_CHECKING:  # imported where a pipeline is built (module docstring)
    import albumentations

__all__ = ['DATA_CFG_KEYS', 'RAND_AUGMENT_MAGNITUDE_MAX', 'build_transform', 'BatchPreprocessor', 'resolve_data_cfg']

#: Data keys resolved from the model's pretrained_cfg (or the data source's image settings) when null.
DATA_CFG_KEYS = ImageSettings._fields


class _PILOp:
    """A PIL-image transform applied to uint8 HWC arrays (picklable, for DataLoader workers)."""

    def __init__(self, op):
        self.op = op

    def __call__(self, img, **_):
        # np.array, not np.asarray: Pillow's buffer is read-only, and torch.from_numpy warns on a read-only array
        return np.array(self.op(Image.fromarray(img)))


#: RandAugment magnitude cap: timm clips the noisy magnitude (m9, mstd 0.5) to 10, where its increasing
#: Posterize keeps 4 - int(10 / 10 * 4) = 0 bits, which Pillow >= 11 rejects (ValueError) about once in
#: 40 Posterize draws. Capping just below 10 keeps >= 1 bit and changes the other ops by <= 0.1%.
RAND_AUGMENT_MAGNITUDE_MAX = 9.99


def _rand_augment_op(config_str: str, img_size: int, mean):
    """timm's RandAugment (PIL) as an albumentations op on uint8 HWC arrays (see RAND_AUGMENT_MAGNITUDE_MAX)."""
    hparams = dict(translate_const=int(img_size * 0.45), img_mean=tuple(round(255 * m) for m in mean))
    if 'mmax' not in config_str:
        hparams['magnitude_max'] = RAND_AUGMENT_MAGNITUDE_MAX
    ra = rand_augment_transform(config_str, hparams)
    import albumentations as A
    return A.Lambda(image=_PILOp(ra), name='rand_augment')


#: timm's interpolation names -> OpenCV's ``INTER_*`` attribute names.
_CV2_INTERPOLATION = {'bicubic': 'INTER_CUBIC', 'bilinear': 'INTER_LINEAR', 'nearest': 'INTER_NEAREST',
                      'area': 'INTER_AREA', 'lanczos': 'INTER_LANCZOS4'}


def _interpolations(name: str, train: bool) -> list:
    """cv2 codes for ``name``; timm's 'random' is bilinear or bicubic drawn per image (bicubic at eval)."""
    import cv2
    if name == 'random':
        return [cv2.INTER_LINEAR, cv2.INTER_CUBIC] if train else [cv2.INTER_CUBIC]
    if name not in _CV2_INTERPOLATION:
        raise ValueError(f"interpolation must be one of {', '.join(list(_CV2_INTERPOLATION) + ['random'])}, got "
                         f"{name!r}")
    return [getattr(cv2, _CV2_INTERPOLATION[name])]


def build_transform(
        data: DataConfig,
        train: bool,
        seed: int,
        resize: bool = True,
) -> 'albumentations.Compose':
    """albumentations pipeline of the data section ``data`` (resolved: `resolve_data_cfg`):
    uint8 HWC array -> uint8 tensor ``[C, img_size, img_size]``; ``seed`` seeds its generators until a
    sample's own seed replaces it (`tkvision.data.loader.seed_sample`).

    Train: RandomResizedCrop(img_size, rrc_scale, interpolation) → random translation
    (``crop_padding`` > 0: zero-pad each side by ``crop_padding`` px and RandomCrop img_size back,
    i.e. a uniform shift of up to ``crop_padding`` px per axis, as torchvision's
    ``RandomCrop(padding=...)``) → HorizontalFlip(hflip) → RandAugment(auto_augment) → tensor.
    Eval: resize the short side to img_size / crop_pct, center crop img_size (as timm's eval
    transform for a model's ``pretrained_cfg``) → tensor. ``resize=False`` (data already at img_size,
    e.g. Fashion-MNIST) skips crop and resize when ``rrc_scale`` is null. Normalisation and random
    erasing are not here: `BatchPreprocessor` applies them on the device.

    Raises:
        ValueError: an unknown ``interpolation`` (the message lists the valid names), or a data key
            still null (call `resolve_data_cfg` first).
    """
    import albumentations as A
    import cv2
    from albumentations.pytorch import ToTensorV2
    cfg, image = data, data.image_settings()
    size, mean = image.img_size, image.mean
    interps = _interpolations(image.interpolation, train)

    def one_of(make):  # 'random' interpolation: one op per mode, one drawn per image
        ops = [make(i) for i in interps]
        return ops[0] if len(ops) == 1 else A.OneOf(ops, p=1.0)
    ops = []
    if train:
        if cfg.rrc_scale:
            ops.append(one_of(lambda i: A.RandomResizedCrop((size, size), scale=tuple(cfg.rrc_scale),
                                                            interpolation=i)))
        elif resize:
            ops.append(one_of(lambda i: A.Resize(size, size, interpolation=i)))
        if cfg.crop_padding:
            pad = size + 2 * cfg.crop_padding
            ops += [A.PadIfNeeded(pad, pad, border_mode=cv2.BORDER_CONSTANT, fill=0),
                    A.RandomCrop(size, size)]
        if cfg.hflip:
            ops.append(A.HorizontalFlip(p=cfg.hflip))
        if cfg.auto_augment:
            ops.append(_rand_augment_op(cfg.auto_augment, size, mean))
    elif resize:
        ops += [A.SmallestMaxSize(max_size=int(size / image.crop_pct), interpolation=interps[0]),
                A.CenterCrop(size, size)]
    ops.append(ToTensorV2())
    return A.Compose(ops, seed=seed)


class BatchPreprocessor:
    """Device-side step of the input pipeline: uint8 ``[B, C, H, W]`` → normalised float32, then
    (training) timm's ``RandomErasing(mode='pixel')``, which fills each erased box with per-pixel
    N(0, 1) noise in normalised space, as timm's and MAE's recipes do.

    Args:
        mean: per-channel values in [0, 1] units (timm's ``IMAGENET_DEFAULT_MEAN`` style).
        std: per-channel values in [0, 1] units (timm's ``IMAGENET_DEFAULT_MEAN`` style).
        reprob: random-erasing probability per image (0: off).
        device: where the batches are processed (copies are non-blocking from pinned memory).
    """

    def __init__(
            self,
            mean: Sequence[float],
            std: Sequence[float],
            device: Union[str, torch.device],
            reprob: float = 0.0,
    ):
        self.device = torch.device(device)
        self.mean = torch.tensor(mean, device=self.device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=self.device).view(1, -1, 1, 1) * 255
        self.erase = (RandomErasing(reprob, mode='pixel', device=self.device.type) if reprob else None)

    def __call__(self, images: torch.Tensor, train: bool = False) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
        return self.erase(x) if (train and self.erase is not None) else x


def resolve_data_cfg(
        data: DataConfig,
        model: str,
        model_kwargs: Mapping[str, Any],
) -> DataConfig:
    """A copy of the data section ``data`` with every null key of `DATA_CFG_KEYS` filled in: from the data source's
    ``image_settings`` where it fixes them (``tkvision.data.registry.DataSource``: Fashion-MNIST's), else from the
    ``pretrained_cfg`` of ``timm.create_model(model, **model_kwargs)`` with ``timm.data.resolve_data_config`` (built
    on the meta device: no memory, no weights); ``img_size`` from ``model_kwargs['img_size']`` when given; a null
    ``val_split_fraction`` from the source's (``DataSource.val_split_fraction``). Keys the config sets are kept."""
    source = data_source(data.dataset)
    if data.val_split_fraction is None:
        data = dataclasses.replace(data, val_split_fraction=source.val_split_fraction if source else 0.0)
    unset = [k for k in DATA_CFG_KEYS if getattr(data, k) is None]
    if not unset:
        return data
    if source is not None and source.image_settings is not None:
        found = dict(source.image_settings)
        found['img_size'] = model_kwargs.get('img_size', found['img_size'])
    else:
        with torch.device('meta'):
            net = timm.create_model(model, **model_kwargs)
        dc = timm.data.resolve_data_config(args={}, model=net)
        found = dict(img_size=model_kwargs.get('img_size', dc['input_size'][-1]), mean=tuple(dc['mean']),
                     std=tuple(dc['std']), crop_pct=dc['crop_pct'], interpolation=dc['interpolation'])
    return dataclasses.replace(data, **{k: frozen_value(found[k]) for k in unset})
