"""Profile-likelihood intervals and bounds of a fit's parameters.

The profile log-likelihood ``l_p(v)`` of a free parameter is the log-likelihood maximized over
the other free parameters with this one fixed at ``v``. Two things are read off it:

- :func:`upper_bounds` (``OUFit.upper_bound``, reported by :func:`kalmanscan.fit_ou` in place of
  a standard error): where a maximum-likelihood estimate of ``theta``, ``sigma2`` or ``obs_var``
  sits on its lower bound 0, the normal approximation behind a standard error does not hold: the
  likelihood is one-sided. The one-sided upper bound ``b`` at ``level`` (default 95%) is the value
  at which ``l_p`` has fallen by ``chi2_1(2 level - 1) / 2`` from its maximum, 1.353 at 95%.
  Under the null hypothesis "the parameter is 0", the likelihood-ratio statistic is the 50:50
  mixture of chi2_0 and chi2_1 (Self & Liang 1987; the chi-bar-squared rule), whose upper
  ``1 - level`` point is that chi2_1 quantile; ``[0, b]`` is the set of values the data do not
  reject at ``1 - level`` one-sided. Derivation and examples: docs/model.md, "Estimates on a
  boundary".
- :func:`intervals` (``OUFit.profile_interval``): the two-sided interval
  ``{v : 2 (l_hat - l_p(v)) <= chi2_1(coverage)}`` of every free parameter, a drop of 1.921 at
  95%; for an estimate on its bound ``[0, b]`` with ``b`` at that drop, so that the 90% interval's
  upper end is the one-sided 95% bound above. docs/model.md, "Profile-likelihood intervals".

Each profile point is a fit of the other parameters by the batched Newton method of
:func:`kalmanscan.timeseries.fit._fit_core`: one batch per parameter and point holding every
series (and both ends of each interval) still searched, each warm started from its previous
point. One search routine (:func:`_search`) finds every end: a bracket along a sequence of points
away from a start whose drop is below the target (the bound with a drop of 0 for
:func:`upper_bounds`, decades from 1e-6 to 1e6 of the data's scale; the estimate for
:func:`intervals`, steps growing fourfold from about the Wald end), then regula falsi (Illinois),
to 1e-3 in the drop. Positive parameters are searched on ``log10`` of their standardized value,
``mu`` on its standardized value; the ends of an interval are interpolated on the square root
of the drop (the signed likelihood root, nearly linear in the parameter), the bound on the drop.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from kalmanscan.timeseries._messages import _names, _plain, unnamed

_POSITIVE = ("theta", "sigma2", "obs_var")
_DECADES = np.arange(-6.0, 7.0)  # upper_bounds' bracket: log10 of the standardized value
_FLOOR = -8.0  # log10 of the standardized value taken for the bound 0 (optim.BOUNDARY)
_CEIL = 6.0  # log10 beyond which a positive parameter is unbounded (1e6 times the data's scale)
_MU_RANGE = 1e6  # mu beyond this many times the data's scale from its estimate: unbounded
_GROWTH = 4.0  # intervals' bracket: each step this many times the last
_STEPS = 24  # most bracket points per end (enough to reach the range from the smallest step)
_ITERS = 30
_TOL = 1e-3  # in the log-likelihood drop
_MAX_ITER = 100  # per profile fit (warm started; a fit that needs more gives no bound)
_WHITE_THETA_DT = 12.0  # theta times the shortest step beyond which the OU is white noise (fit.py)


def drop_for(level: float) -> float:
    """Log-likelihood drop of the one-sided ``level`` bound: ``chi2_1(2 level - 1) / 2``.

    >>> round(drop_for(0.95), 4)
    1.3528
    """
    q = NormalDist().inv_cdf(level)  # chi2_1 quantile at 2 level - 1 is q**2
    return 0.5 * q * q


def two_sided_drop(coverage: float) -> float:
    """Log-likelihood drop of the two-sided ``coverage`` interval: ``chi2_1(coverage) / 2``.

    >>> round(two_sided_drop(0.95), 4), two_sided_drop(0.9) == drop_for(0.95)
    (1.9207, True)
    """
    return drop_for(0.5 + 0.5 * coverage)


def slim(core):
    """``core`` without what the profile does not read (the filter result, the standardized
    data, the Hessians), to be kept with a fit."""
    opt = core.opt
    return core._replace(
        filtered=None, data=None, exact_hessian=None, opt=opt._replace(g=None, H=None)
    )


def state(core, dt, fixed_flat, free, max_iter, tol, backend, device) -> tuple:
    """What a fit keeps for :meth:`OUFit.profile_interval` (``OUFit._profile_state``): its
    slimmed core, steps, fixed values, free names and options (the data are the fit's ``z``)."""
    return (slim(core), dt, fixed_flat, tuple(free), max_iter, tol, backend, device)


def _natural(p, x, core, sel):
    """Standardized ``x`` of parameter ``p`` in natural units for the series ``sel``."""
    s, tau = core.s[sel], core.tau
    if p == "mu":
        return core.m[sel] + s * x
    return {"theta": x / tau, "sigma2": x * s**2 / tau, "obs_var": x * s**2}[p]


def _value(p, y, core, sel):
    """The natural value of ``p`` at search coordinate ``y`` (``log10`` of the standardized
    value; ``mu``: the standardized value) for the series ``sel``; ``+-inf`` stays."""
    finite = np.isfinite(y)
    y1 = np.where(finite, y, 0.0)
    x = y1 if p == "mu" else 10.0**y1
    return np.where(finite, _natural(p, x, core, sel), y)


class _Drop:
    """The profile log-likelihood drop ``l_hat - l_p`` of free parameter ``p`` over lanes: lane
    ``i`` profiles group ``groups[i]`` (a series; a joint fit's one group), several lanes may
    profile one group (the two ends of its interval). Called with search coordinates ``y [n]``
    of lanes ``lanes [n]``, it fits the others at those points (one batched fit; one fit of all
    series per lane for a joint fit), warm started from each lane's last point, and returns
    ``(drop [n], exact [n])``.

    A profile fit that did not converge (within ``_MAX_ITER`` iterations) still bounds the drop
    from above (its log-likelihood is one of the likelihood's values): where that bound is below
    ``target`` the point is inside (``exact`` False); elsewhere its drop is NaN. ``white``:
    ``(y_w, floor [n])`` for ``theta``: at ``y >= y_w`` every step's decay is below ``e^-12`` and
    the profile is white noise's ``floor`` (to ~1e-10 a step), taken without a fit.
    """

    def __init__(
        self, core, Z, dt, fixed_flat, free, joint, options, p, groups, target, white=None
    ):
        self.core, self.Z, self.dt, self.fixed_flat = core, Z, dt, fixed_flat
        self.joint, self.options, self.p = joint, options, p
        self.others = [q for q in free if q != p]
        self.groups, self.target, self.white = groups, target, white
        n = groups.size
        if joint:
            self.ll_hat = np.full(n, core.loglik.sum())
            self.init = {q: np.full(n, core.est[q][0]) for q in self.others}
        else:
            self.ll_hat = core.loglik[groups]
            self.init = {q: core.est[q][groups].copy() for q in self.others}

    def _fit(self, sel, value, init):
        """``(loglik [G], converged [G], est)``: the others fitted to the series ``sel`` with
        ``p`` fixed at ``value [len(sel)]``."""
        from kalmanscan.timeseries import optim
        from kalmanscan.timeseries.fit import _fit_core

        max_iter, tol, backend, device = self.options
        fx = {q: v[sel] for q, v in self.fixed_flat.items()}
        fx[self.p] = value
        res = _fit_core(
            self.Z[:, sel], self.dt, fx, self.others, init, self.joint,
            min(max_iter, _MAX_ITER), tol, backend, device,
        )  # fmt: skip
        ll = res.loglik.sum(keepdims=True) if self.joint else res.loglik
        good = res.opt.status == optim.CONVERGED
        good = good[:1] if self.joint else good
        est = {q: res.est[q][:1] if self.joint else res.est[q] for q in self.others}
        return ll, good, est

    def __call__(self, y, lanes):
        d = np.full(lanes.size, np.nan)
        exact = np.ones(lanes.size, bool)
        fit = np.ones(lanes.size, bool)
        if self.white is not None:  # theta beyond the white-noise limit
            y_w, floor = self.white
            fit = ~(y >= y_w)
            d[~fit] = self.ll_hat[lanes[~fit]] - floor[lanes[~fit]]
        y, lanes_f = y[fit], lanes[fit]
        if lanes_f.size == 0:
            return d, exact
        core, p = self.core, self.p
        N = self.Z.shape[1]
        if self.joint:  # one fit of every series per lane
            parts = []
            for yi, i in zip(y, lanes_f, strict=True):
                sel = np.arange(N)
                v = np.full(N, _value(p, np.array([yi]), core, sel[:1])[0])
                init = {q: np.full(N, self.init[q][i]) for q in self.others}
                parts.append(self._safe(sel, v, init))
            ll = np.concatenate([x[0] for x in parts])
            good = np.concatenate([x[1] for x in parts])
            est = {q: np.concatenate([x[2][q] for x in parts]) for q in self.others}
        else:
            sel = self.groups[lanes_f]
            init = {q: self.init[q][lanes_f] for q in self.others}
            ll, good, est = self._safe(sel, _value(p, y, core, sel), init)
        for q in self.others:
            self.init[q][lanes_f] = np.where(np.isfinite(est[q]), est[q], self.init[q][lanes_f])
        df = self.ll_hat[lanes_f] - ll
        inside = ~good & np.isfinite(df) & (df < self.target)  # bounded above by the target
        d[fit] = np.where(good | inside, df, np.nan)
        exact[fit] = ~inside
        return d, exact

    def _safe(self, sel, value, init):
        """:meth:`_fit`; where a profile fit's estimate leaves float64's range (the fit refuses
        it), the series of a separate fit are fitted one at a time and those refused give NaN."""
        try:
            return self._fit(sel, value, init)
        except ValueError:
            if self.joint or sel.size == 1:
                nan = np.full(1 if self.joint else sel.size, np.nan)
                return nan, nan == 0, {q: nan for q in self.others}
        parts = [
            self._safe(sel[i : i + 1], value[i : i + 1], {q: v[i : i + 1] for q, v in init.items()})
            for i in range(sel.size)
        ]
        return (
            np.concatenate([x[0] for x in parts]),
            np.concatenate([x[1] for x in parts]),
            {q: np.concatenate([x[2][q] for x in parts]) for q in self.others},
        )


def _search(drop, y0, d0, steps, target, root):
    """Where the drop first reaches ``target`` going from ``y0 [L]`` (drop ``d0 [L]``, below the
    target) along ``steps [K, L]`` (points away from ``y0``; NaN past a lane's last one).

    A bracket (the steps in turn until the drop reaches the target), then regula falsi
    (Illinois) between the last point below and the first at or above the target, on the drop
    or, for lanes with ``root``, on its square root; to ``_TOL`` in the drop. ``drop(y, lanes)``
    returns ``(d, exact)`` (a point whose drop is only bounded, below the target, is not
    reported). Returns ``y [L]``: the point closest to the target; ``inf`` where no step reached
    it; NaN where a profile fit did not converge.
    """
    L = y0.size
    t_h = np.where(root, math.sqrt(target), target)

    def h(d, idx):  # the interpolated quantity
        return np.where(root[idx], np.sqrt(np.maximum(d, 0.0)), d)

    lo, h_lo = y0.astype(np.float64).copy(), h(np.asarray(d0, np.float64), np.arange(L))
    hi, h_hi, d_hi = np.full(L, np.nan), np.full(L, np.nan), np.full(L, np.nan)
    open_ = np.ones(L, bool)
    failed = np.zeros(L, bool)  # a profile fit did not converge: no end
    for k in range(steps.shape[0]):  # the bracket, warm starts along the way
        open_ &= ~np.isnan(steps[k])
        a = np.flatnonzero(open_)
        if a.size == 0:
            break
        y = steps[k, a]
        d, _ = drop(y, a)
        ok = np.isfinite(d)
        up, dn = ok & (d >= target), ok & (d < target)
        hi[a[up]], h_hi[a[up]], d_hi[a[up]] = y[up], h(d[up], a[up]), d[up]
        lo[a[dn]], h_lo[a[dn]] = y[dn], h(np.maximum(d[dn], 0.0), a[dn])
        failed[a[~ok]] = True
        open_[a[~ok | up]] = False
    side = np.zeros(L)
    todo = np.isfinite(hi)
    est = np.where(todo, hi, np.inf)
    err = np.where(todo, np.abs(d_hi - target), np.inf)
    for _ in range(_ITERS):  # Illinois
        a = np.flatnonzero(todo)
        if a.size == 0:
            break
        with np.errstate(invalid="ignore", divide="ignore"):
            w = (t_h[a] - h_lo[a]) / (h_hi[a] - h_lo[a])
        w = np.clip(np.where(np.isfinite(w), w, 0.5), 0.02, 0.98)
        mid = lo[a] + w * (hi[a] - lo[a])
        d, exact = drop(mid, a)
        bad = ~np.isfinite(d)
        failed[a[bad]] = True
        todo[a[bad]] = False
        d = np.where(bad, target, d)
        closer = ~bad & exact & (np.abs(d - target) < err[a])
        est[a[closer]], err[a[closer]] = mid[closer], np.abs(d - target)[closer]
        up, dn = ~bad & (d >= target), ~bad & (d < target)
        hi[a[up]], h_hi[a[up]] = mid[up], h(d[up], a[up])
        lo[a[dn]], h_lo[a[dn]] = mid[dn], h(d[dn], a[dn])
        # Illinois: halve the stale end's distance to the target when one side repeats
        s = side[a]
        stale = a[up & (s > 0)]
        h_lo[stale] = t_h[stale] - 0.5 * (t_h[stale] - h_lo[stale])
        stale = a[dn & (s < 0)]
        h_hi[stale] = t_h[stale] + 0.5 * (h_hi[stale] - t_h[stale])
        side[a] = np.where(up, 1.0, np.where(dn, -1.0, s))
        todo[a] &= (err[a] > _TOL) & (np.abs(hi[a] - lo[a]) > 1e-9)
    est[failed] = np.nan
    return est


def upper_bounds(core, Z, dt, fixed_flat, free, joint, max_iter, tol, backend, device, level=0.95):
    """``{name: [G] upper bound}`` (NaN where the estimate is interior or its fit unusable;
    ``inf`` where the likelihood stays within the drop up to 1e6 times the data's scale) for
    every positive free parameter of :func:`kalmanscan.fit_ou`'s result ``core`` at its bound.

    ``Z [T, N]``, ``dt [T]``, ``fixed_flat``, ``free``, ``joint`` and the options are those the
    fit ran with. The profile fits reuse the fit's optimizer and standardization unchanged.
    """
    from kalmanscan.timeseries import optim

    target = drop_for(level)
    opt = core.opt
    G = opt.u.shape[0]
    out = {}
    ok_group = (opt.status == optim.CONVERGED) & (core.usable[:1] if joint else core.usable)
    options = (max_iter, tol, backend, device)
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
        if groups.size:
            drop = _Drop(core, Z, dt, fixed_flat, free, joint, options, p, groups, target)
            y0, steps = _from_bound(groups.size)
            y = _search(drop, y0, np.zeros(groups.size), steps, target, np.zeros(groups.size, bool))
            bound[groups] = _value(p, y, core, _series(groups, joint))
    return out


def _from_bound(n):
    """``(y0, steps)`` of a search up from the bound: the decades from 1e-6 to 1e6 of the data's
    scale after ``_FLOOR``, taken for the bound (a drop of 0)."""
    return np.full(n, _FLOOR), np.repeat(_DECADES[:, None], n, 1)


def _outward(y0, h0, direction, limit):
    """``steps [_STEPS, L]``: from ``y0 [L]`` towards ``limit [L]`` (``direction`` +1 or -1)
    by steps ``h0 [L]`` growing ``_GROWTH``-fold, the last one on the limit (NaN after it; none
    where ``y0`` is at or beyond the limit)."""
    off = h0[None, :] * _GROWTH ** np.arange(_STEPS)[:, None]
    room = (limit - y0) * direction
    steps = y0 + direction * np.minimum(off, room)
    past = np.concatenate([np.zeros((1, y0.size), bool), (off >= room)[:-1]], 0)
    return np.where(past | (room <= 0), np.nan, steps)


def _series(groups, joint):
    """The series whose standardization groups ``groups`` use."""
    return np.zeros(groups.size, np.int64) if joint else groups


def intervals(
    core, Z, dt, fixed_flat, free, joint, max_iter, tol, backend, device, params, coverage, se
):
    """``({name: (lower [G], upper [G])}, {name: reason [G]})``: the two-sided profile-likelihood
    interval at ``coverage`` of each free parameter in ``params`` (docs/model.md,
    "Profile-likelihood intervals"), with the reason (text) where it is NaN ('' elsewhere).

    - an interior estimate: both ends searched from it (first steps from the Wald end of its
      standard error ``se[name] [G]``, in natural units, where known); a positive parameter's
      lower end is 0 where the profile stays within the drop down to 1e-8 of the data's scale,
      an upper end ``inf`` beyond 1e6 of it, ``mu``'s ends ``-inf``, ``inf`` beyond 1e6 times the
      scale from the estimate;
    - an estimate on its bound: ``[0, b]``, ``b`` searched as :func:`upper_bounds` does;
    - a parameter the likelihood does not depend on at the maximum (``theta`` where ``sigma2``
      is 0, on its bound or fixed; ``mu`` where ``theta`` is 0): its whole range;
    - white noise (the series' own variance) bounds the profiles from below where the family
      reaches it: ``theta``'s everywhere (``sigma2 -> 0``), ``sigma2``'s everywhere and
      ``obs_var``'s up to that variance (``theta -> infinity``, the state's variance
      ``sigma2 / (2 theta)`` the rest). Where it is within the drop of the maximum (a series
      without persistence, or nearly), ``theta`` and ``sigma2`` get their whole range and
      ``obs_var`` the lower end 0, its upper end searched from that variance;
    - NaN where the fit did not converge, the series was not fitted, or a profile fit did not
      converge within ``_MAX_ITER`` iterations.
    """
    from kalmanscan.timeseries import optim

    target = two_sided_drop(coverage)
    opt = core.opt
    G = opt.u.shape[0]
    usable = core.usable[:1] if joint else core.usable
    ok = (opt.status == optim.CONVERGED) & usable
    first = np.zeros(G, np.int64) if joint else np.arange(G)  # a series of each group
    white = core.white if core.white is not None else np.zeros(G, bool)
    options = (max_iter, tol, backend, device)
    ll_hat = core.loglik.sum(keepdims=True) if joint else core.loglik
    # white noise's log-likelihood: a floor of theta's profile (sigma2 -> 0, with sigma2 and
    # obs_var free), and of sigma2's and obs_var's (theta -> infinity, with all three free and
    # no two observations at one time, whose shared state is never white)
    floor = _white_loglik(Z, fixed_flat, free, joint)
    steps_pos = bool(np.all(np.asarray(dt)[1:] > 0)) and np.asarray(dt).size > 1
    ridge = {"theta", "sigma2", "obs_var"} <= set(free) and steps_pos
    theta_floor = floor if {"sigma2", "obs_var"} <= set(free) else np.full(G, -np.inf)
    ridge_floor = floor if ridge else np.full(G, -np.inf)
    near_theta = ok & (white | (ll_hat - theta_floor < target))
    near_ridge = ok & (white | (ll_hat - ridge_floor < target))

    def zero(q):  # [G]: q is 0 at the estimate (on its bound or fixed there)
        if q in free:
            return opt.at_boundary[:, free.index(q)]
        return np.asarray(fixed_flat[q])[first] == 0

    out, why = {}, {}
    for p in params:
        lower, upper = np.full(G, np.nan), np.full(G, np.nan)
        reason = np.full(G, "", dtype=object)
        reason[~usable] = "the series was not fitted (fewer than 2 observations, or constant)"
        reason[usable & ~ok] = "the fit did not converge"
        flat = {
            "theta": zero("sigma2") | near_theta,
            "mu": zero("theta"),
            "sigma2": near_ridge,
        }.get(p, np.zeros(G, bool))
        flat &= ok
        lower[flat], upper[flat] = (-np.inf if p == "mu" else 0.0), np.inf
        todo = ok & ~flat
        from_floor = todo & near_ridge if p == "obs_var" else np.zeros(G, bool)
        bound = todo & ~from_floor & opt.at_boundary[:, free.index(p)]
        inner = todo & ~from_floor & ~bound
        lower[bound | from_floor] = 0.0
        g_b, g_f, g_i = np.flatnonzero(bound), np.flatnonzero(from_floor), np.flatnonzero(inner)
        if g_b.size + g_f.size + g_i.size == 0:
            out[p], why[p] = (lower, upper), reason
            continue
        # the searches: up from the bound (as upper_bounds), up from white noise's variance
        # (obs_var), up and down from the estimate
        est = np.asarray(core.est[p])[first]
        sd = np.full(G, np.nan) if se is None else np.asarray(se[p], np.float64)
        s = core.s[first]
        if p == "mu":
            y_hat = (est - core.m[first]) / s
            h0 = np.clip(1.25 * math.sqrt(2 * target) * sd / s, 1e-3, 1e3)
            h0 = np.where(np.isfinite(h0), h0, 1.0)
            lim_up, lim_lo = y_hat + _MU_RANGE, y_hat - _MU_RANGE
        else:
            unit = {"theta": 1 / core.tau, "sigma2": s**2 / core.tau, "obs_var": s**2}[p]
            with np.errstate(divide="ignore", invalid="ignore"):
                y_hat = np.log10(est / unit)
                h0 = 1.25 * math.sqrt(2 * target) * sd / (est * math.log(10))
            h0 = np.where(np.isfinite(h0), np.clip(h0, 0.02, 2.0), 0.3)
            lim_up = np.maximum(_CEIL, y_hat + 1.0)
            lim_lo = np.minimum(_FLOOR, y_hat)
        y_f, d_f = y_hat[g_f], np.zeros(g_f.size)
        if g_f.size:  # obs_var: white noise's variance, where the profile is within the drop
            var = np.exp((-2 * floor[g_f] / _n_obs(Z, joint)[g_f]) - 1.0) / (2 * np.pi)
            y_w = np.log10(var / unit[g_f])
            later = y_w > y_f
            y_f = np.where(later, y_w, y_f)
            d_f = np.where(later, np.maximum(ll_hat[g_f] - floor[g_f], 0.0), 0.0)
        y_b, s_b = _from_bound(g_b.size)
        z_i = np.zeros(g_i.size)
        parts = [  # (groups, y0, d0, steps, root)
            (g_b, y_b, np.zeros(g_b.size), s_b, False),
            (g_f, y_f, d_f, _outward(y_f, h0[g_f], 1.0, lim_up[g_f]), True),
            (g_i, y_hat[g_i], z_i, _outward(y_hat[g_i], h0[g_i], 1.0, lim_up[g_i]), True),
            (g_i, y_hat[g_i], z_i, _outward(y_hat[g_i], h0[g_i], -1.0, lim_lo[g_i]), True),
        ]  # fmt: skip
        groups = np.concatenate([x[0] for x in parts])
        K = max(x[3].shape[0] for x in parts)
        steps = np.concatenate(
            [np.pad(x[3], ((0, K - x[3].shape[0]), (0, 0)), constant_values=np.nan) for x in parts],
            1,
        )
        root = np.concatenate([np.full(x[0].size, x[4]) for x in parts])
        white_theta = None
        if p == "theta" and ridge:  # beyond the white-noise limit: the floor, without a fit
            y_w = math.log10(_WHITE_THETA_DT * core.tau / float(np.min(np.asarray(dt)[1:])))
            white_theta = (y_w, theta_floor[groups])
        drop = _Drop(core, Z, dt, fixed_flat, free, joint, options, p, groups, target, white_theta)
        y = _search(
            drop, np.concatenate([x[1] for x in parts]), np.concatenate([x[2] for x in parts]),
            steps, target, root,
        )  # fmt: skip
        y_b, y_f, y_u, y_l = np.split(y, np.cumsum([x[0].size for x in parts])[:-1])
        upper[g_b] = _value(p, y_b, core, _series(g_b, joint))
        upper[g_f] = _value(p, y_f, core, _series(g_f, joint))
        upper[g_i] = _value(p, y_u, core, _series(g_i, joint))
        # a lower end not reached: 0 (positive: the profile is within the drop down to the
        # bound) or -inf (mu)
        low = _value(p, np.where(np.isinf(y_l), -np.inf, y_l), core, _series(g_i, joint))
        lower[g_i] = np.where(np.isneginf(low) & (p != "mu"), 0.0, low)
        reason[todo & (np.isnan(lower) | np.isnan(upper))] = (
            f"a fit with {p} held fixed at a point of its profile did not converge within "
            f"{_MAX_ITER} iterations"
        )
        out[p], why[p] = (lower, upper), reason
    return out, why


def _n_obs(Z, joint) -> np.ndarray:
    """``[G]``: observations per group."""
    n = (~np.isnan(Z)).sum(0).astype(np.float64)
    return n.sum(keepdims=True) if joint else n


def fit_intervals(fit, params, coverage) -> dict:
    """:meth:`OUFit.profile_interval`: the arguments checked, :func:`intervals` on the fit's data
    and state (refitted with :func:`kalmanscan.fit_ou`'s defaults where the fit holds none),
    shaped as the fit's other per-series results, with a warning per reason for a NaN."""
    import warnings

    import torch

    from kalmanscan.timeseries.fit import _fit_core, _glue_single_threaded
    from kalmanscan.timeseries.model import PARAMS

    free = [p for p in PARAMS if p not in fit.fixed]
    names = check_params(params, free, fit.fixed)
    coverage = check_coverage(coverage)
    shape = fit.z.shape[1:]
    T = fit.z.shape[0]
    Z = np.ascontiguousarray(np.asarray(fit.z, dtype=np.float64).reshape(T, -1))
    N = Z.shape[1]
    state = fit._profile_state
    with _glue_single_threaded():
        if state is None:  # assembled without fit_ou: refitted as fit_ou would
            dt = fit.time_axis.dt
            fixed_flat = {
                k: np.broadcast_to(np.asarray(v, np.float64), shape).reshape(N).copy()
                for k, v in fit.fixed.items()
            }
            device = torch.device("cpu")
            core = _fit_core(Z, dt, fixed_flat, free, {}, fit.joint, 500, 1e-9, "auto", device)
            state = (slim(core), dt, fixed_flat, free, 500, 1e-9, "auto", device)
        core, dt, fixed_flat, free, max_iter, tol, backend, device = state
        G = 1 if fit.joint else N
        se = {
            p: np.broadcast_to(np.asarray(fit.stderr.get(p, np.nan), np.float64), shape).reshape(
                -1
            )[:G]
            for p in names
        }
        out, why = intervals(
            core, Z, dt, fixed_flat, list(free), fit.joint, max_iter, tol, backend, device,
            names, coverage, se,
        )  # fmt: skip
    labels = fit.series_labels
    for p in names:
        for reason in sorted(set(why[p]) - {""}):
            idx = np.flatnonzero(why[p] == reason)
            where = "" if fit.joint or unnamed(N, labels) else " in series " + _names(idx, labels)
            warnings.warn(
                f"profile_interval: no interval for {p}{where} (NaN): {reason}", stacklevel=3
            )

    def shaped(a):
        if fit.joint or shape == ():
            return float(a[0])
        return a.reshape(shape)

    return {p: (shaped(out[p][0]), shaped(out[p][1])) for p in names}


def _white_loglik(Z, fixed_flat, free, joint) -> np.ndarray:
    """``[G]``: the log-likelihood of white noise around ``mu`` (its estimate, the mean, where
    ``mu`` is free) with the maximum-likelihood variance, the supremum of the OU likelihood as
    ``theta -> infinity`` or ``sigma2 -> 0``; ``-inf`` where ``theta``, ``sigma2`` or ``obs_var``
    is fixed (the white-noise limit is then not within the family's reach at every value)."""
    G = 1 if joint else Z.shape[1]
    if not {"theta", "sigma2", "obs_var"} <= set(free):
        return np.full(G, -np.inf)
    obs = ~np.isnan(Z)
    zs = np.where(obs, Z, 0.0)

    def total(x):
        return x.sum().reshape(1) if joint else x.sum(0)

    n = total(obs.astype(np.float64))
    if "mu" in free:
        centre = total(zs) / np.maximum(n, 1)
        centre = np.broadcast_to(centre, (Z.shape[1],)) if joint else centre
    else:
        centre = np.asarray(fixed_flat["mu"], np.float64)
    var = total(np.where(obs, (Z - centre) ** 2, 0.0)) / np.maximum(n, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ll = -0.5 * n * (np.log(2 * np.pi * var) + 1.0)
    return np.where(np.isfinite(ll), ll, -np.inf)


def check_params(params, free, fixed) -> list:
    """``params`` of :meth:`OUFit.profile_interval` checked: the free parameters to profile
    (``None``: all), as a list."""
    if params is None:
        return list(free)
    names = [params] if isinstance(params, str) else params
    if not isinstance(names, (list, tuple)) or not all(isinstance(x, str) for x in names):
        got = repr(params) if isinstance(params, (list, tuple)) else _plain(params)
        raise TypeError(
            f"params: expected None, a parameter name or a list of names among {list(free)}, got "
            f"{got}"
        )
    out = []
    for x in names:
        if x not in free:
            what = f"{x!r}, which is fixed" if x in fixed else f"{x!r}, which is no parameter"
            raise ValueError(f"params: expected free parameters among {list(free)}, got {what}")
        if x not in out:
            out.append(x)
    if not out:
        raise ValueError(f"params: expected at least one name among {list(free)}, got []")
    return out


def check_coverage(coverage) -> float:
    """``coverage`` of :meth:`OUFit.profile_interval`: a number strictly between 0 and 1."""
    if isinstance(coverage, (bool, np.bool_)) or not isinstance(
        coverage, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"coverage: expected a number between 0 and 1, got {_plain(coverage)}")
    c = float(coverage)
    if not (0 < c < 1):
        raise ValueError(
            f"coverage: expected a number strictly between 0 and 1 (e.g. 0.95), got "
            f"{_plain(coverage)}"
        )
    return c


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
