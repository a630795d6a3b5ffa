"""Forecast dates of monthly cftime records on a day 29 or 30 continue the record's rule in its
own calendar: the day where the month has it, the month's last where it is shorter (``noleap``'s
February 28 for a record on the 30th, then the 30th again in March), as the datetime64 path does
(``pd.DateOffset(months=k)``). They stepped by the median number of days before, drifting off the
day."""

from __future__ import annotations

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

cftime = pytest.importorskip("cftime")
pd = pytest.importorskip("pandas")

CALENDARS = [
    "noleap", "365_day", "360_day", "all_leap", "366_day", "julian", "standard", "gregorian",
    "proleptic_gregorian",
]  # fmt: skip


def _month_len(calendar, year, month):
    """Month lengths written out per calendar (not cftime's ``daysinmonth``)."""
    if calendar == "360_day":
        return 30
    if month != 2:
        return [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    if calendar in ("noleap", "365_day"):
        return 28
    if calendar in ("all_leap", "366_day"):
        return 29
    if calendar == "julian" or (calendar in ("standard", "gregorian") and year < 1582):
        return 29 if year % 4 == 0 else 28
    return 29 if (year % 4 == 0 and year % 100 != 0) or year % 400 == 0 else 28


def _monthly(calendar, day, start, count, every=1, hour=0):
    """``(year, month, day, hour)`` of ``count`` dates ``every`` months apart on ``day`` (the
    month's last where it is shorter)."""
    out = []
    for j in range(count):
        y, m = divmod(start[0] * 12 + start[1] - 1 + j * every, 12)
        out.append((y, m + 1, min(day, _month_len(calendar, y, m + 1)), hour))
    return out


def _dates(calendar, rows):
    return np.array([cftime.datetime(*r, calendar=calendar) for r in rows], dtype=object)


def _rows(values):
    if np.asarray(values).dtype.kind == "M":
        return [(t.year, t.month, t.day, t.hour) for t in pd.DatetimeIndex(values)]
    return [(t.year, t.month, t.day, t.hour) for t in values]


@pytest.mark.parametrize(
    ("calendar", "rows", "want"),
    [
        # the 30th of noleap's months: February 28, then the 30th again
        (
            "noleap",
            [(2000, 11, 30), (2000, 12, 30), (2001, 1, 30)],
            ["2001-02-28", "2001-03-30", "2001-04-30", "2001-05-30"],
        ),
        (
            "noleap",
            [(2000, 12, 29), (2001, 1, 29), (2001, 2, 28), (2001, 3, 29)],
            ["2001-04-29", "2001-05-29", "2001-06-29", "2001-07-29"],
        ),
        # all_leap: every February has its 29th
        (
            "all_leap",
            [(2001, 1, 30), (2001, 2, 29), (2001, 3, 30)],
            ["2001-04-30", "2001-05-30", "2001-06-30", "2001-07-30"],
        ),
        (
            "all_leap",
            [(2001, 10, 29), (2001, 11, 29), (2001, 12, 29)],
            ["2002-01-29", "2002-02-29", "2002-03-29", "2002-04-29"],
        ),
        # julian: 1900 is a leap year
        (
            "julian",
            [(1899, 11, 30), (1899, 12, 30), (1900, 1, 30)],
            ["1900-02-29", "1900-03-30", "1900-04-30", "1900-05-30"],
        ),
        # standard before 1582 is julian: 1500 is a leap year
        (
            "standard",
            [(1499, 11, 30), (1499, 12, 30), (1500, 1, 30)],
            ["1500-02-29", "1500-03-30", "1500-04-30", "1500-05-30"],
        ),
        # 360_day: every month has a 29th and a 30th
        (
            "360_day",
            [(2001, 1, 29), (2001, 2, 29), (2001, 3, 29)],
            ["2001-04-29", "2001-05-29", "2001-06-29", "2001-07-29"],
        ),
        # quarterly on the 30th through noleap's February
        (
            "noleap",
            [(2000, 5, 30), (2000, 8, 30), (2000, 11, 30)],
            ["2001-02-28", "2001-05-30", "2001-08-30", "2001-11-30"],
        ),
    ],
)
def test_hand_written_dates(calendar, rows, want):
    got = as_time_axis(_dates(calendar, rows), len(rows)).future(4)
    assert all(v.calendar == str(got[0].calendar) for v in got)
    assert [v.strftime("%Y-%m-%d") for v in got] == want


@pytest.mark.parametrize("calendar", CALENDARS)
@pytest.mark.parametrize("day", [29, 30])
def test_long_records_every_calendar(calendar, day):
    # 40 dates (with two missing) 1, 2, 3 or 12 months apart, at 00:00 and 12:00, forecast 36
    # more: each equals the month arithmetic of the calendar written out above
    starts = [(1, 1), (1499, 11)] if calendar in ("standard", "gregorian") else [(1, 1)]
    starts += [(1999, 11), (2099, 12)]
    for start in starts:
        for every in (1, 2, 3, 12):
            for hour in (0, 12):
                rows = _monthly(calendar, day, start, 76, every, hour)
                rec = rows[:3] + rows[5:40]
                got = as_time_axis(_dates(calendar, rec), len(rec)).future(36)
                assert _rows(got) == rows[40:], (start, every, hour)


def test_month_steps_and_forecast_through_the_model():
    rows = _monthly("noleap", 30, (2000, 1), 120)
    times = _dates("noleap", rows)
    assert as_time_axis(times, 120).calendar_step() == 1
    assert as_time_axis(times[::3], 40).calendar_step() == 3
    rng = np.random.default_rng(0)
    z = np.cumsum(rng.normal(size=120)) + rng.normal(size=120)
    fc = ks.OUModel(sigma2=1.0, obs_var=1.0).forecast(z, times, steps=3)
    assert [v.strftime("%Y-%m-%d") for v in fc.times] == ["2010-01-30", "2010-02-28", "2010-03-30"]
    fit = ks.fit_ou(z, times)
    assert [v.strftime("%Y-%m-%d") for v in fit.forecast(steps=2).times] == [
        "2010-01-30",
        "2010-02-28",
    ]


@pytest.mark.parametrize(
    "rows",
    [
        [(2001, 1, 30), (2001, 2, 27), (2001, 3, 30)],  # February's 27th: not the rule
        [(2001, 1, 29), (2001, 2, 28), (2001, 3, 30)],  # the 29th, then the 30th
    ],
)
def test_other_days_keep_the_median_step(rows):
    times = _dates("noleap", rows)
    ax = as_time_axis(times, 3)
    assert ax.calendar_step() is None
    step = ax.step()
    assert list(ax.future(2)) == [times[-1] + step, times[-1] + 2 * step]


@pytest.mark.filterwarnings("ignore:this date/calendar/year zero convention is not supported")
@pytest.mark.parametrize(
    ("zero", "rows", "want"),
    [
        # without a year 0, 1 BC (written -1) is followed by 1 AD, and is a Julian leap year
        (False, [(-1, 10, 15), (-1, 11, 15), (-1, 12, 15)], ["0001-01-15", "0001-02-15"]),
        (False, [(-2, 12, 30), (-1, 1, 30), (-1, 2, 29)], ["-0001-03-30", "-0001-04-30"]),
        (False, [(-1, 11, 30), (-1, 12, 30), (1, 1, 30)], ["0001-02-28", "0001-03-30"]),
        # with one, year 0 is that leap year
        (True, [(-1, 11, 30), (-1, 12, 30), (0, 1, 30)], ["0000-02-29", "0000-03-30"]),
    ],
)
def test_months_count_on_across_year_zero(zero, rows, want):
    times = np.array(
        [cftime.datetime(*r, calendar="julian", has_year_zero=zero) for r in rows], dtype=object
    )
    ax = as_time_axis(times, 3)
    assert ax.calendar_step() == 1
    got = ax.future(2)
    assert [v.strftime("%Y-%m-%d") for v in got] == want
    assert all(v.has_year_zero == zero for v in got)
