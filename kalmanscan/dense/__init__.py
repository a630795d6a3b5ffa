"""Dense linear-Gaussian state-space models, filtered and smoothed in parallel over time.

    x_t = F_t x_{t-1} + offset_t + N(0, Q_t),    z_t = H_t x_t + N(0, R_t)

``filter`` and ``smooth`` (on the CPU a compiled exact sequential pass, its gradients from
chunked associative scans of Särkkä & García-Fernández elements, which serve other devices;
exact diffuse priors,
missing data, numpy/torch), the step-by-step references
``filter_sequential``/``smooth_sequential`` (float64), model builders, and ``fit`` (maximum
likelihood variances of a built model, many series at once). Math and conventions:
docs/dense.md.

>>> import numpy as np, kalmanscan.dense as kd
>>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
>>> kd.smooth(np.arange(10.0)[:, None], **m._asdict()).mean.shape
(10, 2)
"""

from kalmanscan.dense.api import DenseFilterResult, DenseSmoothResult, filter, smooth
from kalmanscan.dense.fit import DenseFit, fit
from kalmanscan.dense.models import (
    DenseModel,
    add_components,
    constant_acceleration,
    constant_velocity,
    local_linear_trend,
    ou_sum,
    seasonal_dummies,
)


def filter_sequential(z, F, Q, H, R, **kwargs):
    """The float64 step-by-step reference: :func:`filter` with ``backend="sequential"``.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(1.0, 0.1, 2.0)
    >>> r = kd.filter_sequential(np.arange(5.0)[:, None], **m._asdict())
    >>> r.mean.shape
    (5, 2)
    """
    return filter(z, F, Q, H, R, backend="sequential", **kwargs)


def smooth_sequential(z, F, Q, H, R, **kwargs):
    """The float64 step-by-step reference smoother: :func:`smooth` with ``backend="sequential"``.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(1.0, 0.1, 2.0)
    >>> kd.smooth_sequential(np.arange(5.0)[:, None], **m._asdict()).mean.shape
    (5, 2)
    """
    return smooth(z, F, Q, H, R, backend="sequential", **kwargs)


__all__ = [
    "DenseFilterResult",
    "DenseFit",
    "DenseModel",
    "DenseSmoothResult",
    "add_components",
    "constant_acceleration",
    "constant_velocity",
    "filter",
    "filter_sequential",
    "fit",
    "local_linear_trend",
    "ou_sum",
    "seasonal_dummies",
    "smooth",
    "smooth_sequential",
]
