"""The one dispatch table: for each op, backend name -> implementation, and one ``resolve``.

Ops and their backends:

- ``"filter"`` (``kalmanscan.filter``, ``smooth``, ``loglik``): modules implementing the
  full-result contract of docs/backend-contract.md (``filter_lanes``, ``smooth_lanes``):
  ``"sequential"`` (the step-by-step reference), ``"torch"`` (the chunked projective scan),
  ``"native"`` (the compiled CPU kernel), ``"triton"`` (fused GPU kernels).
- ``"kla"`` (``kalmanscan.core.kla_op.kla_filter``): functions on prepared KLA inputs:
  ``"sequential"`` (the token loop vectorized over every lane), ``"torch"`` (a client of the
  general filter), ``"native"`` (the compiled CPU forward, no gradients: not in ``"auto"``, which
  never looks at grad mode), ``"triton"`` (the fused GPU kernel).
- ``"dense"`` (``kalmanscan.dense.filter``, ``smooth``): functions ``(model, layout, smooth,
  chunk) -> DenseFilterResult | DenseSmoothResult`` on a laid-out dense model:
  ``"sequential"`` (the step-by-step reference), ``"torch"`` (the chunked scan), ``"native"``
  (the compiled exact sequential pass, CPU), ``"diagonal"`` (diagonal models through the scalar
  filter), ``"triton"`` (the fused GPU filter for small dense states; on CUDA ``"auto"`` takes it
  for the model class it serves and ``"torch"`` otherwise, a rule on the call's model class that
  ``kalmanscan.dense.api`` applies, never one on sizes).

``"auto"`` looks only at the device and at what is installed, never at shapes or grad mode: the
first available name of ``AUTO[op][device type]``. A backend that cannot serve a call raises and
names one that can. Implementations load on first use, so ``import kalmanscan`` imports no
triton.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch

from kalmanscan.core import native

TABLES = {
    "filter": {
        "sequential": "kalmanscan.core.sequential",
        "torch": "kalmanscan.core.parallel",
        "triton": "kalmanscan.cuda.filter",
        "native": "kalmanscan.core.native",
    },
    "kla": {
        "sequential": "kalmanscan.core.kla_op:kla_filter_sequential",
        "torch": "kalmanscan.core.kla_op:kla_filter_torch",
        "triton": "kalmanscan.core.kla_op:kla_filter_triton",
        "native": "kalmanscan.core.kla_op:kla_filter_native",
    },
    "dense": {
        "sequential": "kalmanscan.dense.api:_sequential",
        "torch": "kalmanscan.dense.api:_torch",
        "native": "kalmanscan.dense.api:_native",
        "diagonal": "kalmanscan.dense.api:_diagonal",
        "triton": "kalmanscan.cuda.dense:dense_triton",
    },
}
FILTER_BACKENDS = TABLES["filter"]

# op -> device type -> preference order of "auto"; the last entry always serves the device
AUTO = {
    "filter": {"cuda": ("triton", "torch"), "cpu": ("native", "torch")},
    # the KLA op on the CPU: the vectorized token loop, which computes gradients ("native" is
    # faster but forward only, and "auto" never looks at grad mode; inference picks it by name)
    "kla": {"cuda": ("triton", "torch"), "cpu": ("sequential",)},
    # the compiled dense pass is faster than the scan on every CPU shape measured (docs/dense.md)
    # on CUDA "auto" means triton for the model class it serves (proper prior, time-invariant,
    # n <= 8, filter, no grad: kalmanscan.cuda.dense.unsupported), torch for the rest
    "dense": {"cuda": ("triton", "torch"), "cpu": ("native", "torch")},
}

# the compiled extension behind each op's "native" backend, and what serves other devices
_NATIVE_EXTENSION = {
    "filter": "kalmanscan.core._native",
    "kla": "kalmanscan.core._native_kla",
    "dense": "kalmanscan.dense._native_dense",
}
_OFF_CPU = {
    "filter": "'triton' (fused GPU kernels) or 'torch'",
    "kla": "'triton' or 'torch'",
    "dense": "'triton' or 'torch'",
}


@functools.cache
def _triton_available() -> bool:
    return (
        importlib.util.find_spec("triton") is not None
        and importlib.util.find_spec("kalmanscan.cuda") is not None
    )


def _native_built(op: str) -> bool:
    if op == "dense":  # imported on first use: import kalmanscan does not load kalmanscan.dense
        return importlib.import_module("kalmanscan.dense.native").available()
    if op == "kla":
        return native.kla_available()
    return native.available()


def _unavailable(name: str, device: torch.device, op: str) -> str | None:
    """Why backend ``name`` of ``op`` cannot serve ``device`` (None when it can)."""
    if name == "triton":
        if device.type != "cuda":
            return (
                f"'triton' runs on CUDA tensors, got tensors on {device}; use backend='torch' "
                "(parallel) or 'sequential' there"
            )
        if not _triton_available():
            return "'triton' needs the triton package (pip install triton); use backend='torch'"
    if name == "native":
        if device.type != "cpu":
            return (
                f"'native' runs on CPU tensors, got tensors on {device}; use backend="
                f"{_OFF_CPU[op]} there"
            )
        if not _native_built(op):
            return (
                f"'native' needs the compiled extension {_NATIVE_EXTENSION[op]}, which is not "
                "built (no C compiler when kalmanscan was installed); use backend="
                f"{'sequential' if op == 'kla' else 'torch'!r}, or reinstall with a C compiler"
            )
    return None


def check_name(backend, op: str = "filter", arg: str = "backend") -> None:
    """A ValueError naming ``arg`` unless ``backend`` is ``"auto"`` or a backend name of ``op``
    (the device is not checked: :func:`resolve` does that)."""
    table = TABLES[op]
    if not isinstance(backend, str) or (backend != "auto" and backend not in table):
        raise ValueError(f"{arg}: expected 'auto' or one of {sorted(table)}, got {backend!r}")


def resolve(backend: str, device: torch.device, op: str = "filter") -> str:
    """Turn ``backend`` (a name or ``"auto"``) into a concrete name of ``op`` serving ``device``."""
    check_name(backend, op)
    if backend == "auto":
        prefs = AUTO[op].get(device.type, ("torch",))
        return next((n for n in prefs if _unavailable(n, device, op) is None), prefs[-1])
    why = _unavailable(backend, device, op)
    if why is not None:
        raise ValueError(f"backend: {why}")
    return backend


def get(name: str, op: str = "filter"):
    """The implementation of backend ``name`` of ``op``: for ``"filter"`` the module
    (``filter_lanes``, ``smooth_lanes``; optional ``CHECKS_INPUTS``: the backend checks input
    values in its own pass and reports them through ``flags``), for ``"kla"`` and ``"dense"``
    the function."""
    key = (op, name, TABLES[op][name])
    impl = _LOADED.get(key)
    if impl is None:
        module, _, func = key[2].partition(":")
        mod = importlib.import_module(module)
        impl = _LOADED[key] = getattr(mod, func) if func else mod
    return impl


_LOADED: dict = {}


def provide(op: str, name: str, impl) -> None:
    """Record an already-imported implementation (the module defining it calls this), so that
    :func:`get` needs no import on first use: ``torch.compile`` cannot trace ``import_module``."""
    path = TABLES[op][name]
    module, _, func = path.partition(":")
    if (impl.__module__, impl.__name__) != (module, func):
        raise ValueError(f"provide: {op}/{name} is {path}, got {impl.__module__}:{impl.__name__}")
    _LOADED[(op, name, path)] = impl
