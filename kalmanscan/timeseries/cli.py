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
import re
import shlex
import sys
import tempfile
import time
import warnings

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


def _output_paths(out_dir: str, names, inputs=()) -> list[str]:
    """Paths of ``names`` in ``out_dir``, after checking that writing them is safe.

    Refuses (:class:`InputError`) an ``out_dir`` that is an existing file, an output name that is
    a directory, and any output that resolves to an input file (by path or by inode, so symbolic
    and hard links count): kalmanscan never writes over its input.
    """
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"--out {out_dir!r}: exists and is not a directory")
    paths = [os.path.join(out_dir, n) for n in names]
    real_inputs = [(p, os.path.realpath(p)) for p in inputs if os.path.exists(p)]
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            raise InputError(f"--out {out_dir!r}: {path} is a directory, expected a file name")
        for given, real in real_inputs:
            same = os.path.realpath(path) == real
            if not same and os.path.exists(path):
                try:
                    same = os.path.samefile(path, given)
                except OSError:
                    same = False
            if same:
                raise InputError(
                    f"--out {out_dir!r}: writing {os.path.basename(path)} would overwrite the "
                    f"input {given}; choose another --out directory"
                )
    return paths


def _replace_into(path: str, write) -> None:
    """``write(tmp)`` a file next to ``path``, then rename it onto ``path``.

    The rename replaces a symbolic link at ``path`` instead of following it, so nothing is
    written outside the output directory, and an interrupted run leaves no half-written file.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path), suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # the permissions any new file gets (mkstemp's are the owner's alone): read the umask
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_outputs(
    ds,
    out_dir: str,
    stem: str,
    summary: str,
    *,
    title: str,
    max_series: int = 4,
    ylabel=None,
    inputs=(),
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.plot import plot_overview
    from kalmanscan.xarray import netcdf_engine, save_netcdf

    png, nc, csv, txt = _output_paths(
        out_dir, [stem + ".png", stem + ".nc", stem + ".csv", "summary.txt"], inputs
    )
    try:
        engine = os.environ.get("KALMANSCAN_NETCDF_ENGINE") or netcdf_engine()
    except ImportError as err:
        raise InputError(str(err)) from err
    os.makedirs(out_dir, exist_ok=True)
    _replace_into(nc, lambda tmp: save_netcdf(ds, tmp, engine=engine))
    axes = plot_overview(ds, max_series=max_series)
    axes[0].figure.suptitle(title)
    if ylabel:
        for ax in axes[:-1]:
            ax.set_ylabel(ylabel)
    _replace_into(png, lambda tmp: axes[0].figure.savefig(tmp, dpi=110, format="png"))
    plt.close(axes[0].figure)

    def text(tmp):
        with open(tmp, "w") as fh:
            fh.write(summary + "\n")

    _replace_into(txt, text)
    _replace_into(csv, lambda tmp: _write_csv(ds, tmp))
    return [png, nc, csv, txt]


def _iso_times(t: np.ndarray, with_time: bool = False) -> list[str]:
    """ISO 8601 text of datetimes at the coarsest exact unit, four-digit years always (pandas'
    own writer drops the zero padding of years before 1000 in some versions, which ISO readers
    then refuse).

    >>> t = np.array(["0548-08-01", "1999-01-02"], dtype="datetime64[s]")
    >>> _iso_times(t)
    ['0548-08-01', '1999-01-02']
    >>> _iso_times(np.array(["1999-01-02T12:00:00.5"], dtype="datetime64[ns]"))
    ['1999-01-02 12:00:00.500']
    """
    unit = "ns"
    for u in ("s", "ms", "us") if with_time else ("D", "s", "ms", "us"):
        if (t == t.astype(f"datetime64[{u}]")).all():
            unit = u
            break
    return [x.replace("T", " ") for x in np.datetime_as_string(t, unit=unit)]


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
    if "outlier" in ds:  # the input value, and whether --robust screened it out
        cols["observed"] = ds["observed"].where(~ds["outlier"], ds["outlier_value"])
        cols["outlier"] = ds["outlier"]
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
    if out["time"].dtype.kind == "f":  # times exactly as read (shortest round-trip text)
        out["time"] = [
            str(int(t)) if float(t).is_integer() and abs(t) < 2.0**53 else repr(float(t))
            for t in out["time"]
        ]
    elif out["time"].dtype.kind == "M":
        zone = "Z" if ds[tdim].attrs.get("time_zone") == "UTC" else ""
        # a zone only with a time of day: 1958-03-29 00:00:00Z (ISO 8601 has no date with Z)
        out["time"] = [t + zone for t in _iso_times(out["time"].to_numpy(), with_time=bool(zone))]
    keep = ["kind", "time", *sdims] + [k for k in out.columns if k not in ("kind", "time", *sdims)]
    with open(path, "w", newline="") as fh:
        fh.write(_csv_text(out[[k for k in keep if k in out.columns]]))


def _csv_field(x) -> str:
    """A text field as a CSV writer quotes it: in double quotes (doubled inside) where it holds a
    comma, a quote or a line end."""
    return '"' + x.replace('"', '""') + '"' if any(c in x for c in ',"\r\n') else x


def _csv_text(frame) -> str:
    """``frame.to_csv(index=False, float_format="%.10g")``, the same text, faster: pandas'
    writer spends most of its time in per-chunk Python formatting (30 s against 13 s here for 2
    million rows of 9 float and 3 text columns of every magnitude). Floats as ``%.10g``, NaN
    (and None) as empty fields, text quoted where needed.

    >>> import pandas as pd
    >>> f = pd.DataFrame({"s": ["a", 'b,"c"'], "x": [0.1 + 0.2, float("nan")], "k": [True, False]})
    >>> _csv_text(f) == f.to_csv(index=False, float_format="%.10g")
    True
    """
    columns = []
    for name in frame.columns:
        col = frame[name]
        if col.dtype.kind == "f":
            values = col.to_numpy(dtype=np.float64).tolist()
            columns.append(["" if v != v else "%.10g" % v for v in values])  # noqa: UP031
        elif col.dtype.kind in "biu":
            columns.append([str(v) for v in col.tolist()])
        else:
            values = [str(v) for v in col.astype(object).where(col.notna(), "").tolist()]
            joined = "\x00".join(values)  # one scan for a field that needs quotes
            if any(c in joined for c in ',"\r\n'):
                values = [_csv_field(v) for v in values]
            columns.append(values)
    header = ",".join(_csv_field(str(c)) for c in frame.columns)
    return "\n".join([header, *map(",".join, zip(*columns, strict=True))]) + "\n"


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
_SEPARATORS = (",", ";", "\t", "|")
_SEP_NAMES = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "vertical bars"}
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")


_SEP_HINT = re.compile(r"^sep=(.)\s*$")  # Excel's first line naming the separator


_BLOCK = 1 << 20  # bytes read at a time: no copy of a large file in memory
# a line start (after a \n) whose first character other than ASCII spaces is #, a line end or a
# non-ASCII byte (maybe a Unicode space): a comment or blank line, or a line to decode and see
_MAYBE_SKIPPED = re.compile(rb"\n[ \t\x0b\x0c\x1c-\x1f]*(?=[#\r\n\x80-\xff]|\Z)")


def _scan_file(path: str) -> tuple[str, list[int], list[int] | range]:
    """``(encoding, comments, rows)`` of a CSV in one pass over its bytes.

    ``encoding``: ``utf-16`` after its byte-order mark (Excel's "Unicode text"), ``utf-8`` (a
    byte-order mark is skipped), else ``cp1252`` where the file is not UTF-8 but is
    Windows-1252, which spreadsheets on Windows write; ``utf-8`` where it is neither (the reader
    then names the undecodable byte). A workbook or other binary file (a NUL byte anywhere) is
    refused. ``comments`` and ``rows`` are :func:`_scan_lines`'s, found in the bytes: the lines
    it would decode and strip are those that start with ASCII spaces and then ``#``, a line end
    or a non-ASCII byte, decoded here alone. A UTF-16 file, or one with lines ended by a lone
    ``\r`` (old Macs), is scanned by :func:`_scan_lines`, the reference this pass is tested
    against."""
    import codecs

    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith((b"PK\x03\x04", b"\xd0\xcf\x11\xe0")):
        raise InputError(
            f"{path}: is a spreadsheet workbook (.xlsx, .xls or .ods), not a CSV; save the sheet "
            "as CSV first"
        )
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ("utf-16", *_scan_lines(path, "utf-16"))
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    utf8, lone_cr = True, False
    maybe = []  # (0-based line, its bytes)
    lines = 0  # lines before the chunk
    carry: list[bytes] = []  # the bytes after the last line end read
    with open(path, "rb") as fh:
        while True:
            block = fh.read(_BLOCK)
            if b"\x00" in block:
                raise InputError(
                    f"{path}: is a binary file (it holds NUL bytes), expected a CSV text file"
                )
            # (an ASCII block is UTF-8, unless it cuts a character begun before it)
            if utf8 and (not block.isascii() or decoder.getstate()[0]):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError:
                    utf8 = False
            cut = block.rfind(b"\n") + 1 if block else len(block)
            if block and cut == 0:  # no line end in the block: a long line goes on
                carry.append(block)
                continue
            chunk = b"".join([*carry, block[:cut]])
            carry = [block[cut:]]
            if chunk:
                if b"\r" in chunk and chunk.count(b"\r") != chunk.count(b"\r\n"):
                    lone_cr = True
                at, seen = 0, 0  # line ends before chunk[at]
                for m in _MAYBE_SKIPPED.finditer(b"\n" + chunk):
                    start = m.start()  # (in chunk, where its line starts)
                    if start == len(chunk):  # (after the chunk's last line end: no line)
                        break
                    seen += chunk.count(b"\n", at, start)
                    at = start
                    stop = chunk.find(b"\n", start)
                    maybe.append((lines + seen, chunk[start : stop if stop >= 0 else len(chunk)]))
                lines += chunk.count(b"\n") + (not chunk.endswith(b"\n"))
            if not block:
                break
    if utf8:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    encoding = "utf-8"
    if not utf8:  # (a second pass, for files that are not UTF-8 only)
        decoder = codecs.getincrementaldecoder("cp1252")()
        try:
            with open(path, "rb") as fh:
                while block := fh.read(_BLOCK):
                    decoder.decode(block)
            encoding = "cp1252"
        except UnicodeDecodeError:
            pass
    if lone_cr:
        return (encoding, *_scan_lines(path, encoding))
    comments, blank = [], []
    for i, raw in maybe:
        text = raw.decode(encoding, errors="replace").strip()
        if text.startswith("#"):
            comments.append(i)
        elif not text:
            blank.append(i)
    if not comments and not blank:
        return encoding, comments, range(1, lines + 1)  # (indexed and sliced as the list)
    skipped = np.array(sorted(comments + blank), dtype=np.int64)
    return encoding, comments, np.delete(np.arange(1, lines + 1), skipped).tolist()


def _separator(path: str, encoding: str = "utf-8") -> tuple[str, int | None]:
    """The field separator of a CSV, and the 0-based line of Excel's ``sep=;`` naming it (for
    the reader to skip) or None. Without that line, of ``, ; tab |`` the one its header line
    (the first line that is not a comment or blank) holds most often among those the first data
    line holds as often (a ``|`` inside a column name does not count); commas when none is more
    frequent."""
    try:
        with open(path, encoding=encoding, errors="replace") as fh:
            lines = ((i, ln.lstrip("\ufeff")) for i, ln in enumerate(fh))
            lines = ((i, ln) for i, ln in lines if ln.strip() and not ln.lstrip().startswith("#"))
            (at, header), data = next(lines, (None, "")), next(lines, (None, None))[1]
    except OSError:
        return ",", None
    hint = _SEP_HINT.match(header.strip("\r\n"))
    if hint:
        return hint.group(1), at
    counts = [_splits(header, c) for c in _SEPARATORS]
    if data is not None:  # a separator splits the data line as it splits the header
        counts = [
            n if _splits(data, c) == n else 0 for n, c in zip(counts, _SEPARATORS, strict=True)
        ]
    return (_SEPARATORS[counts.index(max(counts))] if max(counts) > counts[0] else ","), None


def _splits(line: str, sep: str) -> int:
    """How many times ``sep`` splits a CSV line, outside quoted fields."""
    import csv

    try:
        return len(next(csv.reader([line.strip("\r\n")], delimiter=sep))) - 1
    except (csv.Error, StopIteration):
        return line.count(sep)


def _decimal_commas(df, skip: tuple, path: str = "", row=None) -> list[str]:
    """Columns of ``df`` (text) written with a decimal comma (``12,5``): some cell is no number
    as written but is one with its comma read as a point, and no cell holds a point. Rewritten
    in place with points; their names returned. Only for files not separated by commas.

    A column whose every comma is followed by three digits (``2,120``) reads as thousands
    (2120) as well as decimals (2.12): refused, naming both readings."""
    import pandas as pd

    row = row or (lambda i: i + 2)
    found = []
    for c in df.columns:
        if c in skip:  # the time and series-name columns
            continue
        text = df[c].where(df[c].isna(), df[c].astype(str).str.strip())
        given = text.notna() & (text != "")
        if not given.any() or text[given].str.contains(".", regex=False).any():
            continue
        comma = given & text.str.contains(",", regex=False)
        if not comma.any():
            continue
        if text[comma].str.fullmatch(r"[+-]?\d{1,3}(,\d{3})+").all():
            i = int(np.flatnonzero(comma.to_numpy())[0])
            cell = text.iloc[i]
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {cell!r} reads as "
                f"{cell.replace(',', '')} (a thousands separator) and as "
                f"{cell.replace(',', '.', 1)} (a decimal comma), and every comma in the column "
                "is followed by three digits; write the numbers without thousands separators "
                "(or with a decimal point)"
            )
        swapped = text.where(~given, text.str.replace(",", ".", n=1, regex=False))
        before = pd.to_numeric(text.where(given), errors="coerce").notna()
        after = pd.to_numeric(swapped.where(given), errors="coerce").notna()
        if after.sum() > before.sum():  # (a cell that is no number either way is named later)
            df[c] = swapped
            found.append(c)
    return found


def _scan_lines(path: str, encoding: str = "utf-8") -> tuple[list[int], list[int]]:
    """``(comments, rows)``: the 0-based lines that are comments (their first character other
    than a space is ``#``: a ``#`` later in a line, as in a column name ``GDP #1`` or Excel's
    ``#N/A``, is text) for the reader to skip, and the 1-based line of every other line that is
    not blank, so messages name the line a user sees in an editor or spreadsheet. Line by line
    in text mode: the reference of :func:`_scan_file`, and its pass for UTF-16 and lone-``\\r``
    files."""
    comments, rows = [], []
    try:
        with open(path, encoding=encoding, errors="replace") as fh:
            for i, line in enumerate(fh):
                text = line.strip()
                if text.startswith("#"):
                    comments.append(i)
                elif text:
                    rows.append(i + 1)
    except OSError:
        return [], []
    return comments, rows


def _check_fields(
    path: str, encoding: str, sep: str, lines: list[int], n: int = 50
) -> tuple[list[str] | None, int]:
    """``(names, widest)``: the header's column names as written (before pandas renames
    repeated names: ``rate``, ``rate.1``; ``None`` where it cannot be read), and, compared with
    the first ``n`` data rows' fields, the widest row's field count where some rows hold fields
    after the header's, empty in some rows (trailing separators, flags now and then: read as
    unnamed columns), else 0. Refuses a file whose every row has more fields than the header
    holds names, all filled (a column without a name, as R's row names; pandas would take the
    first column as an index and shift the others); a header of one field before wider rows is
    named as a title line."""
    import csv

    if not lines:
        return None, 0
    want = set(lines[: n + 1])
    rows = {}
    try:
        with open(path, encoding=encoding, errors="replace", newline="") as fh:
            for i, text in enumerate(fh, 1):
                if i in want:
                    rows[i] = next(csv.reader([text.lstrip("\ufeff")], delimiter=sep,
                                              skipinitialspace=True))  # fmt: skip
                if i >= lines[min(n, len(lines) - 1)]:
                    break
    except (OSError, csv.Error, StopIteration):
        return None, 0
    header = rows.get(lines[0])
    if header is None:
        return None, 0
    names = [f.strip() for f in header]
    extra = [(i, f) for i, f in rows.items() if i != lines[0] and len(f) > len(header)]
    if not extra:
        return names, 0
    data = [f for i, f in rows.items() if i != lines[0]]
    filled = [bool("".join(f[len(header) :]).strip()) for _, f in extra]
    if len(extra) < len(data) or not all(filled):
        # some rows end where the header does, or with empty fields: trailing separators, or
        # flags now and then (read as unnamed columns), not a shifted header
        return names, max(len(f) for _, f in extra)
    i, f = extra[0]
    if len(header) == 1:
        raise InputError(
            f"{path}: row {i} has {len(f)} fields but row {lines[0]}, taken as the header, has "
            f"one ({header[0]!r}): lines before the header (a title or notes)? remove them or "
            "start them with #"
        )
    raise InputError(
        f"{path}: row {i} has {len(f)} fields but the header (row {lines[0]}) names {len(header)}: "
        "every column needs a name in the header (R's write.table writes row names without one: "
        "use write.csv, or row.names = FALSE)"
    )


def _missing_markers(markers) -> tuple[tuple[str, ...], dict[float, str]]:
    """``--missing``'s markers as ``(texts, numbers)``: a marker that reads as a finite number
    (``-9999``, ``-99.9``) is matched by value (``numbers``: ``{value: marker}``), any other by
    its exact text (``texts``), both after stripping spaces. Refuses an empty marker and two
    markers of one value."""
    texts, numbers = [], {}
    for given in markers or ():
        if not isinstance(given, str):
            raise InputError(f"--missing: expected the text of a cell, got {given!r}")
        marker = given.strip()
        if not marker:
            raise InputError(
                f"--missing {given!r}: expected the text of a cell to read as missing (empty "
                "cells are missing already)"
            )
        try:
            value = float(marker)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # text, and NaN, inf (read as written, never by value)
            if marker not in texts:
                texts.append(marker)
            continue
        if value in numbers and numbers[value] != marker:
            raise InputError(
                f"--missing {marker}: the same number as --missing {numbers[value]} (numbers "
                "are matched by value); give it once"
            )
        numbers[value] = marker
    return tuple(texts), numbers


def _missing_notes(markers, counts: dict, used: list) -> list[str]:
    """The reading notes of ``--missing``: how many cells of the value columns ``used`` each
    marker made missing, and in which columns."""
    texts, numbers = markers
    notes = []
    for marker in [*texts, *numbers.values()]:
        where = {c: k for c, k in counts.get(marker, {}).items() if c in used}
        shown = marker if marker in numbers.values() else repr(marker)
        how = ""
        if marker in numbers.values():  # other spellings of the number: -9999.0 for -9999
            value = float(marker)
            plain = f"{value:.15g}"
            spellings = [plain, np.format_float_positional(value, trim="-")]
            if "e" not in plain:
                spellings.append(plain + ("0" if "." in plain else ".0"))
            other = list(dict.fromkeys(t for t in spellings if t != marker and len(t) <= 20))[:2]
            how = f" (matched by value: {' and '.join(other)} count{'s' * (len(other) == 1)} too)"
        if not where:
            notes.append(f"note: --missing {shown}: no cell of the value columns holds it{how}")
            continue
        total = sum(where.values())
        cols = ", ".join(f"{c!r}" + (f" ({k})" if len(where) > 1 else "") for c, k in where.items())
        notes.append(
            f"note: --missing {shown}: {total} cell{'s' if total != 1 else ''} read as missing"
            f"{how}, in column{'s' if len(where) > 1 else ''} {_shorten(cols)}"
        )
    return notes


# (a note of read_csv_series; the command then marks its outputs' times as UTC)
_UTC_NOTE = "gives UTC offsets: the times are converted to UTC (results.csv marks them with Z)"


def read_csv_series(
    path: str,
    time_col=None,
    value_cols=None,
    *,
    time_unit=None,
    time_format=None,
    dayfirst=None,
    notes=None,
    series_col=None,
    missing=(),
):
    """Read a CSV of series: ``(times [T], z [T, S], names [S], was_sorted)``, sorted by time.

    ``series_col`` reads a long (tidy) table: that column names each row's series, and each
    value column of each named series becomes a series (``name`` with one value column, else
    ``name/column``) over the union of the times, missing where that series has no row. A
    series with two rows at one time is refused, naming the rows.

    ``time_col=None`` uses the row number as time; ``value_cols=None`` takes every column other
    than the time column that holds numbers (a column with no number at all, e.g. labels, is
    skipped with a note appended to ``notes``; a column of numbers with a non-number in it is an
    error). Empty cells (and NA/NaN) are missing values, and so are the value cells that
    ``missing`` names (``--missing``: a text matched exactly after stripping spaces, a number by
    value; the count per marker is a note). A time column is numeric when most of its
    cells are numbers, else dates read with one format (see
    :func:`kalmanscan.timeseries.times.parse_datetime_strings`; ``time_format``/``dayfirst``
    decide ambiguous dates). Duplicate times are refused, naming the rows. Raises
    :class:`InputError` with a message naming the file, column, row and value. Rows are numbered
    as in a spreadsheet (the header is row 1; comment lines count).
    """
    import pandas as pd

    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a CSV file")
    markers = _missing_markers(missing)
    encoding, comments, lines = _scan_file(path)
    sep, hint_line = _separator(path, encoding)
    hinted = hint_line is not None
    if hinted:
        lines = [i for i in lines if i != hint_line + 1]
    skip = sorted(comments + ([hint_line] if hinted else []))
    written, widest = _check_fields(path, encoding, sep, lines)
    names = None
    if widest:  # rows with unnamed trailing fields: read as unnamed columns (an empty one is
        # skipped below with a note, one with values is named in a note), none dropped
        names = written + [f"Unnamed: {j}" for j in range(len(written), widest)]
    try:
        df = pd.read_csv(
            path,
            sep=sep,
            skipinitialspace=True,
            dtype=str,
            encoding=encoding,
            skiprows=skip or None,
            # cells are read as written: a series named NA (Namibia) stays a name; the missing
            # values are the empty cells and NA / NaN in value columns (_parse_values)
            keep_default_na=False,
            # never the first column as an index (pandas' guess where rows have a field more)
            index_col=False,
            **({"names": names, "header": 0} if names else {}),
        )
    except pd.errors.EmptyDataError as err:
        raise InputError(
            f"{path}: the file is empty (expected a header row and data rows)"
        ) from err
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        text = str(err).splitlines()[0]
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text)
        if m:  # the header is not the widest line: lines before it, or a row run over
            text = (
                f"line {m[2]} has {m[3]} fields where the lines before it have {m[1]}: lines "
                "before the header (a title or notes)? remove them or start them with #"
            )
        raise InputError(f"{path}: cannot be read as CSV ({text})") from err
    df.columns = [str(c).strip() for c in df.columns]
    if len(df) == 0:
        raise InputError(f"{path}: has a header ({', '.join(df.columns)}) but no data rows")
    if len(lines) != len(df) + 1:  # (quoted fields over several lines)
        lines = None
    if written and len(written) == len(df.columns) and len(set(written)) != len(written):
        # (columns without a name are named Unnamed: k, and empty ones are skipped later)
        dup = sorted({c for c in written if c and written.count(c) > 1})
    else:
        dup = []
    if dup:
        raise InputError(f"{path}: duplicate column names {dup}; give each column its own name")
    if notes is not None:
        if encoding == "cp1252":
            notes.append(f"note: {path}: not UTF-8; read as Windows-1252 (cp1252)")
        if sep != "," or hinted:
            said = f"the first line's 'sep={sep}'" if hinted else "the header"
            notes.append(
                f"note: {path}: fields separated by {_SEP_NAMES.get(sep, repr(sep))} ({said})"
            )

    def row(i: int) -> int:
        return lines[i + 1] if lines is not None else i + 2

    counts: dict = {}  # --missing: {marker: {column: cells}}
    if markers[0]:  # texts first: a '.' would otherwise hide a column's decimal commas
        for c in df.columns:
            if c in (time_col, series_col):
                continue
            hit = df[c].str.strip().isin(markers[0])
            if hit.any():
                for marker, k in df[c][hit].str.strip().value_counts().items():
                    counts.setdefault(marker, {})[c] = int(k)
                df[c] = df[c].mask(hit, "")
    if sep != ",":  # (where commas separate fields, a comma in a number is no decimal mark)
        # points as thousands separators first, on the cells as written
        _thousands_points(df, (time_col, series_col), path, row)
        commas = _decimal_commas(df, (time_col, series_col), path, row)
        if commas and notes is not None:
            notes.append(f"note: column(s) {commas}: a comma read as the decimal mark")

    cols = list(df.columns)
    if len(set(cols)) != len(cols):
        dup = sorted({c for c in cols if cols.count(c) > 1})
        raise InputError(f"{path}: duplicate column names {dup}")
    for name, kind in (
        ([(time_col, "--time-col")] if time_col is not None else [])
        + ([(series_col, "--series-col")] if series_col is not None else [])
        + [(c, "--value-col") for c in value_cols or []]
    ):
        if name not in cols:
            raise InputError(f"{kind} {name!r}: no such column in {path}; columns are {cols}")
    if series_col is not None:
        if time_col is None:
            raise InputError(
                f"--series-col {series_col!r}: needs --time-col (the rows of each series are "
                "matched by time)"
            )
        if series_col == time_col or series_col in (value_cols or []):
            what = "the time column" if series_col == time_col else "a --value-col"
            raise InputError(f"--series-col {series_col!r}: that is {what}")
    if time_col is not None:
        times = _parse_times(df[time_col], path, time_col, row, time_format, dayfirst)
        packed = _packed_date_format(df[time_col]) if times.dtype.kind == "f" else None
        if packed is not None:  # 20200131 is a date, not a number 70 after 20200201's
            times = _parse_times(df[time_col], path, time_col, row, packed, dayfirst)
            if notes is not None:
                notes.append(
                    f"note: column {time_col!r} holds dates written as numbers ({packed}: "
                    f"{str(df[time_col].iloc[0]).strip()} is "
                    f"{np.datetime_as_string(times[0], unit='D')}), read as dates"
                )
        if time_format and "%y" in time_format and notes is not None:
            notes.append(
                f"note: --time-format {time_format}: two-digit years read as 2000-2068 (00-68) "
                "and 1969-1999 (69-99)"
            )
        if times.dtype.kind == "M" and notes is not None:
            from kalmanscan.timeseries.times import has_utc_offsets, period_starts

            # the parse refused a mix of times with and without offsets: the first tells
            if has_utc_offsets(df[time_col].to_numpy()[:1]):
                notes.append(f"note: column {time_col!r} {_UTC_NOTE}")
            cells = df[time_col].to_numpy()  # (labels or none: the first cell tells)
            labelled = time_format is None and period_starts(cells[:1]) is not None
            periods = period_starts(cells) if labelled else None
            if periods is not None:
                notes.append(
                    f"note: column {time_col!r} holds {periods[1]} labels: each time is the "
                    f"first day of its {periods[1]}"
                )
    else:
        times = np.arange(len(df), dtype=np.float64)
    if value_cols:
        names = list(value_cols)
        if time_col in names:
            raise InputError(f"--value-col {time_col!r}: that is the time column")
        z = np.column_stack([_parse_values(df[c], path, c, row, markers[1], counts) for c in names])
    else:
        if time_col is None:
            _times_as_columns(cols, path)
        names, columns, skipped, empty, index = [], [], [], [], []
        for c in cols:
            if c in (time_col, series_col):
                continue
            cell = df[c]
            parsed = pd.to_numeric(cell, errors="coerce")  # (spaces around a number are read)
            if c != "Unnamed: 0" and parsed.notna().any():  # numbers: a value column
                names.append(c)
                columns.append(_parse_values(cell, path, c, row, markers[1], counts, parsed))
                continue
            given = cell.notna() & (cell.astype(str).str.strip() != "")
            if not given.any() and re.fullmatch(r"Unnamed: \d+", c):
                # no header and no value: the trailing ",," of a spreadsheet's export
                empty.append(c)
                continue
            if (
                c == cols[0]
                and c == "Unnamed: 0"
                and given.all()
                and (
                    cell.astype(str).str.strip() == pd.Series(range(len(df))).astype(str).values
                ).all()
            ):  # no header and the rows' numbers 0, 1, 2, ...: pandas' to_csv index
                index.append(c)
                continue
            numeric = pd.to_numeric(cell.where(given), errors="coerce").notna()
            if (given.any() or any(c in k for k in counts.values())) and not numeric.any():
                skipped.append(c)  # (a column of labels, or of --missing markers only)
                continue
            names.append(c)
            columns.append(_parse_values(cell, path, c, row, markers[1], counts))
        if not names:
            first = skipped[0] if skipped else None
            detail = ""
            if first is not None:
                cells = df[first].astype(str).str.strip()
                filled = np.flatnonzero((cells != "").to_numpy())
                if filled.size == 0:  # every cell a --missing marker
                    detail = f"; column {first!r} holds --missing markers only"
                else:
                    i = int(filled[0])
                    detail = (
                        f"; column {first!r} row {row(i)}: {df[first].iloc[i]!r} is not a number "
                        f"({_not_a_number_hint(cells.iloc[i])})"
                    )
            elif empty:
                detail = f"; column(s) {empty} have no header and no values"
            raise InputError(
                f"{path}: no numeric value columns besides the time column{detail}; name the "
                f"value columns with --value-col (columns are {cols})"
            )
        if index and notes is not None:
            notes.append(
                "note: skipped the first column: no header and the row numbers 0, 1, 2, ... in it "
                "(the index pandas' to_csv writes)"
            )
        if empty and notes is not None:
            notes.append(
                f"note: skipped column(s) {empty}: no header and no values (a spreadsheet's "
                "trailing empty columns)"
            )
        if skipped and notes is not None:
            dated = [c for c in skipped if time_col is None and _holds_dates(df[c])]
            notes.append(
                f"note: skipped column(s) {skipped}: no numbers in them (name value columns "
                "with --value-col to use them"
                + (
                    f"; column {dated[0]!r} holds dates: pass --time-col {dated[0]!r} to use "
                    "them as the times"
                    if dated
                    else ""
                )
                + ")"
            )
        z = np.column_stack(columns)
    if missing and notes is not None:
        notes.extend(_missing_notes(markers, counts, names))
    if series_col is not None:
        return _long_to_wide(df[series_col], times, z, names, path, series_col, row, notes)
    order = np.argsort(times, kind="stable")
    sorted_ = bool(np.all(order == np.arange(len(order))))
    st = times[order]
    same = np.flatnonzero(st[1:] == st[:-1])
    if same.size:
        k = int(same[0])
        a, b = sorted((int(order[k]), int(order[k + 1])))
        more = same.size - 1
        raise InputError(
            f"{path}: column {time_col!r} rows {row(a)} and {row(b)} have the same time "
            f"{_show_time(st[k])}"
            + (f" ({more} more repeated time{'s' if more > 1 else ''})" if more else "")
            + "; expected one row per time: merge or average the rows of each time first"
            + "".join(
                f"; or, if column {c!r} names each row's series (a long table), pass "
                f"--series-col {c}"
                # a column that tells the two rows apart (not one that holds one value)
                for c in [
                    c
                    for c in cols
                    if c not in names
                    and c != time_col
                    and str(df[c].iloc[a]).strip() != str(df[c].iloc[b]).strip()
                ][:1]
            )
        )
    if not sorted_:
        times, z = st, z[order]
    return times, z, names, sorted_


def _long_to_wide(keys, times, z, names, path, series_col, row, notes):
    """A long table's rows (``keys`` naming each row's series) as series over the union of the
    times: ``(times, z, names, True)``; see :func:`read_csv_series`."""
    text = keys.where(keys.isna(), keys.astype(str).str.strip())
    blank = (text.isna() | (text == "")).to_numpy()
    if blank.any():
        i = int(np.flatnonzero(blank)[0])
        raise InputError(f"{path}: column {series_col!r} row {row(i)}: no series name")
    import pandas as pd

    codes, order = pd.factorize(text.to_numpy(dtype=object))  # series in order of appearance
    grid, at = np.unique(times, return_inverse=True)
    out = np.full((grid.size, len(order) * len(names)), np.nan)
    labels = []
    by_series = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[by_series], np.arange(len(order) + 1))
    for k, key in enumerate(order):
        rows = by_series[bounds[k] : bounds[k + 1]]
        pos = at[rows]
        ranked = np.argsort(pos, kind="stable")
        same = np.flatnonzero(pos[ranked][1:] == pos[ranked][:-1])
        if same.size:
            a, b = rows[ranked[same[0]]], rows[ranked[same[0] + 1]]
            raise InputError(
                f"{path}: series {key!r} (column {series_col!r}) has two rows at the time "
                f"{_show_time(grid[pos[ranked[same[0]]]])}: rows {row(int(a))} and {row(int(b))}; "
                "expected one row per series and time"
            )
        out[pos, k * len(names) : (k + 1) * len(names)] = z[rows]
        labels += [key] if len(names) == 1 else [f"{key}/{n}" for n in names]
    if notes is not None:
        notes.append(
            f"note: column {series_col!r} names each row's series: {len(order)} series"
            + (f" x {len(names)} value columns" if len(names) > 1 else "")
            + f" over {grid.size} times"
        )
    return grid, out, labels, True


def _show_time(t) -> str:
    return str(t) if isinstance(t, np.datetime64) else f"{float(t):.17g}"


def _float_or_nan(text: str) -> float:
    """``float(text)`` (``inf`` past float64's range), NaN where it is no number."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _holds_dates(col) -> bool:
    """Whether a text column's first cells read as dates (for a hint to pass --time-col)."""
    from kalmanscan.timeseries.times import parse_datetime_strings

    cells = [c for c in col.astype(str).str.strip().head(20) if c]
    try:
        return bool(cells) and len(parse_datetime_strings(cells)) == len(cells)
    except ValueError:
        return False


def _times_as_columns(cols: list, path: str) -> None:
    """Refuse a table whose columns are named by times (World Bank, Eurostat: a row per
    series, a column per year or period), which would read as a series per time running over
    the rows; the user can transpose it, or name the columns with --value-col."""
    from kalmanscan.timeseries.times import period_starts

    timed = [c for c in cols if re.fullmatch(r"\d{4}", str(c)) or period_starts([str(c)])]
    if len(timed) >= 3 and len(timed) >= len(cols) / 2:
        raise InputError(
            f"{path}: the columns are named by times ({', '.join(map(str, timed[:3]))}, ...): "
            "one row per series and a column per time; expected a row per time and a column "
            "per series: transpose the table first (or name the columns to use with --value-col)"
        )


def _packed_date_format(col) -> str | None:
    """``%Y%m%d`` or ``%Y%m`` where every cell is an integer of 8 (6) digits that is a valid
    date (month) of the years 1000-9999, as weather services and statistics offices write dates
    (GHCN's 20200131, 200001); else ``None``."""
    text = col.astype(str).str.strip()
    for digits, fmt in ((8, "%Y%m%d"), (6, "%Y%m")):
        if not text.str.fullmatch(rf"[1-9]\d{{{digits - 1}}}").all():
            continue
        month = text.str.slice(4, 6).astype(int)
        if not month.between(1, 12).all():
            return None
        if digits == 8:
            import pandas as pd

            parsed = pd.to_datetime(text, format=fmt, errors="coerce")
            if parsed.isna().any():
                return None
        return fmt
    return None


def _parse_times(col, path, name, row=None, time_format=None, dayfirst=None):
    import pandas as pd

    from kalmanscan.timeseries.times import TimeParseError, parse_datetime_strings

    row = row or (lambda i: i + 2)
    text = col.astype(str).str.strip()
    empty = col.isna() | (text == "")
    if empty.any():
        i = int(np.flatnonzero(empty.to_numpy())[0])
        raise InputError(f"{path}: column {name!r} has an empty time at row {row(i)}")
    # numbers when at least half the cells are: where the first half and one holds none, dates
    # (pandas reads a text that is no number slowly; dates are skipped after half the column)
    is_num = np.zeros(len(text), bool)
    half = text.iloc[: len(text) // 2 + 1]
    if time_format is None and pd.to_numeric(half, errors="coerce").notna().any():
        numbers = pd.to_numeric(text, errors="coerce")
        if numbers.isna().any():
            # a number past float64's range (1e400) is inf, as Python reads it (pandas 2 gave
            # NaN)
            nan = numbers.isna()
            numbers = numbers.astype(np.float64)
            numbers[nan] = text[nan].map(_float_or_nan)
        is_num = numbers.notna().to_numpy()
    if time_format is None and is_num.mean() >= 0.5:
        if not is_num.all():
            i = int(np.flatnonzero(~is_num)[0])
            raise InputError(
                f"{path}: column {name!r} row {row(i)}: cannot parse {text.iloc[i]!r} as a time "
                "(the column holds numbers; expected a number)"
            )
        if numbers.dtype.kind in "iu":  # integers: refused where float64 would round them
            from kalmanscan.timeseries.times import _exact_float_times

            try:
                _exact_float_times(
                    numbers.to_numpy(),
                    f"{path}: column {name!r}",
                    "subtract the first time from every time, or write the times as dates",
                )
            except ValueError as err:
                at_row = lambda m: f"at row {row(int(m.group(1)))}"  # noqa: E731
                raise InputError(re.sub(r"at position (\d+)", at_row, str(err))) from err
        out = numbers.to_numpy(dtype=np.float64)
        if not np.isfinite(out).all():
            i = int(np.flatnonzero(~np.isfinite(out))[0])
            raise InputError(
                f"{path}: column {name!r} row {row(i)}: {text.iloc[i]!r} is not a finite time"
            )
        return out
    try:
        return parse_datetime_strings(
            text.to_numpy(), f"{path}: column {name!r}", time_format=time_format, dayfirst=dayfirst
        )
    except TimeParseError as err:
        if err.index is None:
            raise InputError(str(err)) from err
        msg = re.sub(r"\(position (\d+)\)", lambda m: f"(row {row(int(m.group(1)))})", str(err))
        if "cannot parse" in msg:
            hint = msg[msg.index(" as a time") + len(" as a time") :].strip()
            if hint.startswith("(expected "):  # the parse's expectation, said once
                hint = ""
            if re.fullmatch(r"[+-]?\d+,\d+", str(err.value)):
                hint = (
                    "(a decimal comma is read in value columns only: write "
                    f"{str(err.value).replace(',', '.')} in the time column)"
                )
            msg = (
                f"{path}: column {name!r} row {row(err.index)}: cannot parse {err.value!r} as a "
                f"time {hint}".rstrip()
                + " (expected numbers or dates like 2024-03-01, 2024-03-01T12:30 or 2024Q1; "
                "--time-format sets the format)"
            )
        raise InputError(msg) from err


_POINT_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(\.\d{3})+(,\d*)?$")  # 1.120 or 1.120,5


def _thousands_points(df, skip: tuple, path: str, row) -> None:
    """Refuse a column written with points as thousands separators (``1.120`` beside ``963``,
    as spreadsheets write in countries with decimal commas), which would read as 1.12: every
    cell with a point is grouped in threes, and some other cell is an integer without one, or
    another column of the file writes decimals with commas (``11,2``)."""
    texts = {c: df[c].astype(str).str.strip() for c in df.columns if c not in skip}
    comma_file = next(
        (c for c, text in texts.items()
         if text.str.fullmatch(r"[+-]?\d+,\d+").any()
         and not text.str.contains(".", regex=False).any()),
        None,
    )  # fmt: skip
    for c, text in texts.items():
        pointed = text.str.contains(".", regex=False)
        if not pointed.any():
            continue
        grouped = text.str.match(_POINT_THOUSANDS.pattern)
        if (pointed & ~grouped).any():
            continue
        plain = text.str.fullmatch(r"[+-]?\d+")
        i = int(np.flatnonzero(grouped.to_numpy())[0])
        fix = f"thousands separators are not read: write {text.iloc[i].replace('.', '')}"
        if plain.any():
            j = int(np.flatnonzero(plain.to_numpy())[0])
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {text.iloc[i]!r} has a point as a thousands "
                f"separator (beside {text.iloc[j]!r}, row {row(j)}); {fix}"
            )
        if comma_file is not None and comma_file != c:
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {text.iloc[i]!r} has a point as a thousands "
                f"separator (every point is followed by three digits, and column {comma_file!r} "
                f"writes decimals with commas); {fix}"
            )


def _not_a_number_hint(cell: str) -> str:
    """What to do about a value cell that is not a number: for a marker, the ``--missing`` option
    with the exact text to pass (quoted for a shell where needed)."""
    missing = "leave the cell empty or write NaN for a missing value"
    option = f"pass --missing {shlex.quote(cell)} to read every such cell as missing"
    if _THOUSANDS.match(cell):
        return f"thousands separators are not read: write {cell.replace(',', '')}"
    if _POINT_THOUSANDS.match(cell):
        return f"thousands separators are not read: write {cell.replace('.', '')}"
    if cell.startswith("#"):  # #N/A, #DIV/0!, #VALUE!
        return f"a spreadsheet error value; {missing}, or {option}"
    if cell in (".", ":", "..", "-", "--", "n/a", "N/A", "null", "NULL", "None"):
        # FRED's '.', Eurostat's ':', statistics offices' '..' and '-'
        return f"a missing-value marker of the source; {option}"
    if re.fullmatch(r"[.:]+\s*[A-Za-z]{1,3}", cell):  # Eurostat's ': c' (confidential)
        return f"a missing-value marker of the source with a flag; {option}"
    m = re.fullmatch(r"([+-]?\d+(?:[.,]\d+)?)\s*([A-Za-z]{1,3})", cell)
    if m:  # Eurostat's flags: 12.3 p (provisional), 4.5 e (estimated)
        return f"a value with a flag ({m[2]!r}): write the number alone, {m[1]}"
    if re.fullmatch(r"[<>]\s*\d+(?:\.\d+)?", cell):  # Google Trends' <1
        return f"a bound, not a value: write a number, or {option}"
    return f"{missing}, or {option}"


def _parse_values(col, path, name, row=None, numbers=None, counts=None, parsed=None):
    """A value column's cells as float64, NaN where empty, NA or NaN; a cell equal in value to
    one of ``numbers`` (``{value: marker}``, ``--missing``'s numeric markers) is NaN too, counted
    in ``counts[marker][name]``. Refuses a cell that is no number, naming its row (and the other
    texts in the column that are none), and infinite values. ``parsed``: the column through
    ``pd.to_numeric(col, errors="coerce")``, where the caller has it."""
    import pandas as pd

    row = row or (lambda i: i + 2)
    # the cells as read: spaces around a number are read with it; only the cells that are no
    # number so are stripped (of any whitespace) and read again, or named
    values = pd.to_numeric(col, errors="coerce") if parsed is None else parsed
    out = values.to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.flatnonzero(np.isnan(out))
    if nan.size:
        out = out.copy()  # (pandas' array may be read-only)
        sub = col.iloc[nan]
        text = sub.where(sub.isna(), sub.astype(str).str.strip())
        text = text.where(text != "", None)
        again = pd.to_numeric(text, errors="coerce")
        bad = again.isna() & text.notna() & ~text.astype(str).str.lower().isin(["nan", "na"])
        if bad.any():
            at = nan[bad.to_numpy()]
            i = int(at[0])
            first = str(text.loc[col.index[i]])
            others = {}  # the column's other texts that are no number: their first row and count
            for j in at[1:]:
                t = str(col.iloc[int(j)]).strip()
                if t != first:
                    others.setdefault(t, [int(j), 0])[1] += 1
            also = "; ".join(
                f"{t!r} (row {row(j)}" + (f" and {k - 1} more)" if k > 1 else ")")
                for t, (j, k) in list(others.items())[:5]
            )
            more = f" and {len(others) - 5} more texts" if len(others) > 5 else ""
            raise InputError(
                f"{path}: column {name!r} row {row(i)}: {col.iloc[i]!r} is not a number "
                f"({_not_a_number_hint(first)})"
                + (f"; other cells of the column that are no number: {also}{more}" if also else "")
            )
        out[nan] = again.to_numpy(dtype=np.float64, na_value=np.nan)
    if numbers and not out.flags.writeable:
        out = out.copy()
    for value, marker in (numbers or {}).items():  # matched by value: -9999.0 is -9999
        hit = out == value
        k = int(hit.sum())
        if k:
            out[hit] = np.nan
            if counts is not None:
                counts.setdefault(marker, {})[name] = k
    if np.isinf(out).any():
        i = int(np.flatnonzero(np.isinf(out))[0])
        raise InputError(
            f"{path}: column {name!r} row {row(i)}: {col.iloc[i]!r} is infinite or too large for "
            "float64; expected a finite number or empty"
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
    """``kalmanscan filter data.csv ...``: filter/fit/forecast the series of a CSV."""
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
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
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


def _gross_warning(z, names, ax, fit: bool) -> str | None:
    """A warning naming the values of gross runs (:func:`~kalmanscan.timeseries.robust.gross_runs`:
    a missing-value code such as -9999 among temperatures, alone or several in a row, which a
    fit would take for the level): their rows (from 0 in time order), times and values, with
    ``--missing`` for a value that repeats (a code) and ``--robust``."""
    from kalmanscan.timeseries.robust import _RUN_STEPS, _label, gross_runs

    hit = gross_runs(z)
    if not hit.any():
        return None
    rows, cols = np.nonzero(hit)
    parts = []
    for j in np.unique(cols):
        r = rows[cols == j]
        shown = [f"row {int(t)} (time {_label(ax.labels[t])}, z = {z[t, j]:.6g})" for t in r[:5]]
        more = f" and {r.size - 5} more" if r.size > 5 else ""
        parts.append(f"series {names[j]!r}: {', '.join(shown)}{more}")
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
        f"{'them' if rows.size != 1 else 'it'}: {_shorten('; '.join(parts), 400)}; {what}"
        + ("--robust screens them out" if fit else "--fit --robust screens them out")
    )


_NINES = re.compile(r"-?9+(\.9+)?")


def _describe_duration(seconds: float) -> str:
    for unit, size in (("D", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.6g} {unit}"
    return f"{seconds:.3g} s"


def _filter(args) -> int:
    from kalmanscan.timeseries import OUModel, fit_ou
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
    if args.time_unit is not None and not ax.is_datetime:
        log("note: --time-unit applies to dates only; numeric times are used as they are")
    log(
        f"read {args.csv}: {T} rows, {S} series ({', '.join(names)}), {int(np.isnan(z).sum())} "
        "missing values" + ("" if was_sorted else "; rows sorted by time")
    )
    time_unit = args.time_unit if ax.is_datetime else None
    units = _units_warning(ax, given, given=not args.fit)
    if units and not args.fit:
        print(f"kalmanscan filter: {units}", file=sys.stderr)
    gross = None if args.robust else _gross_warning(z, names, ax, args.fit)
    if gross:
        warnings.warn(gross, stacklevel=1)
    t0 = time.perf_counter()
    if args.fit:
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
        fits = []
        if args.joint or S == 1:
            bar = Progress("fitting", 1, enabled=not args.quiet)
            fits.append(
                fit_ou(
                    pd.DataFrame(z, columns=names),  # the notes name the columns
                    ax.labels,
                    fix=fix,
                    joint=args.joint,
                    time_unit=time_unit,
                    robust=args.robust,
                )
            )
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
                for w in said:
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
            for text in _merge_named(rest, "fit_ou: "):
                warnings.warn(text, stacklevel=1)
            for why, parts in failed.items():
                warnings.warn(
                    f"fit_ou: {sum(k for k, _ in parts)} of {S} fits did not converge ({why}): "
                    "series " + _shorten(", ".join(w for _, w in parts)),
                    stacklevel=1,
                )
        bar.close()
        fit = fits[0] if len(fits) == 1 else _merge_fits(fits)
        if len(fits) > 1:
            fit.notes = tuple(_merge_named(block_notes))
        fit.series_labels = names
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
                + ", ".join(f"{n}={v:.4f}" for n, v in zip(names, ll, strict=False)),
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


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 5].rsplit(",", 1)[0] + ", ..."


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
        at_boundary={p: cat([f.at_boundary[p] for f in fits]) > 0 for p in first.at_boundary},
        upper_bound={p: cat([f.upper_bound.get(p, np.nan) for f in fits]) for p in PARAMS},
        outliers=None
        if first.outliers is None
        else np.concatenate([np.asarray(f.outliers).reshape(f.z.shape) for f in fits], axis=1),
    )
