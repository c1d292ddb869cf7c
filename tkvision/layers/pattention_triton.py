"""A fused Pattention for ``l2_norm_gelu`` (paper Eq. 4-5) in Triton: ``O = GELU(A · r) · V_P`` with ``A = X · K_Pᵀ``
and ``r = τ / max(‖A_i‖₂, ε)`` per row, forward and backward, as one ``torch.library`` custom op
(``tkvision::pattention_l2_norm_gelu``) with a registered autograd formula and a fake (meta) implementation, so that
``torch.compile`` keeps it whole. ``backward_mode: fused`` selects it (`tkvision.layers.pattention.Pattention`); off by
default until a GPU measurement shows it wins (``docs/performance.md``).

Why: an MLP writes its hidden activation once, GELU fused into the first product's epilogue. Θ needs each row's
norm before the GELU, so the plain path writes the scores A, reads them back to normalise and apply GELU, writes S
and reads it again in the value product and in the backward. The row norm needs the whole row, but the second
product reads the row anyway, so two passes keep the traffic of an MLP:

- **forward pass 1** (`_scores_kernel`): the first product A = X · K_Pᵀ, tile by tile over the parameter tokens,
  with an epilogue that writes A and accumulates each row's sum of squares (one program holds a block of rows across
  all n tokens, so the sum is in a fixed order: deterministic);
- **forward pass 2** (`_attend_kernel`): the second product O = S · V_P whose prologue scales each loaded tile of A by
  its row's r and applies GELU before the tile enters the product; S is never written.

The backward has the same shape (dZ = dS ⊙ GELU'(Z), dA = r · (dZ − Z ⟨dZ, Z⟩ / τ²) where ‖A_i‖ > ε, else r · dZ;
``tkvision/layers/pattention_autograd.py`` derives it):

- **backward pass 1** (`_grad_scores_kernel`): dS = dO · V_Pᵀ with an epilogue that recomputes Z from A, forms dZ
  and accumulates each row's ⟨dZ, Z⟩;
- **backward pass 2** (`_grad_prologue_kernel`): dA and S elementwise from dZ, A and the row sums; then dX = dA · K_P,
  dK_P = dAᵀ · X and dV_P = Sᵀ · dO as three library products (cuBLAS).

What is saved for the backward: X, K_P, V_P, A (in the compute dtype) and r: one ``[..., n]`` tensor per layer, as an
MLP saves its hidden activation. Products accumulate in float32; A is stored in the compute dtype (bf16 under bf16
autocast), its row norms from the float32 accumulator. The triangle of correctness: ``tests/test_pattention_triton.py``
holds outputs and the gradients of X, K_P and V_P against float64 math at odd sizes, float32 and bfloat16, on the CPU
under Triton's interpreter (``TRITON_INTERPRET=1``, where each tile is upcast to float32 before its product: the
interpreter's bf16 products are wrong).

Growth (appended tokens), elastic prefixes (the first k tokens: views of K_P and V_P) and a LayerNorm folded into the
keys (``key_scale``, centred keys) reach the op as the key and value tensors the layer computes by ``fold_keys`` and
``active``, through autograd: they go through it unchanged. A learned τ, another Θ, TorchScript, FX tracing and
``torch.export`` take the plain path (`tkvision.layers.pattention.Pattention`), which ONNX and export see.
"""
import math
import os
from typing import Tuple

import torch

__all__ = ['fused_l2_norm_gelu', 'triton_available', 'INTERPRETED']

#: Triton runs its kernels on the CPU, slowly, through its interpreter (``TRITON_INTERPRET=1``, read at import).
INTERPRETED = os.environ.get('TRITON_INTERPRET') == '1'

try:
    import triton
    import triton.language as tl
except ImportError:  # triton comes with CUDA builds of torch; elsewhere the layer keeps the plain path
    triton = None

_INV_SQRT2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
#: Tile sizes: rows, parameter tokens, input and output features (powers of two; a GPU autotune is future work).
BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32


def triton_available() -> bool:
    """Whether the fused op can run here: Triton installed, and a CUDA device or the interpreter."""
    return triton is not None and (torch.cuda.is_available() or INTERPRETED)


if triton is not None:
    @triton.jit
    def _gelu(z):
        return 0.5 * z * (1 + tl.math.erf(z * 0.7071067811865476))

    @triton.jit
    def _scores_kernel(x_ptr, k_ptr, a_ptr, sumsq_ptr, M, N, D,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
        """A[rows, :] = X[rows] · K_Pᵀ written tile by tile; each row's sum of squares from the float32 products."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn, rk = tl.arange(0, BN), tl.arange(0, BK)
        sumsq = tl.zeros((BM,), dtype=tl.float32)
        for n0 in range(0, N, BN):
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, D, BK):
                x = tl.load(x_ptr + rm[:, None] * D + (k0 + rk)[None, :],
                            mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < D), other=0.)
                kt = tl.load(k_ptr + (n0 + rn)[None, :] * D + (k0 + rk)[:, None],
                             mask=((n0 + rn)[None, :] < N) & ((k0 + rk)[:, None] < D), other=0.)
                if UPCAST:
                    x, kt = x.to(tl.float32), kt.to(tl.float32)
                acc += tl.dot(x, kt)
            sumsq += tl.sum(acc * acc, axis=1)
            tl.store(a_ptr + rm[:, None] * N + (n0 + rn)[None, :], acc.to(a_ptr.dtype.element_ty),
                     mask=(rm[:, None] < M) & ((n0 + rn)[None, :] < N))
        tl.store(sumsq_ptr + rm, sumsq, mask=rm < M)

    @triton.jit
    def _attend_kernel(a_ptr, r_ptr, v_ptr, o_ptr, M, N, E,
                       BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, UPCAST: tl.constexpr):
        """O[rows, cols] = GELU(A[rows] · r[rows]) · V_P[:, cols]: the scale and GELU in the product's prologue."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        re = tl.program_id(1) * BE + tl.arange(0, BE)
        rn = tl.arange(0, BN)
        r = tl.load(r_ptr + rm, mask=rm < M, other=0.)
        acc = tl.zeros((BM, BE), dtype=tl.float32)
        for n0 in range(0, N, BN):
            a = tl.load(a_ptr + rm[:, None] * N + (n0 + rn)[None, :],
                        mask=(rm[:, None] < M) & ((n0 + rn)[None, :] < N), other=0.).to(tl.float32)
            s = _gelu(a * r[:, None])
            v = tl.load(v_ptr + (n0 + rn)[:, None] * E + re[None, :],
                        mask=((n0 + rn)[:, None] < N) & (re[None, :] < E), other=0.)
            if UPCAST:
                acc += tl.dot(s, v.to(tl.float32))
            else:
                acc += tl.dot(s.to(v.dtype), v)
        tl.store(o_ptr + rm[:, None] * E + re[None, :], acc.to(o_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (re[None, :] < E))

    @triton.jit
    def _grad_scores_kernel(do_ptr, v_ptr, a_ptr, r_ptr, dz_ptr, c_ptr, M, N, E,
                            BM: tl.constexpr, BN: tl.constexpr, BE: tl.constexpr, UPCAST: tl.constexpr):
        """dZ = (dO · V_Pᵀ) ⊙ GELU'(Z) with Z recomputed from A, written in float32; each row's ⟨dZ, Z⟩."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn, re = tl.arange(0, BN), tl.arange(0, BE)
        r = tl.load(r_ptr + rm, mask=rm < M, other=0.)
        c = tl.zeros((BM,), dtype=tl.float32)
        for n0 in range(0, N, BN):
            ds = tl.zeros((BM, BN), dtype=tl.float32)
            for e0 in range(0, E, BE):
                do = tl.load(do_ptr + rm[:, None] * E + (e0 + re)[None, :],
                             mask=(rm[:, None] < M) & ((e0 + re)[None, :] < E), other=0.)
                vt = tl.load(v_ptr + (n0 + rn)[None, :] * E + (e0 + re)[:, None],
                             mask=((n0 + rn)[None, :] < N) & ((e0 + re)[:, None] < E), other=0.)
                if UPCAST:
                    do, vt = do.to(tl.float32), vt.to(tl.float32)
                ds += tl.dot(do, vt)
            mask = (rm[:, None] < M) & ((n0 + rn)[None, :] < N)
            z = tl.load(a_ptr + rm[:, None] * N + (n0 + rn)[None, :], mask=mask, other=0.).to(tl.float32) * r[:, None]
            gelu_grad = 0.5 * (1 + tl.math.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
            dz = ds * gelu_grad
            c += tl.sum(dz * z, axis=1)
            tl.store(dz_ptr + rm[:, None] * N + (n0 + rn)[None, :], dz, mask=mask)
        tl.store(c_ptr + rm, c, mask=rm < M)

    @triton.jit
    def _grad_prologue_kernel(dz_ptr, a_ptr, r_ptr, coef_ptr, da_ptr, s_ptr, M, N,
                              BM: tl.constexpr, BN: tl.constexpr):
        """dA = r · (dZ − Z · coef) and S = GELU(Z), elementwise (coef: ⟨dZ, Z⟩ / τ², 0 where ‖A_i‖ <= ε)."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        r = tl.load(r_ptr + rm, mask=rm < M, other=0.)
        coef = tl.load(coef_ptr + rm, mask=rm < M, other=0.)
        offsets = rm[:, None] * N + rn[None, :]
        z = tl.load(a_ptr + offsets, mask=mask, other=0.).to(tl.float32) * r[:, None]
        dz = tl.load(dz_ptr + offsets, mask=mask, other=0.)
        tl.store(da_ptr + offsets, (r[:, None] * (dz - z * coef[:, None])).to(da_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + offsets, _gelu(z).to(s_ptr.dtype.element_ty), mask=mask)


def _grid(*sizes: Tuple[int, int]) -> Tuple[int, ...]:
    """The launch grid of ``(size, block)`` pairs: the blocks that cover each size."""
    return tuple((size + block - 1) // block for size, block in sizes)


@torch.library.custom_op('tkvision::pattention_l2_norm_gelu', mutates_args=())
def _forward(x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tau: torch.Tensor,
             eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(O [M, e], A [M, n], r [M], norm [M])`` of ``x [M, d]`` (the module docstring's two passes)."""
    m, d = x.shape
    n, e = values.shape
    a = x.new_empty(m, n)
    sumsq = torch.empty(m, device=x.device, dtype=torch.float32)
    _scores_kernel[_grid((m, BLOCK_M))](x, keys, a, sumsq, m, n, d, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRETED)
    norm = sumsq.sqrt()
    r = (tau.float() / norm.clamp_min(eps)).contiguous()
    out = x.new_empty(m, e)
    _attend_kernel[_grid((m, BLOCK_M), (e, BLOCK_K))](a, r, values, out, m, n, e, BLOCK_M, BLOCK_N, BLOCK_K,
                                                      INTERPRETED)
    return out, a, r, norm


@_forward.register_fake
def _forward_fake(x, keys, values, tau, eps):
    m, n, e = x.shape[0], keys.shape[0], values.shape[1]
    return (x.new_empty(m, e), x.new_empty(m, n), x.new_empty(m, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32))


@torch.library.custom_op('tkvision::pattention_l2_norm_gelu_backward', mutates_args=())
def _backward(grad_out: torch.Tensor, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, a: torch.Tensor,
              r: torch.Tensor, norm: torch.Tensor, tau: torch.Tensor,
              eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dX, dK_P, dV_P)`` of the forward's inputs (the module docstring's backward passes)."""
    m, n = a.shape
    e = values.shape[1]
    grad_out = grad_out.contiguous()
    dz = torch.empty(m, n, device=x.device, dtype=torch.float32)
    c = torch.empty(m, device=x.device, dtype=torch.float32)
    _grad_scores_kernel[_grid((m, BLOCK_M))](grad_out, values, a, r, dz, c, m, n, e, BLOCK_M, BLOCK_N, BLOCK_K,
                                             INTERPRETED)
    tau2 = (tau.float() * tau.float()).clamp_min(1e-30)
    coef = torch.where(norm > eps, c / tau2, torch.zeros_like(c)).contiguous()
    da, s = torch.empty_like(a), torch.empty(m, n, device=x.device, dtype=values.dtype)
    _grad_prologue_kernel[_grid((m, BLOCK_M), (n, BLOCK_N))](dz, a, r, coef, da, s, m, n, BLOCK_M, BLOCK_N)
    return da @ keys, da.t() @ x, s.t() @ grad_out.to(s.dtype)


@_backward.register_fake
def _backward_fake(grad_out, x, keys, values, a, r, norm, tau, eps):
    return torch.empty_like(x), torch.empty_like(keys), torch.empty_like(values)


def _setup_context(ctx, inputs, output):
    x, keys, values, tau, eps = inputs
    _, a, r, norm = output
    ctx.save_for_backward(x, keys, values, a, r, norm, tau)
    ctx.eps = eps


def _autograd_backward(ctx, grad_out, grad_a, grad_r, grad_norm):
    x, keys, values, a, r, norm, tau = ctx.saved_tensors
    dx, dk, dv = _backward(grad_out, x, keys, values, a, r, norm, tau, ctx.eps)
    return dx, dk, dv, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def fused_l2_norm_gelu(
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        tau: torch.Tensor,
        eps: float,
) -> torch.Tensor:
    """``GELU(A · τ / max(‖A‖₂, ε)) · V_P``, ``A = x · keysᵀ``, through the fused op (module docstring); under
    ``torch.autocast`` the three inputs are cast to its dtype first, as ``F.linear`` would.

    Args:
        x: input tokens ``[..., d]``.
        keys: key parameter tokens ``[n, d]`` (as the layer folds and slices them).
        values: value parameter tokens ``[n, e]``.
        tau: τ, a 0-d tensor.
        eps: lower bound on a row's norm.

    Returns:
        ``[..., e]`` in the compute dtype.

    Raises:
        RuntimeError: Triton is not installed, or there is neither a CUDA device nor the interpreter (say it: the
            layer checks `triton_available` before it takes this path).
    """
    if not triton_available():
        raise RuntimeError("backward_mode 'fused' needs Triton and a CUDA device (or TRITON_INTERPRET=1 on the CPU, "
                           "for tests); use backward_mode: closed_form here")
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, keys, values = x.to(dtype), keys.to(dtype), values.to(dtype)
    lead = x.shape[:-1]
    with torch.autocast(x.device.type, enabled=False):
        out = _forward(x.reshape(-1, x.shape[-1]).contiguous(), keys.contiguous(), values.contiguous(),
                       tau.detach(), float(eps))[0]
    return out.reshape(*lead, values.shape[1])
