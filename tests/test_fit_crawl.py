"""fit_ou along a curved valley to a bound: an OU series nearly white (decay e^-6 a step, buried
in noise) whose likelihood rises, by 2e-8 over hundreds of Newton iterations, as obs_var goes to 0
while theta and sigma2 trade at one lag-one correlation. The steps bounced between the valley's
walls: 500 iterations, "did not converge", no standard errors (one of 1,000 random OU series).
The maximum is on the bound obs_var = 0, where the model is an AR(1) and well identified; the
optimizer now fits that bound once a positive estimate keeps falling while the likelihood
barely rises, and moves there where it is higher. Estimates with another on its bound are
finished with exact gradients (the stencil's are 1e-7 off)."""

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import optim


def _fit(z, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(z, **kw)


def test_the_crawling_series_converges_on_its_bound(buried_ou):
    z = buried_ou[:, 740]
    fit = _fit(z)
    assert fit.converged and fit.n_iter <= 60  # (500, unconverged, before)
    assert fit.at_boundary["obs_var"]
    # the truth: the fit with obs_var held at 1e-30 (an AR(1), 17 iterations from the default
    # start), whose log-likelihood is the supremum's
    held = _fit(z, fix={"obs_var": 1e-30})
    assert held.converged
    assert fit.loglik == pytest.approx(held.loglik, abs=1e-9)
    for p in ("theta", "sigma2", "mu"):  # to 1e-6 of a standard error (theta's is 21)
        assert abs(fit.params[p] - held.params[p]) <= 1e-6 * fit.stderr[p], p
    # the bound is the maximum: no obs_var above it does better
    for ov in (1e-4, 1e-2, 1.0):
        assert _fit(z, fix={"obs_var": ov}).loglik < fit.loglik
    assert np.isfinite(fit.stderr["theta"]) and np.isfinite(fit.stderr["sigma2"])


def test_a_thousand_random_ou_series_all_converge(buried_ou):
    fit = _fit(buried_ou)
    assert fit.converged.all()  # (999 of 1,000 before)
    assert fit.n_iter <= 100  # (500 before)


def test_groups_that_converge_early_keep_their_paths():
    """The check starts at iteration 20: a fit that converges before it is untouched."""
    assert optim._CRAWL_FROM >= 20
    z = np.random.default_rng(3).normal(size=300).cumsum()
    fit = _fit(z)
    assert fit.converged and fit.n_iter < optim._CRAWL_FROM


def test_white_noise_series_take_tens_of_iterations():
    Z = np.random.default_rng(1).normal(size=(500, 40))
    fit = _fit(Z)
    assert fit.converged.all() and fit.n_iter <= 100  # (329 before)


@pytest.mark.parametrize(
    ("z", "want"),
    [
        (np.array([3.0, 5, 4, 6, 8, 7, 9, 12, 11, 10]), 29 / 9),
        (np.array([10.0, 10, 10, 10, 11, 10, 10, 9, 10, 10, 12, 13, 13, 13, 13, 12, 12, 12, 13,
                   13]), 11 / 19),
    ],
)  # fmt: skip
def test_an_estimate_beside_a_bound_is_exact(z, want):
    """A noise-free random walk (obs_var on its bound 0): sigma2 is the mean squared increment,
    now to rounding (the stencil's gradient left it 1.7e-7 off)."""
    fit = _fit(z, fix={"theta": 0.0, "mu": 0.0})
    assert fit.at_boundary["obs_var"]
    d = np.diff(z)
    assert float(np.mean(d * d)) == pytest.approx(want, rel=1e-15)
    assert fit.params["sigma2"] == pytest.approx(want, rel=1e-11)


def test_standard_errors_reuse_the_finish_hessian(monkeypatch):
    """Mauna Loa CO2, a near random walk (theta 2e-4 a week: finished by _refine_small in
    natural coordinates), computes the exact Hessian at the estimate once, for both the finish
    and the standard errors; the errors equal those from a Hessian made afresh there (to 1e-6:
    the finish's last step, below 1e-5 relative, is taken without a Hessian after it)."""
    from kalmanscan.timeseries import fit as fit_mod
    from kalmanscan.timeseries import uncertainty

    co2 = pytest.importorskip("statsmodels.datasets.co2")
    z = co2.load_pandas().data["co2"].to_numpy()
    calls = {"fit": 0, "stderr": 0}

    def counting(where, real):
        def f(*a, **k):
            calls[where] += 1
            return real(*a, **k)

        return f

    monkeypatch.setattr(fit_mod, "_natural_hessian", counting("fit", fit_mod._natural_hessian))
    monkeypatch.setattr(
        uncertainty, "_natural_hessian", counting("stderr", uncertainty._natural_hessian)
    )
    fit = _fit(z)
    assert fit.converged and calls["fit"] >= 1  # finished in natural coordinates
    assert calls["stderr"] == 0  # (one more filter-and-adjoint call of 1 + 2k points, before)
    # the same fit with the finish's Hessian withheld: the standard errors make their own
    real_refine = fit_mod._refine_small

    def withheld(*a, **k):
        opt, H = real_refine(*a, **k)
        return opt, np.full_like(H, np.nan)

    monkeypatch.setattr(fit_mod, "_refine_small", withheld)
    again = _fit(z)
    assert calls["stderr"] == 1
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert again.params[p] == fit.params[p]
        assert again.stderr[p] == pytest.approx(fit.stderr[p], rel=1e-6, nan_ok=True), p
