"""The CSV reader's look at a file's layout, before pandas reads it: a pass over its bytes
for the encoding, NUL bytes, comment and blank lines (:func:`_scan_file`, against the
line-by-line reference :func:`_scan_lines`), the field separator (:func:`_separator`: Excel's
``sep=;`` line, else the header's), and the header's fields against the data rows'
(:func:`_check_fields`); then, on the cells as read, a header that is data
(:func:`_header_as_data`), rows of separators only (:func:`_bare_rows`), columns without a name
(row numbers: :func:`_row_counter`) and names as Unicode composes them (:func:`_nfc`). Also
:class:`InputError`, the reader's refusal, raised at every stage.
Used by :func:`kalmanscan.timeseries.csvfile.read_csv_series`; docs: docs/cli.md.
"""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np


class InputError(Exception):
    """Bad user input; the message is printed as is and the command exits with status 2."""


_SEPARATORS = (",", ";", "\t", "|")
_SEP_NAMES = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "vertical bars"}


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
    cells = [",".join(g).strip() for j, g in rows.items() if j != lines[0] and "".join(g).strip()]
    if len(header) == 1 and sep == "," and all(re.fullmatch(r"[+-]?\d*,\d+", c) for c in cells):
        raise InputError(
            f"{path}: row {i} ({','.join(f)!r}) has {len(f)} fields but the header (row "
            f"{lines[0]}: {header[0]!r}) has one: numbers with a decimal comma in a file of one "
            "column? the comma reads as the field separator; write decimal points (1.5), or pass "
            "--decimal , to read the commas as the decimal mark"
        )
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


# --- the columns and rows as read: names, a header that is data, rows of separators ---------------
_TIME_NAMES = {"year", "years", "jahr", "année", "annee", "time", "t", "date", "period", "month",
               "quarter", "day"}  # fmt: skip


def _counts_times(name: str, values: np.ndarray) -> bool:
    """Whether a value column looks like the times (for a note where no --time-col is given):
    named so (``year``, ``time``, ...), or integers rising by one step throughout."""
    if name.strip().lower() in _TIME_NAMES:
        return True
    steps = np.diff(values)
    return (
        values.size >= 3
        and bool(np.isfinite(values).all())
        and bool(np.all(values == np.round(values)))
        and steps[0] > 0
        and bool(np.all(steps == steps[0]))
    )


def _line(path: str, encoding: str, lines) -> str:
    """The text of the header, the first of ``lines`` (1-based numbers; ``""`` where none)."""
    if not len(lines):
        return ""
    with open(path, encoding=encoding, errors="replace") as fh:
        for k, text in enumerate(fh, 1):
            if k == lines[0]:
                return text
    return ""


def _holds(path: str, text: str, encoding: str) -> bool:
    """Whether the file holds ``text`` (a look at its bytes before one at its cells)."""
    needle = text.encode("utf-16-le" if encoding == "utf-16" else encoding, errors="ignore")
    if not needle:
        return False
    with open(path, "rb") as fh:
        carry = b""
        while block := fh.read(1 << 22):
            if needle in block or needle in carry + block[: len(needle)]:
                return True
            carry = block[-len(needle) :]
    return False


def _bare_rows(df) -> np.ndarray:
    """``[rows]``: the rows of ``df`` (text) whose every cell is empty (a line of separators).
    The first column's empty cells (as read: spaces before a field are skipped) are the rows
    looked at, so a large file costs one comparison."""
    import pandas as pd

    bare = np.zeros(len(df), bool)
    if not len(df.columns):
        return bare
    first = df.iloc[:, 0].to_numpy(dtype=object)
    rows = np.flatnonzero(pd.isna(first) | (first == ""))
    if rows.size:
        part = df.iloc[rows]
        empty = np.ones(rows.size, bool)
        for c in range(part.shape[1]):
            col = part.iloc[:, c]
            empty &= (col.isna() | (col.astype(str).str.strip() == "")).to_numpy()
        bare[rows] = empty
    return bare


def _row_counter(text) -> int | None:
    """0 or 1 where the cells ``text`` (stripped) are the row numbers counted from it (pandas'
    index, R's row names), else ``None``."""
    n = len(text)
    for start in (0, 1):
        if n and (text.to_numpy() == np.arange(start, start + n).astype(str)).all():
            return start
    return None


def _refuse_unnamed(c, cols, text, given, written, path, row) -> None:
    """Refuse a column of numbers without a name in the header (``year,,volume``; fields after
    the header's): it would be a series named after pandas' ``Unnamed: k``."""
    j = cols.index(c)
    i = int(np.flatnonzero(given.to_numpy())[0])
    where = (
        (f"after {cols[j - 1]!r}" if j else "the first")
        if written and j < len(written)
        else f"past the header's {len(written or cols)} names"
    )
    # pandas writes its index so (an empty first name): the times, as often as not
    index = (
        f", or pass --time-col {c!r} if they are the times (pandas' to_csv writes its index "
        "without a name)"
        if j == 0 and re.fullmatch(r"Unnamed: \d+", str(c))
        else ""
    )
    raise InputError(
        f"{path}: column {j + 1} ({where}) has no name in the header but holds numbers "
        f"({text.iloc[i]!r}, row {row(i)}): every column needs a name; name it in the header, or "
        f"name the value columns to use with --value-col{index}"
    )


def _header_as_data(header: list, path: str, sep: str, line: int, named: list) -> None:
    """Refuse a header whose every name is a number or a date (``1871,1120.0``): a file without
    a header row, whose first row of data would be taken for the names and lost. Not where an
    option names one of them (``--value-col 2020``: names meant so), nor for three or more
    years or periods (columns named by times, refused by
    :func:`~kalmanscan.timeseries.csv_times._times_as_columns`)."""
    from kalmanscan.timeseries.times import period_starts

    cells = [str(c).strip() for c in header]
    if not cells or any(not c for c in cells) or any(c in cells for c in named):
        return
    timed = [c for c in cells if re.fullmatch(r"\d{4}", c) or period_starts([c])]
    if len(timed) == len(cells) >= 3:
        return
    if not all(_data_like(c, sep) for c in cells):
        return
    shown = sep.join(cells)
    shown = shown if len(shown) <= 80 else shown[:75] + ", ..."
    raise InputError(
        f"{path}: the header (row {line}: {shown!r}) holds numbers and dates only, no column "
        "names: a file without a header row? its first row would be taken for the names and "
        "lost; add a header line naming the columns (e.g. time,value) before it, or, if these "
        "are the names, pass them to --time-col or --value-col"
    )


def _data_like(cell: str, sep: str) -> bool:
    """Whether a header cell reads as a number (``1120.0``, ``-3``, ``1,5`` where commas are
    decimal marks) or a date (``2020-01-01``, ``29.03.1958``, ``1959Q1``)."""
    try:
        return math.isfinite(float(cell.replace(",", ".") if sep != "," else cell))
    except ValueError:
        pass
    from kalmanscan.timeseries.times import period_starts

    if period_starts([cell]) is not None:
        return True
    # dates of digits and separators only (2020-01-01, 29.03.1958, 2024-03-01T12:30Z)
    if not re.fullmatch(r"\d[\d\s./:T+Z-]*", cell):
        return False
    from kalmanscan.timeseries.times import parse_datetime_strings

    try:
        return len(parse_datetime_strings([cell])) == 1
    except ValueError:
        return False


def _nfc(name):
    """A column name as Unicode composes it (NFC): ``Année`` written in NFD (as macOS writes
    file names and some exports headers) is the ``Année`` typed in a shell."""
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name
