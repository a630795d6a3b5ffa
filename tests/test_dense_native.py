"""Native CPU path of the dense filter (kalmanscan/dense/_native_dense.c): against the float64
sequential reference, the mpmath oracle (kalmanscan/validation/oracle.py) and statsmodels' KFAS
fixtures."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.testing import rel_error
from tests.helpers import read_only

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")


def random_model(seed, n, d, T, *, B=None, tv=False, prior="cov", missing=0.1):
    rng = np.random.default_rng(seed)
    lead = ((T,) if tv else ()) + ((1,) if (tv and B) else ())

    def spd(k, size, jitter):
        G = rng.normal(size=size + (k, k))
        return G @ np.swapaxes(G, -1, -2) / k + jitter * np.eye(k)

    F = rng.normal(size=lead + (n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max(-1)[..., None, None]
    Q, H, R = spd(n, lead, 0.1), rng.normal(size=lead + (d, n)), spd(d, lead, 0.3)
    z = rng.normal(size=(T,) + ((B,) if B else ()) + (d,))
    z[rng.random(z.shape) < missing] = np.nan
    if T > 5:
        z[5] = np.nan
    kw = dict(offset=0.2 * rng.normal(size=lead + (n,)), prior_mean=rng.normal(size=n))
    if prior == "cov":
        kw["prior_cov"] = spd(n, (), 0.5)
    elif prior == "partial":
        G = rng.normal(size=(n, n - 1))
        kw["prior_precision"] = G @ G.T
    return (z, F, Q, H, R), kw


CASES = [
    ("n1-d1-T1-cov", 1, 1, 1, None, False, "cov"),
    ("n2-d1-T63-diffuse", 2, 1, 63, None, False, "diffuse"),
    ("n3-d2-T63-B3-tv-partial", 3, 2, 63, 3, True, "partial"),
    ("n4-d3-T100-B2-tv-diffuse", 4, 3, 100, 2, True, "diffuse"),
    ("n8-d3-T1000-cov", 8, 3, 1000, None, False, "cov"),
    ("n13-d1-T300-cov", 13, 1, 300, None, False, "cov"),
    ("n17-d2-T50-cov", 17, 2, 50, None, False, "cov"),
]


def _finite(x):
    return np.where(np.isinf(x), 0.0, x)


@pytest.mark.parametrize("cid,n,d,T,B,tv,prior", CASES, ids=[c[0] for c in CASES])
def test_native_matches_sequential_reference(cid, n, d, T, B, tv, prior):
    args, kw = random_model(len(cid), n, d, T, B=B, tv=tv, prior=prior)
    a = kd.smooth(*args, backend="native", **kw)
    b = kd.smooth(*args, backend="sequential", **kw)
    fa, fb = a.filtered, b.filtered
    np.testing.assert_array_equal(fa.diffuse, fb.diffuse)
    np.testing.assert_array_equal(np.isinf(fa.cov), np.isinf(fb.cov))
    tol = 1e-8  # the reference's own diffuse smoother rounds at ~1e-9 (n = 17)
    for x, y in [
        (fa.mean, fb.mean),
        (_finite(fa.cov), _finite(fb.cov)),
        (fa.precision, fb.precision),
        (fa.pred_mean, fb.pred_mean),
        (fa.pred_cov, fb.pred_cov),
        (a.mean, b.mean),
        (a.cov, b.cov),
        (a.precision, b.precision),
    ]:
        assert rel_error(x, y) < tol
    assert rel_error(np.asarray(fa.loglik), np.asarray(fb.loglik)) < 1e-12


def test_auto_uses_native_on_the_cpu(monkeypatch):
    """auto runs the compiled path for CPU inputs (a spy on native.run), with and without grad."""
    import torch

    calls = []
    real = native.run
    monkeypatch.setattr(native, "run", lambda *a: calls.append(1) or real(*a))
    args, kw = random_model(1, 3, 2, 40, prior="diffuse")
    a, b = kd.smooth(*args, **kw), kd.smooth(*args, backend="native", **kw)
    assert len(calls) == 2
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.filtered.loglik, b.filtered.loglik)
    F = torch.as_tensor(args[1]).requires_grad_(True)
    t = [torch.as_tensor(x) for x in args]
    kwt = {k: torch.as_tensor(v) for k, v in kw.items()}
    res = kd.smooth(t[0], F, *t[2:], **kwt)
    assert len(calls) == 3
    np.testing.assert_array_equal(res.mean.detach().numpy(), b.mean)


def test_auto_gradients_match_the_torch_path():
    """With inputs that require grad, auto (native values) carries the scan's gradients: the same
    gradients as backend='torch' and, by gradcheck, the derivative of the native values."""
    import torch

    args, kw = random_model(4, 2, 1, 12, prior="diffuse")
    z, F, Q, H, R = (torch.as_tensor(x) for x in args)
    kwt = {k: torch.as_tensor(v) for k, v in kw.items()}

    def loss(backend, F, Q, R):
        res = kd.smooth(z, F, Q, H, R, backend=backend, **kwt)
        return res.filtered.loglik + 1e-2 * res.mean.square().sum() + 1e-2 * res.cov.sum()

    params = [t.clone().requires_grad_(True) for t in (F, Q, R)]
    ga = torch.autograd.grad(loss("auto", *params), params)
    gb = torch.autograd.grad(loss("torch", *params), params)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda F, Q, R: loss("auto", F, 0.5 * (Q + Q.T), 0.5 * (R + R.T)),
        params,
        atol=1e-6,
        rtol=1e-5,
    )


def test_native_loglik_diagonal_diffuse_nonunit_loading():
    """The second state stays diffuse while entry 2 (loading 1.7) is observed: the Householder
    reduction leaves ~1e-16 of that direction in the diffuse factor, which the update rightly
    treats as proper; the step's pdet term must count it as rank 0 too (it added log(1e-32) / 2,
    36 nats, when the rank came from a threshold on the singular values alone)."""
    z = np.array([[0.1, np.nan, -0.03], [0.7, np.nan, -0.46], [-1.9, -1.29, -1.84]])
    Q, R = np.diag([0.3, 0.37, 0.89]), np.diag([0.57, 0.44, 0.42])
    F = np.eye(3)
    for loading in (1.0, 1.3, 1.5, 1.7, 2.0):
        H = np.diag([1.0, 1.0, loading])
        a = kd.filter(z, F, Q, H, R, backend="native").loglik
        b = kd.filter(z, F, Q, H, R, backend="sequential").loglik
        c = kd.filter(z, F, Q, H, R, backend="diagonal").loglik
        assert abs(a - b) < 1e-12 * abs(b)
        assert abs(a - c) < 1e-12 * abs(c)


@pytest.mark.parametrize("seed", range(12))
def test_native_loglik_random_diffuse_models(seed):
    """Random small models with a diffuse or partly diffuse prior, partial missing data and
    integer (sparse) loadings: native and reference log-likelihoods and diffuse flags agree."""
    rng = np.random.default_rng([seed, 25])
    n, d, T = int(rng.integers(1, 6)), int(rng.integers(1, 5)), int(rng.integers(1, 30))
    F = rng.normal(size=(n, n))
    H = np.round(rng.normal(size=(d, n))) if seed % 2 else rng.normal(size=(d, n))
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n
    G = rng.normal(size=(d, d))
    R = G @ G.T / d + 0.1 * np.eye(d)
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < 0.3] = np.nan
    kw = {} if seed % 3 else dict(prior_precision=np.diag((rng.random(n) < 0.5) * 1.0))
    a = kd.filter(z, F, Q, H, R, backend="native", **kw)
    b = kd.filter(z, F, Q, H, R, backend="sequential", **kw)
    np.testing.assert_array_equal(a.diffuse, b.diffuse)
    assert abs(a.loglik - b.loglik) <= 1e-9 * (1 + abs(b.loglik))


def test_native_float32_computes_in_float64():
    args, kw = random_model(2, 4, 2, 200, prior="cov")
    a = kd.filter(*(np.asarray(x, np.float32) for x in args), backend="native", **kw)
    b = kd.filter(*args, backend="native", **kw)
    assert a.mean.dtype == np.float32
    assert rel_error(a.mean, b.mean) < 1e-4  # the float32 inputs are a different model


def test_native_rejects_infinite_z():
    args, kw = random_model(3, 2, 1, 20)
    args[0][3, 0] = np.inf
    with pytest.raises(ValueError, match="z: expected finite"):
        kd.filter(*args, backend="native", **kw)


def _oracle():
    from kalmanscan.validation import oracle

    return oracle


@functools.cache
def _mixing_oracle(seed, n, d, r, missing, dps):
    """``_mixing(seed, n, d, r, "diffuse", missing)`` and its :func:`dense_oracle` at ``dps``
    digits: the same for every backend, computed once (the arrays read only)."""
    from kalmanscan.validation.regimes import _mixing

    z, F, Q, H, R, _ = _mixing(seed, n, d, r, "diffuse", missing=missing)
    o = _oracle().dense_oracle(z, F, Q, H, R, dps=dps)
    read_only(z, F, Q, H, R, *o)
    return (z, F, Q, H, R), o


def _var1_missing():
    """KFAS's VAR(1) with missing data (statsmodels' fixture), prior on the first state: step 0
    has F = I and Q = 0, so x_1 = x_0 carries the diffuse prior as in KFAS."""
    from statsmodels.datasets import macrodata

    levels = macrodata.load_pandas().data[["realgdp", "realcons"]]
    y = (np.log(levels).iloc[:21].diff().iloc[1:] * 400).to_numpy()
    y[0:5, 0] = np.nan
    y[8:12, :] = np.nan
    T = len(y)
    F = np.repeat(np.array([[0.5, 0.3], [0.2, 0.4]])[None], T, 0)
    Q = np.repeat(np.diag([2.0, 3.0])[None], T, 0)
    F[0], Q[0] = np.eye(2), 0.0
    return y, F, Q, np.eye(2)


@pytest.mark.parametrize("r", [1e-6, 1e-10, 1e-12, 0.0], ids=lambda r: f"R{r:g}")
def test_native_var1_near_noiseless_against_oracle(r):
    pytest.importorskip("statsmodels")
    y, F, Q, H = _var1_missing()
    R = r * np.eye(2)
    res = kd.smooth(y, F, Q, H, R, backend="native")
    o = _oracle().dense_oracle(y, F, Q, H, R, dps=60)
    nd = int(o.diffuse.sum())
    assert int(res.filtered.diffuse.sum()) == nd
    scale = np.abs(o.mean).max()
    assert np.abs(res.filtered.mean[nd:] - o.mean[nd:]).max() < 1e-13 * scale
    assert np.abs(_finite(res.filtered.cov)[nd:] - o.cov[nd:]).max() < 1e-13 * np.abs(o.cov).max()
    assert np.abs(res.mean - o.smooth_mean).max() < 1e-13 * scale
    assert np.abs(res.cov - o.smooth_cov).max() < 1e-13 * np.abs(o.smooth_cov).max()
    assert abs(res.filtered.loglik - o.loglik) < 1e-12 * abs(o.loglik)


def test_singular_r_scan_matches_native():
    """R = 0 with Q positive definite: the scan serves it (H Q H' + R positive definite) and
    agrees with native; a step without process noise observed exactly after the diffuse head
    still needs native (tests/test_dense.py)."""
    pytest.importorskip("statsmodels")
    y, F, Q, H = _var1_missing()
    a = kd.smooth(y, F, Q, H, np.zeros((2, 2)), backend="torch")
    b = kd.smooth(y, F, Q, H, np.zeros((2, 2)), backend="native")
    scale = np.abs(b.mean).max()
    assert np.abs(a.filtered.mean - b.filtered.mean).max() < 1e-13 * scale
    assert np.abs(a.mean - b.mean).max() < 1e-13 * scale
    assert abs(a.filtered.loglik - b.filtered.loglik) < 1e-12 * abs(b.filtered.loglik)


def test_native_structural_large_prior_against_oracle():
    """9-state trend + seasonal(8), prior covariance 1e6 I: log-likelihood and filtered moments
    over the first 60 steps of a 120-step series (the large-prior head is its first steps; the
    60-digit oracle's cost is linear in the steps: 1.9 s here, 3.4 s over 120)."""
    rng = np.random.default_rng(3)
    m = kd.add_components(kd.local_linear_trend(0.3, 0.01, 1.0), kd.seasonal_dummies(8, 0.05))
    n, T = m.F.shape[0], 120
    t = np.arange(T)
    z = np.cumsum(rng.normal(size=T)) * 0.3 + 10 * np.sin(t * np.pi / 4) + rng.normal(size=T)
    z = z[:, None]
    z[rng.random(T) < 0.1] = np.nan
    z = z[:60]
    assert np.isnan(z).any() and bool(np.isnan(z[: 2 * n]).any())  # missing in the head too
    kw = dict(prior_cov=1e6 * np.eye(n), prior_mean=np.zeros(n))
    o = _oracle().dense_oracle(z, m.F, m.Q, m.H, m.R, **kw, dps=60)
    res = kd.smooth(z, **m._asdict(), **kw, backend="native")
    assert abs(res.filtered.loglik - o.loglik) < 1e-11 * abs(o.loglik)
    assert rel_error(res.filtered.mean, o.mean) < 1e-8
    assert rel_error(res.filtered.cov, o.cov) < 1e-8  # entries of 1e6 at the first steps
    assert rel_error(res.mean, o.smooth_mean) < 1e-7
    # the prior is carried as a factor (the large-prior head, docs/dense.md) and the head's
    # smoothed moments come from square-root rows: 1.7e-13 normwise (1.2e-7 when the prior was
    # part of the covariance and the first steps took the information form)
    assert rel_error(res.cov, o.smooth_cov) < 1e-11
    assert rel_error(res.cov[n:], o.smooth_cov[n:]) < 1e-11


@pytest.mark.parametrize("seed", range(12))
def test_native_large_prior_near_noiseless_against_oracle(seed):
    """Prior 1e6 I and one near noise-free entry (R = 1e-10) along a direction that mixes the
    three states: the prior is carried as a factor (the large-prior head, docs/dense.md) and the
    head's smoothed moments come from square-root rows. With the prior in the covariance, seeds
    2, 4, 6, 8, 9 and 10 were 6.5e-8 .. 1.7e-6 relative off in the smoothed covariances."""
    from kalmanscan.validation import regimes

    rng = np.random.default_rng(seed)
    n, T = 3, 25
    A = rng.normal(size=(n, n))
    F = A * 0.95 / np.abs(np.linalg.eigvals(A)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n * 10.0 ** rng.integers(-2, 1)
    H, R = rng.normal(size=(1, n)), np.array([[1e-10]])
    z = rng.normal(size=(T, 1)) * 3
    z[rng.random(T) < 0.4] = np.nan
    kw = dict(prior_mean=np.zeros(n), prior_cov=1e6 * np.eye(n))
    o = _oracle().dense_oracle(z, F, Q, H, R, dps=50, **kw)
    out = regimes._run_dense(regimes.DenseRegime("x", z, F, Q, H, R, **kw), "native", "float64")
    errs = regimes.dense_errors(out, o)
    assert regimes.passes(errs, "float64"), errs


def test_native_large_prior_outputs_against_oracle():
    """An ordinary 4-state model under a 1e6 prior (the large-prior head, carried as a factor):
    predicted and filtered moments, precisions, smoothed moments and log-likelihood against the
    oracle; a second series in the same call with an ordinary prior keeps the plain form (the
    reference's values to rounding)."""
    args, kw = random_model(5, 4, 2, 60, B=2)
    big = 1e6 * np.eye(4)
    kw["prior_cov"] = np.stack([big, kw["prior_cov"]])
    kw["prior_mean"] = np.stack([kw["prior_mean"]] * 2)
    a = kd.smooth(*args, backend="native", **kw)
    f = a.filtered
    assert not f.diffuse.any()
    z, F, Q, H, R = args
    o = _oracle().dense_oracle(z[:, 0], F, Q, H, R, offset=kw["offset"],
                               prior_mean=kw["prior_mean"][0], prior_cov=big, dps=50)  # fmt: skip
    sd = np.sqrt(np.einsum("tii->ti", o.cov))
    assert (np.abs(f.mean[:, 0] - o.mean) / sd).max() < 1e-9
    assert (np.abs(f.pred_mean[:, 0] - o.pred_mean) / sd).max() < 1e-9
    # per step, measured: predicted 4.0e-14, filtered 3.7e-13 (the reference 3.2e-11, 5.8e-11),
    # smoothed 6.1e-10 at the first step after the head (the reference 4.1e-9)
    for x, y, tol in ((f.pred_cov[:, 0], o.pred_cov, 1e-12), (f.cov[:, 0], o.cov, 1e-11),
                      (a.cov[:, 0], o.smooth_cov, 5e-9)):  # fmt: skip
        assert max(rel_error(x[t], y[t]) for t in range(len(y))) < tol
    assert rel_error(f.precision[:, 0], np.linalg.inv(o.cov)) < 1e-9
    ssd = np.sqrt(np.einsum("tii->ti", o.smooth_cov))
    assert (np.abs(a.mean[:, 0] - o.smooth_mean) / ssd).max() < 1e-9
    assert abs(f.loglik[0] - o.loglik) < 1e-12 * abs(o.loglik)
    b = kd.smooth(*args, backend="sequential", **kw)
    for x, y in ((f.pred_cov, b.filtered.pred_cov), (f.cov, b.filtered.cov), (a.cov, b.cov)):
        assert rel_error(x[:, 1], y[:, 1]) < 1e-12
    assert abs(f.loglik[1] - b.filtered.loglik[1]) < 1e-12 * abs(b.filtered.loglik[1])


def test_native_llt_matches_statsmodels_exact_diffuse():
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    rng = np.random.default_rng(7)
    y = np.cumsum(np.cumsum(rng.normal(size=300)) * 0.1) + rng.normal(size=300)
    y[[10, 11, 50]] = np.nan
    mod = sm.UnobservedComponents(y, "local linear trend", use_exact_diffuse=True)
    mod.ssm.tolerance = 0
    r = mod.smooth([0.7, 0.5, 0.3])
    m = kd.local_linear_trend(level_var=0.5, slope_var=0.3, obs_var=0.7)
    res = kd.smooth(y[:, None], **m._asdict(), backend="native")
    nd = int(res.filtered.diffuse.sum())
    assert rel_error(res.filtered.mean[nd:], r.filtered_state.T[nd:]) < 1e-12
    assert rel_error(res.mean, r.smoothed_state.T) < 1e-12
    assert rel_error(res.cov, r.smoothed_state_cov.transpose(2, 0, 1)) < 1e-12
    offset = _oracle().loglik_offset("statsmodels", m.F, m.H, ~np.isnan(y))
    assert abs(res.filtered.loglik - offset - r.llf) < 1e-9 * abs(r.llf)


@pytest.mark.slow  # the 80-digit oracle over 300 steps: 25 s
def test_native_rank_decisions_against_oracle():
    """13 diffuse states seen through one noisy scalar under a random contracting F: the diffuse
    part shrinks like 0.95^t and its last direction is weakly observed. The native path's
    Householder-reduced factor resolves it where the oracle does (step 13), as do the reference
    loop's and the scan's counted factors (the scan: tests/test_dense.py)."""
    args, kw = random_model(len("n13-d1-T300-diffuse"), 13, 1, 300, prior="diffuse")
    o = _oracle().dense_oracle(*args, offset=kw["offset"], prior_mean=kw["prior_mean"], dps=80)
    res = kd.smooth(*args, backend="native", **kw)
    np.testing.assert_array_equal(res.filtered.diffuse, o.diffuse)
    nd = int(o.diffuse.sum())
    assert abs(res.filtered.loglik - o.loglik) < 1e-11 * abs(o.loglik)
    # in posterior sd (the battery's measure): 1.2e-10 sd measured on the x86-64-v4 clone; the
    # normwise relative error there is 1.9e-9 (1.7e-10 on the v3 clone): the weakly observed
    # direction's variance is 1e8, so its rounding dominates a relative figure
    sd = np.sqrt(np.einsum("tii->ti", o.cov[nd:]))
    assert (np.abs(res.filtered.mean[nd:] - o.mean[nd:]) / sd).max() < 1e-9
    assert rel_error(res.filtered.cov[nd:], o.cov[nd:]) < 1e-9
    # smoothed moments of the diffuse steps hinge on the weakly observed direction (means of
    # 3e3, variances of 1e8 at step 0): the backward square-root information filter serves them
    # (Durbin & Koopman's diffuse terms were 2e4 relative off in the covariances, 1e-4 in the
    # means); measured per step at most 1.6e-9 relative (covariances) and 1.0e-9 (means), the
    # level of the proper steps that follow (1.2e-9)
    for t in range(nd + 1):
        assert rel_error(res.cov[t], o.smooth_cov[t]) < 5e-9, t
        assert rel_error(res.mean[t], o.smooth_mean[t]) < 5e-9, t
    assert rel_error(res.cov, o.smooth_cov) < 1e-10  # normwise over all steps: 3.6e-11
    ssd = np.sqrt(np.einsum("tii->ti", o.smooth_cov))  # 1.2e-11 sd measured
    assert (np.abs(res.mean - o.smooth_mean) / ssd).max() < 1e-9


def test_native_smoothed_diffuse_steps_of_a_weakly_resolved_state():
    """The model above over its first 26 steps (an 80-digit oracle of 3 s; 5 s at 40): the
    smoothed moments of the 13 diffuse steps (variances of 1e8 at step 0) from the backward
    square-root information filter, 13 proper steps after them. Measured per step: covariances
    1.3e-9 relative at most, means 2.8e-10 (2.0e-9 and 1.7e-10 at 40 steps)."""
    args, kw = random_model(len("n13-d1-T300-diffuse"), 13, 1, 300, prior="diffuse")
    args = (args[0][:26],) + args[1:]
    o = _oracle().dense_oracle(*args, offset=kw["offset"], prior_mean=kw["prior_mean"], dps=80)
    res = kd.smooth(*args, backend="native", **kw)
    nd = int(o.diffuse.sum())
    assert nd == 13
    np.testing.assert_array_equal(res.filtered.diffuse, o.diffuse)
    for t in range(nd + 1):
        assert rel_error(res.cov[t], o.smooth_cov[t]) < 5e-9, t
        assert rel_error(res.mean[t], o.smooth_mean[t]) < 5e-9, t
    assert rel_error(res.cov, o.smooth_cov) < 1e-10  # normwise: 2.0e-11
    ssd = np.sqrt(np.einsum("tii->ti", o.smooth_cov))
    assert (np.abs(res.mean - o.smooth_mean) / ssd).max() < 1e-9


@pytest.mark.parametrize("seed", [110, 342, 29, 341])
def test_small_diffuse_directions_stay_diffuse_against_oracle(seed):
    """Diagonal models whose unobserved diffuse states contract (decays 0.0053 and -0.038): the
    direction is 1e-6 .. 1e-5 the scale of the others when first observed, still diffuse in exact
    arithmetic. Native and the reference loop (its factor kept at the counted rank) equal the
    oracle's log-likelihood; the reference's former sqrt(eps) threshold on P_inf resolved it
    early (7.1 and 1.0 nats off). Seeds 29 and 341 (decays 0.046 and 0.063, the state first
    observed at steps 4 and 3): native's Householder drop of a resolved column left a residue of
    eps times that column in the remaining one, above the diffuse threshold next to the
    contracted column, so an entry that does not see it resolved it (filtered means 2.5 and
    3.3 sd off the oracle, log-likelihood 0.19 and 1.5 relative); the residue is now removed."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    rng.integers(1, 5)
    T = int(rng.integers(1, 30))
    F, H = np.diag(rng.uniform(-1.2, 1.2, n)), np.diag(rng.uniform(0.2, 3, n))
    Q, R = np.diag(rng.uniform(0, 1, n)), np.diag(rng.uniform(0.1, 1, n))
    z = rng.normal(size=(T, n))
    z[rng.random(z.shape) < 0.3] = np.nan
    o = _oracle().dense_oracle(z, F, Q, H, R, dps=60)
    for backend in ("native", "sequential", "diagonal"):
        ll = kd.filter(z, F, Q, H, R, backend=backend).loglik
        assert abs(ll - o.loglik) < 1e-11 * abs(o.loglik), backend
    a = kd.smooth(z, F, Q, H, R, backend="native")
    b = kd.smooth(z, F, Q, H, R, backend="sequential")
    np.testing.assert_array_equal(a.filtered.diffuse, b.filtered.diffuse)
    assert rel_error(a.mean, b.mean) < 1e-10 and rel_error(a.cov, b.cov) < 1e-10


@pytest.mark.parametrize("backend", ["native", "sequential", "torch"])
@pytest.mark.parametrize("seed,miss", [(0, 0.0), (3, 0.0), (13, 0.3)])
def test_diffuse_start_observed_whole_near_noiseless_against_oracle(backend, seed, miss):
    """Random 2-state models, diffuse start, both entries at R = 1e-12 I (seed 13: 30 % missing,
    one direction resolved by a single entry first, P_* entering the later step). The posterior
    at the diffuse step is O(R), which Durbin & Koopman's scalar updates formed as a difference
    of O(1) terms: filtered covariances 4.0e-5 / 1.9e-5 / 6.3e-6 relative off the oracle on
    every backend before (docs/dense.md). Now within 1e-10 normwise at every step (measured
    8e-16 at most on seeds 0 and 3, 3.3e-12 on seed 13, whose means are 1e4 prior sd apart
    from step to step), means within 1e-6 sd in the battery's metric (measured 1.6e-7 at most,
    seed 13)."""
    from kalmanscan.validation.regimes import _dense_mean_sd

    if backend == "native" and not native.available():
        pytest.skip("native extension not built")
    (z, F, Q, H, R), o = _mixing_oracle(seed, 2, 2, 1e-12, miss, 60)
    f = kd.filter(z, F, Q, H, R, backend=backend)
    cov, mean = np.asarray(f.cov), np.asarray(f.mean)
    for t in np.flatnonzero(~o.diffuse):
        assert rel_error(cov[t], o.cov[t]) < 1e-10, (t, rel_error(cov[t], o.cov[t]))
    # means in the battery's unit (posterior sd, floored at 1e-4 of the lane's largest value)
    assert _dense_mean_sd(mean, o.mean, o.cov, np.flatnonzero(~o.diffuse)) < 1e-6


@pytest.mark.parametrize("backend", ["native", "sequential", "torch"])
@pytest.mark.parametrize("seed,n,d", [(9, 3, 4), (7, 3, 4), (28, 2, 2)])
def test_near_noiseless_entries_observing_the_whole_state_against_oracle(backend, seed, n, d):
    """Diffuse start, every entry at R = 1e-12 I, d >= n entries observing the whole state at
    every step (random rows; the data are far from the model's, so the posterior moves by 1e4
    .. 1e6 of its sd from step to step). Before: filtered means 3.6 / 1.6 sd off the oracle
    (battery metric; sequential, seeds 9 / 7) and 1.3 / 0.87 sd (native), log-likelihood 1.5e-3
    relative: the entries after the last diffuse one saw the cancelled P, and the reference's
    proper steps formed P H' S^-1 with cond(S) ~ 1e10; seed 28 (cond(H) = 182) 1.5e-6 sd on
    the reference. The scan's elements and step log-likelihoods did the same (3.2 sd,
    log-likelihood 1.5e-3 relative). Now within 1e-8 sd (measured 2.8e-11 .. 1.6e-9),
    covariances 1e-10."""
    from kalmanscan.validation.regimes import _dense_mean_sd, loglik_rel

    if backend == "native" and not native.available():
        pytest.skip("native extension not built")
    # 120 digits: at 60 the oracle's kappa = 1e20 covariance filter is itself wrong here (seed
    # 7's covariance at the diffuse step 136 % off; 40, 80, 120 and 160 digits agree)
    (z, F, Q, H, R), o = _mixing_oracle(seed, n, d, 1e-12, 0.0, 120)
    f = kd.filter(z, F, Q, H, R, backend=backend)
    steps = np.flatnonzero(~o.diffuse)
    assert _dense_mean_sd(np.asarray(f.mean), o.mean, o.cov, steps) < 1e-8
    assert max(rel_error(np.asarray(f.cov)[t], o.cov[t]) for t in steps) < 1e-10
    assert loglik_rel(float(f.loglik), o.loglik, o.n_loglik_terms) < 1e-12


@pytest.mark.parametrize("backend", ["sequential", "torch"])
@pytest.mark.parametrize("r,prior", [(1e-12, "diffuse"), (1e-8, "unit"), (1e-6, "diffuse")])
def test_near_noiseless_whole_state_loglik_gradient(backend, r, prior):
    """d loglik / d Q through the direct diffuse step (observed_whole_cov) and the reference's
    square-root proper step (_factor_update) against central differences of native's
    log-likelihood. The factor update's first version took _reduce_rows' straight-through rows,
    whose derivative is not triangular, into triangular solves: -0.253 where the truth is
    0.155; the scan's square-root elements (scan._sqrt_elements) were 1.6e-5 relative off at
    R = 1e-6 until their derivative went through the linearized Schur complements (measured
    agreement now 2e-9 relative or better)."""
    import torch

    from kalmanscan.validation.regimes import _mixing

    if not native.available():
        pytest.skip("native extension not built")
    z, F, Q, H, R, kw = _mixing(0, 2, 2, r, prior, missing=0.0)
    Qt = torch.tensor(Q, requires_grad=True)
    kt = {k: torch.tensor(v) for k, v in kw.items()}
    ll = kd.filter(torch.tensor(z), torch.tensor(F), Qt, torch.tensor(H), torch.tensor(R),
                   backend=backend, **kt).loglik  # fmt: skip
    (g,) = torch.autograd.grad(ll.sum(), Qt)
    E = np.random.default_rng(1).normal(size=Q.shape)
    E = (E + E.T) / 2 * 1e-5 * np.abs(Q).max()

    def f(QQ):
        return float(kd.filter(z, F, QQ, H, R, backend="native", **kw).loglik)

    fd = (f(Q + E) - f(Q - E)) / 2
    assert abs(float((g.numpy() * E).sum()) - fd) < 1e-6 * abs(fd)


def test_observed_whole_cov_partly_diffuse_closed_form():
    """sequential.observed_whole_cov against the explicit posterior: prediction N(0, P + kappa
    d d') with one diffuse direction d, rows W of rank 2; the posterior precision is
    W'W + Z (Z' P Z)^-1 Z' (Z orthogonal to d), inverted in float64 where it is well
    conditioned (W of order 1, so no near noise-free cancellation)."""
    import torch

    from kalmanscan.dense.sequential import observed_whole_cov

    rng = np.random.default_rng(4)
    G = rng.normal(size=(2, 2))
    P = G @ G.T + 0.1 * np.eye(2)
    d = rng.normal(size=2)
    W = rng.normal(size=(3, 2))
    z = np.array([-d[1], d[0]]) / np.linalg.norm(d)
    prec = W.T @ W + np.outer(z, z) / (z @ P @ z)
    want = np.linalg.inv(prec)
    D = np.zeros((2, 2))
    D[:, 0] = d
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)[None]  # noqa: E731
    got, ok = observed_whole_cov(t(P), t(D), torch.tensor([1]), t(W))
    assert bool(ok[0])
    assert rel_error(got[0].numpy(), want) < 1e-13
    got, ok = observed_whole_cov(t(P), t(np.eye(2)), torch.tensor([2]), t(W))  # fully diffuse
    assert rel_error(got[0].numpy(), np.linalg.inv(W.T @ W)) < 1e-13
    got, ok = observed_whole_cov(t(P), t(D), torch.tensor([1]), t(W[:, :1] * [1.0, 1.0]))
    assert not bool(ok[0])  # rank 1: refused


def _dense_checks_model(name):
    """The model ``name`` of validation.dense_checks.check_dense(quick=True) (its rng replayed)."""
    from kalmanscan.validation import dense_checks as dc

    rng = np.random.default_rng(0)
    for n, d in ((1, 1), (2, 1), (4, 2), (8, 3)):
        for T, tv in ((50, False), (40, True)):
            dc.random_model(rng, n, d, T, tv=tv, prior="cov", missing=0.1, partial=False,
                            offset=False)  # fmt: skip
    dc.random_model(rng, 8, 3, 1000, prior="cov", missing=0.1, partial=False, offset=False)
    for n, d, T in ((1, 1, 12), (2, 1, 15), (3, 2, 12), (4, 2, 10)):
        for prior in ("cov", "diffuse", "partial"):
            for sq in (False, True) if n > 1 else (False,):
                model = dc.random_model(rng, n, d, T, tv=True, prior=prior, missing=0.15,
                                        partial=True, singular_q=sq)  # fmt: skip
                if f"n{n}-d{d}-T{T}-{prior}" + ("-singQ" if sq else "") == name:
                    return model, dc.dense_oracle(model)
    raise KeyError(name)


def test_native_smoothed_cov_at_diffuse_steps_against_oracle():
    """The diffuse rank drops over three steps with a full P_*: Durbin & Koopman's diffuse
    smoother terms left 1e-7 relative in the smoothed covariances there; the backward square-root
    information filter that serves those steps is at 1e-13 (measured 9.2e-14)."""
    model, truth = _dense_checks_model("n3-d2-T12-diffuse")
    kw = {k: v for k, v in model.items() if k not in ("z", "F", "Q", "H", "R")}
    s = kd.smooth(model["z"], model["F"], model["Q"], model["H"], model["R"], backend="native",
                  **kw)  # fmt: skip
    sd = np.sqrt(np.einsum("tii->ti", truth["smooth_cov"]))
    assert (np.abs(s.mean - truth["smooth_mean"]) / sd).max() < 1e-9
    assert rel_error(s.cov, truth["smooth_cov"]) < 1e-11  # 3e-12 at step 3 (proper)
    assert max(rel_error(s.cov[t], truth["smooth_cov"][t]) for t in range(3)) < 1e-12


def test_dense_dispatch_without_the_extension(monkeypatch):
    """The dense op's entry of the one dispatch table: auto is native on the CPU and triton
    (torch without triton) on CUDA; without the extension auto is torch and an explicit
    'native' says what to use."""
    import torch

    from kalmanscan.core import backends

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert backends.resolve("auto", cpu, op="dense") == "native"
    on_cuda = "triton" if backends._triton_available() else "torch"
    assert backends.resolve("auto", cuda, op="dense") == on_cuda
    with pytest.raises(ValueError, match="'native' runs on CPU tensors.*'torch'"):
        backends.resolve("native", cuda, op="dense")
    args, kw = random_model(1, 3, 2, 40, prior="diffuse")
    want = kd.smooth(*args, backend="torch", **kw)
    monkeypatch.setattr(native, "_ext", None)
    assert backends.resolve("auto", cpu, op="dense") == "torch"
    got = kd.smooth(*args, **kw)
    np.testing.assert_array_equal(got.mean, want.mean)
    with pytest.raises(ValueError, match="'native' needs the compiled extension.*'torch'"):
        kd.filter(*args, backend="native", **kw)
    with pytest.raises(ValueError, match="'native' needs the compiled extension.*'torch'"):
        kd.fit(args[0][:, :1], kd.local_linear_trend, backend="native")


# The padded vector forms of the kernel's products, inverses and covariance steps (4 < n <= 16:
# _native_dense.c, "Padded vector forms") on time-varying, batched, diffuse and partly diffuse
# models with missing entries, against the sequential reference; n = 17 runs the scalar forms.
VECTOR_CASES = [
    ("n5-d2-T80-B2-tv-diffuse", 5, 2, 80, 2, True, "diffuse"),
    ("n7-d1-T120-cov", 7, 1, 120, None, False, "cov"),
    ("n9-d3-T60-B2-tv-partial", 9, 3, 60, 2, True, "partial"),
    ("n12-d2-T90-diffuse", 12, 2, 90, None, False, "diffuse"),
    ("n13-d2-T70-B3-tv-diffuse", 13, 2, 70, 3, True, "diffuse"),
    ("n16-d2-T60-tv-cov", 16, 2, 60, None, True, "cov"),
]


@pytest.mark.parametrize("cid,n,d,T,B,tv,prior", VECTOR_CASES, ids=[c[0] for c in VECTOR_CASES])
def test_native_vector_forms_match_sequential_reference(cid, n, d, T, B, tv, prior):
    test_native_matches_sequential_reference(cid, n, d, T, B, tv, prior)


def test_native_structural_seasonal_matches_statsmodels_exact_diffuse():
    """The 13-state local linear trend + seasonal(12) (sparse F, rank-3 Q: the vector forms'
    benchmark model) against statsmodels with the exact diffuse start."""
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    rng = np.random.default_rng(11)
    T = 400
    y = np.cumsum(np.cumsum(rng.normal(size=T)) * 0.05 + rng.normal(size=T) * 0.7)
    y = y + 3.0 * np.sin(2 * np.pi * np.arange(T) / 12) + rng.normal(size=T)
    y[rng.random(T) < 0.03] = np.nan
    mod = sm.UnobservedComponents(y, "local linear trend", seasonal=12, use_exact_diffuse=True)
    mod.ssm.tolerance = 0
    r = mod.smooth([1.0, 0.5, 0.05, 0.1])
    llt = kd.local_linear_trend(level_var=0.5, slope_var=0.05, obs_var=1.0)
    m = kd.add_components(llt, kd.seasonal_dummies(12, seasonal_var=0.1))
    res = kd.smooth(y[:, None], **m._asdict(), backend="native")
    nd = int(res.filtered.diffuse.sum())
    assert rel_error(res.filtered.mean[nd:], r.filtered_state.T[nd:]) < 1e-11
    assert rel_error(res.filtered.cov[nd:], r.filtered_state_cov.transpose(2, 0, 1)[nd:]) < 1e-11
    assert rel_error(res.mean, r.smoothed_state.T) < 1e-11
    assert rel_error(res.cov, r.smoothed_state_cov.transpose(2, 0, 1)) < 1e-11
    inv = np.linalg.inv(res.cov)
    assert rel_error(res.precision, (inv + np.swapaxes(inv, -1, -2)) / 2) < 1e-9


_AVX512_SCRIPT = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
import kalmanscan.dense as kd
from test_dense_native import random_model
out = []
for seed, n, prior in ((1, 6, "cov"), (2, 13, "diffuse"), (3, 16, "partial")):
    args, kw = random_model(seed, n, 2, 40, B=2, tv=True, prior=prior)
    r = kd.smooth(*args, backend="native", **kw)
    out += [r.precision, r.filtered.precision, r.cov, r.mean]
np.savez({path!r}, *out)
"""


@pytest.mark.slow  # three subprocesses importing torch: 7 s (CI runs it in its slow step)
def test_native_vector_forms_equal_scalar_forms(tmp_path):
    """The AVX-512 inverse (taken where the CPU has it), the four-double vector forms
    (KALMANSCAN_NO_AVX512 set at import) and the scalar forms (KALMANSCAN_DENSE_SCALAR) do the
    same arithmetic: the same bits."""
    import os
    import subprocess
    import sys

    outs = []
    for i, flag in enumerate((None, "KALMANSCAN_NO_AVX512", "KALMANSCAN_DENSE_SCALAR")):
        path = str(tmp_path / f"out{i}.npz")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KALMANSCAN_")}
        if flag:
            env[flag] = "1"
        code = _AVX512_SCRIPT.format(tests=os.path.dirname(__file__), path=path)
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        outs.append(np.load(path))
    for other in outs[1:]:
        for k in outs[0].files:
            np.testing.assert_array_equal(outs[0][k], other[k])
