"""polars data and times read as their pandas equivalents: numeric columns as series (``null`` =
missing), a DataFrame's columns as series labels, timezone-aware times marked UTC as pandas'
are; a column of dates among the data is refused naming it (numpy's own reading of a polars
DataFrame turns a ``Date`` column into day numbers, which were read as data)."""

import warnings

import numpy as np
import pytest

import kalmanscan as ks

pl = pytest.importorskip("polars")
pd = pytest.importorskip("pandas")

RNG = np.random.default_rng(7)
Z = np.cumsum(RNG.normal(size=60)) + 0.5 * RNG.normal(size=60)


def _days(n=60):
    keep = np.sort(RNG.choice(120, size=n, replace=False))
    start = np.datetime64("2021-01-01")
    return (start + keep.astype("timedelta64[D]")).astype("datetime64[ms]")


def _pandas_zoned(times, zone):
    """The pandas index of polars' zoned times, built from their UTC values (polars'
    ``to_pandas`` needs pyarrow, which the test extra does not install)."""
    utc = pd.DatetimeIndex(times.dt.convert_time_zone("UTC").dt.replace_time_zone(None).to_numpy())
    return utc.tz_localize("UTC").tz_convert(zone)


def _fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (boundary notes: the same for both inputs)
        return ks.fit_ou(*args, **kwargs)


def test_frame_with_a_date_column_is_refused_naming_it():
    df = pl.DataFrame({"day": _days(), "y": Z})
    for call in (lambda: ks.fit_ou(df), lambda: ks.filter(df, 1.0, 1.0, 1.0)):
        with pytest.raises(TypeError, match=r"column 'day' of dtype Date.*times=df\['day'\]"):
            call()
    with pytest.raises(TypeError, match=r"column 'day' of dtype datetime64.*set_index\('day'\)"):
        ks.fit_ou(pd.DataFrame({"day": _days(), "y": Z}))


def test_frame_fit_equals_pandas_with_labels_and_times():
    days = _days()
    df = pl.DataFrame({"day": days, "a": Z, "b": 2.0 * Z[::-1]})
    got = _fit(df.drop("day"), times=df["day"])
    want = _fit(pd.DataFrame({"a": Z, "b": 2.0 * Z[::-1]}, index=pd.DatetimeIndex(days)))
    for name in ("theta", "sigma2", "mu", "obs_var"):
        np.testing.assert_allclose(getattr(got.model, name), getattr(want.model, name), rtol=1e-12)
    np.testing.assert_allclose(got.loglik, want.loglik, rtol=1e-12)
    ds = got.to_dataset()
    assert [str(s) for s in ds["series"].values] == ["a", "b"]
    np.testing.assert_array_equal(ds["time"].values, days.astype("datetime64[us]"))


def test_nulls_are_missing_and_float32_stays_float32():
    y = pl.Series("y", Z.tolist(), dtype=pl.Float64)
    y[5] = None
    ref = Z.copy()
    ref[5] = np.nan
    got = ks.filter(y, obs_var=0.3, decay=0.9, process_var=1.0)
    want = ks.filter(ref, obs_var=0.3, decay=0.9, process_var=1.0)
    np.testing.assert_array_equal(got.mean, want.mean)
    assert got.loglik == want.loglik
    ints = pl.Series([1, None, 3, 4], dtype=pl.Int32)
    want_ints = ks.filter(np.array([1, np.nan, 3, 4]), 1.0, 1.0, 1.0).mean
    np.testing.assert_array_equal(ks.filter(ints, 1.0, 1.0, 1.0).mean, want_ints)
    nulls = pl.DataFrame({"a": Z[:4], "b": [None] * 4})  # (dtype Null: a series never observed)
    np.testing.assert_array_equal(
        ks.filter(nulls, 1.0, 1.0, 1.0).mean[:, 0], ks.filter(Z[:4], 1.0, 1.0, 1.0).mean
    )
    f32 = pl.DataFrame({"a": Z[:10]}, schema={"a": pl.Float32})
    assert ks.filter(f32, 1.0, 1.0, 1.0).mean.dtype == np.float32


def test_lazy_frames_are_refused_saying_how_to_run_them():
    with pytest.raises(TypeError, match=r"polars LazyFrame .*\.collect\(\)"):
        ks.filter(pl.LazyFrame({"a": [1.0, 2.0]}), 1.0, 1.0, 1.0)


def test_booleans_and_text_are_refused():
    cases = {"b": ([True, False], "Boolean"), "s": (["1", "2"], "String")}
    for name, (values, kind) in cases.items():
        with pytest.raises(TypeError, match=f"column '{name}' of dtype {kind}"):
            ks.filter(pl.Series(name, values), 1.0, 1.0, 1.0)


def test_zoned_times_are_marked_utc_as_pandas():
    utc = pl.datetime_range(
        pl.datetime(2024, 3, 30), pl.datetime(2024, 4, 1, 11), "1h", eager=True, time_zone="UTC"
    )
    berlin = utc.dt.convert_time_zone("Europe/Berlin")
    got = _fit(pl.Series(Z), times=berlin)
    want = _fit(pd.Series(Z, index=_pandas_zoned(utc, "Europe/Berlin")))
    assert got.model.theta == pytest.approx(want.model.theta, rel=1e-12)
    ds = got.to_dataset()
    assert ds["time"].attrs.get("time_zone") == "UTC"
    np.testing.assert_array_equal(ds["time"].values, want.to_dataset()["time"].values)


def test_zoned_monthly_forecast_steps_on_the_local_calendar():
    months = pl.datetime_range(
        pl.datetime(2024, 1, 1),
        pl.datetime(2024, 12, 1),
        "1mo",
        eager=True,
        time_zone="Europe/Berlin",
    )
    z = np.arange(12.0) + RNG.normal(size=12)
    got = ks.forecast(_fit(pl.Series(z), times=months), steps=2).times
    as_pandas = pd.Series(z, index=_pandas_zoned(months, "Europe/Berlin"))
    want = ks.forecast(_fit(as_pandas), steps=2).times
    np.testing.assert_array_equal(got, want)
    # midnight in Berlin on the first of January and February 2025, in Berlin's zone
    assert got.tolist() == [
        pd.Timestamp("2025-01-01", tz="Europe/Berlin"),
        pd.Timestamp("2025-02-01", tz="Europe/Berlin"),
    ]
