"""The KLA forward kernel and its launch: ``y, yvar``, the final state, optionally the
precisions and the backward's checkpoints (notation: ``kalmanscan/cuda/kla``'s docstring).

A program (one warp) owns ``NT / G`` channels of one batch row. Time runs in blocks of ``W``
steps (8, or 4 when the forward saves checkpoints), unrolled, whose inputs are loaded by the
software pipeline (``tl.range(num_stages=NS)``) as ``[4, channels]`` tiles of ``v, Lv`` and
``[4, slots]`` tiles of ``k, q`` from loop-carried pointers, without step masks (every step of
a block is inside ``L``). In float32 with 4 or 8 threads a channel a block's ``y, yvar`` are
stored by a reduce-scatter over the channel's threads, issued at the top of the next block so
that its shuffles overlap that block's arithmetic; otherwise step by step. The last
``L mod W`` steps run one at a time, masked.
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
    _load_tile,
    _program,
    _rcp,
    _scatter_ptrs,
    _scatter_store4,
    _slot_rows,
    _step_from,
    _vl_rows,
)


@helper
def _vl(v_ptr, Lv_ptr, t, L, M, base_m, m, mmask, dt: tl.constexpr):
    """Step ``t``'s per-channel inputs ``v, Lv [NT]`` (zeros past ``L``)."""
    ok = (m * 0 + t) < L
    v = tl.load(v_ptr + base_m + t * M + m, mask=mmask & ok, other=0.0).to(dt)
    Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=mmask & ok, other=0.0).to(dt)
    return v, Lv


@helper
def _kq(k_ptr, q_ptr, t, L, S: tl.constexpr, base_s, m, s, smask, dt: tl.constexpr):
    """Step ``t``'s per-slot inputs ``k, q [SG, NT]`` (zeros past ``L``)."""
    ok = (m * 0 + t) < L
    kk = tl.load(k_ptr + base_s + t * S + s, mask=smask & ok[None, :], other=0.0).to(dt)
    qq = tl.load(q_ptr + base_s + t * S + s, mask=smask & ok[None, :], other=0.0).to(dt)
    return kk, qq


@helper
def _inputs(v_ptr, Lv_ptr, k_ptr, q_ptr, t, L, M, S: tl.constexpr, base_m, base_s, m, s, mmask,
            smask, dt: tl.constexpr):  # fmt: skip
    """Step ``t``'s inputs ``v, Lv [NT]`` and ``k, q [SG, NT]`` (zeros past ``L``)."""
    v, Lv = _vl(v_ptr, Lv_ptr, t, L, M, base_m, m, mmask, dt)
    kk, qq = _kq(k_ptr, q_ptr, t, L, S, base_s, m, s, smask, dt)
    return v, Lv, kk, qq


@helper
def _fwd_sums(lam, eta, v, Lv, kk, qq, p, d, af, e, t, prec_ptr, M, S: tl.constexpr, base_m, ms,
              lane_mask, SAVE_PREC: tl.constexpr):  # fmt: skip
    """One forward step from loaded inputs: the new state (and ``lam`` stored with
    ``SAVE_PREC``) and the thread's own sums over its slots (``[NT]``) of ``y`` and ``yvar``."""
    lam, eta = _step_from(lam, eta, p, d, af, e, v, Lv, kk)
    w = qq * _rcp(lam)
    if SAVE_PREC:
        tl.store(prec_ptr + (base_m + t * M) * S + ms, lam, mask=lane_mask)
    return lam, eta, tl.sum(w * eta, axis=0), tl.sum(w * qq, axis=0)


@helper
def _fwd_step(lam, eta, v, Lv, kk, qq, p, d, af, e, t, y_ptr, yvar_ptr, prec_ptr, M,
              S: tl.constexpr, base_m, mo, momask, ms, lane_mask, SAVE_PREC: tl.constexpr,
              G: tl.constexpr, NT: tl.constexpr, VAR: tl.constexpr):  # fmt: skip
    """``_fwd_sums`` whose sums are added over each channel's ``G`` threads and written as the
    step's ``y`` and (with ``VAR``) ``yvar``."""
    lam, eta, ys, yvs = _fwd_sums(lam, eta, v, Lv, kk, qq, p, d, af, e, t, prec_ptr, M, S, base_m,
                                  ms, lane_mask, SAVE_PREC)  # fmt: skip
    tl.store(y_ptr + base_m + t * M + mo, _group_sum(ys, G, NT), mask=momask)
    if VAR:
        tl.store(yvar_ptr + base_m + t * M + mo, _group_sum(yvs, G, NT), mask=momask)
    return lam, eta


@helper
def _fwd_sums4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d,
               af, e, t, prec_ptr, M, S: tl.constexpr, base_m, ms, lane_mask,
               SAVE_PREC: tl.constexpr):  # fmt: skip
    """The 4 steps from ``t`` (``_fwd_sums`` of each, unrolled): the state after them and each
    step's thread sums of ``y``, then of ``yvar``."""
    lam, eta, y0, w0 = _fwd_sums(lam, eta, v0, L0, k0, q0, p, d, af, e, t, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC)  # fmt: skip
    lam, eta, y1, w1 = _fwd_sums(lam, eta, v1, L1, k1, q1, p, d, af, e, t + 1, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC)  # fmt: skip
    lam, eta, y2, w2 = _fwd_sums(lam, eta, v2, L2, k2, q2, p, d, af, e, t + 2, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC)  # fmt: skip
    lam, eta, y3, w3 = _fwd_sums(lam, eta, v3, L3, k3, q3, p, d, af, e, t + 3, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC)  # fmt: skip
    return lam, eta, y0, y1, y2, y3, w0, w1, w2, w3


@helper
def _block_tiles(pv, pL, pk, pq, cmask, smask4, dt: tl.constexpr, S: tl.constexpr,
                 SG: tl.constexpr, G: tl.constexpr, NT: tl.constexpr,
                 EVEN_M: tl.constexpr):  # fmt: skip
    """The inputs of 4 steps from the tile pointers of a block: ``v, Lv`` as ``[4, NT / G]``
    tiles (masked by channel unless ``EVEN_M``) and ``k, q`` as ``[4, G SG]`` tiles (masked by
    slot unless every slot is real), given to the threads as ``_inputs`` gives them a step."""
    v0, L0, v1, L1, v2, L2, v3, L3 = _vl_rows(pv, pL, cmask, dt, G, NT, not EVEN_M)
    k0, k1, k2, k3 = _slot_rows(_load_tile(pk, smask4, S != G * SG).to(dt), SG, G, NT)
    q0, q1, q2, q3 = _slot_rows(_load_tile(pq, smask4, S != G * SG).to(dt), SG, G, NT)
    return v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3


@helper
def _block4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d,
            af, e, t, y_ptr, yvar_ptr, prec_ptr, M, S: tl.constexpr, base_m, mo, momask, ms,
            lane_mask, zero, SAVE_PREC: tl.constexpr, SCATTER: tl.constexpr,
            G: tl.constexpr, NT: tl.constexpr, VAR: tl.constexpr):  # fmt: skip
    """The 4 steps from ``t`` of a block: with ``SCATTER`` the state after them and their
    thread sums of ``y``, then ``yvar`` (``_fwd_sums4``; the caller stores them a block later),
    else the state after them, their outputs stored step by step (``_fwd_step``), and ``zero``
    for the sums."""
    if SCATTER:
        return _fwd_sums4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3,
                          p, d, af, e, t, prec_ptr, M, S, base_m, ms, lane_mask,
                          SAVE_PREC)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v0, L0, k0, q0, p, d, af, e, t, y_ptr, yvar_ptr, prec_ptr, M,
                         S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT, VAR)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v1, L1, k1, q1, p, d, af, e, t + 1, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         VAR)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v2, L2, k2, q2, p, d, af, e, t + 2, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         VAR)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v3, L3, k3, q3, p, d, af, e, t + 3, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         VAR)  # fmt: skip
    return lam, eta, zero, zero, zero, zero, zero, zero, zero, zero


@helper
def _checkpoint(ck_ptr, lam, eta, t, b, NB, M, S: tl.constexpr, ms, lane_mask, ck_eta,
                CK: tl.constexpr):  # fmt: skip
    """Save the state before step ``t`` when ``t`` starts a checkpoint interval."""
    if t % CK == 0:
        ck = (b.to(tl.int64) * NB + t // CK) * M * S + ms
        tl.store(ck_ptr + ck, lam, mask=lane_mask)
        tl.store(ck_ptr + ck + ck_eta, eta, mask=lane_mask)


@triton.jit
def _kla_fwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, yvar_ptr, lamT_ptr, etaT_ptr, prec_ptr, ck_ptr,
    L, M, NB, S: tl.constexpr,
    SAVE_PREC: tl.constexpr, SAVE_CK: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr, EVEN_M: tl.constexpr,
    W: tl.constexpr, VAR: tl.constexpr,
):  # fmt: skip
    tl.static_assert(NT == 32, "one warp a program (the reduce-scatters stay in a warp)")
    tl.static_assert(CK % 4 == 0, "checkpoints must fall on block starts")
    tl.static_assert(W == 4 or (W == 8 and not SAVE_CK), "8-step blocks save no checkpoints")
    pm = tl.program_id(0)
    b = tl.program_id(1)
    m, s, mo, mmask, smask, momask, jt, lane_mask, ms, state_off = _program(pm, b, M, S, G, SG, NT)
    dt = y_ptr.dtype.element_ty
    p, d, af, e = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt)
    lam = tl.load(lam0_ptr + state_off, mask=lane_mask, other=1.0).to(dt)
    eta = tl.load(eta0_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    ck_eta = NB * M * S * tl.num_programs(1)
    # the blocks store their outputs by a reduce-scatter (float32, 4 or 8 threads a channel;
    # shuffles move 32-bit words)
    SCATTER: tl.constexpr = dt == tl.float32 and (G == 4 or G == 8)
    jg = jt % G  # a thread's place among the threads of its channel
    # the blocks of W steps with loop-carried pointers: a block adds W rows to the pointers of
    # its tiles and of its outputs instead of computing their offsets from the step, and its
    # loads and stores carry no step masks, nor channel masks where the programs cover M.
    # Their first step t_lo is read at run time (0: the grid has no third axis), as in the
    # kernel of 2026-11-30 (a2c61d5), whose third grid axis was a time chunk: from a constant 0
    # the compiler schedules the same loop body otherwise, and on the H200 (Triton 3.6) that ran
    # 16-20 % slower (B=8 M=2048 no-gradient forward 0.447 against 0.542 ms; B=4 M=960 forward
    # saving checkpoints 0.171 against 0.194; benchmarks/HISTORY.md)
    t_lo = tl.program_id(2) * L
    t_hi = tl.minimum(t_lo + L, L)
    t_tail = t_lo + (t_hi - t_lo) // W * W
    t4 = tl.arange(0, 4)
    mc = pm * (NT // G) + tl.arange(0, NT // G)
    sc = tl.arange(0, G * SG)
    rows = (t_lo + t4).to(tl.int64)[:, None]
    pv = v_ptr + base_m + rows * M + mc[None, :]
    pL = Lv_ptr + base_m + rows * M + mc[None, :]
    pk = k_ptr + base_s + rows * S + sc[None, :]
    pq = q_ptr + base_s + rows * S + sc[None, :]
    cmask = (t4[:, None] >= 0) & (mc[None, :] < M)
    smask4 = (t4[:, None] >= 0) & (sc[None, :] < S)
    # with SCATTER, the sums of a block's (last) 4 steps are stored by the next block (at its
    # top, from pointers 4 steps behind); the last block's after the loop
    pa, pb, _ = _scatter_ptrs(y_ptr, yvar_ptr, t_lo - 4, base_m, M, m, jg, G)
    zero = tl.zeros([NT], dt)
    ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = zero, zero, zero, zero, zero, zero, zero, zero
    for tb in tl.range(t_lo, t_tail, W, num_stages=NS):  # fmt: skip
        if SAVE_CK:  # (W == 4)
            _checkpoint(ck_ptr, lam, eta, tb, b, NB, M, S, ms, lane_mask, ck_eta, CK)
        v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3 = _block_tiles(
            pv, pL, pk, pq, cmask, smask4, dt, S, SG, G, NT, EVEN_M)  # fmt: skip
        if W == 8:
            u0, U0, h0, r0, u1, U1, h1, r1, u2, U2, h2, r2, u3, U3, h3, r3 = _block_tiles(
                pv + 4 * M, pL + 4 * M, pk + 4 * S, pq + 4 * S, cmask, smask4, dt, S, SG, G,
                NT, EVEN_M)  # fmt: skip
        if SCATTER:
            _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb,
                            mmask & ((m * 0 + tb) > t_lo), G, VAR)  # fmt: skip
            pa += 4 * M
            pb += 4 * M
        lam, eta, ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = _block4(
            lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d, af,
            e, tb, y_ptr, yvar_ptr, prec_ptr, M, S, base_m, mo, momask, ms, lane_mask, zero,
            SAVE_PREC, SCATTER, G, NT, VAR)  # fmt: skip
        if W == 8:
            lam, eta, zs0, zs1, zs2, zs3, ws0, ws1, ws2, ws3 = _block4(
                lam, eta, u0, U0, h0, r0, u1, U1, h1, r1, u2, U2, h2, r2, u3, U3, h3, r3, p,
                d, af, e, tb + 4, y_ptr, yvar_ptr, prec_ptr, M, S, base_m, mo, momask, ms,
                lane_mask, zero, SAVE_PREC, SCATTER, G, NT, VAR)  # fmt: skip
            if SCATTER:
                _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb, mmask, G,
                                VAR)  # fmt: skip
                pa += 4 * M
                pb += 4 * M
            ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = zs0, zs1, zs2, zs3, ws0, ws1, ws2, ws3
        pv += W * M
        pL += W * M
        pk += W * S
        pq += W * S
    if SCATTER:
        _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb,
                        mmask & ((m * 0 + t_tail) > t_lo), G, VAR)  # fmt: skip
    # the last L mod W steps one at a time, masked; the software pipeline issues the loads of
    # later steps ahead of use (NS stages)
    for t in tl.range(t_tail, t_hi, num_stages=NS):
        if SAVE_CK:
            _checkpoint(ck_ptr, lam, eta, t, b, NB, M, S, ms, lane_mask, ck_eta, CK)
        v, Lv, kk, qq = _inputs(v_ptr, Lv_ptr, k_ptr, q_ptr, t, L, M, S, base_m, base_s, m, s,
                                mmask, smask, dt)  # fmt: skip
        lam, eta = _fwd_step(lam, eta, v, Lv, kk, qq, p, d, af, e, t, y_ptr, yvar_ptr, prec_ptr,
                             M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         VAR)  # fmt: skip
    tl.store(lamT_ptr + state_off, lam, mask=lane_mask)
    tl.store(etaT_ptr + state_off, eta, mask=lane_mask)


def _fwd_plan(B, L, M, S, save_ck, f32=True, half=False):
    """The forward's launch configuration for a shape (kept by :func:`tuning.plan`); ``f32``:
    the kernel computes in float32 (else float64); ``half``: half-precision inputs."""
    TU = tuning.tuning_for(B * M * S, half)
    G, SG, NT, warps = tuning.layout(S, TU["fwd_slots"])
    CK = TU["ck"]  # checkpoint interval (steps) of the backward's recomputation
    consts = dict(CK=CK, NS=TU["NS"], G=G, SG=SG, NT=NT, EVEN_M=M % (NT // G) == 0,
                  W=tuning.block_steps(save_ck), num_warps=warps)  # fmt: skip
    if TU["fwd_maxnreg"] and not save_ck and f32 and G * SG <= 32:
        consts["maxnreg"] = TU["fwd_maxnreg"]  # a compile option, like num_warps
    return dict(CK=CK, NB=cdiv(L, CK), grid=(cdiv(M, NT // G), B), consts=consts)


_DEFAULT_STATES: dict = {}  # (shape, dtype, device) -> (ones, zeros), read-only


def default_state(shape, dtype, device):
    """The default initial state ``(lam0, eta0) = (1, 0)`` as tensors, kept by shape, dtype and
    device so that a call does not fill two new tensors (host time: two torch operations). The
    kernels only read them. Made once a key, then the stream is synchronized so that a call on
    another stream never reads them before they are filled; while a CUDA graph is being
    captured they are made afresh (a capture may neither synchronize nor keep them)."""
    key = (shape, dtype, device)
    hit = _DEFAULT_STATES.get(key)
    if hit is not None:
        return hit
    made = (torch.ones(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))  # fmt: skip
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return made
    if len(_DEFAULT_STATES) >= 8:  # (rare: 8 shapes) no kernel may still be reading them
        if any(d.type == "cuda" for (_, _, d) in _DEFAULT_STATES):
            torch.cuda.synchronize()
        _DEFAULT_STATES.clear()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    _DEFAULT_STATES[key] = made
    return made


def forward(v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck, var=True):
    """The forward kernel: ``(y, yvar, lamT, etaT, prec or None, ck or None, CK)``. ``lam0,
    eta0`` None: the default initial state (1, 0), from :func:`default_state`. ``var`` False:
    ``yvar`` is None, neither allocated nor written."""
    B, L, M = v.shape
    S = k.shape[-1]
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    half = v.dtype in (torch.float16, torch.bfloat16)
    P = tuning.plan(_fwd_plan, B, L, M, S, save_ck, dtype == torch.float32, half)
    dev = v.device
    y = empty((B, L, M), dtype=dtype, device=dev)
    yvar = empty((B, L, M), dtype=dtype, device=dev) if var else None
    lamT = empty((B, M, S), dtype=dtype, device=dev)
    etaT = empty((B, M, S), dtype=dtype, device=dev)
    prec = empty((B, L, M, S), dtype=dtype, device=dev) if save_prec else y
    ck = empty((2, B, P["NB"], M, S), dtype=dtype, device=dev) if save_ck else y
    if lam0 is None:
        lam0, eta0 = default_state((B, M, S), dtype, dev)
    launch(_kla_fwd_kernel, P["grid"],
        v, Lv, k, q, a, p, lam0, eta0, y, y if yvar is None else yvar, lamT, etaT, prec, ck,
        L, M, P["NB"], S, SAVE_PREC=save_prec, SAVE_CK=save_ck, VAR=var,
        **P["consts"])  # fmt: skip
    return y, yvar, lamT, etaT, (prec if save_prec else None), (ck if save_ck else None), P["CK"]
