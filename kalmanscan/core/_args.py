"""Argument conversion and checks at the public boundary.

Kernels and inner loops assume valid input.

Every message names the argument, what was expected and what was received.
"""

from __future__ import annotations

import decimal
import functools
import math
import numbers
import sys
import warnings

import numpy as np
import torch

_FLOAT_TORCH = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return (
            f"torch.Tensor(dtype={value.dtype}, shape={tuple(value.shape)}, device={value.device})"
        )
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray(dtype={value.dtype}, shape={value.shape})"
    return f"{type(value).__name__} {value!r}"[:200]


class Converter:
    """Turn named user inputs into tensors of one dtype and device and back.

    torch mode (any input is a tensor): results stay tensors on that device. Otherwise inputs are
    converted from numpy/Python and results come back as numpy arrays.
    ``dtype_from`` names the input whose floating dtype sets the working dtype (integer numpy data
    becomes float64, half precision computes in float32); without it float64 wins over float32.
    A float64 value the working dtype would change in meaning (:func:`rounded_away`) is refused
    naming the input: numpy and Python values here, tensors by :meth:`check_rounding` once a range
    check fails (:meth:`tensor` makes them NaN, on the device, with no readback).
    """

    def __init__(self, values: dict, dtype_from: str | None = None):
        self.values = values
        self.arrays = {}
        z = values.get("z")
        for name, value in values.items():
            if value is None or isinstance(value, torch.Tensor) or _plain_number(value):
                continue  # (a plain number becomes a tensor when asked for: tensor())
            if name != "z" and z is not None:  # pandas / xarray parameters of pandas / xarray z
                value = align_labels(name, value, z)
            # (NaN in z is missing data; a parameter has no missing values)
            self.arrays[name] = as_real_numpy(name, value, missing_ok=name == "z")
        tensors = {n: v for n, v in values.items() if isinstance(v, torch.Tensor)}
        self.torch_mode = bool(tensors)
        self.device = torch.device("cpu")
        if tensors:
            first_name, first = next(iter(tensors.items()))
            self.device = first.device
            for name, t in tensors.items():
                if t.device != first.device:
                    raise ValueError(
                        f"{name}: expected a tensor on {first.device} (the device of "
                        f"{first_name}), got one on {t.device}"
                    )
                if t.dtype not in _FLOAT_TORCH:
                    raise TypeError(
                        f"{name}: expected a floating-point tensor (float32 or float64), "
                        f"got {t.dtype}"
                    )
            if first.is_meta:  # (all on one device)
                raise ValueError(_meta_message(first_name))
        self.dtype = self._working_dtype(dtype_from)
        self.dtype_from = dtype_from
        if self.dtype != torch.float64:  # host values checked here, tensors by check_rounding
            for name, value in values.items():
                if name != dtype_from and not isinstance(value, torch.Tensor):
                    self._refuse_rounding(name, self.arrays.get(name, value))

    def _refuse_rounding(self, name, x) -> None:
        """:func:`refuse_rounding` in the working dtype."""
        refuse_rounding(name, x, self.dtype, self.dtype_from)

    def check_rounding(self) -> None:
        """:func:`check_rounding` of the tensor inputs (:meth:`tensor` gives NaN where a value
        changes meaning, which the range checks flag; this reads the values back, so it runs only
        once a check has failed)."""
        check_rounding(self.values, self.dtype, self.dtype_from)

    def _dtype_of(self, name):
        v = self.values[name]
        if isinstance(v, torch.Tensor):
            return v.dtype
        if _plain_number(v):
            return torch.float64  # as numpy reads a Python int or float
        a = self.arrays[name]
        return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}.get(
            a.dtype, torch.float64
        )

    def _working_dtype(self, dtype_from):
        if dtype_from is not None:
            dt = self._dtype_of(dtype_from)
            return (
                torch.float64
                if dt is None
                else (torch.float32 if dt in (torch.float16, torch.bfloat16) else dt)
            )
        found = set()
        for name, v in self.values.items():
            # Python numbers are weak (they take the arrays' dtype); numpy scalars and arrays count
            if v is None or isinstance(v, (int, float)):
                continue
            found.add(self._dtype_of(name))
        if torch.float64 in found or not found:
            return torch.float64
        return torch.float32

    def tensor(self, name) -> torch.Tensor:
        v = self.values[name]
        if v is None:
            raise TypeError(f"{name}: expected a real number or array of real numbers, got None")
        if isinstance(v, torch.Tensor):
            # a lazily negated or conjugated view must be materialized: kernels read raw memory
            v = v.resolve_neg().resolve_conj()
            return v if v.dtype == self.dtype else narrowed(name, v, self.dtype)
        if _plain_number(v):
            return torch.tensor(float(v), dtype=self.dtype, device=self.device)
        a = self.arrays[name]
        if (
            not a.flags.writeable
        ):  # read-only views (np.broadcast_to): kalmanscan never writes to inputs
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.as_tensor(a, dtype=self.dtype, device=self.device)
        return torch.as_tensor(a, dtype=self.dtype, device=self.device)

    def out(self, t: torch.Tensor):
        if self.torch_mode:
            return t
        a = t.detach().cpu().numpy()
        return a[()] if a.ndim == 0 else a


def float64_on(x, device) -> torch.Tensor:
    """``x`` as a float64 tensor on ``device``; a tensor keeps its autograd graph (``.to``)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), device=device)


def _plain_number(value) -> bool:
    """A Python ``int`` or ``float``, or a numpy ``float64`` scalar (a ``float``: the same
    number, and weak in the working dtype as a ``float`` is), that a float64 holds: converted
    without numpy (not a bool, nor another numpy scalar, whose dtype counts).

    >>> _plain_number(0.5), _plain_number(np.float64(0.5)), _plain_number(np.float32(0.5))
    (True, True, False)
    """
    t = type(value)
    return t is float or t is np.float64 or (t is int and -(2**63) <= value < 2**63)


# What a parameter's value means once the working dtype rounds it to 0 (key True) or to inf
# (False), where that differs from the value given. Rounding to 0 changes the model only where
# 0 is a value of its own: elsewhere (offset, prior_mean, process_var, prior_var, init.eta)
# 0 is the limit of the tiny values, whose results agree to the last digit, so it is ordinary
# rounding. Every finite value that becomes inf is refused.
_ROUNDED_MEANING = {
    ("decay", True): "decay 0 forgets the state",
    ("loading", True): "loading 0: the step is not observed",
    ("obs_var", True): "obs_var must be > 0",
    ("init.lam", True): "init.lam 0: no information",
    ("obs_var", False): "obs_var inf: the step is not observed",
    ("prior_var", False): "prior_var inf: a diffuse prior",
    # kalmanscan.dense, where an exact 0 in any matrix is structural (docs/dense.md): zeros of F
    # and H decide which diffuse directions are resolved or forgotten (from the structure, not
    # the magnitudes) and, with those of Q, R and the prior, which states are coupled
    # (singular.state_blocks); a covariance's 0 makes a direction known exactly (precision inf,
    # an entry of innovation variance 0 adds nothing to the log-likelihood where a tiny one adds
    # its density); prior_precision's 0 is diffuse. offset and prior_mean: 0 is ordinary.
    ("F", True): "F 0: no transition through that entry",
    ("H", True): "H 0: not observed through that state",
    ("Q", True): "Q 0: no process noise there, a direction can be known exactly",
    ("R", True): "R 0: an exact observation, or uncorrelated entries",
    ("prior_cov", True): "prior_cov 0: a direction known exactly",
    ("prior_precision", True): "prior_precision 0: a diffuse direction",
    ("prior_cov", False): "prior_cov inf: a diffuse state",
}
_ZERO_MATTERS = frozenset(name for name, zero in _ROUNDED_MEANING if zero)


@functools.cache
def _rounding_limits(dtype: torch.dtype) -> tuple:
    """``(to_zero, to_inf)``: a float64 of magnitude at most ``to_zero`` becomes 0 in ``dtype``
    (half the smallest subnormal: ties go to the even 0) and one of at least ``to_inf`` becomes
    inf (the midpoint between the maximum and the next power of two)."""
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps / 2, math.ldexp(1 - fi.eps / 4, math.frexp(fi.max)[1])


def rounded_away(name, x, dtype: torch.dtype):
    """Where the float64 values ``x`` (a Python number, numpy array or tensor: the same type
    comes back, as booleans) change meaning in ``dtype``: a finite value that becomes inf, or,
    for a parameter whose 0 means something of its own (decay, loading, obs_var, init.lam; the
    dense F, H, Q, R, prior_cov, prior_precision), a nonzero value that becomes 0. Digits lost
    to ordinary rounding do not count.

    >>> rounded_away("decay", np.array([1e-50, 1e-30, 1e40, np.inf]), torch.float32).tolist()
    [True, False, True, False]
    >>> rounded_away("offset", 1e-50, torch.float32)
    False
    """
    to_zero, to_inf = _rounding_limits(dtype)
    ax = abs(x)
    bad = (ax >= to_inf) & (ax < math.inf)
    if name in _ZERO_MATTERS:
        bad = bad | (ax > 0) & (ax <= to_zero)
    return bad


def narrowed(name, t: torch.Tensor, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The tensor ``t`` cast to ``dtype`` (and ``device``), NaN where a float64 value changes
    meaning there (:func:`rounded_away`): no readback; the range checks flag the NaN and
    :func:`check_rounding` names the value."""
    out = t.to(dtype=dtype, device=device)
    if t.dtype == torch.float64 != dtype:
        out = torch.where(rounded_away(name, t.detach(), dtype).to(out.device), math.nan, out)
    return out


def refuse_rounding(name, x, dtype: torch.dtype, dtype_from: str | None) -> None:
    """Raise the :func:`rounding_message` error where ``x`` (numpy or a Python number, as
    given) has a value ``dtype`` turns into another meaning (:func:`rounded_away`)."""
    if x is None or isinstance(x, np.ndarray) and x.dtype != np.float64:
        return  # (integers and narrower floats: none rounds to 0 or reaches inf)
    mask = rounded_away(name, x, dtype)
    if isinstance(x, np.ndarray):
        if mask.any():
            idx = tuple(int(k) for k in np.argwhere(mask)[0])
            raise ValueError(rounding_message(name, float(x[idx]), idx, dtype, dtype_from))
    elif mask:
        raise ValueError(rounding_message(name, float(x), (), dtype, dtype_from))


def check_rounding(values: dict, dtype: torch.dtype, dtype_from: str | None) -> None:
    """Raise the :func:`rounding_message` error for a float64 tensor of ``values`` (name ->
    input) with a value ``dtype`` turns into another meaning: a readback, for once a check
    has failed (the cast makes those values NaN on the device, with no readback)."""
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.dtype == torch.float64 != dtype:
            bad = first_bad(rounded_away(name, v.detach(), dtype))
            if bad is not None:
                raise ValueError(rounding_message(name, v[bad].item(), bad, dtype, dtype_from))


def rounding_message(name, value: float, idx: tuple, dtype: torch.dtype, dtype_from) -> str:
    """The refusal of a float64 ``value`` (at ``idx`` of ``name``) that ``dtype``, the dtype of
    the input ``dtype_from`` (None: of the inputs), rounds to 0 or inf with another meaning."""
    dt = str(dtype).replace("torch.", "")
    src = dtype_from
    whose = f"{src}'s dtype, the computation's" if src else "the computation's dtype"
    to = 0.0 if abs(value) < 1 else math.copysign(math.inf, value)
    meaning = _ROUNDED_MEANING.get((name, to == 0), f"{name} must be finite")
    at = f" at index {idx}" if idx else ""
    remedy = f"pass {src} as float64" if src else "pass float64 inputs"
    return (
        f"{name}: expected values {dt} holds ({whose}), got {value!r}{at}, which {dt} "
        f"rounds to {to} ({meaning}); {remedy}, or rescale the data and model so that "
        f"{dt} holds the value"
    )


def _meta_message(name) -> str:
    return f"{name}: expected a tensor with data, got one on the meta device"


def as_real_numpy(name, value, *, missing_ok: bool = True) -> np.ndarray:
    """``value`` as a numpy array of real numbers that torch can wrap, or a ``TypeError``.

    The one conversion every entry point uses: masked elements (``numpy.ma``, e.g. netCDF fill
    values) and pandas' ``NA`` in nullable ``Int64``/``Float64`` columns become NaN (missing
    data; with ``missing_ok=False``, for a parameter, a masked element is refused as a
    ``ValueError`` naming its index); integer data become float64 with or without a mask;
    big-endian arrays are byte-swapped and negatively
    strided views (``z[::-1]``) copied; strings, bytes, objects (e.g. a list holding ``None``:
    the message says how to convert it), booleans, complex numbers, extended precision
    (``longdouble``), datetimes and timedeltas are refused, naming ``name``.

    >>> as_real_numpy("z", np.ma.masked_array([1.0, -999.0], mask=[0, 1])).tolist()
    [1.0, nan]
    >>> as_real_numpy("z", np.arange(3.0)[::-1]).tolist()
    [2.0, 1.0, 0.0]
    >>> import pandas as pd
    >>> as_real_numpy("z", pd.Series([1, None], dtype="Int64")).tolist()
    [1.0, nan]
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{name}: expected a real number or array of real numbers, got {_describe(value)}"
        )
    given = value  # (a pandas object's refusal names its column, not its repr)
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(
                f"{name}: expected a real number or array of real numbers, got {_describe(value)}"
            )
        if value.is_meta:
            raise ValueError(_meta_message(name))
        value = value.detach().resolve_neg().resolve_conj().cpu().numpy()
    pd = sys.modules.get("pandas")  # a pandas object means pandas is imported: no import here
    if pd is not None and isinstance(value, (pd.Series, pd.DataFrame, pd.Index)):
        value = _pandas_values(value, pd)
    pl = sys.modules.get("polars")  # as pandas: a polars object means polars is imported
    if pl is not None and isinstance(value, (pl.Series, pl.DataFrame)):
        value = polars_values(name, value, pl)
    elif pl is not None and isinstance(value, pl.LazyFrame):
        raise TypeError(
            f"{name}: expected data, got a polars LazyFrame (a query not yet run); run it "
            "first with .collect()"
        )
    try:
        if isinstance(value, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(value)
            a = np.asarray(np.ma.getdata(value))
            if a.dtype.kind in "iuf" and mask.any():
                if not missing_ok:
                    a = None
                else:
                    # integers as float64, as without a mask (float16 computes in float32)
                    kind = a.dtype.kind
                    to = np.float64 if kind in "iu" else np.result_type(a.dtype, np.float32)
                    a = np.where(mask, np.nan, a.astype(to))
        else:
            a = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(
            f"{name}: expected a real number or array of real numbers, "
            f"got {_describe(value)} ({exc})"
        ) from None
    if a is None:  # a masked parameter
        idx = tuple(int(k) for k in np.argwhere(mask)[0])
        raise ValueError(
            f"{name}: expected a number at every index (a parameter has no missing values), "
            f"got a masked value at index {idx}"
        )
    if (
        a.dtype.kind not in "iuf"
        and pd is not None
        and isinstance(given, (pd.Series, pd.DataFrame))
    ):
        refusal = pandas_refusal(name, given, pd, missing_ok=missing_ok)
        if refusal is not None:
            raise refusal
    if a.dtype.kind == "O":
        raise _object_refusal(name, value, a)
    if a.dtype.kind == "f" and a.dtype.itemsize > 8:
        raise TypeError(
            f"{name}: expected float16, float32 or float64 numbers, got {_describe(value)}: "
            "extended precision, which no backend computes in; convert it with "
            f"np.asarray({name}, dtype=np.float64) (rounded to float64, and inf beyond its range)"
        )
    if a.dtype.kind not in "iuf":
        raise TypeError(
            f"{name}: expected a real number or array of real numbers, got {_describe(value)}"
        )
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if any(st < 0 for st in a.strides):
        a = a.copy()
    return a


def check_dataarray_time_axis(z, axis) -> None:
    """Refuse an xarray ``DataArray`` whose time dim is not the one on ``axis``: a dim named
    ``time``, else the only dim indexed by dates, elsewhere. (``axis`` counts positions, so
    ``dims=("station", "time")`` with the default ``axis=0`` filtered 3 stations as 3 steps of
    50 series, silently.) Nothing for other inputs or an int ``axis`` out of range (refused
    where it is used).

    >>> import numpy as np, xarray as xr
    >>> da = xr.DataArray(np.zeros((3, 5)), dims=("station", "time"))
    >>> check_dataarray_time_axis(da, 0)
    Traceback (most recent call last):
    ...
    ValueError: axis: z is a DataArray of dims ('station', 'time') whose time dim 'time' is ...
    """
    xr = sys.modules.get("xarray")  # an xarray object means xarray is imported: no import here
    if xr is None or not isinstance(z, xr.DataArray) or z.ndim < 2:
        return
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        return
    if not -z.ndim <= axis < z.ndim:
        return
    dims = list(z.dims)
    if "time" in dims:
        tdim = "time"
    else:
        import pandas as pd

        dated = [
            d for d in dims
            if d in z.indexes
            and (isinstance(z.indexes[d], pd.DatetimeIndex) or type(z.indexes[d]).__name__
                 == "CFTimeIndex")
        ]  # fmt: skip
        if len(dated) != 1:
            return
        tdim = dated[0]
    at = dims.index(tdim)
    if at == axis % z.ndim:
        return
    raise ValueError(
        f"axis: z is a DataArray of dims {tuple(z.dims)} whose time dim {tdim!r} is axis {at}, "
        f"but axis={int(axis)} is its dim {dims[axis]!r}; pass axis={at} (or "
        f"da.transpose({tdim!r}, ...)), or use the accessor, da.kalman.filter(...), which takes "
        "time_dim"
    )


def pandas_refusal(name, value, pd, *, missing_ok: bool = True, times_hint: bool = False):
    """The ``TypeError`` for a pandas ``Series`` or ``DataFrame`` with a column that holds no
    real numbers (text, booleans, datetimes, complex numbers, objects), naming that column (a
    DataFrame's) or the Series and its dtype; ``None`` where every column is numeric.
    ``times_hint``: a datetime column of a DataFrame is told how to become the times.

    >>> import pandas as pd
    >>> str(pandas_refusal("z", pd.DataFrame({"y": [1.0], "s": [True]}), pd))
    "z: expected numeric columns (NaN = missing), got column 's' of dtype bool"
    >>> str(pandas_refusal("z", pd.Series([1 + 2j], name="w"), pd))
    "z: expected numeric values (NaN = missing), got Series 'w' of dtype complex128"
    """
    types = pd.api.types
    one = isinstance(value, pd.Series)
    items = [(value.name, value.dtype)] if one else list(value.dtypes.items())
    for col, dtype in items:
        if (
            types.is_numeric_dtype(dtype)
            and not types.is_bool_dtype(dtype)
            and not types.is_complex_dtype(dtype)
        ):
            continue
        missing = " (NaN = missing)" if missing_ok else ""
        if one:
            what = "a Series" if col is None else f"Series {col!r}"
            return TypeError(
                f"{name}: expected numeric values{missing}, got {what} of dtype {dtype}"
            )
        hint = ""
        if times_hint and types.is_datetime64_any_dtype(dtype):
            hint = f"; to use it as the times, make it the index (df.set_index({col!r}))"
        return TypeError(
            f"{name}: expected numeric columns{missing}, got column {col!r} of dtype {dtype}{hint}"
        )
    return None


def labels_index(labels, pd):
    """Series labels (a list, as ``OUFit.series_labels`` holds them) as a pandas Index: a
    ``MultiIndex`` for tuples of one length (with the level ``names`` a list of them carries,
    e.g. :class:`~kalmanscan.timeseries.model_input.SeriesNames`), else a flat Index.

    >>> import pandas as pd
    >>> labels_index([("a", 1), ("b", 2)], pd).nlevels, labels_index([10, 20], pd).tolist()
    (2, [10, 20])
    """
    names = getattr(labels, "names", None)
    labels = list(labels)
    if labels and all(isinstance(x, tuple) for x in labels) and len({len(x) for x in labels}) == 1:
        return pd.MultiIndex.from_tuples(labels, names=names)
    return pd.Index(labels, tupleize_cols=False)


def align_labels(name, value, data, order=None):
    """``value`` (a parameter) matched to the labels of ``data`` (the observations) where both
    carry labels, so that numpy broadcasting then pairs each value with its own series and step;
    ``value`` unchanged otherwise (it is used by position).

    - pandas ``data``: a ``Series`` parameter whose index holds ``data``'s column labels is taken
      per column (``[S]``), one whose index holds ``data``'s index per row (``[T, 1]`` for a
      DataFrame; a time-varying value), reordered to ``data``'s order (extra labels dropped); a
      ``DataFrame`` parameter is reordered on both axes. pandas' default labels ``0, 1, ...``
      (whichever index class holds them) are labels where ``data``'s labels on that axis are
      others that they hold; facing default labels they are positions (the same count); naming
      none of ``data``'s labels, they are used by position. A ``Series`` that fits both axes
      (``T == N``) is refused, naming both readings; a default-labelled one of ``T`` values that
      fits neither is refused with the ``[T, 1]`` layout of one value per step.
    - xarray ``data``: a ``DataArray`` parameter over some of ``data``'s dims, reordered to its
      coordinates and laid out in ``order`` (default ``data.dims``) with length-1 axes for the
      dims it lacks (leading ones dropped, as numpy broadcasting adds them).

    Anything else raises a ``ValueError`` naming ``name``, the labels expected and those given.

    >>> import pandas as pd
    >>> z = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    >>> align_labels("obs_var", pd.Series({"b": 2.0, "a": 1.0}), z).tolist()
    [1.0, 2.0]
    """
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, (pd.Series, pd.DataFrame)):
        if isinstance(data, (pd.Series, pd.DataFrame)):
            return _align_pandas(name, value, data, pd)
        return value
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(value, xr.DataArray) and isinstance(data, xr.DataArray):
        return _align_xarray(name, value, data, tuple(order or data.dims))
    return value


def _labels_text(labels, limit: int = 5) -> str:
    shown = [repr(x.item() if hasattr(x, "item") else x) for x in list(labels[:limit])]
    more = f", ... ({len(labels)} labels)" if len(labels) > limit else ""
    return "[" + ", ".join(shown) + more + "]"


def labels_hold(given, wanted) -> bool:
    """Whether the labels ``given`` (a pandas Index) hold every label of ``wanted``, once each."""
    if given.equals(wanted):
        return True
    return bool(given.is_unique and wanted.isin(given).all())


def _default_labels(labels, pd) -> bool:
    """Whether ``labels`` are ``0, 1, ..., k-1`` in order: the labels pandas gives when none are
    (a ``RangeIndex``, or the same integers in an ``Index``: pandas picks either for them)."""
    if isinstance(labels, pd.RangeIndex):
        return labels.start == 0 and labels.step == 1
    if labels.dtype.kind not in "iu" or isinstance(labels, pd.MultiIndex):
        return False
    return bool(labels.equals(pd.RangeIndex(len(labels))))


def _fits(given, wanted, pd) -> bool:
    """Whether the labels ``given`` go to the data's labels ``wanted``: they equal them, or hold
    each of them once; default labels ``0, 1, ...`` on both sides are positions (the same count)."""
    if given.equals(wanted):
        return True
    if _default_labels(given, pd) and _default_labels(wanted, pd):
        return False  # (positions of another count)
    return labels_hold(given, wanted)


def _align_pandas(name, value, data, pd):
    frame = isinstance(data, pd.DataFrame)
    if isinstance(value, pd.DataFrame):
        if not frame:
            return value
        pairs = (("index", value.index, data.index), ("columns", value.columns, data.columns))
        keep = {}
        for axis, given, wanted in pairs:
            if given.equals(wanted):
                continue  # already in z's order
            if _default_labels(given, pd) and (
                _default_labels(wanted, pd) or not labels_hold(given, wanted)
            ):
                continue  # default labels naming none of z's: by position
            if not labels_hold(given, wanted):
                missing = wanted[~wanted.isin(given)]
                what = f"z's label {missing[0]!r} is missing" if len(missing) else "duplicates"
                raise ValueError(
                    f"{name}: expected a DataFrame whose {axis} holds z's {axis} "
                    f"{_labels_text(wanted)}, got {_labels_text(given)} ({what}); pass "
                    f"{name}.to_numpy() to use the values by position"
                )
            keep[axis] = wanted
        return value.reindex(**keep) if keep else value
    idx = value.index
    default = _default_labels(idx, pd)
    per_column = frame and _fits(idx, data.columns, pd)
    per_step = _fits(idx, data.index, pd)
    # default labels that name none of the columns: one value per column by position
    by_position = frame and default and not per_column and len(idx) == data.shape[1]
    if per_step and (per_column or by_position):
        T, N = data.shape
        raise ValueError(
            f"{name}: expected a Series whose index fits one axis of z, got index "
            f"{_labels_text(idx)}, which fits both z's columns {_labels_text(data.columns)} "
            f"(one value per column) and z's index {_labels_text(data.index)} (one value per "
            f"step); pass {name}.to_numpy() for one value per column, or "
            f"{name}.to_numpy()[:, None] (shape [T, 1] = ({T}, 1)) for one value per step"
        )
    if per_column or per_step:
        wanted = data.columns if per_column else data.index
        out = value if idx.equals(wanted) else value.reindex(wanted)
        return out.to_frame() if frame and not per_column else out
    if default:
        if frame and not by_position and len(idx) == data.shape[0]:
            T, N = data.shape
            raise ValueError(
                f"{name}: expected a Series of one value per column ({N} values, or indexed "
                f"by z's columns {_labels_text(data.columns)}) or indexed like z's index "
                f"{_labels_text(data.index)} (one value per step), got {T} values with the "
                f"default index 0, 1, ...; one value per step of a DataFrame is shape [T, 1]: "
                f"pass {name}.to_numpy()[:, None]"
            )
        return value  # default labels naming none of z's: used by position
    candidates = [("columns", data.columns)] if frame else []
    candidates.append(("index", data.index))
    where = " or ".join(f"z's {axis} {_labels_text(wanted)}" for axis, wanted in candidates)
    raise ValueError(
        f"{name}: expected a Series whose index holds {where}, got index {_labels_text(idx)}; "
        f"pass {name}.to_numpy() to use the values by position"
    )


def match_dims(name, value, data, dims, what: str = "dims"):
    """The DataArray ``value``, over some of ``dims`` (dims of the DataArray ``data``), matched to
    ``data`` along each: by label where both carry labels (in ``data``'s order; labels ``data``
    lacks are dropped; each of ``data``'s needs a value), else by position (the same size, or 1);
    else a ``ValueError`` naming ``name`` (and ``dims`` as the data's ``what``)."""
    extra = [d for d in value.dims if d not in dims]
    if extra:
        hint = ""
        if len(extra) == 1 and extra[0] in value.coords:
            hint = f"; select one, e.g. .sel({extra[0]}={value[extra[0]].values[0].item()!r})"
        raise ValueError(
            f"{name}: expected values over the data's {what} {tuple(dims)}, got dims "
            f"{value.dims}, with {tuple(extra)} the data lacks{hint}"
        )
    for d in value.dims:
        if d in data.indexes and d in value.indexes:
            given, wanted = value.indexes[d], data.indexes[d]
            if given.equals(wanted):
                continue
            if not labels_hold(given, wanted):
                missing = wanted[~wanted.isin(given)]
                if len(missing):
                    raise ValueError(
                        f"{name}: no value for {d}={missing[0]!r} (its labels are "
                        f"{_labels_text(given)})"
                    )
                raise ValueError(f"{name}: expected unique labels along {d!r}, got duplicates")
            value = value.sel({d: wanted})
        elif value.sizes[d] != data.sizes[d] and value.sizes[d] != 1:
            raise ValueError(
                f"{name}: expected {data.sizes[d]} values along {d!r} (the data's size), got "
                f"{value.sizes[d]}"
            )
    return value


def _align_xarray(name, value, data, order):
    value = match_dims(name, value, data, data.dims)
    if not value.dims:
        return value.values
    present = [d for d in order if d in value.dims]
    arr = np.asarray(value.transpose(*present).values)
    first = order.index(present[0])
    return arr.reshape([value.sizes[d] if d in value.dims else 1 for d in order[first:]])


def _pandas_values(value, pd):
    """A pandas object with nullable numeric columns (``Int64``, ``Float64``...: ``NA`` =
    missing) as float64 with NaN (float32 where every column is float32); others unchanged (numpy
    reads them, and refuses what is no number)."""
    dtypes = list(value.dtypes) if isinstance(value, pd.DataFrame) else [value.dtype]
    types = pd.api.types
    nullable = [
        not isinstance(d, np.dtype) and types.is_numeric_dtype(d) and not types.is_bool_dtype(d)
        for d in dtypes
    ]
    plain = [isinstance(d, np.dtype) and d.kind in "iuf" for d in dtypes]
    if not any(nullable) or not all(n or p for n, p in zip(nullable, plain, strict=True)):
        return value
    f32 = all(str(d) in ("float32", "Float32") for d in dtypes)
    return value.to_numpy(dtype=np.float32 if f32 else np.float64, na_value=np.nan)


def polars_values(name, value, pl) -> np.ndarray:
    """A polars ``Series`` or ``DataFrame`` of numeric columns as a float64 numpy array (float32
    where every column is ``Float32``), ``null`` and NaN both missing (NaN); a column of another
    kind is refused naming it. (numpy's own reading of a ``DataFrame`` turns a ``Date`` column
    into day numbers, read as data without a word.)

    >>> import polars as pl
    >>> polars_values("z", pl.DataFrame({"a": [1, None], "b": [0.5, 2.0]}), pl).tolist()
    [[1.0, 0.5], [nan, 2.0]]
    """
    frame = value.to_frame() if isinstance(value, pl.Series) else value
    for col, dtype in frame.schema.items():
        if not (dtype.is_numeric() or dtype == pl.Null):  # (Null: a column of nulls, missing)
            hint = ""
            if dtype.is_temporal():
                hint = (
                    f"; to use it as the times, pass it as times= and the data without it "
                    f"(times=df[{col!r}], z=df.drop({col!r}))"
                )
            raise TypeError(
                f"{name}: expected numeric columns (null or NaN = missing), got column {col!r} of "
                f"dtype {dtype}{hint}"
            )
    f32 = all(d == pl.Float32 for d in frame.schema.values())
    to = pl.Float32 if f32 else pl.Float64
    arr = frame.select(pl.all().cast(to)).to_numpy()  # (null -> NaN)
    arr = np.asarray(arr, dtype=np.float32 if f32 else np.float64)
    return arr[:, 0] if isinstance(value, pl.Series) else arr


def _object_refusal(name, value, a: np.ndarray) -> TypeError:
    """The error for an object array (numpy's reading of a list holding ``None``, ``Decimal``
    values, text...): objects are not read element by element, so the message says how to
    convert numbers, or names the first element that is no real number."""
    head = f"{name}: expected a real number or array of real numbers, got {_describe(value)}"
    big = None
    for i, v in enumerate(a.reshape(-1)):
        if big is None and isinstance(v, int) and not isinstance(v, bool):
            if not -(2**63) <= v < 2**63:
                big = tuple(int(k) for k in np.unravel_index(i, a.shape))
        number = isinstance(v, (numbers.Real, decimal.Decimal)) and not isinstance(v, bool)
        if not (v is None or number):
            idx = tuple(int(k) for k in np.unravel_index(i, a.shape))
            what = f"{type(v).__name__} {v!r}"[:80]
            return TypeError(f"{head[:300]}, whose element at index {idx} is {what}")
    if big is not None:  # (numpy holds an int beyond int64 only as a Python object)
        if a.ndim == 0:
            return TypeError(
                f"{name}: expected a real number or array of real numbers, got int "
                f"{_short(value)}, an integer beyond int64's range; pass it as a float "
                f"(float({name}))"
            )
        return TypeError(
            f"{head[:300]}, whose element at index {big} is an integer beyond int64's range; "
            f"convert it with np.asarray({name}, dtype=float)"
        )
    return TypeError(
        f"{head[:300]}: an array of Python objects; convert it with np.asarray({name}, "
        "dtype=float), which reads None as NaN (missing)"
    )


def _short(v: int) -> str:
    text = str(v)
    return text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text)} digits)"


def first_bad(mask: torch.Tensor):
    """Index tuple of the first True element of ``mask``, or None."""
    if not bool(mask.any()):
        return None
    idx = mask.nonzero()[0].tolist()
    return tuple(idx)


def ranges_ok(specs, flags=()) -> bool:
    """Whether every ``(tensor, lo, lo_open)`` in ``specs`` is finite, NaN-free and above ``lo``
    (``None``: no bound; strictly above where ``lo_open``), and every 0-d boolean tensor in
    ``flags`` is False: one small tensor of minima and maxima read back at once, so one device
    synchronization however many inputs. Callers run :func:`check_range` per input (which
    names the input, the index and the value) only when this returns False."""
    stats = []
    if flags:
        stats.append(torch.stack([f.reshape(()) for f in flags]).any().to(torch.float64))
    for t, _, _ in specs:
        x = t.detach()
        if x.numel() == 0:
            continue
        stats.extend(v.to(torch.float64) for v in torch.aminmax(x))
    if not stats:
        return True
    vals = torch.stack([v.reshape(()) for v in stats]).tolist()
    if flags and vals.pop(0) != 0:
        return False
    if not all(math.isfinite(v) for v in vals):  # NaN propagates to both extremes
        return False
    mins = iter(vals[0::2])
    for t, lo, lo_open in specs:
        if t.numel() == 0:
            continue
        mn = next(mins)
        if lo is not None and not (mn > lo if lo_open else mn >= lo):
            return False
    return True


def check_range(name, t, *, lo=None, lo_open=False, allow_inf=False, allow_nan=False, what=None):
    """Raise ValueError naming ``name`` unless every element satisfies the stated range."""
    x = t.detach()
    expect = what or _range_text(lo, lo_open, allow_inf)
    if x.numel() > 4096 and not allow_nan:
        # fast path for large arrays, one pass: NaN propagates to both extremes
        mn, mx = (float(v) for v in torch.aminmax(x))
        if (
            mn == mn
            and (allow_inf or (math.isfinite(mn) and math.isfinite(mx)))
            and (lo is None or (mn > lo if lo_open else mn >= lo))
        ):
            return
    elif x.numel() > 4096 and not allow_inf and lo is None:
        # NaN allowed: a finite nansum rules out inf
        if bool(torch.isfinite(x.nansum())):
            return

    def at(bad):  # (no index for a 0-d value: a single number)
        return f" at index {bad}" if bad else ""

    if not allow_nan:
        bad = first_bad(torch.isnan(x))
        if bad is not None:
            raise ValueError(f"{name}: expected {expect}, got NaN{at(bad)}")
    if not allow_inf:
        bad = first_bad(torch.isinf(x))
        if bad is not None:
            raise ValueError(f"{name}: expected {expect}, got {x[bad].item()}{at(bad)}")
    if lo is not None:
        bad = first_bad(x <= lo if lo_open else x < lo)
        if bad is not None:
            raise ValueError(f"{name}: expected {expect}, got {x[bad].item()!r}{at(bad)}")


def _range_text(lo, lo_open, allow_inf):
    parts = []
    if lo is not None:
        parts.append(f"values {'>' if lo_open else '>='} {lo:g}")
    else:
        parts.append("real values")
    parts.append("(inf allowed)" if allow_inf else "and finite")
    return " ".join(parts)


def broadcast_to(name, t: torch.Tensor, shape, target_desc) -> torch.Tensor:
    """Broadcast ``t`` to ``shape`` (numpy rules) or raise naming ``name``."""
    try:  # numpy's rules on the shape tuples (torch.broadcast_shapes imports sympy on first use)
        if np.broadcast_shapes(tuple(t.shape), tuple(shape)) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{name}: expected a shape that broadcasts to {target_desc} {tuple(shape)}, "
            f"got shape {tuple(t.shape)}"
        ) from None
    return t.expand(shape)


def broadcast_shapes(*shapes) -> torch.Size:
    """The shape ``shapes`` broadcast to, by numpy's rules on the tuples (``ValueError`` where
    they do not broadcast): ``torch.broadcast_shapes`` imports sympy on its first call (about a
    second of a first filter on the torch backends, through torch's symbolic shapes).

    >>> broadcast_shapes(torch.Size([5, 1]), (1, 3))
    torch.Size([5, 3])
    """
    return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))


def check_device(name, device):
    """``device`` (a ``torch.device``, its name such as ``"cuda:0"``, or ``None``) as a
    ``torch.device`` this torch can compute on (``None`` stays ``None``), or a ``ValueError``
    naming ``name``, what it takes and what it got, with torch's reason (a torch built without
    CUDA, a device index beyond the devices present).

    >>> check_device("device", "cpu"), check_device("device", None)
    (device(type='cpu'), None)
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{name}: expected a torch device such as 'cpu', 'cuda' or 'cuda:0' (or None for the "
            f"CPU), got {_describe(device) if not isinstance(device, str) else repr(device)}"
        ) from None
    if dev.type == "meta":
        raise ValueError(f"{name}: expected a device with data, got {str(dev)!r}")
    if dev.type != "cpu":
        try:
            torch.empty(0, device=dev)
        except Exception as exc:  # torch's AssertionError or RuntimeError, without the argument
            raise ValueError(
                f"{name}: expected a device this torch can use ('cpu'"
                + (", 'cuda'" if torch.cuda.is_available() else "")
                + f"), got {str(dev)!r}: {str(exc).strip() or type(exc).__name__}"
                + (" (torch.cuda.is_available() is False)" if dev.type == "cuda" else "")
            ) from None
    return dev


def check_int(name, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {_describe(value)}")
    return int(value)
