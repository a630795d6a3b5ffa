"""kalmanscan's validation suite: independent truths, a randomized battery and its report.

Installed as ``kalmanscan.validation``; ``kalmanscan validate`` (:mod:`kalmanscan.validate`)
runs it.

Truths (all float64, none uses kalmanscan):

- ``filterpy``: filterpy's ``KalmanFilter`` (``batch_filter``, ``rts_smoother``), one lane at a
  time with per-step F/Q/H/R/B·u (:func:`truths.filterpy_truth`);
- ``dense oracle``: the joint Gaussian of ``x_1..x_t`` given ``z_1..z_t`` in precision form,
  solved with scipy's banded Cholesky (:func:`truths.dense_truth`);
- ``statsmodels (Nile)``: ``UnobservedComponents`` local level, exact diffuse (:mod:`nile`);
- ``scipy expm (Van Loan)``: the OU discretization by a matrix exponential (:mod:`vanloan`);
- ``mpmath oracle (regimes)``: an arbitrary-precision filter, smoother and log-likelihood
  gradient (:mod:`oracle`) on degenerate regimes (:mod:`regimes`), scalar and dense;
- the log-likelihood conventions of statsmodels and KFAS against kalmanscan's plus the documented
  offset (:mod:`conventions`).

Row format. Every check reports rows, one per (truth, quantity, dtype, backend), as dicts with
the keys

    truth        str    which truth (e.g. "filterpy", "dense oracle", "dense: statsmodels")
    quantity     str    e.g. "filtered mean", "smoothed var", "loglik", "process_var"
    dtype        str    "float64" or "float32"
    backend      str    runner label ("sequential", "torch", "native", "torch-cuda",
                        "triton") or "-"
    max_rel_err  float  worst relative error over the models (metric: :mod:`metrics`)
    tol          float  the bound it must meet; the row passes when max_rel_err <= tol and is
                        finite (an infinite error, a backend that raised, fails)
    n_models     int    number of models (lanes, parameter sets) behind the row

and optionally ``worst_model`` (str). Dense (matrix) state-space checks in
``validation/dense_checks.py`` provide ``check_dense(quick: bool) -> list[dict]`` in this format;
when that module is present its rows join the table.

>>> from kalmanscan.validation import run_battery  # doctest: +SKIP
>>> run_battery(quick=True).ok  # doctest: +SKIP
True
"""

from . import report
from .battery import BatteryConfig, BatteryResult, Runner, available_runners, run_battery
from .metrics import elementwise, loglik_error, normwise
from .truths import NotApplicable, Truth, dense_truth, filterpy_truth

__all__ = [
    "BatteryConfig",
    "BatteryResult",
    "NotApplicable",
    "Runner",
    "Truth",
    "available_runners",
    "dense_truth",
    "elementwise",
    "filterpy_truth",
    "loglik_error",
    "normwise",
    "report",
    "run_battery",
]
