"""The factorized Kalman Linear Attention (KLA) op: many scalar filters with an outer-product
observation model, read out by a query (SPEC §3).

Notation and shapes (batch B, time L, channels M, state slots S; a lane is ``(b, m, s)``):

- ``v``, ``Lv``: ``[B, L, M]`` value and value precision (``Lv > 0``).
- ``k``, ``q``: ``[B, L, S]`` key (observation loading) and query (readout weights).
- ``decay``, ``process_var``: ``[M, S]`` time-invariant dynamics ``a``, ``p`` of each lane.
- ``lam0``, ``eta0``: ``[B, M, S]`` initial precision and information (default 1 and 0).
- per step: ``phi = Lv[m] * k[s]**2``, ``r = v[m] * Lv[m] * k[s]``, offset ``c = 0``; then the
  information-form filter of SPEC §2 gives ``lam``, ``eta`` ``[B, M, S]``.
- readout: ``y[m] = sum_s q[s] * eta[m,s] / lam[m,s]``, ``yvar[m] = sum_s q[s]**2 / lam[m,s]``.

Backends (``kalmanscan.core.backends.TABLES["kla"]``): ``"sequential"`` (the step-by-step
reference), ``"torch"`` (the general parallel filter on materialized ``[B, L, M, S]`` lanes),
``"native"`` (a compiled CPU pass over time, ``kalmanscan/core/_native_kla.c``, forward only) and
``"triton"``
(fused GPU kernels in ``kalmanscan/cuda/kla/``, which never store a ``[B, L, M, S]`` tensor; where
the lanes ``B M S`` are too few to fill the GPU they run in parallel over time chunks, the
count picked by ``kalmanscan.cuda.kla.tuning.chunks_for``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kalmanscan.core import backends
from kalmanscan.core.filter import InfoState
from kalmanscan.core.filter import filter as general_filter
from kalmanscan.core.steps import predict_coeffs, predict_info

__all__ = ["KLAResult", "KLA_BACKENDS", "kla_filter", "kla_step", "kla_filter_sequential"]


class KLAResult(NamedTuple):
    """Outputs of :func:`kla_filter`.

    y, yvar: ``[B, L, M]`` readout mean and variance; final: ``InfoState(lam, eta)`` ``[B, M, S]``
    after the last token; precision: ``[B, L, M, S]`` filtered precisions, or None unless asked.
    """

    y: torch.Tensor
    yvar: torch.Tensor
    final: InfoState
    precision: torch.Tensor | None


_HALF = (torch.float16, torch.bfloat16, torch.float32)
_FLOATS = frozenset(_HALF + (torch.float64,))


def _step(v, Lv, k, q, a, p, qf, d, lam, eta):
    """One token: v, Lv [B, M]; k, q [B, S]; a, p, qf, d [M, S]; lam, eta [B, M, S]."""
    lam_pred, alpha = predict_info(lam, a, p, qf, d)
    lam = lam_pred + Lv[:, :, None] * (k * k)[:, None, :]
    eta = alpha * eta + (v * Lv)[:, :, None] * k[:, None, :]
    y = (q[:, None, :] * eta / lam).sum(-1)
    yvar = ((q * q)[:, None, :] / lam).sum(-1)
    return y, yvar, lam, eta


def kla_filter_sequential(
    v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False, return_variance=True
):
    """The reference: a plain loop over tokens, on prepared inputs (see ``kla_filter``)."""
    qf, d = predict_coeffs(decay * decay, process_var)
    lam, eta = lam0, eta0
    ys, yvars, precs = [], [], []
    # unbind, not v[:, t]: its backward stacks the tokens' gradients once, where each v[:, t]'s
    # would add a full [B, L, ...] zero-filled gradient (O(L^2) over the loop)
    for vt, Lvt, kt, qt in zip(v.unbind(1), Lv.unbind(1), k.unbind(1), q.unbind(1), strict=True):
        y, yvar, lam, eta = _step(vt, Lvt, kt, qt, decay, process_var, qf, d, lam, eta)
        ys.append(y)
        yvars.append(yvar)
        if return_precision:
            precs.append(lam)
    prec = torch.stack(precs, 1) if return_precision else None
    yvar = torch.stack(yvars, 1) if return_variance else None
    return KLAResult(torch.stack(ys, 1), yvar, InfoState(lam, eta), prec)


def kla_filter_torch(
    v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False, return_variance=True
):
    """Thin client of the general filter: lanes ``[B, L, M, S]`` materialized (reference path)."""
    B, L, M = v.shape
    S = k.shape[-1]
    shape = (B, L, M, S)
    res = general_filter(
        v[..., None].expand(shape),
        obs_var=(1.0 / Lv)[..., None].expand(shape),
        decay=decay.expand(shape),
        process_var=process_var.expand(shape),
        loading=k[:, :, None, :].expand(shape),
        init=InfoState(lam0, eta0),
        axis=1,
        backend="torch",
    )
    lam, mean = res.precision, res.mean
    y = (q[:, :, None, :] * mean).sum(-1)
    yvar = ((q * q)[:, :, None, :] / lam).sum(-1) if return_variance else None
    final = InfoState(res.final.lam, res.final.eta)
    return KLAResult(y, yvar, final, lam if return_precision else None)


def kla_filter_native(
    v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False, return_variance=True
):
    """The compiled CPU forward (:func:`kalmanscan.core.native.kla_forward`); no gradients."""
    if torch.is_grad_enabled():
        names = ("v", "Lv", "k", "q", "decay", "process_var", "lam0", "eta0")
        xs = (v, Lv, k, q, decay, process_var, lam0, eta0)
        needs = [n for n, x in zip(names, xs, strict=True) if x.requires_grad]
        if needs:
            raise ValueError(
                "backend: 'native' (the KLA op's compiled CPU forward) computes no gradients, got "
                f"{', '.join(needs)} requiring grad; use backend='sequential' or 'torch' on the "
                "CPU ('triton' on CUDA), or run the forward under torch.no_grad()"
            )
    from kalmanscan.core import native

    y, yvar, lam, eta, prec = native.kla_forward(
        v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=return_precision
    )
    return KLAResult(y, yvar if return_variance else None, InfoState(lam, eta), prec)


def kla_filter_triton(
    v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False, return_variance=True
):
    from kalmanscan.cuda.kla import kla_triton

    y, yvar, lam, eta, prec = kla_triton(
        v, Lv, k, q, decay, process_var, lam0, eta0, return_precision, return_variance
    )
    return KLAResult(y, yvar, InfoState(lam, eta), prec)


# backend names (the table lives in kalmanscan.core.backends); each implementation takes
# prepared inputs (one dtype and device, exact shapes).
KLA_BACKENDS = backends.TABLES["kla"]
for _name, _impl in (
    ("sequential", kla_filter_sequential),
    ("torch", kla_filter_torch),
    ("native", kla_filter_native),
    ("triton", kla_filter_triton),
):
    backends.provide("kla", _name, _impl)


def _resolve(backend, device: torch.device) -> str:
    return backends.resolve(backend, device, op="kla")


def _check_tensor(name, x, ndim, desc):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {desc}, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(
            f"{name}: expected a float16/bfloat16/float32/float64 tensor, got dtype {x.dtype}"
        )
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {desc}, got shape {tuple(x.shape)}")


def _values_ok(tensors) -> bool:
    """Whether every range checked by :func:`_check_values` holds, from one readback
    (:func:`kalmanscan.core._args.ranges_ok`). A check per input stalled a GPU several times a
    call: 0.6 ms a call at B=4 L=2048 M=960 S=16 on the H200
    (``benchmarks/HISTORY.md``)."""
    from kalmanscan.core import _args

    a = tensors["decay"].detach()
    p = tensors["process_var"].detach()
    specs = [(a, None, False), (p, 0.0, False), (tensors["Lv"], 0.0, True)]
    if "lam0" in tensors:
        specs.append((tensors["lam0"], 0.0, False))
    if "eta0" in tensors:
        specs.append((tensors["eta0"], None, False))
    return _args.ranges_ok(specs, flags=[((a * a == 0) & (p == 0)).any()])


def _check_values(tensors):
    """Ranges at the boundary: the dynamics ([M, S], cheap), the value precision and the state.

    One device synchronization per call when the inputs are valid (:func:`_values_ok`); only
    when they are not do the per-input checks below run to name the input, the index and the
    value. The fused kernels then assume valid input.
    """
    from kalmanscan.core import _args

    if _values_ok(tensors):
        return
    _args.check_range("decay", tensors["decay"])
    _args.check_range("process_var", tensors["process_var"], lo=0.0)
    a, p = tensors["decay"].detach(), tensors["process_var"].detach()
    bad = _args.first_bad((a * a == 0) & (p == 0))
    if bad is not None:
        raise ValueError(
            "decay, process_var: expected process_var > 0 wherever decay**2 is 0 (a deterministic "
            f"state has infinite precision), got both 0 at index {bad}"
        )
    _args.check_range("Lv", tensors["Lv"], lo=0.0, lo_open=True, what="values > 0 and finite")
    if "lam0" in tensors:
        _args.check_range("lam0", tensors["lam0"], lo=0.0)
    if "eta0" in tensors:
        _args.check_range("eta0", tensors["eta0"])


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target`` (as ``expand`` needs).
    Plain Python: ``torch.broadcast_shapes`` took about 40 us a call, a third of the op's
    host time."""
    return len(shape) <= len(target) and all(
        s == 1 or s == t for s, t in zip(reversed(shape), reversed(target), strict=False)
    )


def _prepare(
    v, Lv, k, q, decay, process_var, lam0, eta0, keep_half=False, check=True, default_init=False
):
    """Check shapes, pick the working dtype (float64 stays float64, else float32) and convert.

    ``keep_half``: leave float16/bfloat16 ``v, Lv, k, q`` as they are (the fused kernel reads
    them and computes in float32, saving a conversion pass over the inputs).
    ``default_init``: where ``lam0`` and ``eta0`` are both None, return them as None (the fused
    op reads kept tensors of the default state) instead of new tensors of ones and zeros."""
    _check_tensor("v", v, 3, "of shape [B, L, M]")
    B, L, M = v.shape
    _check_tensor("Lv", Lv, 3, f"of shape [B, L, M] = {[B, L, M]}")
    _check_tensor("k", k, 3, f"of shape [B, L, S] with B={B}, L={L}")
    S = k.shape[-1]
    _check_tensor("q", q, 3, f"of shape [B, L, S] = {[B, L, S]}")
    if tuple(Lv.shape) != (B, L, M):
        raise ValueError(f"Lv: expected shape {(B, L, M)} (that of v), got {tuple(Lv.shape)}")
    if tuple(k.shape[:2]) != (B, L):
        raise ValueError(f"k: expected shape [B, L, S] with B={B}, L={L}, got {tuple(k.shape)}")
    if tuple(q.shape) != (B, L, S):
        raise ValueError(f"q: expected shape {(B, L, S)} (that of k), got {tuple(q.shape)}")
    if L < 1 or M < 1 or S < 1 or B < 1:
        raise ValueError(f"v, k: expected non-empty B, L, M, S, got {(B, L, M, S)}")
    tensors = {"v": v, "Lv": Lv, "k": k, "q": q, "decay": decay, "process_var": process_var}
    for name in ("decay", "process_var"):
        x = tensors[name]
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name}: expected a torch.Tensor of shape [M, S], got {type(x).__name__}"
            )
        _check_tensor(name, x, x.dim(), "")
        if x.shape != (M, S) and not _broadcasts_to(x.shape, (M, S)):
            raise ValueError(
                f"{name}: expected a tensor broadcastable to [M, S] = {[M, S]}, "
                f"got {tuple(x.shape)}"
            )
    for name, x in (("lam0", lam0), ("eta0", eta0)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name}: expected a torch.Tensor of shape [B, M, S], got {type(x).__name__}"
            )
        _check_tensor(name, x, x.dim(), "")
        if x.shape != (B, M, S) and not _broadcasts_to(x.shape, (B, M, S)):
            raise ValueError(
                f"{name}: expected a tensor broadcastable to [B, M, S] = {[B, M, S]}, "
                f"got {tuple(x.shape)}"
            )
        tensors[name] = x
    device = v.device
    for name, x in tensors.items():
        if x.device != device:
            raise ValueError(
                f"{name}: expected a tensor on {device} (the device of v), got {x.device}"
            )
    if check:
        _check_values(tensors)
    dtype = (
        torch.float64 if any(x.dtype == torch.float64 for x in tensors.values()) else torch.float32
    )
    keep = keep_half and dtype == torch.float32
    # (conversions and expansions only where they change something: each is a few
    # microseconds of host time even as a no-op)
    cv = {
        n: x if x.dtype == dtype or (keep and n in ("v", "Lv", "k", "q")) else x.to(dtype)
        for n, x in tensors.items()
    }

    def full(x, shape):
        return x if x.shape == shape else x.expand(shape)

    decay = full(cv["decay"], (M, S))
    process_var = full(cv["process_var"], (M, S))
    if default_init and lam0 is None and eta0 is None:
        return cv["v"], cv["Lv"], cv["k"], cv["q"], decay, process_var, None, None
    lam0 = (
        full(cv["lam0"], (B, M, S))
        if lam0 is not None
        else torch.ones(B, M, S, dtype=dtype, device=device)
    )
    eta0 = (
        full(cv["eta0"], (B, M, S))
        if eta0 is not None
        else torch.zeros(B, M, S, dtype=dtype, device=device)
    )
    return cv["v"], cv["Lv"], cv["k"], cv["q"], decay, process_var, lam0, eta0


def kla_filter(
    v,
    Lv,
    k,
    q,
    decay,
    process_var,
    lam0=None,
    eta0=None,
    *,
    return_precision=False,
    return_variance=True,
    backend="auto",
    check=True,
) -> KLAResult:
    """Run the KLA filter over a sequence of tokens (SPEC §3) and read it out.

    v, Lv: ``[B, L, M]``; k, q: ``[B, L, S]``; decay, process_var: ``[M, S]`` (``decay >= 0``,
    ``process_var >= 0``, not both 0); lam0, eta0: ``[B, M, S]`` (default 1 and 0).
    float16/bfloat16/float32 inputs compute and return float32; float64 stays float64.
    ``return_precision=True`` also returns the filtered precisions ``[B, L, M, S]``;
    ``return_variance=False`` returns ``yvar`` None (the fused backend then neither writes it
    nor reads a gradient for it: what the KLA layer's training path asks for).
    ``backend``: ``"auto"`` (``"triton"`` on CUDA tensors when triton is installed, else
    ``"torch"``; on the CPU ``"sequential"``, the token loop vectorized over all ``B*M*S`` lanes,
    which computes gradients), ``"triton"``, ``"torch"``, ``"sequential"`` or ``"native"`` (the
    compiled CPU forward: fastest on the CPU, no gradients; it raises where an input requires
    grad). Differentiable in every input on the other backends. ``check=False`` skips the
    value-range checks (one device synchronization), for callers whose inputs are valid by
    construction, such as the KLA layer.

    >>> import torch
    >>> from kalmanscan.core.kla_op import kla_filter
    >>> g = torch.Generator().manual_seed(0)
    >>> v, Lv = torch.randn(2, 5, 3, generator=g), torch.rand(2, 5, 3, generator=g) + 0.5
    >>> k, q = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    >>> res = kla_filter(v, Lv, k, q, torch.full((3, 4), 0.9), torch.full((3, 4), 0.1))
    >>> res.y.shape, res.final.lam.shape
    (torch.Size([2, 5, 3]), torch.Size([2, 3, 4]))
    """
    name = _resolve(backend, v.device if isinstance(v, torch.Tensor) else torch.device("cpu"))
    fused = name == "triton"
    args = _prepare(
        v, Lv, k, q, decay, process_var, lam0, eta0, keep_half=fused, check=check,
        default_init=fused,
    )  # fmt: skip
    res = backends.get(name, op="kla")(
        *args, return_precision=return_precision, return_variance=return_variance
    )
    if check:
        _check_finite(res)
    return res


def _check_finite(res: KLAResult):
    """Raise where the op's outputs left the dtype (one more synchronization; check=True only)."""
    parts = [x for x in (res.y, res.yvar, res.final.lam, res.final.eta) if x is not None]
    if bool(torch.stack([torch.isfinite(x).all() for x in parts]).all()):
        return
    raise OverflowError(
        f"kla_filter: the filtered precision or readout overflowed {res.y.dtype} (y, yvar or the "
        "final state is not finite). The KLA op carries precisions directly, which grow like "
        "decay**(-2t) where process_var is 0 and decay < 1; give those lanes process_var > 0, or "
        "use float64 and fewer tokens"
    )


def kla_step(v, Lv, k, q, decay, process_var, lam, eta, *, check=True):
    """One token of the KLA filter (O(1) decoding): returns ``(y, yvar, InfoState(lam, eta))``.

    v, Lv: ``[B, M]``; k, q: ``[B, S]``; decay, process_var: ``[M, S]``; lam, eta: ``[B, M, S]``
    (the ``final`` state of :func:`kla_filter` or of the previous step). y, yvar: ``[B, M]``.

    >>> import torch
    >>> from kalmanscan.core.kla_op import kla_step
    >>> B, M, S = 2, 3, 4
    >>> y, yvar, state = kla_step(torch.randn(B, M), torch.ones(B, M), torch.randn(B, S),
    ...     torch.randn(B, S), torch.full((M, S), 0.9), torch.full((M, S), 0.1),
    ...     torch.ones(B, M, S), torch.zeros(B, M, S))
    >>> y.shape, state.lam.shape
    (torch.Size([2, 3]), torch.Size([2, 3, 4]))
    """
    for name, x in (("v", v), ("Lv", Lv), ("k", k), ("q", q)):
        _check_tensor(name, x, 2, "of shape [B, M] (v, Lv) or [B, S] (k, q)")
    if lam is None or eta is None:
        raise ValueError("lam, eta: expected [B, M, S] tensors (the state to continue), got None")
    args = _prepare(
        v[:, None], Lv[:, None], k[:, None], q[:, None], decay, process_var, lam, eta, check=check
    )
    v, Lv, k, q, decay, process_var, lam, eta = args
    qf, d = predict_coeffs(decay * decay, process_var)
    y, yvar, lam, eta = _step(
        v[:, 0], Lv[:, 0], k[:, 0], q[:, 0], decay, process_var, qf, d, lam, eta
    )
    return y, yvar, InfoState(lam, eta)
