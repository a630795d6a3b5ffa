"""The projective scan run in its units (:func:`_scan`: the lane's unit, or leaves formed exactly
in powers of two), its states held where steps.held says, and the steps whose leaves the scan's
products lose (the "Two kinds of step" paragraph of :mod:`kalmanscan.core.parallel`): a diffuse
start's prefix and the backward scan's rows before its first information take exact leaves, and
at tiny (or huge) decays the scan is cut and the step taken elementwise.

Part of :mod:`kalmanscan.core.parallel`, which re-exports these names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from kalmanscan.core import sequential
from kalmanscan.core._args import broadcast_shapes
from kalmanscan.core.scan import projective_scan
from kalmanscan.core.steps import (
    _LOW,
    _exponent,
    _times_pow2,
    beyond,
    held,
    hold_exponent,
    normalize_max,
    predict,
    quotient,
    update,
)


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
    L, N = broadcast_shapes(*(x.shape for x in leaves))
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
