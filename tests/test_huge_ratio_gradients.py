"""Gradients where ``process_var / obs_var`` is huge (1e20 .. 1e300), against mpmath.

Every step's prior variance is then about ``process_var``, so the normalized predicted triple
``(u, e, v)`` holds ``u ~ obs_var / process_var`` and the log-likelihood's adjoint of ``u`` is its
reciprocal. Dividing a triple by ``n = max(u, v)`` (the normalization, and the torch scan's
change of unit ``u / k``) has the derivative ``-g (u / n) / n`` in ``n``; autograd formed it as
written, and ``(u / n) / n ~ 1 / ratio^2`` underflowed (``ratio = 4e199``) or lost digits to
subnormals (``ratio = 1e100``) though times ``g ~ ratio`` it is of order 1:
``process_var * d loglik / d process_var`` came out -0.14 (torch) / -0.28 (sequential) against
-5, and ``obs_var * d/d obs_var`` -2.3 against ~1e-199. The divisions' derivatives are now
formed as products (``kalmanscan.core.steps.quotient``).

Gradients are compared scaled, ``theta * d loglik / d theta`` (unchanged by the units of
``theta``): relatively (1e-8) where the truth is not at float64's rounding level, else absolutely,
relative to the largest component (``obs_var``'s is ~1/ratio in truth, below any float64
filter's rounding).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from kalmanscan.validation import oracle
from kalmanscan.validation.oracle import scalar_loglik_grad

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
KEYS = ("obs_var", "decay", "process_var", "offset")
RTOL, ATOL = 1e-8, 1e-12  # ATOL: times the largest scaled component
# (obs_var, process_var): ratios 1e20, 1e100, 4e199, 1e300 (both ways of reaching it)
RATIOS = [(1.0, 1e20), (1.0, 1e100), (1.0, 4e199), (1e-300, 1.0), (2.0, 2e300), (1e-150, 1e150)]
# (decay, loading, prior): a diffuse and a proper prior, loadings 1 and 0.5
MODELS = [(0.9, 1.0, None), (1.0, 0.5, (1.0, 2.0)), (0.3, 0.5, None)]


def _series(T, seed=0):
    rng = np.random.default_rng(seed)
    z = np.cumsum(rng.normal(size=T)) + 3.0
    z[4] = np.nan
    if T > 50:  # (a gap across a chunk boundary of the torch scan)
        z[40:47] = np.nan
    return z


def _params(R, a, p):
    return dict(obs_var=R, decay=a, process_var=p, offset=0.1)


def _leaves(vals):
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in vals.items()}


def _prior_kw(prior):
    return {} if prior is None else dict(prior_mean=prior[0], prior_var=prior[1])


def _check(got, want, vals, what):
    scaled = {k: want[k] * vals[k] for k in KEYS}
    scale = max(abs(x) for x in scaled.values())
    for k in KEYS:
        g = got[k] * vals[k]
        err = abs(g - scaled[k])
        assert err <= RTOL * abs(scaled[k]) + ATOL * scale, (
            f"{what}: {k} * d/d{k}: got {g:.10g}, mpmath {scaled[k]:.10g} (error {err:.3g})"
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", MODELS, ids=["a0.9-h1-diffuse", "a1-h0.5-proper", "a0.3-h0.5"])
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"R{r[0]:g}-p{r[1]:g}")
def test_loglik_gradient_huge_ratio(ratio, model, backend):
    (R, p), (a, h, prior) = ratio, model
    z = _series(12) * h
    vals = _params(R, a, p)
    pm, pv = prior if prior is not None else (0.0, math.inf)
    want = scalar_loglik_grad(z, R, a, p, loading=h, offset=0.1, prior_mean=pm, prior_var=pv)
    t = _leaves(vals)
    ll = ks.loglik(torch.as_tensor(z), **t, loading=h, backend=backend, **_prior_kw(prior))
    ll.backward()
    _check({k: float(x.grad) for k, x in t.items()}, want, vals, f"{backend} R={R:g} p={p:g}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ratio", [(1.0, 4e199), (1e-150, 1e150)], ids=["p4e199", "R1e-150"])
def test_loglik_gradient_huge_ratio_chunked(ratio, backend):
    """100 steps of one lane: the torch backend's chunked scan (and its per-step unit at
    ``R = 1e-150``), not only its plain recursion."""
    R, p = ratio
    z = _series(100)
    vals = _params(R, 0.9, p)
    want = scalar_loglik_grad(z, R, 0.9, p, offset=0.1)
    t = _leaves(vals)
    ks.loglik(torch.as_tensor(z), **t, backend=backend).backward()
    _check({k: float(x.grad) for k, x in t.items()}, want, vals, f"{backend} R={R:g} p={p:g}")


# ------------------------------------------------- filtered and smoothed moments' gradients
def _mp_functional(z, vals, weights, smooth, dps=120):
    """``sum_t w0 mean_t + w1 log var_t`` of the filtered (smoothed) moments and its forward
    differences in mpmath (as :func:`scalar_loglik_grad`)."""
    T = len(z)
    zs = [None if not math.isfinite(v) else mp.mpf(v) for v in z]

    def f(v):
        out = oracle._scalar_pass(mp, zs, [v["obs_var"]] * T, [v["decay"]] * T,
                                  [v["process_var"]] * T, [v["offset"]] * T, [mp.mpf(1)] * T,
                                  mp.mpf(0), None, smooth, [False] * T)  # fmt: skip
        m, P = (out[6], out[7]) if smooth else (out[2], out[3])
        return mp.fsum(w0 * m[t] + w1 * mp.log(P[t]) for t, (w0, w1) in enumerate(weights.T))

    with mp.workdps(dps):
        base = {k: mp.mpf(x) for k, x in vals.items()}
        f0, grad = f(base), {}
        for k in KEYS:
            d = mp.mpf(10) ** (-(dps // 3)) * abs(base[k])
            grad[k] = float((f({**base, k: base[k] + d}) - f0) / d)
    return grad


@pytest.mark.parametrize("backend", ["sequential", "torch"])
@pytest.mark.parametrize("which", ["filter", "smooth"])
@pytest.mark.parametrize("ratio", [(1.0, 4e199), (1e-300, 1.0)], ids=["p4e199", "R1e-300"])
def test_moments_gradient_huge_ratio(ratio, which, backend):
    R, p = ratio
    z = _series(10)
    weights = np.random.default_rng(1).normal(size=(2, len(z)))
    vals = _params(R, 0.9, p)
    want = _mp_functional(z, vals, weights, which == "smooth")
    t = _leaves(vals)
    fn = ks.filter if which == "filter" else ks.smooth
    res = fn(torch.as_tensor(z), **t, backend=backend)
    w = torch.as_tensor(weights)
    (w[0] * res.mean + w[1] * torch.log(res.var)).sum().backward()
    _check({k: float(x.grad) for k, x in t.items()}, want, vals, f"{backend} {which}")
