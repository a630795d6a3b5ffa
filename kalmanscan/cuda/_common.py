"""Small Triton helpers shared by the kernels of kalmanscan/cuda/.

Staging: a kernel loads a ``[TB, BLOCK]`` tile (TB time steps of BLOCK lanes) at once and then
runs the serial recurrence over the TB rows. With one lane per thread the whole column of a tile
sits in that thread's registers, and ``pick(tile, rows, i)`` with a compile-time ``i`` folds to
one register read, so the recurrence never waits on a global load of its own step.
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
def pick(tile, rows, i):
    """Row ``i`` (a compile-time int) of a ``[TB, BLOCK]`` tile, as a ``[BLOCK]`` vector."""
    return tl.sum(tl.where(rows[:, None] == i, tile, 0.0), axis=0)


@helper
def pick3(tile, rows, i):
    """Row ``i`` (a compile-time int) of a ``[TB, X, Y]`` tile, as an ``[X, Y]`` tile."""
    return tl.sum(tl.where(rows[:, None, None] == i, tile, 0.0), axis=0)


@helper
def put(tile, rows, i, value):
    """``tile`` with row ``i`` replaced by the ``[BLOCK]`` vector ``value``."""
    return tl.where(rows[:, None] == i, value[None, :], tile)


@helper
def put3(tile, rows, i, value):
    """``tile`` with row ``i`` replaced by the ``[X, Y]`` tile ``value``."""
    return tl.where(rows[:, None, None] == i, value[None, :, :], tile)


@helper
def load_rows(ptr, st, sn, t0, rows, lanes, t_lo, t_hi, N, VARY: tl.constexpr):
    """Rows ``t0 + rows`` (clipped to ``[t_lo, t_hi)``) of a strided ``[T, N]`` input.

    ``VARY=False`` (time stride 0): returns the ``[BLOCK]`` lane vector instead.
    """
    if VARY:
        t = t0 + rows
        mask = ((t >= t_lo) & (t < t_hi))[:, None] & (lanes < N)[None, :]
        return tl.load(
            ptr + t[:, None].to(tl.int64) * st + lanes[None, :] * sn, mask=mask, other=1.0
        )
    else:
        return tl.load(ptr + lanes * sn, mask=lanes < N, other=1.0)


@helper
def at(staged, rows, i, VARY: tl.constexpr):
    """The value of step ``i`` of the block from what ``load_rows`` returned."""
    if VARY:
        return pick(staged, rows, i)
    else:
        return staged


@helper
def observation(z, ov, h):
    """``(phi, r, rho, z0)``: information added by ``z`` (0 where ``z`` is NaN or ``ov`` inf)."""
    observed = (z == z) & (ov * 0.0 == 0.0)
    rho = tl.where(observed, 1.0 / tl.where(observed, ov, 1.0), 0.0)
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


if interpreting():
    # Same result, read straight from the interpreter's numpy array: tl.sum is the slowest
    # operation under the interpreter and this keeps the CPU test suite within its time budget.
    def pick(tile, rows, i):  # noqa: F811
        return _row(tile, i)

    def pick3(tile, rows, i):  # noqa: F811
        return _row(tile, i)

    def _row(tile, i):
        import numpy as np
        from triton.runtime.interpreter import TensorHandle

        row = np.ascontiguousarray(tile.handle.data[int(i)])
        return tl.tensor(
            TensorHandle(row, tile.handle.dtype),
            tl.block_type(tile.type.element_ty, list(row.shape)),
        )


def lanes_config(N: int):
    """``(BLOCK, num_warps)`` for one lane per thread (narrow blocks when interpreting)."""
    if interpreting():
        return min(32, max(2, triton.next_power_of_2(N))), 1
    block = min(128, max(32, triton.next_power_of_2(N)))
    return block, block // 32


# Tests set this to True so that every output buffer starts as NaN and an unwritten element fails.
POISON = False


def empty(shape, like):
    """An output buffer: NaN-filled when ``POISON`` is set, else uninitialized."""
    import torch

    if POISON:
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)
