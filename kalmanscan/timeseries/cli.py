"""``kalmanscan demo`` and ``kalmanscan filter``: time series with uncertainty bands from the shell.

- ``kalmanscan demo [--out DIR]``: the bundled Nile flows, local-level fit, filter, smoother and a
  10-step forecast; writes ``nile.png``, ``nile.nc``, ``nile.csv`` and ``summary.txt`` and prints
  the summary.
- ``kalmanscan filter data.csv --time-col t --value-col y [--value-col y2 ...] [--fit]
  [--forecast 10]
  --out results/``: the same for a CSV (several value columns = several series).

Both return 0 on success and 2 (with a message on stderr) for bad input. The CSV reader is
:mod:`kalmanscan.timeseries.csvfile`, the output files :mod:`kalmanscan.timeseries.outputs`.
Docs: docs/cli.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import warnings

import numpy as np

from kalmanscan.timeseries.csvfile import _UTC_NOTE, InputError, _shorten, read_csv_series
from kalmanscan.timeseries.outputs import _iso_times, _output_paths, _write_outputs

EXIT_OK, EXIT_INPUT = 0, 2


class Progress:
    """A plain-text progress bar on stderr (redrawn in place on a terminal, else one final line)."""

    def __init__(
        self, label: str, total: int, *, enabled: bool = True, stream=None, width: int = 30
    ):
        self.label, self.total, self.enabled, self.width = label, max(int(total), 1), enabled, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def _line(self) -> str:
        frac = self.done / self.total
        filled = int(round(frac * self.width))
        elapsed = time.perf_counter() - self.start
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label:<10} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s"

    def update(self, n: int = 1):
        self.done = min(self.done + n, self.total)
        if self.enabled and self.tty:
            self.stream.write("\r" + self._line())
            self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write(("\r" if self.tty else "") + self._line() + "\n")
            self.stream.flush()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kalmanscan")
    except Exception:  # not installed (a source checkout on PYTHONPATH)
        import kalmanscan

        return kalmanscan.__version__


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return p


def _parse(parser: argparse.ArgumentParser, argv):
    try:
        return parser.parse_args(list(argv)), None
    except SystemExit as e:  # --help (0) or a usage error (2, message already printed)
        return None, int(e.code or 0)


def _run(prog: str, body, args) -> int:
    """Run ``body(args)``: bad input (an :class:`InputError`, or a ``ValueError``/``TypeError``
    from the library, whose messages name the argument) exits 2 with one line on stderr;
    warnings are printed as one line each."""

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message).strip().splitlines()
        print(f"{prog}: warning: {text[0] if text else category.__name__}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        try:
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                return body(args)
        except (InputError, ValueError, TypeError, OverflowError, ZeroDivisionError) as err:
            text = str(err).strip().replace("\n", "; ") or type(err).__name__
            print(f"{prog}: {text}", file=sys.stderr)
            return EXIT_INPUT


def _add_coverage_option(p) -> None:
    p.add_argument(
        "--coverage",
        type=float,
        nargs="+",
        default=[0.5, 0.9],
        metavar="C",
        help="band coverages (default: 0.5 0.9)",
    )


def _coverage_arg(values):
    from kalmanscan.timeseries.coverage import check_coverage

    try:
        return check_coverage(values, "--coverage")
    except ValueError as err:
        raise InputError(str(err)) from err


def _forecast_table(ds, series_dims, max_rows: int = 10, max_series: int = 4) -> str:
    """The summary's forecast table: the first ``max_rows`` steps of the first ``max_series``
    series, in significant digits (data of order 1e-12 or 1e12 as well as 1), saying what it
    leaves to results.csv."""
    if "forecast_mean" not in ds:
        return ""
    covs = list(ds["coverage"].values)
    c = max(covs)
    lines = [f"forecast (mean, s.e. of a new observation, {c:.0%} predictive interval):"]
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
    when = _iso_times(ft) if ft.dtype.kind == "M" else [f"{float(t):g}" for t in ft]
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


# --- kalmanscan demo ------------------------------------------------------------------------------
def demo_main(argv=None) -> int:
    """``kalmanscan demo``: Nile local-level fit, filter, smoother, forecast; writes outputs.

    ``argv``: the command's arguments (default ``sys.argv[1:]``); returns the exit status, 0 on
    success and 2 (with a message on stderr) for bad input.

    >>> import contextlib, io, os, tempfile
    >>> out = tempfile.mkdtemp()
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     code = demo_main(["--out", out, "--forecast", "3"])
    >>> code, sorted(os.listdir(out))
    (0, ['nile.csv', 'nile.nc', 'nile.png', 'summary.txt'])
    """
    p = _parser(
        "kalmanscan demo",
        "Fit the local-level model to the bundled Nile flows (1871-1970), filter, "
        "smooth and forecast; write a PNG, a netCDF file and a summary.",
    )
    p.add_argument(
        "--out",
        default="kalmanscan-demo",
        metavar="DIR",
        help="output directory (default: kalmanscan-demo)",
    )
    p.add_argument(
        "--forecast",
        type=int,
        default=10,
        metavar="N",
        help="forecast steps in years (default: 10)",
    )
    _add_coverage_option(p)
    args, code = _parse(p, sys.argv[1:] if argv is None else argv)
    if args is None:
        return code
    return _run("kalmanscan demo", _demo, args)


def _forecast_arg(n: int) -> int | None:
    from kalmanscan.timeseries.times import MAX_FORECAST_STEPS

    if n < 0 or n > MAX_FORECAST_STEPS:
        raise InputError(
            f"--forecast: expected a number of steps from 0 to {MAX_FORECAST_STEPS}, got {n}"
        )
    return n or None


def _demo(args) -> int:
    from kalmanscan.timeseries import fit_ou, load_nile

    coverage = _coverage_arg(args.coverage)
    steps = _forecast_arg(args.forecast)
    _output_paths(args.out, ["nile.png", "nile.nc", "nile.csv", "summary.txt"])
    years, flow = load_nile()
    t0 = time.perf_counter()
    fit = fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    ds = fit.to_dataset(coverage=coverage, forecast_steps=steps, name="Nile flow")
    elapsed = time.perf_counter() - t0
    ref = (
        "reference (Durbin & Koopman 2012, exact diffuse MLE): obs_var 15099, sigma2 1469.1, "
        "loglik -632.5456"
    )
    summary = "\n".join(
        filter(
            None,
            [
                "Nile annual flow at Aswan 1871-1970 (10^8 m^3), local level model (OU with theta "
                "= 0, mu = 0)",
                fit.summary(),
                ref,
                f"final filtered level {float(ds['mean'][-1]):.4f} (s.d. "
                f"{math.sqrt(float(ds['variance'][-1])):.4f}); "
                f"fit + filter + smoother + forecast took {elapsed:.2f} s",
                _forecast_table(ds, []),
            ],
        )
    )
    files = _write_outputs(
        ds,
        args.out,
        "nile",
        summary,
        title="Nile flow: local level model",
        ylabel="flow (10^8 m^3)",
    )
    print(summary)
    print("wrote " + ", ".join(files))
    return EXIT_OK


# --- kalmanscan filter ----------------------------------------------------------------------------
def _fix_arg(items):
    """``--fix``'s ``NAME=VALUE`` items as ``{name: value}``, refusing unknown names, values
    outside a parameter's range and fixing every parameter.

    >>> _fix_arg(["theta=0", "mu=0"])
    {'theta': 0.0, 'mu': 0.0}
    """
    from kalmanscan.timeseries.model import PARAMS

    fix = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in PARAMS:
            raise InputError(
                f"--fix: expected NAME=VALUE with NAME one of {list(PARAMS)}, got {item!r}"
            )
        try:
            v = float(value)
        except ValueError as err:
            raise InputError(f"--fix {key}: expected a number, got {value!r}") from err
        lo = {"obs_var": "> 0", "theta": ">= 0", "sigma2": ">= 0"}.get(key)
        ok = math.isfinite(v) and (lo is None or (v > 0 if lo == "> 0" else v >= 0))
        if not ok:
            raise InputError(
                f"--fix {key}: expected a finite number{' ' + lo if lo else ''}, got {value!r}"
            )
        fix[key] = v
    if len(fix) == len(PARAMS):
        raise InputError(
            "--fix: every parameter is fixed, nothing to fit; give them without --fit "
            "(--theta, --sigma2, --mu, --obs-var)"
        )
    return fix


def filter_main(argv=None) -> int:
    """``kalmanscan filter data.csv ...``: filter/fit/forecast the series of a CSV.

    ``argv``: the command's arguments (default ``sys.argv[1:]``; options: docs/cli.md); returns
    the exit status, 0 on success and 2 (with a message on stderr) for bad input.

    >>> import contextlib, io, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "data.csv"), "w") as f:
    ...     _ = f.write("t,y\\n0,1.0\\n1,1.3\\n3,\\n4,0.9\\n")
    >>> argv = [os.path.join(d, "data.csv"), "--time-col", "t", "--sigma2", "0.1", "--obs-var",
    ...         "0.05", "--out", os.path.join(d, "results")]
    >>> with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    ...     code = filter_main(argv)
    >>> code, sorted(os.listdir(os.path.join(d, "results")))
    (0, ['results.csv', 'results.nc', 'results.png', 'summary.txt'])
    """
    p = _parser(
        "kalmanscan filter",
        "Filter and smooth the series of a CSV with an OU / local-level model "
        "(fitted by maximum likelihood with --fit), forecast, and write a PNG, a netCDF file, a "
        "CSV table and a summary into the --out directory.",
    )
    p.add_argument("csv", help="input CSV with a header row")
    p.add_argument(
        "--time-col", default=None, help="time column (numbers or dates; default: the row number)"
    )
    p.add_argument(
        "--time-format",
        default=None,
        metavar="FMT",
        help="format of the dates in --time-col, e.g. %%d/%%m/%%Y or ISO8601 (default: detected; "
        "ambiguous dates are refused)",
    )
    p.add_argument(
        "--dayfirst",
        action="store_true",
        help="read ambiguous dates such as 03/04/1958 day first (3 April)",
    )
    p.add_argument(
        "--value-col",
        action="append",
        default=None,
        metavar="COL",
        help="value column (repeat for several series; default: every column holding numbers)",
    )
    p.add_argument(
        "--series-col",
        default=None,
        metavar="COL",
        help="column naming each row's series, for a long table (one row per series and time; "
        "needs --time-col)",
    )
    p.add_argument(
        "--missing",
        action="append",
        default=None,
        metavar="TEXT",
        help="read value cells holding TEXT as missing (repeat for several markers): FRED's '.', "
        "Eurostat's ':', a code such as -9999 (a number matches by value); exact text after "
        "stripping spaces; the count per marker is in the notes",
    )
    p.add_argument("--fit", action="store_true", help="fit the parameters by maximum likelihood")
    p.add_argument(
        "--fix",
        action="append",
        metavar="NAME=VALUE",
        help="with --fit, hold a parameter fixed, e.g. --fix theta=0 --fix mu=0 (local level)",
    )
    p.add_argument(
        "--joint", action="store_true", help="with --fit, one parameter set for all series"
    )
    p.add_argument(
        "--robust",
        action="store_true",
        help="with --fit, screen out outliers (standardized auxiliary residual beyond a "
        "Bonferroni bound) and refit without them; listed in the summary, flagged in results.csv",
    )
    for name in ("theta", "sigma2", "mu", "obs-var"):
        per = " (per --time-unit)" if name in ("theta", "sigma2") else ""
        p.add_argument(
            f"--{name}",
            type=float,
            default=None,
            metavar="X",
            help=f"{name.replace('-', '_')} when not fitting{per}",
        )
    p.add_argument(
        "--time-unit",
        default=None,
        metavar="UNIT",
        help="model time unit for dates, e.g. 1D, 1h, 365.25D (default: 1D); theta and sigma2 "
        "are rates per this unit",
    )
    p.add_argument(
        "--forecast",
        type=int,
        default=0,
        metavar="N",
        help="forecast N typical steps ahead (default: 0)",
    )
    _add_coverage_option(p)
    p.add_argument(
        "--out",
        default="kalmanscan-results",
        metavar="DIR",
        help="output directory (default: kalmanscan-results)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, no line on what was read and no notes on stderr (the notes stay in "
        "summary.txt); warnings and errors still print",
    )
    args, code = _parse(p, sys.argv[1:] if argv is None else argv)
    if args is None:
        return code
    return _run("kalmanscan filter", _filter, args)


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


def _gross_warning(z, hit, names, ax, fit: bool, effects=None) -> str | None:
    """A warning naming the values of the gross runs ``hit [T, S]`` of ``z``
    (:func:`~kalmanscan.timeseries.robust.gross_runs`: a missing-value code such as -9999 among
    temperatures, alone or several in a row, which a fit would take for the level): their rows
    (from 0 in time order), times and values, what they do to the fit (``effects``: ``{column:
    the fit's OutlierWarning.effect}``), with ``--missing`` for a value that repeats (a code) and
    ``--robust``; ``None`` where there are none."""
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
    return (
        f"{rows.size} value{'s lie' if rows.size != 1 else ' lies'} more than {_RUN_STEPS:g} "
        "typical steps (the median change between neighbouring values) from the values around "
        f"{'them' if rows.size != 1 else 'it'}: {_shorten('; '.join(parts), 600)}; {what}"
        + ("--robust screens them out" if fit else "--fit --robust screens them out")
    )


_NINES = re.compile(r"-?9+(\.9+)?")


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
            f"too few in {', '.join(few)}"
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
    fit.series_labels = names
    return fit, effects, later


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


def _describe_duration(seconds: float) -> str:
    """A step of ``seconds`` in the largest unit it fills.

    >>> _describe_duration(3 * 3600.0), _describe_duration(0.25)
    ('3 h', '0.25 s')
    """
    for unit, size in (("D", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.6g} {unit}"
    return f"{seconds:.3g} s"


def _filter(args) -> int:
    from kalmanscan.timeseries import OUModel
    from kalmanscan.timeseries.result import _decimals
    from kalmanscan.timeseries.robust import gross_runs
    from kalmanscan.timeseries.times import as_time_axis

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))  # noqa: E731
    coverage = _coverage_arg(args.coverage)
    steps = _forecast_arg(args.forecast)
    given = {
        k: getattr(args, k)
        for k in ("theta", "sigma2", "mu", "obs_var")
        if getattr(args, k) is not None
    }
    if args.fit and given:
        raise InputError(
            f"--fit estimates the parameters; to hold some fixed use --fix (got {sorted(given)})"
        )
    if not args.fit and (args.fix or args.joint or args.robust):
        raise InputError("--fix, --joint and --robust only apply with --fit")
    if not args.fit and not {"sigma2", "obs_var"} <= set(given):
        raise InputError(
            "give --fit, or the model parameters --sigma2 and --obs-var (optionally --theta, --mu)"
        )
    if (args.time_format is not None or args.dayfirst) and args.time_col is None:
        raise InputError("--time-format and --dayfirst apply to --time-col, which is not given")
    fix = _fix_arg(args.fix)
    _output_paths(args.out, ["results.png", "results.nc", "results.csv", "summary.txt"], [args.csv])
    notes: list[str] = []
    times, z, names, was_sorted = read_csv_series(
        args.csv,
        args.time_col,
        args.value_col,
        time_format=args.time_format,
        dayfirst=True if args.dayfirst else None,
        notes=notes,
        series_col=args.series_col,
        missing=args.missing,
    )
    for note in notes:
        log(note)
    T, S = z.shape
    try:
        ax = as_time_axis(
            times,
            T,
            args.time_unit if times.dtype.kind == "M" else None,
            name=f"{args.csv}: column {args.time_col!r}" if args.time_col else "times",
        )
    except ValueError as err:
        raise InputError(str(err)) from err
    if args.time_unit is not None and not ax.is_datetime:  # (kept in summary.txt too)
        notes.append("note: --time-unit applies to dates only; numeric times are used as they are")
        log(notes[-1])
    log(
        f"read {args.csv}: {T} rows, {S} series ({', '.join(names)}), {int(np.isnan(z).sum())} "
        "missing values" + ("" if was_sorted else "; rows sorted by time")
    )
    time_unit = args.time_unit if ax.is_datetime else None
    units = _units_warning(ax, given, given=not args.fit)
    if units and not args.fit:
        print(f"kalmanscan filter: {units}", file=sys.stderr)
    # gross runs (a -9999 code): said once, by the CLI, with the --missing remedy; with --fit
    # after the fit, which finds the same runs and whose warning of them the CLI's absorbs
    hit = None if args.robust else gross_runs(z)
    gross = None if hit is None else _gross_warning(z, hit, names, ax, args.fit)
    if gross and not args.fit:
        warnings.warn(gross, stacklevel=1)
    t0 = time.perf_counter()
    if args.fit:
        try:
            fit, effects, later = _fit_all(args, z, names, ax, fix, time_unit, hit)
        except Exception:  # the gross values may be why
            if gross:
                warnings.warn(gross, stacklevel=1)
            raise
        if gross:
            gross = _gross_warning(z, hit, names, ax, True, effects)
            warnings.warn(gross, stacklevel=1)
        for message in later:
            warnings.warn(message, stacklevel=1)
        model = fit.model
        fit_text = fit.summary()
    else:
        try:
            model = OUModel(time_unit=time_unit, **given)
        except (TypeError, ValueError) as err:  # named as the options are
            text = re.sub(r"^(theta|sigma2|mu|obs_var):", lambda m: "--" + m.group(1).replace(
                "_", "-") + ":", str(err))  # fmt: skip
            raise InputError(text) from err
        fit, fit_text = (
            None,
            "parameters given: " + ", ".join(f"{k}={v:g}" for k, v in model.params().items()),
        )
    bar = Progress("filtering", 1, enabled=not args.quiet)
    from kalmanscan import xarray as kx

    outliers = None
    if fit is not None and fit.outliers is not None:
        outliers = np.asarray(fit.outliers, bool).reshape(z.shape)
    ds = kx.to_dataset(
        model,
        z if outliers is None else np.where(outliers, np.nan, z),
        ax,
        coverage=coverage,
        forecast_steps=steps,
        series_coords={"series": names},
        fit=fit,
        name=os.path.basename(args.csv),
    )
    _check_forecast_years(ds, args.forecast)
    if outliers is not None:  # filtered as missing; the input values kept beside
        dims = ds["observed"].dims
        ds["outlier"] = (dims, outliers.reshape(ds["observed"].shape))
        ds["outlier"].attrs["description"] = "screened out by --robust and filtered as missing"
        ds["outlier_value"] = (dims, np.where(outliers, z, np.nan).reshape(ds["observed"].shape))
        ds["outlier_value"].attrs["description"] = "the input value of a screened observation"
    utc = any(_UTC_NOTE in n for n in notes)
    if utc:  # the input's offsets were applied (the netCDF and CSV say so)
        ds[ds.attrs.get("time_dim", "time")].attrs["time_zone"] = "UTC"
    bar.update()
    bar.close()
    elapsed = time.perf_counter() - t0
    ll = np.atleast_1d(ds["loglik"].values)
    dsteps = np.diff(ax.t)
    irregular = dsteps.size > 0 and np.ptp(dsteps) > 1e-9 * max(np.abs(ax.t).max(), 1)
    spacing = "irregular" if irregular else "regular"
    summary = "\n".join(
        filter(
            None,
            [
                f"{args.csv}: {T} time steps "
                f"({spacing} "
                f"spacing{', time unit ' + ax.unit_name if ax.is_datetime else ''}), {S} series",
                "times in UTC (the input's offsets applied)" if utc else None,
                _READ_NOTES,
                units,
                gross and "warning: " + gross,
                fit_text,
                "log-likelihood per series: "
                + ", ".join(f"{n}={_decimals(v)}" for n, v in zip(names, ll, strict=False)),
                f"computed in {elapsed:.2f} s",
                _forecast_table(ds, ["series"]),
            ],
        )
    )
    # how the file was read (separators, decimal commas, labels, skipped columns): kept with
    # the results in summary.txt, also when --quiet leaves them off stderr; the printed summary
    # leaves them out (stderr said them as the file was read)
    read = "\n".join(notes + ([] if was_sorted else ["note: rows sorted by time"]))
    files = _write_outputs(
        ds,
        args.out,
        "results",
        summary.replace("\n" + _READ_NOTES, "\n" + read if read else ""),
        title=os.path.basename(args.csv),
        inputs=[args.csv],
    )
    summary = summary.replace("\n" + _READ_NOTES, "")
    print(summary)
    print("wrote " + ", ".join(files))
    return EXIT_OK


_READ_NOTES = "\x00read notes\x00"  # where summary.txt holds the notes on reading the file


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


def _check_forecast_years(ds, n: int) -> None:
    """Refuse forecasts past the year 9999, which netCDF's time encoding (without cftime) and the
    plot cannot hold, saying how many steps stay inside it."""
    if "forecast_time" not in ds.coords or ds["forecast_time"].dtype.kind != "M":
        return
    ft = ds["forecast_time"].values
    if np.datetime_data(ft.dtype)[0] == "ns":  # (nanoseconds end in 2262)
        return
    past = ft >= np.datetime64("10000-01-01", "s")
    if past.any():
        k = int(np.argmax(past))
        when = np.datetime_as_string(ft[k], unit="D")
        raise InputError(
            f"--forecast {n}: step {k + 1} reaches {when}, past the year 9999, which "
            f"the outputs (netCDF, the plot) cannot hold; expected at most {k} steps"
        )


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
