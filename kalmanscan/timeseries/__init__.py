"""Time series with uncertainty: OU / local-level models on timestamps, fitting, forecasting.

- :class:`OUModel` — parameters ``theta, sigma2, mu, obs_var`` on a real time axis (irregular
  numbers or datetimes), exact discretization per step; ``filter``, ``smooth``, ``forecast``.
- :func:`fit_ou` — maximum likelihood through the parallel filter, with standard errors.
- :func:`forecast` — predictive intervals past the last observation.
- :class:`Disturbances` — what ``OUFit.disturbances()`` returns: the standardized smoothed
  disturbances (outliers in ``observation``, breaks of the level in ``state``).

The model and its assumptions: docs/model.md.
"""

from kalmanscan.timeseries.data import load_nile
from kalmanscan.timeseries.fit import fit_ou
from kalmanscan.timeseries.model import Forecast, OUModel, forecast
from kalmanscan.timeseries.result import OUFit
from kalmanscan.timeseries.robust import Disturbances
from kalmanscan.timeseries.times import TimeAxis, as_time_axis

__all__ = [
    "Disturbances",
    "Forecast",
    "OUFit",
    "OUModel",
    "TimeAxis",
    "as_time_axis",
    "fit_ou",
    "forecast",
    "load_nile",
]
