"""The fused RMSNorm (kalmanscan/cuda/rmsnorm.py) against torch's ``F.rms_norm`` and the float64
formula (``rms_norm_ref``): output, input gradient and weight gradient; odd widths (5, 512,
1000), leading dims, non-contiguous inputs and gradients, rows that leave the last tile and the
last program partly empty; float32, and bfloat16/float16 inputs against ``RMSNorm``'s eager
path; ``RMSNorm.fused``'s dispatch; the benchmark's dry run. Without CUDA the kernels run under
TRITON_INTERPRET=1 (4 rows a tile, 2 tiles a program)."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from kalmanscan.cuda import rmsnorm  # noqa: E402
from kalmanscan.cuda.rmsnorm import rms_norm, rms_norm_ref  # noqa: E402
from kalmanscan.kla import KLALanguageModel, ModelConfig  # noqa: E402
from kalmanscan.kla.model import RMSNorm  # noqa: E402
from kalmanscan.testing import tolerance  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
EPS32 = float(torch.finfo(torch.float32).eps)
# y and gx against F.rms_norm: a few roundings an element (measured <= 1.3e-7); gw sums every
# row's terms, in another order than torch: the table's float32 rounding entry (measured 2.2e-7)
TOL_Y = tolerance("rounding", torch.float32) / 10
TOL_GW = tolerance("rounding", torch.float32)


def rel(have, want):
    """``max |have - want| / max |want|``, in float64."""
    have, want = have.detach().double(), want.detach().double()
    return float((have - want).abs().max() / want.abs().max().clamp_min(1e-300))


def inputs(shape, seed=0, dtype=torch.float32, device=DEVICE):
    """``x`` (scale 3, mean 0.5), ``weight`` (around 1) and an output gradient, seeded."""
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 0.5).to(dtype).to(device)
    w = (1 + 0.3 * torch.randn(D, generator=g, dtype=torch.float64)).float().to(device)
    gy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    return x, w, gy


def forward_backward(fn, x, w, gy):
    """``(y, gx, gw)`` of ``fn(x, w)`` with output gradient ``gy``."""
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = fn(x, w)
    gx, gw = torch.autograd.grad(y, [x, w], gy)
    return y, gx, gw


def module_forward_backward(norm, x, gy):
    """``(y, gx, gw)`` of the ``RMSNorm`` module ``norm`` (``gw`` its weight's gradient)."""
    x = x.detach().clone().requires_grad_(True)
    norm.zero_grad(set_to_none=True)
    y = norm(x)
    y.backward(gy)
    return y, x.grad, norm.weight.grad


def torch_rms(x, w, eps=1e-5):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


# (shape, id): rows N = prod(shape[:-1]); interpreted programs take 8 rows (2 tiles of 4)
SHAPES = [
    pytest.param((1, 5), id="N1-D5"),
    pytest.param((3, 7, 5), id="B3x7-D5"),  # 21 rows: the last program has 5, its 2nd tile 1
    pytest.param((2, 9, 512), id="B2x9-D512"),
    pytest.param((9, 1000), id="N9-D1000"),
    pytest.param((33, 64), id="N33-D64"),  # 5 programs, the last one row
]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch_and_float64(shape):
    x, w, gy = inputs(shape)
    got = forward_backward(lambda a, b: rms_norm(a, b, 1e-5), x, w, gy)
    eager = forward_backward(torch_rms, x, w, gy)
    exact = forward_backward(rms_norm_ref, x.double(), w.double(), gy.double())
    for name, have, want, tol, truth, ref in zip(
        ("y", "gx", "gw"), got, eager, (TOL_Y, TOL_Y, TOL_GW), exact, eager, strict=True
    ):
        assert have.shape == want.shape and have.dtype == want.dtype, name
        err = rel(have, want)
        assert err <= tol, f"{name}: {err:.2e} from F.rms_norm (tolerance {tol:.0e})"
        # against float64: no worse than torch's float32 result by more than a small factor
        mine, theirs = rel(have, truth), rel(ref, truth)
        assert mine <= 4 * theirs + 4 * EPS32, f"{name}: {mine:.2e} against torch's {theirs:.2e}"


def test_non_contiguous_input_and_gradient():
    """``x`` transposed (last axis strided) and an expanded output gradient (``y.sum()``)."""
    base, _, _ = inputs((1000, 6))
    _, w, _ = inputs((6, 1000))
    x = base.t()  # [6, 1000], not contiguous
    assert not x.is_contiguous()
    gy = torch.ones(1, device=DEVICE).expand(6, 1000)
    got = forward_backward(lambda a, b: rms_norm(a, b), x, w, gy)
    want = forward_backward(torch_rms, x, w, gy)
    for name, have, ref, tol in zip(("y", "gx", "gw"), got, want, (TOL_Y, TOL_Y, TOL_GW),
                                    strict=True):  # fmt: skip
        assert have.shape == ref.shape, name
        assert rel(have, ref) <= tol, name


def test_no_rows_and_one_gradient():
    """Zero rows: an empty output and a zero weight gradient, nothing launched; a call where
    only the weight needs a gradient."""
    x, w, gy = inputs((0, 8))
    y, gx, gw = forward_backward(rms_norm, x, w, gy)
    assert y.shape == (0, 8) and gx.shape == (0, 8) and torch.equal(gw, torch.zeros_like(w))
    x, w, gy = inputs((5, 8))
    w = w.requires_grad_(True)
    (gw,) = torch.autograd.grad(rms_norm(x, w), [w], gy)
    (want,) = torch.autograd.grad(torch_rms(x, w), [w], gy)
    assert rel(gw, want) <= TOL_GW


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_inputs_match_the_eager_module(dtype):
    """A bfloat16/float16 input of a float32 ``RMSNorm``: ``y`` and ``gx`` in the input's dtype,
    equal to the eager path (float32 math, one rounding to the dtype) to one unit of the
    dtype's rounding; ``gw`` float32."""
    x, w, gy = inputs((3, 7, 40), dtype=dtype)
    norm = RMSNorm(40).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(w)
    runs = {}
    for mode in ("fused", "eager"):
        norm.fused = mode
        runs[mode] = module_forward_backward(norm, x, gy)
    unit = float(torch.finfo(dtype).eps)
    for name, have, want, tol in zip(("y", "gx", "gw"), runs["fused"], runs["eager"],
                                     (unit, 2 * unit, TOL_GW), strict=True):  # fmt: skip
        assert have.dtype == want.dtype, name
        assert rel(have, want) <= tol, f"{name}: {rel(have, want):.2e} (tolerance {tol:.0e})"


class LaunchSpy:
    """Counts the fused kernels' launches by name (``fwd``, ``bwd``)."""

    def __init__(self, monkeypatch):
        self.seen = []
        real = rmsnorm.launch

        def spy(fn, grid, *a, **kw):
            self.seen.append(fn.__name__.removeprefix("_rms_").removesuffix("_kernel"))
            return real(fn, grid, *a, **kw)

        monkeypatch.setattr(rmsnorm, "launch", spy)


@pytest.mark.parametrize(
    "mode, dtype, min_rows, kernels",
    [
        pytest.param("fused", torch.float32, None, ["fwd", "bwd"], id="fused-f32"),
        pytest.param("fused", torch.float64, None, [], id="fused-f64-eager"),
        pytest.param("eager", torch.float32, 0, [], id="eager-f32"),
        pytest.param("auto", torch.float32, None, [], id="auto-f32-few-rows"),
        pytest.param("auto", torch.float32, 3, ["fwd", "bwd"] if CUDA else [], id="auto-f32"),
        pytest.param("auto", torch.float32, 4, [], id="auto-f32-below-min-rows"),
    ],
)
def test_dispatch_rule(mode, dtype, min_rows, kernels, monkeypatch):
    """``fused``: ``"auto"`` takes the kernels on CUDA only, from ``fused_min_rows`` rows a call
    (the default 32,768: not these 3), ``"fused"`` everywhere but float64, ``"eager"`` never;
    each path gives ``F.rms_norm``'s result."""
    spy = LaunchSpy(monkeypatch)
    norm = RMSNorm(16).to(DEVICE, dtype)
    assert norm.fused == "auto" and norm.fused_min_rows == 32768  # the defaults
    norm.fused = mode
    if min_rows is not None:
        norm.fused_min_rows = min_rows
    x, _, gy = inputs((3, 16), dtype=dtype)
    x.requires_grad_(True)
    y = norm(x)
    y.backward(gy)
    assert spy.seen == kernels
    want = torch_rms(x.detach(), norm.weight.detach())
    assert y.dtype == dtype and rel(y, want) <= TOL_Y


def test_bad_mode_and_arguments_raise():
    norm = RMSNorm(4)
    norm.fused = "triton"
    with pytest.raises(ValueError, match=r"fused: expected one of \('auto', 'fused', 'eager'\), "
                                         r"got 'triton'"):  # fmt: skip
        norm(torch.ones(2, 4))
    norm.fused = "auto"
    for bad in (-1, 2.5, True, "8"):
        norm.fused_min_rows = bad
        with pytest.raises(ValueError, match=r"fused_min_rows: expected an int >= 0, got "):
            norm(torch.ones(2, 4))
    x = torch.ones(2, 4, device=DEVICE)
    w = torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match=r"x: expected a dtype among .* got torch.float64"):
        rms_norm(x.double(), w)
    with pytest.raises(ValueError, match=r"weight: expected shape \(4,\) .* got \(5,\)"):
        rms_norm(x, torch.ones(5, device=DEVICE))
    with pytest.raises(ValueError, match=r"x: expected at least 1 dimension"):
        rms_norm(torch.tensor(1.0, device=DEVICE), w)
    with pytest.raises(ValueError, match=r"eps: expected a finite float >= 0, got -1.0"):
        rms_norm(x, w, -1.0)


def test_model_takes_the_fused_norms(monkeypatch):
    """A 2-block attention LM: every norm (2 a block and the final one) launches one kernel
    forward and one backward with ``RMSNorm.fused = "fused"``; loss and gradients equal the
    eager model's to float32 rounding."""
    torch.manual_seed(0)
    model = KLALanguageModel(ModelConfig(vocab_size=32, d_model=24, n_layers=2,
                                         mixers="attention")).to(DEVICE)  # fmt: skip
    tokens = torch.randint(0, 32, (2, 9), device=DEVICE)
    out = {}
    for mode in ("eager", "fused"):
        monkeypatch.setattr(RMSNorm, "fused", mode)
        spy = LaunchSpy(monkeypatch)
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        out[mode] = (loss.detach(), [p.grad for p in model.parameters()])
        assert spy.seen == ([] if mode == "eager" else ["fwd"] * 5 + ["bwd"] * 5)
    assert rel(out["fused"][0], out["eager"][0]) <= TOL_Y
    for have, want in zip(out["fused"][1], out["eager"][1], strict=True):
        assert rel(have, want) <= tolerance("rounding", torch.float32)


def test_docstring_examples_run():
    res = doctest.testmod(rmsnorm, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_benchmark_dry_run(tmp_path):
    """``benchmarks/rmsnorm_fused.py --dry-run``: the script's path on the CPU, tiny, through the
    interpreter, writing its JSON."""
    from benchmarks import rmsnorm_fused

    out = tmp_path / "r.json"
    assert rmsnorm_fused.main(["--dry-run", "--out", str(out), "--repeats", "2"]) == 0
    res = json.loads(out.read_text())
    for key in ("date", "device", "torch", "triton", "shapes", "median_ms", "max_rel_err"):
        assert key in res, key
    assert set(res["median_ms"]) == {"torch", "fused"}
    assert all(v >= 0 for v in res["median_ms"].values())
    assert max(res["max_rel_err"].values()) <= TOL_GW


@pytest.mark.slow  # a subprocess that compiles 18 specializations: about 7 s on 2 cores
def test_kernels_compile_for_sm90_frontend():
    """Every specialization ``RMSNorm`` launches on the device (``rmsnorm._aot_cases``: D 512,
    1000 and 4096, float32/bfloat16/float16), compiled for sm_90 to TTIR without the
    interpreter (the compiler's type and shape checks); skips where Triton cannot compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-W", "ignore", "-m", "kalmanscan.cuda._aot",
           "kalmanscan.cuda.rmsnorm", "--stage", "ttir"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if proc.returncode == 2:
        pytest.skip(proc.stdout.strip() or proc.stderr[-500:])
    assert proc.stdout, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    bad = {k: v for k, v in res.items() if v is not None}
    assert len(res) == 18 and not bad, bad
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", [(8, 2048, 512), (3, 1000), (4, 77, 4096)],
                         ids=["N16384-D512", "N3-D1000", "N308-D4096"])  # fmt: skip
def test_cuda_fused_kernels_run_and_match_torch(shape, monkeypatch):
    """On CUDA with ``RMSNorm.fused = "auto"``: the fused kernels run (one forward, one
    backward) and match ``F.rms_norm`` and the float64 formula as on the CPU."""
    spy = LaunchSpy(monkeypatch)
    x, w, gy = inputs(shape)
    norm = RMSNorm(shape[-1]).cuda()
    norm.fused = "auto"
    norm.fused_min_rows = 0  # (the kernels at every size here)
    with torch.no_grad():
        norm.weight.copy_(w)
    got = module_forward_backward(norm, x, gy)
    assert spy.seen == ["fwd", "bwd"]
    eager = forward_backward(torch_rms, x, w, gy)
    exact = forward_backward(rms_norm_ref, x.double(), w.double(), gy.double())
    for name, have, want, tol, truth in zip(("y", "gx", "gw"), got, eager,
                                            (TOL_Y, TOL_Y, TOL_GW), exact,
                                            strict=True):  # fmt: skip
        assert rel(have, want) <= tol, f"{name}: {rel(have, want):.2e}"
        mine, theirs = rel(have, truth), rel(want, truth)
        assert mine <= 4 * theirs + 4 * EPS32, f"{name}: {mine:.2e} against {theirs:.2e}"
