"""Fused elementwise glue of the KLA layer: the work around the KLA op in three Triton groups,
each an autograd Function with an exact backward.

Shapes (batch B, time L, tokens ``N = B*L``, channels M, slots S, conv width K):
``zg [B, L, 2M]`` the input projection (rows ``z`` then ``gate``), ``s [B, L, 2M + 2S]`` the
sensor projection (rows ``v``, ``log var_v``, ``k``, ``q``); conv ``weight [M, 1, K]``,
``bias [M]``; ``lambda_skip`` a scalar.

- :func:`conv_silu`: ``zc = silu(bias + sum_j weight[j] z[t - K + 1 + j])`` (zero left padding),
  ``[B, L, M]`` in ``zg``'s dtype, computed in float32.
- :func:`sensors`: ``v``, ``Lv = 1 / (softplus(log var_v) + obs_var_min)``, ``k, q``
  L2-normalised per token, each float32 and contiguous: what the KLA op's kernels read fastest.
  (A bfloat16 ``v`` tile is 2 bytes a thread, below ``cp.async``'s 4: the kernels' software
  pipeline then loads it synchronously in each block, and the op ran 1.7x (forward) and 1.3x
  (backward) slower in the bf16 LM step. The op's ``v`` gradient is float32 too, so autograd
  casts nothing on the way back.)
- :func:`gate_skip`: ``out = (y + lambda_skip * zc) * act(gate)`` in ``zg``'s dtype and, when
  asked, ``yvar_gated = yvar * act(gate)**2``.
- :func:`dynamics`: the layer's ``(decay, process_var) [M, S]`` from ``lambda_log``, the process
  noise parameter and ``delta`` (``KLALayer.dynamics``' math) in one kernel, and their
  gradients in one: the eager ops are about 22 kernels forward and 45 backward a layer, tiny
  ones whose host time the LM step waits on.

The backward of :func:`gate_skip` writes the gate's gradient into a ``[B, L, 2M]`` buffer that
the backward of :func:`conv_silu` completes with ``z``'s gradient and returns as ``zg``'s (no
concatenation of the two halves); it hands over the skip's gradient of ``zc`` the same way, and
the conv's backward adds it to the sensor projection's as it reads both (no separate sum).
The sensor path always carries a gradient to ``zc`` when the gate's backward runs (the op's
output ``y`` depends on ``zc`` through the sensors), so the conv's backward runs after it.
Saved for the backward: ``zg``, ``s``, ``y`` (and ``yvar``
when its gradient may be needed) and ``zc``; the conv's pre-activation, the gate activation and
the value precision are recomputed. The layer (``kalmanscan.kla.layer``) uses these on CUDA; the
eager PyTorch path there is the reference they are tested against (tests/test_kla_glue.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kalmanscan.cuda._common import cdiv, empty, helper, interpreting, launch, next_pow2
from kalmanscan.cuda.filter.kernels import rcp as _rcp

ACTIVATIONS = {"silu": 0, "gelu": 1, "relu": 2}
_L2_EPS = 1e-12  # the layer's L2_EPS


GPU_BLOCKS = (32, 128, 4)  # (BT, BM, num_warps) on the device


def _blocks():
    """``(BT, BM, num_warps)``: token rows and channels per program (small when interpreting)."""
    if interpreting():
        return 16, 16, 1
    return GPU_BLOCKS


# The conv backward's first pass (``_glue_conv_gpre_kernel``): ``(BT, BM, num_warps, NI)``,
# ``NI`` tiles of ``BT`` tokens a program. H200, 8 x 2048 x 1024 bfloat16, one launch
# (benchmarks/kla_conv_bwd.py, results/kla-conv-bwd-blocks-h200.json): (32, 128, 4, 1) 115 us,
# (16, 64, 4, 8) 172, (16, 64, 2, 8) 185, (8, 256, 4, 8) 215, (4, 256, 2, 16) 256; the same
# pass without the weights' sums 56 us, its loads and one store alone 34
CONV_BWD_BLOCKS = (32, 128, 4, 1)


def _conv_bwd_blocks():
    """``CONV_BWD_BLOCKS`` (small when interpreting)."""
    if interpreting():
        return 8, 16, 1, 2
    return CONV_BWD_BLOCKS


# The conv backward in one pass for widths K <= 4 (``_glue_conv_walk_kernel``): ``(TP, BM,
# num_warps, NS)``, a program walks ``TP`` tokens of ``BM`` channels (pipeline stages ``NS``:
# 1, the kernel issues a block's loads itself). H200, bf16, M = 1024, the walk with its inner
# blocks free of token conditions and the sigmoid by a hardware reciprocal
# (results/kla-conv-walk-full-h200.json, one process against the walk before them), us at
# 8 x 2048 / 2 x 8192 / 1 x 32768: (128, 128, 2) 49.4 / 47.9 / 89.4, (64, 128, 2) 49.2 / 49.4 /
# 92.4 (before: 52.0 / 52.0 / 96.7), (128, 64, 1) 49.9 / 48.4 / 92.2, (64, 64, 1) 50.2 / 49.8 /
# 96.8, (32, 128, 2) 51.1 / 51.5 / 97.0, (64, 128, 1) 52.6 / 52.4 / 98.9, (128, 128, 4) 64.4 /
# 64.3 / 119.6. 128 tokens a program also halve the partial sums that _glue_conv_sums_kernel
# adds
CONV_WALK = (128, 128, 2, 1)
# the one-pass backward for K <= 4 (else the two passes at every width): 52 us against 149 for
# the two passes at 8 x 2048 x 1024 on the H200, same gz, gw, gb to rounding
# (results/kla-conv-walk-blocked-h200.json); False keeps the two passes at every width
CONV_ONE_PASS = True
# The conv forward for widths K <= 4 as a walk (``_glue_conv_fwd_walk_kernel``): ``(TP, BM,
# num_warps)``, a program walks ``TP`` tokens of ``BM`` channels; None: the tile kernel
# (``_glue_conv_fwd_kernel``, which also takes K > 4) at ``GPU_BLOCKS``. H200, as above, us at
# 8 x 2048 / 2 x 8192 / 1 x 32768: (64, 128, 2) 24.6 / 24.3 / 44.4 (before: 28.4 / 28.3 / 49.7),
# (32, 128, 2) 24.4 / 24.3 / 44.7, (64, 64, 1) 24.9 / 24.5 / 46.2, (128, 128, 2) 29.8 / 29.8 /
# 44.3
CONV_FWD_WALK = (64, 128, 2)


def _conv_fwd_walk_blocks():
    """``CONV_FWD_WALK`` (small when interpreting)."""
    if CONV_FWD_WALK is None:
        return None
    if interpreting():
        return 8, 16, 1
    return CONV_FWD_WALK


def _conv_walk_blocks():
    """``CONV_WALK`` (small when interpreting)."""
    if interpreting():
        return 8, 16, 1, 1
    return CONV_WALK


# The sums of the conv backward's partial weight and bias gradients (``_glue_conv_sums_kernel``):
# ``(BP, BM, num_warps)``, a program adds ``[BP, BM]`` tiles of one tap's (or the bias's)
# partial sums down the ``P`` rows
CONV_SUMS = (32, 64, 4)


def _conv_sums_blocks():
    """``CONV_SUMS`` (small when interpreting)."""
    if interpreting():
        return 4, 16, 1
    return CONV_SUMS


# ----------------------------------------------------------------------------------- device


@helper
def _act(x, ACT: tl.constexpr):
    """``(act(x), act'(x))`` for silu (0), exact gelu (1), relu (2)."""
    if ACT == 0:
        sg = 1.0 / (1.0 + tl.exp(-x))
        return x * sg, sg * (1.0 + x * (1.0 - sg))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        return x * cdf, cdf + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)
    else:
        pos = x > 0.0
        return tl.where(pos, x, 0.0), tl.where(pos, 1.0, 0.0)


@helper
def _conv_sigmoid(pre):
    """``sigmoid(pre)`` for the conv's SiLU and its slope, every conv kernel alike (so the walks
    equal the tile and two-pass kernels bit for bit): one hardware reciprocal (relative error
    below 2^-22), where a division takes about 8 instructions more an element."""
    return _rcp(1.0 + tl.exp(-pre))


@helper
def _softplus(x):
    """``(softplus(x), sigmoid(x))`` as torch (threshold 20); log1p by ``log(u) x / (u - 1)``."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    one = u == 1.0
    l1p = tl.where(one, e, tl.log(u) * e / tl.where(one, 1.0, u - 1.0))
    sp = tl.where(x > 20.0, x, l1p)
    sg = tl.where(x > 20.0, 1.0, e / u)
    return sp, sg


@helper
def _ou_factor(x):
    """``(f, f')`` of ``f(x) = (1 - exp(-x)) / x`` (``x >= 0``): their Taylor series below 0.5
    (10 terms, truncation below 1e-9 relative), the closed forms above (no ``expm1`` needed:
    ``1 - exp(-x)`` and ``exp(-x) (1 + x) - 1`` lose at most a factor 10 there)."""
    e = tl.exp(-x)
    xs = tl.minimum(x, 0.5)
    f_ser = 1.0 - xs * (1.0 / 2 - xs * (1.0 / 6 - xs * (1.0 / 24 - xs * (1.0 / 120 - xs * (
        1.0 / 720 - xs * (1.0 / 5040 - xs * (1.0 / 40320 - xs * (1.0 / 362880 - xs / 3628800))))))))
    d_ser = -1.0 / 2 + xs * (1.0 / 3 - xs * (1.0 / 8 - xs * (1.0 / 30 - xs * (1.0 / 144 - xs * (
        1.0 / 840 - xs * (1.0 / 5760 - xs * (1.0 / 45360 - xs / 403200)))))))
    xl = tl.maximum(x, 0.5)
    f = tl.where(x < 0.5, f_ser, (1.0 - e) / xl)
    d = tl.where(x < 0.5, d_ser, (e * (1.0 + x) - 1.0) / (xl * xl))
    return f, d


@helper
def _dyn_inputs(ll_ptr, pn_ptr, dl_ptr, i, mask, NOISE: tl.constexpr):
    """``theta = exp(lambda_log)``, the noise parameter, ``sigma2`` (``max(pn, 1e-7)``,
    ``pn + 1e-12`` or ``exp(pn)`` for NOISE 0, 1, 2), ``dt = softplus(delta) + 1e-7`` and
    ``softplus'(delta)``."""
    theta = tl.exp(tl.load(ll_ptr + i, mask=mask, other=0.0).to(tl.float32))
    pn = tl.load(pn_ptr + i, mask=mask, other=1.0).to(tl.float32)
    if NOISE == 0:
        sigma2 = tl.maximum(pn, 1e-7)
    elif NOISE == 1:
        sigma2 = pn + 1e-12
    else:
        sigma2 = tl.exp(pn)
    sp, sg = _softplus(tl.load(dl_ptr + i, mask=mask, other=0.0).to(tl.float32))
    return theta, pn, sigma2, sp + 1e-7, sg


@triton.jit
def _glue_dynamics_fwd_kernel(ll_ptr, pn_ptr, dl_ptr, a_ptr, p_ptr, n, NOISE: tl.constexpr,
                              OU: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    theta, _, sigma2, dt, _ = _dyn_inputs(ll_ptr, pn_ptr, dl_ptr, i, mask, NOISE)
    pv = sigma2 * dt
    if OU:
        f, _ = _ou_factor(2.0 * theta * dt)
        pv = pv * f
    tl.store(a_ptr + i, tl.exp(-theta * dt), mask=mask)
    tl.store(p_ptr + i, pv, mask=mask)


@triton.jit
def _glue_dynamics_bwd_kernel(ll_ptr, pn_ptr, dl_ptr, ga_ptr, gp_ptr, gll_ptr, gpn_ptr, gdl_ptr,
                              n, NOISE: tl.constexpr, OU: tl.constexpr,
                              BLOCK: tl.constexpr):  # fmt: skip
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    theta, pn, sigma2, dt, sg = _dyn_inputs(ll_ptr, pn_ptr, dl_ptr, i, mask, NOISE)
    ga = tl.load(ga_ptr + i, mask=mask, other=0.0).to(tl.float32)
    gp = tl.load(gp_ptr + i, mask=mask, other=0.0).to(tl.float32)
    du = ga * tl.exp(-theta * dt)  # decay = exp(u), u = -theta dt
    gth = -du * dt
    gdt = -du * theta
    if OU:  # process_var = sigma2 dt f(x), x = 2 theta dt
        f, fp = _ou_factor(2.0 * theta * dt)
        gs2 = gp * f * dt
        gdt += gp * sigma2 * f
        gx = gp * sigma2 * dt * fp
        gth += 2.0 * gx * dt
        gdt += 2.0 * gx * theta
    else:  # process_var = sigma2 dt
        gs2 = gp * dt
        gdt += gp * sigma2
    if NOISE == 0:  # clamp_min's gradient passes where pn >= 1e-7, as torch's does
        gpn = tl.where(pn >= 1e-7, gs2, 0.0)
    elif NOISE == 1:
        gpn = gs2 * 0.0
    else:
        gpn = gs2 * sigma2
    tl.store(gll_ptr + i, gth * theta, mask=mask)
    tl.store(gpn_ptr + i, gpn, mask=mask)
    tl.store(gdl_ptr + i, gdt * sg, mask=mask)


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


# The sensor kernels' two branches (channels; the k, q slots of one extra program column) bind
# their own names: the compiler requires a name bound in both branches of a runtime ``if`` to
# have one type there, and the [BN, BM] and [BN, BS] tiles differ.
@triton.jit
def _glue_sensors_fwd_kernel(s_ptr, v_ptr, Lv_ptr, k_ptr, q_ptr, N, M, S, SS, obs_min, eps,
                        QK_NORM: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                        BS: tl.constexpr):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    rows = n.to(tl.int64)
    nmask = n < N
    if pid_m * BM < M:
        m = pid_m * BM + tl.arange(0, BM)
        vmask = nmask[:, None] & (m < M)[None, :]
        vsrc = s_ptr + rows[:, None] * SS + m[None, :]
        v = tl.load(vsrc, mask=vmask, other=0.0).to(tl.float32)
        tl.store(v_ptr + rows[:, None] * M + m[None, :], v, mask=vmask)
        lv = tl.load(vsrc + M, mask=vmask, other=0.0).to(tl.float32)
        sp, _ = _softplus(lv)
        tl.store(Lv_ptr + rows[:, None] * M + m[None, :], 1.0 / (sp + obs_min), mask=vmask)
    else:
        s = tl.arange(0, BS)
        kmask = nmask[:, None] & (s < S)[None, :]
        ksrc = s_ptr + rows[:, None] * SS + 2 * M + s[None, :]
        k = tl.load(ksrc, mask=kmask, other=0.0).to(tl.float32)
        q = tl.load(ksrc + S, mask=kmask, other=0.0).to(tl.float32)
        if QK_NORM:
            k = k / tl.maximum(tl.sqrt(tl.sum(k * k, axis=1)), eps)[:, None]
            q = q / tl.maximum(tl.sqrt(tl.sum(q * q, axis=1)), eps)[:, None]
        tl.store(k_ptr + rows[:, None] * S + s[None, :], k, mask=kmask)
        tl.store(q_ptr + rows[:, None] * S + s[None, :], q, mask=kmask)


@helper
def _l2_bwd(x, g, eps):
    """Gradient of ``x / max(|x|, eps)`` per row: ``g/n - x (x.g) / n**3`` above ``eps``."""
    nrm = tl.sqrt(tl.sum(x * x, axis=1))
    big = nrm > eps
    nc = tl.maximum(nrm, eps)
    dot = tl.sum(x * g, axis=1)
    corr = tl.where(big, dot / (nc * nc * nc), 0.0)
    return g / nc[:, None] - x * corr[:, None]


@triton.jit
def _glue_sensors_bwd_kernel(s_ptr, gv_ptr, gLv_ptr, gk_ptr, gq_ptr, gs_ptr, N, M, S, SS, obs_min,
                        eps, QK_NORM: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                        BS: tl.constexpr):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    rows = n.to(tl.int64)
    nmask = n < N
    dt = gs_ptr.dtype.element_ty
    if pid_m * BM < M:
        m = pid_m * BM + tl.arange(0, BM)
        vmask = nmask[:, None] & (m < M)[None, :]
        vat = rows[:, None] * M + m[None, :]
        vdst = gs_ptr + rows[:, None] * SS + m[None, :]
        tl.store(vdst, tl.load(gv_ptr + vat, mask=vmask, other=0.0).to(dt), mask=vmask)
        lv = tl.load(s_ptr + rows[:, None] * SS + M + m[None, :], mask=vmask, other=0.0)
        sp, sg = _softplus(lv.to(tl.float32))
        Lv = 1.0 / (sp + obs_min)
        gLv = tl.load(gLv_ptr + vat, mask=vmask, other=0.0).to(tl.float32)
        tl.store(vdst + M, (-gLv * Lv * Lv * sg).to(dt), mask=vmask)
    else:
        s = tl.arange(0, BS)
        kmask = nmask[:, None] & (s < S)[None, :]
        kat = rows[:, None] * S + s[None, :]
        gk = tl.load(gk_ptr + kat, mask=kmask, other=0.0).to(tl.float32)
        gq = tl.load(gq_ptr + kat, mask=kmask, other=0.0).to(tl.float32)
        if QK_NORM:
            ksrc = s_ptr + rows[:, None] * SS + 2 * M + s[None, :]
            k = tl.load(ksrc, mask=kmask, other=0.0).to(tl.float32)
            q = tl.load(ksrc + S, mask=kmask, other=0.0).to(tl.float32)
            gk = _l2_bwd(k, gk, eps)
            gq = _l2_bwd(q, gq, eps)
        kdst = gs_ptr + rows[:, None] * SS + 2 * M + s[None, :]
        tl.store(kdst, gk.to(dt), mask=kmask)
        tl.store(kdst + S, gq.to(dt), mask=kmask)


@triton.jit
def _glue_gate_fwd_kernel(y_ptr, yvar_ptr, zg_ptr, zc_ptr, skip_ptr, out_ptr, yvg_ptr, N, M, ZS,
                     ACT: tl.constexpr, HAS_VAR: tl.constexpr, BN: tl.constexpr,
                     BM: tl.constexpr):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    m = pid_m * BM + tl.arange(0, BM)
    rows = n.to(tl.int64)
    mask = (n < N)[:, None] & (m < M)[None, :]
    at = rows[:, None] * M + m[None, :]
    gate = tl.load(zg_ptr + rows[:, None] * ZS + M + m[None, :], mask=mask, other=0.0)
    g, _ = _act(gate.to(tl.float32), ACT)
    skip = tl.load(skip_ptr).to(tl.float32)
    y = tl.load(y_ptr + at, mask=mask, other=0.0).to(tl.float32)
    zc = tl.load(zc_ptr + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, ((y + skip * zc) * g).to(out_ptr.dtype.element_ty), mask=mask)
    if HAS_VAR:
        yvar = tl.load(yvar_ptr + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(yvg_ptr + at, (yvar * (g * g)).to(yvg_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glue_gate_bwd_kernel(gout_ptr, gyvg_ptr, y_ptr, yvar_ptr, zg_ptr, zc_ptr, skip_ptr, gy_ptr,
                     gyvar_ptr, gzg_ptr, gzc_ptr, gskip_ptr, N, M, ZS, ACT: tl.constexpr,
                     HAS_VAR: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                     ATOMIC: tl.constexpr = False):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    m = pid_m * BM + tl.arange(0, BM)
    rows = n.to(tl.int64)
    mask = (n < N)[:, None] & (m < M)[None, :]
    at = rows[:, None] * M + m[None, :]
    gate = tl.load(zg_ptr + rows[:, None] * ZS + M + m[None, :], mask=mask, other=0.0)
    g, dg = _act(gate.to(tl.float32), ACT)
    skip = tl.load(skip_ptr).to(tl.float32)
    y = tl.load(y_ptr + at, mask=mask, other=0.0).to(tl.float32)
    zc = tl.load(zc_ptr + at, mask=mask, other=0.0).to(tl.float32)
    gout = tl.load(gout_ptr + at, mask=mask, other=0.0).to(tl.float32)
    gu = gout * g
    ggate = gout * (y + skip * zc) * dg
    tl.store(gy_ptr + at, gu.to(gy_ptr.dtype.element_ty), mask=mask)
    tl.store(gzc_ptr + at, (gu * skip).to(gzc_ptr.dtype.element_ty), mask=mask)
    gsk = tl.sum(tl.sum(gu * zc, axis=1))
    if ATOMIC:  # into the scalar (float32 atomics), else one partial sum a program
        tl.atomic_add(gskip_ptr, gsk, sem="relaxed")
    else:
        tl.store(gskip_ptr + pid_n * tl.num_programs(1) + pid_m, gsk)
    if HAS_VAR:
        gyvg = tl.load(gyvg_ptr + at, mask=mask, other=0.0).to(tl.float32)
        yvar = tl.load(yvar_ptr + at, mask=mask, other=0.0).to(tl.float32)
        ggate += gyvg * yvar * 2.0 * g * dg
        tl.store(gyvar_ptr + at, (gyvg * (g * g)).to(gyvar_ptr.dtype.element_ty), mask=mask)
    tl.store(gzg_ptr + rows[:, None] * ZS + M + m[None, :], ggate.to(gzg_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


# ----------------------------------------------------------------------------------- host


class _GradBuffer:
    """The ``[B, L, 2M]`` gradient of ``zg``, passed from :class:`_GateSkip`'s backward (gate
    half) to :class:`_ConvSilu`'s (z half), which returns it."""

    __slots__ = ("gzg", "gzc")

    def __init__(self):
        self.gzg = None
        self.gzc = None


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zg, weight, bias, buf):
        B, L, M2 = zg.shape
        M, K = M2 // 2, weight.shape[-1]
        out = empty((B, L, M), zg)
        walk = _conv_fwd_walk_blocks()
        if walk is not None and K <= 4:
            TP, WM, ww = walk
            launch(_glue_conv_fwd_walk_kernel, (cdiv(L, TP), cdiv(M, WM), B), zg, weight, bias,
                   out, L, M, M2, K=K, TP=TP, BM=WM, num_warps=ww)  # fmt: skip
        else:
            BT, BM, nw = _blocks()
            launch(_glue_conv_fwd_kernel, (cdiv(L, BT), cdiv(M, BM), B), zg, weight, bias, out,
                   L, M, M2, K=K, BT=BT, BM=BM, num_warps=nw)  # fmt: skip
        ctx.buf = buf
        ctx.save_for_backward(zg, weight, bias)
        return out

    @staticmethod
    def backward(ctx, gzc):
        zg, weight, bias = ctx.saved_tensors
        B, L, M2 = zg.shape
        M, K = M2 // 2, weight.shape[-1]
        BT, BM, nw = _blocks()
        NT = cdiv(L, BT)
        gzg, gskip_zc = ctx.buf.gzg, ctx.buf.gzc
        ctx.buf.gzg = ctx.buf.gzc = None
        if gzg is None:  # the gate received no gradient
            gzg = empty((B, L, M2), zg)
            gzg[..., M:].zero_()
            gskip_zc = torch.zeros((B, L, M), dtype=gzc.dtype, device=gzc.device)
        one_pass = CONV_ONE_PASS and K <= 4
        if one_pass:
            TP, WM, ww, wns = _conv_walk_blocks()
            NP = cdiv(L, TP)
        else:
            PT, PM, pw, NI = _conv_bwd_blocks()
            NP = cdiv(L, PT * NI)
        # the weights' and bias's partial sums, NP a batch row
        gw = empty((B * NP, K, M), dtype=torch.float32, device=zg.device)
        gb = empty((B * NP, M), dtype=torch.float32, device=zg.device)
        if one_pass:
            launch(_glue_conv_walk_kernel, (NP, cdiv(M, WM), B), zg, weight, bias,
                   gzc.contiguous(), gskip_zc, gzg, gw, gb, L, M, M2, NP, K=K, TP=TP, BM=WM,
                   NS=wns, num_warps=ww)  # fmt: skip
        else:  # two passes: gpre (and the weights' sums), then gz
            gp = empty((B, L, M), dtype=torch.float32, device=zg.device)
            launch(_glue_conv_gpre_kernel, (NP, cdiv(M, PM), B), zg, weight, bias,
                   gzc.contiguous(), gskip_zc, gp, gw, gb, L, M, M2, NP, K=K, KP=next_pow2(K),
                   BT=PT, BM=PM, NI=NI, num_warps=pw)  # fmt: skip
            launch(_glue_conv_gz_kernel, (NT, cdiv(M, BM), B), gp, weight, gzg, L, M, M2, K=K,
                   BT=BT, BM=BM, num_warps=nw)  # fmt: skip
        gwo = empty(weight.shape, weight)
        gbo = empty(bias.shape, bias)
        BP, BS, sw = _conv_sums_blocks()
        launch(_glue_conv_sums_kernel, (cdiv(M, BS), K + 1), gw, gb, gwo, gbo, gw.shape[0], M,
               K=K, BP=BP, BM=BS, num_warps=sw)  # fmt: skip
        return gzg, gwo, gbo, None


class _Sensors(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, M, S, obs_min, qk_norm):
        B, L, SS = s.shape
        N = B * L
        BN, BM, nw = _blocks()
        v = empty((B, L, M), dtype=torch.float32, device=s.device)
        Lv = empty((B, L, M), dtype=torch.float32, device=s.device)
        k = empty((B, L, S), dtype=torch.float32, device=s.device)
        q = empty((B, L, S), dtype=torch.float32, device=s.device)
        launch(_glue_sensors_fwd_kernel, (cdiv(N, BN), cdiv(M, BM) + 1), s, v, Lv, k, q, N, M,
               S, SS, float(obs_min), _L2_EPS, QK_NORM=bool(qk_norm), BN=BN, BM=BM,
               BS=next_pow2(S), num_warps=nw)  # fmt: skip
        ctx.meta = (M, S, float(obs_min), bool(qk_norm))
        ctx.save_for_backward(s)
        return v, Lv, k, q

    @staticmethod
    def backward(ctx, gv, gLv, gk, gq):
        (s,) = ctx.saved_tensors
        M, S, obs_min, qk_norm = ctx.meta
        B, L, SS = s.shape
        N = B * L
        BN, BM, nw = _blocks()
        gs = empty((B, L, SS), s)
        launch(_glue_sensors_bwd_kernel, (cdiv(N, BN), cdiv(M, BM) + 1), s, gv.contiguous(),
               gLv.contiguous(), gk.contiguous(), gq.contiguous(), gs, N, M, S, SS, obs_min,
               _L2_EPS, QK_NORM=qk_norm, BN=BN, BM=BM, BS=next_pow2(S),
               num_warps=nw)  # fmt: skip
        return gs, None, None, None, None


class _GateSkip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, yvar, zg, zc, skip, act, has_var, var_dtype, buf):
        B, L, M = y.shape
        N = B * L
        BN, BM, nw = _blocks()
        out = empty((B, L, M), zg)
        yvg = empty((B, L, M), dtype=var_dtype, device=y.device) if has_var else out
        launch(_glue_gate_fwd_kernel, (cdiv(N, BN), cdiv(M, BM)), y, yvar if has_var else y, zg,
               zc, skip, out, yvg,
               N, M, 2 * M, ACT=act, HAS_VAR=has_var, BN=BN, BM=BM, num_warps=nw)  # fmt: skip
        ctx.meta = (act, has_var)
        ctx.buf = buf
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(y, yvar if has_var else None, zg, zc, skip)
        return (out, yvg) if has_var else out

    @staticmethod
    def backward(ctx, gout, gyvg=None):
        y, yvar, zg, zc, skip = ctx.saved_tensors
        act, has_var = ctx.meta
        B, L, M = y.shape
        N = B * L
        BN, BM, nw = _blocks()
        with_var = has_var and gyvg is not None
        if gout is None:
            gout = torch.zeros_like(y, dtype=zg.dtype)
        gy = empty((B, L, M), y)
        gyvar = empty((B, L, M), yvar) if with_var else None
        gzg = empty((B, L, 2 * M), zg)
        gzc = empty((B, L, M), zc)
        nN, nM = cdiv(N, BN), cdiv(M, BM)
        # the skip's gradient: added by every program into one float32 (atomics), else one
        # partial sum a program that torch adds in a fixed order (deterministic algorithms)
        atomic = not torch.are_deterministic_algorithms_enabled()
        if atomic:
            gskip = torch.zeros((1,), dtype=torch.float32, device=y.device)
        else:
            gskip = empty((nN * nM,), dtype=torch.float32, device=y.device)
        launch(_glue_gate_bwd_kernel, (nN, nM), gout.contiguous(),
               gyvg.contiguous() if with_var else gout, y, yvar if with_var else y, zg, zc, skip,
               gy, gyvar if with_var else gy, gzg, gzc, gskip, N, M, 2 * M, ACT=act,
               HAS_VAR=with_var, BN=BN, BM=BM, ATOMIC=atomic, num_warps=nw)  # fmt: skip
        ctx.buf.gzg, ctx.buf.gzc = gzg, gzc  # completed by _ConvSilu.backward
        gskip = (gskip if atomic else gskip.sum()).to(skip.dtype).reshape(skip.shape)
        return gy, gyvar, None, None, gskip, None, None, None, None


def _dyn_block():
    return 256 if interpreting() else 512


class _Dynamics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lambda_log, noise, delta, noise_kind, ou):
        n = lambda_log.numel()
        ll, pn, dl = lambda_log.contiguous(), noise.contiguous(), delta.contiguous()
        a = empty(lambda_log.shape, dtype=torch.float32, device=ll.device)
        p = empty(lambda_log.shape, dtype=torch.float32, device=ll.device)
        B = _dyn_block()
        launch(_glue_dynamics_fwd_kernel, (cdiv(n, B),), ll, pn, dl, a, p, n, NOISE=noise_kind,
               OU=ou, BLOCK=B, num_warps=4)  # fmt: skip
        ctx.meta = (noise_kind, ou)
        ctx.save_for_backward(ll, pn, dl)
        return a, p

    @staticmethod
    def backward(ctx, ga, gp):
        ll, pn, dl = ctx.saved_tensors
        noise_kind, ou = ctx.meta
        n = ll.numel()
        f32 = dict(dtype=torch.float32, device=ll.device)
        gll, gpn, gdl = empty(ll.shape, **f32), empty(ll.shape, **f32), empty(ll.shape, **f32)
        B = _dyn_block()
        launch(_glue_dynamics_bwd_kernel, (cdiv(n, B),), ll, pn, dl, ga.contiguous(),
               gp.contiguous(), gll, gpn, gdl, n, NOISE=noise_kind, OU=ou, BLOCK=B,
               num_warps=4)  # fmt: skip
        need = ctx.needs_input_grad
        return (gll.to(ll.dtype) if need[0] else None, gpn.to(pn.dtype) if need[1] else None,
                gdl.to(dl.dtype) if need[2] else None, None, None)  # fmt: skip


NOISE_KINDS = {"floor": 0, "zero": 1, "log": 2}


def dynamics(lambda_log, noise, delta, noise_kind, ou):
    """``(decay, process_var)``, float32 ``[M, S]``: ``theta = exp(lambda_log)``,
    ``dt = softplus(delta) + 1e-7``, ``sigma2`` from ``noise`` by ``noise_kind`` (``"floor"``:
    ``max(noise, 1e-7)``, ``"zero"``: ``noise + 1e-12``, ``"log"``: ``exp(noise)``);
    ``decay = exp(-theta dt)`` and ``process_var = sigma2 dt (1 - exp(-2 theta dt)) /
    (2 theta dt)`` with ``ou``, else ``sigma2 dt`` (``KLALayer.dynamics``, the reference)."""
    return _Dynamics.apply(lambda_log, noise, delta, NOISE_KINDS[noise_kind], bool(ou))


def new_grad_buffer() -> _GradBuffer:
    """The link between one call's :func:`gate_skip` and :func:`conv_silu` (one per call)."""
    return _GradBuffer()


def conv_silu(zg, weight, bias, buf):
    """``silu(causal_conv(zg[..., :M]))`` ``[B, L, M]`` from ``zg [B, L, 2M]`` (contiguous),
    ``weight [M, 1, K]``, ``bias [M]``, with a zero initial window."""
    return _ConvSilu.apply(zg, weight.contiguous(), bias, buf)


def sensors(s, M, S, obs_min, qk_norm):
    """``(v, Lv, k, q)``, all float32, from the sensor projection ``s [B, L, 2M + 2S]``
    (contiguous)."""
    return _Sensors.apply(s, M, S, obs_min, qk_norm)


def gate_skip(y, yvar, zg, zc, skip, activation, buf, var_dtype=None):
    """``out = (y + skip * zc) * act(zg[..., M:])`` in ``zg``'s dtype; with ``var_dtype`` also
    ``yvar * act(gate)**2`` in that dtype. ``y, yvar [B, L, M]`` (the op's outputs; ``yvar``
    may be None without ``var_dtype``)."""
    has_var = var_dtype is not None
    return _GateSkip.apply(y, yvar, zg, zc, skip, ACTIVATIONS[activation], has_var,
                           var_dtype, buf)  # fmt: skip


def _aot_cases(shapes=((256, 2048), (512, 64), (256, 100)), S=16, K=4, expand=2):
    """The kernel specializations the layer launches on the device, for the compile check
    without a GPU (``python -m kalmanscan.cuda._aot kalmanscan.cuda.kla.glue``; see
    ``kalmanscan.cuda._aot``): ``(name, kernel, args, consts, num_warps)`` for batches of 4
    sequences at each ``(d_model, L)`` of ``shapes`` (``M = expand * d_model`` channels; the
    lengths give sizes divisible by 16 and not), ``S`` slots, conv width ``K``, activations
    in float32 and, under autocast, bfloat16 or float16 (the op's inputs ``v``, ``Lv``, ``k``,
    ``q`` and outputs, the conv's parameters and ``lambda_skip`` stay float32; ``yvar_gated`` in
    float32)."""
    f32 = torch.float32
    BT, BM, nw = GPU_BLOCKS
    BS = next_pow2(S)
    B = 4
    cases = []
    for D in sorted({D for D, _ in shapes}):
        n = int(expand * D) * S
        for dt in (f32, torch.bfloat16):  # the parameters' dtype
            dyn = dict(ll_ptr=dt, pn_ptr=dt, dl_ptr=dt, n=n)
            for kind, code in NOISE_KINDS.items():
                for ou in (True, False):
                    c = dict(NOISE=code, OU=ou, BLOCK=512)
                    tag = f"n{n}-{str(dt).removeprefix('torch.')}-{kind}-ou{int(ou)}"
                    cases.append((f"dynamics_fwd-{tag}", _glue_dynamics_fwd_kernel,
                                  dict(dyn, a_ptr=f32, p_ptr=f32), c, 4))  # fmt: skip
                    cases.append((f"dynamics_bwd-{tag}", _glue_dynamics_bwd_kernel,
                                  dict(dyn, ga_ptr=f32, gp_ptr=f32, gll_ptr=f32, gpn_ptr=f32,
                                       gdl_ptr=f32), c, 4))  # fmt: skip
    for D, L in shapes:
        M, N = int(expand * D), B * L
        for dt in (f32, torch.bfloat16, torch.float16):
            tag = f"M{M}-L{L}-{str(dt).removeprefix('torch.')}"
            conv = dict(zg_ptr=dt, w_ptr=f32, b_ptr=f32, L=L, M=M, ZS=2 * M)
            cases.append((f"conv_fwd-{tag}-K{K}", _glue_conv_fwd_kernel,
                          dict(conv, out_ptr=dt), dict(K=K, BT=BT, BM=BM), nw))  # fmt: skip
            if CONV_FWD_WALK is not None:  # (None: the tile kernel only)
                FP, FM, fw = CONV_FWD_WALK
                cases.append((f"conv_fwd_walk-{tag}-K{K}", _glue_conv_fwd_walk_kernel,
                              dict(conv, out_ptr=dt), dict(K=K, TP=FP, BM=FM), fw))  # fmt: skip
            PT, PM, pw, NI = CONV_BWD_BLOCKS
            cases.append((f"conv_gpre-{tag}-K{K}", _glue_conv_gpre_kernel,
                          dict(conv, g_ptr=dt, g2_ptr=dt, gp_ptr=f32, gw_ptr=f32, gb_ptr=f32,
                               NP=cdiv(L, PT * NI)),
                          dict(K=K, KP=next_pow2(K), BT=PT, BM=PM, NI=NI), pw))  # fmt: skip
            TP, WM, ww, wns = CONV_WALK
            cases.append((f"conv_walk-{tag}-K{K}", _glue_conv_walk_kernel,
                          dict(conv, g_ptr=dt, g2_ptr=dt, gz_ptr=dt, gw_ptr=f32, gb_ptr=f32,
                               NP=cdiv(L, TP)),
                          dict(K=K, TP=TP, BM=WM, NS=wns), ww))  # fmt: skip
            SP, SM, sw = CONV_SUMS
            cases.append((f"conv_sums-{tag}-K{K}", _glue_conv_sums_kernel,
                          dict(gw_ptr=f32, gb_ptr=f32, gwo_ptr=f32, gbo_ptr=f32,
                               P=B * cdiv(L, TP), M=M),
                          dict(K=K, BP=SP, BM=SM), sw))  # fmt: skip
            cases.append((f"conv_gz-{tag}-K{K}", _glue_conv_gz_kernel,
                          dict(gp_ptr=f32, w_ptr=f32, gz_ptr=dt, L=L, M=M, ZS=2 * M),
                          dict(K=K, BT=BT, BM=BM), nw))  # fmt: skip
            sens = dict(N=N, M=M, S=S, SS=2 * M + 2 * S, obs_min=1e-4, eps=_L2_EPS)
            for qk in (True, False):
                c = dict(QK_NORM=qk, BN=BT, BM=BM, BS=BS)
                cases.append((f"sensors_fwd-{tag}-S{S}-qk{int(qk)}", _glue_sensors_fwd_kernel,
                              dict(sens, s_ptr=dt, v_ptr=f32, Lv_ptr=f32, k_ptr=f32, q_ptr=f32),
                              c, nw))  # fmt: skip
                cases.append((f"sensors_bwd-{tag}-S{S}-qk{int(qk)}", _glue_sensors_bwd_kernel,
                              dict(sens, s_ptr=dt, gv_ptr=f32, gLv_ptr=f32, gk_ptr=f32,
                                   gq_ptr=f32, gs_ptr=dt),
                              c, nw))  # fmt: skip
            gate = dict(y_ptr=f32, yvar_ptr=f32, zg_ptr=dt, zc_ptr=dt, skip_ptr=f32, N=N, M=M,
                        ZS=2 * M)  # fmt: skip
            for act, code in ACTIVATIONS.items():
                for has_var in (True, False):
                    c = dict(ACT=code, HAS_VAR=has_var, BN=BT, BM=BM)
                    name = f"{tag}-{act}-var{int(has_var)}"
                    cases.append((f"gate_fwd-{name}", _glue_gate_fwd_kernel,
                                  dict(gate, out_ptr=dt, yvg_ptr=f32), c, nw))  # fmt: skip
                    c = dict(c, ATOMIC=True)  # (the backward's skip sum by atomics)
                    cases.append((f"gate_bwd-{name}", _glue_gate_bwd_kernel,
                                  dict(gate, gout_ptr=dt, gyvg_ptr=f32, gy_ptr=f32,
                                       gyvar_ptr=f32, gzg_ptr=dt, gzc_ptr=dt, gskip_ptr=f32),
                                  c, nw))  # fmt: skip
    return cases
