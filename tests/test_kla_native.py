"""The KLA op's compiled CPU forward (backend "native", kalmanscan/core/_native_kla.c) against the
float64 sequential reference: outputs NaN-poisoned before the kernel writes them
(tests/conftest.py), float32 and float64, with and without an initial state and precisions; the
refusal of gradients; dispatch."""

import pytest
import torch

from kalmanscan.core import backends, native
from kalmanscan.core.kla_op import kla_filter, kla_filter_native, kla_filter_sequential
from kalmanscan.testing import assert_close
from tests.helpers import kla_inputs

pytestmark = pytest.mark.skipif(
    not native.kla_available(), reason="kalmanscan.core._native_kla is not built"
)

NAMES = ("v", "Lv", "k", "q", "decay", "process_var", "lam0", "eta0")
OUTS = ("y", "yvar", "lam", "eta", "precision")


def make_inputs(B, L, M, S, seed=0, forget=False):
    return kla_inputs(B, L, M, S, seed, forget)


def outputs(res):
    return res.y, res.yvar, res.final.lam, res.final.eta, res.precision


def readout_scale(x):
    """Per-element scale of y: sum_s |q eta / lam| at each step (y is a signed sum that can
    cancel to near 0, leaving only the rounding of its terms)."""
    B, L, M = x["v"].shape
    eta = []
    lam, e = x["lam0"], x["eta0"]
    for t in range(L):  # eta per step from the reference's recursion is not returned: rebuild
        r = kla_filter_sequential(
            *(x[n][:, t : t + 1] for n in ("v", "Lv", "k", "q")),
            x["decay"],
            x["process_var"],
            lam,
            e,
        )
        lam, e = r.final.lam, r.final.eta
        eta.append((x["q"][:, t, None, :] * e / lam).abs().sum(-1))
    return torch.stack(eta, 1)


SHAPES = [
    (1, 1, 1, 1),
    (2, 1, 3, 5),
    (1, 63, 7, 16),
    (2, 63, 5, 3),
    (1, 300, 33, 16),
    (2, 300, 9, 17),
]


def _id(shape, dtype, init):
    B, L, M, S = shape
    return f"B{B}-L{L}-M{M}-S{S}-{str(dtype)[6:]}-{'init' if init else 'default'}"


CASES = [
    pytest.param(s, d, i, id=_id(s, d, i))
    for s in SHAPES
    for d in (torch.float64, torch.float32)
    for i in (True, False)
]


@pytest.mark.parametrize("shape, dtype, init", CASES)
def test_matches_sequential_reference(shape, dtype, init):
    x = make_inputs(*shape, seed=sum(shape), forget=True)
    if not init:
        x["lam0"] = torch.ones_like(x["lam0"])
        x["eta0"] = torch.zeros_like(x["eta0"])
    args = [x[n] for n in NAMES[:6]] + ([x["lam0"], x["eta0"]] if init else [])
    got = kla_filter(*(a.to(dtype) for a in args), return_precision=True, backend="native")
    ref = kla_filter(*args, return_precision=True, backend="sequential")
    assert got.y.dtype == dtype and got.precision.dtype == dtype
    kind = "rounding" if dtype == torch.float64 else "kernel"
    scale = readout_scale(x)
    for name, a, b in zip(OUTS, outputs(got), outputs(ref), strict=True):
        if name == "y":  # elementwise against the scale of its terms
            err = ((a.double() - b).abs() / scale).max().item()
            assert err <= 1e-13 if dtype == torch.float64 else err <= 1e-5, (name, err)
        else:
            assert_close(a, b, kind, dtype, what=name)
    if dtype == torch.float32:  # float32 rounding: the same as the sequential backend's
        ref32 = kla_filter(
            *(a.to(dtype) for a in args), return_precision=True, backend="sequential"
        )
        for name, a, b in zip(OUTS[1:], outputs(got)[1:], outputs(ref32)[1:], strict=True):
            assert_close(a, b, "rounding", dtype, what=f"{name} vs float32 sequential")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_without_precision_and_broadcast_inputs(dtype):
    # decay/process_var broadcast from [S], an initial state broadcast from [M, S], strided v
    B, L, M, S = 2, 63, 5, 4
    x = make_inputs(B, L, M, S, seed=3)
    v = torch.randn(B, M, L, dtype=torch.float64).transpose(1, 2)  # non-contiguous
    args = dict(x, v=v, decay=x["decay"][0], process_var=x["process_var"][0], lam0=x["lam0"][0])
    args = {n: a.to(dtype) for n, a in args.items()}
    got = kla_filter(*args.values(), backend="native")
    ref = kla_filter(*args.values(), backend="sequential")
    assert got.precision is None
    for name, a, b in zip(OUTS[:4], outputs(got), outputs(ref), strict=False):
        assert_close(a, b, "rounding", dtype, scale=b.abs().max().item(), what=name)


def test_threads_give_identical_results():
    # channels split over threads (here 3 parts of 16, 16 and 8 channels: enough lane-steps for
    # native._threads to grant 3): every lane's arithmetic is the same, so the results are equal
    x = make_inputs(1, 300, 40, 16, seed=5)
    native.set_num_threads(1)
    try:
        single = outputs(kla_filter(*x.values(), return_precision=True, backend="native"))
        native.set_num_threads(3)
        assert native._threads(300 * 40 * 16) == 3
        several = outputs(kla_filter(*x.values(), return_precision=True, backend="native"))
    finally:
        native.set_num_threads(None)
    for name, a, b in zip(OUTS, several, single, strict=True):
        assert torch.equal(a, b), name


def test_outputs_poisoned_before_the_kernel():
    # tests/conftest.py makes native._empty return NaN-filled tensors: the results above are
    # finite only because the kernel wrote every element; check the hook reaches this backend
    x = make_inputs(1, 5, 3, 2, seed=1)
    calls = []
    empty = native._empty

    def spy(shape, dtype):
        out = empty(shape, dtype)
        calls.append(bool(torch.isnan(out).all()))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "_empty", spy)
        res = kla_filter(*x.values(), return_precision=True, backend="native")
    assert calls == [True] * 5
    for name, a in zip(OUTS, outputs(res), strict=True):
        assert torch.isfinite(a).all(), name


def test_refuses_gradients_naming_the_backends_that_have_them():
    x = make_inputs(1, 4, 3, 2, seed=2)
    x["process_var"].requires_grad_(True)
    with pytest.raises(ValueError, match=r"process_var requiring grad.*'sequential' or 'torch'"):
        kla_filter(*x.values(), backend="native")
    with torch.no_grad():  # without a graph to build, the same inputs run
        res = kla_filter(*x.values(), backend="native")
    ref = kla_filter_sequential(*(t.detach() for t in x.values()))
    assert_close(res.yvar, ref.yvar, "rounding", torch.float64, what="yvar")


def test_dispatch():
    assert backends.TABLES["kla"]["native"] == "kalmanscan.core.kla_op:kla_filter_native"
    assert backends.get("native", op="kla") is kla_filter_native
    cpu = torch.device("cpu")
    assert backends.resolve("native", cpu, op="kla") == "native"
    # "auto" never looks at grad mode, so on the CPU it stays with the backend with gradients
    assert backends.resolve("auto", cpu, op="kla") == "sequential"
    with pytest.raises(ValueError, match="'native' runs on CPU tensors"):
        backends.resolve("native", torch.device("cuda"), op="kla")


def test_dispatch_without_the_extension(monkeypatch):
    monkeypatch.setattr(native, "_kla_ext", None)
    with pytest.raises(ValueError, match=r"_native_kla, which is not built.*'sequential'"):
        backends.resolve("native", torch.device("cpu"), op="kla")
