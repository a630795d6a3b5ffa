"""kalmanscan.dense where a predicted covariance passes float64's range (an explosive F over a
gap): the series' log-likelihood is NaN with a RuntimeWarning naming it (the scalar core's rule,
docs/reliability.md limit 5), on native and sequential; the torch scan, which cannot carry such a
step, raises OverflowError naming the cause. Before: native -inf silently (mpmath: -470.41 proper,
-467.72 diffuse, kalmanscan/.session audit's 400-digit filter), torch and sequential a
LinAlgError from linalg.cholesky, and for F = [[1e200, 0], [.5, .9]] numpy's 'overflow
encountered in matmul' (native) or a ValueError about R (torch)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native

BACKENDS = ["sequential"] + (["native"] if native.available() else [])
T = 6
H, R, Q = np.eye(2), np.diag([0.5, 0.7]), np.eye(2)
F_GAP = np.broadcast_to(np.eye(2), (T, 2, 2)).copy()
F_GAP[1] = F_GAP[2] = np.diag([1e100, 0.5])  # two unobserved steps: predicted variance ~1e400
Z_GAP = np.array([[0.3, 0.1], [np.nan] * 2, [np.nan] * 2, [2e199, 0.4], [2e199, 0.2], [2e199, 0.3]])
PROPER = dict(prior_mean=np.zeros(2), prior_cov=np.eye(2))
# mpmath at 400 digits (.session/audit-dense/mpkf.py) for this series: a number float64 cannot
# reach through the covariance form, which no backend may replace by another silently
TRUTH = {"proper": -470.41448621675805, "diffuse": -467.7227721955521}
WARNING = (
    "kalmanscan.dense: the log-likelihood is NaN{at}: a predicted covariance passed float64's "
    "range{at2} (an entry of F P F' + Q beyond 1.8e+308), where the covariance form holds neither "
    "it nor its log-likelihood term; that series' filtered moments from that step on and its "
    "smoothed moments are NaN. Rescale the state or time (docs/reliability.md, limit 5)"
)


def _call(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(w.message) for w in got]


@pytest.mark.parametrize("prior", ["proper", "diffuse"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gap_past_the_range_gives_nan_and_warns(backend, prior):
    kw = PROPER if prior == "proper" else {}
    assert np.isfinite(TRUTH[prior])  # the value no float64 covariance filter represents
    res, got = _call(kd.smooth, Z_GAP, F_GAP, Q, H, R, backend=backend, **kw)
    f = res.filtered
    assert np.isnan(f.loglik)
    assert got == [WARNING.format(at="", at2="")]
    # steps before the gap as before; its predicted covariance inf where it passed; NaN after
    ok = kd.filter(Z_GAP[:2], F_GAP[:2], Q, H, R, backend=backend, **kw)
    np.testing.assert_allclose(f.mean[:2], ok.mean, rtol=1e-12)
    assert np.isfinite(f.pred_cov[:2]).all() and np.isposinf(f.pred_cov[2, 0, 0])
    assert np.isnan(f.mean[2:]).all() and np.isnan(f.cov[2:]).all()
    assert np.isnan(f.pred_cov[3:]).all() and np.isnan(res.mean).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_lost_series_is_nan_and_named(backend):
    z = np.stack([Z_GAP, np.where(np.isnan(Z_GAP), np.nan, 0.1)], 1)  # [T, 2 series, 2]
    F = np.stack([F_GAP, np.broadcast_to(np.eye(2) * 0.9, F_GAP.shape)], 1)
    res, got = _call(kd.filter, z, F, Q, H, R, backend=backend, **PROPER)
    assert np.isnan(res.loglik[0]) and np.isfinite(res.loglik[1])
    alone = kd.filter(z[:, 1], F[:, 1], Q, H, R, backend=backend, **PROPER)
    np.testing.assert_allclose(res.loglik[1], alone.loglik, rtol=1e-13)
    np.testing.assert_allclose(res.mean[:, 1], alone.mean, rtol=1e-12)
    assert got == [WARNING.format(at="", at2=" at series index (0,)")]


def test_torch_scan_raises_overflow_error_naming_the_cause():
    for kw in (PROPER, {}):
        want = (
            r"^backend 'torch': a predicted covariance passed float64's range \(an entry "
            r"of F P F' \+ Q.*backend='native'"
        )
        with pytest.raises(OverflowError, match=want):
            kd.filter(Z_GAP, F_GAP, Q, H, R, backend="torch", **kw)


@pytest.mark.parametrize("backend", BACKENDS + ["torch"])
def test_time_invariant_explosive_f(backend):
    """F = [[1e200, 0], [.5, .9]]: NaN and the warning (no numpy overflow warning) or, on the
    scan, OverflowError (not a ValueError about R)."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(7, 2))
    z[:2] = np.nan
    args = (z, np.array([[1e200, 0.0], [0.5, 0.9]]), np.array([[1.0, 0.3], [0.3, 0.5]]), H,
            np.diag([0.4, 0.6]))  # fmt: skip
    if backend == "torch":
        with pytest.raises(OverflowError, match="predicted covariance passed float64's range"):
            kd.filter(*args, backend=backend, **PROPER)
        return
    res, got = _call(kd.filter, *args, backend=backend, **PROPER)
    assert np.isnan(res.loglik)
    assert got == [WARNING.format(at="", at2="")]
