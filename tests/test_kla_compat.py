"""Drop-in use with the authors' package: their config names (KLAConfig.from_authors), their
fixed and zero process-noise variants, dynamics kept between decoding steps, and
torch.compile(fullgraph=True) of a layer (no host synchronization on the layer's path)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kalmanscan.kla import KLAConfig, KLALanguageModel, KLALayer, ModelConfig
from kalmanscan.kla.io import load_state_dict
from kalmanscan.testing import assert_close, tolerance
from tests.helpers import count_dynamics  # noqa: E402

# The authors' KLAConfig defaults (kla 0.1.0), as a user would dump them with dataclasses.asdict.
AUTHORS_DEFAULTS = {
    "d_state": 16,
    "expand": 2.0,
    "dt_min": 0.001,
    "dt_max": 0.1,
    "dt_init_floor": 1e-4,
    "discretization": "ou",
    "process_noise_scale": 0.01,
    "learnable_process_noise": True,
    "zero_process_noise": False,
    "obs_var_min": 1e-4,
    "obs_var_max": None,
    "value_rank": "full",
    "var_rank": "full",
    "qk_norm": True,
    "bias": False,
    "use_conv": True,
    "conv_kernel_size": 4,
    "conv_activation": "silu",
    "use_gating": True,
    "gating_activation": "silu",
    "use_lambda_skip": True,
    "lambda_skip_mode": "scalar",
    "lambda_skip_init": -1.0,
    "return_variance": False,
    "decode_from_prior": False,
    "dt_rank": None,
    "clip_value": None,
    "backend": "auto",
    "mobius_impl": "linear",
    "checkpoint_ssm": False,
}


def test_from_authors_defaults_equal_ours():
    assert KLAConfig.from_authors(AUTHORS_DEFAULTS) == KLAConfig()


def test_from_authors_renames_and_variants():
    cfg = KLAConfig.from_authors(
        {
            **AUTHORS_DEFAULTS,
            "conv_kernel_size": 3,
            "gating_activation": "gelu",
            "process_noise_scale": 0.05,
            "backend": "triton_chunk",
        }
    )
    assert (cfg.conv_kernel, cfg.gate_activation, cfg.process_noise_init) == (3, "gelu", 0.05)
    assert cfg.backend == "auto"
    fixed = KLAConfig.from_authors({"learnable_process_noise": False})
    assert fixed.process_noise_mode == "fixed"
    zero = KLAConfig.from_authors({"zero_process_noise": True, "learnable_process_noise": False})
    assert zero.process_noise_mode == "zero"
    # the newer authors' spelling
    newer = KLAConfig.from_authors({"process_noise_mode": "fixed", "process_noise_init": 0.02})
    assert (newer.process_noise_mode, newer.process_noise_init) == ("fixed", 0.02)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"value_rank": "conv"}, "value_rank='conv'"),
        ({"var_rank": "dt"}, "var_rank='dt'"),
        ({"use_conv": False}, "use_conv=False"),
        ({"clip_value": 5.0}, "clip_value=5.0"),
        ({"obs_var_max": 10.0}, "obs_var_max=10.0"),
        ({"decode_from_prior": True}, "decode_from_prior=True"),
        ({"lambda_skip_mode": "vector"}, "lambda_skip_mode='vector'"),
        ({"bias": True}, "bias=True"),
        ({"process_noise_param": "log"}, "process_noise_param='log'"),
        ({"conv_kernel": 4}, r"unknown authors' KLAConfig fields \['conv_kernel'\]"),
        ({"zero_process_noise": True, "process_noise_mode": "learned"}, "contradicts"),
    ],
    ids=lambda v: str(v)[:30] if isinstance(v, dict) else None,
)
def test_from_authors_refuses_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        KLAConfig.from_authors({**AUTHORS_DEFAULTS, **bad})


def test_from_authors_argument_type():
    with pytest.raises(TypeError, match="config"):
        KLAConfig.from_authors([("d_state", 4)])
    with pytest.raises(ValueError, match="process_noise_mode"):
        KLAConfig(process_noise_mode="off")


def published_dynamics(layer, zero):
    """The authors' formula, written from their description (background §1.3), float64."""
    a = -torch.exp(layer.lambda_log.double())
    p = layer.process_noise.double()
    p = p + 1e-12 if zero else p.clamp_min(1e-7)
    delta = F.softplus(layer.delta.double()) + 1e-7
    kappa = a.abs().clamp_min(1e-8)
    return torch.exp(delta * a), p / (2 * kappa) * (-torch.expm1(-2 * kappa * delta))


@pytest.mark.parametrize("mode", ["fixed", "zero"])
def test_fixed_and_zero_process_noise_are_buffers_with_the_published_dynamics(mode):
    torch.manual_seed(0)
    layer = KLALayer(16, KLAConfig(d_state=4, process_noise_mode=mode)).double()
    names = dict(layer.named_parameters())
    assert "process_noise" not in names and "process_noise" in dict(layer.named_buffers())
    assert "process_noise" in layer.state_dict()
    expected = 0.0 if mode == "zero" else 0.01
    assert torch.all(layer.process_noise.float() == torch.tensor(expected, dtype=torch.float32))
    with torch.no_grad():
        layer.lambda_log.normal_(0.0, 1.0)
    decay, pvar = layer.dynamics(torch.float64)
    ref_a, ref_p = published_dynamics(layer, zero=mode == "zero")
    torch.testing.assert_close(decay, ref_a, rtol=tolerance("identical", "float64"), atol=0)
    torch.testing.assert_close(pvar, ref_p, rtol=tolerance("rounding", "float64"), atol=0)
    if mode == "zero":  # 1e-12 added, not floored at 1e-7
        assert float(pvar.detach().max()) < 1e-11
    out = layer(torch.randn(1, 9, 16, dtype=torch.float64))
    out.sum().backward()
    assert layer.lambda_log.grad is not None and layer.process_noise.grad is None


def test_authors_state_dict_with_fixed_noise_loads_strict():
    torch.manual_seed(1)
    kla = KLAConfig.from_authors({"d_state": 4, "zero_process_noise": True})
    cfg = ModelConfig(d_model=16, n_layers=1, kla=kla)
    src = KLALanguageModel(cfg)
    state = {k: v.clone() for k, v in src.state_dict().items()}
    dst = load_state_dict(KLALanguageModel(cfg), state)
    tokens = torch.randint(0, 256, (1, 12))
    assert torch.equal(src(tokens), dst(tokens))


def test_decoding_reuses_the_dynamics_until_a_parameter_changes(monkeypatch):
    torch.manual_seed(2)
    model = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=4))).eval()
    calls = count_dynamics(monkeypatch)
    out = model.generate(torch.tensor([[1, 2, 3]]), 20, temperature=0)
    assert len(calls) == 2  # once per layer for the prompt and all 19 decoding steps
    layer = model.blocks[0].mixer
    with torch.no_grad():
        before = layer._dynamics(torch.float32)[0].clone()
        layer.lambda_log.add_(0.5)  # in place: the version counter moves
        after = layer._dynamics(torch.float32)[0]
    assert len(calls) == 3 and not torch.equal(before, after)
    torch.testing.assert_close(after, layer.dynamics(torch.float32)[0])
    # with autograd the dynamics are computed afresh (the graph needs them)
    layer(torch.randn(1, 3, 16)).sum().backward()
    assert layer.lambda_log.grad is not None
    # results equal an uncached recompute
    monkeypatch.setattr(KLALayer, "_dynamics", lambda self, dtype: self.dynamics(dtype))
    assert torch.equal(model.generate(torch.tensor([[1, 2, 3]]), 20, temperature=0)[:, :23], out)


@pytest.mark.slow
def test_torch_compile_fullgraph_layer_on_cpu():
    """fullgraph=True fails on any graph break: .item(), a host sync or data-dependent Python
    control flow on the layer's path (full pass and a one-token decoding step)."""
    torch.manual_seed(3)
    layer = KLALayer(16, KLAConfig(d_state=4)).eval()
    x = torch.randn(2, 6, 16)  # compiled first, in a fresh layer: no warm-up call needed
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    with torch.no_grad():
        out, var, state = compiled(x, return_variance=True, return_state=True)
        ref, ref_var, ref_state = layer(x, return_variance=True, return_state=True)
        tol = tolerance("rounding", "float32")
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol / 10)
        torch.testing.assert_close(var, ref_var, rtol=tol, atol=tol / 100)
        step, step_state = compiled(x[:, :1], state)
        ref_step, _ = layer(x[:, :1], ref_state)
        torch.testing.assert_close(step, ref_step, rtol=tol, atol=tol / 10)
        torch.testing.assert_close(step_state.lam, _.lam, rtol=tol, atol=0)


def test_log_process_noise_has_no_floor_and_matches_the_raw_layer():
    torch.manual_seed(5)
    raw = KLALayer(16, KLAConfig(d_state=4)).double()
    log = KLALayer(16, KLAConfig(d_state=4, process_noise_param="log")).double()
    assert "process_noise" not in log.state_dict() and "process_noise_log" in log.state_dict()
    torch.testing.assert_close(log.process_noise_log.exp(), raw.process_noise)
    state = {k: v for k, v in raw.state_dict().items() if k != "process_noise"}
    with torch.no_grad():
        log.load_state_dict(state | {"process_noise_log": raw.process_noise.log()})
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    assert_close(log(x), raw(x), "rounding", torch.float64, what="log-parametrized layer")
    # far below the raw layer's 1e-7 floor, the rate still gets a gradient
    with torch.no_grad():
        log.process_noise_log.fill_(-25.0)
        raw.process_noise.fill_(-1e-3)
    log(x).square().sum().backward()
    raw(x).square().sum().backward()
    assert float(log.process_noise_log.grad.abs().sum()) > 0
    assert float(raw.process_noise.grad.abs().sum()) == 0  # the floor blocks it
    assert not log.process_noise_at_floor().any() and raw.process_noise_at_floor().all()
    with pytest.raises(ValueError, match="process_noise_param"):
        KLAConfig(process_noise_param="log", process_noise_mode="fixed")


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("lam", lambda s: -s.lam, "state.lam: expected precisions >= 0 and finite, got negative"),
        (
            "lam",
            lambda s: s.lam * float("nan"),
            "state.lam: expected precisions >= 0 and finite, got NaN",
        ),
        ("eta", lambda s: s.eta + float("inf"), "state.eta: expected finite values"),
        ("lam", lambda s: s.lam[:, :1], "state.lam: expected shape"),
        ("conv", lambda s: s.conv[..., :0], "state.conv: expected shape"),
    ],
)
def test_layer_refuses_a_bad_recurrent_state(field, value, needle):
    """A carried state with negative, NaN or wrongly shaped entries is refused by name."""
    from kalmanscan.kla import KLAConfig, KLALayer

    torch.manual_seed(0)
    layer = KLALayer(16, KLAConfig(d_state=4))
    _, state = layer(torch.randn(1, 5, 16), return_state=True)
    bad = state._replace(**{field: value(state)})
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        layer(torch.randn(1, 3, 16), bad)
    layer(torch.randn(1, 3, 16), state)  # the good state still works


def test_out_of_range_channels_are_summarized():
    """An out-of-range selection names how many indices and a few of them, not all 9,488."""
    from kalmanscan.kla._inspect import _index_list

    with pytest.raises(
        ValueError, match=r"got 9488 outside it \(512, 513, 514, 515, 516, \.\.\.\)"
    ):
        _index_list("channels", range(10000), 512, [])
