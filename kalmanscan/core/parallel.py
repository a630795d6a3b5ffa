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

import torch

from kalmanscan.core import sequential
from kalmanscan.core.scan import projective_scan
from kalmanscan.core.sequential import backward_leaves, observation_terms, results
from kalmanscan.core.steps import combine_two_filter, compact, normalize, predict, predict_coeffs


def _lane_scale(p):
    """Per-lane unit of the precision coordinate: ``k = max(1, max_t process_var)``.

    The scan runs on ``(k u, k e, v)`` (precision ``k lam``), which turns a huge process variance's
    leaf ``[[1, 0], [p, a^2]]`` into ``[[1, 0], [p/k, a^2]]``: products of such leaves then stay in
    range where the unscaled ones would underflow (``1/p^2``) though the beliefs they give do not.
    """
    return torch.clamp(p.amax(0, keepdim=True), min=1.0)


def _scan(leaves, x0, k):
    """Projective scan in the coordinates of :func:`_lane_scale`, returned in the user's."""
    A11, A12, A21, A22, b1, b2, al = leaves
    leaves = (A11, k * A12, A21 / k, A22, b1, k * b2, al)
    u, e, v = projective_scan(leaves, normalize(k[0] * x0[0], k[0] * x0[1], x0[2]))
    return normalize(u / k, e / k, v)


def _forward(z, obs_var, decay, process_var, loading, offset, x0):
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p)
    # the leaf times R (the update's R-scaled form), divided by s = max(R, h^2): no 1/R, and
    # nothing overflows (h^2 p / s <= p)
    inv = 1 / torch.maximum(R, h * h)
    Rs, h2s, hzs = R * inv, h * h * inv, hz * inv
    leaves = (Rs + h2s * p, Rs * q + h2s * d, Rs * p, Rs * d, Rs * c + hzs * p,
              Rs * q * c + hzs * d, Rs * a * (1 - q))  # fmt: skip
    k = _lane_scale(p)
    filt = _scan(leaves, x0, k)
    N = z.shape[1]
    prev = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, filt, strict=True))
    pred = predict(*prev, a, p, c, q, d)
    return filt, pred, k


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
