"""Messages name the user's argument and what it holds: an inf in dask-chunked data at its
coordinates in the whole array (as in memory); a DataFrame or Series column of text given to
``kalmanscan.filter``/``smooth``/``loglik`` by name and dtype (no repr of the data); a torch
device this torch cannot use as ``device``; ``OUModel.to_dataset`` with parameters per step (laid
out over time, as ``filter`` reads them); a single series not named in ``fit_ou``'s warnings."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import kalmanscan as ks

pd = pytest.importorskip("pandas")


# --- an inf in dask-chunked data
@pytest.fixture(scope="module")
def with_inf():
    xr = pytest.importorskip("xarray")
    pytest.importorskip("dask")
    import kalmanscan.xarray  # noqa: F401

    v = np.random.default_rng(0).normal(size=(30, 3)).cumsum(0)
    v[7, 1] = np.inf  # station 'b' at 2000-01-08: index (7, 0) of the chunk {'station': 1}
    return xr.DataArray(
        v,
        dims=("time", "station"),
        coords={"time": pd.date_range("2000", periods=30), "station": list("abc")},
    )


def _error(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as info:
            fn()
    return str(info.value)


@pytest.mark.parametrize("chunks", [{"station": 1}, {"station": 2}, {"time": 10, "station": 1}])
@pytest.mark.parametrize("op", ["filter", "forecast", "fit_ou", "fit_ou_joint"])
def test_dask_inf_named_at_its_coordinates(with_inf, op, chunks):
    run = {
        "filter": lambda a: a.kalman.filter(sigma2=1.0, obs_var=1.0).compute(),
        "forecast": lambda a: a.kalman.forecast(sigma2=1.0, obs_var=1.0, steps=1).compute(),
        "fit_ou": lambda a: a.kalman.fit_ou().compute(),
        "fit_ou_joint": lambda a: a.kalman.fit_ou(joint=True).compute(),
    }[op]
    mem = _error(lambda: run(with_inf))
    assert mem.startswith("da: expected finite values or NaN (missing), got inf at time=2000-01-08")
    assert mem.endswith("station='b'")
    assert _error(lambda: run(with_inf.chunk(chunks))) == mem


def test_dask_inf_along_a_dim_without_coordinates(with_inf):
    da = with_inf.drop_vars("station")
    mem = _error(lambda: da.kalman.filter(sigma2=1.0, obs_var=1.0))
    assert mem.endswith(", station=1")
    assert (
        _error(lambda: da.chunk({"station": 1}).kalman.filter(sigma2=1.0, obs_var=1.0).compute())
        == mem
    )
    assert _error(lambda: da.chunk({"station": 1}).kalman.fit_ou().compute()) == mem


# --- text columns given to the filter core
FRAME = pd.DataFrame({"y": np.arange(1000.0), "station": ["abc"] * 1000})


@pytest.mark.parametrize("fn", ["filter", "smooth", "loglik"])
def test_core_names_a_text_column_and_its_dtype(fn):
    call = getattr(ks, fn)
    dtype = FRAME["station"].dtype
    want = f"z: expected numeric columns (NaN = missing), got column 'station' of dtype {dtype}"
    with pytest.raises(TypeError) as info:
        call(FRAME, 1.0, 1.0, 1.0)
    assert str(info.value) == want
    with pytest.raises(TypeError) as model:
        ks.OUModel().filter(FRAME)
    assert str(model.value) == want
    # a column of booleans or dates likewise, and a parameter by its own name
    flags = FRAME.assign(station=FRAME["y"] > 3)
    with pytest.raises(TypeError, match=re.escape("got column 'station' of dtype bool")):
        call(flags, 1.0, 1.0, 1.0)
    with pytest.raises(
        TypeError, match=r"^obs_var: expected numeric (values|columns), got .* of dtype"
    ):
        call(FRAME[["y"]], pd.Series(["a"] * 1000), 1.0, 1.0)


@pytest.mark.parametrize("name", [None, "station"])
def test_core_and_model_name_a_text_series(name):
    s = pd.Series(["abc"] * 50, name=name)
    what = "a Series" if name is None else f"Series {name!r}"
    want = f"z: expected numeric values (NaN = missing), got {what} of dtype {s.dtype}"
    for call in (lambda: ks.filter(s, 1.0, 1.0, 1.0), lambda: ks.OUModel().filter(s)):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == want
    # numeric frames and series are read as before
    assert ks.loglik(FRAME[["y"]], 1.0, 1.0, 1.0).shape == (1,)


# --- a device this torch cannot use
Y = np.random.default_rng(1).normal(size=50).cumsum()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
@pytest.mark.parametrize("robust", [False, True])
def test_fit_ou_cuda_without_cuda_names_device(robust):
    with pytest.raises(ValueError) as info:
        ks.fit_ou(Y, device="cuda", robust=robust)
    msg = str(info.value)
    assert msg.startswith("device: expected a device this torch can use")
    assert "got 'cuda'" in msg and "CUDA" in msg
    with pytest.raises(ValueError, match=r"^device: .* got 'cuda:0'"):
        ks.fit_ou(Y, device=torch.device("cuda:0"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_gross_runs_cuda_without_cuda_names_device():
    from kalmanscan.timeseries.robust import gross_runs

    with pytest.raises(ValueError, match=r"^device: expected a device this torch can use"):
        gross_runs(Y[:, None], device="cuda")


@pytest.mark.parametrize("device", ["gpu0", 3.5, ""])
def test_fit_ou_device_of_no_known_kind_names_device(device):
    with pytest.raises((ValueError, TypeError)) as info:
        ks.fit_ou(Y, device=device)
    assert str(info.value).startswith("device: expected"), str(info.value)
    assert repr(device) in str(info.value)


def test_fit_ou_cpu_device_still_fits():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ks.fit_ou(Y, device="cpu", fix={"theta": 0.0, "mu": 0.0})
        b = ks.fit_ou(Y, device=torch.device("cpu"), fix={"theta": 0.0, "mu": 0.0})
    assert a.params == b.params


# --- OUModel.to_dataset with parameters per step
def test_to_dataset_lays_out_parameters_per_step():
    pytest.importorskip("xarray")
    z = np.random.default_rng(2).normal(size=20).cumsum()
    obs_var = np.linspace(0.1, 2, 20)
    m = ks.OUModel(theta=0.1, sigma2=1.0, obs_var=obs_var)
    ds = m.to_dataset(z)
    assert ds["obs_var"].dims == ("time",)
    np.testing.assert_array_equal(ds["obs_var"].values, obs_var)
    np.testing.assert_array_equal(ds["variance"].values, m.filter(z).var)
    np.testing.assert_array_equal(ds["smoothed_mean"].values, m.smooth(z).mean)
    assert "obs_var" not in ds.attrs and ds.attrs["sigma2"] == 1.0
    # per step and series, [T, S] and [T, 1]
    Z = np.random.default_rng(3).normal(size=(20, 2)).cumsum(0)
    for ov in (np.linspace(0.1, 2, 40).reshape(20, 2), obs_var[:, None]):
        m2 = ks.OUModel(sigma2=1.0, obs_var=ov)
        ds2 = m2.to_dataset(Z)
        assert ds2["obs_var"].dims == ("time", "series")
        np.testing.assert_array_equal(ds2["obs_var"].values, np.broadcast_to(ov, (20, 2)))
        np.testing.assert_array_equal(ds2["mean"].values, m2.filter(Z).mean)


def test_to_dataset_refuses_a_parameter_shape_naming_what_it_takes():
    pytest.importorskip("xarray")
    z = np.zeros(20)
    with pytest.raises(ValueError) as info:
        ks.OUModel(obs_var=np.ones(7)).to_dataset(z)
    msg = str(info.value)
    assert msg.startswith("obs_var: expected") and "(7,)" in msg and "dims []" not in msg


# --- a single series is not named
def test_single_series_not_named_in_non_convergence_warning():
    y = Y + np.random.default_rng(4).normal(size=50)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ks.fit_ou(y, max_iter=1)
    texts = [str(x.message) for x in w if "did not converge" in str(x.message)]
    assert texts == ["fit_ou: 1 of 1 fits did not converge (iteration limit reached)"]
    # several series are named
    Z = np.stack([y, y[::-1] * 2], 1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ks.fit_ou(Z, max_iter=1)
    assert any(str(x.message).endswith(": series 0, 1") for x in w)
