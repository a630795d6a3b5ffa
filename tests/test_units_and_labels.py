"""Units and series names in the xarray results and the fit's messages.

Units: the data's ``units`` attr reaches every output in the data's units (means, bounds,
forecasts, ``mu``), variances get its square, ``precision`` its inverse square, ``sigma2`` its
square per model time unit and ``theta`` the inverse time unit (UDUNITS-2 syntax, ``K^2``), and
nothing is written that the data or the time axis do not give. Before: only ``observed`` had
units, and a fit's Dataset copied the data's onto every variable (``sigma2`` in ``K``).

Names: the accessor's fits name series by their coordinates (``station='c'``), also per dask
chunk (before: by position within the chunk, or not at all for one series per chunk); a robust
fit of a DataFrame names its columns in the refits' messages too (before: by position).
Plain numpy input keeps its messages.
"""

from __future__ import annotations

import contextlib
import re
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

import kalmanscan as ks  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401
from kalmanscan.timeseries import OUModel  # noqa: E402
from kalmanscan.xarray import save_netcdf  # noqa: E402

SAME = ("observed", "mean", "lower", "upper", "pred_mean", "smoothed_mean", "smoothed_lower",
        "smoothed_upper", "forecast_mean", "forecast_lower", "forecast_upper", "mu")  # fmt: skip
SQUARED = ("variance", "pred_variance", "smoothed_variance", "forecast_variance",
           "forecast_predictive_variance", "obs_var")  # fmt: skip
NO_UNITS = ("loglik", "converged", "n_obs")


def _walks(T=200, seed=0):
    """Three series: 'a', 'b' a random walk plus noise, 'c' a noise-free walk whose steps are
    positively correlated (its ``obs_var`` on its bound 0 in a local-level fit)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(T, 3)).cumsum(0)
    z[:, :2] += rng.normal(size=(T, 2))
    e = rng.normal(size=T + 1)
    z[:, 2] = (e[1:] + 0.5 * e[:-1]).cumsum()
    return z


def _units(ds) -> dict:
    return {k: v.attrs.get("units") for k, v in ds.variables.items()}


def _messages(fn) -> list[str]:
    """The warnings' messages of ``fn()``, dask (where installed) on one thread; the in-memory
    cases need no dask."""
    try:
        import dask
    except ImportError:
        scheduler = contextlib.nullcontext()
    else:
        scheduler = dask.config.set(scheduler="synchronous")
    with warnings.catch_warnings(record=True) as caught, scheduler:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


# --- units -----------------------------------------------------------------------------------
def test_filter_outputs_carry_the_data_units():
    z = _walks()
    da = xr.DataArray(z, dims=("time", "station"), attrs={"units": "K"})
    u = _units(da.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=3))
    for k in SAME:
        assert u[k] == "K", k
    for k in SQUARED:
        assert u[k] == "K^2", k
    assert u["precision"] == "K^-2"
    # numeric times without units: the rates' units are not known, and none are made up
    assert u["theta"] is None and u["sigma2"] is None and u["loglik"] is None


def test_one_series_from_the_issue():
    z = _walks()[:, 0]
    m = xr.DataArray(z, dims="time", attrs={"units": "K"}).kalman.filter(sigma2=1, obs_var=1)
    assert m["mean"].attrs["units"] == "K" and m["smoothed_upper"].attrs["units"] == "K"


@pytest.mark.parametrize(
    "time_unit, per_time", [(None, "d^-1"), ("12h", "(12 h)^-1"), ("365.25D", "(365.25 d)^-1")]
)
def test_datetime_times_give_the_rates_units(time_unit, per_time):
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    da = xr.DataArray(z, dims=("time", "station"), coords={"time": t}, attrs={"units": "K"})
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0, time_unit=time_unit)
    assert ds["theta"].attrs["units"] == per_time
    assert ds["sigma2"].attrs["units"] == f"K^2 {per_time}"


def test_no_data_units_none_invented():
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    ds = xr.DataArray(z, dims=("time", "station")).kalman.filter(sigma2=1.0, obs_var=1.0)
    assert all(v is None for v in _units(ds).values())
    dated = xr.DataArray(z, dims=("time", "station"), coords={"time": t})
    u = _units(dated.kalman.filter(sigma2=1.0, obs_var=1.0))
    assert {k for k, v in u.items() if v is not None} == {"theta"}  # the time axis gives it


def test_numeric_time_coordinate_units_and_a_compound_data_unit():
    z = _walks()[:, 0]
    time = ("time", np.arange(len(z), dtype=float), {"units": "days since 2000-01-01"})
    da = xr.DataArray(z, dims="time", coords={"time": time}, attrs={"units": "m s-1"})
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0)
    assert ds["variance"].attrs["units"] == "(m s-1)^2"
    assert ds["precision"].attrs["units"] == "(m s-1)^-2"
    assert ds["theta"].attrs["units"] == "days^-1"
    assert ds["sigma2"].attrs["units"] == "(m s-1)^2 days^-1"


@pytest.mark.parametrize(
    "chunked, joint",
    [(False, False), (True, False), (False, True)],
    ids=["memory", "dask", "joint"],
)
def test_fit_dataset_units(chunked, joint):
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    da = xr.DataArray(z, dims=("time", "station"), coords={"time": t}, attrs={"units": "K"})
    if chunked:
        pytest.importorskip("dask")
        da = da.chunk({"station": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = da.kalman.fit_ou(joint=joint).load()
    u = _units(fit)
    want = {"theta": "d^-1", "sigma2": "K^2 d^-1", "mu": "K", "obs_var": "K^2"}
    for p, unit in want.items():
        assert u[p] == unit and u[p + "_se"] == unit, p
    for k in NO_UNITS:  # before: every variable of a separate fit had the data's "K"
        assert u[k] is None, k


def test_filter_with_a_fit_dataset_sets_the_units_of_these_data():
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    da = xr.DataArray(z, dims=("time", "station"), coords={"time": t}, attrs={"units": "K"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    u = _units(da.kalman.filter(fit))
    assert u["obs_var_se"] == "K^2" and u["sigma2_se"] == "K^2 d^-1" and u["converged"] is None
    # data without units: the fit's units are not carried over
    bare = da.copy()
    bare.attrs = {}
    u = _units(bare.kalman.filter(fit))
    assert u["obs_var"] is None and u["obs_var_se"] is None and u["mu"] is None
    assert u["theta"] == "d^-1"


def test_dataset_accessor_units_where_the_variables_share_one():
    z = _walks()
    ds = xr.Dataset(
        {k: ("time", z[:, j], {"units": "K"}) for j, k in enumerate(("a", "b"))},
    )
    assert ds.kalman.filter(sigma2=1.0, obs_var=1.0)["variance"].attrs["units"] == "K^2"
    ds["b"].attrs["units"] = "degC"
    assert "units" not in ds.kalman.filter(sigma2=1.0, obs_var=1.0)["variance"].attrs


def test_ou_model_to_dataset_gives_what_its_times_give():
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    u = _units(OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z, t))
    assert {k: v for k, v in u.items() if v is not None} == {"theta": "d^-1"}
    u = _units(OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z))
    assert all(v is None for v in u.values())


def test_units_survive_netcdf(tmp_path):
    pytest.importorskip("scipy")
    z = _walks()
    t = pd.date_range("2020-01-01", periods=len(z), freq="D")
    da = xr.DataArray(z, dims=("time", "station"), coords={"time": t}, attrs={"units": "K"})
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=2)
    save_netcdf(ds, tmp_path / "r.nc", engine="scipy")
    back = xr.load_dataset(tmp_path / "r.nc", engine="scipy")
    assert back["sigma2"].attrs["units"] == "K^2 d^-1" and back["precision"].attrs["units"] == (
        "K^-2"
    )
    assert back["theta"].dtype == np.float64  # not decoded as a duration


def test_unit_spelling():
    from kalmanscan.timeseries.dataset import duration_units, unit_power

    assert unit_power("K", 2) == "K^2" and unit_power("degC", -2) == "degC^-2"
    assert unit_power("kg m-2 s-1", 2) == "(kg m-2 s-1)^2" and unit_power("%", 2) == "(%)^2"
    assert unit_power("1", 2) == "1" and unit_power("K", 1) == "K"
    assert duration_units(np.timedelta64(90, "m")) == "1.5 h"
    assert duration_units("1s") == "s" and duration_units(np.timedelta64(250, "ms")) == "250 ms"
    assert duration_units("1") is None


# --- series named by their labels --------------------------------------------------------------
def _bound_warnings(msgs):
    return [m for m in msgs if "obs_var is at its lower bound 0" in m]


def _local_level(da, **kw):
    return lambda: da.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0}, **kw).load()


@pytest.mark.parametrize("chunks", [None, 1, 2], ids=["memory", "dask-1", "dask-2"])
def test_accessor_fit_warnings_name_series_by_label(chunks):
    da = xr.DataArray(_walks(), dims=("time", "station"), coords={"station": ["a", "b", "c"]})
    if chunks:
        pytest.importorskip("dask")
        da = da.chunk({"station": chunks})
    (msg,) = _bound_warnings(_messages(_local_level(da)))
    assert "in series station='c' (" in msg, msg
    assert not re.search(r"series \d", msg), msg


def test_accessor_fit_notes_several_dims_positions_where_no_coordinate():
    pytest.importorskip("dask")
    z = np.stack([_walks(seed=1), _walks(seed=2)], axis=2)  # (time, station, level)
    da = xr.DataArray(z, dims=("time", "station", "level"), coords={"station": ["a", "b", "c"]})
    (msg,) = _bound_warnings(_messages(_local_level(da)))
    assert "in series (station='c', level=0), (station='c', level=1) (" in msg, msg
    # a chunk per series: each chunk's fit names its one series
    msgs = _bound_warnings(_messages(_local_level(da.chunk({"station": 1, "level": 1}))))
    assert len(msgs) == 2, msgs
    for level, msg in enumerate(sorted(msgs)):
        assert f"in series (station='c', level={level}) (" in msg, msg


def test_accessor_positions_in_the_whole_array_without_coordinates():
    pytest.importorskip("dask")
    da = xr.DataArray(_walks(), dims=("time", "station")).chunk({"station": 1})
    (msg,) = _bound_warnings(_messages(_local_level(da)))
    assert "in series station=2 (" in msg, msg


def test_accessor_non_convergence_names_the_series():
    da = xr.DataArray(_walks(), dims=("time", "station"), coords={"station": ["a", "b", "c"]})
    msgs = _messages(lambda: da.kalman.fit_ou(max_iter=1).load())
    (msg,) = [m for m in msgs if "did not converge" in m]
    assert msg.endswith(": series station='a', station='b', station='c'"), msg


def test_accessor_robust_fit_names_the_series():
    z = _walks()
    z[30, 0] += 40.0
    da = xr.DataArray(z, dims=("time", "station"), coords={"station": ["a", "b", "c"]})
    msgs = _messages(_local_level(da, robust=True))
    assert any("series station='a': row 30" in m for m in msgs), msgs
    assert "in series station='c' (" in _bound_warnings(msgs)[0]


def test_dataframe_robust_refits_name_the_columns():
    z = _walks()
    z[30, 0] += 40.0
    df = pd.DataFrame(z, columns=["a", "b", "c"])
    msgs = _messages(lambda: ks.fit_ou(df, fix={"theta": 0.0, "mu": 0.0}, robust=True))
    (msg,) = _bound_warnings(msgs)
    assert "in series 'c' (" in msg, msg  # before: "in series 2", from the refit of an array
    with pytest.warns(UserWarning):
        fit = ks.fit_ou(df, fix={"theta": 0.0, "mu": 0.0}, robust=True)
    assert not any(re.search(r"series \d", n) for n in fit.notes), fit.notes


def test_plain_numpy_and_one_column_messages_unchanged():
    z = _walks()
    (msg,) = _bound_warnings(_messages(lambda: ks.fit_ou(z, fix={"theta": 0.0, "mu": 0.0})))
    assert "in series 2 (" in msg
    one = pd.DataFrame({"c": z[:, 2]})
    (msg,) = _bound_warnings(_messages(lambda: ks.fit_ou(one, fix={"theta": 0.0, "mu": 0.0})))
    assert msg.startswith("fit_ou: obs_var is at its lower bound 0 (estimate"), msg


def test_fit_ou_series_labels():
    z = _walks()
    with pytest.warns(UserWarning, match="in series 'w' "):
        fit = ks.fit_ou(z, fix={"theta": 0.0, "mu": 0.0}, series_labels=["x", "y", "w"])
    assert fit.series_labels == ["x", "y", "w"]
    assert any("in series 'w'" in n for n in fit.notes), fit.notes
    with pytest.raises(ValueError, match=r"series_labels: expected 3 labels .* got 2"):
        ks.fit_ou(z, series_labels=["x", "y"])
    with pytest.raises(TypeError, match="series_labels: expected a list of 3 labels"):
        ks.fit_ou(z, series_labels="xyz")


@pytest.mark.filterwarnings("ignore:fit_ou. obs_var is at its lower bound")
def test_fit_ou_series_labels_kept_as_given():
    """Integer labels stay integers, as a DataFrame's columns do: the results Dataset selects
    them by value (they came back as text, so ``ds.sel(series=20)`` failed)."""
    z = _walks()
    fit = ks.fit_ou(z, fix={"theta": 0.0}, series_labels=[10, 20, 30])
    frame = ks.fit_ou(pd.DataFrame(z, columns=[10, 20, 30]), fix={"theta": 0.0})
    assert fit.series_labels == frame.series_labels == [10, 20, 30]
    ds = fit.to_dataset()
    np.testing.assert_array_equal(ds["mean"].sel(series=20), fit.filter().mean[:, 1])


@pytest.mark.parametrize("units", [b"K", 1, " "], ids=["bytes", "number", "blank"])
def test_data_units_attr_not_a_unit_string_is_kept_on_observed(units):
    """A ``units`` attr that names no unit (bytes, a number, blank) gives the outputs none, and
    ``observed`` keeps the data's attrs as they are (it lost the attr)."""
    z = np.array([1.0, 2.0, np.nan, 3.0, 2.5])
    da = xr.DataArray(z, dims="time", attrs={"units": units, "long_name": "temp"})
    ds = da.kalman.filter(sigma2=1.0, obs_var=1.0)
    assert ds["observed"].attrs["units"] == units
    assert ds["observed"].attrs["long_name"] == "temp"
    assert "units" not in ds["variance"].attrs and "units" not in ds["mean"].attrs
