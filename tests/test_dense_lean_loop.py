"""The lean sequential loop that the dense GPU benchmark uses as a peer
(``benchmarks/dense_loop.py``) filters what ``kalmanscan.dense`` filters: means, covariances and
log-likelihood equal the library's sequential reference in float64; on CUDA its graph-replayed
steps equal its eager steps."""

import os
import sys

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from dense_loop import lean_filter  # noqa: E402


def _model(rng, n, d):
    F = rng.normal(size=(n, n))
    F *= 0.97 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    return F, G @ G.T / n + 0.1 * np.eye(n), rng.normal(size=(d, n)), 0.7 * np.eye(d)


@pytest.mark.parametrize("n,d", [(1, 1), (2, 1), (4, 1), (3, 2), (8, 1)])
def test_equals_the_sequential_reference(n, d):
    rng = np.random.default_rng(n * 10 + d)
    F, Q, H, R = _model(rng, n, d)
    z = rng.normal(size=(200, d))
    m0, P0 = rng.normal(size=n), np.eye(n) * 2.0
    ref = kd.filter(z, F, Q, H, R, prior_mean=m0, prior_cov=P0, backend="sequential")
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    mean, cov, ll = lean_filter(t(z), t(F), t(Q), t(H), t(R), t(m0), t(P0))
    np.testing.assert_allclose(mean.numpy(), ref.mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cov.numpy(), ref.cov, rtol=0, atol=1e-12)
    assert abs(float(ll) - float(ref.loglik)) <= 1e-10 * abs(float(ref.loglik))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_steps():
    rng = np.random.default_rng(3)
    F, Q, H, R = _model(rng, 4, 1)
    z = rng.normal(size=(1000, 1))  # 3 graphs of 256 steps and an eager tail of 232
    t = lambda a: torch.tensor(a, dtype=torch.float64, device="cuda")  # noqa: E731
    args = (t(z), t(F), t(Q), t(H), t(R), t(np.zeros(4)), t(np.eye(4)))
    eager = lean_filter(*args)
    graph = lean_filter(*args, graph_steps=256)
    for a, b in zip(eager, graph, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
