"""Parallel-in-time dense filter and smoother from prefix/suffix scans of filtering elements.

The prior on x_0 is applied after the scan ("prior at the end"): the prefix element over 1..t gives
p(x_t | x_0, z_{1:t}) and the information (eta_t, J_t) that z_{1:t} carry about x_0, so the filtered
moments are those of x_t = A_t x_0 + b_t + N(0, C_t) with x_0 drawn from its posterior. A diffuse
prior (zero precision in some directions) is exact: the directions of x_0 not yet resolved by the data
(the null space of J_t inside the diffuse subspace) stay diffuse. Derivation: docs/dense.md.

All arrays are [B, T, ...] (see :mod:`kalmanscan.dense.scan` for the element notation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kalmanscan.dense._args import LOG_2PI, Model
from kalmanscan.dense.scan import Element, _sym, mask_observation, scan, step_elements


def rank_tol(dtype) -> float:
    """Relative threshold below which an eigenvalue counts as zero in the diffuse bookkeeping."""
    return 1000.0 * torch.finfo(dtype).eps


class Moments(NamedTuple):
    mean: torch.Tensor  # [B, T, n]
    cov: torch.Tensor  # [B, T, n, n] finite part (P_* in Durbin & Koopman's notation)
    diffuse: torch.Tensor  # [B, T, n, n] spans the unbounded directions (0 when proper)
    ndiffuse: int  # steps [0, ndiffuse) may be diffuse; later ones are proper


class FilterParts(NamedTuple):
    filtered: Moments
    pred_mean: torch.Tensor
    pred_cov: torch.Tensor
    loglik_steps: torch.Tensor  # [B, T]
    prefix: Element  # [B, T+1] with the identity at index 0
    x0: tuple  # (mu0, Sigma0, PiK) of the full-data posterior of x_0 (index T)


def _eye(n, like):
    return torch.eye(n, dtype=like.dtype, device=like.device)


def _mv(M, v):
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def _null_projector(J, PiN, tol):
    """Projector onto {x in range(PiN): J x = 0}, from eigh of PiN J PiN + (I - PiN) s (no grad)."""
    with torch.no_grad():
        n = J.shape[-1]
        s = torch.linalg.matrix_norm(J).clamp_min(torch.finfo(J.dtype).tiny).unsqueeze(-1)
        Jn = PiN @ J @ PiN + (_eye(n, J) - PiN) * s.unsqueeze(-1)
        w, U = torch.linalg.eigh(_sym(Jn))
        null = (w <= tol * s).to(J.dtype)
        return (U * null.unsqueeze(-2)) @ U.transpose(-1, -2)


def _range_projector(D, scale, tol):
    """Projector onto the range of the PSD matrix D (eigenvalues above tol * scale), no grad."""
    with torch.no_grad():
        w, U = torch.linalg.eigh(_sym(D))
        keep = (w > tol * scale.unsqueeze(-1)).to(D.dtype)
        return (U * keep.unsqueeze(-2)) @ U.transpose(-1, -2), keep.sum(-1)


def _first_resolved(J, PiN, tol):
    """Smallest index t (0..T) from which every series has no unresolved diffuse direction; T+1 if never."""
    B, T1 = J.shape[:2]

    def resolved(t):
        return bool((_null_projector(J[:, t], PiN, tol).diagonal(dim1=-2, dim2=-1).sum(-1) < 0.5).all())

    if not resolved(T1 - 1):
        return T1
    lo, hi = 0, T1 - 1  # hi resolved
    if resolved(0):
        return 0
    while hi - lo > 1:  # information only grows, so the null space shrinks monotonically
        mid = (lo + hi) // 2
        if resolved(mid):
            hi = mid
        else:
            lo = mid
    return hi


def x0_posterior(model: Model, J, eta, tol):
    """Posterior of x_0 given information (eta, J) [B, T1, ...]: (mu0, Sigma0, PiK, nd)."""
    B, T1, n = eta.shape
    m0 = model.m0.unsqueeze(1)
    if model.P0 is not None:
        P0 = model.P0.unsqueeze(1)
        Y = _eye(n, J) + P0 @ J
        rhs = torch.cat([P0.expand(B, T1, n, n), (P0 @ (eta - _mv(J, m0)).unsqueeze(-1))], -1)
        sol = torch.linalg.solve(Y, rhs)
        return m0 + sol[..., n], _sym(sol[..., :n]), None, 0
    L0 = model.L0.unsqueeze(1)
    PiN = _eye(n, J) - _range_projector(model.L0, torch.linalg.matrix_norm(model.L0), tol)[0]
    M = L0 + J
    h = _mv(L0, m0) + eta
    PiK = None
    nd = 0
    if bool((PiN.diagonal(dim1=-2, dim2=-1).sum(-1) > 0.5).any()):
        nd = _first_resolved(J, PiN, tol)
        if nd > 0:
            PiK_head = _null_projector(J[:, :nd], PiN.unsqueeze(1), tol)
            PiK = torch.cat([PiK_head, torch.zeros(B, T1 - nd, n, n, dtype=J.dtype, device=J.device)], 1)
    if PiK is None:
        sol = torch.linalg.solve(M, torch.cat([_eye(n, J).expand(B, T1, n, n), h.unsqueeze(-1)], -1))
        return sol[..., n], _sym(sol[..., :n]), None, 0
    sol = torch.linalg.solve(M + PiK, torch.cat([_eye(n, J).expand(B, T1, n, n), (h + _mv(PiK, m0)).unsqueeze(-1)], -1))
    return sol[..., n], _sym(sol[..., :n] - PiK), PiK, nd


def _prepend_identity(e: Element) -> Element:
    B, T, n = e.b.shape
    eye = _eye(n, e.A).expand(B, 1, n, n)
    zv = torch.zeros(B, 1, n, dtype=e.b.dtype, device=e.b.device)
    zm = torch.zeros(B, 1, n, n, dtype=e.b.dtype, device=e.b.device)
    return Element(torch.cat([eye, e.A], 1), torch.cat([zv, e.b], 1), torch.cat([zm, e.C], 1),
                   torch.cat([zv, e.eta], 1), torch.cat([zm, e.J], 1))


def _moments(A, b, C, mu0, Sigma0, PiK, nd):
    mean = _mv(A, mu0) + b
    At = A.transpose(-1, -2)
    cov = _sym(C + A @ Sigma0 @ At)
    if PiK is None:
        dif = torch.zeros_like(cov)
    else:
        dif = _sym(A @ PiK @ At)
    return Moments(mean, cov, dif, nd)


def step_loglik(model: Model, pred_mean, pred_cov, pred_dif, nd: int, tol):
    """log N of the part of each z_t orthogonal to the still-diffuse directions H D_t^- H' ([B, T])."""
    H, R, z = mask_observation(model.z, model.observed, model.H, model.R)
    v = z - _mv(H, pred_mean)
    S = _sym(H @ pred_cov @ H.transpose(-1, -2) + R)
    nobs = model.observed.sum(-1).to(v.dtype)
    if nd > 0:  # rotate the diffuse steps so the diffuse directions of z_t drop out
        Hd = H[:, :nd]
        G = Hd @ pred_dif[:, :nd] @ Hd.transpose(-1, -2)
        scale = torch.linalg.matrix_norm(Hd).square() * torch.linalg.matrix_norm(pred_dif[:, :nd])
        Pd, r = _range_projector(G, scale, tol)
        with torch.no_grad():
            w, U = torch.linalg.eigh(Pd)  # eigenvalue 1: diffuse direction, 0: kept
            keep = (w < 0.5).to(v.dtype)
        Sd = U.transpose(-1, -2) @ S[:, :nd] @ U
        Sd = Sd * (keep.unsqueeze(-1) * keep.unsqueeze(-2)) + torch.diag_embed(1.0 - keep)
        vd = _mv(U.transpose(-1, -2), v[:, :nd]) * keep
        S = torch.cat([Sd, S[:, nd:]], 1)
        v = torch.cat([vd, v[:, nd:]], 1)
        nobs = torch.cat([nobs[:, :nd] - r, nobs[:, nd:]], 1)
    L = torch.linalg.cholesky(S)
    w = torch.linalg.solve_triangular(L, v.unsqueeze(-1), upper=False).squeeze(-1)
    logdet = 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    return -0.5 * (nobs * LOG_2PI + logdet + w.square().sum(-1))


def precision_of(m: Moments, tol):
    """Precision of N(mean, cov + inf * diffuse): the limit, singular where diffuse."""
    prec, _ = torch.linalg.inv_ex(m.cov)
    if m.ndiffuse == 0:
        return prec
    nd = m.ndiffuse
    n = m.cov.shape[-1]
    D = m.diffuse[:, :nd]
    Pd, _ = _range_projector(D, torch.linalg.matrix_norm(D), tol)
    Pk = _eye(n, D) - Pd
    inner, _ = torch.linalg.inv_ex(Pk @ m.cov[:, :nd] @ Pk + Pd)
    return torch.cat([_sym(Pk @ inner @ Pk), prec[:, nd:]], 1)


def cov_with_inf(m: Moments, tol):
    """The covariance with +-inf in the entries that the diffuse directions make unbounded."""
    if m.ndiffuse == 0:
        return m.cov
    nd = m.ndiffuse
    D = m.diffuse[:, :nd]
    Pd, _ = _range_projector(D, torch.linalg.matrix_norm(D), tol)
    big = Pd.abs() > tol
    inf = torch.full_like(Pd, float("inf")).copysign(Pd)
    head = torch.where(big, inf, m.cov[:, :nd])
    return torch.cat([head, m.cov[:, nd:]], 1)


def filter_parts(model: Model, chunk: int = 32) -> FilterParts:
    tol = rank_tol(model.z.dtype)
    E = step_elements(model.z, model.observed, model.F, model.c, model.Q, model.H, model.R)
    P = _prepend_identity(scan(E, chunk=chunk))
    mu0, Sigma0, PiK, nd = x0_posterior(model, P.J, P.eta, tol)
    allm = _moments(P.A, P.b, P.C, mu0, Sigma0, PiK, nd)
    T = model.z.shape[1]
    filt = Moments(allm.mean[:, 1:], allm.cov[:, 1:], allm.diffuse[:, 1:], max(nd - 1, 0))
    F, Ft = model.F, model.F.transpose(-1, -2)
    pm = _mv(F, allm.mean[:, :T]) + model.c
    pP = _sym(F @ allm.cov[:, :T] @ Ft + model.Q)
    pD = _sym(F @ allm.diffuse[:, :T] @ Ft)
    ll = step_loglik(model, pm, pP, pD, min(nd, T), tol)
    x0 = (mu0[:, -1], Sigma0[:, -1], PiK[:, -1] if nd > T else None)
    return FilterParts(filt, pm, pP, ll, P, x0)


def smooth_moments(model: Model, parts: FilterParts, chunk: int = 32) -> Moments:
    """Smoothed moments: p(x_t | x_0, z_{1:T}) from the prefix and the suffix information, then x_0."""
    E = step_elements(model.z, model.observed, model.F, model.c, model.Q, model.H, model.R)
    S = scan(E, reverse=True, chunk=chunk)
    B, T, n = S.b.shape
    zm = torch.zeros(B, 1, n, n, dtype=S.b.dtype, device=S.b.device)
    Jb = torch.cat([S.J[:, 1:], zm], 1)
    etab = torch.cat([S.eta[:, 1:], torch.zeros(B, 1, n, dtype=S.b.dtype, device=S.b.device)], 1)
    A, b, C = parts.prefix.A[:, 1:], parts.prefix.b[:, 1:], parts.prefix.C[:, 1:]
    X = _eye(n, A) + C @ Jb
    sol = torch.linalg.solve(X, torch.cat([A, C, (b + _mv(C, etab)).unsqueeze(-1)], -1))
    A2, C2, b2 = sol[..., :n], _sym(sol[..., n : 2 * n]), sol[..., 2 * n]
    mu0, Sigma0, PiK = parts.x0
    nd = T if PiK is not None else 0
    return _moments(
        A2, b2, C2, mu0.unsqueeze(1), Sigma0.unsqueeze(1), None if PiK is None else PiK.unsqueeze(1), nd
    )
