"""Bundled example data."""

from __future__ import annotations

from importlib import resources

import numpy as np


def load_nile():
    """Annual flow of the Nile at Aswan, 1871-1970 (10^8 m^3): ``(years [100], flow [100])``.

    Durbin & Koopman (2012), ch. 2; shipped as ``kalmanscan/data/nile.csv``.

    >>> years, flow = load_nile()
    >>> int(years[0]), float(flow[0]), flow.shape
    (1871, 1120.0, (100,))
    """
    text = resources.files("kalmanscan").joinpath("data/nile.csv").read_text()
    rows = [
        line.split(",") for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    header, body = rows[0], rows[1:]
    if header != ["year", "flow"]:
        raise ValueError(
            f"kalmanscan/data/nile.csv: expected columns ['year', 'flow'], got {header}"
        )
    data = np.array([[float(a), float(b)] for a, b in body])
    return data[:, 0], data[:, 1]
