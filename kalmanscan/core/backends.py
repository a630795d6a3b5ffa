"""The one dispatch table of the general filter: backend name -> ``filter_lanes`` implementation.

``"auto"`` looks at the device and installed packages only (never at shapes or grad mode).
A backend that cannot serve a call raises and names one that can.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

# name -> "module:function"; modules load on first use so `import kalmanscan` imports no triton.
FILTER_BACKENDS = {
    "sequential": "kalmanscan.core.sequential:filter_lanes",
    "torch": "kalmanscan.core.parallel:filter_lanes",
    "triton": "kalmanscan.cuda.filter:filter_lanes",
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
        return "triton" if device.type == "cuda" and _triton_available() else "torch"
    if backend == "triton" and device.type != "cuda":
        raise ValueError(
            f"backend: 'triton' runs on CUDA tensors, got tensors on {device}; "
            "use backend='torch' (parallel) or 'sequential' there"
        )
    return backend


def get(name: str):
    module, func = FILTER_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), func)
