"""``kd.fit`` with a variance held fixed at a nonzero value, and on series without an estimate.

A fixed nonzero variance is a constant term of ``Q`` or ``R`` (``Q = Q0 + sum_j x_j Q_j``): the
estimates are checked against a direct maximization of ``kd.filter``'s log-likelihood
(Nelder–Mead from a start of its own) and against statsmodels' ``fit_constrained``, whose own
log-likelihood at kalmanscan's estimates is at least its optimum. A series the model without
noise reproduces exactly (a constant one, an exact line) has an unbounded likelihood, checked on
``kd.filter`` itself, and gets no estimate: NaN, not converged, a message and a warning saying
why, as ``fit_ou``; a series of too few observations likewise; the other series of the batch
are fitted as alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan.dense as kd

sm = pytest.importorskip("statsmodels.api")
optimize = pytest.importorskip("scipy.optimize")


@pytest.fixture(scope="module")
def nile():
    return sm.datasets.nile.load_pandas().data.volume.to_numpy(float)


def _direct_max(z, build, free, x0):
    """Nelder–Mead over log-variances of ``kd.filter``'s log-likelihood: ``(x, loglik)``."""

    def nll(u):
        m = build(**dict(zip(free, np.exp(u), strict=True)))
        return -float(kd.filter(z, **m._asdict()).loglik)

    r = optimize.minimize(
        nll, np.log(x0), method="Nelder-Mead",
        options=dict(xatol=1e-10, fatol=1e-12, maxiter=4000),
    )  # fmt: skip
    return np.exp(r.x), -r.fun


def test_fixed_nonzero_obs_var_is_the_profile_maximum(nile):
    z = nile[:, None]
    res = kd.fit(z, kd.local_linear_trend, fixed={"obs_var": 15000.0})
    assert bool(res.converged), res.message
    assert sorted(res.params) == ["level_var", "slope_var"]
    lv, sv = float(res.params["level_var"]), float(res.params["slope_var"])
    assert bool(res.at_boundary["slope_var"]) and sv == 0.0
    # the log-likelihood reported is kd.filter's at the estimate, the fixed value included
    m = kd.local_linear_trend(lv, sv, 15000.0)
    assert float(res.loglik) == pytest.approx(float(kd.filter(z, **m._asdict()).loglik), abs=1e-9)
    # level_var alone is interior (slope_var on its bound): a 1-d direct maximization
    x, ll = _direct_max(z, lambda level_var: kd.local_linear_trend(level_var, 0.0, 15000.0),
                        ["level_var"], [1000.0])  # fmt: skip
    assert lv == pytest.approx(x[0], rel=1e-6)
    assert float(res.loglik) >= ll - 1e-9
    # and slope_var > 0 only lowers it (the bound is the maximum)
    for v in (1e-3, 1e-1):
        m = kd.local_linear_trend(lv, v, 15000.0)
        assert float(kd.filter(z, **m._asdict()).loglik) < float(res.loglik)


def test_fixed_nonzero_state_variance_matches_direct_max_and_statsmodels(nile):
    z = nile[:, None]
    res = kd.fit(z, kd.local_linear_trend, fixed={"slope_var": 1.0})
    assert bool(res.converged), res.message
    lv, ov = float(res.params["level_var"]), float(res.params["obs_var"])
    x, ll = _direct_max(
        z, lambda level_var, obs_var: kd.local_linear_trend(level_var, 1.0, obs_var),
        ["level_var", "obs_var"], [1000.0, 10000.0],
    )  # fmt: skip
    assert lv == pytest.approx(x[0], rel=1e-5) and ov == pytest.approx(x[1], rel=1e-5)
    assert float(res.loglik) >= ll - 1e-9
    mod = sm.tsa.UnobservedComponents(nile, "local linear trend", use_exact_diffuse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = mod.fit_constrained({"sigma2.trend": 1.0}, disp=False)
    # statsmodels' optimum, in its own log-likelihood, is no higher than at our estimate
    # (its L-BFGS stops 1e-4 short here, its level_var 1.2 % off on this flat ridge)
    assert mod.loglike(np.array([ov, lv, 1.0])) >= ref.llf - 1e-9


def test_fixed_obs_var_against_statsmodels_fit_constrained(nile):
    res = kd.fit(nile[:, None], kd.local_linear_trend, fixed={"obs_var": 15000.0})
    mod = sm.tsa.UnobservedComponents(nile, "local linear trend", use_exact_diffuse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = mod.fit_constrained({"sigma2.irregular": 15000.0}, disp=False)
    lv, sv = float(res.params["level_var"]), float(res.params["slope_var"])
    assert mod.loglike(np.array([15000.0, lv, sv])) >= ref.llf - 1e-9
    assert lv == pytest.approx(ref.params[1], rel=1e-3)


def test_fixed_part_per_step_and_on_several_series():
    """A per-step Q0 (constant velocity, dt per step and accel_var fixed) and obs_var free, on
    two series at once: each equals its own 1-d direct maximization."""
    rng = np.random.default_rng(3)
    dt = rng.uniform(0.5, 1.5, size=80)
    m = kd.constant_velocity(dt, 0.2, 1.0)
    z = np.empty((80, 2, 1))
    for b in range(2):
        x = np.zeros(2)
        for t in range(80):
            x = m.F[t] @ x + rng.multivariate_normal(np.zeros(2), m.Q[t])
            z[t, b, 0] = x[0] + rng.normal(scale=1.5 + b)
    res = kd.fit(z, kd.constant_velocity, fixed={"dt": dt, "accel_var": 0.2})
    assert res.converged.all(), res.message
    for b in range(2):
        x, ll = _direct_max(z[:, b], lambda obs_var: kd.constant_velocity(dt, 0.2, obs_var),
                            ["obs_var"], [1.0])  # fmt: skip
        assert float(res.params["obs_var"][b]) == pytest.approx(x[0], rel=1e-6)
        assert float(res.loglik[b]) >= ll - 1e-9


def test_a_builder_nonlinear_in_a_free_variance_names_the_fixed_ones():
    def build(level_var, obs_var):
        return kd.local_linear_trend(level_var, 0.0, obs_var**2)

    with pytest.raises(
        ValueError, match=r"linear in the free variances \['obs_var'\].*'level_var': 3.0"
    ):
        kd.fit(np.ones((20, 1)).cumsum(0), build, fixed={"level_var": 3.0})


def test_constant_and_exact_line_series_have_no_estimate():
    T = 60
    rng = np.random.default_rng(0)
    noisy = rng.normal(size=T).cumsum() + rng.normal(size=T)
    z = np.stack([np.full(T, 900.0), 2.0 + 0.5 * np.arange(T), noisy], 1)[..., None]
    z[5, 0, 0] = np.nan
    # the likelihood of either degenerate series rises without bound as the variances go to 0
    for b in range(2):
        ll = [float(kd.filter(z[:, b], **kd.local_linear_trend(v, v, v)._asdict()).loglik)
              for v in (1e-4, 1e-8)]  # fmt: skip
        assert ll[1] - ll[0] > 100
    with pytest.warns(UserWarning) as rec:
        res = kd.fit(z, kd.local_linear_trend)
    said = sorted(str(w.message) for w in rec)
    assert len(said) == 2, said
    assert said[0].startswith("kd.fit: series 0 have no estimate (every observed value is 900.0")
    assert said[1].startswith("kd.fit: series 1 have no estimate (the model without noise")
    assert res.converged.tolist() == [False, False, True]
    assert "constant series" in res.message[0] and "grows without bound" in res.message[0]
    assert "without noise reproduces" in res.message[1]
    for p in ("level_var", "slope_var", "obs_var"):
        assert np.isnan(res.params[p][:2]).all() and np.isnan(res.stderr[p][:2]).all()
        assert not res.at_boundary[p][:2].any()
    assert np.isnan(res.loglik[:2]).all()
    alone = kd.fit(z[:, 2], kd.local_linear_trend)
    for p in alone.params:
        assert float(res.params[p][2]) == pytest.approx(float(alone.params[p]), rel=1e-8)
    assert float(res.loglik[2]) == pytest.approx(float(alone.loglik), rel=1e-10)


def test_one_constant_series_and_a_fixed_noise_that_bounds_it():
    z = np.full((40, 1), 7.0)
    with pytest.warns(UserWarning, match="the series has no estimate"):
        res = kd.fit(z, kd.local_linear_trend)
    assert not bool(res.converged) and "constant series" in str(res.message)
    # with obs_var fixed at a nonzero value the likelihood is bounded: an ordinary fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = kd.fit(z, kd.local_linear_trend, fixed={"obs_var": 1.0})
    assert bool(res.converged) and np.isfinite(float(res.loglik))
    assert float(res.params["level_var"]) == 0.0 and float(res.params["slope_var"]) == 0.0


def test_too_short_series_get_nan_not_starting_values():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(30, 2, 1)).cumsum(0)
    z[2:, 1] = np.nan  # two observations for three variances
    with pytest.warns(
        UserWarning, match=r"series 1 have no estimate \(fewer than 4 observations\)"
    ):
        res = kd.fit(z, kd.local_linear_trend)
    assert res.converged.tolist() == [True, False]
    assert all(np.isnan(v[1]) for v in res.params.values()) and np.isnan(res.loglik[1])
    assert all(np.isfinite(v[0]) for v in res.params.values())


def test_a_fixed_float32_tensor_is_taken_as_its_value(nile):
    torch = pytest.importorskip("torch")
    ref = kd.fit(nile[:, None], kd.local_linear_trend, fixed={"obs_var": 15000.0})
    res = kd.fit(nile[:, None], kd.local_linear_trend, fixed={"obs_var": torch.tensor(15000.0)})
    lv = float(ref.params["level_var"])
    assert float(res.params["level_var"]) == pytest.approx(lv, rel=1e-12)
    assert float(res.loglik) == pytest.approx(float(ref.loglik), rel=1e-14)
