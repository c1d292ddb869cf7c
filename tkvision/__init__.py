"""tkvision: TokenFormer vision transformers for timm.

``import tkvision`` registers ``tokenformer_vit_*``, ``naflexvit_tokenformer_*``, ``ringformer_vit_*`` and
``tokenformer_ring_vit_*`` with ``timm.create_model``.

Subpackages (DEVELOPERS.md, "Layout"): ``layers`` (Pattention), ``models`` (the families, MAE), ``growth``
(growth by parameter tokens, elastic prefixes), ``data`` (datasets, transforms, loaders, shards), ``engine``
(config, training, evaluation, checkpoints; each config section declared beside the component that reads it),
``utils`` (errors, seeds, atomic writes, config fields); ``experiments`` (the
sweep, the model benchmark) and ``cli`` sit at the edge and nothing in the library imports them. The
studies behind the results pages live in the repository's ``studies/``, outside the package.
"""
from . import layers, models
from .growth import grow
from .layers import Pattention
from .models import TokenFormerViT

__version__ = '0.2.0'
__all__ = ['Pattention', 'TokenFormerViT', 'grow', 'layers', 'models']
