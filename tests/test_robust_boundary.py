"""The robust screen where a variance is on its bound 0, and moves of the level. A record held at
2.5 and then 2.6 (one move of 0.1), with four rows missing, lost the two values beside its move
to ``fit_ou(robust=True)``: the plain fit gives them auxiliary residuals of -4.6 and 4.6, and the
fit without them puts ``obs_var`` on its bound 0, where the residuals of kept observations were
still computed from ``obs_var - P_t|T`` (two tiny numbers; only an ``obs_var`` of exactly 0, or a
difference below 1e-9 of it, counted as undefined). The fit's ``at_boundary`` now says which
residuals are defined (a kept observation is its state where ``obs_var`` is on its bound; the
state's innovation is undefined where ``sigma2`` is), and two neighbouring residuals of opposite
sign that one larger move of the state explains are no outliers (Harvey & Koopman 1992)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.testing import assert_close
from kalmanscan.timeseries import load_nile
from kalmanscan.timeseries.robust import (
    auxiliary_residuals,
    fit_ou_robust,
    smoothed_disturbances,
)

PARAMS = ("theta", "sigma2", "mu", "obs_var")
GAPS = [5, 15, 30, 40]


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(w.message) for w in caught]


def _held(first=20, n=50):
    """A rate held at 2.5 for ``first`` steps and at 2.6 for the rest: one move of 0.1."""
    return np.r_[np.full(first, 2.5), np.full(n - first, 2.6)]


@pytest.mark.parametrize("first", [20, 25], ids=["move-at-20", "move-at-25"])
@pytest.mark.parametrize("fill", [np.nan, -9999.0], ids=["missing", "code"])
def test_the_move_of_a_record_held_but_for_one_move_is_not_screened(first, fill):
    z = _held(first)
    z[GAPS] = fill
    fit, msgs = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == ([] if np.isnan(fill) else GAPS)
    assert not any("had not settled" in m for m in msgs)
    missing = _held(first)
    missing[GAPS] = np.nan
    want, _ = _quiet(ks.fit_ou, missing)  # exactly the Gaussian fit of the rest
    for p in PARAMS:
        assert fit.params[p] == pytest.approx(want.params[p], rel=1e-6, abs=1e-12), p


def test_the_move_shows_in_the_state_residual_not_as_two_outliers():
    """The numbers docs/model.md quotes: a_t of -4.6 and 4.6 beside the move, 6.6 on its step."""
    z = _held(20)
    z[GAPS] = np.nan
    fit, _ = _quiet(ks.fit_ou, z)
    assert not fit.at_boundary["obs_var"] and not fit.at_boundary["sigma2"]
    d = smoothed_disturbances(fit, z[:, None], np.zeros((50, 1), bool))
    a, b = d.observation[:, 0], d.state[:, 0]
    assert a[19] == pytest.approx(-4.64, abs=0.01) and a[20] == pytest.approx(4.64, abs=0.01)
    assert b[20] == pytest.approx(6.61, abs=0.01)
    assert np.nanmax(np.abs(np.delete(b, 20))) < 1.0  # one move of the state, nothing else
    assert np.isnan(b[0]) and np.isnan(a[GAPS]).all()


def _gap_at_the_move():
    """The held record without the two values beside its move (nor rows 5, 15, 30, 40): the
    fit puts ``obs_var`` on its bound."""
    z = _held(25)
    z[GAPS + [24, 25]] = np.nan
    return z


def test_kept_observations_have_no_residual_where_obs_var_is_on_its_bound():
    z = _held(25)
    z[GAPS] = np.nan
    screened = np.zeros(50, bool)
    screened[[24, 25]] = True
    fit, _ = _quiet(ks.fit_ou, np.where(screened, np.nan, z))
    assert fit.at_boundary["obs_var"] and not fit.at_boundary["sigma2"]
    a = auxiliary_residuals(fit, z[:, None], screened[:, None])[:, 0]
    kept = ~screened & ~np.isnan(z)
    assert np.isnan(a[kept]).all()  # each is its state: 0 over a variance of 0
    # a screened value is measured against the state's prediction from the kept data
    assert a[24] == pytest.approx(-4.62, abs=0.01) and a[25] == pytest.approx(4.62, abs=0.01)
    d = smoothed_disturbances(fit, z[:, None], screened[:, None])
    assert np.isfinite(d.state[1:, 0]).all()  # the state's innovations stay defined


def test_no_value_beside_a_gap_is_screened_where_obs_var_is_on_its_bound():
    """With a lower threshold the kept values beside the gap (residuals of 3.3 from two tiny
    numbers) were screened."""
    z = _gap_at_the_move()
    plain, _ = _quiet(ks.fit_ou, z)
    assert plain.at_boundary["obs_var"]
    fit, _ = _quiet(fit_ou_robust, z, threshold=3.0)
    assert not fit.outliers.any()


def test_state_residuals_are_undefined_where_sigma2_is_on_its_bound():
    w = np.random.default_rng(0).normal(size=100)  # white noise: a local level that never moves
    fit, _ = _quiet(ks.fit_ou, w, fix={"theta": 0.0, "mu": 0.0})
    assert fit.at_boundary["sigma2"] and not fit.at_boundary["obs_var"]
    d = smoothed_disturbances(fit, w[:, None], np.zeros((100, 1), bool))
    assert np.isnan(d.state).all() and np.isfinite(d.observation).all()


def _dense(theta, sigma2, mu, obs_var, times, z, kept, diffuse):
    """Smoothed mean and covariance of ``x`` given the kept ``z``, from the joint Gaussian in
    information form (a diffuse first state for the random walk, else the stationary one)."""
    T = z.size
    dt = np.diff(times)
    phi = np.exp(-theta * dt)
    q = sigma2 * dt if theta == 0 else sigma2 * (1 - phi**2) / (2 * theta)
    c = mu * (1 - phi)
    lam, eta = np.zeros((T, T)), np.zeros(T)
    if not diffuse:
        v0 = sigma2 / (2 * theta)
        lam[0, 0] += 1 / v0
        eta[0] += mu / v0
    for t in range(1, T):
        g = np.zeros(T)
        g[t], g[t - 1] = 1.0, -phi[t - 1]  # x_t - phi x_t-1 = c + eta_t
        lam += np.outer(g, g) / q[t - 1]
        eta += g * c[t - 1] / q[t - 1]
    for t in np.flatnonzero(kept):
        lam[t, t] += 1 / obs_var
        eta[t] += z[t] / obs_var
    cov = np.linalg.inv(lam)
    return cov @ eta, cov, phi, q, c


@pytest.mark.parametrize("fix", [{}, {"theta": 0.0, "mu": 0.0}], ids=["ou", "local-level"])
def test_both_residuals_match_a_dense_joint_gaussian(fix):
    """Irregular times, missing and screened years of the Nile."""
    _, flow = load_nile()
    times = np.r_[0:30, 35:70, 71:100] * 0.5
    z = flow[:94].astype(np.float64)
    z[[3, 50]] = np.nan
    screened = np.zeros(94, bool)
    screened[[0, 10, 11, 40, 93]] = True
    fit, _ = _quiet(ks.fit_ou, np.where(screened, np.nan, z), times, fix=fix)
    d = smoothed_disturbances(fit, z[:, None], screened[:, None])
    p = {k: float(v) for k, v in fit.params.items()}
    kept = ~screened & ~np.isnan(z)
    mean, cov, phi, q, c = _dense(*(p[k] for k in PARAMS), times, z, kept, bool(fix))
    var = np.diag(cov)
    with np.errstate(invalid="ignore"):
        want_a = (z - mean) / np.sqrt(np.where(screened, p["obs_var"] + var, p["obs_var"] - var))
    eta = mean[1:] - phi * mean[:-1] - c
    v_eta = var[1:] + phi**2 * var[:-1] - 2 * phi * np.diag(cov, 1)  # Var(eta | kept)
    ok = ~np.isnan(z)
    assert np.isnan(d.observation[~ok, 0]).all()
    assert_close(d.observation[ok, 0], want_a[ok], "truth", "float64", what="observation")
    # undefined exactly where the kept data say nothing of the step (Var(E[eta | kept]) = 0):
    # after the last kept year (93 is screened), and before the first (0 is) from a diffuse start
    b = d.state[1:, 0]
    silent = np.flatnonzero(np.isnan(b)) + 1
    assert silent.tolist() == ([1, 93] if fix else [93])
    assert np.abs(q - v_eta)[silent - 1].max() < 1e-9 * q.max()
    told = ~np.isnan(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        want_b = eta / np.sqrt(q - v_eta)
    assert_close(b[told], want_b[told], "truth", "float64", what="state")
    assert np.isnan(d.state[0, 0])


def test_an_outlier_beside_a_move_is_screened_and_the_move_is_not():
    z = np.r_[np.full(30, 2.5), np.full(30, 2.6)]
    z[[10, 50]] = np.nan
    z[45] = 2.9
    fit, _ = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [45]


def test_two_neighbouring_errors_of_opposite_sign_are_both_screened():
    """Two neighbouring data errors need the state to move there and back: no move of the
    level. The fit with them forgets in a step (theta 176 a year), where the state's
    innovations equal the observations' residuals."""
    years, flow = load_nile()
    z = flow.astype(np.float64)
    z[29], z[30] = -900.0, 3100.0
    fit, _ = _quiet(ks.fit_ou, z, years, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [29, 30]


@pytest.mark.parametrize("joint", [False, True], ids=["per-series", "joint"])
def test_series_of_a_batch_keep_their_own_moves_and_outliers(joint):
    held = _held(20)
    held[GAPS] = np.nan
    spiky = held.copy()
    spiky[33] = 3.0
    fit, _ = _quiet(ks.fit_ou, np.column_stack([held, spiky]), robust=True, joint=joint)
    assert np.argwhere(fit.outliers).tolist() == [[33, 1]]


def test_a_one_year_dip_stays_screened_where_the_fit_without_it_has_no_observation_noise():
    """Japan's fertility of 1966 (the fire-horse year): a dip in a smooth record. Screened, it
    leaves a fit with ``obs_var`` on its bound, where its residual against the state's prediction
    stays defined; undefined, it would come back and the rounds would cycle."""
    sm = pytest.importorskip("statsmodels.api")
    fert = sm.datasets.fertility.load_pandas().data
    row = fert[fert.iloc[:, 0] == "Japan"].iloc[0, 4:].astype(float).to_numpy()
    z = row[~np.isnan(row)]
    fit, msgs = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [6]
    assert fit.at_boundary["obs_var"] and not any("had not settled" in m for m in msgs)
    d = smoothed_disturbances(fit, z[:, None], fit.outliers[:, None])
    assert d.observation[6, 0] < -10 and np.isnan(np.delete(d.observation[:, 0], 6)).all()
