"""Coverage levels and the central intervals of a normal distribution.

Shared by the model's forecasts (:mod:`kalmanscan.timeseries.model_forecast`), the Dataset view
(:mod:`kalmanscan.timeseries.dataset`), the plots and the command line.

>>> lo, hi = interval(0.0, 4.0, 0.95)
>>> round(float(hi), 3), round(normal_quantile(0.95), 3)
(3.92, 1.96)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kalmanscan.timeseries._messages import _plain


def normal_quantile(coverage: float) -> float:
    """``q`` with ``P(|N(0,1)| <= q) = coverage``."""
    return math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(coverage, dtype=torch.float64)))


def check_coverage(coverage, name: str = "coverage") -> tuple[float, ...]:
    """Coverage levels in (0, 1) as a tuple (a single number gives a 1-tuple)."""
    vals = np.atleast_1d(np.asarray(coverage, dtype=np.float64)).ravel()
    if vals.size == 0:
        raise ValueError(f"{name}: expected probabilities strictly between 0 and 1, got none")
    bad = ~((vals > 0) & (vals < 1))
    if bad.any():
        got = _plain(vals[bad][0])  # (a plain number, as Python writes it)
        if np.ndim(coverage):
            got += f" among {vals.tolist()}"
        raise ValueError(f"{name}: expected probabilities strictly between 0 and 1, got {got}")
    _, first, counts = np.unique(vals, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = vals[np.sort(first[counts > 1])[0]]
        raise ValueError(
            f"{name}: expected distinct levels, got {_plain(dup)} more than once among "
            f"{vals.tolist()}"
        )
    return tuple(float(v) for v in vals)


def percent(coverage: float) -> str:
    """A coverage level as a percentage, in the digits it has (results.csv's column names'):
    ``0.9`` -> ``'90%'``, ``0.975`` -> ``'97.5%'``, ``0.999`` -> ``'99.9%'``.

    >>> percent(0.9), percent(0.975), percent(0.999)
    ('90%', '97.5%', '99.9%')
    """
    return f"{float(coverage) * 100:g}%"


def interval(mean, var, coverage: float):
    """Central interval ``(lower, upper)`` of ``N(mean, var)`` holding probability ``coverage``."""
    q = normal_quantile(check_coverage(coverage)[0])
    sd = torch.sqrt(var) if isinstance(var, torch.Tensor) else np.sqrt(var)
    return mean - q * sd, mean + q * sd
