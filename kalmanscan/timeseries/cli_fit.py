"""``kalmanscan filter --fit``: the fit of a CSV's series (in blocks of series, the progress
bar's steps, unless ``--joint``), the blocks' notes and warnings said once each naming the series
they concern, and the blocks' fits merged into one.

Part of :mod:`kalmanscan.timeseries.cli`, which re-exports these names.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np

from kalmanscan.timeseries.cli_args import Progress
from kalmanscan.timeseries.csvfile import InputError, _shorten


def _fit_all(args, z, names, ax, fix, time_unit, hit):
    """``--fit``: the fit of all series (:func:`~kalmanscan.timeseries.fit_ou`, in blocks of
    series for the progress bar unless ``--joint``), and ``{column: effect}`` from the fit's
    warnings of the gross runs ``hit`` (:func:`_absorb_gross`), and the fit's other warnings,
    once each and naming the series they concern, to be said after the CLI's gross-value warning
    (the gross values are often their cause)."""
    from kalmanscan.timeseries import fit_ou

    n_obs = (~np.isnan(z)).sum(0)
    few = [f"{n!r} ({int(k)})" for n, k in zip(names, n_obs, strict=True) if k < 2]
    if few:
        raise InputError(
            "--fit: expected at least 2 observed values in every series; "
            f"too few in {', '.join(few)}; name the columns to fit with --value-col"
        )
    import pandas as pd

    observed = ~np.isnan(z)
    with np.errstate(invalid="ignore"):
        lo = np.where(observed, z, np.inf).min(0)
        hi = np.where(observed, z, -np.inf).max(0)
    constant = [f"{n!r} ({lo[j]:g})" for j, n in enumerate(names) if lo[j] == hi[j]]
    if constant and not args.joint:
        raise InputError(
            f"--fit: column(s) {_shorten(', '.join(constant))} hold one value only: a constant "
            "series has no maximum-likelihood estimate (the likelihood grows without bound as "
            "obs_var -> 0); leave it out (--value-col names the columns to use) or filter it "
            "with given parameters"
        )
    S = z.shape[1]
    fits = []
    effects: dict[int, str] = {}
    if args.joint or S == 1:
        bar = Progress("fitting", 1, enabled=not args.quiet)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            part = fit_ou(
                pd.DataFrame(z, columns=names),  # the notes name the columns
                ax.labels,
                fix=fix,
                joint=args.joint,
                time_unit=time_unit,
                robust=args.robust,
            )
        later = [w.message for w in _absorb_gross(part, said, hit, names, effects)]
        fits.append(part)
        bar.update()
    else:
        # blocks of series (the progress bar's steps), each fitted as a frame of its columns
        # so that the library's notes and warnings name them; the texts of blocks of one
        # series, which name none, are gathered and said once with the series they concern
        block = max(1, math.ceil(S / 50))
        block_notes: dict[str, list[str]] = {}
        block_warnings: dict[str, list[str]] = {}
        bar = Progress("fitting", S, enabled=not args.quiet)
        for s0 in range(0, S, block):
            cols = names[s0 : s0 + block]
            who = ", ".join(repr(n) for n in cols)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                try:
                    part = fit_ou(
                        pd.DataFrame(z[:, s0 : s0 + block], columns=cols),
                        ax.labels,
                        fix=fix,
                        time_unit=time_unit,
                        robust=args.robust,
                    )
                except ValueError as err:
                    text = re.sub(r"^z: ", "", str(err))
                    raise InputError(f"--fit: series {who}: {text}") from err
            for w in _absorb_gross(part, said, hit, names, effects):
                block_warnings.setdefault(str(w.message), []).append(who)
            for n in part.notes:
                block_notes.setdefault(n, []).append(who)
            part.notes = ()
            fits.append(part)
            bar.update(min(block, S - s0))
        failed: dict[str, list] = {}  # the blocks' "k of n fits did not converge": one line
        pattern = r"fit_ou: (\d+) of \d+ fits did not converge \((.*)\): series (.*)$"
        rest: dict[str, list[str]] = {}
        for text, whos in block_warnings.items():
            m = re.match(pattern, text)
            if m:
                failed.setdefault(m.group(2), []).append((int(m.group(1)), m.group(3)))
            else:
                rest[text] = whos
        later = _merge_named(rest, "fit_ou: ") + [
            f"fit_ou: {sum(k for k, _ in parts)} of {S} fits did not converge ({why}): "
            "series " + _shorten(", ".join(w for _, w in parts))
            for why, parts in failed.items()
        ]
    bar.close()
    fit = fits[0] if len(fits) == 1 else _merge_fits(fits)
    if len(fits) > 1:
        fit.notes = tuple(_merge_named(block_notes))
    fit.notes = tuple(_cli_syntax(n) for n in fit.notes)
    later = [m if _cli_syntax(str(m)) == str(m) else _cli_syntax(str(m)) for m in later]
    fit.series_labels = names
    return fit, effects, later


def _cli_syntax(text: str) -> str:
    """A fit's note or warning with the Python API's arguments written as the command's
    options: ``fix={'theta': 0.0, 'mu': 0.0}`` is ``--fix theta=0 --fix mu=0``.

    >>> _cli_syntax("fix it too (fix={'theta': 0.0, 'mu': 0.0}) for the local level model")
    'fix it too (--fix theta=0 --fix mu=0) for the local level model'
    """

    def options(m) -> str:
        items = re.findall(r"'(\w+)':\s*([-+\w.]+)", m.group(1))
        return " ".join(f"--fix {k}={float(v):g}" for k, v in items) if items else m.group(0)

    text = re.sub(r"fix=\{([^}]*)\}", options, text)
    return text.replace("robust=True (--robust)", "--robust")


def _absorb_gross(fit, said, hit, names, effects: dict) -> list:
    """The warnings ``said`` by a fit of columns ``names`` less those the CLI's gross-value
    warning says already: an :class:`~kalmanscan.timeseries.robust.OutlierWarning` naming
    exactly a column's gross runs (``hit [T, S]``). Their notes leave ``fit.notes``, and their
    ``effect`` (how the fit changes without them) goes to ``effects`` by column."""
    from kalmanscan.timeseries.robust import OutlierWarning

    column = {n: j for j, n in enumerate(names)}
    rest, absorbed = [], set()
    for w in said:
        m = w.message
        j = column.get(m.series) if isinstance(m, OutlierWarning) and m.gross else None
        if j is None or hit is None or not np.array_equal(m.rows, np.flatnonzero(hit[:, j])):
            rest.append(w)
            continue
        absorbed.add(m.note)
        if m.effect:
            effects[j] = m.effect
    if absorbed:
        fit.notes = tuple(n for n in fit.notes if n not in absorbed)
    return rest


_NAMED = re.compile(r"series ((?:'[^']*'(?:, )?)+(?: and \d+ more)?)")


def _merge_named(texts: dict, prefix: str = "") -> list[str]:
    """Block fits' notes or warnings (``{text: [the block's series]}``), each said once: texts
    that differ only in the series they name become one text naming them all; texts that name
    none get the series of the blocks that gave them (:func:`_name_series`)."""
    merged: dict[str, list[str]] = {}
    for text, whos in texts.items():
        m = _NAMED.search(text)
        if m is None:
            merged.setdefault(_name_series(text, whos, prefix), [])
        else:
            template = text[: m.start(1)] + "\0" + text[m.end(1) :]
            merged.setdefault(template, []).append(m.group(1))
    return [t.replace("\0", _shorten(", ".join(n))) if n else t for t, n in merged.items()]


def _name_series(text: str, whos: list[str], prefix: str = "") -> str:
    """A block fit's note or warning, with the series it concerns named where it names none."""
    if "series '" in text:
        return text
    body = text[len(prefix) :] if prefix and text.startswith(prefix) else text
    return f"{prefix}series {_shorten(', '.join(whos))}: {body}"


def _merge_fits(fits):
    """Concatenate separate fits of consecutive blocks of series (last axis)."""
    from kalmanscan.timeseries.model import PARAMS, OUModel
    from kalmanscan.timeseries.result import OUFit

    def cat(values):
        return np.concatenate(
            [
                np.broadcast_to(np.asarray(v, dtype=np.float64), f.z.shape[1:])
                for v, f in zip(values, fits, strict=False)
            ]
        )

    params = {p: cat([f.params[p] for f in fits]) for p in PARAMS}
    first = fits[0]
    outliers, values = None, None
    if first.outliers is not None:
        outliers = np.concatenate([np.asarray(f.outliers).reshape(f.z.shape) for f in fits], 1)
        if all(f.outlier_values is not None for f in fits):  # in the merged z[outliers] order
            data = []
            for f in fits:
                z = np.array(f.z, dtype=np.float64)
                z[np.asarray(f.outliers).reshape(z.shape)] = f.outlier_values
                data.append(z)
            values = np.concatenate(data, axis=1)[outliers]
    return OUFit(
        model=OUModel(time_unit=first.model.time_unit, **params),
        loglik=cat([f.loglik for f in fits]),
        stderr={p: cat([f.stderr[p] for f in fits]) for p in PARAMS},
        fixed=first.fixed,
        converged=np.concatenate(
            [np.broadcast_to(np.asarray(f.converged), f.z.shape[1:]) for f in fits]
        ),
        n_iter=max(f.n_iter for f in fits),
        n_obs=cat([f.n_obs for f in fits]).astype(int),
        joint=False,
        z=np.concatenate([f.z for f in fits], axis=1),
        time_axis=first.time_axis,
        at_boundary={p: cat([f.at_boundary[p] for f in fits]) > 0 for p in first.at_boundary},
        upper_bound={p: cat([f.upper_bound.get(p, np.nan) for f in fits]) for p in PARAMS},
        outliers=outliers,
        outlier_values=values,
    )
