"""Triton kernels of the KLA layer's glue that works element by element (or token by token),
forward and backward, with their device helpers:

- ``_glue_dynamics_*``: :func:`kalmanscan.cuda.kla.glue.dynamics`, the layer's
  ``(decay, process_var) [M, S]`` from ``lambda_log``, the noise parameter and ``delta``;
- ``_glue_sensors_*``: :func:`~kalmanscan.cuda.kla.glue.sensors`, ``v, Lv [B, L, M]`` and
  ``k, q [B, L, S]`` (L2-normalised per token) from the sensor projection
  ``s [B, L, 2M + 2S]``;
- ``_glue_gate_*``: :func:`~kalmanscan.cuda.kla.glue.gate_skip`,
  ``out = (y + lambda_skip * zc) * act(gate)`` and ``yvar * act(gate)**2``.

The launch blocks and the launches: the host code in :mod:`kalmanscan.cuda.kla.glue`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kalmanscan.cuda._common import helper


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
    # fmt: off
    f_ser = 1.0 - xs * (1.0 / 2 - xs * (1.0 / 6 - xs * (1.0 / 24 - xs * (1.0 / 120 - xs * (
        1.0 / 720 - xs * (1.0 / 5040 - xs * (1.0 / 40320 - xs * (1.0 / 362880 - xs / 3628800))))))))
    d_ser = -1.0 / 2 + xs * (1.0 / 3 - xs * (1.0 / 8 - xs * (1.0 / 30 - xs * (1.0 / 144 - xs * (
        1.0 / 840 - xs * (1.0 / 5760 - xs * (1.0 / 45360 - xs / 403200)))))))
    # fmt: on
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
