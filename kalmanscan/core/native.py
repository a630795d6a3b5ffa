"""The native CPU backend: one fused, compiled pass over time (``kalmanscan/core/_native.c``).

The extension is built at install time when a C compiler is present (setup.py, optional). It
computes everything :func:`kalmanscan.core.filter._run_block` returns in one pass, vectorized across
lanes, with lanes split across threads (``torch.get_num_threads()`` of them) and the GIL released.
It has no backward of its own: where inputs require grad, filter.py wraps it in an autograd
function whose backward is the torch backend's vector-Jacobian product at the same inputs.
``backend="auto"`` picks it for every CPU call, whatever the shape: on one lane of 200 000 steps
too it is faster than the chunked parallel scan of the torch backend (docs/performance-cpu.md).

Backend contract (docs/architecture.md): ``filter_lanes(z, obs_var, decay, process_var, loading,
offset, lam0, eta0) -> (lam, eta)`` with ``[T, N]`` inputs (expanded views allowed: stride 0 is
read as broadcast, never materialized) and ``[N]`` initial state. :func:`run` returns all outputs.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    from kalmanscan.core import _native as _ext
except ImportError:  # built without a C compiler: the torch backend serves the CPU
    _ext = None

# flags returned by the kernel (bits)
NOT_FINITE = 1  # a filtered precision or information is not finite: overflow
Z_INF = 2  # z holds +-inf: invalid input (filter.py raises naming it)

_KEYS = ("lam", "eta", "mean", "var", "lam_pred", "mean_pred", "var_pred")
# Below this many elements one thread does the whole call (starting threads costs ~50 us).
_MIN_ELEMS_PER_THREAD = 1 << 14
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def available() -> bool:
    """Whether the compiled extension ``kalmanscan.core._native`` is importable."""
    return _ext is not None


def _empty(shape, dtype) -> torch.Tensor:
    """Output storage from numpy's allocator (it asks the OS for huge pages on large blocks)."""
    return torch.from_numpy(np.empty(shape, _NUMPY[dtype]))


def _series(x: torch.Tensor):
    st, sn = x.stride()
    return (x.data_ptr(), st if x.shape[0] > 1 else 0, sn if x.shape[1] > 1 else 0)


def run(z, obs_var, decay, process_var, loading, offset, lam0, eta0, threads=None):
    """Filter ``[T, N]`` lanes in one pass.

    Returns ``(out, flags)``: ``out`` maps ``lam, eta, mean, var, lam_pred, mean_pred, var_pred``
    to new contiguous ``[T, N]`` tensors and ``loglik`` to ``[N]``; ``flags`` has bit
    :data:`NOT_FINITE` set when a filtered precision or information is not finite (overflow) and
    :data:`Z_INF` when ``z`` holds an infinity (the caller raises for both).

    >>> import torch
    >>> from kalmanscan.core import native
    >>> z = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    >>> one = lambda v: torch.full((2, 1), v, dtype=torch.float64)
    >>> zero = torch.zeros(1, dtype=torch.float64)
    >>> out, flags = native.run(z, one(1.0), one(1.0), one(0.0), one(1.0), one(0.0), zero, zero)
    >>> out["mean"][:, 0].tolist(), flags
    ([1.0, 1.5], 0)
    """
    if _ext is None:
        raise RuntimeError("kalmanscan.core._native is not built; use the torch backend")
    T, N = z.shape
    dtype = z.dtype
    if dtype not in _NUMPY or z.device.type != "cpu":
        raise TypeError(f"z: expected a float32/float64 CPU tensor, got {dtype} on {z.device}")
    params = (z, obs_var, decay, process_var, loading, offset)
    for x in params:
        if x.dtype != dtype or x.dim() != 2 or x.device.type != "cpu":
            raise TypeError(f"native.run: expected [T, N] CPU tensors of {dtype}, got {x.dtype}")
    outs = [_empty((T, N), dtype) for _ in _KEYS]
    loglik = _empty((N,), dtype)
    out = dict(zip(_KEYS, outs, strict=True))
    out["loglik"] = loglik
    if N == 0:  # no lanes: nothing to compute
        return out, 0
    if threads is None:
        threads = torch.get_num_threads()
    threads = max(1, min(int(threads), (T * N) // _MIN_ELEMS_PER_THREAD))
    lam0 = lam0.to(dtype).expand(N)
    eta0 = eta0.to(dtype).expand(N)
    flags = _ext.filter(
        dtype == torch.float64,
        T,
        N,
        threads,
        tuple(_series(x.expand(T, N)) for x in params),
        (lam0.data_ptr(), lam0.stride(0) if N > 1 else 0),
        (eta0.data_ptr(), eta0.stride(0) if N > 1 else 0),
        tuple(o.data_ptr() for o in outs),
        loglik.data_ptr(),
    )
    return out, flags


def filter_lanes(z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    """The backend contract: ``(lam, eta)`` of ``[T, N]`` lanes (no overflow check here)."""
    out, _ = run(z, obs_var, decay, process_var, loading, offset, lam0, eta0)
    return out["lam"], out["eta"]
