"""Parallel-in-time dense filter and smoother from prefix/suffix scans of filtering elements.

The known state is folded into the first element of the prefix scan (the prior, or the filtered
state at the end of the diffuse head), so the prefix elements are the filtered moments themselves
and no information about x_0 is formed: with a step observed at R = 1e-12 I and no process noise
that information is 1e12 in the observed direction and its rounding took the O(1) entries (the
former "prior at the end"). A diffuse prior: the head of the series up to the step that resolves
the last diffuse direction runs the sequential reference's exact initial filter (a few steps), and
its smoothed moments combine the filtered finite part and diffuse directions with the suffix
information. A direction not resolved within 16 n + 64 steps keeps the prior-at-the-end form,
which holds it diffuse over the whole series, where that form holds every direction the data
resolve (:func:`_x0_trusted`); else the reference runs on until every series is proper.
Derivation: docs/dense.md.

All arrays are [B, T, ...] (see :mod:`kalmanscan.dense.scan` for the element notation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kalmanscan.dense._args import LOG_2PI, Model
from kalmanscan.dense.scan import (
    Element,
    _near_steps,
    _sym,
    condition,
    mask_observation,
    scan,
    step_elements,
)


def rank_tol(dtype) -> float:
    """Relative threshold below which an eigenvalue counts as zero in the diffuse bookkeeping.

    Exact zeros come out of the scan at ~eps relative to the matrix norm; a direction the data do
    inform can legitimately sit at 1e-5 of it (measured on random models), which float32 must still
    call resolved. 64 eps lies between the two (docs/dense.md, float32).
    """
    return 64.0 * torch.finfo(dtype).eps


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
    """Projector onto {x in range(PiN): J x = 0}, from eigh of ``Jn = PiN J PiN + (I - PiN) s``
    equilibrated, ``S Jn S`` with ``S = diag(Jn)^-1/2`` (no grad): the structural information
    of a local linear trend first observed after a gap of g steps, rows ``[1, s]`` for s near
    g, has eigenvalues ``4 g^4`` apart (3e-15 at g = 3000, below the threshold: its slope was
    decided resolved two observations late, the log-likelihood 17 % off), its equilibrated form
    about ``g^2``. A null vector ``u`` of ``S Jn S`` is ``S u`` of ``Jn`` (the null ones
    first in eigh's order, so the QR of those columns spans exactly them)."""
    with torch.no_grad():
        n = J.shape[-1]
        s = torch.linalg.matrix_norm(J).clamp_min(torch.finfo(J.dtype).tiny).unsqueeze(-1)
        Jn = PiN @ J @ PiN + (_eye(n, J) - PiN) * s.unsqueeze(-1)
        d = torch.diagonal(Jn, dim1=-2, dim2=-1)
        sc = torch.where(d > 0, d, torch.ones_like(d)).rsqrt()
        Je = _sym(Jn * sc.unsqueeze(-1) * sc.unsqueeze(-2))
        w, U = torch.linalg.eigh(Je)
        se = torch.linalg.matrix_norm(Je).clamp_min(torch.finfo(J.dtype).tiny).unsqueeze(-1)
        null = (w <= tol * se).to(J.dtype)
        Q = torch.linalg.qr(sc.unsqueeze(-1) * U)[0] * null.unsqueeze(-2)
        return Q @ Q.transpose(-1, -2)


def fro_norm(X):
    """Frobenius norm [...] of X [..., k, k] without overflow: ``torch.linalg.matrix_norm`` sums
    squares, inf beyond entries of about 1e154 (a prior precision of 1e200 read as inf, every
    direction then diffuse)."""
    top = X.abs().amax((-1, -2))
    top = torch.where(top > 0, top, torch.ones_like(top))
    return top * torch.linalg.matrix_norm(X / top[..., None, None])


def _range_projector(D, scale, tol):
    """Projector onto the range of the PSD matrix D (eigenvalues above tol * scale), no grad."""
    with torch.no_grad():
        w, U = torch.linalg.eigh(_sym(D))
        keep = (w > tol * scale.unsqueeze(-1)).to(D.dtype)
        return (U * keep.unsqueeze(-2)) @ U.transpose(-1, -2), keep.sum(-1)


def prior_null(L0, dtype=None):
    """[B, n, n] orthonormal basis (zero columns elsewhere) of the diffuse directions of a prior
    precision ``L0`` [B, n, n] given by the user (``prior_precision``; docs/dense.md, "Diffuse
    priors"): a coordinate whose row and column of ``L0`` are exactly 0, and in the rest of the
    matrix an eigenvalue at most ``n eps`` (of ``dtype``, the inputs' working dtype) of its
    Frobenius norm, which is the rounding of a computed singular precision such as ``G G'``; any
    larger eigenvalue, however small, is a proper (if vague) direction. Decided in float64 on
    the values given, with no gradient; the same on every backend."""
    dtype = L0.dtype if dtype is None else dtype
    with torch.no_grad():
        L = _sym(L0.detach().to(torch.float64))
        n = L.shape[-1]
        zero = (L == 0).all(-1)  # [B, n] exact zero rows (and columns: L is symmetric)
        scale = fro_norm(L)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        # the exact zero coordinates get eigenvalue -scale (eigenvectors e_i: their rows are 0)
        M = L - torch.diag_embed(zero.to(L.dtype)) * scale[..., None, None]
        w, U = torch.linalg.eigh(M)
        null = w <= n * torch.finfo(dtype).eps * scale.unsqueeze(-1)
        return (U * null.to(U.dtype).unsqueeze(-2)).to(L0.dtype)


def prior_start(model: Model):
    """(P [B, n, n], D [B, n, n]) of a prior given in precision form (``model.P0`` None): the
    finite part ``P`` of the prior covariance and an orthonormal basis ``D`` of its diffuse
    directions (zero columns elsewhere; ``D D'`` the projector). From ``prior_cov`` with inf on
    its diagonal (``model.P0inf``) exactly: ``D`` the inf coordinates, ``P`` the finite block
    with zeros across them (a series without inf: its covariance). From a user's
    ``prior_precision``: :func:`prior_null`, ``P = (L0 + D D')^-1 - D D'``."""
    if model.P0inf is not None:
        G = model.P0inf
        dif = torch.isposinf(torch.diagonal(G, dim1=-2, dim2=-1))
        off = dif.unsqueeze(-1) | dif.unsqueeze(-2)
        P = torch.where(off, torch.zeros((), dtype=G.dtype, device=G.device), G)
        D = torch.diag_embed(dif.to(G.dtype))
        return P, D
    L0 = model.L0
    D = prior_null(L0, model.z.dtype)
    N = D @ D.transpose(-1, -2)
    return _sym(torch.linalg.inv(L0 + N) - N), D


def known_prior(model: Model):
    """[B, n, n] the projector on the directions of the prior known exactly beside diffuse ones
    (``prior_cov`` with inf on its diagonal whose finite block is singular: ``model.L0`` is then
    the block's pseudo-inverse, :func:`kalmanscan.dense._args._precision_from_partly_infinite`),
    or None where there is none: the null space of the finite block, ``I - D D' - P L0`` (0 to
    rounding where the block inverts), no gradient."""
    if model.P0inf is None:
        return None
    with torch.no_grad():
        P, D = prior_start(model)
        n = P.shape[-1]
        N = _eye(n, P) - D @ D.transpose(-1, -2) - P @ model.L0.to(P.dtype)
        w, U = torch.linalg.eigh(_sym(N))
        keep = (w > 0.5).to(P.dtype)
        if not bool(keep.any()):
            return None
        return (U * keep.unsqueeze(-2)) @ U.transpose(-1, -2)


def _resolved(J, PiN, tol) -> bool:
    """Whether no series has a diffuse direction left that J does not inform."""
    return bool((_null_projector(J, PiN, tol).diagonal(dim1=-2, dim2=-1).sum(-1) < 0.5).all())


def _structural_elements(model: Model) -> Element:
    """The step elements of the noise-free system (Q = 0, R = I, same F, H and missing entries).

    Their prefix information about x_0 is O_t' O_t, O_t the stacked observed rows H_s F_s...F_1:
    it has the null space of the true information J_t whenever the true noise is finite (for
    J_t = O_t' S^-1 O_t with S the positive-definite covariance of the stacked noise), and no
    1/R in it. Which diffuse directions are resolved is decided on it (structure, not
    magnitudes): with R = 1e-12 I the true J spans 12 decades and its rounding hides O(1)
    eigenvalues.
    """
    z = torch.zeros_like(model.z)
    eye = torch.eye(model.z.shape[-1], dtype=z.dtype, device=z.device)
    return step_elements(
        z, model.observed, model.F, torch.zeros_like(model.c), torch.zeros_like(model.Q),
        model.H, eye,
    )  # fmt: skip


def _diffuse_head(model: Model, E: Element, PiN, tol, chunk):
    """Prefix over a head of the series long enough to resolve every diffuse direction.

    Returns (prefix [B, L+1] with the identity at 0, structural prefix information [B, L+1],
    tau): tau is the first index at which all series are resolved (None if the whole series never
    resolves them), decided on the structural elements (:func:`_structural_elements`) of the
    head's steps only. The head grows 8, 32, ...; inside it, tau is found by doubling then
    bisection (information only grows).
    """
    T = E.A.shape[1]
    L = min(8, T)
    while True:
        Ph = _prepend_identity(scan(Element(*(x[:, :L] for x in E)), chunk=chunk))
        Es = _structural_elements(_steps(model, slice(0, L)))
        Js = _prepend_identity(scan(Es, chunk=chunk)).J
        cands = sorted({1 << k for k in range(L.bit_length()) if (1 << k) <= L} | {L})
        lo = 0
        for hi in cands:
            if _resolved(Js[:, hi], PiN, tol):
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if _resolved(Js[:, mid], PiN, tol):
                        hi = mid
                    else:
                        lo = mid
                return Ph, Js, hi
            lo = hi
        if L == T:
            return Ph, Js, None
        L = min(4 * L, T)


def _post_cov(m0, P0, J, eta):
    """Posterior of the start state: prior N(m0, P0) ([B, n], [B, n, n]), information (eta, J).

    J, eta: [B, T1, ...]; returns mean [B, T1, n], cov [B, T1, n, n].
    """
    n = J.shape[-1]
    m0, P0 = m0.unsqueeze(1), P0.unsqueeze(1)
    Y = _eye(n, J) + P0 @ J
    rhs = torch.cat([P0.expand(J.shape), (P0 @ (eta - _mv(J, m0)).unsqueeze(-1))], -1)
    sol = torch.linalg.solve(Y, rhs)
    return m0 + sol[..., n], _sym(sol[..., :n])


def _scaled_solve(M, rhs, check=True):
    """M^-1 rhs for a symmetric positive (semi)definite M [..., n, n], solved as
    ``S (S M S)^-1 S rhs`` with ``S = diag(M)^-1/2``: partial pivoting on M itself picks rows by
    magnitude, and with R = 1e-12 I the information about x_0 is 1e12 in the observed direction
    next to O(1) entries, so the unscaled LU subtracts 1e12 rows from O(1) ones (4e-4 off on
    KFAS's VAR(1) at R = 1e-10); the scaled matrix has a unit diagonal (docs/dense.md)."""
    d = torch.diagonal(M, dim1=-2, dim2=-1)
    s = torch.where(d > 0, d, torch.ones_like(d)).rsqrt()
    Ms = M * s.unsqueeze(-1) * s.unsqueeze(-2)
    if not check:  # a singular M gives non-finite values instead of raising
        return s.unsqueeze(-1) * torch.linalg.solve_ex(Ms, s.unsqueeze(-1) * rhs)[0]
    return s.unsqueeze(-1) * torch.linalg.solve(Ms, s.unsqueeze(-1) * rhs)


def _numerically_singular(P, tol):
    """[...] bool: the PSD matrices P [..., n, n] whose diagonally scaled form ``S P S``
    (``S = diag(P)^-1/2``, a zero diagonal entry counting as singular) has an eigenvalue at most
    ``tol`` times its largest."""
    d = torch.diagonal(P, dim1=-2, dim2=-1)
    s = torch.where(d > 0, d, torch.ones_like(d)).rsqrt()
    w = torch.linalg.eigvalsh(_sym(P * s.unsqueeze(-1) * s.unsqueeze(-2)))
    return (d <= 0).any(-1) | (w[..., 0] <= tol * w[..., -1])


def _post_prec(m0, L0, J, eta, PiK=None, Nk=None):
    """Same with prior precision L0 (0 where diffuse); PiK projects on the unresolved ones, Nk
    [B, n, n] (None: none) on directions of the prior known exactly (:func:`known_prior`; L0 is
    0 along them): ``x_0 = m0 + Pv a`` with ``Pv = I - Nk``, the posterior of ``a`` in the
    prior's range (``(Pv (L0 + J) Pv + Nk)^-1``, the known block decoupled), so that the known
    directions keep ``m0`` and variance 0."""
    n = J.shape[-1]
    if Nk is not None:
        return _post_prec_known(m0, L0, J, eta, PiK, Nk)
    m0, L0 = m0.unsqueeze(1), L0.unsqueeze(1)
    M = L0 + J
    h = _mv(L0, m0) + eta
    eye = _eye(n, J).expand(J.shape)
    if PiK is None:
        sol = _scaled_solve(M, torch.cat([eye, h.unsqueeze(-1)], -1))
        return sol[..., n], _sym(sol[..., :n])
    sol = _scaled_solve(M + PiK, torch.cat([eye, (h + _mv(PiK, m0)).unsqueeze(-1)], -1))
    return sol[..., n], _sym(sol[..., :n] - PiK)


def _post_prec_known(m0, L0, J, eta, PiK, Nk):
    """:func:`_post_prec` with directions ``Nk`` [B, n, n] of the prior known exactly."""
    n = J.shape[-1]
    m0, L0, Nk = m0.unsqueeze(1), L0.unsqueeze(1), Nk.unsqueeze(1)
    Pv = _eye(n, J) - Nk
    M = _sym(Pv @ (L0 + J) @ Pv) + Nk
    if PiK is not None:
        M = M + PiK
    h = _mv(Pv, eta - _mv(J, m0))
    eye = _eye(n, J).expand(J.shape)
    sol = _scaled_solve(M, torch.cat([eye, h.unsqueeze(-1)], -1))
    Sig = Pv @ sol[..., :n] @ Pv
    if PiK is not None:
        Sig = Sig - PiK
    return m0 + _mv(Pv, sol[..., n]), _sym(Sig)


def _prior_root(P0):
    """[B, n, n] factor ``U`` with ``U U' = P0`` (a positive definite ``P0`` [B, n, n]): the
    Cholesky factor of the diagonally scaled ``S P0 S`` (``S = diag(P0)^-1/2``), unscaled; None
    where that factorization fails (``P0`` numerically singular)."""
    d = torch.diagonal(P0, dim1=-2, dim2=-1)
    if not bool((d > 0).all()):
        return None
    s = d.rsqrt()
    Ls, info = torch.linalg.cholesky_ex(_sym(P0 * s.unsqueeze(-1) * s.unsqueeze(-2)))
    if bool((info != 0).any()):
        return None
    return Ls / s.unsqueeze(-1)


def _post_root(m0, U, J, eta):
    """Posterior of the start state with prior ``N(m0, U U')`` ([B, n], [B, n, n]) and
    information (eta, J) [B, T1, ...]: ``Sigma = U G^-1 U'``, ``G = I + U' J U`` (eigenvalues at
    least 1), ``mu = m0 + U G^-1 U' (eta - J m0)``. Nothing inverts the prior: its precision
    ``(U U')^-1`` keeps only ``eps cond(P0)`` of the data's information beside it, where the
    posterior itself moves by ``eps |P0|`` at most (docs/dense.md, the scan's large proper
    prior)."""
    n = J.shape[-1]
    m0, U = m0.unsqueeze(1), U.unsqueeze(1)
    Ut = U.transpose(-1, -2)
    G = _sym(_eye(n, J) + Ut @ J @ U)
    h = Ut @ (eta - _mv(J, m0)).unsqueeze(-1)
    sol = _scaled_solve(G, torch.cat([Ut.expand(J.shape), h], -1))
    return m0 + (U @ sol[..., n:]).squeeze(-1), _sym(U @ sol[..., :n])


def _post_start(m0, U, J, eta):
    """The information head's posterior of the start state (prior ``N(m0, U U')``):
    :func:`_post_root` in float64; in float32 :func:`_post_prec` with the prior's precision
    ``(U U')^-1``. There ``G = I + U' J U`` of a 1e6 I prior beside an entry at R = 1e-10 spans
    about 1e16 at the steps before J has full rank, beyond float32's range of digits, and the
    root form's ``U G^-1 U'`` came out indefinite (an eigenvalue of -3.8e6: the step's S not
    positive definite, LinAlgError), where the precision form's solve stays positive definite,
    as the float32 scan did before the root form (kalmanscan validate's dense regime "3
    states, prior 1e6 I, one entry at R=1e-10": log-likelihood -556.207 against the mpmath
    oracle's -556.255)."""
    if U.dtype != torch.float32:
        return _post_root(m0, U, J, eta)
    P0 = _sym(U @ U.transpose(-1, -2))
    L0 = _sym(_scaled_solve(P0, _eye(P0.shape[-1], P0).expand(P0.shape)))
    return _post_prec(m0, L0, J, eta)


def _prepend_identity(e: Element) -> Element:
    B, T, n = e.b.shape
    eye = _eye(n, e.A).expand(B, 1, n, n)
    zv = torch.zeros(B, 1, n, dtype=e.b.dtype, device=e.b.device)
    zm = torch.zeros(B, 1, n, n, dtype=e.b.dtype, device=e.b.device)
    return Element(
        torch.cat([eye, e.A], 1),
        torch.cat([zv, e.b], 1),
        torch.cat([zm, e.C], 1),
        torch.cat([zv, e.eta], 1),
        torch.cat([zm, e.J], 1),
    )


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
    """log N of the part of each z_t orthogonal to the still-diffuse directions ([B, T])."""
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
    ll = -0.5 * (nobs * LOG_2PI + logdet + w.square().sum(-1))
    near = _near_steps(H, R, pred_cov)
    if near is not None:
        near = near.clone()
        near[:, :nd] = False  # the diffuse steps keep their rotation above
        if bool(near.any()):
            ll = torch.where(near, _sqrt_loglik(H, R, z, pred_mean, pred_cov, nobs), ll)
    return ll


def _sqrt_loglik(H, R, z, m, P, nobs):
    """The proper steps' log N(z; H m, H P H' + R) without S^-1 (which loses eps cond(S) with
    two or more near noise-free entries): ``R = Lr Lr'``, ``P = L L'``, ``W = Lr^-1 H``,
    ``[[W L, Lr^-1 v], [I, 0]]`` triangularized to ``[[Ru, c], [0, rho]]``; ``log det S =
    log det R + 2 sum log |diag Ru|``, ``v' S^-1 v = rho^2`` (as sequential._factor_update)."""
    from kalmanscan.dense.sequential import _factor

    n, d = P.shape[-1], H.shape[-2]
    eye_d = torch.eye(d, dtype=R.dtype, device=R.device)
    Lr, info = torch.linalg.cholesky_ex(R)
    Lr = torch.where((info != 0)[..., None, None], eye_d, Lr)
    L = _factor(_sym(P))
    W = torch.linalg.solve_triangular(Lr, H, upper=False)
    v = torch.linalg.solve_triangular(Lr, (z - _mv(H, m)).unsqueeze(-1), upper=False)
    eye_n = torch.eye(n, dtype=P.dtype, device=P.device).expand(P.shape)
    M = torch.cat(
        [torch.cat([W @ L, v], -1), torch.cat([eye_n, torch.zeros_like(P[..., :1])], -1)], -2
    )
    Ra = torch.linalg.qr(M, mode="reduced")[1]  # full column rank but for rho = 0
    Ru, rho = Ra[..., :n, :n], Ra[..., n, n]
    logdet = 2.0 * (
        torch.log(torch.diagonal(Lr, dim1=-2, dim2=-1)).sum(-1)
        + torch.log(torch.diagonal(Ru, dim1=-2, dim2=-1).abs()).sum(-1)
    )
    return -0.5 * (nobs * LOG_2PI + logdet + rho.square())


def _inverse_screened(M, tol, screened):
    """(inverse of the PSD M [B, T, n, n], flagged [B, T]: the screen of
    :func:`kalmanscan.dense.singular.screen` where ``screened``, else False). Flagged rows are the
    known-direction rule's (which recomputes them); with grad they are inverted as the identity,
    so that no infinite inverse of a singular M reaches the backward (0 * inf)."""
    from kalmanscan.dense.singular import screen

    if not screened:
        inv, _ = torch.linalg.inv_ex(M)
        return inv, torch.zeros(M.shape[:-2], dtype=torch.bool, device=M.device)
    with torch.no_grad():
        inv, _ = torch.linalg.inv_ex(M)
        flags = screen(M, inv, tol)
    if M.requires_grad:
        eye = _eye(M.shape[-1], M)
        inv, _ = torch.linalg.inv_ex(torch.where(flags[..., None, None], eye, M))
    return inv, flags


def precision_of(m: Moments, tol, screened: bool = False):
    """Precision of N(mean, cov + inf * diffuse): the limit, singular where diffuse. Returns
    (precision [B, T, n, n], flagged [B, T] bool: with ``screened``, the steps whose inverted
    matrix may be singular, where :mod:`kalmanscan.dense.singular` decides, Pd [B, ndiffuse, n, n]
    the diffuse projectors of the steps that may be diffuse, or None)."""
    prec, flags = _inverse_screened(m.cov, tol, screened)
    if m.ndiffuse == 0:
        return prec, flags, None
    nd = m.ndiffuse
    n = m.cov.shape[-1]
    D = m.diffuse[:, :nd]
    dtype = D.dtype
    with torch.no_grad():  # Pd = V V' (the range of D), Z an orthonormal basis of the rest
        w, U = torch.linalg.eigh(_sym(D))
        on = w > tol * torch.linalg.matrix_norm(D).unsqueeze(-1)
        # the rank in the coordinates' own scales where it sees more (the reference smoother's
        # rule, :func:`kalmanscan.dense.sequential.diffuse_factor`): a diffuse direction whose
        # eigenvalue is below tol of the largest (a faded share of kappa's coefficient, exact
        # to its own scale) is still diffuse; then the range is that of S V_k
        from kalmanscan.dense.sequential import _scaled_eigh

        sc, _, V, keep_s = _scaled_eigh(_sym(D))
        more = keep_s.sum(-1) > on.sum(-1)
        if bool(more.any()):
            km = keep_s.to(dtype).unsqueeze(-2)
            Qb = torch.linalg.qr(sc.unsqueeze(-1) * V * km)[0] * km
            w2, U2 = torch.linalg.eigh(_sym(Qb @ Qb.mT))
            on2 = w2 > 0.5
            U = torch.where(more[..., None, None], U2, U)
            on = torch.where(more.unsqueeze(-1), on2, on)
        Pd = (U * on.to(dtype).unsqueeze(-2)) @ U.mT
        none = ~on.any(-1)  # no diffuse direction: the coordinates as they are (Z = I)
        Z = torch.where(none[..., None, None], _eye(n, D), U * (~on).to(dtype).unsqueeze(-2))
        pad = (on & ~none.unsqueeze(-1)).to(dtype)
    # the finite part in the basis Z: exactly 0 along the diffuse directions (I - Pd holds
    # eps of them, which the inverse of a block that is all rounding made O(1): two diffuse
    # directions, nothing finite, and a precision of 0.26 where the limit is 0)
    inner = Z.mT @ m.cov[:, :nd] @ Z
    # the diffuse coordinates' unit diagonal at the scale of the finite block (any positive
    # scale gives the same Z inner^-1 Z'): one beside a cov of scale v costs |log v| digits
    tau = inner.detach().diagonal(dim1=-2, dim2=-1).amax(-1)
    tau = tau.clamp_min(torch.finfo(inner.dtype).tiny)
    inv, fl = _inverse_screened(inner + tau[..., None, None] * torch.diag_embed(pad), tol, screened)
    flags[:, :nd] = fl
    return torch.cat([_sym(Z @ inv @ Z.mT), prec[:, nd:]], 1), flags, Pd


def cov_with_inf(m: Moments, tol):
    """The covariance with +-inf in the entries that the diffuse part ``kappa D`` makes
    unbounded (``D = m.diffuse``, from the prior's ``kappa I``): ``+inf`` on the diagonal of a
    coordinate the diffuse directions reach (the projector on ``range(D)`` above ``tol`` there)
    and, between two such coordinates, the sign of ``D[i, j]`` where the diffuse part's
    correlation ``D[i, j] / sqrt(D[i, i] D[j, j])`` is not 0 (above
    :func:`kalmanscan.dense.sequential._dif_tol`, 1e-11 in float64: a ``D`` conditioned on
    resolved directions 1e5 its scale carries 1e-11 of rounding there): two diffuse directions
    that ``F`` mixes are correlated, which the projector (``I`` for two of them) does not show."""
    if m.ndiffuse == 0:
        return m.cov
    from kalmanscan.dense.sequential import _dif_tol

    nd = m.ndiffuse
    with torch.no_grad():
        D = _sym(m.diffuse[:, :nd])
        Pd, _ = _range_projector(D, torch.linalg.matrix_norm(D), tol)
        on = torch.diagonal(Pd, dim1=-2, dim2=-1) > tol  # [B, nd, n] coordinates reached
        root = torch.diagonal(D, dim1=-2, dim2=-1).clamp_min(0.0).sqrt()
        corr = D.abs() > _dif_tol(D.dtype) * root.unsqueeze(-1) * root.unsqueeze(-2)
        diag = torch.diag_embed(on)
        big = diag | (on.unsqueeze(-1) & on.unsqueeze(-2) & corr)
        sign = torch.where(diag, torch.ones_like(D), D)
    inf = torch.full_like(D, float("inf")).copysign(sign)
    head = torch.where(big, inf, m.cov[:, :nd])
    return torch.cat([head, m.cov[:, nd:]], 1)


def _slice(e: Element, sl) -> Element:
    return Element(*(x[:, sl] for x in e))


def _cat(*es: Element) -> Element:
    return Element(*(torch.cat(xs, 1) for xs in zip(*es, strict=True)))


SINGULAR_MESSAGE = (
    "R: backend 'torch' needs H Q H' + R positive definite on the observed entries of every step "
    "after the diffuse head (an exact observation of a step without process noise has infinite "
    "information); use backend='native' (CPU)"
)


def _steps(model: Model, sl) -> Model:
    """The model over the steps ``sl`` (time axis 1)."""
    return model._replace(
        **{k: getattr(model, k)[:, sl] for k in ("z", "observed", "F", "c", "Q", "H", "R")}
    )


def _folded_tail(model: Model, E: Element, t0: int, m, P, chunk):
    """Prefix over steps t0..T-1 from the filtered state (m, P) [B, n], [B, n, n] at t0 - 1.

    The known state is folded into the first element (F = 0, offset the prediction, Q its
    covariance), so the prefix is the filtered moments themselves (A = 0, J = 0): no information
    about an earlier state is formed, whose 1/R (a step without process noise observed with
    R = 1e-12 I) rounds away the O(1) entries of the others (docs/dense.md).
    """
    F, Q = model.F[:, t0], model.Q[:, t0]
    mp = _mv(F, m) + model.c[:, t0]
    Pp = _sym(F @ P @ F.transpose(-1, -2) + Q)
    sl = slice(t0, t0 + 1)
    bad = []
    first = step_elements(
        model.z[:, sl], model.observed[:, sl], torch.zeros_like(model.F[:, sl]),
        mp.unsqueeze(1), Pp.unsqueeze(1), model.H[:, sl], model.R[:, sl], singular=bad,
    )  # fmt: skip
    if bool(bad[0].any()):
        raise ValueError(SINGULAR_MESSAGE)
    return scan(_cat(first, _slice(E, slice(t0 + 1, None))), chunk=chunk)


def filter_parts(model: Model, chunk: int = 32) -> FilterParts:
    """Filtered moments, predictions and step log-likelihoods.

    Proper prior: one prefix scan whose first element holds the prior (the prefix is the filtered
    moments). Diffuse prior: the head of the series up to the step at which every diffuse
    direction is resolved (index tau) runs the exact initial filter of the sequential reference
    (a few steps; singular R allowed there), and the rest is one prefix scan from the proper
    filtered state at tau - 1. A direction not resolved within 16 n + 64 steps falls back to the
    information about x_0 (prior applied at the end; it keeps a never-resolved direction diffuse
    over the whole series) where :func:`_x0_trusted` finds that it holds every direction the
    data resolve; else the reference filter runs on from step 0 until every series is proper
    (over the whole series where one never is).
    """
    tol = rank_tol(model.z.dtype)
    bad = []
    E = step_elements(
        model.z, model.observed, model.F, model.c, model.Q, model.H, model.R, singular=bad
    )
    bad = bad[0].expand(E.b.shape[:2])
    B, T, n = E.b.shape
    PiN = None
    if model.P0 is None:  # the diffuse directions: prior_start's rule, that of every backend
        Pf, D0 = prior_start(model)
        PiN = D0 @ D0.transpose(-1, -2)
        if not bool((PiN.diagonal(dim1=-2, dim2=-1).sum(-1) > 0.5).any()):
            PiN = None
    if PiN is None:  # proper prior
        P0 = model.P0
        if P0 is None and model.P0inf is not None:
            P0 = Pf  # the covariances as given (no inf in any series here)
        elif P0 is None:
            P0 = _sym(_scaled_solve(model.L0, _eye(n, E.A).expand(B, n, n)))
        head = _information_head(model, E, bad, P0, tol, chunk)
        if head is not None:
            filt = head[0]
            return _head_and_tail(
                model, E, bad, head, filt.mean[:, -1], filt.cov[:, -1], tol, chunk
            )
        return _head_and_tail(model, E, bad, None, model.m0, P0, tol, chunk)
    from kalmanscan.dense import sequential

    L = min(T, 16 * n + 64)
    head = sequential.filter_moments(_steps(model, slice(0, L)), stop_when_proper=True)
    if bool((head[0].diffuse[:, -1] == 0).all()):
        filt = head[0]
        return _head_and_tail(model, E, bad, head, filt.mean[:, -1], filt.cov[:, -1], tol, chunk)
    found = _diffuse_head(model, E, PiN, tol, chunk)
    trusted = _x0_trusted(model, PiN, found, tol)
    if trusted is None:  # the reference until every series is proper (or over the whole series)
        if L < T:
            head = sequential.filter_moments(model, stop_when_proper=True)
        filt = head[0]
        return _head_and_tail(model, E, bad, head, filt.mean[:, -1], filt.cov[:, -1], tol, chunk)
    if bool(bad.any()):
        raise ValueError(SINGULAR_MESSAGE)
    return _unresolved_parts(model, E, PiN, tol, chunk, found, *trusted)


def _share(dtype) -> float:
    """The smallest share of a diffuse direction (:func:`_x0_trusted`) that the information
    about x_0 is trusted to hold: its information is ``share^2`` of the largest, so the relative
    error about ``eps / share^2`` (2.3e-10 in float64, 3e-5 in float32)."""
    return 2.0**-10 if dtype == torch.float64 else 2.0**-4


def _x0_trusted(model: Model, PiN, found, tol):
    """Whether the information about x_0 (:func:`_unresolved_parts`) holds every diffuse
    direction that the data resolve: (PiK [B, L+1, n, n] the unresolved projectors of the
    structural head ``found`` (:func:`_diffuse_head`), reach [B, T, n, n] or None, the
    projectors on the range that the never resolved directions reach at each step,
    :func:`kalmanscan.dense.sequential.reach_projectors`), or None where it does not: then the
    reference filter runs until every series is proper.

    In x_0's coordinates a direction resolved at step s is seen through ``A_s = F_s ... F_0``,
    whose columns a power of ``F`` aligns: the second of two directions that ``F`` mixes
    (eigenvalues 1.0024 and 0.5876) keeps a share ``r = (0.5876 / 1.0024)^s`` of the first, its
    information about x_0 is ``r^2`` relative, and once that is below the rounding the
    structural information itself says the direction is never resolved. Two tests, each
    decided per series:

    - the directions the structural head resolves (the range of ``PiN - PiK`` at its end),
      ``F_s ... F_0`` applied to them at every step up to the last resolution, diagonally
      equilibrated on both sides (the solves of :func:`_post_prec` scale the information's
      diagonal, and a product's rounding is relative to its entries: a local linear trend's
      ``[[1, s], [0, 1]]`` spreads its singular values by ``s^2``, but its equilibrated form by
      less than 3, and the information form holds it to 4e-13 after a 1000-step gap): its
      singular values at least :func:`_share` apart;
    - the directions it never resolves (``PiK`` at the end), carried forward as an orthonormal
      basis (no power of ``F`` formed: their range is exact whatever the shares): no observed
      row sees them (above ``_dif_tol`` of ``|F_t|``), which would be a resolution that the
      structural information lost to the rounding.
    """
    from kalmanscan.dense import sequential

    Ph, Js, tau = found
    B, T1 = Js.shape[:2]
    n = Js.shape[-1]
    dtype = Js.dtype
    with torch.no_grad():
        PiK = _null_projector(Js.detach(), PiN.unsqueeze(1), tol)  # [B, T1, n, n]
        rank = (torch.diagonal(PiK, dim1=-2, dim2=-1).sum(-1) + 0.5).floor()
        if not bool(torch.isfinite(rank).all()):  # the information's norm past the range (a
            return None  # faded pair over 1850 steps: 7.5e153 after its gap)
        # s_last: the first index at which each series' count has its final value
        final = rank[:, -1:]
        reached = (rank == final).to(torch.int64)
        s_last = T1 - reached.flip(1).cumprod(1).sum(1)  # [B]
        Pres = _sym(PiN - PiK[:, -1])
        k = (torch.diagonal(Pres, dim1=-2, dim2=-1).sum(-1) + 0.5).floor().to(torch.int64)
        S = int(s_last.max())
        if S > 0 and bool((k > 1).any()):
            F = model.F.detach().expand(B, -1, n, n)
            G, Gs = Pres, []
            for s in range(S):
                G = F[:, s] @ G
                G = G / G.abs().amax((-1, -2), keepdim=True).clamp_min(torch.finfo(dtype).tiny)
                Gs.append(G)
            G = torch.stack(Gs, 1)  # [B, S, n, n]
            for _ in range(8):  # Ruiz's equilibration: every nonzero row and column's max -> 1
                r = G.abs().amax(-1, keepdim=True).sqrt()
                c = G.abs().amax(-2, keepdim=True).sqrt()
                G = G / torch.where(r > 0, r, 1.0) / torch.where(c > 0, c, 1.0)
            sv = torch.linalg.svdvals(G)  # [B, S, n] descending
            kth = sv.gather(-1, (k - 1).clamp_min(0)[:, None, None].expand(B, S, 1))[..., 0]
            ratio = kth / sv[..., 0].clamp_min(torch.finfo(dtype).tiny)
            upto = torch.arange(S, device=G.device) < s_last.unsqueeze(-1)
            low = (ratio < _share(dtype)) & upto & (k > 1).unsqueeze(-1)
            if bool(low.any()):
                return None
        if tau is not None or not bool((final > 0).any()):
            return PiK, None
        w, V = torch.linalg.eigh(PiK[:, -1])
        N = V * (w > 0.5).to(V.dtype).unsqueeze(-2)
        F = model.F.detach().expand(B, T1 - 1, n, n)
        Hn = sequential._unit_rows(model)
        dt = sequential._dif_tol(dtype)
        reach = sequential.reach_projectors(F, N, Hn, dt)
        prev = torch.cat([(N @ N.mT).unsqueeze(1), reach[:, :-1]], 1)
        seen = torch.linalg.matrix_norm(Hn @ F @ prev)  # [B, T]
        if bool((seen > dt * torch.linalg.matrix_norm(F)).any()):
            return None
    return PiK, reach


def _information_head(model: Model, E: Element, bad, P0, tol, chunk):
    """A large proper prior: the head of the series up to the step that resolves every direction
    of the state (index tau, decided on the structural elements as for a diffuse prior) in
    information form, as (filtered, pred_mean, pred_cov, loglik) over steps [0, tau); None where
    the folded scan is the better form.

    Folded into the first element, a prior of 1e6 I is combined in covariance form: the O(1)
    posterior of the directions the data resolve is a difference of 1e6-scale terms (9-state
    structural model: means 1.2e-8 sd off). Here the data's information about x_0 (eta, J) is
    formed without the prior and the prior enters as its precision P0^-1 (small), so no digits
    of P0 cancel. Information about x_0 is what a near-noise-free observation spoils (1/R next
    to O(1) entries), so this form is taken only where the prior's cancellation
    (|P0| |P0^-1 + J|, digits the covariance form loses) exceeds the information's spread
    (|J| |(P0^-1 + J)^-1|) by 100 and is at least 1e4 (docs/dense.md). A singular P0 (a
    direction known exactly) keeps the folded form.
    """
    B, T, n = E.b.shape
    if T == 0:
        return None
    if bool(_numerically_singular(P0.detach(), tol).any()):
        return None  # a direction known exactly (singular P0) has no prior precision
    eye = _eye(n, E.A).expand(B, n, n)
    Ph, _, tau = _diffuse_head(model, E, eye, tol, chunk)
    if tau is None or tau == 0 or bool(bad[:, :tau].any()):
        return None
    U = _prior_root(P0)
    if U is None:
        return None
    J = Ph.J[:, tau]
    with torch.no_grad():  # the decision only: the posterior below takes P0 through U
        nrm = lambda X: torch.linalg.matrix_norm(X, ord=2)  # noqa: E731
        M = _sym(_scaled_solve(P0, eye)) + J
        Minv = _sym(_scaled_solve(M, eye))
        cancel = nrm(P0) * nrm(M)
        spread = nrm(J) * nrm(Minv)
        if not bool(((cancel >= 1e4) & (cancel > 100.0 * spread)).all()):
            return None
    head = _slice(Ph, slice(0, tau + 1))
    mu, Sig = _post_start(model.m0, U, head.J, head.eta)
    allm = _moments(head.A, head.b, head.C, mu, Sig, None, 0)
    hm = _steps(model, slice(0, tau))
    pm = _mv(hm.F, allm.mean[:, :tau]) + hm.c
    pP = _sym(hm.F @ allm.cov[:, :tau] @ hm.F.transpose(-1, -2) + hm.Q)
    ll = step_loglik(hm, pm, pP, None, 0, tol)
    filt = Moments(allm.mean[:, 1:], allm.cov[:, 1:], torch.zeros_like(allm.cov[:, 1:]), 0)
    return filt, pm, pP, ll, (_slice(head, slice(1, None)), U)


def _head_and_tail(model, E, bad, head, m, P, tol, chunk) -> FilterParts:
    """FilterParts from the sequential head's (filtered, pred_mean, pred_cov, loglik) (None: no
    head) and the folded prefix scan of the rest from its last filtered state (m, P)."""
    B, T, n = E.b.shape
    tau = 0 if head is None else head[0].mean.shape[1]
    means, covs, difs, pms, pPs, lls = [], [], [], [], [], []
    nd = 0
    if head is not None:
        hf, hpm, hpP, hll = head[:4]
        means, covs, difs, pms, pPs, lls = [hf.mean], [hf.cov], [hf.diffuse], [hpm], [hpP], [hll]
        nd = hf.ndiffuse
    prefix = None
    if tau < T:
        if bool(bad[:, tau + 1 :].any()):
            raise ValueError(SINGULAR_MESSAGE)
        prefix = _folded_tail(model, E, tau, m, P, chunk)
        mean, cov = prefix.b, prefix.C
        prev_m = torch.cat([m.unsqueeze(1), mean[:, :-1]], 1)
        prev_P = torch.cat([P.unsqueeze(1), cov[:, :-1]], 1)
        tail = _steps(model, slice(tau, T))
        pm = _mv(tail.F, prev_m) + tail.c
        pP = _sym(tail.F @ prev_P @ tail.F.transpose(-1, -2) + tail.Q)
        means.append(mean)
        covs.append(cov)
        difs.append(torch.zeros_like(cov))
        pms.append(pm)
        pPs.append(pP)
        lls.append(step_loglik(tail, pm, pP, None, 0, tol))
    cat = lambda xs: torch.cat(xs, 1)  # noqa: E731
    filt = Moments(cat(means), cat(covs), cat(difs), nd)
    x0 = ("head", tau) if head is None or len(head) == 4 else ("head", tau, *head[4])
    return FilterParts(filt, cat(pms), cat(pPs), cat(lls), prefix, x0)


def _unresolved_parts(model: Model, E: Element, PiN, tol, chunk, found, PiK, reach) -> FilterParts:
    """A diffuse direction not resolved within the sequential head: prefix information about x_0
    with the prior applied at the end; the head ``found`` on the structural elements (or never;
    :func:`_diffuse_head`), ``PiK`` [B, L+1, n, n] its unresolved projectors and ``reach`` the
    range the never resolved ones reach at each step (:func:`_x0_trusted`)."""
    B, T, n = E.b.shape
    Ph, Js, tau = found
    PiK_head = None if tau is None else PiK[:, :tau]
    seg = None
    if tau is None:  # some direction is never resolved
        mu, Sig = _post_prec(model.m0, model.L0, Ph.J, Ph.eta, PiK, known_prior(model))
        P, nd = Ph, T + 1
        allm, PiK_T = _moments(P.A, P.b, P.C, mu, Sig, PiK, nd), PiK[:, -1]
        start_post = (mu[:, -1], Sig[:, -1])
    else:
        head = _slice(Ph, slice(0, tau + 1))
        PiK = torch.cat([PiK_head, torch.zeros(B, 1, n, n, dtype=E.b.dtype, device=E.b.device)], 1)
        mu, Sig = _post_prec(model.m0, model.L0, head.J, head.eta, PiK, known_prior(model))
        mh = _moments(head.A, head.b, head.C, mu, Sig, PiK, tau)
        m_tau, P_tau = mh.mean[:, tau], mh.cov[:, tau]
        P, allm, nd, PiK_T = head, mh, tau, None
        start_post = None
        if tau < T:
            Pt = _prepend_identity(scan(_slice(E, slice(tau, T)), chunk=chunk))
            mu_t, Sig_t = _post_cov(m_tau, P_tau, Pt.J, Pt.eta)
            mt = _moments(Pt.A, Pt.b, Pt.C, mu_t, Sig_t, None, 0)
            P = _cat(head, _slice(Pt, slice(1, None)))
            allm = Moments(
                *(torch.cat([a, b[:, 1:]], 1) for a, b in zip(mh[:3], mt[:3], strict=True)), tau
            )
            start_post = (mu_t[:, -1], Sig_t[:, -1])
        seg = tau
    filt = Moments(
        allm.mean[:, 1:], allm.cov[:, 1:], allm.diffuse[:, 1:], max(min(nd, T + 1) - 1, 0)
    )
    F, Ft = model.F, model.F.transpose(-1, -2)
    pm = _mv(F, allm.mean[:, :T]) + model.c
    pP = _sym(F @ allm.cov[:, :T] @ Ft + model.Q)
    pD = _sym(F @ allm.diffuse[:, :T] @ Ft)
    ll = step_loglik(model, pm, pP, pD, min(nd, T), tol)
    return FilterParts(filt, pm, pP, ll, P, ("x0", seg, start_post, PiK_T, reach))


def smooth_moments(model: Model, parts: FilterParts, chunk: int = 32) -> Moments:
    """Smoothed moments from the filter's and the suffix information that z_{t+1:T} carry about
    x_t, held as square-root rows ``[Zx | r]`` (:class:`kalmanscan.dense.scan.RowElement`: the
    information of an explosive F observed almost without noise spans 12 decades, whose weak
    directions a matrix J keeps only to eps |J|). After the head: the folded prefix (the filtered
    moments) conditioned on the rows (:func:`kalmanscan.dense.scan.condition`). Head steps (few):
    the filtered finite part and diffuse directions combined with the rows as the reference does
    (x_t = m_t + [L, D] (u, v), :func:`kalmanscan.dense.sequential.combine_rows`); a diffuse
    direction that a singular F forgets before any observation resolves it stays diffuse there
    (:func:`kalmanscan.dense.sequential.unresolved_directions`)."""
    bad = []
    E = step_elements(
        model.z, model.observed, model.F, model.c, model.Q, model.H, model.R, singular=bad,
        rows=True,
    )  # fmt: skip
    B, T, n = E.b.shape
    if bool(bad[0].expand(B, T)[:, 1:].any()):
        raise ValueError(SINGULAR_MESSAGE)
    S = scan(E, reverse=True, chunk=chunk)
    del E
    Zb = torch.cat([S.Z[:, 1:], torch.zeros_like(S.Z[:, :1])], 1)  # z_{t+1:} about x_t
    if parts.x0[0] == "x0":
        return _smooth_from_x0(model, parts, S, Zb)
    from kalmanscan.dense import sequential

    tau = parts.x0[1]
    means, covs, Pu = [], [], None
    if tau > 0 and len(parts.x0) > 2:  # information head: p(x_t | x_0, z) and x_0 | z
        hp, U0 = parts.x0[2:]
        b2, C2, (A2,), _, _ = condition(Zb[:, :tau], hp.b, hp.C, hp.A)
        mu, Sig = _post_start(model.m0, U0, *_row_info(S.Z[:, :1]))
        mh = _moments(A2, b2, C2, mu, Sig, None, 0)
        means.append(mh.mean)
        covs.append(mh.cov)
    elif tau > 0:
        f = parts.filtered
        fh = Moments(f.mean[:, :tau], f.cov[:, :tau], f.diffuse[:, :tau], min(f.ndiffuse, tau))
        keep, Pu = sequential.unresolved_directions(model, f)  # forgotten by a singular F
        Zh = Zb[:, :tau]
        ms, Ps = sequential.combine_rows(
            Zh[..., :n], Zh[..., n:], fh, None if keep is None else keep[:, :tau]
        )
        means.append(ms)
        covs.append(Ps)
    if tau < T:
        mean, cov, _, _, _ = condition(Zb[:, tau:], parts.prefix.b, parts.prefix.C)
        means.append(mean)
        covs.append(cov)
    cov = torch.cat(covs, 1)
    return sequential.smoothed(torch.cat(means, 1), cov, Pu)  # (forgotten ones stay diffuse)


def _unresolved_reach(model: Model, K, PiK, reach=None):
    """Kappa's smoothed coefficient ``K = A_t PiK A_t'`` [B, T, n, n] completed on the range that
    the prior's unresolved directions (``PiK`` [B, n, n] their projector) reach at each step,
    carried as an orthonormal basis (:func:`kalmanscan.dense.sequential.reach_projectors`; the
    filter's ``reach``, None: computed here):
    ``A_t`` aligns the directions as a power of ``F`` does, and a second one whose share falls
    below the rounding (two unobserved states that ``F`` mixes, after about 26 steps) would
    leave ``K``'s range, and the precision along it finite
    (:func:`kalmanscan.dense.sequential.complete_kappa`)."""
    from kalmanscan.dense import sequential

    with torch.no_grad():
        w, V = torch.linalg.eigh(_sym(PiK.detach()))
        N = V * (w > 0.5).to(V.dtype).unsqueeze(-2)
        if bool((sequential.kappa_rank(K) < (w > 0.5).sum(-1).unsqueeze(-1)).any()):
            S = reach
            if S is None:
                Hn = sequential._unit_rows(model)
                F = model.F.detach().expand(K.shape)
                S = sequential.reach_projectors(F, N, Hn, sequential._dif_tol(K.dtype))
        else:  # K holds every direction (the loop over the steps not needed)
            S = _range_projector(
                K.detach(), torch.linalg.matrix_norm(K.detach()), rank_tol(K.dtype)
            )[0]
        done = sequential.complete_kappa(K.detach(), S)
    return K + (done - K.detach())


def filtered_output(model: Model, parts: FilterParts) -> Moments:
    """The filtered :class:`Moments` with kappa's coefficient completed along the directions that
    the prior's never resolved ones (the full-data ``PiK``, ``parts.x0``) reach at each step
    (:func:`kalmanscan.dense.sequential.reach_projectors`,
    :func:`kalmanscan.dense.sequential.filtered_kappa`): ``A_t PiK_t A_t'`` loses the second of
    two directions that ``F`` mixes below its rounding, and the filtered precision along it was
    finite (the limit is 0). ``parts.filtered`` itself where every direction is resolved (no
    work). For the outputs only: the smoother starts from ``parts`` as they are."""
    from kalmanscan.dense import sequential

    filt = parts.filtered
    x0 = parts.x0
    if x0[0] == "head" and len(x0) == 2:  # the reference's head (over the whole series: its own)
        return sequential.filtered_output(model, filt)
    if not (x0[0] == "x0" and x0[3] is not None) or not filt.ndiffuse:
        return filt

    nd = filt.ndiffuse
    B, T, n = filt.mean.shape
    K = filt.diffuse[:, :nd]
    with torch.no_grad():
        w, V = torch.linalg.eigh(_sym(x0[3].detach()))
        N = V * (w > 0.5).to(V.dtype).unsqueeze(-2)
        R = None if x0[4] is None else x0[4][:, :nd]
        if R is None:
            F = model.F.detach().expand(B, T, n, n)[:, :nd]
            Hn = sequential._unit_rows(model)[:, :nd]
            R = sequential.reach_projectors(F, N, Hn, sequential._dif_tol(K.dtype))
    K = sequential.filtered_kappa(K, R)
    return filt._replace(diffuse=torch.cat([K, filt.diffuse[:, nd:]], 1))


def _row_info(Z):
    """(J [.., n, n], eta [.., n]) of the rows Z = [Zx | r] [.., k, n+1]."""
    n = Z.shape[-1] - 1
    Zx, r = Z[..., :n], Z[..., n:]
    return _sym(Zx.transpose(-1, -2) @ Zx), (Zx.transpose(-1, -2) @ r).squeeze(-1)


def _smooth_from_x0(model, parts, S, Zb) -> Moments:
    """The smoother of :func:`_unresolved_parts`: p(x_t | segment start, z_{1:T}) from the prefix
    conditioned on the suffix rows, then the segment start's posterior given all data."""
    B, T, n = S.b.shape
    A, b, C = parts.prefix.A[:, 1:], parts.prefix.b[:, 1:], parts.prefix.C[:, 1:]
    b2, C2, (A2,), _, _ = condition(Zb, b, C, A)
    _, tau, start_post, PiK_T, reach = parts.x0
    if tau is None:  # one segment: its start's posterior given all data was computed by the filter
        mu, Sig = (x.unsqueeze(1) for x in start_post)
        if PiK_T is not None:
            mm = _moments(A2, b2, C2, mu, Sig, PiK_T.unsqueeze(1), T)
            return mm._replace(diffuse=_unresolved_reach(model, mm.diffuse, PiK_T, reach))
        return _moments(A2, b2, C2, mu, Sig, None, 0)
    # head: x_0 given all data (resolved: S_1.J is invertible on the diffuse part)
    mu_h, Sig_h = _post_prec(model.m0, model.L0, *_row_info(S.Z[:, :1]), None, known_prior(model))
    parts_mu, parts_Sig = [mu_h.expand(B, tau, n)], [Sig_h.expand(B, tau, n, n)]
    if tau < T:
        mu_t, Sig_t = start_post
        parts_mu.append(mu_t.unsqueeze(1).expand(B, T - tau, n))
        parts_Sig.append(Sig_t.unsqueeze(1).expand(B, T - tau, n, n))
    return _moments(A2, b2, C2, torch.cat(parts_mu, 1), torch.cat(parts_Sig, 1), None, 0)
