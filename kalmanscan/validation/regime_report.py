"""The battery's tables (:mod:`kalmanscan.validation.regimes`): markdown per dtype
(:func:`markdown`), one line per regime (:func:`compact_markdown`, :func:`float32_markdown`,
:func:`grad_markdown`) and the plain-text table of ``python -m kalmanscan.validation.regimes``
(:func:`format_text`).
"""

from __future__ import annotations

import math

from kalmanscan.validation.regime_metrics import COLUMNS


def _e(x: float) -> str:
    if x != x:
        return "nan"
    if math.isinf(x):
        return "inf"
    return "0" if x == 0 else f"{x:.1e}"


def markdown(rows: list[dict], dtype: str = "float64") -> str:
    """One markdown table: regime x backend, the five errors and pass/fail (``dtype`` rows)."""
    lines = [
        "| regime | T | backend | filter mean (sd) | filter var | loglik | smoothed mean (sd) "
        "| smoothed var | status |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["dtype"] != dtype:
            continue
        st = {True: "pass", False: "**FAIL**", None: "-"}[r["passes"]]
        cells = " | ".join(_e(r[k]) for k in COLUMNS)
        if r.get("refused"):
            why = "names another backend" if "backend=" in r["error"] else "not representable"
            st, cells = f"refused ({why})", " | ".join("-" for _ in COLUMNS)
        elif r["error"]:
            st = f"**raises** {r['error'].split(':')[0]}"
        lines.append(f"| {r['regime']} | {r['T']} | {r['backend']} | {cells} | {st} |")
    return "\n".join(lines)


def _cell(r: dict | None) -> str:
    if r is None:
        return "n/a"
    if r.get("refused"):
        return "refused"
    if r["error"]:
        return f"**raises {r['error'].split(':')[0]}**"
    m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
    v = max(r["filter_var"], r["smooth_var"], r["loglik"])
    txt = f"{_e(m)} / {_e(v)}"
    return f"**{txt} FAIL**" if r["passes"] is False else txt


def compact_markdown(rows: list[dict], before: list[dict] | None = None) -> str:
    """One line per regime: per float64 backend ``worst mean error (sd) / worst relative error
    (variances, log-likelihood)``, the float32 worst over the backends, and optionally the
    float64 backends that failed in an earlier run (``before``)."""
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    idx = {(r["regime"], r["backend"], r["dtype"]): r for r in rows}
    head = "| regime | T | " + " | ".join(f"{b} float64" for b in backends) + " | float32 worst |"
    sep = "|---|---:|" + "---|" * len(backends) + "---|"
    if before is not None:
        head += " before |"
        sep += "---|"
        bidx = {(r["regime"], r["backend"], r["dtype"]): r for r in before}
    lines = [head, sep]
    for name in dict.fromkeys(r["regime"] for r in rows):
        T = next(r["T"] for r in rows if r["regime"] == name)
        cells = [_cell(idx.get((name, b, "float64"))) for b in backends]
        r32 = [idx[(name, b, "float32")] for b in backends if (name, b, "float32") in idx]
        f32 = [r for r in r32 if not r["error"]]
        raised = [r for r in r32 if r["error"] and not r.get("refused")]
        if raised:  # a raise on a valid model is never hidden behind the others' figures
            c32 = "; ".join(f"**{r['backend']} raises {r['error'].split(':')[0]}**" for r in raised)
        elif f32:
            m = max(max(r["filter_mean_sd"], r["smooth_mean_sd"]) for r in f32)
            v = max(max(r["filter_var"], r["smooth_var"], r["loglik"]) for r in f32)
            c32 = f"{_e(m)} / {_e(v)}"
        else:
            c32 = "refused" if r32 else "n/a"
        line = f"| {name} | {T} | " + " | ".join(cells) + f" | {c32} |"
        if before is not None:
            bad = []
            for b in backends:
                r = bidx.get((name, b, "float64"))
                if r is None:
                    continue
                if r["error"] and not r.get("refused"):
                    bad.append(f"{b} raised {r['error'].split(':')[0]}")
                elif r["passes"] is False:
                    m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
                    v = max(r["filter_var"], r["smooth_var"], r["loglik"])
                    bad.append(f"{b} {_e(m)} / {_e(v)}")
            seen = any((name, b, "float64") in bidx for b in backends)
            line += f" {'; '.join(bad) if bad else ('pass' if seen else 'n/a')} |"
        lines.append(line)
    return "\n".join(lines)


def float32_markdown(rows: list[dict]) -> str:
    """One line per regime: each backend's float32 ``worst mean error (sd) / worst relative
    error`` against the float64 oracle (inputs rounded to float32 first, as a user's would be)."""
    backends = list(dict.fromkeys(r["backend"] for r in rows if r["dtype"] == "float32"))
    idx = {(r["regime"], r["backend"]): r for r in rows if r["dtype"] == "float32"}
    lines = [
        "| regime | T | " + " | ".join(f"{b} float32" for b in backends) + " |",
        "|---|---:|" + "---|" * len(backends),
    ]
    for name in dict.fromkeys(r["regime"] for r in rows if r["dtype"] == "float32"):
        T = next(r["T"] for r in rows if r["regime"] == name)
        cells = []
        for b in backends:
            r = idx.get((name, b))
            if r is None:
                cells.append("n/a")
            elif r.get("refused"):
                cells.append("refused")
            elif r["error"]:
                cells.append(f"raises {r['error'].split(':')[0]}")
            else:
                m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
                v = max(r["filter_var"], r["smooth_var"], r["loglik"])
                cells.append(f"{_e(m)} / {_e(v)}")
        lines.append(f"| {name} | {T} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grad_markdown(grads: list[dict]) -> str:
    """One line per regime: the gradient error of each backend (float64)."""
    backends = list(dict.fromkeys(g["backend"] for g in grads))
    idx = {(g["regime"], g["backend"]): g for g in grads}
    lines = [
        "| regime | T | " + " | ".join(f"{b} float64" for b in backends) + " |",
        "|---|---:|" + "---:|" * len(backends),
    ]
    for name in dict.fromkeys(g["regime"] for g in grads):
        cells = []
        for b in backends:
            g = idx.get((name, b))
            if g is None:
                cells.append("n/a")
            elif g["error"]:
                cells.append(f"**raises {g['error'].split(':')[0]}**")
            else:
                cells.append(_e(g["grad"]) if g["passes"] else f"**{_e(g['grad'])} FAIL**")
        T = next(g["T"] for g in grads if g["regime"] == name)
        lines.append(f"| {name} | {T} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_text(rows: list[dict]) -> str:
    head = f"{'regime':52s} {'backend':10s} {'dtype':7s} " + " ".join(f"{c:>14s}" for c in COLUMNS)
    out = [head]
    for r in rows:
        st = {True: "PASS", False: "FAIL", None: ""}[r["passes"]]
        out.append(
            f"{r['regime'][:52]:52s} {r['backend']:10s} {r['dtype']:7s} "
            + " ".join(f"{_e(r[c]):>14s}" for c in COLUMNS)
            + f"  {st} {r['error'][:60]}"
        )
    return "\n".join(out)
