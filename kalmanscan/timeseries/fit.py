"""Maximum-likelihood fitting of OU / local-level models by autograd through the parallel filter.

The free parameters are mapped to unconstrained ``u`` (``theta, sigma2, obs_var = scale * exp(u)``,
``mu = centre + sd * u``, scales taken from the data so ``u = 0`` is a sensible start) and the
negative log-likelihood per observation is minimized with L-BFGS (strong Wolfe line search) in
float64. Standard errors come from the inverse Hessian of the negative log-likelihood in the
natural parameters, by double backward through the filter. Derivation and caveats: docs/model.md.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from kalmanscan.timeseries.model import (
    PARAMS,
    Forecast,
    OUModel,
    default_prior,
    forecast_from_state,
    ou_arrays,
    series_input,
)
from kalmanscan.timeseries.times import TimeAxis, as_time_axis

_U_BOUND = 30.0  # |u| is softly held below this: exp(30) ~ 1e13 times the data scale
_POSITIVE = ("theta", "sigma2", "obs_var")


@dataclass
class OUFit:
    """Result of :func:`fit_ou`.

    Fields:
        model: the fitted :class:`OUModel` (parameters scalars when ``joint`` or one series, else
            arrays over the series shape ``S``).
        loglik: log-likelihood per series (``S``; a float for one series) at the estimate.
        stderr: ``{name: standard error}`` from the inverse Hessian; NaN for fixed parameters, at a
            boundary, or where the Hessian is not positive definite.
        fixed: the fixed parameters. converged: per series (or one bool when ``joint``).
        n_iter: L-BFGS iterations. n_obs: observations per series. joint: one parameter set for all.
        z: the data, time first ``[T, *S]``. time_axis: its :class:`TimeAxis`.
        series_labels: names of
            the series (e.g. DataFrame columns) or ``None``.
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
        from kalmanscan import xarray as kx

        if series_coords is None and self.series_labels is not None and self.z.ndim == 2:
            series_coords = {"series": self.series_labels}
        return kx.to_dataset(
            self.model,
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
        lines = [
            f"OU model fit by maximum likelihood: {n_series} series, {self.z.shape[0]} time steps"
            + (f", {self.time_axis.unit_name} per time unit" if self.time_axis.is_datetime else ""),
            f"fixed: {fixed}" if fixed else "fixed: none",
            f"{'series':>10} "
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
        labels = self.series_labels or [str(i) for i in range(n_series)]
        for i in range(min(n_series, max_series)):
            cells = " ".join(f"{est[p][i]:>14.6g} {se[p][i]:>10.4g}" for p in free)
            lines.append(f"{labels[i][:10]:>10} {cells} {ll[i]:>12.4f} {str(bool(conv[i])):>5}")
        if n_series > max_series:
            lines.append(f"... {n_series - max_series} more series")
        lines.append(
            f"total loglik {self.total_loglik:.4f} over {int(np.sum(self.n_obs))} observations"
            " (exact diffuse convention: steps with zero prior precision add nothing); "
            f"{self.n_iter} L-BFGS iterations"
            + (", one parameter set for all series" if self.joint else "")
        )
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
        arr = np.asarray(v, dtype=np.float64)
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


def _initial_values(Z: np.ndarray, dt: np.ndarray, fixed_flat: dict) -> dict:
    """Per-series starting values ``{name: [N]}`` from simple moments of the data."""
    N = Z.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        var = np.nanvar(Z, axis=0)
        mean = np.nanmean(Z, axis=0)
    var = np.where(np.isfinite(var) & (var > 0), var, 1.0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    t = np.cumsum(dt)
    msd = np.empty(N)  # mean squared change per time unit between consecutive observations
    span = np.empty(N)
    for n in range(N):
        idx = np.flatnonzero(~np.isnan(Z[:, n]))
        if idx.size >= 2:
            d = np.diff(Z[idx, n])
            step = np.diff(t[idx])
            ok = step > 0
            msd[n] = np.mean(d[ok] ** 2) / np.mean(step[ok]) if ok.any() else var[n]
            span[n] = max(t[idx[-1]] - t[idx[0]], 1e-12)
        else:
            msd[n], span[n] = var[n], 1.0
    msd = np.where(np.isfinite(msd) & (msd > 0), msd, var)
    theta_fixed = fixed_flat.get("theta")
    theta0 = 10.0 / span if theta_fixed is None else np.where(theta_fixed > 0, theta_fixed, 0.0)
    theta0 = np.broadcast_to(theta0, (N,)).astype(np.float64)
    # random walk: E[(z_{i+1}-z_i)^2] = 2 obs_var + sigma2 dt
    # OU: stationary variance sigma2 / (2 theta)
    sigma2_rw = 0.5 * msd
    sigma2_ou = theta0 * var
    sigma2 = np.where(theta0 > 0, np.maximum(sigma2_ou, 1e-12), np.maximum(sigma2_rw, 1e-12))
    return {
        "theta": np.where(theta0 > 0, theta0, 1.0),
        "sigma2": sigma2,
        "mu": mean,
        "obs_var": 0.5 * var,
        "_sd": np.sqrt(var),
    }


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
) -> OUFit:
    """Fit ``theta, sigma2, mu, obs_var`` of an OU / local-level model by maximum likelihood.

    Args:
        z: ``[T, *S]`` observations (time on ``axis``), NaN = missing; pandas Series/DataFrame
            allowed
            (index = times, columns = series).
        times: ``[T]`` timestamps (numbers or datetimes; irregular allowed); default ``0..T-1``.
        fix: parameters held fixed, e.g. ``{"theta": 0.0, "mu": 0.0}`` (the local-level model).
        init: optional starting values ``{name: value}`` for free parameters.
        joint: ``True`` fits one parameter set to all series; ``False`` (default) one per series.
        time_unit: model time unit for datetime times (default ``"1D"``).
        max_iter: L-BFGS iteration limit. tol: gradient tolerance on the per-observation objective.
        stderr: compute standard errors from the Hessian.
        backend: filter backend. device: torch device for the optimization (default CPU).

    The prior is the model default (stationary for ``theta > 0``, diffuse at ``theta = 0``), so a
    free ``theta`` is estimated with the stationary prior. Returns an :class:`OUFit`.

    >>> import kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> round(fit.params["obs_var"], -1), round(fit.params["sigma2"]), round(fit.loglik, 2)
    (15100.0, 1469, -632.55)
    """
    zt, times, labels = series_input(z, times, axis)
    T = zt.shape[0]
    ax = as_time_axis(times, T, time_unit)
    shape = zt.shape[1:]
    Z = zt.reshape(T, -1)
    N = Z.shape[1]
    fixed = _check_fix(fix, shape)
    free = [p for p in PARAMS if p not in fixed]
    fixed_flat = {
        k: np.broadcast_to(v, shape).reshape(N).astype(np.float64) for k, v in fixed.items()
    }
    n_obs = (~np.isnan(Z)).sum(0)
    start = _initial_values(Z, ax.dt, fixed_flat)
    if init is not None:
        if not isinstance(init, dict):
            raise TypeError(f"init: expected a dict of starting values, got {type(init).__name__}")
        for k, v in init.items():
            if k not in free:
                raise ValueError(f"init: expected keys among the free parameters {free}, got {k!r}")
            start[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), shape).reshape(N).copy()
            if k != "mu" and not (start[k] > 0).all():
                raise ValueError(f"init[{k!r}]: expected values > 0, got {v!r}")
    too_few = n_obs < 2
    if too_few.all():
        raise ValueError(
            "z: expected at least 2 observed values in a series to fit, got at most "
            f"{int(n_obs.max())}"
        )
    if too_few.any() and not joint:
        warnings.warn(
            f"fit_ou: {int(too_few.sum())} series have fewer than 2 observations; their parameters "
            "stay at the starting values and are marked not converged",
            stacklevel=2,
        )

    device = torch.device(device) if device is not None else torch.device("cpu")
    f64 = dict(dtype=torch.float64, device=device)
    Zt = torch.as_tensor(Z, **f64)
    groups = 1 if joint else N
    pool = (lambda a: np.full(1, np.exp(np.mean(np.log(a))))) if joint else (lambda a: a)  # noqa: E731
    scale = {
        p: torch.as_tensor(
            pool(start[p])
            if p != "mu"
            else (np.mean(start[p], keepdims=True) if joint else start[p]),
            **f64,
        )
        for p in free
    }
    sd = torch.as_tensor(pool(start["_sd"]), **f64)
    fixed_t = {k: torch.as_tensor(v, **f64) for k, v in fixed_flat.items()}
    weight = torch.as_tensor(1.0 / np.maximum(n_obs, 1), **f64)
    total_obs = float(max(n_obs.sum(), 1))

    def natural(u):  # u [groups, k] -> {name: [N]}
        ub = _U_BOUND * torch.tanh(u / _U_BOUND)
        out = {}
        for j, p in enumerate(free):
            v = scale[p] + sd * ub[:, j] if p == "mu" else scale[p] * torch.exp(ub[:, j])
            out[p] = v.expand(N) if joint else v
        out.update(fixed_t)
        return out

    def loglik_of(params):
        import kalmanscan as ks

        decay, process_var, offset = ou_arrays(
            params["theta"], params["sigma2"], params["mu"], ax.dt, 1, like=Zt
        )
        pm, pv = default_prior(params["theta"], params["sigma2"], params["mu"])
        res = ks.filter(
            Zt,
            obs_var=params["obs_var"],
            decay=decay,
            process_var=process_var,
            offset=offset,
            prior_mean=pm,
            prior_var=pv,
            axis=0,
            backend=backend,
        )
        return res.loglik

    def objective(u):
        ll = loglik_of(natural(u))
        return -(ll.sum() / total_obs) if joint else -(ll * weight).sum()

    u = torch.zeros(groups, len(free), requires_grad=True, **f64)
    opt = torch.optim.LBFGS(
        [u],
        lr=1.0,
        max_iter=max_iter,
        max_eval=int(max_iter * 1.5) + 10,
        tolerance_grad=max(tol, 1e-6),  # a coarse stage: the Newton steps below finish
        tolerance_change=1e-12,
        history_size=30,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = objective(u)
        loss.backward()
        return loss

    opt.step(closure)
    n_iter = int(opt.state[opt.param_groups[0]["params"][0]].get("n_iter", 0))
    with torch.no_grad():
        start_est = natural(u.detach())
    x = torch.stack([start_est[p][:1] if joint else start_est[p] for p in free], 1)

    def group_loss(y):  # negative log-likelihood per group [G]
        ll_ = loglik_of(_with_free(y, free, fixed_t, N, joint))
        return -ll_.sum(0, keepdim=True) if joint else -ll_

    positive = torch.tensor([p in _POSITIVE for p in free], device=device)
    x, H_hat = _newton_polish(x, group_loss, positive)
    # convergence: gradient of the scaled objective in the unconstrained coordinates
    u_hat = torch.stack(
        [
            _U_BOUND
            * torch.atanh((torch.log(x[:, j] / scale[p]) / _U_BOUND).clamp(-1 + 1e-12, 1 - 1e-12))
            if p != "mu"
            else (x[:, j] - scale[p]) / sd
            for j, p in enumerate(free)
        ],
        1,
    ).requires_grad_(True)
    loss = objective(u_hat)
    (grad,) = torch.autograd.grad(loss, u_hat)
    grad_ok = torch.isfinite(grad).all(1) & (grad.abs().amax(1) <= max(1e3 * tol, 1e-5))
    converged = (grad_ok & torch.isfinite(loss)).cpu().numpy()
    if not joint:
        converged = converged & ~too_few

    with torch.no_grad():
        est = _with_free(x, free, fixed_t, N, joint)
        ll = loglik_of(est).cpu().numpy()
    est_np = {k: v.cpu().numpy().copy() for k, v in est.items()}
    if not converged.all():
        warnings.warn(
            f"fit_ou: {int((~converged).sum())} of {converged.size} fits did not reach the "
            "gradient "
            f"tolerance in {max_iter} iterations",
            stacklevel=2,
        )

    se = {p: np.full(groups, np.nan) for p in PARAMS}
    if stderr:
        H = H_hat.cpu().numpy()  # Hessian of the negative log-likelihood at the estimate
        ok_est = np.ones(groups, bool)
        for p in free:  # at a boundary the Hessian says nothing about uncertainty
            if p in _POSITIVE:
                val = est_np[p][:1] if joint else est_np[p]
                ok_est &= val > 1e-6 * (scale[p].cpu().numpy())
        for g in range(groups):
            Hg = H[g]
            if not (ok_est[g] and np.isfinite(Hg).all()):
                continue
            Hg = 0.5 * (Hg + Hg.T)
            try:
                np.linalg.cholesky(Hg)
            except np.linalg.LinAlgError:
                continue
            cov = np.linalg.inv(Hg)
            for j, p in enumerate(free):
                se[p][g] = math.sqrt(cov[j, j])

    def shaped(a):
        a = np.asarray(a, dtype=np.float64)
        if joint:
            return float(a.reshape(-1)[0])
        return float(a.reshape(shape)) if shape == () else a.reshape(shape)

    params = {p: shaped(est_np[p][:1] if joint else est_np[p]) for p in free}
    params.update(fixed)
    model = OUModel(time_unit=time_unit, **params)
    ll_out = float(ll.reshape(())) if shape == () else ll.reshape(shape)
    conv_out = bool(converged[0]) if (joint or shape == ()) else converged.reshape(shape)
    return OUFit(
        model=model,
        loglik=ll_out,
        stderr={p: shaped(se[p]) for p in PARAMS},
        fixed=fixed,
        converged=conv_out,
        n_iter=n_iter,
        n_obs=int(n_obs[0]) if shape == () else n_obs.reshape(shape),
        joint=joint,
        z=zt,
        time_axis=ax,
        series_labels=labels,
    )


def _newton_polish(x, group_loss, positive, steps: int = 6):
    """Safeguarded Newton steps per group from the L-BFGS estimate ``x [G, k]``; returns
    ``(x, H)`` with ``H [G, k, k]`` the Hessian of ``group_loss`` at the returned ``x``.

    Groups are independent, so each takes its own step, halved until its loss does not increase and
    positive parameters stay positive; so separate fits do not depend on how series are batched.
    """
    x = x.detach()
    for it in range(steps + 1):
        f, g, H = _grad_hessian(group_loss, x)
        if it == steps:
            break
        H = 0.5 * (H + H.transpose(1, 2))
        L, info = torch.linalg.cholesky_ex(H)
        ok = (info == 0) & torch.isfinite(g).all(1)
        eye = torch.eye(H.shape[1], dtype=H.dtype, device=H.device)
        Hs = torch.where(ok[:, None, None], H, eye)
        step = torch.linalg.solve(Hs, g.unsqueeze(-1)).squeeze(-1) * ok[:, None]
        if (step.abs() <= 1e-10 * x.abs().clamp_min(1e-300)).all():
            break  # H is the Hessian at x
        pending = ok.clone()
        t = 1.0
        for _ in range(8):
            cand = x - t * step
            valid = pending & ~((cand <= 0) & positive).any(1)
            cand = torch.where(valid[:, None], cand, x)  # evaluate only admissible points
            with torch.no_grad():
                fc = group_loss(cand)
            accept = valid & torch.isfinite(fc) & (fc <= f + 1e-12 * f.abs())
            x = torch.where(accept[:, None], cand, x)
            pending = pending & ~accept
            if not pending.any():
                break
            t *= 0.5
    return x, H


def _with_free(x, free, fixed_t, N, joint):
    out = {p: (x[:, j].expand(N) if joint else x[:, j]) for j, p in enumerate(free)}
    out.update(fixed_t)
    return out


def _grad_hessian(group_loss, x):
    """``(f [G], g [G, k], H [G, k, k])``: loss per group, gradient and per-group Hessians at ``x``.

    Groups are independent (``group_loss`` of one group depends on its own row of ``x`` only), so
    ``k`` Hessian-vector products give every block. Double backward through the filter; central
    differences of the autograd gradient if a backend does not support it.
    """
    G, k = x.shape
    y = x.detach().requires_grad_(True)
    try:
        f = group_loss(y)
        (g,) = torch.autograd.grad(f.sum(), y, create_graph=True)
        rows = [torch.autograd.grad(g[:, j].sum(), y, retain_graph=True)[0] for j in range(k)]
        return f.detach(), g.detach(), torch.stack(rows, 1).detach()
    except RuntimeError:

        def grad_at(v):
            v = v.detach().requires_grad_(True)
            fv = group_loss(v)
            (gv,) = torch.autograd.grad(fv.sum(), v)
            return fv.detach(), gv

        f, g = grad_at(x)
        ax_ = x.detach().abs()
        h = 1e-4 * torch.where(
            ax_ > 0, ax_, torch.ones_like(ax_)
        )  # x - h stays positive where x is
        rows = []
        for j in range(k):
            e = torch.zeros_like(x)
            e[:, j] = h[:, j]
            rows.append((grad_at(x + e)[1] - grad_at(x - e)[1]) / (2 * h[:, j : j + 1]))
        return f, g, torch.stack(rows, 1).detach()
