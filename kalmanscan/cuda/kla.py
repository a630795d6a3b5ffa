"""Fused Triton kernels of the KLA op (SPEC §3): the ``"triton"`` backend of ``kla_filter``.

Shapes (batch B, time L, channels M, slots S; a lane is ``(b, m, s)``): ``v, Lv [B, L, M]``,
``k, q [B, L, S]``, ``decay, process_var [M, S]``, ``lam0, eta0 [B, M, S]``; outputs
``y, yvar [B, L, M]``, the final ``lam, eta [B, M, S]`` and optionally the precisions
``[B, L, M, S]``. Per step ``phi = Lv[m] k[s]^2``, ``r = v[m] Lv[m] k[s]``, ``c = 0``.

A program owns the lanes ``[BM, S]`` of one batch row and walks them through time, one lane per
thread, the state in registers. The per-step loads (``v, Lv`` per channel, ``k, q`` per slot) do
not depend on the state, so the loop is software-pipelined (``tl.range(num_stages=NS)``: the
loads of the next NS-1 steps are in flight, through shared memory, while a step computes). No
``[B, L, M, S]`` tensor is written unless the precisions are asked for.

Backward (exact): the forward saves the state every CK steps (``[2, B, L/CK, M, S]``, only when
a gradient is needed); the backward walks the intervals in reverse, recomputes an interval's
states from its checkpoint into a small per-program scratch (``[2, CK, BM, S]``, L2-resident),
then runs the two scalar adjoint recurrences ``Ec <- alpha Et``,
``Lc <- alpha^2 Lt - alpha p rden Et eta_prev`` over it. Sums over ``s`` (``gv, gLv``) happen in
the program; sums over ``m`` (``gk, gq``) are written per program and added in torch; sums over
``b`` and ``t`` (``gdecay, gprocess_var``) are kept in registers per batch row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import empty, interpreting, predict

__all__ = ["kla_triton"]


@triton.jit
def _kla_fwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, yvar_ptr, lamT_ptr, etaT_ptr, prec_ptr, ck_ptr,
    L, M, S, NB,
    SAVE_PREC: tl.constexpr, SAVE_CK: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    BM: tl.constexpr, SP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(1)
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    s = tl.arange(0, SP)
    mmask = m < M
    smask = s < S
    lane_mask = mmask[:, None] & smask[None, :]
    ms = m[:, None] * S + s[None, :]
    dt = y_ptr.dtype.element_ty
    a = tl.load(a_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=lane_mask, other=1.0).to(dt)
    state_off = b.to(tl.int64) * M * S + ms
    lam = tl.load(lam0_ptr + state_off, mask=lane_mask, other=1.0).to(dt)
    eta = tl.load(eta0_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    ck_eta = NB * M * S * tl.num_programs(1)
    # the loads of later steps are issued ahead of use (software pipeline, NS stages)
    for t in tl.range(0, L, num_stages=NS):
        if SAVE_CK:
            first = (((m * 0 + t) % CK) == 0)[:, None]
            ck = (b.to(tl.int64) * NB + t // CK) * M * S + ms
            tl.store(ck_ptr + ck, lam, mask=lane_mask & first)
            tl.store(ck_ptr + ck + ck_eta, eta, mask=lane_mask & first)
        v = tl.load(v_ptr + base_m + t * M + m, mask=mmask, other=0.0).to(dt)
        Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=mmask, other=0.0).to(dt)
        kk = tl.load(k_ptr + base_s + t * S + s, mask=smask, other=0.0).to(dt)
        qq = tl.load(q_ptr + base_s + t * S + s, mask=smask, other=0.0).to(dt)
        lam_pred, alpha, _, _ = predict(lam, a, p)
        lam = lam_pred + Lv[:, None] * (kk * kk)[None, :]
        eta = alpha * eta + (v * Lv)[:, None] * kk[None, :]
        rl = 1.0 / lam
        y = tl.sum(qq[None, :] * eta * rl, axis=1)
        yv = tl.sum((qq * qq)[None, :] * rl, axis=1)
        tl.store(y_ptr + base_m + t * M + m, y, mask=mmask)
        tl.store(yvar_ptr + base_m + t * M + m, yv, mask=mmask)
        if SAVE_PREC:
            tl.store(prec_ptr + (base_m + t * M) * S + ms, lam, mask=lane_mask)
    tl.store(lamT_ptr + state_off, lam, mask=lane_mask)
    tl.store(etaT_ptr + state_off, eta, mask=lane_mask)


@triton.jit
def _kla_bwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ck_ptr,
    gy_ptr, gyv_ptr, glT_ptr, geT_ptr, gprec_ptr,
    gv_ptr, gLv_ptr, gk_part_ptr, gq_part_ptr, ga_part_ptr, gp_part_ptr, g0_ptr, scratch_ptr,
    L, M, S, NB, B,
    HAS_GPREC: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    BM: tl.constexpr, SP: tl.constexpr,
):  # fmt: skip
    pm = tl.program_id(0)
    b = tl.program_id(1)
    m = pm * BM + tl.arange(0, BM)
    s = tl.arange(0, SP)
    mmask = m < M
    smask = s < S
    lane_mask = mmask[:, None] & smask[None, :]
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
    # this program's scratch: the states of one checkpoint interval, [2, CK, BM, SP] (L2-resident)
    lanes = tl.arange(0, BM)[:, None] * SP + s[None, :]
    scr = scratch_ptr + (pm.to(tl.int64) * B + b) * 2 * CK * BM * SP + lanes
    for jb in range(0, NB):
        blk = NB - 1 - jb
        t0 = blk * CK
        ck = (b.to(tl.int64) * NB + blk) * M * S + ms
        lam_s = tl.load(ck_ptr + ck, mask=lane_mask, other=1.0)
        eta_s = tl.load(ck_ptr + ck + eta_ck, mask=lane_mask, other=0.0)
        # recompute the interval's states from its checkpoint
        lam = lam_s
        eta = eta_s
        for i in tl.range(0, CK, num_stages=NS):
            t = t0 + i
            tm = (m * 0 + t < L) & mmask
            v = tl.load(v_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)
            Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)
            kk = tl.load(k_ptr + base_s + t * S + s, mask=smask & (s * 0 + t < L), other=0.0).to(dt)
            lam_pred, alpha, _, _ = predict(lam, a, p)
            lam = lam_pred + Lv[:, None] * (kk * kk)[None, :]
            eta = alpha * eta + (v * Lv)[:, None] * kk[None, :]
            tl.store(scr + i * BM * SP, lam)
            tl.store(scr + (CK + i) * BM * SP, eta)
        tl.debug_barrier()
        # walk it backward: the adjoints Lc, Ec of lam, eta after each step
        for j in tl.range(0, CK, num_stages=NS):
            i = CK - 1 - j
            t = t0 + i
            tv = (m * 0 + t) < L
            valid = tv[:, None]
            tm = tv & mmask
            ts = smask & (s * 0 + t < L)
            lam = tl.load(scr + i * BM * SP)
            eta = tl.load(scr + (CK + i) * BM * SP)
            ip = tl.maximum(i - 1, 0)
            at0 = ((m * 0 + i) == 0)[:, None]
            lam_prev = tl.where(at0, lam_s, tl.load(scr + ip * BM * SP))
            eta_prev = tl.where(at0, eta_s, tl.load(scr + (CK + ip) * BM * SP))
            vv = tl.load(v_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)[:, None]
            Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)[:, None]
            gy = tl.load(gy_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)[:, None]
            gyv = tl.load(gyv_ptr + base_m + t * M + m, mask=tm, other=0.0).to(dt)[:, None]
            kk = tl.load(k_ptr + base_s + t * S + s, mask=ts, other=0.0).to(dt)[None, :]
            qq = tl.load(q_ptr + base_s + t * S + s, mask=ts, other=0.0).to(dt)[None, :]
            rl = 1.0 / lam
            mean = eta * rl
            gl = -rl * (gy * qq * mean + gyv * qq * qq * rl)
            if HAS_GPREC:
                poff = (base_m + t * M) * S + ms
                gl += tl.load(gprec_ptr + poff, mask=lane_mask & valid, other=0.0).to(dt)
            Lt = tl.where(valid, gl + Lc, 0.0)
            Et = tl.where(valid, gy * qq * rl + Ec, 0.0)
            out = base_m + t * M + m
            tl.store(gv_ptr + out, tl.sum(Et * Lv * kk, axis=1), mask=tm)
            tl.store(gLv_ptr + out, tl.sum(Lt * kk * kk + Et * vv * kk, axis=1), mask=tm)
            gq = tl.sum(tl.where(valid, gy * mean + 2.0 * gyv * qq * rl, 0.0), axis=0)
            gk = tl.sum(2.0 * Lt * Lv * kk + Et * vv * Lv, axis=0)
            tl.store(gk_part_ptr + part + t * S + s, gk, mask=ts)
            tl.store(gq_part_ptr + part + t * S + s, gq, mask=ts)
            lam_pred, alpha, rden, forget = predict(lam_prev, a, p)
            g_al = Et * eta_prev
            ga += tl.where(forget, 0.0, g_al * (rden - 2.0 * alpha * alpha))
            ga -= 2.0 * Lt * alpha * lam_pred
            gp -= lam_pred * (Lt * lam_pred + g_al * alpha)
            Lc = tl.where(valid, alpha * alpha * Lt - alpha * p * rden * g_al, Lc)
            Ec = tl.where(valid, alpha * Et, Ec)
        tl.debug_barrier()
    tl.store(ga_part_ptr + state_off, ga, mask=lane_mask)
    tl.store(gp_part_ptr + state_off, gp, mask=lane_mask)
    tl.store(g0_ptr + state_off, Lc, mask=lane_mask)
    tl.store(g0_ptr + B * M * S + state_off, Ec, mask=lane_mask)


# Tuning (benchmarks/gpu.py sweeps it): checkpoint interval of the backward (steps), pipeline
# stages of the per-step loads, lanes per program of the forward and backward kernels, lanes
# per thread (more than one gives each thread independent chains to interleave).
TUNING = {"CK": 8, "NS": 4, "fwd_lanes": 128, "bwd_lanes": 128, "lanes_per_thread": 1}


def _config(S: int, which: str):
    """``(BM, SP, num_warps)``: lanes ``[BM, SP]`` per program, ``lanes_per_thread`` a thread."""
    SP = triton.next_power_of_2(S)
    if interpreting():
        return max(1, 16 // SP), SP, 1
    BM = max(1, TUNING[which] // SP)
    return BM, SP, min(16, max(1, BM * SP // (32 * TUNING["lanes_per_thread"])))


def _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
    B, L, M = v.shape
    S = k.shape[-1]
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    BM, SP, warps = _config(S, "fwd_lanes")
    CK = 4 if interpreting() else TUNING["CK"]
    NB = triton.cdiv(L, CK)
    like = torch.empty((), dtype=dtype, device=v.device)
    y = empty((B, L, M), like)
    yvar = empty((B, L, M), like)
    lamT = empty((B, M, S), like)
    etaT = empty((B, M, S), like)
    prec = empty((B, L, M, S), like) if save_prec else y
    ck = empty((2, B, NB, M, S), like) if save_ck else y
    grid = (triton.cdiv(M, BM), B)
    _kla_fwd_kernel[grid](v, Lv, k, q, a, p, lam0, eta0, y, yvar, lamT, etaT, prec, ck,
                          L, M, S, NB, SAVE_PREC=save_prec, SAVE_CK=save_ck, CK=CK,
                          NS=TUNING["NS"], BM=BM, SP=SP, num_warps=warps)  # fmt: skip
    return y, yvar, lamT, etaT, (prec if save_prec else None), (ck if save_ck else None), CK


def _backward(v, Lv, k, q, a, p, ck, CK, gy, gyv, glT, geT, gprec):
    B, L, M = v.shape
    S = k.shape[-1]
    like = ck
    BM, SP, warps = _config(S, "bwd_lanes")
    NB = triton.cdiv(L, CK)
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
    scratch = torch.empty((nmb * B, 2, CK, BM, SP), dtype=like.dtype, device=like.device)
    has_gprec = gprec is not None
    gprec = gprec.contiguous() if has_gprec else gy
    _kla_bwd_kernel[(nmb, B)](v, Lv, k, q, a, p, ck, gy, gyv, glT, geT, gprec,
                              gv, gLv, gk_part, gq_part, ga_part, gp_part, g0, scratch,
                              L, M, S, NB, B, HAS_GPREC=has_gprec, CK=CK, NS=TUNING["NS"],
                              BM=BM, SP=SP, num_warps=warps)  # fmt: skip
    return gv, gLv, gk_part.sum(0), gq_part.sum(0), ga_part.sum(0), gp_part.sum(0), g0[0], g0[1]


class _KLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
        y, yvar, lamT, etaT, prec, ck, CK = _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec,
                                                     save_ck)  # fmt: skip
        ctx.CK = CK
        if save_ck:
            ctx.save_for_backward(v, Lv, k, q, a, p, ck)
        outs = (y, yvar, lamT, etaT) + ((prec,) if save_prec else ())
        return outs

    @staticmethod
    def backward(ctx, gy, gyv, glT, geT, *rest):
        v, Lv, k, q, a, p, ck = ctx.saved_tensors
        gprec = rest[0] if rest else None
        gv, gLv, gk, gq, ga, gp, gl0, ge0 = _backward(v, Lv, k, q, a, p, ck, ctx.CK, gy, gyv, glT,
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
