"""Fused Triton kernels of the KLA op (SPEC §3): the ``"triton"`` backend of ``kla_filter``.

Shapes (batch B, time L, channels M, slots S; a lane is ``(b, m, s)``): ``v, Lv [B, L, M]``,
``k, q [B, L, S]``, ``decay, process_var [M, S]``, ``lam0, eta0 [B, M, S]``; outputs
``y, yvar [B, L, M]``, the final ``lam, eta [B, M, S]`` and optionally the precisions
``[B, L, M, S]``. Per step ``phi = Lv[m] k[s]^2``, ``r = v[m] Lv[m] k[s]``, ``c = 0``.

A program owns the lanes ``[BM, S]`` of one batch row and walks them through time, one lane per
thread, the state in registers. Inputs are staged TB steps at a time (``[TB, BM, S]`` tiles,
``v, Lv`` broadcast over ``s`` and ``k, q`` over ``m`` by zero strides, so the loads hit L1),
the next tile in flight while the current one is consumed. No ``[B, L, M, S]`` tensor is
written unless the precisions are asked for.

Backward (exact): the forward saves the state every TB steps (``[B, L/TB, M, S]``, only when
a gradient is needed); the backward walks the blocks in reverse, recomputes a block's states
from its checkpoint into registers, then runs the two scalar adjoint recurrences
``Ec <- alpha Et``, ``Lc <- alpha^2 Lt - alpha p rden Et eta_prev`` over it. Sums over ``s``
(``gv, gLv``) happen in the program; sums over ``m`` (``gk, gq``) are written per program and
added in torch; sums over ``b`` and ``t`` (``gdecay, gprocess_var``) are kept per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import empty, interpreting, pick3, predict, put3

__all__ = ["kla_triton"]


@triton.jit
def _tile(ptr, base, t0, rows, m, s, L, M, S, sm, PER_M: tl.constexpr):
    """``[TB, BM, SP]`` tile of a ``[B, L, M]`` (``PER_M``) or ``[B, L, S]`` input at rows t0+.

    ``sm`` is the channel stride (1); as an unspecialized argument it keeps the compiler from
    giving these loads a layout of their own, so no tile or row is converted between layouts.
    """
    t = t0 + rows
    tm = (t < L)[:, None, None] & (t >= 0)[:, None, None]
    if PER_M:
        off = t[:, None, None] * M + m[None, :, None] * sm + s[None, None, :] * 0
        mask = tm & (m < M)[None, :, None] & (s >= 0)[None, None, :]
    else:
        off = t[:, None, None] * S + s[None, None, :] + m[None, :, None] * 0
        mask = tm & (s < S)[None, None, :] & (m >= 0)[None, :, None]
    return tl.load(ptr + base + off, mask=mask, other=0.0)


@triton.jit(do_not_specialize=["sm"])
def _kla_fwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, yvar_ptr, lamT_ptr, etaT_ptr, prec_ptr, ck_ptr,
    L, M, S, NB, sm,
    SAVE_PREC: tl.constexpr, SAVE_CK: tl.constexpr,
    TB: tl.constexpr, BM: tl.constexpr, SP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(1)
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    s = tl.arange(0, SP)
    rows = tl.arange(0, TB)
    lane_mask = (m < M)[:, None] & (s < S)[None, :]
    ms = m[:, None] * S + s[None, :]
    dt = y_ptr.dtype.element_ty
    a = tl.load(a_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    state_off = b.to(tl.int64) * M * S + ms
    lam = tl.load(lam0_ptr + state_off, mask=lane_mask, other=1.0).to(dt)
    eta = tl.load(eta0_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    sv = _tile(v_ptr, base_m, 0, rows, m, s, L, M, S, sm, True).to(dt)
    sL = _tile(Lv_ptr, base_m, 0, rows, m, s, L, M, S, sm, True).to(dt)
    sk = _tile(k_ptr, base_s, 0, rows, m, s, L, M, S, sm, False).to(dt)
    sq = _tile(q_ptr, base_s, 0, rows, m, s, L, M, S, sm, False).to(dt)
    for t0 in range(0, L, TB):
        nv = _tile(v_ptr, base_m, t0 + TB, rows, m, s, L, M, S, sm, True).to(dt)
        nL = _tile(Lv_ptr, base_m, t0 + TB, rows, m, s, L, M, S, sm, True).to(dt)
        nk = _tile(k_ptr, base_s, t0 + TB, rows, m, s, L, M, S, sm, False).to(dt)
        nq = _tile(q_ptr, base_s, t0 + TB, rows, m, s, L, M, S, sm, False).to(dt)
        if SAVE_CK:
            ck = (b.to(tl.int64) * NB + t0 // TB) * M * S + ms
            tl.store(ck_ptr + ck, lam, mask=lane_mask)
            tl.store(ck_ptr + ck + NB * M * S * tl.num_programs(1), eta, mask=lane_mask)
        Y = tl.zeros([TB, BM, SP], dt)
        YV = tl.zeros([TB, BM, SP], dt)
        for i in tl.static_range(TB):
            t = t0 + i
            valid = (m * 0 + t) < L
            Lv = pick3(sL, rows, i)
            kk = pick3(sk, rows, i)
            qq = pick3(sq, rows, i)
            lam_pred, alpha, _, _ = predict(lam, a, p)
            lam = tl.where(valid[:, None], lam_pred + Lv * kk * kk, lam)
            eta = tl.where(valid[:, None], alpha * eta + pick3(sv, rows, i) * Lv * kk, eta)
            rl = 1.0 / lam
            Y = put3(Y, rows, i, qq * eta * rl)
            YV = put3(YV, rows, i, qq * qq * rl)
            if SAVE_PREC:
                poff = (base_m + t * M) * S + ms
                tl.store(prec_ptr + poff, lam, mask=lane_mask & valid[:, None])
        # one store per block (per-step stores of a slot-reduced vector cost a barrier each)
        out = base_m + (t0 + rows)[:, None] * M + m[None, :]
        omask = ((t0 + rows) < L)[:, None] & (m < M)[None, :]
        tl.store(y_ptr + out, tl.sum(Y, axis=2), mask=omask)
        tl.store(yvar_ptr + out, tl.sum(YV, axis=2), mask=omask)
        sv, sL, sk, sq = nv, nL, nk, nq
    tl.store(lamT_ptr + state_off, lam, mask=lane_mask)
    tl.store(etaT_ptr + state_off, eta, mask=lane_mask)


@triton.jit(do_not_specialize=["sm"])
def _kla_bwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ck_ptr,
    gy_ptr, gyv_ptr, glT_ptr, geT_ptr, gprec_ptr,
    gv_ptr, gLv_ptr, gk_part_ptr, gq_part_ptr, ga_part_ptr, gp_part_ptr, g0_ptr,
    L, M, S, NB, B, sm,
    HAS_GPREC: tl.constexpr, TB: tl.constexpr, BM: tl.constexpr, SP: tl.constexpr,
):  # fmt: skip
    pm = tl.program_id(0)
    b = tl.program_id(1)
    m = pm * BM + tl.arange(0, BM)
    s = tl.arange(0, SP)
    rows = tl.arange(0, TB)
    mmask = m < M
    lane_mask = mmask[:, None] & (s < S)[None, :]
    ms = m[:, None] * S + s[None, :]
    dt = gv_ptr.dtype.element_ty
    a = tl.load(a_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    state_off = b.to(tl.int64) * M * S + ms
    Lc = tl.load(glT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    Ec = tl.load(geT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    ga = tl.zeros([BM, SP], dt)
    gp = tl.zeros([BM, SP], dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    part = (pm.to(tl.int64) * B + b) * L * S
    eta_ck = NB * M * S * B
    for jb in range(0, NB):
        blk = NB - 1 - jb
        t0 = blk * TB
        ck = (b.to(tl.int64) * NB + blk) * M * S + ms
        lam_s = tl.load(ck_ptr + ck, mask=lane_mask, other=1.0)
        eta_s = tl.load(ck_ptr + ck + eta_ck, mask=lane_mask, other=0.0)
        sv = _tile(v_ptr, base_m, t0, rows, m, s, L, M, S, sm, True).to(dt)
        sL = _tile(Lv_ptr, base_m, t0, rows, m, s, L, M, S, sm, True).to(dt)
        sk = _tile(k_ptr, base_s, t0, rows, m, s, L, M, S, sm, False).to(dt)
        sq = _tile(q_ptr, base_s, t0, rows, m, s, L, M, S, sm, False).to(dt)
        sgy = _tile(gy_ptr, base_m, t0, rows, m, s, L, M, S, sm, True).to(dt)
        sgv = _tile(gyv_ptr, base_m, t0, rows, m, s, L, M, S, sm, True).to(dt)
        # recompute the block's states from its checkpoint (invalid steps past L keep the state)
        LAM = tl.zeros([TB, BM, SP], dt)
        ETA = tl.zeros([TB, BM, SP], dt)
        lam = lam_s
        eta = eta_s
        for i in tl.static_range(TB):
            Lv = pick3(sL, rows, i)
            kk = pick3(sk, rows, i)
            lam_pred, alpha, _, _ = predict(lam, a, p)
            lam = lam_pred + Lv * kk * kk
            eta = alpha * eta + pick3(sv, rows, i) * Lv * kk
            LAM = put3(LAM, rows, i, lam)
            ETA = put3(ETA, rows, i, eta)
        GK = tl.zeros([TB, BM, SP], dt)
        GQ = tl.zeros([TB, BM, SP], dt)
        GV = tl.zeros([TB, BM, SP], dt)
        GLV = tl.zeros([TB, BM, SP], dt)
        for j in tl.static_range(TB):
            i = TB - 1 - j
            t = t0 + i
            valid = ((m * 0 + t) < L)[:, None]
            lam = pick3(LAM, rows, i)
            eta = pick3(ETA, rows, i)
            if i == 0:
                lam_prev = lam_s
                eta_prev = eta_s
            else:
                lam_prev = pick3(LAM, rows, i - 1)
                eta_prev = pick3(ETA, rows, i - 1)
            vv = pick3(sv, rows, i)
            Lv = pick3(sL, rows, i)
            kk = pick3(sk, rows, i)
            qq = pick3(sq, rows, i)
            gy = pick3(sgy, rows, i)
            gyv = pick3(sgv, rows, i)
            rl = 1.0 / lam
            mean = eta * rl
            gl = -rl * (gy * qq * mean + gyv * qq * qq * rl)
            if HAS_GPREC:
                poff = (base_m + t * M) * S + ms
                gl += tl.load(gprec_ptr + poff, mask=lane_mask & valid, other=0.0).to(dt)
            Lt = tl.where(valid, gl + Lc, 0.0)
            Et = tl.where(valid, gy * qq * rl + Ec, 0.0)
            GQ = put3(GQ, rows, i, tl.where(valid, gy * mean + 2.0 * gyv * qq * rl, 0.0))
            GK = put3(GK, rows, i, 2.0 * Lt * Lv * kk + Et * vv * Lv)
            GV = put3(GV, rows, i, Et * Lv * kk)
            GLV = put3(GLV, rows, i, Lt * kk * kk + Et * vv * kk)
            lam_pred, alpha, rden, forget = predict(lam_prev, a, p)
            g_al = Et * eta_prev
            ga += tl.where(forget, 0.0, g_al * (rden - 2.0 * alpha * alpha))
            ga -= 2.0 * Lt * alpha * lam_pred
            gp -= lam_pred * (Lt * lam_pred + g_al * alpha)
            Lc = tl.where(valid, alpha * alpha * Lt - alpha * p * rden * g_al, Lc)
            Ec = tl.where(valid, alpha * Et, Ec)
        out = base_m + (t0 + rows)[:, None] * M + m[None, :]
        omask = ((t0 + rows) < L)[:, None] & mmask[None, :]
        tl.store(gv_ptr + out, tl.sum(GV, axis=2), mask=omask)
        tl.store(gLv_ptr + out, tl.sum(GLV, axis=2), mask=omask)
        # partial sums over this program's channels
        t = t0 + rows
        poff = part + t[:, None] * S + s[None, :]
        pmask = (t < L)[:, None] & (s < S)[None, :]
        tl.store(gk_part_ptr + poff, tl.sum(GK, axis=1), mask=pmask)
        tl.store(gq_part_ptr + poff, tl.sum(GQ, axis=1), mask=pmask)
    tl.store(ga_part_ptr + state_off, ga, mask=lane_mask)
    tl.store(gp_part_ptr + state_off, gp, mask=lane_mask)
    tl.store(g0_ptr + state_off, Lc, mask=lane_mask)
    tl.store(g0_ptr + B * M * S + state_off, Ec, mask=lane_mask)


# Tuning (benchmarks/gpu.py sweeps these): time steps per staged tile (also the checkpoint
# interval of the backward) and lanes per program of the forward and backward kernels.
TUNING = {"TB": 8, "fwd_lanes": 128, "bwd_lanes": 256}


def _config(S: int, which: str):
    """``(TB, BM, SP, num_warps)``: lanes ``[BM, SP]`` per program, one per thread."""
    SP = triton.next_power_of_2(S)
    if interpreting():
        return 4, max(1, 16 // SP), SP, 1
    BM = max(1, TUNING[which] // SP)
    return TUNING["TB"], BM, SP, min(16, max(1, BM * SP // 32))


def _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
    B, L, M = v.shape
    S = k.shape[-1]
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    TB, BM, SP, warps = _config(S, "fwd_lanes")
    NB = triton.cdiv(L, TB)
    like = torch.empty((), dtype=dtype, device=v.device)
    y = empty((B, L, M), like)
    yvar = empty((B, L, M), like)
    lamT = empty((B, M, S), like)
    etaT = empty((B, M, S), like)
    prec = empty((B, L, M, S), like) if save_prec else y
    ck = empty((2, B, NB, M, S), like) if save_ck else y
    grid = (triton.cdiv(M, BM), B)
    _kla_fwd_kernel[grid](v, Lv, k, q, a, p, lam0, eta0, y, yvar, lamT, etaT, prec, ck,
                          L, M, S, NB, 1, SAVE_PREC=save_prec, SAVE_CK=save_ck,
                          TB=TB, BM=BM, SP=SP, num_warps=warps)  # fmt: skip
    return y, yvar, lamT, etaT, (prec if save_prec else None), (ck if save_ck else None), TB


def _backward(v, Lv, k, q, a, p, ck, TB, gy, gyv, glT, geT, gprec):
    B, L, M = v.shape
    S = k.shape[-1]
    like = ck
    _, BM, SP, warps = _config(S, "bwd_lanes")
    NB = triton.cdiv(L, TB)
    nmb = triton.cdiv(M, BM)

    def dense(g, shape):
        return (
            torch.zeros(shape, dtype=like.dtype, device=like.device)
            if g is None
            else g.contiguous()
        )

    gy = dense(gy, (B, L, M))
    gyv = dense(gyv, (B, L, M))
    glT = dense(glT, (B, M, S))
    geT = dense(geT, (B, M, S))
    gv = empty((B, L, M), like)
    gLv = empty((B, L, M), like)
    gk_part = empty((nmb, B, L, S), like)
    gq_part = empty((nmb, B, L, S), like)
    ga_part = empty((B, M, S), like)
    gp_part = empty((B, M, S), like)
    g0 = empty((2, B, M, S), like)
    has_gprec = gprec is not None
    gprec = gprec.contiguous() if has_gprec else gy
    _kla_bwd_kernel[(nmb, B)](v, Lv, k, q, a, p, ck, gy, gyv, glT, geT, gprec,
                              gv, gLv, gk_part, gq_part, ga_part, gp_part, g0,
                              L, M, S, NB, B, 1, HAS_GPREC=has_gprec, TB=TB, BM=BM, SP=SP,
                              num_warps=warps)  # fmt: skip
    return gv, gLv, gk_part.sum(0), gq_part.sum(0), ga_part.sum(0), gp_part.sum(0), g0[0], g0[1]


class _KLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
        y, yvar, lamT, etaT, prec, ck, TB = _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec,
                                                     save_ck)  # fmt: skip
        ctx.TB = TB
        if save_ck:
            ctx.save_for_backward(v, Lv, k, q, a, p, ck)
        outs = (y, yvar, lamT, etaT) + ((prec,) if save_prec else ())
        return outs

    @staticmethod
    def backward(ctx, gy, gyv, glT, geT, *rest):
        v, Lv, k, q, a, p, ck = ctx.saved_tensors
        gprec = rest[0] if rest else None
        gv, gLv, gk, gq, ga, gp, gl0, ge0 = _backward(v, Lv, k, q, a, p, ck, ctx.TB, gy, gyv, glT,
                                                      geT, gprec)  # fmt: skip
        return gv, gLv, gk, gq, ga, gp, gl0, ge0, None, None


def kla_triton(v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False):
    """Fused KLA op on CUDA tensors: ``(y, yvar, lam, eta, precision or None)``.

    Prepared inputs as ``kalmanscan.core.kla_op.kla_filter`` makes them (one dtype, exact
    shapes); use ``kla_filter(..., backend="triton")`` rather than calling this directly.

    >>> import torch  # doctest: +SKIP
    >>> from kalmanscan.core.kla_op import kla_filter
    >>> B, L, M, S = 4, 2048, 960, 16
    >>> x = [torch.randn(B, L, M, device="cuda"), torch.rand(B, L, M, device="cuda") + 0.5,
    ...      torch.randn(B, L, S, device="cuda"), torch.randn(B, L, S, device="cuda")]
    >>> res = kla_filter(*x, torch.full((M, S), 0.9, device="cuda"),
    ...                  torch.full((M, S), 0.1, device="cuda"), backend="triton")
    """
    args = [x.contiguous() for x in (v, Lv, k, q, decay, process_var, lam0, eta0)]
    save_ck = torch.is_grad_enabled() and any(x.requires_grad for x in args)
    outs = _KLA.apply(*args, bool(return_precision), save_ck)
    y, yvar, lamT, etaT = outs[:4]
    return y, yvar, lamT, etaT, (outs[4] if return_precision else None)
