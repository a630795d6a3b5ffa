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
