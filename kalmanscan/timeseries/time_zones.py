"""Timezones of time labels: the zone a record's times were given in, and the times in it again.

Times that carry a timezone (a pandas tz-aware index or Series, a polars ``Datetime`` with a
``time_zone``, datetimes with a ``tzinfo``, strings with UTC offsets) are read as UTC
``datetime64`` (:class:`~kalmanscan.timeseries.times.TimeAxis` ``utc``), keeping the one zone they
were given in (``TimeAxis.tz``). What comes back is in that zone again: a forecast's times are a
tz-aware pandas ``DatetimeIndex`` in it (:func:`zoned_index`; UTC where the times carried only UTC
offsets of no one zone), so local midnights stay midnights across daylight-saving changes.

Datasets cannot hold tz-aware times (xarray and netCDF store naive ``datetime64``), so a results
Dataset's ``time`` and ``forecast_time`` hold the UTC times with the attrs ``time_zone = "UTC"``
and, where the times were given in one zone, ``local_time_zone`` naming it (:func:`zone_name`:
an IANA name such as ``"Europe/Paris"``, or a fixed offset such as ``"UTC+05:00"``). That is
lossless: :func:`recorded_zone` (and ``pd.DatetimeIndex(values).tz_localize("UTC")
.tz_convert(attrs["local_time_zone"])``) gives the zoned times back, and the ``.kalman``
accessor reads such a coordinate so.

>>> import numpy as np
>>> utc = np.array(["2024-03-30T23:00", "2024-03-31T22:00"], dtype="datetime64[s]")
>>> [str(t) for t in zoned_index(utc, zone_from_name("Europe/Paris", "tz"))]
['2024-03-31 00:00:00+01:00', '2024-04-01 00:00:00+02:00']
"""

from __future__ import annotations

import datetime as _dt

import numpy as np


def zone_name(tz) -> str | None:
    """The name a timezone is recorded under (``local_time_zone``): an IANA key
    (``"Europe/Paris"``), ``"UTC"``, or a fixed offset (``"UTC+05:00"``); ``None`` where ``tz``
    has no name pandas reads back to the same zone.

    >>> zone_name(_dt.timezone(_dt.timedelta(hours=-3, minutes=-30)))
    'UTC-03:30'
    """
    if tz is None:
        return None
    if isinstance(tz, str):
        name = tz
    elif getattr(tz, "key", None):  # zoneinfo
        name = str(tz.key)
    elif getattr(tz, "zone", None):  # pytz
        name = str(tz.zone)
    elif isinstance(tz, _dt.timezone):
        name = "UTC" if tz.utcoffset(None) == _dt.timedelta(0) else str(tz)
    else:  # dateutil and others: as pandas names them, where it does
        try:
            from pandas._libs.tslibs.timezones import get_timezone

            name = get_timezone(tz)
        except (ImportError, AttributeError):  # pragma: no cover - pandas internals moved
            name = None
        if not isinstance(name, str):
            return None
    try:
        zone_from_name(name, "tz")
    except ValueError:
        return None
    return name


def zone_from_name(name, where: str):
    """The timezone named ``name`` (:func:`zone_name`'s names, any pandas reads), as pandas
    keeps it; ``ValueError`` naming ``where`` for a name that is no timezone."""
    import pandas as pd

    try:
        return pd.DatetimeIndex([], dtype="datetime64[s]").tz_localize("UTC").tz_convert(name).tz
    except Exception as err:  # (pandas raises several kinds for an unknown zone)
        raise ValueError(
            f"{where}: expected the name of a timezone (like 'Europe/Paris', 'UTC', "
            f"'UTC+05:00'), got {name!r}"
        ) from err


def zoned_index(labels, tz):
    """UTC ``datetime64`` labels as a tz-aware pandas ``DatetimeIndex`` in ``tz`` (UTC for
    ``None``), at the labels' resolution."""
    import pandas as pd

    idx = pd.DatetimeIndex(np.atleast_1d(np.asarray(labels))).tz_localize("UTC")
    return idx if tz is None else idx.tz_convert(tz)


def recorded_zone(values: np.ndarray, attrs: dict, name: str):
    """The times of a Dataset's time coordinate as a tz-aware ``DatetimeIndex`` where its attrs
    say they are UTC (``time_zone = "UTC"``; in the zone ``local_time_zone`` names where
    there is one), else ``None`` (read as they are)."""
    if attrs.get("time_zone") != "UTC" or np.asarray(values).dtype.kind != "M":
        return None
    local = attrs.get("local_time_zone")
    tz = None
    if local is not None:
        tz = zone_from_name(
            local, f"{name}: its attr local_time_zone (drop the attr or correct it)"
        )
    return zoned_index(values, tz)


def coord_attrs(utc: bool, tz, period_freq) -> dict:
    """The attrs a results Dataset's time coordinates carry for times read from a zone
    (``time_zone = "UTC"``, ``local_time_zone`` naming the one zone they were given in) or from
    pandas periods (``period_freq``): what :func:`recorded_times` reads back."""
    attrs = {}
    if utc:
        attrs["time_zone"] = "UTC"
        local = zone_name(tz)
        if local is not None and local != "UTC":
            attrs["local_time_zone"] = local
    if period_freq is not None:
        attrs["period_freq"] = period_freq
    return attrs


def recorded_times(values, attrs: dict, name: str):
    """The times of a Dataset's time coordinate as its attrs (:func:`coord_attrs`) record them:
    the periods whose starts it holds (``period_freq``; a ``PeriodIndex``), the zoned times of
    UTC ones (:func:`recorded_zone`), else ``values`` as they are."""
    arr = np.asarray(values)
    if arr.dtype.kind != "M":
        return values
    freq = attrs.get("period_freq")
    if freq is not None:
        from kalmanscan.timeseries.time_periods import recorded_periods

        return recorded_periods(arr, freq, name)
    zoned = recorded_zone(arr, attrs, name)
    return values if zoned is None else zoned
