"""The fused Triton dense filter (kalmanscan/cuda/dense.py) against the float64 sequential
reference of kalmanscan.dense: every output, awkward lengths (1, 63, several chunks), n = 2, 3
(padded), 4, 8, d = 1 and d > 1 (diagonal R; a full R whitened), missing data, float32 and
float64. Without CUDA the kernels run under TRITON_INTERPRET=1 at small sizes; outputs are
NaN-poisoned (tests/conftest.py) so an unwritten element fails. GPU tests check which backend ran.
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
    ("n8-d1-T70", 8, 1, 70, False),
    ("n3-d2-T30-fullR", 3, 2, 30, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    ("n", "d", "T", "full_r"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_matches_sequential(n, d, T, full_r, dtype):
    z, kw = random_model(100 * n + T, n, d, T, missing=0.0 if full_r else 0.1)
    check(z, kw, dtype)


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


@pytest.mark.parametrize(
    ("what", "expect"),
    [
        ("diffuse", "proper prior"),
        ("n9", "n <= 8"),
        ("time-varying", "time-varying F"),
        ("smooth", "no smoother"),
        ("grad", "do not require grad"),
    ],
    ids=["diffuse", "n9", "time-varying", "smooth", "grad"],
)
def test_unsupported_raises(what, expect):
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
        CD.dense_triton(model, layout, what == "smooth", 32)


def test_inf_observation_raises():
    z, kw = random_model(2, 2, 1, 8)
    z[3] = np.inf
    model, layout = laid_out(z, kw, torch.float64)
    with pytest.raises(ValueError, match="inf"):
        CD.dense_triton(model, layout, False, 32)


def test_full_r_with_missing_raises():
    z, kw = random_model(2, 2, 2, 8, full_r=True)
    model, layout = laid_out(z, kw, torch.float64)
    with pytest.raises(ValueError, match="diagonal R.*backend='torch'"):
        CD.dense_triton(model, layout, False, 32)


def test_explicit_triton_off_cuda_raises():
    if CUDA:
        pytest.skip("needs CPU tensors")
    z, kw = random_model(2, 2, 1, 8)
    with pytest.raises(ValueError, match="'triton' runs on CUDA"):
        kd.filter(z, **kw, backend="triton")


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

    def spy(model, layout):
        calls.append(layout.n)
        return real(model, layout)

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
    assert ran == [], "a diffuse prior is outside the triton model class"
    ref = kd.filter(z, **kw, backend="sequential")
    assert_close(got.mean.cpu()[10:], ref.mean[10:], "parallel", "float64", what="mean")
    with pytest.raises(ValueError, match="proper prior"):
        kd.filter(torch.as_tensor(z, device="cuda"), **t, backend="triton")
