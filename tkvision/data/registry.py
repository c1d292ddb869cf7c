"""Data sources found by name, as timm's readers are (``timm.data.create_reader``): a ``dataset`` name (``'folder'``,
``'wds/<name>'``) is looked up here, and a new source is one `register_data_source` call beside the functions that
read it (``tkvision.data.datasets`` registers the built-in ones). The module imports nothing of the package, so the
data section's rule (``tkvision.data.config``) reads it without a cycle.
"""
import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ['DataSource', 'register_data_source', 'data_source', 'data_source_names']


@dataclasses.dataclass(frozen=True)
class DataSource:
    """How one kind of dataset is read. Each callable takes the data section (``tkvision.data.DataConfig``) first.

    Attributes:
        split: ``split(data, split, seed, class_to_idx, rank, world_size)``: the dataset's own ``'train'`` or
            ``'val'`` split (a ``torch.utils.data.Dataset``), with the training or evaluation transform.
        carve: ``carve(data, train, seed, class_to_idx)``: ``(dataset, labels)`` of the training images, with the
            training (``train``) or evaluation transform, whose labels a validation split is carved by; None: this
            source cannot be carved (``val_split_fraction`` must be 0).
        class_map: ``class_map(data)``: the training split's ``{class: index}`` read without the images, or None.
        needs_data_dir: whether ``data_dir`` must be set.
        num_classes: the source's classes when fixed (Fashion-MNIST's 10), else None (from `class_map`, or 1000).
        channels: the channels of its images as the source gives them (3: RGB, as ``decode_image`` decodes).
        prefix: a family of names ``'<name>/<anything>'`` (``'wds/'``, ``'hfds/'``) rather than one name.
        image_settings: what the source fixes of its images (``img_size``, ``mean``, ``std``, ``crop_pct``,
            ``interpolation``: Fashion-MNIST's 28 px and statistics), which the data section's null keys take instead
            of the model's ``pretrained_cfg``; and a model must take images of its ``img_size``. None: the model's.
        val_split_fraction: the share of the training images a validation split is carved from when the config
            leaves ``val_split_fraction`` null (0: the source's own ``'val'`` split).
        class_counts: a published dataset's images per class of its ``'train'`` and ``'test'`` splits (as its
            authors publish them), from which a split's size is computed without reading an image
            (``tkvision.data.split_size``); None: counted from the files.
    """
    split: Callable[..., Any]
    carve: Optional[Callable[..., Tuple[Any, List[int]]]] = None
    class_map: Callable[..., Optional[Dict[str, int]]] = lambda data: None
    needs_data_dir: bool = True
    num_classes: Optional[int] = None
    channels: int = 3
    prefix: bool = False
    image_settings: Optional[Mapping[str, Any]] = None
    val_split_fraction: float = 0.0
    class_counts: Optional[Mapping[str, Tuple[int, ...]]] = None


_SOURCES: Dict[str, DataSource] = {}


def register_data_source(
        name: str,
        source: DataSource,
) -> DataSource:
    """Make ``source`` the reader of ``dataset: <name>`` (with ``source.prefix``: of every ``<name>/<anything>``).

    Raises:
        ValueError: ``name`` is not a non-empty string without ``/``, or is already registered; ``source`` is not
            a ``DataSource``.
    """
    if not (isinstance(name, str) and name and '/' not in name):
        raise ValueError(f'a data source is registered under a non-empty name without "/", got {name!r}')
    if not isinstance(source, DataSource):
        raise ValueError(f'register_data_source({name!r}, ...) takes a DataSource, got {type(source).__name__}')
    if name in _SOURCES:
        raise ValueError(f'data source {name!r} is registered already')
    _SOURCES[name] = source
    return source


def data_source(name: str) -> Optional[DataSource]:
    """The source of the dataset name ``name`` (an exact name, or ``<prefix>/<something>`` of a prefix source), or
    None for a name no source reads."""
    if not isinstance(name, str):
        return None
    if name in _SOURCES and not _SOURCES[name].prefix:
        return _SOURCES[name]
    kind, slash, rest = name.partition('/')
    source = _SOURCES.get(kind)
    return source if source is not None and source.prefix and slash and rest else None


def data_source_names() -> List[str]:
    """The registered names, a prefix source's written ``'<name>/<name>'``."""
    return [f'{n}/<name>' if s.prefix else n for n, s in _SOURCES.items()]
