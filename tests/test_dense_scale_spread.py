"""Dense models whose states live on scales far apart, against mpmath (dense audit).

``native`` (what ``backend="auto"`` runs on the CPU) judged a pivot of its semidefinite Cholesky
factor, and of ``R``'s LDL', against the matrix's largest diagonal entry: with ``Q = diag(1e16,
1)`` the second state's factor column was dropped, its filtered variance reported 0 (truth
0.4747), the log-likelihood -169.53 for -173.09 and the smoothed covariances 95 % off; likewise
``R = diag(1e16, 1)``. Each pivot is now judged against its own diagonal entry. The models here
are diagonal (``F = I``, ``Q``, ``H``, ``R`` diagonal), so the truth is one scalar Kalman filter a
state, in mpmath at 80 digits.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native

BACKENDS = ["torch", "sequential"] + (["native"] if native.available() else [])


def mp_filter(z, q, r, p0):
    """Filtered variances ``[T]`` and the log-likelihood of a scalar random walk with prior mean
    0 and variance ``p0``, in mpmath."""
    mp.mp.dps = 80
    m, P, ll, var = mp.mpf(0), mp.mpf(p0), mp.mpf(0), []
    for zt in z:
        P = P + mp.mpf(q)
        S = P + mp.mpf(r)
        v = mp.mpf(float(zt)) - m
        ll -= (mp.log(2 * mp.pi) + mp.log(S) + v * v / S) / 2
        m, P = m + P / S * v, P * mp.mpf(r) / S
        var.append(float(P))
    return np.array(var), float(ll)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["Q", "R"])
@pytest.mark.parametrize("ratio", [1e10, 1e16, 1e24, 1e40])
def test_states_on_scales_far_apart(backend, where, ratio):
    T = 8
    z = np.random.default_rng(0).normal(size=(T, 2))
    z[:, 0] *= np.sqrt(ratio)
    q, r = np.array([1.0, 1.0]), np.array([0.5, 0.7])
    (q if where == "Q" else r)[0] *= ratio
    res = kd.filter(z, np.eye(2), np.diag(q), np.eye(2), np.diag(r), prior_mean=np.zeros(2),
                    prior_cov=np.eye(2), backend=backend)  # fmt: skip
    ll = 0.0
    for i in range(2):
        var, lli = mp_filter(z[:, i], q[i], r[i], 1.0)
        ll += lli
        np.testing.assert_allclose(res.cov[:, i, i], var, rtol=1e-12, err_msg=f"state {i}")
    assert float(res.loglik) == pytest.approx(ll, rel=1e-13)
    sm = kd.smooth(z, np.eye(2), np.diag(q), np.eye(2), np.diag(r), prior_mean=np.zeros(2),
                   prior_cov=np.eye(2), backend=backend)  # fmt: skip
    assert np.all(sm.cov[:, 1, 1] > 0.1)  # (the small state's smoothed variance: 0.33 to 0.47)


@pytest.mark.parametrize("obs_var", [1e-12, 1e-16, 1e-22, 1e-30])
@pytest.mark.parametrize("smooth", [False, True])
def test_near_noise_free_local_linear_trend(obs_var, smooth):
    """``native`` (``backend="auto"`` on the CPU) raised torch's ``LinAlgError`` from obs_var
    1e-16 down: its covariance-form update rounds the level's variance to exactly 0, and outside
    the known-direction gate the blockwise inverse of that singular covariance was taken. A
    block singular to rounding now takes the known-direction rule (the level reported known,
    variance 0, where the truth is ``obs_var``); the log-likelihood is the other backends'."""
    m = kd.local_linear_trend(level_var=1.0, slope_var=1e-3, obs_var=obs_var)
    z = np.array([[0.3], [1.1], [np.nan], [2.6], [3.0], [3.9]])
    fn = kd.smooth if smooth else kd.filter
    want = kd.filter(z, **m._asdict(), backend="sequential")
    for backend in ["auto"] + (["native"] if native.available() else []):
        got = fn(z, **m._asdict(), backend=backend)
        res = got.filtered if smooth else got
        assert float(res.loglik) == pytest.approx(float(want.loglik), rel=1e-12)
        assert res.cov[-1, 0, 0] <= 2 * obs_var
        np.testing.assert_allclose(res.cov[-1, 1, 1], want.cov[-1, 1, 1], rtol=1e-10)
