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
