"""Dense model builders given torch tensors: torch matrices on the tensors' graph, so gradients
of kd.filter's log-likelihood reach the parameters (checked against central differences of the
numpy-built model in float64, and an LBFGS fit of the Nile against statsmodels)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch.optim's first optimizer imports it: about 2 s)

import kalmanscan.dense as kd

try:  # imported at collection: the import alone takes about 2 s
    from statsmodels.datasets import nile
    from statsmodels.tsa.statespace.structural import UnobservedComponents
except ImportError:
    nile = UnobservedComponents = None

RNG = np.random.default_rng(11)
Z1 = np.cumsum(RNG.normal(0.0, 1.0, 40))[:, None]  # one observed series, 40 steps
Z1[[5, 17]] = np.nan
ZPOS = np.cumsum(RNG.normal(0.0, 0.3, (30, 2)), axis=0)  # two observed positions, 30 steps

CASES = {
    "llt": (kd.local_linear_trend, dict(level_var=0.3, slope_var=0.02, obs_var=1.5), Z1),
    "seasonal4": (lambda **p: kd.seasonal_dummies(4, **p), dict(seasonal_var=0.2, obs_var=0.9), Z1),
    "cv-ndim2": (
        lambda **p: kd.constant_velocity(ndim=2, **p),
        dict(dt=0.7, accel_var=0.4, obs_var=0.3),
        ZPOS,
    ),
    "ca-dt-T30": (
        kd.constant_acceleration,
        dict(dt=np.linspace(0.2, 1.4, 30), jerk_var=0.05, obs_var=0.5),
        ZPOS[:, :1],
    ),
    "ou-sum-k2": (
        kd.ou_sum,
        dict(theta=[0.3, 1.7], sigma2=[0.8, 0.4], dt=1.0, obs_var=0.6, mu=[0.5, -0.2]),
        Z1,
    ),
    "llt+seasonal": (
        lambda level_var, seasonal_var, obs_var: kd.add_components(
            kd.local_linear_trend(level_var, 0.01, obs_var), kd.seasonal_dummies(4, seasonal_var)
        ),
        dict(level_var=0.3, seasonal_var=0.2, obs_var=1.1),
        Z1,
    ),
}


def _loglik(build, params, z):
    return kd.filter(z, **build(**params)._asdict()).loglik


@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_loglik_gradient_reaches_every_tensor_parameter(case):
    build, params, z = CASES[case]
    tens = {
        k: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True)
        for k, v in params.items()
    }
    model = build(**tens)
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in model)
    _loglik(build, tens, torch.from_numpy(z)).backward()
    for name, v in params.items():
        v = np.asarray(v, dtype=np.float64)
        grad = tens[name].grad
        assert grad is not None, f"{case}: {name} got no gradient"
        fd = np.zeros(v.shape)
        for i in np.ndindex(v.shape):
            # (h 1e-5: the difference quotient's rounding, eps |loglik| / h, stays below atol on
            # every backend; its truncation, h^2, far below rtol)
            h = 1e-5 * max(abs(v[i]), 1e-2)
            up, dn = v.copy(), v.copy()
            up[i] += h
            dn[i] -= h
            lu = _loglik(build, {**params, name: up if v.ndim else float(up)}, z)
            ld = _loglik(build, {**params, name: dn if v.ndim else float(dn)}, z)
            fd[i] = (float(lu) - float(ld)) / (2 * h)
        np.testing.assert_allclose(grad.numpy(), fd, rtol=2e-6, atol=1e-6, err_msg=f"{case} {name}")


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_model_equals_the_numpy_model(case):
    build, params, _ = CASES[case]
    for dtype, np_dtype in ((torch.float64, np.float64), (torch.float32, np.float32)):
        rounded = {k: np.asarray(v, dtype=np_dtype) for k, v in params.items()}
        ref = build(**{k: v.astype(np.float64) for k, v in rounded.items()})
        assert all(isinstance(x, np.ndarray) for x in ref)
        model = build(**{k: torch.from_numpy(v) for k, v in rounded.items()})
        for field, x, y in zip(ref._fields, ref, model, strict=True):
            assert isinstance(y, torch.Tensor) and y.dtype == dtype, f"{case} {field} {dtype}"
            np.testing.assert_allclose(
                y.double().numpy(),
                x,
                rtol=4e-16 if dtype == torch.float64 else 1e-7,
                atol=0,
                err_msg=f"{case} {field} {dtype}",
            )


def test_one_tensor_among_floats_is_enough_and_extreme_scales_stay_exact():
    # q dt^5 with q = 1e300 and dt = 1e-70 (each power alone underflows): the same split as numpy
    q = torch.tensor(1e300, dtype=torch.float64, requires_grad=True)
    m = kd.constant_acceleration(1e-70, jerk_var=q, obs_var=1.0)
    ref = kd.constant_acceleration(1e-70, jerk_var=1e300, obs_var=1.0)
    np.testing.assert_allclose(m.Q.detach().numpy(), ref.Q, rtol=4e-16, atol=0)
    (g,) = torch.autograd.grad(m.Q[0, 0], q)
    assert math.isclose(float(g), ref.Q[0, 0] / 1e300, rel_tol=1e-15)


def test_a_tensor_with_several_entries_is_refused_naming_it():
    with pytest.raises(TypeError, match="level_var"):
        kd.local_linear_trend(torch.tensor([0.1, 0.2]), 0.01, 1.0)
    with pytest.raises(ValueError, match="obs_var"):
        kd.local_linear_trend(0.1, 0.01, torch.tensor(-1.0, requires_grad=True))


@pytest.mark.skipif(nile is None, reason="statsmodels is not installed")
def test_lbfgs_fit_of_the_nile_reaches_statsmodels():
    y = nile.load_pandas().data["volume"].to_numpy(dtype=np.float64)
    z = torch.tensor(y)[:, None]
    # log level and observation variances, slope standard deviation (its MLE is 0)
    x = torch.tensor([math.log(1e3), 1.0, math.log(1e4)], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [x], max_iter=30, tolerance_grad=1e-9, tolerance_change=1e-14, line_search_fn="strong_wolfe"
    )

    def variances(x):
        return x[0].exp(), x[1] ** 2, x[2].exp()

    def nll():
        opt.zero_grad()
        loss = -kd.filter(z, **kd.local_linear_trend(*variances(x))._asdict()).loglik
        loss.backward()
        return loss

    opt.step(nll)
    ours = -float(nll().detach()) - math.log(2 * math.pi)  # statsmodels' convention (docs/dense.md)
    mod = UnobservedComponents(y, "lltrend", use_exact_diffuse=True)
    lv, sv, ov = (float(v) for v in variances(x.detach()))
    assert math.isclose(ours, mod.loglike([ov, lv, sv]), rel_tol=1e-11)
    assert ours >= mod.fit(disp=False).llf - 1e-7
    assert math.isclose(lv, 1752.77, rel_tol=1e-4) and math.isclose(ov, 14678.0, rel_tol=1e-4)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_add_components_refuses_other_observation_dimensions(kind):
    """One check for both paths: models observed in 1 and 2 dimensions cannot be summed."""
    a = kd.local_linear_trend(1.0, 1.0, 1.0)
    H = np.ones((2, 1)) if kind == "numpy" else torch.ones(2, 1, dtype=torch.float64)
    b = kd.DenseModel(np.eye(1), np.eye(1), H, np.eye(2), np.zeros(1))
    with pytest.raises(
        ValueError, match=r"models: expected the same observation dimension, got \[1, 2\]"
    ):
        kd.add_components(a, b)
