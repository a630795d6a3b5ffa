"""The fast paths of ``kalmanscan filter`` on large files, each against its reference: results.csv's
writer (floats as ``%.10g`` built in numpy, each distinct text formatted once) against Python's
``%`` and pandas' ``to_csv``; the ISO dates it writes against ``np.datetime_as_string``; and the
reading of ISO 8601 times written in one layout against the general parse. Also the docstring
examples of the CLI's reader and writer modules."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from kalmanscan.timeseries import time_parse, times  # noqa: E402
from kalmanscan.timeseries.outputs import (  # noqa: E402
    _csv_text,
    _iso_time_bytes,
    _iso_times,
    _results_table,
    _write_csv,
)
from kalmanscan.timeseries.time_calendar import floor_datetimes, whole_in  # noqa: E402


# --- floats as %.10g --------------------------------------------------------------------------
def _awkward_floats(seed: int, n: int = 20_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    powers = 10.0 ** np.arange(-25, 36)
    return {
        "every-magnitude": rng.normal(size=n) * 10.0 ** rng.integers(-320, 308, size=n),
        "fast-range": rng.normal(size=n) * 10.0 ** rng.integers(-14, 33, size=n),
        "short-decimals": np.round(rng.normal(size=n) * 1e6) / 10.0 ** rng.integers(0, 9, n),
        # halves at the eleventh digit: ties (round half to even) and values just off them
        "near-ties": (rng.integers(0, 10**11, n) + 0.5) / 10.0 ** rng.integers(0, 14, n),
        "integers": rng.integers(-(10**12), 10**12, n).astype(np.float64),
        "bit-patterns": np.frombuffer(rng.bytes(8 * n), dtype=np.float64).copy(),
        "edges": np.concatenate(
            [
                powers,
                -powers,
                np.nextafter(powers, 0),
                np.nextafter(powers, np.inf),
                9999999999.5 * 10.0 ** np.arange(-20, 20),
                9999999999.4999 * 10.0 ** np.arange(-20, 20),
                999999999.95 * 10.0 ** np.arange(-20, 20),
                [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1.7976931348623157e308],
                [1e-4, 9.9999999995e-5, 0.000099999999995, 1e10, 9999999999.5, 1234567890.5],
                [1234567891.5, 0.00012345678905, 1e-12, 1e30, 0.1 + 0.2, 1 / 3, 2 / 3],
            ]
        ),
    }


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "case",
    ["every-magnitude", "fast-range", "short-decimals", "near-ties", "integers", "bit-patterns",
     "edges"],
)  # fmt: skip
def test_floats_are_written_as_python_formats_them(seed, case):
    x = _awkward_floats(seed)[case]
    got = _csv_text(pd.DataFrame({"x": x}))
    want = "x\n" + "".join(("" if v != v else "%.10g" % v) + "\n" for v in x.tolist())  # noqa: UP031
    assert got == want


@pytest.mark.parametrize("n", [0, 1, 63, 1000, 40_000])  # (40,000: more than one block of rows)
def test_a_table_is_written_as_pandas_writes_it(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n) * 10.0 ** rng.integers(-15, 20, size=n)
    x[::7] = np.nan
    names = np.array(["a", 'b "q"', "c,d", "e\nf", "Zürich", "NA", ""], dtype=object)
    mixed = np.array([1, 1.0, True, "1", None, 2.5], dtype=object)  # (1 == 1.0 == True)
    frame = pd.DataFrame(
        {
            "kind": "data",
            "name": names[rng.integers(0, len(names), n)],
            "x": x,
            "f32": x.astype(np.float32),
            "flag": x > 0,
            "flags": pd.Series(x > 0, dtype=object).where(~np.isnan(x), None),
            "i": rng.integers(-(2**62), 2**62, size=n),
            "mixed": mixed[rng.integers(0, len(mixed), n)],
            "cat": pd.Categorical(rng.choice(["u", "v,w"], n)),
            "t": pd.date_range("1999-12-31 23:00", periods=n, freq="37min"),
        }
    )
    assert _csv_text(frame) == frame.to_csv(index=False, float_format="%.10g")


def test_a_text_holding_a_nul_character_is_written_by_pandas():
    frame = pd.DataFrame({"name": ["a\x00b", "c"], "x": [1.5, np.nan]})
    assert _csv_text(frame) == frame.to_csv(index=False, float_format="%.10g")


# --- dates --------------------------------------------------------------------------------------
def _reference_iso(t, unit):
    """numpy's text of ``t`` at ``unit`` (``np.datetime_as_string``'s, taken as bytes at once),
    its ``T`` written as a space (``str.replace("T", " ")`` on each, done on the bytes: the
    years 1 to 9999 are 3.65 million days)."""
    text = t.astype(f"datetime64[{unit}]").astype("S")
    chars = text.view(np.uint8)
    chars[chars == ord("T")] = ord(" ")
    return text


@pytest.mark.parametrize("unit", ["D", "s", "ms", "us", "ns"])
def test_dates_are_written_as_numpy_writes_them(unit):
    rng = np.random.default_rng(7)
    if unit == "ns":
        lo, hi = (np.datetime64(d, "ns").astype(np.int64) for d in ("1678-01-01", "2262-01-01"))
    else:
        lo = np.datetime64("0001-01-01", unit).astype(np.int64)
        hi = np.datetime64("9999-12-31T23:59:59.999999", "us").astype(f"datetime64[{unit}]")
        hi = hi.astype(np.int64)
    leap = np.datetime64("2000-02-29", unit).astype(np.int64) + np.arange(-3, 3)
    ticks = np.concatenate([rng.integers(lo, hi, 50_000), [lo, hi, 0, -1, 1], leap])
    t = ticks.astype(f"datetime64[{unit}]")
    assert (_iso_time_bytes(t, unit) == _reference_iso(t, unit)).all()
    # NaT, years past 9999 or before 1: numpy's own text
    odd = np.concatenate([t[:3], np.array(["NaT"], dtype=f"datetime64[{unit}]")])
    assert (_iso_time_bytes(odd, unit) == _reference_iso(odd, unit)).all()
    if unit != "ns":
        far = np.array(["-0001-01-01", "10000-01-01", "2000-01-01"], dtype=f"datetime64[{unit}]")
        assert (_iso_time_bytes(far, unit) == _reference_iso(far, unit)).all()


def test_dates_on_nanoseconds_first_day():
    """Nanoseconds' range starts at 1677-09-21 00:12:43: numpy's floor cast to days overflows
    on that day (it gave 2262), which made whole days there read as not whole (written with a
    time of day) and can give wrong dates; the unit and the text are now taken in integers."""
    days = np.array(["1677-09-22", "1677-09-23"], "datetime64[ns]")
    assert _iso_times(days) == ["1677-09-22", "1677-09-23"]
    hours = np.array(["1677-09-21T01:00", "1677-09-21T02:30"], "datetime64[ns]")
    assert _iso_times(hours) == ["1677-09-21 01:00:00", "1677-09-21 02:30:00"]
    # every unit from days to microseconds floored as Python's integers floor
    lo = np.iinfo(np.int64).min + 1
    ticks = np.concatenate([lo + np.arange(5), np.random.default_rng(2).integers(lo, 2**62, 1000),
                            [-1, 0, 1, np.iinfo(np.int64).max]])  # fmt: skip
    t = ticks.astype("datetime64[ns]")
    for unit, per in (("D", 86_400 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        want = np.array([int(x) // per for x in ticks.tolist()], dtype=np.int64)
        assert (floor_datetimes(t, unit).astype(np.int64) == want).all(), unit
        whole = np.append((ticks[5:8] // per * per).astype("datetime64[ns]"), np.datetime64("NaT"))
        assert whole_in(whole, unit) and not whole_in(whole + np.timedelta64(1, "ns"), unit)


def test_every_day_of_the_years_1_to_9999():
    days = np.arange(np.datetime64("0001-01-01"), np.datetime64("10000-01-01"))
    text = _iso_time_bytes(days, "D")
    assert (text == _reference_iso(days, "D")).all()
    assert _iso_times(days[:2]) == ["0001-01-01", "0001-01-02"]
    # and against the calendar's rule, not numpy's: each text is the day after the one before
    # (the next day of the month, the 1st of the next month after the month's last day, January
    # 1st after December 31st), month lengths from the Gregorian leap rule
    assert text.dtype == "S10"
    b = text.view(np.uint8).reshape(-1, 10)
    assert (b[:, 4] == ord("-")).all() and (b[:, 7] == ord("-")).all()
    digit = lambda j: b[:, j].astype(np.int32) - ord("0")  # noqa: E731
    y = digit(0) * 1000 + digit(1) * 100 + digit(2) * 10 + digit(3)
    m, d = digit(5) * 10 + digit(6), digit(8) * 10 + digit(9)
    leap = (y % 4 == 0) & ((y % 100 != 0) | (y % 400 == 0))
    ends = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m - 1] + ((m == 2) & leap)
    last = d == ends
    year_end = last & (m == 12)
    np.testing.assert_array_equal(y[1:], (y + year_end)[:-1])
    np.testing.assert_array_equal(m[1:], np.where(year_end, 1, m + last)[:-1])
    np.testing.assert_array_equal(d[1:], np.where(last, 1, d + 1)[:-1])
    assert (y[0], m[0], d[0], y[-1], m[-1], d[-1]) == (1, 1, 1, 9999, 12, 31)


_TICKS_PER_S = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _python_iso(ticks, unit) -> np.ndarray:
    """Python's text of integer ``ticks`` of ``unit`` (days, or datetime64 ticks of s to ns
    from 1970-01-01) in the years 1 to 9999: ``date.isoformat``, ``datetime.isoformat(sep=" ")``
    of the whole seconds and the fraction's digits written from the integer."""
    out = []
    for k in ticks.tolist():
        if unit == "D":
            out.append((dt.date(1970, 1, 1) + dt.timedelta(days=k)).isoformat())
            continue
        per = _TICKS_PER_S[unit]
        sec, sub = divmod(k, per)
        text = (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=sec)).isoformat(sep=" ")
        out.append(text + (f".{sub:0{len(str(per)) - 1}d}" if per > 1 else ""))
    return np.array([t.encode("ascii") for t in out], dtype="S")


def _limits(unit: str) -> np.ndarray:
    """Ticks of ``unit`` at the ends of its range in the years 1 to 9999 (nanoseconds': 1677 to
    2262), around 1970-01-01, and on leap days, month ends and century years."""
    if unit == "ns":
        lo, hi = np.iinfo(np.int64).min + 1, np.iinfo(np.int64).max
    else:
        lo = np.datetime64("0001-01-01", unit).astype(np.int64)
        hi = np.datetime64("10000-01-01", unit).astype(np.int64) - 1
    dates = ["1600-02-29", "1700-02-28", "1700-03-01", "1900-02-28", "1900-03-01",
             "2000-02-29", "2000-12-31", "2001-01-01", "1969-12-31", "1970-01-01",
             "1677-09-22", "2262-04-11"]  # fmt: skip
    if unit != "ns":
        dates += ["0001-12-31", "0004-02-29", "9996-02-29", "9999-12-31"]
    days = np.array(dates, "datetime64[D]").astype(f"datetime64[{unit}]").astype(np.int64)
    around = np.arange(-2, 3)
    ticks = np.concatenate([[lo, hi], lo + around[3:], hi - around[3:], around,
                            (days[:, None] + around).ravel()])  # fmt: skip
    return ticks[(ticks >= lo) & (ticks <= hi)]


_UNITS = ["D", "s", "ms", "us", "ns"]
_PER_DAY = {"D": 1, "s": 86_400, "ms": 86_400 * 10**3, "us": 86_400 * 10**6, "ns": 86_400 * 10**9}


@pytest.mark.parametrize(
    "given,unit", [(g, u) for i, g in enumerate(_UNITS) for u in _UNITS[: i + 1]]
)  # (the writer's unit is never finer than the times': the coarsest that holds them)
def test_dates_are_written_as_python_writes_them(given, unit):
    """Against Python's ``isoformat`` (independent of numpy's text): times given at one unit,
    written floored to a coarser one or their own, random over the whole range (years 1 to
    9999; nanoseconds' 1677 to 2262) and at its limits, around 1970 and on leap days."""
    rng = np.random.default_rng(11)
    lim = _limits(given)
    ticks = np.concatenate([rng.integers(lim[0], lim[1], 3000), lim])
    factor = _PER_DAY[given] // _PER_DAY[unit]
    want = np.array([k // factor for k in ticks.tolist()], dtype=np.int64)  # Python's floor
    got = _iso_time_bytes(ticks.astype(f"datetime64[{given}]"), unit)
    np.testing.assert_array_equal(got, _python_iso(want, unit))
    assert got.dtype.itemsize == {"D": 10, "s": 19, "ms": 23, "us": 26, "ns": 29}[unit]


# --- results.csv against the table pandas writes --------------------------------------------
def _reference_results_csv(ds) -> str:
    """results.csv as pandas writes the long table (kalmanscan's writer before its fast path)."""
    out, _, tdim, sdims = _results_table(ds)
    if out["time"].dtype.kind == "f":
        out["time"] = [str(int(t)) if float(t).is_integer() and abs(t) < 2.0**53
                       else repr(float(t)) for t in out["time"]]  # fmt: skip
    else:
        zone = "Z" if ds[tdim].attrs.get("time_zone") == "UTC" else ""
        out["time"] = [t + zone for t in _iso_times(out["time"].to_numpy(), with_time=bool(zone))]
    keep = ["kind", "time", *sdims] + [k for k in out.columns if k not in ("kind", "time", *sdims)]
    return out[keep].to_csv(index=False, float_format="%.10g")


@pytest.mark.parametrize(
    "case", ["dates-forecast", "utc", "numeric-times", "robust-outliers", "one-series-no-dim"]
)
def test_results_csv_is_the_table_pandas_writes(case, tmp_path):
    from kalmanscan.timeseries import OUModel, fit_ou

    rng = np.random.default_rng(11)
    n = 400
    z = rng.normal(size=(n, 3)).cumsum(0) * [1.0, 1e-6, 1e7]
    z[::37, 0] = np.nan
    t = np.datetime64("1850-01-01T00:00", "s") + np.arange(n) * np.timedelta64(3, "h")
    model = OUModel(theta=0.0, sigma2=1.0, obs_var=1.0, time_unit="1h")
    if case == "dates-forecast":
        ds = model.to_dataset(z, t, forecast_steps=10, coverage=[0.5, 0.9])
    elif case == "utc":
        ds = model.to_dataset(z, t, forecast_steps=3)
        ds["time"].attrs["time_zone"] = "UTC"
    elif case == "numeric-times":
        model = OUModel(theta=0.1, sigma2=1.0, obs_var=1.0)
        ds = model.to_dataset(z, np.arange(n) * 0.1 + 1e6, forecast_steps=5)
    elif case == "robust-outliers":
        y = z[:, :1] + rng.normal(size=(n, 1))
        y[50, 0] = y[51, 0] = -9999.0
        with pytest.warns(UserWarning, match="2 observations screened out"):
            fit = fit_ou(y, t, fix={"theta": 0.0}, time_unit="1h", robust=True)
        ds = fit.to_dataset(forecast_steps=4)
        outliers = np.asarray(fit.outliers, bool).reshape(ds["observed"].shape)
        ds["outlier"] = (ds["observed"].dims, outliers)
        ds["outlier_value"] = (ds["observed"].dims, np.where(outliers, 0.5, np.nan))
    else:
        ds = model.to_dataset(z[:, 0], t, forecast_steps=2)
    path = tmp_path / "results.csv"
    _write_csv(ds, str(path))
    assert path.read_bytes() == _reference_results_csv(ds).encode()


# --- ISO 8601 in one layout, read at once ----------------------------------------------------
def _general_parse(values):
    """parse_datetime_strings without its fixed-layout path: the times, or 'refused'."""
    saved = time_parse._parse_fixed_iso
    time_parse._parse_fixed_iso = lambda values: None
    try:
        return time_parse.parse_datetime_strings(values)
    except ValueError:
        return "refused"
    finally:
        time_parse._parse_fixed_iso = saved


def _iso_text(rng, fields, layout: str, sep: str, zone: str) -> str:
    """A time in an ISO 8601 layout: D (date), m (minutes), s (seconds), fK (K digits after
    the point)."""
    year, month, day, hour, minute, second = fields
    text = f"{year:04d}-{month:02d}-{day:02d}"
    if layout != "D":
        text += f"{sep}{hour:02d}:{minute:02d}"
    if layout[0] in "sf":
        text += f":{second:02d}"
    if layout[0] == "f":
        text += "." + "".join(map(str, rng.integers(0, 10, int(layout[1:]))))
    return text + zone


def _layouts(seed: int):
    """Columns of times in each layout, valid, and with one invalid value."""
    rng = np.random.default_rng(seed)
    n = 120
    for layout in ("D", "m", "s", "f1", "f3", "f6", "f7", "f9"):
        for sep in (" ", "T"):
            for zone in ("", "Z"):
                for years in ((1678, 2262), (1, 9999)):
                    # year, month, day, hour, minute, second; some out of range
                    raw = np.column_stack(
                        [rng.integers(*years, n)]
                        + [rng.integers(0, top, n) for top in (14, 33, 25, 61, 61)]
                    )
                    valid = raw % [10000, 12, 28, 24, 60, 60] + [0, 1, 1, 0, 0, 0]
                    good = [_iso_text(rng, f, layout, sep, zone) for f in valid]
                    yield f"{layout}{sep!r}{zone}{years[0]}", good
                    bad = list(good)
                    bad[int(rng.integers(0, n))] = _iso_text(rng, raw[0], layout, sep, zone)
                    yield f"{layout}{sep!r}{zone}{years[0]}-one-invalid", bad


ODD = {
    "leap-days": ["2000-02-29 00:00:00", "1900-02-29 00:00:00"],
    "leap-years": ["2000-02-29", "2004-02-29", "2100-02-28"],
    "both-separators": ["2000-01-01 00:00:00", "2000-01-01T00:00:00"],
    "zone-on-some": ["2000-01-01 00:00:00Z", "2000-01-01 00:00:00"],
    "leading-space": [" 2000-01-01", "2000-01-02"],
    "trailing-space": ["2000-01-01", "2000-01-02 "],
    "empty-fraction": ["2000-01-01 00:00:00.", "2000-01-01 00:00:01."],
    "date-with-zone": ["2000-01-01Z"],
    "one-digit-month": ["1958-03-29", "1958-3-30"],
    "ten-digit-fraction": ["2000-01-01 00:00:00.1234567891"],
    "offset": ["2000-01-01 00:00:00+01:00"],
    "non-ascii-digit": ["２000-01-01"],
    "midnight-24": ["2000-01-01 24:00:00"],
    "leap-second": ["2000-12-31 23:59:60"],
    "year-0": ["0000-01-01"],
    "comma-fraction": ["2000-01-01 00:00:00,5"],
}


@pytest.mark.parametrize("seed", [0, 1])
def test_one_layout_reads_as_the_general_parse(seed):
    taken = 0
    for label, values in [*_layouts(seed), *ODD.items()]:
        fixed = times._parse_fixed_iso(values)
        if fixed is None:
            continue
        taken += 1
        general = _general_parse(values)
        assert not isinstance(general, str), f"{label}: read at once, refused by the general parse"
        assert fixed.dtype == general.dtype and (fixed == general).all(), label
        assert (times.parse_datetime_strings(values) == general).all(), label
    assert taken >= 40  # every valid layout of the window, with and without Z


def test_the_layouts_it_leaves_to_the_general_parse():
    for label in ODD:
        if label in ("leap-years", "both-separators"):
            assert times._parse_fixed_iso(ODD[label]) is not None, label
        else:
            assert times._parse_fixed_iso(ODD[label]) is None, label
    years = ["1500-01-01 00:00:00", "1501-01-01 00:00:00"]  # outside 1678-2261: general parse
    assert times._parse_fixed_iso(years) is None
    assert times.parse_datetime_strings(years).dtype == np.dtype("datetime64[s]")
    assert times._parse_fixed_iso(np.array([1, 2])) is None
    assert times._parse_fixed_iso(np.array(["2000-01-01", 5], dtype=object)) is None
    # a Series of pandas' text dtype, as the CSV reader gives it
    col = pd.Series(["2024-05-07 10:00", "2024-05-07 11:00"], dtype=str)
    assert times._parse_fixed_iso(col.to_numpy()).tolist()[1].isoformat() == "2024-05-07T11:00:00"
