"""Pattention: token-parameter attention, the layer TokenFormer builds everything from.

TokenFormer: Rethinking Transformer Scaling with Tokenized Model Parameters
(Wang et al. 2024, https://arxiv.org/abs/2410.23168), Section 3.2:

    O = Θ(X · K_Pᵀ) · V_P                                   (Eq. 4)
    Θ(A)_ij = f(A_ij · τ / ‖A_i‖₂),  f = GELU,  τ = √n        (Eq. 5)

X: input tokens ``[..., in_features]``; K_P: key parameter tokens ``[num_tokens, in_features]``;
V_P: value parameter tokens ``[num_tokens, out_features]``; scores A are normalised per input
token over the n = ``num_tokens`` parameter tokens (last axis). No bias anywhere.

Θ is chosen by ``score_norm`` (names of the public TokenFormer code, see
``shared/reference/README.md``, "Pattention, as the public TokenFormer code computes it"):

=================  ==================================  ===============  ======================
``score_norm``     computes                            default τ        zero new keys exact?
=================  ==================================  ===============  ======================
``l2_norm_gelu``   GELU(A · τ / ‖A‖₂)   (Eq. 5)         √n              yes
``l1_norm_gelu``   GELU(A · τ / ‖A‖₁)   (Table 4)       n               yes
``gelu_l2_norm``   τ · GELU(A) / ‖GELU(A)‖₂            √n              yes
``softmax``        τ · softmax(A)       (Table 4, e^x)  n               no (exp(0) = 1 > 0)
=================  ==================================  ===============  ======================

τ is a fixed number stored in the module (buffer ``tau``, saved in every checkpoint), set at
construction (default above, from the construction-time n) and **not** recomputed when tokens are
appended: recomputing √(n+m) would break the function preservation of Appendix B.
"""
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from .pattention_memory import l2_norm_gelu_attend

__all__ = ['Pattention', 'SCORE_NORMS', 'default_tau', 'normalize_scores']

#: Score normalisations Θ, by name; see the module docstring for what each computes.
SCORE_NORMS = ('l2_norm_gelu', 'l1_norm_gelu', 'gelu_l2_norm', 'softmax')

#: Normalisations for which appending zero-initialised key tokens leaves the output unchanged.
ZERO_KEY_EXACT = ('l2_norm_gelu', 'l1_norm_gelu', 'gelu_l2_norm')


def default_tau(score_norm: str, num_tokens: int) -> float:
    """Default scale τ of ``score_norm`` for ``num_tokens`` parameter tokens.

    √n for the L2 normalisations (Eq. 5), n for L1 and softmax (the public code's ×n, which
    "balances the variance"; the paper's Table 4 gives no τ for GELU+L1, n is the L1 analogue).

    Raises:
        ValueError: unknown ``score_norm``.
    """
    if score_norm in ('l2_norm_gelu', 'gelu_l2_norm'):
        return math.sqrt(num_tokens)
    if score_norm in ('l1_norm_gelu', 'softmax'):
        return float(num_tokens)
    raise ValueError(f'unknown score_norm {score_norm!r}; choose one of {SCORE_NORMS}')


def normalize_scores(scores: torch.Tensor, score_norm: str, tau, eps: float = 1e-6) -> torch.Tensor:
    """Θ of Eq. 5 (and its ablation variants) over the last axis of ``scores``.

    Args:
        scores: A = X · K_Pᵀ, shape ``[..., n]``.
        score_norm: one of :data:`SCORE_NORMS`.
        tau: scale τ (float or 0-d tensor).
        eps: lower bound on the norm, so an all-zero row gives zeros, never NaN.

    Returns:
        Normalised scores S, same shape and dtype as ``scores``. The normalisation runs in float32 (or float64)
        (safe under bf16/fp16 autocast) and is cast back.
    """
    a = scores.to(torch.promote_types(scores.dtype, torch.float32))  # >= float32
    if score_norm == 'l2_norm_gelu':
        s = F.gelu(a * (tau / torch.linalg.vector_norm(a, dim=-1, keepdim=True).clamp_min(eps)))
    elif score_norm == 'l1_norm_gelu':
        s = F.gelu(a * (tau / torch.linalg.vector_norm(a, ord=1, dim=-1, keepdim=True).clamp_min(eps)))
    elif score_norm == 'gelu_l2_norm':
        g = F.gelu(a)
        s = g * (tau / torch.linalg.vector_norm(g, dim=-1, keepdim=True).clamp_min(eps))
    elif score_norm == 'softmax':
        s = torch.softmax(a, dim=-1) * tau
    else:
        raise ValueError('unknown score_norm ' + score_norm + '; choose one of l2_norm_gelu, l1_norm_gelu, '
                         'gelu_l2_norm, softmax')
    return s.to(scores.dtype)


class Pattention(nn.Module):
    """Token-parameter attention layer, ``[..., in_features] -> [..., out_features]`` (Eq. 4-5).

    Args:
        in_features: d_in, width of the input tokens.
        out_features: d_out, width of the output tokens.
        num_tokens: n, number of key/value parameter token pairs.
        score_norm: normalisation Θ, one of :data:`SCORE_NORMS` (default: the paper's Eq. 5).
        tau: fixed scale τ; ``None`` gives :func:`default_tau` of the construction-time n.
        eps: lower bound on the score norm (float32).
        key_std: std of the normal init of the key tokens (0.02, public code).
        value_std: std of the normal init of the value tokens (0.02 here; the model passes the
            public code's 2 / (depth · √d) for its blocks).
        lean_backward: for ``l2_norm_gelu`` with autograd on, use the same math with a hand-written
            backward that keeps one ``[..., n]`` tensor instead of three (``pattention_memory.py``):
            ``'auto'`` (default) on CUDA, where activation memory limits the batch (B/16: 0.87x ViT-B's
            saved activations instead of 1.6x), not on CPU, where its recomputation costs ~10%
            (``docs/performance.md``); ``True`` / ``False`` force it.

    Attributes:
        key_param_tokens: K_P, ``[num_tokens, in_features]`` (a subclass may keep K_P under another
            name and shape, ``key_name``, e.g. the patch embedding's conv-shaped ``weight``).
        value_param_tokens: V_P, ``[num_tokens, out_features]``.
        tau: 0-d float32 buffer holding τ (persistent: saved in the state dict).

    Raises:
        ValueError: unknown ``score_norm`` or a non-positive size.
    """

    #: the attribute holding K_P (``keys``); rows are parameter tokens, whatever the other dims
    key_name = 'key_param_tokens'
    __jit_unused_properties__ = ['num_tokens', 'keys']

    def __init__(self, in_features, out_features, num_tokens, score_norm='l2_norm_gelu', tau=None,
                 eps=1e-6, key_std=0.02, value_std=0.02, lean_backward='auto', device=None, dtype=None):
        super().__init__()
        if min(in_features, out_features, num_tokens) <= 0:
            raise ValueError(f'Pattention sizes must be positive, got in_features={in_features}, '
                             f'out_features={out_features}, num_tokens={num_tokens}')
        tau = default_tau(score_norm, num_tokens) if tau is None else float(tau)
        self.in_features, self.out_features, self.score_norm, self.eps = in_features, out_features, score_norm, eps
        self.key_std, self.value_std, self.lean_backward = key_std, value_std, lean_backward
        factory = dict(device=device, dtype=dtype)
        setattr(self, self.key_name, nn.Parameter(torch.empty(num_tokens, in_features, **factory)))  # K_P
        self.value_param_tokens = nn.Parameter(torch.empty(num_tokens, out_features, **factory))
        self.register_buffer('tau', torch.tensor(tau, dtype=torch.float32, device=device))
        self.reset_parameters()

    @property
    def num_tokens(self) -> int:
        """n, the current number of parameter token pairs."""
        return self.keys.shape[0]

    @property
    def keys(self) -> nn.Parameter:
        """K_P, whatever its attribute name (``key_name``)."""
        return getattr(self, self.key_name)

    def reset_parameters(self):
        """Re-draw K_P ~ N(0, key_std²) and V_P ~ N(0, value_std²)."""
        nn.init.normal_(self.keys, std=self.key_std)
        nn.init.normal_(self.value_param_tokens, std=self.value_std)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """A = X K_Pᵀ, ``[..., n]``."""
        return F.linear(x, self.key_param_tokens)

    @torch.jit.unused
    def _lean(self, x: torch.Tensor) -> bool:  # (TorchScript takes the plain path)
        return (self.score_norm == 'l2_norm_gelu' and torch.is_grad_enabled() and not is_fx_symbolic_tracing()
                and (x.is_cuda if self.lean_backward == 'auto' else bool(self.lean_backward)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in_features]`` → ``Θ(x K_Pᵀ) V_P`` ``[..., out_features]``."""
        scores = self.scores(x)
        if not torch.jit.is_scripting() and self._lean(x):
            return self._lean_attend(scores)
        return normalize_scores(scores, self.score_norm, self.tau, self.eps) @ self.value_param_tokens

    @torch.jit.unused
    def _lean_attend(self, scores: torch.Tensor) -> torch.Tensor:
        return l2_norm_gelu_attend(scores, self.value_param_tokens, self.tau, self.eps)  # same math, less memory

    @torch.no_grad()
    def grow(self, num_new_tokens: int, key_init: str = 'zeros', value_init: str = 'normal'):
        """Append ``num_new_tokens`` key/value parameter tokens in place (Eq. 12-13).

        Old tokens keep rows ``[:n_old]``; τ is left as it is. The parameters are replaced by new
        ``nn.Parameter`` objects (an optimizer holding the old ones must be remapped:
        :func:`tkvision.growth.grow_optimizer_state`).

        Args:
            num_new_tokens: m ≥ 0 tokens to append.
            key_init: ``'zeros'`` (the paper's Appendix B: function-preserving except for softmax)
                or ``'normal'`` (the public code's: N(0, key_std²)).
            value_init: ``'normal'`` (N(0, value_std²)) or ``'zeros'``.

        Returns:
            self.

        Raises:
            ValueError: negative ``num_new_tokens`` or an unknown init name.

        Warns:
            UserWarning: zero keys with ``score_norm='softmax'``: exp(0) = 1 gives the new tokens
            weight, so the output changes.
        """
        if num_new_tokens < 0:
            raise ValueError(f'num_new_tokens must be >= 0, got {num_new_tokens}')
        inits = {'zeros': lambda t, std: t.zero_(), 'normal': lambda t, std: t.normal_(std=std)}
        for name, init in (('key_init', key_init), ('value_init', value_init)):
            if init not in inits:
                raise ValueError(f'unknown {name} {init!r}; choose one of {tuple(inits)}')
        if key_init == 'zeros' and self.score_norm not in ZERO_KEY_EXACT and num_new_tokens:
            warnings.warn(f'score_norm={self.score_norm!r}: zero-initialised key tokens still receive '
                          'weight exp(0) > 0, so growing changes the output', stacklevel=2)
        for attr, init, std in ((self.key_name, key_init, self.key_std),
                                ('value_param_tokens', value_init, self.value_std)):
            old = getattr(self, attr)
            new = inits[init](old.new_empty(num_new_tokens, *old.shape[1:]), std)
            setattr(self, attr, nn.Parameter(torch.cat([old, new]), requires_grad=old.requires_grad))
        return self

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'num_tokens={self.num_tokens}, score_norm={self.score_norm}, tau={self.tau.item():.4g}')
