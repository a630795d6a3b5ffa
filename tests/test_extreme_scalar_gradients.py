"""The scalar filter's values and gradients where variances, data and log-likelihoods reach the
ends of float64's range (float32's), on the sequential, torch and native backends, against
mpmath.

- a normalized triple ``(1/var, mean/var, 1)`` with a variance of 1e300: the log-likelihood's
  derivative in its ``u`` is about ``|loglik| var`` (-3.2e99 x 1e300) and passed the range, as did
  the smoothed mean's (``|mean| var``): NaN gradients in ``obs_var``, ``process_var``, ``decay``,
  ``prior_var``. Triples whose variance is above ``2**64`` (float32: ``2**48``) are now held at
  ``u = 2**-64`` (``steps.normalize``), the smoother combines them as weighted means
  (``steps._combine_held``) and the torch scan runs such states in per-step units
  (``parallel._far``);
- ``sequential``'s update ``(R u + h^2 v, R e + h z v, R v)``: ``obs_var`` 1e300 times a mean of
  1e10 overflowed (OverflowError, where ``torch`` matched mpmath); it is formed scaled where a
  product would pass the range (``steps.observe``);
- the torch scan's exact leaves: a time-invariant ``decay`` of 0 (a step that forgets) got its
  per-step derivatives summed before the forget slope applied (2.43 for 0.50), and a leaf's
  derivative times its adjoint overflowed where the product does not (a decay 0 times an offset
  of 1e150 in the unit ``2**332``: NaN).

Truth: a covariance-form filter and smoother in mpmath at 400 digits on the inputs as the dtype
holds them (the update written ``(m R + P h z) / S`` and the smoothed mean
``m + P (E - L m) / (1 + P L)``: no cancellation the float filter does not have); derivatives by
the complex step, of ``10**-(DPS/3)`` times the input (a step of ``1e-40 |x|`` left a truncation
error of its square times the third derivative: ``d ll / d loading`` came out -2.5e19 for -0.5 on
data of 1e50). A derivative at a step that forgets is the limit's (``decay -> 0``). Each derivative
is judged relative to itself plus a floor: the magnitude of the output's terms the input reaches
(the log-likelihood's from its step on, as the information form splits them; the smoothed
means) per unit of the input, its magnitude or, at 0, that of the term it enters (an offset's
mean, a process variance's variance: :func:`_units`). The floor ``(|loglik| + 1) / max(|x|, 1)``
before it, 3e99 for an offset or a process variance of 0, let a derivative replaced by 0 pass.
"""

from __future__ import annotations

import copy
import math
import warnings

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from kalmanscan.testing import tolerance
from tests.helpers import process_cache

NAN = math.nan
DPS = 400
BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
KEYS = ("R", "a", "p", "h", "c", "z")


def mp_lane(z, R, a, p, h, c, m0, P0):
    """``(ll, mean, var, smean, svar, parts)`` of one lane (lists of mp numbers, None where
    nothing is known); ``z`` None where missing, ``P0`` None: diffuse; ``a == 0`` forgets.
    ``parts``: each step's log-likelihood terms (``"ll"``, a list a step: ``-log(2 pi S/P)/2``,
    ``-log(P)/2``, ``-r^2/(2 S)``, as the information form splits them), the predicted means and
    variances (``"pm"``, ``"pv"``) and the filtered ones entering each step (``"m_in"``,
    ``"v_in"``)."""
    T = len(z)
    m, P = (None, None) if P0 is None else (m0, P0)
    parts = {"ll": [[] for _ in range(T)], "pm": [], "pv": [], "m_in": [], "v_in": []}
    mean, var = [], []
    for t in range(T):
        parts["m_in"].append(m)
        parts["v_in"].append(P)
        if a[t] == 0:
            m, P = c[t], p[t]
        elif P is not None:
            m, P = a[t] * m + c[t], a[t] ** 2 * P + p[t]
        parts["pm"].append(m)
        parts["pv"].append(P)
        if z[t] is not None:
            if P is None:
                if h[t] == 0:
                    parts["ll"][t] = [-mp.log(2 * mp.pi * R[t]) / 2, -(z[t] ** 2) / R[t] / 2]
                else:
                    m, P = z[t] / h[t], R[t] / h[t] ** 2
            else:
                S = h[t] ** 2 * P + R[t]
                parts["ll"][t] = [-mp.log(2 * mp.pi * S / P) / 2, -mp.log(P) / 2,
                                  -((z[t] - h[t] * m) ** 2) / S / 2]  # fmt: skip
                m, P = (m * R[t] + P * h[t] * z[t]) / S, P * R[t] / S
        mean.append(m)
        var.append(P)
    L, E = mp.mpf(0), mp.mpf(0)  # the information from the observations after t
    smean, svar = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        if var[t] is None:
            smean[t], svar[t] = (E / L, 1 / L) if L != 0 else (None, None)
        else:
            den = 1 + var[t] * L
            smean[t], svar[t] = mean[t] + var[t] * (E - L * mean[t]) / den, var[t] / den
        if z[t] is not None:
            L, E = L + h[t] ** 2 / R[t], E + h[t] * z[t] / R[t]
        if a[t] == 0:
            L, E = mp.mpf(0), mp.mpf(0)
        else:
            den = 1 + p[t] * L
            L, E = a[t] ** 2 * L / den, a[t] * (E - c[t] * L) / den
    return mp.fsum(x for xs in parts["ll"] for x in xs), mean, var, smean, svar, parts


def _rounded(x, dtype):
    return torch.as_tensor(np.asarray(x, np.float64)).to(dtype).double().numpy()


def _inputs(case, dtype):
    """The case as ``[T, N]`` float64 arrays rounded to ``dtype`` (keys of KEYS) and ``[N]``
    priors ``m0``, ``P0`` (inf: diffuse); a case's entry is a number, ``[T]`` or ``[T, N]``."""
    z = np.asarray(case["z"], np.float64)
    z = z[:, None] if z.ndim == 1 else z
    T, N = z.shape

    def full(x):
        x = np.asarray(x, np.float64)
        return _rounded(np.broadcast_to(x[:, None] if x.ndim == 1 else x, (T, N)).copy(), dtype)

    ins = {k: full(case.get(k, d)) for k, d in (("R", 1.0), ("a", 1.0), ("p", 0.0), ("h", 1.0),
                                                 ("c", 0.0))}  # fmt: skip
    ins["z"] = full(z)
    for k, d in (("m0", 0.0), ("P0", math.inf)):
        prior = np.broadcast_to(np.asarray(case.get(k, d), np.float64), (N,))
        ins[k] = _rounded(prior.copy(), dtype)
    return ins


def _mp_args(ins, n, over=None):
    """Lane ``n``'s mpmath arguments; ``over``: ``{(key, t) or (key,): mp number}``."""
    over = over or {}
    T = ins["z"].shape[0]
    col = {k: [over.get((k, t), mp.mpf(float(ins[k][t, n]))) for t in range(T)] for k in KEYS}
    col["z"] = [None if math.isnan(ins["z"][t, n]) else col["z"][t] for t in range(T)]
    P0 = float(ins["P0"][n])
    P0 = None if math.isinf(P0) else over.get(("P0",), mp.mpf(P0))
    m0 = over.get(("m0",), mp.mpf(float(ins["m0"][n])))
    return col["z"], col["R"], col["a"], col["p"], col["h"], col["c"], m0, P0


def _lane(ins, n):
    """Lane ``n``'s own inputs (``[T]`` columns, ``[1]`` priors): all a reference of it reads."""
    return tuple((k, v[:, n] if v.ndim == 2 else v[n : n + 1]) for k, v in sorted(ins.items()))


def _memo(fn):
    """``fn(ins, n, *rest)`` computed once per content of lane ``n`` (:func:`_lane`: the mpmath
    references are the same for every backend, and for a lane alone or among others; only the
    backend's side is run again; one cache a process: :func:`tests.helpers.process_cache`)."""
    cache = process_cache(f"test_extreme_scalar_gradients.{fn.__name__}")

    def wrapped(ins, n, *rest):
        key = (tuple((k, v.shape, v.tobytes()) for k, v in _lane(ins, n)), *rest)
        if key not in cache:
            cache[key] = fn(ins, n, *rest)
        return copy.deepcopy(cache[key])

    wrapped.cache = cache
    return wrapped


@_memo
def _truth(ins, n):
    """Lane ``n``: ``(ll, mean, var, smean, svar)`` as floats (NaN / inf where unknown)."""
    with mp.workdps(DPS):
        ll, mean, var, smean, svar, _ = mp_lane(*_mp_args(ins, n))
        conv = lambda xs, fill: np.array([fill if x is None else float(x) for x in xs])  # noqa: E731
        return (float(ll), conv(mean, NAN), conv(var, math.inf), conv(smean, NAN),
                conv(svar, math.inf))  # fmt: skip


def _mp_grad(ins, n, key, of):
    """Complex-step derivatives of lane ``n``'s log-likelihood (``of="ll"``) or the sum of its
    smoothed means (``"smean"``) in each step's ``key`` (``[T]``), or in ``m0`` / ``P0``
    (``[1]``): :func:`_mp_grads`' ``of``."""
    return _mp_grads(ins, n, key)[of]


@_memo
def _mp_grads(ins, n, key):
    """``{"ll": ..., "smean": ...}``: :func:`_mp_grad` of both outputs, from the same complex
    steps (one :func:`mp_lane` run a step gives both). The step is ``10**-(DPS/3)`` times the
    input (``1e-300`` times that at 0): its truncation error, the step squared times the third
    derivative, stays far below the derivative on these magnitudes (mpmath keeps the imaginary
    parts' digits at any scale)."""
    T = ins["z"].shape[0]
    where = [(key,)] if key in ("m0", "P0") else [(key, t) for t in range(T)]
    out = {"ll": np.zeros(len(where)), "smean": np.zeros(len(where))}
    with mp.workdps(DPS):
        rel = mp.mpf(10) ** -(DPS // 3)
        for i, w in enumerate(where):
            x = float(ins[key][n] if len(w) == 1 else ins[key][w[1], n])
            if math.isnan(x):  # (a missing z)
                continue
            step = mp.mpf(abs(x) if x != 0 else 1e-300) * rel
            res = mp_lane(*_mp_args(ins, n, {w: mp.mpc(x, step)}))
            out["ll"][i] = float(mp.im(res[0]) / step)
            smean = mp.fsum(s for s in res[3] if s is not None)
            out["smean"][i] = float(mp.im(smean) / step)
    return out


def _units(ins, n, parts):
    """Each input's unit in lane ``n`` (``{key: [T] or [1]}``): its magnitude, or where it is 0
    that of what it would enter (``parts``: :func:`mp_lane`'s): an offset's the mean it is
    added to (``a m``), a process variance's the variance (``a^2 P``), a datum's ``h m``, the
    prior mean's the larger of the prior's sd and the first observation's ``|z / h|``, a
    decay's ``|c| / |m|`` and a loading's ``|z| / max(|m|, sd)``; 1 where that is 0 or unknown
    too."""
    T = ins["z"].shape[0]
    f = lambda x: math.nan if x is None else abs(float(x))  # noqa: E731  (NaN: unknown)
    col = {k: np.abs(ins[k][:, n]) for k in KEYS}
    m_in, v_in = np.array([f(x) for x in parts["m_in"]]), np.array([f(x) for x in parts["v_in"]])
    pm, pv = np.array([f(x) for x in parts["pm"]]), np.array([f(x) for x in parts["pv"]])
    with np.errstate(divide="ignore", invalid="ignore"):
        own = dict(R=np.zeros(T), c=col["a"] * m_in, p=col["a"] ** 2 * v_in, z=col["h"] * pm,
                   a=col["c"] / m_in, h=col["z"] / np.maximum(pm, np.sqrt(pv)))  # fmt: skip
    out = {k: np.where(col[k] != 0, col[k], own[k]) for k in KEYS}
    seen = [abs(z / h) for z, h in zip(ins["z"][:, n], ins["h"][:, n], strict=True)
            if not math.isnan(z) and h != 0]  # fmt: skip
    m0 = abs(float(ins["m0"][n])) or max([math.sqrt(float(ins["P0"][n]))] + seen[:1])
    out["m0"] = np.array([m0])
    out["P0"] = np.array([float(ins["P0"][n])])
    return {k: np.where((x > 0) & np.isfinite(x), x, 1.0) for k, x in out.items()}


@_memo
def _floors(ins, n, of):
    """Each input's floor in lane ``n``: the magnitude of the output's terms it reaches per unit
    of it (:func:`_units`), the log-likelihood's terms from its step on (every step's for the
    prior's) or the smoothed means' (:func:`mp_lane`): what their rounding leaves of a
    derivative."""
    with mp.workdps(DPS):
        _, _, _, smean, _, parts = mp_lane(*_mp_args(ins, n))
        if of == "ll":
            per = np.array([float(mp.fsum(abs(x) for x in xs)) for xs in parts["ll"]])
            reach = np.cumsum(per[::-1])[::-1]  # (the terms from step t on)
        else:
            total = float(mp.fsum(abs(x) for x in smean if x is not None))
            reach = np.full(ins["z"].shape[0], total)
    units = _units(ins, n, parts)
    out = {k: reach / units[k] for k in KEYS}
    out.update(m0=reach[:1] / units["m0"], P0=reach[:1] / units["P0"])
    return out


def _call(ins, dtype, backend, of, grad=()):
    """``ks.loglik`` (``of="ll"``) or ``ks.smooth`` on the inputs, leaves ``grad`` differentiable:
    ``(result, leaves)``."""
    t = {k: torch.tensor(ins[k], dtype=dtype, requires_grad=k in grad) for k in ins}
    kw = dict(loading=t["h"], offset=t["c"], prior_mean=t["m0"], prior_var=t["P0"],
              backend=backend)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a lane's NaN log-likelihood: limit 5)
        fn = ks.loglik if of == "ll" else ks.smooth
        return fn(t["z"], t["R"], t["a"], t["p"], **kw), t


def _grad_keys(ins, n):
    """The inputs to differentiate: every step's, the prior's mean and variance where proper."""
    return KEYS + (("m0", "P0") if math.isfinite(ins["P0"][n]) else ())


def _check_grad(ins, dtype, backend, of, lanes=None):
    """Every lane's derivatives against the complex step: relative to the truth's magnitude
    plus the input's floor (:func:`_floors`: the rounding of the output's terms it reaches per
    unit of the input; a derivative whose truth and floor are both 0 is to be 0)."""
    N = ins["z"].shape[1]
    keys = _grad_keys(ins, 0)
    if any(math.isfinite(ins["P0"][n]) != math.isfinite(ins["P0"][0]) for n in range(N)):
        keys = KEYS + ("m0",)
    res, t = _call(ins, dtype, backend, of, grad=keys)
    out = res if of == "ll" else res.mean
    got = torch.autograd.grad(out.nansum(), [t[k] for k in keys])
    tol = tolerance("oracle_grad" if dtype == torch.float64 else "truth", dtype)
    for n in range(N) if lanes is None else lanes:
        floors = _floors(ins, n, of)
        for k, g in zip(keys, got, strict=True):
            g = (g[n : n + 1] if g.dim() == 1 else g[:, n]).double().numpy()
            want, floor = _mp_grad(ins, n, k, of), floors[k]
            assert np.all(np.isfinite(g)), (backend, of, n, k, g, want)
            scale = np.abs(want) + floor
            err = np.where(scale > 0, np.abs(g - want) / np.where(scale > 0, scale, 1.0),
                           np.where(g == want, 0.0, np.inf))  # fmt: skip
            assert np.max(err) <= tol, (backend, of, n, k, g, want, floor)


def _check_values(ins, dtype, backend):
    """Filtered and smoothed moments and the log-likelihood of every lane against mpmath: means
    relative to max(|mean|, sd), variances and the log-likelihood relative."""
    tol = tolerance("oracle" if dtype == torch.float64 else "truth", dtype)
    res, _ = _call(ins, dtype, backend, "smooth")
    f = res.filtered
    for n in range(ins["z"].shape[1]):
        ll, mean, var, smean, svar = _truth(ins, n)
        assert float(f.loglik.reshape(-1)[n]) == pytest.approx(ll, rel=tol, abs=tol)
        for gm, gv, m, v in ((f.mean, f.var, mean, var), (res.mean, res.var, smean, svar)):
            gm, gv = gm[:, n].double().numpy(), gv[:, n].double().numpy()
            known = np.isfinite(v)
            assert np.array_equal(np.isfinite(gv), known), (backend, n, gv, v)
            scale = np.maximum(np.abs(m[known]), np.sqrt(v[known]))
            assert np.max(np.abs(gm[known] - m[known]) / scale, initial=0) <= tol, (gm, m)
            assert np.max(np.abs(gv[known] / v[known] - 1), initial=0) <= tol, (gv, v)


def _alternating(T, big, scale, R, seed=7):
    """Process variances alternating 0 and ``big`` on data of scale ``scale``, a fifth missing."""
    rng = np.random.default_rng(seed)
    z = scale * rng.normal(1.0, 0.1, T)
    z[rng.random(T) < 0.2] = NAN
    return dict(z=z, R=R, p=np.where(np.arange(T) % 2 == 1, big, 0.0), P0=R)


# (id, dtype, case): one lane each, T <= 6 unless the id says otherwise
# fmt: off
CASES = [
    # the reproduction: |loglik| 3.2e99 over the predicted precision 1e-300
    ("issue-P1e300-f64", torch.float64,
     dict(z=[1e200, 1.1e200], R=1e300, p=[0.0, 1e300], P0=1e300)),
    ("issue-diffuse-f64", torch.float64,
     dict(z=[1e200, 1.1e200, 0.9e200], R=1e300, p=[0.0, 1e300, 0.0])),
    # the prior's variance carried by process_var = 0 (the torch scan's lane unit 1)
    ("carried-P1e300-p0-f64", torch.float64,
     dict(z=[1e200, 1.1e200, 1.2e200], R=1e300, p=0.0, P0=1e300)),
    # |mean| 1e200 x variance 1e150 (the smoothed mean's), |loglik| 1.5e250
    ("mean1e200-var1e150-f64", torch.float64,
     dict(z=[1e200, 1.1e200, 1.2e200], R=1e150, p=1e150, P0=1e150)),
    # decay 1e3 over a gap: the variance grows by 1e6 a step to 1e264
    ("decay-growth-gap-f64", torch.float64,
     dict(z=[1.0] + [NAN] * 44 + [2.0, 1.5], R=1.0, a=1e3, p=1.0, P0=1.0)),
    # a step that forgets from a held state (c (u + v) passed the range), loading 0.5
    ("forget-held-f64", torch.float64,
     dict(z=[1e200, NAN, 1.1e200, 0.9e200], R=1e300, a=[1.0, 0.0, 1.0, 1.0],
          p=[0.0, 1e250, 1e300, 0.0], c=[0.0, 1e100, 0.0, 0.0], h=0.5, P0=1e300, m0=1e200)),
    # forgetting, then obs_var 1e300: the smoother's information about the step before
    ("forget-then-R1e300-f64", torch.float64,
     dict(z=[NAN, 7.6e49, 8.3e49, 3.9e49, NAN, 6.9e49], R=1e300, a=[0.9, 1.0, 1.5, 0.0, 1.0, 1.0],
          p=[1.67, 1.23, 0.0, 1.54e300, 8.63e299, 1.38e300], c=[0.0, 0.0, 0.0, -7.1e49, 0.0, 0.0],
          m0=1e50, P0=1e300)),
    # the prior's variance 1e100 in a lane of process variances up to 1.3e100: its unit's leaves
    # (a decay 0 times an offset of 1.4e150)
    ("lane-unit-forget-f64", torch.float64,
     dict(z=[NAN, 1.44e150, 8.5e149, NAN, 1.05e150], R=1.0, a=[1.0, 1.0, 1.0, 0.0, 0.9],
          p=[1.27e100, 0.89, 1.09, 1.3e100, 0.74], c=[0.0, 0.0, 0.0, 1.38e150, 0.0], m0=1e150,
          P0=1e100)),
    ("alternating-T70-f64", torch.float64, _alternating(70, 1e300, 1e150, 1e300)),
    ("issue-f32", torch.float32,
     dict(z=[1e20, 1.1e20, 0.9e20], R=1e36, p=[0.0, 1e36, 0.0], P0=1e36)),
    ("mean1e18-var1e25-f32", torch.float32,
     dict(z=[1e18, 1.1e18, 1.2e18], R=1e25, p=1e25, P0=1e25)),
]
# fmt: on
IDS = [c[0] for c in CASES]
# The mpmath references are computed once a process (_memo) for every test, backend and file
# (tests/test_native_extreme_variances.py) that asks: the tests of a case whose references take
# seconds run on one pytest-xdist worker (``--dist loadgroup``), which computes them once.
SHARED = {"decay-growth-gap-f64": [pytest.mark.xdist_group("extreme-decay-growth-gap")],
          1: [pytest.mark.xdist_group("extreme-random-lanes-1")]}  # fmt: skip
# the gradients' cases: the 70-step alternating lane's take 11-13 s each against mpmath on one
# core (the heaviest of the default run), so they run in CI's slow step
SLOW = {"alternating-T70-f64": [pytest.mark.slow]}
GRAD_CASES = [pytest.param(*c, id=c[0], marks=SLOW.get(c[0], SHARED.get(c[0], []))) for c in CASES]
SEEDS = [pytest.param(seed, marks=SHARED.get(seed, [])) for seed in (1, 2, 3)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cid, dtype, case", GRAD_CASES)
def test_loglik_gradient_matches_mpmath(cid, dtype, case, backend):
    """The log-likelihood's gradient in every input (NaN before)."""
    _check_grad(_inputs(case, dtype), dtype, backend, "ll")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cid, dtype, case", GRAD_CASES)
def test_smoothed_mean_gradient_matches_mpmath(cid, dtype, case, backend):
    """The gradient of the smoothed means' sum in every input (NaN before)."""
    _check_grad(_inputs(case, dtype), dtype, backend, "smean")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cid, dtype, case", CASES, ids=IDS)
def test_values_match_mpmath(cid, dtype, case, backend):
    """Filtered and smoothed moments and the log-likelihood (a guard: the held triples change
    only how a state is scaled)."""
    _check_values(_inputs(case, dtype), dtype, backend)


# a loading of 0 at a step whose predicted variance is 1e300: d/d(h^2) = g v- passed the range,
# and times h = 0 gave a NaN gradient in the loading (steps.loglik_terms: h (h v-))
LOADING0 = dict(z=[1e50, 1e50, 1e50], h=[1.0, 0.0, 1.0], p=[0.0, 1e300, 0.0], m0=1e50, P0=1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loading_of_0_at_a_variance_of_1e300(backend):
    """Values and both gradients (the loading's NaN before)."""
    ins = _inputs(LOADING0, torch.float64)
    _check_values(ins, torch.float64, backend)
    for of in ("ll", "smean"):
        _check_grad(ins, torch.float64, backend, of)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize("h1", [0.0, 1e-300])
def test_native_adjoint_at_a_tiny_loading_at_a_variance_of_1e300(h1):
    """The native kernel's adjoint itself (``native.loglik_grad``, in the units given: the API
    rescales the step of a loading of 1e-300) on LOADING0 with the loading ``h1`` at the step of
    variance 1e300: its ``2 h var A`` (``var A`` past the range) was NaN at 0 and inf at 1e-300.
    Every step's partials against mpmath, and the loading's at that step relative to itself."""
    ins = _inputs(dict(LOADING0, h=[1.0, h1, 1.0]), torch.float64)
    t = {k: torch.tensor(ins[k]) for k in KEYS}
    x0 = (torch.ones(1, dtype=torch.float64), torch.tensor(ins["m0"]), torch.tensor(ins["P0"]))
    g = native.loglik_grad(t["z"], t["R"], t["a"], t["p"], t["h"], t["c"], x0)
    assert not g["flags"] & native.NOT_FINITE
    tol = tolerance("oracle_grad", torch.float64)
    with np.errstate(over="ignore", divide="ignore"):  # (a floor per unit of 1e-300: inf)
        floors = _floors(ins, 0, "ll")
    names = dict(z="z", R="obs_var", a="decay", p="process_var", h="loading", c="offset")
    for k, name in names.items():
        got, want = g[name][:, 0].numpy(), _mp_grad(ins, 0, k, "ll")
        assert np.all(np.isfinite(got)), (k, got)
        assert np.all(np.abs(got - want) <= tol * (np.abs(want) + floors[k])), (k, got, want)
    want = _mp_grad(ins, 0, "h", "ll")[1]
    assert float(g["loading"][1, 0]) == pytest.approx(want, rel=tol)


# obs_var x |mean| past the range: 1e300 x 1e10 (its own step), a proper prior's mean 1e10
# fmt: off
OBS_CASES = [
    ("R1e300-mean1e10", dict(z=[1e10, 1.1e10, 0.9e10], R=[1.0, 1e300, 1.0], p=1.0)),
    ("R1e300-prior1e10", dict(z=[1e10, 1e10], R=1e300, p=1.0, m0=1e10, P0=1.0)),
    ("R1e300-mean1e10-forget", dict(z=[1e10, NAN, 1.2e10], R=[1.0, 1.0, 1e300],
                                    a=[1.0, 0.0, 1.0], p=1.0, c=[0.0, 3e9, 0.0])),
]
# fmt: on


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cid, case", OBS_CASES, ids=[c[0] for c in OBS_CASES])
def test_obs_var_times_mean_past_the_range(cid, case, backend):
    """``sequential`` raised OverflowError (its update's ``R e``); values and both gradients."""
    ins = _inputs(case, torch.float64)
    _check_values(ins, torch.float64, backend)
    for of in ("ll", "smean"):
        _check_grad(ins, torch.float64, backend, of)


def test_one_extreme_lane_among_ordinary_ones():
    """A batch: the reproduction's lane next to ordinary ones (one unit for the call on the
    torch backend); every lane's gradients against mpmath, on both backends."""
    rng = np.random.default_rng(11)
    T = 5
    z = rng.normal(0.0, 1.0, (T, 3))
    z[:, 0] = [1e200, 1.1e200, NAN, 0.9e200, 1.05e200]
    z[2, 2] = NAN
    case = dict(z=z, R=np.array([[1e300, 0.5, 2.0]]), a=np.array([[1.0, 0.9, -0.7]]),
                p=np.array([[0.0, 0.1, 0.3]]).repeat(T, 0), P0=np.array([1e300, 1.0, 2.0]),
                m0=np.array([0.0, 0.0, 1.0]))  # fmt: skip
    case["p"][1:, 0] = [1e300, 0.0, 1e300, 0.0]
    ins = _inputs(case, torch.float64)
    for backend in BACKENDS:
        for of in ("ll", "smean"):
            _check_grad(ins, torch.float64, backend, of)


def _sweep_lane(rng, T):
    """A random lane of mixed extremes: process variances 0, 1e-100, 1 or huge; decays 1, 0.9,
    -1, 1.5 and 0 (with an offset); loadings 1, 0.5, 0, 1e-3 and 30; data of scale 1 to 1e200;
    a quarter missing; obs_var 1, huge or the data's scale squared (at most 1e198); a diffuse,
    huge or unit prior. Kept where the log-likelihood is below ``2**900`` (its derivatives then
    are numbers: the hold, steps.normalize), so is ``P z / R`` at a loading of 0 (the mean's
    derivative in it), and a step that forgets does not meet a diffuse state (no derivative in
    its decay there); a diffuse lane's loadings are not 0 up to its first observation (the
    exact diffuse log-likelihood jumps there: no derivative in them)."""
    while True:
        scale = rng.choice([1.0, 1e50, 1e150, 1e200])
        big = rng.choice([1e100, 1e200, 1e300])
        p = rng.choice([0.0, 1.0, big, 1e-100], size=T, p=[0.3, 0.3, 0.3, 0.1])
        a = rng.choice([1.0, 0.9, -1.0, 0.0, 1.5], size=T, p=[0.5, 0.2, 0.1, 0.1, 0.1])
        p = np.where((a == 0) & (p == 0), 1.0, p) * rng.uniform(0.5, 2.0, T)
        h = rng.choice([1.0, 0.5, 0.0, 1e-3, 30.0], size=T, p=[0.4, 0.2, 0.2, 0.1, 0.1])
        z = scale * rng.normal(1.0, 0.3, T)
        z[rng.random(T) < 0.25] = NAN
        lane = dict(z=z, R=rng.choice([1.0, big, min(scale, 1e100) ** 2 * 1e-2]), a=a, p=p,
                    h=h, c=np.where(a == 0, scale * rng.normal(0.0, 1.0, T), 0.0), m0=scale,
                    P0=rng.choice([math.inf, big, 1.0]))  # fmt: skip
        seen = np.cumsum(~np.isnan(z)) - ~np.isnan(z)  # (observed before step t)
        if math.isinf(lane["P0"]) and np.any((a == 0) & (seen == 0)):
            continue
        if math.isinf(lane["P0"]):
            h[(seen == 0) & (h == 0)] = 1.0
        ins = _inputs(lane, torch.float64)
        with mp.workdps(DPS):
            ll, *_, parts = mp_lane(*_mp_args(ins, 0))
            # (at a loading of 0 the mean's derivative in it is P z / R: within the range)
            steep = any(mp.fabs(P * z[t] / ins["R"][t, 0]) > 2.0**900
                        for t, P in enumerate(parts["pv"])
                        if h[t] == 0 and P is not None and not math.isnan(z[t]))  # fmt: skip
        if abs(ll) < 2.0**900 and not steep:
            return lane


@pytest.mark.parametrize("seed", SEEDS)
def test_random_extreme_lanes_match_mpmath(seed):
    """Eight random lanes of mixed extremes (:func:`_sweep_lane`), six steps, a call each:
    values, the log-likelihood's and the smoothed means' gradients, both backends."""
    rng = np.random.default_rng(500 + seed)
    for _ in range(8):
        ins = _inputs(_sweep_lane(rng, 6), torch.float64)
        for backend in BACKENDS:
            _check_values(ins, torch.float64, backend)
            for of in ("ll", "smean"):
                _check_grad(ins, torch.float64, backend, of)


@pytest.mark.parametrize("smooth", [False, True], ids=["filter", "smooth"])
def test_time_invariant_decay_that_forgets_in_per_step_units(smooth):
    """A decay of 0 given once for every step ([1, 1]), in a lane the torch scan runs in
    per-step units (process variances 1e-200 and 1e200): its gradient is the per-step one summed,
    as with the decay given per step (it was 2.43 for 0.50 filtered, 3.73 for 0.50 smoothed)."""
    z = torch.tensor([[0.5], [-0.2], [0.3], [1.1]], dtype=torch.float64)
    p = torch.tensor([[80.0], [1e-200], [1e200], [80.0]], dtype=torch.float64)
    got = {}
    for backend in BACKENDS:
        for shape in ((1, 1), (4, 1)):
            a = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
            fn = ks.smooth if smooth else ks.filter
            r = fn(z, 0.05, a, p, offset=-0.2, prior_mean=-1.39, prior_var=1.0, backend=backend)
            got[backend, shape] = torch.autograd.grad(r.mean.sum(), [a])[0].sum().item()
    want = got["sequential", (4, 1)]
    for key, g in got.items():
        assert g == pytest.approx(want, rel=1e-12), (key, got)


def test_a_prediction_past_the_range_from_a_held_state_is_lost():
    """From a held state (a prior variance of 1e250 over a gap) a decay of 1e100 predicts a
    variance of 1e450: lost (limit 5), the log-likelihood NaN with a warning, the moments from
    that step on those of the data after it (within 1e-450 of the truth; mpmath from a diffuse
    state), on both backends."""
    z = torch.tensor([NAN, 2e100, 3e100, 2.5e100], dtype=torch.float64)
    a = torch.tensor([1.0, 1e100, 1.0, 1.0], dtype=torch.float64)
    for backend in BACKENDS:
        with pytest.warns(RuntimeWarning, match="log-likelihood is NaN"):
            r = ks.filter(z, 1.0, a, 1.0, prior_var=1e250, backend=backend)
        assert math.isnan(float(r.loglik))
        ins = _inputs(dict(z=[2e100, 3e100, 2.5e100], p=[1.0, 1.0, 1.0]), torch.float64)
        _, mean, var, _, _ = _truth(ins, 0)
        np.testing.assert_allclose(r.mean[1:].numpy(), mean, rtol=1e-12)
        np.testing.assert_allclose(r.var[1:].numpy(), var, rtol=1e-12)
