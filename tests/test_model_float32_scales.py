"""float32 data whose variances float32 cannot hold in the data's units (scale below ~1e-19 or
above ~1e19): OUModel and a fit's filter / smooth / forecast refuse them, naming z, as the filter
API refuses such inputs; where float32 holds them the results equal the float64 truth."""

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.testing import tolerance
from kalmanscan.timeseries import load_nile

TINY = float(
    np.finfo(np.float32).tiny
)  # float32 holds a variance and its precision in [TINY, 1/TINY]
BASE = np.array([1.0, 1.3, 0.8, 1.1, np.nan, 0.9, 1.2])


def _model(s):
    return ks.OUModel(theta=0.0, sigma2=0.1 * s * s, obs_var=0.2 * s * s)


def _outside(*vs):
    """Whether some finite positive variance of the float64 truth leaves float32's range."""
    v = np.concatenate([np.ravel(x) for x in vs])
    v = v[np.isfinite(v) & (v > 0)]
    return bool(((v < TINY) | (v > 1 / TINY)).any())


@pytest.mark.parametrize(
    "s", [1e-22, 1e-20, 1e20, 1e22], ids=["s1e-22", "s1e-20", "s1e20", "s1e22"]
)
@pytest.mark.parametrize("op", ["filter", "smooth", "forecast"])
def test_refused_where_float32_cannot_hold_the_variances(s, op):
    z32 = (BASE * s).astype(np.float32)
    m = _model(s)
    truth = m.smooth(z32.astype(np.float64))
    assert _outside(truth.var, truth.filtered.var, truth.filtered.pred_var)  # (the premise)
    call = {
        "filter": lambda: m.filter(z32),
        "smooth": lambda: m.smooth(z32),
        "forecast": lambda: m.forecast(z32, steps=2),
    }[op]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^z: expected .*float32.* pass z as float64"):
            call()


def test_dataset_of_float32_data_is_float64_and_right():
    # to_dataset lays out float64 results whatever the data's dtype: nothing to refuse
    s = 1e-22
    z32 = (BASE * s).astype(np.float32)
    ds = _model(s).to_dataset(z32)
    truth = _model(s).smooth(z32.astype(np.float64))
    np.testing.assert_allclose(ds["variance"].values, truth.filtered.var, rtol=1e-12)
    np.testing.assert_allclose(ds["smoothed_variance"].values, truth.var, rtol=1e-12)


def test_core_refuses_the_same_problem():
    s = 1e-22
    z32 = (BASE * s).astype(np.float32)
    with pytest.raises(ValueError, match="obs_var"):
        ks.smooth(z32, obs_var=0.2 * s * s, decay=1.0, process_var=0.1 * s * s)
    with pytest.raises(ValueError, match="^z: "):
        _model(s).smooth(z32)


@pytest.mark.parametrize("s", [1e-17, 1e-8, 1.0, 1e8, 1e17], ids=lambda s: f"s{s:g}")
def test_float32_results_equal_float64_where_representable(s):
    z32 = (BASE * s).astype(np.float32)
    m = _model(s)
    r32, r64 = m.smooth(z32), m.smooth(z32.astype(np.float64))
    assert not _outside(r64.var, r64.filtered.var, r64.filtered.pred_var)
    assert r32.var.dtype == np.float32
    tol = tolerance("truth", "float32")
    pairs = [
        (r32.mean, r64.mean),
        (r32.var, r64.var),
        (r32.filtered.var, r64.filtered.var),
        (r32.filtered.precision, r64.filtered.precision),
        (r32.filtered.pred_var, r64.filtered.pred_var),
    ]
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol)


def test_refusal_names_the_series():
    z = np.stack([BASE, BASE * 1e-22], axis=1).astype(np.float32)
    m = ks.OUModel(theta=0.0, sigma2=np.array([0.1, 0.1e-44]), obs_var=np.array([0.2, 0.2e-44]))
    with pytest.raises(ValueError, match=r"of series \(1,\)"):
        m.filter(z)
    r = ks.OUModel(theta=0.0, sigma2=0.1, obs_var=0.2).filter(z[:, 0])
    np.testing.assert_allclose(
        r.var, ks.OUModel(theta=0.0, sigma2=0.1, obs_var=0.2).filter(BASE).var, rtol=1e-6
    )


def test_predicted_variance_over_a_gap_beyond_float32():
    # data of order 1e10, a gap over which the predicted variance reaches 1e38 (> 1/TINY)
    t = np.array([0.0, 1.0, 2.0, 3.0, 1e18, 1e18 + 1.0, 1e18 + 2.0])
    z32 = (np.nan_to_num(BASE, nan=1.0) * 1e10).astype(np.float32)
    m = ks.OUModel(theta=0.0, sigma2=1e20, obs_var=1e20)
    truth = m.filter(z32.astype(np.float64), t)
    assert _outside(truth.pred_var)
    with pytest.raises(ValueError, match="predicted variance"):
        m.filter(z32, t)


@pytest.mark.parametrize("s", [1e-25, 1e25], ids=["s1e-25", "s1e25"])
def test_fit_of_float32_data_refuses_its_filter_not_its_estimates(s):
    years, flow = load_nile()
    z32 = (flow * s).astype(np.float32)
    fix = {"theta": 0.0, "mu": 0.0}
    f32, f64 = ks.fit_ou(z32, years, fix=fix), ks.fit_ou(z32.astype(np.float64), years, fix=fix)
    for p in ("sigma2", "obs_var"):
        assert f32.params[p] == pytest.approx(f64.params[p], rel=1e-9)
    assert _outside(f64.smooth().var, f64.filter().var)
    for call in (f32.filter, f32.smooth, lambda: f32.forecast(steps=2)):
        with pytest.raises(ValueError, match="^z: .*pass z as float64"):
            call()


def test_fit_of_float32_data_at_1e_minus_15_keeps_float32_results():
    years, flow = load_nile()
    z32 = (flow * 1e-15).astype(np.float32)
    fit = ks.fit_ou(z32, years, fix={"theta": 0.0, "mu": 0.0})
    sm = fit.smooth()
    truth = ks.OUModel(**fit.params).smooth(z32.astype(np.float64), years)
    assert sm.var.dtype == np.float32
    np.testing.assert_allclose(sm.var, truth.var, rtol=tolerance("truth", "float32"))
