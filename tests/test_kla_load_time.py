"""``load_checkpoint`` builds the model without its random init: it imports no compiler stack
(``torch._dynamo``, ``torch._inductor``, sympy: about 1.5 s of a fresh process's first load,
through the meta device's reference ops), leaves the global generator alone, and gives the model
that building one and loading its state dict gives; models built otherwise keep their init."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

pytest.importorskip("safetensors")

from kalmanscan.kla import (  # noqa: E402
    AttentionConfig,
    KLAConfig,
    KLALanguageModel,
    ModelConfig,
    load_checkpoint,
    save_checkpoint,
)
from kalmanscan.kla.io import BUNDLED_DIR, load_state_dict, read_config  # noqa: E402
from kalmanscan.kla.layer import _skip_init  # noqa: E402

HEAVY = ("torch._dynamo", "torch._inductor", "sympy")
REPO = pathlib.Path(__file__).resolve().parents[1]

# A small model of each layout: KLA blocks with each process-noise variant (a buffer in the
# fixed and zero ones), and an attention block.
CONFIGS = {
    "kla-learned": ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)),
    "kla-log": ModelConfig(
        d_model=16, n_layers=1, kla=KLAConfig(d_state=2, process_noise_param="log")
    ),
    "kla-fixed-attention": ModelConfig(
        d_model=16,
        n_layers=2,
        mixers=["kla", "attention"],
        kla=KLAConfig(d_state=2, process_noise_mode="fixed"),
        attention=AttentionConfig(n_heads=2),
    ),
    "kla-zero": ModelConfig(
        d_model=16, n_layers=1, kla=KLAConfig(d_state=2, process_noise_mode="zero")
    ),
}

_CHILD = """
import json, sys
import torch
import kalmanscan.kla as k
heavy = {heavy!r}
before = [m for m in heavy if m in sys.modules]
k.load_checkpoint()
k.load_checkpoint({small!r}, dtype=torch.float64)
k.load_checkpoint({small!r}, dtype=torch.float16)
print(json.dumps({{"before": before, "after": [m for m in heavy if m in sys.modules]}}))
"""


def _built(config: ModelConfig, state_dict, dtype=torch.float32) -> KLALanguageModel:
    """The model a user builds and loads by hand (random init, then every tensor replaced)."""
    return load_state_dict(KLALanguageModel(config).to(dtype), state_dict).eval()


def test_load_checkpoint_imports_no_compiler_stack(tmp_path):
    small = save_checkpoint(KLALanguageModel(CONFIGS["kla-fixed-attention"]), tmp_path / "ck")
    code = _CHILD.format(heavy=HEAVY, small=str(small))
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["before"] == [], f"`import kalmanscan.kla` imported {got['before']}"
    assert got["after"] == [], f"load_checkpoint() imported {got['after']}"


def test_load_checkpoint_leaves_the_global_generator_alone(tmp_path):
    ck = save_checkpoint(KLALanguageModel(CONFIGS["kla-learned"]), tmp_path)
    state = torch.get_rng_state()
    load_checkpoint(ck)
    load_checkpoint()
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_loaded_model_is_the_built_one(tmp_path, name, dtype):
    torch.manual_seed(0)
    model = KLALanguageModel(CONFIGS[name])
    loaded = load_checkpoint(save_checkpoint(model, tmp_path), dtype=dtype)
    want = _built(CONFIGS[name], model.state_dict(), dtype)
    assert loaded.config == want.config and not loaded.training
    got_p, want_p = dict(loaded.named_parameters()), dict(want.named_parameters())
    assert list(got_p) == list(want_p)
    for key, p in got_p.items():
        q = want_p[key]
        assert (type(p), p.dtype, p.shape, p.requires_grad, p.device) == (
            type(q), q.dtype, q.shape, q.requires_grad, q.device
        ), key  # fmt: skip
        assert torch.equal(p, q), key
    got_b, want_b = dict(loaded.named_buffers()), dict(want.named_buffers())
    assert list(got_b) == list(want_b)
    for key, b in got_b.items():
        assert b.dtype == want_b[key].dtype and torch.equal(b, want_b[key]), key
    # every tensor has its own memory
    ptrs = [t.data_ptr() for t in (*got_p.values(), *got_b.values())]
    assert len(set(ptrs)) == len(ptrs)
    tokens = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), want(tokens))


def test_bundled_model_gives_the_built_models_logits():
    from safetensors.torch import load_file

    loaded = load_checkpoint()
    config = ModelConfig.from_dict(read_config(BUNDLED_DIR)["model"])
    want = _built(config, load_file(str(BUNDLED_DIR / "model.safetensors")))
    sd, want_sd = loaded.state_dict(), want.state_dict()
    assert list(sd) == list(want_sd)
    assert all(sd[k].dtype == want_sd[k].dtype and torch.equal(sd[k], want_sd[k]) for k in sd)
    tokens = torch.tensor([list("def f(x):\n    return x  # é\n".encode())])
    with torch.no_grad():
        assert torch.equal(loaded(tokens), want(tokens))


def test_models_built_after_and_beside_a_load_keep_their_init(tmp_path):
    config = CONFIGS["kla-fixed-attention"]
    torch.manual_seed(3)
    ref = KLALanguageModel(config).state_dict()
    load_checkpoint(save_checkpoint(KLALanguageModel(config), tmp_path))
    torch.manual_seed(3)
    after = KLALanguageModel(config).state_dict()
    # a thread inside _skip_init (a load in progress) does not reach models built on another
    entered, release = threading.Event(), threading.Event()

    def hold():
        with _skip_init():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert entered.wait(10)
        torch.manual_seed(3)
        beside = KLALanguageModel(config).state_dict()
    finally:
        release.set()
        thread.join()
    for key, value in ref.items():
        assert torch.equal(after[key], value), key
        assert torch.equal(beside[key], value), key
    # the init ran: N(0, 0.02) linear weights
    assert abs(float(ref["lm_head.weight"].std()) - 0.02) < 0.004
    assert abs(float(ref["blocks.1.mixer.qkv.weight"].std()) - 0.02) < 0.004


def test_allocation_keeps_shared_tensors_and_refuses_tensors_outside_the_state_dict():
    from kalmanscan.kla.io import _allocate, _empty_model

    model = _empty_model(CONFIGS["kla-learned"])
    model.lm_head.weight = model.embedding.weight  # tied: both names are in the state dict
    model = _allocate(model, torch.float64, set(model.state_dict()))
    assert model.lm_head.weight is model.embedding.weight
    assert model.embedding.weight.device.type == "cpu"
    assert model.embedding.weight.dtype == torch.float64
    assert isinstance(model.embedding.weight, torch.nn.Parameter)

    model = _empty_model(CONFIGS["kla-learned"])
    model.norm_f.register_buffer("scratch", torch.empty(2, device="meta"), persistent=False)
    with pytest.raises(RuntimeError, match=r"norm_f\.scratch outside it"):
        _allocate(model, torch.float32, set(model.state_dict()))
