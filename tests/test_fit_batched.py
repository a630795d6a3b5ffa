"""fit_ou as a batched Newton optimiser (kalmanscan/timeseries/optim.py, fit.py).

Truths: the stencil's derivatives on closed-form objectives; one-series fits against the same
series fitted in a batch; statsmodels' exact-diffuse local level fitted to tight tolerance (the
log-likelihoods differ by exactly the -0.5 log(2 pi) statsmodels adds for the diffuse first step).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from kalmanscan.testing import tolerance
from kalmanscan.timeseries import OUModel, fit_ou, load_nile, optim

LL = {"theta": 0.0, "mu": 0.0}
# two maximizations of the same likelihood (Newton to the stencil's noise floor)
FIT_AGREEMENT_RTOL = tolerance("fit", "float64")
FIT_LOGLIK_ATOL = tolerance("fit_loglik", "float64")
# against statsmodels' BFGS with gtol 1e-12 (the issue-20 acceptance bound; its default L-BFGS-B
# stops 2e-4 short on flat likelihoods even with pgtol 1e-12)
STATSMODELS_RTOL = tolerance("statsmodels_fit", "float64")


def _sim_local_level(n_series, T, seed):
    rng = np.random.default_rng(seed)
    s2 = np.exp(rng.uniform(np.log(0.1), np.log(10), n_series))
    ov = np.exp(rng.uniform(np.log(0.1), np.log(10), n_series))
    _, z = OUModel(theta=0.0, sigma2=s2, obs_var=ov).simulate(n=T, seed=seed + 1)
    return z


# --- the optimiser on closed-form objectives ----------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_stencil_derivatives_are_exact_on_a_quadratic(k):
    rng = np.random.default_rng(k)
    A = rng.normal(size=(k, k))
    Q = A @ A.T + k * np.eye(k)
    b = rng.normal(size=k)
    u = rng.normal(size=(3, k))
    h = 1e-3
    pts = u[None] + optim.stencil(k)[:, None, :] * h  # [P, 3, k]
    fv = 0.5 * np.einsum("pni,ij,pnj->pn", pts, Q, pts) + pts @ b
    f, g, H = optim.derivatives(fv, k, h)
    np.testing.assert_allclose(g, u @ Q + b, rtol=0, atol=tolerance("stencil_grad", "float64"))
    H_want = np.broadcast_to(Q, (3, k, k))
    np.testing.assert_allclose(H, H_want, rtol=0, atol=tolerance("stencil_hess", "float64"))


def test_converged_groups_are_frozen_and_independent():
    # separable objectives; group g has its minimum at c_g and curvature w_g: a group's path and
    # its number of iterations do not depend on which other groups are in the batch
    c = np.array([0.0, 3.0, -2.0, 40.0])
    w = np.array([1.0, 1e-3, 10.0, 1.0])
    calls = np.zeros(4, int)

    def fun(U, idx):
        calls[idx] += 1
        x = U[..., 0]
        return w[idx] * (np.cosh(x - c[idx]) - 1)

    r = optim.minimize(fun, np.zeros((4, 1)), np.array([False]), max_iter=100, gtol=1e-12)
    assert (r.status == optim.CONVERGED).all()
    np.testing.assert_allclose(r.u[:, 0], c, atol=1e-7)
    assert r.n_iter[0] == 0 and calls[0] == 1  # already at its minimum: one stencil, then frozen
    assert calls[3] > calls[1] >= 2
    for g in range(4):  # alone, each group takes the same steps to the same point
        one = optim.minimize(
            lambda U, idx, g=g: fun(U, np.full_like(idx, g)),
            np.zeros((1, 1)), np.array([False]), max_iter=100, gtol=1e-12,
        )  # fmt: skip
        assert one.u[0, 0] == r.u[g, 0] and one.n_iter[0] == r.n_iter[g]


def test_a_positive_coordinate_reaches_its_boundary_and_is_named():
    # f = x + (y - 1)^2 with x = exp(u0): the minimum over x >= 0 is at x = 0
    def fun(U, idx):
        return np.exp(U[..., 0]) + (U[..., 1] - 1.0) ** 2

    r = optim.minimize(fun, np.zeros((2, 2)), np.array([True, False]), max_iter=60, gtol=1e-10)
    assert (r.status == optim.CONVERGED).all()
    assert r.at_boundary[:, 0].all() and not r.at_boundary[:, 1].any()
    assert (np.exp(r.u[:, 0]) < optim.BOUNDARY).all()
    assert r.n_iter.max() <= 8  # the jump to the bound, not one factor e an iteration


# --- batched fits -------------------------------------------------------------------------------
@pytest.mark.parametrize("fix", [LL, None], ids=["local-level", "free-ou"])
def test_batched_fit_equals_one_series_fits(fix):
    z = _sim_local_level(6, 150, seed=3)
    if fix is None:  # OU series with a mean and noise
        t = np.arange(150.0)
        _, z = OUModel(theta=[0.05, 0.2, 0.5], sigma2=1.0, mu=2.0, obs_var=0.3).simulate(t, seed=9)
    z[np.random.default_rng(1).random(z.shape) < 0.1] = np.nan
    z[:40, 1] = np.nan  # a series with a long missing start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        many = fit_ou(z, fix=fix)
        for s in range(z.shape[1]):
            one = fit_ou(z[:, s], fix=fix)
            assert bool(many.converged[s]) == one.converged
            for k, v in one.params.items():
                got = many.params[k][s] if np.ndim(many.params[k]) else many.params[k]
                assert abs(got - v) <= FIT_AGREEMENT_RTOL * max(abs(v), 1e-12), (s, k, got, v)
            assert abs(many.loglik[s] - one.loglik) <= FIT_LOGLIK_ATOL


def test_batched_fit_matches_statsmodels_tight():
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    years, flow = load_nile()
    z = np.column_stack([flow, _sim_local_level(3, 100, seed=5)])
    fit = fit_ou(z, fix=LL)
    for s in range(z.shape[1]):
        mod = sm.UnobservedComponents(z[:, s], "local level", use_exact_diffuse=True)
        res = mod.fit(disp=False, method="bfgs", maxiter=2000, gtol=1e-12)
        ov, s2 = res.params
        assert abs(fit.params["obs_var"][s] / ov - 1) < STATSMODELS_RTOL
        assert abs(fit.params["sigma2"][s] / s2 - 1) < STATSMODELS_RTOL
        # statsmodels' exact diffuse likelihood keeps -0.5 log(2 pi) of the diffuse first step
        assert abs(fit.loglik[s] - 0.5 * math.log(2 * math.pi) - res.llf) <= FIT_LOGLIK_ATOL


def test_converged_is_honest_and_options_are_checked():
    years, flow = load_nile()
    with pytest.warns(UserWarning, match="did not converge .*iteration limit"):
        fit = fit_ou(flow, fix=LL, max_iter=1)
    assert fit.converged is False
    assert math.isnan(fit.stderr["obs_var"])
    assert any("did not converge" in n for n in fit.notes)
    for bad, exc, msg in [
        (-1, ValueError, "max_iter: expected an int >= 1, got -1"),
        (0, ValueError, "max_iter: expected an int >= 1"),
        (2.5, TypeError, "max_iter: expected an int"),
    ]:
        with pytest.raises(exc, match=msg):
            fit_ou(flow, fix=LL, max_iter=bad)
    with pytest.raises(ValueError, match="tol: expected a positive finite number"):
        fit_ou(flow, fix=LL, tol=0.0)
    with pytest.raises(TypeError, match="z:"):
        fit_ou(["1", "2", "3"])


def test_constant_series_and_equal_timestamps_are_refused():
    with pytest.raises(ValueError, match="z: every observed value is 3.0 .*no maximum-likelihood"):
        fit_ou(np.full(20, 3.0), fix=LL)
    z = np.random.default_rng(0).normal(size=(20, 2)).cumsum(0)
    z[:, 1] = 5.0
    with pytest.warns(UserWarning, match="series 1 are constant"):
        fit = fit_ou(z, fix=LL)
    assert fit.converged.tolist() == [True, False]
    with pytest.raises(ValueError, match="times: all 20 timestamps are equal"):
        fit_ou(z[:, 0], np.zeros(20), fix=LL)


def test_boundary_estimate_is_named_and_explained():
    # a random walk observed without noise: the obs_var estimate is at its bound 0
    z = np.random.default_rng(5).normal(size=200).cumsum()
    with pytest.warns(UserWarning, match="obs_var is at its lower bound 0"):
        fit = fit_ou(z, fix=LL)
    assert fit.converged is True and fit.at_boundary == {"sigma2": False, "obs_var": True}
    # obs_var has none; sigma2's is the observed information with obs_var held at 0: for a random
    # walk seen without noise, sigma2_hat = mean(d**2) and its standard error sigma2_hat sqrt(2/m)
    assert math.isnan(fit.stderr["obs_var"])
    d = np.diff(z)
    closed = np.mean(d * d) * math.sqrt(2 / d.size)
    assert abs(fit.stderr["sigma2"] / closed - 1) <= tolerance("stderr", "float64")
    row = fit.summary().splitlines()[3].split()  # series, sigma2, (s.e.), obs_var, (s.e.), ...
    assert float(row[2]) == pytest.approx(fit.stderr["sigma2"], rel=1e-3) and row[4][0] == "<"
    assert "note: obs_var is at its lower bound 0" in fit.summary()
    assert "standard errors are those with obs_var held at 0" in fit.summary()
    assert "normal approximation" in fit.summary()
    assert fit.params["obs_var"] < 1e-6 * np.var(np.diff(z))


def test_starting_values_do_not_change_the_estimate():
    t = np.arange(300.0)
    _, z = OUModel(theta=0.1, sigma2=1.0, mu=2.0, obs_var=0.3).simulate(t, seed=12)
    ref = fit_ou(z, t)
    for init in ({"theta": 1.0, "sigma2": 20.0, "mu": -5.0, "obs_var": 3.0}, {"theta": 1e-3}):
        got = fit_ou(z, t, init=init)
        assert got.converged
        assert abs(got.loglik - ref.loglik) <= FIT_LOGLIK_ATOL
        for k in ("theta", "sigma2", "mu"):
            assert abs(got.params[k] / ref.params[k] - 1) <= FIT_AGREEMENT_RTOL, (init, k)


def test_a_variance_sent_to_its_bound_from_a_far_start_comes_back_in_a_batch():
    # from a far start a variance can be taken to its bound while other parameters are still far
    # off; the probes above the bound bring it back (per series, in a batch)
    t = np.arange(300.0)
    _, z = OUModel(theta=[0.05, 0.1, 0.3], sigma2=1.0, mu=2.0, obs_var=0.3).simulate(t, seed=12)
    ref = fit_ou(z, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = fit_ou(z, t, init={"theta": 1.0, "sigma2": 20.0, "mu": -5.0, "obs_var": 3.0})
    assert got.converged.all() and not got.at_boundary["obs_var"].any()
    np.testing.assert_allclose(got.loglik, ref.loglik, rtol=0, atol=FIT_LOGLIK_ATOL)
