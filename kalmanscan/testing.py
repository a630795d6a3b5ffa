"""The one public tolerance table, used by the tests, ``kalmanscan validate`` and benchmarks.

Errors are relative: ``max |actual - expected| / max(|expected|, floor)`` over finite entries, where
``floor`` is the ``scale`` of the quantity (its typical magnitude, e.g. the data's standard
deviation for means) times ``1e-3``, so near-zero entries do not blow the ratio up. Entries that are
not finite must match exactly (NaN where NaN, +inf where +inf).

Loosening an entry is a deliberate change, with the reason in the commit message.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TOLERANCES", "tolerance", "rel_error", "assert_close"]

# (kind, dtype) -> tolerance: relative (the metric above) unless its comment says otherwise
# (posterior sds, nats, absolute)
TOLERANCES = {
    # same algorithm family, same dtype (parallel vs sequential reference)
    ("parallel", "float64"): 1e-10,
    ("parallel", "float32"): 1e-4,
    # independent truths (filterpy, dense oracle, statsmodels) in float64
    ("truth", "float64"): 1e-9,
    # float32 result against a float64 truth (grows with the model's condition: docs/validation.md)
    ("truth", "float32"): 2e-3,
    # published reference figures quoted to ~5 significant digits
    ("published", "float64"): 1e-5,
    # kernels (GPU or interpreted) against the float64 reference
    ("kernel", "float32"): 1e-4,
    ("kernel", "float64"): 1e-10,
    ("kernel_grad", "float32"): 1e-3,
    ("kernel_grad", "float64"): 1e-8,
    # KLA layer: token-by-token decode against the full pass
    ("decode", "float32"): 1e-5,
    ("decode", "float64"): 1e-10,
    # discretize_ou against Van Loan's matrix exponential (scipy.linalg.expm)
    ("discretize", "float64"): 1e-13,
    ("discretize", "float32"): 1e-6,
    # torch.autograd.gradcheck
    ("gradcheck", "float64"): 1e-6,
    # against the mpmath oracle on degenerate regimes (validation/regimes.py): means in posterior
    # standard deviations (floored at 1e-4 of the lane's scale); variances and log-likelihood
    # relative. Tight enough to catch a smoother that amplifies rounding by 1/decay a step.
    ("oracle_sd", "float64"): 1e-6,
    ("oracle", "float64"): 1e-8,
    # one computation reached another way (axis moved, a lane split out, a gap spelled NaN or as
    # obs_var = inf) or a closed form of a few operations: 4 ulps (float64 measured 0 to 3.4e-16)
    ("identical", "float64"): 4 * float(np.finfo(np.float64).eps),
    ("identical", "float32"): 4 * float(np.finfo(np.float32).eps),
    # a closed form over a running sum or product chain (a constant level under a diffuse prior,
    # Koopman's analytic step, an identity composition): tens of roundings (measured <= 1.1e-15)
    ("closed_form", "float64"): 1e-14,
    # one well-conditioned model evaluated twice with roundings in another order or derivation (a
    # filter resumed from its final state, regrouped combines, the dense sequential filter,
    # filterpy or KFAS against the mpmath oracle): far inside the parallel scan's 1e-10, which
    # also covers ill-conditioned regimes (measured <= 1.3e-14)
    ("rounding", "float64"): 1e-13,
    # the same at float32 over a short computation (torch.compile's fused kernels against eager, a
    # float16 / bfloat16 / float32 input run in float32 against float64, a batch against each
    # sequence alone): measured up to 1.9e-6; elementwise checks pair it with atol = tol / 100
    ("rounding", "float32"): 1e-5,
    # statsmodels' scalar filter against ours on a short series: its steady-state shortcut rounds
    # more than the other truths (measured 4.2e-11); tighter than the general truth bound
    ("statsmodels", "float64"): 1e-10,
    # d loglik / d (obs_var, process_var) against the mpmath oracle's on a well-conditioned lane,
    # however small obs_var (measured 7e-14); the regime battery's ill-conditioned lanes get
    # kernel_grad's 1e-8
    ("oracle_grad", "float64"): 1e-10,
    # fit_ou: two maximizations of one likelihood (a series alone and in a batch, a joint fit of
    # duplicates, another start or device): parameters relative; Newton stops at the stencil's
    # noise floor
    ("fit", "float64"): 1e-6,
    # ... their maximized log-likelihoods, absolute in nats (flat at the optimum: a parameter
    # error e moves it by ~n e^2)
    ("fit_loglik", "float64"): 1e-9,
    # ... a fit of data or times rescaled by c: the same standardized problem up to the rounding
    # of (z - m) / s
    ("rescaled", "float64"): 1e-7,
    # ... standard errors from a finite-difference Hessian (the stencil's, or statsmodels'
    # numerical one): about four digits
    ("stderr", "float64"): 1e-4,
    # ... against statsmodels' BFGS (gtol 1e-12) on the same likelihood: parameters relative; its
    # stopping rule leaves up to 6e-6 on flat likelihoods (its default L-BFGS-B stops 2e-4 short)
    ("statsmodels_fit", "float64"): 1e-5,
    # fit_ou's finite-difference stencil (timeseries/optim.py, h = 1e-3) on an exact quadratic of
    # magnitude ~20: no truncation error, only rounding, eps |f| / h for the gradient (measured
    # 3e-12) and eps |f| / h**2 for the Hessian (measured 1e-8); absolute
    ("stencil_grad", "float64"): 1e-10,
    ("stencil_hess", "float64"): 1e-7,
    # a model loaded from a float16 checkpoint against the float32 one it was saved from: logits,
    # absolute (the weights are rounded to 11 bits; logits are O(1))
    ("half_checkpoint", "float16"): 1e-2,
    # a value read back from the CLI's results.csv, written with 10 significant digits ("%.10g":
    # at most 5e-10 off)
    ("csv", "float64"): 1e-9,
    # fit_ou's one-sided upper bound (timeseries/profile.py) is solved to 1e-3 in the
    # log-likelihood drop: the drop at a reported bound, refitted, against the chi-bar-squared
    # target, absolute in nats (twice the solve's tolerance)
    ("profile_drop", "float64"): 2e-3,
}


def _name(dtype) -> str:
    s = str(dtype)
    if s.startswith("torch."):
        return s.replace("torch.", "")
    try:
        return np.dtype(dtype).name  # np.float32, np.dtype("float32"), "float32"
    except TypeError:
        return s


def tolerance(kind: str, dtype) -> float:
    """Tolerance for ``kind`` (a key of :data:`TOLERANCES`) at ``dtype`` (numpy/torch/str).

    >>> import numpy as np, torch
    >>> tolerance("truth", np.float64), tolerance("kernel", torch.float32)
    (1e-09, 0.0001)
    >>> tolerance("parallel", "float32")
    0.0001
    """
    key = (kind, _name(dtype))
    if key not in TOLERANCES:
        raise KeyError(f"kind, dtype: expected one of {sorted(TOLERANCES)}, got {key}")
    return TOLERANCES[key]


def _np(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_error(actual, expected, scale=None) -> float:
    """Worst relative error of finite entries (module docstring); inf if non-finite ones differ.

    >>> rel_error([1.0, 2.0, float("nan")], [1.0, 2.002, float("nan")])  # doctest: +ELLIPSIS
    0.000999...
    >>> rel_error([1e-9, 1.0], [0.0, 1.0])  # near-zero entries: against 1e-3 of the scale (1.0)
    1e-06
    >>> rel_error([1.0, float("inf")], [1.0, 5.0])  # a non-finite entry where the truth is finite
    inf
    """
    a, e = _np(actual), _np(expected)
    a, e = np.broadcast_arrays(a, e)
    fin = np.isfinite(e)
    if not np.array_equal(np.isnan(a), np.isnan(e)) or not np.array_equal(
        a[np.isinf(e)], e[np.isinf(e)]
    ):
        return float("inf")
    if not np.isfinite(a[fin]).all():
        return float("inf")
    if not fin.any():
        return 0.0
    scale = float(np.max(np.abs(e[fin]))) if scale is None else float(_np(scale).max())
    floor = max(scale * 1e-3, np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a[fin] - e[fin]) / np.maximum(np.abs(e[fin]), floor)))


def assert_close(actual, expected, kind: str, dtype, scale=None, what: str = "") -> float:
    """Assert ``rel_error(actual, expected) <= tolerance(kind, dtype)``; returns the error.

    >>> assert_close([1.0, 2.0], [1.0, 2.0 + 1e-12], "truth", "float64") < 1e-9
    True
    >>> assert_close([1.0], [1.1], "truth", "float64", what="mean")
    Traceback (most recent call last):
    AssertionError: mean: relative error 9.091e-02 exceeds truth/float64 tolerance 1e-09
    """
    err = rel_error(actual, expected, scale)
    tol = tolerance(kind, dtype)
    if not err <= tol:
        raise AssertionError(
            f"{what or 'values'}: relative error {err:.3e} exceeds "
            f"{kind}/{_name(dtype)} tolerance {tol:.0e}"
        )
    return err


def mp_information_filter(z, R, a, p, h, c, lam, eta):
    """The information-form filter of one lane (SPEC section 2) in mpmath, at the caller's
    working precision: ``(loglik, lams, etas)``, the filtered precisions and information vectors
    as mpf. ``R, a, p, h, c``: per-step lists of mpf; ``z``: floats (NaN: missing); ``(lam,
    eta)``: the prior (``lam = 0``: diffuse). A step forgets where its decay is exactly 0; a step
    predicted diffuse adds nothing to the log-likelihood unless ``h = 0`` there (the exact
    diffuse convention)."""
    import math

    import mpmath as mp

    ll = mp.mpf(0)
    lams, etas = [], []
    for t, zt in enumerate(z):
        if a[t] == 0:
            lamm, etam = 1 / p[t], c[t] / p[t]
        else:
            den = a[t] * a[t] + p[t] * lam
            lamm = lam / den
            etam = a[t] * eta / den + lamm * c[t]
        if not math.isnan(zt):
            zt = mp.mpf(float(zt))
            if lamm > 0 or h[t] == 0:
                S = (h[t] * h[t] / lamm if h[t] != 0 else 0) + R[t]
                w = zt - (h[t] * etam / lamm if h[t] != 0 else 0)
                ll -= (mp.log(2 * mp.pi) + mp.log(S) + w * w / S) / 2
            lam, eta = lamm + h[t] * h[t] / R[t], etam + h[t] * zt / R[t]
        else:
            lam, eta = lamm, etam
        lams.append(lam)
        etas.append(eta)
    return ll, lams, etas
