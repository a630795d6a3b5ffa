"""examples/expressivity: the ablated mixers, and a few training steps with checkpoint resume."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest
import torch

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
train = _load("train")


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
    tol = 1e-4 if dtype == torch.float32 else 1e-11
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
    assert torch.allclose(torch.cat((first, second), 1), full, atol=1e-5)


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
