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


def _label(label) -> str:
    """A series' label in a message: its repr, a number's marked as a label (``label 30``) so
    that it does not read as the series' position, which messages write bare.

    >>> _label("a"), _label(30), _label(np.int64(30)), _label(2.5)
    ("'a'", 'label 30', 'label 30', 'label 2.5')
    """
    if isinstance(label, (int, float, np.number)) and not isinstance(label, bool):
        return "label " + _plain(label)
    return repr(label)


def _shown(idx, labels, limit: int = 5) -> list:
    """The names of the first ``limit`` series ``idx``: their labels (:func:`_label`), else
    positions."""
    return [_label(labels[i]) if labels else str(int(i)) for i in idx[:limit]]


def _listed(shown: list, n: int) -> str:
    """``shown``, the first names of ``n``: ``'a', 'b' and 3 more``."""
    return ", ".join(shown) + (f" and {n - len(shown)} more" if n > len(shown) else "")


def _names(idx, labels, limit: int = 5) -> str:
    """Series ``idx`` named in a message: by label where there are labels, else by position.

    >>> _names([0, 2], ["a", "b", "c"]), _names(list(range(7)), None)
    ("'a', 'c'", '0, 1, 2, 3, 4 and 2 more')
    >>> _names([1], [10, 30])
    'label 30'
    """
    return _listed(_shown(idx, labels, limit), len(idx))
