"""Issue 22, timestamps as users have them: any span (item 1), day-first and ambiguous dates
(item 2), dates outside 1677-2262 and tz-aware times (item 12), duplicate times, and the property
that any CSV the CLI accepts round-trips through results.csv in sorted unique time order."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.testing import assert_close, tolerance  # noqa: E402
from kalmanscan.timeseries import OUModel, as_time_axis  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402
from kalmanscan.timeseries.times import TimeParseError, elapsed, parse_datetime_strings  # noqa: E402

GIVEN = ["--sigma2", "1", "--obs-var", "1", "--quiet"]


def _csv(tmp_path, text, name="in.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _results(out):
    return pd.read_csv(out / "results.csv")


# --- item 1: any span -----------------------------------------------------------------------------
def _annual(first, last):
    return [f"{y:04d}-07-01" for y in range(first, last + 1)]


@pytest.mark.parametrize("first,last", [(1700, 2008), (1, 9999), (1600, 1700), (2200, 2400)])
def test_any_span_of_dates_gives_exact_day_counts(first, last):
    stamps = _annual(first, last)
    ax = as_time_axis(stamps, len(stamps))
    days = (np.array(stamps, dtype="datetime64[D]") - np.datetime64(stamps[0], "D")).astype(
        np.int64
    )
    # float64 days from the first stamp: within one rounding of the exact integer day count
    ulps = tolerance("identical", "float64")
    assert (np.abs(ax.t - days) <= ulps * np.maximum(days, 1)).all()
    assert (np.diff(ax.t) > 0).all()


def test_sunspots_1700_2008_filters_and_fits_through_the_cli(tmp_path, capsys):
    rng = np.random.default_rng(0)
    stamps = _annual(1700, 2008)
    level = np.cumsum(rng.normal(size=len(stamps))) * 5 + 80
    z = level + rng.normal(size=len(stamps)) * 3
    path = _csv(
        tmp_path, "date,spots\n" + "".join(f"{d},{v:.4f}\n" for d, v in zip(stamps, z, strict=True))
    )
    out = tmp_path / "o"
    args = [path, "--time-col", "date", "--fit", "--fix", "theta=0", "--fix", "mu=0"]
    rc = filter_main([*args, "--time-unit", "365.25D", "--forecast", "2", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    table = _results(out)
    data = table[table["kind"] == "data"]
    assert len(data) == len(stamps)
    assert data["time"].iloc[0].startswith("1700-07-01")
    assert data["time"].iloc[-1].startswith("2008-07-01")
    fc = table[table["kind"] == "forecast"]["time"].tolist()
    assert fc[0].startswith("2009-07") and fc[1].startswith("2010-07")


def test_numeric_times_of_any_size():
    t = np.array([-1e300, 0.0, 1e300])
    ax = as_time_axis(t, 3)
    assert ax.t.tolist() == [0.0, 1e300, 2e300]
    with pytest.raises(ValueError, match="span is finite in float64"):
        as_time_axis(np.array([-1e308, 1e308]), 2)


def test_elapsed_is_one_rounding_of_the_exact_span():
    a = np.array(["0001-01-01T00:00:00.000001", "9999-12-31T23:59:59.999999"], "datetime64[us]")
    got = elapsed(a, a[0], np.timedelta64(1, "s"))
    exact = (a[1] - a[0]).astype(np.int64)  # microseconds, fits int64
    assert abs(got[1] - exact / 1e6) <= 1e-16 * 2 * exact / 1e6


# --- item 2: day-first and ambiguous dates --------------------------------------------------------
def _weekly(fmt, n=60, start=dt.date(1958, 3, 29)):
    return [(start + dt.timedelta(days=7 * i)).strftime(fmt) for i in range(n)]


def test_day_first_dates_read_with_one_format_in_order():
    stamps = _weekly("%d/%m/%Y")  # 29/03/1958 ...: only day-first reads every one
    ax = as_time_axis(stamps, len(stamps))
    assert (np.diff(ax.t) == 7).all()
    assert str(ax.labels[0]).startswith("1958-03-29")


def test_ambiguous_dates_are_refused_naming_both_readings():
    stamps = _weekly("%d/%m/%Y", n=2, start=dt.date(1958, 4, 3))  # 03/04/1958, 10/04/1958
    with pytest.raises(TimeParseError, match="ambiguous dates: '03/04/1958'") as err:
        parse_datetime_strings(stamps)
    assert "%d/%m/%Y" in str(err.value) and "%m/%d/%Y" in str(err.value)
    assert "time_format" in str(err.value) and "dayfirst" in str(err.value)
    got = parse_datetime_strings(stamps, dayfirst=True)
    assert str(got[0]).startswith("1958-04-03")
    got = parse_datetime_strings(stamps, time_format="%m/%d/%Y")
    assert str(got[0]).startswith("1958-03-04")


def test_cli_day_first_dates_fit_like_iso_dates(tmp_path, capsys):
    rng = np.random.default_rng(1)
    z = 315 + np.cumsum(rng.normal(size=60)) * 0.1
    fits = {}
    for fmt in ("%d/%m/%Y", "%Y-%m-%d"):
        stamps = _weekly(fmt)
        path = _csv(
            tmp_path,
            "date,co2\n" + "".join(f"{d},{v:.5f}\n" for d, v in zip(stamps, z, strict=True)),
            name=fmt.replace("/", "_").replace("%", "") + ".csv",
        )
        out = tmp_path / fmt.replace("/", "_").replace("%", "")
        rc = filter_main([path, "--time-col", "date", "--fit", "--quiet", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        fits[fmt] = _results(out)
    a, b = fits.values()
    np.testing.assert_allclose(
        a["smoothed_mean"], b["smoothed_mean"], rtol=tolerance("csv", "float64")
    )
    np.testing.assert_allclose(a["observed"], z)  # input order kept: nothing reordered


def test_cli_refuses_ambiguous_dates_with_exit_2_and_accepts_dayfirst(tmp_path, capsys):
    stamps = [f"02/{m:02d}/1958" for m in range(1, 6)]  # 2 Jan, 2 Feb, ... or 1 Feb, 2 Feb, ...
    text = "date,y\n" + "".join(f"{d},{i}\n" for i, d in enumerate(stamps))
    path = _csv(tmp_path, text)
    rc = filter_main([path, "--time-col", "date", *GIVEN, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "ambiguous dates" in err and "row 2" in err and "--dayfirst" in err
    rc = filter_main(
        [path, "--time-col", "date", "--dayfirst", *GIVEN, "--out", str(tmp_path / "o")]
    )
    assert rc == 0, capsys.readouterr().err
    times = _results(tmp_path / "o")["time"].tolist()
    assert times[0].startswith("1958-01-02") and times[1].startswith("1958-02-02")
    rc = filter_main(
        [
            path,
            "--time-col",
            "date",
            "--time-format",
            "%d/%m/%Y",
            *GIVEN,
            "--out",
            str(tmp_path / "p"),
        ]
    )
    assert rc == 0


def test_a_value_that_breaks_the_detected_format_is_named(tmp_path, capsys):
    text = "date,y\n29/03/1958,1\n05/04/1958,2\n1958-04-12,3\n"
    rc = filter_main(
        [_csv(tmp_path, text), "--time-col", "date", *GIVEN, "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "row 4: cannot parse '1958-04-12' as a time" in err


# --- item 12: dates outside 1677-2262, tz-aware times ---------------------------------------------
def test_dates_outside_the_nanosecond_window_do_not_wrap(tmp_path, capsys):
    stamps = ["1600-01-01", "1650-06-01", "2250-01-01", "2300-01-01"]
    text = "date,y\n" + "".join(f"{d},{i}\n" for i, d in enumerate(stamps))
    out = tmp_path / "o"
    rc = filter_main(
        [
            _csv(tmp_path, text),
            "--time-col",
            "date",
            *GIVEN,
            "--forecast",
            "2",
            "--time-unit",
            "365D",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    table = _results(out)
    times = table["time"].tolist()
    assert [t[:10] for t in times[:4]] == stamps
    assert times[4] > "2300" and times[5] > times[4]  # forecasts past 2262 stay in order
    import xarray as xr

    # xarray decodes to nanoseconds unless told otherwise (docs/cli.md says how)
    ds = xr.load_dataset(out / "results.nc", decode_times=xr.coders.CFDatetimeCoder(time_unit="s"))
    assert str(ds["time"].values[0]).startswith("1600-01-01")
    assert str(ds["forecast_time"].values[-1]) > "2300"


def test_forecast_past_2262_from_nanosecond_labels_keeps_order():
    labels = np.array(["2261-01-01", "2262-01-01"], dtype="datetime64[ns]")
    m = OUModel(sigma2=1.0, obs_var=1.0)
    fc = m.forecast(np.array([1.0, 2.0]), labels, steps=3)
    # yearly dates step by calendar years (not 365 days: 2264 is a leap year)
    expected = np.array(["2263-01-01", "2264-01-01", "2265-01-01"], dtype="datetime64[D]")
    np.testing.assert_array_equal(fc.times.astype("datetime64[D]"), expected)
    assert str(fc.times[-1]).startswith("2265-01-01")  # not 1678 (int64 nanoseconds wrap)
    days = np.array(["2261-12-30", "2262-01-01"], dtype="datetime64[ns]")  # two days apart
    fc = m.forecast(np.array([1.0, 2.0]), days, steps=200)
    assert str(fc.times[-1]).startswith("2263-02-")  # day steps past 2262, in order
    assert (np.diff(fc.times) > np.timedelta64(0, "s")).all()


def test_tz_aware_pandas_series_converts_its_values_not_its_index():
    idx = pd.date_range("2024-03-30", periods=4, freq="D", tz="Europe/Paris")
    s = pd.Series(idx, index=[10, 20, 30, 40])
    ax = as_time_axis(s, 4)
    assert str(ax.labels[0]).startswith("2024-03-29T23:00")
    # across the change to summer time the UTC steps are 1, 1 - 1/24, 1 days
    np.testing.assert_allclose(np.diff(ax.t), [1.0, 23 / 24, 1.0])
    ax2 = as_time_axis(pd.DatetimeIndex(idx), 4)
    np.testing.assert_array_equal(ax.t, ax2.t)


def test_times_converted_to_utc_are_marked_in_the_results_dataset():
    """A timezone (pandas) or UTC offsets (strings, datetimes with tzinfo) are applied, and the
    Dataset's time coordinates say ``time_zone = "UTC"``; naive times are left unmarked."""
    idx = pd.date_range("2024-03-30", periods=6, freq="12h", tz="Europe/Berlin")
    z = np.sin(np.arange(6.0))
    m = OUModel(theta=0.1, sigma2=1.0, obs_var=1.0, time_unit="1D")
    for times in (idx, pd.Series(idx), list(idx.strftime("%Y-%m-%dT%H:%M:%S%z")),
                  list(idx.to_pydatetime())):  # fmt: skip
        ax = as_time_axis(times, 6)
        assert ax.utc and str(ax.labels[0]).startswith("2024-03-29T23:00")
        ds = m.to_dataset(z, times, forecast_steps=2)
        assert ds["time"].attrs["time_zone"] == "UTC"
        assert ds["forecast_time"].attrs["time_zone"] == "UTC"
        assert as_time_axis(ax, 6).utc  # a TimeAxis keeps it
    naive = idx.tz_localize(None)
    assert not as_time_axis(naive, 6).utc
    assert "time_zone" not in m.to_dataset(z, naive)["time"].attrs
    assert not as_time_axis(np.arange(6.0), 6).utc


def test_utc_offsets_in_a_csv_are_converted_and_a_mix_is_refused(tmp_path, capsys):
    text = "t,y\n2024-03-01T12:30+01:00,1\n2024-06-01T12:30+02:00,2\n2024-07-01T12:30+02:00,3\n"
    out = tmp_path / "o"
    assert filter_main([_csv(tmp_path, text), "--time-col", "t", *GIVEN, "--out", str(out)]) == 0
    assert _results(out)["time"].iloc[0].startswith("2024-03-01 11:30")
    mixed = "t,y\n2024-03-01T12:30+01:00,1\n2024-06-01T12:30,2\n"
    rc = filter_main(
        [_csv(tmp_path, mixed, "m.csv"), "--time-col", "t", *GIVEN, "--out", str(tmp_path / "p")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "has a UTC offset" in err and "row 3" in err


# --- duplicate timestamps -------------------------------------------------------------------------
def test_duplicate_times_are_refused_naming_the_rows(tmp_path, capsys):
    text = "# a comment line counts as a row\nt,y\n1,2\n2,3\n1,4\n"
    rc = filter_main(
        [_csv(tmp_path, text), "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "rows 3 and 5 have the same time 1" in err
    assert not (tmp_path / "o").exists()


def test_duplicate_times_kept_on_request_as_observations_of_one_state(tmp_path, capsys):
    """--repeated-times keep (timestamps rounded to the second share times): each row is an
    observation of the state at its time, as the Python API reads repeated times; the refusal
    names the option."""
    import xarray as xr

    text = "t,y\n0,1.0\n1,3.0\n1,2.5\n3,2.0\n1,2.8\n"
    rc = filter_main(
        [_csv(tmp_path, text), "--time-col", "t", *GIVEN, "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--repeated-times keep" in err
    out = tmp_path / "k"
    argv = [_csv(tmp_path, text), "--time-col", "t", "--sigma2", "1", "--obs-var", "1",
            "--repeated-times", "keep", "--out", str(out)]  # fmt: skip
    assert filter_main(argv) == 0
    said = capsys.readouterr()
    assert "2 rows share a time with the row before" in said.out + said.err
    res = _results(out)
    res = res[res["kind"] == "data"]
    assert res["time"].tolist() == [0, 1, 1, 1, 3]
    assert res["observed"].tolist() == [1.0, 3.0, 2.5, 2.8, 2.0]  # the file's order within a time
    want = OUModel(sigma2=1.0, obs_var=1.0).filter(
        np.array([1.0, 3.0, 2.5, 2.8, 2.0]), np.array([0.0, 1.0, 1.0, 1.0, 3.0])
    )
    np.testing.assert_allclose(res["mean"].to_numpy(), want.mean, rtol=1e-9)
    ds = xr.load_dataset(out / "results.nc")
    assert ds.sizes["time"] == 5
    for bad in (["--series-col", "y"], []):
        argv = [_csv(tmp_path, text), *(["--time-col", "t"] if bad else []), *bad, *GIVEN,
                "--repeated-times", "keep", "--out", str(tmp_path / "x")]  # fmt: skip
        assert filter_main(argv) == 2
        assert "--repeated-times keep applies" in capsys.readouterr().err
    from kalmanscan.timeseries.csvfile import read_csv_series

    with pytest.raises(
        ValueError, match="repeated_times: expected 'refuse' or 'keep', got 'merge'"
    ):
        read_csv_series(_csv(tmp_path, text), "t", repeated_times="merge")


def test_duplicate_times_in_python_are_exact_zero_length_steps():
    m = OUModel(sigma2=1.0, obs_var=2.0)
    twice = m.filter(np.array([1.0, 3.0, 3.0]), np.array([0.0, 1.0, 1.0]))
    # two observations of the same state with variance 2 carry the information of one with 1
    once = OUModel(sigma2=1.0, obs_var=np.array([2.0, 1.0])[:, None]).filter(
        np.array([[1.0], [3.0]]), np.array([0.0, 1.0])
    )
    assert_close(twice.mean[-1], once.mean[-1, 0], "rounding", "float64", what="mean")
    assert_close(twice.var[-1], once.var[-1, 0], "rounding", "float64", what="var")


def test_fit_ou_on_three_centuries_of_nanosecond_dates():
    import kalmanscan as ks

    stamps = np.array(_annual(1700, 2008), dtype="datetime64[ns]")
    rng = np.random.default_rng(4)
    z = np.cumsum(rng.normal(size=stamps.size)) + rng.normal(size=stamps.size)
    fit = ks.fit_ou(z, stamps, fix={"theta": 0.0, "mu": 0.0}, time_unit="365.25D")
    per_year = ks.fit_ou(z, fix={"theta": 0.0, "mu": 0.0})  # row numbers: one unit a year
    assert fit.params["sigma2"] == pytest.approx(per_year.params["sigma2"], rel=1e-3)


def test_a_time_axis_parsed_day_first_can_be_passed_as_the_times():
    import kalmanscan as ks

    dates = [f"02/{m:02d}/1958" for m in range(1, 13)]
    with pytest.raises(ValueError, match="ambiguous dates"):
        ks.fit_ou(np.arange(12.0), dates)
    ax = as_time_axis(dates, 12, dayfirst=True)
    m = OUModel(sigma2=1.0, obs_var=1.0)
    res = m.filter(np.arange(12.0), ax)
    assert res.mean.shape == (12,)
    assert as_time_axis(ax, 12).t.tolist() == ax.t.tolist()
    assert as_time_axis(ax, 12, "7D").t[1] == pytest.approx(31 / 7)


def test_dates_that_pandas_2_gives_as_nat_are_read_by_python():
    """pandas before 3.0 parses into nanoseconds only and gives NaT outside 1677-2262; the parse
    then reads those values with Python's datetime (``times._outside_ns_window``), offsets
    applied, and leaves NaT what Python cannot read either. (pandas 3 reads them itself.)"""
    from kalmanscan.timeseries import times

    got = times._outside_ns_window(
        pd.Series(pd.to_datetime(["2000-01-01", None, None], format="%Y-%m-%d")),
        ["2000-01-01", "1500-06-01", "15OO-06-01"], "%Y-%m-%d", False,
    )  # fmt: skip
    assert got.dtype == "datetime64[us]"
    assert [str(x)[:10] for x in got.to_numpy()[:2]] == ["2000-01-01", "1500-06-01"]
    assert pd.isna(got.iloc[2])
    strs = ["2000-01-01T10:00:00+02:00", "1500-06-01T10:00:00+02:00", "1500-06-01T10:00:00Z"]
    got = times._outside_ns_window(
        pd.Series(pd.to_datetime([strs[0], None, None], utc=True)).dt.tz_localize(None),
        strs, "ISO8601", True,
    )  # fmt: skip
    assert [str(x) for x in got.to_numpy()] == [
        "2000-01-01T08:00:00.000000", "1500-06-01T08:00:00.000000", "1500-06-01T10:00:00.000000"
    ]  # fmt: skip
    # the whole parse under either pandas: historical and far-future dates, day-first too
    out = times.parse_datetime_strings(["1500-06-01", "2500-01-31"])
    assert out.dtype == "datetime64[s]" and str(out[0]) == "1500-06-01T00:00:00"
    out = times.parse_datetime_strings(["31/01/1500", "01/02/1500"])
    assert str(out[1])[:10] == "1500-02-01"


# --- forecasts of monthly, quarterly and yearly records step by calendar months -------------------
@pytest.mark.parametrize(
    "stamps,expected",
    [
        # quarter starts (statistical offices' 2009Q1 labels read as these)
        (["2008-10-01", "2009-01-01", "2009-04-01"], ["2009-07-01", "2009-10-01", "2010-01-01"]),
        # month ends, through a leap February
        (["2023-11-30", "2023-12-31", "2024-01-31"], ["2024-02-29", "2024-03-31", "2024-04-30"]),
        # the 15th of each month at 06:30, with one month missing
        (
            ["2024-01-15T06:30", "2024-02-15T06:30", "2024-04-15T06:30", "2024-05-15T06:30"],
            ["2024-06-15T06:30", "2024-07-15T06:30", "2024-08-15T06:30"],
        ),
        # years
        (["1999-01-01", "2000-01-01", "2001-01-01"], ["2002-01-01", "2003-01-01", "2004-01-01"]),
        # weeks and days keep their fixed step
        (["2024-02-05", "2024-02-12", "2024-02-19"], ["2024-02-26", "2024-03-04", "2024-03-11"]),
        (["2024-02-27", "2024-02-28", "2024-02-29"], ["2024-03-01", "2024-03-02", "2024-03-03"]),
    ],
)
def test_forecast_times_follow_the_calendar(stamps, expected):
    labels = np.array(stamps, dtype="datetime64[s]")
    z = np.arange(len(stamps), dtype=float)
    fc = OUModel(sigma2=1.0, obs_var=1.0).forecast(z, labels, steps=3)
    np.testing.assert_array_equal(fc.times, np.array(expected, dtype="datetime64[s]"))


def test_cli_forecasts_quarters_on_quarter_starts(tmp_path, capsys):
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.macrodata.load_pandas().data
    labels = [f"{int(y)}Q{int(q)}" for y, q in zip(d.year, d.quarter, strict=True)]
    text = "quarter,infl\n" + "".join(f"{q},{v}\n" for q, v in zip(labels, d.infl, strict=True))
    out = tmp_path / "o"
    args = [_csv(tmp_path, text), "--time-col", "quarter", *GIVEN, "--forecast", "5"]
    assert filter_main([*args, "--out", str(out)]) == 0, capsys.readouterr().err
    fc = _results(out).query("kind == 'forecast'")["time"].tolist()
    assert labels[-1] == "2009Q3"
    assert fc == ["2009-10-01", "2010-01-01", "2010-04-01", "2010-07-01", "2010-10-01"]
    summary = (out / "summary.txt").read_text()
    assert "  2010-01-01  " in summary and "T00:00:00" not in summary


def test_utc_dates_at_midnight_are_written_with_a_time_of_day(tmp_path, capsys):
    text = "t,v\n" + "".join(f"1958-03-{d:02d}T02:00:00+02:00,{d}\n" for d in range(1, 6))
    out = tmp_path / "o"
    assert filter_main([_csv(tmp_path, text), "--time-col", "t", *GIVEN, "--out", str(out)]) == 0
    times = _results(out)["time"].tolist()
    assert times[0] == "1958-03-01 00:00:00Z"  # ISO 8601: no zone on a bare date
    again = tmp_path / "again"
    back = "t,v\n" + "".join(f"{t},{i}\n" for i, t in enumerate(times))
    args = [_csv(tmp_path, back, "b.csv"), "--time-col", "t", *GIVEN]
    rc = filter_main([*args, "--out", str(again)])
    assert rc == 0, capsys.readouterr().err
    assert _results(again)["time"].tolist() == times


@pytest.mark.parametrize("unit", ["1", "7", "2.5", "1e3"])
def test_a_time_unit_without_its_unit_is_refused(unit):
    expected = f"time_unit: expected a duration with its unit, such as '{unit}D'"
    with pytest.raises(ValueError, match=expected):
        as_time_axis(np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[D]"), 2, unit)


@pytest.mark.parametrize("first,last", [(1, 100), (9900, 9999)])
def test_records_at_the_ends_of_the_calendar_write_every_output(tmp_path, capsys, first, last):
    text = "date,v\n" + "".join(f"{y:04d}-07-01,{(y * 37) % 11}\n" for y in range(first, last + 1))
    out = tmp_path / "o"
    args = [_csv(tmp_path, text), "--time-col", "date", *GIVEN, "--time-unit", "365.25D"]
    assert filter_main([*args, "--out", str(out)]) == 0, capsys.readouterr().err
    written = {p.name for p in out.iterdir()}
    assert written >= {"results.csv", "results.nc", "results.png", "summary.txt"}
    rc = filter_main([*args, "--forecast", "200", "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    if last == 9999:
        assert rc == 2 and "--forecast 200: step 1 reaches 10000-07-01, past the year 9999" in err
        assert "expected at most 0 steps" in err
    else:
        assert rc == 0, err
