"""``OUFit.disturbances()``: the standardized smoothed disturbances of a fit (Durbin & Koopman
2012, section 2.12), laid out as the fit's data, against statsmodels' exact diffuse smoother at
the same parameters; multi-series, joint and robust fits."""

from __future__ import annotations

import dataclasses
import doctest
import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import Disturbances, OUFit, load_nile
from kalmanscan.timeseries.robust import fit_ou_robust

YEARS, FLOW = load_nile()
FLOW = FLOW.astype(np.float64)
LOCAL_LEVEL = {"theta": 0.0, "mu": 0.0}
ROW_1921 = int(np.flatnonzero(YEARS == 1921)[0])


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def _statsmodels(z, obs_var, sigma2):
    """Standardized smoothed disturbances of the local level at ``obs_var, sigma2`` by
    statsmodels, ``(observation [T], state [T])`` in this package's alignment, and the smoothed
    state's ``(mean [T], var [T])``.

    statsmodels' ``*_disturbance_cov`` is ``Var(e_t | data)``, so the standardization is by
    ``Var(e_hat_t) = var(e_t) - Var(e_t | data)`` (D&K 2012, 2.12). Its ``eta_t`` is the move
    from row ``t`` to ``t + 1``; here ``state[t]`` is the move from ``t - 1`` to ``t``: its
    ``eta[:-1]`` is ``state[1:]``, and its last ``eta`` (the move past the data) has no row.
    The exact diffuse start (``use_exact_diffuse``) is this package's convention for ``theta``
    0; statsmodels' default approximate diffuse start (variance 1e6) differs in the first rows.
    """
    sm = pytest.importorskip("statsmodels.api")
    mod = sm.tsa.UnobservedComponents(z, "local level", use_exact_diffuse=True)
    assert mod.param_names == ["sigma2.irregular", "sigma2.level"]
    res = mod.smooth([obs_var, sigma2])
    eps_cov = res.smoothed_measurement_disturbance_cov[0, 0]
    eta_cov = res.smoothed_state_disturbance_cov[0, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        obs = res.smoothed_measurement_disturbance[0] / np.sqrt(obs_var - eps_cov)
        eta = res.smoothed_state_disturbance[0] / np.sqrt(sigma2 - eta_cov)
    state = np.r_[np.nan, eta[:-1]]
    return obs, state, res.smoothed_state[0], res.smoothed_state_cov[0, 0]


def _agree(ours, ref, defined):
    """``ours`` is NaN exactly off ``defined`` and matches ``ref`` on it."""
    np.testing.assert_array_equal(~np.isnan(ours), defined)
    np.testing.assert_allclose(ours[defined], ref[defined], rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def nile():
    return _quiet(ks.fit_ou, FLOW, YEARS, fix=LOCAL_LEVEL)


def test_nile_break_of_1899_and_outlier_of_1913(nile):
    d = nile.disturbances()
    assert isinstance(d, Disturbances)
    assert d.observation.shape == d.state.shape == nile.z.shape == (100,)
    assert d.observation.dtype == d.state.dtype == np.float64
    assert int(YEARS[np.nanargmax(np.abs(d.state))]) == 1899
    assert int(YEARS[np.nanargmax(np.abs(d.observation))]) == 1913
    assert np.isnan(d.state[0]) and not np.isnan(d.state[1:]).any()
    assert not np.isnan(d.observation).any()


def test_nile_matches_statsmodels_at_the_same_parameters(nile):
    d = nile.disturbances()
    obs, state, _, _ = _statsmodels(FLOW, nile.params["obs_var"], nile.params["sigma2"])
    _agree(d.observation, obs, np.ones(100, bool))
    _agree(d.state, state, np.arange(100) > 0)  # row 0: no step into it


def test_nile_with_gaps_matches_statsmodels():
    """D&K's figure 2.5 gaps (rows 20-39 and 60-79 missing): no observation residual there; the
    state's are defined on every step (the data before and after inform them)."""
    z = FLOW.copy()
    z[20:40] = z[60:80] = np.nan
    fit = _quiet(ks.fit_ou, z, YEARS, fix=LOCAL_LEVEL)
    d = fit.disturbances()
    obs, state, _, _ = _statsmodels(z, fit.params["obs_var"], fit.params["sigma2"])
    _agree(d.observation, obs, ~np.isnan(z))
    _agree(d.state, state, np.arange(100) > 0)


def _three():
    rng = np.random.default_rng(7)
    return np.stack(
        [FLOW, FLOW[::-1].copy(), 0.01 * FLOW + rng.normal(0.0, 0.5, 100).cumsum()], axis=1
    )


@pytest.mark.parametrize("kind", ["array", "frame"])
def test_three_series_are_three_one_series_fits(kind):
    z = _three()
    if kind == "frame":
        pd = pytest.importorskip("pandas")
        z_in = pd.DataFrame(z, index=YEARS, columns=["nile", "reversed", "walk"])
    else:
        z_in = z
    fit = _quiet(ks.fit_ou, z_in, YEARS, fix=LOCAL_LEVEL)
    assert np.ndim(fit.params["obs_var"]) == 1  # per-series parameters
    d = fit.disturbances()
    assert d.observation.shape == d.state.shape == (100, 3)
    for k in range(3):
        one = _quiet(ks.fit_ou, z[:, k], YEARS, fix=LOCAL_LEVEL).disturbances()
        np.testing.assert_allclose(d.observation[:, k], one.observation, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(d.state[:, k], one.state, rtol=1e-6, atol=1e-9)
        # and against statsmodels at the column's own parameters
        obs, state, _, _ = _statsmodels(z[:, k], fit.params["obs_var"][k], fit.params["sigma2"][k])
        _agree(d.observation[:, k], obs, np.ones(100, bool))
        _agree(d.state[:, k], state, np.arange(100) > 0)


def test_series_shape_of_two_dims_keeps_its_layout():
    z = np.stack([_three()[:, :2], _three()[:, [2, 0]]], axis=2)  # [T, 2, 2]
    fit = _quiet(ks.fit_ou, z, YEARS, fix=LOCAL_LEVEL)
    d = fit.disturbances()
    assert d.observation.shape == d.state.shape == (100, 2, 2)
    for i, j in [(0, 1), (1, 0)]:
        one = _quiet(ks.fit_ou, z[:, i, j], YEARS, fix=LOCAL_LEVEL).disturbances()
        np.testing.assert_allclose(d.observation[:, i, j], one.observation, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(d.state[:, i, j], one.state, rtol=1e-6, atol=1e-9)


def test_joint_fit_uses_its_one_parameter_set():
    z = _three()[:, :2]
    fit = _quiet(ks.fit_ou, z, YEARS, fix=LOCAL_LEVEL, joint=True)
    assert np.ndim(fit.params["obs_var"]) == 0
    d = fit.disturbances()
    assert d.observation.shape == (100, 2)
    for k in range(2):
        obs, state, _, _ = _statsmodels(z[:, k], fit.params["obs_var"], fit.params["sigma2"])
        _agree(d.observation[:, k], obs, np.ones(100, bool))
        _agree(d.state[:, k], state, np.arange(100) > 0)


@pytest.fixture(scope="module")
def gross():
    z = FLOW.copy()
    z[ROW_1921] = 5000.0
    return z


def test_robust_fit_keeps_the_screened_value_and_judges_it(gross):
    """The screened 1921 (5000 among flows of about 1000): the fit is smoothed without it, its
    ``observation`` is its deletion residual ``(z - x_hat) / sqrt(obs_var + P_t|T)`` from the
    kept data, and every other entry is the plain fit's of the data without it."""
    fit = _quiet(ks.fit_ou, gross, YEARS, fix=LOCAL_LEVEL, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [ROW_1921]
    assert np.isnan(fit.z[ROW_1921])
    assert fit.outlier_values.tolist() == [5000.0]
    d = fit.disturbances()
    assert d.observation.shape == d.state.shape == (100,)
    without = gross.copy()
    without[ROW_1921] = np.nan
    ov, s2 = fit.params["obs_var"], fit.params["sigma2"]
    obs, state, mean, var = _statsmodels(without, ov, s2)
    deletion = (5000.0 - mean[ROW_1921]) / np.sqrt(ov + var[ROW_1921])
    assert deletion > 20  # what the screen judged
    obs[ROW_1921] = deletion
    _agree(d.observation, obs, np.ones(100, bool))
    _agree(d.state, state, np.arange(100) > 0)
    # the screened row stands out; the plain fit of the data without it agrees elsewhere
    assert int(np.nanargmax(np.abs(d.observation))) == ROW_1921
    plain = _quiet(ks.fit_ou, without, YEARS, fix=LOCAL_LEVEL).disturbances()
    keep = np.arange(100) != ROW_1921
    np.testing.assert_allclose(d.observation[keep], plain.observation[keep], rtol=1e-6)
    assert np.isnan(plain.observation[ROW_1921])


def test_robust_fit_without_the_values_leaves_the_screened_residual_nan(gross):
    """``robust.fit_ou_robust`` keeps the screened values; a fit without them (built by hand)
    leaves that one entry NaN."""
    kept = _quiet(fit_ou_robust, gross, YEARS, fix=LOCAL_LEVEL)
    assert kept.outlier_values.tolist() == [5000.0] and kept.outliers[ROW_1921]
    fit = dataclasses.replace(kept, outlier_values=None)
    d = fit.disturbances()
    assert np.flatnonzero(np.isnan(d.observation)).tolist() == [ROW_1921]
    full = _quiet(ks.fit_ou, gross, YEARS, fix=LOCAL_LEVEL, robust=True).disturbances()
    keep = np.arange(100) != ROW_1921
    np.testing.assert_allclose(d.observation[keep], full.observation[keep], rtol=1e-12)
    np.testing.assert_allclose(d.state, full.state, rtol=1e-12)


def test_robust_multi_series_places_each_value_in_its_column(gross):
    z = np.stack([FLOW, gross, FLOW[::-1].copy()], axis=1)
    z[10, 2] = -3000.0
    fit = _quiet(ks.fit_ou, z, YEARS, fix=LOCAL_LEVEL, robust=True)
    rows, cols = np.nonzero(fit.outliers)
    assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(10, 2), (ROW_1921, 1)]
    d = fit.disturbances()
    assert d.observation.shape == (100, 3)
    for k in (1, 2):
        one = _quiet(ks.fit_ou, z[:, k], YEARS, fix=LOCAL_LEVEL, robust=True).disturbances()
        np.testing.assert_allclose(d.observation[:, k], one.observation, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(d.state[:, k], one.state, rtol=1e-6, atol=1e-9)
    assert d.observation[ROW_1921, 1] > 20 and d.observation[10, 2] < -20


def test_mismatched_robust_fields_are_refused(nile):
    bad = OUFit(**{**vars(nile), "outliers": np.zeros(99, bool)})
    with pytest.raises(ValueError, match=r"outliers: expected a bool array .*\(100,\).*\(99,\)"):
        bad.disturbances()
    bad = OUFit(
        **{**vars(nile), "outliers": np.zeros(100, bool), "outlier_values": np.array([1.0])}
    )
    with pytest.raises(ValueError, match=r"outlier_values: expected .*0.*got shape \(1,\)"):
        bad.disturbances()


def test_disturbances_is_exported():
    import kalmanscan.timeseries as ts

    assert "Disturbances" in ts.__all__ and ts.Disturbances is Disturbances
    assert Disturbances._fields == ("observation", "state")


def test_docstring_example_runs():
    finder = doctest.DocTestFinder()
    (test,) = finder.find(OUFit.disturbances, "OUFit.disturbances", globs={})
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run(test)
    res = runner.summarize(verbose=False)
    assert res.attempted >= 6 and res.failed == 0


def test_the_clis_merged_block_fits_keep_the_screened_values(gross):
    """The CLI fits many series in blocks and merges them (cli._merge_fits): the merged fit's
    ``outlier_values`` follow the merged ``z[outliers]`` order, so its disturbances are those of
    the one fit of all series."""
    from kalmanscan.timeseries.cli import _merge_fits

    z = np.stack([FLOW, gross, FLOW[::-1].copy(), FLOW * 1.1], axis=1)
    z[10, 2] = -3000.0
    z[50, 3] = 9000.0
    whole = _quiet(ks.fit_ou, z, YEARS, fix=LOCAL_LEVEL, robust=True)
    blocks = [_quiet(ks.fit_ou, z[:, k : k + 2], YEARS, fix=LOCAL_LEVEL, robust=True)
              for k in (0, 2)]  # fmt: skip
    merged = _merge_fits(blocks)
    np.testing.assert_array_equal(merged.outliers, whole.outliers)
    np.testing.assert_array_equal(merged.outlier_values, whole.outlier_values)
    restored = np.array(merged.z)
    restored[merged.outliers] = merged.outlier_values
    np.testing.assert_array_equal(restored, z)
    a, b = merged.disturbances(), whole.disturbances()
    np.testing.assert_allclose(a.observation, b.observation, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a.state, b.state, rtol=1e-6, atol=1e-9)
