"""Dates of cftime's calendars (xarray's dates in climate models' calendars) as time labels.

Dates of the proleptic Gregorian calendar, and of ``standard`` / ``gregorian`` from 1582-10-15,
are numpy's: they become ``datetime64[us]``, exactly (:func:`cftime_datetimes`). Another
calendar's days are not numpy's (``noleap`` has no Feb 29, ``360_day`` has a Feb 30, ``julian``
has a leap day every fourth year), so its dates stay cftime objects and every step is measured
in that calendar (:func:`cf_elapsed`): ``noleap``'s Feb 28 -> Mar 1 is one day. Forecast times
continue in the calendar: by whole months where the dates are monthly (:func:`cf_month_parts`,
:func:`cf_calendar_future`), else by the typical step.

>>> import cftime, numpy as np
>>> d = np.array([cftime.datetime(2001, 2, 28, calendar="noleap"),
...               cftime.datetime(2001, 3, 1, calendar="noleap")])
>>> cf_elapsed(d, d[0], np.timedelta64(1, "D")).tolist()
[0.0, 1.0]
"""

from __future__ import annotations

import datetime as _dt

import numpy as np

# cftime's calendars whose dates are numpy's (the proleptic Gregorian calendar); "standard" and
# "gregorian" are Julian before 1582-10-15
_CF_GREGORIAN = ("proleptic_gregorian", "standard", "gregorian")
# cftime's calendar names (the CLI's --calendar)
CF_CALENDARS = (
    "360_day", "noleap", "365_day", "all_leap", "366_day", "julian", *_CF_GREGORIAN,
)  # fmt: skip
_US = _dt.timedelta(microseconds=1)


def is_cftime(v) -> bool:
    """``v`` is a cftime datetime (xarray's dates in model calendars: ``noleap``, ``360_day``)."""
    return type(v).__module__.split(".")[0] == "cftime" and hasattr(v, "calendar")


def is_cftime_array(arr: np.ndarray) -> bool:
    """An object array of cftime datetimes (a record's labels in a model calendar)."""
    return arr.dtype.kind == "O" and arr.size > 0 and is_cftime(arr.ravel()[0])


def cftime_datetimes(values: np.ndarray, name: str) -> np.ndarray:
    """cftime datetimes of one calendar as labels: ``datetime64[us]`` where their dates are
    numpy's (exactly), else the cftime objects themselves, whose steps :func:`cf_elapsed`
    measures in their calendar. Refused: dates of several calendars, and dates without one."""
    flat = values.ravel()
    cals = sorted({str(v.calendar) for v in flat})
    if len(cals) > 1:
        raise ValueError(f"{name}: expected cftime dates of one calendar, got calendars {cals}")
    cal = cals[0]
    if not cal:
        raise ValueError(
            f"{name}: got cftime dates without a calendar, whose steps are not defined; give "
            "them a calendar (cftime.datetime(..., calendar='standard'))"
        )
    first = flat[0]
    zero = {bool(v.has_year_zero) for v in flat}
    if len(zero) > 1:
        raise ValueError(
            f"{name}: expected cftime dates of one year-zero convention, got dates with and "
            "without a year 0 (has_year_zero)"
        )

    if kept_calendar(flat) is None:
        epoch = type(first)(1970, 1, 1, calendar=cal, has_year_zero=first.has_year_zero)
        us = [(v - epoch) // _US for v in flat]
        return np.array(us, dtype=np.int64).view("datetime64[us]").reshape(values.shape)
    return np.array(flat, dtype=object).reshape(values.shape)


def kept_calendar(values) -> str | None:
    """The calendar of cftime dates that :func:`cftime_datetimes` keeps as cftime dates (a
    calendar whose days are not numpy's), else None (Gregorian dates from 1582-10-15, proleptic
    Gregorian ones, and anything that is not cftime dates). Reads the first date's calendar."""
    flat = np.asarray(values).ravel()
    if not is_cftime_array(flat):
        return None
    first = flat[0]
    cal = str(first.calendar)
    if cal == "proleptic_gregorian":
        return None
    if cal in _CF_GREGORIAN:
        reform = type(first)(1582, 10, 15, calendar=cal, has_year_zero=first.has_year_zero)
        return cal if any(v < reform for v in flat) else None
    return cal


def calendar_of(labels: np.ndarray) -> str:
    """The calendar of cftime labels."""
    return str(labels.ravel()[0].calendar)


def cf_check_like(arr: np.ndarray, labels: np.ndarray, name: str) -> None:
    """Refuse timestamps ``arr`` that are not cftime dates of the record's calendar."""
    cal = calendar_of(labels)
    zero = labels.ravel()[0].has_year_zero
    if not is_cftime_array(arr) or any(
        str(v.calendar) != cal or v.has_year_zero != zero for v in arr.ravel()
    ):
        got = (
            f"cftime dates of the {calendar_of(arr)!r} calendar"
            if is_cftime_array(arr)
            else f"values of dtype {arr.dtype}"
        )
        raise TypeError(
            f"{name}: expected cftime dates of the record's {cal!r} calendar, got {got}"
        )


def cf_elapsed(labels: np.ndarray, origin, unit: np.timedelta64) -> np.ndarray:
    """``(labels - origin) / unit`` as float64, measured in the labels' own calendar: whole
    microseconds from cftime's subtraction, divided as integers (one rounding)."""
    unit_us = int(np.timedelta64(unit, "ns").astype(np.int64)) / 1000
    if unit_us == int(unit_us):
        per = int(unit_us)
        out = [((v - origin) // _US) / per for v in labels.ravel()]
    else:  # a unit of a fraction of a microsecond
        out = [((v - origin) // _US) * 1000 / (unit_us * 1000) for v in labels.ravel()]
    return np.array(out, dtype=np.float64).reshape(labels.shape)


def cf_step(med: float, unit: np.timedelta64) -> _dt.timedelta:
    """``med`` model time units as a duration (whole microseconds, at least one)."""
    us = med * (int(np.timedelta64(unit, "ns").astype(np.int64)) / 1000)
    return _dt.timedelta(microseconds=max(round(us), 1))


def _time_of_day(v) -> tuple:
    return (v.hour, v.minute, v.second, v.microsecond)


def cf_month_parts(labels: np.ndarray):
    """``(months from year 0 as int64, day-of-month rule, time of day)`` of cftime dates that
    all sit on one day of their month (at most the 28th), every one on its month's last (rule
    ``-1``), or on one day 29 or 30 where the month has it and on the month's last where it is
    shorter (``noleap``'s February 28 for a record on the 30th; rule ``29`` or ``30``), at one
    time of day; ``None`` otherwise and for fewer than two dates (as
    ``time_calendar._month_parts`` for datetime64).

    >>> import cftime
    >>> d = np.array([cftime.datetime(2001, m, min(30, 28 if m == 2 else 30), calendar="noleap")
    ...               for m in (1, 2, 3)])
    >>> cf_month_parts(d)[1]
    30
    """
    flat = labels.ravel()
    if flat.size < 2:
        return None
    tod = _time_of_day(flat[0])
    if any(_time_of_day(v) != tod for v in flat):
        return None
    days = {v.day for v in flat}
    top = max(days)
    if len(days) == 1 and top <= 28:
        rule = top
    elif all(v.day == v.daysinmonth for v in flat):
        rule = -1
    elif top in (29, 30) and all(v.day == min(top, v.daysinmonth) for v in flat):
        rule = top
    else:
        return None
    months = np.array([_astronomical_year(v) * 12 + v.month - 1 for v in flat], dtype=np.int64)
    return months, rule, tod


def _astronomical_year(v) -> int:
    """The year of a cftime date counted with a year 0 (1 BC is 0 where the date's calendar
    has no year 0: ``has_year_zero`` False), so that months count on across it."""
    return v.year + 1 if v.year < 0 and not v.has_year_zero else v.year


def cf_calendar_future(parts, months: int, k: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The dates ``k * months`` calendar months after the last of ``labels``, in their calendar,
    on the same day of the month (the month's last where it is shorter, for a day 29 or 30) or
    month end, and time of day (``parts``: :func:`cf_month_parts`)."""
    m, rule, tod = parts
    last = labels.ravel()[-1]
    make = type(last)
    cal = str(last.calendar)
    out = []
    for j in np.asarray(k).ravel():
        y, mo = divmod(int(m[-1]) + int(j) * months, 12)
        if y <= 0 and not last.has_year_zero:
            y -= 1  # (1 BC, written -1)
        first = make(y, mo + 1, 1, calendar=cal, has_year_zero=last.has_year_zero)
        day = first.daysinmonth if rule == -1 else min(rule, first.daysinmonth)
        out.append(make(y, mo + 1, day, *tod, calendar=cal, has_year_zero=last.has_year_zero))
    return np.array(out, dtype=object)


# the layouts read without a given format (the first that reads the first date)
CF_LAYOUTS = (
    "%Y-%m-%d",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M",
    "%Y-%m",
)


class CalendarParseError(ValueError):
    """A date text that the calendar's layout does not read: ``index``, ``value``, ``fmt``
    (``None`` where no layout reads the first text)."""

    def __init__(self, message: str, index: int, value: str, fmt: str | None):
        super().__init__(message)
        self.index, self.value, self.fmt = index, value, fmt


def parse_cftime_strings(strs, calendar: str, name: str, time_format=None, like=None):
    """Date texts as cftime dates of ``calendar``, in one layout for all (``time_format``, else
    the first of :data:`CF_LAYOUTS` that reads the first text); ``like``: a date whose year-zero
    convention they take. Raises :class:`CalendarParseError` naming the first text not read.

    >>> parse_cftime_strings(["2000-02-30"], "360_day", "at")[0].strftime("%Y-%m-%d")
    '2000-02-30'
    """
    import cftime

    strs = [str(v).strip() for v in strs]
    zero = {} if like is None else {"has_year_zero": like.has_year_zero}

    def read(text, f):
        d = cftime.datetime.strptime(text, f, calendar=calendar)
        return d if not zero else d.replace(**zero)

    fmt, invalid = None, None
    for f in [time_format] if time_format is not None else CF_LAYOUTS:
        try:
            read(strs[0], f)
        except ValueError as err:
            if "invalid" in str(err) and invalid is None:  # the layout, not the date, fits
                invalid = (f, err)
            continue
        fmt = f
        break
    if fmt is None and invalid is not None:  # a date the calendar lacks (360_day's Aug 31)
        raise CalendarParseError(
            f"{name}: cannot parse {strs[0]!r} (position 0) as a date of the {calendar!r} "
            f"calendar in the layout {invalid[0]!r} ({invalid[1]})",
            0,
            strs[0],
            invalid[0],
        ) from invalid[1]
    if fmt is None:
        raise CalendarParseError(
            f"{name}: cannot parse {strs[0]!r} (position 0) as a date of the {calendar!r} "
            "calendar (expected a layout like 2000-02-30, 2000-02-30 12:00 or "
            "2000-02-30T12:00:00)",
            0,
            strs[0],
            None,
        )
    out = []
    for i, text in enumerate(strs):
        try:
            out.append(read(text, fmt))
        except ValueError as err:
            raise CalendarParseError(
                f"{name}: cannot parse {text!r} (position {i}) as a date of the {calendar!r} "
                f"calendar in the layout {fmt!r} ({err})",
                i,
                text,
                fmt,
            ) from err
    return np.array(out, dtype=object)
