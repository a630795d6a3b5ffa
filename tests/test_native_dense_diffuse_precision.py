"""The native filter's precision at the steps whose filtered state is still diffuse, against the
limit of the mpmath oracle (models whose diffuse directions are all resolved, so native keeps
them: every state diffuse at the start, observed through one row, the first entries missing).

The native filter took it as ``Pk (Pk P Pk + tau Pd)^-1 Pk``, ``Pk = I - Pd`` and ``Pd`` the
projector on the diffuse directions. Where every direction is diffuse, ``Pk`` holds only
rounding (1e-16 entries, not 0), which the inverse of a block that is all rounding made O(1): at
the steps before the first observation, where the limit is 0, 0.12 (mix3-gap2), 0.24
(mix2-gap3), 0.45 (rot3-gap1, rot3-gap2-small) and 0.11 (orth6-gap2) of the largest entry of
the limit over the series (the torch and sequential paths: exactly 0). It is now
``Z (Z' P Z)^-1 Z'``, ``Z`` an orthonormal basis of the complement of the diffuse directions, as
the torch path's (``kalmanscan.dense.parallel.precision_of``): exactly 0 along them.

Truth: the information filter from a zero prior precision in mpmath at 60 digits (the limit
itself, with no kappa: the predicted precision
``Q^-1 - Q^-1 F (L + F' Q^-1 F)^-1 F' Q^-1``, then ``+ H' R^-1 H`` where observed), checked here
against ``kalmanscan.validation.oracle.dense_oracle`` (kappa = 1e26): the inverse of its
covariance where the state is proper, and a null space that holds its kappa part where diffuse.
"""

from __future__ import annotations

import functools

import mpmath as mp
import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

_BACKENDS = ["native", "torch", "sequential"] if native.available() else ["torch", "sequential"]


def _z(T, seed, gap):
    z = np.random.default_rng(seed).normal(size=(T, 1))
    z[:gap] = np.nan
    return z


_E0_2, _E0_3 = np.array([[1.0, 0.0]]), np.array([[1.0, 0.0, 0.0]])
_MIX3 = np.array([[0.9, 0.3, 0.0], [0.2, 0.8, 0.1], [0.1, 0.0, 0.7]])
_ROT3 = 0.95 * np.array([[0.6, -0.8, 0.0], [0.48, 0.36, -0.8], [0.64, 0.48, 0.6]])


def _orth6():
    """Six states (native's vectorized inverse): F 0.95 times a random orthogonal matrix, one
    random row observed from step 2."""
    rng = np.random.default_rng(6)
    F = 0.95 * np.linalg.qr(rng.normal(size=(6, 6)))[0]
    Q, H = np.diag(rng.uniform(0.2, 1.0, 6)), rng.normal(size=(1, 6))
    return _z(12, 6, 2), F, Q, H, np.array([[0.4]])


# (z, F, Q, H, R): every state diffuse before step 0, all resolved by the observed row
CASES = {
    # three states F mixes, x0 observed from step 2
    "mix3-gap2": (_z(10, 1, 2), _MIX3, np.diag([1.0, 0.5, 0.2]), _E0_3, np.array([[0.3]])),
    # two states F mixes, x0 observed from step 3
    "mix2-gap3": (
        _z(10, 2, 3),
        np.array([[0.9, 0.3], [0.2, 0.8]]),
        np.diag([1.0, 0.5]),
        _E0_2,
        np.array([[0.3]]),
    ),
    # a damped rotation of three states, x0 + x1 observed from step 1
    "rot3-gap1": (
        _z(10, 3, 1),
        _ROT3,
        np.diag([0.4, 0.3, 0.2]),
        np.array([[1.0, 1.0, 0.0]]),
        np.array([[0.5]]),
    ),
    # the same at a small scale (Q, R 1e-8): the finite block's scale is not 1
    "rot3-gap2-small": (
        _z(10, 4, 2),
        _ROT3,
        1e-8 * np.diag([0.4, 0.3, 0.2]),
        np.array([[1.0, 1.0, 0.0]]),
        np.array([[5e-9]]),
    ),
    "orth6-gap2": _orth6(),
}


@functools.lru_cache
def _limit(key, dps=60):
    """[T, n, n] the filtered precision in the diffuse limit (the information filter from L = 0)."""
    z, F, Q, H, R = CASES[key]
    n = F.shape[0]
    with mp.workdps(dps):
        M = lambda a: mp.matrix(np.asarray(a, dtype=np.float64).tolist())  # noqa: E731
        Fm, Qi = M(F), mp.inverse(M(Q))
        L, out = mp.zeros(n, n), []
        for t in range(len(z)):
            L = Qi - Qi * Fm * mp.inverse(L + Fm.T * Qi * Fm) * Fm.T * Qi
            o = ~np.isnan(z[t])
            if o.any():
                Ho = M(H[o])
                L = L + Ho.T * mp.inverse(M(R[np.ix_(o, o)])) * Ho
            L = (L + L.T) / 2
            out.append(np.array(L.tolist(), dtype=np.float64))
    return np.array(out)


@functools.lru_cache
def _oracle(key):
    z, F, Q, H, R = CASES[key]
    return dense_oracle(z, F, Q, H, R, dps=80)


def _first_observed(key):
    z = CASES[key][0]
    return int(np.flatnonzero(~np.isnan(z).all(-1))[0])


@pytest.mark.parametrize("key", list(CASES))
def test_limit_is_the_dense_oracles(key):
    """The truth here against the project's oracle: the inverse of its covariance where the
    state is proper; where diffuse, ``L cov`` is kappa-free (its kappa part is in the null
    space: ``|L cov|`` at rounding of ``|L| |cov|``, cov's entries 1e26 there), and the state is
    diffuse at the steps before the first observation and some after (the case is one)."""
    want, o = _limit(key), _oracle(key)
    t0, scale = _first_observed(key), np.abs(want).max()
    assert o.diffuse[: t0 + 1].all() and not o.diffuse[-1]
    assert np.abs(want[:t0]).max(initial=0.0) <= 1e-40 * scale  # nothing known yet: 0
    for t in range(len(want)):
        if o.diffuse[t]:
            assert np.abs(o.cov[t]).max() > 1e20
            got = np.abs(want[t] @ o.cov[t]).max()
            assert got <= 1e-12 * scale * np.abs(o.cov[t]).max()
        else:
            inv = np.linalg.inv(o.cov[t])
            assert np.abs(inv - want[t]).max() <= 1e-12 * np.abs(want[t]).max()


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("key", list(CASES))
def test_filtered_precision_at_diffuse_steps_against_oracle(key, backend):
    """Every step within 1e-11 of the largest entry of the limit; exactly 0 where every direction
    is diffuse (before the first observation)."""
    z, F, Q, H, R = CASES[key]
    want = _limit(key)
    f = kd.filter(z, F, Q, H, R, backend=backend)
    np.testing.assert_array_equal(f.diffuse, _oracle(key).diffuse)
    assert not np.isnan(f.precision).any()
    t0 = _first_observed(key)
    np.testing.assert_array_equal(f.precision[:t0], 0.0)
    err = np.abs(f.precision - want).max(axis=(-2, -1))
    assert err.max() <= 1e-11 * np.abs(want).max(), err


@pytest.mark.parametrize("backend", _BACKENDS)
def test_filtered_precision_diffuse_batch_and_smooth(backend):
    """A batch of the cases of one shape gives each its own precision, and ``smooth``'s filtered
    precision is ``filter``'s."""
    keys = ["mix3-gap2", "rot3-gap1", "rot3-gap2-small"]
    z = np.stack([CASES[k][0] for k in keys])
    F, Q, H, R = (np.stack([CASES[k][i] for k in keys])[:, None] for i in range(1, 5))
    f = kd.filter(z, F, Q, H, R, axis=1, backend=backend)
    assert f.precision.shape == (3, 10, 3, 3)
    for b, key in enumerate(keys):
        want = _limit(key)
        assert np.abs(f.precision[b] - want).max() <= 1e-11 * np.abs(want).max()
    s = kd.smooth(z, F, Q, H, R, axis=1, backend=backend)
    np.testing.assert_array_equal(s.filtered.precision, f.precision)
