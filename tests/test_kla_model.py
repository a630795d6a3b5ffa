"""KLALanguageModel: the authors' state-dict layout, logits against an independent reference,
chunked prefill / O(1) decode, hybrid configs, generate, and safe checkpoints."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

from kalmanscan.kla import (
    AttentionConfig,
    CheckpointError,
    KLAConfig,
    KLALanguageModel,
    ModelConfig,
    load_checkpoint,
    load_state_dict,
    save_checkpoint,
)
from kalmanscan.kla.io import BUNDLED_DIR, encode_text
from kalmanscan.testing import assert_close, tolerance


def authors_state_dict(V, D, n_layers, S, expand=2, gen=None):
    """A state dict with the published implementation's key names and shapes, built by hand."""
    gen = gen or torch.Generator().manual_seed(0)
    M, H = int(expand * D), int(2 * 4 * D / 3)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    sd = {"embedding.weight": r(V, D, scale=1.0)}
    for i in range(n_layers):
        p = f"blocks.{i}."
        sd.update(
            {
                p + "mixer_norm.weight": 1 + r(D, scale=0.1),
                p + "mixer.in_proj.weight": r(2 * M, D),
                p + "mixer.conv.weight": r(M, 1, 4),
                p + "mixer.conv.bias": r(M, scale=0.1),
                p + "mixer.sensor_proj.weight": r(2 * M + 2 * S, M),
                p + "mixer.delta": r(M, S, scale=1.0) - 2.0,
                p + "mixer.lambda_log": r(M, S, scale=1.0),
                p + "mixer.process_noise": r(M, S, scale=0.05).abs() + 1e-3,
                p + "mixer.lambda_skip": torch.tensor(-0.8, dtype=torch.float64),
                p + "mixer.out_proj.weight": r(D, M),
                p + "mlp_norm.weight": 1 + r(D, scale=0.1),
                p + "mlp.w12.weight": r(2 * H, D),
                p + "mlp.w3.weight": r(D, H),
            }
        )
    sd["norm_f.weight"] = 1 + r(D, scale=0.1)
    sd["lm_head.weight"] = r(V, D)
    return sd


def reference_logits(sd, tokens, n_layers, S, eps=1e-5):
    """The published model, step by step in float64 from the state dict alone: RMSNorm blocks,
    KLA mixer (covariance-form Kalman filter per lane, OU discretization with kappa clamp),
    SwiGLU MLP. Shares no code with kalmanscan."""

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x = sd["embedding.weight"][tokens]  # [B, L, D]
    B, L, _ = x.shape
    for i in range(n_layers):
        p = f"blocks.{i}."
        h = rms(x, sd[p + "mixer_norm.weight"])
        M = sd[p + "mixer.conv.bias"].shape[0]
        zg = h @ sd[p + "mixer.in_proj.weight"].T
        z, gate = zg[..., :M], zg[..., M:]
        zpad = torch.cat([torch.zeros(B, 3, M, dtype=z.dtype), z], 1)
        w = sd[p + "mixer.conv.weight"][:, 0]  # [M, 4]
        z = sum(w[:, j] * zpad[:, j : j + L] for j in range(4)) + sd[p + "mixer.conv.bias"]
        z = F.silu(z)
        raw = z @ sd[p + "mixer.sensor_proj.weight"].T
        v, logvar, k, q = raw.split([M, M, S, S], -1)
        k = k / k.norm(dim=-1, keepdim=True)
        q = q / q.norm(dim=-1, keepdim=True)
        obs_var = F.softplus(logvar) + 1e-4
        kappa = sd[p + "mixer.lambda_log"].exp().clamp_min(1e-8)
        dt = F.softplus(sd[p + "mixer.delta"]) + 1e-7
        pn = sd[p + "mixer.process_noise"].clamp_min(1e-7)
        a = torch.exp(-kappa * dt)
        pbar = pn / (2 * kappa) * (-torch.expm1(-2 * kappa * dt))
        mean = torch.zeros(B, M, S, dtype=x.dtype)
        var = torch.ones(B, M, S, dtype=x.dtype)
        ys = []
        for t in range(L):
            mp, Pp = a * mean, a * a * var + pbar
            kt = k[:, t, None, :]
            gain = Pp * kt / (kt * kt * Pp + obs_var[:, t, :, None])
            mean = mp + gain * (v[:, t, :, None] - kt * mp)
            var = (1 - gain * kt) * Pp
            ys.append((q[:, t, None, :] * mean).sum(-1))
        y = torch.stack(ys, 1) + sd[p + "mixer.lambda_skip"] * z
        y = y * F.silu(gate)
        x = x + y @ sd[p + "mixer.out_proj.weight"].T
        h = rms(x, sd[p + "mlp_norm.weight"])
        g, up = (h @ sd[p + "mlp.w12.weight"].T).chunk(2, -1)
        x = x + (F.silu(g) * up) @ sd[p + "mlp.w3.weight"].T
    return rms(x, sd["norm_f.weight"]) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("L", [1, 63], ids=["L1", "L63"])
def test_authors_layout_loads_strict_and_gives_reference_logits(L):
    V, D, n_layers, S = 50, 12, 2, 4
    sd = authors_state_dict(V, D, n_layers, S)
    model = KLALanguageModel(
        ModelConfig(vocab_size=V, d_model=D, n_layers=n_layers, kla=KLAConfig(d_state=S))
    ).double()
    assert set(model.state_dict()) == set(sd)
    model.load_state_dict(sd, strict=True)
    tokens = torch.randint(0, V, (2, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(tokens)
    ref = reference_logits(sd, tokens, n_layers, S)
    # kappa >= 1e-8 everywhere here, so the published clamp is inactive
    assert_close(logits, ref, "truth", torch.float64, what="logits")


@pytest.mark.parametrize("pad", ["never", "always"])
def test_authors_layout_gives_reference_logits_with_the_mlp_padded(pad):
    """D = 16: the MLP's hidden width 42 is padded to 48 inside the call on CUDA ("always"
    here); the authors' state dict still loads strictly, keeps its shapes and gives the
    reference logits."""
    V, D, n_layers, S = 50, 16, 2, 4
    sd = authors_state_dict(V, D, n_layers, S)
    model = KLALanguageModel(
        ModelConfig(vocab_size=V, d_model=D, n_layers=n_layers, kla=KLAConfig(d_state=S))
    ).double()
    for blk in model.blocks:
        blk.mlp.pad = pad
    model.load_state_dict(sd, strict=True)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes == {k: v.shape for k, v in sd.items()}
    tokens = torch.randint(0, V, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(tokens)
    assert_close(logits, reference_logits(sd, tokens, n_layers, S), "truth", torch.float64,
                 what="logits")  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rmsnorm_is_the_formula(dtype):
    """``x / sqrt(mean(x**2) + eps) * weight`` in float32 (float64 for float64), forward and
    backward: torch's fused kernel where the input's dtype is the weight's, the ops otherwise
    (a bfloat16 input of a float32 model)."""
    from kalmanscan.kla.model import RMSNorm

    g = torch.Generator().manual_seed(4)
    norm = RMSNorm(48).to(torch.float64 if dtype == torch.float64 else torch.float32)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3, generator=g)
    x = (torch.randn(3, 7, 48, generator=g, dtype=torch.float64) * 3).to(dtype)
    x.requires_grad_(True)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    xf = x.to(wide)
    ref = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm.eps) * norm.weight).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype)
    have = torch.autograd.grad((out * w).sum(), [x, norm.weight])
    want = torch.autograd.grad((ref * w).sum(), [x, norm.weight])
    tol = tolerance("rounding", wide)
    torch.testing.assert_close(out, ref, rtol=tol, atol=0)
    for a, b in zip(have, want, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(b.abs().max()))


def test_swiglu_hidden_width():
    for D in (12, 64, 100):
        model = KLALanguageModel(ModelConfig(d_model=D, n_layers=1, kla=KLAConfig(d_state=2)))
        assert model.blocks[0].mlp.w3.weight.shape == (D, int(2 * 4 * D / 3))


@pytest.mark.parametrize(
    "mixers",
    [["kla", "kla"], ["attention", "kla"], ["kla", "attention"]],
    ids=["kla-kla", "attn-kla", "kla-attn"],
)
def test_chunked_prefill_and_decode_equal_full_pass(mixers):
    torch.manual_seed(2)
    cfg = ModelConfig(
        d_model=16,
        n_layers=2,
        mixers=mixers,
        kla=KLAConfig(d_state=4),
        attention=AttentionConfig(n_heads=2),
    )
    model = KLALanguageModel(cfg).double().eval()
    tokens = torch.randint(0, 256, (2, 63))
    with torch.no_grad():
        full = model(tokens)
        state = model.init_state(2)
        parts = []
        for lo, hi in [(0, 20), (20, 21), (21, 50)] + [(t, t + 1) for t in range(50, 63)]:
            out, state = model(tokens[:, lo:hi], state)
            parts.append(out)
    assert_close(torch.cat(parts, 1), full, "parallel", torch.float64, what="logits")


def test_hybrid_config():
    cfg = ModelConfig.hybrid(4, d_model=16, kla=KLAConfig(d_state=2))
    model = KLALanguageModel(cfg)
    assert [b.mixer_kind for b in model.blocks] == ["attention"] * 3 + ["kla"]
    assert model.kla_blocks == [3]
    assert "blocks.3.mixer.lambda_log" in model.state_dict()
    assert "blocks.0.mixer.qkv.weight" in model.state_dict()


def test_generate_uses_one_token_steps_and_matches_full_recompute():
    model = small_model(seed=3).double().eval()
    seen = []
    hook = model.blocks[1].mixer.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].shape[1])
    )
    prompt = torch.randint(0, 256, (1, 7))
    out = model.generate(prompt, 6, temperature=0)
    hook.remove()
    assert seen == [7] + [1] * 5  # prompt at once, then one token per step
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)
    gen = torch.Generator().manual_seed(4)
    sampled = model.generate(prompt, 5, temperature=0.8, top_k=10, generator=gen)
    assert sampled.shape == (1, 12) and torch.equal(sampled[:, :7], prompt)


def test_model_bad_arguments():
    model = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    with pytest.raises(TypeError, match="tokens"):
        model(torch.randn(1, 4))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="state"):
        model(torch.zeros(1, 4, dtype=torch.long), state=[])
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="mixers"):
        ModelConfig(n_layers=2, mixers=["kla"])
    with pytest.raises(ValueError, match="mixers"):
        ModelConfig(n_layers=1, mixers=["mamba"])
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(
            d_model=10, n_layers=1, mixers="attention", attention=AttentionConfig(n_heads=4)
        )
    with pytest.raises(ValueError, match="return_variance"):
        KLALanguageModel(ModelConfig(d_model=16, n_layers=1, mixers="attention")).blocks[0].mixer(
            torch.randn(1, 2, 16), return_variance=True
        )


# ---------------------------------------------------------------------- checkpoints


def small_model(seed=5, **kw):
    torch.manual_seed(seed)
    return KLALanguageModel(
        ModelConfig(
            d_model=16,
            n_layers=2,
            mixers=["attention", "kla"],
            kla=KLAConfig(d_state=4),
            attention=AttentionConfig(n_heads=2),
            **kw,
        )
    )


def test_checkpoint_round_trip(tmp_path):
    model = small_model()
    save_checkpoint(model, tmp_path / "ck", metadata={"note": "test"})
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["format"] == "kalmanscan-kla-lm" and cfg["metadata"] == {"note": "test"}
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.config == model.config and not loaded.training
    tokens = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


def test_checkpoint_half_precision_keeps_dynamics_float32(tmp_path):
    from safetensors.torch import load_file

    model = small_model()
    save_checkpoint(model, tmp_path, dtype=torch.float16)
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert sd["blocks.1.mixer.in_proj.weight"].dtype == torch.float16
    for key in ("delta", "lambda_log", "process_noise", "lambda_skip"):
        assert sd[f"blocks.1.mixer.{key}"].dtype == torch.float32
    loaded = load_checkpoint(tmp_path)
    assert loaded.blocks[1].mixer.in_proj.weight.dtype == torch.float32
    with torch.no_grad():
        a, b = loaded(torch.arange(30)[None]), model(torch.arange(30)[None])
    assert float((a - b).abs().max()) <= tolerance("half_checkpoint", "float16")


class _Exploit:
    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.flag}",))


def test_pickle_checkpoints_are_refused_without_unpickling(tmp_path):
    import os

    flag = tmp_path / "pickle-ran"  # per test, so parallel runs cannot see each other's flag
    (tmp_path / "model.pt").write_bytes(pickle.dumps({"x": _Exploit(flag)}))
    save_checkpoint(small_model(), tmp_path / "ref")
    (tmp_path / "config.json").write_text((tmp_path / "ref" / "config.json").read_text())
    with pytest.raises(CheckpointError, match="pickle"):
        load_checkpoint(tmp_path)
    assert not os.path.exists(flag)


def test_mismatched_checkpoints_error_clearly(tmp_path):
    from safetensors.torch import load_file, save_file

    model = small_model()
    save_checkpoint(model, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    # wrong shape
    bad = dict(sd)
    bad["blocks.1.mixer.delta"] = torch.zeros(3, 3)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"blocks\.1\.mixer\.delta: expected shape \[32, 4\], got \[3, 3\]"
    ):
        load_checkpoint(tmp_path)
    # missing and unexpected keys
    bad = {k: v for k, v in sd.items() if k != "norm_f.weight"}
    bad["blocks.1.mixer.extra"] = torch.zeros(2)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing keys.*norm_f.weight") as err:
        load_checkpoint(tmp_path)
    assert "unexpected keys (1): blocks.1.mixer.extra" in str(err.value)
    # config that does not describe these weights (d_model 24)
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model"]["d_model"] = 24
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="expected shape"):
        load_checkpoint(tmp_path)
    # bad config content, corrupt weights, missing directory
    cfg["model"]["bogus"] = 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="bogus"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    save_checkpoint(model, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="directory"):
        load_checkpoint(tmp_path / "nope")


def test_load_state_dict_helper_names_problems():
    model = small_model()
    sd = model.state_dict()
    sd["lm_head.weight"] = torch.zeros(3)
    with pytest.raises(
        CheckpointError, match=r"lm_head.weight: expected shape \[256, 16\], got \[3\]"
    ):
        load_state_dict(model, sd)


def test_bundled_model_is_trained():
    """The shipped byte-level model loads on the CPU and predicts Python source far better than
    chance (8 bits/byte) and than a unigram byte model (about 4.5-5 bits/byte on Python)."""
    assert (BUNDLED_DIR / "model.safetensors").is_file(), "bundled weights are missing"
    model = load_checkpoint(backend="sequential")  # the fast CPU path for one short sequence
    assert model.kla_blocks, "the bundled model has no KLA block"
    assert (BUNDLED_DIR / "model.safetensors").stat().st_size <= 20 * 2**20
    text = (
        "def fibonacci(n):\n"
        '    """Return the n-th Fibonacci number."""\n'
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n"
    )
    tokens = encode_text(text)
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens).double(), -1)
    bits = -logp[0, :-1].gather(-1, tokens[0, 1:, None]).mean() / math.log(2)
    assert float(bits) < 3.5
