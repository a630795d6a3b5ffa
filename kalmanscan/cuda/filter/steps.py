"""Per-step device helpers of the scalar filter's kernels (kernels.py) and its adjoint
(adjoint.py), in the notation of kernels.py: the predict and update of a normalized triple
``(u, e, v)``, its ratios, the float32 mean carried past the normalizations, the smoother's
backward step, the log-likelihood term and its derivatives, the tangent step, and the input
range checks and flag bits.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper, interpreting

LOG_2PI = tl.constexpr(math.log(2 * math.pi))


if interpreting():

    def rcp(x):
        """``1 / x`` (the interpreter runs numpy division)."""
        return 1.0 / x

else:

    @triton.jit
    def rcp(x):
        """``1 / x``: in float32 one hardware reciprocal (``rcp.approx.ftz``, relative error
        below 2^-22; 0 -> inf, inf -> 0), where ``1.0 / x`` takes about 8 instructions; float64
        divides."""
        if x.dtype == tl.float32:
            r = tl.inline_asm_elementwise(
                "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            r = 1.0 / x
        return r


@helper
def ld(ptr, st, sn, t, lanes, lmask, VARY: tl.constexpr, pre):
    """Input at step ``t`` (``pre``, loaded once before the loop, when it does not vary in time)."""
    if VARY:
        return tl.load(ptr + t * st + lanes * sn, mask=lmask, other=1.0)
    else:
        return pre


@helper
def not_finite(x):
    """True where ``x`` is inf or NaN."""
    return x * 0.0 != 0.0


@helper
def tiny_of(x):
    """The smallest normal number of ``x``'s dtype."""
    if x.dtype == tl.float64:
        tiny = 2.2250738585072014e-308
    else:
        tiny = 1.1754943508222875e-38
    return tiny


@helper
def keep_diffuse(U, V, v):
    """The predicted ``V``, or ``v`` where the predicted triple is diffuse (``U = 0``: ``u = 0``
    and the step keeps the past) and ``V = a*a v`` is below the normal range: a diffuse state
    stays ``(0, 0, 1)`` where ``a*a`` underflows or is subnormal (whose reciprocal overflows)."""
    return tl.where((U > 0.0) | (V >= tiny_of(V)), V, v)


@helper
def predict_coeffs(a, p):
    """``(q, d, al, forget)`` of the predict step (``al = a (1 - q)``)."""
    forget = a == 0.0
    q = tl.where(forget, 1.0, 0.0)
    d = tl.where(forget, p, a * a)
    al = tl.where(forget, 0.0, a)
    return q, d, al, forget


@helper
def normal(x):
    """``x`` at least the smallest normal number of its dtype."""
    return x >= tiny_of(x)


@helper
def small_decay(a, U, forget):
    """Where ``a*a`` is below the normal range (``a != 0``) and the past is known (``U = u``
    normal): the predicted triple is formed after its division (:func:`normalized_pred`), as
    ``a*a v`` (and ``a e``) underflowed (``var = 1e100``, ``a = 1e-170``, ``p = 0``: the
    predicted variance 0 instead of 1e-240)."""
    return ~normal(a * a) & ~forget & normal(U)


@helper
def normalized_pred(U, V, e, v, a, p, c, al):
    """``(r1, um, em, vm)``: ``r1 = 1 / max(U, V)`` and the predicted triple ``(U, c U + al e,
    p U + a (a v))`` times ``r1``, its terms divided before they are added (``e r1`` and ``a (v
    r1) a``), so that ``a*a v`` and ``a e`` keep their digits where ``a*a`` is below the normal
    range (``var = 1e100``, ``a = 1e-170``, ``p = 0``: the predicted variance 1e-240, not 0); a
    step that forgets (``a = 0``, ``U = u + v``) gives ``p U``. ``vm = 1`` where ``U = 0`` (a
    diffuse state, ``V`` from :func:`keep_diffuse`)."""
    r1 = rcp(tl.maximum(U, V))
    um = U * r1
    em = c * um + al * (e * r1)
    vm = tl.where(U > 0.0, p * um + (a * (v * r1)) * a, 1.0)
    return r1, um, em, vm


@helper
def observation(z, R, h):
    """``(obs, rinv, zz, phi, r)``: observed mask, ``1/R`` and ``z`` there (0 elsewhere)."""
    obs = (z == z) & (R < float("inf"))
    rinv = tl.where(obs, rcp(R), 0.0)
    zz = tl.where(obs, z, 0.0)
    return obs, rinv, zz, rinv * h * h, rinv * h * zz


@helper
def normalize(U, E, V):
    """``(U, E, V) / max(U, V)``."""
    rn = rcp(tl.maximum(U, V))
    return U * rn, E * rn, V * rn


@helper
def ratios(U, E, V):
    """``(mean, var, precision, info)`` of an unnormalized triple and the normalized triple
    (two reciprocals serve both)."""
    rU = rcp(U)
    rV = rcp(V)
    mean = E * rU
    var = V * rU
    prec = U * rV
    info = E * rV
    big = U >= V
    u = tl.where(big, 1.0, prec)
    v = tl.where(big, var, 1.0)
    e = tl.where(big, mean, info)
    return mean, var, prec, info, u, e, v


@helper
def pred_ratios(U, E, V, e, v, a, p, c, al, small):
    """:func:`ratios` of the predicted triple; where ``small`` (:func:`small_decay`) the mean
    and variance from the state ``(u, e, v) = (U, e, v)`` divided first."""
    rU = rcp(U)
    mean = tl.where(small, c + al * (e * rU), E * rU)
    var = tl.where(small, p + (a * (v * rU)) * a, V * rU)
    rV = rcp(tl.where(small, var, V))
    prec = tl.where(small, rV, U * rV)
    info = tl.where(small, mean * rV, E * rV)
    big = (small & (var <= 1.0)) | (~small & (U >= V))
    u = tl.where(big, 1.0, prec)
    v = tl.where(big, var, 1.0)
    e = tl.where(big, mean, info)
    return mean, var, prec, info, u, e, v


@helper
def exact_step(u, e, v, a, p, c, z, R, h):
    """The normalized state after one step (the filter kernel's arithmetic; the carry walks a
    chunk with it where the chunk's map cannot hold a step, :func:`carry_kernel`)."""
    q, d, al, forget = predict_coeffs(a, p)
    U = u + q * v
    V = p * u + d * v
    V = keep_diffuse(U, V, v)
    _, um, em, vm = normalized_pred(U, V, e, v, a, p, c, al)
    _, _, _, phi, r = observation(z, R, h)
    return normalize(um + phi * vm, em + r * vm, vm)


@helper
def carried_mean(u, e):
    """The mean ``e / u`` of a state entering a walk that carries its mean (float32,
    :func:`kept_update`); 0 where ``u = 0`` (a diffuse state, whose mean no step reads)."""
    known = u > 0.0
    return tl.where(known, e * rcp(tl.where(known, u, 1.0)), 0.0)


@helper
def kept_pred(um, em, c, al, m):
    """float32: ``(em, mp)``, the predicted mean ``mp = c + al m`` from the carried filtered mean
    ``m`` and the normalized predicted information ``um mp`` where the past is known (``um >
    0``), so that no normalization's rounding enters the mean (:func:`kept_update`); float64:
    ``em`` as given. Where ``mp`` is not finite (a carried mean past float32's range, as on a
    lane whose variance left it: the normalized triple still holds it as ``em / um``) ``em`` as
    given, and :func:`kept_update` returns the plain ratio."""
    if um.dtype == tl.float32:
        mp = c + al * m
        em = tl.where((um > 0.0) & ~not_finite(mp), um * mp, em)
    else:
        mp = m
    return em, mp


@helper
def kept_update(U, E, vm, um, mp, phi, r, zz, h, rU):
    """float32: the updated mean from the predicted one ``mp`` (``rU = 1 / U``, ``U = um + phi
    vm``) with weights on ``mp`` and the observation's state ``z / h`` that sum to 1 whatever
    the roundings: the nearer end plus the step toward the other (``mp + g (z/h - mp)`` where
    the observation's weight ``g`` is below a half, ``z/h + (1 - g) (mp - z/h)`` above, where
    the first form cancels); ``E / U`` where the prior is diffuse. The plain ratio ``E / U``
    weighs ``mp`` and ``z/h`` by ``um / U`` and ``phi vm / U``, whose sum misses 1 by ``U``'s
    rounding, the same every step once the variance settles (and the hardware reciprocal's
    error likewise): the filter tracked a decay ``a (1 - d)``, and a shared decay's gradient on
    a random walk of 10^6 steps was 51 % off (core.steps._REPEATED_ROUNDING)."""
    var1 = vm * rU
    g = phi * var1
    toward_z = mp + var1 * (r - phi * mp)
    zh = zz * rcp(tl.where(h != 0.0, h, 1.0))
    toward_m = zh + (um * rU) * (mp - zh)
    m1 = tl.where(g > 0.5, toward_m, toward_z)
    # no observation: the prediction (var1 is inf where U is below 1 / float32's maximum, and
    # inf times 0 was NaN)
    m1 = tl.where((phi == 0.0) & (r == 0.0), mp, m1)
    # the plain ratio where the kept form is not finite (mp past the range, kept_pred) or the
    # prior is diffuse; 0 where the state stays diffuse, U = 0 (a step that forgets reads the
    # carried mean times al = 0, and 0 * NaN was NaN)
    return tl.where((um > 0.0) & ~not_finite(m1), m1, tl.where(U > 0.0, E * rU, 0.0))


@helper
def back_step(U, E, V, z, R, h, a, p, c):
    """The smoother's backward information filter, one step back through step t's inputs
    (kalmanscan.core.sequential.backward_step): add the observation in its ``R``-scaled form
    ``(R U + h^2 V, R E + h z V, R V)`` (no ``1/R``: ``process_var/obs_var`` past the range
    stays finite), normalize, step back through the dynamics divided by ``|a|``, ``(|a| U,
    sign(a) (E - c U), (V + p U) / |a|)`` (no ``a*a`` to under- or overflow; ``(V + p U)/|a|``
    held at a quarter of the range where it would pass it, as the other backends do; ``(0, 0,
    1)`` where the step forgets, ``a == 0``), normalize."""
    if U.dtype == tl.float64:
        top = 4.49423283715579e307  # finfo.max / 4
    else:
        top = 8.507059e37
    obs = (z == z) & (R < float("inf"))
    Ro = tl.where(obs, R, 1.0)
    ho = tl.where(obs, h, 0.0)
    hV = ho * V
    U1, E1, V1 = normalize(Ro * U + ho * hV, Ro * E + tl.where(obs, z, 0.0) * hV, Ro * V)
    forget = a == 0.0
    s = tl.where(forget, 1.0, tl.abs(a))
    y = E1 - c * U1
    w = tl.where(forget, U1 + V1, V1 + p * U1)
    u = tl.where(forget, 0.0, s * U1)
    e = tl.where(forget, 0.0, tl.where(a < 0.0, -y, y))
    v = tl.minimum(w, s * top) / s
    return normalize(u, e, v)


@helper
def loglik_term(obs, zz, R, h, um, em, vm):
    """Log-likelihood of one step from the normalized predicted triple (exact diffuse
    convention: 0 where not observed, and where ``um = 0`` unless ``h = 0``)."""
    known = um > 0.0
    contrib = obs & (known | (h == 0.0))
    uk = tl.where(known, um, 1.0)
    Rs = tl.where(obs, R, 1.0)
    S = tl.where(contrib, h * h * vm + Rs * uk, 1.0)
    w = zz * uk - h * em
    ll = -0.5 * (LOG_2PI + tl.log(S) - tl.log(uk) + w * w * rcp(uk * S))
    return tl.where(contrib, ll, 0.0)


@helper
def loglik_grads(obs, zz, R, h, um, em, vm):
    """Derivatives of one step's log-likelihood term with respect to the normalized predicted
    triple and to ``z, R, h``: ``(du, de, dv, dz, dR, dh)`` (0 where it adds nothing)."""
    known = um > 0.0
    contrib = obs & (known | (h == 0.0))
    uk = tl.where(known, um, 1.0)
    Rs = tl.where(obs, R, 1.0)
    S = tl.where(contrib, h * h * vm + Rs * uk, 1.0)
    iS = rcp(S)
    iu = rcp(uk)
    w = zz * uk - h * em
    wS = w * iS
    q2 = w * wS * iu
    oq = 1.0 - q2
    state = contrib & known
    du = tl.where(state, -0.5 * (Rs * iS - iu + 2.0 * zz * wS * iu - q2 * (iu + Rs * iS)), 0.0)
    de = tl.where(state, h * wS * iu, 0.0)
    dv = tl.where(state, -0.5 * h * h * iS * oq, 0.0)
    dz = tl.where(contrib, -wS, 0.0)
    dR = tl.where(contrib, -0.5 * uk * iS * oq, 0.0)
    dh = tl.where(contrib, em * wS * iu - h * vm * iS * oq, 0.0)
    return du, de, dv, dz, dR, dh


@helper
def tangent_step(tu, te, tv, q, d, al, c, p, phi, r, um, em, vm, r1, big1, yu, ye, yv, r2, big2,
                 du, de, dv, a):  # fmt: skip
    """One step of a tangent ``(tu, te, tv)`` of the normalized state through the predict, its
    normalization, the update and its normalization (the normalized coordinate's tangent is 0),
    and the log-likelihood term's derivative along it: ``(tu, te, tv, dll)`` (the predict's
    terms divided by ``max(U, V)`` before they are added, as :func:`normalized_pred` forms
    them)."""
    tU = tu + q * tv
    tm = tl.where(big1, tU, p * tu + d * tv)
    tum = tl.where(big1, 0.0, (tU - um * tm) * r1)
    tUr = tU * r1
    tmr = tm * r1
    tem = c * tUr + al * (te * r1) - em * tmr
    tvm = tl.where(big1, p * tUr + (a * (tv * r1)) * a - vm * tmr, 0.0)
    dll = du * tum + de * tem + dv * tvm
    tU = tum + phi * tvm
    tE = tem + r * tvm
    t2 = tl.where(big2, tU, tvm)
    return (tl.where(big2, 0.0, (tU - yu * t2) * r2), (tE - ye * t2) * r2,
            tl.where(big2, (tvm - yv * t2) * r2, 0.0), dll)  # fmt: skip


@helper
def input_checks(
    R, a, p, h, c, CHECK_R: tl.constexpr, CHECK_A: tl.constexpr, CHECK_P: tl.constexpr,
    CHECK_H: tl.constexpr, CHECK_C: tl.constexpr, bad,
):  # fmt: skip
    """``bad`` or'ed with the range checks of the inputs selected by the constexprs."""
    if CHECK_R:
        bad = bad | ~(R > 0.0)
    if CHECK_A:
        bad = bad | not_finite(a)
    if CHECK_P:
        bad = bad | ~(p >= 0.0) | not_finite(p)
    if CHECK_H:
        bad = bad | not_finite(h)
    if CHECK_C:
        bad = bad | not_finite(c)
    if CHECK_R or CHECK_H:
        hh = h * h
        bad = bad | ((R < float("inf")) & not_finite(hh / R))
        # h^2 and h^2/R 0 or normal, else flagged for the API to decide (core/filter.py)
        tiny = tiny_of(hh)
        small = (hh < tiny) | ((R < float("inf")) & (hh < tiny * R))
        bad = bad | ((h != 0.0) & small)
    return bad


@helper
def flag_bits(nonfin, zinf, bad):
    return nonfin.to(tl.int32) | (zinf.to(tl.int32) * 2) | (bad.to(tl.int32) * 4)
