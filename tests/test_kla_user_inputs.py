"""What users get back from the KLA part when they edit weights, pass bad inputs or bad files,
misuse the ``kalmanscan inspect`` flags, and read its figures: clear errors that name the
argument, the expected and the received; nothing silently wrong; panels that line up."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from kalmanscan.kla import (
    AttentionConfig,
    CheckpointError,
    KLAConfig,
    KLALanguageModel,
    KLALayer,
    ModelConfig,
    _inspect,
    compare,
    inspect,
    load_checkpoint,
    load_state_dict,
    save_checkpoint,
)
from tests.helpers import count_dynamics  # noqa: E402

TEXT = "def add(a, b):\n    return a + b  # sum\n"


def make_model(seed=0, n_layers=2, mixers=None):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=16,
        n_layers=n_layers,
        mixers=mixers or "kla",
        kla=KLAConfig(d_state=4),
        attention=AttentionConfig(n_heads=2),
    )
    return KLALanguageModel(cfg).eval()


# ---------------------------------------------------------------------- bug 1: dynamics cache


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.data.fill_(3.0),
        lambda p: p.data.add_(2.0),
        lambda p: p.data.copy_(torch.full_like(p, -1.5)),
        lambda p: p.data.mul_(0.5).add_(0.7),  # an EMA-style update
    ],
    ids=["fill", "add", "copy", "ema"],
)
@pytest.mark.parametrize("param", ["lambda_log", "delta", "process_noise"])
def test_no_grad_output_follows_data_edits(edit, param):
    torch.manual_seed(0)
    layer = KLALayer(32, KLAConfig(d_state=4))
    x = torch.randn(1, 20, 32)
    with torch.no_grad():
        before = layer(x)  # fills the cache
        edit(getattr(layer, param))
        cached = layer(x)
    fresh = layer(x).detach()  # with autograd: no cache
    assert not torch.equal(before, cached)
    assert torch.equal(cached, fresh)


def test_dynamics_cache_is_still_reused_and_bit_identical(monkeypatch):
    model = make_model(seed=3)
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        want = model.generate(tokens, 12, temperature=0)
        logits_want = model(
            torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
        )
    calls = count_dynamics(monkeypatch)
    for blk in model.blocks:
        blk.mixer._dynamics_cache = None
    assert torch.equal(model.generate(tokens, 12, temperature=0), want)
    assert len(calls) == 2  # once per layer: the prompt and 11 decoding steps share them
    # the same logits as without any cache
    monkeypatch.setattr(KLALayer, "_dynamics", lambda self, dtype: self.dynamics(dtype))
    with torch.no_grad():
        got = model(torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1)))
    assert torch.equal(got, logits_want)


def test_bundled_logits_follow_a_data_edit():
    model = load_checkpoint()
    ids = torch.tensor([list(b"def f(x):\n    return x\n")])
    with torch.no_grad():
        model(ids)
        for blk in model.blocks:
            blk.mixer.lambda_log.data.add_(2.0)
        stale = model(ids)
    assert torch.equal(stale, model(ids).detach())


# ---------------------------------------------------------------------- bugs 2, 6, 7: checkpoints


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_checkpoint_with_non_finite_values_is_refused(tmp_path, value):
    from safetensors.torch import load_file, save_file

    d = save_checkpoint(make_model(), tmp_path / "ck")
    sd = load_file(str(d / "model.safetensors"))
    sd["blocks.0.mixer.delta"][3, 1] = value
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"blocks\.0\.mixer\.delta: expected finite values, "
                       r"got 1 NaN or inf"):  # fmt: skip
        load_checkpoint(d)
    with pytest.raises(CheckpointError, match="blocks.0.mixer.delta"):
        load_state_dict(make_model(), sd)


def test_save_checkpoint_refuses_a_non_floating_dtype(tmp_path):
    with pytest.raises(TypeError, match=r"dtype: expected None or a floating torch.dtype.*int8"):
        save_checkpoint(make_model(), tmp_path / "ck", dtype=torch.int8)
    assert not (tmp_path / "ck").exists()


def test_checkpoint_file_paths_get_a_hint(tmp_path):
    d = save_checkpoint(make_model(), tmp_path / "ck")
    with pytest.raises(CheckpointError, match=rf"got its file .*model.safetensors.*pass '{d}'"):
        load_checkpoint(d / "model.safetensors")
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not unpickled")
    with pytest.raises(CheckpointError, match=r"pickle file .*safetensors.torch.save_file"):
        load_checkpoint(pt)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing")


def test_unknown_config_version_is_refused(tmp_path):
    d = save_checkpoint(make_model(), tmp_path / "ck")
    config = json.loads((d / "config.json").read_text())
    assert config["version"] == 1
    config["version"] = 99
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"version: expected one of \[1\].*got 99"):
        load_checkpoint(d)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dtype": "float32"}, TypeError, r"dtype: expected a floating torch.dtype.*'float32'"),
        ({"dtype": torch.int64}, TypeError, r"dtype: expected a floating torch.dtype.*int64"),
        ({"device": "nope"}, ValueError, r"device: expected a torch device.*'nope'"),
        ({"backend": "nope"}, ValueError, r"backend: expected 'auto' or one of .*'nope'"),
    ],
    ids=["dtype-str", "dtype-int", "device-bad", "backend"],
)
def test_load_checkpoint_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        load_checkpoint(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA devices")
def test_load_checkpoint_on_a_missing_cuda_device():
    with pytest.raises(ValueError, match=r"device: expected an available device, got 'cuda'"):
        load_checkpoint(device="cuda")


def test_load_checkpoint_directory_type():
    with pytest.raises(TypeError, match=r"directory: expected a path .*got int"):
        load_checkpoint(123)


# ---------------------------------------------------------------------- bug 5: inputs


def test_layer_input_dtype_is_named():
    layer = KLALayer(32, KLAConfig(d_state=4))
    for dtype in (torch.float64, torch.bfloat16):
        with pytest.raises(TypeError, match=rf"x: expected dtype torch.float32 .*got {dtype}"):
            layer(torch.randn(1, 5, 32, dtype=dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed dtypes are autocast's job
        assert layer(torch.randn(1, 5, 32, dtype=torch.bfloat16)).shape == (1, 5, 32)


def test_layer_without_channels_is_refused():
    with pytest.raises(ValueError, match=r"config.expand: expected .*>= 1 .*expand=0.01 .*M = 0"):
        KLALayer(32, KLAConfig(expand=0.01))


@pytest.mark.parametrize("bad", [256, -1])
def test_model_token_ids_out_of_range(bad):
    model = make_model()
    with pytest.raises(ValueError, match=rf"tokens: expected ids in \[0, 256\).*{bad}"):
        model(torch.tensor([[1, bad]]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"top_k": 0}, r"top_k: expected None or an int >= 1, got 0"),
        ({"top_k": -1}, r"top_k: expected None or an int >= 1, got -1"),
        ({"top_k": 2.5}, r"top_k: expected None or an int >= 1, got 2.5"),
        ({"temperature": float("nan")}, r"temperature: expected a finite number >= 0, got nan"),
        ({"temperature": float("inf")}, r"temperature: expected a finite number >= 0, got inf"),
        ({"temperature": -1.0}, r"temperature: expected a finite number >= 0, got -1.0"),
    ],
    ids=["topk0", "topk-1", "topk-float", "temp-nan", "temp-inf", "temp-neg"],
)
def test_generate_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_model().generate(torch.tensor([[1, 2]]), 3, **kwargs)


def test_inspect_arguments():
    model = make_model(n_layers=3, mixers=["kla", "attention", "kla"])
    with pytest.raises(
        ValueError, match="tokens: expected at least one sequence, got an empty list"
    ):
        inspect(model, [])
    with pytest.raises(ValueError, match=r"layers: expected distinct layers, got \[0\]"):
        inspect(model, "hi", layers=[0, 0])
    ds = inspect(model, "hi", layers=np.int64(2))
    assert ds.layer.values.tolist() == [2]
    with pytest.raises(TypeError, match="layers: expected a layer label or a list"):
        inspect(model, "hi", layers=2.0)


def test_plot_layer_and_batch_are_checked():
    import matplotlib

    matplotlib.use("Agg")
    from kalmanscan.kla.plot import (
        plot_comparison,
        plot_layer_summary,
        plot_overview,
        plot_precision,
    )

    model = make_model(n_layers=3, mixers=["kla", "attention", "kla"])
    ds = inspect(model, "hello")
    for f in (plot_precision, plot_overview):
        with pytest.raises(ValueError, match=r"layer: expected a position along ds.layer, an int "
                           r"in \[-2, 2\) \(ds.layer holds \[0, 2\]\), got 3"):  # fmt: skip
            f(ds, layer=3)
        with pytest.raises(ValueError, match=r"batch: expected a position along ds.batch.*got 3"):
            f(ds, batch=3)
    with pytest.raises(ValueError, match=r"batch: expected .*got 1"):
        plot_layer_summary(ds, batch=1)
    with pytest.raises(ValueError, match=r"layer: expected .*got 2"):
        plot_comparison(compare(model, "ab", "cd", detail=False), layer=2)


# ---------------------------------------------------------------------- bugs 3, 4: the CLI


def run_cli(argv):
    from kalmanscan.cli import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse's errors
        return exc.code


@pytest.fixture
def ckpt(tmp_path):
    return save_checkpoint(make_model(n_layers=3, mixers=["kla", "attention", "kla"]),
                           tmp_path / "ck")  # fmt: skip


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--layer", "7"], r"--layer: expected one of the inspected blocks \[0, 2\], got 7"),
        (["--layer", "1"], r"--layer: expected one of the inspected blocks \[0, 2\], got 1"),
        (["--layers", "0", "--layer", "2"], r"--layer: expected one of the blocks in --layers"),
        (["--layers", "1"], r"--layers: expected KLA blocks of the model \[0, 2\], got \[1\]"),
        (["--backend", "nope"], r"--backend: expected 'auto' or one of .*'nope'"),
        (["--device", "nope"], r"--device: expected a torch device"),
    ],
    ids=["layer-7", "layer-attn", "layer-not-in-layers", "layers-attn", "backend", "device"],
)
def test_cli_flags_are_checked_before_the_run(tmp_path, capsys, ckpt, monkeypatch, flags, message):
    kinspect = _inspect  # the module the CLI imports from

    def no_run(*a, **k):
        raise AssertionError("the inspection ran")

    monkeypatch.setattr(kinspect, "inspect", no_run)
    out = tmp_path / "out"
    rc = run_cli(["inspect", "hello", "--checkpoint", str(ckpt), "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and "config.json" not in err
    assert re.search(message, err), err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA devices")
def test_cli_cuda_without_cuda(tmp_path, capsys, ckpt):
    rc = run_cli(["inspect", "hello", "--device", "cuda", "--checkpoint", str(ckpt),
                  "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "--device: expected an available device, got 'cuda'" in err


def test_cli_layer_is_the_block_drawn(tmp_path, ckpt, monkeypatch):
    import kalmanscan.kla.plot as kplot

    drawn = []
    original = kplot.plot_overview

    def spy(ds, *, layer=-1, **kw):
        drawn.append(int(ds.layer.values[layer]))
        return original(ds, layer=layer, **kw)

    monkeypatch.setattr(kplot, "plot_overview", spy)
    for flags, block in ((["--layer", "0"], 0), (["--layers", "0,2", "--layer", "2"], 2), ([], 2)):
        rc = run_cli(["inspect", "hello", "--checkpoint", str(ckpt),
                      "--out", str(tmp_path / "o"), *flags])  # fmt: skip
        assert rc == 0 and drawn[-1] == block


def test_cli_output_and_text_errors(tmp_path, capsys, ckpt):
    afile = tmp_path / "a_file"
    afile.write_text("x")
    rc = run_cli(["inspect", "hello", "--checkpoint", str(ckpt), "--out", str(afile)])
    err = capsys.readouterr().err
    assert rc == 2 and "--out: expected a directory" in err and "Traceback" not in err
    src = tmp_path / "t.txt"
    src.write_text("FROMFILE")
    rc = run_cli(["inspect", "ARGUMENT", "--file", str(src), "--checkpoint", str(ckpt),
                  "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 2 and "TEXT, --file: expected one of them, got both" in capsys.readouterr().err
    rc = run_cli(["inspect", "a", "--compare", "b", "--compare-file", str(src),
                  "--checkpoint", str(ckpt), "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 2 and "--compare, --compare-file" in capsys.readouterr().err


def test_cli_write_errors_after_the_run_are_messages(tmp_path, capsys, ckpt, monkeypatch):
    kinspect = _inspect

    def fail(ds, path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(kinspect, "save_dataset", fail)
    rc = run_cli(["inspect", "hello", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "--out: cannot write into" in err and "Traceback" not in err


# ---------------------------------------------------------------------- bug 8: plots


def _extent(ax):
    bb = ax.get_position()
    return round(bb.x0, 6), round(bb.x1, 6)


@pytest.mark.parametrize("L", [200, 4000], ids=["T200", "T4000"])
def test_panels_line_up(L):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.kla.plot import plot_comparison, plot_overview

    model = make_model()
    text = (TEXT * (L // len(TEXT) + 1))[:L]
    for axes in (
        plot_overview(inspect(model, text, detail=False)),
        plot_comparison(compare(model, text, text[: L // 2], detail=False)),
    ):
        fig = axes[0].figure
        fig.canvas.draw()
        extents = {_extent(ax) for ax in axes}
        assert len(extents) == 1, extents  # every panel: the same x extent in the figure
        assert len({ax.get_xlim() for ax in axes}) == 1  # and the same token range
        strips = [a for a in fig.axes if a.get_ylabel().startswith("surprisal\n0-")]
        assert len(strips) == (1 if len(axes) == 5 else 0)  # the overview's, under panel 0
        assert all(_extent(a) == _extent(axes[0]) for a in strips)
        # the curves' points sit at the heatmap's column centres: the same tokens per column
        img = axes[0].images[0]
        x0, x1 = img.get_extent()[:2]
        ncol = img.get_array().shape[1]
        centres = x0 + (np.arange(ncol) + 0.5) * (x1 - x0) / ncol
        for ax in axes[1:]:
            for line in ax.get_lines():
                x = line.get_xdata()
                if len(x) > 2:
                    np.testing.assert_allclose(x, centres[: len(x)])
        plt.close(fig)


def test_window_figure_labels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.kla.plot import plot_precision

    model = make_model()
    text = "héllo ✓ 🚀 日本語 " + TEXT * 3
    ds = inspect(model, text, window=(0, 30), channels=range(32))
    data = text.encode()
    labels = ds.token.values[0].tolist()
    assert labels[:4] == ["h", "é", "", "l"] and labels[7:10] == ["✓", "", ""]
    assert "".join(labels).replace("␣", " ").replace("\\n", "\n") == text
    assert len(labels) == len(data)
    ax = plot_precision(ds, relative_to="baseline", sort_by="timescale")
    fig = ax.figure
    strip = fig.axes[-1]
    ticks = [t.get_text() for t in strip.get_xticklabels()]
    assert ticks[:4] == ["h", "é", "", "l"]
    assert strip.get_xlabel() == "tokens at positions 0–29"
    assert "tokens 0–29" in ax.get_title()
    # the first token's surprisal is undefined: masked, drawn in the colormap's "bad" colour
    im = strip.images[0]
    arr = im.get_array()
    assert bool(np.ma.getmaskarray(arr)[0, 0]) and not np.ma.getmaskarray(arr)[0, 1:].any()
    assert tuple(im.get_cmap().get_bad()) != tuple(im.get_cmap()(0.0))
    assert "red: none" in strip.get_ylabel()
    # sorted rows: the y ticks name channel ids, not row ranks
    order = ds.detail_channel.values[
        np.argsort(np.exp(np.log(ds.timescale.isel(layer=-1).values).mean(-1)), kind="stable")
    ]
    ticks = ax.get_yticks().astype(int)
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(order[r]) for r in ticks]
    assert ax.get_ylabel() == "channel (rows by timescale)"
    plt.close(fig)
