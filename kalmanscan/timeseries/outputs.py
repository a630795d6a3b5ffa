"""The output files of ``kalmanscan demo`` and ``kalmanscan filter``: a PNG, a netCDF file,
``results.csv`` (long format, one row per time and series) and ``summary.txt``, each written to
a temporary file and renamed into place. Docs: docs/cli.md.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from kalmanscan.timeseries.coverage import percent
from kalmanscan.timeseries.csvfile import InputError
from kalmanscan.timeseries.time_calendar import floor_datetimes, whole_in
from kalmanscan.timeseries.time_cftime import is_cftime_array


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

    from kalmanscan.plot import _overview_picks, make_drawable, plot_overview
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
    # plot_overview's title says when it leaves series out; this one replaces it, saying where
    # they all are (the data files)
    picks, n_series = _overview_picks(ds, None, max_series)
    if n_series > len(picks):
        files = f"{os.path.basename(nc)} and {os.path.basename(csv)}"
        title = f"{title}\n(the first {len(picks)} of {n_series} series; all in {files})"
    axes[0].figure.suptitle(title)
    if ylabel:
        for ax in axes[:-1]:
            ax.set_ylabel(ylabel)
    make_drawable(axes[0].figure)  # (the title and labels set here)
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
    return [x.decode() for x in _iso_time_bytes(t, _iso_unit(t, with_time)).tolist()]


def _cf_texts(t: np.ndarray) -> list[str] | None:
    """cftime dates (a model calendar's) as results.csv writes dates: ``2000-02-30``, with the
    time of day where one has one (``2000-02-30 06:00:00``); None for other values."""
    if not is_cftime_array(t):
        return None
    timed = any(v.hour or v.minute or v.second or v.microsecond for v in t)
    return [v.isoformat(sep=" ") if timed else v.strftime("%Y-%m-%d") for v in t]


def _iso_unit(t: np.ndarray, with_time: bool = False) -> str:
    """The coarsest of days (unless ``with_time``), s, ms and us that holds the datetimes
    ``t`` exactly, else ns."""
    for unit in ("s", "ms", "us") if with_time else ("D", "s", "ms", "us"):
        if whole_in(t, unit):
            return unit
    return "ns"


_DIGITS4 = np.frombuffer("".join(f"{k:04d}" for k in range(10_000)).encode(), np.uint32)

# ISO texts of the years 1 to 9999 (:func:`_iso_time_bytes`): their widths per unit, the ticks
# of each unit in a second, the days of 0001-01-01 and 9999-12-31 from 1970-01-01
_ISO_WIDTH = {"D": 10, "s": 19, "ms": 23, "us": 26, "ns": 29}
_TICKS_PER_S = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896
_ISO_TABLES: dict = {}
_INT64 = np.iinfo(np.int64)


def _iso_tables():
    """``(years, month_days, clock, digits3)``, one item per text: ``0000``..``9999`` (uint32),
    ``MM-DD`` at ``31 (month - 1) + day - 1`` (``V5``), ``hh:mm:ss`` at the second of the day
    (uint64) and ``000``..``999`` (``V3``), as ASCII; made once."""
    if not _ISO_TABLES:
        four = _DIGITS4.view(np.uint8).reshape(-1, 4)
        two = four[:100, 2:]
        k = np.arange(12 * 31)
        month_days = np.full((k.size, 5), ord("-"), np.uint8)
        month_days[:, :2], month_days[:, 3:] = two[k // 31 + 1], two[k % 31 + 1]
        sec = np.arange(86_400)
        clock = np.full((sec.size, 8), ord(":"), np.uint8)
        clock[:, 0:2], clock[:, 3:5], clock[:, 6:8] = (
            two[sec // 3600],
            two[sec // 60 % 60],
            two[sec % 60],
        )
        digits3 = np.ascontiguousarray(four[:1000, 1:])
        _ISO_TABLES["t"] = (
            _DIGITS4,
            month_days.view("V5").ravel(),
            clock.view(np.uint64).ravel(),
            digits3.view("V3").ravel(),
        )
    return _ISO_TABLES["t"]


def _iso_layout(unit: str) -> np.dtype:
    """The fields of a text of ``unit`` (:func:`_iso_text_fast`) at their byte offsets."""
    fields = {"year": ("=u4", 0), "dash": ("u1", 4), "month_day": ("V5", 5)}
    if unit != "D":  # (the tables' words in native order: their bytes copied as they are)
        fields |= {"space": ("u1", 10), "clock": ("=u8", 11)}
    if _TICKS_PER_S.get(unit, 1) > 1:
        fields["point"] = ("u1", 19)
        for i in range(len(str(_TICKS_PER_S[unit])) // 3):
            fields[f"frac{i}"] = ("V3", 20 + 3 * i)
    names = list(fields)
    return np.dtype(
        {
            "names": names,
            "formats": [fields[k][0] for k in names],
            "offsets": [fields[k][1] for k in names],
            "itemsize": _ISO_WIDTH[unit],
        }
    )


def _civil(days: np.ndarray):
    """``(year, month, day)`` of the proleptic Gregorian calendar of days since 1970-01-01
    (Hinnant's ``civil_from_days``: 400-year eras of 146,097 days, years from March), for days
    of the years 1 to 9999, in int32 (every intermediate holds in it)."""
    z = (days + 719_468).astype(np.int32)
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    return yoe + era * 400 + (month <= 2), month, day


def _iso_text_fast(ticks: np.ndarray, unit: str) -> np.ndarray:
    """``S{width}`` ASCII of integer ``ticks`` of ``unit`` whose days are in the years 1 to
    9999: ``YYYY-MM-DD``, then `` hh:mm:ss`` and the fraction's 3, 6 or 9 digits, each part
    one lookup in a table of its texts (:func:`_iso_tables`)."""
    years, month_days, clock, digits3 = _iso_tables()
    per_s = _TICKS_PER_S.get(unit)
    if per_s is None:
        days, rem = ticks, None
    else:
        days, rem = np.divmod(ticks, 86_400 * per_s)
    y, m, d = _civil(days)
    out = np.empty(ticks.size, _iso_layout(unit))
    out["year"] = years[y]
    out["dash"] = ord("-")
    out["month_day"] = month_days[31 * (m - 1) + d - 1]
    if rem is not None:
        sec, sub = np.divmod(rem, per_s)
        out["space"] = ord(" ")
        out["clock"] = clock[sec]
        if per_s > 1:
            out["point"] = ord(".")
            groups = len(str(per_s)) // 3
            for i in range(groups):
                out[f"frac{i}"] = digits3[sub // 10 ** (3 * (groups - 1 - i)) % 1000]
    return out.view(f"S{_ISO_WIDTH[unit]}")


def _iso_time_bytes(t: np.ndarray, unit: str) -> np.ndarray:
    """``np.datetime_as_string(t, unit)`` of ``t`` floored to ``unit`` (D, s, ms, us or ns),
    with a space for the ``T``, as ASCII bytes (``S``, as wide as the longest text).

    Times of the years 1 to 9999 are written in integers, each part of the text one lookup in
    a table (:func:`_iso_text_fast`; every day of those years in under a tenth of the time
    ``np.datetime_as_string`` takes); NaT and the years beyond get numpy's text, its ``T``
    replaced as well (``b"Na "``: no time axis holds NaT).

    >>> t = np.array(["0001-01-01T00:00:00.5", "9999-12-31T23:59:59"], "datetime64[ms]")
    >>> _iso_time_bytes(t, "ms").tolist()
    [b'0001-01-01 00:00:00.500', b'9999-12-31 23:59:59.000']
    >>> _iso_time_bytes(np.array(["10000-01-01"], "datetime64[D]"), "D").tolist()
    [b'10000-01-01']
    """
    floored = floor_datetimes(np.asarray(t), unit)
    ticks = floored.view(np.int64).ravel()
    per_day = 86_400 * _TICKS_PER_S.get(unit, 1) if unit != "D" else 1
    # the ticks of the years 1 to 9999 that int64 holds; NaT, the most negative int64, is out
    lo = max(_FIRST_DAY * per_day, _INT64.min + 1)
    hi = min((_LAST_DAY + 1) * per_day - 1, _INT64.max)
    ok = (ticks >= lo) & (ticks <= hi)
    width = _ISO_WIDTH[unit]
    if ok.all():
        return _iso_text_fast(ticks, unit).reshape(floored.shape)
    other = np.datetime_as_string(floored.ravel()[~ok], unit=unit).astype("S")
    chars = other.view(np.uint8)
    chars[chars == ord("T")] = ord(" ")
    out = np.zeros(ticks.size, f"S{max(width if ok.any() else 0, other.dtype.itemsize)}")
    out[ok] = _iso_text_fast(ticks[ok], unit)
    out[~ok] = other
    return out.reshape(floored.shape)


def _results_table(ds):
    """``(table, sizes, time_dim, series_dims)``: the rows of results.csv as a DataFrame (the
    ``kind`` column, then the time, the series dims and the values, times not yet formatted),
    and the number of data and forecast rows."""
    import pandas as pd

    tdim = ds.attrs.get("time_dim", "time")
    sdims = [d for d in ds["mean"].dims if d != tdim]
    c = float(max(ds["coverage"].values))
    pct = percent(c).removesuffix("%")  # (the summary's and the plots' labels' digits)
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
    return pd.concat(parts, ignore_index=True), [len(p) for p in parts], tdim, sdims


def _number_text(t: float) -> str:
    """A numeric time as results.csv writes it: a whole number as an integer, else the shortest
    text that reads back to it (epoch seconds 1709430000, not 1.70943e+09).

    >>> _number_text(1709430000.0), _number_text(1968.6), _number_text(2.5e-7)
    ('1709430000', '1968.6', '2.5e-07')
    """
    return str(int(t)) if t.is_integer() and abs(t) < 2.0**53 else repr(t)


def _write_csv(ds, path: str) -> None:
    """Long-format table: one row per (time, series) with the filtered and smoothed level (mean, sd,
    bounds at the widest coverage). Forecast rows (``kind=forecast``) give the level's mean and sd,
    the ``predictive_sd`` of a new observation, and bounds of the predictive interval."""
    out, sizes, tdim, sdims = _results_table(ds)
    # the kind of each row, and each time, formatted once (not once per row or series)
    coded = {"kind": (np.repeat(np.arange(len(sizes)), sizes), ["data", "forecast"])}
    kind = out["time"].dtype.kind
    cf = kind == "O" and is_cftime_array(out["time"].to_numpy())  # a model calendar's dates
    if cf or kind in "fM":
        import pandas as pd

        codes, uniques = pd.factorize(out["time"], use_na_sentinel=False)
        uniques = np.asarray(uniques)
        if cf:
            texts = _cf_texts(uniques)
        elif kind == "f":  # times exactly as read (shortest round-trip text)
            texts = [_number_text(t) for t in uniques.astype(np.float64).tolist()]
        else:
            zone = "Z" if ds[tdim].attrs.get("time_zone") == "UTC" else ""
            # a zone only with a time of day: 1958-03-29 00:00:00Z (ISO 8601 has no date with Z)
            texts = _iso_time_bytes(uniques, _iso_unit(uniques, with_time=bool(zone)))
            if zone:
                texts = np.char.add(texts, zone.encode())
        coded["time"] = (codes, texts)
    keep = ["kind", "time", *sdims] + [k for k in out.columns if k not in ("kind", "time", *sdims)]
    columns = [k for k in keep if k in out.columns]
    with open(path, "w", newline="") as fh:
        probe = "0123456789.,+-e\nTrueFalseinf"
        if probe.encode(fh.encoding, "replace") != probe.encode("ascii"):  # (UTF-16, EBCDIC)
            fh.write(b"".join(_csv_chunks(out, "utf-8", columns, coded)).decode("utf-8"))
            return
        fh.flush()
        for chunk in _csv_chunks(out, fh.encoding, columns, coded):
            fh.buffer.write(chunk)


def _csv_field(x) -> str:
    """A text field as a CSV writer quotes it: in double quotes (doubled inside) where it holds a
    comma, a quote or a line end."""
    return '"' + x.replace('"', '""') + '"' if any(c in x for c in ',"\r\n') else x


def _csv_text(frame) -> str:
    """``frame.to_csv(index=False, float_format="%.10g")``, the same text, faster (see
    :func:`_csv_chunks`): floats as ``%.10g``, NaN (and None) as empty fields, text quoted where
    needed.

    >>> import pandas as pd
    >>> f = pd.DataFrame({"s": ["a", 'b,"c"'], "x": [0.1 + 0.2, float("nan")], "k": [True, False]})
    >>> _csv_text(f) == f.to_csv(index=False, float_format="%.10g")
    True
    """
    return b"".join(_csv_chunks(frame, "utf-8")).decode("utf-8")


def _csv_chunks(frame, encoding: str, columns=None, coded=None):
    """The bytes of :func:`_csv_text` in ``encoding`` (one that writes ASCII as ASCII), in
    pieces: the header, then blocks of rows. ``columns`` picks and orders the columns (default:
    all); ``coded`` gives some of them as ``{name: (codes, texts)}``, each cell the text of its
    code, so that a value repeated (a time, once per series) is formatted once.

    Each block of rows is built in numpy: every field in a fixed-width slot with its separator,
    zero bytes after them, which are dropped. Floats are :func:`_put_floats`; other columns
    are factorized, and each distinct value formatted once (``str``, quoted as a CSV writer
    quotes it). pandas' writer, and a loop of Python's ``"%.10g" % v``, format each cell in
    Python, about 0.3 us a value: 6 s for the 18 million floats of a million rows of two series,
    which take about 1 s here. A text holding a NUL character, which the zeros would lose, is
    written by pandas' writer."""
    columns = list(frame.columns) if columns is None else list(columns)
    coded = coded or {}
    fields = []  # (float64 values, sep), or (codes, slots of a void dtype, sep)
    for k, name in enumerate(columns):
        sep = b"\n" if k == len(columns) - 1 else b","
        if name in coded:
            field = _text_slots(*coded[name], encoding, sep)
        elif frame[name].dtype.kind == "f":
            field = (frame[name].to_numpy(dtype=np.float64, na_value=np.nan), sep)
        else:
            field = _text_slots(*_factorized_texts(frame[name]), encoding, sep)
        if field is None:  # (a NUL character)
            table = frame[columns].copy()
            for c, (codes, texts) in coded.items():
                texts = texts.astype(str).tolist() if isinstance(texts, np.ndarray) else texts
                table[c] = np.asarray([*texts, ""], dtype=object)[np.asarray(codes)]
            text = table.to_csv(index=False, float_format="%.10g", lineterminator="\n")
            yield text.encode(encoding)
            return
        fields.append(field)
    yield (",".join(_csv_field(str(c)) for c in columns) + "\n").encode(encoding)
    # each slot a whole number of 4-byte words, zero past its text
    widths = [_FLOAT_WIDTH if len(f) == 2 else -(-f[1].dtype.itemsize // 4) * 4 for f in fields]
    n, rows = len(frame), 1 << 14
    block = np.empty((min(n, rows), sum(widths)), np.uint8)
    words = block.view(np.uint32)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        at = 0
        for field, w in zip(fields, widths, strict=True):
            if len(field) == 2:
                _put_floats(words[: r1 - r0, at // 4 : (at + w) // 4], field[0][r0:r1], field[1])
            else:
                codes, slots, _ = field
                text = slots.take(codes[r0:r1]).view(np.uint8).reshape(r1 - r0, -1)
                block[: r1 - r0, at : at + text.shape[1]] = text
                block[: r1 - r0, at + text.shape[1] : at + w] = 0
            at += w
        yield block[: r1 - r0].tobytes().translate(None, b"\x00")


def _factorized_texts(col) -> tuple[np.ndarray, list[str]]:
    """``(codes, texts)`` of a column that is not float: each distinct value's ``str``, code -1
    (NaN, None, NaT) an empty field. Object columns of values other than text or booleans (where
    ``1 == 1.0 == True`` would merge values written differently) are made text first."""
    import pandas as pd

    if col.dtype == object and pd.api.types.infer_dtype(col, skipna=True) not in (
        "string",
        "boolean",
        "empty",
    ):
        col = col.map(str, na_action="ignore")
    codes, uniques = pd.factorize(col)
    return codes, [str(v) for v in uniques]


def _text_slots(codes, texts, encoding: str, sep: bytes):
    """``(codes, slots, sep)``: each text (a list of ``str``, or a numpy array of ASCII bytes
    without NUL, as :func:`_iso_time_bytes` gives) encoded, quoted where needed and followed by
    ``sep``, in a zero-padded slot of a void dtype; ``sep`` alone last, for code -1. ``None``
    where a text holds a NUL character."""
    if isinstance(texts, np.ndarray):
        raw = texts.astype("S")
        if any(c in raw.tobytes() for c in b',"\r\n'):  # (some need quotes)
            texts, raw = [t.decode("ascii") for t in raw.tolist()], None
    else:
        raw = None
    if raw is None:
        joined = "\x00".join(texts)
        if joined.count("\x00") != max(len(texts) - 1, 0):
            return None
        if any(c in joined for c in ',"\r\n'):  # (one scan for a field that needs quotes)
            texts = [_csv_field(t) for t in texts]
        raw = np.array([t.encode(encoding) for t in texts], dtype="S")
    raw = np.char.add(np.append(raw, np.array([b""], dtype=raw.dtype)), sep)
    codes = np.asarray(codes)
    return np.where(codes < 0, len(raw) - 1, codes), raw.view(f"V{raw.dtype.itemsize}"), sep


# a float's slot in a row of results.csv (_put_floats), 36 bytes: its sign, the 0 of 0.00123
# and the ten significant digits for the part before the point; the point and the zeros after
# it of 0.00123; the digits again for the part after the point; the exponent (e+12); the
# separator. A mask per layout (sign, digits before the point, zeros after it, exponent,
# significant digits) keeps the bytes of the value's text, and zeros the others.
_FLOAT_WIDTH = 36
_POW10 = np.array([float(10**i) for i in range(23)])  # powers of ten exact in float64
_SIGNED2 = np.frombuffer("".join(f"-0{k % 100:02d}" for k in range(100)).encode(), np.uint32)
_TRAILING4 = np.array([4] + [len(str(k)) - len(str(k).rstrip("0")) for k in range(1, 10_000)])
_EXPONENTS = np.frombuffer("".join(f"e{k:+03d}" for k in range(-99, 100)).encode(), np.uint32)


def _layout_masks() -> np.ndarray:
    """``[301, 9]`` uint32: the bytes a layout keeps (255) and drops (0); layout ``(sign * 15
    + kind) * 10 + kept - 1`` with ``kind`` 0-9 fixed with ``kind + 1`` digits before the point,
    10-13 fixed below 1 with ``kind - 10`` zeros after the point, 14 scientific; 300 NaN (the
    separator alone)."""
    masks = np.zeros((301, _FLOAT_WIDTH), np.uint8)
    for sign in (0, 1):
        for kind in range(15):
            for kept in range(1, 11):
                keep = masks[(sign * 15 + kind) * 10 + kept - 1]
                keep[0] = sign
                before = kind + 1 if kind < 10 else int(kind == 14)
                keep[1] = 10 <= kind < 14  # 0.00123
                keep[2 : 2 + before] = 1
                keep[12] = kept > before  # the point
                keep[13 : 13 + (kind - 10 if 10 <= kind < 14 else 0)] = 1
                keep[18 + before : 18 + max(kept, before)] = 1
                keep[28:32] = kind == 14
    masks[:, 32] = 1  # the separator
    return (masks * np.uint8(255)).view(np.uint32)


_LAYOUTS = _layout_masks()


def _put_floats(words: np.ndarray, x: np.ndarray, sep: bytes) -> None:
    """Write ``"%.10g" % v`` of the floats ``x [m]`` (nothing for NaN) and ``sep`` in the
    36-byte slots ``words [m, 9]`` (uint32), zero past the text.

    Values from 1e-12 to 1e30 are rounded to ten significant digits in float64: ``s``, the
    value times a power of ten (exact to 1e22) to lie in [1e9, 1e10), is one rounding from the
    exact product, within 2**-20 of it, so its nearest integer is the exact product's unless
    ``s`` lies within 2**-17 of a half. Those values (ties among them, which ``%g`` rounds to
    even), zeros, infinities and magnitudes outside that range are formatted by Python. Tested
    against Python's ``%.10g`` (tests/test_cli_output_speed.py)."""
    nan = np.isnan(x)
    a = np.abs(x)
    fast = (a >= 1e-12) & (a < 1e30)
    a[~fast] = 1.0
    e = np.floor(np.log10(a)).astype(np.int64)  # the decimal exponent, or one off
    s = _scaled(a, e)
    for _ in range(2):
        low, high = s < 1e9, s >= 1e10
        if not (low.any() or high.any()):
            break
        e = e - low + high
        s = np.where(low | high, _scaled(a, e), s)
    fast &= np.abs(s - np.floor(s) - 0.5) > 2.0**-17
    digits = np.rint(s).astype(np.int64)
    up = digits == 10**10  # 9999999999.5 rounds up to the next power of ten
    digits[up] = 10**9
    e += up
    hi = digits // 10**8
    mid = digits // 10**4 - hi * 10**4
    lo = digits % 10**4
    words[:, 0] = _SIGNED2[hi]
    words[:, 1] = words[:, 5] = _DIGITS4[mid]
    words[:, 2] = words[:, 6] = _DIGITS4[lo]
    words[:, 3] = _POINT_ZEROS
    words[:, 4] = _DIGITS4[hi]
    words[:, 7] = _EXPONENTS[np.clip(e, -99, 99) + 99]
    words[:, 8] = np.frombuffer(sep.ljust(4, b"\x00"), np.uint32)[0]
    kept = 10 - _TRAILING4[lo]
    zero = np.flatnonzero(lo == 0)
    kept[zero] -= _TRAILING4[mid[zero]] + (mid[zero] == 0) * (hi[zero] % 10 == 0)
    kind = np.where(e > 9, 14, np.where(e >= 0, e, np.where(e >= -4, 9 - e, 14)))
    layout = (np.signbit(x) * 15 + kind) * 10 + kept - 1
    layout[nan] = 300
    words &= np.take(_LAYOUTS, layout, axis=0)  # (take: faster than indexing rows)
    rest = np.flatnonzero(~fast & ~nan)
    if rest.size:  # written from the slot's start, the sign included, then the separator
        texts = [("%.10g" % v).encode() + sep for v in x[rest].tolist()]  # noqa: UP031
        raw = np.array(texts, dtype=f"S{_FLOAT_WIDTH}").view(np.uint32)
        words[rest] = raw.reshape(-1, _FLOAT_WIDTH // 4)


_POINT_ZEROS = np.frombuffer(b".000", np.uint32)[0]


def _scaled(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``a * 10**(9 - e)`` with one rounding (``9 - e`` from -22 to 22)."""
    k = 9 - e
    if k.min() >= 0:
        return a * _POW10[k]
    return np.where(k >= 0, a * _POW10[np.clip(k, 0, 22)], a / _POW10[np.clip(-k, 0, 22)])
