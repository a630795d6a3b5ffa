"""The KLA op in time chunks (kalmanscan/cuda/kla/chunked.py) against the sequential reference
and the unchunked kernels, forward and every gradient, and the rule that picks the chunk count
(tuning.chunks_for). Without CUDA the kernels run under TRITON_INTERPRET=1 at small sizes;
outputs are NaN-poisoned before every launch so an unwritten element fails.
"""

import os
from types import SimpleNamespace

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from benchmarks.reliability import KLA_REGIMES, kla_errors, kla_inputs  # noqa: E402
from kalmanscan.core.kla_op import kla_filter  # noqa: E402
from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda.kla import autograd, chunked, kla_triton, tuning  # noqa: E402
from kalmanscan.testing import TOLERANCES, assert_close, tolerance  # noqa: E402
from tests.test_cuda_kla import (  # noqa: E402
    DEVICE,
    NAMES,
    make_inputs,
    normwise,
    reference,
    run,
    weights_for,
)

OUTS = ("y", "yvar", "lam", "eta", "precision")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(_common, "POISON", True)


def chunked_runs(shape, C, dtype, monkeypatch, seed=0, forget=True, plain=True, precision=True):
    """``(chunked, unchunked or None, reference)`` outputs and gradients, the kernels in
    ``dtype``; ``precision``: the precisions among the outputs (and their gradient)."""
    x = make_inputs(*shape, seed=seed, forget=forget)
    w = weights_for(*shape)
    monkeypatch.setattr(tuning, "CHUNKS", C)
    got = run(kla_triton, x, dtype, w, precision)
    monkeypatch.setattr(tuning, "CHUNKS", 1)
    unchunked = run(kla_triton, x, dtype, w, precision) if plain else None
    ref = run(reference, x, torch.float64, w, precision)
    return got, unchunked, ref


def spy_maps(monkeypatch):
    """A list that gets, at each ``chunked.chunk_starts``, the chunk maps it wrote ``[7, B,
    C - 1, M S]`` (each row's last chunk has none: NaN-poisoned), from the op's own run."""
    seen = []
    real = chunked.chunk_starts

    def spy(v, *args):
        maps, start = real(v, *args)
        B, C = v.shape[0], args[-1]
        seen.append(maps.view(maps.shape[0], B, C, -1)[:, :, : C - 1].clone())
        return maps, start

    monkeypatch.setattr(chunked, "chunk_starts", spy)
    return seen


# The interpreter walks every step in Python (about 0.1 s a step here), so the shapes are small:
def check_float64_reference(shape, C, monkeypatch, precision=True):
    """The chunked op in float64 on ``shape`` in ``C`` chunks against the sequential reference:
    outputs and the gradients of all six inputs (``precision``: as chunked_runs)."""
    (got, ggot), _, (ref, gref) = chunked_runs(shape, C, torch.float64, monkeypatch, plain=False,
                                               precision=precision)  # fmt: skip
    for name, a, b in zip(OUTS[: len(got)], got, ref, strict=True):
        assert_close(a, b, "kernel", torch.float64, what=name)
    for name, a, b in zip(NAMES, ggot, gref, strict=True):
        scale = max(b.abs().max().item(), 1.0)  # (as test_cuda_kla: exact zeros behind a forget)
        assert_close(a, b, "kernel_grad", torch.float64, scale=scale, what=f"grad {name}")


def check_float32_reference(x, C, weights, monkeypatch):
    """The op in float32 in ``C`` chunks on inputs ``x`` against the sequential reference in
    float64: outputs and the gradients of all six inputs, to the float32 kernel tolerances."""
    monkeypatch.setattr(tuning, "CHUNKS", C)
    got, ggot = run(kla_triton, x, torch.float32, weights)
    ref, gref = run(reference, x, torch.float64, weights)
    for name, a, r in zip(OUTS, got, ref, strict=True):
        assert normwise(a, r) <= TOLERANCES[("kernel", "float32")], name
    for name, a, r in zip(NAMES, ggot, gref, strict=True):
        assert normwise(a, r) <= TOLERANCES[("kernel_grad", "float32")], f"grad {name}"


# L = 27 in 3 chunks of 9 steps (a first, a middle and a last; each row a whole block and a
# tail), a forgetting lane (decay 0), S = 5 (padded slots); 2 batch rows (chunk rows b C + c)
# at L = 24 in 3 chunks of 8 (a whole tangent-map block and checkpoint interval a row: the
# plain backward walks each chunk row's intervals, so 8 steps cost half of 9's 2 intervals).
@pytest.mark.parametrize(
    "shape,C",
    [((1, 27, 2, 5), 3), ((2, 24, 3, 4), 3)],
    ids=["B1-L27-M2-S5-C3-f64", "B2-L24-M3-S4-C3-f64"],
)
def test_chunked_equals_reference_float64(shape, C, monkeypatch):
    check_float64_reference(shape, C, monkeypatch)


@pytest.mark.parametrize(
    "launch",
    [{"slots": 4, "unroll": 8, "NS": 1, "pf": 0},
     pytest.param({"slots": 2, "unroll": 4, "NS": 1, "pf": 1}, marks=pytest.mark.slow),
     pytest.param({"slots": 8, "unroll": 4, "NS": 2, "pf": 0}, marks=pytest.mark.slow)],
    ids=["slots4-unroll8", "slots2-unroll4-pf", "slots8-unroll4-NS2"],
)  # fmt: skip
def test_map_kernel_launches_equal_reference(launch, monkeypatch):
    """The two map kernels at other launch choices (``chunked.MAPS_LAUNCH`` and
    ``TANGENT_LAUNCH``: a thread's slots, the unrolled steps, pipeline stages, L2 prefetch of
    the next block): chunks of 9 steps are a block and a tail of 1 (unroll 8) or 2 blocks and a
    tail of 1 (unroll 4), S = 5 pads to 8 slots. Three chunks (a first, a middle and a last)
    of 9 steps: the launch choices act within a chunk, so more chunks only repeat them."""
    monkeypatch.setattr(chunked, "MAPS_LAUNCH", launch)
    monkeypatch.setattr(chunked, "TANGENT_LAUNCH", launch)
    L, C = 27, 3
    assert L // C == 9 and L % C == 0
    check_float64_reference((1, L, 2, 5), C, monkeypatch)


def test_map_kernels_prefetch_flag(monkeypatch):
    # the chunk maps prefetch; the tangent maps double-buffer in registers instead
    assert chunked._prefetches() and not chunked._prefetches(True)
    monkeypatch.setattr(chunked, "MAPS_LAUNCH", dict(chunked.MAPS_LAUNCH, pf=2))
    with pytest.raises(ValueError, match=r"MAPS_LAUNCH\['pf'\]: expected 0 or 1, got 2"):
        chunked._prefetches()


def test_default_map_launches():
    # the chunk maps: 2 slots a thread, 16 steps a block, L2 prefetch; the tangent maps: 2 slots,
    # 8-step blocks double-buffered in registers (kla-lm-double-buffer-h200.json)
    assert chunked._maps_layout(16)[1] == chunked.MAPS_LAUNCH["slots"] == 2
    assert chunked._maps_layout(16, tangents=True) == (8, 2, 32, 1, 8, 1)  # G SG NT warps W NS
    assert chunked._double_buffered(True) and not chunked._double_buffered()
    assert chunked._prefetches() and not chunked._prefetches(True)


def _spy_tangent_maps(monkeypatch):
    """The list that every launch of the tangent maps kernel appends its ``(DB, HAS_GPREC)``
    to."""
    seen = []
    real = chunked.launch

    def spy(fn, grid, *a, **kw):
        if fn is chunked._adjoint_maps_kernel:
            seen.append((kw["DB"], kw["HAS_GPREC"]))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(chunked, "launch", spy)
    return seen


def test_map_kernels_default_launch_walks_full_blocks(monkeypatch):
    """The default launches on chunks of 35 steps: the chunk maps 2 full 16-step blocks and a
    tail of 3, the tangent maps 4 double-buffered 8-step blocks (2 pairs) and a tail of 3,
    where the other tests' chunks of 9 steps are a block or less and a tail. Two chunks: the
    first chunk's map and the last chunk's tangents walk the blocks (a third chunk repeats
    them). Without the precisions' gradient, which takes the plain loop (``HAS_GPREC``; its
    whole blocks in the chunks of 8 of test_chunked_equals_reference_float64[B2-L24-M3-S4-C3-f64],
    a block and a tail in the chunks of 9 of test_map_kernel_launches_equal_reference): the
    launch spied."""
    assert chunked.MAPS_LAUNCH["unroll"] == 16 and chunked.TANGENT_LAUNCH["unroll"] == 8
    L, C = 70, 2
    assert L // C == 35 and L % C == 0 and (35 // 16, 35 % 16) == (2, 3) and (35 // 8) == 4
    seen = _spy_tangent_maps(monkeypatch)
    check_float64_reference((1, L, 2, 5), C, monkeypatch, precision=False)
    assert seen == [(True, False)]  # the double-buffered loop ran


def test_map_kernel_launch_rejects_other_unrolls(monkeypatch):
    monkeypatch.setattr(chunked, "MAPS_LAUNCH", {"slots": 4, "unroll": 6, "NS": 1})
    with pytest.raises(ValueError, match=r"MAPS_LAUNCH\['unroll'\]: expected 4, 8 or 16, got 6"):
        chunked_runs((1, 36, 2, 4), 4, torch.float64, monkeypatch, plain=False)


# 3 chunks of 8 steps (a first, a middle and a last; one checkpoint interval a chunk row)
@pytest.mark.parametrize("shape,C", [((1, 24, 3, 4), 3)], ids=["B1-L24-M3-S4-C3-f32"])
def test_chunked_float32_equals_unchunked(shape, C, monkeypatch):
    (got, ggot), (plain, gplain), (ref, gref) = chunked_runs(
        shape, C, torch.float32, monkeypatch, seed=3, forget=False
    )
    assert got[0].dtype == torch.float32
    for name, a, b, r in zip(OUTS, got, plain, ref, strict=True):
        assert normwise(a, b) <= 1e-5, f"{name}: chunked vs unchunked {normwise(a, b):.3e}"
        assert normwise(a, r) <= TOLERANCES[("kernel", "float32")], name
    for name, a, b, r in zip(NAMES, ggot, gplain, gref, strict=True):
        assert normwise(a, b) <= 1e-5, f"grad {name}: chunked vs unchunked {normwise(a, b):.3e}"
        assert normwise(a, r) <= TOLERANCES[("kernel_grad", "float32")], f"grad {name}"


# Small decays through the chunked op in float32: the tangent maps' R update goes through
# p / af (chunked._tangent_pa), large where the decay is small, and 0 where it is 0 (forget).
@pytest.mark.parametrize("decay", [0.011, 1e-6, 1e-12, 0.0])
def test_chunked_small_decays(decay, monkeypatch):
    shape, C = (1, 24, 3, 4), 3  # chunks of 8: a first, a middle and a last
    x = make_inputs(*shape, seed=4, forget=False)
    x["decay"][1, 2] = decay
    x["decay"][2] = max(decay, 1e-3)
    w = weights_for(*shape)
    check_float32_reference(x, C, w, monkeypatch)


# Precise observations or huge process noise: a chunk map's 4 unnormalized steps grow by about
# (Lv k^2 p)^4, past float32 from Lv k^2 p near 1e9.5 a step, where the sequential filter is
# exact (p = 1e12 is benchmarks/reliability.py's kla-p-huge regime). The carry then
# walks the lanes' bad chunks step by step (chunked._apply_map, _walk_chunk). Cases: every lane
# in every chunk; one channel in one chunk only (the other lanes and chunks take their maps).
# Chunks of 8 steps: two groups of 4 (the overflow is within one), and the walk's steps.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (the overflow)
@pytest.mark.parametrize("where", ["all", "one-channel-one-chunk"])
@pytest.mark.parametrize("scale,pv", [(1e10, 1.0), (1e14, 50.0), (1.0, 1e12)],
                         ids=["Lv1e10", "Lv1e14-p50", "p1e12"])  # fmt: skip
def test_chunked_precise_observations(where, scale, pv, monkeypatch):
    # chunks of 8: a first, a middle and a last; one batch row (the walk of every lane of 2
    # batch rows, chunk rows b C + c: test_chunked_op_regimes[kla-p-huge])
    shape, C = (1, 24, 3, 4), 3
    x = make_inputs(*shape, seed=6, forget=True)
    if where == "all":
        x["Lv"] = x["Lv"] * scale
        x["process_var"] = torch.full_like(x["process_var"], pv)
    else:
        x["Lv"][:, 8:16, 1] = x["Lv"][:, 8:16, 1] * scale  # chunk 1 (steps 8-15), channel 1
        x["process_var"][1] = pv
    w = weights_for(*shape)
    maps = spy_maps(monkeypatch)
    check_float32_reference(x, C, w, monkeypatch)
    assert len(maps) == 1 and not torch.isfinite(maps[0]).all()  # overflowed: the walk is tested


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (overflows)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("name", list(KLA_REGIMES))
def test_chunked_op_regimes(name, monkeypatch):
    """benchmarks/reliability.py's KLA regimes through the op in 3 time chunks (float32, the
    kernels in the interpreter without a GPU), against the float64 sequential op: the tolerance
    of ``tests/test_extremes.py::test_kla_op_regimes``, no non-finite output. (The p = 1e12
    regime overflowed the chunk maps, which gave NaN, before the carry's walk.)"""
    x = kla_inputs(name, shape=(2, 24, 4, 3))  # 3 chunks of 8 steps: a first, a middle, a last
    ref = kla_filter(**x, backend="sequential")
    monkeypatch.setattr(tuning, "CHUNKS", 3)
    dev = [x[n].to(device=DEVICE, dtype=torch.float32) for n in NAMES[:6]]
    maps = spy_maps(monkeypatch)
    y, yvar, lam, _, _ = (t.cpu().double() if t is not None else t
                          for t in kla_triton(*dev, None, None))  # fmt: skip
    # the regime: p = 1e12 overflows the chunk maps (the carry walks them), the others do not
    assert len(maps) == 1 and bool(torch.isfinite(maps[0]).all()) == (name != "kla-p-huge")
    e = kla_errors(SimpleNamespace(y=y, yvar=yvar, final=SimpleNamespace(lam=lam)), ref)
    tol = tolerance("truth", "float32")
    assert e["nonfinite"] == 0
    assert e["y"] <= tol and e["yvar"] <= tol and e["lam"] <= tol, e


def test_one_step_one_chunk():
    # L = 1: the chunked functions with C = 1 are the plain kernels (no carry)
    shape = (2, 1, 3, 4)
    x = make_inputs(*shape, seed=5, forget=True)
    w = weights_for(*shape)

    def one_chunk(v, Lv, k, q, a, p, lam0, eta0, return_precision):
        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                out = chunked.forward_chunked(*args, True, True, 1)
                ctx.save_for_backward(*args[:6], out[5], out[8])
                ctx.CK = out[6]
                return out[:5]

            @staticmethod
            def backward(ctx, gy, gyv, glT, geT, gprec):
                v, Lv, k, q, a, p, ck, start = ctx.saved_tensors
                return chunked.backward_chunked(v, Lv, k, q, a, p, ck, ctx.CK, start, 1,
                                                gy, gyv, glT, geT, gprec)  # fmt: skip

        return F.apply(v, Lv, k, q, a, p, lam0, eta0)

    (got, ggot), (ref, gref) = (
        run(one_chunk, x, torch.float64, w),
        run(reference, x, torch.float64, w),
    )
    for name, a, b in zip(OUTS, got, ref, strict=True):
        assert_close(a, b, "kernel", torch.float64, what=name)
    for name, a, b in zip(NAMES, ggot, gref, strict=True):
        assert_close(a, b, "kernel_grad", torch.float64, scale=1.0, what=f"grad {name}")


def pretend_two_sms(monkeypatch):
    """A (pretend) device of 2 multiprocessors where chunks may be 4 steps long, so that the
    rule chunks a few short lanes; on the CPU ``backend="triton"`` takes CPU tensors (the
    interpreter runs the kernels)."""
    monkeypatch.setattr(tuning, "sm_count", lambda device: 2)
    monkeypatch.setattr(tuning, "MIN_CHUNK", 4)
    if not CUDA:
        from kalmanscan.core import kla_op

        monkeypatch.setattr(kla_op, "_resolve", lambda backend, device: backend)


def test_auto_rule_takes_the_chunked_path(monkeypatch):
    # few lanes on a (pretend) device of 2 multiprocessors: the rule asks for 2 chunks of 4
    # steps, kla_filter takes them, from the default initial state (which gets no gradient)
    pretend_two_sms(monkeypatch)
    calls = []
    real = autograd.forward_chunked

    def spy(*args):
        calls.append(args[10])  # C (then var)
        return real(*args)

    monkeypatch.setattr(autograd, "forward_chunked", spy)
    x = make_inputs(1, 8, 3, 4, seed=7)
    assert tuning.chunks_for(3 * 4, 8, 2) == 2
    leaves = {n: x[n].float().requires_grad_(True) for n in NAMES[:6]}
    res = kla_filter(**leaves, backend="triton")
    (res.y.sum() + res.yvar.sum() + res.final.eta.sum()).backward()
    assert calls == [2]
    ref_leaves = {n: x[n].double().requires_grad_(True) for n in NAMES[:6]}
    ref = kla_filter(**ref_leaves, backend="sequential")
    (ref.y.sum() + ref.yvar.sum() + ref.final.eta.sum()).backward()
    assert normwise(res.y, ref.y) <= TOLERANCES[("kernel", "float32")]
    for n in NAMES[:6]:
        err = normwise(leaves[n].grad, ref_leaves[n].grad)
        assert err <= TOLERANCES[("kernel_grad", "float32")], f"grad {n}: {err:.3e}"
    # without gradients: the forward alone, also chunked
    with torch.no_grad():
        again = kla_filter(**{n: t.detach() for n, t in leaves.items()}, backend="triton")
    assert calls == [2, 2]
    # the same chunks without checkpoints: another specialization of the forward kernel, whose
    # compiled arithmetic may round differently (7.8e-8 on the H200; 0 in the interpreter)
    assert normwise(again.y, res.y) <= TOLERANCES[("rounding", "float32")]


@pytest.mark.parametrize(
    "lanes,L,sms,want",
    [
        (8 * 1024 * 16, 2048, 132, 1),  # the lanes fill the device: no chunks
        (4 * 960 * 16, 2048, 132, 1),  # 61,440 lanes: 465 an SM, no chunks
        (2 * 1024 * 16, 8192, 132, 16),  # 32,768 lanes: ceil(33) chunks of >= 512 steps: 16
        (1 * 1024 * 16, 32768, 132, 64),  # ceil(66) -> MAX_CHUNKS
        (1 * 1024 * 16, 131072, 132, 64),
        (1 * 256 * 16, 32768, 132, 64),  # 4,096 lanes: MAX_CHUNKS
        (1 * 2048 * 16, 34650, 132, 33),  # the largest divisor of 34650 up to ceil(33)
        (1 * 64 * 16, 2048, 132, 4),  # chunks of at least MIN_CHUNK = 512 steps
        (1 * 1024 * 16, 511, 132, 1),
        (16, 4099, 132, 1),  # 4099 is prime
        (16, 63 * 512, 132, 63),
        (16, 4096, 0, 1),  # not a CUDA device
    ],
    ids=["8x2048", "4x2048-M960", "2x8192", "1x32768", "1x131072", "4096-lanes",
         "1x34650", "min-chunk", "short", "prime", "divisor", "cpu"],
)  # fmt: skip
def test_chunks_for(lanes, L, sms, want):
    assert tuning.chunks_for(lanes, L, sms) == want


def test_chunks_override(monkeypatch):
    monkeypatch.setattr(tuning, "CHUNKS", 3)
    assert tuning.chunks_for(16, 63, 132) == 3
    with pytest.raises(ValueError, match="tuning.CHUNKS: expected a positive divisor of L=64"):
        tuning.chunks_for(16, 64, 132)


@pytest.mark.skipif(not CUDA, reason="long sequences need a GPU")
@pytest.mark.parametrize("shape", [(1, 4096, 64, 16), (2, 3000, 33, 12)],
                         ids=["B1-L4096-M64-S16", "B2-L3000-M33-S12"])  # fmt: skip
def test_gpu_rule_chunks_long_sequences(shape, monkeypatch):
    # the rule on the device chunks these (few lanes, long L); float32 equals the unchunked
    # kernels to 1e-5 and the float64 chunked op equals the sequential reference
    B, L, M, S = shape
    dev = torch.device("cuda")
    C = tuning.chunks_for(B * M * S, L, tuning.sm_count(dev))
    assert C > 1
    x = make_inputs(*shape, seed=9, forget=True)
    w = weights_for(*shape)
    got, ggot = run(kla_triton, x, torch.float32, w)
    got64, ggot64 = run(kla_triton, x, torch.float64, w)
    monkeypatch.setattr(tuning, "CHUNKS", 1)
    plain, gplain = run(kla_triton, x, torch.float32, w)
    # the sequential reference on the CPU: a step is a few small operations, which the GPU
    # launches one by one (minutes for these lengths beside the other test workers)
    cpu = torch.device("cpu")
    ref, gref = run(reference, {n: t.to(cpu) for n, t in x.items()}, torch.float64,
                    [t.to(cpu) for t in w])  # fmt: skip
    ref, gref = [r.to(dev) for r in ref], [g.to(dev) for g in gref]
    for name, a, b, a64, r in zip(OUTS, got, plain, got64, ref, strict=True):
        assert normwise(a, b) <= 1e-5, f"{name}: chunked vs unchunked {normwise(a, b):.3e}"
        assert_close(a64, r, "kernel", torch.float64, what=name)
    for name, a, b, a64, r in zip(NAMES, ggot, gplain, ggot64, gref, strict=True):
        assert normwise(a, b) <= 1e-5, f"grad {name}: chunked vs unchunked {normwise(a, b):.3e}"
        scale = max(r.abs().max().item(), 1.0)
        assert_close(a64, r, "kernel_grad", torch.float64, scale=scale, what=f"grad {name}")


def test_chunked_without_variance(monkeypatch):
    """``return_variance=False`` in time chunks: ``yvar`` None, the tangent maps launched with
    ``HAS_GYV=False`` (the backward kernel's flag: ``test_cuda_kla``), and the outputs and
    gradients equal bit for bit to those of a loss that gives ``yvar`` a zero weight (whose
    zero gradient they read)."""
    pretend_two_sms(monkeypatch)
    seen = []
    real = chunked.launch

    def spy(fn, grid, *a, **kw):
        if fn is chunked._adjoint_maps_kernel:
            seen.append(kw["HAS_GYV"])
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(chunked, "launch", spy)
    x = make_inputs(1, 8, 3, 4, seed=9)  # 2 chunks of 4: the tangent maps walk the last
    assert tuning.chunks_for(3 * 4, 8, 2) == 2
    out = {}
    for var in (True, False):
        leaves = {n: x[n].float().requires_grad_(True) for n in NAMES[:6]}
        res = kla_filter(**leaves, return_variance=var, backend="triton")
        assert (res.yvar is None) == (not var)
        loss = (res.y * res.y).sum() + res.final.eta.sum()
        if var:
            loss = loss + (0.0 * res.yvar).sum()
        out[var] = [res.y, res.final.lam, *torch.autograd.grad(loss, list(leaves.values()))]
    assert seen == [True, False]  # the tangent maps: with, then without the zero gradient
    for a, b in zip(out[True], out[False], strict=True):
        if CUDA:  # the variants' machine code may fuse multiply-adds differently (ptxas), as
            # in test_cuda_kla.test_without_variance; the chunk's sums carry a difference on:
            # 7.7 ulps measured on the H200 (2026-12-02), to 32 here
            eps = torch.finfo(b.dtype).eps
            torch.testing.assert_close(a, b, rtol=32 * eps, atol=32 * eps * float(b.abs().max()))
        else:  # the interpreter runs the same numpy operations: bit for bit
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("unroll,slots", [(4, 1), (8, 1), (4, 2)], ids=["4x1", "8x1", "4x2"])
def test_tangent_maps_double_buffered_equal_reference(unroll, slots, monkeypatch):
    """The tangent maps with their inputs double-buffered in registers (``"db"`` of
    ``TANGENT_LAUNCH``) at other blocks and slots than the default's (8 steps, 2 slots:
    test_map_kernels_default_launch_walks_full_blocks): chunks of 5 blocks and 3 steps walk
    two pairs (the first pair loads the second's first block), the odd last block and a tail of
    3; two chunks (the tangent maps walk every chunk but the first the same way: the last here,
    as a middle one); the float64 reference's outputs and gradients. Without the precisions'
    gradient: with it (``HAS_GPREC``) the kernel takes the plain loop, not the double buffer
    (the launch spied)."""
    monkeypatch.setattr(chunked, "TANGENT_LAUNCH",
                        dict(chunked.TANGENT_LAUNCH, unroll=unroll, slots=slots, db=1))  # fmt: skip
    C, Lc = 2, 5 * unroll + 3
    assert chunked._double_buffered(True)
    assert (Lc // unroll // 2, Lc // unroll % 2, Lc % unroll) == (2, 1, 3)  # pairs, odd, tail
    seen = _spy_tangent_maps(monkeypatch)
    check_float64_reference((1, C * Lc, 2, 5), C, monkeypatch, precision=False)
    assert seen == [(True, False)]  # the double-buffered loop ran


def test_double_buffer_flag_is_checked(monkeypatch):
    monkeypatch.setattr(chunked, "TANGENT_LAUNCH", dict(chunked.TANGENT_LAUNCH, db=1, unroll=16))
    with pytest.raises(ValueError, match=r"TANGENT_LAUNCH\['db'\]: needs 'unroll' 4 or 8, got 16"):
        chunked._double_buffered(True)
    monkeypatch.setattr(chunked, "MAPS_LAUNCH", dict(chunked.MAPS_LAUNCH, db=1))
    no_db = r"MAPS_LAUNCH\['db'\]: expected 0 \(the chunk maps take no double buffer\), got 1"
    with pytest.raises(ValueError, match=no_db):
        chunked._double_buffered()
    monkeypatch.setattr(chunked, "TANGENT_LAUNCH", dict(chunked.TANGENT_LAUNCH, db=2))
    with pytest.raises(ValueError, match=r"TANGENT_LAUNCH\['db'\]: expected 0 or 1, got 2"):
        chunked._double_buffered(True)


def test_map_kernel_register_cap(monkeypatch):
    # "maxnreg" of a map kernel's launch: a compile option for its launch (0: ptxas's choice);
    # the results do not change (interpreted here, where the option is taken and ignored: the
    # same arithmetic, on 2 chunks of 8)
    assert chunked._reg_cap(True) == {} and chunked._reg_cap() == {}
    monkeypatch.setattr(chunked, "TANGENT_LAUNCH", dict(chunked.TANGENT_LAUNCH, maxnreg=96))
    assert chunked._reg_cap(True) == {"maxnreg": 96}
    seen = []
    real = chunked.launch

    def spy(fn, grid, *a, **kw):
        if fn is chunked._adjoint_maps_kernel:
            seen.append(kw.get("maxnreg"))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(chunked, "launch", spy)
    # chunks of 9 (a block and a tail) on a GPU
    shape, C = ((1, 27, 3, 4), 3) if CUDA else ((1, 16, 3, 4), 2)
    check_float64_reference(shape, C, monkeypatch)
    assert seen == [96]
    monkeypatch.setattr(chunked, "MAPS_LAUNCH", dict(chunked.MAPS_LAUNCH, maxnreg=8))
    with pytest.raises(ValueError, match=r"MAPS_LAUNCH\['maxnreg'\]: expected 0 or an int"):
        chunked._reg_cap()
