"""Series ``fit_ou`` does not fit (constant; fewer than 2 observations) have no estimate: every
output an ``OUFit`` computes from the parameters (filter, smooth, disturbances, forecast,
to_dataset's filtered, smoothed and forecast variables) is NaN for them, with a warning naming
them, never numbers from their starting values. The fitted series' outputs are unchanged: they
equal the same model's outputs on that series alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks

pd = pytest.importorskip("pandas")

T = 50
NOT_FITTED = r"NaN for series 'one' \(fewer than 2 observations\) and 'flat' \(constant\)"


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(4)
    return pd.DataFrame(
        {
            "flat": np.full(T, 2.5),
            "one": np.r_[7.0, np.full(T - 1, np.nan)],
            "ok": rng.normal(size=T).cumsum() * 0.3 + rng.normal(size=T) + 2.5,
        },
        index=pd.date_range("2000-01-01", periods=T, freq="D"),
    )


@pytest.fixture(scope="module")
def fit(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(frame)


@pytest.fixture(scope="module")
def ok_model(fit):
    """The fitted model of series 'ok' alone (its estimates as scalars)."""
    return ks.OUModel(time_unit="1D", **{p: float(v[2]) for p, v in fit.params.items()})


def test_the_fit_marks_them_not_fitted(fit):
    assert fit.converged.tolist() == [False, False, True]


def test_forecast_is_nan_for_them_and_names_them(fit, frame, ok_model):
    with pytest.warns(UserWarning, match="OUFit.forecast: " + NOT_FITTED):
        fc = fit.forecast(3, coverage=0.9)
    for name in ("mean", "var", "predictive_var", "lower", "upper"):
        a = getattr(fc, name)
        assert a.shape == (3, 3) and np.isnan(a[:, :2]).all() and np.isfinite(a[:, 2]).all(), name
    ref = ok_model.forecast(frame["ok"], steps=3, coverage=0.9)
    for name in ("mean", "var", "predictive_var", "lower", "upper"):
        np.testing.assert_allclose(getattr(fc, name)[:, 2], getattr(ref, name), rtol=1e-12)
    # ks.forecast on the fit goes the same way
    with pytest.warns(UserWarning, match=NOT_FITTED):
        again = ks.forecast(fit, steps=3, coverage=0.9)
    np.testing.assert_array_equal(again.mean, fc.mean)


@pytest.mark.parametrize("method", ["filter", "smooth"])
def test_filter_and_smooth_are_nan_for_them(fit, frame, ok_model, method):
    with pytest.warns(UserWarning, match=f"OUFit.{method}: " + NOT_FITTED):
        res = getattr(fit, method)()
    ref = getattr(ok_model, method)(frame["ok"])
    flt, flt_ref = (res, ref) if method == "filter" else (res.filtered, ref.filtered)
    pairs = [(res.mean, ref.mean), (res.var, ref.var)]
    pairs += [(getattr(flt, k), getattr(flt_ref, k)) for k in ("pred_mean", "pred_var", "info")]
    for a, b in pairs:
        assert np.isnan(a[:, :2]).all()
        np.testing.assert_allclose(a[:, 2], b, rtol=1e-12)
    assert np.isnan(flt.loglik[:2]).all()
    assert float(flt.loglik[2]) == pytest.approx(float(flt_ref.loglik), rel=1e-12)
    assert np.isnan(flt.final.lam[:2]).all() and np.isnan(flt.final.eta[:2]).all()


def test_disturbances_are_nan_for_them(fit):
    with pytest.warns(UserWarning, match="OUFit.disturbances: " + NOT_FITTED):
        d = fit.disturbances()
    assert np.isnan(d.observation[:, :2]).all() and np.isnan(d.state[:, :2]).all()
    assert np.isfinite(d.state[1:, 2]).any()


def test_to_dataset_is_nan_for_them_and_keeps_the_record(fit, frame, ok_model):
    pytest.importorskip("xarray")
    from kalmanscan import xarray as kx

    with pytest.warns(UserWarning, match="OUFit.to_dataset: " + NOT_FITTED):
        ds = fit.to_dataset(forecast_steps=2)
    ref = ok_model.to_dataset(frame[["ok"]], forecast_steps=2)
    derived = [k for k in ds.data_vars if k.split("_")[0] in ("mean", "variance", "precision",
               "lower", "upper", "pred", "smoothed", "forecast", "loglik")]  # fmt: skip
    assert {"mean", "smoothed_upper", "forecast_mean", "forecast_lower", "loglik"} <= set(derived)
    for k in derived:
        a = ds[k].transpose(..., "series")
        assert np.isnan(a.values[..., :2]).all(), k
        np.testing.assert_allclose(
            a.values[..., 2], ref[k].transpose(..., "series").values[..., 0], rtol=1e-12, err_msg=k
        )
    # the data and the fit's record are kept
    np.testing.assert_array_equal(ds["observed"].values, frame.to_numpy())
    assert ds["converged"].values.tolist() == [0, 0, 1]
    assert np.isfinite(ds["theta"].values).all()
    assert ds["mean"].attrs["description"] == ref["mean"].attrs["description"]
    # the same through kalmanscan.xarray.to_dataset with the fit recorded
    with pytest.warns(UserWarning, match=NOT_FITTED):
        again = kx.to_dataset(fit.model, frame, fit=fit, forecast_steps=2)
    assert np.isnan(again["forecast_mean"].values[:, :2]).all()


def test_unlabelled_series_are_named_by_position(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(frame.to_numpy())
    with pytest.warns(UserWarning, match=r"NaN for series 1 \(fewer than 2 observations\) and 0 "):
        fc = fit.forecast(1)
    assert np.isnan(fc.mean[0, :2]).all() and np.isfinite(fc.mean[0, 2])


def test_a_fit_of_fitted_series_only_says_nothing(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(frame[["ok"]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fc = fit.forecast(2)
        fit.smooth()
    assert np.isfinite(fc.mean).all()


def test_the_accessor_filter_with_a_fit_dataset_is_nan_for_them(frame, fit):
    """``ds.kalman.fit_ou()`` keeps their starting values (converged 0); filtering or
    forecasting with that parameter Dataset gives NaN for them, in memory (with a warning
    naming them) and chunked, and the fitted series' results of the OUFit's own."""
    xr = pytest.importorskip("xarray")
    import kalmanscan.xarray  # noqa: F401

    da = xr.DataArray(frame.to_numpy(), dims=("time", "station"),
                      coords={"time": frame.index, "station": list(frame.columns)})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        params = da.kalman.fit_ou()
    assert params["converged"].values.tolist() == [0, 0, 1]
    with pytest.warns(UserWarning, match=r"NaN for series station='flat'; station='one'"):
        out = da.kalman.filter(params, forecast_steps=2)
    with pytest.warns(UserWarning, match=NOT_FITTED):
        ref = fit.to_dataset(forecast_steps=2)
    for k in ("smoothed_mean", "forecast_mean", "forecast_upper", "loglik"):
        a = out[k].transpose(..., "station").values
        assert np.isnan(a[..., :2]).all(), k
        b = ref[k].transpose(..., "series").values[..., 2]
        np.testing.assert_allclose(a[..., 2], b, rtol=1e-9, err_msg=k)
    pytest.importorskip("dask")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = da.chunk({"station": 1}).kalman.forecast(params, steps=2).compute()
    np.testing.assert_array_equal(lazy["forecast_mean"].values, out["forecast_mean"].values)
