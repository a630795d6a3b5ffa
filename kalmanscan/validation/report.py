"""Tables and figures of a battery run: console table, CSV, markdown, error-vs-length figure."""

from __future__ import annotations

import csv
import io
from collections import defaultdict

import numpy as np

from .battery import QUANTITIES, row_passes

__all__ = [
    "row_status",
    "sort_rows",
    "format_table",
    "write_csv",
    "markdown_table",
    "growth_table",
    "plot_error_vs_length",
    "plot_drift",
    "plot_drift_from_records",
    "ROW_KEYS",
]

ROW_KEYS = ("truth", "quantity", "dtype", "backend", "max_rel_err", "tol", "n_models")
_TRUTH_ORDER = ("filterpy", "dense oracle", "statsmodels (Nile)", "scipy expm (Van Loan)")


def sort_rows(rows: list[dict]) -> list[dict]:
    """Rows in a stable reading order: truth, quantity, dtype (float64 first), backend."""

    def key(r):
        t = _TRUTH_ORDER.index(r["truth"]) if r["truth"] in _TRUTH_ORDER else len(_TRUTH_ORDER)
        q = QUANTITIES.index(r["quantity"]) if r["quantity"] in QUANTITIES else len(QUANTITIES)
        return (t, r["truth"], q, r["quantity"], r["dtype"] != "float64", r["dtype"], r["backend"])

    return sorted(rows, key=key)


def _fmt_err(x: float) -> str:
    return "nan" if x != x else f"{x:.2e}"


def row_status(row: dict) -> str:
    """``FAIL``, ``PASS``, or ``report`` for a row that passes against an infinite tolerance
    (the float32 rows of the regime battery: figures, not judged; a backend that raised fails).

    >>> [row_status(dict(max_rel_err=1e-3, tol=t)) for t in (float("inf"), 1e-2, 1e-9)]
    ['report', 'PASS', 'FAIL']
    """
    if not row_passes(row):
        return "FAIL"
    return "report" if row["tol"] == float("inf") else "PASS"


def format_table(rows: list[dict]) -> str:
    """A fixed-width table, one row per (truth, quantity, dtype, backend), with PASS/FAIL.

    >>> print(format_table([dict(truth="filterpy", quantity="loglik", dtype="float64",
    ...       backend="torch", max_rel_err=1e-13, tol=1e-9, n_models=3)]).splitlines()[2])
    filterpy  loglik    float64  torch     1.00e-13  1e-09       3  PASS
    """
    head = ("truth", "quantity", "dtype", "backend", "worst err", "tol", "models", "status")
    body = [
        (
            r["truth"],
            r["quantity"],
            r["dtype"],
            r["backend"],
            _fmt_err(r["max_rel_err"]),
            f"{r['tol']:.0e}",
            str(r["n_models"]),
            row_status(r),
        )
        for r in sort_rows(rows)
    ]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    right = {4, 5, 6}

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    return "\n".join(out)


def write_csv(rows: list[dict], path) -> None:
    """All rows as CSV (the required keys first, then ``worst_model`` when present)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(ROW_KEYS + ("passes", "worst_model"))
    for r in sort_rows(rows):
        w.writerow([r[k] for k in ROW_KEYS] + [row_passes(r), r.get("worst_model", "")])
    with open(path, "w", newline="") as f:
        f.write(buf.getvalue())


def markdown_table(rows: list[dict]) -> str:
    """The table as GitHub markdown (worst model named for each row).

    >>> md = markdown_table([dict(truth="filterpy", quantity="loglik", dtype="float64",
    ...       backend="torch", max_rel_err=1e-13, tol=1e-9, n_models=3, worst_model="m")])
    >>> md.splitlines()[2]
    '| filterpy | loglik | float64 | torch | 1.00e-13 | 1e-09 | 3 | PASS | m |'
    """
    lines = [
        "| truth | quantity | dtype | backend | worst rel. error | tolerance | models | status "
        "| worst model |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in sort_rows(rows):
        lines.append(
            f"| {r['truth']} | {r['quantity']} | {r['dtype']} | {r['backend']} "
            f"| {_fmt_err(r['max_rel_err'])} "
            f"| {r['tol']:.0e} | {r['n_models']} | {row_status(r)} "
            f"| {str(r.get('worst_model', '')).replace('|', '/')} |"
        )
    return "\n".join(lines)


def growth_table(
    records: list[dict], quantity: str = "filtered var", truth: str = "filterpy"
) -> str:
    """Markdown: error of ``quantity`` against length per model/backend/dtype (growth study)."""
    d = defaultdict(dict)
    for r in records:
        if r["family"] == "growth" and r["quantity"] == quantity and r["truth"] == truth:
            d[(r["model"], r["backend"], r["dtype"])][r["T"]] = r["rel_err"]
    Ts = sorted({T for v in d.values() for T in v})
    lines = [
        "| model | backend | dtype | " + " | ".join(f"T={T}" for T in Ts) + " |",
        "|---|---|---|" + "---:|" * len(Ts),
    ]
    for (m, b, dt), v in sorted(d.items(), key=lambda kv: (kv[0][2] != "float32", kv[0])):
        lines.append(
            f"| {m} | {b} | {dt} | "
            + " | ".join(_fmt_err(v[T]) if T in v else "-" for T in Ts)
            + " |"
        )
    return "\n".join(lines)


def plot_error_vs_length(records: list[dict], path=None, truth: str = "filterpy"):
    """Figure: worst relative error against sequence length for the growth-study models.

    One panel per quantity (filtered mean and variance, smoothed mean and variance, loglik);
    colour = model, solid = float32 ``torch`` (parallel), dashed = float32 ``sequential``,
    dotted = float64. Saves to ``path`` (PNG) when given; returns the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quantities = ("filtered mean", "filtered var", "smoothed mean", "smoothed var", "loglik")
    data = defaultdict(dict)
    for r in records:
        if r["family"] == "growth" and r["truth"] == truth:
            data[(r["quantity"], r["model"], r["backend"], r["dtype"])][r["T"]] = r["rel_err"]
    models = sorted({k[1] for k in data})
    backends = sorted({k[2] for k in data})
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {m: cycle[i % len(cycle)] for i, m in enumerate(models)}
    styles = {"float32": {"torch": "-", "sequential": "--"}, "float64": {}}
    fig, axes = plt.subplots(2, 3, figsize=(14, 8), sharex=True)
    eps32 = float(np.finfo(np.float32).eps)
    for ax, q in zip(axes.flat, quantities, strict=False):
        for m in models:
            for b in backends:
                for dt in ("float32", "float64"):
                    v = data.get((q, m, b, dt))
                    if not v:
                        continue
                    Ts = sorted(v)
                    ys = [max(v[T], 1e-17) for T in Ts]
                    ls = styles[dt].get(b, "-." if dt == "float32" else ":")
                    ax.loglog(
                        Ts,
                        ys,
                        ls,
                        color=colours[m],
                        marker="o" if dt == "float32" else ".",
                        ms=3,
                        alpha=1.0 if dt == "float32" else 0.5,
                        label=f"{m} ({b}, {dt})" if q == quantities[0] else None,
                    )
        ax.axhline(eps32, color="grey", lw=0.8)
        ax.text(ax.get_xlim()[0], eps32 * 1.3, " float32 eps", color="grey", fontsize=7)
        ax.set_title(q)
        ax.set_ylabel("relative error vs filterpy (float64)")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("sequence length T")
    axes.flat[-1].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[-1].legend(handles, labels, loc="center", fontsize=7, frameon=False)
    fig.suptitle("kalmanscan against filterpy (float64 truth): worst relative error per lane")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def plot_drift(batch, truth, runners, path=None, lane: int = 0):
    """Figure: per-step relative error of float32 filtered variance and mean along one lane.

    ``batch``: a :class:`~kalmanscan.validation.models.LaneBatch`; ``truth``: the float64
    :class:`~kalmanscan.validation.truths.Truth` of lane ``lane``. Returns the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .battery import run_kalmanscan

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
    t = np.arange(1, batch.shape[0] + 1)
    for runner in runners:
        out = run_kalmanscan(batch, runner, "float32")
        ev = np.abs(out["var"][:, lane] / truth.var - 1)
        scale = np.nanmax(np.abs(truth.mean))
        em = np.abs(out["mean"][:, lane] - truth.mean) / scale
        axes[0].semilogy(t, np.maximum(ev, 1e-12), lw=0.7, label=f"{runner.label} float32")
        axes[1].semilogy(t, np.maximum(em, 1e-12), lw=0.7, label=f"{runner.label} float32")
    axes[0].set_title(f"{batch.names[lane]}: filtered variance, |a/b - 1|")
    axes[1].set_title("filtered mean, |a - b| / max|b|")
    for ax in axes:
        ax.set_xlabel("step t")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def drift_model(records: list[dict]) -> tuple[str, int]:
    """``(model, T)`` for :func:`plot_drift_from_records`: the growth-study model with the largest
    float32 filtered-variance error against filterpy at any length and by any runner (the
    ``sequential`` loop stops short of the longest length in full mode), and the longest length.

    >>> rec = lambda m, T, e: dict(family="growth", dtype="float32", quantity="filtered var",
    ...                            truth="filterpy", model=m, T=T, rel_err=e)
    >>> drift_model([rec("a", 16, 1e-4), rec("b", 100, 2e-5), rec("a", 100, 1e-5)])
    ('a', 100)
    """
    growth = [
        r
        for r in records
        if r["family"] == "growth"
        and r["dtype"] == "float32"
        and r["quantity"] == "filtered var"
        and r["truth"] == "filterpy"
    ]
    if not growth:
        raise ValueError("records: expected growth-study records (run the battery first)")
    worst = max(growth, key=lambda r: r["rel_err"])
    return worst["model"], max(r["T"] for r in growth)


def plot_drift_from_records(records: list[dict], runners, path=None, seed: int = 0):
    """:func:`plot_drift` for the growth-study model whose float32 filtered variance drifts most
    (:func:`drift_model`), at the longest length of the growth study, every runner in ``runners``.
    """
    from .models import LaneBatch, growth_families
    from .truths import filterpy_truth

    model, T = drift_model(records)
    full = growth_families(seed, T)
    n = full.names.index(model)
    batch = LaneBatch.stack(full.family, [full.lane(n)])
    return plot_drift(batch, filterpy_truth(batch.lane(0)), runners, path)
