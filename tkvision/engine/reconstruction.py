"""Reconstruction pictures of a masked autoencoder, as in MAE's Figures 2-4.

One row per validation image: the original, the masked input (masked patches grey), the
reconstruction, and the reconstruction with the visible patches pasted back. With
``norm_pix_loss`` the decoder predicts per-patch normalised pixels; they are shown with each
patch's true mean and standard deviation put back (what MAE's own pictures of such models do), so
the picture shows structure, not the patch means.

The trainer writes ``reconstruction.png`` at the end of every ``task: mae`` run;
``tools/mae_visualize.py --checkpoint RUN/last.pth --out recon.png`` draws one from a checkpoint
(the run's config is in it).
"""
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..data import BatchPreprocessor
from ..models.mae import MaskedAutoencoder, patchify, unpatchify
from ..utils.files import atomic_write
from .evaluate import mask_noise

__all__ = ['reconstruct', 'reconstruction_grid', 'save_reconstructions']


@torch.no_grad()
def reconstruct(
        model: MaskedAutoencoder,
        images: torch.Tensor,
        mask_ratio: Optional[float] = None,
        seed: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``images [B, C, H, W]`` (normalised) -> ``(masked, recon, pasted)``, each ``[B, C, H, W]`` in
    the same normalised space; the masks are those of validation batch 0 (`mask_noise`)."""
    model.eval()
    p = model.patch_size
    noise = mask_noise(0, len(images), model.grid_size[0] * model.grid_size[1], seed).to(images.device)
    _, pred, mask = model(images, mask_ratio, noise)
    pred = pred.float()
    if model.norm_pix_loss:
        target = patchify(images.float(), p)
        pred = pred * (target.var(dim=-1, keepdim=True) + 1e-6) ** .5 + target.mean(dim=-1, keepdim=True)
    C = images.shape[1]
    recon = unpatchify(pred, p, model.grid_size, C)
    m = unpatchify(mask.unsqueeze(-1).expand(-1, -1, p * p * C), p, model.grid_size, C)
    grey = torch.zeros_like(images)
    return images * (1 - m) + grey * m, recon, images * (1 - m) + recon * m


def reconstruction_grid(
        model: MaskedAutoencoder,
        images: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        mask_ratio: Optional[float] = None,
        scale: int = 4,
) -> np.ndarray:
    """A ``[B·H·scale, 4·W·scale, 3]`` uint8 picture: per image, original | masked | reconstruction |
    reconstruction + visible patches, un-normalised with ``mean`` / ``std`` (per channel) and
    enlarged ``scale`` times (nearest)."""
    cols = [images, *reconstruct(model, images, mask_ratio)]
    shift = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    scale_by = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    rows = torch.cat([((c.float() * scale_by + shift).clamp(0, 1)) for c in cols], dim=3)  # [B, C, H, 4W]
    grid = torch.cat(list(rows), dim=1)  # [C, B*H, 4W]
    if grid.shape[0] == 1:
        grid = grid.expand(3, -1, -1)
    grid = grid.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    return (grid.permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)


def save_reconstructions(
        model: torch.nn.Module,
        dataset: Dataset,
        mean: Sequence[float],
        std: Sequence[float],
        path: str,
        num_images: int = 8,
        mask_ratio: Optional[float] = None,
        device: Union[str, torch.device] = 'cpu',
) -> None:
    """Write `reconstruction_grid` of the first ``num_images`` images of ``dataset`` (items
    ``(uint8 image [C, H, W], label)``, normalised with ``mean`` / ``std``) to the PNG ``path``
    (atomically); ``model`` is a `tkvision.models.mae.MaskedAutoencoder`.

    Raises:
        TypeError: ``model`` is no MaskedAutoencoder.
    """
    if not isinstance(model, MaskedAutoencoder):
        raise TypeError(f'save_reconstructions needs a MaskedAutoencoder, got {type(model).__name__}')
    count = min(num_images, len(dataset))  # type: ignore[arg-type]  # map-style: torch's Dataset declares no __len__
    images = torch.stack([torch.as_tensor(dataset[i][0]) for i in range(count)])
    images = BatchPreprocessor(mean, std, torch.device(device))(images)
    picture = Image.fromarray(reconstruction_grid(model, images, mean, std, mask_ratio))
    atomic_write(path, lambda tmp: picture.save(tmp, format='PNG'))
