"""The exact diffuse filter where a direction of kappa's coefficient fades below the rounding
before an observation resolves it, against the mpmath oracle's exact diffuse filter
(``kalmanscan.validation.oracle.dense_oracle``; 200 digits, kappa = 1e66: an entry above 1e12 is
kappa's; its log-likelihood the same at 160 digits).

Two states that ``F = [[0.9, 0.3], [0.2, 0.8]]`` mixes (eigenvalues 1.0024 and 0.5876), both
diffuse and unobserved for a gap: the diffuse factor ``D = F^t`` keeps the second direction's
share ``(0.5876 / 1.0024)^t`` only to ``eps`` of the first (below ``2^-16`` after 21 steps, below
the rounding after about 68), though kappa times it is still unbounded. Formerly the
log-likelihood was NaN at a 40-step gap (the pdet of ``H D D' H'`` took a negative eigenvalue),
1.27 off at a 45-step gap (the factor dropped the direction as dependent), -inf or 6.06 off with
an observed state beside the pair; and the filtered precision was finite along the faded
direction during the gap (0.16 off; the limit is 0). The reference now carries ``D = Qa Ra``
(QR, propagated as ``F Qa = Q1 R1``, ``Ra <- R1 Ra``), which keeps each direction to its own
scale; the smoothed moments, whose covariance at the first steps is 1e17 along one direction
and O(1) along the other, are checked to the digits that float64 holds there.
"""

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.validation.oracle import dense_oracle
from tests.helpers import check_faded_filter

_BIG = 1e12  # an oracle entry above this is its kappa part (kappa = 1e66)
_MIX = np.array([[0.9, 0.3], [0.2, 0.8]])
_SLOW_MIX = np.array([[1.0, 0.0, 0.0], [0.0, 0.99, 0.05], [0.0, 0.1, 0.6]])
_MIX3 = np.array([[1.0, 0.0, 0.0], [0.0, 0.9, 0.3], [0.0, 0.2, 0.8]])


def _pair(T, gap):
    """The pair alone, both states observed from step ``gap``."""
    z = np.random.default_rng(5).normal(size=(T, 2))
    z[:gap] = np.nan
    return z, _MIX, np.diag([1.0, 0.5]), np.eye(2), np.diag([0.3, 0.4])


def _beside(F, T, gap):
    """An observed random walk (state 0, observed throughout) beside a pair that ``F`` mixes,
    the pair observed from step ``gap``."""
    z = np.random.default_rng(7).normal(size=(T, 3))
    z[:gap, 1:] = np.nan
    return z, F, np.diag([1.0, 0.3, 0.2]), np.eye(3), np.diag([0.3, 0.4, 0.5])


# (model, gap); HEAD's sequential log-likelihood in the comment
CASES = {
    "pair-T60-gap40": (_pair(60, 40), 40),  # nan (oracle -57.5421560056)
    "pair-T60-gap45": (_pair(60, 45), 45),  # -45.134 (oracle -43.866)
    "pair-T120-gap45": (_pair(120, 45), 45),  # -253.322 (oracle -252.054)
    "pair-T120-gap100": (_pair(120, 100), 100),  # -66.207 (oracle -64.685)
    "slow-mix-beside-rw-T60-gap40": (_beside(_SLOW_MIX, 60, 40), 40),  # -inf (oracle -142.070)
    "mix-beside-rw-T60-gap40": (_beside(_MIX3, 60, 40), 40),  # -137.054 (oracle -143.115)
}


@functools.lru_cache
def _oracle(key, dps=200):
    return dense_oracle(*CASES[key][0], dps=dps)


@pytest.mark.parametrize("key", list(CASES))
def test_case_is_what_it_claims(key):
    """The pair is diffuse (its coordinates kappa's) up to the step before the gap ends, its
    second direction's share of ``F^gap`` is below ``2^-16``, and the oracle's log-likelihood
    is the same at 160 and 200 digits."""
    (z, F, *_), gap = CASES[key]
    o = _oracle(key)
    pair = slice(F.shape[-1] - 2, None)
    assert (np.abs(np.diagonal(o.cov[gap - 1]))[pair] > _BIG).all()
    assert (np.abs(np.diagonal(o.cov[gap:], axis1=1, axis2=2)) < _BIG).all()
    sv = np.linalg.svd(np.linalg.matrix_power(F[pair, pair], gap), compute_uv=False)
    assert sv[-1] < 2.0**-16 * sv[0]
    assert abs(_oracle(key, 160).loglik - o.loglik) <= 1e-13 * abs(o.loglik)


@pytest.mark.parametrize("key", list(CASES))
def test_sequential_filter_against_oracle(key):
    f = kd.filter(*CASES[key][0], backend="sequential")
    check_faded_filter(f, _oracle(key), 1e-11)


@pytest.mark.parametrize("key", list(CASES))
def test_torch_filter_against_oracle(key):
    """The scan's diffuse head is the reference filter: the same figures. The 100-step gap of
    the pair passes the head's first 16 n + 64 = 96 steps, where the scan's information about
    x_0 held the faded direction to eps of the first (log-likelihood -30.97 against the
    oracle's -64.68); the head now runs on (tests/test_dense_faded_past_head.py)."""
    f = kd.filter(*CASES[key][0], backend="torch")
    check_faded_filter(f, _oracle(key), 1e-11)


@pytest.mark.parametrize("backend", ["sequential", "torch"])
@pytest.mark.parametrize("key", ["pair-T60-gap40", "slow-mix-beside-rw-T60-gap40"])
def test_smoother_against_oracle(key, backend):
    """The smoothed state before the gap ends is determined by the data after it through
    ``F^-t`` (variance 4e17 along the faded direction at step 0, O(1) across it), so float64
    holds it to ``eps`` times the square root of that spread: the mean within 1e-5 of its
    standard deviation and the covariance within 1e-6 of each step's largest entry (formerly
    +-inf at the first steps and the mean 0.35 standard deviations off)."""
    o = _oracle(key)
    s = kd.smooth(*CASES[key][0], backend=backend)
    assert np.isfinite(s.mean).all() and np.isfinite(s.cov).all()
    sd = np.sqrt(np.diagonal(o.smooth_cov, axis1=1, axis2=2))
    assert (np.abs(s.mean - o.smooth_mean) / sd).max() <= 1e-5
    scale = np.abs(o.smooth_cov).max((-1, -2), keepdims=True)
    assert (np.abs(s.cov - o.smooth_cov) / scale).max() <= 1e-6
