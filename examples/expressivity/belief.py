"""Belief-state picture of a trained KLA model on one selective-copy (or A5) sequence.

    python examples/expressivity/belief.py --models docs/experiments/models.pt \
        --run selcopy-kla-b1 --out docs/experiments/belief_selcopy.png

Runs :func:`kalmanscan.kla.inspect` on one evaluation sequence of the run's task and draws
(top) the posterior precision per channel (``plot_precision``, slot-averaged in log space),
(middle) the mean write gain ``phi_t / lam_t`` per block (``plot_layer_summary``) and (bottom)
the gated readout variance, with the positions that matter marked: the tokens to copy (dotted)
and the copy marker (solid) for selective copy. Also writes ``<out>.json`` with the averages
quoted in docs/experiments.md (precision, write gain and readout variance at content tokens,
at blanks, and at the output positions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import build_model  # noqa: E402

from kalmanscan.kla import inspect  # noqa: E402
from kalmanscan.kla.plot import plot_layer_summary, plot_precision  # noqa: E402
from kalmanscan.tasks import make_task  # noqa: E402

EVAL_SEED_OFFSET = 1_000_003


def load_run(models_path, run):
    loaded = torch.load(models_path, map_location="cpu", weights_only=True)
    entry = loaded if {"model", "args"} <= set(loaded) else loaded[run]  # a train.py checkpoint
    a = entry["args"]
    params = {
        "a5": {"length": a["length"]},
        "selective_copy": {
            "length": a["length"],
            "num_tokens_to_copy": a["num_tokens_to_copy"],
            "vocab_size": a["vocab_size"],
        },
        "fuzzy_recall": {
            "length": a["length"],
            "vocab_size": a["vocab_size"],
            "k_motif_size": a["motif_size"],
            "v_motif_size": a["motif_size"],
        },
        "mqar": {
            "length": a["length"],
            "num_kv_pairs": a["num_kv_pairs"],
            "vocab_size": a["vocab_size"],
        },
    }[a["task"]]
    data = make_task(a["task"], 8, seed=a["seed"] + EVAL_SEED_OFFSET, **params)
    model = build_model(
        a["mixer"],
        data.vocab_size,
        n_layers=a["layers"],
        d_model=a["d_model"],
        d_state=a["d_state"],
        expand=a["expand"],
        n_heads=a["heads"],
        backend="sequential",
    )
    model.load_state_dict(entry["model"])
    model.eval()
    return model, data, a


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--models",
        default="docs/experiments/models.pt",
        help="models.pt of a sweep, or one train.py checkpoint",
    )
    p.add_argument("--run", default="selcopy-kla-b1")
    p.add_argument("--index", type=int, default=0, help="which evaluation sequence")
    p.add_argument("--out", default="docs/experiments/belief_selcopy.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, data, a = load_run(args.models, args.run)
    name = a.get("name") or args.run
    x, y = data.inputs[args.index : args.index + 1], data.targets[args.index]
    V = data.vocab_size
    if a["task"] == "selective_copy":

        def label(t):
            return "·" if t == V - 2 else ("C" if t == V - 1 else format(t, "x"))
    else:

        def label(t):
            return str(t)

    ds = inspect(model, x, token_text=label)
    with torch.no_grad():
        pred = model(x).argmax(-1)[0]
    mask = y != -100
    correct = float((pred[mask] == y[mask]).float().mean())

    L = x.shape[1]
    tokens = x[0].numpy()
    if a["task"] == "selective_copy":
        content = np.where(tokens < V - 2)[0]
        marker = int(np.where(tokens == V - 1)[0][0])
    else:
        content, marker = np.arange(L), None

    fig, axes = plt.subplots(3, 1, figsize=(14, 10), sharex=True)
    plot_precision(ds, "posterior_precision", ax=axes[0], max_labels=L)
    plot_layer_summary(ds, "write_gain", ax=axes[1], max_labels=L)
    plot_layer_summary(ds, "gated_readout_variance", ax=axes[2], max_labels=L)
    for ax in axes:
        for t in content:
            ax.axvline(t, color="w" if ax is axes[0] else "C3", lw=0.5, ls=":", alpha=0.8)
        if marker is not None:
            ax.axvline(marker, color="k", lw=1.0)
    axes[0].set_title(
        f"{name}: log10 posterior precision (slot mean) per channel; dotted = tokens to copy, "
        f"solid = copy marker; {100 * correct:.0f} % of this sequence's outputs correct"
    )
    axes[1].set_title(
        "write gain phi_t / lam_t (share of the precision contributed by token t), mean over lanes"
    )
    axes[2].set_title("gated readout variance per channel, mean over channels")
    fig.tight_layout()
    top = axes[0].get_position()  # the heatmap's colorbar narrows it; align the curves to it
    for ax in axes[1:]:
        pos = ax.get_position()
        ax.set_position([top.x0, pos.y0, top.width, pos.height])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    plt.close(fig)

    # Averages over all evaluation sequences of the file (not only the pictured one).
    ds_all = inspect(model, data.inputs, token_text=label)
    toks = data.inputs.numpy()
    if a["task"] == "selective_copy":
        out_mask = data.targets.numpy() != -100
        groups = {
            "content": toks < V - 2,
            "blank": (toks == V - 2) & ~out_mask,
            "marker": toks == V - 1,
            "output": out_mask,
        }
    else:
        groups = {"all": np.ones_like(toks, bool)}

    def stat(var, mask, reduce="geo"):
        v = np.moveaxis(ds_all[var].values, 1, 0)  # [batch, layer, time, ...]
        v = np.moveaxis(v, 2, 1)[mask]  # [n, layer, ...]
        return float(np.exp(np.mean(np.log(v)))) if reduce == "geo" else float(np.mean(v))

    with torch.no_grad():
        pred_all = model(data.inputs).argmax(-1)
    mask_all = data.targets != -100
    summary = {
        "run": name,
        "index": args.index,
        "length": L,
        "n_sequences": int(toks.shape[0]),
        "outputs_correct_pictured": correct,
        "outputs_correct_all": float((pred_all[mask_all] == data.targets[mask_all]).float().mean()),
        "decay_range": [float(ds.decay.min()), float(ds.decay.max())],
        "process_var_range": [float(ds.process_var.min()), float(ds.process_var.max())],
        "stationary_precision_geomean": float(
            np.exp(np.log(ds.stationary_precision.values).mean())
        ),
    }
    for gname, mask in groups.items():
        summary[gname] = {
            "n": int(mask.sum()),
            "write_gain_mean": stat("write_gain", mask, "mean"),
            "information_added_geomean": stat("information_added", mask),
            "posterior_precision_geomean": stat("posterior_precision", mask),
            "gated_readout_variance_geomean": stat("gated_readout_variance", mask),
            "value_precision_geomean": stat("value_precision", mask),
        }
    Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
