"""Batched Newton minimisation of many small independent objectives (one per series).

Notation: ``G`` independent problems (groups), ``k <= 4`` parameters each, ``u [G, k]``
unconstrained coordinates. ``fun(U [P, n, k], idx [n]) -> [P, n]`` evaluates the objectives of
groups ``idx`` at ``P`` points each in one batched call (for fitting: one filter call over
``P * n`` lanes). Derivatives come from a central-difference stencil of values, evaluated in one
such call: ``1 + 2k + 2 C(k, 2)`` points a group, i.e. the full gradient and Hessian for the price
of 7 (k = 2) to 21 (k = 4) log-likelihood lanes, with no autograd graph.

Each group takes its own Newton step (Hessian eigenvalues replaced by their absolute values,
floored) with its own backtracking line search; converged groups are frozen and drop out of the
batch, so a group's path does not depend on the other groups. Coordinates flagged ``positive``
are logs of parameters that are ``>= 0`` in the model: one below ``log(BOUNDARY)`` whose
objective still decreases towards ``-inf``, and for which no probe above it (1e-6, 1e-4, 1e-2) is
better, is declared at its boundary (0) and held there; the others converge on their own
(docs/performance-cpu.md, "Fitting").
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

BOUNDARY = 1e-8  # a positive parameter below this (in standardized units) may sit on its bound 0
_BOUND_TARGET = math.log(1e-14)  # where one heading for its bound is put (its effect ~1e-14)
_PROBES = tuple(math.log(v) for v in (1e-6, 1e-4, 1e-2))  # checks that a bound is the best
U_LIMIT = 230.0  # |u| beyond this (e^230 ~ 1e100 times the data scale): diverged, not identified
_STEP_CAP = 5.0  # largest Newton move in u per iteration (a factor e^5 in a positive parameter)
_CRAWL_EVERY = 10  # a group still running checks every this many iterations,
_CRAWL_FROM = 20  # from this iteration on (groups that converge sooner keep their paths),
_CRAWL_FALL = 0.05  # whether a positive coordinate fell by more than this in u over them
_CRAWL_GAIN = 1e-6  # while the objective fell by less than this relative to 1 + |f|

# status codes per group
RUNNING, CONVERGED, MAX_ITER, LINE_SEARCH, DIVERGED, NOT_FINITE, SETTLED = 0, 1, 2, 3, 4, 5, 6
STATUS_TEXT = {
    RUNNING: "not started",
    CONVERGED: "converged",
    MAX_ITER: "iteration limit reached",
    LINE_SEARCH: "no decrease along the Newton direction (line search failed)",
    DIVERGED: "a parameter ran off beyond 1e100 times the data scale (not identified)",
    NOT_FINITE: "log-likelihood not finite at the starting values",
    SETTLED: "stopped at a limit the caller recognized (its settled test)",
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


def derivatives(fv: np.ndarray, k: int, h):
    """``(f [n], g [n, k], H [n, k, k])`` from values ``fv [P, n]`` at :func:`stencil` points
    scaled by the steps ``h`` (one for all coordinates, or one a coordinate ``[k]``).

    Central differences, error ``O(h^2)``: ``g_j = (f(+e_j) - f(-e_j)) / 2h_j``,
    ``H_jj = (f(+e_j) - 2 f + f(-e_j)) / h_j^2``, and
    ``H_ij = (f(+e_i+e_j) + f(-e_i-e_j) - f(+e_i) - f(-e_i) - f(+e_j) - f(-e_j) + 2 f) / 2h_ih_j``
    (whose error has a term ``h_i h_j d4f/di2dj2 / 4``: a long step in a quadratic coordinate
    leaves it, :func:`_mixed_at`).
    """
    h = np.broadcast_to(np.asarray(h, dtype=np.float64), (k,))
    f0 = fv[0]
    n = fv.shape[1]
    plus, minus = fv[1 : 1 + 2 * k : 2], fv[2 : 2 + 2 * k : 2]  # [k, n]
    g = ((plus - minus) / (2 * h[:, None])).T
    H = np.empty((n, k, k))
    diag = (plus - 2 * f0 + minus) / (h * h)[:, None]
    for j in range(k):
        H[:, j, j] = diag[j]
    base = 1 + 2 * k
    for m, (i, j) in enumerate(itertools.combinations(range(k), 2)):
        pp, mm = fv[base + 2 * m], fv[base + 2 * m + 1]
        hij = (pp + mm - plus[i] - minus[i] - plus[j] - minus[j] + 2 * f0) / (2 * h[i] * h[j])
        H[:, i, j] = H[:, j, i] = hij
    return f0, g, H


def newton_direction(
    g: np.ndarray, H: np.ndarray, free: np.ndarray, quadratic: np.ndarray | None = None
) -> np.ndarray:
    """``d [n, k]`` minimizing the local model on the ``free [n, k]`` coordinates (others 0).

    The Hessian's eigenvalues are replaced by their absolute values, floored at 1e-8 of the largest
    (a descent direction where the Hessian is indefinite or nearly singular). Coordinates in which
    the objective is exactly quadratic (``quadratic [k]``: their curvature is exact, not a noisy
    difference) are first scaled to unit curvature where it is positive, so the floor judges
    them by their correlation with the others, not by their units: a weakly determined mean
    (curvature 1e-10 of the others') took floored steps 50 times too short, one Newton
    iteration each, for hundreds of iterations.
    """
    n, k = g.shape
    if quadratic is not None and np.any(quadratic):
        diag = np.diagonal(H, axis1=1, axis2=2)
        use = np.asarray(quadratic, bool)[None, :] & free & np.isfinite(diag) & (diag > 0)
        if use.any():
            sc = np.where(use, np.sqrt(np.where(use, diag, 1.0)), 1.0)  # [n, k]
            d = newton_direction(g / sc, H / (sc[:, :, None] * sc[:, None, :]), free)
            return d / sc
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


class _Crawl:
    """Groups crawling towards a bound along a curved valley, and the fits that end the crawl.

    An OU series that is nearly white noise: ``theta``, ``sigma2`` and ``obs_var`` trade at one
    lag-one correlation, and the likelihood rises, by 1e-8 over hundreds of iterations, as
    ``obs_var`` goes to 0. The valley curves in the coordinates and is narrow (its walls have
    unit curvature), so each Newton step bounces between the walls and advances a hundredth of
    a unit: 500 iterations, not converged, although the maximum is on the bound ``obs_var = 0``
    (and there well identified). Every ``_CRAWL_EVERY`` iterations from ``_CRAWL_FROM`` on, a
    group still running whose positive coordinate fell by more than ``_CRAWL_FALL`` over the
    last ones while the objective gained less than ``_CRAWL_GAIN`` is fitted with that
    coordinate on its bound (its target ``e^-32``; a :func:`minimize` of the other coordinates
    from where they are); where that fit converges lower than the group is, the group moves
    there and goes on from it (the bound then passes the usual probes, or is left)."""

    def __init__(self, G: int, k: int):
        self.u = np.zeros((G, k))  # where the group was at iteration ``at``
        self.f = np.zeros(G)
        self.at = np.full(G, -1, dtype=np.int64)

    def to_bounds(self, idx, u, f, n_iter, point, fun, positive, gtol, xtol, h, quadratic):
        """``[idx.size]`` bool: the groups moved (``point`` and ``n_iter`` updated in place;
        their stencil is taken there next)."""
        moved = np.zeros(idx.size, bool)
        ni = n_iter[idx]
        if ni.max(initial=0) < _CRAWL_FROM - _CRAWL_EVERY:  # (most fits: never)
            return moved
        fresh = (self.at[idx] < 0) & (ni >= _CRAWL_FROM - _CRAWL_EVERY)
        self._mark(idx[fresh], u, f, n_iter)
        due = np.flatnonzero((self.at[idx] >= 0) & (ni - self.at[idx] >= _CRAWL_EVERY))
        if due.size == 0:
            return moved
        b = idx[due]
        fall = self.u[b] - u[b]  # [n, k]
        slow = self.f[b] - f[b] < _CRAWL_GAIN * (1 + np.abs(f[b]))
        cand = positive[None, :] & (fall > _CRAWL_FALL) & slow[:, None] & (u[b] > _BOUND_TARGET)
        free = np.ones(b.size, bool)
        for j in np.flatnonzero(cand.any(0)):
            c = np.flatnonzero(cand[:, j] & free)
            if c.size == 0:
                continue
            free[c] = False
            g = b[c]
            keep = np.delete(np.arange(u.shape[1]), j)

            def on_bound(U, i, g=g, j=j):
                return fun(np.insert(U, j, _BOUND_TARGET, axis=-1), g[i])

            sub = minimize(
                on_bound, u[g][:, keep], positive[keep], max_iter=100, gtol=gtol, xtol=1e-3 * xtol,
                h=h[keep], quadratic=None if quadratic is None else np.asarray(quadratic)[keep],
            )  # fmt: skip
            ok = (sub.status == CONVERGED) & (sub.f < f[g] - 1e-13 * (1 + np.abs(f[g])))
            point[g[ok]] = np.insert(sub.u[ok], j, _BOUND_TARGET, axis=-1)
            n_iter[g[ok]] += sub.n_iter[ok]
            moved[due[c[ok]]] = True
        self._mark(b, u, f, n_iter)
        return moved

    def _mark(self, g, u, f, n_iter):
        self.u[g], self.f[g], self.at[g] = u[g], f[g], n_iter[g]


def held_covariances(Hu: np.ndarray, held: np.ndarray, usable: np.ndarray):
    """Inverse observed information with the estimates on their boundary held fixed.

    ``Hu [G, k, k]`` is the Hessian of the negative log-likelihood, ``held [G, k]`` marks the
    estimates on their boundary and ``usable [G]`` the groups to invert. Yields, per pattern of
    held estimates, ``(pattern, rows, keep, pd, cov)``: the groups ``rows`` with that pattern, the
    free indices ``keep``, which of them have a positive-definite block ``pd`` (eigenvalues above
    1e-12 of the largest) and, where any do, ``cov [pd.sum(), len(keep), len(keep)]``.

    >>> H = np.array([[[2.0, 0.0], [0.0, 4.0]]])
    >>> [(p.tolist(), c.tolist()) for p, _, _, _, c in held_covariances(H, np.array([[False, True]]), np.array([True]))]
    [([False, True], [[[0.5]]])]
    """  # noqa: E501
    for pattern in np.unique(held[usable], axis=0):
        rows = np.flatnonzero(usable & (held == pattern).all(1))
        keep = np.flatnonzero(~pattern)
        sub = Hu[rows][:, keep][:, :, keep]
        finite = np.isfinite(sub).all((1, 2))
        lam = np.full((rows.size, keep.size), np.nan)
        lam[finite] = np.linalg.eigvalsh(sub[finite])
        pd = finite & (lam.min(1) > 1e-12 * np.abs(lam).max(1))
        yield pattern, rows, keep, pd, (np.linalg.inv(sub[pd]) if pd.any() else None)


def minimize(
    fun,
    u0: np.ndarray,
    positive: np.ndarray,
    *,
    max_iter: int,
    gtol: float,
    xtol: float = 1e-5,
    h=1e-4,
    h_cross=None,
    active: np.ndarray | None = None,
    quadratic: np.ndarray | None = None,
    settled=None,
) -> NewtonResult:
    """Minimize ``G`` independent objectives from ``u0 [G, k]`` (see the module docstring).

    ``positive [k]``: coordinates that are logs of nonnegative parameters. ``h``: the stencil's
    step, one for all coordinates or one a coordinate ``[k]`` (an objective quadratic in a
    coordinate has exact differences at any step there, so a long one keeps its curvature above
    the objective's rounding); ``h_cross``: the steps of the mixed points of the Hessian returned
    for the converged groups (default ``h``; one that differs from ``h`` only in ``quadratic``
    coordinates), made again there from one more call (:func:`_mixed_at`). A quadratic
    coordinate's long step leaves an error ``h_i h_j d4f/di2dj2 / 4`` in its mixed terms (the
    standard errors 1.3e-4 off); a short one's rounding, on a million-step record, took the
    iterations from 19 to 47, so the iterations keep the long one.
    ``quadratic [k]``: coordinates in which the objective is exactly quadratic
    (:func:`newton_direction`). ``settled(idx [n], u [n, k], f [n]) -> [n] bool``:
    groups whose accepted point the caller recognizes as a limit the objective only approaches
    (a ridge to infinity); they stop there with status ``SETTLED``. ``active [G]``: groups to
    optimize (others are returned as they are, status RUNNING). A group converges when its gradient
    on the coordinates not at a boundary is at most ``gtol`` and its Newton step at most ``xtol``
    (both must hold, so a parameter drifting towards a bound with a vanishing gradient does not
    pass: it is either recognized at the boundary or keeps the group running), or, at the
    stencil's noise floor, when the gradient is within ``10 gtol`` and the decrease the Newton
    step promises is below ``1e-13 (1 + |f|)`` (nothing left to gain at rounding level).

    Each iteration is one stencil call at every running group's trial point ``u + d`` (the full
    Newton step): where its centre value passes the Armijo test the stencil is the next point's
    derivatives; elsewhere the step is halved with one-point calls and the stencil is taken at the
    accepted point in the next call.
    """
    u = np.array(u0, dtype=np.float64)
    G, k = u.shape
    h = np.broadcast_to(np.asarray(h, dtype=np.float64), (k,))
    hc = h if h_cross is None else np.broadcast_to(np.asarray(h_cross, dtype=np.float64), (k,))
    if h_cross is not None and np.any((hc != h) & ~np.asarray(quadratic, bool)):
        raise ValueError("h_cross: expected steps equal to h except in quadratic coordinates")
    offsets = stencil(k) * h
    f = np.full(G, np.nan)
    g = np.full((G, k), np.nan)
    H = np.full((G, k, k), np.nan)
    status = np.full(G, RUNNING)
    n_iter = np.zeros(G, dtype=np.int64)
    at_bound = np.zeros((G, k), dtype=bool)
    todo = np.ones(G, bool) if active is None else np.asarray(active, bool).copy()
    log_b = math.log(BOUNDARY)
    point = u.copy()  # where the next stencil is taken
    trial = np.zeros(G, bool)  # point = u + d awaiting the Armijo test (else point = u)
    d = np.zeros((G, k))
    slope = np.zeros(G)
    down = np.zeros((G, k), dtype=np.int64)  # consecutive Newton steps taking a coordinate down
    crawl = _Crawl(G, k)
    first = True
    while True:
        idx = np.flatnonzero(todo)
        if idx.size == 0:
            break
        fv = fun(point[idx][None] + offsets[:, None, :], idx)
        fi, gi, Hi = derivatives(fv, k, h)
        finite = np.isfinite(fv).all(0)
        # trial points: Armijo test on the centre value
        tr = trial[idx]
        slack = 1e-13 * np.abs(f[idx]) + 1e-300
        ok = ~tr | (finite & (fi <= f[idx] + 1e-4 * slope[idx] + slack))
        take = idx[ok]
        u[take], f[take], g[take], H[take] = point[take], fi[ok], gi[ok], Hi[ok]
        bad = take[~finite[ok]]  # no derivatives at an accepted point
        status[bad] = NOT_FINITE if first else LINE_SEARCH
        todo[bad] = False
        first = False
        back = idx[~ok]  # backtrack from t = 1/2 with one-point calls
        if back.size:
            t = np.full(back.size, 0.5)
            searching = np.ones(back.size, bool)
            for _ in range(60):
                s = np.flatnonzero(searching)
                if s.size == 0:
                    break
                b = back[s]
                pt = u[b] + t[s, None] * d[b]
                ft = fun(pt[None], b)[0]
                good = np.isfinite(ft) & (
                    ft <= f[b] + 1e-4 * t[s] * slope[b] + 1e-13 * np.abs(f[b]) + 1e-300
                )
                point[b[good]] = pt[good]
                searching[s[good]] = False
                t[s[~good]] *= np.where(np.isfinite(ft[~good]), 0.5, 0.1)
            status[back[searching]] = LINE_SEARCH
            todo[back[searching]] = False
            trial[back] = False  # the next call takes the stencil at the accepted point
        # new points with derivatives: convergence test and the next Newton step
        idx = take[todo[take]]
        if settled is not None and idx.size:
            st = np.asarray(settled(idx, u[idx], f[idx]), dtype=bool)
            status[idx[st]] = SETTLED
            todo[idx[st]] = False
            idx = idx[~st]
        if idx.size == 0:
            continue
        moved = crawl.to_bounds(idx, u, f, n_iter, point, fun, positive, gtol, xtol, h, quadratic)
        if moved.any():
            trial[idx[moved]] = False  # moved: the next stencil is at the new point
            idx = idx[~moved]
        if idx.size == 0:
            continue
        ui, gi, Hi = u[idx], g[idx], H[idx]
        bound = positive[None, :] & (ui < log_b) & (gi > -gtol)  # not clearly pushed back up
        # near 0 the log-space gradient vanishes whatever the slope, so a bound is accepted only
        # if no point above it is better: probe the bound coordinates at 1e-6, 1e-4 and 1e-2
        has = np.flatnonzero(bound.any(1))
        if has.size:
            probes = np.repeat(ui[has][None], len(_PROBES), 0)
            for p, v in enumerate(_PROBES):
                probes[p][bound[has]] = v
            fp = fun(probes, idx[has])
            best = np.argmin(np.where(np.isfinite(fp), fp, np.inf), 0)
            fb = fp[best, np.arange(has.size)]
            better = fb < f[idx[has]] - 1e-12 * (1 + np.abs(f[idx[has]]))
            moved = idx[has[better]]
            point[moved] = probes[best[better], np.flatnonzero(better)]
            down[moved] = 0
            bound[has[better]] = False
            keep = ~np.isin(idx, moved)  # their stencil is taken at the probe next
            idx, ui, gi, Hi, bound = idx[keep], ui[keep], gi[keep], Hi[keep], bound[keep]
        at_bound[idx] = bound
        di = newton_direction(np.where(np.isfinite(gi), gi, 0.0), Hi, ~bound, quadratic)
        gmax = np.where(bound, 0.0, np.abs(gi)).max(1)
        # the step is small, or (at the stencil's noise floor, where the gradient is still
        # within 10 gtol) the decrease the Newton step promises is below rounding
        flat = (gmax <= 10 * gtol) & (np.abs((gi * di).sum(1)) <= 1e-13 * (1 + np.abs(f[idx])))
        done = ((gmax <= gtol) & (np.abs(di).max(1) <= xtol)) | flat
        status[idx[done]] = CONVERGED
        diverged = ~done & (np.abs(ui) > U_LIMIT).any(1)
        status[idx[diverged]] = DIVERGED
        limit = ~done & ~diverged & (n_iter[idx] >= max_iter)
        status[idx[limit]] = MAX_ITER
        todo[idx[done | diverged | limit]] = False
        go = ~(done | diverged | limit)
        idx, ui, gi, Hi, di = idx[go], ui[go], gi[go], Hi[go], di[go]
        n_iter[idx] += 1
        di = di * np.minimum(1.0, _STEP_CAP / np.maximum(np.abs(di).max(1), 1e-300))[:, None]
        # a positive coordinate on which the objective is locally linear with a positive slope
        # (in u = log x: H_jj = g_j > 0) heads for its bound: try it there at once (Newton steps
        # in log space take one factor e^-1 an iteration there)
        # (or that three Newton steps in a row took down by more than half a unit)
        hjj = np.diagonal(Hi, axis1=1, axis2=2)
        linear = (gi > 0) & (np.abs(hjj - gi) <= 0.1 * gi)
        falling = positive[None, :] & (gi > 0) & (di < -0.5)
        down[idx] = np.where(falling, down[idx] + 1, 0)
        heading = falling & (linear | (down[idx] >= 3)) & (ui > log_b)
        jump = np.where(heading, _BOUND_TARGET - ui, di)
        di = np.where(((gi * jump).sum(1) < 0)[:, None], jump, di)
        d[idx], slope[idx] = di, (gi * di).sum(1)
        point[idx] = ui + di
        trial[idx] = True
    done = np.flatnonzero(status == CONVERGED)
    if done.size and np.any(hc != h):
        H[done] = _mixed_at(fun, u[done], f[done], H[done], done, h, hc)
    return NewtonResult(u, f, g, H, at_bound, status, n_iter)


def _mixed_at(fun, u, f0, H, idx, h, hc) -> np.ndarray:
    """``H [n, k, k]`` with the mixed terms of the coordinates whose ``hc`` differs from ``h``
    made again from points ``u ± (hc_i e_i + hc_j e_j)`` (one call), the second differences at
    those steps from ``H``'s diagonal (exact for a quadratic coordinate: ``H_ii hc_i^2``)."""
    n, k = u.shape
    pairs = [
        (i, j) for i, j in itertools.combinations(range(k), 2) if hc[i] != h[i] or hc[j] != h[j]
    ]
    if not pairs:
        return H
    U = np.empty((2 * len(pairs), n, k))
    for m, (i, j) in enumerate(pairs):
        e = np.zeros(k)
        e[i], e[j] = hc[i], hc[j]
        U[2 * m], U[2 * m + 1] = u + e, u - e
    fv = fun(U, idx)
    H = H.copy()
    diag = np.diagonal(H, axis1=1, axis2=2)  # [n, k]
    for m, (i, j) in enumerate(pairs):
        si, sj = diag[:, i] * hc[i] ** 2, diag[:, j] * hc[j] ** 2
        hij = (fv[2 * m] + fv[2 * m + 1] - si - sj - 2 * f0) / (2 * hc[i] * hc[j])
        H[:, i, j] = H[:, j, i] = hij
    return H
