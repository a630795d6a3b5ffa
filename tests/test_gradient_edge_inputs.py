"""Gradients at inputs an audit against mpmath found wrong or unclear: ``obs_var = inf`` (a step
not observed) in the Triton backend's gradients of the filtered and smoothed moments, and
``torch.func`` transforms, which the backends cannot serve."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])


def _grads(backend):
    """Gradients in obs_var and decay of the filtered mean, the smoothed mean, and the
    log-likelihood's first and second derivative in the decay (create_graph)."""
    z = torch.tensor([[0.3], [1.0], [-0.5], [0.2]], dtype=torch.float64)
    out = []
    for kind in ("filter", "smooth"):
        R = torch.tensor([[1.0], [float("inf")], [1.0], [0.5]], dtype=torch.float64,
                         requires_grad=True)  # fmt: skip
        a = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
        fn = ks.filter if kind == "filter" else ks.smooth
        res = fn(z, R, a, 0.5, prior_mean=0.0, prior_var=1.0, backend=backend)
        (res.mean.sum() + res.var.sum()).backward()
        out += [R.grad.clone(), a.grad.clone()]
    R = torch.tensor([[1.0], [float("inf")], [1.0], [0.5]], dtype=torch.float64)
    a = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    ll = ks.loglik(z, R, a, 0.5, prior_mean=0.0, prior_var=1.0, backend=backend)
    (ga,) = torch.autograd.grad(ll.sum(), a, create_graph=True)
    (h,) = torch.autograd.grad(ga, a)
    return out + [ga.detach(), h]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_triton_gradients_at_an_unobserved_step(triton_on_cpu):
    """obs_var = inf at an observed value: triton's gradients of the filtered and smoothed
    moments (and the second derivative of the log-likelihood) were NaN for every input, its
    torch-backend vector-Jacobian product reading the step as observed with R = inf."""
    want = _grads("torch")
    got = _grads("triton")
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)
    for b in BACKENDS:
        for g, w in zip(_grads(b), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_are_refused_clearly(transform):
    """torch.func.grad / vmap failed deep inside ("Cannot access data pointer of Tensor that
    doesn't have storage"); they are refused at the API with what to use instead."""
    z = torch.randn(10, dtype=torch.float64)
    r = torch.tensor(1.0, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        if transform == "grad":
            torch.func.grad(lambda v: ks.loglik(z, v, 0.9, 0.5).sum())(r)
        else:
            torch.func.vmap(lambda v: ks.loglik(z, v, 0.9, 0.5))(torch.ones(3, dtype=torch.float64))
    assert torch.isfinite(ks.loglik(z, r, 0.9, 0.5))  # (outside a transform, as before)
