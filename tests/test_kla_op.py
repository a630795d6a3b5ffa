"""The KLA op's torch paths: sequential reference vs the general parallel filter, decode step,
dtypes, gradients and argument checks. The fused Triton kernels are tested in test_cuda_kla.py."""

import pytest
import torch

from kalmanscan.core.kla_op import KLAResult, kla_filter, kla_filter_sequential, kla_step
from kalmanscan.testing import assert_close, tolerance


def make_inputs(B, L, M, S, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def u(*shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    x = dict(
        v=r(B, L, M),
        Lv=u(B, L, M, lo=0.2, hi=5.0),
        k=r(B, L, S) / S**0.5,
        q=r(B, L, S),
        decay=u(M, S, lo=0.5, hi=1.0),
        process_var=u(M, S, lo=0.01, hi=0.5),
        lam0=u(B, M, S, lo=0.5, hi=2.0),
        eta0=r(B, M, S),
    )
    return {n: t.to(dtype).requires_grad_(requires_grad) for n, t in x.items()}


CASES = [(1, 1, 1, 1), (2, 63, 3, 4), (1, 17, 5, 16)]


def _id(c):
    return "B{}-L{}-M{}-S{}".format(*c)


@pytest.mark.parametrize("shape", CASES, ids=_id)
def test_torch_matches_sequential(shape):
    x = make_inputs(*shape)
    ref = kla_filter(**x, backend="sequential", return_precision=True)
    got = kla_filter(**x, backend="torch", return_precision=True)
    tol = tolerance("parallel", "float64")
    for name in ("y", "yvar", "precision"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=tol, atol=tol)
    torch.testing.assert_close(got.final.lam, ref.final.lam, rtol=tol, atol=tol)
    torch.testing.assert_close(got.final.eta, ref.final.eta, rtol=tol, atol=tol)


def test_reference_matches_independent_scalar_filters():
    # Each lane (b, m, s) is one scalar filter with loading k[s] and obs_var 1/Lv[m].
    x = make_inputs(2, 9, 3, 2, seed=3)
    res = kla_filter(**x, backend="sequential", return_precision=True)
    b, m, s = 1, 2, 1
    lam, eta = x["lam0"][b, m, s].item(), x["eta0"][b, m, s].item()
    a, p = x["decay"][m, s].item(), x["process_var"][m, s].item()
    P, mean = 1 / lam, eta / lam
    for t in range(9):  # covariance form, written out independently
        mean, P = a * mean, a * a * P + p
        h, R, z = x["k"][b, t, s].item(), 1 / x["Lv"][b, t, m].item(), x["v"][b, t, m].item()
        K = P * h / (h * h * P + R)
        mean, P = mean + K * (z - h * mean), (1 - K * h) * P
        assert_close(res.precision[b, t, m, s].item(), 1 / P, "rounding", "float64")
    mean_got = res.final.eta[b, m, s].item() / res.final.lam[b, m, s].item()
    assert_close(mean_got, mean, "rounding", "float64", what="final mean")


def test_default_prior_is_unit_precision_zero_information():
    x = make_inputs(2, 5, 3, 4)
    x.pop("lam0"), x.pop("eta0")
    B, M, S = 2, 3, 4
    a = kla_filter(**x, backend="sequential")
    b = kla_filter(
        **x,
        lam0=torch.ones(B, M, S, dtype=torch.float64),
        eta0=torch.zeros(B, M, S, dtype=torch.float64),
        backend="sequential",
    )
    torch.testing.assert_close(a.y, b.y)


def test_step_continues_the_sequence():
    x = make_inputs(2, 6, 3, 4)
    full = kla_filter(**x, backend="sequential")
    lam, eta = x["lam0"], x["eta0"]
    for t in range(6):
        y, yvar, (lam, eta) = kla_step(
            x["v"][:, t],
            x["Lv"][:, t],
            x["k"][:, t],
            x["q"][:, t],
            x["decay"],
            x["process_var"],
            lam,
            eta,
        )
        torch.testing.assert_close(y, full.y[:, t])
        torch.testing.assert_close(yvar, full.yvar[:, t])
    torch.testing.assert_close(lam, full.final.lam)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_low_precision_inputs_compute_in_float32(dtype):
    x = make_inputs(2, 7, 3, 4, dtype=dtype)
    res = kla_filter(**x, backend="torch")
    assert res.y.dtype == torch.float32 and res.final.lam.dtype == torch.float32
    ref = kla_filter(**{n: t.double() for n, t in x.items()}, backend="sequential")
    tol = tolerance("rounding", "float32")
    torch.testing.assert_close(res.y.double(), ref.y, rtol=tol, atol=tol)


def test_total_forgetting_lane():
    x = make_inputs(1, 4, 2, 3)
    x["decay"][0, 1] = 0.0
    res = kla_filter(**x, backend="sequential", return_precision=True)
    # lam_t = 1/p + phi_t whatever came before
    phi = x["Lv"][0, :, 0] * x["k"][0, :, 1] ** 2
    torch.testing.assert_close(res.precision[0, :, 0, 1], 1 / x["process_var"][0, 1] + phi)
    got = kla_filter(**x, backend="torch")
    torch.testing.assert_close(got.y, res.y)


def test_gradients_of_torch_path_match_sequential():
    x = make_inputs(2, 11, 3, 4, requires_grad=True)
    g = torch.Generator().manual_seed(7)
    wy, wv = (
        torch.randn(2, 11, 3, generator=g, dtype=torch.float64),
        torch.rand(2, 11, 3, generator=g, dtype=torch.float64),
    )
    grads = []
    for backend in ("sequential", "torch"):
        res = kla_filter(**x, backend=backend)
        loss = (
            (wy * res.y).sum() + (wv * res.yvar).sum() + res.final.lam.sum() + res.final.eta.sum()
        )
        grads.append(torch.autograd.grad(loss, list(x.values())))
    for name, a, b in zip(x, *grads, strict=True):
        tol = tolerance("parallel", "float64")
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=name)


def test_sequential_gradcheck():
    x = make_inputs(1, 3, 2, 2, requires_grad=True)
    names = list(x)

    def f(*args):
        res = kla_filter_sequential(*args)
        return res.y, res.yvar, res.final.lam, res.final.eta

    assert torch.autograd.gradcheck(f, tuple(x[n] for n in names))


def test_result_type():
    res = kla_filter(**make_inputs(1, 2, 1, 1))
    assert isinstance(res, KLAResult) and res.precision is None


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(Lv=torch.ones(2, 5, 4)), "Lv: expected shape"),
        (dict(q=torch.ones(2, 5, 3)), "q: expected shape"),
        (dict(k=torch.ones(2, 4, 4)), "k: expected shape"),
        (dict(decay=torch.ones(4, 4)), "decay: expected a tensor broadcastable"),
        (dict(lam0=torch.ones(3, 3, 4)), "lam0: expected a tensor broadcastable"),
        (dict(v=torch.ones(2, 5)), "v: expected of shape"),
        (dict(v=torch.ones(2, 5, 3, dtype=torch.int64)), "v: expected a float"),
        (dict(backend="cuda"), "backend: expected"),
    ],
    ids=[
        "Lv-shape",
        "q-shape",
        "k-shape",
        "decay-shape",
        "lam0-shape",
        "v-ndim",
        "v-dtype",
        "backend",
    ],
)
def test_bad_arguments(change, match):
    x = {n: t.float() for n, t in make_inputs(2, 5, 3, 4).items()}
    x.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        kla_filter(**x)


def test_triton_backend_refuses_cpu_tensors():
    with pytest.raises(ValueError, match="use backend='torch'"):
        kla_filter(**make_inputs(1, 2, 1, 1), backend="triton")


def test_value_checks_take_one_readback_when_valid():
    # valid inputs pass the one-readback summary; every invalid kind fails it (and the detailed
    # checks then name the input: the error-message tests above)
    from kalmanscan.core.kla_op import _values_ok

    M, S = 3, 4
    base = {
        "Lv": torch.rand(2, 5, M) + 0.5,
        "decay": torch.full((M, S), 0.9),
        "process_var": torch.full((M, S), 0.1),
        "lam0": torch.ones(2, M, S),
        "eta0": torch.zeros(2, M, S),
    }
    assert _values_ok(base)
    assert _values_ok({n: base[n] for n in ("Lv", "decay", "process_var")})
    bad = [("Lv", 0.0), ("Lv", float("nan")), ("decay", float("inf")), ("process_var", -0.5),
           ("lam0", -1.0), ("eta0", float("-inf"))]  # fmt: skip
    for name, value in bad:
        t = {n: x.clone() for n, x in base.items()}
        t[name].view(-1)[1] = value
        assert not _values_ok(t), (name, value)
    t = {n: x.clone() for n, x in base.items()}
    t["decay"][0, 0], t["process_var"][0, 0] = 0.0, 0.0
    assert not _values_ok(t)


def _mp_lane_loss(lam0, eta0, a, p, v, Lv, k, q, w_y, w_lam):
    """One lane's loss ``sum_t w_y[t] y_t + w_lam lam_T`` by the filter's recursion at 50
    digits (mpmath): ``y_t = q_t eta_t / lam_t``."""
    import mpmath as mp

    d = a * a
    lam, eta, tot = lam0, eta0, mp.mpf(0)
    for t in range(len(v)):
        den = p * lam + d
        lam = lam / den + Lv[t] * k[t] * k[t]
        eta = (a / den) * eta + v[t] * Lv[t] * k[t]
        tot += w_y[t] * q[t] * eta / lam
    return tot + w_lam * lam


@pytest.mark.parametrize("lam0", [0.7, 0.37, 1.9, 0.0])
@pytest.mark.parametrize("backend", ["sequential", "torch"])
def test_gradients_against_mpmath_when_decay_is_far_below_the_precision(backend, lam0):
    """a^2 << p lam: the quotient rule on ``lam / (p lam + d)`` subtracts two terms of size
    ``1 / (p lam)`` whose difference ``d / (p lam + d)^2`` is 1e-14 of them here; the sequential
    backend's float64 gradient of the start precision (all through that difference: eta0 = 0)
    was their rounding (0.1-1.4 % off here) until ``steps.predict_info`` gave autograd a
    product form. Every gradient against central differences at 50 digits, to 1e-6 (both
    backends' float64 gradients of the first value precision at lam0 = 0, where lam0's
    derivative is 1 / d, agree with each other and with mpmath to 6 digits, not 9)."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    g = torch.Generator().manual_seed(3)
    L = 6
    f64 = torch.float64
    x = dict(
        v=torch.randn(1, L, 1, generator=g, dtype=f64),
        Lv=torch.rand(1, L, 1, generator=g, dtype=f64) * 1e-10 + 1e-11,
        k=torch.randn(1, L, 1, generator=g, dtype=f64) * 1e-2,
        q=torch.randn(1, L, 1, generator=g, dtype=f64),
        decay=torch.tensor([[1e-3]], dtype=f64),
        process_var=torch.tensor([[6e7]], dtype=f64),
        lam0=torch.tensor([[[lam0]]], dtype=f64),
        eta0=torch.tensor([[[0.0]]], dtype=f64),
    )
    w_y = torch.randn(L, generator=g, dtype=f64)
    w_lam = 0.5
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    res = kla_filter(**leaves, backend=backend)
    loss = (res.y[0, :, 0] * w_y).sum() + w_lam * res.final.lam.sum()
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))

    def mp_loss(**over):
        val = {n: [mp.mpf(float(e)) for e in t.reshape(-1)] for n, t in x.items()}
        for n, (i, h) in over.items():
            val[n][i] += h
        return _mp_lane_loss(val["lam0"][0], val["eta0"][0], val["decay"][0],
                             val["process_var"][0], val["v"], val["Lv"], val["k"], val["q"],
                             [mp.mpf(float(e)) for e in w_y], mp.mpf(w_lam))  # fmt: skip

    for name, t in x.items():
        for i in range(t.numel()):
            h = mp.mpf(float(abs(t.reshape(-1)[i]))) * mp.mpf("1e-20") or mp.mpf("1e-30")
            true = (mp_loss(**{name: (i, h)}) - mp_loss(**{name: (i, -h)})) / (2 * h)
            got = float(grads[name].reshape(-1)[i])
            assert abs(got - float(true)) <= 1e-6 * abs(float(true)) + 1e-300, (
                f"{backend}: d loss / d {name}[{i}] = {got:.6e}, mpmath {float(true):.6e}"
            )
