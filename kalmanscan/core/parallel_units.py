"""The scans' units (the "Units" paragraph of :mod:`kalmanscan.core.parallel`): a lane's unit
``max(1, max p)`` where it serves every step and its leaves stay in range; else per-step powers of
two near the variance the state carries (a scan of clamps on logs), with every leaf formed
exactly in them.

Part of :mod:`kalmanscan.core.parallel`, which re-exports these names.
"""

from __future__ import annotations

import math

import torch

from kalmanscan.core.scan import clamp_scan
from kalmanscan.core.steps import (
    _LOW,
    _exponent,
    _ScaledProduct,
    _split_product,
    _times_pow2,
    hold_exponent,
)


def _lane_scale(p):
    """Per-lane unit of the scans' precision coordinate: ``k = max(1, max_t p)``.

    The scan runs on ``(k u, k e, v)`` (precision ``k lam``), which turns a huge process variance's
    leaf ``[[1, 0], [p, a^2]]`` into ``[[1, 0], [p/k, a^2]]``: products of such leaves then stay in
    range where the unscaled ones would underflow (``1/p^2``) though the beliefs they give do not.
    """
    return torch.clamp(p.amax(0, keepdim=True), min=1.0)


# a lane's unit serves every step whose own variance is within this factor of it (ordinary
# models are within 1e6); beyond, the scan takes per-step units (_carried_units). float64:
# 2**300 let a lane of process variances up to 1e60 carry a variance of 1e-200 at 1e-260 of
# its unit, and the products lost it (2.6e-4 off). float32: a lane whose process variance
# reached 1e30 held a variance of 1e-14 elsewhere with 1e-44 of its unit (12 % off)
_STEP_UNIT_SPREAD = {torch.float64: 2.0**64, torch.float32: 2.0**37}
# nor where a step's variance coordinate A21/k would fall below this (filter._tiny_below's
# bound: its digits hold in the scan's products), though the step's own variance is below 1
# and within the spread: obs_var = process_var = 1e-140 with one process_var of 1e80 gave
# A21/k = 3e-360 (filtered variances 0); float32 (obs_var 1e-12, one 1e20) 7.6e-4 off
_STEP_UNIT_FLOOR = {torch.float64: 2.0**-957, torch.float32: 2.0**-89}


def _lane_unit_fails(k, A11, A21):
    """Whether some lane's unit ``k`` ([1, N]) fails a step: the variance the step alone gives,
    ``A21/A11`` (forward: ``p / (1 + p phi)``; backward: ``p / a^2``) at least 1, is more than
    :data:`_STEP_UNIT_SPREAD` below ``k``, or a nonzero ``A21`` is below ``k`` times
    :data:`_STEP_UNIT_FLOOR` where that variance is below ``k`` (asked only where some ``k`` is
    above 1: :func:`_units`)."""
    with torch.no_grad():
        r = A21 / torch.where(A11 > 0, A11, 1.0)
        steps = torch.where((A11 > 0) & (r > 1) & torch.isfinite(r), r, 1.0)
        far = (k / steps > _STEP_UNIT_SPREAD[k.dtype]) | (
            (A21 < k * _STEP_UNIT_FLOOR[k.dtype]) & (A21 > 0) & (steps < k)
        )
        return bool(far.any())


def _leaves_overflow(leaves, k, x0):
    """Whether a leaf entry, or one times the lane's unit ``k`` (``A12``, ``b2``, the initial
    state's ``e``), passes ``finfo.max / 2**24`` (or is not finite): the information entries
    are the entries of ``A`` times a mean, ``hz p / max(R, h^2)``, and with a process variance
    of 1e300 on data of scale 1e200 (``obs_var = 1``) they overflowed, as did a prior mean of
    1e150 in the unit 1e200, though every belief is a number of the dtype."""
    fi = torch.finfo(k.dtype)
    with torch.no_grad():
        A11, A12, A21, A22, b1, b2, al = (x.detach() for x in leaves)
        big = torch.stack([A11.amax(), A22.amax(), b1.abs().amax(), al.abs().amax(),
                           (A12 * k).amax(), (b2.abs() * k).amax(),
                           (x0[1].detach().abs() * k[0]).amax()])  # fmt: skip
        return not bool((big <= fi.max / 2.0**24).all())


def _exact_leaf(entries, shifts, like):
    """A leaf in power-of-two units from its seven entries given as products of factors
    (``entries[i]``: a list of terms, each a tuple of tensors, ``[]`` for 0) and the units'
    exponent for each (``shifts``), divided by ``2**E``, ``E`` its largest ``A`` entry's
    exponent: each term one :class:`_ScaledProduct` of its factors, so that no product under-
    or overflows on the way, whatever the factors' and units' scales; the map's entries are
    then exact where they are numbers of the dtype relative to its largest (``like``: a tensor
    of the leaf's shape)."""
    E = None
    with torch.no_grad():
        for terms, sh in zip(entries[:4], shifts[:4], strict=True):
            if not terms:
                continue
            # (mantissa product, exponent) of each term
            parts = [_split_product(factors, torch.ones_like(like), sh) for factors in terms]
            top = None
            for m, e in parts:
                ez = torch.where(m != 0, e, _LOW)
                top = ez if top is None else torch.maximum(top, ez)
            total = None
            for m, e in parts:
                x = _times_pow2(m, (e - top).clamp(min=-(1 << 20)))
                total = x if total is None else total + x
            ex = torch.where(total != 0, _exponent(total) + top, _LOW)
            E = ex if E is None else torch.maximum(E, ex)
    zero = torch.zeros_like(like)
    out = []
    for terms, sh in zip(entries, shifts, strict=True):
        x = None
        for factors in terms:
            y = _ScaledProduct.apply(sh - E, *factors)
            x = y if x is None else x + y
        out.append(zero if x is None else x)
    return tuple(out)


def _unit_shifts(kappa, kappa0):
    """The exponents ``(A11, A12, A21, A22, b1, b2, alpha)`` of ``D_t M_t D_{t-1}^-1`` (``D =
    diag(2**kappa, 1)`` on ``(u, v)``, the information with ``u``)."""
    kp = torch.cat([kappa0[None], kappa[:-1]]) if kappa.shape[0] > 1 else kappa
    up = kappa - kp
    return up, kappa, -kp, torch.zeros_like(kappa), up, kappa, up


# log2 of an infinite variance in the clamp scan (kalmanscan.core.scan.clamp_scan); a shift of
# -_FORGET maps every state to the leaf's lower bound (decay 0)
_INF = 2.0**50
_FORGET = 2.0**52


def _log2(x):
    """float64 ``log2 |x|`` within ``[-2**50, 2**50]`` (0: ``-2**50``, inf: ``2**50``)."""
    return torch.log2(x.detach().abs().to(torch.float64)).clamp(-_INF, _INF)


def _units_from_logs(x, dtype):
    """Integer unit exponents from log2 variances: the nearest integer, held in the range. A
    diffuse state (``+2**50``) takes the top of the range and one known exactly (``-2**50``)
    the bottom: where such a state enters a leaf, only the column it does not zero counts, and
    these units keep that column the leaf's largest (a diffuse start in the unit 2**-120 next
    to an observation of variance 1e-36 in float32 left the leaf's ``v`` column below the
    range: NaN), and between two such states the units cancel."""
    top = math.frexp(torch.finfo(dtype).max)[1] - 2
    return torch.round(x).clamp(-top, top).to(torch.int64)


def _carried_units(a, p, R, h, x0, T, N):
    """Per-step unit exponents ``kappa [T, N]`` and the initial state's ``kappa0 [N]`` for the
    forward scan: ``log2`` of each filtered variance within a few bits (the state carried in,
    not only the step's own variance, :func:`_lane_unit_fails`), by a scan of
    ``x -> min(log2 (R/h^2), max(log2 p, x + 2 log2 |a|))`` (``a = 0``: ``min(log2 (R/h^2),
    log2 p)``; :func:`kalmanscan.core.scan.clamp_scan`). The state in these units is of order 1
    at every step. Units from the step alone failed where variance is carried: prior_var 1e300,
    process variances ``[0, 1e300]`` on data of scale 1e200 gave the first step the unit 1 (its
    variance 5e299) and the second 5e299, whose ratio times the leaf's information
    (``1.1e200``) overflowed (the mean inf, OverflowError); a variance of 1e200 carried through
    steps of process variance 1e-4 left the products' precision coordinate below the range
    (filtered variance inf, log-likelihood 4 % off, silently)."""
    C = _log2(R) - 2 * _log2(h)
    forget = a == 0
    D = torch.where(forget, -_FORGET, 2 * _log2(a))
    E = _log2(p)
    lo, hi = torch.minimum(E, C).clamp(-_INF, _INF), C.clamp(-_INF, _INF)
    x0l = (_log2(x0[2]) - _log2(x0[0])).clamp(-_INF, _INF)
    x = clamp_scan(D.expand(T, N), lo.expand(T, N), hi.expand(T, N), x0l)
    return _units_from_logs(x, p.dtype), _units_from_logs(x0l, p.dtype)


def _carried_units_back(a, p, R, h, L, N):
    """Unit exponents ``[L, N]`` of the backward scan (rows in reverse time, each the step
    whose observation and dynamics it folds in): ``log2`` of the variance about the state
    before, from the observations after, within a few bits: ``y -> max(log2 p, min(y,
    log2 (R/h^2))) - 2 log2 |a|`` from ``y = inf`` (``a = 0``: inf), as :func:`_carried_units`."""
    C = _log2(R) - 2 * _log2(h)
    forget = a == 0
    D = torch.where(forget, -_FORGET, -2 * _log2(a))
    E = _log2(p)
    inf = torch.full_like(E, _INF)
    lo = torch.where(forget, inf, (E + D).clamp(-_INF, _INF))
    hi = torch.where(forget, inf, (torch.maximum(C, E) + D).clamp(-_INF, _INF))
    x0 = torch.full((N,), _INF, dtype=torch.float64, device=p.device)
    x = clamp_scan(D.expand(L, N), lo.expand(L, N), hi.expand(L, N), x0)
    return _units_from_logs(x, p.dtype), _units_from_logs(x0, p.dtype)


def _unit_tests(k, d):
    """The tests :func:`_units` takes from ``k`` and ``d`` alone, as 0-d bool tensors (read with
    the call's others): some ``k`` above 1, some ``d`` above 1, some ``k`` above ``2**G``."""
    G = hold_exponent(k.dtype)
    return (k > 1).any(), (d > 1).any(), (k > 2.0**G).any()


def _units(k, leaves, x0, carried, tests):
    """The scan's units (:func:`_scan`): the lane's ``k`` where it serves every step and the
    leaves (and the initial state's ``e``, ``x0[1]``) stay in range in it; else per-step units
    (``carried()``, where the lane's unit fails a step) or ``k`` as a power of two. A unit
    above ``2**G`` (steps.hold_exponent) is taken as a power of two too: ``k A12`` and ``k b2``
    of the plain leaves are products with a factor below ``1/k`` (``h^2/obs_var`` 1e-300 at
    ``process_var = obs_var = 1e300``), whose derivatives passed the range (NaN gradients of
    ``ks.smooth``); the exact leaves form them without it. ``tests``: :func:`_unit_tests`, read;
    with every ``k`` and ``d`` at most 1 nothing of ``[T, N]`` is computed."""
    big_k, big_d, huge_k = tests
    if big_k and _lane_unit_fails(k, leaves[0], leaves[2]):
        return carried()
    if (big_k or big_d) and (huge_k or _leaves_overflow(leaves, k, x0)):
        return _lane_units(k)
    return k


def _lane_units(k):
    """The lane's unit ``k`` ([1, N]) as a power of two: ``(kappa [1, N], kappa0 [N])``."""
    kappa = _exponent(k)
    return kappa, kappa[0]
