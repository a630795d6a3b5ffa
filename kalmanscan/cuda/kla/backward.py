"""The KLA backward kernel and its launch: exact gradients of every input from the forward's
checkpoints (notation: ``kalmanscan/cuda/kla``'s docstring).

The forward saves the state every ``CK`` steps (8; ``[2, B, L/CK, M, S]``; from
``tuning.LARGE`` lanes, 4 slots a thread, the backward recomputes an interval's first half again
after walking back its second: ``tuning.TUNING["bwd_rerun"]``).
The backward walks the intervals in reverse: it loads an interval's inputs as
tiles of 4 steps (``v, Lv, gy, gyv`` as ``[4, channels]``, ``k, q`` as ``[4, slots]``),
recomputes its states from the checkpoint into registers (unrolled) and runs the two scalar
adjoint recurrences ``Ec <- alpha Et``, ``Lc <- alpha^2 Lt - alpha p rden Et eta_prev`` over
them, reusing the recomputation's inputs. Sums over ``s`` (``gv, gLv``) happen in the thread
and its channel group (reduce-scattered in float32 with 4 or 8 threads a channel); sums over
``m`` (``gk, gq``) are reduce-scattered over the warp and added into ``[B, L, S]`` by float32
atomics (``tuning.TUNING["bwd_atomic_sums"]``; under ``torch.use_deterministic_algorithms``
written per program and added in torch, in a fixed order); sums over ``b`` and ``t``
(``gdecay, gprocess_var``) stay in registers per batch row and are added into ``[M, S]`` the
same way at the end (or written per row). Only a lane's last interval can
reach past ``L``: it runs first, masked, the others without step masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import cdiv, empty, helper, launch
from kalmanscan.cuda.kla import tuning
from kalmanscan.cuda.kla.device import (
    _dynamics,
    _group_sum,
    _prefetch_l2,
    _program,
    _rcp,
    _reduce_scatter8,
    _row,
    _scatter_ptrs,
    _scatter_store4,
    _slot_tile,
    _step_from,
    _swap_add,
    _vl4,
)


@helper
def _prefetch_interval(ptr_a, ptr_b, ptr_c, ptr_d, base_m, t, L, M, pm, j, CK: tl.constexpr,
                       G: tl.constexpr, NT: tl.constexpr):  # fmt: skip
    """Prefetch into L2 the rows ``t .. t + CK - 1`` (each clamped into ``[0, L)``) of four
    ``[B, L, M]`` arrays at the program's channels, in two instructions a warp: thread ``j``
    takes array ``j % 4`` at step ``t + (j // 4) % CK``, pointing at the program's first
    channel, then at its last (clamped to ``M - 1``), so that both ends of each row's segment
    (``NT / G`` channels, one or two sectors) are asked for."""
    tc = tl.minimum(tl.maximum(t + (j // 4) % CK, 0), L - 1)
    first = pm * (NT // G)
    last = tl.minimum(first + (NT // G - 1), M - 1)
    row = base_m + tc * M
    sel = j % 4
    for c in tl.static_range(2):
        off = row + (first if c == 0 else last)
        # as addresses: the arrays may differ in type (half inputs, float32 gradients)
        ptrs = tl.where(sel == 0, (ptr_a + off).to(tl.int64), (ptr_b + off).to(tl.int64))
        ptrs = tl.where(sel == 2, (ptr_c + off).to(tl.int64), ptrs)
        ptrs = tl.where(sel == 3, (ptr_d + off).to(tl.int64), ptrs)
        _prefetch_l2(ptrs)


@helper
def _channel_sum(x, G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr):
    """``[SG, NT] -> [SG, G]``: the sum over the program's channels of each slot."""
    return tl.sum(tl.reshape(x, [SG, NT // G, G]), axis=1)


@helper
def _put_sum(ptr, x, ok, ATOMIC: tl.constexpr):
    """``x`` at ``ptr`` where ``ok``: added there (``red.global.add``) with ``ATOMIC``, else
    stored."""
    if ATOMIC:
        tl.atomic_add(ptr, x, mask=ok, sem="relaxed")
    else:
        tl.store(ptr, x, mask=ok)


@helper
def _store_channel_sums(xk, xq, gk_ptr, gq_ptr, off, t, L, S: tl.constexpr, G: tl.constexpr,
                        SG: tl.constexpr, NT: tl.constexpr,
                        MASKED: tl.constexpr = True, ATOMIC: tl.constexpr = False):  # fmt: skip
    """Store the sums over the program's channels of ``xk, xq [SG, NT]`` at ``gk_ptr + off + s``
    and ``gq_ptr + off + s`` for the slots ``s < S`` (with ``MASKED``: where step ``t`` is
    inside ``L``), each summed by ``tl.sum`` (an all-reduce: ``log2(NT / G)`` shuffles a
    value); with ``ATOMIC`` added there (``red.global.add``) instead of stored."""
    so = tl.arange(0, G)[None, :] * SG + tl.arange(0, SG)[:, None]
    ok = so < S
    if MASKED:
        ok = ok & ((so * 0 + t) < L)
    _put_sum(gk_ptr + off + so, _channel_sum(xk, G, SG, NT), ok, ATOMIC)
    _put_sum(gq_ptr + off + so, _channel_sum(xq, G, SG, NT), ok, ATOMIC)


@helper
def _scatter_channel_sums(xk, xq, gk_ptr, gq_ptr, off, jt, t, L, S: tl.constexpr,
                          G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr,
                          MASKED: tl.constexpr = True, ATOMIC: tl.constexpr = False):  # fmt: skip
    """``_store_channel_sums`` by a reduce-scatter over the warp where the ``2 SG`` values of a
    thread match the ``32 / G`` threads of its slot group (float32, ``S`` of 9 to 16, 2 or 4
    slots a thread): ``log2(2 SG)`` butterfly rounds each exchange half the values left
    (``2 SG - 1`` shuffles a thread instead of ``2 SG log2(32 / G)``) and leave thread ``c``
    of the group with value ``c``'s sum over the program's channels; otherwise by ``tl.sum``."""
    if xk.dtype != tl.float32 or 2 * SG != 32 // G or (SG != 2 and SG != 4):
        _store_channel_sums(xk, xq, gk_ptr, gq_ptr, off, t, L, S, G, SG, NT, MASKED, ATOMIC)
    else:
        c = (jt % 32) // G  # the thread's place among its warp's threads of its slot group
        if SG == 4:  # values 0-3: xk's rows, 4-7: xq's
            w = _reduce_scatter8(_row(xk, 0, SG), _row(xk, 1, SG), _row(xk, 2, SG),
                                 _row(xk, 3, SG), _row(xq, 0, SG), _row(xq, 1, SG),
                                 _row(xq, 2, SG), _row(xq, 3, SG), c, G)  # fmt: skip
        else:  # SG == 2: values 0-1: xk's rows, 2-3: xq's
            hi = ((c >> 1) & 1) == 1
            z0 = _swap_add(_row(xk, 0, SG), _row(xq, 0, SG), hi, 2 * G)
            z1 = _swap_add(_row(xk, 1, SG), _row(xq, 1, SG), hi, 2 * G)
            w = _swap_add(z0, z1, (c & 1) == 1, G)  # the warp's sum of value c
        slot = (jt % G) * SG + c % SG
        ptr = tl.where(c < SG, gk_ptr, gq_ptr) + off + slot
        ok = slot < S
        if MASKED:
            ok = ok & ((slot * 0 + t) < L)
        _put_sum(ptr, w, ok, ATOMIC)


@helper
def _scatter_outputs4(y0, y1, y2, y3, v0, v1, v2, v3, t, y_ptr, yvar_ptr, L, M, base_m, m, mmask,
                      jt, G: tl.constexpr, MASKED: tl.constexpr = True):  # fmt: skip
    """``_scatter_store4`` of the 4 steps from ``t`` (with ``MASKED``, stores past ``L``
    masked)."""
    c = jt % G  # the thread's place among the threads of its channel
    ptr_a, ptr_b, step = _scatter_ptrs(y_ptr, yvar_ptr, t, base_m, M, m, c, G)
    omask = mmask
    if MASKED:
        omask = omask & (step < L)
    _scatter_store4(y0, y1, y2, y3, v0, v1, v2, v3, c, ptr_a, ptr_b, omask, G, True)


@helper
def _step_masks(t, L, m, mmask, smask, MASKED: tl.constexpr):
    """The load masks ``[NT]`` (per channel) and ``[SG, NT]`` (per slot) of step ``t``: the
    channel and slot masks, and with ``MASKED`` also ``t < L``."""
    if MASKED:
        inside = (m * 0 + t) < L  # [NT]
        return mmask & inside, smask & inside[None, :]
    return mmask, smask


@helper
def _recompute4(l0, e0, t0, p, d, af, e, v_ptr, Lv_ptr, k_ptr, L, M, S: tl.constexpr, base_m,
                base_s, pm, dt: tl.constexpr, SG: tl.constexpr, G: tl.constexpr,
                NT: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """The 4 states after ``(l0, e0)`` from step ``t0`` on, recomputed into registers
    (unrolled: Triton has no register arrays) from inputs loaded as tiles (``_vl4``,
    ``_slot_tile``; with ``MASKED`` zeros past ``L``), followed by the 4 steps' inputs
    ``v, Lv, k``."""
    v0, L0, v1, L1, v2, L2, v3, L3 = _vl4(v_ptr, Lv_ptr, t0, L, M, base_m, pm, dt, G, NT,
                                          MASKED)  # fmt: skip
    k0, k1, k2, k3 = _slot_tile(k_ptr, t0, L, S, base_s, dt, SG, G, NT, MASKED)
    l1, e1 = _step_from(l0, e0, p, d, af, e, v0, L0, k0)
    l2, e2 = _step_from(l1, e1, p, d, af, e, v1, L1, k1)
    l3, e3 = _step_from(l2, e2, p, d, af, e, v2, L2, k2)
    l4, e4 = _step_from(l3, e3, p, d, af, e, v3, L3, k3)
    return l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3


@helper
def _checkpoint_state(ck_ptr, eta_ck, t0, b, NB, M, S: tl.constexpr, ms, lane_mask,
                      CK: tl.constexpr):  # fmt: skip
    """The state ``(lam, eta)`` saved before step ``t0`` (a multiple of ``CK``)."""
    ck = (b.to(tl.int64) * NB + t0 // CK) * M * S + ms
    l0 = tl.load(ck_ptr + ck, mask=lane_mask, other=1.0)
    e0 = tl.load(ck_ptr + ck + eta_ck, mask=lane_mask, other=0.0)
    return l0, e0


@helper
def _adjoint_step(
    lam, eta, lam_prev, eta_prev, Lc, Ec, ga, gz, gp, p, d, af, e, vv, Lv, kk, gy, gyv, qq,
    gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    t, L, M, S: tl.constexpr, base_m, part, m, mo, jt, mmask, smask, momask, ms,
    dt: tl.constexpr, HAS_GPREC: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, MASKED: tl.constexpr, OUT4: tl.constexpr, ATOMIC: tl.constexpr = False,
    HAS_GYV: tl.constexpr = True,
):  # fmt: skip
    """The adjoints ``(Lc, Ec)`` of ``(lam, eta)`` before step ``t`` from those after it, the
    step's input gradients, and the dynamics' gradient sums; also the thread's own sums over
    its slots of ``gv, gLv`` (``[NT]``). ``vv, Lv, kk``: the recomputation's inputs;
    ``gy, gyv, qq``: the caller's tiles. ``OUT4``: the caller stores ``gv, gLv``
    (``_scatter_outputs4``), else they are stored here. ``MASKED``: steps past ``L`` change
    nothing (only the last interval of a lane needs it).

    Written for few instructions a lane: with ``qrl = q / lam`` and
    ``A = gy mean + gyv qrl``, the precision's local gradient is ``-qrl A`` and ``gq``'s term is
    ``A + gyv qrl``; ``gv = Lv sum_s Et k``, ``gLv = sum_s Lt k^2 + v sum_s Et k`` (one
    in-thread sum of each kind), ``gk``'s term is ``Lv (2 k Lt + v Et)``. The recomputation's
    ``1 / (p lam + d)`` and ``lam / (p lam + d) + e`` are the same expressions as here, so the
    compiler computes them once."""
    mm, sm = _step_masks(t, L, m, mmask, smask, MASKED)
    omask = momask
    if MASKED:
        omask = momask & ((mo * 0 + t) < L)
    rl = _rcp(lam)
    qrl = qq * rl
    A = gy[None, :] * (eta * rl)
    if HAS_GYV:  # (else gyv is 0: its terms left out)
        A += gyv[None, :] * qrl
    Lt = Lc - qrl * A
    if HAS_GPREC:
        poff = (base_m + t * M) * S + ms
        Lt += tl.load(gprec_ptr + poff, mask=sm & mm[None, :], other=0.0).to(dt)
    Et = Ec + gy[None, :] * qrl
    # sums over a channel's slots: in the thread, then over its G threads
    sek = tl.sum(Et * kk, axis=0)  # [NT]
    slk = tl.sum(Lt * (kk * kk), axis=0)
    pv = Lv * sek
    pl = vv * sek + slk
    if not OUT4:
        out = base_m + t * M + mo
        tl.store(gv_ptr + out, _group_sum(pv, G, NT), mask=omask)
        tl.store(gLv_ptr + out, _group_sum(pl, G, NT), mask=omask)
    # sums over the program's channels
    # (grouped as 2 Lv (k Lt) + v Lv Et: v Lv is the recomputation's, 2 Lv the channel's once
    # for its slots, so 3 operations a lane where Lv (2 k Lt + v Et) took 4)
    xk = (2.0 * Lv)[None, :] * (kk * Lt) + (vv * Lv)[None, :] * Et
    xq = A
    if HAS_GYV:
        xq += gyv[None, :] * qrl
    _scatter_channel_sums(xk, xq, gk_ptr, gq_ptr, part + t * S, jt, t, L, S, G, SG, NT, MASKED,
                          ATOMIC)  # fmt: skip
    rden = _rcp(p * lam_prev + d)
    alpha = af * rden
    g_al = Et * eta_prev
    # d/da: alpha' = rden - 2 alpha^2 (0 where the decay is 0), lam_pred' = -2 alpha lam_pred;
    # d/dp: alpha' = -alpha lam_pred, lam_pred' = -lam_pred^2. Where the decay is 0,
    # rden = alpha = 0 and lam_pred = e = 1 / p. With Y = rden g_al and
    # Z = alpha g_al + lam_pred Lt these are
    #   dga = g_al (rden - 2 alpha^2) - 2 alpha lam_pred Lt = Y - 2 alpha Z,
    #   dgp = -(lam_pred^2 Lt + alpha lam_pred g_al) = -lam_pred Z,
    #   Lc' = alpha^2 Lt - alpha p rden g_al = alpha (alpha Lt - p Y)
    # (13 operations a lane-step where the products one by one took 18)
    lam_pred = lam_prev * rden + e
    Y = rden * g_al
    Z = alpha * g_al + lam_pred * Lt
    # (dga summed as two sums, sum Y and sum alpha Z, combined once at the end: 2 operations a
    # lane-step where Y - 2 alpha Z added took 3)
    aZ = alpha * Z
    dgp = -(lam_pred * Z)
    n_Lc = alpha * (alpha * Lt - p * Y)
    n_Ec = alpha * Et
    if MASKED:
        inside = ((m * 0 + t) < L)[None, :]
        ga = tl.where(inside, ga + Y, ga)
        gz = tl.where(inside, gz + aZ, gz)
        gp = tl.where(inside, gp + dgp, gp)
        Lc = tl.where(inside, n_Lc, Lc)
        Ec = tl.where(inside, n_Ec, Ec)
    else:
        ga += Y
        gz += aZ
        gp += dgp
        Lc = n_Lc
        Ec = n_Ec
    return Lc, Ec, ga, gz, gp, pv, pl


@helper
def _adjoint4(
    l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3, t0,
    Lc, Ec, ga, gz, gp, p, d, af, e,
    q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    L, M, S: tl.constexpr, base_m, base_s, part, m, mo, jt, mmask, smask, momask, ms,
    dt: tl.constexpr, HAS_GPREC: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, MASKED: tl.constexpr, pm, OUT4: tl.constexpr, HAS_GYV: tl.constexpr,
    ATOMIC: tl.constexpr = False,
):  # fmt: skip
    """The adjoint walk back over steps ``t0 + 3 .. t0`` (states ``l0..l4`` before and after
    them, their inputs ``v, Lv, k``): ``gy, gyv`` and ``q`` of the 4 steps loaded as tiles, then
    ``_adjoint_step`` of each, unrolled; with ``OUT4`` their ``gv, gLv`` stored by a
    reduce-scatter (``_scatter_outputs4``). ``HAS_GYV`` False: ``yvar``'s gradient is zero
    (not read)."""
    y0, w0, y1, w1, y2, w2, y3, w3 = _vl4(gy_ptr, gyv_ptr, t0, L, M, base_m, pm, dt, G, NT,
                                          MASKED)  # fmt: skip
    if not HAS_GYV:  # (gyv_ptr is gy_ptr then: its loads are dead and removed)
        w0 = tl.zeros_like(y0)
        w1, w2, w3 = w0, w0, w0
    q0, q1, q2, q3 = _slot_tile(q_ptr, t0, L, S, base_s, dt, SG, G, NT, MASKED)
    Lc, Ec, ga, gz, gp, pv3, pl3 = _adjoint_step(
        l4, e4, l3, e3, Lc, Ec, ga, gz, gp, p, d, af, e, v3, L3, k3, y3, w3, q3, gprec_ptr, gv_ptr,
        gLv_ptr, gk_ptr, gq_ptr, t0 + 3, L, M, S, base_m, part, m, mo, jt, mmask, smask, momask,
        ms, dt, HAS_GPREC, G, SG, NT, MASKED, OUT4, ATOMIC, HAS_GYV,
    )  # fmt: skip
    Lc, Ec, ga, gz, gp, pv2, pl2 = _adjoint_step(
        l3, e3, l2, e2, Lc, Ec, ga, gz, gp, p, d, af, e, v2, L2, k2, y2, w2, q2, gprec_ptr, gv_ptr,
        gLv_ptr, gk_ptr, gq_ptr, t0 + 2, L, M, S, base_m, part, m, mo, jt, mmask, smask, momask,
        ms, dt, HAS_GPREC, G, SG, NT, MASKED, OUT4, ATOMIC, HAS_GYV,
    )  # fmt: skip
    Lc, Ec, ga, gz, gp, pv1, pl1 = _adjoint_step(
        l2, e2, l1, e1, Lc, Ec, ga, gz, gp, p, d, af, e, v1, L1, k1, y1, w1, q1, gprec_ptr, gv_ptr,
        gLv_ptr, gk_ptr, gq_ptr, t0 + 1, L, M, S, base_m, part, m, mo, jt, mmask, smask, momask,
        ms, dt, HAS_GPREC, G, SG, NT, MASKED, OUT4, ATOMIC, HAS_GYV,
    )  # fmt: skip
    Lc, Ec, ga, gz, gp, pv0, pl0 = _adjoint_step(
        l1, e1, l0, e0, Lc, Ec, ga, gz, gp, p, d, af, e, v0, L0, k0, y0, w0, q0, gprec_ptr, gv_ptr,
        gLv_ptr, gk_ptr, gq_ptr, t0 + 0, L, M, S, base_m, part, m, mo, jt, mmask, smask, momask,
        ms, dt, HAS_GPREC, G, SG, NT, MASKED, OUT4, ATOMIC, HAS_GYV,
    )  # fmt: skip
    if OUT4:
        _scatter_outputs4(pv0, pv1, pv2, pv3, pl0, pl1, pl2, pl3, t0, gv_ptr, gLv_ptr, L, M,
                          base_m, m, mmask, jt, G, MASKED)  # fmt: skip
    return Lc, Ec, ga, gz, gp


@helper
def _bwd_interval(
    t0, Lc, Ec, ga, gz, gp, p, d, af, e, ck_ptr, eta_ck, b, NB,
    v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    L, M, S: tl.constexpr, base_m, base_s, part, m, mo, jt, mmask, smask, momask, ms,
    lane_mask, dt: tl.constexpr, HAS_GPREC: tl.constexpr, CK: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr, AHEAD: tl.constexpr,
    MASKED: tl.constexpr, pm, OUT4: tl.constexpr, HAS_GYV: tl.constexpr,
    ATOMIC: tl.constexpr = False, RERUN: tl.constexpr = False,
):  # fmt: skip
    """One checkpoint interval of the backward (``CK`` = 8 or 4 steps): its states recomputed
    from the checkpoint into registers, then walked back; ``AHEAD > 0``: the rows of the
    interval ``AHEAD`` steps earlier prefetched into L2 first. ``RERUN`` (``CK = 8``): the first
    half's states are not kept while the second half is walked back, but recomputed from the
    checkpoint again after it (4 states live, as with ``CK = 4``, for half the checkpoints)."""
    if AHEAD > 0:
        _prefetch_interval(v_ptr, Lv_ptr, gy_ptr, gyv_ptr, base_m, t0 - AHEAD, L, M, pm, jt, CK,
                           G, NT)  # fmt: skip
    l0, e0 = _checkpoint_state(ck_ptr, eta_ck, t0, b, NB, M, S, ms, lane_mask, CK)
    l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3 = _recompute4(
        l0, e0, t0, p, d, af, e, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m, base_s, pm, dt, SG, G,
        NT, MASKED)  # fmt: skip
    if CK == 8:  # the second half, then the walk back over it
        l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7, k7 = (
            _recompute4(l4, e4, t0 + 4, p, d, af, e, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
                        base_s, pm, dt, SG, G, NT, MASKED))  # fmt: skip
        Lc, Ec, ga, gz, gp = _adjoint4(
            l4, e4, l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7,
            k7, t0 + 4, Lc, Ec, ga, gz, gp, p, d, af, e, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr,
            gLv_ptr, gk_ptr, gq_ptr, L, M, S, base_m, base_s, part, m, mo, jt, mmask, smask,
            momask, ms, dt, HAS_GPREC, G, SG, NT, MASKED, pm, OUT4, HAS_GYV, ATOMIC,
        )  # fmt: skip
        if RERUN:  # the first half's states again, from the checkpoint
            l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3 = (
                _recompute4(l0, e0, t0, p, d, af, e, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
                            base_s, pm, dt, SG, G, NT, MASKED))  # fmt: skip
    Lc, Ec, ga, gz, gp = _adjoint4(
        l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3,
        t0, Lc, Ec, ga, gz, gp, p, d, af, e, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr,
        gk_ptr, gq_ptr, L, M, S, base_m, base_s, part, m, mo, jt, mmask, smask, momask, ms, dt,
        HAS_GPREC, G, SG, NT, MASKED, pm, OUT4, HAS_GYV, ATOMIC,
    )  # fmt: skip
    return Lc, Ec, ga, gz, gp


@triton.jit
def _kla_bwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ck_ptr,
    gy_ptr, gyv_ptr, glT_ptr, geT_ptr, gprec_ptr,
    gv_ptr, gLv_ptr, gk_part_ptr, gq_part_ptr, ga_part_ptr, gp_part_ptr, g0_ptr,
    L, M, NB, B, S: tl.constexpr,
    HAS_GPREC: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr, AHEAD: tl.constexpr,
    HAS_GYV: tl.constexpr, ATOMIC: tl.constexpr = False, RERUN: tl.constexpr = False,
):  # fmt: skip
    tl.static_assert(CK == 8 or CK == 4, "the backward's recomputation is unrolled for 8 or 4")
    tl.static_assert(NT == 32, "one warp a program (the reduce-scatters stay in a warp)")
    pm = tl.program_id(0)
    b = tl.program_id(1)
    m, s, mo, mmask, smask, momask, jt, lane_mask, ms, state_off = _program(pm, b, M, S, G, SG, NT)
    dt = gv_ptr.dtype.element_ty
    p, d, af, e = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt)
    # gv, gLv reduce-scattered (float32, 4 or 8 threads a channel)
    OUT4: tl.constexpr = dt == tl.float32 and (G == 4 or G == 8)
    Lc = tl.load(glT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    Ec = tl.load(geT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    ga = tl.zeros([SG, NT], dt)  # sum of Y; gz: sum of alpha Z (the decay's gradient: ga - 2 gz)
    gz = tl.zeros([SG, NT], dt)
    gp = tl.zeros([SG, NT], dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    if ATOMIC:  # every program adds into the row's [L, S] sums
        part = b.to(tl.int64) * L * S
    else:  # a [L, S] block of partial sums a program
        part = (pm.to(tl.int64) * B + b) * L * S
    eta_ck = NB * M * S * B
    n_full = L // CK  # whole intervals; the last one (NB - 1) is partial unless NB == n_full
    if NB > n_full:  # the partial last interval first, masked
        Lc, Ec, ga, gz, gp = _bwd_interval(
            n_full * CK, Lc, Ec, ga, gz, gp, p, d, af, e, ck_ptr, eta_ck, b, NB, v_ptr, Lv_ptr,
            k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_part_ptr, gq_part_ptr,
            L, M, S, base_m, base_s, part, m, mo, jt, mmask, smask, momask, ms, lane_mask, dt,
            HAS_GPREC, CK, G, SG, NT, AHEAD, True, pm, OUT4, HAS_GYV, ATOMIC, RERUN,
        )  # fmt: skip
    for jb in tl.range(0, n_full, num_stages=NS):  # the whole intervals, unmasked, from the end
        Lc, Ec, ga, gz, gp = _bwd_interval(
            (n_full - 1 - jb) * CK, Lc, Ec, ga, gz, gp, p, d, af, e, ck_ptr, eta_ck, b, NB, v_ptr,
            Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_part_ptr,
            gq_part_ptr, L, M, S, base_m, base_s, part, m, mo, jt, mmask, smask, momask, ms,
            lane_mask, dt, HAS_GPREC, CK, G, SG, NT, AHEAD, False, pm, OUT4, HAS_GYV, ATOMIC,
            RERUN,
        )  # fmt: skip
    ga = ga - 2.0 * gz
    # the dynamics' gradients: with ATOMIC added into [M, S], else per-row partial sums
    # [B, M, S] that torch adds
    if ATOMIC:
        tl.atomic_add(ga_part_ptr + ms, ga, mask=lane_mask, sem="relaxed")
        tl.atomic_add(gp_part_ptr + ms, gp, mask=lane_mask, sem="relaxed")
    else:
        tl.store(ga_part_ptr + state_off, ga, mask=lane_mask)
        tl.store(gp_part_ptr + state_off, gp, mask=lane_mask)
    tl.store(g0_ptr + state_off, Lc, mask=lane_mask)
    tl.store(g0_ptr + B * M * S + state_off, Ec, mask=lane_mask)


def _bwd_plan(B, L, M, S, CK):
    """The backward's launch configuration for a shape (kept by :func:`tuning.plan`)."""
    TU = tuning.tuning_for(B * M * S, channels=M)
    G, SG, NT, warps = tuning.layout(S, TU["bwd_slots"])
    nmb = cdiv(M, NT // G)
    return dict(
        NB=cdiv(L, CK), nmb=nmb, grid=(nmb, B),
        consts=dict(CK=CK, NS=TU["bwd_NS"], G=G, SG=SG, NT=NT, AHEAD=TU["bwd_l2_ahead"],
                    RERUN=CK == 8 and TU["bwd_rerun"], num_warps=warps),
    )  # fmt: skip


def backward(v, Lv, k, q, a, p, ck, CK, gy, gyv, glT, geT, gprec):
    """The backward kernel: the gradients ``(gv, gLv, gk, gq, ga, gp, gl0, ge0)`` from the
    forward's checkpoints ``ck`` (every ``CK`` steps) and the outputs' gradients (None:
    zeros; ``gyv`` None with ``gy`` given is not read at all)."""
    B, L, M = v.shape
    S = k.shape[-1]
    like = ck
    P = tuning.plan(_bwd_plan, B, L, M, S, CK)
    NB, nmb = P["NB"], P["nmb"]

    def dense(gs, shape):  # gradients the caller left out (None) are zeros, one buffer for both
        if gs[0] is None and gs[1] is None:
            z = torch.zeros((2,) + shape, dtype=like.dtype, device=like.device)
            return z[0], z[1]
        return tuple(
            torch.zeros(shape, dtype=like.dtype, device=like.device) if g is None
            else g.contiguous() for g in gs)  # fmt: skip

    has_gyv = gyv is not None or gy is None
    gy, gyv = dense((gy, gyv), (B, L, M)) if has_gyv else (gy.contiguous(), None)
    glT, geT = dense((glT, geT), (B, M, S))
    gv = empty((B, L, M), like)
    gLv = empty((B, L, M), like)
    # gk, gq: sums over the channels; each program adds its channels' sums into them (float32
    # atomics in L2), or, under torch.use_deterministic_algorithms, stores them as partial sums
    # [2, nmb, B, L, S] that one torch sum adds in a fixed order
    # (the same for the dynamics' gradients ga, gp: [2, M, S] added into, or [2, B, M, S]
    # partial sums; one zeroed buffer holds them and gk, gq)
    atomic = tuning.TUNING["bwd_atomic_sums"] and not torch.are_deterministic_algorithms_enabled()
    if atomic:
        sums = torch.zeros((2 * B * L * S + 2 * M * S,), dtype=like.dtype, device=like.device)
        gkq = sums[: 2 * B * L * S].view(2, B, L, S)
        gap = sums[2 * B * L * S :].view(2, M, S)
    else:
        gkq = empty((2, nmb, B, L, S), like)
        gap = empty((2, B, M, S), like)  # partial sums of ga, gp by batch row
    has_gprec = gprec is not None
    gprec = gprec.contiguous() if has_gprec else gy
    g0 = empty((2, B, M, S), like)
    launch(_kla_bwd_kernel, P["grid"],
        v, Lv, k, q, a, p, ck, gy, gy if gyv is None else gyv, glT, geT, gprec,
        gv, gLv, gkq[0], gkq[1], gap[0], gap[1], g0,
        L, M, NB, B, S, HAS_GPREC=has_gprec, HAS_GYV=has_gyv, ATOMIC=atomic,
        **P["consts"])  # fmt: skip
    if not atomic:
        gkq = gkq.sum(1)  # (indexing, not unpacking: unbind is slower on the host)
        gap = gap.sum(1)
    return gv, gLv, gkq[0], gkq[1], gap[0], gap[1], g0[0], g0[1]
