"""Memory-lean training path of Pattention for the default ``l2_norm_gelu`` (paper Eq. 5).

``Θ(A)·V_P`` with a hand-written backward that saves only the scores A (and the per-row norm),
recomputing the normalised scores in backward. Plain autograd saves A, the normalised pre-GELU
scores and the GELU output: three ``[..., n]`` tensors per Pattention instead of one.

Backward (r = τ / max(‖A‖₂, ε), Z = A·r, S = GELU(Z), O = S·V):
    dV = Sᵀ·dO;  dS = dO·Vᵀ;  dZ = dS ⊙ GELU'(Z)
    dA = r · (dZ − Z ⟨dZ, Z⟩ / ‖Z‖²)   where ‖A‖₂ > ε (then ‖Z‖ = τ), else r · dZ

:func:`normalize_scores` in ``pattention.py`` stays the reference; ``tests/test_pattention.py`` holds
the two equal in value and gradient.
"""
import math

import torch

__all__ = ['l2_norm_gelu_attend']

_INV_SQRT2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


class _L2NormGELUAttend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, value, tau, eps):
        a = scores.to(torch.promote_types(scores.dtype, torch.float32))  # >= float32
        norm = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
        s = torch.nn.functional.gelu(a * (tau / norm.clamp_min(eps)))
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
            proj = (grad_z * z).sum(-1, keepdim=True) / (z * z).sum(-1, keepdim=True).clamp_min(1e-30)
            grad_z = grad_z - torch.where(norm > ctx.eps, proj, torch.zeros_like(proj)) * z
            grad_scores = (grad_z * r).to(dtype)
        return grad_scores, grad_value, None, None


def l2_norm_gelu_attend(scores: torch.Tensor, value: torch.Tensor, tau: torch.Tensor, eps: float) -> torch.Tensor:
    """``GELU(A · τ / max(‖A‖₂, ε)) · V`` for ``scores`` A ``[..., n]`` and ``value`` V ``[n, d_out]``,
    returning ``[..., d_out]`` in A's dtype, normalisation in float32, saving only A for backward."""
    return _L2NormGELUAttend.apply(scores, value, tau, eps)
