"""What the commands say beside their output files: the summary's forecast table, and the
warnings on rates per ``--time-unit`` and on gross values (a missing-value code such as -9999).

Part of :mod:`kalmanscan.timeseries.cli`, which re-exports these names.
"""

from __future__ import annotations

import math
import re

import numpy as np

from kalmanscan.timeseries.coverage import percent
from kalmanscan.timeseries.csvfile import _shorten
from kalmanscan.timeseries.outputs import _cf_texts, _iso_times, _number_text


def _forecast_table(ds, series_dims, max_rows: int = 10, max_series: int = 4) -> str:
    """The summary's forecast table: the first ``max_rows`` steps of the first ``max_series``
    series, in significant digits (data of order 1e-12 or 1e12 as well as 1), saying what it
    leaves to results.csv."""
    if "forecast_mean" not in ds:
        return ""
    covs = list(ds["coverage"].values)
    c = max(covs)
    lines = [f"forecast (mean, s.e. of a new observation, {percent(c)} predictive interval):"]
    one = ds
    picks = [{}]
    if series_dims:
        picks = [
            dict(
                zip(
                    series_dims,
                    np.unravel_index(i, [ds.sizes[d] for d in series_dims]),
                    strict=False,
                )
            )
            for i in range(min(math.prod(ds.sizes[d] for d in series_dims), max_series))
        ]
    ft = ds["forecast_time"].values
    # dates as results.csv writes them (the coarsest exact unit: 2009-10-01 for quarters)
    when = (
        _iso_times(ft)
        if ft.dtype.kind == "M"
        else _cf_texts(ft) or [_number_text(float(t)) for t in ft]  # (cftime: a model's calendar)
    )
    for idx in picks:
        one = ds.isel(idx) if idx else ds
        if idx:
            lines.append(
                "  "
                + ", ".join(
                    f"{d}={one[d].values}" if d in one.coords else f"{d}={i}"
                    for d, i in idx.items()
                )
            )
        for h in range(min(ds.sizes["forecast_time"], max_rows)):
            t = when[h]
            m = float(one["forecast_mean"].values[h])
            se = math.sqrt(float(one["forecast_predictive_variance"].values[h]))
            lo = float(one["forecast_lower"].sel(coverage=c).values[h])
            hi = float(one["forecast_upper"].sel(coverage=c).values[h])
            lines.append(f"  {t:>20}  {m:#12.7g}  {se:#10.5g}  [{lo:#.5g}, {hi:#.5g}]")
        steps = ds.sizes["forecast_time"]
        if steps > max_rows:
            lines.append(f"  ... {steps - max_rows} more steps (to {when[-1]}) in results.csv")
    n_series = math.prod(ds.sizes[d] for d in series_dims) if series_dims else 1
    if n_series > len(picks):
        lines.append(f"  ... {n_series - len(picks)} more series in results.csv")
    return "\n".join(lines)


def _units_warning(ax, params: dict, given: bool) -> str | None:
    """A note when dates are far from one --time-unit apart: rates are per unit, not per step."""
    if not ax.is_datetime or len(ax.t) < 2:
        return None
    d = np.diff(ax.t)
    d = d[d > 0]
    if d.size == 0:
        return None
    med = float(np.median(d))
    if 0.5 <= med <= 2.0:
        return None
    step = _describe_duration(med * (ax.unit / np.timedelta64(1, "s")))
    suggest = step.replace(" ", "")
    if given:
        sigma2 = float(np.max(np.atleast_1d(params.get("sigma2", 0.0))))
        return (
            f"warning: --theta and --sigma2 are rates per --time-unit ({ax.unit_name}), and the "
            f"rows are a median {step} apart ({med:.4g} units): sigma2={sigma2:g} per "
            f"{ax.unit_name} adds {sigma2 * med:.4g} of level variance per step; if your values "
            f"are per step, pass --time-unit {suggest} or rescale them"
        )
    return (
        f"note: theta and sigma2 are estimated per --time-unit ({ax.unit_name}); the rows are a "
        f"median {step} apart"
    )


def _gross_warning(z, hit, names, ax, fit: bool, effects=None, lines=None) -> str | None:
    """A warning naming the values of the gross runs ``hit [T, S]`` of ``z``
    (:func:`~kalmanscan.timeseries.robust.gross_runs`: a missing-value code such as -9999 among
    temperatures, alone or several in a row, which a fit would take for the level): their rows
    (from 0 in time order), times and values, what they do to the fit (``effects``: ``{column:
    the fit's OutlierWarning.effect}``), with ``--missing`` for a value that repeats (a code) and
    ``--robust``; ``None`` where there are none. ``lines``: the file line of each row (the CSV
    reader's ``file_lines``), said beside them, as the reader's errors count rows."""
    from kalmanscan.timeseries.robust import _RUN_STEPS, _row

    if not hit.any():
        return None
    effects = effects or {}
    rows, cols = np.nonzero(hit)
    parts = []
    for j in np.unique(cols):
        r = rows[cols == j]
        shown = [_row(ax, z, t, j) for t in r[:5]]
        more = f" and {r.size - 5} more" if r.size > 5 else ""
        effect = f" {effects[j]}" if j in effects else ""
        parts.append(f"series {names[j]!r}: {', '.join(shown)}{more}{effect}")
    values, counts = np.unique(z[hit], return_counts=True)
    texts = [f"{v:.15g}" for v in values]
    # a code: a value that repeats, or one of nines (-9999, 999.9)
    codes = [t for t, k in zip(texts, counts, strict=True) if k > 1 or _NINES.fullmatch(t)][:3]
    # (a negative number with an exponent in the = form: argparse takes -1e+20 for an option)
    option = " ".join(
        f"--missing={c}" if c.startswith("-") and "e" in c else f"--missing {c}" for c in codes
    )
    what = f"a missing-value code? {option} reads such cells as missing; " if codes else ""
    what = what or "a data error? "
    # rows count from 0 in time order, as the --robust list does; the file's lines beside
    order = np.lexsort((rows, cols))  # (as the series list them below)
    at = list(dict.fromkeys(int(lines[rows[k]]) for k in order)) if lines is not None else []
    where = "rows from 0 in time order" + (
        f"; line{'s' * (len(at) > 1)} {_shorten(', '.join(map(str, at)), 60)} of the file"
        if at
        else ""
    )
    return (
        f"{rows.size} value{'s lie' if rows.size != 1 else ' lies'} more than {_RUN_STEPS:g} "
        "typical steps (the median change between neighbouring values) from the values around "
        f"{'them' if rows.size != 1 else 'it'} ({where}): {_shorten('; '.join(parts), 600)}; "
        f"{what}" + ("--robust screens them out" if fit else "--fit --robust screens them out")
    )


_NINES = re.compile(r"-?9+(\.9+)?")


def _describe_duration(seconds: float) -> str:
    """A step of ``seconds`` in the largest unit it fills.

    >>> _describe_duration(3 * 3600.0), _describe_duration(0.25)
    ('3 h', '0.25 s')
    """
    for unit, size in (("D", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.6g} {unit}"
    return f"{seconds:.3g} s"
