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

pandas periods (a ``PeriodIndex``, ``Period`` objects) are read by
:mod:`~kalmanscan.timeseries.time_periods`: each period as the time it starts, its frequency kept
(:attr:`TimeAxis.period_freq`), so that forecasts continue the periods and come back as them.

cftime dates (xarray's dates in model calendars) are read by
:mod:`~kalmanscan.timeseries.time_cftime`: as ``datetime64`` where they are numpy's dates, else
kept, with their steps measured in their own calendar.

Timestamp strings are read by :mod:`~kalmanscan.timeseries.time_parse` (one format for the whole
column: ISO 8601, or the one format that reads every value; ambiguous day/month orders refused
unless ``dayfirst`` or ``time_format`` decides); the calendar arithmetic (resolutions, exact
elapsed time, model time units, calendar-month steps) is in
:mod:`~kalmanscan.timeseries.time_calendar`.

Duplicate timestamps are allowed here: two observations at the same time are two exact updates
of the same state (a step of length 0). ``kalmanscan filter`` refuses them (see docs/cli.md).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import numbers
import sys
from typing import NamedTuple

import numpy as np

# the calendar arithmetic and the string parse: used here, and importable from times as before
from kalmanscan.timeseries.time_calendar import (  # noqa: F401 - re-exported
    _INT64_MAX,
    _NS_PER,
    DEFAULT_DATETIME_UNIT,
    MAX_FORECAST_STEPS,
    _calendar_future,
    _calendar_step,
    _future_local,
    _month_parts,
    _normalize_datetimes,
    _resolution,
    _resolution_td,
    _session_future,
    _slots_per_month,
    _split_ns,
    _utc_to_local,
    _weekday_future,
    check_steps,
    elapsed,
    parse_time_unit,
)
from kalmanscan.timeseries.time_cftime import (
    cf_calendar_future,
    cf_check_like,
    cf_elapsed,
    cf_month_parts,
    cf_step,
    cftime_datetimes,
    is_cftime,
    is_cftime_array,
    parse_cftime_strings,
)
from kalmanscan.timeseries.time_parse import (  # noqa: F401 - re-exported
    TimeParseError,
    _outside_ns_window,
    _parse_fixed_iso,
    _to_numpy_datetimes,
    has_utc_offsets,
    parse_datetime_strings,
    period_starts,
)
from kalmanscan.timeseries.time_periods import (
    check_period_freq,
    check_period_starts,
    period_future,
    period_labels,
    to_periods,
)
from kalmanscan.timeseries.time_zones import zoned_index


class TimeAxis(NamedTuple):
    """Timestamps of one record.

    Fields:
        labels: ``[T]`` the user's timestamps, float64 or ``datetime64`` (s, ms, us or ns), or
            cftime dates of a calendar whose days are not numpy's (``noleap``, ``360_day``;
            :mod:`~kalmanscan.timeseries.time_cftime`), as given.
        t: ``[T]`` float64 positions in model time units, ``t[0] == 0``.
        unit: ``None`` for numeric times, else the model time unit as ``timedelta64[ns]``.
        unit_name: how the unit is recorded in outputs (``"1"`` for numbers, e.g. ``"1D"``).
        utc: the labels are UTC, converted from times that carried a timezone or UTC offset
            (the results Dataset's time coordinates then say ``time_zone = "UTC"``).
        tz: the one timezone the times were given in (a pandas tz-aware index, a polars
            ``Datetime`` with a ``time_zone``, or datetimes all of one ``tzinfo``), else
            ``None``: forecast times follow its calendar and clock (:meth:`future`) and come
            back in it (:meth:`zoned`; :mod:`~kalmanscan.timeseries.time_zones`).
        period_freq: the frequency of the pandas periods the times were given as (a
            ``PeriodIndex``, a Series of periods, ``Period`` objects; pandas' ``freqstr``, e.g.
            ``"Q-DEC"``, ``"M"``, ``"W-SUN"``), else ``None``. The labels are then the times the
            periods start (:mod:`~kalmanscan.timeseries.time_periods`); :meth:`periods` gives
            the periods back, :meth:`future` continues them, and a forecast's times are them.

    Made by :func:`as_time_axis`; ``dt`` gives the step lengths, :meth:`future` the forecast
    times, :meth:`position` the model-time positions of other timestamps.

    >>> import numpy as np
    >>> ax = as_time_axis(np.array(["2024-03-01T00:00", "2024-03-01T12:00"], "datetime64[m]"), 2)
    >>> ax.t.tolist(), ax.unit_name, ax.dt.tolist(), ax.is_datetime
    ([0.0, 0.5], '1D', [0.0, 0.5], True)
    """

    labels: np.ndarray
    t: np.ndarray
    unit: np.timedelta64 | None
    unit_name: str
    utc: bool = False
    tz: object = None
    period_freq: str | None = None

    @property
    def is_datetime(self) -> bool:
        """The labels are datetimes (``unit`` is set), not numbers."""
        return self.unit is not None

    @property
    def is_cftime(self) -> bool:
        """The labels are cftime dates of a calendar other than numpy's (``noleap``,
        ``360_day``, ...), kept as they were given: steps measured in their calendar."""
        return self.is_datetime and is_cftime_array(self.labels)

    def periods(self):
        """The labels as the pandas periods they were given as (a ``PeriodIndex`` of
        :attr:`period_freq`), or ``None`` where the times were not periods.

        >>> import pandas as pd
        >>> ax = as_time_axis(pd.period_range("1959Q1", periods=2, freq="Q"), 2)
        >>> str(ax.labels[1])[:10], ax.periods().astype(str).tolist()
        ('1959-04-01', ['1959Q1', '1959Q2'])
        """
        return None if self.period_freq is None else to_periods(self.labels, self.period_freq)

    def zoned(self, labels=None):
        """The labels (or other UTC labels of this record, e.g. forecast times) as a tz-aware
        pandas ``DatetimeIndex`` in the timezone the times were given in (:attr:`tz`; UTC where
        they carried UTC offsets of no one zone), or ``None`` where they carried no timezone
        (:mod:`~kalmanscan.timeseries.time_zones`).

        >>> import pandas as pd
        >>> idx = pd.date_range("2024-03-30", periods=3, freq="D", tz="Europe/Paris")
        >>> ax = as_time_axis(idx, 3)
        >>> str(ax.labels[2]), str(ax.zoned()[2])
        ('2024-03-31T22:00:00.000000', '2024-04-01 00:00:00+02:00')
        """
        if not self.utc or self.is_cftime or not self.is_datetime:
            return None
        return zoned_index(self.labels if labels is None else labels, self.tz)

    def label_text(self, labels) -> list[str]:
        """Labels of this record's kind as messages name them: periods as pandas writes them
        (``1959Q2``) where the record's times are periods, times in the timezone the record's
        were given in (``2024-04-01 00:00:00+02:00``) where they carried one, else as given."""
        if self.period_freq is not None and np.asarray(labels).dtype.kind == "M":
            return to_periods(np.atleast_1d(labels), self.period_freq).astype(str).tolist()
        if self.utc and np.asarray(labels).dtype.kind == "M":
            return [str(x) for x in self.zoned(np.atleast_1d(labels))]
        return [str(x) for x in np.atleast_1d(labels)]

    @property
    def dt(self) -> np.ndarray:
        """``[T]`` step lengths in model units; the first is 0 (the prior sits at ``labels[0]``)."""
        return np.diff(self.t, prepend=self.t[:1]) if len(self.t) else self.t.copy()

    def position(self, labels, name: str = "at") -> np.ndarray:
        """Model-time positions of other labels of the same kind (e.g. forecast times), as
        float64 in model time units from the record's first time; ``name`` is the argument named
        in error messages.

        Where the record's times were converted to UTC (:attr:`utc`), times with a timezone are
        converted too and times without one are read as UTC; times with a timezone against a
        record without one are refused.

        >>> import numpy as np
        >>> ax = as_time_axis(np.array(["2024-01-01", "2024-01-03"], dtype="datetime64[D]"), 2)
        >>> ax.position(np.array(["2024-01-10"], dtype="datetime64[D]")).tolist()
        [9.0]
        """
        arr = self.labels_of(labels, name)
        if self.is_cftime:
            cf_check_like(arr, self.labels, name)
            return cf_elapsed(arr, self.labels[0], self.unit)
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
        if self.is_cftime:
            return cf_step(med, self.unit)
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
        record without one. Against a record of periods (:attr:`period_freq`): periods of its
        frequency, or the times they start at (anything else is refused: labelled by its
        period, it would move)."""
        if self.is_cftime:  # texts read as dates of the record's calendar
            given = np.asarray(labels)
            if given.dtype.kind in "US" or (
                given.dtype.kind == "O"
                and given.size
                and all(isinstance(v, str) for v in given.ravel())
            ):
                first = self.labels[0]
                return parse_cftime_strings(
                    given.ravel(), str(first.calendar), name, like=first
                ).reshape(given.shape)
        if self.period_freq is not None:
            check_period_freq(labels, self.period_freq, name)
        arr, zoned, _ = _labels_and_zone(labels, name)
        if self.period_freq is not None:
            check_period_starts(arr, self.period_freq, name)
        if zoned and not self.utc:
            raise ValueError(
                f"{name}: got times with a timezone or UTC offset, but the record's times have "
                f"none; give {name} without a timezone, in the record's own clock"
            )
        return arr

    def calendar_step(self) -> int | None:
        """The record's step in whole calendar months, where its dates are monthly, quarterly or
        yearly at one time of day, every date placed in its month by one rule: one day of the
        month (a day 29 or 30 falls on the month's last in shorter months), the month's last
        day, its last weekday (Monday to Friday; pandas' ``BME``, ``BQE``, ``BYE``), its first
        weekday (``BMS``, ``BQS``, ``BYS``), its n-th (1 to 4) or last Monday, ..., Sunday
        (``WOM-3FRI``: the third Friday; ``LWOM-FRI``: the last), or two days a month (``SMS``:
        the 1st and 15th; ``SME``: the 15th and the month's end), and the median of the positive
        steps a whole number of months (of half months, for two days a month: a semi-monthly
        record's step is ``None`` here). ``None`` otherwise (numbers, fewer than two distinct
        dates, or days, weeks, hours...).

        >>> q = np.array(["1959-01-01", "1959-04-01", "1959-07-01"], dtype="datetime64[D]")
        >>> as_time_axis(q, 3).calendar_step()
        3
        >>> b = np.array(["2024-03-29", "2024-06-28", "2024-09-30"], dtype="datetime64[D]")
        >>> as_time_axis(b, 3).calendar_step()  # the last weekday of each quarter
        3
        >>> w = np.array(["2024-01-01", "2024-01-08", "2024-01-15"], dtype="datetime64[D]")
        >>> as_time_axis(w, 3).calendar_step() is None
        True

        Times given in a timezone (:attr:`tz`) are judged on its local calendar.
        """
        if not self.is_datetime:
            return None
        if self.is_cftime:
            return _calendar_step(cf_month_parts(self.labels))
        parts = _month_parts(self._local() if self.tz is not None else self.labels)
        slots = _calendar_step(parts)
        if slots is None:
            return None
        months, half = divmod(slots, _slots_per_month(parts[1]))
        return None if half else months

    def _local(self) -> np.ndarray:
        """The labels (UTC) on the clock of :attr:`tz`, as naive datetimes."""
        return _utc_to_local(self.labels, self.tz)

    def future(self, steps: int) -> np.ndarray:
        """``steps`` labels after the last one: the starts of the next periods of a record of
        periods (:attr:`period_freq`; by its median step in periods, the lower middle one of an
        even count: :func:`~kalmanscan.timeseries.time_periods.period_step`); by
        :meth:`calendar_step` months where the dates are monthly, quarterly or yearly, each on
        the rule of the record's dates (its day of the month, the month's end, its last or first
        weekday, its n-th or last Monday, ..., Sunday) at their time of day; by half months on
        the two days of a semi-monthly record; on the next weekdays of a record kept on some
        weekdays only (trading days); on the next
        bars of the trading sessions of an intraday record kept within trading hours (the rest
        of the last session, then the next kept weekdays' sessions from their opening bar, at the
        record's times of day: :func:`~kalmanscan.timeseries.time_calendar._session_future`);
        else spaced by :meth:`step`. These are the dates pandas' own offset continues (``BME``,
        ``BQS``, ``WOM-3FRI``, ``SMS``, ``BusinessHour``, ...), and ``pd.DateOffset(months=k)``'s
        for a day 29 to 31 (January 30 -> February 29 -> March 30; in a cftime calendar, on its
        own month lengths: ``noleap``'s February 28).

        Datetime labels that would leave the range of the labels' resolution are made at a
        coarser one (microseconds: +-290,000 years; seconds beyond that).

        Times given in a timezone (:attr:`tz`) step on its local calendar and clock where they
        sit at one local time of day a whole number of days or months apart (monthly data stay on
        the first of the month, daily data at local midnight, across daylight-saving changes),
        or are trading days or sessions on its calendar (a New York session's bars stay at 09:30
        to 16:00 local); the results are UTC like the labels.

        >>> q = np.array(["2008-10-01", "2009-01-01", "2009-04-01"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(q, 3).future(3)]
        ['2009-07-01', '2009-10-01', '2010-01-01']
        >>> e = np.array(["2024-01-31", "2024-02-29", "2024-03-31"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(e, 3).future(2)]
        ['2024-04-30', '2024-05-31']
        >>> b = np.array(["2024-10-31", "2024-11-29", "2024-12-31"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(b, 3).future(3)]  # last weekday of the month
        ['2025-01-31', '2025-02-28', '2025-03-31']
        >>> h = np.array(["2024-05-15", "2024-05-31", "2024-06-15"], dtype="datetime64[D]")
        >>> [str(x)[:10] for x in as_time_axis(h, 3).future(3)]  # the 15th and month ends
        ['2024-06-30', '2024-07-15', '2024-07-31']
        """
        steps = check_steps(steps)
        k = np.arange(1, steps + 1)
        if self.period_freq is not None and len(self.labels):
            return period_future(self.labels, self.period_freq, k)
        if self.tz is not None and self.is_datetime:
            out = _future_local(self, k)
            if out is not None:
                return out
        last = self.labels[-1]
        if self.is_cftime:
            parts = cf_month_parts(self.labels)
            months = _calendar_step(parts)
            if months is not None:
                return cf_calendar_future(parts, months, k, self.labels)
            step = self.step()
            return np.array([last + int(j) * step for j in k], dtype=object)
        parts = _month_parts(self.labels) if self.is_datetime else None
        slots = _calendar_step(parts)
        if slots is not None:
            return _calendar_future(parts, slots, k, self.labels)
        if self.is_datetime:
            out = _weekday_future(self.labels, k)
            if out is None:
                out = _session_future(self.labels, k)
            if out is not None:
                return out
        step = self.step()
        if not self.is_datetime:
            d = _decimal_places(self.labels)
            if d is not None and step > 0 and abs(round(step, d) - step) <= 1e-9 * step:
                step = round(step, d)  # decimal labels: decimal steps, not their float noise
            out = last + k.astype(np.float64) * step
            if not np.isfinite(out).all():
                raise ValueError(
                    f"steps: {steps} steps of {step:g} after {last:g} leave the float64 range"
                )
            if d is not None:  # (1959.1 + 0.1 k as 1968.6, not 1968.6000000000004)
                r = np.round(out, d)
                out = np.where(np.abs(r - out) <= 1e-9 * np.maximum(np.abs(out), 1.0), r, out)
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


def _is_polars_series(value) -> bool:
    pl = sys.modules.get("polars")  # a polars object means polars is imported: no import here
    return pl is not None and isinstance(value, pl.Series)


def _labels_and_zone(times, name: str, *, time_format=None, dayfirst=None):
    """``(labels, utc, tz)``: the timestamps as float64 or datetime64, whether they were
    converted to UTC from a timezone or UTC offsets, and the one timezone they were given in
    (``None`` if none, or several)."""
    return _labels_zone_freq(times, name, time_format=time_format, dayfirst=dayfirst)[:3]


def _labels_zone_freq(times, name: str, *, time_format=None, dayfirst=None):
    """:func:`_labels_and_zone`'s ``(labels, utc, tz)`` and the frequency of the pandas periods
    the times were given as (``None`` for other times): periods are the times they start
    (:func:`~kalmanscan.timeseries.time_periods.period_labels`)."""
    utc = False
    tz = None
    periods = period_labels(times, name)
    if periods is not None:
        return np.atleast_1d(periods[0]), False, None, periods[1]
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
        if isinstance(times.dtype, pd.DatetimeTZDtype):
            utc, tz = True, times.dtype.tz
            if isinstance(times, pd.Series):
                times = times.dt.tz_convert("UTC").dt.tz_localize(None)
            else:
                times = times.tz_convert("UTC").tz_localize(None)
        arr = np.asarray(times)
    elif _is_polars_series(times):
        zone = getattr(times.dtype, "time_zone", None)
        if zone is not None:  # (its numpy values are the UTC times, without the zone)
            utc, tz = True, zone
        arr = times.to_numpy()
    elif hasattr(times, "detach") and hasattr(times, "cpu"):  # torch tensor
        if getattr(times, "requires_grad", False):
            raise TypeError(
                f"{name}: expected values without a gradient (gradients with respect to {name} "
                "are not supported: results are differentiable in the parameters and the data), "
                f"got a tensor that requires grad; pass {name}.detach()"
            )
        t = times.detach().cpu()
        if t.is_complex():
            raise TypeError(f"{name}: expected real numbers or datetimes, got dtype {t.dtype}")
        arr = t.resolve_neg().resolve_conj().numpy()
    else:
        arr = np.asarray(times)
    if arr.dtype.kind == "O" and arr.size and all(is_cftime(v) for v in arr.ravel()):
        arr = cftime_datetimes(arr, name)  # (a model calendar's dates stay cftime objects)
    elif (
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
    elif is_cftime_array(arr):
        pass
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
    return np.atleast_1d(arr), zoned, tz if zoned else None, None


def as_time_axis(
    times, n: int, time_unit=None, name: str = "times", *, time_format=None, dayfirst=None
) -> TimeAxis:
    """Check and convert ``times`` for a record of ``n`` steps.

    Args:
        times: ``None`` (steps ``0, 1, ..., n-1``), ``[n]`` numbers, numpy ``datetime64`` values, a
            pandas ``DatetimeIndex``/``Series`` (tz-aware ones are converted to UTC), pandas
            periods (a ``PeriodIndex``, ``Period`` objects: each the time it starts, the
            frequency kept in :attr:`TimeAxis.period_freq`), cftime dates
            (a ``CFTimeIndex``; :mod:`~kalmanscan.timeseries.time_cftime`) or timestamp
            strings (see :func:`parse_datetime_strings`), or a :class:`TimeAxis` (its labels,
            in its unit unless ``time_unit`` is given). Non-decreasing, no NaN/NaT; equal
            timestamps are steps of length 0.
        n: number of time steps of the record.
        time_unit: model time unit for datetimes (default ``"1D"``); must be ``None`` for numbers.
        name: the argument named in error messages.
        time_format, dayfirst: how to read strings (see :func:`parse_datetime_strings`).

    Returns:
        a :class:`TimeAxis`.

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
    given_utc, given_tz, given_freq = False, None, None
    if isinstance(times, TimeAxis):  # e.g. strings parsed once with dayfirst or time_format
        if time_unit is None and times.is_datetime:
            time_unit = np.timedelta64(times.unit, "ns")
        given_freq = times.period_freq
        times, given_utc, given_tz = times.labels, times.utc, times.tz
    labels, utc, tz, freq = _labels_zone_freq(
        times, name, time_format=time_format, dayfirst=dayfirst
    )
    utc = utc or (given_utc and labels.dtype.kind == "M")
    tz = tz if tz is not None else (given_tz if utc else None)
    if freq is None and labels.dtype.kind == "M":
        freq = given_freq
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
    elif is_cftime_array(labels):
        unit, unit_name = parse_time_unit(time_unit)
        t = cf_elapsed(labels, labels[0], unit)
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
        shown = labels[i - 1 : i + 1]
        if freq is not None:  # (periods as pandas writes them: 1959Q2)
            shown = to_periods(shown, freq).astype(str)
        raise ValueError(
            f"{name}: expected non-decreasing timestamps, got {shown[1]} after {shown[0]} "
            f"(position {i}); sort the record by time first"
        )
    return TimeAxis(labels, t, unit, unit_name, utc, tz, freq)


def _decimal_places(labels, most: int = 12) -> int | None:
    """The fewest decimal places (up to ``most``) that every numeric label is written with
    (``1959.1`` -> 1, epoch seconds -> 0), or None.

    >>> _decimal_places(np.array([1959.1, 1959.25])), _decimal_places(np.array([0.1 + 0.2]))
    (2, None)
    """
    x = np.asarray(labels, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0 or np.abs(x).max() >= 1e15:
        return None
    for d in range(most + 1):
        if np.array_equal(np.round(x, d), x):
            return d
    return None
