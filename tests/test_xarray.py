"""xarray Dataset output, the .kalman accessor and the dask path (kalmanscan.xarray)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

import kalmanscan.xarray as kx  # noqa: E402
from kalmanscan.core import native  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from kalmanscan.timeseries import OUModel, fit_ou, load_nile  # noqa: E402


def test_import_kalmanscan_does_not_import_xarray_or_matplotlib():
    # one fresh interpreter (torch's import is most of its time): kalmanscan imported alone,
    # then its modules dropped and imported again after xarray, which gets no accessor
    code = (
        "import sys, kalmanscan as ks; ks.fit_ou; ks.OUModel; "
        "bad = [m for m in ('xarray', 'matplotlib', 'dask', 'pandas') if m in sys.modules]; "
        "assert not bad, bad; "
        "[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] == 'kalmanscan']; "
        "import xarray as xr, kalmanscan; assert not hasattr(xr.DataArray, 'kalman'); "
        "print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=_repo_root()
    )
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def _repo_root():
    import pathlib

    return str(pathlib.Path(__file__).resolve().parents[1])


def sensors(rng, T=120, S=5, chunks=None):
    days = np.cumsum(rng.exponential(0.8, T))
    time = np.datetime64("2024-01-01T00:00", "ns") + (days * 86400e9).astype("timedelta64[ns]")
    m = OUModel(
        theta=np.linspace(0.1, 1.0, S), sigma2=0.5, mu=np.arange(S, dtype=float), obs_var=0.2
    )
    _, z = m.simulate(days, seed=int(rng.integers(1 << 30)))
    z[rng.random(z.shape) < 0.1] = np.nan
    z[30:45, 0] = np.nan
    da = xr.DataArray(
        z,
        dims=("time", "station"),
        coords={"time": time, "station": [f"s{i}" for i in range(S)]},
        name="level",
    )
    return (da.chunk({"station": chunks}) if chunks else da), m


def test_dataset_from_fit_has_the_documented_layout():
    years, flow = load_nile()
    ds = fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).to_dataset(
        coverage=(0.5, 0.9), forecast_steps=10
    )
    for k in (
        "observed",
        "mean",
        "variance",
        "precision",
        "pred_mean",
        "pred_variance",
        "smoothed_mean",
        "smoothed_variance",
        "loglik",
        "theta",
        "sigma2",
        "mu",
        "obs_var",
        "sigma2_se",
        "converged",
    ):
        assert k in ds, k
    assert ds["mean"].dims == ("time",)
    assert ds["lower"].dims == ("coverage", "time")
    assert ds["forecast_upper"].dims == ("coverage", "forecast_time")
    assert ds.sizes["forecast_time"] == 10
    assert ds.attrs["time_unit"] == "1" and "Ornstein-Uhlenbeck" in ds.attrs["model"]
    assert ds.attrs["fixed"] == "theta=0.0, mu=0.0"
    assert_close(ds["loglik"].values, -632.545625, "published", "float64")
    # bands are mean -/+ q sd and precision is 1/variance
    sd = np.sqrt(ds["variance"])
    assert_close(
        ds["upper"].sel(coverage=0.9), ds["mean"] + 1.6448536269514722 * sd, "truth", "float64"
    )
    assert_close(ds["precision"], 1 / ds["variance"], "truth", "float64")


def test_dataset_values_equal_the_model_results(rng):
    da, m = sensors(rng)
    ds = da.kalman.filter(m, coverage=0.95, forecast_steps=3)
    days = (da.time.values - da.time.values[0]) / np.timedelta64(1, "D")
    sm = m.smooth(da.values, days)
    assert ds["mean"].dims == ("time", "station")
    assert_close(ds["mean"].values, sm.filtered.mean, "truth", "float64")
    assert_close(ds["smoothed_variance"].values, sm.var, "truth", "float64")
    assert_close(ds["loglik"].values, sm.filtered.loglik, "truth", "float64")
    fc = m.forecast(da.values, days, steps=3, coverage=0.95)
    assert_close(ds["forecast_mean"].values, fc.mean, "truth", "float64")
    assert_close(ds["forecast_lower"].sel(coverage=0.95).values, fc.lower, "truth", "float64")
    assert list(ds["station"].values) == list(da["station"].values)


@pytest.mark.parametrize("engine", ["netcdf4", "scipy"])
def test_netcdf_round_trip(tmp_path, engine, rng):
    pytest.importorskip("netCDF4" if engine == "netcdf4" else "scipy")
    da, m = sensors(rng, T=40, S=2)
    fit = fit_ou(da.values, da.time.values, fix={"mu": 0.0})
    ds = fit.to_dataset(forecast_steps=4, series_coords={"series": ["a", "b"]})
    path = tmp_path / f"out-{engine}.nc"
    assert kx.save_netcdf(ds, path, engine=engine) == engine
    back = xr.load_dataset(path, engine=engine)
    assert_close(back["smoothed_mean"].values, ds["smoothed_mean"].values, "truth", "float64")
    # float64 seconds (netCDF3) keep the timestamps to well under a millisecond
    assert np.abs(back["time"].values - ds["time"].values).max() < np.timedelta64(1, "ms")
    assert back["time"].dtype.kind == "M" and back["forecast_time"].dtype.kind == "M"
    assert list(back["series"].values) == ["a", "b"]
    assert back.attrs["time_unit"] == "1D"


def test_dataset_accessor_stacks_variables_into_series(rng):
    da, m = sensors(rng, S=2)
    ds_in = xr.Dataset(
        {"north": da.isel(station=0, drop=True), "south": da.isel(station=1, drop=True)}
    )
    out = ds_in.kalman.filter(sigma2=0.5, obs_var=0.2, theta=0.3)
    assert out["mean"].dims == ("time", "series")
    assert list(out["series"].values) == ["north", "south"]
    single = da.isel(station=1).kalman.filter(sigma2=0.5, obs_var=0.2, theta=0.3)
    assert_close(out["mean"].sel(series="south").values, single["mean"].values, "truth", "float64")


def test_accessor_fit_then_filter_and_forecast(rng):
    da, m = sensors(rng, S=3)
    params = da.kalman.fit_ou(fix={"mu": 0.0})
    assert params["sigma2"].dims == ("station",) and params.attrs["time_unit"] == "1D"
    direct = fit_ou(da.values, da.time.values, fix={"mu": 0.0})
    assert_close(params["sigma2"].values, direct.params["sigma2"], "truth", "float64")
    out = da.kalman.filter(params)
    assert_close(out["loglik"].values, direct.loglik, "truth", "float64")
    fc = da.kalman.forecast(params, at=da.time.values[-1:] + np.timedelta64(2, "D"))
    assert fc["forecast_mean"].dims == ("forecast_time", "station")
    assert "time" not in fc.dims


def test_accessor_argument_errors(rng):
    da, _ = sensors(rng, S=2)
    with pytest.raises(ValueError, match="time_dim: expected one of"):
        da.kalman.filter(sigma2=1.0, obs_var=1.0, time_dim="date")
    with pytest.raises(ValueError, match="obs_var: required"):
        da.kalman.filter(sigma2=1.0)
    with pytest.raises(TypeError, match="unexpected parameters"):
        da.kalman.filter(sigma2=1.0, obs_var=1.0, sigma=2.0)
    with pytest.raises(ValueError, match="steps, at"):
        da.kalman.forecast(sigma2=1.0, obs_var=1.0)


def test_dask_chunks_equal_in_memory_on_a_local_cluster(rng):
    distributed = pytest.importorskip("distributed")
    da, m = sensors(rng, T=100, S=4)
    eager = da.kalman.filter(m, forecast_steps=5)
    eager_fit = da.kalman.fit_ou()
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster),
    ):
        lazy_in = da.chunk({"station": 2})
        lazy = lazy_in.kalman.filter(m, forecast_steps=5)
        assert lazy["mean"].chunks is not None  # nothing computed yet
        assert lazy["mean"].data.numblocks == (1, 2)
        got = lazy.compute()
        got_fit = lazy_in.kalman.fit_ou().compute()
    for k in (
        "mean",
        "variance",
        "smoothed_mean",
        "smoothed_variance",
        "loglik",
        "forecast_mean",
        "lower",
    ):
        if native.available():  # the CPU's compiled kernel: each lane alone, bit for bit
            np.testing.assert_array_equal(got[k].values, eager[k].values, err_msg=k)
        else:  # the torch backend's reductions round by batch shape (the last bit of loglik)
            assert_close(got[k].values, eager[k].values, "rounding", "float64", what=k)
    for k in ("theta", "sigma2", "mu", "obs_var", "loglik"):
        # separate fits are Newton-polished per series, so batching does not change them
        assert_close(got_fit[k].values, eager_fit[k].values, "parallel", "float64", what=k)
