"""The CSV reader's value cells read as numbers: :func:`_parse_values` (float64, NaN where empty,
NA or NaN, ``--missing``'s numeric markers matched by value), decimal commas in files not
separated by commas (:func:`_decimal_commas`), thousands separators refused with the number to
write (:func:`_thousands_points`, :func:`_grouped_numbers`), and what to do about a cell that is
no number (:func:`_not_a_number_hint`). Used by
:func:`kalmanscan.timeseries.csvfile.read_csv_series`; docs: docs/cli.md.
"""

from __future__ import annotations

import re
import shlex

import numpy as np

from kalmanscan.timeseries.csv_layout import InputError

_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
# spaces as thousands separators, as French and SI exports write them (1 680,0): a space, or a
# no-break, thin or narrow no-break space; refused as commas and points are (docs/cli.md)
_SPACES = {" ": "a space", "\u00a0": "U+00A0, a no-break space", "\u2009": "U+2009, a thin space",
           "\u202f": "U+202F, a narrow no-break space"}  # fmt: skip
# (the spaces themselves in the class, not \u escapes, which some regular-expression engines
# refuse: pandas 3.0's pyarrow strings)
_SPACE_THOUSANDS = re.compile(r"^[+-]?\d{1,3}([" + "".join(_SPACES) + r"]\d{3})+([.,]\d*)?$")


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
