"""Fitting a dask-chunked DataArray (``da.kalman.fit_ou``) whose chunks hold series with fewer
than 2 observations: every chunk, even one holding only such series, gives what the in-memory fit
gives (starting values, not converged, the same warning naming the series by their coordinates,
or positions along a dim without one); an array in which no series has 2 observations is refused
in memory and, when computed, chunked alike."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
import kalmanscan.xarray  # noqa: E402, F401  (registers the accessor)
from kalmanscan.testing import assert_close  # noqa: E402
from tests.helpers import fit_dask_recorded  # noqa: E402

FIX = {"theta": 0.0, "mu": 0.0}
SHORT = "have fewer than 2 observations; their parameters stay at the starting values and are "


def stations(coords=("a", "b", "c"), short=(1,), observed=1, T=30, seed=0):
    """Random walks plus noise over ``station``; the series at positions ``short`` keep only
    their first ``observed`` values (the rest NaN); ``observed`` may be one number per series."""
    rng = np.random.default_rng(seed)
    n = 3 if coords is None else len(coords)
    z = rng.normal(size=(T, n)).cumsum(0) + rng.normal(size=(T, n))
    for j, k in zip(short, np.broadcast_to(observed, len(short)), strict=True):
        z[k:, j] = np.nan
    c = {} if coords is None else {"station": list(coords)}
    return xr.DataArray(z, dims=("time", "station"), coords=c)


def fit(da, fix=FIX, **options):
    """The computed fit and its warnings' texts (:func:`tests.helpers.fit_dask_recorded`)."""
    return fit_dask_recorded(da, fix, **options)


def assert_as_in_memory(da, chunks, fix=FIX, **options):
    """The chunked fit against the in-memory one: the same coordinates, attrs and layout; the
    series with fewer than 2 observations equal to the bit in every variable; ``converged`` and
    ``n_obs`` equal; the fitted series' estimates and log-likelihoods within the ``parallel``
    tolerance (each chunk's series are fitted as their own batch: docs/api.md, "Dask"). Each fit
    warns of the short series in the in-memory wording, naming the same series (one warning per
    chunk holding some). Returns the chunked fit's warnings."""
    mem, mem_warnings = fit(da, fix, **options)
    lazy, lazy_warnings = fit(da.chunk(chunks), fix, **options)
    assert lazy.attrs == mem.attrs
    xr.testing.assert_identical(lazy.coords.to_dataset(), mem.coords.to_dataset())
    assert list(lazy.data_vars) == list(mem.data_vars)
    short = mem["n_obs"].values < 2
    assert short.any() and not short.all()
    for k in mem.data_vars:
        assert lazy[k].dims == mem[k].dims and lazy[k].attrs == mem[k].attrs, k
        np.testing.assert_array_equal(lazy[k].values[short], mem[k].values[short], err_msg=k)
    for k in ("converged", "n_obs"):
        np.testing.assert_array_equal(lazy[k].values, mem[k].values, err_msg=k)
    for k in ("theta", "sigma2", "mu", "obs_var", "loglik"):
        assert_close(lazy[k].values, mem[k].values, "parallel", "float64", what=k)
    mem_short = [w for w in mem_warnings if SHORT in w]
    assert len(mem_short) == 1, mem_warnings
    lazy_short = [w for w in lazy_warnings if SHORT in w]
    assert lazy_short, lazy_warnings
    for w in lazy_short:
        assert re.fullmatch(r"fit_ou: series .* have fewer .* marked not converged", w), w
    named = re.match(r"fit_ou: series (.*) have", mem_short[0])[1]
    groups = [re.match(r"fit_ou: series (.*) have", w)[1] for w in lazy_short]
    assert all(g in named for g in groups), (groups, named)  # the chunks in any order
    assert ", ".join(sorted(groups, key=named.index)) == named
    return lazy_warnings


@pytest.mark.parametrize(
    "coords, observed, name",
    [
        pytest.param(("a", "b", "c"), 1, "station='b'", id="text-1obs"),
        pytest.param(("a", "b", "c"), 0, "station='b'", id="text-0obs"),
        pytest.param((10, 20, 30), 1, "station=20", id="numbers"),
        pytest.param((1.5, np.nan, 3.5), 1, "station=nan", id="nan-label"),
        pytest.param(None, 1, "station=1", id="no-coordinate"),
    ],
)
def test_a_chunk_of_one_short_series_gives_the_in_memory_fit(coords, observed, name):
    lazy_warnings = assert_as_in_memory(stations(coords, observed=observed), {"station": 1})
    assert f"fit_ou: series {name} {SHORT}marked not converged" in lazy_warnings


def test_the_short_series_keep_their_starting_values_and_are_not_converged():
    """All four parameters free, a chunk of two short series (0 and 1 observation): their
    values are the starting values the in-memory fit keeps (finite), not converged."""
    da = stations(("a", "b", "c", "d"), short=(0, 1), observed=(0, 1))
    lazy_warnings = assert_as_in_memory(da, {"station": (2, 2)}, fix=None)
    assert f"fit_ou: series station='a', station='b' {SHORT}marked not converged" in lazy_warnings
    lazy, _ = fit(da.chunk({"station": (2, 2)}), fix=None)
    assert lazy["converged"].values.tolist() == [0, 0, 1, 1]
    assert lazy["n_obs"].values.tolist() == [0.0, 1.0, 30.0, 30.0]
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert np.isfinite(lazy[p].values).all(), p


@pytest.mark.parametrize(
    "options",
    [dict(robust=True), dict(init={"sigma2": 2.0}), dict(stderr=False)],
    ids=["robust", "init", "no-stderr"],
)
def test_a_chunk_of_short_series_with_options(options):
    da = stations(("a", "b", "c", "d"), short=(0, 1), observed=(0, 1))
    assert_as_in_memory(da, {"station": 2}, **options)


def test_chunks_of_short_series_beside_chunks_mixing_both():
    """Five stations in chunks (2, 3): the first holds only short series (0 and 1 observation),
    the second a short one between two to fit."""
    da = stations(("a", "b", "c", "d", "e"), short=(0, 1, 3), observed=(1, 0, 1))
    lazy_warnings = assert_as_in_memory(da, {"station": (2, 3)})
    assert f"fit_ou: series station='a', station='b' {SHORT}marked not converged" in lazy_warnings
    assert f"fit_ou: series station='d' {SHORT}marked not converged" in lazy_warnings


def test_a_chunk_of_short_series_over_two_dims():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(30, 3, 2)).cumsum(0) + rng.normal(size=(30, 3, 2))
    z[1:, 1, :] = np.nan  # station 'y': one value at each level
    z[:, 2, 1] = np.nan  # station 'z', level 2: none
    da = xr.DataArray(
        z,
        dims=("time", "station", "level"),
        coords={"station": ["x", "y", "z"], "level": [1, 2]},
    )
    lazy_warnings = assert_as_in_memory(da, {"station": 1})
    both = "(station='y', level=1), (station='y', level=2)"
    assert f"fit_ou: series {both} {SHORT}marked not converged" in lazy_warnings
    assert f"fit_ou: series (station='z', level=2) {SHORT}marked not converged" in lazy_warnings


def test_a_chunk_with_a_series_to_fit_warns_as_in_memory():
    """Chunks of two stations: the chunk holding 'b' also holds 'a'."""
    assert_as_in_memory(stations(("a", "b", "c", "d")), {"station": 2})


ALL_SHORT = re.escape(
    "z: expected at least 2 observed values in a series to fit, got at most 1 in every series "
    "(station='a', station='b', station='c')"
)


def test_in_memory_array_of_short_series_names_every_series():
    with pytest.raises(ValueError, match=ALL_SHORT):
        stations(short=(0, 1, 2)).kalman.fit_ou(fix=FIX)


@pytest.mark.parametrize("chunks", [1, 2, -1], ids=["chunks-1", "chunks-2", "one-chunk"])
def test_chunked_array_of_short_series_is_refused_when_computed(chunks):
    """No chunk sees the others: the fit stays lazy and its results, each of them, raise the
    in-memory error when computed."""
    da = stations(short=(0, 1, 2), observed=(1, 0, 1)).chunk({"station": chunks})
    ds = da.kalman.fit_ou(fix=FIX)
    for name in ("sigma2", "sigma2_se", "loglik", "converged", "n_obs"):
        with warnings.catch_warnings(), pytest.raises(ValueError, match=ALL_SHORT):
            warnings.simplefilter("ignore", UserWarning)  # each chunk's, fitted before the check
            ds[name].compute(scheduler="synchronous")
    with pytest.raises(ValueError, match=ALL_SHORT):  # the chunks' leniency ended with them
        da.compute().kalman.fit_ou(fix=FIX)


def test_chunked_refusal_names_five_series_and_counts_the_rest():
    rng = np.random.default_rng(2)
    z = np.full((20, 4, 2), np.nan)
    z[0] = rng.normal(size=(4, 2))
    da = xr.DataArray(z, dims=("time", "station", "level"), coords={"level": [10, 20]})
    expected = re.escape(
        "got at most 1 in every series ((station=0, level=10), (station=0, level=20), "
        "(station=1, level=10), (station=1, level=20), (station=2, level=10) and 3 more)"
    )
    with pytest.raises(ValueError, match=expected):
        da.kalman.fit_ou(fix=FIX)
    with warnings.catch_warnings(), pytest.raises(ValueError, match=expected):
        warnings.simplefilter("ignore", UserWarning)
        da.chunk({"station": 1}).kalman.fit_ou(fix=FIX).compute(scheduler="synchronous")
