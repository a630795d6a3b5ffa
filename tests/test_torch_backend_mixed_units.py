"""The torch backend's scans where a lane's variances and data span far more than the dtype's
range between steps, against mpmath: process variances mixing 0, tiny and huge values, a
variance carried far from the step's own, data of scale 1e200 (float32: 1e18), huge offsets
and prior means (kalmanscan/core/parallel.py, ``_carried_units``, ``_exact_leaf``).

- per-step units from the step alone: with prior_var 1e300 and process variances ``[0, 1e300]``
  on data of scale 1e200 the first step took the unit 1 (its variance 5e299 carried from the
  prior) and the second 5e299; their ratio times the leaf's information (1.1e200) overflowed:
  the mean inf and an OverflowError where ``sequential`` and ``native`` are exact (the CLI's
  and ``forecast``'s tests on a machine without the compiled kernel);
- the same units left a variance of 1e200, carried through steps of process variance 1e-4,
  below the range in the products: the filtered variance inf and the log-likelihood 4 % off,
  silently;
- the lane's unit: its leaves' information (``h z p / max(R, h^2)``: 1e200 * 1e300) and the
  prior's mean times it (1e150 * 1e200) overflowed; a lane of process variances up to 1e60
  carried a variance of 1e-200 at 1e-260 of it (2.6e-4 off);
- the backward scan: a huge decay over the last steps with nothing observed grew the products'
  ``u`` column by ``a^2`` a step and lost the ``v`` column (float32, NaN smoothed moments).

Truth: a step-by-step covariance-form filter and a two-filter smoother in mpmath on the inputs
rounded to the dtype; gradients by the complex step in mpmath.
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks

DPS = 60
TOL = {torch.float64: 1e-12, torch.float32: 2e-5}
# a gradient's error allowed: relative, or the log-likelihood's own rounding per unit of the
# parameter (per unit of its log, above 1): a derivative of 1e-93 beside a log-likelihood of
# 1e3 is that rounding, on every backend that differentiates it
GTOL = {torch.float64: (1e-9, 1e-12), torch.float32: (2e-3, 1e-5)}
NAN = math.nan


def mp_lane(z, R, a, p, h, c, m0, P0, smooth=True):
    """One lane in mpmath: ``(ll, mean, var, pred_mean, pred_var, smooth_mean, smooth_var)``
    (lists of mp numbers; None where diffuse). Inputs are sequences of mp numbers (mpf, or mpc
    for the complex step); ``z`` None where missing; ``P0`` None: diffuse; ``a == 0``
    forgets. ``smooth=False``: the filter's alone (``smooth_mean``, ``smooth_var`` None)."""
    T = len(z)
    m, P = (None, None) if P0 is None else (m0, P0)
    ll = mp.mpf(0)
    out = {k: [] for k in ("mean", "var", "pmean", "pvar")}
    for t in range(T):
        if a[t] == 0:
            m, P = c[t], p[t]
        elif P is not None:
            m, P = a[t] * m + c[t], a[t] ** 2 * P + p[t]
        out["pmean"].append(m)
        out["pvar"].append(P)
        if z[t] is not None:
            if P is None:
                m, P = z[t] / h[t], R[t] / h[t] ** 2
            else:
                S = h[t] ** 2 * P + R[t]
                ll += -(mp.log(2 * mp.pi * S) + (z[t] - h[t] * m) ** 2 / S) / 2
                m, P = m + P * h[t] * (z[t] - h[t] * m) / S, P * R[t] / S
        out["mean"].append(m)
        out["var"].append(P)
    if not smooth:
        return ll, out["mean"], out["var"], out["pmean"], out["pvar"], None, None
    L, E = mp.mpf(0), mp.mpf(0)
    sm, sv = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        if out["var"][t] is None:
            sm[t], sv[t] = (E / L, 1 / L) if L != 0 else (None, None)
        else:
            lam = 1 / out["var"][t] + L
            sm[t], sv[t] = (out["mean"][t] / out["var"][t] + E) / lam, 1 / lam
        if z[t] is not None:
            L, E = L + h[t] ** 2 / R[t], E + h[t] * z[t] / R[t]
        if a[t] == 0:
            L, E = mp.mpf(0), mp.mpf(0)
        else:
            den = 1 + p[t] * L
            L, E = a[t] ** 2 * L / den, a[t] * (E - c[t] * L) / den
    return ll, out["mean"], out["var"], out["pmean"], out["pvar"], sm, sv


def _rounded(x, dtype):
    return torch.as_tensor(np.asarray(x, np.float64)).to(dtype).double().numpy()


def _inputs(case, dtype):
    """The case's ``[T, N]`` float64 arrays rounded to ``dtype``, and ``[N]`` priors."""
    T, N = np.shape(case["z"])
    # (copies: a stride-0 tensor is one parameter to the API, its gradient summed)
    full = lambda x: _rounded(np.broadcast_to(np.asarray(x, np.float64), (T, N)).copy(), dtype)  # noqa: E731
    lane = lambda x: _rounded(np.broadcast_to(np.asarray(x, np.float64), (N,)).copy(), dtype)  # noqa: E731
    ins = {k: full(case.get(k, d)) for k, d in (("z", 0), ("R", 1), ("a", 1), ("p", 0),
                                                 ("h", 1), ("c", 0))}  # fmt: skip
    ins["m0"], ins["P0"] = lane(case.get("m0", 0.0)), lane(case.get("P0", math.inf))
    return ins


def _mp_args(ins, n, over=None):
    """mpmath arguments of lane ``n`` (``over``: ``{(key, t): mp number}`` replacing inputs)."""
    over = over or {}
    T = ins["z"].shape[0]
    col = {k: [over.get((k, t), mp.mpf(float(ins[k][t, n]))) for t in range(T)]
           for k in ("R", "a", "p", "h", "c")}  # fmt: skip
    z = [None if math.isnan(ins["z"][t, n]) else over.get(("z", t), mp.mpf(float(ins["z"][t, n])))
         for t in range(T)]  # fmt: skip
    P0 = float(ins["P0"][n])
    P0 = None if math.isinf(P0) else mp.mpf(P0)
    return z, col["R"], col["a"], col["p"], col["h"], col["c"], mp.mpf(float(ins["m0"][n])), P0


def _truth(ins, n):
    with mp.workdps(DPS):
        ll, *series = mp_lane(*_mp_args(ins, n))
        conv = lambda xs, fill: np.array([fill if x is None else float(x) for x in xs])  # noqa: E731
        mean, var, pmean, pvar, smean, svar = series
        return (float(ll), conv(mean, NAN), conv(var, math.inf), conv(pmean, NAN),
                conv(pvar, math.inf), conv(smean, NAN), conv(svar, math.inf))  # fmt: skip


def _mp_grad(ins, n, keys, of="ll"):
    """Complex-step derivatives of lane ``n``'s log-likelihood (``of="ll"``) or of the sum of
    its smoothed means (``of="smean"``) in each step's ``keys``: ``{key: [T] array}``."""
    T = ins["z"].shape[0]
    out = {}
    with mp.workdps(DPS):
        for key in keys:
            g = np.zeros(T)
            for t in range(T):
                x = float(ins[key][t, n])
                if key == "z" and math.isnan(x):
                    continue
                step = mp.mpf(abs(x) if x != 0 else 1e-300) * mp.mpf(10) ** -40
                res = mp_lane(*_mp_args(ins, n, {(key, t): mp.mpc(x, step)}), smooth=of != "ll")
                val = res[0] if of == "ll" else mp.fsum(s for s in res[5] if s is not None)
                g[t] = float(mp.im(val) / step)
            out[key] = g
    return out


def _tensors(ins, dtype, grad=()):
    t = {k: torch.as_tensor(ins[k], dtype=dtype) for k in ("z", "R", "a", "p", "h", "c")}
    for k in grad:
        t[k].requires_grad_(True)
    return t


def _smooth(ins, dtype, backend, grad=()):
    t = _tensors(ins, dtype, grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a lane's NaN log-likelihood: limit 5)
        res = ks.smooth(t["z"], t["R"], t["a"], t["p"], loading=t["h"], offset=t["c"],
                        prior_mean=torch.as_tensor(ins["m0"], dtype=dtype),
                        prior_var=torch.as_tensor(ins["P0"], dtype=dtype),
                        backend=backend)  # fmt: skip
    return res, t


def _loglik(ins, dtype, backend, grad=()):
    t = _tensors(ins, dtype, grad)
    ll = ks.loglik(t["z"], t["R"], t["a"], t["p"], loading=t["h"], offset=t["c"],
                   prior_mean=torch.as_tensor(ins["m0"], dtype=dtype),
                   prior_var=torch.as_tensor(ins["P0"], dtype=dtype), backend=backend)  # fmt: skip
    return ll, t


def _check_moments(got_mean, got_var, mean, var, dtype, what, floor=0.0):
    """Means relative to max(|mean|, sd, floor), variances relative, against the truth as the
    dtype holds it: a variance past its range inf (its mean is then not checked: limit 5), the
    mean NaN where nothing is known."""
    tol = TOL[dtype]
    got_mean = np.asarray(got_mean.detach().double().numpy())
    got_var = np.asarray(got_var.detach().double().numpy())
    var = _rounded(var, dtype)
    known = np.isfinite(var)
    assert np.array_equal(np.isfinite(got_var), known), (what, got_var, var)
    assert np.array_equal(np.isnan(got_mean[known]), np.isnan(mean[known])), (what, got_mean, mean)
    assert np.all(np.isnan(got_mean[np.isnan(mean)])), (what, got_mean, mean)
    scale = np.maximum(np.maximum(np.abs(mean[known]), np.sqrt(var[known])), floor)
    err = np.abs(got_mean[known] - mean[known]) / scale
    assert np.max(err, initial=0) <= tol, (what, got_mean, mean)
    pos = known & (var > 0)
    err = np.abs(got_var[pos] / var[pos] - 1)
    assert np.max(err, initial=0) <= tol, (what, got_var, var)


def _check_lanes(ins, dtype, backend, data_scale=False):
    """Every lane against mpmath; ``data_scale``: means also relative to the lane's data and
    prior mean (a mean that is a difference of observations keeps their rounding)."""
    res, _ = _smooth(ins, dtype, backend)
    f = res.filtered
    N = ins["z"].shape[1]
    col = lambda x, n: x[:, n] if x.dim() == 2 else x  # noqa: E731
    for n in range(N):
        ll, mean, var, pmean, pvar, smean, svar = _truth(ins, n)
        floor = 0.0
        if data_scale:
            floor = max(np.nanmax(np.abs(ins["z"][:, n]), initial=0.0), abs(ins["m0"][n]))
        for got_m, got_v, m, v, what in ((f.mean, f.var, mean, var, "filtered"),
                                         (f.pred_mean, f.pred_var, pmean, pvar, "predicted"),
                                         (res.mean, res.var, smean, svar, "smoothed")):  # fmt: skip
            _check_moments(col(got_m, n), col(got_v, n), m, v, dtype, f"{what}, lane {n}", floor)
        got = float(f.loglik.reshape(-1)[n])
        if np.any(np.isfinite(pvar) & np.isinf(_rounded(pvar, dtype))):
            assert math.isnan(got), (n, got)  # a predicted variance past the range: limit 5
        else:
            assert got == pytest.approx(ll, rel=TOL[dtype], abs=TOL[dtype]), (n, got, ll)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lls, _ = _loglik(ins, dtype, backend)
    got, want = lls.reshape(-1).numpy(), f.loglik.reshape(-1).detach().numpy()
    assert np.array_equal(got, want, equal_nan=True), (got, want)


def _check_grad(got, want, x, ll, dtype, what):
    rel, per_ll = GTOL[dtype]
    x = np.where(np.isnan(x), 0.0, x)  # (a missing z: 0 derivative)
    noise = per_ll * (abs(ll) + 1) / np.maximum(np.abs(x), 1.0)
    err = np.abs(got - want)
    assert np.all(np.isfinite(got)), (what, got)
    assert np.all(err <= rel * np.abs(want) + noise), (what, got, want)


def _gap(T, missing, seed):
    z = np.random.default_rng(seed).normal(1.0, 0.3, T)
    z[missing] = np.nan
    return z


def _carried(T=70):
    """A variance of 1e200 carried through steps of process variance 1e-4 (obs_var 1e200)."""
    rng = np.random.default_rng(83)
    p = rng.choice([1.0, 1e-4, 1e-200, 1e200], size=T, p=[0.35, 0.45, 0.1, 0.1])
    z = rng.normal(1.0, 0.3, T)
    z[rng.random(T) < 0.5] = np.nan
    return dict(z=z, R=1e200, p=p, m0=1.0, P0=1.0)


def _alternating(T, big, scale, R):
    """Process variances alternating 0 and ``big`` on data of scale ``scale``."""
    rng = np.random.default_rng(7)
    z = scale * rng.normal(1.0, 0.1, T)
    z[rng.random(T) < 0.2] = np.nan
    return dict(z=z, R=R, p=np.where(np.arange(T) % 2 == 1, big, 0.0), P0=R)


def _forget_tiny():
    """A lane whose unit would be its largest process variance (1e60), with steps forgetting
    into a variance of 1e-200 (obs_var 1e30; a sweep's case, 40 steps)."""
    # fmt: off
    z = [0.823, NAN, 1.057, 1.064, 0.778, 0.402, 1.033, 0.61, 0.791, 0.972, 1.333, 0.813, 0.724,
         0.997, 1.307, NAN, 0.885, 0.906, 0.67, 0.953, NAN, 0.989, NAN, 0.816, 1.253, 1.014,
         0.828, NAN, 1.144, 0.818, NAN, 1.178, 1.07, 1.327, 1.552, NAN, 0.924, 0.967, NAN, NAN]
    p = [1e-200, 1e-4, 1.0, 0.0, 1.0, 1e-4, 1e-200, 1e-4, 1.0, 1.0, 1e-200, 1e-200, 1e-200, 1.0,
         1e-4, 1e-200, 1e-4, 1e-4, 1e-200, 1e-4, 1e-200, 1e-4, 1e-200, 1.0, 1e60, 1e-4, 1e-200,
         1e60, 1.0, 1e-4, 1e-4, 1e-4, 1e-200, 1e-4, 1e-4, 1e60, 1e-200, 1e-4, 1.0, 1e-4]
    a = [0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 0.0, 1.0, 0.9, 1.0, -1.0, 0.9, 1.0, 1.0, 0.0, 0.9, 1.0,
         0.9, 0.0, 1.0, 1.0, 0.9, 0.9, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 0.9, 1e100, 1.0, 1.0, 1.0,
         1.0, 1.0, 1.0, 1.0, 1.0, -1.0]
    # fmt: on
    return dict(z=z, R=1e30, a=a, p=p, m0=1.0, P0=1e60)


# (id, dtype, case): one lane each
# fmt: off
CASES = [
    ("issue-P1e300-f64", torch.float64,
     dict(z=[1e200, 1.1e200], R=1e300, p=[0.0, 1e300], P0=1e300)),
    ("issue-diffuse-f64", torch.float64, dict(z=[1e200, 1.1e200], R=1e300, p=[0.0, 1e300])),
    ("issue-P1e36-f32", torch.float32,
     dict(z=[1e18, 1.1e18], R=1e36, p=[0.0, 1e36], P0=1e36)),
    ("issue-diffuse-f32", torch.float32, dict(z=[1e18, 1.1e18], R=1e36, p=[0.0, 1e36])),
    ("alternating-T70-f64", torch.float64, _alternating(70, 1e300, 1e200, 1e300)),
    ("alternating-T70-f32", torch.float32, _alternating(70, 1e36, 1e18, 1e36)),
    ("carried-1e200-T70-f64", torch.float64, _carried()),
    ("lane-unit-info-f64", torch.float64,
     dict(z=[1e200, 1.1e200, 1.2e200, 0.9e200], R=1.0, p=1e300, P0=1e300)),
    ("lane-unit-info-f32", torch.float32,
     dict(z=[1e18, 1.1e18, 1.2e18, 0.9e18], R=1.0, p=1e36, P0=1e36)),
    ("offset-jump-f64", torch.float64,
     dict(z=[1.0, NAN, 1.2], R=1.0, p=[0.0, 1e300, 0.0], c=1e10, P0=1.0)),
    ("prior-mean-in-unit-f64", torch.float64,
     dict(z=[NAN, NAN], R=1e100, p=1e200, m0=1e150, P0=1.0)),
    ("forget-tiny-T40-f64", torch.float64, _forget_tiny()),
    ("p0-before-huge-f64", torch.float64,
     dict(z=[1.237, 0.947, 1.039, NAN, 0.739], a=0.9, p=[0.0, 1e-300, 1e300, 1e300, 1e300],
          m0=1.0, P0=1.0)),
    ("diffuse-obs1e-36-f32", torch.float32,
     dict(z=[1.47e10, 0.98e10, 1.25e10, 1.1e10], R=1e-36, p=[1e16, 1e16, 1e30, 1e16])),
    ("back-huge-decay-gap-T40-f32", torch.float32,
     dict(z=_gap(40, slice(35, 40), 81), a=1e10, p=1.0, P0=1.0)),
]
# fmt: on
IDS = [c[0] for c in CASES]


def _ins(dtype, case):
    T = len(case["z"])
    return _inputs({k: (np.reshape(v, (T, 1)) if np.ndim(v) == 1 else v)
                    for k, v in case.items()}, dtype)  # fmt: skip


@pytest.mark.parametrize("cid, dtype, case", CASES, ids=IDS)
def test_moments_and_loglik_match_mpmath(cid, dtype, case):
    _check_lanes(_ins(dtype, case), dtype, "torch")


def test_the_issue_on_the_public_api():
    """The issue's call, as reported: the torch backend gives the sequential reference's
    numbers (it raised OverflowError), with a proper and with a diffuse prior."""
    z = torch.tensor([1.0e200, 1.1e200], dtype=torch.float64)
    pv = torch.tensor([0, 1e300], dtype=torch.float64)
    for prior in (1e300, math.inf):
        want = ks.filter(z, decay=1.0, process_var=pv, obs_var=1e300, prior_var=prior,
                         backend="sequential")  # fmt: skip
        got = ks.filter(z, decay=1.0, process_var=pv, obs_var=1e300, prior_var=prior,
                        backend="torch")  # fmt: skip
        for x, y in ((got.mean, want.mean), (got.var, want.var), (got.loglik, want.loglik)):
            torch.testing.assert_close(x, y, rtol=1e-14, atol=0)


def test_one_extreme_lane_among_ordinary_ones():
    """A batch where one lane is the issue's and the others ordinary, and one where a lane has
    the lane unit's overflow: every lane against mpmath (the extreme lane sets the call's
    units)."""
    rng = np.random.default_rng(5)
    T = 40
    z = rng.normal(0.0, 1.0, (T, 4))
    z[:, 0] = 1e200 * rng.normal(1.0, 0.1, T)
    z[:, 3] = 1e200 * rng.normal(1.0, 0.1, T)
    z[rng.random((T, 4)) < 0.2] = np.nan
    p = np.full((T, 4), 0.1)
    p[:, 0] = np.where(np.arange(T) % 3 == 0, 1e300, 0.0)
    p[:, 3] = 1e300
    R = np.array([[1e300, 0.5, 2.0, 1.0]])
    case = dict(z=z, R=R, a=np.array([[1.0, 0.9, -0.7, 1.0]]), p=p,
                P0=np.array([1e300, math.inf, 1.0, 1e300]),
                m0=np.array([0.0, 0.0, 1.0, 0.0]))  # fmt: skip
    _check_lanes(_inputs(case, torch.float64), torch.float64, "torch")


# (id, dtype, case, keys): gradients of the log-likelihood against the complex step. (Where the
# log-likelihood over the predicted precision coordinate passes the range, -3e99 / 1e-300 in the
# issue's case, its gradient is NaN on the sequential reference too: results() differentiates
# loglik_terms in those coordinates; the cases keep below that.)
# fmt: off
GRAD_CASES = [
    ("issue-shape-f64", torch.float64,
     dict(z=[1e140, 1.1e140], R=1e280, p=[0.0, 1e280], P0=1e280), ("R", "p", "a", "z")),
    ("issue-shape-diffuse-f64", torch.float64,
     dict(z=[1e140, 1.1e140, 0.9e140], R=1e280, p=[0.0, 1e280, 0.0]), ("R", "p", "a", "z")),
    ("issue-shape-f32", torch.float32,
     dict(z=[1e10, 1.1e10], R=1e32, p=[0.0, 1e32], P0=1e32), ("R", "p", "a", "z")),
    ("lane-unit-info-f64", torch.float64,
     dict(z=[1e140, 1.1e140, 1.2e140, 0.9e140], R=1.0, p=1e280, P0=1e280), ("R", "p", "z")),
    ("offset-jump-f64", torch.float64,
     dict(z=[1.0, NAN, 1.2], R=1.0, p=[0.0, 1e280, 0.0], c=1e10, P0=1.0),
     ("R", "p", "a", "c", "z")),
    ("p0-before-huge-f64", torch.float64,
     dict(z=[1.237, 0.947, 1.039, NAN, 0.739], a=0.9, p=[0.0, 1e-300, 1e280, 1e280, 1e280],
          m0=1.0, P0=1.0), ("R", "p", "a", "z")),
    ("diffuse-obs1e-36-f32", torch.float32, CASES[13][2], ("R", "p", "z")),
]
# fmt: on


@pytest.mark.parametrize("cid, dtype, case, keys", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_loglik_gradient_matches_mpmath(cid, dtype, case, keys):
    """The log-likelihood's derivatives through leaves formed in per-step units, against
    mpmath: the issue's shape (it raised), the lane unit's overflow, and guards of the exact
    leaves' derivatives (a process variance 0 before a huge one, an offset of 1e10: these pass
    on the old scans too)."""
    ins = _ins(dtype, case)
    ll, t = _loglik(ins, dtype, "torch", grad=keys)
    got = torch.autograd.grad(ll.sum(), [t[k] for k in keys])
    want = _mp_grad(ins, 0, keys)
    ll_true = _truth(ins, 0)[0]
    for k, g in zip(keys, got, strict=True):
        _check_grad(g[:, 0].double().numpy(), want[k], ins[k][:, 0], ll_true, dtype, k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_smoothed_mean_gradient_matches_mpmath(dtype):
    """The derivative of the smoothed means' sum in the data, process and observation
    variances, both scans (forward and backward) in their per-step units (a guard: it passes on
    the old scans too)."""
    # (means of 1e10 and 10: where mean * variance passes the range the smoothed means'
    # derivatives are NaN on the sequential reference too, in steps.combine_two_filter's
    # coordinates)
    big, scale = (1e280, 1e10) if dtype == torch.float64 else (1e30, 10.0)
    ins = _ins(dtype, dict(z=[scale, 1.1 * scale, 0.99 * scale], R=big, p=[0.0, big, 0.0]))
    keys = ("R", "p", "z")
    res, t = _smooth(ins, dtype, "torch", grad=keys)
    got = torch.autograd.grad(res.mean.sum(), [t[k] for k in keys])
    want = _mp_grad(ins, 0, keys, of="smean")
    scale = float(np.nansum(np.abs(_truth(ins, 0)[5])))
    for k, g in zip(keys, got, strict=True):
        _check_grad(g[:, 0].double().numpy(), want[k], ins[k][:, 0], scale, dtype, k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_carried_variance_gradient_matches_mpmath(dtype):
    """The log-likelihood's gradient where a variance of 1e200 (float32: 1e30) is carried
    through small process variances, 70 steps (the chunked scans), against mpmath."""
    case = _carried() if dtype == torch.float64 else dict(_carried(), R=1e30, p=np.minimum(
        _carried()["p"], 1e30))  # fmt: skip
    ins = _ins(dtype, case)
    keys = ("R", "p", "a", "z")
    ll, t = _loglik(ins, dtype, "torch", grad=keys)
    got = torch.autograd.grad(ll.sum(), [t[k] for k in keys])
    want = _mp_grad(ins, 0, keys)
    ll_true = _truth(ins, 0)[0]
    for k, g in zip(keys, got, strict=True):
        _check_grad(g[:, 0].double().numpy(), want[k], ins[k][:, 0], ll_true, dtype, k)


def _sweep_lane(rng, T, dtype):
    """A random lane of mixed extremes: process variances among 0, tiny, 1 and huge; an
    observation variance tiny, 1 or huge; decays 1, 0.9, -1 and 0; data of scale 1 to 1e150
    (float32: 1e10); a quarter missing; a diffuse, vague or unit prior."""
    huge, tiny, scale = ((1e300, 1e-300, rng.choice([1.0, 1e50, 1e150])) if dtype == torch.float64
                         else (1e34, 1e-34, rng.choice([1.0, 1e5, 1e10])))  # fmt: skip
    p = rng.choice([0.0, tiny, 1.0, huge], size=T, p=[0.3, 0.2, 0.3, 0.2])
    a = rng.choice([1.0, 0.9, -1.0, 0.0], size=T, p=[0.5, 0.3, 0.15, 0.05])
    p = np.where((a == 0) & (p == 0), 1.0, p)
    z = scale * rng.normal(1.0, 0.3, T)
    z[rng.random(T) < 0.25] = np.nan
    R = rng.choice([1.0, huge, scale**2 * 1e-2])
    return dict(z=z, R=R, a=a, p=p, m0=scale, P0=rng.choice([math.inf, huge, 1.0]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("T", [2, 5, 40, 257])
def test_random_extreme_lanes_match_mpmath(T, dtype):
    """Seeded lanes of mixed extremes (:func:`_sweep_lane`), eight lanes a call, each
    against mpmath (moments, log-likelihood; a variance past the dtype's range, limit 5,
    only as such)."""
    rng = np.random.default_rng(1000 + T)
    for _ in range(6):
        lanes = [_sweep_lane(rng, T, dtype) for _ in range(8)]
        case = {k: np.stack([np.broadcast_to(np.asarray(ln[k], np.float64), (T,))
                             for ln in lanes], 1) for k in ("z", "R", "a", "p")}  # fmt: skip
        case["m0"] = np.array([ln["m0"] for ln in lanes])
        case["P0"] = np.array([ln["P0"] for ln in lanes])
        _check_lanes(_inputs(case, dtype), dtype, "torch", data_scale=True)
