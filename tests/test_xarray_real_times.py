"""The xarray interface and the band plots on real data: what the
``.kalman`` accessor keeps (time zones, timestamp strings, coordinate attrs, the fit's record,
the series coordinates of a joint fit), how it names a bad value, and which times the plots
take. Truths: a float64 covariance-form Kalman filter written here, and statsmodels."""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import kalmanscan as ks  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401
from kalmanscan.plot import plot_bands, plot_overview, plot_precision, plot_series  # noqa: E402
from kalmanscan.xarray import save_netcdf  # noqa: E402


def reference_filter(z, obs_var, process_var):
    """Random walk ``x_t = x_{t-1} + w_t`` (``process_var [T]``, entry 0 unused), exact diffuse
    start, float64 covariance form: filtered means, variances and the log-likelihood."""
    T = len(z)
    m, v, ll = np.nan, np.inf, 0.0
    mean, var = np.empty(T), np.empty(T)
    for t in range(T):
        mp, vp = (m, v + process_var[t]) if t else (m, v)
        if np.isfinite(z[t]):
            if np.isinf(vp):
                m, v = z[t], obs_var
            else:
                S = vp + obs_var
                ll -= 0.5 * (np.log(2 * np.pi * S) + (z[t] - mp) ** 2 / S)
                m, v = mp + vp / S * (z[t] - mp), vp * obs_var / S
        else:
            m, v = mp, vp
        mean[t], var[t] = m, v
    return mean, var, ll


def _nile():
    sm = pytest.importorskip("statsmodels.api")
    data = sm.datasets.nile.load_pandas().data
    return data["year"].to_numpy(dtype=np.int64), data["volume"].to_numpy(dtype=np.float64)


def _close(ds, z, obs_var, process_var):
    mean, var, ll = reference_filter(z, obs_var, process_var)
    np.testing.assert_allclose(ds["mean"].values, mean, rtol=1e-12)
    np.testing.assert_allclose(ds["variance"].values, var, rtol=1e-12)
    assert float(ds["loglik"]) == pytest.approx(ll, rel=1e-12)


# --- time coordinates --------------------------------------------------------------------------


def test_tz_aware_time_coordinate_is_read_in_utc_and_says_so(tmp_path):
    """A DataArray made from a tz-aware pandas Series: the filter reads its times in UTC (the
    index keeps the zone that ``.values`` drops), the Dataset's ``time`` is those UTC times and,
    like ``forecast_time``, says ``time_zone = "UTC"`` (as ``OUModel.to_dataset`` does), and the
    Dataset plots and writes to netCDF. Before: ``time`` kept the tz-aware dtype without the
    attribute, forecast times were naive, ``save_netcdf`` raised TypeError and ``plot_series``
    raised TypeError."""
    years, flow = _nile()
    idx = pd.date_range("2024-03-30", periods=len(flow), freq="12h", tz="Europe/Paris")
    da = xr.DataArray.from_series(pd.Series(flow, index=idx).rename_axis("time"))
    ds = da.kalman.filter(sigma2=1469.1, obs_var=15099.0, forecast_steps=2, time_unit="12h")
    utc = idx.tz_convert("UTC").tz_localize(None).to_numpy()
    assert ds["time"].dtype.kind == "M"
    np.testing.assert_array_equal(ds["time"].values, utc)
    assert ds["time"].attrs.get("time_zone") == "UTC"
    assert ds["forecast_time"].attrs.get("time_zone") == "UTC"
    np.testing.assert_array_equal(
        ds["forecast_time"].values, utc[-1] + np.array([12, 24], dtype="timedelta64[h]")
    )
    _close(ds, flow, 15099.0, np.full(len(flow), 1469.1))  # the steps are 12 h apart in UTC
    assert save_netcdf(ds, tmp_path / "tz.nc", engine="scipy") == "scipy"
    plot_series(ds).figure.savefig(tmp_path / "tz.png")


def test_string_time_coordinate_becomes_the_dates_the_filter_read(tmp_path):
    """Day-first date strings as the time coordinate: the Dataset's ``time`` is the dates the
    filter used (datetime64), so forecast times are of the same kind and the plots draw.
    Before: ``time`` stayed text next to datetime64 forecast times, and ``plot_series`` raised
    TypeError (str minus str)."""
    z = np.array([1.0, 2.0, np.nan, 3.0, 2.5])
    text = ["29/03/1958", "30/03/1958", "01/04/1958", "02/04/1958", "10/04/1958"]
    da = xr.DataArray(z, dims="time", coords={"time": text})
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=1)
    dates = pd.to_datetime(text, format="%d/%m/%Y").to_numpy()
    np.testing.assert_array_equal(ds["time"].values, dates)
    assert ds["forecast_time"].dtype.kind == "M"
    days = np.r_[0.0, np.diff(dates) / np.timedelta64(1, "D")]
    _close(ds, z, 1.0, days)
    np.testing.assert_array_equal(np.isnan(ds["observed"].values), np.isnan(z))
    plot_overview(ds)[0].figure.savefig(tmp_path / "dates.png")


def test_coordinate_attrs_survive_the_filter():
    """``units``/``standard_name`` of the time and series coordinates are kept. Before: the
    filter's outputs (apply_ufunc, keep_attrs=False) replaced the coordinates without them."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(30, 2)).cumsum(0)
    da = xr.DataArray(
        z,
        dims=("time", "lat"),
        coords={
            "time": ("time", np.arange(30.0), {"standard_name": "time", "long_name": "day"}),
            "lat": ("lat", [10.0, 20.0], {"units": "degrees_north"}),
            "height": ((), 2.0, {"units": "m"}),
        },
        attrs={"units": "K"},
    )
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=2)
    assert ds["time"].attrs == {"standard_name": "time", "long_name": "day"}
    assert ds["lat"].attrs == {"units": "degrees_north"}
    assert ds["height"].attrs == {"units": "m"}
    assert ds["observed"].attrs["units"] == "K"
    for j in range(2):
        _close(ds.isel(lat=j), z[:, j], 1.0, np.ones(30))


def test_a_joint_fit_keeps_the_series_coordinates():
    """``fit_ou(joint=True)`` keeps non-index and scalar coordinates, as separate fits do.
    Before: only the index coordinates of the series dims were kept."""
    rng = np.random.default_rng(2)
    z = rng.normal(size=(40, 2)).cumsum(0) + rng.normal(size=(40, 2))
    da = xr.DataArray(
        z,
        dims=("time", "station"),
        coords={"station": ["a", "b"], "code": ("station", [7, 9]), "height": 2.0},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0}, joint=True)
        separate = da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    assert set(joint.coords) == set(separate.coords) == {"station", "code", "height"}
    np.testing.assert_array_equal(joint["code"].values, [7, 9])


# --- the fit's record --------------------------------------------------------------------------


def test_filtering_with_a_fit_records_it():
    """The accessor's documented flow ``params = da.kalman.fit_ou(); da.kalman.filter(params)``
    keeps what the fit found: ``*_se``, ``converged`` (matched by label) and the attrs
    ``fitted``, ``fixed``, ``joint``; an ``OUFit`` too (and ``n_iter``). Before: all dropped."""
    years, flow = _nile()
    da = xr.DataArray(
        np.stack([flow, flow[::-1]], 1),
        dims=("time", "series"),
        coords={"time": years.astype(float), "series": ["nile", "reversed"]},
    )
    params = da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    out = da.isel(series=[1, 0]).kalman.filter(params)
    for k in ("sigma2_se", "obs_var_se", "converged"):
        np.testing.assert_array_equal(out[k].values, params[k].sel(series=out["series"]).values)
    assert out.attrs["fitted"] == params.attrs["fitted"]
    assert out.attrs["fixed"] == "theta=0.0, mu=0.0" and out.attrs["joint"] == 0
    assert float(out["sigma2"].sel(series="nile")) == pytest.approx(1469.1, rel=1e-3)
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    one = xr.DataArray(flow, dims="time", coords={"time": years.astype(float)})
    rec = one.kalman.filter(fit)
    assert float(rec["sigma2_se"]) == pytest.approx(float(fit.stderr["sigma2"]), rel=1e-12)
    assert rec.attrs["n_iter"] == fit.n_iter
    hand = params[["theta", "sigma2", "mu", "obs_var"]].drop_attrs()
    assert (
        "sigma2_se" not in da.kalman.filter(hand) and "fitted" not in da.kalman.filter(hand).attrs
    )


# --- messages and small gaps ---------------------------------------------------------------------


def test_an_infinite_value_is_named_by_its_labels():
    """Before: ``z: ... at index (1,)`` (the internal name and layout, no labels)."""
    da = xr.DataArray(
        [[1.0, 2.0], [np.inf, 3.0]],
        dims=("time", "station"),
        coords={"time": pd.to_datetime(["2020-01-01", "2020-01-02"]), "station": ["a", "b"]},
    )
    with pytest.raises(
        ValueError, match=r"^da: expected finite .* got inf at time=2020-01-02.*'a'"
    ):
        da.kalman.filter(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match=r"^da: .*got -inf at dim_0=1"):
        xr.DataArray([1.0, -np.inf]).kalman.fit_ou(time_dim="dim_0")


def test_the_accessor_forecast_takes_a_backend():
    """``filter`` takes ``backend=``; ``forecast`` did not (TypeError: unexpected parameter)."""
    years, flow = _nile()
    da = xr.DataArray(flow, dims="time", coords={"time": years.astype(float)})
    kw = dict(sigma2=1469.1, obs_var=15099.0, steps=3)
    a = da.kalman.forecast(backend="sequential", **kw)
    b = da.kalman.forecast(**kw)
    np.testing.assert_allclose(a["forecast_mean"], b["forecast_mean"], rtol=1e-13)
    mean, var, _ = reference_filter(flow, 15099.0, np.full(100, 1469.1))
    np.testing.assert_allclose(a["forecast_mean"], mean[-1], rtol=1e-13)
    np.testing.assert_allclose(
        a["forecast_predictive_variance"], var[-1] + 1469.1 * np.arange(1, 4) + 15099.0, rtol=1e-13
    )
    with pytest.raises(ValueError, match="backend"):
        da.kalman.forecast(backend="nope", **kw)


def test_the_dataarray_name_is_recorded():
    """As ``OUModel.to_dataset(name=...)`` records it; the plot titles use it."""
    da = xr.DataArray([1.0, 2.0, 3.0], dims="time", name="volume")
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0)
    assert ds.attrs["name"] == "volume"
    assert "volume" in plot_series(ds).get_title()


# --- plots ---------------------------------------------------------------------------------------

TIMES = {
    "datetime objects": [dt.datetime(2020, 1, d) for d in range(1, 6)],
    "dates": [dt.date(2020, 1, d) for d in range(1, 6)],
    "tz-aware index": pd.date_range("2020-01-01", periods=5, freq="D", tz="Europe/Paris"),
    "ISO strings": ["2020-01-01", "2020-01-02", "2020-01-03", "2020-01-04", "2020-01-05"],
}


@pytest.mark.parametrize("kind", list(TIMES))
def test_plot_bands_takes_the_times_the_filter_takes(kind):
    """Datetime objects, dates, tz-aware times and ISO strings (all accepted by ``ks.filter``'s
    time axes): drawn as dates, the NaN shaded around its day. Before: TypeError in the shading
    (timedelta objects, or str minus str)."""
    z = np.array([1.0, np.nan, 2.0, 3.0, 2.5])
    ax = plot_bands(TIMES[kind], np.zeros(5), np.ones(5), observed=z)
    spans = [p for p in ax.patches if p.get_label() == "missing / no data"]
    assert len(spans) == 1
    lo = spans[0].get_x()  # axvspan: a Rectangle from x to x + width
    hi = lo + spans[0].get_width()
    day = matplotlib.dates.date2num(np.datetime64("2020-01-02"))
    shift = 1 / 24 if kind == "tz-aware index" else 0.0  # Paris midnight is 23:00 UTC
    assert lo == pytest.approx(day - 0.5 - shift) and hi == pytest.approx(day + 0.5 - shift)


def test_plot_precision_reads_a_text_time_coordinate():
    """A results Dataset whose time coordinate is text (made by hand): plotted as dates."""
    ds = ks.OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.array([1.0, np.nan, 2.0, 3.0]))
    ds = ds.assign_coords(time=["2020-01-01", "2020-01-02", "2020-01-03", "2020-01-04"])
    ax = plot_precision(ds)
    assert ax.get_xlim()[0] == pytest.approx(
        matplotlib.dates.date2num(np.datetime64("2020-01-01")), abs=1.0
    )
