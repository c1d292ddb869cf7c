"""The GPU report's ``fused_tiles`` part (:mod:`.gpu_report`): one Pattention layer at B/16†'s sizes, the
plain path against the fused Triton kernels (``tkvision/layers/pattention_triton.py``) with several tile
choices, bf16 forward and backward; what says whether the kernels could pay with other tiles."""
import torch

from ..layers.pattention import Pattention
from .benchmark import _sync, _time

__all__ = ['FUSED_TILES', 'FUSED_LAYERS', 'FUSED_ROWS', 'fused_tiles']

#: The tile choices ``(block rows, block columns, block inner, warps)`` :func:`fused_tiles` times: the
#: kernels' default (``pattention_triton.TILES``, written out: this module imports without Triton) first,
#: then larger tiles, which a Hopper GPU's tensor cores favour.
FUSED_TILES = ((64, 64, 32, 4), (128, 64, 32, 4), (64, 128, 32, 4), (128, 128, 32, 8), (128, 128, 64, 8),
               (128, 64, 64, 4))
#: B/16†'s Pattention layers ``(in_features, num_tokens, out_features)`` (Q/K/V, proj, patch: 576 tokens;
#: FFN: 2304) and the rows of a batch of 256 images (197 tokens each); the tiny stand-in's.
FUSED_LAYERS, FUSED_ROWS = ((768, 576, 768), (768, 2304, 768)), 256 * 197
TINY_FUSED_LAYERS, TINY_FUSED_ROWS = ((32, 16, 32),), 40


def fused_tiles(device, tiny: bool, steps: int, repeats: int, tile_choices=FUSED_TILES, log=print) -> list:
    """One Pattention layer's bf16 forward and backward: the plain path (the lean backward on CUDA) against
    the fused Triton kernels with each of ``tile_choices``, at B/16†'s layer sizes and batch 256.

    Returns:
        one ``dict(layer, rows, path, tiles, train_ms, ratio, relative_error)`` per path and layer:
        ``train_ms`` the median step (forward and backward, milliseconds), ``ratio`` the plain path's
        time over this one's (> 1: faster than plain), ``relative_error`` the largest absolute difference
        of the output from the plain path's over the plain output's largest magnitude (bf16 rounding: of
        order 1e-2, 4.4e-3 measured on an H200; a wrong result shows far above it). The Triton interpreter
        on a CPU gets bf16 wrong, so off CUDA only the float32 tests (``tests/test_pattention_triton.py``)
        say the kernels are right.
    """
    from ..layers.pattention_triton import pattention_fused  # Triton only when this part runs
    rows_out = []
    for in_features, num_tokens, out_features in TINY_FUSED_LAYERS if tiny else FUSED_LAYERS:
        torch.manual_seed(0)
        layer = Pattention(in_features, out_features, num_tokens).to(device)
        x = torch.randn(TINY_FUSED_ROWS if tiny else FUSED_ROWS, in_features, device=device, requires_grad=True)
        paths = [('plain', None)] + [('fused', tiles) for tiles in tile_choices]

        def run(tiles):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if tiles is None:
                    return layer(x)
                return pattention_fused(x, layer.keys, layer.value_param_tokens, layer.tau, layer.eps, tiles)

        with torch.no_grad():
            reference = run(None).float()
        for path, tiles in paths:
            def step():
                run(tiles).sum().backward()
                _sync(device)
            with torch.no_grad():
                error = float((run(tiles).float() - reference).abs().max() / reference.abs().max())
            ms = 1000 * _time(step, steps, repeats)
            rows_out.append(dict(layer=f'{in_features}->{num_tokens}->{out_features}', rows=x.shape[0], path=path,
                                 tiles='x'.join(map(str, tiles)) if tiles else '-', train_ms=ms, relative_error=error))
            log(f"fused_tiles {rows_out[-1]['layer']} {path} {rows_out[-1]['tiles']}: {ms:.2f} ms, error {error:.2e}")
        plain = rows_out[-len(paths)]['train_ms']
        for r in rows_out[-len(paths):]:
            r['ratio'] = plain / r['train_ms']
    return rows_out
