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
"""

from __future__ import annotations

import math

import torch

from kalmanscan.core import sequential
from kalmanscan.core.scan import projective_scan
from kalmanscan.core.sequential import backward_leaves, observation_terms, results
from kalmanscan.core.steps import combine_two_filter, compact, normalize, predict, predict_coeffs


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
    return torch.clamp(A21 / A11, min=1.0)


# a lane's unit serves every step whose own variance is within this factor of it (far inside
# float64's range; ordinary models are within 1e6); beyond, each step takes its own (_step_scale)
_STEP_UNIT_SPREAD = 2.0**300


def _scan(leaves, x0, k):
    """Projective scan in the coordinates ``(k_t u, k_t e, v)`` of step t's state, returned in the
    user's. ``k`` is ``[T, N]`` (per step; the initial state's unit is 1) or ``[1, N]`` (one unit
    per lane, the initial state's too). Leaf t becomes ``D_t M_t D_{t-1}^-1`` with
    ``D = diag(k, 1)`` on ``(u, v)``, so products telescope."""
    A11, A12, A21, A22, b1, b2, al = leaves
    if k.shape[0] > 1:
        kp = torch.cat([torch.ones_like(k[:1]), k[:-1]])
        r, k0 = k / kp, torch.ones_like(k[0])
    else:
        kp, r, k0 = k, 1.0, k[0]
    leaves = (A11 * r, k * A12, A21 / kp, A22, b1 * r, k * b2, al * r)
    u, e, v = projective_scan(leaves, normalize(k0 * x0[0], k0 * x0[1], x0[2]))
    return normalize(u / k, e / k, v)


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


def _forward(z, obs_var, decay, process_var, loading, offset, x0):
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    # the leaf times R (the update's R-scaled form), divided by s = max(R, h^2): no 1/R, and
    # nothing overflows (h^2 p / s <= p)
    inv = 1 / torch.maximum(R, h * h)
    Rs, h2s, hzs = R * inv, h * h * inv, hz * inv
    leaves = (Rs + h2s * p, Rs * q + h2s * d, Rs * p, Rs * d, Rs * c + hzs * p,
              Rs * q * c + hzs * d, Rs * a * (1 - q))  # fmt: skip
    k = _lane_scale(p)
    # the per-step unit and the diffuse prefix cost several passes over [T, N]: taken only where
    # the lane's unit would not hold (steps whose own variance is far below the lane's largest
    # process variance) or a diffuse start is not informed at once (leading gaps, tiny decays)
    steps = _step_scale(leaves[0], leaves[2])
    if bool((k / steps).amax() > _STEP_UNIT_SPREAD):
        k = steps
    diffuse = x0[0] == 0
    if bool(diffuse.any()) and bool(
        ((q[:1] == 0) & (h2s[:1] == 0) & diffuse).any()
        # a decay whose square may underflow a diffuse start's first leaf (the prefix's own
        # test, below half the range, is stricter)
        or (a * a < torch.finfo(a.dtype).tiny ** 0.25).any()
    ):
        leaves = _diffuse_prefix(leaves, q, Rs, h2s, hzs, p, c, x0[0])
    filt = _scan(leaves, x0, k)
    N = z.shape[1]
    prev = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, filt, strict=True))
    pred = predict(*prev, a, p, c, q, d)
    return filt, pred, _lane_scale(p)


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    sequential._check_outputs(outputs)
    filt, pred, _ = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    return results(z, obs_var, loading, filt, pred, outputs)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    filt, pred, k = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    out = results(z, obs_var, loading, filt, pred)
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
    leaves = (keep * d * Rs, keep * d * h2s, g * Rs, g * h2s + Rs, -al * c * Rs,
              al * (hzs - c * h2s), al * Rs)  # fmt: skip
    flip = lambda x: x.expand(T - 1, N).flip(0) if x.shape[0] > 1 else x  # noqa: E731
    one, zero = torch.ones(N, dtype=z.dtype, device=z.device), z.new_zeros(N)
    back = _scan(tuple(flip(x) for x in leaves), (zero, zero, one), k)
    back = tuple(
        torch.cat([x.flip(0), end[None]]) for x, end in zip(back, (zero, zero, one), strict=True)
    )
    out["smooth_mean"], out["smooth_var"] = combine_two_filter(*filt, *back)
    return out
