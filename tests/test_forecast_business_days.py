"""Forecasts of business-daily records (trading days) fall on business days, not weekends."""

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

pd = pytest.importorskip("pandas")


def _days(ax_labels):
    return [str(x)[:10] for x in ax_labels]


def test_trading_days_skip_weekends():
    t = pd.bdate_range("2024-01-01", periods=60)  # ends Friday 2024-03-22
    z = pd.Series(np.random.default_rng(0).normal(size=60).cumsum(), index=t)
    fc = ks.forecast(ks.OUModel(sigma2=1.0, obs_var=1.0), z, steps=6)
    assert _days(fc.times) == [
        "2024-03-25", "2024-03-26", "2024-03-27", "2024-03-28", "2024-03-29", "2024-04-01",
    ]  # fmt: skip
    assert np.is_busday(np.asarray(fc.times, dtype="datetime64[D]")).all()
    # the level's variance grows with the calendar time to each date (Monday: 3 days)
    v = fc.var
    assert v[5] - v[4] == pytest.approx(3 * (v[1] - v[0]), rel=1e-9)


def test_time_of_day_and_holidays_kept():
    t = pd.bdate_range("2024-01-01", periods=30).delete([10, 11]) + pd.Timedelta(hours=16)
    ax = as_time_axis(t.values, len(t))
    got = ax.future(2)
    assert [str(x) for x in got.astype("datetime64[s]")] == [
        "2024-02-12T16:00:00", "2024-02-13T16:00:00",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "times",
    [
        pd.date_range("2024-01-01", periods=30, freq="D"),  # every day: by the median step
        pd.bdate_range("2024-01-01", periods=5),  # Monday to Friday: no weekend seen
        pd.bdate_range("2024-01-01", periods=30, freq="8h"),  # several a day
        pd.date_range("2024-01-01", periods=30, freq="W-MON"),  # weekly
    ],
)
def test_other_records_by_their_step(times):
    ax = as_time_axis(times.values, len(times))
    step = ax.step()
    want = ax.labels[-1] + np.arange(1, 4) * step
    np.testing.assert_array_equal(ax.future(3), want)


def test_cli_fred_export(tmp_path):
    from kalmanscan.cli import main
    from tests.test_cli_missing_markers import FRED

    path = tmp_path / "dgs10.csv"
    path.write_text(FRED)
    out = tmp_path / "out"
    rc = main(
        ["filter", str(path), "--time-col", "DATE", "--missing", ".", "--sigma2", "0.003",
         "--obs-var", "0.0005", "--forecast", "3", "--quiet", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    table = pd.read_csv(out / "results.csv")
    fc = table[table["kind"] == "forecast"]["time"].tolist()
    assert fc == ["2024-01-22", "2024-01-23", "2024-01-24"]  # Friday 19th, then Monday on


@pytest.mark.parametrize(
    "tz, close", [("UTC", "0h"), ("America/New_York", "16h"), ("Europe/London", "8h")]
)
def test_timezones_on_their_local_calendar(tz, close):
    t = (pd.bdate_range("2024-02-01", "2024-03-29") + pd.Timedelta(close)).tz_localize(tz)
    z = pd.Series(np.random.default_rng(1).normal(size=len(t)).cumsum(), index=t)
    fc = ks.forecast(ks.OUModel(sigma2=1.0, obs_var=1.0), z, steps=3)
    local = fc.times  # in the record's zone (a tz-aware DatetimeIndex)
    assert isinstance(local, pd.DatetimeIndex) and str(local.tz) == tz
    assert [x.day_name()[:3] for x in local] == ["Mon", "Tue", "Wed"]
    assert all(x.strftime("%H:%M") == (t[-1].strftime("%H:%M")) for x in local)


def test_weekday_patterns_and_exceptions():
    b = pd.bdate_range("2024-01-01", "2024-03-29")
    mwf = b[b.day_of_week.isin([0, 2, 4])]  # ends Friday 2024-03-29
    got = as_time_axis(mwf.values, len(mwf)).future(4)
    assert _days(got) == ["2024-04-01", "2024-04-03", "2024-04-05", "2024-04-08"]
    # one Saturday session in a trading record: still trading days
    sat = b.append(pd.DatetimeIndex(["2024-02-10"])).sort_values()
    assert _days(as_time_axis(sat.values, len(sat)).future(2)) == ["2024-04-01", "2024-04-02"]
    # a close at 16:00 with one 13:00 half day: at 16:00
    clock = b + pd.Timedelta("16h")
    clock = clock.where(clock != pd.Timestamp("2024-03-28 16:00"), pd.Timestamp("2024-03-28 13:00"))
    got = as_time_axis(clock.values, len(clock)).future(1)
    assert str(got[0].astype("datetime64[m]")) == "2024-04-01T16:00"


def test_utc_close_across_daylight_saving_takes_the_latest_season():
    """A New York close written in UTC: 21:00 in winter, 20:00 from March 10."""
    t = pd.bdate_range("2024-01-02", "2024-03-28") + pd.Timedelta("16h")
    utc = t.tz_localize("America/New_York").tz_convert("UTC").tz_localize(None)
    got = as_time_axis(utc.values, len(utc)).future(2)
    assert [str(x.astype("datetime64[m]")) for x in got] == [
        "2024-03-29T20:00", "2024-04-01T20:00",
    ]  # fmt: skip


def test_far_weekday_forecasts_leave_nanoseconds_in_microseconds():
    """A million trading days after a nanosecond record of 2261 pass nanoseconds' range
    (2262-04-11): made in microseconds on the same weekdays and close (they wrapped around to
    2002 before: numpy's cast overflowed silently; numpy 2.5.2 crashes on such a cast)."""
    days = pd.bdate_range("2261-01-03", periods=40)
    lab = (days + pd.Timedelta(hours=16)).values.astype("datetime64[ns]")
    got = as_time_axis(lab, len(lab)).future(1_000_000)
    assert got.dtype == np.dtype("datetime64[us]")
    d = got.astype("datetime64[D]")
    want = np.busday_offset(lab[-1].astype("datetime64[D]"), np.arange(1, 1_000_001))
    np.testing.assert_array_equal(d, want)
    assert (got - d == np.timedelta64(16, "h")).all()
    assert str(got[-1]) == "6094-03-24T16:00:00.000000"
    # the first ten still fit nanoseconds: kept there
    assert as_time_axis(lab, len(lab)).future(10).dtype == np.dtype("datetime64[ns]")


def test_weekday_forecasts_past_seconds_range_raise():
    """A weekday record near the end of seconds' range (year 292,277,026,596): forecasts that
    leave it raise, naming the steps, not wrapped dates."""
    days = np.busday_offset(np.datetime64("292277025000-01-03"), np.arange(40), roll="forward")
    lab = days.astype("datetime64[s]") + np.timedelta64(16, "h")
    ax = as_time_axis(lab, len(lab))
    assert (
        ax.future(3).astype("datetime64[D]").tolist()
        == np.busday_offset(days[-1], [1, 2, 3]).tolist()
    )
    with pytest.raises(ValueError, match=r"steps: 1000000 of the record's weekdays .* range"):
        ax.future(1_000_000)


def test_records_from_the_first_day_of_nanoseconds_range():
    """Records starting 1677-09-21 after 00:12:43 in nanoseconds: their days floored by numpy's
    cast overflow (it wrapped the first date's day to 2262; numpy 2.5.2 crashes on such a cast
    of 10,000 dates): a monthly record kept its 21st at 01:00 only where the days are floored in
    integers (by the median step before), and 12,000 trading days keep their weekdays."""
    # (built in minutes: 1677-09-21 00:00 itself is outside nanoseconds' range)
    months = np.arange(np.datetime64("1677-09"), np.datetime64("1678-09")).astype("M8[D]")
    lab = (months + np.timedelta64(20, "D") + np.timedelta64(60, "m")).astype("datetime64[ns]")
    got = as_time_axis(lab, lab.size).future(3)
    assert [str(x) for x in got.astype("datetime64[m]")] == [
        "1678-09-21T01:00", "1678-10-21T01:00", "1678-11-21T01:00",
    ]  # fmt: skip
    d = np.busday_offset(np.datetime64("1677-09-21"), np.arange(12_000), roll="forward")
    lab = (d + np.timedelta64(16, "h")).astype("datetime64[ns]")
    got = as_time_axis(lab, lab.size).future(4)
    np.testing.assert_array_equal(
        got.astype("datetime64[D]"), np.busday_offset(d[-1], [1, 2, 3, 4])
    )
    assert (got - got.astype("datetime64[D]") == np.timedelta64(16, "h")).all()
