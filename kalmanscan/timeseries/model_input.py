"""The data and parameters a user gives the model, checked and laid out: :func:`series_input`
(numpy, pandas or xarray data as time-first float arrays, with their times and series labels),
:func:`align_to_data` (parameters given with labels matched to the data's), and the checks of
each parameter (:func:`_param_array`, :func:`_check_reciprocal`). Used by
:class:`~kalmanscan.timeseries.model.OUModel` and the fit.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch


def _param_array(name, value, lo=None, lo_open=False, allow_inf=False):
    """``value`` checked (real, no NaN, in range) as a float or float64 array; a tensor is
    checked the same way on its detached values (one readback) and kept as given, so gradients
    flow through it."""
    from kalmanscan.core._args import _FLOAT_TORCH, as_real_numpy

    if value is None:
        raise TypeError(f"{name}: expected a real number or array of numbers, got None")
    if type(value) is float and _float_ok(value, lo, lo_open, allow_inf):
        return value  # (what the checks below give a Python float that passes them)
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise ValueError(f"{name}: expected a tensor with data, got one on the meta device")
        if value.dtype not in _FLOAT_TORCH:
            raise TypeError(
                f"{name}: expected a floating-point tensor (float32 or float64), got {value.dtype}"
            )
        arr = value.detach().to(torch.float64).cpu().numpy()  # (exact: the same checks)
    else:
        arr = as_real_numpy(name, value, missing_ok=False).astype(np.float64)
    bad = np.isnan(arr) | (np.isinf(arr) if not allow_inf else np.zeros(arr.shape, bool))
    if lo is not None:
        bad |= (arr <= lo) if lo_open else (arr < lo)
    if bad.any():
        rng = "finite values"
        if lo is not None:
            rng = f"values {'>' if lo_open else '>='} {lo}"
            rng += " (inf allowed)" if allow_inf else " and finite"
        raise ValueError(f"{name}: expected {rng}, got {arr[bad].ravel()[0].item()!r}")
    if isinstance(value, torch.Tensor):
        return value
    return float(arr) if arr.ndim == 0 else arr


def _float_ok(x: float, lo, lo_open: bool, allow_inf: bool) -> bool:
    """Whether the Python float ``x`` passes :func:`_param_array`'s checks."""
    if x != x or (not allow_inf and (x == math.inf or x == -math.inf)):
        return False
    return lo is None or (x > lo if lo_open else x >= lo)


def _check_reciprocal(name, value):
    """Refuse a positive variance whose reciprocal (a precision) overflows float64 (a
    subnormal below ``1 / max``), as :func:`kalmanscan.filter` does, naming the same bound."""
    if type(value) is float and abs(value) >= sys.float_info.min:
        return  # (a normal number's reciprocal is finite)
    if isinstance(value, torch.Tensor):  # its values as given, in float64 (one readback)
        arr = value.detach().to(torch.float64).cpu().numpy()
    else:
        arr = np.asarray(value, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        bad = np.isinf(1.0 / arr)
    if bad.any():
        first = np.argwhere(bad)[0]
        where = f" at index {tuple(int(i) for i in first)}" if arr.ndim else ""
        raise ValueError(
            f"{name}: expected values whose reciprocal is finite in {torch.float64} "
            f"(>= {1 / np.finfo(np.float64).max:.3g}), got {arr[bad].ravel()[0].item()!r}{where}"
        )


class SeriesNames(list):
    """Series labels as a list (``OUFit.series_labels``) that keeps the level ``names`` of the
    MultiIndex they came from (its labels tuples): a results Dataset makes them a MultiIndex
    coordinate again (:func:`kalmanscan.core._args.labels_index`).

    >>> import pandas as pd
    >>> labels = column_labels(pd.MultiIndex.from_tuples([("a", 1)], names=["site", "depth"]))
    >>> labels, labels.names
    ([('a', 1)], ('site', 'depth'))
    """

    names: tuple | None = None


def column_labels(index) -> list:
    """A pandas Index of series labels (a DataFrame's columns, a DataArray's coordinate) as the
    list the fit and the Dataset keep: the labels as given (Python ints, strings, timestamps; a
    MultiIndex's tuples, in a :class:`SeriesNames` with its level names)."""
    labels = index.tolist()
    if getattr(index, "nlevels", 1) > 1:
        labels = SeriesNames(labels)
        labels.names = tuple(index.names)
    return labels


def _has_labels(value) -> bool:
    """A pandas ``Series``/``DataFrame`` or an xarray ``DataArray`` with dims: values that name
    the series or steps they belong to."""
    pd, xr = sys.modules.get("pandas"), sys.modules.get("xarray")
    if pd is not None and isinstance(value, (pd.Series, pd.DataFrame)):
        return True
    return xr is not None and isinstance(value, xr.DataArray) and value.ndim > 0


def align_to_data(name: str, value, z, axis: int = 0):
    """A parameter matched by label to the data ``z`` (pandas or xarray, time on ``axis``) and laid
    out time first, ``[T, *S]`` or ``[*S]`` (:func:`kalmanscan.core._args.align_labels`); as
    given where either carries no labels (then it is used by position).

    >>> import pandas as pd
    >>> z = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    >>> align_to_data("sigma2", pd.Series({"b": 2.0, "a": 1.0}), z).tolist()
    [1.0, 2.0]
    """
    from kalmanscan.core._args import align_labels

    if not _has_labels(value):
        return value
    order = None
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(z, xr.DataArray) and -z.ndim <= axis < z.ndim:
        time_dim = z.dims[axis]
        order = (time_dim,) + tuple(d for d in z.dims if d != time_dim)
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(value, pd.Series):
            # to the dim whose labels its index holds, as the accessor matches it
            from kalmanscan.timeseries.dataset import _pandas_as_dataarray

            value = _pandas_as_dataarray(name, value, z, time_dim)
    return align_labels(name, value, z, order)


def align_series_labels(name: str, value, labels, z, axis: int = 0, data_name: str = "z"):
    """A per-series parameter ``value [N]`` of a model whose ``N`` series are labelled ``labels``
    (a fit's ``series_labels``) matched by label to data ``z`` that carry labels, laid out as
    :func:`align_to_data` lays parameters out: to a DataFrame's columns, to the one series dim
    of a DataArray whose coordinates the labels hold (or the series dim with coordinates), to a
    named Series (or 1-D DataArray) by its name (one the model lacks refused); a subset of the
    series selected, in the data's order. A label of the data's that ``labels`` lack is refused
    naming it (``data_name``: the argument the data came in); data without labels (numpy, a
    DataArray without coordinates on its series dims, an unnamed Series) take ``value`` by
    position, as given.

    >>> import numpy as np, pandas as pd
    >>> z = pd.DataFrame({"c": [1.0], "a": [2.0]})
    >>> align_series_labels("sigma2", np.array([1.0, 2.0, 3.0]), ["a", "b", "c"], z).tolist()
    [3.0, 1.0]
    """
    from kalmanscan.core._args import _labels_text, labels_hold, labels_index

    pd, xr = sys.modules.get("pandas"), sys.modules.get("xarray")
    if pd is None or not _has_labels(z):  # (labelled data mean pandas is imported)
        return value
    index = labels_index(labels, pd)
    value = np.asarray(value)
    known = f"the model's series are {_labels_text(index)}, matched by label"

    def refuse(what, hint):
        raise ValueError(
            f"{data_name}: no parameters for {what} ({known}); select the model's series, or "
            f"{hint} to apply the parameters by position"
        )

    if isinstance(z, pd.DataFrame):
        pos = index.get_indexer(z.columns)
        if (pos < 0).any():
            refuse(f"column {z.columns[pos < 0][0]!r}", f"pass {data_name}.to_numpy()")
        return value[pos]
    one = isinstance(z, pd.Series) or (
        xr is not None and isinstance(z, xr.DataArray) and z.ndim == 1
    )
    if one:  # one series: the model's series of its name
        if z.name is None:
            return value
        if z.name not in index:
            refuse(f"{type(z).__name__} {z.name!r}", f"pass {data_name}.to_numpy()")
        return value[index.get_loc(z.name)]
    time_dim = z.dims[axis]
    series = [d for d in z.dims if d != time_dim and d in z.indexes]
    hits = [d for d in series if labels_hold(index, z.indexes[d])]
    if len(hits) == 1:
        d = hits[0]
        if isinstance(index, pd.MultiIndex):
            coords = xr.Coordinates.from_pandas_multiindex(index, d)
        else:
            coords = {d: index}
        return align_to_data(name, xr.DataArray(value, dims=[d], coords=coords), z, axis)
    if not series:
        return value
    drop = f"drop the coordinates ({data_name}.drop_vars({series!r}))"
    if len(series) == 1:
        wanted = z.indexes[series[0]]
        missing = wanted[~wanted.isin(index)]
        if len(missing):
            refuse(f"{series[0]}={missing[0]!r}", drop)
    raise ValueError(
        f"{data_name}: expected one series dim whose coordinates the model's series labels "
        f"{_labels_text(index)} hold, got series dims {tuple(series)}; {drop} to apply the "
        "parameters by position"
    )


def series_input(z, times, axis: int = 0):
    """Normalize data to ``(z [T, *S], times, series_labels)``; z float64 (float32 stays float32).

    pandas Series/DataFrame inputs give their index as ``times`` (unless ``times`` is given; a
    ``RangeIndex`` too, e.g. ``10, 12, ...`` of a slice, the default ``0, 1, ...`` being the
    default times) and a DataFrame's columns as the series labels, as given
    (:func:`column_labels`: integers stay integers, a MultiIndex's as tuples), a named Series'
    name as its one label (a polars DataFrame's columns too; it has no index, so its times come
    as ``times``); an xarray DataArray gives the coordinate of its dim on ``axis`` as ``times``
    (unless ``times`` is given) and, when 2-D, the other dim's labels (when 1-D, its name). The
    data pass the same check as ``kalmanscan.filter``
    (``kalmanscan.core._args.as_real_numpy``): masked elements are missing (NaN); strings,
    booleans, complex numbers and datetimes are refused with a ``TypeError`` naming ``z``.
    """
    from kalmanscan.core._args import as_real_numpy, check_dataarray_time_axis, pandas_refusal

    labels = None
    xr = sys.modules.get("xarray")  # as pandas below: an xarray object means xarray is imported
    if xr is not None and isinstance(z, xr.DataArray):
        if not -z.ndim <= axis < z.ndim:
            raise ValueError(
                f"axis: expected an int in [{-z.ndim}, {z.ndim - 1}] for z of dims {z.dims}, "
                f"got {axis}"
            )
        check_dataarray_time_axis(z, axis)
        dim = z.dims[axis]
        if times is None and dim in z.indexes:
            times = z.indexes[dim]
            if dim in z.coords:  # periods' starts or a zone's UTC times, as results record
                from kalmanscan.timeseries.time_zones import recorded_times

                times = recorded_times(times, z[dim].attrs, f"coordinate {dim!r}")
        if z.ndim == 2:
            other = z.dims[1 - axis % 2]
            if other in z.indexes:
                labels = column_labels(z.indexes[other])
        elif z.ndim == 1 and z.name is not None:  # one series, named as a pandas Series is
            labels = [z.name]
        z = z.values
    pd = sys.modules.get("pandas")  # a pandas object means pandas is imported: no import here
    if pd is not None and isinstance(z, (pd.Series, pd.DataFrame)):
        idx = z.index
        default = isinstance(idx, pd.RangeIndex) and idx.start == 0 and idx.step == 1
        if times is None and not default:  # (the default index 0, 1, ... is the default times)
            times = idx
        one = isinstance(z, pd.Series)
        frame = z.to_frame() if one else z
        # the column labels as given (integers stay integers); a named Series' name, as its
        # one-column frame's
        labels = ([z.name] if z.name is not None else None) if one else column_labels(z.columns)
        refusal = pandas_refusal("z", z, pd, times_hint=True)
        if refusal is not None:
            raise refusal
        # float32 columns (numpy's or pandas' nullable) stay float32, as in kalmanscan.filter
        f32 = all(str(d) in ("float32", "Float32") for d in frame.dtypes)
        z = frame.to_numpy(dtype=np.float32 if f32 else np.float64, na_value=np.nan)
        if one:
            z = z[:, 0]
        if axis != 0:
            raise ValueError(f"axis: pandas input has time on axis 0, got axis={axis}")
    pl = sys.modules.get("polars")
    if pl is not None and isinstance(z, pl.DataFrame):  # (no index: times come as times=)
        labels = list(z.columns)
        if axis != 0:
            raise ValueError(f"axis: polars input has time on axis 0, got axis={axis}")
    arr = as_real_numpy("z", z)
    arr = arr.astype(np.float32 if arr.dtype == np.float32 else np.float64)
    if arr.ndim == 0:
        raise ValueError("z: expected an array with a time axis (at least 1-D), got a scalar")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(
            f"axis: expected an int in [{-arr.ndim}, {arr.ndim - 1}] for z of shape {arr.shape}, "
            f"got {axis}"
        )
    arr = np.moveaxis(arr, axis, 0)
    if np.isinf(arr).any():
        i = tuple(
            int(k) for k in np.unravel_index(int(np.flatnonzero(np.isinf(arr))[0]), arr.shape)
        )
        raise ValueError(f"z: expected finite values or NaN (missing), got {arr[i]} at index {i}")
    if arr.shape[0] == 0:
        raise ValueError("z: expected at least one time step, got an empty time axis")
    return arr, times, labels
