"""A diffuse state that no observation loads on and that a singular ``F`` forgets at some step
(``F_t[1, 1] = 0``: from then on it is 0 plus noise): the smoothed state stays diffuse before that
step (``cov`` inf, ``precision`` 0, the prior's mean) on every backend, the rest equal to the
mpmath oracle's exact diffuse smoother (``kalmanscan.validation.oracle.dense_oracle``, prior
``kappa I``). Formerly the scan's smoother returned NaN there and the native one a finite
variance."""

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

# native where its extension is built (a machine without a C compiler: the other two)
BACKENDS = ["native", "torch", "sequential"][0 if native.available() else 1 :]

T = 12
_Z = np.random.default_rng(3).normal(size=(T, 1))
_ZM = _Z.copy()
_ZM[[2, 3, 7]] = np.nan
_Q = np.diag([1.0, 0.5])
_H = np.array([[1.0, 0.0]])  # state 0 observed, state 1 never
_R = np.array([[0.3]])


def _forget(t):
    """[T, 2, 2]: an observed random walk beside an unobserved AR(1) that F_t sets to 0."""
    F = np.tile(np.diag([1.0, 0.9]), (T, 1, 1))
    F[t, 1, 1] = 0.0
    return F


# (z, F, the steps at which state 1 is diffuse in the exact smoother)
CASES = {
    "forgotten-at-5": (_Z, _forget(5), 5),
    "forgotten-at-5-missing": (_ZM, _forget(5), 5),
    "forgotten-at-first": (_Z, _forget(0), 0),  # the prior's diffuse state: nothing diffuse
    "forgotten-at-last": (_Z, _forget(T - 1), T - 1),
}
_BIG = 1e12  # an oracle variance above this is its kappa part (kappa = 1e26)


@functools.lru_cache
def _oracle(key):
    z, F, _ = CASES[key]
    return dense_oracle(z, F, _Q, _H, _R, dps=80)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", list(CASES))
def test_forgotten_diffuse_state_against_oracle(key, backend):
    z, F, nd = CASES[key]
    o = _oracle(key)
    big = np.abs(o.smooth_cov) > _BIG
    dif = np.zeros((T, 2, 2), dtype=bool)  # the exact pattern: state 1's variance (the states
    dif[:nd, 1, 1] = True  # are independent: covariance 0)
    assert (big == dif).all() and (o.smooth_cov[big] > 0).all()
    s = kd.smooth(z, F, _Q, _H, _R, backend=backend)
    assert np.isfinite(s.mean).all() and not np.isnan(s.cov).any()
    assert np.abs(s.mean - o.smooth_mean).max() <= 1e-12 * np.abs(o.smooth_mean).max()
    assert (np.isposinf(s.cov) == dif).all()
    fin = np.where(big, 0.0, o.smooth_cov)
    assert np.abs(np.where(dif, 0.0, s.cov) - fin).max() <= 1e-12 * np.abs(fin).max()
    prec = np.zeros_like(fin)  # the limit: the finite block's inverse on state 0, 0 along state 1
    for t in range(T):
        k = 1 if t < nd else 2
        prec[t, :k, :k] = np.linalg.inv(o.smooth_cov[t, :k, :k])
    assert np.abs(s.precision - prec).max() <= 1e-12 * np.abs(prec).max()
    # the filter is unaffected: diffuse where the exact filter is, equal to the oracle's
    f = kd.filter(z, F, _Q, _H, _R, backend=backend)
    assert (np.isposinf(f.cov) == (np.abs(o.cov) > _BIG)).all()
    assert np.abs(f.mean - o.mean).max() <= 1e-12 * np.abs(o.mean).max()


def test_forgotten_diffuse_state_float32_scan():
    z, F, nd = CASES["forgotten-at-5-missing"]
    o = _oracle("forgotten-at-5-missing")
    f32 = lambda x: x.astype(np.float32)  # noqa: E731
    s = kd.smooth(f32(z), f32(F), f32(_Q), f32(_H), f32(_R), backend="torch")
    assert s.mean.dtype == np.float32 and np.isfinite(s.mean).all()
    assert np.isposinf(s.cov[:nd, 1, 1]).all() and np.isfinite(s.cov[nd:]).all()
    assert (s.precision[:nd, 1] == 0).all()
    assert np.abs(s.mean - o.smooth_mean).max() <= 1e-5 * np.abs(o.smooth_mean).max()
