"""kalmanscan.dense.fit: maximum-likelihood variances of built dense models, many series at once,
against statsmodels' exact-diffuse UnobservedComponents and the model's own log-likelihood."""

from __future__ import annotations

import doctest
import importlib
import warnings

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native

fit_module = importlib.import_module("kalmanscan.dense.fit")  # kd.fit is the function


def llt_series(seed, T, B, missing=0.05):
    rng = np.random.default_rng([seed, 25])
    slope = np.cumsum(0.1 * rng.normal(size=(T, B)), 0)
    level = np.cumsum(slope + 0.7 * rng.normal(size=(T, B)), 0)
    z = (level + rng.normal(size=(T, B)))[..., None]
    z[rng.random(z.shape) < missing] = np.nan
    return z


def simulate(m, T, B, seed):
    rng = np.random.default_rng([seed, 26])
    F, Q, H, R = (np.asarray(x) for x in (m.F, m.Q, m.H, m.R))
    n = F.shape[0]
    Lq, Lr = np.linalg.cholesky(Q + 1e-12 * np.eye(n)), np.linalg.cholesky(R)
    x, zs = np.zeros((B, n)), []
    for _ in range(T):
        x = x @ F.T + rng.normal(size=(B, n)) @ Lq.T
        zs.append(x @ H.T + rng.normal(size=(B, H.shape[0])) @ Lr.T)
    return np.stack(zs)


def test_docstring_example_runs():
    res = doctest.testmod(fit_module, verbose=False)
    assert res.attempted > 0 and res.failed == 0


def test_llt_matches_statsmodels_exact_diffuse_mle():
    """Estimates against statsmodels' fit polished by Nelder-Mead to 1e-12 (its default L-BFGS
    stops about 1e-4 short; ours is better there: statsmodels' own loglike at our estimate is
    higher), and the log-likelihood at the estimate equal to statsmodels' after the convention
    offset (docs/dense.md)."""
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    from kalmanscan.validation.oracle import loglik_offset

    z = llt_series(1, 500, 6)
    res = kd.fit(z, kd.local_linear_trend)
    assert res.converged.all()
    m = kd.local_linear_trend(1.0, 1.0, 1.0)
    for b in range(z.shape[1]):
        y = z[:, b, 0]
        mod = sm.UnobservedComponents(y, "local linear trend", use_exact_diffuse=True)
        mod.ssm.tolerance = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = mod.fit(disp=False)
            r = mod.fit(start_params=r.params, disp=False, method="nm", xtol=1e-12, ftol=1e-14,
                        maxiter=20000, maxfun=20000)  # fmt: skip
        ours = np.array([res.params[p][b] for p in ("obs_var", "level_var", "slope_var")])
        np.testing.assert_allclose(ours, r.params, rtol=2e-6)
        assert mod.loglike(ours) >= r.llf - 1e-9
        off = loglik_offset("statsmodels", m.F, m.H, ~np.isnan(y))
        assert abs(res.loglik[b] - off - mod.loglike(ours)) < 1e-9 * abs(r.llf)


@pytest.mark.parametrize("backend", [pytest.param("torch", marks=pytest.mark.slow), "native"])
def test_other_builders_reach_a_maximum(backend):
    """Seasonal (4 variances), constant velocity (dt fixed) and a two-component OU sum: every fit
    converges to a point where moving any variance by 1e-3 relative lowers kd.filter's
    log-likelihood, and (native, 40 series of 400 steps) the median estimate is within 35 % of
    the simulated value."""
    if backend == "native" and not native.available():
        pytest.skip("native extension not built")

    def trend_seasonal(level_var, slope_var, seasonal_var, obs_var):
        llt = kd.local_linear_trend(level_var, slope_var, obs_var)
        return kd.add_components(llt, kd.seasonal_dummies(4, seasonal_var))

    def two_ou(fast_var, slow_var, obs_var):
        return kd.ou_sum([0.5, 0.02], [fast_var, slow_var], 1.0, obs_var)

    cases = [
        (trend_seasonal, {}, dict(level_var=0.3, slope_var=0.01, seasonal_var=0.1, obs_var=1.0)),
        (kd.constant_velocity, dict(dt=1.0), dict(accel_var=0.3, obs_var=2.0)),
        (two_ou, {}, dict(fast_var=1.0, slow_var=0.1, obs_var=0.5)),
    ]
    B = 40 if backend == "native" else 4
    for i, (build, fixed, truth) in enumerate(cases):
        z = simulate(build(**fixed, **truth), 400, B, seed=i)
        res = kd.fit(z, build, fixed=fixed, backend=backend)
        assert res.converged.all(), res.message
        for b in range(2):
            est = {p: float(v[b]) for p, v in res.params.items()}
            ll0 = kd.filter(z[:, b], **build(**fixed, **est)._asdict()).loglik
            assert abs(ll0 - res.loglik[b]) < 1e-10 * abs(ll0)
            for p in est:
                if res.at_boundary[p][b]:
                    continue
                for f in (1 - 1e-3, 1 + 1e-3):
                    m = build(**fixed, **{**est, p: est[p] * f})
                    assert kd.filter(z[:, b], **m._asdict()).loglik < ll0, (build, p, f)
        if B == 40:
            for p, v in truth.items():
                med = np.median(res.params[p])
                assert abs(med / v - 1) < 0.35, (build, p, med, v)


def test_backends_agree_and_loglik_is_the_filters():
    z = llt_series(3, 200, 3)
    if not native.available():
        pytest.skip("native extension not built")
    a = kd.fit(z, kd.local_linear_trend, backend="native")
    b = kd.fit(z, kd.local_linear_trend, backend="torch")
    for p in a.params:
        np.testing.assert_allclose(a.params[p], b.params[p], rtol=1e-8)
    for i in range(3):
        m = kd.local_linear_trend(*(a.params[p][i] for p in ("level_var", "slope_var", "obs_var")))
        ll = kd.filter(z[:, i], **m._asdict()).loglik
        assert abs(ll - a.loglik[i]) < 1e-10 * abs(ll)


def test_boundary_zero_slope_variance():
    """A trend without slope noise: slope_var's estimate sits on its bound 0, reported so."""
    rng = np.random.default_rng(5)
    T = 400
    z = (np.cumsum(0.3 + rng.normal(size=(T, 2)), 0) + rng.normal(size=(T, 2)))[..., None]
    res = kd.fit(z, kd.local_linear_trend)
    assert res.converged.all()
    assert res.at_boundary["slope_var"].all() and (res.params["slope_var"] == 0).all()
    assert not res.at_boundary["level_var"].any()


def _statsmodels_bse(y, trend, params):
    """statsmodels' observed-information standard errors (``cov_type="approx"``, the inverse of
    its numerical Hessian) of UnobservedComponents(y, trend) at ``params``."""
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    mod = sm.UnobservedComponents(y, trend, use_exact_diffuse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mod.smooth(np.asarray(params, dtype=float), cov_type="approx").bse


def test_stderr_matches_statsmodels_observed_information():
    """US real disposable income (macrodata, 100 log), every variance interior: the standard
    errors equal statsmodels' at the same estimate to 1e-4 (1.3e-6 measured; the stencil
    Hessian of the optimizer, h = 1e-3 in log variance)."""
    pytest.importorskip("statsmodels")
    from statsmodels.datasets import macrodata

    y = 100 * np.log(macrodata.load_pandas().data["realdpi"].to_numpy())
    res = kd.fit(y[:, None], kd.local_linear_trend)
    assert res.converged and res.stderr_note == ""
    names = ("obs_var", "level_var", "slope_var")  # statsmodels' order
    assert not any(bool(res.at_boundary[p]) for p in names)
    want = _statsmodels_bse(y, "local linear trend", [res.params[p] for p in names])
    got = np.array([res.stderr[p] for p in names], dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_stderr_with_a_variance_on_its_boundary():
    """Nile: slope_var's estimate is 0 (no standard error, a note says so); level_var's and
    obs_var's are those with the slope variance held at 0, i.e. statsmodels' for the local linear
    deterministic trend at the same estimate (2e-7 measured)."""
    pytest.importorskip("statsmodels")
    from statsmodels.datasets import nile

    y = nile.load_pandas().data["volume"].to_numpy()
    res = kd.fit(y[:, None], kd.local_linear_trend)
    assert res.converged and bool(res.at_boundary["slope_var"])
    assert np.isnan(res.stderr["slope_var"]) and "slope_var" in str(res.stderr_note)
    names = ("obs_var", "level_var")
    want = _statsmodels_bse(y, "local linear deterministic trend", [res.params[p] for p in names])
    got = np.array([res.stderr[p] for p in names], dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_stderr_nan_where_the_fit_did_not_converge():
    z = llt_series(4, 200, 2)
    res = kd.fit(z, kd.local_linear_trend, max_iter=1)
    bad = ~res.converged
    assert bad.any()
    for p in res.stderr:
        assert np.isnan(res.stderr[p][bad]).all()
    assert all(n == "the fit did not converge" for n in res.stderr_note[bad])


def test_layout_axis_and_init():
    z = llt_series(4, 150, 3)
    a = kd.fit(z, kd.local_linear_trend)
    b = kd.fit(np.swapaxes(z, 0, 1), kd.local_linear_trend, axis=1)
    c = kd.fit(z, kd.local_linear_trend, init={p: v for p, v in a.params.items()})
    for p in a.params:
        assert a.params[p].shape == (3,)
        np.testing.assert_allclose(a.params[p], b.params[p], rtol=1e-12)
        np.testing.assert_allclose(c.params[p], a.params[p], rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(build=lambda theta, obs_var: kd.ou_sum([theta], [1.0], 1.0, obs_var)), "F changes"),
        (dict(build=kd.local_linear_trend, fixed=dict(nope=1.0)), "fixed"),
        (dict(build=kd.constant_velocity), "F changes with 'dt'"),
        (dict(build=lambda a, b, c, d, e: kd.local_linear_trend(a, b, c)), "1 to 4 free"),
        (dict(build=kd.local_linear_trend, init=dict(dt=1.0)), "init"),
        (dict(build=kd.local_linear_trend, init=dict(obs_var=-1.0)), "init"),
        (dict(build=kd.local_linear_trend, backend="cuda"), "backend"),
        (dict(build=kd.local_linear_trend, max_iter=0), "max_iter"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    z = llt_series(6, 30, 1)
    with pytest.raises((ValueError, TypeError), match=match):
        kd.fit(z, **kwargs)
