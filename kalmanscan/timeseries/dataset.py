"""The OU model's results as an ``xarray.Dataset`` (needs xarray; imported only by the methods
and functions that return a Dataset, never by ``import kalmanscan``).

:func:`to_dataset` (``OUModel.to_dataset``, ``OUFit.to_dataset``) and :func:`filter_dataarray`
(the ``.kalman.filter`` accessor of :mod:`kalmanscan.xarray`) run one block function, the model's
own filter, smoother and forecast, through ``xarray.apply_ufunc`` with the time dimension as the
core dimension, and lay its results out as a Dataset; nothing else is computed here. With a
dask-chunked input it runs chunk-wise over the series dimensions (``dask="parallelized"``), so
many series scale out over cores or a dask cluster; the in-memory path runs the same block
function once.

Output variables (dims ``time`` plus the series dims): ``observed``, ``mean``, ``variance``,
``precision``, ``lower``/``upper`` (with a ``coverage`` dim), ``pred_mean``, ``pred_variance``,
``smoothed_mean``, ``smoothed_variance``, ``smoothed_lower``/``smoothed_upper``; ``loglik`` and the
model parameters over the series dims; ``forecast_*`` on a ``forecast_time`` dim. ``attrs`` record
the model, prior, time unit and likelihood convention.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from kalmanscan.timeseries.model import (
    PARAMS,
    OUModel,
    _normal_quantile,
    check_coverage,
    forecast_from_state,
    series_input,
)
from kalmanscan.timeseries.times import TimeAxis, _labels_array, as_time_axis, check_steps

MODEL_DESCRIPTION = (
    "Ornstein-Uhlenbeck level dx = -theta (x - mu) dt + sigma dW (sigma2 = sigma^2; "
    "theta = 0: random walk / local level), observed as z = x + e, e ~ N(0, obs_var); "
    "exact discretization between timestamps: a = exp(-theta dt), "
    "p = sigma2 (1 - exp(-2 theta dt)) / (2 theta), offset mu (1 - a)"
)
FIT_DESCRIPTION = (
    "maximum likelihood (kalmanscan.fit_ou, batched Newton on the exact diffuse likelihood)"
)
LOGLIK_CONVENTION = (
    "sum of one-step predictive log densities; "
    "steps with zero prior precision (diffuse) add nothing"
)


# --- the block function ---------------------------------------------------------------------------
def _block(
    z,
    theta,
    sigma2,
    mu,
    obs_var,
    *prior,
    time_axis: TimeAxis,
    smooth: bool,
    forecast_labels,
    backend: str,
):
    """Filter/smooth/forecast ``z [..., T]`` (time last, as apply_ufunc passes it)."""
    T = z.shape[-1]
    loop = z.shape[:-1]
    H = 0 if forecast_labels is None else len(forecast_labels)
    n_out = 4 + (2 if smooth else 0) + 1 + (3 if H else 0)
    if z.size == 0:  # dask may probe with empty blocks
        shapes = (
            [loop + (T,)] * (4 + (2 if smooth else 0)) + [loop] + [loop + (H,)] * (3 if H else 0)
        )
        return tuple(np.zeros(s) for s in shapes)[:n_out]
    prior_mean, prior_var = prior if prior else (None, None)
    model = OUModel(
        theta=theta,
        sigma2=sigma2,
        mu=mu,
        obs_var=obs_var,
        prior_mean=prior_mean,
        prior_var=prior_var,
    )
    zt = np.array(np.moveaxis(z, -1, 0), dtype=np.float64)
    res = model.filter_prepared(zt, time_axis, smooth=smooth, backend=backend)
    filt = res.filtered if smooth else res
    last = lambda a: np.broadcast_to(np.moveaxis(a, 0, -1), loop + a.shape[:1])  # noqa: E731
    out = [last(filt.mean), last(filt.var), last(filt.pred_mean), last(filt.pred_var)]
    if smooth:
        out += [last(res.mean), last(res.var)]
    out.append(np.broadcast_to(filt.loglik, loop))
    if H:
        fc = forecast_from_state(
            model, time_axis, filt.mean[-1], filt.var[-1], at=forecast_labels, coverage=0.5
        )
        out += [last(fc.mean), last(fc.var), last(fc.predictive_var)]
    return tuple(np.array(o) for o in out)


def _bounds(mean, var, coverage):
    q = xr.DataArray(
        [_normal_quantile(c) for c in coverage],
        dims="coverage",
        coords={"coverage": list(coverage)},
    )
    sd = np.sqrt(var)
    order = ("coverage",) + mean.dims
    return (mean - q * sd).transpose(*order), (mean + q * sd).transpose(*order)


def _param_vars(model, params: dict, da: xr.DataArray, time_dim: str) -> dict:
    """``{name: DataArray}`` of theta, sigma2, mu, obs_var (and prior_mean/prior_var when set)."""
    series_dims = [d for d in da.dims if d != time_dim]
    if model is not None and params:
        raise ValueError(
            f"model, {sorted(params)}: give either model= or individual parameters, not both"
        )
    from kalmanscan.timeseries.fit import OUFit

    if isinstance(model, OUFit):
        model = model.model
    if isinstance(model, xr.Dataset):
        missing = [p for p in PARAMS if p not in model]
        if missing:
            raise ValueError(
                f"model: expected a Dataset with variables {list(PARAMS)} (e.g. from "
                f".kalman.fit_ou()), missing {missing}"
            )
        return {p: model[p] for p in PARAMS}
    if model is None:
        unknown = set(params) - set(PARAMS) - {"prior_mean", "prior_var"}
        if unknown:
            raise TypeError(
                f"unexpected parameters {sorted(unknown)}; expected some of {list(PARAMS)}"
            )
        missing = [p for p in ("sigma2", "obs_var") if p not in params]
        if missing:
            raise ValueError(
                f"{', '.join(missing)}: required (or pass model=, e.g. the Dataset from "
                ".kalman.fit_ou())"
            )
        values = {"theta": 0.0, "mu": 0.0, **params}
    elif isinstance(model, OUModel):
        values = {p: getattr(model, p) for p in PARAMS}
        for p in ("prior_mean", "prior_var"):
            if getattr(model, p) is not None:
                values[p] = getattr(model, p)
    else:
        raise TypeError(
            f"model: expected an OUModel, OUFit or parameter Dataset, got {type(model).__name__}"
        )
    out = {}
    for k, v in values.items():
        if isinstance(v, xr.DataArray):
            out[k] = v
            continue
        arr = np.asarray(v, dtype=np.float64)
        if arr.ndim == 0:
            out[k] = xr.DataArray(arr)
        elif arr.ndim <= len(series_dims):
            dims = series_dims[len(series_dims) - arr.ndim :]
            try:
                out[k] = xr.DataArray(
                    np.broadcast_to(arr, tuple(da.sizes[d] for d in dims)), dims=dims
                )
            except ValueError as err:
                raise ValueError(
                    f"{k}: expected a scalar or an array over the series dims {series_dims}, got "
                    f"shape {arr.shape}"
                ) from err
        else:
            raise ValueError(
                f"{k}: expected a scalar or an array over the series dims {series_dims}, got shape "
                f"{arr.shape}"
            )
    return out


def _check_values(da: xr.DataArray, time_dim: str) -> None:
    """The same acceptance as ``kalmanscan.filter``: real numbers (NaN = missing), no strings,
    booleans, complex numbers or datetimes, and at least one time step."""
    kind = da.dtype.kind
    if kind not in "iuf" or (kind == "f" and da.dtype.itemsize > 8):
        raise TypeError(
            f"da: expected real numbers (NaN = missing), got a DataArray of dtype {da.dtype}"
        )
    if time_dim in da.dims and da.sizes[time_dim] == 0:
        raise ValueError(f"da: expected at least one step along {time_dim!r}, got 0")


def _time_axis(da: xr.DataArray, time_dim: str, time_unit) -> TimeAxis:
    if time_dim not in da.dims:
        raise ValueError(
            f"time_dim: expected one of the array's dims {list(da.dims)}, got {time_dim!r}"
        )
    _check_values(da, time_dim)
    times = da[time_dim].values if time_dim in da.coords else None
    return as_time_axis(times, da.sizes[time_dim], time_unit, name=f"coordinate {time_dim!r}")


def filter_dataarray(
    da: xr.DataArray,
    model=None,
    *,
    time_dim: str = "time",
    coverage=(0.5, 0.9),
    smooth: bool = True,
    forecast_steps=None,
    forecast_at=None,
    time_unit=None,
    backend: str = "auto",
    **params,
) -> xr.Dataset:
    """Filter (and smooth, and forecast) every series of ``da`` along ``time_dim``: a Dataset.

    ``model`` is an :class:`OUModel`, an :class:`OUFit`, a parameter Dataset from
    :func:`fit_dataarray`, or ``None`` with parameters as keywords (``sigma2=``, ``obs_var=``,
    optional ``theta=``, ``mu=``; scalars, arrays over the series dims, or DataArrays).
    Dask-chunked input stays lazy and runs chunk-wise over the series dims.

    >>> import numpy as np, xarray as xr
    >>> z = np.array([[1.0, 2.0], [np.nan, 2.5], [1.5, 3.0]])
    >>> da = xr.DataArray(z, dims=("time", "station"))
    >>> ds = filter_dataarray(da, sigma2=0.1, obs_var=0.2)
    >>> ds["mean"].dims, ds["lower"].sizes["coverage"]
    (('time', 'station'), 2)
    """
    if not isinstance(da, xr.DataArray):
        raise TypeError(f"da: expected an xarray.DataArray, got {type(da).__name__}")
    coverage = check_coverage(coverage)
    from kalmanscan.timeseries.fit import OUFit

    if isinstance(model, OUFit):
        model = model.model
    if time_unit is None and isinstance(model, OUModel):
        time_unit = model.time_unit
    if time_unit is None and isinstance(model, xr.Dataset) and "time_unit_ns" in model.attrs:
        time_unit = np.timedelta64(int(model.attrs["time_unit_ns"]), "ns")
    ax = _time_axis(da, time_dim, time_unit)
    pv = _param_vars(model, params, da, time_dim)
    fc_labels = None
    if forecast_steps is not None or forecast_at is not None:
        if forecast_steps is not None and forecast_at is not None:
            raise ValueError("forecast_steps, forecast_at: give at most one")
        if forecast_steps is not None:
            fc_labels = ax.future(forecast_steps)
        else:
            fc_labels = _labels_array(forecast_at, "forecast_at")
            if fc_labels.ndim != 1 or fc_labels.size == 0:
                raise ValueError(
                    "forecast_at: expected a non-empty 1-D sequence of timestamps, got shape "
                    f"{fc_labels.shape}"
                )
            check_steps(fc_labels.size, "forecast_at (number of forecast times)")
        ax.position(fc_labels, "forecast_at")
    series_dims = [d for d in da.dims if d != time_dim]
    z = da.astype(np.float64)
    if z.chunks is not None:
        z = z.chunk({time_dim: -1})
    prior = [pv[k] for k in ("prior_mean", "prior_var") if k in pv]
    if len(prior) == 1:
        raise ValueError("prior_mean, prior_var: give both or neither")
    args = [z] + [pv[p] for p in PARAMS] + prior
    H = 0 if fc_labels is None else len(fc_labels)
    ocd = [[time_dim]] * (4 + (2 if smooth else 0)) + [[]] + [["forecast_time"]] * (3 if H else 0)
    outs = xr.apply_ufunc(
        _block,
        *args,
        input_core_dims=[[time_dim]] + [[]] * (len(args) - 1),
        output_core_dims=ocd,
        kwargs=dict(time_axis=ax, smooth=smooth, forecast_labels=fc_labels, backend=backend),
        dask="parallelized",
        output_dtypes=[np.float64] * len(ocd),
        dask_gufunc_kwargs={"output_sizes": {"forecast_time": H}} if H else None,
        keep_attrs=False,
    )
    order = [time_dim] + series_dims
    tr = lambda x: x.transpose(*order)  # noqa: E731
    mean, var, pmean, pvar = (tr(o) for o in outs[:4])
    ds = xr.Dataset(coords={k: v for k, v in da.coords.items()})
    ds["observed"] = da.astype(np.float64).transpose(*order)
    ds["mean"], ds["variance"] = mean, var
    ds["precision"] = 1.0 / var
    ds["lower"], ds["upper"] = _bounds(mean, var, coverage)
    ds["pred_mean"], ds["pred_variance"] = pmean, pvar
    k = 4
    if smooth:
        smean, svar = tr(outs[4]), tr(outs[5])
        ds["smoothed_mean"], ds["smoothed_variance"] = smean, svar
        ds["smoothed_lower"], ds["smoothed_upper"] = _bounds(smean, svar, coverage)
        k = 6
    ds["loglik"] = outs[k].transpose(*series_dims)
    if H:
        fo = ["forecast_time"] + series_dims
        fmean, fvar, fpvar = (o.transpose(*fo) for o in outs[k + 1 : k + 4])
        ds = ds.assign_coords(forecast_time=("forecast_time", fc_labels))
        ds["forecast_mean"], ds["forecast_variance"] = fmean, fvar
        ds["forecast_predictive_variance"] = fpvar
        ds["forecast_lower"], ds["forecast_upper"] = _bounds(fmean, fpvar, coverage)
    for p in PARAMS:
        ds[p] = pv[p]
    _describe(ds, time_dim, ax, coverage, model, pv)
    return ds


_VAR_ATTRS = {
    "observed": "observations (NaN: missing)",
    "mean": "filtered mean of the level given data up to each time",
    "variance": "filtered variance of the level",
    "precision": "filtered precision of the level (1 / variance; 0 while nothing is known)",
    "lower": "lower bound of the central interval of the filtered level at each coverage",
    "upper": "upper bound of the central interval of the filtered level at each coverage",
    "pred_mean": "one-step predicted mean of the level (before the observation at that time)",
    "pred_variance": "one-step predicted variance of the level",
    "smoothed_mean": "smoothed mean of the level given all data",
    "smoothed_variance": "smoothed variance of the level",
    "smoothed_lower": "lower bound of the central interval of the smoothed level at each coverage",
    "smoothed_upper": "upper bound of the central interval of the smoothed level at each coverage",
    "loglik": "log-likelihood of each series (" + LOGLIK_CONVENTION + ")",
    "forecast_mean": "forecast mean of the level (and of a new observation)",
    "forecast_variance": "forecast variance of the level",
    "forecast_predictive_variance": "variance of a new observation (level variance + obs_var)",
    "forecast_lower": "lower bound of the predictive interval of a new observation",
    "forecast_upper": "upper bound of the predictive interval of a new observation",
    "theta": "mean-reversion rate per time unit",
    "sigma2": "diffusion variance per time unit",
    "mu": "long-run mean",
    "obs_var": "observation-noise variance",
}


def _describe(ds, time_dim, ax, coverage, model, pv):
    for k, v in _VAR_ATTRS.items():
        if k in ds:
            ds[k].attrs["description"] = v
    custom_prior = "prior_mean" in pv
    ds.attrs.update(
        {
            "model": MODEL_DESCRIPTION,
            "prior": (
                "user-given prior_mean / prior_var"
                if custom_prior
                else "stationary N(mu, sigma2 / (2 theta)) where theta > 0; diffuse where theta = 0"
            ),
            "loglik_convention": LOGLIK_CONVENTION,
            "time_dim": time_dim,
            "time_unit": ax.unit_name,
            "coverage": list(coverage),
            "produced_by": "kalmanscan",
        }
    )
    for p in PARAMS:
        if pv[p].ndim == 0 and not _is_lazy(pv[p]):
            ds.attrs[p] = float(pv[p].values)


def _is_lazy(x):
    return getattr(x, "chunks", None) is not None


def to_dataset(
    model: OUModel,
    z,
    times=None,
    *,
    coverage=(0.5, 0.9),
    smooth: bool = True,
    forecast_steps=None,
    forecast_at=None,
    series_dims=None,
    series_coords=None,
    name=None,
    fit=None,
    backend: str = "auto",
) -> xr.Dataset:
    """Results of ``model`` on numpy/pandas data as a Dataset (dims ``time`` + series dims).

    Args:
        model: an :class:`OUModel`. z: ``[T, *S]`` time first (pandas: index = times).
        times: timestamps or a :class:`TimeAxis`. coverage: interval coverages.
        series_dims: names of the series dims (default ``("series",)`` for 2-D data).
        series_coords: ``{dim: labels}``. fit: an :class:`OUFit` to record (standard errors, etc.).

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = to_dataset(OUModel(sigma2=1469.1, obs_var=15099.0), np.array([1120.0, 1160.0, 963.0]),
    ...                 np.array([1871, 1872, 1873]), forecast_steps=2)
    >>> ds["forecast_time"].values.tolist()
    [1874.0, 1875.0]
    """
    if isinstance(times, TimeAxis):
        ax, zt, labels = times, np.asarray(z, dtype=np.float64), None
    else:
        zt, times, labels = series_input(z, times, 0)
        ax = as_time_axis(times, zt.shape[0], model.time_unit)
    nd = zt.ndim - 1
    if series_dims is None:
        series_dims = (
            () if nd == 0 else ("series",) if nd == 1 else tuple(f"series_{i}" for i in range(nd))
        )
    series_dims = tuple(series_dims)
    if len(series_dims) != nd:
        raise ValueError(
            f"series_dims: expected {nd} names for data of shape {zt.shape}, got {series_dims}"
        )
    coords = {"time": ax.labels}
    if series_coords is None and labels is not None and nd == 1:
        series_coords = {series_dims[0]: labels}
    for d, v in (series_coords or {}).items():
        if d not in series_dims:
            raise ValueError(f"series_coords: expected keys among {series_dims}, got {d!r}")
        coords[d] = list(v)
    da = xr.DataArray(zt, dims=("time",) + series_dims, coords=coords, name=name)
    params = {p: getattr(model, p) for p in PARAMS}
    if model.prior_mean is not None or model.prior_var is not None:
        pm, pvv = model.prior()
        params.update(prior_mean=pm, prior_var=pvv)
    unit = model.time_unit if ax.is_datetime else None
    if isinstance(times, TimeAxis) and ax.is_datetime:
        unit = np.timedelta64(ax.unit, "ns")
    ds = filter_dataarray(
        da,
        None,
        time_dim="time",
        coverage=coverage,
        smooth=smooth,
        forecast_steps=forecast_steps,
        forecast_at=forecast_at,
        time_unit=unit,
        backend=backend,
        **params,
    )
    if ax.is_datetime:
        ds.attrs["time_unit"] = ax.unit_name
    if name:
        ds.attrs["name"] = name
    if fit is not None:
        _record_fit(ds, fit, series_dims)
    return ds


def _record_fit(ds, fit, series_dims):
    ds.attrs["fitted"] = FIT_DESCRIPTION
    ds.attrs["fixed"] = (
        ", ".join(
            f"{k}={np.ravel(v)[0] if np.size(v) == 1 else 'array'}" for k, v in fit.fixed.items()
        )
        or "none"
    )
    ds.attrs["joint"] = int(fit.joint)
    ds.attrs["n_iter"] = int(fit.n_iter)
    for p in PARAMS:
        se = np.asarray(fit.stderr[p], dtype=np.float64)
        ds[p + "_se"] = xr.DataArray(se, dims=series_dims if se.ndim else ())
        ds[p + "_se"].attrs["description"] = (
            f"standard error of {p} (inverse Hessian; NaN if fixed or undefined)"
        )
    conv = np.asarray(fit.converged)
    ds["converged"] = xr.DataArray(conv.astype(np.int8), dims=series_dims if conv.ndim else ())
    ds["converged"].attrs["description"] = "1 if the optimizer reached the gradient tolerance"
