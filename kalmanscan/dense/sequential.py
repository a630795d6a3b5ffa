"""Step-by-step reference for the dense filter and smoother (vectorized over series only).

Filter: the covariance-form Kalman filter. While the prior is diffuse (and at every step where some
R_t is singular) it runs the exact initial Kalman filter of Durbin & Koopman (2012, sec. 5.2 and
6.4) on the observation decorrelated by R = L Dg L' (Dg = 0 allowed), one scalar at a time, carrying
the finite part ``P`` and a factor ``D`` of the diffuse part ``Pinf = D D'`` of the covariance;
afterwards the plain multivariate update. Smoother: the backward information filter (the likelihood
of z_{t+1:T} given x_t) in square-root form, combined with the filtered belief by one more QR. No
scans, no chunks. Convention of the log-likelihood for diffuse steps: docs/dense.md.


:func:`filter_moments` and :func:`smooth_moments` are the ``"sequential"`` backend of
``kalmanscan.dense.filter`` / ``smooth`` (public as ``kd.filter_sequential`` /
``kd.smooth_sequential``); ``filter_reference`` and ``smooth_reference`` are their former names,
kept as aliases.
"""

from __future__ import annotations

import torch

from kalmanscan.dense._args import LOG_2PI, Model
from kalmanscan.dense.graded import (
    _truncated,
    _unseen,
    column_graded,
    faded_factor,
    graded_factor,
    predict_graded,
    resolve_graded,
)
from kalmanscan.dense.parallel import (
    Moments,
    _mv,
    _range_projector,
    _sym,
    prior_start,
    rank_tol,
)
from kalmanscan.dense.scan import mask_observation


def _dif_tol(dtype) -> float:
    """The relative size below which a diffuse direction's image counts as gone (the filter's
    :func:`factor_basis` and the smoother's :func:`unresolved_directions`), and a correlation of
    two diffuse coordinates as 0 (:func:`kalmanscan.dense.parallel.cov_with_inf`)."""
    return 1e-11 if dtype == torch.float64 else 1e-4


def filter_moments(model: Model, stop_when_proper: bool = False):
    """Returns (Moments filtered, pred_mean, pred_cov, loglik_steps), all [B, T, ...].

    With ``stop_when_proper`` the loop ends after the step at which every series' diffuse
    directions are resolved (the scan's diffuse head,
    :func:`kalmanscan.dense.parallel.filter_parts`), so the returned arrays may be shorter
    than T.

    The diffuse part is carried as a factor, ``P_inf = D D'`` (``D = F D`` in the prediction), so
    that the decisions are made on its square root: an entry with whitened row ``h`` is diffuse
    when ``|D' h| > DIFFUSE_TOL |h| |D|_F``, and resolving it projects the direction out of the
    factor, ``D <- D (I - u u' / |u|^2)``, ``u = D' h``; the rounding this leaves (eps relative to
    the resolved direction's scale) is removed by keeping D's k largest singular values, k the
    directions still diffuse (counted, not thresholded). A diffuse direction 1e-6 the scale of
    another (a contracting F applied to it for a few steps) is thereby still diffuse; a threshold
    on ``P_inf`` itself cannot tell it from the rounding of a resolved one. Once as many entries
    as there were diffuse directions have been diffuse, ``D`` is 0 exactly. After a prediction
    whose factor has columns of sizes far apart (a tiny nonzero entry of ``F``: still diffuse),
    at the rounding of their own product (what a singular ``F`` forgets) or dependent, ``D``
    becomes an orthonormal basis of its range (:func:`factor_basis`). Where ``D``'s singular
    values fall more than ``FADED`` apart (:func:`faded_factor`: a power of ``F`` whose second
    direction's share falls below the rounding over a gap) the series' factor is carried as
    ``D = Qa Ra`` as well (QR, each row of ``Ra`` to its own scale), and its diffuse steps run
    on it; kappa's coefficient returned is completed on ``Qa``'s range where ``D D'`` lost one
    of its directions (:func:`complete_kappa`).

    A series whose predicted covariance passes the dtype's range (an entry inf or NaN: an
    explosive F over a gap) stops there (``lost``: the covariance form cannot hold that
    prediction): its prediction at that step is returned as computed, every later moment and its
    log-likelihood terms from that step on are NaN (``kalmanscan.dense.api`` warns, naming it).
    """
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    dtype, device = model.z.dtype, model.z.device
    dif_tol = _dif_tol(dtype)
    eye = torch.eye(n, dtype=dtype, device=device)
    m = model.m0.clone()
    if model.P0 is not None:
        P = model.P0.clone()
        D = torch.zeros(B, n, n, dtype=dtype, device=device)
    else:  # finite part and an orthonormal basis of the diffuse directions (every backend's rule)
        P, D = prior_start(model)
        P = P.clone()
    k = (D.detach() != 0).any(-2).sum(-1)  # diffuse directions: D's nonzero columns
    # D = Qa Ra carried beside it (:func:`graded_factor`), and the series whose D has faded
    # (:func:`faded_factor`): their diffuse steps run on that factor
    Qa, Ra = graded_factor(D.detach(), k)
    fad = torch.zeros(B, dtype=torch.bool, device=device)
    rawok = torch.ones(B, dtype=torch.bool, device=device)  # a faded D that still holds k
    H_all, R_all, z_all = mask_observation(model.z, model.observed, model.H, model.R)
    # entries decorrelated by R = L Dg L' (L unit lower triangular, Dg >= 0: R singular allowed)
    Lu, Dg = _ldl(R_all)
    Hy_all = torch.linalg.solve_triangular(Lu, H_all, upper=False, unitriangular=True)
    zy_all = torch.linalg.solve_triangular(
        Lu, z_all.unsqueeze(-1), upper=False, unitriangular=True
    ).squeeze(-1)
    singular = bool((Dg <= 0).any())  # then every step takes the scalar updates
    means, covs, difs, pms, pPs, lls = [], [], [], [], [], []
    nd = 0
    diffuse_now = bool((k > 0).any())
    lost = torch.zeros(B, dtype=torch.bool, device=device)  # series past the range (above)
    nan = torch.full((), float("nan"), dtype=dtype, device=device)
    for t in range(T):
        F = model.F[:, t]
        Q, c = model.Q[:, t], model.c[:, t]
        H, R, z = H_all[:, t], R_all[:, t], z_all[:, t]
        obs = model.observed[:, t]
        m = _mv(F, m) + c
        P = _sym(F @ P @ F.transpose(-1, -2) + Q)
        if diffuse_now:
            D_prev, k_prev = D, k
            D, k = factor_basis(F, D_prev, F @ D_prev, k_prev, dif_tol)
            with torch.no_grad():  # (a series past the range: 0, lost below)
                Dn = torch.where(torch.isfinite(D).flatten(1).all(1)[:, None, None], D, 0.0)
                fad = fad | faded_factor(Dn.detach(), k)
                Qr, Rr = graded_factor(Dn.detach(), k)
                if bool(fad.any()):  # (the graded prediction costs a factor_basis: faded only)
                    Qc, Rc, kc = predict_graded(F.detach(), Qa, Ra, k_prev, dif_tol)
                    on = fad[:, None, None]
                    Qr, Rr = torch.where(on, Qc, Qr), torch.where(on, Rc, Rr)
                    k = torch.where(fad, kc, k)
                Qa, Ra = Qr, Rr
            # a faded D that lost a direction: the graded factor's product in its place
            D = torch.where((fad & ~rawok)[:, None, None], (Qa @ Ra).to(D.dtype), D)
        was_lost = lost
        lost = lost | ~torch.isfinite(P).flatten(1).all(1)
        pms.append(torch.where(was_lost[:, None], nan, m))
        pPs.append(torch.where(was_lost[:, None, None], nan, P))
        if bool(lost.any()):  # placeholders the steps get through: their outputs are NaN
            m = torch.where(lost[:, None], torch.zeros_like(m), m)
            P = torch.where(lost[:, None, None], eye, P)
            D = torch.where(lost[:, None, None], torch.zeros_like(D), D)
            k = torch.where(lost, torch.zeros_like(k), k)
            Qa = torch.where(lost[:, None, None], torch.zeros_like(Qa), Qa)
            Ra = torch.where(lost[:, None, None], torch.zeros_like(Ra), Ra)
            fad = fad & ~lost
        if diffuse_now:  # once every series' D is 0 it stays 0: stop asking (a GPU host sync)
            diffuse_now = bool((k > 0).any())
        if not diffuse_now and not singular:
            D = torch.zeros_like(P)
            m_prior, P_prior = m, P
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
            near = _near_entries(P_prior, Hy_all[:, t], Dg[:, t], obs)
            if bool(near.any()):
                m2, P2, ll2 = _factor_update(
                    m_prior, P_prior, Hy_all[:, t], zy_all[:, t], Dg[:, t], obs
                )
                m = torch.where(near[:, None], m2, m)
                P = torch.where(near[:, None, None], P2, P)
                ll = torch.where(near, ll2, ll)
        else:
            if diffuse_now:
                nd = t + 1
            was_diffuse = diffuse_now
            any_fad = was_diffuse and bool(fad.any())
            if any_fad:  # faded: decisions and the diffuse terms on the basis Qa; the gains
                # on D itself while it still holds every direction in its coordinates' scales
                # (the smoother's reading, _scaled_eigh), else on the graded factor Dg
                with torch.no_grad():
                    Dn = torch.where(torch.isfinite(D).flatten(1).all(1)[:, None, None], D, 0.0)
                    held = _scaled_eigh(_sym(Dn @ Dn.mT))[3].sum(-1) >= k
                    rawok = rawok & (held | ~fad)
                Dgr = column_graded(Qa, Ra)
                D_raw = D
                D = torch.where(fad[:, None, None], Qa.to(D.dtype), D)
            P_pred, D_pred, k_pred = P, D, k
            # Convention: + 1/2 log pdet(2 pi F_inf), F_inf = H P_inf H' in observation space,
            # over the r largest eigenvalues, r = the step's diffuse entries (rank(H D) exactly)
            G = H @ D
            ev = torch.linalg.eigvalsh(_sym(G @ G.transpose(-1, -2))).flip(-1)  # descending
            Hw, zw, dg = Hy_all[:, t], zy_all[:, t], Dg[:, t]
            ll = torch.zeros(B, dtype=dtype, device=device)
            r = torch.zeros(B, dtype=torch.int64, device=device)
            for i in range(d):
                h, y, o = Hw[:, i], zw[:, i], obs[:, i]
                u = _mv(D.transpose(-1, -2), h)
                nu2 = u.square().sum(-1)
                scale = h.square().sum(-1) * D.square().sum((-1, -2))
                diff = o & (k > 0) & (nu2 > dif_tol**2 * scale)
                Minf, Ms = _mv(D, u), _mv(P, h)
                fs = (h * Ms).sum(-1) + dg[:, i]
                # an entry with f = 0 (noise-free and already determined) carries no information:
                # f at the rounding of h' P h, whose entrywise bound |h|' |P| |h| (not
                # |h|^2 tr(P): the finite part along a diffuse direction that an explosive F
                # grows, 1e15 after 100 steps, made every later entry on another state skipped)
                ha = h.abs()
                informative = fs > _SKIP_TOL * (ha * _mv(P.abs(), ha)).sum(-1)
                prop = o & ~diff & informative
                fs = torch.where(prop | diff, fs, torch.ones_like(fs))
                v = y - (h * m).sum(-1)
                fi = torch.where(diff, nu2, torch.ones_like(nu2))
                ki = Minf / fi.unsqueeze(-1)
                if any_fad:  # the gain P_inf h / h' P_inf h of the faded series: D's or Dg's
                    ug = _mv(Dgr.transpose(-1, -2), h)
                    fg = ug.square().sum(-1)
                    kg = _mv(Dgr, ug) / torch.where(fg > 0, fg, 1.0).unsqueeze(-1)
                    ur = _mv(D_raw.transpose(-1, -2), h)
                    fr = ur.square().sum(-1)
                    kr = _mv(D_raw, ur) / torch.where(fr > 0, fr, 1.0).unsqueeze(-1)
                    use_r = fad & rawok & (fr > 0)
                    use_g = fad & ~use_r & (fg > 0)
                    ki = torch.where(use_r[:, None], kr, torch.where(use_g[:, None], kg, ki))
                    on = (diff & fad)[:, None, None]
                    Dgr = torch.where(on, resolve_graded(Dgr, ug), Dgr)
                    Dr = D_raw - kr.unsqueeze(-1) * ur.unsqueeze(-2)
                    D_raw = torch.where(on & (rawok & (fr > 0))[:, None, None], Dr, D_raw)
                m_d = m + ki * v.unsqueeze(-1)
                P_d = (
                    P
                    - (ki.unsqueeze(-1) * Ms.unsqueeze(-2) + Ms.unsqueeze(-1) * ki.unsqueeze(-2))
                    + (ki.unsqueeze(-1) * ki.unsqueeze(-2)) * fs[:, None, None]
                )
                D_d = D - (_mv(D, u) / fi.unsqueeze(-1)).unsqueeze(-1) * u.unsqueeze(-2)
                ll_d = -0.5 * (LOG_2PI + torch.log(fi))
                ks = Ms / fs.unsqueeze(-1)
                m_p = m + ks * v.unsqueeze(-1)
                P_p = P - ks.unsqueeze(-1) * Ms.unsqueeze(-2)
                ll_p = -0.5 * (LOG_2PI + torch.log(fs) + v.square() / fs)
                m = torch.where(diff[:, None], m_d, torch.where(prop[:, None], m_p, m))
                P = _sym(
                    torch.where(diff[:, None, None], P_d, torch.where(prop[:, None, None], P_p, P))
                )
                D = torch.where(diff[:, None, None], D_d, D)
                ll = (
                    ll
                    + torch.where(diff, ll_d, torch.zeros_like(ll_d))
                    + torch.where(prop, ll_p, torch.zeros_like(ll_p))
                )
                r = r + diff.to(torch.int64)
                k = k - diff.to(torch.int64)
                if diffuse_now and i + 1 >= n and bool((diff & (k == 0)).any()):
                    # the last diffuse direction resolved: entries 0..i observing the whole state
                    # near noise-free give P directly (the later entries then see it)
                    seen = torch.arange(d, device=device) <= i
                    P = _observed_whole(
                        P, P_pred, D_pred, k_pred, diff & (k == 0), Hw, dg, obs & seen
                    )
                if bool(diff.any()):  # keep D's k largest singular values: drop the residue
                    D = _truncated(D, k, diff)
                    if any_fad:
                        D_raw = _truncated(D_raw, k, diff & fad)
            top = torch.arange(ev.shape[-1], device=device) < r.unsqueeze(-1)
            safe = torch.where(top, ev, torch.ones_like(ev))
            ll = ll + 0.5 * (torch.log(safe).sum(-1) + r.to(dtype) * LOG_2PI)
            D = torch.where((k > 0)[:, None, None], D, torch.zeros_like(D))
            if was_diffuse:
                with torch.no_grad():
                    Qn, Rn = graded_factor(D.detach(), k)
                    if any_fad:  # the remaining range is orthogonal to every observed row
                        Qf, Rf = graded_factor(_unseen(Hw, obs) @ Dgr, k)
                        on = fad[:, None, None]
                        Qn, Rn = torch.where(on, Qf, Qn), torch.where(on, Rf, Rn)
                Qa, Ra = Qn, Rn
                if any_fad:  # the outputs' D: D's own where it holds every direction, else Dg's
                    D_raw = torch.where((k > 0)[:, None, None], D_raw, torch.zeros_like(D_raw))
                    Dd = torch.where(rawok[:, None, None], D_raw, (Qa @ Ra).to(D.dtype))
                    D = torch.where(fad[:, None, None], Dd, D)
                fad = fad & (k > 0)
                rawok = rawok | ~fad
        means.append(torch.where(lost[:, None], nan, m))
        covs.append(torch.where(lost[:, None, None], nan, P))
        Kd = _sym(D @ D.transpose(-1, -2))
        if diffuse_now and bool(fad.any()):  # kappa's coefficient completed on Qa's range
            with torch.no_grad():
                short = fad & (_scaled_eigh(Kd.detach())[3].sum(-1) < k)
            if bool(short.any()):
                with torch.no_grad():
                    done = complete_kappa(Kd.detach(), _sym(Qa @ Qa.mT))
                    done = torch.where(short[:, None, None], done, Kd.detach())
                Kd = Kd + (done - Kd.detach())
        difs.append(Kd)
        lls.append(torch.where(lost, nan, ll))
        if stop_when_proper and not bool((k > 0).any()):
            break
    stack = lambda xs: torch.stack(xs, 1)  # noqa: E731
    filt = Moments(stack(means), stack(covs), stack(difs), nd)
    return filt, stack(pms), stack(pPs), stack(lls)


def factor_basis(F, D_prev, D, k, tol):
    """The diffuse factor ``D = F D_prev`` [B, n, n] after a prediction, and the number ``k`` [B]
    of diffuse directions, with every direction that a nonzero entry of ``F`` keeps kept,
    whatever its size (``F * inf = inf``; docs/dense.md, "Exact diffuse start").

    Unchanged unless the columns need it (then ``D`` becomes an orthonormal basis of its
    numerical range, the same range, and ``k`` its rank): a column at the rounding level of its
    own product (every entry at most ``tol`` times ``|F| |D_prev|``, the entrywise bound of its
    rounding: exactly what a singular ``F`` forgets, while a diagonal ``F`` keeps any nonzero
    entry), fewer than ``k`` independent columns (their directions taken one at a time, largest
    first, each normalized: a direction within ``tol`` of the earlier ones is theirs), or the
    independent columns of sizes more than ``2^20`` apart or outside ``2^-100 .. 2^100`` (float32:
    ``2^7``, ``2^+-20``; ``F = diag(1e-100, 0.9)``: a direction 1e-200 the size of the other,
    which the entries' test, relative to ``|D|_F``, took as resolved, and whose squares
    underflow). Only the range of ``D`` enters the exact diffuse limit. The value is the
    orthonormal basis ``Qb = D C``, the derivative that of its range, ``(I - Qb Qb') dD C``
    (``C`` constant). The same rule as the native kernel's ``factor_basis``."""
    B, n, _ = D.shape
    f64 = D.dtype == torch.float64
    grade, span = (2.0**-20, 2.0**100) if f64 else (2.0**-7, 2.0**20)
    with torch.no_grad():
        X = D.detach()
        bound = F.detach().abs() @ D_prev.detach().abs()
        live = (bound > 0).any(-2)  # [B, n] columns that can be nonzero
        real = (X.abs() > tol * bound).any(-2)
        top = X.abs().amax(-2)
        unit = X / torch.where(top > 0, top, torch.ones_like(top)).unsqueeze(-2)
        un = torch.linalg.vector_norm(unit, dim=-2)
        nrm = top * un  # no squares of tiny entries
        Y = unit / torch.where(real, un, torch.ones_like(un)).unsqueeze(-2)
        Y = Y * real.unsqueeze(-2).to(X.dtype)
        order = torch.argsort(torch.where(real, nrm, -torch.ones_like(nrm)), -1, descending=True)
        Qb = torch.zeros_like(X)  # picked directions (columns in processing order)
        C = torch.zeros_like(X)  # Qb = X C
        picked = torch.zeros(B, dtype=torch.int64, device=X.device)
        lo = torch.full_like(top, float("inf"))[:, 0]
        hi = torch.zeros_like(lo)
        ar = torch.arange(B, device=X.device)
        for j in range(n):
            o = order[:, j]
            y = Y[ar, :, o]
            c = torch.zeros_like(y)
            c[ar, o] = torch.where(
                real[ar, o], 1.0 / torch.where(real[ar, o], nrm[ar, o], 1.0), 0.0
            )
            for _ in range(2):  # modified Gram-Schmidt, twice
                for q in range(j):
                    r = (Qb[:, :, q] * y).sum(-1, keepdim=True)
                    y = y - r * Qb[:, :, q]
                    c = c - r * C[:, :, q]
            res = torch.linalg.vector_norm(y, dim=-1)
            take = real[ar, o] & (res > tol) & (picked < k)
            inv = torch.where(take, 1.0 / torch.where(take, res, 1.0), 0.0).unsqueeze(-1)
            Qb[:, :, j] = y * inv
            C[:, :, j] = c * inv
            picked = picked + take.to(torch.int64)
            sz = nrm[ar, o]
            lo = torch.where(take, torch.minimum(lo, sz), lo)
            hi = torch.where(take, torch.maximum(hi, sz), hi)
        trig = (live & ~real).any(-1) | (picked < k)
        trig = trig | (picked > 0) & ((lo < grade * hi) | (hi > span) | (lo < 1.0 / span))
        perp = torch.eye(n, dtype=X.dtype, device=X.device) - Qb @ Qb.mT
    if not bool(trig.any()):
        return D, k
    # the derivative of the range only (the basis within it is arbitrary): one along the basis
    # itself cancels in exact arithmetic only, 1 / |column| times rounding (9e-9 off at a = 1e-8)
    basis = Qb + perp @ (D @ C - (D @ C).detach())
    return torch.where(trig[:, None, None], basis, D), torch.where(trig, picked, k)


_SKIP_TOL = 1e-13  # f below this times |h|' |P| |h|: an entry with no noise and no information

# a diffuse step whose entries observe the whole state takes its finite part from
# :func:`observed_whole_cov` where the data's covariance C = (W'W)^-1 is below this times tr(P_*)
WHOLE_RATIO = 1e-4


def observed_whole_cov(P, D, k, W):
    """The filtered covariance of a diffuse step whose whitened rows ``W`` [B, d, n] observe the
    whole state (rank n), computed without cancellation.

    Prediction ``x ~ N(m, P + kappa D D')``, kappa -> inf, ``k`` [B] diffuse directions (the
    rank of ``D``); rows ``W x = y + N(0, I)``. With ``C = (W'W)^-1`` (the data's own covariance)
    and ``Z`` an orthonormal basis of range(D)'s complement, the posterior covariance is the
    update of ``N(., C)`` by the prediction seen along ``Z`` only (the limit drops the diffuse
    directions), ``C - C Z (Z' (C + P) Z)^-1 Z' C``: ``C`` itself plus a correction of relative
    size ``|C| / |P|`` at most, where Durbin & Koopman's scalar updates form the ``O(|C|)``
    result as a difference of ``O(|P|)`` terms (relative error ``eps |P| / |C|``: 4e-5 with
    ``R = 1e-12 I``, docs/dense.md). Returns (covariance [B, n, n], ok [B]): ``ok`` False where
    ``W`` has numerical rank below n (the step leaves a direction to ``P``; then the value is
    not to be used). ``Z`` is taken from the SVD of ``D`` without a derivative: the result
    depends on ``D`` only through its range, in the correction term."""
    n = P.shape[-1]
    _, Rw = torch.linalg.qr(W, mode="reduced")  # W = Q Rw, Rw [B, n, n] upper
    dia = torch.diagonal(Rw, dim1=-2, dim2=-1).abs()
    ok = dia.amin(-1) > 1e-7 * dia.amax(-1).clamp_min(torch.finfo(W.dtype).tiny)
    eye = torch.eye(n, dtype=P.dtype, device=P.device).expand(P.shape)
    Rs = torch.where(ok[:, None, None], Rw, eye)
    Ri = torch.linalg.solve_triangular(Rs, eye, upper=True)
    C = _sym(Ri @ Ri.transpose(-1, -2))
    with torch.no_grad():
        U = torch.linalg.svd(D)[0]
        keep = (torch.arange(n, device=P.device) >= k.unsqueeze(-1)).to(P.dtype)  # [B, n]
    Zm = U * keep.unsqueeze(-2)
    A = Zm.transpose(-1, -2) @ (C + P) @ Zm + torch.diag_embed(1.0 - keep)
    CZ = C @ Zm
    corr = CZ @ torch.linalg.solve(_sym(A), CZ.transpose(-1, -2))
    return _sym(C - corr), ok


def _observed_whole(P, P_pred, D_pred, k_pred, now, Hw, dg, obs):
    """The finite part once the step's entries so far (``obs``) resolved the last diffuse
    direction (``now`` [B]): :func:`observed_whole_cov` where they all have noise (``dg > 0``),
    observe the whole state and their covariance is below ``WHOLE_RATIO`` of the prediction's
    finite part; the scalar updates' ``P`` elsewhere."""
    noisy = obs & (dg > 0)
    cand = now & ~(obs & (dg <= 0)).any(-1) & (noisy.sum(-1) >= P.shape[-1])
    if not bool(cand.any()):
        return P
    root = torch.where(noisy, dg, torch.ones_like(dg)).rsqrt()
    W = torch.where(noisy.unsqueeze(-1), Hw * root.unsqueeze(-1), torch.zeros_like(Hw))
    Pw, ok = observed_whole_cov(P_pred, D_pred, k_pred, W)
    trP = torch.diagonal(P_pred, dim1=-2, dim2=-1).sum(-1)
    small = torch.diagonal(Pw, dim1=-2, dim2=-1).sum(-1) <= WHOLE_RATIO * trP
    use = cand & ok & small
    return torch.where(use[:, None, None], Pw, P)


NEAR_STEP = 1e4  # |h|^2 tr(P) above this times Dg: a near noise-free entry (as the native kernel)


def _near_entries(P, Hw, dg, obs):
    """[B] bool: steps with two or more near noise-free observed entries (decorrelated rows
    ``Hw`` [B, d, n], variances ``dg`` [B, d] > 0), where the covariance-form update's gain
    ``P H' S^-1`` loses ``eps cond(S)`` (S = H P H' + R is then Q-sized in the observed
    directions and R-sized across them: 1e10 with four entries at R = 1e-12 on three states)."""
    tr = torch.diagonal(P, dim1=-2, dim2=-1).sum(-1)
    hh = Hw.square().sum(-1)
    return (obs & (hh * tr.unsqueeze(-1) > NEAR_STEP * dg)).sum(-1) >= 2


def _factor_update(m, P, Hw, zw, dg, obs):
    """The proper update in square-root form: with ``P = L L'``, the whitened rows
    ``W = Dg^-1/2 Hw`` and innovation ``v``, the least-squares problem
    ``min |u|^2 + |W L u - v|^2`` triangularized as ``[[I, 0], [W L, v]] = Q [[Ru, c], [0, rho]]``
    gives ``m + L Ru^-1 c``, ``P = X X'`` with ``X = L Ru^-1`` and the log-likelihood
    ``-1/2 (o log 2 pi + sum log Dg + 2 sum log |diag Ru| + rho^2)``. Orthogonal steps and one
    triangular solve: no ``S^-1``, so entries near noise-free together keep their digits (the
    native kernel's factor form, docs/dense.md). Unobserved entries (zero rows, unit noise) add
    nothing. Returns (m, P, loglik) [B, ...]."""
    B, d, n = Hw.shape
    L = _factor(P)
    g = torch.where(obs, dg, torch.ones_like(dg)).rsqrt()
    W = Hw * g.unsqueeze(-1)
    v = zw * g - _mv(W, m)
    eye = torch.eye(n, dtype=P.dtype, device=P.device).expand(B, n, n)
    top = torch.cat([eye, torch.zeros_like(m).unsqueeze(-1)], -1)
    bot = torch.cat([W @ L, v.unsqueeze(-1)], -1)
    # a plain (differentiable) QR: the identity block gives full column rank but for rho = 0,
    # and the triangular solves below read the upper triangle only, which _reduce_rows'
    # straight-through derivative does not keep triangular
    # The data rows go first: Householder QR is row-wise stable with the rows in decreasing
    # norm (Cox & Higham 1998), and below the 1/sqrt(Dg)-sized rows the prior's unit rows kept
    # only eps |W L| of their digits (log-likelihood 2.7e-10 relative off at R = 1e-12).
    Ra = torch.linalg.qr(torch.cat([bot, top], -2), mode="reduced")[1]
    Ru, c, rho = Ra[..., :n, :n], Ra[..., :n, n], Ra[..., n, n]
    Xt = torch.linalg.solve_triangular(Ru.transpose(-1, -2), L.transpose(-1, -2), upper=False)
    u = torch.linalg.solve_triangular(Ru, c.unsqueeze(-1), upper=True).squeeze(-1)
    m = m + _mv(L, u)
    P = _sym(Xt.transpose(-1, -2) @ Xt)
    logdg = torch.where(obs, torch.log(torch.where(obs, dg, torch.ones_like(dg))), 0.0)
    ll = -0.5 * (
        obs.sum(-1).to(P.dtype) * LOG_2PI
        + logdg.sum(-1)
        + 2 * torch.log(torch.diagonal(Ru, dim1=-2, dim2=-1).abs()).sum(-1)
        + rho.square()
    )
    return m, P, ll


def _ldl(R):
    """R = L diag(Dg) L' for PSD R [..., d, d]: L unit lower triangular, Dg >= 0 (a pivot at
    rounding level of its own diagonal entry is 0 and its column of L is 0: judged against R's
    largest entry, R = diag(1e16, 1) lost its second, the native kernel's rule too), by the column
    recursion."""
    d = R.shape[-1]
    zero = torch.zeros(R.shape[:-2], dtype=R.dtype, device=R.device)
    # columns of L (lists of [...] entries) and pivots, built without writing into a tensor
    # that autograd saved (the derivative w.r.t. R needs every earlier column as computed)
    cols, dg = [], []
    for j in range(d):
        s = R[..., j, j] - sum((cols[q][j].square() * dg[q] for q in range(j)), zero)
        pos = s > 1e-14 * R[..., j, j].abs()
        # a zero pivot is 0 in value but keeps the pivot's derivative: R[j, j] = 0 is the edge
        # of the PSD cone, and the one-sided derivative of the log-likelihood there (towards a
        # noisy entry) is the one a fit needs; a constant 0 would report it as 0
        dg.append(torch.where(pos, s, s - s.detach()))
        piv = torch.where(pos, s, torch.ones_like(s))
        col = [zero] * j + [torch.ones_like(s)]
        for i in range(j + 1, d):
            v = R[..., i, j] - sum((cols[q][i] * cols[q][j] * dg[q] for q in range(j)), zero)
            col.append(torch.where(pos, v / piv, torch.zeros_like(v)))
        cols.append(col)
    L = torch.stack([torch.stack(c, -1) for c in cols], -1)  # L[..., i, j] = cols[j][i]
    return L, torch.stack(dg, -1)


def _factor(P):
    """L with L L' = P for a PSD P [..., n, n]: Cholesky where it exists, else from eigh."""
    L, info = torch.linalg.cholesky_ex(P)
    bad = info != 0
    if bool(bad.any()):
        w, U = torch.linalg.eigh(P[bad])
        pos = w > 0
        root = torch.where(pos, torch.where(pos, w, torch.ones_like(w)).sqrt(), torch.zeros_like(w))
        L = L.clone()
        L[bad] = U * root.unsqueeze(-2)
    return L


def _reduce_rows(S, k):
    """k rows with the Gram matrix of S [..., m, c] (m >= k, rank(S) <= k): R of S = Q R.

    Values from Householder QR. With autograd the rows are Q' S for the computed (constant) Q:
    everything downstream depends on S only through S' S, whose first-order change Q' dS gives
    exactly (the dropped rows of Q' S are 0), and S may be rank-deficient, where the derivative
    of R itself is undefined.
    """
    R = torch.linalg.qr(S.detach(), mode="r")[1][..., :k, :]
    if not S.requires_grad:
        return R
    Q = torch.linalg.qr(S.detach(), mode="complete")[0][..., :k].mT
    QS = Q @ S
    return R + (QS - QS.detach())


def smooth_moments(model: Model, filt: Moments) -> Moments:
    """Two-filter smoother in square-root information form (docs/dense.md, "Reference smoother").

    Backward: the likelihood of z_{t+1:T} given x_t as a factor ``|Rb x - bb|^2`` [n + 1, n + 1]
    (the extra row holds the residual, so that no row dropped by a reduction is nonzero),
    updated by orthogonal transformations only, never inverting a matrix whose conditioning is
    that of the information (R = 1e-12 I makes the information 1e12 while Q stays O(1)):
    measurement rows L^-1 [H, z] (R = L L') stacked and reduced by QR; prediction through
    x_t = F x_{t-1} + c + Lq w by the triangular factor G of I + W W' (W = Rb Lq, G from the QR of
    [W'; I], full column rank) giving G^-T [Rb F, bb - Rb c]. Combination: x_t = m_t + [L, D] (u, v)
    with L L' = P_t (u ~ N(0, I)) and D an orthonormal basis of the diffuse directions (v flat);
    the stacked backward and prior rows are triangularized (Ru), so the smoothed covariance is
    X' X with X = Ru^-T [L, D]', with no subtraction of nearly equal matrices. A singular R: the
    entries are decorrelated by R = Lu Dg Lu' and those with Dg = 0 (exact) are conditioned into
    the backward prediction (:func:`_exact_step`). A diffuse direction that no later observation
    resolves either (a state never observed) stays diffuse (:func:`unresolved_directions`).
    """
    lost = ~torch.isfinite(filt.cov.detach()).flatten(1).all(1)
    if bool(lost.any()):
        return _smooth_kept(model, filt, lost)
    Rb = backward_rows(model)
    n = model.F.shape[-1]
    keep, Pu = unresolved_directions(model, filt)
    ms, Ps = combine_rows(Rb[..., :n], Rb[..., n:], filt, keep)
    return smoothed(ms, Ps, Pu)


def _smooth_kept(model: Model, filt: Moments, lost) -> Moments:
    """:func:`smooth_moments` of the series that ``lost`` [B] does not mark, NaN moments in
    those it does: a series whose predicted covariance passed the range (:func:`filter_moments`'
    ``lost``: NaN filtered moments from that step on, and ``kalmanscan.dense.api`` warns, naming
    it) has no smoothed moments, and its steps before, with covariances up to the range, are not
    factored (LAPACK's eigh did not converge on an explosive ``F``'s 1e185)."""
    B = lost.shape[0]
    idx = (~lost).nonzero().squeeze(-1)
    nan = torch.full_like(filt.mean[:1, :1, :1], float("nan"))
    mean = nan.expand(filt.mean.shape).clone()
    cov = nan.unsqueeze(-1).expand(filt.cov.shape).clone()
    if idx.numel() == 0:
        return Moments(mean, cov, torch.zeros_like(cov), 0)
    sub = model._replace(**{k: v[idx] for k, v in model._asdict().items() if v is not None})
    fs = Moments(filt.mean[idx], filt.cov[idx], filt.diffuse[idx], filt.ndiffuse)
    sm = smooth_moments(sub, fs)
    dif = torch.zeros((B, *sm.diffuse.shape[1:]), dtype=cov.dtype, device=cov.device)
    put = lambda full, part: full.index_copy(0, idx, part)  # noqa: E731
    return Moments(put(mean, sm.mean), put(cov, sm.cov), put(dif, sm.diffuse), sm.ndiffuse)


def smoothed(ms, Ps, Pu=None) -> Moments:
    """The smoothed :class:`Moments`: ``Pu`` [B, nd, n, n] kappa's coefficient (up to a
    positive factor per step) along the directions that stay diffuse over the first ``nd``
    steps (:func:`unresolved_directions`), as in the filter; ``None``: none."""
    if Pu is None:
        return Moments(ms, Ps, torch.zeros_like(Ps), 0)
    nd = Pu.shape[1]
    return Moments(ms, Ps, torch.cat([Pu, torch.zeros_like(Ps[:, nd:])], 1), nd)


def backward_rows(model: Model, last=None):
    """The backward square-root information filter of :func:`smooth_moments`: rows
    ``[Rb | bb]`` [B, T, n + 1, n + 1] with ``|Rb x_t - bb|^2`` the likelihood of ``z_{t+1:}``
    given ``x_t``. ``last`` [B, n + 1, n + 1]: the rows at the last step ``T - 1`` (the
    information that data after the model's steps carry about ``x_{T-1}``, :func:`info_rows`);
    None (zero rows) for a whole series."""
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    dtype, device = model.z.dtype, model.z.device
    H_all, R_all, z_all = mask_observation(model.z, model.observed, model.H, model.R)
    Lr, info = torch.linalg.cholesky_ex(R_all)
    # singular by the filter's rule (_ldl's pivots: rounding-level ones are 0), not by whether
    # the Cholesky factorization happens to pass: R = v v' can leave a pivot of 3e-9 (1e-17
    # squared), whose whitened row 3e8 h differentiates as s^-3/2 (NaN or 1e2-fold off)
    Lu, Dg = _ldl(R_all)
    exact = None
    if not bool((info != 0).any()) and not bool((Dg <= 0).any()):
        # whitened observations: rows L^-1 H and L^-1 z with R = L L' (missing rows are 0)
        obs = torch.linalg.solve_triangular(
            Lr, torch.cat([H_all, z_all.unsqueeze(-1)], -1), upper=False
        )
    else:  # singular R: entries decorrelated by R = Lu Dg Lu'; those with Dg = 0 are exact
        Hz = torch.linalg.solve_triangular(
            Lu, torch.cat([H_all, z_all.unsqueeze(-1)], -1), upper=False, unitriangular=True
        )
        ex = Dg <= 0  # [B, T, d]
        inv_sd = torch.where(ex, torch.zeros_like(Dg), torch.where(ex, 1.0, Dg).rsqrt())
        obs = Hz * inv_sd.unsqueeze(-1)  # the noisy entries' whitened rows (exact ones 0)
        # the exact rows [E | e], and their pivots: 0 in value, the derivative of R's (_ldl)
        exact = (Hz * ex.to(dtype).unsqueeze(-1), ex, torch.where(ex, Dg, torch.zeros_like(Dg)))
    Lq = _factor(_sym(model.Q))
    Rb = torch.zeros(B, n + 1, n + 1, dtype=dtype, device=device) if last is None else last
    eye1 = torch.eye(n + 1, dtype=dtype, device=device).expand(B, n + 1, n + 1)
    facs = [Rb]
    for t in range(T - 1, 0, -1):
        Rb = _reduce_rows(torch.cat([Rb, obs[:, t]], -2), n + 1)
        A, bb = Rb[..., :n], Rb[..., n:]
        F, c, Lqt = model.F[:, t], model.c[:, t].unsqueeze(-1), Lq[:, t]
        cons = Gx = None
        if exact is not None and bool(exact[1][:, t].any()):
            ee, ex_t, dg_t = exact[0][:, t], exact[1][:, t], exact[2][:, t]
            F, c, Lqt, cons, Gx = _exact_step(ee, ex_t, F, c, model.Q[:, t], dg_t)
        W = A @ Lqt
        G = torch.linalg.qr(torch.cat([W.mT, eye1], -2), mode="reduced")[1]
        if Gx is not None and dg_t.requires_grad:
            G = G + _pivot_tangent(G, A @ Gx, dg_t)
        rhs = torch.cat([A @ F, bb - A @ c], -1)
        Rb = torch.linalg.solve_triangular(G.mT, rhs, upper=False)
        if cons is not None:
            Rb = _reduce_rows(torch.cat([Rb, cons], -2), n + 1)
        facs.append(Rb)
    return torch.stack(facs[::-1], 1)  # [B, T, n + 1, n + 1]: z_{t+1:} about x_t


def info_rows(J, eta):
    """Rows ``[Rb | bb]`` [B, n + 1, n + 1] (last row 0) of the information ``(J, eta)``
    ([B, n, n], [B, n]): ``Rb' Rb = J``, ``Rb' bb = eta`` (``L L' = J``, ``Rb = L'``,
    ``bb = L^+ eta``: Cholesky, the pseudo-inverse of :func:`_factor`'s where J is singular)."""
    J = _sym(J)
    L, info = torch.linalg.cholesky_ex(J)
    bad = info != 0
    if bool(bad.any()):
        L = torch.where(bad[..., None, None], _factor(J), L)
        Lt = torch.where(bad[..., None, None], torch.eye(J.shape[-1], dtype=J.dtype,
                                                         device=J.device), L)  # fmt: skip
        bb = torch.linalg.solve_triangular(Lt, eta.unsqueeze(-1), upper=False)
        bb = torch.where(bad[..., None, None], torch.linalg.pinv(L) @ eta.unsqueeze(-1), bb)
    else:
        bb = torch.linalg.solve_triangular(L, eta.unsqueeze(-1), upper=False)
    rows = torch.cat([L.mT, bb], -1)
    return torch.cat([rows, torch.zeros_like(rows[..., :1, :])], -2)


SINGULAR_SMOOTH_MESSAGE = (
    "R: backend 'sequential' (the reference smoother) needs H Q H' positive definite on the "
    "exact entries (R = 0) of every step after the first: an exact observation of a step "
    "without process noise in its direction is infinite information about the previous state; "
    "use backend='native' (CPU)"
)


def _exact_step(Ee, ex, F, c, Q, dg=None):
    """The backward prediction through x_t = F x_{t-1} + c + w (w ~ N(0, Q)) of a step whose
    entries ``ex`` [B, d] are observed exactly, E x_t = e (rows ``Ee`` = [E | e] [B, d, n + 1],
    zero where not exact; docs/dense.md, singular R).

    Given x_{t-1} the exact entries are N(E F x_{t-1} + E c, E Q E'): their whitened rows
    ``Ls^-1 [E F, e - E c]`` (E Q E' = Ls Ls'), finite wherever E Q E' is positive definite; and
    given them x_t is N(F' x_{t-1} + c', Q') with G = Q E' (E Q E')^-1, F' = (I - G E) F,
    c' = (I - G E) c + G e and Q' = (I - G E) Q (I - G E)' (factor (I - G E) Lq). Returns
    (F', c' [B, n, 1], a factor of Q', the rows [B, d, n + 1], G [B, n, d]).

    ``dg`` [B, d]: the exact entries' pivots of R (0 in value, zero elsewhere). They enter
    ``E Q E' + diag(dg)`` (the entries' variance given x_{t-1}), so that the rows, G, F' and c'
    carry the derivative towards a noisy entry; the term ``G diag(dg) G'`` of Q' has no factor
    with a finite derivative at 0, and goes in through :func:`_pivot_tangent`."""
    n = F.shape[-1]
    E, e = Ee[..., :n], Ee[..., n:]
    Se = _sym(E @ Q @ E.mT) + torch.diag_embed(1.0 - ex.to(Q.dtype))
    if dg is not None:
        Se = Se + torch.diag_embed(dg)
    Ls, info = torch.linalg.cholesky_ex(Se)
    if bool((info != 0).any()):
        raise ValueError(SINGULAR_SMOOTH_MESSAGE)
    G = torch.cholesky_solve(E @ Q, Ls).mT  # Q E' Se^-1  [B, n, d]
    IGE = torch.eye(n, dtype=Q.dtype, device=Q.device) - G @ E
    cons = torch.linalg.solve_triangular(Ls, torch.cat([E @ F, e - E @ c], -1), upper=False)
    return IGE @ F, IGE @ c + G @ e, IGE @ _factor(_sym(Q)), cons, G


def _pivot_tangent(U, K, dg):
    """Zero in value; the first-order change of the upper triangular ``U`` (``U' U = M``)
    when ``M`` gains ``K diag(dg) K'`` (``dg`` [B, d] zero in value, live in its derivative).

    The backward prediction's factor ``U`` of ``I + A Q' A'`` misses the term ``G diag(dg) G'``
    of an exact entry's Q' (:func:`_exact_step`); its derivative at ``dg = 0`` is
    ``dU = Phi(U^-T dM U^-1) U``, ``dM = K diag(ddg) K'``, ``K = A G``, with Phi the upper
    triangle, diagonal halved (from ``dU' U + U' dU = dM``, ``dU U^-1`` upper triangular)."""
    X = torch.linalg.solve_triangular(U.mT, K, upper=False)  # U^-T K
    T = (X * dg.unsqueeze(-2)) @ X.mT
    Phi = torch.triu(T, 1) + 0.5 * torch.diag_embed(torch.diagonal(T, dim1=-2, dim2=-1))
    return Phi @ U


def diffuse_factor(filt: Moments):
    """``M = [L, D]`` [B, T, n, 2n] with ``x_t = m_t + M (u, v)``: ``L L' = P_t`` (u ~ N(0, I)) and
    ``D`` an orthonormal basis of the diffuse directions (v flat), with zero columns elsewhere;
    and ``flat`` [B, T, n] bool: the zero columns of ``D`` (give them a unit prior). The
    directions: the eigenvectors of the filter's ``P_inf`` above ``rank_tol`` of the largest, or
    where :func:`_scaled_eigh` (the rank in the coordinates' own scales) finds more, those."""
    B, T, n = filt.mean.shape
    dtype = filt.mean.dtype
    L = _factor(_sym(filt.cov))
    Dd = torch.zeros_like(filt.cov)
    flat = torch.zeros(B, T, n, dtype=torch.bool, device=filt.mean.device)
    nd = min(filt.ndiffuse, T)
    if nd > 0:  # orthonormal basis of the diffuse directions, zero columns (unit prior) elsewhere
        Pinf = _sym(filt.diffuse[:, :nd])
        with torch.no_grad():
            w, U = torch.linalg.eigh(Pinf)
            keep = w > rank_tol(dtype) * torch.linalg.matrix_norm(Pinf).unsqueeze(-1)
            # the rank in the coordinates' own scales (_scaled_eigh) where it sees more: then
            # an orthonormal basis of S V_k (the kept columns first)
            s, ws, V, keep_s = _scaled_eigh(Pinf)
            more = (keep_s.sum(-1) > keep.sum(-1))[..., None]
            km = keep_s.to(dtype).unsqueeze(-2)
            Qb, Rq = torch.linalg.qr(s.unsqueeze(-1) * V * km)
            basis = torch.where(more.unsqueeze(-1), Qb * km, U * keep.to(dtype).unsqueeze(-2))
            keep = torch.where(more, keep_s, keep)
        if Pinf.requires_grad:  # Pinf C = basis, and its columns follow range(Pinf) when it moves
            C = basis / torch.where(keep, w, torch.ones_like(w)).unsqueeze(-2)
            if bool(more.any()):  # Pinf S^-1 V_k W_k^-1 = S V_k (S^-1 Pinf S^-1 = V W V'),
                # S V_k = Qb Rq
                one = torch.ones_like(ws)
                X = V * km / (s.unsqueeze(-1) * torch.where(keep_s, ws, one).unsqueeze(-2))
                Rs = Rq + torch.diag_embed((~keep_s).to(dtype))
                Cs = torch.linalg.solve_triangular(Rs, X, upper=True, left=False)
                C = torch.where(more.unsqueeze(-1), Cs, C)
            basis = basis + (Pinf @ C - (Pinf @ C).detach())
        Dd = torch.cat([basis, Dd[:, nd:]], 1)
        flat = torch.cat([~keep, torch.ones_like(flat[:, nd:])], 1)
    else:
        flat = torch.ones_like(flat)
    return torch.cat([L, Dd], -1), flat


def _scaled_eigh(Pinf):
    """The eigendecomposition of kappa's coefficient ``Pinf`` [..., n, n] in its coordinates'
    own scales, for its rank: (s [..., n], w [..., n] descending, V [..., n, n], keep [..., n])
    with ``Pinf = S V diag(w) V' S`` (``S = diag(s)``) and ``keep`` the eigenvalues above
    :func:`kalmanscan.dense.parallel.rank_tol` of the scaled matrix (a prefix).

    ``Pinf = D D'`` as the filter forms it is exact to ``eps |D_i| |D_j|`` in entry (i, j), so
    its rank shows in ``S^-1 Pinf S^-1`` (``s_i = sqrt(Pinf_ii)``), not in ``Pinf``: a state 1e3
    times another's diffuse scale that F couples into it leaves an eigenvalue 3e-15 of the
    largest (x0 feeding 1000 x0 into x1), below the threshold, though 3e-9 after scaling.
    ``s_i`` is at least ``sqrt(rank_tol)`` of the largest: a coordinate the filter resolved
    keeps ``eps |D|`` of rounding, which the scaling then raises to ``eps / sqrt(rank_tol)``
    only (eigenvalues ``eps / 64``, below the threshold)."""
    dtype = Pinf.dtype
    tol = rank_tol(dtype)
    d = torch.diagonal(Pinf, dim1=-2, dim2=-1).clamp_min(0.0).sqrt()
    s = torch.maximum(d, tol**0.5 * d.amax(-1, keepdim=True))
    s = torch.where(s > 0, s, torch.ones_like(s))
    w, V = torch.linalg.eigh(Pinf / (s.unsqueeze(-1) * s.unsqueeze(-2)))
    w, V = w.flip(-1), V.flip(-1)
    keep = w > tol * torch.linalg.vector_norm(w, dim=-1, keepdim=True)  # |.|_F, as before
    return s, w, V, keep


def unresolved_directions(model: Model, filt: Moments):
    """The filtered diffuse directions that no later observation resolves either (a state no
    observation ever loads on, or one a singular ``F`` forgets first): they stay diffuse in the
    smoothed moments. Returns (keep [B, T, n, n], Pu [B, nd, n, n]), or (None, None) where there
    are none: ``keep`` an orthonormal basis, in :func:`diffuse_factor`'s coordinates ``v``
    (``x_t = m_t + L u + D v``), of the resolved ones (zero columns elsewhere), ``Pu`` kappa's
    coefficient along the unresolved ones, up to a positive factor per step
    (:func:`_unresolved_kappa`; ``nd`` the filter's diffuse steps).

    Decided from the structure, as the filter decides (not from the magnitudes of the
    information, which a small entry of ``F`` makes as small as it likes): at the last step
    every filtered diffuse direction is unresolved; before, ``D v`` is unresolved where
    ``F_{t+1} D v`` is not seen by the observed rows of ``H_{t+1}`` (normalized) and has no part
    on the next step's filtered directions outside its unresolved ones, with each column of
    ``F D`` normalized and one at the rounding of its own product (:func:`factor_basis`'
    entrywise bound) taken as 0 (forgotten). A part of ``F D v`` that no observation sees and
    that the next step's filtered directions lack was dropped there (a direction whose share of
    ``P_inf`` fell below the rounding: two unobserved states ``F`` mixes, the second
    ``(0.6 / 1.1)^t`` of the first; or the filter's own :func:`factor_basis`), not resolved: it
    stays diffuse (formerly taken as resolved, with no data on it: every earlier step NaN).

    With ``v ~ N(0, kappa W)``, ``W = D' P_inf D`` (the filter's diffuse part, from the prior's
    ``kappa I``), the unresolved ``v`` are independent of their complement in the metric
    ``W^-1``, which ``W`` maps the orthogonal complement onto: the data fix that complement and
    leave the unresolved part at its prior mean (0) and variance (``kappa``). No derivative
    (the basis is a constant; the smoothed moments follow ``D`` through it)."""
    F = model.F
    B, T, n = filt.mean.shape
    nd = min(filt.ndiffuse, T)
    if nd == 0:
        return None, None
    dtype, device = filt.mean.dtype, filt.mean.device
    tol = _dif_tol(dtype)
    eye = torch.eye(n, dtype=dtype, device=device)
    with torch.no_grad():
        head = Moments(*(x[:, :nd].detach() for x in filt[:3]), nd)
        Dd, flat = (x[:, :nd] for x in diffuse_factor(head))
        Dd, kept = Dd[..., n:], (~flat).to(dtype)
        F = F.detach().expand(B, T, n, n)
        Hn = _unit_rows(model)
        last = torch.diag_embed(kept[:, -1]) if nd == T else torch.zeros_like(eye).expand(B, n, n)
        Zs = [last]  # [B, n, n] orthonormal bases (v coordinates) of the unresolved, backward
        P = Dd[:, -1] @ last @ Dd[:, -1].mT if nd == T else torch.zeros_like(last)
        for t in range(nd - 2 if nd == T else nd - 1, -1, -1):
            Pf = Dd[:, t + 1] @ Dd[:, t + 1].mT if t + 1 < nd else torch.zeros_like(P)
            # flat columns: never null
            Z = _unseen_null(F[:, t + 1], Dd[:, t], P, Pf, Hn[:, t + 1], tol, 1.0 - kept[:, t])
            Zs.append(Z)
            P = Dd[:, t] @ Z @ Z.mT @ Dd[:, t].mT
        if nd < T:
            Zs = Zs[1:]
        Z = torch.stack(Zs[::-1], 1)  # [B, nd, n, n]
        nnull = (Z != 0).any(-2).sum(-1)
        if not bool((nnull > 0).any()):
            return None, None
        Pz = Z @ Z.mT
        W = _sym(Dd.mT @ _sym(head.diffuse) @ Dd)
        Yr = torch.linalg.svd(W @ (eye - Pz))[0]
        nres = kept.sum(-1) - nnull
        Yr = Yr * (torch.arange(n, device=device) < nres.unsqueeze(-1)).to(dtype).unsqueeze(-2)
        keep = torch.where((nnull > 0)[..., None, None], Yr, torch.diag_embed(kept))
        keep = torch.cat([keep, torch.zeros(B, T - nd, n, n, dtype=dtype, device=device)], 1)
        U = Dd @ Z  # x-space orthonormal bases of the unresolved directions (zero columns)
        if model.P0 is None:  # (a diffuse prior: always, where the filter has diffuse steps)
            D0 = prior_start(model)[1].detach().to(dtype).expand(B, n, n)
        else:  # none: the projectors below
            D0 = torch.zeros(B, n, n, dtype=dtype, device=device)
        Pu = _unresolved_kappa(F, D0, U, nnull, tol, Dd[:, 0] @ Dd[:, 0].mT, Hn)
        return keep, Pu


def _unseen_null(F1, D, P, Pf, H1, tol, pinned=None):
    """[B, n, n] an orthonormal basis (zero columns elsewhere) of the coefficients ``c`` whose
    image ``F1 D c`` stays unresolved at the next step: not seen by its unit observed rows
    ``H1`` and with no part on its filtered diffuse directions (projector ``Pf``) outside the
    unresolved ones (projector ``P``); what leaves those unseen was dropped there, not resolved.
    Each column of ``F1 D`` is normalized and one at the rounding of its own product
    (:func:`factor_basis`' entrywise bound) taken as 0 (forgotten: then unresolved, unless
    ``pinned``); ``pinned`` [B, n] (1: never unresolved), by default the forgotten columns."""
    dtype = D.dtype
    X = F1 @ D
    bound = F1.abs() @ D.abs()
    gone = (X.abs() <= tol * bound).all(-2)  # forgotten (zero columns too: 0 <= 0)
    one = torch.ones_like(gone, dtype=dtype)
    top = torch.where(gone, one, X.abs().amax(-2))  # no squares of tiny entries (1e-200)
    nrm = torch.where(gone, one, top * torch.linalg.vector_norm(X / top.unsqueeze(-2), dim=-2))
    Xn = X / nrm.unsqueeze(-2) * (~gone).to(dtype).unsqueeze(-2)
    pin = gone.to(dtype) if pinned is None else pinned
    G = torch.cat([(Pf - P) @ Xn, H1 @ Xn, torch.diag_embed(pin)], -2)
    _, sv, Vh = torch.linalg.svd(G, full_matrices=False)
    null = (sv <= tol).flip(-1)  # the null vectors first
    V = (Vh.mT.flip(-1) / nrm.unsqueeze(-1)) * null.to(dtype).unsqueeze(-2)
    V = V / V.abs().amax(-2, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    return torch.linalg.qr(V)[0] * null.to(dtype).unsqueeze(-2)


def _unit_rows(model: Model):
    """[B, T, d, n] the rows of H with the missing ones 0, each scaled to norm 1 (0 stays 0):
    a diffuse direction ``v`` is seen at step t where ``H_t v`` is not 0 (the filter's
    decorrelated rows ``L^-1 H`` span the same rows)."""
    H = mask_observation(model.z, model.observed, model.H, model.R)[0].detach()
    h = torch.linalg.vector_norm(H, dim=-1, keepdim=True)
    return H / torch.where(h > 0, h, torch.ones_like(h))


def _unresolved_kappa(F, D0, U, k, tol, Pf0, Hn):
    """[B, nd, n, n]: kappa's coefficient in the smoothed covariance along the unresolved
    directions (``U`` [B, nd, n, n] their orthonormal bases, zero columns elsewhere; ``k`` [B, nd]
    their number), up to a positive factor per step: ``A_t Pi A_t'`` with ``Pi`` the projector on
    the prior's diffuse directions (``D0`` [B, n, n], kappa I on them) that no observation
    resolves, ``A_t = F_t ... F_0``. Its off-diagonal entries are the signs of the unbounded
    covariances between two unresolved coordinates (:func:`kalmanscan.dense.parallel.cov_with_inf`):
    two unobserved states that ``F`` mixes are correlated, which the projector ``U U'`` does not
    show. Propagated from the prior as a factor ``G_t = F_t G_{t-1}`` (no subtraction: the
    filtered diffuse part conditioned on the resolved directions lost ``eps`` times the ratio of
    their scales), scaled to a largest entry of 1 at each step (no overflow over a long series)
    and projected on ``range(U_t)`` (what a singular ``F`` forgets drops out); a step whose
    directions' scales lie more than ``2^20`` apart (float32 ``2^7``: as :func:`factor_basis`)
    keeps it where its range (above ``rank_tol``, as
    :func:`kalmanscan.dense.parallel.cov_with_inf` reads it) reaches the coordinates that
    ``range(U_t)`` does, else the projector ``U U'``, the range without the correlations.
    ``Pf0`` [B, n, n] the projector on the filtered diffuse directions at step 0, ``Hn``
    [B, T, d, n] the unit observed rows (:func:`unresolved_directions`' rule). Where ``U_t``
    holds fewer directions than the prior's unresolved ones reach at that step
    (:func:`reach_projectors`: the filter's ``P_inf`` lost one below its rounding), those are
    added; and ``K`` is completed on its structural range (:func:`complete_kappa`)."""
    B, nd, n, _ = U.shape
    dtype = U.dtype
    # the prior's unresolved directions: c with F_0 D0 c in range(U_0) (a column of D0 that is
    # 0 or that F_0 forgets: never)
    G0 = D0 @ _unseen_null(F[:, 0], D0, U[:, 0] @ U[:, 0].mT, Pf0, Hn[:, 0], tol)
    G, Gs = G0, []
    for t in range(nd):
        G = F[:, t] @ G
        G = G / G.abs().amax((-1, -2), keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        Gs.append(G)
    Gp = U @ (U.mT @ torch.stack(Gs, 1))
    sv = torch.linalg.svdvals(Gp)  # [B, nd, n] descending
    last = sv.gather(-1, (k - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    grade = 2.0**-20 if dtype == torch.float64 else 2.0**-7
    K, Pr = _sym(Gp @ Gp.mT), U @ U.mT
    # scales far apart: K still serves where it reaches the coordinates the range does (as
    # cov_with_inf reads it): two directions F mixes, the second (0.6 / 1.1)^t of the first
    rt = rank_tol(dtype)
    Pd = _range_projector(K, torch.linalg.matrix_norm(K), rt)[0]
    dia = lambda X: torch.diagonal(X, dim1=-2, dim2=-1) > rt  # noqa: E731
    ok = (k > 0) & ((last > grade * sv[..., 0]) | (dia(Pd) == dia(Pr)).all(-1))
    # the range from the prior's unresolved directions carried forward (an orthonormal basis at
    # each step), with U's: K's own range, and U_t's where the filter's P_inf lost a direction
    # below its rounding, miss the directions whose share fell below eps (the second of two
    # that F mixes after about 26 steps), which stay diffuse: K completed on them
    S = Pr
    if bool((kappa_rank(K) < (G0 != 0).any(-2).sum(-1).unsqueeze(-1)).any()):  # else: no loop
        reach = reach_projectors(F[:, :nd], G0, Hn[:, :nd], tol)
        short = torch.diagonal(reach, dim1=-2, dim2=-1).sum(-1) > k.to(dtype) + 0.5
        S = torch.where(short[..., None, None], _union_projector(Pr, reach), Pr)
    return torch.where(ok[..., None, None], complete_kappa(K, S), S)


def kappa_rank(K):
    """[...] the rank of kappa's coefficient ``K`` [..., n, n] as the precision reads it
    (:func:`kalmanscan.dense.parallel.precision_of`: eigenvalues above ``rank_tol`` of the
    Frobenius norm)."""
    w = torch.linalg.eigvalsh(_sym(K.detach()))
    return (w > rank_tol(K.dtype) * torch.linalg.matrix_norm(K.detach()).unsqueeze(-1)).sum(-1)


def reach_projectors(F, N, Hn, tol):
    """[B, T, n, n] the projectors on ``range(F_t ... F_0 N)`` (``F`` [B, T, n, n], ``N``
    [B, n, n] orthonormal columns, zero columns elsewhere): the directions that the diffuse
    directions ``N`` before step 0, which no observation resolves, reach at each step. Carried
    as an orthonormal basis (``F`` applied to it, then orthonormalized by an SVD: no power of
    ``F`` formed, whose columns align so that a second direction's share falls below the
    rounding); a direction whose singular value is at most ``tol |F_t|`` is forgotten (a
    singular ``F``), and each step's image is projected on the null space of its unit observed
    rows ``Hn`` [B, T, d, n] (where it lies: else resolved), which removes the rounding that
    ``F`` would otherwise grow along an observed direction whose eigenvalue exceeds one of
    theirs (an observed random walk beside a direction shrinking by 0.59 a step: 2e-10 after 30
    steps). No derivative."""
    B, T, n, _ = F.shape
    out = []
    eye = torch.eye(n, dtype=F.dtype, device=F.device)
    ar = torch.arange(n, device=F.device)
    with torch.no_grad():
        N = N.detach()
        k = (torch.linalg.svdvals(N) > 0.5).sum(-1)
        _, hs, Vh = torch.linalg.svd(Hn.detach(), full_matrices=True)
        seen = torch.zeros(B, T, n, dtype=F.dtype, device=F.device)
        r = hs.shape[-1]
        seen[..., :r] = (hs > tol).to(F.dtype)
        Pn = eye - (Vh.mT * seen.unsqueeze(-2)) @ Vh  # [B, T, n, n] null of the observed rows
        PF = Pn @ F.detach()
        floor = tol * torch.linalg.matrix_norm(F.detach())  # [B, T]
        for t in range(T):
            Us, sv, _ = torch.linalg.svd(PF[:, t] @ N)
            keep = (sv > floor[:, t, None]) & (ar < k.unsqueeze(-1))
            k = keep.sum(-1)
            N = Us * keep.to(F.dtype).unsqueeze(-2)
            out.append(N @ N.mT)
    return torch.stack(out, 1)


def _union_projector(P1, P2):
    """The projector on ``range(P1) + range(P2)`` (two projectors [..., n, n] whose ranges
    are the same or one holds the other: their sum's eigenvalues are 2 or 1 there, 0 outside)."""
    w, V = torch.linalg.eigh(_sym(P1 + P2))
    return _sym((V * (w > 0.5).to(V.dtype).unsqueeze(-2)) @ V.mT)


def complete_kappa(K, S):
    """Kappa's coefficient ``K`` [..., n, n] (PSD, up to a positive factor) with the directions of
    ``range(S)`` (``S`` a projector: the directions known to be diffuse) that its range lacks
    added at ``2^-20`` (float32 ``2^-7``) of its largest eigenvalue: ``K``'s rank, which the
    precision reads (:func:`kalmanscan.dense.parallel.precision_of`), is then ``S``'s. A share
    below the rounding (two directions that ``F`` mixes, the second ``(0.6 / 1.1)^t`` of the
    first) is still kappa times a positive number, unbounded in the limit; its size is not
    representable, so the entries that only it reaches get a unit-free stand-in whose signs
    (the correlations :func:`kalmanscan.dense.parallel.cov_with_inf` reads) are its own.
    Unchanged where ``K``'s range is ``S``'s, but for the rows and columns of the coordinates
    that ``range(S)`` does not reach (``S_ii`` at most ``rank_tol``): 0, not their rounding
    (``eps |K|``, which beside a stand-in ``2^-20 |K|`` tilts the precision's complement by
    ``2^20 eps``: a finite coordinate's precision 1e-10 off)."""
    grade = 2.0**-20 if K.dtype == torch.float64 else 2.0**-7
    rt = rank_tol(K.dtype)
    out = (torch.diagonal(S, dim1=-2, dim2=-1) <= rt).to(K.dtype)
    keep = 1.0 - out
    K = K * keep.unsqueeze(-1) * keep.unsqueeze(-2)
    w, V = torch.linalg.eigh(_sym(K))
    on = (w > rt * torch.linalg.matrix_norm(K).unsqueeze(-1)).to(K.dtype)
    Pk = (V * on.unsqueeze(-2)) @ V.mT
    wm, Vm = torch.linalg.eigh(_sym(S - Pk))
    miss = (wm > 0.5).to(K.dtype)
    Pm = (Vm * miss.unsqueeze(-2)) @ Vm.mT
    top = w[..., -1].clamp_min(0.0)
    top = torch.where(top > 0, top, torch.ones_like(top))  # K = 0: the projector itself
    return _sym(K + (grade * top)[..., None, None] * Pm)


def filtered_output(model: Model, filt: Moments) -> Moments:
    """The filtered :class:`Moments` ``filt`` (:func:`filter_moments`) with kappa's coefficient
    completed along the directions that stay diffuse over the whole series
    (:func:`unresolved_directions`' ``Pu``, whose range holds their reach at each step) by
    :func:`filtered_kappa`: ``D D'`` loses the second of two directions that ``F`` mixes once its
    share falls below the rounding, and the precision along it was finite (the limit is 0).
    ``filt`` itself where no direction is diffuse at the last step (no work). For the outputs
    only: :func:`smooth_moments` takes ``filt`` as it is."""
    B, T, n = filt.mean.shape
    if filt.ndiffuse < T or not bool((filt.diffuse[:, -1].detach() != 0).any()):
        return filt
    # a lost series (filter_moments' NaN from the step past the range) as it is: its steps
    # before, with covariances up to the range, are not factored (as in _smooth_kept)
    lost = ~torch.isfinite(filt.cov.detach()).flatten(1).all(1)
    idx = (~lost).nonzero().squeeze(-1)
    if idx.numel() == 0:
        return filt
    sub, fs = model, filt
    if bool(lost.any()):
        sub = model._replace(**{k: v[idx] for k, v in model._asdict().items() if v is not None})
        fs = Moments(filt.mean[idx], filt.cov[idx], filt.diffuse[idx], filt.ndiffuse)
    Pu = unresolved_directions(sub, fs)[1]
    if Pu is None:
        return filt
    with torch.no_grad():
        R = _range_projector(Pu, torch.linalg.matrix_norm(Pu), rank_tol(Pu.dtype))[0]
    K = filtered_kappa(fs.diffuse, R)
    return filt._replace(diffuse=filt.diffuse.index_copy(0, idx, K) if bool(lost.any()) else K)


def filtered_kappa(K, R):
    """The filtered diffuse part's coefficient ``K`` [B, T, n, n] (PSD, up to a positive factor
    per step) completed on ``R`` [B, T, n, n], projectors on directions known to be diffuse at
    each step (those that no observation ever resolves: :func:`unresolved_directions`' or
    :func:`reach_projectors`' range). Still diffuse in the filter, they belong to ``K``'s range,
    but the filter carries ``K`` as a product whose columns ``F`` aligns: the second of two
    directions that it mixes falls below the rounding after about 26 steps (and a direction 3e-15
    of the largest eigenvalue is below :func:`~kalmanscan.dense.parallel.rank_tol`), and the
    precision (:func:`kalmanscan.dense.parallel.precision_of`, read off ``K``'s numerical range)
    was finite along it. ``K``'s range is ``Pk`` (the projector on its numerical range) with the
    part of ``R`` orthogonal to it (above ``_dif_tol``), taken as ``R`` plus the rest of that
    range orthogonal to ``R`` (a projector where ``R`` lies in it: ``R``'s directions kept as
    carried, not as ``K``'s eigenvectors); :func:`complete_kappa` adds what ``K`` lacks and zeroes
    the rows and columns that it does not reach (their rounding tilted the precision's
    complement: a finite coordinate beside a pair grown from ``1000 x0``, 3e-9 off). Unchanged at
    the steps where ``R`` is 0. The value only (the derivative ``K``'s)."""
    with torch.no_grad():
        Kd = _sym(K.detach())
        R = _sym(R.detach())
        n = K.shape[-1]
        Pk = _range_projector(Kd, torch.linalg.matrix_norm(Kd), rank_tol(K.dtype))[0]
        eye = torch.eye(n, dtype=K.dtype, device=K.device)
        # Pk with R's directions outside it (their part orthogonal to it above _dif_tol)
        Pc = eye - Pk
        wm, Vm = torch.linalg.eigh(_sym(Pc @ R @ Pc))
        Vm = Vm * (wm > _dif_tol(K.dtype)).to(K.dtype).unsqueeze(-2)
        S = Pk + Vm @ Vm.mT
        # then R with the rest of that range (a projector where R lies in it)
        Pc = eye - R
        wm, Vm = torch.linalg.eigh(_sym(Pc @ S @ Pc))
        Vm = Vm * (wm > 0.5).to(K.dtype).unsqueeze(-2)
        done = complete_kappa(Kd, _sym(R + Vm @ Vm.mT))
        has = torch.diagonal(R, dim1=-2, dim2=-1).sum(-1) > 0.5
        done = torch.where(has[..., None, None], done, Kd)
    return K + (done - K.detach())


def combine_rows(A, bb, filt: Moments, keep=None):
    """Smoothed (mean, cov) [B, T, ...] from backward rows ``|A x_t - bb|^2`` (A [B, T, k, n],
    bb [B, T, k, 1]: the likelihood of z_{t+1:T}) and the filtered moments (finite part and
    diffuse directions), by one QR of the stacked backward and prior rows (no information matrix
    inverted; :func:`smooth_moments`). ``keep`` [B, T, n, n]: the diffuse coordinates to solve
    for (:func:`unresolved_directions`; None: all, every direction then resolved). With
    autograd, the derivative w.r.t. a singular filtered covariance (an exact entry's step) comes
    from :func:`_singular_cov_tangent`."""
    if not filt.cov.requires_grad:
        return _combine_rows(A, bb, filt, keep)
    B, T, n = filt.mean.shape
    P = _sym(filt.cov)
    with torch.no_grad():
        ok = torch.isfinite(P).flatten(-2).all(-1)  # a lost series' NaN steps: as they are
        eye = torch.eye(n, dtype=P.dtype, device=P.device)
        w = torch.linalg.eigvalsh(torch.where(ok[..., None, None], P, eye))
        sing = ok & (w[..., 0] <= rank_tol(P.dtype) * w[..., -1].abs())
        sing[:, : min(filt.ndiffuse, T)] = False  # steps with diffuse directions: as they are
    if not bool(sing.any()):
        return _combine_rows(A, bb, filt, keep)
    # the factor's derivative at those steps dropped (P detached there), the tangent added
    cov = torch.where(sing[..., None, None], filt.cov.detach(), filt.cov)
    ms, Ps = _combine_rows(A, bb, filt._replace(cov=cov), keep)
    dms, dPs = _singular_cov_tangent(A, bb, filt.mean, P, sing)
    return ms + dms, Ps + dPs


def _combine_rows(A, bb, filt: Moments, keep=None):
    """:func:`combine_rows`' values (and derivatives, but for a singular filtered covariance)."""
    B, T, n = filt.mean.shape
    dtype, device = filt.mean.dtype, filt.mean.device
    eye = torch.eye(n, dtype=dtype, device=device)
    m = filt.mean
    M, flat = diffuse_factor(filt)  # [B, T, n, 2n]
    if keep is not None:  # the resolved diffuse coordinates only; the others stay at v = 0
        M = torch.cat([M[..., :n], M[..., n:] @ keep], -1)
        flat = ~(keep != 0).any(-2)
    prior = torch.zeros(B, T, 2 * n, 2 * n, dtype=dtype, device=device)
    prior[..., :n, :n] = eye
    prior[..., n:, n:] = torch.diag_embed(flat.to(dtype))
    Qf, Ru = torch.linalg.qr(torch.cat([A @ M, prior], -2), mode="reduced")
    k = A.shape[-2]
    y = Qf[..., :k, :].mT @ (bb - A @ m.unsqueeze(-1))  # the prior rows' right side is 0
    # Ru is upper triangular: an LU solve reads all of it (no pivoting happens), so autograd sees
    # every entry (the straight-through rows of _reduce_rows are not triangular in their gradient)
    X = torch.linalg.solve_ex(Ru.mT, M.mT)[0]  # [B, T, 2n, n]
    ms = m + (M @ torch.linalg.solve_ex(Ru, y)[0]).squeeze(-1)
    Ps = _sym(X.mT @ X)
    return ms, Ps


def _singular_cov_tangent(A, bb, m, P, sing):
    """Zero in value; the derivative w.r.t. a singular filtered covariance ``P`` of the smoothed
    moments at the steps ``sing`` [B, T] (no diffuse directions, smallest eigenvalue at most
    ``rank_tol`` of the largest: an exact entry's step).

    :func:`combine_rows` reads ``P`` through a factor ``L L' = P``: a change of ``P`` outside its
    range (towards a noisy entry) has no factor change of finite size (``sqrt``), so the factor's
    derivative misses it (d smoothed outputs / dR[0, 0] at ``R = diag(0, .)``: 26.8 against the
    true 34.1). There the derivative is taken from the covariance form :func:`_cov_form` as
    ``f(A, bb, m, P) - f(A, bb, m, P.detach())``: 0 in value, its derivatives (of every order)
    those of ``f`` that involve ``P``; the square-root path, with ``P`` detached at those steps,
    gives the rest."""
    Pmix = torch.where(sing[..., None, None], P, P.detach())
    ms1, Ps1 = _cov_form(A, bb, m, Pmix)
    ms0, Ps0 = _cov_form(A, bb, m, P.detach())
    return ms1 - ms0, _sym(Ps1 - Ps0)


def _cov_form(A, bb, m, P):
    """The smoothed moments in covariance form (derivatives only, :func:`_singular_cov_tangent`):
    ``ms = m + K (bb - A m)``, ``Ps = P - K A P``, ``K = P A' S^-1``, ``S = I + A P A'``."""
    k = A.shape[-2]
    S = _sym(torch.eye(k, dtype=P.dtype, device=P.device) + A @ P @ A.mT)
    K = torch.linalg.solve(S, A @ P).mT  # P A' S^-1  [B, T, n, k]
    ms = m + (K @ (bb - A @ m.unsqueeze(-1))).squeeze(-1)
    return ms, P - K @ A @ P


# former names (docs/architecture.md, "References")
filter_reference = filter_moments
smooth_reference = smooth_moments
