"""Variances far below 1 on every side: the state carried in a smaller unit.

Data of scale 1e-100 with ``obs_var = process_var = 1e-200`` (every variance tiny, the model
itself ordinary) gave variance 0, wrong means and a wrong log-likelihood on every backend: the
update forms ``obs_var`` times the normalized predicted variance, which underflowed (1e-400)
though the posterior variance is 6.7e-201. At 1e-80 the variances were 1e-5 off; in float32 the
same from data of scale 1e-15 (and 1e-6 off at 1e-10). Where a lane's smallest
``obs_var / loading**2`` is below ``2**(emin / 3)`` (2e-103 in float64, 2e-13 in float32) the API
now carries the state in a power-of-two unit ``c`` (``kalmanscan/core/filter.py:_state_unit``):
``loading c``, ``process_var / c**2``, ``offset / c``, the prior mapped, outputs mapped back.

Truth: kalmanscan.validation.oracle's mpmath filter and RTS smoother (``scalar_oracle``) and its
forward-difference gradient (``scalar_loglik_grad``, 120 digits).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import filter as core_filter
from kalmanscan.core import native
from kalmanscan.validation.oracle import scalar_loglik_grad, scalar_oracle

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else [])
API_BACKENDS = BACKENDS + (["triton"] if importlib.util.find_spec("triton") else [])
T = 12


def _walk(seed=0):
    rng = np.random.default_rng(seed)
    z = np.cumsum(rng.normal(size=T)) + 3.0
    z[4] = np.nan
    return z


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.abs(want)))


def _check(res, ref, smooth, tol):
    """Means relative to the posterior sd, variances and log-likelihood relative."""
    f = res.filtered if smooth else res
    sd = np.sqrt(ref.var)
    assert np.max(np.abs(f.mean - ref.mean) / sd) < tol, "mean"
    assert _rel(f.var, ref.var) < tol, "var"
    assert _rel(f.precision, 1 / ref.var) < tol, "precision"
    assert abs(float(f.loglik) - ref.loglik) < tol * max(1.0, abs(ref.loglik)), "loglik"
    if smooth:
        ssd = np.sqrt(ref.smooth_var)
        assert np.max(np.abs(res.mean - ref.smooth_mean) / ssd) < tol, "smoothed mean"
        assert _rel(res.var, ref.smooth_var) < tol, "smoothed var"


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize("scale", [1e-80, 1e-100, 1e-150], ids=["1e-80", "1e-100", "1e-150"])
@pytest.mark.parametrize("prior", ["diffuse", "proper"])
def test_every_variance_tiny_matches_mpmath(backend, scale, prior, triton_on_cpu):
    z = _walk() * scale
    kw = dict(obs_var=0.7 * scale**2, decay=0.9, process_var=0.3 * scale**2, offset=0.1 * scale)
    pr = {} if prior == "diffuse" else dict(prior_mean=2.0 * scale, prior_var=4.0 * scale**2)
    ref = scalar_oracle(z, kw["obs_var"], kw["decay"], kw["process_var"],
                        offset=kw["offset"], **pr)  # fmt: skip
    _check(ks.filter(z, **kw, **pr, backend=backend), ref, False, 1e-12)
    _check(ks.smooth(z, **kw, **pr, backend=backend), ref, True, 1e-11)
    ll = ks.loglik(z, **kw, **pr, backend=backend)
    assert abs(float(ll) - ref.loglik) < 1e-12 * abs(ref.loglik)


@pytest.mark.parametrize("backend", API_BACKENDS)
@pytest.mark.parametrize(
    "scale, prior_var", [(1e-150, 1e10), (1e-100, 1e120), (1e-150, 1.0)],
    ids=["1e-150-vague-1e10", "1e-100-vague-1e120", "1e-150-unit-prior"],
)  # fmt: skip
def test_a_vague_prior_on_tiny_data(backend, scale, prior_var, triton_on_cpu):
    """A proper prior far wider than the data's variances (a "vague" prior in absolute units):
    the lane's unit keeps the prior's variance in range. Before, the filtered variance at a
    missing first step was inf (truth: the prior's), the log-likelihood 9e-8 off, and triton
    raised OverflowError."""
    z = _walk(3) * scale
    z[0] = np.nan
    kw = dict(obs_var=0.7 * scale**2, decay=0.9, process_var=0.3 * scale**2)
    # (the RTS form cancels the prior's variance against the data's: ~330 digits at 1e10 vs 1e-300)
    ref = scalar_oracle(z, **kw, prior_mean=0.5 * scale, prior_var=prior_var, dps=450)
    res = ks.smooth(z, **kw, prior_mean=0.5 * scale, prior_var=prior_var, backend=backend)
    _check(res, ref, True, 1e-11)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_lane_and_per_step_tensors(backend):
    """Arrays of obs_var (per step and lane) and a loading != 1: each lane its own unit; a lane
    of ordinary scale beside tiny ones is unchanged (bit for bit)."""
    scales = np.array([1.0, 1e-90, 1e-140])
    z = np.stack([_walk(s) for s in range(3)], 1) * scales
    R = np.linspace(0.5, 1.5, T)[:, None] * scales**2
    h = 0.5
    p = 0.2 * scales**2
    res = ks.smooth(z, obs_var=R, decay=1.0, process_var=p, loading=h, backend=backend)
    for j in range(len(scales)):
        ref = scalar_oracle(z[:, j], R[:, j], 1.0, p[j], loading=h)
        f = res.filtered
        sd = np.sqrt(ref.var)
        assert np.max(np.abs(f.mean[:, j] - ref.mean) / sd) < 1e-12, j
        assert _rel(f.var[:, j], ref.var) < 1e-12, j
        assert _rel(res.var[:, j], ref.smooth_var) < 1e-11, j
        assert abs(float(f.loglik[j]) - ref.loglik) < 1e-12 * abs(ref.loglik), j
    alone = ks.smooth(z[:, 0], obs_var=R[:, 0], decay=1.0, process_var=p[0], loading=h,
                      backend=backend)  # fmt: skip
    np.testing.assert_array_equal(res.mean[:, 0], alone.mean)
    np.testing.assert_array_equal(res.var[:, 0], alone.var)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [1e-12, 1e-15], ids=["1e-12", "1e-15"])
def test_float32_tiny_variances(backend, scale):
    z = (_walk() * scale).astype(np.float32)
    R, p = np.float32(0.7 * scale**2), np.float32(0.3 * scale**2)
    res = ks.filter(z, obs_var=R, decay=1.0, process_var=p, backend=backend)
    assert res.mean.dtype == np.float32
    ref = scalar_oracle(z.astype(np.float64), float(R), 1.0, float(p))
    sd = np.sqrt(ref.var)
    assert np.max(np.abs(res.mean - ref.mean) / sd) < 1e-5
    assert _rel(res.var, ref.var) < 1e-5
    assert abs(float(res.loglik) - ref.loglik) < 1e-5 * abs(ref.loglik)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loglik_gradient_in_a_unit(backend):
    """Autograd through the unit (multiplications by powers of two) gives the true gradient."""
    scale = 1e-100
    z = _walk() * scale
    vals = dict(obs_var=0.7 * scale**2, decay=0.9, process_var=0.3 * scale**2, offset=0.1 * scale)
    want = scalar_loglik_grad(z, **vals)
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in vals.items()}
    ll = ks.loglik(torch.as_tensor(z), **t, backend=backend)
    ll.backward()
    for k, v in t.items():
        assert float(v.grad) == pytest.approx(want[k], rel=1e-9), k


def test_ordinary_lanes_take_no_unit():
    """The units are taken only where a product of two variances leaves the range: ordinary,
    huge, and tiny-obs_var-beside-ordinary-process-noise lanes run as given."""
    z = _walk()

    def tiny(R, p=1.0, h=1.0):
        prep = core_filter._prepare(z, R, 1.0, p, h, 0.0, 0.0, math.inf, None, 0, "sequential")
        ins = (prep.z, prep.obs_var, prep.decay, prep.process_var, prep.loading, prep.offset)
        return core_filter._tiny_lanes(prep, ins)

    assert tiny(1.0) is None and tiny(1e-100, 1e-100) is None and tiny(1e200, 1e200) is None
    assert tiny(1e-250, 0.3) is None  # obs_var tiny, process noise ordinary: exact as given
    assert tiny(1.0, 1e-200, 1e60) is not None  # process_var obs_var / h^2 = 1e-320
    got = tiny(1e-200, 1e-200)
    assert got is not None and float(got[0][0]) == 2.0**-333  # c^2 = 2^-666 ~ 1e-200
    got = tiny(np.r_[np.full(T - 1, 1.0), 1e-200], 1e-200)  # one step's product decides
    assert got is not None and int(got[1][-1, 0]) > 0 and int(got[1][0, 0]) == 0


def test_bfloat16_and_negated_view_parameters():
    """The host-side screen views CPU arrays through numpy: a bfloat16 parameter or a negated
    view (``torch._neg_view``) crashed there ("Got unsupported ScalarType BFloat16", "Can't call
    numpy() on Tensor that has negative bit set") instead of being filtered as given."""
    z = torch.tensor(_walk(5), dtype=torch.float64)
    want = ks.filter(z, 0.5, 0.9, 0.25)
    got = ks.filter(z, torch.full((T,), 0.5, dtype=torch.bfloat16), 0.9, 0.25)
    np.testing.assert_array_equal(got.mean, want.mean)
    got = ks.filter(z, 0.5, 0.9, torch._neg_view(torch.full((T,), -0.25, dtype=torch.float64)))
    np.testing.assert_array_equal(got.mean, want.mean)
    # tiny variances through the same views still take their units
    s = 1e-150
    ref = scalar_oracle((z * s).numpy(), 0.5 * s * s, 0.9, 0.25 * s * s)
    neg = torch._neg_view(torch.full((T,), -0.25 * s * s, dtype=torch.float64))
    got = ks.filter(z * s, torch.full((T,), 0.5 * s * s, dtype=torch.float64), 0.9, neg)
    assert _rel(got.var, ref.var) < 1e-12
