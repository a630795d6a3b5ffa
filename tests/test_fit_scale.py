"""fit_ou is scale-free (issue 22 items 3, 4, 11): data and time units change the estimates by the
units' factors only; values beyond float64's variance range give a clear error naming z; one
observation that moves a variance estimate by orders of magnitude is named in a warning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from kalmanscan.testing import tolerance
from kalmanscan.timeseries import OUModel, fit_ou
from kalmanscan.timeseries.robust import OutlierWarning

LL = {"theta": 0.0, "mu": 0.0}
# the same standardized problem up to the rounding of (z - m) / s
SCALE_RTOL = tolerance("rescaled", "float64")


def _z(seed=0, T=300):
    _, z = OUModel(theta=0.0, sigma2=0.528, obs_var=1.0).simulate(n=T, seed=seed)
    return z


@pytest.mark.parametrize("c", [1e-16, 1e-13, 1e-6, 1e6, 1e13, 1e100], ids=lambda c: f"c{c:g}")
@pytest.mark.parametrize("fix", [LL, None], ids=["local-level", "free-ou"])
def test_scaled_data_give_the_scaled_fit(c, fix):
    z = (
        _z()
        if fix is LL
        else OUModel(theta=0.1, sigma2=1.0, mu=3.0, obs_var=0.5).simulate(n=300, seed=2)[1]
    )
    ref = fit_ou(z, fix=fix)
    got = fit_ou(z * c, fix=fix)
    assert got.converged and ref.converged
    for k, v in ref.params.items():
        want = v * {"theta": 1.0, "sigma2": c * c, "mu": c, "obs_var": c * c}[k]
        assert abs(got.params[k] - want) <= SCALE_RTOL * abs(want) + 1e-300, (k, got.params[k])
        se_want = ref.stderr[k] * {"theta": 1.0, "sigma2": c * c, "mu": c, "obs_var": c * c}[k]
        if math.isfinite(se_want):
            assert abs(got.stderr[k] / se_want - 1) <= tolerance("stderr", "float64")
    # every observation's density picks up 1/c (the diffuse first one contributes nothing)
    n = 299 if fix is LL else 300
    assert abs(got.loglik - (ref.loglik - n * math.log(c))) <= SCALE_RTOL * abs(ref.loglik)


def test_time_units_rescale_the_rates():
    t = np.cumsum(np.random.default_rng(3).exponential(1.0, 400))
    _, z = OUModel(theta=0.2, sigma2=0.5, mu=1.0, obs_var=0.3).simulate(t, seed=4)
    ref = fit_ou(z, t)
    got = fit_ou(z, t * 1e-9)  # a unit 1e9 times longer: rates 1e9 times larger
    for k in ("theta", "sigma2"):
        assert abs(got.params[k] / (ref.params[k] * 1e9) - 1) < SCALE_RTOL
    for k in ("mu", "obs_var"):
        assert abs(got.params[k] / ref.params[k] - 1) < SCALE_RTOL
    assert abs(got.loglik - ref.loglik) <= tolerance("fit_loglik", "float64")


def test_series_of_very_different_scales_fit_in_one_batch():
    z = np.column_stack([_z(1) * 1e-12, _z(2), _z(3) * 1e12])
    many = fit_ou(z, fix=LL)
    for s in range(3):
        one = fit_ou(z[:, s], fix=LL)
        for k in ("sigma2", "obs_var"):
            assert abs(many.params[k][s] / one.params[k] - 1) <= tolerance("fit", "float64")


@pytest.mark.parametrize("value", [1e300, -1e300, 1e-300])
def test_values_beyond_the_variance_range_are_refused_naming_z(value):
    z = _z()
    if abs(value) > 1:
        z[37] = value  # one huge cell: the data's spread squared overflows
    else:
        z = z * value  # everything tiny: the variances underflow
    with pytest.raises(ValueError, match=r"^z: the data's scale .* is .*rescale z"):
        fit_ou(z, fix=LL)


def test_one_dominating_outlier_is_named():
    z = _z(seed=5, T=200)
    z[57] = 1e12
    # (times as short as exact: "57", as robust=True's notes and the CLI write them)
    with pytest.warns(OutlierWarning, match=r"row 57 \(time 57, z = 1e\+12\) dominates") as said:
        fit = fit_ou(z, fix=LL)
    (w,) = [w.message for w in said if isinstance(w.message, OutlierWarning)]
    assert w.rows.tolist() == [57] and w.gross and w.series is None
    assert w.effect.startswith("dominates the likelihood: without it") and w.note in fit.notes
    assert any("row 57" in n for n in fit.notes)
    # a clean series of the same data raises no such warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_ou(_z(seed=5, T=200), fix=LL)


def test_outlier_in_one_series_of_a_batch_names_that_series():
    pd = pytest.importorskip("pandas")
    z = np.column_stack([_z(6), _z(7)])
    z[120, 1] = -5e9
    df = pd.DataFrame(z, columns=["quiet", "spiky"])
    with pytest.warns(UserWarning, match=r"in series 'spiky', row 120 .* dominates"):
        fit_ou(df, fix=LL)
