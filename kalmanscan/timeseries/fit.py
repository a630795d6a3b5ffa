"""Maximum-likelihood fitting of OU / local-level models: a batched Newton method over all series.

The data are standardized per series (location ``m``, scale ``s``; time by the median step
``tau``; :mod:`kalmanscan.timeseries.moments`), so the fit sees values of order 1 whatever the
units: ``fit_ou(c * z)`` is ``fit_ou(z)`` with the variances times ``c**2``. Positive parameters
are optimized as logs, ``mu`` as is, in those standardized units, with no bounds. Every series
takes its own Newton steps with its own line search, all series advancing together in one filter
call per step (:mod:`kalmanscan.timeseries.objective`); the gradient and Hessian come from a
central-difference stencil of log-likelihood values (:mod:`kalmanscan.timeseries.optim`). A
positive estimate that ends below ``_SMALL`` of the scale is finished in natural coordinates
(:func:`_refine_small`: the bound 0 as an active constraint), and the standard errors of such fits
(and of those with an estimate on its bound, or a stencil Hessian that is not positive definite)
come from a Hessian in natural coordinates from exact gradients (:func:`_natural_hessian`), not
from the stencil in logs, which rounds a small variance's curvature away
(:mod:`kalmanscan.timeseries.uncertainty`, with the profile bounds of estimates on their bound).
The scale ``s`` is the smaller of the standard deviation and the typical step, so a variance is
judged to sit on its bound 0 relative to the noise of the record. After the fit, observations
that dominate its likelihood are checked by a refit without them
(:mod:`kalmanscan.timeseries.outliers`). The result, :class:`OUFit`, is defined in
:mod:`kalmanscan.timeseries.result` (imported here too). The model: docs/model.md; the method and
its measured cost: docs/performance-cpu.md, "Fitting".
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import _args
from kalmanscan.timeseries import optim
from kalmanscan.timeseries._messages import _listed, _names, _plain, _shown, unnamed
from kalmanscan.timeseries.model import PARAMS, OUModel, align_to_data, series_input
from kalmanscan.timeseries.moments import _location_scale, _nan_moments, _start
from kalmanscan.timeseries.objective import (  # noqa: F401 (the fit's evaluations)
    _NAT_REL,
    _POSITIVE,
    _SMALL,
    _Data,
    _from_prior_np,
    _held,
    _lane_arrays,
    _lane_arrays_np,
    _lean_available,
    _lean_const,
    _lean_filter,
    _lean_loglik,
    _lean_run,
    _loglik,
    _natural_grad,
    _natural_hessian,
    _no_tiny_lanes,
    _objective,
    _ou_transition_np,
    _params_of,
    _series_loglik,
    _torch_fn,
)
from kalmanscan.timeseries.outliers import _outlier_check
from kalmanscan.timeseries.result import OUFit, _decimals  # noqa: F401 - re-exported
from kalmanscan.timeseries.times import as_time_axis
from kalmanscan.timeseries.uncertainty import (
    _boundary_note,
    _bounds_on_read,
    _fit_standard_errors,
    _jacobi,
    _LazyNotes,
    _level_ridge,
    _mu_unused,
    _natural,
    _ridge_note,
)

# standardization: s**2 must stay well inside float64 for the variances to be representable
_SCALE_RANGE = (1e-150, 1e150)
_STENCIL_H = 1e-3  # central-difference step in the standardized unconstrained coordinates
# mu's step: the log-likelihood is exactly quadratic in mu (it moves every predicted mean by a
# linear function of mu and no variance), so its differences are exact at any step; at 1e-3 a
# weakly mean-reverting record's curvature in mu (~1e-8 a step) fell below the rounding of a
# million-step sum (~1e-13), and Newton wandered in mu with noise for a Hessian
_STENCIL_H_MU = 1.0
_REFINE_ITER = 20  # Newton steps in natural coordinates finishing a small estimate (_refine_small)
_LAST_STEP = 1e-5  # a step below this relative is _refine_small's last (no Hessian after it)
# set by :func:`_one_chunk` (this thread only) while a fit sees one chunk of a larger array
_ONE_CHUNK = contextvars.ContextVar("kalmanscan_fit_one_chunk", default=False)


def _check_series_labels(labels, shape) -> list:
    """``series_labels`` checked: one label per series of the series shape ``shape``, each as
    given (integers stay integers, as a DataFrame's columns do)."""
    n = int(np.prod(shape)) if shape else 1
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
        raise TypeError(
            f"series_labels: expected a list of {n} labels (one per series), got "
            f"{type(labels).__name__}"
        )
    labels = list(labels)
    if len(labels) != n:
        raise ValueError(
            f"series_labels: expected {n} labels (one per series of the series shape {shape}, "
            f"flattened), got {len(labels)}"
        )
    return labels


def _check_fix(fix, shape):
    if fix is None:
        return {}
    if not isinstance(fix, dict):
        raise TypeError(f"fix: expected a dict like {{'theta': 0.0}}, got {type(fix).__name__}")
    out = {}
    for k, v in fix.items():
        if k not in PARAMS:
            raise ValueError(f"fix: expected keys among {PARAMS}, got {k!r}")
        from kalmanscan.core._args import as_real_numpy

        # refuses text, booleans and complex numbers, naming the entry
        arr = as_real_numpy(f"fix[{k!r}]", v, missing_ok=False).astype(np.float64)
        try:
            np.broadcast_to(arr, shape)
        except ValueError as err:
            raise ValueError(
                f"fix[{k!r}]: expected a scalar or an array broadcasting to the series shape "
                f"{shape}, got shape {arr.shape}"
            ) from err
        lo_open = k == "obs_var"
        bad = ~np.isfinite(arr) | (
            (arr <= 0) if lo_open else (arr < 0) if k != "mu" else np.zeros(arr.shape, bool)
        )
        if bad.any():
            rng = "> 0" if lo_open else ">= 0" if k != "mu" else "finite"
            got = _plain(arr[bad].ravel()[0])
            raise ValueError(f"fix[{k!r}]: expected values {rng}, got {got}")
        out[k] = float(arr) if arr.ndim == 0 else arr
    if len(out) == len(PARAMS):
        raise ValueError("fix: every parameter is fixed, nothing to fit; use OUModel(...) directly")
    return out


# theta times the shortest step beyond which a fit whose likelihood is already white noise's (to
# 1e-10 a step) stops there: every decay below e^-12 ~ 6e-6. Beyond it Newton steps only crawl up
# a ridge to theta = infinity (hundreds of iterations). At e^-3 fits were stopped on their way
# to an optimum of slight persistence (decay 0.04, 0.4 above white noise's log-likelihood)
_WHITE_THETA_DT = 12.0


class _WhiteNoise(NamedTuple):
    """The white-noise limit of a fit (:func:`_white_noise`): per group (a series, or a joint
    fit's one group) the standardized mean ``mean [G]`` and mean square ``var [G]`` about it
    (``mu`` fixed: about that) and the per-observation negative log-likelihood ``f [G]`` of
    white noise with them."""

    data: _Data
    theta_dt: float  # the shortest step in the optimizer's time units
    mean: np.ndarray
    var: np.ndarray
    f: np.ndarray

    def settled(self, idx, u, f):
        """The optimizer's test: every step's decay below ``e^-12`` and the value already that
        of white noise (to 1e-10 a step). Towards ``theta = infinity`` ``theta`` and ``sigma2``
        trade at one state variance ``sigma2 / (2 theta)``, whose split from ``obs_var`` the
        likelihood no longer sees, and Newton steps only crawl up that ridge (500 iterations,
        unconverged)."""
        theta = np.exp(u[:, self.data.free.index("theta")])
        fw = self.f[idx]
        return (theta * self.theta_dt > _WHITE_THETA_DT) & (f <= fw + 1e-10 * (1 + np.abs(fw)))

    def place(self, opt: optim.NewtonResult):
        """``(opt, white [G])``: the settled groups put at the white-noise representation with
        every parameter identified: ``sigma2`` on its bound 0 (a level constant at ``mu``, which
        no ``theta`` changes), ``obs_var`` the series' variance and ``mu`` its mean (their
        maximum-likelihood values), ``theta`` held where it stopped (not identified)."""
        white = opt.status == optim.SETTLED
        if not white.any():
            return opt, white
        free = self.data.free
        u, at_b, status, f = opt.u.copy(), opt.at_boundary.copy(), opt.status.copy(), opt.f.copy()
        u[white, free.index("sigma2")] = optim._BOUND_TARGET
        at_b[white, free.index("sigma2")] = True
        u[white, free.index("obs_var")] = np.log(self.var[white])
        if "mu" in free:
            u[white, free.index("mu")] = self.mean[white]
        f[white] = self.f[white]
        status[white] = optim.CONVERGED
        return opt._replace(u=u, f=f, at_boundary=at_b, status=status), white


def _white_noise(data: _Data, dt: np.ndarray, usable: np.ndarray) -> _WhiteNoise | None:
    """The white-noise limit of fits with ``theta``, ``sigma2`` and ``obs_var`` free (``dt``:
    the steps in the optimizer's time units; a joint fit's one group: every series' values
    together), or None where there is none to reach: a parameter of the three fixed, or two
    observations at one time (a step of 0, where the state is shared and the split of the
    variance identified)."""
    if not {"theta", "sigma2", "obs_var"} <= set(data.free):
        return None
    steps = np.asarray(dt, dtype=np.float64)[1:]
    if steps.size == 0 or (steps <= 0).any():
        return None
    zs = data.zs
    with torch.no_grad():
        obs = ~torch.isnan(zs)

        def total(x):  # [G]: per series, or one group of them all
            return x.sum().reshape(1) if data.joint else x.sum(0)

        n = total(obs.to(zs.dtype)).clamp(min=1)
        if "mu" in data.free:
            mean = total(torch.where(obs, zs, 0.0)) / n
            centre = mean.expand(zs.shape[1]) if data.joint else mean
        else:
            centre = torch.as_tensor(data.fixed["mu"], dtype=zs.dtype, device=zs.device)
            centre = centre.expand(zs.shape[1])
            mean = centre[:1] if data.joint else centre
        var = total(torch.where(obs, (zs - centre) ** 2, 0.0)) / n
    mean, var = mean.cpu().numpy().copy(), var.cpu().numpy().copy()
    ok = usable[:1] if data.joint else usable
    var = np.where(ok & (var > 0), var, 1.0)
    f = 0.5 * (np.log(2 * np.pi * var) + 1.0)
    return _WhiteNoise(data, float(steps.min()), mean, var, f)


def _refine_small(data: _Data, opt: optim.NewtonResult, positive):
    """Check and finish, in natural coordinates, the converged groups with a positive estimate
    below ``_SMALL`` times the data's scale (not on its bound).

    The Newton method in ``u = log x`` judges convergence on ``x dL/dx``, which vanishes with
    ``x`` whatever the slope, and its stencil loses the curvature of a small ``x`` to rounding:
    it can stop at ``x`` of ~1e-5 of the scale where the likelihood still rises towards 0 (a
    noise-free random walk whose increments have a lag-1 sum of products of 0 or more: the slope
    of the profile likelihood at ``obs_var = 0`` is minus that sum). Here Newton steps in ``x``
    (exact gradients, :func:`_natural_hessian`) on the free estimates that are not held, with
    bounds as active constraints: a small positive estimate that a step would take to
    ``optim.BOUNDARY`` or below (the local quadratic's maximum is on or beyond the bound) is put
    on its bound (``exp(optim._BOUND_TARGET)``, as the optimizer does) and the others stepped
    with it held; one on its bound whose full step leads back above ``optim.BOUNDARY`` is
    released. Steps go on while the likelihood does not fall (to a step of 1e-8 relative,
    ``_REFINE_ITER`` at most); the result replaces the optimizer's where its likelihood is at
    least as high (to rounding), with ``at_boundary`` set for the estimates left on their bound.

    Returns ``(opt, H [G, k, k])``: ``H`` the exact-gradient Hessian (:func:`_natural_hessian`)
    at the estimate where this made one there, or at the point one step below ``_LAST_STEP``
    relative before it (NaN elsewhere), for the standard errors.
    """
    x_all = _natural(opt.u, positive)
    held0 = _held(data, opt.at_boundary)
    small = positive[None, :] & ~held0 & (x_all < _SMALL)
    # and those with an estimate on its bound: the stencil finished the others (its gradient is
    # O(h^2) off: a small sample's variance 1.7e-7 off the closed form); the exact Hessian made
    # here is the one their standard errors need anyway
    on_bound = (positive[None, :] & opt.at_boundary).any(1) & (~held0).any(1)
    cand = np.flatnonzero((opt.status == optim.CONVERGED) & (small.any(1) | on_bound))
    G, k = opt.u.shape
    H_out = np.full((G, k, k), np.nan)
    if cand.size == 0:
        return opt, H_out
    n_tot = np.array([data.n_obs.sum()]) if data.joint else data.n_obs
    n_tot = np.maximum(n_tot, 1).astype(np.float64)[cand]
    f_opt = opt.f[cand] * n_tot  # the optimizer's total negative log-likelihood
    x = x_all[cand].copy()
    held = held0[cand]
    sm = small[cand]
    on = np.zeros(x.shape, bool)  # small estimates put on their bound here
    bound_x = math.exp(optim._BOUND_TARGET)
    live = np.ones(cand.size, bool)
    prev = (x.copy(), on.copy(), np.full(cand.size, np.inf))  # the last point that was no worse
    checked = np.zeros(cand.size, bool)  # prev holds a point whose likelihood was evaluated
    f_last = np.full(cand.size, np.nan)
    iters = np.zeros(cand.size, np.int64)
    H_first = np.full((cand.size, k, k), np.nan)  # at the optimizer's point
    H_prev = np.full((cand.size, k, k), np.nan)  # at prev[0]
    keep_h = np.zeros(cand.size, bool)  # a last step below _LAST_STEP: H_prev stands for it
    for _ in range(_REFINE_ITER):
        a = np.flatnonzero(live)
        if a.size == 0:
            break
        fa, ga, Ha = _natural_hessian(data, x[a], cand[a], on[a] | opt.at_boundary[cand[a]])
        good = np.isfinite(fa) & np.isfinite(ga).all(1) & np.isfinite(Ha).all((1, 2))
        # a step that lowered the likelihood (beyond rounding) is undone, and the group stops;
        # a step that put an estimate on its bound is judged at the end (the others were not
        # yet re-optimized for it)
        worse = ~good | (fa > prev[2][a] + 1e-13 * (1 + np.abs(prev[2][a])))
        back = a[worse]
        x[back], on[back] = prev[0][back], prev[1][back]
        live[back] = False
        a, fa, ga, Ha = a[~worse], fa[~worse], ga[~worse], Ha[~worse]
        prev[0][a], prev[1][a], prev[2][a] = x[a], on[a], fa
        H_prev[a] = Ha
        H_first[a[iters[a] == 0]] = Ha[iters[a] == 0]
        checked[a] = True
        f_last[a] = fa
        iters[a] += 1
        # the full step on every free estimate (those on a bound here included) ...
        free = ~held[a]
        d = _newton_steps(ga, Ha, free)
        ok = np.isfinite(d).all(1)
        live[a[~ok]] = False
        a, ga, Ha, d, free = a[ok], ga[ok], Ha[ok], d[ok], free[ok]
        # ... decides which small estimates are on their bound: those it takes to the bound
        stay = sm[a] & (x[a] + d <= optim.BOUNDARY)
        on[a] = stay
        x[a] = np.where(stay, bound_x, x[a])
        # the others' step with those held
        d = np.where(stay.any(1)[:, None], _newton_steps(ga, Ha, free & ~stay), d)
        bad = ~np.isfinite(d).all(1)
        live[a[bad]] = False
        d = np.where(np.isfinite(d), d, 0.0)
        xa = x[a]
        # a positive estimate keeps at least a tenth of itself in one step
        shrink = positive[None, :] & ~stay & (xa + d < 0.1 * xa)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(shrink, 0.9 * xa / -d, 1.0).min(1, initial=1.0)
        x[a] = np.where(stay, xa, xa + t[:, None] * d)
        moved = stay & ~prev[1][a]  # newly on a bound: its likelihood is judged at the end
        prev[2][a[moved.any(1)]] = np.inf
        tiny = np.where(positive[None, :], np.abs(d) <= 1e-8 * xa, np.abs(d) <= 1e-8)
        settled = (tiny | stay | held[a]).all(1) & (t == 1.0) & ~moved.any(1)
        live[a[settled]] = False  # its last step taken: rounding is all that is left
        # a step below _LAST_STEP relative is the last: the point it reaches is evaluated at the
        # end (its value only), and the Hessian of the point before stands for it (the standard
        # errors' then differ by O(_LAST_STEP) relative at most: a step of ~1e-7 from the
        # stencil's estimate moves them ~1e-7)
        near = np.where(positive[None, :], np.abs(d) <= _LAST_STEP * xa, np.abs(d) <= _LAST_STEP)
        last = (near | stay | held[a]).all(1) & (t == 1.0) & ~moved.any(1) & ~settled
        live[a[last]] = False
        prev[2][a[last]] = np.inf
        keep_h[a[last]] = True
    # the point to keep per group: the last one evaluated, unless a later step is pending
    fin_x, fin_on = prev[0], prev[1]
    pending = live | (prev[2] == np.inf)
    if pending.any():  # evaluate the points not yet evaluated
        p = np.flatnonzero(pending)  # (the value only: the fit's own objective, in u)
        up = np.where(positive, np.log(np.maximum(x[p], 1e-300)), x[p])
        fp = _objective(data)(up[None], cand[p])[0] * n_tot[p]
        use = np.isfinite(fp)
        fin_x[p[use]], fin_on[p[use]], f_last[p[use]] = x[p[use]], on[p[use]], fp[use]
        H_prev[p[use & ~keep_h[p]]] = np.nan  # (no Hessian there)
    better = np.isfinite(f_last) & (f_last <= f_opt + 1e-13 * (1 + np.abs(f_opt)))
    H_out[cand] = np.where(better[:, None, None], H_prev, H_first)
    if not better.any():
        return opt, H_out
    g = cand[better]
    u, f = opt.u.copy(), opt.f.copy()
    xb = fin_x[better]
    u[g] = np.where(positive, np.log(np.maximum(xb, 1e-300)), xb)
    u[g] = np.where(fin_on[better], optim._BOUND_TARGET, u[g])
    f[g] = f_last[better] / n_tot[better]
    at_b = opt.at_boundary.copy()
    at_b[g] |= fin_on[better]
    n_iter = opt.n_iter.copy()
    n_iter[g] += iters[better]
    return opt._replace(u=u, f=f, at_boundary=at_b, n_iter=n_iter), H_out


def _newton_steps(g: np.ndarray, H: np.ndarray, free: np.ndarray) -> np.ndarray:
    """``d [n, k]``: the Newton steps ``-H^-1 g`` on the ``free [n, k]`` coordinates (0
    elsewhere); NaN rows where that block is not positive definite (no maximum to step to).
    The blocks' inverses are :func:`optim.held_covariances`' (the other coordinates held),
    of the Jacobi-scaled Hessian (:func:`_jacobi`)."""
    d = np.zeros_like(g)
    Hs, dj = _jacobi(H)
    for _, rows, keep, pd, cov in optim.held_covariances(Hs, ~free, free.any(1)):
        d[rows[~pd]] = np.nan
        if cov is not None:
            dk = dj[rows[pd]][:, keep]
            step = -np.einsum("nij,nj->ni", cov, g[rows[pd]][:, keep] * dk) * dk
            d[np.ix_(rows[pd], keep)] = step
    return d


class _Core(NamedTuple):
    """What :func:`_fit_core` returns: natural estimates ``{name: [N]}``, ``loglik [N]``, the
    optimizer's :class:`~kalmanscan.timeseries.optim.NewtonResult` (standardized), the
    standardization (``m``, ``s`` per series, ``tau``), ``usable [N]`` and the filter result
    at the estimate (standardized data, lanes ``[1, N]``)."""

    est: dict
    loglik: np.ndarray
    opt: optim.NewtonResult
    m: np.ndarray
    s: np.ndarray
    tau: float
    usable: np.ndarray
    filtered: object
    data: _Data
    white: np.ndarray | None = None  # [G]: groups found to be white noise (_white_noise)
    # [G, k, k]: the exact-gradient Hessian at the estimate where _refine_small made it (NaN
    # elsewhere), which the standard errors reuse
    exact_hessian: np.ndarray | None = None


def _fit_core(
    Z, dt, fixed_flat, free, init, joint, max_iter, tol, backend, device, moments=None
) -> _Core:
    """Standardize ``Z [T, N]``, fit, and map back (see the module docstring). ``moments``:
    :func:`_nan_moments` of ``Z``, if known."""
    T, N = Z.shape
    device = torch.device(device)
    n_obs = (~np.isnan(Z)).sum(0)
    # on a device, the moments and the standardized data are computed there
    Zd = Z if device.type == "cpu" else torch.as_tensor(Z, dtype=torch.float64, device=device)
    m, s = _location_scale(Zd, joint, moments if device.type == "cpu" else None)
    usable = np.full(N, bool(s[0] > 0) and n_obs.sum() >= 2) if joint else (n_obs >= 2) & (s > 0)
    m = np.where(usable & np.isfinite(m), m, 0.0)
    s = np.where(usable, s, 1.0)
    pos_dt = dt[dt > 0]
    tau = float(np.median(pos_dt)) if pos_dt.size else 1.0
    if device.type == "cpu":
        zs = (Z - m) / s
    else:
        zs = (Zd - torch.as_tensor(m, device=device)) / torch.as_tensor(s, device=device)
    regular = T > 1 and bool(np.all(dt[1:] == tau))  # every step one tau: lane arrays suffice
    fixed = {}
    for p, v in fixed_flat.items():
        fixed[p] = {
            "theta": v * tau,
            "sigma2": v * tau / s**2,
            "mu": (v - m) / s,
            "obs_var": v / s**2,
        }[p]
    f64 = dict(dtype=torch.float64, device=device)
    theta_zero = "theta" in fixed and bool(np.all(fixed["theta"] == 0))
    zs_t = torch.as_tensor(zs, **f64)
    data = _Data(
        zs=zs_t,
        dt=torch.as_tensor(1.0 if regular else dt / tau, **f64),
        fixed=fixed,
        group=np.zeros(N, np.int64) if joint else np.arange(N),
        n_obs=n_obs,
        free=tuple(free),
        theta_zero=theta_zero,
        joint=joint,
        backend=backend,
        lean=_lean_available(backend, zs_t),
    )
    start = _start(zs, dt / tau, fixed, joint)
    G = 1 if joint else N
    for p, v in (init or {}).items():  # natural -> standardized
        v = np.broadcast_to(np.asarray(v, dtype=np.float64), (N,))
        v = v[:1] if joint else v
        sg, mg = (s[:1], m[:1]) if joint else (s, m)
        start[p] = {
            "theta": v * tau,
            "sigma2": v * tau / sg**2,
            "mu": (v - mg) / sg,
            "obs_var": v / sg**2,
        }[p]
    positive = np.array([p in _POSITIVE for p in free], dtype=bool)
    active = usable[:1] if joint else usable
    white = _white_noise(data, dt / tau, usable) if free else None
    if free:
        u0 = np.stack([np.log(start[p]) if p in _POSITIVE else start[p] for p in free], 1)
        u0 = u0.reshape(G, len(free))
        opt = optim.minimize(
            _objective(data), u0, positive, max_iter=max_iter, gtol=tol,
            h=np.array([_STENCIL_H_MU if p == "mu" else _STENCIL_H for p in free]),
            h_cross=_STENCIL_H,
            active=active, quadratic=np.array([p == "mu" for p in free]),
            settled=None if white is None else white.settled,
        )  # fmt: skip
        if white is not None:
            opt, white = white.place(opt)
        opt, exact_h = _refine_small(data, opt, positive)
    else:  # nothing to fit (a profile point of the only free parameter): the likelihood only
        status = np.where(active, optim.CONVERGED, optim.RUNNING)
        empty = np.zeros((G, 0))
        opt = optim.NewtonResult(
            empty, np.full(G, np.nan), empty, np.zeros((G, 0, 0)), empty.astype(bool), status,
            np.zeros(G, np.int64),
        )  # fmt: skip
        exact_h = None
    # natural estimates per series
    x = {}
    for j, p in enumerate(free):
        uj = opt.u[:, j]
        uj = np.full(N, uj[0]) if joint else uj
        x[p] = np.exp(uj) if p in _POSITIVE else uj
    x.update({p: np.asarray(v, dtype=np.float64) for p, v in fixed.items()})
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        est = {
            "theta": x["theta"] / tau,
            "sigma2": x["sigma2"] * s**2 / tau,
            "mu": m + s * x["mu"],
            "obs_var": x["obs_var"] * s**2,
        }
    est.update({p: np.asarray(v, dtype=np.float64).copy() for p, v in fixed_flat.items()})
    for p in free:
        bad = ~np.isfinite(est[p]) | ((x[p] > 0) & (est[p] == 0) & (p in _POSITIVE))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"z: the estimate of {p} for series {i} ({x[p][i]:.3g} in units of the data's "
                f"scale {s[i]:.3g}) is beyond float64's range in the data's units; rescale z "
                "(e.g. divide by a power of ten) and rescale the variances back"
            )
    # log-likelihood at the estimate: standardized, then the change of scale of each
    # observation that contributes (all but a diffuse first one)
    series = np.arange(N)
    res = _lean_filter(data, x) if data.lean else None
    if res is None:
        xs = {p: torch.as_tensor(v[None, :], **f64) for p, v in x.items()}
        res = _series_loglik(data, xs, series, outputs=True)
    ll_std = res.loglik.reshape(N).cpu().numpy()
    diffuse = (x["theta"] == 0) & (n_obs >= 1)
    loglik = ll_std - (n_obs - diffuse) * np.log(s)
    return _Core(est, loglik, opt, m, s, tau, usable, res, data, white, exact_h)


def _constant_series(Z, n_obs, moments=None) -> np.ndarray:
    """Which series (columns of ``Z [T, N]``, ``n_obs [N]`` observed values each; ``moments``:
    :func:`_nan_moments` of ``Z``, if known) are constant: 2 or more observed values, all equal
    (no noise to estimate)."""
    sd = (_nan_moments(Z) if moments is None else moments)[2]
    return (n_obs >= 2) & (sd == 0)


def _constant_refusal(first: float) -> ValueError:
    """The refusal of data whose every series is constant (``first``: the first observed value,
    time first, then series in C order)."""
    return ValueError(
        f"z: every observed value is {first!r} (a constant series): the likelihood grows "
        "without bound as obs_var -> 0, so there is no maximum-likelihood estimate"
    )


def _nothing_to_fit(few: list, n_few: int, constant: list, n_constant: int) -> ValueError:
    """The refusal of separate fits with no series to fit: ``n_few`` series with fewer than 2
    observations and ``n_constant`` constant ones (``few``, ``constant``: the first names)."""
    return ValueError(
        "z: expected a series to fit (2 or more observed values, not all equal), got none: "
        f"series {_listed(few, n_few)} have fewer than 2 observations; series "
        f"{_listed(constant, n_constant)} are constant (no noise to estimate)"
    )


@contextlib.contextmanager
def _one_chunk():
    """Fits in this block see one chunk of a larger array (the xarray accessor's dask chunks): a
    chunk without a series to fit (each constant or with fewer than 2 observations) is fitted as
    the whole array's fit treats such series (starting values, marked not converged, with its
    warning) instead of refused, the caller refusing an array without one. Separate fits only;
    robust fits (their refits) included."""
    token = _ONE_CHUNK.set(True)
    try:
        yield
    finally:
        _ONE_CHUNK.reset(token)


@contextlib.contextmanager
def _glue_single_threaded():
    """Torch's intra-op threads set to 1 for the duration of a fit, the native kernel keeping the
    threads it had. A fit runs a few dozen small torch operations per filter call; with OpenMP
    threads each waits for every thread of the pool, and where another process holds a core that
    wait is a scheduler time slice: measured on the 2-core machine with one busy process, a
    100 x 500 fit took 4x longer with torch's two threads than with one (docs/performance-cpu.md,
    "Fitting"). The kernel's own threads take tiles of lanes as they come and do not wait."""
    from kalmanscan.core import native

    n = torch.get_num_threads()
    setter = getattr(native, "set_num_threads", None)
    if n == 1 or setter is None:  # without the kernel's own setting, keep torch's
        yield
        return
    before = getattr(native, "_NUM_THREADS", None)
    setter(n if before is None else before)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
        setter(before)


def _check_options(max_iter, tol, joint, stderr):
    max_iter = _args.check_int("max_iter", max_iter)
    if max_iter < 1:
        raise ValueError(f"max_iter: expected an int >= 1, got {max_iter}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)):
        raise TypeError(f"tol: expected a positive number, got {tol!r}")
    if not (math.isfinite(float(tol)) and float(tol) > 0):
        raise ValueError(f"tol: expected a positive finite number, got {_plain(tol)}")
    for name, v in (("joint", joint), ("stderr", stderr)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name}: expected True or False, got {v!r}")
    return max_iter, float(tol)


def fit_ou(
    z,
    times=None,
    *,
    fix=None,
    init=None,
    joint: bool = False,
    axis: int = 0,
    time_unit=None,
    max_iter: int = 500,
    tol: float = 1e-9,
    stderr: bool = True,
    backend: str = "auto",
    device=None,
    robust: bool = False,
    series_labels=None,
) -> OUFit:
    """Fit ``theta, sigma2, mu, obs_var`` of an OU / local-level model by maximum likelihood.

    Args:
        z: ``[T, *S]`` observations (time on ``axis``), NaN = missing; pandas Series/DataFrame
            allowed (index = times, columns = series).
        times: ``[T]`` timestamps (numbers or datetimes; irregular allowed); default ``0..T-1``.
        fix: parameters held fixed, e.g. ``{"theta": 0.0, "mu": 0.0}`` (the local-level model).
        init: optional starting values ``{name: value}`` for free parameters.
        joint: ``True`` fits one parameter set to all series; ``False`` (default) one per series.
        time_unit: model time unit for datetime times (default ``"1D"``).
        max_iter: Newton iteration limit (``>= 1``). tol: gradient tolerance on the
            negative log-likelihood per observation, in standardized log coordinates.
        stderr: compute standard errors from the Hessian.
        backend: filter backend. device: torch device for the optimization (default CPU); one
            this torch cannot use (``"cuda"`` without CUDA) raises ``ValueError``.
        robust: screen out observations whose standardized auxiliary residual exceeds a
            Bonferroni bound and refit until the screened set repeats
            (:func:`kalmanscan.timeseries.robust.fit_ou_robust`, which also takes the threshold);
            ``OUFit.outliers`` marks them.
        series_labels: one name per series (the series flattened in C order) for the warnings,
            notes, ``summary()`` and ``OUFit.series_labels``; default: a DataFrame's columns (a
            2-D DataArray's labels), else none (series named by position).

    The prior is the model default (stationary for ``theta > 0``, diffuse at ``theta = 0``), so a
    free ``theta`` is estimated with the stationary prior. Warns when a fit does not converge, when
    an estimate sits on its boundary (a variance at 0: no standard error for it, the others' with
    it held at 0, see ``OUFit.notes``), when a local level of two observations leaves sigma2
    and obs_var not identified (no standard errors) and when one observation dominates the
    likelihood; series with fewer than 2 observations or constant keep their starting values
    (not converged, named in ``OUFit.notes``, left out of ``total_loglik``; NaN, with a warning,
    in every output the fit computes from the parameters: filter, smooth, disturbances, forecast,
    to_dataset), and data without a series to fit are refused. Returns an :class:`OUFit`.

    >>> import kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> round(fit.params["obs_var"], -1), round(fit.params["sigma2"]), round(fit.loglik, 2)
    (15100.0, 1469, -632.55)
    """
    if not isinstance(robust, (bool, np.bool_)):
        raise TypeError(f"robust: expected True or False, got {robust!r}")
    device = _args.check_device("device", device)  # (one this torch can use, or None)
    # values given as pandas / xarray objects go to the series their labels name
    if isinstance(fix, dict):
        fix = {k: align_to_data(f"fix[{k!r}]", v, z, axis) for k, v in fix.items()}
    if isinstance(init, dict):
        init = {k: align_to_data(f"init[{k!r}]", v, z, axis) for k, v in init.items()}
    if robust:
        from kalmanscan.timeseries.robust import fit_ou_robust

        return fit_ou_robust(
            z, times, fix=fix, init=init, joint=joint, axis=axis, time_unit=time_unit,
            max_iter=max_iter, tol=tol, stderr=stderr, backend=backend, device=device,
            series_labels=series_labels,
        )  # fmt: skip
    max_iter, tol = _check_options(max_iter, tol, joint, stderr)
    zt, times, labels = series_input(z, times, axis)
    T = zt.shape[0]
    if zt.size == 0:
        shape = np.moveaxis(zt, 0, axis).shape
        raise ValueError(f"z: expected at least one series, got shape {shape}")
    ax = as_time_axis(times, T, time_unit)
    shape = zt.shape[1:]
    if series_labels is not None:
        labels = _check_series_labels(series_labels, shape)
    # C order whatever the input's layout (a DataFrame's values are Fortran-ordered): the sums
    # over time then run in one order, so the fit is the same to the last bit
    Z = np.ascontiguousarray(zt.reshape(T, -1), dtype=np.float64)
    N = Z.shape[1]
    fixed = _check_fix(fix, shape)
    free = [p for p in PARAMS if p not in fixed]
    fixed_flat = {
        k: np.broadcast_to(v, shape).reshape(N).astype(np.float64) for k, v in fixed.items()
    }
    n_obs = (~np.isnan(Z)).sum(0)
    if init is not None:
        if not isinstance(init, dict):
            raise TypeError(f"init: expected a dict of starting values, got {type(init).__name__}")
        for k, v in init.items():
            if k not in free:
                raise ValueError(f"init: expected keys among the free parameters {free}, got {k!r}")
            arr = _args.as_real_numpy(f"init[{k!r}]", v).astype(np.float64)
            try:
                arr = np.broadcast_to(arr, shape)
            except ValueError as err:
                raise ValueError(
                    f"init[{k!r}]: expected a scalar or an array broadcasting to the series "
                    f"shape {shape}, got shape {arr.shape}"
                ) from err
            ok = np.isfinite(arr) & ((arr > 0) if k != "mu" else True)
            if not ok.all():
                rng = "finite" if k == "mu" else "> 0"
                raise ValueError(
                    f"init[{k!r}]: expected values {rng}, got {_plain(arr[~ok].ravel()[0])}"
                )
    init_flat = {k: np.broadcast_to(v, shape).reshape(N) for k, v in (init or {}).items()}
    if n_obs.max() < 2 and not _ONE_CHUNK.get():
        raise ValueError(
            "z: expected at least 2 observed values in a series to fit, got at most "
            f"{int(n_obs.max())}"
        )
    moments = _nan_moments(Z)
    constant = _constant_series(Z, n_obs, moments)
    one_chunk = _ONE_CHUNK.get()  # (the caller refuses the whole array)
    if (constant.all() and not one_chunk) or (joint and bool(np.all(moments[2][n_obs >= 1] == 0))):
        raise _constant_refusal(float(Z[~np.isnan(Z)][0]))
    if not (joint or one_chunk or ((n_obs >= 2) & ~constant).any()):  # constant or short, each
        few, const = np.flatnonzero(n_obs < 2), np.flatnonzero(constant)
        raise _nothing_to_fit(_shown(few, labels), few.size, _shown(const, labels), const.size)
    if ("theta" in free or "sigma2" in free) and not (ax.dt > 0).any():
        raise ValueError(
            f"times: all {T} timestamps are equal, so the rates theta and sigma2 (per time unit) "
            "cannot be estimated; give distinct timestamps or fix theta and sigma2"
        )
    _, s_all = _location_scale(Z, joint, moments)
    ok_s = (s_all > 0) & np.isfinite(s_all)
    out = ok_s & ((s_all < _SCALE_RANGE[0]) | (s_all > _SCALE_RANGE[1]))
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise ValueError(
            f"z: the data's scale (the smaller of its standard deviation and its typical step) "
            f"is {s_all[i]:.3g}"
            + ("" if joint or unnamed(N, labels) else f" in series {_names([i], labels)}")
            + "; expected a scale from 1e-150 to 1e150, so that the variances (obs_var and "
            "sigma2, of the order of its square), and the smaller ones an estimate can reach, stay "
            "normal float64 numbers; rescale z (e.g. divide by a power of ten) and the "
            "variances back, or, if one value is a data error, fit with robust=True (--robust)"
        )
    device = torch.device(device) if device is not None else torch.device("cpu")
    with _glue_single_threaded():
        return _fit_finish(
            Z, zt, ax, shape, labels, fixed, fixed_flat, free, init_flat, n_obs, constant, joint,
            max_iter, tol, stderr, backend, device, time_unit, moments,
        )  # fmt: skip


def _fit_finish(
    Z, zt, ax, shape, labels, fixed, fixed_flat, free, init_flat, n_obs, constant, joint,
    max_iter, tol, stderr, backend, device, time_unit, moments=None,
) -> OUFit:  # fmt: skip
    """:func:`fit_ou` after its argument checks: fit, then warnings, notes and the result."""
    N = Z.shape[1]
    core = _fit_core(Z, ax.dt, fixed_flat, free, init_flat, joint, max_iter, tol, backend, device,
                     moments)  # fmt: skip
    # a local level of two observations: sigma2 and obs_var on a ridge, neither on a bound
    ridge = _level_ridge(Z, ax.t, fixed_flat, free, joint, core.usable)
    if ridge.any():
        core = core._replace(
            opt=core.opt._replace(at_boundary=core.opt.at_boundary & ~ridge[:, None])
        )
    opt = core.opt
    unusable = ~core.usable
    notes = []
    if unusable.any() and not joint:
        few, const = np.flatnonzero(n_obs < 2), np.flatnonzero(constant)
        parts = []
        if few.size:
            parts.append(f"series {_names(few, labels)} have fewer than 2 observations")
        if const.size:
            parts.append(f"series {_names(const, labels)} are constant (no noise to estimate)")
        warnings.warn(
            "fit_ou: " + "; ".join(parts) + "; their parameters stay at the starting values and "
            "are marked not converged",
            stacklevel=3,
        )
        notes.append(
            "; ".join(parts) + ": not fitted; their parameters stay at the starting values (no "
            "standard errors, marked not converged) and their log-likelihoods there are left out "
            "of total_loglik"
        )
    converged = opt.status == optim.CONVERGED
    failed = np.flatnonzero(core.usable[:1] & ~converged if joint else core.usable & ~converged)
    if failed.size:
        reasons = sorted({optim.STATUS_TEXT[c] for c in opt.status[failed]})
        warnings.warn(
            f"fit_ou: {failed.size} of {converged.size} fits did not converge ("
            + "; ".join(reasons)
            + ")"
            + ("" if joint or unnamed(N, labels) else f": series {_names(failed, labels)}"),
            stacklevel=3,
        )
    # estimates on their boundary
    at_boundary = {}
    for j, p in enumerate(free):
        b = opt.at_boundary[:, j]
        at_boundary[p] = b
        if b.any():
            idx = np.flatnonzero(b)
            where = "" if joint or unnamed(N, labels) else f" in series {_names(idx, labels)}"
            text = _boundary_note(p, where, free)
            notes.append(text)
            warnings.warn("fit_ou: " + text, stacklevel=3)
    if ridge.any():
        idx = np.flatnonzero(ridge)
        text = _ridge_note(
            "" if joint or unnamed(N, labels) else f" in series {_names(idx, labels)}"
        )
        notes.append(text)
        warnings.warn("fit_ou: " + text, stacklevel=3)
    white = np.flatnonzero(core.white) if core.white is not None else np.empty(0, int)
    if white.size:
        if joint:
            where = "the series (fitted jointly) show"
        elif unnamed(N, labels):
            where = "the series shows"
        else:
            where = f"series {_names(white, labels)} show"
        text = (
            f"{where} no persistence: the likelihood is that of white noise around mu, reached "
            "as theta -> infinity (each state independent of the last, where sigma2 / (2 theta) "
            "and obs_var are not told apart) or as sigma2 -> 0 alike; reported with sigma2 on its "
            "bound 0, obs_var the series' variance and mu its mean; theta is not identified (no "
            "standard error)"
        )
        notes.append(text)
        warnings.warn("fit_ou: " + text, stacklevel=3)
    if "mu" in free and "theta" in fixed:
        idle = np.flatnonzero(_mu_unused(core, joint) & (core.usable[:1] if joint else core.usable))
        if idle.size:
            where = "" if joint or unnamed(N, labels) else f" in series {_names(idle, labels)}"
            notes.append(
                f"mu is not estimated{where}: with theta fixed at 0 (a random walk) it does not "
                "enter the likelihood, so it stays at its starting value (init, else the data's "
                "mean) and has no standard error; fix it too (fix={'theta': 0.0, 'mu': 0.0}) for "
                "the local level model"
            )
    # outliers: one observation carrying most of the squared innovations, checked by a refit
    if not joint:
        notes += _outlier_check(core, Z, ax, fixed_flat, free, labels, max_iter, tol, backend,
                                device)  # fmt: skip
    se_g, se_ok, why = _fit_standard_errors(core, free, joint, exact=stderr)
    for v in se_g.values():  # (the ridge's note says why they have none)
        v[ridge] = np.nan
    se_ok, why = se_ok & ~ridge, np.where(ridge, "", why)
    if stderr:
        lost = np.flatnonzero(~se_ok & (core.usable[:1] if joint else core.usable))
        for reason in sorted(set(why[lost])):
            if reason:
                idx = lost[why[lost] == reason]
                notes.append(
                    "no standard errors"
                    + ("" if joint or unnamed(N, labels) else f" for series {_names(idx, labels)}")
                    + f": {reason}"
                )
    else:
        se_g = {p: np.full_like(v, np.nan) for p, v in se_g.items()}

    def shaped(a):
        a = np.asarray(a, dtype=np.float64)
        if joint:
            return float(a.reshape(-1)[0])
        return float(a.reshape(shape)) if shape == () else a.reshape(shape)

    upper = {}
    if stderr and any(v.any() for v in at_boundary.values()):
        # the boundary estimates' profile bounds (a few dozen refits) are computed when first
        # read (fit.upper_bound, fit.notes, summary(), the CLI), not by every fit
        slim = core._replace(filtered=None, data=None)
        args = (slim, Z, ax.dt, fixed_flat, free, joint, max_iter, tol, backend, device, labels)
        upper, notes = _bounds_on_read(args, notes, shaped)

    def per_group(a):
        return a[:1] if joint else a

    params = {p: shaped(per_group(core.est[p])) for p in free}
    params.update(fixed)
    model = OUModel(time_unit=time_unit, **params)
    ll = core.loglik
    ll_out = float(ll.reshape(())) if shape == () else ll.reshape(shape)
    conv = converged & (core.usable[:1] if joint else core.usable)
    conv_out = bool(conv[0]) if (joint or shape == ()) else conv.reshape(shape)
    bnd_out = {
        p: (bool(v[0]) if (joint or shape == ()) else v.reshape(shape))
        for p, v in at_boundary.items()
    }
    from kalmanscan.timeseries import profile  # what OUFit.profile_interval refits with

    keep = profile.state(core, ax.dt, fixed_flat, free, max_iter, tol, backend, device)
    return OUFit(
        model=model,
        loglik=ll_out,
        stderr={p: shaped(se_g[p]) for p in PARAMS},
        fixed=fixed,
        converged=conv_out,
        n_iter=int(opt.n_iter.max()),
        n_obs=int(n_obs[0]) if shape == () else n_obs.reshape(shape),
        joint=joint,
        z=zt,
        time_axis=ax,
        series_labels=labels,
        at_boundary=bnd_out,
        notes=notes if isinstance(notes, _LazyNotes) else tuple(notes),
        upper_bound=upper,
        _profile_state=keep,
    )
