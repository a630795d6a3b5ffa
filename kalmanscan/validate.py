"""``kalmanscan validate``: check kalmanscan against classic Kalman filters on this machine.

Runs the battery of :mod:`kalmanscan.validation` (filterpy, a dense joint-Gaussian oracle,
statsmodels' exact-diffuse local level on Nile, scipy's Van Loan discretization, and the regime
battery against an mpmath oracle) on every available backend in float64 and float32, prints the
worst relative error per truth, quantity, dtype and backend next to the tolerance it must meet,
and exits 1 when any row fails. Method and tolerances: docs/validation.md.

    kalmanscan validate --quick                  # about 1 min of CPU time (2-core x86)
    kalmanscan validate --csv v.csv --markdown v.md --figure error_vs_length.png
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from kalmanscan import validation

# every runner label of the battery (validation.battery.available_runners): the CPU ones, then
# the CUDA ones; which of them this machine has is decided at run time
RUNNERS = ("sequential", "torch", "native", "torch-cuda", "triton")
# the output flags: (flag, attribute, whether matplotlib writes it)
OUTPUTS = (
    ("--csv", "csv", False),
    ("--markdown", "markdown", False),
    ("--figure", "figure", True),
    ("--drift-figure", "drift_figure", True),
)


def _seed(text: str) -> int:
    """argparse type of ``--seed``: an integer >= 0 (numpy's seed sequences take no negatives)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _output_problem(path: str, figure: bool) -> str | None:
    """Why ``path`` cannot be written (None when it can), checked before the battery runs: its
    folder must exist and be writable, the path must not be a folder or a read-only file, and a
    figure's suffix must be a format matplotlib writes (none: PNG)."""
    if not path:
        return "expected a file path, got ''"
    if os.path.isdir(path):
        return f"expected a file path, got the folder {path!r}"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"expected a path in an existing folder, got {path!r} (no folder {folder!r})"
    try:  # os.access says yes to root on read-only mounts: try it
        if os.path.exists(path):
            open(path, "a").close()  # appends nothing, truncates nothing
        else:
            tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        return f"expected a writable path, got {path!r} ({exc.strerror or exc})"
    if figure:
        try:
            import matplotlib.figure
        except ModuleNotFoundError:
            return "needs matplotlib, not installed here (pip install 'kalmanscan[validation]')"
        suffix = os.path.splitext(path)[1].lstrip(".").lower()
        formats = matplotlib.figure.Figure().canvas.get_supported_filetypes()
        if suffix and suffix not in formats:
            return (
                f"expected a figure file ending in one of {', '.join(sorted(formats))} "
                f"(e.g. .png), got {path!r}"
            )
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kalmanscan validate",
        description="Check kalmanscan against filterpy, a dense joint-Gaussian oracle, "
        "statsmodels, scipy and an arbitrary-precision (mpmath) filter and smoother on the "
        "degenerate regimes where classic filters fail.",
    )
    p.add_argument("--quick", action="store_true", help="small battery (about 1 min of CPU time)")
    p.add_argument(
        "--seed", type=_seed, default=0, help="seed of the random models, >= 0 (default 0)"
    )
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument(
        "--markdown",
        metavar="PATH",
        help="write the table (and the error-growth table) as markdown",
    )
    p.add_argument("--figure", metavar="PATH", help="write a PNG of error against sequence length")
    p.add_argument(
        "--drift-figure",
        metavar="PATH",
        help="write a PNG of the per-step float32 error on the model that drifts most",
    )
    p.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help=f"only these runners ({', '.join(RUNNERS)}; the CUDA ones on a GPU); repeatable",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def _versions() -> str:
    import importlib.metadata as md

    import torch

    import kalmanscan

    parts = [f"kalmanscan {kalmanscan.__version__}"]
    for n in ("torch", "numpy", "scipy", "filterpy", "statsmodels"):
        try:
            parts.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            parts.append(f"{n} ?")
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return ", ".join(parts) + f"; {dev}"


def _missing_truths() -> list[str]:
    """The classic filters the battery compares against that are not installed here."""
    import importlib.util

    return [n for n in ("filterpy", "scipy", "statsmodels") if importlib.util.find_spec(n) is None]


def _regime_rows(quick: bool, runners, say) -> list[dict]:
    """The regime battery against the mpmath oracle (``validation/regimes.py``: a few regimes
    that each broke a backend by default, all of them without ``--quick``) and the
    log-likelihood conventions (``validation/conventions.py``: kalmanscan minus the documented
    offset against statsmodels' and KFAS's values). Without mpmath a row and a line on stderr
    say they were skipped and how to install it; the exit status then reflects the other truths
    only."""
    try:
        import mpmath  # noqa: F401
    except ModuleNotFoundError:
        print(
            "kalmanscan validate: mpmath is not installed, so the regime battery and the "
            "convention checks are skipped (pip install mpmath)",
            file=sys.stderr,
        )
        return [
            dict(
                truth="mpmath oracle (regimes)",
                quantity="(not run: pip install mpmath)",
                dtype="-",
                backend="-",
                max_rel_err=0.0,
                tol=float("inf"),
                n_models=0,
                worst_model="mpmath is not installed",
            )
        ]
    from kalmanscan.validation import conventions, regimes

    labels = [r.label for r in runners]
    say("regimes against the mpmath oracle" + (" (quick subset)" if quick else ""))
    # the sequential loop skips the regimes longer than the scalar battery lets it run
    cap = (
        validation.BatteryConfig.quick_config() if quick else validation.BatteryConfig.full_config()
    )
    rows = regimes.validate_rows(
        full=not quick, backends=labels, progress=say, sequential_max_T=cap.sequential_max_T
    )
    say("log-likelihood conventions: statsmodels (Durbin & Koopman) and KFAS")
    cpu = [r.label for r in runners if r.device == "cpu"]
    dense = [b for b in conventions.available_dense_backends() if b in labels]
    return rows + conventions.convention_rows(scalar_backends=cpu, dense_backends=dense)


def _write_outputs(args, res, runners) -> None:
    report = validation.report
    if args.csv:
        report.write_csv(res.rows, args.csv)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown_table(res.rows) + "\n\n")
            f.write("Float32 filtered-variance error against length (truth: filterpy):\n\n")
            f.write(report.growth_table(res.records) + "\n")
    if args.figure:
        report.plot_error_vs_length(res.records, args.figure)
    if args.drift_figure:
        report.plot_drift_from_records(res.records, runners, args.drift_figure, seed=args.seed)


def _cpu_parts(timings: dict, regimes: float) -> str:
    """The battery's process CPU seconds by part, largest first, then the regime battery's.

    >>> _cpu_parts({"filterpy": 2.0, "torch": 0.5, "total": 3.0, "batches": []}, 1.0)
    'filterpy 2.0 s, torch 0.5 s, other 0.5 s; regimes and conventions 1.0 s'
    """
    parts = {k: v for k, v in timings.items() if k not in ("total", "batches")}
    other = timings.get("total", 0.0) - sum(parts.values())
    text = [f"{k} {v:.1f} s" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])]
    return ", ".join([*text, f"other {max(other, 0.0):.1f} s"]) + (
        f"; regimes and conventions {regimes:.1f} s"
    )


def main(argv: list[str]) -> int:
    """Run the validation battery; returns 0 when every row passes, 1 otherwise (2: bad usage).

    >>> main(["--help"])  # doctest: +ELLIPSIS
    usage: kalmanscan validate ...
    0
    """
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # --help or a usage error
        return int(exc.code or 0)
    available_runners, report, run_battery = (
        validation.available_runners,
        validation.report,
        validation.run_battery,
    )

    for flag, attr, figure in OUTPUTS:
        path = getattr(args, attr)
        problem = None if path is None else _output_problem(path, figure)
        if problem:
            print(f"kalmanscan validate: {flag}: {problem}", file=sys.stderr)
            return 2
    missing = _missing_truths()
    if missing:
        print(
            f"kalmanscan validate: needs {', '.join(missing)}, not installed here "
            "(pip install 'kalmanscan[validation]')",
            file=sys.stderr,
        )
        return 2
    runners = available_runners()
    if args.backend:
        known = {r.label for r in runners}
        unknown = sorted(set(args.backend) - known)
        if unknown:
            print(
                f"kalmanscan validate: --backend: expected some of {sorted(known)} here, "
                f"got {unknown}",
                file=sys.stderr,
            )
            return 2
        runners = [r for r in runners if r.label in args.backend]
    say = (
        (lambda msg: None)
        if args.quiet
        else (lambda msg: print(f"  .. {msg}", file=sys.stderr, flush=True))
    )
    mode = "quick" if args.quick else "full"
    print(f"kalmanscan validate ({mode}, seed {args.seed}): {_versions()}")
    print(f"runners: {', '.join(r.label for r in runners)}")
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_battery(quick=args.quick, seed=args.seed, runners=runners, progress=say)
    c1 = time.process_time()
    res.rows += _regime_rows(args.quick, runners, say)
    cpu = time.process_time() - c0
    print(report.format_table(res.rows))
    failed = [r for r in res.rows if not report.row_passes(r)]
    for r in report.sort_rows(failed):
        err = r["max_rel_err"]
        what = "inf (a backend raised)" if err == float("inf") else f"{err:.3g} > {r['tol']:.0e}"
        print(
            f"FAIL {r['truth']} / {r['quantity']} / {r['dtype']} / {r['backend']}: "
            f"{what} (worst model: {r.get('worst_model', '?')})"
        )
    unwritten = False
    try:
        _write_outputs(args, res, runners)
    except OSError as exc:  # checked before the run; this is the folder changing meanwhile
        print(f"kalmanscan validate: could not write the results: {exc}", file=sys.stderr)
        unwritten = True
    n_models = sum(r["n_models"] for r in res.rows)
    status = "all rows pass" if not failed else f"{len(failed)} of {len(res.rows)} rows FAIL"
    print(f"CPU time by part: {_cpu_parts(res.timings, time.process_time() - c1)}")
    print(
        f"{len(res.rows)} rows, {n_models} comparisons, {time.perf_counter() - t0:.1f} s "
        f"(CPU {cpu:.1f} s): {status}"
    )
    return 1 if failed else (2 if unwritten else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
