"""The OU model's results as an ``xarray.Dataset``: a view, nothing is computed here (needs
xarray; imported only by the methods and functions that return a Dataset, never by
``import kalmanscan``).

:func:`results_dataset` lays out results already computed by its caller: ``OUModel.to_dataset``
(and ``OUFit.to_dataset``, :func:`kalmanscan.xarray.to_dataset`) runs the model's filter,
smoother and forecast on numpy data in memory; :func:`kalmanscan.xarray.filter_dataarray` (the
``.kalman.filter`` accessor) runs them through ``xarray.apply_ufunc``, chunk-wise over the
series dimensions for dask-chunked input, and the Dataset then stays lazy. This module imports
neither the model nor the accessor.

Output variables (dims ``time`` plus the series dims): ``observed``, ``mean``, ``variance``,
``precision``, ``lower``/``upper`` (with a ``coverage`` dim), ``pred_mean``, ``pred_variance``,
``smoothed_mean``, ``smoothed_variance``, ``smoothed_lower``/``smoothed_upper``; ``loglik`` and the
model parameters over the series dims; ``forecast_*`` on a ``forecast_time`` dim. ``attrs`` record
the model, prior, time unit and likelihood convention.

Periods (data indexed by pandas periods, a ``PeriodIndex``): an xarray coordinate of periods can be
neither written to netCDF nor interpolated (nor read through ``.dt``), so ``time`` and
``forecast_time`` hold the times the periods start (``datetime64``, as the model reads them) and say
their frequency in the attr ``period_freq`` (pandas' ``freqstr``: ``"Q-DEC"``, ``"M"``,
``"W-SUN"``). It is lossless: ``ds.indexes["time"].to_period(ds["time"].attrs["period_freq"])``
gives the periods back (a start lies inside its period), the attr survives netCDF, and the
``.kalman`` accessor reads a coordinate with it as those periods again.

Timezones (data whose times carried a timezone or UTC offsets): xarray and netCDF cannot hold
tz-aware times, so ``time`` and ``forecast_time`` hold them in UTC (``datetime64``) with the
attr ``time_zone = "UTC"``, and, where they were given in one zone, the attr
``local_time_zone`` naming it (an IANA name such as ``"Europe/Paris"``, or a fixed offset such
as ``"UTC+05:00"``). It is lossless:
``ds.indexes["time"].tz_localize("UTC").tz_convert(ds["time"].attrs["local_time_zone"])``
gives the times in their zone back, the attrs survive netCDF, and the ``.kalman`` accessor
reads such a coordinate as those zoned times again
(:mod:`~kalmanscan.timeseries.time_zones`).

Units (:func:`variable_units`): where the data carry a ``units`` attr, the outputs in the data's
units (means, interval bounds, ``mu``) carry it, variances (``obs_var`` too) its square,
``precision`` its inverse square, ``sigma2`` its square per model time unit and ``theta`` the
inverse time unit; a parameter's ``*_se`` its parameter's. Written in UDUNITS-2 syntax, which CF
requires and which reads ``^`` as a power: ``K`` -> ``K^2``, ``K^-2``, ``K^2 d^-1``, ``d^-1``; a
compound unit in parentheses, ``(m s-1)^2``. Nothing is written that the data or the time axis do
not give: without data units only ``theta`` has units, without a known time unit (numeric times
without ``units``) neither ``theta`` nor ``sigma2`` has.

>>> import numpy as np
>>> z = np.array([[1.0, 2.0], [np.nan, 2.5]])
>>> da = observed_array(z, np.array([0.0, 1.0]))
>>> results = {"mean": z, "variance": np.ones((2, 2)), "pred_mean": z,
...            "pred_variance": np.ones((2, 2)), "loglik": np.zeros(2)}
>>> ds = results_dataset(da, results, {"theta": 0.0, "sigma2": 1.0, "mu": 0.0, "obs_var": 1.0})
>>> ds["lower"].dims, ds.attrs["sigma2"]
(('coverage', 'time', 'series'), 1.0)
"""

from __future__ import annotations

import re
import sys

import numpy as np
import xarray as xr

from kalmanscan.core._args import (
    _default_labels,
    _labels_text,
    as_real_numpy,
    labels_hold,
    labels_index,
    match_dims,
)
from kalmanscan.timeseries.coverage import normal_quantile
from kalmanscan.timeseries.time_calendar import parse_time_unit
from kalmanscan.timeseries.time_zones import coord_attrs

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


# The result variables a caller hands to results_dataset, in the Dataset's order: over time
# (time first for numpy arrays), over the series dims, and over forecast_time (first).
TIME_VARS = ("mean", "variance", "pred_mean", "pred_variance", "smoothed_mean", "smoothed_variance")
FORECAST_VARS = ("forecast_mean", "forecast_variance", "forecast_predictive_variance")


def result_vars(filtered, smoothed=None, forecast=None) -> dict:
    """The result variables of a ``FilterResult``, ``SmoothResult`` and ``Forecast``, time first.

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> list(result_vars(OUModel(sigma2=1.0, obs_var=1.0).filter(np.zeros(3))))
    ['mean', 'variance', 'pred_mean', 'pred_variance', 'loglik']
    """
    out = {
        "mean": filtered.mean,
        "variance": filtered.var,
        "pred_mean": filtered.pred_mean,
        "pred_variance": filtered.pred_var,
    }
    if smoothed is not None:
        out["smoothed_mean"], out["smoothed_variance"] = smoothed.mean, smoothed.var
    out["loglik"] = filtered.loglik
    if forecast is not None:
        out["forecast_mean"], out["forecast_variance"] = forecast.mean, forecast.var
        out["forecast_predictive_variance"] = forecast.predictive_var
    return out


def observed_array(
    z, labels, *, series_dims=None, series_coords=None, series_labels=None, name=None
) -> xr.DataArray:
    """Time-first data ``z [T, *S]`` at timestamps ``labels [T]`` as a DataArray over
    ``("time", *series_dims)`` (default ``("series",)`` for 2-D data, ``series_0, ...`` beyond).

    ``series_coords`` is ``{dim: labels}``; ``series_labels`` (e.g. a DataFrame's columns) label
    a single series dim when ``series_coords`` is not given.
    """
    nd = z.ndim - 1
    if series_dims is None:
        series_dims = (
            () if nd == 0 else ("series",) if nd == 1 else tuple(f"series_{i}" for i in range(nd))
        )
    series_dims = tuple(series_dims)
    if len(series_dims) != nd:
        raise ValueError(
            f"series_dims: expected {nd} names for data of shape {z.shape}, got {series_dims}"
        )
    coords = {"time": labels}
    if series_coords is None and series_labels is not None and nd == 1:
        series_coords = {series_dims[0]: series_labels}
    multi = []
    for d, v in (series_coords or {}).items():
        if d not in series_dims:
            raise ValueError(f"series_coords: expected keys among {series_dims}, got {d!r}")
        index = labels_index(v, sys.modules["pandas"])  # (xarray imports pandas)
        size = z.shape[1 + series_dims.index(d)]
        if len(index) != size:
            raise ValueError(
                f"series_coords[{d!r}]: expected {size} labels (the data's size along {d!r}), "
                f"got {len(index)}"
            )
        if index.nlevels > 1:  # tuples (a DataFrame's MultiIndex columns): a MultiIndex again
            multi.append(xr.Coordinates.from_pandas_multiindex(index, d))
        else:
            coords[d] = list(v)
    da = xr.DataArray(z, dims=("time",) + series_dims, coords=coords, name=name)
    for c in multi:
        da = da.assign_coords(c)
    return da


def series_param(
    name: str, value, da: xr.DataArray, time_dim: str = "time", *, per_step: bool = False
) -> xr.DataArray:
    """A parameter (scalar, array over the trailing series dims of ``da``, or DataArray) as a
    DataArray over the series dims. Read as ``kalmanscan.filter`` reads one
    (:func:`kalmanscan.core._args.as_real_numpy`): masked values, text, booleans and complex
    numbers are refused, naming ``name``. ``per_step``: an array time first over ``time_dim``
    and the series dims (``[T, *S]``, or broadcasting to it: ``[T]`` for one series, ``[T, 1]``)
    is taken too, as values per step (``OUModel``'s), over ``(time_dim, *series dims)``."""
    value = _pandas_as_dataarray(name, value, da, time_dim)
    if isinstance(value, xr.DataArray):
        kind = value.dtype.kind
        if kind not in "iuf" or (kind == "f" and value.dtype.itemsize > 8):
            raise TypeError(
                f"{name}: expected a real number or array of real numbers, got a DataArray of "
                f"dtype {value.dtype}"
            )
        return match_series(name, value, da, time_dim)
    series_dims = [d for d in da.dims if d != time_dim]
    arr = as_real_numpy(name, value, missing_ok=False).astype(np.float64, copy=False)
    if arr.ndim == 0:
        return xr.DataArray(arr)
    sizes = tuple(da.sizes[d] for d in series_dims)
    if arr.ndim <= len(series_dims):
        dims = series_dims[len(series_dims) - arr.ndim :]
        try:
            return xr.DataArray(np.broadcast_to(arr, tuple(da.sizes[d] for d in dims)), dims=dims)
        except ValueError:
            pass
    full = (da.sizes[time_dim],) + sizes
    if per_step and arr.ndim == len(full) and arr.shape[0] == full[0]:
        try:
            return xr.DataArray(np.broadcast_to(arr, full), dims=[time_dim, *series_dims])
        except ValueError:
            pass
    if series_dims:
        expected = f"a scalar or an array over the series dims {series_dims}"
    else:
        expected = "a scalar (the data are one series, without series dims)"
    if per_step:
        expected += f", or values per step{' and series' if series_dims else ''} (shape {full})"
    raise ValueError(f"{name}: expected {expected}, got shape {arr.shape}")


def _pandas_as_dataarray(name: str, value, da: xr.DataArray, time_dim: str):
    """A pandas ``Series`` as a DataArray over the dim of ``da`` its index labels (its index's
    name, else the one dim whose labels it holds), so it is matched by label; other values as
    given. The default labels ``0, 1, ...`` label a series dim whose coordinates are other labels
    that they hold; otherwise (no such dim) they name nothing and the Series is used by
    position (over the trailing series dim); a Series that fits both ways is refused."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(value, pd.Series):
        return value
    idx = value.index
    dims = [d for d in da.dims if d in da.indexes]
    if _default_labels(idx, pd) and idx.name not in dims:
        series = [d for d in da.dims if d != time_dim]
        hits = [
            d
            for d in series
            if d in da.indexes
            and not _default_labels(da.indexes[d], pd)
            and labels_hold(idx, da.indexes[d])
        ]
        last = series[-1] if series else None
        positional = (
            last is not None
            and last not in hits
            and da.sizes[last] == len(idx)
            and (last not in da.indexes or _default_labels(da.indexes[last], pd))
        )
        if not hits:
            return value  # the default labels name none of the data's: used by position
        if len(hits) == 1 and positional:
            raise ValueError(
                f"{name}: expected a Series whose index fits one of the data's dims, got the "
                f"default index {_labels_text(idx)}, which holds the labels of {hits[0]!r} and "
                f"is {len(idx)} values by position along {last!r}; pass {name}.to_numpy() to "
                "use the values by position, or label the Series with the coordinates"
            )
    elif idx.name in dims:
        hits = [idx.name]
    else:
        hits = [d for d in dims if labels_hold(idx, da.indexes[d])]
    if len(hits) == 1:
        values = value.to_numpy(dtype=np.float64, na_value=np.nan)
        if isinstance(idx, pd.MultiIndex):
            coords = xr.Coordinates.from_pandas_multiindex(idx, hits[0])
        else:
            coords = {hits[0]: idx}
        return xr.DataArray(values, dims=[hits[0]], coords=coords)
    raise ValueError(
        f"{name}: expected a Series whose index holds the labels of one of the data's dims "
        f"{tuple(dims)} (or is named after it), got index {list(idx[:5])}"
        + (f", which holds the labels of each of {tuple(hits)}: name the index" if hits else "")
    )


def match_series(name: str, v: xr.DataArray, da: xr.DataArray, time_dim: str = "time"):
    """A per-series value given as a DataArray, matched to the series of ``da`` by label (in the
    data's order; labels the data lacks are dropped; every series of the data needs a value), or
    by position along a dim without labels (:func:`kalmanscan.core._args.match_dims`); its other
    coordinates dropped."""
    v = match_dims(name, v, da, [d for d in da.dims if d != time_dim], "series dims")
    return v.reset_coords(drop=True)  # (a MultiIndex's levels stay with their index)


def put(ds: xr.Dataset, name: str, v) -> None:
    """``ds[name] = v``, ``v``'s coordinates that ``ds`` holds already left out (the same
    labels: checked), so that a MultiIndex's levels are not dropped one by one (deprecated by
    xarray)."""
    if isinstance(v, xr.DataArray):
        for d in v.dims:
            if d in v.indexes and d in ds.indexes and not v.indexes[d].equals(ds.indexes[d]):
                raise ValueError(f"{name}: expected the labels of {d!r} of the Dataset")
        v = v.drop_vars([c for c in v.coords if c in ds.coords])
    ds[name] = v


def _laid_out(x, dims, sizes) -> xr.DataArray:
    """A result as a DataArray over ``dims``: a DataArray transposed, an array (in ``dims``
    order) broadcast to ``sizes``."""
    if isinstance(x, xr.DataArray):  # (its values only: the Dataset holds the coordinates, a
        return xr.DataArray(x.transpose(*dims).variable)  # MultiIndex's levels with its index)
    return xr.DataArray(np.array(np.broadcast_to(np.asarray(x), tuple(sizes))), dims=dims)


def _bounds(mean, var, coverage):
    q = xr.DataArray(
        [normal_quantile(c) for c in coverage],
        dims="coverage",
        coords={"coverage": list(coverage)},
    )
    sd = np.sqrt(var)
    order = ("coverage",) + mean.dims
    return (mean - q * sd).transpose(*order), (mean + q * sd).transpose(*order)


def results_dataset(
    observed: xr.DataArray,
    results,
    params,
    *,
    coverage=(0.5, 0.9),
    time_dim: str = "time",
    time_unit: str = "1",
    forecast_time=None,
    custom_prior: bool = False,
    time_units: str | None = None,
    period_freq: str | None = None,
    utc: bool = False,
    tz=None,
) -> xr.Dataset:
    """The Dataset of computed results (module docstring lists its variables).

    Args:
        observed: the data, a DataArray with ``time_dim`` (its coords become the Dataset's).
        results: ``{name: values}`` for the names of :data:`TIME_VARS` (``smoothed_*`` optional),
            ``loglik`` and optionally :data:`FORECAST_VARS`: DataArrays (any dim order, lazy
            ones stay lazy) or arrays ordered ``(time_dim, *series dims)``, ``(*series dims)``
            and ``("forecast_time", *series dims)`` (see :func:`result_vars`).
        params: ``{name: value}`` of theta, sigma2, mu, obs_var (see :func:`series_param`;
            values per step ``[T, *S]`` lie over ``(time_dim, *series dims)``).
        coverage: coverages of the intervals (checked tuple). time_unit: the unit's name.
        forecast_time: the forecast timestamps (with the ``forecast_*`` results).
        custom_prior: the prior was the user's (recorded in ``attrs["prior"]``).
        time_units: the model time unit in UDUNITS-2 syntax (e.g. ``"d"``, from a numeric time
            coordinate's ``units``); default: ``time_unit``'s duration, none for ``"1"``. With
            ``observed.attrs["units"]`` they give the variables' ``units`` (:func:`variable_units`).
        period_freq: the frequency of the pandas periods whose starts the time coordinates
            hold (``TimeAxis.period_freq``), recorded in their attr ``period_freq`` (module
            docstring).
        utc, tz: the time coordinates hold UTC times converted from times given with a
            timezone or UTC offsets (``TimeAxis.utc``), and the one zone they were given in
            (``TimeAxis.tz``), recorded in the attrs ``time_zone = "UTC"`` and
            ``local_time_zone`` (module docstring).
    """
    series_dims = [d for d in observed.dims if d != time_dim]
    sizes = [observed.sizes[d] for d in series_dims]
    over_time = lambda k: _laid_out(  # noqa: E731
        results[k], [time_dim] + series_dims, [observed.sizes[time_dim]] + sizes
    )
    ds = xr.Dataset(coords=observed.coords)  # (a MultiIndex coordinate kept whole)
    # (its variable: the coordinates are the Dataset's already, a MultiIndex's levels included)
    ds["observed"] = observed.astype(np.float64).transpose(time_dim, *series_dims).variable
    mean, var = over_time("mean"), over_time("variance")
    ds["mean"], ds["variance"] = mean, var
    ds["precision"] = 1.0 / var
    ds["lower"], ds["upper"] = _bounds(mean, var, coverage)
    ds["pred_mean"], ds["pred_variance"] = over_time("pred_mean"), over_time("pred_variance")
    if "smoothed_mean" in results:
        smean, svar = over_time("smoothed_mean"), over_time("smoothed_variance")
        ds["smoothed_mean"], ds["smoothed_variance"] = smean, svar
        ds["smoothed_lower"], ds["smoothed_upper"] = _bounds(smean, svar, coverage)
    ds["loglik"] = _laid_out(results["loglik"], series_dims, sizes)
    if forecast_time is not None:
        fo = ["forecast_time"] + series_dims
        fsizes = [len(forecast_time)] + sizes
        fmean, fvar, fpvar = (_laid_out(results[k], fo, fsizes) for k in FORECAST_VARS)
        ds = ds.assign_coords(forecast_time=("forecast_time", forecast_time))
        ds["forecast_mean"], ds["forecast_variance"] = fmean, fvar
        ds["forecast_predictive_variance"] = fpvar
        ds["forecast_lower"], ds["forecast_upper"] = _bounds(fmean, fpvar, coverage)
    # (parameters per step, which OUModel takes: over time_dim and the series dims)
    pv = {p: series_param(p, v, observed, time_dim, per_step=True) for p, v in params.items()}
    for p, v in pv.items():
        put(ds, p, v)
        ds[p].attrs = {}  # (a fit's Dataset's attrs: its units are set below, from these data)
    _describe(ds, time_dim, time_unit, coverage, custom_prior, pv)
    for coord in (time_dim, "forecast_time"):
        if coord in ds.coords and ds[coord].dtype.kind == "M":
            ds[coord].attrs.update(coord_attrs(utc, tz, period_freq))
    if time_units is None:
        time_units = duration_units(time_unit)
    add_units(ds, data_units(observed), time_units)
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


def _describe(ds, time_dim, time_unit, coverage, custom_prior, pv):
    for k, v in _VAR_ATTRS.items():
        if k in ds:
            ds[k].attrs["description"] = v
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
            "time_unit": time_unit,
            "coverage": list(coverage),
            "produced_by": "kalmanscan",
        }
    )
    for p, v in pv.items():
        if v.ndim == 0 and not _is_lazy(v):
            ds.attrs[p] = float(v.values)


# variables in the data's units, in their square, and in their inverse square
_SAME_UNITS = (
    "observed", "mean", "lower", "upper", "pred_mean", "smoothed_mean", "smoothed_lower",
    "smoothed_upper", "forecast_mean", "forecast_lower", "forecast_upper", "mu",
)  # fmt: skip
_SQUARED_UNITS = (
    "variance", "pred_variance", "smoothed_variance", "forecast_variance",
    "forecast_predictive_variance", "obs_var",
)  # fmt: skip
_INVERSE_SQUARED_UNITS = ("precision",)
# a unit written without parentheses before "^": one name (K, degC, m, hPa, kelvin, percent)
_ONE_NAME = re.compile(r"[A-Za-z_]+")
# UDUNITS-2 symbols of the durations a datetime time unit is written in, largest first
_DURATIONS = (("d", 86400 * 10**9), ("h", 3600 * 10**9), ("min", 60 * 10**9), ("s", 10**9),
              ("ms", 10**6), ("us", 10**3), ("ns", 1))  # fmt: skip


def data_units(da) -> str | None:
    """The ``units`` attr of ``da`` (a DataArray, or an attrs dict): a non-empty string, else
    ``None`` (no units known)."""
    attrs = da if isinstance(da, dict) else da.attrs
    units = attrs.get("units")
    return units.strip() if isinstance(units, str) and units.strip() else None


def unit_power(units: str, k: int) -> str:
    """``units`` to the integer power ``k`` in UDUNITS-2 syntax; the dimensionless ``"1"`` stays.

    >>> unit_power("K", 2), unit_power("K", -2), unit_power("m s-1", 2), unit_power("1", -2)
    ('K^2', 'K^-2', '(m s-1)^2', '1')
    """
    if units == "1" or k == 1:
        return units
    return f"{units if _ONE_NAME.fullmatch(units) else f'({units})'}^{k}"


def duration_units(time_unit) -> str | None:
    """A model time unit (its name such as ``"1D"`` or ``"12h"``, or a ``timedelta64``) in
    UDUNITS-2 syntax: ``"d"``, ``"12 h"``, ``"365.25 d"`` (the largest unit that writes it with
    at most 6 decimals); ``None`` for ``"1"`` (numeric times: the unit is not known).

    >>> duration_units("1D"), duration_units("12h"), duration_units("365.25D"), duration_units("1")
    ('d', '12 h', '365.25 d', None)
    """
    if time_unit is None or (isinstance(time_unit, str) and time_unit == "1"):
        return None
    try:
        td, _ = parse_time_unit(time_unit)
    except (TypeError, ValueError):
        return None
    ns = int(td / np.timedelta64(1, "ns"))
    for symbol, size in _DURATIONS:
        if ns >= size and (ns * 10**6) % size == 0:
            q = ns * 10**6 // size
            count = f"{q // 10**6}.{q % 10**6:06d}".rstrip("0").rstrip(".")
            return symbol if count == "1" else f"{count} {symbol}"
    return f"{ns} ns"


def variable_units(units: str | None, time_units: str | None) -> dict:
    """``{variable: units}`` of the results and fit variables from the data's ``units`` and the
    model time unit (each ``None`` where not known; see the module docstring).

    >>> u = variable_units("K", "d")
    >>> u["mean"], u["variance"], u["precision"], u["sigma2"], u["theta"], u["sigma2_se"]
    ('K', 'K^2', 'K^-2', 'K^2 d^-1', 'd^-1', 'K^2 d^-1')
    >>> variable_units(None, "d"), variable_units("K", None)["obs_var"]
    ({'theta': 'd^-1', 'theta_se': 'd^-1'}, 'K^2')
    """
    out = {}
    if units is not None:
        out.update({k: units for k in _SAME_UNITS})
        out.update({k: unit_power(units, 2) for k in _SQUARED_UNITS})
        out.update({k: unit_power(units, -2) for k in _INVERSE_SQUARED_UNITS})
    if time_units is not None:
        per_time = unit_power(time_units, -1)
        out["theta"] = per_time
        if units is not None:
            out["sigma2"] = per_time if units == "1" else f"{unit_power(units, 2)} {per_time}"
    for p in ("theta", "sigma2", "mu", "obs_var"):
        if p in out:
            out[p + "_se"] = out[p]
    return out


_UNIT_VARS = tuple(variable_units("K", "d"))  # the variables whose units are set here


def add_units(ds: xr.Dataset, units: str | None, time_units: str | None) -> xr.Dataset:
    """Set the ``units`` attr of the variables of ``ds`` from :func:`variable_units`; a unit that
    is not known is removed (e.g. one a fit's Dataset gave a parameter); other variables keep
    theirs.

    >>> ds = xr.Dataset({"mean": ("time", [1.0]), "theta": 0.1, "loglik": 0.0})
    >>> ds = add_units(ds, "K", None)
    >>> ds["mean"].attrs, ds["theta"].attrs, ds["loglik"].attrs
    ({'units': 'K'}, {}, {})
    """
    known = variable_units(units, time_units)
    for k in _UNIT_VARS:
        if k not in ds.variables:
            continue
        if k in known:
            ds[k].attrs["units"] = known[k]
        elif k != "observed":  # (the data's own attrs, kept whatever their units attr holds)
            ds[k].attrs.pop("units", None)
    return ds


def _is_lazy(x):
    return getattr(x, "chunks", None) is not None


def record_fit(ds: xr.Dataset, fit, series_dims) -> xr.Dataset:
    """Add an ``OUFit``'s record to ``ds``: standard errors, convergence, what was fixed."""
    ds.attrs["fitted"] = FIT_DESCRIPTION
    ds.attrs["fixed"] = (
        ", ".join(
            f"{k}={np.ravel(v)[0] if np.size(v) == 1 else 'array'}" for k, v in fit.fixed.items()
        )
        or "none"
    )
    ds.attrs["joint"] = int(fit.joint)
    ds.attrs["n_iter"] = int(fit.n_iter)
    for p in fit.model.params():
        se = np.asarray(fit.stderr[p], dtype=np.float64)
        ds[p + "_se"] = xr.DataArray(se, dims=series_dims if se.ndim else ())
        ds[p + "_se"].attrs["description"] = (
            f"standard error of {p} (inverse Hessian; NaN if fixed or undefined)"
        )
        if "units" in ds[p].attrs:  # (set by results_dataset)
            ds[p + "_se"].attrs["units"] = ds[p].attrs["units"]
    conv = np.asarray(fit.converged)
    ds["converged"] = xr.DataArray(conv.astype(np.int8), dims=series_dims if conv.ndim else ())
    ds["converged"].attrs["description"] = "1 if the optimizer reached the gradient tolerance"
    return ds
