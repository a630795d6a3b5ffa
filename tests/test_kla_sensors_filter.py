"""The KLA layer's sensors and op in one Function (``glue.sensors_filter``, what the fused layer
runs on CUDA under autograd): its outputs and the gradients of the sensor projection ``s``,
``decay`` and ``process_var`` against ``glue.sensors`` followed by the op (``kla_triton``),
whose backward writes float32 ``gv, gLv`` that the sensors' backward turns into ``s``'s
gradient. Here the op's backward writes ``v``'s and ``log var_v``'s gradients into ``s``'s
itself. Both layouts of the backward's outputs (4 threads a channel: reduce-scattered; 1: step
by step), time chunks and none, with and without the variance, half and float32 ``s``. Without
CUDA the kernels run under TRITON_INTERPRET=1 at small sizes."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda.kla import backward as bwd_mod  # noqa: E402
from kalmanscan.cuda.kla import glue, kla_triton, tuning  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
OBS_MIN = 1e-3


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(_common, "POISON", True)  # an unwritten output element is NaN


def inputs(B, L, M, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, L, 2 * M + 2 * S, generator=g) * 2.0
    s[..., M : 2 * M] -= 3.0  # log var_v down to softplus's small values too
    a = torch.rand(M, S, generator=g) * 0.9 + 0.05
    p = torch.rand(M, S, generator=g) * 0.3 + 0.01
    return [x.to(DEVICE) for x in (s.to(dtype), a, p)]


def outputs_and_grads(fn, s, a, p, M, S, var, seed=1):
    s, a, p = (x.detach().clone().requires_grad_(True) for x in (s, a, p))
    y, yvar, lam, eta = fn(s, a, p)
    g = torch.Generator().manual_seed(seed)
    loss = sum((x * torch.randn(x.shape, generator=g).to(DEVICE)).sum()
               for x in (y, lam, eta) + ((yvar,) if var else ()))  # fmt: skip
    loss.backward()
    return [y, yvar, lam, eta], [s.grad, a.grad, p.grad]


def composed(M, S, var):
    """``glue.sensors`` then the op: the reference path."""

    def fn(s, a, p):
        v, Lv, k, q = glue.sensors(s, M, S, OBS_MIN, True)
        y, yvar, lam, eta, _ = kla_triton(v, Lv, k, q, a, p, None, None, False, var)
        return y, yvar, lam, eta

    return fn


def fused(M, S, var):
    return lambda s, a, p: glue.sensors_filter(s, a, p, M, S, OBS_MIN, True, var)


def rel(have, want):
    return float((have.float() - want.float()).abs().max() / want.float().abs().max())


# S = 16: 4 threads a channel (reduce-scattered outputs); S = 4: 1 (stored step by step). In
# chunks C = 3 (rows of 4 steps) and unchunked; L = 12.
@pytest.mark.parametrize("S", [16, 4], ids=["S16", "S4"])
@pytest.mark.parametrize("C", [1, 3], ids=["C1", "C3"])
@pytest.mark.parametrize("var", [True, False], ids=["var", "novar"])
def test_sensors_filter_equals_sensors_then_op(S, C, var, monkeypatch):
    B, L, M = 2, 12, 3
    monkeypatch.setattr(tuning, "CHUNKS", C)
    s, a, p = inputs(B, L, M, S, torch.bfloat16)
    seen = []
    real = bwd_mod.launch

    def spy(fn, grid, *args, **kw):
        seen.append(kw.get("RAW_OUT"))
        return real(fn, grid, *args, **kw)

    monkeypatch.setattr(bwd_mod, "launch", spy)
    got, ggot = outputs_and_grads(fused(M, S, var), s, a, p, M, S, var)
    assert seen == [True]  # the op's backward wrote s's gradient
    want, gwant = outputs_and_grads(composed(M, S, var), s, a, p, M, S, var)
    assert seen == [True, False]
    for name, h, w in zip(("y", "yvar", "lam", "eta"), got, want, strict=True):
        if w is None:
            assert h is None, name
            continue
        assert torch.equal(h, w), name  # the same kernels on the same inputs
    for name, h, w in zip(("s", "decay", "process_var"), ggot, gwant, strict=True):
        assert h.dtype == w.dtype and h.shape == w.shape, name
        assert torch.isfinite(h).all(), name
        # s's gradient is bf16: the two paths round the same float32 sums (in another order
        # for log var_v's columns, through the slope before or after the sum) to bf16
        tol = 1e-2 if name == "s" else 1e-5
        assert rel(h, w) <= tol, (name, rel(h, w))
    # v's and k, q's columns are the same float32 values rounded once
    assert torch.equal(ggot[0][..., :M], gwant[0][..., :M])
    assert torch.equal(ggot[0][..., 2 * M :], gwant[0][..., 2 * M :])


def test_sensors_filter_float32_projection(monkeypatch):
    """A float32 projection: the gradient of log var_v's columns to float32 rounding."""
    B, L, M, S = 1, 9, 2, 16
    monkeypatch.setattr(tuning, "CHUNKS", 1)
    s, a, p = inputs(B, L, M, S, torch.float32, seed=3)
    _, ggot = outputs_and_grads(fused(M, S, True), s, a, p, M, S, True)
    _, gwant = outputs_and_grads(composed(M, S, True), s, a, p, M, S, True)
    for h, w in zip(ggot, gwant, strict=True):
        assert rel(h, w) <= 1e-5


def test_sensors_filter_without_grad_saves_nothing(monkeypatch):
    """Without autograd the plain forward runs (no Function, no checkpoints), same outputs."""
    B, L, M, S = 1, 8, 2, 16
    s, a, p = inputs(B, L, M, S, torch.bfloat16)
    with torch.no_grad():
        got = glue.sensors_filter(s, a, p, M, S, OBS_MIN, True, True)
        want = composed(M, S, True)(s, a, p)
    for h, w in zip(got, want, strict=True):
        assert torch.equal(h, w)


def test_raw_out_rejects_mismatched_views():
    B, L, M = 1, 4, 2
    gs = torch.empty(B, L, 10)
    good = gs[..., :M]
    with pytest.raises(ValueError, match="raw_out: expected"):
        bwd_mod._row_stride((good, torch.empty(B, L, M)), (B, L, M))
    assert bwd_mod._row_stride((good, gs[..., M : 2 * M]), (B, L, M)) == 10
