"""``kalmanscan.kla.inspect``: its fast reductions against a plain reference, and its name.

The recorder reduces each chunk in blocks of tokens, computes the no-observation baseline only
for lanes that have not settled and adds their slot means channel by channel in sorted order,
and forms the per-lane detail in its window arrays. Here every variable of the Dataset is
compared with the same quantities written out over whole ``[B, L, M, S]`` arrays in float64
numpy, from the traces the layers hand over on the same chunks. Cases: lanes settling at
different tokens (so blocks differ in how many lanes they compute), lanes with decay 1 (the
general baseline formula), a padded batch, a window, channels unsorted and repeated, chunks
that are not a multiple of the block, float32 and float64, and the bundled model. The window
arrays are filled with NaN before the run, so an element the recorder does not write fails.

The name ``kalmanscan.kla.inspect`` is the function whatever was imported before it, in a fresh
interpreter each: the module path (``from kalmanscan.kla.inspect import summarize``), the module
that defines the function run again, and pytest collecting that module's doctests with
``--import-mode=importlib``, which used to rebind the name to the module.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from kalmanscan.kla import AttentionConfig, KLAConfig, KLALanguageModel, ModelConfig, inspect
from kalmanscan.kla import inspect_record as ir
from kalmanscan.testing import assert_close

TEXT = "def add(a, b):\n    return a + b  # the sum of a and b\n" * 5  # 270 bytes


def small_model(dtype, unit_lanes):
    """Two KLA blocks around an attention block; decays spread so that lanes settle (reach the
    baseline clamp, 2 n ln a < -700 in float64, -80 in float32) at tokens from 1 to past the
    text; ``unit_lanes``: two channels whose decay rounds to 1."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16,
        n_layers=3,
        mixers=["kla", "attention", "kla"],
        kla=KLAConfig(d_state=4),
        attention=AttentionConfig(n_heads=2),
    )
    model = KLALanguageModel(cfg).to(dtype).eval()
    with torch.no_grad():
        for i in model.kla_blocks:
            mix = model.blocks[i].mixer
            M, S = mix.lambda_log.shape
            mix.delta.zero_()  # dt = softplus(0) = ln 2
            # 40 % slow lanes (2 n theta dt < 1 over the text: far from their resting
            # precision), the others settling from the first blocks to past the middle
            fast = (1.0, 6.5) if dtype == torch.float64 else (-1.5, 3.0)
            n_slow = 2 * M * S // 5
            lam = torch.cat(
                (torch.linspace(-9.0, -6.0, n_slow), torch.linspace(*fast, M * S - n_slow))
            )
            mix.lambda_log.copy_(lam[torch.randperm(M * S)].view(M, S))
            if unit_lanes:
                mix.lambda_log[:2] = -80.0
            mix.process_noise.uniform_(0.005, 0.3)
            mix.sensor_proj.weight.normal_(0.0, 0.3)
    return model


def captured_traces(model, ids, chunk_size):
    """Each KLA block's traces over the text, streamed as inspect streams it, joined on time."""
    mods = [model.blocks[i].mixer for i in model.kla_blocks]
    got = {id(m): [] for m in mods}
    with torch.no_grad(), ir.record(mods, lambda layer, tr: got[id(layer)].append(tr)):
        state = model.init_state(ids.shape[0])
        for t0 in range(0, ids.shape[1], chunk_size):
            _, state = model(ids[:, t0 : t0 + chunk_size], state)

    def cat(trs, get):
        return torch.cat([get(t) for t in trs], 1).double().numpy()

    out = []
    for m in mods:
        trs = got[id(m)]
        out.append(
            {
                "lam": cat(trs, lambda t: t.precision),
                "Lv": cat(trs, lambda t: t.sensors.obs_prec),
                "v": cat(trs, lambda t: t.sensors.v),
                "k": cat(trs, lambda t: t.sensors.k),
                "q": cat(trs, lambda t: t.sensors.q),
                "yvar": cat(trs, lambda t: t.yvar),
                "gate": cat(trs, lambda t: t.gate_act),
                "out_var": cat(trs, lambda t: t.out_var),
                "a": trs[0].decay.double().numpy(),
                "p": trs[0].process_var.double().numpy(),
            }
        )
    return out


def reference(tr, mask, channels, window, bin_size):
    """Every variable of one layer, from the formulas of the inspect module's docstring."""
    lam, Lv, k, a, p = tr["lam"], tr["Lv"], tr["k"], tr["a"], tr["p"]
    B, L, M, S = lam.shape
    phi = Lv[..., None] * k[:, :, None, :] ** 2
    prior = lam - phi
    n = np.arange(1, L + 1, dtype=np.float64)[:, None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        a2n = a ** (2 * n)
        base_var = np.where(a == 1, 1 + p * n, a2n + p * (1 - a2n) / (1 - a**2))  # [L, M, S]
    lanes = {
        "text": np.log10(lam * base_var),
        "bits": 0.5 * np.log2(lam / prior),
        "wg": phi / lam,
    }
    pad = ~mask

    def masked(x):  # NaN where there is no token ([B, L, ...])
        x = np.array(x, dtype=np.float64)
        x[pad] = np.nan
        return x

    out = {
        "mean_log10_precision": masked(np.log10(lam).mean((-1, -2))),
        "mean_log10_text_precision": masked(lanes["text"].mean((-1, -2))),
        "mean_information_bits": masked(lanes["bits"].mean((-1, -2))),
        "mean_write_gain": masked(lanes["wg"].mean((-1, -2))),
        "mean_forget_gate": masked((a * prior / lam).mean((-1, -2))),
        "mean_log10_readout_variance": masked(np.log10(tr["yvar"]).mean(-1)),
        "mean_log10_baseline_precision": -np.log10(base_var).mean((-1, -2)),
        "lane_mean_log10_text_precision": lanes["text"][mask].mean(0),
        "lane_mean_information_bits": lanes["bits"][mask].mean(0),
        "lane_mean_write_gain": lanes["wg"][mask].mean(0),
    }
    nbins = -(-L // bin_size)
    for name, lane in (("text", lanes["text"]), ("bits", lanes["bits"])):
        binned = np.full((B, nbins, M), np.nan)
        for b in range(B):
            for j in range(nbins):
                rows = lane[b, j * bin_size : (j + 1) * bin_size]
                ok = mask[b, j * bin_size : (j + 1) * bin_size]
                if ok.any():
                    binned[b, j] = rows[ok].mean((0, -1))
        key = "binned_log10_text_precision" if name == "text" else "binned_information_bits"
        out[key] = binned
    w = slice(*window)
    ch = list(channels)
    detail = {
        "posterior_precision": lam[:, w][:, :, ch],
        "prior_precision": prior[:, w][:, :, ch],
        "baseline_precision": np.broadcast_to(
            1 / base_var[w][:, ch], (B, *phi[:, w][:, :, ch].shape[1:])
        ),  # fmt: skip
        "information_added": phi[:, w][:, :, ch],
        "write_gain": (phi / lam)[:, w][:, :, ch],
        "forget_gate": (a * prior / lam)[:, w][:, :, ch],
        "value_precision": Lv[:, w][:, :, ch],
        "value": tr["v"][:, w][:, :, ch],
        "readout_variance": tr["yvar"][:, w][:, :, ch],
        "gated_readout_variance": (tr["yvar"] * tr["gate"] ** 2)[:, w][:, :, ch],
        "key": k[:, w],
        "query": tr["q"][:, w],
        "output_variance": tr["out_var"][:, w],
    }
    wmask = mask[:, w]
    for name, x in detail.items():
        x = np.array(x, dtype=np.float64)
        x[~wmask] = np.nan
        out[name] = x
    return out


def moving_lanes(a, dtype, L, chunk):
    """How many lanes each block of the recorder computes the baseline for: those not settled
    at its first token (``2 n ln a > lo``)."""
    lo = -700.0 if dtype == torch.float64 else -80.0
    block = ir._Recorder.block
    starts = [t0 + b for t0 in range(0, L, chunk) for b in range(0, min(chunk, L - t0), block)]
    return [int(np.count_nonzero(2.0 * np.log(a) * (s + 1) > lo)) for s in starts]


@pytest.fixture
def poisoned_windows(monkeypatch):
    """Fill the recorder's window arrays with NaN when it is made: an unwritten element then
    differs from the reference."""
    init = ir._Recorder.__init__

    def poisoned(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for arr in (self.detail or {}).values():
            arr.fill(np.nan)

    monkeypatch.setattr(ir._Recorder, "__init__", poisoned)


CASES = [
    pytest.param(torch.float64, False, id="f64-settling"),
    pytest.param(torch.float64, True, id="f64-decay1"),
    pytest.param(torch.float32, False, id="f32-settling"),
]


@pytest.mark.parametrize("dtype, unit_lanes", CASES)
def test_inspection_equals_plain_reference(dtype, unit_lanes, poisoned_windows):
    model = small_model(dtype, unit_lanes)
    texts = [TEXT, TEXT[:157]]
    chunk, window, channels, bin_size = 100, (23, 251), [5, 0, 31, 5], 16
    ds = inspect(
        model, texts, chunk_size=chunk, window=window, channels=channels, bin_size=bin_size
    )
    mask = ds["mask"].values
    ids = torch.as_tensor(ds["token_id"].values)
    traces = captured_traces(model, ids, chunk)
    a = traces[0]["a"]
    if unit_lanes:
        assert (a == 1).any()
    else:  # blocks where most lanes move, and blocks where fewer than half do
        N = a.size
        moving = moving_lanes(a, dtype, ids.shape[1], chunk)
        assert any(N / 2 <= m < N for m in moving) and any(0 < m < N / 2 for m in moving)
    for pos, tr in enumerate(traces):
        expected = reference(tr, mask, channels, window, bin_size)
        check(ds.isel(layer=pos), expected, tr, dtype, f"layer {pos}")


def check(got, expected, tr, dtype, where):
    """Sums over lanes and tokens in another order than numpy's: float64 to 1e-10 ("parallel");
    float32 to 1e-4, and the log10 precisions relative to the baseline, differences of terms
    that nearly cancel, at the scale of log10 lam to float32's 2e-3 ("truth"). A misplaced
    lane, slot or token moves these by 1e-2 or more."""
    dt = "float64" if dtype == torch.float64 else "float32"
    for name, value in expected.items():
        kind, scale = "parallel", None
        if "text" in name or "baseline" in name:
            scale = np.nanmax(np.abs(np.log10(tr["lam"])))
            kind = "parallel" if dt == "float64" else "truth"
        assert_close(got[name].values, value, kind, dt, scale=scale, what=f"{where} {name}")


def test_bundled_model_equals_plain_reference(poisoned_windows):
    """The bundled checkpoint (float32, 512 channels x 16 slots), on a short text."""
    from kalmanscan.kla import load_checkpoint

    model = load_checkpoint()
    text = TEXT[:150]
    ds = inspect(model, text, chunk_size=64, window=(10, 120), channels=range(0, 512, 7))
    mask = ds["mask"].values
    traces = captured_traces(model, torch.as_tensor(ds["token_id"].values), 64)
    for pos, tr in enumerate(traces):
        expected = reference(tr, mask, range(0, 512, 7), (10, 120), ds.attrs["bin_size"])
        check(ds.isel(layer=pos), expected, tr, torch.float32, f"layer {pos}")


CHECK = """
import kalmanscan.kla
from kalmanscan.kla import inspect
assert callable(inspect) and inspect is kalmanscan.kla.inspect, type(inspect)
assert inspect.__name__ == "inspect"
"""
IMPORTS_FIRST = {
    "module-path": """
        import kalmanscan.kla.inspect
        from kalmanscan.kla.inspect import (
            baseline_log10_precision, compare, inspect as f, kla_layers, save_dataset, summarize,
        )
        import kalmanscan.kla as k
        assert (f, compare, summarize, kla_layers, save_dataset, baseline_log10_precision) == (
            k.inspect, k.compare, k.summarize, k.kla_layers, k.save_dataset,
            k.baseline_log10_precision,
        )
    """,
    "module-run-again": """
        import importlib, sys
        import kalmanscan.kla
        name = kalmanscan.kla.inspect.__module__
        sys.modules.pop(name)
        importlib.import_module(name)
    """,
    "importlib-path": """
        import importlib
        mod = importlib.import_module("kalmanscan.kla.inspect")
        assert mod.summarize is __import__("kalmanscan.kla").kla.summarize
    """,
}


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("first", list(IMPORTS_FIRST))
def test_inspect_is_the_function_whatever_was_imported_first(first):
    r = run_python(textwrap.dedent(IMPORTS_FIRST[first]) + CHECK)
    assert r.returncode == 0, r.stderr[-2000:]


def test_inspect_is_the_function_after_pytest_imports_its_module(tmp_path):
    """pytest --doctest-modules --import-mode=importlib imports the defining module by its file
    and binds it on the package; a test collected after it then calls ``inspect``."""
    import kalmanscan.kla

    path = sys.modules[kalmanscan.kla.inspect.__module__].__file__
    (tmp_path / "test_after.py").write_text("def test_after():\n" + textwrap.indent(CHECK, "    "))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-o", "addopts=", "--import-mode=importlib", "--doctest-modules", "-k", "test_after",
         path, str(tmp_path / "test_after.py")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
