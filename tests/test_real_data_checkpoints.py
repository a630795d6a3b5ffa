"""Issue 22 item 14: a hostile checkpoint config is refused with a CheckpointError naming what is
wrong, before any model or tensor is built; weight shapes are checked against the safetensors
header first; the expressivity examples load their .pt files with weights_only=True."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import torch

pytest.importorskip("safetensors")

from kalmanscan.kla import KLAConfig, KLALanguageModel, ModelConfig  # noqa: E402
from kalmanscan.kla.io import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def ck(tmp_path):
    model = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    return save_checkpoint(model, tmp_path / "ck")


def _edit(ck, fn=None, text=None):
    path = ck / "config.json"
    if text is None:
        config = json.loads(path.read_text())
        fn(config["model"])
        text = json.dumps(config)
    path.write_text(text)


def test_the_untouched_checkpoint_loads(ck):
    assert isinstance(load_checkpoint(ck), KLALanguageModel)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(mlp_ratio=float("inf")), "model.mlp_ratio: expected a finite number"),
        (lambda m: m.update(mlp_ratio=float("nan")), "model.mlp_ratio: expected a finite number"),
        (lambda m: m["kla"].update(d_state=10**12), "model.kla.d_state: expected an integer below"),
        (lambda m: m["kla"].update(d_state=1e12), "d_state"),
        (lambda m: m.update(d_model=[[16]]), "model.d_model[0]: expected a number or string"),
        (lambda m: m.update(n_layers=10**6), "model.n_layers: expected at most 4096"),
        (lambda m: m.update(mixers=["kla"] * 5000), "model.mixers: expected a list of at most"),
        (lambda m: m.update(d_model=32), "does not match its config"),
        (lambda m: m.update(vocab_size="256"), "vocab_size"),
    ],
    ids=[
        "inf",
        "nan",
        "huge-int",
        "huge-float",
        "nested",
        "layers",
        "long-list",
        "shape",
        "string",
    ],
)
def test_hostile_configs_are_refused_by_name(ck, monkeypatch, edit, message):
    _edit(ck, edit)
    built = []
    original = KLALanguageModel.__init__

    def spy(self, *args, **kwargs):  # only meta-device models may be built before the check
        built.append(torch.empty(0).device.type)
        original(self, *args, **kwargs)

    monkeypatch.setattr(KLALanguageModel, "__init__", spy)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_checkpoint(ck)
    assert all(d == "meta" for d in built), built


def test_deeply_nested_json_is_refused_without_recursion_error(ck):
    deep = "[" * 100_000 + "]" * 100_000
    _edit(ck, text='{"format": "kalmanscan-kla-lm", "model": ' + deep + "}")
    with pytest.raises(CheckpointError):
        load_checkpoint(ck)


def test_an_oversized_config_is_refused_before_reading(ck):
    _edit(ck, text=" " * (2 << 20))
    with pytest.raises(CheckpointError, match="at most 1048576 bytes"):
        load_checkpoint(ck)


@pytest.mark.parametrize("name", ["belief.py", "sweep.py", "train.py"])
def test_expressivity_examples_load_with_weights_only(name):
    text = (REPO / "examples" / "expressivity" / name).read_text()
    calls = re.findall(r"torch\.load\([^)]*\)", text)
    assert calls and all("weights_only=True" in c for c in calls), calls


def test_a_training_checkpoint_round_trips_with_weights_only(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "step": 3,
        "elapsed": 1.5,
        "history": [{"loss": 0.1}],
        "diverged": False,
        "gen": torch.Generator().get_state(),
        "args": {"lr": 1e-3, "mixer": "kla"},
    }
    torch.save(state, tmp_path / "c.pt")
    back = torch.load(tmp_path / "c.pt", weights_only=True)
    assert back["args"] == state["args"] and back["step"] == 3
