"""A predicted variance past the dtype's range: the lane's log-likelihood is NaN, never a number
with a term silently left out (docs/reliability.md, limit 5; docs/backend-contract.md).

Where ``decay**2 * variance`` passes ``1/tiny`` (float64 ~4.5e307, float32 ~8.5e37) the
normalized predicted precision is below the normal range: subnormal (its log-likelihood term
kept a few digits: float32 lanes came out 0.14 to 1.7 off mpmath, each backend differently) or
0 (the term was left out: -1.64 for mpmath's -54.26, or -10.55 for -472.15). Every backend
now returns NaN for that lane's log-likelihood and its gradients, warns once naming the lane, and
leaves the other lanes and every moment as they were. The truth: an mpmath Kalman filter in
covariance form at 400 digits (variances past the range are ordinary numbers there).
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import native

BACKENDS = ["sequential", "torch"] + (["native"] if native.available() else []) + ["triton"]


def mp_loglik(z, R, a, p, prior_var, prior_mean=0.0):
    """Exact log-likelihood of one lane (loading 1, offset 0; diffuse-omitted convention for
    ``prior_var = inf``), the inputs taken as the float values given."""
    mp.mp.dps = 400
    T = len(z)
    col = lambda x: [mp.mpf(float(v)) for v in np.broadcast_to(np.asarray(x, float), (T,))]  # noqa: E731
    R, a, p = col(R), col(a), col(p)
    m, P, ll, diffuse = mp.mpf(prior_mean), mp.mpf(0), mp.mpf(0), math.isinf(prior_var)
    if not diffuse:
        P = mp.mpf(prior_var)
    for t in range(T):
        m = a[t] * m
        if diffuse and a[t] == 0:
            diffuse, m, P = False, mp.mpf(0), p[t]
        elif not diffuse:
            P = a[t] ** 2 * P + p[t]
        if math.isnan(float(z[t])):
            continue
        zt = mp.mpf(float(z[t]))
        if diffuse:  # the first informative observation of a diffuse lane: no term
            diffuse, m, P = False, zt, R[t]
            continue
        S = P + R[t]
        v = zt - m
        ll += -(mp.log(2 * mp.pi) + mp.log(S) + v * v / S) / 2
        m, P = m + P / S * v, P * R[t] / S
    return float(ll)


def mp_predicted_var(z, R, a, p, prior_var):
    """Predicted variances of one lane with a proper prior (loading 1), the covariance form at
    400 digits: where they pass ``1/tiny`` of a dtype the lane is lost in that dtype."""
    mp.mp.dps = 400
    T = len(z)
    col = lambda x: [mp.mpf(float(v)) for v in np.broadcast_to(np.asarray(x, float), (T,))]  # noqa: E731
    R, a, p = col(R), col(a), col(p)
    P, out = mp.mpf(float(prior_var)), []
    for t in range(T):
        P = a[t] ** 2 * P + p[t]
        out.append(P)
        if not math.isnan(float(z[t])):
            P = P * R[t] / (P + R[t])
    return out


def first_past_the_range(z, R, a, p, prior_var, dtype):
    """The first step whose predicted variance passes ``1/tiny`` of ``dtype`` (None: none)."""
    big = 1 / mp.mpf(float(np.finfo(dtype).tiny))
    return next((t for t, P in enumerate(mp_predicted_var(z, R, a, p, prior_var)) if P > big),
                None)  # fmt: skip


T_LANES = 24  # the interpreter walks every step in Python: the regime, in few steps


def _lanes(dtype):
    """Three lanes: an explosive decay over a gap (lost), an ordinary lane, a diffuse random walk
    over the same gap (a diffuse state carried on: not lost). The decay makes the predicted
    variance pass the dtype's range mid-gap (step 15 of 24 in float32, 16 in float64), after the
    first time chunk of the interpreted and the chunked plans (12 steps)."""
    T = T_LANES
    rng = np.random.default_rng(1)
    z = np.full((T, 3), np.nan)
    z[:3, 0], z[-3:, 0] = [1.0, 0.5, 0.7], [2.0, 1.5, 1.0]
    z[:, 1] = rng.normal(size=T)
    z[-3:, 2] = [0.3, 0.1, -0.2]
    a = np.array([32.0 if dtype == np.float32 else 1e11, 0.9, 1.0])
    prior = np.array([1.0, 1.0, np.inf])
    t = first_past_the_range(z[:, 0], 1.0, a[0], 1.0, prior[0], dtype)
    assert t is not None and 12 <= t < T - 3, t  # lost in the gap, after the first chunk
    return z.astype(dtype), a.astype(dtype), prior


def _call(fn, backend, *args, **kw):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args, backend=backend, **kw)
    lost = [w for w in got if "log-likelihood is NaN" in str(w.message)]
    return out, lost


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_lost_lane_is_nan_and_others_exact(backend, dtype, triton_on_cpu):
    z, a, prior = _lanes(dtype)
    kw = dict(obs_var=dtype(1.0), decay=a, process_var=dtype(1.0), prior_var=prior)
    ll, lost = _call(ks.loglik, backend, z, **kw)
    assert len(lost) == 1 and "lane index (0,)" in str(lost[0].message)
    assert math.isnan(ll[0])
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for n in (1, 2):
        want = mp_loglik(z[:, n], 1.0, a[n], 1.0, prior[n])
        assert abs(ll[n] - want) <= tol * abs(want), (n, ll[n], want)
    # the filter and the smoother: the same log-likelihood, their moments finite where observed
    res, lost = _call(ks.filter, backend, z, **kw)
    assert len(lost) == 1
    np.testing.assert_array_equal(np.isnan(res.loglik), [True, False, False])
    assert np.isfinite(res.mean[-1]).all() and np.isfinite(res.var[-1]).all()
    sm, lost = _call(ks.smooth, backend, z, **kw)
    assert len(lost) == 1 and math.isnan(sm.filtered.loglik[0])
    assert np.isfinite(sm.mean[-1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_lane_gradients_are_nan(backend, triton_on_cpu):
    """The lost lane's parameter gradients are NaN (a shared parameter's too); the other lanes'
    are those of a call without the lost lane."""
    z, a, prior = _lanes(np.float32)
    at = torch.tensor(a, requires_grad=True)
    R = torch.tensor(1.0, requires_grad=True)  # shared by the lanes
    kw = dict(process_var=1.0, prior_var=torch.tensor(prior, dtype=torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ks.loglik(torch.tensor(z), obs_var=R, decay=at, **kw, backend=backend).sum().backward()
        at2 = torch.tensor(a[1:], requires_grad=True)
        kw2 = dict(kw, prior_var=kw["prior_var"][1:])
        ks.loglik(torch.tensor(z[:, 1:]), obs_var=1.0, decay=at2, **kw2,
                  backend=backend).sum().backward()  # fmt: skip
    assert math.isnan(at.grad[0])
    torch.testing.assert_close(at.grad[1:], at2.grad, rtol=1e-5, atol=0)
    assert math.isnan(R.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_variance_past_the_range_after_a_gap(backend, triton_on_cpu):
    """float64: ``decay = 1e100`` at two unobserved steps makes the predicted variance 1e400;
    the lane's log-likelihood is NaN (the term at the next observation was left out: -10.55 for
    mpmath's -472.15). Just below the range the log-likelihood is exact."""
    z = np.array([0.3, 1.0, np.nan, np.nan, 2.0, 1.0, 0.2, 0.1, 0.4, 0.3])
    a = np.ones(10)
    a[2] = a[3] = 1e100
    ll, lost = _call(ks.loglik, backend, z, obs_var=1.0, decay=a, process_var=1.0, prior_var=1.0)
    assert len(lost) == 1 and math.isnan(ll)
    a[2], a[3] = 1e100, 1e53  # predicted variance ~1e306: ordinary
    ll, lost = _call(ks.loglik, backend, z, obs_var=1.0, decay=a, process_var=1.0, prior_var=1.0)
    assert not lost
    assert ll == pytest.approx(mp_loglik(z, 1.0, a, 1.0, 1.0), rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_false_alarm(backend, triton_on_cpu):
    """Ordinary regimes raise no flag: a diffuse lane over a long gap of explosive decays (it
    stays diffuse, its first observation adds no term; with a proper prior the lane would be
    lost), a forgetting step, a state known exactly (``process_var = 0``, precision past the
    range), a process variance of 1e300."""
    T = 40
    z = np.full((T, 4), np.nan)
    z[-2:] = [[0.5, 0.5, 0.5, 0.5], [0.7, 0.6, 0.4, 0.3]]
    z[:5, 2] = [1.0, 1.1, 0.9, 1.0, 1.05]
    a = np.array([[1e11, 0.9, 1e-10, 1.0]]).repeat(T, 0)
    a[T // 2, 1] = 0.0  # forgets
    p = np.array([1.0, 1.0, 0.0, 1e300])
    prior = np.array([np.inf, 1.0, 1.0, 1.0])
    # the regimes are reached: lane 0 with a proper prior passes the range; lane 2's predicted
    # variance at its next observation is below it (its precision past the range)
    t = first_past_the_range(z[:, 0], 1.0, a[:, 0], p[0], 1.0, np.float64)
    assert t is not None and t < T - 2, t
    tiny = mp.mpf(float(np.finfo(np.float64).tiny))
    assert mp_predicted_var(z[:, 2], 1.0, a[:, 2], p[2], prior[2])[-2] < tiny
    ll, lost = _call(ks.loglik, backend, z, obs_var=1.0, decay=a, process_var=p, prior_var=prior)
    assert not lost and np.isfinite(ll).all()
    for n in range(4):
        want = mp_loglik(z[:, n], 1.0, a[:, n], p[n], prior[n])
        assert ll[n] == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.fixture
def chunked(monkeypatch):
    """Triton's chunked regime (time chunks of 12 steps here; tests/test_chunked_diffuse.py): the
    lost step in a chunk after the first, its lane's sum added over chunks."""
    pytest.importorskip("triton")
    from kalmanscan.cuda import filter as F

    monkeypatch.setattr(F, "_MANY_LANES", 10**9)
    monkeypatch.setitem(F.TUNING, "CK", 4)
    assert F._plan(T_LANES, 3)[:2] == (12, 2)  # _lanes: the lost step in the second chunk


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_lost_lane_chunked_triton(dtype, triton_on_cpu, chunked):
    z, a, prior = _lanes(dtype)
    kw = dict(obs_var=dtype(1.0), decay=a, process_var=dtype(1.0), prior_var=prior)
    for fn in (ks.loglik, ks.filter):
        out, lost = _call(fn, "triton", z, **kw)
        ll = out if fn is ks.loglik else out.loglik
        assert len(lost) == 1 and math.isnan(ll[0]) and np.isfinite(ll[1:]).all()
        tol = 1e-12 if dtype == np.float64 else 2e-5
        assert ll[1] == pytest.approx(mp_loglik(z[:, 1], 1.0, a[1], 1.0, prior[1]), rel=tol)


def test_no_warning_before_an_error():
    """A call refused for a bad input warns of nothing first: the lost-step flag of the same
    run (a diffuse lane whose first observation's information is below the range) is read after
    the input checks (it warned, then raised)."""
    z = np.array([np.nan, 2.0, 3.0, 2.5], np.float32)
    hs = np.array([1e-20, 1e-20, 1.0, 1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="loading"):
            ks.filter(z, np.float32(1.0), np.float32(1.0), np.float32(0.1), loading=hs)
