"""``save_checkpoint`` refuses values its checkpoint could not hold or give back, before any file
is written: a weight beyond the stored dtype's range (1e5 in float16 was written as inf, and
``load_checkpoint`` then refused the checkpoint), NaN or inf in the model, and NaN or inf in
``metadata`` (written as the non-JSON token ``NaN``, which strict parsers reject)."""

from __future__ import annotations

import json

import pytest
import torch

from kalmanscan.kla import (
    KLAConfig,
    KLALanguageModel,
    ModelConfig,
    load_checkpoint,
    save_checkpoint,
)


def make_model():
    torch.manual_seed(0)
    return KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))


def strict_json(text):
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_float16_overflow_is_refused_before_anything_is_written(tmp_path):
    model = make_model()
    with torch.no_grad():
        model.lm_head.weight[0, 0] = 1.0e5  # finite in float32, beyond float16's 65504
    with pytest.raises(ValueError) as err:
        save_checkpoint(model, tmp_path / "new", dtype=torch.float16)
    msg = str(err.value)
    assert msg.startswith("model: expected finite tensors that fit the stored dtype"), msg
    assert (
        "lm_head.weight: largest magnitude 100000 is beyond torch.float16's range (+-65504; "
        "1 of 4096 values overflow)" in msg
    ), msg
    assert "nothing was written" in msg
    assert not (tmp_path / "new").exists()

    # an existing checkpoint in the directory is left as it was
    old = save_checkpoint(make_model(), tmp_path / "old", dtype=torch.float16)
    before = snapshot(old)
    with pytest.raises(ValueError, match="lm_head.weight"):
        save_checkpoint(model, old, dtype=torch.float16)
    assert snapshot(old) == before
    load_checkpoint(old)

    # bfloat16 has float32's range; float16's largest, 65504, is stored as it is
    d = save_checkpoint(model, tmp_path / "bf16", dtype=torch.bfloat16)
    assert float(load_checkpoint(d).lm_head.weight[0, 0]) == pytest.approx(1.0e5, rel=1e-2)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = 65504.0
    d = save_checkpoint(model, tmp_path / "f16", dtype=torch.float16)
    assert float(load_checkpoint(d).lm_head.weight[0, 0]) == 65504.0


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_model_weights_are_refused_at_save(tmp_path, value):
    model = make_model()
    with torch.no_grad():
        model.blocks[0].mixer.delta.view(-1)[3] = value
    with pytest.raises(ValueError, match=r"blocks\.0\.mixer\.delta: holds 1 NaN or inf of \d+ in "
                       r"the model \(torch\.float32\)"):  # fmt: skip
        save_checkpoint(model, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize(
    "metadata, where, shown",
    [
        ({"val_loss": float("nan")}, "'val_loss'", "nan"),
        ({"run": {"losses": [1.0, float("-inf")]}}, "'run.losses[1]'", "-inf"),
        ({"best": float("inf")}, "'best'", "inf"),
    ],
    ids=["nan", "nested-inf", "inf"],
)
def test_non_finite_metadata_is_refused_naming_its_key(tmp_path, metadata, where, shown):
    with pytest.raises(ValueError) as err:
        save_checkpoint(make_model(), tmp_path / "ck", metadata=metadata)
    assert str(err.value) == (
        f"metadata: expected finite floats (JSON has no NaN or Infinity), got {shown} at "
        f"{where}; store None or a string such as 'nan' instead"
    )
    assert not (tmp_path / "ck").exists()


def test_config_is_strict_json(tmp_path):
    meta = {"val_loss": 1.25, "note": "nan", "missing": None, "steps": [1, 2]}
    d = save_checkpoint(make_model(), tmp_path / "ck", metadata=meta)
    config = strict_json((d / "config.json").read_text())
    assert config["metadata"] == meta
    with pytest.raises(ValueError, match="val_loss"):
        save_checkpoint(make_model(), tmp_path / "ck", metadata={"val_loss": float("nan")})
    strict_json((d / "config.json").read_text())  # the refused save left the file as it was
