"""The fit's evaluations on irregular times: the first step's process variance is 0 (the times'
first step), which sent every call of an irregular record through the full tiny-variance grid
(``positive_min`` now bounds the others), and the stencil's 21 lanes hold 3 distinct thetas,
whose transitions are computed once each. Values unchanged, bit for bit."""

import warnings

import numpy as np
import torch

import kalmanscan as ks
from kalmanscan.core import filter_units
from kalmanscan.timeseries import objective


def test_transitions_once_a_theta_equal_the_lanes_own():
    rng = np.random.default_rng(0)
    dt = np.concatenate([[0.0], rng.exponential(1.0, 500)])[:, None]
    theta = np.repeat(np.array([0.3, 1e-6, 40.0]), 7)  # (small, middle and large x branches)
    sigma2 = rng.uniform(0.1, 3.0, theta.size)
    mu = rng.normal(size=theta.size)
    got = objective._lane_arrays_np(theta, sigma2, mu, dt, False)
    decay, pv = objective._ou_transition_np(theta, sigma2, dt)
    np.testing.assert_array_equal(got[0], decay)
    np.testing.assert_array_equal(got[1], pv)
    np.testing.assert_array_equal(got[2], mu * (1 - decay))


def test_irregular_fit_skips_the_tiny_grid(monkeypatch):
    calls = []
    real = filter_units.tiny_grid

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(filter_units, "tiny_grid", counted)
    monkeypatch.setattr(objective.filter_api, "tiny_grid", counted)
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(1.0, 2000))
    z = np.cumsum(rng.normal(size=2000)) + rng.normal(size=2000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ks.fit_ou(z, times=t)
    assert fit.converged and not calls


def test_positive_min_bounds_what_the_grid_pairs():
    p = np.array([0.0, np.nan, np.inf, 2.0, 0.25])
    assert filter_units.positive_min(p) == 0.25
    assert filter_units.positive_min(np.zeros(3)) == np.inf
    # a step without process variance adds only obs_var's term: the bound still holds it
    below = filter_units._tiny_below(torch.float64)
    R = np.array([[1e-300]])
    need = filter_units.tiny_grid(R, np.ones((1, 1)), np.zeros((3, 1)), 3, 1, torch.float64)[0]
    assert need.all() and not filter_units.extremes_clear(1e-300, 1.0, np.inf, below)
    need = filter_units.tiny_grid(R * 0 + 1.0, np.ones((1, 1)), np.zeros((3, 1)), 3, 1,
                                  torch.float64)[0]  # fmt: skip
    assert not need.any() and filter_units.extremes_clear(1.0, 1.0, np.inf, below)
