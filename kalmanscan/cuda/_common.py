"""Small Triton helpers shared by the kernels of kalmanscan/cuda/ (per-step formulas, sizes,
output buffers).

Every kernel walks lanes through time with the state in registers (one lane per thread in the
general filter, several in the KLA kernels); the loads of a step do not depend on the state, so
the time loops are software-pipelined (``tl.range(..., num_stages=NS)``) and a step never waits
on its own global load. An earlier
version staged ``[TB, lanes]`` tiles in registers and picked rows with compile-time indices;
that relied on the compiler keeping a tile's time axis inside one thread, which Triton 3.9 did
and Triton 3.6 did not (register spills, cross-warp reductions every step).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on the CPU through numpy)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Device helpers are inlined by the compiler; under the interpreter each call of a jitted helper
# re-patches the language module (slow), so there they stay plain functions over patched `tl`.
helper = (lambda fn: fn) if interpreting() else triton.jit


@helper
def observation(z, rinv, h):
    """``(phi, r, rho, z0)`` from ``z``, ``rinv = 1/obs_var`` and ``h`` (0 where ``z`` is NaN;
    ``obs_var = inf`` gives ``rinv = 0``)."""
    observed = z == z
    rho = tl.where(observed, rinv, 0.0)
    z0 = tl.where(observed, z, 0.0)
    return rho * h * h, rho * h * z0, rho, z0


@helper
def predict(lam, a, p):
    """``(lam_pred, alpha, rden, forget)`` of the predict step (total forgetting where a*a == 0)."""
    a2 = a * a
    forget = a2 == 0.0
    d = tl.where(forget, p, a2)
    rden = 1.0 / (p * lam + d)
    lam_pred = tl.where(forget, lam + 1.0, lam) * rden
    alpha = tl.where(forget, 0.0, a * rden)
    return lam_pred, alpha, rden, forget


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host-side sizes. Plain Python: ``triton.cdiv`` and
    ``triton.next_power_of_2`` go through Triton's function wrapper, about 7 us a call here,
    a third of the KLA op's host time a forward call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of 2 at least ``n`` (1 for ``n <= 1``), for host-side sizes."""
    return 1 << max(int(n) - 1, 0).bit_length()


def lanes_config(N: int):
    """``(BLOCK, num_warps)`` for one lane per thread (narrow blocks when interpreting)."""
    if interpreting():
        return min(32, max(2, next_pow2(N))), 1
    block = min(128, max(32, next_pow2(N)))
    return block, block // 32


# Tests set this to True so that every output buffer starts as NaN and an unwritten element fails.
POISON = False


def empty(shape, like):
    """An output buffer: NaN-filled when ``POISON`` is set, else uninitialized."""
    import torch

    if POISON:
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)
