"""fit_ou with a variance estimate small against the data's scale (an audit's findings 1-3).

1. Standard errors of an interior estimate of ~1e-5 of the scale: the fit's stencil in ``log x``
   lost the curvature to rounding (s.e. 2-4x off, or NaN "not identified"); they now come from a
   Hessian in natural coordinates from exact gradients. References: an mpmath Hessian of the
   exact-diffuse log-likelihood at 40-60 digits (``.session/audit-fit/ref.py``'s ``se_ref``, values
   below) and statsmodels' ``UnobservedComponents("llevel")`` (``cov_type="approx"``).
2. A variance whose likelihood rises all the way to 0 was reported interior (~3e-6 of the scale,
   ``at_boundary`` False, NaN s.e.): the convergence test in ``log x`` vanishes with ``x``. A noise
   free local level has the profile slope ``-sum(d_t d_t-1) / sigma2**2`` at ``obs_var = 0`` (``d``
   the increments), so data whose lag-1 sum of products is 0 or positive have their maximum on the
   bound; the other estimate's s.e. is then the closed form ``sigma2_hat sqrt(2 / m)``.
3. ``OUModel`` with subnormal variances: refused with the core's message, or computed (no
   internal ``1 / c**2`` overflow), checked against the closed form of a two-step local level.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import OUModel

LL = {"theta": 0.0, "mu": 0.0}
Z10 = np.array([3, 5, 4, 6, 8, 7, 9, 12, 11, 10.0])  # increments' lag-1 sum of products: 0
Y20 = np.array([10, 10, 10, 10, 11, 10, 10, 9, 10, 10, 12, 13, 13, 13, 13, 12, 12, 12, 13, 13.0])


def _fit(z, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(z, **kw)


def _statsmodels_se(z, obs_var, sigma2):
    sm = pytest.importorskip("statsmodels.api")
    mod = sm.tsa.UnobservedComponents(z, "llevel", use_exact_diffuse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mod.smooth([obs_var, sigma2], cov_type="approx")
    return float(res.bse[1]), float(res.bse[0])  # sigma2, obs_var


# --- 1. interior estimates of ~1e-5 of the scale ------------------------------------------------
# Z10 with its last value 10.0002: the lag-1 sum is -2e-4, so the profile rises from 0 and the
# maximum is interior, at obs_var = 3.3523e-5 (mpmath: gradient below 2e-15 there)
Z_IN = np.concatenate([Z10[:-1], [10.0002]])
MP_SE_IN = {"sigma2": 3.0442991678757467, "obs_var": 1.3191640903779285}  # mpmath, 60 digits


def test_small_interior_obs_var_has_the_mpmath_standard_errors():
    fit = _fit(Z_IN, fix=LL)
    assert fit.converged and not any(fit.at_boundary.values())
    assert fit.params["obs_var"] == pytest.approx(3.352271743784141e-05, rel=1e-6)
    for p, want in MP_SE_IN.items():
        assert abs(fit.stderr[p] / want - 1) <= 1e-6, (p, fit.stderr[p], want)
    assert not fit.notes


@pytest.mark.parametrize("c", [1.0, 1.0001, 0.9999, 1.001, 1e3])
def test_small_interior_se_is_statsmodels_at_any_data_scale(c):
    """A relative change of 1e-4 in the data used to flip the s.e. to NaN "not identified"."""
    z = Z_IN * c
    fit = _fit(z, fix=LL)
    assert not fit.at_boundary["obs_var"]
    assert fit.params["obs_var"] < 4e-5 * c**2  # ~1e-5 of the data's scale
    want = _statsmodels_se(z, fit.params["obs_var"], fit.params["sigma2"])
    got = (fit.stderr["sigma2"], fit.stderr["obs_var"])
    assert np.allclose(got, want, rtol=1e-5, atol=0), (got, want)


def test_near_random_walk_mu_se_is_the_mpmath_one():
    """macrodata realgdp, OU (theta 1.2e-4 per quarter, obs_var on its bound): the stencil's mu
    s.e. was 5066.7 (0.14% off); mpmath Hessian at the fit's estimate, obs_var held."""
    sm = pytest.importorskip("statsmodels.api")
    z = sm.datasets.macrodata.load_pandas().data["realgdp"].to_numpy()
    fit = _fit(z)
    assert fit.at_boundary["obs_var"]
    want = {"theta": 0.00016724100826994744, "sigma2": 614.5090802300232, "mu": 5073.6094550140515}
    for p, w in want.items():
        assert abs(fit.stderr[p] / w - 1) <= 1e-6, (p, fit.stderr[p], w)


# --- 2. maxima on the bound that the log-coordinate test missed ---------------------------------
@pytest.mark.parametrize(
    "z",
    [
        pytest.param(Y20, id="audit-y20-lag1-sum-0"),
        pytest.param(Z10, id="audit-z10-lag1-sum-0"),
        pytest.param(np.concatenate([Z10[:-1], [9.999]]), id="z10-lag1-sum-positive"),
    ],
)
def test_noise_free_walk_puts_obs_var_on_its_bound(z):
    fit = _fit(z, fix=LL)
    assert fit.converged
    assert fit.at_boundary["obs_var"] and not fit.at_boundary["sigma2"]
    assert math.isnan(fit.stderr["obs_var"])
    d = np.diff(z)
    s2 = float(np.mean(d * d))  # the random walk's MLE
    assert fit.params["sigma2"] == pytest.approx(s2, rel=1e-7)
    assert fit.stderr["sigma2"] == pytest.approx(s2 * math.sqrt(2 / d.size), rel=1e-6)
    # the one-sided profile bound: the loglik fitted with obs_var held there is 1.353 lower
    b = fit.upper_bound["obs_var"]
    assert 0 < b < np.inf
    held = _fit(z, fix={"theta": 0.0, "mu": 0.0, "obs_var": b})
    assert fit.loglik - held.loglik == pytest.approx(1.3528, abs=2e-3)


def test_audit_y20_expected_values():
    """The audit's reproducer: sigma2 0.578947 (11/19), s.e. 0.187835."""
    fit = _fit(Y20, fix=LL)
    assert fit.at_boundary == {"sigma2": False, "obs_var": True}
    assert fit.params["sigma2"] == pytest.approx(11 / 19, rel=1e-7)
    assert fit.stderr["sigma2"] == pytest.approx(0.187835, abs=5e-7)
    assert not any("not identified" in n for n in fit.notes)


def test_a_batch_mixes_bound_and_small_interior_series():
    """Each series its own verdict, as fitted alone."""
    Z = np.column_stack([Z10, Z_IN, np.concatenate([Z10[:-1], [9.999]]) * 2.0])
    fit = _fit(Z, fix=LL)
    assert fit.at_boundary["obs_var"].tolist() == [True, False, True]
    for i in range(3):
        one = _fit(Z[:, i], fix=LL)
        for p in ("sigma2", "obs_var"):
            a, b = fit.stderr[p][i], one.stderr[p]
            # (the batch and the lone fit stop at estimates 1e-10 apart: the optimizer's path
            # differs by rounding in the gradients, and this obs_var's standard error, 4e4 times
            # the estimate, moves 1e-7 with them on the torch backend)
            assert (math.isnan(a) and math.isnan(b)) or abs(a / b - 1) <= 1e-6, (i, p, a, b)


# --- 3. subnormal variances in OUModel ----------------------------------------------------------
def test_subnormal_obs_var_is_refused_with_the_core_message():
    z = np.array([1e-160, 2e-160])
    with pytest.raises(ValueError) as core:
        ks.filter(z, obs_var=1e-320, decay=1.0, process_var=1e-320)
    with pytest.raises(ValueError) as model:
        OUModel(theta=0.0, sigma2=1e-320, obs_var=1e-320).filter(z)
    msg = str(model.value)
    assert msg.startswith("obs_var: expected values whose reciprocal is finite in torch.float64")
    assert str(core.value).startswith(msg), (msg, str(core.value))  # the core adds the index
    assert "inf" not in msg
    with pytest.raises(ValueError, match=r"obs_var: .* got 1e-320 at index \(1,\)"):
        OUModel(theta=0.0, sigma2=1.0, obs_var=np.array([1.0, 1e-320]))


def test_subnormal_variances_with_a_finite_reciprocal_are_filtered():
    """obs_var = sigma2 = v = 1e-308 (subnormal; 1 / v finite): the two-step local level's closed
    form, mean_2 = z_1 + (2/3)(z_2 - z_1), var_2 = (2/3) v, and the loglik of one innovation of
    variance 3 v."""
    v, z = 1e-308, np.array([1e-160, 2e-160])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow inside
        res = OUModel(theta=0.0, sigma2=v, obs_var=v).filter(z)
        ll = OUModel(theta=0.0, sigma2=v, obs_var=v).loglik(z)
    assert res.mean[1] == pytest.approx(z[0] + (z[1] - z[0]) * 2 / 3, rel=1e-14)
    assert res.var[1] == pytest.approx(2 * v / 3, rel=1e-12)
    want = -0.5 * (math.log(2 * math.pi * 3) + math.log(v)) - (z[1] - z[0]) ** 2 / (6 * v)
    assert float(ll) == pytest.approx(want, rel=1e-13)
