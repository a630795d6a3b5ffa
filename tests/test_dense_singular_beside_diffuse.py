"""A singular finite block of prior_cov next to diffuse states: some directions of the finite part
are known exactly at the start (statsmodels' start values of an ARIMA(p,1,q) whose MA terms are 0
leave the ARMA block's stationary covariance singular). Served exactly on every backend, equal to
statsmodels' SARIMAX with the level exactly diffuse and to the mpmath oracle; an invalid
prior covariance is still refused."""

import functools

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.linalg import solve_discrete_lyapunov
from statsmodels.tsa.statespace.initialization import Initialization
from statsmodels.tsa.statespace.sarimax import SARIMAX

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle
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


# the mpmath comparison's steps: the singular block and the diffuse level are met at the start
# (the level resolved by the first observation); the whole series is compared with statsmodels
# on every backend by test_arima_start_values_match_sarimax_exact_diffuse
MP_STEPS = 80


@functools.lru_cache
def _oracle_case(key):
    """:func:`dense_oracle` of the ARIMA case ``key`` over its first ``MP_STEPS`` steps (120
    digits)."""
    y, F, Q, H, P0, _ = _case(key)
    return dense_oracle(y[:MP_STEPS, None], F, Q, H, np.zeros((1, 1)),
                        prior_mean=np.zeros(len(P0)), prior_cov=P0)  # fmt: skip


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
    r = _oracle_case(key)
    f = kd.filter(y[:MP_STEPS, None], F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(len(P0)),
                  prior_cov=P0, backend=backend)  # fmt: skip
    assert abs(f.loglik - r.loglik) <= 1e-13 * abs(r.loglik)
    assert np.abs(f.mean - r.mean).max() <= 1e-14 * np.abs(r.mean).max()
    assert np.abs(f.cov - r.cov).max() <= 1e-12 * np.abs(Q).max()


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


# H of the known-difference model: the level observed (resolved at step 0), or never observed
_H_LEVEL = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
_H_NO_LEVEL = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


@functools.lru_cache
def _oracle_known_difference(observe_level):
    """:func:`dense_oracle` of the known-difference model (120 digits)."""
    z, F, Q, R, P0 = _known_difference_model()
    H = _H_LEVEL if observe_level else _H_NO_LEVEL
    return dense_oracle(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_difference_beside_diffuse_level_matches_mpmath(backend):
    z, F, Q, R, P0 = _known_difference_model()
    s = kd.smooth(z, F, Q, _H_LEVEL, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    r = _oracle_known_difference(True)
    f = s.filtered
    assert abs(f.loglik - r.loglik) <= 1e-14 * abs(r.loglik)
    assert np.abs(f.mean - r.mean).max() <= 1e-14
    assert np.abs(f.cov - r.cov).max() <= 1e-14
    # the smoother against the oracle's RTS pass (5.6e-16 off on each backend)
    assert np.abs(s.mean - r.smooth_mean).max() <= 1e-14
    assert np.abs(s.cov - r.smooth_cov).max() <= 1e-14
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
    H = _H_NO_LEVEL
    f = kd.filter(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    r = _oracle_known_difference(False)
    assert abs(f.loglik - r.loglik) <= 1e-14 * abs(r.loglik)  # no entry sees the diffuse state
    assert np.abs(f.mean[:, 1:] - r.mean[:, 1:]).max() <= 1e-14
    assert np.abs(f.cov[:, 1:, 1:] - r.cov[:, 1:, 1:]).max() <= 1e-14
    assert np.isposinf(f.cov[:, 0, 0]).all() and (f.mean[:, 0] == 0).all()
    assert np.isposinf(f.precision[:, 1, 1]).all() and (f.precision[:, 0, :] == 0).all()
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend=backend)
    ref = kd.smooth(z, F[1:, 1:], Q[1:, 1:], H[:, 1:], R, prior_mean=np.zeros(2),
                    prior_cov=P0[1:, 1:], backend="sequential")  # fmt: skip
    assert np.abs(s.mean[:, 1:] - ref.mean).max() <= 1e-14
    assert np.abs(s.cov[:, 1:, 1:] - ref.cov).max() <= 1e-14
    assert np.isposinf(s.cov[:, 0, 0]).all()
    assert np.isposinf(s.precision[:, 1, 1]).all()


def _late_resolved_model():
    """The known-difference model over 140 steps, the diffuse state first observed at step 120
    (H [T, 2, 3])."""
    _, F, Q, R, P0 = _known_difference_model()
    T = 140
    z = np.random.default_rng(5).normal(size=(T, 2))
    H = np.zeros((T, 2, 3))
    H[:, 0, 1] = H[:, 1, 2] = 1.0
    H[120:, 0, 0] = 1.0
    return z, F, Q, H, R, P0


@functools.lru_cache
def _oracle_late_resolved():
    """:func:`dense_oracle` and the sequential backend's smoother of the late-resolved model (the
    same for every backend: computed once)."""
    z, F, Q, H, R, P0 = _late_resolved_model()
    ref = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0, backend="sequential")
    return dense_oracle(z, F, Q, H, R, prior_mean=np.zeros(3), prior_cov=P0), ref


# one pytest-xdist worker runs every backend (``--dist loadgroup``): _oracle_late_resolved once
@pytest.mark.xdist_group("late-resolved-oracle")
@pytest.mark.parametrize("backend", BACKENDS)
def test_known_difference_beside_late_resolved_diffuse_state(backend):
    # the diffuse state first observed at step 120, after the scan's sequential head (16 n + 64
    # steps): the scan's information form with the prior's known direction
    z, F, Q, H, R, P0 = _late_resolved_model()
    r, ref = _oracle_late_resolved()
    # (the sequential backend's own run is the cached reference: the same call)
    s = ref if backend == "sequential" else kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(3),
                                                      prior_cov=P0, backend=backend)  # fmt: skip
    f = s.filtered
    assert abs(f.loglik - r.loglik) <= 1e-14 * abs(r.loglik)
    assert np.abs(f.mean[120:] - r.mean[120:]).max() <= 1e-14
    assert np.abs(f.cov[120:] - r.cov[120:]).max() <= 1e-13
    assert np.abs(f.mean[:, 1:] - r.mean[:, 1:]).max() <= 1e-14
    assert np.abs(f.cov[:, 1:, 1:] - r.cov[:, 1:, 1:]).max() <= 1e-14
    # against the oracle's RTS pass (1.2e-14 and 1.6e-13 off) and the sequential backend
    for m, c in ((r.smooth_mean, r.smooth_cov), (ref.mean, ref.cov)):
        assert np.abs(s.mean - m).max() <= 1e-13  # state 0: 120 steps back from its data
        assert np.abs(s.cov - c).max() <= 1e-14 * np.abs(c).max()
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
