"""tkvision: TokenFormer vision transformers for timm.

``import tkvision`` registers ``tokenformer_vit_*`` with ``timm.create_model``.
"""
from . import layers, models
from .growth import grow
from .layers import Pattention
from .models import TokenFormerViT

__version__ = '0.1.0'
__all__ = ['Pattention', 'TokenFormerViT', 'grow', 'layers', 'models']
