"""The KLA op in parallel over chunks of time, for few lanes and long sequences (notation:
``kalmanscan/cuda/kla``'s docstring). :func:`kla_triton` takes this path where
:func:`tuning.chunks_for` gives ``C > 1`` chunks of ``Lc = L / C`` steps (``C`` divides ``L``,
so every chunk is a batch row of a view of the inputs and outputs, nothing copied).

A lane's step is linear on the homogeneous belief ``(u, v, e)`` (precision ``u / v``,
information ``e / v``; the scalar filter's form, ``kalmanscan/cuda/filter/kernels.py``)::

    predict:  u' = u + q v     v' = p u + d v     e' = af e     (q, d, af = 0, a^2, a;
                                                                  where a = 0: 1, p, 0)
    update:   u' = u + phi v   v' = v             e' = e + r v  (phi = Lv k^2, r = v Lv k)

so a chunk's steps compose into one map ``(u, v | e)``: a 2x2 block ``m`` on ``(u, v)`` and the
row ``e' = g1 u + g2 v + A e`` (divided by its trace every 4 steps; the ratios are exact).

Forward: (1) ``_chunk_maps_kernel`` composes every chunk's map, all chunks at once; (2)
``_carry_kernel`` walks each lane's maps to the state entering every chunk (a chunk whose map
overflowed, which 4 unnormalized steps do from about ``Lv k^2 p > 1e9`` a step in float32, it
walks step by step instead); (3) the forward
kernel (``forward.py``) runs on the ``[B C, Lc, ...]`` views of the inputs (every chunk a batch
row) from those states, writing the outputs and the backward's checkpoints.

Backward: the adjoint of a chunk's starting state is affine in that of its end state,
``G_start = J^T G_end + b``, with ``J`` the chunk's Jacobian and ``b`` the start adjoint that
the outputs' gradients inside the chunk give with zero at its end. (A)
``_adjoint_maps_kernel`` runs every chunk forward from its starting state with its tangents,
accumulating ``J`` and ``b`` (no recomputation, no reverse walk, nothing written a step); (B)
``_adjoint_carry_kernel`` walks them back to every chunk's true end adjoint; (C) the backward
kernel (``backward.py``) on the chunk rows from those gives the exact gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import cdiv, empty, helper, launch
from kalmanscan.cuda.filter.kernels import load_map, not_finite
from kalmanscan.cuda.kla import tuning
from kalmanscan.cuda.kla.backward import backward
from kalmanscan.cuda.kla.device import _dynamics, _load_tile, _prefetch_l2, _program, _rcp
from kalmanscan.cuda.kla.forward import default_state, forward

BLOCK = 128  # lanes (m, s) a program of the carry kernels
# pipeline stages of the carry kernels' loads: a chunk's map does not depend on the state the
# carry walks, so its loads are issued stages - 1 chunks ahead of the walk (the walk is otherwise
# bound by one load latency a chunk). 8, not 4 or 16: inside the LM step (H200, 6 layers,
# results/kla-lm-carry-fwd-walk-h200.json) the two carries 0.208 / 0.130 / 0.177 ms a step at
# 4 / 8 / 16 stages at 1 x 32,768 in 64 chunks, 0.070 / 0.073 / 0.098 at 2 x 8,192 in 16
CARRY_NS = 8
MAPS = 7  # m11, m12, m21, m22, g1, g2, A
# launches of the two map kernels, the chunk maps (MAPS_LAUNCH) and the tangent maps
# (TANGENT_LAUNCH), one warp a program: slots a thread (a thread walks SG slots of one channel,
# loading the channel's v, Lv once a step for them and its k, q as one vector), steps unrolled a
# loop iteration (their loads issued together; 4, 8 or 16), pipeline stages of those loads.
# Slots: H200, d_model 512, one layer (benchmarks/kla_chunk_kernels.py --maps-sweep,
# results/kla-chunk-maps-sweep-h200.json), 1 x 32,768 in 32 chunks / 2 x 8,192 in 16: chunk
# maps 0.58 / 0.29 ms at 2 slots against 0.80 / 0.41 at 1 (4 slots: 0.61 / 0.31). Unrolled
# steps and stages inside the KLA LM step (benchmarks/kla_lm_tuning.py,
# results/kla-lm-map-launch-h200.json, a step's 6 layers at 2 x 8,192): chunk maps 1.259 ms at
# 8 steps, 1.213 at 16; 2 or 3 pipeline stages 3.3x (chunk maps) and 8.6x (tangent maps)
# slower than 1; the chunk maps at 4 slots 1.69 / 3.23 ms against 1.21 / 2.27 at 2 (86
# registers). "pf": each block first asks L2 for the next block's rows, one program a 128-byte
# line of float32 channels asking (_leads, _prefetch_next): chunk maps 1.211 -> 1.162 ms at
# 2 x 8,192 (results/kla-lm-prefetch-h200.json). "db" (the tangent maps): the inputs
# double-buffered in registers, the next block's loaded before the current block's steps (no
# L2 prefetch then); in the LM step (results/kla-lm-double-buffer-h200.json) the tangent maps
# at 2 slots, 8 steps, double-buffered: 1.606 ms a step at 2 x 8,192 and 3.171 at 1 x 32,768,
# against 1.934 / 3.397 at the launches before (16 steps, 1 slot below 2^20 lanes x chunks
# and 2 from there, L2 prefetch), 1.812 at 2 slots without the buffer, 1.784 / 3.442 at 4 steps,
# 1.913 / 3.686 at 4 slots; the chunk maps double-buffered no faster (1.177 / 2.301 against
# 1.162 / 2.252 at 8 steps, 1.39 / 2.64 at 4), so they keep their loop. "maxnreg": a register
# cap for the launch (0: ptxas's choice); the double-buffered tangent maps take 128 registers
# uncapped, and Triton 3.6 builds them at 112 and 96 without spills. In the LM step
# (results/kla-lm-maxnreg-h200.json, two rounds): tangent maps 1.609 ms a step at 2 x 8,192
# uncapped, 1.584 at 112, 1.627 at 96; 3.161 / 3.114 / 3.167 at 1 x 32,768; the chunk maps
# capped at 96 no faster (1.172 / 2.311 against 1.171 / 2.281). Left uncapped: 112 gains
# 0.1 % of the step, and Triton 3.9 spills at it (72 bytes of stack; 8 at 120)
MAPS_LAUNCH = {"slots": 2, "unroll": 16, "NS": 1, "pf": 1}
TANGENT_LAUNCH = {"slots": 2, "unroll": 8, "NS": 1, "pf": 0, "db": 1, "maxnreg": 0}


def _launch(tangents=False):
    """``(name, launch)``: ``MAPS_LAUNCH``, or ``TANGENT_LAUNCH`` with ``tangents``."""
    return ("TANGENT_LAUNCH", TANGENT_LAUNCH) if tangents else ("MAPS_LAUNCH", MAPS_LAUNCH)


def _prefetches(tangents=False) -> bool:
    """Whether a map kernel asks L2 for its next block's rows (``"pf"`` of its launch,
    ``_launch``; ``_prefetch_next``)."""
    name, ml = _launch(tangents)
    pf = ml.get("pf", 0)
    if pf not in (0, 1, False, True):
        raise ValueError(f"chunked.{name}['pf']: expected 0 or 1, got {pf!r}")
    return bool(pf)


def _double_buffered(tangents=False) -> bool:
    """Whether the tangent maps double-buffer their inputs in registers (``"db"`` of
    ``TANGENT_LAUNCH``; the kernel's ``DB``, at 4 or 8 unrolled steps); the chunk maps take no
    ``"db"``."""
    name, ml = _launch(tangents)
    db = ml.get("db", 0)
    if db not in (0, 1, False, True):
        raise ValueError(f"chunked.{name}['db']: expected 0 or 1, got {db!r}")
    if db and not tangents:
        raise ValueError(f"chunked.{name}['db']: expected 0 (the chunk maps take no double "
                         f"buffer), got {db!r}")  # fmt: skip
    if db and ml["unroll"] not in (4, 8):
        raise ValueError(f"chunked.{name}['db']: needs 'unroll' 4 or 8, got {ml['unroll']!r}")
    return bool(db)


def _reg_cap(tangents=False) -> dict:
    """The launch's register cap as a compile option (``"maxnreg"`` of its launch, 0 or absent:
    ptxas's choice)."""
    name, ml = _launch(tangents)
    cap = ml.get("maxnreg", 0)
    if isinstance(cap, bool) or not isinstance(cap, int) or not (cap == 0 or 24 <= cap <= 255):
        raise ValueError(f"chunked.{name}['maxnreg']: expected 0 or an int in [24, 255], "
                         f"got {cap!r}")  # fmt: skip
    return {"maxnreg": cap} if cap else {}


def _maps_layout(S, tangents=False):
    """``(G, SG, NT, num_warps, W, NS)`` of a map kernel for ``S`` slots (its launch,
    ``_launch``)."""
    name, ml = _launch(tangents)
    if ml["unroll"] not in (4, 8, 16):
        raise ValueError(f"chunked.{name}['unroll']: expected 4, 8 or 16, got {ml['unroll']!r}")
    G, SG, NT, nw = tuning.layout(S, ml["slots"])
    return G, SG, NT, nw, ml["unroll"], ml["NS"]


@helper
def _map_step(m11, m12, m21, m22, g1, g2, A, vv, LL, kk, q, p, d, af, LEAN: tl.constexpr):
    """A chunk map after one more step (unnormalized): predict then update on ``(u, v | e)``
    (``vv, LL [NT]`` a thread's channel's, the rest ``[SG, NT]``). ``LEAN``: no lane of the
    program forgets (``q = 0``: its terms dropped, the same values) and ``A`` is left to the
    caller (``A af^4`` once every 4 steps)."""
    lk = LL[None, :] * kk
    phi = lk * kk
    r = vv[None, :] * lk
    if LEAN:
        pu1 = m11
        pu2 = m12
        A_new = A
    else:
        pu1 = m11 + q * m21
        pu2 = m12 + q * m22
        A_new = af * A
    pv1 = p * m11 + d * m21
    pv2 = p * m12 + d * m22
    return (pu1 + phi * pv1, pu2 + phi * pv2, pv1, pv2, af * g1 + r * pv1, af * g2 + r * pv2,
            A_new)  # fmt: skip


@helper
def _load_map_step(pm, pLm, ps, mmask, smask, m11, m12, m21, m22, g1, g2, A, q, p, d, af,
                   dt: tl.constexpr, LEAN: tl.constexpr = False,
                   EVEN: tl.constexpr = False):  # fmt: skip
    """``_map_step`` with the step's ``v, Lv`` at ``pm, pLm [NT]`` and ``k`` at ``ps``."""
    vv = _load_tile(pm, mmask, not EVEN).to(dt)
    LL = _load_tile(pLm, mmask, not EVEN).to(dt)
    kk = _load_tile(ps, smask, not EVEN).to(dt)
    return _map_step(m11, m12, m21, m22, g1, g2, A, vv, LL, kk, q, p, d, af, LEAN)


@helper
def _leads(G: tl.constexpr, NT: tl.constexpr):
    """Whether this program asks L2 for the rows of the programs beside it
    (``_prefetch_next``): one of the programs whose ``NT / G`` channels share a 128-byte line
    of a float32 row (each asking for the same lines multiplied L2's requests, and the
    tangent maps at 2 x 8,192 ran 1.96 -> 2.43 ms a step)."""
    per: tl.constexpr = 32 // (NT // G)  # (NT / G <= 32 channels a program)
    return tl.program_id(0) % per == 0


@helper
def _prefetch_next(pa, pb, pc, i, nb, M, W: tl.constexpr, NT: tl.constexpr,
                   THREE: tl.constexpr):  # fmt: skip
    """Ask L2 for the rows of block ``i + 1`` (of ``nb``; ``W`` steps) of ``[.., M]`` arrays
    whose rows of block ``i`` start at ``pa, pb`` (and ``pc`` with ``THREE``) (``[NT]``, a
    thread's channel): thread ``j`` takes row ``j % W`` of ``pa`` (``j < W``) or ``pb``, then of
    ``pc``; a row's lines hold the program's channels. The last block asks for its own rows
    again (nothing past the chunk). A map kernel's loads of a block wait on device memory (its
    warps' stalls are mostly long-scoreboard: Nsight Compute on the LM's tangent maps, 5.85 of
    11.1 cycles between a warp's instructions); with its rows in L2 they wait less."""
    j = tl.arange(0, NT)
    rows = (tl.where(i + 1 < nb, W, 0) + j % W) * M
    _prefetch_l2(tl.where(j < W, (pa + rows).to(tl.int64), (pb + rows).to(tl.int64)))
    if THREE:
        _prefetch_l2((pc + rows).to(tl.int64))


@helper
def _map_blocks(pm, pLm, ps, nb, mmask, lm, m11, m12, m21, m22, g1, g2, A, q, p, d, af,
                M: tl.constexpr, S: tl.constexpr, dt: tl.constexpr, W: tl.constexpr,
                NS: tl.constexpr, LEAN: tl.constexpr, EVEN: tl.constexpr,
                NT: tl.constexpr, PF: tl.constexpr, lead):  # fmt: skip
    """``nb`` unrolled blocks of ``W`` steps from the pointers, the map divided by its trace
    every 4 steps (``LEAN``: see ``_map_step``; ``A`` times ``af^4`` before each division);
    ``PF``: each block first asks L2 for the next one's ``v, Lv`` rows (``_prefetch_next``)."""
    af4 = (af * af) * (af * af)
    for i in tl.range(0, nb, num_stages=NS):
        if PF:
            if lead:
                _prefetch_next(pm, pLm, pLm, i, nb, M, W, NT, False)
        for h in tl.static_range(W // 4):
            for j in tl.static_range(4):
                m11, m12, m21, m22, g1, g2, A = _load_map_step(
                    pm + (4 * h + j) * M, pLm + (4 * h + j) * M, ps + (4 * h + j) * S, mmask, lm,
                    m11, m12, m21, m22, g1, g2, A, q, p, d, af, dt, LEAN, EVEN)  # fmt: skip
            if LEAN:
                A = A * af4
            m11, m12, m21, m22, g1, g2, A = _normalized(m11, m12, m21, m22, g1, g2, A)
        pm += W * M
        pLm += W * M
        ps += W * S
    return pm, pLm, ps, m11, m12, m21, m22, g1, g2, A


@helper
def _normalized(m11, m12, m21, m22, g1, g2, A):
    """The map divided by its trace (an approximate reciprocal: any positive scale leaves the
    map's ratios as they are)."""
    sc = _rcp(m11 + m22)
    return m11 * sc, m12 * sc, m21 * sc, m22 * sc, g1 * sc, g2 * sc, A * sc


@triton.jit
def _chunk_maps_kernel(
    v_ptr, Lv_ptr, k_ptr, a_ptr, p_ptr, maps_ptr,
    L, Lc, C, NR, M: tl.constexpr, S: tl.constexpr, G: tl.constexpr, SG: tl.constexpr,
    NT: tl.constexpr, W: tl.constexpr, NS: tl.constexpr, EVEN: tl.constexpr = False,
    PF: tl.constexpr = False,
):  # fmt: skip
    """One program (one warp): the lanes ``(m, s)`` of ``NT / G`` channels (``SG`` slots a
    thread) of chunk row ``b C + c`` (``program_id(1) = b (C - 1) + c``: the carry reads the
    maps of chunks ``0 .. C-2`` only, so the last chunk of a row has no program and its map is
    not written), whose ``Lc`` steps it composes into the map stored at ``maps [7, B C, M S]``.
    Steps run in unrolled blocks of ``W`` (4 or 8; their loads issued together), the map
    divided by its trace every 4 steps. ``M`` is a compile-time constant so that the unrolled
    steps' loads take their offsets as immediates, and ``EVEN`` (every lane real) drops their
    masks (unmasked loads issue no predicate and no zeroing of their destinations): the loops
    took 372 (lean) and 412 sm_90 instructions an 8-step block with a runtime ``M`` and masks,
    292 and 338 without."""
    b = tl.program_id(1) // (C - 1)
    c = tl.program_id(1) % (C - 1)
    row = b * C + c
    MS = M * S
    m, s, mo, mmask, smask, momask, jt, lm, ms, soff = _program(tl.program_id(0), b, M, S, G,
                                                                SG, NT)  # fmt: skip
    dt = maps_ptr.dtype.element_ty
    a = tl.load(a_ptr + ms, mask=lm, other=1.0).to(dt)
    p = tl.load(p_ptr + ms, mask=lm, other=1.0).to(dt)
    forget = a * a == 0.0
    q = tl.where(forget, 1.0, 0.0).to(dt)
    d = tl.where(forget, p, a * a)
    af = tl.where(forget, 0.0, a)
    one = tl.full([SG, NT], 1.0, dt)
    zero = tl.zeros([SG, NT], dt)
    m11, m12, m21, m22, g1, g2, A = one, zero, zero, one, zero, zero, one
    t0 = b.to(tl.int64) * L + c * Lc
    pm = v_ptr + t0 * M + m
    pLm = Lv_ptr + t0 * M + m
    ps = k_ptr + t0 * S + s
    nb = Lc // W
    # where no lane of the program forgets (the usual case) the lean step: 2-3 of its ~16
    # operations fewer
    lead = _leads(G, NT)
    if tl.max(tl.max(tl.where(lm & forget, 1, 0), axis=1), axis=0) == 0:
        pm, pLm, ps, m11, m12, m21, m22, g1, g2, A = _map_blocks(
            pm, pLm, ps, nb, mmask, lm, m11, m12, m21, m22, g1, g2, A, q, p, d, af, M, S, dt, W,
            NS, True, EVEN, NT, PF, lead)  # fmt: skip
    else:
        pm, pLm, ps, m11, m12, m21, m22, g1, g2, A = _map_blocks(
            pm, pLm, ps, nb, mmask, lm, m11, m12, m21, m22, g1, g2, A, q, p, d, af, M, S, dt, W,
            NS, False, EVEN, NT, PF, lead)  # fmt: skip
    for i in range(nb * W, Lc):  # the last Lc mod W steps
        m11, m12, m21, m22, g1, g2, A = _load_map_step(
            pm, pLm, ps, mmask, lm, m11, m12, m21, m22, g1, g2, A, q, p, d, af, dt, False,
            EVEN)  # fmt: skip
        if (i % 4) == 3:
            m11, m12, m21, m22, g1, g2, A = _normalized(m11, m12, m21, m22, g1, g2, A)
        pm += M
        pLm += M
        ps += S
    m11, m12, m21, m22, g1, g2, A = _normalized(m11, m12, m21, m22, g1, g2, A)
    out = maps_ptr + row.to(tl.int64) * MS + ms
    step = NR.to(tl.int64) * MS
    tl.store(out, m11, mask=lm)
    tl.store(out + step, m12, mask=lm)
    tl.store(out + 2 * step, m21, mask=lm)
    tl.store(out + 3 * step, m22, mask=lm)
    tl.store(out + 4 * step, g1, mask=lm)
    tl.store(out + 5 * step, g2, mask=lm)
    tl.store(out + 6 * step, A, mask=lm)


@helper
def _apply_map(mp, step, lam, eta, lm):
    """The state ``(lam, eta)`` through the chunk map at ``mp`` (entries ``step`` apart), and
    where the map or the result is not finite (``_chunk_maps_kernel``'s unnormalized steps
    overflowed: float32 from about ``Lv k^2 (p + d) > 1e9`` a step, where the sequential filter
    is still exact)."""
    m11, m12, m21, m22, g1, g2, A = load_map(mp, step, lm)
    rden = 1.0 / (m21 * lam + m22)
    eta = (g1 * lam + g2 + A * eta) * rden
    lam = (m11 * lam + m12) * rden
    bad = not_finite(((m11 + m12) + (m21 + m22)) + ((g1 + g2) + A) + (lam + eta))
    return lam, eta, bad & lm


@helper
def _walk_chunk(lam, eta, walk, v_ptr, Lv_ptr, k_ptr, row0, Lc, M, S, m, s, p, d, af, e,
                dt: tl.constexpr):  # fmt: skip
    """The lanes where ``walk``: the state after the ``Lc`` steps from row ``row0`` (``b L + c
    Lc``) walked one at a time (the forward's step, ``device._step_from``); the others as
    given."""
    for t in range(0, Lc):
        r = row0 + t
        vv = tl.load(v_ptr + r * M + m, mask=walk, other=0.0).to(dt)
        LL = tl.load(Lv_ptr + r * M + m, mask=walk, other=0.0).to(dt)
        kk = tl.load(k_ptr + r * S + s, mask=walk, other=0.0).to(dt)
        rden = _rcp(p * lam + d)
        lam_n = lam * rden + (LL * (kk * kk) + e)
        eta_n = af * rden * eta + (vv * LL) * kk
        lam = tl.where(walk, lam_n, lam)
        eta = tl.where(walk, eta_n, eta)
    return lam, eta


@triton.jit
def _carry_kernel(maps_ptr, lam0_ptr, eta0_ptr, start_ptr, v_ptr, Lv_ptr, k_ptr, a_ptr, p_ptr,
                  C, MS, NR, L, Lc, M, S, BLOCK: tl.constexpr,
                  NS: tl.constexpr = 1):  # fmt: skip
    """One program: ``BLOCK`` lanes of batch row ``program_id(1)``, from ``(lam0, eta0)``
    through the maps of chunks ``0 .. C-2``: the state entering every chunk,
    ``start [2, B C, M S]``. Where a lane's map of a chunk is not finite (``_apply_map``), the
    program walks its chunks again and that lane's bad chunks step by step from ``v, Lv, k``
    (the exact sequential state; any program only pays for this where a map overflowed)."""
    b = tl.program_id(1)
    ms = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lm = ms < MS
    dt = start_ptr.dtype.element_ty
    lam0 = tl.load(lam0_ptr + b.to(tl.int64) * MS + ms, mask=lm, other=1.0).to(dt)
    eta0 = tl.load(eta0_ptr + b.to(tl.int64) * MS + ms, mask=lm, other=0.0).to(dt)
    step = NR.to(tl.int64) * MS
    base = b.to(tl.int64) * C * MS + ms
    tl.store(start_ptr + base, lam0, mask=lm)
    tl.store(start_ptr + step + base, eta0, mask=lm)
    lam, eta = lam0, eta0
    bad = ms < 0
    for c in tl.range(0, C - 1, num_stages=NS):
        lam, eta, bad_c = _apply_map(maps_ptr + base + c * MS, step, lam, eta, lm)
        bad = bad | bad_c
        tl.store(start_ptr + base + (c + 1) * MS, lam, mask=lm)
        tl.store(start_ptr + step + base + (c + 1) * MS, eta, mask=lm)
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        m = ms // S
        s = ms % S
        p, d, af, e = _dynamics(a_ptr, p_ptr, ms, lm, dt)
        lam, eta = lam0, eta0
        for c in range(0, C - 1):
            lam_m, eta_m, bad_c = _apply_map(maps_ptr + base + c * MS, step, lam, eta, lm)
            if tl.max(bad_c.to(tl.int32), axis=0) > 0:
                lam, eta = _walk_chunk(lam, eta, bad_c, v_ptr, Lv_ptr, k_ptr,
                                       b.to(tl.int64) * L + c * Lc, Lc, M, S, m, s, p, d, af, e,
                                       dt)  # fmt: skip
            lam = tl.where(bad_c, lam, lam_m)
            eta = tl.where(bad_c, eta, eta_m)
            tl.store(start_ptr + base + (c + 1) * MS, lam, mask=lm)
            tl.store(start_ptr + step + base + (c + 1) * MS, eta, mask=lm)


@helper
def _tangent_step(lam, eta, R, Jee, bl, be, vv, LL, gyy, gvv, kk, qq, gpp, p, d, af, e, paf,
                  HAS_GPREC: tl.constexpr, HAS_GYV: tl.constexpr):  # fmt: skip
    """One step of the chunk's forward run with its tangents (``_adjoint_maps_kernel``;
    ``vv, LL, gyy, gvv [NT]`` a thread's channel's, the rest ``[SG, NT]``).

    ``d lam' / d lam = dfin / (p lam + d)^2`` is ``alpha^2`` (``dfin = af^2``: ``a^2`` where
    the decay is not 0, else 0), so ``Jll``, the product of those, is ``Jee^2``: not carried.
    ``Jel`` is carried as ``R = Jel / Jee``: ``Jel' = alpha (Jel - p rden eta Jee^2)`` and
    ``Jee' = alpha Jee`` give ``R' = R - p rden eta Jee = R - (p / af) eta Jee'`` (no division
    a step: ``paf = p / af`` is the lane's, ``_tangent_paf``; ``R`` stays bounded where ``Jee``
    decays). The output's gradient terms as in ``backward._adjoint_step``:
    ``ge = gy q / lam``, ``gl = gprec - (ge eta + gyv q^2 / lam) / lam``; with
    ``w = Jee / lam``, ``Jee ge = gy q w`` and ``Jee^2 gl = Jee^2 gprec - gy q w (w eta) -
    gyv q^2 w^2`` (without ``HAS_GPREC``, ``HAS_GYV`` their zero terms left out)."""
    rden = _rcp(p * lam + d)
    alpha = af * rden
    Jee = alpha * Jee
    R = R - paf * (eta * Jee)
    lk = LL[None, :] * kk
    lam = lam * rden + (lk * kk + e)
    eta = alpha * eta + vv[None, :] * lk
    w = Jee * _rcp(lam)
    x = (gyy[None, :] * qq) * w  # Jee ge
    # bl += Jee^2 gl + Jel ge = x (R - w eta) - w^2 gyv q^2 + Jee^2 gprec (a zero gyv read
    # changes nothing, bit for bit)
    bl = bl + x * (R - w * eta)
    if HAS_GYV:
        bl -= (w * w) * (gvv[None, :] * (qq * qq))
    if HAS_GPREC:
        bl += (Jee * Jee) * gpp
    return lam, eta, R, Jee, bl, be + x


@helper
def _tangent_paf(p, af):
    """``p / af`` of each lane for ``_tangent_step``, 0 where the decay is 0 or the quotient
    overflows: there ``Jee`` is 0 from the step on (or below ``af``, under ``p / 3e38``), so
    ``R`` is not read again where it matters (``Jel = R Jee``, ``bl``'s terms carry ``Jee``)."""
    paf = p / tl.where(af != 0.0, af, 1.0)
    return tl.where((af != 0.0) & (tl.abs(paf) < float("inf")), paf, 0.0)


@helper
def _load_tangent_step(pv, pL, pgy, pgv, pk, pq, pg, mmask, smask, lam, eta, R, Jee, bl, be,
                       p, d, af, e, paf, dt: tl.constexpr, M: tl.constexpr, S: tl.constexpr,
                       HAS_GPREC: tl.constexpr, HAS_GYV: tl.constexpr,
                       EVEN: tl.constexpr = False):  # fmt: skip
    """``_tangent_step`` with the step's inputs and incoming gradients at the pointers
    (``_tangent_inputs``; ``pg``: the precisions' gradient, read with ``HAS_GPREC``)."""
    vv, LL, gyy, gvv, kk, qq = _tangent_inputs(pv, pL, pgy, pgv, pk, pq, 0, M, S, mmask, smask,
                                               dt, HAS_GYV, EVEN)  # fmt: skip
    gpp = tl.zeros_like(kk)
    if HAS_GPREC:
        gpp = _load_tile(pg, smask, not EVEN).to(dt)
    return _tangent_step(lam, eta, R, Jee, bl, be, vv, LL, gyy, gvv, kk, qq, gpp, p, d, af, e, paf,
                         HAS_GPREC, HAS_GYV)  # fmt: skip


@helper
def _tangent_inputs(pv, pL, pgy, pgv, pk, pq, j: tl.constexpr, M: tl.constexpr,
                    S: tl.constexpr, mmask, smask, dt: tl.constexpr, HAS_GYV: tl.constexpr,
                    EVEN: tl.constexpr):  # fmt: skip
    """Step ``j``'s inputs of a block at the pointers, ``(vv, LL, gyy, gvv, kk, qq)``: ``pv, pL,
    pgy, pgv`` a thread's channel's (``[NT]``; ``pgv`` read with ``HAS_GYV``, else zeros),
    ``pk, pq`` its slots'."""
    vv = _load_tile(pv + j * M, mmask, not EVEN).to(dt)
    LL = _load_tile(pL + j * M, mmask, not EVEN).to(dt)
    gyy = _load_tile(pgy + j * M, mmask, not EVEN).to(dt)
    gvv = tl.zeros_like(gyy)
    if HAS_GYV:
        gvv = _load_tile(pgv + j * M, mmask, not EVEN).to(dt)
    kk = _load_tile(pk + j * S, smask, not EVEN).to(dt)
    qq = _load_tile(pq + j * S, smask, not EVEN).to(dt)
    return vv, LL, gyy, gvv, kk, qq


@helper
def _tangent_inputs4(pv, pL, pgy, pgv, pk, pq, h: tl.constexpr, M: tl.constexpr,
                     S: tl.constexpr, mmask, smask, dt: tl.constexpr, HAS_GYV: tl.constexpr,
                     EVEN: tl.constexpr):  # fmt: skip
    """The inputs of steps ``4 h .. 4 h + 3`` of a block, as a tuple of 4 step tuples."""
    return (_tangent_inputs(pv, pL, pgy, pgv, pk, pq, 4 * h, M, S, mmask, smask, dt, HAS_GYV,
                            EVEN),
            _tangent_inputs(pv, pL, pgy, pgv, pk, pq, 4 * h + 1, M, S, mmask, smask, dt,
                            HAS_GYV, EVEN),
            _tangent_inputs(pv, pL, pgy, pgv, pk, pq, 4 * h + 2, M, S, mmask, smask, dt,
                            HAS_GYV, EVEN),
            _tangent_inputs(pv, pL, pgy, pgv, pk, pq, 4 * h + 3, M, S, mmask, smask, dt,
                            HAS_GYV, EVEN))  # fmt: skip


@helper
def _tangent_block_inputs(pv, pL, pgy, pgv, pk, pq, M: tl.constexpr, S: tl.constexpr, mmask,
                          smask, dt: tl.constexpr, W: tl.constexpr, HAS_GYV: tl.constexpr,
                          EVEN: tl.constexpr):  # fmt: skip
    """A block's ``W`` (4 or 8) steps' inputs loaded into registers: a tuple of ``W / 4``
    tuples of 4 steps (``_tangent_inputs4``)."""
    a = _tangent_inputs4(pv, pL, pgy, pgv, pk, pq, 0, M, S, mmask, smask, dt, HAS_GYV, EVEN)
    if W == 4:
        return (a,)
    else:
        b = _tangent_inputs4(pv, pL, pgy, pgv, pk, pq, 1, M, S, mmask, smask, dt, HAS_GYV,
                             EVEN)  # fmt: skip
        return (a, b)


@helper
def _rows_on(pv, pL, pgy, pgv, pk, pq, rows, M: tl.constexpr, S: tl.constexpr):
    """The tangent maps' input pointers ``rows`` steps on (``[.., M]`` and ``[.., S]`` rows)."""
    return (pv + rows * M, pL + rows * M, pgy + rows * M, pgv + rows * M, pk + rows * S,
            pq + rows * S)  # fmt: skip


@helper
def _tangent_block(st, blk, p, d, af, e, paf, W: tl.constexpr, HAS_GYV: tl.constexpr):
    """The ``W`` steps of a block whose inputs are in registers (``_tangent_block_inputs``)
    from the state ``st = (lam, eta, R, Jee, bl, be)``."""
    lam, eta, R, Jee, bl, be = st
    for h in tl.static_range(W // 4):
        four = blk[h]
        for j in tl.static_range(4):
            vv, LL, gyy, gvv, kk, qq = four[j]
            # (no HAS_GPREC here: the gprec argument, kk, is not read)
            lam, eta, R, Jee, bl, be = _tangent_step(lam, eta, R, Jee, bl, be, vv, LL, gyy, gvv,
                                                     kk, qq, kk, p, d, af, e, paf, False,
                                                     HAS_GYV)  # fmt: skip
    return lam, eta, R, Jee, bl, be


@triton.jit
def _adjoint_maps_kernel(
    v_ptr, Lv_ptr, k_ptr, q_ptr, a_ptr, p_ptr, start_ptr, gy_ptr, gyv_ptr, gprec_ptr, out_ptr,
    L, Lc, C, NR, M: tl.constexpr, S: tl.constexpr, HAS_GPREC: tl.constexpr, G: tl.constexpr,
    SG: tl.constexpr, NT: tl.constexpr, W: tl.constexpr, NS: tl.constexpr,
    HAS_GYV: tl.constexpr, EVEN: tl.constexpr = False, PF: tl.constexpr = False,
    DB: tl.constexpr = False,
):  # fmt: skip
    """One program (one warp): the lanes of ``NT / G`` channels (``SG`` slots a thread) of chunk
    row ``program_id(1) = b C + c`` (``c > 0``), run forward from the chunk's starting state
    with its tangents: the chunk's Jacobian ``J`` (``Jll = d lam_end / d lam_start``, ``Jel =
    d eta_end / d lam_start``, ``Jee = d eta_end / d eta_start``) and ``b = sum_t J_t^T g_t``,
    the start adjoint that the outputs' gradients ``g_t`` inside the chunk give with zero at its
    end: ``out [5, B C, M S] = (bl, be, Jll, Jel, Jee)``. Steps in unrolled blocks of ``W``, as
    ``_chunk_maps_kernel`` (``M`` a compile-time constant, ``EVEN`` loads unmasked).

    ``DB`` (``W`` of 4 or 8, without ``HAS_GPREC``): the inputs double-buffered in registers,
    the next block's loaded before the current block's steps, so that a warp's loads wait
    under a block's arithmetic (the loop walks blocks in pairs, each pair's second block loaded
    before its first is walked and the next pair's first before its second: no copies between
    the buffers); without it a block's loads are issued at its top and its first step waits on
    them (long-scoreboard stalls: Nsight, results/ncu-kla-chunked-lm-h200.txt)."""
    row = tl.program_id(1)
    b = row // C
    c = row % C
    MS = M * S
    m, s, mo, mmask, smask, momask, jt, lm, ms, _soff = _program(tl.program_id(0), b, M, S, G,
                                                                 SG, NT)  # fmt: skip
    dt = out_ptr.dtype.element_ty
    p, d, af, e = _dynamics(a_ptr, p_ptr, ms, lm, dt)
    paf = _tangent_paf(p, af)
    step = NR.to(tl.int64) * MS
    soff = row.to(tl.int64) * MS + ms
    lam = tl.load(start_ptr + soff, mask=lm, other=1.0)
    eta = tl.load(start_ptr + step + soff, mask=lm, other=0.0)
    one = tl.full([SG, NT], 1.0, dt)
    zero = tl.zeros([SG, NT], dt)
    R, Jee, bl, be = zero, one, zero, zero  # R = Jel / Jee (_tangent_step)
    t0 = b.to(tl.int64) * L + c * Lc
    pm = t0 * M + m
    ps = t0 * S + s
    pv, pL, pgy, pgv = v_ptr + pm, Lv_ptr + pm, gy_ptr + pm, gyv_ptr + pm
    pk, pq = k_ptr + ps, q_ptr + ps
    pg = gprec_ptr + t0 * MS + ms
    n = Lc * (c > 0).to(tl.int32)  # (chunk 0's start adjoint is the backward kernel's)
    lead = _leads(G, NT)
    nb = n // W
    nloop = nb  # blocks the plain loop walks
    if DB and not HAS_GPREC:
        if nb > 0:
            st = (lam, eta, R, Jee, bl, be)
            cur = _tangent_block_inputs(pv, pL, pgy, pgv, pk, pq, M, S, mmask, lm, dt, W,
                                        HAS_GYV, EVEN)  # fmt: skip
            for i in tl.range(0, nb // 2, num_stages=1):
                o1 = (2 * i + 1) * W  # the pair's second block (inside: 2 i + 1 < nb)
                nxt = _tangent_block_inputs(pv + o1 * M, pL + o1 * M, pgy + o1 * M,
                                            pgv + o1 * M, pk + o1 * S, pq + o1 * S, M, S,
                                            mmask, lm, dt, W, HAS_GYV, EVEN)  # fmt: skip
                st = _tangent_block(st, cur, p, d, af, e, paf, W, HAS_GYV)
                # the next pair's first block (the last block again past the end: unused)
                o2 = tl.minimum(2 * i + 2, nb - 1) * W
                cur = _tangent_block_inputs(pv + o2 * M, pL + o2 * M, pgy + o2 * M,
                                            pgv + o2 * M, pk + o2 * S, pq + o2 * S, M, S,
                                            mmask, lm, dt, W, HAS_GYV, EVEN)  # fmt: skip
                st = _tangent_block(st, nxt, p, d, af, e, paf, W, HAS_GYV)
            if nb % 2 == 1:  # the last block, loaded as the next pair's first
                st = _tangent_block(st, cur, p, d, af, e, paf, W, HAS_GYV)
            lam, eta, R, Jee, bl, be = st
            pv, pL, pgy, pgv, pk, pq = _rows_on(pv, pL, pgy, pgv, pk, pq, nb * W, M, S)
        nloop = 0  # (the blocks are walked)
    for i in tl.range(0, nloop, num_stages=NS):
        if PF:  # the next block's v, Lv, gy rows into L2 (_prefetch_next)
            if lead:
                _prefetch_next(pv, pL, pgy, i, nb, M, W, NT, True)
        for j in tl.static_range(W):
            lam, eta, R, Jee, bl, be = _load_tangent_step(
                pv + j * M, pL + j * M, pgy + j * M, pgv + j * M, pk + j * S, pq + j * S,
                pg + j * MS, mmask, lm, lam, eta, R, Jee, bl, be, p, d, af, e, paf, dt, M, S,
                HAS_GPREC, HAS_GYV, EVEN)  # fmt: skip
        pv, pL, pgy, pgv, pk, pq = _rows_on(pv, pL, pgy, pgv, pk, pq, W, M, S)
        pg += W * MS  # (a pointer: i M S can pass 2^31)
    for _ in range(nb * W, n):  # the last n mod W steps
        lam, eta, R, Jee, bl, be = _load_tangent_step(
            pv, pL, pgy, pgv, pk, pq, pg, mmask, lm, lam, eta, R, Jee, bl, be, p, d, af, e, paf,
            dt, M, S, HAS_GPREC, HAS_GYV, EVEN)  # fmt: skip
        pv += M
        pL += M
        pgy += M
        pgv += M
        pk += S
        pq += S
        pg += MS
    out = out_ptr + soff
    tl.store(out, bl, mask=lm)
    tl.store(out + step, be, mask=lm)
    tl.store(out + 2 * step, Jee * Jee, mask=lm)  # Jll (see _tangent_step)
    tl.store(out + 3 * step, R * Jee, mask=lm)  # Jel
    tl.store(out + 4 * step, Jee, mask=lm)


@triton.jit
def _adjoint_carry_kernel(amap_ptr, gend_ptr, C, MS, NR, BLOCK: tl.constexpr, NS: tl.constexpr = 1):
    """One program: ``BLOCK`` lanes of batch row ``program_id(1)``: from the op's end adjoint
    (in the last chunk's rows of ``gend [2, B C, M S]``) back through the chunks' adjoint maps
    (``_adjoint_maps_kernel``), ``G_end(c-1) = J_c^T G_end(c) + b_c``, into the rows of chunks
    ``0 .. C-2``."""
    b = tl.program_id(1)
    ms = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lm = ms < MS
    step = NR.to(tl.int64) * MS
    base = b.to(tl.int64) * C * MS + ms
    last = base + (C - 1) * MS
    Gl = tl.load(gend_ptr + last, mask=lm, other=0.0)
    Ge = tl.load(gend_ptr + step + last, mask=lm, other=0.0)
    for j in tl.range(0, C - 1, num_stages=NS):
        off = last - j * MS
        bl = tl.load(amap_ptr + off, mask=lm, other=0.0)
        be = tl.load(amap_ptr + step + off, mask=lm, other=0.0)
        Jll = tl.load(amap_ptr + 2 * step + off, mask=lm, other=0.0)
        Jel = tl.load(amap_ptr + 3 * step + off, mask=lm, other=0.0)
        Jee = tl.load(amap_ptr + 4 * step + off, mask=lm, other=0.0)
        Gl, Ge = Jll * Gl + Jel * Ge + bl, Jee * Ge + be
        tl.store(gend_ptr + off - MS, Gl, mask=lm)
        tl.store(gend_ptr + step + off - MS, Ge, mask=lm)


def _even(M, S, G, SG, NT) -> bool:
    """Whether every lane of every map program is real: the programs' ``NT / G`` channels
    divide ``M`` and the ``G SG`` slots of a channel are all real (the kernels' ``EVEN``)."""
    return M % (NT // G) == 0 and S == G * SG


def _rows(x, R, Lc):
    """``[B, L, ...] -> [B C, Lc, ...]``: every chunk a batch row (a view)."""
    return x.reshape((R, Lc) + tuple(x.shape[2:]))


def chunk_starts(v, Lv, k, a, p, lam0, eta0, C):
    """``(maps [7, B C, M S], start [2, B C, M, S])``: the chunks' maps (the last chunk's of
    each row not written) and the state ``(lam, eta)`` entering each of the ``C`` chunks of
    ``L / C`` steps."""
    B, L, M = v.shape
    S = k.shape[-1]
    R, Lc, MS = B * C, L // C, M * S
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    maps = empty((MAPS, R, MS), dtype=dtype, device=v.device)
    G, SG, NT, nw, W, NS = _maps_layout(S)
    if C > 1:  # (one chunk: the carry reads no map)
        launch(_chunk_maps_kernel, (cdiv(M, NT // G), B * (C - 1)),
               v, Lv, k, a, p, maps, L, Lc, C, R, M=M, S=S, G=G, SG=SG, NT=NT, W=W, NS=NS,
               EVEN=_even(M, S, G, SG, NT), PF=_prefetches(), num_warps=nw,
               **_reg_cap())  # fmt: skip
    if lam0 is None:
        lam0, eta0 = default_state((B, M, S), dtype, v.device)
    start = empty((2, R, M, S), dtype=dtype, device=v.device)
    launch(_carry_kernel, (cdiv(MS, BLOCK), B),
           maps, lam0, eta0, start, v, Lv, k, a, p, C, MS, R, L, L // C, M, S, BLOCK=BLOCK,
           NS=CARRY_NS, num_warps=4)  # fmt: skip
    return maps, start


def forward_chunked(v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck, C, var=True):
    """The forward in ``C`` chunks: ``(y, yvar, lamT, etaT, prec or None, ck or None, CK,
    maps, start)``; ``ck`` the checkpoints of the chunk rows (``backward_chunked``); ``yvar``
    None where ``var`` is False."""
    B, L, M = v.shape
    S = k.shape[-1]
    R, Lc = B * C, L // C
    maps, start = chunk_starts(v, Lv, k, a, p, lam0, eta0, C)
    y, yvar, lamT, etaT, prec, ck, CK = forward(
        _rows(v, R, Lc), _rows(Lv, R, Lc), _rows(k, R, Lc), _rows(q, R, Lc), a, p,
        start[0], start[1], save_prec, save_ck, var)  # fmt: skip
    # the last chunks' final states, as views (a copy would be two kernels a call, and the
    # training path reads neither)
    lamT = lamT.view(B, C, M, S)[:, -1]
    etaT = etaT.view(B, C, M, S)[:, -1]
    if prec is not None:
        prec = prec.view(B, L, M, S)
    yvar = None if yvar is None else yvar.view(B, L, M)
    return y.view(B, L, M), yvar, lamT, etaT, prec, ck, CK, maps, start


def backward_chunked(v, Lv, k, q, a, p, ck, CK, start, C, gy, gyv, glT, geT, gprec):
    """The gradients ``(gv, gLv, gk, gq, ga, gp, gl0, ge0)`` of the chunked forward (the
    module's docstring: passes A, B, C; ``C = 1`` is the plain backward)."""
    B, L, M = v.shape
    S = k.shape[-1]
    R, Lc, MS = B * C, L // C, M * S
    like = ck
    gy = torch.zeros((B, L, M), dtype=like.dtype, device=like.device) if gy is None else gy
    has_gyv = gyv is not None  # else zero: not read (the kernels take gy in its place)
    gy = gy.contiguous()
    gyv = gyv.contiguous() if has_gyv else gy
    has_gprec = gprec is not None
    gprec = gprec.contiguous() if has_gprec else gy
    # end adjoints of the chunk rows: the op's in the last chunk's, the others from pass B
    # (which writes every row of chunks 0 .. C-2: only the last chunk's are set here)
    gend = empty((2, B, C, M, S), like)
    gend[:, :, -1].zero_()
    if glT is not None:
        gend[0, :, -1] = glT
    if geT is not None:
        gend[1, :, -1] = geT
    gend = gend.view(2, R, M, S)
    if C > 1:
        amap = empty((5, R, MS), like)
        G, SG, NT, nw, W, NS = _maps_layout(S, tangents=True)
        launch(_adjoint_maps_kernel, (cdiv(M, NT // G), R),
               v, Lv, k, q, a, p, start, gy, gyv, gprec, amap, L, Lc, C, R, M=M, S=S,
               HAS_GPREC=has_gprec, G=G, SG=SG, NT=NT, W=W, NS=NS, HAS_GYV=has_gyv,
               EVEN=_even(M, S, G, SG, NT), PF=_prefetches(True), DB=_double_buffered(True),
               num_warps=nw, **_reg_cap(True))  # fmt: skip
        launch(_adjoint_carry_kernel, (cdiv(MS, BLOCK), B),
               amap, gend, C, MS, R, BLOCK=BLOCK, NS=CARRY_NS, num_warps=4)  # fmt: skip
    rows = [_rows(x, R, Lc) for x in (v, Lv, k, q, gy, gyv)]
    gv, gLv, gk, gq, ga, gp, gl0, ge0 = backward(
        *rows[:4], a, p, ck, CK, rows[4], rows[5] if has_gyv else None, gend[0], gend[1],
        _rows(gprec, R, Lc) if has_gprec else None)  # fmt: skip
    gl0 = gl0.view(B, C, M, S)[:, 0]
    ge0 = ge0.view(B, C, M, S)[:, 0]
    return (gv.view(B, L, M), gLv.view(B, L, M), gk.view(B, L, S), gq.view(B, L, S), ga, gp,
            gl0, ge0)  # fmt: skip
