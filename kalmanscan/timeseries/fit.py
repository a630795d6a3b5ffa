"""Maximum-likelihood fitting of OU / local-level models: a batched Newton method over all series.

The data are standardized per series (location ``m``, scale ``s``; time by the median step
``tau``), so the fit sees values of order 1 whatever the units: ``fit_ou(c * z)`` is ``fit_ou(z)``
with the variances times ``c**2``. Positive parameters are optimized as logs, ``mu`` as is, in
those standardized units, with no bounds. Every series takes its own Newton steps with its own
line search, all series advancing together in one filter call per step; the gradient and Hessian
come from a central-difference stencil of log-likelihood values
(:mod:`kalmanscan.timeseries.optim`). A positive estimate that ends below ``_SMALL`` of the scale
is finished in natural coordinates (:func:`_refine_small`: the bound 0 as an active constraint),
and the standard errors of such fits (and of those with an estimate on its bound, or a stencil
Hessian that is not positive definite) come from a Hessian in natural coordinates from exact
gradients (:func:`_natural_hessian`), not from the stencil in logs, which rounds a small
variance's curvature away.
The scale ``s`` is the smaller of the standard deviation and the typical step, so a variance is
judged to sit on its bound 0 relative to the noise of the record. The model: docs/model.md; the
method and its measured cost: docs/performance-cpu.md, "Fitting".
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import _args
from kalmanscan.timeseries import optim
from kalmanscan.timeseries.model import (
    PARAMS,
    Forecast,
    OUModel,
    align_to_data,
    forecast_from_state,
    series_input,
)
from kalmanscan.timeseries.objective import (  # noqa: F401 (the fit's evaluations)
    _NAT_REL,
    _POSITIVE,
    _SMALL,
    _Data,
    _from_prior_np,
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
from kalmanscan.timeseries.robust import Disturbances
from kalmanscan.timeseries.times import TimeAxis, as_time_axis

# standardization: s**2 must stay well inside float64 for the variances to be representable
_SCALE_RANGE = (1e-150, 1e150)
# an observation whose squared standardized innovation exceeds this and half the series' total
# is checked for dominating the fit (refit without it)
_OUTLIER_E2 = 25.0
_STENCIL_H = 1e-3  # central-difference step in the standardized unconstrained coordinates
_REFINE_ITER = 20  # Newton steps in natural coordinates finishing a small estimate (_refine_small)


@dataclass
class OUFit:
    """Result of :func:`fit_ou`.

    Fields:
        model: the fitted :class:`OUModel` (parameters scalars when ``joint`` or one series, else
            arrays over the series shape ``S``).
        loglik: log-likelihood per series (``S``; a float for one series) at the estimate.
        stderr: ``{name: standard error}`` from the inverse Hessian; NaN for fixed parameters, for
            one on its boundary (the others' are then those with it held at 0), or where the
            Hessian is not positive definite.
        fixed: the fixed parameters. converged: per series (or one bool when ``joint``).
        n_iter: Newton iterations (the most any series took). n_obs: observations per series.
        joint: one parameter set for all.
        z: the data, time first ``[T, *S]``. time_axis: its :class:`TimeAxis`.
        series_labels: names of the series (e.g. DataFrame columns) or ``None``.
        at_boundary: ``{name: bool}`` per series (free parameters): the estimate sits on its lower
            bound 0 (no standard error for it there). notes: why standard errors are
            missing, estimates on a boundary, observations that dominate the likelihood.
        upper_bound: ``{name: bound}`` per series for ``theta``, ``sigma2``, ``obs_var``: where the
            estimate is on its bound 0, the one-sided 95% profile-likelihood upper bound reported
            in place of a standard error (:mod:`kalmanscan.timeseries.profile`); NaN elsewhere.
        outliers: with ``robust=True``, ``[T, *S]`` True where an observation was screened out
            (:mod:`kalmanscan.timeseries.robust`; ``z`` holds NaN there); else ``None``.
        outlier_values: with ``robust=True``, the screened observations' own values
            ``[k]``, in the order of ``z[outliers]`` (``z[outliers] = outlier_values`` restores
            the data); else ``None``.
    """

    model: OUModel
    loglik: object
    stderr: dict
    fixed: dict
    converged: object
    n_iter: int
    n_obs: object
    joint: bool
    z: np.ndarray = field(repr=False)
    time_axis: TimeAxis = field(repr=False)
    series_labels: list | None = field(default=None, repr=False)
    at_boundary: dict = field(default_factory=dict, repr=False)
    notes: tuple = ()
    upper_bound: dict = field(default_factory=dict, repr=False)
    outliers: np.ndarray | None = field(default=None, repr=False)
    outlier_values: np.ndarray | None = field(default=None, repr=False)

    @property
    def params(self) -> dict:
        """Estimated and fixed parameters, ``{name: value}``."""
        return self.model.params()

    @property
    def total_loglik(self) -> float:
        return float(np.sum(self.loglik))

    def filter(self):
        """:class:`kalmanscan.FilterResult` of the data under the fitted model (time first)."""
        return self.model.filter_prepared(self.z, self.time_axis)

    def smooth(self):
        """:class:`kalmanscan.SmoothResult` of the data under the fitted model (time first)."""
        return self.model.filter_prepared(self.z, self.time_axis, smooth=True)

    def disturbances(self) -> Disturbances:
        """Standardized smoothed disturbances of the data under the fitted model (the auxiliary
        residuals of Harvey & Koopman 1992; Durbin & Koopman 2012, section 2.12): a
        :class:`~kalmanscan.timeseries.robust.Disturbances` of float64 arrays laid out as ``z``
        (``[T, *S]``; ``[T]`` for one series), NaN where undefined.

        - ``observation[t]``: the observation against its smoothed prediction, over its standard
          deviation; an outlier shows here. NaN where ``z`` is missing, and where ``obs_var`` is
          on its bound 0 (``at_boundary``: the observation is the state).
        - ``state[t]``: the state's smoothed innovation on the step from row ``t - 1`` to row
          ``t``, over its standard deviation; a break of the level shows here. NaN in row 0,
          where ``sigma2`` is on its bound 0, and on steps the data say nothing of (after the
          last observation; before the first one where the start is diffuse).
        - A robust fit (``outliers``) is smoothed without its screened observations, as it was
          fitted; a screened observation's ``observation`` is its deletion residual, its value
          against its prediction from the kept data (variance ``obs_var`` plus the state's),
          the statistic the screen judged. Its value comes from ``outlier_values``; where the
          fit does not hold them (``outlier_values=None``) that entry is NaN.

        >>> import numpy as np, kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
        >>> d = fit.disturbances()
        >>> d.state.shape, d.observation.shape
        ((100,), (100,))
        >>> top = lambda r: int(years[np.nanargmax(np.abs(r))])
        >>> top(d.state), top(d.observation)  # the break of 1899 and the outlier of 1913 (D&K 2.12)
        (1899, 1913)
        """
        from kalmanscan.timeseries.robust import smoothed_disturbances

        shape = self.z.shape
        T = shape[0]
        z = np.array(self.z, dtype=np.float64).reshape(T, -1)
        screened = np.zeros(z.shape, bool)
        if self.outliers is not None:
            out = np.asarray(self.outliers)
            if out.dtype != bool or out.shape != shape:
                raise ValueError(
                    f"outliers: expected a bool array of the data's shape {shape}, got "
                    f"{out.dtype} of shape {out.shape}"
                )
            screened = out.reshape(z.shape)
            if self.outlier_values is not None:
                vals = np.asarray(self.outlier_values, dtype=np.float64)
                k = int(screened.sum())
                if vals.shape != (k,):
                    raise ValueError(
                        f"outlier_values: expected the {k} screened observations' values (shape "
                        f"({k},)), got shape {vals.shape}"
                    )
                z[screened] = vals
        d = smoothed_disturbances(self, z, screened)
        return Disturbances(d.observation.reshape(shape), d.state.reshape(shape))

    def forecast(self, steps=None, *, at=None, coverage: float = 0.95) -> Forecast:
        """Forecast ``steps`` typical steps past the last timestamp, or at timestamps ``at``."""
        res = self.filter()
        return forecast_from_state(
            self.model,
            self.time_axis,
            res.mean[-1],
            res.var[-1],
            steps=steps,
            at=at,
            coverage=coverage,
        )

    def to_dataset(
        self,
        *,
        coverage=(0.5, 0.9),
        smooth: bool = True,
        forecast_steps=None,
        forecast_at=None,
        series_dims=None,
        series_coords=None,
        name: str | None = None,
    ):
        """Filtered/smoothed/forecast ``xarray.Dataset`` with the fit recorded (needs xarray)."""
        if series_coords is None and self.series_labels is not None and self.z.ndim == 2:
            series_coords = {"series": self.series_labels}
        return self.model.to_dataset(
            self.z,
            self.time_axis,
            coverage=coverage,
            smooth=smooth,
            forecast_steps=forecast_steps,
            forecast_at=forecast_at,
            series_dims=series_dims,
            series_coords=series_coords,
            name=name,
            fit=self,
        )

    def summary(self, max_series: int = 10) -> str:
        """A plain-text table of estimates and standard errors."""
        free = [p for p in PARAMS if p not in self.fixed]
        fixed = ", ".join(
            f"{k}={float(np.ravel(v)[0]) if np.size(v) == 1 else 'array'}"
            for k, v in self.fixed.items()
        )
        shape = self.z.shape[1:]
        n_series = int(np.prod(shape)) if shape else 1
        labels = self.series_labels or [str(i) for i in range(n_series)]
        # the series column as wide as the longest name shown, from 10 to 30 characters
        w = min(max([10] + [len(str(x)) for x in labels[:max_series]]), 30)

        def name(x):  # a longer name cut, with "~" where it was cut
            x = str(x)
            return x if len(x) <= w else x[: w - 1] + "~"

        lines = [
            f"OU model fit by maximum likelihood: {n_series} series, {self.z.shape[0]} time steps"
            + (f", {self.time_axis.unit_name} per time unit" if self.time_axis.is_datetime else ""),
            f"fixed: {fixed}" if fixed else "fixed: none",
            f"{'series':>{w}} "
            + " ".join(f"{p:>14} {'(s.e.)':>10}" for p in free)
            + f" {'loglik':>12} {'conv':>5}",
        ]
        est = {
            p: np.broadcast_to(np.asarray(self.params[p], dtype=float), shape).ravel() for p in free
        }
        se = {
            p: np.broadcast_to(np.asarray(self.stderr[p], dtype=float), shape).ravel() for p in free
        }
        ll = np.broadcast_to(np.asarray(self.loglik, dtype=float), shape).ravel()
        conv = np.broadcast_to(np.asarray(self.converged), shape).ravel()
        ub = {
            p: np.broadcast_to(np.asarray(self.upper_bound.get(p, np.nan), float), shape).ravel()
            for p in free
        }

        def se_cell(p, i):  # a boundary estimate: its one-sided 95% upper bound, "<b"
            b = ub[p][i]
            return f"{'<' + format(b, '.4g'):>10}" if not np.isnan(b) else f"{se[p][i]:>10.4g}"

        for i in range(min(n_series, max_series)):
            cells = " ".join(f"{est[p][i]:>14.6g} {se_cell(p, i)}" for p in free)
            lines.append(f"{name(labels[i]):>{w}} {cells} {ll[i]:>12.4f} {str(bool(conv[i])):>5}")
        if n_series > max_series:
            lines.append(f"... {n_series - max_series} more series")
        lines.append(
            f"total loglik {self.total_loglik:.4f} over {int(np.sum(self.n_obs))} observations"
            " (exact diffuse convention: steps with zero prior precision add nothing); "
            f"{self.n_iter} Newton iterations"
            + (", one parameter set for all series" if self.joint else "")
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


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
            raise ValueError(f"fix[{k!r}]: expected values {rng}, got {arr[bad].ravel()[0]!r}")
        out[k] = float(arr) if arr.ndim == 0 else arr
    if len(out) == len(PARAMS):
        raise ValueError("fix: every parameter is fixed, nothing to fit; use OUModel(...) directly")
    return out


def _natural(u: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """The free parameters in natural standardized units from the optimizer's ``u``."""
    with np.errstate(over="ignore", under="ignore"):
        return np.where(positive, np.exp(u), u)


def _held(data: _Data, at_boundary: np.ndarray) -> np.ndarray:
    """``[G, k]``: the free estimates held in the observed information: those on their bound, and
    ``mu`` where the random walk does not depend on it (``theta`` on its bound, or fixed at 0)."""
    free = data.free
    held = np.asarray(at_boundary, dtype=bool).copy()
    if "mu" in free:
        m = free.index("mu")
        if "theta" in free:
            held[:, m] |= held[:, free.index("theta")]
        elif "theta" in data.fixed:
            zero = np.asarray(data.fixed["theta"]) == 0
            held[:, m] |= np.array([zero.all()]) if data.joint else zero
    return held


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
    """
    x_all = _natural(opt.u, positive)
    held0 = _held(data, opt.at_boundary)
    small = positive[None, :] & ~held0 & (x_all < _SMALL)
    cand = np.flatnonzero((opt.status == optim.CONVERGED) & small.any(1))
    if cand.size == 0:
        return opt
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
    # the point to keep per group: the last one evaluated, unless a later step is pending
    fin_x, fin_on = prev[0], prev[1]
    pending = live | (prev[2] == np.inf)
    if pending.any():  # evaluate the points not yet evaluated
        p = np.flatnonzero(pending)
        fp = -_natural_grad(data, x[p][None], cand[p])[0][0]
        use = np.isfinite(fp)
        fin_x[p[use]], fin_on[p[use]], f_last[p[use]] = x[p[use]], on[p[use]], fp[use]
    better = np.isfinite(f_last) & (f_last <= f_opt + 1e-13 * (1 + np.abs(f_opt)))
    if not better.any():
        return opt
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
    return opt._replace(u=u, f=f, at_boundary=at_b, n_iter=n_iter)


def _jacobi(H: np.ndarray) -> tuple:
    """``(H scaled by its diagonal, dj)``: ``dj = |diag H|^-1/2`` (1 where that is not a
    positive number), so that tests of positive definiteness do not depend on the parameters'
    units (``theta`` of 5e-5 beside ``mu`` of 200 standardized)."""
    diag = np.abs(np.diagonal(H, axis1=1, axis2=2))
    with np.errstate(divide="ignore", invalid="ignore"):
        dj = np.where(np.isfinite(diag) & (diag > 0), 1 / np.sqrt(diag), 1.0)
    return H * dj[:, :, None] * dj[:, None, :], dj


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


def _xp(x):
    """The array module of ``x`` (numpy, or torch for a tensor): the moments below run where the
    data lives (on the device for a GPU fit; about 1 s of host numpy at 16,384 x 500 otherwise)."""
    return torch if isinstance(x, torch.Tensor) else np


def _host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


def _col_mean(x, ok):
    """Mean over axis 0 of ``x`` where ``ok`` (NaN where nothing is): ``np.nanmean`` without
    its copies, for numpy arrays and tensors alike."""
    xp = _xp(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.where(ok, x, 0.0).sum(0) / ok.sum(0)


def _nan_moments(Z):
    """Per-column ``(mean, scale, sd)`` of ``Z [T, N]`` with NaNs, free of overflow. ``scale`` is
    the smaller of the standard deviation and the root of half the mean squared change between
    consecutive observed rows: the size of the noise in white-noise-like data and of the step in
    trending data (the scale at which variance estimates are compared with 0). ``Z``: a numpy
    array or a tensor (the result is numpy either way)."""
    xp = _xp(Z)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ok = ~xp.isnan(Z)
        amax = xp.amax(xp.where(ok, xp.abs(Z), 0.0), 0)
        a = xp.where(xp.isfinite(amax) & (amax > 0), amax, 1.0)
        Zn = Z / a
        mean = _col_mean(Zn, ok)
        sd = xp.sqrt(_col_mean((Zn - mean) ** 2, ok))
        d = Zn[1:] - Zn[:-1]
        step = xp.sqrt(0.5 * _col_mean(d * d, ok[1:] & ok[:-1]))
    scale = xp.where(xp.isfinite(step) & (step > 0), xp.where(step < sd, step, sd), sd)
    return _host(mean * a), _host(scale * a), _host(sd * a)


def _location_scale(Z, joint: bool, moments=None):
    """``(m [N], s [N])``: the standardization of each series (pooled over series when
    ``joint``), see :func:`_nan_moments` (``moments``: its result for ``Z``, if known)."""
    m, s, sd = _nan_moments(Z) if moments is None else moments
    if not joint:
        return m, s
    N = Z.shape[1]
    m1, _, sd1 = _nan_moments(Z.reshape(-1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        step = np.sqrt(np.nanmean(np.where(sd > 0, s / sd, np.nan) ** 2))  # pooled step / sd
    s1 = sd1[0] * (min(step, 1.0) if np.isfinite(step) else 1.0)
    return np.full(N, m1[0]), np.full(N, s1)


def _start(zs: np.ndarray, dt: np.ndarray, fixed: dict, joint: bool) -> dict:
    """Standardized starting values ``{name: [G]}`` from lag-1 and lag-2 moments of ``zs [T, N]``
    (mean 0 per series; or pooled when ``joint``)."""
    xp = _xp(zs)
    ok0 = ~xp.isnan(zs)
    span = np.cumsum(dt)

    def total(x):
        return _host(x.sum() if joint else x.sum(0))

    def lag(k):
        d = zs[k:] - zs[:-k]
        step = span[k:] - span[:-k]
        pos = step > 0
        if xp is torch:
            step = torch.as_tensor(step, dtype=zs.dtype, device=zs.device)
            pos = torch.as_tensor(pos, device=zs.device)
        w = ok0[k:] & ok0[:-k] & pos[:, None]
        cnt = total(w)
        with np.errstate(invalid="ignore", divide="ignore"):
            msd = total(xp.where(w, d * d, 0.0)) / cnt
            mdt = total(xp.where(w, step[:, None], 0.0)) / cnt
            rho = total(xp.where(w, zs[k:] * zs[:-k], 0.0)) / cnt
        return msd, mdt, rho

    with np.errstate(invalid="ignore", divide="ignore"):
        v0 = total(xp.where(ok0, zs * zs, 0.0)) / total(ok0)  # zs has mean 0; variance >= 1
    v0 = np.where(np.isfinite(v0) & (v0 > 0), v0, 1.0)
    d1, t1, r1 = lag(1)
    d2, t2, r2 = lag(2) if zs.shape[0] > 2 else (d1, 2 * t1, r1 * r1)
    r1, r2 = r1 / v0, r2 / v0
    G = 1 if joint else zs.shape[1]
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (G,)).copy()  # noqa: E731
    t1 = np.where(np.isfinite(t1) & (t1 > 0), t1, 1.0)
    d1 = np.where(np.isfinite(d1) & (d1 > 0), d1, 1.0)
    # random walk + noise: E d1 = sigma2 t1 + 2 obs_var, E d2 = sigma2 t2 + 2 obs_var
    with np.errstate(invalid="ignore", divide="ignore"):
        s2_rw = (d2 - d1) / (t2 - t1)
    s2_rw = np.clip(np.where(np.isfinite(s2_rw), s2_rw, 0.5 * d1 / t1), 0.05 * d1 / t1, d1 / t1)
    ov_rw = np.maximum(0.5 * (d1 - s2_rw * t1), 0.05 * d1)
    # OU + noise: rho_k = phi^k vx (variance 1), phi = exp(-theta t1)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.clip(np.where(r1 > 0.05, r2 / r1, 0.5), 0.05, 0.99)
    phi = np.where(np.isfinite(phi), phi, 0.5)
    th = fixed.get("theta")
    if th is not None and joint:
        th = np.array([th.mean()])
    theta = -np.log(phi) / t1 if th is None else np.where(th > 0, th, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        vx = np.clip(r1 / np.exp(-theta * t1), 0.05, 0.95)
    vx = np.where(np.isfinite(vx), vx, 0.5)
    rw = np.zeros(G, bool) if th is None else full(th == 0)
    return {
        "theta": full(theta),
        "sigma2": np.where(rw, full(s2_rw), full(2 * theta * vx * v0)),
        "mu": np.zeros(G),
        "obs_var": np.where(rw, full(ov_rw), full((1 - vx) * v0)),
    }


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
    if free:
        u0 = np.stack([np.log(start[p]) if p in _POSITIVE else start[p] for p in free], 1)
        u0 = u0.reshape(G, len(free))
        opt = optim.minimize(
            _objective(data), u0, positive, max_iter=max_iter, gtol=tol, h=_STENCIL_H,
            active=active,
        )  # fmt: skip
        opt = _refine_small(data, opt, positive)
    else:  # nothing to fit (a profile point of the only free parameter): the likelihood only
        status = np.where(active, optim.CONVERGED, optim.RUNNING)
        empty = np.zeros((G, 0))
        opt = optim.NewtonResult(
            empty, np.full(G, np.nan), empty, np.zeros((G, 0, 0)), empty.astype(bool), status,
            np.zeros(G, np.int64),
        )  # fmt: skip
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
    return _Core(est, loglik, opt, m, s, tau, usable, res, data)


def _mu_unused(core: _Core, joint: bool) -> np.ndarray:
    """``[G]``: groups whose ``theta`` is fixed at 0, where ``mu`` does not enter the
    likelihood (the random walk forgets its mean)."""
    zero = np.asarray(core.est["theta"]) == 0
    return np.array([zero.all()]) if joint else zero


def _needs_exact_hessian(core: _Core, free, why) -> np.ndarray | None:
    """The converged groups whose standard errors take the Hessian from exact gradients
    (:func:`_information`), or None: those with a free positive estimate below ``_SMALL`` of the
    scale off its bound (the stencil's curvature in ``log x`` is rounding there: CO2's near
    random walk, ``theta`` 2e-4 a week, had ``mu``'s 4.6 % off), those with an estimate on its
    bound (the others' errors with it held: the stencil's are ~1e-5 off the closed form), and
    those whose stencil Hessian is not positive definite. The rest keep the stencil's (equal to
    statsmodels' to ~1e-5; the exact one costs a filter call of ``1 + 2k`` gradient points,
    ~1.5 ms on the Nile)."""
    opt = core.opt
    k = opt.u.shape[1]
    if not k:
        return None
    positive = np.array([p in _POSITIVE for p in free], dtype=bool)
    with np.errstate(over="ignore", under="ignore"):
        x = _natural(opt.u, positive)
    small = (positive[None, :] & ~opt.at_boundary & (x < _SMALL)).any(1)
    not_pd = np.array(["positive definite" in str(w) for w in why], dtype=bool)
    need = (opt.status == optim.CONVERGED) & (small | not_pd | opt.at_boundary.any(1))
    return np.flatnonzero(need) if need.any() else None


def _information(core: _Core, free, idx=None) -> np.ndarray:
    """``[G, k, k]``: the Hessian of the total negative log-likelihood in the free parameters
    (natural standardized units) at the estimate of the converged groups ``idx`` (all when
    None), from exact gradients (:func:`_natural_hessian`; NaN elsewhere)."""
    opt, data = core.opt, core.data
    G, k = opt.u.shape
    H = np.full((G, k, k), np.nan)
    conv = np.flatnonzero(opt.status == optim.CONVERGED)
    idx = conv if idx is None else np.intersect1d(conv, idx)
    if idx.size and k:
        positive = np.array([p in _POSITIVE for p in free], dtype=bool)
        x = _natural(opt.u[idx], positive)
        H[idx] = _natural_hessian(data, x, idx, opt.at_boundary[idx])[2]
    return H


def _standard_errors(core: _Core, free, joint, hess=None):
    """``({name: [G]}, ok [G], why [G])``: standard errors in natural units from the Hessian at
    the estimate, where the estimate is converged and the Hessian positive definite; ``why``
    holds the reason (a short text) where not.

    ``hess [G, k, k]``: the Hessian of the total negative log-likelihood in the natural
    standardized parameters (:func:`_information`: exact gradients differenced, right however
    small a variance); without it, the fit's stencil Hessian in ``u = log x`` (whose curvature
    in a variance of ~1e-5 of the data's scale is rounding noise).

    A parameter on its bound 0 gets none (``OUFit.upper_bound`` bounds it instead); the others get
    the observed information of the free parameters with it held at 0: the Hessian block of the
    interior coordinates, evaluated with the boundary coordinate at its held value (an effect of
    ~1e-14 of the data's scale). ``theta`` on its bound also holds ``mu``, which does not enter
    the likelihood of a random walk. docs/model.md, "Estimates on a boundary".
    """
    opt = core.opt
    G, k = opt.u.shape
    s = core.s[:1] if joint else core.s
    if hess is None:
        nobs = core.data.n_obs
        n = np.array([nobs.sum()]) if joint else nobs
        positive = np.array([p in _POSITIVE for p in free])
        # Hessian of the total negative log-likelihood in u; u = log x adds g_j on the diagonal
        Hu = opt.H * n[:, None, None] - (opt.g * n[:, None] * positive)[:, :, None] * np.eye(k)
        jac = np.stack(
            [np.abs(core.est[p][:1] if joint else core.est[p]) if p in _POSITIVE else s
             for p in free],
            1,
        )  # d natural / d u, [G, k]  # fmt: skip
    else:
        Hu, dj = _jacobi(hess)  # (units aside in the test of positive definiteness)
        tau = core.tau
        unit = {"theta": 1 / tau, "sigma2": s**2 / tau, "mu": s, "obs_var": s**2}
        jac = np.stack([np.broadcast_to(unit[p], (G,)) for p in free], 1) * dj  # natural / std
    Hu = 0.5 * (Hu + np.swapaxes(Hu, 1, 2))
    held = opt.at_boundary.copy()
    if "theta" in free and "mu" in free:
        held[:, free.index("mu")] |= held[:, free.index("theta")]
    elif "mu" in free:  # theta fixed: at 0 (a random walk) mu does not enter the likelihood
        held[:, free.index("mu")] |= _mu_unused(core, joint)
    why = np.full(G, "", dtype=object)
    why[opt.status != optim.CONVERGED] = "the fit did not converge"
    why[(why == "") & held.all(1)] = "every free estimate is on its boundary"
    se = {p: np.full(G, np.nan) for p in PARAMS}
    for _, rows, keep, pd, cov in optim.held_covariances(Hu, held, why == ""):
        why[rows[~pd]] = "the Hessian is not positive definite (a parameter is not identified)"
        if cov is not None:
            for c, j in enumerate(keep):
                se[free[j]][rows[pd]] = np.sqrt(cov[:, c, c]) * jac[rows[pd], j]
    ok = why == ""
    return se, ok, why


def _names(idx, labels, limit: int = 5) -> str:
    shown = [repr(labels[i]) if labels else str(int(i)) for i in idx[:limit]]
    more = f" and {len(idx) - limit} more" if len(idx) > limit else ""
    return ", ".join(shown) + more


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
        raise ValueError(f"tol: expected a positive finite number, got {tol!r}")
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
        backend: filter backend. device: torch device for the optimization (default CPU).
        robust: screen out observations whose standardized auxiliary residual exceeds a
            Bonferroni bound and refit until the screened set repeats
            (:func:`kalmanscan.timeseries.robust.fit_ou_robust`, which also takes the threshold);
            ``OUFit.outliers`` marks them.

    The prior is the model default (stationary for ``theta > 0``, diffuse at ``theta = 0``), so a
    free ``theta`` is estimated with the stationary prior. Warns when a fit does not converge, when
    an estimate sits on its boundary (a variance at 0: no standard error for it, the others' with
    it held at 0, see ``OUFit.notes``) and when one observation dominates the likelihood. Returns
    an :class:`OUFit`.

    >>> import kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> round(fit.params["obs_var"], -1), round(fit.params["sigma2"]), round(fit.loglik, 2)
    (15100.0, 1469, -632.55)
    """
    if not isinstance(robust, (bool, np.bool_)):
        raise TypeError(f"robust: expected True or False, got {robust!r}")
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
        )  # fmt: skip
    max_iter, tol = _check_options(max_iter, tol, joint, stderr)
    zt, times, labels = series_input(z, times, axis)
    T = zt.shape[0]
    if zt.size == 0:
        shape = np.moveaxis(zt, 0, axis).shape
        raise ValueError(f"z: expected at least one series, got shape {shape}")
    ax = as_time_axis(times, T, time_unit)
    shape = zt.shape[1:]
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
                raise ValueError(f"init[{k!r}]: expected values {rng}, got {arr[~ok].ravel()[0]!r}")
    init_flat = {k: np.broadcast_to(v, shape).reshape(N) for k, v in (init or {}).items()}
    if n_obs.max() < 2:
        raise ValueError(
            "z: expected at least 2 observed values in a series to fit, got at most "
            f"{int(n_obs.max())}"
        )
    moments = _nan_moments(Z)
    sd = moments[2]
    constant = (n_obs >= 2) & (sd == 0)
    if constant.all() or (joint and bool(np.all(sd[n_obs >= 1] == 0))):
        first = float(Z[~np.isnan(Z)][0])
        raise ValueError(
            f"z: every observed value is {first!r} (a constant series): the likelihood grows "
            "without bound as obs_var -> 0, so there is no maximum-likelihood estimate"
        )
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
            + ("" if joint or N == 1 else f" in series {i}")
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
    opt = core.opt
    unusable = ~core.usable
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
    converged = opt.status == optim.CONVERGED
    notes = []
    failed = np.flatnonzero(core.usable[:1] & ~converged if joint else core.usable & ~converged)
    if failed.size:
        reasons = sorted({optim.STATUS_TEXT[c] for c in opt.status[failed]})
        warnings.warn(
            f"fit_ou: {failed.size} of {converged.size} fits did not converge ("
            + "; ".join(reasons)
            + ")"
            + ("" if joint else f": series {_names(failed, labels)}"),
            stacklevel=3,
        )
    # estimates on their boundary
    at_boundary = {}
    for j, p in enumerate(free):
        b = opt.at_boundary[:, j]
        at_boundary[p] = b
        if b.any():
            idx = np.flatnonzero(b)
            where = "" if joint or N == 1 else f" in series {_names(idx, labels)}"
            ref = "the data's scale squared" if p != "theta" else "one over the median time step"
            text = (
                f"{p} is at its lower bound 0{where} (estimate below {optim.BOUNDARY:g} times "
                f"{ref}): the likelihood is largest there, so {p} has no standard error (at a "
                "boundary the likelihood is one-sided and the normal approximation behind "
                "standard errors does not hold); the other parameters' standard errors are "
                f"those with {p} held at 0 (the observed information of the others)"
                + (
                    "; mu, which the random walk at theta = 0 does not depend on, has none either"
                    if p == "theta" and "mu" in free
                    else ""
                )
            )
            notes.append(text)
            warnings.warn("fit_ou: " + text, stacklevel=3)
    if "mu" in free and "theta" in fixed:
        idle = np.flatnonzero(_mu_unused(core, joint) & (core.usable[:1] if joint else core.usable))
        if idle.size:
            where = "" if joint or N == 1 else f" in series {_names(idle, labels)}"
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
    se_g, se_ok, why = _standard_errors(core, free, joint)
    exact = _needs_exact_hessian(core, free, why) if stderr else None
    if exact is not None:  # those groups from exact gradients (:func:`_information`)
        se_x, ok_x, why_x = _standard_errors(core, free, joint, _information(core, free, exact))
        for p in se_g:
            se_g[p][exact] = se_x[p][exact]
        se_ok[exact], why[exact] = ok_x[exact], why_x[exact]
    if stderr:
        lost = np.flatnonzero(~se_ok & (core.usable[:1] if joint else core.usable))
        for reason in sorted(set(why[lost])):
            if reason:
                idx = lost[why[lost] == reason]
                notes.append(
                    "no standard errors"
                    + ("" if joint or N == 1 else f" for series {_names(idx, labels)}")
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
        lazy = _LazyProfile(
            (slim, Z, ax.dt, fixed_flat, free, joint, max_iter, tol, backend, device, labels)
        )
        upper = _LazyBounds(lazy, shaped)
        notes = _LazyNotes(tuple(notes), lazy)

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
    )


class _LazyProfile:
    """:func:`kalmanscan.timeseries.profile.report` on a fit's arguments, run once on demand."""

    def __init__(self, args):
        self._args, self._result = args, None

    def result(self):
        if self._result is None:
            from kalmanscan.timeseries import profile

            self._result = profile.report(*self._args)
            self._args = None
        return self._result


class _LazyBounds(Mapping):
    """``OUFit.upper_bound``: ``{name: bound}`` (shaped as the fit's other per-series results
    by ``shaped``), computed on first access."""

    def __init__(self, lazy: _LazyProfile, shaped):
        self._lazy, self._shaped, self._d = lazy, shaped, None

    def _dict(self):
        if self._d is None:
            self._d = {p: self._shaped(v) for p, v in self._lazy.result()[0].items()}
        return self._d

    def __getitem__(self, key):
        return self._dict()[key]

    def __iter__(self):
        return iter(self._dict())

    def __len__(self):
        return len(self._dict())

    def __repr__(self):
        return repr(self._dict())


class _LazyNotes(Sequence):
    """``OUFit.notes``: the fit's notes, then the profile bounds' notes once computed."""

    def __init__(self, first: tuple, lazy: _LazyProfile):
        self._first, self._lazy = first, lazy

    def _all(self):
        return self._first + tuple(self._lazy.result()[1])

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self):
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __repr__(self):
        return repr(self._all())


def _on_bound(core, i, j) -> bool:
    """Whether free parameter ``j`` of series ``i`` sits on its bound 0 in ``core`` (one row for
    a joint fit)."""
    b = np.asarray(core.opt.at_boundary)
    return bool(b[min(i, b.shape[0] - 1), j])


def _outlier_check(core, Z, ax, fixed_flat, free, labels, max_iter, tol, backend, device):
    """Warn (and return notes) where a few observations wreck the fit, each candidate series
    refitted without them: the values of its gross runs
    (:func:`~kalmanscan.timeseries.robust.gross_runs`: a missing-value code such as -9999, alone
    or several in a row, which the filter takes for the level, so that the innovations name the
    values after them), always named; else, where one observation's squared standardized
    innovation exceeds ``_OUTLIER_E2`` and half the series' sum, those within a tenth of the
    sum, named where they move a variance estimate by an order of magnitude or more. One
    :class:`~kalmanscan.timeseries.robust.OutlierWarning` per series, carrying the rows (the
    CLI's own warning of gross values absorbs it)."""
    from kalmanscan.timeseries.robust import _RUN_STEPS, OutlierWarning, _row, gross_runs

    res = core.filtered
    N = Z.shape[1]
    zs = core.data.zs  # where the fit ran (the device for a GPU fit)
    R = torch.as_tensor(
        core.est["obs_var"] / core.s**2, dtype=zs.dtype, device=zs.device
    )  # standardized observation variance
    pm = res.pred_mean.reshape(Z.shape)
    pv = res.pred_var.reshape(Z.shape)
    e2 = (zs - pm) ** 2 / (pv + R)
    e2 = torch.where(torch.isfinite(e2), e2, 0.0)
    tot = e2.sum(0).cpu().numpy()
    mx = e2.amax(0).cpu().numpy()
    runs = gross_runs(Z, device=zs.device) & core.usable
    gross = runs.any(0)
    sus = np.flatnonzero(core.usable & (gross | ((mx > _OUTLIER_E2) & (mx > 0.5 * tot))))
    if sus.size == 0:
        return []
    drop = (e2[:, torch.as_tensor(sus, device=e2.device)]).cpu().numpy() >= 0.1 * tot[sus]
    drop = np.where(gross[sus], runs[:, sus], drop)
    Zc = Z[:, sus].copy()
    Zc[drop] = np.nan
    clean = _fit_core(
        Zc, ax.dt, {p: v[sus] for p, v in fixed_flat.items()}, free, {}, False, max_iter, tol,
        backend, device,
    )  # fmt: skip
    notes = []
    for c, i in enumerate(sus):
        worst, factor = None, 1.0
        for p in free:
            if p not in _POSITIVE:
                continue
            if _on_bound(core, i, free.index(p)) and _on_bound(clean, c, free.index(p)):
                continue  # 0 with and without them (6e-16 against 2e-10 is no change)
            a, b = core.est[p][i], clean.est[p][c]
            r = max(a, b) / max(min(a, b), 1e-300)
            if r > factor:
                worst, factor = p, r
        if (worst is None or factor < 10) and not gross[i]:
            continue
        rows = np.flatnonzero(drop[:, c])
        one = rows.size == 1
        it = "it" if one else "them"
        who = f"series {labels[i]!r}" if labels else (f"series {i}" if N > 1 else "the series")
        # every value of the runs (a code repeats: a run of more than 20 is rare), else 3
        limit = 20 if gross[i] else 3
        shown = ", ".join(_row(ax, Z, r, i) for r in rows[:limit]) + (
            f" and {rows.size - limit} more" if gross[i] and rows.size > limit else ""
        )
        effect = (
            f"dominate{'s' if one else ''} the likelihood: without {it} {worst} is "
            f"{clean.est[worst][c]:.4g} instead of {core.est[worst][i]:.4g} (a factor "
            f"{factor:.3g})"
            if worst is not None and factor >= 10
            else None
        )
        text = f"in {who}, {shown}" + (f" {effect}" if effect else "")
        if gross[i]:
            they = ("; it" if one else "; they") if effect else ""
            text += (
                f"{they} lie{'s' if one else ''} more than {_RUN_STEPS:g} typical steps (the "
                "median change between neighbouring values) from the values around "
                f"{it}: a missing-value code or a data error? set those values to NaN (or fix the "
                f"data) to fit without them, or fit with robust=True (--robust) to screen {it} out"
            )
        else:
            text += (
                "; check for a data error, or set those values to NaN to fit without them, or fit "
                "with robust=True (--robust) to screen outliers"
            )
        series = labels[i] if labels else (i if N > 1 else None)
        warnings.warn(
            OutlierWarning(text, series=series, rows=rows, gross=gross[i], effect=effect),
            stacklevel=4,
        )
        notes.append(text)
    return notes
