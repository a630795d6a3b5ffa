"""What a user-style probe of the KLA inspection tools found, each checked: left-padded
tokenizer outputs give what the unpadded texts give (and masks with gaps are refused),
save_dataset's boolean variables read back as bool, the surprisal strip's scale, the overview
of a one-token text, error messages that name the argument, the strip's colour as the docs and
the legend name it, float16 checkpoints' conv.bias in the docs, and token labels that read
horizontally where they fit without pushing the axis label into the panel below."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest
import torch

from kalmanscan.kla import (
    ModelConfig,
    compare,
    inspect,
    save_checkpoint,
    save_dataset,
    summarize,
)
from kalmanscan.kla.inspect_record import _SUMMARIES
from kalmanscan.testing import tolerance
from tests.test_kla_inspect import TEXT, Tagger, make_model  # (the inspect tests' own)

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"

# batch rows (float64 model) against the same text alone: rounding of batched matrix products
ROWS = tolerance("rounding", "float64")


def _close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=ROWS, atol=ROWS, equal_nan=True, err_msg=what)


# ---------------------------------------------------------------------- 1. left padding

# three texts, laid out left-padded, right-padded and padded on both sides (pad id 0)
TEXTS = [list(b"for x in y:"), list(b"x = 1"), list(b"while True:\n  pass")]
FIRST = [7, 0, 1]  # each row's first token
L = 20


def _padded():
    ids = torch.zeros(3, L, dtype=torch.int64)
    mask = torch.zeros(3, L, dtype=torch.int64)
    for b, (row, s) in enumerate(zip(TEXTS, FIRST, strict=True)):
        ids[b, s : s + len(row)] = torch.tensor(row)
        mask[b, s : s + len(row)] = 1
    return ids, mask


_PER_TIME = _SUMMARIES  # (the per-token summaries over lanes)
_DETAIL = (
    "posterior_precision",
    "prior_precision",
    "baseline_precision",
    "information_added",
    "write_gain",
    "forget_gate",
    "value",
    "readout_variance",
    "key",
    "output_variance",
)


@pytest.mark.parametrize("chunk", [3, 512], ids=["chunk3", "chunk512"])
def test_left_padding_gives_the_unpadded_texts(chunk):
    """Each row of a tokenizer output padded on the left (or both sides) gives, at its valid
    positions, exactly what its text gives unpadded; padding is NaN. (The padding ran through
    every filter, and the first real token got a surprisal predicted from the padding.)"""
    model = make_model()
    ids, mask = _padded()
    ds = inspect(model, {"input_ids": ids, "attention_mask": mask}, chunk_size=chunk, bin_size=1)
    assert ds.mask.values.tolist() == mask.bool().tolist()
    # rows starting at different positions: one baseline curve per row
    assert ds.mean_log10_baseline_precision.dims == ("layer", "batch", "time")
    for b, (row, s) in enumerate(zip(TEXTS, FIRST, strict=True)):
        n = len(row)
        one = inspect(model, torch.tensor([row]), chunk_size=chunk, bin_size=1)
        valid = slice(s, s + n)
        for name in _PER_TIME:
            _close(ds[name].values[:, b, valid], one[name].values[:, 0], f"{name} row {b}")
            assert np.isnan(ds[name].values[:, b, :s]).all(), name
            assert np.isnan(ds[name].values[:, b, s + n :]).all(), name
        _close(
            ds.mean_log10_baseline_precision.values[:, b, valid],
            one.mean_log10_baseline_precision.values,
            f"baseline row {b}",
        )
        # NaN at the row's padding on either side, as the other variables
        base = ds.mean_log10_baseline_precision.values[:, b]
        assert np.isnan(base[:, :s]).all() and np.isnan(base[:, s + n :]).all()
        got = ds.surprisal.values[b]
        assert np.isnan(got[s]), "the first real token has no prediction"
        _close(got[valid], one.surprisal.values[0], f"surprisal row {b}")
        assert np.isnan(got[:s]).all() and np.isnan(got[s + n :]).all()
        for name in _DETAIL:
            _close(ds[name].values[:, b, valid], one[name].values[:, 0], f"{name} row {b}")
            assert np.isnan(ds[name].values[:, b, :s]).all(), name
            assert np.isnan(ds[name].values[:, b, s + n :]).all(), name
        for name in ("binned_log10_text_precision", "binned_information_bits"):
            _close(ds[name].values[:, b, valid], one[name].values[:, 0], f"{name} row {b}")
        assert ds.token.values[b, valid].tolist() == one.token.values[0].tolist()
        assert set(ds.token.values[b, :s]) <= {""} and set(ds.token.values[b, s + n :]) <= {""}
    # lane statistics over every valid token, and the summary table: those of the same texts
    # padded on the right
    right = inspect(model, TEXTS, chunk_size=chunk, detail=False)
    for name in ("lane_mean_log10_text_precision", "lane_mean_information_bits"):
        _close(ds[name].values, right[name].values, name)
    np.testing.assert_allclose(summarize(ds).values, summarize(right).values, rtol=1e-9, atol=1e-12)


def test_left_padding_bins_and_window_at_the_input_positions():
    """Bins and the window are in the input's positions: a bin of a left-padded row averages
    the valid tokens in it (checked against the per-lane detail), the window's positions before
    the first token are NaN, and rows that all start at the same position keep one baseline
    curve ``[layer, time]`` (NaN before it)."""
    model = make_model(torch.float32, mixers=("kla",))
    text = list(TEXT.encode())
    s, n = 5, len(text)
    ids = torch.zeros(2, s + n, dtype=torch.int64)
    ids[:, s:] = torch.tensor(text)
    mask = (torch.arange(s + n) >= s).expand(2, -1)
    ds = inspect(model, ids, attention_mask=mask, bin_size=4, window=(2, 12), chunk_size=8)
    one = inspect(model, TEXT, bin_size=4, chunk_size=8)
    assert ds.mean_log10_baseline_precision.dims == ("layer", "time")
    base = ds.mean_log10_baseline_precision.values[0]
    assert np.isnan(base[:s]).all()
    tol = tolerance("rounding", "float32")
    np.testing.assert_allclose(base[s:], one.mean_log10_baseline_precision.values[0], rtol=tol)
    d = ds.isel(layer=0, batch=0)
    assert np.isnan(d.posterior_precision.values[: s - 2]).all()  # window 2..4: padding
    np.testing.assert_allclose(
        d.posterior_precision.values[s - 2 :],
        one.posterior_precision.isel(layer=0, batch=0).values[: 12 - s],
        rtol=tol,
    )
    # bins [0, 4), [4, 8), ...: the information bits of the valid tokens in each, by hand
    full = inspect(model, ids, attention_mask=mask, bin_size=4, chunk_size=8).isel(layer=0)
    lam = full.posterior_precision.values[0].astype(np.float64)  # [L, M, S]
    prior = full.prior_precision.values[0].astype(np.float64)
    bits = (0.5 * np.log2(lam / prior)).mean(-1)  # slot means [L, M]
    for k, start in enumerate(full.bin.values):
        tokens = [t for t in range(start, start + 4) if s <= t < s + n]
        got = full.binned_information_bits.values[0, k]
        if not tokens:
            assert np.isnan(got).all()
            continue
        np.testing.assert_allclose(got, bits[tokens].mean(0), rtol=1e-4, err_msg=f"bin {k}")


def test_left_padding_of_any_module():
    """A module called once with a left-padded tokenizer output gets each row's tokens from
    its first on (and the mask cut alike)."""
    torch.manual_seed(4)
    model = Tagger().double().eval()
    rows = [[3, 7, 9, 11, 2], [4, 8, 1]]
    tokens = {
        "input_ids": torch.tensor([[0, 0, 0, 3, 7, 9, 11, 2], [0, 4, 8, 1, 0, 0, 0, 0]]),
        "attention_mask": torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0, 0]]),
    }
    ds = inspect(model, tokens)
    for b, (row, s) in enumerate(zip(rows, (3, 1), strict=True)):
        one = inspect(model, {"input_ids": torch.tensor([row])})
        valid = slice(s, s + len(row))
        for name in ("posterior_precision", "mean_information_bits", "value"):
            _close(ds[name].values[:, b, valid], one[name].values[:, 0], f"{name} row {b}")
            assert np.isnan(ds[name].values[:, b, :s]).all(), name
        _close(ds.surprisal.values[b, valid], one.surprisal.values[0], f"surprisal row {b}")
        assert np.isnan(ds.surprisal.values[b, s])
        assert ds.token.values[b, valid].tolist() == one.token.values[0].tolist()


@pytest.mark.parametrize(
    "mask, row, shown",
    [
        ([[1, 1, 1, 1], [1, 0, 1, 1]], 1, "[1, 0, 1, 1] with ones at positions 0, 2-3"),
        ([[0, 1, 0, 1], [1, 1, 1, 1]], 0, "[0, 1, 0, 1] with ones at positions 1, 3"),
        ([[1, 1, 1, 1], [0, 0, 0, 0]], 1, "[0, 0, 0, 0] with no token"),
    ],
    ids=["gap", "two-runs", "no-token"],
)
def test_a_mask_that_is_not_one_run_is_refused(mask, row, shown):
    model = make_model(torch.float32, mixers=("kla",))
    ids = torch.full((2, 4), 100)
    for tokens, kwargs in (
        ({"input_ids": ids, "attention_mask": mask}, {}),
        (ids, {"attention_mask": torch.tensor(mask)}),
    ):
        with pytest.raises(ValueError) as err:
            inspect(model, tokens, **kwargs)
        message = str(err.value)
        assert message.startswith("attention_mask: expected each row to be one contiguous run")
        assert "left" in message and "right" in message
        assert f"got row {row} {shown}" in message


def test_a_long_mask_with_gaps_is_described_by_its_runs():
    model = make_model(torch.float32, mixers=("kla",))
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, 10:12] = False
    with pytest.raises(ValueError, match=r"got row 0 with ones at positions 0-9, 12-39"):
        inspect(model, torch.full((1, 40), 100), attention_mask=mask)


def test_docs_say_left_and_right_padding_work():
    for name in ("kla.md", "api.md"):
        text = " ".join((DOCS / name).read_text().split())
        assert "on the left" in text and "contiguous run of ones" in text, name


# ---------------------------------------------------------------------- 2. netCDF booleans


_ENGINES = [
    pytest.param(
        e,
        marks=pytest.mark.skipif(importlib.util.find_spec(m) is None, reason=f"needs {m}"),
        id=e,
    )
    for e, m in (("scipy", "scipy"), ("h5netcdf", "h5netcdf"), ("netcdf4", "netCDF4"))
]


@pytest.mark.parametrize("engine", _ENGINES)
def test_saved_booleans_read_back_as_bool(engine, tmp_path, monkeypatch):
    """``mask`` and ``process_noise_at_floor`` were written as int8 and read back as int8:
    ``surprisal[b][mask[b]]`` then picked rows 0 and 1 (fancy indexing) instead of the valid
    tokens. With each engine save_dataset would pick (the others hidden)."""
    import xarray as xr

    preferred = {"scipy": ("h5netcdf", "netCDF4"), "h5netcdf": (), "netcdf4": ("h5netcdf",)}
    hidden = preferred[engine]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in hidden else find_spec(name, *a),
    )
    model = make_model(torch.float32, mixers=("kla",))
    ds = inspect(model, ["def add(a, b):", "x = 1"], detail=False)
    path = tmp_path / "i.nc"
    assert save_dataset(ds, path) == engine
    with xr.open_dataset(path, engine=engine) as back:
        for name in ("mask", "process_noise_at_floor"):
            assert back[name].dtype == bool, name
            np.testing.assert_array_equal(back[name].values, ds[name].values)
        mem = ds.surprisal.values[1][ds.mask.values[1]]
        np.testing.assert_array_equal(back.surprisal.values[1][back.mask.values[1]], mem)
        assert len(mem) == 5
        assert summarize(back).shape == summarize(ds).shape
    assert ds.mask.dtype == bool  # the caller's dataset is not changed


# ---------------------------------------------------------------------- 3, 4, 6, usability: plots


@pytest.fixture
def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def _strip(fig):
    """The surprisal strip under a heatmap (an image; the overview's last panel is a curve)."""
    return next(a for a in fig.axes if a.images and a.get_ylabel().startswith("surprisal\n"))


@pytest.mark.parametrize(
    "top, label", [(0.0703, "0-0.07 bits"), (0.46, "0-0.46 bits"), (8.49, "0-8.5 bits"),
                   (12.3, "0-12 bits")],
)  # fmt: skip
def test_surprisal_strip_scale_has_significant_digits(plt, top, label):
    """The scale read "0-0 bits" where the largest surprisal was under 0.5."""
    from kalmanscan.kla.plot import plot_precision

    ds = inspect(make_model(torch.float32, mixers=("kla",)), TEXT)
    s = ds.surprisal.values
    ds["surprisal"] = (
        ("batch", "time"),
        np.where(np.isnan(s), np.nan, top * np.linspace(0, 1, s.shape[1])),
    )
    ax = plot_precision(ds)
    strip = _strip(ax.figure)
    assert strip.get_ylabel() == f"surprisal\n{label}\nred: none"
    assert strip.images[0].get_clim()[1] == pytest.approx(top)


def test_the_undefined_surprisal_is_red_as_the_legend_and_docs_say(plt):
    """The strip drew undefined values in magenta (#e7298a) while the legend and docs said
    red."""
    import matplotlib.colors

    from kalmanscan.kla.plot import plot_precision

    ax = plot_precision(inspect(make_model(torch.float32, mixers=("kla",)), TEXT))
    strip = _strip(ax.figure)
    assert "red: none" in strip.get_ylabel()
    r, g, b, _ = strip.images[0].get_cmap().get_bad()
    h, sat, v = matplotlib.colors.rgb_to_hsv((r, g, b))
    assert (h < 0.03 or h > 0.97) and sat > 0.7 and v > 0.6, (r, g, b)  # red, not magenta
    docs = " ".join((DOCS / "kla.md").read_text().split())
    assert "(the first token has no prediction) in red" in docs


def test_one_token_overview_keeps_its_labels_on_the_figure(plt):
    """One token (or any range under a decade) on the log axis of "bits told per lane": the
    long minor-tick labels (1.065x10^-1) pushed the y label off the canvas. The surprisal
    strip read "0-? bits"."""
    from kalmanscan.kla.plot import plot_overview

    ds = inspect(make_model(torch.float32), "x", detail=False)
    axes = plot_overview(ds)
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = axes[3]
    label = ax.yaxis.label.get_window_extent(renderer)
    assert ax.get_ylabel() == "bits told per lane"
    assert label.x0 >= 0, label  # on the figure
    shown = [t for t in ax.get_yticklabels() if t.get_text() and t.get_visible()]
    lo, hi = ax.get_ylim()
    assert len(shown) >= 2 and hi / lo >= 10  # whole decades, labelled at the powers of ten
    for t in shown:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= label.x0 + box.width + 60, t.get_text()
        assert "10^{" in t.get_text() or len(t.get_text()) <= 6, t.get_text()
    assert ax.yaxis.get_minor_formatter()(0.2) == ""
    values = ds.mean_information_bits.values[:, 0, 0]
    assert (lo <= values).all() and (values <= hi).all()  # the data still shown
    assert _strip(fig).get_ylabel() == "surprisal\nred: none"


def test_wide_range_log_axis_is_left_to_matplotlib(plt):
    from kalmanscan.kla.plot import plot_overview

    ds = inspect(make_model(torch.float32), TEXT * 3, detail=False)
    values = ds.mean_information_bits.values[:, 0]
    assert np.nanmax(values) / np.nanmin(values) > 10
    axes = plot_overview(ds)
    lo, hi = axes[3].get_ylim()
    assert lo > 0 and not (np.log10(lo).is_integer() and np.log10(hi).is_integer())


def test_token_labels_horizontal_where_they_fit(plt):
    """Labels were drawn vertically even for 14 tokens (accents hard to read sideways)."""
    from kalmanscan.kla.plot import plot_precision

    text = "Über café naïve"
    ds = inspect(make_model(torch.float32, mixers=("kla",)), text)
    ax = plot_precision(ds)
    ticks = [t for t in _strip(ax.figure).get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in ticks][:3] == ["Ü", "b", "e"]
    assert all(t.get_rotation() == 0 for t in ticks)
    # 400 tokens in a 12-inch figure: columns too narrow, vertical
    ds = inspect(make_model(torch.float32, mixers=("kla",)), (TEXT * 12)[:400], detail=False)
    ax = plot_precision(ds, "binned_log10_text_precision", max_labels=400)
    ticks = [t for t in _strip(ax.figure).get_xticklabels() if len(t.get_text()) > 1]
    assert ticks and all(t.get_rotation() == 90 for t in ticks)


def test_code_point_labels_do_not_push_the_axis_label_into_the_next_panel(plt):
    """Characters no installed font has are labelled by code point (U+1F642); drawn vertically
    at full size these pushed the x label down against the next panel's title."""
    from kalmanscan.kla.plot import plot_overview
    from kalmanscan.plot import drawable_text

    text = "Über café — 東京 ✓ naïve 🙂 x\n"
    ds = inspect(make_model(torch.float32), text, detail=False)
    labels, _ = drawable_text(list(ds.token.values[0]), "monospace")
    axes = plot_overview(ds)
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    strip = _strip(fig)
    ticks = [t for t in strip.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in ticks] == [t for t in labels if t]
    boxes = [t.get_window_extent(renderer) for t in ticks]
    tallest = max(b.height for b in boxes) * 72.0 / fig.dpi  # points
    assert tallest <= 5 * 0.62 * 7 + 4, tallest  # as tall as 5 characters at 7 points
    one_char = [t for t in ticks if len(t.get_text()) == 1]
    assert one_char and all(t.get_rotation() == 0 for t in one_char)  # é, ï read upright
    xlabel = strip.xaxis.label.get_window_extent(renderer)
    title = axes[1].title.get_window_extent(renderer)
    gap = (xlabel.y0 - title.y1) * 72.0 / fig.dpi
    assert gap >= 6.0, gap  # points between the x label and the next panel's title
    assert all(b.y0 >= xlabel.y1 for b in boxes)  # the labels above the axis label


# ---------------------------------------------------------------------- 4. CLI, one token


def test_cli_one_token_says_there_is_no_surprisal(tmp_path, capsys):
    from kalmanscan.cli import main

    ck = save_checkpoint(make_model(torch.float32), tmp_path / "ck")
    assert main(["inspect", "x", "--checkpoint", str(ck), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "text 0: model surprisal none (one token: no prediction)" in out
    assert "nan bits" not in out
    assert main(["inspect", "xy", "--checkpoint", str(ck), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if t.startswith("text 0: model surprisal"))
    assert line.endswith(" bits/byte") and math.isfinite(float(line.split()[-2]))


# ---------------------------------------------------------------------- 5. messages


def test_summarize_names_what_it_expected():
    import xarray as xr

    with pytest.raises(TypeError, match=r"^ds: expected the xarray.Dataset returned by inspect"):
        summarize({"a": 1})
    with pytest.raises(TypeError, match=r"got dict$"):
        summarize({"a": 1})
    with pytest.raises(ValueError, match=r"^ds: expected a Dataset returned by inspect\(\)"):
        summarize(xr.Dataset({"a": ("x", [1.0])}))
    with pytest.raises(ValueError, match=r"got one without \['mask'"):
        summarize(xr.Dataset({"a": ("x", [1.0])}))


def test_model_config_unknown_kla_keys():
    with pytest.raises(ValueError) as err:
        ModelConfig(kla={"dstate": 4})
    message = str(err.value)
    assert message.startswith("kla: unknown KLAConfig keys ['dstate']; expected a subset of [")
    assert "'d_state'" in message
    with pytest.raises(ValueError, match=r"^attention: unknown AttentionConfig keys \['heads'\]"):
        ModelConfig(attention={"heads": 2})
    assert ModelConfig(kla={"d_state": 3}).kla.d_state == 3
    with pytest.raises(ValueError, match="config: unknown kla keys"):  # from_dict: as before
        ModelConfig.from_dict({"kla": {"dstate": 4}})


def test_compare_names_the_empty_text():
    model = make_model(torch.float32, mixers=("kla",))
    with pytest.raises(ValueError, match=r"^text_b: expected at least one byte, got an empty"):
        compare(model, "hello", "")
    with pytest.raises(ValueError, match=r"^text_a: expected at least one byte"):
        compare(model, b"", "hello")
    with pytest.raises(ValueError, match=r"^text_b: expected one text or one id sequence, got"):
        compare(model, "hello", [[1, 2], [3, 4]])
    ds = compare(model, "hello", torch.tensor([104, 105]), detail=False)
    assert ds.mask.values.sum(1).tolist() == [5, 2]


def test_save_checkpoint_onto_a_file_names_directory(tmp_path):
    model = make_model(torch.float32, mixers=("kla",))
    path = tmp_path / "x.pt"
    path.write_bytes(b"not a directory")
    with pytest.raises(FileExistsError) as err:
        save_checkpoint(model, path)
    message = str(err.value)
    assert message.startswith("directory: expected a directory to write model.safetensors")
    assert f"got {str(path)!r}, a file" in message
    with pytest.raises(FileExistsError, match=r"a path under the file"):
        save_checkpoint(model, path / "sub")
    assert path.read_bytes() == b"not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pt"]  # nothing written


# ---------------------------------------------------------------------- 6. conv.bias in docs


def test_float16_checkpoint_conv_bias_is_documented(tmp_path):
    """conv.bias (a vector, neither a matrix nor dynamics nor a norm) is stored in the
    checkpoint's dtype; the docs described only matrices against dynamics and norms."""
    from safetensors.torch import load_file

    ck = save_checkpoint(make_model(torch.float32), tmp_path / "ck", dtype=torch.float16)
    stored = load_file(str(ck / "model.safetensors"))
    assert stored["blocks.0.mixer.conv.bias"].dtype == torch.float16
    assert stored["blocks.0.mixer.delta"].dtype == torch.float32
    docs = " ".join((DOCS / "kla.md").read_text().split())
    i = docs.index("save_checkpoint(model, dir, dtype=torch.float16)")
    assert "`conv.bias`" in docs[i : i + 800] and "stored in `dtype`" in docs[i : i + 800]


def test_left_padding_ids_are_not_run():
    """The model never sees a row's left padding, so its ids need not be in the vocabulary
    (those after the tokens, run with the row, still must)."""
    model = make_model(torch.float32, mixers=("kla",))
    ids = torch.tensor([[-1, -1, 100, 101], [100, 101, 102, 103]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    ds = inspect(model, {"input_ids": ids, "attention_mask": mask}, detail=False)
    one = inspect(model, torch.tensor([[100, 101]]), detail=False)
    _close(ds.surprisal.values[0, 2:], one.surprisal.values[0], "surprisal")
    assert ds.token_id.values[0].tolist() == [-1, -1, 100, 101]
    with pytest.raises(ValueError, match=r"tokens: expected ids in \[0, 256\), got range \[-1"):
        inspect(model, torch.tensor([[100, 101, -1]]), attention_mask=torch.tensor([[1, 1, 0]]))
