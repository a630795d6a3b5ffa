"""``times`` given as a torch tensor that requires grad is refused, naming ``times`` and saying
to pass ``times.detach()``: results are differentiable in the parameters and the data, not in
the times, and the gradient was dropped silently before. Tensors without a gradient are read as
numpy arrays of the same values are."""

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries import as_time_axis

torch = pytest.importorskip("torch")

T = np.array([0.0, 1.0, 2.5, 3.0, 4.5])
Z = np.array([0.3, -0.1, 0.4, 0.2, 0.5])
P = dict(theta=0.3, sigma2=1.0, mu=0.1, obs_var=0.5)
MESSAGE = (
    r"times: expected values without a gradient .*gradients with respect to times .*"
    r"times\.detach\(\)"
)


def _grad_times(dtype=torch.float64):
    return torch.tensor(T, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: as_time_axis(t, 5),
        lambda t: ks.OUModel(**P).forecast(Z, t, steps=2),
        lambda t: ks.forecast(ks.OUModel(**P), Z, t, steps=2),
        lambda t: ks.OUModel(**P).filter(Z, t),
        lambda t: ks.OUModel(**P).loglik(Z, t),
        lambda t: ks.fit_ou(Z, t),
    ],
    ids=["as_time_axis", "OUModel.forecast", "ks.forecast", "filter", "loglik", "fit_ou"],
)
def test_times_that_require_grad_are_refused(call):
    with pytest.raises(TypeError, match=MESSAGE):
        call(_grad_times())


def test_float32_and_a_view_that_requires_grad_are_refused():
    with pytest.raises(TypeError, match=MESSAGE):
        as_time_axis(_grad_times(torch.float32), 5)
    with pytest.raises(TypeError, match=MESSAGE):
        as_time_axis(_grad_times() * 2.0, 5)  # (a result of a differentiable op)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64])
def test_tensors_without_grad_read_as_numpy(dtype):
    t = torch.tensor(T * 2 if dtype == torch.int64 else T).to(dtype)
    want_t = t.numpy().astype(np.float64)
    ax = as_time_axis(t, 5)
    np.testing.assert_array_equal(ax.t, want_t - want_t[0])
    m = ks.OUModel(**P)
    got = m.forecast(Z, t, steps=2)
    want = m.forecast(Z, want_t, steps=2)
    np.testing.assert_array_equal(np.asarray(got.times), np.asarray(want.times))
    np.testing.assert_array_equal(np.asarray(got.mean), np.asarray(want.mean))
    assert float(m.loglik(Z, t)) == float(m.loglik(Z, want_t))


def test_detached_times_work_with_gradients_in_the_parameters():
    t = _grad_times()
    theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    m = ks.OUModel(theta=theta, sigma2=1.0, mu=0.1, obs_var=0.5)
    fc = m.forecast(Z, t.detach(), steps=2)
    (g,) = torch.autograd.grad(fc.mean.sum(), theta)
    assert torch.isfinite(g)
    want = ks.OUModel(**P).forecast(Z, T, steps=2)
    np.testing.assert_allclose(fc.mean.detach().numpy(), want.mean, rtol=1e-15)
