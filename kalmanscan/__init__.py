"""kalmanscan: the exact Kalman filter for diagonal linear-Gaussian models, parallel in time.

Precisions come from an associative Möbius scan and information vectors from an affine scan, so
the filter, smoother and log-likelihood run in O(log T) depth on CPUs and GPUs.

>>> import numpy as np, kalmanscan as ks
>>> res = ks.filter(np.array([1.0, 2.0, np.nan, 4.0]), obs_var=1.0, decay=1.0, process_var=0.5)
>>> res.mean.shape
(4,)

Importing the package is cheap: it imports torch and numpy only; triton, xarray and matplotlib
load when a function that needs them is called.

Where things are (reference: docs/api-core.md, docs/api.md):

- ``filter``, ``smooth``, ``loglik``, ``discretize_ou``: the core, independent scalar lanes.
- ``fit_ou``, ``forecast``, ``OUModel``, ``OUFit`` and :mod:`kalmanscan.timeseries`: series on
  timestamps (OU and local-level models), fitting, forecasting.
- :mod:`kalmanscan.dense`: dense state-space models (trends, seasons, trackers) and their fits.
- :mod:`kalmanscan.xarray` (the ``.kalman`` accessor) and :mod:`kalmanscan.plot`: results as
  Datasets and uncertainty-band figures.
- :mod:`kalmanscan.kla`: Kalman Linear Attention layers, a byte-level language model, inspection.
- :mod:`kalmanscan.testing`: the tolerance table the tests and ``kalmanscan validate`` use.
"""

from kalmanscan.core.discretize import discretize_ou
from kalmanscan.core.filter import FilterResult, InfoState, SmoothResult, filter, loglik, smooth

__all__ = [
    "FilterResult",
    "InfoState",
    "SmoothResult",
    "discretize_ou",
    "filter",
    "loglik",
    "smooth",
    "fit_ou",
    "forecast",
    "OUModel",
    "OUFit",
]

__version__ = "0.1.0"


def __getattr__(name):
    # Clients load lazily so `import kalmanscan` stays light.
    if name in ("fit_ou", "forecast", "OUModel", "OUFit"):
        from kalmanscan import timeseries

        return getattr(timeseries, name)
    raise AttributeError(f"module 'kalmanscan' has no attribute {name!r}")


def __dir__():
    # the lazily loaded names too (tab completion, dir(kalmanscan))
    return sorted(set(globals()) | set(__all__))
