"""Associative scan over dense filtering elements (Särkkä & García-Fernández 2021).

Derivation, choice of element and float32 behaviour: docs/dense.md.

Notation (B flattened series, T steps, n state, d observation):

    A    [B, T, n, n]   an element over steps i..j says
                        p(x_j | x_{i-1}, z_{i:j}) = N(A x_{i-1} + b, C)
    b    [B, T, n]
    C    [B, T, n, n]
    eta  [B, T, n]      and  p(z_{i:j} | x_{i-1}) ∝ exp(eta' x_{i-1} - x_{i-1}' J x_{i-1} / 2)
    J    [B, T, n, n]

The identity element is (I, 0, 0, 0, 0). Elements compose with :func:`combine`; :func:`scan`
computes inclusive prefixes (or suffixes) blockwise: a sequential pass inside chunks, a recursive
scan of the chunk totals, then one vectorized fix-up.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Element(NamedTuple):
    A: torch.Tensor
    b: torch.Tensor
    C: torch.Tensor
    eta: torch.Tensor
    J: torch.Tensor


def _sym(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.transpose(-1, -2))


def step_elements(z, observed, F, c, Q, H, R, singular=None) -> Element:
    """Single-step elements: x_{t-1} known, z_t observed through H with noise R.

    z [B,T,d] (zero where missing), observed [B,T,d] bool, F [..,n,n], c [..,n], Q [..,n,n],
    H [..,d,n], R [..,d,d] broadcastable to [B,T,...]. Missing entries get a zero row in H and a
    unit, uncorrelated noise, so they carry no information. R may be singular (R = 0) wherever
    S = H Q H' + R is positive definite; where it is not (an exact observation of a step without
    process noise: infinite information about x_{t-1}) the element is not finite: pass a list as
    ``singular`` to receive the [B, T] mask of those steps (their elements are then the identity's
    placeholders), else they raise.
    """
    H, R, z = mask_observation(z, observed, H, R)
    S = _sym(H @ Q @ H.transpose(-1, -2) + R)
    L, info = torch.linalg.cholesky_ex(S)
    bad = info != 0
    if singular is None:
        if bool(bad.any()):
            raise torch.linalg.LinAlgError("step_elements: H Q H' + R is not positive definite")
    else:
        singular.append(bad)
        if bool(bad.any()):
            eye_d = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
            L = torch.where(bad[..., None, None], eye_d, L)
    HF = H @ F
    W = torch.linalg.solve_triangular(L, torch.cat([H, HF], -1), upper=False)  # L^-1 [H, HF]
    n = F.shape[-1]
    WH, WHF = W[..., :n], W[..., n:]
    e = torch.linalg.solve_triangular(
        L, (z - (H @ c.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1), upper=False
    )
    QW = Q @ WH.transpose(-1, -2)  # Q H' L^-T   [.., n, d]
    A = F - QW @ WHF
    b = c + (QW @ e).squeeze(-1)
    # C = Q - Q H' S^-1 H Q in Joseph form (I - K H) Q (I - K H)' + K R K', K = Q H' S^-1: the
    # difference form cancels to eps |Q| absolute, which is all of C's value in a direction
    # observed with R = 1e-12 Q; the sum of two PSD terms keeps its relative digits.
    K = torch.linalg.solve_triangular(L, QW, upper=False, left=False)  # QW L^-1
    IKH = torch.eye(n, dtype=Q.dtype, device=Q.device) - K @ H
    C = _sym(IKH @ Q @ IKH.transpose(-1, -2) + K @ R @ K.transpose(-1, -2))
    J = _sym(WHF.transpose(-1, -2) @ WHF)
    eta = (WHF.transpose(-1, -2) @ e).squeeze(-1)
    out = Element(A, b, C, eta, J)
    near = _near_steps(H, R, Q)
    if near is not None:
        sq = _sqrt_elements(z, F, c, Q, H, R)
        out = Element(*(torch.where(_expand(near, x), y, x) for x, y in zip(out, sq, strict=True)))
    return out


NEAR_STEP = 1e4  # |h|^2 tr(Q) above this times R_ii: a near noise-free entry (as the native kernel)


def _expand(mask, x):
    return mask.reshape(mask.shape + (1,) * (x.dim() - mask.dim()))


def _near_steps(H, R, Q):
    """[B, T] bool: steps with two or more near noise-free entries (``|h|^2 tr(Q) > NEAR_STEP
    R_ii``) and a positive definite R, or None when there are none. There ``S = H Q H' + R`` is
    Q-sized along the observed directions and R-sized across them, and the elements above lose
    ``eps cond(S)`` through ``S^-1`` (1e10 with four entries at R = 1e-12 on three states)."""
    tr = torch.diagonal(Q, dim1=-2, dim2=-1).sum(-1)
    rd = torch.diagonal(R, dim1=-2, dim2=-1)
    hh = H.square().sum(-1)
    cnt = (hh * tr.unsqueeze(-1) > NEAR_STEP * rd).sum(-1)
    near = cnt >= 2
    if not bool(near.any()):
        return None
    ok = torch.linalg.cholesky_ex(R)[1] == 0
    near = near & ok
    return near if bool(near.any()) else None


def _sqrt_elements(z, F, c, Q, H, R) -> Element:
    """The same elements from one QR, no S^-1: with ``Q = Lq Lq'``, ``W = Lr^-1 H``,
    ``y = Lr^-1 (z - H c)`` (``R = Lr Lr'``), the rows ``N [u; x; 1] = [W Lq u + W F x - y; u]``
    (data rows first) are triangularized to ``[[R11, R12, r1], [0, R22, r2], ...]``; then
    ``u* = -R11^-1 (R12 x + r1)`` gives ``A = F - Lq R11^-1 R12``, ``b = c - Lq R11^-1 r1``,
    ``C = Lq (R11' R11)^-1 Lq'``, and the residual ``|R22 x + r2|^2`` gives ``J = R22' R22``,
    ``eta = -R22' r2``. Everything is a function of N'N, whose first-order change the
    straight-through rows of :func:`kalmanscan.dense.sequential._reduce_rows` give exactly;
    the derivatives are taken through the linearized Schur complements of that Gram matrix at
    the triangle's values (the triangle's own blocks are not triangular in that derivative)."""
    from kalmanscan.dense.sequential import _factor, _reduce_rows

    shape = torch.broadcast_shapes(F.shape[:-2], Q.shape[:-2], H.shape[:-2], R.shape[:-2])
    n, d = F.shape[-1], H.shape[-2]
    F = F.expand(shape + (n, n))
    Q = Q.expand(shape + (n, n))
    H = H.expand(shape + (d, n))
    R = R.expand(shape + (d, d))
    c = c.expand(shape + (n,))
    z = z.expand(shape + (d,))
    eye_d = torch.eye(d, dtype=R.dtype, device=R.device)
    Lr, info = torch.linalg.cholesky_ex(R)
    Lr = torch.where((info != 0)[..., None, None], eye_d, Lr)
    Lq = _factor(_sym(Q))
    W = torch.linalg.solve_triangular(Lr, H, upper=False)
    y = torch.linalg.solve_triangular(
        Lr, (z - (H @ c.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1), upper=False
    )
    k = 2 * n + 1
    top = torch.cat([W @ Lq, W @ F, -y], -1)  # [.., d, 2n+1]
    eye_n = torch.eye(n, dtype=F.dtype, device=F.device).expand(shape + (n, n))
    bot = torch.cat([eye_n, torch.zeros(shape + (n, n + 1), dtype=F.dtype, device=F.device)], -1)
    rows = [top, bot]
    if d + n < k:
        rows.append(torch.zeros(shape + (k - d - n, k), dtype=F.dtype, device=F.device))
    Ra = _reduce_rows(torch.cat(rows, -2), k)
    Rv = Ra.detach()
    R11 = Rv[..., :n, :n]
    X = torch.linalg.solve_triangular(R11, Rv[..., :n, n:], upper=True)  # G11^-1 G1t, [n, n+1]
    Rt = Rv[..., n:, n:]
    T = Rt.transpose(-1, -2) @ Rt  # the Schur complement [[J, -eta], [., rho^2]]
    Y = torch.linalg.solve_triangular(
        R11.transpose(-1, -2), Lq.detach().transpose(-1, -2), upper=False
    )
    C = Y.transpose(-1, -2) @ Y  # the value; its derivative below
    if Ra.requires_grad:  # (Lq enters N: it needs a derivative only where Ra does)
        # values from the triangle; first-order changes from the Gram G = Ra' Ra (whose
        # straight-through derivative is exact) through the linearized Schur complement at the
        # accurate X, so no formula squares the conditioning: dX = G11^-1 (dG1t - dG11 X),
        # dT = dGtt - dG1t' X - X' dG1t + X' dG11 X, d(G11^-1) = -G11^-1 dG11 G11^-1
        G = Ra.transpose(-1, -2) @ Ra
        G11, G1t, Gtt = G[..., :n, :n], G[..., :n, n:], G[..., n:, n:]
        Mi = torch.linalg.solve_triangular(
            R11, torch.linalg.solve_triangular(R11.transpose(-1, -2), torch.eye(
                n, dtype=R11.dtype, device=R11.device).expand(R11.shape), upper=False),
            upper=True,
        )  # G11^-1 = R11^-1 R11^-T  # fmt: skip
        st = lambda x: x - x.detach()  # noqa: E731
        X = X + st(Mi @ (G1t - G11 @ X))
        Xt = X.detach().transpose(-1, -2)
        T = T + st(Gtt - G1t.transpose(-1, -2) @ X.detach() - Xt @ G1t + Xt @ G11 @ X.detach())
        M = Mi + st(-Mi @ G11 @ Mi)
        C = C + st(Lq @ M @ Lq.transpose(-1, -2))
    A = F - Lq @ X[..., :n]
    b = c - (Lq @ X[..., n:]).squeeze(-1)
    C = _sym(C)
    J = _sym(T[..., :n, :n])
    eta = -T[..., :n, n]
    return Element(A, b, C, eta, J)


def mask_observation(z, observed, H, R):
    """Zero the rows of H and the entries of z that are missing; give them unit noise."""
    m = observed.to(H.dtype)
    H = H * m.unsqueeze(-1)
    R = R * (m.unsqueeze(-1) * m.unsqueeze(-2)) + torch.diag_embed(1.0 - m)
    z = torch.where(observed, z, torch.zeros((), dtype=z.dtype, device=z.device))
    return H, R, z


def combine(e1: Element, e2: Element) -> Element:
    """Element over i..k from e1 over i..j-1 and e2 over j..k (e1 happens first)."""
    A1, b1, C1, eta1, J1 = e1
    A2, b2, C2, eta2, J2 = e2
    n = A1.shape[-1]
    eye = torch.eye(n, dtype=A1.dtype, device=A1.device)
    X = eye + C1 @ J2  # X' = I + J2 C1
    LU, piv = torch.linalg.lu_factor(X)
    rhs = torch.cat([A1, C1, (b1 + (C1 @ eta2.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1)], -1)
    prod = A2 @ torch.linalg.lu_solve(LU, piv, rhs)  # A2 X^-1 [A1, C1, b1 + C1 eta2]
    A = prod[..., :n]
    C = _sym(prod[..., n : 2 * n] @ A2.transpose(-1, -2) + C2)
    b = prod[..., 2 * n] + b2
    Jab = J2 @ torch.cat([A1, b1.unsqueeze(-1)], -1)
    rhs2 = torch.cat([Jab[..., :n], (eta2 - Jab[..., n]).unsqueeze(-1)], -1)
    prod2 = A1.transpose(-1, -2) @ torch.linalg.lu_solve(LU, piv, rhs2, adjoint=True)
    J = _sym(prod2[..., :n] + J1)
    eta = prod2[..., n] + eta1
    return Element(A, b, C, eta, J)


def identity(shape, n, dtype, device) -> Element:
    eye = torch.eye(n, dtype=dtype, device=device).expand(*shape, n, n)
    zv = torch.zeros(*shape, n, dtype=dtype, device=device)
    zm = torch.zeros(*shape, n, n, dtype=dtype, device=device)
    return Element(eye, zv, zm, zv, zm)


def _sequential(e: Element, op) -> Element:
    """Inclusive scan along dim 1 by a plain loop (used inside chunks)."""
    L = e.A.shape[1]
    acc = Element(*(x[:, 0] for x in e))
    out = [acc]
    for k in range(1, L):
        acc = op(acc, Element(*(x[:, k] for x in e)))
        out.append(acc)
    return Element(*(torch.stack([o[i] for o in out], 1) for i in range(5)))


def _scan(e: Element, op, chunk: int) -> Element:
    N, T = e.A.shape[:2]
    if T <= chunk:
        return _sequential(e, op)
    n = e.A.shape[-1]
    nc = -(-T // chunk)
    pad = nc * chunk - T
    if pad:
        ident = identity((N, pad), n, e.A.dtype, e.A.device)
        e = Element(*(torch.cat([x, i], 1) for x, i in zip(e, ident, strict=True)))
    loc = Element(*(x.reshape(N * nc, chunk, *x.shape[2:]) for x in e))
    loc = _sequential(loc, op)
    tot = Element(*(x[:, -1].reshape(N, nc, *x.shape[2:]) for x in loc))
    tot = _scan(tot, op, chunk)
    loc = Element(*(x.reshape(N, nc, chunk, *x.shape[2:]) for x in loc))
    carry = Element(*(x[:, :-1].unsqueeze(2).expand(-1, -1, chunk, *x.shape[2:]) for x in tot))
    rest = op(carry, Element(*(x[:, 1:] for x in loc)))
    out = Element(
        *(
            torch.cat([x[:, :1], r], 1).reshape(N, nc * chunk, *x.shape[3:])[:, :T]
            for x, r in zip(loc, rest, strict=True)
        )
    )
    return out


def scan(e: Element, *, reverse: bool = False, chunk: int = 32) -> Element:
    """Inclusive prefix (e_1 ⊗ ... ⊗ e_t) or, with ``reverse``, suffix (e_t ⊗ ... ⊗ e_T), dim 1."""
    if not reverse:
        return _scan(e, combine, chunk)
    flipped = Element(*(torch.flip(x, [1]) for x in e))
    out = _scan(flipped, lambda a, b: combine(b, a), chunk)
    return Element(*(torch.flip(x, [1]) for x in out))
