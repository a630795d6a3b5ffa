"""OU / local-level models on timestamps, fit_ou and forecasting (kalmanscan.timeseries).

Truths: the published Nile figures (Durbin & Koopman 2012 ch. 2; exact-diffuse values recomputed in
/work/shared/background/peer-toolkits.md §4(a)), statsmodels' exact-diffuse Hessian, and a dense
joint-Gaussian likelihood of the OU process sampled at irregular times.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.testing import assert_close, tolerance
from kalmanscan.timeseries import OUModel, as_time_axis, fit_ou, forecast, load_nile

# The acceptance bound for the Nile MLE variances (the likelihood is flat there).
NILE_PARAM_RTOL = 5e-3
# Our fit against the exact-diffuse MLE recomputed to tight tolerance (15098.5, 1469.18): those
# figures are quoted to 6 significant digits.
NILE_EXACT_MLE_RTOL = 5e-5
# Optimizer agreement between two maximizations of the same likelihood (Newton-polished).
FIT_AGREEMENT_RTOL = tolerance("fit", "float64")
FIT_LOGLIK_ATOL = tolerance("fit_loglik", "float64")

DK = dict(theta=0.0, mu=0.0, sigma2=1469.1, obs_var=15099.0)


@pytest.fixture(scope="module")
def nile():
    return load_nile()


@pytest.fixture(scope="module")
def nile_fit(nile):
    years, flow = nile
    return fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})


# --- the Nile acceptance figures ------------------------------------------------------------------
def test_nile_fit_recovers_published_mle(nile_fit):
    p = nile_fit.params
    assert abs(p["obs_var"] / 15099.0 - 1) < NILE_PARAM_RTOL
    assert abs(p["sigma2"] / 1469.1 - 1) < NILE_PARAM_RTOL
    assert abs(p["obs_var"] / 15098.5 - 1) < NILE_EXACT_MLE_RTOL
    assert abs(p["sigma2"] / 1469.18 - 1) < NILE_EXACT_MLE_RTOL
    assert p["theta"] == 0.0 and p["mu"] == 0.0
    assert nile_fit.converged
    # published optimum -632.5456 (KFAS) / -632.545625 (recomputed); the optimum is at least as high
    assert abs(nile_fit.loglik - (-632.545625)) < 5e-6


def test_nile_loglik_at_published_params(nile):
    years, flow = nile
    ll = OUModel(**DK).loglik(flow, years)
    assert_close(ll, -632.545625, "published", "float64", what="Nile exact-diffuse loglik")


# year, filtered mean, filtered var, smoothed mean, smoothed var (peer-toolkits §4(a))
NILE_STATES = [
    (1871, 1120.0000, 15099.0000, 1111.6683, 4032.1579),
    (1872, 1140.9278, 7899.7364, 1110.8577, 3242.9301),
    (1898, 1133.1263, 4032.1582, 999.5852, 2326.7570),
    (1899, 1037.2223, 4032.1581, 950.9301, 2326.7569),
    (1970, 798.3703, 4032.1579, 798.3703, 4032.1579),
]


@pytest.mark.parametrize("row", NILE_STATES, ids=[f"Y{r[0]}" for r in NILE_STATES])
def test_nile_filtered_and_smoothed_states(nile, row):
    years, flow = nile
    year, fm, fv, sm, sv = row
    i = int(np.flatnonzero(years == year)[0])
    res = OUModel(**DK).smooth(flow, years)
    assert_close(res.filtered.mean[i], fm, "published", "float64", what=f"filtered mean {year}")
    assert_close(res.filtered.var[i], fv, "published", "float64", what=f"filtered var {year}")
    assert_close(res.mean[i], sm, "published", "float64", what=f"smoothed mean {year}")
    assert_close(res.var[i], sv, "published", "float64", what=f"smoothed var {year}")


def test_nile_one_step_forecast_1971(nile):
    years, flow = nile
    fc = forecast(OUModel(**DK), flow, years, steps=1, coverage=0.9)
    assert fc.times.tolist() == [1971.0]
    assert_close(fc.mean[0], 798.3703, "published", "float64", what="1971 forecast")
    assert_close(
        math.sqrt(fc.predictive_var[0]), 143.5279, "published", "float64", what="1971 s.e."
    )
    assert abs(fc.lower[0] - 562.29) < 0.006 and abs(fc.upper[0] - 1034.45) < 0.006
    assert_close(fc.var[0], 5501.2579, "published", "float64", what="predicted state variance")


def test_nile_missing_observations_variant(nile):
    years, flow = nile
    z = flow.copy()
    z[20:40] = np.nan  # 1891-1910
    z[60:80] = np.nan  # 1931-1950
    sm = OUModel(**DK).smooth(z, years)
    f = sm.filtered
    assert_close(f.loglik, -380.5871, "published", "float64", what="loglik with gaps")
    assert_close(
        f.mean[20:40], np.full(20, 1026.1416), "published", "float64", what="frozen level in gap"
    )
    assert_close(f.var[39], 33414.20, "published", "float64", what="variance at the end of the gap")
    assert_close(sm.mean[29], 903.4211, "published", "float64", what="smoothed 1900")
    assert_close(sm.var[29], 9715.006, "published", "float64", what="smoothed var 1900")
    assert_close(sm.mean[69], 837.1773, "published", "float64", what="smoothed 1940")


def test_nile_standard_errors_match_statsmodels_exact_diffuse(nile, nile_fit):
    sm = pytest.importorskip("statsmodels.api")
    years, flow = nile
    p = nile_fit.params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = sm.tsa.UnobservedComponents(flow, "llevel", use_exact_diffuse=True)
        res = mod.smooth([p["obs_var"], p["sigma2"]], cov_type="approx")
    # statsmodels differentiates its likelihood numerically; agreement to ~1e-6 is what that allows
    np.testing.assert_allclose(
        [nile_fit.stderr["obs_var"], nile_fit.stderr["sigma2"]],
        res.bse,
        rtol=tolerance("stderr", "float64"),
    )
    assert math.isnan(nile_fit.stderr["theta"]) and math.isnan(nile_fit.stderr["mu"])


def test_top_level_exports():
    assert ks.fit_ou is fit_ou and ks.forecast is forecast and ks.OUModel is OUModel
    assert ks.OUFit.__name__ == "OUFit"


# --- the OU likelihood on irregular timestamps against a dense joint Gaussian ---------------------
def dense_ou_loglik(z, t, theta, sigma2, mu, obs_var):
    """log N(z_obs; mu, K + obs_var I) with K_ij = sigma2/(2 theta) exp(-theta |t_i - t_j|)."""
    from scipy.stats import multivariate_normal

    obs = ~np.isnan(z)
    tt = t[obs]
    K = sigma2 / (2 * theta) * np.exp(
        -theta * np.abs(tt[:, None] - tt[None, :])
    ) + obs_var * np.eye(tt.size)
    return multivariate_normal(np.full(tt.size, mu), K).logpdf(z[obs])


@pytest.mark.parametrize("T", [1, 2, 63, 200], ids=lambda T: f"T{T}")
def test_ou_loglik_irregular_matches_dense_gaussian(T, rng):
    t = np.cumsum(rng.exponential(0.7, T)) + 3.0
    t[T // 2 :] += 0.0 if T < 4 else 5.0  # one long gap
    if T > 3:
        t[3] = t[2]  # two observations at the same time
    m = OUModel(theta=0.4, sigma2=1.3, mu=-2.0, obs_var=0.25)
    _, z = m.simulate(t, seed=int(rng.integers(1 << 30)))
    if T > 5:
        z[rng.random(T) < 0.2] = np.nan
        z[0] = 0.3
    ll = m.loglik(z, t)
    assert_close(
        ll, dense_ou_loglik(z, t, 0.4, 1.3, -2.0, 0.25), "truth", "float64", what="OU loglik"
    )


def test_smoothed_moments_match_dense_gaussian_conditioning(rng):
    T = 40
    t = np.sort(rng.uniform(0, 30, T))
    m = OUModel(theta=0.3, sigma2=0.8, mu=1.0, obs_var=0.2)
    _, z = m.simulate(t, seed=3)
    z[10:18] = np.nan
    sm = m.smooth(z, t)
    K = 0.8 / 0.6 * np.exp(-0.3 * np.abs(t[:, None] - t[None, :]))
    o = ~np.isnan(z)
    S = K[np.ix_(o, o)] + 0.2 * np.eye(o.sum())
    G = K[:, o] @ np.linalg.inv(S)
    mean = 1.0 + G @ (z[o] - 1.0)
    var = np.diag(K - G @ K[o, :])
    assert_close(sm.mean, mean, "truth", "float64", what="smoothed mean")
    assert_close(sm.var, var, "truth", "float64", what="smoothed var")


# --- time axes ------------------------------------------------------------------------------------
def test_datetime_times_equal_numeric_days():
    pd = pytest.importorskip("pandas")
    days = np.array([0.0, 0.5, 2.0, 2.25, 7.0, 7.5])
    stamps = pd.Timestamp("2024-03-01") + pd.to_timedelta(days, unit="D")
    z = np.array([1.0, 1.2, np.nan, 0.7, 1.9, 2.1])
    m = OUModel(theta=0.3, sigma2=0.5, mu=1.0, obs_var=0.1)
    a = m.filter(z, days)
    b = m.filter(z, pd.DatetimeIndex(stamps))
    c = m.filter(z, np.asarray(stamps, dtype="datetime64[ns]"))
    for other in (b, c):
        assert_close(other.mean, a.mean, "truth", "float64")
        assert_close(other.loglik, a.loglik, "truth", "float64")
    # the same process with rates per 12 hours
    half = OUModel(theta=0.15, sigma2=0.25, mu=1.0, obs_var=0.1, time_unit="12h").filter(z, stamps)
    assert_close(half.var, a.var, "truth", "float64")
    # pandas Series: the index is the time axis
    s = pd.Series(z, index=stamps)
    assert_close(m.filter(s).mean, a.mean, "truth", "float64")


def test_time_axis_checks():
    with pytest.raises(ValueError, match="times: expected non-decreasing"):
        as_time_axis(np.array([0.0, 2.0, 1.0]), 3)
    with pytest.raises(ValueError, match="times: expected 3 timestamps"):
        as_time_axis(np.arange(4.0), 3)
    with pytest.raises(ValueError, match="NaT"):
        as_time_axis(np.array(["2024-01-01", "NaT"], dtype="datetime64[ns]"), 2)
    with pytest.raises(ValueError, match="finite"):
        as_time_axis(np.array([0.0, np.nan]), 2)
    with pytest.raises(ValueError, match="time_unit"):
        as_time_axis(np.arange(3.0), 3, time_unit="1D")
    with pytest.raises(ValueError, match="time_unit"):
        as_time_axis(np.array(["2024-01-01"], dtype="datetime64[D]"), 1, time_unit="soon")


def test_model_argument_checks():
    with pytest.raises(ValueError, match="theta: expected values >= 0"):
        OUModel(theta=-1.0)
    with pytest.raises(ValueError, match="obs_var: expected values > 0"):
        OUModel(obs_var=0.0)
    with pytest.raises(TypeError, match="sigma2"):
        OUModel(sigma2="big")
    m = OUModel(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match="z: expected finite values or NaN"):
        m.filter(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="steps, at: give exactly one"):
        m.forecast(np.ones(3))
    with pytest.raises(ValueError, match="at: expected timestamps at or after"):
        m.forecast(np.ones(3), at=[1.0])
    with pytest.raises(ValueError, match="steps: expected a positive integer"):
        m.forecast(np.ones(3), steps=0)


# --- filtering several series, dtypes, awkward lengths --------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("T", [1, 63, 1000], ids=lambda T: f"T{T}")
def test_several_series_equal_one_at_a_time(T, dtype, rng):
    t = np.cumsum(rng.uniform(0.1, 2.0, T))
    theta = np.array([0.0, 0.5, 2.0])
    m = OUModel(
        theta=theta, sigma2=np.array([1.0, 0.3, 4.0]), mu=np.array([0.0, 5.0, -1.0]), obs_var=0.5
    )
    _, z = m.simulate(t, seed=1)
    z[rng.random(z.shape) < 0.15] = np.nan
    res = m.filter(z.astype(dtype), t)
    assert res.mean.dtype == dtype and res.mean.shape == (T, 3)
    kind = "parallel" if dtype == np.float64 else "truth"
    for s in range(3):
        one = OUModel(
            theta=theta[s], sigma2=[1.0, 0.3, 4.0][s], mu=[0.0, 5.0, -1.0][s], obs_var=0.5
        ).filter(z[:, s], t)
        known = np.isfinite(one.var)
        assert_close(
            res.var[known, s], one.var[known], kind, np.dtype(dtype).name, what=f"series {s} var"
        )
        assert_close(
            res.mean[known, s],
            one.mean[known],
            kind,
            np.dtype(dtype).name,
            what=f"series {s} mean",
            scale=np.nanstd(z[:, s]) + 1,
        )
    # time on another axis gives the same numbers
    res_t = m.filter(z.T, t, axis=1)
    np.testing.assert_array_equal(
        res_t.mean, res.mean.T.astype(np.float64) if dtype == np.float64 else res_t.mean
    )


def test_forecast_at_arbitrary_future_datetimes():
    pd = pytest.importorskip("pandas")
    stamps = pd.date_range("2024-01-01", periods=5, freq="D")
    z = np.array([1.0, 1.5, 1.2, np.nan, 1.4])
    m = OUModel(theta=0.5, sigma2=0.4, mu=1.0, obs_var=0.2)
    res = m.filter(z, stamps)
    at = np.array(
        ["2024-01-05T00:00", "2024-01-06T12:00", "2024-01-10T00:00"], dtype="datetime64[ns]"
    )
    fc = m.forecast(z, stamps, at=at, coverage=0.8)
    dt = np.array([0.0, 1.5, 5.0])
    a = np.exp(-0.5 * dt)
    mean = 1.0 + a * (res.mean[-1] - 1.0)
    var = a * a * res.var[-1] + 0.4 / 1.0 * (1 - a * a)
    assert_close(fc.mean, mean, "truth", "float64")
    assert_close(fc.var, var, "truth", "float64")
    assert_close(fc.predictive_var, var + 0.2, "truth", "float64")
    q = 1.2815515655446004  # 80 % central interval
    assert_close(fc.upper, mean + q * np.sqrt(var + 0.2), "truth", "float64")
    assert fc.times.dtype == np.dtype("datetime64[ns]")
    # steps: spaced by the median step (one day) after the last timestamp
    assert m.forecast(z, stamps, steps=2).times[0] == np.datetime64("2024-01-06")


# --- fitting --------------------------------------------------------------------------------------
def test_fit_recovers_simulated_ou_parameters():
    t = np.cumsum(np.random.default_rng(5).exponential(1.0, 1000))
    true = dict(theta=0.2, sigma2=0.5, mu=3.0, obs_var=0.3)
    _, z = OUModel(**true).simulate(t, shape=(3,), seed=11)
    fit = fit_ou(z, t)
    assert np.all(fit.converged)
    for k, v in true.items():
        est, se = np.asarray(fit.params[k]), np.asarray(fit.stderr[k])
        assert np.all(np.isfinite(se)) and np.all(se > 0)
        assert np.all(np.abs(est - v) < 4 * se), (k, est, se)


def test_fit_maximizes_the_dense_likelihood(rng):
    scipy_opt = pytest.importorskip("scipy.optimize")
    t = np.sort(rng.uniform(0, 60, 63))
    _, z = OUModel(theta=0.5, sigma2=1.0, mu=0.0, obs_var=0.2).simulate(t, seed=4)
    z[20:30] = np.nan
    fit = fit_ou(z, t)

    def nll(u):
        th, s2, mu, ov = np.exp(u[0]), np.exp(u[1]), u[2], np.exp(u[3])
        return -dense_ou_loglik(z, t, th, s2, mu, ov)

    p = fit.params
    u0 = np.array([np.log(p["theta"]), np.log(p["sigma2"]), p["mu"], np.log(p["obs_var"])])
    best = scipy_opt.minimize(
        nll, u0 + 0.05, method="Nelder-Mead", options=dict(xatol=1e-9, fatol=1e-12, maxiter=20000)
    )
    assert fit.loglik >= -best.fun - FIT_LOGLIK_ATOL  # no better point nearby
    dense = dense_ou_loglik(z, t, p["theta"], p["sigma2"], p["mu"], p["obs_var"])
    assert_close(fit.loglik, dense, "rounding", "float64", what="loglik against the dense one")


def test_separate_fits_equal_single_series_fits(nile):
    years, flow = nile
    rng = np.random.default_rng(2)
    z = np.stack([flow, flow[::-1] * 0.5, flow + rng.normal(0, 50, 100)], 1)
    z[rng.random(z.shape) < 0.1] = np.nan
    fix = {"theta": 0.0, "mu": 0.0}
    many = fit_ou(z, years, fix=fix)
    for s in range(3):
        one = fit_ou(z[:, s], years, fix=fix)
        for k in ("sigma2", "obs_var"):
            assert abs(many.params[k][s] / one.params[k] - 1) < FIT_AGREEMENT_RTOL
        assert abs(many.loglik[s] - one.loglik) <= FIT_LOGLIK_ATOL


def test_joint_fit_of_duplicated_series_equals_single_fit(nile, nile_fit):
    years, flow = nile
    joint = fit_ou(np.stack([flow, flow], 1), years, fix={"theta": 0.0, "mu": 0.0}, joint=True)
    assert isinstance(joint.params["sigma2"], float)
    for k in ("sigma2", "obs_var"):
        assert abs(joint.params[k] / nile_fit.params[k] - 1) < FIT_AGREEMENT_RTOL
    assert abs(joint.total_loglik - 2 * nile_fit.loglik) <= FIT_LOGLIK_ATOL
    # twice the information: standard errors shrink by sqrt(2)
    se_ratio = joint.stderr["obs_var"] * math.sqrt(2) / nile_fit.stderr["obs_var"]
    assert abs(se_ratio - 1) <= tolerance("stderr", "float64")


def test_fit_argument_checks(nile):
    years, flow = nile
    with pytest.raises(ValueError, match="fix: expected keys among"):
        fit_ou(flow, fix={"rate": 1.0})
    with pytest.raises(ValueError, match="every parameter is fixed"):
        fit_ou(flow, fix=dict(theta=0.0, sigma2=1.0, mu=0.0, obs_var=1.0))
    with pytest.raises(ValueError, match="fix\\['obs_var'\\]: expected values > 0"):
        fit_ou(flow, fix={"obs_var": -1.0})
    with pytest.raises(ValueError, match="at least 2 observed values"):
        fit_ou(np.array([1.0, np.nan, np.nan]))
    with pytest.raises(TypeError, match="fix: expected a dict"):
        fit_ou(flow, fix=[("theta", 0.0)])


def test_fit_forecast_and_smooth_from_fit(nile_fit):
    fc = nile_fit.forecast(10, coverage=0.9)
    assert fc.times.tolist() == list(np.arange(1971.0, 1981.0))
    assert np.all(np.diff(fc.predictive_var) > 0)  # random walk: uncertainty grows linearly
    assert_close(np.diff(fc.var), np.full(9, nile_fit.params["sigma2"]), "truth", "float64")
    sm = nile_fit.smooth()
    assert sm.mean.shape == (100,)
    assert "sigma2" in nile_fit.summary() and "-632.5456" in nile_fit.summary()


def test_fit_on_torch_device_argument_and_float32_input(nile):
    years, flow = nile
    fit = fit_ou(flow.astype(np.float32), years, fix={"theta": 0.0, "mu": 0.0}, device="cpu")
    assert abs(fit.params["obs_var"] / 15098.5 - 1) < NILE_EXACT_MLE_RTOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_on_cuda_matches_cpu(nile, nile_fit):
    years, flow = nile
    fit = fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}, device="cuda")
    for k in ("sigma2", "obs_var"):
        assert abs(fit.params[k] / nile_fit.params[k] - 1) < FIT_AGREEMENT_RTOL


def test_fit_at_the_boundary_reports_no_standard_error_for_that_parameter():
    # a pure random walk observed without noise: the obs_var estimate runs to 0
    z = np.random.default_rng(1).normal(size=40).cumsum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_ou(z, fix={"theta": 0.0, "mu": 0.0})
    assert 0 < fit.params["obs_var"] < 1e-3 * np.var(np.diff(z))
    # none for obs_var; sigma2's with obs_var held at 0: mean(d**2) sqrt(2/m), m increments
    assert math.isnan(fit.stderr["obs_var"])
    d = np.diff(z)
    closed = np.mean(d * d) * math.sqrt(2 / d.size)
    assert abs(fit.stderr["sigma2"] / closed - 1) <= tolerance("stderr", "float64")
    assert abs(fit.params["sigma2"] / np.mean(np.diff(z) ** 2) - 1) < 0.05
