"""The one dispatch table of the general filter: backend name -> the module implementing it.

Each module implements the full-result contract of docs/backend-contract.md (``filter_lanes`` and
``smooth_lanes``). ``"auto"`` picks, in order: ``"triton"`` for CUDA tensors when triton is
installed; ``"native"`` (the compiled fused CPU kernel) for CPU tensors when the extension is
built; else ``"torch"``. It never looks at shapes or grad mode. A backend that cannot serve a call
raises and names one that can.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from kalmanscan.core import native

# name -> "module:function"; modules load on first use so `import kalmanscan` imports no triton.
FILTER_BACKENDS = {
    "sequential": "kalmanscan.core.sequential",
    "torch": "kalmanscan.core.parallel",
    "triton": "kalmanscan.cuda.filter",
    "native": "kalmanscan.core.native",
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
    """The backend module ``name`` (``filter_lanes``, ``smooth_lanes``; optional ``CHECKS_INPUTS``:
    the backend checks input values in its own pass and reports them through ``flags``)."""
    return importlib.import_module(FILTER_BACKENDS[name])
