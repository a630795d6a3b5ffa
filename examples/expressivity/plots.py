"""Figures and markdown tables from the sweep's JSON files (docs/experiments/*.json).

    python examples/expressivity/plots.py --results docs/experiments --out docs/experiments

Writes ``a5.png``, ``mqar.png``, ``mad.png``, ``ablation.png`` and prints the tables used in
docs/experiments.md. Accuracy for a length ``n`` on A5 is the mean per-position accuracy over
positions ``1..n`` (a causal model's accuracy on words of length ``n``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

A5_LENGTHS = list(range(4, 21))
A5_PUBLISHED_KLA = {
    3: 1,
    4: 1,
    5: 1,
    6: 1,
    7: 1,
    8: 1,
    9: 2,
    10: 2,
    11: 2,
    12: 2,
    14: 2,
    16: 2,
    18: 2,
    20: 2,
}
THRESHOLD = 0.99
COLORS = {"kla": "C0", "linear": "C1", "attention": "C2", "kla_p0": "C3"}


def load(results: Path, group: str):
    path = results / f"{group}.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def acc(run):
    f = run.get("final") or {}
    return f.get("accuracy")


def prefix_accuracy(run, n):
    per = (run.get("final") or {}).get("per_position")
    if not per or len(per) < n:
        return None
    return float(np.mean(per[:n]))


def a5_min_blocks(runs):
    """mixer -> {length: min blocks reaching THRESHOLD (None if no depth tried does)}."""
    out = {}
    for mixer in sorted({r["mixer"] for r in runs}):
        mine = sorted((r for r in runs if r["mixer"] == mixer), key=lambda r: r["config"]["layers"])
        out[mixer] = {}
        for n in A5_LENGTHS:
            ok = [r["config"]["layers"] for r in mine if (prefix_accuracy(r, n) or 0) >= THRESHOLD]
            out[mixer][n] = min(ok) if ok else None
    return out


def fmt(x, digits=1):
    return "—" if x is None else f"{100 * x:.{digits}f}"


def tables(results: Path) -> str:
    lines = []
    a5 = load(results, "a5")
    if a5:
        mb = a5_min_blocks(a5)
        depths = sorted({r["config"]["layers"] for r in a5})
        lines += [
            "### A5: minimum blocks reaching 99 % (— : none of "
            + ", ".join(map(str, depths))
            + ")",
            "",
            "| mixer | " + " | ".join(str(n) for n in A5_LENGTHS) + " |",
            "|---|" + "---|" * len(A5_LENGTHS),
        ]
        for mixer, row in mb.items():
            lines.append(
                f"| {mixer} | "
                + " | ".join("—" if row[n] is None else str(row[n]) for n in A5_LENGTHS)
                + " |"
            )
        lines.append(
            "| KLA (published) | "
            + " | ".join(str(A5_PUBLISHED_KLA.get(n, "")) for n in A5_LENGTHS)
            + " |"
        )
        lines += [
            "",
            "### A5 runs (accuracy over all 20 positions; longest prefix >= 99 %)",
            "",
            "| run | blocks | steps | train s | acc % (L=20) | longest n with >= 99 % |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(a5, key=lambda r: (r["mixer"], r["config"]["layers"])):
            good = [n for n in range(1, 21) if (prefix_accuracy(r, n) or 0) >= THRESHOLD]
            lines.append(
                f"| {r['name']} | {r['config']['layers']} | {r.get('steps')} | "
                f"{r.get('train_seconds')} | "
                f"{fmt(acc(r))} | {max(good) if good else 0} |"
            )
        lines.append("")
    for group, title in (
        ("mqar", "MQAR"),
        ("mad", "MAD tasks"),
        ("ablation", "Process-noise ablation"),
    ):
        runs = load(results, group)
        if not runs:
            continue
        lines += [
            f"### {title}",
            "",
            "| run | mixer | blocks | d_model | steps | train s | accuracy % | diverged "
            "| max precision |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            c = r.get("config", {})
            mp = r.get("max_precision")
            mpv = max((b["max"] or math.inf) for b in mp) if mp else None
            lines.append(
                f"| {r['name']} | {r.get('mixer', c.get('mixer'))} | {c.get('layers')} | "
                f"{c.get('d_model')} | {r.get('steps')} | {r.get('train_seconds')} | "
                f"{fmt(acc(r))} | {r.get('diverged')} | "
                f"{'—' if mpv is None else f'{mpv:.3g}'} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_a5(runs, path):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    mb = a5_min_blocks(runs)
    max_depth = max(r["config"]["layers"] for r in runs)
    for i, (mixer, row) in enumerate(mb.items()):
        ys = [row[n] if row[n] is not None else max_depth + 1 for n in A5_LENGTHS]
        ax1.plot(
            np.array(A5_LENGTHS) + 0.08 * (i - 1), ys, "o-", color=COLORS.get(mixer), label=mixer
        )
    pub = sorted(A5_PUBLISHED_KLA.items())
    ax1.plot([n for n, _ in pub], [d for _, d in pub], "k--", lw=1, label="KLA, published")
    ax1.set_yticks(range(1, max_depth + 2))
    ax1.set_yticklabels([str(d) for d in range(1, max_depth + 1)] + [f">{max_depth}"])
    ax1.set_xlabel("word length n")
    ax1.set_ylabel("min blocks reaching 99 %")
    ax1.set_title("A5 word problem: depth needed")
    ax1.legend(fontsize=8)
    for r in sorted(runs, key=lambda r: (r["mixer"], r["config"]["layers"])):
        per = (r.get("final") or {}).get("per_position")
        if not per:
            continue
        d = r["config"]["layers"]
        ax2.plot(
            range(1, len(per) + 1),
            per,
            color=COLORS.get(r["mixer"]),
            alpha=0.35 + 0.65 * d / max_depth,
            lw=1.2,
            label=f"{r['mixer']} x{d}",
        )
    ax2.axhline(THRESHOLD, color="k", lw=0.6, ls=":")
    ax2.set_xlabel("position t (composition of t elements)")
    ax2.set_ylabel("accuracy at position t")
    ax2.set_title("A5 per-position accuracy (trained at length 20)")
    ax2.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mqar(runs, path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for mixer in sorted({r["mixer"] for r in runs}):
        mine = sorted(
            (r for r in runs if r["mixer"] == mixer and acc(r) is not None),
            key=lambda r: r["config"]["d_model"],
        )
        ax.plot(
            [r["config"]["d_model"] for r in mine],
            [100 * acc(r) for r in mine],
            "o-",
            color=COLORS.get(mixer),
            label=mixer,
        )
    ax.plot([64, 128, 256], [37, 52, 100], "k--", lw=1, label="KLA published (L=2048)")
    ax.plot([64, 128, 256], [1, 1, 1], ":", color="C1", lw=1, label="GLA published (L=2048)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d_model")
    ax.set_ylabel("query accuracy %")
    L = runs[0]["task_params"]["length"] if runs else "?"
    K = runs[0]["task_params"]["num_kv_pairs"] if runs else "?"
    ax.set_title(f"MQAR, 2 blocks, length {L}, {K} pairs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mad(runs, path):
    import matplotlib.pyplot as plt

    tasks = [("selective_copy", "selective copy", 90.67), ("fuzzy_recall", "fuzzy recall", 45.70)]
    mixers = ["kla", "linear", "attention"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    w = 0.2
    for j, mixer in enumerate(mixers):
        vals = []
        for task, _, _ in tasks:
            r = [r for r in runs if r["task"] == task and r["mixer"] == mixer]
            vals.append(100 * acc(r[0]) if r and acc(r[0]) is not None else 0)
        ax.bar(np.arange(len(tasks)) + (j - 1) * w, vals, w, color=COLORS[mixer], label=mixer)
    ax.bar(
        np.arange(len(tasks)) + 2 * w,
        [p for _, _, p in tasks],
        w,
        color="0.6",
        label="KLA published",
    )
    ax.set_xticks(np.arange(len(tasks)) + 0.1)
    ax.set_xticklabels([t for _, t, _ in tasks])
    ax.set_ylabel("test accuracy %")
    ax.set_ylim(0, 100)
    ax.set_title("MAD-style tasks, 1 block, d_model 128")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ablation(runs, path):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for r in runs:
        hist = [h for h in r.get("history", []) if "loss" in h]
        if not hist:
            continue
        d = r["config"]["layers"]
        style = {"kla": "-", "kla_p0": "--", "linear": ":"}.get(r["mixer"], "-.")
        label = f"{r['mixer']} x{d}" + (" (diverged)" if r.get("diverged") else "")
        color = "C0" if d == 1 else "C3"
        ax1.plot(
            [h["step"] for h in hist],
            [h["loss"] if math.isfinite(h["loss"]) else np.nan for h in hist],
            style,
            color=color,
            label=label,
        )
        if r.get("diverged"):
            ax1.axvline(hist[-1]["step"], color=color, ls=style, lw=0.6)
        ev = [h for h in r.get("history", []) if "eval_accuracy" in h]
        ax2.plot(
            [h["step"] for h in ev],
            [100 * h["eval_accuracy"] for h in ev],
            style + "o",
            ms=3,
            color=color,
            label=label,
        )
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss")
    ax1.set_title("selective copy: learnable p (-) vs p = 0 (--), linear (:)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("step")
    ax2.set_ylabel("eval accuracy %")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default="docs/experiments")
    p.add_argument("--out", default="docs/experiments")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    results, out = Path(args.results), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a5, mqar, mad, abl = (load(results, g) for g in ("a5", "mqar", "mad", "ablation"))
    if a5:
        plot_a5(a5, out / "a5.png")
    if mqar:
        plot_mqar(mqar, out / "mqar.png")
    if mad:
        plot_mad(mad, out / "mad.png")
    sel1 = [r for r in mad if r["task"] == "selective_copy" and r["mixer"] == "kla"]
    if abl or sel1:
        plot_ablation(sel1 + abl, out / "ablation.png")
    print(tables(results))


if __name__ == "__main__":
    main()
