"""Time axes: turn user timestamps into model time (float64, in ``time_unit`` steps).

A :class:`TimeAxis` keeps the labels the user gave (numbers or ``datetime64[ns]``) next to their
position ``t`` in model time units, measured from the first label. The OU parameters ``theta`` and
``sigma2`` are rates per model time unit: for numbers that unit is 1, for datetimes it is
``time_unit`` (default one day).
"""

from __future__ import annotations

import datetime as _dt
from typing import NamedTuple

import numpy as np

DEFAULT_DATETIME_UNIT = "1D"


class TimeAxis(NamedTuple):
    """Timestamps of one record.

    Fields:
        labels: ``[T]`` the user's timestamps, float64 or ``datetime64[ns]``.
        t: ``[T]`` float64 positions in model time units, ``t[0] == 0``.
        unit: ``None`` for numeric times, else the model time unit as ``timedelta64[ns]``.
        unit_name: how the unit is recorded in outputs (``"1"`` for numbers, e.g. ``"1D"``).
    """

    labels: np.ndarray
    t: np.ndarray
    unit: np.timedelta64 | None
    unit_name: str

    @property
    def is_datetime(self) -> bool:
        return self.unit is not None

    @property
    def dt(self) -> np.ndarray:
        """``[T]`` step lengths in model units; the first is 0 (the prior sits at ``labels[0]``)."""
        return np.diff(self.t, prepend=self.t[:1]) if len(self.t) else self.t.copy()

    def position(self, labels, name: str = "at") -> np.ndarray:
        """Model-time positions of other labels of the same kind (e.g. forecast times)."""
        arr = _labels_array(labels, name)
        if self.is_datetime:
            if arr.dtype.kind != "M":
                raise TypeError(
                    f"{name}: expected datetimes like the record's times, got values of dtype "
                    f"{arr.dtype}"
                )
            return (arr - self.labels[0]) / self.unit
        if arr.dtype.kind not in "iuf":
            raise TypeError(
                f"{name}: expected numbers like the record's times, got dtype {arr.dtype}"
            )
        origin = self.labels[0] if len(self.labels) else 0.0
        return arr.astype(np.float64) - origin

    def step(self):
        """Typical spacing in label units: the median positive step (1 if there is none)."""
        d = np.diff(self.t)
        d = d[d > 0]
        med = float(np.median(d)) if d.size else 1.0
        if self.is_datetime:
            ns = int(round(med * (self.unit / np.timedelta64(1, "ns"))))
            return np.timedelta64(ns, "ns")
        return med

    def future(self, steps: int) -> np.ndarray:
        """``steps`` labels after the last one, spaced by :meth:`step`."""
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps: expected a positive integer, got {steps!r}")
        k = np.arange(1, steps + 1)
        last = self.labels[-1]
        step = self.step()
        if self.is_datetime:
            return last + k * step
        return last + k.astype(np.float64) * step


def parse_time_unit(time_unit) -> tuple[np.timedelta64, str]:
    """``time_unit`` (``"D"``, ``"12h"``, ``"365.25D"``, timedelta64, timedelta) -> (ns, name)."""
    if time_unit is None:
        time_unit = DEFAULT_DATETIME_UNIT
    name = str(time_unit)
    if isinstance(time_unit, (np.timedelta64, _dt.timedelta)):
        name = None
    if isinstance(time_unit, np.timedelta64):
        td = time_unit.astype("timedelta64[ns]")
    elif isinstance(time_unit, _dt.timedelta):
        td = np.timedelta64(int(round(time_unit.total_seconds() * 1e9)), "ns")
    elif isinstance(time_unit, str):
        try:
            import pandas as pd

            td = np.timedelta64(pd.Timedelta(time_unit).value, "ns")
        except (ImportError, ValueError) as err:
            raise ValueError(
                "time_unit: expected a duration such as '1D', '12h' or '365.25D', got "
                f"{time_unit!r}"
            ) from err
    else:
        raise TypeError(
            f"time_unit: expected a string, numpy.timedelta64 or datetime.timedelta, got "
            f"{type(time_unit).__name__}"
        )
    if not td > np.timedelta64(0, "ns"):
        raise ValueError(f"time_unit: expected a positive duration, got {time_unit!r}")
    return td, name or _unit_name(td)


def _unit_name(td: np.timedelta64) -> str:
    ns = int(td / np.timedelta64(1, "ns"))
    for suffix, size in (
        ("D", 86400 * 10**9),
        ("h", 3600 * 10**9),
        ("min", 60 * 10**9),
        ("s", 10**9),
    ):
        if ns % size == 0:
            return f"{ns // size}{suffix}"
    return f"{ns}ns"


def _labels_array(times, name: str) -> np.ndarray:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is an optional extra
        pd = None
    if pd is not None and isinstance(times, (pd.Index, pd.Series)):
        if isinstance(times.dtype, pd.DatetimeTZDtype):
            times = times.tz_convert("UTC").tz_localize(None)
        arr = np.asarray(times)
    elif hasattr(times, "detach") and hasattr(times, "cpu"):  # torch tensor
        arr = times.detach().cpu().numpy()
    else:
        arr = np.asarray(times)
    if arr.dtype.kind in "OUS":
        if pd is None:
            raise TypeError(f"{name}: got strings or objects; pass numbers or numpy datetime64")
        try:
            parsed = pd.to_datetime(arr.ravel(), format="mixed").tz_localize(None)
            arr = np.asarray(parsed).reshape(arr.shape)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{name}: could not read the values as timestamps ({err})") from err
    if arr.dtype.kind == "M":
        arr = arr.astype("datetime64[ns]")
    elif arr.dtype.kind in "iub":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected numbers or datetimes, got values of dtype {arr.dtype}")
    return np.atleast_1d(arr)


def as_time_axis(times, n: int, time_unit=None, name: str = "times") -> TimeAxis:
    """Check and convert ``times`` for a record of ``n`` steps.

    Args:
        times: ``None`` (steps ``0, 1, ..., n-1``), ``[n]`` numbers, numpy ``datetime64`` values, a
            pandas ``DatetimeIndex``/``Series`` or timestamp strings. Non-decreasing, no NaN/NaT.
        n: number of time steps of the record.
        time_unit: model time unit for datetimes (default ``"1D"``); must be ``None`` for numbers.

    >>> import numpy as np
    >>> ax = as_time_axis(np.array(["2024-01-01", "2024-01-03"], dtype="datetime64[D]"), 2)
    >>> ax.t.tolist(), ax.unit_name
    ([0.0, 2.0], '1D')
    """
    if times is None:
        if time_unit is not None:
            raise ValueError("time_unit: only meaningful with datetime times, but times is None")
        labels = np.arange(n, dtype=np.float64)
        return TimeAxis(labels, labels.copy(), None, "1")
    labels = _labels_array(times, name)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"{name}: expected {n} timestamps (one per step of the time axis), got shape "
            f"{labels.shape}"
        )
    if labels.dtype.kind == "M":
        if np.isnat(labels).any():
            i = int(np.flatnonzero(np.isnat(labels))[0])
            raise ValueError(f"{name}: expected valid datetimes, got NaT at position {i}")
        unit, unit_name = parse_time_unit(time_unit)
        t = (labels - labels[0]) / unit if n else np.zeros(0)
    else:
        if time_unit is not None:
            raise ValueError(
                "time_unit: only meaningful with datetime times; numeric times are already in "
                "model "
                f"units (got time_unit={time_unit!r})"
            )
        if not np.isfinite(labels).all():
            i = int(np.flatnonzero(~np.isfinite(labels))[0])
            raise ValueError(f"{name}: expected finite numbers, got {labels[i]} at position {i}")
        unit, unit_name = None, "1"
        t = labels - labels[0] if n else np.zeros(0)
    t = np.asarray(t, dtype=np.float64)
    steps = np.diff(t)
    if (steps < 0).any():
        i = int(np.flatnonzero(steps < 0)[0]) + 1
        raise ValueError(
            f"{name}: expected non-decreasing timestamps, got {labels[i]} after {labels[i - 1]} "
            f"(position {i}); sort the record by time first"
        )
    return TimeAxis(labels, t, unit, unit_name)
