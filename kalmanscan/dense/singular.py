"""Outputs where a covariance is singular: directions of the state known exactly.

A model with a zero prior variance and no process noise in some direction, a deterministic
component pinned by the data, or an entry with ``R = 0`` has a filtered or smoothed covariance
``P`` [..., n, n] with a null space ``N``: ``v' x`` is known exactly for ``v`` in ``N``. The
covariance is exact there (0); the precision is infinite, so the reported precision is the
entrywise limit of ``(P + eps I)^-1`` as ``eps -> 0``::

    precision = P^+ + inf * Pi_N     (+-inf where Pi_N[i, j] != 0, P^+[i, j] elsewhere)

``P^+`` the Moore-Penrose inverse, ``Pi_N`` the projector on ``N``. A coordinate known exactly
(``e_i`` in ``N``) has ``inf`` on its diagonal and 0 across its row and column, and its row and
column of ``cov`` are exactly 0: the scalar core's rule (``var`` 0, ``precision`` inf). Beside
diffuse directions (projector ``Pd``) the finite part is ``M = Pk P Pk``, ``Pk = I - Pd``, and
the precision keeps the diffuse limit (0 along ``Pd``).

Which directions are known is decided per connected component of the model's state coupling
(:func:`state_blocks`: states linked by ``F``, ``Q``, the prior or a shared observation): an
eigenvalue of the component's block of ``M`` at most ``rank_tol`` (64 eps) times its largest is
0, and where ``M`` is ``P`` with diffuse or already known directions projected out, at most
``rank_tol`` times ``P``'s largest entry (the smoother's rows on the native path: the
prediction's), whose rounding stays in ``M``. Rounding leaves a known direction about ``eps`` times
the block's size; a variance below that resolution has no correct digit in a coupled block, and its
reciprocal would be rounding noise (``+-1e16``). States that no matrix couples are their own
components, so a variance of 1e-18 beside one of 1 in a diagonal model stays a variance (precision
1e18), as in the scalar core. The smoothed covariance at step t is below the filtered one, so the
directions known after filtering are known after smoothing (``extra``).

The rule runs only in series where a direction can be known exactly at all (:func:`gate`: a
singular proper prior, an exact entry, a direction without process noise that F' maps to 0, or F
or Q varying in time), and there only on the steps :func:`screen` flags; elsewhere the precision
is the inverse as before, and the native kernel's check costs one predicted branch a step.
Derivation and examples: docs/dense.md ("Known directions").
"""

from __future__ import annotations

import numpy as np
import torch

from kalmanscan.dense._args import Model
from kalmanscan.dense.parallel import _scaled_solve, prior_start
from kalmanscan.dense.scan import _sym


def entry_tol(dtype) -> float:
    """An entry of the known projector ``Pi_N`` above this (``sqrt(eps)``: 1.5e-8 in float64,
    3.5e-4 in float32) in magnitude makes the precision's entry infinite (rounding leaves
    ``Pi_N``'s zero entries at about ``eps |P| / gap``); a diagonal entry above ``1 - entry_tol``
    marks the coordinate itself known."""
    return float(torch.finfo(dtype).eps) ** 0.5


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its broadcast (stride-0) axes cut to length 1."""
    st = t.stride()
    return t.as_strided([1 if k == 0 else m for m, k in zip(t.shape, st, strict=True)], st)


def _pattern(x: torch.Tensor | None) -> torch.Tensor | None:
    """[r, c] bool: the entries of the trailing two axes nonzero anywhere along the leading ones
    (broadcast, stride-0 axes read once)."""
    if x is None:
        return None
    c = _compact(x.detach())
    return (c != 0).reshape(-1, *c.shape[-2:]).any(0).cpu()


def state_blocks(model: Model) -> list[torch.Tensor]:
    """Index tensors of the connected components of the states' coupling graph: i ~ j where some
    ``F``, ``Q`` or prior entry links them (over all series and steps) or one observation entry,
    or two entries correlated by ``R``, see both."""
    n = model.F.shape[-1]
    A = torch.eye(n, dtype=torch.bool)
    for m in (model.F, model.Q, model.P0, model.L0):
        p = _pattern(m)
        if p is not None:
            A |= p | p.T
    H, R = _pattern(model.H).to(torch.float64), _pattern(model.R)
    R = (R | torch.eye(R.shape[0], dtype=torch.bool)).to(torch.float64)
    A |= (H.T @ R @ H) > 0
    reach = A.to(torch.float64)
    while True:
        nxt = ((reach @ reach) > 0).to(torch.float64)
        if torch.equal(nxt, reach):
            break
        reach = nxt
    blocks, seen = [], torch.zeros(n, dtype=torch.bool)
    for i in range(n):
        if not seen[i]:
            idx = torch.nonzero(reach[i] > 0).flatten()
            seen[idx] = True
            blocks.append(idx)
    return blocks


def _flagged(M: np.ndarray, tol: float) -> np.ndarray:
    """[k] bool: PSD matrices M [k, n, n] (float64 numpy) that :func:`screen`'s bound flags or
    that do not invert."""
    n = M.shape[-1]
    try:
        inv = np.linalg.inv(M)
    except np.linalg.LinAlgError:  # some M singular: one at a time
        return np.array([bool(_flagged(m[None], tol)[0]) if _invertible(m) else True for m in M])
    dm = np.abs(np.diagonal(M, axis1=-2, axis2=-1)).max(-1)
    di = np.abs(np.diagonal(inv, axis1=-2, axis2=-1)).max(-1)
    return ~(dm * di < 1.0 / (tol * n * n))


def _invertible(m: np.ndarray) -> bool:
    try:
        np.linalg.inv(m)
        return True
    except np.linalg.LinAlgError:
        return False


def gate(model: Model, tol: float) -> torch.Tensor:
    """[B] bool: the series in which a direction may be known exactly, where the rule runs (the
    native kernel's test, ``series_screen``): F or Q varying in time; a direction that F' and Q
    both map to 0 (``F F' + Q`` flagged by :func:`screen`: with a prior known nowhere and no
    exact entry, the directions known at step t are ``null(Q) ∩ F'^-1(known at t - 1)``, empty
    for all t unless that intersection is not); a proper prior covariance flagged by the screen;
    an exact entry (R flagged by the screen, which every R with a zero pivot in ``R = L Dg L'``
    meets). Elsewhere no direction is known and the precision is the inverse, however
    ill-conditioned. A proper series batched beside partly diffuse ones (``model.P0inf``) is
    judged on its covariance as given, as alone. On the compact (broadcast axes cut) matrices,
    in numpy: they are small."""
    B, dev = model.z.shape[0], model.z.device
    F, Q = _compact(model.F), _compact(model.Q)
    if F.shape[1] > 1 or Q.shape[1] > 1:
        return torch.ones(B, dtype=torch.bool, device=dev)
    np64 = lambda t: _compact(t).detach().to("cpu", torch.float64).numpy()  # noqa: E731
    F, Q = np64(model.F)[:, 0], np64(model.Q)[:, 0]
    sym = lambda x: 0.5 * (x + np.swapaxes(x, -1, -2))  # noqa: E731
    on = np.broadcast_to(_flagged(sym(F @ np.swapaxes(F, -1, -2) + Q), tol), (B,))
    if model.P0 is not None:
        on = on | np.broadcast_to(_flagged(sym(np64(model.P0)), tol), (B,))
    elif model.P0inf is not None:  # prior_cov as given, inf on some series' diagonals
        on = on | np.broadcast_to(_flagged(_finite_part(model, np64, sym), tol), (B,))
    elif model.L0 is not None and bool(model.L0.any()):  # not fully diffuse
        L0 = sym(np64(model.L0))
        w = np.linalg.eigvalsh(L0)
        top = np.abs(L0).max((-1, -2), keepdims=True)  # the Frobenius norm without overflow
        top = np.where(top > 0, top, 1.0)
        proper = w[:, 0] > tol * top[:, 0, 0] * np.sqrt(((L0 / top) ** 2).sum((-1, -2)))
        on = on | np.broadcast_to(proper & _flagged(L0, tol), (B,))
        # partly diffuse: its finite part, as the kernel judges it
        on = on | np.broadcast_to(~proper & _flagged(_finite_part(model, np64, sym), tol), (B,))
    R = np64(model.R)
    if R.shape[-1] == 1:
        exact = R[..., 0, 0] <= 0
    else:  # a zero pivot of R = L Dg L' (the kernel's test) makes cond(R) infinite
        exact = _flagged(sym(R.reshape(-1, *R.shape[-2:])), tol).reshape(R.shape[:2])
    on = on | np.broadcast_to(exact.reshape(R.shape[0], -1).any(-1), (B,))
    return torch.from_numpy(np.ascontiguousarray(on)).to(dev)


def _finite_part(model: Model, np64, sym) -> np.ndarray:
    """[B, n, n] the prior's finite part with its diffuse directions at the part's scale
    (:func:`~kalmanscan.dense.parallel.prior_start`'s ``P + max|P| D D'``, ``D D'`` alone where
    ``P`` is 0), singular where a direction of the finite part is known exactly beside diffuse
    ones (the native kernel's ``series_screen`` forms the same matrix); a proper series' (no
    diffuse direction) its covariance."""
    Pf, D = (sym(np64(x)) for x in prior_start(model))
    top = np.abs(Pf).max((-1, -2), keepdims=True)
    return Pf + np.where(top > 0, top, 1.0) * (D @ np.swapaxes(D, -1, -2))


def screen(M: torch.Tensor, Minv: torch.Tensor, tol: float) -> torch.Tensor:
    """[...] bool: the PSD matrices ``M`` [..., n, n] (with their computed inverses ``Minv``) that
    may have a direction :func:`known_outputs` calls known. ``cond(M) >= 1/tol`` implies
    ``max diag(M) max diag(Minv) >= 1/(tol n^2)``; a non-finite inverse (a singular M's LU puts
    inf or NaN on its diagonal) is flagged too, and so is one that its diagonals show is not
    positive definite (a negative one in M, or one not positive in its inverse: a covariance
    that is all rounding, where the bound does not hold). Cheap: the rule runs on the flagged
    rows only (the native kernel flags with the same bound, ``near_singular``, and where its
    Cholesky factorization fails)."""
    n = M.shape[-1]
    dgm = torch.diagonal(M, dim1=-2, dim2=-1)
    dgi = torch.diagonal(Minv, dim1=-2, dim2=-1)
    dm, di = dgm.abs().amax(-1), dgi.abs().amax(-1)
    indefinite = (dgm < 0).any(-1) | ~(dgi > 0).all(-1)
    return ~(dm * di < 1.0 / (tol * n * n)) | indefinite  # NaN or inf in the inverse: flagged


def known_outputs(P, Pd, blocks, tol, extra=None, allow=None, ref=None):
    """The rule of this module on rows of finite covariances.

    P [r, n, n] the finite part, Pd [r, n, n] the projector on the diffuse directions (None: none),
    extra [r, n, n] a projector on directions known beforehand (None: none), allow [r] bool the
    rows where a direction may be known (None: all; elsewhere the blockwise inverse), ref
    [r, n, n] a covariance the rows were computed from (None: none), whose rounding they carry:
    the smoother's rows that of the prediction. Returns
    (precision [r, n, n] with +-inf entries, known projector Pi_N [r, n, n], known [r] bool:
    some direction is known, coord [r, n] bool: coordinates known exactly). Differentiable in P
    away from the decisions."""
    r = P.shape[0]
    prec = torch.zeros_like(P)
    PiN = torch.zeros_like(P)
    anyk = torch.zeros(r, dtype=torch.bool, device=P.device)
    for ix in blocks:
        ix = ix.to(P.device)
        k = ix.numel()
        eye = torch.eye(k, dtype=P.dtype, device=P.device)
        Pb = P[:, ix][:, :, ix]
        Pdb = None if Pd is None else Pd[:, ix][:, :, ix]
        Pk = eye if Pdb is None else eye - Pdb
        Mb = Pb if Pdb is None else Pk @ Pb @ Pk
        if extra is not None:
            Ek = eye - extra[:, ix][:, :, ix]
            Mb = Ek @ Mb @ Ek
        Mb = _sym(Mb)
        with torch.no_grad():
            dg = torch.diagonal(Mb, dim1=-2, dim2=-1)
            tau = dg.amax(-1)
            tau = torch.where((tau > 0) & torch.isfinite(tau), tau, torch.ones_like(tau))
            # M is P with the diffuse (or already known) directions projected out, and P's
            # rounding, eps times its largest entry, is left in M: where M is all rounding (an
            # exact entry at a diffuse step, a smoothed block whose every direction the filter
            # knew) M has no scale of its own and P's largest entry stands for it (an entry, not
            # a variance: a covariance all rounding is not PSD, its diagonal can be 0)
            eps = torch.finfo(Mb.dtype).eps
            top = torch.zeros_like(tau)
            if Pdb is not None or extra is not None:
                top = Pb.detach().abs().amax((-1, -2))
            if ref is not None:
                top = torch.maximum(top, ref[:, ix][:, :, ix].detach().abs().amax((-1, -2)))
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            wd = torch.maximum(tau, top)[:, None, None]  # the diffuse directions stay large
            A = Mb.detach() + (0.0 if Pdb is None else wd * Pdb)
            w, U = torch.linalg.eigh(A)
            # the block's rounding is at least its most negative eigenvalue (a PSD matrix's),
            # which stands for a scale of |w_min| / eps: a block that is all rounding (every
            # direction known, an ARMA form with R = 0) has an indefinite residue whose largest
            # eigenvalue is no scale at all
            scale = torch.maximum(torch.maximum(w[..., -1:], -w[..., :1] / eps), top[:, None])
            small = w <= tol * scale
            if allow is not None:
                # outside the gate a direction is known only where the block is singular to
                # rounding (no inverse exists): the covariance form's update can round an
                # observed direction's variance to exactly 0 (a local linear trend at obs_var
                # 1e-16), where the blockwise inverse raised LinAlgError
                sing = w <= k * eps * scale
                small = small & (allow.unsqueeze(-1) | sing)
            small = small.to(P.dtype)
            Nb = _sym((U * small.unsqueeze(-2)) @ U.transpose(-1, -2))
            if extra is not None:  # the directions known beforehand stay known, even where
                # the rest of the block is all rounding (no scale to find them by)
                we, Ue = torch.linalg.eigh(Nb + extra[:, ix][:, :, ix])
                small = (we > 0.5).to(P.dtype)
                Nb = _sym((Ue * small.unsqueeze(-2)) @ Ue.transpose(-1, -2))
            # the known directions' weight in the solve at least twice the most negative
            # eigenvalue, so that no known direction's tau + w is 0
            tau = torch.maximum(tau, -2.0 * w[..., 0])
        tau = tau[:, None, None]
        add = Nb if Pdb is None else Nb + Pdb
        X = _scaled_solve(_sym(Mb + tau * add), eye.expand(r, k, k))
        Ff = Pk - Nb
        Lb = _sym(Ff @ X @ Ff)
        if Pdb is not None:  # a diffuse coordinate: precision 0 across its row and column
            dc = torch.diagonal(Pdb, dim1=-2, dim2=-1) > 1.0 - entry_tol(P.dtype)
            Lb = torch.where(dc.unsqueeze(-1) | dc.unsqueeze(-2), torch.zeros_like(Lb), Lb)
        rows = ix.unsqueeze(-1), ix.unsqueeze(0)
        prec[(slice(None), *rows)] = Lb
        PiN[(slice(None), *rows)] = Nb
        anyk |= small.sum(-1) > 0
    etol = entry_tol(P.dtype)
    coord = torch.diagonal(PiN, dim1=-2, dim2=-1) > 1.0 - etol
    cross = coord.unsqueeze(-1) | coord.unsqueeze(-2)
    prec = torch.where(cross, torch.zeros_like(prec), prec)
    inf = torch.full_like(PiN, float("inf")).copysign(PiN)
    prec = torch.where(PiN.abs() > etol, inf, prec)
    return prec, PiN, anyk, coord


def apply(cov, prec, rows, P, Pd, blocks, tol, extra=None, allow=None, ref=None):
    """``cov``, ``prec`` [B, T, n, n] with the rule applied at ``rows`` ([B, T] bool; ``P``,
    ``Pd``, ``extra`` [B, T, n, n] or None: the finite parts, diffuse projectors and directions
    known beforehand there; ``allow`` [B] bool the series where a direction may be known,
    :func:`gate`, None: all; ``ref`` [B, T, n, n] or None: as in :func:`known_outputs`). The
    rows take the rule's precision (the inverse, blockwise and diagonally scaled, where nothing
    is known), and their known coordinates a zero row and column of ``cov``. Returns (cov, prec,
    PiN [B, T, n, n]: the known projectors, 0 elsewhere)."""
    PiN_all = torch.zeros_like(prec)
    rows = rows.clone()
    rows[rows.clone()] = torch.isfinite(P[rows].detach()).all(-1).all(-1)  # NaN moments: as is
    if not bool(rows.any()):
        return cov, prec, PiN_all
    sel = lambda x: None if x is None else x[rows]  # noqa: E731
    al = None if allow is None else allow.unsqueeze(1).expand(rows.shape)[rows]
    p, PiN, _, coord = known_outputs(sel(P), sel(Pd), blocks, tol, sel(extra), al, sel(ref))
    cross = coord.unsqueeze(-1) | coord.unsqueeze(-2)
    c = cov[rows]
    # the finite part without its known directions: rounding (of either sign) along them is
    # not kept, so cov is PSD and 0 along every direction the precision calls known
    Fk = torch.eye(PiN.shape[-1], dtype=PiN.dtype, device=PiN.device) - PiN
    kept = _sym(Fk @ sel(P) @ Fk)
    kept = c + torch.where(torch.isfinite(c), kept - c, torch.zeros_like(c)).detach()  # c's grad
    c = torch.where(torch.isfinite(c) & (PiN != 0).any(-1).any(-1)[:, None, None], kept, c)
    c = torch.where(cross, torch.zeros_like(c), c)
    prec, cov = prec.clone(), cov.clone()
    prec[rows] = p
    cov[rows] = c
    PiN_all[rows] = PiN
    return cov, prec, PiN_all
