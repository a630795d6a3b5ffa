"""Dense models whose diffuse part is never resolved and grows without bound: a state ``x0``
(AR 0.95, observed from step 4) feeding ``1000 x0`` into two states that are never observed and
that ``F`` mixes explosively, against the mpmath oracle's exact diffuse smoother
(``kalmanscan.validation.oracle.dense_oracle``; at 200 digits, kappa = 1e66: its RTS gain
inverts the predicted covariance to 1e-100 relative, which the explosive part's 1e60 scale
beside ``x0``'s 0.1 needs, where 80 digits put the smoothed variance of ``x0`` 0.06 off).

- The reference filter took an entry as noise-free and determined (no information) where its
  variance ``f`` was below ``1e-13 |h|^2 tr(P)``: the finite part of the unobserved pair, grown
  past 1e13, made every later observation of ``x0`` skipped (at a growth of 1.4 a step from
  step 22: its filtered variance 0.48 off by step 29; at 1.1 a step from about step 75, 0.86
  off by step 140). The scale is now the entrywise bound of ``h' P h``'s rounding,
  ``|h|' |P| |h|``.
- Where the predicted covariance passes float64's range (growth 1000 a step: step 51, where the
  exact finite part's largest entry is 1.02e312 and 1.02e306 at step 50, mpmath at 400 digits;
  the filter said 52 while its factor of the diffuse part dropped x0's direction at step 3), the
  filter marks the series lost (its log-likelihood NaN, a ``RuntimeWarning`` naming it, NaN
  moments from that step on); the reference smoother then stopped with LAPACK's "eigh failed to
  converge" on the steps before (covariances up to 1e300). It now returns NaN smoothed moments
  for that series, as the warning says, and the other series of the batch as they are alone.
- The filtered precision was finite along the pair (1.15 of the largest off, every backend); it
  is 0 there now (tests/test_dense_filtered_precision_limits.py has the other cases).
- Where native hands such a model to the scan and the scan raises ``OverflowError``, the message
  said "backend 'torch'" and that native returns NaN with a warning; it names native now.
"""

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle
from tests.test_dense_filtered_precision_limits import _limit_precision
from tests.test_dense_sequential_nan_cases import _check_against_oracle

_Q, _H, _R = 0.1 * np.eye(3), np.array([[1.0, 0.0, 0.0]]), np.array([[0.5]])


def _F(g):
    """x0 feeds 1000 x0 into x1; the pair (x1, x2) mixed, its larger eigenvalue about g."""
    return np.array([[0.95, 0.0, 0.0], [1000.0, g, 0.3], [0.0, 0.2, 0.8]])


def _z(T, seed=0):
    z = np.random.default_rng(seed).normal(size=(T, 1))
    z[:4] = np.nan
    return z


@functools.lru_cache
def _oracle(g, T, dps):
    return dense_oracle(_z(T), _F(g), _Q, _H, _R, dps=dps)


def _x0_close(r, o, tol):
    """The finite moments of x0 (filtered and smoothed; from step 4, where it is observed)."""
    for got, want in ((r.filtered.cov, o.cov), (r.cov, o.smooth_cov)):
        assert np.abs(got[4:, 0, 0] - want[4:, 0, 0]).max() <= tol * np.abs(want[4:, 0, 0]).max()
    for got, want in ((r.filtered.mean, o.mean), (r.mean, o.smooth_mean)):
        assert np.abs(got[4:, 0] - want[4:, 0]).max() <= tol * np.abs(want[4:, 0]).max()


def test_observations_beside_explosive_unobserved_pair_against_oracle():
    """Growth 1.4 a step (observations of x0 formerly skipped from step 22): every one counts;
    mean, covariance (+-inf where kappa's) and precision equal the oracle's."""
    o = _oracle(1.3, 30, 200)
    s = kd.smooth(_z(30), _F(1.3), _Q, _H, _R, backend="sequential")
    _check_against_oracle(s, o, 1e-11)
    _x0_close(s, o, 1e-13)
    # the scan and native (its never resolved pair handed to the scan): x0's moments
    for backend in ["torch", "native"] if native.available() else ["torch"]:
        _x0_close(kd.smooth(_z(30), _F(1.3), _Q, _H, _R, backend=backend), o, 1e-11)


@pytest.mark.parametrize(
    "backend", ["sequential", "torch", "native"][: 3 if native.available() else 2]
)
def test_filtered_precision_beside_explosive_unobserved_pair_against_oracle(backend):
    """Growth 1.4 a step: the filtered precision is 0 along the pair at every step and x0's
    inverse variance where it is observed (formerly 1.15 of the largest off on every backend:
    read off the numerical range of kappa's coefficient, which loses the pair's second
    direction)."""
    o = _oracle(1.3, 30, 200)
    f = kd.filter(_z(30), _F(1.3), _Q, _H, _R, backend=backend)
    want = _limit_precision(o.cov)
    assert np.abs(f.precision - want).max() <= 1e-11 * np.abs(want).max()


def test_sequential_smoother_lost_series_nan_with_warning():
    """Growth 1000 a step: the predicted covariance passes the range at step 51. The series'
    smoothed moments are NaN (the warning names it), the other series' as alone; the scan
    raises OverflowError (it cannot carry the step), native hands the pair to the scan."""
    T = 60
    z = np.stack([_z(T, 0), _z(T, 1)])
    F = np.stack([_F(1e3), _F(1.3)])[:, None]  # [series, 1 (time), n, n]
    with pytest.warns(RuntimeWarning, match=r"passed float64's range at series index \(0,\)"):
        s = kd.smooth(z, F, _Q, _H, _R, axis=1, backend="sequential")
    assert np.isnan(s.filtered.loglik[0]) and np.isfinite(s.filtered.loglik[1])
    lost = np.isnan(s.filtered.mean[0, :, 0])
    assert lost[51:].all() and not lost[:51].any()
    for x in (s.mean, s.cov, s.precision):
        assert np.isnan(x[0]).all()
    one = kd.smooth(z[1], _F(1.3), _Q, _H, _R, backend="sequential")
    for a, b in zip(one[:3], s[:3], strict=True):
        np.testing.assert_array_equal(a, b[1])
    for backend in ["torch", "native"] if native.available() else ["torch"]:
        with pytest.raises(OverflowError, match="passed float64's range"):
            kd.smooth(z[0], _F(1e3), _Q, _H, _R, backend=backend)


def test_scan_singular_pivot_past_the_range_raises_overflow_error():
    """Growth 10 a step: the predicted covariance passes the range at step ~310, where a
    combined element of the scan has an exactly singular pivot. ``lu_factor`` raised its plain
    ``RuntimeError`` ("U[3,3] is zero"), which the scan's rule did not read (also at growth 2
    and 3; 1.5, 30 and 1000 reached the Cholesky's LinAlgError); now the OverflowError that
    names the cause, as the other growths."""
    args = (_z(370), _F(10.0), _Q, _H, _R)
    for backend in ["torch", "native"] if native.available() else ["torch"]:
        with pytest.raises(OverflowError, match=f"^backend '{backend}': a predicted covariance"):
            kd.filter(*args, backend=backend)


@pytest.mark.slow
def test_sequential_long_explosive_unobserved_pair_against_oracle():
    """Length 5000 at growth 1.1 a step: the filtered moments against the oracle (80 digits:
    its filter; the smoother's gain would need about 2500) up to step 3639, where the predicted
    covariance passes the range; then NaN with the warning, and no LAPACK error. The exact
    smoothed moments are numbers of float64 (x0's variance 0.111, the means up to 4e209,
    +-inf in the pair): the covariance form, which carries the pair's finite part (1.1^(2t)),
    cannot reach them."""
    T = 5000
    o = dense_oracle(_z(T), _F(0.9), _Q, _H, _R, dps=80)
    with pytest.warns(RuntimeWarning, match="passed float64's range"):
        s = kd.smooth(_z(T), _F(0.9), _Q, _H, _R, backend="sequential")
    lost = np.isnan(s.filtered.mean[:, 0])
    assert lost[3639:].all() and not lost[:3639].any()
    assert np.isnan(s.mean).all()
    f, want = s.filtered.cov[4:3639, 0, 0], o.cov[4:3639, 0, 0]
    assert np.abs(f - want).max() <= 1e-12 * np.abs(want).max()
    for sl in (slice(None), slice(0, 1)):  # all (the pair's up to 1e152) and x0's alone
        f, want = s.filtered.mean[4:3639, sl], o.mean[4:3639, sl]
        assert np.abs(f - want).max() <= 1e-11 * np.abs(want).max()


@pytest.mark.skipif(not native.available(), reason="the native extension is not built")
def test_overflow_error_names_the_backend_asked():
    """Growth 1000 a step with the pair never resolved: native hands the model to the scan,
    which cannot carry the step past the range. The OverflowError names the backend the user
    asked for and what it does (it said "backend 'torch'" and that native returns NaN with a
    warning, which native does only where every diffuse direction is resolved); the scan's own
    keeps its words."""
    args = (_z(60), _F(1e3), _Q, _H, _R)
    with pytest.raises(OverflowError) as e:
        kd.smooth(*args, backend="native")
    msg = str(e.value)
    assert msg.startswith("backend 'native': a predicted covariance passed float64's range")
    assert "no observation resolves" in msg and "hands to the parallel scan" in msg
    assert "'native' (CPU)" not in msg and "backend 'torch'" not in msg
    want = r"^backend 'torch': .*backend='native' \(CPU\) where every"
    with pytest.raises(OverflowError, match=want):
        kd.filter(*args, backend="torch")


@pytest.mark.skipif(not native.available(), reason="the native extension is not built")
def test_overflow_error_native_gradients_names_native():
    """A lost series with every direction resolved and an input that requires grad: native's
    values are NaN with the warning, their gradients the scan's, which raises; the message
    names native and says so (it said "backend 'torch'")."""
    import torch

    F = np.broadcast_to(np.eye(2), (6, 2, 2)).copy()
    F[1] = F[2] = np.diag([1e100, 0.5])  # two unobserved steps: predicted variance ~1e400
    z = np.array([[0.3, 0.1], [np.nan] * 2, [np.nan] * 2, [2e199, 0.4], [2e199, 0.2], [2e199, 0.3]])
    Ft = torch.tensor(F, requires_grad=True)
    with pytest.raises(OverflowError) as e, pytest.warns(RuntimeWarning, match="is NaN"):
        kd.filter(z, Ft, np.eye(2), np.eye(2), np.diag([0.5, 0.7]), backend="native",
                  prior_mean=np.zeros(2), prior_cov=np.eye(2))  # fmt: skip
    msg = str(e.value)
    assert msg.startswith("backend 'native': a predicted covariance passed float64's range")
    assert "gradients" in msg and "without grad" in msg
