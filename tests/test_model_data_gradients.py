"""``OUModel.filter``, ``smooth`` and ``loglik`` of tensor data run the filter on the tensor: the
results are tensors that follow its graph (the data were read as numbers there and the gradient
was dropped silently, ``z.grad`` staying ``None``). The values are the numpy path's, bit for
bit; the gradients are those of :func:`kalmanscan.loglik` / :func:`kalmanscan.filter` on the
model's own arguments and pass ``gradcheck`` (central differences)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

RNG = np.random.default_rng(11)
Z = RNG.normal(size=(12, 2)).cumsum(0) * 300.0  # (a unit c other than 1)
Z[4, 0] = np.nan
TIMES = np.array([0.0, 1, 2, 3.5, 4, 5, 7, 8, 9, 9.5, 11, 12])
MODEL = ks.OUModel(theta=0.3, sigma2=900.0, mu=50.0, obs_var=400.0)


def _z(requires_grad=True, dtype=torch.float64):
    return torch.tensor(Z, dtype=dtype, requires_grad=requires_grad)


def test_loglik_gradient_is_the_filters():
    z = _z()
    ll = MODEL.loglik(z, TIMES)
    assert isinstance(ll, torch.Tensor) and ll.requires_grad
    ll.sum().backward()
    z2 = _z()
    args = MODEL.filter_args(as_time_axis(TIMES, 12), 1)
    ks.loglik(z2, **args).sum().backward()
    torch.testing.assert_close(z.grad, z2.grad, rtol=1e-12, atol=1e-15)
    assert z.grad[4, 0] == 0 and (z.grad[:, 1] != 0).all()  # (a missing value: no gradient)


@pytest.mark.parametrize("method", ["loglik", "filter", "smooth"])
def test_gradcheck(method):
    def f(z):
        out = getattr(MODEL, method)(z, TIMES[:6], axis=1)
        if method == "loglik":
            return out
        return (out.mean, out.var) if method == "smooth" else (out.mean, out.loglik)

    z = torch.tensor(Z[:6].T / 300.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (z,), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_are_the_numpy_paths(dtype):
    z = _z(requires_grad=False, dtype=dtype)
    zn = z.numpy()
    for method in ("filter", "smooth"):
        got, want = getattr(MODEL, method)(z, TIMES), getattr(MODEL, method)(zn, TIMES)
        for name in ("mean", "var"):
            g, w = getattr(got, name), getattr(want, name)
            assert isinstance(g, torch.Tensor) and g.dtype == dtype
            np.testing.assert_array_equal(g.numpy(), w)
    got = MODEL.loglik(z, TIMES)
    np.testing.assert_array_equal(got.numpy(), MODEL.loglik(zn, TIMES))


def test_forecast_from_tensor_data_unchanged():
    z = _z()
    fc = MODEL.forecast(z, TIMES, steps=2)
    fc.mean.sum().backward()
    assert z.grad is not None and z.grad[-1].abs().sum() > 0
    np.testing.assert_array_equal(fc.mean.detach().numpy(), MODEL.forecast(Z, TIMES, steps=2).mean)
