"""Times as cftime dates (xarray's dates in model calendars).

Dates of the proleptic Gregorian calendar (and of ``standard`` / ``gregorian`` from 1582-10-15)
are numpy's and are read exactly as ``datetime64``. Another calendar's days are not numpy's:
``noleap`` has no Feb 29, so its Feb 28 -> Mar 1 is one day, which read as text became two
(a fit on 200 daily ``noleap`` dates gave theta 0.038067 against 0.037997 for its regular steps),
and ``360_day``'s Feb 30 could not be parsed. Such dates are refused with the way to give them
as numbers, which the tests follow.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest

import kalmanscan as ks

cftime = pytest.importorskip("cftime")
xr = pytest.importorskip("xarray")
pytest.importorskip("pandas")

T = 200


def _data():
    rng = np.random.default_rng(0)
    return np.cumsum(rng.normal(size=T)) * 0.1 + rng.normal(size=T) * 0.3


def _dates(calendar, start=(2000, 1, 1), n=T):
    first = cftime.datetime(*start, calendar=calendar)
    return np.array([first + datetime.timedelta(days=i) for i in range(n)], dtype=object)


def _params(fit):
    return {k: float(fit.params[k]) for k in ("theta", "sigma2", "obs_var")}


@pytest.mark.parametrize("calendar", ["noleap", "360_day", "all_leap", "julian"])
def test_a_model_calendar_is_refused_with_the_way_to_give_numbers(calendar):
    """The accessor and ``fit_ou`` refuse it naming the calendar (noleap was read as Gregorian
    dates, with one 2-day step; 360_day failed to parse its Feb 30)."""
    times = xr.date_range("2000-01-01", periods=T, freq="D", calendar=calendar, use_cftime=True)
    da = xr.DataArray(_data(), coords={"time": times}, dims="time")
    import kalmanscan.xarray  # noqa: F401 (the accessor)

    for call in (da.kalman.fit_ou, lambda: ks.fit_ou(_data(), np.asarray(times))):
        with pytest.raises(ValueError, match=f"cftime dates in the '{calendar}' calendar") as e:
            call()
        assert "cftime.date2num(times, 'days since 2000-01-01'" in str(e.value)


def test_the_numbers_the_refusal_suggests_fit_the_calendar_s_own_steps():
    """noleap's days as numbers (cftime.date2num, as the message says) are 200 steps of one
    day: the fit equals the fit at times 0, 1, ..., 199, value for value, and the time
    coordinate keeps its units and calendar."""
    import kalmanscan.xarray  # noqa: F401

    times = xr.date_range("2000-01-01", periods=T, freq="D", calendar="noleap", use_cftime=True)
    since = "days since 2000-01-01"
    num = cftime.date2num(np.asarray(times), since, calendar="noleap")
    assert num[58] == 58 and num[59] == 59  # Feb 28 -> Mar 1: one day
    coord = xr.Variable("time", num, {"units": since, "calendar": "noleap"})
    da = xr.DataArray(_data(), coords={"time": coord}, dims="time")
    got = da.kalman.fit_ou()
    want = da.assign_coords(time=np.arange(T, dtype=np.float64)).kalman.fit_ou()
    for k in ("theta", "sigma2", "obs_var", "mu"):
        assert float(got[k]) == float(want[k])
    ds = da.kalman.filter(got)
    assert ds["time"].attrs["calendar"] == "noleap"


@pytest.mark.parametrize("calendar", ["standard", "gregorian", "proleptic_gregorian"])
def test_gregorian_cftime_dates_read_exactly_as_datetime64(calendar):
    """The same fit, filter and forecast times as the same dates given as datetime64, across a
    Feb 29, with a sub-second time of day kept to the microsecond."""
    cf = _dates(calendar)
    cf[5] = cf[5] + datetime.timedelta(microseconds=250_001)
    dt64 = np.array([np.datetime64(v.isoformat()) for v in cf], dtype="datetime64[us]")
    ax = ks.timeseries.times.as_time_axis(cf, T)
    assert ax.labels.dtype == np.dtype("datetime64[us]")
    assert np.array_equal(ax.labels, dt64)
    assert ax.t[60] - ax.t[59] == 1.0  # Feb 29 -> Mar 1 2000
    a, b = ks.fit_ou(_data(), cf), ks.fit_ou(_data(), dt64)
    assert _params(a) == _params(b)
    f1 = a.model.forecast(a.z, a.time_axis, steps=3)
    f2 = b.model.forecast(b.z, b.time_axis, steps=3)
    assert np.array_equal(f1.times, f2.times) and np.array_equal(f1.mean, f2.mean)


def test_standard_dates_before_the_gregorian_reform_and_mixed_calendars_are_refused():
    """``standard`` is Julian before 1582-10-15 (its Oct 4 -> Oct 15 is one day): refused,
    naming the first such date; dates of two calendars are refused too."""
    with pytest.raises(
        ValueError,
        match=r"'standard' calendar before 1582-10-15 \(1582-10-01 00:00:00, position 0\)",
    ):
        ks.fit_ou(_data()[:30], _dates("standard", (1582, 10, 1), 30))
    mixed = np.concatenate([_dates("noleap", n=3), _dates("standard", (2001, 1, 1), 3)])
    with pytest.raises(ValueError, match="of one calendar, got calendars"):
        ks.timeseries.times.as_time_axis(mixed, 6)


def test_the_docs_block_runs_and_fits_as_the_calendar_s_days():
    """docs/model.md's block (noleap dates as numbers), run on a noleap DataArray: the fit
    equals the fit at times 0, 1, ..., 199."""
    import pathlib
    import re

    import kalmanscan.xarray  # noqa: F401

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "model.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "date2num" in b]
    times = xr.date_range("2000-01-01", periods=T, freq="D", calendar="noleap", use_cftime=True)
    scope = {"cftime": cftime, "xr": xr,
             "da": xr.DataArray(_data(), coords={"time": times}, dims="time")}  # fmt: skip
    exec(compile(block, "docs/model.md", "exec"), scope)
    got = scope["da"].kalman.fit_ou()
    want = scope["da"].assign_coords(time=np.arange(T, dtype=np.float64)).kalman.fit_ou()
    assert float(got["theta"]) == float(want["theta"])
