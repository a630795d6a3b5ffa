"""The dense API as a demanding user meets it: classic models on statsmodels' data sets against
statsmodels (``UnobservedComponents``, ``SARIMAX``, ``DynamicFactor``, the same model in the
same parametrization), variance scales far from 1 against the same model at scale 1 (exactly
equivariant: z, offset and the prior mean scale by s, every covariance by s**2), the limit
precision at diffuse steps against an mpmath covariance filter, and the argument checks a user
trips over (indefinite priors, empty axes, 1-d observations, read-only arrays).

Conventions (docs/dense.md): our prior sits on x_0, statsmodels' on x_1 = F x_0 + w; a diffuse
or stationary block of x_0 gives the same block on x_1, so the models are the same. Filtered
moments are compared at proper steps only (the finite part of a diffuse step depends on where
the prior sits), and our log-likelihood minus statsmodels' exact diffuse one is
``loglik_offset("statsmodels", ...)`` (the diffuse steps' ``1/2 log pdet(2 pi F_inf)``).
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native
from tests.helpers import read_only

BACKENDS = ["native", "torch", "sequential"]
needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")


def _backends():
    return [pytest.param(b, marks=needs_native) if b == "native" else b for b in BACKENDS]


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ----------------------------------------------------------------------------- statsmodels


def _ssm(mod):
    """(F, Q, H, R) of a statsmodels state-space model with time-invariant matrices."""
    s = mod.ssm

    def get(name, k):
        a = np.asarray(s[name])
        return a[..., 0] if a.ndim == k + 1 else a

    sel = get("selection", 2)
    Q = sel @ np.atleast_2d(get("state_cov", 2)) @ sel.T
    assert not np.any(get("state_intercept", 1)) and not np.any(get("obs_intercept", 1))
    return get("transition", 2), Q, get("design", 2), np.atleast_2d(get("obs_cov", 2))


def _statsmodels_case(name):
    """(statsmodels results, z [T, d], F, Q, H, R, prior_cov, diffuse mask or None): the
    reference is the same for every backend, so it is computed once (the arrays read only)."""
    out = _statsmodels_case_once(name)
    read_only(*out[1:])
    return out


@functools.cache
def _statsmodels_case_once(name):
    sm = pytest.importorskip("statsmodels.api")
    from scipy.linalg import solve_discrete_lyapunov
    from statsmodels import datasets

    mac = datasets.macrodata.load_pandas().data
    if name == "sunspots-llevel-seasonal12":
        y = datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(float)
        mod = sm.tsa.UnobservedComponents(y, "llevel", seasonal=12, use_exact_diffuse=True)
        params, prior = [100.0, 400.0, 5.0], "diffuse"
    elif name == "co2-lltrend-seasonal4-missing":
        y = datasets.co2.load_pandas().data["co2"].to_numpy(float)[:600]  # 17 NaN
        mod = sm.tsa.UnobservedComponents(y, "lltrend", seasonal=4, use_exact_diffuse=True)
        params, prior = [0.2, 0.05, 1e-4, 0.01], "diffuse"
    elif name == "gdp-lltrend-ar2":
        y = 100 * np.log(mac["realgdp"].to_numpy(float))
        mod = sm.tsa.UnobservedComponents(
            y, "lltrend", autoregressive=2, use_exact_diffuse=True
        )  # trend diffuse, AR(2) block stationary
        params, prior = [0.01, 0.3, 0.01, 0.5, 1.2, -0.4], 2
    elif name == "infl-arma11":
        y = mac["infl"].to_numpy(float)
        mod = sm.tsa.SARIMAX(y, order=(1, 0, 1))
        params, prior = [0.7, -0.3, 4.0], 0
    elif name == "gdp-arima111":
        y = 100 * np.log(mac["realgdp"].to_numpy(float))
        mod = sm.tsa.SARIMAX(y, order=(1, 1, 1), use_exact_diffuse=True)
        params, prior = [0.4, -0.1, 0.7], 1
    elif name == "infl-regression-ar1-missing":
        # regression on unemployment and the T-bill rate with AR(1) errors: the coefficients are
        # diffuse states seen through a time-varying design, R = 0
        y = mac["infl"].to_numpy(float).copy()
        y[[30, 31, 100]] = np.nan
        X = mac[["unemp", "tbilrate"]].to_numpy(float)
        mod = sm.tsa.SARIMAX(
            y, exog=X, order=(1, 0, 0), mle_regression=False, use_exact_diffuse=True
        )
        params, prior = [0.6, 3.0], "ar-first"
    elif name == "macro-dfm2-missing":
        cols = ["realgdp", "realcons", "realinv", "realgovt"]
        y = 100 * np.diff(np.log(mac[cols].to_numpy(float)), axis=0)
        y -= y.mean(0)
        y[5, 1] = y[10, :2] = y[20] = np.nan  # one entry, two entries, the whole vector
        mod = sm.tsa.DynamicFactor(y, k_factors=2, factor_order=1)
        params, prior = mod.start_params, 0
    else:
        raise KeyError(name)
    mod.ssm.tolerance = 0.0  # no steady-state shortcut (it moves covariances by ~1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mod.smooth(params)
    F, Q, H, R = _ssm(mod)
    n = F.shape[0]
    z = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    if prior == "diffuse":
        return res, z, F, Q, H, R, None, np.ones(n, bool)
    if prior == "ar-first":  # state 0 the stationary AR(1), the rest diffuse
        H = np.moveaxis(np.asarray(mod.ssm["design"]), -1, 0)  # [T, 1, n]
        P0 = np.diag(np.r_[Q[0, 0] / (1 - F[0, 0] ** 2), np.full(n - 1, np.inf)])
        return res, z, F, Q, H, R, P0, np.arange(n) > 0
    # the first `prior` states diffuse, the rest stationary (statsmodels' initialization)
    k = prior
    P0 = np.zeros((n, n))
    P0[k:, k:] = solve_discrete_lyapunov(F[k:, k:], Q[k:, k:])
    P0[np.arange(k), np.arange(k)] = np.inf
    return res, z, F, Q, H, R, P0, (np.arange(n) < k) if k else None


SM_CASES = [
    "sunspots-llevel-seasonal12",
    "co2-lltrend-seasonal4-missing",
    "gdp-lltrend-ar2",
    "infl-arma11",
    "gdp-arima111",
    "infl-regression-ar1-missing",
    "macro-dfm2-missing",
]


# the sequential backend (1.5 s a case at 600 steps) on the trend, seasonal and missing model in
# the slow step: each of its parts is met by default (sunspots' seasonal, gdp's trend, the
# regression's and the factor model's missing entries)
SM_PARAMS = [
    pytest.param(c, b, id=f"{c}-{b}",
                 marks=[needs_native] * (b == "native") + [pytest.mark.slow] * (
                     (c, b) == ("co2-lltrend-seasonal4-missing", "sequential")))
    for c in SM_CASES for b in BACKENDS
]  # fmt: skip


@pytest.mark.parametrize("case, backend", SM_PARAMS)
def test_classic_models_match_statsmodels(case, backend):
    """Filtered, predicted and smoothed moments and the log-likelihood against statsmodels on the
    same model, every backend: at most 1e-13 measured (1e-10 asserted; the smoothed covariances
    of the 13-state sunspot model 8e-14)."""
    from kalmanscan.validation.oracle import loglik_offset

    res, z, F, Q, H, R, P0, diffuse = _statsmodels_case(case)
    out = kd.smooth(z, F, Q, H, R, prior_cov=P0, backend=backend)
    f = out.filtered
    ok = ~f.diffuse
    assert ok.sum() >= len(z) - 12
    assert _rel(f.mean[ok], res.filtered_state.T[ok]) < 1e-10
    assert _rel(f.cov[ok], np.moveaxis(res.filtered_state_cov, -1, 0)[ok]) < 1e-10
    prev = ok[:-1]  # a prediction from a proper filtered state
    assert _rel(f.pred_mean[1:][prev], res.predicted_state[:, 1:-1].T[prev]) < 1e-10
    assert (
        _rel(f.pred_cov[1:][prev], np.moveaxis(res.predicted_state_cov, -1, 0)[1:-1][prev]) < 1e-10
    )
    assert _rel(out.mean, res.smoothed_state.T) < 1e-10
    assert _rel(out.cov, np.moveaxis(res.smoothed_state_cov, -1, 0)) < 1e-10
    off = 0.0
    if diffuse is not None:
        off = loglik_offset("statsmodels", F, H, np.isfinite(z), diffuse=diffuse)
    assert abs(float(f.loglik) - off - res.llf) < 1e-10 * abs(res.llf)


def test_seasonal_fit_matches_statsmodels_on_monthly_co2():
    """Local level + 12-season dummies fitted to 20 years of monthly CO2 (5 months missing):
    the estimates equal statsmodels' fit (polished by Nelder-Mead) to 1e-6 relative and
    statsmodels' own log-likelihood at our estimate is ours after the convention offset, to 1e-9
    (the seasonal variance is on its boundary 0 in both)."""
    sm = pytest.importorskip("statsmodels.api")
    from statsmodels import datasets

    from kalmanscan.validation.oracle import loglik_offset

    co2 = datasets.co2.load_pandas().data["co2"]
    y = co2.resample("MS").mean().to_numpy(float)[:240]
    assert np.isnan(y).sum() == 5

    def build(level_var, seasonal_var, obs_var):
        level = kd.DenseModel(np.eye(1), [[level_var]], np.eye(1), [[obs_var]], np.zeros(1))
        return kd.add_components(level, kd.seasonal_dummies(12, seasonal_var))

    fit = kd.fit(y[:, None], build)
    assert bool(fit.converged) and bool(fit.at_boundary["seasonal_var"])
    mod = sm.tsa.UnobservedComponents(y, "llevel", seasonal=12, use_exact_diffuse=True)
    mod.ssm.tolerance = 0.0
    ours = np.array([float(fit.params[p]) for p in ("obs_var", "level_var", "seasonal_var")])
    m = build(1.0, 1.0, 1.0)
    off = loglik_offset("statsmodels", m.F, m.H, np.isfinite(y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = mod.fit(disp=False).params
        assert abs(mod.loglike(ours) + off - float(fit.loglik)) < 1e-9 * abs(float(fit.loglik))
        assert mod.loglike(ours) >= mod.loglike(theirs) - 1e-9
    np.testing.assert_allclose(ours[:2], theirs[:2], rtol=1e-3)  # its L-BFGS stops short
    assert ours[2] == 0.0 and theirs[2] < 1e-9


# ----------------------------------------------------------------------------- degenerate models


def _degenerate(name):
    """(z, F, Q, H, R, kwargs) of a degenerate but valid model, T = 30."""
    rng = np.random.default_rng(1)
    T = 30
    F3 = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.2], [0.1, 0.0, 0.7]])
    Q3 = np.diag([0.5, 0.3, 0.2])
    H2 = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    z2 = rng.normal(size=(T, 2))
    z2[rng.random((T, 2)) < 0.2] = np.nan  # some entries of some steps
    if name == "rank-1-Q-smooth-trend":
        m = kd.local_linear_trend(0.0, 0.05, 1.0)
        z = np.cumsum(np.cumsum(0.2 * rng.normal(size=T)))[:, None] + rng.normal(size=(T, 1))
        z[[5, 6, 20]] = np.nan
        return z, m.F, m.Q, m.H, m.R, {}
    if name == "R0-one-channel-diffuse":
        return z2, F3, Q3, H2, np.diag([0.0, 0.4]), {}
    if name == "R0-one-channel-proper":
        return z2, F3, Q3, H2, np.diag([0.0, 0.4]), dict(prior_cov=np.eye(3))
    if name == "never-observed-state":
        F = np.diag([0.9, 1.0, 0.5])
        F[0, 1] = 0.3
        kw = dict(prior_cov=np.diag([np.inf, np.inf, 2.0]))
        return rng.normal(size=(T, 1)), F, Q3, np.array([[1.0, 0.0, 0.0]]), 0.3 * np.eye(1), kw
    if name == "partly-diffuse-correlated-prior":
        P0 = np.array([[np.inf, 0, 0], [0, 2.0, 0.5], [0, 0.5, 1.0]])
        kw = dict(prior_cov=P0, prior_mean=np.array([0.0, 1.0, -1.0]))
        return z2, F3, Q3, H2, np.diag([0.3, 0.4]), kw
    if name == "correlated-R-partly-missing":
        return z2, F3, Q3, H2, np.array([[0.5, 0.3], [0.3, 0.4]]), {}
    if name == "near-unit-root":
        m = kd.local_linear_trend(0.1, 0.01, 1.0)
        F = np.array([[1 - 1e-12, 1.0], [0.0, 1 - 1e-10]])
        return np.cumsum(rng.normal(size=(T, 1)), 0), F, m.Q, m.H, m.R, {}
    raise KeyError(name)


DEGENERATE = [
    "rank-1-Q-smooth-trend",
    "R0-one-channel-diffuse",
    "R0-one-channel-proper",
    "never-observed-state",
    "partly-diffuse-correlated-prior",
    "correlated-R-partly-missing",
    "near-unit-root",
]


@functools.cache
def _degenerate_oracle(name):
    """:func:`_degenerate` and its mpmath oracle (60 digits), the same for every backend:
    computed once, the arrays read only."""
    from kalmanscan.validation.oracle import dense_oracle

    z, F, Q, H, R, kw = _degenerate(name)
    o = dense_oracle(z, F, Q, H, R, dps=60, **kw)
    read_only(z, F, Q, H, R, *kw.values(), *o)
    return z, F, Q, H, R, kw, o


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("name", DEGENERATE)
def test_degenerate_models_against_oracle(name, backend):
    """Degenerate but valid models against the mpmath oracle (60 digits): filtered and smoothed
    means within 1e-12 sd (1.6e-14 measured), covariances and log-likelihood 1e-12 relative
    (4.9e-15), the diffuse steps the same."""
    z, F, Q, H, R, kw, o = _degenerate_oracle(name)
    out = kd.smooth(z, F, Q, H, R, backend=backend, **kw)
    f = out.filtered
    np.testing.assert_array_equal(f.diffuse, o.diffuse)
    ok = ~o.diffuse
    fsd = np.sqrt(np.einsum("tii->ti", o.cov[ok]))
    ssd = np.sqrt(np.einsum("tii->ti", o.smooth_cov))
    assert np.max(np.abs(f.mean[ok] - o.mean[ok]) / fsd) < 1e-12
    assert _rel(f.cov[ok], o.cov[ok]) < 1e-12
    assert np.max(np.abs(out.mean - o.smooth_mean) / ssd) < 1e-12
    assert _rel(out.cov, o.smooth_cov) < 1e-12
    assert abs(float(f.loglik) - o.loglik) < 1e-12 * abs(o.loglik)


# ----------------------------------------------------------------------------- scales


def _seasonal_trend(T=60, seed=2):
    rng = np.random.default_rng(seed)
    m = kd.add_components(kd.local_linear_trend(0.1, 0.01, 0.5), kd.seasonal_dummies(4, 0.05))
    z = np.cumsum(rng.normal(size=(T, 1)), 0)
    z[[t for t in (3, 17, 18) if t < T]] = np.nan
    return m, z


PRIORS = {
    "diffuse": {},
    "partial": dict(prior_cov=np.diag([np.inf, np.inf, 1.0, 1.0, 1.0])),
    "proper": dict(prior_cov=np.eye(5)),
}


def _scaled(res, s):
    """Results of the model scaled by s brought back to scale 1 (cov / s**2, precision * s**2)."""
    f = res.filtered
    v = s * s
    return dict(
        fmean=f.mean / s, fcov=f.cov / v, fprec=f.precision * v, pmean=f.pred_mean / s,
        pcov=f.pred_cov / v, smean=res.mean / s, scov=res.cov / v, sprec=res.precision * v,
    )  # fmt: skip


def _equivariance_errors(out, ref, s):
    errs = {}
    for key, got in _scaled(out, s).items():
        want = _scaled(ref, 1.0)[key]
        if not (np.isinf(got) == np.isinf(want)).all():
            errs[key] = math.inf
            continue
        got, want = np.where(np.isinf(got), 0.0, got), np.where(np.isinf(want), 0.0, want)
        errs[key] = math.nan if np.isnan(got).any() else _rel(got, want)
    return errs


@functools.cache
def _scale_one_reference(prior):
    """The sequential backend's smoother at scale 1 (the same for every scale and backend)."""
    m, z = _seasonal_trend()
    return kd.smooth(z, m.F, m.Q, m.H, m.R, backend="sequential", **PRIORS[prior])


# variances 1e-200 and 1e200 repeat the regime of 1e-300 and 1e300 (a product of two variances
# under- or overflows in both): the slow step runs them
SCALES = [1e-150, pytest.param(1e-100, marks=pytest.mark.slow), 1e-6, 1e6,
          pytest.param(1e100, marks=pytest.mark.slow), 1e150]  # fmt: skip


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("prior", list(PRIORS))
@pytest.mark.parametrize("s", SCALES, ids=lambda s: f"s{s:g}")
def test_variance_scales_far_from_one_are_exact(s, prior, backend):
    """z, offset and the prior mean times s and every covariance times s**2 (variances from
    1e-300 to 1e300): the moments scale exactly, the log-likelihood moves by -k log s (k the
    number of observed entries outside the diffuse ones: 52, 55, 57 here). Before, the native
    path returned wrong moments outside variances of about 1e-154 .. 1e154 (products of two
    variances under- or overflowing: filtered means 0.3 .. 6 relative off at variance 1e-200,
    inf at 1e300), and every backend's filtered precision at the diffuse steps lost
    ``cond`` digits against a unit projector (1.2e-4 relative at variance 1e-12, NaN at 1e-50,
    60x off at 1e50)."""
    m, z = _seasonal_trend()
    kw = PRIORS[prior]
    ref = _scale_one_reference(prior)
    v = s * s
    kws = {k: a * v for k, a in kw.items()}
    out = kd.smooth(z * s, m.F, m.Q * v, m.H, m.R * v, backend=backend, **kws)
    errs = _equivariance_errors(out, ref, s)
    assert max(errs.values()) < 1e-11, errs
    k = {"diffuse": 52, "partial": 55, "proper": 57}[prior]
    want = float(ref.filtered.loglik) - k * math.log(s)
    assert abs(float(out.filtered.loglik) - want) < 1e-12 * abs(want)
    np.testing.assert_array_equal(out.filtered.diffuse, ref.filtered.diffuse)


@needs_native
def test_native_scale_per_series_and_loglik_alone():
    """Series of one batch at scales 1e-120, 1 and 1e120 (a per-series prior and per-series
    noise) agree with each series filtered alone at scale 1, on the filter and on the
    log-likelihood alone that ``kd.fit`` minimizes."""
    from kalmanscan.dense import _args

    m, z = _seasonal_trend()
    s = np.array([1e-120, 1.0, 1e120])
    zb = z[:, None, :] * s[None, :, None]  # [T, 3, 1]
    Q = m.Q * (s**2)[:, None, None]
    R = m.R * (s**2)[:, None, None]
    ref = kd.filter(z, m.F, m.Q, m.H, m.R, backend="sequential")
    out = kd.filter(zb, m.F, Q, m.H, R, backend="native")
    for b in range(3):
        np.testing.assert_allclose(out.mean[:, b] / s[b], ref.mean, rtol=1e-12, atol=1e-12)
        ok = ~ref.diffuse
        np.testing.assert_allclose(out.cov[ok, b] / s[b] ** 2, ref.cov[ok], rtol=1e-12)
        want = float(ref.loglik) - 52 * math.log(s[b])
        assert abs(float(out.loglik[b]) - want) < 1e-12 * abs(want)
    model, _ = _args.prepare(zb, m.F, Q, m.H, R, None, None, None, None, 0, mask=False)
    np.testing.assert_allclose(native.loglik(model).numpy(), out.loglik, rtol=1e-14)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_fit_reports_the_loglik_of_tiny_series(backend):
    """kd.fit on the Nile flows times 1e-100: the estimates are the unscaled ones times 1e-200
    (the fit standardizes) and the reported log-likelihood is the unscaled one minus 98 log s
    (98 observed entries past the two diffuse ones). Before, the native log-likelihood at the
    estimate (variances near 1e-196) was 325 nats off."""
    pytest.importorskip("statsmodels")
    from statsmodels import datasets

    y = datasets.nile.load_pandas().data["volume"].to_numpy(float)[:, None]
    ref = kd.fit(y, kd.local_linear_trend, backend=backend)
    s = 1e-100
    got = kd.fit(y * s, kd.local_linear_trend, backend=backend)
    for p in ("level_var", "obs_var"):
        np.testing.assert_allclose(got.params[p] / s**2, ref.params[p], rtol=1e-9)
    want = float(ref.loglik) - 98 * math.log(s)
    assert abs(float(got.loglik) - want) < 1e-12 * abs(want)


def _mp_limit_precision(z, F, Q, H, R, kappa_exp=40, dps=80):
    """Filtered precisions of a fully diffuse model, ``lim (P_kappa)^-1`` as kappa -> inf, from
    an mpmath covariance filter started at ``kappa I`` (error ~ 1/kappa)."""
    import mpmath as mp

    with mp.workdps(dps):
        n = F.shape[0]
        Fm, Qm, Hm, Rm = (mp.matrix(np.asarray(a).tolist()) for a in (F, Q, H, R))
        P = mp.eye(n) * mp.mpf(10) ** kappa_exp
        out = []
        for t in range(len(z)):
            P = Fm * P * Fm.T + Qm
            if np.isfinite(z[t]).all():
                S = Hm * P * Hm.T + Rm
                K = P * Hm.T * mp.inverse(S)
                P = P - K * Hm * P
                P = (P + P.T) / 2
            out.append(np.array((mp.inverse(P)).tolist(), dtype=np.float64))
    return np.array(out)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("s", [1.0, 1e-6, 1e6], ids=lambda s: f"s{s:g}")
def test_diffuse_step_precision_against_mpmath(s, backend):
    """The filtered precision at the diffuse steps of local level + 4-season dummies (diffuse
    directions not along the axes) against the inverse covariance of an mpmath filter started at
    kappa = 1e40: 5e-15 relative at scale 1, and at variances 1e-12 and 1e12 (1.2e-4 and 1.2e-6
    before: the limit was formed as ``(Pk P Pk + Pd)^-1`` with a unit projector ``Pd`` beside a
    ``P`` of another scale)."""
    m, z = _seasonal_trend(T=10)  # z[3] missing
    F, Q, H, R = m.F, m.Q * s * s, m.H, m.R * s * s
    out = kd.filter(z * s, F, Q, H, R, backend=backend)
    want = _mp_limit_precision(z * s, F, Q, H, R)
    np.testing.assert_array_equal(out.diffuse, np.arange(10) < 7)
    for t in range(len(z)):
        assert _rel(out.precision[t], want[t]) < 1e-10, t


# ----------------------------------------------------------------------------- argument checks


LLT = kd.local_linear_trend(0.1, 0.01, 0.5)._asdict()
Z = np.cumsum(np.random.default_rng(0).normal(size=(30, 1)), 0)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(prior_cov=-np.eye(2)), r"prior_cov: expected a positive-semidefinite"),
        (dict(prior_cov=[[1.0, 2.0], [2.0, 1.0]]), r"prior_cov: expected a positive-semidefinite"),
        (dict(prior_cov=np.diag([np.inf, -1.0])), r"prior_cov: expected a positive-semidefinite"),
        (dict(prior_precision=-np.eye(2)), r"prior_precision: expected a positive-semidefinite"),
        (dict(prior_precision=np.diag([0.0, -1.0])), r"prior_precision: expected a positive-sem"),
    ],
    ids=["cov-negative", "cov-indefinite", "cov-partly-diffuse", "prec-negative", "prec-partial"],
)
def test_indefinite_priors_are_refused_by_name(bad, match, backend):
    """Before: native filtered with ``prior_cov=-I`` (log-likelihood 0.0, negative variances)
    and with an indefinite one, torch blamed R, the reference and every precision prior raised
    torch's ``_LinAlgError`` from a Cholesky factor or inverse."""
    with pytest.raises(ValueError, match=match):
        kd.filter(Z, **LLT, **bad, backend=backend)


def test_semidefinite_priors_are_still_served():
    """A singular prior covariance (a state known exactly) and a singular precision (diffuse
    directions) are valid: the checks refuse negative eigenvalues only."""
    known = kd.filter(Z, **LLT, prior_cov=np.diag([1.0, 0.0]))
    assert np.isfinite(known.loglik) and known.cov[0, 1, 1] > 0
    part = kd.filter(Z, **LLT, prior_precision=np.diag([0.0, 2.0]))
    same = kd.filter(Z, **LLT, prior_cov=np.diag([np.inf, 0.5]))
    np.testing.assert_allclose(part.mean, same.mean, rtol=1e-12)
    # a state known exactly beside a diffuse one (refused before): served, alike on every backend
    lls = [
        kd.filter(Z, **LLT, prior_cov=np.diag([np.inf, 0.0]), backend=b).loglik
        for b in BACKENDS
        if b != "native" or native.available()
    ]
    assert np.isfinite(lls).all() and np.ptp(lls) < 1e-10 * abs(lls[0])


@pytest.mark.parametrize(
    "z, match",
    [
        (np.zeros((0, 1)), r"z: expected at least one time step along axis 0, got shape \(0, 1\)"),
        (np.zeros((30, 0)), r"z: expected at least one observation entry .*got shape \(30, 0\)"),
        (Z[:, 0], r"z: expected at least 2 dimensions .*z\[:, None\].*got shape \(30,\)"),
    ],
    ids=["T0", "d0", "1-d"],
)
def test_empty_and_one_dimensional_observations_are_refused_clearly(z, match):
    """Before: torch's 'cannot reshape tensor of 0 elements' for an empty time axis or an empty
    observation vector; the 1-d message did not say how to pass one series."""
    kw = LLT
    if z.ndim == 2 and z.shape[-1] == 0:
        kw = dict(LLT, H=np.zeros((0, 2)), R=np.zeros((0, 0)))
    with pytest.raises(ValueError, match=match):
        kd.filter(z, **kw)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(R=0.5), r"R: expected shape \[\.\.\., d, d\] = \[\.\.\., 1, 1\] .*got shape \(\)"),
        (dict(H=np.array([1.0, 0.0])), r"H: expected shape \[\.\.\., d, n\] = \[\.\.\., 1, n\]"),
        (dict(F=np.ones(2)), r"F: expected shape \[\.\.\., n, n\] .*got shape \(2,\)"),
        (dict(offset=np.float64(0.0)), r"offset: expected shape \[\.\.\., n\] .*got shape \(\)"),
    ],
    ids=["R-scalar", "H-vector", "F-vector", "offset-scalar"],
)
def test_too_few_dimensions_name_the_expected_shape(bad, match):
    with pytest.raises(ValueError, match=match):
        kd.filter(Z, **{**LLT, **bad})


def test_time_varying_matrix_without_series_axis_gets_a_hint():
    """F of shape [T, n, n] with z [T, B, d]: leading axes align from the right (numpy), so
    the message says which shape serves one matrix per step for every series."""
    z = np.zeros((20, 3, 1))
    F = np.repeat(LLT["F"][None], 20, 0)
    with pytest.raises(ValueError, match=r"F: leading shape \(20,\) .*\(20, 1, 2, 2\)"):
        kd.filter(z, F, LLT["Q"], LLT["H"], LLT["R"])


def test_read_only_inputs_raise_no_warning():
    """A read-only array (pandas' copy-on-write frames, np.broadcast_to) was handed to
    torch.as_tensor, which warned 'The given NumPy array is not writable'; kalmanscan never
    writes its inputs (kalmanscan.core._args does the same). torch warns once per process, so
    the check runs in a fresh one."""
    pytest.importorskip("pandas")
    code = """if True:
        import warnings
        warnings.simplefilter("error")
        import numpy as np, pandas as pd, kalmanscan.dense as kd
        m = kd.local_linear_trend(0.1, 0.01, 0.5)
        z = np.arange(30.0)[:, None]
        ro = z.copy()
        ro.setflags(write=False)
        F = np.broadcast_to(m.F, (30, 2, 2))
        a = kd.filter(ro, F, m.Q, m.H, m.R)
        b = kd.filter(pd.DataFrame(z, columns=["y"]), m.F, m.Q, m.H, m.R)
        assert (a.mean == kd.filter(z, m.F, m.Q, m.H, m.R).mean).all()
        assert (a.mean == b.mean).all()
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_masked_dataframe_float32_and_torch_inputs_agree():
    """The same partly missing series as a masked array, a pandas frame with NaN, float32 and a
    torch tensor: the same results (float32 to its precision, torch out for torch in)."""
    pd = pytest.importorskip("pandas")
    z = Z.copy()
    z[[4, 9]] = np.nan
    ref = kd.smooth(z, **LLT)
    masked = np.ma.masked_invalid(z)
    frame = pd.DataFrame({"y": pd.array(np.where(np.isnan(z[:, 0]), None, z[:, 0]), "Float64")})
    for x in (masked, frame):
        np.testing.assert_array_equal(kd.smooth(x, **LLT).mean, ref.mean)
    f32 = kd.smooth(z.astype(np.float32), **LLT)
    assert f32.mean.dtype == np.float32
    np.testing.assert_allclose(f32.mean, ref.mean, rtol=1e-5, atol=1e-5)
    t = kd.smooth(torch.as_tensor(z), **LLT)
    assert isinstance(t.mean, torch.Tensor)
    np.testing.assert_allclose(t.mean.numpy(), ref.mean, rtol=1e-14)


def test_float64_data_is_not_rounded_to_a_float32_parameter():
    """numpy float64 observations with one float32 tensor parameter: torch out (a tensor was
    given) in float64, as ``ks.filter`` promotes; before, the data were rounded to float32 (1e-3
    absolute at a level of 1e4). A float32 tensor z still sets float32."""
    z = Z + 1e4
    F32 = torch.tensor(LLT["F"], dtype=torch.float32)
    got = kd.filter(z, F32, LLT["Q"], LLT["H"], LLT["R"])
    assert isinstance(got.mean, torch.Tensor) and got.mean.dtype == torch.float64
    np.testing.assert_allclose(got.mean.numpy(), kd.filter(z, **LLT).mean, rtol=1e-15)
    z32 = kd.filter(torch.tensor(z, dtype=torch.float32), LLT["F"], LLT["Q"], LLT["H"], LLT["R"])
    assert z32.mean.dtype == torch.float32
