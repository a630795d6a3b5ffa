"""A Triton kernel for the linear-recurrence baseline of the expressivity experiments.

``h_t = a * h_{t-1} + v_t k_t`` per lane ``(b, m, s)`` and ``y_t[m] = sum_s q_t[s] h_t[m, s]``:
KLA's block with a learned, input-independent decay in place of the precision-dependent gain
(models.py, ``LinearRecurrenceLayer``). The torch path there (``decayed_cumsum``) doubles along
time, ``O(L log L)`` work and memory; this kernel walks time once per lane, the state in
registers, like the KLA kernels of ``kalmanscan/cuda/``.

Shapes: ``v [B, L, M]``, ``k, q [B, L, S]``, ``decay [M, S]``, ``h0 [B, M, S]``; returns
``y [B, L, M]`` and the final ``h [B, M, S]``. For the backward the forward keeps every state
``[B, L, M, S]`` (as the torch path does too): a baseline for experiments, not a fused op.
Backward (exact): with ``E`` the adjoint of ``h_t``, ``E_t = E_{t+1} a + gy_t q_t``;
``gv = sum_s E k``, ``gk = sum_m E v``, ``gq = sum_m gy h``, ``gdecay = sum_{b,t} E h_{t-1}``,
``gh0 = a E_1``.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves without triton
    triton = None

__all__ = ["available", "linear_recurrence"]


def available(x: torch.Tensor) -> bool:
    """Whether the kernel can serve ``x`` (triton installed, CUDA tensor or the interpreter)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return triton is not None and (x.is_cuda or interpret)


if triton is not None:
    from kalmanscan.cuda._common import helper

    @helper
    def _tile(pm, M, S: tl.constexpr, SP: tl.constexpr, BM: tl.constexpr):
        """A program's lanes ``[BM channels, SP slots]``: indices, masks and ``m S + s``."""
        m = pm * BM + tl.arange(0, BM)
        s = tl.arange(0, SP)
        mmask = m < M
        smask = s < S
        return m, s, mmask, smask, mmask[:, None] & smask[None, :], m[:, None] * S + s[None, :]

    @triton.jit
    def _fwd_kernel(v_ptr, k_ptr, q_ptr, a_ptr, h0_ptr, y_ptr, hT_ptr, hs_ptr, L, M,
                    S: tl.constexpr, SP: tl.constexpr, BM: tl.constexpr, SAVE: tl.constexpr,
                    NS: tl.constexpr):  # fmt: skip
        pm = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        m, s, mmask, smask, lane, ms = _tile(pm, M, S, SP, BM)
        dt = y_ptr.dtype.element_ty
        a = tl.load(a_ptr + ms, mask=lane, other=0.0).to(dt)
        h = tl.load(h0_ptr + b * M * S + ms, mask=lane, other=0.0).to(dt)
        for t in tl.range(0, L, num_stages=NS):
            row = b * L + t
            v = tl.load(v_ptr + row * M + m, mask=mmask, other=0.0).to(dt)
            kk = tl.load(k_ptr + row * S + s, mask=smask, other=0.0).to(dt)
            qq = tl.load(q_ptr + row * S + s, mask=smask, other=0.0).to(dt)
            h = a * h + v[:, None] * kk[None, :]
            tl.store(y_ptr + row * M + m, tl.sum(qq[None, :] * h, axis=1), mask=mmask)
            if SAVE:
                tl.store(hs_ptr + row * M * S + ms, h, mask=lane)
        tl.store(hT_ptr + b * M * S + ms, h, mask=lane)

    @triton.jit
    def _bwd_kernel(v_ptr, k_ptr, q_ptr, a_ptr, h0_ptr, hs_ptr, gy_ptr, ghT_ptr,
                    gv_ptr, gk_ptr, gq_ptr, ga_ptr, gh0_ptr, L, M, B,
                    S: tl.constexpr, SP: tl.constexpr, BM: tl.constexpr,
                    NS: tl.constexpr):  # fmt: skip
        pm = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        m, s, mmask, smask, lane, ms = _tile(pm, M, S, SP, BM)
        dt = gv_ptr.dtype.element_ty
        a = tl.load(a_ptr + ms, mask=lane, other=0.0).to(dt)
        E = tl.load(ghT_ptr + b * M * S + ms, mask=lane, other=0.0).to(dt)
        ga = tl.zeros([BM, SP], dt)
        part = (pm * B + b) * L * S  # per-program partial sums over the channels
        for j in tl.range(0, L, num_stages=NS):
            t = L - 1 - j
            row = b * L + t
            first = (m * 0 + t) == 0
            v = tl.load(v_ptr + row * M + m, mask=mmask, other=0.0).to(dt)
            gy = tl.load(gy_ptr + row * M + m, mask=mmask, other=0.0).to(dt)
            kk = tl.load(k_ptr + row * S + s, mask=smask, other=0.0).to(dt)
            qq = tl.load(q_ptr + row * S + s, mask=smask, other=0.0).to(dt)
            h = tl.load(hs_ptr + row * M * S + ms, mask=lane, other=0.0).to(dt)
            prev = tl.load(hs_ptr + (row - 1) * M * S + ms, mask=lane & ~first[:, None], other=0.0)
            prev0 = tl.load(h0_ptr + b * M * S + ms, mask=lane & first[:, None], other=0.0)
            h_prev = tl.where(first[:, None], prev0.to(dt), prev.to(dt))
            E = E + gy[:, None] * qq[None, :]
            tl.store(gv_ptr + row * M + m, tl.sum(E * kk[None, :], axis=1), mask=mmask)
            tl.store(gk_ptr + part + t * S + s, tl.sum(E * v[:, None], axis=0), mask=smask)
            tl.store(gq_ptr + part + t * S + s, tl.sum(gy[:, None] * h, axis=0), mask=smask)
            ga += E * h_prev
            E = a * E
        tl.store(ga_ptr + b * M * S + ms, ga, mask=lane)
        tl.store(gh0_ptr + b * M * S + ms, E, mask=lane)


def _config(S: int, M: int):
    SP = triton.next_power_of_2(S)
    BM = max(1, min(triton.next_power_of_2(M), 128 // SP))
    return SP, BM, max(1, min(4, BM * SP // 32))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, k, q, decay, h0):
        B, L, M = v.shape
        S = k.shape[-1]
        SP, BM, warps = _config(S, M)
        save = any(ctx.needs_input_grad)
        y = torch.empty_like(v)
        hT = torch.empty_like(h0)
        hs = torch.empty((B, L, M, S), dtype=v.dtype, device=v.device) if save else y
        grid = (triton.cdiv(M, BM), B)
        _fwd_kernel[grid](v, k, q, decay, h0, y, hT, hs, L, M, S=S, SP=SP, BM=BM, SAVE=save,
                          NS=3, num_warps=warps)  # fmt: skip
        if save:
            ctx.save_for_backward(v, k, q, decay, h0, hs)
        return y, hT

    @staticmethod
    def backward(ctx, gy, ghT):
        v, k, q, decay, h0, hs = ctx.saved_tensors
        B, L, M = v.shape
        S = k.shape[-1]
        SP, BM, warps = _config(S, M)
        nmb = triton.cdiv(M, BM)
        gy = torch.zeros_like(v) if gy is None else gy.contiguous()
        ghT = torch.zeros_like(h0) if ghT is None else ghT.contiguous()
        gv = torch.empty_like(v)
        gk = torch.empty((nmb, B, L, S), dtype=v.dtype, device=v.device)
        gq = torch.empty_like(gk)
        ga = torch.empty_like(h0)
        gh0 = torch.empty_like(h0)
        _bwd_kernel[(nmb, B)](v, k, q, decay, h0, hs, gy, ghT, gv, gk, gq, ga, gh0, L, M, B,
                              S=S, SP=SP, BM=BM, NS=3, num_warps=warps)  # fmt: skip
        return gv, gk.sum(0), gq.sum(0), ga.sum(0), gh0


def linear_recurrence(v, k, q, decay, h0=None):
    """``(y [B, L, M], h_L [B, M, S])`` of ``h_t = decay * h_{t-1} + v_t k_t``, ``y = q . h``.

    ``v [B, L, M]``, ``k, q [B, L, S]``, ``decay [M, S]``, ``h0 [B, M, S]`` (zeros if None); one
    floating dtype (float32 or float64), differentiable in every input.

    >>> import torch  # doctest: +SKIP
    >>> y, h = linear_recurrence(torch.ones(1, 3, 1, device="cuda"),
    ...                          torch.ones(1, 3, 1, device="cuda"),
    ...                          torch.ones(1, 3, 1, device="cuda"),
    ...                          torch.full((1, 1), 0.5, device="cuda"))
    >>> y[0, :, 0].tolist()  # doctest: +SKIP
    [1.0, 1.5, 1.75]
    """
    B, L, M = v.shape
    S = k.shape[-1]
    if h0 is None:
        h0 = torch.zeros(B, M, S, dtype=v.dtype, device=v.device)
    dtype = v.dtype
    args = [x.to(dtype).contiguous() for x in (v, k, q, decay, h0)]
    return _Linear.apply(*args)
