"""Fused Triton kernels of the general filter: the ``"triton"`` backend of ``kalmanscan.filter``.

Backend contract (docs/architecture.md): ``filter_lanes(z, obs_var, decay, process_var, loading,
offset, lam0, eta0) -> (lam, eta)`` with ``[T, N]`` inputs (any strides, stride 0 allowed),
``[N]`` initial state, ``[T, N]`` outputs, differentiable in every input.

Notation per lane and step: ``a`` decay, ``p`` process_var, ``h`` loading, ``c`` offset,
``rho = 1/obs_var``, ``phi = rho h^2``, ``r = rho h z``; total forgetting where ``a*a == 0``.

Two regimes, one set of kernels (the split is chosen from the shape inside the op):

- many lanes (``N >= 16384``): one thread walks a lane through all of time, the state in
  registers; the per-step loads are software-pipelined (``tl.range(num_stages=NS)``), inputs
  constant in time (stride 0) are read once;
- few long lanes: time is cut into chunks. Pass 1 multiplies each chunk's 3x3 projective maps
  of ``(u, w, e)`` with ``lam = u/w``, ``eta = e/w`` (a Möbius block for the precision and one
  linear row for the information, derivation in docs/performance.md); a carry kernel walks the
  chunk maps to get each chunk's starting state; pass 2 reruns every chunk from its true start.

Backward (exact): the adjoints ``(Lc, Ec)`` of ``(lam, eta)`` run backward through the
upper-triangular affine map ``[[alpha^2, kappa], [0, alpha]]`` (two scalar reverse scans),
with the same chunked structure, reading the saved ``lam, eta`` and recomputing everything else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import (
    cdiv,
    empty,
    helper,
    interpreting,
    lanes_config,
    launch,
    observation,
    predict,
)

__all__ = ["filter_lanes"]

# Lane-steps of parallel work the chunked regime aims for, and the lane count from which one
# thread per lane over all of time already fills the GPU.
_TARGET_WORK = 65536
_MANY_LANES = 16384
# chunk-length granularity and pipeline stages of the per-step loads
TUNING = {"TB": 8, "NS": 8}


@helper
def _ld(ptr, st, sn, t, lanes, lmask, VARY: tl.constexpr, pre):
    """Input at step ``t`` (``pre``, loaded once before the loop, when it does not vary in time)."""
    if VARY:
        return tl.load(ptr + t * st + lanes * sn, mask=lmask, other=1.0)
    else:
        return pre


@helper
def _rinv(ptr, st, sn, t, lanes, lmask, VARY: tl.constexpr, pre):
    """``1/obs_var`` at step ``t`` (computed once before the loop when it does not vary)."""
    if VARY:
        return 1.0 / tl.load(ptr + t * st + lanes * sn, mask=lmask, other=1.0)
    else:
        return pre


@triton.jit
def _fwd_kernel(
    z_ptr, zst, zsn, ov_ptr, ovst, ovsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
    start_ptr,  # [2, NC, N]: lam, eta at each chunk start (pass 2)
    lam_ptr, eta_ptr,  # [T, N] outputs (pass 2)
    comp_ptr,  # [7, NC, N] chunk maps (pass 1)
    T, N, CH, NC,
    VZ: tl.constexpr, VOV: tl.constexpr, VA: tl.constexpr,
    VP: tl.constexpr, VH: tl.constexpr, VC: tl.constexpr,
    COMPOSITE: tl.constexpr, NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(1)
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    t_lo = k * CH
    t_hi = tl.minimum(t_lo + CH, T)
    if COMPOSITE:
        one = tl.full([BLOCK], 1.0, z_ptr.dtype.element_ty)
        m11, m12, m21, m22 = one, one * 0.0, one * 0.0, one
        g1, g2, A = one * 0.0, one * 0.0, one
    else:
        lam = tl.load(start_ptr + k * N + lanes, mask=lmask, other=1.0)
        eta = tl.load(start_ptr + (NC + k) * N + lanes, mask=lmask, other=0.0)
    z0 = tl.load(z_ptr + lanes * zsn, mask=lmask, other=1.0)
    rinv0 = 1.0 / tl.load(ov_ptr + lanes * ovsn, mask=lmask, other=1.0)
    a0 = tl.load(a_ptr + lanes * asn, mask=lmask, other=1.0)
    p0 = tl.load(p_ptr + lanes * psn, mask=lmask, other=1.0)
    h0 = tl.load(h_ptr + lanes * hsn, mask=lmask, other=1.0)
    c0 = tl.load(c_ptr + lanes * csn, mask=lmask, other=1.0)
    # the loads of later steps are issued ahead of use (software pipeline, NS stages)
    for t in tl.range(t_lo, t_hi, num_stages=NS):
        a = _ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
        p = _ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
        c = _ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
        z = _ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
        rinv = _rinv(ov_ptr, ovst, ovsn, t, lanes, lmask, VOV, rinv0)
        h = _ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
        phi, r, _, _ = observation(z, rinv, h)
        if COMPOSITE:
            # leaf [[1 + p phi, q + d phi, 0], [p, d, 0], [c + r p, c q + r d, a (1 - q)]]
            a2 = a * a
            forget = a2 == 0.0
            d = tl.where(forget, p, a2)
            qf = tl.where(forget, 1.0, 0.0)
            l11 = 1.0 + p * phi
            l12 = qf + d * phi
            lg1 = c + r * p
            lg2 = c * qf + r * d
            lA = tl.where(forget, 0.0, a)
            n11 = l11 * m11 + l12 * m21
            n12 = l11 * m12 + l12 * m22
            n21 = p * m11 + d * m21
            n22 = p * m12 + d * m22
            ng1 = lg1 * m11 + lg2 * m21 + lA * g1
            ng2 = lg1 * m12 + lg2 * m22 + lA * g2
            sc = 1.0 / (n11 + n22)  # rescaling keeps the entries finite (projective map)
            m11 = n11 * sc
            m12 = n12 * sc
            m21 = n21 * sc
            m22 = n22 * sc
            g1 = ng1 * sc
            g2 = ng2 * sc
            A = lA * A * sc
        else:
            lam_pred, alpha, _, _ = predict(lam, a, p)
            lam = lam_pred + phi
            eta = alpha * eta + lam_pred * c + r
            tl.store(lam_ptr + t * N + lanes, lam, mask=lmask)
            tl.store(eta_ptr + t * N + lanes, eta, mask=lmask)
    if COMPOSITE:
        base = comp_ptr + k * N + lanes
        step = NC * N
        tl.store(base, m11, mask=lmask)
        tl.store(base + step, m12, mask=lmask)
        tl.store(base + 2 * step, m21, mask=lmask)
        tl.store(base + 3 * step, m22, mask=lmask)
        tl.store(base + 4 * step, g1, mask=lmask)
        tl.store(base + 5 * step, g2, mask=lmask)
        tl.store(base + 6 * step, A, mask=lmask)


@triton.jit
def _fwd_carry_kernel(comp_ptr, lam0_ptr, eta0_ptr, start_ptr, N, NC, NS: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    """Walk the chunk maps: start state of chunk k+1 = map_k(start of chunk k)."""
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    lam = tl.load(lam0_ptr + lanes, mask=lmask, other=1.0)
    eta = tl.load(eta0_ptr + lanes, mask=lmask, other=0.0)
    tl.store(start_ptr + lanes, lam, mask=lmask)
    tl.store(start_ptr + NC * N + lanes, eta, mask=lmask)
    step = NC * N
    for kk in tl.range(0, NC - 1, num_stages=NS):
        base = comp_ptr + kk * N + lanes
        m11 = tl.load(base, mask=lmask, other=1.0)
        m12 = tl.load(base + step, mask=lmask, other=0.0)
        m21 = tl.load(base + 2 * step, mask=lmask, other=0.0)
        m22 = tl.load(base + 3 * step, mask=lmask, other=1.0)
        g1 = tl.load(base + 4 * step, mask=lmask, other=0.0)
        g2 = tl.load(base + 5 * step, mask=lmask, other=0.0)
        A = tl.load(base + 6 * step, mask=lmask, other=1.0)
        rw = 1.0 / (m21 * lam + m22)
        eta = (g1 * lam + g2 + A * eta) * rw
        lam = (m11 * lam + m12) * rw
        tl.store(start_ptr + (kk + 1) * N + lanes, lam, mask=lmask)
        tl.store(start_ptr + (NC + kk + 1) * N + lanes, eta, mask=lmask)


@triton.jit
def _bwd_kernel(
    z_ptr, zst, zsn, ov_ptr, ovst, ovsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
    lam_ptr, eta_ptr, lam0_ptr, eta0_ptr,  # saved [T, N] outputs and [N] initial state
    gl_ptr, glst, glsn, ge_ptr, gest, gesn,  # incoming gradients of lam, eta
    xend_ptr,  # [2, NC, N]: adjoint carries (Lc, Ec) entering each chunk from its end (pass 2)
    comp_ptr,  # [5, NC, N]: chunk maps of the adjoints (pass 1)
    gz_ptr, gov_ptr, ga_ptr, gp_ptr, gh_ptr, gc_ptr,  # [T, N] outputs (pass 2)
    g0_ptr,  # [2, N]: gradients of lam0, eta0 (pass 2)
    T, N, CH, NC,
    VZ: tl.constexpr, VOV: tl.constexpr, VA: tl.constexpr,
    VP: tl.constexpr, VH: tl.constexpr, VC: tl.constexpr,
    VGL: tl.constexpr, VGE: tl.constexpr,
    NEED_Z: tl.constexpr, NEED_OV: tl.constexpr, NEED_A: tl.constexpr,
    NEED_P: tl.constexpr, NEED_H: tl.constexpr, NEED_C: tl.constexpr,
    COMPOSITE: tl.constexpr, NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(1)
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    t_lo = k * CH
    t_hi = tl.minimum(t_lo + CH, T)
    lam0 = tl.load(lam0_ptr + lanes, mask=lmask, other=1.0)
    eta0 = tl.load(eta0_ptr + lanes, mask=lmask, other=0.0)
    if COMPOSITE:
        # (Lc, Ec) at the chunk start = [[c11, c12], [0, c22]] (Lc, Ec at its end) + (b1, b2)
        one = tl.full([BLOCK], 1.0, z_ptr.dtype.element_ty)
        c11, c12, c22, b1, b2 = one, one * 0.0, one, one * 0.0, one * 0.0
    else:
        Lc = tl.load(xend_ptr + k * N + lanes, mask=lmask, other=0.0)
        Ec = tl.load(xend_ptr + (NC + k) * N + lanes, mask=lmask, other=0.0)
    z0 = tl.load(z_ptr + lanes * zsn, mask=lmask, other=1.0)
    rinv0 = 1.0 / tl.load(ov_ptr + lanes * ovsn, mask=lmask, other=1.0)
    a0 = tl.load(a_ptr + lanes * asn, mask=lmask, other=1.0)
    p0 = tl.load(p_ptr + lanes * psn, mask=lmask, other=1.0)
    h0 = tl.load(h_ptr + lanes * hsn, mask=lmask, other=1.0)
    c0 = tl.load(c_ptr + lanes * csn, mask=lmask, other=1.0)
    gl0 = tl.load(gl_ptr + lanes * glsn, mask=lmask, other=0.0)
    ge0 = tl.load(ge_ptr + lanes * gesn, mask=lmask, other=0.0)
    for j in tl.range(0, t_hi - t_lo, num_stages=NS):
        t = t_hi - 1 - j
        first = (lanes * 0 + t) == 0
        # lam, eta entering the step: saved row t-1 (lam0, eta0 at t = 0)
        prev = tl.maximum(t - 1, 0) * N + lanes
        lam_prev = tl.where(first, lam0, tl.load(lam_ptr + prev, mask=lmask, other=1.0))
        eta_prev = tl.where(first, eta0, tl.load(eta_ptr + prev, mask=lmask, other=0.0))
        a = _ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
        p = _ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
        c = _ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
        gl = _ld(gl_ptr, glst, glsn, t, lanes, lmask, VGL, gl0)
        ge = _ld(ge_ptr, gest, gesn, t, lanes, lmask, VGE, ge0)
        lam_pred, alpha, rden, forget = predict(lam_prev, a, p)
        alpha2 = alpha * alpha
        kappa = alpha2 * c - alpha * p * rden * eta_prev
        if COMPOSITE:
            b1 = alpha2 * (b1 + gl) + kappa * (b2 + ge)
            b2 = alpha * (b2 + ge)
            c12 = alpha2 * c12 + kappa * c22
            c11 = alpha2 * c11
            c22 = alpha * c22
        else:
            Lt = gl + Lc  # total adjoint of lam_t
            Et = ge + Ec  # total adjoint of eta_t
            z = _ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
            rinv = _rinv(ov_ptr, ovst, ovsn, t, lanes, lmask, VOV, rinv0)
            h = _ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
            phi, r, rho, zz = observation(z, rinv, h)
            g_lp = Lt + Et * c  # adjoint of lam_pred
            g_al = Et * eta_prev  # adjoint of alpha
            off = t * N + lanes
            if NEED_Z:
                tl.store(gz_ptr + off, Et * rho * h, mask=lmask)
            if NEED_OV:
                tl.store(gov_ptr + off, -rho * (Lt * phi + Et * r), mask=lmask)
            if NEED_H:
                tl.store(gh_ptr + off, rho * (2.0 * Lt * h + Et * zz), mask=lmask)
            if NEED_C:
                tl.store(gc_ptr + off, Et * lam_pred, mask=lmask)
            if NEED_A:
                ga = tl.where(forget, 0.0, g_al * (rden - 2.0 * alpha2))
                tl.store(ga_ptr + off, ga - 2.0 * g_lp * alpha * lam_pred, mask=lmask)
            if NEED_P:
                tl.store(gp_ptr + off, -lam_pred * (g_lp * lam_pred + g_al * alpha), mask=lmask)
            Lc = alpha2 * Lt + kappa * Et
            Ec = alpha * Et
    if COMPOSITE:
        base = comp_ptr + k * N + lanes
        step = NC * N
        tl.store(base, c11, mask=lmask)
        tl.store(base + step, c12, mask=lmask)
        tl.store(base + 2 * step, c22, mask=lmask)
        tl.store(base + 3 * step, b1, mask=lmask)
        tl.store(base + 4 * step, b2, mask=lmask)
    else:
        if k == 0:
            tl.store(g0_ptr + lanes, Lc, mask=lmask)
            tl.store(g0_ptr + N + lanes, Ec, mask=lmask)


@triton.jit
def _bwd_carry_kernel(comp_ptr, xend_ptr, N, NC, NS: tl.constexpr, BLOCK: tl.constexpr):
    """Adjoint carries entering each chunk from its end, walking the chunk maps backward."""
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    step = NC * N
    Lc = tl.zeros([BLOCK], comp_ptr.dtype.element_ty)
    Ec = tl.zeros([BLOCK], comp_ptr.dtype.element_ty)
    tl.store(xend_ptr + (NC - 1) * N + lanes, Lc, mask=lmask)
    tl.store(xend_ptr + (2 * NC - 1) * N + lanes, Ec, mask=lmask)
    # chunk kk (NC-1 down to 1) maps the carry at its end to the carry at the end of chunk kk-1
    for j in tl.range(0, NC - 1, num_stages=NS):
        kk = NC - 1 - j
        base = comp_ptr + kk * N + lanes
        c11 = tl.load(base, mask=lmask, other=1.0)
        c12 = tl.load(base + step, mask=lmask, other=0.0)
        c22 = tl.load(base + 2 * step, mask=lmask, other=1.0)
        b1 = tl.load(base + 3 * step, mask=lmask, other=0.0)
        b2 = tl.load(base + 4 * step, mask=lmask, other=0.0)
        Lc = c11 * Lc + c12 * Ec + b1
        Ec = c22 * Ec + b2
        tl.store(xend_ptr + (kk - 1) * N + lanes, Lc, mask=lmask)
        tl.store(xend_ptr + (NC + kk - 1) * N + lanes, Ec, mask=lmask)


def _plan(T: int, N: int, n_vary: int):
    """Chunking and tile sizes: ``(TB, CH, NC, BLOCK, num_warps)``."""
    TB = 4 if interpreting() else TUNING["TB"]  # chunk lengths are multiples of TB
    block, warps = lanes_config(N)
    if N >= _MANY_LANES:
        NC = 1
    else:
        NC = max(1, min(cdiv(T, 4 * TB), cdiv(_TARGET_WORK, N)))
    CH = cdiv(cdiv(T, NC), TB) * TB
    NC = cdiv(T, CH)
    return TB, CH, NC, block, warps


def _check_offsets(*xs):
    """Kernels index with 32-bit offsets: every input's largest offset must stay below 2**31."""
    for x in xs:
        span = sum((n - 1) * abs(st) for n, st in zip(x.shape, x.stride(), strict=True))
        if span >= 2**31:
            raise ValueError(
                f"z: the triton backend handles up to 2**31 elements per [T, N] input, got shape "
                f"{tuple(x.shape)} with strides {x.stride()}; use backend='torch'"
            )


def _strided(x):
    """``(tensor, time stride, lane stride, varies in time)`` of a ``[T, N]`` input."""
    return x, x.stride(0), x.stride(1), x.stride(0) != 0 and x.shape[0] > 1


def _args(inputs):
    out = []
    for x in inputs:
        out += list(_strided(x)[:3])
    return out


def _forward(z, ov, a, p, h, c, lam0, eta0):
    T, N = z.shape
    ins = (z, ov, a, p, h, c)
    _check_offsets(*ins)
    vary = [_strided(x)[3] for x in ins]
    TB, CH, NC, BLOCK, warps = _plan(T, N, sum(vary))
    grid = (cdiv(N, BLOCK), NC)
    lam = empty((T, N), z)
    eta = empty((T, N), z)
    lam0 = lam0.contiguous()
    eta0 = eta0.contiguous()
    flags = dict(zip(("VZ", "VOV", "VA", "VP", "VH", "VC"), vary, strict=True))
    if NC == 1:
        start = torch.stack([lam0, eta0])[:, None]
    else:
        comp = empty((7, NC, N), z)
        launch(_fwd_kernel, grid,
            *_args(ins), z, lam, eta, comp, T, N, CH, NC, **flags, COMPOSITE=True,
            NS=TUNING["NS"], BLOCK=BLOCK, num_warps=warps)  # fmt: skip
        start = empty((2, NC, N), z)
        launch(_fwd_carry_kernel, (grid[0],),
            comp, lam0, eta0, start, N, NC, NS=TUNING["NS"], BLOCK=BLOCK,
            num_warps=warps)  # fmt: skip
    launch(_fwd_kernel, grid,
        *_args(ins), start, lam, eta, z, T, N, CH, NC, **flags,
        COMPOSITE=False, NS=TUNING["NS"], BLOCK=BLOCK, num_warps=warps)  # fmt: skip
    return lam, eta


def _backward(ins, lam0, eta0, lam, eta, glam, geta, needs):
    z = ins[0]
    T, N = z.shape
    zero = torch.zeros((), dtype=z.dtype, device=z.device).expand(T, N)
    glam = zero if glam is None else glam
    geta = zero if geta is None else geta
    vary = [_strided(x)[3] for x in ins]
    TB, CH, NC, BLOCK, warps = _plan(T, N, sum(vary) + 4)
    grid = (cdiv(N, BLOCK), NC)
    lam0 = lam0.contiguous()
    eta0 = eta0.contiguous()
    outs = [empty((T, N), z) if need else z for need in needs[:6]]
    g0 = empty((2, N), z)
    flags = dict(zip(("VZ", "VOV", "VA", "VP", "VH", "VC"), vary, strict=True))
    flags.update(VGL=_strided(glam)[3], VGE=_strided(geta)[3])
    flags.update(zip(("NEED_Z", "NEED_OV", "NEED_A", "NEED_P", "NEED_H", "NEED_C"), needs[:6],
                     strict=True))  # fmt: skip
    common = [*_args(ins), lam, eta, lam0, eta0, *_args((glam, geta))]
    if NC == 1:
        xend = torch.zeros((2, 1, N), dtype=z.dtype, device=z.device)
    else:
        comp = empty((5, NC, N), z)
        launch(_bwd_kernel, grid,
            *common, z, comp, *outs, g0, T, N, CH, NC, **flags, COMPOSITE=True,
            NS=TUNING["NS"], BLOCK=BLOCK, num_warps=warps)  # fmt: skip
        xend = empty((2, NC, N), z)
        launch(_bwd_carry_kernel, (grid[0],),
            comp, xend, N, NC, NS=TUNING["NS"], BLOCK=BLOCK, num_warps=warps)  # fmt: skip
    launch(_bwd_kernel, grid,
        *common, xend, z, *outs, g0, T, N, CH, NC, **flags,
        COMPOSITE=False, NS=TUNING["NS"], BLOCK=BLOCK, num_warps=warps)  # fmt: skip
    grads = [o if need else None for o, need in zip(outs, needs[:6], strict=True)]
    return (*grads, g0[0] if needs[6] else None, g0[1] if needs[7] else None)


class _Filter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, ov, a, p, h, c, lam0, eta0):
        lam, eta = _forward(z, ov, a, p, h, c, lam0, eta0)
        ctx.save_for_backward(z, ov, a, p, h, c, lam0, eta0, lam, eta)
        return lam, eta

    @staticmethod
    def backward(ctx, glam, geta):
        z, ov, a, p, h, c, lam0, eta0, lam, eta = ctx.saved_tensors
        return _backward((z, ov, a, p, h, c), lam0, eta0, lam, eta, glam, geta,
                         ctx.needs_input_grad)  # fmt: skip


def filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    """Filtered ``(lam, eta)`` ``[T, N]`` of ``N`` lanes on a CUDA device (backend contract).

    ``z, obs_var, decay, process_var, loading, offset``: ``[T, N]`` (any strides; ``z`` NaN and
    ``obs_var`` inf where not observed); ``lam0, eta0``: ``[N]``. One dtype (float32 or float64).

    >>> import torch  # doctest: +SKIP
    >>> from kalmanscan.cuda.filter import filter_lanes
    >>> T, N = 1000, 64
    >>> z = torch.randn(T, N, device="cuda")
    >>> one = torch.ones(T, N, device="cuda")
    >>> lam, eta = filter_lanes(z, one, 0.9 * one, 0.1 * one, one, 0 * one,
    ...                         torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda"))
    """
    return _Filter.apply(z, obs_var, decay, process_var, loading, offset, lam0, eta0)
