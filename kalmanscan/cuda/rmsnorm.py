"""RMSNorm over the last axis as two fused Triton kernels (forward, backward), with an exact
backward that reads its inputs once and sums the weight's gradient without atomics.

Shapes: ``x [..., D]`` flattened to ``N`` rows of ``D`` (made contiguous), ``weight [D]``,
``rstd [N]`` float32, ``eps`` a float. Math in float32, whatever ``x``'s dtype
(float32, bfloat16, float16)::

    rstd = 1 / sqrt(mean(x**2) + eps)                 (per row)
    y    = x * rstd * weight                          (in x's dtype)
    gx   = rstd * (weight * gy - x * rstd**2 * mean(weight * gy * x))
    gw   = sum over rows of gy * x * rstd

- Forward (``_rms_fwd_kernel``): a program normalizes ``BR`` rows with the whole row in
  registers (``next_pow2(D)`` columns, masked), writes ``y`` and saves ``rstd`` for the
  backward, so the backward does not recompute it.
- Backward (``_rms_bwd_kernel``): a program walks ``NT`` tiles of ``BR`` rows, reads ``x`` and
  ``gy`` once, writes ``gx``, and keeps the weight-gradient terms of its rows in registers; it
  writes their sum over its rows as one row of a ``[P, D]`` float32 buffer (``P = N / (NT*BR)``
  programs), which one ``torch.sum`` reduces in a fixed order: deterministic, no atomics.

Against torch's ``F.rms_norm`` on CUDA (a ``layer_norm_grad_input`` kernel plus a separate
``GammaBetaBackward`` kernel that reads ``x`` and ``gy`` again) the backward is one pass over
the data. H200, N = 16384, D = 512, float32: device time 16 us forward, 29 + 6 us backward
(kernel, then the weight gradient's sum) against torch's 23 and 26 + 55; the results equal
torch's to 1.7e-7 (``y``, ``gx``) and 4.1e-7 (``gw``) relative, and are as close to the
float64 formula as torch's. The host time a call is larger than torch's (an autograd Function
in Python and a Triton launch: about 80 us forward and 280 us backward on that machine's host,
against torch's 26 and 98), so calls back to back with nothing else queued on the GPU are
host-bound; in a step whose GPU queue runs ahead of the host the device time is what counts
(``python benchmarks/rmsnorm_fused.py --profile --out
benchmarks/results/rmsnorm-fused-h200.json``).

``kalmanscan.kla.model.RMSNorm`` uses :func:`rms_norm` with ``RMSNorm.fused = "auto"`` (its
default: on CUDA from ``RMSNorm.fused_min_rows`` rows a call) or ``"fused"``; its eager path and
:func:`rms_norm_ref` are the references it is tested against (tests/test_rmsnorm_fused.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kalmanscan.cuda._common import cdiv, empty, interpreting, launch, next_pow2

# Launch shapes on the device: the forward's ``(tile elements, num_warps)``, the backward's
# ``(tile elements, tiles a program, num_warps)``. A tile is ``BR = tile // next_pow2(D)`` rows
# (at least 1); wider rows get more warps (``tile / 1024`` elements a warp at most 32 a thread).
GPU_FWD = (4096, 4)
GPU_BWD = (4096, 8, 4)

SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)


def _tile(BD: int, tile: int, nw: int):
    """``(BR, num_warps)``: rows of ``BD`` columns in a ``tile``-element tile (at least 1) and
    the warps for it (``nw`` at least, ``tile / 1024`` elements a warp at most, 16 at most)."""
    BR = max(1, tile // BD)
    return BR, min(16, max(nw, BR * BD // 1024))


def _fwd_config(D: int, interp: bool | None = None):
    """``(BR, BD, num_warps)`` of the forward for rows of ``D`` (small when interpreting)."""
    BD = next_pow2(D)
    if interpreting() if interp is None else interp:
        return 4, BD, 1
    BR, nw = _tile(BD, *GPU_FWD)
    return BR, BD, nw


def _bwd_config(D: int, interp: bool | None = None):
    """``(BR, NT, BD, num_warps)`` of the backward: ``NT`` tiles of ``BR`` rows a program."""
    BD = next_pow2(D)
    if interpreting() if interp is None else interp:
        return 4, 2, BD, 1
    tile, NT, nw = GPU_BWD
    BR, nw = _tile(BD, tile, nw)
    return BR, NT, BD, nw


# ----------------------------------------------------------------------------------- device


@triton.jit
def _rms_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, N, D, eps, BR: tl.constexpr,
                    BD: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    rmask = rows < N
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    at = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) / D
    rstd = tl.div_rn(tl.full([BR], 1.0, tl.float32), tl.sqrt_rn(ms + eps))
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _rms_bwd_kernel(x_ptr, w_ptr, rstd_ptr, gy_ptr, gx_ptr, gw_ptr, N, D, BR: tl.constexpr,
                    NT: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    cmask = cols < D
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)  # gy * x * rstd of this program's rows, by tile row
    for t in range(NT):
        rows = (pid * NT + t) * BR + tl.arange(0, BR)
        rmask = rows < N
        mask = rmask[:, None] & cmask[None, :]
        at = rows.to(tl.int64)[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        gy = tl.load(gy_ptr + at, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xh = x * rstd[:, None]
        wg = gy * w[None, :]
        c = tl.sum(wg * xh, axis=1) / D  # rstd * mean(w * gy * x)
        gx = rstd[:, None] * (wg - xh * c[:, None])
        tl.store(gx_ptr + at, gx.to(gx_ptr.dtype.element_ty), mask=mask)
        acc += gy * xh
    tl.store(gw_ptr + pid.to(tl.int64) * D + cols, tl.sum(acc, axis=0), mask=cmask)


# ----------------------------------------------------------------------------------- host


class _RMSNorm(torch.autograd.Function):
    # (no reshape or view of the tensors: each is a few microseconds of host time a call, and
    # the kernels see a contiguous [..., D] as its N rows of D)
    @staticmethod
    def forward(ctx, x, weight, eps):
        if not x.is_contiguous():
            x = x.contiguous()
        D = x.shape[-1]
        N = x.numel() // D if D else 0
        y = empty(x.shape, x)
        rstd = empty((N,), dtype=torch.float32, device=x.device)
        if N:
            BR, BD, nw = _fwd_config(D)
            launch(_rms_fwd_kernel, (cdiv(N, BR),), x, weight, y, rstd, N, D, eps, BR=BR, BD=BD,
                   num_warps=nw)  # fmt: skip
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, weight, rstd = ctx.saved_tensors
        D = x.shape[-1]
        N = rstd.shape[0]
        if not gy.is_contiguous():
            gy = gy.contiguous()
        gx = empty(x.shape, x)
        if N:
            BR, NT, BD, nw = _bwd_config(D)
            P = cdiv(N, BR * NT)
            gwp = empty((P, D), dtype=torch.float32, device=x.device)
            launch(_rms_bwd_kernel, (P,), x, weight, rstd, gy, gx, gwp, N, D, BR=BR, NT=NT, BD=BD,
                   num_warps=nw)  # fmt: skip
            gw = gwp.sum(0)
        else:
            gw = torch.zeros((D,), dtype=torch.float32, device=x.device)
        need_x, need_w, _ = ctx.needs_input_grad
        return gx if need_x else None, gw.to(weight.dtype) if need_w else None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last axis, ``[..., D]`` in ``x``'s
    dtype, computed in float32, through the fused kernels (forward and backward; gradients for
    ``x`` and ``weight``). ``x``: float32, bfloat16 or float16 on CUDA (the CPU under
    ``TRITON_INTERPRET=1``), any strides; ``weight [D]`` of those dtypes; ``eps >= 0``.
    float64 is not served here: ``torch.nn.functional.rms_norm`` (or ``RMSNorm`` with
    ``fused = "eager"``) computes it. Equal to ``F.rms_norm`` to float32 rounding.

    >>> import torch
    >>> from kalmanscan.cuda.rmsnorm import rms_norm
    >>> x = torch.randn(8, 2048, 512, device="cuda", requires_grad=True)  # doctest: +SKIP
    >>> w = torch.ones(512, device="cuda", requires_grad=True)  # doctest: +SKIP
    >>> rms_norm(x, w).sum().backward()  # doctest: +SKIP
    >>> tuple(x.grad.shape), tuple(w.grad.shape)  # doctest: +SKIP
    ((8, 2048, 512), (512,))
    """
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED:
            raise ValueError(
                f"{name}: expected a dtype among float32, bfloat16, float16, got {t.dtype} "
                "(torch.nn.functional.rms_norm serves the others)"
            )
    if x.dim() < 1:
        raise ValueError(f"x: expected at least 1 dimension [..., D], got shape {tuple(x.shape)}")
    D = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != D:
        raise ValueError(f"weight: expected shape ({D},) (x's last axis), got "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight.device != x.device:
        raise ValueError(f"weight: expected x's device {x.device}, got {weight.device}")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"x: expected a CUDA tensor (or TRITON_INTERPRET=1 for the CPU), got device "
            f"{x.device} (torch.nn.functional.rms_norm serves it)"
        )
    eps = float(eps)
    if not eps >= 0.0 or eps == float("inf"):
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    return _RMSNorm.apply(x, weight.contiguous(), eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """The reference: the formula in float64, ``[..., D]`` float64 (differentiable), against
    which the kernels and torch's ``F.rms_norm`` are checked.

    >>> import torch
    >>> rms_norm_ref(torch.ones(2, 4), torch.ones(4), eps=0.0).tolist()[0]
    [1.0, 1.0, 1.0, 1.0]
    """
    xd = x.to(torch.float64)
    return xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps) * weight.to(torch.float64)


def _aot_cases(shapes=((16384, 512), (16384, 1000), (4096, 4096))):
    """The kernel specializations ``RMSNorm`` launches on the device, for the compile check
    without a GPU (``python -m kalmanscan.cuda._aot kalmanscan.cuda.rmsnorm``): each
    ``(N, D)`` of ``shapes`` with float32, bfloat16 and float16 activations, float32 weight."""
    f32 = torch.float32
    cases = []
    for N, D in shapes:
        for dt in SUPPORTED:
            tag = f"N{N}-D{D}-{str(dt).removeprefix('torch.')}"
            BR, BD, nw = _fwd_config(D, interp=False)
            cases.append((f"rms_fwd-{tag}", _rms_fwd_kernel,
                          dict(x_ptr=dt, w_ptr=f32, y_ptr=dt, rstd_ptr=f32, N=N, D=D, eps=1e-5),
                          dict(BR=BR, BD=BD), nw))  # fmt: skip
            BR, NT, BD, nw = _bwd_config(D, interp=False)
            cases.append((f"rms_bwd-{tag}", _rms_bwd_kernel,
                          dict(x_ptr=dt, w_ptr=f32, rstd_ptr=f32, gy_ptr=dt, gx_ptr=dt,
                               gw_ptr=f32, N=N, D=D),
                          dict(BR=BR, NT=NT, BD=BD), nw))  # fmt: skip
    return cases
