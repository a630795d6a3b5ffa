"""The battery's errors against the oracle (:mod:`kalmanscan.validation.regimes`, whose
docstring defines them): means in posterior standard deviations (:func:`mean_err_sd`),
relative variances (:func:`var_rel`) and log-likelihoods (:func:`loglik_rel`), the dense
covariances, the gradients (:func:`grad_rel`), the table's :data:`COLUMNS` of one run
(:func:`scalar_errors`, :func:`dense_errors`) and the float64 verdict (:func:`passes`).
"""

from __future__ import annotations

import math

import numpy as np

from kalmanscan.testing import TOLERANCES

FLOOR = 1e-4


def _tiny(dtype: str) -> float:
    fi = np.finfo(np.float32 if dtype == "float32" else np.float64)
    return float(fi.tiny) * 2.0 ** (fi.nmant + 1)


def mean_err_sd(a, b, var_b, floor: float = FLOOR) -> float:
    """Worst ``|a - b| / max(sqrt(var_b), floor * max|b|)`` over the steps where ``b`` is finite.

    ``a`` must be NaN exactly where ``b`` is (a never-informed state); else the error is inf.

    >>> round(mean_err_sd([1.0, 2.0 + 1e-7], [1.0, 2.0], [1.0, 0.01]), 12)  # 1e-7 / 0.1
    1e-06
    """
    a, b, v = (np.asarray(x, dtype=np.float64) for x in (a, b, var_b))
    nb = ~np.isfinite(b)
    if np.any(np.isfinite(a[nb])):
        return math.inf
    m = ~nb
    if not m.any():
        return 0.0
    diff = np.abs(a[m] - b[m])
    if not np.all(np.isfinite(diff)):
        return math.inf
    scale = float(np.max(np.abs(b[m])))
    den = np.maximum(np.sqrt(np.maximum(v[m], 0.0)), max(floor * scale, 1e-300))
    return float(np.max(diff / den))


def var_rel(a, b, dtype: str = "float64") -> float:
    """Worst ``|a - b| / max(b, TINY)``; ``b = inf`` needs ``a = inf``, ``b`` NaN needs NaN.

    >>> var_rel([1.0, np.inf], [1.0 + 1e-9, np.inf]) < 1.1e-9
    True
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    inf_b, nan_b = np.isinf(b), np.isnan(b)
    if not np.array_equal(a[inf_b], b[inf_b]) or not np.all(np.isnan(a[nan_b])):
        return math.inf
    m = ~inf_b & ~nan_b
    if not m.any():
        return 0.0
    rel = np.abs(a[m] - b[m]) / np.maximum(np.abs(b[m]), _tiny(dtype))
    return float(np.max(rel)) if np.all(np.isfinite(rel)) else math.inf


def loglik_rel(a, b, n: int) -> float:
    """``|a - b| / max(|b|, n, 1)`` (both non-finite and equal: 0).

    >>> loglik_rel(-100.0 + 1e-6, -100.0, 10) < 1.01e-8
    True
    """
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return abs(a - b) / max(abs(b), float(n), 1.0)


def scalar_errors(out: dict, truth, dtype: str) -> dict:
    """Errors of one backend's run against the oracle (keys: the table's columns)."""
    return dict(
        filter_mean_sd=max(
            mean_err_sd(out["mean"], truth.mean, truth.var),
            mean_err_sd(out["pred_mean"], truth.pred_mean, truth.pred_var),
        ),
        filter_var=max(
            var_rel(out["var"], truth.var, dtype), var_rel(out["pred_var"], truth.pred_var, dtype)
        ),
        loglik=max(
            loglik_rel(ll, truth.loglik, truth.n_loglik_terms)
            for ll in out.get("logliks", [out["loglik"]])
        ),
        smooth_mean_sd=mean_err_sd(out["smooth_mean"], truth.smooth_mean, truth.smooth_var),
        smooth_var=var_rel(out["smooth_var"], truth.smooth_var, dtype),
    )


def grad_rel(g: dict, g_star: dict, params: dict) -> float:
    """Worst over the parameters of ``|g - g*| / max(|g*|, 1/|theta|)`` (``1`` for theta = 0):
    relative, except that a derivative below one nat per e-fold of the parameter counts as one.

    >>> grad_rel({"decay": 1.0 + 1e-9}, {"decay": 1.0}, {"decay": 0.5}) < 1.1e-9
    True
    """
    worst = 0.0
    for k, ref in g_star.items():
        got = g[k]
        if not math.isfinite(got):
            return math.inf
        theta = abs(float(params[k]))
        floor = 1.0 / theta if theta > 0 else 1.0
        worst = max(worst, abs(got - ref) / max(abs(ref), floor))
    return worst


def _dense_cov_rel(a, b, steps):
    """Worst ``||A_t - B_t|| / max(||B_t||, 1e-6 max_s ||B_s||)`` (Frobenius): relative per step,
    except that a covariance that is exactly 0 in the truth (a state observed without noise)
    may come back as rounding at 1e-6 of the lane's largest covariance times the tolerance."""
    if not len(steps):
        return 0.0
    floor = max(1e-6 * max(float(np.linalg.norm(b[t])) for t in steps), 1e-300)
    worst = 0.0
    for t in steps:
        nb = np.linalg.norm(b[t])
        d = np.linalg.norm(a[t] - b[t])
        if not np.isfinite(d):
            return math.inf
        worst = max(worst, d / max(nb, floor))
    return worst


def _dense_mean_sd(a, b, cov, steps):
    if not len(steps):
        return 0.0
    scale = max(float(np.max(np.abs(b[steps]))), 1e-300)
    worst = 0.0
    for t in steps:
        sd = np.sqrt(np.maximum(np.diag(cov[t]), 0.0))
        d = np.abs(a[t] - b[t])
        if not np.all(np.isfinite(d)):
            return math.inf
        worst = max(worst, float(np.max(d / np.maximum(sd, FLOOR * scale))))
    return worst


def dense_errors(out: dict, truth) -> dict:
    proper = np.flatnonzero(~truth.diffuse)
    everywhere = np.arange(truth.mean.shape[0])
    return dict(
        filter_mean_sd=_dense_mean_sd(out["mean"], truth.mean, truth.cov, proper),
        filter_var=_dense_cov_rel(out["cov"], truth.cov, proper),
        loglik=loglik_rel(out["loglik"], truth.loglik, truth.n_loglik_terms),
        smooth_mean_sd=_dense_mean_sd(
            out["smooth_mean"], truth.smooth_mean, truth.smooth_cov, everywhere
        ),
        smooth_var=_dense_cov_rel(out["smooth_cov"], truth.smooth_cov, everywhere),
    )


COLUMNS = ("filter_mean_sd", "filter_var", "loglik", "smooth_mean_sd", "smooth_var")


def passes(errs: dict, dtype: str) -> bool | None:
    """float64: every column within its tolerance; float32: None (reported, not judged)."""
    if dtype != "float64":
        return None
    sd, rel = TOLERANCES[("oracle_sd", "float64")], TOLERANCES[("oracle", "float64")]
    lim = dict(filter_mean_sd=sd, smooth_mean_sd=sd, filter_var=rel, smooth_var=rel, loglik=rel)
    return all(errs[k] <= lim[k] for k in COLUMNS)
