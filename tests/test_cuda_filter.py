"""The Triton kernels of the general filter (kalmanscan/cuda/filter.py) against the sequential
reference in float64, forward and backward, in both regimes (one thread per lane over all of
time; chunked scan with carries). Without CUDA they run under TRITON_INTERPRET=1 at small sizes.
Outputs are NaN-poisoned before every launch so an unwritten element fails.
"""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.core.sequential import filter_lanes as reference  # noqa: E402
from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda import filter as F  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from tests.helpers import triton_interpreted  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


NAMES = ("z", "obs_var", "decay", "process_var", "loading", "offset", "lam0", "eta0")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    # tests/conftest.py sets TRITON_INTERPRET=1 before triton's first import when there is no GPU
    assert CUDA or triton_interpreted(F._fwd_kernel), (
        "the Triton kernels must run in the interpreter on the CPU"
    )
    monkeypatch.setattr(_common, "POISON", True)


def make_inputs(T, N, dtype=torch.float64, seed=0, forget=False, broadcast=False):
    """Random valid inputs with missing steps, a diffuse lane and (optionally) total forgetting."""
    g = torch.Generator().manual_seed(seed)

    def u(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    ov = u(T, N, lo=0.3, hi=2.0)
    missing = u(T, N) < 0.1
    z[missing], ov[missing] = float("nan"), float("inf")
    if (
        broadcast
    ):  # per-lane parameters, expanded over time (stride 0) as the filter API passes them
        a, p = u(1, N, lo=0.5, hi=1.05), u(1, N, lo=0.01, hi=0.3)
        # (a nonzero offset: the reference skips an all-zero offset and then gives it no gradient)
        h, c = torch.ones(1, 1, dtype=torch.float64), torch.full((1, 1), 0.1, dtype=torch.float64)
    else:
        a, p = u(T, N, lo=0.5, hi=1.05), u(T, N, lo=0.01, hi=0.3)
        h, c = torch.randn(T, N, generator=g, dtype=torch.float64), 0.3 * u(T, N, lo=-1, hi=1)
        if forget:
            a[u(T, N) < 0.05] = 0.0
    lam0 = u(N, lo=0.2, hi=2.0)
    lam0[0] = 0.0  # a diffuse lane
    eta0 = lam0 * torch.randn(N, generator=g, dtype=torch.float64)
    small = [z, ov, a, p, h, c, lam0, eta0]
    return [x.to(device=DEVICE, dtype=dtype) for x in small]


def expand(xs, T, N):
    return [x.expand(T, N) for x in xs[:6]] + list(xs[6:])


def run_both(xs, T, N, backend_dtype):
    """Kernel (in backend_dtype) and reference (float64) outputs and input gradients."""
    g = torch.Generator().manual_seed(1)
    wl = torch.randn(T, N, generator=g, dtype=torch.float64).to(DEVICE)
    we = torch.randn(T, N, generator=g, dtype=torch.float64).to(DEVICE)
    out = {}
    for name, fn, dtype in (
        ("kernel", F.filter_lanes, backend_dtype),
        ("ref", reference, torch.float64),
    ):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in xs]
        lam, eta = fn(*expand(leaves, T, N))
        loss = (wl.to(dtype) * lam).sum() + (we.to(dtype) * eta).sum()
        grads = torch.autograd.grad(loss, leaves)
        out[name] = (lam, eta, [torch.nan_to_num(gr, nan=0.0) for gr in grads])
    return out


if CUDA:
    CASES = [(1, 3, "lanes"), (63, 5, "chunks"), (1000, 77, "chunks"), (1000, 20000, "lanes"),
             (4099, 64, "chunks"), (1000, 300, "lanes")]  # fmt: skip
else:
    CASES = [(1, 3, "lanes"), (63, 5, "chunks"), (100, 2, "chunks"), (1000, 1, "lanes")]


def _force(monkeypatch, regime):
    monkeypatch.setattr(F, "_MANY_LANES", 1 if regime == "lanes" else 10**9)


@pytest.mark.parametrize("T, N, regime", CASES, ids=lambda c: str(c))
def test_forward_backward_float64(T, N, regime, monkeypatch):
    _force(monkeypatch, regime)
    xs = make_inputs(T, N, forget=True)
    res = run_both(xs, T, N, torch.float64)
    k, r = res["kernel"], res["ref"]
    assert_close(k[0], r[0], "kernel", torch.float64, what="lam")
    assert_close(k[1], r[1], "kernel", torch.float64, what="eta")
    for name, gk, gr in zip(NAMES, k[2], r[2], strict=True):
        assert_close(gk, gr, "kernel_grad", torch.float64, what=f"grad {name}")


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
def test_float32_against_float64_reference(regime, monkeypatch):
    _force(monkeypatch, regime)
    T, N = (2000, 1000) if CUDA else (63, 4)
    xs = make_inputs(T, N, seed=3)
    res = run_both(xs, T, N, torch.float32)
    k, r = res["kernel"], res["ref"]
    assert k[0].dtype == torch.float32
    assert_close(k[0], r[0], "kernel", torch.float32, what="lam")
    assert_close(k[1], r[1], "kernel", torch.float32, what="eta")
    for name, gk, gr in zip(NAMES, k[2], r[2], strict=True):
        assert_close(gk, gr, "kernel_grad", torch.float32, what=f"grad {name}")


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
def test_broadcast_parameters(regime, monkeypatch):
    # stride-0 parameters are read once per lane; gradients reach the small tensors
    _force(monkeypatch, regime)
    T, N = (3000, 500) if CUDA else (37, 3)
    xs = make_inputs(T, N, seed=5, broadcast=True)
    res = run_both(xs, T, N, torch.float64)
    k, r = res["kernel"], res["ref"]
    assert_close(k[0], r[0], "kernel", torch.float64, what="lam")
    assert_close(k[1], r[1], "kernel", torch.float64, what="eta")
    for name, gk, gr in zip(NAMES, k[2], r[2], strict=True):
        assert gk.shape == gr.shape
        assert_close(gk, gr, "kernel_grad", torch.float64, what=f"grad {name}")


def test_regimes_agree_and_write_everything(monkeypatch):
    T, N = (5000, 33) if CUDA else (45, 2)
    xs = expand(make_inputs(T, N, seed=9, forget=True), T, N)
    outs = []
    for regime in ("lanes", "chunks"):
        _force(monkeypatch, regime)
        with torch.no_grad():
            outs.append(F.filter_lanes(*xs))
    for a, b in zip(*outs, strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, b, "kernel", torch.float64)


def test_plan_chooses_regime_by_shape():
    assert F._plan(4096, 65536, 1)[2] == 1  # many lanes: one chunk
    TB, CH, NC, _, _ = F._plan(2**20, 64, 1)
    assert NC > 1 and CH % TB == 0 and NC * CH >= 2**20


@pytest.mark.skipif(not CUDA, reason="the public API dispatches to triton for CUDA tensors only")
def test_public_filter_api_uses_triton_on_cuda():
    import kalmanscan

    g = torch.Generator().manual_seed(12)
    z = torch.randn(500, 40, generator=g, dtype=torch.float64).to(DEVICE)
    z[3, 5] = float("nan")
    kw = dict(obs_var=0.7, decay=0.95, process_var=0.1, prior_var=float("inf"))
    a = kalmanscan.filter(z, **kw)  # auto: triton on CUDA
    b = kalmanscan.filter(z, **kw, backend="sequential")
    for name in ("mean", "precision", "loglik"):
        assert_close(getattr(a, name), getattr(b, name), "kernel", torch.float64, what=name)
