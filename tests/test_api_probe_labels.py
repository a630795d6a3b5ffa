"""Series labels that users give are kept and matched (docs/api.md): an ``OUFit`` applied through
the ``.kalman`` accessor goes to the DataArray's series by label, as a parameter Dataset does
(a label the fit lacks refused naming it, a subset selected); ``fit.model`` carries the fit's
labels to labelled pandas and xarray data; a named Series keeps its name, integer column labels
stay integers and MultiIndex columns become a MultiIndex coordinate."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")
import kalmanscan as ks  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401  (registers the accessor)

SCALES = {"a": 1.0, "b": 10.0, "c": 100.0}  # a sigma2 per station, 4 orders apart


@pytest.fixture(scope="module")
def data():
    """Three random walks plus noise whose variances differ by 10**2 each: a DataFrame over
    ``a, b, c``, the same values as a DataArray over ``station``, and the DataFrame's fit."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        (rng.normal(size=(40, 3)).cumsum(0) + rng.normal(size=(40, 3))) * list(SCALES.values()),
        columns=list(SCALES),
        index=pd.date_range("2000", periods=40),
    )
    da = xr.DataArray(
        df.to_numpy(), dims=("time", "station"), coords={"time": df.index, "station": list(df)}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(df)
    return df, da, fit


def by_station(ds, var):
    return {str(k): float(v) for k, v in zip(ds["station"].values, ds[var].values, strict=True)}


def fitted(fit, var="sigma2"):
    return dict(zip(fit.series_labels, np.asarray(fit.params[var]).tolist(), strict=True))


@pytest.mark.parametrize("order", [["c", "a", "b"], ["a", "b", "c"], ["b", "c", "a"]])
def test_accessor_matches_an_oufit_by_label(data, order):
    df, da, fit = data
    rev = da.sel(station=order)
    out = rev.kalman.filter(fit)
    for p in ("theta", "sigma2", "mu", "obs_var"):
        want = fitted(fit, p)
        assert by_station(out, p) == {k: want[k] for k in order}, p
    # the fit's record goes with its series: standard errors and convergence by label too
    se = dict(zip(fit.series_labels, fit.stderr["sigma2"].tolist(), strict=True))
    assert by_station(out, "sigma2_se") == pytest.approx({k: se[k] for k in order})
    # the same results as the parameter Dataset of the accessor's fit (matched by label), and as
    # the data in the fit's own order
    mem = da.kalman.filter(fit)
    xr.testing.assert_allclose(out["mean"], mem["mean"].sel(station=order), rtol=1e-12)
    np.testing.assert_allclose(out["loglik"].values, mem["loglik"].sel(station=order).values)


def test_accessor_forecast_matches_an_oufit_by_label(data):
    df, da, fit = data
    order = ["c", "a", "b"]
    fc = da.sel(station=order).kalman.forecast(fit, steps=2)
    mem = da.kalman.forecast(fit, steps=2)
    assert by_station(fc, "obs_var") == {k: fitted(fit, "obs_var")[k] for k in order}
    np.testing.assert_allclose(
        fc["forecast_mean"].values, mem["forecast_mean"].sel(station=order).values, rtol=1e-12
    )


def test_accessor_selects_a_subset_of_an_oufit_by_label(data):
    df, da, fit = data
    out = da.sel(station=["c", "a"]).kalman.filter(fit)
    want = fitted(fit)
    assert by_station(out, "sigma2") == {"c": want["c"], "a": want["a"]}


def test_accessor_refuses_an_oufit_without_the_data_labels(data):
    df, da, fit = data
    other = da.assign_coords(station=["x", "y", "z"])
    with pytest.raises(ValueError, match="station='x'") as info:
        other.kalman.filter(fit)
    assert "'a', 'b', 'c'" in str(info.value)
    with pytest.raises(ValueError, match="station='x'"):
        other.kalman.forecast(fit, steps=1)
    # one label the fit lacks among others it has
    with pytest.raises(ValueError, match="station='x'"):
        da.assign_coords(station=["a", "x", "c"]).kalman.filter(fit)


def test_accessor_applies_an_oufit_by_position_to_unlabelled_series(data):
    df, da, fit = data
    plain = xr.DataArray(df.to_numpy(), dims=("time", "station"), coords={"time": df.index})
    out = plain.kalman.filter(fit)
    np.testing.assert_array_equal(out["sigma2"].values, fit.params["sigma2"])


def test_fit_model_matches_dataframe_columns_by_label(data):
    df, da, fit = data
    order = ["c", "a", "b"]
    want = fit.model.filter(df).loglik
    got = fit.model.filter(df[order]).loglik
    np.testing.assert_allclose(got, want[[2, 0, 1]], rtol=1e-13)
    np.testing.assert_allclose(
        fit.model.smooth(df[order]).mean, fit.model.smooth(df).mean[:, [2, 0, 1]]
    )
    fc = fit.model.forecast(df[order], steps=1)
    np.testing.assert_allclose(fc.mean, fit.model.forecast(df, steps=1).mean[:, [2, 0, 1]])
    # a subset, and a single named column (a Series named after a fitted series)
    np.testing.assert_allclose(fit.model.loglik(df[["b"]]), want[[1]], rtol=1e-13)
    np.testing.assert_allclose(fit.model.loglik(df["b"]), want[1], rtol=1e-13)
    ds = fit.model.to_dataset(df[order])
    assert by_station(ds.rename(series="station"), "sigma2") == {k: fitted(fit)[k] for k in order}
    # unlabelled data: by position, as the model's arrays
    np.testing.assert_array_equal(fit.model.filter(df.to_numpy()).loglik, want)


def test_fit_model_refuses_columns_it_was_not_fitted_to(data):
    df, da, fit = data
    with pytest.raises(ValueError, match=re.escape("column 'x'")) as info:
        fit.model.filter(df.rename(columns={"a": "x"}))
    assert "'a', 'b', 'c'" in str(info.value) and "to_numpy()" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("Series 'x'")):
        fit.model.loglik(df["a"].rename("x"))


def test_fit_model_matches_dataarray_coordinates_by_label(data):
    df, da, fit = data
    order = ["c", "a", "b"]
    got = fit.model.filter(da.sel(station=order)).loglik
    np.testing.assert_allclose(got, fit.model.filter(df).loglik[[2, 0, 1]], rtol=1e-13)
    with pytest.raises(ValueError, match="station='x'"):
        fit.model.filter(da.assign_coords(station=["x", "b", "c"]))


def test_labelled_parameter_series_matched_to_dataarray_coordinates(data):
    df, da, fit = data
    sigma2 = pd.Series({"b": 2.0, "c": 3.0, "a": 1.0})
    m = ks.OUModel(sigma2=sigma2, obs_var=1.0)
    rev = da.sel(station=["c", "a", "b"])
    np.testing.assert_allclose(
        m.filter(rev).loglik, ks.OUModel(sigma2=[3.0, 1.0, 2.0], obs_var=1.0).filter(rev).loglik
    )


def test_named_series_keeps_its_name():
    rng = np.random.default_rng(1)
    s = pd.Series(
        rng.normal(size=40).cumsum() + rng.normal(size=40),
        index=pd.date_range("2000", periods=40),
        name="flow",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(s)
    assert fit.series_labels == ["flow"] == ks.fit_ou(s.to_frame()).series_labels
    assert fit.to_dataset().attrs["name"] == "flow"
    assert ks.OUModel().to_dataset(s).attrs["name"] == "flow"
    assert "name" not in ks.OUModel().to_dataset(s.rename(None)).attrs
    # one series is still not named in the messages
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ks.fit_ou(s, max_iter=1)
    assert w and not any("flow" in str(x.message) for x in w)


def test_integer_column_labels_stay_integers():
    rng = np.random.default_rng(2)
    d = pd.DataFrame(
        rng.normal(size=(30, 2)).cumsum(0) + rng.normal(size=(30, 2)), columns=[10, 20]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(d)
    assert fit.series_labels == [10, 20]
    ds = fit.to_dataset()
    assert ds["series"].dtype.kind in "iu" and ds["series"].values.tolist() == [10, 20]
    assert float(ds["sigma2"].sel(series=10)) == float(fit.params["sigma2"][0])
    assert ks.OUModel().to_dataset(d)["series"].values.tolist() == [10, 20]
    # the labels match integer coordinates through the accessor
    da = ds["observed"].isel(series=[1, 0])
    assert float(da.kalman.filter(fit)["sigma2"].sel(series=10)) == float(fit.params["sigma2"][0])


def test_integer_labels_in_messages_do_not_read_as_positions():
    # column 20 is the second series: a message naming it "series 20" read as a position
    rng = np.random.default_rng(2)
    d = pd.DataFrame(rng.normal(size=(30, 2)).cumsum(0), columns=[10, 20])
    d[20] = 1.0
    with pytest.warns(UserWarning, match="series label 20 are constant"):
        ks.fit_ou(d)


def test_multiindex_columns_become_a_multiindex_coordinate(tmp_path):
    rng = np.random.default_rng(3)
    cols = pd.MultiIndex.from_tuples([("a", "x"), ("a", "y"), ("b", "x")], names=["site", "var"])
    d = pd.DataFrame(rng.normal(size=(30, 3)).cumsum(0) + rng.normal(size=(30, 3)), columns=cols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(d)
    assert fit.series_labels == [("a", "x"), ("a", "y"), ("b", "x")]
    for ds in (fit.to_dataset(), ks.OUModel().to_dataset(d)):
        assert isinstance(ds.indexes["series"], pd.MultiIndex)
        assert list(ds.indexes["series"].names) == ["site", "var"]
        assert ds["observed"].sel(site="a").shape == (30, 2)  # (the level selected drops)
        assert ds["observed"].sel(series=("b", "x")).values.tolist() == d[("b", "x")].tolist()
    # netCDF has no MultiIndex: written as its levels
    from kalmanscan.xarray import save_netcdf

    path = tmp_path / "multi.nc"
    save_netcdf(fit.to_dataset(), path, engine="scipy")
    with xr.open_dataset(path, engine="scipy") as back:
        assert back["site"].values.tolist() == ["a", "a", "b"]
    # and the fit's model goes to MultiIndex columns by label
    rev = d[[("b", "x"), ("a", "x"), ("a", "y")]]
    np.testing.assert_allclose(fit.model.loglik(rev), fit.model.loglik(d)[[2, 0, 1]], rtol=1e-13)
