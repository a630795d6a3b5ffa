"""Regimes where a square underflows or a ratio leaves the range, against an mpmath filter.

- a decay ``a != 0`` whose square underflows does not forget: a diffuse prior stays diffuse
  (``a^2 * inf = inf``); only ``a == 0`` forgets;
- a loading whose square, or whose information ``h^2 / obs_var``, is below the normal range is
  refused (a diffuse state's precision would underflow and its mean with it);
- the torch scan keeps the variance where ``process_var / obs_var`` passes the range.
docs/reliability.md ("Underflow regimes").
"""

import math
import os

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native, sequential

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])


def mp_filter(z, R, a, p, h=1.0, c=0.0, lam0=0.0, m0=0.0, dps=80):
    """Information-form filter in mpmath (SPEC section 2): ``(mean, var, loglik)`` per step;
    scalar parameters, ``z`` NaN where missing, ``lam0 = 0`` diffuse (exact convention)."""
    with mp.workdps(dps):
        R, a, p, h, c = (mp.mpf(float(x)) for x in (R, a, p, h, c))
        lam = mp.mpf(float(lam0))
        eta = lam * mp.mpf(float(m0))
        means, vars_, ll = [], [], mp.mpf(0)
        for zt in z:
            if a == 0:
                lamm, etam = 1 / p, c / p
            else:
                den = a * a + p * lam
                lamm = lam / den
                etam = a * eta / den + lamm * c
            if not math.isnan(zt):
                zt = mp.mpf(float(zt))
                if lamm > 0:
                    S = h * h / lamm + R
                    ll += -(mp.log(2 * mp.pi) + mp.log(S) + (zt - h * etam / lamm) ** 2 / S) / 2
                lam, eta = lamm + h * h / R, etam + h * zt / R
            else:
                lam, eta = lamm, etam
            means.append(float(eta / lam) if lam > 0 else math.nan)
            vars_.append(float(1 / lam) if lam > 0 else math.inf)
        return np.array(means), np.array(vars_), float(ll)


def _rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.max(np.abs(x - ref) / np.abs(ref))


# ------------------------------------------------------------------------ tiny decay (bug 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a", [1e-160, 1e-170, 1e-200, 5e-324])
def test_tiny_decay_keeps_a_diffuse_prior_f64(backend, a):
    z = np.array([1.0, 2.0, 3.0, 4.0])
    m, v, ll = mp_filter(z, 1.0, a, 0.1)
    r = ks.filter(z, 1.0, a, 0.1, backend=backend)
    assert r.mean[0] == 1.0 and r.var[0] == 1.0  # the first observation alone: N(z0, R)
    assert _rel(r.mean, m) < 1e-14 and _rel(r.var, v) < 1e-14
    assert abs(float(r.loglik) - ll) < 1e-12 * abs(ll)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a", [1e-22, 1e-23, 1e-40])
def test_tiny_decay_keeps_a_diffuse_prior_f32(backend, a):
    z = np.array([1.0, 2.0, 3.0], np.float32)
    a32 = float(np.float32(a))
    m, v, ll = mp_filter(z.astype(np.float64), 1.0, a32, float(np.float32(0.1)))
    r = ks.filter(z, 1.0, np.float32(a), 0.1, backend=backend)
    assert _rel(r.mean, m) < 1e-6 and _rel(r.var, v) < 1e-6
    assert abs(float(r.loglik) - ll) < 1e-5 * abs(ll)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a", [1e-100, 1e-170])
def test_tiny_decay_long_diffuse_prefix(backend, a):
    """40 unobserved steps first: the torch scan's chunk products of ``a^2`` columns underflow
    (before: an OverflowError at 1e-100, a forgotten prior at 1e-170)."""
    z = np.r_[[np.nan] * 40, np.sin(np.arange(41.0) + 0.5)]
    m, v, ll = mp_filter(z, 1.0, a, 0.1)
    r = ks.filter(z, 1.0, a, 0.1, backend=backend)
    assert np.isnan(r.mean[:40]).all() and np.isinf(r.var[:40]).all()
    assert _rel(r.mean[40:], m[40:]) < 1e-12 and _rel(r.var[40:], v[40:]) < 1e-12
    assert abs(float(r.loglik) - ll) < 1e-12 * abs(ll)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decay_zero_still_forgets(backend):
    z = np.array([1.0, 2.0, 3.0, 4.0])
    m, v, ll = mp_filter(z, 1.0, 0.0, 0.1)
    r = ks.filter(z, 1.0, 0.0, 0.1, backend=backend)
    assert abs(r.mean[0] - 1 / 11) < 1e-15  # N(0, 0.1) prior, then z0 = 1 with R = 1
    assert _rel(r.mean, m) < 1e-14 and abs(float(r.loglik) - ll) < 1e-12 * abs(ll)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_decay_with_a_proper_prior_matches_mpmath(backend):
    z = np.array([1.0, np.nan, 3.0, 4.0, 2.0])
    m, v, ll = mp_filter(z, 0.5, 1e-170, 0.3, lam0=2.0, m0=0.7)
    r = ks.filter(z, 0.5, 1e-170, 0.3, prior_mean=0.7, prior_var=0.5, backend=backend)
    assert _rel(r.mean, m) < 1e-14 and _rel(r.var, v) < 1e-14
    assert abs(float(r.loglik) - ll) < 1e-12 * abs(ll)


def test_ou_model_long_gap_keeps_a_diffuse_prior():
    """The OU layer's decay ``exp(-theta gap)`` underflows its square past theta gap ~ 372."""
    mdl = ks.OUModel(theta=1.0, sigma2=2.0, obs_var=1.0, prior_var=np.inf)
    r370 = mdl.filter(np.array([np.nan, 1.0, 2.0]), np.array([0.0, 370.0, 371.0]))
    r380 = mdl.filter(np.array([np.nan, 1.0, 2.0]), np.array([0.0, 380.0, 381.0]))
    assert np.isinf(r380.pred_var[1])
    assert abs(float(r380.loglik) - float(r370.loglik)) < 1e-12


@pytest.mark.skipif(not native.available(), reason="native kernel not built")
def test_native_loglik_gradient_at_a_tiny_decay_matches_sequential():
    T, N = 6, 2
    g = torch.Generator().manual_seed(0)
    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    z[0, 1] = float("nan")

    def grads(mod):
        leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
                  for x in (0.7, 1e-170, 0.2)]  # fmt: skip
        R, a, p = (x.reshape(1, 1).expand(T, N) for x in leaves)
        one, zero = torch.ones(T, N, dtype=torch.float64), torch.zeros(T, N, dtype=torch.float64)
        x0 = (torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64),
              torch.ones(N, dtype=torch.float64))  # fmt: skip
        out = mod.filter_lanes(z, R, a, p, one, zero, x0, outputs="loglik")
        out["loglik"].sum().backward()
        return out["loglik"].detach(), [x.grad for x in leaves]

    ll_n, g_n = grads(native)
    ll_s, g_s = grads(sequential)
    torch.testing.assert_close(ll_n, ll_s, rtol=1e-13, atol=0)
    for x, y in zip(g_n, g_s, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-300)


# ---------------------------------------------------------------------- tiny loading (bug 5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "h, R, dtype",
    [(1e-160, 1.0, np.float64), (1e-170, 1.0, np.float64), (1e-10, 1e300, np.float64),
     (1e-20, 1.0, np.float32), (1e-30, 1.0, np.float32)],
)  # fmt: skip
def test_tiny_loading_is_refused_naming_it(backend, h, R, dtype):
    z = np.array([1.0, 2.0, 3.0, 2.5], dtype)
    with pytest.raises(ValueError, match=r"loading: expected 0, or loading\*\*2 .*got loading="):
        ks.filter(z, R, 1.0, 0.1, loading=h, backend=backend)
    hs = np.array([1.0, h, 1.0, 1.0])[:, None] * np.ones((1, 2))  # one bad (time, lane)
    with pytest.raises(ValueError, match=r"at \(time, lane\) \(1, 0\)"):
        ks.filter(np.ones((4, 2), dtype), R, 1.0, 0.1, loading=hs.astype(dtype), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_normal_loading_matches_mpmath(backend):
    """The smallest loadings accepted: the mean ~ z/h and the log-likelihood (which does not
    depend on h) exact to rounding."""
    z = np.array([1.0, 2.0, 3.0, 2.5])
    for h in [1e-150, 1.5e-154]:
        m, v, ll = mp_filter(z, 1.0, 1.0, 0.1, h=h)
        r = ks.filter(z, 1.0, 1.0, 0.1, loading=h, backend=backend)
        assert _rel(r.mean, m) < 1e-13
        assert abs(float(r.loglik) - ll) < 1e-12 * abs(ll)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_loading_is_still_accepted(backend):
    r = ks.filter(np.array([1.0, 2.0]), 1.0, 0.5, 0.1, loading=0.0, backend=backend)
    assert np.isfinite(float(r.loglik))


# --------------------------------------------------------------- huge p / obs_var (bug 6)


@pytest.mark.parametrize("p, R", [(1e150, 1e-150), (1e200, 1e-120), (1e300, 1e-300)])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_process_var_over_obs_var(backend, p, R, missing):
    z = np.random.default_rng(0).normal(size=50)
    if missing:  # unobserved steps put the lane's unit at p, observed ones at ~R
        z[[3, 4, 20, 33]] = np.nan
    m, v, ll = mp_filter(z, R, 0.9, p, lam0=1.0)
    s = ks.smooth(z, R, 0.9, p, prior_var=1.0, backend=backend)
    assert _rel(s.filtered.var, v) < 1e-13 and _rel(s.filtered.mean, m) < 1e-13
    assert abs(float(s.filtered.loglik) - ll) < 1e-12 * abs(ll)
    ref = ks.smooth(z, R, 0.9, p, prior_var=1.0, backend="sequential")
    assert _rel(s.var, ref.var) < 1e-13 and _rel(s.mean, ref.mean) < 1e-13


# -------------------------------------------------------------- Triton kernels (interpreter)


def _triton():
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it first
    pytest.importorskip("triton")
    from kalmanscan.cuda import filter as F

    return F, "cuda" if torch.cuda.is_available() else "cpu"


def _lanes(z, R, a, p, h, dtype, device):
    T = len(z)
    s = lambda x: torch.full((1, 1), x, dtype=dtype, device=device).expand(T, 1)  # noqa: E731
    zt = torch.tensor(z, dtype=dtype, device=device)[:, None]
    x0 = (torch.zeros(1, dtype=dtype, device=device), torch.zeros(1, dtype=dtype, device=device),
          torch.ones(1, dtype=dtype, device=device))  # fmt: skip
    return zt, s(R), s(a), s(p), s(h), s(0.0), x0


@pytest.mark.parametrize("a", [1e-170, 0.0])
def test_triton_tiny_decay_keeps_a_diffuse_prior(a):
    F, device = _triton()
    z = np.array([1.0, 2.0, 3.0, 4.0])
    m, v, ll = mp_filter(z, 1.0, a, 0.1)
    out = F.filter_lanes(*_lanes(z, 1.0, a, 0.1, 1.0, torch.float64, device))
    assert _rel(out["mean"][:, 0].cpu(), m) < 1e-14 and _rel(out["var"][:, 0].cpu(), v) < 1e-14
    assert abs(float(out["loglik"][0]) - ll) < 1e-12 * abs(ll)


def test_triton_flags_a_tiny_loading():
    F, device = _triton()
    out = F.filter_lanes(*_lanes([1.0, 2.0], 1.0, 1.0, 0.1, 1e-170, torch.float64, device))
    flags = out["read_flags"]() if "read_flags" in out else int(out["flags"])
    assert flags & 4
    out = F.filter_lanes(*_lanes([1.0, 2.0], 1.0, 1.0, 0.1, 1e-150, torch.float64, device))
    flags = out["read_flags"]() if "read_flags" in out else int(out["flags"])
    assert not flags & 4
