"""A singular finite block of prior_cov next to diffuse states: some directions of the finite part
are known exactly at the start (statsmodels' start values of an ARIMA(p,1,q) whose MA terms are 0
leave the ARMA block's stationary covariance singular). Served exactly on every backend, equal to
statsmodels' SARIMAX with the level exactly diffuse and to a 100-digit mpmath filter; an invalid
prior covariance is still refused."""

import functools

import mpmath as mp
import numpy as np
import pytest
import statsmodels.api as sm
from scipy.linalg import solve_discrete_lyapunov
from statsmodels.tsa.statespace.initialization import Initialization
from statsmodels.tsa.statespace.sarimax import SARIMAX

import kalmanscan.dense as kd
from kalmanscan.dense import native
from tests.test_dense_known_arma import _psd_and_consistent

# native where its extension is built (a machine without a C compiler: the other two)
BACKENDS = ["native", "torch", "sequential"][0 if native.available() else 1 :]

# SARIMAX(p, 1, q).start_params (statsmodels 0.14) that the sweep of ARIMA forms found refused
# ("must be invertible next to diffuse ones"): the ARMA block's stationary covariance singular
_P22 = [1.5319779475617, -0.7112481319854808, 0.0, 0.0, 309.92246767050534]
_P33 = [0.7557012804449005, 0.39753394950887616, -0.5666957987512842, 0.0, 0.0, 0.0,
        234.98284074726917]  # fmt: skip
CASES = {
    # AR(2) with the MA terms 0: the padding state is exactly determined (eigenvalues 0, .05, 1)
    "sunspots_2_2": ("sunspots", 2, 2, _P22),
    # every ARMA term 0: a block of rank 1 (eigenvalues 0, 0, 1)
    "realgdp_2_2": ("realgdp", 2, 2, [0.0, 0.0, 0.0, 0.0, 6.97081868943722e-05]),
    "sunspots_3_3": ("sunspots", 3, 3, _P33),
}


def _series(name):
    if name == "sunspots":
        return sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].values.astype(float)
    return np.log(sm.datasets.macrodata.load_pandas().data["realgdp"].values)


@functools.lru_cache
def _case(key):
    """(y, F, Q, H, prior_cov with inf for the level, statsmodels' smoother results)."""
    dname, p, q, par = CASES[key]
    y = _series(dname)
    mod = SARIMAX(y, order=(p, 1, q))
    mod.update(np.array(par))
    ssm = mod.ssm
    F = np.asarray(ssm["transition"]).copy()
    Rs = np.asarray(ssm["selection"])
    Q = Rs @ np.asarray(ssm["state_cov"]) @ Rs.T
    H = np.asarray(ssm["design"]).copy()
    n = F.shape[0]
    P0 = np.zeros((n, n))
    P0[1:, 1:] = solve_discrete_lyapunov(F[1:, 1:], Q[1:, 1:])
    P0 = (P0 + P0.T) / 2
    assert np.linalg.eigvalsh(P0[1:, 1:])[0] <= 1e-15 * np.abs(P0).max()  # singular block
    P0[0, 0] = np.inf
    ini = Initialization(n)  # the level exactly diffuse, the ARMA block stationary
    ini.set(0, "diffuse")
    ini.set((1, n), "stationary")
    ssm.initialize(ini)
    return y, F, Q, H, P0, ssm.smooth()


def _mp_filter(z, F, Q, H, R, m0, P0f, diffuse, dps=100):
    """Covariance-form filter in mpmath, the diffuse states (bool mask) at a prior variance
    kappa = 1e40: means, covariances and the log-likelihood with kalmanscan's diffuse convention
    (docs/dense.md: + 1/2 log(2 pi kappa) per diffuse state an entry resolves at its first
    step, here each diffuse state's own loading being 1)."""
    mp.mp.dps = dps
    M = lambda a: mp.matrix(np.atleast_2d(a).tolist())  # noqa: E731
    kappa = mp.mpf(10) ** 40
    F_, Q_, H_, R_ = M(F), M(Q), M(H), M(R)
    m, P = M(np.asarray(m0, float)[:, None]), M(P0f)
    for i in np.flatnonzero(diffuse):
        P[i, i] += kappa
    ll, means, covs = mp.mpf(0), [], []
    for zt in z:
        m, P = F_ * m, F_ * P * F_.T + Q_
        v = M(np.asarray(zt, float)[:, None]) - H_ * m
        S = H_ * P * H_.T + R_
        Si = mp.inverse(S)
        K = P * H_.T * Si
        m, P = m + K * v, P - K * S * K.T
        ll += -mp.log(mp.det(2 * mp.pi * S)) / 2 - (v.T * Si * v)[0] / 2
        means.append([float(x) for x in m])
        covs.append([[float(P[i, j]) for j in range(P.cols)] for i in range(P.rows)])
    return np.array(means), np.array(covs), float(ll)


@functools.lru_cache
def _mp_case(key):
    y, F, Q, H, P0, _ = _case(key)
    dif = np.isinf(np.diagonal(P0))
    P0f = np.where(np.isinf(P0), 0.0, P0)
    m, P, ll = _mp_filter(y[:, None], F, Q, H, np.zeros((1, 1)), np.zeros(len(P0)), P0f, dif)
    return m, P, ll + 0.5 * np.log(2 * np.pi * 1e40)


@pytest.mark.parametrize("key", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_arima_start_values_match_sarimax_exact_diffuse(backend, key):
    # formerly refused on every backend; statsmodels' llf with the exact diffuse level is
    # kalmanscan's convention
    y, F, Q, H, P0, r = _case(key)
    s = kd.smooth(y[:, None], F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(len(P0)),
                  prior_cov=P0, backend=backend)  # fmt: skip
    f = s.filtered
    scale_m = np.abs(r.filtered_state).max()
    scale_c = np.abs(Q).max()
    assert abs(f.loglik - r.llf) <= 1e-13 * abs(r.llf)
    assert np.abs(f.mean - r.filtered_state.T).max() <= 1e-14 * scale_m
    assert np.abs(f.cov - r.filtered_state_cov.transpose(2, 0, 1)).max() <= 1e-12 * scale_c
    assert np.abs(s.mean - r.smoothed_state.T).max() <= 1e-14 * scale_m
    assert np.abs(s.cov - r.smoothed_state_cov.transpose(2, 0, 1)).max() <= 1e-12 * scale_c
    for res in (f, s):
        _psd_and_consistent(res.cov, res.precision, scale_c)


@pytest.mark.parametrize("key", ["sunspots_2_2", "realgdp_2_2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_arima_start_values_match_mpmath(backend, key):
    y, F, Q, H, P0, _ = _case(key)
    m_mp, P_mp, ll_mp = _mp_case(key)
    f = kd.filter(y[:, None], F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(len(P0)),
                  prior_cov=P0, backend=backend)  # fmt: skip
    assert abs(f.loglik - ll_mp) <= 1e-13 * abs(ll_mp)
    assert np.abs(f.mean - m_mp).max() <= 1e-14 * np.abs(m_mp).max()
    assert np.abs(f.cov - P_mp).max() <= 1e-12 * np.abs(Q).max()


def _known_difference_model():
    """Level diffuse and observed; states 1 and 2 equal at the start with no noise in their
    difference (finite block [[1, 1], [1, 1]]): x1 - x2 = 0 is known at every step."""
    F = np.diag([1.0, 0.5, 0.5])
    Q = np.diag([1.0, 0.0, 0.0])
    Q[1:, 1:] = 0.3
    R = 0.5 * np.eye(2)
    P0 = np.array([[np.inf, 0, 0], [0, 1.0, 1.0], [0, 1.0, 1.0]])
    z = np.random.default_rng(1).normal(size=(12, 2))
    return z, F, Q, R, P0


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_difference_beside_diffuse_level_matches_mpmath(backend):
    z, F, Q, R, P0 = _known_difference_model()
    H = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    P0f = np.where(np.isinf(P0), 0.0, P0)
    m_mp, P_mp, ll_mp = _mp_filter(z, F, Q, H, R, np.zeros(3), P0f, [True, False, False])
    ll_mp += 0.5 * np.log(2 * np.pi * 1e40)
    f = s.filtered
    assert abs(f.loglik - ll_mp) <= 1e-14 * abs(ll_mp)
    assert np.abs(f.mean - m_mp).max() <= 1e-14
    assert np.abs(f.cov - P_mp).max() <= 1e-14
    u = np.array([0.0, 1.0, -1.0])  # the known direction: variance 0, precision inf
    for res in (f, s):
        assert np.abs(res.cov @ u).max() <= 1e-15
        assert np.isposinf(res.precision[:, 1, 1]).all()
        assert np.isneginf(res.precision[:, 1, 2]).all()
        assert np.isfinite(res.precision[:, 0, 0]).all()
        _psd_and_consistent(res.cov, res.precision, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_difference_beside_never_resolved_diffuse_state(backend):
    # the diffuse state is never observed (the scan's prior-at-the-end form, native's fallback):
    # states 1, 2 are those of the proper model without it, whose prior is singular
    z, F, Q, R, P0 = _known_difference_model()
    H = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    f = kd.filter(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    P0f = np.where(np.isinf(P0), 0.0, P0)
    m_mp, P_mp, ll_mp = _mp_filter(z, F, Q, H, R, np.zeros(3), P0f, [True, False, False])
    assert abs(f.loglik - ll_mp) <= 1e-14 * abs(ll_mp)  # no entry sees the diffuse state
    assert np.abs(f.mean[:, 1:] - m_mp[:, 1:]).max() <= 1e-14
    assert np.abs(f.cov[:, 1:, 1:] - P_mp[:, 1:, 1:]).max() <= 1e-14
    assert np.isposinf(f.cov[:, 0, 0]).all() and (f.mean[:, 0] == 0).all()
    assert np.isposinf(f.precision[:, 1, 1]).all() and (f.precision[:, 0, :] == 0).all()
    if backend == "sequential":  # its smoother leaves a never-resolved direction non-finite
        return
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    ref = kd.smooth(z, F[1:, 1:], Q[1:, 1:], H[:, 1:], R, prior_mean=np.zeros(2),
                    prior_cov=P0[1:, 1:], backend="sequential")  # fmt: skip
    assert np.abs(s.mean[:, 1:] - ref.mean).max() <= 1e-14
    assert np.abs(s.cov[:, 1:, 1:] - ref.cov).max() <= 1e-14
    assert np.isposinf(s.cov[:, 0, 0]).all()
    assert np.isposinf(s.precision[:, 1, 1]).all()


def _mp_filter_tv(z, F, Q, H, R, P0f, dps=100):
    """:func:`_mp_filter` with H [T, d, n] varying in time (state 0 diffuse, zero prior mean)."""
    mp.mp.dps = dps
    M = lambda a: mp.matrix(np.atleast_2d(a).tolist())  # noqa: E731
    F_, Q_, R_ = M(F), M(Q), M(R)
    m, P = M(np.zeros((len(F), 1))), M(P0f)
    P[0, 0] += mp.mpf(10) ** 40
    ll, means, covs = mp.mpf(0), [], []
    for zt, Ht in zip(z, H, strict=True):
        H_ = M(Ht)
        m, P = F_ * m, F_ * P * F_.T + Q_
        v = M(zt[:, None]) - H_ * m
        S = H_ * P * H_.T + R_
        Si = mp.inverse(S)
        K = P * H_.T * Si
        m, P = m + K * v, P - K * S * K.T
        ll += -mp.log(mp.det(2 * mp.pi * S)) / 2 - (v.T * Si * v)[0] / 2
        means.append([float(x) for x in m])
        covs.append([[float(P[i, j]) for j in range(P.cols)] for i in range(P.rows)])
    return np.array(means), np.array(covs), float(ll) + 0.5 * np.log(2 * np.pi * 1e40)


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_difference_beside_late_resolved_diffuse_state(backend):
    # the diffuse state first observed at step 120, after the scan's sequential head (16 n + 64
    # steps): the scan's information form with the prior's known direction
    _, F, Q, R, P0 = _known_difference_model()
    T = 140
    z = np.random.default_rng(5).normal(size=(T, 2))
    H = np.zeros((T, 2, 3))
    H[:, 0, 1] = H[:, 1, 2] = 1.0
    H[120:, 0, 0] = 1.0
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    m_mp, P_mp, ll_mp = _mp_filter_tv(z, F, Q, H, R, np.where(np.isinf(P0), 0.0, P0))
    f = s.filtered
    assert abs(f.loglik - ll_mp) <= 1e-14 * abs(ll_mp)
    assert np.abs(f.mean[120:] - m_mp[120:]).max() <= 1e-14
    assert np.abs(f.cov[120:] - P_mp[120:]).max() <= 1e-13
    assert np.abs(f.mean[:, 1:] - m_mp[:, 1:]).max() <= 1e-14
    assert np.abs(f.cov[:, 1:, 1:] - P_mp[:, 1:, 1:]).max() <= 1e-14
    ref = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend="sequential")
    assert np.abs(s.mean - ref.mean).max() <= 1e-13  # state 0: 120 steps back from its data
    assert np.abs(s.cov - ref.cov).max() <= 1e-14 * np.abs(ref.cov).max()
    assert np.isposinf(s.precision[:, 1, 1]).all() and np.isposinf(f.precision[:, 1, 1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_known_exactly_beside_diffuse_one(backend):
    # prior_cov = diag(inf, 0): x1 = 2.5 at every step, x0 a local level on z - 2.5
    z = np.random.default_rng(3).normal(size=(15, 1)) + 2.5
    F, Q, H, R = np.eye(2), np.diag([1.0, 0.0]), np.array([[1.0, 1.0]]), np.ones((1, 1))
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.array([0.0, 2.5]),
                  prior_cov=np.diag([np.inf, 0.0]), backend=backend)  # fmt: skip
    ref = kd.smooth(z - 2.5, np.eye(1), np.eye(1), np.eye(1), R, prior_mean=np.zeros(1),
                    prior_cov=np.full((1, 1), np.inf), backend="sequential")  # fmt: skip
    for res, r in ((s.filtered, ref.filtered), (s, ref)):
        assert (res.mean[:, 1] == 2.5).all()
        assert (res.cov[:, 1, :] == 0).all() and (res.cov[:, :, 1] == 0).all()
        assert np.isposinf(res.precision[:, 1, 1]).all()
        assert np.abs(res.mean[:, 0] - r.mean[:, 0]).max() <= 1e-14
        assert np.abs(res.cov[:, 0, 0] - r.cov[:, 0, 0]).max() <= 1e-14
    assert abs(s.filtered.loglik - ref.filtered.loglik) <= 1e-14 * abs(ref.filtered.loglik)


@pytest.mark.parametrize(
    ("P0", "match"),
    [
        # indefinite finite block beside a diffuse state
        ([[np.inf, 0, 0], [0, 1.0, 2.0], [0, 2.0, 1.0]], "expected a positive-semidefinite"),
        ([[np.inf, 0, 0], [0, 1.0, 0.5], [0, 0.2, 1.0]], "expected a symmetric"),
        ([[np.inf, 0, 0], [0, 1.0, np.nan], [0, np.nan, 1.0]], "expected finite entries"),
        ([[np.inf, 0, 0], [0, np.nan, 0], [0, 0, 1.0]], "expected finite variances"),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_prior_beside_diffuse_still_refused(backend, P0, match):
    z, F, Q, R, _ = _known_difference_model()
    H = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match=f"prior_cov: {match}"):
        kd.filter(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=np.array(P0), backend=backend)
