"""Two or more diffuse directions that ``F`` mixes are correlated: the covariance between two
diffuse coordinates grows with kappa (the prior's ``kappa I``) wherever kappa's coefficient
``D[i, j]`` is not 0, and is then ``+-inf`` (the sign of ``D[i, j]``), not the finite part.
Checked against the mpmath oracle's exact diffuse moments
(``kalmanscan.validation.oracle.dense_oracle``, kappa = 1e26: an entry above 1e12 is kappa's)
on every backend, filter and smoother: states never observed (all of them, or beside an observed
one, or seen only through a combination orthogonal to both), the unresolved part of a filtered
diffuse block whose resolved direction ``F`` feeds into it, and a local linear trend whose first
observations are missing (diffuse, then resolved). Formerly the entries between two diffuse
coordinates were the projector's (0 for two directions: ``Pd = I``), so ``cov`` held a finite
number there (the oracle: 4.2e25, i.e. 0.42 kappa)."""

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

# native where its extension is built (a machine without a C compiler: the other two)
BACKENDS = ["native", "torch", "sequential"][0 if native.available() else 1 :]

T = 10
_Z = np.random.default_rng(5).normal(size=(T, 1))
_ZM = _Z.copy()
_ZM[[0, 1, 2]] = np.nan  # the first steps missing: the whole state diffuse there
_R = np.array([[0.3]])
_MIX = np.array([[0.9, 0.3], [0.2, 0.8]])
_ROT = np.array([[0.6, -0.8], [0.8, 0.6]])  # keeps kappa I: no correlation (finite entries)


def _beside(a, block):
    """[3, 3]: an AR(1) state 0 (0.95) feeding ``a`` of itself into state 1 of the 2x2 block."""
    F = np.zeros((3, 3))
    F[0, 0] = 0.95
    F[1, 0] = a
    F[1:, 1:] = block
    return F


# (z, F, Q, H)
CASES = {
    # two unobserved diffuse states that F mixes (no observation loads on either)
    "n2-mixed-unobserved": (_Z, _MIX, np.diag([1.0, 0.5]), np.zeros((1, 2))),
    # an observed random walk beside them
    "n3-observed-beside-mixed": (
        _Z,
        np.block([[np.eye(1), np.zeros((1, 2))], [np.zeros((2, 1)), _MIX]]),
        np.diag([1.0, 0.3, 0.2]),
        np.array([[1.0, 0.0, 0.0]]),
    ),
    # x0 - x1 observed, x2 never: x0 + x1 and x2, mixed by F, never resolved
    "n3-orthogonal-combination": (
        _Z,
        np.array([[0.9, 0.0, 0.2], [0.0, 0.9, 0.2], [0.1, 0.1, 0.7]]),
        np.diag([1.0, 0.5, 0.3]),
        np.array([[1.0, -1.0, 0.0]]),
    ),
    # steps 0-2 missing: three diffuse directions; state 0 resolved at step 3 fed states 1, 2,
    # whose smoothed kappa part is what remains of the filtered one (not a projector)
    "n3-resolved-feeds-unresolved": (
        _ZM,
        _beside(3.0, _MIX),
        np.diag([1.0, 0.3, 0.2]),
        np.array([[1.0, 0.0, 0.0]]),
    ),
    # the same with a rotation block: states 1, 2 stay uncorrelated (finite entries), and the
    # cancellation of state 0's 30-fold larger kappa part must not make them infinite
    "n3-resolved-feeds-rotation": (
        _ZM,
        _beside(30.0, _ROT),
        np.diag([1.0, 0.3, 0.2]),
        np.array([[1.0, 0.0, 0.0]]),
    ),
    # a local linear trend with steps 0-2 missing: level and slope diffuse and correlated there
    "llt-first-missing": (
        _ZM,
        np.array([[1.0, 1.0], [0.0, 1.0]]),
        np.diag([1.0, 0.5]),
        np.array([[1.0, 0.0]]),
    ),
}
_BIG = 1e12  # an oracle entry above this is its kappa part (kappa = 1e26)


@functools.lru_cache
def _oracle(key):
    z, F, Q, H = CASES[key]
    return dense_oracle(z, F, Q, H, _R, dps=80)


def _check(cov, want, mean, want_mean):
    """``cov`` +-inf exactly where ``want`` (the oracle's) grows with kappa, with its sign, and
    equal to it elsewhere; the mean equal to the oracle's."""
    big = np.abs(want) > _BIG
    assert not np.isnan(cov).any()
    np.testing.assert_array_equal(np.isposinf(cov), big & (want > 0))
    np.testing.assert_array_equal(np.isneginf(cov), big & (want < 0))
    fin = np.where(big, 0.0, want)
    assert np.abs(np.where(big, 0.0, cov) - fin).max() <= 1e-11 * np.abs(fin).max()
    assert np.abs(mean - want_mean).max() <= 1e-11 * np.abs(want_mean).max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", list(CASES))
def test_correlated_diffuse_entries_against_oracle(key, backend):
    z, F, Q, H = CASES[key]
    o = _oracle(key)
    s = kd.smooth(z, F, Q, H, _R, backend=backend)
    _check(s.filtered.cov, o.cov, s.filtered.mean, o.mean)
    _check(s.cov, o.smooth_cov, s.mean, o.smooth_mean)
    # the case is what it claims: two diffuse coordinates correlated at some step (the
    # rotation's only in the filter, before state 0 is resolved; its smoothed states 1 and 2
    # diffuse and uncorrelated)
    off = ~np.eye(F.shape[-1], dtype=bool)
    sm = np.abs(o.smooth_cov) > _BIG
    assert ((np.abs(o.cov) > _BIG) & off).any()
    if key == "n3-resolved-feeds-rotation":
        assert sm[:, 1, 1].all() and sm[:, 2, 2].all() and not (sm & off).any()
    elif key != "llt-first-missing":  # (resolved: nothing diffuse in the smoother)
        assert (sm & off).any()


@pytest.mark.parametrize("key", ["n3-observed-beside-mixed", "llt-first-missing"])
def test_correlated_diffuse_entries_float32_scan(key):
    z, F, Q, H = CASES[key]
    o = _oracle(key)
    f32 = lambda x: x.astype(np.float32)  # noqa: E731
    s = kd.smooth(f32(z), f32(F), f32(Q), f32(H), f32(_R), backend="torch")
    for cov, want in ((s.filtered.cov, o.cov), (s.cov, o.smooth_cov)):
        big = np.abs(want) > _BIG
        np.testing.assert_array_equal(np.isposinf(cov), big & (want > 0))
        np.testing.assert_array_equal(np.isneginf(cov), big & (want < 0))
