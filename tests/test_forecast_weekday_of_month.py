"""Forecast dates of records on the n-th or last Monday, ..., Sunday of each month (pandas'
``WOM-3FRI``: the third Friday, monthly option expiries; ``LWOM-FRI``: the last Friday) continue
that rule as ``pd.date_range`` does, where they stepped by the median number of days before (a
third Friday's record forecast 2024-05-17 + 28 days = 2024-06-14, the second Friday)."""

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

pd = pytest.importorskip("pandas")

DAYS = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"]
RULES = [f"WOM-{n}{d}" for n in range(1, 5) for d in DAYS] + [f"LWOM-{d}" for d in DAYS]


def _future(idx, steps):
    """``steps`` forecast dates of record ``idx`` (a DatetimeIndex), in its timezone."""
    got = pd.DatetimeIndex(as_time_axis(idx, len(idx)).future(steps))
    return got.tz_localize("UTC").tz_convert(idx.tz) if idx.tz is not None else got


def _pandas_next(last, steps, freq, every=1):
    return pd.date_range(last, periods=every * steps + 1, freq=freq)[every::every]


@pytest.mark.parametrize("freq", RULES)
def test_decades_with_missing_months_continue_pandas(freq):
    # 40 years from 1970 and 25 from 1999-06, every month, quarter or year, with and without
    # three months left out: 36 forecasts each equal to pandas' continuation
    for start, n in (("1970-01-01", 480), ("1999-06-01", 300)):
        idx = pd.date_range(start, periods=n, freq=freq)
        for every in (1, 3, 12):
            rec = idx[::every]
            for r in (rec, rec.delete([2, len(rec) // 2, len(rec) // 2 + 1])):
                assert as_time_axis(r, len(r)).calendar_step() == every
                np.testing.assert_array_equal(
                    _future(r, 36), _pandas_next(r[-1], 36, freq, every), err_msg=freq
                )


@pytest.mark.parametrize("freq", ["WOM-3FRI", "WOM-1MON", "LWOM-FRI", "WOM-2WED"])
def test_short_records_and_16h_in_new_york(freq):
    # the fewest dates a weekday rule needs (3), and a close at 16:00 New York time with rows
    # missing, across daylight-saving changes: forecasts stay at 16:00 local on the rule
    idx = pd.date_range("2024-04-01", periods=3, freq=freq)
    np.testing.assert_array_equal(_future(idx, 12), _pandas_next(idx[-1], 12, freq))
    idx = pd.date_range("2021-01-01", periods=40, freq=freq) + pd.Timedelta(hours=16)
    idx = idx.delete([3, 17, 18, 30]).tz_localize("America/New_York")
    got = _future(idx, 14)
    np.testing.assert_array_equal(got, _pandas_next(idx[-1], 14, freq))
    assert (got.hour == 16).all()


@pytest.mark.parametrize(
    "freq,holidays,shift",
    [
        ("WOM-3FRI", "good-friday", -1),  # an expiry on Good Friday moves to the Thursday
        ("WOM-1MON", "labor-day", 1),  # a first Monday of September to the Tuesday
    ],
)
def test_holiday_moves_keep_the_rule(freq, holidays, shift):
    from pandas.tseries.holiday import GoodFriday, USLaborDay

    idx = pd.date_range("1990-01-01", "2024-12-31", freq=freq)
    rule = GoodFriday if holidays == "good-friday" else USLaborDay
    hit = idx.isin(rule.dates("1990-01-01", "2024-12-31"))
    assert hit.sum() >= 3 and not hit[-1]
    moved = idx.where(~hit, idx + pd.Timedelta(days=shift))
    assert as_time_axis(moved, len(moved)).calendar_step() == 1
    np.testing.assert_array_equal(_future(moved, 24), _pandas_next(moved[-1], 24, freq))


def test_forecast_through_the_model_and_the_fit():
    idx = pd.date_range("2015-01-01", periods=120, freq="WOM-3FRI")
    rng = np.random.default_rng(0)
    z = pd.Series(np.cumsum(rng.normal(size=120)) + rng.normal(size=120), index=idx)
    want = ["2025-01-17", "2025-02-21", "2025-03-21", "2025-04-18"]
    fc = ks.OUModel(sigma2=1.0, obs_var=1.0).forecast(z, steps=4)
    assert [str(t)[:10] for t in np.asarray(fc.times)] == want
    fit = ks.fit_ou(z)
    assert [str(t)[:10] for t in np.asarray(fit.forecast(steps=4).times)] == want
    assert [str(t)[:10] for t in np.asarray(ks.forecast(fit, steps=4).times)] == want


@pytest.mark.parametrize(
    "dates",
    [
        # a third Friday, then two fourth ones (7 days off: no holiday)
        ["2024-01-19", "2024-02-16", "2024-03-15", "2024-04-26", "2024-05-24", "2024-06-21"],
        # Fridays of every week of the month in turn
        ["2024-01-05", "2024-02-09", "2024-03-15", "2024-04-26", "2024-05-03"],
        # third Fridays and third Thursdays
        ["2024-01-19", "2024-02-15", "2024-03-15", "2024-04-18", "2024-05-17"],
    ],
)
def test_other_dates_are_not_a_week_of_month_rule(dates):
    d = np.array(dates, dtype="datetime64[D]")
    ax = as_time_axis(d, len(d))
    assert ax.calendar_step() is None
    np.testing.assert_array_equal(ax.future(2), ax.labels[-1] + np.arange(1, 3) * ax.step())


def test_three_dates_four_weeks_apart_stay_four_weekly():
    # the third Fridays of 2024-01 to 03 are 28 days apart: every fourth Friday, as
    # pd.infer_freq reads them ("4W-FRI"); a fourth date decides
    idx = pd.date_range("2024-01-01", periods=4, freq="WOM-3FRI")
    got = _future(idx[:3], 2)
    np.testing.assert_array_equal(got, idx[2] + pd.to_timedelta([28, 56], unit="D"))
    np.testing.assert_array_equal(_future(idx, 2), _pandas_next(idx[-1], 2, "WOM-3FRI"))
