"""Text for error messages, shared by the time-series modules (a leaf: imports nothing of
kalmanscan, so the low-level modules such as :mod:`kalmanscan.timeseries.coverage` can use it)."""

from __future__ import annotations

import numpy as np


def _plain(x) -> str:
    """A number for a message as Python writes it (``-1.0``), never numpy's repr of a scalar
    (``np.float64(-1.0)``).

    >>> _plain(np.float64(-1.0)), _plain(np.int64(3)), _plain("3")
    ('-1.0', '3', "'3'")
    """
    return repr(x.item() if isinstance(x, np.generic) else x)


class SeriesLabel(str):
    """A series' name as the fit's warnings and notes write it, unquoted (its repr is its text):
    ``station='a'``, ``(station='a', level=2)``. The xarray accessor names the series of each
    block it fits so, by their coordinates (or positions) in the whole array; one such series is
    named even alone (:func:`unnamed`), being one of a larger array's.

    >>> labels = [SeriesLabel("station='a'"), SeriesLabel("station='b'")]
    >>> ", ".join(repr(x) for x in labels), "station='a'" == labels[0]
    ("station='a', station='b'", True)
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)


def unnamed(n: int, labels) -> bool:
    """Whether messages leave a fit's series unnamed: one series (``n == 1``), unless its label
    is a :class:`SeriesLabel` (one series of a larger array, which the message must name).

    >>> unnamed(1, ["a"]), unnamed(1, [SeriesLabel("station='a'")]), unnamed(2, None)
    (True, False, False)
    """
    return n == 1 and not (labels and isinstance(labels[0], SeriesLabel))
