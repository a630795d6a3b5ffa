"""A nearly singular proper prior on ``backend="torch"``: the large-prior head takes the prior
through its Cholesky factor (``kalmanscan.dense.parallel._post_root``), not its inverse, so the
filter and smoother keep the accuracy of ``native`` at cond(P0) 1e8 .. 1e16 (before: about
``eps cond(P0)``, 1.5e-5 sd on Nile's trend at prior correlation ``1 - 1e-12``). Truth: the
mpmath oracle (``dense_oracle``) at 50 digits on the same float64 inputs."""

import numpy as np
import pytest
import statsmodels.api as sm

import kalmanscan.dense as kd
from kalmanscan.validation.oracle import dense_oracle


def _nile_trend(e):
    """Nile's local linear trend, prior sd (1e3, 1e2) with correlation 1 - e: cond(P0) ~ 50 / e."""
    y = sm.datasets.nile.load_pandas().data["volume"].values.astype(float)[:, None]
    m = kd.local_linear_trend(level_var=1400.0, slope_var=10.0, obs_var=15000.0)
    F, Q, H, R = (np.asarray(getattr(m, k), float) for k in ("F", "Q", "H", "R"))
    s = np.array([1e3, 1e2])
    P0 = np.array([[1.0, 1.0 - e], [1.0 - e, 1.0]]) * np.outer(s, s)
    return y, F, Q, H, R, np.array([1000.0, 0.0]), P0


def _trend_ar(cond):
    """A trend plus AR(1) observed in sum, prior eigenvalues (10, 1, 10 / cond), random basis."""
    rng = np.random.default_rng(1)
    F = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.7]])
    Q, H, R = np.diag([1.0, 0.1, 2.0]), np.array([[1.0, 0.0, 1.0]]), np.array([[4.0]])
    z = np.cumsum(rng.normal(size=(60, 1)), 0)
    V = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    P0 = V @ np.diag([10.0, 1.0, 10.0 / cond]) @ V.T
    return z, F, Q, H, R, np.zeros(3), (P0 + P0.T) / 2


CASES = {
    "nile-e1e-9": lambda: _nile_trend(1e-9),
    "nile-e1e-12": lambda: _nile_trend(1e-12),
    "nile-e1e-13": lambda: _nile_trend(1e-13),
    "trendar-c1e8": lambda: _trend_ar(1e8),
    "trendar-c1e12": lambda: _trend_ar(1e12),
    "trendar-c1e14": lambda: _trend_ar(1e14),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_filter_with_ill_conditioned_prior_matches_mpmath(case):
    z, F, Q, H, R, m0, P0 = CASES[case]()
    assert np.linalg.cond(P0) > 1e7
    r = dense_oracle(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, dps=50)
    m_mp, P_mp, ll_mp = r.mean, r.cov, r.loglik
    f = kd.filter(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="torch")
    sd = np.sqrt(np.diagonal(P_mp, axis1=-2, axis2=-1))
    # before: 1.6e-8 sd (nile-e1e-9) .. 1.5e-4 sd (nile-e1e-13), 2.4e-5 sd (trendar-c1e14)
    assert (np.abs(f.mean - m_mp) / sd).max() <= 1e-12
    rel = np.abs(f.cov - P_mp).max((-1, -2)) / np.abs(P_mp).max((-1, -2))
    assert rel.max() <= 1e-12
    assert abs(f.loglik - ll_mp) <= 1e-13 * abs(ll_mp)


@pytest.mark.parametrize("case", ["nile-e1e-12", "trendar-c1e14"])
def test_torch_smoother_with_ill_conditioned_prior_matches_the_reference(case):
    # the float64 reference (covariance form) is exact there: its filter within 6e-15 sd of mpmath
    z, F, Q, H, R, m0, P0 = CASES[case]()
    a = kd.smooth(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="torch")
    b = kd.smooth(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="sequential")
    sd = np.sqrt(np.diagonal(b.cov, axis1=-2, axis2=-1))
    # before: 1.2e-6 sd and 3.7e-8 (nile-e1e-12), 8.8e-7 sd and 1.0e-5 (trendar-c1e14)
    assert (np.abs(a.mean - b.mean) / sd).max() <= 1e-12
    rel = np.abs(a.cov - b.cov).max((-1, -2)) / np.abs(b.cov).max((-1, -2))
    assert rel.max() <= 1e-12
