"""Small obs_var with one huge process_var (a 'reset', a long gap) against mpmath, on every CPU
backend in float64 and float32 (docs/reliability.md, "Tiny variances").

- tiny lanes (obs_var small enough for ``filter._tiny_lanes``): the lane's state unit came
  from its largest process_var (3e14 with obs_var 1e-287), leaving the other variances at the
  bottom of the range, where the smoother's product of filtered and backward variances
  underflowed: the smoothed mean and variance 0 on every backend (torch: also its filtered
  variance 0, and in float32 at data of scale 1e-10 its log-likelihood 0.17 off). The same
  through ``OUModel`` across a gap of 1e300;
- the torch backend's scans, no tiny lane: the backward scan kept the lane's unit
  ``k = max process_var`` where the forward took per-step units, so a step's ``A21/k``
  underflowed (obs_var 1e-100, one process_var 1e160: the smoothed variance 0 about the steps
  before it); the forward's own test missed steps whose variance is below 1 (obs_var 1e-140,
  one process_var 1e80: filtered variance 0).

Triton runs through the public API on CPU tensors (``triton_on_cpu``). Truth:
``tests/test_smooth_extreme_decays.py``'s two-filter smoother in mpmath, on the inputs
rounded to the dtype.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel
from tests.test_smooth_extreme_decays import BACKENDS, DTYPES, TOL, _check, _rounded, mp_smooth

Z6 = np.array([1.0, 2.0, 1.5, 3.0, 2.5, 2.0])


def _p(R, big, at=2, T=6):
    """process_var ``[0, 3R, big, 3R, 0.1R, 3R]`` (``big`` at step ``at``)."""
    p = np.array([0.0, 3.0, 1.0, 3.0, 0.1, 3.0])[:T] * R
    p[at] = big
    return p


# (id, dtype, data scale, obs_var, process_var): one lane, decay 1, diffuse start
CASES = [
    # bug 1: a tiny lane, its unit from the huge process_var (every backend)
    ("tiny-R1e-287-p3e14", "f64", 1e-143, 1e-287, np.array([0, 3e-286, 3e14, 0.3])),
    ("tiny-R1e-287-p1e-147", "f64", 1e-143, 1e-287, _p(1e-287, 1e-147)),  # ratio 1e140
    ("tiny-R1e-287-p1e-97", "f64", 1e-143, 1e-287, _p(1e-287, 1e-97)),  # ratio 1e190
    ("tiny-R1e-287-p1e-87", "f64", 1e-143, 1e-287, _p(1e-287, 1e-87)),  # ratio 1e200
    ("tiny-R1e-300-p1e60", "f64", 1e-150, 1e-300, _p(1e-300, 1e60)),
    ("tiny-R1e-20-p1e10", "f32", 1e-10, 1e-20, _p(1e-20, 1e10)),  # bug 1c (torch's filter)
    ("tiny-R1e-20-p1e-2", "f32", 1e-10, 1e-20, _p(1e-20, 1e-2)),
    ("tiny-R1e-20-p1e17", "f32", 1e-10, 1e-20, _p(1e-20, 1e17)),
    ("tiny-R1e-30-p1e5", "f32", 1e-15, 1e-30, _p(1e-30, 1e5)),
    ("ord-R1e-20-p1e10", "f64", 1e-10, 1e-20, _p(1e-20, 1e10)),
    # bug 2: torch's backward scan kept the lane's unit
    ("big-R1e-100-p1e160", "f64", 1e-50, 1e-100, _p(1e-100, 1e160)),
    ("big-R1e-100-p1e80", "f64", 1e-50, 1e-100, _p(1e-100, 1e80)),
    ("big-R1e-100-p1e200", "f64", 1e-50, 1e-100, _p(1e-100, 1e200)),
    ("big-R1e-140-p1e80", "f64", 1e-70, 1e-140, _p(1e-140, 1e80)),  # torch's forward too
    ("big-R1e-140-p1e20", "f64", 1e-70, 1e-140, _p(1e-140, 1e20)),
    ("big-R1e-12-p1e20", "f32", 1e-6, 1e-12, _p(1e-12, 1e20)),
    ("big-R1e-12-p1e10", "f32", 1e-6, 1e-12, _p(1e-12, 1e10)),
    ("big-R1e-12-p1e30", "f32", 1e-6, 1e-12, _p(1e-12, 1e30)),
    ("big-R1e-14-p1e8", "f32", 1e-7, 1e-14, _p(1e-14, 1e8)),
    ("big-R1e-14-p1e20", "f32", 1e-7, 1e-14, _p(1e-14, 1e20)),
    ("big-last-R1e-100-p1e160", "f64", 1e-50, 1e-100, _p(1e-100, 1e160, at=5)),
    ("big-first-R1e-100-p1e160", "f64", 1e-50, 1e-100, _p(1e-100, 1e160, at=1)),
]


def _truth(z, R, p, dtype):
    r = lambda x: _rounded(x, dtype)  # noqa: E731
    return mp_smooth(r(z), r(R), 1.0, r(p))


def _check_filter(res, z, R, p, dtype, tol):
    """The filtered variances and the log-likelihood against mpmath (the smoother's forward
    pass: its filtered precision and information)."""
    r = lambda x: _rounded(x, dtype)  # noqa: E731
    mp.mp.dps = 120
    lam, var = mp.mpf(0), []
    for t in range(len(z)):
        lam = lam / (1 + mp.mpf(r(p)[t]) * lam) + 1 / mp.mpf(float(r(R)))
        var.append(float(1 / lam))
    got = np.asarray(res.filtered.var, np.float64)
    assert np.max(np.abs(got - var) / np.asarray(var)) < tol, (got, var)
    _, _, ll = mp_smooth(r(z), r(R), 1.0, r(p))
    assert float(res.filtered.loglik) == pytest.approx(ll.sum(), rel=tol, abs=tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, scale, R, p", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_huge_process_var(backend, kind, scale, R, p, triton_on_cpu):
    dtype = DTYPES[kind]
    z = Z6[: len(p)] * scale
    want_mean, want_var, _ = _truth(z, R, p, dtype)
    t = lambda x: torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)  # noqa: E731
    res = ks.smooth(t(z), t(R), t(1.0), t(p), backend=backend)
    _check(res, want_mean, want_var, TOL[dtype])
    _check_filter(res, z, R, p, dtype, TOL[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["f64", "f32"])
def test_lanes_with_different_units(backend, kind, triton_on_cpu):
    """Lanes side by side, each with its own unit (tiny lanes with and without a huge
    process_var, the torch scans' per-step units, an ordinary lane): each against mpmath."""
    dtype = DTYPES[kind]
    if dtype == torch.float64:
        lanes = [(1e-143, 1e-287, _p(1e-287, 3e14)), (1e-50, 1e-100, _p(1e-100, 1e160)),
                 (1e-100, 1e-200, _p(1e-200, 1e-200)), (1.0, 0.5, _p(0.5, 0.2)),
                 (1e-70, 1e-140, _p(1e-140, 1e80))]  # fmt: skip
    else:
        lanes = [(1e-10, 1e-20, _p(1e-20, 1e10)), (1e-6, 1e-12, _p(1e-12, 1e20)),
                 (1e-10, 1e-20, _p(1e-20, 1e-20)), (1.0, 0.5, _p(0.5, 0.2))]  # fmt: skip
    z = np.stack([Z6 * s for s, _, _ in lanes], 1)
    R = np.array([r for _, r, _ in lanes])
    p = np.stack([q for _, _, q in lanes], 1)
    t = lambda x: torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)  # noqa: E731
    res = ks.smooth(t(z), t(R), t(1.0), t(p), backend=backend)
    for n in range(len(lanes)):
        want_mean, want_var, _ = _truth(z[:, n], R[n], p[:, n], dtype)
        lane = type("Lane", (), {"mean": res.mean[:, n], "var": res.var[:, n]})
        _check(lane, want_mean, want_var, TOL[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
def test_oumodel_across_a_huge_gap(backend, triton_on_cpu):
    """``OUModel`` (theta 0: a random walk, ``process_var = sigma2 dt``) across a gap of 1e300:
    its unit ``sqrt(sigma2 * median dt)`` makes obs_var 3e-287 in filter units; the smoothed
    level before the gap came out 0 with variance 0 (truth 1.028, 0.29)."""
    times = np.array([0.0, 1.0, 1e300, 1e300 + 1e285])
    z = np.array([1.0, 2.0, 1.5, 3.0])
    mp.mp.dps = 120
    dt = [mp.mpf(0)] + [
        mp.mpf(float(b)) - mp.mpf(float(a)) for a, b in zip(times[:-1], times[1:], strict=True)
    ]
    p = np.array([float(10 * d) for d in dt])
    want_mean, want_var, _ = mp_smooth(z, 0.3, 1.0, p)
    res = OUModel(theta=0.0, sigma2=10.0, mu=0.5, obs_var=0.3).smooth(z, times, backend=backend)
    lane = type("Lane", (), {"mean": torch.as_tensor(res.mean), "var": torch.as_tensor(res.var)})
    _check(lane, want_mean, want_var, 1e-12)
    assert math.isclose(want_var[0], 0.2915094339622642, rel_tol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, big", [("f32", 1e30), ("f32", 1e20), ("f64", 1e200)])
def test_resets_at_ordinary_scale(backend, kind, big, triton_on_cpu):
    """Data and obs_var of order 1, decay 0.9, process_var 0.1 with a reset (``big``) at a few
    of 64 steps: in float32 at 1e30 the torch smoother's backward scan (the lane's unit 1e30)
    gave inf smoothed variances at most steps."""
    dtype = DTYPES[kind]
    rng = np.random.default_rng(4)
    z = rng.normal(size=64)
    z[[9, 30]] = np.nan
    p = np.full(64, 0.1)
    p[[12, 13, 40, 63]] = big
    r = lambda x: _rounded(x, dtype)  # noqa: E731
    want_mean, want_var, terms = mp_smooth(r(z), 1.0, r(0.9), r(p))
    t = lambda x: torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)  # noqa: E731
    res = ks.smooth(t(z), t(1.0), t(0.9), t(p), backend=backend)
    _check(res, want_mean, want_var, TOL[dtype])
    assert float(res.filtered.loglik) == pytest.approx(terms.sum(), rel=TOL[dtype])
