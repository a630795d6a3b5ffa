"""OUFit.forecast filters the record once and keeps its last state; a change to the data, the
times or the parameters is seen. The first call imports nothing slow (sympy)."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

import kalmanscan as ks


def _fit():
    z = np.random.default_rng(0).normal(size=300).cumsum()
    return ks.fit_ou(z, np.arange(300.0) * 2.0)


def test_forecast_filters_once(monkeypatch):
    fit = _fit()
    calls = []
    real = type(fit.model).filter_prepared

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(type(fit.model), "filter_prepared", counting)
    a = fit.forecast(3)
    b = fit.forecast(at=[700.0, 900.0], coverage=0.5)
    assert len(calls) == 1
    res = real(fit.model, fit.z, fit.time_axis)
    m, v = res.mean[-1], res.var[-1]
    np.testing.assert_allclose(a.mean[0], fit.params["mu"] + (m - fit.params["mu"]) * np.exp(
        -fit.params["theta"] * 2.0), rtol=1e-13)  # fmt: skip
    assert b.times.tolist() == [700.0, 900.0] and np.all(b.var > v)


def test_changes_in_place_are_seen():
    fit = _fit()
    before = fit.forecast(1).mean.copy()
    fit.z[-1] += 10.0  # the data changed in place
    after = fit.forecast(1).mean
    want = ks.forecast(fit.model, fit.z, fit.time_axis.t, steps=1).mean
    np.testing.assert_allclose(after, want, rtol=1e-14)
    assert not np.allclose(after, before)
    fit.model = fit.model.with_params(obs_var=fit.params["obs_var"] * 4)
    want = ks.forecast(fit.model, fit.z, fit.time_axis.t, steps=1)
    np.testing.assert_allclose(fit.forecast(1).var, want.var, rtol=1e-14)


def test_pickled_fit_forecasts_the_same():
    fit = _fit()
    a = fit.forecast(2)
    b = pickle.loads(pickle.dumps(fit)).forecast(2)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.var, b.var)


@pytest.mark.parametrize("backend", ["default", "torch"])
def test_first_forecast_imports_no_sympy(backend):
    """torch.broadcast_shapes imports sympy on its first call (about a second): no call of the
    public API goes through it, on the backend a machine picks (the torch one where the native
    kernels are not built, as on the GPU machines) or on the torch backend named."""
    b = "" if backend == "default" else f", backend={backend!r}"
    code = (
        "import sys, numpy as np, kalmanscan as ks, kalmanscan.dense as kd\n"
        "y = np.random.default_rng(0).normal(size=50).cumsum()\n"
        f"fit = ks.fit_ou(y{b})\n"
        "fit.forecast(2); ks.discretize_ou(0.5, 1.0, np.ones(3))\n"
        f"ks.smooth(np.stack([y, y]), obs_var=1.0, decay=0.9, process_var=0.5{b})\n"
        "m = kd.local_linear_trend(level_var=0.1, slope_var=0.01, obs_var=0.5)\n"
        f"kd.smooth(np.stack([y, y], -1)[..., None], **m._asdict(){b})\n"
        "print('sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
