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
