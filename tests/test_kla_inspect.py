"""Belief-state inspection: values against kalmanscan.filter run on the captured inputs (the
no-observation baseline against the filter with every observation missing), outputs unchanged,
chunking/window/selection invariance, padded batches, any module containing KLALayers,
per-layer summaries, netCDF, plots and the ``kalmanscan inspect`` CLI."""

from __future__ import annotations

import io
import math
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kalmanscan
from kalmanscan.kla import (
    AttentionConfig,
    KLAConfig,
    KLALanguageModel,
    KLALayer,
    ModelConfig,
    compare,
    inspect,
    kla_layers,
    save_checkpoint,
    save_dataset,
    summarize,
)
from kalmanscan.kla.inspect_record import _Recorder
from kalmanscan.testing import assert_close, tolerance

# surprisal against log_softmax of the same logits: rounding (float64 model)
ROUNDING = tolerance("rounding", "float64")
TEXT = "def add(a, b):\n    return a + b  # sum\n"


def make_model(dtype=torch.float64, seed=0, mixers=("kla", "attention", "kla")):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=16,
        n_layers=len(mixers),
        mixers=list(mixers),
        kla=KLAConfig(d_state=4),
        attention=AttentionConfig(n_heads=2),
    )
    model = KLALanguageModel(cfg).to(dtype).eval()
    with torch.no_grad():
        for i in model.kla_blocks:
            mix = model.blocks[i].mixer
            mix.lambda_log.normal_(0.0, 1.0)
            mix.process_noise.uniform_(0.005, 0.3)
            mix.sensor_proj.weight.normal_(0.0, 0.3)
    return model


def reference(layer, raw):
    """kalmanscan.filter on the lanes rebuilt by hand from a captured sensor projection:
    the filter on the text, and the filter with every observation missing (the baseline)."""
    M, S = layer.d_inner, layer.d_state
    raw = raw.double()
    v, logvar, k, q = raw.split([M, M, S, S], -1)
    k = k / k.norm(dim=-1, keepdim=True)
    q = q / q.norm(dim=-1, keepdim=True)
    Lv = 1.0 / (F.softplus(logvar) + 1e-4)
    decay, pvar = (t.double() for t in layer.dynamics(torch.float64))
    args = dict(
        obs_var=(1.0 / Lv)[..., None],
        decay=decay,
        process_var=pvar,
        loading=k[:, :, None, :],
        prior_mean=0.0,
        prior_var=1.0,
        axis=1,
        backend="sequential",
    )
    z = v[..., None].expand(-1, -1, M, S)
    res = kalmanscan.filter(z, **args)
    none = kalmanscan.filter(torch.full_like(z, float("nan")), **args)
    return res, none.precision, v, Lv, k, q, decay


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]
)
def test_inspection_equals_filter_on_captured_inputs(dtype):
    """Capture each KLA block's raw sensor projection with a forward hook, run
    kalmanscan.filter on the (channel, slot) lanes and compare every view with it."""
    model = make_model(dtype)
    captured = {}
    hooks = [
        model.blocks[i].mixer.sensor_proj.register_forward_hook(
            lambda mod, args, out, i=i: captured.setdefault(i, out.detach())
        )
        for i in model.kla_blocks
    ]
    ds = inspect(model, TEXT)
    for h in hooks:
        h.remove()
    kind = "parallel"
    for pos, i in enumerate(ds.layer.values):
        layer = model.blocks[i].mixer
        res, base, v, Lv, k, q, decay = reference(layer, captured[i])
        got = ds.isel(layer=pos)

        def check(name, expected, got=got, kind=kind):
            assert_close(torch.as_tensor(got[name].values), expected, kind, dtype, what=name)

        lam, prior = res.precision, res.pred_precision
        check("posterior_precision", lam)
        check("prior_precision", prior)
        check("baseline_precision", base.expand_as(lam))
        check("information_added", Lv[..., None] * k[:, :, None, :] ** 2)
        check("write_gain", 1 - prior / lam)
        check("forget_gate", decay * prior / lam)
        check("value_precision", Lv)
        check("readout_variance", (q[:, :, None, :] ** 2 / lam).sum(-1))
        # the gates are what they claim: mean_t = forget * mean_{t-1} + (k Lv / lam_t) v_t
        mean_prev = torch.cat([torch.zeros_like(res.mean[:, :1]), res.mean[:, :-1]], 1)
        forget = torch.as_tensor(got["forget_gate"].values).double()
        write = k[:, :, None, :] * Lv[..., None] / lam * v[..., None]
        assert_close(
            forget * mean_prev + write, res.mean, "truth", dtype, what="moment form of the mean"
        )
        # summaries over lanes
        check("mean_log10_precision", lam.log10().mean((-1, -2)))
        check("mean_log10_text_precision", (lam / base).log10().mean((-1, -2)))
        check("mean_information_bits", (lam / prior).log2().mul(0.5).mean((-1, -2)))
        check("mean_write_gain", (1 - prior / lam).mean((-1, -2)))
        check("mean_forget_gate", (decay * prior / lam).mean((-1, -2)))
        check("lane_mean_information_bits", (lam / prior).log2().mul(0.5).mean((0, 1)))
        check("lane_mean_log10_text_precision", (lam / base).log10().mean((0, 1)))
        check("decay", decay)
        assert_close(
            torch.as_tensor(ds["mean_log10_baseline_precision"].values[pos]),
            base.log10().mean((-1, -2))[0],
            kind,
            dtype,
            what="mean_log10_baseline_precision",
        )


def test_inspection_does_not_alter_outputs_and_surprisal_is_of_the_shown_token():
    model = make_model()
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        logits = model(tokens)
    ds = inspect(model, tokens, chunk_size=16)
    with torch.no_grad():
        again = model(tokens)
    assert torch.equal(logits, again)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(m._recorder is None for m in kla_layers(model).values())
    logp = torch.log_softmax(logits, -1)
    bits = -logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0] / math.log(2)
    np.testing.assert_allclose(ds.surprisal.values[:, 1:], bits.numpy(), rtol=ROUNDING)
    assert np.isnan(ds.surprisal.values[:, 0]).all()
    i = model.kla_blocks[0]
    with torch.no_grad():
        h = model.blocks[i].mixer_norm(model.embedding(tokens))
        _, out_var = model.blocks[i].mixer(h, return_variance=True)
    assert_close(
        torch.as_tensor(ds.output_variance.isel(layer=0).values),
        out_var,
        "parallel",
        torch.float64,
        what="output_variance",
    )


@pytest.mark.parametrize(
    "L,chunk", [(1, 512), (63, 7), (63, 1)], ids=["L1", "L63-chunk7", "L63-chunk1"]
)
def test_chunking_does_not_change_results(L, chunk):
    model = make_model(torch.float32)
    tokens = torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(2))
    a = inspect(model, tokens, chunk_size=chunk, bin_size=4)
    b = inspect(model, tokens, chunk_size=4096, bin_size=4)
    tol = tolerance("parallel", "float32")  # a chunked scan against one pass
    for name in a.data_vars:
        np.testing.assert_allclose(
            a[name].values, b[name].values, rtol=tol, atol=tol / 100, err_msg=name
        )


def test_window_selection_and_summaries_only():
    model = make_model(torch.float32, mixers=("kla",))
    tokens = torch.randint(0, 256, (1, 1000), generator=torch.Generator().manual_seed(3))
    full = inspect(model, tokens[:, :300], chunk_size=300)
    ds = inspect(model, tokens, channels=[0, 5, 31], window=(120, 260), chunk_size=256)
    assert ds.posterior_precision.shape == (1, 1, 140, 3, 4)
    assert ds.window.values.tolist() == list(range(120, 260))
    assert ds.detail_channel.values.tolist() == [0, 5, 31]
    same = tolerance("identical", "float32")  # a window of the same pass
    for name in ("posterior_precision", "baseline_precision", "write_gain", "value"):
        np.testing.assert_allclose(
            ds[name].values,
            full[name].isel(window=slice(120, 260)).sel(detail_channel=[0, 5, 31]).values,
            rtol=same,
            err_msg=name,
        )
    np.testing.assert_allclose(
        ds.mean_information_bits.values[..., :300], full.mean_information_bits.values, rtol=same
    )
    short = inspect(model, tokens, detail=False, bin_size=100)
    assert "posterior_precision" not in short and short.sizes["bin"] == 10
    np.testing.assert_allclose(
        short.mean_log10_precision.values, ds.mean_log10_precision.values, rtol=same
    )
    # a bin is the mean over its tokens (and slots) of the per-lane view
    lam = full.posterior_precision.isel(layer=0, batch=0).values
    text = np.log10(lam / full.baseline_precision.isel(layer=0, batch=0).values).mean(-1)
    assert_close(
        short.binned_log10_text_precision.isel(layer=0, batch=0, bin=1).values,
        text[100:200].mean(0),
        "rounding",
        "float32",
        what="binned log10 text precision",
    )
    with pytest.raises(ValueError, match="max_detail_bytes"):
        inspect(model, tokens, max_detail_bytes=1e5)
    with pytest.raises(ValueError, match="window"):
        inspect(model, tokens, window=(1000, 1010))


@pytest.mark.parametrize(
    "chunk,unit",
    [
        pytest.param(200, False, id="L900-chunk200"),
        pytest.param(900, False, id="L900-chunk900"),
        pytest.param(200, True, id="L900-chunk200-decay1"),
    ],
)
def test_streamed_reductions_equal_the_per_lane_detail(chunk, unit):
    """The summaries, lane means and bins (reduced in blocks of tokens, the baseline only for
    the lanes that have not settled) equal the same means taken over the per-lane detail,
    on a text long enough for every lane's baseline to settle (fast decay, float32), and with
    lanes whose decay rounds to 1 (the general baseline formula)."""
    from kalmanscan.kla import baseline_log10_precision

    model = make_model(torch.float32, mixers=("kla",))
    layer = model.blocks[0].mixer
    with torch.no_grad():
        layer.lambda_log.fill_(4.0)  # 2 n ln a < -80 (the clamp) by n = 730 for every lane
        if unit:
            layer.lambda_log[:4] = -40.0  # theta * dt ~ 1e-19: decay 1 in float32
    if unit:
        assert bool((layer.dynamics(torch.float32)[0] == 1).any())
    tokens = torch.randint(0, 256, (2, 900), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 900, dtype=torch.bool)
    mask[1, 700:] = False
    ds = inspect(model, tokens, attention_mask=mask, chunk_size=chunk, bin_size=100)
    kind = "parallel"  # float32 reductions in another order than float64 numpy's
    # log10(lam / baseline) is a float32 difference of two log10 precisions (~3 here) that
    # nearly cancel: accurate to their rounding, so compared at the scale of log10 lam
    diff = dict(kind="truth", dtype="float32", scale=np.full(1, 3.0))
    d = ds.isel(layer=0)
    lam = d.posterior_precision.values.astype(np.float64)  # [B, L, M, S]
    base = d.baseline_precision.values.astype(np.float64)
    wg = d.write_gain.values.astype(np.float64)
    prior = d.prior_precision.values.astype(np.float64)
    text = np.log10(lam / base)
    bits = 0.5 * np.log2(lam / prior)
    dynamics = layer.dynamics(torch.float64)
    expected_base = baseline_log10_precision(*dynamics, torch.arange(900)).mean((-1, -2))
    assert_close(d.mean_log10_baseline_precision.values, expected_base, kind, "float32")
    plain = dict(kind=kind, dtype="float32")
    for name, value, tol in (
        ("mean_log10_precision", np.log10(lam), plain),
        ("mean_log10_text_precision", text, diff),
        ("mean_write_gain", wg, plain),
        ("mean_information_bits", bits, plain),
        ("mean_forget_gate", d.forget_gate.values, plain),
    ):
        got = d[name].values
        assert np.isnan(got[1, 700:]).all(), name
        assert_close(got[:, :700], value.mean((-1, -2))[:, :700], **tol, what=name)
        assert_close(got[0], value.mean((-1, -2))[0], **tol, what=name)
    valid = mask.numpy()
    for name, value, tol in (
        ("lane_mean_log10_text_precision", text, diff),
        ("lane_mean_information_bits", bits, plain),
        ("lane_mean_write_gain", wg, plain),
    ):
        assert_close(d[name].values, value[valid].mean(0), **tol, what=name)
    binned = d.binned_log10_text_precision.values  # [B, bin, M]
    assert_close(binned[0, 8], text[0, 800:900].mean((0, -1)), **diff, what="bin 8")
    assert_close(binned[1, 6], text[1, 600:700].mean((0, -1)), **diff, what="bin 6")
    assert np.isnan(binned[1, 7:]).all()


def test_reductions_on_a_worker_thread_equal_inline():
    """With one intra-op thread on the CPU the reductions run on a worker thread beside the
    model (at most two chunks waiting); the dataset equals the inline one's, and an error in
    the worker reaches the caller."""
    model = make_model(torch.float32)
    tokens = torch.randint(0, 256, (2, 300), generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    inline = inspect(model, tokens, chunk_size=37, window=(250, 300))
    try:
        torch.set_num_threads(1)
        worker = inspect(model, tokens, chunk_size=37, window=(250, 300))

        def fail(self, i, tr, t0):
            raise RuntimeError("boom")

        with pytest.MonkeyPatch.context() as mp, pytest.raises(RuntimeError, match="boom"):
            mp.setattr(_Recorder, "_reduce", fail)
            inspect(model, tokens, chunk_size=37, detail=False)
    finally:
        torch.set_num_threads(threads)
    assert all(m._recorder is None for m in kla_layers(model).values())
    tol = tolerance("rounding", "float32")  # matrix products split over 1 or more threads
    for name in inline.data_vars:
        np.testing.assert_allclose(
            worker[name].values, inline[name].values, rtol=tol, atol=tol / 100, err_msg=name
        )


def test_batch_of_different_lengths_equals_each_alone():
    model = make_model(torch.float32)
    texts = ["for key, value in items:", "x = 1", TEXT]
    ds = inspect(model, texts, chunk_size=8)
    assert ds.mask.values.sum(1).tolist() == [len(t) for t in texts]
    for b, t in enumerate(texts):
        one = inspect(model, t, chunk_size=8)
        n = len(t)
        for name in ("posterior_precision", "mean_information_bits", "surprisal", "value"):
            got = ds[name].isel(batch=b)
            dim = "window" if "window" in got.dims else "time"
            np.testing.assert_allclose(
                got.isel({dim: slice(0, n)}).values,
                one[name].isel(batch=0).values,
                rtol=tolerance("rounding", "float32"),
                atol=tolerance("rounding", "float32") / 100,
                err_msg=name,
            )
        assert np.isnan(ds.mean_write_gain.values[:, b, n:]).all()
        assert np.isnan(ds.posterior_precision.values[:, b, n:]).all()
    assert "".join(ds.token.values[1]) == "x␣=␣1"


class Tagger(torch.nn.Module):
    """A user's module: its own embedding and head around two KLALayers, called with a
    tokenizer's output, returning an object with .logits."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.encoder = torch.nn.ModuleList(
            [KLALayer(16, KLAConfig(d_state=4)), KLALayer(16, KLAConfig(d_state=4))]
        )
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids, attention_mask=None):
        x = self.emb(input_ids)
        for layer in self.encoder:
            x = x + layer(x)
        return types.SimpleNamespace(logits=self.head(x))


def test_any_module_with_kla_layers_and_a_tokenizer_output():
    torch.manual_seed(4)
    model = Tagger().double().eval()
    ids = torch.tensor([[3, 7, 9, 11, 2, 5], [4, 4, 8, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    assert list(kla_layers(model)) == ["encoder.0", "encoder.1"]
    ds = inspect(model, {"input_ids": ids, "attention_mask": mask}, token_text=lambda t: f"<{t}>")
    assert ds.layer.values.tolist() == ["encoder.0", "encoder.1"]
    assert ds.token.values[0, 1] == "<7>" and ds.token.values[1, 5] == ""
    # the first layer's trace, by hand
    with torch.no_grad():
        tr = model.encoder[0].trace(model.emb(ids))
        logits = model(ids).logits
    lam = torch.as_tensor(ds.posterior_precision.isel(layer=0).values)
    assert_close(lam[0], tr.precision[0], "parallel", torch.float64, what="row 0")
    assert_close(lam[1, :4], tr.precision[1, :4], "parallel", torch.float64, what="row 1")
    assert torch.isnan(lam[1, 4:]).all()
    bits = -torch.log_softmax(logits, -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0] / math.log(2)
    np.testing.assert_allclose(ds.surprisal.values[0, 1:], bits.numpy(), rtol=ROUNDING)
    assert np.isnan(ds.surprisal.values[1, 4:]).all()
    one = inspect(model, ids, layers=["encoder.1"], forward=lambda m, x: m(x))
    assert one.layer.values.tolist() == ["encoder.1"]
    by_position = inspect(model, ids, layers=[1], forward=lambda m, x: m(x))
    np.testing.assert_array_equal(
        by_position.posterior_precision.values, one.posterior_precision.values
    )


def test_layer_selection_and_coordinates():
    model = make_model()
    ds = inspect(model, TEXT, layers=[2])
    assert ds.layer.values.tolist() == [2]
    assert "".join(ds.token.values[0]).replace("␣", " ").replace("\\n", "\n") == TEXT
    assert ds.token_id.values[0].tolist() == list(TEXT.encode())
    assert ds.posterior_precision.dims == ("layer", "batch", "window", "detail_channel", "slot")
    assert ds.mean_information_bits.dims == ("layer", "batch", "time")
    assert ds.timescale.dims == ("layer", "channel", "slot")
    assert float(ds.write_gain.min()) >= 0 and float(ds.write_gain.max()) <= 1
    np.testing.assert_allclose(ds.timescale.values, -1 / np.log(ds.decay.values))
    all_layers = inspect(model, TEXT)
    np.testing.assert_array_equal(
        all_layers.posterior_precision.sel(layer=[2]).values, ds.posterior_precision.values
    )


def test_summary_table():
    model = make_model(torch.float32, mixers=("kla", "kla"))
    layer = model.blocks[1].mixer
    with torch.no_grad():
        layer.process_noise[:8] = -0.5  # 8 of 32 channels: 25 % of the lanes on the floor
    ds = inspect(model, TEXT * 3, detail=False)
    table = summarize(ds)
    assert list(table.index) == [0, 1]
    assert table.loc[1, "floor_fraction"] == 0.25 and table.loc[0, "floor_fraction"] == 0.0
    import scipy.stats

    s, bits = ds.surprisal.values[0], ds.mean_information_bits.values[1, 0]
    ok = ~np.isnan(s)
    assert table.loc[1, "surprisal_spearman"] == pytest.approx(
        scipy.stats.spearmanr(s[ok], bits[ok]).statistic
    )
    end = ds.mean_log10_precision.values[0, 0, -1]
    base = ds.mean_log10_baseline_precision.values[0, -1]
    assert_close(table.loc[0, "dynamics_share"], base / end, "rounding", "float64")


def test_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="layers: expected KLA layer labels"):
        inspect(model, TEXT, layers=[1])
    with pytest.raises(ValueError, match="layers"):
        inspect(model, TEXT, layers=[7])
    with pytest.raises(ValueError, match="channels"):
        inspect(model, TEXT, channels=[32])
    with pytest.raises(ValueError, match="chunk_size"):
        inspect(model, TEXT, chunk_size=0)
    with pytest.raises(TypeError, match="tokens"):
        inspect(model, torch.randn(3))
    with pytest.raises(ValueError, match="tokens"):
        inspect(model, torch.tensor([[1, 300]]))
    with pytest.raises(ValueError, match="attention_mask"):
        inspect(model, TEXT, attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="found none"):
        inspect(torch.nn.Linear(2, 2), TEXT)
    with pytest.raises(ValueError, match="found none"):
        inspect(make_model(mixers=("attention",)), TEXT)


def test_netcdf_round_trip_and_plots(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xarray as xr

    from kalmanscan.kla import plot_layer_summary, plot_precision
    from kalmanscan.kla.plot import channel_order, plot_comparison, plot_overview

    ds = inspect(make_model(torch.float32), TEXT)
    engine = save_dataset(ds, tmp_path / "x.nc")
    assert engine in ("h5netcdf", "netcdf4", "scipy")
    back = xr.open_dataset(tmp_path / "x.nc")
    np.testing.assert_array_equal(back.posterior_precision.values, ds.posterior_precision.values)
    np.testing.assert_array_equal(back.mask.values.astype(bool), ds.mask.values)
    assert back.token.values[0, 0] == "d"
    back.close()
    fig, axes = plt.subplots(3)
    assert plot_precision(ds, ax=axes[0]) is axes[0]
    labels = [t.get_text() for t in fig.axes[-1].get_xticklabels()]  # the surprisal strip
    assert labels[:3] == ["d", "e", "f"]
    assert plot_layer_summary(ds, "readout_variance", ax=axes[1]) is axes[1]
    assert plot_layer_summary(ds, "mean_information_bits", ax=axes[2]) is axes[2]
    plt.close(fig)
    order = channel_order(ds, layer=0)
    ts = np.exp(np.log(ds.timescale.isel(layer=0).sel(channel=order).values).mean(-1))
    assert np.all(np.diff(ts) >= 0)
    ax = plot_precision(ds, relative_to="baseline", sort_by="timescale", channels=[3, 1, 2])
    last = channel_order(ds, layer=-1)
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in last if c in (1, 2, 3)]
    plt.close(ax.figure)
    long = inspect(make_model(torch.float32), TEXT * 80, detail=False, bin_size=1)
    ax = plot_precision(long, "binned_log10_text_precision", max_columns=500)
    assert ax.images[0].get_array().shape[1] <= 500  # readable width at any length
    plt.close(ax.figure)
    axes = plot_overview(long)
    plt.close(axes[0].figure)
    axes = plot_comparison(compare(make_model(torch.float32), TEXT, "x = 1", detail=False))
    assert len(axes) == 4
    plt.close(axes[0].figure)
    with pytest.raises(ValueError, match="var"):
        plot_precision(ds, "nope")
    with pytest.raises(ValueError, match="relative_to"):
        plot_precision(ds, "value_precision", relative_to="baseline")


def test_token_labels_the_font_cannot_draw(tmp_path):
    """A text in a script the tick font lacks (CJK in DejaVu Sans Mono) labels each token by a
    font that has it where one is installed, by its code point otherwise (it drew empty boxes,
    with a warning a glyph); characters the font has stay as they are."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.kla.plot import plot_precision
    from kalmanscan.plot import drawable_text

    text = "é猫a\U0001f600"
    want, families = drawable_text(list(text), "monospace")
    assert want[0] == "é" and want[2] == "a"
    ds = inspect(make_model(torch.float32), text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (matplotlib warns once a missing glyph)
        ax = plot_precision(ds)
        ax.figure.savefig(tmp_path / "x.png")
    ticks = ax.figure.axes[-1].get_xticklabels()
    assert [t.get_text() for t in ticks if t.get_text()] == want
    assert all(t.get_fontfamily() == families for t in ticks)
    plt.close(ax.figure)


def run_cli(argv, stdin=None, monkeypatch=None):
    from kalmanscan.cli import main

    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return main(argv)


def test_cli_inspect(tmp_path, capsys, monkeypatch):
    import xarray as xr

    ck = save_checkpoint(make_model(torch.float32), tmp_path / "ck")
    out = tmp_path / "out"
    rc = run_cli(["inspect", "for x in y:", "--checkpoint", str(ck), "--out", str(out)])
    assert rc == 0
    assert (out / "overview.png").stat().st_size > 1000 and (out / "inspect.nc").is_file()
    text = capsys.readouterr().out
    assert "wrote" in text and "floor_fraction" in text
    # --file, --max-bytes, --window, --channels
    src = tmp_path / "src.py"
    src.write_text(TEXT * 10)
    rc = run_cli(
        ["inspect", "--file", str(src), "--max-bytes", "100", "--window", "10:30",
         "--channels", "0-7", "--checkpoint", str(ck), "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    assert "first 100 of" in capsys.readouterr().err
    ds = xr.open_dataset(out / "inspect.nc")
    assert ds.sizes["time"] == 100 and ds.sizes["window"] == 20 and ds.sizes["detail_channel"] == 8
    ds.close()
    assert (out / "window.png").is_file()
    # standard input and a comparison
    rc = run_cli(
        ["inspect", "-", "--compare", "x = 1", "--checkpoint", str(ck), "--out", str(out)],
        stdin=b"while True:\n    pass\n",
        monkeypatch=monkeypatch,
    )
    assert rc == 0 and (out / "comparison.png").is_file()
    text = capsys.readouterr().out
    assert "text 1" in text
    # the earlier run's window.png is not this run's: removed, and said so
    assert not (out / "window.png").exists()
    assert "removed" in text and "window.png" in text and "earlier run" in text
    # --file - (standard input) with --max-bytes; the overview keeps its width at any length
    from PIL import Image

    long = tmp_path / "long"
    rc = run_cli(
        ["inspect", "--file", "-", "--max-bytes", "3000", "--checkpoint", str(ck),
         "--out", str(long)],
        stdin=(TEXT * 100).encode(),
        monkeypatch=monkeypatch,
    )  # fmt: skip
    assert rc == 0
    assert f"first 3000 of {len(TEXT) * 100} bytes" in capsys.readouterr().err
    ds = xr.open_dataset(long / "inspect.nc")
    assert ds.sizes["time"] == 3000 and "posterior_precision" not in ds  # summaries only
    ds.close()
    with Image.open(out / "overview.png") as short_png, Image.open(long / "overview.png") as png:
        assert png.size == short_png.size
    rc = run_cli(["inspect", "x", "--checkpoint", str(tmp_path / "missing")])
    assert rc == 2
    assert "checkpoint" in capsys.readouterr().err
    rc = run_cli(["inspect", "--file", str(tmp_path / "nope.txt"), "--checkpoint", str(ck)])
    assert rc == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = make_model(torch.float32)
    a = inspect(model, TEXT)
    b = inspect(model.cuda(), TEXT)
    tol = tolerance("kernel", "float32")
    np.testing.assert_allclose(b.posterior_precision.values, a.posterior_precision.values, rtol=tol)
    np.testing.assert_allclose(
        b.mean_information_bits.values, a.mean_information_bits.values, rtol=tol
    )
