"""ARMA/ARIMA forms with R = 0 (statsmodels' SARIMAX matrices): every direction of the state
becomes known, the covariance is rounding. The known-direction rule must run (no LinAlgError),
give statsmodels' / an mpmath filter's values, and a PSD covariance that is 0 where the
precision is infinite (kalmanscan/dense/singular.py)."""

import mpmath as mp
import numpy as np
import pytest
import statsmodels.api as sm
from scipy.linalg import solve_discrete_lyapunov
from statsmodels.tsa.statespace.sarimax import SARIMAX

import kalmanscan.dense as kd
from kalmanscan.dense import native

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


def _mp_filter(z, F, Q, H, m0, P0, dps=60):
    """Covariance-form filter in mpmath (prior on x_0, R = 0): means, covs, loglik."""
    mp.mp.dps = dps
    M = lambda a: mp.matrix(np.atleast_2d(a).tolist())  # noqa: E731
    F_, Q_, H_ = M(F), M(Q), M(H)
    m, P = M(np.asarray(m0)[:, None]), M(P0)
    ll, means, covs = mp.mpf(0), [], []
    for zt in z:
        m, P = F_ * m, F_ * P * F_.T + Q_
        v = M(zt[:, None]) - H_ * m
        S = H_ * P * H_.T
        K = P * H_.T * mp.inverse(S)
        m, P = m + K * v, P - K * S * K.T
        ll += -mp.log(mp.det(2 * mp.pi * S)) / 2 - (v.T * mp.inverse(S) * v)[0] / 2
        means.append([float(x) for x in m])
        covs.append([[float(P[i, j]) for j in range(P.cols)] for i in range(P.rows)])
    return np.array(means), np.array(covs), float(ll)


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_arima111_diffuse_level_matches_mpmath(backend):
    # SARIMAX(1,1,1)'s matrices: Q 1.7e-18 off rank 1 in [2, 2]; level diffuse, ARMA block proper
    F = np.array([[1.0, 1.0, 0.0], [0.0, 0.3, 1.0], [0.0, 0.0, 0.0]])
    Q = np.array(
        [[0, 0, 0], [0, 0.9, 0.09000000000000001], [0, 0.09000000000000001, 0.009000000000000001]]
    )
    H = np.array([[1.0, 1.0, 0.0]])
    P0f = np.array([[0, 0, 0], [0, 1.0582417582417583, 0.09], [0, 0.09, 0.009000000000000001]])
    z = np.cumsum(np.random.default_rng(0).normal(size=(40, 1)), 0)
    P0 = P0f.copy()
    P0[0, 0] = np.inf
    f = kd.filter(z, F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(3), prior_cov=P0,
                  backend=backend)  # fmt: skip
    # the diffuse level as a prior variance of 1e40 (100 digits), plus the documented offset
    m_mp, P_mp, ll_mp = _mp_filter(z, F, Q, H, np.zeros(3), P0f + np.diag([1e40, 0, 0]), 100)
    ll_mp += 0.5 * np.log(1e40) + 0.5 * np.log(2 * np.pi)  # docs: one diffuse state's offset
    assert abs(f.loglik - ll_mp) <= 1e-10 * abs(ll_mp)
    # every step, the diffuse one included (2.2e-16 off there on each backend)
    assert np.abs(f.mean - m_mp).max() <= 1e-10 * np.abs(m_mp).max()
    assert np.abs(f.cov - P_mp).max() <= 1e-13
    _psd_and_consistent(f.cov, f.precision, 1.0)


def test_wrong_F_shape_names_F():
    with pytest.raises(ValueError, match=r"Q: .*n from F's shape \(3, 3\)"):
        kd.filter(np.zeros((10, 1)), np.eye(3), np.eye(2), np.ones((1, 2)), np.eye(1))
