"""``kd.constant_velocity`` / ``kd.constant_acceleration``: F and Q exact at every step length.

Q was read off ``torch.linalg.matrix_exp`` of Van Loan's block, whose truncated series lost the
smallest entries at small dt (constant acceleration: Q[0, 0] 1.6 % low for dt <= 0.01, 17 % low
and an indefinite Q at dt = 1e-4; constant velocity: 50 % off at dt = 1e-8). The truth here is
mpmath's expm of the same block at 140 digits (dt = 1e-12 makes Q[0, 0] 1e-60 of
the block's exponential, so fewer digits cancel away), and the textbook closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kalmanscan.dense as kd

mpmath = pytest.importorskip("mpmath")

DTS = [1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 0.37, 1.0, 7.5, 100.0, 1e3]
BUILDERS = {1: kd.constant_velocity, 2: kd.constant_acceleration}


def van_loan_mp(order, dt, q):
    """F, Q of the order-times integrated white noise, from mpmath's expm of Van Loan's block
    [[-A, L Qc L'], [0, A']] dt (A the shift, only the last state driven)."""
    k = order + 1
    with mpmath.workdps(140):
        M = mpmath.zeros(2 * k, 2 * k)
        for i in range(k - 1):
            M[i, i + 1] = -1  # -A
            M[k + i + 1, k + i] = 1  # A'
        M[k - 1, 2 * k - 1] = mpmath.mpf(q)
        E = mpmath.expm(M * mpmath.mpf(dt))
        F = E[k:, k:].T
        Q = F * E[:k, k:]
        return (np.array(F.tolist(), dtype=float), np.array(Q.tolist(), dtype=float))


@pytest.mark.parametrize("order", [1, 2], ids=["constant_velocity", "constant_acceleration"])
def test_q_and_f_equal_mpmath_van_loan_at_every_dt(order):
    worst = 0.0
    for dt, q in ((dt, q) for dt in DTS for q in (1.0, 2.5e-3, 7e4)):
        m = BUILDERS[order](dt, q, 1.0)
        F, Q = van_loan_mp(order, dt, q)
        worst = max(worst, float(np.max(np.abs(m.Q - Q) / np.abs(Q))))
        nz = F != 0
        assert np.array_equal(m.F != 0, nz), (dt, q)
        worst = max(worst, float(np.max(np.abs(m.F[nz] - F[nz]) / np.abs(F[nz]))))
    assert worst < 1e-15, worst  # was 0.5 (constant velocity) and 0.17 (acceleration)


def test_closed_forms_and_positive_definite_at_small_dt():
    for dt in (1e-8, 1e-4, 0.01, 1.0):
        cv = kd.constant_velocity(dt, accel_var=2.0, obs_var=1.0)
        want = 2.0 * np.array([[dt**3 / 3, dt**2 / 2], [dt**2 / 2, dt]])
        np.testing.assert_allclose(cv.Q, want, rtol=1e-15, atol=0)
        ca = kd.constant_acceleration(dt, jerk_var=3.0, obs_var=1.0)
        want = 3.0 * np.array(
            [
                [dt**5 / 20, dt**4 / 8, dt**3 / 6],
                [dt**4 / 8, dt**3 / 3, dt**2 / 2],
                [dt**3 / 6, dt**2 / 2, dt],
            ]
        )
        np.testing.assert_allclose(ca.Q, want, rtol=1e-15, atol=0)
        np.testing.assert_allclose(
            ca.F, [[1, dt, dt**2 / 2], [0, 1, dt], [0, 0, 1]], rtol=1e-15, atol=0
        )
        # the correlation matrix of the exact Q does not depend on dt; it is positive definite
        # (smallest eigenvalue 0.00953); the truncated exponential made it indefinite at 1e-4
        s = np.sqrt(np.diag(ca.Q))
        C = ca.Q / np.outer(s, s)
        np.testing.assert_allclose(
            C, [[1, math.sqrt(15) / 4, math.sqrt(5) / 3], [math.sqrt(15) / 4, 1, math.sqrt(3) / 2],
                [math.sqrt(5) / 3, math.sqrt(3) / 2, 1]], rtol=1e-15,
        )  # fmt: skip
        assert np.linalg.eigvalsh(C)[0] > 0.009
        np.linalg.cholesky(ca.Q)  # no LinAlgError


def test_time_varying_dt_and_several_axes():
    dts = np.array([1e-12, 1e-6, 1e-4, 0.01, 1.0, 1e3, 0.0])
    m = kd.constant_acceleration(dts, jerk_var=0.5, obs_var=1.0, ndim=2)
    assert m.F.shape == m.Q.shape == (7, 6, 6)
    for t, dt in enumerate(dts):
        one = kd.constant_acceleration(float(dt), jerk_var=0.5, obs_var=1.0, ndim=2)
        assert np.array_equal(one.F, m.F[t]) and np.array_equal(one.Q, m.Q[t])
        if dt > 0:
            _, Q = van_loan_mp(2, dt, 0.5)
            for axis in range(2):
                block = m.Q[t, 3 * axis : 3 * axis + 3, 3 * axis : 3 * axis + 3]
                np.testing.assert_allclose(block, Q, rtol=1e-15, atol=0)
            assert not m.Q[t, :3, 3:].any()
    assert not m.Q[-1].any() and np.array_equal(m.F[-1], np.eye(6))  # dt = 0: nothing moves


def test_extreme_scales_and_a_step_beyond_float64():
    # q dt^5 / 20 = 5e-52: right although dt^5 alone underflows (the matrix exponential gave 0)
    m = kd.constant_acceleration(1e-70, jerk_var=1e300, obs_var=1.0)
    np.testing.assert_allclose(m.Q[0, 0], 5e-52, rtol=1e-15)
    np.testing.assert_allclose(m.Q[2, 2], 1e230, rtol=1e-15)
    want = (
        r"^dt: expected steps whose F and Q fit in float64 \(jerk_var \* dt\^5 and dt\^2 below "
        r"1\.8e308\), got a step of 1e\+70"
    )
    with pytest.raises(ValueError, match=want):
        kd.constant_acceleration([1.0, 1e70], jerk_var=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match=r"^accel_var: expected a finite number >= 0"):
        kd.constant_velocity(1.0, accel_var=-1.0, obs_var=1.0)


def test_filter_of_a_100_hz_tracker_uses_the_exact_q():
    """The probe's consequence: log-likelihood 0.092 nats off, velocity sd 3 % off at dt=0.01."""
    rng = np.random.default_rng(0)
    dt, q, r, T = 0.01, 1.0, 1e-16, 300
    m = kd.constant_acceleration(dt, q, r)
    _, Qx = van_loan_mp(2, dt, q)
    L = np.linalg.cholesky(Qx)
    x, z = np.zeros(3), []
    for _ in range(T):
        x = m.F @ x + L @ rng.normal(size=3)
        z.append([x[0] + np.sqrt(r) * rng.normal()])
    z = np.array(z)
    fb = kd.filter(z, m.F, m.Q, m.H, m.R)
    fx = kd.filter(z, m.F, Qx, m.H, m.R)
    assert abs(fb.loglik - fx.loglik) < 1e-8 * abs(fx.loglik)
    np.testing.assert_allclose(fb.cov[5:, 1, 1], fx.cov[5:, 1, 1], rtol=1e-8)
