"""The filtered precision along diffuse directions that no observation ever resolves, against
the mpmath oracle's exact diffuse filter (``kalmanscan.validation.oracle.dense_oracle``, kappa =
1e26: an entry above 1e12 is kappa's); the cases of tests/test_dense_sequential_nan_cases.py.

The limit is 0 along a direction still diffuse and the inverse of the finite block on the
resolved coordinates elsewhere. Every backend read the diffuse directions off the numerical
range of kappa's coefficient (``D D'`` in the reference filter, ``A_t PiK_t A_t'`` in the scan),
which loses the second of two directions that ``F`` mixes once its share falls below the
rounding (after about 26 steps), and a direction 3e-15 of the largest eigenvalue (the coupled
case's steps 2-3): the precision was finite along it, up to 7.67 off (the coupled case's steps
2-3), 3.0 (an observed random walk beside the mixed pair, steps 29-39) and 0.68 (the pair alone,
steps 26-39). The scan's coefficient also kept rounding in the rows of the observed coordinate,
which tilted the precision's complement: ``x0``'s precision 3e-9 off (steps 16-25 of the coupled
case at length 30). The filtered coefficient is now completed on the range that the never
resolved directions reach at each step, as the smoother's is."""

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from tests.test_dense_sequential_nan_cases import _BIG, CASES, _oracle

_BACKENDS = ["sequential", "torch", "native"][: 3 if native.available() else 2]


def _limit_precision(cov):
    """[T, n, n] the oracle's filtered precision in the limit: the inverse of the finite block on
    the coordinates whose variance is finite, 0 along the rest (here the unresolved directions
    are coordinates)."""
    prec = np.zeros_like(cov)
    for t in range(cov.shape[0]):
        res = np.flatnonzero(np.abs(np.diagonal(cov[t])) < _BIG)
        prec[t][np.ix_(res, res)] = np.linalg.inv(cov[t][np.ix_(res, res)])
    return prec


# native where its extension is built (it hands a never resolved direction to the torch path)
@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("key", list(CASES))
def test_filtered_precision_unresolved_against_oracle(key, backend):
    z, F, Q, H, R = CASES[key]
    o = _oracle(key)
    f = kd.filter(z, F, Q, H, np.array(R), backend=backend)
    want = _limit_precision(o.cov)
    assert not np.isnan(f.precision).any()
    assert np.abs(f.precision - want).max() <= 1e-11 * np.abs(want).max()
    # the covariance's +-inf where the oracle's entry grows with kappa, unchanged
    big = np.abs(o.cov) > _BIG
    np.testing.assert_array_equal(np.isposinf(f.cov), big & (o.cov > 0))
    np.testing.assert_array_equal(np.isneginf(f.cov), big & (o.cov < 0))


@pytest.mark.parametrize("backend", _BACKENDS)
def test_filtered_precision_same_from_smooth(backend):
    """The filter's outputs of ``smooth`` are those of ``filter`` (the completion applies to the
    outputs; the smoother starts from the filter's own moments)."""
    z, F, Q, H, R = CASES["mixed-beside-rw-T40"]
    f = kd.filter(z, F, Q, H, np.array(R), backend=backend)
    s = kd.smooth(z, F, Q, H, np.array(R), backend=backend)
    for a, b in zip(f, s.filtered, strict=True):
        np.testing.assert_array_equal(a, b)
