"""The fused Triton dense filter and smoother (kalmanscan/cuda/dense.py) against the float64
sequential reference of kalmanscan.dense: every output, awkward lengths (1, 63, several chunks),
n = 2, 3 (padded), 4, 8, d = 1 and d > 1 (diagonal R; a full R whitened), missing data, float32
and float64. Without CUDA the kernels run under TRITON_INTERPRET=1 at small sizes; outputs are
NaN-poisoned (tests/conftest.py) so an unwritten element fails. Tests of ``kd.filter`` /
``kd.smooth`` check which backend ran (a spy on :func:`run` / :func:`run_smooth`).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

import kalmanscan.dense as kd  # noqa: E402
from kalmanscan.cuda import dense as CD  # noqa: E402
from kalmanscan.dense import _args  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from tests.helpers import triton_interpreted  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
OUTPUTS = ("mean", "cov", "precision", "pred_mean", "pred_cov")


@pytest.fixture(autouse=True)
def interpreted():
    assert CUDA or triton_interpreted(CD.chunk_filter), "the kernels must run interpreted on CPU"


def random_model(seed, n, d, T, *, missing=0.1, full_r=False):
    rng = np.random.default_rng(seed)

    def spd(k, jitter):
        G = rng.normal(size=(k, k))
        return G @ G.T / k + jitter * np.eye(k)

    F = rng.normal(size=(n, n))
    F *= 0.95 / np.abs(np.linalg.eigvals(F)).max()
    R = spd(d, 0.3) if full_r else np.diag(rng.uniform(0.3, 2.0, size=d))
    z = rng.normal(size=(T, d))
    z[rng.random(z.shape) < missing] = np.nan
    if T > 5:
        z[5] = np.nan  # one whole vector missing
    kw = dict(
        F=F,
        Q=spd(n, 0.1),
        H=rng.normal(size=(d, n)),
        R=R,
        offset=0.2 * rng.normal(size=n),
        prior_mean=rng.normal(size=n),
        prior_cov=spd(n, 0.5),
    )
    return z, kw


def laid_out(z, kw, dtype):
    t = {k: torch.as_tensor(v, dtype=dtype, device=DEVICE) for k, v in kw.items()}
    zt = torch.as_tensor(z, dtype=dtype, device=DEVICE)
    return _args.prepare(
        zt, t["F"], t["Q"], t["H"], t["R"], t["offset"], t["prior_mean"], t["prior_cov"],
        None, 0, mask=False,
    )  # fmt: skip


def check(z, kw, dtype):
    ref = kd.filter(
        torch.as_tensor(z, dtype=torch.float64),
        **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in kw.items()},
        backend="sequential",
    )
    model, layout = laid_out(z, kw, dtype)
    got = CD.dense_triton(model, layout, False, 32)
    # a chunked reformulation of the reference: the scan's float64 tolerance; float32 against the
    # float64 truth (entrywise errors; normwise they are a few ulp)
    kind = "parallel" if dtype == torch.float64 else "truth"
    for name in OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), kind, dtype, what=name)
    assert_close(got.loglik.cpu(), ref.loglik, kind, dtype, what="loglik")
    assert not bool(got.diffuse.any())
    return got


CASES = [
    # id, n, d, T, full R
    ("n2-d1-T1", 2, 1, 1, False),
    ("n2-d1-T63", 2, 1, 63, False),  # interpreted: 4 chunks, one-level carry
    ("n3-d2-T40", 3, 2, 40, False),
    ("n4-d1-T130", 4, 1, 130, False),  # interpreted: 9 chunks of 16, 3 groups (two-level carry)
    ("n8-d1-T70", 8, 1, 70, False),  # interpreted: 5 chunks of 16, 2 groups (two-level carry)
    ("n3-d2-T6-fullR", 3, 2, 6, True),  # interpreted: 3 chunks (2, 2, 2)
]
# the paths of n2-d1-T63 and n3-d2-T40 at a ninth and a sixth of the steps (the interpreter's
# cost is about linear in T): 4 chunks of 2, the last 1 (one-level carry, the most chunks it
# takes); a padded state, the same chunks, a vector missing whole and one missing in part
# (n8-d1-T70's two-level carry: test_filter_chunk_counts)
SMALL_CASES = [("n2-d1-T7", 2, 1, 7, False), ("n3-d2-T7", 3, 2, 7, False)]
# interpreted: (chunks, steps of the last chunk) of the cases past one step
CHUNKS = {7: (4, 1), 63: (4, 15), 40: (3, 8), 130: (9, 2), 70: (5, 6), 6: (3, 2)}

# interpreted, 2.3 to 7 s a dtype: in the slow step (CI's second) there, their paths by default
# in SMALL_CASES and test_filter_chunk_counts
SLOW_INTERPRETED = () if CUDA else ("n2-d1-T63", "n3-d2-T40", "n4-d1-T130", "n8-d1-T70")


def _assert_layout(z, d, full_r, chunks):
    """Without CUDA, the interpreted kernel's chunk plan (``chunks[T]``: chunks, steps in the
    last; ``None``: not checked); past step 5 a whole vector missing, and with ``d = 2`` and a
    diagonal ``R`` one missing in part too."""
    T = z.shape[0]
    if not CUDA and chunks is not None:
        L = CD.chunk_length(T)
        assert (CD.cdiv(T, L), T - L * (CD.cdiv(T, L) - 1)) == chunks[T]
    if T > 5:
        missing = np.isnan(z)
        assert missing[5].all()
        assert full_r or d == 1 or bool((missing.any(1) & ~missing.all(1)).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    ("n", "d", "T", "full_r"),
    [
        pytest.param(*c[1:], id=c[0], marks=pytest.mark.slow if c[0] in SLOW_INTERPRETED else ())
        for c in CASES + SMALL_CASES
    ],
)
def test_matches_sequential(n, d, T, full_r, dtype):
    z, kw = random_model(100 * n + T, n, d, T, missing=0.0 if full_r else 0.1)
    _assert_layout(z, d, full_r, CHUNKS if T > 1 else None)  # (several chunks: their carries)
    check(z, kw, dtype)


def test_filter_chunk_counts(monkeypatch):
    # the filter's two-level carry (n8-d1-T70's path interpreted, at a seventh of its steps):
    # chunks of 2 steps over T = 9, 5 chunks in groups of 4 (4, 1), the last chunk 1 step; the
    # padless n = 8 tiles (NP = 8) in every kernel
    T, L = 9, 2
    monkeypatch.setattr(CD, "chunk_length", lambda T: L)
    # the interpreter's one-level limit (4 chunks) on the GPU too
    monkeypatch.setitem(CD.TUNING, "one_level", 4)
    nc = CD.cdiv(T, L)
    assert (nc, CD.group_size(nc)) == (5, 4)
    z, kw = random_model(100 * 8 + 70, 8, 1, T)
    check(z, kw, torch.float64)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n", [2, 4, 8], ids=["n2", "n4", "n8"])
def test_matches_sequential_long(n, dtype):
    z, kw = random_model(7 + n, n, 1, 1000)
    check(z, kw, dtype)


@pytest.mark.slow
def test_several_chunks():
    # more than two groups of chunks in the two-level carry (on a GPU: 100 chunks of 32 steps
    # in groups of 16; interpreted: 75 chunks of 4 in groups of 16)
    T = 3200 if CUDA else 300
    z, kw = random_model(3, 2, 1, T)
    nc = CD.cdiv(T, CD.chunk_length(T))
    assert CD.cdiv(nc, CD.group_size(nc)) > 2
    check(z, kw, torch.float64)


@pytest.mark.parametrize("smooth", [False, True], ids=["filter", "smooth"])
@pytest.mark.parametrize(
    ("what", "expect"),
    [
        ("diffuse", "proper prior"),
        ("n9", "n <= 8"),
        ("time-varying", "time-varying F"),
        ("grad", "do not require grad"),
    ],
    ids=["diffuse", "n9", "time-varying", "grad"],
)
def test_unsupported_raises(what, expect, smooth):
    n = 9 if what == "n9" else 2
    z, kw = random_model(1, n, 1, 4)
    if what == "diffuse":
        kw["prior_cov"] = np.diag([np.inf] * n)
    if what == "time-varying":
        kw["F"] = np.stack([kw["F"], 0.5 * kw["F"], kw["F"], kw["F"]])
    model, layout = laid_out(z, kw, torch.float64)
    if what == "grad":
        model = model._replace(F=model.F.detach().requires_grad_(True))
    with pytest.raises(ValueError, match=f"'triton'.*{expect}.*backend='torch'"):
        CD.dense_triton(model, layout, smooth, 32)


@pytest.mark.parametrize("smooth", [False, True], ids=["filter", "smooth"])
def test_inf_observation_raises(smooth):
    # interpreted: 2 chunks of 2 steps, the inf in the second (4 chunks over 8 steps before)
    z, kw = random_model(2, 2, 1, 4)
    assert CUDA or CD.cdiv(4, CD.chunk_length(4)) == 2
    z[3] = np.inf
    model, layout = laid_out(z, kw, torch.float64)
    with pytest.raises(ValueError, match="inf"):
        CD.dense_triton(model, layout, smooth, 32)


@pytest.mark.parametrize("smooth", [False, True], ids=["filter", "smooth"])
def test_full_r_with_missing_raises(smooth):
    z, kw = random_model(2, 2, 2, 8, full_r=True)
    model, layout = laid_out(z, kw, torch.float64)
    with pytest.raises(ValueError, match="diagonal R.*backend='torch'"):
        CD.dense_triton(model, layout, smooth, 32)


@pytest.mark.parametrize("fn", ["filter", "smooth"])
def test_explicit_triton_off_cuda_raises(fn):
    if CUDA:
        pytest.skip("needs CPU tensors")
    z, kw = random_model(2, 2, 1, 8)
    with pytest.raises(ValueError, match="'triton' runs on CUDA"):
        getattr(kd, fn)(z, **kw, backend="triton")


def test_carry_levels():
    # one level up to the interpreter's 4 chunks or TUNING["one_level"] on a GPU; beyond, groups
    # of g chunks, a power of 2 with (g / 2)^2 < NC <= g^2
    one = CD.TUNING["one_level"] if CUDA else 4
    assert all(CD.group_size(nc) == nc for nc in range(1, one + 1))
    for nc in (one + 1, 2 * one + 3, one * one, one * one + 1, 4096):
        g = CD.group_size(nc)
        assert g & (g - 1) == 0 and (g // 2) ** 2 < nc <= g * g, (nc, g)


@pytest.fixture
def ran(monkeypatch):
    calls = []
    real = CD.run

    def spy(model, layout, *rest):
        calls.append(layout.n)
        return real(model, layout, *rest)

    monkeypatch.setattr(CD, "run", spy)
    return calls


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("n", [2, 4, 8], ids=["n2", "n4", "n8"])
def test_gpu_public_auto(ran, n):
    z, kw = random_model(11 + n, n, 1, 1500)  # 47 chunks of 32 in groups of 8
    ref = kd.filter(z, **kw, backend="sequential")
    t = {k: torch.as_tensor(v, dtype=torch.float32, device="cuda") for k, v in kw.items()}
    got = kd.filter(torch.as_tensor(z, dtype=torch.float32, device="cuda"), **t)
    assert ran == [n], "kd.filter(auto) on CUDA must run the triton backend"
    for name in OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), "truth", "float32", what=name)
    assert_close(got.loglik.cpu(), ref.loglik, "truth", "float32", what="loglik")


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_auto_diffuse_takes_torch(ran):
    z, kw = random_model(5, 2, 1, 300)
    kw["prior_cov"] = np.diag([np.inf, np.inf])
    t = {k: torch.as_tensor(v, device="cuda") for k, v in kw.items()}
    got = kd.filter(torch.as_tensor(z, device="cuda"), **t)
    # the screen read after the fused launches finds the inf: the torch scan answers
    res = got
    assert bool(res.diffuse[0].all()), "a diffuse prior is outside the triton model class"
    ref = kd.filter(z, **kw, backend="sequential")
    assert_close(got.mean.cpu()[10:], ref.mean[10:], "parallel", "float64", what="mean")
    with pytest.raises(ValueError, match="proper prior"):
        kd.filter(torch.as_tensor(z, device="cuda"), **t, backend="triton")


# --- the smoother (kd.smooth's "triton" backend: the filter with carries, then chunk_smooth) ---

SMOOTH_OUTPUTS = ("mean", "cov", "precision")
F32_NORMWISE = 1e-5  # float32 smoothed means and covariances, normwise against float64


def normwise(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def check_smooth(z, kw, dtype, ref=None):
    """``ref``: the sequential float64 smoother's result on ``z, kw`` where the caller has it."""
    if ref is None:
        ref = kd.smooth(
            torch.as_tensor(z, dtype=torch.float64),
            **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in kw.items()},
            backend="sequential",
        )
    model, layout = laid_out(z, kw, dtype)
    got = CD.dense_triton(model, layout, True, 32)
    assert isinstance(got, kd.DenseSmoothResult)
    kind = "parallel" if dtype == torch.float64 else "truth"
    for name in SMOOTH_OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), kind, dtype, what=name)
    for name in OUTPUTS:
        assert_close(
            getattr(got.filtered, name).cpu(), getattr(ref.filtered, name), kind, dtype,
            what=f"filtered {name}",
        )  # fmt: skip
    assert_close(got.filtered.loglik.cpu(), ref.filtered.loglik, kind, dtype, what="loglik")
    assert not bool(got.filtered.diffuse.any())
    if dtype == torch.float32:  # the accuracy of the float64 formulation, not the 2e-3 bound
        for name in ("mean", "cov"):
            err = normwise(getattr(got, name).cpu(), getattr(ref, name))
            assert err <= F32_NORMWISE, f"float32 smoothed {name}: normwise error {err:.2e}"
    return got


SMOOTH_CASES = [
    # id, n, d, T, full R, dtype (the default run: cheap interpreted sizes)
    ("n2-d1-T1-f64", 2, 1, 1, False, torch.float64),
    ("n2-d1-T1-f32", 2, 1, 1, False, torch.float32),
    ("n2-d1-T11-f64", 2, 1, 11, False, torch.float64),  # interpreted: 3 chunks of 4, the last 3
    # padded state, 4 chunks of 2, the last 1; a vector missing whole and one missing in part
    ("n3-d2-T7-f32", 3, 2, 7, False, torch.float32),
    ("n8-d1-T6-f32", 8, 1, 6, False, torch.float32),  # 3 chunks of 2
    ("n3-d2-T8-fullR-f64", 3, 2, 8, True, torch.float64),  # 4 chunks of 2
]
# interpreted: (chunks, steps of the last chunk) of SMOOTH_CASES past one step
SMOOTH_CHUNKS = {11: (3, 3), 7: (4, 1), 6: (3, 2), 8: (4, 2)}


@pytest.mark.parametrize(
    ("n", "d", "T", "full_r", "dtype"), [c[1:] for c in SMOOTH_CASES],
    ids=[c[0] for c in SMOOTH_CASES],
)  # fmt: skip
def test_smooth_matches_sequential(n, d, T, full_r, dtype):
    z, kw = random_model(100 * n + T, n, d, T, missing=0.0 if full_r else 0.1)
    _assert_layout(z, d, full_r, SMOOTH_CHUNKS if T > 1 else None)
    check_smooth(z, kw, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    ("n", "d", "T", "full_r"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_smooth_matches_sequential_slow(n, d, T, full_r, dtype):
    z, kw = random_model(100 * n + T, n, d, T, missing=0.0 if full_r else 0.1)
    check_smooth(z, kw, dtype)


@pytest.mark.parametrize(
    ("L", "T", "dtype"),
    [
        pytest.param(1, 23, torch.float64, marks=pytest.mark.slow),
        (3, 23, torch.float32),
        (2, 9, torch.float64),
    ],
    ids=["L1-f64", "L3-f32", "L2-T9-f64"],
)
def test_smooth_chunk_counts(monkeypatch, L, T, dtype):
    # chunks of L steps over T = 23: 23 chunks of one step (groups of 8: 8, 8, 7) and 8 chunks
    # (groups of 4: 4, 4, the last 2 steps); over T = 9, 5 chunks (groups of 4: 4, 1, the last
    # 1 step: the groups of 5 chunks of 5 over 23 steps at 9 steps); each with the two-level
    # carries forwards and backwards and a last chunk shorter than the others (L = 3, 2)
    monkeypatch.setattr(CD, "chunk_length", lambda T: L)
    # the interpreter's one-level limit (4 chunks) on the GPU too, so that both run two levels
    monkeypatch.setitem(CD.TUNING, "one_level", 4)
    nc = CD.cdiv(T, L)
    assert CD.cdiv(nc, CD.group_size(nc)) >= 2
    assert {1: (23, 8), 3: (8, 4), 2: (5, 4)}[L] == (nc, CD.group_size(nc))
    assert L == 1 or T % L != 0  # the last chunk shorter
    z, kw = random_model(40 + L, 2, 1, T, missing=0.2)
    check_smooth(z, kw, dtype)


def test_smooth_many_series():
    # two series on axis 1, each with its own F, Q, H, R, offset and prior (one program per
    # chunk and series), missing entries
    rng = np.random.default_rng(5)
    T, B, n, d = 5, 2, 3, 2  # interpreted: 3 chunks of 2 steps
    F = rng.normal(size=(B, n, n))
    F *= 0.9 / np.abs(np.linalg.eigvals(F)).max(-1)[:, None, None]
    G = rng.normal(size=(B, n, n))
    kw = dict(
        F=F,
        Q=G @ G.transpose(0, 2, 1) / n + 0.1 * np.eye(n),
        H=rng.normal(size=(B, d, n)),
        R=np.stack([np.diag(rng.uniform(0.5, 2.0, size=d)) for _ in range(B)]),
        offset=rng.normal(size=(B, n)),
        prior_mean=rng.normal(size=(B, n)),
        prior_cov=np.stack([(1 + i) * np.eye(n) for i in range(B)]),
    )
    z = rng.normal(size=(T, B, d))
    z[rng.random(z.shape) < 0.2] = np.nan
    assert np.isnan(z).any() and not np.isnan(z).all(2).all(0).any()  # every series observed
    if not CUDA:
        assert CD.cdiv(T, CD.chunk_length(T)) == 3
    got = check_smooth(z, kw, torch.float64)
    assert got.mean.shape == (T, B, n) and got.filtered.loglik.shape == (B,)


@pytest.mark.slow  # interpreted: 1 to 2.5 minutes each
@pytest.mark.parametrize(
    ("n", "T", "dtype"),
    [(2, 400, torch.float64), (4, 400, torch.float32), (8, 500, torch.float32)],
    ids=["n2-f64", "n4-f32", "n8-f32"],
)
def test_smooth_matches_sequential_long(n, T, dtype):
    z, kw = random_model(7 + n, n, 1, T)
    check_smooth(z, kw, dtype)


@pytest.mark.slow
def test_smooth_several_chunks():
    # more than two groups of chunks in both two-level carries (as test_several_chunks)
    T = 3200 if CUDA else 300
    z, kw = random_model(3, 2, 1, T)
    nc = CD.cdiv(T, CD.chunk_length(T))
    assert CD.cdiv(nc, CD.group_size(nc)) > 2
    check_smooth(z, kw, torch.float64)


@pytest.fixture
def ran_smooth(monkeypatch):
    calls = []
    real = CD.run_smooth

    def spy(model, layout, *rest):
        calls.append(layout.n)
        return real(model, layout, *rest)

    monkeypatch.setattr(CD, "run_smooth", spy)
    return calls


@pytest.fixture
def auto_is_triton(monkeypatch):
    """Off CUDA: let ``backend="auto"`` resolve as on CUDA (the interpreted kernels take CPU
    tensors), so that kd.smooth's dispatch by model class runs here."""
    if CUDA:
        return
    from kalmanscan.core import backends

    real = backends.resolve

    def resolve(backend, device, op="filter"):
        if backend == "auto" and op == "dense":
            return backends.AUTO["dense"]["cuda"][0]
        return real(backend, device, op)

    monkeypatch.setattr(backends, "resolve", resolve)


def test_auto_smooth_takes_triton(auto_is_triton, ran, ran_smooth):
    # kd.smooth(auto) runs the fused smoother for a model the triton backend serves (on CPU
    # through the auto rule that CUDA tensors get); kd.filter(auto) runs the fused filter
    # interpreted: 3 chunks of 2, 2 and 1 steps (the carries between chunks; 4, 4 and 3 steps
    # over T = 11 before)
    z, kw = random_model(6, 2, 1, 5)
    assert CUDA or CD.cdiv(5, CD.chunk_length(5)) == 3
    t = {k: torch.as_tensor(v, device=DEVICE) for k, v in kw.items()}
    zt = torch.as_tensor(z, device=DEVICE)
    got = kd.smooth(zt, **t)
    assert ran_smooth == [2] and ran == [], "kd.smooth(auto) must run the triton smoother"
    ref = kd.smooth(z, **kw, backend="sequential")
    for name in SMOOTH_OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), "parallel", "float64", what=name)
    kd.filter(zt, **t)
    assert ran == [2] and ran_smooth == [2]


@pytest.mark.parametrize("what", ["diffuse", "time-varying", "grad"])
def test_auto_smooth_outside_triton_takes_torch(auto_is_triton, ran_smooth, what):
    z, kw = random_model(8, 2, 1, 6)
    if what == "diffuse":
        kw["prior_cov"] = np.diag([np.inf, np.inf])
    if what == "time-varying":
        kw["F"] = np.stack([(0.5 + 0.1 * i) * kw["F"] for i in range(6)])
    t = {k: torch.as_tensor(v, device=DEVICE) for k, v in kw.items()}
    if what == "grad":
        t["Q"].requires_grad_(True)
    got = kd.smooth(torch.as_tensor(z, device=DEVICE), **t)
    if what == "diffuse":
        # an inf in prior_cov is found by the screen read after the fused launches (no host
        # synchronization before them): their outputs are dropped and the torch scan answers,
        # which marks the diffuse start (the fused backend never does)
        assert bool(got.filtered.diffuse[0].all()), "the torch scan must answer a diffuse prior"
    else:
        assert ran_smooth == [], f"a {what} model is outside the triton model class"
    ref = kd.smooth(z, **kw, backend="sequential")
    assert_close(got.mean.detach().cpu()[2:], ref.mean[2:], "parallel", "float64", what="mean")


# Models in which a direction of the state is known exactly (tests/test_dense_singular.py's cases
# with a proper prior, the triton backend's class): the fused kernels invert covariances and
# predictions (the filtered precision came out NaN / inf, the smoothed covariances NaN), so the
# gate kernel's bit, read back with the screen's, hands them to the torch scan, which applies
# kalmanscan/dense/singular.py's rule; an explicit backend="triton" refuses them naming 'torch'.
# Truth: the mpmath oracle at 120 digits and the closed-form known directions of that file.
KNOWN_CASES = ["llt-slope-known", "llt-seasonal4-known", "rank1-noise-sum-known",
               "ar1-padded-state", "exact-entry-pins-sum"]  # fmt: skip


@pytest.mark.parametrize("op", ["filter", "smooth"])
@pytest.mark.parametrize("name", KNOWN_CASES)
def test_auto_known_directions_take_the_rule(auto_is_triton, ran, ran_smooth, name, op):
    from tests import test_dense_singular as S

    m, z, pr, fk, sk, _, _ = S._case(name)
    t = {k: torch.as_tensor(np.asarray(v, dtype=np.float64), device=DEVICE)
         for k, v in {**m, **pr}.items()}  # fmt: skip
    got = getattr(kd, op)(torch.as_tensor(z, device=DEVICE), **t)
    assert (ran if op == "filter" else ran_smooth) == [len(pr["prior_mean"])], (
        "the fused backend must have been tried first"
    )
    o, fprec, sprec = S._truth(name)
    want_cov = o.cov if op == "filter" else o.smooth_cov
    want_prec, known = (fprec, fk) if op == "filter" else (sprec, sk)
    scale = max(1.0, np.abs(want_cov).max())
    cov = got.cov.cpu().numpy()
    assert np.abs(cov - want_cov).max() / scale < 1e-12, f"{op} covariance"
    for k in range(S.T):
        coord = np.diag(known[k]) == 1.0
        assert (cov[k][coord] == 0).all() and (cov[k][:, coord] == 0).all(), k
        S._check_precision(got.precision[k].cpu().numpy(), want_prec[k], f"{op} precision t={k}")
    with pytest.raises(ValueError, match="backend='torch'"):
        getattr(kd, op)(torch.as_tensor(z, device=DEVICE), **t, backend="triton")


def test_gate_is_off_on_ordinary_models():
    # random stable models with SPD Q and prior (the rest of this file): the fused path serves
    # them, the gate kernel's bit stays 0 (float32's bound included, 1 / (64 eps n^2))
    # (the gate kernel reads the model once a series, whatever T; interpreted: one chunk of 2
    # steps, as a GPU runs 3 steps: one chunk of 32)
    T = 2
    assert CUDA or CD.cdiv(T, CD.chunk_length(T)) == 1
    for seed, n in [(1, 2), (2, 3), (3, 4), (4, 8)]:
        for dtype in (torch.float32, torch.float64):
            z, kw = random_model(seed, n, 1, T)
            model, layout = laid_out(z, kw, dtype)
            parts, flagged, gated = CD.run(model, layout)
            assert parts is not None and not flagged and not gated, (seed, n, dtype)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("n", [2, 4, 8], ids=["n2", "n4", "n8"])
def test_gpu_public_auto_smooth(ran_smooth, n):
    z, kw = random_model(11 + n, n, 1, 1500)  # 47 chunks of 32 in groups of 8
    ref = kd.smooth(z, **kw, backend="sequential")
    t = {k: torch.as_tensor(v, dtype=torch.float32, device="cuda") for k, v in kw.items()}
    got = kd.smooth(torch.as_tensor(z, dtype=torch.float32, device="cuda"), **t)
    assert ran_smooth == [n], "kd.smooth(auto) on CUDA must run the triton backend"
    for name in SMOOTH_OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), "truth", "float32", what=name)
    for name in ("mean", "cov"):
        err = normwise(getattr(got, name).cpu(), getattr(ref, name))
        assert err <= F32_NORMWISE, f"float32 smoothed {name}: normwise error {err:.2e}"
    for name in OUTPUTS:
        assert_close(
            getattr(got.filtered, name).cpu(), getattr(ref.filtered, name), "truth", "float32",
            what=f"filtered {name}",
        )  # fmt: skip


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_auto_smooth_diffuse_takes_torch(ran_smooth):
    z, kw = random_model(5, 2, 1, 300)
    kw["prior_cov"] = np.diag([np.inf, np.inf])
    t = {k: torch.as_tensor(v, device="cuda") for k, v in kw.items()}
    got = kd.smooth(torch.as_tensor(z, device="cuda"), **t)
    # the screen read after the fused launches finds the inf: the torch scan answers
    res = got.filtered
    assert bool(res.diffuse[0].all()), "a diffuse prior is outside the triton model class"
    ref = kd.smooth(z, **kw, backend="sequential")
    assert_close(got.mean.cpu()[10:], ref.mean[10:], "parallel", "float64", what="mean")
    with pytest.raises(ValueError, match="proper prior"):
        kd.smooth(torch.as_tensor(z, device="cuda"), **t, backend="triton")


# --- near noise-free entries observing the whole state (issue 21; validation/regimes.py) ---

NEAR_NOISE_FREE = [
    # the battery's dense rows the triton backend serves (proper prior): two states, both
    # observed at every step at R = 1e-12 I, so that every filtered covariance is 1e-12-sized
    # under an O(1) (prior I) or 1e6-sized (prior 1e6 I) prediction
    "2 states, prior I, both observed at R=1e-12, seed 0",
    "2 states, prior I, both observed at R=1e-12, seed 3",
    "2 states, prior 1e6 I, both observed at R=1e-12, seed 0",
    "2 states, prior 1e6 I, both observed at R=1e-12, seed 3",
]


def near_noise_free(name, T=None):
    """The battery's row ``name`` as ``(z, kw)``; ``T``: its first ``T`` steps only."""
    from kalmanscan.validation.regimes import _near_noiseless_heads

    (reg,) = [r for r in _near_noiseless_heads() if r.name == name]
    n = reg.F.shape[-1]
    offset = np.zeros(n) if reg.offset is None else reg.offset
    kw = dict(F=reg.F, Q=reg.Q, H=reg.H, R=reg.R, offset=offset, prior_mean=reg.prior_mean,
              prior_cov=reg.prior_cov)  # fmt: skip
    return reg.z[:T], kw


def traces(a):
    """Per-step traces of ``a [T, n, n]``, float64."""
    return np.trace(np.asarray(a, dtype=np.float64), axis1=-2, axis2=-1)


def cov_normwise(a, b):
    """Worst per-step ||A_t - B_t||_F / ||B_t||_F (the regime battery's covariance metric)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float((np.linalg.norm(a - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))).max())


@pytest.mark.parametrize(
    ("name", "T"),
    # the default run keeps the worst row (1e6 prior, seed 3: 3.5e2 relative off before the
    # square-root steps) over its first 5 steps (interpreted: 3 chunks of 2, 2 and 1 steps, the
    # carries between them as at 9 steps' 4, 4 and 1): the 4e6-sized prediction at step 0 and
    # the O(1) ones after it, each updated to a 1e-11-sized posterior, as over the whole row;
    # the four whole rows, 7-8 s each interpreted, run with -m slow (1e6-s3 by
    # tests/_default_run.py, on CUDA by default)
    [pytest.param(n, None, marks=pytest.mark.slow) if i != 3 else (n, None)
     for i, n in enumerate(NEAR_NOISE_FREE)] + [(NEAR_NOISE_FREE[3], 5)],
    ids=["I-s0", "I-s3", "1e6-s0", "1e6-s3", "1e6-s3-T5"],
)  # fmt: skip
def test_near_noise_free_whole_state(name, T):
    # the scalar updates formed each 1e-12-sized posterior as a difference of prediction-sized
    # terms: filtered and smoothed covariances 1.9e-4 (prior I) and 3.5e2 (prior 1e6 I)
    # relative off before; every output within the scan's float64 tolerance of the sequential
    # reference now (which is within 2e-15 of the mpmath oracle on these rows)
    z, kw = near_noise_free(name, T)
    ref = kd.smooth(z, **kw, backend="sequential")
    # the regime: every filtered covariance 1e-11-sized, under the prior's 1e6 at step 0
    assert traces(ref.filtered.cov).max() < 1e-10
    big = np.diag(kw["prior_cov"]).max() >= 1e6
    assert traces(ref.filtered.pred_cov)[0] > (1e6 if big else 1.0)
    if not CUDA and T is not None:
        assert (CD.cdiv(T, CD.chunk_length(T)), CD.chunk_length(T)) == (3, 2)
    check_smooth(z, kw, torch.float64, ref)
    # float32: covariances within 1e-4 per step (measured <= 5.8e-7 interpreted; 4.8e4 .. 1.9e11
    # off before), finite loglik (inf before)
    model, layout = laid_out(z, kw, torch.float32)
    g32 = CD.dense_triton(model, layout, True, 32)
    assert bool(torch.isfinite(g32.filtered.loglik).all())
    for what, a, b in (("filtered", g32.filtered.cov, ref.filtered.cov), ("smoothed", g32.cov,
                                                                           ref.cov)):  # fmt: skip
        err = cov_normwise(a.cpu(), b)
        assert err <= 1e-4, f"float32 {what} covariance: per-step normwise error {err:.2e}"


def test_near_noise_free_partial_oracle():
    # two entries at R = 1e-12 on three states under a 1e6 prior, 40 % missing: the scalar
    # updates kept the filtered covariance's 1e-12-sized directions to eps tr P (1e-10), which
    # the smoother carried into the 1e-2-sized smoothed covariance at step 0 (1.9e-8 relative
    # off the mpmath oracle before, over the battery's 1e-8; 1.4e-9 now, every column within
    # the battery's float64 tolerances)
    from kalmanscan.validation import regimes as RG
    from kalmanscan.validation.oracle import dense_oracle

    name = "3 states, prior 1e6 I, two entries at R=1e-12, seed 1"
    (reg,) = [r for r in RG._near_noiseless_heads() if r.name == name]
    z, kw = near_noise_free(name)
    tr = dense_oracle(reg.z, reg.F, reg.Q, reg.H, reg.R, prior_mean=reg.prior_mean,
                      prior_cov=reg.prior_cov)  # fmt: skip
    model, layout = laid_out(z, kw, torch.float64)
    got = CD.dense_triton(model, layout, True, 32)
    g = lambda x: np.asarray(x.cpu(), dtype=np.float64)  # noqa: E731
    f = got.filtered
    out = dict(mean=g(f.mean), cov=g(f.cov), loglik=float(f.loglik), smooth_mean=g(got.mean),
               smooth_cov=g(got.cov))  # fmt: skip
    errs = RG.dense_errors(out, tr)
    assert RG.passes(errs, "float64"), errs


@pytest.mark.parametrize("T", [5, None], ids=["T5", "whole"])
def test_auto_near_noise_free_takes_triton(auto_is_triton, ran_smooth, T):
    # kd.smooth(auto) keeps the fused smoother for these models (they are in its class) and is
    # right there (the model decides; the row's first 5 steps by default without CUDA, 3 chunks
    # of 2, 2 and 1, the whole row with -m slow)
    z, kw = near_noise_free(NEAR_NOISE_FREE[2], T)
    assert CUDA or T is None or CD.cdiv(T, CD.chunk_length(T)) == 3
    t = {k: torch.as_tensor(v, device=DEVICE) for k, v in kw.items()}
    got = kd.smooth(torch.as_tensor(z, device=DEVICE), **t)
    assert ran_smooth == [2], "kd.smooth(auto) must run the triton smoother"
    ref = kd.smooth(z, **kw, backend="sequential")
    for name in SMOOTH_OUTPUTS:
        assert_close(getattr(got, name).cpu(), getattr(ref, name), "parallel", "float64", what=name)
    assert_close(got.filtered.cov.cpu(), ref.filtered.cov, "parallel", "float64", what="cov")


@pytest.mark.slow  # compiles the kernels for sm_90 (CI: `pytest -m slow`), about 40 s
def test_kernels_compile_for_sm90_without_spills():
    # every kernel of the filter and the smoother at NP = 2, 4, 8, compiled for Hopper on this
    # machine (no GPU needed) with benchmarks/gpu.py's compile_sm90, as tests/test_cuda_resources.py
    # does for the other kernels: a spilled register tile shows up here before any device time
    pytest.importorskip("triton")
    import subprocess
    import sys

    from benchmarks.gpu import triton_cuobjdump

    if triton_cuobjdump() is None:
        pytest.skip("triton's cuobjdump is not installed")
    root = os.path.join(os.path.dirname(__file__), "..")
    code = r"""
import os, re, subprocess, sys, tempfile
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "benchmarks")]
from gpu import compile_sm90, triton_cuobjdump
from kalmanscan.cuda import dense as CD
tool = triton_cuobjdump()
ints = {"T", "n", "L", "NC", "G", "NG"}
gate = {"sPb": "i32", "sPi": "i32", "sPj": "i32", "pre_ptr": "*i1", "word_ptr": "*i32",
        "bound": "fp32"}
kernels = [(CD.chunk_elements, dict(D=1)), (CD.chunk_elements, dict(D=2)), (CD.group_elements, {}),
           (CD.carry, {}), (CD.chunk_filter, dict(D=1)), (CD.carries, {}),
           (CD.chunk_smooth, {}), (CD.gate, dict(K=1))]
for NP in (2, 4, 8):
    for fn, consts in kernels:
        consts = dict(consts, NP=NP)
        sg = {a: gate.get(a, "i32" if a in ints else "*fp32") for a in fn.arg_names
              if a not in consts}
        comp = compile_sm90(fn, sg, consts, 1)
        path = os.path.join(tempfile.mkdtemp(), "k.cubin")
        open(path, "wb").write(comp.asm["cubin"])
        out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
        print(fn.__name__, NP, re.findall(r"REG:(\d+)", out)[0], re.findall(r"STACK:(\d+)", out)[0])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True,
                          env=env, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert {r[0] for r in rows} >= {"carries", "chunk_smooth", "chunk_filter", "gate"}, rows
    assert len(rows) == 24, rows
    for name, NP, regs, stack in rows:
        assert int(stack) == 0, f"{name} (NP = {NP}) spills registers: {rows}"
        assert int(regs) <= 255, (name, NP, regs)


# --- the host path of one call (issue 25): ATen ops, host synchronizations, kernel launches ---

# ATen ops that wait for the device (on a GPU): a scalar read, and the linalg ops that check
# their own errors on the host
SYNC_OPS = {"_local_scalar_dense", "is_nonzero", "equal", "allclose", "item", "nonzero",
            "masked_select", "_linalg_eigh", "linalg_cholesky", "linalg_inv"}  # fmt: skip
# kd.filter / kd.smooth through the fused backend, n = 2, d = 1, T = 3, by device: (ATen ops
# outside the kernels, views included; host synchronizations; kernel launches). The screen's
# flag and the gate kernel's (a direction known exactly, launched first) are one int32 word:
# flag.reshape(1) and the word's torch.zeros. On the CPU (interpreted) it is read before the
# launches, word.tolist(). On CUDA it is read after them through
# kalmanscan.cuda.filter._flags_reader (the only CUDA-only ATen work on this path): the pinned
# torch.empty, copy_, and host[0] before the scalar read, 4 ops more than tolist; T = 3 is one
# chunk of 32 steps there, no chunk_elements launch. (Before issue 25: 16 synchronizations;
# before the host-path trim: 108 / 119 ops here, 112 measured on the H200; before the gate
# kernel 39 / 44 ops and 3 / 4 launches on the CPU.)
HOST_PATH = {
    "cpu": {"filter": (40, 1, 4), "smooth": (45, 1, 5)},
    "cuda": {"filter": (44, 1, 3), "smooth": (49, 1, 4)},
}


class _Counter:
    """ATen ops outside the Triton kernels (the interpreter's own tensor work is not counted),
    host synchronizations (:data:`SYNC_OPS` and ``Tensor.tolist``/``numpy``) and launches."""

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

        self.ops = self.syncs = self.launches = 0
        inside = [False]
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not inside[0]:
                    counter.ops += 1
                    counter.syncs += func.overloadpacket.__name__ in SYNC_OPS
                return func(*args, **(kwargs or {}))

        self.mode = Mode
        real_launch = CD.launch

        def launch(*a, **k):
            self.launches += 1
            inside[0] = True
            try:
                with _disable_current_modes():  # the interpreter's tensor work runs uncounted
                    return real_launch(*a, **k)
            finally:
                inside[0] = False

        monkeypatch.setattr(CD, "launch", launch)
        for name in ("tolist", "numpy"):
            real = getattr(torch.Tensor, name)

            def read(t, *a, _real=real, **k):
                self.syncs += not inside[0]
                return _real(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, read)

    def count(self, fn):
        self.ops = self.syncs = self.launches = 0
        with self.mode():
            out = fn()
        return out, (self.ops, self.syncs, self.launches)


def test_host_path_counts(auto_is_triton, ran, ran_smooth, monkeypatch):
    z, kw = random_model(6, 2, 1, 3)  # interpreted: 2 chunks of 2 steps
    t = {k: torch.as_tensor(v, device=DEVICE) for k, v in kw.items()}
    zt = torch.as_tensor(z, device=DEVICE)
    counter = _Counter(monkeypatch)
    got, counts = counter.count(lambda: kd.filter(zt, **t))
    assert ran == [2] and ran_smooth == [], "kd.filter must run the fused filter"
    assert isinstance(got, kd.DenseFilterResult) and not bool(got.diffuse.any())
    ops, syncs, launches = HOST_PATH[zt.device.type]["filter"]
    assert counts[1] <= syncs and counts[2] <= launches and counts[0] <= ops, counts
    got, counts = counter.count(lambda: kd.smooth(zt, **t))
    assert ran_smooth == [2], "kd.smooth must run the fused smoother"
    assert isinstance(got, kd.DenseSmoothResult)
    ops, syncs, launches = HOST_PATH[zt.device.type]["smooth"]
    assert counts[1] <= syncs and counts[2] <= launches and counts[0] <= ops, counts
