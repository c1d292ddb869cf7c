"""Layers of tkvision: :class:`Pattention` (paper Eq. 4-5)."""
from .pattention import SCORE_NORMS, Pattention, default_tau, normalize_scores

__all__ = ['Pattention', 'SCORE_NORMS', 'default_tau', 'normalize_scores']
