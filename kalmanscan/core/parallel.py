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
"""

from __future__ import annotations

import math

import torch

from kalmanscan.core import sequential
from kalmanscan.core.scan import projective_scan
from kalmanscan.core.sequential import backward_leaves, observation_terms, results
from kalmanscan.core.steps import (
    combine_two_filter,
    compact,
    normalize,
    predict,
    predict_coeffs,
    quotient,
    start,
    update,
)


def _lane_scale(p):
    """Per-lane unit of the backward scan's precision coordinate: ``k = max(1, max_t p)``.

    The scan runs on ``(k u, k e, v)`` (precision ``k lam``), which turns a huge process variance's
    leaf ``[[1, 0], [p, a^2]]`` into ``[[1, 0], [p/k, a^2]]``: products of such leaves then stay in
    range where the unscaled ones would underflow (``1/p^2``) though the beliefs they give do not.
    """
    return torch.clamp(p.amax(0, keepdim=True), min=1.0)


def _step_scale(A11, A21):
    """Per-step unit ``k_t = max(1, A21/A11)`` of the forward scan's precision coordinate: the
    variance the step alone gives (``p / (1 + p phi)``). A lane-wide unit fails where steps differ
    by more than the range: with ``p = 1e300``, ``obs_var = 1e-300`` the observed leaf's
    ``A21/k`` underflowed and the variance came out 0 (truth ``1e-300``)."""
    return torch.clamp(quotient(A11, A21)[0], min=1.0)  # (its derivative in A11 as products)


# a lane's unit serves every step whose own variance is within this factor of it (far inside
# float64's range; ordinary models are within 1e6); beyond, each step takes its own (_step_scale)
# (float32: the same fraction of its range; 2**300 is inf there, and a lane whose process
# variance reached 1e30 held a variance of 1e-14 elsewhere with 1e-44 of its unit: 12 % off)
_STEP_UNIT_SPREAD = {torch.float64: 2.0**300, torch.float32: 2.0**37}
# nor where a step's variance coordinate A21/k would fall below this (filter._tiny_below's
# bound: its digits hold in the scan's products), though the step's own variance is below 1
# and within the spread: obs_var = process_var = 1e-140 with one process_var of 1e80 gave
# A21/k = 3e-360 (filtered variances 0); float32 (obs_var 1e-12, one 1e20) 7.6e-4 off
_STEP_UNIT_FLOOR = {torch.float64: 2.0**-957, torch.float32: 2.0**-89}


def _unit(k, step_scale, A11, A21):
    """The scan's unit: the lane's ``k`` ([1, N]) where it serves every step, else the per-step
    ``steps = step_scale(A11, A21)`` (a step's own unit more than :data:`_STEP_UNIT_SPREAD`
    below ``k``, or a nonzero ``A21`` below ``k`` times :data:`_STEP_UNIT_FLOOR` where its unit
    is below ``k``). Where every lane's ``k`` is 1 (no process variance above 1: the per-step
    units are 1 too) nothing of ``[T, N]`` is computed."""
    if not k.numel() or not bool((k > 1).any()):  # (N = 0: none)
        return k
    steps = step_scale(A11, A21)
    far = (k / steps > _STEP_UNIT_SPREAD[k.dtype]) | (
        (A21 < k * _STEP_UNIT_FLOOR[k.dtype]) & (A21 > 0) & (steps < k)
    )
    return steps if bool(far.any()) else k


def _back_step_scale(A11, A21):
    """Per-step unit of the backward scan (no gradient: the scan's outputs do not depend on
    it): the variance the step alone gives about the step before from an exact state after it,
    ``p / a^2`` (``A21/A11``), at least 1; 1 where the step forgets or its ``a^2`` is 0 or the
    quotient passes the range (the state it gives is diffuse, or the step is taken
    elementwise: :func:`_odd_decay_steps_back`). The backward leaves' ``A21/k`` with the
    lane's ``k = max p = 1e160`` underflowed where ``obs_var = 1e-100``: the smoothed variance
    0 about the steps before the huge one (truth 7.9e-101)."""
    with torch.no_grad():
        r = A21 / torch.where(A11 > 0, A11, 1.0)
        return torch.where((A11 > 0) & (r > 1) & torch.isfinite(r), r, 1.0)


def _scan(leaves, x0, k):
    """Projective scan in the coordinates ``(k_t u, k_t e, v)`` of step t's state, returned in the
    user's. ``k`` is ``[T, N]`` (per step; the initial state's unit is 1) or ``[1, N]`` (one unit
    per lane, the initial state's too). Leaf t becomes ``D_t M_t D_{t-1}^-1`` with
    ``D = diag(k, 1)`` on ``(u, v)``, so products telescope."""
    A11, A12, A21, A22, b1, b2, al = leaves
    # (quotient: the derivatives in kp as products; autograd's (k / kp) / kp underflowed after
    # a step whose unit is a huge process variance, kp = 4e199: 1/kp^2)
    if k.shape[0] > 1:
        kp = torch.cat([torch.ones_like(k[:1]), k[:-1]])
        r, A21 = quotient(kp, k, A21)
        k0 = torch.ones_like(k[0])
    else:
        kp, r, k0 = k, 1.0, k[0]
        (A21,) = quotient(kp, A21)
    leaves = (A11 * r, k * A12, A21, A22, b1 * r, k * b2, al * r)
    u, e, v = projective_scan(leaves, normalize(k0 * x0[0], k0 * x0[1], x0[2]))
    # (k's derivative as products: autograd's (u / k) / k underflows at k = p = 1e200)
    return normalize(*quotient(k, u, e), v)


def _diffuse_prefix(leaves, q, Rs, h2s, hzs, p, c, u0):
    """Leaves whose steps a diffuse start (``u0 = 0``) reaches still diffuse replaced by the
    constant map to the exact state they give: ``(0, 0, 1)`` before the lane's first informative
    step (observed with ``h != 0``, or forgetting), and that step's ``(h^2, h z, R)``
    (``(R + h^2 p, R c + h z p, R p)`` where it forgets). A product of true leaves loses it: their
    ``v`` column is ``a^2`` per step and underflows (``a = 1e-170``, or 40 unobserved steps at
    ``a = 1e-100``), though a diffuse belief stays diffuse for every ``a != 0``."""
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
        head = _diffuse_prefix(head, cut(q), cut(Rs), cut(h2s), cut(hzs), cut(p), cut(c), u0)
        return tuple(torch.cat([h_, r_]) for h_, r_ in zip(head, rest, strict=True))
    seen = informative.cumsum(0)
    pre = ((seen == 0) | ((seen == 1) & informative)) & (u0 == 0)
    forget = q != 0
    # only lanes whose product of a^2 over the prefix leaves half the range: elsewhere the true
    # leaves are exact, and the derivative in u0 (through a^2) is kept
    log_d = torch.log(torch.where(forget, 1.0, leaves[3] / leaves[0].clamp(min=1.0))).expand(T, N)
    deep = torch.where(pre, log_d, 0.0).sum(0) < 0.5 * math.log(torch.finfo(A11.dtype).tiny)
    pre = pre & deep
    xu = torch.where(forget, Rs + h2s * p, h2s)
    xe = torch.where(forget, Rs * c + hzs * p, hzs)
    xv = torch.where(forget, Rs * p, Rs)
    zero = torch.zeros_like(A11)
    const = (zero, xu, zero, xv, zero, xe, zero)
    return tuple(torch.where(pre, y, x) for x, y in zip(leaves, const, strict=True))


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


def _tiny_decay_steps(leaves, x0, k, filt, steps):
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
        u_in = torch.cat([x0[0].expand(1, N), filt[0][:-1]]).detach()
        meets = small & (u_in >= tiny) & (p * u_in < tiny)
        rows = set(torch.nonzero(meets.any(1)).flatten().tolist())
        if rows <= cut:
            return filt
        cut |= rows
        parts, state, t0 = [], tuple(x0), 0
        for t in sorted(cut) + [T]:
            if t > t0:
                seg = _scan(tuple(x[t0:t] if x.shape[0] > 1 else x for x in leaves), state,
                            k[t0:t] if k.shape[0] > 1 else k)  # fmt: skip
                parts.append(seg)
                state = tuple(y[-1] for y in seg)
            if t < T:
                up = predict(*state, *(_at(x, t) for x in (a, p, c, q, d)))
                state = update(*up, *(_at(x, t) for x in (R, h, hz)))
                parts.append(tuple(y[None] for y in state))
            t0 = t + 1
        filt = tuple(torch.cat(ys) for ys in zip(*parts, strict=True))
    return filt


def _odd_decay_steps_back(leaves, k, back, steps, odd):
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
                            k[t0:t] if k.shape[0] > 1 else k)  # fmt: skip
                parts.append(seg)
                state = tuple(y[-1] for y in seg)
            if t < L:
                state = sequential.backward_step(*state, *(_at(x, t) for x in steps))
                parts.append(tuple(y[None] for y in state))
            t0 = t + 1
        back = tuple(torch.cat(ys) for ys in zip(*parts, strict=True))
    return back


def _forward(z, obs_var, decay, process_var, loading, offset, x0):
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    x0 = start(*x0)
    diffuse = x0[0] == 0
    any_diffuse = bool(diffuse.any())
    if (
        any_diffuse
        and torch.is_grad_enabled()
        and any(x.requires_grad for x in (R, h, hz, a, p, c, d))
    ):
        R, h, hz, a, p, c, d = _diffuse_inputs(x0, q, R, h, hz, a, p, c, d)
    # the leaf times R (the update's R-scaled form), divided by s = max(R, h^2): no 1/R, and
    # nothing overflows (h^2 p / s <= p)
    inv = 1 / torch.maximum(R, h * h)
    Rs, h2s, hzs = R * inv, h * h * inv, hz * inv
    al = Rs * a * (1 - q)
    box = None
    if torch.is_grad_enabled() and a.requires_grad:
        box = {}
        al = _ForgetSlope.apply(al, a, box, "slope")
    leaves = (Rs + h2s * p, Rs * q + h2s * d, Rs * p, Rs * d, Rs * c + hzs * p,
              Rs * q * c + hzs * d, al)  # fmt: skip
    k = _lane_scale(p)
    # the per-step unit and the diffuse prefix cost several passes over [T, N]: taken only where
    # the lane's unit would not hold (steps whose own variance is far below the lane's largest
    # process variance) or a diffuse start is not informed at once (leading gaps, tiny decays)
    k = _unit(k, _step_scale, leaves[0], leaves[2])
    tiny = torch.finfo(a.dtype).tiny
    if any_diffuse and bool(
        ((q[:1] == 0) & (h2s[:1] == 0) & diffuse).any()
        # a decay whose square may underflow a diffuse start's first leaf (the prefix's own
        # test, below half the range, is stricter)
        or (a * a < tiny**0.25).any()
    ):
        leaves = _diffuse_prefix(leaves, q, Rs, h2s, hzs, p, c, x0[0])
    filt = _scan(leaves, x0, k)
    if bool(((q == 0) & (d < tiny)).any()):  # decays whose square leaves the normal range
        filt = _tiny_decay_steps(leaves, x0, k, filt, (a, p, c, q, d, R, h, hz))
    if box is not None:
        box["slope"] = _forget_slope(x0, filt, q, Rs)
    N = z.shape[1]
    prev = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, filt, strict=True))
    pred = predict(*prev, a, p, c, q, d)
    return filt, pred, prev[0].detach(), _lane_scale(p)


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    sequential._check_outputs(outputs)
    filt, pred, u_in, _ = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    return results(z, obs_var, loading, filt, pred, u_in, outputs)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    filt, pred, u_in, k = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    out = results(z, obs_var, loading, filt, pred, u_in)
    T, N = z.shape
    if T == 1:
        out["smooth_mean"], out["smooth_var"] = out["mean"], out["var"]
        return out
    R, h, hz, a, p, c, q, d = backward_leaves(z, obs_var, decay, process_var, loading, offset)
    keep = 1 - q
    g = keep * p + q
    al = a * keep
    inv = 1 / torch.maximum(R, h * h)  # the R-scaled leaf over max(R, h^2), as in _forward
    Rs, h2s, hzs = R * inv, h * h * inv, hz * inv
    b1, b2, ab = -al * c * Rs, al * (hzs - c * h2s), al * Rs
    box = None
    if torch.is_grad_enabled() and a.requires_grad:  # (a step that forgets: _ForgetSlope)
        box = {}
        b1, b2, ab = (_ForgetSlope.apply(x, a, box, key)
                      for x, key in ((b1, "b1"), (b2, "b2"), (ab, "alpha")))  # fmt: skip
    leaves = (keep * d * Rs, keep * d * h2s, g * Rs, g * h2s + Rs, b1, b2, ab)
    flip = lambda x: x.expand(T - 1, N).flip(0) if x.shape[0] > 1 else x  # noqa: E731
    one, zero = torch.ones(N, dtype=z.dtype, device=z.device), z.new_zeros(N)
    leaves = tuple(flip(x) for x in leaves)
    # the lane's unit where it serves every step back, else each step's (_back_step_scale)
    k = _unit(k, _back_step_scale, leaves[0], leaves[2])
    back = _scan(leaves, (zero, zero, one), k)
    tiny = torch.finfo(z.dtype).tiny
    odd = (q == 0) & ((d < tiny) | (d > 1 / tiny))  # decays whose square leaves the normal range
    if bool(odd.any()):
        steps = tuple(flip(x) for x in (R, h, hz, a, p, c, q, d))
        back = _odd_decay_steps_back(leaves, k, back, steps, flip(odd))
    back = tuple(
        torch.cat([x.flip(0), end[None]]) for x, end in zip(back, (zero, zero, one), strict=True)
    )
    if box is not None:  # the state each step back enters: the one after it
        U, V = back[0][1:].detach(), back[2][1:].detach()
        U1 = Rs * U + h2s * V
        den = p * U1 + Rs * V
        kappa = torch.where(q != 0, (U1 + Rs * V) / torch.where(den > 0, den, 1.0), 0.0)
        box.update(b1=(-c * Rs * kappa).detach(), b2=((hzs - c * h2s) * kappa).detach(),
                   alpha=(Rs * kappa).detach())  # fmt: skip
    out["smooth_mean"], out["smooth_var"] = combine_two_filter(*filt, *back)
    return out
