"""A float64 parameter whose value changes meaning in z's float32: refused, naming the argument,
the value given, what float32 makes of it (0 or inf) and the remedy; ordinary rounding (digits
lost, or a tiny value whose 0 is its own limit) stays accepted; float64 z accepts everything.
Python numbers, numpy arrays and torch tensors alike, on every CPU backend. The time-series
layer with float32 data (a long gap's decay below float32's range) keeps working."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native
from kalmanscan.core._args import _rounding_limits, rounded_away
from kalmanscan.timeseries import OUModel, fit_ou

# (the compiled CPU kernel where it is built: a checkout run uninstalled, as on the GPU machine,
# has none)
BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
Z32 = np.float32([1.0, 2.0, 3.0])
BASE = dict(obs_var=1.0, decay=1.0, process_var=0.1)

# (case id, keyword, value, what float32 makes of it, the meaning the message gives)
REFUSED = [
    ("decay-to-0", "decay", 1e-50, "0.0", "decay 0 forgets the state"),
    ("decay-neg-to-0", "decay", -1e-50, "0.0", "decay 0 forgets the state"),
    ("decay-to-inf", "decay", 1e40, "inf", "decay must be finite"),
    ("obs_var-to-0", "obs_var", 1e-50, "0.0", "obs_var must be > 0"),
    ("obs_var-to-inf", "obs_var", 1e40, "inf", "obs_var inf: the step is not observed"),
    ("loading-to-0", "loading", 1e-60, "0.0", "loading 0: the step is not observed"),
    ("process_var-to-inf", "process_var", 1e40, "inf", "process_var must be finite"),
    ("offset-to-inf", "offset", 1e40, "inf", "offset must be finite"),
    ("offset-to-neg-inf", "offset", -1e40, "-inf", "offset must be finite"),
    ("prior_var-to-inf", "prior_var", 1e40, "inf", "prior_var inf: a diffuse prior"),
    ("prior_mean-to-inf", "prior_mean", -1e40, "-inf", "prior_mean must be finite"),
]
# nonzero values whose 0 in float32 is the limit of the tiny values (the results agree), and
# values float32 holds with fewer digits (subnormal, or near the maximum)
ACCEPTED = [
    ("offset-1e-50", "offset", 1e-50),
    ("prior_mean-1e-50", "prior_mean", 1e-50),
    ("process_var-1e-50", "process_var", 1e-50),
    ("prior_var-1e-50", "prior_var", 1e-50),
    ("decay-1e-30", "decay", 1e-30),
    ("decay-1e-40-subnormal", "decay", 1e-40),
    ("obs_var-digits", "obs_var", 1 + 1e-12),
    ("loading-digits", "loading", 0.1),
    ("offset-subnormal", "offset", 1e-40),
]


def _args(key, value, as_type, torch_z=False):
    """``(z, kwargs)`` with ``key`` set to ``value`` as a Python number, a float64 numpy array
    (one element among ordinary values, for the index) or a float64 tensor."""
    kw = dict(BASE)
    z = torch.from_numpy(Z32) if torch_z or as_type == "torch" else Z32
    if as_type == "python":
        kw[key] = value
    else:
        prior = key.startswith("prior")
        ordinary = kw.get(key, 0.0 if key in ("offset", "prior_mean") else 1.0)
        a = np.float64(value) if prior else np.array([ordinary, value, ordinary])
        kw[key] = torch.tensor(a, dtype=torch.float64) if as_type == "torch" else a
    return z, kw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_type", ["python", "numpy", "torch"])
@pytest.mark.parametrize(("key", "value", "to", "meaning"),
                         [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])  # fmt: skip
def test_value_changing_meaning_is_refused(key, value, to, meaning, as_type, backend):
    z, kw = _args(key, value, as_type)
    with pytest.raises(ValueError) as info:
        ks.filter(z, **kw, backend=backend)
    msg = str(info.value)
    assert msg.startswith(f"{key}: expected values float32 holds (z's dtype")
    assert f"got {value!r}" in msg
    assert f"which float32 rounds to {to} ({meaning})" in msg
    assert "pass z as float64, or rescale the data and model" in msg
    if as_type != "python" and not key.startswith("prior"):
        assert "at index (1,)" in msg


@pytest.mark.parametrize("as_type", ["python", "numpy", "torch"])
def test_init_lam_to_zero_is_refused(as_type):
    lam, eta = 1e-50, 0.0
    if as_type != "python":
        lam, eta = np.float64(lam), np.float64(eta)
        if as_type == "torch":
            lam, eta = torch.tensor(lam), torch.tensor(eta)
    with pytest.raises(ValueError, match=r"init\.lam: .* rounds to 0\.0 \(init\.lam 0: no inf"):
        ks.filter(Z32, **BASE, init=ks.InfoState(lam, eta))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bug3_decay_1e50_float32_z(backend):
    """The audit's case: refused, not silently the 'forget' model (mean 0.091)."""
    with pytest.raises(ValueError, match=r"^decay: .*got 1e-50, which float32 rounds to 0\.0"):
        ks.filter(Z32, obs_var=1.0, decay=1e-50, process_var=0.1, backend=backend)
    # the same model in float64 (its truth) and with a decay float32 holds
    f64 = ks.filter(Z32.astype(np.float64), obs_var=1.0, decay=1e-50, process_var=0.1)
    np.testing.assert_allclose(f64.mean, [1.0, 2 / 11, 3 / 11], rtol=1e-12)
    np.testing.assert_allclose(f64.loglik, -7.8423, atol=1e-4)
    f30 = ks.filter(Z32, obs_var=1.0, decay=1e-30, process_var=0.1, backend=backend)
    np.testing.assert_allclose(f30.mean, f64.mean, rtol=1e-6)
    np.testing.assert_allclose(f30.loglik, f64.loglik, rtol=1e-6)


@pytest.mark.parametrize("as_type", ["python", "numpy", "torch"])
def test_obs_var_and_process_var_messages_name_the_rounding(as_type):
    """Not 'expected values > 0 ... got 0.0' nor 'got inf': the value given and its rounding."""
    z, kw = _args("obs_var", 1e-50, as_type)
    with pytest.raises(ValueError, match=r"got 1e-50.*rounds to 0\.0 \(obs_var must be > 0\)"):
        ks.filter(z, **kw)
    z, kw = _args("process_var", 1e40, as_type)
    with pytest.raises(ValueError, match=r"got 1e\+40.*rounds to inf \(process_var must be"):
        ks.filter(z, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_type", ["python", "numpy", "torch"])
@pytest.mark.parametrize(("key", "value"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_ordinary_rounding_is_accepted(key, value, as_type, backend):
    z, kw = _args(key, value, as_type)
    f = ks.filter(z, **kw, backend=backend)
    mean = f.mean.numpy() if isinstance(f.mean, torch.Tensor) else f.mean
    assert mean.dtype == np.float32 and np.isfinite(mean).all()
    # the float64 model agrees to float32's precision
    kw64 = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref = ks.filter(Z32.astype(np.float64), **kw64, backend="sequential")
    np.testing.assert_allclose(mean, ref.mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("as_type", ["python", "numpy", "torch"])
@pytest.mark.parametrize("case", REFUSED + [("init", "init", 1e-50, "", "")], ids=lambda c: c[0])
def test_float64_z_accepts_every_value(case, as_type):
    _, key, value, _, _ = case
    z, kw = _args(key if key != "init" else "decay", value if key != "init" else 1.0, as_type)
    z = z.double() if isinstance(z, torch.Tensor) else z.astype(np.float64)
    if key == "init":
        kw["init"] = ks.InfoState(value, 0.0)
    f = ks.filter(z, **kw)
    mean = f.mean.numpy() if isinstance(f.mean, torch.Tensor) else f.mean
    assert mean.dtype == np.float64


def test_numpy_z_with_torch_parameter_and_float16_z():
    """torch mode from a float64 tensor parameter of float32 numpy z; float16 z computes in
    float32, so the same values are refused there."""
    with pytest.raises(ValueError, match=r"^decay: .*got 1e-50 at index \(1,\)"):
        ks.filter(Z32, 1.0, torch.tensor([1.0, 1e-50, 1.0], dtype=torch.float64), 0.1)
    with pytest.raises(ValueError, match=r"^obs_var: .*float32 holds \(z's dtype"):
        ks.filter(Z32.astype(np.float16), 1e-50, 1.0, 0.1)
    with pytest.raises(ValueError, match=r"^loading: .*rounds to 0\.0"):
        ks.filter(torch.tensor(Z32, dtype=torch.bfloat16), 1.0, 1.0, 0.1, loading=1e-60)


def test_torch_parameter_gradient_and_smooth_loglik_entry_points():
    """The tensor cast keeps gradients where the values are fine; smooth and loglik refuse."""
    decay = torch.tensor([1.0, 0.5, 1e-30], dtype=torch.float64, requires_grad=True)
    ll = ks.loglik(torch.from_numpy(Z32), 1.0, decay, 0.1)
    ll.backward()
    assert decay.grad is not None and torch.isfinite(decay.grad).all()
    bad = torch.tensor([1.0, 1e-50, 1.0], dtype=torch.float64, requires_grad=True)
    for fn in (ks.smooth, ks.loglik):
        with pytest.raises(ValueError, match=r"^decay: .*got 1e-50 at index \(1,\)"):
            fn(torch.from_numpy(Z32), 1.0, bad, 0.1)


def test_limits_are_those_of_the_cast():
    """rounded_away agrees with torch's float64 -> float32 cast at either side of each limit."""
    to_zero, to_inf = _rounding_limits(torch.float32)
    xs = [to_zero, math.nextafter(to_zero, 1.0), to_inf, math.nextafter(to_inf, 0.0)]
    xs = torch.tensor(xs + [-x for x in xs] + [0.0, math.inf, math.nan], dtype=torch.float64)
    cast = xs.to(torch.float32).double()
    changed = ((cast == 0) & (xs != 0)) | (cast.isinf() & xs.isfinite())
    assert rounded_away("decay", xs, torch.float32).tolist() == changed.tolist()
    assert changed.sum() == 4  # (each limit is itself rounded away)
    # the same answer for numpy arrays and Python numbers
    assert rounded_away("decay", xs.numpy(), torch.float32).tolist() == changed.tolist()
    assert [bool(rounded_away("decay", float(x), torch.float32)) for x in xs] == changed.tolist()
    # where 0 is ordinary rounding, only inf counts
    assert not rounded_away("offset", 1e-50, torch.float32)
    assert rounded_away("offset", 1e40, torch.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("theta", [0.0, 1.0])
def test_ou_model_float32_data_long_gap(theta, dtype):
    """exp(-theta dt) = 1.4e-87 after a gap of 200: float32 data forget the state there as
    float64 data do where exp underflows (dt = 1e5), with the float64 results."""
    z = np.array([1.0, 2.0, 3.0, 2.5])
    m = OUModel(theta=theta, sigma2=1.0, obs_var=0.3)
    ref = m.smooth(z, [0, 1, 201, 202])
    for times in ([0, 1, 201, 202], [0, 1, 1e5, 1e5 + 1] if theta else [0, 1, 201, 202]):
        s = m.smooth(z.astype(dtype), times)
        assert s.mean.dtype == dtype
        np.testing.assert_allclose(s.mean, ref.mean, rtol=2e-6)
        np.testing.assert_allclose(s.filtered.loglik, ref.filtered.loglik, rtol=2e-6)
        f = m.filter(z.astype(dtype), times)
        np.testing.assert_allclose(f.var, ref.filtered.var, rtol=2e-6)


def test_fit_ou_float32_data():
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.integers(1, 40, size=120)).astype(float)  # gaps up to 39 (decay tiny)
    z = (np.sin(t / 50) + rng.normal(size=t.size) * 0.3).astype(np.float32)
    fit = fit_ou(z, t)
    fit64 = fit_ou(z.astype(np.float64), t)
    for k in ("theta", "sigma2", "mu", "obs_var"):
        np.testing.assert_allclose(fit.params[k], fit64.params[k], rtol=1e-6)
    s = fit.smooth()
    assert np.isfinite(np.asarray(s.mean)).all()
    np.testing.assert_allclose(s.mean, fit64.smooth().mean, rtol=1e-4, atol=1e-5)
