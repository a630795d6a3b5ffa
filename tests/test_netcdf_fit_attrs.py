"""A fit's results written to netCDF3 (the ``scipy`` engine, :func:`kalmanscan.xarray.save_netcdf`)
and read back: its ``time_unit_ns`` attribute (8.64e13 for a day) is past netCDF3's 32-bit
integers, and writing raised xarray's "could not safely cast array from int64 to int32"; it is
stored as float64 (exact below 2^53) and the file's parameters filter the data as the fit does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("scipy")
import kalmanscan.xarray as kx  # noqa: E402


def _data():
    t = pd.date_range("2000-01-01", periods=40, freq="D")
    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 2)).cumsum(0) + rng.normal(size=(40, 2))
    return xr.DataArray(z, dims=("time", "station"), coords={"time": t, "station": ["a", "b"]})


def test_fit_round_trips_through_netcdf3(tmp_path):
    da = _data()
    fit = da.kalman.fit_ou()
    assert fit.attrs["time_unit_ns"] == 86_400_000_000_000
    path = tmp_path / "fit.nc"
    assert kx.save_netcdf(fit, path, engine="scipy") == "scipy"
    back = xr.open_dataset(path, engine="scipy").load()
    assert back.attrs["time_unit_ns"] == 86_400_000_000_000
    assert fit.attrs["time_unit_ns"] == 86_400_000_000_000  # (the fit itself unchanged)
    for k in ("theta", "sigma2", "mu", "obs_var", "loglik"):
        np.testing.assert_array_equal(back[k].values, fit[k].values)
    a = da.kalman.filter(fit, smooth=False)
    b = da.kalman.filter(back, smooth=False)
    np.testing.assert_array_equal(a["mean"].values, b["mean"].values)


def test_attributes_past_32_bits():
    """Past 2^53 an integer attribute is kept as its text; within 32 bits as it is."""
    ds = xr.Dataset({"x": ("t", [1.0])}, attrs={"big": 2**60, "small": 7, "flag": True})
    ds["x"].attrs["n"] = 2**40
    out = kx._nc3_attrs(ds)
    assert out.attrs == {"big": str(2**60), "small": 7, "flag": True}
    assert out["x"].attrs["n"] == float(2**40)
    assert ds.attrs["big"] == 2**60 and ds["x"].attrs["n"] == 2**40
