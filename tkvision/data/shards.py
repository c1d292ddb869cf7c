"""WebDataset tar shards: writing them (`make_shards`) and streaming them (`ShardStream`).

Layout written by `make_shards` from an ImageNet-layout folder ``<src>/<split>/<class>/<image>``::

    <out>/train-000000.tar, train-000001.tar, ...   samples: <key>.<ext> (original encoded bytes), <key>.cls
    <out>/val-000000.tar, ...
    <out>/_info.json    timm's WebDataset info (``splits.<split>.num_samples / filenames / shard_lengths``,
                        so ``timm.data.create_dataset('wds/...')`` reads it too) plus our manifest:
                        ``classes`` (names, index order), ``splits.<split>.class_counts``, ``total``

Streaming (``dataset: wds/<name>``, ``data_dir`` = the shard folder) with the ``webdataset`` package:

- **Disjoint shards per rank and worker**: the split's shards, shuffled per epoch from the seed when
  training, are dealt to ranks (``shards[rank::world]``) and then to DataLoader workers; each
  worker shuffles its samples in a buffer seeded from (seed, epoch, rank, worker).
- **Epoch length**: every rank runs ``num_samples // (world x workers x batch_size)`` batches per
  worker (the same on every rank, as DDP needs); a worker whose shards hold fewer samples cycles
  through them again. Evaluation reads every sample of the split once, with no length limit.
- **Resume**: exact, mid-epoch included, when ``num_workers`` and the number of processes are those
  of the interrupted run: each worker skips (without decoding) the samples of the batches already
  trained, and the workers' turns are rotated so the DataLoader's round-robin continues where it
  stopped. With another ``num_workers`` the rest of the epoch is a different (still disjoint)
  draw of the data.
- Each sample's augmentation is seeded from (seed, epoch, sample key); an undecodable image is
  skipped and counted like in every other format.
"""
import json
import os
import random
import tarfile
from typing import Any, Callable, Dict, List, Optional, Sequence

from torch.utils.data import IterableDataset, get_worker_info

from ..utils.errors import UsageError
from ..utils.files import atomic_write
from ..utils.seeding import derive_seed
from .loader import seed_sample
from .readers import BAD_IMAGE, decode_image

__all__ = ['INFO_NAME', 'read_info', 'check_shard', 'ShardStream', 'make_shards']

INFO_NAME = '_info.json'
_IMAGE_EXTS = ('jpg', 'jpeg', 'png', 'webp', 'bmp', 'ppm', 'tif', 'tiff')


def read_info(root: str) -> dict:
    """The ``_info.json`` of a shard folder.

    Raises:
        FileNotFoundError: no shard folder or no ``_info.json`` in it, saying how to make one.
    """
    path = os.path.join(root or '', INFO_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'WebDataset shards not found: {path} is missing; write shards with '
                                '`tkvision-make-shards --src <ImageNet-layout folder> --out <shard folder>` '
                                '(tools/make_shards.py) and pass that folder as --data-dir')
    with open(path) as f:
        return json.load(f)


def _with_markers(samples, errors: list):
    """``samples`` with a ``{'__bad_shard__': error}`` item for each error recorded upstream, placed
    after the sample whose pull recorded it (and at the end of an evaluation stream)."""
    for sample in samples:
        while errors:
            yield {'__bad_shard__': errors.pop(0)}
        yield sample
    while errors:
        yield {'__bad_shard__': errors.pop(0)}


def check_shard(path: str) -> None:
    """Refuse a shard that cannot be streamed, before any training: missing, empty (0 bytes), not a tar,
    or a tar without a sample. (A shard damaged further in is skipped and counted while streaming.)

    Raises:
        UsageError: naming the shard and what is wrong with it.
    """
    if not os.path.isfile(path):
        raise UsageError(f'{path} is listed in {INFO_NAME} but missing: rewrite the shards with make_shards')
    if os.path.getsize(path) == 0:
        raise UsageError(f'{path} is empty (0 bytes): rewrite the shards with make_shards')
    try:
        with tarfile.open(path, 'r|*') as tar:
            first = tar.next()
    except tarfile.TarError as e:
        raise UsageError(f'{path} is not a readable tar ({e}): rewrite the shards with make_shards') from None
    if first is None:
        raise UsageError(f'{path} holds no sample: rewrite the shards with make_shards')


def _wds():
    try:
        import webdataset
    except ImportError as e:
        raise ImportError('WebDataset shards need the webdataset package: pip install "tkvision[wds]"') from e
    return webdataset


class ShardStream(IterableDataset):
    """One split of a shard folder as a stream of ``(transform(image), label)`` or ``('bad', key)``.

    Args:
        root: the shard folder (with ``_info.json``).
        split: e.g. ``'train'`` or ``'val'``.
        transform: albumentations pipeline on uint8 HWC arrays (seeded per sample when ``train``).
        train: shuffle shards and samples, fixed epoch length.
        batch_size: the loader's batch size.
        num_workers: the loader's worker processes.
        rank: this process's rank.
        world: the number of processes.
        seed: the run's seed.
        limit: use at most this many samples of the split per epoch (``train_subset``).

    Raises:
        FileNotFoundError: no ``_info.json`` or no such split in it (the splits present are named).
        UsageError: fewer shards than processes x workers, or a shard that cannot be streamed
            (`check_shard`, naming it).
    """

    def __init__(
            self,
            root: str,
            split: str,
            transform: Optional[Callable],
            train: bool,
            batch_size: int,
            num_workers: int = 0,
            rank: int = 0,
            world: int = 1,
            seed: int = 0,
            limit: Optional[int] = None,
    ):
        info = read_info(root)
        if split not in info.get('splits', {}):
            raise FileNotFoundError(f"split {split!r} not in {os.path.join(root, INFO_NAME)} "
                                    f"(splits: {', '.join(info.get('splits', {})) or 'none'})")
        split_info = info['splits'][split]
        self.root, self.split, self.transform, self.train = root, split, transform, train
        self.shards = [os.path.join(root, f) for f in split_info['filenames']]
        self.classes = info.get('classes')
        self.num_samples = min(split_info['num_samples'], limit or split_info['num_samples'])
        self.batch_size, self.num_workers, self.rank, self.world, self.seed = batch_size, num_workers, rank, world, seed
        workers = max(num_workers, 1)
        self.batches_per_worker = self.num_samples // (world * workers * batch_size) if train else 0  # eval: unused
        if train and len(self.shards) < world * workers:
            raise UsageError(f'{len(self.shards)} {split} shards in {root} cannot feed {world} process(es) x '
                             f'{workers} loader worker(s) one shard each: write smaller shards or use fewer workers')
        for shard in self.shards:
            check_shard(shard)
        self.epoch, self.skip_batches = 0, 0

    @property
    def batches_per_epoch(self) -> Optional[int]:
        """Training batches per rank in one epoch (``None`` for evaluation streams)."""
        return None if not self.train else self.batches_per_worker * max(self.num_workers, 1)

    def __len__(self):
        if self.train:
            return self.batches_per_worker * max(self.num_workers, 1) * self.batch_size
        return -(-self.num_samples // self.world)  # evaluation: about this rank's share

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Stream epoch ``epoch``, leaving out its first ``skip_batches`` batches (a resumed run)."""
        self.epoch, self.skip_batches = epoch, skip_batches

    def _worker(self):
        info = get_worker_info()
        workers = info.num_workers if info else 1
        wid = info.id if info else 0
        rotate = self.skip_batches % workers  # the worker that produced batch `skip_batches` goes first
        return (wid + rotate) % workers, workers

    def __iter__(self):
        wds = _wds()
        logical, workers = self._worker()
        shards = list(self.shards)
        if self.train:
            random.Random(derive_seed('shards', self.seed, self.epoch)).shuffle(shards)
        mine = shards[self.rank::self.world][logical::workers]
        if not mine:
            return
        errors: List[str] = []  # shards that broke part-way: each becomes one skipped item after the shuffle
        samples = self._samples(mine, errors)
        if self.train:
            rng = random.Random(derive_seed('shuffle', self.seed, self.epoch, self.rank, logical))
            samples = wds.filters.shuffle(bufsize=1000, initial=100, rng=rng)(samples)
        samples = _with_markers(samples, errors)
        if self.train:  # the quota counts markers as it counts bad images: the batches per epoch stay fixed
            skip = self.skip_batches // workers + (logical < self.skip_batches % workers)
            total = self.batches_per_worker * self.batch_size
            samples = (s for i, s in zip(range(total), samples) if i >= skip * self.batch_size)
        for sample in samples:
            yield self._decode(sample)

    def _samples(self, shards, errors: list):
        """The tar samples of ``shards`` (cycled when training); a shard that breaks part-way (truncated,
        damaged) ends there and its error is appended to ``errors``.

        Raises:
            UsageError: a whole pass over ``shards`` gave no sample (it would cycle forever).
        """
        produced = [0]

        def urls():
            while True:  # training cycles through this worker's shards until its quota; evaluation reads once
                before = produced[0]
                for url in shards:
                    yield dict(url=url)
                if not self.train:
                    return
                if produced[0] == before:
                    raise UsageError(f'the shards {", ".join(os.path.basename(u) for u in shards)} of {self.root} '
                                     'gave no readable sample in a whole pass: rewrite them with make_shards')

        def skip_shard(error):  # webdataset's handler: keep streaming the next shard
            errors.append(f'{error.args[-1] if error.args else self.root}: {type(error).__name__}')
            return True

        for sample in _wds().tariterators.tarfile_samples(urls(), handler=skip_shard):
            produced[0] += 1
            yield sample

    def _decode(self, sample):
        if '__bad_shard__' in sample:
            return ('bad', sample['__bad_shard__'])
        key = sample['__key__']
        data = next((sample[k] for k in _IMAGE_EXTS if k in sample), None)
        try:
            if data is None:
                raise ValueError(f'no image in sample {key}')
            image = decode_image(data)
        except BAD_IMAGE:
            return ('bad', f"{sample.get('__url__', self.root)}:{key}")
        if self.train and hasattr(self.transform, 'set_random_seed'):
            seed_sample(self.transform, self.seed, self.epoch, key)
        if self.transform is None:
            return image, int(sample['cls'])
        return self.transform(image=image)['image'], int(sample['cls'])


def make_shards(
        src: str,
        out: str,
        splits: Sequence[str] = ('train', 'val'),
        max_count: int = 10000,
        max_size: float = 1e9,
        progress: bool = True,
) -> dict:
    """Write WebDataset shards of an ImageNet-layout folder (``<src>/<split>/<class>/<image>``).

    Images are stored as their original encoded bytes (``<key>.<ext>``), labels as ``<key>.cls``
    (the class index, classes sorted by name as the training folder's). A shard is closed after
    ``max_count`` images or ``max_size`` bytes. Every split uses the class list of the first one.

    Returns:
        the manifest written to ``<out>/_info.json``.

    Raises:
        FileNotFoundError: ``src/<split>`` missing. FileExistsError: ``out`` already holds shards.
        UsageError: a split holds a class the first split does not have (named), or ``max_count`` < 1
            or ``max_size`` <= 0.
    """
    from timm.data.readers.reader_image_folder import find_images_and_targets
    from tqdm import tqdm
    if max_count < 1 or max_size <= 0:
        raise UsageError(f'--max-count must be >= 1 and --max-size > 0, got {max_count} and {max_size}')
    wds = _wds()
    if os.path.exists(os.path.join(out, INFO_NAME)):
        raise FileExistsError(f'{out} already holds shards ({INFO_NAME}); write to another --out')
    os.makedirs(out, exist_ok=True)
    manifest: Dict[str, Any] = dict(name=os.path.basename(os.path.normpath(src)), splits={}, classes=None, total=0)
    for split in splits:
        folder = os.path.join(src, split)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f'{folder} not found: expected {src}/<split>/<class>/<image>')
        classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
        if manifest['classes'] is None:
            manifest['classes'] = classes
        extra = sorted(set(classes) - set(manifest['classes']))
        if extra:
            raise UsageError(f'{folder} has classes that {splits[0]} lacks: {extra}')
        samples, _ = find_images_and_targets(folder, class_to_idx={c: i for i, c in enumerate(manifest['classes'])})
        lengths: List[int] = []
        counts: Dict[str, int] = {}
        pattern = os.path.join(out, f'{split}-%06d.tar')
        with wds.ShardWriter(pattern, maxcount=max_count, maxsize=max_size, verbose=0) as sink:
            for i, (path, target) in enumerate(tqdm(samples, desc=f'{split} shards', disable=not progress)):
                ext = os.path.splitext(path)[1].lstrip('.').lower() or 'jpg'
                with open(path, 'rb') as f:
                    sink.write({'__key__': f'{split}_{i:08d}', ext: f.read(), 'cls': str(target).encode()})
                shard = sink.shard - 1
                lengths += [0] * (shard + 1 - len(lengths))
                lengths[shard] += 1
                name = manifest['classes'][target]
                counts[name] = counts.get(name, 0) + 1
        names = [os.path.basename(pattern % s) for s in range(len(lengths))]
        manifest['splits'][split] = dict(name=split, num_samples=len(samples), filenames=names, shard_lengths=lengths,
                                         class_counts=counts)
        manifest['total'] += len(samples)
    atomic_write(os.path.join(out, INFO_NAME), lambda f: json.dump(manifest, f, indent=1), text=True)
    return manifest
