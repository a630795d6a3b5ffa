"""The fused Triton KLA kernels (kalmanscan/cuda/kla/) against the sequential reference in
float64, forward and backward, for every input (v, Lv, k, q, decay, process_var, lam0, eta0) and
every output (y, yvar, final state, precisions). Without CUDA they run under TRITON_INTERPRET=1
at small sizes. Outputs are NaN-poisoned before every launch so an unwritten element fails.
"""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kalmanscan.core.kla_op import kla_filter, kla_filter_sequential  # noqa: E402
from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda import kla as K  # noqa: E402
from kalmanscan.cuda.kla import forward, kla_triton, tuning  # noqa: E402
from kalmanscan.cuda.kla.device import _pick, _row  # noqa: E402
from kalmanscan.testing import TOLERANCES, assert_close  # noqa: E402
from tests.helpers import kla_inputs, triton_interpreted  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


NAMES = ("v", "Lv", "k", "q", "decay", "process_var", "lam0", "eta0")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    # tests/conftest.py sets TRITON_INTERPRET=1 before triton's first import when there is no GPU
    assert CUDA or triton_interpreted(forward._kla_fwd_kernel), (
        "the Triton kernels must run in the interpreter on the CPU"
    )
    monkeypatch.setattr(_common, "POISON", True)


def make_inputs(B, L, M, S, seed=0, forget=False):
    x = kla_inputs(B, L, M, S, seed, forget)
    return {n: t.to(DEVICE) for n, t in x.items()}


def run(fn, x, dtype, weights, precision=True):
    leaves = {n: t.detach().to(dtype).requires_grad_(True) for n, t in x.items()}
    y, yvar, lam, eta, prec = fn(*leaves.values(), return_precision=precision)
    outs = [y, yvar, lam, eta] + ([prec] if precision else [])
    loss = sum((w.to(o.dtype) * o).sum() for w, o in zip(weights, outs, strict=False))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return outs, grads


def reference(*args, return_precision):
    r = kla_filter_sequential(*args, return_precision=return_precision)
    return r.y, r.yvar, r.final.lam, r.final.eta, r.precision


def weights_for(B, L, M, S):
    g = torch.Generator().manual_seed(11)
    shapes = [(B, L, M), (B, L, M), (B, M, S), (B, M, S), (B, L, M, S)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(DEVICE) for s in shapes]


if CUDA:
    SHAPES = [
        (1, 1, 1, 1),
        (2, 63, 5, 16),
        (1, 1000, 33, 16),
        (2, 300, 7, 64),
        (3, 130, 129, 1),
        (2, 77, 9, 12),
    ]  # S = 12: the reduce-scatter's padded slots
else:
    SHAPES = [(1, 1, 1, 1), (2, 63, 3, 4), (1, 9, 3, 16), (1, 6, 1, 64), (1, 1000, 1, 1)]

# The interpreter walks a lane step by step in Python: the 1000-step lane costs about 20 s a
# case there, so it runs in the slow step of CI (`pytest -m slow`); L = 63 keeps several blocks,
# intervals and the tail in the default run. On a GPU every shape is quick.
SHAPE_PARAMS = [
    pytest.param(s, marks=pytest.mark.slow) if not CUDA and s[1] >= 1000 else s for s in SHAPES
]


def _slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


def normwise(a, b):
    """``||a - b|| / ||b||`` in float64 (for signed sums that can cancel to near 0)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def assert_exact_in_float64(shape, seed):
    """The kernel's outputs and every gradient equal the sequential reference's in float64."""
    x = make_inputs(*shape, seed=seed, forget=True)
    w = weights_for(*shape)
    got, ggot = run(kla_triton, x, torch.float64, w)
    ref, gref = run(reference, x, torch.float64, w)
    for name, a, b in zip(("y", "yvar", "lam", "eta", "precision"), got, ref, strict=True):
        assert_close(a, b, "kernel", torch.float64, what=name)
    for name, a, b in zip(NAMES, ggot, gref, strict=True):
        # gradients of the initial state decay like prod(alpha^2) and are exactly 0 behind a
        # forgetting step (the reference leaves rounding there): entries below 1e-3 are
        # compared absolutely, to 1e-11
        scale = max(b.abs().max().item(), 1.0)
        assert_close(a, b, "kernel_grad", torch.float64, scale=scale, what=f"grad {name}")


@pytest.mark.parametrize("shape", SHAPE_PARAMS, ids=lambda s: "B{}-L{}-M{}-S{}".format(*s))
def test_forward_backward_float64(shape):
    assert_exact_in_float64(shape, seed=0)


def test_forward_without_gradients_float64():
    # without gradients the forward runs 8-step blocks and saves no checkpoints (with them,
    # 4-step blocks): both exact in float64, on lengths with whole blocks, a tail, or no block.
    # The interpreter walks the blocks one by one (it has no pipeline stages): 2 whole blocks
    # and the longest tail (7) there, 7 blocks and the tail on a GPU (NS = 5 stages)
    for shape in [(2, 63 if CUDA else 23, 3, 4), (1, 16, 3, 16), (1, 9, 2, 8), (1, 7, 1, 1)]:
        x = make_inputs(*shape, seed=7, forget=True)
        with torch.no_grad():
            got = kla_triton(*x.values(), return_precision=True)
        ref = reference(*x.values(), return_precision=True)
        for name, a, b in zip(("y", "yvar", "lam", "eta", "precision"), got, ref, strict=True):
            assert_close(a, b, "kernel", torch.float64, what=f"{name} {shape}")


# The kernels' choices from 2^17 lanes (tuning.LARGE) on: 4 slots a thread in the backward,
# the rerun of an 8-step interval's first half and L2 prefetch 32 steps back. LARGE = 1 gives
# them to the small shapes the interpreter runs.
@pytest.mark.parametrize("shape", [(2, 63, 3, 4), (1, 9, 3, 16), _slow((1, 6, 1, 64)),
                                   _slow((2, 37, 5, 12))],
                         ids=lambda s: "B{}-L{}-M{}-S{}".format(*s))  # fmt: skip
def test_forward_backward_float64_many_lanes(shape, monkeypatch):
    monkeypatch.setattr(tuning, "LARGE", 1)
    tu = tuning.tuning_for(shape[0] * shape[2] * shape[3])
    assert (tu["ck"], tu["bwd_rerun"], tu["bwd_slots"]) == (8, True, 4)
    assert_exact_in_float64(shape, seed=1)


# The entries of TUNING a benchmark may sweep, at values no shape takes by default; each must
# give the reference's results (L not a multiple of the blocks nor of the intervals).
TUNINGS = [{"bwd_slots": 4}, {"ck": 4}, {"fwd_slots": 2, "bwd_slots": 2}, {"fwd_slots": 8},
           {"fwd_slots": 1, "bwd_slots": 1, "NS": 2, "bwd_NS": 1}, {"bwd_l2_ahead": 16},
           {"bwd_slots": 4, "ck": 8, "bwd_l2_ahead": 32, "bwd_rerun": False},
           {"bwd_slots": 4, "ck": 4, "bwd_rerun": False},
           {"bwd_slots": 2, "ck": 8, "bwd_rerun": True}]  # fmt: skip


@pytest.mark.parametrize("shape", [(2, 13, 3, 4), (1, 16, 2, 16)],
                         ids=lambda s: "B{}-L{}-M{}-S{}".format(*s))  # fmt: skip
def test_rerun_backward_is_exact(shape, monkeypatch):
    """8-step intervals whose first half the backward recomputes after walking back the
    second (``TUNING["bwd_rerun"]``, 4 slots a thread): the reference's results, with a partial
    last interval after a whole one (L = 13) and without (16; 4 threads a channel there)."""
    monkeypatch.setitem(tuning.TUNING, "ck", 8)
    monkeypatch.setitem(tuning.TUNING, "bwd_rerun", True)
    monkeypatch.setitem(tuning.TUNING, "bwd_slots", 4)
    B, L, M, S = shape
    assert tuning.plan(K.backward._bwd_plan, B, L, M, S, 8)["consts"]["RERUN"] is True
    assert_exact_in_float64(shape, seed=5)


@pytest.mark.slow  # the sweep of TUNING's entries (about 2 min interpreted)
@pytest.mark.parametrize("L", [2, 13, 37] if not CUDA else [5, 1003])
@pytest.mark.parametrize(
    "tuning_", TUNINGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items())
)
def test_every_tuning_is_exact(tuning_, L, monkeypatch):
    for key, value in tuning_.items():
        monkeypatch.setitem(tuning.TUNING, key, value)
    assert_exact_in_float64((2, L, 37, 16) if CUDA else (2, L, 3, 4), seed=3)


def test_tuning_follows_the_lane_count(monkeypatch):
    # the choices by lane count B M S (tuning.tuning_for); explicit TUNING entries win
    few, many = tuning.tuning_for(4 * 960 * 16), tuning.tuning_for(8 * 2048 * 16)
    assert (few["fwd_slots"], few["bwd_slots"], few["bwd_NS"], few["NS"]) == (4, 2, 3, 5)
    assert (many["fwd_slots"], many["bwd_slots"], many["bwd_NS"], many["NS"]) == (4, 4, 3, 5)
    assert (few["ck"], many["ck"], few["bwd_l2_ahead"], many["bwd_l2_ahead"]) == (8, 8, 0, 32)
    # the L2 prefetch from LARGE lanes of at least L2_AHEAD_M channels (the LM's M = 1024: none)
    lm = 8 * 1024 * 16
    assert tuning.tuning_for(lm, channels=1024)["bwd_l2_ahead"] == 0
    assert tuning.tuning_for(lm, channels=tuning.L2_AHEAD_M)["bwd_l2_ahead"] == 32
    assert tuning.tuning_for(4 * 960 * 16, channels=4096)["bwd_l2_ahead"] == 0
    assert tuning.tuning_for(tuning.LARGE - 1)["bwd_rerun"] is False
    assert tuning.tuning_for(tuning.LARGE)["bwd_rerun"] is True
    # half inputs keep 4-step intervals from LARGE lanes (no rerun then)
    assert tuning.tuning_for(tuning.LARGE, half=True)["ck"] == 4
    assert tuning.tuning_for(tuning.LARGE - 1, half=True)["ck"] == 8
    assert (tuning.block_steps(True), tuning.block_steps(False)) == (4, 8)
    assert tuning.layout(16, 4) == (4, 4, 32, 1)
    assert tuning.layout(12, 2) == (8, 2, 32, 1)  # 12 slots padded to 16
    assert tuning.layout(64, 1) == (32, 2, 32, 1)  # at most 32 threads: 2 slots a thread
    monkeypatch.setitem(tuning.TUNING, "bwd_slots", 4)
    assert tuning.tuning_for(4 * 960 * 16)["bwd_slots"] == 4
    monkeypatch.setitem(tuning.TUNING, "ck", 6)
    with pytest.raises(ValueError, match=r"TUNING\['ck'\]: expected 4 or 8, got 6"):
        tuning.tuning_for(64)


def test_launch_plans_follow_tuning(monkeypatch):
    # the kept launch plans are keyed by TUNING and LARGE as they are at the call: a change of
    # either gives a new plan, not a stale one
    key = (2, 19, 3, 4, True)
    few = tuning.plan(forward._fwd_plan, *key)
    assert (few["CK"], few["NB"], few["consts"]["W"]) == (8, 3, 4)
    bkey = (2, 19, 3, 4, 8)
    assert tuning.plan(K.backward._bwd_plan, *bkey)["consts"]["RERUN"] is False
    monkeypatch.setattr(tuning, "LARGE", 1)
    assert tuning.plan(K.backward._bwd_plan, *bkey)["consts"]["RERUN"] is True
    monkeypatch.setitem(tuning.TUNING, "ck", 4)
    many = tuning.plan(forward._fwd_plan, *key)
    assert (many["CK"], many["NB"]) == (4, 5)
    monkeypatch.setitem(tuning.TUNING, "ck", 8)
    assert tuning.plan(forward._fwd_plan, *key)["CK"] == 8
    assert tuning.plan(forward._fwd_plan, 2, 19, 3, 4, False)["consts"]["W"] == 8
    # the register cap: the float32 forward without checkpoints, at up to 32 padded slots
    assert tuning.plan(forward._fwd_plan, 2, 19, 3, 4, False)["consts"]["maxnreg"] == 128
    for capless in [(2, 19, 3, 4, True), (2, 19, 3, 4, False, False), (2, 19, 3, 64, False)]:
        assert "maxnreg" not in tuning.plan(forward._fwd_plan, *capless)["consts"], capless
    monkeypatch.setitem(tuning.TUNING, "fwd_maxnreg", 0)
    assert "maxnreg" not in tuning.plan(forward._fwd_plan, 2, 19, 3, 4, False)["consts"]


# The forward launch at the benchmark shapes (benchmarks/gpu.py: "fwd" without gradients, the
# forward of "fwd+bwd" saving checkpoints), as the pre-split module (2a505ed~1,
# kalmanscan/cuda/kla.py) launched it: grid, the kernel's integers L, M, NB, S and every
# constexpr. The constexprs it had beyond these took the paths the kernel now always takes:
# PREFETCH=False, CHUNKED=False (grid depth 1, CL=L), AHEAD=0, BLOCK_PIPE, OUT_SCATTER,
# IN_TILE, KQ_TILE, LEAN all True, FORM=1. Added since: the register cap of the float32
# no-gradient forward (tuning's fwd_maxnreg, a compile option). Changed since: checkpoints every
# 8 steps at many lanes too (CK 4, NB 512 then; the backward reruns half an interval instead).
BENCH_LAUNCHES = {
    ((8, 2048, 2048, 16), False): ((256, 8), (2048, 2048, 256, 16),
                                   dict(CK=8, W=8, maxnreg=128)),
    ((8, 2048, 2048, 16), True): ((256, 8), (2048, 2048, 256, 16), dict(CK=8, W=4)),
    ((4, 2048, 960, 16), False): ((120, 4), (2048, 960, 256, 16), dict(CK=8, W=8, maxnreg=128)),
    ((4, 2048, 960, 16), True): ((120, 4), (2048, 960, 256, 16), dict(CK=8, W=4)),
}  # fmt: skip


@pytest.mark.parametrize(
    "shape, grad", list(BENCH_LAUNCHES), ids=lambda v: "B{}-L{}-M{}-S{}".format(*v) if
    isinstance(v, tuple) else ("grad" if v else "no-grad"),
)  # fmt: skip
def test_forward_launch_at_the_benchmark_shapes(shape, grad, monkeypatch):
    # meta tensors: the launch is recorded, nothing is allocated or run
    B, L, M, S = shape
    launches = []
    monkeypatch.setattr(forward, "launch", lambda fn, grid, *a, **kw: launches.append(
        (fn, tuple(grid), tuple(x for x in a if isinstance(x, int)), kw)))  # fmt: skip
    sizes = dict(v=(B, L, M), Lv=(B, L, M), k=(B, L, S), q=(B, L, S), decay=(M, S),
                 process_var=(M, S))  # fmt: skip
    x = {n: torch.empty(s, device="meta").requires_grad_(True) for n, s in sizes.items()}
    with torch.set_grad_enabled(grad):  # the benchmark's "fwd" runs under torch.no_grad()
        kla_triton(*x.values(), None, None)
    grid, ints, consts = BENCH_LAUNCHES[(shape, grad)]
    assert launches == [(forward._kla_fwd_kernel, grid, ints,
                         dict(SAVE_PREC=False, SAVE_CK=grad, VAR=True, NS=5, G=4, SG=4, NT=32,
                              EVEN_M=True, num_warps=1, **consts))]  # fmt: skip


@pytest.mark.parametrize("many_lanes", [False, True], ids=["few-lanes", "many-lanes"])
def test_float32_against_float64_reference(many_lanes, monkeypatch):
    if many_lanes:
        monkeypatch.setattr(tuning, "LARGE", 1)
    # (interpreted: 3 checkpoint intervals, the last partial, and 5 forward blocks)
    shape = (4, 1000, 96, 16) if CUDA else (1, 20, 3, 4)
    x = make_inputs(*shape, seed=2)
    w = weights_for(*shape)
    got, ggot = run(kla_triton, x, torch.float32, w, precision=False)
    ref, gref = run(reference, x, torch.float64, w, precision=False)
    assert got[0].dtype == torch.float32
    # y is a signed sum over slots whose terms can cancel to near 0: its error is measured
    # normwise (||got - ref|| / ||ref||); the other outputs entrywise
    err_y = normwise(got[0], ref[0])
    assert err_y <= TOLERANCES[("kernel", "float32")], f"y: normwise relative error {err_y:.3e}"
    for name, a, b in zip(("yvar", "lam", "eta"), got[1:], ref[1:], strict=True):
        assert_close(a, b, "kernel", torch.float32, scale=b.abs().mean(), what=name)
    for name, a, b in zip(NAMES, ggot, gref, strict=True):
        # gradients are sums over time of signed terms too: normwise
        err = normwise(a, b)
        assert err <= TOLERANCES[("kernel_grad", "float32")], f"grad {name}: normwise {err:.3e}"


def assert_float32_grads(got, other, ref, what):
    """Float32 gradients within 1e-5 (normwise) of another computation's and within the
    kernel tolerance of the float64 reference's."""
    for name, a, b, r in zip(NAMES, got, other, ref, strict=True):
        assert normwise(a, b) <= 1e-5, f"grad {name}: {what} {normwise(a, b):.3e}"
        err = normwise(a, r)
        assert err <= TOLERANCES[("kernel_grad", "float32")], f"grad {name}: normwise {err:.3e}"


def kernel_and_reference_runs(S, seed, precision, L=11):
    """The inputs and ``(outputs, gradients)`` of the kernel in float32, in float64 and of the
    float64 reference, on a shape whose L is not a multiple of the blocks nor intervals and
    whose M is not a multiple of a program's channels (interpreted: ``L`` steps, by default 11,
    2 blocks of 4 or one of 8 and a tail, a whole checkpoint interval and a partial one)."""
    assert L % 4
    shape = (2, 203, 21, S) if CUDA else (1, L, 5, S)
    x = make_inputs(*shape, seed=seed)
    w = weights_for(*shape)
    runs = [run(fn, x, dtype, w, precision=precision) for fn, dtype in
            ((kla_triton, torch.float32), (kla_triton, torch.float64),
             (reference, torch.float64))]  # fmt: skip
    return x, *runs


# The sums over channels of gk, gq are reduce-scattered over the warp in float32 where a
# thread's 2 SG values match its slot group's threads (S of 9 to 16 at 2 or 4 slots a thread),
# else summed by tl.sum (float64, other S). S = 12: padded slots.
@pytest.mark.parametrize("slots,S", [(2, 16), (2, 12), (4, 16), _slow(4, 12), _slow(2, 32)],
                         ids=lambda v: str(v))  # fmt: skip
def test_scatter_channel_sums_float32(slots, S, monkeypatch):
    # float32 gradients (reduce-scatter) against the float64 kernel's (tl.sum) and against the
    # float64 reference; the interpreter moves values between lanes by indexing. The sums are
    # stored step by step, whatever the interval: 4-step checkpoint intervals (TUNING["ck"] 4)
    # over 5 steps, a whole one (unmasked steps) and a partial one (masked), half the steps
    # the two 8-step intervals of 11 walk
    monkeypatch.setitem(tuning.TUNING, "bwd_slots", slots)
    monkeypatch.setitem(tuning.TUNING, "ck", 4)
    _, (_, g_scatter), (_, g_sum), (_, gref) = kernel_and_reference_runs(S, seed=5, precision=False,
                                                                         L=5)  # fmt: skip
    assert_float32_grads(g_scatter, g_sum, gref, "float32 scatter against float64 tl.sum")


# The sums over channels of gk, gq: every program adds its channels' sums into [B, L, S] by
# float32 atomics; under torch.use_deterministic_algorithms it stores them as per-program
# partial sums that one torch sum adds in a fixed order. Both exact (float64 reference), both
# with several programs a batch row (M = 20 channels); S = 16 takes the float32 reduce-scatter,
# S = 4 tl.sum. The sums are stored step by step, whatever the interval: 4-step checkpoint
# intervals (TUNING["ck"] 4) over 5 steps, a whole one (unmasked steps) and a partial one
# (masked), half the steps the two 8-step intervals of 9 walk.
@pytest.mark.parametrize("S", [4, 16])
def test_channel_sums_atomic_or_deterministic(S, monkeypatch):
    seen = []
    real = K.backward.launch

    def spy(fn, grid, *a, **kw):
        seen.append((kw["ATOMIC"], grid[0]))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(K.backward, "launch", spy)
    monkeypatch.setitem(tuning.TUNING, "ck", 4)
    shape = (2, 5, 20, S)
    x = make_inputs(*shape, seed=4)
    w = weights_for(*shape)
    _, gref = run(reference, x, torch.float64, w)
    grads = {}
    was = torch.are_deterministic_algorithms_enabled()
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        try:
            for dtype in (torch.float64, torch.float32):
                grads[deterministic, dtype] = run(kla_triton, x, dtype, w)[1]
        finally:
            torch.use_deterministic_algorithms(was)
    assert [a for a, _ in seen] == [True, True, False, False]
    assert all(programs >= 2 for _, programs in seen)
    for (_, dtype), g in grads.items():
        for name, a, b in zip(NAMES, g, gref, strict=True):
            scale = max(b.abs().max().item(), 1.0)
            assert_close(a, b, "kernel_grad", dtype, scale=scale, what=f"grad {name} {dtype}")
    # the two ways differ only in the order of the float32 additions
    for a, b in zip(grads[False, torch.float32], grads[True, torch.float32], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


# The forward's blocks store y, yvar by a reduce-scatter over a channel's G threads in float32
# when G is 4 or 8, else step by step (float64, G of 1 or 2); the backward stores gv, gLv the
# same way. S = 16 at 4 slots: G = 4; at 2 slots: G = 8; S = 8: G = 2; S = 12: padded slots.
@pytest.mark.parametrize("slots,S", [(4, 16), (4, 8), (2, 16), _slow(4, 12), _slow(4, 32)],
                         ids=lambda v: str(v))  # fmt: skip
def test_scatter_outputs_float32(slots, S, monkeypatch):
    # float32 outputs and gradients against the float64 kernel (per-step stores) and the
    # float64 reference, with and without gradients (4- and 8-step blocks); L is not a
    # multiple of the blocks and M not of a program's channels
    monkeypatch.setitem(tuning.TUNING, "fwd_slots", slots)
    monkeypatch.setitem(tuning.TUNING, "bwd_slots", slots)
    x, (got, ggot), (f64, g64), (ref, gref) = kernel_and_reference_runs(S, seed=6, precision=True)
    assert_float32_grads(ggot, g64, gref, "float32 scatter against float64 per-step")
    with torch.no_grad():
        infer = kla_triton(*(t.float() for t in x.values()), return_precision=True)
    for name, a, i, b, r in zip(("y", "yvar", "lam", "eta", "precision"), got, infer, f64, ref,
                                strict=True):  # fmt: skip
        assert torch.isfinite(a).all() and torch.isfinite(i).all(), f"{name}: not finite"
        assert normwise(a, b) <= 1e-6, f"{name}: float32 against float64 {normwise(a, b):.3e}"
        assert normwise(i, b) <= 1e-6, f"{name}: 8-step blocks {normwise(i, b):.3e}"
        assert normwise(a, r) <= 1e-5, f"{name}: against the reference {normwise(a, r):.3e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("l2_ahead", [0, 8], ids=["no-prefetch", "l2-prefetch"])
def test_half_inputs_compute_in_float32(dtype, l2_ahead, monkeypatch):
    if not CUDA:  # let backend="triton" take CPU tensors (the interpreter runs the kernel)
        from kalmanscan.core import kla_op

        monkeypatch.setattr(kla_op, "_resolve", lambda backend, device: backend)
    # the backward's L2 prefetch addresses half inputs and float32 gradients in one instruction
    monkeypatch.setitem(tuning.TUNING, "bwd_l2_ahead", l2_ahead)
    # interpreted: 12 steps where the prefetch 8 steps back reaches rows (the second interval),
    # else 7 (one partial interval)
    shape = (2, 100, 8, 16) if CUDA else (1, 12 if l2_ahead else 7, 3, 4)
    x = {n: t.to(dtype) for n, t in make_inputs(*shape, seed=4).items()}
    got = kla_filter(**x, backend="triton")
    assert got.y.dtype == torch.float32
    # gradients reach the half inputs, as float32 inputs holding the same values get them
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    leaves32 = {n: t.float().requires_grad_(True) for n, t in x.items()}
    for xs in (leaves, leaves32):
        r = kla_filter(**xs, backend="triton")
        (r.y.sum() + 0.5 * r.yvar.sum()).backward()
    for n in x:
        assert leaves[n].grad.dtype == dtype, n
        err = normwise(leaves[n].grad.float(), leaves32[n].grad.to(dtype).float())
        assert err <= 1e-2, f"grad {n}: {err:.3e} against float32 inputs"
    # computing in float32 means: the same result as float32 inputs holding the same values
    same = kla_filter(**{n: t.float() for n, t in x.items()}, backend="triton")
    pairs = zip((got.y, got.yvar, *got.final), (same.y, same.yvar, *same.final), strict=True)
    for name, (a, b) in zip(("y", "yvar", "lam", "eta"), pairs, strict=True):
        err = normwise(a, b)
        assert err <= 1e-6, (name, err)
    # and float32 accuracy against float64 on those values (normwise, as for float32 inputs)
    ref = kla_filter(**{n: t.double() for n, t in x.items()}, backend="sequential")
    err = normwise(got.y, ref.y)
    assert err <= TOLERANCES[("kernel", "float32")], f"y: normwise relative error {err:.3e}"


@pytest.mark.parametrize("many_lanes", [False, True], ids=["few-lanes", "many-lanes"])
def test_default_initial_state(monkeypatch, many_lanes):
    # lam0, eta0 None: the kernel starts from (1, 0), kept tensors that it only reads; the
    # result and every gradient must equal those from explicit ones and zeros, the state gets
    # no gradient, and the kept tensors stay (1, 0)
    if many_lanes:
        monkeypatch.setattr(tuning, "LARGE", 1)
    # 5 steps: a whole 4-step block and a tail with gradients, a tail of 5 without (the state
    # is read before the first block), one partial checkpoint interval in the backward
    x = make_inputs(2, 5, 3, 4, seed=12)
    x["lam0"] = torch.ones_like(x["lam0"])
    x["eta0"] = torch.zeros_like(x["eta0"])
    w = weights_for(2, 5, 3, 4)
    outs = {}
    for default in (False, True):
        leaves = {n: t.detach().clone().requires_grad_(n not in ("lam0", "eta0"))
                  for n, t in x.items()}  # fmt: skip
        args = list(leaves.values())
        if default:
            args[6] = args[7] = None
        y, yvar, lam, eta, _ = kla_triton(*args)
        loss = sum((wi * o).sum() for wi, o in zip(w, (y, yvar, lam, eta), strict=False))
        grads = torch.autograd.grad(loss, args[:6])
        outs[default] = [y, yvar, lam, eta, *grads]
        with torch.no_grad():
            outs[default, "no_grad"] = list(kla_triton(*args)[:4])
    for a, b in zip(outs[False], outs[True], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(outs[False, "no_grad"], outs[True, "no_grad"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref = reference(*(t for t in x.values()), return_precision=False)
    assert_close(outs[True][0], ref[0], "kernel", torch.float64)
    # through the public API: lam0, eta0 left out, and an initial state that asks a gradient
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    r = kla_triton(*leaves.values())
    gl0, ge0 = torch.autograd.grad(r[0].sum(), [leaves["lam0"], leaves["eta0"]])
    assert torch.isfinite(gl0).all() and torch.isfinite(ge0).all()
    dev = x["v"].device
    kept = forward._DEFAULT_STATES[((2, 3, 4), torch.float64, dev)]
    assert (kept[0] == 1).all() and (kept[1] == 0).all()
    assert forward.default_state((2, 3, 4), torch.float64, dev)[0] is kept[0]


def test_no_checkpoints_without_gradients():
    x = make_inputs(1, 5, 2, 4, seed=6)
    with torch.no_grad():
        y, yvar, lam, eta, prec = kla_triton(*x.values())
    assert prec is None and torch.isfinite(y).all() and torch.isfinite(lam).all()


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_op_captures_in_cuda_graphs():
    # kla_filter(check=False) captured by torch.cuda.make_graphed_callables (its forward and
    # backward replayed from graphs, no Python or launches a call): the same outputs and
    # gradients as the eager call, for fresh input values copied into the captured inputs
    x = {n: t.float() for n, t in make_inputs(2, 37, 5, 16, seed=13).items()}
    names = ("v", "Lv", "k", "q", "decay", "process_var")
    leaves = [x[n].clone().requires_grad_(True) for n in names]

    def op(*args):
        r = kla_filter(*args, backend="triton", check=False)
        return r.y, r.yvar

    graphed = torch.cuda.make_graphed_callables(op, tuple(leaves))
    new = {n: t.float() for n, t in make_inputs(2, 37, 5, 16, seed=14).items()}
    with torch.no_grad():
        for t, n in zip(leaves, names, strict=True):
            t.copy_(new[n])
    g = [torch.randn(2, 37, 5, device=DEVICE) for _ in range(2)]
    got = graphed(*leaves)
    got_g = torch.autograd.grad(list(got), leaves, g)
    want = op(*leaves)
    want_g = torch.autograd.grad(list(want), leaves, g)
    for a, b in zip((*got, *got_g), (*want, *want_g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_auto_backend_is_triton_on_cuda(monkeypatch):
    # backend="auto" runs the fused kernels on CUDA tensors (and never on CPU tensors, where it
    # picks the sequential loop): the Triton entry is counted, and the result is the reference's
    calls = []

    def counted(*args, **kw):
        calls.append(args[0].device.type)
        return kla_triton(*args, **kw)

    monkeypatch.setattr(K, "kla_triton", counted)
    x = make_inputs(2, 50, 4, 16, seed=8)
    a = kla_filter(**x)
    assert calls == (["cuda"] if CUDA else []), f"auto ran triton for {calls} on {DEVICE}"
    b = kla_filter(**x, backend="sequential")
    assert_close(a.y, b.y, "kernel", torch.float64)


@pytest.mark.parametrize(
    "S, dtype",
    [(16, torch.float32), (32, torch.float32), (16, torch.float64)],
    ids=["S16-f32-G4", "S32-f32-G8", "S16-f64"],
)
def test_without_variance(S, dtype, monkeypatch):
    """``return_variance=False`` (the KLA layer's training path): ``yvar`` None, the forward
    kernel launched with ``VAR=False`` (no ``yvar`` written) and the backward with
    ``HAS_GYV=False`` (no zero gradient read), and ``y``, the final state and every input's
    gradient equal to the run that returns the variance, whose loss leaves it out: bit for bit
    in the interpreter, to float rounding on the device.
    (The gradient through ``yvar`` itself: the tests above, ``HAS_GYV`` True.)"""
    if not CUDA:  # let backend="triton" take CPU tensors (the interpreter runs the kernel)
        from kalmanscan.core import kla_op

        monkeypatch.setattr(kla_op, "_resolve", lambda backend, device: backend)
    # one batch row (the flags select what a step reads and writes, not where): 9 steps, two
    # 4-step blocks and a tail, a whole checkpoint interval and a partial one
    x = {n: t.to(dtype) for n, t in make_inputs(1, 9, 3, S, seed=21).items()}
    seen = []
    real = forward.launch

    def spy(fn, grid, *a, **kw):
        seen.append(kw.get("VAR"))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(forward, "launch", spy)
    from kalmanscan.cuda.kla import backward as KB

    real_b = KB.launch

    def spy_b(fn, grid, *a, **kw):
        seen.append(("bwd", kw.get("HAS_GYV")))
        return real_b(fn, grid, *a, **kw)

    monkeypatch.setattr(KB, "launch", spy_b)
    out = {}
    for var, zero_gyv in ((True, True), (True, False), (False, False)):
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        res = kla_filter(*leaves.values(), return_variance=var, backend="triton")
        assert (res.yvar is None) == (not var)
        loss = (res.y * res.y).sum() + res.final.eta.sum() + res.final.lam.sum()
        if zero_gyv:  # yvar in the loss with weight 0: a zero gradient the backward reads
            loss = loss + (0.0 * res.yvar).sum()
        grads = torch.autograd.grad(loss, list(leaves.values()))
        out[var, zero_gyv] = [res.y, res.final.lam, res.final.eta, *grads]
    # a loss without yvar leaves its gradient None, as return_variance=False does: not read
    assert seen == [True, ("bwd", True), True, ("bwd", False), False, ("bwd", False)]
    for key in ((True, False), (False, False)):
        for a, b in zip(out[True, True], out[key], strict=True):
            if CUDA:  # the variants' machine code may fuse multiply-adds differently (ptxas):
                # 1 of 54 outputs 1 ulp apart on the H200 (2026-12-02); to 8 ulps here
                eps = torch.finfo(dtype).eps
                scale = float(b.abs().max())
                torch.testing.assert_close(a, b, rtol=8 * eps, atol=8 * eps * scale)
            else:  # the interpreter runs the same numpy operations: bit for bit
                torch.testing.assert_close(a, b, rtol=0, atol=0)


@triton.jit
def _pick_rows_kernel(x_ptr, out_ptr, SG: tl.constexpr, NT: tl.constexpr):
    """Rows of an ``[SG, NT]`` tile picked by ``device._row``, and rows of a ``[4, SG, NT]``
    tile by ``device._slot_rows``' pick, stored as they come out."""
    r = tl.arange(0, SG)[:, None] * NT + tl.arange(0, NT)[None, :]
    x = tl.load(x_ptr + r)
    for i in tl.static_range(SG):
        tl.store(out_ptr + i * NT + tl.arange(0, NT), _row(x, i, SG))
    i4 = tl.arange(0, 4)[:, None, None]
    x4 = tl.load(x_ptr + SG * NT + i4 * SG * NT + r[None, :, :])
    for j in tl.static_range(4):
        tl.store(out_ptr + SG * NT + j * SG * NT + r, _pick(x4, i4 == j, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_pick_is_bit_exact(dtype):
    """The kernels' row picks return each entry's bits unchanged, the signed zero, infinities,
    NaN and subnormals included (a float sum with a zero fill made -0.0 into +0.0 on Triton
    3.6; the integer sum of the bits does not)."""
    SG, NT = 4, 32
    specials = torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan"), 1e-40,
                             -1e-310 if dtype == torch.float64 else -1e-44, 3.5],
                            dtype=dtype)  # fmt: skip
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5 * SG * NT, generator=g, dtype=torch.float64).to(dtype)
    x[:: 7][: len(specials) * 8] = specials.repeat(8)[: len(x[::7])]
    x = x.to(DEVICE)
    out = torch.full_like(x, 7.0)
    _pick_rows_kernel[(1,)](x, out, SG=SG, NT=NT, num_warps=1)
    ity = torch.int64 if dtype == torch.float64 else torch.int32
    assert torch.equal(out.view(ity), x.view(ity))
