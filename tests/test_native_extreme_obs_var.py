"""A tiny obs_var against mpmath on every CPU backend (docs/reliability.md, "Tiny variances"):

- ``process_var / obs_var`` past the dtype's range (process_var 1e5, obs_var 1e-304; float32
  1e-34), every value an ordinary float: ``native``'s smoother stepped back through
  ``V1 + p U1`` unnormalized, which passed the range in the lane's units (loading 1e149 there):
  smoothed variances inf and 29 of 30 means NaN, silently; also with a loading of 1e5 and no units
  (obs_var 1e-10, process_var 1e300). Its log-likelihood's gradient (the kernel's adjoint) raised
  an OverflowError where the torch backend's is exact;
- an innovation of 1e154 in a lane's units with a predicted variance of 1e8 (obs_var 2.3e-308,
  process_var 1e-300, decay 1): ``native``'s fast form squared it past the range, log-likelihood
  -inf and an OverflowError, truth -2.3e300;
- a subnormal obs_var (1e-308, 6e-309: accepted, its reciprocal is finite): the lane's
  observation unit ``s**2`` (2^1024) and state unit ``c**2`` (2^-1024) passed the range,
  obs_var became inf there (every step "not observed"): ``native`` returned a log-likelihood
  of +71688 (truth -7661.17) and NaN means, ``OUModel.loglik`` +72043 (truth 20.2); torch and
  sequential an OverflowError.

Truth: ``tests/test_smooth_extreme_decays.py``'s two-filter smoother in mpmath (inputs rounded
to the dtype), gradients by central differences in mpmath at 420 digits.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from tests.test_smooth_extreme_decays import BACKENDS, TOL, _check, _rounded, mp_smooth

CPU = ["sequential", "torch"] + (["native"] if native.available() else [])
_rng = np.random.default_rng(0)
WALK = np.cumsum(_rng.normal(size=30))


def _t(x, dtype):
    return torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)


def _check_all(res, z, R, a, p, dtype, loglik=True):
    """Smoothed and filtered moments (and the log-likelihood) of one lane against mpmath."""
    r = lambda x: _rounded(x, dtype)  # noqa: E731
    want_mean, want_var, terms = mp_smooth(r(z), r(R), r(a), r(p))
    _check(res, want_mean, want_var, TOL[dtype])
    for t in (0, 5, len(z) - 1):  # the filtered moments: the prefix's last smoothed ones
        m, v, _ = mp_smooth(r(z)[: t + 1], r(R), r(a), r(p))
        got_m, got_v = float(res.filtered.mean[t]), float(res.filtered.var[t])
        assert abs(got_v / v[-1] - 1) < TOL[dtype], (t, got_v, v[-1])
        assert abs(got_m - m[-1]) < TOL[dtype] * max(abs(m[-1]), math.sqrt(v[-1])), (t, got_m)
    if loglik:
        assert float(res.filtered.loglik) == pytest.approx(terms.sum(), rel=TOL[dtype])


# (id, dtype, obs_var, process_var, data scale): decay 0.95, diffuse start, 30 steps
RATIO = [
    ("f64-R1e-304", torch.float64, 1e-304, 1e5, 1e3),
    ("f64-R1e-306", torch.float64, 1e-306, 1e5, 1e3),
    ("f64-R1e-300-p1e20", torch.float64, 1e-300, 1e20, 1.0),
    ("f32-R1e-34", torch.float32, 1e-34, 1e5, 1e3),
    ("f32-R1e-36", torch.float32, 1e-36, 1e5, 1.0),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, R, p, scale", [c[1:] for c in RATIO], ids=[c[0] for c in RATIO])
def test_process_to_obs_var_ratio_past_the_range(backend, dtype, R, p, scale, triton_on_cpu):
    z = WALK * scale + 3 * scale
    res = ks.smooth(_t(z, dtype), _t(R, dtype), _t(0.95, dtype), _t(p, dtype), backend=backend)
    _check_all(res, z, R, 0.95, p, dtype)


@pytest.mark.parametrize("backend", CPU)
def test_ratio_past_the_range_in_a_tile_of_lanes(backend):
    """16 lanes side by side (native's tile rows, whose lanes with a step back past the range are
    redone one by one), huge-ratio lanes among ordinary ones."""
    R = np.array([1e-304, 0.5, 1e-306, 2.0] * 4)
    p = np.array([1e5, 0.1, 1e5, 1e-3] * 4)
    z = WALK[:, None] * (1.0 + np.arange(16)) * 100
    res = ks.smooth(torch.as_tensor(z), torch.as_tensor(R), 0.95, torch.as_tensor(p),
                    backend=backend)  # fmt: skip
    for n in range(16):
        lane = type("Lane", (), {"mean": res.mean[:, n], "var": res.var[:, n]})
        m, v, ll = mp_smooth(z[:, n], R[n], 0.95, p[n])
        _check(lane, m, v, 1e-12)
        assert float(res.filtered.loglik[n]) == pytest.approx(ll.sum(), rel=1e-12)


@pytest.mark.parametrize("backend", CPU)
def test_ratio_past_the_range_from_a_loading(backend):
    """No unit of the API's: loading 1e5 with obs_var 1e-10 and process_var 1e300 (information
    1e20 an observation, so ``p h**2 / R`` 1e320): the same model as ``z / h`` with obs_var
    ``R / h**2`` and loading 1 (its moments)."""
    z = WALK * 1e5
    h, R, p = 1e5, 1e-10, 1e300
    res = ks.smooth(torch.as_tensor(z), R, 0.9, p, loading=h, backend=backend)
    m, v, _ = mp_smooth(z / h, R / h**2, 0.9, p)
    _check(res, m, v, 1e-12)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("lanes", [1, 16])
def test_squared_innovation_past_the_range(backend, lanes):
    """obs_var 2.3e-308, process_var 1e-300, decay 1 on data of scale 1: the log-likelihood
    -2e301 (each step's term about -1e300), carried in units where an innovation is 1e154."""
    z = np.repeat(WALK[:12, None], lanes, 1) * 4
    ll = ks.loglik(z, 2.3e-308, 1.0, 1e-300, backend=backend)
    want = mp_smooth(z[:, 0], 2.3e-308, 1.0, 1e-300)[2].sum()
    assert -1e308 < want < -1e301
    np.testing.assert_allclose(ll, want, rtol=1e-12)


# (id, dtype, obs_var, process_var, decay, data scale)
SUBNORMAL = [
    ("f64-R1e-308", torch.float64, 1e-308, 0.01, 0.9, 1.0),
    ("f64-R6e-309", torch.float64, 6e-309, 0.01, 0.9, 1.0),
    ("f64-R1e-308-p1e5", torch.float64, 1e-308, 1e5, 0.95, 1.0),
    ("f64-R1e-308-p0", torch.float64, 1e-308, 0.0, 0.9, 1e-150),
    ("f32-R5e-39", torch.float32, 5e-39, 0.01, 0.9, 1.0),
    ("f32-R5e-39-p1e5", torch.float32, 5e-39, 1e5, 0.9, 1.0),
]


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize(
    "dtype, R, p, a, scale", [c[1:] for c in SUBNORMAL], ids=[c[0] for c in SUBNORMAL]
)
def test_subnormal_obs_var(backend, dtype, R, p, a, scale):
    assert 0 < R < torch.finfo(dtype).tiny and 1 / R < torch.finfo(dtype).max  # (accepted)
    z = WALK * scale
    res = ks.smooth(_t(z, dtype), _t(R, dtype), _t(a, dtype), _t(p, dtype), backend=backend)
    _check_all(res, z, R, a, p, dtype)


def test_subnormal_obs_var_through_oumodel():
    """``OUModel.loglik`` (public, the CPU default backend): a random walk (theta 0, sigma2 1:
    its unit 1, so obs_var reaches the filter subnormal) against mpmath; it gave +72043-like
    values where a likelihood maximizer over log(obs_var) walked in."""
    for R in (2.3e-308, 1e-308, 6e-309):
        want = mp_smooth(WALK, R, 1.0, np.r_[0.0, np.ones(29)])[2].sum()
        got = float(ks.OUModel(theta=0.0, sigma2=1.0, obs_var=R).loglik(WALK))
        assert got == pytest.approx(want, rel=1e-12), R


def _mp_loglik(z, R, a, p):
    lam, eta, ll = mp.mpf(0), mp.mpf(0), mp.mpf(0)
    for zt in z:
        den = a * a + p * lam
        lam, eta = lam / den, a * eta / den
        zt = mp.mpf(float(zt))
        if lam > 0:
            S = 1 / lam + R
            ll += -(mp.log(2 * mp.pi) + mp.log(S) + (zt - eta / lam) ** 2 / S) / 2
        lam, eta = lam + 1 / R, eta + zt / R
    return ll


def _mp_gradient(z, R, a, p):
    """d loglik / d (obs_var, decay, process_var) by central differences in log-parameters,
    at 420 digits (obs_var's effect is 1e-309 of the log-likelihood's)."""
    with mp.workdps(420):
        P = [mp.mpf(float(x)) for x in (R, a, p)]
        h = mp.mpf("1e-40")

        def f(i, t):
            return _mp_loglik(z, *[v * mp.exp(t) if j == i else v for j, v in enumerate(P)])

        return [float((f(i, h) - f(i, -h)) / (2 * h) / P[i]) for i in range(3)]


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("R, p", [(1e-304, 1e5), (1e-308, 0.01)], ids=["ratio", "subnormal"])
@pytest.mark.parametrize("kind", ["loglik", "smooth"])
def test_gradients(backend, R, p, kind):
    """The log-likelihood's gradient: native's adjoint (``ks.loglik``) and its torch
    vector-Jacobian product (``ks.smooth``), torch and sequential."""
    z = WALK * 1e3 + 3e3
    want = _mp_gradient(z, R, 0.95, p)
    x = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (R, 0.95, p)]
    zt = torch.as_tensor(z)
    if kind == "loglik":
        out = ks.loglik(zt, *x, backend=backend)
    else:
        out = ks.smooth(zt, *x, backend=backend).filtered.loglik
    got = torch.autograd.grad(out, x)
    for name, g, w in zip(("obs_var", "decay", "process_var"), got, want, strict=True):
        assert math.isfinite(w) and abs(float(g) / w - 1) < 1e-12, (name, float(g), w)
