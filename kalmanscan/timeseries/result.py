"""The result of a fit: :class:`OUFit`, the fitted model with its data, standard errors and
diagnostics, and what it computes from them (filter, smooth, disturbances, forecast, results
Dataset, summary table). The fitting itself: :mod:`kalmanscan.timeseries.fit`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from kalmanscan.timeseries._messages import SeriesLabel, _names
from kalmanscan.timeseries.model import PARAMS, Forecast, OUModel, forecast_from_state
from kalmanscan.timeseries.model_numerics import _host_array
from kalmanscan.timeseries.moments import _nan_moments
from kalmanscan.timeseries.robust import Disturbances
from kalmanscan.timeseries.times import TimeAxis


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
        series_labels: names of the series or ``None``: a DataFrame's column labels as given
            (integers stay integers; a MultiIndex's tuples), a 2-D DataArray's coordinates, a
            named Series' name. ``model`` carries them: its per-series parameters go to labelled
            data by label (:meth:`OUModel.aligned_to`).
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

    Properties ``params`` (``{name: value}``, fixed ones included) and ``total_loglik`` (the
    sum over the fitted series); methods :meth:`filter`, :meth:`smooth`, :meth:`disturbances`,
    :meth:`forecast`, :meth:`to_dataset` and :meth:`summary` work on the fitted data. Series that
    were not fitted (fewer than 2 observations, or constant: their parameters the starting
    values) have no estimate: those methods give NaN for them, with a warning naming them.

    >>> import kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> round(fit.params["sigma2"], 1), round(fit.stderr["sigma2"]), bool(fit.converged)
    (1469.2, 1280, True)
    >>> fit.n_obs, fit.at_boundary
    (100, {'sigma2': False, 'obs_var': False})
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
    # what profile_interval refits with: (slimmed fit core, dt, fixed_flat, free, max_iter, tol,
    # backend, device), set by fit_ou; None (a fit assembled otherwise): refitted with defaults
    _profile_state: tuple | None = field(default=None, repr=False, compare=False)
    # the filtered state at the last time, with a digest of what it was computed from
    _last_state: tuple | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name, value):
        # the model carries the series labels (set here, or later: the CLI's and the robust
        # fit's are), so that fit.model goes to labelled data by label
        object.__setattr__(self, name, value)
        if name in ("model", "series_labels"):
            model, labels = self.__dict__.get("model"), self.__dict__.get("series_labels")
            if isinstance(model, OUModel) and (labels is not None or model._series_labels):
                object.__setattr__(self, "model", model._with_series_labels(labels))

    @property
    def params(self) -> dict:
        """Estimated and fixed parameters, ``{name: value}``."""
        return self.model.params()

    def _unfitted(self) -> np.ndarray:
        """``[N]`` (the series flattened): True for the series of separate fits that were not
        fitted, with fewer than 2 observations or constant (their parameters the starting
        values), by ``fit_ou``'s rule on the fitted data ``z``; all False for a joint fit."""
        T = self.z.shape[0]
        Z = np.asarray(self.z, dtype=np.float64).reshape(T, -1)
        if self.joint:
            return np.zeros(Z.shape[1], bool)
        n_obs = (~np.isnan(Z)).sum(0)
        return (n_obs < 2) | (_nan_moments(Z)[2] == 0)

    def _no_estimate(self, what: str, stacklevel: int = 3) -> np.ndarray:
        """:meth:`_unfitted`, with a warning naming those series where there are any: ``what``
        (the method) reports NaN for them."""
        none = self._unfitted()
        if none.any():
            T = self.z.shape[0]
            Z = np.asarray(self.z, dtype=np.float64).reshape(T, -1)
            few = (~np.isnan(Z)).sum(0) < 2
            parts = []
            for rows, why in ((none & few, "fewer than 2 observations"), (none & ~few, "constant")):
                if rows.any():
                    parts.append(f"{_names(np.flatnonzero(rows), self.series_labels)} ({why})")
            warnings.warn(
                f"OUFit.{what}: NaN for series " + " and ".join(parts) + ": not fitted, so there "
                "is no estimate (their parameters are only the starting values; see notes)",
                stacklevel=stacklevel,
            )
        return none

    @property
    def total_loglik(self) -> float:
        """The log-likelihood summed over the fitted series (a float). Series with fewer than
        2 observations or constant, which keep their starting values (``notes`` names them), are
        left out: their log-likelihood there depends on those values only."""
        ll = np.broadcast_to(np.asarray(self.loglik, dtype=np.float64), self.z.shape[1:])
        return float(np.sum(ll.reshape(-1)[~self._unfitted()]))

    def filter(self):
        """:class:`kalmanscan.FilterResult` of the data under the fitted model (time first).

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
        >>> res = fit.filter()
        >>> res.mean.shape, round(float(res.var[-1]), 1), round(float(res.loglik), 4)
        ((100,), 4032.2, -632.5456)
        """
        res = self.model.filter_prepared(self.z, self.time_axis)
        return _blank_filter(res, self._no_estimate("filter"))

    def smooth(self):
        """:class:`kalmanscan.SmoothResult` of the data under the fitted model (time first).

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> sm = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).smooth()
        >>> sm.mean.shape, round(float(sm.var[0]), 1), round(float(sm.filtered.var[-1]), 1)
        ((100,), 4032.2, 4032.2)
        """
        res = self.model.filter_prepared(self.z, self.time_axis, smooth=True)
        none = self._no_estimate("smooth")
        return type(res)(
            _blank(res.mean, none, True), _blank(res.var, none, True),
            _blank_filter(res.filtered, none),
        )  # fmt: skip

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
        none = self._no_estimate("disturbances")
        return Disturbances(
            _blank(d.observation, none, True).reshape(shape),
            _blank(d.state, none, True).reshape(shape),
        )

    def forecast(
        self, steps=None, *, at=None, coverage: float = 0.95, future_params=None
    ) -> Forecast:
        """Forecast ``steps`` typical steps past the last timestamp, or at timestamps ``at``.

        The interval takes the estimates as the true parameters: it leaves out their estimation
        error, so from short records it covers less than ``coverage`` (docs/model.md,
        "Forecasts").

        Args:
            steps: number of future steps, spaced by the median step of the fitted times.
            at: future timestamps instead (numbers or datetimes, like the fitted times;
                periods of their frequency where those were pandas periods; times of any
                timezone where those carried one).
            coverage: probability of the predictive interval of a new observation.
            future_params: parameter values over the forecast in place of the fitted ones, as
                for :func:`kalmanscan.forecast` (e.g. a known ``obs_var`` per forecast time).

        Returns:
            a :class:`~kalmanscan.timeseries.Forecast`, arrays ``[H, *S]`` (``times``: a
            ``PeriodIndex`` continuing the periods, where the fitted times were pandas periods;
            a tz-aware ``DatetimeIndex`` in their timezone, where they carried one).

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> fc = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).forecast(3, coverage=0.9)
        >>> fc.times.tolist(), fc.mean.round(2).tolist(), fc.lower.round(2).tolist()
        ([1971.0, 1972.0, 1973.0], [798.37, 798.37, 798.37], [562.29, 554.01, 546.01])
        """
        last_mean, last_var = self._filtered_last()
        fc = forecast_from_state(
            self.model,
            self.time_axis,
            last_mean,
            last_var,
            steps=steps,
            at=at,
            coverage=coverage,
            future_params=future_params,
        )
        none = self._no_estimate("forecast")
        if not none.any():
            return fc
        blank = (_blank(x, none, True) for x in fc[1:6])
        return fc._replace(**dict(zip(fc._fields[1:6], blank, strict=True)))

    def _filtered_last(self):
        """``(mean, var)`` filtered at the last time: the filter is run once and its last
        state kept (a million steps take 0.5 s to filter, a forecast from the state 1 ms), keyed
        by a digest of the data, the times and the parameters, so a change to any of them in
        place is seen."""
        import hashlib

        m = self.model
        h = hashlib.blake2b(str(m.time_unit).encode(), digest_size=16)
        for a in (self.z, self.time_axis.t, *m.params().values(), m.prior_mean, m.prior_var):
            a = np.ascontiguousarray(_host_array(np.nan if a is None else a))
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        key = h.digest()
        cached = self.__dict__.get("_last_state")
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        res = self.model.filter_prepared(self.z, self.time_axis)
        last = (key, np.array(_host_array(res.mean[-1])), np.array(_host_array(res.var[-1])))
        object.__setattr__(self, "_last_state", last)
        return last[1], last[2]

    def profile_interval(self, params=None, coverage: float = 0.95) -> dict:
        """Two-sided profile-likelihood intervals of the free parameters.

        The interval of a parameter is ``{v : 2 (l_hat - l_p(v)) <= chi2_1(coverage)}``, where
        ``l_p(v)`` is the log-likelihood maximized over the other free parameters with this one
        fixed at ``v`` (a drop of 1.921 at 95%). Unlike ``estimate +/- 1.96 stderr`` it follows
        the skew of a variance's likelihood and never goes below 0 (docs/model.md,
        "Profile-likelihood intervals"). ``theta``, ``sigma2`` and ``obs_var`` are searched on a
        log scale, ``mu`` on its own; every series of the fit is profiled in one batched fit per
        point.

        - A positive parameter's lower end is 0 where the profile stays within the drop down to
          its bound; an end is ``inf`` (``-inf`` for ``mu``) where the likelihood stays within it
          up to 1e6 times the data's scale.
        - An estimate on its bound 0 (``at_boundary``) gets ``(0, b)``: ``b`` is where the profile
          has dropped by ``chi2_1(coverage) / 2``; ``upper_bound`` is the same search at the
          one-sided drop ``chi2_1(0.90) / 2``, i.e. this interval's upper end at ``coverage=0.9``.
        - A parameter the likelihood does not depend on at the maximum (``theta`` where ``sigma2``
          is 0; ``mu`` of a random walk) and ``sigma2`` of a series without persistence (white
          noise) get their whole range; that series' ``obs_var`` has the lower end 0.
        - NaN, with a warning saying why, where the fit did not converge, a series was not fitted,
          or a fit with the parameter held at a profile point did not converge.

        Args:
            params: a free parameter's name or a list of them; default all free parameters.
            coverage: the interval's probability, strictly between 0 and 1.

        Returns:
            ``{name: (lower, upper)}``: floats for one series or a joint fit, else arrays over the
            series shape.

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
        >>> lo, hi = fit.profile_interval()["sigma2"]
        >>> round(lo), round(hi)
        (252, 5985)
        """
        from kalmanscan.timeseries import profile

        return profile.fit_intervals(self, params, coverage)

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
        """Filtered/smoothed/forecast ``xarray.Dataset`` with the fit recorded (needs xarray).

        The arguments are :meth:`OUModel.to_dataset`'s; the data and times are the fitted ones,
        and the Dataset also holds the standard errors (``*_se``) and ``converged``. Variables
        and attributes: docs/api.md, "The results Dataset".

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
        >>> ds = fit.to_dataset(forecast_steps=3)
        >>> dict(ds.sizes), round(float(ds["sigma2_se"]))
        ({'time': 100, 'coverage': 2, 'forecast_time': 3}, 1280)
        """
        if series_coords is None and self.series_labels is not None and self.z.ndim == 2:
            series_coords = {"series": self.series_labels}
        if name is None and self.z.ndim == 1 and self.series_labels:  # a named Series' name
            label = self.series_labels[0]
            name = label if isinstance(label, str) and type(label) is not SeriesLabel else None
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
        """A plain-text table of estimates and standard errors, one row per series (the first
        ``max_series``), with the log-likelihood and convergence.

        >>> import kalmanscan as ks
        >>> from kalmanscan.timeseries import load_nile
        >>> years, flow = load_nile()
        >>> print(ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).summary())
        OU model fit by maximum likelihood: 1 series, 100 time steps
        fixed: theta=0.0, mu=0.0
            series         sigma2     (s.e.)        obs_var     (s.e.)       loglik  conv
                 0        1469.18       1280        15098.5       3146    -632.5456  True
        total loglik -632.5456 over 100 observations (exact diffuse convention: steps with zero
        prior precision add nothing); 5 Newton iterations
        """
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
            lines.append(
                f"{name(labels[i]):>{w}} {cells} {_decimals(ll[i]):>12} {str(bool(conv[i])):>5}"
            )
        if n_series > max_series:
            lines.append(f"... {n_series - max_series} more series")
        unfitted = self._unfitted()
        n_obs = np.broadcast_to(np.asarray(self.n_obs), shape).reshape(-1)
        left_out = ""
        if unfitted.any():
            idx = np.flatnonzero(unfitted)
            shown = ", ".join(repr(labels[i]) if self.series_labels else str(i) for i in idx[:5])
            more = f" and {idx.size - 5} more" if idx.size > 5 else ""
            left_out = f"; {idx.size} series not fitted ({shown}{more}) left out"
        lines.append(
            f"total loglik {_decimals(self.total_loglik)} over {int(np.sum(n_obs[~unfitted]))} "
            "observations"
            " (exact diffuse convention: steps with zero prior precision add nothing); "
            f"{self.n_iter} Newton iterations"
            + (", one parameter set for all series" if self.joint else "")
            + left_out
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# the results Dataset's variables computed from the parameters (to_dataset blanks them for the
# series that were not fitted)
_DERIVED_VARS = (
    "mean", "variance", "precision", "lower", "upper", "pred_mean", "pred_variance",
    "smoothed_mean", "smoothed_variance", "smoothed_lower", "smoothed_upper", "loglik",
    "forecast_mean", "forecast_variance", "forecast_predictive_variance", "forecast_lower",
    "forecast_upper",
)  # fmt: skip


def blank_unfitted(ds, fit, time_dim: str = "time"):
    """``ds`` (``OUModel.to_dataset``'s results of ``fit``'s series) with NaN in the variables
    computed from the parameters for the series ``fit`` did not fit, with its warning."""
    none = fit._no_estimate("to_dataset", stacklevel=5)
    if none.any():
        import xarray as xr

        dims = [d for d in ds["observed"].dims if d != time_dim]
        keep = xr.DataArray(~none.reshape(fit.z.shape[1:]), dims=dims)
        for k in _DERIVED_VARS:
            if k in ds:
                ds[k] = ds[k].where(keep)
    return ds


def _blank(a, none: np.ndarray, time_first: bool):
    """``a`` (``[T, *S]`` if ``time_first`` else ``[*S]``, the series flattened in C order
    matching ``none [N]``) with NaN for the series ``none``; ``a`` itself where there are none."""
    if a is None or not none.any():
        return a
    arr = np.array(_host_array(a), dtype=np.float64)
    flat = arr.reshape((arr.shape[0], -1) if time_first else (-1,))
    flat[..., none] = np.nan
    return flat.reshape(arr.shape)


def _blank_filter(res, none: np.ndarray):
    """A ``FilterResult`` with NaN for the series ``none`` (its ``final`` state included)."""
    if not none.any():
        return res
    fields = {k: _blank(getattr(res, k), none, True) for k in res._fields[:7]}
    fields["loglik"] = _blank(res.loglik, none, False)
    final = res.final
    if final is not None:
        final = type(final)(*(_blank(x, none, False) for x in final))
    return res._replace(**fields, final=final)


def _decimals(x, places: int = 4) -> str:
    """``x`` with ``places`` decimals where every digit shown is one float64 holds and one is
    significant (``1e-3 <= |x| < 1e11``, or 0), else in scientific notation with 10 significant
    digits; a log-likelihood in the fit's summary and the CLI's.

    >>> _decimals(-632.54562), _decimals(-4.2159336508682555e201), _decimals(2.5e-7)
    ('-632.5456', '-4.215933651e+201', '2.500000000e-07')
    """
    x = float(x)
    if not math.isfinite(x) or x == 0 or 1e-3 <= abs(x) < 1e11:
        return f"{x:.{places}f}"
    return f"{x:.9e}"
