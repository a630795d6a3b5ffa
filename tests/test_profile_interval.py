"""``OUFit.profile_interval``: two-sided profile-likelihood intervals, ``{v : 2 (l_hat - l_p(v))
<= chi2_1(coverage)}`` with ``l_p`` the log-likelihood maximized over the other free parameters.

Checked against an independent profile (scipy.optimize on ``OUModel.loglik``) on the Nile, by
simulation (coverage of the Nile-like local level's ``sigma2``, where ``estimate +/- 1.96 se``
covers ~86%), on estimates on their bound (the 90% interval's upper end is the one-sided 95%
``upper_bound``), on joint fits, on white noise and on bad arguments."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from scipy import optimize

import kalmanscan as ks
from kalmanscan.timeseries import OUModel, load_nile
from kalmanscan.timeseries.profile import drop_for, two_sided_drop

LOCAL_LEVEL = {"theta": 0.0, "mu": 0.0}
TARGET = two_sided_drop(0.95)  # 1.9207: chi2_1(0.95) / 2
DROP_TOL = 2e-3  # the search's 1e-3 in the drop, and the reference optimizer's own error
YEARS, FLOW = load_nile()


def _fit(z, times=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(z, times, **kw)


def _loglik(z, params) -> float:
    """The total log-likelihood of ``z`` (one series, or several sharing ``params``) at unit
    steps (the Nile's years)."""
    return float(np.sum(OUModel(**params).loglik(z)))


def _profile_drop(fit, z, name, value) -> float:
    """The drop ``l_hat - l_p(value)`` of ``name``, maximizing over the other free parameters
    with scipy (from the fit's estimates), the likelihood from ``OUModel.loglik``."""
    free = [p for p in ("theta", "sigma2", "mu", "obs_var") if p not in fit.fixed]
    others = [p for p in free if p != name]

    def params(u):
        out = dict(fit.fixed, **{name: value})
        for p, x in zip(others, u, strict=True):
            out[p] = x if p == "mu" else math.exp(x)
        return out

    def f(u):
        return -_loglik(z, params(u))

    x0 = np.array([fit.params[p] if p == "mu" else math.log(fit.params[p]) for p in others])
    if len(others) == 1:
        res = optimize.minimize_scalar(lambda x: f([x]), bracket=(x0[0] - 1, x0[0] + 1), tol=1e-12)
        best = res.fun
    else:
        res = optimize.minimize(f, x0, method="BFGS", options={"gtol": 1e-6})
        res = optimize.minimize(f, res.x, method="BFGS", options={"gtol": 1e-6})  # (restarted)
        best = res.fun
    return float(np.sum(fit.loglik)) + best


# (a) against an independent profile


@pytest.mark.parametrize("fix", [LOCAL_LEVEL, None], ids=["local-level", "ou"])
def test_nile_ends_are_where_an_independent_profile_drops_1921(fix):
    fit = _fit(FLOW, YEARS, fix=fix)
    ivs = fit.profile_interval()
    assert list(ivs) == [p for p in ("theta", "sigma2", "mu", "obs_var") if p not in fit.fixed]
    for name, (lo, hi) in ivs.items():
        assert isinstance(lo, float) and isinstance(hi, float)
        est = fit.params[name]
        assert 0 < lo < est < hi < math.inf
        for end in (lo, hi):
            d = _profile_drop(fit, FLOW, name, end)
            assert d == pytest.approx(TARGET, abs=DROP_TOL), (name, end, d)
    # halfway to either end the profile is within the drop: the ends are the first crossings
    for end in ivs["sigma2"]:
        mid = 0.5 * (fit.params["sigma2"] + end)
        assert _profile_drop(fit, FLOW, "sigma2", mid) < TARGET - 0.1
    if fix == LOCAL_LEVEL:  # the figures docs/model.md quotes
        assert round(ivs["sigma2"][0]) == 252 and round(ivs["sigma2"][1]) == 5985
        # asymmetric about the estimate, unlike estimate +/- 1.96 se (whose lower end is < 0)
        assert fit.params["sigma2"] - 1.96 * fit.stderr["sigma2"] < 0


def test_coverage_argument_moves_the_ends():
    fit = _fit(FLOW, YEARS, fix=LOCAL_LEVEL)
    lo90, hi90 = fit.profile_interval("sigma2", coverage=0.9)["sigma2"]
    lo99, hi99 = fit.profile_interval(["sigma2"], coverage=0.99)["sigma2"]
    lo95, hi95 = fit.profile_interval()["sigma2"]
    assert lo99 < lo95 < lo90 < fit.params["sigma2"] < hi90 < hi95 < hi99
    d = _profile_drop(fit, FLOW, "sigma2", hi99)
    assert d == pytest.approx(two_sided_drop(0.99), abs=DROP_TOL)


# (b) coverage by simulation


def _nile_like(n, m, seed):
    """``m`` local-level series of ``n`` steps with the Nile's variances (D&K 2012, ch. 2)."""
    rng = np.random.default_rng(seed)
    level = 1120.0 + np.cumsum(rng.normal(0.0, math.sqrt(1469.1), (n, m)), 0)
    return level + rng.normal(0.0, math.sqrt(15099.0), (n, m))


def _coverages(n, m, seed):
    z = _nile_like(n, m, seed)
    fit = _fit(z, fix=LOCAL_LEVEL)
    assert fit.converged.all()
    lo, hi = fit.profile_interval("sigma2")["sigma2"]
    assert lo.shape == hi.shape == (m,)
    assert not (np.isnan(lo) | np.isnan(hi)).any() and (lo >= 0).all()
    est, se = fit.params["sigma2"], fit.stderr["sigma2"]
    profile = np.mean((lo <= 1469.1) & (1469.1 <= hi))
    wald = np.mean((est - 1.96 * se <= 1469.1) & (1469.1 <= est + 1.96 * se))
    return profile, wald, np.mean(est - 1.96 * se < 0)


def test_profile_interval_covers_the_nile_like_sigma2():
    """300 series of 100 steps: the profile interval covers sigma2 ~95% (0.943 here; standard
    error 0.013), where Wald's interval covers ~86% and goes below 0 in two thirds of fits."""
    profile, wald, negative = _coverages(100, 300, seed=1)
    assert 0.92 <= profile <= 0.975
    assert wald <= 0.90 and profile - wald >= 0.05
    assert negative > 0.5


@pytest.mark.slow
def test_profile_interval_covers_the_nile_like_sigma2_3000_series():
    profile, wald, _ = _coverages(100, 3000, seed=2)
    assert 0.935 <= profile <= 0.96  # (standard error 0.004)
    assert wald <= 0.88


# (c) estimates on their bound


def _noise_free_walk():
    """A random walk observed without noise whose obs_var estimate is on its bound 0."""
    z = np.cumsum(np.random.default_rng(0).normal(size=150))
    fit = _fit(z, fix=LOCAL_LEVEL)
    assert fit.at_boundary["obs_var"]
    return z, fit


def test_bound_estimate_interval_starts_at_0_and_matches_upper_bound_at_90():
    z, fit = _noise_free_walk()
    lo, hi = fit.profile_interval("obs_var")["obs_var"]
    assert lo == 0.0 and hi > fit.upper_bound["obs_var"] > 0
    # the public fit with obs_var held at the upper end: the drop is chi2_1(0.95) / 2
    at_hi = _fit(z, fix={**LOCAL_LEVEL, "obs_var": hi})
    assert fit.loglik - at_hi.loglik == pytest.approx(TARGET, abs=1e-3)
    # the one-sided 95% bound is the two-sided 90% interval's upper end (one search routine)
    _, hi90 = fit.profile_interval("obs_var", coverage=0.9)["obs_var"]
    assert hi90 == pytest.approx(fit.upper_bound["obs_var"], rel=1e-6)
    assert two_sided_drop(0.9) == drop_for(0.95)
    # sigma2, interior, gets an ordinary interval
    s_lo, s_hi = fit.profile_interval("sigma2")["sigma2"]
    assert 0 < s_lo < fit.params["sigma2"] < s_hi < math.inf


def test_co2_obs_var_on_its_bound():
    sm = pytest.importorskip("statsmodels.api")
    co2 = sm.datasets.co2.load_pandas().data["co2"].to_numpy()
    fit = _fit(co2, fix=LOCAL_LEVEL)
    assert fit.at_boundary["obs_var"]
    ivs = fit.profile_interval()
    assert ivs["obs_var"][0] == 0.0
    assert ivs["obs_var"][1] == pytest.approx(0.002256, rel=1e-3)
    assert ivs["sigma2"][0] < fit.params["sigma2"] < ivs["sigma2"][1]
    assert fit.profile_interval(coverage=0.9)["obs_var"][1] == pytest.approx(
        fit.upper_bound["obs_var"], rel=1e-6
    )


# (d) joint fits


def test_joint_fit_intervals_match_the_summed_profile():
    z = _nile_like(80, 3, seed=7)
    fit = _fit(z, fix=LOCAL_LEVEL, joint=True)
    ivs = fit.profile_interval()
    for name, (lo, hi) in ivs.items():
        assert isinstance(lo, float) and isinstance(hi, float)
        assert 0 < lo < fit.params[name] < hi
        for end in (lo, hi):
            d = _profile_drop(fit, z, name, end)
            assert d == pytest.approx(TARGET, abs=DROP_TOL), (name, end, d)


def test_separate_fits_give_arrays_over_the_series_shape_and_each_its_own_interval():
    z = _nile_like(100, 6, seed=3).reshape(100, 2, 3)
    fit = _fit(z, fix=LOCAL_LEVEL)
    ivs = fit.profile_interval()
    one = _fit(z[:, 1, 2], fix=LOCAL_LEVEL).profile_interval()
    for name, (lo, hi) in ivs.items():
        assert lo.shape == hi.shape == (2, 3)
        assert lo[1, 2] == pytest.approx(one[name][0], rel=1e-6)
        assert hi[1, 2] == pytest.approx(one[name][1], rel=1e-6)


# white noise, parameters the likelihood does not depend on, fits without a state


def test_white_noise_gets_theta_and_sigma2_unbounded():
    z = np.random.default_rng(1).normal(size=(500, 40)) * 3.0 + 7.0
    fit = _fit(z)
    white = fit.model.sigma2 < 1e-10 * z.var(0)
    assert white.sum() >= 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NaN (and so no warning) for these series
        ivs = fit.profile_interval()
    for name in ("theta", "sigma2"):
        lo, hi = ivs[name]
        assert (lo[white] == 0).all() and np.isinf(hi[white]).all()
    lo, hi = ivs["obs_var"]
    assert (lo[white] == 0).all()
    assert (fit.model.obs_var[white] < hi[white]).all() and np.isfinite(hi[white]).all()
    lo, hi = ivs["mu"]
    mean, sd = z.mean(0)[white], z.std(0)[white] / math.sqrt(500)
    np.testing.assert_allclose(lo[white], mean - 1.96 * sd, rtol=2e-3)
    np.testing.assert_allclose(hi[white], mean + 1.96 * sd, rtol=2e-3)


def test_mu_of_a_random_walk_is_unbounded():
    fit = _fit(FLOW, YEARS, fix={"theta": 0.0})
    assert fit.profile_interval("mu")["mu"] == (-math.inf, math.inf)


def test_a_fit_that_did_not_converge_gives_nan_and_says_why():
    fit = _fit(FLOW, YEARS, max_iter=1)
    assert not fit.converged
    with pytest.warns(UserWarning, match="no interval for sigma2 .*the fit did not converge"):
        lo, hi = fit.profile_interval("sigma2")["sigma2"]
    assert math.isnan(lo) and math.isnan(hi)


def test_a_fit_assembled_without_its_state_is_refitted():
    fit = _fit(FLOW, YEARS, fix=LOCAL_LEVEL)
    bare = dataclasses.replace(fit, _profile_state=None)
    a, b = fit.profile_interval(), bare.profile_interval()
    for name in a:
        assert b[name] == pytest.approx(a[name], rel=1e-6)


# (e) bad arguments


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        ({"params": "theta"}, ValueError, r"params: expected free .*'theta', which is fixed"),
        ({"params": "sigma"}, ValueError, r"params: expected free .*'sigma', which is no"),
        ({"params": ["sigma2", "obs"]}, ValueError, r"params: .*'obs'"),
        ({"params": []}, ValueError, r"params: expected at least one name"),
        ({"params": 3}, TypeError, r"params: expected None, a parameter name or a list .* got 3"),
        ({"params": ["sigma2", 1]}, TypeError, r"params: expected None"),
        ({"coverage": 1.0}, ValueError, r"coverage: expected a number strictly between 0 and 1"),
        ({"coverage": 0}, ValueError, r"coverage: .* got 0"),
        ({"coverage": -0.5}, ValueError, r"coverage: .* got -0\.5"),
        ({"coverage": float("nan")}, ValueError, r"coverage: .* got nan"),
        ({"coverage": True}, TypeError, r"coverage: expected a number between 0 and 1, got True"),
        ({"coverage": "0.95"}, TypeError, r"coverage: expected a number .* got '0\.95'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_them(kw, err, match):
    fit = _fit(FLOW, YEARS, fix=LOCAL_LEVEL)
    with pytest.raises(err, match=match):
        fit.profile_interval(**kw)
