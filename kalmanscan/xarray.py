"""xarray for kalmanscan: the ``.kalman`` accessor on ``DataArray`` and ``Dataset``, fitting over
DataArrays, and NetCDF output.

Importing this module registers the accessor (``import kalmanscan`` alone never imports xarray)::

    import kalmanscan.xarray  # noqa: F401
    ds = da.kalman.filter(theta=0.0, sigma2=1469.1, obs_var=15099.0)   # da: dims (time, ...)
    params = da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    fc = da.kalman.forecast(params, steps=10)

:func:`filter_dataarray` (the accessor's ``filter``) runs the model's filter, smoother and forecast
over a DataArray through ``xarray.apply_ufunc`` with the time dimension as the core dimension:
dask-chunked input runs chunk-wise over the series dimensions (``dask="parallelized"``) and stays
lazy, so many series scale out over cores or a dask cluster; in-memory input runs one block.
:func:`kalmanscan.timeseries.dataset.results_dataset` lays the results out (variables listed
there). :func:`to_dataset` is ``OUModel.to_dataset`` on numpy/pandas data, and
:func:`fit_dataarray` runs ``fit_ou`` per series block the same way.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace

import numpy as np
import xarray as xr

from kalmanscan.timeseries import dataset as view
from kalmanscan.timeseries._messages import SeriesLabel
from kalmanscan.timeseries.coverage import check_coverage
from kalmanscan.timeseries.dataset import FIT_DESCRIPTION, LOGLIK_CONVENTION, MODEL_DESCRIPTION
from kalmanscan.timeseries.fit import (
    _constant_refusal,
    _constant_series,
    _nothing_to_fit,
    _one_chunk,
    fit_ou,
)
from kalmanscan.timeseries.model import PARAMS, OUModel, align_series_labels, forecast_labels
from kalmanscan.timeseries.result import OUFit
from kalmanscan.timeseries.time_zones import coord_attrs, recorded_times
from kalmanscan.timeseries.times import TimeAxis, as_time_axis

__all__ = ["filter_dataarray", "fit_dataarray", "netcdf_engine", "save_netcdf", "to_dataset"]


def netcdf_engine() -> str:
    """The first installed netCDF engine: ``"netcdf4"``, ``"h5netcdf"`` or ``"scipy"`` (netCDF3),
    the one ``save_netcdf`` and the CLI write with; ImportError where none is installed.

    >>> netcdf_engine() in ("netcdf4", "h5netcdf", "scipy")
    True
    """
    import importlib.util

    for module, engine in (("netCDF4", "netcdf4"), ("h5netcdf", "h5netcdf"), ("scipy", "scipy")):
        if importlib.util.find_spec(module) is not None:
            return engine
    raise ImportError("writing netCDF needs one of netCDF4, h5netcdf or scipy (pip install scipy)")


def save_netcdf(ds: xr.Dataset, path, engine: str | None = None) -> str:
    """Write ``ds`` to netCDF with ``engine`` (default :func:`netcdf_engine`); returns the engine.

    netCDF3 (the ``scipy`` engine) has no 64-bit integers, so datetimes are stored there as float64
    seconds since 1970-01-01 (about microsecond precision over centuries), and an integer
    attribute past 32 bits (a fit's ``time_unit_ns``) as float64 (exact below 2^53). netCDF has no
    MultiIndex: a MultiIndex coordinate (e.g. a DataFrame's MultiIndex columns as ``series``) is
    written as its levels, coordinates along its dim (``ds.reset_index``).

    >>> import tempfile, os, numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.array([1.0, 2.0]))
    >>> save_netcdf(ds, os.path.join(tempfile.mkdtemp(), "r.nc"), engine="scipy")
    'scipy'
    """
    engine = engine or netcdf_engine()
    import pandas as pd  # (xarray's own dependency)

    multi = [d for d in ds.dims if isinstance(ds.indexes.get(d), pd.MultiIndex)]
    if multi:
        ds = ds.reset_index(multi)
    encoding = {}
    if engine == "scipy":
        for name, var in ds.variables.items():
            if var.dtype.kind == "M":
                encoding[name] = {"units": "seconds since 1970-01-01T00:00:00", "dtype": "float64"}
        ds = _nc3_attrs(ds)
    ds.to_netcdf(path, engine=engine, encoding=encoding)
    return engine


def _nc3_attrs(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with its integer attributes (its own and its variables') that netCDF3's 32 bits
    cannot hold (a fit's ``time_unit_ns``, 8.64e13 for a day) as float64 where that is exact
    (below 2^53), else as their decimal text; the others as they are (a copy where any changed)."""

    def fix(attrs):
        out = {}
        for k, v in attrs.items():
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                if not -(2**31) <= int(v) < 2**31:
                    v = float(v) if abs(int(v)) < 2**53 else str(int(v))
            out[k] = v
        return out

    ds = ds.copy()
    ds.attrs = fix(ds.attrs)
    for var in ds.variables.values():
        var.attrs = fix(var.attrs)
    return ds


# --- filtering ---------------------------------------------------------------------------------
def _block(z, *inputs, time_axis, smooth, forecast_labels, backend, where):
    """The model's results on ``z [..., T]`` (time last, as apply_ufunc passes it), time last.
    ``inputs``: theta, sigma2, mu, obs_var (prior_mean, prior_var), then the block's labels of
    the series dims ``where["series_dims"]``, with which an infinite value is named at its
    coordinates in the whole array (:func:`_refuse_block_inf`, ``where``: its keywords)."""
    T = z.shape[-1]
    loop = z.shape[:-1]
    H = 0 if forecast_labels is None else len(forecast_labels)
    if z.size == 0:  # dask may probe with empty blocks
        shapes = [loop + (T,)] * (6 if smooth else 4) + [loop] + [loop + (H,)] * (3 if H else 0)
        return tuple(np.zeros(s) for s in shapes)
    k = len(inputs) - len(where["series_dims"])
    _refuse_block_inf(z, inputs[k:], **where)
    theta, sigma2, mu, obs_var, *prior = inputs[:k]
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
    results = view.result_vars(
        *model.run(zt, time_axis, smooth=smooth, forecast_at=forecast_labels, backend=backend)
    )
    last = lambda a: np.broadcast_to(np.moveaxis(a, 0, -1), loop + a.shape[:1])  # noqa: E731
    return tuple(
        np.array(np.broadcast_to(v, loop) if k == "loglik" else last(v)) for k, v in results.items()
    )


def _param_vars(model, params: dict, da: xr.DataArray, time_dim: str) -> dict:
    """``{name: DataArray}`` of theta, sigma2, mu, obs_var (and prior_mean/prior_var when set)."""
    if model is not None and params:
        raise ValueError(
            f"model, {sorted(params)}: give either model= or individual parameters, not both"
        )
    if isinstance(model, OUFit):
        model = model.model
    if isinstance(model, xr.Dataset):
        missing = [p for p in PARAMS if p not in model]
        if missing:
            raise ValueError(
                f"model: expected a Dataset with variables {list(PARAMS)} (e.g. from "
                f".kalman.fit_ou()), missing {missing}"
            )
        return {p: view.series_param(p, model[p], da, time_dim) for p in PARAMS}
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
        # parameters given with labels (pandas, xarray) are matched to the data's by label, and
        # those of a fit's model by the fit's series labels
        fitted = model._series_aligned(da, da.dims.index(time_dim), data_name="model")
        given = lambda p: model._labelled.get(p, fitted.get(p, getattr(model, p)))  # noqa: E731
        values = {p: given(p) for p in PARAMS}
        for p in ("prior_mean", "prior_var"):
            if getattr(model, p) is not None:
                values[p] = given(p)
    else:
        raise TypeError(
            f"model: expected an OUModel, OUFit or parameter Dataset, got {type(model).__name__}"
        )
    return {k: view.series_param(k, v, da, time_dim) for k, v in values.items()}


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
    if kind == "f" and da.chunks is None:  # dask data: each block names its own when it runs
        n = da.ndim
        labels = [
            _dim_labels(da, d).reshape([-1 if j == i else 1 for j in range(n)])
            for i, d in enumerate(da.dims)
        ]
        _refuse_inf(da.values, da.dims, labels)


def _dim_labels(da: xr.DataArray, d: str) -> np.ndarray:
    """The labels messages name positions along ``d`` by: its coordinate's values (timezone-aware
    times in UTC), else the positions ``0, 1, ...`` (in the whole array)."""
    index = da.indexes.get(d)
    if getattr(index, "tz", None) is not None:
        return index.tz_convert(None).to_numpy()
    return da[d].values if d in da.coords else np.arange(da.sizes[d])


def _refuse_inf(values: np.ndarray, dims, labels) -> None:
    """Refuse an infinite value of ``values`` (over ``dims``, each labelled by ``labels``: one
    array per dim, broadcasting to ``values``' shape), the first in C order, naming its
    coordinates: ``da: expected finite values or NaN (missing), got inf at time=..., station='b'``.
    The in-memory check and each dask block's (its labels those of the whole array)."""
    bad = np.isinf(values)
    if not bad.any():
        return
    at = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    where = ", ".join(
        f"{d}={_label_text(np.broadcast_to(v, bad.shape)[at])}"
        for d, v in zip(dims, labels, strict=True)
    )
    raise ValueError(f"da: expected finite values or NaN (missing), got {values[at]} at {where}")


def _refuse_block_inf(z, series_labels, *, series_dims, dims, time_labels) -> None:
    """:func:`_refuse_inf` of a block ``z [..., T]`` (time last, as apply_ufunc passes it) of
    the whole array over ``dims``: ``series_labels`` the block's labels along ``series_dims``
    (its loop dims, in that order), ``time_labels`` the time dim's; the values and labels laid
    out in the order of ``dims``, so the block names the value the whole array's check would."""
    if not np.isinf(z).any():
        return
    k = len(series_dims)
    loop = z.shape[:-1]
    axes = [series_dims.index(d) if d in series_dims else k for d in dims]
    full = [np.broadcast_to(v, loop)[..., None] for v in series_labels]
    full.append(np.asarray(time_labels).reshape((1,) * k + (-1,)))
    _refuse_inf(
        np.transpose(z, axes),
        dims,
        [np.transpose(np.broadcast_to(full[a], z.shape), axes) for a in axes],
    )


def _where(da: xr.DataArray, time_dim: str):
    """``(where, labels)`` for a block to name an infinite value at its coordinates in the whole
    array ``da`` (:func:`_refuse_block_inf`): ``where`` its keywords, ``labels`` one DataArray
    per series dim (its coordinate, or positions) to pass with the data, so that each dask block
    gets its own."""
    series_dims = tuple(d for d in da.dims if d != time_dim)
    where = dict(series_dims=series_dims, dims=da.dims, time_labels=_dim_labels(da, time_dim))
    labels = [xr.DataArray(_dim_labels(da, d), dims=d) for d in series_dims]
    if da.chunks is not None:  # (chunked as the data: dask cannot size object labels, tuples of
        # a MultiIndex, by itself)
        labels = [v.chunk({d: da.chunksizes[d]}) for v, d in zip(labels, series_dims, strict=True)]
    return where, labels


def _label_text(v) -> str:
    """A coordinate label as a message shows it: text quoted, dates and numbers as written."""
    return repr(str(v)) if isinstance(v, (str, np.str_)) else str(v)


def _time_units(da: xr.DataArray, time_dim: str, ax: TimeAxis) -> str | None:
    """The model time unit in UDUNITS-2 syntax, for the outputs' ``units``: a datetime axis's
    (``"d"``), else the numeric time coordinate's ``units`` attr (its unit before ``since``, as in
    ``"days since 2000-01-01"``); ``None`` where neither says."""
    if ax.is_datetime:
        return view.duration_units(np.timedelta64(ax.unit, "ns"))
    units = view.data_units(da[time_dim]) if time_dim in da.coords else None
    units = None if units is None else units.split(" since ")[0].strip()
    return None if units in (None, "", "1") else units


def _time_axis(da: xr.DataArray, time_dim: str, time_unit) -> TimeAxis:
    if time_dim not in da.dims:
        raise ValueError(
            f"time_dim: expected one of the array's dims {list(da.dims)}, got {time_dim!r}"
        )
    _check_values(da, time_dim)
    # the index keeps a timezone that the coordinate's .values drop (naive UTC datetimes)
    if time_dim in da.indexes:
        times = da.indexes[time_dim]
    else:
        times = da[time_dim].values if time_dim in da.coords else None
    name = f"coordinate {time_dim!r}"
    if time_dim in da.coords:  # periods' starts or a zone's UTC times, as results record them
        times = recorded_times(times, da[time_dim].attrs, name)
    return as_time_axis(times, da.sizes[time_dim], time_unit, name=name)


def _as_read(da: xr.DataArray, time_dim: str, ax: TimeAxis) -> xr.DataArray:
    """``da`` with its time coordinate as the filter read it, where the two differ in kind:
    timestamp strings, datetime objects and timezone-aware times become the ``datetime64``
    labels of ``ax`` (in UTC where they carried a timezone or offset, and the coordinate then
    says ``time_zone = "UTC"`` and names the zone in ``local_time_zone``), pandas periods the
    times they start (the coordinate then says their frequency, ``period_freq``), as
    ``OUModel.to_dataset`` lays them out. Numbers and naive ``datetime64`` stay as given. So
    the forecast times are of the same kind as the record's and the Dataset can be plotted and
    written to netCDF."""
    if time_dim not in da.coords:
        return da
    coord = da[time_dim]
    plain = isinstance(coord.dtype, np.dtype) and coord.dtype.kind in "iufM"
    if plain and not ax.utc:
        return da
    attrs = dict(coord.attrs) | coord_attrs(ax.utc, ax.tz, ax.period_freq)
    return da.assign_coords({time_dim: xr.Variable(time_dim, ax.labels, attrs=attrs)})


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
    Dask-chunked input stays lazy and runs chunk-wise over the series dims. With a fit, the
    series it did not fit (fewer than 2 observations, or constant) are NaN
    (:func:`_blank_unfitted`).

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
    fit = model if isinstance(model, (OUFit, xr.Dataset)) else None
    if isinstance(model, OUFit):
        model = model.model
    if time_unit is None and isinstance(model, OUModel):
        time_unit = model.time_unit
    if time_unit is None and isinstance(model, xr.Dataset) and "time_unit_ns" in model.attrs:
        time_unit = np.timedelta64(int(model.attrs["time_unit_ns"]), "ns")
    ax = _time_axis(da, time_dim, time_unit)
    where, labels = _where(da, time_dim)
    da = _as_read(da, time_dim, ax)
    pv = _param_vars(model, params, da, time_dim)
    fc_labels = forecast_labels(ax, forecast_steps, forecast_at)
    z = da.astype(np.float64)
    if z.chunks is not None:
        z = z.chunk({time_dim: -1})
    prior = [pv[k] for k in ("prior_mean", "prior_var") if k in pv]
    if len(prior) == 1:
        raise ValueError("prior_mean, prior_var: give both or neither")
    args = [z] + [pv[p] for p in PARAMS] + prior + labels
    H = 0 if fc_labels is None else len(fc_labels)
    names = list(view.TIME_VARS[: 6 if smooth else 4]) + ["loglik"]
    names += list(view.FORECAST_VARS) if H else []
    ocd = [[time_dim]] * (6 if smooth else 4) + [[]] + [["forecast_time"]] * (3 if H else 0)
    outs = xr.apply_ufunc(
        _block,
        *args,
        input_core_dims=[[time_dim]] + [[]] * (len(args) - 1),
        output_core_dims=ocd,
        kwargs=dict(
            time_axis=ax, smooth=smooth, forecast_labels=fc_labels, backend=backend, where=where
        ),
        dask="parallelized",
        output_dtypes=[np.float64] * len(ocd),
        dask_gufunc_kwargs={"output_sizes": {"forecast_time": H}} if H else None,
        keep_attrs=False,
    )
    ds = view.results_dataset(
        da,
        dict(zip(names, outs, strict=True)),
        {p: pv[p] for p in PARAMS},
        coverage=coverage,
        time_dim=time_dim,
        time_unit=ax.unit_name,
        forecast_time=fc_labels,
        custom_prior="prior_mean" in pv,
        time_units=_time_units(da, time_dim, ax),
        period_freq=ax.period_freq,
        utc=ax.utc,
        tz=ax.tz,
    )
    for name, coord in da.coords.items():  # apply_ufunc's outputs carry them without attrs
        if name in ds.coords:
            ds[name].attrs.update(coord.attrs)
    if fit is not None:
        _record_fit(ds, fit, da, time_dim)
        view.add_units(ds, view.data_units(da), _time_units(da, time_dim, ax))  # of the *_se
        _blank_unfitted(ds, time_dim)
    if isinstance(da.name, str) and da.name:  # as OUModel.to_dataset(name=...) records it
        ds.attrs["name"] = da.name
    return ds


_FIT_ATTRS = ("fitted", "fixed", "joint", "n_iter")


def _blank_unfitted(ds: xr.Dataset, time_dim: str) -> None:
    """NaN in the results computed from the parameters for the series a separate fit did not
    fit (``converged`` 0 and, by ``fit_ou``'s rule, fewer than 2 observations or constant: their
    parameters the starting values), as ``OUFit``'s methods give; with a warning naming them
    where the data are in memory (lazy data stay lazy, unnamed)."""
    if "converged" not in ds or ds.attrs.get("joint", 0) or not ds["converged"].dims:
        return
    z = ds["observed"]
    n = z.count(time_dim)
    constant = (n >= 2) & (z.max(time_dim) == z.min(time_dim))
    none = (ds["converged"] == 0) & ((n < 2) | constant)
    lazy = _is_lazy(none)
    if not lazy and not bool(none.any()):
        return
    from kalmanscan.timeseries.result import _DERIVED_VARS

    for k in _DERIVED_VARS:
        if k in ds:
            view.put(ds, k, ds[k].where(~none))
    if not lazy:
        flat = none.stack(_s=none.dims) if none.ndim > 1 else none
        shown = [
            ", ".join(f"{d}={_label_text(flat[d].values[i])}" for d in none.dims)
            for i in np.flatnonzero(flat.values)[:5]
        ]
        more = f" and {int(flat.sum()) - len(shown)} more" if int(flat.sum()) > len(shown) else ""
        warnings.warn(
            f"kalman.filter: NaN for series {'; '.join(shown)}{more}: not fitted (fewer than 2 "
            "observations, or constant), so there is no estimate (their parameters are only the "
            "fit's starting values)",
            stacklevel=4,
        )


def _is_lazy(x) -> bool:
    return getattr(x, "chunks", None) is not None


def _record_fit(ds: xr.Dataset, fit, da: xr.DataArray, time_dim: str) -> None:
    """The fit's record in the results, as ``OUModel.to_dataset(fit=...)`` keeps it: standard
    errors ``*_se``, ``converged`` and the attrs ``fitted``, ``fixed``, ``joint`` (``n_iter``),
    from an :class:`OUFit` or the parameter Dataset of :func:`fit_dataarray`. A Dataset without
    the ``fitted`` attr (parameters made by hand) records nothing."""
    series_dims = [d for d in da.dims if d != time_dim]
    if isinstance(fit, OUFit):
        sizes = tuple(da.sizes[d] for d in series_dims)
        per_series = {f"{p}_se": fit.stderr[p] for p in fit.model.params()}
        per_series["converged"] = np.asarray(fit.converged, dtype=np.float64)
        if fit.model._series_labels is not None:  # the fit's series matched by label
            axis = da.dims.index(time_dim)
            per_series = {
                k: np.asarray(align_series_labels(k, v, fit.model._series_labels, da, axis))
                if np.ndim(v) == 1
                else v
                for k, v in per_series.items()
            }
        try:
            per_series = {
                k: np.array(np.broadcast_to(v, sizes)) if np.ndim(v) else v
                for k, v in per_series.items()
            }
        except ValueError:  # (a fit of other series: its record is not theirs)
            return
        stderr = {p: per_series[f"{p}_se"] for p in fit.model.params()}
        matched = replace(fit, stderr=stderr, converged=per_series["converged"].astype(bool))
        view.record_fit(ds, matched, series_dims)
        return
    if "fitted" not in fit.attrs:
        return
    for k in [p + "_se" for p in PARAMS] + ["converged"]:
        if k in fit:
            view.put(ds, k, view.match_series(k, fit[k], da, time_dim))
    ds.attrs.update({k: fit.attrs[k] for k in _FIT_ATTRS if k in fit.attrs})


def to_dataset(model: OUModel, z, times=None, *, fit=None, backend: str = "auto", **options):
    """Results of ``model`` on numpy/pandas data as a Dataset: :meth:`OUModel.to_dataset`
    (``options``: its keywords), with ``fit`` (an :class:`OUFit`) recorded.

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = to_dataset(OUModel(sigma2=1469.1, obs_var=15099.0), np.array([1120.0, 1160.0, 963.0]),
    ...                 np.array([1871, 1872, 1873]), forecast_steps=2)
    >>> ds["forecast_time"].values.tolist()
    [1874.0, 1875.0]
    """
    return model.to_dataset(z, times, fit=fit, backend=backend, **options)


# --- fitting --------------------------------------------------------------------------------------
def _fix_inputs(fix, da: xr.DataArray, time_dim: str):
    """``fix`` split into its scalars and its per-series values as DataArrays over the data's
    series dims (:func:`kalmanscan.timeseries.dataset.series_param`: a DataArray matched by its
    labels, every series of the data needing one; an array over the trailing series dims). So
    the values reach each series, and each dask chunk gets its own."""
    scalars, per_series = {}, {}
    for name, v in (fix or {}).items():
        if isinstance(v, xr.DataArray):
            per_series[name] = view.match_series(f"fix[{name!r}]", v, da, time_dim)
        elif np.ndim(v) > 0:  # an array over the trailing series dims, as parameters are
            # (masked values, text, booleans and complex numbers refused, naming the entry)
            per_series[name] = view.series_param(f"fix[{name!r}]", v, da, time_dim)
        else:
            scalars[name] = v
    return scalars, per_series


def _fix_text(fix) -> str:
    """The ``fixed`` attribute: each name with its value, or "per series" for arrays."""
    return (
        ", ".join(
            f"{k}={v}" if np.ndim(v) == 0 else f"{k}=per series" for k, v in (fix or {}).items()
        )
        or "none"
    )


def _series_labels(loop, dims, labels) -> list | None:
    """The names of a block's series (``loop``: its series shape, C order) for the fit's
    messages, from ``labels`` (one array per series dim ``dims``, broadcasting to ``loop``):
    ``station='a'``, ``(station='a', level=2)``; ``None`` without series dims."""
    if not dims:
        return None
    cols = [np.broadcast_to(v, loop).ravel() for v in labels]
    texts = [
        ", ".join(f"{d}={_label_text(v)}" for d, v in zip(dims, vals, strict=True))
        for vals in zip(*cols, strict=True)
    ]
    return [SeriesLabel(t if len(dims) == 1 else f"({t})") for t in texts]


def _fit_block(
    z,
    *inputs,
    time_axis: TimeAxis,
    fix,
    per_series=(),
    label_dims=(),
    chunked=False,
    options,
    where=None,
):
    """``fit_ou`` on a block ``z [..., T]``; ``inputs``: the per-series fixed values (named by
    ``per_series``), then the labels of the series dims ``label_dims`` (their coordinates, or
    positions), so that the fit's warnings name the block's series as the whole array's.
    ``chunked``: the block is one of several dask chunks along the series dims, fitted as part of
    the whole array (:func:`kalmanscan.timeseries.fit._one_chunk`; :func:`fit_dataarray` refuses
    an array without a series to fit, from ``n_obs`` and the last result, each constant series'
    first observation (:func:`_constant_firsts`; NaN unless ``chunked``)). ``where``: the
    keywords of :func:`_refuse_block_inf`, which names an infinite value by the whole array's
    coordinates."""
    loop = z.shape[:-1]
    fixed, labels = inputs[: len(per_series)], inputs[len(per_series) :]
    if where is not None and z.size:
        _refuse_block_inf(z, labels, **where)
    if per_series:  # per-series fixed values, broadcast to this block's series
        fix = dict(fix)
        for n, v in zip(per_series, fixed, strict=True):
            fix[n] = np.broadcast_to(v, loop)
    if z.size == 0:
        return (
            np.zeros(loop + (4,)),
            np.zeros(loop + (4,)),
            np.zeros(loop),
            np.zeros(loop, np.int8),
            np.zeros(loop),
            np.zeros(loop + (2,)),
        )
    names = _series_labels(loop, label_dims, labels)
    if names is not None and not chunked:  # the whole array
        most = int(np.count_nonzero(~np.isnan(z), axis=-1).max())
        if most < 2:
            raise _no_series_to_fit(most, names[:5], len(names))
    zt = np.array(np.moveaxis(z, -1, 0), dtype=np.float64)
    with _one_chunk() if chunked else contextlib.nullcontext():
        fit = fit_ou(
            zt,
            time_axis.labels,
            fix=fix,
            time_unit=np.timedelta64(time_axis.unit, "ns") if time_axis.is_datetime else None,
            series_labels=names,
            **options,
        )
    est = np.stack(
        [np.broadcast_to(np.asarray(fit.params[p], dtype=np.float64), loop) for p in PARAMS], -1
    )
    se = np.stack(
        [np.broadcast_to(np.asarray(fit.stderr[p], dtype=np.float64), loop) for p in PARAMS], -1
    )
    ll = np.broadcast_to(np.asarray(fit.loglik, dtype=np.float64), loop)
    conv = np.broadcast_to(np.asarray(fit.converged), loop).astype(np.int8)
    nobs = np.broadcast_to(np.asarray(fit.n_obs, dtype=np.float64), loop)
    first = np.full(loop + (2,), np.nan)
    if chunked:  # the series the fit saw (robust: without the screened values)
        fz = np.asarray(fit.z, dtype=np.float64)
        first = _constant_firsts(fz.reshape(len(fz), -1)).reshape(loop + (2,))
    return tuple(np.array(x) for x in (est, se, ll, conv, nobs)) + (first,)


def _constant_firsts(Z) -> np.ndarray:
    """``[N, 2]``: the time index and value of the first observation of each constant series
    (columns of ``Z [T, N]``, as ``fit_ou`` finds them), NaN for the others."""
    observed = ~np.isnan(Z)
    t0 = np.argmax(observed, axis=0)
    out = np.stack([t0.astype(np.float64), Z[t0, np.arange(Z.shape[1])]], -1)
    out[~_constant_series(Z, observed.sum(0))] = np.nan
    return out


def _no_series_to_fit(most: int, shown: list, n: int) -> ValueError:
    """The refusal of an array of ``n`` series none of which has 2 observations (``most``: the
    most any has), naming the first of them (``shown``), as ``fit_ou`` refuses such data."""
    more = f" and {n - len(shown)} more" if n > len(shown) else ""
    return ValueError(
        "z: expected at least 2 observed values in a series to fit, got at most "
        f"{most} in every series ({', '.join(repr(x) for x in shown)}{more})"
    )


_SHOWN = 5  # series named in a refusal, of each kind


def _unfit_verdict(nobs, first, dims):
    """What a chunked fit's refusal needs of the whole array, from every chunk's ``n_obs`` and
    constant series' first observations (``first``), reduced lazily to one vector (one chunk):
    ``[most observations in a series, series to fit, short series (< 2 observations), constant
    series, the first observed value of the constant ones (time first, then series), the flat
    positions (C order over dims) of the first short ones (inf-padded to _SHOWN), of the first
    constant ones]``."""
    import dask.array as dsa

    n_obs = nobs.transpose(*dims).data.ravel()
    t0, v0 = (first.transpose(*dims, "first_observed").data[..., k].ravel() for k in (0, 1))
    n = n_obs.size
    pos = dsa.arange(n, chunks=n_obs.chunks)
    short, constant = n_obs < 2, ~dsa.isnan(t0)
    key = dsa.where(constant, t0 * n + pos, np.inf)  # unique: the first observation's order
    pad = dsa.full(_SHOWN, np.inf)

    def lowest(which):
        return dsa.topk(dsa.concatenate([dsa.where(which, pos, np.inf), pad]), -_SHOWN)

    counts = [n_obs.max(), (~short & ~constant).sum(), short.sum(), constant.sum()]
    counts.append(dsa.where(key == key.min(), v0, -np.inf).max())
    verdict = dsa.concatenate(
        [dsa.stack(counts).astype(np.float64), lowest(short), lowest(constant)]
    )
    return xr.DataArray(verdict.rechunk(-1), dims="verdict")


def _refuse_unfit(x, verdict, *, dims, labels):
    """A block ``x`` of a chunked fit's results, refused once the whole array's
    :func:`_unfit_verdict` is known to leave no series to fit, as the in-memory fit refuses it
    (``labels``: the values naming each position along the series ``dims``)."""
    verdict = np.ravel(verdict)
    if verdict.size == 0:  # (dask may probe with empty blocks)
        return x
    most, to_fit, n_short, n_constant, first = verdict[:5]
    if most >= 2 and to_fit > 0:
        return x
    shape = tuple(len(v) for v in labels)
    n = int(np.prod(shape))

    def named(pos):
        idx = np.unravel_index(pos[np.isfinite(pos)].astype(np.int64), shape)
        return _series_labels(idx[0].shape, dims, [v[i] for v, i in zip(labels, idx, strict=True)])

    if most < 2:
        raise _no_series_to_fit(int(most), named(np.arange(min(n, _SHOWN), dtype=float)), n)
    if n_constant == n:
        raise _constant_refusal(float(first))
    short, constant = verdict[5 : 5 + _SHOWN], verdict[5 + _SHOWN :]
    raise _nothing_to_fit(
        [repr(s) for s in named(short)],
        int(n_short),
        [repr(s) for s in named(constant)],
        int(n_constant),
    )


def fit_dataarray(
    da: xr.DataArray,
    *,
    time_dim: str = "time",
    fix=None,
    joint: bool = False,
    time_unit=None,
    **options,
) -> xr.Dataset:
    """Fit an OU model to every series of ``da`` (separately; ``joint=True``: one set for all).

    Returns a Dataset over the series dims with ``theta, sigma2, mu, obs_var``, their ``*_se``,
    ``loglik``, ``converged`` and ``n_obs``; pass it as ``model=`` to ``.kalman.filter``.
    Separate fits of a dask-chunked array run chunk-wise. ``options`` go to ``kalmanscan.fit_ou``.
    The parameters carry units from the data's ``units`` and the time axis
    (:func:`~kalmanscan.timeseries.dataset.variable_units`); the fit's warnings name the series by
    their coordinates (``in series station='c'``), each chunk's too. A series with fewer than 2
    observations, or constant, keeps its starting values, marked not converged, with a warning,
    in every chunk as in memory; an array without a series to fit is refused (chunked: when its
    results are computed, no chunk seeing the others).

    >>> import numpy as np, xarray as xr
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(50, 2)).cumsum(0) + rng.normal(size=(50, 2))
    >>> da = xr.DataArray(z, dims=("time", "series"))
    >>> fit_dataarray(da, fix={"theta": 0.0, "mu": 0.0})["sigma2"].dims
    ('series',)
    """
    if not isinstance(da, xr.DataArray):
        raise TypeError(f"da: expected an xarray.DataArray, got {type(da).__name__}")
    if "series_labels" in options:
        raise TypeError(
            "series_labels: not an option here; the fit's messages name the series by their "
            "coordinates (positions along dims without one)"
        )
    ax = _time_axis(da, time_dim, time_unit)
    series_dims = [d for d in da.dims if d != time_dim]
    z = da.astype(np.float64)
    if joint:
        if z.chunks is not None:  # (read once here: named as in memory)
            z = z.load()
            _check_values(z, time_dim)
        zt = np.moveaxis(np.asarray(z.transpose(*series_dims, time_dim).values), -1, 0)
        fit = fit_ou(zt, ax.labels, fix=fix, joint=True, time_unit=time_unit, **options)
        ds = xr.Dataset({p: xr.DataArray(float(fit.params[p])) for p in PARAMS})
        for p in PARAMS:
            ds[p + "_se"] = xr.DataArray(float(fit.stderr[p]))
        ds["loglik"] = xr.DataArray(
            np.asarray(fit.loglik, dtype=np.float64),
            dims=series_dims,
            coords={d: da[d] for d in series_dims if d in da.coords},
        )
        ds["converged"] = xr.DataArray(np.int8(fit.converged))
        ds["n_obs"] = xr.DataArray(np.asarray(fit.n_obs, dtype=np.float64), dims=series_dims)
        # the series coordinates (labels, non-index and scalar ones), as separate fits keep them
        ds = ds.assign_coords({k: v for k, v in da.coords.items() if time_dim not in v.dims})
    else:
        if z.chunks is not None:
            z = z.chunk({time_dim: -1})
        chunked = z.chunks is not None and any(len(z.chunksizes[d]) > 1 for d in series_dims)
        scalars, per_series = _fix_inputs(fix, da, time_dim)
        # each series' labels (positions along a dim without coordinates) reach its block
        where, labels = _where(da, time_dim)
        inputs = [*per_series.values(), *labels]
        est, se, ll, conv, nobs, first = xr.apply_ufunc(
            _fit_block,
            z,
            *inputs,
            input_core_dims=[[time_dim]] + [[] for _ in inputs],
            output_core_dims=[["param"], ["param"], [], [], [], ["first_observed"]],
            kwargs=dict(
                time_axis=ax,
                fix=scalars,
                per_series=tuple(per_series),
                label_dims=tuple(series_dims),
                chunked=chunked,
                options=options,
                where=where,
            ),
            dask="parallelized",
            output_dtypes=[np.float64, np.float64, np.float64, np.int8, np.float64, np.float64],
            dask_gufunc_kwargs={"output_sizes": {"param": 4, "first_observed": 2}},
            keep_attrs=False,
        )
        if chunked:
            # no chunk sees the others: each result waits for a summary of every chunk's n_obs
            # and constant series (a few numbers) and is refused, as the in-memory fit is, where
            # no series can be fitted
            verdict = _unfit_verdict(nobs, first, series_dims)
            est, se, ll, conv, nobs = (
                xr.apply_ufunc(
                    _refuse_unfit,
                    x,
                    verdict,
                    input_core_dims=[[], ["verdict"]],
                    kwargs=dict(dims=tuple(series_dims), labels=[v.values for v in labels]),
                    dask="parallelized",
                    output_dtypes=[x.dtype],
                    keep_attrs=False,
                )
                for x in (est, se, ll, conv, nobs)
            )
        ds = xr.Dataset()
        for j, p in enumerate(PARAMS):
            view.put(ds, p, est.isel(param=j, drop=True))
            view.put(ds, p + "_se", se.isel(param=j, drop=True))
        for k, v in (("loglik", ll), ("converged", conv), ("n_obs", nobs)):
            view.put(ds, k, v)
    ds.attrs.update(
        {
            "model": MODEL_DESCRIPTION,
            "fitted": FIT_DESCRIPTION,
            "fixed": _fix_text(fix),
            "joint": int(joint),
            "time_dim": time_dim,
            "time_unit": ax.unit_name,
            "loglik_convention": LOGLIK_CONVENTION,
        }
    )
    if ax.is_datetime:
        ds.attrs["time_unit_ns"] = int(ax.unit / np.timedelta64(1, "ns"))
    return view.add_units(ds, view.data_units(da), _time_units(da, time_dim, ax))


# --- the accessor ---------------------------------------------------------------------------------
class _KalmanAccessor:
    def __init__(self, obj):
        self._obj = obj

    def _da(self, time_dim):
        obj = self._obj
        if isinstance(obj, xr.Dataset):
            # CF bounds variables (time_bnds, named by a variable's "bounds" attr) are not series
            bounds = {v.attrs.get("bounds") for v in obj.variables.values()} - {None}
            names = [k for k, v in obj.data_vars.items() if time_dim in v.dims and k not in bounds]
            if not names:
                raise ValueError(
                    f"time_dim: no data variable of the Dataset has the dim {time_dim!r}"
                )
            for k in names:  # named here: as one array, only its dtype would be
                if obj[k].dtype.kind not in "iuf":
                    raise TypeError(
                        f"Dataset variable {k!r}: expected real numbers (NaN = missing), got "
                        f"dtype {obj[k].dtype}; drop it (ds.drop_vars({k!r})) or select the "
                        "series variables"
                    )
            sub = obj[names]
            # pandas' nullable columns (Int64, Float64: NA = missing) as float64 with NaN, so the
            # variables stack into one array (pandas finds no shared type for Int64 and Float64)
            nullable = [k for k in names if not isinstance(sub[k].dtype, np.dtype)]
            sub = sub.assign({k: sub[k].astype(np.float64) for k in nullable})
            units = {view.data_units(sub[k]) for k in names}
            if len({frozenset(sub[k].dims) for k in names}) > 1:
                # variables over different dims: each its own series, none broadcast along a dim
                # it lacks (one series per variable and label; a MultiIndex "series" of the
                # variable and the labels, NaN where a variable lacks that dim)
                da = sub.to_stacked_array("series", [time_dim], variable_dim="variable")
                da.name = None
            else:
                da = sub.to_dataarray(dim="series")
            da.attrs.pop("units", None)  # (the Dataset's attrs)
            if len(units) == 1 and None not in units:  # the series' units, where they share one
                da.attrs["units"] = units.pop()
            return da
        return obj

    def filter(
        self,
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
        """Filter/smooth every series along ``time_dim``; see :func:`filter_dataarray`.

        On a Dataset, the data variables with ``time_dim`` become a ``series`` dim (but CF bounds
        variables: ``time_bnds``, named by a variable's ``bounds`` attr); variables over
        different dims are stacked without broadcasting, ``series`` then a MultiIndex of
        ``variable`` and the other dims' labels (docs/api.md, "The .kalman accessor").

        >>> import numpy as np, xarray as xr, kalmanscan.xarray
        >>> da = xr.DataArray([1.0, 2.0, np.nan, 2.5], dims="time")
        >>> da.kalman.filter(sigma2=0.5, obs_var=1.0)["variance"].shape
        (4,)
        """
        return filter_dataarray(
            self._da(time_dim),
            model,
            time_dim=time_dim,
            coverage=coverage,
            smooth=smooth,
            forecast_steps=forecast_steps,
            forecast_at=forecast_at,
            time_unit=time_unit,
            backend=backend,
            **params,
        )

    def fit_ou(
        self, *, time_dim: str = "time", fix=None, joint: bool = False, time_unit=None, **options
    ) -> xr.Dataset:
        """Maximum-likelihood OU parameters per series; see :func:`fit_dataarray`.

        >>> import numpy as np, xarray as xr, kalmanscan.xarray
        >>> rng = np.random.default_rng(1)
        >>> da = xr.DataArray(rng.normal(size=40).cumsum() + rng.normal(size=40), dims="time")
        >>> float(da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})["obs_var"]) > 0
        True
        """
        return fit_dataarray(
            self._da(time_dim),
            time_dim=time_dim,
            fix=fix,
            joint=joint,
            time_unit=time_unit,
            **options,
        )

    def forecast(
        self,
        model=None,
        *,
        steps=None,
        at=None,
        coverage=(0.5, 0.9),
        time_dim: str = "time",
        time_unit=None,
        backend: str = "auto",
        **params,
    ) -> xr.Dataset:
        """Forecast every series ``steps`` median steps (or at timestamps ``at``) past its record.

        Returns the ``forecast_*`` variables on ``forecast_time`` (plus ``loglik``).

        >>> import numpy as np, xarray as xr, kalmanscan.xarray
        >>> da = xr.DataArray([1.0, 2.0, 2.5], dims="time", coords={"time": [0.0, 1.0, 3.0]})
        >>> da.kalman.forecast(sigma2=0.5, obs_var=1.0, steps=2)["forecast_time"].values.tolist()
        [4.5, 6.0]
        """
        if (steps is None) == (at is None):
            raise ValueError("steps, at: give exactly one")
        ds = self.filter(
            model,
            time_dim=time_dim,
            coverage=coverage,
            smooth=False,
            forecast_steps=steps,
            forecast_at=at,
            time_unit=time_unit,
            backend=backend,
            **params,
        )
        keep = [
            k for k in ds.data_vars if k.startswith("forecast_") or k in PARAMS or k == "loglik"
        ]
        return ds[keep].drop_dims(time_dim, errors="ignore")


def _register():
    for register in (xr.register_dataarray_accessor, xr.register_dataset_accessor):
        cls = register("kalman")(type("KalmanAccessor", (_KalmanAccessor,), {}))
        cls.__doc__ = "The ``.kalman`` accessor: ``filter``, ``fit_ou``, ``forecast`` (kalmanscan)."


_register()
