"""Forecasting from the model: :func:`forecast_from_state` (the level's mean and variance, a
new observation's predictive variance and its central interval at future times, from the
filtered state at the record's last time) returning a :class:`Forecast`, and the future
timestamps (:func:`forecast_labels`: typical steps past the record, or given times, checked
against the time axis). The entry points are :func:`kalmanscan.timeseries.model.forecast` and
``OUModel.forecast``.

Types: numpy in gives numpy out; where the filtered state, a parameter or a ``future_params`` value
is a tensor, the forecast is computed by torch (:func:`_forecast_torch`) and its arrays are tensors
in the filtered state's dtype on its device, differentiable in the parameters and, through the
filter (``OUModel.filter_prepared`` on the tensor), in tensor data.

Units: like the filter's results, a forecast is computed in units of a power of two ``c`` per series
(:func:`~kalmanscan.timeseries.model_numerics.data_unit`) and mapped back, means times ``c`` and
variances times ``c**2`` (:mod:`kalmanscan.timeseries.model`; docs/model.md, "Units and scale").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from kalmanscan.core._args import float64_on
from kalmanscan.core.discretize import discretize_ou
from kalmanscan.timeseries._messages import _plain
from kalmanscan.timeseries.coverage import check_coverage, interval
from kalmanscan.timeseries.model_numerics import (
    _host_array,
    data_unit,
    one_minus_decay,
)
from kalmanscan.timeseries.time_cftime import is_cftime
from kalmanscan.timeseries.times import (  # as_time_axis: forecast_labels' example calls it
    TimeAxis,
    _normalize_datetimes,
    as_time_axis,  # noqa: F401
    check_steps,
    to_periods,
)

if TYPE_CHECKING:  # (an annotation only: model imports this module)
    from kalmanscan.timeseries.model import OUModel


class Forecast(NamedTuple):
    """Forecast at future ``times`` (time first: ``[H, *S]``).

    ``mean``/``var``: the latent level; ``predictive_var = var + obs_var``: a new observation;
    ``lower``/``upper``: the central predictive interval of a new observation at ``coverage``.
    ``times`` are of the record's kind: float64 numbers, ``datetime64``, cftime dates, or, for a
    record of pandas periods (a ``PeriodIndex``), a ``PeriodIndex`` of its frequency; for a
    record whose times carried a timezone (a tz-aware index, a polars ``Datetime`` with a
    ``time_zone``, datetimes or strings with UTC offsets), a tz-aware pandas ``DatetimeIndex``
    in the one zone they were given in (UTC where they carried offsets of no one zone).
    Returned by :func:`kalmanscan.forecast`, :meth:`OUModel.forecast` and :meth:`OUFit.forecast`.

    >>> import numpy as np, kalmanscan as ks
    >>> m = ks.OUModel(theta=0.0, sigma2=1469.1, obs_var=15099.0)
    >>> z, years = np.array([1120.0, 1160.0, 963.0]), np.array([1871, 1872, 1873])
    >>> fc = ks.forecast(m, z, years, steps=2, coverage=0.9)
    >>> fc.times.tolist(), fc.mean.round(1).tolist(), fc.var.round(1).tolist()
    ([1874.0, 1875.0], [1072.8, 1072.8], [7250.6, 8719.7])
    >>> fc.predictive_var.round(1).tolist(), fc.lower.round(1).tolist(), fc.coverage
    ([22349.6, 23818.7], [826.9, 818.9], 0.9)
    """

    times: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    predictive_var: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    coverage: float


def _future_labels(time_axis: TimeAxis, steps, at, name: str) -> np.ndarray:
    """``steps`` typical steps past the last label, else the checked timestamps ``at``."""
    if steps is not None:
        return time_axis.future(steps)
    labels = time_axis.labels_of(at, name)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-D sequence of timestamps, got shape {labels.shape}"
        )
    check_steps(labels.size, f"{name} (number of forecast times)")
    return labels


def forecast_labels(time_axis: TimeAxis, forecast_steps=None, forecast_at=None):
    """The forecast timestamps of a Dataset: ``forecast_steps`` typical steps past the record or
    the timestamps ``forecast_at`` (at most one of them; ``None`` for neither), checked against
    ``time_axis``.

    >>> forecast_labels(as_time_axis(np.array([0.0, 2.0]), 2), forecast_steps=2).tolist()
    [4.0, 6.0]
    """
    if forecast_steps is None and forecast_at is None:
        return None
    if forecast_steps is not None and forecast_at is not None:
        raise ValueError("forecast_steps, forecast_at: give at most one")
    labels = _future_labels(time_axis, forecast_steps, forecast_at, "forecast_at")
    time_axis.position(labels, "forecast_at")
    return labels


def check_future_params(future_params) -> dict:
    """``future_params`` checked: ``{name: value}`` with names among the model's parameters,
    values real, finite and in range as the model's own (labelled pandas/xarray values refused:
    a forecast's values are taken by position). ``{}`` for None.

    >>> check_future_params({"obs_var": [0.5, 2.0]})
    {'obs_var': array([0.5, 2. ])}
    """
    from kalmanscan.timeseries.model import PARAMS
    from kalmanscan.timeseries.model_input import _has_labels, _param_array

    if future_params is None:
        return {}
    if not isinstance(future_params, dict):
        raise TypeError(
            "future_params: expected a dict of the parameters' values at the forecast times, "
            f"like {{'obs_var': 0.5}}, got {type(future_params).__name__}"
        )
    out = {}
    for k, v in future_params.items():
        if k not in PARAMS:
            raise ValueError(f"future_params: expected keys among {PARAMS}, got {k!r}")
        if _has_labels(v):
            raise TypeError(
                f"future_params[{k!r}]: expected a number or an array in the series' order "
                f"(values are taken by position), got a labelled {type(v).__name__}; pass "
                "its .to_numpy() in the order of the data's series"
            )
        lo = None if k == "mu" else 0.0
        v = _param_array(f"future_params[{k!r}]", v, lo=lo, lo_open=(k == "obs_var"))
        out[k] = v if isinstance(v, torch.Tensor) else _host_array(v)  # (a tensor keeps its graph)
    return out


def _params_at_forecast(model, future: dict, S: tuple, H: int) -> dict:
    """The four parameters over the forecast: per series (``[*S]``, or ``[H, *S]`` for a
    ``future_params`` ``obs_var``), from ``future`` where given, else the model's, refusing a
    model value given per step of the record (which says nothing of the forecast times)."""
    nd = len(S)
    params = {}
    for k, v in model.params().items():
        if k in future:
            v = future[k]
            try:
                fits = np.broadcast_shapes(v.shape, S) == S
            except ValueError:
                fits = False
            if not fits:
                if k != "obs_var" or v.ndim != nd + 1 or v.shape[0] not in (1, H):
                    per = (
                        f"or [H, *S] with H = {H} forecast times"
                        if k == "obs_var"
                        else "(one value over the whole forecast; only obs_var may vary by "
                        "forecast time)"
                    )
                    raise ValueError(
                        f"future_params[{k!r}]: expected a value per series, shape broadcasting "
                        f"to the series shape {S} {per}, got shape {v.shape}"
                    )
                try:
                    np.broadcast_shapes(v.shape[1:], S)
                except ValueError:
                    raise ValueError(
                        f"future_params[{k!r}]: expected shape [H, *S] = {(H, *S)}, got shape "
                        f"{v.shape}"
                    ) from None
            params[k] = v
            continue
        if not isinstance(v, torch.Tensor):  # (a tensor keeps its graph)
            v = _host_array(v)
        if v.ndim > nd and v.shape[0] != 1:
            raise ValueError(
                f"{k}: the model gives values per step of the record (shape {v.shape}), which do "
                f"not say what {k} is at the forecast times; give the values that hold there as "
                f"future_params={{{k!r}: ...}} (the record is filtered with its per-step values "
                "either way)"
            )
        params[k] = v.reshape(v.shape[1:]) if v.ndim > nd else v
    return params


def forecast_from_state(
    model: OUModel,
    time_axis: TimeAxis,
    last_mean,
    last_var,
    *,
    steps=None,
    at=None,
    coverage: float = 0.95,
    future_params=None,
) -> Forecast:
    """Forecast from the filtered ``N(last_mean, last_var)`` at the last time of ``time_axis``;
    ``future_params`` (:func:`check_future_params`): parameter values over the forecast in place
    of the model's (needed for those the model gives per step of the record)."""
    for name, v in (("at", at), ("coverage", coverage)):
        if isinstance(v, torch.Tensor) and v.requires_grad:
            raise TypeError(
                f"{name}: expected values without a gradient (a forecast is differentiable in "
                f"the parameters and the data, not in its {name}), got a tensor that requires "
                f"grad; pass {name}.detach()"
            )
    future = check_future_params(future_params)
    covs = check_coverage(coverage)
    if len(covs) != 1:
        raise ValueError(
            f"coverage: expected one level (a Forecast holds one band), got {coverage!r}; for "
            "several bands use to_dataset(forecast_steps=..., coverage=...)"
        )
    cov = covs[0]
    if (steps is None) == (at is None):
        raise ValueError(
            "steps, at: give exactly one (a number of steps or future timestamps), got "
            f"steps={steps!r}, at={at!r}"
        )
    labels = _future_labels(time_axis, steps, at, "at")
    pos = time_axis.position(labels, "at")
    if pos.ndim != 1:
        raise ValueError(f"at: expected a 1-D sequence of timestamps, got shape {pos.shape}")
    dt = pos - time_axis.t[-1]
    if (dt < 0).any():
        i = int(np.flatnonzero(dt < 0)[0])

        def text(x):  # (1.5, not np.float64(1.5); a datetime as its ISO text, a period's)
            if isinstance(x, np.datetime64):
                return time_axis.label_text(x)[0]
            return str(x) if is_cftime(x) else _plain(x)

        raise ValueError(
            "at: expected timestamps at or after the record's last time (the last of its "
            f"times, observed or not: {text(time_axis.labels[-1])}), got {text(labels[i])}"
        )
    state = (last_mean, last_var)
    nd = len(last_mean.shape)
    dt = dt.reshape((-1,) + (1,) * nd)
    params = _params_at_forecast(model, future, tuple(last_mean.shape), len(pos))
    labels = _labels_out(time_axis, labels)
    if any(isinstance(v, torch.Tensor) for v in (*state, *params.values())):
        mean, var, pvar, lo, hi = _forecast_torch(time_axis, state, params, dt, cov)
        return Forecast(labels, mean, var, pvar, lo, hi, cov)
    last_mean = _host_array(last_mean)
    last_var = _host_array(last_var)
    theta, sigma2, mu, obs_var = params.values()
    # in units of a power of two c per series (module docstring), mapped back at the end
    lanes = np.broadcast_shapes(last_mean.shape, last_var.shape, sigma2.shape, mu.shape)
    c = _forecast_unit(time_axis, lanes, (last_mean, last_var), params)
    # variances over c**2 as two divisions by c (c**2 overflows for c above 2**511: data of
    # scale 1e150 gave NaN variances and a band of width 0)
    inv = 1.0 / c
    decay, process_var = discretize_ou(theta, sigma2 * inv * inv, dt)
    with np.errstate(invalid="ignore"):
        # a decay of 0 forgets the state: no 0 * inf from a never-observed diffuse series
        kept = decay != 0
        mean = np.where(kept, decay * (last_mean * inv), 0.0)
        mean = mean + (mu * inv) * one_minus_decay(theta, dt, decay)
        var = np.where(kept, decay * decay * (last_var * inv * inv), 0.0) + process_var
    shape = np.broadcast_shapes(mean.shape, var.shape, obs_var.shape, (len(pos),) + (1,) * nd)
    mean, var = np.broadcast_to(mean, shape), np.broadcast_to(var, shape)
    pvar = var + obs_var * inv * inv
    lo, hi = interval(mean, pvar, cov)
    mean, var, pvar, lo, hi = mean * c, var * c * c, pvar * c * c, lo * c, hi * c
    return Forecast(labels, mean, var, pvar, lo, hi, cov)


def _forecast_unit(time_axis: TimeAxis, lanes: tuple, state, params: dict) -> np.ndarray:
    """The forecast's unit ``c [*lanes]`` (module docstring): from the filtered ``state =
    (last_mean, last_var)``, ``mu``, ``obs_var`` and ``sigma2`` over the record's median step."""
    pos_dt = time_axis.dt[time_axis.dt > 0]
    tau = float(np.median(pos_dt)) if pos_dt.size else 1.0
    scales = [state[1], params["obs_var"], _host_array(params["sigma2"]) * tau]
    return data_unit(lanes, [state[0], params["mu"]], scales)


def _labels_out(time_axis: TimeAxis, labels) -> np.ndarray:
    """The forecast times as a :class:`Forecast` holds them (numbers as float64; the periods
    they start, a ``PeriodIndex``, where the record's times are periods; a tz-aware
    ``DatetimeIndex`` in the record's timezone where its times carried one)."""
    if time_axis.period_freq is not None:
        return to_periods(labels, time_axis.period_freq)
    if time_axis.is_cftime:
        return np.asarray(labels, dtype=object)
    if time_axis.is_datetime:
        labels = _normalize_datetimes(np.asarray(labels))
        if time_axis.utc:  # given with a timezone: in it again (a tz-aware DatetimeIndex)
            try:
                return time_axis.zoned(labels)
            except ImportError:  # pragma: no cover - (polars times without pandas: UTC)
                return labels
        return labels
    return np.asarray(labels, dtype=np.float64)


def _forecast_torch(time_axis: TimeAxis, state, params: dict, dt: np.ndarray, cov: float):
    """``(mean, var, predictive_var, lower, upper)`` of :func:`forecast_from_state` as tensors
    with autograd, for a filtered ``state = (last_mean, last_var)`` or parameters of which some
    are tensors: the same closed form from the last state, ``mean = mu + decay (m - mu)``,
    ``var = decay**2 P + process_var`` with ``(decay, process_var) = discretize_ou(theta,
    sigma2, dt)`` (``theta = 0``: the random walk), in the units ``c`` of the numpy path.
    Computed in float64 and returned in the filtered state's dtype (float32 data: float32, as
    :func:`kalmanscan.filter` gives it) on the device of the first tensor among the state and
    the parameters."""
    tensors = [v for v in (*state, *params.values()) if isinstance(v, torch.Tensor)]
    device = tensors[0].device
    last_mean = state[0]
    out_dtype = (
        last_mean.dtype
        if isinstance(last_mean, torch.Tensor)
        else torch.from_numpy(np.zeros(0, np.asarray(last_mean).dtype)).dtype
    )
    if out_dtype not in (torch.float32, torch.float64):
        out_dtype = torch.float64

    def f64(v):  # (a tensor keeps its graph)
        return float64_on(v, device)

    last_mean, last_var = f64(state[0]), f64(state[1])
    theta, sigma2, mu, obs_var = (f64(v) for v in params.values())
    lanes = np.broadcast_shapes(
        tuple(last_mean.shape), tuple(last_var.shape), tuple(sigma2.shape), tuple(mu.shape)
    )
    # the unit is a power of two per series: a constant, so no gradient is lost through it
    c_np = _forecast_unit(time_axis, lanes, state, params)
    c = f64(c_np)
    inv = f64(1.0 / c_np)
    dt = f64(dt)
    decay, process_var = discretize_ou(theta, sigma2 * inv * inv, dt)
    # a decay of 0 forgets the state: the state is masked before the product, so that neither
    # the value nor the gradient meets 0 * inf (a never-observed diffuse series)
    kept = decay != 0
    m_kept = torch.where(kept, last_mean * inv, 0.0)
    p_kept = torch.where(kept, last_var * inv * inv, 0.0)
    mean = torch.where(kept, decay * m_kept, 0.0)
    mean = mean + (mu * inv) * one_minus_decay(theta, dt, decay)
    var = torch.where(kept, decay * decay * p_kept, 0.0) + process_var
    shape = np.broadcast_shapes(
        tuple(mean.shape),
        tuple(var.shape),
        tuple(obs_var.shape),
        (dt.shape[0],) + (1,) * len(lanes),
    )
    mean, var = mean.expand(shape), var.expand(shape)
    pvar = var + obs_var * inv * inv
    lo, hi = interval(mean, pvar, cov)
    out = (mean * c, var * c * c, pvar * c * c, lo * c, hi * c)
    return tuple(x.to(out_dtype) for x in out)
