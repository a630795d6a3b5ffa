"""Inputs as users hold them, from the input audit: masked, textual, boolean and complex
parameters of the xarray accessor; pandas' default labels ``0, 1, ...`` against data that carry
labels; masked 8/16-bit integer data; a DataFrame's memory layout in ``fit_ou``; ``OUModel``
tensor parameters; no series at all; meta-device tensors; messages for masked parameters and
integers beyond int64."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")
sm = pytest.importorskip("statsmodels.api")

import kalmanscan as ks  # noqa: E402
import kalmanscan.dense as kd  # noqa: E402
import kalmanscan.xarray  # noqa: E402, F401
from kalmanscan.timeseries import OUModel, load_nile  # noqa: E402


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def macro():
    """US macro data (statsmodels): inflation, unemployment and the real interest rate,
    quarterly 1959-2009, as a DataFrame with dates."""
    md = sm.datasets.macrodata.load_pandas().data
    idx = pd.PeriodIndex.from_fields(
        year=md.year.astype(int), quarter=md.quarter.astype(int), freq="Q"
    ).to_timestamp()
    return pd.DataFrame(md[["infl", "unemp", "realint"]].to_numpy(), index=idx,
                        columns=["infl", "unemp", "realint"])  # fmt: skip


@pytest.fixture(scope="module")
def stations(macro):
    return xr.DataArray(
        macro.to_numpy(),
        dims=("time", "var"),
        coords={"time": macro.index, "var": list(macro.columns)},
    )


# --- 1. the accessor reads parameters as ks.filter does ---------------------------------------
def test_the_accessor_refuses_a_masked_parameter_naming_its_index(stations):
    ov = np.ma.masked_array([0.5, 0.5, 1e20], mask=[0, 0, 1])  # a netCDF fill value
    msg = r"obs_var: expected a number at every index .*got a masked value at index \(2,\)"
    with pytest.raises(ValueError, match=msg):
        stations.kalman.filter(sigma2=1.0, obs_var=ov)  # was: obs_var 1e20 for "realint"
    with pytest.raises(ValueError, match=r"fix\['obs_var'\]: .*masked value at index \(2,\)"):
        stations.kalman.fit_ou(fix={"theta": 0.0, "obs_var": ov})
    with pytest.raises(ValueError, match=msg):  # the same message as ks.filter's
        ks.filter(stations.to_numpy(), obs_var=ov, decay=1.0, process_var=1.0)


@pytest.mark.parametrize(
    "sigma2",
    ["2.5", True, np.array([1 + 5j, 1.0, 1.0]), np.array(["1", "2", "3"])],
    ids=["text", "bool", "complex", "text-array"],
)
def test_the_accessor_refuses_text_booleans_and_complex_parameters(stations, sigma2):
    with pytest.raises(TypeError, match=r"sigma2: expected a real number or array of real"):
        stations.kalman.filter(sigma2=sigma2, obs_var=0.5)  # was: 2.5, 1.0, the real part


def test_the_accessor_refuses_a_boolean_dataarray_parameter_before_computing(stations):
    pytest.importorskip("dask")
    flags = xr.DataArray([True, False, True], dims="var", coords={"var": stations["var"].values})
    with pytest.raises(TypeError, match=r"obs_var: expected a real number .* dtype bool"):
        # was: a lazy Dataset, the error only when computed
        stations.chunk({"var": 1}).kalman.filter(sigma2=1.0, obs_var=flags)


# --- 2. pandas' default labels 0, 1, ... are labels where the data's labels hold them -------
@pytest.fixture(scope="module")
def headerless(macro):
    """A CSV read without a header (columns 0, 1, 2: a RangeIndex), two columns picked in
    another order: the data's columns are labelled 1, 0."""
    raw = pd.DataFrame(macro[["infl", "unemp"]].to_numpy())
    return raw, raw[[1, 0]]


def test_a_series_labelled_0_1_goes_to_the_columns_it_names(headerless):
    raw, df = headerless
    ov = pd.Series({0: 4.0, 1: 0.25})  # pandas stores these labels as a RangeIndex
    assert isinstance(ov.index, pd.RangeIndex)
    want = ks.filter(df.to_numpy(), obs_var=np.array([0.25, 4.0]), decay=1.0, process_var=1.0)
    got = ks.filter(df, obs_var=ov, decay=1.0, process_var=1.0)  # was: by position
    np.testing.assert_array_equal(got.mean, want.mean)
    same = pd.Series([4.0, 0.25], index=pd.Index([0, 1]))  # the same labels, another class
    got = ks.filter(df, obs_var=same, decay=1.0, process_var=1.0)
    np.testing.assert_array_equal(got.mean, want.mean)
    # a statistic of the full table is labelled by its columns 0, 1
    var = raw.var()
    got = ks.filter(df, obs_var=var, decay=1.0, process_var=1.0)
    want = ks.filter(df.to_numpy(), obs_var=var.to_numpy()[::-1], decay=1.0, process_var=1.0)
    np.testing.assert_array_equal(got.mean, want.mean)
    got = OUModel(sigma2=1.0, obs_var=ov).filter(df)
    want = OUModel(sigma2=1.0, obs_var=np.array([0.25, 4.0])).filter(df.to_numpy())
    np.testing.assert_array_equal(got.mean, want.mean)


def test_fit_ou_fixes_a_value_labelled_0_1_to_the_column_it_names(headerless):
    _, df = headerless
    ov = pd.Series({0: 4.0, 1: 0.25})
    got = _quiet(ks.fit_ou, df, fix={"theta": 0.0, "mu": 0.0, "obs_var": ov})
    want = _quiet(
        ks.fit_ou, df.to_numpy(), fix={"theta": 0.0, "mu": 0.0, "obs_var": np.array([0.25, 4.0])}
    )
    np.testing.assert_array_equal(got.params["obs_var"], [0.25, 4.0])  # was: [4.0, 0.25]
    np.testing.assert_array_equal(got.params["sigma2"], want.params["sigma2"])


def test_a_dataframe_parameter_with_default_columns_goes_to_the_columns_it_names(headerless):
    _, df = headerless
    T = len(df)
    pv = pd.DataFrame({0: np.full(T, 0.5), 1: np.full(T, 2.0)})  # columns RangeIndex(2)
    want = ks.filter(df.to_numpy(), obs_var=1.0, decay=1.0, process_var=np.tile([2.0, 0.5], (T, 1)))
    got = ks.filter(df, obs_var=1.0, decay=1.0, process_var=pv)  # was: by position
    np.testing.assert_array_equal(got.mean, want.mean)


def test_the_accessor_matches_a_series_labelled_0_1_to_coordinates_1_0(macro):
    da = xr.DataArray(
        macro[["unemp", "infl"]].to_numpy(), dims=("time", "st"), coords={"st": [1, 0]}
    )
    ov = pd.Series({0: 4.0, 1: 0.25})
    got = da.kalman.filter(sigma2=1.0, obs_var=ov)["obs_var"].values
    np.testing.assert_array_equal(got, [0.25, 4.0])  # was: [4.0, 0.25]


# --- 3. a Series indexed like a default index gives one value per step ----------------------
def test_a_series_indexed_like_a_default_index_is_one_value_per_step(macro):
    df = macro.reset_index(drop=True)  # 203 steps x 3 series, index 0, 1, ...
    pv = pd.Series(np.where(np.arange(len(df)) < 100, 0.1, 1.0), index=df.index)
    want = ks.filter(df.to_numpy(), 0.5, 1.0, pv.to_numpy()[:, None])
    got = ks.filter(df, 0.5, 1.0, pv)  # was: a shape error
    np.testing.assert_array_equal(got.mean, want.mean)
    got = OUModel(sigma2=pv, obs_var=0.5).filter(df)
    want = OUModel(sigma2=pv.to_numpy()[:, None], obs_var=0.5).filter(df.to_numpy())
    np.testing.assert_array_equal(got.mean, want.mean)


def test_a_series_that_fits_both_axes_is_refused_naming_both(macro):
    sq = macro.iloc[:3].reset_index(drop=True)  # 3 steps x 3 series, index 0, 1, 2
    pv = pd.Series([0.01, 1.0, 100.0], index=sq.index)
    with pytest.raises(ValueError) as info:
        ks.filter(sq, 0.5, 1.0, pv)  # was: one value per column
    msg = str(info.value)
    assert msg.startswith("process_var: expected")
    for needle in ("one value per column", "one value per step", "process_var.to_numpy()[:, None]"):
        assert needle in msg
    with pytest.raises(ValueError, match=r"sigma2: .*fits both"):
        OUModel(sigma2=pv, obs_var=0.5).filter(sq)


def test_a_default_indexed_series_of_t_values_hints_at_t_by_1(macro):
    pv = pd.Series(np.full(len(macro), 0.5))  # one per step, but the data are indexed by dates
    with pytest.raises(ValueError, match=r"process_var: expected .* shape \[T, 1\]: pass "
                       r"process_var\.to_numpy\(\)\[:, None\]"):  # fmt: skip
        ks.filter(macro, 0.5, 1.0, pv)
    with pytest.raises(ValueError, match=r"sigma2: .*\[T, 1\]"):
        OUModel(sigma2=pv, obs_var=0.5).filter(macro)
    # one per column by position, as before
    got = ks.filter(macro, 0.5, 1.0, pd.Series([0.1, 1.0, 10.0]))
    want = ks.filter(macro.to_numpy(), 0.5, 1.0, np.array([0.1, 1.0, 10.0]))
    np.testing.assert_array_equal(got.mean, want.mean)


# --- 4. masked integer data compute in float64 ------------------------------------------------
@pytest.mark.parametrize(
    "dtype,div", [(np.int8, 20), (np.uint8, 10), (np.int16, 1), (np.uint16, 1)]
)
def test_masked_small_integer_data_compute_in_float64(dtype, div):
    _, flow = load_nile()
    z = (flow // div).astype(dtype)
    mask = np.zeros(len(z), bool)
    mask[[3, 40, 41]] = True
    masked = np.ma.masked_array(z, mask=mask)
    nan = np.where(mask, np.nan, z.astype(np.float64))
    got = ks.filter(masked, 1.0, 1.0, 0.2)
    want = ks.filter(nan, 1.0, 1.0, 0.2)
    assert got.mean.dtype == np.float64  # was: float32
    np.testing.assert_array_equal(got.mean, want.mean)
    assert got.loglik == want.loglik
    m = OUModel(sigma2=1.0, obs_var=1.0)
    assert m.filter(masked).mean.dtype == np.float64
    np.testing.assert_array_equal(m.filter(masked).mean, m.filter(nan).mean)


def test_a_fit_of_masked_int16_data_filters_in_float64():
    _, flow = load_nile()
    mask = np.zeros(len(flow), bool)
    mask[[10, 11, 60]] = True
    masked = np.ma.masked_array(flow.astype(np.int16), mask=mask)
    fit = ks.fit_ou(masked, fix={"theta": 0.0, "mu": 0.0})
    ref = ks.fit_ou(np.where(mask, np.nan, flow), fix={"theta": 0.0, "mu": 0.0})
    res = fit.filter()
    assert res.mean.dtype == np.float64
    np.testing.assert_array_equal(res.mean, ref.filter().mean)
    assert fit.loglik == ref.loglik


def test_dense_masked_int16_data_compute_in_float64():
    _, flow = load_nile()
    m = kd.local_linear_trend(15099.0, 1469.1, 10.0)._asdict()
    mask = np.zeros((len(flow), 1), bool)
    mask[[5, 6]] = True
    got = kd.filter(np.ma.masked_array(flow.astype(np.int16)[:, None], mask=mask), **m)
    want = kd.filter(np.where(mask, np.nan, flow[:, None]), **m)
    assert got.mean.dtype == np.float64  # was: float32
    np.testing.assert_array_equal(got.mean, want.mean)


# --- 5. a DataFrame fits as its values in C order -------------------------------------------
def test_fit_ou_of_a_dataframe_equals_the_fit_of_a_c_array_bit_for_bit(macro):
    df = macro[["infl", "unemp"]]
    assert not df.to_numpy().flags.c_contiguous  # (pandas holds columns)
    a = _quiet(ks.fit_ou, df, fix={"theta": 0.0})
    c_array = np.ascontiguousarray(df.to_numpy())
    b = _quiet(ks.fit_ou, c_array, df.index, fix={"theta": 0.0})
    for p in ("sigma2", "mu", "obs_var"):
        np.testing.assert_array_equal(a.params[p], b.params[p])
    np.testing.assert_array_equal(a.loglik, b.loglik)
    c = _quiet(ks.fit_ou, np.asfortranarray(c_array), df.index, fix={"theta": 0.0})
    np.testing.assert_array_equal(c.params["sigma2"], b.params["sigma2"])


# --- 7. OUModel's tensor parameters are checked as numpy ones are -----------------------------
@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"obs_var": -0.5}, r"obs_var: expected values > 0.0 and finite, got -0.5$"),
        ({"sigma2": -1.0}, r"sigma2: expected values >= 0.0 and finite, got -1.0$"),
        ({"mu": float("inf")}, r"mu: expected finite values, got inf$"),
        ({"theta": float("nan")}, r"theta: expected values >= 0.0 and finite, got nan$"),
        ({"prior_var": -2.0, "prior_mean": 0.0}, r"prior_var: expected values >= 0.0 \(inf"),
    ],
    ids=["obs_var", "sigma2", "mu", "theta", "prior_var"],
)
def test_tensor_parameters_are_refused_at_construction_as_given(kwargs, msg):
    base = {"theta": 0.2, "sigma2": 1.0, "obs_var": 0.5}
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=msg):
        OUModel(**{**base, **t})  # was: accepted; the filter then named scaled values
    with pytest.raises(ValueError, match=msg):  # the numpy message
        OUModel(**{**base, **{k: np.float64(v) for k, v in kwargs.items()}})


def test_tensor_parameters_keep_their_gradient_and_refuse_integer_tensors():
    _, flow = load_nile()
    sigma2 = torch.tensor(1469.1, dtype=torch.float64, requires_grad=True)
    ll = OUModel(sigma2=sigma2, obs_var=torch.tensor(15099.0, dtype=torch.float64)).loglik(
        torch.as_tensor(flow)
    )
    ll.backward()
    assert sigma2.grad is not None and torch.isfinite(sigma2.grad)
    with pytest.raises(TypeError, match=r"obs_var: expected a floating-point tensor"):
        OUModel(obs_var=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"obs_var: expected values whose reciprocal is finite"):
        OUModel(obs_var=torch.tensor([1.0, 1e-310], dtype=torch.float64))


# --- 8. no series --------------------------------------------------------------------------
def test_no_series_give_empty_results_and_fit_ou_refuses():
    _, flow = load_nile()
    z = flow[:, None][:, :0]  # (100, 0)
    m = OUModel(sigma2=1469.1, obs_var=15099.0)
    assert m.filter(z).mean.shape == ks.filter(z, 1.0, 1.0, 1.0).mean.shape == (100, 0)
    assert m.smooth(z).mean.shape == (100, 0)  # was: "cannot reshape array of size 0"
    assert m.loglik(z).shape == (0,)
    assert m.forecast(z, steps=3).mean.shape == (3, 0)
    with pytest.raises(
        ValueError, match=r"^z: expected at least one series, got shape \(100, 0\)$"
    ):
        ks.fit_ou(z)
    with pytest.raises(ValueError, match=r"got shape \(0, 100\)$"):
        ks.fit_ou(z.T, axis=1)


# --- 9. meta-device tensors ---------------------------------------------------------------------
def test_meta_tensors_are_refused_by_name():
    meta = torch.ones(4, dtype=torch.float64, device="meta")
    msg = r"^{}: expected a tensor with data, got one on the meta device$"
    for fn in (ks.filter, ks.smooth, ks.loglik):
        with pytest.raises(ValueError, match=msg.format("z")):
            fn(meta, 0.5, 0.9, 0.2)  # was: Tensor.item() cannot be called on meta tensors
    with pytest.raises(ValueError, match=msg.format("z")):
        ks.filter(meta, meta, 0.9, 0.2)
    with pytest.raises(ValueError, match=msg.format("theta")):
        ks.discretize_ou(meta, 1.0, 1.0)  # was: NotImplementedError
    with pytest.raises(ValueError, match=msg.format("sigma2")):
        OUModel(sigma2=meta)
    m = kd.local_linear_trend(1.0, 0.1, 2.0)._asdict()
    with pytest.raises(ValueError, match=msg.format("z")):
        kd.filter(torch.ones(5, 1, dtype=torch.float64, device="meta"), **m)


# --- 10. messages ----------------------------------------------------------------------------
def test_a_masked_parameter_is_reported_as_masked():
    _, flow = load_nile()
    ov = np.ma.masked_array(np.full(3, 15099.0), mask=[0, 0, 1])
    z = np.stack([flow, flow, flow], 1)
    with pytest.raises(ValueError, match=r"^obs_var: .*got a masked value at index \(2,\)$"):
        ks.filter(z, ov, 1.0, 1469.1)  # was: "got NaN at index (2,)"
    theta = np.ma.masked_array([0.1, 0.2], mask=[1, 0])
    with pytest.raises(ValueError, match=r"^theta: .*got a masked value at index \(0,\)$"):
        ks.discretize_ou(theta, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^obs_var: .*got a masked value at index \(2,\)$"):
        OUModel(obs_var=ov)
    # a masked element of z is missing data, as before
    zm = np.ma.masked_array(z, mask=np.isin(np.arange(100), [7])[:, None].repeat(3, 1))
    np.testing.assert_array_equal(
        ks.filter(zm, 15099.0, 1.0, 1469.1).mean,
        ks.filter(np.where(zm.mask, np.nan, z), 15099.0, 1.0, 1469.1).mean,
    )


def test_an_integer_beyond_int64_gets_its_own_message():
    _, flow = load_nile()
    with pytest.raises(TypeError) as info:
        ks.filter(flow, 2**70, 1.0, 1469.1)
    msg = str(info.value)
    assert msg.startswith("obs_var: expected a real number")
    assert "beyond int64" in msg and "float(obs_var)" in msg and "None" not in msg
    with pytest.raises(TypeError, match=r"obs_var: .*index \(1,\) is an integer beyond int64"):
        ks.filter(flow[:, None].repeat(2, 1), [1.0, 2**70], 1.0, 1469.1)
