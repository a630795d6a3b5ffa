"""Fused Triton kernels of the KLA op (SPEC §3): the ``"triton"`` backend of ``kla_filter``.

Shapes (batch B, time L, channels M, slots S; a lane is ``(b, m, s)``): ``v, Lv [B, L, M]``,
``k, q [B, L, S]``, ``decay, process_var [M, S]``, ``lam0, eta0 [B, M, S]``; outputs
``y, yvar [B, L, M]``, the final ``lam, eta [B, M, S]`` and optionally the precisions
``[B, L, M, S]``. Per step ``phi = Lv[m] k[s]^2``, ``r = v[m] Lv[m] k[s]``, ``c = 0``.

Layout. A program (``NT`` threads) owns ``BM = NT / G`` channels of one batch row; each thread
walks ``SG`` slots of one channel through time (``G = S / SG`` threads per channel), the state
in registers as a ``[SG, NT]`` tile whose first axis lives inside the thread (the default
layout spreads the last axis over the warp's threads). So the ``SG``
slots are independent chains a thread interleaves, the sum over slots of the readout is a
register sum plus a ``log2 G``-step shuffle, and the per-channel loads (``v, Lv``) are one
coalesced load per step. The loads of a step do not depend on the state, so they are issued
ahead of use: the forward walks 4-step blocks, unrolled, whose inputs are either loaded by
Triton's software pipeliner (``tl.range(num_stages=NS)``) some blocks ahead, as asynchronous
copies, or loaded into registers a block ahead (``TUNING["fwd_staging"]``). A block loads
``v, Lv`` as ``[4, channels]`` and ``k, q`` as ``[4, slots]`` tiles, one copy of each value,
which reach the threads that use them through shared memory, and stores its ``y, yvar`` by a
reduce-scatter over each channel's threads (each thread then stores one step's sums). The
remaining steps, and the backward, use the software pipeliner step by step. The slots a
thread walks in the backward and whether it reuses its recomputation's inputs are chosen by
the lane count (``_tuning``). No
``[B, L, M, S]`` tensor is written unless the precisions are asked for.

Lean forms (``TUNING["fwd_lean"]``, ``TUNING["bwd_lean"]``; on by default): the predict step
as ``lam / (p lam + d) + e`` (``_dynamics``' ``E_FORM``: one addition fewer a lane-step,
and in the backward one select), the forward's pipelined blocks of 8 steps (4 when it saves
checkpoints) with loop-carried pointers, no step masks, and each block's reduce-scatter
issued at the top of the next block; the backward's main loop without step masks.

Backward (exact): the forward saves the state every ``CK`` steps (8, or 4 by ``TUNING["ck"]``;
``[2, B, L/CK, M, S]``, only when a gradient is needed); the backward walks the intervals in
reverse, recomputes an interval's states from its checkpoint into registers (unrolled:
``_recompute4``), then runs
the two scalar adjoint recurrences ``Ec <- alpha Et``,
``Lc <- alpha^2 Lt - alpha p rden Et eta_prev`` over them. Sums over ``s`` (``gv, gLv``)
happen in the thread and its channel group; sums over ``m`` (``gk, gq``) are reduced in the
program and written per program, then added in torch; sums over ``b`` and ``t``
(``gdecay, gprocess_var``) stay in registers per batch row.

Time chunking (``TUNING["fwd_chunk_len"]``, ``TUNING["bwd_chunk_len"]``; off by default): for
more parallelism than the lanes give, both directions can cut time into chunks: pass 1 composes
each chunk's map per lane (forward: the projective 3x3 map of homogeneous ``(u, w, e)``, 7
numbers; backward: the affine adjoint map, 5 numbers), pass 2 carries the chunk boundary states
in order (a sequential walk over the chunks per lane), pass 3 runs every chunk from its true
boundary state with the kernels above. Exact up to rounding, like the one-pass kernels.
"""

from __future__ import annotations

import numpy as np
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
    next_pow2,
)
from kalmanscan.cuda.filter import _fwd_carry_kernel

__all__ = ["kla_triton"]


if interpreting():

    def _rcp(x):
        """``1 / x`` (the interpreter runs numpy division)."""
        return 1.0 / x

else:

    @triton.jit
    def _rcp(x):
        """``1 / x``: in float32 one hardware reciprocal (``rcp.approx.ftz``, relative error
        below 2^-22), where Triton's ``1.0 / x`` adds range checks and rescaling around it (8
        instructions in all); float64 divides."""
        if x.dtype == tl.float32:
            r = tl.inline_asm_elementwise(
                "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            r = 1.0 / x
        return r


if interpreting():

    def _prefetch_l2(ptrs):
        """A hint only: the interpreter has no cache to fill."""
        return None

else:

    @triton.jit
    def _prefetch_l2(ptrs):
        """Ask for the lines at ``ptrs`` (int64 addresses) to be brought into L2
        (``prefetch.global.L2``, one instruction a warp, no register waits on it): the later
        loads of those rows then find them in L2 instead of device memory."""
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


if interpreting():

    def _shfl_xor(x, lanes):
        """``x [NT]`` of the thread whose lane is this lane XOR ``lanes`` (element ``j`` of an
        ``[NT]`` tensor lives in lane ``j % 32`` of warp ``j // 32``, and ``lanes < 32`` keeps
        the partner in the warp), here by indexing the interpreter's array."""
        from triton.runtime.interpreter import TensorHandle

        lanes = int(getattr(lanes, "value", lanes))
        data = x.handle.data
        moved = data[np.arange(data.shape[-1]) ^ lanes]
        return tl.core.tensor(TensorHandle(moved, x.handle.dtype.scalar), x.type)

else:

    @triton.jit
    def _shfl_xor(x, lanes):
        """``x`` of the thread whose lane is this lane XOR ``lanes`` (``shfl.sync.bfly``; every
        lane of the warp takes part)."""
        return tl.inline_asm_elementwise(
            "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, -1;", "=r,r,r", [x, lanes],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip


@helper
def _prefetch_rows(ptr_a, ptr_b, ptr_c, ptr_d, base_m, t, L, M, m, j, NPTR: tl.constexpr):
    """Prefetch row ``t`` (clamped into ``[0, L)``) of up to four ``[B, L, M]`` arrays at the
    threads' channels: thread ``j`` takes array ``j % NPTR``. A row's segment of a program's
    channels is whole sectors, and every sector holds channels of each residue, so the
    segments of all ``NPTR`` arrays are covered by one instruction."""
    tc = tl.minimum(tl.maximum(t, 0), L - 1)
    off = base_m + tc * M + tl.minimum(m, M - 1)
    sel = j % NPTR
    # as addresses: the arrays may differ in type (half inputs, float32 gradients)
    ptrs = tl.where(sel == 0, (ptr_a + off).to(tl.int64), (ptr_b + off).to(tl.int64))
    if NPTR > 2:
        ptrs = tl.where(sel == 2, (ptr_c + off).to(tl.int64), ptrs)
        ptrs = tl.where(sel == 3, (ptr_d + off).to(tl.int64), ptrs)
    _prefetch_l2(ptrs)


@helper
def _group_sum(x, G: tl.constexpr, NT: tl.constexpr):
    """``[NT] -> [NT // G]``: the sum over the ``G`` neighbouring threads of each channel."""
    return tl.sum(tl.reshape(x, [NT // G, G]), axis=1)


@helper
def _channel_sum(x, G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr):
    """``[SG, NT] -> [SG, G]``: the sum over the program's channels of each slot."""
    return tl.sum(tl.reshape(x, [SG, NT // G, G]), axis=1)


@helper
def _row(x, i: tl.constexpr, SG: tl.constexpr):
    """Row ``i`` of a ``[SG, NT]`` tile (a register of each thread: the select folds away, and
    adding -0.0 is exact, so no instruction remains)."""
    return tl.sum(tl.where(tl.arange(0, SG)[:, None] == i, x, -0.0), axis=0)


@helper
def _swap_add(keep_lo, keep_hi, hi, lanes):
    """One butterfly round of a reduce-scatter: a thread keeps one of two partial sums (the
    ``hi`` one where its lane bit is set), sends the other to its partner and adds what it
    gets."""
    keep = tl.where(hi, keep_hi, keep_lo)
    send = tl.where(hi, keep_lo, keep_hi)
    return keep + _shfl_xor(send, lanes)


@helper
def _reduce_scatter8(a0, a1, a2, a3, b0, b1, b2, b3, c, unit: tl.constexpr):
    """A reduce-scatter of 8 values a thread (``a0..a3``, then ``b0..b3``) over the 8 threads
    ``c = 0..7`` spaced ``unit`` lanes apart: 3 butterfly rounds (7 shuffles) each exchange half
    the values left and leave thread ``c`` with value ``c``'s sum."""
    hi = ((c >> 2) & 1) == 1
    y0 = _swap_add(a0, b0, hi, 4 * unit)
    y1 = _swap_add(a1, b1, hi, 4 * unit)
    y2 = _swap_add(a2, b2, hi, 4 * unit)
    y3 = _swap_add(a3, b3, hi, 4 * unit)
    hi = ((c >> 1) & 1) == 1
    z0 = _swap_add(y0, y2, hi, 2 * unit)
    z1 = _swap_add(y1, y3, hi, 2 * unit)
    return _swap_add(z0, z1, (c & 1) == 1, unit)


@helper
def _store_channel_sums(xk, xq, gk_ptr, gq_ptr, off, t, L, S: tl.constexpr, G: tl.constexpr,
                        SG: tl.constexpr, NT: tl.constexpr,
                        MASKED: tl.constexpr = True):  # fmt: skip
    """Store the sums over the program's channels of ``xk, xq [SG, NT]`` at ``gk_ptr + off + s``
    and ``gq_ptr + off + s`` for the slots ``s < S`` (with ``MASKED``: where step ``t`` is
    inside ``L``), each summed by ``tl.sum`` (an all-reduce: ``log2(NT / G)`` shuffles a
    value)."""
    so = tl.arange(0, G)[None, :] * SG + tl.arange(0, SG)[:, None]
    ok = so < S
    if MASKED:
        ok = ok & ((so * 0 + t) < L)
    tl.store(gk_ptr + off + so, _channel_sum(xk, G, SG, NT), mask=ok)
    tl.store(gq_ptr + off + so, _channel_sum(xq, G, SG, NT), mask=ok)


@helper
def _scatter_channel_sums(xk, xq, gk_ptr, gq_ptr, off, jt, t, L, S: tl.constexpr,
                          G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr,
                          MASKED: tl.constexpr = True):  # fmt: skip
    """``_store_channel_sums`` by a reduce-scatter where the ``2 SG`` values of a thread
    match the ``32 / G`` threads of its slot group in a warp (float32, ``S`` of 9 to 16, 2 or
    4 slots a thread): ``log2(2 SG)`` butterfly rounds each exchange half the values left
    (``2 SG - 1`` shuffles a thread instead of ``2 SG log2(32 / G)``) and leave thread ``c``
    of the group with value ``c``'s sum over the warp's channels. With several warps a
    program, the warps' sums are then added through shared memory (one ``tl.sum`` over the
    warps), so a program writes one partial for all its channels."""
    # (shuffles stay in a warp: the slot groups must fit in one, as at S of 17 to 32 with 2
    # warps a program they would not)
    if xk.dtype != tl.float32 or NT % 32 != 0 or 2 * SG != 32 // G or (SG != 2 and SG != 4):
        _store_channel_sums(xk, xq, gk_ptr, gq_ptr, off, t, L, S, G, SG, NT, MASKED)
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
        if NT > 32:  # the sum over the warps, held by the lanes of one warp's layout
            w = tl.sum(tl.reshape(w, [NT // 32, 32]), axis=0)
            j32 = tl.arange(0, 32)
            c = j32 // G
            slot = (j32 % G) * SG + c % SG
        else:
            slot = (jt % G) * SG + c % SG
        ptr = tl.where(c < SG, gk_ptr, gq_ptr) + off + slot
        ok = slot < S
        if MASKED:
            ok = ok & ((slot * 0 + t) < L)
        tl.store(ptr, w, mask=ok)


@helper
def _lanes(pm, M, S: tl.constexpr, G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr):
    """Per-thread channel ``m [NT]``, slots ``s [SG, NT]``, the program's channels ``mo [BM]``
    and the slots of a ``[SG, G]`` per-program sum, with their masks. (Slots are the first
    axis: Triton's default layout spreads the last axis over the threads of a warp, so a
    thread's ``SG`` slots are its registers and its ``k, q`` loads are vector loads.)"""
    j = tl.arange(0, NT)
    m = pm * (NT // G) + j // G
    s = (j % G)[None, :] * SG + tl.arange(0, SG)[:, None]
    # the program's channels, derived from m so that they share the layout of _group_sum's result
    mo = tl.max(tl.reshape(m, [NT // G, G]), axis=1)
    so = tl.arange(0, G)[None, :] * SG + tl.arange(0, SG)[:, None]
    if S == G * SG:  # every slot is real: a constant mask keeps the slot loads vectorized
        true_s = tl.full([SG, NT], 1, tl.int1)
        return m, s, mo, so, m < M, true_s, mo < M, tl.full([SG, G], 1, tl.int1)
    return m, s, mo, so, m < M, s < S, mo < M, so < S


@helper
def _dynamics(a_ptr, p_ptr, ms, mask, dt: tl.constexpr, E_FORM: tl.constexpr = False):
    """Per-lane constants of the predict step: ``(p, d, af, f1)`` with
    ``lam_pred = (lam + f1) / (p lam + d)`` and ``alpha = af / (p lam + d)`` (``f1 = 1``,
    ``af = 0``, ``d = p`` where ``decay = 0``: total forgetting). ``E_FORM``: ``(p, d, af, e)``
    with ``lam_pred = lam / (p lam + d) + e`` instead, which saves the addition a lane-step:
    ``e = 0`` but where the decay is 0, and there ``d = inf`` (so ``1 / (p lam + d) = 0``,
    ``alpha = 0``) and ``e = 1 / p``. Where the decay is not 0 the two forms are the same
    expression but for the order in which the compiler may fuse multiply-adds."""
    a = tl.load(a_ptr + ms, mask=mask, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=mask, other=1.0).to(dt)
    forget = a * a == 0.0
    af = tl.where(forget, 0.0, a)
    if E_FORM:
        d = tl.where(forget, float("inf"), a * a)
        f1 = tl.where(forget, _rcp(p), 0.0)
    else:
        d = tl.where(forget, p, a * a)
        f1 = tl.where(forget, 1.0, 0.0)
    return p, d, af, f1


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
def _tile_rows(x4, G: tl.constexpr, NT: tl.constexpr):
    """``[4, NT / G] -> 4 x [NT]``: the rows of a tile of 4 steps of the program's channels,
    each channel's value given to its ``G`` threads."""
    xb = tl.reshape(tl.broadcast_to(x4[:, :, None], [4, NT // G, G]), [4, NT])
    return _row(xb, 0, 4), _row(xb, 1, 4), _row(xb, 2, 4), _row(xb, 3, 4)


@helper
def _load_tile(ptrs, ok, MASK: tl.constexpr):
    """One tile at ``ptrs``: zeros where ``ok`` is false with ``MASK``, unmasked without."""
    if MASK:
        return tl.load(ptrs, mask=ok, other=0.0)
    return tl.load(ptrs)


@helper
def _vl_rows(pv, pL, ok, dt: tl.constexpr, G: tl.constexpr, NT: tl.constexpr,
             MASK: tl.constexpr):  # fmt: skip
    """``v, Lv`` of 4 steps from their ``[4, NT / G]`` tile pointers (one element a thread,
    not ``G`` copies of each; ``_load_tile``), then broadcast to a channel's threads."""
    v0, v1, v2, v3 = _tile_rows(_load_tile(pv, ok, MASK).to(dt), G, NT)
    L0, L1, L2, L3 = _tile_rows(_load_tile(pL, ok, MASK).to(dt), G, NT)
    return v0, L0, v1, L1, v2, L2, v3, L3


@helper
def _vl4(v_ptr, Lv_ptr, t, L, M, base_m, pm, dt: tl.constexpr, G: tl.constexpr,
         NT: tl.constexpr, MASKED: tl.constexpr = True):  # fmt: skip
    """``v, Lv`` of the 4 steps from ``t`` at the program's channels, each loaded as one
    ``[4, NT / G]`` tile (``_vl_rows``)."""
    tt = t + tl.arange(0, 4)
    mc = pm * (NT // G) + tl.arange(0, NT // G)
    off = base_m + tt[:, None] * M + mc[None, :]
    ok = (tl.arange(0, 4)[:, None] >= 0) & (mc[None, :] < M)
    if MASKED:  # (else every step is inside L)
        ok = ok & (tt[:, None] < L)
    return _vl_rows(v_ptr + off, Lv_ptr + off, ok, dt, G, NT, True)


@helper
def _slot_rows(x4, SG: tl.constexpr, G: tl.constexpr, NT: tl.constexpr):
    """``[4, G SG] -> 4 x [SG, NT]``: the rows of a tile of 4 steps of the slots, each thread
    given its slot group's ``SG`` values."""
    xg = tl.permute(tl.reshape(x4, [4, G, SG]), (0, 2, 1))
    xb = tl.reshape(tl.broadcast_to(xg[:, :, None, :], [4, SG, NT // G, G]), [4, SG, NT])
    i = tl.arange(0, 4)[:, None, None]
    r0 = tl.sum(tl.where(i == 0, xb, -0.0), axis=0)
    r1 = tl.sum(tl.where(i == 1, xb, -0.0), axis=0)
    r2 = tl.sum(tl.where(i == 2, xb, -0.0), axis=0)
    r3 = tl.sum(tl.where(i == 3, xb, -0.0), axis=0)
    return r0, r1, r2, r3


@helper
def _slot_tile(x_ptr, t, L, S: tl.constexpr, base_s, dt: tl.constexpr, SG: tl.constexpr,
               G: tl.constexpr, NT: tl.constexpr, MASKED: tl.constexpr = True):  # fmt: skip
    """A ``[B, L, S]`` input at the 4 steps from ``t``, loaded as one ``[4, G SG]`` tile (zeros
    past ``L``), then given to the threads of each slot group: 4 x ``[SG, NT]``."""
    tt = t + tl.arange(0, 4)
    so = tl.arange(0, G * SG)
    off = base_s + tt[:, None] * S + so[None, :]
    ok = (tl.arange(0, 4)[:, None] >= 0) & (so[None, :] < S)
    if MASKED:  # (else every step is inside L)
        ok = ok & (tt[:, None] < L)
    return _slot_rows(_load_tile(x_ptr + off, ok, True).to(dt), SG, G, NT)


@helper
def _kq4(k_ptr, q_ptr, t, L, S: tl.constexpr, base_s, dt: tl.constexpr, SG: tl.constexpr,
         G: tl.constexpr, NT: tl.constexpr):  # fmt: skip
    """``k, q`` of the 4 steps from ``t``, each loaded as one ``[4, G SG]`` tile."""
    k0, k1, k2, k3 = _slot_tile(k_ptr, t, L, S, base_s, dt, SG, G, NT)
    q0, q1, q2, q3 = _slot_tile(q_ptr, t, L, S, base_s, dt, SG, G, NT)
    return k0, q0, k1, q1, k2, q2, k3, q3


@helper
def _inputs4(v_ptr, Lv_ptr, k_ptr, q_ptr, t, L, M, S: tl.constexpr, base_m, base_s, m, s, mmask,
             smask, dt: tl.constexpr, pm, TILE: tl.constexpr, TILE_KQ: tl.constexpr,
             SG: tl.constexpr, G: tl.constexpr, NT: tl.constexpr):  # fmt: skip
    """The inputs of the 4 steps from ``t``, as ``_inputs`` gives them step by step; the loads
    are issued per-channel rows first, then the slots'."""
    if TILE:
        v0, L0, v1, L1, v2, L2, v3, L3 = _vl4(v_ptr, Lv_ptr, t, L, M, base_m, pm, dt, G, NT)
    else:
        v0, L0 = _vl(v_ptr, Lv_ptr, t, L, M, base_m, m, mmask, dt)
        v1, L1 = _vl(v_ptr, Lv_ptr, t + 1, L, M, base_m, m, mmask, dt)
        v2, L2 = _vl(v_ptr, Lv_ptr, t + 2, L, M, base_m, m, mmask, dt)
        v3, L3 = _vl(v_ptr, Lv_ptr, t + 3, L, M, base_m, m, mmask, dt)
    if TILE_KQ:
        k0, q0, k1, q1, k2, q2, k3, q3 = _kq4(k_ptr, q_ptr, t, L, S, base_s, dt, SG, G, NT)
    else:
        k0, q0 = _kq(k_ptr, q_ptr, t, L, S, base_s, m, s, smask, dt)
        k1, q1 = _kq(k_ptr, q_ptr, t + 1, L, S, base_s, m, s, smask, dt)
        k2, q2 = _kq(k_ptr, q_ptr, t + 2, L, S, base_s, m, s, smask, dt)
        k3, q3 = _kq(k_ptr, q_ptr, t + 3, L, S, base_s, m, s, smask, dt)
    return v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3


@helper
def _step_from(lam, eta, p, d, af, f1, v, Lv, kk, E_FORM: tl.constexpr = False):
    """The state ``(lam, eta)`` after one step with loaded inputs (the forward's and the
    backward's recomputation). ``E_FORM``: ``f1`` is ``_dynamics``' ``e``; ``E_FORM = 2``
    also forms ``phi = (Lv k) k`` and ``r = v (Lv k)`` (no per-channel ``v Lv``)."""
    rden = _rcp(p * lam + d)
    if E_FORM == 2:
        lk = Lv[None, :] * kk
        return lam * rden + (lk * kk + f1), af * rden * eta + v[None, :] * lk
    if E_FORM:
        lam_new = lam * rden + (Lv[None, :] * (kk * kk) + f1)
    else:
        lam_new = (lam + f1) * rden + Lv[None, :] * (kk * kk)
    return lam_new, af * rden * eta + (v * Lv)[None, :] * kk


@helper
def _fwd_sums(lam, eta, v, Lv, kk, qq, p, d, af, f1, t, prec_ptr, M, S: tl.constexpr, base_m, ms,
              lane_mask, SAVE_PREC: tl.constexpr, E_FORM: tl.constexpr = False):  # fmt: skip
    """One forward step from loaded inputs: the new state (and ``lam`` stored with
    ``SAVE_PREC``) and the thread's own sums over its slots (``[NT]``) of ``y`` and ``yvar``."""
    lam, eta = _step_from(lam, eta, p, d, af, f1, v, Lv, kk, E_FORM)
    w = qq * _rcp(lam)
    if SAVE_PREC:
        tl.store(prec_ptr + (base_m + t * M) * S + ms, lam, mask=lane_mask)
    return lam, eta, tl.sum(w * eta, axis=0), tl.sum(w * qq, axis=0)


@helper
def _fwd_step(lam, eta, v, Lv, kk, qq, p, d, af, f1, t, y_ptr, yvar_ptr, prec_ptr, M,
              S: tl.constexpr, base_m, mo, momask, ms, lane_mask, SAVE_PREC: tl.constexpr,
              G: tl.constexpr, NT: tl.constexpr, E_FORM: tl.constexpr = False):  # fmt: skip
    """``_fwd_sums`` whose sums are added over each channel's ``G`` threads and written as the
    step's ``y, yvar``."""
    lam, eta, ys, yvs = _fwd_sums(lam, eta, v, Lv, kk, qq, p, d, af, f1, t, prec_ptr, M, S, base_m,
                                  ms, lane_mask, SAVE_PREC, E_FORM)  # fmt: skip
    tl.store(y_ptr + base_m + t * M + mo, _group_sum(ys, G, NT), mask=momask)
    tl.store(yvar_ptr + base_m + t * M + mo, _group_sum(yvs, G, NT), mask=momask)
    return lam, eta


@helper
def _scatter_store4(y0, y1, y2, y3, v0, v1, v2, v3, c, ptr_a, ptr_b, mask, G: tl.constexpr):
    """Store ``y, yvar`` of 4 steps from each thread's sums over its slots (``[NT]``) by a
    reduce-scatter over the ``G`` (4 or 8) threads of a channel: 2 (3) butterfly rounds each
    exchange half the values left, 6 (7) shuffles a thread where 4 all-reduces take 16 (24) and
    a layout shuffle 8, and leave each thread one step's sums, which it stores. ``c``: the
    thread's place among the threads of its channel. ``G = 4``: thread ``c`` holds step ``c``'s
    ``y`` and ``yvar`` and stores them at ``ptr_a`` and ``ptr_b``; ``G = 8``: it holds ``y`` of
    step ``c`` below 4, ``yvar`` of step ``c - 4`` above, and stores it at ``ptr_a``."""
    if G == 8:  # values 0-3: y of the steps, 4-7: yvar
        w = _reduce_scatter8(y0, y1, y2, y3, v0, v1, v2, v3, c, 1)  # value c's sum
        tl.store(ptr_a, w, mask=mask)
    else:  # G == 4: y of steps (0, 2), (1, 3) and the same of yvar, then (0, 1) of each
        hi = ((c >> 1) & 1) == 1
        a0 = _swap_add(y0, y2, hi, 2)
        a1 = _swap_add(y1, y3, hi, 2)
        b0 = _swap_add(v0, v2, hi, 2)
        b1 = _swap_add(v1, v3, hi, 2)
        lo = (c & 1) == 1
        tl.store(ptr_a, _swap_add(a0, a1, lo, 1), mask=mask)
        tl.store(ptr_b, _swap_add(b0, b1, lo, 1), mask=mask)


@helper
def _scatter_ptrs(y_ptr, yvar_ptr, t, base_m, M, m, c, G: tl.constexpr):
    """The pointers of ``_scatter_store4``'s stores for the 4 steps from ``t`` (``[NT]``) and the
    step each thread stores."""
    if G == 8:
        step = t + c % 4
        ptr_a = tl.where(c < 4, y_ptr, yvar_ptr) + base_m + step * M + m
        ptr_b = ptr_a
    else:
        step = t + c
        ptr_a = y_ptr + base_m + step * M + m
        ptr_b = yvar_ptr + base_m + step * M + m
    return ptr_a, ptr_b, step


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
    _scatter_store4(y0, y1, y2, y3, v0, v1, v2, v3, c, ptr_a, ptr_b, omask, G)


@helper
def _fwd_sums4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d,
                af, e, t, prec_ptr, M, S: tl.constexpr, base_m, ms, lane_mask,
                SAVE_PREC: tl.constexpr, FORM: tl.constexpr):  # fmt: skip
    """The 4 steps from ``t`` (``_fwd_sums`` of each, unrolled, in the step form ``FORM``): the
    state after them and each step's thread sums of ``y``, then of ``yvar``."""
    lam, eta, y0, w0 = _fwd_sums(lam, eta, v0, L0, k0, q0, p, d, af, e, t, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC, FORM)  # fmt: skip
    lam, eta, y1, w1 = _fwd_sums(lam, eta, v1, L1, k1, q1, p, d, af, e, t + 1, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC, FORM)  # fmt: skip
    lam, eta, y2, w2 = _fwd_sums(lam, eta, v2, L2, k2, q2, p, d, af, e, t + 2, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC, FORM)  # fmt: skip
    lam, eta, y3, w3 = _fwd_sums(lam, eta, v3, L3, k3, q3, p, d, af, e, t + 3, prec_ptr, M, S,
                                 base_m, ms, lane_mask, SAVE_PREC, FORM)  # fmt: skip
    return lam, eta, y0, y1, y2, y3, w0, w1, w2, w3


@helper
def _fwd_step4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d, af,
               f1, t, y_ptr, yvar_ptr, prec_ptr, M, S: tl.constexpr, base_m, mo, momask, ms,
               lane_mask, jt, ptr_a, ptr_b, omask, SAVE_PREC: tl.constexpr,
               SCATTER: tl.constexpr, G: tl.constexpr, NT: tl.constexpr,
               E_FORM: tl.constexpr):  # fmt: skip
    """The 4 steps from ``t`` (``_fwd_step`` of each, unrolled; with ``SCATTER`` their outputs
    stored together by ``_scatter_store4`` at ``ptr_a, ptr_b`` under ``omask``)."""
    if SCATTER:
        lam, eta, y0, y1, y2, y3, w0, w1, w2, w3 = _fwd_sums4(
            lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d, af,
            f1, t, prec_ptr, M, S, base_m, ms, lane_mask, SAVE_PREC, E_FORM)  # fmt: skip
        _scatter_store4(y0, y1, y2, y3, w0, w1, w2, w3, jt % G, ptr_a, ptr_b, omask, G)
        return lam, eta
    lam, eta = _fwd_step(lam, eta, v0, L0, k0, q0, p, d, af, f1, t, y_ptr, yvar_ptr, prec_ptr, M,
                         S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         E_FORM)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v1, L1, k1, q1, p, d, af, f1, t + 1, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         E_FORM)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v2, L2, k2, q2, p, d, af, f1, t + 2, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         E_FORM)  # fmt: skip
    lam, eta = _fwd_step(lam, eta, v3, L3, k3, q3, p, d, af, f1, t + 3, y_ptr, yvar_ptr, prec_ptr,
                         M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                         E_FORM)  # fmt: skip
    return lam, eta


@helper
def _lean_tiles(pv, pL, pk, pq, cmask, smask4, dt: tl.constexpr, S: tl.constexpr,
                SG: tl.constexpr, G: tl.constexpr, NT: tl.constexpr,
                EVEN_M: tl.constexpr):  # fmt: skip
    """The inputs of 4 steps from the tile pointers of the forward's lean blocks: ``v, Lv`` as
    ``[4, NT / G]`` tiles (masked by channel unless ``EVEN_M``) and ``k, q`` as ``[4, G SG]``
    tiles (masked by slot unless every slot is real), given to the threads as ``_inputs4``
    gives them."""
    v0, L0, v1, L1, v2, L2, v3, L3 = _vl_rows(pv, pL, cmask, dt, G, NT, not EVEN_M)
    k0, k1, k2, k3 = _slot_rows(_load_tile(pk, smask4, S != G * SG).to(dt), SG, G, NT)
    q0, q1, q2, q3 = _slot_rows(_load_tile(pq, smask4, S != G * SG).to(dt), SG, G, NT)
    return v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3


@helper
def _lean_block4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d,
                 af, f1, t, y_ptr, yvar_ptr, prec_ptr, M, S: tl.constexpr, base_m, mo, momask, ms,
                 lane_mask, jt, zero, SAVE_PREC: tl.constexpr, SCATTER: tl.constexpr,
                 G: tl.constexpr, NT: tl.constexpr, FORM: tl.constexpr):  # fmt: skip
    """The 4 steps from ``t`` of a lean forward block: with ``SCATTER`` the state after them
    and their thread sums of ``y``, then ``yvar`` (``_fwd_sums4``; the caller stores them a
    block later), else the state after them, their outputs stored step by step
    (``_fwd_step4``), and ``zero`` for the sums."""
    if SCATTER:
        return _fwd_sums4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3,
                          p, d, af, f1, t, prec_ptr, M, S, base_m, ms, lane_mask, SAVE_PREC,
                          FORM)  # fmt: skip
    lam, eta = _fwd_step4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3,
                          p, d, af, f1, t, y_ptr, yvar_ptr, prec_ptr, M, S, base_m, mo, momask,
                          ms, lane_mask, jt, y_ptr, y_ptr, momask, SAVE_PREC, False, G, NT,
                          FORM)  # fmt: skip
    return lam, eta, zero, zero, zero, zero, zero, zero, zero, zero


@helper
def _checkpoint_at(ck_ptr, lam, eta, t, b, NB, M, S: tl.constexpr, ms, lane_mask, ck_eta,
                   CK: tl.constexpr):  # fmt: skip
    """Save the state before step ``t``, a multiple of ``CK`` (no test: no branch)."""
    ck = (b.to(tl.int64) * NB + t // CK) * M * S + ms
    tl.store(ck_ptr + ck, lam, mask=lane_mask)
    tl.store(ck_ptr + ck + ck_eta, eta, mask=lane_mask)


@helper
def _checkpoint(ck_ptr, lam, eta, t, b, NB, M, S: tl.constexpr, ms, lane_mask, ck_eta,
                CK: tl.constexpr):  # fmt: skip
    """Save the state before step ``t`` when ``t`` starts a checkpoint interval."""
    if t % CK == 0:
        _checkpoint_at(ck_ptr, lam, eta, t, b, NB, M, S, ms, lane_mask, ck_eta, CK)


@triton.jit
def _kla_fwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, lam0_ptr, eta0_ptr,
    y_ptr, yvar_ptr, lamT_ptr, etaT_ptr, prec_ptr, ck_ptr, start_ptr,
    L, M, NB, CL, S: tl.constexpr,
    SAVE_PREC: tl.constexpr, SAVE_CK: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    PREFETCH: tl.constexpr, CHUNKED: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, AHEAD: tl.constexpr, BLOCK_PIPE: tl.constexpr, OUT_SCATTER: tl.constexpr,
    IN_TILE: tl.constexpr, KQ_TILE: tl.constexpr, LEAN: tl.constexpr, EVEN_M: tl.constexpr,
    W: tl.constexpr, FORM: tl.constexpr,
):  # fmt: skip
    pm = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2)  # time chunk [c CL, (c + 1) CL) (one chunk of all of L unless CHUNKED)
    NC = tl.num_programs(2)
    m, s, mo, so, mmask, smask, momask, somask = _lanes(pm, M, S, G, SG, NT)
    jt = tl.arange(0, NT)
    lane_mask = smask & mmask[None, :]
    ms = m[None, :] * S + s
    dt = y_ptr.dtype.element_ty
    # FORM > 0: lam_pred = lam / (p lam + d) + e (_dynamics' E_FORM; f1 holds e)
    p, d, af, f1 = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt, FORM > 0)
    state_off = b.to(tl.int64) * M * S + ms
    if CHUNKED:  # the chunk's true start state, from the carry pass ([2, NC, B M S])
        n_lanes = M * S * tl.num_programs(1)
        lam = tl.load(start_ptr + c * n_lanes + state_off, mask=lane_mask, other=1.0).to(dt)
        eta = tl.load(start_ptr + (NC + c) * n_lanes + state_off, mask=lane_mask, other=0.0)
        eta = eta.to(dt)
    else:
        lam = tl.load(lam0_ptr + state_off, mask=lane_mask, other=1.0).to(dt)
        eta = tl.load(eta0_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    ck_eta = NB * M * S * tl.num_programs(1)
    t_lo = c * CL
    t_hi = tl.minimum(t_lo + CL, L)
    t_tail = t_lo
    # the 4-step blocks store their outputs by a reduce-scatter (float32, one warp, 4 or 8
    # threads a channel; shuffles move 32-bit words)
    SCATTER: tl.constexpr = OUT_SCATTER and dt == tl.float32 and NT % 32 == 0 and (
        G == 4 or G == 8)  # fmt: skip
    if PREFETCH or BLOCK_PIPE:
        tl.static_assert(CK % 4 == 0, "checkpoints must fall on block starts")
        t_tail = t_lo + (t_hi - t_lo) // 4 * 4
    jg = jt % G  # a thread's place among the threads of its channel
    if BLOCK_PIPE and LEAN and IN_TILE and KQ_TILE:
        # the pipelined blocks of W (4 or 8) steps with loop-carried pointers: a block adds W
        # rows to the pointers of its tiles and of its outputs instead of computing their
        # offsets from the step, and its loads and stores carry no step masks (every step of
        # these blocks is inside L), nor channel masks where the programs cover M (EVEN_M)
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
        # with SCATTER, the sums of a block's (last) 4 steps are stored by the next block (at
        # its top, from pointers 4 steps behind), so that their shuffles overlap that block's
        # arithmetic instead of ending each block with a chain of dependent shuffles; the last
        # block's after the loop
        pa, pb, _ = _scatter_ptrs(y_ptr, yvar_ptr, t_lo - 4, base_m, M, m, jg, G)
        zero = tl.zeros([NT], dt)
        ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = zero, zero, zero, zero, zero, zero, zero, zero
        for tb in tl.range(t_lo, t_tail, W, num_stages=NS):  # fmt: skip
            if SAVE_CK:
                if W == 8:  # tb is a multiple of CK (chunks start on checkpoints; CK | 8)
                    _checkpoint_at(ck_ptr, lam, eta, tb, b, NB, M, S, ms, lane_mask, ck_eta, CK)
                else:
                    _checkpoint(ck_ptr, lam, eta, tb, b, NB, M, S, ms, lane_mask, ck_eta, CK)
            v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3 = _lean_tiles(
                pv, pL, pk, pq, cmask, smask4, dt, S, SG, G, NT, EVEN_M)  # fmt: skip
            if W == 8:
                u0, U0, h0, r0, u1, U1, h1, r1, u2, U2, h2, r2, u3, U3, h3, r3 = _lean_tiles(
                    pv + 4 * M, pL + 4 * M, pk + 4 * S, pq + 4 * S, cmask, smask4, dt, S, SG, G,
                    NT, EVEN_M)  # fmt: skip
            if SCATTER:
                _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb,
                                mmask & ((m * 0 + tb) > t_lo), G)  # fmt: skip
                pa += 4 * M
                pb += 4 * M
            lam, eta, ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = _lean_block4(
                lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3, p, d, af,
                f1, tb, y_ptr, yvar_ptr, prec_ptr, M, S, base_m, mo, momask, ms, lane_mask, jt,
                zero, SAVE_PREC, SCATTER, G, NT, FORM)  # fmt: skip
            if W == 8:
                if SAVE_CK and CK == 4:
                    _checkpoint_at(ck_ptr, lam, eta, tb + 4, b, NB, M, S, ms, lane_mask, ck_eta,
                                   CK)  # fmt: skip
                lam, eta, zs0, zs1, zs2, zs3, ws0, ws1, ws2, ws3 = _lean_block4(
                    lam, eta, u0, U0, h0, r0, u1, U1, h1, r1, u2, U2, h2, r2, u3, U3, h3, r3, p,
                    d, af, f1, tb + 4, y_ptr, yvar_ptr, prec_ptr, M, S, base_m, mo, momask, ms,
                    lane_mask, jt, zero, SAVE_PREC, SCATTER, G, NT, FORM)  # fmt: skip
                if SCATTER:
                    _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb, mmask, G)
                    pa += 4 * M
                    pb += 4 * M
                ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3 = zs0, zs1, zs2, zs3, ws0, ws1, ws2, ws3
            pv += W * M
            pL += W * M
            pk += W * S
            pq += W * S
        if SCATTER:
            _scatter_store4(ys0, ys1, ys2, ys3, vs0, vs1, vs2, vs3, jg, pa, pb,
                            mmask & ((m * 0 + t_tail) > t_lo), G)  # fmt: skip
    elif PREFETCH:
        # blocks of 4 unrolled steps; the next block's inputs are loaded into registers at the
        # top of a block, so their latency is hidden behind 4 steps of arithmetic
        v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3 = _inputs4(
            v_ptr, Lv_ptr, k_ptr, q_ptr, t_lo, L, M, S, base_m, base_s, m, s, mmask, smask, dt,
            pm, IN_TILE, KQ_TILE, SG, G, NT)  # fmt: skip
        for tb in tl.range(t_lo, t_tail, 4, num_stages=1):  # fmt: skip
            if SAVE_CK:
                _checkpoint(ck_ptr, lam, eta, tb, b, NB, M, S, ms, lane_mask, ck_eta, CK)
            if AHEAD > 0:  # rows AHEAD steps on into L2
                for i in tl.static_range(4):
                    _prefetch_rows(v_ptr, Lv_ptr, v_ptr, v_ptr, base_m, tb + AHEAD + i, L, M, m,
                                   jt, 2)  # fmt: skip
            n0, nL0, nk0, nq0, n1, nL1, nk1, nq1, n2, nL2, nk2, nq2, n3, nL3, nk3, nq3 = _inputs4(
                v_ptr, Lv_ptr, k_ptr, q_ptr, tb + 4, L, M, S, base_m, base_s, m, s, mmask, smask,
                dt, pm, IN_TILE, KQ_TILE, SG, G, NT)  # fmt: skip
            pa, pb, step = _scatter_ptrs(y_ptr, yvar_ptr, tb, base_m, M, m, jg, G)
            lam, eta = _fwd_step4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3,
                                  k3, q3, p, d, af, f1, tb, y_ptr, yvar_ptr, prec_ptr, M, S,
                                  base_m, mo, momask, ms, lane_mask, jt, pa, pb,
                                  mmask & (step < L), SAVE_PREC, SCATTER, G, NT,
                                  FORM)  # fmt: skip
            v0, L0, k0, q0, v1, L1, k1, q1 = n0, nL0, nk0, nq0, n1, nL1, nk1, nq1
            v2, L2, k2, q2, v3, L3, k3, q3 = n2, nL2, nk2, nq2, n3, nL3, nk3, nq3
    elif BLOCK_PIPE:
        # blocks of 4 unrolled steps whose inputs are loaded in the block itself: the software
        # pipeline issues them NS - 1 blocks ahead (asynchronous copies into shared memory),
        # which the compiler cannot move closer to their use
        for tb in tl.range(t_lo, t_tail, 4, num_stages=NS):  # fmt: skip
            if SAVE_CK:
                _checkpoint(ck_ptr, lam, eta, tb, b, NB, M, S, ms, lane_mask, ck_eta, CK)
            v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3, k3, q3 = _inputs4(
                v_ptr, Lv_ptr, k_ptr, q_ptr, tb, L, M, S, base_m, base_s, m, s, mmask, smask, dt,
                pm, IN_TILE, KQ_TILE, SG, G, NT)  # fmt: skip
            pa, pb, step = _scatter_ptrs(y_ptr, yvar_ptr, tb, base_m, M, m, jg, G)
            lam, eta = _fwd_step4(lam, eta, v0, L0, k0, q0, v1, L1, k1, q1, v2, L2, k2, q2, v3, L3,
                                  k3, q3, p, d, af, f1, tb, y_ptr, yvar_ptr, prec_ptr, M, S,
                                  base_m, mo, momask, ms, lane_mask, jt, pa, pb,
                                  mmask & (step < L), SAVE_PREC, SCATTER, G, NT,
                                  FORM)  # fmt: skip
    # one step at a time (the whole chunk without PREFETCH, else its last steps); the loads of
    # later steps are issued ahead of use by the software pipeline (NS stages)
    for t in tl.range(t_tail, t_hi, num_stages=NS):
        if SAVE_CK:
            _checkpoint(ck_ptr, lam, eta, t, b, NB, M, S, ms, lane_mask, ck_eta, CK)
        if AHEAD > 0:
            _prefetch_rows(v_ptr, Lv_ptr, v_ptr, v_ptr, base_m, t + AHEAD, L, M, m, jt, 2)
        v, Lv, kk, qq = _inputs(v_ptr, Lv_ptr, k_ptr, q_ptr, t, L, M, S, base_m, base_s, m, s,
                                mmask, smask, dt)  # fmt: skip
        lam, eta = _fwd_step(lam, eta, v, Lv, kk, qq, p, d, af, f1, t, y_ptr, yvar_ptr, prec_ptr,
                             M, S, base_m, mo, momask, ms, lane_mask, SAVE_PREC, G, NT,
                             FORM)  # fmt: skip
    if c == NC - 1:
        tl.store(lamT_ptr + state_off, lam, mask=lane_mask)
        tl.store(etaT_ptr + state_off, eta, mask=lane_mask)


@triton.jit
def _kla_chunk_maps_kernel(
    v_ptr, Lv_ptr, k_ptr, a_ptr, p_ptr, comp_ptr,
    L, M, CL, S: tl.constexpr, NS: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr,
):  # fmt: skip
    """Pass 1 of the time-chunked forward: each lane's map over one chunk of CL steps.

    In homogeneous coordinates ``lam = u / w``, ``eta = e / w`` a KLA step is linear (``c = 0``):
    ``u' = (1 + p phi) u + (f1 + d phi) w``, ``w' = p u + d w``, ``e' = r p u + r d w + af e``.
    The chunk's product ``[[m11, m12], [m21, m22]]`` and ``(g1, g2, A)`` (7 numbers, rescaled
    every step: the map is projective) goes to ``comp [7, NC, B M S]``, the layout of the general
    filter's carry kernel.
    """
    pm = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2)
    NC = tl.num_programs(2)
    m, s, mo, so, mmask, smask, momask, somask = _lanes(pm, M, S, G, SG, NT)
    lane_mask = smask & mmask[None, :]
    ms = m[None, :] * S + s
    dt = comp_ptr.dtype.element_ty
    p, d, af, f1 = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt)
    one = tl.full([SG, NT], 1.0, dt)
    m11, m12, m21, m22 = one, one * 0.0, one * 0.0, one
    g1, g2, A = one * 0.0, one * 0.0, one
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    t_lo = c * CL
    t_hi = tl.minimum(t_lo + CL, L)
    for t in tl.range(t_lo, t_hi, num_stages=NS):
        v = tl.load(v_ptr + base_m + t * M + m, mask=mmask, other=0.0).to(dt)
        Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=mmask, other=0.0).to(dt)
        kk = tl.load(k_ptr + base_s + t * S + s, mask=smask, other=0.0).to(dt)
        phi = Lv[None, :] * (kk * kk)
        r = (v * Lv)[None, :] * kk
        l11 = 1.0 + p * phi
        l12 = f1 + d * phi
        n11 = l11 * m11 + l12 * m21
        n12 = l11 * m12 + l12 * m22
        n21 = p * m11 + d * m21
        n22 = p * m12 + d * m22
        ng1 = r * (p * m11 + d * m21) + af * g1
        ng2 = r * (p * m12 + d * m22) + af * g2
        sc = _rcp(n11 + n22)  # rescaling keeps the entries finite (projective map)
        m11 = n11 * sc
        m12 = n12 * sc
        m21 = n21 * sc
        m22 = n22 * sc
        g1 = ng1 * sc
        g2 = ng2 * sc
        A = af * A * sc
    n_lanes = M * S * tl.num_programs(1)
    out = comp_ptr + c * n_lanes + b.to(tl.int64) * M * S + ms
    step = NC * n_lanes
    tl.store(out, m11, mask=lane_mask)
    tl.store(out + step, m12, mask=lane_mask)
    tl.store(out + 2 * step, m21, mask=lane_mask)
    tl.store(out + 3 * step, m22, mask=lane_mask)
    tl.store(out + 4 * step, g1, mask=lane_mask)
    tl.store(out + 5 * step, g2, mask=lane_mask)
    tl.store(out + 6 * step, A, mask=lane_mask)


@helper
def _step_masks(t, L, m, mmask, smask, MASKED: tl.constexpr):
    """The load masks ``[NT]`` (per channel) and ``[SG, NT]`` (per slot) of step ``t``: the
    channel and slot masks, and with ``MASKED`` also ``t < L``."""
    if MASKED:
        inside = (m * 0 + t) < L  # [NT]
        return mmask & inside, smask & inside[None, :]
    return mmask, smask


@helper
def _vlk(v_ptr, Lv_ptr, k_ptr, t, M, S: tl.constexpr, base_m, base_s, m, s, mm, sm,
         dt: tl.constexpr):  # fmt: skip
    """Step ``t``'s ``v, Lv [NT]`` and ``k [SG, NT]`` under the masks ``mm, sm`` (zeros where
    masked): the inputs of the backward's recomputation and, without reuse, of its adjoint
    step."""
    v = tl.load(v_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)
    Lv = tl.load(Lv_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)
    kk = tl.load(k_ptr + base_s + t * S + s, mask=sm, other=0.0).to(dt)
    return v, Lv, kk


@helper
def _step(lam, eta, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, t, L, M, S, base_m, base_s, m, s,
          mmask, smask, dt: tl.constexpr, MASKED: tl.constexpr,
          E_FORM: tl.constexpr = False):  # fmt: skip
    """One forward step (recomputation in the backward). Returns the new state and the step's
    inputs ``v, Lv, k`` (which the adjoint step may reuse). ``MASKED``: steps past ``L`` read
    zeros (only the last interval of a lane needs it)."""
    mm, sm = _step_masks(t, L, m, mmask, smask, MASKED)
    v, Lv, kk = _vlk(v_ptr, Lv_ptr, k_ptr, t, M, S, base_m, base_s, m, s, mm, sm, dt)
    lam_new, eta_new = _step_from(lam, eta, p, d, af, f1, v, Lv, kk, E_FORM)
    return lam_new, eta_new, v, Lv, kk


@helper
def _recompute4_tiles(l0, e0, t0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S: tl.constexpr,
                      base_m, base_s, pm, dt: tl.constexpr, SG: tl.constexpr, G: tl.constexpr,
                      NT: tl.constexpr, MASKED: tl.constexpr, E_FORM: tl.constexpr):  # fmt: skip
    """``_recompute4`` whose inputs are loaded as tiles (``_vl4``, ``_slot_tile``; with
    ``MASKED`` zeros past ``L``, as the masked steps read)."""
    v0, L0, v1, L1, v2, L2, v3, L3 = _vl4(v_ptr, Lv_ptr, t0, L, M, base_m, pm, dt, G, NT,
                                          MASKED)  # fmt: skip
    k0, k1, k2, k3 = _slot_tile(k_ptr, t0, L, S, base_s, dt, SG, G, NT, MASKED)
    l1, e1 = _step_from(l0, e0, p, d, af, f1, v0, L0, k0, E_FORM)
    l2, e2 = _step_from(l1, e1, p, d, af, f1, v1, L1, k1, E_FORM)
    l3, e3 = _step_from(l2, e2, p, d, af, f1, v2, L2, k2, E_FORM)
    l4, e4 = _step_from(l3, e3, p, d, af, f1, v3, L3, k3, E_FORM)
    return l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3


@helper
def _recompute4(l0, e0, t0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S: tl.constexpr, base_m,
                base_s, m, s, mmask, smask, dt: tl.constexpr, MASKED: tl.constexpr,
                E_FORM: tl.constexpr = False):  # fmt: skip
    """The 4 states after ``(l0, e0)`` from step ``t0`` on, recomputed into registers
    (unrolled: Triton has no register arrays), followed by the 4 steps' inputs ``v, Lv, k``."""
    l1, e1, v0, L0, k0 = _step(l0, e0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, t0 + 0,
                                 L, M, S, base_m, base_s, m, s, mmask, smask, dt, MASKED,
                                 E_FORM)  # fmt: skip
    l2, e2, v1, L1, k1 = _step(l1, e1, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, t0 + 1,
                                 L, M, S, base_m, base_s, m, s, mmask, smask, dt, MASKED,
                                 E_FORM)  # fmt: skip
    l3, e3, v2, L2, k2 = _step(l2, e2, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, t0 + 2,
                                 L, M, S, base_m, base_s, m, s, mmask, smask, dt, MASKED,
                                 E_FORM)  # fmt: skip
    l4, e4, v3, L3, k3 = _step(l3, e3, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, t0 + 3,
                                 L, M, S, base_m, base_s, m, s, mmask, smask, dt, MASKED,
                                 E_FORM)  # fmt: skip
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
def _interval(ck_ptr, eta_ck, t0, b, NB, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M,
              S: tl.constexpr, base_m, base_s, m, s, mmask, smask, ms, lane_mask,
              dt: tl.constexpr, CK: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """The 9 states ``(lam, eta)`` of the 8-step checkpoint interval starting at step ``t0``
    (its checkpoint, then 8 steps recomputed into registers), followed by the 8 steps' inputs
    ``v, Lv, k``. Shared by the backward and its chunk-map pass."""
    tl.static_assert(CK == 8, "an interval of 8 steps")
    l0, e0 = _checkpoint_state(ck_ptr, eta_ck, t0, b, NB, M, S, ms, lane_mask, CK)
    l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3 = _recompute4(
        l0, e0, t0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m, base_s, m, s, mmask,
        smask, dt, MASKED)  # fmt: skip
    l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7, k7 = _recompute4(
        l4, e4, t0 + 4, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m, base_s, m, s, mmask,
        smask, dt, MASKED)  # fmt: skip
    return (l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, l5, e5, l6, e6, l7, e7, l8, e8,
            v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3, v4, L4, k4, v5, L5, k5, v6, L6, k6,
            v7, L7, k7)


@helper
def _adjoint_step(
    lam, eta, lam_prev, eta_prev, Lc, Ec, ga, gp, p, d, af, f1, v_in, Lv_in, k_in,
    v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr,
    gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    t, L, M, S: tl.constexpr, base_m, base_s, part, m, s, mo, jt, mmask, smask, momask, ms,
    lane_mask, dt: tl.constexpr, HAS_GPREC: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, REUSE: tl.constexpr, MASKED: tl.constexpr, SCATTER: tl.constexpr,
    gy_in, gyv_in, q_in, TILE: tl.constexpr, OUT4: tl.constexpr, E_FORM: tl.constexpr = False,
):  # fmt: skip
    """The adjoints ``(Lc, Ec)`` of ``(lam, eta)`` before step ``t`` from those after it, the
    step's input gradients, and the dynamics' gradient sums; also the thread's own sums over
    its slots of ``gv, gLv`` (``[NT]``). ``REUSE``: take ``v, Lv, k`` from the recomputation
    (``v_in, Lv_in, k_in``) instead of loading them again; ``TILE``: take ``gy, gyv, q`` from
    ``gy_in, gyv_in, q_in`` (the caller's tiles). ``OUT4``: the caller stores ``gv, gLv``
    (``_scatter_outputs4``), else they are stored here. ``MASKED``: steps past ``L`` change
    nothing (only the last interval of a lane needs it).

    Written for few instructions a lane: with ``qrl = q / lam`` and
    ``A = gy mean + gyv qrl``, the precision's local gradient is ``-qrl A`` and ``gq``'s term is
    ``A + gyv qrl``; ``gv = Lv sum_s Et k``, ``gLv = sum_s Lt k^2 + v sum_s Et k`` (one
    in-thread sum of each kind), ``gk``'s term is ``Lv (2 k Lt + v Et)``. The recomputation's
    ``1 / (p lam + d)`` and ``(lam + f1) / (p lam + d)`` are the same expressions as here, so
    the compiler computes them once."""
    mm, sm = _step_masks(t, L, m, mmask, smask, MASKED)
    omask = momask
    if MASKED:
        omask = momask & ((mo * 0 + t) < L)
    if REUSE:
        vv = v_in
        Lv = Lv_in
        kk = k_in
    else:
        vv, Lv, kk = _vlk(v_ptr, Lv_ptr, k_ptr, t, M, S, base_m, base_s, m, s, mm, sm, dt)
    if TILE:
        gy = gy_in
        gyv = gyv_in
        qq = q_in
    else:
        gy = tl.load(gy_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)
        gyv = tl.load(gyv_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)
        qq = tl.load(q_ptr + base_s + t * S + s, mask=sm, other=0.0).to(dt)
    rl = _rcp(lam)
    qrl = qq * rl
    A = gy[None, :] * (eta * rl) + gyv[None, :] * qrl
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
    xk = Lv[None, :] * (2.0 * kk * Lt + vv[None, :] * Et)
    xq = A + gyv[None, :] * qrl
    if SCATTER:
        _scatter_channel_sums(xk, xq, gk_ptr, gq_ptr, part + t * S, jt, t, L, S, G, SG, NT,
                              MASKED)  # fmt: skip
    else:
        _store_channel_sums(xk, xq, gk_ptr, gq_ptr, part + t * S, t, L, S, G, SG, NT, MASKED)
    rden = _rcp(p * lam_prev + d)
    alpha = af * rden
    g_al = Et * eta_prev
    a2 = alpha * alpha
    # d/da: alpha' = rden - 2 alpha^2 (0 where the decay is 0), lam_pred' = -2 alpha lam_pred;
    # d/dp: alpha' = -alpha lam_pred, lam_pred' = -lam_pred^2
    if E_FORM:  # where the decay is 0, rden = alpha = 0 and lam_pred = e = 1 / p
        lam_pred = lam_prev * rden + f1
        g_a = g_al
    else:
        lam_pred = (lam_prev + f1) * rden
        g_a = tl.where(f1 > 0.0, 0.0, g_al)
    al = alpha * lam_pred
    dga = g_a * (rden - 2.0 * a2) - 2.0 * (Lt * al)
    dgp = -(lam_pred * (Lt * lam_pred) + g_al * al)
    n_Lc = a2 * Lt - alpha * (p * rden) * g_al
    n_Ec = alpha * Et
    if MASKED:
        inside = ((m * 0 + t) < L)[None, :]
        ga = tl.where(inside, ga + dga, ga)
        gp = tl.where(inside, gp + dgp, gp)
        Lc = tl.where(inside, n_Lc, Lc)
        Ec = tl.where(inside, n_Ec, Ec)
    else:
        ga += dga
        gp += dgp
        Lc = n_Lc
        Ec = n_Ec
    return Lc, Ec, ga, gp, pv, pl


@helper
def _adjoint4(
    l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3, t0,
    Lc, Ec, ga, gp, p, d, af, f1,
    v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    L, M, S: tl.constexpr, base_m, base_s, part, m, s, mo, jt, mmask, smask, momask, ms,
    lane_mask, dt: tl.constexpr, HAS_GPREC: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, REUSE: tl.constexpr, MASKED: tl.constexpr, SCATTER: tl.constexpr,
    pm, TILE: tl.constexpr, OUT4: tl.constexpr, E_FORM: tl.constexpr = False,
):  # fmt: skip
    """The adjoint walk back over steps ``t0 + 3 .. t0`` (states ``l0..l4`` before and after
    them, their inputs ``v, Lv, k``): ``_adjoint_step`` of each, unrolled. ``TILE``: ``gy,
    gyv`` and ``q`` of the 4 steps loaded as tiles; ``OUT4``: ``gv, gLv`` stored by a
    reduce-scatter (``_scatter_outputs4``)."""
    if TILE:
        y0, w0, y1, w1, y2, w2, y3, w3 = _vl4(gy_ptr, gyv_ptr, t0, L, M, base_m, pm, dt, G, NT,
                                              MASKED)  # fmt: skip
        q0, q1, q2, q3 = _slot_tile(q_ptr, t0, L, S, base_s, dt, SG, G, NT, MASKED)
    else:  # placeholders (unused)
        y0, w0, y1, w1, y2, w2, y3, w3 = v0, v0, v0, v0, v0, v0, v0, v0
        q0, q1, q2, q3 = k0, k0, k0, k0
    Lc, Ec, ga, gp, pv3, pl3 = _adjoint_step(
        l4, e4, l3, e3, Lc, Ec, ga, gp, p, d, af, f1, v3, L3, k3, v_ptr, Lv_ptr, k_ptr, q_ptr,
        gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, t0 + 3, L, M, S, base_m,
        base_s, part, m, s, mo, jt, mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC,
        G, SG, NT, REUSE, MASKED, SCATTER, y3, w3, q3, TILE, OUT4, E_FORM,
    )  # fmt: skip
    Lc, Ec, ga, gp, pv2, pl2 = _adjoint_step(
        l3, e3, l2, e2, Lc, Ec, ga, gp, p, d, af, f1, v2, L2, k2, v_ptr, Lv_ptr, k_ptr, q_ptr,
        gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, t0 + 2, L, M, S, base_m,
        base_s, part, m, s, mo, jt, mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC,
        G, SG, NT, REUSE, MASKED, SCATTER, y2, w2, q2, TILE, OUT4, E_FORM,
    )  # fmt: skip
    Lc, Ec, ga, gp, pv1, pl1 = _adjoint_step(
        l2, e2, l1, e1, Lc, Ec, ga, gp, p, d, af, f1, v1, L1, k1, v_ptr, Lv_ptr, k_ptr, q_ptr,
        gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, t0 + 1, L, M, S, base_m,
        base_s, part, m, s, mo, jt, mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC,
        G, SG, NT, REUSE, MASKED, SCATTER, y1, w1, q1, TILE, OUT4, E_FORM,
    )  # fmt: skip
    Lc, Ec, ga, gp, pv0, pl0 = _adjoint_step(
        l1, e1, l0, e0, Lc, Ec, ga, gp, p, d, af, f1, v0, L0, k0, v_ptr, Lv_ptr, k_ptr, q_ptr,
        gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, t0 + 0, L, M, S, base_m,
        base_s, part, m, s, mo, jt, mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC,
        G, SG, NT, REUSE, MASKED, SCATTER, y0, w0, q0, TILE, OUT4, E_FORM,
    )  # fmt: skip
    if OUT4:
        _scatter_outputs4(pv0, pv1, pv2, pv3, pl0, pl1, pl2, pl3, t0, gv_ptr, gLv_ptr, L, M,
                          base_m, m, mmask, jt, G, MASKED)  # fmt: skip
    return Lc, Ec, ga, gp


@helper
def _bwd_interval(
    t0, Lc, Ec, ga, gp, p, d, af, f1, ck_ptr, eta_ck, b, NB,
    v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr,
    L, M, S: tl.constexpr, base_m, base_s, part, m, s, mo, jt, mmask, smask, momask, ms,
    lane_mask, dt: tl.constexpr, HAS_GPREC: tl.constexpr, CK: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr, AHEAD: tl.constexpr,
    REUSE: tl.constexpr, MASKED: tl.constexpr, SCATTER: tl.constexpr,
    pm, TILE: tl.constexpr, OUT4: tl.constexpr, E_FORM: tl.constexpr = False,
):  # fmt: skip
    """One checkpoint interval of the backward (``CK`` = 8 or 4 steps): its states recomputed
    from the checkpoint into registers, then walked back. ``TILE``: the inputs of each 4 steps
    loaded as tiles (and reused by the walk); ``OUT4``: ``gv, gLv`` reduce-scattered."""
    if AHEAD > 0:  # the rows of the interval AHEAD steps earlier into L2
        for i in tl.static_range(CK):
            _prefetch_rows(v_ptr, Lv_ptr, gy_ptr, gyv_ptr, base_m, t0 - AHEAD + i, L, M, m,
                           jt, 4)  # fmt: skip
    l0, e0 = _checkpoint_state(ck_ptr, eta_ck, t0, b, NB, M, S, ms, lane_mask, CK)
    if TILE:
        l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3 = (
            _recompute4_tiles(l0, e0, t0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
                              base_s, pm, dt, SG, G, NT, MASKED, E_FORM))  # fmt: skip
    else:
        l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3 = (
            _recompute4(l0, e0, t0, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
                        base_s, m, s, mmask, smask, dt, MASKED, E_FORM))  # fmt: skip
    if CK == 8:  # the second half, then the walk back over it
        if TILE:
            l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7, k7 = (
                _recompute4_tiles(l4, e4, t0 + 4, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S,
                                  base_m, base_s, pm, dt, SG, G, NT, MASKED,
                                  E_FORM))  # fmt: skip
        else:
            l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7, k7 = (
                _recompute4(l4, e4, t0 + 4, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
                            base_s, m, s, mmask, smask, dt, MASKED, E_FORM))  # fmt: skip
        Lc, Ec, ga, gp = _adjoint4(
            l4, e4, l5, e5, l6, e6, l7, e7, l8, e8, v4, L4, k4, v5, L5, k5, v6, L6, k6, v7, L7,
            k7, t0 + 4, Lc, Ec, ga, gp, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr,
            gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, L, M, S, base_m, base_s, part,
            m, s, mo, jt, mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC, G, SG, NT, REUSE,
            MASKED, SCATTER, pm, TILE, OUT4, E_FORM,
        )  # fmt: skip
    Lc, Ec, ga, gp = _adjoint4(
        l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3,
        t0, Lc, Ec, ga, gp, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr,
        gprec_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, L, M, S, base_m, base_s, part, m, s, mo, jt,
        mmask, smask, momask, ms, lane_mask, dt, HAS_GPREC, G, SG, NT, REUSE, MASKED, SCATTER,
        pm, TILE, OUT4, E_FORM,
    )  # fmt: skip
    return Lc, Ec, ga, gp


@triton.jit
def _kla_bwd_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ck_ptr,
    gy_ptr, gyv_ptr, glT_ptr, geT_ptr, gprec_ptr,
    gv_ptr, gLv_ptr, gk_part_ptr, gq_part_ptr, ga_part_ptr, gp_part_ptr, g0_ptr, xend_ptr,
    L, M, NB, B, CI, S: tl.constexpr,
    HAS_GPREC: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr, CHUNKED: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr, AHEAD: tl.constexpr,
    REUSE: tl.constexpr, SPLIT: tl.constexpr, SCATTER: tl.constexpr, TILE_IN: tl.constexpr,
    LEAN: tl.constexpr,
):  # fmt: skip
    tl.static_assert(CK == 8 or CK == 4, "the backward's recomputation is unrolled for 8 or 4")
    pm = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2)  # chunk of CI checkpoint intervals (all of them unless CHUNKED)
    NC = tl.num_programs(2)
    m, s, mo, so, mmask, smask, momask, somask = _lanes(pm, M, S, G, SG, NT)
    jt = tl.arange(0, NT)
    lane_mask = smask & mmask[None, :]
    ms = m[None, :] * S + s
    dt = gv_ptr.dtype.element_ty
    p, d, af, f1 = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt, LEAN)  # (LEAN: f1 holds e)
    state_off = b.to(tl.int64) * M * S + ms
    # tiles of each 4 steps' inputs, reused by the walk; gv, gLv reduce-scattered (float32, one
    # warp, 4 or 8 threads a channel)
    TILE: tl.constexpr = TILE_IN and REUSE
    OUT4: tl.constexpr = TILE and dt == tl.float32 and NT % 32 == 0 and (G == 4 or G == 8)
    if CHUNKED:  # the adjoints entering the chunk from its end, from the carry pass
        Lc = tl.load(xend_ptr + c * B * M * S + state_off, mask=lane_mask, other=0.0).to(dt)
        Ec = tl.load(xend_ptr + (NC + c) * B * M * S + state_off, mask=lane_mask, other=0.0)
        Ec = Ec.to(dt)
    else:
        Lc = tl.load(glT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
        Ec = tl.load(geT_ptr + state_off, mask=lane_mask, other=0.0).to(dt)
    ga = tl.zeros([SG, NT], dt)
    gp = tl.zeros([SG, NT], dt)
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    part = (pm.to(tl.int64) * B + b) * L * S
    eta_ck = NB * M * S * B
    blk_lo = c * CI
    blk_hi = tl.minimum(blk_lo + CI, NB)
    if SPLIT:  # the main loop runs without masks; the last interval, if partial, with them
        if blk_hi * CK > L:
            Lc, Ec, ga, gp = _bwd_interval(
                (blk_hi - 1) * CK, Lc, Ec, ga, gp, p, d, af, f1, ck_ptr, eta_ck, b, NB, v_ptr,
                Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr, gk_part_ptr,
                gq_part_ptr, L, M, S, base_m, base_s, part, m, s, mo, jt, mmask, smask,
                momask, ms, lane_mask, dt, HAS_GPREC, CK, G, SG, NT, AHEAD, REUSE, True,
                SCATTER, pm, TILE, OUT4, LEAN,
            )  # fmt: skip
            blk_hi -= 1
    for jb in tl.range(blk_lo, blk_hi, num_stages=NS):
        Lc, Ec, ga, gp = _bwd_interval(
            (blk_hi - 1 - (jb - blk_lo)) * CK, Lc, Ec, ga, gp, p, d, af, f1, ck_ptr, eta_ck, b,
            NB, v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr, gv_ptr, gLv_ptr,
            gk_part_ptr, gq_part_ptr, L, M, S, base_m, base_s, part, m, s, mo, jt, mmask,
            smask, momask, ms, lane_mask, dt, HAS_GPREC, CK, G, SG, NT, AHEAD, REUSE,
            not SPLIT, SCATTER, pm, TILE, OUT4, LEAN,
        )  # fmt: skip
    # per-chunk partial sums of the dynamics' gradients ([NC, B, M, S], added in torch)
    tl.store(ga_part_ptr + c * B * M * S + state_off, ga, mask=lane_mask)
    tl.store(gp_part_ptr + c * B * M * S + state_off, gp, mask=lane_mask)
    if c == 0:
        tl.store(g0_ptr + state_off, Lc, mask=lane_mask)
        tl.store(g0_ptr + B * M * S + state_off, Ec, mask=lane_mask)


@helper
def _adjoint_map_step(
    lam, eta, lam_prev, eta_prev, A1, A2, A3, c1, c2, p, d, af,
    v_ptr, Lv_ptr, k_ptr, q_ptr, gy_ptr, gyv_ptr, gprec_ptr,
    t, L, M, S: tl.constexpr, base_m, base_s, m, s, mmask, smask, ms, lane_mask,
    dt: tl.constexpr, HAS_GPREC: tl.constexpr,
):  # fmt: skip
    """One step of pass 1 of the time-chunked backward: with ``x = (Lam, E)`` the adjoints of
    ``(lam, eta)`` after a step, ``x_before = Mt (x_after + g_t)``,
    ``Mt = [[alpha^2, -alpha p rden eta_prev], [0, alpha]]``, ``g_t`` the step's local terms.
    ``x_before_chunk = [[A1, A2], [0, A3]] x_end + (c1, c2)`` is composed from the end."""
    inside_m = (m * 0 + t) < L
    inside = inside_m[None, :]
    mm = mmask & inside_m
    sm = smask & inside
    gy = tl.load(gy_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)[None, :]
    gyv = tl.load(gyv_ptr + base_m + t * M + m, mask=mm, other=0.0).to(dt)[None, :]
    qq = tl.load(q_ptr + base_s + t * S + s, mask=sm, other=0.0).to(dt)
    rl = _rcp(lam)
    mean = eta * rl
    gl = -rl * (gy * qq * mean + gyv * qq * qq * rl)
    if HAS_GPREC:
        poff = (base_m + t * M) * S + ms
        gl += tl.load(gprec_ptr + poff, mask=lane_mask & inside, other=0.0).to(dt)
    ge = gy * qq * rl
    rden = _rcp(p * lam_prev + d)
    alpha = af * rden
    m1 = alpha * alpha
    m2 = -alpha * p * rden * eta_prev
    u1 = c1 + gl
    u2 = c2 + ge
    n_c1 = m1 * u1 + m2 * u2
    n_c2 = alpha * u2
    n_A2 = m1 * A2 + m2 * A3
    A1 = tl.where(inside, m1 * A1, A1)
    A2 = tl.where(inside, n_A2, A2)
    A3 = tl.where(inside, alpha * A3, A3)
    c1 = tl.where(inside, n_c1, c1)
    c2 = tl.where(inside, n_c2, c2)
    return A1, A2, A3, c1, c2


@triton.jit
def _kla_bwd_maps_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, ck_ptr, gy_ptr, gyv_ptr, gprec_ptr, maps_ptr,
    L, M, NB, B, CI, S: tl.constexpr,
    HAS_GPREC: tl.constexpr, CK: tl.constexpr, NS: tl.constexpr,
    G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr,
):  # fmt: skip
    """Pass 1 of the time-chunked backward: each lane's affine adjoint map over one chunk,
    ``(A1, A2, A3, c1, c2)`` to ``maps [5, NC, B M S]`` (states recomputed from checkpoints)."""
    tl.static_assert(CK == 8, "the backward's recomputation is unrolled for 8 steps")
    pm = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2)
    NC = tl.num_programs(2)
    m, s, mo, so, mmask, smask, momask, somask = _lanes(pm, M, S, G, SG, NT)
    lane_mask = smask & mmask[None, :]
    ms = m[None, :] * S + s
    dt = maps_ptr.dtype.element_ty
    p, d, af, f1 = _dynamics(a_ptr, p_ptr, ms, lane_mask, dt)
    one = tl.full([SG, NT], 1.0, dt)
    A1, A2, A3, c1, c2 = one, one * 0.0, one, one * 0.0, one * 0.0
    base_m = b.to(tl.int64) * L * M
    base_s = b.to(tl.int64) * L * S
    eta_ck = NB * M * S * B
    blk_lo = c * CI
    blk_hi = tl.minimum(blk_lo + CI, NB)
    for jb in tl.range(blk_lo, blk_hi, num_stages=NS):
        t0 = (blk_hi - 1 - (jb - blk_lo)) * CK
        # the interval's states, recomputed from its checkpoint into registers
        (l0, e0, l1, e1, l2, e2, l3, e3, l4, e4, l5, e5, l6, e6, l7, e7, l8, e8,
         v0, L0, k0, v1, L1, k1, v2, L2, k2, v3, L3, k3, v4, L4, k4, v5, L5, k5, v6, L6, k6,
         v7, L7, k7) = _interval(
            ck_ptr, eta_ck, t0, b, NB, p, d, af, f1, v_ptr, Lv_ptr, k_ptr, L, M, S, base_m,
            base_s, m, s, mmask, smask, ms, lane_mask, dt, CK, True,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l8, e8, l7, e7, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 7, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l7, e7, l6, e6, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 6, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l6, e6, l5, e5, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 5, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l5, e5, l4, e4, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 4, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l4, e4, l3, e3, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 3, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l3, e3, l2, e2, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 2, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l2, e2, l1, e1, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 1, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
        A1, A2, A3, c1, c2 = _adjoint_map_step(
            l1, e1, l0, e0, A1, A2, A3, c1, c2, p, d, af, v_ptr, Lv_ptr, k_ptr, q_ptr,
            gy_ptr, gyv_ptr, gprec_ptr, t0 + 0, L, M, S, base_m, base_s, m, s, mmask, smask,
            ms, lane_mask, dt, HAS_GPREC,
        )  # fmt: skip
    n_lanes = B * M * S
    out = maps_ptr + c * n_lanes + b.to(tl.int64) * M * S + ms
    step = NC * n_lanes
    tl.store(out, A1, mask=lane_mask)
    tl.store(out + step, A2, mask=lane_mask)
    tl.store(out + 2 * step, A3, mask=lane_mask)
    tl.store(out + 3 * step, c1, mask=lane_mask)
    tl.store(out + 4 * step, c2, mask=lane_mask)


@triton.jit
def _kla_bwd_carry_kernel(maps_ptr, glT_ptr, geT_ptr, xend_ptr, N, NC, NS: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
    """Pass 2: walk the chunk maps from the last chunk back; ``xend [2, NC, N]`` gets the
    adjoints ``(Lam, E)`` entering each chunk from its end."""
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    x1 = tl.load(glT_ptr + lanes, mask=lmask, other=0.0)
    x2 = tl.load(geT_ptr + lanes, mask=lmask, other=0.0)
    step = NC * N
    for jj in tl.range(0, NC, num_stages=NS):
        cc = NC - 1 - jj
        tl.store(xend_ptr + cc * N + lanes, x1, mask=lmask)
        tl.store(xend_ptr + (NC + cc) * N + lanes, x2, mask=lmask)
        base = maps_ptr + cc * N + lanes
        A1 = tl.load(base, mask=lmask, other=1.0)
        A2 = tl.load(base + step, mask=lmask, other=0.0)
        A3 = tl.load(base + 2 * step, mask=lmask, other=1.0)
        c1 = tl.load(base + 3 * step, mask=lmask, other=0.0)
        c2 = tl.load(base + 4 * step, mask=lmask, other=0.0)
        x1, x2 = A1 * x1 + A2 * x2 + c1, A3 * x2 + c2


# Tuning (benchmarks/gpu.py and benchmarks/kla_kernel_time.py sweep it): pipeline stages of the
# per-step loads (forward, backward), how the forward stages its inputs (4-step blocks loaded a
# block ahead into registers, or by the software pipeline), the slots a thread walks (its
# independent chains) and warps a program has, time chunking, L2 prefetch distances, whether the
# backward reuses the recomputation's inputs and runs its main loop without step masks.
# ``None``: chosen by the number of lanes ``B M S`` (``_tuning``). Kernel times of every variant
# on the H200 (each checked against the default first): benchmarks/HISTORY.md.
TUNING = {
    "NS": 4,
    # None: 3 with 2 slots a thread or tile loads, else 2 (4 was 1.4x slower at B=8 M=2048;
    # with tiles at B=8 M=2048 3 gives a backward of 1.52 against 1.67 ms)
    "bwd_NS": None,
    # the forward's staging: "prefetch" (registers, a block ahead), "pipeline" (4-step blocks by
    # the software pipeline, as asynchronous copies) or "steps" (one step at a time, software
    # pipeline). With tile loads (below), "pipeline" at both shapes of the kernel issue: B=4
    # M=960 S=16 forward 0.185 against 0.645 ms (prefetch), B=8 M=2048 0.487 against 0.865
    "fwd_staging": "pipeline",
    "fwd_chunk_len": 0,  # > 0: time-chunked forward with chunks of this many steps (was slower)
    "bwd_chunk_len": 0,  # > 0: time-chunked backward, chunks of this many steps (multiple of 8)
    "fwd_slots": 4,  # B=8 M=2048: 0.634 against 0.656 ms at 8 (0.674 / 0.838 saving checkpoints)
    "fwd_warps": 1,
    "bwd_slots": None,  # 2 below LARGE lanes (more warps for a latency-bound walk), else 4
    # warps a program in the backward: with more, the reduce-scattered gk, gq of each warp are
    # added over the warps (shared memory, 4 barriers a step), so a program writes one partial
    # for 2 or 4 times the channels (B=4 M=960: 240 partials of [B, L, S] a call at 1 warp).
    # Untimed: compiled at 2 slots, 1095 instructions an 8-step interval at 1 warp, 1179 at 2
    "bwd_warps": 1,
    # > 0: prefetch the rows of v, Lv this many steps ahead into L2 (with tile loads, 32 steps
    # against none: B=4 M=960 0.185 against 0.183 ms, B=8 M=2048 0.485 against 0.487; without
    # them 32 hurt at B=8)
    "fwd_l2_ahead": 0,
    # > 0: prefetch v, Lv, gy, gyv this many steps back into L2. None: 32 from LARGE lanes
    # (with tiles, B=8 M=2048: backward 1.68 against 1.81 ms at 0), else 0 (B=4 M=960: 0.63
    # against 0.66)
    "bwd_l2_ahead": None,
    # the adjoint walk reuses the recomputation's v, Lv, k (B=4: backward 0.95 against 1.14 ms;
    # at 4 slots a thread and 8-step intervals it spills). None: unless 4 slots and ck 8
    "bwd_reuse_inputs": None,
    # the main loop without step masks, a partial last interval with them. None: at 2 slots a
    # thread (B=4: backward 0.83 against 0.91 ms) or with 4-step intervals; at 4 slots and
    # 8-step intervals it spills (B=8: 4.46 against 3.13 ms)
    "bwd_split_tail": None,
    # sums over channels of gk, gq reduce-scattered over the warp (fewer shuffles)
    "bwd_scatter_sums": True,
    # the forward's 4-step blocks store y, yvar by a reduce-scatter over a channel's threads
    # (float32; 6 shuffles a thread per block instead of 24) and load v, Lv as [4, channels]
    # and k, q as [4, slots] tiles (one copy of each value, not one per thread that uses it):
    # compiled loop 438 -> 333 instructions per block; B=4 M=960 S=16 forward 0.277 -> 0.185
    # ms, B=8 M=2048 0.633 -> 0.487 (benchmarks/HISTORY.md)
    "fwd_scatter_out": True,
    "fwd_tile_loads": True,
    "fwd_tile_kq": True,
    # the forward's lean form: lam_pred = lam / (p lam + d) + e (one addition a lane-step
    # fewer) and, in the pipelined tile blocks, loop-carried pointers without step masks
    "fwd_lean": True,
    # steps a block of the lean forward, 4 or 8 (8 halves the per-block work of the pipeline).
    # None: 8, but 4 when the forward saves the backward's checkpoints (B=4 M=960 S=16: forward
    # 0.139 against 0.161 ms at 4; forward saving checkpoints 0.170 against 0.176 at 8;
    # benchmarks/HISTORY.md)
    "fwd_lean_steps": None,
    # the lean forward forms Lv k once a lane-step for both phi = Lv k^2 and r = v Lv k (4
    # instructions fewer a 4-step block, yet B=4 forward 0.156 against 0.139 ms in 8-step blocks)
    "fwd_lk": False,
    # the backward loads each 4 steps' v, Lv, gy, gyv as [4, channels] and k, q as [4, slots]
    # tiles (with bwd_reuse_inputs) and stores gv, gLv by the forward's reduce-scatter: B=4
    # M=960 backward 0.81 -> 0.63 ms, B=8 M=2048 1.95 -> 1.52 (benchmarks/HISTORY.md)
    "bwd_tiles": True,
    # the backward's lean form: the forward's E_FORM in its recomputation and adjoint (one
    # addition and one select a lane-step fewer)
    "bwd_lean": True,
    # steps between the forward's checkpoints, which the backward recomputes at once: 8, or 4
    # (half the live states for twice the checkpoint bytes; not with bwd_chunk_len). None: 4
    # from LARGE lanes (B=8 M=2048, with split tail and reuse: backward 1.95 against 2.74 ms,
    # the forward saving checkpoints 0.74 against 0.68), else 8 (B=4 M=960: 0.81 against 0.84)
    "ck": None,
}
LARGE = 1 << 17  # lanes B M S from which the backward takes 4 slots a thread and not 2


def _tuning(lanes: int) -> dict:
    """``TUNING`` with its ``None`` entries chosen for ``lanes = B M S`` lanes."""
    t = dict(TUNING)
    large = lanes >= LARGE
    if t["bwd_slots"] is None:
        t["bwd_slots"] = 4 if large else 2
    if t["bwd_NS"] is None:
        t["bwd_NS"] = 3 if t["bwd_slots"] == 2 or t["bwd_tiles"] else 2
    if t["bwd_l2_ahead"] is None:
        t["bwd_l2_ahead"] = 32 if large else 0
    if t["fwd_staging"] is None:
        t["fwd_staging"] = "pipeline"
    if t["fwd_staging"] not in ("prefetch", "pipeline", "steps"):
        raise ValueError(
            "TUNING['fwd_staging']: expected 'prefetch', 'pipeline', 'steps' or None, got "
            f"{t['fwd_staging']!r}"
        )
    if t["ck"] is None:
        t["ck"] = 4 if large and not t["bwd_chunk_len"] else 8
    if t["bwd_reuse_inputs"] is None:
        t["bwd_reuse_inputs"] = t["bwd_slots"] <= 2 or t["ck"] == 4
    if t["bwd_split_tail"] is None:
        t["bwd_split_tail"] = t["bwd_slots"] <= 2 or t["ck"] == 4
    if t["fwd_lean_steps"] not in (None, 4, 8):
        raise ValueError(
            f"TUNING['fwd_lean_steps']: expected 4, 8 or None, got {t['fwd_lean_steps']!r}"
        )
    if t["ck"] not in (4, 8):
        raise ValueError(f"TUNING['ck']: expected 4 or 8, got {t['ck']!r}")
    if t["ck"] != 8 and t["bwd_chunk_len"]:
        raise ValueError(
            f"TUNING['ck']: the time-chunked backward (bwd_chunk_len={t['bwd_chunk_len']}) "
            f"recomputes 8-step intervals, got ck={t['ck']}"
        )
    return t


def _lean_consts(tuning: dict, save_ck: bool) -> dict:
    """The forward kernel's lean-form constants from a ``_tuning`` result: ``LEAN``, the steps
    ``W`` of its blocks (8, or 4 when it saves checkpoints, unless set) and the step ``FORM``
    (0: classic, 1: ``_dynamics``' E_FORM, 2: E_FORM with ``Lv k`` formed once)."""
    lean = tuning["fwd_lean"]
    return dict(LEAN=lean, W=tuning["fwd_lean_steps"] or (4 if save_ck else 8),
                FORM=(2 if tuning["fwd_lk"] else 1) if lean else 0)  # fmt: skip


def _config(S: int, which: str, tuning: dict):
    """``(G, SG, NT, num_warps)``: ``SG`` slots a thread, ``G`` threads a channel, ``NT``
    threads a program."""
    SP = next_pow2(S)
    warps = tuning[which + "_warps"]  # (the interpreter runs the program's NT threads at once)
    NT = 32 * warps
    SG = max(min(tuning[which + "_slots"], SP), SP // NT)
    return SP // SG, SG, NT, warps


_PLANS: dict = {}  # launch plans by (which, shape and flags, TUNING); see _plan


def _plan(make, *key):
    """``make(*key)``, kept by ``key`` and ``TUNING`` as it is now: a launch configuration
    (sizes, grids, the kernel's constexprs) is a few microseconds of host time to derive, a
    share of a B=4 forward call. The cache is bounded (shapes come and go, varying L)."""
    full = (make, key, tuple(TUNING.items()))
    plan = _PLANS.get(full)
    if plan is None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        plan = _PLANS[full] = make(*key)
    return plan


def _fwd_plan(B, L, M, S, save_ck):
    """The forward's launch configuration for a shape (kept by :func:`_plan`)."""
    TU = _tuning(B * M * S)
    G, SG, NT, warps = _config(S, "fwd", TU)
    CK = TU["ck"]  # checkpoint interval (steps) of the backward's recomputation
    CL = TU["fwd_chunk_len"]
    NC = cdiv(L, CL) if CL else 1
    if NC > 1:
        assert CL % CK == 0, "chunks must start on checkpoints"
    N = B * M * S
    return dict(
        CK=CK, NB=cdiv(L, CK), NC=NC, CL=CL if NC > 1 else L, N=N,
        grid=(cdiv(M, NT // G), B, NC),
        maps=dict(NS=TU["NS"], G=G, SG=SG, NT=NT, num_warps=warps),
        carry=dict(zip(("BLOCK", "num_warps"), lanes_config(N), strict=True), NS=TU["NS"]),
        consts=dict(CK=CK, NS=TU["NS"], PREFETCH=TU["fwd_staging"] == "prefetch",
                    CHUNKED=NC > 1, G=G, SG=SG, NT=NT, AHEAD=TU["fwd_l2_ahead"],
                    BLOCK_PIPE=TU["fwd_staging"] == "pipeline",
                    OUT_SCATTER=TU["fwd_scatter_out"], IN_TILE=TU["fwd_tile_loads"],
                    KQ_TILE=TU["fwd_tile_kq"], EVEN_M=M % (NT // G) == 0,
                    **_lean_consts(TU, save_ck), num_warps=warps),
    )  # fmt: skip


_DEFAULT_STATES: dict = {}  # (shape, dtype, device) -> (ones, zeros), read-only


def _default_state(shape, dtype, device):
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


def _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
    """The forward kernel (and, time-chunked, its chunk passes). ``lam0, eta0`` None: the
    default initial state (1, 0), from :func:`_default_state`."""
    B, L, M = v.shape
    S = k.shape[-1]
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    P = _plan(_fwd_plan, B, L, M, S, save_ck)
    NB = P["NB"]
    dev = v.device
    y = empty((B, L, M), dtype=dtype, device=dev)
    yvar = empty((B, L, M), dtype=dtype, device=dev)
    lamT = empty((B, M, S), dtype=dtype, device=dev)
    etaT = empty((B, M, S), dtype=dtype, device=dev)
    prec = empty((B, L, M, S), dtype=dtype, device=dev) if save_prec else y
    ck = empty((2, B, NB, M, S), dtype=dtype, device=dev) if save_ck else y
    NC = P["NC"]
    start = y
    if lam0 is None:
        lam0, eta0 = _default_state((B, M, S), dtype, dev)
    if NC > 1:  # time-chunked: chunk maps, carries over the chunks, then every chunk re-run
        N = P["N"]
        comp = torch.empty((7, NC, N), dtype=dtype, device=dev)
        launch(_kla_chunk_maps_kernel, P["grid"],
            v, Lv, k, a, p, comp, L, M, P["CL"], S, **P["maps"])  # fmt: skip
        start = torch.empty((2, NC, N), dtype=dtype, device=dev)
        launch(_fwd_carry_kernel, (cdiv(N, P["carry"]["BLOCK"]),),
            comp, lam0.reshape(N), eta0.reshape(N), start, N, NC, **P["carry"])  # fmt: skip
    launch(_kla_fwd_kernel, P["grid"],
        v, Lv, k, q, a, p, lam0, eta0, y, yvar, lamT, etaT, prec, ck, start,
        L, M, NB, P["CL"], S, SAVE_PREC=save_prec, SAVE_CK=save_ck, **P["consts"])  # fmt: skip
    return y, yvar, lamT, etaT, (prec if save_prec else None), (ck if save_ck else None), P["CK"]


def _bwd_plan(B, L, M, S, CK):
    """The backward's launch configuration for a shape (kept by :func:`_plan`)."""
    TU = _tuning(B * M * S)
    G, SG, NT, warps = _config(S, "bwd", TU)
    NB = cdiv(L, CK)
    CL = TU["bwd_chunk_len"]
    assert CL % CK == 0, "backward chunks must hold whole checkpoint intervals"
    CI = CL // CK if CL else NB  # checkpoint intervals a chunk
    NC = cdiv(NB, CI)
    N = B * M * S
    nmb = cdiv(M, NT // G)
    return dict(
        NB=NB, CI=CI, NC=NC, N=N, nmb=nmb, grid=(nmb, B, NC),
        maps=dict(CK=CK, NS=TU["bwd_NS"], G=G, SG=SG, NT=NT, num_warps=warps),
        carry=dict(zip(("BLOCK", "num_warps"), lanes_config(N), strict=True), NS=TU["bwd_NS"]),
        consts=dict(CK=CK, NS=TU["bwd_NS"], CHUNKED=NC > 1, G=G, SG=SG, NT=NT,
                    AHEAD=TU["bwd_l2_ahead"], REUSE=TU["bwd_reuse_inputs"],
                    SPLIT=TU["bwd_split_tail"], SCATTER=TU["bwd_scatter_sums"],
                    TILE_IN=TU["bwd_tiles"], LEAN=TU["bwd_lean"], num_warps=warps),
    )  # fmt: skip


def _backward(v, Lv, k, q, a, p, ck, CK, gy, gyv, glT, geT, gprec):
    B, L, M = v.shape
    S = k.shape[-1]
    like = ck
    P = _plan(_bwd_plan, B, L, M, S, CK)
    NB, CI, NC, nmb = P["NB"], P["CI"], P["NC"], P["nmb"]

    def dense(gs, shape):  # gradients the caller left out (None) are zeros, one buffer for both
        if gs[0] is None and gs[1] is None:
            z = torch.zeros((2,) + shape, dtype=like.dtype, device=like.device)
            return z[0], z[1]
        return tuple(
            torch.zeros(shape, dtype=like.dtype, device=like.device) if g is None
            else g.contiguous() for g in gs)  # fmt: skip

    gy, gyv = dense((gy, gyv), (B, L, M))
    glT, geT = dense((glT, geT), (B, M, S))
    gv = empty((B, L, M), like)
    gLv = empty((B, L, M), like)
    gkq_part = empty((2, nmb, B, L, S), like)  # partial sums of gk, gq; one sum for both
    has_gprec = gprec is not None
    gprec = gprec.contiguous() if has_gprec else gy
    gap_part = empty((2, NC, B, M, S), like)  # partial sums of ga, gp by time chunk
    g0 = empty((2, B, M, S), like)
    xend = gy
    if NC > 1:  # time-chunked: adjoint chunk maps, carries from the end, then every chunk
        N = P["N"]
        maps = torch.empty((5, NC, N), dtype=like.dtype, device=like.device)
        launch(_kla_bwd_maps_kernel, P["grid"],
            v, Lv, k, q, a, p, ck, gy, gyv, gprec, maps, L, M, NB, B, CI, S,
            HAS_GPREC=has_gprec, **P["maps"])  # fmt: skip
        xend = torch.empty((2, NC, N), dtype=like.dtype, device=like.device)
        launch(_kla_bwd_carry_kernel, (cdiv(N, P["carry"]["BLOCK"]),),
            maps, glT, geT, xend, N, NC, **P["carry"])  # fmt: skip
    launch(_kla_bwd_kernel, P["grid"],
        v, Lv, k, q, a, p, ck, gy, gyv, glT, geT, gprec,
        gv, gLv, gkq_part[0], gkq_part[1], gap_part[0], gap_part[1], g0, xend,
        L, M, NB, B, CI, S, HAS_GPREC=has_gprec, **P["consts"])  # fmt: skip
    gkq = gkq_part.sum(1)  # (indexing, not unpacking: unbind is slower on the host)
    gap = gap_part.sum((1, 2))
    return gv, gLv, gkq[0], gkq[1], gap[0], gap[1], g0[0], g0[1]


class _KLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck):
        y, yvar, lamT, etaT, prec, ck, CK = _forward(v, Lv, k, q, a, p, lam0, eta0, save_prec,
                                                     save_ck)  # fmt: skip
        ctx.CK = CK
        ctx.init = lam0 is not None  # else the default state: not an input, no gradient
        # outputs without a gradient reach backward as None (it passes zeros for them once)
        ctx.set_materialize_grads(False)
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
        if not ctx.init:
            gl0 = ge0 = None
        return gv, gLv, gk, gq, ga, gp, gl0, ge0, None, None


def kla_triton(v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False):
    """Fused KLA op on CUDA tensors: ``(y, yvar, lam, eta, precision or None)``.

    Prepared inputs as ``kalmanscan.core.kla_op.kla_filter`` makes them (one dtype, exact
    shapes; ``lam0, eta0`` both None for the default initial state 1, 0, read from tensors kept
    for the shape); use ``kla_filter(..., backend="triton")`` rather than calling this
    directly.

    >>> import torch  # doctest: +SKIP
    >>> from kalmanscan.core.kla_op import kla_filter
    >>> B, L, M, S = 4, 2048, 960, 16
    >>> x = [torch.randn(B, L, M, device="cuda"), torch.rand(B, L, M, device="cuda") + 0.5,
    ...      torch.randn(B, L, S, device="cuda"), torch.randn(B, L, S, device="cuda")]
    >>> res = kla_filter(*x, torch.full((M, S), 0.9, device="cuda"),
    ...                  torch.full((M, S), 0.1, device="cuda"), backend="triton")
    """
    args = [x if x is None else x.contiguous()
            for x in (v, Lv, k, q, decay, process_var, lam0, eta0)]  # fmt: skip
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)):
        # nothing to differentiate: the forward kernel alone, without autograd's Function
        # machinery (about 15 us of host time a call)
        y, yvar, lamT, etaT, prec, _, _ = _forward(*args, bool(return_precision), False)
        return y, yvar, lamT, etaT, prec
    outs = _KLA.apply(*args, bool(return_precision), True)
    y, yvar, lamT, etaT = outs[:4]
    return y, yvar, lamT, etaT, (outs[4] if return_precision else None)
