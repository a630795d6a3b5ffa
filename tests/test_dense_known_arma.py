"""ARMA/ARIMA forms with R = 0 (statsmodels' SARIMAX matrices): every direction of the state
becomes known, the covariance is rounding. The known-direction rule must run (no LinAlgError),
give statsmodels' / the mpmath oracle's values, and a PSD covariance that is 0 where the
precision is infinite (kalmanscan/dense/singular.py)."""

import functools

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.linalg import solve_discrete_lyapunov
from statsmodels.tsa.statespace.sarimax import SARIMAX

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

# native where its extension is built (a machine without a C compiler: the other two)
BACKENDS = ["native", "torch", "sequential"][0 if native.available() else 1 :]


def _arma12_sunspots():
    y = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].values.astype(float)
    par = np.array([0.8262361711310473, 0.681544240805017, 0.383118487211141, 346.781247880332])
    phi, t1, t2, s2 = par
    F = np.array([[phi, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    r = np.array([1.0, t1, t2])
    Q = s2 * np.outer(r, r)
    H = np.array([[1.0, 0.0, 0.0]])
    P0 = solve_discrete_lyapunov(F, Q)
    P0 = (P0 + P0.T) / 2
    return y, par, F, Q, H, P0


def _psd_and_consistent(cov, prec, scale):
    """cov PSD to rounding, no negative variance, 0 where the precision's diagonal is inf."""
    dg = np.diagonal(cov, axis1=-2, axis2=-1)
    assert (dg >= 0).all(), f"{(dg < 0).sum()} negative variances, min {dg.min():.2e}"
    assert np.linalg.eigvalsh(cov).min() >= -1e-14 * scale
    # a coordinate known exactly: inf on its diagonal, finite across its row
    inf = np.isinf(prec)
    known = np.diagonal(inf, axis1=-2, axis2=-1) & (inf.sum(-1) == 1)
    assert (np.abs(cov).max(-1)[known] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_arma12_sunspots_stationary_matches_sarimax(backend):
    y, par, F, Q, H, P0 = _arma12_sunspots()
    ll_sm = SARIMAX(y, order=(1, 0, 2)).loglike(par)
    s = kd.smooth(y[:, None], F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(3), prior_cov=P0,
                  backend=backend)  # fmt: skip
    assert abs(s.filtered.loglik - ll_sm) <= 1e-10 * abs(ll_sm)
    scale = np.abs(Q).max()
    for r in (s.filtered, s):
        _psd_and_consistent(r.cov, r.precision, scale)


def _arima111():
    """SARIMAX(1,1,1)'s matrices: Q 1.7e-18 off rank 1 in [2, 2]; level diffuse, ARMA block
    proper; (z, F, Q, H, prior_cov)."""
    F = np.array([[1.0, 1.0, 0.0], [0.0, 0.3, 1.0], [0.0, 0.0, 0.0]])
    Q = np.array(
        [[0, 0, 0], [0, 0.9, 0.09000000000000001], [0, 0.09000000000000001, 0.009000000000000001]]
    )
    H = np.array([[1.0, 1.0, 0.0]])
    P0 = np.array([[np.inf, 0, 0], [0, 1.0582417582417583, 0.09], [0, 0.09, 0.009000000000000001]])
    z = np.cumsum(np.random.default_rng(0).normal(size=(40, 1)), 0)
    return z, F, Q, H, P0


@functools.lru_cache
def _arima111_oracle():
    z, F, Q, H, P0 = _arima111()
    return dense_oracle(z, F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(3), prior_cov=P0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_arima111_diffuse_level_matches_mpmath(backend):
    z, F, Q, H, P0 = _arima111()
    f = kd.filter(z, F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(3), prior_cov=P0,
                  backend=backend)  # fmt: skip
    # the mpmath oracle: exact diffuse log-likelihood in kalmanscan's convention
    r = _arima111_oracle()
    assert abs(f.loglik - r.loglik) <= 1e-13 * abs(r.loglik)  # 1.5e-16 off on each backend
    # every step, the diffuse one included (2.2e-16 off there on each backend)
    assert np.abs(f.mean - r.mean).max() <= 1e-13 * np.abs(r.mean).max()
    assert np.abs(f.cov - r.cov).max() <= 1e-13
    _psd_and_consistent(f.cov, f.precision, 1.0)


def test_wrong_F_shape_names_F():
    with pytest.raises(ValueError, match=r"Q: .*n from F's shape \(3, 3\)"):
        kd.filter(np.zeros((10, 1)), np.eye(3), np.eye(2), np.ones((1, 2)), np.eye(1))
