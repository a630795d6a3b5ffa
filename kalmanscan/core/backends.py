"""The one dispatch table of the general filter: backend name -> ``filter_lanes`` implementation.

``"auto"`` picks, in order: ``"triton"`` for CUDA tensors when triton is installed; ``"native"``
(the compiled fused CPU kernel) for CPU tensors when the extension is built; else ``"torch"``. It
never looks at shapes or grad mode: the native kernel is the fastest CPU path on every shape
measured, one long lane included (docs/performance-cpu.md), and where a gradient is wanted its
backward is the torch path's (kalmanscan/core/filter.py, ``_NativeFilter``). A backend that
cannot serve a call raises and names one that can.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from kalmanscan.core import native

# name -> "module:function"; modules load on first use so `import kalmanscan` imports no triton.
FILTER_BACKENDS = {
    "sequential": "kalmanscan.core.sequential:filter_lanes",
    "torch": "kalmanscan.core.parallel:filter_lanes",
    "triton": "kalmanscan.cuda.filter:filter_lanes",
    "native": "kalmanscan.core.native:filter_lanes",
}


def _triton_available() -> bool:
    return (
        importlib.util.find_spec("triton") is not None
        and importlib.util.find_spec("kalmanscan.cuda.filter") is not None
    )


def resolve(backend: str, device: torch.device) -> str:
    """Turn ``backend`` (a name or ``"auto"``) into a concrete name that can serve ``device``."""
    if not isinstance(backend, str) or (backend != "auto" and backend not in FILTER_BACKENDS):
        raise ValueError(
            f"backend: expected 'auto' or one of {sorted(FILTER_BACKENDS)}, got {backend!r}"
        )
    if backend == "auto":
        if device.type == "cuda" and _triton_available():
            return "triton"
        if device.type == "cpu" and native.available():
            return "native"
        return "torch"
    if backend == "triton" and device.type != "cuda":
        raise ValueError(
            f"backend: 'triton' runs on CUDA tensors, got tensors on {device}; "
            "use backend='torch' (parallel) or 'sequential' there"
        )
    if backend == "native":
        if device.type != "cpu":
            raise ValueError(
                f"backend: 'native' runs on CPU tensors, got tensors on {device}; "
                "use backend='triton' (fused GPU kernels) or 'torch' there"
            )
        if not native.available():
            raise ValueError(
                "backend: 'native' needs the compiled extension kalmanscan.core._native, which is "
                "not built (no C compiler when kalmanscan was installed); use backend='torch', or "
                "reinstall with a C compiler"
            )
    return backend


def get(name: str):
    module, func = FILTER_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), func)
