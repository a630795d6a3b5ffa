"""float32 means that do not drift with a settled filter's repeated roundings.

Once a lane's variance settles, each step repeats its inputs and so the rounding of the update's
``u1 = R u + h^2 v`` (and, in Triton, of the hardware reciprocal): the normalized mean ``e1 / u1``
then weighed the prior mean and the observation by ``1 - d`` in all, the same ``d`` every step,
so the float32 filter tracked the decay ``a (1 - d)`` and the log-likelihood's gradient in a
shared decay on a random walk grew off like ``d T^2`` (1.4e-2 at 10^5 steps, ``torch``; 51 % at
10^6, ``triton``). The means are now formed with weights that sum to 1 (core.steps.update,
cuda/filter/kernels.kept_update), and the torch scan's means get one Newton step
(core.parallel._consistent_means). Reference: the float64 filter on the same data.
"""

import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import kalmanscan as ks  # noqa: E402
from kalmanscan.core import parallel, sequential  # noqa: E402


def _walk(T, seed=0):
    """A random walk (process variance 0.01) seen with noise of variance 0.5."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(0, 0.1, T)) + rng.normal(0, np.sqrt(0.5), T)


def _lanes_grad(fn, z, dtype, device="cpu"):
    """``(outputs, d loglik / d decay)`` of ``fn`` (a backend's filter_lanes) at decay 1."""
    T = len(z)
    one = lambda v: torch.full((1, 1), v, dtype=dtype, device=device)  # noqa: E731
    a = one(1.0).requires_grad_(True)
    ins = [torch.tensor(z, dtype=dtype, device=device).reshape(T, 1), one(0.5), a, one(0.01),
           one(1.0), one(0.0)]  # fmt: skip
    x0 = tuple(torch.tensor([v], dtype=dtype, device=device) for v in (0.0, 0.0, 1.0))
    out = fn(*[x.expand(T, 1) for x in ins], x0, outputs="all")
    (g,) = torch.autograd.grad(out["loglik"].sum(), a)
    return out, g.item()


def _check(fn, T, tol, device="cpu"):
    z = _walk(T)
    ref, g_ref = _lanes_grad(parallel.filter_lanes, z, torch.float64)
    out, g = _lanes_grad(fn, z, torch.float32, device)
    assert abs(g - g_ref) <= tol * abs(g_ref), (g, g_ref)
    # the means themselves: within float32's rounding of the float64 filter's
    for key in ("mean", "pred_mean"):
        got, want = out[key].double().cpu()[1:], ref[key][1:]
        assert torch.allclose(got, want, rtol=0, atol=1e-5 * float(want.abs().max())), key


def test_torch_backend_shared_decay_gradient_long_walk():
    """20,000 steps: 2.2e-3 off before, 1.6e-6 now."""
    _check(parallel.filter_lanes, 20_000, 2e-5)


def test_sequential_shared_decay_gradient():
    """3,000 steps: 1.6e-4 off before, 1e-6 now."""
    _check(sequential.filter_lanes, 3_000, 1e-5)


# in the interpreter 30-50 s a case: in the slow step (CI's second)
_SLOW = () if CUDA else (pytest.mark.slow,)


@pytest.mark.parametrize("regime", [pytest.param(r, marks=_SLOW) for r in ("lanes", "chunks")])
def test_triton_shared_decay_gradient(regime, monkeypatch):
    """The Triton forward, its log-likelihood adjoint and (``chunks``) the chunk maps and
    carries: 3,000 steps in the interpreter (1.6e-4 off before), 10^5 on a GPU."""
    pytest.importorskip("triton")
    from kalmanscan.cuda import filter as F

    monkeypatch.setattr(F, "_MANY_LANES", 1 if regime == "lanes" else 10**9)
    if CUDA:
        _check(F.filter_lanes, 100_000, 1e-4, "cuda")
    else:
        _check(F.filter_lanes, 3_000, 1e-5)


def test_public_loglik_float32_gradient_matches_float64():
    """Through ``ks.loglik`` (the default backend of the machine) at 20,000 steps."""
    z = _walk(20_000, seed=3)
    grads = []
    for dtype in (torch.float64, torch.float32):
        a = torch.tensor(1.0, dtype=dtype, requires_grad=True)
        ll = ks.loglik(torch.tensor(z, dtype=dtype), 0.5, a, 0.01, backend="torch")
        (g,) = torch.autograd.grad(ll, a)
        grads.append(g.item())
    assert abs(grads[1] - grads[0]) <= 2e-5 * abs(grads[0]), grads


def test_float32_mean_near_the_observation_far_from_the_prior():
    """An observation weighed almost 1 against a prior mean far away (decay 1e5): the mean is
    the observation's, not the prior's minus itself (the gain form cancels there)."""
    z = torch.tensor([1.0, 1.2, 0.9, 1.1], dtype=torch.float32)
    for backend in ("torch", "sequential"):
        r = ks.filter(z, 1.0, 1e5, 1.0, prior_mean=1e3, prior_var=1.0, backend=backend)
        r64 = ks.filter(z.double(), 1.0, 1e5, 1.0, prior_mean=1e3, prior_var=1.0,
                        backend=backend)  # fmt: skip
        assert torch.allclose(r.mean.double(), r64.mean, rtol=1e-5, atol=0), (backend, r.mean)
