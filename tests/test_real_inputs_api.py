"""The public Python API on inputs users hold and did not make for us: nullable pandas columns,
object arrays (Decimal, None), masked arrays, parameters carrying pandas or xarray labels,
RangeIndex and timezone-aware indexes, time-varying parameters, a local level fitted with only
theta fixed, one free parameter on its boundary, and statsmodels' data sets against statsmodels'
own state-space models where the models coincide."""

from __future__ import annotations

import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")

import kalmanscan as ks  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401
from kalmanscan.timeseries import OUModel, as_time_axis, load_nile  # noqa: E402

KW = dict(obs_var=0.1, decay=1.0, process_var=0.01)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# --- values: nullable pandas columns, objects, masked arrays --------------------------------------
def test_nullable_pandas_columns_are_numbers_with_na_missing():
    df = pd.DataFrame(
        {"a": pd.array([1, None, 3], dtype="Int64"), "b": pd.array([1.0, 2.0, None], "Float64")}
    )
    want = ks.filter(np.array([[1.0, 1.0], [np.nan, 2.0], [3.0, np.nan]]), **KW)
    got = ks.filter(df, **KW)  # was: TypeError (numpy reads the frame as objects)
    np.testing.assert_array_equal(got.mean, want.mean)
    np.testing.assert_array_equal(got.loglik, want.loglik)
    np.testing.assert_array_equal(OUModel(sigma2=0.01, obs_var=0.1).filter(df).mean, got.mean)


def test_a_dataset_of_nullable_columns_filters_as_floats_with_nan():
    idx = pd.Index([1990.0, 1990.25, 1990.5, 1990.75], name="time")
    df = pd.DataFrame(
        {"a": pd.array([1, None, 3, 4], "Int64"), "b": pd.array([1.0, 2.0, None, 5.0], "Float64")},
        index=idx,
    )
    ds = xr.Dataset.from_dataframe(df)  # keeps pandas' extension arrays
    got = ds.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=2)  # was: pandas' "Cannot
    # cast values to shared type"
    plain = xr.Dataset.from_dataframe(df.astype("float64"))
    want = plain.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_steps=2)
    np.testing.assert_array_equal(got["mean"].values, want["mean"].values)
    np.testing.assert_array_equal(got["forecast_time"].values, [1991.0, 1991.25])


@pytest.mark.parametrize(
    "z",
    [
        [1.0, None, 3.0],
        np.array([Decimal("1.0"), None, Decimal("3")], dtype=object),
        np.array([Fraction(1), None, 3], dtype=object),
    ],
    ids=["list-None", "Decimal-None", "Fraction-None"],
)
def test_an_object_array_of_numbers_is_refused_saying_how_to_convert_it(z):
    hint = r"an array of Python objects; convert it with np.asarray\(z, dtype=float\)"
    for fn in (lambda: ks.filter(z, **KW), lambda: OUModel().filter(z)):
        with pytest.raises(TypeError, match=r"z: expected a real number .*" + hint):
            fn()  # was: only "got numpy.ndarray(dtype=object, shape=(3,))"
    want = ks.filter(np.array([1.0, np.nan, 3.0]), **KW)
    np.testing.assert_array_equal(ks.filter(np.asarray(z, dtype=float), **KW).mean, want.mean)


def test_an_object_that_is_no_number_is_named_with_its_index():
    with pytest.raises(TypeError, match=r"z: expected .*element at index \(1,\) is str '2'"):
        ks.filter(np.array([1.0, "2", None], dtype=object), **KW)
    with pytest.raises(TypeError, match=r"obs_var: expected .*element at index \(1,\) is dict"):
        ks.filter(np.ones(2), obs_var=[0.1, {}], decay=1.0, process_var=0.1)


def test_a_masked_observation_is_never_drawn_at_its_fill_value():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from kalmanscan.plot import plot_bands

    obs = np.ma.masked_array([1.0, -999.0, 2.0], mask=[0, 1, 0])
    ax = plot_bands(np.arange(3.0), np.full(3, 1.5), np.full(3, 0.1), observed=obs)
    lo, hi = ax.get_ylim()
    assert lo > -10, (lo, hi)  # was: the axis reached down to -999
    data = [ln for ln in ax.get_lines() if ln.get_label() == "data"][0]
    np.testing.assert_array_equal(data.get_ydata(), [1.0, np.nan, 2.0])


def test_plot_bands_takes_periods_and_checks_coverages_and_shapes():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from kalmanscan.plot import plot_bands

    periods = pd.period_range("2020Q1", periods=3, freq="Q")
    plot_bands(periods, np.zeros(3), np.ones(3))  # was: TypeError from QuarterEnd / int
    with pytest.raises(ValueError, match=r"coverages: expected probabilities .* got 95"):
        plot_bands(np.arange(3.0), np.zeros(3), np.ones(3), coverages=95)  # was: no band
    with pytest.raises(ValueError, match=r"observed: expected the shape of times \(3,\), got"):
        plot_bands(np.arange(3.0), np.zeros(3), np.ones(3), observed=[1.0, 2.0])
    with pytest.raises(ValueError, match="forecast_times, forecast_mean, forecast_var"):
        plot_bands(
            np.arange(3.0),
            np.zeros(3),
            np.ones(3),
            forecast_times=[3.0, 4.0],
            forecast_mean=[0.0],
            forecast_var=[1.0, 2.0],
        )


# --- parameters with labels ---------------------------------------------------------------------
@pytest.fixture
def frame():
    idx = pd.date_range("2024-01-01", periods=5, freq="D")
    z = np.array([[1.0, 10.0], [2.0, 21.0], [np.nan, 29.0], [3.5, 42.0], [4.0, 50.0]])
    return pd.DataFrame(z, index=idx, columns=["a", "b"])


def test_a_series_parameter_of_a_series_is_matched_by_its_dates(frame):
    z = frame["a"]
    ov = pd.Series([0.1, 0.1, 1.0, 10.0, 0.1], index=z.index)
    want = ks.filter(z.to_numpy(), obs_var=ov.to_numpy(), decay=1.0, process_var=1.0)
    shuffled = ov.iloc[[4, 2, 0, 3, 1]]
    got = ks.filter(z, obs_var=shuffled, decay=1.0, process_var=1.0)  # was: by position
    np.testing.assert_array_equal(got.mean, want.mean)
    m = OUModel(sigma2=1.0, obs_var=shuffled).filter(z)
    np.testing.assert_array_equal(m.mean, OUModel(sigma2=1.0, obs_var=ov.to_numpy()).filter(z).mean)


def test_a_series_parameter_of_a_frame_goes_to_its_columns_or_its_rows(frame):
    per_column = pd.Series({"b": 100.0, "a": 1.0})
    want = ks.filter(frame.to_numpy(), obs_var=1.0, decay=1.0, process_var=np.array([1.0, 100.0]))
    got = ks.filter(frame, obs_var=1.0, decay=1.0, process_var=per_column)  # was: swapped
    np.testing.assert_array_equal(got.var, want.var)
    got = OUModel(sigma2=per_column, obs_var=1.0).filter(frame)
    want = OUModel(sigma2=np.array([1.0, 100.0]), obs_var=1.0).filter(frame)
    np.testing.assert_array_equal(got.var, want.var)
    per_row = pd.Series([5.0, 0.1, 0.1, 0.1, 0.1], index=frame.index[::-1])  # time-varying
    want = ks.filter(
        frame.to_numpy(), obs_var=per_row.to_numpy()[::-1, None], decay=1.0, process_var=1.0
    )
    got = ks.filter(frame, obs_var=per_row, decay=1.0, process_var=1.0)  # was: shape error
    np.testing.assert_array_equal(got.mean, want.mean)


def test_labels_a_parameter_lacks_are_refused_naming_them(frame):
    with pytest.raises(
        ValueError,
        match=r"obs_var: expected a Series whose index holds z's "
        r"columns \['a', 'b'\] or z's index",
    ):
        ks.filter(frame, obs_var=pd.Series({"a": 1.0, "c": 2.0}), decay=1.0, process_var=1.0)
    with pytest.raises(ValueError, match=r"sigma2: expected a Series whose index holds"):
        OUModel(sigma2=pd.Series({"a": 1.0, "c": 2.0})).filter(frame)
    # a Series with the default index 0, 1, ... names nothing: used by position, as before
    got = ks.filter(frame, obs_var=pd.Series([1.0, 2.0]), decay=1.0, process_var=1.0)
    want = ks.filter(frame, obs_var=np.array([1.0, 2.0]), decay=1.0, process_var=1.0)
    np.testing.assert_array_equal(got.mean, want.mean)


def test_fixed_and_starting_values_of_a_fit_go_to_their_columns(frame):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=60), "b": 100 * rng.normal(size=60)})
    fix = {"theta": 0.0, "mu": 0.0, "obs_var": pd.Series({"b": 1e4, "a": 1.0})}
    fit = _quiet(ks.fit_ou, df, fix=fix)
    np.testing.assert_array_equal(fit.params["obs_var"], [1.0, 1e4])  # was: [1e4, 1.0]
    want = _quiet(ks.fit_ou, df.to_numpy(), fix={**fix, "obs_var": np.array([1.0, 1e4])})
    np.testing.assert_allclose(fit.params["sigma2"], want.params["sigma2"], rtol=1e-12)
    robust = _quiet(ks.fit_ou, df, fix=fix, robust=True)  # later rounds see numpy data
    np.testing.assert_array_equal(robust.params["obs_var"], [1.0, 1e4])


def test_dataarray_parameters_are_matched_by_dims_and_coordinates():
    z = np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 2.0], [2.0, 3.5, 2.5], [2.5, 3.0, 3.5]])
    da = xr.DataArray(
        z,
        dims=("time", "station"),
        coords={"time": [0.0, 1.0, 2.0, 3.0], "station": ["x", "y", "w"]},
    )
    ov = xr.DataArray([0.1, 1.0, 10.0], dims="station", coords={"station": ["w", "y", "x"]})
    want = ks.filter(z, obs_var=np.array([10.0, 1.0, 0.1]), decay=1.0, process_var=1.0)
    np.testing.assert_array_equal(
        ks.filter(da, obs_var=ov, decay=1.0, process_var=1.0).var, want.var
    )
    # (the model's filter runs its own arithmetic, the same to rounding: a permutation of the
    # stations would be off by O(1))
    np.testing.assert_allclose(OUModel(sigma2=1.0, obs_var=ov).filter(da).var, want.var, rtol=1e-13)
    tv = xr.DataArray([5.0, 1.0, 0.2, 1.0], dims="time", coords={"time": [3.0, 2.0, 1.0, 0.0]})
    want = ks.filter(z, obs_var=np.array([[1.0], [0.2], [1.0], [5.0]]), decay=1.0, process_var=1.0)
    # was: [4] broadcast against the 3 stations, a shape error (or per station when square)
    np.testing.assert_array_equal(
        ks.filter(da, obs_var=tv, decay=1.0, process_var=1.0).mean, want.mean
    )
    np.testing.assert_allclose(
        OUModel(sigma2=1.0, obs_var=tv).filter(da.T, axis=1).mean, want.mean.T, rtol=1e-13
    )


def test_the_accessor_matches_a_pandas_series_by_label():
    da = xr.DataArray(
        np.arange(12.0).reshape(4, 3), dims=("time", "station"), coords={"station": ["x", "y", "z"]}
    )
    ps = pd.Series({"z": 0.1, "y": 1.0, "x": 10.0})
    np.testing.assert_array_equal(
        da.kalman.filter(sigma2=1.0, obs_var=ps)["obs_var"].values, [10.0, 1.0, 0.1]
    )  # was: [0.1, 1.0, 10.0]
    np.testing.assert_array_equal(
        da.kalman.filter(OUModel(sigma2=1.0, obs_var=ps))["obs_var"].values, [10.0, 1.0, 0.1]
    )
    fit = _quiet(da.kalman.fit_ou, fix={"theta": 0.0, "mu": 0.0, "obs_var": ps})
    np.testing.assert_array_equal(fit["obs_var"].values, [10.0, 1.0, 0.1])
    with pytest.raises(
        ValueError,
        match=r"obs_var: expected a Series whose index holds the "
        r"labels of one of the data's dims",
    ):
        da.kalman.filter(sigma2=1.0, obs_var=pd.Series({"q": 1.0, "y": 1.0, "x": 1.0}))


# --- time axes ----------------------------------------------------------------------------------
def test_a_range_index_is_the_times_it_holds():
    z = np.array([1.0, 1.4, 0.9, 1.6, 1.2])
    m = OUModel(theta=0.3, sigma2=0.5, obs_var=0.2)
    s = pd.Series(z, index=pd.RangeIndex(10, 20, 2))  # e.g. every other row of a longer frame
    want = m.forecast(z, np.array([10.0, 12.0, 14.0, 16.0, 18.0]), steps=2)
    got = m.forecast(s, steps=2)  # was: times 0, 1, ..., forecast at 5, 6
    np.testing.assert_array_equal(got.times, [20.0, 22.0])
    np.testing.assert_array_equal(got.var, want.var)
    assert m.loglik(s) == m.loglik(z, np.arange(10.0, 20.0, 2.0))
    default = pd.Series(z)  # the default 0, 1, ... is the default times
    assert m.loglik(default) == m.loglik(z)


def test_monthly_data_in_a_timezone_forecast_on_its_local_month_starts():
    idx = pd.date_range("2024-01-01", periods=12, freq="MS", tz="Europe/Paris")
    s = pd.Series(np.linspace(0.0, 1.0, 12), index=idx)
    fc = OUModel(sigma2=0.1, obs_var=0.1).forecast(s, steps=4)
    local = fc.times  # (a DatetimeIndex in the record's zone)
    assert str(local.tz) == "Europe/Paris"
    # was: 2024-12-31 23:00, 2025-01-31 22:00, 2025-03-03 21:00 ... local (30.4-day steps)
    assert [str(t) for t in local] == [
        "2025-01-01 00:00:00+01:00",
        "2025-02-01 00:00:00+01:00",
        "2025-03-01 00:00:00+01:00",
        "2025-04-01 00:00:00+02:00",
    ]
    ax = as_time_axis(idx, 12)
    assert ax.calendar_step() == 1 and ax.utc and str(ax.tz) == "Europe/Paris"


def test_daily_data_in_a_timezone_stay_at_local_midnight_and_hours_stay_hours():
    days = pd.date_range("2024-03-20", periods=10, freq="D", tz="Europe/Paris")
    fc = OUModel(sigma2=0.1, obs_var=0.1).forecast(pd.Series(np.ones(10), index=days), steps=3)
    local = fc.times
    assert str(local.tz) == "Europe/Paris"
    assert all(t.hour == 0 for t in local), local  # across the change to summer time
    hours = pd.date_range("2024-03-31 00:00", periods=6, freq="h", tz="Europe/Paris")
    fc = OUModel(sigma2=0.1, obs_var=0.1).forecast(pd.Series(np.ones(6), index=hours), steps=2)
    utc = fc.times.tz_convert("UTC").tz_localize(None).values
    step = np.diff(np.r_[as_time_axis(hours, 6).labels[-1:], utc])
    assert (step == np.timedelta64(1, "h")).all()  # physical hours, not the local clock's


def test_times_that_are_no_timestamps_are_named():
    z = np.ones(3)
    with pytest.raises(
        TypeError,
        match=r"times: .*durations \(timedelta64\[h\]\); give them as "
        r"numbers",
    ):
        OUModel().filter(z, np.array([0, 1, 2], dtype="timedelta64[h]"))
    mi = pd.MultiIndex.from_tuples([("A", 1), ("A", 2), ("B", 1)], names=["firm", "year"])
    with pytest.raises(
        TypeError,
        match=r"times: .*a pandas MultiIndex with levels \['firm', "
        r"'year'\]",
    ):
        OUModel().filter(pd.Series(z, index=mi))
    t = np.array([Decimal("1990.0"), Decimal("1990.25"), Decimal("1990.5")], dtype=object)
    np.testing.assert_array_equal(as_time_axis(t, 3).t, [0.0, 0.25, 0.5])  # was: parsed as text


# --- model parameters -----------------------------------------------------------------------------
def test_parameters_per_step_filter_and_a_forecast_asks_for_values_per_series():
    z = np.array([1.0, 2.0, np.nan, 1.5, 2.5])
    theta = np.array([0.5, 0.5, 0.2, 0.2, 0.2])
    sigma2 = np.array([1.0, 1.0, 1.0, 5.0, 5.0])
    mu = np.array([1.0, 1.0, 1.0, 2.0, 2.0])
    m = OUModel(theta=theta, sigma2=sigma2, mu=mu, obs_var=0.3)
    a, p = ks.discretize_ou(theta, sigma2, np.r_[0.0, np.ones(4)])
    want = ks.filter(
        z,
        obs_var=0.3,
        decay=a,
        process_var=p,
        offset=mu * (1 - a),
        prior_mean=1.0,
        prior_var=1.0,
        backend="sequential",
    )
    got = m.filter(z)  # was: "prior_var: expected a shape that broadcasts to the lane shape"
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-14)
    np.testing.assert_allclose(got.loglik, want.loglik, rtol=1e-14)
    with pytest.raises(
        ValueError,
        match=r"theta: the model gives values per step of the record \(shape \(5,\)\).*"
        r"future_params=\{'theta': \.\.\.\}",
    ):
        m.forecast(z, steps=2)  # was: a bare numpy broadcasting error
    fc = m.forecast(z, steps=2, future_params={"theta": 0.2, "sigma2": 5.0, "mu": 2.0})
    # the filter over the record with rows at the forecast times, the values there as given
    ext = OUModel(
        theta=np.r_[theta, 0.2, 0.2], sigma2=np.r_[sigma2, 5.0, 5.0], mu=np.r_[mu, 2.0, 2.0],
        obs_var=0.3,
    ).filter(np.r_[z, np.nan, np.nan])  # fmt: skip
    np.testing.assert_allclose(fc.mean, ext.mean[-2:], rtol=1e-14)
    np.testing.assert_allclose(fc.var, ext.var[-2:], rtol=1e-14)


def test_a_prior_known_exactly_is_a_valid_model():
    z = np.array([1.0, 2.0, 1.5])
    got = OUModel(sigma2=1.0, obs_var=1.0, prior_mean=0.5, prior_var=0.0).filter(z)
    a, p = ks.discretize_ou(0.0, 1.0, np.array([0.0, 1.0, 1.0]))
    want = ks.filter(
        z, obs_var=1.0, decay=a, process_var=p, prior_mean=0.5, prior_var=0.0, backend="sequential"
    )
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-14)
    with pytest.raises(ValueError, match=r"prior_var: expected values >= 0.0 \(inf allowed\), got"):
        OUModel(prior_var=-1.0)  # was: "values > 0.0 and finite" though inf is allowed


# --- fitting --------------------------------------------------------------------------------------
def test_a_local_level_fitted_with_only_theta_fixed_has_standard_errors():
    years, flow = load_nile()
    both = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0})  # mu free: it does not enter
    for p in ("sigma2", "obs_var"):  # was: NaN, "the Hessian is not positive definite"
        np.testing.assert_allclose(fit.params[p], both.params[p], rtol=1e-7)
        np.testing.assert_allclose(fit.stderr[p], both.stderr[p], rtol=1e-4)
    assert np.isnan(fit.stderr["mu"])
    assert any("mu is not estimated" in n for n in fit.notes)
    assert not any("not positive definite" in n for n in fit.notes)


def test_a_single_free_parameter_on_its_bound_gets_its_profile_bound():
    z = np.random.default_rng(0).normal(size=100)
    fit = _quiet(ks.fit_ou, z, fix={"theta": 0.0, "mu": 0.0, "obs_var": 1.0})
    assert fit.at_boundary["sigma2"]
    b = fit.upper_bound["sigma2"]  # was: ValueError "need at least one array to stack"
    l0 = ks.loglik(z, obs_var=1.0, decay=1.0, process_var=0.0, backend="sequential")
    lb = ks.loglik(z, obs_var=1.0, decay=1.0, process_var=b, backend="sequential")
    assert abs((l0 - lb) - 1.3528) < 2e-3
    assert "<0.0169" in fit.summary()


# --- statsmodels' data against statsmodels' models ------------------------------------------------
@pytest.mark.parametrize("name", ["infl", "sunspots"])
def test_ou_with_noise_equals_sarimax_ar1_with_measurement_error(name):
    sm = pytest.importorskip("statsmodels.api")
    if name == "infl":
        y = sm.datasets.macrodata.load_pandas().data["infl"].to_numpy()
    else:
        y = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy()
    fit = _quiet(ks.fit_ou, y)
    p = fit.params
    phi = np.exp(-p["theta"])
    q = p["sigma2"] * (1 - phi**2) / (2 * p["theta"])
    mod = sm.tsa.SARIMAX(y, order=(1, 0, 0), trend="c", measurement_error=True)
    params = [p["mu"] * (1 - phi), phi, p["obs_var"], q]
    # the same model on a unit grid with the stationary prior: the same likelihood ...
    np.testing.assert_allclose(mod.loglike(params), fit.loglik, rtol=1e-12)
    # ... statsmodels finds no higher one ...
    best = _quiet(mod.fit, disp=False, maxiter=2000)
    assert best.llf <= fit.loglik + 1e-6
    # ... and the same forecasts
    fc = fit.forecast(4)
    sfc = mod.smooth(params).get_forecast(4)
    np.testing.assert_allclose(fc.mean, sfc.predicted_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.predictive_var, sfc.var_pred_mean, rtol=1e-10)


def test_given_parameters_with_a_value_beyond_the_variances_say_what_float64_cannot_hold():
    """A 1e300 in the Nile with obs_var 15,099: scaled by the data's unit (~2^997) obs_var fell
    to 0 and the error blamed it ("obs_var: expected values > 0 ..., got 0.0"), though the user
    gave 15,099. Such a series is filtered in its own units, where the filter says what float64
    cannot hold, as ks.filter does; the clean series beside it keeps its scaled result."""
    import statsmodels.api as sm

    from kalmanscan.timeseries import OUModel

    nile = sm.datasets.nile.load_pandas().data["volume"].to_numpy(float).copy()
    bad = nile.copy()
    bad[20] = 1e300
    model = OUModel(theta=0.0, sigma2=1469.0, obs_var=15099.0)
    with pytest.raises(OverflowError, match="not representable in torch.float64"):
        ks.filter(bad, obs_var=15099.0, decay=1.0, process_var=1469.0)
    with pytest.raises(OverflowError, match="not representable in torch.float64.*set to NaN"):
        model.filter(bad)
    ref = ks.filter(nile, obs_var=15099.0, decay=1.0, process_var=1469.0)
    got = model.filter(np.stack([nile, nile * 1e-3], 1))
    np.testing.assert_allclose(got.mean[:, 0], ref.mean, rtol=1e-13)
    np.testing.assert_allclose(got.var[:, 0], ref.var, rtol=1e-13)
