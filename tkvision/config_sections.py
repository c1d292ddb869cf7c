"""The config as typed, frozen sections: one dataclass per section, a field per key with its type, default and
meaning.

A config file stays flat (``lr: 1e-3``, ``model_kwargs: {...}``; `tkvision.engine.config`); the training engine
reads it as a `TrainConfig`, built once, after validation, at the edge of ``tkvision.engine.trainer.train``:
each part then receives the section it reads (the data its `DataConfig`, the optimizer its `OptimConfig`) and
cannot change it. Lists become tuples and mappings read-only views, so a section is frozen all the way down.
The module sits at the top of the package, importing nothing of it, so every layer (``data``, ``engine``) can
read the sections.

These classes are the schema: `tkvision.engine.config.SECTIONS` and ``DEFAULTS`` (the flat defaults every file
is merged over) and ``docs/reference/config.md`` (``tools/render_reference.py``) are read from their fields and
the docstring under each field. What each key allows is `tkvision.engine.config_rules.RULES`. Recipe values
come from the MAE paper, Appendix A.2 (https://arxiv.org/abs/2111.06377).
"""
import dataclasses
from types import MappingProxyType
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

__all__ = ['RunConfig', 'ModelConfig', 'DecoderConfig', 'MaeConfig', 'DataConfig', 'ImageSettings', 'OptimConfig',
           'ElasticConfig', 'DistillationConfig', 'GrowthConfig', 'TrainConfig', 'SECTION_CLASSES', 'section_defaults',
           'section', 'frozen_value', 'plain_value']



@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What runs where, and when a run evaluates, saves and reports (the ``run`` section)."""

    task: str = 'classify'
    """``'classify'`` (supervised), ``'mae'`` (masked-autoencoder pretraining, no labels read) or ``'linprobe'``
    (the ``init_from`` encoder frozen, BatchNorm + linear head: MAE's linear probing)."""
    seed: int = 0
    """The run's seed: initial weights, data order, augmentation and every random draw derive from it."""
    device: Optional[str] = None
    """Where the model runs (``'cpu'``, ``'cuda'``, ``'cuda:1'``); null: CUDA if available, else the CPU."""
    threads: Optional[int] = None
    """``torch.set_num_threads``; null: the cores this process may use (its affinity, shared among a node's
    processes)."""
    amp: Optional[str] = None
    """Mixed precision: null (float32), ``'bf16'`` or ``'fp16'`` (with a gradient scaler)."""
    tf32: bool = True
    """CUDA: TF32 matmuls and convolutions for float32 work."""
    output: str = 'runs/default'
    """The run's folder (checkpoints, weights, metrics.csv, config.yaml); a run never writes into another's."""
    eval_every: int = 1
    """Epochs between evaluations on the validation split (the last epoch always evaluates)."""
    save_every: int = 1
    """Epochs between checkpoints (``last.pth``; the last epoch always saves)."""
    checkpoint_every_steps: Optional[int] = None
    """Also write ``last.pth`` every N optimizer updates (mid-epoch); null: off."""
    checkpoint_every_minutes: Optional[float] = None
    """Also write ``last.pth`` when this many minutes passed since the last one; null: off."""
    tensorboard: bool = False
    """Write TensorBoard scalars to ``<output>/tb`` (needs the ``tensorboard`` extra)."""
    log_interval: int = 50
    """Optimizer updates between progress updates, loss checks and signal checks."""
    dist_timeout_minutes: float = 10
    """Minutes a collective waits for another process before the job fails (a process that died)."""
    progress: bool = True
    """Show a progress bar per epoch (rank 0)."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network: its registry name, its arguments, and how it runs (the ``model`` section)."""

    model: str = 'tokenformer_vit_ti16'
    """A name ``timm.create_model`` knows (``tokenformer_vit_b16``, timm's ``vit_base_patch16_224``, ...)."""
    model_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Passed to ``timm.create_model`` (``img_size``, ``patch_size``, ``num_tokens``, ``num_classes``, ...)."""
    drop_path_rate: float = 0.0
    """Stochastic depth: the drop rate of the last block (timm's linear rule over the blocks)."""
    init_from: Optional[str] = None
    """A weights file to start from (``.safetensors`` / ``.pth``; an MAE checkpoint gives its encoder); a
    smaller TokenFormer's tokens are grown to fit."""
    freeze_loaded_tokens: bool = False
    """With ``init_from``: train only the tokens appended to the loaded ones (and the head)."""
    grad_checkpointing: bool = False
    """Recompute each block's activations in the backward pass (less memory, more time)."""
    compile: Union[bool, str] = 'auto'
    """``torch.compile`` the model: true, false, or ``'auto'`` (on for CUDA, where a TokenFormer trains at
    0.85x ViT-B compiled against 0.37x eager; off on a CPU, where compiling costs what it saves over the quick
    recipe: docs/performance.md)."""
    backward_mode: str = 'closed_form'
    """Pattention's Θ (``tkvision.layers.BACKWARD_MODES``): ``'closed_form'``, ``'compiled'`` (the closed form
    through torch.compile, one pass each way), ``'lean'`` (least activation memory), ``'autograd'``
    (reference)."""


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """MAE's decoder (the ``decoder`` key of the ``mae`` section): 512 wide, 8 blocks, 16 heads by default."""

    embed_dim: int = 512
    """Width of the decoder's tokens."""
    depth: int = 8
    """Decoder blocks."""
    num_heads: int = 16
    """Attention heads per decoder block (``embed_dim`` must divide by it)."""
    num_tokens: Optional[int] = None
    """A TokenFormer decoder's parameter tokens per Pattention; null: ``embed_dim``."""
    kind: Optional[str] = None
    """``'tokenformer'`` or ``'vit'``; null: a TokenFormer decoder for a TokenFormer encoder, else a ViT's."""


@dataclasses.dataclass(frozen=True)
class MaeConfig:
    """Masked-autoencoder pretraining (``task: mae``; `tkvision.models.mae`) (the ``mae`` section)."""

    mask_ratio: float = 0.75
    """Fraction of each image's patches masked."""
    norm_pix_loss: bool = True
    """Regress each patch's pixels normalised by their own mean and variance (MAE's default)."""
    decoder: DecoderConfig = DecoderConfig()
    """The decoder's shape."""
    recon_images: int = 8
    """Validation images in the ``reconstruction.png`` written at the end; 0: none."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The images, how they are read, augmented and batched (the ``data`` section)."""

    dataset: str = 'fashion_mnist'
    """``'fashion_mnist'``, ``'folder'`` (= ``'imagenet'``: ``train/<class>/*``, ``val/<class>/*``), ``'tar'``,
    ``'wds/<name>'`` (WebDataset shards) or ``'hfds/<name>'`` (a Hugging Face dataset)."""
    data_dir: Optional[str] = None
    """Where the dataset is; null: Fashion-MNIST from the Debian package ``dataset-fashion-mnist``."""
    download: bool = False
    """``fashion_mnist`` only: torchvision's download when the Debian package is absent."""
    img_size: Optional[int] = None
    """Training and evaluation size in px; null: from the model's ``pretrained_cfg``
    (``timm.data.resolve_data_config``), or Fashion-MNIST's 28."""
    mean: Optional[Tuple[float, ...]] = None
    """Per-channel mean subtracted from pixels in [0, 1]; null: the model's, or Fashion-MNIST's."""
    std: Optional[Tuple[float, ...]] = None
    """Per-channel standard deviation pixels are divided by; null: the model's, or Fashion-MNIST's."""
    crop_pct: Optional[float] = None
    """Evaluation: resize to ``img_size / crop_pct``, centre-crop ``img_size``; null: the model's."""
    interpolation: Optional[str] = None
    """One of ``INTERPOLATIONS``; ``'random'`` draws one per image (timm); null: the model's."""
    rrc_scale: Optional[Tuple[float, float]] = (0.08, 1.0)
    """RandomResizedCrop's area range; null: no crop."""
    crop_padding: int = 0
    """Random translation: zero-pad each side by this many px, crop ``img_size`` back at random (torchvision's
    ``RandomCrop(padding=...)``); 0: off."""
    hflip: float = 0.5
    """Probability of a horizontal flip."""
    auto_augment: Optional[str] = None
    """A timm RandAugment string, e.g. ``rand-m9-mstd0.5-inc1``; null: off."""
    reprob: float = 0.0
    """Random erasing probability (timm's ``RandomErasing``, mode ``'pixel'``, on the device)."""
    batch_size: int = 128
    """Images per process and micro-batch."""
    num_workers: int = 0
    """Loader worker processes per process; 0: load in the training process."""
    train_subset: Optional[int] = None
    """Train on the first N training images only (tests, quick probes); null: all."""
    val_subset: Optional[int] = None
    """Validate on the first N validation images only; null: all."""
    val_split_fraction: Optional[float] = None
    """Validation images held out of train (stratified, the same for every run; `tkvision.data.datasets`);
    null: 1/6 for Fashion-MNIST (10k of 60k; its 10k test images become the test split), 0 otherwise (the
    dataset's own ``val/`` validates, and there is no test split)."""
    naflex_loader: bool = False
    """timm's NaFlex loader (`tkvision.data.naflex`; a NaFlex model: ``naflexvit_tokenformer_*``, timm's
    ``naflexvit_*``): every image at its own aspect ratio as a padded patch sequence."""
    naflex_train_seq_lens: Tuple[int, ...] = (128, 256, 576, 784, 1024)
    """Patch-sequence lengths a training batch is drawn at, one per batch (timm's)."""
    naflex_max_seq_len: int = 576
    """Evaluation: every image resized to at most this many patches."""
    naflex_patch_sizes: Optional[Tuple[int, ...]] = None
    """Patch sizes drawn uniformly per training batch; null: the model's."""
    naflex_loss_scale: str = 'linear'
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


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its schedule and the loss's regularisers (the ``optim`` section). Epochs are passes over
    the training set; learning rates are per update of the global batch."""

    epochs: int = 10
    """Passes over the training set."""
    accum_steps: int = 1
    """Gradient accumulation: global batch = ``batch_size`` x ``accum_steps`` x processes."""
    global_batch_size: Optional[int] = None
    """If set, ``accum_steps`` = ``global_batch_size`` / (``batch_size`` x processes)."""
    opt: str = 'adamw'
    """A timm optimizer name (``timm.optim.create_optimizer_v2``)."""
    opt_betas: Tuple[float, ...] = (0.9, 0.999)
    """The optimizer's betas."""
    opt_eps: float = 1.0e-8
    """The optimizer's epsilon."""
    lr: Optional[float] = None
    """The peak learning rate; null: ``blr`` x global batch / 256 (MAE's linear scaling rule)."""
    blr: float = 1.0e-3
    """Base learning rate per 256 images of the global batch (used when ``lr`` is null)."""
    sched: str = 'cosine'
    """A timm scheduler name (``SCHEDULERS``), stepped per optimizer update."""
    min_lr: float = 1.0e-6
    """The learning rate of the last update (cosine, tanh, poly)."""
    warmup_epochs: float = 1.0
    """Linear warmup from ``warmup_lr`` to the peak, then the schedule."""
    warmup_lr: float = 1.0e-6
    """The learning rate the warmup starts from."""
    decay_epochs: float = 90
    """``step``: epochs between decays; ``wsd`` / ``rsqrt``: the decay's length (a fraction of the run if < 1)."""
    decay_milestones: Tuple[float, ...] = (90, 180, 270)
    """``multistep``: the epochs at which the learning rate decays."""
    decay_rate: float = 0.1
    """``step`` / ``multistep``: the factor of each decay; ``poly``: the power."""
    weight_decay: float = 0.05
    """Decoupled weight decay (AdamW's); biases and norms get none (timm)."""
    layer_decay: Optional[float] = None
    """Layer-wise learning-rate decay for fine-tuning, e.g. 0.65; null: off."""
    parameter_token_weight_decay: Optional[float] = None
    """Weight decay of Pattention's key and value parameter tokens; null: ``weight_decay``."""
    parameter_token_lr_scale: float = 1.0
    """Learning-rate multiplier of Pattention's key and value parameter tokens."""
    clip_grad: Optional[float] = None
    """Clip gradients at this value (``clip_mode``); null: off."""
    clip_mode: str = 'norm'
    """timm's ``dispatch_clip_grad``: ``'norm'``, ``'value'`` or ``'agc'``."""
    smoothing: float = 0.1
    """Label smoothing of the cross-entropy."""
    mixup: float = 0.0
    """Mixup's alpha (timm's ``Mixup``); 0: off."""
    cutmix: float = 0.0
    """CutMix's alpha; 0: off."""
    mixup_prob: float = 1.0
    """Probability that a batch is mixed."""
    mixup_switch_prob: float = 0.5
    """Probability that a mixed batch uses CutMix rather than Mixup when both are on."""
    model_ema: bool = False
    """Keep an exponential moving average of the weights (timm's ``ModelEmaV3``), evaluated beside the model."""
    model_ema_decay: float = 0.9999
    """The EMA's decay per update."""


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """Nested prefix training (`tkvision.growth.elastic`, docs/elastic.md) (the ``elastic`` section)."""

    elastic_fractions: Tuple[float, ...] = ()
    """Fractions of every Pattention's tokens a step may train, e.g. ``[0.25, 0.5, 0.75, 1.0]``; empty: off.
    Evaluation reports each (``top1@0.25``, ...)."""
    elastic_sampling: str = 'largest_plus_random'
    """Which prefixes a step trains: ``'all'``, ``'random'``, ``'largest_plus_random'`` or ``'sandwich'``."""
    elastic_tau: str = 'kept'
    """τ of a prefix of k tokens: ``'kept'`` (the whole layer's) or ``'follow'`` (Eq. 5's √k)."""
    elastic_nesting: str = 'all'
    """The Pattentions a prefix shrinks: ``'all'``, ``'ffn'`` (MatFormer's choice) or ``'no_attention'`` (the
    patch stem and the FFNs)."""
    elastic_start: float = 0.0
    """Fraction of the training steps in which only the whole model trains (the smaller prefixes start after
    it)."""


@dataclasses.dataclass(frozen=True)
class DistillationConfig:
    """Soft targets (`tkvision.engine.loss`, docs/elastic.md) (the ``distillation`` section)."""

    distillation: str = 'none'
    """``'none'``; ``'inplace'``: an elastic run's smaller prefixes learn from the whole model's detached
    predictions in the same step; ``'teacher'``: the model learns from the predictions of the trained model in
    ``teacher``."""
    distillation_temperature: float = 1.0
    """Softmax temperature T of both sides; the KL term is scaled by T²."""
    distillation_task_weight: float = 0.0
    """A distilled loss = w x label loss + (1 - w) x KL (timm's ``LogitDistillationTask``, complementary
    weights)."""
    teacher: Optional[str] = None
    """``distillation: teacher``: a finished run's weights file (its folder's ``config.yaml`` builds the
    model)."""


@dataclasses.dataclass(frozen=True)
class GrowthConfig:
    """Growth during training (`tkvision.growth`) (the ``growth`` mapping, written ``growth: {...}`` in a file
    and ``--growth.every_epochs 2`` on the command line)."""

    every_epochs: Optional[int] = None
    """Grow at the end of every k-th epoch by ``add_tokens``; null: off."""
    add_tokens: Mapping[str, int] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Tokens appended per kind at each such step: ``{patch, qkv, proj, ffn}``."""
    until_epoch: Optional[int] = None
    """No ``every_epochs`` growth at or after this epoch; null: until the end."""
    key_init: str = 'zeros'
    """Initial key tokens of a growth step: ``'zeros'`` (function-preserving) or ``'normal'``."""
    value_init: str = 'normal'
    """Initial value tokens of a growth step: ``'zeros'`` or ``'normal'``."""
    schedule: Tuple[Mapping[str, Any], ...] = ()
    """A progressive recipe: grow to ``to`` before epoch ``at_epoch`` (a registered variant, or ``{kind:
    tokens}``; ``{mlp_hidden: N}`` widens a timm ViT by Net2Net), each stage with its own schedule: re-warm for
    ``warmup_epochs`` to lr x ``lr_scale``, decay to ``min_lr`` at the stage's end (`tkvision.engine.optim`).
    E.g. ``[{at_epoch: 100, to: tokenformer_vit_b16, warmup_epochs: 5}]``."""
    stage_lr: str = 'restart'
    """``'restart'``: every stage its own warmup and decay to ``min_lr``; ``'continue'``: one schedule over the
    run, re-warmed briefly after each step."""
    optimizer_state: str = 'keep'
    """At a schedule step: ``'keep'`` the old rows' moments or ``'reset'`` the optimizer."""
    freeze_old_tokens: bool = False
    """After a schedule step: train only the new tokens (and the head), the paper's §5."""
    tau: str = 'keep'
    """``'keep'``: grown layers keep their τ (function-preserving); ``'recompute'``: τ of a layer built at the
    new size (√n), as a model from scratch."""
    eval_after_step: bool = False
    """Evaluate right after each growth step: the loss jump (``metrics.csv``'s ``val_loss_after_growth``,
    ``top1_after_growth``)."""


#: The sections in the order a reader meets them: ``{name: class}``.
SECTION_CLASSES = {
    'run': RunConfig, 'model': ModelConfig, 'mae': MaeConfig, 'data': DataConfig, 'optim': OptimConfig,
    'elastic': ElasticConfig, 'distillation': DistillationConfig, 'growth': GrowthConfig,
}


def plain_value(value: Any) -> Any:
    """``value`` as a config file holds it: tuples as lists, read-only mappings and sections as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: plain_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    return value


def frozen_value(value: Any) -> Any:
    """``value`` read-only all the way down: lists as tuples, mappings as ``MappingProxyType``."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: frozen_value(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen_value(item) for item in value)
    return value


def section_defaults(cls: type) -> Dict[str, Any]:
    """``{key: default}`` of the section class ``cls`` as a config file writes it (lists, dicts; the decoder's
    keys as a nested mapping)."""
    return plain_value(cls())


def _from_mapping(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of the section class ``cls`` from the mapping ``values`` of its keys (a nested section from
    its own mapping)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = values[f.name]
        kwargs[f.name] = _from_mapping(f.type, value) if f.type is DecoderConfig else frozen_value(value)
    return cls(**kwargs)


def section(
        cfg: Mapping[str, Any],
        name: str,
) -> Any:
    """Section ``name`` of the flat config ``cfg`` (a validated config: `tkvision.engine.config.load_config`), as
    its frozen class of `SECTION_CLASSES` (``'growth'``: a `GrowthConfig` of the ``growth`` mapping).

    Raises:
        KeyError: an unknown section name, or a key of the section missing from ``cfg``.
    """
    cls = SECTION_CLASSES[name]
    return _from_mapping(cls, cfg['growth'] if name == 'growth' else cfg)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole training config as typed, frozen sections, built from a validated flat config by `from_dict`;
    `to_dict` gives the flat form back (what ``config.yaml`` and every ``last.pth`` hold)."""

    run: RunConfig = RunConfig()
    """What runs where; when it evaluates, saves and reports."""
    model: ModelConfig = ModelConfig()
    """The network."""
    mae: MaeConfig = MaeConfig()
    """MAE pretraining (read with ``task: mae``)."""
    data: DataConfig = DataConfig()
    """The images and their batches."""
    optim: OptimConfig = OptimConfig()
    """The optimizer, schedule and loss regularisers."""
    elastic: ElasticConfig = ElasticConfig()
    """Nested prefix training."""
    distillation: DistillationConfig = DistillationConfig()
    """Soft targets."""
    growth: GrowthConfig = GrowthConfig()
    """Growth during training."""

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> 'TrainConfig':
        """The sections of the flat config ``cfg``, which must be validated already
        (`tkvision.engine.config_rules.validate_config`; `tkvision.engine.config.load_config` returns one).

        Raises:
            KeyError: a key of a section missing from ``cfg``.
        """
        return cls(**{name: section(cfg, name) for name in SECTION_CLASSES})

    def to_dict(self) -> Dict[str, Any]:
        """The flat config: every key of every section at the top (the ``growth`` mapping under ``growth``),
        lists and dicts as a YAML file writes them."""
        flat: Dict[str, Any] = {}
        for name in SECTION_CLASSES:
            values = plain_value(getattr(self, name))
            flat.update({'growth': values} if name == 'growth' else values)
        return flat
