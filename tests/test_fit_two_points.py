"""A local level of exactly two observations: the likelihood depends on sigma2 and obs_var only
through sigma2 * dt + 2 obs_var (one innovation, z2 - z1), so neither is identified. A lone series
and the same values as a DataFrame column report that alike: a note and a warning, no standard
errors, no boundary verdict."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import kalmanscan as ks

LEVEL = {"theta": 0.0, "mu": 0.0}


def _fit(z, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fit = ks.fit_ou(z, fix=LEVEL, **kw)
    return fit, [str(x.message) for x in w]


def _max_loglik(d):
    """The closed-form maximum: one innovation d ~ N(0, v), largest at v = d**2."""
    return -0.5 * math.log(2 * math.pi * d * d) - 0.5


def _check_ridge(fit, i, d, dt):
    s2, ov = np.ravel(fit.params["sigma2"])[i], np.ravel(fit.params["obs_var"])[i]
    assert s2 * dt + 2 * ov == pytest.approx(d * d, rel=1e-6)  # a point of the ridge
    assert np.ravel(fit.loglik)[i] == pytest.approx(_max_loglik(d), rel=1e-9)
    for p in ("sigma2", "obs_var"):
        assert np.isnan(np.ravel(fit.stderr[p])[i])
        assert not np.ravel(fit.at_boundary[p])[i]


def test_lone_series_is_not_identified():
    fit, warned = _fit(np.array([1.0, 2.0]))
    _check_ridge(fit, 0, 1.0, 1.0)
    assert fit.upper_bound == {}
    assert [w for w in warned if "not identified" in w] and not [
        w for w in warned if "lower bound" in w
    ]
    assert any(n.startswith("sigma2 and obs_var are not identified:") for n in fit.notes)
    assert "<" not in fit.summary().splitlines()[3]  # (no one-sided bound in place of an s.e.)


def test_dataframe_column_reports_the_same():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=40).cumsum() + rng.normal(size=40), "b": np.nan})
    df.loc[[5, 30], "b"] = [1.0, 2.0]
    fit, warned = _fit(df)
    _check_ridge(fit, 1, 1.0, 25.0)
    lone, lone_warned = _fit(np.array([1.0, 2.0]))
    note = [n for n in fit.notes if "not identified" in n]
    lone_note = [n for n in lone.notes if "not identified" in n]
    assert note == [lone_note[0].replace("identified:", "identified in series 'b':")]
    assert [w for w in warned if "not identified" in w] == ["fit_ou: " + note[0]]
    # the other column keeps its standard errors
    assert np.isfinite(fit.stderr["sigma2"][0]) and np.isfinite(fit.stderr["obs_var"][0])


@pytest.mark.parametrize(
    "z, fix",
    [
        (np.array([1.0, 2.0, 1.5]), {}),  # three observations: two innovations
        (np.array([1.0, 2.0]), {"obs_var": 0.1}),  # one variance left free
        (np.array([[1.0, 2.0], [2.0, np.nan], [np.nan, 0.5]]), {"joint": True}),  # gaps 1, 2
    ],
    ids=["three-obs", "obs_var-fixed", "joint-two-gaps"],
)
def test_identified_fits_have_no_ridge_note(z, fix):
    joint = fix.pop("joint", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(z, fix={**LEVEL, **fix}, joint=joint)
    assert not any("not identified" in n for n in fit.notes)


def test_joint_series_of_two_at_one_gap_are_not_identified():
    z = np.array([[1.0, 2.0], [2.0, 0.5]])
    fit, warned = _fit(z, joint=True)
    # two independent innovations of one variance: the maximum at v = mean of their squares
    v = (1.0 + 1.5**2) / 2
    assert fit.params["sigma2"] + 2 * fit.params["obs_var"] == pytest.approx(v, rel=1e-6)
    assert fit.loglik.sum() == pytest.approx(-math.log(2 * math.pi * v) - 1.0, rel=1e-9)
    assert np.isnan(fit.stderr["sigma2"]) and np.isnan(fit.stderr["obs_var"])
    assert [w for w in warned if "not identified" in w]
