"""Forecasts of tensor parameters or data: tensors out, differentiable (ks.forecast,
OUModel.forecast), checked against central differences of the numpy forecast in float64 and
by torch.autograd.gradcheck; numpy in stays numpy out."""

import numpy as np
import pytest
import torch

import kalmanscan as ks

Z = np.array([1.2, 0.7, np.nan, 0.9, 3.1])
T = np.array([0.0, 1.0, 1.5, 2.5, 4.0])
P0 = {"theta": 0.3, "sigma2": 0.8, "mu": 1.5, "obs_var": 0.2}
FIELDS = ("mean", "var", "predictive_var", "lower", "upper")


def _numpy_forecast(params, z=Z, **kw):
    fc = ks.forecast(ks.OUModel(**params), z, T, steps=3, **kw)
    return np.concatenate([np.asarray(getattr(fc, k)).ravel() for k in FIELDS])


def _torch_forecast(params, z=Z, **kw):
    fc = ks.forecast(ks.OUModel(**params), z, T, steps=3, **kw)
    return torch.cat([getattr(fc, k).reshape(-1) for k in FIELDS])


def test_repro_theta_tensor_keeps_graph():
    theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    fc = ks.forecast(ks.OUModel(theta=theta, sigma2=0.8, mu=1.5, obs_var=0.2), Z, T, steps=2)
    for k in FIELDS:
        assert isinstance(getattr(fc, k), torch.Tensor), k
        assert getattr(fc, k).dtype == torch.float64
    (g,) = torch.autograd.grad(fc.mean.sum(), theta)
    assert torch.isfinite(g)
    ref = ks.forecast(ks.OUModel(**P0), Z, T, steps=2)
    for k in FIELDS:
        np.testing.assert_allclose(getattr(fc, k).detach().numpy(), getattr(ref, k), rtol=1e-14)


@pytest.mark.parametrize("name", ["theta", "sigma2", "mu", "obs_var"])
def test_param_gradient_matches_central_difference(name):
    x = torch.tensor(P0[name], dtype=torch.float64, requires_grad=True)
    out = _torch_forecast({**P0, name: x})
    jac = torch.stack([torch.autograd.grad(o, x, retain_graph=True)[0] for o in out])
    h = 1e-6 * max(abs(P0[name]), 1.0)
    fd = _numpy_forecast({**P0, name: P0[name] + h}) - _numpy_forecast({**P0, name: P0[name] - h})
    np.testing.assert_allclose(jac.numpy(), fd / (2 * h), rtol=1e-6, atol=1e-8)


def test_gradcheck_params_and_data():
    def f(theta, sigma2, mu, obs_var, z):
        m = ks.OUModel(theta=theta, sigma2=sigma2, mu=mu, obs_var=obs_var)
        fc = m.forecast(z, T, steps=2)
        return fc.mean, fc.var, fc.lower, fc.upper

    args = [torch.tensor(P0[k], dtype=torch.float64, requires_grad=True) for k in P0]
    z_obs = torch.tensor(np.nan_to_num(Z, nan=0.5), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (*args, z_obs))


def test_data_gradient_matches_central_difference_with_missing():
    z = torch.tensor(Z, dtype=torch.float64, requires_grad=True)
    fc = ks.forecast(ks.OUModel(**P0), z, T, steps=3)
    assert isinstance(fc.mean, torch.Tensor)
    (g,) = torch.autograd.grad(fc.mean.sum() + fc.upper.sum(), z)
    h = 1e-6
    for i in np.flatnonzero(~np.isnan(Z)):
        up, dn = Z.copy(), Z.copy()
        up[i] += h
        dn[i] -= h
        fd = [ks.forecast(ks.OUModel(**P0), zz, T, steps=3) for zz in (up, dn)]  # numpy truth
        val = [f.mean.sum() + f.upper.sum() for f in fd]
        np.testing.assert_allclose(g[i].item(), (val[0] - val[1]) / (2 * h), rtol=1e-6)
    assert g[2].item() == 0.0  # a missing value has no influence


def test_random_walk_theta_zero_gradient():
    # theta = 0 is the bound: a one-sided second-order difference from the numpy forecast; the
    # prior is given (diffuse) so that it does not move with theta (the default's does)
    p = {**P0, "prior_var": np.inf}
    x = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    out = _torch_forecast({**p, "theta": x})
    jac = torch.stack([torch.autograd.grad(o, x, retain_graph=True)[0] for o in out]).numpy()
    h = 1e-5
    f = [_numpy_forecast({**p, "theta": k * h}) for k in range(3)]
    fd = (-3 * f[0] + 4 * f[1] - f[2]) / (2 * h)
    np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-7)


def test_future_params_tensor_keeps_graph_and_numpy_unchanged():
    ov = torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64, requires_grad=True)
    fc = ks.forecast(ks.OUModel(**P0), Z, T, steps=3, future_params={"obs_var": ov})
    (g,) = torch.autograd.grad(fc.predictive_var.sum(), ov)
    np.testing.assert_allclose(g.numpy(), [1.0, 1.0, 1.0], rtol=1e-14)
    ref = ks.forecast(ks.OUModel(**P0), Z, T, steps=3, future_params={"obs_var": [0.3, 0.5, 0.7]})
    assert isinstance(ref.mean, np.ndarray) and isinstance(ref.predictive_var, np.ndarray)
    np.testing.assert_allclose(fc.predictive_var.detach().numpy(), ref.predictive_var, rtol=1e-14)


def test_float32_tensor_data_gives_float32_and_series_axis():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(2, 5)).astype(np.float32)  # series first, time on axis 1
    zt = torch.tensor(z, requires_grad=True)
    fc = ks.OUModel(**P0).forecast(zt, T, steps=2, axis=1)
    assert fc.mean.dtype == torch.float32 and fc.mean.shape == (2, 2)
    ref = ks.OUModel(**P0).forecast(z, T, steps=2, axis=1)
    np.testing.assert_allclose(fc.mean.detach().numpy(), ref.mean, rtol=1e-5)
    (g,) = torch.autograd.grad(fc.mean.sum(), zt)
    assert g.shape == (2, 5) and torch.isfinite(g).all()


def test_forgotten_diffuse_state_has_finite_gradients():
    # theta dt large: decay 0 forgets a never-observed diffuse state (0 * inf nowhere)
    theta = torch.tensor(800.0, dtype=torch.float64, requires_grad=True)
    sigma2 = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    m = ks.OUModel(theta=theta, sigma2=sigma2, mu=1.5, obs_var=0.2, prior_var=np.inf)
    fc = m.forecast(np.full(3, np.nan), np.array([0.0, 1.0, 2.0]), steps=1)
    np.testing.assert_allclose(fc.mean.detach().numpy(), [1.5])
    np.testing.assert_allclose(fc.var.detach().numpy(), [2.0 / 1600.0], rtol=1e-14)
    g = torch.autograd.grad(fc.var.sum() + fc.mean.sum(), (theta, sigma2))
    np.testing.assert_allclose([x.item() for x in g], [-2.0 / (2 * 800.0**2), 1 / 1600.0])


def test_differentiable_at_refused_with_message():
    at = torch.tensor([5.0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match=r"at: expected values without a gradient.*detach"):
        ks.forecast(ks.OUModel(**P0), Z, T, at=at)
