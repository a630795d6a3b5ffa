"""Dense filter and smoother: scan vs sequential reference, truths, dispatch, gradients."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.testing import TOLERANCES, assert_close, rel_error


def random_model(seed, n, d, T, *, B=None, tv=False, prior="cov", missing=0.1, singular_q=False):
    rng = np.random.default_rng(seed)
    lead = ((T,) if tv else ()) + ((1,) if (tv and B) else ())

    def spd(k, size, jitter):
        G = rng.normal(size=size + (k, k))
        return G @ np.swapaxes(G, -1, -2) / k + jitter * np.eye(k)

    F = rng.normal(size=lead + (n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max(-1)[..., None, None]
    Q = spd(n, lead, 0.1)
    if singular_q and n > 1:
        Q[..., 0, :] = 0.0
        Q[..., :, 0] = 0.0
    H = rng.normal(size=lead + (d, n))
    R = spd(d, lead, 0.3)
    c = 0.2 * rng.normal(size=lead + (n,))
    z = rng.normal(size=(T,) + ((B,) if B else ()) + (d,))
    z[rng.random(z.shape) < missing] = np.nan
    if T > 5:
        z[5] = np.nan  # one whole vector missing
    kw = dict(offset=c, prior_mean=rng.normal(size=n))
    if prior == "cov":
        kw["prior_cov"] = spd(n, (), 0.5)
    elif prior == "partial":
        G = rng.normal(size=(n, n - 1))
        kw["prior_precision"] = G @ G.T
    elif prior == "inf-diag":
        P = spd(n, (), 0.5)
        P[0, :] = P[:, 0] = 0.0
        P[0, 0] = np.inf
        kw["prior_cov"] = P
    return (z, F, Q, H, R), kw


def _dense_checks():
    from kalmanscan.validation import dense_checks

    return dense_checks


CASES = [
    # id, n, d, T, B, time-varying, prior
    ("n1-d1-T1-cov", 1, 1, 1, None, False, "cov"),
    ("n2-d1-T63-diffuse", 2, 1, 63, None, False, "diffuse"),
    ("n3-d2-T63-B3-tv-partial", 3, 2, 63, 3, True, "partial"),
    ("n4-d4-T100-B2-tv-infdiag", 4, 4, 100, 2, True, "inf-diag"),
    ("n8-d3-T1000-cov", 8, 3, 1000, None, False, "cov"),
    ("n5-d2-T200-diffuse", 5, 2, 200, None, False, "diffuse"),
]


def _both(args, kw, **extra):
    a = kd.smooth(*args, backend="torch", **kw, **extra)
    b = kd.smooth(*args, backend="sequential", **kw, **extra)
    return a, b


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_parallel_matches_sequential_f64(case):
    name, n, d, T, B, tv, prior = case
    args, kw = random_model(zlib.crc32(name.encode()) % 1000, n, d, T, B=B, tv=tv, prior=prior)
    a, b = _both(args, kw)
    fa, fb = a.filtered, b.filtered
    for what in ("mean", "cov", "precision", "pred_mean", "pred_cov"):
        assert_close(
            getattr(fa, what), getattr(fb, what), "parallel", "float64", what=f"filtered {what}"
        )
    assert_close(fa.loglik, fb.loglik, "parallel", "float64", what="loglik")
    np.testing.assert_array_equal(fa.diffuse, fb.diffuse)
    assert_close(a.mean, b.mean, "parallel", "float64", what="smoothed mean")
    assert_close(a.cov, b.cov, "parallel", "float64", what="smoothed cov")
    if prior == "diffuse" and n > d:
        assert fa.diffuse[0].any()  # the first step is still diffuse in some direction
        assert np.isinf(fa.cov[0]).any()
        assert np.isfinite(a.cov).all()


F32_CASES = CASES[1:4] + CASES[5:]


@pytest.mark.parametrize("case", F32_CASES, ids=[c[0] + "-f32" for c in F32_CASES])
def test_float32_against_float64_reference(case):
    name, n, d, T, B, tv, prior = case
    args, kw = random_model(zlib.crc32(name.encode()) % 1000, n, d, T, B=B, tv=tv, prior=prior)
    b = kd.smooth(*args, backend="sequential", **kw)
    args32 = [torch.as_tensor(x, dtype=torch.float32) for x in args]
    kw32 = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in kw.items()}
    a = kd.smooth(*args32, backend="torch", **kw32)
    assert a.mean.dtype == torch.float32
    fin = ~b.filtered.diffuse
    assert_close(
        a.filtered.mean.numpy()[fin], b.filtered.mean[fin], "truth", "float32", what="filtered mean"
    )
    assert_close(
        a.filtered.cov.numpy()[fin], b.filtered.cov[fin], "truth", "float32", what="filtered cov"
    )
    assert_close(a.mean, b.mean, "truth", "float32", what="smoothed mean")
    assert_close(a.cov, b.cov, "truth", "float32", what="smoothed cov")
    assert abs(float(a.filtered.loglik.sum()) - float(b.filtered.loglik.sum())) <= 2e-3 * max(
        1.0, abs(float(b.filtered.loglik.sum()))
    )


@pytest.mark.parametrize("chunk", [2, 7, 64])
def test_chunk_length_does_not_change_the_result(chunk):
    args, kw = random_model(3, 3, 2, 300, prior="diffuse")
    ref = kd.smooth(*args, chunk=32, backend="torch", **kw)
    out = kd.smooth(*args, chunk=chunk, backend="torch", **kw)
    assert_close(out.mean, ref.mean, "parallel", "float64")
    assert_close(out.cov, ref.cov, "parallel", "float64")
    assert_close(out.filtered.loglik, ref.filtered.loglik, "parallel", "float64")


def test_singular_process_noise_and_offsets():
    args, kw = random_model(11, 3, 1, 80, prior="cov", singular_q=True)
    a, b = _both(args, kw)
    assert_close(a.filtered.mean, b.filtered.mean, "parallel", "float64")
    assert_close(a.filtered.loglik, b.filtered.loglik, "parallel", "float64")
    assert_close(a.mean, b.mean, "parallel", "float64")


def test_against_filterpy_1e9():
    KalmanFilter = pytest.importorskip("filterpy.kalman").KalmanFilter

    rng = np.random.default_rng(0)
    n, d, T = 4, 2, 300
    (z, F, Q, H, R), kw = random_model(1, n, d, T, prior="cov", missing=0.0)
    z[rng.random(T) < 0.1] = np.nan  # whole vectors
    kf = KalmanFilter(dim_x=n, dim_z=d)
    kf.x, kf.P = kw["prior_mean"].copy(), kw["prior_cov"].copy()
    zs = [None if np.isnan(v).any() else v for v in z]
    mu, cov, _, _ = kf.batch_filter(zs, Fs=[F] * T, Qs=[Q] * T, Hs=[H] * T, Rs=[R] * T)
    sm, sP, _, _ = kf.rts_smoother(mu, cov, Fs=[F] * T, Qs=[Q] * T)
    res = kd.smooth(
        z, F, Q, H, R, prior_mean=kw["prior_mean"], prior_cov=kw["prior_cov"], backend="torch"
    )
    assert rel_error(res.filtered.mean, mu) < 1e-9
    assert rel_error(res.filtered.cov, cov) < 1e-9
    assert rel_error(res.mean, sm) < 1e-9
    assert rel_error(res.cov, sP) < 1e-9


def test_dense_oracle_diffuse_loglik():
    dc = _dense_checks()
    rng = np.random.default_rng(4)
    for prior in ("diffuse", "partial"):
        m = dc.random_model(rng, 3, 2, 10, tv=True, prior=prior, missing=0.2, partial=True)
        o = dc.dense_oracle(m)
        kw = {k: v for k, v in m.items() if k not in ("z", "F", "Q", "H", "R")}
        res = kd.smooth(m["z"], m["F"], m["Q"], m["H"], m["R"], backend="torch", **kw)
        assert abs(float(res.filtered.loglik) - o["loglik"]) < 1e-9 * abs(o["loglik"])
        assert rel_error(res.mean, o["smooth_mean"]) < 1e-9


def test_statsmodels_local_linear_trend_on_gdp():
    dc = _dense_checks()
    params = (0.5, 0.3, 0.01)
    y, p, res = dc.statsmodels_llt(params)
    m = kd.local_linear_trend(level_var=p[1], slope_var=p[2], obs_var=p[0])
    out = kd.smooth(y[:, None], **m._asdict())
    # statsmodels reports Durbin & Koopman's value; ours adds 1/2 sum log det(2 pi F_inf),
    # which is log(2 pi) here
    assert abs(float(out.filtered.loglik) - np.log(2 * np.pi) - res.llf) < 1e-9 * abs(res.llf)
    assert rel_error(out.mean, np.asarray(res.smoothed_state).T) < 1e-9
    assert rel_error(out.cov, np.moveaxis(res.smoothed_state_cov, -1, 0)) < 1e-9


@pytest.mark.parametrize("prior", ["cov", "diffuse"])
def test_diagonal_model_dispatches_and_agrees(prior):
    rng = np.random.default_rng(7)
    n, T = 3, 120
    F = np.diag(rng.uniform(0.5, 1.0, n))
    Q = np.diag(rng.uniform(0.1, 1.0, n))
    H = np.diag(rng.uniform(0.5, 2.0, n))
    R = np.diag(rng.uniform(0.2, 1.0, n))
    z = rng.normal(size=(T, n))
    z[rng.random(z.shape) < 0.2] = np.nan
    kw = dict(prior_mean=rng.normal(size=n))
    if prior == "cov":
        kw["prior_cov"] = np.diag(rng.uniform(0.5, 2.0, n))
    auto = kd.smooth(z, F, Q, H, R, **kw)
    diag = kd.smooth(z, F, Q, H, R, backend="diagonal", **kw)
    dense = kd.smooth(z, F, Q, H, R, backend="torch", **kw)
    assert_close(auto.filtered.loglik, diag.filtered.loglik, "parallel", "float64")
    ok = ~dense.filtered.diffuse
    np.testing.assert_array_equal(diag.filtered.diffuse, dense.filtered.diffuse)
    assert_close(
        diag.filtered.mean[ok], dense.filtered.mean[ok], "parallel", "float64", what="filtered mean"
    )
    assert_close(
        diag.filtered.cov[ok], dense.filtered.cov[ok], "parallel", "float64", what="filtered cov"
    )
    assert_close(diag.filtered.loglik, dense.filtered.loglik, "parallel", "float64", what="loglik")
    assert_close(diag.mean, dense.mean, "parallel", "float64", what="smoothed mean")
    assert_close(diag.cov, dense.cov, "parallel", "float64", what="smoothed cov")
    with pytest.raises(ValueError, match="diagonal"):
        kd.filter(z, F + 0.1, Q, H, R, backend="diagonal")


def test_gradients_match_the_reference_and_gradcheck():
    args, kw = random_model(5, 2, 1, 40, prior="diffuse")
    z, F, Q, H, R = (torch.as_tensor(x) for x in args)
    kwt = {k: torch.as_tensor(v) for k, v in kw.items()}

    def loss(backend, F, Q, R):
        res = kd.smooth(z, F, Q, H, R, backend=backend, **kwt)
        return (
            res.filtered.loglik
            + res.mean.square().sum() * 1e-2
            + res.cov.diagonal(dim1=-2, dim2=-1).sum() * 1e-2
        )

    params = [t.clone().requires_grad_(True) for t in (F, Q, R)]
    ga = torch.autograd.grad(loss("torch", *params), params)
    gb = torch.autograd.grad(loss("sequential", *params), params)
    sym = lambda g: 0.5 * (g + g.transpose(-1, -2))  # noqa: E731  (Q, R enter only symmetrically)
    for x, y, what in zip(ga, gb, ("F", "Q", "R"), strict=True):
        x, y = (x, y) if what == "F" else (sym(x), sym(y))
        assert_close(x, y, "kernel_grad", "float64", what=f"d loss / d {what}")
    assert torch.autograd.gradcheck(
        lambda F, Q, R: loss("torch", F, 0.5 * (Q + Q.T), 0.5 * (R + R.T)),
        params,
        atol=1e-6,
        rtol=1e-5,
    )


def test_layout_axis_batch_and_io_types():
    args, kw = random_model(9, 2, 1, 50, B=3, tv=False, prior="cov")
    z = args[0]  # [T, B, d]
    a = kd.filter(z, *args[1:], backend="torch", **kw)
    b = kd.filter(np.swapaxes(z, 0, 1), *args[1:], axis=1, backend="torch", **kw)
    assert (
        isinstance(a.mean, np.ndarray)
        and a.mean.shape == (50, 3, 2)
        and a.cov.shape == (50, 3, 2, 2)
    )
    assert a.loglik.shape == (3,)
    np.testing.assert_allclose(np.swapaxes(b.mean, 0, 1), a.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.loglik, a.loglik, rtol=1e-12)
    one = kd.filter(z[:, 1], *args[1:], backend="torch", **kw)
    np.testing.assert_allclose(one.mean, a.mean[:, 1], rtol=1e-12, atol=1e-12)
    t = kd.filter(torch.as_tensor(z), *args[1:], backend="torch", **kw)
    assert isinstance(t.mean, torch.Tensor) and t.mean.dtype == torch.float64


def test_all_missing_and_never_resolved_directions():
    n, T = 2, 20
    F, Q = np.eye(n), 0.1 * np.eye(n)
    H, R = np.array([[1.0, 0.0]]), np.eye(1)  # the second state is never observed
    z = np.random.default_rng(0).normal(size=(T, 1))
    z[:3] = np.nan
    res = kd.smooth(z, F, Q, H, R, backend="torch")
    ref = kd.smooth(z, F, Q, H, R, backend="sequential")
    assert res.filtered.diffuse.all() and ref.filtered.diffuse.all()
    assert np.isinf(res.cov[:, 1, 1]).all() and np.isfinite(res.cov[:, 0, 0]).all()
    assert_close(res.filtered.loglik, ref.filtered.loglik, "parallel", "float64")
    assert_close(res.filtered.mean[:, 0], ref.filtered.mean[:, 0], "parallel", "float64")
    assert res.filtered.precision[:, 1, 1].max() == 0.0  # no information about the unobserved state


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(F=np.ones((2, 3))), "F"),
        (dict(H=np.ones((2, 2))), "H"),
        (dict(R=-np.eye(1)), "R"),
        (dict(Q=np.array([[1.0, 0.5], [0.0, 1.0]])), "Q"),
        (dict(axis=1), "axis"),
        (dict(prior_cov=np.eye(2), prior_precision=np.eye(2)), "prior_cov, prior_precision"),
        (dict(backend="cuda"), "backend"),
        (dict(chunk=1), "chunk"),
        (
            dict(prior_cov=np.array([[np.inf, 0.0], [0.0, 0.0]]), prior_mean=[0.0, np.nan]),
            "prior_mean",
        ),
    ],
    ids=[
        "F-shape",
        "H-shape",
        "R-not-pd",
        "Q-asym",
        "axis-last",
        "two-priors",
        "backend",
        "chunk-1",
        "prior-mean-nan",
    ],
)
def test_bad_arguments_name_the_argument(bad, match):
    m = kd.local_linear_trend(1.0, 0.1, 1.0)._asdict()
    m.pop("offset")
    kw = {**m, **bad}
    with pytest.raises(ValueError, match=match):
        kd.filter(np.zeros((5, 1)), **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_cuda_matches_cpu():
    args, kw = random_model(2, 4, 2, 500, B=2, prior="diffuse")
    cpu = kd.smooth(*args, backend="torch", **kw)
    g = kd.smooth(
        *(torch.as_tensor(x, device="cuda") for x in args),
        backend="torch",
        **{k: torch.as_tensor(v, device="cuda") for k, v in kw.items()},
    )
    assert_close(g.mean.cpu(), cpu.mean, "parallel", "float64")
    assert_close(g.filtered.loglik.cpu(), cpu.filtered.loglik, "parallel", "float64")


def test_float32_diffuse_resolution_on_a_long_time_varying_series():
    # Over the whole series the weakest direction of x_0 is informed at ~1e-5 of the strongest,
    # below float32 resolution; the head of the series resolves it (docs/dense.md, float32).
    rng = np.random.default_rng(0)
    n, d, T = 4, 2, 500

    def trans():
        F = rng.normal(size=(n, n))
        return F * 0.97 / np.abs(np.linalg.eigvals(F)).max()

    G = rng.normal(size=(n, n))
    Q, H, R = G @ G.T / n + 0.1 * np.eye(n), rng.normal(size=(d, n)), np.eye(d)
    F = np.stack([trans() for _ in range(T)])
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < 0.15] = np.nan
    ref = kd.smooth(z, F, Q, H, R, backend="sequential")
    out = kd.smooth(
        *(torch.as_tensor(x, dtype=torch.float32) for x in (z, F, Q, H, R)), backend="torch"
    )
    np.testing.assert_array_equal(out.filtered.diffuse.numpy(), ref.filtered.diffuse)
    assert ref.filtered.diffuse[0] and not ref.filtered.diffuse[-1]
    ok = ~ref.filtered.diffuse
    assert_close(out.filtered.mean.numpy()[ok], ref.filtered.mean[ok], "truth", "float32")
    assert_close(out.mean, ref.mean, "truth", "float32")
    assert np.isfinite(out.cov.numpy()).all()


def _var1_prior_on_x1():
    """KFAS's VAR(1) with missing data (statsmodels' fixture), H = I, prior on the first state:
    step 0 has F = I and Q = 0, so x_1 = x_0 carries the diffuse prior as in KFAS."""
    pytest.importorskip("statsmodels")
    from kalmanscan.validation import regimes

    y = regimes.kfas_var1_data(missing=True)
    T = len(y)
    F = np.repeat(regimes.KFAS_VAR1_F[None], T, 0)
    Q = np.repeat(regimes.KFAS_VAR1_Q[None], T, 0)
    F[0], Q[0] = np.eye(2), 0.0
    return y, F, Q, np.eye(2)


def _rotated_h():
    """A full observation matrix that is not axis-aligned: the observed directions of the
    near-noise-free rows mix both states."""
    th = 0.7
    return np.array([[np.cos(th), -np.sin(th)], [2 * np.sin(th), 2 * np.cos(th)]])


# every dense backend against the mpmath oracle on KFAS's VAR(1) with the prior on x_1 (step 0
# without process noise, observed with R = r I): the regime battery's targets (1e-6 sd, 1e-8
# relative). The scan lost Q/R digits here (filtered means 1.7e-4 off at R = 1e-10, 5.2e-3 at
# 1e-12 with H = I; 0.1 sd at 1e-12 with the rotated H); now 1e-12 sd (docs/dense.md).
VAR1_R = [1e-6, 1e-10, 1e-12, 0.0]


@pytest.mark.parametrize("rotated", [False, True], ids=["H-eye", "H-rotated"])
@pytest.mark.parametrize("r", VAR1_R, ids=[f"R{r:g}" for r in VAR1_R])
@pytest.mark.parametrize("backend", ["torch", "sequential", "native"])
def test_near_noiseless_var1_prior_on_x1_against_oracle(backend, r, rotated):
    from kalmanscan.dense import native
    from kalmanscan.validation import oracle, regimes

    if backend == "native" and not native.available():
        pytest.skip("native extension not built")
    y, F, Q, H = _var1_prior_on_x1()
    H = _rotated_h() if rotated else H
    R = r * np.eye(2)
    o = oracle.dense_oracle(y, F, Q, H, R, dps=60)
    out = regimes._run_dense(regimes.DenseRegime("var1", y, F, Q, H, R), backend, "float64")
    np.testing.assert_array_equal(kd.filter(y, F, Q, H, R, backend=backend).diffuse, o.diffuse)
    errs = regimes.dense_errors(out, o)
    assert regimes.passes({**dict.fromkeys(regimes.COLUMNS, 0.0), **errs}, "float64"), errs


def test_singular_r_where_served_and_where_refused():
    """R = 0 (exact observations): the scan takes it wherever H Q H' + R is positive definite
    after the diffuse head (here all steps but the first, which the sequential head runs); the
    reference filter takes it (entries decorrelated by R = L Dg L', Dg = 0 allowed), and so does
    the reference smoother (the exact entries conditioned into the backward prediction) wherever
    H Q H' is positive definite on them; the reference smoother and the scan raise and name the
    backend that serves it where an exact observation meets a step without process noise."""
    from kalmanscan.dense import native
    from kalmanscan.validation import oracle

    y, F, Q, H = _var1_prior_on_x1()
    R = np.zeros((2, 2))
    Q2 = Q.copy()
    Q2[6] = 0.0  # step 6 is observed: x_6 exactly determined by x_5 and z_6
    with pytest.raises(ValueError, match="backend='native'"):
        kd.filter(y, F, Q2, H, R, backend="torch")
    with pytest.raises(ValueError, match="'sequential'.*backend='native'"):
        kd.smooth(y, F, Q2, H, R, backend="sequential")
    o = oracle.dense_oracle(y, F, Q, H, R, dps=60)
    nd = int(o.diffuse.sum())
    backends = ["sequential", "torch"] + (["auto"] if native.available() else [])
    for backend in backends:
        res = kd.filter(y, F, Q, H, R, backend=backend)
        np.testing.assert_array_equal(res.diffuse, o.diffuse)
        assert np.abs(res.mean[nd:] - o.mean[nd:]).max() < 1e-13 * np.abs(o.mean).max()
        cov = np.where(np.isinf(res.cov), 0.0, res.cov)
        assert np.abs(cov[nd:] - o.cov[nd:]).max() < 1e-13 * np.abs(o.cov).max()
        assert abs(res.loglik - o.loglik) < 1e-12 * abs(o.loglik)
    sm = kd.smooth(y, F, Q, H, R, backend="sequential")
    assert np.abs(sm.mean - o.smooth_mean).max() < 1e-13 * np.abs(o.smooth_mean).max()
    assert np.abs(sm.cov - o.smooth_cov).max() < 1e-13 * np.abs(o.smooth_cov).max()


def test_reference_filter_rank_one_r_matches_native():
    """A singular but nonzero R (both entries see the same noise): the reference filter and the
    native path agree (the oracle needs a positive-definite R)."""
    from kalmanscan.dense import native

    if not native.available():
        pytest.skip("native extension not built")
    y, F, Q, H = _var1_prior_on_x1()
    R = np.ones((2, 2))
    a = kd.filter(y, F, Q, H, R, backend="sequential")
    b = kd.filter(y, F, Q, H, R, backend="native")
    np.testing.assert_array_equal(a.diffuse, b.diffuse)
    assert rel_error(a.mean, b.mean) < 1e-13
    assert abs(a.loglik - b.loglik) < 1e-12 * abs(b.loglik)


@pytest.mark.slow
def test_scan_counts_diffuse_directions_of_a_contracting_model():
    """13 diffuse states seen through one scalar under a random contracting F (the native
    test's model): the last direction is 1e-8 the scale of the others when resolved. The scan
    counts resolved directions as the sequential loop does (diffuse flags = the oracle's); an
    eigenvalue threshold on the information kept 19 steps diffuse, 18.8 nats off, and with the
    prior applied at the end of the scan 0.026 nats remained. The diffuse head now runs the
    reference's exact filter: 4.9e-11 nats (relative 1e-12) on the scan and the loop."""
    from kalmanscan.validation import oracle

    rng = np.random.default_rng(len("n13-d1-T300-diffuse"))
    n, d, T = 13, 1, 300
    F = rng.normal(size=(n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n + 0.1 * np.eye(n)
    H = rng.normal(size=(d, n))
    G = rng.normal(size=(d, d))
    R = G @ G.T / d + 0.3 * np.eye(d)
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < 0.1] = np.nan
    z[5] = np.nan
    kw = dict(offset=0.2 * rng.normal(size=n), prior_mean=rng.normal(size=n))
    z = z[:40]  # the head is resolved at step 13; the oracle's cost grows with T
    o = oracle.dense_oracle(z, F, Q, H, R, dps=80, **kw)
    res = kd.filter(z, F, Q, H, R, backend="torch", **kw)
    np.testing.assert_array_equal(res.diffuse, o.diffuse)
    assert abs(res.loglik - o.loglik) <= TOLERANCES[("oracle", "float64")] * abs(o.loglik)


def test_large_proper_prior_information_head_against_oracle():
    """The 9-state structural model with a 1e6 I prior: the scan's head runs in information form
    (folded in covariance form the 1e6 prior cancelled: means 1.2e-8 sd, log-likelihood 1.5e-11
    relative); measured 3.6e-12 sd (filter), 4.7e-13 sd (smoother), 3.2e-13 relative."""
    from kalmanscan.validation import oracle, regimes

    reg = next(r for r in regimes.dense_regimes(full=True) if r.name.startswith("structural"))
    o = oracle.dense_oracle(
        reg.z, reg.F, reg.Q, reg.H, reg.R, prior_mean=reg.prior_mean, prior_cov=reg.prior_cov
    )
    errs = regimes.dense_errors(regimes._run_dense(reg, "torch", "float64"), o)
    assert errs["filter_mean_sd"] < 2e-11 and errs["smooth_mean_sd"] < 2e-11, errs
    assert errs["loglik"] < 2e-12 and errs["smooth_var"] < 1e-12, errs


@pytest.mark.parametrize("r", [1e-10, 1e-6], ids=["R1e-10", "R1e-6"])
def test_scan_smoother_weakly_informed_diffuse_head_against_oracle(r):
    """3 diffuse states seen through one entry (the regime battery's ``_mixing`` family, seed 2,
    40 % missing): at step 0 the data inform one direction 1e-9 times as much as the others, and
    the scan's information form of the head's smoothed moments kept eps |J| / lam_min of it
    (smoothed means 2.4e-6 sd off the oracle at R = 1e-10, 9.3e-7 at 1e-6). The head now
    combines with the suffix's square-root rows as the reference does (sequential.combine_rows):
    measured 1.1e-11 sd / 2.8e-12 relative at R = 1e-10 (docs/dense.md, "Left")."""
    from kalmanscan.validation import oracle, regimes

    z, F, Q, H, R, _ = regimes._mixing(2, 3, 1, r, "diffuse")
    o = oracle.dense_oracle(z, F, Q, H, R)
    errs = regimes.dense_errors(
        regimes._run_dense(regimes.DenseRegime("mixing", z, F, Q, H, R), "torch", "float64"), o
    )
    assert errs["smooth_mean_sd"] < 1e-8 and errs["smooth_var"] < 1e-9, errs
    assert errs["filter_mean_sd"] < 1e-9 and errs["loglik"] < 1e-12, errs
