"""The CSV reader's value cells read as numbers: :func:`_parse_values` (float64, NaN where empty,
NA or NaN, ``--missing``'s numeric markers matched by value), decimal commas in files not
separated by commas (:func:`_decimal_commas`, a column mixing marks refused naming the odd cell),
``--decimal``'s mark (:func:`_decimal_mark`), thousands separators refused with the number to
write (:func:`_thousands_points`, :func:`_grouped_numbers`), the minus sign U+2212 read
(:func:`_unicode_minus`), and what to do about a cell that is no number
(:func:`_not_a_number_hint`: percent and currency signs, units, brackets named as such). Used by
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
        if not given.any():
            continue
        if text[given].str.contains(".", regex=False).any():
            _mixed_marks(text, c, path, row)  # 1,0 beside 5.2: the odd one out named
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
# a number a thousands separator can have made: no leading 0 (0.125 is a decimal)
_POINT_GROUPED = r"[+-]?[1-9]\d{0,2}(\.\d{3})+"
_COMMA_DECIMAL = r"[+-]?\d*,\d+"
_POINT_DECIMAL = r"[+-]?\d*\.\d+"


def _mixed_marks(text, c, path, row) -> None:
    """Refuse a column written with decimal commas and decimal points (``1,0`` beside ``5.2``),
    naming a cell of the fewer kind, the odd one out (the point where they are as many: in a
    file not separated by commas the comma is the decimal mark). A column whose points all
    group thousands (``1.234,5``) is left to the thousands check."""
    commas = text.str.fullmatch(_COMMA_DECIMAL).fillna(False).to_numpy()
    points = text.str.fullmatch(_POINT_DECIMAL).fillna(False).to_numpy()
    if not commas.any() or not points.any():
        return
    grouped = text.str.fullmatch(_POINT_GROUPED).fillna(False).to_numpy()
    if not (points & ~grouped).any():  # 1.250 beside 2,5: the thousands check names it
        return
    odd, usual = (commas, points) if commas.sum() < points.sum() else (points & ~grouped, commas)
    i, j = int(np.flatnonzero(odd)[0]), int(np.flatnonzero(usual)[0])
    cell, other = text.iloc[i], text.iloc[j]
    if odd is commas:
        what, fix = "a decimal comma", cell.replace(",", ".")
        usual_mark = "decimal points"
    else:
        what, fix = "a decimal point", cell.replace(".", ",")
        usual_mark = "decimal commas"
    raise InputError(
        f"{path}: column {c!r} row {row(i)}: {cell!r} has {what} where the column's other numbers "
        f"have {usual_mark} ({other!r}, row {row(j)}); write {fix}"
    )


def _thousands_points(df, skip: tuple, path: str, row, sep: str = "\t") -> None:
    """Refuse a column written with points as thousands separators (``1.120`` beside ``963``,
    as spreadsheets write in countries with decimal commas), which would read as 1.12: every
    cell with a point is grouped in threes, and some other cell is an integer without one, or
    another column of the file writes decimals with commas (``11,2``). In a file separated by
    semicolons (``sep``), where the comma is the decimal mark, a column whose every point is
    followed by three digits (``1.250``, ``13.415``) is refused as well: it reads both ways
    (``--decimal`` says which)."""
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
        if not text[pointed].str.fullmatch(_POINT_GROUPED).all():
            continue  # (1.234,5: refused as written, naming the number to write)
        option = "or pass --decimal , to read points as thousands separators"
        many = pointed & text.str.count(r"\.").gt(1)
        decimals = text.str.fullmatch(_COMMA_DECIMAL)
        if many.any() or decimals.any():  # 1.250.000, or 2,5 beside: thousands, unambiguously
            j = int(np.flatnonzero((many if many.any() else decimals).to_numpy())[0])
            why = (
                f"as in {text.iloc[j]!r}, row {row(j)}"
                if many.any()
                else f"the column writes decimals with commas: {text.iloc[j]!r}, row {row(j)}"
            )
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {text.iloc[i]!r} has a point as a thousands "
                f"separator ({why}); {fix}, {option}"
            )
        if sep == ";":
            cell = text.iloc[i]
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {cell!r} reads as {float(cell):.15g} (a "
                f"decimal point) and as {cell.replace('.', '')} (a point as the thousands "
                "separator, as spreadsheets write where the comma is the decimal mark), and every "
                "point in the column is followed by three digits, in a file separated by "
                "semicolons; pass --decimal . to read the points as decimal points, or --decimal , "
                "to read them as thousands separators (and commas as the decimal mark)"
            )


def _decimal_mark(df, skip: tuple, path: str, row, decimal: str) -> list[str]:
    """The value cells of ``df`` read with the decimal mark ``decimal`` (``--decimal``): with
    ``","`` a comma is the decimal mark and a point a thousands separator between groups of
    three digits (``13.415`` is 13415, ``1.234,5`` 1234.5), rewritten in place as numbers with a
    decimal point; a point anywhere else (``5.2``) is refused. With ``"."`` nothing is rewritten
    (a point is the decimal mark, as written). Returns the columns rewritten."""
    if decimal != ",":
        return []
    found = []
    for c in df.columns:
        if c in skip:
            continue
        text = df[c].where(df[c].isna(), df[c].astype(str).str.strip())
        given = text.notna() & (text != "")
        comma = given & text.str.fullmatch(r"[+-]?(\d+(,\d*)?|,\d+)").fillna(False)
        grouped = given & text.str.fullmatch(_POINT_GROUPED + r"(,\d*)?").fillna(False)
        stray = given & text.str.contains(".", regex=False).fillna(False) & ~grouped
        stray &= text.str.fullmatch(r"[+-]?[\d.,]+").fillna(False)  # (texts are named later)
        if stray.any():
            i = int(np.flatnonzero(stray.to_numpy())[0])
            cell = text.iloc[i]
            raise InputError(
                f"{path}: column {c!r} row {row(i)}: {cell!r} has a point that is no thousands "
                "separator (with --decimal , a point stands between groups of three digits, "
                f"as in 13.415); write {cell.replace('.', ',')} if the point is the decimal mark"
            )
        hit = comma | grouped
        if hit.any():
            plain = text[hit].str.replace(".", "", regex=False).str.replace(",", ".", regex=False)
            df[c] = df[c].mask(hit, plain)
            found.append(c)
    return found


# numbers written as no reader reads them, named by _not_a_number_hint with the number to write
_NUMBER = r"[+-]?\d+(?:[.,]\d+)?"
_PERCENT = re.compile(rf"({_NUMBER})\s*%")  # 5.8%
_CURRENCY = re.compile(rf"([$€£¥])\s*({_NUMBER})|({_NUMBER})\s*(?:[$€£¥]|EUR|USD|GBP|CHF)")
_BRACKETED = re.compile(rf"\(\s*({_NUMBER})\s*\)")  # (5,2): a negative number in accounts
_DASHED = re.compile("([\u2012\u2013\u2014\u2212])" + r"\s*(\d[\d.,]*)")  # –5.2: an en dash
_APOSTROPHES = re.compile(r"[+-]?\d{1,3}(['" + "\u2019" + r"]\d{3})+(\.\d*)?")  # 1'120.5
_COMMA = re.compile(r"[+-]?\d*,\d+")  # 12,5 (a decimal comma where commas are no decimal mark)
# 1120 m3, 12 °C: a word with a letter (or a degree sign) after the number
_UNIT = re.compile(rf"({_NUMBER})\s*([^\d\s.,+-]*(?:[^\W\d_]|°)\S*)")


def _grouped_numbers(cells, sep: str = ",") -> bool:
    """Whether a column's filled cells, none a number as written, are all numbers written as
    no reader reads them: with thousands separators (``1,120``, ``1.120,5``, ``1 120``,
    ``1'120``), a percent or currency sign, a unit, in brackets, after a dash, or with a decimal
    comma in a file separated by commas (``sep``): a value column, refused naming the fix, not
    labels to skip."""
    text = [str(c).strip() for c in cells]
    # (Python's re, not pandas' str.match: under pandas 3.0 pyarrow strings take the patterns
    # to RE2, which refused the class's \u escapes: every file failed to read)
    pats = (_THOUSANDS, _POINT_THOUSANDS, _SPACE_THOUSANDS, _PERCENT, _CURRENCY, _BRACKETED,
            _DASHED, _APOSTROPHES, *((_COMMA,) if sep == "," else ()))  # fmt: skip

    def written(c: str) -> bool:
        if any(p.fullmatch(c) for p in pats):
            return True
        m = _UNIT.fullmatch(c)  # (a unit; 1-3 letters are a flag: 12.3 p)
        return m is not None and not re.fullmatch(r"[A-Za-z]{1,3}", m[2])

    return len(text) > 0 and all(written(c) for c in text)


def _not_a_number_hint(cell: str, sep: str = ",", decimal: str | None = None) -> str:
    """What to do about a value cell (stripped, as the file holds it) that is not a number: for
    thousands separators, the number to write; for a marker, the ``--missing`` option with the
    exact text to pass (quoted for a shell where needed, and in the ``--missing=TEXT`` form for
    a text that starts with ``-``, which would otherwise read as an option: ``--missing=-n/a``,
    ``--missing=' --'``). ``sep``: the file's field separator (where it is a comma, a decimal
    comma is to be written as a point); ``decimal``: ``--decimal``'s mark. A percent or
    currency sign, a unit, a negative number in brackets, an en dash for a minus sign and an
    apostrophe as the thousands separator are named as such, with the number to write, never
    ``--missing``."""
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
    m = _PERCENT.fullmatch(cell)
    if m:  # 5.8% (a rate written with its percent sign)
        return f"a percent sign is not read: write the number alone, {m[1]}"
    m = _CURRENCY.fullmatch(cell)
    if m:  # 5,2 €, $5.20
        return f"a currency sign is not read: write the number alone, {m[2] or m[3]}"
    m = _BRACKETED.fullmatch(cell)
    if m:  # (5,2): a negative number as accounts write it
        return f"a negative number in brackets is not read: write -{m[1]}"
    m = _DASHED.fullmatch(cell)
    if m:  # a dash for a minus sign (U+2212 before a number is read: _unicode_minus)
        return (
            f"the dash before the number is U+{ord(m[1]):04X}, not the minus sign '-': write "
            f"-{m[2]}"
        )
    if _APOSTROPHES.fullmatch(cell):  # 1'120.5: the Swiss thousands separator
        plain = cell.replace("'", "").replace("\u2019", "")
        return (
            f"thousands separators are not read: write {plain}; the separator here is an apostrophe"
        )
    if sep == "," and decimal != "." and _COMMA.fullmatch(cell):  # "12,5", quoted
        return (
            f"a decimal comma in a file separated by commas: write {cell.replace(',', '.')}, or "
            "pass --decimal , to read commas as the decimal mark"
        )
    if decimal == "." and _COMMA.fullmatch(cell):
        return f"--decimal . reads points as the decimal mark: write {cell.replace(',', '.')}"
    m = _UNIT.fullmatch(cell)
    if m and not re.fullmatch(r"[A-Za-z]{1,3}", m[2]):  # (1-3 letters: a flag, below)
        return (
            f"a number with a unit ({m[2]!r}) is not read: write the number alone, {m[1]} (the "
            "unit can go in the column's name)"
        )
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


def _unicode_minus(df, skip: tuple) -> dict[str, int]:
    """Value cells written with the minus sign U+2212 (``−5.2``, as typeset tables and some
    exports write negative numbers) rewritten in place with the hyphen-minus, which numbers
    are read with; ``{column: cells}``."""
    found = {}
    for c in df.columns:
        if c in skip:
            continue
        text = df[c].astype(str)
        hit = text.str.contains("\u2212", regex=False).fillna(False)
        if not hit.any():
            continue
        fixed = text.str.replace(r"^(\s*)\u2212(?=\s*[\d.,])", r"\1-", regex=True)
        hit &= fixed != text
        if hit.any():
            df[c] = df[c].mask(hit, fixed.str.replace(r"^(\s*)-\s+", r"\1-", regex=True))
            found[c] = int(hit.sum())
    return found


def _parse_values(
    col, path, name, row=None, numbers=None, counts=None, parsed=None, sep=",", decimal=None
):
    """A value column's cells as float64, NaN where empty, NA or NaN; a cell equal in value to
    one of ``numbers`` (``{value: marker}``, ``--missing``'s numeric markers) is NaN too, counted
    in ``counts[marker][name]``. Refuses a cell that is no number, naming its row (and the other
    texts in the column that are none), and infinite values. ``parsed``: the column through
    ``pd.to_numeric(col, errors="coerce")``, where the caller has it; ``sep``: the file's field
    separator and ``decimal`` ``--decimal``'s mark (for :func:`_not_a_number_hint`)."""
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
                f"({_not_a_number_hint(first, sep, decimal)})"
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
