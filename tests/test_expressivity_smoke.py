"""examples/expressivity: the ablated mixers, and a few training steps with checkpoint resume."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

import pytest
import torch

from kalmanscan.testing import tolerance

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = REPO / "examples" / "expressivity"


def _load(name):
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location(f"expressivity_{name}", HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HERE))


models = _load("models")
linear_kernel = _load("linear_kernel")
train = _load("train")
sweep = _load("sweep")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("L", [1, 63, 1000])
def test_decayed_cumsum_matches_a_loop(L, dtype):
    g = torch.Generator().manual_seed(L)
    b = torch.randn(2, L, 3, 4, generator=g, dtype=dtype)
    decay = torch.rand(3, 4, generator=g, dtype=dtype) * 0.5 + 0.5
    h0 = torch.randn(2, 3, 4, generator=g, dtype=dtype)
    h, ref = h0, []
    for t in range(L):
        h = decay * h + b[:, t]
        ref.append(h)
    ref = torch.stack(ref, 1)
    out = models.decayed_cumsum(b, decay, h0)
    tol = tolerance("parallel" if dtype == torch.float32 else "rounding", dtype)
    assert torch.allclose(out, ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("mixer", models.MIXERS)
def test_build_model_each_mixer(mixer):
    torch.manual_seed(0)
    m = models.build_model(
        mixer, 11, n_layers=2, d_model=16, d_state=4, n_heads=2, backend="sequential"
    )
    x = torch.randint(0, 11, (2, 9))
    logits = m(x)
    assert logits.shape == (2, 9, 11) and torch.isfinite(logits).all()
    logits.sum().backward()
    # the chunked call with carried state equals the full pass (causality and state handling)
    full = m(x)
    first, state = m(x[:, :4], return_state=True)
    second, _ = m(x[:, 4:], state)
    tol = tolerance("rounding", "float32")
    assert torch.allclose(torch.cat((first, second), 1), full, rtol=tol, atol=tol)


def test_ablated_layers_share_kla_weights_and_change_only_the_filter():
    torch.manual_seed(1)
    kla = models.build_model("kla", 7, n_layers=1, d_model=16, d_state=4, backend="sequential")
    torch.manual_seed(1)
    p0 = models.build_model("kla_p0", 7, n_layers=1, d_model=16, d_state=4, backend="sequential")
    for (n1, t1), (n2, t2) in zip(kla.state_dict().items(), p0.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(t1, t2)
    decay, pvar = p0.blocks[0].mixer.dynamics()
    assert (pvar == 0).all() and (decay > 0).all() and (decay < 1).all()
    _, pvar_kla = kla.blocks[0].mixer.dynamics()
    assert (pvar_kla > 0).all()
    # without process noise the precision can only grow: lam_t >= lam_{t-1} / a^2 > lam_{t-1}
    x = torch.randint(0, 7, (1, 50))
    lam = []
    p0(x, trace={0: lam})
    prec = lam[0].precision
    assert (prec[:, 1:] > prec[:, :-1]).all()


# A tiny one-block KLA model on a short selective copy: seconds on the CPU.
TINY_SELCOPY_KLA = [
    "--task",
    "selective_copy",
    "--length",
    "12",
    "--num-tokens-to-copy",
    "3",
    "--vocab-size",
    "6",
    "--mixer",
    "kla",
    "--layers",
    "1",
    "--d-model",
    "16",
    "--d-state",
    "2",
    "--batch",
    "4",
    "--n-train",
    "16",
    "--n-eval",
    "8",
    "--backend",
    "sequential",
    "--device",
    "cpu",
]


def test_train_runs_writes_json_and_resumes(tmp_path):
    out, ckpt = tmp_path / "run.json", tmp_path / "run.pt"
    common = [
        *TINY_SELCOPY_KLA,
        "--warmup",
        "2",
        "--out",
        str(out),
        "--ckpt",
        str(ckpt),
        "--eval-every",
        "0",
    ]
    first = train.main(common + ["--steps", "3"])
    assert first["steps"] == 3 and ckpt.exists()
    saved = json.loads(out.read_text())
    assert saved["config"]["mixer"] == "kla" and saved["seed"] == 0
    assert 0.0 <= saved["final"]["accuracy"] <= 1.0
    assert len(saved["final"]["per_position"]) == 12
    assert saved["final"]["per_position"][0] is None  # no target at the first position
    assert saved["max_precision"][0]["max"] > 0
    assert any("eval_accuracy" in h for h in saved["history"])
    second = train.main(common + ["--steps", "5"])
    assert second["steps"] == 5  # resumed at 3, two more steps
    assert second["train_seconds"] >= first["train_seconds"]


def test_resumed_run_keeps_training_after_its_first_schedule_ended(tmp_path):
    # The first call spends its whole time budget, which (without --time-total) was its whole
    # schedule; the resumed call must still train (learning rate > 0), not replay lr = 0.
    out, ckpt = tmp_path / "run.json", tmp_path / "run.pt"
    common = [*TINY_SELCOPY_KLA, "--warmup", "2", "--out", str(out), "--ckpt", str(ckpt)]
    first = train.main(common + ["--time-budget", "0.2"])
    assert first["train_seconds"] >= 0.2 and first["resumed_from_step"] == 0
    before = torch.load(ckpt, weights_only=False)
    second = train.main(common + ["--time-budget", "0.2"])
    after = torch.load(ckpt, weights_only=False)
    assert second["resumed_from_step"] == first["steps"] and second["steps"] > first["steps"]
    assert after["args"]["time_total"] == pytest.approx(before["elapsed"] + 0.2)
    name = "blocks.0.mixer.in_proj.weight"
    assert not torch.equal(after["model"][name], before["model"][name])  # lr was not 0


def _sweep_call(out, *extra, steps):
    sweep.main(
        [
            "--plan",
            "smoke",
            "--only",
            "a5-kla-b1",
            "--out",
            str(out),
            "--workdir",
            str(out / "work"),
            "--ckpt-dir",
            str(out / "ckpt"),
            "--device",
            "cpu",
            "--backend",
            "sequential",
            "--time-budget",
            "60",
            "--time-total",
            "120",
            "--eval-every",
            "0",
            "--save-models",
            "none",
            "--override",
            f"steps={steps}",
            *extra,
        ]
    )
    (run,) = json.loads((out / "a5.json").read_text())["runs"]
    return run, json.loads((out / "env.json").read_text())


@pytest.mark.slow  # three sweep processes, each importing torch and training (CI: -m slow)
def test_second_sweep_call_resumes_from_the_first_calls_checkpoints(tmp_path):
    # Two calls with fresh --out folders, as on a fresh GPU machine: the second one is handed
    # the first one's checkpoints and continues the step count, history and schedule.
    first, env1 = _sweep_call(tmp_path / "call1", steps=3)
    assert first["steps"] == 3 and first["resumed_from_step"] == 0 and env1["resumed"] == {}
    assert not (tmp_path / "call1" / "models.pt").exists()  # --save-models none
    ckpt1 = tmp_path / "call1" / "ckpt" / "a5-kla-b1.pt"
    assert torch.load(ckpt1, weights_only=False)["step"] == 3
    second, env2 = _sweep_call(
        tmp_path / "call2", "--resume-from", str(tmp_path / "call1" / "ckpt"), steps=5
    )
    assert list(env2["resumed"]) == ["a5-kla-b1"]
    assert second["resumed_from_step"] == 3 and second["steps"] == 5
    assert second["config"]["time_total"] == 120
    # one evaluation per step (--eval-every 0): the first call's three, then the second's two
    assert [h["step"] for h in second["history"] if "eval_accuracy" in h] == [1, 2, 3, 4, 5]
    ckpt2 = tmp_path / "call2" / "ckpt" / "a5-kla-b1.pt"
    assert torch.load(ckpt2, weights_only=False)["step"] == 5
    assert torch.load(ckpt1, weights_only=False)["step"] == 3  # the source is left as it was
    # without --resume-from a fresh folder starts from scratch
    third, env3 = _sweep_call(tmp_path / "call3", steps=2)
    assert third["resumed_from_step"] == 0 and third["steps"] == 2 and env3["resumed"] == {}


def test_plots_and_belief_picture_from_a_trained_run(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("xarray")
    plots, belief = _load("plots"), _load("belief")
    out, ckpt = tmp_path / "selcopy-kla-b1.json", tmp_path / "selcopy-kla-b1.pt"
    train.main(
        [
            *TINY_SELCOPY_KLA,
            "--steps",
            "2",
            "--out",
            str(out),
            "--ckpt",
            str(ckpt),
            "--group",
            "mad",
        ]
    )
    run = json.loads(out.read_text())
    (tmp_path / "mad.json").write_text(json.dumps({"runs": [run]}))
    table = plots.tables(tmp_path)
    assert "selcopy-kla-b1" in table and "MAD tasks" in table
    picture = tmp_path / "belief.png"
    summary = belief.main(["--models", str(ckpt), "--out", str(picture)])
    assert picture.exists() and picture.with_suffix(".json").exists()
    assert summary["content"]["n"] == 8 * 3 and summary["marker"]["n"] == 8
    assert 0.0 <= summary["outputs_correct_all"] <= 1.0


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 13, 5, 4), (1, 40, 3, 3)], ids=str)
def test_linear_kernel_equals_the_torch_recurrence(shape):
    # the baseline's Triton kernel (interpreted on the CPU) against decayed_cumsum, float64:
    # outputs, final state and the gradients of every input, initial state included
    if not linear_kernel.available(torch.zeros(1)):
        pytest.skip("needs triton (the interpreter runs it on the CPU)")
    B, L, M, S = shape
    g = torch.Generator().manual_seed(3)
    x = [torch.randn(B, L, M, generator=g, dtype=torch.float64),
         torch.randn(B, L, S, generator=g, dtype=torch.float64),
         torch.randn(B, L, S, generator=g, dtype=torch.float64),
         torch.rand(M, S, generator=g, dtype=torch.float64),
         torch.randn(B, M, S, generator=g, dtype=torch.float64)]  # fmt: skip
    wy = torch.randn(B, L, M, generator=g, dtype=torch.float64)
    wh = torch.randn(B, M, S, generator=g, dtype=torch.float64)

    def torch_path(v, k, q, a, h0):
        h = models.decayed_cumsum(v[..., :, None] * k[..., None, :], a, h0)
        return (q[:, :, None, :] * h).sum(-1), h[:, -1]

    res = {}
    for name, fn in (("kernel", linear_kernel.linear_recurrence), ("torch", torch_path)):
        leaves = [t.clone().requires_grad_(True) for t in x]
        y, h = fn(*leaves)
        grads = torch.autograd.grad((wy * y).sum() + (wh * h).sum(), leaves)
        res[name] = [y, h, *grads]
    for a, b in zip(res["kernel"], res["torch"], strict=True):
        tol = tolerance("kernel", "float64")
        assert torch.allclose(a, b, rtol=tol, atol=tol / 100), float((a - b).abs().max())


@pytest.mark.slow  # compiles two kernels for sm_90 (CI: `pytest -m slow`)
def test_linear_kernel_compiles_for_hopper_without_spills():
    # compiled for sm_90 on this machine (no GPU needed), as tests/test_cuda_resources.py does
    # for the package's kernels
    pytest.importorskip("triton")
    import subprocess

    from benchmarks.gpu import triton_cuobjdump

    code = r"""
import os, re, subprocess, sys, tempfile, triton
from triton.backends.compiler import GPUTarget
sys.path.insert(0, sys.argv[1])
import linear_kernel as K
tool = sys.argv[2]
def sig(ptrs, ints, consts):
    d = {n: "*fp32" for n in ptrs.split()}
    d.update({n: "i32" for n in ints.split()})
    d.update({c: "constexpr" for c in consts})
    return d
cases = [
    (K._fwd_kernel, sig("v_ptr k_ptr q_ptr a_ptr h0_ptr y_ptr hT_ptr hs_ptr", "L M",
                        consts := dict(S=16, SP=16, BM=8, SAVE=True, NS=3)), consts),
    (K._bwd_kernel, sig("v_ptr k_ptr q_ptr a_ptr h0_ptr hs_ptr gy_ptr ghT_ptr gv_ptr gk_ptr "
                        "gq_ptr ga_ptr gh0_ptr", "L M B", c2 := dict(S=16, SP=16, BM=8, NS=3)), c2),
]
for fn, sg, consts in cases:
    src = triton.compiler.ASTSource(fn=fn, signature=sg, constexprs=consts)
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    path = os.path.join(tempfile.mkdtemp(), "linear-kernel.cubin")
    open(path, "wb").write(comp.asm["cubin"])
    out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    print(re.findall(r"STACK:(\d+)", out)[0])
"""
    tool = triton_cuobjdump()
    if tool is None:
        pytest.skip("triton's cuobjdump is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, str(HERE), tool], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "0"], proc.stdout  # no spilled stack in either kernel
