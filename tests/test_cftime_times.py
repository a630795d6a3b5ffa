"""Times as cftime dates (xarray's dates in climate models' calendars).

Dates of the proleptic Gregorian calendar (and of ``standard`` / ``gregorian`` from 1582-10-15)
are numpy's and are read exactly as ``datetime64``. Another calendar's days are not numpy's:
``noleap`` has no Feb 29, so its Feb 28 -> Mar 1 is one day, which read as text became two (a fit
on 200 daily ``noleap`` dates gave theta 0.038067 against 0.037997 for its regular steps), and
``360_day``'s Feb 30 could not be read at all. Such dates are now kept, their steps measured in
their calendar, and the results and forecasts are dates of that calendar.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest

import kalmanscan as ks

cftime = pytest.importorskip("cftime")
xr = pytest.importorskip("xarray")
pytest.importorskip("pandas")

T = 200
MODEL_CALENDARS = ["noleap", "360_day", "all_leap", "julian"]


def _data():
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=T)) * 0.1 + rng.normal(size=T) * 0.3


def _dates(calendar, start=(2000, 1, 1), n=T):
    first = cftime.datetime(*start, calendar=calendar)
    return np.array([first + datetime.timedelta(days=i) for i in range(n)], dtype=object)


def _params(fit):
    return {k: float(fit.params[k]) for k in ("theta", "sigma2", "mu", "obs_var")}


def _daily(calendar):
    import kalmanscan.xarray  # noqa: F401 (the accessor)

    times = xr.date_range("2000-01-01", periods=T, freq="D", calendar=calendar, use_cftime=True)
    return xr.DataArray(_data(), coords={"time": times}, dims="time", name="temp")


@pytest.mark.parametrize("calendar", MODEL_CALENDARS)
def test_a_model_calendar_s_days_are_its_steps(calendar):
    """200 daily dates across Feb 29 / Feb 30 are 200 steps of one day in their calendar: the
    fit equals the fit at times 0, 1, ..., 199, value for value (noleap was read as Gregorian
    dates with a 2-day step; 360_day could not be read), through the accessor and ``fit_ou``."""
    da = _daily(calendar)
    want = da.assign_coords(time=np.arange(T, dtype=np.float64)).kalman.fit_ou()
    got = da.kalman.fit_ou()
    for k in ("theta", "sigma2", "obs_var", "mu"):
        assert float(got[k]) == float(want[k])
    fit = ks.fit_ou(_data(), da["time"].values)
    assert fit.time_axis.is_cftime and fit.time_axis.t.tolist() == list(range(T))
    assert _params(fit) == _params(ks.fit_ou(_data(), np.arange(T, dtype=np.float64)))


@pytest.mark.parametrize("calendar", MODEL_CALENDARS)
def test_results_and_forecasts_are_dates_of_the_calendar(calendar, tmp_path):
    """The results keep the record's dates (a CFTimeIndex), the forecast continues a day a step
    in the calendar, and a netCDF file of the results reads back the same dates."""
    da = _daily(calendar)
    ds = da.kalman.filter(da.kalman.fit_ou(), forecast_steps=3)
    assert type(ds.indexes["time"]).__name__ == "CFTimeIndex"
    assert list(ds["time"].values) == list(da["time"].values)
    last = da["time"].values[-1]
    want = [last + datetime.timedelta(days=k) for k in (1, 2, 3)]
    assert list(ds["forecast_time"].values) == want
    assert all(v.calendar == calendar for v in ds["forecast_time"].values)
    path = tmp_path / "out.nc"
    ds.to_netcdf(path, engine="scipy")
    with xr.open_dataset(path, engine="scipy", decode_times=xr.coders.CFDatetimeCoder(
            use_cftime=True)) as back:  # fmt: skip
        assert [str(v) for v in back["time"].values] == [str(v) for v in ds["time"].values]
        assert back["time"].values[0].calendar in (
            calendar,
            "julian" if calendar == "julian" else "",
        )


@pytest.mark.parametrize(
    ("calendar", "freq", "start", "want"),
    [
        ("360_day", "ME", "2000-01-30", ["2002-01-30", "2002-02-30", "2002-03-30"]),
        ("noleap", "ME", "2000-01-31", ["2002-01-31", "2002-02-28", "2002-03-31"]),
        ("noleap", "MS", "2000-01-01", ["2002-01-01", "2002-02-01", "2002-03-01"]),
        ("360_day", "QS", "2000-01-01", ["2006-01-01", "2006-04-01", "2006-07-01"]),
    ],
)
def test_monthly_dates_forecast_by_calendar_months(calendar, freq, start, want):
    """Monthly and quarterly dates step by whole months of their calendar, on the same day of
    the month or on month ends (360_day's month end is the 30th, noleap's February's the 28th)."""
    import kalmanscan.xarray  # noqa: F401

    times = xr.date_range(start, periods=24, freq=freq, calendar=calendar, use_cftime=True)
    da = xr.DataArray(_data()[:24], coords={"time": times}, dims="time")
    ds = da.kalman.filter(da.kalman.fit_ou(), forecast_steps=3)
    assert [v.strftime("%Y-%m-%d") for v in ds["forecast_time"].values] == want


def test_forecast_at_dates_of_the_calendar_and_its_refusals():
    """``at`` takes dates of the record's calendar; other calendars, datetime64 and dates before
    the record's end are refused, the messages showing the dates as text."""
    t = _dates("360_day")
    fit = ks.fit_ou(_data(), t)
    at = [cftime.datetime(2000, 7, 30, calendar="360_day")]
    fc = fit.model.forecast(fit.z, fit.time_axis, at=at)
    assert list(fc.times) == at
    by_steps = fit.model.forecast(fit.z, fit.time_axis, steps=10)
    assert list(by_steps.times)[-1] == at[0]  # 2000-07-20 + 10 days of 360_day
    assert np.array_equal(by_steps.mean[-1:], fc.mean)
    with pytest.raises(TypeError, match="record's '360_day' calendar, got cftime dates of the 'no"):
        fit.model.forecast(
            fit.z, fit.time_axis, at=[cftime.datetime(2000, 8, 1, calendar="noleap")]
        )
    with pytest.raises(TypeError, match="got values of dtype datetime64"):
        fit.model.forecast(fit.z, fit.time_axis, at=np.array(["2000-08-01"], "datetime64[D]"))
    with pytest.raises(ValueError, match="its times, observed or not: 2000-07-20 00:00:00\\), got "
                                         "2000-01-05 00:00:00"):  # fmt: skip
        fit.model.forecast(
            fit.z, fit.time_axis, at=[cftime.datetime(2000, 1, 5, calendar="360_day")]
        )


def test_robust_notes_and_summary_name_the_calendar_s_dates():
    """A robust fit's note names a screened observation by its date in the calendar."""
    z = _data()
    z[59] = 40.0  # 2000-02-30 in 360_day
    with pytest.warns(UserWarning, match="2000-02-30T00:00:00"):
        fit = ks.fit_ou(z, _dates("360_day"), robust=True)
    assert "row 59 (time 2000-02-30T00:00:00, z = 40)" in " ".join(fit.notes)
    assert "200 time steps" in fit.summary()


def test_plots_label_the_calendar_s_dates():
    """The overview draws a model calendar's dates with date labels of that calendar."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import kalmanscan.plot as kp

    z = _data()
    z[30:40] = np.nan
    da = _daily("360_day").copy(data=z)
    ds = da.kalman.filter(da.kalman.fit_ou(), forecast_steps=5)
    axes = kp.plot_overview(ds)
    ax = np.ravel(axes)[-1]
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "2000-01-01" in labels and "360_day calendar" in ax.get_xlabel()
    ticks = kp.plot_bands(da["time"].values, ds["mean"].values, ds["variance"].values)
    assert "360_day" in ticks.get_xlabel()


@pytest.mark.parametrize("calendar", ["standard", "gregorian", "proleptic_gregorian"])
def test_gregorian_cftime_dates_read_exactly_as_datetime64(calendar):
    """The same fit, filter and forecast times as the same dates given as datetime64, across a
    Feb 29, with a sub-second time of day kept to the microsecond."""
    cf = _dates(calendar)
    cf[5] = cf[5] + datetime.timedelta(microseconds=250_001)
    dt64 = np.array([np.datetime64(v.isoformat()) for v in cf], dtype="datetime64[us]")
    ax = ks.timeseries.times.as_time_axis(cf, T)
    assert ax.labels.dtype == np.dtype("datetime64[us]") and not ax.is_cftime
    assert np.array_equal(ax.labels, dt64)
    assert ax.t[60] - ax.t[59] == 1.0  # Feb 29 -> Mar 1 2000
    a, b = ks.fit_ou(_data(), cf), ks.fit_ou(_data(), dt64)
    assert _params(a) == _params(b)
    f1 = a.model.forecast(a.z, a.time_axis, steps=3)
    f2 = b.model.forecast(b.z, b.time_axis, steps=3)
    assert np.array_equal(f1.times, f2.times) and np.array_equal(f1.mean, f2.mean)


def test_standard_dates_before_1582_are_julian_and_two_calendars_are_refused():
    """``standard`` is Julian before 1582-10-15 and its Oct 4 -> Oct 15 is one day: such dates
    stay cftime dates, stepped in that calendar. Dates of two calendars, or of none, are
    refused."""
    ax = ks.timeseries.times.as_time_axis(_dates("standard", (1582, 10, 1), 30), 30)
    assert ax.is_cftime and ax.t.tolist() == list(range(30))
    assert str(ax.labels[4]) == "1582-10-15 00:00:00"
    mixed = np.concatenate([_dates("noleap", n=3), _dates("standard", (2001, 1, 1), 3)])
    with pytest.raises(ValueError, match="of one calendar, got calendars"):
        ks.timeseries.times.as_time_axis(mixed, 6)
    bare = np.array([cftime.datetime(2000, 1, d, calendar="") for d in (1, 2)])
    with pytest.raises(ValueError, match="cftime dates without a calendar"):
        ks.fit_ou(_data()[:2], bare)


def test_time_unit_and_dask_chunks_with_a_model_calendar():
    """``time_unit="12h"`` halves the rates, as for datetime64; dask-chunked series fit as in
    memory."""
    pytest.importorskip("dask")
    da = _daily("noleap")
    day = ks.fit_ou(_data(), da["time"].values)
    half = ks.fit_ou(_data(), da["time"].values, time_unit="12h")
    assert half.time_axis.t[-1] == 2 * (T - 1)
    np.testing.assert_allclose(half.params["theta"], day.params["theta"] / 2, rtol=1e-6)
    two = xr.concat([da, da * 2.0], dim="station")
    lazy = two.chunk({"station": 1}).kalman.fit_ou()
    eager = two.kalman.fit_ou()
    np.testing.assert_allclose(lazy["theta"].values, eager["theta"].values, rtol=1e-9)


@pytest.mark.parametrize(
    ("dates", "model"),
    [(["2001-02-28", "2001-02-30", "2001-03-01"], True),
     (["2001-02-28", "2001-02-29", "2001-03-01"], True),
     (["2001-01-28", "2001-01-32", "2001-02-01"], False)],
)  # fmt: skip
def test_the_cli_names_a_model_calendar_s_dates(tmp_path, capsys, dates, model):
    """The CLI reads Gregorian dates; a Feb 29 of a common year or a Feb 30 in its time column
    is refused with the way to a model calendar (the Python API's cftime dates)."""
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    csv = tmp_path / "in.csv"
    csv.write_text("date,x\n" + "".join(f"{d},{i}.5\n" for i, d in enumerate(dates)))
    assert filter_main([str(csv), "--time-col", "date", "--fit", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot parse {dates[1]!r} as a time" in err
    assert ("a date of a model calendar (360_day, noleap)? --calendar 360_day" in err) == model


def _cli(tmp_path, capsys, rows, *args):
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    csv = tmp_path / "in.csv"
    csv.write_text("time,temp\n" + "".join(f"{t},{v!r}\n" for t, v in rows))
    out = tmp_path / "o"
    rc = filter_main([str(csv), *args, "--out", str(out), "--quiet"])
    return rc, out, capsys.readouterr()


def test_the_cli_reads_a_model_calendar_with_calendar(tmp_path, capsys):
    """``--calendar 360_day``: 200 daily dates across Feb 30 fit as the times 0, ..., 199 (the
    truth: one day a step), results.csv and the forecast table write the calendar's dates and
    results.nc holds them with their calendar."""
    dates = [v.strftime("%Y-%m-%d") for v in _dates("360_day")]
    rows = zip(dates, _data().tolist(), strict=True)
    args = ("--time-col", "time", "--calendar", "360_day", "--fit", "--forecast", "2")
    rc, out, cap = _cli(tmp_path, capsys, rows, *args)
    assert rc == 0, cap.err
    nc = xr.open_dataset(
        out / "results.nc", decode_times=xr.coders.CFDatetimeCoder(use_cftime=True)
    )
    want = ks.fit_ou(_data(), np.arange(T, dtype=np.float64))
    assert float(nc["theta"].values.item()) == pytest.approx(float(want.params["theta"]), rel=1e-12)
    assert str(nc["time"].values[59]) == "2000-02-30 00:00:00"
    assert nc["time"].values[59].calendar == "360_day"
    nc.close()
    table = (out / "results.csv").read_text()
    assert "data,2000-02-30,temp," in table and "forecast,2000-07-22,temp," in table
    assert "2000-07-21" in (out / "summary.txt").read_text()


def test_the_cli_calendar_with_times_of_day_and_its_refusals(tmp_path, capsys):
    """6-hourly noleap dates keep their times of day; an unknown calendar, a date the calendar
    lacks, --calendar without --time-col and numeric times (a note) are said."""
    first = cftime.datetime(2001, 2, 28, calendar="noleap")
    dates = [(first + datetime.timedelta(hours=6 * k)).isoformat(sep=" ")[:16] for k in range(40)]
    rows = list(zip(dates, _data()[:40].tolist(), strict=True))
    rc, out, cap = _cli(tmp_path, capsys, rows, "--time-col", "time", "--calendar", "noleap",
                        "--fit", "--forecast", "1")  # fmt: skip
    assert rc == 0, cap.err
    table = (out / "results.csv").read_text()
    assert "data,2001-03-01 00:00:00,temp," in table  # (the day after Feb 28: no Feb 29)
    assert "forecast,2001-03-10 00:00:00,temp," in table
    for args, message in [
        (("--time-col", "time", "--calendar", "mars"), "--calendar: expected one of 360_day"),
        (("--calendar", "noleap"), "--calendar apply to --time-col, which is not given"),
    ]:
        rc, _, cap = _cli(tmp_path, capsys, rows, *args, "--fit")
        assert rc == 2 and message in cap.err
    rc, _, cap = _cli(tmp_path, capsys, [("2000-02-30", 1.0), ("2000-02-31", 2.0)],
                      "--time-col", "time", "--calendar", "360_day", "--fit")  # fmt: skip
    assert rc == 2 and "row 3: cannot parse '2000-02-31' as a date of the '360_day'" in cap.err
    rc, out, cap = _cli(tmp_path, capsys, [(1, 1.0), (2, 2.5), (3, 1.5), (4, 2.0)],
                        "--time-col", "time", "--calendar", "noleap", "--fit")  # fmt: skip
    assert rc == 0 and "--calendar applies to dates only" in (out / "summary.txt").read_text()


def test_year_zero_conventions():
    """Proleptic Gregorian dates with and without a year 0 become the same instants in numpy's
    astronomical years (-5-01-01 without a year 0 is numpy's -4-01-01: 7 years before 3-01-01);
    dates of both conventions in one record are refused."""
    for zero, first, years in ((True, "-005", 8), (False, "-004", 7)):
        t = np.array([cftime.datetime(y, 1, 1, calendar="proleptic_gregorian", has_year_zero=zero)
                      for y in (-5, 3)])  # fmt: skip
        ax = ks.timeseries.times.as_time_axis(t, 2)
        assert str(ax.labels[0]).startswith(first)
        want = (np.datetime64("0003-01-01") - ax.labels[0].astype("datetime64[D]")).astype(int)
        assert ax.t[1] == want and abs(ax.t[1] / 365.2425 - years) < 0.01
    mixed = np.array([cftime.datetime(2000, 1, d, calendar="julian", has_year_zero=z)
                      for d, z in ((1, False), (2, True))])  # fmt: skip
    with pytest.raises(ValueError, match="one year-zero convention"):
        ks.timeseries.times.as_time_axis(mixed, 2)


def test_forecast_at_texts_read_in_the_record_s_calendar():
    """``at`` as text for a model calendar's record: read as dates of its calendar (a 360_day
    Feb 30 included; one layout for all), the same forecast as the cftime dates; a date the
    calendar lacks and a text that is no date are refused naming them."""
    import kalmanscan.xarray  # noqa: F401

    t = _dates("360_day")
    fit = ks.fit_ou(_data(), t)
    text = fit.model.forecast(fit.z, fit.time_axis, at=["2000-07-30 00:00", "2001-02-30 12:00"])
    dates = [cftime.datetime(2000, 7, 30, calendar="360_day"),
             cftime.datetime(2001, 2, 30, 12, calendar="360_day")]  # fmt: skip
    assert list(text.times) == dates and text.times[1].calendar == "360_day"
    assert np.array_equal(text.mean, fit.model.forecast(fit.z, fit.time_axis, at=dates).mean)
    da = _daily("360_day")
    ds = da.kalman.filter(da.kalman.fit_ou(), forecast_at=["2001-02-30"])
    assert str(ds["forecast_time"].values[0]) == "2001-02-30 00:00:00"
    with pytest.raises(ValueError, match=r"'2000-09-31' \(position 1\) as a date of the '360_day'"):
        fit.model.forecast(fit.z, fit.time_axis, at=["2000-08-30", "2000-09-31"])
    with pytest.raises(ValueError, match="cannot parse 'soon' .*expected a layout like"):
        fit.model.forecast(fit.z, fit.time_axis, at=["soon"])


def test_a_dataset_s_cf_bounds_variable_is_not_a_series():
    """A model's monthly file carries ``time_bnds`` (cftime dates, named by ``time``'s
    ``bounds`` attr): the Dataset accessor fits the data variables without it (it refused the
    Dataset, the bounds being no numbers); a variable of dates not so named is still refused."""
    import kalmanscan.xarray  # noqa: F401

    t = xr.date_range("2000-01-16", periods=60, freq="MS", calendar="noleap", use_cftime=True)
    lo = xr.date_range("2000-01-01", periods=60, freq="MS", calendar="noleap", use_cftime=True)
    bnds = np.stack([np.asarray(lo), np.asarray(lo.shift(1, "MS"))], 1)
    ds = xr.Dataset({"tas": ("time", _data()[:60]), "time_bnds": (("time", "bnds"), bnds)},
                    coords={"time": t})  # fmt: skip
    ds["time"].attrs["bounds"] = "time_bnds"
    fit = ds.kalman.fit_ou()
    assert list(fit["series"].values) == ["tas"]
    assert float(fit["theta"].values[0]) == float(ds["tas"].kalman.fit_ou()["theta"])
    ds["time"].attrs.pop("bounds")
    with pytest.raises(TypeError, match="Dataset variable 'time_bnds': expected real numbers"):
        ds.kalman.fit_ou()
