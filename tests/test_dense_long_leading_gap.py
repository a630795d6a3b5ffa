"""The torch scan (``kd.filter(..., backend="torch")``, the dense default on a GPU) on a trend first
observed after a long gap, past its sequential head of 16 n + 64 steps, against the mpmath oracle
(``kalmanscan.validation.oracle.dense_oracle``).

The scan decides which diffuse directions the data resolve on the structural information about
x_0, ``O' O`` with rows ``H F^s``: a local linear trend's rows ``[1, s]`` at s near the gap g give
eigenvalues ``4 g^4`` apart, below the rank threshold (64 eps) past g of about 2,000 steps, so the
slope was decided resolved two observations late and the log-likelihood was 1.91 off at a
2,200-step gap (-6.069 against -7.977), silently. The decision is now taken on the information
equilibrated by its diagonal (``kalmanscan.dense.parallel._null_projector``), whose spread is
about ``g^2``. A trend whose slope is per unit of a 300-unit step reaches the same spread after
150 steps (0.34 of the log-likelihood off before). The log-likelihood is exact to 1e-12; the
filtered means to 1e-5 of their standard deviations (6.2e-7 at the 2,200-step gap, the native
kernel's the same: float64's rounding of a slope first seen 2,200 steps after its prior).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense.parallel import _null_projector, rank_tol
from kalmanscan.validation.oracle import dense_oracle


def _trend(h, gap, T, slope_var=1e-6):
    """A local linear trend over steps of ``h`` units (``F = [[1, h], [0, 1]]``), first observed
    at step ``gap``."""
    z = np.cumsum(np.random.default_rng(1).normal(size=T))[:, None]
    z[:gap] = np.nan
    F = np.array([[1.0, h], [0.0, 1.0]])
    return z, F, np.diag([0.5, slope_var]), np.array([[1.0, 0.0]]), np.array([[1.0]])


@pytest.mark.parametrize("s", [10.0, 3000.0, 30000.0])
def test_two_far_rows_resolve_both_directions(s):
    """The structural information of two observations of a trend s steps from x_0 (rows
    ``[1, s]`` and ``[1, s + 1]``: eigenvalues ``4 s^4`` apart) has no null direction; one
    observation leaves the direction ``[-s, 1]`` unresolved."""
    tol = rank_tol(torch.float64)
    eye = torch.eye(2, dtype=torch.float64)
    r1 = torch.tensor([[1.0, s]], dtype=torch.float64)
    r2 = torch.tensor([[1.0, s + 1.0]], dtype=torch.float64)
    both = _null_projector(r1.mT @ r1 + r2.mT @ r2, eye, tol)
    assert float(both.trace()) < 0.5
    one = _null_projector(r1.mT @ r1, eye, tol)
    assert abs(float(one.trace()) - 1.0) < 1e-12
    v = torch.tensor([-s, 1.0], dtype=torch.float64) / np.hypot(s, 1.0)
    torch.testing.assert_close(one, torch.outer(v, v), rtol=0, atol=1e-12)


def _check(args, gap, dps=40):
    o = dense_oracle(*args, dps=dps)
    f = kd.filter(*args, backend="torch")
    assert abs(float(f.loglik) - o.loglik) <= 1e-12 * abs(o.loglik)
    fsd = np.sqrt(np.diagonal(o.cov[gap:], axis1=1, axis2=2))
    assert (np.abs(f.mean[gap:] - o.mean[gap:]) / fsd).max() <= 1e-5
    s = kd.smooth(*args, backend="torch")
    sd = np.sqrt(np.diagonal(o.smooth_cov, axis1=1, axis2=2))
    assert (np.abs(s.mean - o.smooth_mean) / sd).max() <= 1e-6


def test_trend_over_long_steps_after_a_gap():
    """(The oracle's 40 digits are enough here: the same log-likelihood at 60; over 1,000-unit
    steps after 100 they are not, -14.05 at 40 digits, -11.3497026526739 at 80 as every
    backend gives.)"""
    args = _trend(300.0, 150, 158)
    assert abs(dense_oracle(*args, dps=60).loglik - dense_oracle(*args, dps=40).loglik) <= 1e-13
    _check(args, 150)


@pytest.mark.slow
def test_trend_after_a_2200_step_gap():
    """The ordinary local linear trend (unit steps) first observed at step 2,200."""
    _check(_trend(1.0, 2200, 2206, slope_var=0.05), 2200)
