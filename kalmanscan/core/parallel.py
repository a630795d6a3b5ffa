"""The parallel torch backend: beliefs by one projective scan (docs/backend-contract.md).

Step t's leaf is the predict map followed by adding the observation's information, as a linear map
of homogeneous beliefs ``(u, v | e)``:

    A = [[1 + phi p, q + phi d], [p, d]],   b = (c + r p, q c + r d),   alpha = a (1 - q)

computed times ``R = obs_var`` (``R + h^2 p``, ..., the same beliefs) so that no ``1/R`` enters
and gradients in ``obs_var`` stay exact however small it is.
(``q, d`` from :func:`kalmanscan.core.steps.predict_coeffs`; ``[[1 + p phi, a^2 phi], [p, a^2]]``
whenever ``a^2 > 0``). The smoother's backward information filter is the same scan in reverse time
with leaves ``A = [[k d, k d phi], [g, g phi + 1]]``, ``b = (-alpha c, alpha (r - c phi))``,
``k = 1 - q``, ``g = k p + q``. Outputs come from the filtered triples and the predicted ones
(one predict step from the previous filtered triple, elementwise), exactly as in the sequential
reference, so the two differ only by how the filtered triples are computed.

Two kinds of step are not left to the scan's products (docs/reliability.md, "Underflow
regimes"): a diffuse start's steps up to its first informative one (:func:`_diffuse_prefix`;
their parameters get no gradient, :func:`_diffuse_inputs`), and a step whose ``a^2`` is below the
normal range meeting a known state with ``p u`` below it too, whose leaf has lost ``a^2 v``
(:func:`_tiny_decay_steps`: the scan is cut there and the step taken elementwise). The backward
scan is cut likewise where such a decay (or one whose square passes the range) gives a precision
its leaf loses (:func:`_odd_decay_steps_back`).

Units: the scans run on ``(k_t u, k_t e, v)``. A lane takes one unit, ``max(1, max p)``
(:func:`_lane_scale`), where it serves every step (:func:`_lane_unit_fails`) and its leaves stay
in range (:func:`_leaves_overflow`); elsewhere each step takes a power of two near the variance
the state carries there (:func:`_carried_units`, :func:`_carried_units_back`: a scan of clamps
on logs), and every leaf is formed in its units from its factors' mantissas and exponents and
divided by its largest entry (:func:`_exact_leaf`), so that nothing passes the range where the
beliefs do not; a lane whose leaves overflow in its own unit takes that path with the unit as a
power of two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from kalmanscan.core import sequential
from kalmanscan.core.scan import affine_scan, clamp_scan, projective_scan
from kalmanscan.core.sequential import backward_leaves, observation_terms, results
from kalmanscan.core.steps import (
    _LOW,
    _REPEATED_ROUNDING,
    _exponent,
    _ScaledProduct,
    _split_product,
    _times_pow2,
    beyond,
    combine_two_filter,
    compact,
    held,
    held_mask,
    hold_exponent,
    kept_mean,
    near_hold,
    normalize_max,
    predict,
    predict_coeffs,
    quotient,
    read_tests,
    start,
    update,
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


class _Scanned(NamedTuple):
    """A scan's triples before the host reads of its tests (:func:`_scan`)."""

    plain: tuple  # the triples in the user's units, each divided by max(u, v)
    some: torch.Tensor  # 0-d: a triple's variance above 2**G (steps.beyond)
    far: torch.Tensor  # 0-d: a state's variance above 2**G in its unit (_far)
    held: Callable  # () -> the triples, held where steps.held says (a host read)

    def resolved(self):
        """The triples, held where steps.held says (host reads)."""
        return self.held() if bool(self.some) else self.plain


def _scan(leaves, x0, units, big_k=True):
    """Projective scan in the coordinates ``(k_t u, k_t e, v)`` of step t's state, returned in
    the user's. ``units``: the lane's unit ``k`` ([1, N], its initial state's too; the leaves
    are scaled here), or a pair of integer exponents ``(kappa, kappa0)``, ``k_t = 2**kappa_t``
    (``[T, N]`` per step, or ``[1, N]`` per lane) and the initial state's ``2**kappa0``, the
    leaves already in them (:func:`_scan_exact`). ``big_k``: whether some ``k`` is above 1.
    A :class:`_Scanned`: the tests (which triples are held; whether a state, the initial one
    included, has a variance above ``2**G`` in its unit, :func:`_far`) as tensors, for the
    caller to read with its others."""
    if isinstance(units, tuple):
        return _scan_exact(leaves, x0, *units)
    k = units
    A11, A12, A21, A22, b1, b2, al = leaves
    # (quotient: the derivatives in k as products; autograd's (k / kp) / kp underflowed after
    # a step whose unit is a huge process variance, kp = 4e199: 1/kp^2)
    (A21,) = quotient(k, A21)
    leaves = (A11, k * A12, A21, A22, b1, k * b2, al)
    start = normalize_max(k[0] * x0[0], k[0] * x0[1], x0[2])
    u, e, v = projective_scan(leaves, start)
    # (k's derivative as products: autograd's (u / k) / k underflows at k = p = 1e200)
    out = normalize_max(*quotient(k, u, e), v)
    with torch.no_grad():  # (a variance above 2**G in the user's units, k v / u; k >= 1)
        vk = v * k if big_k else v
        some = beyond(u, vk, hold_exponent(u.dtype))
        # (_far of the scan's states implies some: k >= 1)
        far = _far(*start) | (_far(u, e, v) if big_k else some)

    def held_out():  # (the state's mean and variance in the unit: no u / k below the range)
        hold = held(u, vk)
        if hold is None:
            return out
        low = 2.0 ** -hold_exponent(u.dtype)
        mean, var = quotient(torch.where(u > 0, u, 1.0), e, v)
        return _hold(hold, out, (low, mean * low, var * (k * low)))

    return _Scanned(out, some, far, held_out)


def _hold(hold, out, held_out):
    """``out``'s triple with ``held_out``'s (``(2**-G, mean 2**-G, var 2**-G)``,
    steps.normalize) where ``hold``."""
    return tuple(torch.where(hold, x, y) for x, y in zip(held_out, out, strict=True))


def _far(u, e, v):
    """Whether a scan's state (its own coordinates, ``max(u, v) = 1``) has a variance above
    ``2**G`` (steps.hold_exponent): the derivatives in its ``u``, about ``(loss) / u``, pass the
    range where ``|loss|`` passes ``finfo.max 2**-G`` (a prior variance of 1e300 carried by
    ``process_var = 0`` in the unit 1: NaN gradients). The scan is then run in per-step units,
    where each state's variance is of order 1 (:func:`_carried_units`). A 0-d bool tensor."""
    return beyond(u.detach(), v.detach(), hold_exponent(u.dtype))


def _scan_exact(leaves, x0, kappa, kappa0):
    """:func:`_scan` with leaves already in the units ``2**kappa`` (:func:`_exact_leaf`):
    the initial state taken into ``2**kappa0``, every state back from ``2**kappa_t``, each by
    one exact scaling (no gradient goes to the units)."""
    start = _in_unit(*x0, kappa0)
    u, e, v = projective_scan(leaves, start, detach=True)
    far = _far(*start) | _far(u, e, v)
    kappa = kappa.expand(u.shape[0], -1)
    u_, e_, v_ = _in_unit(u, e, v, -kappa)
    # a state that knows nothing (u = 0) is the same belief at every v: v gets no derivative,
    # which the detached divisors would leave it (a scale's, 1.8e-98 in a process variance
    # after a step that forgets, which the smoother's combine met with its rounding: a smoothed
    # mean's derivative in that process variance 3.8e-64 for -3.1e-251)
    out = (u_, e_, torch.where(u_ == 0, v_.detach(), v_))
    with torch.no_grad():  # (the variance in the user's units: v/u times 2**kappa)
        vk = _times_pow2(v, kappa)
        some = beyond(u, vk, hold_exponent(u.dtype))

    def held_out():
        hold = held(u, vk)
        if hold is None:
            return out
        # the state's mean and variance in its unit, u the constant 2**-G (steps.hold_gauge;
        # with the divisor u a constant, u / u had the derivative of u, and a variance of 1e300
        # met it as -var/u past the range: NaN or wrong gradients of the smoothed variance)
        G = hold_exponent(u.dtype)
        mean, var = quotient(torch.where(u > 0, u, 1.0), e, v)
        low = torch.full_like(u, 2.0**-G)
        return _hold(hold, out, (low, mean * 2.0**-G, _times_pow2(var, kappa - G)))

    return _Scanned(out, some, far, held_out)


def _in_unit(u, e, v, kappa):
    """The triple ``(2**kappa u, 2**kappa e, v)``, normalized, each coordinate formed by one
    scaling by a power of two to its normalized exponent: nothing under- or overflows where the
    normalized triple does not (a mean of 1e150 in the unit 2**-997 overflowed, a mean of
    1e-120 and variance 1e-240 in the unit 2**-797 underflowed). The divisor is a constant to
    autograd (exact: every use of a triple is scale-free, :func:`kalmanscan.core.scan.
    projective_scan`); its derivative paths cancel, and where it was a variance 2e22 times as
    sensitive to the decay as the belief (``a = 1e-22`` after a variance of 1e30, float32)
    their rounding made a derivative of the log-likelihood 1e8 times the truth."""
    eu = torch.where(u.detach() != 0, _exponent(u) + kappa, _LOW)
    ev = torch.where(v.detach() != 0, _exponent(v), _LOW)
    top = torch.maximum(eu, ev)
    top = torch.where(top == _LOW, 0, top)
    down = kappa - top
    u, e, v = _times_pow2(u, down), _times_pow2(e, down), _times_pow2(v, -top)
    n = torch.maximum(u, v).detach()
    return u / n, e / n, v / n


def _seg_units(units, t0, t):
    """``units`` for the rows ``t0:t`` (a cut scan: :func:`_tiny_decay_steps`); the state
    entering row ``t0`` takes row ``t0 - 1``'s unit."""
    if not isinstance(units, tuple) or units[0].shape[0] == 1:
        return units
    kappa, kappa0 = units
    return kappa[t0:t], (kappa0 if t0 == 0 else kappa[t0 - 1])


def _diffuse_prefix(leaves, q, h2s, u0, log_d, const):
    """Leaves whose steps a diffuse start (``u0 = 0``) reaches still diffuse replaced by the
    constant map to the exact state they give (``const``, a leaf): ``(0, 0, 1)`` before the
    lane's first informative step (observed with ``h != 0``, or forgetting), and that step's
    ``(h^2, h z, R)`` (``(R + h^2 p, R c + h z p, R p)`` where it forgets). A product of true
    leaves loses it: their ``v`` column is ``a^2`` per step and underflows (``a = 1e-170``, or
    40 unobserved steps at ``a = 1e-100``), though a diffuse belief stays diffuse for every
    ``a != 0``. ``log_d``: each leaf's ``log(A22 / max(A11, 1))`` (0 where it forgets)."""
    A11 = leaves[0]
    T, N = A11.shape
    informative = ((q != 0) | (h2s != 0)).expand(T, N)
    # the prefixes end at each lane's first informative step: work on the rows up to the last
    first = torch.where(informative.any(0), informative.to(torch.int8).argmax(0), T - 1)
    L = int(first.amax()) + 1
    if L < T:
        head = tuple(x.expand(T, N)[:L] if x.shape[0] == T else x for x in leaves)
        rest = tuple(x.expand(T, N)[L:] for x in leaves)
        cut = lambda x: x[:L] if x.shape[0] == T else x  # noqa: E731
        head = _diffuse_prefix(head, cut(q), cut(h2s), u0, cut(log_d), tuple(map(cut, const)))
        return tuple(torch.cat([h_, r_]) for h_, r_ in zip(head, rest, strict=True))
    seen = informative.cumsum(0)
    pre = ((seen == 0) | ((seen == 1) & informative)) & (u0 == 0)
    # only lanes whose product of a^2 over the prefix leaves half the range: elsewhere the true
    # leaves are exact, and the derivative in u0 (through a^2) is kept
    deep = torch.where(pre, log_d.expand(T, N), 0.0).sum(0) < 0.5 * math.log(
        torch.finfo(A11.dtype).tiny
    )
    pre = pre & deep
    return tuple(torch.where(pre, y, x) for x, y in zip(leaves, const, strict=True))


def _no_information_prefix(leaves, informative):
    """The backward scan's leaves (rows in reverse time) with their ``u`` column and
    information gain zeroed up to each lane's first informative row (observed with ``h !=
    0``), where the state entering every row is ``(0, 0, 1)`` (no information yet), in lanes
    where that column grows past half the range over those rows: the products' ``v`` column,
    the only one such a state meets, was lost in their normalization (float32, decay 1e10 and
    the last 5 steps missing: a column ratio of 1e20 a row, NaN smoothed moments)."""
    A11, A12, A21, A22 = leaves[:4]
    L, N = torch.broadcast_shapes(*(x.shape for x in leaves))
    informative = informative.expand(L, N)
    seen = informative.to(torch.int32).cumsum(0)
    pre = (seen == 0) | ((seen == 1) & informative)
    with torch.no_grad():
        col1 = torch.maximum(A11, A21).expand(L, N)
        A22s = A22.expand(L, N)
        grow = torch.log(torch.where(pre & (col1 > A22s), col1 / A22s, 1.0))
        deep = grow.sum(0) > -0.5 * math.log(torch.finfo(A11.dtype).tiny)
    if not bool(deep.any()):
        return leaves
    pre = pre & deep
    cut = {0, 2, 4, 6}  # (A11, A21, b1, alpha)
    return tuple(torch.where(pre, 0.0, x) if i in cut else x for i, x in enumerate(leaves))


def _diffuse_inputs(x0, q, R, h, hz, a, p, c, d):
    """The step inputs with no gradient where a diffuse start is still diffuse: the predict's
    (``a, p, c, d``) at every step that keeps the diffuse state it enters, the observation's
    (``R, h, hz``) at those it leaves diffuse (``h = 0`` or not observed). Nothing depends on
    them there; the scan's derivatives of those leaves are exact zeros times an adjoint that
    grows like ``1/a^2`` a step (``a = 1e-10``, 3 steps: 2.4e-6 off in float64; NaN where it
    overflows)."""
    T, N = R.shape
    informative = ((q != 0) | (h != 0)).expand(T, N)
    seen = informative.to(torch.int32).cumsum(0)
    entering = (seen - informative.to(torch.int32) == 0) & (x0[0] == 0)  # state in: diffuse
    stays = entering & ~informative
    kept = entering & (q == 0)  # (a step that forgets depends on its p and c)
    a, p, c, d = (torch.where(kept, x.detach(), x) for x in (a, p, c, d))
    R, h, hz = (torch.where(stays, x.detach(), x) for x in (R, h, hz))
    return R, h, hz, a, p, c, d


class _ForgetSlope(torch.autograd.Function):
    """A leaf entry ``x``, unchanged, whose derivative in ``a`` at a step that forgets
    (``a = 0``) is the limit's (``a -> 0``), not 0: ``box[key]`` per step, which depends on the
    state entering the step and so comes from the scan, after the leaves (filled before the
    backward runs). Forward filter: ``alpha``, slope ``Rs (u + v) / u`` from a known state
    ``(u, v)``, where the limit's leaf ``[[Rs + h2s p, 0], [Rs p, 0]]``, ``alpha = Rs a``, meets
    the forgetting one's ``U = (Rs + h2s p)(u + v)``. Backward filter: ``b1, b2, alpha``, the
    limit's information ``a (E1 - c U1)`` over its normalizer ``p U1 + Rs V`` against the
    forgetting step's ``U1 + Rs V`` (``U1 = Rs U + h2s V``, ``E1 = Rs E + hzs V``)."""

    @staticmethod
    def forward(ctx, x, a, box, key):
        ctx.box, ctx.key, ctx.a_shape = box, key, a.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ga = None
        if ctx.needs_input_grad[1]:
            ga = (g * ctx.box[ctx.key]).sum_to_size(ctx.a_shape)
        return g, ga, None, None


def _forget_slope(x0, filt, q, Rs):
    """``box["slope"]`` of :class:`_ForgetSlope` from the filtered triples."""
    T, N = filt[0].shape
    u = torch.cat([x0[0].expand(1, N), filt[0][:-1]]).detach()
    v = torch.cat([x0[2].expand(1, N), filt[2][:-1]]).detach()
    known = (q != 0) & (u >= torch.finfo(u.dtype).tiny)
    return torch.where(known, Rs.detach() * (u + v) / torch.where(known, u, 1.0), 0.0)


def _at(x, t):
    return x[t] if x.shape[0] > 1 else x[0]


def _tiny_decay_steps(leaves, x0, units, filt, steps):
    """The filtered triples where a step with ``a^2`` below the normal range (``a != 0``) meets
    a known state (``u >= tiny``) with ``p u`` below it: there the leaf's ``a^2 v`` (and ``a e``)
    underflowed, e.g. ``var = 1e100``, ``a = 1e-170``, ``p = 0`` gave the predicted variance 0
    (truth 1e-240). The scan is cut before each such step and the step taken elementwise
    (:func:`kalmanscan.core.steps.predict`, which forms it divided by ``u``), until the steps
    found from the states no longer change. ``steps``: ``(a, p, c, q, d, R, h, hz)``."""
    a, p, c, q, d, R, h, hz = steps
    T, N = filt[0].shape
    tiny = torch.finfo(filt[0].dtype).tiny
    small = ((q == 0) & (d < tiny)).expand(T, N)
    cut = set()
    for _ in range(T):
        u_in, v_in = (torch.cat([s.expand(1, N), x[:-1]]).detach()
                      for s, x in ((x0[0], filt[0]), (x0[2], filt[2])))  # fmt: skip
        u_in = u_in / torch.maximum(u_in, v_in)  # (the precision where it is below 1: held)
        meets = small & (u_in >= tiny) & (p * u_in < tiny)
        rows = set(torch.nonzero(meets.any(1)).flatten().tolist())
        if rows <= cut:
            return filt
        cut |= rows
        parts, state, t0 = [], tuple(x0), 0
        for t in sorted(cut) + [T]:
            if t > t0:
                seg = _scan(tuple(x[t0:t] if x.shape[0] > 1 else x for x in leaves), state,
                            _seg_units(units, t0, t)).resolved()  # fmt: skip
                parts.append(seg)
                state = tuple(y[-1] for y in seg)
            if t < T:
                up = predict(*state, *(_at(x, t) for x in (a, p, c, q, d)))
                state = update(*up, *(_at(x, t) for x in (R, h, hz)))
                parts.append(tuple(y[None] for y in state))
            t0 = t + 1
        filt = tuple(torch.cat(ys) for ys in zip(*parts, strict=True))
    return filt


def _odd_decay_steps_back(leaves, units, back, steps, odd):
    """The backward information filter's triples (in reverse time) where a step whose ``a^2``
    is below the normal range (or past its reciprocal) gives a precision the leaf loses: its
    ``a^2 U`` underflowed (``a = 1e-170``, ``obs_var = 1e-100``: the precision 3.4e-240 about
    the step before came out 0, and a diffuse lane's smoothed mean NaN). The scan is cut before
    each such step where the exact step (:func:`kalmanscan.core.sequential.backward_step`,
    which never forms ``a^2``) from the state entering it gives a normal precision coordinate,
    and the step taken elementwise, until the steps found no longer change (as the forward's
    :func:`_tiny_decay_steps`). ``steps``: ``(R, h, hz, a, p, c, q, d)``, rows in reverse
    time like ``leaves``; the state entering the first row is ``(0, 0, 1)``."""
    L, N = back[0].shape
    one = torch.ones_like(back[0][0])
    end = (torch.zeros_like(one), torch.zeros_like(one), one)
    tiny = torch.finfo(one.dtype).tiny
    odd = odd.expand(L, N)
    cut = set()
    for _ in range(L):
        with torch.no_grad():
            ins = tuple(
                torch.cat([s[None], x[:-1]]).detach() for s, x in zip(end, back, strict=True)
            )
            u = sequential.backward_step(*ins, *(x.detach() for x in steps))[0]
        rows = set(torch.nonzero((odd & (u >= tiny)).any(1)).flatten().tolist())
        if rows <= cut:
            return back
        cut |= rows
        parts, state, t0 = [], end, 0
        for t in sorted(cut) + [L]:
            if t > t0:
                seg = _scan(tuple(x[t0:t] if x.shape[0] > 1 else x for x in leaves), state,
                            _seg_units(units, t0, t)).resolved()  # fmt: skip
                parts.append(seg)
                state = tuple(y[-1] for y in seg)
            if t < L:
                state = sequential.backward_step(*state, *(_at(x, t) for x in steps))
                parts.append(tuple(y[None] for y in state))
            t0 = t + 1
        back = tuple(torch.cat(ys) for ys in zip(*parts, strict=True))
    return back


class _Over(torch.autograd.Function):
    """``x * (1/n)`` for each ``x``, its derivative in ``n`` formed as products,
    ``-sum_i g_i (x_i / n) / n``: autograd's ``(sum_i g_i x_i) (-1/n^2)`` passed the range
    where ``n`` (``obs_var``) is huge, ``g_i x_i`` first (obs_var 1e300 in a log-likelihood of
    -1e100: NaN gradients in obs_var), or tiny, ``1/n^2`` first."""

    @staticmethod
    def forward(ctx, n, *xs):
        inv = 1 / n
        out = tuple(x * inv for x in xs)
        ctx.shapes = tuple(x.shape for x in (n, *xs))
        ctx.save_for_backward(n, inv, *out)
        return out

    @staticmethod
    def backward(ctx, *gs):
        n, inv, *outs = ctx.saved_tensors
        acc = gs[0] * outs[0]
        for g, o in zip(gs[1:], outs[1:], strict=True):
            acc = acc + g * o
        fit = lambda g, shape: g if g.shape == shape else g.sum_to_size(shape)  # noqa: E731
        g_n = fit(-(acc / n), ctx.shapes[0]) if ctx.needs_input_grad[0] else None
        return (g_n, *(fit(g * inv, sh) if need else None
                       for g, sh, need in zip(gs, ctx.shapes[1:], ctx.needs_input_grad[1:],
                                              strict=True)))  # fmt: skip


def _over_max_test(R, h, hz):
    """Whether :func:`_over_max` is to form its derivative in ``max(R, h^2)`` as products
    (differentiated, and ``max(R, h^2)`` beyond ``2**G`` or below ``2**-G``,
    steps.hold_exponent): a 0-d bool tensor (read with the call's other tests)."""
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in (R, h, hz))):
        return torch.zeros((), dtype=torch.bool, device=R.device)
    with torch.no_grad():
        n = torch.maximum(R, h * h)
        if not n.numel():
            return torch.zeros((), dtype=torch.bool, device=R.device)
        lim = 2.0 ** hold_exponent(R.dtype)
        lo, hi = torch.aminmax(n)
        return (hi > lim) | (lo < 1 / lim)


def _over_max(R, h, hz, products):
    """``(R, h^2, hz)`` over ``max(R, h^2)`` (the leaves' scale), each ``x * (1 / max)``;
    ``products`` (:func:`_over_max_test`, read): with the derivative in ``max(R, h^2)`` formed
    as products (:class:`_Over`)."""
    n = torch.maximum(R, h * h)
    if products:
        return _Over.apply(n, R, h * h, hz)
    inv = 1 / n
    return R * inv, h * h * inv, hz * inv


def _forward(z, obs_var, decay, process_var, loading, offset, x0):
    """Filtered and predicted triples, the filtered ``u`` entering each step, the lane's unit
    ``k`` and whether a triple is held (False where none is; None: not known). An ordinary
    call reads the host twice, each time every test at once (steps.read_tests): the inputs'
    (a held prior, units, the diffuse prefix, tiny decays), then the scan's and the
    predictions' (held triples, states far above their units, steps.near_hold), after which
    only a call that meets one takes the steps after the scan again with them."""
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    x_in, x0 = x0, start(*x0, checked=False)
    diffuse = x0[0] == 0
    T, N = z.shape
    tiny = torch.finfo(a.dtype).tiny
    products = _over_max_test(R, h, hz)
    with torch.no_grad():
        n1 = torch.maximum(R[:1], h[:1] * h[:1])  # (the first step's h2s, as _over_max's)
        tests = read_tests(
            held_mask(x_in[0], x_in[2]).any(),
            diffuse.any(),
            products,
            *_unit_tests(_lane_scale(p), d),
            # the diffuse prefix: where a diffuse start is not informed at once (leading gaps,
            # tiny decays: one whose square may underflow a diffuse start's first leaf; the
            # prefix's own test, below half the range, is stricter)
            ((q[:1] == 0) & (h[:1] * h[:1] * (1 / n1) == 0) & diffuse).any()
            | (a * a < tiny**0.25).any(),
            ((q == 0) & (d < tiny)).any(),  # decays whose square leaves the normal range
        )
    start_held, any_diffuse, products, *unit_tests, prefix, tiny_decays = tests
    if start_held:
        x0 = start(*x_in)
    if (
        any_diffuse
        and torch.is_grad_enabled()
        and any(x.requires_grad for x in (R, h, hz, a, p, c, d))
    ):
        R, h, hz, a, p, c, d = _diffuse_inputs(x0, q, R, h, hz, a, p, c, d)
    # the leaf times R (the update's R-scaled form), divided by s = max(R, h^2): no 1/R, and
    # nothing overflows (h^2 p / s <= p)
    Rs, h2s, hzs = _over_max(R, h, hz, products)
    al = Rs * a * (1 - q)
    box = None
    if torch.is_grad_enabled() and a.requires_grad:
        box = {}
        al = _ForgetSlope.apply(al, a, box, "slope")
    leaves = (Rs + h2s * p, Rs * q + h2s * d, Rs * p, Rs * d, Rs * c + hzs * p,
              Rs * q * c + hzs * d, al)  # fmt: skip
    k = _lane_scale(p)
    plain, carried = leaves, []

    def carried_units():
        carried.append(True)
        return _carried_units(a, p, R, h, x0, T, N)

    def build(units):
        """The leaves in ``units`` (formed exactly where they are exponents), with the diffuse
        prefix; and whether they are exponents."""
        leaves = plain
        exact = isinstance(units, tuple)
        if exact:
            shifts = _unit_shifts(*units)
            w = a * (1 - q)  # (its slope where it forgets: _forget_slope without Rs)
            if box is not None:  # (per step: a time-invariant decay's gradient arrives summed)
                w = _ForgetSlope.apply(w.expand(R.shape), a, box, "slope")
            # (the unscaled leaf: its scale 1/max(R, h^2) is the exact scaling's; through it
            # the derivatives in R passed the range, R = 1e-100 in a log-likelihood of -5e196:
            # NaN)
            terms = ([(R,), (h, h, p)], [(R, q), (h, h, d)], [(R, p)], [(R, d)],
                     [(R, c), (hz, p)], [(R, q, c), (hz, d)], [(R, w)])  # fmt: skip
            leaves = _exact_leaf(terms, shifts, z)
        if any_diffuse and prefix:
            forget = q != 0
            if exact:
                big = torch.log((Rs + h2s * p).clamp(min=1.0))
                log_d = torch.where(forget, 0.0, torch.log(Rs) + torch.log(d) - big)
                g = torch.where(forget, p, 1.0)
                const = _exact_leaf(([], [(R, q), (h, h, g)], [], [(R, g)], [],
                                     [(R, c, q), (hz, g)], []), shifts, z)  # fmt: skip
            else:
                log_d = torch.log(torch.where(forget, 1.0, leaves[3] / leaves[0].clamp(min=1.0)))
                zero = torch.zeros_like(leaves[0])
                const = (zero, torch.where(forget, Rs + h2s * p, h2s), zero,
                         torch.where(forget, Rs * p, Rs), zero,
                         torch.where(forget, Rs * c + hzs * p, hzs), zero)  # fmt: skip
            leaves = _diffuse_prefix(leaves, q, h2s, x0[0], log_d, const)
        return leaves, exact

    def finish(filt, checked):
        """The steps after the scan: tiny decays', the means' Newton step, the forget slope,
        the predictions (``checked=False``: none held, steps.predict)."""
        if tiny_decays:
            filt = _tiny_decay_steps(leaves, x0, units, filt, (a, p, c, q, d, R, h, hz))
        if _REPEATED_ROUNDING(z.dtype) and any(x.requires_grad for x in (*filt, *leaves)):
            filt = _consistent_means(filt, x0, (a, p, c, q, d, R, h, hz))
        if box is not None:
            box["slope"] = _forget_slope(x0, filt, q, torch.ones_like(Rs) if exact else Rs)
        prev = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, filt, strict=True))
        pred = predict(*prev, a, p, c, q, d, carried=False, checked=checked)
        return filt, pred, prev[0].detach()

    # per-step units and leaves formed exactly in them cost several passes over [T, N]: taken
    # only where the lane's unit would not hold (steps whose own variance is far below the
    # lane's largest process variance), its leaves pass the range, or a state's variance is
    # far above its unit (_far)
    units = _units(k, plain, x0, carried_units, unit_tests)
    leaves, exact = build(units)
    scan = _scan(leaves, x0, units, unit_tests[0])
    far = scan.far if not carried else torch.zeros_like(scan.far)
    if not tiny_decays:  # (after _tiny_decay_steps a triple may be held: its own reads)
        filt, pred, u_in = finish(scan.plain, checked=False)
        some, far, unusual = read_tests(scan.some, far, near_hold(pred[0], pred[2]))
        if not (some or far or unusual):
            return filt, pred, u_in, _lane_scale(p), False
    else:
        some, far = read_tests(scan.some, far)
    if far:
        units = carried_units()
        leaves, exact = build(units)
        filt = _scan(leaves, x0, units).resolved()
    else:
        filt = scan.held() if some else scan.plain
    filt, pred, u_in = finish(filt, checked=True)
    return filt, pred, u_in, _lane_scale(p), None


def _consistent_means(filt, x0, params):
    """The filtered means after one Newton step on the recursion ``m_t = A_t m_{t-1} + b_t``
    (values only; the derivatives stay the scan's). The scan's products repeat a settled lane's
    roundings as the sequential steps did (steps._REPEATED_ROUNDING): its float32 means
    tracked a decay ``a (1 - d)``, and a shared decay's gradient on a random walk of 10^5 steps
    was 1.4e-2 off. The residual of each step taken from the scan's previous mean with weights
    that sum to 1 (steps._robust_mean's forms), ``r_t``, and ``delta_t = A_t delta_{t-1} + r_t``
    (one affine scan; ``A_t = a (u / U) (1 - g)``, the step's ``d m_t / d m_{t-1}``) give the
    means ``m + delta``; where a step is not an ordinary one (a diffuse or held state, a value
    out of range) ``A_t = r_t = 0``."""
    a, p, c, q, d, R, h, hz = params
    u, e, v = filt
    T, N = u.shape
    with torch.no_grad():
        up, ep, vp = (torch.cat([s.detach().expand(1, N), x.detach()[:-1]])
                      for s, x in zip(x0, filt, strict=True))  # fmt: skip
        U = up + q * vp
        m = e.detach() / u.detach()
        keep = (a * (1 - q)) * (up / U)
        mp = c + keep * (ep / up)
        var_p = (p * up + d * vp) / U
        h2 = h * h
        g = h2 * var_p / (R + h2 * var_p)
        zh = hz / torch.where(h != 0, h2, 1.0)
        m1 = torch.where(g > 0.5, zh + (1 - g) * (mp - zh), mp + g * (zh - mp))
        A = keep * (1 - g)
        r = m1 - m
        ok = (up > 0) & (u > 0) & (vp <= 1) & torch.isfinite(r) & torch.isfinite(A)
        delta = affine_scan(torch.where(ok, A, 0.0), torch.where(ok, r, 0.0),
                            torch.zeros_like(m[0]))  # fmt: skip
    return u, kept_mean(u, e, m + delta, ok), v


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    sequential._check_outputs(outputs)
    filt, pred, u_in, _, any_held = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    return results(z, obs_var, loading, filt, pred, u_in, outputs, any_held)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    filt, pred, u_in, k, any_held = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    out = results(z, obs_var, loading, filt, pred, u_in, any_held=any_held)
    T, N = z.shape
    if T == 1:
        out["smooth_mean"], out["smooth_var"] = out["mean"], out["var"]
        return out
    R, h, hz, a, p, c, q, d = backward_leaves(z, obs_var, decay, process_var, loading, offset)
    keep = 1 - q
    # (selects where a step forgets, not products with keep = 0: the exact leaves' derivatives
    # there, g 2**shift in the unit of a state that knows nothing, pass the range, and 0 times
    # them gave a NaN gradient in that step's process_var)
    kd = torch.where(q != 0, 0.0, d)
    g = torch.where(q != 0, 1.0, p)
    al = a * keep
    tiny = torch.finfo(z.dtype).tiny
    odd = (q == 0) & ((d < tiny) | (d > 1 / tiny))  # decays whose square leaves the normal range
    # (the first row back is the last step: flip(h)[:1])
    products = _over_max_test(R, h, hz)
    with torch.no_grad():
        products, informed, any_odd, *unit_tests = read_tests(
            products, (h[-1:] != 0).all(), odd.any(), *_unit_tests(k, d)
        )
    # the R-scaled leaf over max(R, h^2), as in _forward
    Rs, h2s, hzs = _over_max(R, h, hz, products)
    b1, b2, ab = -al * c * Rs, al * (hzs - c * h2s), al * Rs
    box = None
    if torch.is_grad_enabled() and a.requires_grad:  # (a step that forgets: _ForgetSlope)
        box = {}
        b1, b2, ab = (_ForgetSlope.apply(x, a, box, key)
                      for x, key in ((b1, "b1"), (b2, "b2"), (ab, "alpha")))  # fmt: skip
    leaves = (kd * Rs, kd * h2s, g * Rs, g * h2s + Rs, b1, b2, ab)
    flip = lambda x: x.expand(T - 1, N).flip(0) if x.shape[0] > 1 else x  # noqa: E731
    one, zero = torch.ones(N, dtype=z.dtype, device=z.device), z.new_zeros(N)
    leaves = tuple(flip(x) for x in leaves)

    # the lane's unit where it serves every step back (as _forward's), else per-step units
    plain, taken = leaves, []

    def carried():  # (flipped only where they are needed)
        taken.append(True)
        return _carried_units_back(*(flip(x) for x in (a, p, R, h)), T - 1, N)

    def build(units):
        leaves = plain
        if isinstance(units, tuple):
            w = al
            if box is not None:  # (its slope where it forgets: "a", below; per step)
                w = _ForgetSlope.apply(al.expand(R.shape), a, box, "a")
            kd_, R_, h_, hz_, g_, c_, al_ = (flip(x) for x in (kd, R, h, hz, g, c, w))
            leaves = _exact_leaf(([(kd_, R_)], [(kd_, h_, h_)], [(g_, R_)],
                                  [(g_, h_, h_), (R_,)], [(al_, -c_, R_)],
                                  [(al_, hz_), (al_, -c_, h_, h_)], [(al_, R_)]),
                                 _unit_shifts(*units), z[1:])  # fmt: skip
        if not informed:  # (a lane whose last step is not informative)
            leaves = _no_information_prefix(leaves, flip(h) != 0)
        return leaves

    end = (zero, zero, one)
    units = _units(k, plain, (zero, zero), carried, unit_tests)
    leaves = build(units)
    scan = _scan(leaves, end, units, unit_tests[0])
    some, far = read_tests(scan.some, scan.far)  # (the scan's tests: one host read)
    if far and not taken:  # (a state's variance far above its unit: _far)
        units = carried()
        leaves = build(units)
        back = _scan(leaves, end, units).resolved()
    else:
        back = scan.held() if some else scan.plain
    if any_odd:
        steps = tuple(flip(x) for x in (R, h, hz, a, p, c, q, d))
        back = _odd_decay_steps_back(leaves, units, back, steps, flip(odd))
    back = tuple(
        torch.cat([x.flip(0), end[None]]) for x, end in zip(back, (zero, zero, one), strict=True)
    )
    if box is not None:  # the state each step back enters: the one after it
        U, V = back[0][1:].detach(), back[2][1:].detach()
        n = torch.maximum(U, V)  # (1 but where held: V up to 2**(emax - G), steps.normalize)
        U, V = U / n, V / n
        U1 = Rs * U + h2s * V
        den = p * U1 + Rs * V
        kappa = torch.where(q != 0, (U1 + Rs * V) / torch.where(den > 0, den, 1.0), 0.0)
        box.update(b1=(-c * Rs * kappa).detach(), b2=((hzs - c * h2s) * kappa).detach(),
                   alpha=(Rs * kappa).detach(), a=kappa.detach())  # fmt: skip
    known = any_held is False and not (some or (far and not taken) or any_odd)
    out["smooth_mean"], out["smooth_var"] = combine_two_filter(
        *filt, *back, any_held=False if known else None
    )
    return out
