"""The CSV reader of ``kalmanscan filter``: :func:`read_csv_series`, the time column, the
choice of columns and the reader's notes.

The file's layout is read first (:mod:`~kalmanscan.timeseries.csv_layout`: one pass over its
bytes finds its encoding, comment and blank lines; the separator is read from the header and the
fields checked against it), and pandas reads the cells as text; the time column is parsed by
:mod:`~kalmanscan.timeseries.csv_times` (``_parse_times``: numbers, dates, calendars, quarters,
year.month numbers refused) and the value columns by :mod:`~kalmanscan.timeseries.csv_numbers`
(``_parse_values``, with ``--missing``'s markers, decimal commas and thousands separators), so
every refusal names the file, column, row and cell. Here: which columns hold values (notes on
those skipped, row numbers and columns without a name), a header that is data, trailing rows of
separators, long tables (``--series-col``), duplicate times, and ``--missing``'s markers and
notes. Docs: docs/cli.md.
"""

from __future__ import annotations

import math
import os
import re
import shlex

import numpy as np

# the file's layout and the value cells: used here, and importable from csvfile as before
from kalmanscan.timeseries.csv_layout import (  # noqa: F401 - re-exported
    _SEP_NAMES,
    InputError,
    _bare_rows,
    _check_fields,
    _counts_times,
    _header_as_data,
    _holds,
    _line,
    _nfc,
    _refuse_unnamed,
    _row_counter,
    _scan_file,
    _scan_lines,
    _separator,
)
from kalmanscan.timeseries.csv_numbers import (
    _decimal_commas,
    _decimal_mark,
    _grouped_numbers,
    _not_a_number_hint,
    _parse_values,
    _thousands_points,
    _unicode_minus,
)

# the time column: used here, and importable from csvfile as before
from kalmanscan.timeseries.csv_times import (
    _UTC_NOTE,
    _holds_dates,
    _packed_date_format,
    _parse_times,
    _period_labels,
    _period_numbers,
    _quarter_format,
    _show_time,
    _split_times,
    _times_as_columns,
)


def _missing_markers(markers) -> tuple[tuple[str, ...], dict[float, str]]:
    """``--missing``'s markers as ``(texts, numbers)``: a marker that reads as a finite number
    (``-9999``, ``-99.9``) is matched by value (``numbers``: ``{value: marker}``), any other by
    its exact text (``texts``), both after stripping spaces. Refuses an empty marker and two
    markers of one value.

    >>> _missing_markers([".", " -9999 ", "n/a"])
    (('.', 'n/a'), {-9999.0: '-9999'})
    """
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
        _one_marker_a_number(numbers, value, marker)
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
            comma = "," in marker  # (-99,9 in a file with decimal commas: -99,90 too)
            value = float(marker.replace(",", "."))
            plain = f"{value:.15g}"
            spellings = [plain, np.format_float_positional(value, trim="-")]
            if "e" not in plain:
                spellings.append(plain + ("0" if "." in plain else ".0"))
            if comma:
                spellings = [t.replace(".", ",") for t in spellings]
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


def _comma_markers(markers, sep: str, decimal) -> tuple[tuple[str, ...], dict[float, str]]:
    """``--missing``'s markers (:func:`_missing_markers`) with those written with a decimal
    comma (``-99,9``) matched by value where the value columns read commas as the decimal mark
    (a file not separated by commas, or ``--decimal ,``): ``-99,90`` is missing too."""
    texts, numbers = markers
    if (sep == "," and decimal != ",") or decimal == ".":
        return markers
    numbers = dict(numbers)
    kept = []
    for marker in texts:
        if not re.fullmatch(r"[+-]?\d*,\d+", marker):
            kept.append(marker)
            continue
        _one_marker_a_number(numbers, float(marker.replace(",", ".")), marker)
    return tuple(kept), numbers


def _one_marker_a_number(numbers: dict, value: float, marker: str) -> None:
    """Adds ``--missing`` ``marker`` (the number ``value``) to ``numbers``, refusing a second
    marker of the same number."""
    if value in numbers and numbers[value] != marker:
        raise InputError(
            f"--missing {marker}: the same number as --missing {numbers[value]} (numbers "
            "are matched by value); give it once"
        )
    numbers[value] = marker


def read_csv_series(
    path: str,
    time_col=None,
    value_cols=None,
    *,
    time_unit=None,
    time_format=None,
    dayfirst=None,
    calendar=None,
    notes=None,
    series_col=None,
    missing=(),
    repeated_times="refuse",
    decimal=None,
    file_lines=None,
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
    decide ambiguous dates; ``calendar``, a cftime calendar such as ``"360_day"``, reads them
    as dates of that calendar: :func:`~kalmanscan.timeseries.csv_times._calendar_times`).
    Duplicate times are refused, naming the rows, unless ``repeated_times="keep"`` (a wide
    table): then each row is an observation of the state at its time, in the file's order, with
    a note. ``decimal`` (``--decimal``):
    the value columns' decimal mark, ``"."`` or ``","`` (points then thousands separators), where
    the file leaves it open (``1.250`` in a file separated by semicolons is refused without it).
    ``file_lines``: a list that receives the file line of each time step returned (a wide
    table). Raises :class:`InputError` with a message naming the file, column, row and value.
    Rows are numbered as in a spreadsheet (the header is row 1; comment lines count).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "data.csv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("t,y,note\\n0,1.0,a\\n3,,b\\n1,1.3,c\\n")
    >>> notes = []
    >>> times, z, names, was_sorted = read_csv_series(path, "t", notes=notes)
    >>> times.tolist(), z[:, 0].tolist(), names, was_sorted
    ([0.0, 1.0, 3.0], [1.0, 1.3, nan], ['y'], False)
    >>> len(notes)  # the label column "note" was skipped, and said so
    1
    """
    import pandas as pd

    if repeated_times not in ("refuse", "keep"):
        raise ValueError(f"repeated_times: expected 'refuse' or 'keep', got {repeated_times!r}")
    if decimal not in (None, ".", ","):
        raise InputError(f"--decimal: expected . or , (the decimal mark), got {decimal!r}")
    # names as Unicode composes them (NFC): a header written in NFD (macOS) matches the option
    time_col, series_col = _nfc(time_col), _nfc(series_col)
    value_cols = None if value_cols is None else [_nfc(c) for c in value_cols]
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a CSV file")
    markers = _missing_markers(missing)
    encoding, comments, lines = _scan_file(path)
    sep, hint_line = _separator(path, encoding)
    hinted = hint_line is not None
    one_column = sep == "," and decimal == "," and not hinted
    one_column = one_column and "," not in _line(path, encoding, lines)
    if one_column:  # a file of one column with decimal commas: whole lines are its cells
        sep = ";"
    if hinted:
        lines = [i for i in lines if i != hint_line + 1]
    skip = sorted(comments + ([hint_line] if hinted else []))
    markers = _comma_markers(markers, sep, decimal)
    written, widest = _check_fields(path, encoding, sep, lines)
    if written is not None:
        written = [_nfc(c) for c in written]
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
    df.columns = [_nfc(str(c).strip()) for c in df.columns]
    _header_as_data(
        written or list(df.columns), path, sep, lines[0] if lines else 1,
        [c for c in (time_col, series_col, *(value_cols or [])) if c is not None],
    )  # fmt: skip
    if len(lines) != len(df) + 1:  # (quoted fields over several lines)
        lines = None
    # rows of separators only (,,) at the end, as spreadsheets export rows once used: dropped
    bare = _bare_rows(df)
    tail = len(df) - (int(np.flatnonzero(~bare)[-1]) + 1 if (~bare).any() else 0)
    if tail and notes is not None:
        notes.append(
            f"note: {path}: skipped the last {tail} row{'s' * (tail > 1)}: separators only, no "
            "values (rows a spreadsheet exports after the data)"
        )
    if tail:
        df, bare = df.iloc[: len(df) - tail], bare[: len(df) - tail]
    if len(df) == 0:
        raise InputError(f"{path}: has a header ({', '.join(df.columns)}) but no data rows")
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
        if (sep != "," or hinted) and not one_column:
            said = f"the first line's 'sep={sep}'" if hinted else "the header"
            notes.append(
                f"note: {path}: fields separated by {_SEP_NAMES.get(sep, repr(sep))} ({said})"
            )

    def row(i: int) -> int:
        return lines[i + 1] if lines is not None else i + 2

    if time_col is not None and bare.any():  # (one at the end was dropped above)
        i = int(np.flatnonzero(bare)[0])
        raise InputError(
            f"{path}: row {row(i)} holds separators only, no time and no value: remove the row "
            "(or start it with #)"
        )

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
    minus = _unicode_minus(df, (time_col, series_col)) if _holds(path, "\u2212", encoding) else {}
    if minus and notes is not None:
        k = sum(minus.values())
        notes.append(
            f"note: column(s) {list(minus)}: {k} number{'s' * (k > 1)} written with the minus "
            "sign U+2212 (\u2212) read as negative"
        )
    if decimal == ",":  # as --decimal says: a comma the decimal mark, points thousands
        commas = _decimal_mark(df, (time_col, series_col), path, row, decimal)
        if commas and notes is not None:
            notes.append(
                f"note: column(s) {commas}: read with --decimal , (a comma the decimal mark, a "
                "point between groups of three digits a thousands separator)"
            )
    elif sep != "," and decimal is None:
        # (where commas separate fields, a comma in a number is no decimal mark)
        # points as thousands separators first, on the cells as written
        _thousands_points(df, (time_col, series_col), path, row, sep)
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
        quarters = time_format if time_format and "%q" in time_format and not calendar else None
        if quarters:  # --time-format %Y.%q: quarters written as numbers or labels
            df[time_col] = _quarter_format(df[time_col], quarters, path, time_col, row)
            time_format = "%Y-%m-%d"
        times = _parse_times(df[time_col], path, time_col, row, time_format, dayfirst, calendar)
        if times.dtype.kind == "f" and time_format is None and calendar is None:
            _period_numbers(df[time_col], path, time_col)  # 1950.01: a month, no decimal year
        if quarters and notes is not None:
            notes.append(
                f"note: column {time_col!r} holds quarters (--time-format {quarters}): each "
                "time is the first day of its quarter"
            )
        packed = (
            _packed_date_format(df[time_col])
            if times.dtype.kind == "f" and calendar is None
            else None
        )
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
            from kalmanscan.timeseries.time_parse import interval_starts
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
            elif time_format is None and interval_starts(cells[:1]) is not None:
                notes.append(
                    f"note: column {time_col!r} holds intervals (start/end, as pandas writes "
                    "weekly periods): each time is the start of its interval"
                )
    else:
        times = np.arange(len(df), dtype=np.float64)
    if value_cols:
        names = list(value_cols)
        if time_col in names:
            raise InputError(f"--value-col {time_col!r}: that is the time column")
        z = np.column_stack(
            [
                _parse_values(df[c], path, c, row, markers[1], counts, sep=sep, decimal=decimal)
                for c in names
            ]
        )
    else:
        if time_col is None:
            _times_as_columns(cols, path)
        # columns without a name in the header (pandas names them Unnamed: k)
        if written:
            unnamed = {c for j, c in enumerate(cols) if j >= len(written) or not written[j]}
        else:
            unnamed = {c for c in cols if re.fullmatch(r"Unnamed: \d+", c)}
        names, columns, skipped, empty, index = [], [], [], [], []
        for c in cols:
            if c in (time_col, series_col):
                continue
            cell = df[c]
            parsed = pd.to_numeric(cell, errors="coerce")  # (spaces around a number are read)
            numeric = bool(parsed.notna().any())
            if numeric and c not in unnamed:  # a value column (its cells read, or named)
                names.append(c)
                columns.append(_parse_values(cell, path, c, row, markers[1], counts, parsed, sep,
                                             decimal))  # fmt: skip
                continue
            text = cell.astype(str).str.strip()
            # (NA and NaN are missing values as empty cells are: a column of them is no label)
            given = cell.notna() & (text != "") & ~text.str.lower().isin(["na", "nan"])
            if c in unnamed:
                if not given.any():
                    # no header and no value: the trailing ",," of a spreadsheet's export
                    empty.append(c)
                    continue
                start = _row_counter(text) if given.all() else None
                if start is not None:  # 0, 1, 2, ... (pandas' index) or 1, 2, 3, ... (R's)
                    index.append((c, start))
                    continue
            if not numeric and (given.any() or any(c in k for k in counts.values())):
                # (period labels, 1959Q1 as pandas writes a quarterly PeriodIndex, are times, not
                # numbers with a unit 'Q1': a column of them is skipped with a --time-col hint)
                if not _grouped_numbers(cell[given], sep) or _period_labels(text[given]):
                    skipped.append(c)  # (a column of labels, or of --missing markers only)
                    continue
            if c in unnamed:
                _refuse_unnamed(c, cols, text, given, written, path, row)
            names.append(c)
            columns.append(
                _parse_values(
                    cell, path, c, row, markers[1], counts, parsed if numeric else None, sep,
                    decimal,
                )
            )  # fmt: skip
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
                        f"({_not_a_number_hint(cells.iloc[i], sep, decimal)})"
                    )
            elif empty:
                detail = f"; column(s) {empty} have no header and no values"
            raise InputError(
                f"{path}: no numeric value columns besides the time column{detail}; name the "
                f"value columns with --value-col (columns are {cols})"
            )
        looks_timed = [
            c
            for c, col in zip(names, columns, strict=True)
            if time_col is None and _counts_times(c, col)
        ][:1]
        if looks_timed and notes is not None:
            c = looks_timed[0]
            notes.append(
                f"note: column {c!r} is read as a series; if it holds the times, pass --time-col "
                f"{shlex.quote(c)} (without it the row number is the time)"
            )
        for c, start in index if notes is not None else ():
            j = cols.index(c)
            which = "the first column" if j == 0 else f"column {j + 1}"
            source = (
                "the index pandas' to_csv writes"
                if start == 0
                else "the row names R's write.csv writes"
            )
            notes.append(
                f"note: skipped {which}: no header and the row numbers {start}, {start + 1}, "
                f"{start + 2}, ... in it ({source})"
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
    if same.size and repeated_times == "keep":
        if notes is not None:
            n = same.size
            notes.append(
                f"note: {n} row{'s' if n != 1 else ''} share{'s' if n == 1 else ''} a time with "
                "the row before (--repeated-times keep): each is an observation of the same "
                "state, in the file's order (a step of length 0)"
            )
    elif same.size:
        k = int(same[0])
        a, b = sorted((int(order[k]), int(order[k + 1])))
        more = same.size - 1
        _split_times(df, cols, times, time_col, path, row, a, b)
        raise InputError(
            f"{path}: column {time_col!r} rows {row(a)} and {row(b)} have the same time "
            f"{_show_time(st[k])}"
            + (f" ({more} more repeated time{'s' if more > 1 else ''})" if more else "")
            + "; expected one row per time: merge or average the rows of each time first, or "
            "keep each as an observation of the same state (--repeated-times keep)"
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
    if file_lines is not None:  # row(i) for each i of order, at numpy's speed
        if lines is None or isinstance(lines, range):
            at = order + (2 if lines is None else lines.start + 1)
        else:
            at = np.asarray(lines)[order + 1]
        file_lines[:] = at.tolist()
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


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 5].rsplit(",", 1)[0] + ", ..."
