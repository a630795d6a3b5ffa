"""Gradients over a lane's leading gap of small decays, and the predicted variance where the
decay's square leaves the dtype's range, against an mpmath reference (docs/reliability.md,
"Underflow regimes").

- A diffuse lane (the default prior) whose first observations are missing (or observed with
  ``loading = 0``) stays diffuse through every step with ``decay != 0``: its log-likelihood does
  not depend on those steps' decay, process variance or offset. The derivative of everything
  after the gap with respect to the diffuse state's precision grows like ``1 / decay**2`` a step
  (``1e200`` a step at ``decay = 1e-100``; ``4**600`` over 600 steps of ``decay = 0.5``); where
  it overflowed it met exact zeros (``inf * 0``) and every gradient came out NaN
  (``sequential``, ``triton``) or an ``OverflowError`` (``native``).
- Where ``decay**2`` is below the normal range and ``process_var * precision`` is too, the
  predicted variance ``decay**2 var + process_var`` lost its first term (``var = 1e100``,
  ``decay = 1e-170``, ``process_var = 0``: 0 instead of ``1e-240``).

The reference differentiates the mpmath log-likelihood (information form, SPEC section 2) by
central differences at 400 digits (:func:`mp_gradient`).
"""

from __future__ import annotations

import functools
import importlib.util
import math

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from kalmanscan.testing import mp_information_filter
from tests.helpers import read_only

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
TRITON = importlib.util.find_spec("triton") is not None
DPS = 400
STEP = mp.mpf("1e-100")


# ------------------------------------------------------------------------------- the reference


def mp_run(z, R, a, p, h, c, m0=None, P0=None, smooth=False):
    """One lane in mpmath, information form (:func:`kalmanscan.testing.mp_information_filter`):
    ``(loglik, means, vars[, smooth_means, smooth_vars])`` as mpf (None where nothing is
    known). Parameters are per-step lists of mpf; ``z`` floats (NaN: missing); ``P0 = None``:
    diffuse."""
    T = len(z)
    lam = mp.mpf(0) if P0 is None else 1 / P0
    eta = mp.mpf(0) if P0 is None else m0 / P0
    ll, lams, etas = mp_information_filter(z, R, a, p, h, c, lam, eta)
    means = [e / lm if lm > 0 else None for lm, e in zip(lams, etas, strict=True)]
    vars_ = [1 / lm if lm > 0 else None for lm in lams]
    if not smooth:
        return ll, means, vars_
    # backward information filter (the information about x_t from the observations after t)
    L, H = mp.mpf(0), mp.mpf(0)
    sm, sv = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        ls = lams[t] + L
        if ls > 0:
            sm[t], sv[t] = (etas[t] + H) / ls, 1 / ls
        if t == 0:
            break
        if not math.isnan(z[t]):
            L, H = L + h[t] * h[t] / R[t], H + h[t] * mp.mpf(float(z[t])) / R[t]
        if a[t] == 0:
            L, H = mp.mpf(0), mp.mpf(0)
        else:
            den = 1 + p[t] * L
            L, H = a[t] * a[t] * L / den, a[t] * (H - c[t] * L) / den
    return ll, means, vars_, sm, sv


def _mpf(x):
    return [mp.mpf(float(v)) for v in np.ravel(x)]


def mp_gradient(f, params, which, dps=None, step=None):
    """Central differences of ``f(params)`` (an mpf) with respect to ``params[name][i]`` for
    ``(name, i)`` in ``which``, step ``STEP * max(|entry|, 1)``, at most half the entry's size
    (at 400 digits: truncation near 1e-200 relative, rounding near 1e-299 absolute, so
    gradients down to 1e-280 keep 20 digits; a nonzero decay stays nonzero, so a diffuse state
    stays diffuse, and a decay of 0 moves to +-1e-100: the derivative of the limit)."""
    out = {}
    dps, step = dps or DPS, step or STEP
    with mp.workdps(dps):
        base = {k: _mpf(v) for k, v in params.items()}
        for name, i in which:
            x = base[name][i]
            s = min(step * max(abs(x), 1), abs(x) / 2) if x != 0 else step
            hi = {k: list(v) for k, v in base.items()}
            lo = {k: list(v) for k, v in base.items()}
            hi[name][i] = x + s
            lo[name][i] = x - s
            out[(name, i)] = (f(hi) - f(lo)) / (2 * s)
    return out


# -------------------------------------------------------------------------------- the models


def gap_model(T, G, decay, dtype, seed=0, offset=0.3):
    """One lane of ``T`` steps: the first ``G`` missing with decay ``decay``, then decay 0.8
    and observations (one more missing), rounded to ``dtype``; float64 numpy arrays."""
    g = np.random.default_rng(seed + 17 * G)
    z = g.normal(size=T) + 0.5
    z[:G] = np.nan
    if G + 2 < T:
        z[G + 2] = np.nan
    a = np.full(T, 0.8)
    a[: G + 1] = decay  # the gap and the first observation's step
    h = 0.6 + 0.8 * g.random(T)
    R, p = 0.4, 0.7
    cast = lambda x: np.asarray(x, dtype).astype(np.float64)  # noqa: E731
    return dict(z=cast(z), a=cast(a), h=cast(h), R=float(cast(R)), p=float(cast(p)),
                c=float(cast(offset)))  # fmt: skip


def ll_grads(model, backend, dtype, prior=None, loading=True):
    """``ks.loglik`` and its gradient with respect to obs_var, decay (per step), process_var,
    offset, loading (per step; or the default loading 1) and the prior's mean and variance
    (``prior = (mean, var)``; None: diffuse, the prior's tensors still differentiated)."""
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    m = model
    leaves = dict(
        R=torch.tensor(m["R"], dtype=tdt),
        a=torch.tensor(m["a"], dtype=tdt),
        p=torch.tensor(m["p"], dtype=tdt),
        c=torch.tensor(m["c"], dtype=tdt),
        h=torch.tensor(m["h"] if loading else np.ones(len(m["z"])), dtype=tdt),
        m0=torch.tensor(0.0 if prior is None else prior[0], dtype=tdt),
        P0=torch.tensor(math.inf if prior is None else prior[1], dtype=tdt),
    )
    for v in leaves.values():
        v.requires_grad_(True)
    ll = ks.loglik(torch.tensor(m["z"], dtype=tdt), leaves["R"], leaves["a"], leaves["p"],
                   loading=leaves["h"], offset=leaves["c"], prior_mean=leaves["m0"],
                   prior_var=leaves["P0"], backend=backend)  # fmt: skip
    grads = torch.autograd.grad(ll, list(leaves.values()))
    return float(ll), {k: g.double().numpy() for k, g in zip(leaves, grads, strict=True)}


def reference(model, prior=None, loading=True):
    """mpmath log-likelihood and its gradient (float64 numbers), keys as :func:`ll_grads`."""
    z = model["z"]
    T = len(z)
    params = dict(R=[model["R"]], a=model["a"], p=[model["p"]], c=[model["c"]],
                  h=model["h"] if loading else np.ones(T),
                  m0=[0.0 if prior is None else prior[0]],
                  P0=[1.0 if prior is None else prior[1]])  # fmt: skip

    def f(x):
        P0 = None if prior is None else x["P0"][0]
        return mp_run(z, x["R"] * T, x["a"], x["p"] * T, x["h"], x["c"] * T, x["m0"][0], P0)[0]

    which = [("R", 0), ("p", 0), ("c", 0)] + [("a", i) for i in range(T)]
    # the loading where observed: :func:`grad_error` judges it only there (elsewhere 0)
    which += [("h", i) for i in range(T) if not math.isnan(z[i])] if loading else []
    which += [("m0", 0), ("P0", 0)] if prior is not None else []
    g = mp_gradient(f, params, which)
    with mp.workdps(DPS):
        ll = float(f({k: _mpf(v) for k, v in params.items()}))
    out = {k: np.zeros(len(params[k])) for k in ("R", "a", "p", "c", "h", "m0", "P0")}
    for (name, i), v in g.items():
        out[name][i] = float(v)
    out = {k: v[0] if k in ("R", "p", "c", "m0", "P0") else v for k, v in out.items()}
    return ll, out


def grad_error(got, ref, informative):
    """Largest error over the inputs, each relative to its largest reference entry (floored at
    1e-3 of the largest over all); the loading only where it is nonzero and informative."""
    floor = 1e-3 * max(float(np.max(np.abs(v))) for v in ref.values())
    worst = 0.0
    for k, r in ref.items():
        x = np.asarray(got[k], np.float64)
        r = np.asarray(r, np.float64)
        if k == "h":
            x, r = x[informative], r[informative]
        if not np.isfinite(x).all():
            return math.inf
        scale = max(float(np.max(np.abs(r), initial=0.0)), floor)
        worst = max(worst, float(np.max(np.abs(x - r), initial=0.0)) / scale)
    return worst


_REFS: dict = {}


def cached_reference(model, key, prior=None, loading=True):
    k = (key, prior, loading)
    if k not in _REFS:
        _REFS[k] = reference(model, prior, loading)
    return _REFS[k]


# decays whose square underflows to 0 or is subnormal, is normal but small (its product over a
# gap underflows), ordinary, exactly 1 and exactly 0 (a step that forgets)
DECAYS_F64 = [1e-300, 1e-200, 1e-160, 1e-155, 1e-150, 1e-100, 1e-50, 1e-10, 1e-3, 0.5, 1.0, 0.0]
DECAYS_F32 = [1e-40, 1e-30, 1e-22, 1e-19, 1e-18, 1e-12, 1e-5, 0.5, 1.0, 0.0]
GAPS = [0, 1, 3, 6]
# measured: float64 <= 1.4e-14, float32 <= 5.1e-6 (every backend)
TOL = {np.float64: 1e-12, np.float32: 1e-4}
CASES = [(np.float64, a) for a in DECAYS_F64] + [(np.float32, a) for a in DECAYS_F32]
IDS = [f"{'f64' if d == np.float64 else 'f32'}-a{a:g}" for d, a in CASES]
# one decay of each regime in the default run (a square that underflows to 0, a subnormal
# square, a small normal one whose product over the gap underflows, ordinary, exactly 1 and 0;
# float32's 1e-5 was 1.7e-2 off): the others repeat a regime, the slow step runs them
DEFAULT_DECAYS = {np.float64: (1e-300, 1e-160, 1e-100, 1e-10, 1.0, 0.0),
                  np.float32: (1e-40, 1e-22, 1e-12, 1e-5, 0.0)}  # fmt: skip
SLOW = pytest.mark.slow


def _params(cases, ids, default):
    """``cases`` as pytest params named ``ids``, those for which ``default(case)`` is false
    marked slow."""
    return [pytest.param(*c, id=i, marks=() if default(c) else SLOW)
            for c, i in zip(cases, ids, strict=True)]  # fmt: skip


def _check(model, key, backend, dtype, prior=None, loading=True):
    ll_ref, ref = cached_reference(model, key, prior, loading)
    ll, got = ll_grads(model, backend, dtype, prior, loading)
    tol = TOL[dtype]
    assert abs(ll - ll_ref) <= tol * abs(ll_ref)
    informative = ~np.isnan(model["z"])
    err = grad_error(got, ref, informative)
    assert err <= tol, (err, {k: (got[k], ref[k]) for k in ref})
    return err


@pytest.mark.parametrize("G", GAPS, ids=[f"G{g}" for g in GAPS])
@pytest.mark.parametrize(
    "dtype, decay", _params(CASES, IDS, lambda c: c[1] in DEFAULT_DECAYS[c[0]])
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_loglik_gradient_over_a_diffuse_gap(backend, dtype, decay, G):
    """A diffuse lane whose ``G`` first steps are missing, with ``decay`` in those steps and the
    first observation's: the log-likelihood and its gradient in obs_var, every step's decay,
    process_var, offset, every step's loading, and the (diffuse) prior's mean and variance,
    against mpmath (before: NaN from ``sequential`` at 1e-100 over 3 steps, an OverflowError
    from ``native``, 2.4e-6 off on ``torch`` at 1e-10 over 3 steps and 1.7e-2 in float32 at
    1e-5, and 0.08-0.17 off on every backend at a decay of 0 after a forgetting step, whose
    derivative in the decay was 0 instead of the limit's)."""
    model = gap_model(G + 6, G, decay, dtype)
    _check(model, ("gap", dtype, decay, G), backend, dtype)


TRITON_CASES = [(np.float64, a) for a in (1e-300, 1e-160, 1e-100, 1e-10, 0.0)] + [
    (np.float32, a) for a in (1e-40, 1e-22, 1e-12, 0.0)
]
TRITON_IDS = [f"{'f64' if d == np.float64 else 'f32'}-a{a:g}" for d, a in TRITON_CASES]


# every decay over 3 steps (where NaN came) and over 1 step (without CUDA the default run
# leaves most steps of 1 to the slow step: tests/_default_run.py)
@pytest.mark.skipif(not TRITON, reason="triton not installed")
@pytest.mark.parametrize("G", [1, 3], ids=["G1", "G3"])
@pytest.mark.parametrize("dtype, decay", TRITON_CASES, ids=TRITON_IDS)
def test_triton_loglik_gradient_over_a_diffuse_gap(dtype, decay, G, triton_on_cpu):
    """The fused adjoint of the triton backend (interpreter; one thread per lane over all of
    time), as :func:`test_loglik_gradient_over_a_diffuse_gap` (before: NaN at 1e-100 and 1e-12
    over 3 steps). The chunked scan's adjoint: tests/test_chunked_diffuse.py."""
    model = gap_model(G + 6, G, decay, dtype)
    _check(model, ("gap", dtype, decay, G), "triton", dtype)


PRIORS = [(0.3, 2.0), (0.3, 1e100)]


# (without CUDA the interpreted triton backend takes each decay with one of the priors by
# default, each prior twice: tests/_default_run.py)
@pytest.mark.parametrize("prior", PRIORS, ids=["P2", "P1e100"])
@pytest.mark.parametrize("decay", [1e-170, 1e-100, 1e-10, 0.0])
@pytest.mark.parametrize("backend", BACKENDS + (["triton"] if TRITON else []))
def test_loglik_gradient_with_a_proper_prior(backend, decay, prior, triton_on_cpu):
    """The same gap under a proper prior (so the gap's steps matter), gradients in the prior's
    mean and variance too (before: a decay of 0 gave the decay's gradient 0 there, not the
    limit's ``mean * dL/dmean'``: 0.08-0.17 off on every backend)."""
    model = gap_model(9, 3, decay, np.float64)
    _check(model, ("prior", decay, prior), backend, np.float64, prior=prior)


@functools.cache
def long_gap_reference(dtype, decay, G):
    """The mpmath gradient of :func:`test_long_gap_of_ordinary_decays` (the same for every
    backend: computed once)."""
    model = gap_model(G + 6, G, decay, dtype)
    T = G + 6
    z = model["z"]
    params = dict(R=[model["R"]], a=model["a"], p=[model["p"]], c=[model["c"]])
    h = _mpf(model["h"])

    def f(x):
        return mp_run(z, x["R"] * T, x["a"], x["p"] * T, h, x["c"] * T)[0]

    which = [("R", 0), ("p", 0), ("c", 0)] + [("a", i) for i in range(G - 2, T)]
    return mp_gradient(f, params, which, dps=60, step=mp.mpf("1e-20"))


@pytest.mark.parametrize("dtype, decay, G", [(np.float64, 0.5, 600), (np.float32, 0.5, 80)],
                         ids=["f64-a0.5-G600", "f32-a0.5-G80"])  # fmt: skip
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_gap_of_ordinary_decays(backend, dtype, decay, G):
    """``4**G`` passes the dtype's range: an ordinary decay over a long diffuse gap (before:
    NaN from ``sequential``, an OverflowError from ``native``). The gradient in obs_var,
    process_var, offset and the decays of the gap's last steps and after, against mpmath."""
    model = gap_model(G + 6, G, decay, dtype)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    leaves = [torch.tensor(x, dtype=tdt, requires_grad=True)
              for x in (model["R"], model["a"], model["p"], model["c"])]  # fmt: skip
    ll = ks.loglik(torch.tensor(model["z"], dtype=tdt), leaves[0], leaves[1], leaves[2],
                   loading=torch.tensor(model["h"], dtype=tdt), offset=leaves[3],
                   backend=backend)  # fmt: skip
    got = [g.double().numpy() for g in torch.autograd.grad(ll, leaves)]
    assert all(np.isfinite(g).all() for g in got)
    assert (got[1][:G] == 0).all()  # the gap's decays: nothing depends on them
    ref = long_gap_reference(dtype, decay, G)
    tol = TOL[dtype]
    scale = max(abs(float(v)) for v in ref.values())
    index = {"R": 0, "a": 1, "p": 2, "c": 3}
    for (name, i), r in ref.items():
        g = got[index[name]]
        g = g[i] if np.ndim(g) else float(g)
        assert abs(g - float(r)) <= tol * scale, (name, i, g, float(r))


_SMOOTH_REFS: dict = {}


def smooth_reference(model, which_t):
    """:func:`_smooth_reference`, computed once per model and steps (the same for every
    backend)."""
    key = (tuple((k, np.asarray(v).tobytes()) for k, v in sorted(model.items())), tuple(which_t))
    if key not in _SMOOTH_REFS:
        _SMOOTH_REFS[key] = _smooth_reference(model, which_t)
    return {k: np.copy(v) for k, v in _SMOOTH_REFS[key].items()}


def _smooth_reference(model, which_t):
    """mpmath ``sum_t (smooth_mean + smooth_var)`` over ``which_t`` plus the log-likelihood,
    and its gradient (keys as :func:`ll_grads`, no prior)."""
    z = model["z"]
    T = len(z)
    params = dict(R=[model["R"]], a=model["a"], p=[model["p"]], c=[model["c"]], h=model["h"])

    def f(x):
        ll, _, _, sm, sv = mp_run(z, x["R"] * T, x["a"], x["p"] * T, x["h"], x["c"] * T,
                                  smooth=True)  # fmt: skip
        return ll + sum(sm[t] + sv[t] for t in which_t)

    which = [("R", 0), ("p", 0), ("c", 0)] + [("a", i) for i in range(T)]
    # the loading where observed: :func:`grad_error` judges it only there (elsewhere 0)
    which += [("h", i) for i in range(T) if not math.isnan(z[i])]
    g = mp_gradient(f, params, which)
    out = {"R": 0.0, "p": 0.0, "c": 0.0, "a": np.zeros(T), "h": np.zeros(T)}
    for (name, i), v in g.items():
        if name in ("a", "h"):
            out[name][i] = float(v)
        else:
            out[name] = float(v)
    return out


# triton's smoother gradient differentiates the torch backend (its forward filter aside):
# without CUDA, by default at an underflowing square and at 0 (tests/_default_run.py)
@pytest.mark.parametrize("decay", [1e-300, 1e-160, 1e-100, 1e-10, 0.0])
@pytest.mark.parametrize("backend", BACKENDS + (["triton"] if TRITON else []))
def test_smoother_gradient_over_a_diffuse_gap(backend, decay, triton_on_cpu):
    """``ks.smooth``: the smoothed means and variances from the first observation on, and the
    log-likelihood, differentiated through the same gap (the smoother's forward filter shares
    the filter's path; ``native`` and ``triton`` differentiate the torch backend there)."""
    G = 3
    model = gap_model(G + 6, G, decay, np.float64)
    T = G + 6
    which_t = list(range(G, T))
    ref = smooth_reference(model, which_t)
    leaves = {k: torch.tensor(model[k], dtype=torch.float64, requires_grad=True)
              for k in ("R", "a", "p", "c", "h")}  # fmt: skip
    s = ks.smooth(torch.tensor(model["z"]), leaves["R"], leaves["a"], leaves["p"],
                  loading=leaves["h"], offset=leaves["c"], backend=backend)  # fmt: skip
    loss = s.filtered.loglik + (s.mean[G:] + s.var[G:]).sum()
    got = {k: g.numpy() for k, g in zip(leaves, torch.autograd.grad(loss, list(leaves.values())),
                                        strict=True)}  # fmt: skip
    informative = ~np.isnan(model["z"])
    assert grad_error(got, ref, informative) <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS + (["triton"] if TRITON else []))
def test_smoother_gradient_at_a_step_that_forgets(backend, triton_on_cpu):
    """A decay of exactly 0 in the middle of an observed lane: the smoothed moments before it
    depend on it as its limit ``a -> 0`` does (the backward filter's information
    ``a (E - c U) / (V + p U)``), not at all as its forgetting step's (before: its derivative 0
    on every backend, 0.18 off)."""
    model = gap_model(8, 0, 0.8, np.float64)
    model["a"] = model["a"].copy()
    model["a"][4] = 0.0
    T = 8
    ref = smooth_reference(model, list(range(T)))
    leaves = {k: torch.tensor(model[k], dtype=torch.float64, requires_grad=True)
              for k in ("R", "a", "p", "c", "h")}  # fmt: skip
    s = ks.smooth(torch.tensor(model["z"]), leaves["R"], leaves["a"], leaves["p"],
                  loading=leaves["h"], offset=leaves["c"], backend=backend)  # fmt: skip
    loss = s.filtered.loglik + (s.mean + s.var).sum()
    got = {k: g.numpy() for k, g in zip(leaves, torch.autograd.grad(loss, list(leaves.values())),
                                        strict=True)}  # fmt: skip
    assert grad_error(got, ref, ~np.isnan(model["z"])) <= 1e-12


# ------------------------------------------------------------- a tiny decay meets a known state


def known_state_model(dtype, decay, where):
    """One lane where a step of decay ``decay`` (square below the normal range) and no process
    noise meets a known state of huge variance: ``where = "prior"``, the prior's (variance 1e100,
    float32 1e30), at step 0; ``"later"``, after two observations, a step of process variance
    1e100 (1e30) and then the tiny decay (steps 3, 4). ``(z, R, a, p, h, c, prior)``."""
    big = 1e100 if dtype == np.float64 else 1e30
    if where == "prior":
        z = [np.nan, np.nan, 1.0, 2.0, np.nan, 0.5]
        a = [decay, 0.5, 0.5, 0.9, 0.9, 0.9]
        p = [0.0, 0.0, 0.1, 0.1, 0.1, 0.1]
        prior = (3.0, big)
    else:
        z = [1.0, 2.0, np.nan, np.nan, np.nan, 1.5, 0.5]
        a = [0.8, 0.8, 0.8, decay, 0.5, 0.9, 0.9]
        p = [0.2, 0.2, big, 0.0, 0.0, 0.1, 0.1]
        prior = None
    T = len(z)
    cast = lambda x: np.asarray(x, dtype).astype(np.float64)  # noqa: E731
    return dict(z=cast(z), R=cast(np.full(T, 0.6)), a=cast(a), p=cast(p), h=cast(np.ones(T)),
                c=cast(np.full(T, 0.2)), prior=prior)  # fmt: skip


def mp_known(m):
    z, T = m["z"], len(m["z"])
    with mp.workdps(DPS):
        P0 = None if m["prior"] is None else mp.mpf(m["prior"][1])
        m0 = mp.mpf(0) if m["prior"] is None else mp.mpf(m["prior"][0])
        x = {k: _mpf(m[k]) for k in ("R", "a", "p", "h", "c")}
        ll, means, vars_ = mp_run(z, x["R"], x["a"], x["p"], x["h"], x["c"], m0, P0)
        # the predicted variance: one predict from the filtered state before
        pv = []
        for t in range(T):
            prev = (None if P0 is None else P0) if t == 0 else vars_[t - 1]
            pv.append(None if prev is None else x["a"][t] ** 2 * prev + x["p"][t])
        as_f = lambda xs, fill: np.array([fill if y is None else float(y) for y in xs])  # noqa: E731
        return (float(ll), as_f(means, math.nan), as_f(vars_, math.inf), as_f(pv, math.inf))


@functools.cache
def known_reference(dtype, decay, where):
    """:func:`mp_known` of the model, the derivative of the filtered variance after the tiny
    decay's step in that decay, and the log-likelihood's in every decay: the same for every
    backend, computed once (the arrays are read only)."""
    m = known_state_model(dtype, decay, where)
    k = 0 if where == "prior" else 3  # the tiny decay's step
    T = len(m["z"])
    with mp.workdps(DPS):
        x = {key: _mpf(m[key]) for key in ("R", "a", "p", "h", "c")}
        P0 = None if m["prior"] is None else mp.mpf(m["prior"][1])
        m0 = mp.mpf(0) if m["prior"] is None else mp.mpf(m["prior"][0])

        def f(y):
            return mp_run(m["z"], x["R"], y["a"], x["p"], x["h"], x["c"], m0, P0)[2][k + 1]

        def f_ll(y):
            return mp_run(m["z"], x["R"], y["a"], x["p"], x["h"], x["c"], m0, P0)[0]

        var_grad = float(mp_gradient(f, {"a": m["a"]}, [("a", k)])[("a", k)])
        ll_grad = mp_gradient(f_ll, {"a": m["a"]}, [("a", i) for i in range(T)])
    ll_grad = np.array([float(ll_grad[("a", i)]) for i in range(T)])
    return read_only(*mp_known(m), var_grad, ll_grad)


KNOWN_CASES = [(np.float64, 1e-170, "prior"), (np.float64, 1e-160, "prior"),
               (np.float64, 1e-170, "later"), (np.float32, 1e-25, "prior"),
               (np.float32, 1e-22, "later")]  # fmt: skip
KNOWN_IDS = [f"{'f64' if d == np.float64 else 'f32'}-a{a:g}-{w}" for d, a, w in KNOWN_CASES]


# (without CUDA the interpreted triton backend takes float64 at both places and float32
# "later" by default, about 1.5 s a case: tests/_default_run.py)
@pytest.mark.parametrize("dtype, decay, where", KNOWN_CASES, ids=KNOWN_IDS)
@pytest.mark.parametrize("backend", BACKENDS + (["triton"] if TRITON else []))
def test_tiny_decay_meets_a_known_state(backend, dtype, decay, where, triton_on_cpu):
    """``decay**2`` below the normal range and ``process_var * precision`` too: the predicted
    variance ``decay**2 var + process_var`` keeps its first term (``1e100 * 1e-340 = 1e-240``;
    before: 0 on every backend, 5e-224 on ``native``, which adds the smallest subnormal to
    ``a*a``), and the filtered and predicted means and variances and the log-likelihood match
    mpmath; so does the derivative of the filtered variance after the step in the decay
    (``2 a var``, 1e-70)."""
    m = known_state_model(dtype, decay, where)
    ll_ref, mean_ref, var_ref, pvar_ref, var_grad_ref, ll_grad_ref = known_reference(
        dtype, decay, where
    )
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    t = lambda k: torch.tensor(m[k], dtype=tdt)  # noqa: E731
    a = t("a").requires_grad_(True)
    prior = {} if m["prior"] is None else dict(prior_mean=m["prior"][0], prior_var=m["prior"][1])
    r = ks.filter(t("z"), t("R"), a, t("p"), loading=t("h"), offset=t("c"), backend=backend,
                  **prior)  # fmt: skip
    tol = TOL[dtype]
    k = 0 if where == "prior" else 3  # the tiny decay's step
    for got, ref in ((r.var, var_ref), (r.pred_var, pvar_ref)):
        got = got.detach().double().numpy()
        assert np.array_equal(np.isfinite(got), np.isfinite(ref))
        fin = np.isfinite(ref)
        assert np.max(np.abs(got[fin] / ref[fin] - 1)) <= tol, (got, ref)
    mean = r.mean.detach().double().numpy()
    fin = np.isfinite(mean_ref)
    assert np.max(np.abs(mean[fin] - mean_ref[fin])) <= tol * np.max(np.abs(mean_ref[fin]))
    assert abs(float(r.loglik) - ll_ref) <= tol * abs(ll_ref)
    (g,) = torch.autograd.grad(r.var[k + 1], a)
    ref = var_grad_ref
    assert ref != 0 and abs(float(g[k]) / ref - 1) <= tol, (float(g[k]), ref)
    ll = ks.loglik(t("z"), t("R"), a, t("p"), loading=t("h"), offset=t("c"), backend=backend,
                   **prior)  # fmt: skip
    assert abs(float(ll) - ll_ref) <= tol * abs(ll_ref)
    (g,) = torch.autograd.grad(ll, a)
    ref = ll_grad_ref
    g = g.double().numpy()
    assert np.max(np.abs(g - ref)) <= tol * np.max(np.abs(ref)), (g, ref)
