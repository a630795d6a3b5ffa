"""Timestamp strings read as datetime64: the string parse of the time axes.

Strings are parsed with one format for the whole column, never row by row: ISO 8601 when every
value is ISO, else the one format (e.g. ``%d/%m/%Y``) that reads every value. When two formats
read every value differently (``03/04/1958``: day first or month first?) the dates are refused
with a message naming the ambiguity, unless ``dayfirst`` or an explicit ``time_format`` decides.
Times with a UTC offset (``2024-03-01T12:30+01:00``) are converted to UTC; a column mixing
times with and without an offset is refused. Quarter and month labels (``1959Q1``, ``1959M01``)
stand for the first day of their period, ISO 8601 intervals (``1999-12-27/2000-01-02``, as
pandas writes a weekly period) for the time they start. A column written in one ISO 8601 layout
(``2024-03-01 12:30:00``, years 1678-2261) is read in numpy at once (:func:`_parse_fixed_iso`),
giving what the general parse gives.

:func:`parse_datetime_strings` is the parse; :func:`period_starts` reads period labels and
:func:`has_utc_offsets` tells whether strings carry offsets. Used by
:func:`~kalmanscan.timeseries.times.as_time_axis` and the CSV reader.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import warnings

import numpy as np

from kalmanscan.timeseries.time_calendar import _NS_PER, _normalize_datetimes


class TimeParseError(ValueError):
    """A timestamp that cannot be read; ``index`` is its 0-based position, ``value`` its text."""

    def __init__(self, message: str, index: int | None = None, value=None):
        super().__init__(message)
        self.index, self.value = index, value


_ISO = re.compile(
    r"^[+-]?\d{4}(-\d{2}(-\d{2}([T ]\d{2}(:\d{2}(:\d{2}([.,]\d+)?)?)?)?)?)?"
    r"\s*(Z|[+-]\d{2}(:?\d{2})?)?$"
)
_OFFSET = re.compile(
    r"\d{1,2}:\d{2}(:\d{2}([.,]\d+)?)?\s*(Z|[+-]\d{2}(:?\d{2}(:\d{2})?)?|UTC|GMT)$"
)
# an offset with seconds (local mean time: pandas writes Berlin before 1893 as +00:53:28), which
# pandas does not read: the local time and the offset are read apart (_apply_second_offsets)
_SECOND_OFFSET = re.compile(r"(?<=\d)\s*([+-])(\d{2}):(\d{2}):(\d{2})$")


def has_utc_offsets(values) -> bool:
    """Whether timestamp strings carry UTC offsets (``Z``, ``+02:00``, ``UTC``), which
    :func:`parse_datetime_strings` applies, giving times in UTC.

    >>> has_utc_offsets(["2024-05-07T10:00:00+02:00"]), has_utc_offsets(["2024-05-07 10:00"])
    (True, False)
    """
    return any(_OFFSET.search(str(v).strip()) for v in np.asarray(values, dtype=object).ravel())


_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)")

# period labels of statistical offices and pandas: quarters (1959Q1, 1959-Q1, 1959 q1, Q1 1959,
# Q1-1959) and months (1959M01, 1959M1)
_QUARTER = re.compile(
    r"^(?:(?P<y>\d{4})[-\s]?[Qq](?P<q>[1-4])|[Qq](?P<q2>[1-4])[-\s]?(?P<y2>\d{4}))$"
)
_MONTH = re.compile(r"^(?P<y>\d{4})-?[Mm](?P<m>0?[1-9]|1[0-2])$")
# half-years (Eurostat's 2007-S1, 2007H1) and ISO weeks (2020-W05, 2020W05)
_HALF = re.compile(r"^(?P<y>\d{4})-?[SsHh](?P<h>[12])$")
_WEEK = re.compile(r"^(?P<y>\d{4})-?[Ww](?P<w>0[1-9]|[1-4]\d|5[0-3])$")


def period_starts(values) -> tuple[list[str], str] | None:
    """Quarter, month, half-year or ISO week labels as the ISO dates their periods start, and
    the period's name.

    ``None`` unless every value is such a label, all of one kind.

    >>> period_starts(["1959Q1", "1959Q2", "1960-Q4"])
    (['1959-01-01', '1959-04-01', '1960-10-01'], 'quarter')
    >>> period_starts(["Q3 2001", "2001M12"]) is None
    True
    >>> period_starts(["1998M1", "1998M10"])
    (['1998-01-01', '1998-10-01'], 'month')
    >>> period_starts(["2020-W01", "2020W05"]), period_starts(["2007-S1", "2007H2"])
    ((['2019-12-30', '2020-01-27'], 'week'), (['2007-01-01', '2007-07-01'], 'half-year'))
    """
    values = np.asarray(values, dtype=object).ravel()
    if values.size == 0 or not any(p.match(str(values[0]).strip()) for p, _, _ in _PERIODS):
        return None  # (the first value tells: no need to read a million)
    strs = [str(v).strip() for v in values]
    for pattern, kind, start in _PERIODS:
        if pattern.match(strs[0]):
            found = [pattern.match(s) for s in strs]
            if all(found):
                try:
                    return [start(m) for m in found], kind
                except ValueError:  # a label of no period (2021-W53)
                    return None
    return None


# ISO 8601 time intervals ``start/end`` of two dates or datetimes, as pandas writes a weekly
# period (1999-12-27/2000-01-02); a text of this start and a slash is meant as one
_ISO_TIME = (
    r"[+-]?\d{4}-\d{2}-\d{2}(?:[T ]\d{2}(?::\d{2}(?::\d{2}(?:[.,]\d+)?)?)?)?"
    r"(?:\s*(?:Z|[+-]\d{2}(?::?\d{2})?))?"
)
_INTERVAL = re.compile(rf"^(?P<s>{_ISO_TIME})\s*/\s*(?P<e>{_ISO_TIME})$")
_INTERVAL_LIKE = re.compile(r"^[+-]?\d{4}-\d{2}-\d{2}[^/]*/")


def interval_starts(values) -> tuple[list[str], list[str]] | None:
    """``(starts, ends)``: the texts of ISO 8601 intervals ``start/end`` (two dates or
    datetimes, as pandas writes a weekly period: ``1999-12-27/2000-01-02``), or ``None`` unless
    every value is such an interval. An interval is read as the time it starts
    (:func:`parse_datetime_strings`).

    >>> interval_starts(["1999-12-27/2000-01-02", "2000-01-03 / 2000-01-09"])
    (['1999-12-27', '2000-01-03'], ['2000-01-02', '2000-01-09'])
    >>> interval_starts(["1999-12-27", "2000-01-03/2000-01-09"]) is None
    True
    """
    values = np.asarray(values, dtype=object).ravel()
    if values.size == 0 or not _INTERVAL_LIKE.match(str(values[0]).strip()):
        return None  # (the first value tells: no need to read a million)
    found = [_INTERVAL.match(str(v).strip()) for v in values]
    if not all(found):
        return None
    return [m["s"] for m in found], [m["e"] for m in found]


def _parse_intervals(strs: list[str], name: str, dayfirst) -> np.ndarray | None:
    """The starts of a column of ISO 8601 intervals ``start/end`` (:func:`interval_starts`) as
    :func:`parse_datetime_strings` gives times, ``None`` where the values are no intervals;
    refusing (:class:`TimeParseError`) intervals mixed with other times, texts that start like
    an interval but are none (``2000-01-03/``, ``2000-01-03/P1W``, ``2000-01-03/09``), ends that
    are no time and intervals that end before they start."""
    if not any(_INTERVAL_LIKE.match(s) for s in strs[:20]):
        return None
    like = [bool(_INTERVAL_LIKE.match(s)) for s in strs]
    whole = [_INTERVAL.match(s) for s in strs]
    example = "1999-12-27/2000-01-02"
    if not all(whole):
        if sum(like) < len(strs) / 2:
            return None  # (mostly other times: the parse names the interval it cannot read)
        i = next(k for k, m in enumerate(whole) if m is None)
        others = next((m[0] for m in whole if m is not None), None)
        what = (
            "not an interval of two dates or datetimes start/end, like "
            + (f"{example!r}" if others is None else f"the others: {others!r}")
            if like[i]
            else f"the other values are intervals (start/end) like {strs[like.index(True)]!r}"
        )
        raise TimeParseError(
            f"{name}: cannot parse {strs[i]!r} (position {i}) as a time ({what})", i, strs[i]
        )
    parts = {}
    for side in ("s", "e"):
        texts = [m[side] for m in whole]
        try:
            parts[side] = parse_datetime_strings(texts, name, dayfirst=dayfirst)
        except TimeParseError as err:
            i = err.index if err.index is not None else 0
            which = "start" if side == "s" else "end"
            raise TimeParseError(
                f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (an interval "
                f"start/end, its {which} {texts[i]!r} no date or time)",
                i,
                strs[i],
            ) from err
    start, end = _normalize_datetimes(parts["s"]), _normalize_datetimes(parts["e"])
    back = end < start
    if back.any():
        i = int(np.flatnonzero(back)[0])
        raise TimeParseError(
            f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (an interval "
            "start/end that ends before it starts)",
            i,
            strs[i],
        )
    return start


def _quarter_start(m) -> str:
    return f"{m['y'] or m['y2']}-{3 * int(m['q'] or m['q2']) - 2:02d}-01"


# each kind of period label: its pattern, its name, the ISO date its period starts on (an ISO
# week on its Monday; week 53 only in some years: ValueError)
_PERIODS = (
    (_QUARTER, "quarter", _quarter_start),
    (_MONTH, "month", lambda m: f"{m['y']}-{int(m['m']):02d}-01"),
    (_HALF, "half-year", lambda m: f"{m['y']}-{'01' if m['h'] == '1' else '07'}-01"),
    (_WEEK, "week", lambda m: _dt.date.fromisocalendar(int(m["y"]), int(m["w"]), 1).isoformat()),
)


def _guess_formats(strs: list[str]) -> list[str]:
    from pandas.tseries.api import guess_datetime_format

    n = len(strs)
    picks = sorted(
        set(list(range(min(n, 20))) + list(np.linspace(0, n - 1, min(n, 20)).astype(int)))
    )
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in picks:
            for dayfirst in (False, True):
                fmt = guess_datetime_format(strs[i], dayfirst=dayfirst)
                if fmt is None and _pandas_parses_ns_only():
                    # pandas 2 guesses nothing for a year outside 1677-2262; the format does not
                    # depend on the year, so guess it from the value in another year (every
                    # candidate is checked on all values afterwards)
                    other = _YEAR.sub("2000", strs[i], count=1)
                    fmt = guess_datetime_format(other, dayfirst=dayfirst)
                if fmt is None or fmt in found:
                    continue
                # year first, then day before month (%Y-%d-%m) is not a format people write
                y, d, m = (fmt.find(c) for c in ("%Y", "%d", "%m"))
                if 0 <= y < d < m:
                    continue
                found.append(fmt)
    if not found:  # month names with a year, which pandas guesses nothing for: Jan 1950
        for fmt in _MONTH_YEAR:
            try:
                _dt.datetime.strptime(strs[0], fmt)
            except ValueError:
                continue
            found.append(fmt)
    return found


_MONTH_YEAR = ("%b %Y", "%B %Y", "%b-%Y", "%B-%Y", "%Y %b", "%Y %B", "%Y-%b")
_TWO_DIGIT_YEAR = re.compile(r"^\d{1,2}([/.-])\d{1,2}\1\d{2}$")


def _date_part(fmt: str) -> str | None:
    """The date of a format that writes a date, then a time (``%d/%m/%Y %H:%M`` ->
    ``%d/%m/%Y``): spreadsheets write a midnight as the date alone. None for any other format.

    >>> _date_part("%d/%m/%Y %H:%M"), _date_part("%m/%d/%Y %I:%M %p"), _date_part("%d/%m/%Y")
    ('%d/%m/%Y', '%m/%d/%Y', None)
    """
    at = [i for i in (fmt.find("%H"), fmt.find("%I")) if i > 0]
    if not at:
        return None
    day, rest = fmt[: min(at)].rstrip(" T"), fmt[min(at) :]
    if not day or any(c in rest for c in ("%d", "%m", "%Y", "%y", "%b", "%B", "%j")):
        return None
    return day if any(c in day for c in ("%d", "%j")) else None


def _dayfirst(fmt: str) -> bool:
    d, m = fmt.find("%d"), fmt.find("%m")
    return 0 <= d < m


def parse_datetime_strings(
    values, name: str = "times", *, time_format: str | None = None, dayfirst: bool | None = None
) -> np.ndarray:
    """Parse timestamp strings with one format for all of them: ``datetime64`` (UTC if offsets).

    ``time_format`` (strftime codes, e.g. ``"%d/%m/%Y"``, or ``"ISO8601"``) reads every value with
    that format. Otherwise ISO 8601 when every value is ISO, else the single format that reads
    every value; if day-first and month-first formats both read every value differently,
    ``dayfirst`` picks one and without it the dates are refused. A format with a time of day
    reads a value written as the date alone as its midnight (spreadsheets' ``13/02/2020`` beside
    ``13/02/2020 06:00``); UTC offsets with seconds (``+00:53:28``) are applied exactly
    (:func:`_apply_second_offsets`). Quarter labels (``1959Q1``,
    ``1959-Q1``, ``Q1 1959``) and month labels (``1959M01``) read as the first day of their
    period (:func:`period_starts`); ISO 8601 intervals ``start/end`` of two dates or datetimes
    (``1999-12-27/2000-01-02``, pandas' text of a weekly period) as the time they start
    (:func:`interval_starts`; intervals mixed with other times, malformed ones and those ending
    before they start are refused). Raises :class:`TimeParseError`
    (a ``ValueError``) naming the position and text of the first value that cannot be read.

    >>> parse_datetime_strings(["29/03/1958", "30/03/1958"]).tolist()[0].isoformat()
    '1958-03-29T00:00:00'
    >>> try:
    ...     parse_datetime_strings(["01/03/1958", "02/03/1958"])
    ... except ValueError as err:
    ...     print(str(err)[:55])
    times: ambiguous dates: '01/03/1958' (position 0) reads
    >>> parse_datetime_strings(["01/03/1958"], dayfirst=True).tolist()[0].isoformat()
    '1958-03-01T00:00:00'
    """
    import pandas as pd

    if time_format is None:
        fixed = _parse_fixed_iso(values)
        if fixed is not None:
            return fixed
    strs = [str(v).strip() for v in np.asarray(values, dtype=object).ravel()]
    if not strs:
        return np.array([], dtype="datetime64[s]")
    for i, s in enumerate(strs):
        if s == "" or s.lower() in ("nat", "nan", "none", "na"):
            raise TimeParseError(f"{name}: expected a time, got {s!r} at position {i}", i, s)
    if time_format is None:  # ISO 8601 intervals start/end: each the time it starts
        starts = _parse_intervals(strs, name, dayfirst)
        if starts is not None:
            return starts
    has_offset = [bool(_OFFSET.search(s)) for s in strs]
    utc = any(has_offset)
    if utc and not all(has_offset):
        i = has_offset.index(False)
        j = has_offset.index(True)
        raise TimeParseError(
            f"{name}: {strs[j]!r} (position {j}) has a UTC offset but {strs[i]!r} (position {i}) "
            "has none; give every time an offset or none",
            i,
            strs[i],
        )
    if utc and any(_SECOND_OFFSET.search(s) for s in strs):  # (pandas' %z drops the seconds)
        return _apply_second_offsets(strs, name, dayfirst, time_format)

    def attempt(fmt):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = pd.to_datetime(pd.Series(strs), format=fmt, errors="coerce", utc=utc)
                day = _date_part(fmt)
                if day is not None and out.isna().any():  # midnights written as the date alone
                    gap = out.isna().to_numpy()
                    alone = pd.to_datetime(
                        pd.Series(strs)[gap], format=day, errors="coerce", utc=utc
                    )
                    if alone.notna().any():
                        out = out.astype(alone.dtype) if out.isna().all() else out
                        out[gap] = alone.astype(out.dtype)
            except (ValueError, TypeError, OverflowError):
                return None
        if utc:
            out = out.dt.tz_convert("UTC").dt.tz_localize(None)
        elif getattr(out.dt, "tz", None) is not None:
            out = out.dt.tz_localize(None)
        if out.isna().any() and _pandas_parses_ns_only():
            out = _outside_ns_window(out, strs, fmt, utc)
        return out

    def fail(fmt, out, what):
        bad = out.isna().to_numpy() if out is not None else np.ones(len(strs), bool)
        i = int(np.flatnonzero(bad)[0])
        raise TimeParseError(
            f"{name}: cannot parse {strs[i]!r} (position {i}) as a time ({what})", i, strs[i]
        )

    if time_format is not None:
        out = attempt(time_format)
        if out is None or out.isna().any():
            fail(time_format, out, f"expected the format {time_format!r}")
        return _to_numpy_datetimes(out)
    periods = period_starts(strs) if time_format is None else None
    if periods is not None:  # each time the first day of its quarter or month
        given, strs = strs, periods[0]
        out = attempt("%Y-%m-%d")
        if out is None or out.isna().any():
            bad = out.isna().to_numpy() if out is not None else np.ones(len(strs), bool)
            i = int(np.flatnonzero(bad)[0])
            raise TimeParseError(
                f"{name}: cannot parse {given[i]!r} (position {i}) as a time (its {periods[1]} "
                f"starts on {strs[i]}, which is no date)",
                i,
                given[i],
            )
        return _to_numpy_datetimes(out)
    for pattern, kind, _ in _PERIODS:
        if time_format is not None or not any(pattern.match(s) for s in strs[:20]):
            continue
        labels = [bool(pattern.match(s)) for s in strs]
        if all(labels):  # every one a label, one of them of no period (2021-W53)
            i = next(k for k, s in enumerate(strs) if period_starts([s]) is None)
            raise TimeParseError(
                f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (no such {kind})",
                i,
                strs[i],
            )
        if sum(labels) >= len(strs) / 2:  # mostly period labels: name the first that is not one
            i = labels.index(False)
            raise TimeParseError(
                f"{name}: cannot parse {strs[i]!r} (position {i}) as a time (the other values "
                f"are {kind} labels like {strs[labels.index(True)]!r})",
                i,
                strs[i],
            )
    if all(_ISO.match(s) for s in strs):
        out = attempt("ISO8601")
        if out is not None and not out.isna().any():
            return _to_numpy_datetimes(out)
    candidates = _guess_formats(strs)
    results = [(fmt, attempt(fmt)) for fmt in candidates]
    full = [(f, o) for f, o in results if o is not None and not o.isna().any()]
    if not full:
        if not results:
            iso = attempt("ISO8601")
            what = "expected dates like 2024-03-01 or 2024-03-01T12:30"
            if _TWO_DIGIT_YEAR.match(strs[0]):
                sep = _TWO_DIGIT_YEAR.match(strs[0]).group(1)
                what = (
                    f"two-digit years are not guessed: give the format, e.g. %d{sep}%m{sep}%y "
                    "(CLI: --time-format), which reads 00-68 as 2000-2068 and 69-99 as 1969-1999"
                )
            fail("ISO8601", iso, what)
        fmt, out = max(results, key=lambda r: -1 if r[1] is None else int(r[1].notna().sum()))
        fail(fmt, out, f"the other values read as {fmt!r}")
    distinct = []
    for f, o in full:
        if not any(o.equals(o2) for _, o2 in distinct):
            distinct.append((f, o))
    if len(distinct) > 1:
        if dayfirst is not None:
            pick = [(f, o) for f, o in distinct if _dayfirst(f) == bool(dayfirst)]
            if len(pick) == 1:
                return _to_numpy_datetimes(pick[0][1])
        (f1, o1), (f2, o2) = distinct[:2]
        i = int(np.flatnonzero((o1 != o2).to_numpy())[0])
        raise TimeParseError(
            f"{name}: ambiguous dates: {strs[i]!r} (position {i}) reads as "
            f"{o1.iloc[i].date()} with {f1!r} and as {o2.iloc[i].date()} with {f2!r}; "
            "choose one with time_format (CLI: --time-format) or dayfirst (CLI: --dayfirst)",
            i,
            strs[i],
        )
    return _to_numpy_datetimes(distinct[0][1])


# ISO 8601 written in one layout for every value: the length (without a Z) and the positions
# of its digits and of its separators, and which separators each may be
_FIXED_ISO_SEPARATORS = {4: b"-", 7: b"-", 10: b" T", 13: b":", 16: b":", 19: b"."}


def _apply_second_offsets(
    strs: list[str], name: str, dayfirst: bool | None, time_format: str | None = None
) -> np.ndarray:
    """UTC datetimes of times that each carry a UTC offset, some with seconds (``-00:44:30``:
    pandas reads none without a format, and drops the seconds with ``%z``): the local times
    without their offsets, read as :func:`parse_datetime_strings` reads any (one format for all;
    ``time_format`` less its final ``%z``), minus each offset.

    >>> str(_apply_second_offsets(["1871-01-01 00:00:00+00:53:28"], "t", None)[0])
    '1870-12-31T23:06:32'
    """
    local, shift = [], np.empty(len(strs), dtype=np.int64)
    for i, s in enumerate(strs):
        m = _SECOND_OFFSET.search(s) or re.search(r"(?<=\d)\s*([+-])(\d{2}):?(\d{2})?$", s)
        if m is None:  # Z, UTC or GMT: offset 0
            local.append(re.sub(r"\s*(Z|UTC|GMT)$", "", s))
            shift[i] = 0
            continue
        sign = 1 if m.group(1) == "+" else -1
        hh, mm = int(m.group(2)), int(m.group(3) or 0)
        ss = int(m.group(4)) if m.re is _SECOND_OFFSET else 0
        if hh > 23 or mm > 59 or ss > 59:
            raise TimeParseError(
                f"{name}: cannot parse {s!r} (position {i}) as a time (its UTC offset is no "
                "offset: expected +-HH:MM or +-HH:MM:SS with HH < 24, MM and SS < 60)",
                i,
                s,
            )
        local.append(s[: m.start()])
        shift[i] = sign * (3600 * hh + 60 * mm + ss)
    fmt = time_format
    if fmt is not None:
        if not fmt.rstrip().endswith("%z"):
            raise TimeParseError(
                f"{name}: the times carry UTC offsets with seconds ({strs[0]!r}), which the "
                f"format {time_format!r} does not end with: end it with %z, or leave the "
                "format out",
                0,
                strs[0],
            )
        fmt = fmt.rstrip()[:-2].rstrip()
    t = parse_datetime_strings(local, name, dayfirst=dayfirst, time_format=fmt)
    unit = np.datetime_data(t.dtype)[0]
    out = t - (shift * (_NS_PER["s"] // _NS_PER[unit])).astype(f"timedelta64[{unit}]")
    return _coarsest_datetimes(out)


def _parse_fixed_iso(values) -> np.ndarray | None:
    """The datetimes of strings all written in one ISO 8601 layout, ``YYYY-MM-DD``, with
    ``[T ]HH:MM``, ``:SS`` and ``.`` and 1 to 9 digits after it, all with a ``Z`` (UTC) or none,
    of the years 1678 to 2261, read in numpy: what :func:`parse_datetime_strings` gives them
    (pandas reads every such value in that window exactly; its ISO check and parse, a regular
    expression a value, take seconds for a million). ``None`` for anything else (another
    layout, spaces around a value, an invalid date or time, a value out of range), which the
    general parse reads or refuses as it does.

    >>> _parse_fixed_iso(["1958-03-29 12:00:00", "1958-03-30T00:00:00"]).tolist()[0].isoformat()
    '1958-03-29T12:00:00'
    >>> _parse_fixed_iso(["1958-03-29", "1958-3-30"]) is None
    True
    """
    arr = np.asarray(values).ravel()
    if arr.size == 0 or arr.dtype.kind not in "OU":
        return None
    if arr.dtype.kind == "O":
        import pandas as pd

        if pd.api.types.infer_dtype(arr, skipna=False) != "string":
            return None
        arr = arr.astype("U")
    try:
        raw = arr.astype("S")
    except UnicodeEncodeError:
        return None
    width = raw.dtype.itemsize
    chars = raw.view(np.uint8).reshape(arr.size, width)
    if not chars[:, -1].all():  # (shorter values are padded with zeros)
        return None
    zulu = bool((chars[:, -1] == ord("Z")).all())
    size = width - zulu
    if size not in (10, 16, 19) and not 21 <= size <= 29 or (zulu and size == 10):
        return None
    chars = chars[:, :size]
    digits = np.ones(size, bool)
    for at, allowed in _FIXED_ISO_SEPARATORS.items():
        if at < size:
            digits[at] = False
            if not np.isin(chars[:, at], list(allowed)).all():
                return None
    numbers = chars[:, digits].astype(np.int64) - ord("0")
    if numbers.min() < 0 or numbers.max() > 9:
        return None

    year = numbers[:, :4] @ np.array([1000, 100, 10, 1])
    if year.min() < 1678 or year.max() > 2261:
        return None
    # numpy's ISO parser reads the layout checked above and refuses an invalid date or time
    # (2021-02-29, 24:00, a leap second), as pandas does
    text = np.ascontiguousarray(chars).view(f"S{size}").ravel()
    try:
        out = text.astype("datetime64[s]" if size <= 19 else "datetime64[ns]")
    except ValueError:
        return None
    return _coarsest_datetimes(out)


@functools.cache
def _pandas_parses_ns_only() -> bool:
    """pandas before 3.0 parses strings into nanoseconds only: 1677-09-21 to 2262-04-11 (asked
    when first parsing: importing kalmanscan does not import pandas)."""
    import pandas as pd

    return int(pd.__version__.split(".")[0]) < 3


def _outside_ns_window(out, strs: list[str], fmt: str, utc: bool):
    """``out`` (pandas' parse, NaT where it failed) with the values that Python's ``datetime``
    reads with ``fmt`` filled in, at microsecond resolution: pandas before 3.0 gives NaT for a
    date outside the nanosecond window (years before 1677 or after 2262), which pandas 3 and
    Python read (years 1 to 9999). Values Python cannot read either stay NaT."""
    import pandas as pd

    vals = out.to_numpy()
    res = vals.astype("datetime64[us]")
    ok = ~np.isnat(vals)
    if not (res[ok] == vals[ok]).all():  # sub-microsecond values: kept exact, the rest refused
        return out
    for i in np.flatnonzero(~ok):
        try:
            if fmt == "ISO8601":
                d = _dt.datetime.fromisoformat(strs[i].replace("Z", "+00:00"))
            else:
                d = _dt.datetime.strptime(strs[i], fmt)
        except ValueError:
            continue
        if (d.tzinfo is not None) != utc:  # (an offset on all values or on none)
            continue
        if d.tzinfo is not None:
            d = d.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        res[i] = np.datetime64(d, "us")
    return pd.Series(res)


def _to_numpy_datetimes(out) -> np.ndarray:
    """The parsed values as datetime64 at the coarsest of s/ms/us/ns that holds them exactly
    (pandas 3 infers a unit; pandas 2 gives nanoseconds: the same values either way)."""
    arr = out.to_numpy()
    if arr.dtype.kind != "M":  # pragma: no cover - pandas always gives datetime64 here
        arr = np.asarray(arr, dtype="datetime64[us]")
    return _coarsest_datetimes(arr)


def _coarsest_datetimes(arr: np.ndarray) -> np.ndarray:
    """datetime64 values at the coarsest of s/ms/us that holds them exactly, else their own
    unit (s/ms/us/ns: :func:`_normalize_datetimes`)."""
    arr = _normalize_datetimes(arr)
    for unit in ("s", "ms", "us"):
        if _NS_PER[unit] <= _NS_PER[np.datetime_data(arr.dtype)[0]]:
            break
        coarse = arr.astype(f"datetime64[{unit}]")
        if (coarse == arr).all():
            return coarse
    return arr
