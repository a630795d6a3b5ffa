"""The commands' shared shell plumbing: their options' parsing and checks (``--version``,
``--coverage``, ``--forecast``, ``--fix``), a command's body run with its exit status (bad input
and warnings as one line each on stderr), and the progress bar.

Part of :mod:`kalmanscan.timeseries.cli`, which re-exports these names.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import numpy as np

from kalmanscan.timeseries.csvfile import InputError

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


class _Once(argparse.Action):
    """Store an option's value, noting a second, different value of it (``--time-col a
    --time-col b``, where argparse would keep the last silently) for :func:`_check_once` to
    refuse."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given", {})
        if self.dest in seen and seen[self.dest] != values:
            namespace.__dict__.setdefault("_repeated", []).append(
                (self.option_strings[0], seen[self.dest], values)
            )
        seen[self.dest] = values
        setattr(namespace, self.dest, values)


def _check_once(args) -> None:
    """Refuse an option given twice with different values (see :class:`_Once`)."""
    for option, first, second in getattr(args, "_repeated", [])[:1]:
        show = lambda v: " ".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
        raise InputError(
            f"{option}: given twice ({option} {show(first)} and {option} {show(second)}); give "
            "it once"
        )


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
        action=_Once,
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


def _forecast_arg(n) -> int | None:
    """``--forecast``'s number of steps (its text, or an int), refused where it is no whole
    number from 0 to the limit; ``None`` for 0."""
    from kalmanscan.timeseries.times import MAX_FORECAST_STEPS

    if isinstance(n, str):
        try:
            n = int(n.strip())
        except ValueError as err:
            raise InputError(
                f"--forecast: expected a number of steps from 0 to {MAX_FORECAST_STEPS}, got {n!r}"
            ) from err
    if n < 0 or n > MAX_FORECAST_STEPS:
        raise InputError(
            f"--forecast: expected a number of steps from 0 to {MAX_FORECAST_STEPS}, got {n}"
        )
    return n or None


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
        if key in fix and fix[key] != v:
            raise InputError(
                f"--fix {key}: given twice ({key}={fix[key]:g} and {key}={v:g}); give it once"
            )
        fix[key] = v
    if len(fix) == len(PARAMS):
        raise InputError(
            "--fix: every parameter is fixed, nothing to fit; give them without --fit "
            "(--theta, --sigma2, --mu, --obs-var)"
        )
    return fix
