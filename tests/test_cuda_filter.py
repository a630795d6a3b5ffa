"""The Triton backend of the scalar filter (kalmanscan/cuda/filter/) against the float64
sequential reference of docs/backend-contract.md: every output of ``filter_lanes`` (both
``outputs``) and ``smooth_lanes``, the fused log-likelihood adjoint and the gradients of the other
outputs, the input checks (flags), in both regimes (one thread per lane over all of time; chunked
scan with carries). Without CUDA they run under TRITON_INTERPRET=1 at small sizes. Outputs are
NaN-poisoned before every launch so an unwritten element fails. GPU tests also check that the
public functions ran this backend.
"""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.core import sequential  # noqa: E402
from kalmanscan.cuda import _common  # noqa: E402
from kalmanscan.cuda import filter as F  # noqa: E402
from kalmanscan.cuda.filter import kernels as FK  # noqa: E402
from kalmanscan.testing import assert_close, rel_error, tolerance  # noqa: E402
from tests.helpers import triton_interpreted  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
NAMES = ("z", "obs_var", "decay", "process_var", "loading", "offset", "u0", "e0", "v0")
SERIES = ("mean", "var", "precision", "info", "pred_mean", "pred_var", "pred_precision")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    # tests/conftest.py sets TRITON_INTERPRET=1 before triton's first import when there is no GPU
    assert CUDA or triton_interpreted(FK.filter_kernel), (
        "the Triton kernels must run in the interpreter on the CPU"
    )
    monkeypatch.setattr(_common, "POISON", True)


def _force(monkeypatch, regime):
    monkeypatch.setattr(F, "_MANY_LANES", 1 if regime == "lanes" else 10**9)


def make_inputs(T, N, seed=0, broadcast=False, forget=False):
    """Compact float64 inputs ``[z, R, a, p, h, c, u0, e0, v0]``: missing steps (NaN, and
    ``obs_var = inf`` at some of them), a diffuse lane, a lane known exactly (``v0 = 0``)."""
    g = torch.Generator().manual_seed(seed)

    def u(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    z[u(T, N) < 0.1] = float("nan")
    if broadcast:  # per-lane parameters, constant loading and offset (the API's stride-0 views)
        R, a, p = u(1, N, lo=0.3, hi=2.0), u(1, N, lo=0.5, hi=1.05), u(1, N, lo=0.01, hi=0.3)
        h, c = (
            torch.full((1, 1), 1.3, dtype=torch.float64),
            torch.full((1, 1), 0.1, dtype=torch.float64),
        )
    else:
        R, a, p = u(T, N, lo=0.3, hi=2.0), u(T, N, lo=0.5, hi=1.05), u(T, N, lo=0.01, hi=0.3)
        h, c = torch.randn(T, 1, generator=g, dtype=torch.float64), 0.3 * u(T, N, lo=-1, hi=1)
        R[torch.isnan(z) & (u(T, N) < 0.5)] = float("inf")
        if forget:
            a[u(T, N) < 0.05] = 0.0
    u0, v0 = u(N, lo=0.2, hi=1.0), torch.ones(N, dtype=torch.float64)
    e0 = u0 * torch.randn(N, generator=g, dtype=torch.float64)
    u0[0], e0[0] = 0.0, 0.0  # diffuse
    if N > 1:
        u0[1], v0[1] = 1.0, 0.0  # known exactly
    return [x.to(DEVICE) for x in (z, R, a, p, h, c, u0, e0, v0)]


def expanded(xs, T, N, dtype):
    xs = [x.to(dtype) for x in xs]
    return [x.expand(T, N) for x in xs[:6]], tuple(xs[6:])


def check_all(got, ref, dtype, keys):
    for k in keys:
        if k == "final":
            for i in range(3):
                assert_close(got[k][i], ref[k][i], "kernel", dtype, what=f"final[{i}]")
        else:
            assert got[k].dtype == dtype
            assert_close(got[k], ref[k], "kernel", dtype, what=k)


if CUDA:
    CASES = [(1, 3, "lanes"), (63, 5, "chunks"), (1000, 77, "chunks"), (1000, 20000, "lanes"),
             (4099, 64, "chunks"), (1000, 300, "lanes")]  # fmt: skip
else:
    # (203, 3): 13 chunks, the forward carry scanning their 12 maps in 3 tiles of 4; (33, 5):
    # 3 chunks of 12, 12 and 9 steps (a first, a middle and a partial last: the paths of (63, 5)'s
    # 4 chunks of 16 at about half the steps); (21, 3): one lane program over 5 checkpoint
    # segments of 4 steps and a partial one of 1 (the segments of 45 steps, 11 and 1, in half)
    CASES = [(1, 3, "lanes"), (33, 5, "chunks"), (63, 5, "chunks"), (21, 3, "lanes"),
             (30, 2, "chunks"), pytest.param(203, 3, "chunks", marks=pytest.mark.slow)]  # fmt: skip
# interpreted: (chunk length, chunks) of the chunked cases
PLANS = {33: (12, 3), 63: (16, 4), 30: (16, 2), 203: (16, 13)}


@pytest.mark.parametrize("T, N, regime", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_filter_and_smoother_every_output(T, N, regime, dtype, monkeypatch):
    _force(monkeypatch, regime)
    if not CUDA and regime == "chunks":
        assert F._plan(T, N)[:2] == PLANS[T]
    if not CUDA and T == 21:  # one program walks every step, the last segment partial
        assert F._plan(T, N)[1:3] == (1, 4) and T % 4 == 1
    xs = make_inputs(T, N, forget=True)
    ins, x0 = expanded(xs, T, N, dtype)
    ref = sequential.smooth_lanes(*expanded(xs, T, N, torch.float64)[0], tuple(xs[6:]))
    got = F.filter_lanes(*ins, x0)
    check_all(got, ref, dtype, SERIES + ("loglik", "final"))
    assert int(got["flags"]) == 0
    sm = _smoothed(T, N, regime, dtype, ins, x0)
    check_all(sm, ref, dtype, SERIES + ("loglik", "final", "smooth_var"))
    # the smoothed mean starts from the filtered one: in float32 over 1,000 steps with decays up
    # to 1.05 its worst element over 20,000 lanes sits at the kernel tolerance (1.009e-4 on an
    # H100), within twice the filtered mean's own error
    tol = max(tolerance("kernel", dtype), 2 * rel_error(got["mean"], ref["mean"]))
    assert rel_error(sm["smooth_mean"], ref["smooth_mean"]) <= tol
    ll = F.filter_lanes(*ins, x0, outputs="loglik")
    assert set(ll) == {"loglik", "final", "flags"}
    check_all(ll, ref, dtype, ("loglik", "final"))


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
def test_loglik_mode_allocates_nothing_of_size_T_N(regime, monkeypatch):
    _force(monkeypatch, regime)
    # interpreted: 17 steps, two chunks in the chunks regime (every chunked buffer, [NC, N]
    # sized, beside [T, N])
    T, N = (2000, 300) if CUDA else (17, 3)
    if not CUDA:
        assert F._plan(T, N)[1] == (2 if regime == "chunks" else 1)
    shapes = []
    real = F.empty

    def spy(shape, *a, **k):
        shapes.append(tuple(shape))
        return real(shape, *a, **k)

    monkeypatch.setattr(F, "empty", spy)
    xs = make_inputs(T, N, seed=4, broadcast=True)
    ins, x0 = expanded(xs, T, N, torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in xs[1:4]]
    ins[1:4] = [x.expand(T, N) for x in leaves]
    r = F.filter_lanes(*ins, x0, outputs="loglik")
    torch.autograd.grad(r["loglik"].sum(), leaves)
    assert shapes and (T, N) not in shapes


# chunks-long in the interpreter: 8-11 s a case, in the slow step (CI's second)
LONG = pytest.param("chunks-long", marks=() if CUDA else pytest.mark.slow)


@pytest.mark.parametrize("regime", ["lanes", "chunks", LONG])
@pytest.mark.parametrize("broadcast", [False, True], ids=["full", "broadcast"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_fused_loglik_adjoint(regime, broadcast, dtype, monkeypatch):
    """Gradients of sum(w * loglik) + <g, final> wrt every input, in each input's compact shape
    (chunks-long: on the CPU 13 chunks, whose maps the carries scan in several tiles)."""
    _force(monkeypatch, regime.split("-")[0])
    if CUDA:
        T, N = (30000, 200) if regime == "chunks-long" else (3000, 200)
    else:
        # chunks: three (12, 12 and 9 steps: a middle one; the last with a partial checkpoint
        # segment, as the 21 steps of lanes)
        T, N = {"chunks-long": (203, 3), "chunks": (33, 3), "lanes": (21, 3)}[regime]
        if regime == "chunks":
            assert F._plan(T, N)[:2] == (12, 3)
    xs = make_inputs(T, N, seed=7, broadcast=broadcast, forget=not broadcast)
    # missing steps (NaN, and obs_var = inf), and forgetting steps (decay 0) where not broadcast
    assert bool(xs[0].isnan().any())
    assert broadcast or (bool(xs[1].isinf().any()) and bool((xs[2] == 0).any()))
    g = torch.Generator().manual_seed(8)
    w = torch.randn(N, generator=g, dtype=torch.float64).to(DEVICE)
    gf = [torch.randn(N, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(3)]
    out = {}
    # the sequential reference on the CPU (a step is a few small operations, which a GPU
    # launches one by one: minutes at 30,000 steps beside the other test workers)
    cpu = torch.device("cpu")
    for name, fn, dt, at in (("kernel", F.filter_lanes, dtype, DEVICE),
                             ("ref", sequential.filter_lanes, torch.float64, cpu)):  # fmt: skip
        leaves = [x.detach().to(at, dt).requires_grad_(True) for x in xs]
        r = fn(*[x.expand(T, N) for x in leaves[:6]], tuple(leaves[6:]), outputs="loglik")
        fin = sum((gi.to(at, dt) * f).sum() for gi, f in zip(gf, r["final"], strict=True))
        loss = (w.to(at, dt) * r["loglik"]).sum() + fin
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        out[name] = [None if g is None else g.to(DEVICE) for g in grads]
    for n, gk, gr in zip(NAMES, out["kernel"], out["ref"], strict=True):
        gr = torch.zeros_like(xs[NAMES.index(n)]) if gr is None else gr
        assert gk.shape == gr.shape, n
        assert_close(gk, torch.nan_to_num(gr), "kernel_grad", dtype, what=f"grad {n}")


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
@pytest.mark.parametrize("smooth", [False, True], ids=["filter", "smooth"])
def test_gradients_of_every_output(regime, smooth, monkeypatch):
    """outputs="all" and the smoother: the torch backend's vector-Jacobian product."""
    _force(monkeypatch, regime)
    T, N = (500, 40) if CUDA else (20, 3)
    xs = make_inputs(T, N, seed=11, broadcast=True)
    xs[7] = xs[7] * 0  # (the reference's diffuse lane has e0 = 0)
    g = torch.Generator().manual_seed(12)
    keys = ("mean", "var", "pred_mean", "loglik") + (
        ("smooth_mean", "smooth_var") if smooth else ()
    )
    ws = {k: torch.randn((N,) if k == "loglik" else (T, N), generator=g,
                         dtype=torch.float64).to(DEVICE) for k in keys}  # fmt: skip
    out = {}
    for name, mod in (("kernel", F), ("ref", sequential)):
        leaves = [x.detach().clone().requires_grad_(True) for x in xs[1:6]]
        ins = [xs[0]] + [x.expand(T, N) for x in leaves]
        fn = mod.smooth_lanes if smooth else mod.filter_lanes
        r = fn(*ins, tuple(xs[6:]))
        loss = sum((ws[k] * torch.where(torch.isfinite(r[k]), r[k], 0.0)).sum() for k in keys)
        out[name] = torch.autograd.grad(loss, leaves)
    for n, gk, gr in zip(NAMES[1:6], out["kernel"], out["ref"], strict=True):
        assert_close(gk, gr, "kernel_grad", torch.float64, what=f"grad {n}")


_CLEAN_FLAGS: dict[str, int] = {}  # regime -> flags of test_flags' inputs as made

# test_flags' sizes (interpreted; on CUDA too, small either way): the lanes regime walks 10
# steps; the chunks regime the fewest with two chunks, 12 and 5 steps. Each case injects its
# value at a step given for 30 steps in two chunks of 16 (the size of this test before), mapped
# into the same chunk (first, or second) for the chunks regime and spread over the 10 steps for
# the lanes regime (the last step stays the last)
FLAG_T = {"lanes": 10, "chunks": 17}


def _flag_step(i, regime):
    T = FLAG_T[regime]
    if regime == "lanes":
        return round(i * (T - 1) / 29)
    CH = F._plan(T, 3)[0]
    return min(i, CH - 1) if i < 16 else min(CH + i - 16, T - 1)


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
@pytest.mark.parametrize(
    "what, bit",
    [("z_inf", 2), ("obs_var_zero", 4), ("obs_var_nan", 4), ("decay_nan", 4),
     ("process_var_negative", 4), ("loading_inf", 4), ("offset_nan", 4), ("tiny_obs_var", 4),
     ("prior_negative_v", 4), ("prior_nan_e", 4), ("prior_info_without_precision", 4),
     ("overflow", 1)],
)  # fmt: skip
def test_flags(what, bit, regime, monkeypatch):
    _force(monkeypatch, regime)
    T, N = FLAG_T[regime], 3
    if not CUDA and regime == "chunks":  # a second chunk, checked by its own programs
        assert F._plan(T, N)[:2] == (12, 2)
    assert _flag_step(29, regime) == T - 1
    xs = make_inputs(T, N, seed=3)
    z, R, a, p, h, c = xs[:6]
    s = lambda i: _flag_step(i, regime)  # noqa: E731
    if what == "z_inf":
        z[s(17), 1] = float("inf")
    elif what == "obs_var_zero":
        R[s(5), 2] = 0.0
    elif what == "obs_var_nan":
        R[s(9), 0] = float("nan")
    elif what == "decay_nan":
        a[s(20), 1] = float("nan")
    elif what == "process_var_negative":
        p[s(3), 2] = -0.1
    elif what == "loading_inf":
        h[s(8), 0] = float("inf")
    elif what == "offset_nan":
        c[s(29), 2] = float("nan")
    elif what == "tiny_obs_var":
        z[s(4), 0], R[s(4), 0] = 1.0, 1e-320  # h*h/R overflows
    elif what == "prior_negative_v":
        xs[8][2] = -0.5
    elif what == "prior_nan_e":
        xs[7][1] = float("nan")
    elif what == "prior_info_without_precision":
        xs[7][0] = 0.3  # lane 0 is diffuse (u0 = 0)
    elif what == "overflow":
        z[s(12), 2], R[s(12), 2] = 1e200, 1.0  # squared innovation past the dtype's maximum
    for outputs in ("all", "loglik"):
        got = F.filter_lanes(*[x.expand(T, N) for x in xs[:6]], tuple(xs[6:]), outputs=outputs)
        assert int(got["flags"]) & bit, (what, outputs)
        assert got["flags"].device.type == DEVICE
    # the same inputs without the injected value raise no flag: one call a regime, the same in
    # every case (each call fills its own flags word, so no case's flags reach another's)
    if regime not in _CLEAN_FLAGS:
        clean = make_inputs(T, N, seed=3)
        got = F.filter_lanes(*[x.expand(T, N) for x in clean[:6]], tuple(clean[6:]))
        _CLEAN_FLAGS[regime] = int(got["flags"])
    assert _CLEAN_FLAGS[regime] == 0


# float64 smoother results of test_filter_and_smoother_every_output's inputs (seed 0, forget),
# kept for test_regimes_agree: {(T, N, regime): result}; each computed once, read only
_SMOOTHED: dict = {}


def _smoothed(T, N, regime, dtype, ins, x0):
    """``F.smooth_lanes(*ins, x0)`` (poisoned outputs, ``regime`` forced by the caller), kept
    in float64 so that test_regimes_agree reads the chunked result instead of running it again
    (in one process; a worker without it runs it)."""
    if dtype != torch.float64:
        return F.smooth_lanes(*ins, x0)
    key = (T, N, regime)
    if key not in _SMOOTHED:
        _SMOOTHED[key] = F.smooth_lanes(*ins, x0)
    return _SMOOTHED[key]


def test_regimes_agree(monkeypatch):
    # the inputs of test_filter_and_smoother_every_output[f64-33-5-chunks] (its smoother result
    # shared where that case ran in this process)
    T, N = (5000, 33) if CUDA else (33, 5)
    if not CUDA:  # three chunks (12, 12 and 9 steps): a middle one
        assert F._plan(T, N)[:2] == (12, 3)
    xs = make_inputs(T, N, forget=True)
    assert bool((xs[2] == 0).any()) and bool(xs[0].isnan().any())
    ins, x0 = expanded(xs, T, N, torch.float64)
    outs = []
    for regime in ("lanes", "chunks"):
        with monkeypatch.context() as m:
            _force(m, regime)
            assert (F._plan(T, N)[1] == 1) == (regime == "lanes")
            outs.append(_smoothed(T, N, regime, torch.float64, ins, x0))
    for k in SERIES + ("loglik", "smooth_mean", "smooth_var"):
        assert_close(outs[0][k], outs[1][k], "kernel", torch.float64, what=k)


def test_plan_chooses_regime_by_shape():
    assert F._plan(4096, 65536)[1] == 1  # many lanes: one chunk
    CH, NC, CK, _, _ = F._plan(2**20, 64)
    assert NC > 1 and CH % CK == 0 and NC * CH >= 2**20


@pytest.fixture
def triton_auto(monkeypatch):
    """``backend="auto"`` runs triton: on CUDA as it is; on the CPU the kernels run in the
    interpreter, so triton is let serve CPU tensors too."""
    if not CUDA:
        from kalmanscan.core import backends

        monkeypatch.setitem(
            backends.AUTO, "filter", {**backends.AUTO["filter"], "cpu": ("triton",)}
        )
        real = backends._unavailable
        monkeypatch.setattr(backends, "_unavailable",
                            lambda name, device, op: None if name == "triton"
                            else real(name, device, op))  # fmt: skip


@pytest.mark.parametrize("fn", ["filter", "smooth", "loglik"])
def test_public_functions_run_triton(fn, triton_auto, monkeypatch):
    import kalmanscan

    calls = []
    for name in ("filter_lanes", "smooth_lanes"):
        real = getattr(F, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(F, name, spy)
    g = torch.Generator().manual_seed(12)
    T, N = (500, 40) if CUDA else (20, 2)
    z = torch.randn(T, N, generator=g, dtype=torch.float64).to(DEVICE)
    z[3, 1] = float("nan")
    kw = dict(obs_var=0.7, decay=0.95, process_var=0.1)
    for _ in range(2):  # the second call reuses the kept launch plan
        calls.clear()
        got = getattr(kalmanscan, fn)(z, **kw)  # auto: triton
        ref = getattr(kalmanscan, fn)(z.cpu(), **kw, backend="sequential")
        assert calls == ["smooth_lanes" if fn == "smooth" else "filter_lanes"]
        if fn == "loglik":
            assert_close(got, ref, "kernel", torch.float64, what="loglik")
        else:
            for name in ("mean", "var"):
                assert_close(getattr(got, name), getattr(ref, name), "kernel", torch.float64,
                             what=name)  # fmt: skip


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_public_loglik_gradient(regime, dtype, triton_auto, monkeypatch):
    """ks.loglik's gradient through the fused adjoint with the API's own broadcasting: per-lane
    [N] parameters, a [T, 1] loading (time-varying, one for every lane), a weighted sum;
    against the torch backend in float64. Twice: the second call reuses the kept plan."""
    import kalmanscan

    _force(monkeypatch, regime)
    # interpreted: two chunks of 12 and 5 steps, or one lane program over 9 steps
    T, N = (3000, 50) if CUDA else ((17 if regime == "chunks" else 9), 2)
    if not CUDA:
        assert F._plan(T, N)[:2] == (12, 2 if regime == "chunks" else 1)
    g = torch.Generator().manual_seed(31)
    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    z[torch.rand(T, N, generator=g) < 0.1] = float("nan")
    z[4, 1] = float("nan")  # a missing step at every size
    params = [0.5 + torch.rand(N, generator=g, dtype=torch.float64),
              0.6 + 0.4 * torch.rand(N, generator=g, dtype=torch.float64),
              0.05 + 0.2 * torch.rand(N, generator=g, dtype=torch.float64),
              0.8 + 0.4 * torch.rand(T, 1, generator=g, dtype=torch.float64)]  # fmt: skip
    w = torch.randn(N, generator=g, dtype=torch.float64)
    grads = {}
    for name, backend, dt, dev, calls in (("ref", "torch", torch.float64, "cpu", 1),
                                          ("got", "auto", dtype, DEVICE, 2)):  # fmt: skip
        for _ in range(calls):
            leaves = [x.to(dev, dt).requires_grad_(True) for x in params]
            ll = kalmanscan.loglik(z.to(dev, dt), *leaves[:3], loading=leaves[3],
                                   backend=backend)  # fmt: skip
            grads[name] = torch.autograd.grad((w.to(dev, dt) * ll).sum(), leaves)
    for n, gg, gr in zip(("obs_var", "decay", "process_var", "loading"), grads["got"],
                         grads["ref"], strict=True):  # fmt: skip
        assert gg.shape == gr.shape, n
        assert_close(gg, gr, "kernel_grad", dtype, what=f"grad {n}")


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
@pytest.mark.parametrize("final", [False, True], ids=["loglik", "loglik+final"])
def test_loglik_gradient_launched_by_the_forward(regime, final, monkeypatch):
    """Every input that needs a gradient constant in time (per-lane [1, N], shared [1, 1], the
    initial state): the forward launches the adjoint for unit weights (``read_flags`` in its
    result) and the backward scales it by each lane's weight; with a final-state gradient as
    well the backward runs its own adjoint. Both against the sequential reference in float64,
    twice through one graph (the second backward must not touch the first's gradients)."""
    _force(monkeypatch, regime)
    T, N = (3000, 60) if CUDA else ((33 if regime == "chunks" else 13), 3)
    if not CUDA and regime == "chunks":  # three chunks (12, 12 and 9 steps): a middle one
        assert F._plan(T, N)[:2] == (12, 3)
    xs = make_inputs(T, N, seed=12, broadcast=True)
    g = torch.Generator().manual_seed(13)
    w = torch.randn(N, generator=g, dtype=torch.float64).to(DEVICE)
    gf = torch.randn(N, generator=g, dtype=torch.float64).to(DEVICE)
    out = {}
    for name, fn in (("kernel", F.filter_lanes), ("ref", sequential.filter_lanes)):
        leaves = [x.detach().clone().requires_grad_(True) for x in xs[1:]]
        ins = [xs[0]] + [x.expand(T, N) for x in leaves[:5]]
        r = fn(*ins, tuple(leaves[5:]), outputs="loglik")
        if name == "kernel":
            assert ("read_flags" in r) and r["read_flags"]() == 0
        loss = (w * r["loglik"]).sum() + ((gf * r["final"][1]).sum() if final else 0.0)
        first = torch.autograd.grad(loss, leaves, retain_graph=True)
        kept = [x.clone() for x in first]
        second = torch.autograd.grad(3.0 * loss, leaves)
        for a, b, c in zip(first, kept, second, strict=True):
            assert torch.equal(a, b)
            assert_close(c, 3.0 * b, "kernel_grad", torch.float64, what="second backward")
        out[name] = first
    for n, gk, gr in zip(NAMES[1:], out["kernel"], out["ref"], strict=True):
        assert gk.shape == gr.shape, n
        assert_close(gk, gr, "kernel_grad", torch.float64, what=f"grad {n}")


@pytest.mark.parametrize("regime", ["lanes", "chunks"])
def test_loglik_backward_twice_leaves_the_first_gradients(regime, monkeypatch):
    """The adjoint's buffers come from the forward; a second backward through the same graph
    (retain_graph) must not write into the first one's gradients."""
    _force(monkeypatch, regime)
    # interpreted: two chunks of 12 and 5 steps, or one lane program over 9 steps
    T, N = (500, 40) if CUDA else ((17 if regime == "chunks" else 9), 2)
    if not CUDA:
        assert F._plan(T, N)[1] == (2 if regime == "chunks" else 1)
    xs = make_inputs(T, N, seed=5, broadcast=True)
    leaves = [x.detach().clone().requires_grad_(True) for x in (xs[1], xs[6])]
    ins = [xs[0], leaves[0].expand(T, N)] + [x.expand(T, N) for x in xs[2:6]]
    r = F.filter_lanes(*ins, (leaves[1], xs[7], xs[8]), outputs="loglik")
    first = torch.autograd.grad(r["loglik"].sum(), leaves, retain_graph=True)
    kept = [g.clone() for g in first]
    second = torch.autograd.grad(2 * r["loglik"].sum(), leaves)
    for g, k, g2 in zip(first, kept, second, strict=True):
        assert torch.equal(g, k)
        assert_close(g2, 2 * k, "kernel_grad", torch.float64, what="second backward")


@pytest.mark.parametrize(
    "change, name",
    [({"obs_var": -1.0}, "obs_var"), ({"process_var": float("nan")}, "process_var"),
     ({"decay": float("inf")}, "decay"), ({"prior_var": -2.0}, "prior_var"), ("z_inf", "z")],
)  # fmt: skip
def test_public_api_raises_through_the_kernels_flags(change, name, triton_auto):
    """The API skips its own value checks for this backend (CHECKS_INPUTS); a bad value still
    raises the error that names it, from the kernels' flag (read after the outputs are built)."""
    import kalmanscan

    assert F.CHECKS_INPUTS
    T, N = (50, 4) if CUDA else (8, 2)  # interpreted: one chunk, the inf at step 7 (the last)
    z = torch.randn(T, N, dtype=torch.float64, device=DEVICE)
    kw = dict(obs_var=0.7, decay=0.95, process_var=0.1)
    if change == "z_inf":
        z[7, 1] = float("inf")
    else:
        kw.update(change)
    for fn in (kalmanscan.filter, kalmanscan.smooth, kalmanscan.loglik):
        with pytest.raises(ValueError, match=name):
            fn(z, **kw)
    # the same with tensor parameters (the kernels' checks, not the host's on numbers)
    R = torch.full((N,), 0.7, dtype=torch.float64, device=DEVICE).requires_grad_(True)
    if name == "obs_var":
        with pytest.raises(ValueError, match=name):
            kalmanscan.loglik(z, R.detach() * -1, 0.95, 0.1)
    elif name == "z":
        with pytest.raises(ValueError, match=name):
            kalmanscan.loglik(z, R, 0.95, 0.1)


def test_public_api_raises_overflow_through_the_flags(triton_auto):
    """Valid inputs whose squared innovation no float64 holds: OverflowError, from every
    public function."""
    import kalmanscan

    z = torch.randn(8, 2, dtype=torch.float64, device=DEVICE)
    z[7, 1] = 1e200
    for fn in (kalmanscan.filter, kalmanscan.smooth, kalmanscan.loglik):
        with pytest.raises(OverflowError, match="not representable"):
            fn(z, 1.0, 0.9, 0.1)


def test_public_api_obs_var_inf_is_not_observed(triton_auto):
    """The API leaves z unmasked for this backend (INF_OBS_VAR_UNOBSERVED): obs_var = inf must
    still mean "not observed", as on the reference."""
    import kalmanscan

    g = torch.Generator().manual_seed(21)
    T, N = (300, 8) if CUDA else (20, 2)
    z = torch.randn(T, N, generator=g, dtype=torch.float64)
    R = 0.5 + torch.rand(T, N, generator=g, dtype=torch.float64)
    R[torch.rand(T, N, generator=g) < 0.2] = float("inf")
    kw = dict(decay=0.9, process_var=0.2)
    got = kalmanscan.smooth(z.to(DEVICE), R.to(DEVICE), **kw)
    ref = kalmanscan.smooth(z, R, **kw, backend="sequential")
    for name in ("mean", "var"):
        assert_close(getattr(got, name), getattr(ref, name), "kernel", torch.float64, what=name)
    assert_close(got.filtered.loglik, ref.filtered.loglik, "kernel", torch.float64, what="ll")


def test_launch_site_launches_the_kept_kernel_with_each_calls_arguments(monkeypatch):
    """_common.launch_site: the first call of a slot goes through launch() (which compiles or
    finds the kernel); later calls launch the kept kernel with their own arguments and the
    slot's fixed tail (keywords, else defaults, in signature order), grid padded to 3-D."""
    got = []

    class Kernel:  # a compiled kernel: kernel[grid](*args)
        def __getitem__(self, grid):
            return lambda *a: got.append((grid, a))

    class Cache(dict):
        def get(self, key, default=None):
            return Kernel()

    fn = FK.carry_kernel
    entry = _common._Launch(fn)
    entry.cache = Cache()
    monkeypatch.setitem(_common._LAUNCH, fn, entry)
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: 0)
    site = {}
    names = entry.names
    kw = dict(FWD=True, BWD=False, NS=2, CT=4, BLOCK=16, num_warps=4)
    calls = []
    for i in range(3):
        args = tuple(torch.zeros(2) for _ in range(10)) + (5 + i, 3)  # one N per call: the
        # key is the caller's, so the launch must pass this call's values, not the first's
        calls.append(args)
        _common.launch_site(site, "slot", fn, (7,), args, lambda: dict(kw))
    assert len(got) == 3 and "slot" in site
    tail = tuple(kw[n] if n in kw else entry.defaults[n] for n in names[len(calls[0]) :])
    for (grid, a), args in zip(got, calls, strict=True):
        assert grid == (7, 1, 1)
        assert len(a) == len(names)  # (num_warps is an option, not a parameter)
        assert a[: len(args)] == args and a[len(args) :] == tail


def test_launches_ask_for_fused_multiply_adds(monkeypatch):
    """Every launch passes ``_common.COMPILE_OPTIONS`` (FMA contraction on: Triton's default up
    to 3.9, which 3.10 turns off unless asked), the caller's keywords over them; the
    ahead-of-time compile options carry them too."""
    seen = []

    class Fn:  # a @triton.jit kernel as launch() calls it: fn[grid](*args, **kw)
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(kw)

    monkeypatch.setattr(_common, "interpreting", lambda: True)
    _common.launch(Fn(), (1,), 3, BLOCK=16, num_warps=2)
    assert seen == [{"enable_fp_fusion": True, "BLOCK": 16, "num_warps": 2}]
    _common.launch(Fn(), (1,), 3, enable_fp_fusion=False)
    assert seen[-1] == {"enable_fp_fusion": False}
