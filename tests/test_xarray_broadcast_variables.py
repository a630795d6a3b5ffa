"""The ``.kalman`` accessor on a Dataset whose variables have different dims (``rates`` over
``(time, kind)``, ``infl`` over ``time``): each variable's series is exactly its own data, none
broadcast along a dim it lacks. ``series`` is then a MultiIndex of ``variable`` and ``kind``
(``Dataset.to_stacked_array``); separate fits equal ``fit_ou`` on the three series as a
DataFrame, a joint fit counts each series once (its total log-likelihood that of the three), and
the filter's outputs are those of the three series."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries.model import PARAMS

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")
import kalmanscan.xarray  # noqa: E402,F401  (registers the accessor)

T = 80


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    times = pd.date_range("2001-01-01", periods=T, freq="D")
    rates = rng.normal(size=(T, 2)).cumsum(0) + rng.normal(size=(T, 2))
    infl = 0.5 * rng.normal(size=T).cumsum() + rng.normal(size=T)
    ds = xr.Dataset(
        {"rates": (("time", "kind"), rates), "infl": ("time", infl)},
        coords={"time": times, "kind": ["tbill", "real"]},
    )
    df = pd.DataFrame({"tbill": rates[:, 0], "real": rates[:, 1], "infl": infl}, index=times)
    return ds, df


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", FutureWarning)  # (no MultiIndex level dropped alone)
        return fn(*a, **kw)


def test_separate_fits_are_the_three_series_once(data):
    ds, df = data
    fit = _quiet(ds.kalman.fit_ou)
    assert dict(fit.sizes) == {"series": 3}
    assert fit["variable"].values.tolist() == ["rates", "rates", "infl"]
    assert fit["kind"].values[:2].tolist() == ["tbill", "real"] and pd.isna(fit["kind"].values[2])
    assert float(fit["n_obs"].sum()) == 3 * T  # the data's values, each once
    ref = _quiet(ks.fit_ou, df)
    for p in ("theta", "sigma2", "mu", "obs_var"):
        np.testing.assert_allclose(fit[p].values, ref.params[p], rtol=1e-9, err_msg=p)
    np.testing.assert_allclose(fit["loglik"].values, ref.loglik, rtol=1e-12)
    # each variable's parameters over its own dims again
    theta = fit["theta"].to_unstacked_dataset("series")
    assert theta["rates"].dims == ("kind",) and theta["infl"].dims == ()
    assert float(theta["infl"]) == pytest.approx(float(ref.params["theta"][2]), rel=1e-9)


def test_a_joint_fit_counts_each_series_once(data):
    ds, df = data
    joint = _quiet(ds.kalman.fit_ou, joint=True)
    ref = _quiet(ks.fit_ou, df, joint=True)
    assert joint["loglik"].sizes == {"series": 3}
    assert float(joint["loglik"].sum()) == pytest.approx(ref.total_loglik, rel=1e-12)
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert float(joint[p]) == pytest.approx(ref.params[p], rel=1e-12), p
    assert float(joint["n_obs"].sum()) == 3 * T


def test_filter_and_forecast_with_the_fit_are_the_three_series(data):
    ds, df = data
    fit = _quiet(ds.kalman.fit_ou)
    out = _quiet(ds.kalman.filter, fit, forecast_steps=2)
    assert out["mean"].dims == ("time", "series") and out.sizes["series"] == 3
    np.testing.assert_array_equal(out["observed"].values, df.to_numpy())
    ref_fit = _quiet(ks.fit_ou, df)
    for i, col in enumerate(df.columns):
        m = ks.OUModel(time_unit="1D", **{p: float(fit[p].values[i]) for p in PARAMS})
        res = m.smooth(df[col])
        np.testing.assert_allclose(out["smoothed_mean"].values[:, i], res.mean, rtol=1e-10)
        assert float(out["loglik"].values[i]) == pytest.approx(float(ref_fit.loglik[i]), rel=1e-9)
    fc = _quiet(ds.kalman.forecast, fit, steps=2)
    np.testing.assert_allclose(fc["forecast_mean"].values, out["forecast_mean"].values, rtol=1e-14)


def test_variables_of_the_same_dims_keep_their_layout(data):
    ds, _ = data
    same = ds.assign(spread=ds["rates"] * 0.5 + 1.0).drop_vars("infl")
    fit = _quiet(same.kalman.fit_ou)
    assert dict(fit.sizes) == {"series": 2, "kind": 2}
    assert fit["series"].values.tolist() == ["rates", "spread"]


def test_chunked_equals_in_memory(data):
    pytest.importorskip("dask")
    ds, _ = data
    mem = _quiet(ds.kalman.fit_ou)
    lazy = _quiet(lambda: ds.chunk({"kind": 1}).kalman.fit_ou().compute())
    assert dict(lazy.sizes) == {"series": 3}
    # (each chunk's series fitted as its own batch, to the optimizer's tolerance: a weakly
    # determined theta moves by ~3e-8 relative, the log-likelihood by ~1e-15)
    np.testing.assert_allclose(lazy["loglik"].values, mem["loglik"].values, rtol=1e-12)
    for p in ("theta", "sigma2", "obs_var"):
        np.testing.assert_allclose(lazy[p].values, mem[p].values, rtol=1e-6, err_msg=p)
