"""Hand-written backward passes of Θ for the default ``l2_norm_gelu`` (paper Eq. 5).

Plain autograd differentiates ``GELU(A · τ / max(‖A‖₂, ε))`` op by op: it saves A, the normalised
pre-GELU scores Z and (through the value matmul) S = GELU(Z), and its backward makes about seven passes
over the ``[..., n]`` scores (GELU', two products for the scale and the norm, their reduction, a masked
fill for the zero norm, the sum of the two paths). With r = τ / max(‖A‖₂, ε), Z = A·r, S = GELU(Z) the
gradient has a closed form:

    dZ = dS ⊙ GELU'(Z)
    dA = r · (dZ − Z ⟨dZ, Z⟩ / ‖Z‖²)   where ‖A‖₂ > ε (then ‖Z‖ = τ), else r · dZ

Two functions use it:

- `l2_norm_gelu`, **closed form** (CPU default, ``Pattention(closed_form_backward=True)``): Θ
  alone, saving Z and r; backward is one fused GELU', one row dot product and two elementwise passes
  (the quick recipe's training step faster than with autograd's, one ``[..., n]`` tensor fewer saved per
  Pattention; the measured ratio is in ``docs/performance.md``).
- `l2_norm_gelu_attend`, **lean** (CUDA default, ``lean_backward``): Θ and the value matmul,
  saving only A and the per-row norm and recomputing Z and S in backward: one ``[..., n]`` tensor per
  Pattention instead of three, where activation memory limits the batch.

(A third, the closed form through ``torch.compile`` in an eager model, was removed: it never beat the closed
form; ``CHANGELOG.md``.)

`L2NormGELU` (plain autograd) stays the reference;
``tests/test_pattention.py`` holds both equal to it in value and gradient (float64, and bf16 autocast).
"""
import math

import torch
import torch.nn.functional as F

__all__ = ['l2_norm_gelu', 'l2_norm_gelu_attend']

_INV_SQRT2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _scale(a: torch.Tensor, tau: torch.Tensor, eps):
    """``(‖A‖₂, r = τ / max(‖A‖₂, ε))`` per row, ``[..., 1]`` each; ``eps`` a float or a 0-d tensor."""
    norm = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
    return norm, tau / norm.clamp_min(eps)


def _grad_scores(grad_z: torch.Tensor, z: torch.Tensor, r: torch.Tensor, norm: torch.Tensor, tau: torch.Tensor,
                 eps) -> torch.Tensor:
    """dA from dZ (module docstring): the component of dZ along Z is removed (the norm's gradient), then
    scaled by r. ‖Z‖² is τ² where ‖A‖₂ > ε; below ε the norm is a constant and dA = r · dZ (τ = 0 gives
    Z = 0 and dA = 0, not 0/0)."""
    coef = torch.linalg.vecdot(grad_z, z, dim=-1).unsqueeze(-1) / (tau * tau).clamp_min(1e-30)
    coef = torch.where(norm > eps, coef, torch.zeros_like(coef))
    return torch.addcmul(grad_z, z, coef, value=-1).mul_(r)  # two passes over [..., n], no temporaries


class _L2NormGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, tau, eps):
        a = scores.to(torch.promote_types(scores.dtype, torch.float32))  # >= float32, as the reference
        norm, r = _scale(a, tau, eps)
        z = a * r
        ctx.save_for_backward(z, r, norm, tau)
        ctx.eps = eps
        return F.gelu(z).to(scores.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        z, r, norm, tau = ctx.saved_tensors
        grad_z = torch.ops.aten.gelu_backward(grad_out.to(z.dtype), z)  # dS ⊙ GELU'(Z), one pass
        return _grad_scores(grad_z, z, r, norm, tau, ctx.eps).to(grad_out.dtype), None, None


def l2_norm_gelu(scores: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
    """``GELU(A · τ / max(‖A‖₂, ε))`` over the last axis of ``scores`` A ``[..., n]`` (Eq. 5), same shape
    and dtype, computed in float32 (or float64), differentiated in closed form (module docstring).
    ``tau``: a tensor broadcastable to ``[..., 1]`` (no gradient is computed for it)."""
    return _L2NormGELU.apply(scores, tau, eps)


class _L2NormGELUAttend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, value, tau, eps):
        a = scores.to(torch.promote_types(scores.dtype, torch.float32))  # >= float32
        norm, r = _scale(a, tau, eps)
        s = F.gelu(a * r)
        ctx.save_for_backward(scores, value, norm, tau)
        ctx.eps = eps
        return s.to(scores.dtype) @ value.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        scores, value, norm, tau = ctx.saved_tensors
        r = tau / norm.clamp_min(ctx.eps)
        z = scores.to(r.dtype) * r
        cdf = 0.5 * (1 + torch.erf(z * _INV_SQRT2))
        dtype = scores.dtype
        grad_value = None
        if ctx.needs_input_grad[1]:
            s = (z * cdf).to(dtype)
            grad_value = (s.reshape(-1, s.shape[-1]).t() @ grad_out.reshape(-1, grad_out.shape[-1]).to(dtype))
            grad_value = grad_value.to(value.dtype)
        grad_scores = None
        if ctx.needs_input_grad[0]:
            grad_z = (grad_out.to(dtype) @ value.to(dtype).t()).to(z.dtype)
            grad_z = grad_z * (cdf + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI)  # GELU'(z)
            grad_scores = _grad_scores(grad_z, z, r, norm, tau, ctx.eps).to(dtype)
        return grad_scores, grad_value, None, None


def l2_norm_gelu_attend(
        scores: torch.Tensor,
        value: torch.Tensor,
        tau: torch.Tensor,
        eps: float,
) -> torch.Tensor:
    """``GELU(A · τ / max(‖A‖₂, ε)) · V`` for ``scores`` A ``[..., n]`` and ``value`` V ``[n, d_out]``,
    returning ``[..., d_out]`` in A's dtype, normalisation in float32, saving only A for backward (lean)."""
    return _L2NormGELUAttend.apply(scores, value, tau, eps)
