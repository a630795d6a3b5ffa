"""Triton kernels of the KLA layer's causal conv + SiLU, forward and backward
(:func:`kalmanscan.cuda.kla.glue.conv_silu`), with their device helpers.

Shapes as in :mod:`kalmanscan.cuda.kla.glue`: the conv reads the first ``M`` columns of
``zg [B, L, 2M]`` (row stride ``ZS``), ``weight [M, 1, K]`` (read as ``[M, K]``), ``bias [M]``,
and writes ``zc [B, L, M]``; its backward writes the first ``M`` columns of ``gz``.

- forward: ``_glue_conv_fwd_kernel`` (a tile of tokens read at each of the ``K`` shifts, any
  ``K``) or ``_glue_conv_fwd_walk_kernel`` (``K <= 4``: a program walks its tokens in blocks
  of 4, each input loaded once);
- backward: ``_glue_conv_walk_kernel`` (one pass, ``K <= 4``) or ``_glue_conv_gpre_kernel``
  then ``_glue_conv_gz_kernel`` (two passes, any ``K``); ``_glue_conv_sums_kernel`` adds
  either form's partial sums of the weight's and bias's gradients.

The launch blocks, the choice between the forms and the launches: the host code in
:mod:`kalmanscan.cuda.kla.glue`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper
from kalmanscan.cuda.filter.kernels import rcp as _rcp


@helper
def _conv_sigmoid(pre):
    """``sigmoid(pre)`` for the conv's SiLU and its slope, every conv kernel alike (so the walks
    equal the tile and two-pass kernels bit for bit): one hardware reciprocal (relative error
    below 2^-22), where a division takes about 8 instructions more an element."""
    return _rcp(1.0 + tl.exp(-pre))


@triton.jit
def _glue_conv_fwd_kernel(zg_ptr, w_ptr, b_ptr, out_ptr, L, M, ZS,
                     K: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr):  # fmt: skip
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = pid_t * BT + tl.arange(0, BT)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    rows = (b * L + t).to(tl.int64)
    acc = (
        tl.zeros((BT, BM), tl.float32)
        + tl.load(b_ptr + m, mask=mmask, other=0.0).to(tl.float32)[None, :]
    )
    for j in tl.static_range(K):
        w = tl.load(w_ptr + m * K + j, mask=mmask, other=0.0).to(tl.float32)
        ok = ((t + j - (K - 1)) >= 0) & (t < L)
        x = tl.load(zg_ptr + (rows + (j - (K - 1)))[:, None] * ZS + m[None, :],
                    mask=ok[:, None] & mmask[None, :], other=0.0)  # fmt: skip
        acc += w[None, :] * x.to(tl.float32)
    sg = _conv_sigmoid(acc)
    omask = (t < L)[:, None] & mmask[None, :]
    tl.store(out_ptr + rows[:, None] * M + m[None, :], (acc * sg).to(out_ptr.dtype.element_ty),
             mask=omask)  # fmt: skip


@helper
def _conv_taps(w_ptr, b_ptr, m, mmask, K: tl.constexpr, BM: tl.constexpr):
    """``(bias, w0, w1, w2, w3)`` of channels ``m`` in float32: tap j of the conv multiplies
    ``z[t + j - (K - 1)]``, so ``w3`` is the current token's, ``w2`` the one before's, ... (taps
    past ``K`` are 0)."""
    bias = tl.load(b_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + m * K + (K - 1), mask=mmask, other=0.0).to(tl.float32)
    w2 = tl.zeros((BM,), tl.float32)
    w1 = tl.zeros((BM,), tl.float32)
    w0 = tl.zeros((BM,), tl.float32)
    if K >= 2:
        w2 = tl.load(w_ptr + m * K + (K - 2), mask=mmask, other=0.0).to(tl.float32)
    if K >= 3:
        w1 = tl.load(w_ptr + m * K + (K - 3), mask=mmask, other=0.0).to(tl.float32)
    if K >= 4:
        w0 = tl.load(w_ptr + m * K + (K - 4), mask=mmask, other=0.0).to(tl.float32)
    return bias, w0, w1, w2, w3


@helper
def _walk_start(zrow, r0, t0, m, mmask, ZS):
    """The 3 inputs before token ``t0`` (row ``r0``), latest first, in float32 (zeros before
    the sequence's start)."""
    tv0 = m * 0 + t0  # (masks as vectors)
    zp1 = tl.load(zrow + (r0 - 1) * ZS, mask=mmask & (tv0 >= 1), other=0.0).to(tl.float32)
    zp2 = tl.load(zrow + (r0 - 2) * ZS, mask=mmask & (tv0 >= 2), other=0.0).to(tl.float32)
    zp3 = tl.load(zrow + (r0 - 3) * ZS, mask=mmask & (tv0 >= 3), other=0.0).to(tl.float32)
    return zp1, zp2, zp3


@helper
def _conv_pre(zt, z2, z1, z0, bias, w0, w1, w2, w3, K: tl.constexpr):
    """The conv's pre-activation from the token's input ``zt`` and the 3 before it (``z2`` the
    latest), the taps in ``_glue_conv_fwd_kernel``'s order."""
    pre = bias + 0.0
    if K >= 4:
        pre += w0 * z0
    if K >= 3:
        pre += w1 * z1
    if K >= 2:
        pre += w2 * z2
    pre += w3 * zt
    return pre


@helper
def _fwd_walk_token(zt, z2, z1, z0, t, m, mmask, L, bias, w0, w1, w2, w3, out_ptr, base, M,
                    K: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """Token ``t`` of the conv forward's walk: ``silu(pre)`` from the token's input and the 3
    before it (the taps in ``_glue_conv_fwd_kernel``'s order), stored (``FULL``: ``t`` is
    inside ``L``, no token condition)."""
    pre = _conv_pre(zt, z2, z1, z0, bias, w0, w1, w2, w3, K)
    sg = _conv_sigmoid(pre)
    smask = mmask if FULL else mmask & ((m * 0 + t) < L)
    tl.store(out_ptr + (base + t) * M + m, (pre * sg).to(out_ptr.dtype.element_ty),
             mask=smask)  # fmt: skip


@helper
def _fwd_walk_block(t, za, zb, zc, zd, zp1, zp2, zp3, zrow, m, mmask, L, bias, w0, w1, w2, w3,
                    out_ptr, base, M, ZS, K: tl.constexpr, FULL: tl.constexpr,
                    NEXT: tl.constexpr):  # fmt: skip
    """The 4 tokens from ``t`` of the conv forward's walk (inputs ``za .. zd``, the 3 before
    them ``zp1 .. zp3``, latest first), the next block's inputs loaded first (``NEXT``; else
    zeros): ``(next 4 inputs, the 3 before them)``. ``FULL``: every token loaded and stored
    is inside ``L``, so no token conditions."""
    if NEXT:
        r = base + t
        na = _walk_z(zrow, r + 4, t + 4, m, mmask, L, ZS, FULL)
        nb = _walk_z(zrow, r + 5, t + 5, m, mmask, L, ZS, FULL)
        nc = _walk_z(zrow, r + 6, t + 6, m, mmask, L, ZS, FULL)
        nd = _walk_z(zrow, r + 7, t + 7, m, mmask, L, ZS, FULL)
    else:  # (the program's last block: what it returns for a next one is not read)
        zero = tl.zeros_like(za)
        na, nb, nc, nd = zero, zero, zero, zero
    _fwd_walk_token(za, zp1, zp2, zp3, t, m, mmask, L, bias, w0, w1, w2, w3, out_ptr, base, M,
                    K, FULL)  # fmt: skip
    _fwd_walk_token(zb, za, zp1, zp2, t + 1, m, mmask, L, bias, w0, w1, w2, w3, out_ptr, base,
                    M, K, FULL)  # fmt: skip
    _fwd_walk_token(zc, zb, za, zp1, t + 2, m, mmask, L, bias, w0, w1, w2, w3, out_ptr, base,
                    M, K, FULL)  # fmt: skip
    _fwd_walk_token(zd, zc, zb, za, t + 3, m, mmask, L, bias, w0, w1, w2, w3, out_ptr, base,
                    M, K, FULL)  # fmt: skip
    return na, nb, nc, nd, zd, zc, zb


@triton.jit
def _glue_conv_fwd_walk_kernel(zg_ptr, w_ptr, b_ptr, out_ptr, L, M, ZS, K: tl.constexpr,
                               TP: tl.constexpr, BM: tl.constexpr):  # fmt: skip
    """The conv forward (``K <= 4``) as a walk: a program walks tokens ``t0 .. t0 + TP - 1``
    (``t0 = program_id(0) TP``) of ``BM`` channels in blocks of 4, each input loaded once
    (the 3 before a block carried in registers, where ``_glue_conv_fwd_kernel`` loads its tile
    at each of the ``K`` shifts), a block's loads issued before the block before it is walked;
    the same arithmetic as that kernel."""
    tl.static_assert(TP % 4 == 0, "a program's tokens are whole blocks of 4")
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    t0 = pid_t * TP
    bias, w0, w1, w2, w3 = _conv_taps(w_ptr, b_ptr, m, mmask, K, BM)
    base = b.to(tl.int64) * L
    zrow = zg_ptr + m
    r0 = base + t0
    zp1, zp2, zp3 = _walk_start(zrow, r0, t0, m, mmask, ZS)
    za = _walk_z(zrow, r0, t0, m, mmask, L, ZS)
    zb = _walk_z(zrow, r0 + 1, t0 + 1, m, mmask, L, ZS)
    zc = _walk_z(zrow, r0 + 2, t0 + 2, m, mmask, L, ZS)
    zd = _walk_z(zrow, r0 + 3, t0 + 3, m, mmask, L, ZS)
    if t0 + TP <= L:  # every token of the program inside L: no token conditions
        for t in tl.range(t0, t0 + TP - 4, 4):
            za, zb, zc, zd, zp1, zp2, zp3 = _fwd_walk_block(
                t, za, zb, zc, zd, zp1, zp2, zp3, zrow, m, mmask, L, bias, w0, w1, w2, w3,
                out_ptr, base, M, ZS, K, True, True)  # fmt: skip
        _fwd_walk_block(t0 + TP - 4, za, zb, zc, zd, zp1, zp2, zp3, zrow, m, mmask, L, bias, w0,
                        w1, w2, w3, out_ptr, base, M, ZS, K, True, False)  # fmt: skip
    else:
        for t in tl.range(t0, tl.minimum(t0 + TP, L), 4):
            za, zb, zc, zd, zp1, zp2, zp3 = _fwd_walk_block(
                t, za, zb, zc, zd, zp1, zp2, zp3, zrow, m, mmask, L, bias, w0, w1, w2, w3,
                out_ptr, base, M, ZS, K, False, True)  # fmt: skip


@triton.jit
def _glue_conv_gpre_kernel(zg_ptr, w_ptr, b_ptr, g_ptr, g2_ptr, gp_ptr, gw_ptr, gb_ptr, L, M, ZS,
                           NP, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr,
                           BM: tl.constexpr, NI: tl.constexpr):  # fmt: skip
    """The conv's backward, first pass: ``gpre = (g + g2) * silu'(pre)`` at every token
    (``g2``: the skip's gradient), ``pre`` recomputed from the ``K`` inputs it reads, which also
    give the partial sums of ``gw`` and ``gb``; ``gpre`` float32 to ``gp [B, L, M]``. A program
    walks ``NI`` tiles of ``BT`` tokens, adding the weights' terms elementwise in registers
    (``KP = next_pow2(K)`` planes), and sums them over its tokens once at the end: partial
    ``program_id(0)`` of ``NP`` of batch row ``b``."""
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    bias = tl.load(b_ptr + m, mask=mmask, other=0.0).to(tl.float32)
    jj = tl.arange(0, KP)
    acc_b = tl.zeros((BT, BM), tl.float32)
    acc_w = tl.zeros((KP, BT, BM), tl.float32)
    for i in tl.static_range(NI):
        t = (pid_t * NI + i) * BT + tl.arange(0, BT)
        rows = (b * L + t).to(tl.int64)
        inside = (t < L)[:, None] & mmask[None, :]
        pre = tl.zeros((BT, BM), tl.float32) + bias[None, :]
        for j in tl.static_range(K):
            w = tl.load(w_ptr + m * K + j, mask=mmask, other=0.0).to(tl.float32)
            ok = ((t + j - (K - 1)) >= 0) & (t < L)
            x = tl.load(zg_ptr + (rows + (j - (K - 1)))[:, None] * ZS + m[None, :],
                        mask=ok[:, None] & mmask[None, :], other=0.0)  # fmt: skip
            pre += w[None, :] * x.to(tl.float32)
        at = rows[:, None] * M + m[None, :]
        g = tl.load(g_ptr + at, mask=inside, other=0.0).to(tl.float32)
        g += tl.load(g2_ptr + at, mask=inside, other=0.0).to(tl.float32)
        sg = _conv_sigmoid(pre)
        gp = tl.where(inside, g * sg * (1.0 + pre * (1.0 - sg)), 0.0)
        tl.store(gp_ptr + at, gp, mask=inside)
        acc_b += gp
        for j in tl.static_range(K):  # (the same addresses as above: cache hits)
            ok = ((t + j - (K - 1)) >= 0) & (t < L)
            x = tl.load(zg_ptr + (rows + (j - (K - 1)))[:, None] * ZS + m[None, :],
                        mask=ok[:, None] & mmask[None, :], other=0.0)  # fmt: skip
            term = (gp * x.to(tl.float32))[None, :, :]
            acc_w += tl.where((jj == j)[:, None, None], term, 0.0)
    part = (b * NP + pid_t).to(tl.int64)
    tl.store(gb_ptr + part * M + m, tl.sum(acc_b, axis=0), mask=mmask)
    tl.store(gw_ptr + (part * K + jj[:, None]) * M + m[None, :], tl.sum(acc_w, axis=1),
             mask=(jj < K)[:, None] & mmask[None, :])  # fmt: skip


@helper
def _walk_z(zrow, row, t, m, mmask, L, ZS, FULL: tl.constexpr = False):
    """Token ``t``'s input ``z`` (row ``row``) in float32, zeros past ``L`` (``FULL``: ``t`` is
    inside ``L``)."""
    inside = mmask if FULL else mmask & ((m * 0 + t) < L)
    return tl.load(zrow + row * ZS, mask=inside, other=0.0).to(tl.float32)


@helper
def _walk_loads(zrow, g_ptr, g2_ptr, row, t, m, mmask, L, M, ZS, FULL: tl.constexpr = False):
    """Token ``t``'s input ``z`` and its gradient ``g + g2`` (float32; zeros past ``L``;
    ``FULL``: ``t`` is inside ``L``)."""
    inside = mmask if FULL else mmask & ((m * 0 + t) < L)
    zt = _walk_z(zrow, row, t, m, mmask, L, ZS, FULL)
    g = tl.load(g_ptr + row * M + m, mask=inside, other=0.0).to(tl.float32)
    g += tl.load(g2_ptr + row * M + m, mask=inside, other=0.0).to(tl.float32)
    return zt, g


@helper
def _walk_token(t, zt, z2, z1, z0, g, m, mmask, L, t0, t_own, bias, w0, w1, w2, w3, gp0, gp1,
                gp2, ab, a0, a1, a2, a3, gz_ptr, base, ZS, K: tl.constexpr,
                FULL: tl.constexpr):  # fmt: skip
    """One token of the conv's one-pass backward: ``gpre`` from the pre-activation (inputs
    ``zt`` and the 3 before it), its terms of the weights' and bias's sums where the token is
    the program's own, and ``gz`` of token ``t - 3`` from the last 4 ``gpre``; returns the
    carried values shifted by one token. ``FULL``: ``t`` and ``t - 3`` are the program's own
    tokens (no token conditions; outside the channels ``g`` is 0, and so is ``gpre``)."""
    pre = _conv_pre(zt, z2, z1, z0, bias, w0, w1, w2, w3, K)  # (the forward's order)
    sg = _conv_sigmoid(pre)
    gpt = g * sg * (1.0 + pre * (1.0 - sg))
    if FULL:
        own = gpt
        smask = mmask
    else:
        tv = m * 0 + t
        gpt = tl.where(mmask & (tv < L), gpt, 0.0)
        own = tl.where(tv < t_own, gpt, 0.0)
        tz = tv - 3
        smask = mmask & (tz >= t0) & (tz < t_own)
    ab += own
    a3 += own * zt
    if K >= 2:
        a2 += own * z2
    if K >= 3:
        a1 += own * z1
    if K >= 4:
        a0 += own * z0
    # gz[t - 3]: sum_d w[K-1-d] gpre[t - 3 + d], in the order of the two-pass form
    gz = w3 * gp0
    if K >= 2:
        gz += w2 * gp1
    if K >= 3:
        gz += w1 * gp2
    if K >= 4:
        gz += w0 * gpt
    tl.store(gz_ptr + (base + t - 3) * ZS + m, gz.to(gz_ptr.dtype.element_ty), mask=smask)
    return gp1, gp2, gpt, ab, a0, a1, a2, a3


@helper
def _walk_block(t, za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab, a0, a1, a2,
                a3, zrow, g_ptr, g2_ptr, gz_ptr, m, mmask, L, M, ZS, t0, t_own, base, bias, w0,
                w1, w2, w3, K: tl.constexpr, FULL: tl.constexpr,
                NEXT: tl.constexpr):  # fmt: skip
    """The 4 tokens from ``t`` of the conv's one-pass backward (``_walk_token``; inputs ``za ..
    zd``, gradients ``ga .. gd``, the 3 inputs before them ``zp1 .. zp3``, latest first), the
    next block's loads issued first (``NEXT``; else zeros): the next block's inputs and
    gradients, the 3 inputs before them and the carried sums. ``FULL``: every token loaded,
    walked and stored is the program's own and inside ``L``."""
    if NEXT:
        r = base + t
        na, nga = _walk_loads(zrow, g_ptr, g2_ptr, r + 4, t + 4, m, mmask, L, M, ZS, FULL)
        nb, ngb = _walk_loads(zrow, g_ptr, g2_ptr, r + 5, t + 5, m, mmask, L, M, ZS, FULL)
        nc, ngc = _walk_loads(zrow, g_ptr, g2_ptr, r + 6, t + 6, m, mmask, L, M, ZS, FULL)
        nd, ngd = _walk_loads(zrow, g_ptr, g2_ptr, r + 7, t + 7, m, mmask, L, M, ZS, FULL)
    else:  # (the program's last block: what it returns for a next one is not read)
        zero = tl.zeros_like(za)
        na, nb, nc, nd, nga, ngb, ngc, ngd = zero, zero, zero, zero, zero, zero, zero, zero
    gp0, gp1, gp2, ab, a0, a1, a2, a3 = _walk_token(
        t, za, zp1, zp2, zp3, ga, m, mmask, L, t0, t_own, bias, w0, w1, w2, w3, gp0, gp1, gp2,
        ab, a0, a1, a2, a3, gz_ptr, base, ZS, K, FULL)  # fmt: skip
    gp0, gp1, gp2, ab, a0, a1, a2, a3 = _walk_token(
        t + 1, zb, za, zp1, zp2, gb, m, mmask, L, t0, t_own, bias, w0, w1, w2, w3, gp0, gp1,
        gp2, ab, a0, a1, a2, a3, gz_ptr, base, ZS, K, FULL)  # fmt: skip
    gp0, gp1, gp2, ab, a0, a1, a2, a3 = _walk_token(
        t + 2, zc, zb, za, zp1, gc, m, mmask, L, t0, t_own, bias, w0, w1, w2, w3, gp0, gp1,
        gp2, ab, a0, a1, a2, a3, gz_ptr, base, ZS, K, FULL)  # fmt: skip
    gp0, gp1, gp2, ab, a0, a1, a2, a3 = _walk_token(
        t + 3, zd, zc, zb, za, gd, m, mmask, L, t0, t_own, bias, w0, w1, w2, w3, gp0, gp1,
        gp2, ab, a0, a1, a2, a3, gz_ptr, base, ZS, K, FULL)  # fmt: skip
    return (na, nb, nc, nd, nga, ngb, ngc, ngd, zd, zc, zb, gp0, gp1, gp2, ab, a0, a1, a2,
            a3)  # fmt: skip


@triton.jit
def _glue_conv_walk_kernel(zg_ptr, w_ptr, b_ptr, g_ptr, g2_ptr, gz_ptr, gw_ptr, gb_ptr, L, M, ZS,
                           NP, K: tl.constexpr, TP: tl.constexpr, BM: tl.constexpr,
                           NS: tl.constexpr):  # fmt: skip
    """The conv's backward in one pass (``K <= 4``): a program walks tokens ``t0 .. t0 + TP +
    2`` of ``BM`` channels of batch row ``b`` (``t0 = program_id(0) TP``), each thread its
    channels, in blocks of 4 tokens: at each token the pre-activation from the token's and the
    3 previous inputs (carried in registers), ``gpre = (g + g2) silu'(pre)``, the weights' and
    bias's gradient terms added in the thread (no reduction across threads; the program's
    partial sums, ``NP`` a batch row, stored at the end), and ``gz[t - 3] = sum_d w[K-1-d]
    gpre[t - 3 + d]`` from the last 4 ``gpre``, carried in registers, into the first ``M``
    columns of ``gz [B, L, ZS]``. The 3 tokens past the program's own are computed again for
    ``gz``, not added to the sums (the blocks round ``TP + 3`` up to a multiple of 4: the
    tokens past it are walked with their stores and sums masked off). No ``[B, L, M]``
    float32 ``gpre`` is written. A block's loads (4 tokens' ``z``, ``g``, ``g2``) are issued
    before the block before it is walked, so that a block waits on memory once and not each
    token (Triton's software pipeline leaves this loop's loads as they are: no ``cp.async`` in
    its sm_90 build).

    (The carried values start as distinct tensors: Triton takes a name for loop-carried only
    where the loop rebinds it to another object than it had before the loop, so ``gp0 = gp1``
    with both starting as one ``zero`` would make ``gp0`` a constant; a test compiles the
    kernel and checks its loop's carried values.)"""
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    t0 = pid_t * TP
    t_own = tl.minimum(t0 + TP, L)  # the program's tokens: t0 .. t_own - 1
    bias, w0, w1, w2, w3 = _conv_taps(w_ptr, b_ptr, m, mmask, K, BM)
    base = b.to(tl.int64) * L
    zrow = zg_ptr + m
    r0 = base + t0
    zp1, zp2, zp3 = _walk_start(zrow, r0, t0, m, mmask, ZS)
    gp0 = tl.zeros((BM,), tl.float32)  # gpre at t - 3, t - 2, t - 1 (distinct: see above)
    gp1 = tl.zeros((BM,), tl.float32)
    gp2 = tl.zeros((BM,), tl.float32)
    ab = tl.zeros((BM,), tl.float32)
    a0 = tl.zeros((BM,), tl.float32)
    a1 = tl.zeros((BM,), tl.float32)
    a2 = tl.zeros((BM,), tl.float32)
    a3 = tl.zeros((BM,), tl.float32)
    # the first block's loads
    za, ga = _walk_loads(zrow, g_ptr, g2_ptr, r0, t0, m, mmask, L, M, ZS)
    zb, gb = _walk_loads(zrow, g_ptr, g2_ptr, r0 + 1, t0 + 1, m, mmask, L, M, ZS)
    zc, gc = _walk_loads(zrow, g_ptr, g2_ptr, r0 + 2, t0 + 2, m, mmask, L, M, ZS)
    zd, gd = _walk_loads(zrow, g_ptr, g2_ptr, r0 + 3, t0 + 3, m, mmask, L, M, ZS)
    if t0 + TP + 3 < L:
        # every token the program walks is inside L: only its first block (whose first 3 gz
        # belong to the program before) and its last (the 3 tokens past its own, walked for
        # gz alone) need token conditions; the last issues no loads of a next block
        (za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab, a0, a1, a2,
         a3) = _walk_block(t0, za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab,
                           a0, a1, a2, a3, zrow, g_ptr, g2_ptr, gz_ptr, m, mmask, L, M, ZS, t0,
                           t_own, base, bias, w0, w1, w2, w3, K, False, True)  # fmt: skip
        for i in tl.range(4, TP, 4, num_stages=NS):
            (za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab, a0, a1, a2,
             a3) = _walk_block(t0 + i, za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1,
                               gp2, ab, a0, a1, a2, a3, zrow, g_ptr, g2_ptr, gz_ptr, m, mmask, L,
                               M, ZS, t0, t_own, base, bias, w0, w1, w2, w3, K, True,
                               True)  # fmt: skip
        (za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab, a0, a1, a2,
         a3) = _walk_block(t0 + TP, za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2,
                           ab, a0, a1, a2, a3, zrow, g_ptr, g2_ptr, gz_ptr, m, mmask, L, M, ZS,
                           t0, t_own, base, bias, w0, w1, w2, w3, K, False, False)  # fmt: skip
    else:
        for i in tl.range(0, TP + 3, 4, num_stages=NS):  # (a fixed trip count; masks end it)
            (za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1, gp2, ab, a0, a1, a2,
             a3) = _walk_block(t0 + i, za, zb, zc, zd, ga, gb, gc, gd, zp1, zp2, zp3, gp0, gp1,
                               gp2, ab, a0, a1, a2, a3, zrow, g_ptr, g2_ptr, gz_ptr, m, mmask, L,
                               M, ZS, t0, t_own, base, bias, w0, w1, w2, w3, K, False,
                               True)  # fmt: skip
    part = (b * NP + pid_t).to(tl.int64)
    tl.store(gb_ptr + part * M + m, ab, mask=mmask)
    tl.store(gw_ptr + (part * K + (K - 1)) * M + m, a3, mask=mmask)
    if K >= 2:
        tl.store(gw_ptr + (part * K + (K - 2)) * M + m, a2, mask=mmask)
    if K >= 3:
        tl.store(gw_ptr + (part * K + (K - 3)) * M + m, a1, mask=mmask)
    if K >= 4:
        tl.store(gw_ptr + (part * K + (K - 4)) * M + m, a0, mask=mmask)


@triton.jit
def _glue_conv_sums_kernel(gw_ptr, gb_ptr, gwo_ptr, gbo_ptr, P, M, K: tl.constexpr,
                           BP: tl.constexpr, BM: tl.constexpr):  # fmt: skip
    """The weight's and bias's gradients from the conv backward's partial sums ``gw [P, K, M]``
    and ``gb [P, M]`` (float32): program ``(i, j)`` adds channels ``i BM ..`` of tap ``j``
    (``j = K``: the bias) over the ``P`` rows in ``[BP, BM]`` tiles, in a fixed order, and
    stores them in the parameters' layouts and dtypes: ``gwo [M, K]`` (the weight's
    ``[M, 1, K]``), ``gbo [M]``. One launch where two torch sums and a transposing copy were."""
    i, j = tl.program_id(0), tl.program_id(1)
    m = i * BM + tl.arange(0, BM)
    mmask = m < M
    r = tl.arange(0, BP)
    acc = tl.zeros((BP, BM), tl.float32)
    if j < K:
        src = gw_ptr + j * M + m[None, :]
        stride = K * M
    else:
        src = gb_ptr + m[None, :]
        stride = M
    for p0 in range(0, P, BP):
        rows = p0 + r
        ok = (rows < P)[:, None] & mmask[None, :]
        acc += tl.load(src + rows.to(tl.int64)[:, None] * stride, mask=ok, other=0.0)
    tot = tl.sum(acc, axis=0)
    if j < K:
        tl.store(gwo_ptr + m * K + j, tot.to(gwo_ptr.dtype.element_ty), mask=mmask)
    else:
        tl.store(gbo_ptr + m, tot.to(gbo_ptr.dtype.element_ty), mask=mmask)


@triton.jit
def _glue_conv_gz_kernel(gp_ptr, w_ptr, gz_ptr, L, M, ZS,
                         K: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr):  # fmt: skip
    """The conv's backward, second pass: ``gz[t] = sum_d w[K-1-d] gpre[t+d]`` over the tokens
    ``t + d`` of the same sequence, into the first ``M`` columns of ``gz [B, L, ZS]``."""
    pid_t, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = pid_t * BT + tl.arange(0, BT)
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    rows = (b * L + t).to(tl.int64)
    gz = tl.zeros((BT, BM), tl.float32)
    for d in tl.static_range(K):
        ok = (t + d) < L
        wd = tl.load(w_ptr + m * K + (K - 1 - d), mask=mmask, other=0.0).to(tl.float32)
        gp = tl.load(gp_ptr + (rows + d)[:, None] * M + m[None, :],
                     mask=ok[:, None] & mmask[None, :], other=0.0)  # fmt: skip
        gz += wd[None, :] * gp
    omask = (t < L)[:, None] & mmask[None, :]
    tl.store(gz_ptr + rows[:, None] * ZS + m[None, :], gz.to(gz_ptr.dtype.element_ty),
             mask=omask)  # fmt: skip
