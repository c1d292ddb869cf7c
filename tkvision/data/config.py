"""The data section: the images, how they are read, augmented and batched (``DataConfig``), the ``Config`` of this
package (`tkvision.utils.config_fields`): every builder here takes it, and where it draws random numbers, the run's
seed.
"""
import dataclasses
from typing import NamedTuple, Optional, Tuple

from ..utils.config_fields import boolean, choice, integer, key, number, numbers, rule, string
from .registry import data_source

__all__ = ['DataConfig', 'ImageSettings', 'INTERPOLATIONS']

#: Interpolation names accepted by ``interpolation`` (timm's names; 'random' picks one per image).
INTERPOLATIONS = ('bicubic', 'bilinear', 'nearest', 'area', 'lanczos', 'random')

#: ``dataset``: a name a registered data source reads (``tkvision.data.registry``).
DATASET_RULE = rule(lambda v: data_source(v) is not None,
                    "a registered data source (tkvision.data.registry.data_source_names(): 'fashion_mnist', 'cifar10', "
                    "'folder' (or 'imagenet'), 'tar', 'wds/<name>' or 'hfds/<name>' built in)")



def _is_rand_augment(value) -> bool:
    """A RandAugment string timm's ``rand_augment_transform`` reads (``rand-m9-mstd0.5-inc1``), or null."""
    if value is None:
        return True
    if not (isinstance(value, str) and value.startswith('rand')):
        return False
    from timm.data.auto_augment import rand_augment_transform
    try:
        rand_augment_transform(value, {})
    except (AssertionError, ValueError, KeyError, IndexError):
        return False
    return True


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The images, how they are read, augmented and batched (the ``data`` section)."""

    dataset: str = key('fashion_mnist', allowed=DATASET_RULE)
    """``'fashion_mnist'``, ``'cifar10'`` (its archives, class folders or torchvision's files: `tkvision.data.cifar10`),
    ``'folder'`` (= ``'imagenet'``: ``train/<class>/*``, ``val/<class>/*``), ``'tar'``, ``'wds/<name>'`` (WebDataset
    shards) or ``'hfds/<name>'`` (a Hugging Face dataset)."""
    data_dir: Optional[str] = key(None, allowed=string(null=True), resume=True)
    """Where the dataset is; null: Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (every other dataset
    needs it, but ``cifar10`` with ``download: true``, which downloads into ``./data``)."""
    download: bool = key(False, allowed=boolean(), resume=True)
    """``fashion_mnist`` and ``cifar10`` only: torchvision's download when the files are not found (needs internet)."""
    img_size: Optional[int] = key(None, allowed=integer(1, null=True))
    """Training and evaluation size in px; null: the size of the model's input (its ``img_size``, else its
    ``pretrained_cfg``: ``timm.data.resolve_data_config``), or the dataset's (Fashion-MNIST's 28, CIFAR-10's 32)."""
    mean: Optional[Tuple[float, ...]] = key(None, allowed=numbers(null=True))
    """Per-channel mean subtracted from pixels in [0, 1]; null: the dataset's (Fashion-MNIST, CIFAR-10), or the
    model's."""
    std: Optional[Tuple[float, ...]] = key(None, allowed=numbers(0, lo_open=True, null=True))
    """Per-channel standard deviation pixels are divided by; null: the dataset's (Fashion-MNIST, CIFAR-10), or the
    model's."""
    crop_pct: Optional[float] = key(None, allowed=number(0, 1, lo_open=True, null=True))
    """Evaluation: resize to ``img_size / crop_pct``, centre-crop ``img_size``; null: the model's."""
    interpolation: Optional[str] = key(None, allowed=choice(*INTERPOLATIONS, None))
    """One of ``INTERPOLATIONS``; ``'random'`` draws one per image (timm); null: the model's."""
    rrc_scale: Optional[Tuple[float, float]] = key((0.08, 1.0),
                                                   allowed=numbers(0, 1, lo_open=True, length=2, null=True))
    """RandomResizedCrop's area range; null: no crop."""
    crop_padding: int = key(0, allowed=integer(0))
    """Random translation: zero-pad each side by this many px, crop ``img_size`` back at random (torchvision's
    ``RandomCrop(padding=...)``); 0: off."""
    hflip: float = key(0.5, allowed=number(0, 1))
    """Probability of a horizontal flip."""
    auto_augment: Optional[str] = key(None, allowed=rule(_is_rand_augment, "a timm RandAugment string such as "
                                                                          "'rand-m9-mstd0.5-inc1', or null"))
    """A timm RandAugment string, e.g. ``rand-m9-mstd0.5-inc1``; null: off."""
    reprob: float = key(0.0, allowed=number(0, 1))
    """Random erasing probability (timm's ``RandomErasing``, mode ``'pixel'``, on the device)."""
    batch_size: int = key(128, allowed=integer(1))
    """Images per process and micro-batch."""
    num_workers: int = key(0, allowed=integer(0), resume=True)
    """Loader worker processes per process; 0: load in the training process."""
    train_subset: Optional[int] = key(None, allowed=integer(1, null=True))
    """Train on N training images only, a stratified subset (every class in its share, the same images for every run
    and seed: ``tkvision.data.datasets.stratified_subset``; tests, quick probes); null: all."""
    val_subset: Optional[int] = key(None, allowed=integer(1, null=True), resume=True)
    """Validate on N validation images only, a stratified subset as ``train_subset``'s; null: all."""
    val_split_fraction: Optional[float] = key(None, allowed=number(0, 1, hi_open=True, null=True))
    """Validation images held out of train (stratified, the same for every run; `tkvision.data.datasets`);
    null: 1/6 for Fashion-MNIST (10k of 60k; its 10k test images become the test split), 1/10 for CIFAR-10 (5k of
    50k; its 10k test images become the test split), 0 otherwise (the dataset's own ``val/`` validates, and there is
    no test split)."""
    naflex_loader: bool = key(False, allowed=boolean())
    """timm's NaFlex loader (`tkvision.data.naflex`; a NaFlex model: ``naflexvit_tokenformer_*``, timm's
    ``naflexvit_*``): every image at its own aspect ratio as a padded patch sequence."""
    naflex_train_seq_lens: Tuple[int, ...] = key((128, 256, 576, 784, 1024), allowed=numbers(1))
    """Patch-sequence lengths a training batch is drawn at, one per batch (timm's)."""
    naflex_max_seq_len: int = key(576, allowed=integer(1))
    """Evaluation: every image resized to at most this many patches."""
    naflex_patch_sizes: Optional[Tuple[int, ...]] = key(None, allowed=numbers(1, null=True))
    """Patch sizes drawn uniformly per training batch; null: the model's."""
    naflex_loss_scale: str = key('linear', allowed=choice('linear', 'sqrt', 'none'))
    """Each NaFlex batch's loss times (its images / ``batch_size``): ``'linear'``, ``'sqrt'`` or ``'none'``."""

    def image_settings(self) -> 'ImageSettings':
        """The keys ``tkvision.data.resolve_data_cfg`` fills from the model, of a resolved section.

        Raises:
            ValueError: one of them is still null (named): resolve the section first.
        """
        if (self.img_size is None or self.mean is None or self.std is None or self.crop_pct is None
                or self.interpolation is None):
            unset = [k for k in ImageSettings._fields if getattr(self, k) is None]
            raise ValueError(f'data keys {unset} are null: resolve the section first (tkvision.data.resolve_data_cfg, '
                             'or tkvision.engine.config.resolve_run_config)')
        return ImageSettings(self.img_size, self.mean, self.std, self.crop_pct, self.interpolation)

    def mean_std(self) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
        """``(mean, std)`` of a resolved section (`image_settings`).

        Raises:
            ValueError: a key of `image_settings` is still null.
        """
        settings = self.image_settings()
        return settings.mean, settings.std


class ImageSettings(NamedTuple):
    """What a resolved data section says of its images (`DataConfig.image_settings`): ``img_size`` px,
    per-channel ``mean`` and ``std`` of pixels in [0, 1], the evaluation ``crop_pct``, the ``interpolation``."""
    img_size: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    crop_pct: float
    interpolation: str
