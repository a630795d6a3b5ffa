"""The smoothed variance's gradient at the steps before a step that forgets (decay 0), where the
state's variance is huge, against mpmath, on the sequential, torch and native backends.

Before a step that forgets, the observations after it say nothing about the past (the backward
information ``U = 0``): the smoothed variance is the filtered one, e.g. ``P0 + sum p`` over a
gap from a prior variance of 1e300, whose derivative in each ``process_var`` is 1. A state whose
variance is above ``2**G`` is held as ``(2**-G, mean 2**-G, var 2**-G)`` (steps.normalize), and
a variance's derivative in that ``u``, ``-var / u``, passes the range where the variance passes
``finfo.max 2**-G`` (9.7e288 in float64, 1.2e24 in float32). Every backend met it as
``inf * 0`` or ``inf - inf``: NaN (or inf) gradients of the smoothed and filtered variances in
``process_var``, ``decay``, ``obs_var``, ``loading`` and ``prior_var``. Fixed by keeping the held
``u`` the constant it is (no derivative: steps.hold_gauge, the torch scan's held triples, the
sequential backward step's ``back_through``), forming the smoother's combine of held triples
from each side's mean and variance (steps._combine_held) and a prediction that keeps the past
as a select (steps.predict). The torch backward scan's leaf at a step that forgets multiplied
derivatives past the range by ``keep = 0``: that step's ``process_var`` had a NaN gradient at
any variance (parallel.smooth_lanes: selects).

Truth: a covariance-form Kalman filter and Rauch–Tung–Striebel smoother in mpmath at 400 digits
(independent of the library's two-filter form) on the inputs as the dtype holds them; derivatives
by the complex step, of ``10**-(DPS/3)`` times the input (``1e-300`` times that at 0), so no
difference cancels. Each gradient vector (one output, one input over the steps) is judged
norm-wise, ``max |g - want| / max |want|`` (where the truth is 0 at every step, so must be the
gradient), with a floor only where the variance is carried in ordinary coordinates
(:func:`_check`). Variances are not functions of the data, offsets or prior mean: their
gradients there are 0.
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

NAN = math.nan
DPS = 400
BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
KEYS = ("R", "a", "p", "h")  # obs_var, decay, process_var, loading (per step)


def mp_variances(R, a, p, h, observed, P0):
    """Filtered and smoothed variances of one lane (lists of mp numbers, real or complex): the
    covariance filter (``a`` whose real part is 0 forgets: the prediction ``p``, the derivative
    in ``a`` the limit's, 0) and the Rauch–Tung–Striebel pass (``J = P a / P-``, 0 before a
    step that forgets)."""
    T = len(R)
    P, filt, pred = P0, [], []
    for t in range(T):
        forget = mp.re(a[t]) == 0
        P = p[t] if forget else a[t] ** 2 * P + p[t]
        pred.append(P)
        if observed[t]:
            P = P * R[t] / (h[t] ** 2 * P + R[t])
        filt.append(P)
    out = list(filt)
    for t in range(T - 2, -1, -1):
        if mp.re(a[t + 1]) != 0:
            J = filt[t] * a[t + 1] / pred[t + 1]
            out[t] = filt[t] + J**2 * (out[t + 1] - pred[t + 1])
    return filt, out


def _inputs(case, dtype):
    """The case's ``[T]`` inputs (keys of KEYS and ``z``) and prior variance ``P0``, rounded to
    ``dtype``, as float64 arrays (numbers broadcast over the steps)."""
    z = np.asarray(case["z"], np.float64)
    T = z.shape[0]
    rnd = lambda x: torch.tensor(x, dtype=torch.float64).to(dtype).double().numpy()  # noqa: E731
    ins = {k: rnd(np.broadcast_to(np.asarray(case.get(k, d), np.float64), (T,)).copy())
           for k, d in (("R", 1.0), ("a", 1.0), ("p", 1.0), ("h", 1.0))}  # fmt: skip
    ins["z"], ins["P0"] = rnd(z), rnd(np.asarray(case["P0"], np.float64))
    return ins


_TRUTHS = {}


def _truth(ins, ts, smooth=True):
    """The smoothed (``smooth``) or filtered variances at steps ``ts`` and ``{key: [len(ts), T
    or 1]}``, their derivatives in each step's input (``P0``: the prior variance), by the complex
    step: computed once a process for every backend (a copy each call)."""
    key = (tuple((k, v.tobytes()) for k, v in sorted(ins.items())), tuple(ts), smooth)
    if key not in _TRUTHS:
        _TRUTHS[key] = _complex_step_truth(ins, ts, smooth)
    return copy.deepcopy(_TRUTHS[key])


def _complex_step_truth(ins, ts, smooth):
    observed = [not math.isnan(x) for x in ins["z"]]
    out = {}
    with mp.workdps(DPS):
        rel = mp.mpf(10) ** -(DPS // 3)
        base = {k: [mp.mpf(float(x)) for x in ins[k]] for k in KEYS}
        base["P0"] = [mp.mpf(float(ins["P0"]))]
        for key in KEYS + ("P0",):
            jac = np.zeros((len(ts), len(base[key])))
            for s, x in enumerate(base[key]):
                step = (abs(x) if x != 0 else mp.mpf(1e-300)) * rel
                args = {k: list(v) for k, v in base.items()}
                args[key][s] = mp.mpc(x, step)
                var = mp_variances(*(args[k] for k in KEYS), observed, args["P0"][0])[smooth]
                jac[:, s] = [float(mp.im(var[t]) / step) for t in ts]
            out[key] = jac
        var = mp_variances(*(base[k] for k in KEYS), observed, base["P0"][0])[smooth]
    return np.array([float(var[t]) for t in ts]), out


def _gradients(ins, dtype, backend, ts, smooth=True):
    """The smoothed (``smooth``) or filtered variances at steps ``ts`` and their gradients:
    ``(values, {key: [len(ts), T or 1]}, {z, c, m0: the same, expected 0})``."""
    t = {k: torch.tensor(ins[k], dtype=dtype, requires_grad=True) for k in KEYS + ("P0",)}
    z = torch.tensor(ins["z"], dtype=dtype, requires_grad=True)
    c = torch.zeros_like(z, requires_grad=True)
    m0 = torch.zeros((), dtype=dtype, requires_grad=True)
    fn = ks.smooth if smooth else ks.filter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = fn(z, t["R"], t["a"], t["p"], loading=t["h"], offset=c, prior_mean=m0,
                 prior_var=t["P0"], backend=backend)  # fmt: skip
    keys = KEYS + ("P0",)
    got = {k: [] for k in keys}
    zero = {k: [] for k in ("z", "c", "m0")}
    for i in ts:
        gs = torch.autograd.grad(res.var[i], [t[k] for k in keys] + [z, c, m0],
                                 retain_graph=True)  # fmt: skip
        for k, g in zip(keys, gs, strict=False):
            got[k].append(g.double().reshape(-1).numpy())
        for k, g in zip(("z", "c", "m0"), gs[len(keys) :], strict=True):
            zero[k].append(g.double().reshape(-1).numpy())
    values = res.var.detach().double().numpy()[list(ts)]
    stack = lambda d: {k: np.stack(v) for k, v in d.items()}  # noqa: E731
    return values, stack(got), stack(zero)


def _error(g, want, floor):
    """``max |g - want| / (max |want| + floor)`` of one gradient vector (inf where ``g`` is not
    finite, or where the scale is 0 and ``g`` is not)."""
    if not np.all(np.isfinite(g)):
        return math.inf
    scale = np.max(np.abs(want)) + floor
    if scale == 0:
        return 0.0 if np.all(g == 0) else math.inf
    return float(np.max(np.abs(g - want)) / scale)


def _check(case, dtype, backend, ts, smooth=True, exact=True):
    """The variances at steps ``ts`` and every gradient vector against mpmath, norm-wise.
    ``exact=False``: plus a floor, the variance per unit of the input (its largest magnitude
    over the steps): where a variance is carried in ordinary coordinates (``max(u, v) = 1``)
    the torch scan's products round it, and a derivative a factor of the variance below it
    keeps that rounding (``P0 = 1e10``: ``d var / d p = 1 +- 5e-7``; 6.5e-20 after a step
    that forgets, for 0). Held triples (variance above ``2**G``) carry it in ``v``, ``u`` the
    constant, and their derivatives are exact: no floor (a derivative of 1 beside a variance
    of 1e300 is judged to the tolerance)."""
    ins = _inputs(case, dtype)
    want_values, want = _truth(ins, ts, smooth)
    values, got, zero = _gradients(ins, dtype, backend, ts, smooth)
    tol = tolerance("rounding", dtype)
    np.testing.assert_allclose(values, want_values, rtol=tol)
    for k, g in got.items():
        x = np.abs(ins[k]).max()
        unit = x if x > 0 else 1.0
        for i, t in enumerate(ts):
            floor = 0.0 if exact else abs(want_values[i]) / unit
            err = _error(g[i], want[k][i], floor)
            assert err <= tol, (backend, k, t, g[i], want[k][i], err)
    for k, g in zero.items():
        assert np.all(g == 0), (backend, k, g)


F64, F32 = torch.float64, torch.float32
# (id, dtype, case, the step that forgets, exact: _check): the steps before it are judged
# fmt: off
CASES = [
    # the report: a prior variance of 1e300 over a gap, then a step that forgets (truth 1 in
    # each process_var before it; NaN before)
    ("P1e300-forget2-T4-f64", F64, dict(z=[NAN, NAN, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                        P0=1e300), 2, True),
    # forget at step 1, a process variance of 0 before it (the prior's variance carried)
    ("P1e300-forget1-p0-T3-f64", F64, dict(z=[NAN, NAN, 0.5], a=[1.0, 0.0, 1.0],
                                           p=[0.0, 1.0, 1.0], P0=1e300), 1, True),
    # forget at the last step
    ("P1e300-forget3-T4-f64", F64, dict(z=[NAN, NAN, NAN, 0.3], a=[1.0, 1.0, 1.0, 0.0],
                                        P0=1e300), 3, True),
    # decays 0.9 and -1 before the step that forgets, observed once (loading 0.5, obs_var 1e300)
    ("P1e300-decays-forget3-T5-f64", F64, dict(z=[NAN, 2.0, NAN, 0.5, 0.3],
                                               a=[0.9, -1.0, 1.0, 0.0, 1.0],
                                               h=[1.0, 0.5, 1.0, 1.0, 1.0],
                                               R=[1.0, 1e300, 1.0, 1.0, 1.0], P0=1e300), 3, True),
    # observed before it with obs_var 1e300: the backward information there is held too
    ("P1e300-R1e300-forget2-T4-f64", F64, dict(z=[1.0, 0.7, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                               R=1e300, P0=1e300), 2, True),
    # process variances of 1e300 at steps 0 and 2, an observation between (obs_var 1e300)
    ("p1e300-forget3-T5-f64", F64, dict(z=[NAN, 2.0, NAN, 0.3, 0.1], a=[1.0, 1.0, 1.0, 0.0, 1.0],
                                        R=[1.0, 1e300, 1.0, 1.0, 1.0],
                                        p=[1e300, 1.0, 1e300, 1.0, 1.0], P0=1e300), 3, True),
    # variances of 1e200 and 1e10 (held, below the overflow; and not held): right before too
    ("P1e200-forget2-T4-f64", F64, dict(z=[NAN, NAN, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                        P0=1e200), 2, True),
    ("P1e10-forget2-T4-f64", F64, dict(z=[NAN, NAN, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                       P0=1e10), 2, False),
    # a longer gap: forget at step 40 of 70, observed after it
    ("P1e300-forget40-T70-f64", F64, dict(z=[NAN] * 40 + list(np.linspace(-1.0, 1.0, 30)),
                                          a=[1.0] * 40 + [0.0] + [0.9] * 29, p=0.5,
                                          P0=1e300), 40, True),
    # float32: variances of 1e30 and 1e36 (past finfo.max 2**-48 = 1.2e24)
    ("P1e30-forget2-T4-f32", F32, dict(z=[NAN, NAN, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                       P0=1e30), 2, True),
    ("P1e36-R1e36-forget2-T4-f32", F32, dict(z=[1.0, 0.7, 0.5, 0.3], a=[1.0, 1.0, 0.0, 1.0],
                                             R=1e36, P0=1e36), 2, True),
]
# fmt: on


def _shared(name):
    """A case's backends run on one pytest-xdist worker (``--dist loadgroup``), which computes
    its references once (:func:`_truth`: seconds for the long gap, every step's inputs by the
    complex step)."""
    return pytest.mark.xdist_group(f"forget-references-{name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "cid, dtype, case, forget, exact",
    [pytest.param(*c, id=c[0], marks=_shared(c[0])) for c in CASES],
)
def test_smoothed_variance_gradient_before_a_forget(cid, dtype, case, forget, exact, backend):
    """The smoothed variances before the step that forgets and their gradients in every input
    (NaN or inf before, for variances past ``finfo.max 2**-G``)."""
    _check(case, dtype, backend, range(forget), exact=exact)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "dtype", [pytest.param(F64, id="f64", marks=_shared("held-f64")),
              pytest.param(F32, id="f32", marks=_shared("held-f32"))],
)  # fmt: skip
def test_filtered_variance_gradient_past_the_held_range(dtype, backend):
    """The filtered variances of a prior of 1e300 (float32: 1e36) carried over a gap, then
    observed with obs_var as large, and their gradients (NaN before): the same held triples
    as the smoothed ones before a step that forgets."""
    P0 = 1e300 if dtype == F64 else 1e36
    _check(dict(z=[NAN, NAN, NAN, 0.3], R=[1.0, 1.0, 1.0, P0], a=[1.0, 0.9, -1.0, 1.0],
                p=[1.0, 0.0, 2.0, 1.0], P0=P0), dtype, backend, range(4), smooth=False)  # fmt: skip


# an ordinary model with a step that forgets, every step judged: the machinery the fix touches
# (held triples only) leaves it as it was (tolerance: the rounding of a short computation)
ORDINARY = dict(z=[0.3, NAN, 1.1, -0.4, 0.8, NAN, 0.2], R=[0.5, 1.0, 0.7, 0.3, 0.9, 1.0, 0.4],
                a=[0.9, 1.0, -0.7, 0.0, 1.1, 0.8, 1.0], p=[0.2, 0.1, 0.4, 1.3, 0.05, 0.3, 0.2],
                h=[1.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.0], P0=2.0)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "dtype", [pytest.param(F64, id="f64", marks=_shared("ordinary-f64")),
              pytest.param(F32, id="f32", marks=_shared("ordinary-f32"))],
)  # fmt: skip
def test_ordinary_model_with_a_forget(dtype, backend):
    """Every step's smoothed variance and its gradients, an ordinary model."""
    _check(ORDINARY, dtype, backend, range(len(ORDINARY["z"])), exact=False)
