"""Device helpers of the KLA kernels that both directions use: the inline-PTX primitives with
their interpreter twins, the per-lane layout, the predict step, tile loads of 4 steps and the
reduce-scatters over a channel's threads. Notation and shapes: ``kalmanscan/cuda/kla``'s
docstring.

Under ``TRITON_INTERPRET=1`` a primitive that has no numpy meaning (a PTX instruction) has a
plain-Python twin with the same result, so the CPU tests run every line of the kernels. The
reciprocal (``rcp.approx.ftz`` in float32) is the general filter's ``rcp``.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from kalmanscan.cuda._common import helper, interpreting
from kalmanscan.cuda.filter.kernels import rcp as _rcp

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
def _group_sum(x, G: tl.constexpr, NT: tl.constexpr):
    """``[NT] -> [NT // G]``: the sum over the ``G`` neighbouring threads of each channel."""
    return tl.sum(tl.reshape(x, [NT // G, G]), axis=1)


@helper
def _pick(x, sel, axis: tl.constexpr):
    """The entries of ``x`` where ``sel`` (one a position along ``axis``, an axis a thread holds
    in its registers), summed out: as integers (the float bits), so that with the selects folded
    (``sel`` a constant of each register) the sum's additions of 0 fold away too and no
    instruction remains. (Float sums of ``x`` and a -0.0 fill kept one addition of +0.0 an entry
    on Triton 3.6, whose lowering turned the fill into +0.0: 144 of the backward's 8-step
    interval, 36 of the forward's 4-step block.)"""
    ity: tl.constexpr = tl.int64 if x.dtype == tl.float64 else tl.int32
    bits = tl.where(sel, x.to(ity, bitcast=True), 0)
    return tl.sum(bits, axis=axis).to(x.dtype, bitcast=True)


@helper
def _row(x, i: tl.constexpr, SG: tl.constexpr):
    """Row ``i`` of a ``[SG, NT]`` tile (a register of each thread: ``_pick``)."""
    return _pick(x, tl.arange(0, SG)[:, None] == i, 0)


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
def _program(pm, b, M, S: tl.constexpr, G: tl.constexpr, SG: tl.constexpr, NT: tl.constexpr):
    """The lanes of program ``pm`` of batch row ``b`` (``_lanes``), with the thread index ``jt``,
    the lane mask, the lanes' offsets ``ms`` in an ``[M, S]`` array and ``state_off`` in a
    ``[B, M, S]`` one."""
    m, s, mo, so, mmask, smask, momask, somask = _lanes(pm, M, S, G, SG, NT)
    jt = tl.arange(0, NT)
    lane_mask = smask & mmask[None, :]
    ms = m[None, :] * S + s
    state_off = b.to(tl.int64) * M * S + ms
    return m, s, mo, mmask, smask, momask, jt, lane_mask, ms, state_off


@helper
def _dynamics(a_ptr, p_ptr, ms, mask, dt: tl.constexpr):
    """Per-lane constants of the predict step ``lam_pred = lam / (p lam + d) + e``,
    ``alpha = af / (p lam + d)``: ``(p, d, af, e)``. ``e = 0`` but where the decay is 0 (total
    forgetting), and there ``d = inf`` (so ``1 / (p lam + d) = 0``, ``alpha = 0``) and
    ``e = 1 / p``; ``e`` joins ``Lv k^2`` in one fused multiply-add."""
    a = tl.load(a_ptr + ms, mask=mask, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=mask, other=1.0).to(dt)
    forget = a * a == 0.0
    af = tl.where(forget, 0.0, a)
    d = tl.where(forget, float("inf"), a * a)
    e = tl.where(forget, _rcp(p), 0.0)
    return p, d, af, e


@helper
def _step_from(lam, eta, p, d, af, e, v, Lv, kk):
    """The state ``(lam, eta)`` after one step with loaded inputs (the forward's and the
    backward's recomputation): ``phi = Lv k^2``, ``r = v Lv k``."""
    rden = _rcp(p * lam + d)
    lam_new = lam * rden + (Lv[None, :] * (kk * kk) + e)
    return lam_new, af * rden * eta + (v * Lv)[None, :] * kk


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
    """Two ``[B, L, M]`` arrays at the 4 steps from ``t`` and the program's channels, each
    loaded as one ``[4, NT / G]`` tile (``_vl_rows``; with ``MASKED`` zeros past ``L``)."""
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
    r0 = _pick(xb, i == 0, 0)
    r1 = _pick(xb, i == 1, 0)
    r2 = _pick(xb, i == 2, 0)
    r3 = _pick(xb, i == 3, 0)
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
def _scatter_store4(y0, y1, y2, y3, v0, v1, v2, v3, c, ptr_a, ptr_b, mask, G: tl.constexpr,
                    VAR: tl.constexpr):  # fmt: skip
    """Store ``y, yvar`` of 4 steps from each thread's sums over its slots (``[NT]``) by a
    reduce-scatter over the ``G`` (4 or 8) threads of a channel: 2 (3) butterfly rounds each
    exchange half the values left, 6 (7) shuffles a thread where 4 all-reduces take 16 (24) and
    a layout shuffle 8, and leave each thread one step's sums, which it stores. ``c``: the
    thread's place among the threads of its channel. ``G = 4``: thread ``c`` holds step ``c``'s
    ``y`` and ``yvar`` and stores them at ``ptr_a`` and ``ptr_b``; ``G = 8``: it holds ``y`` of
    step ``c`` below 4, ``yvar`` of step ``c - 4`` above, and stores it at ``ptr_a``. (The
    backward stores ``gv, gLv`` the same way.) ``VAR`` False: the ``yvar`` values are not
    stored."""
    if G == 8:  # values 0-3: y of the steps, 4-7: yvar
        w = _reduce_scatter8(y0, y1, y2, y3, v0, v1, v2, v3, c, 1)  # value c's sum
        if VAR:
            tl.store(ptr_a, w, mask=mask)
        else:
            tl.store(ptr_a, w, mask=mask & (c < 4))
    else:  # G == 4: y of steps (0, 2), (1, 3) and the same of yvar, then (0, 1) of each
        hi = ((c >> 1) & 1) == 1
        a0 = _swap_add(y0, y2, hi, 2)
        a1 = _swap_add(y1, y3, hi, 2)
        b0 = _swap_add(v0, v2, hi, 2)
        b1 = _swap_add(v1, v3, hi, 2)
        lo = (c & 1) == 1
        tl.store(ptr_a, _swap_add(a0, a1, lo, 1), mask=mask)
        if VAR:
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
