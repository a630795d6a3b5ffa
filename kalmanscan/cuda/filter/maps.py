"""Device helpers of the scalar filter's chunk maps (their layout: ``filter_kernel`` in
kernels.py, ``MAPS``): load, apply and compose the stored maps, and the carries' walks of a
chunk step by step where its map cannot carry the state (``carry_kernel``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper
from kalmanscan.cuda.filter.steps import back_step, exact_step, normalize, rcp


@helper
def load_map(base, step, lmask):
    """The stored chunk map at ``base`` (entries ``step`` apart): ``m11, m12, m21, m22, g1, g2,
    A``, the identity where ``lmask`` is false."""
    m11 = tl.load(base, mask=lmask, other=1.0)
    m12 = tl.load(base + step, mask=lmask, other=0.0)
    m21 = tl.load(base + 2 * step, mask=lmask, other=0.0)
    m22 = tl.load(base + 3 * step, mask=lmask, other=1.0)
    g1 = tl.load(base + 4 * step, mask=lmask, other=0.0)
    g2 = tl.load(base + 5 * step, mask=lmask, other=0.0)
    A = tl.load(base + 6 * step, mask=lmask, other=1.0)
    return m11, m12, m21, m22, g1, g2, A


@helper
def apply_map(base, step, lmask, u, e, v):
    """Apply the stored chunk map at ``base`` to the normalized triple; normalize."""
    m11, m12, m21, m22, g1, g2, A = load_map(base, step, lmask)
    U = m11 * u + m12 * v
    V = m21 * u + m22 * v
    E = g1 * u + g2 * v + A * e
    return normalize(U, E, V)


@triton.jit  # a scan's combine function is jitted under the interpreter too
def compose_maps(l11, l12, l21, l22, lg1, lg2, lA, lr, r11, r12, r21, r22, rg1, rg2, rA, rr):
    """The chunk map ``r . l`` (``l`` applied first; layout in :func:`filter_kernel`), divided
    by its trace (any positive factor: the maps act projectively). Its second column is ``l``'s
    image of a diffuse state carried through ``r``; where ``l`` leaves a diffuse state diffuse
    (its column ``(0, l22 | 0)``) it is ``r``'s column, and the ratios multiply."""
    axis = (l12 == 0.0) & (lg2 == 0.0)
    w1 = rr * l21
    w2 = tl.where(axis, 1.0, rr) * l22
    n11 = r11 * l11 + r12 * w1
    n12 = r11 * l12 + r12 * w2
    n21 = r21 * l11 + r22 * w1
    n22 = r21 * l12 + r22 * w2
    sc = rcp(n11 + n22)
    ng1 = rg1 * l11 + rg2 * w1 + rA * lg1
    ng2 = rg1 * l12 + rg2 * w2 + rA * lg2
    return (n11 * sc, n12 * sc, n21 * sc, n22 * sc, ng1 * sc, ng2 * sc, rA * lA * sc,
            lr * tl.where(axis, rr, 1.0))  # fmt: skip


@helper
def walked_inputs(z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn, p_ptr, pst, psn,
                  h_ptr, hst, hsn, c_ptr, cst, csn, lanes, t, walk):  # fmt: skip
    """Step ``t``'s ``(a, p, c, z, R, h)`` on the lanes where ``walk`` (neutral values
    elsewhere), for the carries' step-by-step walks."""
    a = tl.load(a_ptr + t * ast + lanes * asn, mask=walk, other=1.0)
    p = tl.load(p_ptr + t * pst + lanes * psn, mask=walk, other=1.0)
    c = tl.load(c_ptr + t * cst + lanes * csn, mask=walk, other=0.0)
    z = tl.load(z_ptr + t * zst + lanes * zsn, mask=walk, other=0.0)
    R = tl.load(R_ptr + t * Rst + lanes * Rsn, mask=walk, other=1.0)
    h = tl.load(h_ptr + t * hst + lanes * hsn, mask=walk, other=0.0)
    return a, p, c, z, R, h


@helper
def walk_chunk(u, e, v, walk, z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
               p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn, lanes, t0, t1):  # fmt: skip
    """The lanes where ``walk``: the state after steps ``t0 .. t1-1`` walked one at a time
    (:func:`exact_step`); the others as given."""
    for t in range(t0, t1):
        a, p, c, z, R, h = walked_inputs(z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
                                         p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
                                         lanes, t, walk)  # fmt: skip
        un, en, vn = exact_step(u, e, v, a, p, c, z, R, h)
        u = tl.where(walk, un, u)
        e = tl.where(walk, en, e)
        v = tl.where(walk, vn, v)
    return u, e, v


@helper
def walk_back_chunk(U, E, V, walk, z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
                    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn, lanes, t0, t1):  # fmt: skip
    """The lanes where ``walk``: the backward information state after steps ``t1-1 .. t0``
    walked back one at a time (:func:`back_step`); the others as given."""
    for j in range(0, t1 - t0):
        t = t1 - 1 - j
        a, p, c, z, R, h = walked_inputs(z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
                                         p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
                                         lanes, t, walk)  # fmt: skip
        Un, En, Vn = back_step(U, E, V, z, R, h, a, p, c)
        U = tl.where(walk, Un, U)
        E = tl.where(walk, En, E)
        V = tl.where(walk, Vn, V)
    return U, E, V


@helper
def map_start(base, step, lmask, u, e, v):
    """The state after a stored chunk map from the state ``(u, e, v)`` entering it (a diffuse
    state through the map's second column, else the map's own: the column times rho),
    normalized by division (the column may be tiny)."""
    m11, m12, m21, m22, g1, g2, A = load_map(base, step, lmask)
    rho = tl.load(base + 7 * step, mask=lmask, other=1.0)
    w = tl.where(u == 0.0, 1.0, rho) * v
    U = m11 * u + m12 * w
    V = m21 * u + m22 * w
    E = g1 * u + g2 * w + A * e
    mx = tl.maximum(U, V)
    return U / mx, E / mx, V / mx
