"""Forecasts of models with parameters per step of the record: ``future_params`` gives their
values at the forecast times (the record is still filtered with its per-step values)."""

import numpy as np
import pytest

import kalmanscan as ks

T = 20
OBS_VAR = np.linspace(2.0, 6.0, T)  # a noisy instrument over the record
NEW_VAR = 0.01  # the value at the forecast times (a precise one)


def _model():
    return ks.OUModel(theta=0.1, sigma2=1.0, obs_var=OBS_VAR[:, None])


def _simulate(n, seed=0):
    """Levels at T + 1 unit steps from the stationary start, the record z [T, n] and the next
    observation, made with NEW_VAR."""
    rng = np.random.default_rng(seed)
    a, p = ks.discretize_ou(0.1, 1.0, np.ones(T + 1))
    x = np.sqrt(1.0 / 0.2) * rng.standard_normal(n)
    levels = []
    for t in range(T + 1):
        if t:
            x = a[t] * x + np.sqrt(p[t]) * rng.standard_normal(n)
        levels.append(x)
    z = np.array(levels[:T]) + np.sqrt(OBS_VAR)[:, None] * rng.standard_normal((T, n))
    return z, levels[T] + np.sqrt(NEW_VAR) * rng.standard_normal(n)


def _reference(z, future_obs_var):
    """The filter over the record with NaN rows at the forecast times: its moments there are the
    level's forecast."""
    H = len(future_obs_var)
    zz = np.vstack([z, np.full((H, z.shape[1]), np.nan)])
    ov = np.concatenate([OBS_VAR, future_obs_var])[:, None]
    return ks.OUModel(theta=0.1, sigma2=1.0, obs_var=ov).filter(zz)


def test_equals_the_filter_with_rows_at_the_forecast_times():
    z, _ = _simulate(5)
    fc = _model().forecast(z, steps=3, future_params={"obs_var": NEW_VAR})
    ref = _reference(z, np.full(3, NEW_VAR))
    np.testing.assert_allclose(fc.mean, ref.mean[-3:], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(fc.var, ref.var[-3:], rtol=1e-13)
    np.testing.assert_allclose(fc.predictive_var, ref.var[-3:] + NEW_VAR, rtol=1e-13)
    # obs_var per forecast time
    ov = np.array([[0.01], [0.5], [3.0]])
    fc = ks.forecast(_model(), z, steps=3, future_params={"obs_var": ov})
    np.testing.assert_allclose(fc.predictive_var - fc.var, np.broadcast_to(ov, (3, 5)), rtol=1e-13)
    np.testing.assert_allclose(fc.var, ref.var[-3:], rtol=1e-13)


def test_covers_where_refiltering_with_one_value_does_not():
    """docs/model.md's figures: 95 % intervals of the next observation over 20,000 series."""
    z, new = _simulate(20_000)
    fc = _model().forecast(z, steps=1, future_params={"obs_var": NEW_VAR})
    covered = np.mean((new >= fc.lower[0]) & (new <= fc.upper[0]))
    assert abs(covered - 0.95) < 0.005
    wrong = _model().with_params(obs_var=NEW_VAR).forecast(z, steps=1)
    assert np.mean((new >= wrong.lower[0]) & (new <= wrong.upper[0])) < 0.6


def test_per_step_parameters_need_future_values():
    z, _ = _simulate(3)
    with pytest.raises(
        ValueError, match=r"obs_var: the model gives values per step.*future_params"
    ):
        _model().forecast(z, steps=1)
    with pytest.raises(ValueError, match="future_params"):
        _model().to_dataset(z, forecast_steps=1)
    pytest.importorskip("xarray")
    with pytest.raises(ValueError, match="future_params: .* given with no forecast"):
        _model().to_dataset(z, future_params={"obs_var": NEW_VAR})
    ds = _model().to_dataset(z, forecast_steps=2, future_params={"obs_var": NEW_VAR})
    ref = _reference(z, np.full(2, NEW_VAR))
    np.testing.assert_allclose(ds["forecast_variance"].values, ref.var[-2:], rtol=1e-13)


def test_replaces_a_constant_value_for_the_forecast_only():
    z, _ = _simulate(4)
    m = ks.OUModel(theta=0.1, sigma2=1.0, obs_var=3.0)
    base = m.forecast(z, steps=2)
    fc = m.forecast(z, steps=2, future_params={"obs_var": 0.5, "mu": 1.0})
    np.testing.assert_allclose(fc.predictive_var - fc.var, 0.5)
    np.testing.assert_allclose(fc.var, base.var, rtol=1e-15)  # the same filtered start
    a = np.exp(-0.1 * np.array([1.0, 2.0]))[:, None]
    np.testing.assert_allclose(fc.mean - base.mean, np.broadcast_to(1 - a, (2, 4)), rtol=1e-12)


def test_fit_forecast_takes_future_params():
    z, _ = _simulate(2, seed=3)
    fit = ks.fit_ou(z)
    fc = fit.forecast(2, future_params={"obs_var": [0.1, 0.2]})
    np.testing.assert_allclose(fc.predictive_var - fc.var, [[0.1, 0.2]] * 2, rtol=1e-14)
    same = ks.forecast(fit, steps=2, future_params={"obs_var": [0.1, 0.2]})
    np.testing.assert_array_equal(same.predictive_var, fc.predictive_var)


@pytest.mark.parametrize(
    "bad, err, match",
    [
        ([1.0], TypeError, "expected a dict"),
        ({"foo": 1.0}, ValueError, "expected keys among"),
        ({"obs_var": 0.0}, ValueError, r"future_params\['obs_var'\]: expected values > 0"),
        ({"sigma2": -1.0}, ValueError, r"future_params\['sigma2'\]"),
        ({"obs_var": np.nan}, ValueError, r"future_params\['obs_var'\]"),
        ({"theta": np.ones((2, 3))}, ValueError, "only obs_var may vary by forecast time"),
        ({"obs_var": np.ones(4)}, ValueError, r"series shape \(3,\)"),
        ({"obs_var": np.ones((2, 4))}, ValueError, r"expected shape \[H, \*S\] = \(2, 3\)"),
        ({"obs_var": np.ones((3, 3))}, ValueError, "H = 2 forecast times"),
    ],
)
def test_bad_future_params(bad, err, match):
    z, _ = _simulate(3)
    with pytest.raises(err, match=match):
        _model().forecast(z, steps=2, future_params=bad)


def test_labelled_future_params_refused():
    pd = pytest.importorskip("pandas")
    z, _ = _simulate(2)
    with pytest.raises(TypeError, match="taken by position"):
        _model().forecast(z, steps=1, future_params={"obs_var": pd.Series([0.1, 0.2])})
