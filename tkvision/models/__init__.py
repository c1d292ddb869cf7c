"""Model definitions; importing this module registers the ``tokenformer_vit_*``, ``naflexvit_tokenformer_*``,
``ringformer_vit_*`` and ``tokenformer_ring_vit_*`` models with timm and provides the masked autoencoder
(`tkvision.models.mae`).
`_helpers` reads weights files and checks that they fit a model."""
from ._helpers import adapt_state_dict, check_fit, file_shapes, input_shape, load_state_dict_file
from .mae import MaskedAutoencoder, create_mae, encoder_weights, is_mae_state_dict, linear_probe
from .naflex_tokenformer import NaFlexTokenFormer
from .ringformer import RingFormerViT, TokenRingViT
from .tokenformer_vit import TokenFormerViT, checkpoint_filter_fn

__all__ = ['TokenFormerViT', 'NaFlexTokenFormer', 'checkpoint_filter_fn', 'MaskedAutoencoder', 'create_mae',
           'RingFormerViT', 'TokenRingViT', 'load_state_dict_file', 'adapt_state_dict', 'check_fit', 'file_shapes',
           'input_shape', 'encoder_weights', 'is_mae_state_dict', 'linear_probe']
