"""The time-series API on inputs as users hold them: per-series fixed values given as labelled
DataArrays (in memory and in dask chunks), DataArrays with a time coordinate, integer times past
float64's exact range, and several coverages asked of a one-band forecast."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")
sm = pytest.importorskip("statsmodels.api")

import kalmanscan as ks  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401
from kalmanscan.timeseries import OUModel, as_time_axis, load_nile  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402


@pytest.fixture(scope="module")
def macro():
    md = sm.datasets.macrodata.load_pandas().data
    idx = pd.PeriodIndex.from_fields(
        year=md.year.astype(int), quarter=md.quarter.astype(int), freq="Q"
    ).to_timestamp()
    return xr.DataArray(
        np.stack([md.infl, md.unemp], 1),
        dims=("time", "var"),
        coords={"time": idx, "var": ["infl", "unemp"]},
    )


def test_fix_dataarray_is_matched_by_label(macro):
    # given in the other order: each series must get its own value
    fix = xr.DataArray([0.0, 0.1], dims="var", coords={"var": ["unemp", "infl"]})
    out = macro.kalman.fit_ou(fix={"theta": fix, "mu": 0.0})
    assert float(out.theta.sel(var="infl")) == 0.1
    assert float(out.theta.sel(var="unemp")) == 0.0
    alone = macro.sel(var="unemp").kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    assert float(out.sigma2.sel(var="unemp")) == pytest.approx(float(alone.sigma2), rel=1e-6)
    assert out.attrs["fixed"] == "theta=per series, mu=0.0"


def test_fix_dataarray_without_a_series_refused(macro):
    fix = xr.DataArray([0.0], dims="var", coords={"var": ["infl"]})
    with pytest.raises(ValueError, match=r"fix\['theta'\]: no value for var='unemp'"):
        macro.kalman.fit_ou(fix={"theta": fix})
    with pytest.raises(ValueError, match=r"fix\['theta'\]: expected values over the data's"):
        macro.kalman.fit_ou(fix={"theta": xr.DataArray([0.0, 0.1], dims="other")})
    with pytest.raises(ValueError, match=r"fix\['theta'\]: expected a scalar or an array over the "
                       r"series dims \['var'\], got shape \(3,\)"):  # fmt: skip
        macro.kalman.fit_ou(fix={"theta": np.array([0.0, 0.1, 0.2])})


def test_fix_array_reaches_each_dask_chunk(macro):
    pytest.importorskip("dask")
    fix = {"theta": np.array([0.0, 0.1]), "mu": 0.0}
    mem = macro.kalman.fit_ou(fix=fix)
    lazy = macro.chunk({"var": 1}).kalman.fit_ou(fix=fix).compute()
    np.testing.assert_array_equal(lazy.theta.values, [0.0, 0.1])
    # a lone series' log-likelihood rounds differently (docs/model.md): equal to the tolerance
    np.testing.assert_allclose(lazy.sigma2.values, mem.sigma2.values, rtol=1e-5)
    labelled = xr.DataArray([0.1, 0.0], dims="var", coords={"var": ["unemp", "infl"]})
    lazy = macro.chunk({"var": 1}).kalman.fit_ou(fix={"theta": labelled, "mu": 0.0}).compute()
    np.testing.assert_array_equal(lazy.theta.values, [0.0, 0.1])


@pytest.mark.parametrize("bad", ["0", False, "abc", 0j, np.array(["a", "b"])])
def test_fix_refuses_text_booleans_and_complex(bad):
    years, flow = load_nile()
    with pytest.raises(TypeError, match=r"fix\['theta'\]"):
        ks.fit_ou(flow, years, fix={"theta": bad})


def test_dataarray_gives_its_time_coordinate(macro):
    infl = macro.sel(var="infl")
    series = infl.to_series()
    a = ks.fit_ou(infl)
    b = ks.fit_ou(series)
    assert a.params["theta"] == b.params["theta"]  # per day, from the dates
    assert 1e-4 < a.params["theta"] < 1e-2
    both = ks.fit_ou(macro)
    assert "unemp" in both.summary()
    assert ks.fit_ou(macro.T, axis=1).params["theta"].tolist() == both.params["theta"].tolist()


def test_integer_times_past_2_53_are_refused_not_rounded(tmp_path, capsys):
    t0 = 1_704_067_200_000_000_000  # 2024-01-01 in epoch nanoseconds
    t = t0 + 100 * np.arange(5, dtype=np.int64)
    with pytest.raises(ValueError, match="float64 holds exactly .* got 1704067200000000100"):
        as_time_axis(t, 5)
    ax = as_time_axis(t - t[0], 5)  # what the message says to do: exact
    assert ax.t.tolist() == [0.0, 100.0, 200.0, 300.0, 400.0]
    exact = np.array([2**60, 2**60 + 256], dtype=np.int64)  # multiples float64 holds
    assert as_time_axis(exact, 2).t.tolist() == [0.0, 256.0]
    path = tmp_path / "ns.csv"
    path.write_text("t,y\n" + "".join(f"{v},{i % 3}\n" for i, v in enumerate(t)))
    rc = filter_main([str(path), "--time-col", "t", "--sigma2", "1", "--obs-var", "1",
                      "--quiet", "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc != 0
    err = capsys.readouterr().err
    assert "column 't'" in err and "at row 3" in err and "write the times as dates" in err


def test_one_band_forecast_refuses_several_coverages():
    years, flow = load_nile()
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    with pytest.raises(ValueError, match="coverage: expected one level"):
        fit.forecast(3, coverage=(0.5, 0.9))
    assert fit.forecast(3, coverage=[0.9]).coverage == 0.9
    m = OUModel(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match="coverage: expected one level"):
        m.forecast(flow, years, steps=2, coverage=(0.5, 0.9))


@pytest.mark.parametrize(
    "periods,starts",
    [
        (
            pd.period_range("2024-01-01", periods=3, freq="W"),
            ["2024-01-01", "2024-01-08", "2024-01-15"],
        ),
        (pd.period_range("2000", periods=2, freq="Y-JUN"), ["1999-07-01", "2000-07-01"]),
        (pd.period_range("1959Q1", periods=2, freq="Q"), ["1959-01-01", "1959-04-01"]),
    ],
)
def test_periods_are_the_times_they_start(periods, starts):
    expected = np.array(starts, dtype="datetime64[D]")
    for given in (periods, pd.Series(periods)):
        ax = as_time_axis(given, len(periods))
        np.testing.assert_array_equal(ax.labels.astype("datetime64[D]"), expected)


def test_weekly_period_index_fits_as_its_timestamps():
    co2 = sm.datasets.co2.load_pandas().data["co2"]
    a = ks.fit_ou(co2.to_period("W"), backend="torch")
    b = ks.fit_ou(co2.to_period("W").to_timestamp(how="start"), backend="torch")
    assert a.params["theta"] == b.params["theta"]


def test_forecast_at_with_a_timezone_against_a_record_without_one_refused():
    co2 = sm.datasets.co2.load_pandas().data["co2"].iloc[:300]
    naive = ks.fit_ou(co2, backend="torch")
    eastern = dt.timezone(dt.timedelta(hours=-5))  # (a fixed offset: no tz database needed)
    with pytest.raises(ValueError, match="at: got times with a timezone"):
        naive.forecast(at=pd.Timestamp("1964-01-01", tz=eastern))
    aware = ks.fit_ou(co2.tz_localize(eastern), backend="torch")
    a = aware.forecast(at=pd.Timestamp("1964-01-01", tz=eastern))
    b = aware.forecast(at=np.datetime64("1964-01-01T05:00"))  # without one: read as UTC
    np.testing.assert_array_equal(a.times, b.times)
    assert a.mean.tolist() == b.mean.tolist()


def test_scale_refusal_states_the_range():
    years, flow = load_nile()
    with pytest.raises(ValueError, match="is 1.18e.152; expected a scale from 1e-150 to 1e150"):
        ks.fit_ou(flow * 1e150, years, fix={"theta": 0.0, "mu": 0.0})


def test_fitted_parameters_match_the_series_by_label(macro):
    params = macro.kalman.fit_ou(fix={"theta": 0.0, "mu": 0.0})
    whole = macro.kalman.filter(params)
    swapped = macro.sel(var=["unemp", "infl"]).kalman.filter(params)
    one = macro.sel(var=["unemp"]).kalman.filter(params)
    for ds in (swapped, one):
        np.testing.assert_allclose(
            ds["mean"].sel(var="unemp").values, whole["mean"].sel(var="unemp").values, rtol=1e-12
        )
    expected = r"theta: expected values over the data's series dims \(\), got dims \('other',\)"
    with pytest.raises(ValueError, match=expected + r".* select one, e.g. .sel\(other='infl'\)"):
        macro.sel(var="infl").kalman.filter(params.rename(var="other"))


def test_model_parameters_of_another_series_shape_are_refused():
    years, flow = load_nile()
    two = np.stack([flow, flow], 1)
    with pytest.raises(ValueError, match=r"theta: expected a scalar or values broadcasting to the"
                       r" data's shape \[T, \*S\] \(100, 2\), got shape \(3,\)"):  # fmt: skip
        OUModel(theta=[0.0, 0.1, 0.2], sigma2=1.0, obs_var=1.0).filter(two, years)
    with pytest.raises(ValueError, match=r"shape \[T, \*S\] \(100,\), got shape \(2,\)"):
        OUModel(theta=[0.0, 0.1], sigma2=1.0, obs_var=1.0).to_dataset(flow, years)
    with pytest.raises(ValueError, match="mu: expected finite values, got nan"):
        OUModel(mu=np.nan)
    with pytest.raises(ValueError, match=r"series_coords\['foo'\]: expected 2 labels"):
        OUModel(sigma2=1.0, obs_var=1.0).to_dataset(two, years, series_dims=("foo",),
                                                    series_coords={"foo": ["a"]})  # fmt: skip


def test_simulate_takes_times_or_a_positive_n():
    m = OUModel(theta=0.1)
    with pytest.raises(ValueError, match="n: expected a positive integer number of steps, got -1"):
        m.simulate(n=-1, seed=0)
    with pytest.raises(ValueError, match="times, n: give either .* got both"):
        m.simulate(np.arange(10.0), n=5, seed=0)
    assert m.simulate(n=3, seed=0)[1].shape == (3,)


def test_a_text_variable_of_a_dataset_is_named(macro):
    ds = macro.to_dataset(dim="var")
    ds["label"] = ("time", np.array(["x"] * ds.sizes["time"]))
    with pytest.raises(TypeError, match="Dataset variable 'label': expected real numbers"):
        ds.kalman.fit_ou()
