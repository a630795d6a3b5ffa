"""Forecasts of intraday records kept within trading hours fall on the next trading bars: the rest
of the session, then the next weekdays' sessions from their opening bar, at the record's times of
day (on the local clock where the times have a timezone), as a pandas grid of business days by
times of day and pandas' business-hour offsets lay them out. Records of other shapes (around the
clock, irregular ticks, sessions that move) keep their forecasts by the median step."""

import functools

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

pd = pytest.importorskip("pandas")
holiday = pytest.importorskip("pandas.tseries.holiday")

NY_HOLIDAYS = holiday.USFederalHolidayCalendar().holidays("2010-01-01", "2026-12-31")


class _UKCalendar(holiday.AbstractHolidayCalendar):
    rules = [
        holiday.Holiday("New Year", month=1, day=1, observance=holiday.next_monday),
        holiday.GoodFriday,
        holiday.EasterMonday,
        holiday.Holiday("Christmas", month=12, day=25, observance=holiday.next_monday_or_tuesday),
        holiday.Holiday("Boxing Day", month=12, day=26, observance=holiday.next_monday_or_tuesday),
    ]


UK_HOLIDAYS = _UKCalendar().holidays("2010-01-01", "2026-12-31")


def _times_of_day(start, end, bar, label="left"):
    """The bars' times of day of a session from ``start`` to ``end`` (``"09:30"``), labelled by
    their start (``"left"``: 09:30 to 15:55 for 5-minute bars) or their end (``"right"``)."""
    first, stop, size = pd.Timedelta(f"{start}:00"), pd.Timedelta(f"{end}:00"), pd.Timedelta(bar)
    begin = first + size if label == "right" else first
    return pd.timedelta_range(begin, periods=int((stop - first) / size), freq=bar)


# name: (session times of day (lists of (start, end) parts), bar, first day, last day, tz,
# holidays, label, half days (closing at 13:00 local), bars kept at random (fraction))
RECORDS = {
    "NY-1min-2023": ([("09:30", "16:00")], "1min", "2023-01-03", "2023-12-29",
                     "America/New_York", NY_HOLIDAYS, "left", ["2023-11-24"], 1.0),
    "NY-1min-sparse": ([("09:30", "16:00")], "1min", "2024-01-02", "2024-04-30",
                       "America/New_York", NY_HOLIDAYS, "left", [], 0.85),
    "NY-5min-2021-2023": ([("09:30", "16:00")], "5min", "2021-01-04", "2023-12-29",
                          "America/New_York", NY_HOLIDAYS, "left", ["2022-11-25"], 1.0),
    "NY-5min-right-naive": ([("09:30", "16:00")], "5min", "2022-01-03", "2023-06-30", None,
                            NY_HOLIDAYS, "right", [], 1.0),
    "NY-30min-2016-2024": ([("09:30", "16:00")], "30min", "2016-01-04", "2024-12-31",
                           "America/New_York", NY_HOLIDAYS, "left", ["2019-12-24"], 1.0),
    "NY-1h-2016-2024": ([("09:30", "16:00")], "1h", "2016-01-04", "2024-12-31",
                        "America/New_York", NY_HOLIDAYS, "left", [], 1.0),
    "NY-1h-naive-2018-2020": ([("09:30", "16:00")], "1h", "2018-01-02", "2020-12-31", None,
                              NY_HOLIDAYS, "left", [], 1.0),
    "LON-1min-2024": ([("08:00", "16:30")], "1min", "2024-01-02", "2024-06-28",
                      "Europe/London", UK_HOLIDAYS, "left", [], 1.0),
    "LON-5min-2019-2021": ([("08:00", "16:30")], "5min", "2019-01-02", "2021-12-31",
                           "Europe/London", UK_HOLIDAYS, "left", [], 1.0),
    "LON-30min-2012-2024": ([("08:00", "16:30")], "30min", "2012-01-03", "2024-12-31",
                            "Europe/London", UK_HOLIDAYS, "left", [], 1.0),
    "LON-1h-2012-2024": ([("08:00", "16:30")], "1h", "2012-01-03", "2024-12-31",
                         "Europe/London", UK_HOLIDAYS, "right", [], 1.0),
    "TKY-5min-lunch": ([("09:00", "11:30"), ("12:30", "15:00")], "5min", "2022-01-04",
                       "2023-12-29", "Asia/Tokyo", [], "left", [], 1.0),
}  # fmt: skip


@functools.cache
def _record(name):
    """The record ``name`` of :data:`RECORDS` (a DatetimeIndex) and its times of day."""
    parts, bar, first, last, tz, holidays, label, half, keep = RECORDS[name]
    tods = [_times_of_day(a, b, bar, label) for a, b in parts]
    tods = tods[0].append(tods[1:]) if len(tods) > 1 else tods[0]
    days = pd.bdate_range(first, last, freq="C", holidays=list(holidays))
    idx = pd.DatetimeIndex((days.values[:, None] + tods.values[None, :]).ravel())
    for day in half:  # a half day closes at 13:00
        d = pd.Timestamp(day)
        idx = idx[~((idx.normalize() == d) & (idx - d > pd.Timedelta("13:00:00")))]
    if keep < 1.0:  # bars missing at random (no trade in that minute)
        idx = idx[np.random.default_rng(7).random(idx.size) < keep]
    return (idx.tz_localize(tz) if tz else idx), tods


def _cuts(idx):
    """Positions to end the record at: a Friday's last bar before the change to summer time and
    before the change back, a Wednesday's mid-session bar, a Monday's opening bar, the last bar
    before a holiday or a half day, and 20 drawn at random after the first two weeks."""
    local = idx.tz_localize(None) if idx.tz is not None else idx
    day = local.normalize()
    last_of_day = np.r_[day[1:] != day[:-1], True]
    first_of_day = np.r_[True, day[1:] != day[:-1]]
    dow = local.day_of_week
    cuts = []
    for month in (3, 10):  # the Friday before the second Sunday of March / the last of October
        fri = np.flatnonzero(last_of_day & (dow == 4) & (local.month == month))
        cuts += [int(fri[1])] if fri.size > 1 else []
    wed = np.flatnonzero((dow == 2) & ~first_of_day & ~last_of_day)
    mon = np.flatnonzero(first_of_day & (dow == 0))
    cuts += [int(wed[wed.size // 2]), int(mon[mon.size // 3])]
    ends = np.flatnonzero(last_of_day)
    gaps = np.diff(day[ends].values).astype("timedelta64[D]").astype(int)
    holiday_eve = ends[:-1][(gaps > 1) & (dow[ends[:-1]] != 4)]  # a weekday off next
    cuts += [int(holiday_eve[0])] if holiday_eve.size else []
    start = int(np.searchsorted(day, day[0] + pd.Timedelta(days=15)))
    rng = np.random.default_rng(len(idx))
    cuts += sorted(int(x) for x in rng.integers(start, len(idx), 20))
    return cuts


def _future(idx, steps):
    """``steps`` forecast times of record ``idx``, in its timezone."""
    got = pd.DatetimeIndex(as_time_axis(idx, len(idx)).future(steps))
    return got.tz_localize("UTC").tz_convert(idx.tz) if idx.tz is not None else got


def _pandas_grid(idx, tods, steps):
    """The next ``steps`` bars after ``idx[-1]`` on pandas' business days (Monday to Friday, no
    holidays: the forecast does not know them) at times of day ``tods``, on the local clock."""
    tz = idx.tz
    last = idx[-1].tz_localize(None) if tz is not None else idx[-1]
    day = last.normalize()
    rest = [day + t for t in tods if day + t > last] if day.day_of_week < 5 else []
    days = pd.bdate_range(day + pd.Timedelta(days=1), periods=steps // len(tods) + 2)
    grid = pd.DatetimeIndex(rest).append(
        pd.DatetimeIndex((days.values[:, None] + tods.values[None, :]).ravel())
    )[:steps]
    return grid.tz_localize(tz) if tz is not None else grid


@pytest.mark.parametrize("name", list(RECORDS))
def test_continues_on_the_session_grid(name):
    idx, tods = _record(name)
    steps = 3 * len(tods) + 5  # the rest of a session and three more
    bad = []
    for cut in _cuts(idx):
        rec = idx[: cut + 1]
        want = _pandas_grid(rec, tods, steps)
        if not _future(rec, steps).equals(want):
            bad.append(str(rec[-1]))
    assert not bad, f"{len(bad)} of {len(_cuts(idx))} cuts differ from the pandas grid: {bad[:3]}"


def test_local_open_across_daylight_saving():
    # the Friday before New York's change to summer time: Monday opens at 09:30 local, 13:30 UTC
    idx, _ = _record("NY-30min-2016-2024")
    rec = idx[idx < pd.Timestamp("2024-03-09", tz="America/New_York")]
    got = as_time_axis(rec, len(rec)).future(14)  # from Friday's last bar, 15:30 (20:30 UTC)
    assert str(got[0].astype("datetime64[m]")) == "2024-03-11T13:30"  # 09:30 local
    assert str(got[13].astype("datetime64[m]")) == "2024-03-12T13:30"
    local = pd.DatetimeIndex(got).tz_localize("UTC").tz_convert("America/New_York")
    assert local[0].strftime("%a %H:%M") == "Mon 09:30" and local[12].strftime("%H:%M") == "15:30"


@pytest.mark.parametrize("tz", [None, "America/New_York"])
def test_business_hour_offsets(tz):
    """Hourly bars from 09:00 to 16:00 (a 09:00-17:00 session) on US business days, as pandas'
    CustomBusinessHour lays them out; the forecasts continue as its BusinessHour does."""
    cbh = pd.offsets.CustomBusinessHour(start="09:00", end="17:00", holidays=list(NY_HOLIDAYS))
    idx = pd.date_range("2019-01-02 09:00", "2023-12-29 16:00", freq=cbh)
    idx = idx.tz_localize(tz) if tz else idx
    bh = pd.offsets.BusinessHour(start="09:00", end="17:00")
    rng = np.random.default_rng(3)
    for cut in rng.integers(200, len(idx), 25):
        rec = idx[: cut + 1]
        want = pd.date_range(rec[-1], periods=41, freq=bh)[1:]
        np.testing.assert_array_equal(_future(rec, 40), want)


def test_naive_utc_times_take_the_latest_season():
    """New York's 5-minute bars written in UTC: 14:30-20:55 in winter, 13:30-19:55 in summer;
    the forecasts keep the latest season's times (the zone is not known)."""
    idx, tods = _record("NY-5min-2021-2023")
    utc = idx.tz_convert("UTC").tz_localize(None)
    for end, shift in (("2023-07-01", "4h"), ("2023-02-04", "5h"), ("2023-03-15", "4h")):
        rec = utc[utc < pd.Timestamp(end)]  # ends on a Friday (summer, winter), a Tuesday
        got = _future(rec, 80)
        assert got.equals(_pandas_grid(rec, tods + pd.Timedelta(shift), 80)), end
    assert str(got[0]) == "2023-03-15 13:30:00"  # two sessions after the change: 13:30 UTC


def test_through_forecast_and_fit():
    idx, _ = _record("NY-5min-2021-2023")
    rec = idx[idx < pd.Timestamp("2023-12-23", tz="America/New_York")]  # ends Fri 22nd 15:55
    z = pd.Series(np.random.default_rng(0).normal(size=len(rec)).cumsum(), index=rec)
    m = ks.OUModel(theta=0.0, sigma2=1.0, obs_var=1.0)
    fc = ks.forecast(m, z, steps=3)
    local = fc.times  # in the record's zone (a tz-aware DatetimeIndex)
    assert local.tz == rec.tz
    assert [x.strftime("%a %d %H:%M") for x in local] == ["Mon 25 09:30", "Mon 25 09:35",
                                                          "Mon 25 09:40"]  # fmt: skip
    # the level's variance grows by the calendar time: Friday 15:55 to Monday 09:30 (65 h 35 min)
    p_last = ks.forecast(m, z, at=[rec[-1]]).var[0]
    assert fc.var[0] - p_last == pytest.approx((65 + 35 / 60) / 24, rel=1e-9)
    assert fc.var[1] - fc.var[0] == pytest.approx(5 / 1440, rel=1e-9)
    fit = ks.fit_ou(z.iloc[-2000:], fix={"theta": 0.0})
    fc = fit.forecast(2)
    local = fc.times  # in the record's zone (a tz-aware DatetimeIndex)
    assert local.tz == rec.tz
    assert [x.strftime("%a %H:%M") for x in local] == ["Mon 09:30", "Mon 09:35"]


def test_short_records_and_other_weekdays():
    # three days of 5-minute bars, Wednesday to Friday noon: Monday to Friday assumed
    tods = _times_of_day("09:30", "16:00", "5min")
    days = pd.bdate_range("2024-05-08", periods=3)
    idx = pd.DatetimeIndex((days.values[:, None] + tods.values[None, :]).ravel())
    rec = idx[idx <= pd.Timestamp("2024-05-10 12:00")]
    got = _future(rec, 50)
    assert got.equals(_pandas_grid(rec, tods, 50))
    assert str(got[47]) == "2024-05-13 09:30:00"  # after Friday 15:55
    # sessions on Monday, Wednesday and Friday for six weeks: the next such days
    b = pd.bdate_range("2024-04-01", "2024-05-10")
    days = b[b.day_of_week.isin([0, 2, 4])]
    idx = pd.DatetimeIndex((days.values[:, None] + tods.values[None, :]).ravel())
    got = _future(idx, 78 * 2 + 1)
    assert [str(got[j])[:16] for j in (0, 78, 156)] == [
        "2024-05-13 09:30", "2024-05-15 09:30", "2024-05-17 09:30",
    ]  # fmt: skip


def _fx_hourly():
    """FX hours: Sunday 17:00 to Friday 16:00 New York time, round the clock between."""
    idx = pd.date_range("2024-01-07 17:00", "2024-03-29 16:00", freq="h", tz="America/New_York")
    local = idx.tz_localize(None)
    dow, hour = local.day_of_week, local.hour
    keep = (dow < 4) | ((dow == 4) & (hour < 17)) | ((dow == 6) & (hour >= 17))
    return idx[keep]


def _ticks():
    days = pd.bdate_range("2024-01-02", periods=30)
    rng = np.random.default_rng(5)
    secs = np.sort(rng.uniform(9.5 * 3600, 16 * 3600, size=(30, 200)), axis=1)
    return pd.DatetimeIndex((days.values[:, None] + (secs * 1e9).astype("timedelta64[ns]")).ravel())


def _moving_sessions():
    """Three-hour sessions at 09:00 on Monday, Wednesday and Friday, at 13:00 on Tuesday and
    Thursday (two opens four hours apart)."""
    days = pd.bdate_range("2024-01-01", periods=40)
    tods = _times_of_day("00:00", "03:00", "30min")
    open_at = np.where(days.day_of_week.isin([1, 3]), 13, 9).astype("timedelta64[h]")
    return pd.DatetimeIndex(((days.values + open_at)[:, None] + tods.values[None, :]).ravel())


def _off_grid():
    idx, _ = _record("NY-5min-right-naive")
    idx = idx[:5000]
    return idx.delete(2500).insert(2500, idx[2500] - pd.Timedelta("17s"))


def _open_and_close():
    """1-minute bars in the first and last half hours of a 09:30-16:00 session only."""
    idx, _ = _record("NY-1min-sparse")
    clock = idx - idx.normalize()
    return idx[(clock < pd.Timedelta("10:00:00")) | (clock >= pd.Timedelta("15:30:00"))]


def _weekend_session():
    """Nine days of 09:00-17:00 hourly bars, Saturday and Sunday among them."""
    days = pd.date_range("2024-01-04", periods=9)
    tods = _times_of_day("09:00", "17:00", "1h")
    return pd.DatetimeIndex((days.values[:, None] + tods.values[None, :]).ravel())


OTHER = {
    "crypto-1min": lambda: pd.date_range("2024-01-01", periods=60_000, freq="min"),
    "crypto-1h-utc": lambda: pd.date_range("2024-01-01", periods=2000, freq="h", tz="UTC"),
    "fx-hourly-NY": _fx_hourly,
    "weekdays-round-the-clock": lambda: (
        pd.bdate_range("2024-01-01", periods=40).repeat(24)
        + pd.to_timedelta(np.tile(np.arange(24), 40), unit="h")
    ),
    "ticks": _ticks,
    "moving-sessions": _moving_sessions,
    "off-grid-bar": _off_grid,
    "weekend-session": _weekend_session,
    "8h-bdate-range": lambda: pd.bdate_range("2024-01-01", periods=30, freq="8h"),
    "one-full-session": lambda: _record("NY-5min-right-naive")[0][: 78 + 40],
    "open-and-close-only": _open_and_close,
    "repeated-bar": lambda: _record("NY-1h-naive-2018-2020")[0][:300].append(
        _record("NY-1h-naive-2018-2020")[0][299:300]
    ),
}


@pytest.mark.parametrize("name", list(OTHER))
def test_other_records_keep_the_median_step(name):
    idx = OTHER[name]()
    ax = as_time_axis(idx, len(idx))
    want = ax.labels[-1] + np.arange(1, 11) * ax.step()
    np.testing.assert_array_equal(ax.future(10), want)


def test_far_forecasts_coarser_resolution():
    """A million 5-minute bars after a nanosecond record of 2262 leave nanoseconds' range
    (2262-04-11): made in microseconds, on the sessions still."""
    days = pd.bdate_range("2262-01-02", periods=30)
    tods = _times_of_day("09:30", "16:00", "5min")
    lab = (days.values[:, None].astype("datetime64[ns]") + tods.values[None, :]).ravel()
    got = as_time_axis(lab, len(lab)).future(1_000_000)
    assert got.dtype == np.dtype("datetime64[us]")
    assert str(got[0]) == "2262-02-13T09:30:00.000000"
    days_out = got.astype("datetime64[D]")
    assert np.is_busday(days_out).all()
    np.testing.assert_array_equal(np.unique(got - days_out), tods.values.astype("m8[us]"))
    assert (np.diff(got) > np.timedelta64(0, "us")).all()
    assert days_out[-1] > np.datetime64("2311-01-01")


def test_weekmasks_are_not_bool(monkeypatch):
    """numpy before 2.3 warns (DeprecationWarning, an error under ``-W error``) on a bool array
    as ``weekmask``: the weekday and session forecasts hand it 0/1 integers."""
    seen = []
    for name in ("busday_offset", "busday_count"):
        real = getattr(np, name)

        def spy(*a, _real=real, **kw):
            seen.append(np.asarray(kw.get("weekmask", "1111100")).dtype)
            return _real(*a, **kw)

        monkeypatch.setattr(np, name, spy)
    days = pd.bdate_range("2024-01-02", periods=30)
    bars = (days.values[:, None] + _times_of_day("09:30", "16:00", "30min").values).ravel()
    assert as_time_axis(bars, bars.size).future(20)[0] == np.datetime64("2024-02-13T09:30")
    mwf = pd.date_range("2024-01-01", periods=40, freq="D")
    mwf = mwf[mwf.day_of_week.isin([0, 2, 4])].values
    assert str(as_time_axis(mwf, mwf.size).future(2)[-1])[:10] == "2024-02-14"
    assert len(seen) >= 4 and np.dtype(bool) not in seen, seen
