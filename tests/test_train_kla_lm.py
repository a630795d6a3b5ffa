"""The training script on a tiny synthetic standard library: outputs, splits, resume."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("train_kla_lm", ROOT / "examples/train_kla_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _held(key):
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 20 == 0


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    names = [f"mod{i}.py" for i in range(200)]
    held = [n for n in names if _held(n)][:2]
    train = [n for n in names if not _held(n)][:6]
    for i, name in enumerate(held + train):
        body = "\n".join(f"def f{j}(x):\n    return x * {j} + {i}\n" for j in range(40))
        (root / name).write_text(
            f'"""Module {i}: a small module for testing the data recipe."""\n\n'
            f'class C{i}:\n    """A class that documents itself in plain English."""\n\n{body}'
        )
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third.py").write_text("x = 1\n")
    keys = [f"k{i}" for i in range(200)]
    topics = {k: f"The topic {k} explains something about the language. " * 30 for k in keys}
    topics = {k: v for k, v in topics.items() if _held("topic:" + k)} | dict(
        [kv for kv in topics.items() if not _held("topic:" + kv[0])][:5]
    )
    (root / "pydoc_data").mkdir()
    (root / "pydoc_data" / "topics.py").write_text(f"topics = {topics!r}\n")
    (root / "LICENSE.txt").write_text("Permission is hereby granted, free of charge.\n" * 20)
    return root


def test_corpus_recipe(data_root):
    mod = _script()
    train, held, info = mod.load_corpus(data_root)
    assert info["n_files"] == 9  # 8 modules + pydoc_data/topics.py; site-packages excluded
    held_topics_file = int(_held("pydoc_data/topics.py"))
    assert info["python_held_out_docs"] == 2 + held_topics_file
    assert info["python_train_docs"] == 7 - held_topics_file
    assert info["english_held_out_docs"] >= 2 * 2 + 1  # docstrings follow their file + topics
    assert b"def f" not in held["english"].tobytes()  # prose only
    assert b"Permission is hereby granted" in train["english"].tobytes()
    assert b"Module 0:" in held["english"].tobytes() or b"Module 1:" in held["english"].tobytes()
    assert not set(held["python"].tobytes().split(b"\n\n")) & set(
        train["python"].tobytes().split(b"\n\n")
    ) - {b""}


def _args(data_root, out, *extra):
    return [
        "--data-root", str(data_root), "--out", str(out), "--d-model", "32", "--n-layers", "1",
        "--d-state", "4", "--seq-len", "32", "--batch", "3", "--eval-bytes", "2000",
        "--log-every", "1", "--warmup", "2", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_outputs_and_resume_matches_straight_run(data_root, tmp_path):
    mod = _script()
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert mod.main(_args(data_root, straight, "--max-steps", "5", "--skip-link")) == 0
    assert mod.main(_args(data_root, split, "--max-steps", "5", "--stop-after", "3",
                          "--skip-baseline", "--skip-link")) == 0  # fmt: skip
    first = torch.load(split / "kla-lm-resume.pt", weights_only=False)
    assert first["step"] == 3 and first["planned"] == 5
    assert mod.main(_args(data_root, split, "--max-steps", "5", "--resume",
                          "--skip-baseline", "--skip-link")) == 0  # fmt: skip
    a = torch.load(straight / "kla-lm-resume.pt", weights_only=False)
    b = torch.load(split / "kla-lm-resume.pt", weights_only=False)
    assert a["step"] == b["step"] == 5
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k], rtol=1e-6, atol=1e-7)
    metrics = json.loads((straight / "kla-lm-metrics.json").read_text())
    for d in ("python", "english"):
        assert 0 < metrics["kla"]["held_out_bits_per_byte"][d] < 9
        assert 0 < metrics["lzma_bits_per_byte"][d] < 9
        assert 0 < metrics["attention"]["held_out_bits_per_byte"][d] < 9
    assert metrics["kla"]["process_noise"]["fraction_at_floor_le_1.1e-7"] == 0.0
    assert (straight / "kla-lm" / "model.safetensors").is_file()
    assert (straight / "train.log").read_text().count("step") >= 5


@pytest.mark.slow
def test_surprisal_link_recorded(data_root, tmp_path):
    mod = _script()
    assert mod.main(_args(data_root, tmp_path, "--max-steps", "2", "--skip-baseline")) == 0
    link = json.loads((tmp_path / "kla-lm-metrics.json").read_text())["surprisal_information_link"]
    assert "error" not in link, link
    for d in ("python", "english"):
        assert -1.0 <= link[d]["spearman_summed_over_layers"] <= 1.0
