"""The fused SwiGLU activation (kalmanscan/cuda/swiglu.py) against torch's eager ops: the
activation and the gradient of ``h`` directly, and the ``SwiGLU`` layer's output and gradients
with ``fused = "fused"`` against ``"eager"``; float32, bfloat16 and float16; widths across the
kernels' column blocks, unaligned (13, 1365) and padded (16, 1368); leading axes, strided input;
the dispatch rule. Without CUDA the kernels run under TRITON_INTERPRET=1; with CUDA there, where
they are also held to torch's CUDA kernels in a bfloat16 language-model step."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.cuda import swiglu as sw  # noqa: E402
from kalmanscan.cuda._common import interpreting  # noqa: E402
from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig  # noqa: E402
from kalmanscan.kla.model import SwiGLU  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPES = [pytest.param(F32, id="f32"), pytest.param(BF16, id="bf16"), pytest.param(F16, id="f16")]

# float32: the two paths differ only where the exponential rounds differently
F32_REL = 1e-6
# float16 / bfloat16: a one-ulp change of silu(gate) in float32 moves its rounding to the dtype
# (and the product's after it) in a small share of the elements: at most 2 ulps (1 in silu,
# doubled by the product's rounding), in at most 1e-3 of them
MAX_ULP, MAX_SHARE = 2, 1e-3


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two float16 / bfloat16 tensors, elementwise (int64)."""

    def ordered(t):
        i = t.detach().contiguous().view(torch.int16).to(torch.int64)
        return torch.where(i < 0, -32768 - i, i)

    return (ordered(a) - ordered(b)).abs()


def assert_matches(have, want, name):
    """float32: relative error (to the tensor's largest element) at most ``F32_REL``; float16 /
    bfloat16: at most ``MAX_ULP`` ulps anywhere, and bit-equal in all but ``MAX_SHARE`` of the
    elements (at least one allowed, for the smallest tensors)."""
    have, want = have.detach(), want.detach()
    assert have.shape == want.shape and have.dtype == want.dtype, name
    assert not torch.isnan(have).any(), f"{name}: NaN (an element the kernel did not write)"
    if have.dtype == F32:
        err = float((have - want).abs().max() / want.abs().max().clamp_min(1e-30))
        assert err <= F32_REL, f"{name}: relative error {err:.2e} exceeds {F32_REL:.0e}"
        return
    u = ulps(have, want)
    n_diff, allowed = int((u > 0).sum()), max(1, int(MAX_SHARE * u.numel()))
    assert int(u.max()) <= MAX_ULP, f"{name}: {int(u.max())} ulps apart"
    assert n_diff <= allowed, f"{name}: {n_diff} of {u.numel()} elements differ (> {allowed})"


def inputs(lead, Hp, dtype, seed=0):
    """``h [*lead, 2 Hp]`` (scale 3: silu's bend and both tails) and ``ga [*lead, Hp]``."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*lead, 2 * Hp, generator=g) * 3).to(DEVICE, dtype)
    ga = torch.randn(*lead, Hp, generator=g).to(DEVICE, dtype)
    return h, ga


def act_and_grad(f, h, ga):
    h = h.detach().clone().requires_grad_(True)
    a = f(h)
    (gh,) = torch.autograd.grad(a, h, ga)
    return a, gh


# (leading axes, Hp): one row; rows and channels across the interpreter's 8 x 32 blocks; leading
# axes at d_model 512's padded width (vectorized loads on the device); its unpadded width
SHAPES = [
    pytest.param((1,), 13, id="N1-Hp13"),
    pytest.param((11,), 40, id="N11-Hp40"),
    pytest.param((2, 3), 1368, id="B2-L3-Hp1368"),
    pytest.param((3,), 1365, id="N3-Hp1365"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,Hp", SHAPES)
def test_activation_and_gradient_match_eager(lead, Hp, dtype):
    h, ga = inputs(lead, Hp, dtype)
    a, gh = act_and_grad(sw.swiglu, h, ga)
    a_ref, gh_ref = act_and_grad(sw.swiglu_reference, h, ga)
    assert_matches(a, a_ref, "a")
    assert_matches(gh, gh_ref, "gh")


def twin(h, ga):
    """The kernels' arithmetic in torch float32 with the interpreter's exponential (numpy's),
    rounding to ``h``'s dtype where the kernels do: ``(a, gh)``, for a bit-exact check."""
    dt = h.dtype

    def rnd(t):
        return t.to(dt).float()

    x, up = (t.float() for t in h.chunk(2, dim=-1))
    g = ga.float()
    d = 1.0 + torch.from_numpy(np.exp(-x.numpy()))
    s, sig = rnd(x / d), 1.0 / d
    g_gate = rnd(g * up) * sig * (1.0 + x * (1.0 - sig))
    return (s * up).to(dt), torch.cat([g_gate.to(dt), (g * s).to(dt)], dim=-1)


@pytest.mark.skipif(CUDA, reason="the interpreter's exponential (on CUDA see test_gpu_*)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundings_are_torch_ops_bit_for_bit(dtype):
    """With the same exponential, every element equals the roundings of torch's ops (silu,
    product, their gradients): no rounding missing, none extra."""
    h, ga = inputs((19,), 40, dtype, seed=1)
    a, gh = act_and_grad(sw.swiglu, h, ga)
    a_twin, gh_twin = twin(h, ga)
    assert torch.equal(a.detach(), a_twin)
    assert torch.equal(gh, gh_twin)


def run_layer(layer, x, mode, autocast_dtype=None, seed=2):
    """Output and the gradients of ``x``, ``w12``, ``w3`` with ``layer.fused = mode``."""
    layer.fused = mode
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(DEVICE, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = layer(x)
    g = torch.Generator().manual_seed(seed)
    gout = torch.randn(out.shape, generator=g).to(DEVICE, out.dtype)
    grads = torch.autograd.grad(out, [x, layer.w12.weight, layer.w3.weight], gout)
    return dict(zip(("out", "grad x", "grad w12", "grad w3"), (out, *grads), strict=True))


# (d_model, pad): H = 13 as it is and padded to 16, H = 37 padded to 40 (two column blocks
# interpreted)
LAYERS = [
    pytest.param(5, "never", id="D5-H13"),
    pytest.param(5, "always", id="D5-H13-pad16"),
    pytest.param(14, "always", id="D14-H37-pad40"),
]


@pytest.fixture
def calls(monkeypatch):
    """``{"h", "a", "ga", "gh"}`` of each call of ``swiglu`` (the layer imports it at each
    call): its input and output and their gradients."""
    seen = []
    real = sw.swiglu

    def spy(h):
        rec = {"h": h.detach()}
        a = real(h)
        rec["a"] = a.detach()
        a.register_hook(lambda g: rec.__setitem__("ga", g))
        h.register_hook(lambda g: rec.__setitem__("gh", g))
        seen.append(rec)
        return a

    monkeypatch.setattr(sw, "swiglu", spy)
    return seen


def assert_layer_matches(have, want, calls):
    """The layer adds no rounding of its own to the activation's: float32 to ``F32_REL``; in
    float16 / bfloat16 the activation to :func:`assert_matches`' bound, and the output and
    ``x``'s gradient bit for bit in the tokens whose activation and its gradient are, the
    weights' gradients (sums over tokens) bit for bit where all are, else to 2 ulps of the
    tensor's largest element."""
    dtype = want["out"].dtype
    if dtype == F32:
        for name in want:
            assert_matches(have[name], want[name], name)
        return
    (c,) = calls
    a, gh = c["a"], c["gh"]
    a_ref, gh_ref = act_and_grad(sw.swiglu_reference, c["h"], c["ga"])
    assert_matches(a, a_ref, "a")
    assert_matches(gh, gh_ref, "gh")
    same = ((a == a_ref).all(-1) & (gh == gh_ref).all(-1)).reshape(-1)  # by token

    def rows(t):
        return t.detach().reshape(same.numel(), -1)[same]

    for name in ("out", "grad x"):
        assert torch.equal(rows(have[name]), rows(want[name])), name
    eps = torch.finfo(dtype).eps
    for name in ("grad w12", "grad w3"):
        if bool(same.all()):
            assert torch.equal(have[name], want[name]), name
        else:
            err = float((have[name].float() - want[name].float()).abs().max())
            assert err <= 2 * eps * float(want[name].float().abs().max()), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,pad", LAYERS)
def test_layer_fused_matches_eager(D, pad, dtype, calls):
    """The layer in ``dtype`` (weights and input): output and gradients."""
    torch.manual_seed(0)
    layer = SwiGLU(D).to(DEVICE, dtype)
    layer.pad = pad
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    want = run_layer(layer, x, "eager")
    have = run_layer(layer, x, "fused")
    assert_layer_matches(have, want, calls)


def test_layer_under_bf16_autocast(calls):
    """Autocast on the CPU casts the GEMMs to bfloat16: the fused path gets a bfloat16 ``h``."""
    torch.manual_seed(0)
    layer = SwiGLU(16).to(DEVICE)
    x = torch.randn(4, 7, 16, device=DEVICE)
    want = run_layer(layer, x, "eager", BF16)
    have = run_layer(layer, x, "fused", BF16)
    assert have["out"].dtype == BF16 and calls[0]["h"].dtype == BF16
    assert_layer_matches(have, want, calls)


def test_strided_input_and_leading_axes():
    """A non-contiguous ``h`` (every other channel of a wider tensor) with two leading axes:
    the result and gradient equal those of its contiguous copy, in ``h``'s layout."""
    Hp = 21
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 5, 4 * Hp, generator=g).to(DEVICE, BF16).requires_grad_(True)
    h = base[..., ::2]
    assert not h.is_contiguous()
    ga = torch.randn(2, 5, Hp, generator=g).to(DEVICE, BF16)
    a = sw.swiglu(h)
    (gbase,) = torch.autograd.grad(a, base, ga)
    a_ref, gh_ref = act_and_grad(sw.swiglu, h.detach().contiguous(), ga)
    assert a.shape == (2, 5, Hp) and torch.equal(a.detach(), a_ref.detach())
    assert torch.equal(gbase[..., ::2], gh_ref) and not gbase[..., 1::2].any()


def test_empty_input():
    h = torch.randn(0, 3, 8, device=DEVICE, requires_grad=True)
    a = sw.swiglu(h)
    assert a.shape == (0, 3, 4)
    a.sum().backward()
    assert h.grad.shape == h.shape


@pytest.mark.parametrize(
    "h, err, match",
    [
        ([1.0, 2.0], TypeError, "h: expected a torch.Tensor"),
        (torch.zeros(3, 5), ValueError, r"an even last axis\), got \(3, 5\)"),
        (torch.zeros(()), ValueError, r"an even last axis\), got \(\)"),
        (torch.zeros(3, 4, dtype=torch.float64), ValueError, "got torch.float64"),
    ],
    ids=["list", "odd-width", "scalar", "float64"],
)
def test_bad_inputs_name_the_argument(h, err, match):
    with pytest.raises(err, match=match):
        sw.swiglu(h)


def test_bad_fused_value_raises():
    layer = SwiGLU(8)
    layer.fused = "fast"
    with pytest.raises(ValueError, match=r"fused: expected one of \('auto', 'fused', 'eager'\), "
                       "got 'fast'"):  # fmt: skip
        layer(torch.randn(2, 8))


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels :mod:`kalmanscan.cuda.swiglu` launches (a list it fills)."""
    seen = []
    real = sw.launch

    def spy(fn, grid, *a, **kw):
        seen.append(fn.__name__.removeprefix("_swiglu_").removesuffix("_kernel"))
        return real(fn, grid, *a, **kw)

    monkeypatch.setattr(sw, "launch", spy)
    return seen


@pytest.mark.parametrize(
    "mode, dtype, min_rows, expect",
    [
        ("auto", F32, 3, ["fwd", "bwd"] if CUDA else []),
        ("auto", F32, None, []),
        ("auto", F32, 4, []),
        ("fused", F32, None, ["fwd", "bwd"]),
        ("fused", BF16, None, ["fwd", "bwd"]),
        ("eager", F32, 0, []),
        ("fused", torch.float64, None, []),
    ],
    ids=["auto", "auto-few-rows", "auto-below-min-rows", "fused", "fused-bf16", "eager",
         "fused-f64"],
)
def test_dispatch_rule(mode, dtype, min_rows, expect, launches):
    """``"auto"`` takes the kernels on CUDA only, from ``fused_min_rows`` rows a call (the
    default 32,768: not these 3), ``"fused"`` on any device, ``"eager"`` never; float64 always
    takes the eager ops."""
    layer = SwiGLU(5).to(DEVICE, dtype)
    assert layer.fused == "auto" and layer.fused_min_rows == 32768  # the defaults
    layer.fused = mode
    if min_rows is not None:
        layer.fused_min_rows = min_rows
    x = torch.randn(3, 5, device=DEVICE, dtype=dtype, requires_grad=True)
    layer(x).sum().backward()
    assert launches == expect


def test_eager_under_compile_and_tracing(monkeypatch, launches):
    layer = SwiGLU(5).to(DEVICE)
    layer.fused = "fused"
    h = torch.randn(3, 26, device=DEVICE)
    assert layer._use_fused(h)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not layer._use_fused(h)
    monkeypatch.undo()
    monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)
    assert not layer._use_fused(h)


def test_kernels_compile_for_sm90_frontend():
    """Each specialization the layer launches on the device (``swiglu._aot_cases``), compiled
    for sm_90 to TTIR in a fresh process without the interpreter (the compiler's checks, which
    the interpreter skips); skips where Triton cannot compile here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-W", "ignore", "-m", "kalmanscan.cuda._aot", "kalmanscan.cuda.swiglu",
           "--stage", "ttir"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if proc.returncode == 2:
        pytest.skip(proc.stdout.strip() or proc.stderr[-500:])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_benchmark_dry_run(tmp_path):
    """benchmarks/swiglu_fused.py --dry-run (CPU, interpreter, tiny sizes): the script's path,
    its correctness check and the JSON it writes."""
    import json

    out = tmp_path / "swiglu.json"
    argv = ["--dry-run", "--out", str(out)]
    if interpreting():  # in this process (the interpreter is on)
        from benchmarks import swiglu_fused

        assert swiglu_fused.main(argv) == 0
    else:
        env = dict(os.environ, TRITON_INTERPRET="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        proc = subprocess.run([sys.executable, "benchmarks/swiglu_fused.py", *argv], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in ("date", "device", "torch", "triton", "shapes", "median_ms", "errors"):
        assert key in res, key
    assert res["check"]["ok"] and res["shapes"]["Hp"] == 64
    assert set(res["median_ms"]) == {f"{k}/{m}" for k in ("act_fwd", "act_fwd_bwd",
                                     "layer_fwd_bwd") for m in ("eager", "fused")}  # fmt: skip
    assert res["errors"]["a"]["max_ulp"] <= MAX_ULP and res["errors"]["gh"]["max_ulp"] <= MAX_ULP


# ----------------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_activation_matches_torch_cuda_kernels(dtype):
    """At the LM step's size (16,384 tokens, Hp 1368) and unaligned (1365): the kernels against
    torch's CUDA silu, product, silu_backward and concatenation."""
    for Hp in (1368, 1365):
        h, ga = inputs((16384,), Hp, dtype, seed=4)
        a, gh = act_and_grad(sw.swiglu, h, ga)
        a_ref, gh_ref = act_and_grad(sw.swiglu_reference, h, ga)
        assert_matches(a, a_ref, f"a Hp={Hp}")
        assert_matches(gh, gh_ref, f"gh Hp={Hp}")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_lm_step_bf16_autocast_runs_the_kernels(launches):
    """A KLA language model's forward and backward under bfloat16 autocast with ``"auto"`` (the
    fused activation from ``fused_min_rows`` rows, here 0: one forward and one backward launch
    a block) against ``"eager"``: loss, logits and every parameter's gradient."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_layers=2, kla=KLAConfig(d_state=4))
    model = KLALanguageModel(cfg).cuda()
    tokens = torch.randint(0, 256, (2, 300), device="cuda")
    results = {}
    for mode in ("eager", "auto"):
        for blk in model.blocks:
            blk.mlp.fused = mode
            blk.mlp.fused_min_rows = 0
        model.zero_grad(set_to_none=True)
        del launches[:]
        with torch.autocast("cuda", dtype=BF16):
            logits = model(tokens)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        results[mode] = (loss.detach(), logits.detach().float(),
                         {n: p.grad.float() for n, p in model.named_parameters()})  # fmt: skip
        ran = list(launches)
        assert ran == ([] if mode == "eager" else ["fwd"] * 2 + ["bwd"] * 2), ran
    (le, ze, ge), (lf, zf, gf) = results["eager"], results["auto"]
    assert float((lf - le).abs() / le.abs()) < 1e-3
    assert float((zf - ze).abs().max() / ze.abs().max()) < 2e-2
    for name, want in ge.items():
        err = float((gf[name] - want).norm() / want.norm().clamp_min(1e-30))
        assert err < 2e-2, f"grad {name}: normwise relative error {err:.2e}"
