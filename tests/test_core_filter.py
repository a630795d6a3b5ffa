"""Core filter: parallel vs sequential, information vs covariance form, scans, gradients, Nile."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core import scan
from kalmanscan.testing import assert_close, tolerance
from tests.helpers import covariance_filter, random_model

GRADCHECK_TOL = tolerance("gradcheck", "float64")  # gradcheck's atol and rtol
SHAPES = [(1, 3), (2, 1), (63, 5), (64, 2), (65, 1), (1000, 7), (1000, 1), (5000, 1), (3, 40000)]


def _run(z, model, prior, backend, dtype=np.float64):
    kw = {k: v.astype(dtype) for k, v in {**model, **prior}.items()}
    return ks.filter(
        z.astype(dtype),
        kw.pop("obs_var"),
        kw.pop("decay"),
        kw.pop("process_var"),
        backend=backend,
        **kw,
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("T,N", SHAPES, ids=[f"T{t}-N{n}" for t, n in SHAPES])
@pytest.mark.parametrize("diffuse", [True, False], ids=["diffuse", "prior"])
def test_parallel_matches_sequential(rng, T, N, dtype, diffuse):
    z, model, prior = random_model(rng, T, N, diffuse=diffuse)
    if dtype == np.float32:  # keep float32 models well conditioned: |decay| < 1 and some noise
        model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    par = _run(z, model, prior, "torch", dtype)
    seq = _run(z, model, prior, "sequential", dtype)
    kind = "parallel"
    for field in ("mean", "var", "precision", "info", "pred_mean", "pred_var"):
        a, b = getattr(par, field), getattr(seq, field)
        assert a.dtype == dtype and a.shape == z.shape
        assert_close(a, b, kind, np.dtype(dtype), what=field)
    assert_close(par.loglik, seq.loglik, kind, np.dtype(dtype), what="loglik")


@pytest.mark.parametrize("T,N", [(1, 2), (63, 3), (300, 2)], ids=["T1", "T63", "T300"])
@pytest.mark.parametrize("diffuse", [True, False], ids=["diffuse", "prior"])
def test_information_form_equals_covariance_form(rng, T, N, diffuse):
    z, model, prior = random_model(rng, T, N, diffuse=diffuse)
    z[0] = rng.normal(size=N)  # observed first step: every filtered variance is finite
    ref = covariance_filter(z, **model, **prior)
    res = ks.filter(z, **model, **prior)
    for field, key in [("mean", "mean"), ("var", "var"), ("pred_var", "pred_var")]:
        assert_close(getattr(res, field), ref[key], "truth", "float64", what=field)
    fin = np.isfinite(ref["pred_var"])
    assert_close(res.pred_mean[fin], ref["pred_mean"][fin], "truth", "float64", what="pred_mean")
    assert_close(res.loglik, ref["loglik"], "truth", "float64", what="loglik")
    sm = ks.smooth(z, **model, **prior)
    assert_close(sm.mean, ref["smean"], "truth", "float64", what="smoothed mean")
    assert_close(sm.var, ref["svar"], "truth", "float64", what="smoothed var")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("T", [1, 2, 63, 1000, 5000])
def test_smoother_parallel_matches_sequential(rng, T, dtype):
    z, model, prior = random_model(rng, T, 2, diffuse=True)
    model["decay"] = np.clip(model["decay"], -0.98, 0.98)
    kw = {k: v.astype(dtype) for k, v in {**model, **prior}.items()}
    a = ks.smooth(z.astype(dtype), backend="torch", **kw)
    b = ks.smooth(z.astype(dtype), backend="sequential", **kw)
    assert_close(a.mean, b.mean, "parallel", np.dtype(dtype), what="smoothed mean")
    assert_close(a.var, b.var, "parallel", np.dtype(dtype), what="smoothed var")


def _random_mobius(rng, n):
    m = rng.uniform(0, 2, (4, n))
    return tuple(torch.tensor(x) for x in m)


def test_mobius_combine_is_associative_with_identity(rng):
    x, y, w = (_random_mobius(rng, 50) for _ in range(3))
    left = scan.mobius_compose(scan.mobius_compose(w, y), x)
    right = scan.mobius_compose(w, scan.mobius_compose(y, x))
    lam = torch.tensor(rng.uniform(0, 5, 50))

    def apply(m, v):
        return (m[0] * v + m[1]) / (m[2] * v + m[3])

    tol = tolerance("rounding", "float64")
    assert torch.allclose(apply(left, lam), apply(right, lam), rtol=tol, atol=0)
    assert torch.allclose(apply(left, lam), apply(w, apply(y, apply(x, lam))), rtol=tol, atol=0)
    one, zero = torch.ones(50, dtype=torch.float64), torch.zeros(50, dtype=torch.float64)
    ident, tight = (one, zero, zero, one), tolerance("closed_form", "float64")
    for m in (scan.mobius_compose(ident, x), scan.mobius_compose(x, ident)):
        assert torch.allclose(apply(m, lam), apply(x, lam), rtol=tight, atol=0)


def test_affine_combine_is_associative_with_identity(rng):
    f = [tuple(torch.tensor(rng.normal(size=20)) for _ in range(2)) for _ in range(3)]
    x, y, w = f
    left = scan.affine_compose(scan.affine_compose(w, y), x)
    right = scan.affine_compose(w, scan.affine_compose(y, x))
    tol = tolerance("rounding", "float64")  # atol (1e-15): for entries that cancel to ~0
    for u, v in zip(left, right, strict=False):
        assert torch.allclose(u, v, rtol=tol, atol=tol * 1e-2)
    ident = (torch.ones(20, dtype=torch.float64), torch.zeros(20, dtype=torch.float64))
    for m in (scan.affine_compose(ident, x), scan.affine_compose(x, ident)):
        assert all(torch.equal(u, v) for u, v in zip(m, x, strict=False))


@pytest.mark.parametrize("T,N", [(1000, 1), (5000, 3), (70, 600)])
def test_scans_match_loops(rng, T, N):
    """Chunked scans (with recursion over chunk totals) equal the plain recursions."""
    assert scan.num_chunks(T, N) > 1
    A, B, C, D = (torch.tensor(rng.uniform(0.1, 2, (T, N))) for _ in range(4))
    lam0 = torch.tensor(rng.uniform(0, 2, N))
    lam, ref = scan.mobius_scan(A, B, C, D, lam0), []
    v = lam0
    for t in range(T):
        v = (A[t] * v + B[t]) / (C[t] * v + D[t])
        ref.append(v)
    assert_close(lam, torch.stack(ref), "rounding", "float64", what="mobius_scan")
    al, b = torch.tensor(rng.uniform(-1, 1, (T, N))), torch.tensor(rng.normal(size=(T, N)))
    x, ref = scan.affine_scan(al, b, lam0), []
    v = lam0
    for t in range(T):
        v = al[t] * v + b[t]
        ref.append(v)
    assert_close(x, torch.stack(ref), "parallel", "float64", what="affine_scan")


@pytest.mark.parametrize(
    "T", [5, pytest.param(48, marks=pytest.mark.slow)], ids=["T5", "T48-chunked"]
)
def test_gradcheck_parallel(rng, T):
    z, model, prior = random_model(rng, T, 1, missing=0.2)
    model["decay"] = np.clip(model["decay"], 0.3, 0.95)
    prior["prior_var"] = np.array([2.0])
    t = {k: torch.tensor(v, requires_grad=True) for k, v in {**model, **prior}.items()}
    zt = torch.tensor(z, requires_grad=True)
    names = list(t)

    def f(zz, *args):
        kw = dict(zip(names, args, strict=False))
        r = ks.smooth(
            zz, kw.pop("obs_var"), kw.pop("decay"), kw.pop("process_var"), backend="torch", **kw
        )
        fr = r.filtered
        return fr.loglik, fr.mean, fr.var, r.mean, r.var, fr.pred_mean

    if T > 32:
        assert scan.num_chunks(T, 1) > 1
    # missing z entries carry no gradient; gradcheck perturbs only observed ones meaningfully
    torch.autograd.gradcheck(f, (zt, *t.values()), eps=1e-6, atol=GRADCHECK_TOL, rtol=GRADCHECK_TOL)


def test_gradcheck_recursive_chunks(rng):
    """Gradients through two levels of chunking (chunk totals scanned by the chunked scan)."""
    T = 700
    z, model, _ = random_model(rng, T, 1, missing=0.1, time_varying=False)
    assert scan.num_chunks(T, 1) > 2 * scan._MIN_CHUNK  # the chunk totals are chunked again
    zt = torch.tensor(z[:, 0])
    decay = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    pv = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)

    def f(zz, a, p):
        r = ks.smooth(zz, 0.5, a, p, prior_var=1.0, backend="torch")
        return r.filtered.loglik, r.mean.sum(), r.var.sum()

    torch.autograd.gradcheck(f, (zt, decay, pv), eps=1e-6, atol=GRADCHECK_TOL, rtol=GRADCHECK_TOL)


def _nile():
    d = np.loadtxt(
        Path(ks.__file__).parent / "data" / "nile.csv", delimiter=",", comments="#", skiprows=4
    )
    return d[:, 0], d[:, 1]


# Exact-diffuse local level at (15099, 1469.1), statsmodels 0.15 use_exact_diffuse=True
# (/work background survey; identical to filterpy started from a_1|1 = y_1, P_1|1 = obs_var).
NILE_STATES = {  # year: filtered mean, filtered var, smoothed mean, smoothed var
    1871: (1120.0000, 15099.0000, 1111.6683, 4032.1579),
    1872: (1140.9278, 7899.7364, 1110.8577, 3242.9301),
    1898: (1133.1263, 4032.1582, 999.5852, 2326.7570),
    1899: (1037.2223, 4032.1581, 950.9301, 2326.7569),
    1970: (798.3703, 4032.1579, 798.3703, 4032.1579),
}


def test_nile_local_level_published_figures():
    years, flow = _nile()
    assert len(flow) == 100 and years[0] == 1871 and years[-1] == 1970
    sm = ks.smooth(flow, obs_var=15099.0, decay=1.0, process_var=1469.1)
    fr = sm.filtered
    assert abs(fr.loglik - (-632.545625)) < 1e-5  # KFAS / exact-diffuse recomputation
    for year, expected in NILE_STATES.items():
        i = int(year - 1871)
        got = (fr.mean[i], fr.var[i], sm.mean[i], sm.var[i])
        for g, e in zip(got, expected, strict=False):  # table quoted to 4 decimals
            assert abs(g - e) <= 1.5e-4, (year, got, expected)
    # one-step forecast for 1971: 798.3703, s.e. 143.5279
    a1 = ks.filter(np.append(flow, np.nan), 15099.0, 1.0, 1469.1)
    assert abs(a1.pred_mean[-1] - 798.3703) < 1e-3
    assert abs(math.sqrt(a1.pred_var[-1] + 15099.0) - 143.5279) < 1e-3


def test_nile_matches_statsmodels_exact_diffuse():
    sm_api = pytest.importorskip("statsmodels.api")
    _, flow = _nile()
    mod = sm_api.tsa.UnobservedComponents(flow, level="llevel", use_exact_diffuse=True)
    res = mod.smooth([15099.0, 1469.1])
    sm = ks.smooth(flow, obs_var=15099.0, decay=1.0, process_var=1469.1)
    # statsmodels' exact-diffuse llf also counts -0.5 log(2 pi) for the diffuse first step
    # (its diffuse predictive density), which kalmanscan's convention leaves out.
    assert_close(sm.filtered.loglik - 0.5 * math.log(2 * math.pi), res.llf, "truth", "float64")
    assert_close(sm.filtered.mean, res.filtered_state[0], "truth", "float64", what="filtered level")
    assert_close(sm.mean, res.smoothed_state[0], "truth", "float64", what="smoothed level")
    assert_close(sm.var, res.smoothed_state_cov[0, 0], "truth", "float64", what="smoothed var")
