"""``kalmanscan demo`` and ``kalmanscan filter``: time series with uncertainty bands from the shell.

- ``kalmanscan demo [--out DIR]``: the bundled Nile flows, local-level fit, filter, smoother and a
  10-step forecast; writes ``nile.png``, ``nile.nc``, ``nile.csv`` and ``summary.txt`` and prints
  the summary.
- ``kalmanscan filter data.csv --time-col t --value-col y [--value-col y2 ...] [--fit]
  [--forecast 10]
  --out results/``: the same for a CSV (several value columns = several series).

Both return 0 on success and 2 (with a message on stderr) for bad input. The CSV reader is
:mod:`kalmanscan.timeseries.csvfile`, the output files :mod:`kalmanscan.timeseries.outputs`.

Modules, by role: this one holds the entry points and the commands' options (:func:`demo_main`,
:func:`filter_main`); ``cli_args`` the options' shared parsing and checks, the exit status and
the progress bar; ``cli_commands`` the commands' bodies; ``cli_fit`` ``--fit`` over a CSV's series;
``cli_messages`` the summary's forecast table and the warnings. Their names are importable from
here as well.

Docs: docs/cli.md.
"""

from __future__ import annotations

import sys

from kalmanscan.timeseries.cli_args import (  # noqa: F401 - also this module's names before the split
    EXIT_INPUT,
    EXIT_OK,
    Progress,
    _add_coverage_option,
    _check_once,
    _coverage_arg,
    _fix_arg,
    _forecast_arg,
    _Once,
    _parse,
    _parser,
    _run,
    _version,
)
from kalmanscan.timeseries.cli_commands import (  # noqa: F401 - as above
    _READ_NOTES,
    _check_forecast_years,
    _demo,
    _filter,
)
from kalmanscan.timeseries.cli_fit import (  # noqa: F401 - as above
    _NAMED,
    _absorb_gross,
    _fit_all,
    _merge_fits,
    _merge_named,
    _name_series,
)
from kalmanscan.timeseries.cli_messages import (  # noqa: F401 - as above
    _NINES,
    _describe_duration,
    _forecast_table,
    _gross_warning,
    _units_warning,
)
from kalmanscan.timeseries.csvfile import _UTC_NOTE, InputError, _shorten, read_csv_series  # noqa: F401
from kalmanscan.timeseries.outputs import _iso_times, _output_paths, _write_outputs  # noqa: F401


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
        action=_Once,
        default="kalmanscan-demo",
        metavar="DIR",
        help="output directory (default: kalmanscan-demo)",
    )
    p.add_argument(
        "--forecast",
        action=_Once,
        default=10,
        metavar="N",
        help="forecast steps in years (default: 10)",
    )
    _add_coverage_option(p)
    args, code = _parse(p, sys.argv[1:] if argv is None else argv)
    if args is None:
        return code
    return _run("kalmanscan demo", _demo, args)


# --- kalmanscan filter ----------------------------------------------------------------------------
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
        "--time-col",
        action=_Once,
        default=None,
        help="time column (numbers or dates; default: the row number)",
    )
    p.add_argument(
        "--time-format",
        action=_Once,
        default=None,
        metavar="FMT",
        help="format of the dates in --time-col, e.g. %%d/%%m/%%Y or ISO8601, %%Y.%%m for months "
        "written 1950.01, %%Y.%%q for quarters written 1959.1 (default: detected; ambiguous dates "
        "are refused)",
    )
    p.add_argument(
        "--dayfirst",
        action="store_true",
        help="read ambiguous dates such as 03/04/1958 day first (3 April)",
    )
    p.add_argument(
        "--calendar",
        action=_Once,
        default=None,
        metavar="CAL",
        help="calendar of the dates in --time-col: a climate model's 360_day, noleap (365_day), "
        "all_leap (366_day) or julian, stepped in that calendar (needs cftime; default: the "
        "Gregorian calendar)",
    )
    p.add_argument(
        "--repeated-times",
        action=_Once,
        choices=("refuse", "keep"),
        default="refuse",
        help="rows that share a time (timestamps rounded to the second, say): refuse them "
        "(default, naming the rows), or keep each as an observation of the same state (a step "
        "of length 0; without --series-col)",
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
        action=_Once,
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
    p.add_argument(
        "--decimal",
        action=_Once,
        choices=(".", ","),
        default=None,
        metavar="MARK",
        help="the decimal mark of the value columns where the file leaves it open: '.' reads "
        "1.250 as 1.25; ',' reads 1,25 as 1.25 and a point between groups of three digits as a "
        "thousands separator (13.415 is 13415) (default: detected; a file separated by "
        "semicolons whose points are all followed by three digits is refused)",
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
            action=_Once,
            type=float,
            default=None,
            metavar="X",
            help=f"{name.replace('-', '_')} when not fitting{per}",
        )
    p.add_argument(
        "--time-unit",
        action=_Once,
        default=None,
        metavar="UNIT",
        help="model time unit for dates, e.g. 1D, 1h, 365.25D (default: 1D); theta and sigma2 "
        "are rates per this unit",
    )
    p.add_argument(
        "--forecast",
        action=_Once,
        default=0,
        metavar="N",
        help="forecast N typical steps ahead (default: 0)",
    )
    _add_coverage_option(p)
    p.add_argument(
        "--out",
        action=_Once,
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
