"""The entry of the ``"triton"`` backend of ``kla_filter``: :func:`kla_triton`, the forward
kernel alone when nothing is differentiated, else an autograd Function whose backward runs the
backward kernel from the forward's checkpoints; in ``C > 1`` time chunks where
:func:`tuning.chunks_for` asks for them (few lanes, long sequences: ``chunked.py``)."""

from __future__ import annotations

import torch

from kalmanscan.cuda._common import empty
from kalmanscan.cuda.kla import glue, tuning
from kalmanscan.cuda.kla.backward import backward
from kalmanscan.cuda.kla.chunked import backward_chunked, forward_chunked
from kalmanscan.cuda.kla.forward import forward


class _KLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, lam0, eta0, save_prec, save_ck, var):
        y, yvar, lamT, etaT, prec, ck, CK = forward(v, Lv, k, q, a, p, lam0, eta0, save_prec,
                                                    save_ck, var)  # fmt: skip
        ctx.CK = CK
        ctx.init = lam0 is not None  # else the default state: not an input, no gradient
        # outputs without a gradient reach backward as None (it passes zeros for them once)
        ctx.set_materialize_grads(False)
        if save_ck:
            ctx.save_for_backward(v, Lv, k, q, a, p, ck)
        outs = (y, yvar, lamT, etaT) + ((prec,) if save_prec else ())
        return outs

    @staticmethod
    def backward(ctx, gy, gyv, glT, geT, *rest):
        v, Lv, k, q, a, p, ck = ctx.saved_tensors
        gprec = rest[0] if rest else None
        gv, gLv, gk, gq, ga, gp, gl0, ge0 = backward(v, Lv, k, q, a, p, ck, ctx.CK, gy, gyv, glT,
                                                     geT, gprec)  # fmt: skip
        if not ctx.init:
            gl0 = ge0 = None
        return gv, gLv, gk, gq, ga, gp, gl0, ge0, None, None, None


class _KLAChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, lam0, eta0, save_prec, C, var):
        y, yvar, lamT, etaT, prec, ck, CK, _, start = forward_chunked(
            v, Lv, k, q, a, p, lam0, eta0, save_prec, True, C, var)  # fmt: skip
        ctx.CK, ctx.C = CK, C
        ctx.init = lam0 is not None
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(v, Lv, k, q, a, p, ck, start)
        return (y, yvar, lamT, etaT) + ((prec,) if save_prec else ())

    @staticmethod
    def backward(ctx, gy, gyv, glT, geT, *rest):
        v, Lv, k, q, a, p, ck, start = ctx.saved_tensors
        gprec = rest[0] if rest else None
        gv, gLv, gk, gq, ga, gp, gl0, ge0 = backward_chunked(
            v, Lv, k, q, a, p, ck, ctx.CK, start, ctx.C, gy, gyv, glT, geT, gprec
        )
        if not ctx.init:
            gl0 = ge0 = None
        return gv, gLv, gk, gq, ga, gp, gl0, ge0, None, None, None


def kla_triton(v, Lv, k, q, decay, process_var, lam0, eta0, return_precision=False,
               return_variance=True):  # fmt: skip
    """Fused KLA op on CUDA tensors: ``(y, yvar or None, lam, eta, precision or None)``;
    ``return_variance`` False: ``yvar`` neither written nor its gradient read.

    Prepared inputs as ``kalmanscan.core.kla_op.kla_filter`` makes them (one dtype, exact
    shapes; ``lam0, eta0`` both None for the default initial state 1, 0, read from tensors kept
    for the shape); use ``kla_filter(..., backend="triton")`` rather than calling this
    directly. Where :func:`tuning.chunks_for` gives ``C > 1`` for the lanes ``B M S``, ``L``
    and the device, the op runs in ``C`` time chunks (``chunked.py``): the same results to
    rounding.

    >>> import torch  # doctest: +SKIP
    >>> from kalmanscan.core.kla_op import kla_filter
    >>> B, L, M, S = 4, 2048, 960, 16
    >>> x = [torch.randn(B, L, M, device="cuda"), torch.rand(B, L, M, device="cuda") + 0.5,
    ...      torch.randn(B, L, S, device="cuda"), torch.randn(B, L, S, device="cuda")]
    >>> res = kla_filter(*x, torch.full((M, S), 0.9, device="cuda"),
    ...                  torch.full((M, S), 0.1, device="cuda"), backend="triton")
    """
    args = [x if x is None else x.contiguous()
            for x in (v, Lv, k, q, decay, process_var, lam0, eta0)]  # fmt: skip
    B, L, M = v.shape
    C = tuning.chunks_for(B * M * k.shape[-1], L, tuning.sm_count(v.device))
    var = bool(return_variance)
    if C > 1:
        return _chunked(args, bool(return_precision), C, var)
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)):
        # nothing to differentiate: the forward kernel alone, without autograd's Function
        # machinery (about 15 us of host time a call)
        y, yvar, lamT, etaT, prec, _, _ = forward(*args, bool(return_precision), False, var)
        return y, yvar, lamT, etaT, prec
    outs = _KLA.apply(*args, bool(return_precision), True, var)
    y, yvar, lamT, etaT = outs[:4]
    return y, yvar, lamT, etaT, (outs[4] if return_precision else None)


def _chunked(args, save_prec, C, var):
    """:func:`kla_triton` in ``C`` time chunks (``chunked.py``)."""
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)):
        y, yvar, lamT, etaT, prec = forward_chunked(*args, save_prec, False, C, var)[:5]
        return y, yvar, lamT, etaT, prec
    outs = _KLAChunked.apply(*args, save_prec, C, var)
    return outs[0], outs[1], outs[2], outs[3], (outs[4] if save_prec else None)


class _KLAGated(torch.autograd.Function):
    """The op from the default initial state whose forward kernel also writes the KLA layer's
    gated output (``forward.forward``'s ``gate``); its backward runs the gate's backward
    (``glue.gate_backward``) and then the op's, chunked or not."""

    @staticmethod
    def forward(ctx, v, Lv, k, q, a, p, zg, zc, skip, act, C, buf):
        B, L, M = v.shape
        out = empty((B, L, M), zg)
        gate = (zg, zc, skip, act, out)
        start = None
        if C > 1:
            y, _, lamT, etaT, _, ck, CK, _, start = forward_chunked(
                v, Lv, k, q, a, p, None, None, False, True, C, False, gate)  # fmt: skip
        else:
            y, _, lamT, etaT, _, ck, CK = forward(v, Lv, k, q, a, p, None, None, False, True,
                                                  False, gate)  # fmt: skip
        ctx.meta = (CK, C, act, buf)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(v, Lv, k, q, a, p, ck, start, y, zg, zc, skip)
        return out, lamT, etaT

    @staticmethod
    def backward(ctx, gout, glT, geT):
        v, Lv, k, q, a, p, ck, start, y, zg, zc, skip = ctx.saved_tensors
        CK, C, act, buf = ctx.meta
        gy, _, gskip = glue.gate_backward(gout, None, y, None, zg, zc, skip, act, False, buf)
        if C > 1:
            grads = backward_chunked(v, Lv, k, q, a, p, ck, CK, start, C, gy, None, glT, geT,
                                     None)  # fmt: skip
        else:
            grads = backward(v, Lv, k, q, a, p, ck, CK, gy, None, glT, geT, None)
        gv, gLv, gk, gq, ga, gp = grads[:6]
        return gv, gLv, gk, gq, ga, gp, None, None, gskip, None, None, None


def gate_fusable(S: int) -> bool:
    """Whether :func:`kla_gated` can run for ``S`` slots: the forward's float32 kernels store a
    channel's sums by their reduce-scatter (4 or 8 threads a channel at ``TUNING["fwd_slots"]``
    slots a thread), which is where the gate is applied."""
    return tuning.layout(S, tuning.TUNING["fwd_slots"])[0] in (4, 8)


def kla_gated(v, Lv, k, q, decay, process_var, zg, zc, skip, activation, buf):
    """The KLA layer's op and gate in one: ``(out, lamT, etaT)`` with ``out = (y + skip zc)
    act(zg[..., M:])`` in ``zg``'s dtype, ``y`` the op's readout from the default initial state
    (1, 0), without its variance, chunked in time as :func:`kla_triton` would be. The layer's
    fused glue calls it for training (``glue.GATE_IN_FORWARD``) where :func:`gate_fusable`;
    the same results as ``kla_triton`` then ``glue.gate_skip`` to float32 rounding. ``v, Lv
    [B, L, M]``, ``k, q [B, L, S]`` float32; ``decay, process_var [M, S]`` float32; ``zg [B, L,
    2M]``, ``zc [B, L, M]`` contiguous; ``skip`` a 0-d tensor; ``activation`` a name of
    ``glue.ACTIVATIONS``; ``buf`` the call's ``glue.new_grad_buffer()``."""
    B, L, M = v.shape
    S = k.shape[-1]
    if not gate_fusable(S):
        raise ValueError(f"kla_gated: S={S} slots leave the forward without its reduce-scatter"
                         f" (gate_fusable({S}) is False); use kla_triton and glue.gate_skip")
    C = tuning.chunks_for(B * M * S, L, tuning.sm_count(v.device))
    return _KLAGated.apply(v.contiguous(), Lv.contiguous(), k.contiguous(), q.contiguous(),
                           decay.contiguous(), process_var.contiguous(), zg, zc, skip,
                           glue.ACTIVATIONS[activation], C, buf)  # fmt: skip
