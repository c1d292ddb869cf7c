"""Fused Pattention in Triton (issue 37, item 4): ``GELU(A·τ/‖A‖) V`` with ``A = X K_Pᵀ`` (paper Eq. 5,
the default ``l2_norm_gelu``) in two GEMM kernels instead of GEMM, four to six elementwise passes, GEMM.

Opt-in (``Pattention(fused_kernel=True)``, or ``@fused_kernel=true`` in a benchmark's model spec); the
plain path of :class:`~tkvision.layers.pattention.Pattention` stays the reference, and
``tests/test_pattention_triton.py`` holds this one equal to it in value and gradient (float32 against
float64, CI runs it on the CPU under ``TRITON_INTERPRET=1``).

Forward:

1. ``_scores_kernel``: ``A = X K_Pᵀ`` tile by tile; its epilogue writes A and adds each row's ``Σ A²``
   (float32, from the accumulators) into ``sumsq [T]``, so no pass over A computes the norm;
2. ``r = τ / max(‖A‖, ε)`` on ``[T]`` (PyTorch, one tiny op);
3. ``_attend_kernel``: ``O = GELU(A·r) V``; its prologue scales and applies GELU to each A tile in
   registers, so ``S = GELU(Z)`` is never written. Only A and the row norms are kept for backward (as the
   lean backward does).

Backward, with ``Z = A·r`` recomputed where needed (the closed form of ``pattention_autograd.py``):

1. ``_grad_scores_kernel``: ``dS = dO V_Pᵀ``; its epilogue forms ``dZ = dS ⊙ GELU'(Z)`` and adds each row's
   ``⟨dZ, Z⟩`` into ``dot [T]``;
2. ``_grad_value_kernel``: ``dV_P = GELU(Z)ᵀ dO``, GELU applied in the prologue;
3. PyTorch: ``dA = r (dZ − Z ⟨dZ, Z⟩ / τ²)`` where ``‖A‖ > ε`` (else ``r dZ``), ``dX = dA K_P``,
   ``dK_P = dAᵀ X`` (one elementwise pass and two cuBLAS GEMMs; folding dA into them is left).

τ gets no gradient (as the lean and closed-form backwards; a learned τ takes the plain path). Under
autocast the inputs are cast to its dtype as ``F.linear`` would be; the GEMMs accumulate in float32,
A is stored in the input dtype and ``dZ`` in float32. Tile sizes are fixed (:data:`TILES`), not
autotuned. Measured on an H200 (2026-11-28, ``docs/performance.md``), it does not pay: B/16† bf16
training at 0.72x the plain path's img/s eager and 0.29x the compiled plain path's; per layer, slower
than the plain path at 576 tokens with every tile choice timed, faster (1.16x) only at the FFN's 2,304
tokens with larger tiles. It stays as the measured alternative, opt-in.
"""
import os

import torch
import triton
import triton.language as tl

__all__ = ['TILES', 'pattention_fused']

#: (block rows, block columns, block inner, warps) of every kernel launch: fixed, not autotuned (the GPU
#: report's ``fused_tiles`` part times other choices through ``pattention_fused(..., tiles=...)``).
TILES = (64, 64, 32, 4)


@triton.jit
def _gelu(z):  # exact (erf) GELU, as F.gelu's default; 0.7071... = 1/√2 (a jitted function reads no globals)
    return 0.5 * z * (1 + tl.math.erf(z * 0.7071067811865476))


@triton.jit
def _z_tile(a_ptr, r, rows, cols, T, N):
    """Z = A · r on the tile (``rows``, ``cols``) of A[T, N] (contiguous rows), float32, 0 outside A;
    ``r``: the rows' scales, already loaded. Where the kernels recompute Θ's input from the stored A."""
    a = tl.load(a_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < T) & (cols[None, :] < N), other=0.0)
    return a.to(tl.float32) * r[:, None]


@triton.jit
def _tile_times_transposed(x_ptr, y_ptr, rt, rn, T, N, D, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    """The float32 ``[BLOCK_T, BLOCK_N]`` tile (rows ``rt``, columns ``rn``) of X[T, D] Y[N, D]ᵀ
    (contiguous rows): the score GEMM's and the dS GEMM's main loop."""
    rd = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        x = tl.load(x_ptr + rt[:, None] * D + (d0 + rd)[None, :],
                    mask=(rt[:, None] < T) & ((d0 + rd)[None, :] < D), other=0.0)
        y = tl.load(y_ptr + rn[None, :] * D + (d0 + rd)[:, None],
                    mask=(rn[None, :] < N) & ((d0 + rd)[:, None] < D), other=0.0)
        acc += tl.dot(x, y)
    return acc


@triton.jit
def _scores_kernel(x_ptr, k_ptr, a_ptr, sumsq_ptr, T, N, D, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """A[T, N] = X[T, D] K[N, D]ᵀ; sumsq[t] += Σ_n A[t, n]² (contiguous rows)."""
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _tile_times_transposed(x_ptr, k_ptr, rt, rn, T, N, D, BLOCK_T, BLOCK_N, BLOCK_D)
    tl.store(a_ptr + rt[:, None] * N + rn[None, :], acc.to(a_ptr.dtype.element_ty),
             mask=(rt[:, None] < T) & (rn[None, :] < N))
    tl.atomic_add(sumsq_ptr + rt, tl.sum(acc * acc, axis=1), mask=rt < T)  # masked entries are 0


@triton.jit
def _attend_kernel(a_ptr, r_ptr, v_ptr, o_ptr, T, N, E, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """O[T, E] = GELU(A[T, N] · r[T]) V[N, E]."""
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    re = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    rn = tl.arange(0, BLOCK_N)
    r = tl.load(r_ptr + rt, mask=rt < T, other=0.0)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        v = tl.load(v_ptr + (n0 + rn)[:, None] * E + re[None, :],
                    mask=((n0 + rn)[:, None] < N) & (re[None, :] < E), other=0.0)
        s = _gelu(_z_tile(a_ptr, r, rt, n0 + rn, T, N))
        acc += tl.dot(s.to(v.dtype), v)
    tl.store(o_ptr + rt[:, None] * E + re[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=(rt[:, None] < T) & (re[None, :] < E))


@triton.jit
def _grad_scores_kernel(go_ptr, v_ptr, a_ptr, r_ptr, gz_ptr, dot_ptr, T, N, E, BLOCK_T: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    """dZ[T, N] = (dO[T, E] V[N, E]ᵀ) ⊙ GELU'(A · r) (float32); dot[t] += Σ_n dZ Z."""
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _tile_times_transposed(go_ptr, v_ptr, rt, rn, T, N, E, BLOCK_T, BLOCK_N, BLOCK_E)
    inside = (rt[:, None] < T) & (rn[None, :] < N)
    z = _z_tile(a_ptr, tl.load(r_ptr + rt, mask=rt < T, other=0.0), rt, rn, T, N)
    # GELU'(z) = Φ(z) + z φ(z); 0.3989... = 1/√(2π)
    gelu_grad = 0.5 * (1 + tl.math.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    gz = acc * gelu_grad
    tl.store(gz_ptr + rt[:, None] * N + rn[None, :], gz, mask=inside)
    tl.atomic_add(dot_ptr + rt, tl.sum(gz * z, axis=1), mask=rt < T)


@triton.jit
def _grad_value_kernel(a_ptr, r_ptr, go_ptr, gv_ptr, T, N, E, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    """dV[N, E] = GELU(A[T, N] · r[T])ᵀ dO[T, E]."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    re = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    rt = tl.arange(0, BLOCK_T)
    acc = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        rows = t0 + rt
        go = tl.load(go_ptr + rows[:, None] * E + re[None, :], mask=(rows[:, None] < T) & (re[None, :] < E),
                     other=0.0)
        s = _gelu(_z_tile(a_ptr, tl.load(r_ptr + rows, mask=rows < T, other=0.0), rows, rn, T, N))
        acc += tl.dot(tl.trans(s.to(go.dtype)), go)
    tl.store(gv_ptr + rn[:, None] * E + re[None, :], acc.to(gv_ptr.dtype.element_ty),
             mask=(rn[:, None] < N) & (re[None, :] < E))


def _grid(rows: int, cols: int, block_rows: int, block_cols: int) -> tuple:
    return triton.cdiv(rows, block_rows), triton.cdiv(cols, block_cols)


class _FusedPattention(torch.autograd.Function):
    """The fused forward and backward of the module docstring on ``x [T, D]``, ``key [N, D]``,
    ``value [N, E]`` (contiguous, one dtype), ``tau`` (0-d float32), ``eps`` (float)."""

    @staticmethod
    def forward(ctx, x, key, value, tau, eps, tiles):
        (t, d), n, e = x.shape, key.shape[0], value.shape[1]
        block_rows, block_cols, block_inner, warps = tiles
        scores = torch.empty(t, n, device=x.device, dtype=x.dtype)
        sumsq = torch.zeros(t, device=x.device, dtype=torch.float32)
        _scores_kernel[_grid(t, n, block_rows, block_cols)](
            x, key, scores, sumsq, t, n, d, block_rows, block_cols, block_inner, num_warps=warps)
        norm = sumsq.sqrt()
        r = tau.float() / norm.clamp_min(eps)
        out = torch.empty(t, e, device=x.device, dtype=value.dtype)
        _attend_kernel[_grid(t, e, block_rows, block_cols)](
            scores, r, value, out, t, n, e, block_rows, block_cols, block_inner, num_warps=warps)
        ctx.save_for_backward(x, key, value, scores, norm, r, tau)
        ctx.eps, ctx.tiles = eps, tiles
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, key, value, scores, norm, r, tau = ctx.saved_tensors
        block_rows, block_cols, block_inner, warps = ctx.tiles
        grad_out = grad_out.contiguous().to(value.dtype)
        (t, n), e = scores.shape, value.shape[1]
        grad_z = torch.empty(t, n, device=x.device, dtype=torch.float32)
        dot = torch.zeros(t, device=x.device, dtype=torch.float32)
        _grad_scores_kernel[_grid(t, n, block_rows, block_cols)](
            grad_out, value, scores, r, grad_z, dot, t, n, e, block_rows, block_cols, block_inner,
            num_warps=warps)
        grad_value = torch.empty_like(value)
        _grad_value_kernel[_grid(n, e, block_rows, block_cols)](
            scores, r, grad_out, grad_value, t, n, e, block_rows, block_cols, block_inner, num_warps=warps)
        # dA = r (dZ − Z ⟨dZ, Z⟩ / ‖Z‖²), ‖Z‖ = τ where the norm was not clamped; else dA = r dZ
        coefficient = torch.where(norm > ctx.eps, dot / tau.float().square(), torch.zeros_like(dot))
        grad_scores = (r[:, None] * (grad_z - scores.float() * (r * coefficient)[:, None])).to(x.dtype)
        return grad_scores @ key, grad_scores.t() @ x, grad_value, None, None, None


def _check_device(x: torch.Tensor):
    if not x.is_cuda and os.environ.get('TRITON_INTERPRET') != '1':
        raise RuntimeError(f'Pattention(fused_kernel=True) runs Triton kernels, which need a CUDA tensor; got one on '
                           f'{x.device}. Use fused_kernel=False there, or set TRITON_INTERPRET=1 before importing '
                           'tkvision for a slow correctness check on the CPU.')


def pattention_fused(x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tau: torch.Tensor,
                     eps: float, tiles: tuple = TILES) -> torch.Tensor:
    """``GELU(A·τ/max(‖A‖₂, ε)) V_P`` with ``A = x K_Pᵀ`` (paper Eq. 5; the same function as
    ``Pattention``'s plain path), through the fused kernels of the module docstring.

    Args:
        x: ``[..., D]`` input tokens.
        key: ``[N, D]`` key parameter tokens K_P.
        value: ``[N, E]`` value parameter tokens V_P.
        tau: 0-d scale τ (no gradient flows to it).
        eps: lower bound on the row norm.
        tiles: ``(block rows, block columns, block inner, warps)`` of every launch (:data:`TILES`; powers
            of two, each block at least 16 for ``tl.dot``).

    Returns:
        ``[..., E]``, in autocast's dtype under autocast, else in ``value``'s.

    Raises:
        RuntimeError: ``x`` is not on a CUDA device and ``TRITON_INTERPRET=1`` was not set.
    """
    _check_device(x)
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):  # cast as F.linear would, then run the kernels outside autocast
        dtype = torch.get_autocast_dtype(device_type)
        x, key, value = x.to(dtype), key.to(dtype), value.to(dtype)
    else:
        x = x.to(value.dtype)
    lead = x.shape[:-1]
    with torch.autocast(device_type, enabled=False):
        out = _FusedPattention.apply(x.reshape(-1, x.shape[-1]).contiguous(), key.contiguous(), value.contiguous(),
                                     tau, eps, tuple(tiles))
    return out.reshape(*lead, value.shape[1])
