"""The native CPU backend (kalmanscan/core/_native.c) against the sequential reference and torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import backends, native
from kalmanscan.testing import assert_close
from tests.helpers import random_model

FIELDS = ("mean", "var", "precision", "info", "pred_mean", "pred_var", "pred_precision")
DTYPES = [np.float64, np.float32]
DT_IDS = ["f64", "f32"]


def _filter(z, model, prior, backend, dtype=np.float64, **over):
    kw = {k: np.asarray(v).astype(dtype) for k, v in {**model, **prior}.items()}
    kw.update(over)
    return ks.filter(
        np.asarray(z).astype(dtype),
        kw.pop("obs_var"),
        kw.pop("decay"),
        kw.pop("process_var"),
        backend=backend,
        **kw,
    )


def _assert_same(res, ref, dtype, kind="parallel"):
    for field in FIELDS:
        a, b = getattr(res, field), getattr(ref, field)
        assert a.dtype == b.dtype and a.shape == b.shape, field
        assert_close(a, b, kind, np.dtype(dtype), what=field)
    assert_close(res.loglik, ref.loglik, kind, np.dtype(dtype), what="loglik")
    assert_close(res.final.lam, ref.final.lam, kind, np.dtype(dtype), what="final.lam")
    assert_close(res.final.eta, ref.final.eta, kind, np.dtype(dtype), what="final.eta")


@pytest.fixture
def poisoned(monkeypatch):
    """Native outputs start as NaN, so an element the kernel does not write fails a comparison."""

    def empty(shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype)

    monkeypatch.setattr(native, "_empty", empty)


def test_extension_is_built_and_auto_picks_it_on_the_cpu():
    """CI must not silently fall back to the torch backend: the extension has to be importable."""
    assert native.available(), "kalmanscan.core._native is not built (setup.py ext_modules)"
    assert backends.resolve("auto", torch.device("cpu")) == "native"


# 1031 lanes: more than one 1024-lane tile; T = 64 x 1031 lanes also splits across threads.
SHAPES = [(1, 1), (1, 7), (63, 5), (63, 1031), (1000, 3), (1000, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("T,N", SHAPES, ids=[f"T{t}-N{n}" for t, n in SHAPES])
@pytest.mark.parametrize("diffuse", [True, False], ids=["diffuse", "prior"])
def test_native_matches_sequential_and_torch(rng, poisoned, T, N, dtype, diffuse):
    """Time-varying parameters, 20 % missing, c != 0, loglik: all fields, both references."""
    z, model, prior = random_model(rng, T, N, diffuse=diffuse)
    if dtype == np.float32:  # well conditioned float32 models, as in test_core_filter
        model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    res = _filter(z, model, prior, "native", dtype)
    assert res.mean.dtype == dtype
    _assert_same(res, _filter(z, model, prior, "sequential", dtype), dtype)
    _assert_same(res, _filter(z, model, prior, "torch", dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_special_steps_forgetting_unobserved_zero_loading(rng, poisoned, dtype):
    """a = 0 (total forgetting), obs_var = inf and NaN z (not observed), h = 0 while diffuse
    (the step still counts in the log-likelihood), offsets, a lane that never sees data."""
    T, N = 40, 9
    z, model, prior = random_model(rng, T, N, diffuse=True, missing=0.1)
    model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    model["decay"][[3, 17, 30]] = 0.0
    model["process_var"][[3, 17, 30]] += 0.2
    model["obs_var"][[5, 6, 22], 1:4] = np.inf
    model["loading"][:4, 2] = 0.0
    z[:, 8] = np.nan  # lane 8 never observed: mean NaN, var inf until a = 0 resets it
    res = _filter(z, model, prior, "native", dtype)
    assert np.isnan(res.mean[:3, 8]).all() and np.isinf(res.var[:3, 8]).all()
    assert np.isfinite(res.var[3:, 8]).all()  # after the forgetting step the prior is 1/p
    _assert_same(res, _filter(z, model, prior, "sequential", dtype), dtype)
    _assert_same(res, _filter(z, model, prior, "torch", dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_broadcast_and_strided_parameters(rng, poisoned, dtype):
    """Parameters of shape [T, 1], [1, N], [T, N] and scalars (stride-0 views read in place), z with
    time on axis 1 and a lane-strided slice of a larger array, prior per lane."""
    T, N = 63, 11
    big = rng.normal(size=(2 * N, T)).astype(dtype)
    z = big[::2]  # [N, T], lane stride 2 rows, time on axis 1
    kw = dict(
        obs_var=rng.uniform(0.2, 1.5, (1, T)).astype(dtype),  # time-varying, lane-invariant
        decay=rng.uniform(0.5, 0.98, (N, 1)).astype(dtype),  # lane-varying, time-invariant
        process_var=rng.uniform(0.05, 0.5, (N, T)).astype(dtype),  # both
        loading=dtype(0.8),
        offset=rng.normal(size=(1, T)).astype(dtype),
        prior_mean=rng.normal(size=N).astype(dtype),
        prior_var=rng.uniform(0.5, 2.0, N).astype(dtype),
        axis=1,
    )
    res = ks.filter(z, backend="native", **kw)
    assert res.mean.shape == (N, T)
    for backend in ("sequential", "torch"):
        _assert_same(res, ks.filter(z, backend=backend, **kw), dtype)


@pytest.mark.parametrize("N", [17, 1031])
def test_threads_split_lanes_deterministically(rng, N):
    """Any thread count gives the single-thread result within rounding (a lane's tile decides
    between the vectorized and the lane-by-lane form), and a given thread count is deterministic."""
    T = 64 if N > 100 else 4000  # enough elements per thread for 2 and 3 threads
    z, model, prior = random_model(rng, T, N, diffuse=True)
    t = {k: torch.as_tensor(v) for k, v in model.items()}
    args = (torch.as_tensor(z),)
    args += tuple(t[k] for k in ("obs_var", "decay", "process_var", "loading", "offset"))
    args += (torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64))
    one, _ = native.run(*args, threads=1)
    for threads in (2, 3):
        many, _ = native.run(*args, threads=threads)
        again, _ = native.run(*args, threads=threads)
        for k in one:
            assert torch.equal(many[k].nan_to_num(7.0), again[k].nan_to_num(7.0)), (threads, k)
            assert_close(many[k], one[k], "parallel", "float64", what=f"{k}, {threads} threads")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_smoother_on_native_matches_torch(rng, dtype):
    z, model, prior = random_model(rng, 300, 4, diffuse=True)
    model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    kw = {k: np.asarray(v).astype(dtype) for k, v in {**model, **prior}.items()}
    a = ks.smooth(z.astype(dtype), backend="native", **kw)
    b = ks.smooth(z.astype(dtype), backend="torch", **kw)
    assert_close(a.mean, b.mean, "parallel", np.dtype(dtype), what="smoothed mean")
    assert_close(a.var, b.var, "parallel", np.dtype(dtype), what="smoothed var")


@pytest.mark.parametrize("lanes", [1, 9], ids=["lane-by-lane", "vectorized"])
def test_reciprocals_outside_the_normal_range_match_the_division_forms(poisoned, lanes):
    """Steps where 1/den or 1/lam leaves the normal float64 range take the exact division forms:
    decay**2 subnormal with a diffuse state, and a variance growing past 1e308 (|decay| > 1);
    in a vectorized tile, next to ordinary lanes."""
    col = np.array([np.nan, 1.0, 2.0, np.nan, np.nan, np.nan, np.nan, 0.5])
    z = np.repeat(col[:, None], lanes, axis=1)
    kw = dict(obs_var=1e300, process_var=1.0, prior_var=1e307)
    for extreme in (1e-160, 30.0):
        decay = np.full(lanes, 0.9)
        decay[0] = extreme
        res = ks.filter(z, decay=decay, backend="native", **kw)
        ref = ks.filter(z, decay=decay, backend="torch", **kw)
        for field in FIELDS + ("loglik",):
            a, b = getattr(res, field), getattr(ref, field)
            assert_close(a, b, "parallel", "float64", what=f"{field}, decay {extreme}")


@pytest.mark.parametrize("shape", [(5, 0), (5, 0, 3)], ids=["N0", "N0x3"])
def test_zero_lanes(shape):
    for backend in ("native", "torch"):
        res = ks.smooth(np.zeros(shape), 1.0, 0.9, 0.1, backend=backend)
        assert res.mean.shape == shape and res.filtered.loglik.shape == shape[1:]


def test_nile_loglik_exact_diffuse():
    flow = np.loadtxt(
        ks.__file__.replace("__init__.py", "data/nile.csv"), delimiter=",", comments="#", skiprows=4
    )[:, 1]
    res = ks.filter(flow, 15099.0, 1.0, 1469.1, backend="native")
    assert_close(res.loglik, -632.5456, "published", "float64", what="Nile loglik")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_overflow_is_an_error(dtype):
    """process_var = 0 and |decay| < 1: the precision grows like decay**(-2t) and overflows."""
    z = np.ones(2000, dtype)
    with pytest.raises(OverflowError, match="overflowed"):
        ks.filter(z, dtype(1.0), dtype(0.5), dtype(0.0), prior_var=dtype(1.0), backend="native")


def test_infinite_z_is_reported_like_the_torch_path():
    """The native path checks z for infinities inside its pass; the message is the same."""
    z = np.zeros((50, 3))
    z[17, 2] = -np.inf
    msgs = []
    for backend in ("native", "torch"):
        with pytest.raises(ValueError, match="z:") as err:
            ks.filter(z, 1.0, 0.9, 0.1, backend=backend)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] and "(17, 2)" in msgs[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_gradients_through_native_equal_the_torch_backend(dtype):
    # auto picks native in grad mode too; its backward is the torch path's vjp at the same inputs
    g = torch.Generator().manual_seed(5)
    z = torch.randn(40, 3, generator=g, dtype=dtype)
    z[7, 1] = float("nan")
    grads = {}
    for backend in ("auto", "torch"):
        leaves = dict(
            z=z.clone().requires_grad_(True),
            obs_var=torch.tensor([0.5, 1.0, 2.0], dtype=dtype, requires_grad=True),
            decay=torch.tensor(0.9, dtype=dtype, requires_grad=True),
            process_var=torch.full((40, 1), 0.1, dtype=dtype, requires_grad=True),
        )
        res = ks.filter(**leaves, offset=0.3, prior_var=4.0, backend=backend)
        loss = res.loglik.sum() + (res.mean * res.var).sum() + res.pred_mean[1:].sum()
        grads[backend] = torch.autograd.grad(loss, list(leaves.values()))
    assert backends.resolve("auto", torch.device("cpu")) == "native"
    for name, a, b in zip(("z", "obs_var", "decay", "process_var"), *grads.values(), strict=True):
        assert_close(a, b, "parallel", dtype, what=f"grad {name}")
    # and the values are the native kernel's, equal to the torch path's
    with torch.no_grad():
        ref = ks.filter(z, 1.0, 0.9, 0.1, backend="torch")
    res = ks.filter(z, 1.0, torch.tensor(0.9, dtype=dtype, requires_grad=True), 0.1)
    _assert_same(res, ref, np.float64 if dtype == torch.float64 else np.float32)


def test_torch_input_gives_torch_output_and_half_computes_in_float32(rng):
    z = torch.randn(20, 3, dtype=torch.float16)
    res = ks.filter(z, 1.0, 0.9, 0.1, backend="native")
    assert isinstance(res.mean, torch.Tensor) and res.mean.dtype == torch.float32
    ref = ks.filter(z.float(), 1.0, 0.9, 0.1, backend="sequential")
    _assert_same(res, ref, np.float32)


def test_native_on_cuda_tensors_is_refused_naming_alternatives():
    with pytest.raises(ValueError, match="'native' runs on CPU tensors.*'triton'.*'torch'"):
        backends.resolve("native", torch.device("cuda"))


def test_fallback_without_the_extension(monkeypatch, rng):
    """An install without a C compiler: auto uses torch, explicit 'native' says what to use."""
    z, model, prior = random_model(rng, 50, 3)
    with_ext = _filter(z, model, prior, "auto")
    monkeypatch.setattr(native, "_ext", None)
    assert not native.available()
    assert backends.resolve("auto", torch.device("cpu")) == "torch"
    _assert_same(_filter(z, model, prior, "auto"), with_ext, np.float64)
    with pytest.raises(ValueError, match="'native' needs the compiled extension.*'torch'"):
        _filter(z, model, prior, "native")


def test_second_derivatives_through_native_equal_the_torch_backend():
    # Hessians (fit_ou's standard errors) differentiate the native path's backward again
    z = torch.randn(50, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)

    def loglik(backend):
        def f(decay, process_var):
            return ks.filter(z, 1.0, decay, process_var, backend=backend).loglik.sum()

        return f

    x = (torch.tensor(0.8, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64))
    h_native = torch.autograd.functional.hessian(loglik("native"), x)
    h_torch = torch.autograd.functional.hessian(loglik("torch"), x)
    for i in range(2):
        for j in range(2):
            assert_close(h_native[i][j], h_torch[i][j], "parallel", torch.float64, what="hessian")
    assert float(h_torch[0][0]) != 0.0
