"""Error metrics of the validation battery (definitions and reasons: docs/validation.md).

Every metric compares kalmanscan's ``a`` with a truth ``b`` over the steps of one lane and returns
one non-negative float (``inf`` when kalmanscan is non-finite where the truth is finite, or finite
where the truth is not):

- :func:`normwise`: ``max_t |a_t - b_t| / max_t |b_t|`` over the steps where ``b`` is finite.
  Used for means, which may cross 0: rounding errors in a mean scale with the magnitudes that
  enter it (data, offsets, earlier means), i.e. with the lane's scale ``max |b|``, not with
  ``|b_t|``.
- :func:`elementwise`: ``max_t |a_t - b_t| / |b_t|``. Used for variances, which are positive and
  may span many decades within a lane (a diffuse start, long gaps); each must be right relative
  to itself. Where ``b_t = inf`` (still diffuse) ``a_t`` must be ``inf`` too.
- :func:`loglik_error`: ``|a - b| / max(|b|, n, 1)`` with ``n`` the number of contributing steps:
  a sum of ``n`` log densities, each O(1) nats or larger, so the floor ``n`` keeps a
  log-likelihood that happens to be near 0 from inflating the error.
"""

from __future__ import annotations

import numpy as np

__all__ = ["normwise", "elementwise", "loglik_error", "worse"]


def _as64(x):
    return np.asarray(x, dtype=np.float64)


def normwise(a, b) -> float:
    """Normwise relative error over the finite entries of ``b`` (``[T]`` arrays).

    >>> round(normwise([1.0, 2.0 + 1e-9], [1.0, 2.0]), 12)
    5e-10
    """
    a, b = _as64(a), _as64(b)
    m = np.isfinite(b)
    if not m.any():
        return 0.0
    diff = np.abs(a[m] - b[m])
    if not np.all(np.isfinite(diff)):
        return float("inf")
    scale = float(np.max(np.abs(b[m])))
    return float(np.max(diff) / max(scale, np.finfo(np.float64).tiny))


def elementwise(a, b) -> float:
    """Max elementwise relative error of positive ``a`` vs ``b``; ``b = inf`` needs ``a = inf``.

    >>> elementwise([1.0, np.inf], [1.0 + 1e-12, np.inf]) < 1e-11
    True
    """
    a, b = _as64(a), _as64(b)
    inf_b = np.isinf(b)
    if np.any(np.isfinite(a[inf_b])) or np.any(np.isnan(a[inf_b])):
        return float("inf")
    m = ~inf_b & ~np.isnan(b)
    if not m.any():
        return 0.0
    rel = np.abs(a[m] - b[m]) / np.maximum(np.abs(b[m]), np.finfo(np.float64).tiny)
    if not np.all(np.isfinite(rel)):
        return float("inf")
    return float(np.max(rel))


def loglik_error(a, b, n_terms: int) -> float:
    """``|a - b| / max(|b|, n_terms, 1)``.

    >>> round(loglik_error(-100.0 + 1e-8, -100.0, 50), 14)
    1e-10
    """
    a, b = float(a), float(b)
    if not np.isfinite(a) or not np.isfinite(b):
        return 0.0 if a == b else float("inf")
    return abs(a - b) / max(abs(b), float(n_terms), 1.0)


def worse(err: float, worst: float) -> bool:
    """Whether ``err`` replaces ``worst`` as a row's worst error: it is larger, or NaN. A NaN
    worst stays (nothing compares larger than NaN), so a row that met one NaN cannot be
    reported with a later finite error, which would pass.

    >>> worse(2.0, 1.0), worse(float("nan"), 1.0), worse(5.0, float("nan"))
    (True, True, False)
    """
    return worst == worst and not err <= worst
