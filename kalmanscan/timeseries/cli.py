"""``kalmanscan demo`` and ``kalmanscan filter``: time series with uncertainty bands from the shell.

- ``kalmanscan demo [--out DIR]``: the bundled Nile flows, local-level fit, filter, smoother and a
  10-step forecast; writes ``nile.png``, ``nile.nc`` and ``summary.txt`` and prints the summary.
- ``kalmanscan filter data.csv --time-col t --value-col y [--value-col y2 ...] [--fit]
  [--forecast 10]
  --out results/``: the same for a CSV (several value columns = several series).

Both return 0 on success and 2 (with a message on stderr) for bad input. Docs: docs/cli.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

EXIT_OK, EXIT_INPUT = 0, 2


class InputError(Exception):
    """Bad user input; the message is printed as is and the command exits with status 2."""


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


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )


def _parse(parser: argparse.ArgumentParser, argv):
    try:
        return parser.parse_args(list(argv)), None
    except SystemExit as e:  # --help (0) or a usage error (2, message already printed)
        return None, int(e.code or 0)


def _write_outputs(
    ds, out_dir: str, stem: str, summary: str, *, title: str, max_series: int = 4, ylabel=None
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.plot import plot_overview
    from kalmanscan.xarray import save_netcdf

    os.makedirs(out_dir, exist_ok=True)
    nc = os.path.join(out_dir, stem + ".nc")
    png = os.path.join(out_dir, stem + ".png")
    txt = os.path.join(out_dir, "summary.txt")
    try:
        save_netcdf(ds, nc, engine=os.environ.get("KALMANSCAN_NETCDF_ENGINE") or None)
    except ImportError as err:
        raise InputError(str(err)) from err
    axes = plot_overview(ds, max_series=max_series)
    axes[0].figure.suptitle(title)
    if ylabel:
        for ax in axes[:-1]:
            ax.set_ylabel(ylabel)
    axes[0].figure.savefig(png, dpi=110)
    plt.close(axes[0].figure)
    with open(txt, "w") as fh:
        fh.write(summary + "\n")
    csv = os.path.join(out_dir, stem + ".csv")
    _write_csv(ds, csv)
    return [png, nc, csv, txt]


def _write_csv(ds, path: str) -> None:
    """Long-format table: one row per (time, series) with the filtered and smoothed level (mean, sd,
    bounds at the widest coverage). Forecast rows (``kind=forecast``) give the level's mean and sd,
    the ``predictive_sd`` of a new observation, and bounds of the predictive interval."""
    import pandas as pd

    tdim = ds.attrs.get("time_dim", "time")
    sdims = [d for d in ds["mean"].dims if d != tdim]
    c = float(max(ds["coverage"].values))
    pct = f"{c * 100:g}"
    cols = {
        "observed": ds["observed"],
        "mean": ds["mean"],
        "sd": np.sqrt(ds["variance"]),
        f"lower{pct}": ds["lower"].sel(coverage=c, drop=True),
        f"upper{pct}": ds["upper"].sel(coverage=c, drop=True),
    }
    if "smoothed_mean" in ds:
        cols.update(
            {
                "smoothed_mean": ds["smoothed_mean"],
                "smoothed_sd": np.sqrt(ds["smoothed_variance"]),
                f"smoothed_lower{pct}": ds["smoothed_lower"].sel(coverage=c, drop=True),
                f"smoothed_upper{pct}": ds["smoothed_upper"].sel(coverage=c, drop=True),
            }
        )
    import xarray as xr

    table = xr.Dataset(cols).to_dataframe().reset_index()
    table.insert(0, "kind", "data")
    table = table.rename(columns={tdim: "time"})
    parts = [table]
    if "forecast_mean" in ds:
        fc = (
            xr.Dataset(
                {
                    "mean": ds["forecast_mean"],
                    "sd": np.sqrt(ds["forecast_variance"]),
                    "predictive_sd": np.sqrt(ds["forecast_predictive_variance"]),
                    f"lower{pct}": ds["forecast_lower"].sel(coverage=c, drop=True),
                    f"upper{pct}": ds["forecast_upper"].sel(coverage=c, drop=True),
                }
            )
            .to_dataframe()
            .reset_index()
            .rename(columns={"forecast_time": "time"})
        )
        fc.insert(0, "kind", "forecast")
        parts.append(fc)
    out = pd.concat(parts, ignore_index=True)
    keep = ["kind", "time", *sdims] + [k for k in out.columns if k not in ("kind", "time", *sdims)]
    out[[k for k in keep if k in out.columns]].to_csv(path, index=False, float_format="%.10g")


def _coverage_arg(values):
    from kalmanscan.timeseries.model import check_coverage

    try:
        return check_coverage(values, "--coverage")
    except ValueError as err:
        raise InputError(str(err)) from err


def _forecast_table(ds, series_dims, max_rows: int = 10) -> str:
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
            for i in range(min(math.prod(ds.sizes[d] for d in series_dims), 4))
        ]
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
            t = one["forecast_time"].values[h]
            t = str(t)[:19] if isinstance(t, np.datetime64) else f"{float(t):g}"
            m = float(one["forecast_mean"].values[h])
            se = math.sqrt(float(one["forecast_predictive_variance"].values[h]))
            lo = float(one["forecast_lower"].sel(coverage=c).values[h])
            hi = float(one["forecast_upper"].sel(coverage=c).values[h])
            lines.append(f"  {t:>20}  {m:12.4f}  {se:10.4f}  [{lo:.2f}, {hi:.2f}]")
    return "\n".join(lines)


# --- kalmanscan demo ------------------------------------------------------------------------------
def demo_main(argv=None) -> int:
    """``kalmanscan demo``: Nile local-level fit, filter, smoother, forecast; writes outputs."""
    p = _parser(
        "kalmanscan demo",
        "Fit the local-level model to the bundled Nile flows (1871-1970), filter, "
        "smooth and forecast; write a PNG, a netCDF file and a summary.",
    )
    p.add_argument("--out", default="kalmanscan-demo", help="output directory")
    p.add_argument("--forecast", type=int, default=10, metavar="N", help="forecast steps (years)")
    p.add_argument("--coverage", type=float, nargs="+", default=[0.5, 0.9], help="band coverages")
    args, code = _parse(p, sys.argv[1:] if argv is None else argv)
    if args is None:
        return code
    try:
        return _demo(args)
    except InputError as err:
        print(f"kalmanscan demo: {err}", file=sys.stderr)
        return EXIT_INPUT


def _demo(args) -> int:
    from kalmanscan.timeseries import fit_ou, load_nile

    coverage = _coverage_arg(args.coverage)
    if args.forecast < 0:
        raise InputError(f"--forecast: expected a number of steps >= 0, got {args.forecast}")
    years, flow = load_nile()
    t0 = time.perf_counter()
    fit = fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    ds = fit.to_dataset(coverage=coverage, forecast_steps=args.forecast or None, name="Nile flow")
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
def read_csv_series(path: str, time_col=None, value_cols=None, *, time_unit=None):
    """Read a CSV of series: ``(times [T], z [T, S], names [S], was_sorted)``, sorted by time.

    ``time_col=None`` uses the row number as time; ``value_cols=None`` takes every numeric column
    other than the time column. Empty cells (and NA/NaN) are missing values. Raises
    :class:`InputError` with a message naming the file, column, row and value for a bad file,
    missing column, unparseable time or
    non-numeric value. Rows are numbered as in a spreadsheet (the header is row 1).
    """
    import pandas as pd

    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a CSV file")
    try:
        df = pd.read_csv(path, comment="#", skipinitialspace=True)
    except pd.errors.EmptyDataError as err:
        raise InputError(
            f"{path}: the file is empty (expected a header row and data rows)"
        ) from err
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path}: cannot be read as CSV ({str(err).splitlines()[0]})") from err
    df.columns = [str(c).strip() for c in df.columns]
    if len(df) == 0:
        raise InputError(f"{path}: has a header ({', '.join(df.columns)}) but no data rows")
    cols = list(df.columns)
    for name, kind in ([(time_col, "--time-col")] if time_col is not None else []) + [
        (c, "--value-col") for c in value_cols or []
    ]:
        if name not in cols:
            raise InputError(f"{kind} {name!r}: no such column in {path}; columns are {cols}")
    if time_col is not None:
        times = _parse_times(df[time_col], path, time_col)
    else:
        times = np.arange(len(df), dtype=np.float64)
    if value_cols:
        names = list(value_cols)
        if time_col in names:
            raise InputError(f"--value-col {time_col!r}: that is the time column")
    else:
        names = [c for c in cols if c != time_col and pd.api.types.is_numeric_dtype(df[c])]
        if not names:
            raise InputError(
                f"{path}: no numeric value columns besides the time column; name them with "
                "--value-col "
                f"(columns are {cols})"
            )
    z = np.column_stack([_parse_values(df[c], path, c) for c in names])
    order = np.argsort(times, kind="stable")
    sorted_ = bool(np.all(order == np.arange(len(order))))
    if not sorted_:
        times, z = times[order], z[order]
    return times, z, names, sorted_


def _parse_times(col, path, name):
    import pandas as pd

    empty = col.isna()
    if empty.any():
        i = int(np.flatnonzero(empty.to_numpy())[0])
        raise InputError(f"{path}: column {name!r} has an empty time at row {i + 2}")
    if pd.api.types.is_numeric_dtype(col):
        return col.to_numpy(dtype=np.float64)
    text = col.astype(str).str.strip()
    parsed = pd.to_datetime(text, errors="coerce", format="mixed")
    bad = parsed.isna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            f"{path}: column {name!r} row {i + 2}: cannot parse {text.iloc[i]!r} as a time "
            "(expected numbers or dates like 2024-03-01 or 2024-03-01T12:30)"
        )
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    return parsed.to_numpy().astype("datetime64[ns]")


def _parse_values(col, path, name):
    import pandas as pd

    values = pd.to_numeric(col, errors="coerce")
    bad = values.isna() & col.notna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            f"{path}: column {name!r} row {i + 2}: {col.iloc[i]!r} is not a number "
            "(leave the cell empty or write NaN for a missing value)"
        )
    out = values.to_numpy(dtype=np.float64)
    if np.isinf(out).any():
        i = int(np.flatnonzero(np.isinf(out))[0])
        raise InputError(
            f"{path}: column {name!r} row {i + 2}: infinite value; expected a finite number or "
            "empty"
        )
    return out


def _fix_arg(items):
    from kalmanscan.timeseries.model import PARAMS

    fix = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in PARAMS:
            raise InputError(
                f"--fix: expected NAME=VALUE with NAME one of {list(PARAMS)}, got {item!r}"
            )
        try:
            fix[key] = float(value)
        except ValueError as err:
            raise InputError(f"--fix {key}: expected a number, got {value!r}") from err
    return fix


def filter_main(argv=None) -> int:
    """``kalmanscan filter data.csv ...``: filter/fit/forecast the series of a CSV."""
    p = _parser(
        "kalmanscan filter",
        "Filter and smooth the series of a CSV with an OU / local-level model "
        "(fitted by maximum likelihood with --fit), forecast, and write a PNG, a netCDF file and a "
        "summary.",
    )
    p.add_argument("csv", help="input CSV with a header row")
    p.add_argument(
        "--time-col", default=None, help="time column (numbers or dates); default: the row number"
    )
    p.add_argument(
        "--value-col",
        action="append",
        default=None,
        metavar="COL",
        help="value column (repeat for several series); default: all numeric columns",
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
    for name in ("theta", "sigma2", "mu", "obs-var"):
        p.add_argument(
            f"--{name}", type=float, default=None, help=f"{name.replace('-', '_')} when not fitting"
        )
    p.add_argument(
        "--time-unit", default=None, help="model time unit for dates (e.g. 1D, 1h); default 1D"
    )
    p.add_argument(
        "--forecast", type=int, default=0, metavar="N", help="forecast N typical steps ahead"
    )
    p.add_argument("--coverage", type=float, nargs="+", default=[0.5, 0.9], help="band coverages")
    p.add_argument("--out", default="kalmanscan-results", help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    args, code = _parse(p, sys.argv[1:] if argv is None else argv)
    if args is None:
        return code
    try:
        return _filter(args)
    except InputError as err:
        print(f"kalmanscan filter: {err}", file=sys.stderr)
        return EXIT_INPUT


def _filter(args) -> int:
    from kalmanscan.timeseries import OUModel, fit_ou
    from kalmanscan.timeseries.times import as_time_axis

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))  # noqa: E731
    coverage = _coverage_arg(args.coverage)
    if args.forecast < 0:
        raise InputError(f"--forecast: expected a number of steps >= 0, got {args.forecast}")
    given = {
        k: getattr(args, k)
        for k in ("theta", "sigma2", "mu", "obs_var")
        if getattr(args, k) is not None
    }
    if args.fit and given:
        raise InputError(
            f"--fit estimates the parameters; to hold some fixed use --fix (got {sorted(given)})"
        )
    if not args.fit and (args.fix or args.joint):
        raise InputError("--fix and --joint only apply with --fit")
    if not args.fit and not {"sigma2", "obs_var"} <= set(given):
        raise InputError(
            "give --fit, or the model parameters --sigma2 and --obs-var (optionally --theta, --mu)"
        )
    fix = _fix_arg(args.fix)
    times, z, names, was_sorted = read_csv_series(args.csv, args.time_col, args.value_col)
    T, S = z.shape
    try:
        ax = as_time_axis(times, T, args.time_unit if times.dtype.kind == "M" else None)
    except ValueError as err:
        raise InputError(str(err)) from err
    if args.time_unit is not None and not ax.is_datetime:
        log("note: --time-unit applies to dates only; numeric times are used as they are")
    log(
        f"read {args.csv}: {T} rows, {S} series ({', '.join(names)}), {int(np.isnan(z).sum())} "
        "missing values" + ("" if was_sorted else "; rows sorted by time")
    )
    time_unit = args.time_unit if ax.is_datetime else None
    t0 = time.perf_counter()
    if args.fit:
        n_obs = (~np.isnan(z)).sum(0)
        few = [f"{n!r} ({int(k)})" for n, k in zip(names, n_obs, strict=True) if k < 2]
        if few:
            raise InputError(
                "--fit: expected at least 2 observed values in every series; "
                f"too few in {', '.join(few)}"
            )
        fits = []
        if args.joint or S == 1:
            bar = Progress("fitting", 1, enabled=not args.quiet)
            fits.append(fit_ou(z, times, fix=fix, joint=args.joint, time_unit=time_unit))
            bar.update()
        else:
            block = max(1, math.ceil(S / 50))
            bar = Progress("fitting", S, enabled=not args.quiet)
            for s0 in range(0, S, block):
                fits.append(fit_ou(z[:, s0 : s0 + block], times, fix=fix, time_unit=time_unit))
                bar.update(min(block, S - s0))
        bar.close()
        fit = fits[0] if len(fits) == 1 else _merge_fits(fits)
        fit.series_labels = names
        model = fit.model
        fit_text = fit.summary()
    else:
        try:
            model = OUModel(time_unit=time_unit, **given)
        except (TypeError, ValueError) as err:
            raise InputError(str(err)) from err
        fit, fit_text = (
            None,
            "parameters given: " + ", ".join(f"{k}={v:g}" for k, v in model.params().items()),
        )
    bar = Progress("filtering", 1, enabled=not args.quiet)
    from kalmanscan import xarray as kx

    ds = kx.to_dataset(
        model,
        z,
        times,
        coverage=coverage,
        forecast_steps=args.forecast or None,
        series_coords={"series": names},
        fit=fit,
        name=os.path.basename(args.csv),
    )
    bar.update()
    bar.close()
    elapsed = time.perf_counter() - t0
    ll = np.atleast_1d(ds["loglik"].values)
    steps = np.diff(ax.t)
    irregular = steps.size > 0 and np.ptp(steps) > 1e-9 * max(np.abs(ax.t).max(), 1)
    spacing = "irregular" if irregular else "regular"
    summary = "\n".join(
        filter(
            None,
            [
                f"{args.csv}: {T} time steps "
                f"({spacing} "
                f"spacing{', time unit ' + ax.unit_name if ax.is_datetime else ''}), {S} series",
                fit_text,
                "log-likelihood per series: "
                + ", ".join(f"{n}={v:.4f}" for n, v in zip(names, ll, strict=False)),
                f"computed in {elapsed:.2f} s",
                _forecast_table(ds, ["series"]),
            ],
        )
    )
    files = _write_outputs(ds, args.out, "results", summary, title=os.path.basename(args.csv))
    print(summary)
    print("wrote " + ", ".join(files))
    return EXIT_OK


def _merge_fits(fits):
    """Concatenate separate fits of consecutive blocks of series (last axis)."""
    from kalmanscan.timeseries.fit import OUFit
    from kalmanscan.timeseries.model import PARAMS, OUModel

    def cat(values):
        return np.concatenate(
            [
                np.broadcast_to(np.asarray(v, dtype=np.float64), f.z.shape[1:])
                for v, f in zip(values, fits, strict=False)
            ]
        )

    params = {p: cat([f.params[p] for f in fits]) for p in PARAMS}
    first = fits[0]
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
    )
