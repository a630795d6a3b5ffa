"""Forecast times of numeric labels written with few decimals (1959.1, 1959.2, ...) are those
decimals, not their float sums' noise (results.csv wrote 1968.6000000000004)."""

import numpy as np

from kalmanscan.timeseries.times import as_time_axis


def test_decimal_labels_forecast_decimal_times():
    t = np.round(np.array([1959.1 + 0.1 * i for i in range(96)]), 1)
    got = as_time_axis(t, t.size).future(4)
    assert [repr(float(x)) for x in got] == ["1968.7", "1968.8", "1968.9", "1969.0"]
    q = np.array([2.25, 2.5, 2.75, 3.0])
    assert as_time_axis(q, 4).future(2).tolist() == [3.25, 3.5]


def test_epoch_seconds_and_irregular_times_unchanged():
    e = np.arange(1709430000, 1709430000 + 3600 * 10, 3600).astype(float)
    assert as_time_axis(e, e.size).future(2).tolist() == [1709466000.0, 1709469600.0]
    r = np.cumsum(np.random.default_rng(0).exponential(1.0, size=20))
    step = np.median(np.diff(r))
    np.testing.assert_array_equal(as_time_axis(r, 20).future(2), r[-1] + np.arange(1, 3) * step)


def test_cli_summary_and_netcdf_forecast_times(tmp_path, capsys):
    """The summary's forecast table writes epoch seconds whole (three hours printed alike as
    1.70943e+09), and results.nc marks forecast_time as UTC where the input's offsets were
    applied, as it marks time."""
    import xarray as xr

    from kalmanscan.timeseries.cli import filter_main

    t0 = 1709420000
    text = "unix_time,temp\n" + "".join(f"{t0 + 3600 * i},{0.5 + 0.01 * i}\n" for i in range(24))
    path = tmp_path / "e.csv"
    path.write_text(text)
    out = tmp_path / "o"
    args = ["--sigma2", "3e-6", "--obs-var", "0.01", "--forecast", "3", "--out", str(out)]
    assert filter_main([str(path), "--time-col", "unix_time", *args]) == 0
    printed = capsys.readouterr().out
    for k in range(1, 4):
        assert str(t0 + 3600 * (23 + k)) in printed
    text = "timestamp,load\n" + "".join(
        f"2024-03-28T{h:02d}:00:00+01:00,{0.1 + 0.01 * h}\n" for h in range(20)
    )
    path = tmp_path / "z.csv"
    path.write_text(text)
    assert filter_main([str(path), "--time-col", "timestamp", *args]) == 0
    with xr.open_dataset(out / "results.nc") as ds:
        assert ds["time"].attrs.get("time_zone") == "UTC"
        assert ds["forecast_time"].attrs.get("time_zone") == "UTC"
