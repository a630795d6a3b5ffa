"""The entry of the ``"triton"`` backend of ``kla_filter``: :func:`kla_triton`, the forward
kernel alone when nothing is differentiated, else an autograd Function whose backward runs the
backward kernel from the forward's checkpoints; in ``C > 1`` time chunks where
:func:`tuning.chunks_for` asks for them (few lanes, long sequences: ``chunked.py``)."""

from __future__ import annotations

import torch

from kalmanscan.cuda.kla import tuning
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
