"""A DataArray whose time dim is not on ``axis`` is refused, not filtered along another dim
(dims ("station", "time") with the default axis=0 filtered 3 stations as 3 steps of 50 series)."""

import numpy as np
import pytest

import kalmanscan as ks

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

MSG = r"axis: z is a DataArray of dims \('station', '(time|date)'\) whose time dim"


def _da(time_name="time", dated=False):
    t = pd.date_range("2020-01-01", periods=40) if dated else np.arange(40.0)
    z = np.random.default_rng(0).normal(size=(3, 40)).cumsum(1)
    return xr.DataArray(
        z, dims=("station", time_name), coords={time_name: t, "station": list("abc")}
    )


@pytest.mark.parametrize("fn", ["filter", "smooth", "loglik"])
def test_core_refuses_and_takes_the_right_axis(fn):
    da = _da()
    f = getattr(ks, fn)
    with pytest.raises(ValueError, match=MSG + r" 'time' is axis 1, but axis=0 is its dim"):
        f(da, obs_var=1.0, decay=1.0, process_var=0.1)
    got = f(da, obs_var=1.0, decay=1.0, process_var=0.1, axis=1)
    want = f(da.values.T, obs_var=1.0, decay=1.0, process_var=0.1)
    if fn == "loglik":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_equal(got.mean, want.mean.T)


def test_time_series_layer_refuses_and_takes_the_right_axis():
    da = _da(dated=True)
    with pytest.raises(ValueError, match=MSG):
        ks.fit_ou(da)
    with pytest.raises(ValueError, match=MSG):
        ks.OUModel(sigma2=1.0, obs_var=1.0).filter(da)
    fit = ks.fit_ou(da, axis=1)
    assert fit.series_labels == ["a", "b", "c"] and fit.z.shape == (40, 3)
    assert str(fit.time_axis.labels[0])[:10] == "2020-01-01"


def test_a_dated_dim_of_another_name():
    da = _da("date", dated=True)
    with pytest.raises(ValueError, match=MSG + r" 'date' is axis 1"):
        ks.fit_ou(da)
    # not dated and not named time: nothing to go by, axis as given
    plain = _da("step")
    assert ks.filter(plain, obs_var=1.0, decay=1.0, process_var=0.1).mean.shape == (3, 40)


def test_time_first_and_other_inputs_unchanged():
    da = _da().transpose("time", "station")
    assert ks.fit_ou(da).series_labels == ["a", "b", "c"]
    assert ks.filter(da.values, obs_var=1.0, decay=1.0, process_var=0.1).mean.shape == (40, 3)
    assert ks.filter(_da().values, obs_var=1.0, decay=1.0, process_var=0.1).mean.shape == (3, 40)
