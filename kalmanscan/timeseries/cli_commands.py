"""The commands' bodies: ``kalmanscan demo`` and ``kalmanscan filter`` from their parsed
arguments to the output files and the printed summary.

Part of :mod:`kalmanscan.timeseries.cli`, whose entry points parse the arguments and run these;
it re-exports these names.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
import warnings

import numpy as np

from kalmanscan.timeseries.cli_args import (
    EXIT_OK,
    Progress,
    _check_once,
    _coverage_arg,
    _fix_arg,
    _forecast_arg,
)
from kalmanscan.timeseries.cli_fit import _fit_all
from kalmanscan.timeseries.cli_messages import _forecast_table, _gross_warning, _units_warning
from kalmanscan.timeseries.csvfile import _UTC_NOTE, InputError, read_csv_series
from kalmanscan.timeseries.outputs import _output_paths, _write_outputs


# --- kalmanscan demo ------------------------------------------------------------------------------
def _demo(args) -> int:
    from kalmanscan.timeseries import fit_ou, load_nile

    _check_once(args)
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
def _filter(args) -> int:
    from kalmanscan.timeseries import OUModel
    from kalmanscan.timeseries.result import _decimals
    from kalmanscan.timeseries.robust import gross_runs
    from kalmanscan.timeseries.times import as_time_axis

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))  # noqa: E731
    _check_once(args)
    twice = [c for i, c in enumerate(args.value_col or []) if c in args.value_col[:i]]
    if twice:
        raise InputError(
            f"--value-col {twice[0]!r}: given twice; name each value column once (each is a series)"
        )
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
    if args.repeated_times == "keep" and (args.time_col is None or args.series_col is not None):
        raise InputError(
            "--repeated-times keep applies to a --time-col of a wide table (one column a series), "
            + ("which is not given" if args.time_col is None else "not with --series-col")
        )
    if (args.time_format is not None or args.dayfirst or args.calendar) and args.time_col is None:
        raise InputError(
            "--time-format, --dayfirst and --calendar apply to --time-col, which is not given"
        )
    fix = _fix_arg(args.fix)
    _output_paths(args.out, ["results.png", "results.nc", "results.csv", "summary.txt"], [args.csv])
    notes: list[str] = []
    lines: list[int] = []  # the file line of each time step (a wide table), for the warnings
    times, z, names, was_sorted = read_csv_series(
        args.csv,
        args.time_col,
        args.value_col,
        time_format=args.time_format,
        dayfirst=True if args.dayfirst else None,
        calendar=args.calendar,
        notes=notes,
        series_col=args.series_col,
        missing=args.missing,
        repeated_times=args.repeated_times,
        decimal=args.decimal,
        file_lines=lines,
    )
    for note in notes:
        log(note)
    T, S = z.shape
    try:
        ax = as_time_axis(
            times,
            T,
            args.time_unit if times.dtype.kind in "MO" else None,  # (O: a model calendar's)
            name=f"{args.csv}: column {args.time_col!r}" if args.time_col else "times",
        )
    except ValueError as err:  # (named as the option is: --time-unit)
        raise InputError(re.sub(r"\btime_unit:", "--time-unit:", str(err))) from err
    if args.calendar is not None and not ax.is_datetime:  # (kept in summary.txt too)
        notes.append("note: --calendar applies to dates only; numeric times are used as they are")
        log(notes[-1])
    if args.time_unit is not None and not ax.is_datetime:  # (kept in summary.txt too)
        notes.append("note: --time-unit applies to dates only; numeric times are used as they are")
        log(notes[-1])
    # a long table (--series-col): a row a (time, series) pair, counted as the times and the
    # (time, series) cells with no value that the wide grid of them has
    rows, gaps = (f"{T} times", "missing values on that grid") if args.series_col else (
        f"{T} rows", "missing values")  # fmt: skip
    log(
        f"read {args.csv}: {rows}, {S} series ({', '.join(names)}), {int(np.isnan(z).sum())} "
        f"{gaps}" + ("" if was_sorted else "; rows sorted by time")
    )
    time_unit = args.time_unit if ax.is_datetime else None
    units = _units_warning(ax, given, given=not args.fit)
    if units and not args.fit:
        print(f"kalmanscan filter: {units}", file=sys.stderr)
    # gross runs (a -9999 code): said once, by the CLI, with the --missing remedy; with --fit
    # after the fit, which finds the same runs and whose warning of them the CLI's absorbs
    hit = None if args.robust else gross_runs(z)
    lines = lines if len(lines) == T else None
    gross = None if hit is None else _gross_warning(z, hit, names, ax, args.fit, lines=lines)
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
            gross = _gross_warning(z, hit, names, ax, True, effects, lines=lines)
            warnings.warn(gross, stacklevel=1)
        for message in later:
            warnings.warn(message, stacklevel=1)
        model = fit.model
        fit_text = fit.summary()
    else:
        try:
            model = OUModel(time_unit=time_unit, **given)
        except (TypeError, ValueError) as err:  # named as the options are
            text = re.sub(r"^(theta|sigma2|mu|obs_var|time_unit):", lambda m: "--" + m.group(
                1).replace("_", "-") + ":", str(err))  # fmt: skip
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
        for coord in (ds.attrs.get("time_dim", "time"), "forecast_time"):
            if coord in ds.coords:
                ds[coord].attrs["time_zone"] = "UTC"
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
                + ", ".join(f"{n}={_decimals(v)}" for n, v in zip(names[:20], ll, strict=False))
                + (f", ... {S - 20} more series in results.nc ('loglik')" if S > 20 else ""),
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
