"""The native CPU backend (kalmanscan/core/_native.c) on the backend contract
(docs/backend-contract.md), against the sequential reference, the torch backend and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import backends, native, parallel, sequential
from kalmanscan.testing import assert_close
from tests.helpers import random_model

FILTER = native.FILTER_KEYS
DTYPES = [torch.float64, torch.float32]
DT_IDS = ["f64", "f32"]

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")


def _inputs(z, model, prior, dtype, compact=False):
    """The contract's inputs from random_model's arrays: [T, N] (expanded where time-invariant),
    or the compact tensors themselves; x0 from the prior as the API builds it."""
    T, N = z.shape
    t = lambda a: torch.as_tensor(np.asarray(a)).to(dtype)  # noqa: E731
    keys = ("obs_var", "decay", "process_var", "loading", "offset")
    params = tuple(t(model[k]) if compact else t(model[k]).expand(T, N) for k in keys)
    var, mean = t(prior["prior_var"]), t(prior["prior_mean"])
    diffuse, big = torch.isinf(var), var > 1
    vs = torch.where(big & ~diffuse, var, 1.0)
    x0 = (
        torch.where(diffuse, 0.0, 1 / vs),
        torch.where(diffuse, 0.0, mean / vs),
        torch.where(big | diffuse, 1.0, var),
    )
    return (t(z),) + params, x0


def _assert_same(res, ref, dtype, keys, kind="parallel"):
    for k in keys:
        a, b = res[k], ref[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert_close(a, b, kind, dtype, what=k)
    for k, (a, b) in enumerate(zip(res["final"], ref["final"], strict=True)):
        assert_close(a, b, kind, dtype, what=f"final[{k}]")
    assert int(res["flags"]) == int(ref["flags"])


def test_extension_is_built_and_auto_picks_it_on_the_cpu(monkeypatch):
    """CI must not silently fall back to the torch backend: the extension has to be importable,
    and ks.filter / ks.smooth / ks.loglik on the CPU must actually run it."""
    import kalmanscan as ks

    assert native.available(), "kalmanscan.core._native is not built (setup.py ext_modules)"
    assert backends.resolve("auto", torch.device("cpu")) == "native"
    calls = []
    for name in ("filter_lanes", "smooth_lanes"):
        real = getattr(native, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(native, name, spy)
    z = np.array([1.0, np.nan, 0.5, 2.0])
    ks.filter(z, 1.0, 0.9, 0.1)
    ks.smooth(z, 1.0, 0.9, 0.1)
    ks.loglik(z, 1.0, 0.9, 0.1)
    assert calls == ["filter_lanes", "smooth_lanes", "filter_lanes"]


# 1031 lanes: more than one 1024-lane tile and several tiles per thread.
SHAPES = [(1, 1), (1, 7), (63, 5), (63, 1031), (1000, 3), (1000, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("T,N", SHAPES, ids=[f"T{t}-N{n}" for t, n in SHAPES])
@pytest.mark.parametrize("diffuse", [True, False], ids=["diffuse", "prior"])
def test_filter_and_smoother_match_the_sequential_reference(rng, T, N, dtype, diffuse):
    """Time-varying parameters, 20 % missing, c != 0: every output of filter_lanes and
    smooth_lanes (outputs start as NaN: conftest poisons the kernel's buffers)."""
    z, model, prior = random_model(rng, T, N, diffuse=diffuse)
    if dtype == torch.float32:  # well conditioned float32 models, as in test_core_filter
        model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    params, x0 = _inputs(z, model, prior, dtype)
    res = native.smooth_lanes(*params, x0)
    ref = sequential.smooth_lanes(*params, x0)
    assert res["mean"].dtype == dtype
    _assert_same(res, ref, dtype, FILTER + ("loglik",) + native.SMOOTH_KEYS)
    filt = native.filter_lanes(*params, x0)
    assert set(filt) == set(FILTER) | {"loglik", "final", "flags"}
    for k in FILTER + ("loglik",):
        assert torch.equal(filt[k].nan_to_num(7.0), res[k].nan_to_num(7.0)), k


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_loglik_only_writes_no_time_by_lane_array(monkeypatch, rng, dtype):
    """outputs="loglik": the keys loglik, final, flags only, equal bit for bit to those of
    outputs="all", and no [T, N] buffer allocated."""
    T, N = 63, 40
    z, model, prior = random_model(rng, T, N)
    params, x0 = _inputs(z, model, prior, dtype)
    full = native.filter_lanes(*params, x0)
    shapes = []
    real = native._empty
    monkeypatch.setattr(native, "_empty", lambda s, d: shapes.append(tuple(s)) or real(s, d))
    out = native.filter_lanes(*params, x0, outputs="loglik")
    assert set(out) == {"loglik", "final", "flags"}
    assert all(s == (N,) for s in shapes), shapes
    assert torch.equal(out["loglik"], full["loglik"])
    for a, b in zip(out["final"], full["final"], strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="outputs: expected one of"):
        native.filter_lanes(*params, x0, outputs="mean")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_special_steps_forgetting_unobserved_zero_loading(rng, dtype):
    """a = 0 (total forgetting), NaN z with obs_var = inf there, h = 0 while diffuse (the step
    still counts in the log-likelihood), a lane that never sees data."""
    T, N = 40, 9
    z, model, prior = random_model(rng, T, N, diffuse=True, missing=0.1)
    model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    model["decay"][[3, 17, 30]] = 0.0
    model["process_var"][[3, 17, 30]] += 0.2
    z[[5, 6, 22], 1:4] = np.nan
    model["obs_var"][[5, 6, 22], 1:4] = np.inf
    model["loading"][:4, 2] = 0.0
    z[:, 8] = np.nan  # lane 8 never observed: mean NaN, var inf until a = 0 resets it
    params, x0 = _inputs(z, model, prior, dtype)
    res = native.smooth_lanes(*params, x0)
    assert torch.isnan(res["mean"][:3, 8]).all() and torch.isinf(res["var"][:3, 8]).all()
    assert torch.isfinite(res["var"][3:, 8]).all()  # after the forgetting step the prior is 1/p
    ref = sequential.smooth_lanes(*params, x0)
    _assert_same(res, ref, dtype, FILTER + ("loglik",) + native.SMOOTH_KEYS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_broadcast_compact_and_strided_inputs(rng, dtype):
    """Parameters as expanded views and as compact [T, 1], [1, N], [1, 1] tensors (read in
    place), z a lane-strided slice with time on its second axis, x0 entries of shape [1]."""
    T, N = 63, 11
    big = torch.as_tensor(rng.normal(size=(2 * N, T))).to(dtype)
    z = big[::2].T  # [T, N] view: time stride 1, lane stride 2T
    g = lambda *s: torch.as_tensor(rng.uniform(0.2, 0.9, s)).to(dtype)  # noqa: E731
    compact = (g(T, 1), g(1, N), g(T, N), g(1, 1) + 0.5, g(T, 1) - 0.5)
    x0 = (torch.ones(1, dtype=dtype), torch.tensor([0.3], dtype=dtype), g(N))
    ref = sequential.smooth_lanes(
        z.contiguous(),
        *(x.expand(T, N).contiguous() for x in compact),
        tuple(x.expand(N) for x in x0),
    )
    for params in (compact, tuple(x.expand(T, N) for x in compact)):
        res = native.smooth_lanes(z, *params, x0)
        _assert_same(res, ref, dtype, FILTER + ("loglik",) + native.SMOOTH_KEYS)


def test_bad_arguments_are_named():
    z = torch.zeros(5, 3, dtype=torch.float64)
    one = torch.ones(5, 3, dtype=torch.float64)
    x0 = (torch.zeros(3, dtype=torch.float64),) * 2 + (torch.ones(3, dtype=torch.float64),)
    with pytest.raises(TypeError, match=r"obs_var: expected a torch.float64 CPU tensor"):
        native.filter_lanes(z, one.float(), one, one, one, one, x0)
    with pytest.raises(
        ValueError, match=r"decay: expected shape \[T, N\] = \[5, 3\].*got \[4, 3\]"
    ):
        native.filter_lanes(z, one, one[:4], one, one, one, x0)
    with pytest.raises(ValueError, match=r"x0 \(v0\): expected shape \[3\] or \[1\], got \[2\]"):
        native.filter_lanes(z, one, one, one, one, one, x0[:2] + (x0[2][:2],))


@pytest.mark.parametrize("N", [17, 1031, 5000])
def test_threads_give_bit_identical_results(rng, N):
    """A lane's arithmetic does not depend on which lanes share its tile or thread (a step whose
    fast form leaves the normal range is redone exactly for that lane alone), so any thread
    count gives the single-thread result bit for bit."""
    T = 64 if N > 100 else 4000
    z, model, prior = random_model(rng, T, N, diffuse=True)
    params, x0 = _inputs(z, model, prior, torch.float64)
    one = native._run(params[0], params[1:], x0, smooth=True, threads=1)
    for threads in (2, 3, 8):
        many = native._run(params[0], params[1:], x0, smooth=True, threads=threads)
        for k in FILTER + ("loglik",) + native.SMOOTH_KEYS:
            assert torch.equal(many[k].nan_to_num(7.0), one[k].nan_to_num(7.0)), (threads, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_lane_by_lane_form_equals_the_vectorized_tile(rng, dtype):
    """Fewer than 8 lanes run lane by lane (time inner); the same lanes inside a wide tile give
    the same bits (same per-element arithmetic and the same compiled target)."""
    T, N = 300, 200
    z, model, prior = random_model(rng, T, N, diffuse=False)
    model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    params, x0 = _inputs(z, model, prior, dtype)
    wide = native.smooth_lanes(*params, x0)
    few = native.smooth_lanes(*(x[:, 3:8] for x in params), tuple(x[3:8] for x in x0))
    for k in FILTER + ("loglik",) + native.SMOOTH_KEYS:
        a, b = few[k], wide[k][..., 3:8]
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), k


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_no_process_noise_contracting_state_over_long_records(dtype):
    """process_var = 0, |decay| < 1: the precision grows like decay**(-2t) past every float; it
    is inf (variance 0) there, not an error, and the mean is the value the deterministic dynamics
    give, as the sequential reference says (float64: decay 0.5 leaves the range at about 512
    steps, 600 steps checked), and over 10^4 and 10^5 steps of decay 0.9577 (the kernel alone;
    the sequential reference takes about 0.5 ms a step)."""
    for T, decay in ((600, 0.5), (10_000, 0.9577), (100_000, 0.9577)):
        N = 2
        g = torch.Generator().manual_seed(T)
        z = (0.4 / (1 - decay) + torch.randn(T, N, generator=g, dtype=torch.float64)).to(dtype)
        s = lambda v: torch.full((1, 1), v, dtype=dtype)  # noqa: E731
        x0 = (torch.zeros(N, dtype=dtype), torch.zeros(N, dtype=dtype), torch.ones(N, dtype=dtype))
        params = (z, s(1.0), s(decay), s(0.0), s(1.0), s(0.4))
        res = native.smooth_lanes(*params, x0)
        assert res["flags"] == 0
        # the variance ~ decay**(2t) is below the smallest float: 0 or a few subnormal ulps
        tiny = torch.finfo(dtype).tiny
        assert (res["var"][-10:] < tiny).all() and torch.isinf(res["precision"][-10:]).all()
        assert (res["smooth_var"][:10] >= 0).all() and torch.isfinite(res["smooth_mean"]).all()
        assert torch.isfinite(res["loglik"]).all()
        if dtype == torch.float64 and T == 600:
            ref = sequential.smooth_lanes(*params, x0)
            for k in ("mean", "var", "precision", "smooth_mean", "smooth_var", "loglik"):
                assert_close(res[k], ref[k], "parallel", dtype, what=k)


def test_extreme_scales_in_float64():
    """obs_var 1e-300 (the state is the observation, variance obs_var / h^2) and process_var
    1e300 (each step nearly forgets: the filtered mean is z / h, the variance obs_var / h^2)."""
    T, N = 30, 3
    z = torch.randn(T, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s = lambda v: torch.full((1, 1), v, dtype=torch.float64)  # noqa: E731
    x0 = (torch.zeros(N, dtype=torch.float64),) * 2 + (torch.ones(N, dtype=torch.float64),)
    res = native.smooth_lanes(z, s(1e-300), s(0.9), s(0.5), s(2.0), s(0.1), x0)
    assert res["flags"] == 0
    assert_close(res["mean"], z / 2, "parallel", torch.float64, what="mean, R = 1e-300")
    assert_close(res["var"], torch.full_like(z, 0.25e-300), "parallel", torch.float64, what="var")
    assert_close(res["smooth_mean"], z / 2, "parallel", torch.float64, what="smooth_mean")
    assert torch.isfinite(res["loglik"]).all()
    res = native.smooth_lanes(z, s(1.0), s(0.9), s(1e300), s(2.0), s(0.1), x0)
    assert res["flags"] == 0
    assert_close(res["mean"], z / 2, "parallel", torch.float64, what="mean, p = 1e300")
    assert_close(res["var"], torch.full_like(z, 0.25), "parallel", torch.float64, what="var")
    assert_close(
        res["pred_precision"][1:],
        torch.full((T - 1, N), 1e-300, dtype=torch.float64),
        "parallel",
        torch.float64,
        what="pred_precision",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_deterministic_reset(dtype):
    """decay = process_var = 0 at a step: the state is known exactly at the offset there
    (predicted variance 0, precision inf), whatever came before, diffuse included."""
    T, N = 12, 4
    z = torch.randn(T, N, generator=torch.Generator().manual_seed(2), dtype=dtype)
    a = torch.full((T, 1), 0.8, dtype=dtype)
    p = torch.full((T, 1), 0.3, dtype=dtype)
    a[[0, 6]] = 0.0
    p[[0, 6]] = 0.0
    c = torch.full((T, 1), -1.5, dtype=dtype)
    one = torch.ones(1, 1, dtype=dtype)
    x0 = (torch.zeros(N, dtype=dtype),) * 2 + (torch.ones(N, dtype=dtype),)
    res = native.smooth_lanes(z, one, a, p, one, c, x0)
    for t in (0, 6):
        assert (res["pred_var"][t] == 0).all() and torch.isinf(res["pred_precision"][t]).all()
        for k in ("pred_mean", "mean", "smooth_mean"):
            assert_close(res[k][t], torch.full((N,), -1.5, dtype=dtype), "parallel", dtype, what=k)
        assert (res["var"][t] == 0).all() and (res["smooth_var"][t] == 0).all()
    ref = sequential.smooth_lanes(
        z, one.expand(T, N), a.expand(T, N), p.expand(T, N), one.expand(T, N), c.expand(T, N), x0
    )
    _assert_same(res, ref, dtype, FILTER + ("loglik",) + native.SMOOTH_KEYS)


@pytest.mark.parametrize("lanes", [1, 9], ids=["lane-by-lane", "vectorized"])
def test_values_outside_the_normal_range_match_the_reference(lanes):
    """Steps where a reciprocal of the fast form leaves the normal float64 range are redone with
    divisions: decay**2 subnormal with a diffuse state, a variance growing past 1e308 (decay 30),
    in a vectorized tile next to ordinary lanes."""
    col = torch.tensor([math.nan, 1.0, 2.0, math.nan, math.nan, math.nan, math.nan, 0.5])
    z = col[:, None].double().repeat(1, lanes)
    T = z.shape[0]
    s = lambda v: torch.full((1, 1), v, dtype=torch.float64)  # noqa: E731
    x0 = (
        torch.full((lanes,), 1e-307, dtype=torch.float64),
        torch.zeros(lanes, dtype=torch.float64),
        torch.ones(lanes, dtype=torch.float64),
    )
    for extreme in (1e-160, 30.0):
        decay = torch.full((1, lanes), 0.9, dtype=torch.float64)
        decay[0, 0] = extreme
        params = (z, s(1e300), decay, s(1.0), s(1.0), s(0.0))
        res = native.filter_lanes(*params, x0)
        ref = sequential.filter_lanes(*(x.expand(T, lanes) for x in params), x0)
        _assert_same(res, ref, torch.float64, FILTER + ("loglik",))


def test_infinite_z_is_flagged_and_the_api_raises():
    z = torch.zeros(50, 3, dtype=torch.float64)
    z[17, 2] = -math.inf
    one = torch.ones(1, 1, dtype=torch.float64)
    x0 = (torch.zeros(3, dtype=torch.float64),) * 2 + (torch.ones(3, dtype=torch.float64),)
    for outputs in ("all", "loglik"):
        out = native.filter_lanes(z, one, one * 0.9, one * 0.1, one, one * 0, x0, outputs=outputs)
        assert out["flags"] & native.Z_INF
    with pytest.raises(ValueError, match="z:"):
        ks.filter(z.numpy(), 1.0, 0.9, 0.1, backend="native")


@pytest.mark.parametrize("shape", [(5, 0), (5, 0, 3)], ids=["N0", "N0x3"])
def test_zero_lanes(shape):
    res = ks.smooth(np.zeros(shape), 1.0, 0.9, 0.1, backend="native")
    assert res.mean.shape == shape and res.filtered.loglik.shape == shape[1:]


def test_nile_loglik_exact_diffuse():
    flow = np.loadtxt(
        ks.__file__.replace("__init__.py", "data/nile.csv"), delimiter=",", comments="#", skiprows=4
    )[:, 1]
    res = ks.filter(flow, 15099.0, 1.0, 1469.1, backend="native")
    assert_close(res.loglik, -632.5456, "published", "float64", what="Nile loglik")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("kind", ["filter", "smooth"])
def test_gradients_of_every_output_equal_the_torch_backend(dtype, kind):
    """outputs="all" and the smoother: the backward is the torch backend's vector-Jacobian
    product at the same inputs, compact and expanded inputs alike."""
    T, N = 40, 3
    g = torch.Generator().manual_seed(5)
    z = torch.randn(T, N, generator=g, dtype=dtype)
    z[7, 1] = math.nan
    grads = {}
    for name, mod in (("native", native), ("torch", parallel)):
        leaves = dict(
            z=z.clone().requires_grad_(True),
            obs_var=torch.tensor([[0.5, 1.0, 2.0]], dtype=dtype, requires_grad=True),
            decay=torch.tensor([[0.9]], dtype=dtype, requires_grad=True),
            process_var=torch.full((T, 1), 0.1, dtype=dtype, requires_grad=True),
            loading=torch.ones(T, N, dtype=dtype, requires_grad=True),
            offset=torch.tensor([[0.3]], dtype=dtype, requires_grad=True),
        )
        u0 = torch.full((N,), 0.25, dtype=dtype, requires_grad=True)
        x0 = (u0, torch.zeros(N, dtype=dtype), torch.ones(N, dtype=dtype))
        args = [leaves["z"]] + [leaves[k].expand(T, N) for k in native.INPUTS[1:]]
        fn = mod.smooth_lanes if kind == "smooth" else mod.filter_lanes
        r = fn(*args, x0)
        loss = r["loglik"].sum() + (r["mean"] * r["var"]).sum() + r["pred_mean"][1:].sum()
        loss = loss + r["final"][1].sum()
        if kind == "smooth":
            loss = loss + (r["smooth_mean"] * r["smooth_var"]).sum()
        grads[name] = torch.autograd.grad(loss, list(leaves.values()) + [u0])
    for name, a, b in zip(native.INPUTS + ("u0",), *grads.values(), strict=True):
        assert a.shape == b.shape
        assert_close(a, b, "parallel", dtype, what=f"grad {name}")


def test_second_derivatives_through_the_api_equal_the_torch_backend():
    """Hessians by autograd (double backward) through the native path: its loglik backward then
    takes the torch backend's differentiable vector-Jacobian product."""
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


def test_native_on_cuda_tensors_is_refused_naming_alternatives():
    with pytest.raises(ValueError, match="'native' runs on CPU tensors.*'triton'.*'torch'"):
        backends.resolve("native", torch.device("cuda"))


def test_fallback_without_the_extension(monkeypatch, rng):
    """An install without a C compiler: auto uses torch, explicit 'native' says what to use."""
    z, model, prior = random_model(rng, 50, 3)
    kw = {**model, **prior}
    with_ext = ks.filter(z, **kw)
    monkeypatch.setattr(native, "_ext", None)
    assert not native.available()
    assert backends.resolve("auto", torch.device("cpu")) == "torch"
    without = ks.filter(z, **kw)
    for field in ("mean", "var", "loglik"):
        assert_close(getattr(without, field), getattr(with_ext, field), "parallel", "float64")
    with pytest.raises(ValueError, match="'native' needs the compiled extension.*'torch'"):
        ks.filter(z, **kw, backend="native")


def test_output_pool_reuses_a_block_only_when_no_tensor_refers_to_it():
    """Outputs of 64 kB or more come from kept blocks (no page faults on reuse); a block is handed
    out again only after every tensor, numpy array and view of it is gone."""
    n = (1 << 20) + 16  # a size no other test allocates
    first = native._pooled(n)
    addr = first.ctypes.data
    t = torch.from_numpy(first.view(np.float64).reshape(2, -1))
    view = t[1, 3:9]
    np_view = first[5:100]
    del t, first
    assert native._pooled(n).ctypes.data != addr  # `view` and `np_view` still refer to it
    del view
    assert native._pooled(n).ctypes.data != addr  # `np_view` still does
    del np_view
    assert native._pooled(n).ctypes.data == addr  # now free: reused
    small = sum(len(v) * k for k, v in native._POOL.items() if k < native._LAZY_MIN)
    assert small <= native._POOL_SMALL_MAX


def test_large_free_blocks_are_released_to_the_system_lazily(monkeypatch):
    """A free block of _LAZY_MIN bytes or more is handed to madvise(MADV_FREE) (the operating
    system may reclaim it) and reused; a small one is kept as it is; a filter's outputs written
    into a reused block are the same values."""
    calls = []
    real = native._ext

    class Ext:
        filter = staticmethod(real.filter)

        @staticmethod
        def release(address, nbytes):
            calls.append((address, nbytes))
            return real.release(address, nbytes)

    monkeypatch.setattr(native, "_ext", Ext)
    big, small = native._LAZY_MIN + 8 * 3, (1 << 17) + 8 * 5
    a, b = native._pooled(big), native._pooled(small)
    addr_a, addr_b = a.ctypes.data, b.ctypes.data
    del a, b
    assert calls == [(addr_a, big)]
    assert native._pooled(big).ctypes.data == addr_a
    assert native._pooled(small).ctypes.data == addr_b
    z = np.random.default_rng(3).normal(size=(2000, 300))
    first = ks.filter(z, 1.0, 0.9, 0.1).mean.copy()
    for _ in range(2):  # the second call writes into the first call's released blocks
        assert np.array_equal(ks.filter(z, 1.0, 0.9, 0.1).mean, first)


VALID = dict(obs_var=1.0, decay=0.9, process_var=0.1, loading=1.0, offset=0.0)


def _flags_with(dtype, T, N, name, value):
    """Flags of a loglik call with one element of `name` (at time 7, lane 2) set to `value`."""
    z = torch.randn(T, N, dtype=dtype)
    x0 = (torch.zeros(N, dtype=dtype),) * 2 + (torch.ones(N, dtype=dtype),)
    args = {k: torch.full((T, N), v, dtype=dtype) for k, v in VALID.items()}
    args[name][7, 2] = value
    return native.filter_lanes(z, *args.values(), x0, outputs="loglik")["flags"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_input_ranges_are_checked_in_the_pass(dtype):
    """Flag BAD_INPUT for each range filter._validate checks, in the lane-by-lane form (3 lanes)
    and the vectorized tile (40); none for valid extremes (obs_var = inf, tiny obs_var, decay 0)."""
    big, tiny = torch.finfo(dtype).max, torch.finfo(dtype).tiny
    bad = [("obs_var", 0.0), ("obs_var", -1.0), ("obs_var", math.nan), ("obs_var", tiny / 2**20),
           ("decay", math.inf), ("decay", math.nan), ("process_var", -0.1),
           ("process_var", math.inf), ("loading", math.nan), ("offset", -math.inf),
           ("loading", math.sqrt(big) * 4)]  # fmt: skip
    good = [("obs_var", math.inf), ("obs_var", tiny * 1e3), ("decay", 0.0), ("process_var", 0.0),
            ("loading", 0.0)]  # fmt: skip
    for N in (3, 40):
        for name, value in bad:
            assert _flags_with(dtype, 20, N, name, value) & native.BAD_INPUT, (N, name, value)
        for name, value in good:
            assert not _flags_with(dtype, 20, N, name, value) & native.BAD_INPUT, (N, name, value)
        z = torch.randn(20, N, dtype=dtype)
        one = torch.ones(1, 1, dtype=dtype)
        for bad0 in [(0.0, 0.0, 0.0), (0.0, 1.0, 1.0), (-1.0, 0.0, 1.0), (1.0, math.nan, 1.0)]:
            x = tuple(torch.full((N,), v, dtype=dtype) for v in bad0)
            out = native.filter_lanes(z, one, one * 0.9, one * 0.1, one, one * 0, x)
            assert out["flags"] & native.BAD_INPUT, (N, bad0)


def test_infinite_obs_var_is_not_observed_in_values_and_gradients():
    """obs_var = inf with a finite z: the step is not observed (the API leaves z as it is), in
    the kernel's values, the adjoint and the torch vector-Jacobian product of the other outputs."""
    T, N = 30, 4
    g = torch.Generator().manual_seed(4)
    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    obs = torch.full((T, N), 0.7, dtype=torch.float64)
    obs[[3, 11, 12], 1] = math.inf
    z_nan = z.clone()
    z_nan[[3, 11, 12], 1] = math.nan
    one = torch.ones(1, 1, dtype=torch.float64)
    x0 = (torch.zeros(N, dtype=torch.float64),) * 2 + (torch.ones(N, dtype=torch.float64),)
    grads = []
    for zz in (z, z_nan):
        leaves = [zz.clone().requires_grad_(True), (one * 0.9).requires_grad_(True)]
        for outputs in ("loglik", "all"):
            r = native.filter_lanes(leaves[0], obs, leaves[1], one * 0.2, one, one * 0.1, x0,
                                    outputs=outputs)  # fmt: skip
            loss = r["loglik"].sum() + (r["mean"].nan_to_num().sum() if outputs == "all" else 0)
            grads.append([x.nan_to_num() for x in torch.autograd.grad(loss, leaves)])
    for a, b in zip(grads[:2], grads[2:], strict=True):
        for x, y in zip(a, b, strict=True):
            assert_close(x, y, "parallel", torch.float64, what="gradient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("N", [1, 63, 1000], ids=lambda n: f"N{n}")
def test_final_state_is_normalized_exactly(rng, dtype, N):
    """The recursion keeps max(u, v) in [1, 2) by powers of two; the final triple the contract
    returns has max(u, v) = 1 exactly, and continuing from it equals one longer call."""
    T = 257
    z = torch.from_numpy(rng.normal(size=(2 * T, N))).to(dtype)
    s = lambda v: torch.full((1, 1), v, dtype=dtype)  # noqa: E731
    x0 = (torch.zeros(N, dtype=dtype), torch.zeros(N, dtype=dtype), torch.ones(N, dtype=dtype))
    p = (s(0.5), s(0.97), s(0.2), s(1.3), s(0.1))
    ex = lambda x: tuple(t.expand(x.shape[0], N) for t in p)  # noqa: E731
    whole = native.filter_lanes(z, *ex(z), x0)
    first = native.filter_lanes(z[:T], *ex(z[:T]), x0)
    u, e, v = first["final"]
    assert torch.equal(torch.maximum(u, v), torch.ones(N, dtype=dtype))
    rest = native.filter_lanes(z[T:], *ex(z[T:]), (u, e, v))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(rest["mean"], whole["mean"][T:], **tol)
    torch.testing.assert_close(rest["var"], whole["var"][T:], **tol)
