"""The reference smoother (``backend="sequential"``) with a diffuse direction that no observation
resolves: that direction stays diffuse (``cov`` inf, ``precision`` 0, the mean's component along
it from the prior), the rest equals the mpmath oracle's exact diffuse smoother
(``kalmanscan.validation.oracle.dense_oracle``, prior ``kappa I`` on the diffuse coordinates).
Formerly every smoothed moment of such a series was NaN."""

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.validation.oracle import dense_oracle

T = 12
_Z = np.random.default_rng(3).normal(size=(T, 1))
_ZM = _Z.copy()
_ZM[[2, 3, 7]] = np.nan
_R = np.array([[0.3]])
_H2 = np.array([[1.0, 0.0]])
_ROT = np.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2)  # rows: x0 - x1, x0 + x1


def _coupled_h(first_x1, first_x2):
    """[T, 1, 3]: state 0 observed throughout, state 1 from step ``first_x1``, state 2 from
    ``first_x2`` (None: never)."""
    H = np.zeros((T, 1, 3))
    H[:, 0, 0] = 1.0
    H[first_x1:, 0, 1] = 1.0
    if first_x2 is not None:
        H[first_x2:, 0, 2] = 1.0
    return H


_F3 = np.array([[1.0, 0.0, 0.0], [0.0, 0.9, 0.0], [0.0, 0.2, 0.5]])  # state 1 feeds state 2
_Q3 = np.diag([1.0, 0.3, 0.2])
_F_FORGET = np.tile(np.diag([1.0, 0.9]), (T, 1, 1))
_F_FORGET[5, 1, 1] = 0.0  # the unobserved diffuse state forgotten at step 5

# (z, F, Q, H, prior_cov or None = fully diffuse, rotation making the never-resolved
# directions coordinates)
CASES = {
    # observed random walk + an unobserved diffuse random walk
    "n2-unobserved-rw": (_Z, np.eye(2), np.diag([1.0, 0.5]), _H2, None, np.eye(2)),
    # ... an unobserved diffuse AR(1), entries missing
    "n2-unobserved-ar-missing": (
        _ZM,
        np.diag([1.0, 0.7]),
        np.diag([1.0, 0.5]),
        _H2,
        None,
        np.eye(2),
    ),
    # correlated noise: the data inform the unobserved state's increments, not its level
    "n2-unobserved-rw-correlated-q": (
        _ZM,
        np.eye(2),
        np.array([[1.0, 0.4], [0.4, 0.5]]),
        _H2,
        None,
        np.eye(2),
    ),
    # only x0 - x1 observed, both diffuse: x0 + x1 never resolved (a combination of states)
    "n2-difference-observed": (
        _Z,
        np.eye(2),
        np.diag([1.0, 0.5]),
        np.array([[1.0, -1.0]]),
        None,
        _ROT,
    ),
    "n2-difference-observed-f08-missing": (
        _ZM,
        0.8 * np.eye(2),
        np.eye(2),
        np.array([[1.0, -1.0]]),
        None,
        _ROT,
    ),
    # state 1 observed from step 6, state 2 (fed by state 1) never: the smoothed state 2 takes
    # the resolved state 1's share (the prior's kappa I on x_0, not an orthogonal split at t)
    "n3-late-and-never-coupled": (_Z, _F3, _Q3, _coupled_h(6, None), None, np.eye(3)),
    # the same, state 2 resolved late (step 9): nothing left diffuse by the smoother
    "n3-late-and-later-coupled": (_Z, _F3, _Q3, _coupled_h(6, 9), None, np.eye(3)),
    # unobserved diffuse state that a singular F forgets at step 5: diffuse before, gone after
    "n2-unobserved-forgotten": (_Z, _F_FORGET, np.diag([1.0, 0.5]), _H2, None, np.eye(2)),
    # a diffuse state never observed beside a proper correlated block
    "n3-partly-diffuse": (
        _Z,
        np.diag([1.0, 0.9, 0.5]),
        np.diag([1.0, 0.3, 0.2]),
        np.array([[0.0, 1.0, 0.0]]),
        np.array([[np.inf, 0, 0], [0, 1.0, 0.3], [0, 0.3, 2.0]]),
        np.eye(3),
    ),
}
_BIG = 1e12  # an oracle variance above this is its kappa part (kappa = 1e26)


def _rotated(F, Q, H, rot):
    """The model in the coordinates ``rot x`` (orthogonal ``rot``: the prior's kappa I is kept),
    with the rotation's rounding residue set to the exact 0 it stands for."""
    Fr = np.einsum("ij,...jk,lk->...il", rot, F, rot)
    out = [Fr, rot @ Q @ rot.T, H @ rot.T]
    for X in out:
        X[np.abs(X) < 1e-15] = 0.0
    return out


@functools.lru_cache
def _truth(key):
    """(oracle result, exact precision [T, n, n]): the precision's limit is the inverse of the
    finite block on the resolved coordinates of the rotated model, 0 along the rest."""
    z, F, Q, H, P0, rot = CASES[key]
    o = dense_oracle(z, F, Q, H, _R, prior_cov=P0, dps=80)
    Fr, Qr, Hr = _rotated(F, Q, H, rot)
    C = dense_oracle(z, Fr, Qr, Hr, _R, prior_cov=P0, dps=80).smooth_cov
    prec = np.zeros_like(C)
    for t in range(T):
        res = np.flatnonzero(np.abs(np.diagonal(C[t])) < _BIG)
        prec[t][np.ix_(res, res)] = np.linalg.inv(C[t][np.ix_(res, res)])
    return o, np.einsum("ji,tjk,kl->til", rot, prec, rot)


@pytest.mark.parametrize("key", list(CASES))
def test_never_resolved_direction_stays_diffuse_against_oracle(key):
    z, F, Q, H, P0, _ = CASES[key]
    o, prec = _truth(key)
    s = kd.smooth(z, F, Q, H, _R, prior_cov=P0, backend="sequential")
    assert np.isfinite(s.mean).all() and not np.isnan(s.cov).any()
    assert np.isfinite(s.precision).all()
    assert np.abs(s.mean - o.smooth_mean).max() <= 1e-13 * max(np.abs(o.smooth_mean).max(), 1)
    big = np.abs(o.smooth_cov) > _BIG
    assert (np.isposinf(s.cov) == (big & (o.smooth_cov > 0))).all()
    assert (np.isneginf(s.cov) == (big & (o.smooth_cov < 0))).all()
    fin = np.where(big, 0.0, o.smooth_cov)
    assert np.abs(np.where(big, 0.0, s.cov) - fin).max() <= 1e-13 * np.abs(fin).max()
    assert np.abs(s.precision - prec).max() <= 1e-12 * np.abs(prec).max()


@pytest.mark.parametrize("key", ["n2-unobserved-ar-missing", "n3-late-and-never-coupled"])
def test_never_resolved_direction_matches_the_scan(key):
    z, F, Q, H, P0, _ = CASES[key]
    s = kd.smooth(z, F, Q, H, _R, prior_cov=P0, backend="sequential")
    r = kd.smooth(z, F, Q, H, _R, prior_cov=P0, backend="torch")
    assert np.abs(s.mean - r.mean).max() <= 1e-13 * np.abs(r.mean).max()
    fin = np.isfinite(r.cov)
    assert (np.isfinite(s.cov) == fin).all()
    assert np.abs(s.cov[fin] - r.cov[fin]).max() <= 1e-13 * np.abs(r.cov[fin]).max()
    assert np.abs(s.precision - r.precision).max() <= 1e-12 * np.abs(r.precision).max()
