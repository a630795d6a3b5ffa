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

The smoother's suffix scan holds the information as square-root rows instead
(:class:`RowElement`, composed with :func:`row_combine`)::

    Z    [B, T, n+1, n+1]   rows [Zx | r] with |Zx x_{i-1} - r|^2 the likelihood term:
                            J = Zx' Zx, eta = Zx' r

The future's information about a state can span many decades (an explosive F observed almost
without noise: 1e12 next to O(1) on the exact-entry model of
tests/test_dense_torch_exact_entry.py); as a matrix J it keeps only eps |J| of its weak
directions, as rows it keeps their relative digits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kalmanscan.core._args import broadcast_shapes


class Element(NamedTuple):
    A: torch.Tensor
    b: torch.Tensor
    C: torch.Tensor
    eta: torch.Tensor
    J: torch.Tensor


class RowElement(NamedTuple):
    """An element with its information (eta, J) as square-root rows ``Z = [Zx | r]``
    [.., n+1, n+1] and its covariance also as rows ``U`` [.., n, n] (``C = U' U``; values only,
    no autograd graph: the derivatives go through ``C``, whose value is ``U' U``)."""

    A: torch.Tensor
    b: torch.Tensor
    C: torch.Tensor
    U: torch.Tensor
    Z: torch.Tensor


def _sym(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.transpose(-1, -2))


def step_elements(z, observed, F, c, Q, H, R, singular=None, rows=False):
    """Single-step elements: x_{t-1} known, z_t observed through H with noise R.

    z [B,T,d] (zero where missing), observed [B,T,d] bool, F [..,n,n], c [..,n], Q [..,n,n],
    H [..,d,n], R [..,d,d] broadcastable to [B,T,...]. Missing entries get a zero row in H and a
    unit, uncorrelated noise, so they carry no information. R may be singular (R = 0) wherever
    S = H Q H' + R is positive definite; where it is not (an exact observation of a step without
    process noise: infinite information about x_{t-1}) the element is not finite: pass a list as
    ``singular`` to receive the [B, T] mask of those steps (their elements are then the identity's
    placeholders), else they raise. ``rows``: :class:`RowElement` s, the information as the
    whitened rows ``L^-1 [H F, z - H c]`` (``S = L L'``) themselves.
    """
    R_given = R
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
    if rows:
        with torch.no_grad():  # C's rows (I - K H) Lq, K Lr from roots of Q and the given R
            # (rows kept where observed; K is 0 on the missing entries): 0 but for eps^2 where
            # C is 0 (an exact entry), where the form above keeps eps |I - K H|^2 |Q|
            Lr = _psd_root(R_given) * observed.to(R.dtype).unsqueeze(-1)
            X = torch.cat([IKH @ _psd_root(Q), K @ Lr], -1)
            Uc = _triangle(X.transpose(-1, -2))
        C = _st(_sym(Uc.transpose(-1, -2) @ Uc), C)  # the form above's derivatives
        shape = broadcast_shapes(WHF.shape[:-2], e.shape[:-2])
        d = WHF.shape[-2]
        Z = torch.cat([WHF.expand(shape + (d, n)), e.expand(shape + (d, 1))], -1)
        out = RowElement(A, b, C, Uc.expand(A.shape), square_rows(Z, n + 1))
    else:
        J = _sym(WHF.transpose(-1, -2) @ WHF)
        eta = (WHF.transpose(-1, -2) @ e).squeeze(-1)
        out = Element(A, b, C, eta, J)
    near = _near_steps(H, R, Q)
    if near is not None:
        sq = _sqrt_elements(z, F, c, Q, H, R, rows=rows)
        out = type(out)(
            *(torch.where(_expand(near, x), y, x) for x, y in zip(out, sq, strict=True))
        )
    return out


def _psd_root(M):
    """L [.., k, k] with L L' = M for a symmetric PSD M [.., k, k] whose directions below its
    rounding are 0. On the diagonally scaled ``S M S`` (``S = diag(M)^-1/2``, so that a small
    variance of an uncoupled coordinate keeps its digits): its Cholesky factor where every pivot
    is above ``1e3 k eps``, else its eigen-decomposition with the eigenvalues at most ``k eps``
    of the largest (a singular M's rounding, either sign) set to 0. No grad. A Cholesky factor
    of a singular M, where it exists, has ``sqrt(eps)`` in the null direction: 1e-8 of a rank-1
    ``Q = q q'``, which the future's information (1e13 on the explosive exact-entry models)
    turned into 10 % of a weak direction."""
    M = _sym(M.detach())
    d = torch.diagonal(M, dim1=-2, dim2=-1)
    s = torch.where(d > 0, d, torch.ones_like(d)).sqrt()
    Ms = M / (s.unsqueeze(-1) * s.unsqueeze(-2))
    k = M.shape[-1]
    eps = torch.finfo(M.dtype).eps
    L, info = torch.linalg.cholesky_ex(Ms)
    piv = torch.diagonal(L, dim1=-2, dim2=-1).square().amin(-1)
    bad = (info != 0) | ~(piv > 1e3 * k * eps)
    if bool(bad.any()):
        w, V = torch.linalg.eigh(Ms[bad])
        keep = w > k * eps * w[..., -1:].clamp_min(0)
        L = L.clone()
        L[bad] = V * torch.where(keep, w, torch.zeros_like(w)).sqrt().unsqueeze(-2)
    return s.unsqueeze(-1) * L


def square_rows(X, k):
    """k rows [.., k, c] with the Gram matrix of the rows X [.., m, c] (rank at most k): X with
    zero rows added, or reduced by QR (:func:`kalmanscan.dense.sequential._reduce_rows`)."""
    m = X.shape[-2]
    if m < k:
        return torch.cat([X, X.new_zeros(X.shape[:-2] + (k - m, X.shape[-1]))], -2)
    if m == k:
        return X
    from kalmanscan.dense.sequential import _reduce_rows

    return _reduce_rows(_by_norm(X), k)


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


def _sqrt_elements(z, F, c, Q, H, R, rows=False):
    """The same elements from one QR, no S^-1: with ``Q = Lq Lq'``, ``W = Lr^-1 H``,
    ``y = Lr^-1 (z - H c)`` (``R = Lr Lr'``), the rows ``N [u; x; 1] = [W Lq u + W F x - y; u]``
    (data rows first) are triangularized to ``[[R11, R12, r1], [0, R22, r2], ...]``; then
    ``u* = -R11^-1 (R12 x + r1)`` gives ``A = F - Lq R11^-1 R12``, ``b = c - Lq R11^-1 r1``,
    ``C = Lq (R11' R11)^-1 Lq'``, and the residual ``|R22 x + r2|^2`` gives ``J = R22' R22``,
    ``eta = -R22' r2``. Everything is a function of N'N, whose first-order change the
    straight-through rows of :func:`kalmanscan.dense.sequential._reduce_rows` give exactly;
    the derivatives are taken through the linearized Schur complements of that Gram matrix at
    the triangle's values (the triangle's own blocks are not triangular in that derivative).
    ``rows``: a :class:`RowElement` with the rows ``Z = [R22 | -r2]`` (and ``rho``'s row)."""
    from kalmanscan.dense.sequential import _factor, _reduce_rows

    shape = broadcast_shapes(F.shape[:-2], Q.shape[:-2], H.shape[:-2], R.shape[:-2])
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
    rows_ = [top, bot]
    if d + n < k:
        rows_.append(torch.zeros(shape + (k - d - n, k), dtype=F.dtype, device=F.device))
    Ra = _reduce_rows(torch.cat(rows_, -2), k)
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
    if rows:
        return RowElement(A, b, C, Y.detach(), _schur_rows(torch.cat(rows_, -2), Rv, n))
    J = _sym(T[..., :n, :n])
    eta = -T[..., :n, n]
    return Element(A, b, C, eta, J)


def _schur_rows(N, Rv, n):
    """The rows ``Z = [Zx | r]`` [.., n+1, n+1] of :func:`_sqrt_elements`: the trailing block
    ``[[R22, r2], [0, rho]]`` of the triangle ``Rv`` of ``N`` [.., m, 2n+1] with its last column
    negated (``|R22 x + r2|^2 = |Zx x - r|^2``). With autograd, their first-order change is that
    of ``Qt' (I - Q1 Q1') N_x`` (``N = [N_u, N_x]``, ``Q1`` the differentiable orthonormal basis
    of the full-rank ``N_u``, ``Qt`` the constant columns ``n..2n`` of ``N``'s Householder Q):
    rows whose Gram matrix is the Schur complement that eliminates ``u``, to first order, with
    the triangle's orientation."""
    Zt = Rv[..., n:, n:]
    if N.requires_grad:
        Nu, Nx = N[..., :n], N[..., n:]
        Q1 = torch.linalg.qr(Nu, mode="reduced")[0]  # N_u = [W Lq; I; 0]: full column rank
        PN = Nx - Q1 @ (Q1.transpose(-1, -2) @ Nx)
        with torch.no_grad():
            Qt = torch.linalg.qr(N.detach(), mode="complete")[0][..., n : 2 * n + 1]
        D = Qt.transpose(-1, -2) @ PN
        Zt = Zt + (D - D.detach())
    return torch.cat([Zt[..., :n], -Zt[..., n:]], -1)


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


def _st(value, graded):
    """``value``'s numbers with ``graded``'s derivative (``graded`` None: ``value``)."""
    if graded is None or not graded.requires_grad:
        return value
    return value.detach() + (graded - graded.detach())


def condition(Z, b, C, *mats, U=None):
    """Condition ``x ~ N(b, C)`` ([.., n], [.., n, n]) on the rows ``Z = [Zx | r]`` [.., k, n+1]
    (the likelihood ``|Zx x - r|^2``). Returns ``(mean, cov, [(I - K Zx) M for M in mats],
    rows, W)``: ``K = C Zx' (I + N)^-1``, ``N = Zx C Zx'``, ``mean = b + K (r - Zx b)``,
    ``cov = (I - K Zx) C (I - K Zx)' + K K' = W' W``, ``rows = Lm^-1 [Zx M0, r - Zx b]``
    (``Lm Lm' = I + N``; None without ``mats``).

    Values in square-root form from ``U`` [.., n, n] (rows, ``C = U' U``; None: a root of ``C``,
    :func:`_psd_root`): ``P = U Zx'``, ``Lm'`` and ``Rv`` the triangles of ``[P; I]`` and
    ``[P'; I]``, ``W = Rv^-T U``, ``Lm^-1 Zx C = Lm^-1 P' U``. Nothing is inverted but triangles
    whose singular values are at least 1, no information matrix ``Zx' Zx`` is formed, and ``C``
    enters only through ``U``: the future's information about a state can span 12 decades (an
    explosive F observed almost without noise), and a direction in which ``C`` is 0 but for
    rounding (an exact entry) would otherwise carry that rounding times the information.
    Derivatives (of every input, ``C`` included, also where it is singular: an exact entry's
    noise) are those of the covariance form at these values."""
    n, k = C.shape[-1], Z.shape[-2]
    dtype, device = C.dtype, C.device
    Zx, r = Z[..., :n], Z[..., n:]
    eye_n = torch.eye(n, dtype=dtype, device=device)
    eye_k = torch.eye(k, dtype=dtype, device=device)
    shape = broadcast_shapes(
        Z.shape[:-2], b.shape[:-1], C.shape[:-2], *(M.shape[:-2] for M in mats)
    )
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (Z, b, C, *mats))
    with torch.no_grad():
        Uv = _psd_root(C).transpose(-1, -2) if U is None else U
        P = (Uv @ Zx.detach().transpose(-1, -2)).expand(shape + (n, k))  # U Zx'
        Ru = _triangle(torch.cat([P, eye_k.expand(shape + (k, k))], -2))  # Ru' Ru = I + N
        Rv = _triangle(torch.cat([P.transpose(-1, -2), eye_n.expand(shape + (n, n))], -2))
        W = torch.linalg.solve_triangular(
            Rv.transpose(-1, -2), Uv.expand(shape + (n, n)), upper=False
        )
    if U is None:  # the covariance form at the root's C (its rounding in null directions gone)
        C = _st(_sym(Uv.transpose(-1, -2) @ Uv), C)
    Lm = Ru.transpose(-1, -2)
    PU = P.transpose(-1, -2) @ Uv  # Zx C = P' U: the gain's rows, from U
    parts = [Zx, r - Zx @ b.unsqueeze(-1)] + [Zx @ M for M in mats]
    if grad:  # the covariance form's derivatives at the square-root values
        N = _sym(Zx @ C @ Zx.transpose(-1, -2))
        Lm = _st(Lm, torch.linalg.cholesky(_st(P.transpose(-1, -2) @ P, N) + eye_k))
        parts.append(_st(PU, Zx @ C))
    else:
        parts.append(PU)
    sizes = [q.shape[-1] for q in parts]
    Sv = torch.linalg.solve_triangular(
        Lm.expand(shape + (k, k)), torch.cat([q.expand(shape + q.shape[-2:]) for q in parts], -1),
        upper=False,
    )  # fmt: skip
    G, rho, *GM, Hm = torch.split(Sv, sizes, -1)  # Lm^-1 [Zx, r - Zx b, Zx M..., Zx C]
    HmT = Hm.transpose(-1, -2)  # K = Hm' Lm^-1
    mean = b + (HmT @ rho).squeeze(-1)
    out = [M - HmT @ g for M, g in zip(mats, GM, strict=True)]
    cov = _sym(W.transpose(-1, -2) @ W)
    if grad:
        IKZ = eye_n - HmT @ G
        V = torch.linalg.solve_triangular(Lm.transpose(-1, -2).expand(shape + (k, k)), Hm,
                                          upper=True)  # fmt: skip
        cov = _st(cov, _sym(IKZ @ C @ IKZ.transpose(-1, -2) + V.transpose(-1, -2) @ V))
    rows = torch.cat([GM[0], rho], -1) if mats else None
    return mean, cov, out, rows, W


def _triangle(X):
    """The upper triangle R [.., c, c] of X [.., m, c] = Q R (m >= c), with a non-negative
    diagonal (so that R' is the Cholesky factor of X' X), no grad."""
    R = torch.linalg.qr(_by_norm(X), mode="r")[1]
    sign = torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(R.dtype)
    return R * sign.unsqueeze(-1)


def _by_norm(X):
    """The rows of X [.., m, c] in decreasing norm: Householder QR is row-wise stable in that
    order (Cox & Higham 1998), and the rows of the future's information span 12 decades."""
    with torch.no_grad():
        order = torch.argsort(X.detach().square().sum(-1), dim=-1, descending=True)
    return torch.gather(X, -2, order.unsqueeze(-1).expand(X.shape))


def row_combine(e1: RowElement, e2: RowElement) -> RowElement:
    """:func:`combine` with the information as rows: the same element over i..k, from e1 over
    i..j-1 and e2 over j..k. ``X^-1 [A1, b1 + C1 eta2, C1]`` of :func:`combine` is e1's
    transition, offset and covariance conditioned on e2's rows (:func:`condition`), and e2's
    rows conditioned through e1 stack with e1's own rows (one QR: ``J = A1' X^-T J2 A1 + J1``,
    ``eta = A1' X^-T (eta2 - J2 b1) + eta1``)."""
    from kalmanscan.dense.sequential import _reduce_rows

    A1, b1, C1, U1, Z1 = e1
    A2, b2, C2, U2, Z2 = e2
    n = A1.shape[-1]
    b, C, (XA,), rows, W = condition(Z2, b1, C1, A1, U=U1)
    A = A2 @ XA
    b = (A2 @ b.unsqueeze(-1)).squeeze(-1) + b2
    shape = rows.shape[:-2]
    with torch.no_grad():
        WA = W @ A2.detach().transpose(-1, -2)
        U = _triangle(torch.cat([WA.expand(shape + (n, n)), U2.expand(shape + (n, n))], -2))
    C = _st(_sym(U.transpose(-1, -2) @ U), _sym(A2 @ C @ A2.transpose(-1, -2) + C2))
    Z = _reduce_rows(_by_norm(torch.cat([rows, Z1.expand(shape + Z1.shape[-2:])], -2)), n + 1)
    return RowElement(A, b, C, U, Z)


def _identity_like(e, shape):
    """The identity element of ``e``'s kind (identity transition, everything else 0), [*shape]."""
    n = e.A.shape[-1]
    out = [torch.zeros(*shape, *x.shape[2:], dtype=x.dtype, device=x.device) for x in e]
    out[0] = torch.eye(n, dtype=e.A.dtype, device=e.A.device).expand(*shape, n, n)
    return type(e)(*out)


def _sequential(e, op):
    """Inclusive scan along dim 1 by a plain loop (used inside chunks)."""
    kind = type(e)
    L = e.A.shape[1]
    acc = kind(*(x[:, 0] for x in e))
    out = [acc]
    for k in range(1, L):
        acc = op(acc, kind(*(x[:, k] for x in e)))
        out.append(acc)
    return kind(*(torch.stack([o[i] for o in out], 1) for i in range(len(e))))


def _scan(e, op, chunk: int):
    kind = type(e)
    N, T = e.A.shape[:2]
    if T <= chunk:
        return _sequential(e, op)
    nc = -(-T // chunk)
    pad = nc * chunk - T
    if pad:
        ident = _identity_like(e, (N, pad))
        e = kind(*(torch.cat([x, i], 1) for x, i in zip(e, ident, strict=True)))
    loc = kind(*(x.reshape(N * nc, chunk, *x.shape[2:]) for x in e))
    loc = _sequential(loc, op)
    tot = kind(*(x[:, -1].reshape(N, nc, *x.shape[2:]) for x in loc))
    tot = _scan(tot, op, chunk)
    loc = kind(*(x.reshape(N, nc, chunk, *x.shape[2:]) for x in loc))
    carry = kind(*(x[:, :-1].unsqueeze(2).expand(-1, -1, chunk, *x.shape[2:]) for x in tot))
    rest = op(carry, kind(*(x[:, 1:] for x in loc)))
    out = kind(
        *(
            torch.cat([x[:, :1], r], 1).reshape(N, nc * chunk, *x.shape[3:])[:, :T]
            for x, r in zip(loc, rest, strict=True)
        )
    )
    return out


def scan(e, *, reverse: bool = False, chunk: int = 32):
    """Inclusive prefix (e_1 ⊗ ... ⊗ e_t) or, with ``reverse``, suffix (e_t ⊗ ... ⊗ e_T), dim 1,
    of :class:`Element` s (:func:`combine`) or :class:`RowElement` s (:func:`row_combine`)."""
    kind = type(e)
    op = row_combine if kind is RowElement else combine
    if not reverse:
        return _scan(e, op, chunk)
    flipped = kind(*(torch.flip(x, [1]) for x in e))
    out = _scan(flipped, lambda a, b: op(b, a), chunk)
    return kind(*(torch.flip(x, [1]) for x in out))
