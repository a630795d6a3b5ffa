"""Forecast dates of monthly, quarterly, yearly and semi-monthly records continue the record's own
calendar as pandas' offset does: business-day month ends and starts (BME, BQE, BYE, BMS, BQS,
BYS), semi-monthly days (SMS, SME), a day 29 or 30 on the month's end in shorter months."""

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

pd = pytest.importorskip("pandas")


def _future(idx, steps):
    """``steps`` forecast dates of record ``idx`` (a DatetimeIndex), in its timezone."""
    got = pd.DatetimeIndex(as_time_axis(idx, len(idx)).future(steps))
    return got.tz_localize("UTC").tz_convert(idx.tz) if idx.tz is not None else got


def _pandas_next(idx, steps, freq):
    return pd.date_range(idx[-1], periods=steps + 1, freq=freq)[1:]


# (freq, start, periods): leap years (2024-02-29 a Thursday, 2028-02-29 a Tuesday), long runs,
# and month ends falling on weekends (2025-05-31, 2025-08-31, 2026-01-31, 2026-10-31)
CASES = [
    ("BME", "2020-01-01", 60),
    ("BME", "1999-06-01", 400),
    ("BQE", "2020-01-01", 20),
    ("BQE-FEB", "2001-01-01", 33),
    ("BYE", "2001-01-01", 24),
    ("BYE-JUN", "1990-01-01", 40),
    ("BMS", "2020-01-01", 60),
    ("BQS", "2019-01-01", 17),
    ("BYS", "2003-01-01", 21),
    ("SMS", "2023-11-01", 31),
    ("SME", "2023-11-15", 31),
    ("SMS-10", "2027-12-01", 9),
    ("SME-20", "2027-12-31", 9),
    ("2BME", "2020-01-01", 20),
]


@pytest.mark.parametrize("freq,start,n", CASES, ids=[f"{c[0]}-{c[1][:4]}-N{c[2]}" for c in CASES])
def test_continues_pandas_offset(freq, start, n):
    idx = pd.date_range(start, periods=n, freq=freq)
    np.testing.assert_array_equal(_future(idx, 30), _pandas_next(idx, 30, freq))


@pytest.mark.parametrize("freq", ["BME", "BQE", "BMS", "SMS", "SME"])
def test_missing_rows_16h_in_new_york(freq):
    # rows missing (a month, or half a month, skipped), the close at 16:00 New York time across
    # daylight-saving changes: forecasts stay at 16:00 local on the calendar
    idx = pd.date_range("2021-01-01", periods=40, freq=freq) + pd.Timedelta(hours=16)
    idx = idx.delete([3, 17, 18, 30]).tz_localize("America/New_York")
    got = _future(idx, 14)
    np.testing.assert_array_equal(got, _pandas_next(idx, 14, freq))
    assert (got.hour == 16).all()


def test_probe_cases_through_forecast():
    # the probe's records (.session/probe-fit REPORT finding 1) through OUModel.forecast
    m = ks.OUModel(sigma2=1.0, obs_var=1.0)
    cases = {
        f: pd.date_range("2020-01-01", "2024-12-31", freq=f) for f in ("BME", "BQE", "BYE", "BMS")
    }
    cases["29th"] = pd.to_datetime(["2023-03-29", "2023-04-29", "2023-05-29", "2023-06-29"])
    cases["30th"] = pd.to_datetime(
        ["2023-09-30", "2023-10-30", "2023-11-30", "2023-12-30", "2024-01-30"]
    )
    want = {
        "BME": ["2025-01-31", "2025-02-28", "2025-03-31", "2025-04-30"],
        "BQE": ["2025-03-31", "2025-06-30", "2025-09-30", "2025-12-31"],
        "BYE": ["2025-12-31", "2026-12-31", "2027-12-31", "2028-12-29"],
        "BMS": ["2025-01-01", "2025-02-03", "2025-03-03", "2025-04-01"],
        "29th": ["2023-07-29", "2023-08-29", "2023-09-29", "2023-10-29"],
        "30th": ["2024-02-29", "2024-03-30", "2024-04-30", "2024-05-30"],
    }
    for name, idx in cases.items():
        z = pd.Series(np.linspace(1.0, 2.0, len(idx)), index=idx)
        times = np.asarray(m.forecast(z, steps=4).times)
        # date-only records stay at midnight (no 12:00 from a 30.5- or 365.5-day step)
        assert [str(t) for t in times.astype("datetime64[D]")] == want[name], name
        assert (times == times.astype("datetime64[D]").astype(times.dtype)).all(), name


@pytest.mark.parametrize(
    "day,start,n,want",
    [
        # day 31: every month's end (Jan 31 -> Feb 29 -> Mar 31)
        (31, "2023-10-31", 3, ["2024-01-31", "2024-02-29", "2024-03-31", "2024-04-30"]),
        # day 30: February's end, then the 30th again
        (30, "2023-10-30", 3, ["2024-01-30", "2024-02-29", "2024-03-30", "2024-04-30"]),
        (30, "2022-11-30", 3, ["2023-02-28", "2023-03-30", "2023-04-30", "2023-05-30"]),
        # day 29: Feb 29 in a leap year, Feb 28 otherwise
        (29, "2023-11-29", 2, ["2024-01-29", "2024-02-29", "2024-03-29", "2024-04-29"]),
        (29, "2022-12-29", 2, ["2023-02-28", "2023-03-29", "2023-04-29", "2023-05-29"]),
    ],
)
def test_day_29_to_31_on_shorter_months_end(day, start, n, want):
    idx = pd.DatetimeIndex(
        [pd.Timestamp(start) + pd.DateOffset(months=k) for k in range(n)]
    ) + pd.Timedelta(hours=9, minutes=30)
    assert (idx.day == day).any()
    got = _future(idx, 4)
    assert [str(t)[:16] for t in got] == [f"{w} 09:30" for w in want]


def test_day_30_quarterly_through_february_and_leap_years():
    # quarterly on the 30th, a quarter missing: Nov 30 -> Feb 28/29 -> May 30 ...
    first = pd.Timestamp("2019-11-30")
    idx = pd.DatetimeIndex([first + pd.DateOffset(months=3 * k) for k in range(12) if k != 5])
    got = _future(idx, 8)
    want = [first + pd.DateOffset(months=3 * k) for k in range(12, 20)]
    want = [t.replace(day=min(30, t.days_in_month)) for t in want]
    np.testing.assert_array_equal(got, pd.DatetimeIndex(want))
    assert {"2023-02-28", "2024-02-29"} <= {str(t)[:10] for t in got}


def test_trading_calendar_month_ends_and_quarter_starts():
    # the last / first trading day of each month or quarter of a holiday calendar (US federal
    # holidays and Good Friday): a holiday moves some of them (New Year's Day every January
    # start); the forecasts continue pandas' BME / BQS (holidays are not known)
    from pandas.tseries.holiday import AbstractHolidayCalendar, GoodFriday, USFederalHolidayCalendar

    class Trading(AbstractHolidayCalendar):
        rules = USFederalHolidayCalendar.rules + [GoodFriday]

    px = pd.date_range(
        "2012-01-01", "2024-12-31", freq=pd.offsets.CustomBusinessDay(calendar=Trading())
    )
    s = pd.Series(1.0, index=px)
    for how, per, freq in (("tail", "M", "BME"), ("head", "Q", "BQS")):
        idx = getattr(s.groupby(px.to_period(per)), how)(1).index
        assert not idx.isin(pd.date_range(idx[0], idx[-1], freq=freq)).all()  # (moved ones)
        np.testing.assert_array_equal(_future(idx, 12), _pandas_next(idx, 12, freq))


def test_calendar_step():
    bqe = pd.date_range("2023-01-01", periods=9, freq="BQE")  # 2023-09-29 a Friday
    assert as_time_axis(bqe, 9).calendar_step() == 3
    sms = pd.date_range("2020-01-01", periods=9, freq="SMS")
    assert as_time_axis(sms, 9).calendar_step() is None  # half months
    monthly_sms = sms[::2]
    assert as_time_axis(monthly_sms, 5).calendar_step() == 1


@pytest.mark.parametrize(
    "dates,step_days",
    [
        (["2019-02-01", "2019-02-15", "2019-03-01"], 14),  # two weeks apart, as pd.infer_freq
        (["1979-02-10", "1979-02-24", "1979-03-10", "1979-03-24"], 14),
        (["2023-02-14", "2023-02-28", "2023-03-14"], 14),  # (the 14th and month ends: SME-14)
    ],
)
def test_weekly_records_keep_their_step(dates, step_days):
    d = np.array(dates, dtype="datetime64[D]")
    got = as_time_axis(d, len(d)).future(3)
    want = d[-1].astype(got.dtype) + np.arange(1, 4) * np.timedelta64(step_days, "D")
    np.testing.assert_array_equal(got, want)
