"""The parallel backend's exact derivatives: no gradient to the inputs a diffuse start does not
depend on (:func:`_diffuse_inputs`), a decay's slope at a step that forgets (the limit's,
:class:`_ForgetSlope`), and the leaves' scale ``1 / max(R, h^2)`` with its derivative formed as
products (:class:`_Over`).

Part of :mod:`kalmanscan.core.parallel`, which re-exports these names.
"""

from __future__ import annotations

import torch

from kalmanscan.core.steps import hold_exponent


def _diffuse_inputs(x0, q, R, h, hz, a, p, c, d):
    """The step inputs with no gradient where a diffuse start is still diffuse: the predict's
    (``a, p, c, d``) at every step that keeps the diffuse state it enters, the observation's
    (``R, h, hz``) at those it leaves diffuse (``h = 0`` or not observed). Nothing depends on
    them there; the scan's derivatives of those leaves are exact zeros times an adjoint that
    grows like ``1/a^2`` a step (``a = 1e-10``, 3 steps: 2.4e-6 off in float64; NaN where it
    overflows)."""
    T, N = R.shape
    informative = ((q != 0) | (h != 0)).expand(T, N)
    seen = informative.to(torch.int32).cumsum(0)
    entering = (seen - informative.to(torch.int32) == 0) & (x0[0] == 0)  # state in: diffuse
    stays = entering & ~informative
    kept = entering & (q == 0)  # (a step that forgets depends on its p and c)
    a, p, c, d = (torch.where(kept, x.detach(), x) for x in (a, p, c, d))
    R, h, hz = (torch.where(stays, x.detach(), x) for x in (R, h, hz))
    return R, h, hz, a, p, c, d


class _ForgetSlope(torch.autograd.Function):
    """A leaf entry ``x``, unchanged, whose derivative in ``a`` at a step that forgets
    (``a = 0``) is the limit's (``a -> 0``), not 0: ``box[key]`` per step, which depends on the
    state entering the step and so comes from the scan, after the leaves (filled before the
    backward runs). Forward filter: ``alpha``, slope ``Rs (u + v) / u`` from a known state
    ``(u, v)``, where the limit's leaf ``[[Rs + h2s p, 0], [Rs p, 0]]``, ``alpha = Rs a``, meets
    the forgetting one's ``U = (Rs + h2s p)(u + v)``. Backward filter: ``b1, b2, alpha``, the
    limit's information ``a (E1 - c U1)`` over its normalizer ``p U1 + Rs V`` against the
    forgetting step's ``U1 + Rs V`` (``U1 = Rs U + h2s V``, ``E1 = Rs E + hzs V``)."""

    @staticmethod
    def forward(ctx, x, a, box, key):
        ctx.box, ctx.key, ctx.a_shape = box, key, a.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ga = None
        if ctx.needs_input_grad[1]:
            ga = (g * ctx.box[ctx.key]).sum_to_size(ctx.a_shape)
        return g, ga, None, None


def _forget_slope(x0, filt, q, Rs):
    """``box["slope"]`` of :class:`_ForgetSlope` from the filtered triples."""
    T, N = filt[0].shape
    u = torch.cat([x0[0].expand(1, N), filt[0][:-1]]).detach()
    v = torch.cat([x0[2].expand(1, N), filt[2][:-1]]).detach()
    known = (q != 0) & (u >= torch.finfo(u.dtype).tiny)
    return torch.where(known, Rs.detach() * (u + v) / torch.where(known, u, 1.0), 0.0)


class _Over(torch.autograd.Function):
    """``x * (1/n)`` for each ``x``, its derivative in ``n`` formed as products,
    ``-sum_i g_i (x_i / n) / n``: autograd's ``(sum_i g_i x_i) (-1/n^2)`` passed the range
    where ``n`` (``obs_var``) is huge, ``g_i x_i`` first (obs_var 1e300 in a log-likelihood of
    -1e100: NaN gradients in obs_var), or tiny, ``1/n^2`` first."""

    @staticmethod
    def forward(ctx, n, *xs):
        inv = 1 / n
        out = tuple(x * inv for x in xs)
        ctx.shapes = tuple(x.shape for x in (n, *xs))
        ctx.save_for_backward(n, inv, *out)
        return out

    @staticmethod
    def backward(ctx, *gs):
        n, inv, *outs = ctx.saved_tensors
        acc = gs[0] * outs[0]
        for g, o in zip(gs[1:], outs[1:], strict=True):
            acc = acc + g * o
        fit = lambda g, shape: g if g.shape == shape else g.sum_to_size(shape)  # noqa: E731
        g_n = fit(-(acc / n), ctx.shapes[0]) if ctx.needs_input_grad[0] else None
        return (g_n, *(fit(g * inv, sh) if need else None
                       for g, sh, need in zip(gs, ctx.shapes[1:], ctx.needs_input_grad[1:],
                                              strict=True)))  # fmt: skip


def _over_max_test(R, h, hz):
    """Whether :func:`_over_max` is to form its derivative in ``max(R, h^2)`` as products
    (differentiated, and ``max(R, h^2)`` beyond ``2**G`` or below ``2**-G``,
    steps.hold_exponent): a 0-d bool tensor (read with the call's other tests)."""
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in (R, h, hz))):
        return torch.zeros((), dtype=torch.bool, device=R.device)
    with torch.no_grad():
        n = torch.maximum(R, h * h)
        if not n.numel():
            return torch.zeros((), dtype=torch.bool, device=R.device)
        lim = 2.0 ** hold_exponent(R.dtype)
        lo, hi = torch.aminmax(n)
        return (hi > lim) | (lo < 1 / lim)


def _over_max(R, h, hz, products):
    """``(R, h^2, hz)`` over ``max(R, h^2)`` (the leaves' scale), each ``x * (1 / max)``;
    ``products`` (:func:`_over_max_test`, read): with the derivative in ``max(R, h^2)`` formed
    as products (:class:`_Over`)."""
    n = torch.maximum(R, h * h)
    if products:
        return _Over.apply(n, R, h * h, hz)
    inv = 1 / n
    return R * inv, h * h * inv, hz * inv
