"""Products formed from their factors' mantissas and exponents (``frexp``), so that no partial
product passes the range where the result does not, and exact scalings by powers of two: the
filter's steps (kalmanscan/core/steps.py) and the projective scan's units
(kalmanscan/core/parallel_units.py, parallel_scan.py) build on them."""

from __future__ import annotations

import math

import torch


def _exp2(e, dtype):
    """``2**e`` for an integer tensor ``e`` within the dtype's exponents (exact)."""
    return torch.exp2(e.to(dtype))


def _times_pow2(x, e):
    """``x * 2**e`` for an integer tensor ``e``, in three factors each a number of the dtype
    (``e`` held where the result is 0 or inf whatever ``x``): exact where the result is a
    normal number, and differentiable in ``x``."""
    lim = 3 * (math.frexp(torch.finfo(x.dtype).max)[1] - 2)
    e = e.clamp(-lim, lim)
    e1 = torch.div(e, 3, rounding_mode="trunc")
    e2 = torch.div(e - e1, 2, rounding_mode="trunc")
    return x * _exp2(e1, x.dtype) * _exp2(e2, x.dtype) * _exp2(e - e1 - e2, x.dtype)


def _exponent(x):
    """``frexp``'s exponent of ``x`` (``|x|`` in ``[2^(e-1), 2^e)``), no gradient."""
    return _split(x)[1]


_LOW = -(1 << 40)  # an exponent below every other


def _split(x):
    """``(m, e)`` with ``x = m 2**e``, ``|m|`` in ``[0.5, 1)`` (0: ``(0, 0)``), no gradient."""
    m, e = torch.frexp(x.detach())
    return m, e.to(torch.int64)


def _split_product(factors, m=None, e=0):
    """The product of ``factors`` (times ``m 2**e``) as ``(mantissa product, exponent)``, each
    factor split by :func:`_split`: no partial product passes the range."""
    for f in factors:
        mf, ef = _split(f)
        m, e = (mf if m is None else m * mf), e + ef
    return m, e


class _ScaledProduct(torch.autograd.Function):
    """``prod(factors) * 2**shift`` (``shift`` an integer tensor) formed from the factors'
    mantissas and exponents with one scaling, and each derivative
    ``prod(other factors) * 2**shift`` likewise: no intermediate value, forward or backward,
    passes the range where the result does not (a derivative in ``obs_var = 1e-36``, float32,
    scaled up by its mantissa's ``2**120`` after being scaled down below the range, came out
    1e28 times the truth)."""

    @staticmethod
    def forward(ctx, shift, *factors):
        ctx.save_for_backward(shift, *factors)
        m, e = _split_product(factors)
        return _times_pow2(m, shift + e)

    @staticmethod
    def backward(ctx, g):
        shift, *factors = ctx.saved_tensors
        out = [None]
        for j, f in enumerate(factors):
            if not ctx.needs_input_grad[j + 1]:
                out.append(None)
                continue
            others = factors[:j] + factors[j + 1 :]
            # g times the others' product, itself a scaled product (differentiable again, for
            # second derivatives): g * (that product) overflowed where the product passes the
            # range though g times it does not (a decay of 0 times an offset of 1e150 in the
            # unit 2**332: NaN gradients)
            d = _ScaledProduct.apply(shift, *others, g) if others else _times_pow2(g, shift)
            # (0 where no gradient arrives: a row a cut scan leaves out, whose scale may be inf)
            out.append(torch.where(g != 0, d, 0.0).sum_to_size(f.shape))
        return tuple(out)
