"""The Triton kernels of the fused dense filter and smoother and their device helpers
(``[NP, NP]`` tile algebra, Gauss-Jordan solves, the square-root update). The algorithm, its
notation and the launch order are :mod:`kalmanscan.cuda.dense`'s, which launches them.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper

LOG_2PI = tl.constexpr(math.log(2 * math.pi))


@helper
def _mm(X, Y):
    """X @ Y for [NP, NP] tiles."""
    return tl.sum(X[:, :, None] * Y[None, :, :], axis=1)


@helper
def _mmt(X, Y):
    """X @ Y' for [NP, NP] tiles."""
    return tl.sum(X[:, None, :] * Y[None, :, :], axis=2)


@helper
def _mtm(X, Y):
    """X' @ Y for [NP, NP] tiles."""
    return tl.sum(X[:, :, None] * Y[:, None, :], axis=0)


@helper
def _mv(X, v):
    """X @ v for a [NP, NP] tile and a [NP] vector."""
    return tl.sum(X * v[None, :], axis=1)


@helper
def _mtv(X, v):
    """X' @ v."""
    return tl.sum(X * v[:, None], axis=0)


@helper
def _sym(X):
    return 0.5 * (X + tl.trans(X))


@helper
def _sym_halved(X):
    """:func:`_sym` halved first: no overflow where ``X + X'`` would pass the range (a
    prediction in the top binade, finite on the CPU backends); the same bits where the halves
    are normal. Only for the filter's and the carries' predictions and updates (one more
    temporary: in the scan's composition at NP = 8 it spilled registers on sm_90)."""
    return 0.5 * X + 0.5 * tl.trans(X)


@helper
def _row(ptr, k, D: tl.constexpr, n, cols):
    """Row k of a [D, n] matrix at ``ptr`` as a [NP] vector (0 in the padding)."""
    return tl.load(ptr + k * n + cols, mask=cols < n, other=0.0)


@helper
def _solve_spd(M, X, rv, ri, cj, n, NP: tl.constexpr):
    """``M^-1 X`` for an SPD [NP, NP] tile ``M`` (padding set to the identity) by Gauss-Jordan
    without pivoting (the pivots of an SPD matrix are positive)."""
    pad = (ri == cj) & (ri >= n)
    M = tl.where(pad, 1.0, M)
    for k in tl.static_range(NP):
        rowM = tl.sum(tl.where(ri == k, M, 0.0), axis=0)
        rowX = tl.sum(tl.where(ri == k, X, 0.0), axis=0)
        colM = tl.sum(tl.where(cj == k, M, 0.0), axis=1)
        piv = tl.sum(tl.where(rv == k, rowM, 0.0), axis=0)
        rowM = rowM / piv
        rowX = rowX / piv
        M = tl.where(ri == k, rowM[None, :], M - colM[:, None] * rowM[None, :])
        X = tl.where(ri == k, rowX[None, :], X - colM[:, None] * rowX[None, :])
    return X


@helper
def _inv_spd(P, rv, ri, cj, n, NP: tl.constexpr):
    """Inverse of an SPD [NP, NP] tile (padding set to the identity) by Gauss-Jordan."""
    return _solve_spd(P, tl.where(ri == cj, 1.0, 0.0).to(P.dtype), rv, ri, cj, n, NP)


@helper
def _screened(M, rv, ri, cj, n, bound, NP: tl.constexpr):
    """:func:`kalmanscan.dense.singular.screen` of a PSD [NP, NP] tile (padding zero): True where
    ``max |diag M| max |diag M^-1| >= bound`` (``1 / (tol n^2)``) or the inverse is not finite (a
    singular M's Gauss-Jordan meets a zero pivot)."""
    Minv = _inv_spd(M, rv, ri, cj, n, NP)
    on = (ri == cj) & (ri < n)
    dm = tl.max(tl.max(tl.where(on, tl.abs(M), 0.0), axis=1), axis=0)
    di = tl.max(tl.max(tl.where(on, tl.abs(Minv), 0.0), axis=1), axis=0)
    # max drops NaN (PTX max, the interpreter's maximum): the non-finite entries counted apart
    # (x - x is 0 exactly where x is finite)
    nonfinite = tl.sum(tl.sum(tl.where(Minv - Minv == 0.0, 0, 1), axis=1), axis=0)
    return (nonfinite > 0) | (dm * di >= bound)


@triton.jit
def gate(
    F_ptr, Q_ptr, P_ptr, sPb, sPi, sPj, pre_ptr, word_ptr,
    n, bound,
    K: tl.constexpr, NP: tl.constexpr,
):  # fmt: skip
    """Series ``pid0``: bit ``K`` of ``word`` [1] (int32, zero) set where a direction of the state
    may be known exactly, :func:`kalmanscan.dense.singular.gate` for this backend's model class
    (time-invariant F and Q, a proper prior, a positive-definite R): ``F F' + Q`` or the prior
    covariance flagged by the screen. Program 0 also sets bit ``k`` for the ``K`` bools at
    ``pre`` (the launch's other flags: one word read back, one synchronization)."""
    s = tl.program_id(0).to(tl.int64)
    rv, ri, cj, mm, Fm, Qm = _series_dynamics(F_ptr, Q_ptr, s, n, NP)
    Pm = tl.load(P_ptr + s * sPb + ri * sPi + cj * sPj, mask=mm, other=0.0)
    flagged = _screened(_sym(_mmt(Fm, Fm) + Qm), rv, ri, cj, n, bound, NP)
    flagged = flagged | _screened(_sym(Pm), rv, ri, cj, n, bound, NP)
    if flagged:
        tl.atomic_or(word_ptr, 1 << K)
    if s == 0:
        for k in tl.static_range(K):
            if tl.load(pre_ptr + k).to(tl.int32) != 0:
                tl.atomic_or(word_ptr, 1 << k)


@helper
def _program_model(F_ptr, Q_ptr, c_ptr, n, NP: tl.constexpr):
    """A chunk program's indices and its series' dynamics: ``(chunk, series, rv, ri, cj, mask,
    F, Q, c)``, the matrices as ``[NP, NP]`` tiles padded with zeros."""
    ch = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    rv, ri, cj, mm, Fm, Qm = _series_dynamics(F_ptr, Q_ptr, s, n, NP)
    cv = tl.load(c_ptr + s * n + rv, mask=rv < n, other=0.0)
    return ch, s, rv, ri, cj, mm, Fm, Qm, cv


@helper
def _series_dynamics(F_ptr, Q_ptr, s, n, NP: tl.constexpr):
    """Series ``s``'s ``(rv, ri, cj, mask, F, Q)``, the matrices as ``[NP, NP]`` tiles padded
    with zeros."""
    rv = tl.arange(0, NP)
    ri = rv[:, None]
    cj = rv[None, :]
    mm = (ri < n) & (cj < n)
    Fm = tl.load(F_ptr + s * n * n + ri * n + cj, mask=mm, other=0.0)
    Qm = tl.load(Q_ptr + s * n * n + ri * n + cj, mask=mm, other=0.0)
    return rv, ri, cj, mm, Fm, Qm


@helper
def _entry(H_ptr, r_ptr, z_ptr, s, t, T, k, n, h0, r0, rv, D: tl.constexpr):
    """Entry ``k`` of step ``t``: its row ``h``, variance ``r`` and value ``zk`` (NaN: missing);
    with D = 1 the row and variance loaded once, ``h0, r0``."""
    if D == 1:
        h = h0
        r = r0
    else:
        h = _row(H_ptr + s * D * n, k, D, n, rv)
        r = tl.load(r_ptr + s * D + k)
    return h, r, tl.load(z_ptr + (s * T + t) * D + k)


@triton.jit
def chunk_elements(
    z_ptr, F_ptr, c_ptr, Q_ptr, H_ptr, r_ptr, E_ptr, word_ptr,
    T, n, L, NC,
    NP: tl.constexpr, D: tl.constexpr, ACCURATE: tl.constexpr,
):  # fmt: skip
    """Chunk ``pid0`` of series ``pid1``: E [B, NC, 3 NP + 2, NP], rows A, C, J, b, eta.

    ``(b, C)`` is the filter's ``(m, P)`` from ``x_{i-1} = 0``. A step with ``n`` or more
    observed entries each 1e4 times more precise than its prediction (``r < WHOLE_RATIO s``:
    entries that shrink ``C`` in every direction) forms ``C`` in its scalar updates as a
    difference of prediction-sized terms, ``eps s`` off; where the next predictions grow that
    past Q (``|F|_F^2 s > tr Q / WHOLE_RATIO``: an explosive F) it is all of the next chunk's
    carried start over a gap (1.8e-2 of it where F = 1000 I leaves a step at 0.7 after a 4e5
    prediction). Such a chunk sets :data:`SHRUNK` in ``word`` [1], and the caller launches again
    with ``ACCURATE``: a second pass over ``(b, C)`` alone takes them at those steps in
    information form, ``C = (C_pred^-1 + sum h h' / r)^-1``, ``b = C (C_pred^-1 b_pred + sum h z
    / r)``, sums of positive terms (1.7e-7 off there). ``A, J, eta`` keep the first pass's:
    their rounding lies along the directions the step determines, which ``J`` then pins in the
    carry. The ordinary launch (``ACCURATE`` off) adds two compares per observed entry to each
    step, no reduction (a trace per step took 16 more registers at NP = 8 on sm_90)."""
    ch, s, rv, ri, cj, mm, Fm, Qm, cv = _program_model(F_ptr, Q_ptr, c_ptr, n, NP)
    A = tl.where(ri == cj, 1.0, 0.0).to(Fm.dtype)
    C = tl.zeros([NP, NP], Fm.dtype)
    J = tl.zeros([NP, NP], Fm.dtype)
    b = tl.zeros([NP], Fm.dtype)
    eta = tl.zeros([NP], Fm.dtype)
    t0 = ch * L
    t1 = tl.minimum(t0 + L, T)
    h0 = _row(H_ptr + s * n, 0, D, n, rv)  # D = 1: the entry's row and variance (else unused)
    r0 = tl.load(r_ptr + s)
    # a precise entry's rounding, eps s, shows where the next predictions grow it past Q: s
    # above tr Q / (WHOLE_RATIO |F|_F^2) (an explosive F; else Q swamps it)
    grown = tl.sum(tl.sum(tl.where(ri == cj, Qm, 0.0), axis=1), axis=0) / (
        WHOLE_RATIO * tl.sum(tl.sum(Fm * Fm, axis=1), axis=0)
    )
    shrunk = 0
    for t in tl.range(t0, t1):
        A = _mm(Fm, A)
        b = _mv(Fm, b) + cv
        C = _sym_halved(_mmt(_mm(Fm, C), Fm) + Qm)
        precise = 0
        for k in tl.static_range(D):
            h, r, zk = _entry(H_ptr, r_ptr, z_ptr, s, t, T, k, n, h0, r0, rv, D)
            obs = zk == zk
            g = _mtv(A, h)
            Ch = _mv(C, h)
            sk = tl.sum(h * Ch, axis=0) + r
            precise += (obs & (r < WHOLE_RATIO * sk) & (sk > grown)).to(tl.int32)
            w = tl.where(obs, 1.0 / sk, 0.0)
            v = tl.where(obs, zk - tl.sum(h * b, axis=0), 0.0)
            J = J + (w * g)[:, None] * g[None, :]
            eta = eta + (w * v) * g
            K = w * Ch
            A = A - K[:, None] * g[None, :]
            b = b + K * v
            C = _sym_halved(C - K[:, None] * Ch[None, :])
        shrunk += (precise >= n).to(tl.int32)
    base = E_ptr + (s * NC + ch) * (3 * NP + 2) * NP
    tl.store(base + ri * NP + cj, A)
    tl.store(base + (2 * NP + ri) * NP + cj, J)
    tl.store(base + (3 * NP + 1) * NP + rv, eta)
    if not ACCURATE:
        if shrunk > 0:  # rare
            tl.atomic_or(word_ptr, SHRUNK)
    elif shrunk > 0:  # (b, C) again, those steps in information form
        C = tl.zeros([NP, NP], Fm.dtype)
        b = tl.zeros([NP], Fm.dtype)
        for t in tl.range(t0, t1):
            b = _mv(Fm, b) + cv
            C = _sym_halved(_mmt(_mm(Fm, C), Fm) + Qm)
            bp = b
            Cp = C
            precise = 0
            for k in tl.static_range(D):
                h, r, zk = _entry(H_ptr, r_ptr, z_ptr, s, t, T, k, n, h0, r0, rv, D)
                obs = zk == zk
                Ch = _mv(C, h)
                sk = tl.sum(h * Ch, axis=0) + r
                precise += (obs & (r < WHOLE_RATIO * sk) & (sk > grown)).to(tl.int32)
                K = tl.where(obs, 1.0 / sk, 0.0) * Ch
                b = b + K * tl.where(obs, zk - tl.sum(h * b, axis=0), 0.0)
                C = _sym_halved(C - K[:, None] * Ch[None, :])
            if precise >= n:
                M = _inv_spd(Cp, rv, ri, cj, n, NP)
                y = _mv(M, bp)
                for k in tl.static_range(D):
                    h, r, zk = _entry(H_ptr, r_ptr, z_ptr, s, t, T, k, n, h0, r0, rv, D)
                    w = tl.where(zk == zk, 1.0 / r, 0.0)
                    M = M + (w * h)[:, None] * h[None, :]
                    y = y + (w * tl.where(zk == zk, zk, 0.0)) * h
                C2 = tl.where(mm, _sym(_inv_spd(M, rv, ri, cj, n, NP)), 0.0)
                b2 = _mv(C2, y)
                # where it is finite (a singular C_pred, from a singular Q, keeps the above)
                tr2 = tl.sum(tl.sum(tl.where(ri == cj, C2, 0.0), axis=1), axis=0)
                use = (tr2 > 0.0) & (tr2 - tr2 == 0.0) & (tl.sum(b2 - b2, axis=0) == 0.0)
                b = tl.where(use, b2, b)
                C = tl.where(use, C2, C)
    tl.store(base + (NP + ri) * NP + cj, C)
    tl.store(base + 3 * NP * NP + rv, b)


@helper
def _gj(M, X, u, rv, ri, cj, NP: tl.constexpr):
    """``M^-1 [X, u]`` by Gauss-Jordan elimination with partial pivoting ([NP, NP] tiles)."""
    for k in tl.static_range(NP):
        colM = tl.sum(tl.where(cj == k, M, 0.0), axis=1)
        # a NaN entry (a series whose prediction passed the range, :data:`LOST`) ranks below
        # every number: the interpreter's argmax refuses an all-NaN column
        p = tl.argmax(tl.where(rv >= k, tl.where(colM == colM, tl.abs(colM), -0.5), -1.0), axis=0)
        rowMk = tl.sum(tl.where(ri == k, M, 0.0), axis=0)
        rowMp = tl.sum(tl.where(ri == p, M, 0.0), axis=0)
        rowXk = tl.sum(tl.where(ri == k, X, 0.0), axis=0)
        rowXp = tl.sum(tl.where(ri == p, X, 0.0), axis=0)
        uk = tl.sum(tl.where(rv == k, u, 0.0), axis=0)
        up = tl.sum(tl.where(rv == p, u, 0.0), axis=0)
        akk = tl.sum(tl.where(rv == k, colM, 0.0), axis=0)
        piv = tl.sum(tl.where(rv == p, colM, 0.0), axis=0)
        # swap rows k and p, then eliminate column k from every other row
        M = tl.where(ri == p, rowMk[None, :], M)
        X = tl.where(ri == p, rowXk[None, :], X)
        u = tl.where(rv == p, uk, u)
        colE = tl.where(rv == k, 0.0, tl.where(rv == p, akk, colM))
        rowM = rowMp / piv
        rowX = rowXp / piv
        uk = up / piv
        M = tl.where(ri == k, rowM[None, :], M - colE[:, None] * rowM[None, :])
        X = tl.where(ri == k, rowX[None, :], X - colE[:, None] * rowX[None, :])
        u = tl.where(rv == k, uk, u - colE * uk)
    return X, u


@helper
def _load_element(base, rv, ri, cj, NP: tl.constexpr):
    A = tl.load(base + ri * NP + cj)
    C = tl.load(base + (NP + ri) * NP + cj)
    J = tl.load(base + (2 * NP + ri) * NP + cj)
    b = tl.load(base + 3 * NP * NP + rv)
    eta = tl.load(base + (3 * NP + 1) * NP + rv)
    return A, C, J, b, eta


@triton.jit
def group_elements(
    E_ptr, GE_ptr,
    NC, G, NG,
    NP: tl.constexpr,
):  # fmt: skip
    """Element of group ``pid0`` (chunks [pid0 G, min(pid0 G + G, NC))) of series ``pid1``:
    GE [B, NG, 3 NP + 2, NP], composed with the combine of :func:`kalmanscan.dense.scan.combine`
    (X = I + C1 J2 inverted by pivoted Gauss-Jordan)."""
    g = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    rv = tl.arange(0, NP)
    ri = rv[:, None]
    cj = rv[None, :]
    size = (3 * NP + 2) * NP
    A1, C1, J1, b1, eta1 = _load_element(E_ptr + (s * NC + g * G) * size, rv, ri, cj, NP)
    eye = tl.where(ri == cj, 1.0, 0.0).to(A1.dtype)
    zv = tl.zeros([NP], A1.dtype)
    for ch in tl.range(g * G + 1, tl.minimum(g * G + G, NC)):
        A2, C2, J2, b2, eta2 = _load_element(E_ptr + (s * NC + ch) * size, rv, ri, cj, NP)
        Xi, _ = _gj(eye + _mm(C1, J2), eye, zv, rv, ri, cj, NP)  # (I + C1 J2)^-1
        W = _mm(A2, Xi)  # A2 X^-1
        # A1' X^-T [J2 A1, eta2 - J2 b1], as transposed products (no tile transposes)
        eta1 = _mtv(A1, _mtv(Xi, eta2 - _mv(J2, b1))) + eta1
        J1 = _sym(_mtm(A1, _mtm(Xi, _mm(J2, A1))) + J1)
        b1 = _mv(W, b1 + _mv(C1, eta2)) + b2
        C1 = _sym(_mmt(_mm(W, C1), A2) + C2)
        A1 = _mm(W, A1)
    base = GE_ptr + (s * NG + g) * size
    tl.store(base + ri * NP + cj, A1)
    tl.store(base + (NP + ri) * NP + cj, C1)
    tl.store(base + (2 * NP + ri) * NP + cj, J1)
    tl.store(base + 3 * NP * NP + rv, b1)
    tl.store(base + (3 * NP + 1) * NP + rv, eta1)


@helper
def _carry_walk(E_ptr, S0_ptr, S_ptr, g, s, NC, G, NG, NP: tl.constexpr):
    """:func:`carry`'s walk for group ``g`` of series ``s``."""
    rv = tl.arange(0, NP)
    ri = rv[:, None]
    cj = rv[None, :]
    start = S0_ptr + (s * NG + g) * (NP + 1) * NP
    P = tl.load(start + ri * NP + cj)
    m = tl.load(start + NP * NP + rv)
    eye = tl.where(ri == cj, 1.0, 0.0).to(P.dtype)
    end = tl.minimum(g * G + G, NC)
    for ch in tl.range(g * G, end):
        out = S_ptr + (s * NC + ch) * (NP + 1) * NP
        tl.store(out + ri * NP + cj, P)
        tl.store(out + NP * NP + rv, m)
        if ch + 1 < end:
            A, C, J, b, eta = _load_element(
                E_ptr + (s * NC + ch) * (3 * NP + 2) * NP, rv, ri, cj, NP
            )
            X, u = _gj(eye + _mm(P, J), P, _mv(P, eta - _mv(J, m)), rv, ri, cj, NP)
            m = _mv(A, m + u) + b
            P = _sym(_mmt(_mm(A, _sym(X)), A) + C)


@triton.jit
def carry(
    E_ptr, S0_ptr, S_ptr,
    NC, G, NG,
    NP: tl.constexpr,
):  # fmt: skip
    """Filtered states before the chunks [pid0 G, pid0 G + G) of series ``pid1``,
    S [B, NC, NP + 1, NP] (rows P, m), from the group's start S0 [B, NG, NP + 1, NP] and the chunk
    elements E [B, NC, ...]: the posterior of x_{i-1} given a chunk's information,
    ``(I + P J)^-1 [P, P (eta - J m)]``, pushed through its A, b, C."""
    _carry_walk(E_ptr, S0_ptr, S_ptr, tl.program_id(0), tl.program_id(1).to(tl.int64), NC, G, NG,
                NP)  # fmt: skip


# a step whose filtered covariance has a trace below this times the prediction's (the entries
# shrank the state 1e4-fold in every direction: near noise-free entries observing it whole)
# takes :func:`_factor_update`
WHOLE_RATIO = tl.constexpr(1e-4)
# ... as does a step with two or more near noise-free entries, |h|^2 tr P above this times r
# (kalmanscan.dense.sequential.NEAR_STEP): the scalar updates keep their posterior's small
# directions to eps tr P only
NEAR_STEP = tl.constexpr(1e4)
# the bit of the launch's word (beside the screen's and the gate's) that :func:`chunk_filter`
# sets where a predicted covariance has an entry past the range (inf or NaN): the caller then
# applies the rule of the CPU backends (kalmanscan.dense.api._lost_steps), :func:`_lost_rule`
LOST_BIT = 16
LOST = tl.constexpr(LOST_BIT)
# ... and the bit that :func:`chunk_elements` sets where a step shrinks a chunk element's C
# 1e4-fold: the caller launches again with its accurate pass
SHRUNK_BIT = 32
SHRUNK = tl.constexpr(SHRUNK_BIT)


@helper
def _chol(P, rv, ri, cj, n, NP: tl.constexpr):
    """Lower Cholesky factor of an SPD [NP, NP] tile (padding set to the identity)."""
    A = tl.where((ri == cj) & (ri >= n), 1.0, P)
    L = tl.zeros([NP, NP], P.dtype)
    for k in tl.static_range(NP):
        colA = tl.sum(tl.where(cj == k, A, 0.0), axis=1)
        piv = tl.sqrt(tl.sum(tl.where(rv == k, colA, 0.0), axis=0))
        col = tl.where(rv >= k, colA / piv, 0.0)
        L = tl.where(cj == k, col[:, None], L)
        A = A - col[:, None] * col[None, :]
    return L


@helper
def _factor_update(z_ptr, H_ptr, r_ptr, m, P, s, t, T, n, rv, ri, cj, NP: tl.constexpr,
                   D: tl.constexpr):  # fmt: skip
    """The step's update from the prediction ``N(m, P)`` in square-root form, as the sequential
    reference's near noise-free steps (kalmanscan.dense.sequential._factor_update): with
    ``P = L L'``, each observed entry's whitened row ``w = L' h / sqrt(r)`` and innovation
    ``y = (z - h' m) / sqrt(r)`` rotated (Givens) into the triangle ``[Ru, c]`` that starts as
    ``[I, 0]``, ``P_+ = Y' Y`` and ``m_+ = m + Y' c`` with ``Y = Ru^-T L'``: orthogonal steps and
    one solve, no difference of prediction-sized terms."""
    L = _chol(P, rv, ri, cj, n, NP)
    eye = tl.where(ri == cj, 1.0, 0.0).to(P.dtype)
    Ru = eye
    cv = tl.zeros([NP], P.dtype)
    for k in tl.static_range(D):
        h = _row(H_ptr + s * D * n, k, D, n, rv)
        r = tl.load(r_ptr + s * D + k)
        zk = tl.load(z_ptr + (s * T + t) * D + k)
        obs = zk == zk
        sr = tl.where(obs, 1.0 / tl.sqrt(r), 0.0)
        w = _mtv(L, h) * sr
        y = tl.where(obs, zk - tl.sum(h * m, axis=0), 0.0) * sr
        for j in tl.static_range(NP):
            rowR = tl.sum(tl.where(ri == j, Ru, 0.0), axis=0)
            a = tl.sum(tl.where(rv == j, rowR, 0.0), axis=0)
            b = tl.sum(tl.where(rv == j, w, 0.0), axis=0)
            cj_ = tl.sum(tl.where(rv == j, cv, 0.0), axis=0)
            big = tl.maximum(tl.abs(a), tl.abs(b))
            rr = big * tl.sqrt((a / big) * (a / big) + (b / big) * (b / big))
            cs = a / rr
            sn = b / rr
            Ru = tl.where(ri == j, (cs * rowR + sn * w)[None, :], Ru)
            w = cs * w - sn * rowR
            cv = tl.where(rv == j, cs * cj_ + sn * y, cv)
            y = cs * y - sn * cj_
    Y, _ = _gj(tl.trans(Ru), tl.trans(L), cv, rv, ri, cj, NP)
    mm = (ri < n) & (cj < n)
    return m + _mtv(Y, cv), tl.where(mm, _sym(_mtm(Y, Y)), 0.0)


@triton.jit
def chunk_filter(
    z_ptr, F_ptr, c_ptr, Q_ptr, H_ptr, r_ptr, S_ptr,
    mean_ptr, cov_ptr, prec_ptr, pm_ptr, pP_ptr, ll_ptr, word_ptr,
    T, n, L, NC,
    NP: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Covariance-form filter over chunk ``pid0`` of series ``pid1`` from its carried start; a
    step whose entries shrink the state 1e4-fold in every direction (near noise-free entries
    observing the whole state) takes :func:`_factor_update` instead, whose rounding is relative
    to the posterior (the scalar updates' is ``eps |P| / |P_+|``: 1.9e-4 at R = 1e-12 I under a
    unit prediction, 3.5e2 under a 1e6 one). Sets :data:`LOST` in ``word`` [1] where a
    prediction has an entry that is not finite."""
    ch, s, rv, ri, cj, mm, Fm, Qm, cv = _program_model(F_ptr, Q_ptr, c_ptr, n, NP)
    start = S_ptr + (s * NC + ch) * (NP + 1) * NP
    P = tl.load(start + ri * NP + cj)
    m = tl.load(start + NP * NP + rv)
    ll = tl.zeros([1], Fm.dtype)
    ll = tl.sum(ll, axis=0)
    lost = 0
    t0 = ch * L
    t1 = tl.minimum(t0 + L, T)
    if D == 1:
        h0 = _row(H_ptr + s * n, 0, D, n, rv)
        r0 = tl.load(r_ptr + s)
    for t in tl.range(t0, t1):
        m = _mv(Fm, m) + cv
        P = _sym_halved(_mmt(_mm(Fm, P), Fm) + Qm)
        o = (s * T + t) * n
        tl.store(pm_ptr + o + rv, m, mask=rv < n)
        tl.store(pP_ptr + o * n + ri * n + cj, P, mask=mm)
        mp = m
        Pp = P
        # the off-diagonal entries as P - P (0 where finite): the trace, NaN where an entry is not
        # finite (a false alarm where finite entries sum past the range: the caller checks)
        tr_pred = tl.sum(tl.sum(tl.where(ri == cj, Pp, Pp - Pp), axis=1), axis=0)
        lost += (tr_pred - tr_pred != 0.0).to(tl.int32)
        near = 0
        for k in tl.static_range(D):
            if D == 1:
                h = h0
                r = r0
            else:
                h = _row(H_ptr + s * D * n, k, D, n, rv)
                r = tl.load(r_ptr + s * D + k)
            zk = tl.load(z_ptr + (s * T + t) * D + k)
            obs = zk == zk
            near += (obs & (tl.sum(h * h, axis=0) * tr_pred > NEAR_STEP * r)).to(tl.int32)
            Ph = _mv(P, h)
            sk = tl.sum(h * Ph, axis=0) + r
            w = tl.where(obs, 1.0 / sk, 0.0)
            v = tl.where(obs, zk - tl.sum(h * m, axis=0), 0.0)
            # s >= r exactly; rounding below it (a near noise-free entry after others that
            # determined the state, float32) would take the log of a negative number
            ll += tl.where(obs, -0.5 * (LOG_2PI + tl.log(tl.maximum(sk, r)) + v * v * w), 0.0)
            K = w * Ph
            m = m + K * v
            P = _sym_halved(P - K[:, None] * Ph[None, :])
        tr_post = tl.sum(tl.sum(tl.where(ri == cj, P, 0.0), axis=1), axis=0)
        if (near >= 2) | (tr_post <= WHOLE_RATIO * tr_pred):  # rare
            m2, P2 = _factor_update(z_ptr, H_ptr, r_ptr, mp, Pp, s, t, T, n, rv, ri, cj,
                                    NP, D)  # fmt: skip
            # where it is finite (a prediction without a Cholesky factor keeps the above)
            tr2 = tl.sum(tl.sum(tl.where(ri == cj, P2, 0.0), axis=1), axis=0)
            use = (tr2 > 0.0) & (tl.sum(m2 - m2, axis=0) == 0.0)
            m = tl.where(use, m2, m)
            P = tl.where(use, P2, P)
        tl.store(mean_ptr + o + rv, m, mask=rv < n)
        tl.store(cov_ptr + o * n + ri * n + cj, P, mask=mm)
        tl.store(prec_ptr + o * n + ri * n + cj, _sym(_inv_spd(P, rv, ri, cj, n, NP)), mask=mm)
    tl.store(ll_ptr + s * NC + ch, ll)
    if lost > 0:  # rare
        tl.atomic_or(word_ptr, LOST)


@helper
def _back_walk(E_ptr, B0_ptr, out_ptr, g, s, NC, G, NG, NP: tl.constexpr):
    """The smoother's walk over the chunks [g G, g G + G) of series ``s``, backwards: writes
    out [B, NC, NP + 1, NP] (rows J, eta), the information that the data after each chunk carry
    about the state at its last step, from the group's B0 [B, NG, NP + 1, NP] (0 after the last
    chunk). Before a chunk: ``(I + J C)^-1 [J A, eta - J b]`` through its element E (A, C, J_e,
    b, eta_e), ``J <- A' (.) + J_e``, ``eta <- A' (.) + eta_e`` (the combine of
    :func:`kalmanscan.dense.scan.combine`, its information half)."""
    rv = tl.arange(0, NP)
    ri = rv[:, None]
    cj = rv[None, :]
    start = B0_ptr + (s * NG + g) * (NP + 1) * NP
    J = tl.load(start + ri * NP + cj)
    eta = tl.load(start + NP * NP + rv)
    eye = tl.where(ri == cj, 1.0, 0.0).to(J.dtype)
    first = g * G
    end = tl.minimum(first + G, NC)
    for i in tl.range(0, end - first):
        ch = end - 1 - i
        out = out_ptr + (s * NC + ch) * (NP + 1) * NP
        tl.store(out + ri * NP + cj, J)
        tl.store(out + NP * NP + rv, eta)
        if ch > first:
            A, C, Je, b, etae = _load_element(
                E_ptr + (s * NC + ch) * (3 * NP + 2) * NP, rv, ri, cj, NP
            )
            Y, y = _gj(eye + _mm(J, C), _mm(J, A), eta - _mv(J, b), rv, ri, cj, NP)
            J = _sym(_mtm(A, Y) + Je)
            eta = _mtv(A, y) + etae


@triton.jit
def carries(
    E_ptr, S0_ptr, S_ptr, B0_ptr, I_ptr,
    NC, G, NG,
    NP: tl.constexpr,
):  # fmt: skip
    """The smoother's two carries in one launch (they are independent, and each program's walk
    is serial): programs pid0 < NG walk group pid0 forwards as :func:`carry` (S0 -> S, filtered
    states before each chunk), programs NG + g walk group g backwards (:func:`_back_walk`, B0 ->
    I, the information after each chunk). Over groups: E their elements, NG = 1."""
    g = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    if g < NG:
        _carry_walk(E_ptr, S0_ptr, S_ptr, g, s, NC, G, NG, NP)
    else:
        _back_walk(E_ptr, B0_ptr, I_ptr, g - NG, s, NC, G, NG, NP)


@triton.jit
def chunk_smooth(
    F_ptr, c_ptr, Q_ptr, mean_ptr, cov_ptr, I_ptr,
    smean_ptr, scov_ptr, sprec_ptr,
    T, n, L, NC,
    NP: tl.constexpr,
):  # fmt: skip
    """RTS smoother over chunk ``pid0`` of series ``pid1``. Its last step's smoothed state: the
    filtered one there (the filter's output, the value of the next chunk's carried start) given the
    information I [B, NC, NP + 1, NP] after the chunk (:func:`_back_walk`),
    ``(I + P J)^-1 [P, P (eta - J m)]`` as :func:`carry`'s posterior (the last chunk's: its
    filtered end). Then backwards, with the filtered m, P of each step (the filter's outputs) and
    the prediction ``F P F' + Q`` recomputed, the gain E' = (F P F' + Q)^-1 F P (Gauss-Jordan
    of the SPD prediction), ``m_s = m + E (m_s' - F m - c)``, ``P_s = P + E (P_s' - F P F' - Q)
    E'``; writes every smoothed mean, covariance and precision once."""
    ch, s, rv, ri, cj, mm, Fm, Qm, cv = _program_model(F_ptr, Q_ptr, c_ptr, n, NP)
    t0 = ch * L
    t1 = tl.minimum(t0 + L, T)
    o = (s * T + t1 - 1) * n
    if ch + 1 < NC:
        # the filter's output at the chunk's last step (the value of the next chunk's carried
        # start S, computed step by step: accurate where the carry's composed elements are not,
        # a posterior far below the prediction)
        P = tl.load(cov_ptr + o * n + ri * n + cj, mask=mm, other=0.0)
        m = tl.load(mean_ptr + o + rv, mask=rv < n, other=0.0)
        info = I_ptr + (s * NC + ch) * (NP + 1) * NP
        J = tl.load(info + ri * NP + cj)
        eta = tl.load(info + NP * NP + rv)
        eye = tl.where(ri == cj, 1.0, 0.0).to(P.dtype)
        X, u = _gj(eye + _mm(P, J), P, _mv(P, eta - _mv(J, m)), rv, ri, cj, NP)
        Ps = _sym(X)
        ms = m + u
    else:
        Ps = tl.load(cov_ptr + o * n + ri * n + cj, mask=mm, other=0.0)
        ms = tl.load(mean_ptr + o + rv, mask=rv < n, other=0.0)
    tl.store(smean_ptr + o + rv, ms, mask=rv < n)
    tl.store(scov_ptr + o * n + ri * n + cj, Ps, mask=mm)
    tl.store(sprec_ptr + o * n + ri * n + cj, _sym(_inv_spd(Ps, rv, ri, cj, n, NP)), mask=mm)
    for i in tl.range(1, t1 - t0):
        o = (s * T + t1 - 1 - i) * n
        m = tl.load(mean_ptr + o + rv, mask=rv < n, other=0.0)
        P = tl.load(cov_ptr + o * n + ri * n + cj, mask=mm, other=0.0)
        FP = _mm(Fm, P)
        Pp = _sym(_mmt(FP, Fm) + Qm)
        Et = _solve_spd(Pp, FP, rv, ri, cj, n, NP)  # (P F' Pp^-1)'
        ms = m + _mtv(Et, ms - _mv(Fm, m) - cv)
        Ps = _sym(P + _mtm(Et, _mm(Ps - Pp, Et)))
        tl.store(smean_ptr + o + rv, ms, mask=rv < n)
        tl.store(scov_ptr + o * n + ri * n + cj, Ps, mask=mm)
        tl.store(sprec_ptr + o * n + ri * n + cj, _sym(_inv_spd(Ps, rv, ri, cj, n, NP)), mask=mm)
