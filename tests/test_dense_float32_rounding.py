"""kalmanscan.dense with float32 z and float64 parameter values float32 cannot hold: refused as
``ks.filter`` refuses them (kalmanscan.core._args.rounded_away, one implementation), naming the
argument, the value, its index and what float32 makes of it, never rounded silently into another
model (F 1e-50 -> 0 forgot the state: loglik -8.707 for -7.969; a prior_cov of 1e40 -> inf made a
proper prior diffuse: -3.948 for -50.92). Ordinary rounding stays accepted; float64 z accepts
everything."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native

NATIVE = pytest.param(
    "native", marks=pytest.mark.skipif(not native.available(), reason="native extension not built")
)
BACKENDS = ["torch", NATIVE]
Z32 = np.float32([[0.3], [1.1], [np.nan], [2.6]])
E = np.eye(1)
BASE = dict(F=E, Q=E * 0.1, H=E, R=E * 0.5)

# (id, keyword, value, what float32 makes of it, the meaning the message gives)
REFUSED = [
    ("F-to-0", "F", 1e-50, "0.0", "F 0: no transition through that entry"),
    ("F-to-inf", "F", 1e40, "inf", "F must be finite"),
    ("H-to-0", "H", 1e-50, "0.0", "H 0: not observed through that state"),
    ("Q-to-0", "Q", 1e-50, "0.0", "Q 0: no process noise there, a direction can be known exactly"),
    ("Q-to-inf", "Q", 1e40, "inf", "Q must be finite"),
    ("R-to-0", "R", 1e-50, "0.0", "R 0: an exact observation, or uncorrelated entries"),
    ("R-to-inf", "R", 1e40, "inf", "R must be finite"),
    ("offset-to-inf", "offset", -1e40, "-inf", "offset must be finite"),
    ("prior_mean-to-inf", "prior_mean", 1e40, "inf", "prior_mean must be finite"),
    ("prior_cov-to-0", "prior_cov", 1e-50, "0.0", "prior_cov 0: a direction known exactly"),
    ("prior_cov-to-inf", "prior_cov", 1e40, "inf", "prior_cov inf: a diffuse state"),
    ("prior_precision-to-0", "prior_precision", 1e-50, "0.0",
     "prior_precision 0: a diffuse direction"),
    ("prior_precision-to-inf", "prior_precision", 1e40, "inf", "prior_precision must be finite"),
]  # fmt: skip


def _args(key, value, as_type):
    """``(z, F, Q, H, R, kwargs)`` with ``key``'s single entry set to ``value`` (float64)."""
    kw = dict(BASE)
    vec = key in ("offset", "prior_mean")
    kw[key] = np.full(1, value) if vec else E * value
    if key.startswith("prior"):
        kw.setdefault("prior_mean", np.zeros(1))
    z = Z32
    if as_type == "torch":
        z = torch.from_numpy(Z32)
        kw = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in kw.items()}
    F, Q, H, R = (kw.pop(k) for k in "FQHR")
    return z, F, Q, H, R, kw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_type", ["numpy", "torch"])
@pytest.mark.parametrize(("key", "value", "to", "meaning"),
                         [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])  # fmt: skip
def test_value_changing_meaning_is_refused(key, value, to, meaning, as_type, backend):
    z, F, Q, H, R, kw = _args(key, value, as_type)
    for fn in (kd.filter, kd.smooth):
        with pytest.raises(ValueError) as info:
            fn(z, F, Q, H, R, backend=backend, **kw)
        msg = str(info.value)
        idx = "(0,)" if key in ("offset", "prior_mean") else "(0, 0)"
        assert msg == (
            f"{key}: expected values float32 holds (z's dtype, the computation's), got "
            f"{value!r} at index {idx}, which float32 rounds to {to} ({meaning}); pass z as "
            "float64, or rescale the data and model so that float32 holds the value"
        )


# the audit's cases: float64 z gives the model's own answer (mpmath's, docs/dense.md), which
# float32 z used to replace silently by another model's
AUDIT = [
    ("F", 1e-50, -7.968716, -8.707242),
    ("H", 1e-50, -4.420704, -9.777094),
    ("prior_precision", 1e-50, -62.43143, -3.947874),
    ("prior_cov", 1e40, -50.91850, -3.947874),
]


@pytest.mark.parametrize(("key", "value", "truth", "other_model"), AUDIT, ids=[a[0] for a in AUDIT])
def test_audit_cases_float64_truth_float32_refused(key, value, truth, other_model):
    z, F, Q, H, R, kw = _args(key, value, "numpy")
    f64 = kd.filter(Z32.astype(np.float64), F, Q, H, R, **kw)
    np.testing.assert_allclose(float(f64.loglik), truth, rtol=1e-6)
    assert abs(truth - other_model) > 0.5
    with pytest.raises(ValueError, match="^" + re.escape(f"{key}: expected") + ".*"
                       + re.escape(f"got {value!r} at index (0, 0), which float32")):  # fmt: skip
        kd.filter(z, F, Q, H, R, **kw)


# ordinary rounding: digits lost, subnormal values kept, and a tiny offset or prior_mean
ACCEPTED = [
    ("F-digits", "F", 0.1),
    ("Q-subnormal", "Q", 1e-40),
    ("offset-to-0", "offset", 1e-50),
    ("prior_mean-to-0", "prior_mean", 1e-50),
    ("R-digits", "R", 1 + 1e-12),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_type", ["numpy", "torch"])
@pytest.mark.parametrize(("key", "value"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_ordinary_rounding_is_accepted(key, value, as_type, backend):
    z, F, Q, H, R, kw = _args(key, value, as_type)
    res = kd.filter(z, F, Q, H, R, backend=backend, **kw)
    mean = np.asarray(res.mean)
    assert mean.dtype == np.float32 and np.isfinite(mean).all()
    to64 = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    ref = kd.filter(Z32.astype(np.float64), *map(to64, (F, Q, H, R)),
                    **{k: to64(v) for k, v in kw.items()}, backend="sequential")  # fmt: skip
    np.testing.assert_allclose(mean, ref.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(res.loglik), float(ref.loglik), rtol=1e-5)


@pytest.mark.parametrize("backend", [NATIVE, "sequential"])
@pytest.mark.parametrize("as_type", ["numpy", "torch"])
@pytest.mark.parametrize("case", [c for c in REFUSED if c[0] not in ("F-to-inf", "Q-to-inf")],
                         ids=lambda c: c[0])  # fmt: skip
def test_float64_z_accepts_every_value(case, as_type, backend):
    # (F, Q = 1e40 in float64: a separate limit of the torch scan the native path falls back to)
    _, key, value, _, _ = case
    z, F, Q, H, R, kw = _args(key, value, as_type)
    z = z.double() if isinstance(z, torch.Tensor) else z.astype(np.float64)
    res = kd.filter(z, F, Q, H, R, backend=backend, **kw)
    assert np.asarray(res.mean).dtype == np.float64


def test_tensor_keeps_gradient_and_index_of_a_batched_argument():
    """The float64 tensor cast keeps gradients where the values are fine; a time-varying F
    names the step of the value rounded away."""
    z = torch.from_numpy(np.repeat(Z32, 1, 1))
    F = torch.ones(4, 1, 1, dtype=torch.float64, requires_grad=True)
    ll = kd.filter(z, F, torch.tensor(BASE["Q"]), torch.tensor(E), torch.tensor(BASE["R"])).loglik
    ll.backward()
    assert F.grad is not None and torch.isfinite(F.grad).all()
    bad = torch.tensor([1.0, 1.0, 1e-60, 1.0], dtype=torch.float64).reshape(4, 1, 1)
    with pytest.raises(ValueError, match=r"^F: .*got 1e-60 at index \(2, 0, 0\), which float32"):
        kd.filter(z, bad, torch.tensor(BASE["Q"]), torch.tensor(E), torch.tensor(BASE["R"]))
