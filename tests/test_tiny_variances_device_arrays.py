"""Tiny variances given as arrays off the host (a GPU): judged with the call's one read of flags.

``_tiny_lanes`` (kalmanscan/core/filter_units.py) carries lanes whose products of two variances
leave the range in smaller units. Plain numbers and CPU arrays are judged before the backend
runs; arrays on a GPU were not judged at all (a readback a call), so ``obs_var = process_var =
1e-200`` arrays on data of scale 1e-100 gave variance 0 and wrong means there. Now a device
screen (three extremes reduced on the device, read with the flags) sets the API's flag bit
``_MAYBE_TINY``; the API then judges the arrays on the host and runs the call again in units.

Without a GPU, the device path is forced on CPU tensors by patching
``filter_units._judged_on_host``. Truth: the CPU path (exact against mpmath:
tests/test_tiny_variances.py), and mpmath itself for a few cases.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import backends, filter_units, native, sequential
from kalmanscan.core import filter as core_filter
from kalmanscan.validation.oracle import scalar_loglik_grad, scalar_oracle

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
API_BACKENDS = BACKENDS + (["triton"] if HAS_TRITON else [])
# steps of every model: the triton backend walks each in the interpreter (one lane program over
# all of them, as at 12 steps); a missing step (4) and a tiny loading at the last (7)
T = 8


def _walk(seed=0, n=T):
    rng = np.random.default_rng(seed)
    z = np.cumsum(rng.normal(size=n)) + 3.0
    z[4] = np.nan
    return z


class _Spy:
    """Forces the device path (or not) and records each run's options and each flags word."""

    def __init__(self, monkeypatch, device: bool):
        self.runs, self.flags = [], []
        if device:
            monkeypatch.setattr(filter_units, "_judged_on_host", lambda z: False)
        real_run, real_read = core_filter._run, core_filter._read_flags

        def run(prep, kind="filter", rescale=False, host=False):
            self.runs.append(dict(kind=kind, rescale=rescale, host=host))
            return real_run(prep, kind, rescale, host)

        def read(out):
            f = real_read(out)
            self.flags.append(f)
            return f

        monkeypatch.setattr(core_filter, "_run", run)
        monkeypatch.setattr(core_filter, "_read_flags", read)


def _calls(z, kw, backend, grad=True):
    """filter, smooth, loglik and (``grad``) the log-likelihood's gradient in the tensors of
    ``kw`` that are float, as numpy arrays."""
    out = {}
    f = ks.filter(z, **kw, backend=backend)
    out.update(mean=f.mean, var=f.var, precision=f.precision, info=f.info, ll=f.loglik,
               pred_mean=f.pred_mean, pred_var=f.pred_var)  # fmt: skip
    s = ks.smooth(z, **kw, backend=backend)
    out.update(smean=s.mean, svar=s.var, sll=s.filtered.loglik)
    leaves = {k: v.detach().clone().requires_grad_(grad) for k, v in kw.items()
              if isinstance(v, torch.Tensor)}  # fmt: skip
    ll = ks.loglik(z, **{**kw, **leaves}, backend=backend)
    out["loglik"] = ll
    if grad and leaves:
        ll.sum().backward()
        out.update({f"grad_{k}": v.grad for k, v in leaves.items()})
    return {k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v)
            for k, v in out.items()}  # fmt: skip


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# every variance tiny, as arrays: (name, dtype, builder of (z, kw) as CPU tensors)
def _model(name):
    f64 = torch.float64
    if name == "1e-200":  # obs_var = process_var ~ 1e-200 on data of scale 1e-100
        s = 1e-100
        z = torch.tensor(_walk() * s)
        kw = dict(
            obs_var=torch.full((T,), 0.7 * s * s, dtype=f64),
            decay=0.9,
            process_var=torch.full((T,), 0.3 * s * s, dtype=f64),
            offset=0.1 * s,
        )
    elif name == "1e-150":  # variances ~1e-150 (products 1e-300), a proper prior
        s = 1e-75
        z = torch.tensor(_walk(1) * s)
        kw = dict(
            obs_var=torch.tensor(0.7 * s * s, dtype=f64),
            decay=0.9,
            process_var=torch.tensor(0.3 * s * s, dtype=f64),
            prior_mean=2.0 * s,
            prior_var=4.0 * s * s,
        )
    elif name == "per-step":  # per-step and per-lane arrays, lanes of three scales
        scales = np.array([1.0, 1e-90, 1e-140])
        z = torch.tensor(np.stack([_walk(j) for j in range(3)], 1) * scales)
        kw = dict(
            obs_var=torch.tensor(np.linspace(0.5, 1.5, T)[:, None] * scales**2),
            decay=1.0,
            process_var=torch.tensor(0.2 * scales**2),
            loading=0.5,
        )
    elif name == "loading-array":  # the loading an array too (per step)
        s = 1e-100
        z = torch.tensor(_walk(2) * s)
        kw = dict(
            obs_var=0.7 * s * s,
            decay=0.9,
            process_var=torch.full((T,), 0.3 * s * s, dtype=f64),
            loading=torch.tensor(np.linspace(0.5, 2.0, T)),
        )
    elif name == "f32-1e-20":  # float32: variances ~1e-20 (products 1e-40)
        s = 1e-10
        z = torch.tensor(_walk(3) * s, dtype=torch.float32)
        kw = dict(
            obs_var=torch.full((T,), 0.7 * s * s, dtype=torch.float32),
            decay=1.0,
            process_var=torch.full((1,), 0.3 * s * s, dtype=torch.float32),
        )
    else:
        raise ValueError(name)
    return z, kw  # fmt: skip


TINY = ["1e-200", "1e-150", "per-step", "loading-array", "f32-1e-20"]


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("name", TINY)
def test_tiny_arrays_off_the_host_equal_the_host_path(name, backend, monkeypatch, triton_on_cpu):
    """Forced through the device path, every output (and the log-likelihood's gradient) is the
    CPU path's, bit for bit: the screen flagged the call and it ran again in units."""
    z, kw = _model(name)
    want = _calls(z, kw, backend)
    spy = _Spy(monkeypatch, device=True)
    got = _calls(z, kw, backend)
    _same(got, want)
    assert all(f & core_filter._MAYBE_TINY for f in spy.flags[::2]), spy.flags
    assert [r["host"] for r in spy.runs] == [False, True] * 3, spy.runs


@functools.cache
def _mpmath_reference():
    """The data, parameters, mpmath moments and log-likelihood gradient of
    :func:`test_tiny_arrays_off_the_host_match_mpmath`: the same for every backend, computed
    once (read only)."""
    s = 1e-100
    zn = _walk() * s
    zn.flags.writeable = False
    vals = dict(obs_var=0.7 * s * s, decay=0.9, process_var=0.3 * s * s, offset=0.1 * s)
    ref = scalar_oracle(zn, vals["obs_var"], vals["decay"], vals["process_var"],
                        offset=vals["offset"])  # fmt: skip
    return zn, vals, ref, scalar_loglik_grad(zn, **vals)


@pytest.mark.parametrize("backend", API_BACKENDS)
def test_tiny_arrays_off_the_host_match_mpmath(backend, monkeypatch, triton_on_cpu):
    """The device path against mpmath (scale 1e-100, variances 1e-200, gradient included)."""
    _Spy(monkeypatch, device=True)
    zn, vals, ref, want = _mpmath_reference()
    t = {k: torch.full((T,), v, dtype=torch.float64) for k, v in vals.items()}
    sm = ks.smooth(torch.tensor(zn), **t, backend=backend)
    f = sm.filtered
    sd = np.sqrt(ref.var)
    assert np.max(np.abs(f.mean.numpy() - ref.mean) / sd) < 1e-12
    assert np.max(np.abs(f.var.numpy() / ref.var - 1)) < 1e-12
    assert np.max(np.abs(sm.var.numpy() / ref.smooth_var - 1)) < 1e-11
    assert abs(float(f.loglik) / ref.loglik - 1) < 1e-12
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in vals.items()}
    ks.loglik(torch.tensor(zn), **t, backend=backend).backward()
    for k, v in t.items():
        assert float(v.grad) == pytest.approx(want[k], rel=1e-9), k


def _ordinary(dtype, seed=0):
    """Arrays of ordinary scale: per-step obs_var with unobserved steps (inf), per-lane
    process_var with a 0, a per-step loading."""
    rng = np.random.default_rng(seed)
    N = 3
    z = np.cumsum(rng.normal(size=(T, N)), 0)
    z[2, 1] = np.nan
    R = rng.uniform(0.05, 2.0, size=(T, N))
    R[5, 0] = np.inf
    kw = dict(obs_var=torch.tensor(R, dtype=dtype), decay=0.95,
              process_var=torch.tensor([0.0, 0.3, 1e-3], dtype=dtype),
              loading=torch.tensor(rng.uniform(0.5, 1.5, size=(T, 1)), dtype=dtype))  # fmt: skip
    return torch.tensor(z, dtype=dtype), kw


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_ordinary_arrays_are_not_flagged(dtype, backend, monkeypatch, triton_on_cpu):
    """Ordinary arrays off the host: the screen is read, the bit stays clear, each call runs
    once, and every output is the host path's bit for bit."""
    z, kw = _ordinary(dtype)
    want = _calls(z, kw, backend)
    spy = _Spy(monkeypatch, device=True)
    screens = []
    real = filter_units._device_screen
    monkeypatch.setattr(core_filter, "_device_screen",
                        lambda *a: screens.append(real(*a)) or screens[-1])  # fmt: skip
    got = _calls(z, kw, backend)
    _same(got, want)
    assert len(screens) == 3 and all(s is not None for s in screens)
    assert not any(f & core_filter._MAYBE_TINY for f in spy.flags), spy.flags
    assert [r["host"] for r in spy.runs] == [False] * 3


@pytest.mark.parametrize("backend", API_BACKENDS)
def test_a_call_flagged_in_vain_runs_once(backend, monkeypatch, triton_on_cpu):
    """Extremes at different lanes (a tiny obs_var in one, a huge loading in another) make the
    screen flag a call no lane of which is tiny: the host's test clears it and the call is not
    run again; every output is the host path's."""
    z = torch.tensor(np.stack([_walk(0), _walk(1) * 1e80], 1))
    f64 = torch.float64
    kw = dict(
        obs_var=torch.tensor([1e-150, 1.0], dtype=f64),
        decay=0.9,
        process_var=torch.ones(2, dtype=f64),
        loading=torch.tensor([1.0, 1e80], dtype=f64),
    )
    want = _calls(z, kw, backend)
    spy = _Spy(monkeypatch, device=True)
    got = _calls(z, kw, backend)
    _same(got, want)
    assert all(f & core_filter._MAYBE_TINY for f in spy.flags), spy.flags
    assert [r["host"] for r in spy.runs] == [False] * 3, spy.runs


@pytest.mark.parametrize("backend", API_BACKENDS)
def test_tiny_variances_and_a_tiny_loading(backend, monkeypatch, triton_on_cpu):
    """Tiny variances beside a loading whose square is below the range (its observation
    rescaled): the device path gives the host path's outputs; an invalid input still raises
    the error that names it."""
    s = 1e-100
    z = torch.tensor(_walk(4) * s)
    h = torch.ones(T, dtype=torch.float64)
    h[7] = 1e-160
    kw = dict(obs_var=torch.full((T,), 0.7 * s * s, dtype=torch.float64), decay=0.9,
              process_var=torch.full((T,), 0.3 * s * s, dtype=torch.float64), loading=h,
              prior_mean=0.0, prior_var=1e-199)  # fmt: skip
    want = _calls(z, kw, backend)
    spy = _Spy(monkeypatch, device=True)
    got = _calls(z, kw, backend)
    _same(got, want)
    assert spy.runs[-1]["host"] and spy.runs[-1]["rescale"], spy.runs
    bad = dict(kw, process_var=kw["process_var"].clone())
    bad["process_var"][3] = -1.0
    with pytest.raises(ValueError, match="process_var"):
        ks.filter(z, **bad, backend=backend)


def test_the_bit_is_no_backends():
    """Every backend's flags stay within 1 | 2 | 4 | 8 (docs/backend-contract.md)."""
    bits = {native.NOT_FINITE, native.Z_INF, native.BAD_INPUT, native.LL_LOST}
    bits |= {sequential.NOT_FINITE, sequential.Z_INF, sequential.LL_LOST}
    bits |= {core_filter._BAD_INPUT, core_filter._LL_LOST}
    assert bits == {1, 2, 4, 8}
    assert core_filter._MAYBE_TINY & (1 | 2 | 4 | 8) == 0


def _screen_and_grid(R, h, p, dtype):
    """(the device screen's answer, tiny_grid's) on CPU tensors of shape [T, N] or broadcast."""
    Tn, Nn = np.broadcast_shapes(R.shape, h.shape, p.shape)
    z = torch.zeros(Tn, Nn, dtype=dtype)
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    prep = core_filter._prepare(z, t(R), 1.0, t(p), t(h), 0.0, 0.0, math.inf, None, 0, "torch")
    ins = (prep.z, prep.obs_var, prep.decay, prep.process_var, prep.loading, prep.offset)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(filter_units, "_judged_on_host", lambda z: False)
        screen = filter_units._device_screen(prep, ins)
    flags, extremes = screen.read(torch.tensor(0, dtype=torch.int32))
    assert flags == 0
    Rc, hc, pc = (filter_units._np_compact(x) for x in (ins[1], ins[4], ins[3]))
    need = filter_units.tiny_grid(Rc, hc, pc, Tn, Nn, dtype)[0]
    return screen.maybe(extremes), bool(need.any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_the_screen_never_misses_a_lane(dtype):
    """Random grids around the threshold (log-uniform variances, loadings, process_var with
    zeros; shared or per-step and per-lane): wherever tiny_grid flags a lane the screen flags
    the call, and it flags few calls tiny_grid clears."""
    rng = np.random.default_rng(7)
    fi = torch.finfo(dtype)
    lo = math.log2(1 / fi.max) + 1
    half = filter_units._tiny_below(dtype) / 2  # variances near here decide
    counts = {"both": 0, "over": 0, "clear": 0}
    for trial in range(600):
        Tn, Nn = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        shapes = [(Tn, Nn), (1, Nn), (Tn, 1), (1, 1)]
        shape = lambda shapes=shapes: shapes[rng.integers(4)]  # noqa: E731
        spread = [2.0, 40.0, 400.0][trial % 3]
        R = 2.0 ** np.clip(rng.normal(half, spread, size=shape()), lo, 100)
        h = 2.0 ** rng.normal(0, spread / 8, size=shape()) * rng.choice([-1, 1], size=shape())
        p = 2.0 ** np.clip(rng.normal(half, spread, size=shape()), lo, 100)
        p[rng.random(p.shape) < 0.2] = 0.0
        R[rng.random(R.shape) < 0.1] = np.inf
        h[rng.random(h.shape) < 0.1] = 0.0
        screen, grid = _screen_and_grid(R, h, p, dtype)
        assert screen or not grid, (R, h, p)
        counts["both" if grid else ("over" if screen else "clear")] += 1
    assert counts["both"] > 100 and counts["clear"] > 100, counts
    assert counts["over"] < counts["both"], counts


# ATen ops that read a tensor's value back to the host (a wait for the device on a GPU)
SCALAR_READS = ("_local_scalar_dense", "nonzero", "equal")


def _count_reads(monkeypatch):
    """A counter of host reads of tensor values outside the Triton interpreter's launches:
    ``Tensor.item``/``tolist``/``numpy`` and the scalar reads under them."""
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    reads, inside = [0], [False]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0] and func.overloadpacket.__name__ in SCALAR_READS:
                reads[0] += 1
            return func(*args, **(kwargs or {}))

    for name in ("tolist", "numpy"):
        real = getattr(torch.Tensor, name)

        def read(t, *a, _real=real, **k):
            reads[0] += not inside[0]
            return _real(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, read)
    if HAS_TRITON:
        import kalmanscan.cuda.filter as cf

        real_launch = cf.launch_site

        def launch(*a, **k):
            inside[0] = True
            try:
                with _disable_current_modes():
                    return real_launch(*a, **k)
            finally:
                inside[0] = False

        monkeypatch.setattr(cf, "launch_site", launch)

    def count(fn):
        reads[0] = 0
        with Mode():
            fn()
        return reads[0]

    return count


@pytest.mark.parametrize("backend", API_BACKENDS)
def test_one_read_on_the_ordinary_path(backend, monkeypatch, triton_on_cpu):
    """The screen adds no read: filter, smooth and loglik through the device path read the
    host as often as with no screen at all; on triton (which checks its inputs) once: its
    flags, read with the screen's extremes."""
    z, kw = _ordinary(torch.float64)
    _Spy(monkeypatch, device=True)
    count = _count_reads(monkeypatch)
    real = filter_units._device_screen
    for fn in (ks.filter, ks.smooth, ks.loglik):
        call = lambda fn=fn: fn(z, **kw, backend=backend)  # noqa: E731
        call()  # (compiled, kept signatures)
        with_screen = count(call)
        monkeypatch.setattr(core_filter, "_device_screen", lambda *a: None)
        without = count(call)
        monkeypatch.setattr(core_filter, "_device_screen", real)
        # (native, a CPU backend, gives its flags as a Python int: the extremes are a read of
        # their own there, where no device is waited for)
        extra = backend == "native"
        assert with_screen == without + extra, (fn.__name__, with_screen, without)
        if backend == "triton":
            assert with_screen == 1, fn.__name__


# --- on a GPU: the real device path (skipped without CUDA) ---

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gpu_backends():
    return ["torch"] + (["triton"] if HAS_TRITON else [])


def _ran(monkeypatch):
    """The backends whose filter_lanes / smooth_lanes ran, by name."""
    names = []
    real = backends.get

    class Rec:
        def __init__(self, name, mod):
            self._name, self._mod = name, mod

        def __getattr__(self, attr):
            fn = getattr(self._mod, attr)
            if attr in ("filter_lanes", "smooth_lanes"):
                return lambda *a, **k: names.append(self._name) or fn(*a, **k)
            return fn

    def get(name, op="filter"):
        impl = real(name, op)
        return Rec(name, impl) if op == "filter" else impl

    monkeypatch.setattr(backends, "get", get)
    return names


def _close(got: dict, want: dict, tol: float):
    """Every output within ``tol`` of ``want``'s (relative, or of a thousandth of the array's
    largest value), NaN and inf where ``want`` has them; gradients within 100 ``tol``."""
    for k in want:
        a, b = got[k].astype(np.float64), want[k].astype(np.float64)
        fin = np.isfinite(b)
        np.testing.assert_array_equal(a[~fin], b[~fin], err_msg=k)
        a, b = a[fin], b[fin]
        if b.size:
            scale = np.maximum(np.abs(b), np.abs(b).max() * 1e-3)
            t = tol * (100 if k.startswith("grad") else 1)
            assert np.all(np.abs(a - b) <= t * scale), (k, np.max(np.abs(a - b) / scale))


@CUDA
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("name", TINY)
def test_on_cuda_equals_the_cpu(name, backend, monkeypatch):
    """Tiny variances as CUDA arrays: the named backend runs, flagged then in units, and the
    results are the CPU's (its exact host path) to the kernels' rounding."""
    z, kw = _model(name)
    cpu = _calls(z, kw, "torch")
    names = _ran(monkeypatch)
    spy = _Spy(monkeypatch, device=False)
    dev = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = _calls(z.cuda(), dev, backend)
    assert set(names) == {backend}, names
    assert [r["host"] for r in spy.runs] == [False, True] * 3, spy.runs
    _close(got, cpu, 1e-11 if z.dtype == torch.float64 else 1e-5)


@CUDA
@pytest.mark.parametrize("backend", _gpu_backends())
def test_on_cuda_plain_numbers(backend):
    """Tiny variances as plain numbers with CUDA data: judged on the host before the call (the
    unit's index tensors built on the data's device), the CPU's results."""
    s = 1e-100
    z = torch.tensor(_walk() * s)
    kw = dict(obs_var=0.7 * s * s, decay=0.9, process_var=0.3 * s * s, offset=0.1 * s)
    _close(_calls(z.cuda(), kw, backend), _calls(z, kw, "torch"), 1e-11)


@CUDA
@pytest.mark.parametrize("backend", _gpu_backends())
def test_on_cuda_one_synchronization(backend, monkeypatch):
    """Ordinary CUDA arrays: the bit clear, one run a call, and no wait for the device more
    than with no screen; one in all on triton (its flags: the screen's extremes come in pinned
    memory behind them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    z, kw = _ordinary(torch.float64)
    z, kw = z.cuda(), {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    spy = _Spy(monkeypatch, device=False)
    waits, inside = [0], [False]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            to_host = name == "_to_copy" and str((kwargs or {}).get("device", "")) == "cpu"
            if on_gpu and not inside[0] and (name in SCALAR_READS or to_host):
                waits[0] += 1
            return func(*args, **(kwargs or {}))

    real_sync = torch.cuda.Event.synchronize

    def sync(event):
        waits[0] += 1
        return real_sync(event)

    monkeypatch.setattr(torch.cuda.Event, "synchronize", sync)
    real_tolist = torch.Tensor.tolist

    def tolist(t):
        waits[0] += t.is_cuda
        inside[0] = True
        try:
            return real_tolist(t)
        finally:
            inside[0] = False

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)

    def count(call):
        waits[0] = 0
        with Mode():
            call()
        return waits[0]

    real = filter_units._device_screen
    for fn in (ks.filter, ks.smooth, ks.loglik):
        call = lambda fn=fn: fn(z, **kw, backend=backend)  # noqa: E731
        call()
        with_screen = count(call)
        monkeypatch.setattr(core_filter, "_device_screen", lambda *a: None)
        without = count(call)
        monkeypatch.setattr(core_filter, "_device_screen", real)
        assert with_screen == without, (fn.__name__, with_screen, without)
        if backend == "triton":
            assert with_screen == 1, fn.__name__
    assert not any(f & core_filter._MAYBE_TINY for f in spy.flags)
    assert all(not r["host"] for r in spy.runs)


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("bad", [-1.0, float("nan")], ids=["negative", "nan"])
def test_invalid_obs_var_array_off_the_host_is_named(bad, backend, monkeypatch, triton_on_cpu):
    """An invalid ``obs_var`` array judged off the host: the error names ``obs_var`` (a negative
    one reached the screen's logarithm: 'math domain error' on a GPU)."""
    z = torch.tensor(np.stack([_walk(0), _walk(1)], 1))
    R = torch.full((2,), 0.7, dtype=torch.float64)
    R[1] = bad
    _Spy(monkeypatch, device=True)
    for fn in (ks.filter, ks.loglik):
        with pytest.raises(ValueError, match="obs_var"):
            fn(z, R, 0.9, 0.1, backend=backend)
