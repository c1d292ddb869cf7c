"""The project's one seed derivation: every random draw that must not depend on worker processes,
interruptions or the order of earlier draws is seeded from a hash of what identifies it.

- a training sample's augmentation: ``derive_seed(seed, epoch, sample_index)`` (``tkvision.data``);
- the main process's draws of one micro-batch (drop path, mixup, erasing, MAE masks):
  ``derive_seed('step', seed, epoch, batch)`` (``tkvision.engine``);
- the new parameter tokens of a growth step: ``derive_seed('growth', seed, epoch)``;
- a shard stream's order: ``derive_seed('shards', seed, epoch)``, and each worker's shuffle buffer;
- the MAE validation masks: ``derive_seed('mae_val', seed, batch)``.

The hash (BLAKE2b) makes seeds of neighbouring indices unrelated, unlike ``seed + index``, whose
streams overlap for generators seeded with consecutive integers.
"""
import hashlib

__all__ = ['derive_seed']


def derive_seed(*parts: object, bits: int = 32) -> int:
    """A ``bits``-bit seed (``0 <= seed < 2**bits``) that depends only on ``parts`` (joined by ``/``).

    Args:
        parts: what identifies the draw (strings and integers), e.g. ``(seed, epoch, index)``.
        bits: width of the seed, at most 32 (31 for generators that want a non-negative int32).

    Raises:
        ValueError: ``bits`` outside 1..32.
    """
    if not 1 <= bits <= 32:
        raise ValueError(f'bits must be in 1..32, got {bits}')
    digest = hashlib.blake2b('/'.join(str(p) for p in parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, 'little') >> (32 - bits)
