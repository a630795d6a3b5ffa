"""The CSV reader's time column: :func:`_parse_times` (numbers, or dates read with one format for
the column; a cell that is no time refused naming its row, with the options to pass), dates of a
model calendar (``--calendar``: :func:`_calendar_times`), quarters by ``--time-format`` ``%q``
(:func:`_quarter_format`), dates written as numbers (:func:`_packed_date_format`: ``20200131``),
year.month and year.quarter numbers refused (:func:`_period_numbers`), repeated times split over
two columns (:func:`_split_times`: year and quarter), columns named by times
(:func:`_times_as_columns`), a hint where a skipped column holds dates (:func:`_holds_dates`) and
times as messages show them (:func:`_show_time`). Used by
:func:`kalmanscan.timeseries.csvfile.read_csv_series`; docs: docs/cli.md.
"""

from __future__ import annotations

import re

import numpy as np

from kalmanscan.timeseries.csv_layout import InputError

# (a note of read_csv_series; the command then marks its outputs' times as UTC)
_UTC_NOTE = "gives UTC offsets: the times are converted to UTC (results.csv marks them with Z)"


def _split_times(df, cols, times, time_col, path, row, a, b) -> None:
    """Refuse repeated times that another column tells apart as the periods of a year (year and
    quarter in two columns, as statsmodels' macrodata holds them): the time is split over two
    columns, to be written as one, not kept as repeated times nor read as a series."""
    if times.dtype.kind != "f" or not np.all(times == np.round(times)):
        return
    for c in cols:
        if c == time_col:
            continue
        values = _float_or_nan_column(df[c])
        if np.isnan(values).any() or not np.all(values == np.round(values)):
            continue
        lo, hi = int(values.min()), int(values.max())
        if lo != 1 or hi not in (4, 12) or len(set(zip(times, values, strict=True))) < len(times):
            continue
        what, label = ("quarter", "1959Q1") if hi == 4 else ("month", "1959-01")
        raise InputError(
            f"{path}: column {time_col!r} rows {row(a)} and {row(b)} have the same time "
            f"{_show_time(times[a])}, told apart by column {c!r} ({lo} to {hi}): the time is "
            f"split over two columns (year and {what}); write them as one time column "
            f"({label}) and pass it to --time-col"
        )


def _float_or_nan_column(col) -> np.ndarray:
    import pandas as pd

    return pd.to_numeric(col.astype(str).str.strip(), errors="coerce").to_numpy(np.float64)


def _show_time(t) -> str:
    from kalmanscan.timeseries.time_cftime import is_cftime

    return str(t) if isinstance(t, np.datetime64) or is_cftime(t) else f"{float(t):.17g}"


def _float_or_nan(text: str) -> float:
    """``float(text)`` (``inf`` past float64's range), NaN where it is no number."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _period_labels(cells) -> bool:
    """Whether the text cells (stripped, not empty) are all period labels of one kind
    (``1959Q1``, ``1998M1``, ``2020-W01``, ``2007H2``:
    :func:`~kalmanscan.timeseries.time_parse.period_starts`)."""
    from kalmanscan.timeseries.time_parse import period_starts

    return len(cells) > 0 and period_starts(list(cells)) is not None


def _holds_dates(col) -> bool:
    """Whether a text column's first cells read as dates or period labels (``1959Q1``; for a
    hint to pass --time-col)."""
    from kalmanscan.timeseries.times import parse_datetime_strings

    cells = [c for c in col.astype(str).str.strip().head(20) if c]
    if _period_labels(cells):
        return True
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


def _quarter_format(col, fmt: str, path: str, name: str, row):
    """The cells of a time column written as ``--time-format`` ``fmt`` says with ``%q`` for the
    quarter (``%Y.%q`` reads ``1959.1``, ``%YQ%q`` reads ``1959Q1``), as the ISO dates their
    quarters start (``1959-01-01``)."""
    parts = re.split(r"(%Y|%q)", fmt)
    if "%Y" not in parts or parts.count("%q") != 1 or any("%" in p for p in parts[::2]):
        raise InputError(
            f"--time-format {fmt}: with %q (the quarter, 1-4) expected %Y and literal text only, "
            "e.g. %Y.%q for 1959.1"
        )
    pattern = "".join(
        {"%Y": r"(?P<y>\d{4})", "%q": r"(?P<q>[1-4])"}.get(p, re.escape(p)) for p in parts
    )
    text = col.astype(str).str.strip()
    got = text.str.extract(f"^{pattern}$")
    bad = got["y"].isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{path}: column {name!r} row {row(i)}: cannot parse {text.iloc[i]!r} as a quarter "
            f"in the format {fmt!r} (--time-format)"
        )
    month = (got["q"].astype(int) * 3 - 2).map("{:02d}".format)
    return got["y"] + "-" + month + "-01"


def _period_numbers(col, path: str, name: str) -> None:
    """Refuse a numeric time column written as year.month (``1950.01`` .. ``1950.12``) or
    year.quarter (``1959.1`` .. ``1959.4``): the part after the point counts the periods of
    each year and starts again at the next, which as decimal years would be steps of 0.01 (0.1)
    and a jump of 0.89 (0.7) at each year's end. Several periods in a year and several years."""
    text = col.astype(str).str.strip()
    for pattern, what, steps, fix in (
        (r"\d{3,4}\.(0[1-9]|1[0-2])", "year.month", "0.01 within a year and 0.89 from .12 to "
         "the next year's .01", "%Y.%m to read them as months (or write them as dates, 1950-01)"),
        (r"\d{3,4}\.[1-4]", "year.quarter", "0.1 within a year and 0.7 from .4 to the next "
         "year's .1", "%Y.%q to read them as quarters (or write them as quarter labels, 1959Q1)"),
    ):  # fmt: skip
        if not text.str.fullmatch(pattern).all():
            continue
        year, period = text.str.split(".", n=1, expand=True).to_numpy().T
        if len(set(year)) < 2 or len(set(zip(year, period, strict=True))) <= len(set(year)):
            return
        values = text.astype(float)
        lo, hi = text.iloc[int(values.argmin())], text.iloc[int(values.argmax())]
        raise InputError(
            f"{path}: column {name!r} holds {what} numbers ({lo} to {hi}): the part after the "
            "point counts the periods of each year and starts again at the next year, so read as "
            f"numbers (decimal years) the steps would be {steps}; pass --time-format {fix}"
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


def _parse_times(col, path, name, row=None, time_format=None, dayfirst=None, calendar=None):
    import pandas as pd

    from kalmanscan.timeseries.times import (
        TimeParseError,
        _parse_fixed_iso,
        parse_datetime_strings,
    )

    if time_format is None and calendar is None:  # ISO 8601 in one layout: read at once
        fixed = _parse_fixed_iso(col.to_numpy())
        if fixed is not None:
            return fixed
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
    if calendar is not None:
        return _calendar_times(text, path, name, row, time_format, calendar)
    try:
        return parse_datetime_strings(
            text.to_numpy(), f"{path}: column {name!r}", time_format=time_format, dayfirst=dayfirst
        )
    except TimeParseError as err:
        if err.index is None:
            raise InputError(_cli_names(str(err))) from err
        msg = re.sub(r"\(position (\d+)\)", lambda m: f"(row {row(int(m.group(1)))})", str(err))
        msg = _cli_names(msg)
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
            if re.match(r"\d{1,4}-0?2-(29|30)\b", str(err.value)):  # no such Gregorian date
                msg += (
                    "; a date of a model calendar (360_day, noleap)? --calendar 360_day (or "
                    "noleap, ...) reads the column in that calendar"
                )
        raise InputError(msg) from err


def _cli_names(msg: str) -> str:
    """A time parse's message with the options named as the command line names them:
    ``time_format (CLI: --time-format)`` is ``--time-format``."""
    msg = re.sub(r"\b(?:time_format|dayfirst|calendar) \(CLI: (--[\w-]+)\)", r"\1", msg)
    return re.sub(r"e\.g\. (\S+) \(CLI: (--[\w-]+)\)", r"e.g. \2 \1", msg)


def _calendar_times(text, path, name, row, time_format, calendar):
    """The time column's dates as dates of the cftime ``calendar`` (``--calendar``), in one
    layout for the column (:func:`~kalmanscan.timeseries.time_cftime.parse_cftime_strings`);
    labels as :func:`~kalmanscan.timeseries.time_cftime.cftime_datetimes` makes them
    (``datetime64`` for the Gregorian calendars)."""
    from kalmanscan.timeseries.time_cftime import (
        CF_CALENDARS,
        CalendarParseError,
        cftime_datetimes,
        parse_cftime_strings,
    )

    if calendar not in CF_CALENDARS:
        raise InputError(f"--calendar: expected one of {', '.join(CF_CALENDARS)}, got {calendar!r}")
    try:
        import cftime  # noqa: F401
    except ImportError as err:
        raise InputError("--calendar: needs the cftime package (pip install cftime)") from err

    where = f"{path}: column {name!r}"
    try:
        out = parse_cftime_strings(text.tolist(), calendar, where, time_format)
    except CalendarParseError as err:
        layout = (
            f"in the column's layout {err.fmt!r} ({err.__cause__})"
            if err.fmt is not None
            else "(expected a layout like 2000-02-30, 2000-02-30 12:00 or 2000-02-30T12:00:00"
            "; --time-format sets it)"
        )
        raise InputError(
            f"{where} row {row(err.index)}: cannot parse {err.value!r} as a date of the "
            f"{calendar!r} calendar {layout}"
        ) from err
    return cftime_datetimes(out, where)
