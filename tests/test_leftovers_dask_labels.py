"""Fitting a dask-chunked DataArray (``da.kalman.fit_ou``) where a chunk holds only series with
fewer than 2 observations: the error names those series by their coordinates (positions along a
dim without one), as the in-memory fit's warning names such a series; a chunk that also holds a
series it can fit warns and returns what the in-memory fit returns."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
import kalmanscan.xarray  # noqa: E402, F401  (registers the accessor)

FIX = {"theta": 0.0, "mu": 0.0}


def stations(coords=("a", "b", "c"), short=(1,), observed=1, T=30, seed=0):
    """Random walks plus noise over ``station``; the series at positions ``short`` keep only
    their first ``observed`` values (the rest NaN)."""
    rng = np.random.default_rng(seed)
    n = 3 if coords is None else len(coords)
    z = rng.normal(size=(T, n)).cumsum(0) + rng.normal(size=(T, n))
    for j in short:
        z[observed:, j] = np.nan
    c = {} if coords is None else {"station": list(coords)}
    return xr.DataArray(z, dims=("time", "station"), coords=c)


@pytest.mark.parametrize(
    "coords, observed, name",
    [
        pytest.param(("a", "b", "c"), 1, "station='b'", id="text-1obs"),
        pytest.param(("a", "b", "c"), 0, "station='b'", id="text-0obs"),
        pytest.param((10, 20, 30), 1, "station=20", id="numbers"),
        pytest.param(None, 1, "station=1", id="no-coordinate"),
    ],
)
def test_a_chunk_of_short_series_is_named(coords, observed, name):
    da = stations(coords, observed=observed).chunk({"station": 1})
    with pytest.raises(ValueError) as info:
        da.kalman.fit_ou(fix=FIX).compute()
    msg = str(info.value)
    assert msg.startswith("z: expected at least 2 observed values in a series to fit"), msg
    assert f"got at most {observed} in series {name}," in msg, msg
    assert "dask chunk" in msg and "rechunk along station" in msg, msg
    others = [c for c in ("station='a'", "station='c'", "station=10", "station=0") if c != name]
    assert not any(o in msg for o in others), msg


def test_a_chunk_of_two_short_series_names_both_over_two_dims():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(30, 2, 2)).cumsum(0)
    z[1:, 1, :] = np.nan  # station 'y': one value at each level
    da = xr.DataArray(
        z, dims=("time", "station", "level"), coords={"station": ["x", "y"], "level": [1, 2]}
    )
    with pytest.raises(ValueError) as info:
        da.chunk({"station": 1}).kalman.fit_ou(fix=FIX).compute()
    msg = str(info.value)
    assert "in series (station='y', level=1), (station='y', level=2)," in msg, msg
    assert "station='x'" not in msg


def test_in_memory_array_of_short_series_names_every_series():
    da = stations(short=(0, 1, 2))
    with pytest.raises(ValueError, match=re.escape(
        "got at most 1 in every series (station='a', station='b', station='c')"
    )):  # fmt: skip
        da.kalman.fit_ou(fix=FIX)


def test_a_chunk_with_a_series_to_fit_warns_as_in_memory():
    """Chunks of two stations: the chunk holding 'b' also holds 'a', so 'b' is kept at its
    starting values with the in-memory warning, and the results are the in-memory ones."""
    da = stations(("a", "b", "c", "d"))

    def fit(x):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = x.kalman.fit_ou(fix=FIX).compute()
        return ds, [str(w.message) for w in caught]

    mem, mem_warnings = fit(da)
    lazy, lazy_warnings = fit(da.chunk({"station": 2}))
    short = "fit_ou: series station='b' have fewer than 2 observations"
    assert any(w.startswith(short) for w in mem_warnings), mem_warnings
    assert any(w.startswith(short) for w in lazy_warnings), lazy_warnings
    assert lazy["converged"].values.tolist() == mem["converged"].values.tolist()
    assert lazy["converged"].sel(station="b").item() == 0
    for name in ("sigma2", "obs_var", "n_obs"):
        np.testing.assert_array_equal(lazy[name].values, mem[name].values, err_msg=name)
