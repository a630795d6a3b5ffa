"""The native adjoint on long lanes: gradients of parameters shared along time (a sum of many large
per-step terms that nearly cancel near the optimum) against autograd of the torch backend, float64
and float32.

The reference: the torch backend in float64 (checked against mpmath at 60 digits on the first two
cases: within 2.4e-12 relative, native within 1.1e-12). Before the reverse pass removed the
adjoint's drift along the state (_native_adjoint.h, ks_adj_project), native's error grew like T^2:
4.9e-10 (obs_var) on the first case, 5.4e-9 (process_var) on the second.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

PARAMS = ("obs_var", "decay", "process_var", "offset")
# relative error of a parameter's gradient (float64: measured <= 3.1e-12 here, 5.4e-9 before;
# float32: the adjoint runs in float64, so the float32 result's rounding, measured <= 4.3e-8)
REL = {torch.float64: 1e-11, torch.float32: 2e-7}
# the per-step gradient of z, normwise relative (measured <= 1.4e-14)
REL_Z = 1e-13


def simulate(T, N, a, p, R, c, seed, missing=0.1):
    """[T, N] lanes drawn from the model (state c + a x + noise, observed with noise), 10 %
    missing."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(T, N)) * np.sqrt(p)
    x = np.empty((T, N))
    s = np.zeros(N)
    for t in range(T):
        s = c + a * s + w[t]
        x[t] = s
    z = x + rng.normal(size=(T, N)) * np.sqrt(R)
    z[rng.random((T, N)) < missing] = np.nan
    return z


def grads(z, values, shape, backend, dtype):
    """d sum(loglik) / d (parameters, z) on `backend`, in `dtype`."""
    leaves = [torch.full(shape, v, dtype=torch.float64).to(dtype).requires_grad_() for v in values]
    zt = z.to(dtype).clone().requires_grad_()
    R, a, p, c = leaves
    ks.loglik(zt, R, a, p, offset=c, backend=backend).sum().backward()
    return [x.grad.double() for x in leaves], zt.grad.double()


CASES = {
    # id: T, N, parameter shape, (obs_var, decay, process_var, offset), seed
    "T65536-N1-shared-a0.999": (65536, 1, (), (1.0, 0.999, 1e-3, 0.0), 7),
    "T40000-N1-shared-a0.95": (40000, 1, (), (1.0, 0.95, 0.1, 0.0), 3),
    "T30000-N3-shared-a0.98": (30000, 3, (), (0.5, 0.98, 0.05, 0.01), 11),
    "T30000-N3-per-lane-a0.99": (30000, 3, (3,), (2.0, 0.99, 0.02, 0.1), 5),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(CASES))
def test_long_lane_shared_parameter_gradients_match_torch(case, dtype):
    T, N, shape, values, seed = CASES[case]
    z = torch.tensor(simulate(T, N, values[1], values[2], values[0], values[3], seed))
    # the reference in float64 on the same (rounded) inputs
    zr = z.to(dtype).double()
    vr = [float(torch.tensor(v, dtype=dtype)) for v in values]
    ref, ref_z = grads(zr, vr, shape, "torch", torch.float64)
    got, got_z = grads(z, values, shape, "native", dtype)
    for name, g, r in zip(PARAMS, got, ref, strict=True):
        err = float((g - r).abs().max() / r.abs().max())
        assert err <= REL[dtype], f"{case} {name}: relative error {err:.2e}"
    if dtype == torch.float64:
        err = float((got_z - ref_z).norm() / ref_z.norm())
        assert err <= REL_Z, f"{case} z: relative error {err:.2e}"
