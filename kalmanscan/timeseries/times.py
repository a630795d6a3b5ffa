"""Time axes: turn user timestamps into model time (float64, in ``time_unit`` steps).

A :class:`TimeAxis` keeps the labels the user gave (float64 numbers, or ``datetime64`` at second,
millisecond, microsecond or nanosecond resolution) next to their position ``t`` in model time
units, measured from the first label. The OU parameters ``theta`` and ``sigma2`` are rates per
model time unit: for numbers that unit is 1, for datetimes it is ``time_unit`` (default one day).

Range and precision. Datetime labels keep the resolution they came with (coarser units such as
days become seconds), so any date numpy can hold works: years 0-9999 and beyond, not only the
1677-2262 window of nanosecond timestamps. ``t`` is computed from the integer labels without
forming a nanosecond difference (seconds and sub-seconds apart), so spans of any length give
``t`` to within one float64 rounding of the exact elapsed time: a relative error below 2.3e-16,
e.g. under 1e-9 days over 10,000 years of daily data. Numeric times are float64 and used as they
are (any size, as long as the span from first to last is finite in float64).

Strings are parsed with one format for the whole column, never row by row: ISO 8601 when every
value is ISO, else the one format (e.g. ``%d/%m/%Y``) that reads every value. When two formats
read every value differently (``03/04/1958``: day first or month first?) the dates are refused
with a message naming the ambiguity, unless ``dayfirst`` or an explicit ``time_format`` decides.
Times with a UTC offset (``2024-03-01T12:30+01:00``) are converted to UTC; a column mixing
times with and without an offset is refused. Quarter and month labels (``1959Q1``, ``1959M01``)
stand for the first day of their period. A column written in one ISO 8601 layout
(``2024-03-01 12:30:00``, years 1678-2261) is read in numpy at once (:func:`_parse_fixed_iso`),
giving what the general parse gives.

Duplicate timestamps are allowed here: two observations at the same time are two exact updates
of the same state (a step of length 0). ``kalmanscan filter`` refuses them (see docs/cli.md).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import numbers
import re
import warnings
from typing import NamedTuple

import numpy as np

DEFAULT_DATETIME_UNIT = "1D"
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_INT64_MAX = np.iinfo(np.int64).max


class TimeParseError(ValueError):
    """A timestamp that cannot be read; ``index`` is its 0-based position, ``value`` its text."""

    def __init__(self, message: str, index: int | None = None, value=None):
        super().__init__(message)
        self.index, self.value = index, value


class TimeAxis(NamedTuple):
    """Timestamps of one record.

    Fields:
        labels: ``[T]`` the user's timestamps, float64 or ``datetime64`` (s, ms, us or ns).
        t: ``[T]`` float64 positions in model time units, ``t[0] == 0``.
        unit: ``None`` for numeric times, else the model time unit as ``timedelta64[ns]``.
        unit_name: how the unit is recorded in outputs (``"1"`` for numbers, e.g. ``"1D"``).
        utc: the labels are UTC, converted from times that carried a timezone or UTC offset
            (the results Dataset's time coordinates then say ``time_zone = "UTC"``).
        tz: the one timezone the times were given in (a pandas tz-aware index, or datetimes all
            of one ``tzinfo``), else ``None``: forecast times follow its calendar and clock
            (:meth:`future`).
    """

    labels: np.ndarray
    t: np.ndarray
    unit: np.timedelta64 | None
    unit_name: str
    utc: bool = False
    tz: object = None

    @property
    def is_datetime(self) -> bool:
        return self.unit is not None

    @property
    def dt(self) -> np.ndarray:
        """``[T]`` step lengths in model units; the first is 0 (the prior sits at ``labels[0]``)."""
        return np.diff(self.t, prepend=self.t[:1]) if len(self.t) else self.t.copy()

    def position(self, labels, name: str = "at") -> np.ndarray:
        """Model-time positions of other labels of the same kind (e.g. forecast times).

        Where the record's times were converted to UTC (:attr:`utc`), times with a timezone are
        converted too and times without one are read as UTC; times with a timezone against a
        record without one are refused.
        """
        arr = self.labels_of(labels, name)
        if self.is_datetime:
            if arr.dtype.kind != "M":
                raise TypeError(
                    f"{name}: expected datetimes like the record's times, got values of dtype "
                    f"{arr.dtype}"
                )
            if np.isnat(arr).any():
                i = int(np.flatnonzero(np.isnat(arr))[0])
                raise ValueError(f"{name}: expected valid datetimes, got NaT at position {i}")
            return elapsed(arr, self.labels[0], self.unit)
        if arr.dtype.kind not in "iuf":
            raise TypeError(
                f"{name}: expected numbers like the record's times, got dtype {arr.dtype}"
            )
        origin = self.labels[0] if len(self.labels) else 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            pos = arr.astype(np.float64) - origin
        if not np.isfinite(pos).all():
            i = int(np.flatnonzero(~np.isfinite(pos))[0])
            raise ValueError(
                f"{name}: expected finite times whose distance from the first time {origin:g} "
                f"is finite in float64, got {arr.ravel()[i]:g}"
            )
        return pos

    def step(self):
        """Typical spacing in label units: the median positive step (1 if there is none).

        For datetimes, a ``timedelta64`` at the labels' resolution (at least one tick).
        """
        d = np.diff(self.t)
        d = d[d > 0]
        med = float(np.median(d)) if d.size else 1.0
        if self.is_datetime:
            res = _resolution(self.labels)
            ticks = med * (int(self.unit / np.timedelta64(1, "ns")) / _NS_PER[res])
            if not ticks < 0.9 * _INT64_MAX:
                raise ValueError(
                    f"times: the median step ({med:g} x {self.unit_name}) is too long for "
                    f"datetime64[{res}]"
                )
            return np.timedelta64(max(int(round(ticks)), 1), res)
        return med

    def labels_of(self, labels, name: str = "at") -> np.ndarray:
        """Other timestamps as this record's labels are (float64 or ``datetime64``, UTC where
        the record's are; see :meth:`position`), refusing times with a timezone against a
        record without one."""
        arr, zoned, _ = _labels_and_zone(labels, name)
        if zoned and not self.utc:
            raise ValueError(
                f"{name}: got times with a timezone or UTC offset, but the record's times have "
                f"none; give {name} without a timezone, in the record's own clock"
            )
        return arr

    def calendar_step(self) -> int | None:
        """The record's step in whole calendar months, where its dates are monthly, quarterly or
        yearly: every date on one day of its month (the same day, at most the 28th, or every one
        the month's last) at one time of day, and the median of the positive steps a whole
        number of months. ``None`` otherwise (numbers, fewer than two distinct dates, or days,
        weeks, hours...).

        >>> q = np.array(["1959-01-01", "1959-04-01", "1959-07-01"], dtype="datetime64[D]")
        >>> as_time_axis(q, 3).calendar_step()
        3
        >>> w = np.array(["2024-01-01", "2024-01-08", "2024-01-15"], dtype="datetime64[D]")
        >>> as_time_axis(w, 3).calendar_step() is None
        True

        Times given in a timezone (:attr:`tz`) are judged on its local calendar.
        """
        if not self.is_datetime:
            return None
        return _calendar_step(_month_parts(self._local() if self.tz is not None else self.labels))

    def _local(self) -> np.ndarray:
        """The labels (UTC) on the clock of :attr:`tz`, as naive datetimes."""
        return _utc_to_local(self.labels, self.tz)

    def future(self, steps: int) -> np.ndarray:
        """``steps`` labels after the last one: by :meth:`calendar_step` months where the dates
        are monthly, quarterly or yearly (staying on their day of the month, or on month ends),
        else spaced by :meth:`step`.

        Datetime labels that would leave the range of the labels' resolution are made at a
        coarser one (microseconds: +-290,000 years; seconds beyond that).

        Times given in a timezone (:attr:`tz`) step on its local calendar and clock where they
        sit at one local time of day a whole number of days or months apart (monthly data stay on
        the first of the month, daily data at local midnight, across daylight-saving changes);
        the results are UTC like the labels.

        >>> q = np.array(["2008-10-01", "2009-01-01", "2009-04-01"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(q, 3).future(3)]
        ['2009-07-01', '2009-10-01', '2010-01-01']
        >>> e = np.array(["2024-01-31", "2024-02-29", "2024-03-31"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(e, 3).future(2)]
        ['2024-04-30', '2024-05-31']
        """
        steps = check_steps(steps)
        k = np.arange(1, steps + 1)
        if self.tz is not None and self.is_datetime:
            out = _future_local(self, k)
            if out is not None:
                return out
        last = self.labels[-1]
        parts = _month_parts(self.labels) if self.is_datetime else None
        months = _calendar_step(parts)
        if months is not None:
            return _calendar_future(parts, months, k, self.labels)
        step = self.step()
        if not self.is_datetime:
            out = last + k.astype(np.float64) * step
            if not np.isfinite(out).all():
                raise ValueError(
                    f"steps: {steps} steps of {step:g} after {last:g} leave the float64 range"
                )
            return out
        res = _resolution(self.labels)
        step_ns = float(step.astype(np.int64)) * _NS_PER[_resolution_td(step)]
        sec, sub = _split_ns(np.asarray([last]))
        last_ns = float(sec[0]) * 1e9 + float(sub[0])
        end_ns = last_ns + float(steps) * step_ns
        for r in [x for x in ("ns", "us", "ms", "s") if _NS_PER[x] >= _NS_PER[res]]:
            if max(abs(last_ns), abs(end_ns)) / _NS_PER[r] < 0.9 * _INT64_MAX:
                res = r
                break
        else:
            raise ValueError(
                f"steps: {steps} steps of {step} after {last} leave the range of datetime64"
            )
        step_r = max(int(round(step_ns / _NS_PER[res])), 1)
        return last.astype(f"datetime64[{res}]") + k * np.timedelta64(step_r, res)


def _utc_to_local(labels: np.ndarray, tz) -> np.ndarray:
    """UTC datetimes ``labels`` on the clock of ``tz`` (naive, at the labels' resolution)."""
    import pandas as pd

    local = pd.DatetimeIndex(labels).tz_localize("UTC").tz_convert(tz).tz_localize(None)
    return np.asarray(local.to_numpy()).astype(labels.dtype)


def _local_to_utc(local: np.ndarray, tz, like: np.ndarray) -> np.ndarray:
    """Naive local times of ``tz`` as UTC datetimes at ``like``'s resolution where it holds them
    exactly (a time the clock skips moves forward past the gap; a repeated one is the standard-
    time one)."""
    import pandas as pd

    idx = pd.DatetimeIndex(local).tz_localize(
        tz, ambiguous=np.zeros(local.size, bool), nonexistent="shift_forward"
    )
    out = np.asarray(idx.tz_convert("UTC").tz_localize(None).to_numpy())
    coarse = out.astype(like.dtype)
    return coarse if (coarse == out).all() else _normalize_datetimes(out)


def _future_local(axis: TimeAxis, k: np.ndarray):
    """:meth:`TimeAxis.future` on the local calendar of ``axis.tz``: by calendar months, or by
    a whole number of days where the local times sit at one time of day; ``None`` otherwise (then
    the steps are physical ones, in UTC)."""
    try:
        local = axis._local()
    except (ValueError, OverflowError, TypeError):  # (outside pandas' range: UTC steps)
        return None
    parts = _month_parts(local)
    months = _calendar_step(parts)
    if months is not None:
        fut = _calendar_future(parts, months, k, local)
    else:
        if local.size < 2:
            return None
        days = local.astype("datetime64[D]")
        tod = local - days.astype(local.dtype)
        steps = np.diff(days).astype(np.int64)
        steps = steps[steps > 0]
        if (tod != tod[0]).any() or not steps.size:
            return None
        med = float(np.median(steps))
        if med != int(med):
            return None
        fut = local[-1] + k * np.timedelta64(int(med), "D").astype(
            f"timedelta64[{_resolution(local)}]"
        )
    try:
        return _local_to_utc(fut, axis.tz, axis.labels)
    except (ValueError, OverflowError):
        return None


def _month_parts(labels: np.ndarray):
    """``(months since 1970 as int64, day-of-month rule, time of day)`` of datetimes that all sit
    on one day of their month (a day of at most 28, or the month's last: rule ``-1``) at one time
    of day; ``None`` for any other datetimes and for fewer than two of them."""
    if labels.size < 2 or labels.dtype.kind != "M":
        return None
    try:
        days = labels.astype("datetime64[D]")
        month = labels.astype("datetime64[M]")
        # the time of day, exact at the labels' resolution (days floor towards the past)
        tod = labels - days.astype(labels.dtype)
    except (OverflowError, ValueError):
        return None
    if (tod != tod[0]).any():
        return None
    dom = (days - month.astype("datetime64[D]")).astype(np.int64) + 1
    if (dom == dom[0]).all() and dom[0] <= 28:
        rule = int(dom[0])
    elif ((days + np.timedelta64(1, "D")).astype("datetime64[M]") != month).all():
        rule = -1  # every date the last of its month
    else:
        return None
    return month.astype(np.int64), rule, tod[0]


def _calendar_step(parts) -> int | None:
    """The median positive step of :func:`_month_parts`' months where it is whole, else (or
    without parts) ``None``."""
    if parts is None:
        return None
    d = np.diff(parts[0])
    d = d[d > 0]
    if not d.size:
        return None
    med = float(np.median(d))
    return int(med) if med == int(med) else None


def _calendar_future(parts, months: int, k: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The dates ``k * months`` calendar months after the last of ``labels``, on the same day
    of the month (or month end) and time of day (``parts``: their :func:`_month_parts`)."""
    m, rule, tod = parts
    res = _resolution(labels)
    fut = (m[-1] + k * months).astype("datetime64[M]")
    if rule == -1:
        day = (fut + np.timedelta64(1, "M")).astype("datetime64[D]") - np.timedelta64(1, "D")
    else:
        day = fut.astype("datetime64[D]") + np.timedelta64(rule - 1, "D")
    for r in [x for x in ("ns", "us", "ms", "s") if _NS_PER[x] >= _NS_PER[res]]:
        try:
            out = day.astype(f"datetime64[{r}]") + tod.astype(f"timedelta64[{r}]")
        except OverflowError:  # (numpy 2.3 on raises; older ones wrap silently, checked below)
            continue
        if (out.astype("datetime64[D]") == day).all():
            return out
    raise ValueError(
        f"steps: {int(k[-1])} steps of {months} months after {labels[-1]} leave the range of "
        "datetime64"
    )


MAX_FORECAST_STEPS = 1_000_000


def check_steps(steps, name: str = "steps") -> int:
    """A positive number of forecast steps, at most :data:`MAX_FORECAST_STEPS` (memory bound)."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, (bool, np.bool_)) or steps < 1:
        raise ValueError(f"{name}: expected a positive integer, got {steps!r}")
    if steps > MAX_FORECAST_STEPS:
        raise ValueError(
            f"{name}: expected at most {MAX_FORECAST_STEPS} forecast steps (each step holds a "
            f"value per series in memory), got {steps}"
        )
    return int(steps)


def _resolution(arr: np.ndarray) -> str:
    unit, _ = np.datetime_data(arr.dtype)
    return unit if unit in _NS_PER else "s"


def _resolution_td(td) -> str:
    unit, _ = np.datetime_data(np.asarray(td).dtype)
    return unit


def _normalize_datetimes(arr: np.ndarray) -> np.ndarray:
    """datetime64 at s/ms/us/ns resolution (coarser units become seconds, finer ones ns)."""
    unit, count = np.datetime_data(arr.dtype)
    if unit in _NS_PER and count == 1:
        return arr
    if unit in ("Y", "M", "W", "D", "h", "m") or (unit in _NS_PER and count != 1):
        return arr.astype("datetime64[s]")
    return arr.astype("datetime64[ns]")


def _split_ns(arr: np.ndarray):
    """``(seconds int64, nanoseconds int64 in [0, 1e9))`` of datetime64 values, without overflow."""
    res = _resolution(arr)
    v = _normalize_datetimes(arr).astype(f"datetime64[{res}]").view(np.int64)
    per = 10**9 // _NS_PER[res]
    sec, sub = np.divmod(v, per)
    return sec, sub * _NS_PER[res]


def elapsed(labels: np.ndarray, origin, unit: np.timedelta64) -> np.ndarray:
    """``(labels - origin) / unit`` as float64 for datetime64 values of any span and resolution.

    Seconds and sub-seconds are subtracted apart in int64 (exact), then combined in float64: one
    rounding, so a relative error below 2.3e-16 of the elapsed time.

    >>> a = np.array(["1700-01-01", "2008-01-01", "9999-12-31"], dtype="datetime64[s]")
    >>> elapsed(a, a[0], np.timedelta64(1, "D")).tolist()
    [0.0, 112494.0, 3031511.0]
    """
    labels = np.asarray(labels)
    sec, sub = _split_ns(labels)
    sec0, sub0 = _split_ns(np.asarray([origin], dtype=labels.dtype))
    unit_ns = float(int(np.timedelta64(unit, "ns") / np.timedelta64(1, "ns")))
    ds = (sec - sec0[0]).astype(np.float64)
    dn = (sub - sub0[0]).astype(np.float64)
    return (ds * 1e9 + dn) / unit_ns


def parse_time_unit(time_unit) -> tuple[np.timedelta64, str]:
    """``time_unit`` (``"D"``, ``"12h"``, ``"365.25D"``, timedelta64, timedelta) -> (ns, name)."""
    if time_unit is None:
        time_unit = DEFAULT_DATETIME_UNIT
    name = str(time_unit)
    if isinstance(time_unit, (np.timedelta64, _dt.timedelta)):
        name = None
    if isinstance(time_unit, np.timedelta64):
        if np.isnat(time_unit):
            raise ValueError(f"time_unit: expected a positive duration, got {time_unit!r}")
        td = time_unit.astype("timedelta64[ns]")
    elif isinstance(time_unit, _dt.timedelta):
        td = np.timedelta64(int(round(time_unit.total_seconds() * 1e9)), "ns")
    elif isinstance(time_unit, str):
        if re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", time_unit):
            # a bare number is nanoseconds to pandas, and no one means that: ask for a unit
            raise ValueError(
                f"time_unit: expected a duration with its unit, such as '{time_unit.strip()}D' "
                f"(days) or '{time_unit.strip()}h' (hours), got {time_unit!r}"
            )
        try:
            import pandas as pd

            td = np.timedelta64(pd.Timedelta(time_unit).value, "ns")
        except (ImportError, ValueError, OverflowError) as err:
            raise ValueError(
                "time_unit: expected a duration such as '1D', '12h' or '365.25D', got "
                f"{time_unit!r}"
            ) from err
    else:
        raise TypeError(
            f"time_unit: expected a string, numpy.timedelta64 or datetime.timedelta, got "
            f"{type(time_unit).__name__}"
        )
    if np.isnat(td) or not td > np.timedelta64(0, "ns"):
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


# --- strings -------------------------------------------------------------------------------------
_ISO = re.compile(
    r"^[+-]?\d{4}(-\d{2}(-\d{2}([T ]\d{2}(:\d{2}(:\d{2}([.,]\d+)?)?)?)?)?)?"
    r"\s*(Z|[+-]\d{2}(:?\d{2})?)?$"
)
_OFFSET = re.compile(r"\d{1,2}:\d{2}(:\d{2}([.,]\d+)?)?\s*(Z|[+-]\d{2}(:?\d{2})?|UTC|GMT)$")


def has_utc_offsets(values) -> bool:
    """Whether timestamp strings carry UTC offsets (``Z``, ``+02:00``, ``UTC``), which
    :func:`parse_datetime_strings` applies, giving times in UTC.

    >>> has_utc_offsets(["2024-05-07T10:00:00+02:00"]), has_utc_offsets(["2024-05-07 10:00"])
    (True, False)
    """
    return any(_OFFSET.search(str(v).strip()) for v in np.asarray(values, dtype=object).ravel())


_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)")

# period labels of statistical offices and pandas: quarters (1959Q1, 1959-Q1, 1959 q1, Q1 1959,
# Q1-1959) and months (1959M01, 1959M1)
_QUARTER = re.compile(
    r"^(?:(?P<y>\d{4})[-\s]?[Qq](?P<q>[1-4])|[Qq](?P<q2>[1-4])[-\s]?(?P<y2>\d{4}))$"
)
_MONTH = re.compile(r"^(?P<y>\d{4})-?[Mm](?P<m>0?[1-9]|1[0-2])$")
# half-years (Eurostat's 2007-S1, 2007H1) and ISO weeks (2020-W05, 2020W05)
_HALF = re.compile(r"^(?P<y>\d{4})-?[SsHh](?P<h>[12])$")
_WEEK = re.compile(r"^(?P<y>\d{4})-?[Ww](?P<w>0[1-9]|[1-4]\d|5[0-3])$")


def period_starts(values) -> tuple[list[str], str] | None:
    """Quarter, month, half-year or ISO week labels as the ISO dates their periods start, and
    the period's name.

    ``None`` unless every value is such a label, all of one kind.

    >>> period_starts(["1959Q1", "1959Q2", "1960-Q4"])
    (['1959-01-01', '1959-04-01', '1960-10-01'], 'quarter')
    >>> period_starts(["Q3 2001", "2001M12"]) is None
    True
    >>> period_starts(["1998M1", "1998M10"])
    (['1998-01-01', '1998-10-01'], 'month')
    >>> period_starts(["2020-W01", "2020W05"]), period_starts(["2007-S1", "2007H2"])
    ((['2019-12-30', '2020-01-27'], 'week'), (['2007-01-01', '2007-07-01'], 'half-year'))
    """
    values = np.asarray(values, dtype=object).ravel()
    if values.size == 0 or not any(p.match(str(values[0]).strip()) for p, _, _ in _PERIODS):
        return None  # (the first value tells: no need to read a million)
    strs = [str(v).strip() for v in values]
    for pattern, kind, start in _PERIODS:
        if pattern.match(strs[0]):
            found = [pattern.match(s) for s in strs]
            if all(found):
                try:
                    return [start(m) for m in found], kind
                except ValueError:  # a label of no period (2021-W53)
                    return None
    return None


def _quarter_start(m) -> str:
    return f"{m['y'] or m['y2']}-{3 * int(m['q'] or m['q2']) - 2:02d}-01"


# each kind of period label: its pattern, its name, the ISO date its period starts on (an ISO
# week on its Monday; week 53 only in some years: ValueError)
_PERIODS = (
    (_QUARTER, "quarter", _quarter_start),
    (_MONTH, "month", lambda m: f"{m['y']}-{int(m['m']):02d}-01"),
    (_HALF, "half-year", lambda m: f"{m['y']}-{'01' if m['h'] == '1' else '07'}-01"),
    (_WEEK, "week", lambda m: _dt.date.fromisocalendar(int(m["y"]), int(m["w"]), 1).isoformat()),
)


def _guess_formats(strs: list[str]) -> list[str]:
    from pandas.tseries.api import guess_datetime_format

    n = len(strs)
    picks = sorted(
        set(list(range(min(n, 20))) + list(np.linspace(0, n - 1, min(n, 20)).astype(int)))
    )
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in picks:
            for dayfirst in (False, True):
                fmt = guess_datetime_format(strs[i], dayfirst=dayfirst)
                if fmt is None and _pandas_parses_ns_only():
                    # pandas 2 guesses nothing for a year outside 1677-2262; the format does not
                    # depend on the year, so guess it from the value in another year (every
                    # candidate is checked on all values afterwards)
                    other = _YEAR.sub("2000", strs[i], count=1)
                    fmt = guess_datetime_format(other, dayfirst=dayfirst)
                if fmt is None or fmt in found:
                    continue
                # year first, then day before month (%Y-%d-%m) is not a format people write
                y, d, m = (fmt.find(c) for c in ("%Y", "%d", "%m"))
                if 0 <= y < d < m:
                    continue
                found.append(fmt)
    if not found:  # month names with a year, which pandas guesses nothing for: Jan 1950
        for fmt in _MONTH_YEAR:
            try:
                _dt.datetime.strptime(strs[0], fmt)
            except ValueError:
                continue
            found.append(fmt)
    return found


_MONTH_YEAR = ("%b %Y", "%B %Y", "%b-%Y", "%B-%Y", "%Y %b", "%Y %B", "%Y-%b")
_TWO_DIGIT_YEAR = re.compile(r"^\d{1,2}([/.-])\d{1,2}\1\d{2}$")


def _dayfirst(fmt: str) -> bool:
    d, m = fmt.find("%d"), fmt.find("%m")
    return 0 <= d < m


def parse_datetime_strings(
    values, name: str = "times", *, time_format: str | None = None, dayfirst: bool | None = None
) -> np.ndarray:
    """Parse timestamp strings with one format for all of them: ``datetime64`` (UTC if offsets).

    ``time_format`` (strftime codes, e.g. ``"%d/%m/%Y"``, or ``"ISO8601"``) reads every value with
    that format. Otherwise ISO 8601 when every value is ISO, else the single format that reads
    every value; if day-first and month-first formats both read every value differently,
    ``dayfirst`` picks one and without it the dates are refused. Quarter labels (``1959Q1``,
    ``1959-Q1``, ``Q1 1959``) and month labels (``1959M01``) read as the first day of their
    period (:func:`period_starts`). Raises :class:`TimeParseError`
    (a ``ValueError``) naming the position and text of the first value that cannot be read.

    >>> parse_datetime_strings(["29/03/1958", "30/03/1958"]).tolist()[0].isoformat()
    '1958-03-29T00:00:00'
    >>> try:
    ...     parse_datetime_strings(["01/03/1958", "02/03/1958"])
    ... except ValueError as err:
    ...     print(str(err)[:55])
    times: ambiguous dates: '01/03/1958' (position 0) reads
    >>> parse_datetime_strings(["01/03/1958"], dayfirst=True).tolist()[0].isoformat()
    '1958-03-01T00:00:00'
    """
    import pandas as pd

    if time_format is None:
        fixed = _parse_fixed_iso(values)
        if fixed is not None:
            return fixed
    strs = [str(v).strip() for v in np.asarray(values, dtype=object).ravel()]
    if not strs:
        return np.array([], dtype="datetime64[s]")
    for i, s in enumerate(strs):
        if s == "" or s.lower() in ("nat", "nan", "none", "na"):
            raise TimeParseError(f"{name}: expected a time, got {s!r} at position {i}", i, s)
    has_offset = [bool(_OFFSET.search(s)) for s in strs]
    utc = any(has_offset)
    if utc and not all(has_offset):
        i = has_offset.index(False)
        j = has_offset.index(True)
        raise TimeParseError(
            f"{name}: {strs[j]!r} (position {j}) has a UTC offset but {strs[i]!r} (position {i}) "
            "has none; give every time an offset or none",
            i,
            strs[i],
        )

    def attempt(fmt):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = pd.to_datetime(pd.Series(strs), format=fmt, errors="coerce", utc=utc)
            except (ValueError, TypeError, OverflowError):
                return None
        if utc:
            out = out.dt.tz_convert("UTC").dt.tz_localize(None)
        elif getattr(out.dt, "tz", None) is not None:
            out = out.dt.tz_localize(None)
        if out.isna().any() and _pandas_parses_ns_only():
            out = _outside_ns_window(out, strs, fmt, utc)
        return out

    def fail(fmt, out, what):
        bad = out.isna().to_numpy() if out is not None else np.ones(len(strs), bool)
        i = int(np.flatnonzero(bad)[0])
        raise TimeParseError(
            f"{name}: cannot parse {strs[i]!r} (position {i}) as a time ({what})", i, strs[i]
        )

    if time_format is not None:
        out = attempt(time_format)
        if out is None or out.isna().any():
            fail(time_format, out, f"expected the format {time_format!r}")
        return _to_numpy_datetimes(out)
    periods = period_starts(strs) if time_format is None else None
    if periods is not None:  # each time the first day of its quarter or month
        given, strs = strs, periods[0]
        out = attempt("%Y-%m-%d")
        if out is None or out.isna().any():
            bad = out.isna().to_numpy() if out is not None else np.ones(len(strs), bool)
            i = int(np.flatnonzero(bad)[0])
            raise TimeParseError(
                f"{name}: cannot parse {given[i]!r} (position {i}) as a time (its {periods[1]} "
                f"starts on {strs[i]}, which is no date)",
                i,
                given[i],
            )
        return _to_numpy_datetimes(out)
    for pattern, kind, _ in _PERIODS:
        if time_format is not None or not any(pattern.match(s) for s in strs[:20]):
            continue
        labels = [bool(pattern.match(s)) for s in strs]
        if all(labels):  # every one a label, one of them of no period (2021-W53)
            i = next(k for k, s in enumerate(strs) if period_starts([s]) is None)
            raise TimeParseError(
                f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (no such {kind})",
                i,
                strs[i],
            )
        if sum(labels) >= len(strs) / 2:  # mostly period labels: name the first that is not one
            i = labels.index(False)
            raise TimeParseError(
                f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (the other values "
                f"are {kind} labels like {strs[labels.index(True)]!r})",
                i,
                strs[i],
            )
    if all(_ISO.match(s) for s in strs):
        out = attempt("ISO8601")
        if out is not None and not out.isna().any():
            return _to_numpy_datetimes(out)
    candidates = _guess_formats(strs)
    results = [(fmt, attempt(fmt)) for fmt in candidates]
    full = [(f, o) for f, o in results if o is not None and not o.isna().any()]
    if not full:
        if not results:
            iso = attempt("ISO8601")
            what = "expected dates like 2024-03-01 or 2024-03-01T12:30"
            if _TWO_DIGIT_YEAR.match(strs[0]):
                sep = _TWO_DIGIT_YEAR.match(strs[0]).group(1)
                what = (
                    f"two-digit years are not guessed: give the format, e.g. %d{sep}%m{sep}%y "
                    "(CLI: --time-format), which reads 00-68 as 2000-2068 and 69-99 as 1969-1999"
                )
            fail("ISO8601", iso, what)
        fmt, out = max(results, key=lambda r: -1 if r[1] is None else int(r[1].notna().sum()))
        fail(fmt, out, f"the other values read as {fmt!r}")
    distinct = []
    for f, o in full:
        if not any(o.equals(o2) for _, o2 in distinct):
            distinct.append((f, o))
    if len(distinct) > 1:
        if dayfirst is not None:
            pick = [(f, o) for f, o in distinct if _dayfirst(f) == bool(dayfirst)]
            if len(pick) == 1:
                return _to_numpy_datetimes(pick[0][1])
        (f1, o1), (f2, o2) = distinct[:2]
        i = int(np.flatnonzero((o1 != o2).to_numpy())[0])
        raise TimeParseError(
            f"{name}: ambiguous dates: {strs[i]!r} (position {i}) reads as "
            f"{o1.iloc[i].date()} with {f1!r} and as {o2.iloc[i].date()} with {f2!r}; "
            "choose one with time_format (CLI: --time-format) or dayfirst (CLI: --dayfirst)",
            i,
            strs[i],
        )
    return _to_numpy_datetimes(distinct[0][1])


# ISO 8601 written in one layout for every value: the length (without a Z) and the positions
# of its digits and of its separators, and which separators each may be
_FIXED_ISO_SEPARATORS = {4: b"-", 7: b"-", 10: b" T", 13: b":", 16: b":", 19: b"."}


def _parse_fixed_iso(values) -> np.ndarray | None:
    """The datetimes of strings all written in one ISO 8601 layout, ``YYYY-MM-DD``, with
    ``[T ]HH:MM``, ``:SS`` and ``.`` and 1 to 9 digits after it, all with a ``Z`` (UTC) or none,
    of the years 1678 to 2261, read in numpy: what :func:`parse_datetime_strings` gives them
    (pandas reads every such value in that window exactly; its ISO check and parse, a regular
    expression a value, take seconds for a million). ``None`` for anything else (another
    layout, spaces around a value, an invalid date or time, a value out of range), which the
    general parse reads or refuses as it does.

    >>> _parse_fixed_iso(["1958-03-29 12:00:00", "1958-03-30T00:00:00"]).tolist()[0].isoformat()
    '1958-03-29T12:00:00'
    >>> _parse_fixed_iso(["1958-03-29", "1958-3-30"]) is None
    True
    """
    arr = np.asarray(values).ravel()
    if arr.size == 0 or arr.dtype.kind not in "OU":
        return None
    if arr.dtype.kind == "O":
        import pandas as pd

        if pd.api.types.infer_dtype(arr, skipna=False) != "string":
            return None
        arr = arr.astype("U")
    try:
        raw = arr.astype("S")
    except UnicodeEncodeError:
        return None
    width = raw.dtype.itemsize
    chars = raw.view(np.uint8).reshape(arr.size, width)
    if not chars[:, -1].all():  # (shorter values are padded with zeros)
        return None
    zulu = bool((chars[:, -1] == ord("Z")).all())
    size = width - zulu
    if size not in (10, 16, 19) and not 21 <= size <= 29 or (zulu and size == 10):
        return None
    chars = chars[:, :size]
    digits = np.ones(size, bool)
    for at, allowed in _FIXED_ISO_SEPARATORS.items():
        if at < size:
            digits[at] = False
            if not np.isin(chars[:, at], list(allowed)).all():
                return None
    numbers = chars[:, digits].astype(np.int64) - ord("0")
    if numbers.min() < 0 or numbers.max() > 9:
        return None

    year = numbers[:, :4] @ np.array([1000, 100, 10, 1])
    if year.min() < 1678 or year.max() > 2261:
        return None
    # numpy's ISO parser reads the layout checked above and refuses an invalid date or time
    # (2021-02-29, 24:00, a leap second), as pandas does
    text = np.ascontiguousarray(chars).view(f"S{size}").ravel()
    try:
        out = text.astype("datetime64[s]" if size <= 19 else "datetime64[ns]")
    except ValueError:
        return None
    return _coarsest_datetimes(out)


@functools.cache
def _pandas_parses_ns_only() -> bool:
    """pandas before 3.0 parses strings into nanoseconds only: 1677-09-21 to 2262-04-11 (asked
    when first parsing: importing kalmanscan does not import pandas)."""
    import pandas as pd

    return int(pd.__version__.split(".")[0]) < 3


def _outside_ns_window(out, strs: list[str], fmt: str, utc: bool):
    """``out`` (pandas' parse, NaT where it failed) with the values that Python's ``datetime``
    reads with ``fmt`` filled in, at microsecond resolution: pandas before 3.0 gives NaT for a
    date outside the nanosecond window (years before 1677 or after 2262), which pandas 3 and
    Python read (years 1 to 9999). Values Python cannot read either stay NaT."""
    import pandas as pd

    vals = out.to_numpy()
    res = vals.astype("datetime64[us]")
    ok = ~np.isnat(vals)
    if not (res[ok] == vals[ok]).all():  # sub-microsecond values: kept exact, the rest refused
        return out
    for i in np.flatnonzero(~ok):
        try:
            if fmt == "ISO8601":
                d = _dt.datetime.fromisoformat(strs[i].replace("Z", "+00:00"))
            else:
                d = _dt.datetime.strptime(strs[i], fmt)
        except ValueError:
            continue
        if (d.tzinfo is not None) != utc:  # (an offset on all values or on none)
            continue
        if d.tzinfo is not None:
            d = d.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        res[i] = np.datetime64(d, "us")
    return pd.Series(res)


def _to_numpy_datetimes(out) -> np.ndarray:
    """The parsed values as datetime64 at the coarsest of s/ms/us/ns that holds them exactly
    (pandas 3 infers a unit; pandas 2 gives nanoseconds: the same values either way)."""
    arr = out.to_numpy()
    if arr.dtype.kind != "M":  # pragma: no cover - pandas always gives datetime64 here
        arr = np.asarray(arr, dtype="datetime64[us]")
    return _coarsest_datetimes(arr)


def _coarsest_datetimes(arr: np.ndarray) -> np.ndarray:
    """datetime64 values at the coarsest of s/ms/us that holds them exactly, else their own
    unit (s/ms/us/ns: :func:`_normalize_datetimes`)."""
    arr = _normalize_datetimes(arr)
    for unit in ("s", "ms", "us"):
        if _NS_PER[unit] <= _NS_PER[np.datetime_data(arr.dtype)[0]]:
            break
        coarse = arr.astype(f"datetime64[{unit}]")
        if (coarse == arr).all():
            return coarse
    return arr


def _labels_array(times, name: str, *, time_format=None, dayfirst=None) -> np.ndarray:
    return _labels_and_zone(times, name, time_format=time_format, dayfirst=dayfirst)[0]


def _exact_float_times(
    arr: np.ndarray,
    name: str,
    hint: str = "subtract the first time (times - times[0]), or pass epoch nanoseconds as "
    "datetimes (np.asarray(times, 'datetime64[ns]'))",
) -> np.ndarray:
    """Integer times as float64, refused where float64 would round them (beyond 2^53: epoch
    nanoseconds, say), which would silently change the steps between them."""
    out = arr.astype(np.float64)
    big = np.abs(out) >= 2.0**53
    if big.any():
        # the floats back in the integers' type (exact inside its range; past it, rounded up)
        top = 2.0**64 if arr.dtype.kind == "u" else 2.0**63
        with np.errstate(invalid="ignore"):
            back = np.where(np.abs(out) < top, out, 0).astype(arr.dtype)
        lossy = big & ((np.abs(out) >= top) | (back != arr))
        if lossy.any():
            i = int(np.flatnonzero(lossy.ravel())[0])
            raise ValueError(
                f"{name}: expected integer times that float64 holds exactly (below 2^53, "
                f"about 9.0e15), got {arr.ravel()[i]} at position {i}, which it rounds; {hint}"
            )
    return out


def _labels_and_zone(times, name: str, *, time_format=None, dayfirst=None):
    """``(labels, utc, tz)``: the timestamps as float64 or datetime64, whether they were
    converted to UTC from a timezone or UTC offsets, and the one timezone they were given in
    (``None`` if none, or several)."""
    utc = False
    tz = None
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is an optional extra
        pd = None
    if isinstance(times, np.ma.MaskedArray):
        if np.ma.getmaskarray(times).any():
            i = int(np.flatnonzero(np.ma.getmaskarray(times).ravel())[0])
            raise ValueError(
                f"{name}: expected every timestamp present, got a masked value at position {i}"
            )
        times = np.ma.getdata(times)
    if pd is not None and isinstance(times, pd.MultiIndex):
        raise TypeError(
            f"{name}: expected one timestamp per step, got a pandas MultiIndex with levels "
            f"{list(times.names)}; lay the data out with one series per column and the times "
            "as the index (e.g. df[column].unstack(level=0))"
        )
    if pd is not None and isinstance(times, (pd.Index, pd.Series)):
        if isinstance(times.dtype, pd.PeriodDtype):  # a period is the time it starts
            times = times.dt.start_time if isinstance(times, pd.Series) else times.start_time
        if isinstance(times.dtype, pd.DatetimeTZDtype):
            utc, tz = True, times.dtype.tz
            if isinstance(times, pd.Series):
                times = times.dt.tz_convert("UTC").dt.tz_localize(None)
            else:
                times = times.tz_convert("UTC").tz_localize(None)
        arr = np.asarray(times)
    elif hasattr(times, "detach") and hasattr(times, "cpu"):  # torch tensor
        t = times.detach().cpu()
        if t.is_complex():
            raise TypeError(f"{name}: expected real numbers or datetimes, got dtype {t.dtype}")
        arr = t.resolve_neg().resolve_conj().numpy()
    else:
        arr = np.asarray(times)
    if (
        arr.dtype.kind == "O"
        and pd is not None
        and arr.size
        and all(isinstance(v, (_dt.datetime, np.datetime64)) for v in arr.ravel())
    ):
        zones = [getattr(v, "tzinfo", None) for v in arr.ravel()]
        zoned = [z is not None for z in zones]
        if any(zoned) and not all(zoned):
            raise ValueError(f"{name}: some datetimes carry a timezone and some do not")
        parsed = pd.to_datetime(pd.Series(arr.ravel()), utc=any(zoned))
        if any(zoned):
            utc = True
            if len({str(z) for z in zones}) == 1:
                tz = zones[0]
            parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
        arr = _to_numpy_datetimes(parsed).reshape(arr.shape)
    elif arr.dtype.kind in "OUS":
        if pd is None:
            raise TypeError(f"{name}: got strings or objects; pass numbers or numpy datetime64")
        if arr.dtype.kind == "O" and any(
            isinstance(v, (numbers.Real, decimal.Decimal)) and not isinstance(v, (bool, np.bool_))
            for v in arr.ravel()
        ):
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(
                    f"{name}: expected numbers or datetimes, got a mix of numbers and objects"
                ) from err
        else:
            if arr.dtype.kind == "S":
                arr = arr.astype(str)
            parsed = parse_datetime_strings(
                arr.ravel(), name, time_format=time_format, dayfirst=dayfirst
            )
            # the parse refuses a mix of times with and without offsets: the first tells
            utc = has_utc_offsets(arr.ravel()[:1])
            arr = parsed.reshape(arr.shape)
    if arr.dtype.kind == "M":
        arr = _normalize_datetimes(arr)
    elif arr.dtype.kind in "iu":
        arr = _exact_float_times(arr, name)
    elif arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind == "m":
        raise TypeError(
            f"{name}: expected real numbers or datetimes, got durations ({arr.dtype}); give them "
            "as numbers in the unit the rates should be per (e.g. times / np.timedelta64(1, 'h')), "
            "or as datetimes (a start date plus the durations)"
        )
    else:
        raise TypeError(
            f"{name}: expected real numbers or datetimes, got values of dtype {arr.dtype}"
        )
    zoned = utc and arr.dtype.kind == "M"
    return np.atleast_1d(arr), zoned, tz if zoned else None


def as_time_axis(
    times, n: int, time_unit=None, name: str = "times", *, time_format=None, dayfirst=None
) -> TimeAxis:
    """Check and convert ``times`` for a record of ``n`` steps.

    Args:
        times: ``None`` (steps ``0, 1, ..., n-1``), ``[n]`` numbers, numpy ``datetime64`` values, a
            pandas ``DatetimeIndex``/``Series`` (tz-aware ones are converted to UTC) or timestamp
            strings (see :func:`parse_datetime_strings`), or a :class:`TimeAxis` (its labels,
            in its unit unless ``time_unit`` is given). Non-decreasing, no NaN/NaT; equal
            timestamps are steps of length 0.
        n: number of time steps of the record.
        time_unit: model time unit for datetimes (default ``"1D"``); must be ``None`` for numbers.
        time_format, dayfirst: how to read strings (see :func:`parse_datetime_strings`).

    >>> import numpy as np
    >>> ax = as_time_axis(np.array(["2024-01-01", "2024-01-03"], dtype="datetime64[D]"), 2)
    >>> ax.t.tolist(), ax.unit_name
    ([0.0, 2.0], '1D')
    >>> days = np.array(["0001-01-01", "1700-01-01", "9999-12-31"], dtype="datetime64[D]")
    >>> as_time_axis(days, 3).t.tolist()  # any span: no 1677-2262 limit
    [0.0, 620547.0, 3652058.0]
    """
    if times is None:
        if time_unit is not None:
            raise ValueError("time_unit: only meaningful with datetime times, but times is None")
        labels = np.arange(n, dtype=np.float64)
        return TimeAxis(labels, labels.copy(), None, "1")
    given_utc, given_tz = False, None
    if isinstance(times, TimeAxis):  # e.g. strings parsed once with dayfirst or time_format
        if time_unit is None and times.is_datetime:
            time_unit = np.timedelta64(times.unit, "ns")
        times, given_utc, given_tz = times.labels, times.utc, times.tz
    labels, utc, tz = _labels_and_zone(times, name, time_format=time_format, dayfirst=dayfirst)
    utc = utc or (given_utc and labels.dtype.kind == "M")
    tz = tz if tz is not None else (given_tz if utc else None)
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
        t = elapsed(labels, labels[0], unit) if n else np.zeros(0)
    else:
        if time_unit is not None:
            raise ValueError(
                "time_unit: only meaningful with datetime times; numeric times are already in "
                f"model units (got time_unit={time_unit!r})"
            )
        if not np.isfinite(labels).all():
            i = int(np.flatnonzero(~np.isfinite(labels))[0])
            raise ValueError(f"{name}: expected finite numbers, got {labels[i]} at position {i}")
        unit, unit_name = None, "1"
        with np.errstate(over="ignore", invalid="ignore"):
            t = labels - labels[0] if n else np.zeros(0)
        if not np.isfinite(t).all():
            i = int(np.flatnonzero(~np.isfinite(t))[0])
            raise ValueError(
                f"{name}: expected times whose span is finite in float64, got {labels[i]:g} "
                f"(position {i}) after {labels[0]:g}; shift or rescale the times"
            )
    t = np.asarray(t, dtype=np.float64)
    steps = np.diff(t)
    if (steps < 0).any():
        i = int(np.flatnonzero(steps < 0)[0]) + 1
        raise ValueError(
            f"{name}: expected non-decreasing timestamps, got {labels[i]} after {labels[i - 1]} "
            f"(position {i}); sort the record by time first"
        )
    return TimeAxis(labels, t, unit, unit_name, utc, tz)
