"""Records given in a timezone come back in it: ``Forecast.times`` a tz-aware ``DatetimeIndex`` in
the record's zone (UTC for offsets of no one zone), ``at=`` taking zoned times, and results
Datasets holding UTC ``datetime64`` with the zone in the attr ``local_time_zone``, which the
``.kalman`` accessor reads back (local midnights stay midnights across daylight-saving
changes)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

import kalmanscan as ks
import kalmanscan.xarray  # noqa: F401 - registers the .kalman accessor

M = ks.OUModel(theta=0.1, sigma2=1.0, obs_var=0.5)
Z5 = np.array([1.0, 2.0, 1.5, 1.8, 2.2])


def _paris(start: str, n: int = 5) -> pd.DatetimeIndex:
    return pd.date_range(start, periods=n, freq="D", tz="Europe/Paris")


def _midnights(idx) -> list[str]:
    return [t.strftime("%Y-%m-%d %H:%M%z") for t in idx]


def test_forecast_times_in_the_record_zone_across_spring_dst():
    rng = np.random.default_rng(3)
    z = rng.normal(size=40).cumsum() + rng.normal(size=40)
    s = pd.Series(z, index=_paris("2024-02-22", 40))  # crosses 31 March (UTC+1 -> UTC+2)
    fit = ks.fit_ou(s)
    fc = fit.forecast(3)
    assert isinstance(fc.times, pd.DatetimeIndex)
    assert str(fc.times.tz) == "Europe/Paris"
    assert _midnights(fc.times) == [
        "2024-04-02 00:00+0200",
        "2024-04-03 00:00+0200",
        "2024-04-04 00:00+0200",
    ]
    # the time axis keeps UTC labels and the zone, and gives the zoned times back
    assert fit.time_axis.zoned().equals(s.index)


def test_forecast_crosses_autumn_dst_at_local_midnights():
    s = pd.Series(Z5, index=_paris("2024-10-22"))  # ends 26 October, UTC+2
    fc = ks.forecast(M, s, steps=3)  # 27 October: back to UTC+1
    assert _midnights(fc.times) == [
        "2024-10-27 00:00+0200",
        "2024-10-28 00:00+0100",
        "2024-10-29 00:00+0100",
    ]


def test_polars_zoned_times_match_pandas():
    pl = pytest.importorskip("polars")
    idx = _paris("2024-03-28")
    times = pl.Series(idx.tz_convert("UTC").tz_localize(None).to_numpy()).dt.replace_time_zone(
        "UTC"
    )
    times = times.dt.convert_time_zone("Europe/Paris")
    got = ks.forecast(M, Z5, times=times, steps=3).times
    want = ks.forecast(M, pd.Series(Z5, index=idx), steps=3).times
    assert got.equals(want) and str(got.tz) == "Europe/Paris"


def test_offsets_one_fixed_offset_and_mixed_ones():
    plus5 = dt.timezone(dt.timedelta(hours=5))
    same = [dt.datetime(2024, 1, d, tzinfo=plus5) for d in range(1, 6)]
    fc = ks.forecast(M, Z5, times=same, steps=2)
    assert fc.times.tz.utcoffset(None) == dt.timedelta(hours=5)
    assert _midnights(fc.times) == ["2024-01-06 00:00+0500", "2024-01-07 00:00+0500"]
    # strings with offsets, and offsets of no one zone: a UTC-aware index, the same instants
    texts = [f"2024-01-0{d}T00:00+05:00" for d in range(1, 6)]
    fc_text = ks.forecast(M, Z5, times=texts, steps=2)
    assert str(fc_text.times.tz) == "UTC" and list(fc_text.times) == list(fc.times)
    mixed = same[:3] + [dt.datetime(2024, 1, d, tzinfo=dt.timezone.utc) for d in (4, 5)]
    fc_mixed = ks.forecast(M, Z5, times=mixed, steps=1)
    assert str(fc_mixed.times.tz) == "UTC"
    assert str(fc_mixed.times[0]) == "2024-01-06 00:00:00+00:00"


def test_naive_records_keep_numpy_datetimes():
    idx = pd.date_range("2024-03-28", periods=5, freq="D")
    times = ks.forecast(M, pd.Series(Z5, index=idx), steps=2).times
    assert isinstance(times, np.ndarray) and times.dtype.kind == "M"


def test_at_takes_zoned_times_of_any_zone():
    s = pd.Series(Z5, index=_paris("2024-03-28"))
    fc = ks.forecast(M, s, steps=3)
    again = ks.forecast(M, s, at=fc.times)  # a forecast's own times are accepted back
    assert again.times.equals(fc.times)
    np.testing.assert_array_equal(again.mean, fc.mean)
    # the same instant in New York: the same forecast, given back in the record's zone
    ny = ks.forecast(M, s, at=fc.times.tz_convert("America/New_York"))
    assert ny.times.equals(fc.times) and str(ny.times.tz) == "Europe/Paris"
    np.testing.assert_array_equal(ny.mean, fc.mean)
    one = ks.forecast(M, s, at=[pd.Timestamp("2024-04-05", tz="Europe/Paris")])
    assert _midnights(one.times) == ["2024-04-05 00:00+0200"]
    # a time before the record's end is named in the record's zone
    with pytest.raises(ValueError, match=r"2024-04-01 00:00:00\+02:00\), got 2024-03-30"):
        ks.forecast(M, s, at=[pd.Timestamp("2024-03-30 12:00", tz="Europe/Paris")])


def test_dataset_records_the_zone_losslessly():
    s = pd.Series(Z5, index=_paris("2024-03-28"), name="load")
    ds = M.to_dataset(s, forecast_steps=3)
    fc = ks.forecast(M, s, steps=3)
    for coord in ("time", "forecast_time"):
        assert ds[coord].dtype.kind == "M"  # UTC datetime64: what xarray and netCDF hold
        assert ds[coord].attrs["time_zone"] == "UTC"
        assert ds[coord].attrs["local_time_zone"] == "Europe/Paris"

    def local(coord):
        return ds.indexes[coord].tz_localize("UTC").tz_convert(ds[coord].attrs["local_time_zone"])

    assert local("time").equals(s.index)
    assert local("forecast_time").equals(fc.times)
    # a UTC-aware record: UTC, and no local zone to record
    ds_utc = M.to_dataset(pd.Series(Z5, index=s.index.tz_convert("UTC")), forecast_steps=1)
    assert ds_utc["time"].attrs["time_zone"] == "UTC"
    assert "local_time_zone" not in ds_utc["time"].attrs


def test_accessor_keeps_the_zone_and_reads_it_back():
    xr = pytest.importorskip("xarray")
    idx = _paris("2024-10-22")
    da = xr.DataArray(Z5, dims="time", coords={"time": idx}, name="load")
    ds = da.kalman.filter(sigma2=1.0, obs_var=0.5, theta=0.1, forecast_steps=3)
    assert ds["forecast_time"].attrs["local_time_zone"] == "Europe/Paris"
    # the results' own record filtered again: its UTC times read in their zone, so that the
    # forecast across the autumn change stays at local midnights
    again = ds["observed"].kalman.filter(sigma2=1.0, obs_var=0.5, theta=0.1, forecast_steps=3)
    assert again["forecast_time"].attrs == ds["forecast_time"].attrs
    np.testing.assert_array_equal(again["forecast_time"].values, ds["forecast_time"].values)
    back = again.indexes["forecast_time"].tz_localize("UTC").tz_convert("Europe/Paris")
    assert _midnights(back) == [
        "2024-10-27 00:00+0200",
        "2024-10-28 00:00+0100",
        "2024-10-29 00:00+0100",
    ]
    np.testing.assert_allclose(
        again["forecast_mean"].values, ds["forecast_mean"].values, rtol=0, atol=0
    )


def test_accessor_refuses_a_bad_recorded_zone():
    xr = pytest.importorskip("xarray")
    ds = M.to_dataset(pd.Series(Z5, index=_paris("2024-03-28")))
    obs = ds["observed"]
    obs["time"].attrs["local_time_zone"] = "Mars/Olympus"
    with pytest.raises(ValueError, match=r"coordinate 'time': its attr local_time_zone.*Mars"):
        obs.kalman.filter(sigma2=1.0, obs_var=0.5)
    assert isinstance(obs, xr.DataArray)


def test_netcdf_keeps_the_zone_attrs():
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")
    ds = M.to_dataset(pd.Series(Z5, index=_paris("2024-03-28")), forecast_steps=2)
    back = xr.open_dataset(ds.to_netcdf(engine="scipy"), engine="scipy")
    assert back["forecast_time"].attrs["local_time_zone"] == "Europe/Paris"
    assert back["time"].attrs["time_zone"] == "UTC"


def test_zone_names():
    from kalmanscan.timeseries.time_zones import zone_from_name, zone_name

    assert zone_name(dt.timezone.utc) == "UTC"
    assert zone_name(dt.timezone(dt.timedelta(hours=5, minutes=30))) == "UTC+05:30"
    assert zone_name(pd.Timestamp("2024-01-01", tz="Asia/Tokyo").tz) == "Asia/Tokyo"
    assert zone_name(None) is None
    assert zone_from_name("UTC+05:30", "tz").utcoffset(None) == dt.timedelta(hours=5, minutes=30)
    with pytest.raises(ValueError, match="where: expected the name of a timezone"):
        zone_from_name("Nowhere/Town", "where")


def test_fit_and_forecast_of_a_results_dataarray_keep_the_zone():
    pytest.importorskip("xarray")
    ds = M.to_dataset(pd.Series(Z5, index=_paris("2024-10-22"), name="load"))
    fc = ks.forecast(M, ds["observed"], steps=3)  # its UTC times read in their zone again
    assert _midnights(fc.times) == [
        "2024-10-27 00:00+0200",
        "2024-10-28 00:00+0100",
        "2024-10-29 00:00+0100",
    ]


def test_plots_label_zoned_times_on_the_local_clock():
    # before: the axis ticked and labelled UTC days (a Paris midnight drawn as 23:00 / 22:00)
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates

    from kalmanscan import plot as kp

    idx = pd.date_range("2024-03-10", periods=40, freq="D", tz="Europe/Paris")
    s = pd.Series(np.cumsum(np.random.default_rng(0).normal(size=40)), index=idx)
    ds = ks.OUModel(sigma2=1.0, obs_var=0.5).to_dataset(s, forecast_steps=5)
    for ax in (kp.plot_series(ds), kp.plot_overview(ds)[-1]):
        ax.figure.canvas.draw()
        assert ax.get_xlabel().endswith("(Europe/Paris)")
        ticks = [mdates.num2date(x, tz=idx.tz) for x in ax.get_xticks()]
        assert ticks and all((t.hour, t.minute) == (0, 0) for t in ticks), ticks
        matplotlib.pyplot.close(ax.figure)
