"""OUModel with tensor parameters on numpy data: filter, smooth, loglik and forecast give the
numpy-parameter results (as tensors that keep gradients, docs/api.md "OUModel"), with time on
any axis; before, smooth (and filter/loglik with time off axis 0) raised ``TypeError:
transpose()`` from ``np.moveaxis`` given a tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kalmanscan.timeseries import OUModel

TIMES = np.array([0.0, 1.0, 2.5, 3.0, 7.0])
Z1 = np.array([1.0, 2.0, 0.5, np.nan, 3.0])  # [T]
Z2 = np.stack([Z1, [0.0, 1.0, 2.0, 1.5, np.nan], [-1.0, 0.0, 0.5, 1.0, 2.0]], axis=1)  # [T, 3]

# (id, model parameters); each value becomes a float64 tensor in the tensor case
CASES = [
    ("theta-0.5", dict(theta=0.5, sigma2=1.0, obs_var=0.3)),
    ("theta-0-random-walk", dict(theta=0.0, sigma2=1.0, obs_var=0.3)),
    ("all-tensors", dict(theta=0.8, sigma2=2.0, mu=0.7, obs_var=0.4)),
    ("per-series", dict(theta=[0.5, 0.0, 1.5], sigma2=[1.0, 2.0, 0.5], obs_var=0.3)),
]


def _models(params, tensor_keys=None, dtype=torch.float64):
    keys = params if tensor_keys is None else tensor_keys
    as_t = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in params.items()
            if k in keys}  # fmt: skip
    return OUModel(**{**params, **as_t}), OUModel(**params), as_t


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _data(params, axis):
    z = Z2 if np.ndim(params.get("theta", 0.0)) else Z1
    return (np.moveaxis(z, 0, axis) if z.ndim > 1 else z), z.ndim


@pytest.mark.parametrize("axis", [0, 1], ids=["time-axis0", "time-axis1"])
@pytest.mark.parametrize(("cid", "params"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("tensor_keys", [None, ("theta",)], ids=["all-tensor", "theta-tensor"])
def test_tensor_parameters_on_numpy_data_match_numpy_parameters(cid, params, axis, tensor_keys):
    z, ndim = _data(params, axis)
    if axis >= ndim:
        z = np.stack([z, z], axis=0)  # [2, T]: time on axis 1
    tm, nm, _ = _models(params, tensor_keys)
    kw = dict(axis=axis)
    tf, nf = tm.filter(z, TIMES, **kw), nm.filter(z, TIMES, **kw)
    ts, ns = tm.smooth(z, TIMES, **kw), nm.smooth(z, TIMES, **kw)
    for got, want in ((tf, nf), (ts.filtered, ns.filtered)):
        assert isinstance(got.mean, torch.Tensor)  # (docs/api.md: the results are then tensors)
        for k in ("mean", "var", "pred_mean", "pred_var", "precision", "loglik"):
            np.testing.assert_allclose(_np(getattr(got, k)), getattr(want, k), rtol=1e-12,
                                       atol=1e-14, err_msg=k)  # fmt: skip
    assert isinstance(ts.mean, torch.Tensor) and tuple(ts.mean.shape) == ns.mean.shape
    np.testing.assert_allclose(_np(ts.mean), ns.mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_np(ts.var), ns.var, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_np(tm.loglik(z, TIMES, **kw)), nm.loglik(z, TIMES, **kw),
                               rtol=1e-12)  # fmt: skip
    tc, nc = tm.forecast(z, TIMES, steps=2, **kw), nm.forecast(z, TIMES, steps=2, **kw)
    for k in ("mean", "var", "predictive_var", "lower", "upper"):
        np.testing.assert_allclose(_np(getattr(tc, k)), getattr(nc, k), rtol=1e-12, err_msg=k)


@pytest.mark.parametrize("theta", [0.5, 0.0], ids=["theta-0.5", "theta-0"])
def test_float32_tensor_theta_float64_data(theta):
    """The issue's call: ``theta=torch.tensor(0.5)`` (float32) with float64 numpy data."""
    m = OUModel(theta=torch.tensor(theta), sigma2=1.0, obs_var=0.3)
    want = OUModel(theta=theta, sigma2=1.0, obs_var=0.3).smooth(Z1, TIMES)
    got = m.smooth(Z1, TIMES)
    np.testing.assert_allclose(_np(got.mean), want.mean, rtol=1e-6)
    np.testing.assert_allclose(_np(got.var), want.var, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1], ids=["time-axis0", "time-axis1"])
def test_smooth_keeps_gradients_of_tensor_parameters(axis):
    """d(sum of smoothed means)/d(theta, sigma2, obs_var) by autograd = central differences of
    the numpy-parameter model."""
    params = dict(theta=0.8, sigma2=2.0, mu=0.7, obs_var=0.4)
    z = Z2 if axis == 0 else Z2.T
    tm, _, leaves = _models(params)
    tm.smooth(z, TIMES, axis=axis).mean.sum().backward()
    for k in ("theta", "sigma2", "obs_var"):
        h = 1e-6
        up = OUModel(**{**params, k: params[k] + h}).smooth(z, TIMES, axis=axis).mean.sum()
        dn = OUModel(**{**params, k: params[k] - h}).smooth(z, TIMES, axis=axis).mean.sum()
        assert leaves[k].grad is not None
        assert float(leaves[k].grad) == pytest.approx((up - dn) / (2 * h), rel=1e-5, abs=1e-8), k
