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

Modules, by role: this one holds the host code (launch blocks, the autograd Functions, the
entry points above and the compile cases, ``_aot_cases``); ``glue_conv`` the conv's kernels
(forward tile and walk; backward as one walk or two passes, and the weights' sums);
``glue_pointwise`` the dynamics, sensor and gate kernels. The kernels and their device helpers
are importable from here as well.
"""

from __future__ import annotations

import torch

from kalmanscan.cuda._common import cdiv, empty, interpreting, launch, next_pow2
from kalmanscan.cuda.kla.glue_conv import (  # noqa: F401 - the kernels, also by their old path
    _conv_pre,
    _conv_sigmoid,
    _conv_taps,
    _fwd_walk_block,
    _fwd_walk_token,
    _glue_conv_fwd_kernel,
    _glue_conv_fwd_walk_kernel,
    _glue_conv_gpre_kernel,
    _glue_conv_gz_kernel,
    _glue_conv_sums_kernel,
    _glue_conv_walk_kernel,
    _rcp,
    _walk_block,
    _walk_loads,
    _walk_start,
    _walk_token,
    _walk_z,
)
from kalmanscan.cuda.kla.glue_pointwise import (  # noqa: F401 - the kernels, also by their old path
    _act,
    _dyn_inputs,
    _glue_dynamics_bwd_kernel,
    _glue_dynamics_fwd_kernel,
    _glue_gate_bwd_kernel,
    _glue_gate_fwd_kernel,
    _glue_sensors_bwd_kernel,
    _glue_sensors_fwd_kernel,
    _l2_bwd,
    _ou_factor,
    _softplus,
)

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
