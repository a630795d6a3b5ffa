"""Forward and smoother kernels of the scalar filter in homogeneous coordinates (u, e, v).

Notation (docs/backend-contract.md): per lane and step ``a`` decay, ``p`` process_var, ``c``
offset, ``h`` loading, ``R`` obs_var, ``phi = h*h/R``, ``r = h*z/R`` (0 where not observed);
``forget`` where ``a == 0`` (then ``q = 1, d = p``, else ``q = 0, d = a*a``). A belief is
``(u, e, v)`` up to a positive factor, normalized to ``max(u, v) = 1``: precision ``u/v``,
variance ``v/u``, mean ``e/u``, information ``e/v``. One step::

    predict:  U = u + q v     V = p u + d v     E = c U + a (1 - q) e      then / max(U, V)
              (V = v where U = 0 and V is below the normal range: a diffuse state stays
              diffuse where a*a v underflows or is subnormal; the normalized E and V are formed
              as c U/m + a (e/m) and p U/m + (a (v/m)) a, m = max(U, V), so that a*a v and a e
              keep their digits where a*a is below the normal range; the outputs' predicted
              ratios divide by U first there, :func:`pred_ratios`)
    update:   U = u + phi v   V = v             E = e + r v                then / max(U, V)

Every ``[T, N]`` input is read through its (time, lane) strides; ``V*`` constexprs say which vary
in time (the others are read once before the time loop, and their range checks run once).
A step counts as observed where ``z`` is not NaN and ``R < inf``.

Flags (an int32 the kernels OR into): ``1`` a state or log-likelihood term is not finite, ``2``
``z`` holds +-inf, ``4`` an input is out of range (``R <= 0`` or NaN; ``h*h/R`` not finite
where ``R`` is; ``decay``, ``loading``, ``offset`` not finite; ``process_var < 0`` or not
finite; an initial triple with ``u < 0``, ``v < 0``, ``u = v = 0``, a non-finite entry, or
``e != 0`` where ``u = 0``), as the API's own checks define them, so the API validates only when
a flag is set; and ``h != 0`` with ``h*h`` or ``h*h/R`` below the normal range, on which the API
decides (refused at a diffuse lane's first informative observation; else the result stands, or
the call is redone with the observation rescaled: kalmanscan/core/filter.py).

The kernels are here; their per-step helpers in steps.py, the chunk maps' in maps.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kalmanscan.cuda.filter.maps import (  # noqa: F401
    # those the kernels call, and re-exported the names this module held before they moved
    apply_map,
    compose_maps,
    load_map,
    map_start,
    walk_back_chunk,
    walk_chunk,
    walked_inputs,
)
from kalmanscan.cuda.filter.steps import (  # noqa: F401
    # those the kernels call, and re-exported the names this module held before they moved
    LOG_2PI,
    back_step,
    carried_mean,
    exact_step,
    flag_bits,
    input_checks,
    keep_diffuse,
    kept_pred,
    kept_update,
    ld,
    loglik_grads,
    loglik_term,
    normal,
    normalize,
    normalized_pred,
    not_finite,
    observation,
    pred_ratios,
    predict_coeffs,
    ratios,
    rcp,
    small_decay,
    tangent_step,
    tiny_of,
)


@triton.jit
def filter_kernel(
    z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
    u0_ptr, e0_ptr, v0_ptr, us, es, vs,  # [N] initial state (FROM_X0) and its lane strides
    start_ptr,  # [3, NC, N] state entering each chunk (written by the carry kernel)
    mean_ptr, var_ptr, prec_ptr, info_ptr, pmean_ptr, pvar_ptr, pprec_ptr,  # [T, N] (WRITE)
    ll_ptr,  # [N] in the data's dtype (NC == 1), else [NC, N] float64 partial sums
    fin_ptr,  # [3, N] the last filtered state
    flags_ptr,  # int32 [1]
    ck_ptr,  # [cdiv(T, CK), 3, N] the state entering every CK-th step (CKPT)
    comp_ptr,  # [9 or 16, NC, N] chunk maps (MAPS); [12, NC, N] adjoint chunk maps (TANG)
    T, N, CH, NC, CK,
    VZ: tl.constexpr, VR: tl.constexpr, VA: tl.constexpr,
    VP: tl.constexpr, VH: tl.constexpr, VC: tl.constexpr,
    MAPS: tl.constexpr, BMAPS: tl.constexpr, FROM_X0: tl.constexpr, WRITE: tl.constexpr,
    PARTIAL: tl.constexpr, CKPT: tl.constexpr, TANG: tl.constexpr, NS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: ``BLOCK`` lanes over the steps of chunk ``program_id(1)``.

    ``MAPS``: compose the chunk's steps into one map on ``(u, v | e)`` (the forward's, and with
    ``BMAPS`` the backward information filter's) and store it. The forward's is stored as
    ``m11, m12, m21, m22, g1, g2, A, rho, walk``: the map ``U = m11 u + rho m12 v``, ``V = m21 u
    + rho m22 v``, ``E = g1 u + rho g2 v + A e``. Its second column ``(m12, m22 | g2)``, the
    image of a diffuse state, is kept apart from its scale ``rho`` (the product of ``a*a`` over
    the chunk's leading steps that add no information), so that it stays exact where that
    product underflows (a diffuse start, tiny decays: ``a = 1e-170``, or ``1e-20`` in float32).
    ``walk`` is 1 where a decay's square is below the normal range among those leading steps (a
    proper state entering the chunk loses its ``a*a v`` in the map), 2 where one is after them
    (any state does), or where the chunk's maps leave the range (``process_var/obs_var`` past it:
    an entry inf or NaN; a trace whose reciprocal is not normal), else 0: the carries walk such a
    chunk step by step (:func:`carry_kernel`). Else run the filter from the chunk's true start,
    writing the outputs, the log-likelihood and the flags; with ``TANG`` (and not ``WRITE``)
    also the chunk's adjoint map ``mu -> C mu + b`` for unit log-likelihood weight (adjoint.py),
    by carrying the tangents of the three coordinates of the chunk's starting state forward
    (``C``: their values at the chunk's end, ``b``: the log-likelihood's derivative along them),
    so the adjoint needs no pass of its own to compose it."""
    k = tl.program_id(1)
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    t_lo = k * CH
    t_hi = tl.minimum(t_lo + CH, T)
    z0 = tl.load(z_ptr + lanes * zsn, mask=lmask, other=1.0)
    R0 = tl.load(R_ptr + lanes * Rsn, mask=lmask, other=1.0)
    a0 = tl.load(a_ptr + lanes * asn, mask=lmask, other=1.0)
    p0 = tl.load(p_ptr + lanes * psn, mask=lmask, other=1.0)
    h0 = tl.load(h_ptr + lanes * hsn, mask=lmask, other=1.0)
    c0 = tl.load(c_ptr + lanes * csn, mask=lmask, other=1.0)
    one = tl.full([BLOCK], 1.0, z_ptr.dtype.element_ty)
    zero = one * 0.0
    if MAPS:
        m11, m12, m21, m22, g1, g2, A, rho = one, zero, zero, one, zero, zero, one, one
        walk = zero
        traces = zero  # the sum of the steps' traces (before their division)
        pre = lanes >= 0  # no informative step yet: the second column is (0, m22 | 0)
        b11, b12, b21, b22, bg1, bg2, bA = one, zero, zero, one, zero, zero, one
    else:
        if FROM_X0:
            u = tl.load(u0_ptr + lanes * us, mask=lmask, other=1.0)
            e = tl.load(e0_ptr + lanes * es, mask=lmask, other=0.0)
            v = tl.load(v0_ptr + lanes * vs, mask=lmask, other=1.0)
        else:
            u = tl.load(start_ptr + k * N + lanes, mask=lmask, other=1.0)
            e = tl.load(start_ptr + (NC + k) * N + lanes, mask=lmask, other=0.0)
            v = tl.load(start_ptr + (2 * NC + k) * N + lanes, mask=lmask, other=1.0)
        m = carried_mean(u, e)  # (float32's walk carries the mean: kept_update)
        ll = tl.zeros([BLOCK], tl.float64)
        if TANG:  # tangents of the chunk's starting (u, e, v): c<basis><component>
            cuu, cue, cuv = one, zero, zero
            ceu, cee, cev = zero, one, zero
            cvu, cve, cvv = zero, zero, one
            bu, be, bv = zero, zero, zero
        nonfin = lanes < 0
        # the least normalized predicted precision over steps that do not carry a diffuse state
        # on: below the normal range, a lost step (core.steps.lost_steps)
        umin = one
        zinf = lanes < 0
        bad = input_checks(R0, a0, p0, h0, c0, not VR, not VA, not VP, not VH, not VC, lanes < 0)
        # the initial state (chunk 0): u, v >= 0 not both 0, all finite, e = 0 where u = 0
        first = lmask & ((lanes * 0 + k) == 0)
        x0u = tl.load(u0_ptr + lanes * us, mask=first, other=1.0)
        x0e = tl.load(e0_ptr + lanes * es, mask=first, other=0.0)
        x0v = tl.load(v0_ptr + lanes * vs, mask=first, other=1.0)
        bad = bad | ~(x0u >= 0.0) | ~(x0v >= 0.0) | ((x0u == 0.0) & ((x0v == 0.0) | (x0e != 0.0)))
        bad = bad | not_finite(x0u) | not_finite(x0e) | not_finite(x0v)
        if not VZ:
            zinf = (z0 == z0) & not_finite(z0)
    # the loads of later steps are issued ahead of use (software pipeline, NS stages)
    for t in tl.range(t_lo, t_hi, num_stages=NS):
        a = ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
        p = ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
        c = ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
        z = ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
        R = ld(R_ptr, Rst, Rsn, t, lanes, lmask, VR, R0)
        h = ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
        q, d, al, forget = predict_coeffs(a, p)
        obs, rinv, zz, phi, r = observation(z, R, h)
        if MAPS:
            # the step's map [[1 + p phi, q + d phi | 0], [p, d | 0], [c + r p, q c + r d | al]]
            l11 = 1.0 + p * phi
            l12 = q + d * phi
            lg1 = c + r * p
            lg2 = c * q + r * d
            # while the second column is the diffuse axis, a step that keeps the past maps it to
            # d (phi, 1 | r): the factor d goes to rho, so that the column (the image of a
            # diffuse state) never underflows (the inputs alone decide: off the map's chain)
            dif = pre & ~forget
            # decays whose square is below the normal range (or past its reciprocal: inf in
            # the leaf), which the map cannot carry: the carries walk such chunks
            odd_a = small_decay(a, one, forget) | (a * a > 1.0 / tiny_of(a))
            walk = tl.maximum(walk, tl.where(odd_a, tl.where(pre, 1.0, 2.0), 0.0))
            k12 = tl.where(dif, phi, l12)
            k22 = tl.where(dif, 1.0, d)
            kg2 = tl.where(dif, r, lg2)
            rho = rho * tl.where(dif, d, 1.0)
            pre = dif & (phi + tl.abs(r) == 0.0)
            n11 = l11 * m11 + l12 * m21
            n12 = l11 * m12 + k12 * m22
            n21 = p * m11 + d * m21
            n22 = p * m12 + k22 * m22
            ng1 = lg1 * m11 + lg2 * m21 + al * g1
            ng2 = lg1 * m12 + kg2 * m22 + al * g2
            tr = n11 + n22
            traces += tr  # (range checked after the loop)
            sc = rcp(tr)  # any positive factor: the map acts projectively
            m11 = n11 * sc
            m12 = n12 * sc
            m21 = n21 * sc
            m22 = n22 * sc
            g1 = ng1 * sc
            g2 = ng2 * sc
            A = al * A * sc
            if BMAPS:
                # backward information filter, step t (observation, then back to t-1), applied
                # before the maps of the later steps: P <- P M_t with M_t on (U, V | E) =
                # [[a^2, a^2 phi | 0], [p, 1 + p phi | 0], [-a c, a (r - c phi) | a]]
                # ([[0, 0], [1, 1]] and 0 where the step forgets; a chunk holding a decay
                # whose square leaves the normal range is walked by the carry instead)
                a2 = tl.where(forget, 0.0, a * a)
                k12 = a2 * phi
                k21 = tl.where(forget, 1.0, p)
                k22 = tl.where(forget, 1.0, l11)
                kg1 = -al * c
                kg2 = al * (r - c * phi)
                o11 = b11 * a2 + b12 * k21
                o12 = b11 * k12 + b12 * k22
                o21 = b21 * a2 + b22 * k21
                o22 = b21 * k12 + b22 * k22
                og1 = bg1 * a2 + bg2 * k21 + bA * kg1
                og2 = bg1 * k12 + bg2 * k22 + bA * kg2
                tr = o11 + o22
                traces += tr
                sb = rcp(tr)
                b11 = o11 * sb
                b12 = o12 * sb
                b21 = o21 * sb
                b22 = o22 * sb
                bg1 = og1 * sb
                bg2 = og2 * sb
                bA = bA * al * sb
        else:
            if CKPT:
                at_ck = lmask & ((lanes * 0 + t) % CK == 0)
                cko = (t // CK) * 3 * N + lanes
                tl.store(ck_ptr + cko, u, mask=at_ck)
                tl.store(ck_ptr + cko + N, e, mask=at_ck)
                tl.store(ck_ptr + cko + 2 * N, v, mask=at_ck)
            bad = input_checks(R, a, p, h, c, VR, VA, VP, VH, VC, bad)
            if VZ:
                zinf = zinf | ((z == z) & not_finite(z))
            U = u + q * v
            V = p * u + d * v
            V = keep_diffuse(U, V, v)
            off = t * N + lanes
            if WRITE:
                E = c * U + al * e
                small = small_decay(a, U, forget)
                pm, pv, pp, _, um, em, vm = pred_ratios(U, E, V, e, v, a, p, c, al, small)
                em, mp = kept_pred(um, em, c, al, m)
                if one.dtype == tl.float32:
                    pm = tl.where(um > 0.0, mp, pm)
                tl.store(pmean_ptr + off, pm, mask=lmask)
                tl.store(pvar_ptr + off, pv, mask=lmask)
                tl.store(pprec_ptr + off, pp, mask=lmask)
            else:
                big1 = U >= V
                r1, um, em, vm = normalized_pred(U, V, e, v, a, p, c, al)
                em, mp = kept_pred(um, em, c, al, m)
            umin = tl.minimum(umin, tl.where(u + um > 0.0, um, 1.0))
            llt = loglik_term(obs, zz, R, h, um, em, vm)
            ll += llt.to(tl.float64)
            U = um + phi * vm
            E = em + r * vm
            if WRITE:
                mean, var, prec, info, u, e, v = ratios(U, E, vm)
                if one.dtype == tl.float32:
                    m = kept_update(U, E, vm, um, mp, phi, r, zz, h, rcp(U))
                    kept = (U > 0.0) & ~not_finite(m)
                    mean = tl.where(kept, m, mean)
                    info = tl.where(kept, m * prec, info)
                    e = tl.where(U >= vm, mean, info)
                tl.store(mean_ptr + off, mean, mask=lmask)
                tl.store(var_ptr + off, var, mask=lmask)
                tl.store(prec_ptr + off, prec, mask=lmask)
                tl.store(info_ptr + off, info, mask=lmask)
            else:
                big2 = U >= vm
                r2 = rcp(tl.maximum(U, vm))
                u, e, v = U * r2, E * r2, vm * r2
                if one.dtype == tl.float32:
                    m = kept_update(U, E, vm, um, mp, phi, r, zz, h,
                                    tl.where(big2, r2, rcp(U)))  # fmt: skip
                    e = tl.where((U > 0.0) & ~not_finite(m), u * m, e)
                if TANG:
                    du, de, dv, _, _, _ = loglik_grads(obs, zz, R, h, um, em, vm)
                    sv = (q, d, al, c, p, phi, r, um, em, vm, r1, big1, u, e, v, r2, big2,
                          du, de, dv, a)  # fmt: skip
                    cuu, cue, cuv, dl = tangent_step(cuu, cue, cuv, *sv)
                    bu += dl
                    ceu, cee, cev, dl = tangent_step(ceu, cee, cev, *sv)
                    be += dl
                    cvu, cve, cvv, dl = tangent_step(cvu, cve, cvv, *sv)
                    bv += dl
            nonfin = nonfin | not_finite(e) | not_finite(u + v)  # (the log-likelihood: below)
    if MAPS:
        # p phi, r p past the range (obs_var tiny against process_var), or a trace whose
        # reciprocal is not a normal number (flushed to 0 in float32): such a map holds an entry
        # inf or NaN, which stays in it to its end (NaN times 0 is NaN), or a trace sum at or
        # past 1/tiny. The carries walk the chunk whatever state enters it (the steps' own
        # arithmetic, exact where the filter is), at no cost a step to the other chunks
        size = traces + (m12 + m21 + tl.abs(g1) + tl.abs(g2) + tl.abs(A))
        if BMAPS:
            size += b12 + b21 + tl.abs(bg1) + tl.abs(bg2) + tl.abs(bA)
        walk = tl.where(size * tiny_of(size) < 1.0, walk, 2.0)
        base = comp_ptr + k * N + lanes
        step = NC * N
        tl.store(base, m11, mask=lmask)
        tl.store(base + step, m12, mask=lmask)
        tl.store(base + 2 * step, m21, mask=lmask)
        tl.store(base + 3 * step, m22, mask=lmask)
        tl.store(base + 4 * step, g1, mask=lmask)
        tl.store(base + 5 * step, g2, mask=lmask)
        tl.store(base + 6 * step, A, mask=lmask)
        tl.store(base + 7 * step, rho, mask=lmask)
        tl.store(base + 8 * step, walk, mask=lmask)
        if BMAPS:
            tl.store(base + 9 * step, b11, mask=lmask)
            tl.store(base + 10 * step, b12, mask=lmask)
            tl.store(base + 11 * step, b21, mask=lmask)
            tl.store(base + 12 * step, b22, mask=lmask)
            tl.store(base + 13 * step, bg1, mask=lmask)
            tl.store(base + 14 * step, bg2, mask=lmask)
            tl.store(base + 15 * step, bA, mask=lmask)
    else:
        if TANG:  # the layout of adjoint.py's maps: entry 3 * component + basis, then b
            base = comp_ptr + k * N + lanes
            step = NC * N
            tl.store(base, cuu, mask=lmask)
            tl.store(base + step, ceu, mask=lmask)
            tl.store(base + 2 * step, cvu, mask=lmask)
            tl.store(base + 3 * step, cue, mask=lmask)
            tl.store(base + 4 * step, cee, mask=lmask)
            tl.store(base + 5 * step, cve, mask=lmask)
            tl.store(base + 6 * step, cuv, mask=lmask)
            tl.store(base + 7 * step, cev, mask=lmask)
            tl.store(base + 8 * step, cvv, mask=lmask)
            tl.store(base + 9 * step, bu, mask=lmask)
            tl.store(base + 10 * step, be, mask=lmask)
            tl.store(base + 11 * step, bv, mask=lmask)
        # a term not finite shows in the float64 sum; a lane with a lost step is NaN by design
        lost = umin < tiny_of(umin)
        nonfin = nonfin | (not_finite(ll) & ~lost)
        ll = tl.where(lost, float("nan"), ll)
        if PARTIAL:
            tl.store(ll_ptr + k * N + lanes, ll, mask=lmask)
        else:
            tl.store(ll_ptr + lanes, ll.to(ll_ptr.dtype.element_ty), mask=lmask)
        last = lmask & ((lanes * 0 + k) == NC - 1)
        tl.store(fin_ptr + lanes, u, mask=last)
        tl.store(fin_ptr + N + lanes, e, mask=last)
        tl.store(fin_ptr + 2 * N + lanes, v, mask=last)
        f = flag_bits(nonfin, zinf, bad) | (lost.to(tl.int32) * 8)
        tl.atomic_or(flags_ptr + lanes * 0, f, mask=lmask & (f != 0))


@triton.jit
def carry_kernel(
    comp_ptr, u0_ptr, e0_ptr, v0_ptr, us, es, vs, start_ptr, bend_ptr, N, NC,
    z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn, T, CH,
    FWD: tl.constexpr, BWD: tl.constexpr, NS: tl.constexpr, CT: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Walk the chunk maps. ``FWD``: the state entering chunk k (``start [3, NC, N]``, from
    ``x0``), ``CT`` chunks at a time: their maps loaded as one ``[CT, BLOCK]`` tile, composed
    by a prefix scan and applied to the state entering the tile. Where a lane's chunk holds a
    decay whose square is below the normal range (the maps' ``walk`` entry), which its map
    cannot carry for a proper state, the program walks its chunks again one after the other,
    such chunks step by step from the inputs (``z, R, a, p, h, c``: pointers and strides; the
    exact state, paid only where such a decay is). ``BWD``: the backward information state at
    the last step of chunk k (``bend [3, NC, N]``, ``(0, 0, 1)`` at the last chunk), one chunk
    after the other."""
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    step = NC * N
    if FWD:
        u = tl.load(u0_ptr + lanes * us, mask=lmask, other=1.0)
        e = tl.load(e0_ptr + lanes * es, mask=lmask, other=0.0)
        v = tl.load(v0_ptr + lanes * vs, mask=lmask, other=1.0)
        u0, e0, v0 = u, e, v
        tl.store(start_ptr + lanes, u, mask=lmask)
        tl.store(start_ptr + step + lanes, e, mask=lmask)
        tl.store(start_ptr + 2 * step + lanes, v, mask=lmask)
        rows = tl.arange(0, CT)[:, None]
        last = rows == CT - 1
        need = tl.zeros([CT, BLOCK], comp_ptr.dtype.element_ty)  # reduced after the tiles
        for k0 in tl.range(0, NC - 1, CT, num_stages=2):  # the next tile loads during this one
            kk = k0 + rows  # maps of chunks 0 .. NC-2 give the starts of chunks 1 .. NC-1
            m = lmask[None, :] & (kk < NC - 1)
            base = comp_ptr + kk * N + lanes[None, :]
            # outside the range: the identity map
            m11 = tl.load(base, mask=m, other=1.0)
            m12 = tl.load(base + step, mask=m, other=0.0)
            m21 = tl.load(base + 2 * step, mask=m, other=0.0)
            m22 = tl.load(base + 3 * step, mask=m, other=1.0)
            g1 = tl.load(base + 4 * step, mask=m, other=0.0)
            g2 = tl.load(base + 5 * step, mask=m, other=0.0)
            A = tl.load(base + 6 * step, mask=m, other=1.0)
            rho = tl.load(base + 7 * step, mask=m, other=1.0)
            walk = tl.load(base + 8 * step, mask=m, other=0.0)
            need = tl.maximum(need, walk)
            m11, m12, m21, m22, g1, g2, A, rho = tl.associative_scan(
                (m11, m12, m21, m22, g1, g2, A, rho), 0, compose_maps
            )
            # a diffuse state (u = 0, e = 0) goes to the second column, else the map's own
            # (the second column times rho); normalized by division (the column may be tiny)
            w = tl.where(u[None, :] == 0.0, 1.0, rho) * v[None, :]
            U = m11 * u[None, :] + m12 * w
            V = m21 * u[None, :] + m22 * w
            E = g1 * u[None, :] + g2 * w + A * e[None, :]
            mx = tl.maximum(U, V)
            U, E, V = U / mx, E / mx, V / mx
            out = start_ptr + (kk + 1) * N + lanes[None, :]
            tl.store(out, U, mask=m)
            tl.store(out + step, E, mask=m)
            tl.store(out + 2 * step, V, mask=m)
            # the state after the tile (its last row: masked rows are the identity)
            u = tl.sum(tl.where(last, U, 0.0), 0)
            e = tl.sum(tl.where(last, E, 0.0), 0)
            v = tl.sum(tl.where(last, V, 0.0), 0)
        if tl.max(tl.max(need, 0), 0) > 0.0:  # a map may not hold a step: chunk by chunk
            u, e, v = u0, e0, v0
            for kk in range(0, NC - 1):
                base = comp_ptr + kk * N + lanes
                flag = tl.load(base + 8 * step, mask=lmask, other=0.0)
                steps = lmask & ((flag > 1.5) | ((flag > 0.5) & (u > 0.0)))
                un, en, vn = map_start(base, step, lmask, u, e, v)
                if tl.max(steps.to(tl.int32), 0) > 0:
                    uw, ew, vw = walk_chunk(u, e, v, steps, z_ptr, zst, zsn, R_ptr, Rst, Rsn,
                                            a_ptr, ast, asn, p_ptr, pst, psn, h_ptr, hst, hsn,
                                            c_ptr, cst, csn, lanes, kk * CH,
                                            tl.minimum(kk * CH + CH, T))  # fmt: skip
                    un = tl.where(steps, uw, un)
                    en = tl.where(steps, ew, en)
                    vn = tl.where(steps, vw, vn)
                u, e, v = un, en, vn
                out = start_ptr + (kk + 1) * N + lanes
                tl.store(out, u, mask=lmask)
                tl.store(out + step, e, mask=lmask)
                tl.store(out + 2 * step, v, mask=lmask)
    if BWD:
        U = tl.zeros([BLOCK], comp_ptr.dtype.element_ty)
        E = U * 0.0
        V = U + 1.0
        last = NC - 1
        tl.store(bend_ptr + last * N + lanes, U, mask=lmask)
        tl.store(bend_ptr + step + last * N + lanes, E, mask=lmask)
        tl.store(bend_ptr + 2 * step + last * N + lanes, V, mask=lmask)
        for j in tl.range(0, NC - 1, num_stages=NS):
            kk = NC - 1 - j  # chunk kk's backward map gives the state at the end of chunk kk-1
            Un, En, Vn = apply_map(comp_ptr + (9 * NC + kk) * N + lanes, step, lmask, U, E, V)
            # a chunk holding a decay whose square leaves the normal range (the maps' walk
            # entry): its map loses a*a U; walked back step by step from the inputs
            flag = tl.load(comp_ptr + (8 * NC + kk) * N + lanes, mask=lmask, other=0.0)
            steps = lmask & (flag > 0.5)
            if tl.max(steps.to(tl.int32), 0) > 0:
                Uw, Ew, Vw = walk_back_chunk(U, E, V, steps, z_ptr, zst, zsn, R_ptr, Rst, Rsn,
                                             a_ptr, ast, asn, p_ptr, pst, psn, h_ptr, hst, hsn,
                                             c_ptr, cst, csn, lanes, kk * CH,
                                             tl.minimum(kk * CH + CH, T))  # fmt: skip
                Un = tl.where(steps, Uw, Un)
                En = tl.where(steps, Ew, En)
                Vn = tl.where(steps, Vw, Vn)
            U, E, V = Un, En, Vn
            tl.store(bend_ptr + (kk - 1) * N + lanes, U, mask=lmask)
            tl.store(bend_ptr + step + (kk - 1) * N + lanes, E, mask=lmask)
            tl.store(bend_ptr + 2 * step + (kk - 1) * N + lanes, V, mask=lmask)


@triton.jit
def smooth_kernel(
    z_ptr, zst, zsn, R_ptr, Rst, Rsn, a_ptr, ast, asn,
    p_ptr, pst, psn, h_ptr, hst, hsn, c_ptr, cst, csn,
    mean_ptr, var_ptr,  # [T, N] filtered mean and variance (the filtered triple, rebuilt)
    bend_ptr,  # [3, NC, N] backward state at the last step of each chunk (NC > 1)
    smean_ptr, svar_ptr,  # [T, N] outputs
    T, N, CH, NC,
    VZ: tl.constexpr, VR: tl.constexpr, VA: tl.constexpr,
    VP: tl.constexpr, VH: tl.constexpr, VC: tl.constexpr,
    FROM_END: tl.constexpr, NS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The backward information filter over chunk ``program_id(1)`` (from its last step down),
    combined at each step with the filtered triple by adding precisions (two-filter form)."""
    k = tl.program_id(1)
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lmask = lanes < N
    t_lo = k * CH
    t_hi = tl.minimum(t_lo + CH, T)
    z0 = tl.load(z_ptr + lanes * zsn, mask=lmask, other=1.0)
    R0 = tl.load(R_ptr + lanes * Rsn, mask=lmask, other=1.0)
    a0 = tl.load(a_ptr + lanes * asn, mask=lmask, other=1.0)
    p0 = tl.load(p_ptr + lanes * psn, mask=lmask, other=1.0)
    h0 = tl.load(h_ptr + lanes * hsn, mask=lmask, other=1.0)
    c0 = tl.load(c_ptr + lanes * csn, mask=lmask, other=1.0)
    if FROM_END:
        BU = tl.zeros([BLOCK], z_ptr.dtype.element_ty)
        BE = BU * 0.0
        BV = BU + 1.0
    else:
        BU = tl.load(bend_ptr + k * N + lanes, mask=lmask, other=0.0)
        BE = tl.load(bend_ptr + (NC + k) * N + lanes, mask=lmask, other=0.0)
        BV = tl.load(bend_ptr + (2 * NC + k) * N + lanes, mask=lmask, other=1.0)
    for j in tl.range(0, t_hi - t_lo, num_stages=NS):
        t = t_hi - 1 - j
        off = t * N + lanes
        mean = tl.load(mean_ptr + off, mask=lmask, other=0.0)
        var = tl.load(var_ptr + off, mask=lmask, other=1.0)
        a = ld(a_ptr, ast, asn, t, lanes, lmask, VA, a0)
        p = ld(p_ptr, pst, psn, t, lanes, lmask, VP, p0)
        c = ld(c_ptr, cst, csn, t, lanes, lmask, VC, c0)
        z = ld(z_ptr, zst, zsn, t, lanes, lmask, VZ, z0)
        R = ld(R_ptr, Rst, Rsn, t, lanes, lmask, VR, R0)
        h = ld(h_ptr, hst, hsn, t, lanes, lmask, VH, h0)
        # the filtered triple from (mean, var): (1, mean, var) or (1/var, mean/var, 1)
        small = var <= 1.0
        known = var < float("inf")
        rvar = tl.where(known, rcp(var), 0.0)
        u = tl.where(small, 1.0, rvar)
        v = tl.where(small, var, 1.0)
        e = tl.where(small, mean, tl.where(known, mean * rvar, 0.0))
        den = u * BV + BU * v
        rden = rcp(den)
        # (neither filter holds any precision: NaN mean and inf variance, as the other backends)
        sm = tl.where(den > 0.0, (e * BV + BE * v) * rden, float("nan"))
        sv = tl.where(den > 0.0, v * BV * rden, float("inf"))
        exact = (v == 0.0) & (BV == 0.0)
        tl.store(smean_ptr + off, tl.where(exact, e, sm), mask=lmask)
        tl.store(svar_ptr + off, tl.where(exact, 0.0, sv), mask=lmask)
        # the information of step t's observation, then back through step t's dynamics
        BU, BE, BV = back_step(BU, BE, BV, z, R, h, a, p, c)
