"""Series indexed by pandas periods (a ``PeriodIndex``: quarters, months, years, weeks, days,
hours, business days): the model reads each period at the time it starts, and what comes back
is keyed by the same periods. Forecast times are a ``PeriodIndex`` of the record's frequency
continuing its sequence; a results Dataset keeps the period starts as ``datetime64`` with the
frequency in the coordinates' ``period_freq`` attr (lossless: ``to_period`` gives the periods
back); ``at`` takes periods of the record's frequency, or the times they start at, and refuses
anything a period label would move."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import OUModel, as_time_axis

pd = pytest.importorskip("pandas")

MODEL = OUModel(theta=0.002, sigma2=0.5, mu=1.0, obs_var=0.3)

# (freq, first period): quarters, fiscal quarters (ending in November), months, years, fiscal
# years (ending in June), weeks (ending on Sunday and on Wednesday), days, hours, two-quarter
# periods and business days
FREQS = [
    ("Q", "1959Q1"),
    ("Q-NOV", "1961Q4"),
    ("M", "1999-11"),
    ("Y", "1990"),
    ("Y-JUN", "2000"),
    ("W-SUN", "2020-03-02"),
    ("W-WED", "2019-12-26"),
    ("D", "2024-02-27"),
    ("h", "2024-03-31 22:00"),
    ("2Q", "2000Q1"),
    ("B", "2024-02-28"),
]


def _periods(start, n, freq, drop=()):
    with warnings.catch_warnings():  # (pandas deprecates business-day periods)
        warnings.simplefilter("ignore", FutureWarning)
        idx = pd.period_range(start, periods=n, freq=freq)
    return idx.delete(list(drop)) if drop else idx


def _series(idx, seed=0):
    rng = np.random.default_rng(seed)
    return pd.Series(1.0 + np.cumsum(rng.standard_normal(len(idx))), index=idx, name="y")


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.mark.filterwarnings(r"ignore:.*(BDay freq|PeriodDtype\[B\]):FutureWarning")
@pytest.mark.parametrize("freq,start", FREQS, ids=[f[0] for f in FREQS])
def test_forecast_times_are_the_next_periods(freq, start):
    idx = _periods(start, 9, freq)
    y = _series(idx)
    fc = _quiet(ks.forecast, MODEL, y, steps=4)
    assert isinstance(fc.times, pd.PeriodIndex)  # was: datetime64 starts
    assert fc.times.dtype == idx.dtype
    pd.testing.assert_index_equal(fc.times, _periods(idx[-1] + 1, 4, freq))
    # the model time is the periods' starts (days): the same forecast as from the starts
    starts = y.copy()
    starts.index = idx.start_time
    by_dates = _quiet(ks.forecast, MODEL, starts, steps=4)
    np.testing.assert_array_equal(np.asarray(fc.times.start_time), by_dates.times)
    np.testing.assert_array_equal(fc.var, by_dates.var)


def test_fit_forecast_and_time_axis_keep_the_periods():
    idx = _periods("1959Q1", 40, "Q")
    fit = _quiet(ks.fit_ou, _series(idx, 3))
    pd.testing.assert_index_equal(fit.time_axis.periods(), idx)
    assert fit.time_axis.period_freq == "Q-DEC"
    pd.testing.assert_index_equal(fit.forecast(3).times, _periods("1969Q1", 3, "Q"))
    # a robust fit's time axis too
    robust = _quiet(ks.fit_ou, _series(idx, 3), robust=True)
    pd.testing.assert_index_equal(robust.forecast(2).times, _periods("1969Q1", 2, "Q"))


def test_irregular_periods_step_by_their_gaps_and_forecast_on_the_sequence():
    # quarters missing (1959Q3, 1960Q1, 1961Q2-Q3): steps of 1, 2 and 3 quarters
    full = _periods("1959Q1", 12, "Q")
    idx = full.delete([2, 4, 9, 10])
    y = _series(idx, 1)
    ax = as_time_axis(idx, len(idx))
    days = (idx.start_time - idx.start_time[0]).days.to_numpy().astype(float)
    np.testing.assert_array_equal(ax.t, days)  # exact days between the periods' starts
    # a gap is the missing quarters: the same filter as the full record with NaN there
    gapped = MODEL.filter(y)
    filled = MODEL.filter(y.reindex(full))
    keep = full.isin(idx)
    np.testing.assert_allclose(gapped.mean, filled.mean[keep], rtol=1e-13, atol=0)
    np.testing.assert_allclose(gapped.var, filled.var[keep], rtol=1e-13, atol=0)
    # the typical step is one quarter (the lower median of steps 1, 2, 1, 1, 1, 3, 1): the
    # forecasts continue quarter by quarter (was: day-spaced dates off the quarters' starts)
    fc = _quiet(ks.forecast, MODEL, y, steps=3)
    pd.testing.assert_index_equal(fc.times, _periods("1962Q1", 3, "Q"))
    # every other month, with one month of three left out: steps 2, 2, 3, 2 -> every 2 months
    months = _periods("2001-01", 11, "M")[[0, 2, 4, 7, 9]]
    fc = _quiet(ks.forecast, MODEL, _series(months), steps=2)
    pd.testing.assert_index_equal(fc.times, pd.PeriodIndex(["2001-12", "2002-02"], freq="M"))
    # steps 1 and 2 months (a median of 1.5): the lower one, so no period is skipped
    fc = _quiet(ks.forecast, MODEL, _series(_periods("2001-01", 4, "M", drop=[2])), steps=2)
    pd.testing.assert_index_equal(fc.times, pd.PeriodIndex(["2001-05", "2001-06"], freq="M"))


def test_forecast_at_periods_of_the_record():
    idx = _periods("1961Q1", 6, "Q-NOV")  # quarters ending in November: 1963Q1 starts 1962-12
    y = _series(idx)
    by_steps = _quiet(ks.forecast, MODEL, y, steps=3)
    for at in (
        pd.Period("1963Q1", "Q-NOV"),
        [pd.Period("1963Q1", "Q-NOV")],
        np.array([pd.Period("1963Q1", "Q-NOV")], dtype=object),
        pd.PeriodIndex(["1963Q1"], freq="Q-NOV"),
        np.array(["1962-12-01"], dtype="datetime64[D]"),  # the time 1963Q1 starts at
    ):
        fc = _quiet(ks.forecast, MODEL, y, at=at)
        pd.testing.assert_index_equal(fc.times, pd.PeriodIndex(["1963Q1"], freq="Q-NOV"))
        # was: a Period read as its text, 1963Q1 of the calendar year (1963-01-01), a month off
        assert fc.var[0] == by_steps.var[2]
    with pytest.raises(ValueError, match=r"at: expected periods of the record's frequency "
                       r"'Q-NOV' .* got periods of frequency 'Q-DEC'"):  # fmt: skip
        ks.forecast(MODEL, y, at=pd.Period("1963Q1", "Q"))
    msg = (
        r"at: .*got 1963-01-15T00:00:00, inside the period 1963Q1 but not its start; give the "
        r"period \(pd.Period\('1963Q1', 'Q-NOV'\)\)"
    )
    with pytest.raises(ValueError, match=msg):
        ks.forecast(MODEL, y, at=np.array(["1963-01-15T00:00:00"], dtype="datetime64[s]"))
    with pytest.raises(ValueError, match=r"at: .*got 1963-02-28T23:59:59.99+, inside the "
                       r"period 1963Q1 but not its start"):  # fmt: skip
        ks.forecast(MODEL, y, at=pd.Period("1963Q1", "Q-NOV").end_time)  # not moved to its start
    msg = (
        r"at: expected timestamps at or after the record's last time \(the last of its times, "
        r"observed or not: 1962Q2\), got 1961Q4"
    )
    with pytest.raises(ValueError, match=msg):
        ks.forecast(MODEL, y, at=pd.Period("1961Q4", "Q-NOV"))


@pytest.mark.parametrize("freq,start", FREQS[:8], ids=[f[0] for f in FREQS[:8]])
def test_period_objects_start_where_their_period_starts(freq, start):
    idx = _periods(start, 4, freq)
    expected = np.asarray(idx.start_time)
    for given in (list(idx), np.asarray(idx, dtype=object), idx.array, pd.Series(idx)):
        ax = as_time_axis(given, 4)
        # was: a Period read as its text (Q-NOV: a month late; weeks: refused)
        np.testing.assert_array_equal(ax.labels, expected)
        assert ax.period_freq == idx.freqstr
    with pytest.raises(ValueError, match=r"times: expected periods of one frequency, got "
                       r"'Q-DEC' and 'M'"):  # fmt: skip
        as_time_axis([pd.Period("2000Q1"), pd.Period("2000-05", "M")], 2)


def test_dataset_keeps_the_period_starts_and_their_frequency(tmp_path):
    xr = pytest.importorskip("xarray")
    from kalmanscan.xarray import save_netcdf

    idx = _periods("1999-11", 8, "M")
    fit = _quiet(ks.fit_ou, _series(idx, 2))
    ds = fit.to_dataset(forecast_steps=2)
    for coord, periods in (("time", idx), ("forecast_time", _periods("2000-07", 2, "M"))):
        assert ds[coord].dtype.kind == "M"  # plottable, writable to netCDF
        assert ds[coord].attrs["period_freq"] == "M"  # was: no record of the periods
        back = ds.indexes[coord].to_period(ds[coord].attrs["period_freq"])
        pd.testing.assert_index_equal(back, periods.rename(coord))
    path = tmp_path / "r.nc"
    save_netcdf(ds, path, engine="scipy")
    with xr.open_dataset(path) as read:
        assert read["forecast_time"].attrs["period_freq"] == "M"
        back = read.indexes["time"].to_period(read["time"].attrs["period_freq"])
        pd.testing.assert_index_equal(back, idx.rename("time"))


def test_accessor_on_a_period_coordinate():
    xr = pytest.importorskip("xarray")
    import kalmanscan.xarray  # noqa: F401

    idx = _periods("2020-03-02", 10, "W-SUN")
    da = xr.DataArray(_series(idx).to_numpy(), dims="time", coords={"time": idx})
    ax = as_time_axis(da["time"], 10)  # the coordinate itself (was: refused, read as texts)
    np.testing.assert_array_equal(ax.labels, np.asarray(idx.start_time))
    assert ax.period_freq == "W-SUN"
    ds = da.kalman.filter(MODEL, forecast_steps=2)
    assert ds["time"].attrs["period_freq"] == "W-SUN"
    assert ds["forecast_time"].attrs["period_freq"] == "W-SUN"  # was: neither said
    fut = ds.indexes["forecast_time"].to_period("W-SUN")
    pd.testing.assert_index_equal(fut, _periods(idx[-1] + 1, 2, "W-SUN").rename("forecast_time"))
    # the Dataset's coordinate, read back: the same periods, so the same forecast
    again = ds["observed"].kalman.forecast(MODEL, steps=2)
    assert again["forecast_time"].attrs["period_freq"] == "W-SUN"
    np.testing.assert_array_equal(again["forecast_variance"], ds["forecast_variance"])
    fc = da.kalman.forecast(MODEL, at=idx[-1] + 3)
    assert fc["forecast_time"].attrs["period_freq"] == "W-SUN"
    bad = ds["observed"].assign_coords(time=ds["time"].values + np.timedelta64(1, "D"))
    bad["time"].attrs["period_freq"] = "W-SUN"
    with pytest.raises(ValueError, match=r"coordinate 'time': its attr period_freq = 'W-SUN' says "
                       r".* but 2020-03-03T00:00:00.000000 \(position 0\) is inside the period "
                       r"2020-03-02/2020-03-08, not its start"):  # fmt: skip
        bad.kalman.filter(MODEL)


def test_macrodata_quarters():
    macrodata = pytest.importorskip("statsmodels.datasets.macrodata")
    md = macrodata.load_pandas().data
    idx = pd.PeriodIndex.from_fields(
        year=md.year.astype(int), quarter=md.quarter.astype(int), freq="Q"
    )
    frame = pd.DataFrame({"infl": md.infl.to_numpy(), "unemp": md.unemp.to_numpy()}, index=idx)
    fit = _quiet(ks.fit_ou, frame)
    fc = fit.forecast(4)
    pd.testing.assert_index_equal(fc.times, pd.period_range("2009Q4", periods=4, freq="Q"))
    # the periods are the times they start: the same fit as on the quarters' first days
    by_dates = _quiet(ks.fit_ou, frame.to_timestamp(how="start"))
    np.testing.assert_array_equal(fit.params["theta"], by_dates.params["theta"])
    np.testing.assert_array_equal(fc.mean, by_dates.forecast(4).mean)
    ds = fit.to_dataset(forecast_steps=4)
    back = ds.indexes["time"].to_period(ds["time"].attrs["period_freq"])
    pd.testing.assert_index_equal(back, idx.rename("time"))


def test_messages_name_periods_as_pandas_writes_them():
    with pytest.raises(ValueError, match=r"times: expected non-decreasing timestamps, got 1959Q1 "
                       r"after 1959Q2 \(position 1\)"):  # fmt: skip
        as_time_axis(pd.PeriodIndex(["1959Q2", "1959Q1"], freq="Q"), 2)  # was: 1959-01-01T00:...
    idx = _periods("1990", 30, "Y")
    y = _series(idx, 4)
    y.iloc[12] = 1e4
    with pytest.warns(UserWarning, match=r"row 12 \(time 2002, z = 10000\)"):
        ks.fit_ou(y, robust=True)


def test_results_observed_forecast_again_as_periods():
    # the DataArray of a results Dataset reads back as the periods it recorded (period_freq),
    # through ks.forecast as through the .kalman accessor (and as zoned times do)
    q = pd.Series(np.arange(8.0), index=pd.period_range("2000Q1", periods=8, freq="Q"))
    model = ks.OUModel(sigma2=1.0, obs_var=0.5)
    ds = model.to_dataset(q)
    got = ks.forecast(model, ds["observed"], steps=2).times
    assert isinstance(got, pd.PeriodIndex) and got.astype(str).tolist() == ["2002Q1", "2002Q2"]
