"""The native CPU backend: fused, compiled passes over time (``kalmanscan/core/_native.c``).

The extension is built at install time when a C compiler is present (setup.py, optional). It
implements the backend contract of docs/backend-contract.md on CPU tensors:

    filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all") -> dict
    smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0) -> dict

``z, obs_var, decay, process_var, loading, offset``: ``[T, N]`` tensors of one dtype (float32 or
float64), each possibly an expanded view (stride 0) or a compact ``[1, N]``, ``[T, 1]`` or
``[1, 1]`` tensor, read in place, never materialized; ``x0 = (u0, e0, v0)``: three ``[N]`` tensors
(homogeneous coordinates). Beliefs are carried as normalized homogeneous triples, so a diffuse
state and a state known exactly are ordinary values and nothing overflows on a valid model; where
an update's product passes the range though the belief does not (``obs_var`` 1e300 times a mean
of 1e10), the kernel forms it in a power-of-two scaling, as ``steps.observe`` does.

Every call is one pass over time per tile of lanes, vectorized across lanes, with tiles handed out
to the calling thread and a persistent pool of worker threads (``torch.get_num_threads()`` in all,
fewer for small calls) with the GIL released. ``outputs="loglik"`` writes no ``[T, N]`` array.

Gradients: ``filter_lanes(..., outputs="loglik")["loglik"]`` is differentiable by the kernel's
adjoint (:func:`loglik_grad`: one reverse pass with checkpoints, gradients in each input's compact
shape, no other ``[T, N]`` array; in float64 the steps whose variance passes ``2**64`` or whose
values leave the range take a wide form, which holds such states as ``steps.normalize`` does:
``_native_adjoint.h``, "Extremes"). The other outputs, the smoother, gradients through ``final``
and second derivatives by autograd take the torch backend's vector-Jacobian product
(``kalmanscan.core.parallel``) at the same inputs. :func:`loglik_hessian` gives exact-gradient
Hessians for fitting's standard errors.
"""

from __future__ import annotations

import math
import os
import weakref

import numpy as np
import torch

try:
    from kalmanscan.core import _native as _ext
except ImportError:  # built without a C compiler: the torch backend serves the CPU
    _ext = None

# flags returned by the kernels (bits)
NOT_FINITE = 1  # a value that must be finite is not: data no float can hold
Z_INF = 2  # z holds +-inf: invalid input (the API raises naming it)
BAD_INPUT = 4  # another input is out of its range (the API finds and names it)
LL_LOST = 8  # a lane's log-likelihood is NaN by design: a predicted precision below the range

# What the API may leave to this backend (docs/backend-contract.md, module attributes): it reads
# every input through its strides (the initial triple included) and treats obs_var = inf as not
# observed. The filter also checks every input's range in its own pass (flag BAD_INPUT), the
# initial triple included (a NaN or inf prior mean reaches it through e0 = 0 * mean), so the API
# runs its own checks only when a flag is set.
CHECKS_INPUTS = True
READS_STRIDES = True
INF_OBS_VAR_UNOBSERVED = True

OUTPUTS = ("all", "loglik")
FILTER_KEYS = ("mean", "var", "precision", "info", "pred_mean", "pred_var", "pred_precision")
SMOOTH_KEYS = ("smooth_mean", "smooth_var")
INPUTS = ("z", "obs_var", "decay", "process_var", "loading", "offset")
# Below this many lane-steps per thread a call runs on fewer threads (waking a worker and handing
# it tiles costs a few microseconds; a lane-step about 5 ns).
_MIN_WORK_PER_THREAD = 1 << 15
# The adjoint's lane-steps cost about 4 filter lane-steps.
_ADJ_WORK = 4
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def available() -> bool:
    """Whether the compiled extension ``kalmanscan.core._native`` is importable."""
    return _ext is not None


# Output blocks of at least _POOL_MIN bytes are kept for reuse: a fresh block costs a page fault
# per page on first write (1-5 us a 4 kB page on a virtual machine), which on 1000 x 2000 (seven
# 16 MB outputs) took longer than the filter itself. A block returns to its free list when the last
# array or tensor viewing it is gone. Blocks of _LAZY_MIN bytes or more (numpy backs them with
# huge pages) are then handed to the operating system to reclaim lazily (MADV_FREE: the memory is
# the system's again under pressure, and until it is taken, writing it again costs no fault); of
# those, at most _POOL_MAX bytes are kept. Smaller blocks stay resident, at most _POOL_SMALL_MAX
# bytes (on them MADV_FREE cost more than it saved). ``_POOL.clear()`` drops the free blocks.
_POOL_MIN = 1 << 16
_LAZY_MIN = 4 << 20
_POOL_SMALL_MAX = 64 << 20
_POOL_MAX = 1 << 30
try:
    _POOL_MAX = min(_POOL_MAX, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8)
except (AttributeError, ValueError, OSError):  # no sysconf: keep the fixed bound
    pass
_POOL: dict[int, list] = {}  # nbytes -> free blocks (uint8 arrays that nothing views)
_LIVE: dict = {}  # id(weak ref to a handed-out array) -> (ref, block, address)


def _give_back(ref) -> None:
    """Weak-reference callback: the array over a block is gone, so the block is free."""
    _, block, address = _LIVE.pop(id(ref), (None,) * 3) if isinstance(_LIVE, dict) else (None,) * 3
    if block is None:  # at shutdown
        return
    n = block.nbytes
    lazy = n >= _LAZY_MIN
    kept = sum(len(v) * k for k, v in _POOL.items() if (k >= _LAZY_MIN) == lazy)
    if kept + n <= (_POOL_MAX if lazy else _POOL_SMALL_MAX):
        if lazy and _ext is not None:
            _ext.release(address, n)
        _POOL.setdefault(n, []).append(block)


def _pooled(nbytes: int, dtype=np.uint8, shape=None) -> np.ndarray:
    """A ``shape`` array of ``dtype`` (default: ``nbytes`` bytes) on a kept free block, or on a new
    one; the block returns to the pool once this array and every view of it are gone."""
    free = _POOL.get(nbytes)
    block = free.pop() if free else np.empty(nbytes, np.uint8)
    # through a memoryview, so that numpy's views of the result refer to `out`, not to `block`
    out = np.frombuffer(memoryview(block), dtype)
    ref = weakref.ref(out, _give_back)
    _LIVE[id(ref)] = (ref, block, block.__array_interface__["data"][0])
    return out if shape is None else out.reshape(shape)


def _empty(shape, dtype) -> torch.Tensor:
    """Output storage: a pooled block (above), or numpy's allocator for small outputs."""
    np_dtype = _NUMPY[dtype]
    nbytes = math.prod(shape) * np.dtype(np_dtype).itemsize
    if nbytes < _POOL_MIN:
        return torch.from_numpy(np.empty(shape, np_dtype))
    return torch.from_numpy(_pooled(nbytes, np_dtype, shape))


_NUM_THREADS = None  # None: torch.get_num_threads()


def set_num_threads(threads: int | None) -> None:
    """Threads of the native kernels (``None``: follow ``torch.get_num_threads()``, the default).

    The kernels hand tiles of lanes out dynamically and never wait for a worker that has not
    started, so on a loaded machine they keep their speed with several threads, where torch's
    intra-op threads (OpenMP, MKL) can make small element-wise operations take milliseconds:
    code that runs many small torch operations around the kernel (a fitting loop) can set
    ``torch.set_num_threads(1)`` and keep the kernel's threads with this
    (docs/performance-cpu.md, busy machines).

    >>> from kalmanscan.core import native
    >>> native.set_num_threads(2); native.set_num_threads(None)
    """
    global _NUM_THREADS
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
    _NUM_THREADS = threads


def _threads(work: int) -> int:
    most = torch.get_num_threads() if _NUM_THREADS is None else _NUM_THREADS
    return max(1, min(most, work // _MIN_WORK_PER_THREAD))


def _series(x: torch.Tensor):
    st, sn = x.stride()
    return (x.data_ptr(), st if x.shape[0] > 1 else 0, sn if x.shape[1] > 1 else 0)


def _lane(x: torch.Tensor):
    return (x.data_ptr(), x.stride(0) if x.shape[0] > 1 else 0)


def _check(z, params, x0):
    """Shapes, dtypes and devices of a call; returns ``(T, N, dtype, x0 as [N] views)``."""
    if not isinstance(z, torch.Tensor) or z.dim() != 2:
        got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise TypeError(f"z: expected a [T, N] tensor, got {got}")
    T, N = z.shape
    dtype = z.dtype
    if dtype not in _NUMPY or z.device.type != "cpu":
        raise TypeError(f"z: expected a float32/float64 CPU tensor, got {dtype} on {z.device}")
    for name, x in zip(INPUTS[1:], params, strict=True):
        if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.device.type != "cpu":
            got = f"{x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{name}: expected a {dtype} CPU tensor like z, got {got}")
        if x.dim() != 2 or x.shape[0] not in (1, T) or x.shape[1] not in (1, N):
            raise ValueError(
                f"{name}: expected shape [T, N] = [{T}, {N}] or broadcastable [1 or T, 1 or N], "
                f"got {list(x.shape)}"
            )
    if len(x0) != 3:
        raise TypeError(f"x0: expected three [N] tensors (u0, e0, v0), got {len(x0)} entries")
    lanes = []
    for name, x in zip(("u0", "e0", "v0"), x0, strict=True):
        if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.device.type != "cpu":
            got = f"{x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x0 ({name}): expected a {dtype} CPU tensor, got {got}")
        if x.dim() > 1 or (x.dim() == 1 and x.shape[0] not in (1, N)):
            raise ValueError(f"x0 ({name}): expected shape [{N}] or [1], got {list(x.shape)}")
        lanes.append(x.reshape(-1) if x.dim() == 1 else x.reshape(1))
    return T, N, dtype, lanes


def _run(z, params, x0, outputs="all", smooth=False, threads=None):
    """One kernel call (no autograd). Returns the contract's dict (``flags`` a python int)."""
    if _ext is None:
        raise RuntimeError("kalmanscan.core._native is not built; use the torch backend")
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs: expected one of {OUTPUTS}, got {outputs!r}")
    T, N, dtype, x0 = _check(z, params, x0)
    out = {}
    keys = FILTER_KEYS if outputs == "all" or smooth else ()
    for k in keys + (SMOOTH_KEYS if smooth else ()):
        out[k] = _empty((T, N), dtype)
    out["loglik"] = _empty((N,), dtype)
    final = tuple(_empty((N,), dtype) for _ in range(3))
    out["final"] = final
    if N == 0 or T == 0:
        if T == 0:  # no steps: the state is the (normalized) initial one
            with torch.no_grad():
                m = torch.maximum(x0[0], x0[2]).expand(N)
                for f, x in zip(final, x0, strict=True):
                    f.copy_(x.expand(N) / m)
            out["loglik"].zero_()
        out["flags"] = 0
        return out
    if threads is None:
        threads = _threads(T * N)
    out["flags"] = _ext.filter(
        dtype == torch.float64,
        T,
        N,
        int(threads),
        tuple(_series(x) for x in (z,) + tuple(params)),
        tuple(_lane(x) for x in x0),
        tuple(out[k].data_ptr() for k in keys),
        tuple(out[k].data_ptr() for k in SMOOTH_KEYS) if smooth else (),
        out["loglik"].data_ptr(),
        tuple(f.data_ptr() for f in final),
    )
    return out


def loglik_grad(
    z,
    obs_var,
    decay,
    process_var,
    loading,
    offset,
    x0,
    weight=None,
    *,
    wrt=None,
    checkpoint=None,
    threads=None,
):
    """Gradient of ``sum(weight * loglik)`` with respect to the inputs, by the kernel's adjoint.

    One reverse pass over time with the state kept every ``checkpoint`` steps (default
    ``ceil(sqrt(T))``): each block is recomputed from its checkpoint and reversed. ``weight``:
    ``[N]`` (default ones). ``wrt``: the names wanted among ``z, obs_var, decay, process_var,
    loading, offset, u0, e0, v0`` (default all). Returns a dict of gradients, each in its input's
    compact shape (``[T, N]``, ``[1, N]``, ``[T, 1]`` or ``[1, 1]``: summed over the input's
    broadcast dimensions; ``[N]`` for ``u0, e0, v0``) and ``flags`` (bit :data:`NOT_FINITE`).

    >>> import torch
    >>> from kalmanscan.core import native
    >>> z = torch.tensor([[1.0], [2.0], [0.5]], dtype=torch.float64)
    >>> s = lambda v: torch.tensor([[v]], dtype=torch.float64)
    >>> x0 = tuple(torch.tensor([v], dtype=torch.float64) for v in (0.0, 0.0, 1.0))
    >>> g = native.loglik_grad(z, s(1.0), s(0.9), s(0.1), s(1.0), s(0.0), x0)
    >>> round(float(g["decay"]), 4), tuple(g["z"].shape), tuple(g["decay"].shape)
    (-1.0999, (3, 1), (1, 1))
    """
    if _ext is None:
        raise RuntimeError("kalmanscan.core._native is not built; use the torch backend")
    params = (obs_var, decay, process_var, loading, offset)
    T, N, dtype, x0 = _check(z, params, x0)
    names = INPUTS + ("u0", "e0", "v0")
    wrt = names if wrt is None else tuple(wrt)
    for name in wrt:
        if name not in names:
            raise ValueError(f"wrt: expected names among {names}, got {name!r}")
    if weight is None:
        weight = torch.ones(1, dtype=dtype)
    if not isinstance(weight, torch.Tensor) or weight.dtype != dtype or weight.dim() != 1:
        raise TypeError(f"weight: expected a [N] {dtype} tensor, got {weight!r:.60}")
    if weight.shape[0] not in (1, N):
        raise ValueError(f"weight: expected shape [{N}] or [1], got {list(weight.shape)}")
    out, grads = {}, []
    for name, x in zip(INPUTS, (z,) + params, strict=True):
        full_t, full_n = x.shape[0] > 1 and x.stride(0) != 0, x.shape[1] > 1 and x.stride(1) != 0
        if name in wrt:
            out[name] = _empty((T if full_t else 1, N if full_n else 1), dtype)
            grads.append((out[name].data_ptr(), full_t, full_n))
        else:
            grads.append((0, full_t, full_n))
    gx0 = []
    for name in ("u0", "e0", "v0"):
        if name in wrt:
            out[name] = _empty((N,), dtype)
        gx0.append(out[name].data_ptr() if name in wrt else 0)
    if N == 0 or T == 0:
        for name in wrt:
            out[name].zero_()
        out["flags"] = 0
        return out
    if checkpoint is None:
        checkpoint = max(1, math.isqrt(T - 1) + 1)
    if threads is None:
        threads = _threads(_ADJ_WORK * T * N)
    out["flags"] = _ext.loglik_grad(
        dtype == torch.float64,
        T,
        N,
        int(threads),
        tuple(_series(x) for x in (z,) + params),
        tuple(_lane(x) for x in x0),
        _lane(weight),
        tuple(grads),
        tuple(gx0),
        int(checkpoint),
    )
    return out


# ------------------------------------------------------------------------------------ autograd


def _compact(x: torch.Tensor) -> torch.Tensor:
    """``x`` narrowed to size 1 along its broadcast (stride-0) dims. Under autograd the slice's
    backward pads a compact gradient to ``x``'s shape before the expansion's backward sums it:
    callers that want no ``[T, N]`` buffer in the backward pass compact tensors themselves."""
    for dim, (n, s) in enumerate(zip(x.shape, x.stride(), strict=True)):
        if s == 0 and n > 1:
            x = x.narrow(dim, 0, 1)
    return x


def _torch_vjp(fn, kind, T, N, inputs, grads, need):
    """The torch backend's vector-Jacobian product at ``inputs`` (grad mode on here means the
    caller asked for ``create_graph``: then the saved inputs are differentiated themselves)."""
    create = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = [
            x if create else x.detach().requires_grad_(n) for x, n in zip(inputs, need, strict=True)
        ]
        params = tuple(x.expand(T, N) for x in leaves[:6])
        # obs_var = inf marks a step not observed here (INF_OBS_VAR_UNOBSERVED); the torch
        # backend reads that from z alone
        unobserved = torch.isinf(params[1])
        if bool(unobserved.any()):
            params = (params[0].masked_fill(unobserved, float("nan")),) + params[1:]
        x0 = tuple(x.expand(N) for x in leaves[6:])
        r = fn(*params, x0, outputs=kind) if kind is not None else fn(*params, x0)
        outs = [r[k] for k in kind_keys(kind)] + list(r["final"])
        pairs = [
            (o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad
        ]
        wrt = [x for x, n in zip(leaves, need, strict=True) if n]
        got = (
            torch.autograd.grad(
                [o for o, _ in pairs],
                wrt,
                [g for _, g in pairs],
                allow_unused=True,
                create_graph=create,
            )
            if pairs
            else [None] * len(wrt)
        )
    it = iter(got)
    res = []
    for x, n in zip(leaves, need, strict=True):
        g = next(it) if n else None
        res.append(torch.zeros_like(x) if n and g is None else g)
    return tuple(res)


def kind_keys(kind):
    """The ``[T, N]`` / ``[N]`` tensor outputs of a call, in the autograd functions' order."""
    if kind == "loglik":
        return ("loglik",)
    if kind == "all":
        return FILTER_KEYS + ("loglik",)
    return FILTER_KEYS + ("loglik",) + SMOOTH_KEYS


class _NativeFunction(torch.autograd.Function):
    """The kernel's outputs, differentiable. Inputs: the six compact parameters, then u0, e0, v0
    (``[N]``); ``kind``: ``"loglik"``, ``"all"`` or ``None`` (the smoother)."""

    @staticmethod
    def forward(ctx, kind, T, N, *inputs):
        ctx.set_materialize_grads(False)
        ctx.kind, ctx.T, ctx.N = kind, T, N
        ctx.save_for_backward(*inputs)
        params = tuple(x.expand(T, N) for x in inputs[:6])
        x0 = tuple(x.expand(N) for x in inputs[6:])
        out = _run(params[0], params[1:], x0, outputs=kind or "all", smooth=kind is None)
        res = tuple(out[k] for k in kind_keys(kind)) + tuple(out["final"])
        # lanes whose log-likelihood is NaN by design (LL_LOST): their gradients are NaN
        ctx.lost = torch.isnan(out["loglik"]) if out["flags"] & LL_LOST else None
        flags = torch.tensor(out["flags"])
        ctx.mark_non_differentiable(flags)
        return res + (flags,)

    @staticmethod
    def backward(ctx, *grads):
        grads = grads[:-1]  # flags
        inputs = ctx.saved_tensors
        need = ctx.needs_input_grad[3:]
        kind, T, N = ctx.kind, ctx.T, ctx.N
        adjoint = (
            kind == "loglik" and not torch.is_grad_enabled() and all(g is None for g in grads[1:])
        )
        if not adjoint:
            from kalmanscan.core import parallel

            fn = parallel.smooth_lanes if kind is None else parallel.filter_lanes
            return (None, None, None) + _torch_vjp(fn, kind, T, N, inputs, grads, need)
        if grads[0] is None:
            return (None, None, None) + tuple(
                torch.zeros_like(x) if n else None for x, n in zip(inputs, need, strict=True)
            )
        names = INPUTS + ("u0", "e0", "v0")
        wrt = [name for name, n in zip(names, need, strict=True) if n]
        params = tuple(x.expand(T, N) for x in inputs[:6])
        x0 = tuple(x.expand(N) for x in inputs[6:])
        w = grads[0].to(inputs[0].dtype).contiguous()
        lost = ctx.lost
        if lost is not None:  # (the adjoint runs on the other lanes; these become NaN below)
            w = torch.where(lost, 0.0, w.expand(N)).contiguous()
        g = loglik_grad(params[0], *params[1:], x0, w, wrt=wrt)
        if g["flags"] & NOT_FINITE:
            return (None, None, None) + _vjp_or_raise(kind, T, N, inputs, grads, need, lost)
        res = []
        for name, x, n in zip(names, inputs, need, strict=True):
            gx = g[name] if n else None
            if gx is not None and lost is not None:
                gx = gx.masked_fill(lost, float("nan")) if gx.shape[-1] == N else gx + float("nan")
            res.append(gx.sum_to_size(x.shape) if n else None)
        return (None, None, None) + tuple(res)


def _vjp_or_raise(kind, T, N, inputs, grads, need, lost):
    """The log-likelihood's gradient by the torch backend's vector-Jacobian product where the
    kernel's adjoint left the range (an intermediate past it, though the gradient is not:
    ``process_var / obs_var`` past 1e308, a lane carried in units with ``loading`` 1e149, gave
    an OverflowError where the torch backend is exact); the OverflowError only where that one is
    not finite either (and no lane's log-likelihood is NaN by design: ``lost``)."""
    from kalmanscan.core import parallel

    res = _torch_vjp(parallel.filter_lanes, kind, T, N, inputs, grads, need)
    if lost is None and any(g is not None and not bool(torch.isfinite(g).all()) for g in res):
        raise OverflowError(
            "native adjoint: a gradient of the log-likelihood is not finite in "
            f"{inputs[0].dtype}: the data or parameters are beyond what the dtype can hold"
        )
    return res


def _call(kind, z, obs_var, decay, process_var, loading, offset, x0):
    params = (z, obs_var, decay, process_var, loading, offset)
    T, N, dtype, x0l = _check(z, params[1:], x0)
    tensors = params + tuple(x0)
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors)):
        return _run(z, params[1:], x0, outputs=kind or "all", smooth=kind is None)
    compact = tuple(_compact(x) for x in params)
    lanes = tuple(x.reshape(-1) if x.dim() == 1 else x.reshape(1) for x in x0)
    res = _NativeFunction.apply(kind, T, N, *compact, *lanes)
    keys = kind_keys(kind)
    out = dict(zip(keys, res[: len(keys)], strict=True))
    out["final"] = tuple(res[len(keys) : len(keys) + 3])
    out["flags"] = int(res[-1])
    return out


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    """The backend contract's filter (module docstring; docs/backend-contract.md).

    >>> import torch
    >>> from kalmanscan.core import native
    >>> z = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    >>> s = lambda v: torch.tensor([[v]], dtype=torch.float64)
    >>> x0 = tuple(torch.tensor([v], dtype=torch.float64) for v in (0.0, 0.0, 1.0))  # diffuse
    >>> out = native.filter_lanes(z, s(1.0), s(1.0), s(0.0), s(1.0), s(0.0), x0)
    >>> out["mean"][:, 0].tolist(), out["var"][:, 0].tolist(), out["flags"]
    ([1.0, 1.5], [1.0, 0.5], 0)
    """
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs: expected one of {OUTPUTS}, got {outputs!r}")
    return _call(outputs, z, obs_var, decay, process_var, loading, offset, x0)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    """The backend contract's smoother: :func:`filter_lanes`'s outputs plus ``smooth_mean``,
    ``smooth_var`` (two-filter form: a backward information filter combined with the filtered
    state by adding precisions)."""
    return _call(None, z, obs_var, decay, process_var, loading, offset, x0)


def loglik_hessian(build, theta, *, per_lane=False, rel_step=1e-4):
    """Hessian of the summed log-likelihood with respect to a few parameters, by central
    differences of the exact (adjoint) gradient: ``2 K`` gradient passes for ``K`` parameters.

    ``build(theta)`` returns the contract's inputs ``(z, obs_var, decay, process_var, loading,
    offset, x0)`` from ``theta`` by differentiable torch operations (e.g. ``obs_var =
    exp(theta[0])``). ``theta``: ``[K]`` (parameters shared by all lanes; returns ``[K, K]``), or
    with ``per_lane=True`` ``[N, K]``, where lane n's inputs depend on ``theta[n]`` only (returns
    ``[N, K, K]``, every lane's Hessian from the same ``2 K`` passes). The step of parameter k is
    ``rel_step * max(|theta_k|, 1)``; the truncation error is ``O(step^2)`` and the rounding error
    ``O(eps / step)``: about 1e-8 relative in float64 at the default. The result is symmetrized.

    >>> import torch
    >>> from kalmanscan.core import native
    >>> z = torch.tensor([[1.0], [2.0], [0.5], [1.5]], dtype=torch.float64)
    >>> def build(th):
    ...     s = lambda v: v.reshape(1, 1)
    ...     x0 = tuple(torch.tensor([v], dtype=torch.float64) for v in (0.0, 0.0, 1.0))
    ...     one = torch.ones(1, 1, dtype=torch.float64)
    ...     return z, s(th[0].exp()), s(th[1]), s(th[2].exp()), one, 0 * one, x0
    >>> H = native.loglik_hessian(build, torch.tensor([0.0, 0.8, -1.0], dtype=torch.float64))
    >>> H.shape, bool(torch.allclose(H, H.T))
    (torch.Size([3, 3]), True)
    """
    if not isinstance(theta, torch.Tensor) or theta.dim() != (2 if per_lane else 1):
        want = "[N, K]" if per_lane else "[K]"
        got = list(theta.shape) if isinstance(theta, torch.Tensor) else type(theta).__name__
        raise ValueError(f"theta: expected a {want} tensor (per_lane={per_lane}), got {got}")
    theta = theta.detach()

    def grad(th):
        th = th.clone().requires_grad_(True)
        with torch.enable_grad():
            *params, x0 = build(th)
            ll = filter_lanes(*params, x0, outputs="loglik")["loglik"]
            (g,) = torch.autograd.grad(ll.sum(), th)
        return g

    K = theta.shape[-1]
    step = rel_step * theta.abs().clamp_min(1.0)
    cols = []
    for k in range(K):
        e = torch.zeros_like(theta)
        e[..., k] = step[..., k]
        diff = grad(theta + e) - grad(theta - e)
        cols.append(diff / (2 * step[..., k : k + 1]))
    H = torch.stack(cols, dim=-1)  # [..., K (gradient), K (direction)]
    return 0.5 * (H + H.transpose(-1, -2))


# ------------------------------------------------------------------------------------------------
# The KLA op's forward (kalmanscan/core/_native_kla.c; backend "native" of kla_filter)

try:
    from kalmanscan.core import _native_kla as _kla_ext
except ImportError:  # built without a C compiler: the sequential backend serves the CPU
    _kla_ext = None


def kla_available() -> bool:
    """Whether the compiled extension ``kalmanscan.core._native_kla`` is importable."""
    return _kla_ext is not None


def kla_forward(v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False):
    """The KLA op's forward in one compiled pass over time (no gradients).

    v, Lv: ``[B, L, M]``; k, q: ``[B, L, S]``; decay, process_var: ``[M, S]``; lam0, eta0:
    ``[B, M, S]``, all CPU tensors of one dtype (float32 or float64; ``kla_op._prepare``'s
    output). Returns ``(y, yvar, lam, eta, precision)``: y, yvar ``[B, L, M]``, the final state
    ``[B, M, S]`` and the filtered precisions ``[B, L, M, S]`` (None unless asked). Channels are
    split over :func:`set_num_threads`' threads (default ``torch.get_num_threads()``).

    >>> import torch
    >>> from kalmanscan.core import native
    >>> B, L, M, S = 1, 4, 3, 2
    >>> y, yvar, lam, eta, prec = native.kla_forward(torch.randn(B, L, M), torch.ones(B, L, M),
    ...     torch.randn(B, L, S), torch.randn(B, L, S), torch.full((M, S), 0.9),
    ...     torch.full((M, S), 0.1), torch.ones(B, M, S), torch.zeros(B, M, S))
    >>> y.shape, lam.shape, prec
    (torch.Size([1, 4, 3]), torch.Size([1, 3, 2]), None)
    """
    if _kla_ext is None:
        raise RuntimeError(
            "kla_forward: the compiled extension kalmanscan.core._native_kla is not built (no C "
            "compiler when kalmanscan was installed); use kla_filter(..., backend='sequential')"
        )
    B, L, M = v.shape
    S = k.shape[-1]
    dtype = v.dtype
    if dtype not in _NUMPY:
        raise TypeError(f"v: expected a float32 or float64 tensor, got dtype {dtype}")
    inputs = [x.detach().contiguous() for x in (v, Lv, k, q, decay, process_var)]
    for name, x in zip(("v", "Lv", "k", "q", "decay", "process_var"), inputs, strict=True):
        if x.dtype != dtype or x.device.type != "cpu":
            raise ValueError(
                f"{name}: expected a CPU {dtype} tensor (as v), got {x.dtype} on {x.device}"
            )
    y, yvar = _empty((B, L, M), dtype), _empty((B, L, M), dtype)
    lam, eta = _empty((B, M, S), dtype), _empty((B, M, S), dtype)
    lam.copy_(lam0.detach())
    eta.copy_(eta0.detach())
    prec = _empty((B, L, M, S), dtype) if return_precision else None
    outputs = (y, yvar, lam, eta)
    _kla_ext.forward(
        dtype == torch.float64,
        B,
        L,
        M,
        S,
        _threads(B * L * M * S),
        tuple(x.data_ptr() for x in inputs),
        tuple(x.data_ptr() for x in outputs) + (0 if prec is None else prec.data_ptr(),),
    )
    return y, yvar, lam, eta, prec
