"""The smoother's backward information filter through decays whose square leaves the normal
range, and where ``process_var / obs_var`` passes it, against mpmath (docs/reliability.md,
limits 5 and 6).

- tiny decay (``a^2`` below the normal range): the precision it gives about the step before
  (``a^2 / obs_var``, a normal number) was lost: NaN or inf smoothed moments, or 1e-4 off, on
  every backend (the backward step formed ``a^2 U``); a diffuse start with its first
  observation missing makes the backward filter the only source there;
- the same with a proper prior of variance 1e200: ``triton`` took the underflowed ``a*a`` for
  forgetting and gave the smoothed mean 0 (truth -5.3e128);
- ``process_var / obs_var`` past the dtype's maximum: ``triton``'s backward update added
  ``h^2/obs_var`` unscaled, NaN smoothed moments (the filtered ones right);
- a huge decay (1e200): ``triton`` gave NaN smoothed moments where the state before it is known
  almost exactly; elsewhere the forward filter's predicted variance passes the range and
  ``sequential``, ``torch`` and ``native`` raise (limit 5); a predicted variance past the range
  makes its lane's log-likelihood NaN, with a warning (tests/test_lost_loglik.py).

Triton runs through the public API on CPU tensors (``triton_on_cpu``: the interpreter without a
GPU), its chunked scan forced at 40 steps (three chunks). Truth: a two-filter smoother in mpmath
(information-form forward filter and backward information filter, combined by adding
precisions), on the inputs rounded to the dtype.
"""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native, sequential

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = (["sequential", "torch"] + (["native"] if native.available() else [])
            + (["triton"] if HAS_TRITON else []))  # fmt: skip
DTYPES = {"f64": torch.float64, "f32": torch.float32}
TOL = {torch.float64: 1e-12, torch.float32: 2e-5}


def mp_smooth(z, R, a, p, prior_var=math.inf, prior_mean=0.0, dps=120):
    """``(mean, var, loglik_terms)`` of the smoothed moments of one lane (loading 1, offset 0;
    ``z`` NaN where missing; ``a == 0`` forgets) and each step's log-likelihood term (0 at a
    diffuse prior step); NaN mean and inf variance where nothing is known, variances below the
    float64 range 0."""
    mp.mp.dps = dps
    T = len(z)
    col = lambda x: [mp.mpf(float(v)) for v in np.broadcast_to(np.asarray(x, float), (T,))]  # noqa: E731
    R, a, p = col(R), col(a), col(p)
    obs = [not math.isnan(float(v)) for v in z]
    zz = [mp.mpf(float(v)) if o else None for v, o in zip(z, obs, strict=True)]
    lam = mp.mpf(0) if math.isinf(prior_var) else 1 / mp.mpf(prior_var)
    eta = lam * mp.mpf(prior_mean)
    fl, fe, ll = [], [], []
    for t in range(T):
        if a[t] == 0:
            lam, eta = 1 / p[t], mp.mpf(0)
        else:
            den = a[t] ** 2 + p[t] * lam
            lam, eta = lam / den, a[t] * eta / den
        term = mp.mpf(0)
        if obs[t]:
            if lam > 0:
                S = 1 / lam + R[t]
                term = -(mp.log(2 * mp.pi) + mp.log(S) + (zz[t] - eta / lam) ** 2 / S) / 2
            lam, eta = lam + 1 / R[t], eta + zz[t] / R[t]
        fl.append(lam)
        fe.append(eta)
        ll.append(term)
    L, E = mp.mpf(0), mp.mpf(0)
    mean, var = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        lam_s = fl[t] + L
        mean[t] = float((fe[t] + E) / lam_s) if lam_s > 0 else math.nan
        var[t] = float(1 / lam_s) if lam_s > 0 else math.inf
        if obs[t]:
            L, E = L + 1 / R[t], E + zz[t] / R[t]
        if a[t] == 0:
            L, E = mp.mpf(0), mp.mpf(0)
        else:
            den = 1 + p[t] * L
            L, E = a[t] ** 2 * L / den, a[t] * E / den
    return np.array(mean), np.array(var), np.array([float(x) for x in ll])


def _rounded(x, dtype):
    return torch.as_tensor(np.asarray(x, np.float64)).to(dtype).double().numpy()


def _smooth(backend, dtype, z, R, a, p, prior_var=math.inf):
    t = lambda x: torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)  # noqa: E731
    return ks.smooth(t(z), t(R), t(a), t(p), prior_var=prior_var, backend=backend)


def _check(res, want_mean, want_var, tol, compiled=False):
    """Smoothed means relative to max(|mean|, sd), variances relative, against the truth as
    the outputs' dtype holds it (a variance past its range inf). On a GPU the compiled float32
    kernels flush subnormal numbers to zero (``compiled``), so where the true precision is
    subnormal (a variance above ``1 / finfo.tiny``, ~8.5e37) the variance may come out inf
    there (docs/reliability.md, limit 6)."""
    mean = np.asarray(res.mean, np.float64)
    var = np.asarray(res.var, np.float64)
    want_var = _rounded(want_var, res.var.dtype)
    known = np.isfinite(want_var)
    if compiled and res.var.dtype == torch.float32:
        flushed = known & (want_var * torch.finfo(torch.float32).tiny > 1) & np.isinf(var)
        known &= ~flushed
        want_var = np.where(flushed, np.inf, want_var)
    assert np.array_equal(np.isfinite(var), known), (var, want_var)
    sd = np.sqrt(want_var[known])
    scale = np.maximum(np.maximum(np.abs(want_mean[known]), sd), 1e-300)
    assert np.max(np.abs(mean[known] - want_mean[known]) / scale) < tol, (mean, want_mean)
    pos = known & (want_var > 0)
    assert np.max(np.abs(var[pos] - want_var[pos]) / want_var[pos]) < tol, (var, want_var)
    assert np.all(var[known & (want_var == 0)] == 0)


Z6 = [math.nan, -0.2361197, 0.3, -0.4, 0.1, 0.25]
# (dtype, decay at step 1, obs_var, prior_var): the precision the decay gives about step 0,
# a^2/obs_var, is a normal number (3.4e-240, 3.4e-301, 1e-37, 3.4e-37); a^2 is 0 or subnormal
TINY = [
    ("f64", 1e-170, 1e-100, math.inf),
    ("f64", 1e-160, 1e-20, math.inf),
    ("f64", 1e-170, 1e-100, 1e200),  # a proper prior: triton took a*a == 0 for forgetting
    ("f32", 1e-21, 1e-5, math.inf),
    ("f32", 1e-20, 1e-4, math.inf),
    ("f32", 1e-21, 1e-5, 1e30),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, a1, R, prior_var", TINY,
                         ids=[f"{k}-a{a:g}-R{r:g}-P{v:g}" for k, a, r, v in TINY])  # fmt: skip
def test_tiny_decay_keeps_the_backward_precision(backend, kind, a1, R, prior_var, triton_on_cpu):
    dtype = DTYPES[kind]
    a = [1.0, a1, 0.9, 0.9, 0.9, 0.9]
    want_mean, want_var, _ = mp_smooth(_rounded(Z6, dtype), _rounded(R, dtype),
                                       _rounded(a, dtype), 0.0, prior_var)  # fmt: skip
    assert np.all(np.isfinite(want_mean)) and np.all(np.isfinite(want_var))
    res = _smooth(backend, dtype, Z6, R, a, 0.0, prior_var)
    _check(res, want_mean, want_var, TOL[dtype])


# (dtype, obs_var, process_var): process_var/obs_var past the dtype's maximum
RATIOS = [("f64", 1e-200, 1e200), ("f64", 1e-10, 1e300), ("f32", 1e-20, 1e20),
          ("f32", 1e-5, 1e35)]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, R, p", RATIOS, ids=[f"{k}-R{r:g}-p{p:g}" for k, r, p in RATIOS])
def test_process_var_over_obs_var_past_the_range(backend, kind, R, p, triton_on_cpu):
    dtype = DTYPES[kind]
    z = [0.3, -0.2, 0.5, 0.1, 0.7]
    want_mean, want_var, _ = mp_smooth(_rounded(z, dtype), _rounded(R, dtype), _rounded(0.9, dtype),
                                       _rounded(p, dtype), 1.0)  # fmt: skip
    _check(_smooth(backend, dtype, z, R, 0.9, p, 1.0), want_mean, want_var, TOL[dtype])


def test_undetermined_smoothed_mean_is_nan(triton_on_cpu):
    """A diffuse start, step 0 missing, then a decay whose square is far below the range
    (``a = 1e-200``, precision 1e-400 about step 0, its information 1e-200 not): nothing a
    dtype can hold is known about step 0, NaN mean and inf variance on every backend (``native``
    gave -inf)."""
    a = [1.0, 1e-200, 0.9, 0.9, 0.9, 0.9]
    want_mean, want_var, _ = mp_smooth(Z6, 1.0, a, 0.0)
    for backend in BACKENDS:
        res = _smooth(backend, torch.float64, Z6, 1.0, a, 0.0)
        assert math.isnan(res.mean[0]) and res.var[0] == math.inf, backend
        _check(res, np.r_[math.nan, want_mean[1:]], np.r_[math.inf, want_var[1:]], 1e-12)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_huge_decay_triton_smoother(triton_on_cpu):
    """``decay = 1e200``: the state before the step is known almost exactly (``z_{t+1} / a``,
    variance below the range); triton gave NaN smoothed moments. From a diffuse start every
    prediction is diffuse; meeting a known state, triton's filter kernel takes the prediction
    (variance past the range) as diffuse (limit 5: the step's log-likelihood term is not
    representable, and the lane's log-likelihood is NaN, with a warning)."""
    z = [0.3, -0.2, 0.5, 0.1]
    want_mean, want_var, _ = mp_smooth(z, 1.0, 1e200, 1.0)
    _check(_smooth("triton", torch.float64, z, 1.0, 1e200, 1.0), want_mean, want_var, 1e-12)
    z = np.random.default_rng(0).normal(size=12) * 0.3
    a = np.full(12, 0.9)
    a[6] = 1e200
    want_mean, want_var, terms = mp_smooth(z, 1.0, a, 1.0)
    with pytest.warns(RuntimeWarning, match="log-likelihood is NaN"):
        res = _smooth("triton", torch.float64, z, 1.0, a, 1.0)
    _check(res, want_mean, want_var, 1e-12)
    assert math.isnan(float(res.filtered.loglik))  # (it was terms.sum() - terms[6], silently)


def test_huge_decay_backward_information_filter():
    """The backward information filter alone (the sequential reference) through ``decay =
    1e200``: the precision about the step before is past the range (variance 0) and its mean
    ``z/a``; it was NaN."""
    z = torch.tensor([[0.3], [-0.2], [0.5], [0.1]], dtype=torch.float64)
    one = torch.ones_like(z)
    U, E, V = sequential.backward_information(z, one, 1e200 * one, one, one, 0 * one)
    assert torch.all(torch.isfinite(U) & torch.isfinite(E) & torch.isfinite(V))
    assert torch.equal(V[:-1], torch.zeros_like(V[:-1]))  # known exactly
    mp.mp.dps = 50
    # the step before the last: x_2 = x_3 / a with x_3's information from z_3 alone (p = 1)
    assert float(E[2, 0] / U[2, 0]) == pytest.approx(float(mp.mpf(0.1) / mp.mpf(1e200)), rel=1e-15)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])
def test_huge_decay_meeting_a_known_state_raises(backend):
    """Limit 5: a decay whose square overflows meeting a known state gives a predicted variance
    past the range; ``sequential``, ``torch`` and ``native`` raise ``OverflowError``."""
    z = np.random.default_rng(0).normal(size=12) * 0.3
    a = np.full(12, 0.9)
    a[6] = 1e200
    with pytest.raises(OverflowError):
        _smooth(backend, torch.float64, z, 1.0, a, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_predicted_variance_past_the_range_makes_its_loglik_nan(backend, triton_on_cpu):
    """Limit 5: ``decay = 1e100`` after a missing observation gives the predicted variance
    1e400, past the range: that step is taken as diffuse and its log-likelihood term (-461.5)
    is not representable: the log-likelihood is NaN, with a warning (it was the sum without
    that term, silently); the smoothed moments stay exact."""
    z = np.random.default_rng(3).normal(size=10)
    z[3] = np.nan
    want_mean, want_var, terms = mp_smooth(z, 1.0, 1e100, 1.0)
    with pytest.warns(RuntimeWarning, match="log-likelihood is NaN"):
        res = _smooth(backend, torch.float64, z, 1.0, 1e100, 1.0)
    assert math.isinf(float(res.filtered.pred_var[4]))
    assert math.isnan(float(res.filtered.loglik))
    assert terms[4] == pytest.approx(-461.5, abs=0.5)
    _check(res, want_mean, want_var, 1e-12)


# --------------------------------------------------------------------------- the chunked scan


@pytest.fixture
def chunked(monkeypatch):
    """Triton's chunked regime at 40 steps (three chunks of 16; tests/test_chunked_diffuse.py)."""
    pytest.importorskip("triton")
    from kalmanscan.cuda import filter as F

    monkeypatch.setattr(F, "_MANY_LANES", 10**9)
    monkeypatch.setitem(F.TUNING, "CK", 4)
    assert F._plan(40, 1)[1] == 3


# a diffuse start and a proper prior whose variance times a^2 is a normal number (F1's, at
# 1e200 in float64): two lanes of one call, which take the same chunk-level steps (the walk's
# gate is the tile's any-lane test, each lane's state then picked by its own flag and state)
CHUNKED = [(kind, pos, big) for kind, big in (("f64", 1e200), ("f32", 1e30)) for pos in (3, 20, 30)]


@pytest.mark.parametrize("kind, pos, big", CHUNKED, ids=[f"{k}-at{t}" for k, t, _ in CHUNKED])
def test_chunked_tiny_decay(kind, pos, big, triton_on_cpu, chunked):
    """A tiny decay after a leading gap, in the first, second or last chunk: a chunk's backward
    map loses ``a^2`` (the carry walks such a chunk step by step); lane 0 from a diffuse start,
    lane 1 from the prior of variance ``big``."""
    from kalmanscan.cuda import filter as F

    assert F._plan(40, 2)[1] == 3
    dtype = DTYPES[kind]
    a1, R = (1e-170, 1e-100) if dtype == torch.float64 else (1e-21, 1e-5)
    z = np.random.default_rng(pos).normal(size=40) * 0.3
    z[:pos] = np.nan
    a = np.full(40, 0.9)
    a[pos] = a1
    t = lambda x: torch.as_tensor(np.asarray(x, np.float64), dtype=dtype)  # noqa: E731
    res = ks.smooth(t(np.c_[z, z]), R, t(np.c_[a, a]), 0.0, prior_var=t([math.inf, big]),
                    backend="triton")  # fmt: skip
    for n, prior_var in enumerate((math.inf, big)):
        want_mean, want_var, _ = mp_smooth(_rounded(z, dtype), _rounded(R, dtype),
                                           _rounded(a, dtype), 0.0, prior_var)  # fmt: skip
        lane = SimpleNamespace(mean=res.mean[:, n], var=res.var[:, n])
        _check(lane, want_mean, want_var, TOL[dtype], compiled=torch.cuda.is_available())


@pytest.mark.parametrize("kind, R, p", RATIOS, ids=[f"{k}-R{r:g}-p{p:g}" for k, r, p in RATIOS])
def test_chunked_process_var_over_obs_var_past_the_range(kind, R, p, triton_on_cpu, chunked):
    """The chunk maps (forward and backward) in the update's ``R``-scaled form: ``p phi`` past
    the range had made them NaN (the filter raised ``OverflowError``)."""
    dtype = DTYPES[kind]
    z = np.random.default_rng(1).normal(size=40) * 0.3
    z[7] = np.nan
    want_mean, want_var, _ = mp_smooth(_rounded(z, dtype), _rounded(R, dtype), _rounded(0.9, dtype),
                                       _rounded(p, dtype), 1.0)  # fmt: skip
    _check(_smooth("triton", dtype, z, R, 0.9, p, 1.0), want_mean, want_var, TOL[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_decays_among_ordinary_lanes(backend, triton_on_cpu):
    """40 lanes (the compiled kernel's tiles: a row holding such a decay takes the careful
    step, the others the plain one), two with a tiny decay: every lane against mpmath."""
    N = 40
    z = np.tile(np.array(Z6)[:, None], (1, N))
    a = np.full((6, N), 0.9)
    a[0] = 1.0
    a[1, 7], a[1, 30] = 1e-170, 1e-160
    R = np.full((6, N), 1e-100)
    R[:, 30] = 1e-20
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    res = ks.smooth(t(z), t(R), t(a), 0.0, backend=backend)
    for n in (0, 7, 30):
        want_mean, want_var, _ = mp_smooth(z[:, n], R[:, n], a[:, n], 0.0)
        lane = type("Lane", (), {"mean": res.mean[:, n], "var": res.var[:, n]})
        _check(lane, want_mean, want_var, 1e-12)


@pytest.mark.parametrize("backend", ["sequential", "torch"])
def test_zero_lanes_and_memory_layout_on_the_torch_paths(backend):
    """No series (``z [5, 0]``) crashed the torch scan ("amax(): Expected reduction dim");
    the log-likelihood of a Fortran-ordered ``z`` differed from the C-ordered one in its last
    bits (the sum's order followed the layout: 7e-15)."""
    for fn in (ks.filter, ks.smooth):
        res = fn(np.zeros((5, 0)), 1.0, 0.9, 0.1, backend=backend)
        assert res.mean.shape == (5, 0)
    assert ks.loglik(np.zeros((5, 0)), 1.0, 0.9, 0.1, backend=backend).shape == (0,)
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 7)) * 40.0
    z[rng.random(z.shape) < 0.1] = np.nan
    c = ks.loglik(z, 1.0, 0.9, 0.5, backend=backend)
    f = ks.loglik(np.asfortranarray(z), 1.0, 0.9, 0.5, backend=backend)
    np.testing.assert_array_equal(c, f)


# (dtype, obs_var, process_var): process_var/obs_var within the range but past 1/tiny
NEAR = [("f64", 1e-10, 1e298), ("f32", 1e-5, 2e33)]


@pytest.mark.parametrize("kind, R, p", NEAR, ids=[f"{k}-R{r:g}-p{p:g}" for k, r, p in NEAR])
def test_chunked_map_trace_past_the_reciprocal_range(kind, R, p, triton_on_cpu, chunked):
    """A chunk map's trace (about ``process_var/obs_var``) past ``1/tiny``: its reciprocal is
    not a normal number (0 from the compiled float32 reciprocal, a zero map at a chunk's last
    step, 15 and 31 here, observed); the carries walk such chunks step by step."""
    dtype = DTYPES[kind]
    assert p / R < torch.finfo(dtype).max and p / R * torch.finfo(dtype).tiny > 1
    z = np.random.default_rng(2).normal(size=40) * 0.3
    z[[7, 20]] = np.nan
    r = lambda x: _rounded(x, dtype)  # noqa: E731
    want_mean, want_var, terms = mp_smooth(r(z), r(R), r(0.9), r(p), 1.0)
    res = _smooth("triton", dtype, z, R, 0.9, p, 1.0)
    _check(res, want_mean, want_var, TOL[dtype])
    assert float(res.filtered.loglik) == pytest.approx(terms.sum(), rel=TOL[dtype])
