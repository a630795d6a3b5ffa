"""The plain fit's check for observations that dominate its likelihood.

After a fit without ``robust``, :func:`_outlier_check` looks for series where one observation
carries most of the squared standardized innovations, or where gross runs (a missing-value code
such as -9999) sit, refits those series without them and warns
(:class:`~kalmanscan.timeseries.robust.OutlierWarning`), naming the rows, where they move a
variance estimate by an order of magnitude or more (gross runs: always). It changes no estimate:
``fit_ou(robust=True)`` (:mod:`kalmanscan.timeseries.robust`) is the fit that screens them out.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from kalmanscan.timeseries.objective import _POSITIVE

# an observation whose squared standardized innovation exceeds this and half the series' total
# is checked for dominating the fit (refit without it)
_OUTLIER_E2 = 25.0


def _on_bound(core, i, j) -> bool:
    """Whether free parameter ``j`` of series ``i`` sits on its bound 0 in ``core`` (one row for
    a joint fit)."""
    b = np.asarray(core.opt.at_boundary)
    return bool(b[min(i, b.shape[0] - 1), j])


def _outlier_check(core, Z, ax, fixed_flat, free, labels, max_iter, tol, backend, device):
    """Warn (and return notes) where a few observations wreck the fit, each candidate series
    refitted without them: the values of its gross runs
    (:func:`~kalmanscan.timeseries.robust.gross_runs`: a missing-value code such as -9999, alone
    or several in a row, which the filter takes for the level, so that the innovations name the
    values after them), always named; else, where one observation's squared standardized
    innovation exceeds ``_OUTLIER_E2`` and half the series' sum, those within a tenth of the
    sum, named where they move a variance estimate by an order of magnitude or more. One
    :class:`~kalmanscan.timeseries.robust.OutlierWarning` per series, carrying the rows (the
    CLI's own warning of gross values absorbs it)."""
    from kalmanscan.timeseries.fit import _fit_core
    from kalmanscan.timeseries.robust import _RUN_STEPS, OutlierWarning, _row, gross_runs

    res = core.filtered
    N = Z.shape[1]
    zs = core.data.zs  # where the fit ran (the device for a GPU fit)
    R = torch.as_tensor(
        core.est["obs_var"] / core.s**2, dtype=zs.dtype, device=zs.device
    )  # standardized observation variance
    pm = res.pred_mean.reshape(Z.shape)
    pv = res.pred_var.reshape(Z.shape)
    e2 = (zs - pm) ** 2 / (pv + R)
    e2 = torch.where(torch.isfinite(e2), e2, 0.0)
    tot = e2.sum(0).cpu().numpy()
    mx = e2.amax(0).cpu().numpy()
    runs = gross_runs(Z, device=zs.device) & core.usable
    gross = runs.any(0)
    sus = np.flatnonzero(core.usable & (gross | ((mx > _OUTLIER_E2) & (mx > 0.5 * tot))))
    if sus.size == 0:
        return []
    drop = (e2[:, torch.as_tensor(sus, device=e2.device)]).cpu().numpy() >= 0.1 * tot[sus]
    drop = np.where(gross[sus], runs[:, sus], drop)
    Zc = Z[:, sus].copy()
    Zc[drop] = np.nan
    clean = _fit_core(
        Zc, ax.dt, {p: v[sus] for p, v in fixed_flat.items()}, free, {}, False, max_iter, tol,
        backend, device,
    )  # fmt: skip
    notes = []
    for c, i in enumerate(sus):
        worst, factor = None, 1.0
        for p in free:
            if p not in _POSITIVE:
                continue
            if _on_bound(core, i, free.index(p)) and _on_bound(clean, c, free.index(p)):
                continue  # 0 with and without them (6e-16 against 2e-10 is no change)
            a, b = core.est[p][i], clean.est[p][c]
            r = max(a, b) / max(min(a, b), 1e-300)
            if r > factor:
                worst, factor = p, r
        if (worst is None or factor < 10) and not gross[i]:
            continue
        rows = np.flatnonzero(drop[:, c])
        one = rows.size == 1
        it = "it" if one else "them"
        who = f"series {labels[i]!r}" if labels else (f"series {i}" if N > 1 else "the series")
        # every value of the runs (a code repeats: a run of more than 20 is rare), else 3
        limit = 20 if gross[i] else 3
        shown = ", ".join(_row(ax, Z, r, i) for r in rows[:limit]) + (
            f" and {rows.size - limit} more" if gross[i] and rows.size > limit else ""
        )
        effect = (
            f"dominate{'s' if one else ''} the likelihood: without {it} {worst} is "
            f"{clean.est[worst][c]:.4g} instead of {core.est[worst][i]:.4g} (a factor "
            f"{factor:.3g})"
            if worst is not None and factor >= 10
            else None
        )
        text = f"in {who}, {shown}" + (f" {effect}" if effect else "")
        if gross[i]:
            they = ("; it" if one else "; they") if effect else ""
            text += (
                f"{they} lie{'s' if one else ''} more than {_RUN_STEPS:g} typical steps (the "
                "median change between neighbouring values) from the values around "
                f"{it}: a missing-value code or a data error? set those values to NaN (or fix the "
                f"data) to fit without them, or fit with robust=True (--robust) to screen {it} out"
            )
        else:
            text += (
                "; check for a data error, or set those values to NaN to fit without them, or fit "
                "with robust=True (--robust) to screen outliers"
            )
        series = labels[i] if labels else (i if N > 1 else None)
        warnings.warn(
            OutlierWarning(text, series=series, rows=rows, gross=gross[i], effect=effect),
            stacklevel=4,
        )
        notes.append(text)
    return notes
