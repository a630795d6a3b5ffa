"""One-sided profile-likelihood bounds for estimates on their boundary.

Where a maximum-likelihood estimate of ``theta``, ``sigma2`` or ``obs_var`` sits on its lower
bound 0, the normal approximation behind a standard error does not hold: the likelihood is
one-sided. What :func:`kalmanscan.fit_ou` reports instead is the one-sided upper bound ``b`` at
``level`` (default 95%): the value at which the profile log-likelihood (maximized over the other
free parameters with this one fixed) has fallen by ``chi2_1(2 level - 1) / 2`` from its maximum,
1.353 at 95%. Under the null hypothesis "the parameter is 0", the likelihood-ratio statistic is
the 50:50 mixture of chi2_0 and chi2_1 (Self & Liang 1987; the chi-bar-squared rule), whose upper
``1 - level`` point is that chi2_1 quantile; ``[0, b]`` is the set of values the data do not
reject at ``1 - level`` one-sided. Derivation and examples: docs/model.md, "Estimates on a
boundary".

Each profile point is a fit of the other parameters by the batched Newton method of
:func:`kalmanscan.timeseries.fit._fit_core` (all boundary series of a fit in one batch, warm
started from the previous point); the bound is found on ``log b`` by a bracket of decades followed
by regula falsi (Illinois), to 1e-3 in the log-likelihood drop.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from kalmanscan.timeseries._messages import unnamed

_POSITIVE = ("theta", "sigma2", "obs_var")
_GRID = tuple(10.0**k for k in range(-6, 7))  # standardized units: times the data's scale**2
_ITERS = 30
_MAX_ITER = 100  # per profile fit (warm started; a fit that needs more gives no bound)


def drop_for(level: float) -> float:
    """Log-likelihood drop of the one-sided ``level`` bound: ``chi2_1(2 level - 1) / 2``.

    >>> round(drop_for(0.95), 4)
    1.3528
    """
    q = NormalDist().inv_cdf(level)  # chi2_1 quantile at 2 level - 1 is q**2
    return 0.5 * q * q


def _natural(p, x, core, sel):
    """Standardized ``x`` of parameter ``p`` in natural units for the series ``sel``."""
    s, tau = core.s[sel], core.tau
    return {"theta": x / tau, "sigma2": x * s**2 / tau, "obs_var": x * s**2}[p]


def upper_bounds(core, Z, dt, fixed_flat, free, joint, max_iter, tol, backend, device, level=0.95):
    """``{name: [G] upper bound}`` (NaN where the estimate is interior or its fit unusable;
    ``inf`` where the likelihood stays within the drop up to 1e6 times the data's scale) for
    every positive free parameter of :func:`kalmanscan.fit_ou`'s result ``core`` at its bound.

    ``Z [T, N]``, ``dt [T]``, ``fixed_flat``, ``free``, ``joint`` and the options are those the
    fit ran with. The profile fits reuse the fit's optimizer and standardization unchanged.
    """
    from kalmanscan.timeseries import optim
    from kalmanscan.timeseries.fit import _fit_core

    target = drop_for(level)
    opt = core.opt
    G = opt.u.shape[0]
    out = {}
    ok_group = (opt.status == optim.CONVERGED) & (core.usable[:1] if joint else core.usable)
    for j, p in enumerate(free):
        if p not in _POSITIVE:
            continue
        on = opt.at_boundary[:, j] & ok_group
        bound = np.full(G, np.nan)
        out[p] = bound
        if p == "sigma2" and core.white is not None:
            # white noise: at any sigma2, theta -> infinity reaches the same likelihood (the
            # state's variance sigma2 / (2 theta) -> 0), so the profile never drops: unbounded
            bound[on & core.white] = np.inf
            on &= ~core.white
        groups = np.flatnonzero(on)
        if groups.size == 0:
            continue
        sel = np.arange(Z.shape[1]) if joint else groups  # series of those groups
        others = [q for q in free if q != p]
        ll_hat = core.loglik[sel].sum(keepdims=True) if joint else core.loglik[sel]
        init = {q: core.est[q][sel] for q in others}

        def drop(x, init=init, sel=sel, p=p, others=others, ll_hat=ll_hat):
            """Log-likelihood drop ``[g]`` at standardized ``x [g]`` and the others' estimates."""
            xs = np.broadcast_to(x[:1], sel.shape) if joint else x
            fx = {q: v[sel] for q, v in fixed_flat.items()}
            fx[p] = _natural(p, xs, core, sel)
            res = _fit_core(
                Z[:, sel], dt, fx, others, init, joint, min(max_iter, _MAX_ITER), tol, backend,
                device,
            )  # fmt: skip
            ll = res.loglik.sum(keepdims=True) if joint else res.loglik
            good = res.opt.status == optim.CONVERGED
            good = np.broadcast_to(good[:1], ll.shape) if joint else good
            est = {q: res.est[q] for q in others}
            return np.where(good, ll_hat - ll, np.nan), est

        g = groups.size
        lo = np.full(g, np.nan)  # log10 x with drop < target
        hi = np.full(g, np.nan)  # log10 x with drop >= target
        d_lo = np.zeros(g)
        d_hi = np.full(g, np.nan)
        open_ = np.ones(g, bool)
        failed = np.zeros(g, bool)  # a profile fit did not converge: no bound
        for x in _GRID:  # bracket by decades, warm starts along the way
            if not open_.any():
                break
            d, est = drop(np.full(g, x))
            crossed = open_ & (d >= target)
            hi[crossed], d_hi[crossed] = math.log10(x), d[crossed]
            below = open_ & (d < target)
            lo[below], d_lo[below] = math.log10(x), np.maximum(d[below], 0.0)
            failed |= open_ & ~np.isfinite(d)
            open_ &= ~crossed & np.isfinite(d)
            for q in others:
                init[q] = np.where(np.isfinite(est[q]), est[q], init[q])
        first = math.log10(_GRID[0])
        lo = np.where(np.isnan(lo) & np.isfinite(hi), first - 2.0, lo)  # crossed at the first
        d_lo = np.where(lo == first - 2.0, 0.0, d_lo)
        side = np.zeros(g)
        todo = np.isfinite(lo) & np.isfinite(hi)
        est_x = np.where(todo, hi, np.where(np.isfinite(lo), np.inf, np.nan))  # log10 x
        err = np.where(todo, np.abs(d_hi - target), np.inf)
        for _ in range(_ITERS):  # Illinois on log10 x
            if not todo.any():
                break
            with np.errstate(invalid="ignore", divide="ignore"):
                w = (target - d_lo) / (d_hi - d_lo)
            w = np.clip(np.where(np.isfinite(w), w, 0.5), 0.02, 0.98)
            mid = np.where(todo, lo + w * (hi - lo), first)
            d, est = drop(10.0**mid)
            failed |= todo & ~np.isfinite(d)
            todo &= np.isfinite(d)
            d = np.where(np.isfinite(d), d, target)
            closer = todo & (np.abs(d - target) < err)
            est_x[closer], err[closer] = mid[closer], np.abs(d - target)[closer]
            up = todo & (d >= target)
            dn = todo & (d < target)
            hi[up], d_hi[up] = mid[up], d[up]
            lo[dn], d_lo[dn] = mid[dn], d[dn]
            # Illinois: halve the stale end's distance to the target when one side repeats
            d_lo[up & (side > 0)] = target - 0.5 * (target - d_lo[up & (side > 0)])
            d_hi[dn & (side < 0)] = target + 0.5 * (d_hi[dn & (side < 0)] - target)
            side = np.where(up, 1.0, np.where(dn, -1.0, side))
            for q in others:
                init[q] = np.where(todo & np.isfinite(est[q]), est[q], init[q])
            todo &= (err > 1e-3) & (hi - lo > 1e-9)
        best = np.where(np.isfinite(est_x), 10.0**est_x, est_x)
        best[failed] = np.nan
        nat = _natural(p, np.where(np.isfinite(best), best, 1.0), core, sel[:1] if joint else sel)
        bound[groups] = np.where(np.isfinite(best), nat, best)
    return out


def report(core, Z, dt, fixed_flat, free, joint, max_iter, tol, backend, device, labels):
    """``(upper_bounds, notes)``: :func:`upper_bounds` at 95% and one note per parameter saying
    what is reported in place of its standard error and why."""
    from kalmanscan.timeseries import optim

    bounds = upper_bounds(core, Z, dt, fixed_flat, free, joint, max_iter, tol, backend, device)
    notes = []
    N = Z.shape[1]
    ok = (core.opt.status == optim.CONVERGED) & (core.usable[:1] if joint else core.usable)
    for p, b in bounds.items():
        lost = np.flatnonzero(core.opt.at_boundary[:, free.index(p)] & ok & np.isnan(b))
        if lost.size:
            where = "" if joint or unnamed(N, labels) else " in series " + _names(lost, labels)
            notes.append(
                f"{p} is on its bound 0{where}, and no profile-likelihood bound could be computed "
                f"(a fit with {p} held fixed did not converge within {_MAX_ITER} iterations)"
            )
        idx = np.flatnonzero(~np.isnan(b))
        if idx.size == 0:
            continue
        where = "" if joint or unnamed(N, labels) else " in series " + _names(idx, labels)
        unbounded = np.isinf(b[idx]).any()
        notes.append(
            f"{p} is on its bound 0{where}: in place of a standard error the table gives '<b', "
            "the one-sided 95% profile-likelihood upper bound: the largest value at which "
            "the log-likelihood, maximized over the other parameters, is within "
            f"{drop_for(0.95):.4g} of its maximum (at a boundary the likelihood-ratio statistic "
            "is a 50:50 mixture of chi2_0 and chi2_1, whose 95% point is chi2_1's 90% point, 2.706)"
            + ("; 'inf': the data bound it by less than 1e6 times their scale" if unbounded else "")
        )
    return bounds, notes


def _names(idx, labels, limit: int = 5) -> str:
    shown = [repr(labels[i]) if labels else str(int(i)) for i in idx[:limit]]
    more = f" and {len(idx) - limit} more" if len(idx) > limit else ""
    return ", ".join(shown) + more
