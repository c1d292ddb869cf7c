"""Model definitions; importing this module registers the ``tokenformer_vit_*`` models with timm
and provides the masked autoencoder (:mod:`tkvision.models.mae`)."""
from .mae import MaskedAutoencoder, create_mae
from .tokenformer_vit import TOKEN_KINDS, TokenFormerViT, checkpoint_filter_fn

__all__ = ['TokenFormerViT', 'TOKEN_KINDS', 'checkpoint_filter_fn', 'MaskedAutoencoder', 'create_mae']
