"""The Ornstein–Uhlenbeck / local-level model on a time axis (:class:`OUModel`: filter, smooth,
simulate, a Dataset of results), and forecasting from it (:func:`forecast`).

Notation (docs/model.md): the latent level follows ``dx = -theta (x - mu) dt + sigma dW`` with
``sigma2 = sigma**2``; an observation is ``z = x + e``, ``e ~ N(0, obs_var)``. Between timestamps a
step ``dt`` apart the exact transition is ``x_t = a x_{t-1} + mu (1 - a) + w``, ``w ~ N(0, p)``,
with ``(a, p) = kalmanscan.discretize_ou(theta, sigma2, dt)``. ``theta = 0`` is the random walk
(local level).

Shapes: ``z`` is ``[T, *S]`` with time on ``axis`` (default 0); ``S`` are independent series sharing
the timestamps. Parameters are scalars or arrays broadcasting against ``S``.

Prior (the state at the first timestamp): stationary ``N(mu, sigma2 / (2 theta))`` when
``theta > 0``, diffuse when ``theta = 0``; both are ``lam_0 = 2 theta / sigma2`` in information
form, so the default is continuous in ``theta``. Override with ``prior_mean`` / ``prior_var``.

Units: every output is computed in units of a power of two ``c`` per series (the largest of the
data's largest magnitude and the parameters' scales, :func:`data_unit`) and mapped back (means
times ``c``, variances times ``c**2``, the log-likelihood minus ``log c`` per contributing
observation). Dividing by a power of two is exact, so the answer is the natural-unit one wherever
that is representable, and data at 1e-150 or 1e150 give the scale-1 answer rescaled
(docs/model.md, "Units and scale"). float32 data keep float32 results, refused (``ValueError``
naming ``z``) where a variance or its precision leaves float32's normal range in the data's units
(data below about 1e-19 or above 1e19; ``model_numerics._check_held``).

The roles around the class have their own modules, their names importable from here as before:
the data and parameters as given, checked and laid out time first
(:mod:`~kalmanscan.timeseries.model_input`); the transition of each step, the default prior and
the units (:mod:`~kalmanscan.timeseries.model_numerics`); forecasts from the filtered state at
the last time (:mod:`~kalmanscan.timeseries.model_forecast`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.core.discretize import discretize_ou
from kalmanscan.timeseries._messages import _plain  # noqa: F401 - re-exported
from kalmanscan.timeseries.coverage import check_coverage

# the roles around the class: used here, and importable from model as before
from kalmanscan.timeseries.model_forecast import (  # noqa: F401 - re-exported
    Forecast,
    forecast_from_state,
    forecast_labels,
)
from kalmanscan.timeseries.model_input import (  # noqa: F401 - re-exported
    _check_reciprocal,
    _has_labels,
    _param_array,
    align_series_labels,
    align_to_data,
    series_input,
)
from kalmanscan.timeseries.model_numerics import (  # noqa: F401 - re-exported
    _first_step,
    _host_array,
    _in_dtype,
    _loglik_in_data_units,
    _one_number,
    _rescale_filter,
    _rescale_smoothed,
    _scaled,
    contributing_steps,
    data_unit,
    default_prior,
    median_step,
    one_minus_decay,
    ou_arrays,
    step_classes,
)
from kalmanscan.timeseries.times import TimeAxis, as_time_axis

PARAMS = ("theta", "sigma2", "mu", "obs_var")


@dataclass(frozen=True)
class OUModel:
    """An OU (``theta > 0``) or local-level (``theta = 0``) model for series on a time axis.

    Args:
        theta: mean-reversion rate per time unit (``>= 0``; 0 = random walk).
        sigma2: diffusion variance per time unit (``>= 0``).
        mu: long-run mean.
        obs_var: observation-noise variance (``> 0``).
        prior_mean, prior_var: state at the first timestamp; default stationary / diffuse
            (see module).
        time_unit: model time unit for datetime timestamps (default ``"1D"``); ``None`` for numbers.

    Each parameter is a scalar or an array over the series shape ``S``. One given as a pandas
    ``Series``/``DataFrame`` or an xarray ``DataArray`` is matched by label to data that carry
    labels (a DataFrame's columns, or its index for values per step; a DataArray's coordinates);
    to other data it applies by position (:func:`align_to_data`). A fit's model
    (``OUFit.model``) carries the fit's series labels the same way: its per-series parameters go
    to labelled data by label (:func:`align_series_labels`; a series the fit lacks is refused).

    >>> import numpy as np
    >>> m = OUModel(theta=0.0, sigma2=1469.1, obs_var=15099.0)
    >>> res = m.filter(np.array([1120.0, 1160.0, 963.0]))
    >>> res.var.round(1).tolist()
    [15099.0, 7899.7, 5781.5]
    """

    theta: object = 0.0
    sigma2: object = 1.0
    mu: object = 0.0
    obs_var: object = 1.0
    prior_mean: object = None
    prior_var: object = None
    time_unit: object = field(default=None)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        # parameters given with labels (pandas, xarray), matched to the data's when it has them
        fields = (*PARAMS, "prior_mean", "prior_var")
        set_("_labelled", {k: getattr(self, k) for k in fields if _has_labels(getattr(self, k))})
        set_("_series_labels", None)  # a fit's series labels (_with_series_labels)
        set_("theta", _param_array("theta", self.theta, lo=0.0))
        set_("sigma2", _param_array("sigma2", self.sigma2, lo=0.0))
        set_("mu", _param_array("mu", self.mu))
        set_("obs_var", _param_array("obs_var", self.obs_var, lo=0.0, lo_open=True))
        _check_reciprocal("obs_var", self.obs_var)
        if self.prior_mean is not None:
            set_("prior_mean", _param_array("prior_mean", self.prior_mean))
        if self.prior_var is not None:
            set_(
                "prior_var",
                _param_array("prior_var", self.prior_var, lo=0.0, allow_inf=True),
            )

    # --- the pieces every method shares -------------------------------------------------------
    def params(self) -> dict:
        """The four parameters as a dict, ``{"theta", "sigma2", "mu", "obs_var"}``.

        >>> OUModel(theta=0.5, sigma2=2.0, mu=1.0, obs_var=0.1).params()
        {'theta': 0.5, 'sigma2': 2.0, 'mu': 1.0, 'obs_var': 0.1}
        """
        return {k: getattr(self, k) for k in PARAMS}

    def prior(self, n_series_dims: int | None = None):
        """``(prior_mean, prior_var)`` actually used (defaults filled in: the stationary
        ``N(mu, sigma2 / (2 theta))`` for ``theta > 0``, diffuse where ``theta = 0``); for data
        with ``n_series_dims`` series dims, parameters given per step (``[T, *S]``) set the
        default by their first step's values.

        >>> OUModel(theta=0.5, sigma2=2.0, mu=1.0).prior(), OUModel(theta=0.0).prior()
        ((1.0, 2.0), (0.0, inf))
        """
        theta, sigma2, mu = _first_step((self.theta, self.sigma2, self.mu), n_series_dims)
        mean, var = default_prior(theta, sigma2, mu)
        return (
            mean if self.prior_mean is None else self.prior_mean,
            var if self.prior_var is None else self.prior_var,
        )

    def _with_series_labels(self, labels) -> OUModel:
        """This model with its per-series parameters (1-D arrays, one value per series) labelled
        by ``labels`` (a fit's ``series_labels``), to be matched by label to labelled data
        (:meth:`aligned_to`). Labels that name nothing are left off: ``None``, the default
        ``0, 1, ...`` (a frame without column labels), the names of the xarray accessor's
        messages, duplicates, or a count other than the parameters'.

        >>> import numpy as np
        >>> m = OUModel(sigma2=np.array([1.0, 2.0]))._with_series_labels(["a", "b"])
        >>> m._series_labels, OUModel()._with_series_labels(["a"])._series_labels
        (['a', 'b'], None)
        """
        from kalmanscan.timeseries._messages import SeriesLabel

        n = {np.shape(v) for v in self.params().values() if np.ndim(v) > 0}
        ok = (
            labels is not None
            and len(n) == 1
            and len(next(iter(n))) == 1
            and len(labels) == next(iter(n))[0]
            and not any(isinstance(x, SeriesLabel) for x in labels)
        )
        if ok:
            try:
                ok = len(set(labels)) == len(labels)  # (hashable and unique)
            except TypeError:
                ok = False
        if ok and all(type(x) is int for x in labels):
            ok = list(labels) != list(range(len(labels)))  # pandas' default labels: positions
        if (labels if ok else None) is self._series_labels:
            return self
        new = replace(self)
        new._labelled.update(self._labelled)
        object.__setattr__(new, "_series_labels", labels if ok else None)
        return new

    def _series_aligned(self, z, axis: int = 0, data_name: str = "z") -> dict:
        """``{name: value}`` of the per-series parameters labelled by a fit's series labels
        (:meth:`_with_series_labels`; not those given with labels of their own) matched by
        label to the data ``z`` (:func:`align_series_labels`); empty where there are none."""
        if self._series_labels is None:
            return {}
        return {
            k: align_series_labels(k, v, self._series_labels, z, axis, data_name)
            for k, v in {
                **self.params(),
                "prior_mean": self.prior_mean,
                "prior_var": self.prior_var,
            }.items()
            if k not in self._labelled and np.ndim(v) == 1
        }

    def aligned_to(self, z, axis: int = 0) -> OUModel:
        """This model with its parameters given as pandas or xarray objects matched by label to
        the data ``z`` (a DataFrame's columns or index, a DataArray's coordinates) and laid out
        time first (:func:`align_to_data`), and those of a fit's model matched by the fit's series
        labels (:func:`align_series_labels`); ``self`` where there is nothing to match.

        >>> import pandas as pd
        >>> z = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
        >>> OUModel(sigma2=pd.Series({"b": 2.0, "a": 1.0})).aligned_to(z).sigma2.tolist()
        [1.0, 2.0]
        """
        from kalmanscan.core._args import as_real_numpy

        if not (self._labelled or self._series_labels is not None) or not _has_labels(z):
            return self
        changes = {}
        for k, v in self._labelled.items():
            changes[k] = as_real_numpy(k, align_to_data(k, v, z, axis))
        for k, v in self._series_aligned(z, axis).items():
            changes[k] = as_real_numpy(k, v)
        return replace(self, **changes)

    def _prepare(self, z, times, axis):
        """``(model, z, time_axis, series_labels)``: the model matched to ``z``'s labels and the
        checked time-first data."""
        model = self.aligned_to(z, axis)
        z, times, labels = series_input(z, times, axis)
        model.check_shapes(z.shape)
        ax = as_time_axis(times, z.shape[0], model.time_unit)
        return model, z, ax, labels

    def check_shapes(self, data_shape) -> None:
        """Refuse parameters that do not broadcast to time-first data of shape ``[T, *S]`` (one
        value, a value per series, or per step and series), naming the first; the prior's, which
        hold at the first step, to ``S``."""
        data_shape = tuple(data_shape)
        given = {**self.params(), "prior_mean": self.prior_mean, "prior_var": self.prior_var}
        for name, v in given.items():
            if v is None or type(v) is float:  # (one number broadcasts to any shape)
                continue
            target = data_shape[1:] if name.startswith("prior") else data_shape
            shape = tuple(v.shape) if hasattr(v, "shape") else np.shape(v)
            try:
                ok = np.broadcast_shapes(shape, target) == target
            except ValueError:
                ok = False
            if not ok:
                what = "series shape" if name.startswith("prior") else "shape [T, *S]"
                raise ValueError(
                    f"{name}: expected a scalar or values broadcasting to the data's {what} "
                    f"{target}, got shape {shape}"
                )

    def filter_args(self, time_axis: TimeAxis, n_series_dims: int, unit=None) -> dict:
        """Keyword arguments of :func:`kalmanscan.filter` for this model on ``time_axis``; with
        ``unit`` (``c``, per series) those for the data ``z / c`` (means over ``c``, variances
        over ``c**2``).

        Parameters given per step (``[T, *S]``) set the default prior by their first step's
        values. ``n_series_dims``: the number of series dims of the time-first data.

        >>> import numpy as np, kalmanscan as ks
        >>> from kalmanscan.timeseries import as_time_axis
        >>> m = OUModel(theta=0.5, sigma2=2.0, mu=1.0, obs_var=0.1)
        >>> args = m.filter_args(as_time_axis(np.array([0.0, 1.0, 3.0]), 3), 0)
        >>> sorted(args)
        ['decay', 'obs_var', 'offset', 'prior_mean', 'prior_var', 'process_var']
        >>> args["decay"].round(4).tolist()  # exp(-theta dt), dt = 0, 1, 2
        [1.0, 0.6065, 0.3679]
        >>> z = np.array([1.2, 0.8, 1.1])
        >>> bool(np.allclose(ks.filter(z, **args).mean, m.filter(z, [0.0, 1.0, 3.0]).mean))
        True
        """
        return self._filter_args(time_axis, n_series_dims, unit)

    def _filter_args(
        self, time_axis: TimeAxis, n_series_dims: int, unit=None, *, dt=None, classes=False
    ) -> dict:
        """:meth:`filter_args` with ``time_axis.dt`` and its ``model_numerics.step_classes``
        (``dt``, ``classes``) where the caller has them."""
        if unit is None:
            sigma2, mu, obs_var = self.sigma2, self.mu, self.obs_var
            prior_mean, prior_var = self.prior(n_series_dims)
        else:
            # variances over c**2 as two divisions by c (c a power of two: exact): 1 / c**2
            # overflows where every scale is subnormal (c below 2**-511)
            inv = 1.0 / unit
            sigma2, mu, obs_var = (
                _scaled(_scaled(self.sigma2, inv), inv), _scaled(self.mu, inv),
                _scaled(_scaled(self.obs_var, inv), inv),
            )  # fmt: skip
            like = next((v for v in self.params().values() if isinstance(v, torch.Tensor)), None)
            if like is not None:  # tensor parameters: the scaled numbers become tensors too
                sigma2, mu, obs_var = (
                    torch.as_tensor(v, dtype=like.dtype, device=like.device)
                    for v in (sigma2, mu, obs_var)
                )
            first = _first_step((self.theta, sigma2, mu), n_series_dims)
            prior_mean, prior_var = default_prior(*first)
            if self.prior_mean is not None:
                prior_mean = _scaled(self.prior_mean, inv)
            if self.prior_var is not None:
                prior_var = _scaled(_scaled(self.prior_var, inv), inv)
        dt = time_axis.dt if dt is None else dt
        decay, process_var, offset = ou_arrays(
            self.theta, sigma2, mu, dt, n_series_dims, classes=classes
        )
        return dict(
            obs_var=obs_var,
            decay=decay,
            process_var=process_var,
            offset=offset,
            prior_mean=prior_mean,
            prior_var=prior_var,
        )

    def unit(self, z, time_axis: TimeAxis, *, tau=None) -> np.ndarray:
        """The per-series power of two ``c [*S]`` the filter works in for time-first ``z``
        (module docstring): at or above ``max |z|``, ``sqrt(obs_var)``, ``|mu|``,
        ``sqrt(sigma2 * tau)`` (``tau`` the median step, where the caller has it) and the
        prior's mean and scale."""
        tau = median_step(time_axis.dt) if tau is None else tau
        values = [z, self.mu, self.prior_mean]
        scales = [self.obs_var, _scaled(self.sigma2, tau), self.prior_var]
        shape = np.shape(z)[1:]
        c = data_unit(shape, values, scales)
        # a value far beyond the variances (a 1e300 among data of order 1000 with obs_var 1.5e4)
        # would scale a positive variance below float64's normal range (0: "expected > 0"):
        # those series are filtered in their own units, where the filter itself says what
        # float64 cannot hold (squared innovations past its maximum)
        lost = np.zeros(shape, bool)
        # the scales given as one number each, checked together (the same comparisons)
        ones = [x for x in map(_one_number, scales) if x is not None]
        if ones:
            scales = [
                np.array(ones)[(slice(None),) + (None,) * len(shape)],
                *(v for v in scales if v is not None and _one_number(v) is None),
            ]
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            for i, v in enumerate(scales):
                if v is None:
                    continue
                a = np.abs(_host_array(v))
                try:
                    small = (a > 0) & (a / np.square(c) < np.finfo(np.float64).tiny)
                    if ones and i == 0:  # (the numbers, one row each)
                        small = small.any(0)
                    elif small.ndim > len(shape):  # (per-step parameters)
                        small = small.reshape((-1,) + shape).any(0)
                    lost |= small
                except ValueError:  # (shapes the filter's own argument check refuses)
                    continue
        return np.where(lost, 1.0, c)

    # --- public methods -----------------------------------------------------------------------
    def filter(self, z, times=None, *, axis: int = 0, backend: str = "auto"):
        """Filter ``z`` (time on ``axis``) observed at ``times``: a ``kalmanscan.FilterResult``.

        >>> import numpy as np
        >>> OUModel(theta=0.5, sigma2=1.0, obs_var=0.1).filter(np.zeros(3)).mean.tolist()
        [0.0, 0.0, 0.0]
        """
        model, zt, ax, _ = self._prepare(z, times, axis)
        res = model.filter_prepared(zt, ax, backend=backend, data=_time_first_tensor(z, axis))
        return _move_time(res, axis)

    def _scaled_inputs(self, z, time_axis: TimeAxis, data=None):
        """``(c, z / c, args)``: the unit :meth:`unit`, the data in it and the filter's keyword
        arguments for them (:meth:`filter_args`). ``data``: the time-first tensor ``z`` was read
        from, if any; ``z / c`` is then that tensor's (on its device, its graph followed)."""
        dt = time_axis.dt
        classes = step_classes(dt)
        c = self.unit(z, time_axis, tau=median_step(dt, classes))
        if data is None:
            zs = (z / c).astype(z.dtype, copy=False)
        else:  # z / c in float64, then z's dtype, as above (c a power of two: exact)
            dtype = torch.float32 if z.dtype == np.float32 else torch.float64
            zs = (data.to(torch.float64) / torch.as_tensor(c, device=data.device)).to(dtype)
        args = self._filter_args(time_axis, z.ndim - 1, unit=c, dt=dt, classes=classes)
        if z.dtype != np.float64:
            # exp(-theta dt) below the data's range is the state forgotten, as where it
            # underflows float64 (theta dt > 745): rounded here, the filter refuses no decay
            args["decay"] = _in_dtype(args["decay"], z.dtype)
        return c, zs, _plain_floats(args)

    def loglik_prepared(self, z, time_axis: TimeAxis, *, backend: str = "auto", data=None):
        """Log-likelihood per series of time-first ``z [T, *S]`` on a checked
        :class:`TimeAxis`: :meth:`filter_prepared`'s ``loglik`` through the filter's
        log-likelihood-only call (:func:`kalmanscan.loglik`: nothing of ``z``'s size written),
        the steps that contribute counted from its inputs (:func:`contributing_steps`).
        ``data``: the time-first tensor ``z`` was read from, if any (the filter runs on it)."""
        c, zs, args = self._scaled_inputs(z, time_axis, data)
        ll = filter_api.loglik(zs, **args, axis=0, backend=backend)
        n = contributing_steps(~np.isnan(z), args["decay"], args["process_var"], args["prior_var"])
        return _loglik_in_data_units(ll, n, c)

    def filter_prepared(
        self, z, time_axis: TimeAxis, *, smooth: bool = False, backend: str = "auto", data=None
    ):
        """Filter (or smooth) time-first ``z [T, *S]`` on a checked :class:`TimeAxis`.
        ``data``: the time-first tensor ``z`` was read from, if any: the filter runs on it, so
        the results are tensors on its device that follow its graph."""
        fn = filter_api.smooth if smooth else filter_api.filter
        c, zs, args = self._scaled_inputs(z, time_axis, data)
        res = fn(zs, **args, axis=0, backend=backend)
        observed = ~np.isnan(z)
        if not smooth:
            return _rescale_filter(res, c, observed)
        return _rescale_smoothed(res, c, observed)

    def smooth(self, z, times=None, *, axis: int = 0, backend: str = "auto"):
        """RTS smoother over the whole record: a :class:`kalmanscan.SmoothResult`.

        >>> import numpy as np
        >>> sm = OUModel(theta=0.0, sigma2=1.0, obs_var=1.0).smooth(np.array([0.0, 2.0]))
        >>> sm.mean.tolist()
        [0.6666666666666666, 1.3333333333333333]
        """
        model, zt, ax, _ = self._prepare(z, times, axis)
        data = _time_first_tensor(z, axis)
        res = model.filter_prepared(zt, ax, smooth=True, backend=backend, data=data)
        return type(res)(
            _moveaxis(res.mean, 0, axis),
            _moveaxis(res.var, 0, axis),
            _move_time(res.filtered, axis),
        )

    def loglik(self, z, times=None, *, axis: int = 0):
        """Log-likelihood per series (exact diffuse convention where the prior is diffuse).

        >>> import numpy as np
        >>> round(float(OUModel(sigma2=1.0, obs_var=1.0).loglik(np.array([0.0, 1.0]))), 4)
        -1.6349
        """
        model, zt, ax, _ = self._prepare(z, times, axis)
        return model.loglik_prepared(zt, ax, data=_time_first_tensor(z, axis))

    def forecast(
        self,
        z,
        times=None,
        *,
        steps=None,
        at=None,
        coverage: float = 0.95,
        axis: int = 0,
        future_params=None,
    ) -> Forecast:
        """Forecast after the last timestamp of ``z`` (see :func:`forecast`).

        >>> import numpy as np
        >>> fc = OUModel(theta=0.0, sigma2=1.0, obs_var=1.0).forecast(np.array([0.0, 2.0]), steps=2)
        >>> fc.times.tolist(), fc.mean.round(3).tolist()
        ([2.0, 3.0], [1.333, 1.333])
        """
        model, zt, ax, _ = self._prepare(z, times, axis)
        res = model.filter_prepared(zt, ax, data=_time_first_tensor(z, axis))
        return forecast_from_state(
            model,
            ax,
            res.mean[-1],
            res.var[-1],
            steps=steps,
            at=at,
            coverage=coverage,
            future_params=future_params,
        )

    def with_params(self, **changes) -> OUModel:
        """A copy with some fields replaced (those not replaced keep their labels, if any).

        >>> OUModel(theta=0.5, sigma2=2.0).with_params(theta=0.0).params()["theta"]
        0.0
        """
        new = replace(self, **changes)
        new._labelled.update({k: v for k, v in self._labelled.items() if k not in changes})
        object.__setattr__(new, "_series_labels", self._series_labels)
        return new

    def simulate(self, times=None, *, n: int | None = None, shape=(), seed=None):
        """Draw ``(level, z)``, each ``[T, *shape]``, from the model at ``times`` (or ``n`` steps).

        A diffuse prior starts the level at ``prior_mean`` (or ``mu``).

        >>> lev, z = OUModel(theta=1.0, sigma2=2.0, obs_var=0.5).simulate(n=5, shape=(3,), seed=0)
        >>> z.shape
        (5, 3)
        """
        if (times is None) == (n is None):
            raise ValueError(
                "times, n: give either the timestamps or the number of unit steps n, got "
                + ("neither" if times is None else "both")
            )
        if times is None:
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"n: expected a positive integer number of steps, got {n!r}")
            times = np.arange(n, dtype=np.float64)
        ax = as_time_axis(times, len(times), self.time_unit)
        rng = np.random.default_rng(seed)
        shape = tuple(
            np.broadcast_shapes(tuple(shape), *(np.shape(v) for v in self.params().values()))
        )
        pm, pv = self.prior()
        pm = np.broadcast_to(self.mu if self.prior_mean is None else pm, shape)
        pv = np.broadcast_to(pv, shape)
        x = np.where(
            np.isinf(pv),
            pm,
            pm + np.sqrt(np.where(np.isinf(pv), 0.0, pv)) * rng.standard_normal(shape),
        )
        T = len(ax.t)
        level = np.empty((T,) + shape)
        decay, process_var = discretize_ou(
            np.asarray(self.theta, dtype=np.float64),
            np.asarray(self.sigma2, dtype=np.float64),
            ax.dt.reshape((-1,) + (1,) * len(shape)),
        )
        decay = np.broadcast_to(decay, (T,) + shape)
        process_var = np.broadcast_to(process_var, (T,) + shape)
        omd = np.broadcast_to(
            one_minus_decay(self.theta, ax.dt.reshape((-1,) + (1,) * len(shape)), decay),
            (T,) + shape,
        )
        for t in range(T):
            x = (
                decay[t] * x
                + self.mu * omd[t]
                + np.sqrt(process_var[t]) * rng.standard_normal(shape)
            )
            level[t] = x
        z = level + np.sqrt(self.obs_var) * rng.standard_normal((T,) + shape)
        return level, z

    def run(
        self,
        z,
        time_axis: TimeAxis,
        *,
        smooth=True,
        forecast_at=None,
        backend="auto",
        future_params=None,
    ):
        """Filter, smooth and forecast time-first ``z [T, *S]`` on a checked :class:`TimeAxis`:
        ``(filtered, smoothed, forecast)``, the last two ``None`` without ``smooth`` or
        ``forecast_at`` (checked labels, e.g. from :func:`forecast_labels`; ``future_params`` as
        for :func:`forecast`). What a Dataset shows.

        >>> import numpy as np
        >>> m = OUModel(sigma2=1.0, obs_var=1.0)
        >>> ax = as_time_axis(None, 2)
        >>> filtered, smoothed, fc = m.run(np.array([0.0, 2.0]), ax, forecast_at=[3.0])
        >>> smoothed.mean.tolist(), fc.times.tolist()
        ([0.6666666666666666, 1.3333333333333333], [3.0])
        """
        res = self.filter_prepared(z, time_axis, smooth=smooth, backend=backend)
        filtered = res.filtered if smooth else res
        fc = None
        if forecast_at is not None:
            last_mean, last_var = filtered.mean[-1], filtered.var[-1]
            fc = forecast_from_state(
                self, time_axis, last_mean, last_var, at=forecast_at, future_params=future_params
            )
        return filtered, (res if smooth else None), fc

    def to_dataset(
        self,
        z,
        times=None,
        *,
        coverage=(0.5, 0.9),
        smooth: bool = True,
        forecast_steps=None,
        forecast_at=None,
        series_dims=None,
        series_coords=None,
        name: str | None = None,
        fit=None,
        backend: str = "auto",
        future_params=None,
    ):
        """Filter (and smooth, and forecast) ``z`` and return an ``xarray.Dataset`` (needs xarray).

        Args:
            z: ``[T, *S]`` time first (pandas: index = times). times: timestamps or a
                :class:`TimeAxis`. coverage: interval coverages.
            forecast_steps, forecast_at: forecast that many typical steps ahead, or at timestamps.
            future_params: parameter values over the forecast, as for :func:`forecast`.
            series_dims: names of the series dims (default ``("series",)`` for 2-D data).
            series_coords: ``{dim: labels}``. name: recorded in ``attrs["name"]`` (default: a
                named Series' or 1-D DataArray's name).
            fit: an :class:`OUFit` to record (standard errors, etc.).

        The results are computed here (:meth:`run`) and laid out by
        :func:`kalmanscan.timeseries.dataset.results_dataset`, whose docstring lists the variables.

        >>> import numpy as np
        >>> ds = OUModel(sigma2=1469.1, obs_var=15099.0).to_dataset(
        ...     np.array([1120.0, 1160.0, 963.0]), np.array([1871, 1872, 1873]), forecast_steps=2)
        >>> ds["forecast_time"].values.tolist()
        [1874.0, 1875.0]
        """
        from kalmanscan.timeseries import dataset as view

        if (self._labelled or self._series_labels is not None) and _has_labels(z):
            return self.aligned_to(z).to_dataset(
                z, times, coverage=coverage, smooth=smooth, forecast_steps=forecast_steps,
                forecast_at=forecast_at, series_dims=series_dims, series_coords=series_coords,
                name=name, fit=fit, backend=backend, future_params=future_params,
            )  # fmt: skip
        coverage = check_coverage(coverage)
        if isinstance(times, TimeAxis):
            ax, zt, labels = times, np.asarray(z, dtype=np.float64), None
        else:
            zt, times, labels = series_input(z, times, 0)
            ax = as_time_axis(times, zt.shape[0], self.time_unit)
            if name is None and zt.ndim == 1 and labels and isinstance(labels[0], str):
                name = labels[0]  # a named Series' (or 1-D DataArray's) name
        self.check_shapes(zt.shape)
        zt = zt.astype(np.float64, copy=False)
        da = view.observed_array(
            zt,
            ax.labels,
            series_dims=series_dims,
            series_coords=series_coords,
            series_labels=labels,
            name=name,
        )
        if ax.is_datetime:  # forecast times step at the resolution the Dataset stores times in
            unit = np.timedelta64(ax.unit, "ns") if isinstance(times, TimeAxis) else self.time_unit
            ax = as_time_axis(
                da["time"].values, zt.shape[0], unit, name="coordinate 'time'"
            )._replace(utc=ax.utc, tz=ax.tz, period_freq=ax.period_freq)
        fc_labels = forecast_labels(ax, forecast_steps, forecast_at)
        if future_params is not None and fc_labels is None:
            raise ValueError(
                "future_params: the parameters over a forecast, given with no forecast; pass "
                "forecast_steps= or forecast_at= too (or leave future_params out)"
            )
        model = self  # a partly given prior is completed, as filter_dataarray gets it
        if self.prior_mean is not None or self.prior_var is not None:
            prior_mean, prior_var = self.prior()
            model = self.with_params(prior_mean=prior_mean, prior_var=prior_var)
        filtered, smoothed, fc = model.run(
            zt,
            ax,
            smooth=smooth,
            forecast_at=fc_labels,
            backend=backend,
            future_params=future_params,
        )
        ds = view.results_dataset(
            da,
            view.result_vars(filtered, smoothed, fc),
            self.params(),
            coverage=coverage,
            time_unit=ax.unit_name,
            forecast_time=fc_labels,
            custom_prior=model.prior_mean is not None,
            period_freq=ax.period_freq,
            utc=ax.utc,  # converted from a timezone or UTC offsets: the outputs say so
            tz=ax.tz,
        )
        if name:
            ds.attrs["name"] = name
        if fit is not None:
            view.record_fit(ds, fit, da.dims[1:])
            if np.shape(fit.z)[1:] == zt.shape[1:]:  # (the fit's series: NaN for those unfitted)
                from kalmanscan.timeseries.result import blank_unfitted

                ds = blank_unfitted(ds, fit)
        return ds


def _time_first_tensor(z, axis: int):
    """``z`` with time first where it is a tensor (the data the filter then runs on, so that
    the results follow its graph and stay on its device), else None."""
    return torch.movedim(z, axis, 0) if isinstance(z, torch.Tensor) else None


def _plain_floats(args: dict) -> dict:
    """``args`` with each value that is one float64 on the host (a scalar parameter, the default
    prior) as a Python float: :func:`kalmanscan.filter` keeps those as constants (no conversion
    a call, the prior's triple computed once), the same numbers as from a numpy scalar."""
    return {k: v if (x := _one_number(v)) is None else x for k, v in args.items()}


def _moveaxis(x, source: int, destination: int):
    """``np.moveaxis`` for a numpy array or a tensor (results of tensor parameters), keeping
    its type and, for a tensor, its graph."""
    if isinstance(x, torch.Tensor):
        return torch.movedim(x, source, destination)
    return np.moveaxis(x, source, destination)


def _move_time(res, axis):
    if axis == 0:
        return res
    timed = ("mean", "var", "precision", "info", "pred_mean", "pred_var", "pred_precision")
    return res._replace(
        **{k: _moveaxis(getattr(res, k), 0, axis) for k in timed if hasattr(res, k)}
    )


def forecast(
    model_or_fit,
    z=None,
    times=None,
    *,
    steps=None,
    at=None,
    coverage: float = 0.95,
    axis: int = 0,
    future_params=None,
) -> Forecast:
    """Forecast past the last observation, ``steps`` typical steps ahead or at timestamps ``at``.

    The interval is conditional on the parameters (the fitted estimates taken as the truth): it
    leaves out their estimation error, so from short records it covers less than ``coverage``
    (docs/model.md, "Forecasts").

    Args:
        model_or_fit: an :class:`OUFit` (uses its data) or an :class:`OUModel` (then give ``z``).
        z, times, axis: the record, as for :meth:`OUModel.filter` (only with a model).
        steps: number of future steps spaced by the median step of ``times``.
        at: future timestamps (numbers or datetimes, like ``times``; periods of their
            frequency, or the times those start, where ``times`` are pandas periods; times
            of any timezone, taken at their instant, where ``times`` carried one: naive ones
            are then read as UTC), each ``>=`` the last one.
        coverage: probability of the predictive interval of a new observation.
        future_params: parameter values that hold over the forecast, ``{name: value}``, in place
            of the model's: per series (``[*S]``), and for ``obs_var`` also per forecast time
            (``[H, *S]``). Needed for a parameter the model gives per step of the record (which
            is still filtered with those values).

    Returns:
        :class:`Forecast` with arrays ``[H, *S]``; its ``times`` are of the record's kind (a
        ``PeriodIndex`` of the record's frequency for times given as pandas periods; a
        tz-aware ``DatetimeIndex`` in the record's timezone for times given with one, UTC for
        UTC offsets of no one zone).

    >>> import numpy as np, kalmanscan as ks
    >>> m = ks.OUModel(theta=0.0, sigma2=1469.1, obs_var=15099.0)
    >>> z, years = np.array([1120.0, 1160.0, 963.0]), np.array([1871, 1872, 1873])
    >>> fc = ks.forecast(m, z, years, steps=1)
    >>> fc.times.tolist()
    [1874.0]
    """
    from kalmanscan.timeseries.result import OUFit

    if isinstance(model_or_fit, OUFit):
        if z is not None or times is not None:
            raise ValueError(
                "z, times: an OUFit forecasts its own data; pass z only with an OUModel"
            )
        if axis != 0:
            raise ValueError(
                f"axis: an OUFit forecasts its own data on the time axis it was fitted on, "
                f"got axis={axis!r}; pass axis only with an OUModel and z"
            )
        return model_or_fit.forecast(
            steps=steps, at=at, coverage=coverage, future_params=future_params
        )
    if not isinstance(model_or_fit, OUModel):
        raise TypeError(
            f"model_or_fit: expected an OUModel or OUFit, got {type(model_or_fit).__name__}"
        )
    if z is None:
        raise ValueError("z: expected the observed record to forecast from, got None")
    return model_or_fit.forecast(
        z, times, steps=steps, at=at, coverage=coverage, axis=axis, future_params=future_params
    )
