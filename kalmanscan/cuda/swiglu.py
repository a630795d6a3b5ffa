"""SwiGLU's activation ``a = silu(gate) * up`` and its gradient, each one Triton kernel.

Shapes (tokens ``N``, hidden width ``Hp``): ``h [N, 2 Hp]`` the input projection (columns
``gate`` then ``up``), ``a [N, Hp]``; the backward reads ``h`` and ``ga [N, Hp]`` and writes
``gh [N, 2 Hp]`` (``gate``'s gradient in the first ``Hp`` columns, ``up``'s in the last, no
concatenation). Only ``h`` is saved for the backward; ``silu(gate)`` is recomputed.

The kernels round where torch's ops do, so the results are torch's to the bit but for the
exponential's own rounding. In float16/bfloat16 (opmath float32, rounding to the dtype after
each op)::

    s = round(gate / (1 + exp(-gate)))                  # F.silu
    a = round(s * up)
    g_up = round(ga * s);  g_s = round(ga * up)          # the product's backward
    sig = 1 / (1 + exp(-gate))
    g_gate = round(g_s * sig * (1 + gate * (1 - sig)))  # silu_backward

and the same in float32 with no rounding in between. On CUDA the exponential is libdevice's
``expf``, the divisions are IEEE-rounded and multiply-adds contract to fma, as in torch's CUDA
kernels: on the H200 every element of ``a`` and ``gh`` equals torch's at 16,384 x 1,368 in
bfloat16 (benchmarks/results/swiglu-fused-h200.json). Under
``TRITON_INTERPRET=1`` the exponential is numpy's, which torch's CPU kernels round differently
now and then: ``silu(gate)`` then moves by one unit in the last place, and ``a`` and ``up``'s
gradient by up to two (about 2 elements in 10^4 in float16, 1 in 10^5 in bfloat16).

:func:`swiglu_reference` is the eager PyTorch form the kernels are tested against
(tests/test_swiglu_fused.py); :class:`kalmanscan.kla.model.SwiGLU` uses :func:`swiglu` with
``SwiGLU.fused = "auto"`` (its default: on CUDA from ``SwiGLU.fused_min_rows`` rows a call) or
``"fused"``. Timing:
``benchmarks/swiglu_fused.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kalmanscan.cuda._common import cdiv, empty, helper, interpreting, launch

# (BN, BH, num_warps): token rows and hidden channels a program on the device, and under
# TRITON_INTERPRET=1. H200, forward + backward at 16,384 x 1,368 bfloat16
# (results/swiglu-fused-h200.json, --sweep): (4, 512, 4) 115 us, (16, 128, 4) 121,
# (8, 256, 4) 125, (32, 64, 4) 140, (32, 32, 4) 168
GPU_BLOCKS = (4, 512, 4)
INTERP_BLOCKS = (8, 32, 1)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _blocks():
    """``(BN, BH, num_warps)``: ``GPU_BLOCKS``, or ``INTERP_BLOCKS`` when interpreting."""
    return INTERP_BLOCKS if interpreting() else GPU_BLOCKS


def _align(Hp: int) -> int:
    """The largest power of 2 up to 16 that divides ``Hp``: the kernels' row strides and the
    ``up`` half's offset are multiples of it, which lets the compiler vectorize their loads."""
    return min(Hp & -Hp, 16)


# ----------------------------------------------------------------------------------- device

if interpreting():

    @helper
    def _exp(x):
        return tl.exp(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _exp(x):
        # libdevice's expf: torch's CUDA kernels call it (tl.exp is ex2.approx of x log2 e)
        return libdevice.exp(x)


if interpreting():

    def _to(x, dt):
        """``x`` (float32) rounded to ``dt``, to nearest even: the interpreter's own cast to
        bfloat16 truncates, so it gets a value bfloat16 holds exactly."""
        if dt == tl.bfloat16:
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            x = b.to(tl.float32, bitcast=True)
        return x.to(dt)

else:

    @triton.jit
    def _to(x, dt: tl.constexpr):
        return x.to(dt)


@helper
def _round(x, dt: tl.constexpr):
    """``x`` (float32) rounded to ``dt`` and back: where torch's ops round between them."""
    return _to(x, dt).to(tl.float32)


@helper
def _silu_parts(x):
    """``(x / (1 + exp(-x)), 1 / (1 + exp(-x)))``, IEEE-rounded divisions (float32)."""
    d = 1.0 + _exp(-x)
    return tl.math.div_rn(x, d), tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), d)


@triton.jit
def _swiglu_fwd_kernel(h_ptr, a_ptr, N, HQ, ALIGN: tl.constexpr, BN: tl.constexpr,
                       BH: tl.constexpr):  # fmt: skip
    """``a [N, Hp] = round(round(silu(gate)) * up)``, ``Hp = HQ * ALIGN``."""
    Hp = HQ * ALIGN
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.program_id(1) * BH + tl.arange(0, BH)
    rows = n.to(tl.int64)
    mask = (n < N)[:, None] & (j < Hp)[None, :]
    src = h_ptr + rows[:, None] * (2 * Hp) + j[None, :]
    dt = a_ptr.dtype.element_ty
    x = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + Hp, mask=mask, other=0.0).to(tl.float32)
    s, _ = _silu_parts(x)
    a = _round(s, dt) * up
    tl.store(a_ptr + rows[:, None] * Hp + j[None, :], _to(a, dt), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(h_ptr, ga_ptr, gh_ptr, N, HQ, ALIGN: tl.constexpr, BN: tl.constexpr,
                       BH: tl.constexpr):  # fmt: skip
    """``gh [N, 2 Hp]``: ``gate``'s gradient (silu_backward of the rounded ``ga * up``), then
    ``up``'s (``ga * round(silu(gate))``)."""
    Hp = HQ * ALIGN
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.program_id(1) * BH + tl.arange(0, BH)
    rows = n.to(tl.int64)
    mask = (n < N)[:, None] & (j < Hp)[None, :]
    at = rows[:, None] * (2 * Hp) + j[None, :]
    dt = gh_ptr.dtype.element_ty
    x = tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + at + Hp, mask=mask, other=0.0).to(tl.float32)
    ga = tl.load(ga_ptr + rows[:, None] * Hp + j[None, :], mask=mask, other=0.0).to(tl.float32)
    s, sig = _silu_parts(x)
    g_up = ga * _round(s, dt)
    g_s = _round(ga * up, dt)
    g_gate = g_s * sig * (1.0 + x * (1.0 - sig))
    tl.store(gh_ptr + at, _to(g_gate, dt), mask=mask)
    tl.store(gh_ptr + at + Hp, _to(g_up, dt), mask=mask)


# ----------------------------------------------------------------------------------- host


def _launch(kernel, N, Hp, *tensors):
    BN, BH, nw = _blocks()
    al = _align(Hp)
    # enable_fp_fusion: multiply-adds contracted to fma as nvcc does in torch's kernels (the
    # default up to Triton 3.9, not after)
    launch(kernel, (cdiv(N, BN), cdiv(Hp, BH)), *tensors, N, Hp // al, ALIGN=al, BN=BN, BH=BH,
           num_warps=nw, enable_fp_fusion=True)  # fmt: skip


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        N, Hp = h.shape[0], h.shape[1] // 2
        a = empty((N, Hp), h)
        _launch(_swiglu_fwd_kernel, N, Hp, h, a)
        ctx.save_for_backward(h)
        return a

    @staticmethod
    @once_differentiable
    def backward(ctx, ga):
        (h,) = ctx.saved_tensors
        N, Hp = h.shape[0], h.shape[1] // 2
        gh = empty(h.shape, h)
        _launch(_swiglu_bwd_kernel, N, Hp, h, ga.contiguous(), gh)
        return gh


def _check(h):
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h: expected a torch.Tensor [..., 2*Hp], got {type(h).__name__}")
    if h.ndim == 0 or h.shape[-1] % 2:
        raise ValueError(f"h: expected shape [..., 2*Hp] (an even last axis), got {tuple(h.shape)}")
    if h.dtype not in DTYPES:
        raise ValueError(
            f"h: expected a dtype among float32, float16, bfloat16, got {h.dtype} "
            "(swiglu_reference serves the others)"
        )
    if h.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"h: expected a CUDA tensor (or TRITON_INTERPRET=1 for the CPU), got device "
            f"{h.device} (swiglu_reference serves it)"
        )


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` ``[..., Hp]`` from ``h [..., 2*Hp]`` (``gate``, then ``up``, along
    the last axis), forward and backward in one Triton kernel each; float32, float16 or
    bfloat16 (in which the result is that of :func:`swiglu_reference` to the dtype's rounding).
    Leading axes are flattened and a non-contiguous ``h`` is copied first.

    >>> h = torch.randn(2, 3, 8, device="cuda", requires_grad=True)  # doctest: +SKIP
    >>> a = swiglu(h)  # doctest: +SKIP
    >>> tuple(a.shape), bool((a - swiglu_reference(h)).abs().max() < 1e-6)  # doctest: +SKIP
    ((2, 3, 4), True)
    >>> a.sum().backward()  # gradients of gate and up in h.grad [2, 3, 8]  # doctest: +SKIP
    """
    _check(h)
    lead, Hp = h.shape[:-1], h.shape[-1] // 2
    if h.numel() == 0:
        return swiglu_reference(h)
    a = _SwiGLU.apply(h.reshape(-1, 2 * Hp).contiguous())
    return a.reshape(*lead, Hp)


def swiglu_reference(h: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` with torch's eager ops, ``(gate, up) = h.chunk(2, dim=-1)``.

    >>> swiglu_reference(torch.tensor([[1.0, -2.0, 3.0, 4.0]])).tolist()  # doctest: +ELLIPSIS
    [[2.19317..., -0.95362...]]
    """
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def _aot_cases(widths=(1368, 1365, 2736), N=16384):
    """The kernel specializations :class:`~kalmanscan.kla.model.SwiGLU` launches on the device,
    for the compile check without a GPU (``python -m kalmanscan.cuda._aot
    kalmanscan.cuda.swiglu``): ``(name, kernel, args, consts, num_warps)`` for each hidden
    width of ``widths`` (d_model 512's 1365 as it is and padded to 1368, and d_model 1024's
    2736) in float32, bfloat16 and float16."""
    BN, BH, nw = GPU_BLOCKS
    cases = []
    for Hp in widths:
        al = _align(Hp)
        consts = dict(ALIGN=al, BN=BN, BH=BH)
        for dt in DTYPES:
            tag = f"Hp{Hp}-{str(dt).removeprefix('torch.')}"
            cases.append((f"swiglu_fwd-{tag}", _swiglu_fwd_kernel,
                          dict(h_ptr=dt, a_ptr=dt, N=N, HQ=Hp // al), consts, nw))  # fmt: skip
            cases.append((f"swiglu_bwd-{tag}", _swiglu_bwd_kernel,
                          dict(h_ptr=dt, ga_ptr=dt, gh_ptr=dt, N=N, HQ=Hp // al), consts,
                          nw))  # fmt: skip
    return cases
