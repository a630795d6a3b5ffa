"""Calendar arithmetic of time axes: datetime64 resolutions, exact elapsed time, model time
units, calendar-month steps and the forecast step count.

:func:`elapsed` gives ``(labels - origin) / unit`` for datetime64 labels of any span and
resolution to within one float64 rounding; :func:`parse_time_unit` reads ``time_unit``; the
calendar helpers find a record's step in whole months and the rule that places its dates in
their months (a day of the month, the month's end, its last or first weekday, its n-th or last
Monday, ..., Sunday, two days a month:
:func:`_month_parts`, :func:`_calendar_step`) and lay out forecast dates on that calendar, on the
weekdays a trading record is kept on (:func:`_weekday_future`) or on the bars of an intraday
record's trading sessions (:func:`_session_future`), on a timezone's local clock where the times
were given in one (:func:`_future_local`). Used by
:class:`~kalmanscan.timeseries.times.TimeAxis`.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kalmanscan.timeseries.times import TimeAxis

DEFAULT_DATETIME_UNIT = "1D"
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_INT64_MAX = np.iinfo(np.int64).max


def _utc_to_local(labels: np.ndarray, tz) -> np.ndarray:
    """UTC datetimes ``labels`` on the clock of ``tz`` (naive, at the labels' resolution)."""
    import pandas as pd

    local = pd.DatetimeIndex(labels).tz_localize("UTC").tz_convert(tz).tz_localize(None)
    return np.asarray(local.to_numpy()).astype(labels.dtype)


def _local_to_utc(local: np.ndarray, tz, like: np.ndarray) -> np.ndarray:
    """Naive local times of ``tz`` as UTC datetimes at ``like``'s resolution where it holds them
    exactly (a time the clock skips moves forward past the gap; a repeated one is the standard-
    time one)."""
    import pandas as pd

    idx = pd.DatetimeIndex(local).tz_localize(
        tz, ambiguous=np.zeros(local.size, bool), nonexistent="shift_forward"
    )
    out = np.asarray(idx.tz_convert("UTC").tz_localize(None).to_numpy())
    coarse = out.astype(like.dtype)
    return coarse if (coarse == out).all() else _normalize_datetimes(out)


def _future_local(axis: TimeAxis, k: np.ndarray):
    """:meth:`TimeAxis.future` on the local calendar of ``axis.tz``: by calendar months, on
    the weekdays or the sessions' bars of a trading record, or by a whole number of days where
    the local times sit at one time of day; ``None`` otherwise (then the steps are physical ones,
    in UTC)."""
    try:
        local = axis._local()
    except (ValueError, OverflowError, TypeError):  # (outside pandas' range: UTC steps)
        return None
    parts = _month_parts(local)
    slots = _calendar_step(parts)
    if slots is not None:
        fut = _calendar_future(parts, slots, k, local)
    else:
        if local.size < 2:
            return None
        fut = _weekday_future(local, k)  # (a trading record on its local calendar)
        if fut is None:
            fut = _session_future(local, k)  # (intraday bars in trading hours)
        if fut is None:
            days = _days_of(local)
            tod = _time_of_day(local)
            steps = np.diff(days).astype(np.int64)
            steps = steps[steps > 0]
            if (tod != tod[0]).any() or not steps.size:
                return None
            med = float(np.median(steps))
            if med != int(med):
                return None
            fut = local[-1] + k * np.timedelta64(int(med), "D").astype(
                f"timedelta64[{_resolution(local)}]"
            )
    try:
        return _local_to_utc(fut, axis.tz, axis.labels)
    except (ValueError, OverflowError):
        return None


def _weekday_future(labels: np.ndarray, k: np.ndarray):
    """The ``k``-th days after the last label among the weekdays the record is kept on, at its
    usual time of day, where the labels are such a record: at least 5 over at least two weeks,
    one a day, never (or under a fifth as often as the most common weekday) on some weekday
    (trading days: Monday to Friday; or Monday, Wednesday and Friday, ...), and most steps
    (80 %) the next of those weekdays (a holiday left out is a step of two); else None. The
    time of day is the most common among the last 10 labels (a half-day close does not move
    it). A forecast by the median step would put trading dates on weekends.

    >>> d = np.array(["2024-04-29", "2024-04-30", "2024-05-01", "2024-05-02", "2024-05-03",
    ...               "2024-05-06", "2024-05-07", "2024-05-08", "2024-05-09", "2024-05-10",
    ...               "2024-05-13"], dtype="datetime64[D]")
    >>> [str(x)[:10] for x in _weekday_future(d, np.arange(1, 5))]
    ['2024-05-14', '2024-05-15', '2024-05-16', '2024-05-17']
    >>> mwf = d[[0, 2, 4, 5, 7, 9, 10]]
    >>> [str(x)[:10] for x in _weekday_future(mwf, np.arange(1, 4))]
    ['2024-05-15', '2024-05-17', '2024-05-20']
    """
    labels = np.asarray(labels)
    if labels.dtype.kind != "M" or labels.size < 5 or np.isnat(labels).any():
        return None
    if _resolution(labels) in ("Y", "M", "W"):
        return None
    days = _days_of(labels)  # (floored in integers: no overflow)
    if (days[-1] - days[0]).astype(np.int64) < 14 or (np.diff(days).astype(np.int64) <= 0).any():
        return None
    clock = _time_of_day(labels)
    weekday = (days.astype(np.int64) + 3) % 7  # Monday 0 (1970-01-01 was a Thursday)
    seen = np.bincount(weekday, minlength=7)
    # (a rare weekday, a Saturday session, is an exception; 0/1, not bool: numpy before 2.3
    # warns on a bool weekmask)
    mask = (seen >= 0.2 * seen.max()).astype(np.uint8)
    if mask.all():
        return None
    steps = np.busday_count(days[:-1], days[1:], weekmask=mask)
    if np.mean(steps == 1) < 0.8:
        return None
    # the time of day most common among the last 10 (times in UTC of a place with daylight
    # saving move by an hour twice a year: the latest season's)
    values, counts = np.unique(clock[-10:], return_counts=True)
    out = _at_time_of_day(
        np.busday_offset(days[-1], k, roll="forward", weekmask=mask),
        values[np.argmax(counts)],
        labels,
    )
    if out is None:
        raise ValueError(
            f"steps: {int(k[-1])} of the record's weekdays after {labels[-1]} leave the range of "
            "datetime64"
        )
    return out


_MON_TO_FRI = np.array([1] * 5 + [0] * 2, dtype=np.uint8)  # (a weekmask)
_RECENT_SESSIONS = 20  # the full sessions a forecast's times of day are read from


def _session_future(labels: np.ndarray, k: np.ndarray):
    """The ``k``-th bars after the last label on the trading sessions of an intraday record
    (bars within trading hours on some weekdays: hourly or 5-minute bars from 09:30 to 16:00,
    Monday to Friday): the rest of the last label's session, then the sessions of the next kept
    weekdays, at the times of day of the record's recent full sessions; else ``None``.

    The labels are such a record where they are increasing, their median step divides the day,
    every bar sits on that step's grid, and the days' bars follow one daily window: the span
    from a day's first bar to its last is at most the most common one (a late open or an early
    close is shorter), which at least half the days and at least two of them span (full
    sessions), with bars in at least half its slots; every day's bars lie in a full session's
    window, the full sessions open at one time of day (or two an hour apart: times in UTC of a
    place with daylight saving), and the window leaves a gap each night (a record kept around the
    clock is not one). The kept weekdays are read as :func:`_weekday_future` reads them over at
    least two weeks (a weekday seen under a fifth as often as the most common one is an
    exception; most steps between days the next kept weekday: holidays left out); a shorter
    record on Monday to Friday only is kept on Monday to Friday. The times of day are the slots
    of the latest full sessions' window (up to 20 sessions) that a fifth of them have bars in:
    a lunch break stays out, a bar missing on a quiet day stays in. pandas' business-hour
    offsets (``BusinessHour(start="09:00", end="17:00")``) continue an hourly record so.

    >>> day = np.arange(np.datetime64("2024-05-06T09:30"), np.datetime64("2024-05-06T16:00"),
    ...                 np.timedelta64(30, "m"))  # 09:30 to 15:30
    >>> week = np.concatenate([day + np.timedelta64(j, "D") for j in range(5)])  # to Friday
    >>> [str(x)[:16] for x in _session_future(week[:-1], np.arange(1, 4))]
    ['2024-05-10T15:30', '2024-05-13T09:30', '2024-05-13T10:00']
    """
    labels = np.asarray(labels)
    unit, count = np.datetime_data(labels.dtype) if labels.dtype.kind == "M" else ("", 0)
    if unit not in ("m", "h", *_NS_PER) or count != 1 or labels.size < 6:
        return None
    v = labels.view(np.int64)
    if (v == np.iinfo(np.int64).min).any():  # NaT
        return None
    per_day = _per_day(labels.dtype)
    steps = np.diff(v)
    if (steps <= 0).any():
        return None
    step = float(np.median(steps))
    if step != int(step) or step >= per_day or per_day % int(step):
        return None
    step = int(step)
    if (steps % step).any():  # every bar on one grid of that step (it divides the day)
        return None
    day = v // per_day
    new = np.flatnonzero(np.diff(day) != 0) + 1
    starts, ends = np.r_[0, new], np.r_[new - 1, v.size - 1]
    dates = day[starts]
    first, last = v[starts] - dates * per_day, v[ends] - dates * per_day  # times of day
    span = last - first
    values, counts = np.unique(span, return_counts=True)
    width = int(values[counts == counts.max()].max())
    full = span == width
    if width <= 0 or (span > width).any() or full.sum() < 2 or full.mean() < 0.5:
        return None
    slots = width // step + 1
    if (ends - starts + 1)[full].sum() < 0.5 * slots * full.sum():
        return None  # (bars in bursts, not a session's grid)
    opens = np.unique(first[full])
    if opens.size > 2 or opens[-1] - opens[0] > per_day // 24:
        return None
    if opens[-1] + width - opens[0] + step >= per_day:
        return None  # no gap at night
    fits = np.zeros(dates.size, bool)
    for o in opens:
        fits |= (first >= o) & (last <= o + width)
    if not fits.all():
        return None
    weekday = (dates + 3) % 7  # Monday 0 (1970-01-01 was a Thursday)
    if dates[-1] - dates[0] >= 14:
        seen = np.bincount(weekday, minlength=7)
        mask = (seen >= 0.2 * seen.max()).astype(np.uint8)
        if mask.all():
            return None
    elif (weekday < 5).all():
        mask = _MON_TO_FRI
    else:
        return None
    try:
        days = dates.astype("datetime64[D]")
        if np.mean(np.busday_count(days[:-1], days[1:], weekmask=mask) == 1) < 0.8:
            return None
    except (OverflowError, ValueError):
        return None
    # the latest full sessions' window and the slots a fifth of those sessions have bars in
    recent = np.flatnonzero(full & (first == first[full][-1]))[-_RECENT_SESSIONS:]
    o = int(first[recent[-1]])
    bars = np.concatenate([v[starts[i] : ends[i] + 1] - dates[i] * per_day for i in recent])
    held = np.bincount((bars - o) // step, minlength=slots)[:slots]
    grid = o + step * np.flatnonzero(held >= max(1, 0.2 * recent.size))
    return _session_bars(labels, days[-1], bool(mask[weekday[-1]]), grid, mask, k, unit)


def _session_bars(labels, last_day, on_session, grid, mask, k, unit):
    """The ``k``-th bars after the last of ``labels`` (on day ``last_day``, a kept weekday where
    ``on_session``) at times of day ``grid`` (ticks of ``unit``) of the weekdays ``mask``."""
    k = np.asarray(k, dtype=np.int64)
    last_tod = _time_of_day(labels[-1:])[0]
    rest = grid[grid > last_tod.astype(np.int64)] if on_session else grid[:0]
    j = k - 1 - rest.size
    later = j >= 0
    ahead, slot = np.divmod(np.maximum(j, 0), grid.size)
    try:  # (a day after a session off the kept weekdays is the next kept one: roll forward)
        day = np.busday_offset(last_day, ahead + on_session, roll="forward", weekmask=mask)
    except (OverflowError, ValueError):
        day = None
    day = np.where(later, day, last_day) if day is not None else None
    early = rest[np.clip(k - 1, 0, rest.size - 1)] if rest.size else np.zeros_like(k)
    tod = np.where(later, grid[slot], early)
    out = _at_time_of_day(day, np.asarray(tod).astype(f"timedelta64[{unit}]"), labels)
    if out is not None:
        return out
    raise ValueError(
        f"steps: {int(k[-1])} bars of the record's trading sessions after {labels[-1]} leave "
        "the range of datetime64"
    )


# Month rules (the ``rule`` of :func:`_month_parts`): a day ``d`` of the month (1 to 30, the
# month's last where it is shorter: a record on the 30th has February 28/29), ``-1`` the month's
# last day, ``"last-weekday"`` / ``"first-weekday"`` its last or first Monday-to-Friday (pandas'
# BME, BQE, BYE and BMS, BQS, BYS), ``"WOM-3FRI"`` its n-th (1 to 4) Monday, ..., Sunday and
# ``"LWOM-FRI"`` its last one (pandas' week-of-month rules: ``"WOM-3FRI"`` the third Friday, as
# monthly option expiries), a pair ``(a, b)`` two days of every month, ``b`` ``-1`` for the
# month's end (semi-monthly: pandas' SMS is ``(1, 15)``, SMS-10 ``(1, 10)``, SME ``(15, -1)``).
# A record's dates are numbered by slot: its month (months since 1970), or two slots a month for
# a pair.
_WEEKDAY_RULES = ("last-weekday", "first-weekday")
_DAY_NAMES = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
_HOLIDAY_DAYS = 4  # a holiday moves a trading month's first or last day by at most 4 days


def _slots_per_month(rule) -> int:
    return 2 if isinstance(rule, tuple) else 1


def _week_of_month(rule):
    """``(n, weekday)`` of a week-of-month rule (``"WOM-3FRI"``: ``(3, 4)``; ``"LWOM-FRI"``:
    ``(-1, 4)``; Monday 0), else ``None``."""
    if not isinstance(rule, str) or not rule.startswith(("WOM-", "LWOM-")):
        return None
    if rule.startswith("L"):
        return -1, _DAY_NAMES.index(rule[5:])
    return int(rule[4]), _DAY_NAMES.index(rule[5:])


def _weekday_of(days: np.ndarray) -> np.ndarray:
    """Monday 0 to Sunday 6 of ``datetime64[D]`` dates (1970-01-01 was a Thursday)."""
    return (days.astype(np.int64) + 3) % 7


def _rule_days(rule, slots: np.ndarray) -> np.ndarray:
    """The dates (``datetime64[D]``) of slots ``slots`` (int64) under month rule ``rule``."""
    slots = np.asarray(slots, dtype=np.int64)
    if isinstance(rule, tuple):
        month, half = np.divmod(slots, 2)
        day = np.where(half == 0, rule[0], rule[1])
    else:
        month, day = slots, rule
    first = month.astype("datetime64[M]").astype("datetime64[D]")
    last = (month + 1).astype("datetime64[M]").astype("datetime64[D]") - np.timedelta64(1, "D")
    if rule == "last-weekday":
        return np.busday_offset(last, 0, roll="backward")
    if rule == "first-weekday":
        return np.busday_offset(first, 0, roll="forward")
    wom = _week_of_month(rule)
    if wom is not None:
        n, weekday = wom
        if n == -1:
            return last - ((_weekday_of(last) - weekday) % 7).astype("timedelta64[D]")
        ahead = (weekday - _weekday_of(first)) % 7 + 7 * (n - 1)
        return first + ahead.astype("timedelta64[D]")
    length = (last - first).astype(np.int64) + 1
    day = np.where(day == -1, length, np.minimum(day, length))
    return first + (day - 1).astype("timedelta64[D]")


def _month_parts(labels: np.ndarray):
    """``(slots as int64, month rule, time of day)`` of datetimes that all follow one month rule
    (listed above :func:`_slots_per_month`) at one time of day; ``None`` for any other datetimes
    and for fewer than two of them.

    The rules are tried in turn: one day of the month (at most the 28th); every date its month's
    last; for at least 3 dates in distinct months, the last weekday of the month, then the first
    (as ``pd.infer_freq`` prefers them), then the n-th or last Monday, ..., Sunday of the month
    (:func:`_weekday_rule`); one day 29 or 30 (the month's last in shorter months); two days a
    month (see :func:`_semi_monthly_parts`). At least 3 dates one to four weeks apart are a
    weekly record, none of the last four. A trading record's first or last day of the month, or
    its n-th weekday, moved by a public holiday (a weekday at most 4 days off, at most 30 % of
    at least 5 dates: New Year's Day moves every first trading day of a quarter's January; Good
    Friday an option expiry on the third Friday to the Thursday) still follows the weekday rules.

    >>> bme = np.array(["2024-01-31", "2024-02-29", "2024-03-29", "2024-04-30"], "datetime64[D]")
    >>> _month_parts(bme)[1]
    'last-weekday'
    >>> sms = np.array(["2024-05-15", "2024-06-01", "2024-06-15"], "datetime64[D]")
    >>> _month_parts(sms)[1]
    (1, 15)
    >>> wom = np.array(["2024-01-19", "2024-02-16", "2024-04-19"], "datetime64[D]")
    >>> _month_parts(wom)[1]  # the third Friday, a month missing
    'WOM-3FRI'
    """
    if labels.size < 2 or labels.dtype.kind != "M":
        return None
    try:
        days = _days_of(labels)
        # the time of day, exact at the labels' resolution (days floor towards the past)
        tod = _time_of_day(labels)
        if (tod != tod[0]).any():  # (before the month arithmetic: intraday records are long)
            return None
        month = days.astype("datetime64[M]")
        m = month.astype(np.int64)
        ends = _rule_days(-1, m)
    except (OverflowError, ValueError):
        return None
    dom = (days - month.astype("datetime64[D]")).astype(np.int64) + 1
    if (dom == dom[0]).all() and dom[0] <= 28:
        return m, int(dom[0]), tod[0]
    if (days == ends).all():
        return m, -1, tod[0]  # every date the last of its month
    gaps = np.diff(days).astype(np.int64)
    if labels.size >= 3 and (gaps == gaps[0]).all() and gaps[0] in (7, 14, 21, 28):
        return None  # a weekly record (February's 28 days can make it look monthly)
    rule = _weekday_rule(days, m) if labels.size >= 3 and (np.diff(m) > 0).all() else None
    if rule is not None:
        return m, rule, tod[0]
    top = int(dom.max())
    if top in (29, 30) and (days == _rule_days(top, m)).all():
        return m, top, tod[0]
    return _semi_monthly_parts(days, m, dom, ends, tod[0])


def _weekday_rule(days: np.ndarray, m: np.ndarray):
    """The weekday rule (``"last-weekday"``, ``"first-weekday"``, a week-of-month one such as
    ``"WOM-3FRI"`` or ``"LWOM-FRI"``) that dates ``days`` in months ``m`` follow, allowing for
    holidays (see :func:`_month_parts`); else ``None``. A rule every date follows exactly is
    preferred to one that needs holidays.

    >>> d = np.array(["2024-01-19", "2024-02-16", "2024-03-15"], "datetime64[D]")
    >>> _weekday_rule(d, d.astype("datetime64[M]").astype(np.int64))
    'WOM-3FRI'
    """
    moves = {}
    for rule in (*_WEEKDAY_RULES, *_week_of_month_candidates(days)):
        try:
            off = (days - _rule_days(rule, m)).astype(np.int64)
        except (OverflowError, ValueError):
            return None
        if not off.any():
            return rule
        # a holiday moves a month's last weekday earlier, its first later, an n-th weekday
        # either way (a Good Friday expiry to the Thursday, a Labor Day one to the Tuesday)
        moves[rule] = (
            -off if rule == "last-weekday" else off if rule in _WEEKDAY_RULES else np.abs(off)
        )
    if days.size < 5:
        return None
    for rule, off in moves.items():
        moved = off != 0
        if (
            moved.mean() <= 0.3
            and np.is_busday(days[moved]).all()
            and ((off[moved] > 0) & (off[moved] <= _HOLIDAY_DAYS)).all()
        ):
            return rule
    return None


def _week_of_month_candidates(days: np.ndarray) -> list[str]:
    """The week-of-month rules dates ``days`` may follow: the n-th (1 to 4) and the last of their
    most common weekday, n the most common week of the month among the dates on that weekday."""
    weekday = _weekday_of(days)
    top = int(np.argmax(np.bincount(weekday, minlength=7)))
    dom = (days - days.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64)
    week = np.bincount(dom[weekday == top] // 7 + 1, minlength=6)
    n = int(np.argmax(week))
    name = _DAY_NAMES[top]
    return ([f"WOM-{n}{name}"] if n <= 4 else []) + [f"LWOM-{name}"]


def _semi_monthly_parts(days, m, dom, ends, tod):
    """:func:`_month_parts` of dates on two days of their months, pandas' semi-monthly ones (the
    1st and a day ``b`` of 2 to 27: ``SMS``; a day ``a`` of 1 to 27 and the month's end:
    ``SME``), at least 3 of them in distinct half months; else ``None``."""
    if days.size < 3:
        return None
    first = int(dom.min())
    other = dom != first
    if first > 27 or not other.any():
        return None
    if (days[other] == ends[other]).all():
        rule = (first, -1)
    elif first == 1 and (dom[other] == dom[other][0]).all() and dom[other][0] <= 27:
        rule = (1, int(dom[other][0]))
    else:
        return None
    slots = 2 * m + other
    if (np.diff(slots) <= 0).any():
        return None
    return slots, rule, tod


def _calendar_step(parts) -> int | None:
    """The median positive step of :func:`_month_parts`' slots (months, or half months for two
    days a month) where it is whole, else (or without parts) ``None``."""
    if parts is None:
        return None
    d = np.diff(parts[0])
    d = d[d > 0]
    if not d.size:
        return None
    med = float(np.median(d))
    return int(med) if med == int(med) else None


def _calendar_future(parts, slots: int, k: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The dates ``k * slots`` slots after the last of ``labels`` (calendar months, or half
    months for two days a month), on the same month rule and time of day (``parts``: their
    :func:`_month_parts`)."""
    m, rule, tod = parts
    try:
        day = _rule_days(rule, m[-1] + k * slots)
    except (OverflowError, ValueError):
        day = None
    out = _at_time_of_day(day, tod, labels)
    if out is not None:
        return out
    per = "months" if _slots_per_month(rule) == 1 else "half months"
    raise ValueError(
        f"steps: {int(k[-1])} steps of {slots} {per} after {labels[-1]} leave the range of "
        "datetime64"
    )


MAX_FORECAST_STEPS = 1_000_000


def check_steps(steps, name: str = "steps") -> int:
    """A positive number of forecast steps, at most :data:`MAX_FORECAST_STEPS` (memory bound)."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, (bool, np.bool_)) or steps < 1:
        raise ValueError(f"{name}: expected a positive integer, got {steps!r}")
    if steps > MAX_FORECAST_STEPS:
        raise ValueError(
            f"{name}: expected at most {MAX_FORECAST_STEPS} forecast steps (each step holds a "
            f"value per series in memory), got {steps}"
        )
    return int(steps)


# a fixed-length datetime64 unit in attoseconds (numpy's finest), exact in Python integers
_UNIT_AS = {u: 10**18 * s for u, s in (("W", 604_800), ("D", 86_400), ("h", 3_600), ("m", 60),
                                       ("s", 1))}  # fmt: skip
_UNIT_AS.update({u: 10**e for u, e in (("ms", 15), ("us", 12), ("ns", 9), ("ps", 6), ("fs", 3),
                                       ("as", 0))})  # fmt: skip


def _coarsening(dtype, unit: str) -> int | None:
    """Ticks of datetime64 ``dtype`` in one ``unit`` where ``unit`` is a whole multiple above 1
    of them (so flooring to ``unit`` is an integer division); None otherwise (months, years, a
    unit as coarse as ``unit``, or one ``unit`` is not a whole number of ticks)."""
    tunit, count = np.datetime_data(dtype)
    tick = _UNIT_AS.get(tunit, 0) * count
    big = _UNIT_AS[unit]
    if not tick or tick >= big or big % tick:
        return None
    return big // tick


def _per_day(dtype) -> int | None:
    """Ticks of datetime64 ``dtype`` in a day (``None`` for days, weeks, months, years)."""
    return _coarsening(dtype, "D")


def floor_datetimes(t: np.ndarray, unit: str) -> np.ndarray:
    """Datetimes ``t`` floored to ``unit`` (``datetime64[unit]``; NaT kept), in integers where
    ``unit`` is coarser: numpy's cast overflows within a day of a unit's lower limit
    (nanoseconds' 1677-09-21 became 2262), which it wraps or crashes on.

    >>> floor_datetimes(np.array(["1677-09-21T00:13", "NaT"], "datetime64[ns]"), "D")
    array(['1677-09-21',        'NaT'], dtype='datetime64[D]')
    """
    f = _coarsening(t.dtype, unit)
    if f is None:
        return t.astype(f"datetime64[{unit}]")
    out = (t.view(np.int64) // f).view(f"datetime64[{unit}]")
    return np.where(np.isnat(t), np.datetime64("NaT", unit), out)


def whole_in(t: np.ndarray, unit: str) -> bool:
    """Whether every datetime of ``t`` is a whole number of ``unit`` (NaT counts as one),
    checked in integers where ``unit`` is coarser (numpy's floor cast overflows near a unit's
    lower limit: :func:`floor_datetimes`).

    >>> whole_in(np.array(["1677-09-22", "NaT"], "datetime64[ns]"), "D")
    True
    """
    f = _coarsening(t.dtype, unit)
    if f is not None:
        return bool(((t.view(np.int64) % f == 0) | np.isnat(t)).all())
    return bool(((t == t.astype(f"datetime64[{unit}]")) | np.isnat(t)).all())


def _days_of(labels: np.ndarray) -> np.ndarray:
    """The days (``datetime64[D]``) of datetimes ``labels``, floored in integers
    (:func:`floor_datetimes`).

    >>> _days_of(np.array(["1677-09-21T01:00", "NaT"], "datetime64[ns]"))
    array(['1677-09-21',        'NaT'], dtype='datetime64[D]')
    """
    return floor_datetimes(labels, "D")


def _time_of_day(labels: np.ndarray) -> np.ndarray:
    """The times of day of datetimes ``labels`` (``timedelta64`` at their unit), floored in
    integers (see :func:`_days_of`).

    >>> _time_of_day(np.array(["1677-09-21T01:00"], "datetime64[ns]")).astype("m8[m]")
    array([60], dtype='timedelta64[m]')
    """
    unit, count = np.datetime_data(labels.dtype)
    per_day = _per_day(labels.dtype)
    if per_day is None:
        return np.zeros(labels.shape, f"timedelta64[{count}{unit}]")
    tod = (labels.view(np.int64) % per_day).view(f"timedelta64[{count}{unit}]")
    return np.where(np.isnat(labels), np.timedelta64("NaT", unit), tod)


def _at_time_of_day(day, tod, labels: np.ndarray):
    """``day + tod`` (``datetime64[D]`` days, ``timedelta64`` times of day) at the labels'
    resolution, or at the finest of ms / us / s coarser than that which holds every date (a
    nanosecond record's far forecasts pass 2262-04-11), else ``None`` (``day`` ``None``: its
    arithmetic overflowed). The range is checked in Python integers before any cast: numpy's
    datetime casts may wrap silently on overflow (numpy 2.4 put a weekday record of 2261's far
    forecasts in 2002) or crash the interpreter (2.5.2, a million bars cast past 2262).

    >>> d = np.array(["2262-04-10", "2262-04-12"], "datetime64[D]")
    >>> at = np.timedelta64(9, "h").astype("timedelta64[ns]")
    >>> _at_time_of_day(d, at, np.array(["2262-01-01"], "datetime64[ns]")).dtype
    dtype('<M8[us]')
    """
    if day is None or not np.size(day):
        return None
    day = np.asarray(day).astype("datetime64[D]")
    if np.isnat(day).any():
        return None
    d = day.view(np.int64)
    t = np.asarray(tod).astype("timedelta64[ns]").view(np.int64)  # (times of day: no overflow)
    lo, hi = int(d.min()), int(d.max())
    t_lo, t_hi = int(t.min()), int(t.max())
    res = _resolution(labels)
    for r in [x for x in ("ns", "us", "ms", "s") if _NS_PER[x] >= _NS_PER[res]]:
        per_day = 86_400 * 10**9 // _NS_PER[r]
        # (floor division: numpy's casts of times before 1970 to a coarser unit floor as well;
        # -2**63 is NaT)
        if hi * per_day + t_hi // _NS_PER[r] > _INT64_MAX:
            continue
        if lo * per_day + t_lo // _NS_PER[r] <= -_INT64_MAX - 1:
            continue
        return day.astype(f"datetime64[{r}]") + np.asarray(tod).astype(f"timedelta64[{r}]")
    return None


def _resolution(arr: np.ndarray) -> str:
    unit, _ = np.datetime_data(arr.dtype)
    return unit if unit in _NS_PER else "s"


def _resolution_td(td) -> str:
    unit, _ = np.datetime_data(np.asarray(td).dtype)
    return unit


def _normalize_datetimes(arr: np.ndarray) -> np.ndarray:
    """datetime64 at s/ms/us/ns resolution (coarser units become seconds, finer ones ns)."""
    unit, count = np.datetime_data(arr.dtype)
    if unit in _NS_PER and count == 1:
        return arr
    if unit in ("Y", "M", "W", "D", "h", "m") or (unit in _NS_PER and count != 1):
        return arr.astype("datetime64[s]")
    return arr.astype("datetime64[ns]")


def _split_ns(arr: np.ndarray):
    """``(seconds int64, nanoseconds int64 in [0, 1e9))`` of datetime64 values, without overflow."""
    res = _resolution(arr)
    v = _normalize_datetimes(arr).astype(f"datetime64[{res}]").view(np.int64)
    per = 10**9 // _NS_PER[res]
    sec, sub = np.divmod(v, per)
    return sec, sub * _NS_PER[res]


def elapsed(labels: np.ndarray, origin, unit: np.timedelta64) -> np.ndarray:
    """``(labels - origin) / unit`` as float64 for datetime64 values of any span and resolution.

    Seconds and sub-seconds are subtracted apart in int64 (exact), then combined in float64: one
    rounding, so a relative error below 2.3e-16 of the elapsed time.

    >>> a = np.array(["1700-01-01", "2008-01-01", "9999-12-31"], dtype="datetime64[s]")
    >>> elapsed(a, a[0], np.timedelta64(1, "D")).tolist()
    [0.0, 112494.0, 3031511.0]
    """
    labels = np.asarray(labels)
    sec, sub = _split_ns(labels)
    sec0, sub0 = _split_ns(np.asarray([origin], dtype=labels.dtype))
    unit_ns = float(int(np.timedelta64(unit, "ns") / np.timedelta64(1, "ns")))
    ds = (sec - sec0[0]).astype(np.float64)
    dn = (sub - sub0[0]).astype(np.float64)
    return (ds * 1e9 + dn) / unit_ns


def parse_time_unit(time_unit) -> tuple[np.timedelta64, str]:
    """``time_unit`` (``"D"``, ``"12h"``, ``"365.25D"``, timedelta64, timedelta) -> (ns, name)."""
    if time_unit is None:
        time_unit = DEFAULT_DATETIME_UNIT
    name = str(time_unit)
    if isinstance(time_unit, (np.timedelta64, _dt.timedelta)):
        name = None
    if isinstance(time_unit, np.timedelta64):
        if np.isnat(time_unit):
            raise ValueError(f"time_unit: expected a positive duration, got {time_unit!r}")
        td = time_unit.astype("timedelta64[ns]")
    elif isinstance(time_unit, _dt.timedelta):
        td = np.timedelta64(int(round(time_unit.total_seconds() * 1e9)), "ns")
    elif isinstance(time_unit, str):
        if re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", time_unit):
            # a bare number is nanoseconds to pandas, and no one means that: ask for a unit
            raise ValueError(
                f"time_unit: expected a duration with its unit, such as '{time_unit.strip()}D' "
                f"(days) or '{time_unit.strip()}h' (hours), got {time_unit!r}"
            )
        try:
            import pandas as pd

            td = np.timedelta64(pd.Timedelta(time_unit).value, "ns")
        except (ImportError, ValueError, OverflowError) as err:
            raise ValueError(
                "time_unit: expected a duration such as '1D', '12h' or '365.25D', got "
                f"{time_unit!r}"
            ) from err
    else:
        raise TypeError(
            f"time_unit: expected a string, numpy.timedelta64 or datetime.timedelta, got "
            f"{type(time_unit).__name__}"
        )
    if np.isnat(td) or not td > np.timedelta64(0, "ns"):
        raise ValueError(f"time_unit: expected a positive duration, got {time_unit!r}")
    return td, name or _unit_name(td)


def _unit_name(td: np.timedelta64) -> str:
    ns = int(td / np.timedelta64(1, "ns"))
    for suffix, size in (
        ("D", 86400 * 10**9),
        ("h", 3600 * 10**9),
        ("min", 60 * 10**9),
        ("s", 10**9),
    ):
        if ns % size == 0:
            return f"{ns // size}{suffix}"
    return f"{ns}ns"
