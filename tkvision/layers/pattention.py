"""Pattention: token-parameter attention, the layer TokenFormer builds everything from.

TokenFormer: Rethinking Transformer Scaling with Tokenized Model Parameters
(Wang et al. 2024, https://arxiv.org/abs/2410.23168), Section 3.2:

    O = Θ(X · K_Pᵀ) · V_P                                   (Eq. 4)
    Θ(A)_ij = f(A_ij · τ / ‖A_i‖₂),  f = GELU,  τ = √n        (Eq. 5)

X: input tokens ``[..., in_features]``; K_P: key parameter tokens ``[num_tokens, in_features]``;
V_P: value parameter tokens ``[num_tokens, out_features]``; scores A are normalised per input
token over the n = ``num_tokens`` parameter tokens (last axis). No bias anywhere.

Θ is chosen by ``score_norm``, a name in the registry `SCORE_NORMS` (names of the public
TokenFormer code, ``docs/reference/background.md``, "Pattention, as the public TokenFormer code
computes it"). The table below is the registry's (``tests/test_pattention.py`` holds them equal):

=================  ==================================  ===============  ======================  ==============
``score_norm``     computes                            default τ        zero new keys exact?    scale-invariant?
=================  ==================================  ===============  ======================  ==============
``l2_norm_gelu``   GELU(A · τ / ‖A‖₂)   (Eq. 5)         √n              yes                     yes
``l1_norm_gelu``   GELU(A · τ / ‖A‖₁)   (Table 4)       n               yes                     yes
``gelu_l2_norm``   τ · GELU(A) / ‖GELU(A)‖₂            √n              yes                     no
``softmax``        τ · softmax(A)       (Table 4, e^x)  n               no                      no
``gelu``           GELU(τ · A)          (no norm)       1               yes                     no
=================  ==================================  ===============  ======================  ==============

``gelu`` is the plain two-layer MLP a Pattention is often called: GELU(X·K_Pᵀ)·V_P is a bottleneck MLP of
width n without the per-token normalisation (the JAX port of the public code has this option); with τ = 1 it
is exactly that, and it is the control that measures what the normalisation buys (``docs/comparison.md``).

A new normalisation is one [`register_score_norm`][tkvision.layers.pattention.register_score_norm] call in this
file (its function, default τ, whether zero-initialised new keys leave the output unchanged, and whether scaling the
scores leaves Θ unchanged) plus its row above: validation, error messages, growth's exactness warning and every test
that loops over normalisations follow the registry.

τ is a fixed number stored in the module (buffer ``tau``, saved in every checkpoint), set at
construction (default above, from the construction-time n) and **not** recomputed when tokens are
appended: recomputing √(n+m) would break the function preservation of Appendix B.
[`Pattention.make_tau_learnable`][tkvision.layers.pattention.Pattention.make_tau_learnable] turns it into a learned
0-d parameter under the same state-dict key (a lever of ``docs/comparison.md``); such a layer is differentiated by
plain autograd.

Each Pattention has a ``kind`` (`PATTENTION_KINDS`: ``patch``, ``qkv``, ``proj``, ``ffn`` and
the MAE decoder's ``decoder_*``), set by the model that builds it; growth groups layers by kind.
"""
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from .pattention_autograd import l2_norm_gelu, l2_norm_gelu_attend

__all__ = ['Pattention', 'ScoreNorm', 'SCORE_NORMS', 'register_score_norm', 'default_tau', 'normalize_scores',
           'PATTENTION_KINDS', 'ENCODER_KINDS', 'DECODER_KINDS', 'BACKWARD_MODES', 'set_backward_mode']

#: Kinds of Pattention in a TokenFormer ViT, as named in its ``num_tokens_*`` kwargs and in growth.
ENCODER_KINDS = ('patch', 'qkv', 'proj', 'ffn')
#: Kinds of the Pattentions of an MAE decoder (``decoder.embed``, ``decoder.blocks.*``, ``decoder.pred``).
DECODER_KINDS = ('decoder_embed', 'decoder_qkv', 'decoder_proj', 'decoder_ffn', 'decoder_pred')
#: Every kind a Pattention can have.
PATTENTION_KINDS = ENCODER_KINDS + DECODER_KINDS
#: How a training forward of ``l2_norm_gelu`` is differentiated
#: ([`Pattention`][tkvision.layers.pattention.Pattention]'s ``backward_mode``).
BACKWARD_MODES = ('closed_form', 'lean', 'autograd', 'fused')


@dataclass(frozen=True)
class ScoreNorm:
    """One score normalisation Θ of the registry.

    Attributes:
        name: the ``score_norm`` name.
        module: an ``nn.Module`` class without parameters; ``module()(scores, tau, eps)`` computes Θ
            over the last axis of ``scores [..., n]`` (a `Normalize` subclass).
        default_tau: ``default_tau(n) -> τ`` for ``n`` parameter tokens.
        zero_key_exact: appending zero-initialised key tokens leaves the output unchanged.
        scale_invariant: Θ(c·A) = Θ(A) for every c > 0 (up to ``eps``), so a Pattention's output does not
            change when its input token is scaled, and a LayerNorm without bias in front of it folds into
            its keys (``tkvision.layers.Block``'s ``norm_fold``).
    """
    name: str
    module: type
    default_tau: Callable[[int], float]
    zero_key_exact: bool
    scale_invariant: bool


#: The registry: ``{name: ScoreNorm}``; iterate it for every normalisation's name.
SCORE_NORMS: Dict[str, ScoreNorm] = {}


def register_score_norm(
        name: str,
        default_tau: Callable[[int], float],
        zero_key_exact: bool,
        scale_invariant: bool = False,
) -> Callable:
    """Class decorator adding a ``Normalize`` subclass to ``SCORE_NORMS`` under ``name``
    (the fields of ``ScoreNorm``; ``scale_invariant`` defaults to False, which keeps a block's
    LayerNorm explicit in front of the new normalisation).

    Raises:
        ValueError: ``name`` is already registered.
    """
    def add(cls):
        if name in SCORE_NORMS:
            raise ValueError(f'score_norm {name!r} is already registered')
        SCORE_NORMS[name] = ScoreNorm(name, cls, default_tau, zero_key_exact, scale_invariant)
        return cls
    return add


class Normalize(nn.Module):
    """Θ over the last axis: ``scores [..., n]`` -> same shape and dtype, computed in float32 (or
    float64), which keeps the norm safe under bf16/fp16 autocast. Subclasses define
    `normalize` on the promoted scores. A module (no parameters, nothing in the state dict) so
    that TorchScript scripts a Pattention with any registered Θ."""

    def forward(self, scores: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        a = scores.to(torch.promote_types(scores.dtype, torch.float32))  # >= float32
        return self.normalize(a, tau, eps).to(scores.dtype)

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError


def _l2(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


@register_score_norm('l2_norm_gelu', default_tau=math.sqrt, zero_key_exact=True, scale_invariant=True)
class L2NormGELU(Normalize):
    """GELU(A · τ / ‖A‖₂), paper Eq. 5 (the public code's default)."""

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        return F.gelu(a * (tau / _l2(a, eps)))


@register_score_norm('l1_norm_gelu', default_tau=float, zero_key_exact=True, scale_invariant=True)
class L1NormGELU(Normalize):
    """GELU(A · τ / ‖A‖₁), Table 4's "GELU + L1"; τ = n, the L1 analogue of √n (the paper gives none)."""

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        return F.gelu(a * (tau / torch.linalg.vector_norm(a, ord=1, dim=-1, keepdim=True).clamp_min(eps)))


@register_score_norm('gelu_l2_norm', default_tau=math.sqrt, zero_key_exact=True, scale_invariant=False)
class GELUL2Norm(Normalize):
    """τ · GELU(A) / ‖GELU(A)‖₂: GELU first, then the L2 normalisation (public code)."""

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        g = F.gelu(a)
        return g * (tau / _l2(g, eps))


@register_score_norm('softmax', default_tau=float, zero_key_exact=False, scale_invariant=False)
class Softmax(Normalize):
    """τ · softmax(A), τ = n: the public code's ×n "balances the variance" (Table 4's exp + L1 row).
    Zero keys still get weight exp(0) = 1, so growth with zero keys is not exact."""

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.softmax(a, dim=-1) * tau


@register_score_norm('gelu', default_tau=lambda num_tokens: 1.0, zero_key_exact=True, scale_invariant=False)
class PlainGELU(Normalize):
    """GELU(τ · A), τ = 1: no normalisation of the scores, so the Pattention is a plain GELU MLP of width n
    (the control of ``docs/comparison.md``; τ only matters once learned, ``make_tau_learnable``)."""

    def normalize(self, a: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
        return F.gelu(a * tau)


def score_norm_entry(score_norm: str) -> ScoreNorm:
    """The registry entry of ``score_norm``.

    Raises:
        ValueError: an unregistered name; the message lists the registered ones.
    """
    entry = SCORE_NORMS.get(score_norm)
    if entry is None:
        raise ValueError(f'unknown score_norm {score_norm!r}; choose one of {", ".join(SCORE_NORMS)}')
    return entry


def default_tau(score_norm: str, num_tokens: int) -> float:
    """Default scale τ of ``score_norm`` for ``num_tokens`` parameter tokens (the registry's).

    Raises:
        ValueError: unknown ``score_norm``.
    """
    return float(score_norm_entry(score_norm).default_tau(num_tokens))


def normalize_scores(
        scores: torch.Tensor,
        score_norm: str,
        tau: Optional[float],
        eps: float = 1e-6,
) -> torch.Tensor:
    """Θ of Eq. 5 (and its ablation variants) over the last axis of ``scores``, by name.

    Args:
        scores: A = X · K_Pᵀ, shape ``[..., n]``.
        score_norm: a name of `SCORE_NORMS`.
        tau: scale τ (float or tensor broadcastable to ``[..., 1]``).
        eps: lower bound on the norm, so an all-zero row gives zeros, never NaN.

    Returns:
        Normalised scores S, same shape and dtype as ``scores`` (computed in float32 or float64).

    Raises:
        ValueError: unknown ``score_norm``.
    """
    return score_norm_entry(score_norm).module()(scores, torch.as_tensor(tau), eps)


class Pattention(nn.Module):
    """Token-parameter attention layer, ``[..., in_features] -> [..., out_features]`` (Eq. 4-5).

    Args:
        in_features: d_in, width of the input tokens.
        out_features: d_out, width of the output tokens.
        num_tokens: n, number of key/value parameter token pairs.
        score_norm: normalisation Θ, one of `SCORE_NORMS` (default: the paper's Eq. 5).
        tau: fixed scale τ; ``None`` gives [`default_tau`][tkvision.layers.pattention.default_tau] of the
            construction-time n.
        eps: lower bound on the score norm (float32).
        key_std: std of the normal init of the key tokens (0.02, the public TokenFormer code's).
        value_std: std of the normal init of the value tokens (0.02 here; the model passes the
            public code's 2 / (depth · √d) for its blocks).
        kind: what the layer is in its model (one of `PATTENTION_KINDS`, set by the model that
            builds it; growth groups layers by kind), or None for a stand-alone layer.
        backward_mode: how a training forward of ``l2_norm_gelu`` is differentiated (one of
            `BACKWARD_MODES`; the other normalisations always use autograd):

            - ``'closed_form'`` (default): Θ's closed-form gradient in one autograd function
              (``pattention_autograd.py``); the fastest training step measured, on the CPU and on a GPU
              eager (the ratios: ``docs/performance.md``).
            - ``'lean'``: the same math saving one ``[..., n]`` tensor per layer instead of three and
              recomputing the rest in backward; use it when activation memory limits the batch (its saved
              activations against ViT-B's: ``docs/performance.md``).
            - ``'autograd'``: plain autograd of `L2NormGELU`, the reference the other two are
              tested against (``tests/test_pattention.py``).
            - ``'fused'``: the Triton kernels of ``tkvision/layers/pattention_triton.py`` (a custom op,
              forward and backward, inference too) on a CUDA device; off by default until a GPU measurement
              shows it wins (``docs/performance.md``).

            Inference, TorchScript, FX tracing, ``torch.export`` and a learned τ take the plain path (but for
            ``'fused'``, which runs inference too and leaves only the last four to the plain path).

    Attributes:
        key_param_tokens: K_P, ``[num_tokens, in_features]`` (a subclass may keep K_P under another
            name and shape, ``key_name``, e.g. the patch embedding's conv-shaped ``weight``).
        value_param_tokens: V_P, ``[num_tokens, out_features]``.
        tau: 0-d float32 buffer holding τ (persistent: saved in the state dict); a 0-d parameter under the
            same key after [`make_tau_learnable`][tkvision.layers.pattention.Pattention.make_tau_learnable].
        score_normalization: the registry's Θ module of ``score_norm`` (no parameters).
        prefix_tokens: ``None`` (all n tokens), or k: the layer runs as the sub-layer of its first k
            key/value tokens (slices of the parameters, no copy;
            [`tkvision.growth.elastic`][tkvision.growth.elastic]), with the whole layer's τ.
        centre_keys: ``False``, or ``True`` when the LayerNorm in front of the layer is folded into its keys
            (set by ``tkvision.layers.Block``, ``norm_fold``): the scores use each key token centred
            over its ``in_features`` entries, ``K_c = K − mean(K)``, so ``x · K_cᵀ = (x − mean(x)) · Kᵀ``;
            with a scale-invariant Θ the 1/σ(x) of the LayerNorm cancels. The stored keys are unchanged.


    Raises:
        ValueError: unknown ``score_norm`` (whatever ``tau``), unknown ``kind`` or ``backward_mode``, or a
            non-positive size.
    """

    #: the attribute holding K_P (``keys``); rows are parameter tokens, whatever the other dims
    key_name = 'key_param_tokens'
    if TYPE_CHECKING:  # set in __init__ (K_P by name); TorchScript reads class annotations as attribute types
        key_param_tokens: nn.Parameter
        value_param_tokens: nn.Parameter
        tau: torch.Tensor
    __jit_unused_properties__ = ['num_tokens', 'keys', 'parameters_per_token']

    def __init__(
            self,
            in_features: int,
            out_features: int,
            num_tokens: int,
            score_norm: str = 'l2_norm_gelu',
            tau: Optional[float] = None,
            eps: float = 1e-6,
            key_std: float = 0.02,
            value_std: float = 0.02,
            kind: Optional[str] = None,
            backward_mode: str = 'closed_form',
            device: Optional[Union[str, torch.device]] = None,
            dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        if min(in_features, out_features, num_tokens) <= 0:
            raise ValueError(f'Pattention sizes must be positive, got in_features={in_features}, '
                             f'out_features={out_features}, num_tokens={num_tokens}')
        entry = score_norm_entry(score_norm)
        if kind is not None and kind not in PATTENTION_KINDS:
            raise ValueError(f'unknown Pattention kind {kind!r}; kinds are {", ".join(PATTENTION_KINDS)}')
        _check_backward_mode(backward_mode)
        self.kind = kind
        self.score_normalization = entry.module()
        tau = entry.default_tau(num_tokens) if tau is None else tau
        self.in_features = in_features
        self.out_features = out_features
        self.score_norm = score_norm
        self.eps = eps
        self.key_std = key_std
        self.value_std = value_std
        self.backward_mode = backward_mode
        self.prefix_tokens: Optional[int] = None
        self.centre_keys = False
        keys = torch.empty(num_tokens, in_features, device=device, dtype=dtype)
        setattr(self, self.key_name, nn.Parameter(keys))  # K_P
        self.value_param_tokens = nn.Parameter(torch.empty(num_tokens, out_features, device=device, dtype=dtype))
        self.register_buffer('tau', torch.tensor(float(tau), dtype=torch.float32, device=device))
        self.reset_parameters()

    @property
    def num_tokens(self) -> int:
        """n, the current number of parameter token pairs (all of them, whatever ``prefix_tokens``)."""
        return self.keys.shape[0]

    @property
    def parameters_per_token(self) -> int:
        """Parameters one key/value token pair holds (a key row and a value row)."""
        return self.keys[0].numel() + self.value_param_tokens[0].numel()

    @property
    def keys(self) -> nn.Parameter:
        """K_P, whatever its attribute name (``key_name``)."""
        return getattr(self, self.key_name)

    def reset_parameters(self) -> None:
        """Re-draw K_P ~ N(0, key_std²) and V_P ~ N(0, value_std²)."""
        nn.init.normal_(self.keys, std=self.key_std)
        nn.init.normal_(self.value_param_tokens, std=self.value_std)

    def active(self, tokens: torch.Tensor) -> torch.Tensor:
        """The rows of a parameter-token tensor (``[n, ...]``) the layer runs with: all, or the first
        ``prefix_tokens`` (a view)."""
        k = self.prefix_tokens
        if k is None:
            return tokens
        return tokens[:k]

    def fold_keys(self, keys: torch.Tensor, key_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Key tokens ``[k, in_features]`` as the scores use them: times ``key_scale`` (``[in_features]``, a
        folded LayerNorm's weight) when given, then each row centred when ``centre_keys``; unchanged
        otherwise."""
        if key_scale is not None:
            keys = keys * key_scale
        if self.centre_keys:
            keys = keys - keys.mean(-1, keepdim=True)
        return keys

    def scores(self, x: torch.Tensor, key_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """A = X K_Pᵀ over the active key tokens (as ``fold_keys`` gives them), ``[..., k]``."""
        return F.linear(x, self.fold_keys(self.active(self.key_param_tokens), key_scale))

    def forward(self, x: torch.Tensor, key_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [..., in_features]`` → ``Θ(x K_Pᵀ) V_P`` ``[..., out_features]`` over the active tokens.

        Args:
            x: input tokens ``[..., in_features]``.
            key_scale: ``[in_features]`` or None: the weight of a LayerNorm folded into the keys
                (``tkvision.layers.Block``), multiplied into each key token before centring.
        """
        values = self.active(self.value_param_tokens)
        tau = self.tau
        if not torch.jit.is_scripting() and self._fused():
            return self._fused_forward(x, key_scale)
        scores = self.scores(x, key_scale)
        if not torch.jit.is_scripting():
            mode = self._training_backward()
            if mode == 'lean':
                return l2_norm_gelu_attend(scores, values, tau, self.eps)
            if mode == 'closed_form':
                return l2_norm_gelu(scores, tau, self.eps) @ values
        return self.score_normalization(scores, tau, self.eps) @ values

    @torch.jit.unused
    def _fused_forward(self, x: torch.Tensor, key_scale: Optional[torch.Tensor]) -> torch.Tensor:
        """The forward through the fused Triton op (``tkvision/layers/pattention_triton.py``)."""
        from .pattention_triton import fused_l2_norm_gelu
        keys = self.fold_keys(self.active(self.key_param_tokens), key_scale)
        return fused_l2_norm_gelu(x, keys, self.active(self.value_param_tokens), self.tau, self.eps)

    @torch.jit.unused
    def _fused(self) -> bool:
        """Whether this call takes the fused Triton op: ``backward_mode: fused``, Θ = ``l2_norm_gelu`` with a fixed
        τ, scores that are the product X · K_Pᵀ (not a subclass's own, the patch embedding's convolution), and not
        traced (FX, ``torch.jit.trace``, ``torch.export``: they and ONNX see the plain path)."""
        return (self.backward_mode == 'fused' and self.score_norm == 'l2_norm_gelu' and not self.tau.requires_grad
                and type(self).scores is Pattention.scores
                and not is_fx_symbolic_tracing() and not torch.jit.is_tracing() and not torch.compiler.is_exporting())

    @torch.jit.unused
    def _training_backward(self) -> str:
        """``backward_mode``, or ``'autograd'`` where the hand-written backwards do not apply: another Θ,
        no gradient to compute, FX tracing, or a learned τ (they give τ no gradient)."""
        if (self.score_norm != 'l2_norm_gelu' or not torch.is_grad_enabled() or is_fx_symbolic_tracing()
                or self.tau.requires_grad or self.backward_mode == 'fused'):
            return 'autograd'
        return self.backward_mode

    def make_tau_learnable(self) -> 'Pattention':
        """Turn the τ buffer into a learned 0-d ``nn.Parameter`` with the same value and state-dict key
        ``tau``, so checkpoints load either way. The layer then takes plain autograd, which differentiates
        Θ in τ too (for Eq. 5, ∂L/∂τ = ∑ ∂L/∂Z ⊙ Z / τ over the normalised scores Z), not the
        hand-written backwards, which give τ no gradient. A 0-d parameter gets no weight decay from timm's optimizer
        factory. Returns self (idempotent)."""
        if not isinstance(self.tau, nn.Parameter):
            tau = self.tau
            del self._buffers['tau']
            self.tau = nn.Parameter(tau)
        return self

    @torch.no_grad()
    def grow(self, num_new_tokens: int, key_init: str = 'zeros', value_init: str = 'normal') -> 'Pattention':
        """Append ``num_new_tokens`` key/value parameter tokens in place (Eq. 12-13).

        Old tokens keep rows ``[:n_old]``; τ is left as it is. The parameters are replaced by new
        ``nn.Parameter`` objects (an optimizer holding the old ones must be remapped:
        `tkvision.growth.grow_optimizer_state`).

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
            UserWarning: zero keys with a normalisation that is not ``zero_key_exact`` (``softmax``, where
                exp(0) = 1 gives the new tokens weight), so the output changes.
        """
        if num_new_tokens < 0:
            raise ValueError(f'num_new_tokens must be >= 0, got {num_new_tokens}')
        inits = {'zeros': lambda t, std: t.zero_(), 'normal': lambda t, std: t.normal_(std=std)}
        for name, init in (('key_init', key_init), ('value_init', value_init)):
            if init not in inits:
                raise ValueError(f'unknown {name} {init!r}; choose one of {tuple(inits)}')
        if key_init == 'zeros' and not SCORE_NORMS[self.score_norm].zero_key_exact and num_new_tokens:
            warnings.warn(f'score_norm={self.score_norm!r}: zero-initialised key tokens still receive '
                          'weight exp(0) > 0, so growing changes the output', stacklevel=2)
        for attr, init, std in ((self.key_name, key_init, self.key_std),
                                ('value_param_tokens', value_init, self.value_std)):
            old = getattr(self, attr)
            new = inits[init](old.new_empty(num_new_tokens, *old.shape[1:]), std)
            setattr(self, attr, nn.Parameter(torch.cat([old, new]), requires_grad=old.requires_grad))
        return self

    @torch.no_grad()
    def truncate(self, num_tokens: int) -> 'Pattention':
        """Keep only the first ``num_tokens`` key/value parameter tokens, in place: the layer becomes the
        sub-layer it runs as with ``prefix_tokens = num_tokens`` (same outputs, the same τ). The inverse of
        [`grow`][tkvision.layers.pattention.Pattention.grow] for its first rows. Parameters are replaced by new
        ``nn.Parameter`` objects; ``prefix_tokens`` is cleared.

        Returns:
            self.

        Raises:
            ValueError: ``num_tokens`` outside 1..n.
        """
        if not 1 <= num_tokens <= self.num_tokens:
            raise ValueError(f'num_tokens must be in 1..{self.num_tokens}, got {num_tokens}')
        self.prefix_tokens = None
        for attr in (self.key_name, 'value_param_tokens'):
            old = getattr(self, attr)
            setattr(self, attr, nn.Parameter(old[:num_tokens].clone(), requires_grad=old.requires_grad))
        return self

    def extra_repr(self) -> str:
        # A model built on the meta device (shape checks, parameter counts) has no value for tau to print.
        tau = 'meta' if self.tau.is_meta else f'{self.tau.item():.4g}'
        prefix = '' if self.prefix_tokens is None else f', prefix_tokens={self.prefix_tokens}'
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'num_tokens={self.num_tokens}{prefix}, score_norm={self.score_norm}, tau={tau}, kind={self.kind}')


def set_backward_mode(model: nn.Module, backward_mode: str) -> None:
    """Set ``backward_mode`` (`BACKWARD_MODES`) on every Pattention of ``model``.

    Raises:
        ValueError: an unknown mode, naming the known ones.
    """
    _check_backward_mode(backward_mode)
    for module in model.modules():
        if isinstance(module, Pattention):
            module.backward_mode = backward_mode


def _check_backward_mode(backward_mode: str) -> None:
    """Refuse a mode outside `BACKWARD_MODES`, saying what to use instead of a removed one."""
    if backward_mode == 'compiled':
        raise ValueError("backward_mode 'compiled' was removed (it never beat 'closed_form': CHANGELOG.md); use "
                         "'closed_form', and torch.compile the whole model (compile: true) for one pass")
    if backward_mode not in BACKWARD_MODES:
        raise ValueError(f'unknown backward_mode {backward_mode!r}; choose one of {", ".join(BACKWARD_MODES)}')
