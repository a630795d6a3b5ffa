"""Fitting a dask-chunked DataArray (``da.kalman.fit_ou``) whose chunks hold constant series
(every observed value equal): every chunk, even one holding only such series, gives what the
in-memory fit gives (starting values, not converged, the same warning naming the series by
their coordinates); an array without a series to fit (every series constant, or each constant or
with fewer than 2 observations) is refused in memory and, when computed, chunked alike, with the
same message."""

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
CONSTANT = "are constant (no noise to estimate); their parameters stay at the starting values and "
SHORT = "have fewer than 2 observations"


def stations(coords=("a", "b", "c"), constant=(1,), short=(), T=30, seed=0):
    """Random walks plus noise over ``station``; the series at positions ``constant`` hold one
    value each (2.5, -4.0, 7.25, ...; the first of them missing at time 0), those at ``short``
    one observed value only."""
    rng = np.random.default_rng(seed)
    n = 3 if coords is None else len(coords)
    z = rng.normal(size=(T, n)).cumsum(0) + rng.normal(size=(T, n))
    for k, j in enumerate(constant):
        z[:, j] = (2.5, -4.0, 7.25, 1e-3, -0.5)[k % 5]
    if constant:
        z[0, constant[0]] = np.nan
    for j in short:
        z[1:, j] = np.nan
    c = {} if coords is None else {"station": list(coords)}
    return xr.DataArray(z, dims=("time", "station"), coords=c)


def fit(da, fix=FIX, **options):
    """The computed fit and its warnings' texts (:func:`tests.helpers.fit_dask_recorded`)."""
    return fit_dask_recorded(da, fix, **options)


def unfit_warnings(texts):
    return [w for w in texts if CONSTANT in w]


def assert_as_in_memory(da, chunks, fix=FIX, **options):
    """The chunked fit against the in-memory one: the same coordinates, attrs and layout; the
    series not fitted (constant, or with fewer than 2 observations) equal to the bit in every
    variable; ``converged`` and ``n_obs`` equal; the fitted series' estimates and
    log-likelihoods within the ``parallel`` tolerance (each chunk's series are fitted as their
    own batch: docs/api.md, "Dask"). Returns both fits' warnings about the series not fitted."""
    mem, mem_warnings = fit(da, fix, **options)
    lazy, lazy_warnings = fit(da.chunk(chunks), fix, **options)
    assert lazy.attrs == mem.attrs
    xr.testing.assert_identical(lazy.coords.to_dataset(), mem.coords.to_dataset())
    assert list(lazy.data_vars) == list(mem.data_vars)
    unfit = mem["converged"].values == 0
    assert unfit.any() and not unfit.all()
    for k in mem.data_vars:
        assert lazy[k].dims == mem[k].dims and lazy[k].attrs == mem[k].attrs, k
        np.testing.assert_array_equal(lazy[k].values[unfit], mem[k].values[unfit], err_msg=k)
    for k in ("converged", "n_obs"):
        np.testing.assert_array_equal(lazy[k].values, mem[k].values, err_msg=k)
    for k in ("theta", "sigma2", "mu", "obs_var", "loglik"):
        assert_close(lazy[k].values, mem[k].values, "parallel", "float64", what=k)
    return unfit_warnings(mem_warnings), unfit_warnings(lazy_warnings)


def said(names, short=None):
    """The fit's warning about the constant series ``names`` (and ``short`` ones)."""
    few = f"series {short} {SHORT}; " if short else ""
    return f"fit_ou: {few}series {names} {CONSTANT}are marked not converged"


@pytest.mark.parametrize(
    "coords, name",
    [
        pytest.param(("a", "b", "c"), "station='b'", id="text"),
        pytest.param((10, 20, 30), "station=20", id="numbers"),
        pytest.param(None, "station=1", id="no-coordinate"),
    ],
)
def test_a_chunk_of_one_constant_series_gives_the_in_memory_fit(coords, name):
    mem, lazy = assert_as_in_memory(stations(coords), {"station": 1})
    assert mem == lazy == [said(name)]


def test_the_constant_series_keep_their_starting_values_and_are_not_converged():
    """All four parameters free, a chunk of two constant series (2.5 and -4.0): their values
    are the starting values the in-memory fit keeps (finite), not converged."""
    da = stations(("a", "b", "c", "d"), constant=(0, 1))
    mem, lazy = assert_as_in_memory(da, {"station": (2, 2)}, fix=None)
    assert mem == lazy == [said("station='a', station='b'")]
    ds, _ = fit(da.chunk({"station": (2, 2)}), fix=None)
    assert ds["converged"].values.tolist() == [0, 0, 1, 1]
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert np.isfinite(ds[p].values).all(), p


@pytest.mark.parametrize(
    "options",
    [dict(robust=True), dict(init={"sigma2": 2.0}), dict(stderr=False)],
    ids=["robust", "init", "no-stderr"],
)
def test_a_chunk_of_constant_series_with_options(options):
    da = stations(("a", "b", "c", "d"), constant=(2, 3))
    mem, lazy = assert_as_in_memory(da, {"station": 2}, **options)
    assert mem == lazy == [said("station='c', station='d'")]


def test_a_chunk_of_constant_and_short_series_beside_one_to_fit():
    """Chunks (2, 2): the first holds a constant series and a short one, the second two to fit;
    the in-memory warning names both kinds, as the first chunk's does."""
    da = stations(("a", "b", "c", "d"), constant=(0,), short=(1,))
    mem, lazy = assert_as_in_memory(da, {"station": 2})
    assert mem == lazy == [said("station='a'", short="station='b'")]


def test_chunks_of_constant_series_beside_chunks_mixing_both():
    """Five stations in chunks (2, 3): the first holds only constant series, the second a
    constant one between two to fit; the chunks' warnings together name the in-memory ones."""
    da = stations(("a", "b", "c", "d", "e"), constant=(0, 1, 3))
    mem, lazy = assert_as_in_memory(da, {"station": (2, 3)})
    assert mem == [said("station='a', station='b', station='d'")]
    assert sorted(lazy) == [said("station='a', station='b'"), said("station='d'")]


def test_a_chunk_of_constant_series_over_two_dims():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(30, 3, 2)).cumsum(0) + rng.normal(size=(30, 3, 2))
    z[:, 1, :] = 3.0  # station 'y': constant at each level
    z[::2, 2, 1] = -1.0  # station 'z', level 2: every other value, all equal
    z[1::2, 2, 1] = np.nan
    da = xr.DataArray(
        z, dims=("time", "station", "level"), coords={"station": ["x", "y", "z"], "level": [1, 2]}
    )
    mem, lazy = assert_as_in_memory(da, {"station": 1})
    y = "(station='y', level=1), (station='y', level=2)"
    assert mem == [said(f"{y}, (station='z', level=2)")]
    assert sorted(lazy) == [said(y), said("(station='z', level=2)")]


def refusal(da, chunks, **options):
    """The in-memory fit's error and, the fit of ``da`` in ``chunks`` staying lazy, each of its
    results' (every chunk fitted, with its warnings, before the whole array is refused)."""
    with pytest.raises(ValueError) as info:
        da.kalman.fit_ou(fix=FIX, **options)
    expected = str(info.value)
    ds = da.chunk({"station": chunks}).kalman.fit_ou(fix=FIX, **options)
    for name in ("sigma2", "sigma2_se", "loglik", "converged", "n_obs"):
        with warnings.catch_warnings(), pytest.raises(ValueError) as info:
            warnings.simplefilter("ignore", UserWarning)
            ds[name].compute(scheduler="synchronous")
        assert str(info.value) == expected, name
    return expected


@pytest.mark.parametrize("chunks", [1, 2, -1], ids=["chunks-1", "chunks-2", "one-chunk"])
def test_an_array_of_constant_series_is_refused_chunked_as_in_memory(chunks):
    """The message gives the first observed value of the array (time first, then series): here
    station 'b' (-4.0) at time 0, station 'a' (2.5) being missing there."""
    da = stations(constant=(0, 1, 2))
    msg = refusal(da, chunks)
    assert msg.startswith("z: every observed value is -4.0 (a constant series): "), msg
    with pytest.raises(ValueError, match=re.escape(msg)):  # the chunks' leniency ended with them
        da.compute().kalman.fit_ou(fix=FIX)


@pytest.mark.parametrize("chunks", [(2, 2), (1, 3), 1], ids=["2-2", "1-3", "chunks-1"])
def test_constant_and_short_series_without_one_to_fit_are_refused_chunked_as_in_memory(chunks):
    """Chunks (2, 2): the first only constant series, the second only short ones; nothing to fit
    in any, so the whole array is refused naming both kinds."""
    da = stations(("a", "b", "c", "d"), constant=(0, 1), short=(2, 3))
    msg = refusal(da, chunks)
    assert msg == (
        "z: expected a series to fit (2 or more observed values, not all equal), got none: "
        "series station='c', station='d' have fewer than 2 observations; "
        "series station='a', station='b' are constant (no noise to estimate)"
    ), msg


def test_refusal_names_five_series_of_each_kind_and_counts_the_rest():
    z = np.full((20, 4, 3), 1.5)
    z[1:, :2, :] = np.nan  # stations 0 and 1: one value at each level
    da = xr.DataArray(z, dims=("time", "station", "level"), coords={"level": [10, 20, 30]})
    msg = refusal(da, 1, robust=True)
    assert msg == (
        "z: expected a series to fit (2 or more observed values, not all equal), got none: "
        "series (station=0, level=10), (station=0, level=20), (station=0, level=30), "
        "(station=1, level=10), (station=1, level=20) and 1 more have fewer than 2 "
        "observations; series (station=2, level=10), (station=2, level=20), "
        "(station=2, level=30), (station=3, level=10), (station=3, level=20) and 1 more are "
        "constant (no noise to estimate)"
    ), msg


def test_joint_fits_are_in_memory_for_chunked_data():
    """``joint=True`` fits one parameter set to the whole array (not chunk-wise): chunked data
    give the in-memory fit, and an array of constant series is refused as in memory, at once."""
    da = stations(("a", "b", "c", "d"), constant=(1,))
    mem = da.kalman.fit_ou(fix=FIX, joint=True)
    lazy = da.chunk({"station": 1}).kalman.fit_ou(fix=FIX, joint=True)
    xr.testing.assert_identical(lazy.compute(), mem)
    flat = stations(constant=(0, 1, 2))
    with pytest.raises(ValueError) as info:
        flat.kalman.fit_ou(fix=FIX, joint=True)
    with pytest.raises(ValueError, match=re.escape(str(info.value))):
        flat.chunk({"station": 1}).kalman.fit_ou(fix=FIX, joint=True)
