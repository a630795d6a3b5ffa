"""The native dense filter (``backend="auto"`` on CPU) where two diffuse directions fade: a power
of ``F`` aligns two unobserved diffuse states it mixes (eigenvalues 1.0024 and 0.5876), so that
the second one's share of the factor falls below ``2^-16`` of the first after about 21 steps and
below the rounding after about 68, though both stay diffuse until observed. The kernel's factor
cannot hold the second direction's scale: it dropped it as dependent past the rounding (the
log-likelihood 1.27 off and the mean 0.27 off at a 45-step gap, silently) and lost digits before
(5.7e-8 of the log-likelihood at 40 steps). It now hands such a series to the torch path, whose
diffuse head carries a graded factor (:mod:`kalmanscan.dense.graded`), as it does a direction
never resolved; its log-likelihood alone (the dense fit's objective) likewise.

Truth: the mpmath oracle's exact diffuse filter (``kalmanscan.validation.oracle.dense_oracle``,
200 digits, kappa = 1e66: an entry above 1e12 is kappa's).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import _args, native
from kalmanscan.validation.oracle import dense_oracle

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

_BIG = 1e12
_MIX = np.array([[0.9, 0.3], [0.2, 0.8]])  # eigenvalues 1.0024, 0.5876
_SLOW_MIX = np.array([[1.0, 0.0, 0.0], [0.0, 0.99, 0.05], [0.0, 0.1, 0.6]])


def _pair(T, gap, seed=5):
    z = np.random.default_rng(seed).normal(size=(T, 2))
    z[:gap] = np.nan
    return z, _MIX, np.diag([1.0, 0.5]), np.eye(2), np.diag([0.3, 0.4])


def _beside(T, gap):
    """An observed random walk beside a pair that ``_SLOW_MIX`` mixes, observed from ``gap``."""
    z = np.random.default_rng(7).normal(size=(T, 3))
    z[:gap, 1:] = np.nan
    return z, _SLOW_MIX, np.diag([1.0, 0.3, 0.2]), np.eye(3), np.diag([0.3, 0.4, 0.5])


CASES = {
    "pair-gap25": _pair(40, 25),  # faded (2^-16 passed), within the rounding
    "pair-gap40": _pair(60, 40),  # native: 5.7e-8 of the log-likelihood off
    "pair-gap45": _pair(60, 45),  # native: -45.134 against -43.866, the mean 0.27 off
    "slow-mix-beside-rw-gap40": _beside(60, 40),  # native: 3.2e-10 off
}


@functools.lru_cache
def _oracle(key):
    return dense_oracle(*CASES[key], dps=200)


def _model(z, F, Q, H, R, axis=0):
    model, _, checks = _args.prepare(z, F, Q, H, R, None, None, None, None, axis, mask=False,
                                     defer=True)  # fmt: skip
    return checks.run(model)


def _check(f, o):
    assert abs(float(f.loglik) - o.loglik) <= 1e-12 * abs(o.loglik)
    assert np.abs(f.mean - o.mean).max() <= 1e-11 * max(np.abs(o.mean).max(), 1.0)
    big = np.abs(o.cov) > _BIG
    np.testing.assert_array_equal(np.isinf(f.cov), big)
    fin = np.where(big, 0.0, o.cov)
    assert np.abs(np.where(big, 0.0, f.cov) - fin).max() <= 1e-11 * np.abs(fin).max()


@pytest.mark.parametrize("backend", ["native", "auto"])
@pytest.mark.parametrize("key", list(CASES))
def test_filter_against_oracle(key, backend):
    _check(kd.filter(*CASES[key], backend=backend), _oracle(key))


@pytest.mark.parametrize("key", ["pair-gap40", "slow-mix-beside-rw-gap40"])
def test_smoother_against_oracle(key):
    """As the torch path's smoother (tests/test_dense_faded_diffuse_direction.py): the mean
    within 1e-5 of its standard deviation (the smoothed variance is 4e17 along the faded
    direction at step 0) and the covariance within 1e-6 of each step's largest entry."""
    o = _oracle(key)
    s = kd.smooth(*CASES[key], backend="native")
    assert abs(float(s.filtered.loglik) - o.loglik) <= 1e-12 * abs(o.loglik)
    sd = np.sqrt(np.diagonal(o.smooth_cov, axis1=1, axis2=2))
    assert (np.abs(s.mean - o.smooth_mean) / sd).max() <= 1e-5
    scale = np.abs(o.smooth_cov).max((-1, -2), keepdims=True)
    assert (np.abs(s.cov - o.smooth_cov) / scale).max() <= 1e-6


@pytest.mark.parametrize("key", ["pair-gap25", "pair-gap45"])
def test_kernel_hands_a_faded_series_on(key):
    """The kernel says so (``None``: the caller's torch path), with and without the smoother."""
    model = _model(*CASES[key])
    assert native.run(model, smooth=False) is None
    assert native.run(model, smooth=True) is None


def test_loglik_alone_against_oracle():
    """``native.loglik`` (the dense fit's objective), a batch of a faded series and an ordinary
    one: each series' exact log-likelihood."""
    zs = [CASES["pair-gap45"][0], _pair(60, 3, seed=11)[0]]
    model = _model(np.stack(zs), *CASES["pair-gap45"][1:], axis=1)
    assert model.z.shape == (2, 60, 2)
    ll = native.loglik(model).numpy()
    for z, got in zip(zs, ll, strict=True):
        want = dense_oracle(z, *CASES["pair-gap45"][1:], dps=200).loglik
        assert abs(got - want) <= 1e-12 * abs(want)


def test_ordinary_models_stay_on_the_kernel():
    """A pair that F mixes, observed after 3 steps (its factor's second direction at 0.2 of the
    first), a local linear trend with a seasonal of 4 (5 diffuse states) and a singular F
    that maps two diffuse states onto one (a dependent column at the rounding, dropped): the
    kernel serves them, and equals the oracle."""
    m = kd.add_components(
        kd.local_linear_trend(level_var=0.5, slope_var=0.05, obs_var=1.0),
        kd.seasonal_dummies(4, seasonal_var=0.1),
    )
    rng = np.random.default_rng(3)
    y = (np.cumsum(rng.normal(size=24)) + 3.0 * np.sin(np.arange(24) / 2))[:, None]
    z2 = np.random.default_rng(2).normal(size=(20, 2))
    z2[:4, 1] = np.nan
    onto_one = np.array([[1.0, 1.0], [0.0, 0.0]])
    models = {
        "pair-gap3": _pair(30, 3),
        "trend-seasonal": (y, m.F, m.Q, m.H, m.R),
        "singular-F": (z2, onto_one, np.diag([0.5, 0.2]), np.eye(2), np.diag([0.3, 0.4])),
    }
    for name, args in models.items():
        assert native.run(_model(*args), smooth=True) is not None, name
        f = kd.filter(*args, backend="native")
        want = dense_oracle(*args, dps=60).loglik
        assert abs(float(f.loglik) - want) <= 1e-11 * abs(want), name


def test_torch_inputs_through_auto():
    """torch in, torch out, through ``"auto"`` on CPU: the same exact figures."""
    z, F, Q, H, R = CASES["pair-gap45"]
    f = kd.filter(*(torch.as_tensor(x) for x in (z, F, Q, H, R)))
    assert isinstance(f.loglik, torch.Tensor)
    want = _oracle("pair-gap45").loglik
    assert abs(float(f.loglik) - want) <= 1e-12 * abs(want)
