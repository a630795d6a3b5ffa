"""Chunked parallel scans in torch: the Möbius (precision) scan and the affine (information) scan.

Shapes: every sequence is ``[T, N]`` (time first, N independent lanes); initial values are ``[N]``.

Möbius leaf ``t``: the map ``lam -> (A lam + B) / (C lam + D)`` with entrywise non-negative
``[[A, B], [C, D]]`` whose first column is non-zero. Maps compose by matrix product
(later @ earlier);
products are divided by the sum of their entries, which keeps them in range and changes no map.
Affine leaf ``t``: ``x -> alpha x + b``; ``(alpha1, b1)`` then ``(alpha2, b2)`` is
``(alpha2 alpha1, alpha2 b1 + b2)``.

Both scans are reduce-then-scan: split time into ``n`` chunks of ``K`` steps, reduce each chunk to
its composed map (a pairwise tree, ``log2 K`` vectorized levels), scan the ``n`` chunk maps by the
same algorithm (recursively) to get each chunk's entry value, then run the chunk-local recursion for
all chunks at once (``K`` vectorized steps over ``n * N`` lanes). Work is O(T N); the number of
sequential torch operations is about ``K`` per level. ``n`` is chosen from the shape so that each
vectorized step touches enough elements: many lanes need no time-chunking, one long lane uses many.
Derivation: docs/algorithm.md. A third scan, of shift-and-clamp maps on logs
(:func:`clamp_scan`), estimates the scale of each step's variance for the projective scan's
units (kalmanscan/core/parallel_units.py).
"""

from __future__ import annotations

import torch

from kalmanscan.core._args import broadcast_shapes
from kalmanscan.core.steps import normalize_max

_TARGET_ELEMS = 1 << 15  # elements per vectorized step worth aiming for
_MIN_CHUNK = 16


def num_chunks(T: int, N: int) -> int:
    """Number of time chunks for a ``[T, N]`` scan (1 = plain recursion over time)."""
    if T < 2 * _MIN_CHUNK:
        return 1
    want = max(1, _TARGET_ELEMS // max(N, 1))
    return int(min(T // _MIN_CHUNK, want))


def mobius_compose(later, earlier):
    """Compose Möbius maps ``later ∘ earlier`` (tuples ``(A, B, C, D)``), entry-sum normalized."""
    A2, B2, C2, D2 = later
    A1, B1, C1, D1 = earlier
    A = A2 * A1 + B2 * C1
    B = A2 * B1 + B2 * D1
    C = C2 * A1 + D2 * C1
    D = C2 * B1 + D2 * D1
    s = A + B + C + D
    return A / s, B / s, C / s, D / s


def affine_compose(later, earlier, annihilate: bool = False):
    """Compose affine maps ``later ∘ earlier`` (tuples ``(alpha, b)``).

    ``annihilate``: ``0 * x = 0`` even for infinite or NaN ``x`` (used by the smoother, where an
    unconstrained state has infinite variance and a zero gain cuts it off).
    """
    a2, b2 = later
    a1, b1 = earlier
    if annihilate:
        b1 = b1.masked_fill(a2 == 0, 0.0)
    return a2 * a1, a2 * b1 + b2


def _tree_reduce(leaves, compose):
    """Reduce ``[n, K, N]`` leaves along K (earliest first) to ``[n, N]``; K is a power of two."""
    while leaves[0].shape[1] > 1:
        earlier = tuple(x[:, 0::2] for x in leaves)
        later = tuple(x[:, 1::2] for x in leaves)
        leaves = compose(later, earlier)
    return tuple(x[:, 0] for x in leaves)


def _chunked(leaves, T, N):
    """View the first ``n*K`` steps of ``[T, N]`` leaves as ``[n, K, N]`` (K a power of two).

    Broadcast (stride-0) leaves stay unmaterialized. The ``T - n*K < K`` remaining steps are
    continued by the plain recursion from the last chunk's end.
    """
    n = num_chunks(T, N)
    K = 1 << max(0, (T // n).bit_length() - 1)  # largest power of two <= T / n
    n = T // K
    return n, K, tuple(x.expand(T, N)[: n * K].reshape(n, K, N) for x in leaves)


def _tail(leaves, n, K):
    return tuple(x[n * K :] if x.shape[0] > 1 else x for x in leaves)


def mobius_scan(A, B, C, D, lam0):
    """Apply Möbius leaves ``[T, N]`` in turn from ``lam0 [N]``; return every ``lam_t [T, N]``."""
    return _loop_in_chunks((A, B, C, D), lam0, mobius_compose, _mobius_loop)


def _loop_in_chunks(leaves, x0, compose, loop):
    """Apply ``leaves`` (each ``[T, N]`` or ``[1, N]``) in turn from ``x0 [N]`` with ``loop``
    (step by step), in chunks where there are enough steps: each chunk's leaves composed
    (``compose``, a tree), the chunks' starts by the same scan over the totals, then each chunk
    looped from its start, all chunks at once."""
    T, N = broadcast_shapes(*(x.shape for x in leaves))
    if num_chunks(T, N) <= 1:
        return loop(leaves, x0)
    n, K, chunks = _chunked(leaves, T, N)
    totals = _tree_reduce(chunks, compose)
    ends = _loop_in_chunks(totals, x0, compose, loop)
    starts = torch.cat([x0.expand(1, N), ends[:-1]])
    x = loop(tuple(y.transpose(0, 1) for y in chunks), starts)  # [K, n, N]
    x = x.transpose(0, 1).reshape(n * K, N)
    if n * K == T:
        return x
    return torch.cat([x, loop(_tail(leaves, n, K), ends[-1])])


def _mobius_loop(leaves, lam):
    T = max(x.shape[0] for x in leaves)
    pick = [(lambda t, x=x: x[t] if x.shape[0] > 1 else x[0]) for x in leaves]
    out = []
    for t in range(T):
        a, b, c, d = (f(t) for f in pick)
        lam = torch.addcmul(b, a, lam) / torch.addcmul(d, c, lam)
        out.append(lam)
    return torch.stack(out)


def affine_scan(alpha, b, x0, annihilate: bool = False):
    """``x_t = alpha_t x_{t-1} + b_t`` from ``x0 [N]`` for ``[T, N]`` inputs; returns ``x``."""
    T, N = broadcast_shapes(alpha.shape, b.shape)
    if num_chunks(T, N) <= 1:
        return _affine_loop(alpha, b, x0, annihilate)
    n, K, (al, bl) = _chunked((alpha, b), T, N)

    def compose(later, earlier):
        return affine_compose(later, earlier, annihilate)

    totals = _tree_reduce((al, bl), compose)
    ends = affine_scan(*totals, x0, annihilate)
    starts = torch.cat([x0.expand(1, N), ends[:-1]])
    x = _affine_loop(al.transpose(0, 1), bl.transpose(0, 1), starts, annihilate)
    x = x.transpose(0, 1).reshape(n * K, N)
    if n * K == T:
        return x
    ta, tb = _tail((alpha, b), n, K)
    return torch.cat([x, _affine_loop(ta, tb, ends[-1], annihilate)])


def _affine_loop(alpha, b, x, annihilate):
    T = max(alpha.shape[0], b.shape[0])
    out = []
    for t in range(T):
        a_t = alpha[t] if alpha.shape[0] > 1 else alpha[0]
        b_t = b[t] if b.shape[0] > 1 else b[0]
        if annihilate:
            x = x.masked_fill(a_t == 0, 0.0)
        x = torch.addcmul(b_t, a_t, x)
        out.append(x)
    return torch.stack(out)


# ------------------------------------------------------------------------------ clamp scan
# Leaf t: x -> min(hi, max(lo, x + D)) with lo <= hi (a shift, then a clamp), on float64 logs
# of variances; infinities are held as +-_CLAMP_INF, far beyond any finite log2 of a float.
_CLAMP_INF = 2.0**50


def clamp_compose(later, earlier):
    """Compose clamp maps ``later ∘ earlier`` (tuples ``(D, lo, hi)``): a shift by the sum,
    clamped to the earlier bounds shifted and clamped by the later ones."""
    D2, lo2, hi2 = later
    D1, lo1, hi1 = earlier
    D = (D1 + D2).clamp(-_CLAMP_INF, _CLAMP_INF)
    return (
        D,
        torch.minimum(hi2, torch.maximum(lo2, lo1 + D2)),
        torch.minimum(hi2, torch.maximum(lo2, hi1 + D2)),
    )


def clamp_scan(D, lo, hi, x0):
    """``x_t = min(hi_t, max(lo_t, x_{t-1} + D_t))`` (``lo <= hi``) from ``x0 [N]`` for
    ``[T, N]`` float64 inputs in ``[-2**50, 2**50]``; returns ``x [T, N]``."""
    return _loop_in_chunks((D, lo, hi), x0, clamp_compose, _clamp_loop)


def _clamp_loop(leaves, x):
    T = max(y.shape[0] for y in leaves)
    out = []
    for t in range(T):
        D, lo, hi = (y[t] if y.shape[0] > 1 else y[0] for y in leaves)
        x = torch.minimum(hi, torch.maximum(lo, x + D))
        out.append(x)
    return torch.stack(out)


# ------------------------------------------------------------------------------ projective scan
# Leaf t: the linear map of homogeneous beliefs (u, v | e) (docs/backend-contract.md)
#     (u, v) -> A (u, v),   e -> b . (u, v) + alpha e,   A = [[A11, A12], [A21, A22]] >= 0,
# as the tuple (A11, A12, A21, A22, b1, b2, alpha). Maps compose by matrix product and are divided
# by the sum of A's entries (positive), which changes no belief and keeps every product in range.


def projective_compose(later, earlier, detach=False):
    """Compose projective maps ``later ∘ earlier`` (7-tuples), normalized by A's entry sum
    (``detach``: a constant to autograd, :func:`projective_scan`)."""
    P11, P12, P21, P22, p1, p2, pa = later
    Q11, Q12, Q21, Q22, q1, q2, qa = earlier
    A11 = P11 * Q11 + P12 * Q21
    A12 = P11 * Q12 + P12 * Q22
    A21 = P21 * Q11 + P22 * Q21
    A22 = P21 * Q12 + P22 * Q22
    b1 = p1 * Q11 + p2 * Q21 + pa * q1
    b2 = p1 * Q12 + p2 * Q22 + pa * q2
    al = pa * qa
    s = A11 + A12 + A21 + A22
    if detach:
        s = s.detach()
    return A11 / s, A12 / s, A21 / s, A22 / s, b1 / s, b2 / s, al / s


def projective_apply(m, u, e, v, detach=False):
    """Apply one map to triples and normalize to ``max(u, v) = 1`` (``detach``: the divisor a
    constant to autograd, :func:`projective_scan`)."""
    A11, A12, A21, A22, b1, b2, al = m
    u2 = A11 * u + A12 * v
    v2 = A21 * u + A22 * v
    e2 = b1 * u + b2 * v + al * e
    if detach:
        n = torch.maximum(u2, v2).detach()
        return u2 / n, e2 / n, v2 / n
    return normalize_max(u2, e2, v2)  # (its derivative in max(u2, v2) as products)


def _projective_loop(leaves, x, detach=False):
    T = max(t.shape[0] for t in leaves)
    outs = []
    for t in range(T):
        m = tuple(y[t] if y.shape[0] > 1 else y[0] for y in leaves)
        x = projective_apply(m, *x, detach=detach)
        outs.append(x)
    return tuple(torch.stack(k) for k in zip(*outs, strict=True))


def projective_scan(leaves, x0, detach=False):
    """Apply projective leaves (7 tensors broadcasting to ``[T, N]``) in turn from the triple
    ``x0`` (three ``[N]``); return every triple ``(u, e, v)``, each ``[T, N]``.

    ``detach``: every divisor (a product's entry sum, a state's ``max(u, v)``) is a constant to
    autograd. The triples are then those of the same beliefs (divided by other positive
    numbers), and their derivatives the same where every use of them is scale-free (ratios,
    the log-likelihood's), exactly, without the divisors' paths, which cancel: a divisor that
    depends on a parameter far more than the beliefs do left that cancellation's rounding
    (kalmanscan/core/parallel_scan.py, ``_scan_exact``)."""
    T, N = broadcast_shapes(*(t.shape for t in leaves))
    if num_chunks(T, N) <= 1:
        return _projective_loop(leaves, x0, detach)
    s = (
        leaves[0] + leaves[1] + leaves[2] + leaves[3]
    )  # products of entry-sum-1 maps cannot overflow
    if detach:
        s = s.detach()
    leaves = tuple(x / s for x in leaves)
    n, K, chunked = _chunked(leaves, T, N)

    def compose(later, earlier):
        return projective_compose(later, earlier, detach)

    totals = _tree_reduce(chunked, compose)
    ends = projective_scan(totals, x0, detach)
    starts = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, ends, strict=True))
    x = _projective_loop(tuple(y.transpose(0, 1) for y in chunked), starts, detach)  # [K, n, N]
    x = tuple(y.transpose(0, 1).reshape(n * K, N) for y in x)
    if n * K == T:
        return x
    rest = _projective_loop(_tail(leaves, n, K), tuple(y[-1] for y in ends), detach)
    return tuple(torch.cat([y, w]) for y, w in zip(x, rest, strict=True))
