"""pandas periods as time labels: a ``PeriodIndex`` (quarters, months, years, weeks, days,
hours, business days; any anchor: ``Q-NOV``, ``Y-JUN``, ``W-WED``), a Series of periods, a
``PeriodArray``, ``Period`` objects.

A period is read as the time it starts (``datetime64``: 1959Q1 is 1959-01-01, 1962Q1 of
``Q-NOV`` is 1961-12-01), so the model's steps are the exact durations between the periods'
starts in ``time_unit`` (default days), and a gap of missing periods is a step over them. The
record keeps the periods' frequency (``TimeAxis.period_freq``, pandas' ``freqstr``: ``"Q-DEC"``,
``"M"``, ``"W-SUN"``), and what comes back is keyed by the same periods: the start of a period
lies inside it, so ``DatetimeIndex(starts).to_period(freq)`` gives the periods back exactly
(:func:`to_periods`), never the one before or after. Forecasts continue the sequence
(:func:`period_future`), and a time given against such a record must be a period of its
frequency or the time one starts (:func:`check_period_starts`): anything else would move when
labelled by its period.

>>> import pandas as pd
>>> idx = pd.period_range("1961Q4", periods=2, freq="Q-NOV")
>>> starts, freq = period_labels(idx, "times")
>>> [str(s)[:10] for s in starts], freq
(['1961-09-01', '1961-12-01'], 'Q-NOV')
>>> to_periods(period_future(starts, freq, np.arange(1, 3)), freq).astype(str).tolist()
['1962Q2', '1962Q3']
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import numpy as np

from kalmanscan.timeseries.time_calendar import _normalize_datetimes


@contextlib.contextmanager
def _business_periods_allowed():
    """pandas deprecates business-day periods (``freq="B"``) with a ``FutureWarning`` where
    they are made; the user's own were warned of already, so the conversions here are quiet."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*(BDay freq|PeriodDtype\[B\])", FutureWarning)
        yield


def as_period_index(times, name: str):
    """``times`` as a pandas ``PeriodIndex`` where they are periods (a period-dtype Index,
    Series or array, an xarray coordinate of periods, one ``Period``, or a sequence of
    ``Period`` objects), else ``None``.
    Periods of several frequencies are refused (``ValueError`` naming ``name``)."""
    pd = sys.modules.get("pandas")  # periods mean pandas is imported: no import here
    if pd is None:
        return None
    if isinstance(times, (pd.Index, pd.Series, pd.api.extensions.ExtensionArray)):
        if isinstance(times.dtype, pd.PeriodDtype):
            with _business_periods_allowed():
                return pd.PeriodIndex(times)
        if times.dtype != object:
            return None
        times = np.asarray(times, dtype=object)  # (Period objects of several frequencies)
    elif isinstance(getattr(times, "dtype", None), pd.PeriodDtype):
        times = np.asarray(times, dtype=object)  # (an xarray coordinate of periods)
    if isinstance(times, pd.Period):
        flat = [times]
    elif isinstance(times, (list, tuple)):
        if not times or not isinstance(times[0], pd.Period):
            return None
        flat = list(times)
    elif isinstance(times, np.ndarray):
        if times.dtype != object or times.size == 0 or not isinstance(times.flat[0], pd.Period):
            return None
        if times.ndim > 1:
            raise ValueError(f"{name}: expected a 1-D sequence of periods, got shape {times.shape}")
        flat = list(times.ravel())
    else:
        return None
    if not all(isinstance(v, pd.Period) for v in flat):
        return None  # (read as other times are: a Period among strings is its text)
    freqs = list(dict.fromkeys(v.freqstr for v in flat))
    if len(freqs) > 1:
        raise ValueError(
            f"{name}: expected periods of one frequency, got "
            + " and ".join(repr(f) for f in freqs[:3])
        )
    with _business_periods_allowed():
        return pd.PeriodIndex(flat, freq=freqs[0])


def period_labels(periods, name: str):
    """``(starts, freq)``: the times the periods start as ``datetime64`` (NaT for a missing
    period) and the periods' frequency, or ``None`` where ``periods`` are not periods
    (:func:`as_period_index`)."""
    idx = as_period_index(periods, name)
    if idx is None:
        return None
    with _business_periods_allowed():
        starts = np.asarray(idx.start_time)
    return _normalize_datetimes(starts), idx.freqstr


def to_periods(starts: np.ndarray, freq: str):
    """The periods of frequency ``freq`` that the datetimes ``starts`` fall in (the periods
    themselves where ``starts`` are their starts), as a ``PeriodIndex``."""
    import pandas as pd

    with _business_periods_allowed():
        return pd.DatetimeIndex(np.asarray(starts)).to_period(freq)


def period_step(starts: np.ndarray, freq: str) -> int:
    """The record's typical step in periods: the median of its positive steps, the lower of the
    two middle ones for an even count (a step the record takes, so forecasts skip no period it
    has); 1 where there is none."""
    d = np.diff(to_periods(starts, freq).asi8)
    d = np.sort(d[d > 0])
    return int(d[(d.size - 1) // 2]) if d.size else 1


def period_future(starts: np.ndarray, freq: str, k: np.ndarray) -> np.ndarray:
    """The starts of the periods ``k`` typical steps (:func:`period_step`) after the last of a
    record of periods of ``freq`` starting at ``starts``: its sequence continued (the next
    quarters, months, weeks; business days skip weekends)."""
    import pandas as pd

    step = period_step(starts, freq)
    last = to_periods(starts[-1:], freq)
    try:
        with _business_periods_allowed():
            fut = pd.PeriodIndex.from_ordinals(last.asi8[0] + k * step, freq=freq)
            out = np.asarray(fut.start_time)
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime) as err:
        raise ValueError(
            f"steps: {int(k[-1])} steps of {step} x {freq!r} after {last[0]} leave the range of "
            "dates pandas' periods hold"
        ) from err
    return _normalize_datetimes(out)


def off_start(arr: np.ndarray, freq: str):
    """``(i, period)`` of the first of the datetimes ``arr`` that is not the start of its period
    of frequency ``freq``, or ``None`` where each is (or where ``arr`` holds no valid datetimes:
    the time axis refuses those with its own message)."""
    flat = np.asarray(arr).ravel()
    if flat.size == 0 or flat.dtype.kind != "M" or np.isnat(flat).any():
        return None
    periods = to_periods(flat, freq)
    with _business_periods_allowed():
        starts = np.asarray(periods.start_time)
    off = flat != starts
    if not off.any():
        return None
    i = int(np.flatnonzero(off)[0])
    return i, periods[i]


def period_call(period) -> str:
    """How to write ``period`` in code: ``pd.Period('1962Q1', 'Q-NOV')``, or by its first day
    where pandas does not read its text back (weeks: ``pd.Period('2020-03-02', 'W-SUN')``)."""
    import pandas as pd

    text = str(period)
    try:
        with _business_periods_allowed():
            same = pd.Period(text, period.freqstr) == period
    except (TypeError, ValueError):
        same = False
    if not same:
        with _business_periods_allowed():
            text = str(period.start_time.date())
    return f"pd.Period({text!r}, {period.freqstr!r})"


def check_period_starts(arr: np.ndarray, freq: str, name: str) -> None:
    """Refuse datetimes ``arr`` given against a record of periods of ``freq`` where one is not
    the start of its period: labelled by its period it would move (``ValueError`` naming
    ``name``, the time and the period it falls in)."""
    off = off_start(arr, freq)
    if off is not None:
        i, period = off
        raise ValueError(
            f"{name}: the record's times are periods of frequency {freq!r}, each read as the "
            f"time it starts; got {np.asarray(arr).ravel()[i]}, inside the period {period} but "
            f"not its start; give the period ({period_call(period)}) or the time it starts at"
        )


def check_period_freq(periods, freq: str, name: str) -> None:
    """Refuse periods of another frequency than the record's ``freq`` (``ValueError``)."""
    idx = as_period_index(periods, name)
    if idx is not None and idx.freqstr != freq:
        raise ValueError(
            f"{name}: expected periods of the record's frequency {freq!r} (or the times they "
            f"start at), got periods of frequency {idx.freqstr!r}; convert them "
            f"(periods.asfreq({freq!r})) if that is what is meant"
        )


def recorded_periods(starts: np.ndarray, freq, name: str):
    """The periods whose starts a results Dataset's time coordinate holds, its attr
    ``period_freq`` naming their frequency (:mod:`kalmanscan.timeseries.dataset`), as a
    ``PeriodIndex``; refused where the attr names no frequency or a time is not the start of
    its period (the attr then does not describe the coordinate)."""
    try:
        periods = to_periods(starts, str(freq))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{name}: its attr period_freq = {freq!r} is not a frequency of pandas periods "
            "(like 'Q-DEC', 'M', 'W-SUN'); drop the attr or correct it"
        ) from err
    off = off_start(starts, periods.freqstr)
    if off is not None:
        i, period = off
        raise ValueError(
            f"{name}: its attr period_freq = {freq!r} says the times are the starts of periods "
            f"of that frequency, but {starts[i]} (position {i}) is inside the period {period}, "
            "not its start; drop the attr or correct it"
        )
    return periods
