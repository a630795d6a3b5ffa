"""User errors in the KLA part that used to surface as another library's message, a silent
wrong value or an empty figure, and two statements of the docs checked against the code and the
bundled weights (the audit in .session/audit-kla/FINDINGS.md, items 1-8)."""

from __future__ import annotations

import importlib.util
import inspect as pyinspect
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from kalmanscan.kla import (  # noqa: E402
    KLAConfig,
    KLALanguageModel,
    KLALayer,
    ModelConfig,
    inspect,
    load_checkpoint,
    save_checkpoint,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"


def small_model(seed=0, d_model=16, n_layers=1):
    torch.manual_seed(seed)
    return KLALanguageModel(
        ModelConfig(d_model=d_model, n_layers=n_layers, kla=KLAConfig(d_state=2))
    ).eval()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------- 1. glue = "fused" on the CPU


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_fused_glue_on_cpu_without_interpreter_names_the_setting(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.manual_seed(0)
    layer = KLALayer(8, KLAConfig(d_state=2))
    layer.glue = "fused"
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError) as err:
        layer(x)
    msg = str(err.value)
    assert "KLALayer.glue = 'fused'" in msg
    assert "expected a CUDA tensor (or TRITON_INTERPRET=1 for the CPU)" in msg
    assert "got device cpu" in msg
    # the calls the fused glue does not take (a state: decoding) still run eagerly
    y, _ = layer(x[:, :1], layer.init_state(1))
    assert torch.isfinite(y).all()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_fused_glue_on_cpu_with_interpreter_runs(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    layer = KLALayer(8, KLAConfig(d_state=2))
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        ref = layer(x)
        layer.glue = "fused"
        # (the kernels were decorated when their module was first imported: on a CUDA machine
        # another test may have compiled them for the GPU before this test set the variable)
        kernel = importlib.import_module("kalmanscan.cuda.kla.glue")._glue_gate_fwd_kernel
        if type(kernel).__name__ != "InterpretedFunction":
            pytest.skip("the glue kernels were imported without triton's interpreter")
        torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- 2. checkpoint metadata


def test_save_checkpoint_bad_metadata_writes_nothing(tmp_path):
    a, b = small_model(0, 16), small_model(1, 32)
    ck = save_checkpoint(a, tmp_path / "ck", metadata={"note": "a"})
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    with pytest.raises(TypeError, match=r"metadata: .*numpy\.float32 at 'lr'"):
        save_checkpoint(b, ck, metadata={"lr": np.float32(1e-3)})
    with pytest.raises(TypeError, match=r"metadata: .*torch\.Tensor at 'losses\[1\]'"):
        save_checkpoint(b, ck, metadata={"losses": [1.0, torch.tensor(0.5)]})
    with pytest.raises(TypeError, match=r"metadata: .*key \(1, 2\) of type tuple"):
        save_checkpoint(b, ck, metadata={(1, 2): "x"})
    with pytest.raises(TypeError, match=r"metadata: expected None or a JSON-serialisable dict"):
        save_checkpoint(b, ck, metadata=[1, 2])
    # the previous checkpoint is untouched (no temporary files left either) and still loads
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    loaded = load_checkpoint(ck)
    assert loaded.config == a.config
    # a new directory: nothing written
    with pytest.raises(TypeError, match="metadata"):
        save_checkpoint(b, tmp_path / "new", metadata={"lr": np.float32(1e-3)})
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    # values json stores as they are still pass: numpy.float64 is a float, tuples are lists
    save_checkpoint(b, ck, metadata={"lr": np.float64(1e-3), "pair": (1, "x"), "n": None})
    assert load_checkpoint(ck).config == b.config
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", "model.safetensors"]


# ---------------------------------------------------------------- 3. KLAConfig values


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("expand", math.inf, "expected a positive number"),
        ("expand", 1e300, "expected a positive number"),
        ("dt_max", math.inf, "expected a positive number"),
        ("dt_min", math.inf, "expected a positive number"),
        ("dt_init_floor", math.inf, "expected a positive number"),
        ("obs_var_min", math.inf, "expected a positive number"),
        ("process_noise_init", 1e300, "expected a positive number"),
        ("process_noise_init", math.inf, "expected a positive number"),
        ("lambda_skip_init", math.nan, "expected a finite number"),
        ("lambda_skip_init", math.inf, "expected a finite number"),
        ("lambda_skip_init", -1e300, "expected a finite number"),
        ("lambda_skip_init", "a", "expected a finite number"),
        ("lambda_skip_init", True, "expected a finite number"),
        ("lambda_skip_init", None, "expected a finite number"),
        ("qk_norm", "false", "expected a bool"),
        ("qk_norm", 1, "expected a bool"),
        ("qk_norm", None, "expected a bool"),
        ("discretization", ["ou"], "expected one of"),
        ("process_noise_mode", None, "expected one of"),
        ("process_noise_param", 1, "expected one of"),
        ("gate_activation", b"silu", "expected one of"),
    ],
)
def test_kla_config_refuses_bad_values_by_name(field, value, expected):
    kw = {field: value}
    if field == "dt_min":
        kw["dt_max"] = math.inf  # dt_min <= dt_max would hold; dt_max is checked after dt_min
    with pytest.raises(ValueError) as err:
        KLAConfig(**kw)
    msg = str(err.value)
    assert msg.startswith(f"{field}: {expected}"), msg
    assert repr(value) in msg, msg


def test_kla_config_keeps_valid_values():
    # what the bundled checkpoint, the authors' defaults and the tests use
    cfg = KLAConfig(
        d_state=16, expand=2, conv_kernel=4, qk_norm=False, lambda_skip_init=0,
        process_noise_init=0.01, dt_min=1e-3, dt_max=0.1, dt_init_floor=1e-4,
        obs_var_min=np.float64(1e-4), process_noise_param="log",
    )  # fmt: skip
    assert cfg.lambda_skip_init == 0 and cfg.qk_norm is False
    assert load_checkpoint().config.kla.process_noise_param == "log"
    layer = KLALayer(4, KLAConfig(d_state=2, lambda_skip_init=3.5, expand=0.5))
    assert layer.lambda_skip.item() == 3.5 and layer.d_inner == 2


def test_model_config_refuses_a_non_config_kla():
    with pytest.raises(ValueError, match=r"^kla: expected a KLAConfig or a dict .* got int"):
        ModelConfig(kla=5)
    with pytest.raises(ValueError, match=r"^attention: expected an AttentionConfig .* got str"):
        ModelConfig(attention="x")


def test_checkpoint_config_with_string_bool_is_refused(tmp_path):
    import json

    from kalmanscan.kla import CheckpointError

    ck = save_checkpoint(small_model(), tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["model"]["kla"]["qk_norm"] = "false"
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="qk_norm: expected a bool"):
        load_checkpoint(ck)


# ------------------------------------------------------------ 4. docs/api.md: inspect's defaults


def test_api_doc_gives_inspect_defaults():
    text = (DOCS / "api.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `inspect(model, tokens"))
    documented = dict(re.findall(r"(\w+)=([^,)]+)", row))
    params = pyinspect.signature(inspect).parameters
    for name in ("chunk_size", "bin_size", "detail", "window", "channels", "layers"):
        assert documented[name] == repr(params[name].default), name


# ---------------------------------------------------------------- 5. docs/kla.md: process noise


def test_kla_doc_gives_the_bundled_process_noise():
    text = (DOCS / "kla.md").read_text()
    m = load_checkpoint()
    with torch.no_grad():
        p = torch.cat([b.mixer.process_noise_rate().flatten() for b in m.blocks])
    lo, med, hi = p.min().item(), p.median().item(), p.max().item()
    printed = f"{p.numel()} min {lo:.3g} median {med:.3g} max {hi:.3g}"
    text = " ".join(text.split())
    assert f"(prints `{printed}`)" in text
    small = f"{lo:.1e}".replace("e-0", "e-")
    assert (
        f"the smallest of its {p.numel():,} rates `p = exp(process_noise_log)` is {small}, "
        f"the median {med:.2g}, the largest {hi:.2g}" in text
    )


# ---------------------------------------------------------------- 6. plot_precision(channels=)


def test_plot_precision_unknown_channel_names_channels():
    from kalmanscan.kla.plot import channel_order, plot_precision

    ds = inspect(small_model(), "hello world", channels=[0, 5])
    with pytest.raises(ValueError) as err:
        plot_precision(ds, "posterior_precision", channels=[1])
    msg = str(err.value)
    assert msg.startswith("channels: expected ids from ds.detail_channel ([0, 5]), got 1"), msg
    plot_precision(ds, "posterior_precision", channels=[5])  # a detail channel: fine
    plot_precision(ds, "binned_log10_text_precision", channels=[1, 30])  # binned: every channel
    with pytest.raises(ValueError, match=r"^channels: expected ids from ds.channel \(0..31\)"):
        plot_precision(ds, "binned_log10_text_precision", channels=[32])
    with pytest.raises(ValueError, match=r"^channels: expected at least one channel id"):
        plot_precision(ds, "binned_log10_text_precision", channels=[])
    with pytest.raises(ValueError, match=r"^channels: expected ids from ds.channel .* got -1"):
        channel_order(ds, channels=[-1, 2])


# ---------------------------------------------------------------- 7. generate(temperature=tiny)


@pytest.mark.parametrize("temperature", [1e-45, 5e-324, 1e-300])
def test_generate_tiny_temperature_is_greedy(temperature):
    model = small_model(3, d_model=16, n_layers=2)
    tokens = torch.tensor([[104, 101, 108, 108, 111], [100, 101, 102, 32, 102]])
    greedy = model.generate(tokens, 6, temperature=0)
    gen = torch.Generator().manual_seed(0)
    out = model.generate(tokens, 6, temperature=temperature, generator=gen)
    assert torch.equal(out, greedy)
    out = model.generate(tokens, 6, temperature=temperature, top_k=5, generator=gen)
    assert torch.equal(out, greedy)


# ---------------------------------------------------------------- 8. overview of a short text


def _marked(line) -> list[int]:
    if line.get_marker() in (None, "None", "", " "):
        return []
    every = line.get_markevery()
    n = len(line.get_xdata())
    return list(range(n)) if every is None else list(np.arange(n)[np.asarray(every)])


def test_overview_of_one_token_draws_markers():
    from kalmanscan.kla.plot import plot_overview

    model = small_model(0, n_layers=2)
    axes = plot_overview(inspect(model, "x", detail=False))
    for ax in axes[2:4]:  # mean log10 precision (and baseline), bits told per lane
        lines = ax.get_lines()
        assert lines
        for line in lines:
            assert len(line.get_xdata()) == 1 and np.isfinite(line.get_ydata()).all()
            assert _marked(line) == [0]
    # the surprisal of one token is undefined: the panel says so instead of staying blank
    assert any("no surprisal" in t.get_text() for t in axes[4].texts)

    # two tokens: the only defined surprisal (the second token's) is marked
    axes = plot_overview(inspect(model, "xy", detail=False))
    (line,) = axes[4].get_lines()
    assert np.isnan(line.get_ydata()[0]) and np.isfinite(line.get_ydata()[1])
    assert 1 in _marked(line)
    assert "means over 1 tokens" not in axes[0].get_title()


def test_long_curves_mark_only_isolated_points():
    from kalmanscan.kla.plot import _plot_curve

    _, ax = plt.subplots()
    y = np.arange(40.0)
    y[[0, 2, 3, 10, 11, 12]] = np.nan  # 1 sits alone between undefined values
    line = _plot_curve(ax, np.arange(40), y, lw=1.0)
    assert _marked(line) == [1]
    line = _plot_curve(ax, np.arange(40), np.arange(40.0), lw=1.0)
    assert _marked(line) == []
