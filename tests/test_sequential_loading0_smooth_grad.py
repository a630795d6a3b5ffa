"""The smoothed means' gradient on LOADING0 (tests/test_extreme_scalar_gradients.py) with a tiny
loading at its step of predicted variance 1e300, against mpmath, on every backend.

There the filtered mean (``z / h``: ``5e199`` at ``h = 1e-150``) is far from the information
after it (mean ``1e50``, variance 1): the derivative of the step's smoothed mean in the next
step's ``process_var`` is ``(m_f - m_b) / var_f`` (``5e199 / 5e299 = 1e-100``). The sequential
smoother's step back normalized its triple by ``max(u, v)`` with ``max``'s derivative
(``steps.normalize``): at ``v >= u`` the change of the precision went into ``u``, whose adjoint
also carries the mean's terms (``1e50``), and their rounding lost it, half at a tie (``u = v``:
``obs_var`` 1 there; 0.5 on the test's scale) and all of it past one (``obs_var`` 2: 0 for
1e-100). The normalized ``u`` is now a constant up to a variance of ``2**G``, as a held one is
(``steps._Normalize``); torch and native were within 2.4e-16 before, sequential is now.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_extreme_scalar_gradients import BACKENDS, LOADING0, _check_grad, _inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("R2", [1.0, 2.0], ids=["tie", "past-tie"])
@pytest.mark.parametrize("h1", [1e-300, 1e-150, 1e-50])
def test_smoothed_mean_gradient_at_a_tiny_loading_at_a_variance_of_1e300(h1, R2, backend):
    """Every input's derivative of the smoothed means' sum (sequential's in ``process_var`` was
    half the truth at ``R2 = 1``, 0 at ``R2 = 2``)."""
    ins = _inputs(dict(LOADING0, h=[1.0, h1, 1.0], R=[1.0, 1.0, R2]), torch.float64)
    _check_grad(ins, torch.float64, backend, "smean")


def _triples(dtype):
    """Triples of every kind ``steps.normalize`` meets: ordinary, diffuse (``u = 0``), ties
    (``u = v``), variances above 1 and above ``2**G`` (held), one past ``1/tiny``."""
    from kalmanscan.core.steps import hold_exponent

    G = hold_exponent(dtype)
    g = torch.Generator().manual_seed(3)
    u = torch.rand(400, dtype=dtype, generator=g)
    v = torch.rand(400, dtype=dtype, generator=g)
    e = torch.randn(400, dtype=dtype, generator=g)
    v[3::11] = u[3::11]
    u[::7], v[::7] = 0.0, 1.0
    u[5::13], v[5::13] = 1.0, 2.0 ** (G - 3)
    u[6::17], v[6::17] = 2.0**-G, 2.0 ** (G // 2)
    u[8::19], v[8::19] = torch.finfo(dtype).tiny / 4, 1.0
    return u, e, v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["normalize", "normalize_max"])
def test_the_normalize_node_equals_its_graph(name, dtype):
    """``steps._Normalize`` (one node) gives the first derivatives of the graph of operations
    it replaced (``steps._normalized_graph``) bit for bit, and the same second ones."""
    from kalmanscan.core import steps

    u, e, v = _triples(dtype)
    hold = steps.held_mask(u, v) if name == "normalize" else None
    assert name == "normalize_max" or bool(hold.any())
    w = [torch.linspace(-1, 1, 400, dtype=dtype) * (i + 1) for i in range(3)]
    firsts, seconds = [], []
    for f in (getattr(steps, name), lambda *xs: steps._normalized_graph(*xs, hold)):
        xs = [x.clone().requires_grad_() for x in (u, e, v)]
        outs = f(*xs)
        g = torch.autograd.grad(outs, xs, w, create_graph=True)
        firsts.append(g)
        ggs = [gi for gi in g if gi.requires_grad]
        seconds.append(torch.autograd.grad(sum(gi.sum() for gi in ggs), xs, allow_unused=True))
        xs = [x.clone().requires_grad_() for x in (u, e, v)]
        one = torch.autograd.grad(f(*xs), xs, w)  # without create_graph: the node's own rule
        for a, b in zip(one, g, strict=True):
            assert torch.equal(a, b.detach())
    for a, b in zip(*firsts, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(*seconds, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert steps._Normalize.__name__ in type(getattr(steps, name)(*[
        x.clone().requires_grad_() for x in (u, e, v)])[1].grad_fn).__name__  # fmt: skip


def test_the_normalize_node_sums_broadcast_gradients():
    """A triple whose parts broadcast (a lane's ``v`` against steps' ``u, e``): each input's
    gradient is summed to its own shape, as through the graph of operations (to the rounding
    of the sums' order)."""
    from kalmanscan.core import steps

    u, e, v = _triples(torch.float64)
    u, e, v = u.reshape(20, 20), e.reshape(20, 20), v[:20].reshape(1, 20)
    w = [torch.linspace(-1, 1, 400, dtype=torch.float64).reshape(20, 20) * (i + 1)
         for i in range(3)]  # fmt: skip
    got = []
    for f in (steps.normalize_max, lambda *xs: steps._normalized_graph(*xs, None)):
        xs = [x.clone().requires_grad_() for x in (u, e, v)]
        got.append(torch.autograd.grad(f(*xs), xs, w))
    assert got[0][2].shape == (1, 20)
    for a, b in zip(*got, strict=True):  # (sums of 20 terms, added in another order)
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
