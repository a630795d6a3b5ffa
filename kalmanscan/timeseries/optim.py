"""Batched Newton minimisation of many small independent objectives (one per series).

Notation: ``G`` independent problems (groups), ``k <= 4`` parameters each, ``u [G, k]``
unconstrained coordinates. ``fun(U [P, n, k], idx [n]) -> [P, n]`` evaluates the objectives of
groups ``idx`` at ``P`` points each in one batched call (for fitting: one filter call over
``P * n`` lanes). Derivatives come from a central-difference stencil of values, evaluated in one
such call: ``1 + 2k + 2 C(k, 2)`` points a group, i.e. the full gradient and Hessian for the price
of 7 (k = 2) to 21 (k = 4) log-likelihood lanes, with no autograd graph.

Each group takes its own Newton step (Hessian eigenvalues replaced by their absolute values, floored)
with its own backtracking line search; converged groups are frozen and drop out of the batch, so
a group's path does not depend on the other groups. Coordinates flagged ``positive`` are logs of
parameters that are ``>= 0`` in the model: one that falls below ``log(BOUNDARY)`` while the
objective still decreases towards ``-inf`` is declared at its boundary (0) and held there; the
others converge on their own (derivation and criteria: docs/model.md, "Estimation").
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

BOUNDARY = 1e-8  # a positive parameter below this (in standardized units) may sit on its bound 0
U_LIMIT = 230.0  # |u| beyond this (e^230 ~ 1e100 times the data scale): diverged, not identified
_STEP_CAP = 5.0  # largest Newton move in u per iteration (a factor e^5 in a positive parameter)

# status codes per group
RUNNING, CONVERGED, MAX_ITER, LINE_SEARCH, DIVERGED, NOT_FINITE = 0, 1, 2, 3, 4, 5
STATUS_TEXT = {
    RUNNING: "not started",
    CONVERGED: "converged",
    MAX_ITER: "iteration limit reached",
    LINE_SEARCH: "no decrease along the Newton direction (line search failed)",
    DIVERGED: "a parameter ran off beyond 1e100 times the data scale (not identified)",
    NOT_FINITE: "log-likelihood not finite at the starting values",
}


class NewtonResult(NamedTuple):
    """``u [G, k]``, objective ``f [G]``, gradient ``g [G, k]`` and Hessian ``H [G, k, k]`` at
    ``u`` (stencil estimates), ``at_boundary [G, k]``, ``status [G]`` (codes above), ``n_iter
    [G]``."""

    u: np.ndarray
    f: np.ndarray
    g: np.ndarray
    H: np.ndarray
    at_boundary: np.ndarray
    status: np.ndarray
    n_iter: np.ndarray


def stencil(k: int) -> np.ndarray:
    """Offsets ``[P, k]`` (in units of the step h): centre, ``±e_j``, ``±(e_i + e_j)``."""
    pts = [np.zeros(k)]
    for j in range(k):
        for s in (1.0, -1.0):
            e = np.zeros(k)
            e[j] = s
            pts.append(e)
    for i, j in itertools.combinations(range(k), 2):
        for s in (1.0, -1.0):
            e = np.zeros(k)
            e[i] = e[j] = s
            pts.append(e)
    return np.stack(pts)


def derivatives(fv: np.ndarray, k: int, h: float):
    """``(f [n], g [n, k], H [n, k, k])`` from values ``fv [P, n]`` at :func:`stencil` points.

    Central differences, error ``O(h^2)``: ``g_j = (f(+e_j) - f(-e_j)) / 2h``,
    ``H_jj = (f(+e_j) - 2 f + f(-e_j)) / h^2``, and
    ``H_ij = (f(+e_i+e_j) + f(-e_i-e_j) - f(+e_i) - f(-e_i) - f(+e_j) - f(-e_j) + 2 f) / 2h^2``.
    """
    f0 = fv[0]
    n = fv.shape[1]
    plus, minus = fv[1 : 1 + 2 * k : 2], fv[2 : 2 + 2 * k : 2]  # [k, n]
    g = ((plus - minus) / (2 * h)).T
    H = np.empty((n, k, k))
    diag = (plus - 2 * f0 + minus) / (h * h)
    for j in range(k):
        H[:, j, j] = diag[j]
    base = 1 + 2 * k
    for m, (i, j) in enumerate(itertools.combinations(range(k), 2)):
        pp, mm = fv[base + 2 * m], fv[base + 2 * m + 1]
        hij = (pp + mm - plus[i] - minus[i] - plus[j] - minus[j] + 2 * f0) / (2 * h * h)
        H[:, i, j] = H[:, j, i] = hij
    return f0, g, H


def newton_direction(g: np.ndarray, H: np.ndarray, free: np.ndarray) -> np.ndarray:
    """``d [n, k]`` minimizing the local model on the ``free [n, k]`` coordinates (others 0).

    The Hessian's eigenvalues are replaced by their absolute values, floored at 1e-8 of the largest
    (a descent direction where the Hessian is indefinite or nearly singular).
    """
    n, k = g.shape
    eye = np.eye(k)
    mask = free[:, :, None] & free[:, None, :]
    Hr = np.where(mask, H, 0.0) + np.where(free, 0.0, 1.0)[:, :, None] * eye
    Hr = 0.5 * (Hr + np.swapaxes(Hr, 1, 2))
    Hr = np.where(np.isfinite(Hr), Hr, 0.0)
    lam, V = np.linalg.eigh(Hr)
    lam = np.abs(lam)
    lam = np.maximum(lam, np.maximum(1e-8 * lam.max(1, keepdims=True), 1e-300))
    gr = np.where(free, g, 0.0)
    d = -np.einsum("nij,nj,nkj,nk->ni", V, 1.0 / lam, V, gr)
    return np.where(free, d, 0.0)


def minimize(
    fun,
    u0: np.ndarray,
    positive: np.ndarray,
    *,
    max_iter: int,
    gtol: float,
    xtol: float = 1e-7,
    h: float = 1e-4,
    active: np.ndarray | None = None,
) -> NewtonResult:
    """Minimize ``G`` independent objectives from ``u0 [G, k]`` (see the module docstring).

    ``positive [k]``: coordinates that are logs of nonnegative parameters. ``active [G]``: groups to
    optimize (others are returned as they are, status RUNNING). A group converges when its gradient
    on the coordinates not at a boundary is at most ``gtol`` and its Newton step at most ``xtol``
    (both must hold, so a parameter drifting towards a bound with a vanishing gradient does not
    pass: it is either recognized at the boundary or keeps the group running).
    """
    u = np.array(u0, dtype=np.float64)
    G, k = u.shape
    offsets = stencil(k) * h
    f = np.full(G, np.nan)
    g = np.full((G, k), np.nan)
    H = np.full((G, k, k), np.nan)
    status = np.full(G, RUNNING)
    n_iter = np.zeros(G, dtype=np.int64)
    at_bound = np.zeros((G, k), dtype=bool)
    todo = np.ones(G, bool) if active is None else np.asarray(active, bool).copy()
    log_b = math.log(BOUNDARY)
    for it in range(max_iter + 1):
        idx = np.flatnonzero(todo)
        if idx.size == 0:
            break
        ui = u[idx]
        fv = fun(ui[None] + offsets[:, None, :], idx)
        fi, gi, Hi = derivatives(fv, k, h)
        f[idx], g[idx], H[idx] = fi, gi, Hi
        bad = ~np.isfinite(fv).all(0)
        # a positive coordinate below the boundary threshold whose value still falls towards 0
        bound = positive[None, :] & (ui < log_b) & (gi >= 0)
        at_bound[idx] = bound
        d = newton_direction(np.where(np.isfinite(gi), gi, 0.0), Hi, ~bound)
        gmax = np.where(bound, 0.0, np.abs(gi)).max(1)
        done = ~bad & (gmax <= gtol) & (np.abs(d).max(1) <= xtol)
        status[idx[done]] = CONVERGED
        status[idx[bad]] = NOT_FINITE if it == 0 else LINE_SEARCH
        stop = done | bad
        if it == max_iter:
            status[idx[~stop]] = MAX_ITER
            break
        todo[idx[stop]] = False
        keep = ~stop
        idx, ui, fi, gi, d = idx[keep], ui[keep], fi[keep], gi[keep], d[keep]
        if idx.size == 0:
            break
        n_iter[idx] += 1
        big = np.abs(d).max(1)
        d = d * np.minimum(1.0, _STEP_CAP / np.maximum(big, 1e-300))[:, None]
        slope = (gi * d).sum(1)
        t = np.ones(idx.size)
        new_u, new_f = ui.copy(), fi.copy()
        searching = np.ones(idx.size, bool)
        for _ in range(60):
            s = np.flatnonzero(searching)
            if s.size == 0:
                break
            trial = ui[s] + t[s, None] * d[s]
            ft = fun(trial[None], idx[s])[0]
            slack = 1e-13 * np.abs(fi[s]) + 1e-300
            ok = np.isfinite(ft) & (ft <= fi[s] + 1e-4 * t[s] * slope[s] + slack)
            new_u[s[ok]], new_f[s[ok]] = trial[ok], ft[ok]
            searching[s[ok]] = False
            t[s[~ok]] *= np.where(np.isfinite(ft[~ok]), 0.5, 0.1)
        failed = searching
        # a positive coordinate heading for its bound: try it there at once
        # (the Newton step in log space would take one factor e^-1 an iteration)
        heading = ~failed[:, None] & positive[None, :] & (d < -0.5) & (new_u > log_b)
        j = np.flatnonzero(heading.any(1))
        if j.size:
            jump = new_u[j].copy()
            jump[heading[j]] = log_b - 1.0
            fj = fun(jump[None], idx[j])[0]
            ok = np.isfinite(fj) & (fj <= new_f[j])
            new_u[j[ok]], new_f[j[ok]] = jump[ok], fj[ok]
        u[idx] = new_u
        diverged = (np.abs(new_u) > U_LIMIT).any(1)
        status[idx[failed]] = LINE_SEARCH
        status[idx[diverged & ~failed]] = DIVERGED
        todo[idx[failed | diverged]] = False
    return NewtonResult(u, f, g, H, at_bound, status, n_iter)
