"""Per-step formulas of the information-form filter, shared by every path.

Notation (one lane, one step; all tensors broadcast elementwise):

- ``lam``: precision entering the step (lambda_{t-1}); ``a2 = decay**2``; ``p``: process variance.
- ``forget``: ``decay == 0`` (exactly). Such a step forgets the past completely, even a diffuse
  one, so the prior precision is ``1/p`` (``decay = p = 0`` is rejected by the API). A nonzero
  decay whose square underflows does not forget: a diffuse belief stays diffuse through it
  (``a^2 * inf = inf``; :func:`predict` keeps ``u = 0`` as ``(0, 0, 1)``), docs/reliability.md.

Writing ``q = forget`` (0 or 1) and ``d = p if forget else a2``, the predict step is the Möbius map
``lam_pred = (lam + q) / (p*lam + d)``, equal to ``lam / (a2 + p*lam)`` whenever ``a2 > 0``. Both
numerator and denominator stay finite and positive, so no branch produces NaN (nor NaN gradients).

Gradients at a diffuse belief (docs/reliability.md, "Underflow regimes"): while a lane stays
diffuse nothing depends on its steps' parameters, and :func:`predict` and :func:`update` give
them no gradient there (exactly 0). The derivative with respect to the diffuse belief itself grows
like ``1 / a2`` a step; where it overflows it reaches only the initial state, whose gradient
:func:`start` then reports as 0 (it met the zeros of the diffuse state, ``inf * 0``, before).
"""

from __future__ import annotations

import math

import torch

# products by mantissas and exponents, exact scalings by powers of two
from kalmanscan.core.scaled import (  # noqa: F401 (re-exported: parallel_units, parallel_scan)
    _LOW,
    _exp2,
    _exponent,
    _ScaledProduct,
    _split,
    _split_product,
    _times_pow2,
)


def compact(x: torch.Tensor) -> torch.Tensor:
    """``x`` narrowed to size 1 along its broadcast (stride-0) dimensions; broadcasts back to ``x``.

    Backends receive expanded views of time- or lane-invariant parameters; elementwise work on the
    compact view costs nothing per time step or lane.
    """
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride(), strict=False)):
        if stride == 0 and size > 1:
            x = x.narrow(dim, 0, 1)
    return x


def predict_coeffs(a2: torch.Tensor, p: torch.Tensor, a: torch.Tensor | None = None):
    """Return ``(q, d)`` of the predict map ``lam -> (lam + q) / (p*lam + d)``.

    ``a`` (the decay) given: forget where ``a == 0``; else where ``a2 == 0`` (the KLA op, whose
    prior is never diffuse)."""
    forget = a2 == 0 if a is None else a == 0
    q = forget.to(a2.dtype)
    d = torch.where(forget, p, a2)
    return q, d


class _Predict(torch.autograd.Function):
    """``(lam_pred, alpha) = ((lam + q) r, a (1 - q) r)`` with ``r = 1 / (p*lam + d)``, their
    derivatives in product form (``predict_info``)."""

    @staticmethod
    def forward(lam, a, p, q, d):
        den = p * lam + d
        return (lam + q) / den, a * (1 - q) / den

    @staticmethod
    def setup_context(ctx, inputs, output):
        lam, a, p, q, d = inputs
        ctx.save_for_backward(lam, a, p, q, d, *output)

    @staticmethod
    def backward(ctx, g_pred, g_alpha):
        lam, a, p, q, d, pred, alpha = ctx.saved_tensors
        r = 1.0 / (p * lam + d)  # (an output without a gradient arrives as zeros)
        # both outputs are (something) * r: d/dp = -out lam r, d/dd = -out r (products)
        both = g_pred * pred + g_alpha * alpha
        g_lam = g_a = g_p = g_d = None
        if ctx.needs_input_grad[0]:  # (d - q p) r^2: d r^2 where the past is kept, exactly 0 else
            g_lam = (g_pred * ((d - q * p) * (r * r)) - g_alpha * (alpha * p * r)).sum_to_size(
                lam.shape
            )
        if ctx.needs_input_grad[1]:
            g_a = (g_alpha * ((1 - q) * r)).sum_to_size(a.shape)
        if ctx.needs_input_grad[2]:
            g_p = (-(both * (lam * r))).sum_to_size(p.shape)
        if ctx.needs_input_grad[4]:
            g_d = (-(both * r)).sum_to_size(d.shape)
        return g_lam, g_a, g_p, None, g_d


def predict_info(lam, a, p, q, d):
    """The predict step's prior precision ``lam_pred = (lam + q) / (p*lam + d)`` and information
    gain ``alpha = a / (a^2 + p*lam)`` (0 where the step forgets everything; ``eta_pred = alpha
    eta``), ``(lam_pred, alpha)``.

    Where autograd differentiates them, their derivatives are formed as products
    (``_Predict``): ``d lam_pred / d lam = (d - q p) / (p lam + d)^2``, and every other one
    ``-out lam r``, ``-out r`` or ``(1 - q) r``. The quotient rule on ``lam_pred``'s expression
    subtracts two terms of size ``1 / (p lam)`` for ``d lam_pred / d lam``; once
    ``a^2 << p lam`` only their rounding is left, and the float64 gradient of the start
    precision came out 0.1-1.4 % off at ``a = 1e-3, p = 6e7`` (100x at ``a = 1e-10``), against
    mpmath. The values are the quotients' (the compiled CPU kernel and the GPU kernels round
    the same way).
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in (lam, a, p, d)):
        return _Predict.apply(lam, a, p, q, d)
    return _Predict.forward(lam, a, p, q, d)


# --------------------------------------------------------------------------- homogeneous (u, e, v)
# A belief is the triple (u, e, v) up to a positive factor, u, v >= 0 not both 0: precision u/v,
# variance v/u, mean e/u, information e/v; kept normalized to max(u, v) = 1
# (docs/backend-contract.md), except where the variance is above 2**G (G = hold_exponent):
# there u is held at 2**-G and v = var 2**-G > 1 (:func:`normalize`).


class _Quotient(torch.autograd.Function):
    """``(x1 / n, x2 / n, ...)``, whose derivative in ``n`` is formed as products,
    ``-sum_i (g_i (x_i / n)) / n``. Autograd's ``-g ((x / n) / n)`` underflows where ``x / n``
    is the reciprocal of a huge ratio (``1/p`` at ``process_var / obs_var = 4e199``): its
    ``1/p^2`` is 0, though times the adjoint ``g ~ p`` the term is of order 1 (the gradients
    of ``obs_var`` and ``process_var`` came out 0.5-50x off, against mpmath)."""

    @staticmethod
    def forward(ctx, n, *xs):  # (ctx in forward: a third of setup_context's call overhead)
        out = tuple(x / n for x in xs)
        ctx.shapes = (n.shape, *(x.shape for x in xs))
        ctx.save_for_backward(n, *out)
        return out

    @staticmethod
    def backward(ctx, *gs):
        n, *outs = ctx.saved_tensors
        shapes = ctx.shapes
        fit = lambda g, i: g if g.shape == shapes[i] else g.sum_to_size(shapes[i])  # noqa: E731
        g_n = None
        if ctx.needs_input_grad[0]:
            acc = gs[0] * outs[0]
            for g, o in zip(gs[1:], outs[1:], strict=True):
                acc = acc + g * o
            g_n = fit(-(acc / n), 0)
        need = ctx.needs_input_grad
        g_x = [fit(g / n, i) if need[i] else None for i, g in enumerate(gs, 1)]
        return (g_n, *g_x)


def quotient(n, *xs):
    """``tuple(x / n for x in xs)``; where differentiated, the derivative in ``n`` is formed as
    products (:class:`_Quotient`), exact where ``x / n / n`` is below the range."""
    if _needs_grad(n, *xs):
        return _Quotient.apply(n, *xs)
    return tuple(x / n for x in xs)


# G per dtype: variances up to 2**G (1.8e19 in float64, 2.8e14 in float32) keep max(u, v) = 1
_HOLD = {torch.float64: 64, torch.float32: 48}


def hold_exponent(dtype) -> int:
    """``G``: a normalized triple whose variance ``v/u`` is above ``2**G`` has ``u = 2**-G``."""
    return _HOLD.get(dtype, _max_exponent(dtype) // 5)


def _max_exponent(dtype) -> int:
    """``emax``: ``finfo.max`` is below ``2**emax``."""
    return math.frexp(torch.finfo(dtype).max)[1]


def _top_exponent(dtype) -> int:
    """``log2 (1/tiny)``: the largest variance whose precision is a normal number."""
    return 1 - math.frexp(torch.finfo(dtype).tiny)[1]


def beyond(u, v, G):
    """Whether some triple has ``u > 0`` and ``v > 2**G u`` (a variance above ``2**G``), as a
    0-d bool tensor (no host read: callers read it with their other tests): the sign of
    ``u (v - 2**G u)``, one elementwise pass and a reduction."""
    if not u.numel():
        return torch.zeros((), dtype=torch.bool, device=u.device)
    with torch.no_grad():
        return (u * torch.add(v, u, alpha=-(2.0**G))).amax() > 0


def _above_one(v):
    """Whether some ``v`` is above 1 (a held triple's, :func:`normalize`): one reduction."""
    return bool(v.numel()) and bool(v.amax() > 1)


def held_mask(u, v):
    """Where the triple's variance ``v/u`` is above ``2**G`` and at most ``1/tiny`` (``u`` is
    then normalized to ``2**-G``, :func:`normalize`); no host read."""
    G, top = hold_exponent(u.dtype), _top_exponent(u.dtype)
    with torch.no_grad():
        return (v > u * 2.0**G) & (u > 0) & (v <= u * 2.0**top)


def held(u, v):
    """:func:`held_mask`, or None where it is nowhere (one host read)."""
    out = held_mask(u, v)
    return out if bool(out.any()) else None


def near_hold(u, v):
    """Whether some triple normalized to ``max(u, v) = 1`` has a variance of ``2**(G-1)`` or
    more, as a 0-d bool tensor (no host read). Where the triple before a division by
    ``max(u, v)`` is held (:func:`held_mask`), the normalized one is (its ``u / v`` rounds to at
    most ``2**-G``): the test of the paths that normalize by the maximum without asking
    (``checked=False``: :func:`predict`, :func:`update`), read once per call."""
    G = hold_exponent(u.dtype)
    if not u.numel():
        return torch.zeros((), dtype=torch.bool, device=u.device)
    with torch.no_grad():
        return ((u > 0) & (v >= u * 2.0 ** (G - 1))).any()


_BITS: dict = {}


def read_tests(*tests) -> list[bool]:
    """0-d bool tensors as Python bools, with one host read (on a device, one synchronization)
    for them all: each test one bit of a word."""
    if not tests:
        return []
    key = (len(tests), tests[0].device)
    bits = _BITS.get(key)
    if bits is None:
        bits = _BITS[key] = 2 ** torch.arange(len(tests), device=tests[0].device)
    word = int((torch.stack(tests) * bits).sum())
    return [bool(word >> i & 1) for i in range(len(tests))]


def normalize(u, e, v):
    """Divide the triple by ``max(u, v)`` (positive for a valid belief; :func:`quotient`), or by
    ``u 2**G`` where its variance ``v/u`` is above ``2**G`` (:func:`held`; ``u = 2**-G``,
    ``v = var 2**-G > 1``). A derivative in ``u`` is about ``(loss) / u``: with ``u = 1/var``
    it passed the range where ``|loss| var`` does (a log-likelihood of -3.2e99 at a predicted
    variance of 1e300: NaN gradients, sequential and torch alike); at ``u >= 2**-G`` only
    where ``|loss|`` passes ``finfo.max 2**-G``. Variances below ``2**G`` (and past ``1/tiny``,
    below the range as a precision: steps.lost_steps) keep ``max(u, v) = 1``. One host read
    (:func:`held`); :func:`normalize_max` where the caller knows nothing is held.

    A held ``u`` is the constant ``2**-G`` and gets no derivative (:func:`hold_gauge`), nor
    does a normalized ``u`` of a variance up to ``2**G`` (:class:`_Normalize`)."""
    return _normalized(u, e, v, held(u, v))


def hold_gauge(hold, u, e, v):
    """The triple with no derivative in ``u`` where ``hold`` (a held triple, ``u = 2**-G``:
    the same constant whatever the inputs, so its derivative is exactly 0). A variance's
    derivative in ``u`` is ``-var / u``, past the range where the variance passes
    ``finfo.max 2**-G`` (9.7e288 in float64); it met that zero derivative as ``inf * 0``
    or ``inf - inf`` (a smoothed or filtered variance of 1e300: NaN gradients). Held,
    the derivative reaches the inputs through ``e`` and ``v`` alone. ``hold`` None: the
    triple as given."""
    if hold is None:
        return u, e, v
    return torch.where(hold, u.detach(), u), e, v


def normalize_max(u, e, v):
    """Divide the triple by ``max(u, v)`` everywhere (the scans' own coordinates; the
    divisor's derivative: :class:`_Normalize`)."""
    return _normalized(u, e, v, None)


def _normalized(u, e, v, hold):
    """``(u, e, v) / n``: ``n = u 2**G`` where ``hold`` (a mask, or None: nowhere), else
    ``max(u, v)``; where differentiated, by :class:`_Normalize`."""
    if _needs_grad(u, e, v):
        u, e, v = torch.broadcast_tensors(u, e, v)  # (views; autograd sums their gradients)
        return _Normalize.apply(u, e, v, hold)
    n = _divisor(u, v, hold)
    return tuple(x / n for x in (u, e, v))


def _divisor(u, v, hold):
    """The normalizing divisor's value: ``u 2**G`` where ``hold`` (a mask, or None: nowhere),
    else ``max(u, v)``."""
    n = torch.maximum(u, v)
    return n if hold is None else torch.where(hold, u * 2.0 ** hold_exponent(u.dtype), n)


def _fixed(u, v, hold):
    """Where the normalized ``u`` is a constant (:class:`_Normalize`): ``u > 0`` and a variance
    ``v / u`` up to ``2**G``, or ``hold``."""
    fixed = (u > 0) & (v <= u * 2.0 ** hold_exponent(u.dtype))
    return fixed if hold is None else fixed | hold


def _normalized_graph(u, e, v, hold):
    """:class:`_Normalize`'s values and derivatives as a graph of torch operations: its
    derivative where a second one is taken (``create_graph``)."""
    n = _divisor(u, v, hold)
    with torch.no_grad():
        fixed = _fixed(u, v, hold)
        k = torch.where(fixed, n / torch.where(fixed, u, 1.0), 0.0)
    n = torch.where(fixed, n.detach() + (u - u.detach()) * k, n)
    return hold_gauge(fixed, *quotient(n, u, e, v))


class _Normalize(torch.autograd.Function):
    """``(u, e, v) / n``, ``n = max(u, v)`` (or ``u 2**G`` where ``hold``: :func:`normalize`),
    with one derivative rule for the divisor. Where the normalized ``u`` is a constant
    (:func:`_fixed`: ``u > 0`` and a variance up to ``2**G``, or held) it gets no derivative
    (:func:`hold_gauge`) and ``n`` has the derivative of ``u n / u`` (``n / u`` a constant): a
    derivative reaches the belief through ``e`` and ``v`` alone. Through ``max``'s own
    derivative a variance above 1 (``n = v``) put a change of the precision into ``u``, whose
    adjoint also carries the mean's terms, ``mean`` times the mean's adjoint: a smoothed
    mean's derivative of ``1e-100`` in a process variance beside a mean of ``1e50`` was lost
    to their rounding, all of it, or half at a tie (``u = v``: ``max`` splits its derivative)
    (the sequential smoother on LOADING0 with a loading of ``1e-150`` at its step of variance
    ``1e300``: tests/test_sequential_loading0_smooth_grad.py). Elsewhere (``u = 0``, or a
    variance past the range) ``n`` is ``max(u, v)`` with ``max``'s derivative. The derivative
    in ``n`` is formed as products, as :class:`_Quotient`'s. One node in place of the dozen
    operations of :func:`_normalized_graph`, which gives the second derivative."""

    @staticmethod
    def forward(ctx, u, e, v, hold):
        n = _divisor(u, v, hold)
        out = (u / n, e / n, v / n)
        ctx.hold = hold
        ctx.save_for_backward(u, e, v, n, *out)
        return out

    @staticmethod
    def backward(ctx, gU, gE, gV):
        u, e, v, n, U, E, V = ctx.saved_tensors
        hold = ctx.hold
        if torch.is_grad_enabled():  # create_graph: the graph of the same rule, differentiated
            wrt = [x for x in (u, e, v) if x.requires_grad]
            with torch.enable_grad():
                outs = _normalized_graph(u, e, v, hold)
                got = iter(torch.autograd.grad(outs, wrt, (gU, gE, gV), allow_unused=True,
                                               create_graph=True))  # fmt: skip
            return (*(next(got) if x.requires_grad else None for x in (u, e, v)), None)
        fixed = _fixed(u, v, hold)
        gU = torch.where(fixed, 0.0, gU)
        g_n = -((gU * U + gE * E + gV * V) / n)
        k = torch.where(fixed, n / torch.where(fixed, u, 1.0), 0.0)
        half = torch.where(u == v, 0.5 * g_n, g_n)  # (max's own derivative, split at a tie)
        g_u = gU / n + torch.where(fixed, g_n * k, torch.where(u < v, 0.0, half))
        g_v = gV / n + torch.where(fixed | (u > v), 0.0, half)
        return g_u, gE / n, g_v, None


def from_prior(mean, var):
    """The normalized triple of the prior ``N(mean, var)``; ``var = inf`` is diffuse, 0 exact.
    A variance above ``2**G`` gives ``(2**-G, mean 2**-G, var 2**-G)`` (:func:`normalize`: a
    triple ``(1/var, mean/var, 1)`` passes its derivatives' range)."""
    diffuse = torch.isposinf(var)  # -inf is invalid: it stays in v, where a backend flags it
    big = (var > 1) & ~diffuse
    var_s = torch.where(big, var, 1.0)  # divides only where finite and > 1
    u = torch.where(diffuse, 0.0, 1 / var_s)
    # 0 * mean: a NaN or inf mean stays visible; no gradient (a diffuse prior has no mean)
    e = torch.where(diffuse, 0 * mean.detach(), mean / var_s)
    v = torch.where(big | diffuse, 1.0, var)
    # (selects, not a host read: the values elsewhere are those of max(u, v) = 1)
    hold = held_mask(u, v)
    low = 2.0 ** -hold_exponent(var.dtype)
    u = torch.where(hold, low, u)
    e = torch.where(hold, mean * low, e)
    v = torch.where(hold, var * low, v)
    return u, e, v


def from_info(lam, eta):
    """The normalized triple of the information state ``(lam, eta)`` (finite ``lam >= 0``)."""
    big = torch.isfinite(lam) & (lam > 1)
    lam_s = torch.where(big, lam, 1.0)
    one = torch.ones_like(lam_s)
    return (  # an infinite lam is invalid: it stays in u, where a backend flags it
        torch.where(big, one, lam),
        torch.where(big, eta / lam_s, eta),
        torch.where(big, 1 / lam_s, one),
    )


def _needs_grad(*xs):
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in xs)  # fmt: skip


def _no_grad_where(cond, *xs):
    """``xs`` with no gradient where ``cond`` (their values unchanged)."""
    return tuple(torch.where(cond, x.detach(), x) for x in xs)


class _Divided(torch.autograd.Function):
    """``(a (e/u), (a (v/u)) a)``, the terms of the predicted triple divided by ``u`` where
    ``a^2`` is below the normal range (:func:`predict`), with derivatives grouped so that none
    passes the range where the terms do not (``-term/u`` for ``u``: autograd's ``1/u^2`` of
    ``u = 1e-30`` overflowed float32, and its ``a*a`` underflowed: NaN)."""

    @staticmethod
    def forward(u, e, v, a):
        av = a * (v / u)
        return a * (e / u), av * a

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, *output)

    @staticmethod
    def backward(ctx, g_e, g_v):
        u, e, v, a, te, tv = ctx.saved_tensors
        g = [None] * 4
        if ctx.needs_input_grad[0]:
            g[0] = -(g_e * (te / u) + g_v * (tv / u))
        if ctx.needs_input_grad[1]:
            g[1] = g_e * (a / u)
        if ctx.needs_input_grad[2]:
            g[2] = g_v * ((a / u) * a)
        if ctx.needs_input_grad[3]:
            g[3] = g_e * (e / u) + g_v * (2 * (a * (v / u)))
        return tuple(x if x is None else x.sum_to_size(y.shape)
                     for x, y in zip(g, (u, e, v, a), strict=True))  # fmt: skip


def predict(u, e, v, a, p, c, q, d, carried=True, checked=True):
    """Predict: ``(u, e, v)`` -> the normalized prior of the next step (q, d: predict_coeffs).

    A diffuse belief (``u_ = 0``: ``u = 0`` and the step keeps the past) stays ``(0, 0, 1)``
    also where ``d v = a^2 v`` underflows or is subnormal (the same belief as ``(0, 0, a^2 v)``;
    dividing by a subnormal ``v_`` would give an infinite derivative, and NaN gradients); the
    step's parameters get no gradient there (nothing depends on them). Where ``a^2`` is below
    the normal range and the past is known (``u > 0``), the triple is formed divided by ``u``,
    ``(1, c + a e/u, p + (a v/u) a)``: ``a^2 v`` and ``a e`` keep their digits where they
    underflowed (``var = 1e100``, ``a = 1e-170``, ``p = 0``: the predicted variance 1e-240, not
    0). At a step that forgets (``a = 0``) from a known past, ``a``'s derivative is the limit's
    (the predicted mean ``c + a mean``), not 0.

    From a held triple (:func:`normalize`; ``v > 1``) a step that forgets is formed from the
    triple divided by a power of two near ``v`` (``c (u + v)`` passed the range), and where
    ``a^2 v`` passes the range (a predicted variance past ``finfo.max 2**G``, far below the
    range as a precision: steps.lost_steps) the prediction is ``(0, 0, 1)``.

    ``carried``: the result is the next step's input (the mean kept through the normalization
    where it divides by the variance, :func:`kept_mean`); the torch scan's predictions, which
    nothing carries on, skip that. ``checked=False``: no held triple comes in (``v <= 1``) and
    the result is divided by ``max(u, v)`` without asking whether to hold it (no host read; the
    caller tests the results, :func:`near_hold`, and runs the call again checked where it
    must)."""
    keep_a = a * (1 - q)
    u0, e0 = u, e  # (the forget slope's mean e/u, below)
    big = v > 1 if checked and _above_one(v) else None
    if big is not None:
        w = torch.where(big & (q != 0), _exp2(_exponent(v), v.dtype), 1.0)
        u, e, v = u / w, e / w, v / w
    # (a select: where the past is kept u_ is u, not u + 0 v, whose derivative in v is 0 times
    # the adjoint of u_, -var/u from a held triple: past the range at a variance of 1e300, NaN)
    u_ = torch.where(q != 0, u + q * v, u)
    if _needs_grad(a, p, c, d):
        diffuse = u_ == 0
        a_, p, c, d, keep_a = _no_grad_where(diffuse, a, p, c, d, keep_a)
    else:
        a_ = a
    v_ = p * u + d * v
    v_ = torch.where((u_ == 0) & (v_ < torch.finfo(v_.dtype).tiny), v, v_)
    e_ = c * u_ + keep_a * e
    tiny = torch.finfo(u.dtype).tiny
    known = u0 >= tiny  # (a subnormal u: a variance past finfo.max, left as it is)
    u_s = torch.where(known, u0, 1.0)
    scaled = (d < tiny) & (q == 0) & known
    if _needs_grad(u0, e0, v, a_):
        te, tv = _Divided.apply(u_s, e0, v, torch.where(scaled, a_, 0.0))
    else:
        te, tv = _Divided.forward(u_s, e0, v, torch.where(scaled, a_, 0.0))
    u_ = torch.where(scaled, 1.0, u_)
    e_ = torch.where(scaled, c + te, e_)
    v_ = torch.where(scaled, p + tv, v_)
    if big is not None:
        lost = big & torch.isinf(v_) & torch.isfinite(d)
        if bool(lost.any()):
            u_, e_, v_ = (torch.where(lost, x, y) for x, y in zip((0.0, 0.0, 1.0), (u_, e_, v_),
                                                                   strict=True))  # fmt: skip
    if _needs_grad(a_):
        # forget from a known past: d/da of the predicted mean c + a (e/u), its value unchanged
        slope = torch.where(known & (q != 0), e0 / u_s * u_, 0.0).detach()
        e_ = e_ + (a_ - a_.detach()) * slope
    un, en, vn = (normalize if checked else normalize_max)(u_, e_, v_)
    if carried and _REPEATED_ROUNDING(u.dtype):
        # dividing by ``v_`` (variance above 1) rounds ``e_`` and ``u_`` apart: the mean kept
        with torch.no_grad():
            m = e_ / u_
        en = kept_mean(un, en, m, (u_ > 0) & (v_ > u_))
    return un, en, vn


def update(u, e, v, R, h, hz, checked=True):
    """Update step in its ``R``-scaled form: ``(R u + h^2 v, R e + h z v, R v)``, which is adding
    the information ``phi = h^2/R``, ``r = h z/R`` times ``R`` (the same belief; no ``1/R``, so
    its gradient in ``R`` stays exact for tiny ``R``). ``(R, h, hz) = (1, 0, 0)``: no update.
    Where a diffuse belief stays diffuse (``u = 0``, ``h = 0``) ``R, h, hz`` get no gradient
    (a loading 0 there: a nonzero one would make the step the lane's first informative one, a
    jump in the exact diffuse log-likelihood, so there is no derivative; 0 is reported).
    ``checked=False``: :func:`observe`'s and :func:`normalize`'s tests left to the caller
    (:func:`observe_unusual`)."""
    if _needs_grad(R, h, hz):
        R, h, hz = _no_grad_where((u == 0) & (h == 0), R, h, hz)
    u1, e1, v1 = observe(u, e, v, R, h, hz, checked)
    un, en, vn = (normalize if checked else normalize_max)(u1, e1, v1)
    if _REPEATED_ROUNDING(u.dtype):
        with torch.no_grad():
            m1 = _robust_mean(u, e, v, R, h, hz, u1, v1)
        en = kept_mean(un, en, m1, (u > 0) & (u1 > 0))
    return un, en, vn


def _robust_mean(u, e, v, R, h, hz, u1, v1):
    """The updated mean with weights on the prior mean ``m`` and the observation's state
    ``z / h`` that sum to 1 whatever the roundings of ``u1 = R u + h^2 v``: the nearer end plus
    the step toward the other, ``m + g (z/h - m)`` where the observation's weight ``g`` is below
    a half, ``z/h + (1 - g) (m - z/h)`` above (the first form cancels where ``g`` is near 1 and
    ``|m|`` far above the result: a prior mean of 1e10 met an observation of 1). ``v1 / u1``
    (the new variance) and not ``v / u1``: observe's scaled form scales both."""
    var1 = v1 / u1
    m = e / u
    g = var1 * (h * h / R)
    toward_z = m + var1 * ((hz - h * h * m) / R)
    zh = hz / torch.where(h != 0, h * h, 1.0)
    w = var1 * (u / torch.where(v > 0, v, 1.0))  # (R u / u1, the prior mean's weight)
    toward_m = zh + w * (m - zh)
    return torch.where((g > 0.5) & (v > 0) & (h != 0), toward_m, toward_z)


def _REPEATED_ROUNDING(dtype) -> bool:
    """Whether the filter's means are formed in the rounding-robust forms (:func:`kept_mean`):
    below float64. A settled filter repeats a step's inputs, and so the rounding ``d`` of
    ``u1 = R u + h^2 v``; the normalized mean ``e1 / u1`` then weighs the prior mean and the
    observation by ``1 - d`` in all, the same ``d`` every step: the filter tracks the decay
    ``a (1 - d)``, and a shared decay's float32 gradient on a random walk of 10^5 steps was
    1.4e-2 off (docs/reliability.md). float64's ``d`` (1e-16) leaves 1e-12 at 10^6 steps."""
    return dtype not in (torch.float64, torch.complex128)


def kept_mean(un, en, mean, ok):
    """``en`` with the value ``un * mean`` where ``ok`` (a normalized triple's information for a
    mean formed in a rounding-robust form); the derivatives stay ``en``'s (the same formula's in
    exact arithmetic), nothing where not ``ok`` or not finite."""
    with torch.no_grad():
        fixed = un * mean
        delta = torch.where(ok & torch.isfinite(fixed), fixed - en, 0.0)
    return en + delta


def _unusual_product(v, out):
    """Where :func:`observe` forms its products scaled: a held triple (``v > 1``), a product
    past the range, or a new ``u`` below ``2**-G``."""
    with torch.no_grad():
        low = 2.0 ** -hold_exponent(v.dtype)
        return (v > 1) | ~torch.isfinite(out[1]) | ((out[0] < low) & (out[0] > 0))


def observe_unusual(u, e, v, R, h, hz):
    """Whether :func:`update` (``checked=True``) would take a branch its ``checked=False`` form
    does not, on triples ``(u, e, v)`` entering it (any shape broadcasting with ``R, h, hz``;
    every step's at once): :func:`observe`'s scaled products or a held result. A 0-d bool
    tensor (no host read); the products are formed as :func:`observe` forms them, so the test
    is exact."""
    with torch.no_grad():
        h2 = h * h
        out = R * u + h2 * v, R * e + hz * v, R * v
        return (_unusual_product(v, out) | held_mask(out[0], out[2])).any()


def observe(u, e, v, R, h, hz, checked=True):
    """``(R u + h^2 v, R e + hz v, R v)``: the update ``(u + phi v, e + r v, v)`` times ``R``.
    Where a product passes the range though the belief does not (``obs_var`` 1e300 times a
    mean of 1e10: OverflowError), the triple is held (:func:`normalize`, ``v > 1``), or the new
    ``u`` is below ``2**-G`` (its derivative, about ``(loss) / u``, passes the range first), the
    same belief times ``2**k``, ``k`` bringing the new ``u`` to about 1, each term one
    :class:`_ScaledProduct` of its factors: no product, nor a derivative of one, passes the
    range on the way (a factor scaled down, ``h z / obs_var``, times one scaled up, a held
    ``v``, has a derivative in the first that does). ``checked=False``: the plain products,
    without the test (no host read; :func:`observe_unusual`)."""
    h2 = h * h
    out = R * u + h2 * v, R * e + hz * v, R * v
    if not checked:
        return out
    bad = _unusual_product(v, out)
    if not bool(bad.any()):
        return out
    with torch.no_grad():
        eR, eh, ehz, eu, ee, ev = (_exponent(x) for x in (R, h, hz, u, e, v))
        eA = torch.maximum(torch.where(u != 0, eR + eu, _LOW),
                           torch.where((h != 0) & (v != 0), 2 * eh + ev, _LOW))  # fmt: skip
        top = torch.maximum(torch.maximum(eR + ev, eR + ee), ehz + ev)
        k = torch.minimum(torch.where(eA == _LOW, 0, -eA), _max_exponent(v.dtype) - 2 - top)
    sp = _ScaledProduct.apply
    scaled = (sp(k, R, u) + sp(k, h, h, v), sp(k, R, e) + sp(k, hz, v), sp(k, R, v))
    return tuple(torch.where(bad, x, y) for x, y in zip(scaled, out, strict=True))


class _Start(torch.autograd.Function):
    """The initial triple, unchanged; its gradient 0 where it is not finite at a diffuse start."""

    @staticmethod
    def forward(u, e, v):
        return u.view_as(u), e.view_as(e), v.view_as(v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, gu, ge, gv):
        (u,) = ctx.saved_tensors
        out = []
        for g, need in zip((gu, ge, gv), ctx.needs_input_grad, strict=True):
            if g is None or not need:
                out.append(None)
                continue
            bad = (u == 0) & ~torch.isfinite(g)
            out.append(torch.where(bad, 0.0, g))
        return tuple(out)


def start(u, e, v, checked=True):
    """The normalized initial triple. Where it is diffuse (``u = 0``) the gradient it receives
    is the derivative with respect to a diffuse state's precision and information, which grows
    like ``1 / a^2`` (``1 / a``) over each step the lane stays diffuse: exact where it is a
    number of the dtype, 0 where it overflowed (module docstring). ``checked=False``: divided
    by ``max(u, v)`` (no host read; the caller asks :func:`held_mask` of the input)."""
    u, e, v = (normalize if checked else normalize_max)(u, e, v)
    if _needs_grad(u, e, v):
        return _Start.apply(u, e, v)
    return u, e, v


def _fill_inf(e):
    nan = torch.full_like(e, float("nan"))
    return torch.where(e == 0, nan, torch.copysign(torch.full_like(e, float("inf")), e)).detach()


def moments(u, e, v):
    """``(mean, var, precision, info)`` of triples; NaN/inf where u or v is 0 (no NaN gradients)."""
    known = u > 0
    exact = v == 0
    u_s = torch.where(known, u, 1.0)
    v_s = torch.where(exact, 1.0, v)
    # (quotient: the derivatives in u and v as products; autograd's (v / u) / u overflowed where
    # a variance is past the square root of the range, and met a zero adjoint: NaN)
    mean, var = quotient(u_s, e, v)
    precision, info = quotient(v_s, u, e)
    mean = torch.where(known, mean, float("nan"))
    var = torch.where(known, var, float("inf"))
    precision = torch.where(exact, float("inf"), precision)
    info = torch.where(exact, _fill_inf(e), info)
    return mean, var, precision, info


_LOG_2PI = 1.8378770664093453


def lost_steps(u_, u_in):
    """Where a step's predicted precision is below the dtype's normal range though it is not a
    diffuse state carried on: ``u- < tiny`` with ``u- > 0`` (subnormal: its log-likelihood term
    would keep a few digits) or with the state entering the step informative (``u > 0``: the
    predicted variance passed the range, and the term would be left out). ``u-`` and ``u`` are
    normalized triples' first coordinates (docs/backend-contract.md, "Log-likelihood")."""
    return (u_ < torch.finfo(u_.dtype).tiny) & (u_ + u_in > 0)


def loglik_terms(z, obs_var, h, u_, e_, v_, any_held=None):
    """Per-step log-likelihood from the normalized predicted triple (exact diffuse convention).

    0 where ``z`` is NaN, and at a diffuse prior step (``u- = 0``) unless ``h = 0`` there.
    ``any_held``: whether a triple is held (:func:`normalize`, ``v- > 1``), where the caller
    knows (False: no host read); None: asked.
    """
    observed = ~torch.isnan(z)
    known = u_ > 0
    contrib = observed & (known | (h == 0))
    zz = torch.where(observed, z, 0.0)
    R = torch.where(observed, obs_var, 1.0)
    u_s = torch.where(known, u_, 1.0)
    m = None
    # held triples (normalize): h^2 v- passes the range from |h| = 2**101
    if _above_one(v_) if any_held is None else any_held:
        # (h, z by 2**-m and R by 4**-m, m from h^2: log s back by 2 m log 2)
        big = v_ > 1
        m = torch.where(big, torch.clamp(_exponent(h * h) // 2, min=0), 0)
        sc = _exp2(-m, v_.dtype)
        h, zz, R = h * sc, zz * sc, R * (sc * sc)
    # u- times the innovation variance; h (h v-), not (h h) v-: d/d(h^2) = g v- passed the
    # range at v- near 1e300 and times h = 0 gave a NaN gradient in the loading
    s = h * (h * v_) + R * u_s
    s = torch.where(contrib, s, 1.0)
    w = (zz * u_s - h * e_) / (torch.sqrt(u_s) * torch.sqrt(s))
    log_s = torch.log(s) if m is None else torch.log(s) + m.to(s.dtype) * (2 * math.log(2))
    ll = -0.5 * (_LOG_2PI + log_s - torch.log(u_s) + w * w)
    return torch.where(contrib, ll, 0.0)


def _combine(u, e, v, U, E, V, any_held=None):
    den = u * V + U * v
    both_exact = (v == 0) & (V == 0)
    known = den > 0
    den_s = torch.where(known, den, 1.0)
    u_s = torch.where(u > 0, u, 1.0)
    num, vv = e * V + E * v, v * V
    if any_held is None:
        any_held = _above_one(v) or _above_one(V)
    big = (v > 1) | (V > 1) if any_held else None
    if big is not None:  # (held triples: the form below; no inf in this one's derivatives)
        num, vv = torch.where(big, 0.0, num), torch.where(big, 0.0, vv)
    mean, var = quotient(den_s, num, vv)  # (derivatives in den as products)
    if big is not None:
        mean, var = _combine_held(big, u, e, v, U, E, V, mean, var)
    mean = torch.where(known, mean, float("nan"))
    var = torch.where(known, var, float("inf"))
    mean = torch.where(both_exact, e / u_s, mean)
    var = torch.where(both_exact, 0.0, var)
    return mean, var


def _combine_held(big, u, e, v, U, E, V, mean, var):
    """:func:`_combine` where a triple is held (``v > 1`` or ``V > 1``, :func:`normalize`):
    ``e V + E v`` and ``v V`` are the means and variances times ``2**(2G)`` there and passed
    the range (a mean of 1e200 with variances of 1e300 on both sides: inf), and their
    derivatives in ``u`` were the smoothed mean times its variance (NaN). Formed from each
    side's mean and variance: with ``s`` the side of the smaller variance and ``l`` the other,
    ``r = var_s / var_l`` (at most 1; 0 where ``l`` knows nothing), the variance
    ``var_s / (1 + r)`` and the mean ``(m_s + r m_l) / (1 + r)``. Every derivative on the way
    is at most the output's per unit of its input (``d var / d var_s = 1/(1+r)^2``); the
    weights as products (``u V / den``) had derivatives ``var / den``, past the range at a
    variance of 1e300 beside a side that knows nothing (``U = 0``: after a step that forgets),
    which met that zero as ``inf * 0`` (NaN gradients). Where a side knows nothing its term is
    ``E var_f / V`` (``e var_b / v``): 0, with the derivative in ``E`` (``e``)."""
    kf, kb = u > 0, U > 0
    (mf, vf) = quotient(torch.where(kf, u, 1.0), e, v)
    (mb, vb) = quotient(torch.where(kb, U, 1.0), E, V)
    f = (u * V >= U * v).detach()  # (the forward side's variance is the smaller)
    ms, vs, ks = torch.where(f, mf, mb), torch.where(f, vf, vb), torch.where(f, kf, kb)
    ml, vl, kl = torch.where(f, mb, mf), torch.where(f, vb, vf), torch.where(f, kb, kf)
    (r,) = quotient(torch.where(kl & (vl > 0), vl, 1.0), torch.where(kl, vs, 0.0))
    (ws, wl) = quotient(1 + r, torch.ones_like(r), r)
    # (where a side knows nothing: its information over the other's precision, 0 in value)
    n, info = torch.where(f, V, v), torch.where(kl, 0.0, torch.where(f, E, e))
    (lone,) = quotient(torch.where(n > 0, n, 1.0), info * torch.where(ks, vs, 0.0))
    held_mean = ws * ms + torch.where(kl, wl * ml, lone)
    held_var = ws * vs
    return torch.where(big, held_mean, mean), torch.where(big, held_var, var)


class _Combine(torch.autograd.Function):
    """:func:`combine_two_filter`, whose backward differentiates only the steps whose outputs
    receive a gradient. The smoothed precision ``u V + U v`` of a step before a small decay is
    that decay squared times a later one's (``1e-200`` at ``a = 1e-100``): the derivative of its
    variance passes the range, and where the step's outputs were not differentiated it met
    their zero gradient (``0 * inf``: NaN in every gradient of ``ks.smooth``). Where one side
    knows nothing (``u = 0`` or ``U = 0``: a diffuse filter, nothing observed after or a step
    that forgets), the derivative in that coordinate is about the smoothed mean times the other
    side's variance and passes the range with it (a mean of 1e200, a variance of 1e300); the
    coordinate is 0 whatever the inputs there, so a non-finite derivative is reported as 0
    (it met that zero derivative: NaN in every gradient). So is a held one's (``v > 1``: the
    constant ``u = 2**-G``, :func:`hold_gauge`; ``-var / u`` at a variance of 1e300)."""

    @staticmethod
    def forward(u, e, v, U, E, V, any_held):
        return _combine(u, e, v, U, E, V, any_held)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:6])
        ctx.any_held = inputs[6]  # (the harmless point below holds nothing)

    @staticmethod
    def backward(ctx, g_mean, g_var):
        xs = ctx.saved_tensors
        need_grad = ctx.needs_input_grad[:6]
        gm = torch.zeros_like(xs[0]) if g_mean is None else g_mean
        gv = torch.zeros_like(xs[0]) if g_var is None else g_var
        active = (gm != 0) | (gv != 0)
        create = torch.is_grad_enabled()  # create_graph: the inputs themselves, differentiated
        with torch.enable_grad():
            leaves = [x if create else x.detach().requires_grad_(need)
                      for x, need in zip(xs, need_grad, strict=True)]  # fmt: skip
            # the other steps at a harmless point: (1, 0, 1) with (0, 0, 1)
            safe = [torch.where(active, x, s) for x, s in zip(leaves, (1.0, 0, 1, 0, 0, 1),
                                                               strict=True)]  # fmt: skip
            mean, var = _combine(*safe, ctx.any_held)
            wrt = [x for x, need in zip(leaves, need_grad, strict=True) if need]
            got = iter(torch.autograd.grad((mean, var), wrt, (gm, gv), allow_unused=True,
                                           create_graph=create))  # fmt: skip
        out = []
        for i, (x, need) in enumerate(zip(xs, need_grad, strict=True)):
            g = next(got) if need else None
            if need:
                g = torch.zeros_like(x) if g is None else torch.where(active, g, 0.0)
                if i in (0, 3):  # (u, U = 0 or held: docstring; a select, not a host read)
                    fixed = (x == 0) | (xs[i + 2] > 1)
                    g = torch.where(fixed & ~torch.isfinite(g), 0.0, g)
            out.append(g)
        return (*out, None)


def combine_two_filter(u, e, v, U, E, V, any_held=None):
    """Smoothed ``(mean, var)`` from the filtered triple and the backward information triple
    (where differentiated, only the steps whose outputs receive a gradient are: ``_Combine``).
    ``any_held``: whether a triple is held (``v > 1`` or ``V > 1``), where the caller knows
    (False: no host read); None: asked."""
    if _needs_grad(u, e, v, U, E, V):
        u, e, v, U, E, V = torch.broadcast_tensors(u, e, v, U, E, V)
        return _Combine.apply(u, e, v, U, E, V, any_held)
    return _combine(u, e, v, U, E, V, any_held)
