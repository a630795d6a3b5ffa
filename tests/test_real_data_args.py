"""Issue 22, one argument layer for every entry point: masked arrays are missing data and tensors
with torch's negative bit are read by value (item 12); strings, complex numbers and datetimes are
refused alike by kalmanscan.filter, OUModel, fit_ou and the xarray accessor; zero-length records,
huge forecasts, reversed and big-endian arrays and a None parameter give messages naming the
argument (item 13)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel

Z = np.array([1.0, 2.0, -999.0, 2.5, 3.0])
MASK = np.array([0, 0, 1, 0, 0], bool)
PARAMS = dict(obs_var=0.5, decay=1.0, process_var=0.2)


def _nan_z():
    z = Z.copy()
    z[MASK] = np.nan
    return z


# --- item 12: masked arrays, the negative bit -----------------------------------------------------
def test_masked_values_are_missing_in_filter():
    got = ks.filter(np.ma.masked_array(Z, mask=MASK), **PARAMS)
    want = ks.filter(_nan_z(), **PARAMS)
    np.testing.assert_array_equal(got.mean, want.mean)
    np.testing.assert_array_equal(got.var, want.var)
    assert got.loglik == want.loglik


def test_masked_values_are_missing_in_the_model_and_fit():
    m = OUModel(theta=0.0, sigma2=0.2, obs_var=0.5)
    np.testing.assert_array_equal(
        m.filter(np.ma.masked_array(Z, mask=MASK)).mean, m.filter(_nan_z()).mean
    )
    rng = np.random.default_rng(3)
    z = np.cumsum(rng.normal(size=40)) + rng.normal(size=40)
    mask = np.zeros(40, bool)
    mask[[5, 17]] = True
    filled = np.where(mask, -999.0, z)
    a = ks.fit_ou(np.ma.masked_array(filled, mask=mask), fix={"theta": 0.0, "mu": 0.0})
    b = ks.fit_ou(np.where(mask, np.nan, z), fix={"theta": 0.0, "mu": 0.0})
    assert a.n_obs == 38 and a.params["obs_var"] == pytest.approx(b.params["obs_var"])


def test_a_masked_parameter_is_refused_by_name():
    with pytest.raises(ValueError, match="obs_var"):
        ks.filter(
            Z[:2], obs_var=np.ma.masked_array([0.5, 0.5], mask=[0, 1]), decay=1.0, process_var=0.2
        )


@pytest.mark.parametrize("backend", ["auto", "sequential"])
def test_a_tensor_with_the_negative_bit_is_read_by_value(backend):
    base = torch.tensor([1.0, 2.0, 4.0, 3.0], dtype=torch.float64)
    neg = torch._neg_view(base)
    assert neg.is_neg()
    got = ks.filter(neg, **PARAMS, backend=backend)
    want = ks.filter(-base.clone(), **PARAMS, backend=backend)
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)


# --- item 13: every entry point refuses the same things -------------------------------------------
BAD = {
    "complex": np.arange(4.0) + 1j,
    "datetime": np.arange(4).astype("datetime64[D]"),
    "strings": np.array(["1", "2", "3", "4"]),
    "string-list": ["1", "2", "3", "4"],
    "bool": np.array([True, False, True, True]),
}


def _entry_points():
    m = OUModel(sigma2=1.0, obs_var=1.0)
    points = {
        "ks.filter": lambda z: ks.filter(z, obs_var=1.0, decay=1.0, process_var=1.0),
        "OUModel.filter": lambda z: m.filter(z),
        "OUModel.forecast": lambda z: m.forecast(z, steps=2),
        "fit_ou": lambda z: ks.fit_ou(z),
    }
    try:
        import xarray as xr

        import kalmanscan.xarray  # noqa: F401

        points["da.kalman.filter"] = lambda z: xr.DataArray(z, dims="time").kalman.filter(
            sigma2=1.0, obs_var=1.0
        )
        points["da.kalman.fit_ou"] = lambda z: xr.DataArray(z, dims="time").kalman.fit_ou()
    except ImportError:  # pragma: no cover - xarray is an extra
        pass
    return points


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("entry", list(_entry_points()))
def test_strings_complex_datetimes_and_booleans_are_refused_everywhere(entry, bad):
    with _no_complex_warning():
        with pytest.raises(
            TypeError, match=r"^(z|da): expected (a real number or array of )?real numbers"
        ):
            _entry_points()[entry](BAD[bad])


class _no_complex_warning:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", np.exceptions.ComplexWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_a_pandas_frame_with_a_text_column_is_refused_by_name():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"y": [1.0, 2.0, 3.0], "label": ["a", "b", "c"]})
    with pytest.raises(TypeError, match="column 'label'"):
        ks.fit_ou(df)


@pytest.mark.parametrize("how", ["reversed", "big-endian", "both"])
def test_reversed_and_big_endian_arrays_equal_their_native_copies(how):
    z = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    view = {"reversed": z[::-1], "big-endian": z.astype(">f8"), "both": z.astype(">f8")[::-1]}[how]
    native = np.ascontiguousarray(view, dtype=np.float64)
    for f in (
        lambda a: ks.filter(a, **PARAMS).mean,
        lambda a: OUModel(sigma2=0.2, obs_var=0.5).filter(a).mean,
        lambda a: ks.filter(np.ones(5), obs_var=a, decay=1.0, process_var=0.2).mean,
    ):
        np.testing.assert_array_equal(f(view), f(native))


def test_zero_length_dataarray_is_refused():
    xr = pytest.importorskip("xarray")
    import kalmanscan.xarray  # noqa: F401

    da = xr.DataArray(np.zeros(0), dims="time")
    with pytest.raises(ValueError, match="da: expected at least one step along 'time', got 0"):
        da.kalman.filter(sigma2=1.0, obs_var=1.0, forecast_at=[5])


def test_huge_forecasts_are_refused_before_allocating():
    m = OUModel(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match="steps: expected at most 1000000 forecast steps"):
        m.forecast(np.ones(3), steps=10**9)
    with pytest.raises(ValueError, match="at most 1000000"):
        m.forecast(np.ones(3), at=np.arange(3.0, 3.0 + 2_000_000))


def test_a_none_parameter_is_named():
    with pytest.raises(TypeError, match="theta: expected a real number"):
        ks.discretize_ou(None, 1.0, 1.0)
    with pytest.raises(TypeError, match="sigma2: expected a real number"):
        OUModel(sigma2=None, obs_var=1.0)


def test_complex_parameters_are_refused_not_truncated():
    with pytest.raises(TypeError, match="obs_var"):
        OUModel(sigma2=1.0, obs_var=1.0 + 2j)
