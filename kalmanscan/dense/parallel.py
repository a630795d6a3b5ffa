"""Parallel-in-time dense filter and smoother from prefix/suffix scans of filtering elements.

The prior on x_0 is applied after the scan ("prior at the end"): the prefix element over 1..t gives
p(x_t | x_0, z_{1:t}) and the information (eta_t, J_t) that z_{1:t} carry about x_0, so the filtered
moments are those of x_t = A_t x_0 + b_t + N(0, C_t) with x_0 drawn from its posterior. A diffuse
prior (zero precision in some directions) is exact: the directions of x_0 not yet resolved by the
data
(the null space of J_t inside the diffuse subspace) stay diffuse. Derivation: docs/dense.md.

All arrays are [B, T, ...] (see :mod:`kalmanscan.dense.scan` for the element notation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kalmanscan.dense._args import LOG_2PI, Model
from kalmanscan.dense.scan import Element, _sym, mask_observation, scan, step_elements


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


def _counted_head(model: Model, PiN, max_steps: int):
    """Diffuse bookkeeping of the head by counting, as the sequential reference does.

    The observed rows mapped to x_0 (``h' F_t ... F_1``) are taken one at a time against a factor
    ``D`` of the still-diffuse directions of x_0 (``D D'`` = the projector ``PiN`` at the start):
    a row with ``|D' h| > DIFFUSE_TOL |h| |D|`` resolves one direction, ``D <- D (I - u u'/|u|^2)``
    and ``D`` is cut back to its k largest singular values, k the directions still diffuse
    (counted, not thresholded: a direction 1e-8 the scale of the others, as a contracting F makes
    it, stays diffuse until a row resolves it). Which directions are diffuse does not depend on Q
    or R (:func:`_structural_elements`), so the rows need no whitening.

    Returns ``(tau, PiK [B, tau, n, n], ranks [B, tau])``: tau the first prefix index at which
    every series is resolved, PiK the projectors on the unresolved directions at prefix indices
    0..tau-1, ranks the diffuse entries of each step; ``None`` when some direction is still
    diffuse after ``max_steps`` steps (the caller then decides on the structural information).
    """
    with torch.no_grad():
        B, T, d = model.z.shape
        n = model.F.shape[-1]
        dtype, device = model.z.dtype, model.z.device
        dif_tol = 1e-11 if dtype == torch.float64 else 1e-4
        w, U = torch.linalg.eigh(_sym(PiN))
        D = U * (w > 0.5).to(dtype).unsqueeze(-2)
        k = (w > 0.5).sum(-1)
        Phi = _eye(n, D).expand(B, n, n)
        rows_all = model.H * model.observed.to(dtype).unsqueeze(-1)
        PiKs, ranks = [_sym(D @ D.transpose(-1, -2))], []
        for t in range(min(T, max_steps)):
            Phi = model.F[:, t] @ Phi
            rows = rows_all[:, t] @ Phi  # [B, d, n]
            r = torch.zeros(B, dtype=torch.int64, device=device)
            for i in range(d):
                h = rows[:, i]
                u = _mv(D.transpose(-1, -2), h)
                nu2 = u.square().sum(-1)
                scale = h.square().sum(-1) * D.square().sum((-1, -2))
                diff = (k > 0) & (nu2 > dif_tol**2 * scale)
                if not bool(diff.any()):
                    continue
                fi = torch.where(diff, nu2, torch.ones_like(nu2))
                Dn = D - (_mv(D, u) / fi.unsqueeze(-1)).unsqueeze(-1) * u.unsqueeze(-2)
                k = k - diff.to(torch.int64)
                r = r + diff.to(torch.int64)
                Us, S, _ = torch.linalg.svd(Dn)
                top = torch.arange(n, device=device) < k.unsqueeze(-1)
                Dn = Us * top.to(dtype).unsqueeze(-2)  # orthonormal basis, k columns
                D = torch.where(diff[:, None, None], Dn, D)
            ranks.append(r)
            if not bool((k > 0).any()):
                return t + 1, torch.stack(PiKs, 1), torch.stack(ranks, 1)
            PiKs.append(_sym(D @ D.transpose(-1, -2)))
        return None


def _diffuse_head(E: Element, Es: Element, PiN, tol, chunk):
    """Prefix over a head of the series long enough to resolve every diffuse direction.

    Returns (prefix [B, L+1] with the identity at 0, structural prefix information [B, L+1],
    tau): tau is the first index at which all series are resolved (None if the whole series never
    resolves them), decided on the structural elements ``Es`` (:func:`_structural_elements`).
    The head grows 8, 32, ...; inside it, tau is found by doubling then bisection (information
    only grows).
    """
    T = E.A.shape[1]
    L = min(8, T)
    while True:
        Ph = _prepend_identity(scan(Element(*(x[:, :L] for x in E)), chunk=chunk))
        Js = _prepend_identity(scan(Element(*(x[:, :L] for x in Es)), chunk=chunk)).J
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


def _post_prec(m0, L0, J, eta, PiK=None):
    """Same with prior precision L0 (0 where diffuse); PiK projects on the unresolved ones."""
    n = J.shape[-1]
    m0, L0 = m0.unsqueeze(1), L0.unsqueeze(1)
    M = L0 + J
    h = _mv(L0, m0) + eta
    eye = _eye(n, J).expand(J.shape)
    if PiK is None:
        sol = torch.linalg.solve(M, torch.cat([eye, h.unsqueeze(-1)], -1))
        return sol[..., n], _sym(sol[..., :n])
    sol = torch.linalg.solve(M + PiK, torch.cat([eye, (h + _mv(PiK, m0)).unsqueeze(-1)], -1))
    return sol[..., n], _sym(sol[..., :n] - PiK)


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


def step_loglik(model: Model, pred_mean, pred_cov, pred_dif, nd: int, tol, ranks=None):
    """log N of the part of each z_t orthogonal to the still-diffuse directions ([B, T]).

    ranks [B, nd]: the diffuse entries of each head step where counted (:func:`_counted_head`):
    the diffuse directions of z_t are then the top ``ranks`` eigenvectors of H P_inf H', not those
    above a threshold."""
    H, R, z = mask_observation(model.z, model.observed, model.H, model.R)
    v = z - _mv(H, pred_mean)
    S = _sym(H @ pred_cov @ H.transpose(-1, -2) + R)
    nobs = model.observed.sum(-1).to(v.dtype)
    if nd > 0:  # rotate the diffuse steps so the diffuse directions of z_t drop out
        Hd = H[:, :nd]
        G = Hd @ pred_dif[:, :nd] @ Hd.transpose(-1, -2)
        scale = torch.linalg.matrix_norm(Hd).square() * torch.linalg.matrix_norm(pred_dif[:, :nd])
        if ranks is None:
            Pd, r = _range_projector(G, scale, tol)
            with torch.no_grad():
                w, U = torch.linalg.eigh(Pd)  # eigenvalue 1: diffuse direction, 0: kept
                keep = (w < 0.5).to(v.dtype)
        else:
            r = ranks.to(v.dtype)
            with torch.no_grad():
                w, U = torch.linalg.eigh(_sym(G))  # ascending: the top r are diffuse
                dd = G.shape[-1]
                keep = (torch.arange(dd, device=G.device) < dd - ranks.unsqueeze(-1)).to(v.dtype)
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


def _slice(e: Element, sl) -> Element:
    return Element(*(x[:, sl] for x in e))


def _cat(*es: Element) -> Element:
    return Element(*(torch.cat(xs, 1) for xs in zip(*es, strict=True)))


def filter_parts(model: Model, chunk: int = 32) -> FilterParts:
    """Filtered moments, predictions and step log-likelihoods.

    Proper prior: one prefix scan, prior applied after it. Diffuse prior: a head of the series is
    scanned until every diffuse direction is resolved (index tau), the head's moments come from the
    diffuse posterior of x_0, and the rest is scanned from the proper filtered state at tau (so no
    long-horizon, ill-conditioned information about x_0 is ever inverted). A direction that is
    never resolved keeps the diffuse bookkeeping over the whole series.
    """
    tol = rank_tol(model.z.dtype)
    E = step_elements(model.z, model.observed, model.F, model.c, model.Q, model.H, model.R)
    B, T, n = E.b.shape
    PiN = None
    if model.P0 is None:
        PiN = _eye(n, E.A) - _range_projector(model.L0, torch.linalg.matrix_norm(model.L0), tol)[0]
        if not bool((PiN.diagonal(dim1=-2, dim2=-1).sum(-1) > 0.5).any()):
            PiN = None
    seg = None
    if PiN is None:  # proper prior: one segment
        P = _prepend_identity(scan(E, chunk=chunk))
        if model.P0 is not None:
            mu, Sig = _post_cov(model.m0, model.P0, P.J, P.eta)
        else:
            mu, Sig = _post_prec(model.m0, model.L0, P.J, P.eta)
        allm, nd, PiK_T = _moments(P.A, P.b, P.C, mu, Sig, None, 0), 0, None
        start_post = (mu[:, -1], Sig[:, -1])
    else:
        counted = _counted_head(model, PiN, max_steps=16 * n + 64)
        ranks = None
        if counted is not None:
            tau, PiK_head, ranks = counted
            Ph = _prepend_identity(scan(_slice(E, slice(0, tau)), chunk=chunk))
        else:
            Es = _structural_elements(model)
            Ph, Js, tau = _diffuse_head(E, Es, PiN, tol, chunk)
            del Es
            PiK_head = None if tau is None else _null_projector(Js[:, :tau], PiN.unsqueeze(1), tol)
        if tau is None:  # some direction is never resolved
            PiK = _null_projector(Js, PiN.unsqueeze(1), tol)
            mu, Sig = _post_prec(model.m0, model.L0, Ph.J, Ph.eta, PiK)
            P, nd = Ph, T + 1
            allm, PiK_T = _moments(P.A, P.b, P.C, mu, Sig, PiK, nd), PiK[:, -1]
            start_post = (mu[:, -1], Sig[:, -1])
        else:
            head = _slice(Ph, slice(0, tau + 1))
            PiK = torch.cat(
                [
                    PiK_head,
                    torch.zeros(B, 1, n, n, dtype=E.b.dtype, device=E.b.device),
                ],
                1,
            )
            mu, Sig = _post_prec(model.m0, model.L0, head.J, head.eta, PiK)
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
    del E
    filt = Moments(
        allm.mean[:, 1:], allm.cov[:, 1:], allm.diffuse[:, 1:], max(min(nd, T + 1) - 1, 0)
    )
    F, Ft = model.F, model.F.transpose(-1, -2)
    pm = _mv(F, allm.mean[:, :T]) + model.c
    pP = _sym(F @ allm.cov[:, :T] @ Ft + model.Q)
    pD = _sym(F @ allm.diffuse[:, :T] @ Ft)
    ll = step_loglik(model, pm, pP, pD, min(nd, T), tol, ranks if PiN is not None else None)
    return FilterParts(filt, pm, pP, ll, P, (seg, start_post, PiK_T))


def smooth_moments(model: Model, parts: FilterParts, chunk: int = 32) -> Moments:
    """Smoothed moments: p(x_t | segment start, z_{1:T}) from the prefix and the suffix
    information, then the segment start's posterior given all data."""
    E = step_elements(model.z, model.observed, model.F, model.c, model.Q, model.H, model.R)
    S = scan(E, reverse=True, chunk=chunk)
    del E
    B, T, n = S.b.shape
    zm = torch.zeros(B, 1, n, n, dtype=S.b.dtype, device=S.b.device)
    Jb = torch.cat([S.J[:, 1:], zm], 1)
    etab = torch.cat([S.eta[:, 1:], torch.zeros(B, 1, n, dtype=S.b.dtype, device=S.b.device)], 1)
    A, b, C = parts.prefix.A[:, 1:], parts.prefix.b[:, 1:], parts.prefix.C[:, 1:]
    X = _eye(n, A) + C @ Jb
    sol = torch.linalg.solve(X, torch.cat([A, C, (b + _mv(C, etab)).unsqueeze(-1)], -1))
    A2, C2, b2 = sol[..., :n], _sym(sol[..., n : 2 * n]), sol[..., 2 * n]
    tau, start_post, PiK_T = parts.x0
    if tau is None:  # one segment: its start's posterior given all data was computed by the filter
        mu, Sig = (x.unsqueeze(1) for x in start_post)
        if PiK_T is not None:
            return _moments(A2, b2, C2, mu, Sig, PiK_T.unsqueeze(1), T)
        return _moments(A2, b2, C2, mu, Sig, None, 0)
    # head: x_0 given all data (resolved: S_1.J is invertible on the diffuse part)
    mu_h, Sig_h = _post_prec(model.m0, model.L0, S.J[:, :1], S.eta[:, :1])
    parts_mu, parts_Sig = [mu_h.expand(B, tau, n)], [Sig_h.expand(B, tau, n, n)]
    if tau < T:
        mu_t, Sig_t = start_post
        parts_mu.append(mu_t.unsqueeze(1).expand(B, T - tau, n))
        parts_Sig.append(Sig_t.unsqueeze(1).expand(B, T - tau, n, n))
    return _moments(A2, b2, C2, torch.cat(parts_mu, 1), torch.cat(parts_Sig, 1), None, 0)
