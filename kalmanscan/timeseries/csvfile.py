"""The CSV reader of ``kalmanscan filter``: :func:`read_csv_series` and its helpers.

One pass over the file's bytes finds its encoding, comment and blank lines
(:func:`_scan_file`); the separator is read from the header (:func:`_separator`), the fields
checked against it (:func:`_check_fields`), and pandas reads the cells as text; the time column
(:func:`_parse_times`) and the value columns (:func:`_parse_values`, with ``--missing``'s markers)
are then parsed here, so every refusal names the file, column, row and cell. Docs: docs/cli.md.
"""

from __future__ import annotations

import math
import os
import re
import shlex

import numpy as np


class InputError(Exception):
    """Bad user input; the message is printed as is and the command exits with status 2."""


_SEPARATORS = (",", ";", "\t", "|")
_SEP_NAMES = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "vertical bars"}
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
# spaces as thousands separators, as French and SI exports write them (1 680,0): a space, or a
# no-break, thin or narrow no-break space; refused as commas and points are (docs/cli.md)
_SPACES = {" ": "a space", "\u00a0": "U+00A0, a no-break space", "\u2009": "U+2009, a thin space",
           "\u202f": "U+202F, a narrow no-break space"}  # fmt: skip
# (the spaces themselves in the class, not \u escapes, which some regular-expression engines
# refuse: pandas 3.0's pyarrow strings)
_SPACE_THOUSANDS = re.compile(r"^[+-]?\d{1,3}([" + "".join(_SPACES) + r"]\d{3})+([.,]\d*)?$")


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
    """How many times ``sep`` splits a CSV line, outside quoted fields.

    >>> _splits('2024-01-01,"1,5",2', ","), _splits("a;b;c", ",")
    (2, 0)
    """
    import csv

    try:
        return len(next(csv.reader([line.strip("\r\n")], delimiter=sep))) - 1
    except (csv.Error, StopIteration):
        return line.count(sep)


def _decimal_commas(df, skip: tuple, path: str = "", row=None) -> list[str]:
    """Columns of ``df`` (text) written with a decimal comma (``12,5``): some cell is no number
    as written but is one with its comma read as a point, and no cell holds a point. The cells
    that are then numbers are rewritten in place with points (any other cell stays as written,
    for a message to quote it as the file holds it); the columns' names returned. Only for files
    not separated by commas.

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
            df[c] = df[c].mask(after, swapped)
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
        z = np.column_stack(
            [_parse_values(df[c], path, c, row, markers[1], counts, sep=sep) for c in names]
        )
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
                columns.append(_parse_values(cell, path, c, row, markers[1], counts, parsed, sep))
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
            if (
                (given.any() or any(c in k for k in counts.values()))
                and not numeric.any()
                and not _grouped_numbers(cell[given])
            ):
                skipped.append(c)  # (a column of labels, or of --missing markers only)
                continue
            names.append(c)
            columns.append(_parse_values(cell, path, c, row, markers[1], counts, sep=sep))
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
                        f"({_not_a_number_hint(cells.iloc[i], sep)})"
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

    from kalmanscan.timeseries.times import (
        TimeParseError,
        _parse_fixed_iso,
        parse_datetime_strings,
    )

    if time_format is None:  # ISO 8601 in one layout (no space, no number): read at once
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


def _grouped_numbers(cells) -> bool:
    """Whether a column's filled cells, none a number as written, are all numbers with
    thousands separators (``1,120``, ``1.120,5``, ``1 120``): a value column, refused naming
    the fix, not labels to skip."""
    text = [str(c).strip() for c in cells]
    # (Python's re, not pandas' str.match: under pandas 3.0 pyarrow strings take the patterns
    # to RE2, which refused the class's \u escapes: every file failed to read)
    pats = (_THOUSANDS, _POINT_THOUSANDS, _SPACE_THOUSANDS)
    return len(text) > 0 and all(any(p.match(c) for p in pats) for c in text)


def _not_a_number_hint(cell: str, sep: str = ",") -> str:
    """What to do about a value cell (stripped, as the file holds it) that is not a number: for
    thousands separators, the number to write; for a marker, the ``--missing`` option with the
    exact text to pass (quoted for a shell where needed, and in the ``--missing=TEXT`` form for
    a text that starts with ``-``, which would otherwise read as an option: ``--missing=-n/a``,
    ``--missing=' --'``). ``sep``: the file's field separator (where it is a comma, a decimal
    comma is to be written as a point)."""
    missing = "leave the cell empty or write NaN for a missing value"
    # a text starting with - would read as an option: the = form; argparse drops a bare --,
    # which is given after a space (markers are matched stripped)
    quoted = shlex.quote(" --" if cell == "--" else cell)
    given = f"--missing={quoted}" if cell.startswith("-") else f"--missing {quoted}"
    option = f"pass {given} to read every such cell as missing"
    if _THOUSANDS.match(cell):
        return f"thousands separators are not read: write {cell.replace(',', '')}"
    if _POINT_THOUSANDS.match(cell):
        return f"thousands separators are not read: write {cell.replace('.', '')}"
    if _SPACE_THOUSANDS.match(cell):
        number = "".join(c for c in cell if c not in _SPACES)
        if sep == ",":  # (a decimal comma is read in files not separated by commas only)
            number = number.replace(",", ".")
        space = next(c for c in _SPACES if c in cell)
        named = "" if space == " " else f"; the separator here is {_SPACES[space]}"
        return f"thousands separators are not read: write {number}{named}"
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


def _parse_values(col, path, name, row=None, numbers=None, counts=None, parsed=None, sep=","):
    """A value column's cells as float64, NaN where empty, NA or NaN; a cell equal in value to
    one of ``numbers`` (``{value: marker}``, ``--missing``'s numeric markers) is NaN too, counted
    in ``counts[marker][name]``. Refuses a cell that is no number, naming its row (and the other
    texts in the column that are none), and infinite values. ``parsed``: the column through
    ``pd.to_numeric(col, errors="coerce")``, where the caller has it; ``sep``: the file's field
    separator (for :func:`_not_a_number_hint`)."""
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
                f"({_not_a_number_hint(first, sep)})"
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


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 5].rsplit(",", 1)[0] + ", ..."
