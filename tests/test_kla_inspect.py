"""Belief-state inspection: values against kalmanscan.filter run on the captured inputs, outputs
unchanged, chunking/selection invariance, netCDF, plots and the ``kalmanscan inspect`` CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kalmanscan
from kalmanscan.kla import (
    AttentionConfig,
    KLAConfig,
    KLALanguageModel,
    ModelConfig,
    inspect,
    save_checkpoint,
)
from kalmanscan.testing import assert_close

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


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]
)
def test_inspection_equals_filter_on_captured_inputs(dtype):
    """Capture each KLA block's raw sensor projection with a forward hook, rebuild (v, Lv, k)
    from it by hand, run kalmanscan.filter on the (channel, slot) lanes (loading k, observation v,
    variance 1/Lv, prior N(0, 1)) and compare with the dataset."""
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
        M, S = layer.d_inner, layer.d_state
        raw = captured[i].double()
        v, logvar, k, q = raw.split([M, M, S, S], -1)
        k = k / k.norm(dim=-1, keepdim=True)
        q = q / q.norm(dim=-1, keepdim=True)
        Lv = 1.0 / (F.softplus(logvar) + 1e-4)
        decay, pvar = (t.double() for t in layer.dynamics(torch.float64))
        res = kalmanscan.filter(
            v[..., None].expand(-1, -1, M, S),
            obs_var=(1.0 / Lv)[..., None],
            decay=decay,
            process_var=pvar,
            loading=k[:, :, None, :],
            prior_mean=0.0,
            prior_var=1.0,
            axis=1,
            backend="sequential",
        )
        got = ds.isel(layer=pos)

        def check(name, expected, got=got):
            assert_close(torch.as_tensor(got[name].values), expected, kind, dtype, what=name)

        check("posterior_precision", res.precision)
        check("prior_precision", res.pred_precision)
        check("information_added", Lv[..., None] * k[:, :, None, :] ** 2)
        check("write_gain", 1 - res.pred_precision / res.precision)
        check("forget_gate", decay * res.pred_precision / res.precision)
        check("value_precision", Lv)
        check("readout_variance", (q[:, :, None, :] ** 2 / res.precision).sum(-1))
        # the gates are what they claim: mean_t = forget * mean_{t-1} + (k Lv / lam_t) v_t
        mean_prev = torch.cat([torch.zeros_like(res.mean[:, :1]), res.mean[:, :-1]], 1)
        forget = torch.as_tensor(got["forget_gate"].values).double()
        write = k[:, :, None, :] * Lv[..., None] / res.precision * v[..., None]
        assert_close(
            forget * mean_prev + write, res.mean, "truth", dtype, what="moment form of the mean"
        )
        assert_close(torch.as_tensor(got["decay"].values), decay, kind, dtype, what="decay")


def test_inspection_does_not_alter_outputs():
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
    logp = torch.log_softmax(logits, -1)
    bits = -logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0] / math.log(2)
    np.testing.assert_allclose(ds.surprisal.values[:, :-1], bits.numpy(), rtol=1e-10)
    assert np.isnan(ds.surprisal.values[:, -1]).all()
    # model-space output variance equals the layer's return_variance
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
    a = inspect(model, tokens, chunk_size=chunk)
    b = inspect(model, tokens, chunk_size=4096)
    for name in a.data_vars:
        np.testing.assert_allclose(
            a[name].values, b[name].values, rtol=1e-4, atol=1e-6, err_msg=name
        )


def test_long_input_with_selection():
    model = make_model(torch.float32, mixers=("kla",))
    tokens = torch.randint(0, 256, (1, 1000), generator=torch.Generator().manual_seed(3))
    ds = inspect(model, tokens, channels=[0, 5, 31], chunk_size=256)
    full = inspect(model, tokens[:, :300], chunk_size=300)
    assert ds.posterior_precision.shape == (1, 1, 1000, 3, 4)
    np.testing.assert_allclose(
        ds.posterior_precision.values[:, :, :300],
        full.posterior_precision.sel(channel=[0, 5, 31]).values,
        rtol=1e-5,
    )
    assert ds.channel.values.tolist() == [0, 5, 31]
    with pytest.raises(ValueError, match="max_bytes"):
        inspect(model, tokens, max_bytes=1e5)


def test_layer_selection_and_coordinates():
    model = make_model()
    ds = inspect(model, TEXT, layers=[2])
    assert ds.layer.values.tolist() == [2]
    assert "".join(ds.token.values[0]).replace("␣", " ").replace("\\n", "\n") == TEXT
    assert ds.token_id.values[0].tolist() == list(TEXT.encode())
    assert ds.posterior_precision.dims == ("layer", "batch", "time", "channel", "slot")
    assert ds.value_precision.dims == ("layer", "batch", "time", "channel")
    assert ds.output_variance.dims == ("layer", "batch", "time", "feature")
    assert float(ds.write_gain.min()) >= 0 and float(ds.write_gain.max()) <= 1
    all_layers = inspect(model, TEXT)
    np.testing.assert_array_equal(
        all_layers.posterior_precision.sel(layer=[2]).values, ds.posterior_precision.values
    )


def test_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="layers: expected KLA block indices"):
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
    with pytest.raises(TypeError, match="model"):
        inspect(torch.nn.Linear(2, 2), TEXT)
    with pytest.raises(ValueError, match="at least one KLA block"):
        inspect(make_model(mixers=("attention",)), TEXT)


def test_netcdf_round_trip_and_plots(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xarray as xr

    from kalmanscan.kla import plot_layer_summary, plot_precision

    ds = inspect(make_model(torch.float32), TEXT)
    ds.to_netcdf(tmp_path / "x.nc")
    back = xr.open_dataset(tmp_path / "x.nc")
    np.testing.assert_array_equal(back.posterior_precision.values, ds.posterior_precision.values)
    assert back.token.values[0, 0] == "d"
    back.close()
    fig, axes = plt.subplots(2)
    assert plot_precision(ds, ax=axes[0]) is axes[0]
    assert plot_layer_summary(ds, "readout_variance", ax=axes[1]) is axes[1]
    assert [t.get_text() for t in axes[0].get_xticklabels()][:3] == ["d", "e", "f"]
    plt.close(fig)
    with pytest.raises(ValueError, match="var"):
        plot_precision(ds, "nope")


def test_cli_inspect_writes_picture_and_dataset(tmp_path, capsys):
    from kalmanscan.cli import main

    save_checkpoint(make_model(torch.float32), tmp_path / "ck")
    rc = main(
        [
            "inspect",
            "for x in y:",
            "--checkpoint",
            str(tmp_path / "ck"),
            "--out",
            str(tmp_path / "out"),
            "--channels",
            "0-7",
        ]
    )
    assert rc == 0
    assert (tmp_path / "out" / "precision.png").stat().st_size > 1000
    assert (tmp_path / "out" / "inspect.nc").is_file()
    assert "wrote" in capsys.readouterr().out
    rc = main(["inspect", "x", "--checkpoint", str(tmp_path / "missing")])
    assert rc == 2
    assert "checkpoint" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = make_model(torch.float32)
    a = inspect(model, TEXT)
    b = inspect(model.cuda(), TEXT)
    np.testing.assert_allclose(
        b.posterior_precision.values, a.posterior_precision.values, rtol=1e-4
    )
