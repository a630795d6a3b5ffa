"""Regimes where a square underflows or a ratio leaves the range, against an mpmath filter.

- a decay ``a != 0`` whose square underflows does not forget: a diffuse prior stays diffuse
  (``a^2 * inf = inf``); only ``a == 0`` forgets;
- a loading whose square, or whose information ``h^2 / obs_var``, is below the normal range is
  refused (a diffuse state's precision would underflow and its mean with it);
- the torch scan keeps the variance where ``process_var / obs_var`` passes the range.
Gradients over a diffuse gap of small but normal decays, and a tiny decay meeting a known state:
tests/test_diffuse_gap_gradients.py. docs/reliability.md ("Underflow regimes").
"""

import functools
import importlib.util
import math
import os

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native, sequential
from kalmanscan.testing import TOLERANCES, assert_close, mp_information_filter, rel_error
from kalmanscan.validation.oracle import scalar_loglik_grad
from tests.helpers import read_only

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])


# the public API with every backend, triton's kernels in the interpreter without a GPU
API_BACKENDS = BACKENDS + (["triton"] if importlib.util.find_spec("triton") else [])


def mp_filter(z, R, a, p, h=1.0, c=0.0, lam0=0.0, m0=0.0, dps=80, mp_loglik=False):
    """Information-form filter in mpmath (SPEC section 2): ``(mean, var, loglik)`` per step;
    parameters scalars or per-step arrays, ``z`` NaN where missing, ``lam0 = 0`` diffuse (exact
    convention: a step predicted diffuse adds nothing, unless ``h = 0`` there). Parameters may
    be mpf (kept exactly); ``mp_loglik``: the log-likelihood as an mpf (finite differences)."""
    T = len(z)
    with mp.workdps(dps):
        steps = lambda x: [mp.mpf(v if isinstance(v, mp.mpf) else float(v))  # noqa: E731
                           for v in np.broadcast_to(np.asarray(x, dtype=object), (T,))]  # fmt: skip
        R, a, p, h, c = map(steps, (R, a, p, h, c))
        lam = mp.mpf(float(lam0))
        eta = lam * mp.mpf(float(m0))
        ll, lams, etas = mp_information_filter(z, R, a, p, h, c, lam, eta)
        means = [float(e / lm) if lm > 0 else math.nan for lm, e in zip(lams, etas, strict=True)]
        vars_ = [float(1 / lm) if lm > 0 else math.inf for lm in lams]
        return np.array(means), np.array(vars_), ll if mp_loglik else float(ll)


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


def _mp_derivative(z, params, k, direction, dps=60):
    """d/ds of the mpmath log-likelihood at ``params[k] + s direction`` (per-step float64
    arrays ``R, a, p, h, c``; diffuse prior), by a central difference (step 1e-20)."""
    with mp.workdps(dps):
        s = mp.mpf("1e-20")

        def ll(sign):
            moved = list(params)
            moved[k] = [mp.mpf(float(x)) + sign * s * mp.mpf(float(d))
                        for x, d in zip(params[k], direction, strict=True)]  # fmt: skip
            return mp_filter(z, *moved, dps=dps, mp_loglik=True)[2]

        return float((ll(1) - ll(-1)) / (2 * s))


# without CUDA, triton by default where the square underflows (float64 and float32: a*a == 0
# taken for forgetting fails both; tests/_default_run.py); its subnormal squares over a gap:
# tests/test_diffuse_gap_gradients.py
@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("a, dtype", [(1e-170, np.float64), (1e-160, np.float64),
                                      (1e-25, np.float32), (1e-20, np.float32)])  # fmt: skip
def test_loglik_gradient_over_a_diffuse_gap_of_tiny_decays(backend, a, dtype, triton_on_cpu):
    """A diffuse lane's leading gap of decays whose square underflows or is subnormal: the
    gradient in obs_var, process_var, offset and the later decays against mpmath, 0 for the
    gap's decays (before, at a subnormal square: NaN from the sequential and torch backends,
    an OverflowError from native in float64)."""
    T, G = 12, 4
    z = np.random.default_rng(2).normal(size=T)
    z[:G] = np.nan
    z[8] = np.nan
    decay = np.full(T, 0.9)
    decay[:G] = a
    vals = [np.full(T, 0.7), decay, np.full(T, 0.2), np.ones(T), np.full(T, 0.1)]
    z, *vals = (x.astype(dtype).astype(np.float64) for x in (z, *vals))
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    leaves = [torch.tensor(x, dtype=tdt, requires_grad=True)
              for x in (vals[0][0], vals[1], vals[2][0], vals[4][0])]  # fmt: skip
    R, dec, p, c = leaves
    ll = ks.loglik(torch.tensor(z, dtype=tdt), R, dec, p, offset=c, backend=backend)
    gR, ga, gp, gc = (g.double().numpy() for g in torch.autograd.grad(ll, leaves))
    assert (ga[:G] == 0).all()
    later = np.where(np.arange(T) >= G, vals[1], 0.0)
    got = {0: float(gR), 1: float((ga * later).sum()), 2: float(gp), 4: float(gc)}
    tol = TOLERANCES[("oracle_grad", "float64")] if dtype == np.float64 else 1e-4
    for k, g in got.items():
        d = later if k == 1 else np.ones(T)
        ref = _mp_derivative(z, vals, k, d)
        assert abs(g - ref) <= tol * abs(ref), (k, g, ref)


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


# loading != 0 with loading**2 / obs_var below the normal range (1e-10, 1e300 and 1e-150, 1e20:
# loading**2 itself normal)
TINY_INFORMATION = [
    (1e-160, 1.0, np.float64), (1e-170, 1.0, np.float64), (1e-10, 1e300, np.float64),
    (1e-150, 1e20, np.float64), (1e-20, 1.0, np.float32), (1e-30, 1.0, np.float32),
]  # fmt: skip


# without CUDA, triton by default at a subnormal and an underflowing square, a normal square
# over a huge obs_var, and float32 (1e-150, 1e20 and float32's 1e-20 repeat those)
@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("h, R, dtype", TINY_INFORMATION)
def test_tiny_information_at_a_diffuse_lanes_first_observation_is_refused(
    backend, h, R, dtype, triton_on_cpu
):
    """There the lane's precision becomes loading**2 / obs_var, which the dtype cannot hold
    (before: loglik 0 or a few digits where mpmath gives a finite value): ValueError naming
    loading and the (time, lane). A tiny loading where the step is not observed is no
    observation."""
    z = np.array([np.nan, 2.0, 3.0, 2.5], dtype)
    hs = np.array([h, h, 1.0, 1.0], dtype)
    msg = (r"loading: expected loading\*\*2 / obs_var at least .* at a diffuse lane's first "
           r"informative observation .*got loading=.* at \(time, lane\) \(1, 0\)")  # fmt: skip
    for fn in (ks.filter, ks.loglik, ks.smooth):
        with pytest.raises(ValueError, match=msg):
            fn(z, R, 1.0, 0.1, loading=hs, backend=backend)
    # lane 0 has a proper prior (accepted), lane 1 is diffuse: refused at its first step
    H = np.ones((4, 2), dtype)
    H[0] = h
    with pytest.raises(ValueError, match=r"at \(time, lane\) \(0, 1\)"):
        ks.filter(np.ones((4, 2), dtype), R, 1.0, 0.1, loading=H, backend=backend,
                  prior_var=np.array([1.0, np.inf], dtype))  # fmt: skip


def _tiny_case(h, R, dtype, where):
    """``(z, obs_var, loading)`` float64 arrays (rounded to ``dtype``): loading ``h`` and
    obs_var ``R`` at the steps ``where``, 1 elsewhere; there z ~ h x + sqrt(R) noise."""
    z = np.array([1.0, 2.0, np.nan, 3.0, 2.5, 0.5])
    hs, Rs = np.ones(6), np.ones(6)
    for i, w in zip(where, (0.3, -0.8), strict=False):
        hs[i], Rs[i] = h, R
        z[i] = h * (0.7 + i) + math.sqrt(R) * w
    return tuple(x.astype(dtype).astype(np.float64) for x in (z, Rs, hs))


ACCEPTED = [  # (h, R, prior_var, steps with the tiny loading, dtype)
    (1e-160, 1.0, 1.0, (0, 3), np.float64),  # h^2 / R subnormal, a proper prior
    (1e-150, 1e20, 1.0, (0, 3), np.float64),  # h^2 normal, h^2 / R subnormal
    (1e-160, 1.0, math.inf, (3,), np.float64),  # after an informative observation
    (1e-160, 1e-300, 1.0, (0, 3), np.float64),  # h^2 subnormal, h^2 / R normal
    (1e-160, 1e-300, 1e10, (0, 3), np.float64),  # ... and obs_var * precision subnormal
    (1e-160, 1e-300, math.inf, (0, 3), np.float64),  # ... and a diffuse lane's first step
    (1e-20, 1.0, 1.0, (0, 3), np.float32),
    (1e-20, 1e-30, 1.0, (0, 3), np.float32),
    (1e-20, 1e-30, math.inf, (0, 3), np.float32),
]


# without CUDA, triton by default at every float64 regime and float32's diffuse first step;
# float32's other two repeat float64's first and fourth rows
@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("h, R, prior_var, where, dtype", ACCEPTED)
def test_tiny_loading_elsewhere_matches_mpmath(h, R, prior_var, where, dtype, backend,
                                                triton_on_cpu):  # fmt: skip
    """Everywhere but a diffuse lane's first informative step a tiny loading is computed:
    where loading**2 / obs_var is below the normal range it adds less than the rounding of
    the belief's precision; where loading**2 is, the observation is rescaled (``s z, s**2 R,
    s h``, s a power of two, its log-likelihood term back by ``log s``), so the predictive
    variance ``h^2 var + R`` is formed in range (before: refused; computed as given, the
    triton kernels' log-likelihood was -inf and the native kernel's off by 28 nats)."""
    z, Rs, hs = _tiny_case(h, R, dtype, where)
    lam0 = 0.0 if math.isinf(prior_var) else 1 / float(np.asarray(prior_var, dtype))
    m, v, ll = mp_filter(z, Rs, np.float64(dtype(0.9)), np.float64(dtype(0.1)), hs, lam0=lam0)
    cast = lambda x: x.astype(dtype)  # noqa: E731
    r = ks.filter(cast(z), cast(Rs), 0.9, 0.1, loading=cast(hs), prior_var=prior_var,
                  backend=backend)  # fmt: skip
    tol = 1e-13 if dtype == np.float64 else 1e-5
    assert rel_error(r.mean, m) < tol and _rel(r.var, v) < tol  # (means relative to the largest)
    assert abs(float(r.loglik) - ll) < tol * abs(ll)
    l2 = ks.loglik(cast(z), cast(Rs), 0.9, 0.1, loading=cast(hs), prior_var=prior_var,
                   backend=backend)  # fmt: skip
    s = ks.smooth(cast(z), cast(Rs), 0.9, 0.1, loading=cast(hs), prior_var=prior_var,
                  backend=backend)  # fmt: skip
    assert abs(float(l2) - ll) < tol * abs(ll)
    assert abs(float(s.filtered.loglik) - ll) < tol * abs(ll)
    ref = ks.smooth(z, Rs, np.float64(dtype(0.9)), np.float64(dtype(0.1)), loading=hs,
                    prior_var=prior_var, backend="sequential")  # fmt: skip
    for k in ("mean", "var"):
        assert_close(getattr(s, k), getattr(ref, k), "kernel", dtype, what=f"smooth {k}")


# without CUDA, triton by default with the rescaled observation at a diffuse lane and the tiny
# information under a proper prior (the rescaled one under a proper prior: the slow step)
@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("h, R, prior_var", [(1e-160, 1e-300, 1.0), (1e-160, 1e-300, math.inf),
                                             (1e-160, 1.0, 2.0)])  # fmt: skip
def test_tiny_loading_loglik_gradient_matches_mpmath(h, R, prior_var, backend, triton_on_cpu):
    """d loglik / d (obs_var, decay, process_var, offset) with every step's loading tiny, against
    mpmath's finite differences (kalmanscan.validation.oracle.scalar_loglik_grad)."""
    g = np.random.default_rng(5)
    z = h * (0.4 + g.normal(size=8)) + math.sqrt(R) * g.normal(size=8)
    z[5] = np.nan
    params = dict(obs_var=R, decay=0.8, process_var=0.3, offset=0.2)
    ref = scalar_loglik_grad(z, loading=h, prior_var=prior_var, **params)
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in params.items()}  # fmt: skip
    R_, a, p, c = leaves.values()
    ll = ks.loglik(torch.tensor(z), R_, a, p, loading=h, offset=c, prior_var=prior_var,
                   backend=backend)  # fmt: skip
    got = torch.autograd.grad(ll, list(leaves.values()))
    tol = TOLERANCES[("oracle_grad", "float64")]
    floor = 1e-3 * max(abs(x) for x in ref.values())  # (decay's is ~h at R = 1: 0 to 120 digits)
    for k, gk in zip(leaves, got, strict=True):
        assert abs(float(gk) - ref[k]) <= tol * max(abs(ref[k]), floor), k


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("h", [1e-140, 1e-100, 1e-80])
def test_tiny_predictive_variance_matches_mpmath(backend, h, triton_on_cpu):
    """obs_var 1e-300 with a small normal loading: the predictive variance ``h^2 var + R`` is
    far below 1e-154, whose square the native kernel's fast log-likelihood formed (before: 568
    nats off at loading 1e-100, 1e-3 at 1e-80)."""
    z = h * np.array([0.3, 0.5, -0.2, 0.1, 0.7])
    m, v, ll = mp_filter(z, 1e-300, 0.9, 0.1, h=h, lam0=1.0)
    r = ks.filter(z, 1e-300, 0.9, 0.1, loading=h, prior_var=1.0, backend=backend)
    assert abs(float(r.loglik) - ll) < 1e-13 * abs(ll)
    assert _rel(r.mean, m) < 1e-13 and _rel(r.var, v) < 1e-13


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


@functools.cache
def _huge_case(p, R, missing):
    """``(z, mpmath filter, sequential smoother)`` of :func:`test_huge_process_var_over_obs_var`:
    the references are the same for every backend, computed once (the arrays read only)."""
    z = np.random.default_rng(0).normal(size=50)
    if missing:  # unobserved steps put the lane's unit at p, observed ones at ~R
        z[[3, 4, 20, 33]] = np.nan
    mvl = mp_filter(z, R, 0.9, p, lam0=1.0)
    ref = ks.smooth(z, R, 0.9, p, prior_var=1.0, backend="sequential")
    read_only(z, *mvl[:2])
    return z, mvl, ref


@pytest.mark.parametrize("p, R", [(1e150, 1e-150), (1e200, 1e-120), (1e300, 1e-300)])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_process_var_over_obs_var(backend, p, R, missing):
    z, (m, v, ll), ref = _huge_case(p, R, missing)
    # (the sequential backend's own run is the cached reference: the same call)
    s = ref if backend == "sequential" else ks.smooth(z, R, 0.9, p, prior_var=1.0, backend=backend)
    assert _rel(s.filtered.var, v) < 1e-13 and _rel(s.filtered.mean, m) < 1e-13
    assert abs(float(s.filtered.loglik) - ll) < 1e-12 * abs(ll)
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


@pytest.mark.parametrize("a", [1e-170, 1e-160, 0.0])  # a^2: underflows, subnormal; forgets
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
