"""Model builders of kalmanscan.dense: exact discretizations and structure."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import kalmanscan
import kalmanscan.dense as kd


@pytest.mark.parametrize("dt", [0.0, 0.1, 2.5])
def test_constant_velocity_closed_form(dt):
    q = 0.7
    m = kd.constant_velocity(dt, accel_var=q, obs_var=1.0)
    np.testing.assert_allclose(m.F, [[1.0, dt], [0.0, 1.0]], atol=1e-15)
    Q = q * np.array([[dt**3 / 3, dt**2 / 2], [dt**2 / 2, dt]])
    np.testing.assert_allclose(m.Q, Q, rtol=1e-13, atol=1e-16)
    np.testing.assert_array_equal(m.H, [[1.0, 0.0]])


def test_constant_acceleration_against_scipy_quadrature():
    dt, q = 0.8, 1.3
    m = kd.constant_acceleration(dt, jerk_var=q, obs_var=0.5)
    A = np.diag([1.0, 1.0], 1)
    np.testing.assert_allclose(m.F, scipy.linalg.expm(A * dt), rtol=1e-14)
    s = np.linspace(0.0, dt, 2001)
    L = np.array([0.0, 0.0, 1.0])
    integrand = np.stack(
        [scipy.linalg.expm(A * u) @ np.outer(L, L) @ scipy.linalg.expm(A * u).T * q for u in s]
    )
    Q = scipy.integrate.simpson(integrand, x=s, axis=0)
    np.testing.assert_allclose(m.Q, Q, rtol=1e-9, atol=1e-12)


def test_per_step_dt_and_several_axes():
    dt = np.array([0.5, 1.0, 0.0, 2.0])
    m = kd.constant_velocity(dt, accel_var=1.0, obs_var=1.0, ndim=2)
    assert m.F.shape == (4, 4, 4) and m.Q.shape == (4, 4, 4) and m.H.shape == (2, 4)
    np.testing.assert_allclose(m.F[3][:2, :2], [[1.0, 2.0], [0.0, 1.0]])
    np.testing.assert_array_equal(m.F[3][:2, 2:], 0.0)
    np.testing.assert_array_equal(m.Q[2], 0.0)  # dt = 0: no noise
    z = np.random.default_rng(0).normal(size=(4, 2))
    res = kd.filter(z, **m._asdict(), prior_cov=np.eye(4))
    ref = kd.filter(z, **m._asdict(), prior_cov=np.eye(4), backend="sequential")
    np.testing.assert_allclose(res.mean, ref.mean, rtol=1e-10, atol=1e-12)


def test_seasonal_dummies_sum_to_zero_without_noise():
    m = kd.seasonal_dummies(4, seasonal_var=0.0)
    x = np.array([1.0, -2.0, 0.5])
    seq = []
    for _ in range(8):
        x = m.F @ x
        seq.append(x[0])
    seq = np.array(seq)
    np.testing.assert_allclose(seq[:4].sum(), 0.0, atol=1e-12)
    np.testing.assert_allclose(seq[4:], seq[:4])  # period 4


def test_ou_sum_uses_discretize_ou_and_filters():
    theta, s2, dt = np.array([0.1, 3.0]), np.array([1.0, 0.4]), 0.5
    m = kd.ou_sum(theta, s2, dt=dt, obs_var=0.2, mu=[1.0, -1.0])
    a, p = kalmanscan.discretize_ou(theta, s2, dt)
    np.testing.assert_allclose(np.diag(m.F), a)
    np.testing.assert_allclose(np.diag(m.Q), p)
    np.testing.assert_allclose(m.offset, np.array([1.0, -1.0]) * (1 - a))
    z = np.random.default_rng(1).normal(size=(63, 1))
    res = kd.smooth(z, **m._asdict(), prior_cov=np.eye(2))
    ref = kd.smooth(z, **m._asdict(), prior_cov=np.eye(2), backend="sequential")
    np.testing.assert_allclose(res.mean, ref.mean, rtol=1e-10, atol=1e-12)


def test_add_components_trend_plus_seasonal():
    m = kd.add_components(kd.local_linear_trend(0.1, 0.01, 0.5), kd.seasonal_dummies(4, 0.05))
    assert m.F.shape == (5, 5)
    np.testing.assert_array_equal(m.H, [[1.0, 0.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(m.R, [[0.5]])
    t = np.arange(80.0)
    z = (
        0.05 * t
        + np.tile([1.0, -1.0, 0.5, -0.5], 20)
        + np.random.default_rng(2).normal(scale=0.3, size=80)
    )[:, None]
    res = kd.smooth(z, **m._asdict())  # fully diffuse: five directions resolved after five steps
    ref = kd.smooth(z, **m._asdict(), backend="sequential")
    assert res.filtered.diffuse[:4].all() and not res.filtered.diffuse[4:].any()
    np.testing.assert_allclose(res.filtered.loglik, ref.filtered.loglik, rtol=1e-10)
    np.testing.assert_allclose(res.mean, ref.mean, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: kd.local_linear_trend(-1.0, 0.1, 1.0), "level_var"),
        (lambda: kd.seasonal_dummies(1, 0.1), "period"),
        (lambda: kd.constant_velocity(-0.1, 1.0, 1.0), "dt"),
        (lambda: kd.ou_sum([1.0, 2.0], [1.0], 1.0, 1.0), "theta, sigma2"),
    ],
    ids=["negative-variance", "period-1", "negative-dt", "ou-lengths"],
)
def test_builder_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
