"""Model definitions; importing this module registers the ``tokenformer_vit_*``, ``ringformer_vit_*`` and
``tokenformer_ring_vit_*`` models with timm and provides the masked autoencoder (:mod:`tkvision.models.mae`)."""
from .mae import MaskedAutoencoder, create_mae
from .ringformer import RingFormerViT, TokenRingViT
from .tokenformer_vit import TOKEN_KINDS, TokenFormerViT, checkpoint_filter_fn

__all__ = ['TokenFormerViT', 'TOKEN_KINDS', 'checkpoint_filter_fn', 'MaskedAutoencoder', 'create_mae',
           'RingFormerViT', 'TokenRingViT']
