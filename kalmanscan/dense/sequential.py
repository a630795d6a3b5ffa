"""Step-by-step reference for the dense filter and smoother (vectorized over series only).

Filter: the covariance-form Kalman filter. While the prior is diffuse it runs the exact initial
Kalman filter of Durbin & Koopman (2012, sec. 5.2 and 6.4) on the whitened observation, one
scalar at a time, carrying the finite part ``P`` and the diffuse part ``Pinf`` of the covariance;
afterwards the
plain multivariate update. Smoother: the backward information filter (the likelihood of z_{t+1:T}
given x_t) combined with the filtered belief. No scans, no chunks. Convention of the log-likelihood
for diffuse steps: docs/dense.md.
"""

from __future__ import annotations

import torch

from kalmanscan.dense._args import LOG_2PI, Model
from kalmanscan.dense.parallel import Moments, _mv, _range_projector, _sym, precision_of, rank_tol
from kalmanscan.dense.scan import mask_observation


def _pdet_log(G, scale, tol):
    w = torch.linalg.eigvalsh(_sym(G))
    keep = w > tol * scale.unsqueeze(-1)
    return torch.where(
        keep, torch.log(torch.where(keep, w, torch.ones_like(w))), torch.zeros_like(w)
    ).sum(-1), keep.sum(-1)


def filter_reference(model: Model):
    """Returns (Moments filtered, pred_mean, pred_cov, loglik_steps), all [B, T, ...]."""
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    dtype, device = model.z.dtype, model.z.device
    tol = rank_tol(dtype)
    # resolving a diffuse direction leaves rounding of relative size ~eps * cond in Pinf; the
    # reference treats anything below sqrt(eps) of the step's diffuse scale as resolved
    dtol = torch.finfo(dtype).eps ** 0.5
    eye = torch.eye(n, dtype=dtype, device=device)
    m = model.m0.clone()
    if model.P0 is not None:
        P = model.P0.clone()
        Pinf = torch.zeros(B, n, n, dtype=dtype, device=device)
    else:
        Pr, _ = _range_projector(model.L0, torch.linalg.matrix_norm(model.L0), tol)
        Pinf = eye - Pr
        P = _sym(torch.linalg.inv(model.L0 + Pinf) - Pinf)
    H_all, R_all, z_all = mask_observation(model.z, model.observed, model.H, model.R)
    means, covs, difs, pms, pPs, lls = [], [], [], [], [], []
    nd = 0
    diffuse_now = True
    for t in range(T):
        F = model.F[:, t]
        Q, c = model.Q[:, t], model.c[:, t]
        H, R, z = H_all[:, t], R_all[:, t], z_all[:, t]
        obs = model.observed[:, t]
        m = _mv(F, m) + c
        P = _sym(F @ P @ F.transpose(-1, -2) + Q)
        Pinf = _sym(F @ Pinf @ F.transpose(-1, -2))
        pms.append(m)
        pPs.append(P)
        if diffuse_now:  # once Pinf is exactly 0 it stays 0: stop asking (a host sync on GPUs)
            diffuse_now = bool((Pinf != 0).any())
        if not diffuse_now:
            v = z - _mv(H, m)
            S = _sym(H @ P @ H.transpose(-1, -2) + R)
            PHt = P @ H.transpose(-1, -2)
            K = torch.linalg.solve(S, PHt.transpose(-1, -2)).transpose(-1, -2)
            m = m + _mv(K, v)
            IKH = eye - K @ H
            P = _sym(IKH @ P @ IKH.transpose(-1, -2) + K @ R @ K.transpose(-1, -2))
            L = torch.linalg.cholesky(S)
            w = torch.linalg.solve_triangular(L, v.unsqueeze(-1), upper=False).squeeze(-1)
            ll = -0.5 * (
                obs.sum(-1).to(dtype) * LOG_2PI
                + 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
                + w.square().sum(-1)
            )
        else:
            nd = t + 1
            # Convention: + 1/2 log pdet(2 pi F_inf) with F_inf = H Pinf H' in observation space.
            Finf = H @ Pinf @ H.transpose(-1, -2)
            lp, r = _pdet_log(
                Finf, torch.linalg.matrix_norm(H).square() * torch.linalg.matrix_norm(Pinf), tol
            )
            ll = 0.5 * (lp + r.to(dtype) * LOG_2PI)
            L = torch.linalg.cholesky(R)
            Hw = torch.linalg.solve_triangular(L, H, upper=False)
            zw = torch.linalg.solve_triangular(L, z.unsqueeze(-1), upper=False).squeeze(-1)
            ll = ll - torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
            scale0 = torch.linalg.matrix_norm(Pinf)
            for i in range(d):
                h, y, o = Hw[:, i], zw[:, i], obs[:, i]
                Minf, Ms = _mv(Pinf, h), _mv(P, h)
                finf = (h * Minf).sum(-1)
                fs = (h * Ms).sum(-1) + 1.0
                v = y - (h * m).sum(-1)
                diff = o & (finf > dtol * h.square().sum(-1) * scale0)
                prop = o & ~diff
                fi = torch.where(diff, finf, torch.ones_like(finf))
                ki = Minf / fi.unsqueeze(-1)
                m_d = m + ki * v.unsqueeze(-1)
                Pinf_d = Pinf - ki.unsqueeze(-1) * Minf.unsqueeze(-2)
                P_d = (
                    P
                    - (ki.unsqueeze(-1) * Ms.unsqueeze(-2) + Ms.unsqueeze(-1) * ki.unsqueeze(-2))
                    + (ki.unsqueeze(-1) * ki.unsqueeze(-2)) * fs[:, None, None]
                )
                ll_d = -0.5 * (LOG_2PI + torch.log(fi))
                ks = Ms / fs.unsqueeze(-1)
                m_p = m + ks * v.unsqueeze(-1)
                P_p = P - ks.unsqueeze(-1) * Ms.unsqueeze(-2)
                ll_p = -0.5 * (LOG_2PI + torch.log(fs) + v.square() / fs)
                m = torch.where(diff[:, None], m_d, torch.where(prop[:, None], m_p, m))
                P = _sym(
                    torch.where(diff[:, None, None], P_d, torch.where(prop[:, None, None], P_p, P))
                )
                Pinf = _sym(torch.where(diff[:, None, None], Pinf_d, Pinf))
                ll = (
                    ll
                    + torch.where(diff, ll_d, torch.zeros_like(ll_d))
                    + torch.where(prop, ll_p, torch.zeros_like(ll_p))
                )
            w, U = torch.linalg.eigh(Pinf)  # drop the rounding left in resolved directions
            w = torch.where(w > dtol * scale0.unsqueeze(-1), w, torch.zeros_like(w))
            Pinf = (U * w.unsqueeze(-2)) @ U.transpose(-1, -2)
        means.append(m)
        covs.append(P)
        difs.append(Pinf)
        lls.append(ll)
    stack = lambda xs: torch.stack(xs, 1)  # noqa: E731
    filt = Moments(stack(means), stack(covs), stack(difs), nd)
    return filt, stack(pms), stack(pPs), stack(lls)


def smooth_reference(model: Model, filt: Moments) -> Moments:
    """Two-filter smoother: backward information filter combined with the filtered beliefs."""
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    dtype, device = model.z.dtype, model.z.device
    eye = torch.eye(n, dtype=dtype, device=device)
    H_all, R_all, z_all = mask_observation(model.z, model.observed, model.H, model.R)
    Jb = torch.zeros(B, n, n, dtype=dtype, device=device)
    etab = torch.zeros(B, n, dtype=dtype, device=device)
    Js, etas = [Jb], [etab]
    for t in range(T - 1, 0, -1):
        H, R, z = H_all[:, t], R_all[:, t], z_all[:, t]
        RinvH = torch.linalg.solve(R, H)
        Jt = Jb + H.transpose(-1, -2) @ RinvH
        et = etab + _mv(RinvH.transpose(-1, -2), z)
        F, Q, c = model.F[:, t], model.Q[:, t], model.c[:, t]
        Y = eye + Jt @ Q
        sol = torch.linalg.solve(Y, torch.cat([Jt @ F, (et - _mv(Jt, c)).unsqueeze(-1)], -1))
        Jb = _sym(F.transpose(-1, -2) @ sol[..., :n])
        etab = _mv(F.transpose(-1, -2), sol[..., n])
        Js.append(Jb)
        etas.append(etab)
    Jb = torch.stack(Js[::-1], 1)
    etab = torch.stack(etas[::-1], 1)
    m, P = filt.mean, filt.cov
    X = eye + P @ Jb
    sol = torch.linalg.solve(X, torch.cat([P, (P @ (etab - _mv(Jb, m)).unsqueeze(-1))], -1))
    ms, Ps = m + sol[..., n], _sym(sol[..., :n])
    nd = filt.ndiffuse
    if nd > 0:
        Lam = precision_of(Moments(m[:, :nd], P[:, :nd], filt.diffuse[:, :nd], nd), rank_tol(dtype))
        Ps_d = _sym(torch.linalg.inv_ex(Lam + Jb[:, :nd])[0])  # singular (inf) if never resolved
        ms_d = _mv(Ps_d, _mv(Lam, m[:, :nd]) + etab[:, :nd])
        ms = torch.cat([ms_d, ms[:, nd:]], 1)
        Ps = torch.cat([Ps_d, Ps[:, nd:]], 1)
    return Moments(ms, Ps, torch.zeros_like(Ps), 0)
