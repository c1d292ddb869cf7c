"""Model definitions; importing this module registers the ``tokenformer_vit_*`` models with timm."""
from .tokenformer_vit import TOKEN_KINDS, TokenFormerViT, checkpoint_filter_fn

__all__ = ['TokenFormerViT', 'TOKEN_KINDS', 'checkpoint_filter_fn']
