"""The graded factor of a faded diffuse part (:func:`kalmanscan.dense.sequential.filter_moments`).

Where a power of ``F`` leaves the second direction of the diffuse factor ``D`` below the rounding
of the first (two unobserved states that ``F`` mixes, eigenvalues 1.0024 and 0.5876: after about
26 steps), ``D`` itself cannot say that the direction is still diffuse, nor its scale, which the
diffuse log-likelihood's pdet term needs. The filter then carries ``D = Qa Ra`` as well (QR, each
row of ``Ra`` to its own scale, propagated as ``F Qa = Q1 R1``, ``Ra <- R1 Ra``), decides which
entries are diffuse and takes the diffuse terms on ``Qa``, and resolves directions on the
column-graded factor (plane rotations from the bottom up). Truth: the mpmath oracle at 200 digits
(tests/test_dense_faded_diffuse_direction.py).
"""

from __future__ import annotations

import torch

FADED = 2.0**-16  # D's k-th singular value below this times its largest: D has faded
_FLOOR = 2.0**-900  # the smallest row of the graded factor Ra, relative to its largest entry


def _truncated(D, k, on):
    """``D`` [B, n, n] with its ``k`` [B] largest singular values kept (the rounding a resolved
    direction leaves dropped) where ``on`` [B]: the value truncated, the derivative ``D``'s."""
    with torch.no_grad():
        U, S, Vh = torch.linalg.svd(D)
        top = torch.arange(D.shape[-1], device=D.device) < k.unsqueeze(-1)
        Dk = (U * torch.where(top, S, torch.zeros_like(S)).unsqueeze(-2)) @ Vh
        Dk = torch.where(on[:, None, None], Dk, D)
    return D + (Dk - D.detach())


def graded_factor(X, k):
    """(Qa, Ra) [B, n, n] with ``X X' = Qa Ra Ra' Qa'`` for a diffuse factor ``X`` [B, n, n] of
    ``k`` [B] directions: the QR factorization of ``X`` with its columns sorted by norm
    (largest first; a permutation leaves ``X X'`` as it is), the ``k`` leading columns of
    ``Qa`` (orthonormal) and rows of ``Ra`` (upper triangular) kept, zeros elsewhere. Each row
    of ``Ra`` is exact to the rounding of its own size (Householder QR is column-wise stable):
    a direction ``1e-30`` the scale of another keeps its digits. No derivative."""
    with torch.no_grad():
        X = X.detach()
        nrm = torch.linalg.vector_norm(X, dim=-2)
        order = torch.argsort(nrm, -1, descending=True)
        Xs = torch.gather(X, -1, order.unsqueeze(-2).expand_as(X))
        Qa, Ra = torch.linalg.qr(Xs)
        on = (torch.arange(X.shape[-1], device=X.device) < k.unsqueeze(-1)).to(X.dtype)
        return Qa * on.unsqueeze(-2), Ra * on.unsqueeze(-1)


def predict_graded(F, Qa, Ra, k, tol):
    """(Qa, Ra, k) of :func:`graded_factor` after the prediction ``F`` [B, n, n]: ``F Qa = Q1 R1``
    (QR), ``Ra <- R1 Ra`` (a product of triangular factors: each row keeps its own scale, where
    ``F^t`` itself aligns its columns and loses the second of two directions that ``F`` mixes
    below the rounding), scaled to a largest entry of 1 (no overflow; kappa's coefficient is
    known up to a positive factor). ``k`` as :func:`factor_basis` keeps the columns of
    ``F Qa`` (what a singular ``F`` forgets dropped: then the product projected on the kept
    range and factored again). No derivative."""
    from kalmanscan.dense.sequential import factor_basis  # (it imports this module)

    with torch.no_grad():
        n = F.shape[-1]
        X = F @ Qa
        basis, kn = factor_basis(F, Qa, X, k, tol)
        Q1, R1 = torch.linalg.qr(X)
        on = (torch.arange(n, device=F.device) < k.unsqueeze(-1)).to(F.dtype)
        Q1, Rn = Q1 * on.unsqueeze(-2), (R1 @ Ra) * on.unsqueeze(-1)
        if bool((kn < k).any()):  # forgotten directions: the product on the kept range
            Qk = _orth(basis, kn)
            Qf, Rf = graded_factor(Qk @ Qk.mT @ Q1 @ Rn, kn)
            less = (kn < k)[:, None, None]
            Q1, Rn = torch.where(less, Qf, Q1), torch.where(less, Rf, Rn)
        top = Rn.abs().amax((-1, -2), keepdim=True)
        Rn = Rn / torch.where(top > 0, top, torch.ones_like(top))
        # a row below 2^-900 of the largest (a share (0.59 / 1.0)^t after 1200 steps, past the
        # range's subnormals) lifted there with the rows below it: its direction kept, the
        # ratios that D D' cannot hold anyway (1e-540) not
        rows = list(Rn.unbind(-2))
        for i in range(n):
            r = rows[i].abs().amax(-1)
            lift = torch.where((r > 0) & (r < _FLOOR), _FLOOR / torch.where(r > 0, r, 1.0), 1.0)
            rows[i:] = [x * lift.unsqueeze(-1) for x in rows[i:]]
        return Q1, torch.stack(rows, -2), kn


def column_graded(Qa, Ra):
    """[B, n, n] a factor ``Dg = Qa L`` of ``Qa Ra Ra' Qa'`` with ``L`` lower triangular
    (``Ra' = W L'``, the QR factorization of ``Ra'``): its columns are graded (the first the
    largest scale, each later one the next level with the smaller ones below it), so that
    resolving a direction by rotations of its columns (:func:`resolve_graded`) keeps each
    column to its own scale. No derivative."""
    with torch.no_grad():
        return Qa @ torch.linalg.qr(Ra.mT)[1].mT


def resolve_graded(Dg, u):
    """[B, n, n] the column-graded factor ``Dg`` with the direction ``u = Dg' h`` [B, n]
    resolved: ``Dg (I - u u' / |u|^2)`` as ``Dg W`` without its first column (W the plane
    rotations, from the last pair of columns up, that take ``u`` to ``|u| e_1``), the columns
    shifted left. Each new column is a rotation of two: where the exact initial update
    ``Dg - Dg u u' / |u|^2`` forms a direction ``1e-10`` the scale of the resolved one as a
    difference of terms of its size (eps of it kept), the rotations keep it to its own
    rounding. No derivative."""
    with torch.no_grad():
        n = Dg.shape[-1]
        cols = list(Dg.unbind(-1))
        u = list(u.unbind(-1))
        for j in range(n - 2, -1, -1):
            a, b = u[j], u[j + 1]
            rho = torch.hypot(a, b)
            pos = rho > 0
            c = torch.where(pos, a / torch.where(pos, rho, 1.0), 1.0).unsqueeze(-1)
            s = torch.where(pos, b / torch.where(pos, rho, 1.0), 0.0).unsqueeze(-1)
            cols[j], cols[j + 1] = c * cols[j] + s * cols[j + 1], c * cols[j + 1] - s * cols[j]
            u[j] = rho
        return torch.stack(cols[1:] + [torch.zeros_like(cols[0])], -1)


def _orth(X, k):
    """[B, n, n] an orthonormal basis of the range of ``X`` [B, n, n] (its ``k`` [B] leading left
    singular vectors; zero columns elsewhere). No derivative."""
    with torch.no_grad():
        U = torch.linalg.svd(X.detach())[0]
        on = torch.arange(X.shape[-1], device=X.device) < k.unsqueeze(-1)
    return U * on.to(X.dtype).unsqueeze(-2)


def _unseen(Hw, obs):
    """[B, n, n] the projector on the null space of the observed rows of ``Hw`` [B, d, n]
    (``obs`` [B, d]): after a diffuse step the remaining diffuse range lies there (each entry
    either resolves its row's direction or did not see the range). No derivative."""
    with torch.no_grad():
        W = torch.where(obs.unsqueeze(-1), Hw.detach(), torch.zeros_like(Hw.detach()))
        _, sv, Vh = torch.linalg.svd(W, full_matrices=True)
        seen = torch.zeros(Hw.shape[0], Hw.shape[-1], dtype=W.dtype, device=W.device)
        m = sv.shape[-1]
        seen[:, :m] = (sv > 1e-11 * sv[:, :1].clamp_min(torch.finfo(W.dtype).tiny)).to(W.dtype)
        eye = torch.eye(Hw.shape[-1], dtype=W.dtype, device=W.device)
        return eye - (Vh.mT * seen.unsqueeze(-2)) @ Vh


def faded_factor(D, k):
    """[B] bool: the diffuse factor ``D`` [B, n, n] (``k`` [B] directions) has faded: its k-th
    singular value is below ``FADED`` of its largest (or 0), so that its smallest direction is
    known to ``eps / FADED`` at best. A power of ``F`` does this (two directions that ``F``
    mixes, eigenvalues 1.0024 and 0.5876: the second one's share ``(0.5876 / 1.0024)^t`` falls
    below ``FADED`` after 21 steps and below the rounding after about 68), though each direction
    stays diffuse. From then on :func:`filter_moments` carries the series' factor as
    ``Qa Ra`` (:func:`predict_graded`) and decides its diffuse entries and their
    log-likelihood terms on the orthonormal basis ``Qa`` (the sum of ``-1/2 log f_inf`` and
    ``+1/2 log pdet(H P_inf H')`` is the same for any factor of the same range), and takes the
    gains ``P_inf h / h' P_inf h`` from ``D`` while it holds every direction in its
    coordinates' scales, else from the column-graded ``Dg`` (:func:`column_graded`,
    :func:`resolve_graded`)."""
    sv = torch.linalg.svdvals(D)
    kth = sv.gather(-1, (k - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return (k > 1) & ~(kth > FADED * sv[..., 0])
