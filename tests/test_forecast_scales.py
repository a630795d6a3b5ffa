"""Forecasts at the ends of the range: data of scale 1e150 (the forecast's unit ``c`` past
2**511), float32 data past 2**63, a never-observed diffuse series forgotten over a long gap, and
``mu (1 - decay)`` where ``theta dt`` is tiny; each against its scale-1 twin, float64 or mpmath."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.validation.oracle import scalar_oracle


def _level(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return 9000 + np.cumsum(rng.normal(0, 30, n)) + rng.normal(0, 50, n)


@pytest.mark.parametrize("s", [1e150, 1e-150, 2.0**-480], ids=["1e150", "1e-150", "2^-480"])
def test_forecast_scales_with_the_data(s):
    """Data of order 1e4 times 1e150 had NaN forecast variances and a band of width 0."""
    z = _level()
    ref = ks.OUModel(theta=0.0, sigma2=900.0, obs_var=2500.0).forecast(z, steps=3, coverage=0.9)
    m = ks.OUModel(theta=0.0, sigma2=900.0 * s * s, obs_var=2500.0 * s * s)
    fc = m.forecast(z * s, steps=3, coverage=0.9)
    for got, want, p in [(fc.mean, ref.mean, 1), (fc.var, ref.var, 2),
                         (fc.predictive_var, ref.predictive_var, 2), (fc.lower, ref.lower, 1),
                         (fc.upper, ref.upper, 1)]:  # fmt: skip
        np.testing.assert_allclose(got / s**p, want, rtol=1e-13)


def test_float32_data_past_2_63_keep_finite_variances():
    """float32 data of order 2e19: the unit's square 2**128 passed float32 and every variance of
    the model's filter, smoother and forecast came out inf while its precision was right."""
    rng = np.random.default_rng(0)
    z = 2e19 + 1e13 * rng.standard_normal(50)
    m = ks.OUModel(theta=0.0, sigma2=1e24, obs_var=1e26)
    r64, r32 = m.filter(z), m.filter(z.astype(np.float32))
    for k in ("var", "pred_var"):
        np.testing.assert_allclose(getattr(r32, k), getattr(r64, k), rtol=1e-5)
    np.testing.assert_allclose(m.smooth(z.astype(np.float32)).var, m.smooth(z).var, rtol=1e-5)
    f32, f64 = m.forecast(z.astype(np.float32), steps=2), m.forecast(z, steps=2)
    np.testing.assert_allclose(f32.var, f64.var, rtol=1e-5)
    np.testing.assert_allclose(f32.upper - f32.lower, f64.upper - f64.lower, rtol=1e-4)


def test_a_forgotten_diffuse_series_forecasts_the_stationary_law():
    """Never observed, diffuse prior, and a gap over which exp(-theta dt) is 0: the forecast is
    N(mu, sigma2 / (2 theta)), as the filter gives it (NaN from 0 * inf before); a gap the state
    survives keeps the undefined mean and infinite variance."""
    m = ks.OUModel(theta=1.0, sigma2=2.0, mu=3.0, obs_var=1.0, prior_mean=0.0, prior_var=np.inf)
    z, t = np.array([np.nan, np.nan]), np.array([0.0, 1.0])
    fc = m.forecast(z, t, at=[2.0, 801.0])
    assert np.isnan(fc.mean[0]) and np.isinf(fc.var[0])
    r = m.filter(np.full(3, np.nan), np.array([0.0, 1.0, 801.0]))
    assert fc.mean[1] == r.mean[-1] == 3.0
    assert fc.var[1] == r.var[-1] == 1.0
    assert np.isfinite(fc.lower[1]) and np.isfinite(fc.upper[1])


def test_a_slow_reversion_to_a_far_mean_keeps_its_digits():
    """theta = 1e-12, mu = 1e10 on data near 1.5: ``mu (1 - exp(-theta dt))`` kept 9 digits
    (forecast mean 1.4e-7 off); the filter's offset and the forecast now use expm1."""
    th, s2, mu, ov = 1e-12, 1.0, 1e10, 1.0
    z, t = np.array([1.0, 2.0, 1.5, np.nan, 1.7]), np.array([0.0, 1.0, 2.0, 3.5, 5.0])
    m = ks.OUModel(theta=th, sigma2=s2, mu=mu, obs_var=ov, prior_mean=1.0, prior_var=4.0)
    mpmath.mp.dps = 50
    dt = np.diff(t, prepend=t[0])
    a = [mpmath.exp(-mpmath.mpf(th) * mpmath.mpf(d)) for d in dt]
    p = [mpmath.mpf(s2) * -mpmath.expm1(-2 * mpmath.mpf(th) * mpmath.mpf(d)) / (2 * mpmath.mpf(th))
         for d in dt]  # fmt: skip
    off = [mpmath.mpf(mu) * (1 - ai) for ai in a]
    ref = scalar_oracle(z, ov, np.array([float(x) for x in a]), np.array([float(x) for x in p]),
                        offset=np.array([float(x) for x in off]), prior_mean=1.0, prior_var=4.0,
                        smooth=False)  # fmt: skip
    r = m.filter(z, t)
    # (the oracle takes the float64-rounded decay and offset: their rounding moves the mean
    # by ~1e-16 relative, far below the 1.4e-7 of the old offset)
    np.testing.assert_allclose(r.mean, ref.mean, rtol=1e-12)
    fc = m.forecast(z, t, at=[6.0, 105.0])
    for tf, got in zip([6.0, 105.0], fc.mean, strict=True):
        ai = mpmath.exp(-mpmath.mpf(th) * (tf - 5.0))
        want = mpmath.mpf(mu) + ai * (mpmath.mpf(r.mean[-1]) - mpmath.mpf(mu))
        assert abs(got - float(want)) <= 4e-16 * abs(float(want))


def test_forecast_messages_and_a_fits_axis():
    """The message of a timestamp before the record names the record's last time in plain text
    (not ``np.float64(1.5)``); ``axis`` given with a fit, which forecasts its own data, is
    refused (it was ignored); a masked ``fix`` entry is refused as masked."""
    m = ks.OUModel(theta=0.0, sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match=r"last time \(.*: 2.0\), got 1.5$"):
        m.forecast(np.array([1.0, 2.0, np.nan]), np.array([0.0, 1.0, 2.0]), at=[1.5])
    z = _level(40)
    fit = ks.fit_ou(z)
    with pytest.raises(ValueError, match="axis: an OUFit forecasts its own data"):
        ks.forecast(fit, steps=2, axis=1)
    assert ks.forecast(fit, steps=2).mean.shape == (2,)
    zz = np.stack([z, z[::-1]], 1)
    ov = np.ma.masked_array([2500.0, 1.0], mask=[0, 1])
    with pytest.raises(ValueError, match=r"fix\['obs_var'\]: .*masked value at index \(1,\)"):
        ks.fit_ou(zz, fix={"obs_var": ov})


def test_a_float32_frame_stays_float32_in_the_model():
    """OUModel on a float32 DataFrame computed in float64 while kalmanscan.filter keeps float32
    (docs/api.md: float32 data stay float32); now both, and the values equal the array's."""
    pd = pytest.importorskip("pandas")
    z = _level(30).astype(np.float32)
    df = pd.DataFrame({"a": z, "b": z[::-1].copy()})
    m = ks.OUModel(theta=0.0, sigma2=900.0, obs_var=2500.0)
    for frame in (df, df.astype("Float32")):
        r = m.filter(frame)
        assert r.mean.dtype == np.float32
        np.testing.assert_array_equal(r.mean, m.filter(df.to_numpy()).mean)
    assert m.filter(df.astype({"a": np.float64})).mean.dtype == np.float64
