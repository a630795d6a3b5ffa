"""The fused adjoint of the log-likelihood: gradients of ``sum_n w_n loglik_n`` with respect to
every input, in one reverse pass (per chunk) that writes no ``[T, N]`` tensor other than the
gradients asked for. Notation as in kernels.py.

The normalizations are positive scalars and every log-likelihood term is homogeneous of degree 0
in the predicted triple, so the log-likelihood is the same function of the unnormalized, linear
recursion ``x_t = M_t x_{t-1}``. Its adjoint runs backward through ``M_t^T``; carried with respect
to the normalized triple it is ``mu_{t-1} = M_t^T mu_t / (n1 n2) + w grad ll_t``, with the
forward's own normalizers ``n1, n2`` (recomputed), so it stays in range as the states do.

The states are needed in reverse order: the forward stores the normalized state entering every
``CK``-th step (``ck [cdiv(T, CK), 3, N]``); the adjoint walks a chunk's ``CK``-step segments
from the last, recomputes each segment forward from its checkpoint into a per-program scratch
(``[CK, 3, BLOCK]``, cache-resident) and then runs the segment's adjoint steps backward. Few
long lanes: the forward's pass from each chunk's true start has also composed the chunk's
affine adjoint map ``mu -> C mu + b`` (``C`` from the tangents of the chunk's starting state
carried forward, ``b`` the log-likelihood's derivative along them: kernels.py, ``TANG``), a
carry kernel walks those maps from the last chunk to give the adjoint entering each chunk from
its end, and the gradient pass runs every chunk from there.

A diffuse start: while the lane stays diffuse nothing depends on its steps' inputs, and their
partials there are 0 by selection (the predict's where the state entering is diffuse, ``U1 =
0``; the observation's where the update leaves it diffuse, ``h = 0`` or not observed: a loading
0 there has no derivative, the exact diffuse log-likelihood jumps where it becomes nonzero). The
adjoint of the diffuse state itself grows like ``1/a^2`` (``1/a``) a step back (``1e200`` a
step at ``a = 1e-100``; ``4^600`` over 600 steps of ``a = 0.5``) and met those zeros (``inf *
0``: every gradient NaN); it reaches only the initial state, whose gradient is 0 where it is
not finite at a diffuse start (and the adjoint chunk maps of chunks that start diffuse, which
serve only such chunks). At a step that forgets (``a = 0``) from a known state, ``a``'s partial
is the limit's: the predicted mean is ``c + a e/u``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper
from kalmanscan.cuda.filter.kernels import (
    carried_mean,
    keep_diffuse,
    kept_pred,
    kept_update,
    ld,
    loglik_grads,
    normal,
    normalized_pred,
    not_finite,
    observation,
    predict_coeffs,
    rcp,
)


@helper
def step_values(u, e, v, m, a, p, c, z, R, h):
    """The forward step from the state ``(u, e, v)`` entering it (``m``: its mean as float32's
    forward carries it, kernels.kept_update): every value the adjoint reads (``big1``,
    ``big2``: the predicted / updated triple was divided by its ``u``) and the mean after the
    step (float32; else ``m``)."""
    q, d, al, forget = predict_coeffs(a, p)
    U1 = u + q * v
    V1 = p * u + d * v
    V1 = keep_diffuse(U1, V1, v)  # a diffuse state stays diffuse (kernels.py)
    big1 = U1 >= V1
    r1, um, em, vm = normalized_pred(U1, V1, e, v, a, p, c, al)  # (a*a v keeps its digits)
    em, mp = kept_pred(um, em, c, al, m)
    obs, rinv, zz, phi, r = observation(z, R, h)
    U2 = um + phi * vm
    E2 = em + r * vm
    big2 = U2 >= vm
    r2 = rcp(tl.where(big2, U2, vm))
    u2 = U2 * r2
    e2 = E2 * r2
    if u.dtype == tl.float32:
        m = kept_update(U2, E2, vm, um, mp, phi, r, zz, h, tl.where(big2, r2, rcp(U2)))
        e2 = tl.where((U2 > 0.0) & ~not_finite(m), u2 * m, e2)
    return (q, d, al, forget, U1, r1, um, em, vm, big1, obs, rinv, zz, phi, r,
            u2, e2, vm * r2, r2, big2, m)  # fmt: skip


@helper
def project(gu, ge, gv, yu, ye, yv, big):
    """The adjoint through ``y = x / max(x_u, x_v)`` times that maximum: ``g - (g . y) e_max``.
    Exact arithmetic keeps ``g . y = 0`` (every output is homogeneous of degree 0 in each
    state), so this only removes rounding; without it the error along ``y`` would persist from
    step to step (the adjoint's neutral direction) and grow like a random walk."""
    dot = gu * yu + ge * ye + gv * yv
    return gu - tl.where(big, dot, 0.0), ge, gv - tl.where(big, 0.0, dot)


@helper
def adj_update(gu, ge, gv, r2, phi, r, yu, ye, yv, big2):
    """Adjoint through the update and its normalization (output ``y``): ``(gU2, gE2, g of the
    predicted v)``."""
    gu, ge, gv = project(gu, ge, gv, yu, ye, yv, big2)
    gU = gu * r2
    gE = ge * r2
    return gU, gE, gv * r2 + phi * gU + r * gE


@helper
def adj_predict(gum, gem, gvm, r1, c, p, q, d, al, um, em, vm, big1):
    """Adjoint through the predict step and its normalization: the adjoint of the state
    entering the step."""
    gum, gem, gvm = project(gum, gem, gvm, um, em, vm, big1)
    gU1 = gum * r1
    gE1 = gem * r1
    gV1 = gvm * r1
    gUt = gU1 + c * gE1
    return gUt + p * gV1, al * gE1, q * gUt + d * gV1


@helper
def put_grad(ptr, off, lmask, g, acc, MODE: tl.constexpr):
    """Gradient of one input at one step: stored (``MODE`` 1, a ``[T, N]`` gradient) or added to
    the running per-lane sum (``MODE`` 2, an input constant in time)."""
    if MODE == 1:
        tl.store(ptr + off, g, mask=lmask)
    if MODE == 2:
        acc = acc + g
    return acc


@triton.jit
def adjoint_kernel(
    z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
    ck_ptr,  # [cdiv(T, CK), 3, N] checkpoints of the forward
    scr_ptr,  # [programs, CK, 3, BLOCK] scratch: one segment's states
    gll_ptr, gsn,  # [N] incoming gradient of the log-likelihood (lane stride; 0 broadcast)
    xend_ptr,  # [3, NC, N] adjoint of the state at the end of each chunk
    gz_ptr, gR_ptr, ga_ptr, gp_ptr, gh_ptr, gc_ptr,  # [T, N] (mode 1) or [NC, N] (mode 2)
    g0_ptr,  # [3, N] gradient of the initial state
    T, N, CH, NC, CK,
    VZ: tl.constexpr, VR: tl.constexpr, VA: tl.constexpr,
    VP: tl.constexpr, VH: tl.constexpr, VC: tl.constexpr,
    GZ: tl.constexpr, GR: tl.constexpr, GA: tl.constexpr,
    GP: tl.constexpr, GH: tl.constexpr, GC: tl.constexpr,
    NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(1)
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    t_lo = k * CH
    t_hi = tl.minimum(t_lo + CH, T)
    scr = scr_ptr + (k * tl.num_programs(0) + tl.program_id(0)) * (CK * 3 * BLOCK)
    scr = scr + tl.arange(0, BLOCK)
    z0 = tl.load(z_ptr + lanes * zsn, mask=lmask, other=1.0)
    R0 = tl.load(R_ptr + lanes * Rsn, mask=lmask, other=1.0)
    a0 = tl.load(a_ptr + lanes * asn, mask=lmask, other=1.0)
    p0 = tl.load(p_ptr + lanes * psn, mask=lmask, other=1.0)
    h0 = tl.load(h_ptr + lanes * hsn, mask=lmask, other=1.0)
    c0 = tl.load(c_ptr + lanes * csn, mask=lmask, other=1.0)
    W = tl.load(gll_ptr + lanes * gsn, mask=lmask, other=0.0)
    zero = W * 0.0
    bu = tl.load(xend_ptr + k * N + lanes, mask=lmask, other=0.0)
    be = tl.load(xend_ptr + (NC + k) * N + lanes, mask=lmask, other=0.0)
    bv = tl.load(xend_ptr + (2 * NC + k) * N + lanes, mask=lmask, other=0.0)
    acc_z, acc_R, acc_a, acc_p, acc_h, acc_c = zero, zero, zero, zero, zero, zero
    u_in = zero  # the state entering the chunk's first step, at the end (a diffuse start)
    nsub = (t_hi - t_lo + CK - 1) // CK
    for jj in range(0, nsub):
        s_lo = t_lo + (nsub - 1 - jj) * CK
        n_s = tl.minimum(s_lo + CK, t_hi) - s_lo
        cko = (s_lo // CK) * 3 * N + lanes
        u = tl.load(ck_ptr + cko, mask=lmask, other=1.0)
        e = tl.load(ck_ptr + cko + N, mask=lmask, other=0.0)
        v = tl.load(ck_ptr + cko + 2 * N, mask=lmask, other=1.0)
        m = carried_mean(u, e)
        for i in tl.range(0, n_s, num_stages=NS):
            t = s_lo + i
            if z0.dtype == tl.float32:
                # the mean, as the forward carries it (e = u m); where it is past the range (a
                # lane whose variance left it, kernels.kept_pred) e itself, u stored negated
                held = (u > 0.0) & not_finite(m)
                tl.store(scr + (3 * i) * BLOCK, tl.where(held, -u, u))
                tl.store(scr + (3 * i + 1) * BLOCK, tl.where(held, e, m))
            else:
                tl.store(scr + (3 * i) * BLOCK, u)
                tl.store(scr + (3 * i + 1) * BLOCK, e)
            tl.store(scr + (3 * i + 2) * BLOCK, v)
            a = ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
            p = ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
            c = ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
            z = ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
            R = ld(R_ptr, Rst, Rsn, t, lanes, lmask, VR, R0)
            h = ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
            (_, _, _, _, _, _, _, _, _, _, _, _, _, _, _,
             u, e, v, _, _, m) = step_values(u, e, v, m, a, p, c, z, R, h)  # fmt: skip
        tl.debug_barrier()
        for i2 in tl.range(0, n_s, num_stages=NS):
            i = n_s - 1 - i2
            t = s_lo + i
            u = tl.load(scr + (3 * i) * BLOCK)
            e = tl.load(scr + (3 * i + 1) * BLOCK)
            v = tl.load(scr + (3 * i + 2) * BLOCK)
            m = e
            if z0.dtype == tl.float32:
                held = u < 0.0
                u = tl.abs(u)
                m = tl.where(held, float("nan"), e)
                e = tl.where(held, e, tl.where(u > 0.0, u * e, 0.0))
            u_in = u
            a = ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
            p = ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
            c = ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
            z = ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
            R = ld(R_ptr, Rst, Rsn, t, lanes, lmask, VR, R0)
            h = ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
            (q, d, al, forget, U1, r1, um, em, vm, big1,
             obs, rinv, zz, phi, r, yu, ye, yv, r2, big2, _) = step_values(
                u, e, v, m, a, p, c, z, R, h)  # fmt: skip
            du, de, dv, dz, dR, dh = loglik_grads(obs, zz, R, h, um, em, vm)
            gU2, gE2, gvm = adj_update(bu, be, bv, r2, phi, r, yu, ye, yv, big2)
            gum, gem, gvm = project(gU2 + W * du, gE2 + W * de, gvm + W * dv,
                                    um, em, vm, big1)  # fmt: skip
            gU1 = gum * r1
            gE1 = gem * r1
            gV1 = gvm * r1
            gUt = gU1 + c * gE1
            off = t * N + lanes
            # observation: phi = h^2/R, r = h z/R; through the state only where the update
            # does not leave a diffuse state diffuse (module docstring)
            stays = (um == 0.0) & ((h == 0.0) | ~obs)
            gphi = gU2 * vm
            gr = gE2 * vm
            acc_z = put_grad(gz_ptr, off, lmask,
                             tl.where(stays, 0.0, gr * h * rinv) + W * dz, acc_z, GZ)  # fmt: skip
            acc_R = put_grad(gR_ptr, off, lmask,
                             W * dR - tl.where(stays, 0.0, (gphi * phi + gr * r) * rinv),
                             acc_R, GR)  # fmt: skip
            acc_h = put_grad(gh_ptr, off, lmask,
                             tl.where(stays, 0.0, (2.0 * gphi * h + gr * zz) * rinv) + W * dh,
                             acc_h, GH)  # fmt: skip
            # predict: U1 = u + q v, V1 = p u + d v, E1 = c U1 + al e; nothing where a diffuse
            # state enters a step that keeps it (U1 = 0); where the step forgets from a known
            # state, a's is the limit's, (e/u) U1 gE1
            live = U1 > 0.0
            acc_c = put_grad(gc_ptr, off, lmask, tl.where(live, gE1 * U1, 0.0), acc_c, GC)
            gd = gV1 * v
            known = normal(u)
            ga_f = tl.where(known, gE1 * e * rcp(tl.where(known, u, 1.0)) * U1, 0.0)
            ga = tl.where(forget, ga_f, gE1 * e + 2.0 * a * gd)
            acc_a = put_grad(ga_ptr, off, lmask, tl.where(live, ga, 0.0), acc_a, GA)
            acc_p = put_grad(gp_ptr, off, lmask,
                             tl.where(live, gV1 * u + tl.where(forget, gd, 0.0), 0.0),
                             acc_p, GP)  # fmt: skip
            bu = gUt + p * gV1
            be = al * gE1
            bv = q * gUt + d * gV1
    first = lmask & ((lanes * 0 + k) == 0)
    # a diffuse start: its gradient 0 where it overflowed (module docstring)
    dif0 = u_in == 0.0
    tl.store(g0_ptr + lanes, tl.where(dif0 & not_finite(bu), 0.0, bu), mask=first)
    tl.store(g0_ptr + N + lanes, tl.where(dif0 & not_finite(be), 0.0, be), mask=first)
    tl.store(g0_ptr + 2 * N + lanes, tl.where(dif0 & not_finite(bv), 0.0, bv), mask=first)
    po = k * N + lanes
    if GZ == 2:
        tl.store(gz_ptr + po, acc_z, mask=lmask)
    if GR == 2:
        tl.store(gR_ptr + po, acc_R, mask=lmask)
    if GA == 2:
        tl.store(ga_ptr + po, acc_a, mask=lmask)
    if GP == 2:
        tl.store(gp_ptr + po, acc_p, mask=lmask)
    if GH == 2:
        tl.store(gh_ptr + po, acc_h, mask=lmask)
    if GC == 2:
        tl.store(gc_ptr + po, acc_c, mask=lmask)


@triton.jit  # a scan's combine function is jitted under the interpreter too
def compose_affine(l00, l01, l02, l10, l11, l12, l20, l21, l22, lb0, lb1, lb2,
                   r00, r01, r02, r10, r11, r12, r20, r21, r22, rb0, rb1, rb2):  # fmt: skip
    """The affine map ``mu -> R (L mu + lb) + rb`` (``L`` applied first): ``(R L, R lb + rb)``."""
    return (r00 * l00 + r01 * l10 + r02 * l20, r00 * l01 + r01 * l11 + r02 * l21,
            r00 * l02 + r01 * l12 + r02 * l22,
            r10 * l00 + r11 * l10 + r12 * l20, r10 * l01 + r11 * l11 + r12 * l21,
            r10 * l02 + r11 * l12 + r12 * l22,
            r20 * l00 + r21 * l10 + r22 * l20, r20 * l01 + r21 * l11 + r22 * l21,
            r20 * l02 + r21 * l12 + r22 * l22,
            r00 * lb0 + r01 * lb1 + r02 * lb2 + rb0, r10 * lb0 + r11 * lb1 + r12 * lb2 + rb1,
            r20 * lb0 + r21 * lb1 + r22 * lb2 + rb2)  # fmt: skip


@triton.jit
def adjoint_carry_kernel(amap_ptr, gll_ptr, gsn, xlast_ptr, xend_ptr, N, NC,
                         CT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The adjoint at the end of each chunk, from the last chunk's (``xlast [3, N]``, the
    gradient of the final state) through the chunk maps of the forward (``amap [12, NC, N]``,
    for unit weight): ``mu_end(k-1) = C_k mu_end(k) + w b_k`` with the log-likelihood's incoming
    gradient ``w`` (``gll [N]``, lane stride ``gsn``). ``CT`` chunks at a time, from the last:
    their maps loaded as one ``[CT, BLOCK]`` tile (row ``j``: chunk ``hi - j``), composed by a
    prefix scan and applied to the adjoint at the end of chunk ``hi``."""
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    step = NC * N
    W = tl.load(gll_ptr + lanes * gsn, mask=lmask, other=0.0)
    mu = tl.load(xlast_ptr + lanes, mask=lmask, other=0.0)
    me = tl.load(xlast_ptr + N + lanes, mask=lmask, other=0.0)
    mv = tl.load(xlast_ptr + 2 * N + lanes, mask=lmask, other=0.0)
    last = NC - 1
    tl.store(xend_ptr + last * N + lanes, mu, mask=lmask)
    tl.store(xend_ptr + step + last * N + lanes, me, mask=lmask)
    tl.store(xend_ptr + 2 * step + last * N + lanes, mv, mask=lmask)
    rows = tl.arange(0, CT)[:, None]
    final = rows == CT - 1
    for j0 in tl.range(0, NC - 1, CT, num_stages=2):  # the next tile loads during this one
        kk = NC - 1 - j0 - rows  # chunks NC-1 .. 1 give the adjoint at the ends of NC-2 .. 0
        m = lmask[None, :] & (kk >= 1)
        base = amap_ptr + kk * N + lanes[None, :]
        # C[i][j] = entry i + 3 j; outside the range the identity
        c00 = tl.load(base, mask=m, other=1.0)
        c10 = tl.load(base + step, mask=m, other=0.0)
        c20 = tl.load(base + 2 * step, mask=m, other=0.0)
        c01 = tl.load(base + 3 * step, mask=m, other=0.0)
        c11 = tl.load(base + 4 * step, mask=m, other=1.0)
        c21 = tl.load(base + 5 * step, mask=m, other=0.0)
        c02 = tl.load(base + 6 * step, mask=m, other=0.0)
        c12 = tl.load(base + 7 * step, mask=m, other=0.0)
        c22 = tl.load(base + 8 * step, mask=m, other=1.0)
        w = W[None, :]
        b0 = w * tl.load(base + 9 * step, mask=m, other=0.0)
        b1 = w * tl.load(base + 10 * step, mask=m, other=0.0)
        b2 = w * tl.load(base + 11 * step, mask=m, other=0.0)
        c00, c01, c02, c10, c11, c12, c20, c21, c22, b0, b1, b2 = tl.associative_scan(
            (c00, c01, c02, c10, c11, c12, c20, c21, c22, b0, b1, b2), 0, compose_affine
        )
        u, e, v = mu[None, :], me[None, :], mv[None, :]
        nu = c00 * u + c01 * e + c02 * v + b0
        ne = c10 * u + c11 * e + c12 * v + b1
        nv = c20 * u + c21 * e + c22 * v + b2
        out = xend_ptr + (kk - 1) * N + lanes[None, :]
        tl.store(out, nu, mask=m)
        tl.store(out + step, ne, mask=m)
        tl.store(out + 2 * step, nv, mask=m)
        # the adjoint after the tile (its last row: masked rows are the identity)
        mu = tl.sum(tl.where(final, nu, 0.0), 0)
        me = tl.sum(tl.where(final, ne, 0.0), 0)
        mv = tl.sum(tl.where(final, nv, 0.0), 0)
