"""The native backend (the compiled CPU kernel) at the extremes of
tests/test_extreme_scalar_gradients.py, against the same mpmath truth.

Before, native raised ``OverflowError`` on 22 of the 118 checks of that file's cases (values,
the log-likelihood's gradient and the smoothed means', a case or a random lane at a time), and
gave no wrong number on the others: its filter's update ``R E`` passed the range at ``obs_var``
1e300 times a mean of 1e10 (values, smoother, every gradient), and its adjoint's
``(loglik) / u`` where ``|loglik| var`` does (a log-likelihood of -3.2e99 at a predicted variance
of 1e300), as did the update's products and the innovation's square there. The filter's exact
form and the smoother's step back now form the update in a power-of-two scaling where a product
would pass the range (``_observe_scaled``: steps.observe), and the adjoint takes such steps, and
those whose variance is above ``2**64``, in its wide form (``_native_adjoint.h``, "Extremes": the
held triples of steps.normalize); other steps run the arithmetic they ran before, bit for bit.

Truth and tolerances: the other file's (``_check_values``, ``_check_grad``); the gradients of the
smoothed means come from the torch backend's vector-Jacobian product at native's outputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from tests.test_extreme_scalar_gradients import (
    CASES,
    GRAD_CASES,
    IDS,
    OBS_CASES,
    SEEDS,
    _check_grad,
    _check_values,
    _inputs,
    _sweep_lane,
)

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

NAN = math.nan
B = "native"


@pytest.mark.parametrize("cid, dtype, case", GRAD_CASES)
def test_loglik_gradient_matches_mpmath(cid, dtype, case):
    """The log-likelihood's gradient by the kernel's adjoint (an OverflowError before on six of
    these: the held variances)."""
    _check_grad(_inputs(case, dtype), dtype, B, "ll")


@pytest.mark.parametrize("cid, dtype, case", CASES, ids=IDS)
def test_values_match_mpmath(cid, dtype, case):
    """Filtered and smoothed moments and the log-likelihood (a guard: they were right)."""
    _check_values(_inputs(case, dtype), dtype, B)


@pytest.mark.parametrize("cid, case", OBS_CASES, ids=[c[0] for c in OBS_CASES])
def test_obs_var_times_mean_past_the_range(cid, case):
    """``obs_var`` 1e300 times a mean of 1e10 (the filter's ``R E``: an OverflowError before):
    values, the log-likelihood's gradient and the smoothed means'."""
    ins = _inputs(case, torch.float64)
    _check_values(ins, torch.float64, B)
    for of in ("ll", "smean"):
        _check_grad(ins, torch.float64, B, of)


# float32: obs_var 1e36 times a mean of 1e5 (the same overflow of the filter's R E; the adjoint
# runs in float64 and never met it)
# fmt: off
OBS_CASES_F32 = [
    ("R1e36-mean1e5-f32", dict(z=[1e5, 1.1e5, 0.9e5], R=[1.0, 1e36, 1.0], p=1.0)),
    ("R1e36-prior1e5-f32", dict(z=[1e5, 1e5], R=1e36, p=1.0, m0=1e5, P0=1.0)),
    ("R1e36-mean1e5-forget-f32", dict(z=[1e5, NAN, 1.2e5], R=[1.0, 1.0, 1e36],
                                      a=[1.0, 0.0, 1.0], p=1.0, c=[0.0, 3e4, 0.0])),
]
# fmt: on


@pytest.mark.parametrize("cid, case", OBS_CASES_F32, ids=[c[0] for c in OBS_CASES_F32])
def test_obs_var_times_mean_past_the_range_float32(cid, case):
    """The float32 analogue (an OverflowError before; the torch backend matched)."""
    ins = _inputs(case, torch.float32)
    _check_values(ins, torch.float32, B)
    for of in ("ll", "smean"):
        _check_grad(ins, torch.float32, B, of)


def _stacked(cases):
    """Single-lane cases side by side, one call (``[T, N]``, ``N = len(cases)``): each padded to
    the longest with steps that observe nothing and change nothing (z NaN, decay 1,
    process_var 0)."""
    T = max(len(c["z"]) for c in cases)

    def col(c, key, default):
        n = len(c["z"])
        x = np.broadcast_to(np.asarray(c.get(key, default), np.float64), (n,))
        pad = {"z": NAN, "R": 1.0, "a": 1.0, "p": 0.0, "h": 1.0, "c": 0.0}[key]
        return np.concatenate([x, np.full(T - n, pad)])

    defaults = (("z", NAN), ("R", 1.0), ("a", 1.0), ("p", 0.0), ("h", 1.0), ("c", 0.0))
    out = {k: np.stack([col(c, k, d) for c in cases], 1) for k, d in defaults}
    for key, default in (("m0", 0.0), ("P0", math.inf)):
        out[key] = np.array([float(c.get(key, default)) for c in cases])
    return out


# the float64 reproductions of at most six steps and the obs_var ones, with two ordinary lanes:
# ten lanes or more, so the filter and the smoother run their vectorized rows (and redo lanes)
_TILE = [c for _, d, c in CASES if d == torch.float64 and len(c["z"]) <= 6]
_TILE += [c for _, c in OBS_CASES]
_TILE += [dict(z=[0.3, -1.2, NAN, 0.8, 1.1, 0.2], R=0.5, a=0.9, p=0.3, P0=2.0, m0=1.0),
          dict(z=[2.0, NAN, 1.5, 1.0, 0.5, 0.0], R=2.0, a=[1.0, 0.0, 1.0, 1.0, -0.7, 1.0],
               p=1.0, c=[0.0, 1.0, 0.0, 0.0, 0.0, 0.0])]  # fmt: skip


def test_extreme_lanes_in_one_tile_match_mpmath():
    """The reproductions as lanes of one call (the kernels' vectorized rows, whose lanes that
    leave the range are redone on their own): every lane's values and gradients."""
    assert len(_TILE) >= 10
    ins = _inputs(_stacked(_TILE), torch.float64)
    _check_values(ins, torch.float64, B)
    for of in ("ll", "smean"):
        _check_grad(ins, torch.float64, B, of)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_extreme_lanes_match_mpmath(seed):
    """The other file's random lanes of mixed extremes (eight a seed; an OverflowError before on
    four of the 24), one call each, then all eight in one call."""
    rng = np.random.default_rng(500 + seed)
    lanes = [_sweep_lane(rng, 6) for _ in range(8)]
    for lane in lanes:
        ins = _inputs(lane, torch.float64)
        _check_values(ins, torch.float64, B)
        for of in ("ll", "smean"):
            _check_grad(ins, torch.float64, B, of)
    ins = _inputs(_stacked(lanes), torch.float64)
    _check_values(ins, torch.float64, B)
    _check_grad(ins, torch.float64, B, "ll")


def _lanes_x0(P0, m0):
    """The initial triples of proper priors (steps.from_prior: held above 2**64)."""
    from kalmanscan.core import steps

    return steps.from_prior(torch.as_tensor(m0), torch.as_tensor(P0))


def test_ordinary_lanes_unchanged_beside_extreme_ones():
    """An ordinary lane's outputs and adjoint gradients are the same, bit for bit, alone and in a
    tile beside lanes that take the wide forms (the extremes change nothing of their neighbours),
    and the call's gradients are all finite (flags 0; NOT_FINITE before)."""
    rng = np.random.default_rng(17)
    T, n_ord = 40, 9
    z = rng.normal(0.0, 1.0, (T, n_ord))
    z[rng.random((T, n_ord)) < 0.1] = NAN
    R = np.exp(rng.normal(0.0, 1.0, (T, n_ord)))
    a = rng.choice([0.9, 1.0, -0.5, 0.0], size=(T, n_ord), p=[0.5, 0.3, 0.15, 0.05])
    p = np.exp(rng.normal(-1.0, 1.0, (T, n_ord)))
    h = rng.normal(1.0, 0.2, (T, n_ord))
    c = rng.normal(0.0, 1.0, (T, n_ord))
    P0, m0 = np.exp(rng.normal(0.0, 1.0, n_ord)), rng.normal(0.0, 1.0, n_ord)
    # the two extreme lanes: the reproduction and obs_var 1e300 times a mean of 1e10
    ext = _stacked([dict(z=[1e200, 1.1e200], R=1e300, p=[0.0, 1e300], P0=1e300),
                    dict(z=[1e10, 1e10], R=1e300, p=1.0, m0=1e10, P0=1.0)])  # fmt: skip
    T2 = ext["z"].shape[0]
    pad = {"z": NAN, "R": 1.0, "a": 1.0, "p": 0.0, "h": 1.0, "c": 0.0}

    def full(key, ordinary):
        e = np.concatenate([ext[key], np.full((T - T2, 2), pad[key])])
        return torch.tensor(np.concatenate([ordinary, e], 1))

    both = [full(k, x) for k, x in zip("zRaphc", (z, R, a, p, h, c), strict=True)]
    alone = [torch.tensor(x) for x in (z, R, a, p, h, c)]
    x0_both = _lanes_x0(np.concatenate([P0, ext["P0"]]), np.concatenate([m0, ext["m0"]]))
    x0_alone = _lanes_x0(P0, m0)
    w = torch.tensor(rng.uniform(0.5, 1.5, n_ord + 2))
    got = native.loglik_grad(*both, x0_both, w)
    want = native.loglik_grad(*alone, x0_alone, w[:n_ord])
    assert got["flags"] == 0 and want["flags"] == 0, (got["flags"], want["flags"])
    for key in native.INPUTS:
        assert got[key].shape == (T, n_ord + 2), key
        assert torch.equal(got[key][:, :n_ord], want[key]), key
        assert bool(torch.isfinite(got[key]).all()), key
    for key in ("u0", "e0", "v0"):
        assert torch.equal(got[key][:n_ord], want[key]), key
    s_got = native.smooth_lanes(*both, x0_both)
    s_want = native.smooth_lanes(*alone, x0_alone)
    assert s_got["flags"] == 0, s_got["flags"]
    for key in native.FILTER_KEYS + native.SMOOTH_KEYS:
        assert torch.equal(s_got[key][:, :n_ord], s_want[key]), key
    assert torch.equal(s_got["loglik"][:n_ord], s_want["loglik"])


def test_a_long_lane_with_extreme_steps_matches_sequential():
    """300 steps (the adjoint's checkpoints: 17 blocks) of an ordinary lane with ten extreme
    steps, 100-109: a process variance of 1e305, then data of scale 1e155 under obs_var 1e300,
    and a step that forgets them (decay 0) at 110. The log-likelihood and its gradient in every
    input against the sequential backend's (itself checked against mpmath in the other file):
    relative, or the log-likelihood's rounding per unit of the input where the truth is below
    it. Before: an OverflowError (the adjoint's ``(loglik) / u``, ``1e5 x 1e305``, at step 100)."""
    rng = np.random.default_rng(3)
    T = 300
    z = rng.normal(0.0, 1.0, T)
    z[100:110] = 1e155 * rng.normal(1.0, 0.1, 10)
    z[rng.random(T) < 0.1] = NAN
    R = np.where((np.arange(T) >= 100) & (np.arange(T) < 110), 1e300, 0.5)
    p = np.full(T, 0.1)
    p[100] = 1e305
    a = np.full(T, 0.9)
    a[110] = 0.0
    c = np.zeros(T)
    c[110] = 0.3
    got = {}
    for backend in ("sequential", B):
        leaves = [torch.tensor(x, requires_grad=True) for x in (z, R, a, p, c)]
        ll = ks.loglik(leaves[0], leaves[1], leaves[2], leaves[3], offset=leaves[4],
                       prior_mean=0.5, prior_var=2.0, backend=backend)  # fmt: skip
        got[backend] = (float(ll.detach()), torch.autograd.grad(ll, leaves))
    ll, want_grads = got["sequential"]
    assert got[B][0] == pytest.approx(ll, rel=1e-13)
    for name, x, g, want in zip("zRapc", (z, R, a, p, c), got[B][1], want_grads, strict=True):
        assert bool(torch.isfinite(g).all()), name
        floor = (abs(ll) + 1) / np.maximum(np.abs(np.nan_to_num(x)), 1.0)
        err = (g - want).abs().numpy() / (want.abs().numpy() + floor)
        assert float(err.max()) < 1e-12, (name, float(err.max()))
