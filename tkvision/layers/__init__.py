"""Layers of tkvision: [`Pattention`][tkvision.layers.pattention.Pattention] (paper Eq. 4-5) and its
score-normalisation registry; the TokenFormer stem ([`PatchEmbed`][tkvision.layers.patch_embed.PatchEmbed]) and block
([`Block`][tkvision.layers.block.Block], [`Attention`][tkvision.layers.block.Attention])."""
from .block import Attention, Block
from .patch_embed import FlexPatchPattention, PatchEmbed, PatchPattention
from .pattention import (
                         BACKWARD_MODES,
                         DECODER_KINDS,
                         ENCODER_KINDS,
                         PATTENTION_KINDS,
                         SCORE_NORMS,
                         Normalize,
                         Pattention,
                         ScoreNorm,
                         default_tau,
                         normalize_scores,
                         register_score_norm,
                         score_norm_entry,
                         set_backward_mode,
)

__all__ = ['Attention', 'Block', 'FlexPatchPattention', 'PatchEmbed', 'PatchPattention', 'Pattention', 'SCORE_NORMS',
           'ScoreNorm', 'Normalize', 'register_score_norm', 'score_norm_entry', 'default_tau', 'normalize_scores',
           'PATTENTION_KINDS', 'ENCODER_KINDS', 'DECODER_KINDS', 'BACKWARD_MODES', 'set_backward_mode']
