"""fit_ou on series without persistence (white noise, or an OU process buried in noise): the
likelihood's supremum is white noise's, reached as theta -> infinity, where theta and sigma2
trade along a ridge and the split of the variance from obs_var is not seen. Newton steps crawled
up that ridge: 500 iterations, "did not converge", arbitrary estimates (7 of 1,000 random OU
series, most of the fit's time; 6 of 40 white-noise series). Now such a series stops on the
ridge (once every decay is below e^-12) and is reported as white noise: sigma2 on its bound 0,
obs_var its variance, mu its mean, theta not identified, and the log-likelihood white noise's,
exactly."""

import warnings

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel


def _fit(z, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = ks.fit_ou(z, **kw)
    return fit, [str(w.message) for w in caught]


def _white_loglik(z):
    n = z.shape[0]
    return -0.5 * n * (np.log(2 * np.pi * z.var(0)) + 1)


def test_white_noise_series_converge_as_white_noise():
    Z = np.random.default_rng(1).normal(size=(500, 40)) * 3.0 + 7.0
    fit, msgs = _fit(Z)
    assert fit.converged.all()  # (6 of the 40 ran the 500 iterations, before)
    white = fit.model.sigma2 < 1e-10 * Z.var(0)
    assert white.sum() >= 10
    ll = _white_loglik(Z)
    # the white-noise series: white noise's maximum likelihood, to rounding
    np.testing.assert_allclose(fit.loglik[white], ll[white], rtol=1e-12)
    np.testing.assert_allclose(fit.model.obs_var[white], Z.var(0)[white], rtol=1e-10)
    np.testing.assert_allclose(fit.model.mu[white], Z.mean(0)[white], rtol=1e-10)
    assert np.isnan(fit.stderr["theta"][white]).all()
    n = Z.shape[0]
    np.testing.assert_allclose(fit.stderr["mu"][white], np.sqrt(Z.var(0) / n)[white], rtol=1e-4)
    np.testing.assert_allclose(
        fit.stderr["obs_var"][white], (Z.var(0) * np.sqrt(2 / n))[white], rtol=1e-4
    )
    assert np.isinf(fit.upper_bound["sigma2"][white]).all()
    assert any("no persistence" in m for m in msgs)
    # no series' fit is worse than white noise, which the OU family holds as a limit
    assert (fit.loglik >= ll - 1e-9 * np.abs(ll)).all()


def test_white_noise_is_the_supremum_on_a_grid():
    """The truth for one white series: no OU model on a wide grid beats white noise's
    likelihood (the fit's value)."""
    z = np.random.default_rng(3).normal(size=300) * 2 + 5
    fit, msgs = _fit(z)
    assert fit.model.sigma2 < 1e-10 and any("no persistence" in m for m in msgs)
    assert fit.loglik == pytest.approx(_white_loglik(z), rel=1e-12)
    best = -np.inf
    for theta in (0.01, 0.1, 1.0, 10.0):
        for frac in (0.01, 0.1, 0.5, 0.9):
            v = frac * z.var()
            a, q = ks.discretize_ou(theta=theta, sigma2=2 * theta * v, dt=1.0)
            ll = ks.loglik(
                z, obs_var=z.var() - v, decay=a, process_var=q, offset=z.mean() * (1 - a),
                prior_mean=z.mean(), prior_var=v,
            )  # fmt: skip
            best = max(best, float(ll))
    assert best <= fit.loglik + 1e-9


def test_ou_buried_in_noise_converges(buried_ou):
    bad = [92, 345, 381, 556, 740, 761, 884]  # the 7 of 1,000 that ran 500 iterations
    fit, _ = _fit(buried_ou[:, bad])
    assert fit.converged.all()  # (740 converges on obs_var's bound: tests/test_fit_crawl.py)


def test_persistent_series_are_not_white():
    _, z = OUModel(theta=0.1, sigma2=1.0, obs_var=0.5).simulate(n=400, seed=2)
    fit, msgs = _fit(z)
    assert fit.converged and 0.01 < fit.model.theta < 1.0
    assert not any("no persistence" in m for m in msgs)


def test_repeated_times_keep_the_variance_split():
    """Two observations at one time share the state, which tells sigma2 / (2 theta) from
    obs_var: no white-noise limit is taken (the test is off), and the fit still runs."""
    rng = np.random.default_rng(4)
    t = np.repeat(np.arange(150.0), 2)
    z = rng.normal(size=300)
    fit, msgs = _fit(z, times=t, max_iter=50)
    assert not any("no persistence" in m for m in msgs)
    assert np.isfinite(fit.loglik)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_white_noise_fit_on_cuda_matches_cpu(fit_devices):
    """The white-noise limit's moments are taken on the device with the data: the CUDA fit
    settles the same series at the same values, and its filter calls ran on CUDA."""
    Z = np.random.default_rng(1).normal(size=(500, 12)) * 3.0 + 7.0
    gpu, msgs_gpu = _fit(Z, device="cuda", stderr=False)
    assert fit_devices and set(fit_devices) == {"cuda"}
    cpu, msgs_cpu = _fit(Z, device="cpu", stderr=False)
    white = cpu.model.sigma2 < 1e-10 * Z.var(0)
    assert white.any()
    np.testing.assert_array_equal(gpu.model.sigma2 < 1e-10 * Z.var(0), white)
    np.testing.assert_allclose(gpu.loglik[white], _white_loglik(Z)[white], rtol=1e-12)
    assert any("no persistence" in m for m in msgs_gpu)


def test_joint_white_noise_converges_as_white_noise():
    """A joint fit's one group: every series' values together (484 iterations before)."""
    Z = np.random.default_rng(1).normal(size=(500, 5)) * 2 + 3
    fit, msgs = _fit(Z, joint=True)
    assert fit.converged and fit.n_iter <= 60
    assert any("fitted jointly) show no persistence" in m for m in msgs)
    want = -0.5 * Z.size * (np.log(2 * np.pi * ((Z - Z.mean()) ** 2).mean()) + 1)
    assert fit.loglik.sum() == pytest.approx(want, rel=1e-12)
    assert np.isinf(fit.upper_bound["sigma2"]) and np.isnan(fit.stderr["theta"])
    # mu fixed: the mean square about it
    fixed, msgs = _fit(Z, joint=True, fix={"mu": 3.0})
    assert any("no persistence" in m for m in msgs)
    want = -0.5 * Z.size * (np.log(2 * np.pi * ((Z - 3.0) ** 2).mean()) + 1)
    assert fixed.loglik.sum() == pytest.approx(want, rel=1e-12)
