"""The model layer's lean paths give the previous path's numbers: ``OUModel.loglik`` through the
filter's log-likelihood-only call with the contributing steps counted from its inputs
(``model_numerics.contributing_steps``), and each distinct step discretized once
(``model_numerics.step_classes``), against the full filter with every step discretized."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.timeseries import model as model_module
from kalmanscan.timeseries import model_numerics
from kalmanscan.timeseries.model import OUModel


def _bits(x):
    x = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "f" else x


def _same(a, b):
    """Equal bit for bit (NaN payloads and zero signs included), same type and dtype."""
    assert type(a) is type(b)
    assert np.shape(a) == np.shape(b)
    assert np.asarray(_bits(a)).dtype == np.asarray(_bits(b)).dtype
    np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.fixture
def per_step(monkeypatch):
    """A function running ``f()`` as before this change: every step discretized by itself
    (``step_classes`` finding nothing) and the log-likelihood read off the full filter."""

    def run(f):
        with monkeypatch.context() as m:
            m.setattr(model_numerics, "step_classes", lambda dt: None)
            m.setattr(model_module, "step_classes", lambda dt: None)
            return f()

    return run


def _ref_loglik(per_step, model, z, times=None, axis=0):
    return per_step(lambda: model.filter(z, times, axis=axis).loglik)


rng = np.random.default_rng(7)
T = 60
Z = np.cumsum(rng.normal(size=T)) * 3.0 + 40.0
Z_MISS = Z.copy()
Z_MISS[[0, 1, 2, 17, 30, 31]] = np.nan
REG = np.arange(T, dtype=np.float64)
BUSINESS = np.cumsum(np.r_[0.0, np.tile([1.0, 1.0, 1.0, 1.0, 3.0], T // 5)[: T - 1]])
IRREG = np.cumsum(np.r_[0.0, rng.uniform(0.1, 2.0, T - 1)])

MODELS = {
    "stationary": OUModel(theta=0.3, sigma2=2.0, mu=40.0, obs_var=1.5),
    "diffuse": OUModel(theta=0.0, sigma2=2.0, obs_var=1.5),
    "known prior": OUModel(theta=0.3, sigma2=2.0, mu=1.0, obs_var=1.5, prior_var=4.0),
    "exact prior": OUModel(theta=0.3, sigma2=2.0, mu=1.0, obs_var=1.5, prior_var=0.0),
    "exact prior mean": OUModel(theta=0.0, sigma2=2.0, obs_var=1.5, prior_mean=3.0, prior_var=0),
    "diffuse theta>0": OUModel(theta=0.3, sigma2=2.0, mu=1.0, obs_var=1.5, prior_var=np.inf),
    "theta 0 known": OUModel(theta=0.0, sigma2=2.0, obs_var=1.5, prior_mean=40.0, prior_var=9.0),
    # theta dt = 1000: decay underflows to 0 (every step forgets the state, knows it afresh)
    "decay 0": OUModel(theta=1000.0, sigma2=2.0, mu=40.0, obs_var=1.5),
    "decay 0 diffuse": OUModel(theta=1000.0, sigma2=2.0, mu=40.0, obs_var=1.5, prior_var=np.inf),
    "decay 0 exact": OUModel(theta=1000.0, sigma2=0.0, mu=40.0, obs_var=1.5, prior_var=np.inf),
    "sigma2 0": OUModel(theta=0.5, sigma2=0.0, mu=40.0, obs_var=1.5, prior_var=np.inf),
    "tiny theta": OUModel(theta=1e-12, sigma2=2.0, mu=1e10, obs_var=1.5),
}
DATA = {"full": Z, "missing": Z_MISS, "all missing": np.full(T, np.nan), "huge": Z * 1e150}
TIMES = {"regular": None, "business": BUSINESS, "irregular": IRREG}


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("name", MODELS)
def test_loglik_equals_full_filter(per_step, name, data, times):
    m, z, t = MODELS[name], DATA[data], TIMES[times]
    if data == "huge":
        m = m.with_params(mu=m.mu * 1e150, sigma2=m.sigma2 * 1e300, obs_var=m.obs_var * 1e300)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ll = m.loglik(z, t)
        said = [str(x.message) for x in w]
        del w[:]
        _same(ll, _ref_loglik(per_step, m, z, t))
        assert said == [str(x.message) for x in w]  # (the same warnings, if any)
        new, old = m.filter(z, t), per_step(lambda: m.filter(z, t))
        for k in new._fields:
            a, b = getattr(new, k), getattr(old, k)
            for x, y in zip(a, b, strict=True) if k == "final" else [(a, b)]:
                _same(x, y)
        new, old = m.smooth(z, t), per_step(lambda: m.smooth(z, t))
        _same(new.mean, old.mean)
        _same(new.var, old.var)


def test_lanes_time_varying_and_axis(per_step):
    z = rng.normal(size=(T, 2, 3)) * 5
    z[:4, 0, 1] = np.nan
    z[:, 1, 2] = np.nan
    z[10:20, 1, 0] = np.nan
    models = [
        OUModel(theta=np.array([0.0, 0.2, 800.0]), sigma2=np.array([[1.0], [3.0]]), obs_var=2.0),
        OUModel(theta=0.1, sigma2=rng.uniform(0.5, 2.0, (T, 1, 1)), obs_var=1.0),  # per step
        OUModel(theta=rng.uniform(0.0, 0.5, (T, 2, 3)), sigma2=1.0, mu=2.0, obs_var=1.0),
        OUModel(theta=0.2, sigma2=1.0, obs_var=rng.uniform(0.5, 2.0, (T, 2, 3))),
        OUModel(theta=0.2, sigma2=1.0, prior_var=np.array([np.inf, 0.0, 3.0])),
    ]
    for m in models:
        for t in TIMES.values():
            _same(m.loglik(z, t), _ref_loglik(per_step, m, z, t))
        if all(np.ndim(v) <= 2 for v in m.params().values()):  # (per-series parameters)
            zt = np.moveaxis(z, 0, 2)
            _same(m.loglik(zt, axis=2), _ref_loglik(per_step, m, zt, axis=2))


def test_float32(per_step):
    z = Z_MISS.astype(np.float32)
    for m in MODELS.values():
        for t in TIMES.values():
            ll = m.loglik(z, t)
            assert ll.dtype == np.float32
            _same(ll, _ref_loglik(per_step, m, z, t))
            new, old = m.filter(z, t), per_step(lambda m=m, t=t: m.filter(z, t))
            _same(new.mean, old.mean)
            _same(new.pred_var, old.pred_var)


def test_torch_parameters_gradients(per_step):
    def run(via_filter):
        theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        sigma2 = torch.tensor([2.0, 0.5], dtype=torch.float64, requires_grad=True)
        obs_var = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
        m = OUModel(theta=theta, sigma2=sigma2, mu=40.0, obs_var=obs_var)
        z = np.stack([Z_MISS, Z[::-1]], 1)
        if via_filter:
            ll = per_step(lambda: m.filter(z, BUSINESS).loglik)
        else:
            ll = m.loglik(z, BUSINESS)
        ll.sum().backward()
        return ll, [theta.grad, sigma2.grad, obs_var.grad]

    (ll, g), (ll0, g0) = run(False), run(True)
    assert ll.requires_grad
    _same(ll.detach(), ll0.detach())
    for a, b in zip(g, g0, strict=True):  # (the kernel's adjoint against autograd's)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_torch_parameters_float32_data(per_step):
    m = OUModel(theta=torch.tensor(0.3, dtype=torch.float64), sigma2=2.0, mu=40.0)
    z = Z_MISS.astype(np.float32)
    _same(m.loglik(z), _ref_loglik(per_step, m, z))


def test_short_records(per_step):
    m = MODELS["stationary"]
    for n in (1, 2, 3, 4, 5):
        for z in (Z[:n], Z_MISS[:n]):
            _same(m.loglik(z), _ref_loglik(per_step, m, z))


def test_errors_as_before(per_step):
    """A gap whose process variance passes float64 (a median step of 1e-300, a gap of 1e10,
    sigma2 1e300) and data past the model's range: the same refusal as the full filter's."""
    t = np.r_[np.arange(20) * 1e-300, 1e10 + np.arange(20) * 1e-6]
    z = rng.normal(size=t.size)
    cases = [
        (OUModel(theta=0.0, sigma2=1e300, prior_var=1.0), z, t),
        (OUModel(theta=0.0, sigma2=1e300), z, t),
        (OUModel(), np.array([1.0, np.inf, 2.0]), None),
        (OUModel(obs_var=1e-300), np.array([1e300, -1e300, 1e300, 0.0]), None),
    ]
    for m, zz, tt in cases:
        with pytest.raises((ValueError, OverflowError)) as new:
            m.loglik(zz, tt)
        with pytest.raises((ValueError, OverflowError)) as old:
            _ref_loglik(per_step, m, zz, tt)
        assert (type(new.value), str(new.value)) == (type(old.value), str(old.value))


def test_loglik_does_not_run_the_full_filter(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the full filter ran")

    monkeypatch.setattr(filter_api, "filter", refuse)
    monkeypatch.setattr(filter_api, "smooth", refuse)
    calls = []
    lean = filter_api.loglik
    monkeypatch.setattr(filter_api, "loglik", lambda *a, **k: calls.append(1) or lean(*a, **k))
    ll = MODELS["stationary"].loglik(Z_MISS, BUSINESS)
    assert np.isfinite(ll) and calls == [1]


def test_distinct_steps_discretized_once_bitwise():
    theta, sigma2, mu = np.array([0.0, 1e-12, 0.3, 700.0]), np.array([2.0, 1e300, 1.0, 3.0]), 5.0
    dts = [
        REG[:40] * 0 + np.r_[0.0, np.full(39, 0.7)],
        np.diff(BUSINESS, prepend=0.0),
        np.r_[0.0, np.tile([1.0, 1e-9, 3.0, 1e5, 0.5], 20)],
    ]
    for dt in dts:
        assert model_numerics.step_classes(dt) is not None
        new = model_numerics.ou_arrays(theta, sigma2, mu, dt, 1)
        dtc = dt.reshape(-1, 1)
        from kalmanscan.core.discretize import discretize_ou

        decay, pv = discretize_ou(theta, sigma2, dtc)
        old = (decay, pv, mu * model_numerics.one_minus_decay(theta, dtc, decay))
        for a, b in zip(new, old, strict=True):
            _same(a, b)
    # tensors: the same values, and gradients through the gather
    th = torch.tensor([0.2, 0.0], dtype=torch.float64, requires_grad=True)
    dt = dts[1]
    new = model_numerics.ou_arrays(th, 1.5, 2.0, dt, 1)
    classes = model_numerics.step_classes
    try:
        model_numerics.step_classes = lambda dt: None
        old = model_numerics.ou_arrays(th, 1.5, 2.0, dt, 1)
    finally:
        model_numerics.step_classes = classes
    for a, b in zip(new, old, strict=True):
        _same(a.detach(), b.detach())
    g = torch.autograd.grad(sum(v.sum() for v in new), th)[0]
    g0 = torch.autograd.grad(sum(v.sum() for v in old), th)[0]
    torch.testing.assert_close(g, g0, rtol=1e-14, atol=0)


def test_step_classes():
    assert model_numerics.step_classes(np.array([0.0, 1.0, 2.0])) is None  # short
    v, i, regular = model_numerics.step_classes(np.r_[0.0, np.full(9, 0.25)])
    assert v.tolist() == [0.0, 0.25] and i.tolist() == [0] + [1] * 9 and regular
    dt = np.r_[0.0, np.tile([1.0, -0.0, 0.0], 10)]  # (-0.0 is its own step)
    v, i, regular = model_numerics.step_classes(dt)
    _same(v[i], dt)
    assert not regular
    assert model_numerics.step_classes(np.r_[0.0, rng.uniform(size=100)]) is None
    for dt in (np.zeros(10), np.r_[0.0, np.full(9, 1e-300)], np.r_[0.0, np.full(10, 0.1)]):
        classes = model_numerics.step_classes(dt)
        assert classes.regular
        _same(model_numerics.median_step(dt, classes), model_numerics.median_step(dt))


def test_contributing_steps_counts():
    obs = np.array([False, True, True, False, True, True])
    f = model_numerics.contributing_steps
    assert int(f(obs, 1.0, 1.0, np.inf)) == 3
    assert int(f(obs, 1.0, 1.0, 2.0)) == 4
    decay = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    assert int(f(np.array([True, False, False, True, True, False]), decay, 1.0, np.inf)) == 2
    pv = np.array([0.0, 1.0, 1.0, np.inf, 1.0, 1.0])
    assert int(f(obs, 1.0, pv, 2.0)) == 3  # (the step after the gap knows nothing before it)
    assert int(f(np.zeros(6, bool), decay, pv, 2.0)) == 0


def test_data_unit_of_long_data():
    """The unit of long data (max |x| from the data's max and min) is the elementwise one's."""
    z = rng.normal(size=(5000, 3)) * np.array([1e-200, 3.0, 1e200])
    z[::7, 0] = np.nan
    cases = [z, z.astype(np.float32)[:, 1:2], np.full((5000, 2), np.nan), np.r_[z[:, 1], np.inf]]
    for v in cases:
        shape = v.shape[1:]
        new = model_numerics.data_unit(shape, [v], [2.0])
        old = model_numerics.data_unit(shape, [v.tolist()], [2.0])  # (a list: elementwise)
        _same(new, old)
