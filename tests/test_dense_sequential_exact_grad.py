"""``backend="sequential"``: derivatives w.r.t. an observation variance that is 0 (an exact entry).

The reference decorrelates R = L Dg L' and treated a zero pivot as the constant 0, so
d loglik / dR[0, 0] at R = diag(0, 0.5) was 0 (the truth, from one-sided differences and the
torch backend, 182.36), the smoothed moments missed the same derivative through the backward
filter's exact-entry conditioning and the singular filtered covariance, and with a rank-1 R whose
rounding let Cholesky pass (pivot 3e-9) the smoother's derivative was NaN. Values are unchanged.

Not covered (docs/dense.md, Gradients): the derivative w.r.t. an off-diagonal R[i, j] between an
exact entry and a later one is still 0 on this backend (torch: -94.37 here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native


def probe_model():
    """The probe's model (repro_sequential_grad_exact_entry.py): 3 states, d = 2, missing
    entries, a proper prior, R = diag(0, 0.5)."""
    rng = np.random.default_rng(3)
    T, n, d = 20, 3, 2

    def spd(k):
        A = rng.normal(size=(k, k))
        return A @ A.T / k + 0.1 * np.eye(k)

    F = rng.normal(size=(n, n)) * 0.5
    Q = spd(n)
    H = rng.normal(size=(d, n))
    spd(d)
    off = rng.normal(size=n) * 0.1
    m0 = rng.normal(size=n)
    P0 = spd(n)
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < 0.2] = np.nan
    z[4] = np.nan
    return dict(z=z, F=F, Q=Q, H=H, offset=off, prior_mean=m0, prior_cov=P0), np.diag([0.0, 0.5])


def small_model(seed, kind):
    rng = np.random.default_rng(seed)
    T, n, d = 15, 3, 2

    def spd(k):
        A = rng.normal(size=(k, k))
        return A @ A.T / k + 0.1 * np.eye(k)

    F = rng.normal(size=(n, n)) * 0.5
    Q = spd(n)
    H = rng.normal(size=(d, n))
    off = rng.normal(size=n) * 0.1
    m0 = rng.normal(size=n)
    P0 = spd(n)
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < 0.2] = np.nan
    if kind == "rank1":
        v = rng.normal(size=d)
        R = np.outer(v, v)
    else:
        R = np.diag([0.0, 0.5])
    if kind == "diffuse":
        P0 = np.diag([np.inf, 1.0, 1.0])
    return dict(z=z, F=F, Q=Q, H=H, offset=off, prior_mean=m0, prior_cov=P0), R


def loglik(args, R, backend="sequential"):
    return float(kd.filter(**args, R=R, backend=backend).loglik)


def grad_R(args, R, backend, out):
    tR = torch.tensor(R, requires_grad=True)
    targs = dict(args, z=torch.tensor(args["z"]))
    (g,) = torch.autograd.grad(out(targs, tR, backend), tR)
    return g.numpy()


def ll_out(targs, tR, backend):
    return kd.filter(**targs, R=tR, backend=backend).loglik


def weights(args, seed):
    rng = np.random.default_rng(seed)
    T, n = args["z"].shape[0], args["F"].shape[-1]
    return rng.normal(size=(T, n)), rng.normal(size=(T, n, n))


def smooth_out(args, seed):
    wm, wc = (torch.tensor(w) for w in weights(args, seed))

    def out(targs, tR, backend):
        s = kd.smooth(**targs, R=tR, backend=backend)
        return (s.mean * wm).sum() + (s.cov * wc).sum()

    return out


def smooth_value(args, R, seed):
    s = kd.smooth(**args, R=R, backend="sequential")
    wm, wc = weights(args, seed)
    return float((s.mean * wm).sum() + (s.cov * wc).sum())


def test_loglik_gradient_of_a_zero_observation_variance():
    args, R = probe_model()
    E = np.zeros((2, 2))
    E[0, 0] = 1.0
    one_sided = (loglik(args, R + 1e-8 * E) - loglik(args, R)) / 1e-8
    g = grad_R(args, R, "sequential", ll_out)
    assert abs(g[0, 0] - one_sided) < 1e-5 * abs(one_sided), (g[0, 0], one_sided)  # was 0.0
    np.testing.assert_allclose(g[0, 0], 182.3586, rtol=1e-6)
    gt = grad_R(args, R, "torch", ll_out)
    np.testing.assert_allclose(np.diag(g), np.diag(gt), rtol=1e-10)
    # the derivative at 0 is the limit of the derivative at small positive variances (central
    # differences there, where R is nonsingular)
    h, r = 1e-9, 1e-7
    central = (loglik(args, R + (r + h) * E) - loglik(args, R + (r - h) * E)) / (2 * h)
    assert abs(g[0, 0] - central) < 1e-4 * abs(central), (g[0, 0], central)


def test_smoothed_moments_gradient_of_a_zero_observation_variance():
    args, R = probe_model()
    E = np.zeros((2, 2))
    E[0, 0] = 1.0
    g = grad_R(args, R, "sequential", smooth_out(args, 1))
    gt = grad_R(args, R, "torch", smooth_out(args, 1))
    one_sided = (smooth_value(args, R + 1e-8 * E, 1) - smooth_value(args, R, 1)) / 1e-8
    assert abs(g[0, 0] - one_sided) < 1e-4 * max(1.0, abs(one_sided)), (g[0, 0], one_sided)
    np.testing.assert_allclose(g[0, 0], gt[0, 0], rtol=1e-10)
    np.testing.assert_allclose(g[1, 1], gt[1, 1], rtol=1e-10)


@pytest.mark.parametrize(
    "seed, kind",
    [(0, "diag"), (2, "diffuse"), (1, "rank1"), (3, "rank1")],
    ids=["diag", "diffuse-prior", "rank1-cholesky-passes", "rank1"],
)
def test_derivative_along_the_zero_pivot(seed, kind):
    """Direction W = u u' (u spanning R's null space): it moves only the zero pivot of R's
    decorrelation. Log-likelihood and smoothed moments against one-sided differences and the
    torch backend. The differences are one-sided (R - h W is not a covariance) and of second
    order, (4 f(h) - f(2h) - 3 f(0)) / 2h at h = 1e-6: 5e-9 from the gradient, where the first
    order at h = 1e-8 was 2e-4 off on the smoothed moments' rounding (5e-12 of them)."""
    args, R = small_model(seed, kind)
    w, U = np.linalg.eigh(R)
    W = np.outer(U[:, 0], U[:, 0])
    h = 1e-6
    for out, value in ((ll_out, loglik), (smooth_out(args, 5), lambda a, r: smooth_value(a, r, 5))):
        g = float((grad_R(args, R, "sequential", out) * W).sum())
        gt = float((grad_R(args, R, "torch", out) * W).sum())
        f0, f1, f2 = (value(args, R + k * h * W) for k in (0, 1, 2))
        fd = (4 * f1 - f2 - 3 * f0) / (2 * h)
        assert np.isfinite(g)
        assert abs(g - gt) < 1e-8 * max(1.0, abs(gt)), (g, gt)
        assert abs(g - fd) < 1e-6 * max(1.0, abs(fd)), (g, fd)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_rank1_smoother_values_match_native():
    """A rank-1 R whose Cholesky passes on rounding (pivot 3e-9): the reference smoother now
    treats its zero pivot as the filter does (exact), as native does: 6e-9 apart before."""
    args, R = small_model(1, "rank1")
    seq = kd.smooth(**args, R=R, backend="sequential")
    nat = kd.smooth(**args, R=R, backend="native")
    np.testing.assert_allclose(seq.mean, nat.mean, rtol=0, atol=1e-13)
    np.testing.assert_allclose(seq.cov, nat.cov, rtol=0, atol=1e-13)
