"""The regime battery: every scalar backend and the dense API against the mpmath oracle.

Valid but degenerate models (issue 21): no process noise with |decay| below, at and above 1;
tiny process variances; long series with long gaps; offsets; near-noise-free observations;
huge process variances; 1e6 and diffuse priors; dense models with singular Q, contracting F and
R -> 0 (KFAS's noiseless VAR(1) with missing data). The truth is :mod:`oracle` (mpmath).

Metrics (per lane and step, worst over the lane; :func:`mean_err_sd`, :func:`var_rel`,
:func:`loglik_rel`):

- **means** in posterior standard deviations: ``|m - m*| / max(sd*, FLOOR * scale)``, ``sd*``
  the truth's standard deviation at that step (filtered for filtered means, smoothed for
  smoothed ones), ``scale = max_t |m*_t|``. Where the posterior is narrower than ``FLOOR = 1e-4``
  of the lane's scale the bar becomes ``1e-10`` of the scale: no float64 mean resolves a state
  known to 1e-400 (OU with sigma2 = 0 after 2000 steps) beyond its own rounding.
- **variances** relative: ``|v - v*| / max(v*, TINY)``, ``TINY`` the dtype's smallest normal
  number times 2**mantissa (values the dtype cannot hold to full precision); ``inf`` must meet
  ``inf`` (diffuse), NaN NaN.
- **log-likelihood**: ``|l - l*| / max(|l*|, n, 1)``, ``n`` the number of contributing steps.

float64 passes a regime when every mean is within ``TOLERANCES[("oracle_sd", "float64")]``
(1e-6 sd) and every variance and the log-likelihood within ``TOLERANCES[("oracle",
"float64")]`` (1e-8); float32 figures are reported, not judged. A backend that raises on a
valid model fails with an infinite error and the exception named.

    python -m kalmanscan.validation.regimes            # quick subset, table on stdout
    python -m kalmanscan.validation.regimes --full --markdown regimes.md --json regimes.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

from kalmanscan.testing import TOLERANCES
from kalmanscan.validation.models import Lane

__all__ = [
    "FLOOR",
    "ScalarRegime",
    "DenseRegime",
    "scalar_regimes",
    "dense_regimes",
    "mean_err_sd",
    "var_rel",
    "loglik_rel",
    "run_regimes",
    "regime_rows",
    "markdown",
]

FLOOR = 1e-4
SCALAR_BACKENDS = ("sequential", "torch", "native")
DENSE_BACKENDS = ("sequential", "torch", "native")
DTYPES = ("float64", "float32")


# --------------------------------------------------------------------------------------------
# metrics


def _tiny(dtype: str) -> float:
    fi = np.finfo(np.float32 if dtype == "float32" else np.float64)
    return float(fi.tiny) * 2.0 ** (fi.nmant + 1)


def mean_err_sd(a, b, var_b, floor: float = FLOOR) -> float:
    """Worst ``|a - b| / max(sqrt(var_b), floor * max|b|)`` over the steps where ``b`` is finite.

    ``a`` must be NaN exactly where ``b`` is (a never-informed state); else the error is inf.

    >>> round(mean_err_sd([1.0, 2.0 + 1e-7], [1.0, 2.0], [1.0, 0.01]), 12)  # 1e-7 / 0.1
    1e-06
    """
    a, b, v = (np.asarray(x, dtype=np.float64) for x in (a, b, var_b))
    nb = ~np.isfinite(b)
    if np.any(np.isfinite(a[nb])):
        return math.inf
    m = ~nb
    if not m.any():
        return 0.0
    diff = np.abs(a[m] - b[m])
    if not np.all(np.isfinite(diff)):
        return math.inf
    scale = float(np.max(np.abs(b[m])))
    den = np.maximum(np.sqrt(np.maximum(v[m], 0.0)), max(floor * scale, 1e-300))
    return float(np.max(diff / den))


def var_rel(a, b, dtype: str = "float64") -> float:
    """Worst ``|a - b| / max(b, TINY)``; ``b = inf`` needs ``a = inf``, ``b`` NaN needs NaN.

    >>> var_rel([1.0, np.inf], [1.0 + 1e-9, np.inf]) < 1.1e-9
    True
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    inf_b, nan_b = np.isinf(b), np.isnan(b)
    if not np.array_equal(a[inf_b], b[inf_b]) or not np.all(np.isnan(a[nan_b])):
        return math.inf
    m = ~inf_b & ~nan_b
    if not m.any():
        return 0.0
    rel = np.abs(a[m] - b[m]) / np.maximum(np.abs(b[m]), _tiny(dtype))
    return float(np.max(rel)) if np.all(np.isfinite(rel)) else math.inf


def loglik_rel(a, b, n: int) -> float:
    """``|a - b| / max(|b|, n, 1)`` (both non-finite and equal: 0).

    >>> loglik_rel(-100.0 + 1e-6, -100.0, 10) < 1.01e-8
    True
    """
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return abs(a - b) / max(abs(b), float(n), 1.0)


# --------------------------------------------------------------------------------------------
# scalar regimes


@dataclass
class ScalarRegime(Lane):
    """One scalar lane (a :class:`Lane`), in the quick battery or not, with a note."""

    quick: bool = True
    note: str = ""


def _simulate(rng, T, decay, process_var, offset, loading, obs_var, x0):
    x, xs = x0, np.empty(T)
    for t in range(T):
        x = decay[t] * x + offset[t] + math.sqrt(process_var[t]) * rng.standard_normal()
        xs[t] = x
    return loading * xs + np.sqrt(obs_var) * rng.standard_normal(T)


def _scalar(
    name,
    T,
    *,
    decay,
    process_var,
    obs_var=1.0,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
    x0=None,
    missing=None,
    seed=0,
    quick=True,
    note="",
) -> ScalarRegime:
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (T,)).copy()  # noqa: E731
    a, p, r, h, c = map(full, (decay, process_var, obs_var, loading, offset))
    rng = np.random.default_rng([seed, T])
    start = prior_mean if x0 is None else x0
    z = _simulate(rng, T, a, np.minimum(p, 1e300), c, h, np.minimum(r, 1e300), start)
    if missing is not None:
        z[missing] = np.nan
    return ScalarRegime(name, z, r, a, p, h, c, float(prior_mean), float(prior_var), quick, note)


def scalar_regimes(full: bool = False) -> list[ScalarRegime]:
    """The scalar regimes (``quick`` ones only unless ``full``).

    >>> [r.name for r in scalar_regimes()][:2]
    ['p=0 a=0.9577 c=0.4 T=1000', 'OU theta=0.5 sigma2=0, 500 steps']
    """
    ou_a = math.exp(-0.5)
    out = [
        _scalar(
            "p=0 a=0.9577 c=0.4 T=1000",
            1000,
            decay=0.9577,
            process_var=0.0,
            offset=0.4,
            obs_var=1.0,
            x0=0.2,
            note="smoothed mean -35,889 at step 24 (truth 0.213) before the fix",
        ),
        _scalar(
            "OU theta=0.5 sigma2=0, 500 steps",
            500,
            decay=ou_a,
            process_var=0.0,
            offset=1.0 - ou_a,
            obs_var=0.5,
            prior_mean=1.0,
            prior_var=1.0,
            x0=2.0,
            note="mu=1, dt=1; smoothed means up to 2.4e93 before the fix",
        ),
        _scalar(
            "OU theta=0.5 sigma2=0, 2000 steps",
            2000,
            decay=ou_a,
            process_var=0.0,
            offset=1.0 - ou_a,
            obs_var=0.5,
            prior_mean=1.0,
            prior_var=1.0,
            x0=2.0,
            note="posterior sd 1e-434 at the end; OverflowError at step 709 before the fix",
        ),
        _scalar("p=0 a=-0.95 T=800 diffuse", 800, decay=-0.95, process_var=0.0, x0=3.0),
        _scalar(
            "p=0 a=0.5, prior N(0,1), T=1200",
            1200,
            decay=0.5,
            process_var=0.0,
            prior_var=1.0,
            x0=0.5,
            note="precision 4^t: past float32 at step 63, float64 at 511 (OverflowError before)",
        ),
        _scalar("p=0 a=1 (constant level) T=2000", 2000, decay=1.0, process_var=0.0, x0=5.0),
        _scalar(
            "p=0 a=1.01 (explosive) T=500",
            500,
            decay=1.01,
            process_var=0.0,
            offset=0.1,
            x0=1.0,
        ),
        _scalar("p=1e-14 a=0.999 T=3000", 3000, decay=0.999, process_var=1e-14, x0=1.0),
        _scalar("p=1e-10 a=0.9 T=3000", 3000, decay=0.9, process_var=1e-10, x0=1.0, quick=False),
        _scalar("p=1e-6 a=1 T=3000", 3000, decay=1.0, process_var=1e-6, x0=1.0),
        _scalar(
            "offset 1e4, a=0.9 p=1",
            1000,
            decay=0.9,
            process_var=1.0,
            offset=1e4,
            obs_var=1.0,
            x0=1e5,
        ),
        _scalar(
            "obs_var 1e-10, a=0.9 p=1", 1000, decay=0.9, process_var=1.0, obs_var=1e-10, x0=1.0
        ),
        _scalar(
            "obs_var 1e-12, a=0.9 p=1", 1000, decay=0.9, process_var=1.0, obs_var=1e-12, x0=1.0
        ),
        _scalar(
            "obs_var 1e-155, a=0.9 p=1",
            500,
            decay=0.9,
            process_var=1.0,
            obs_var=1e-155,
            x0=1.0,
            note="float64 torch path raised OverflowError before the fix",
        ),
        _scalar(
            "process_var 1e155, a=0.9",
            500,
            decay=0.9,
            process_var=1e155,
            obs_var=1.0,
            x0=0.0,
            note="float64 torch path raised OverflowError before the fix",
        ),
        _scalar(
            "prior N(0, 1e6), a=0.95 p=0.1",
            1000,
            decay=0.95,
            process_var=0.1,
            prior_var=1e6,
            x0=3.0,
        ),
        _scalar(
            "diffuse, first 50 missing, a=0.95 p=0",
            500,
            decay=0.95,
            process_var=0.0,
            offset=0.05,
            x0=2.0,
            missing=np.r_[0:50, 300:400],
        ),
    ]
    gaps = np.zeros(100_000, dtype=bool)
    for s in range(5_000, 100_000, 20_000):
        gaps[s : s + 5_000] = True
    out.append(
        _scalar(
            "T=1e5, a=0.999 p=1e-3, 5000-step gaps, diffuse",
            100_000,
            decay=0.999,
            process_var=1e-3,
            x0=1.0,
            missing=np.flatnonzero(gaps),
            quick=False,
        )
    )
    out.append(
        _scalar(
            "T=1e5 random walk p=1e-8, 5000-step gaps",
            100_000,
            decay=1.0,
            process_var=1e-8,
            x0=1.0,
            missing=np.flatnonzero(gaps),
            quick=False,
        )
    )
    gaps4 = np.zeros(10_000, dtype=bool)
    gaps4[2_000:4_000] = gaps4[6_000:8_000] = True
    out.append(
        _scalar(
            "T=1e4, a=0.999 p=1e-3, 2000-step gaps, diffuse",
            10_000,
            decay=0.999,
            process_var=1e-3,
            x0=1.0,
            missing=np.flatnonzero(gaps4),
        )
    )
    return [r for r in out if full or r.quick]


# --------------------------------------------------------------------------------------------
# dense regimes


@dataclass
class DenseRegime:
    """One dense series: ``z`` [T, d] and the matrices of ``kalmanscan.dense.filter``."""

    name: str
    z: np.ndarray
    F: np.ndarray
    Q: np.ndarray
    H: np.ndarray
    R: np.ndarray
    offset: np.ndarray | None = None
    prior_mean: np.ndarray | None = None
    prior_cov: np.ndarray | None = None
    quick: bool = True
    note: str = ""
    extra: dict = field(default_factory=dict)


def kfas_var1_data(missing: bool = True) -> np.ndarray:
    """The 20 x 2 observations of KFAS's VAR(1) fixtures (statsmodels' test suite):
    400 x log-differences of real GDP and consumption, 1959Q2-1964Q1; with ``missing`` the
    first five GDP values and rows 9-12 are NaN."""
    from statsmodels.datasets import macrodata

    df = macrodata.load_pandas().data
    y = np.diff(np.log(df[["realgdp", "realcons"]].to_numpy()[:21]), axis=0) * 400
    if missing:
        y = y.copy()
        y[0:5, 0] = np.nan
        y[8:12, :] = np.nan
    return y


KFAS_VAR1_F = np.array([[0.5, 0.3], [0.2, 0.4]])  # R: cbind(c(0.5, 0.2), c(0.3, 0.4))
KFAS_VAR1_Q = np.diag([2.0, 3.0])


def _structural9(T, seed):
    """Local linear trend + 8-season dummies (9 states), prior N(0, 1e6 I)."""
    n = 9
    F = np.zeros((n, n))
    F[0, 0] = F[0, 1] = F[1, 1] = 1.0
    F[2, 2:] = -1.0
    F[3:, 2:-1] += np.eye(6)
    Q = np.diag([0.5, 0.01, 0.2] + [0.0] * 6)
    H = np.zeros((1, n))
    H[0, 0] = H[0, 2] = 1.0
    R = np.array([[1.0]])
    rng = np.random.default_rng([seed, 9])
    x = rng.standard_normal(n) * 3
    z = np.empty((T, 1))
    for t in range(T):
        x = F @ x + np.sqrt(np.diag(Q)) * rng.standard_normal(n)
        z[t] = H @ x + rng.standard_normal()
    return F, Q, H, R, z


def _mixing(seed, n, d, r, prior, missing=0.4, T=25):
    """A random n-state model (contracting F, full Q) whose d observation rows mix the states,
    at R = r I (near noise-free), a fraction ``missing`` of the entries missing; prior
    ``"diffuse"``, ``"1e6"`` (N(0, 1e6 I)) or ``"unit"`` (N(0, I))."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, n))
    F = A * 0.95 / np.abs(np.linalg.eigvals(A)).max()
    G = rng.normal(size=(n, n))
    Q = G @ G.T / n * 10.0 ** rng.integers(-2, 1)
    H, R = rng.normal(size=(d, n)), r * np.eye(d)
    z = rng.normal(size=(T, d)) * 3
    z[rng.random((T, d)) < missing] = np.nan
    scale = {"diffuse": None, "unit": 1.0, "1e6": 1e6}[prior]
    kw = {} if scale is None else dict(prior_mean=np.zeros(n), prior_cov=scale * np.eye(n))
    return z, F, Q, H, R, kw


def _near_noiseless_heads() -> list[DenseRegime]:
    """Near noise-free entries whose rows mix the states: under a diffuse or 1e6 prior (3 states,
    one or two entries, 40 % missing), and observing the whole state at every step (2 states,
    prior I, 1e6 I or diffuse)."""
    out = []
    for seed, r in ((1, 1e-10), (1, 1e-12), (7, 1e-10)):
        z, F, Q, H, R, kw = _mixing(seed, 3, 1, r, "diffuse")
        out.append(DenseRegime(f"3 states, diffuse, one entry at R={r:g}, seed {seed}", z, F, Q,
                               H, R, quick=(seed, r) == (1, 1e-10), **kw))  # fmt: skip
    for seed in (0, 2, 4, 6, 8, 9):
        z, F, Q, H, R, kw = _mixing(seed, 3, 1, 1e-10, "1e6")
        out.append(DenseRegime(f"3 states, prior 1e6 I, one entry at R=1e-10, seed {seed}", z, F,
                               Q, H, R, quick=seed == 2, **kw))  # fmt: skip
    for seed in (1, 4):
        z, F, Q, H, R, kw = _mixing(seed, 3, 2, 1e-12, "1e6")
        out.append(DenseRegime(f"3 states, prior 1e6 I, two entries at R=1e-12, seed {seed}", z,
                               F, Q, H, R, quick=seed == 4, **kw))  # fmt: skip
    for prior, label in (("unit", "prior I"), ("1e6", "prior 1e6 I")):
        for seed in (0, 3):
            z, F, Q, H, R, kw = _mixing(seed, 2, 2, 1e-12, prior, missing=0.0)
            out.append(DenseRegime(f"2 states, {label}, both observed at R=1e-12, seed {seed}", z,
                                   F, Q, H, R, quick=seed == 0, **kw))  # fmt: skip
    # a diffuse start observed whole: the first step's posterior is the data's own, O(R), where
    # Durbin & Koopman's scalar updates subtract O(1) terms (3e-7 .. 4e-5 relative off before
    # the direct form of dense/sequential.observed_whole_cov); with 30 % missing, seed 13
    # resolves one direction at a step and the other with both entries later (P_* enters there)
    for r, seed, miss in ((1e-12, 0, 0.0), (1e-12, 3, 0.0), (1e-10, 0, 0.0), (1e-12, 13, 0.3),
                          (1e-12, 28, 0.0)):
        z, F, Q, H, R, kw = _mixing(seed, 2, 2, r, "diffuse", missing=miss)
        what = "both observed" if miss == 0 else f"{miss:.0%} missing, both"
        out.append(DenseRegime(f"2 states, diffuse, {what} at R={r:g}, seed {seed}", z, F, Q, H,
                               R, quick=(r, seed) == (1e-12, 0), **kw))  # fmt: skip
    # more near noise-free entries than states (4 on 3), observed at every step: the entry after
    # the last diffuse one, and every proper step's S^-1 (cond 1e10), lost the means (3.6 sd);
    # seed 7 needs more than 60 of the oracle's digits
    for seed in (7, 9):
        z, F, Q, H, R, kw = _mixing(seed, 3, 4, 1e-12, "diffuse", missing=0.0)
        out.append(DenseRegime(f"3 states, diffuse, four entries at R=1e-12, seed {seed}", z, F,
                               Q, H, R, quick=seed == 9, **kw))  # fmt: skip
    return out


def dense_regimes(full: bool = False) -> list[DenseRegime]:
    """The dense regimes (``quick`` ones only unless ``full``)."""
    out = []
    y = kfas_var1_data(missing=True)
    for r in (1e-6, 1e-10, 1e-12, 0.0):
        out.append(
            DenseRegime(
                f"KFAS VAR(1), missing data, R={r:g} I",
                y,
                KFAS_VAR1_F,
                KFAS_VAR1_Q,
                np.eye(2),
                r * np.eye(2),
                quick=r in (1e-10, 0.0),
                note="KFAS's noiseless VAR(1) (H = 0) with R = r I",
            )
        )
    # singular Q: local linear trend with a fixed level (only the slope moves)
    rng = np.random.default_rng(11)
    T = 60
    F = np.array([[1.0, 1.0], [0.0, 1.0]])
    Q = np.diag([0.0, 0.05])
    lvl, slope, zs = 0.0, 0.3, []
    for _ in range(T):
        slope += math.sqrt(0.05) * rng.standard_normal()
        lvl += slope
        zs.append(lvl + 0.5 * rng.standard_normal())
    z = np.array(zs)[:, None]
    z[20:30] = np.nan
    out.append(DenseRegime("LLT, singular Q (level_var 0), gap", z, F, Q, np.array([[1.0, 0.0]]),
                           np.array([[0.25]])))
    # contracting F, no process noise at all (precision grows like 0.9^-2t)
    th = 0.3
    F = 0.9 * np.array([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    rng = np.random.default_rng(12)
    T = 200
    x, zs = np.array([2.0, -1.0]), []
    for _ in range(T):
        x = F @ x + 0.1
        zs.append(x[0] + 0.3 * rng.standard_normal())
    out.append(
        DenseRegime(
            "contracting rotation 0.9, Q = 0, T=200",
            np.array(zs)[:, None],
            F,
            np.zeros((2, 2)),
            np.array([[1.0, 0.0]]),
            np.array([[0.09]]),
            offset=np.full(2, 0.1),
        )
    )
    F9, Q9, H9, R9, z9 = _structural9(100, 0)
    out.append(
        DenseRegime(
            "structural: trend + 8 seasons (9 states), prior 1e6 I",
            z9,
            F9,
            Q9,
            H9,
            R9,
            prior_mean=np.zeros(9),
            prior_cov=1e6 * np.eye(9),
            quick=False,
        )
    )
    out += _near_noiseless_heads()
    return [r for r in out if full or r.quick]


# --------------------------------------------------------------------------------------------
# running


def _cast(x, dtype):
    with np.errstate(over="ignore"):  # what overflows reaches the backend as inf: a refusal
        return np.asarray(x, dtype=np.float32 if dtype == "float32" else np.float64)


# runner labels of `kalmanscan validate` that are not backend names: (backend, device)
GPU_RUNNERS = {"torch-cuda": ("torch", "cuda"), "triton": ("triton", "cuda")}


def _run_scalar(reg: ScalarRegime, backend: str, dtype: str) -> dict:
    import torch

    import kalmanscan as ks

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    if device == "cpu":
        cast = lambda x: _cast(x, dtype)  # noqa: E731
    else:
        tdt = torch.float32 if dtype == "float32" else torch.float64
        cast = lambda x: torch.as_tensor(_cast(x, dtype), dtype=tdt, device=device)  # noqa: E731
    args = [cast(x) for x in (reg.z, reg.obs_var, reg.decay, reg.process_var)]
    kw = dict(
        loading=cast(reg.loading),
        offset=cast(reg.offset),
        prior_mean=cast(reg.prior_mean),
        prior_var=cast(reg.prior_var),
        backend=backend,
    )
    f = ks.filter(*args, **kw)
    s = ks.smooth(*args, **kw)
    # the log-likelihood-only path (what fitting calls) and the smoother's filter, where present
    lls = [float(f.loglik), float(s.filtered.loglik)]
    if hasattr(ks, "loglik"):
        lls.append(float(ks.loglik(*args, **kw)))

    def g(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        return np.asarray(x, dtype=np.float64)

    return dict(
        mean=g(f.mean),
        var=g(f.var),
        pred_mean=g(f.pred_mean),
        pred_var=g(f.pred_var),
        loglik=float(f.loglik),
        logliks=lls,
        smooth_mean=g(s.mean),
        smooth_var=g(s.var),
    )


def scalar_errors(out: dict, truth, dtype: str) -> dict:
    """Errors of one backend's run against the oracle (keys: the table's columns)."""
    return dict(
        filter_mean_sd=max(
            mean_err_sd(out["mean"], truth.mean, truth.var),
            mean_err_sd(out["pred_mean"], truth.pred_mean, truth.pred_var),
        ),
        filter_var=max(
            var_rel(out["var"], truth.var, dtype), var_rel(out["pred_var"], truth.pred_var, dtype)
        ),
        loglik=max(
            loglik_rel(ll, truth.loglik, truth.n_loglik_terms)
            for ll in out.get("logliks", [out["loglik"]])
        ),
        smooth_mean_sd=mean_err_sd(out["smooth_mean"], truth.smooth_mean, truth.smooth_var),
        smooth_var=var_rel(out["smooth_var"], truth.smooth_var, dtype),
    )


def grad_rel(g: dict, g_star: dict, params: dict) -> float:
    """Worst over the parameters of ``|g - g*| / max(|g*|, 1/|theta|)`` (``1`` for theta = 0):
    relative, except that a derivative below one nat per e-fold of the parameter counts as one.

    >>> grad_rel({"decay": 1.0 + 1e-9}, {"decay": 1.0}, {"decay": 0.5}) < 1.1e-9
    True
    """
    worst = 0.0
    for k, ref in g_star.items():
        got = g[k]
        if not math.isfinite(got):
            return math.inf
        theta = abs(float(params[k]))
        floor = 1.0 / theta if theta > 0 else 1.0
        worst = max(worst, abs(got - ref) / max(abs(ref), floor))
    return worst


def scalar_grad(reg: ScalarRegime, backend: str, dtype: str = "float64") -> dict:
    """d loglik / d (obs_var, decay, process_var, offset) from ``ks.loglik(...).backward()`` with
    the four parameters as 0-d tensors (constant-parameter regimes only)."""
    import torch

    import kalmanscan as ks

    from .oracle import GRAD_PARAMS

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    tdt = torch.float32 if dtype == "float32" else torch.float64
    def t(x):
        return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=tdt, device=device)

    params = {
        k: t(float(np.asarray(getattr(reg, k)).flat[0])).requires_grad_() for k in GRAD_PARAMS
    }
    fn = ks.loglik if hasattr(ks, "loglik") else (lambda *a, **k: ks.filter(*a, **k).loglik)
    ll = fn(
        t(reg.z),
        params["obs_var"],
        params["decay"],
        params["process_var"],
        loading=t(reg.loading),
        offset=params["offset"],
        prior_mean=t(reg.prior_mean),
        prior_var=t(reg.prior_var),
        backend=backend,
    )
    ll.sum().backward()
    return {k: float(v.grad) if v.grad is not None else 0.0 for k, v in params.items()}


def _constant(reg: ScalarRegime) -> bool:
    return all(
        np.all(np.asarray(getattr(reg, k)) == np.asarray(getattr(reg, k)).flat[0])
        for k in ("obs_var", "decay", "process_var", "offset", "loading")
    )


GRAD_MAX_T = 20_000  # the gradient oracle costs five 120-digit passes: longer lanes are skipped


def gradient_rows(
    full: bool = False, backends=SCALAR_BACKENDS, progress=None, max_T=GRAD_MAX_T, names=None
):
    """d loglik / d parameters of every constant-parameter scalar regime, float64, against the
    oracle's (:func:`oracle.scalar_loglik_grad`); one dict per (regime, backend) with ``grad``
    (:func:`grad_rel`), ``passes`` (within ``TOLERANCES[("kernel_grad", "float64")]``) and
    ``error`` (what a backend raised)."""
    from kalmanscan.core import native

    from .oracle import scalar_loglik_grad

    say = progress or (lambda m: None)
    tol = TOLERANCES[("kernel_grad", "float64")]
    rows = []
    for reg in scalar_regimes(full):
        if not _constant(reg) or (max_T is not None and reg.T > max_T):
            continue
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        vals = {
            k: float(np.asarray(getattr(reg, k)).flat[0])
            for k in ("obs_var", "decay", "process_var", "offset")
        }
        g_star = scalar_loglik_grad(
            reg.z,
            vals["obs_var"],
            vals["decay"],
            vals["process_var"],
            float(reg.loading[0]),
            vals["offset"],
            reg.prior_mean,
            reg.prior_var,
        )
        say(f"{reg.name}: oracle gradient {time.perf_counter() - t0:.1f} s")
        for be in backends:
            if be == "native" and not native.available():
                continue
            row = dict(regime=reg.name, T=reg.T, backend=be, dtype="float64", error="")
            try:
                row["grad"] = grad_rel(scalar_grad(reg, be), g_star, vals)
            except Exception as exc:
                row["grad"], row["error"] = math.inf, f"{type(exc).__name__}: {exc}"[:200]
            row["passes"] = row["grad"] <= tol
            rows.append(row)
    return rows


def _dense_cov_rel(a, b, steps):
    """Worst ``||A_t - B_t|| / max(||B_t||, 1e-6 max_s ||B_s||)`` (Frobenius): relative per step,
    except that a covariance that is exactly 0 in the truth (a state observed without noise)
    may come back as rounding at 1e-6 of the lane's largest covariance times the tolerance."""
    if not len(steps):
        return 0.0
    floor = max(1e-6 * max(float(np.linalg.norm(b[t])) for t in steps), 1e-300)
    worst = 0.0
    for t in steps:
        nb = np.linalg.norm(b[t])
        d = np.linalg.norm(a[t] - b[t])
        if not np.isfinite(d):
            return math.inf
        worst = max(worst, d / max(nb, floor))
    return worst


def _dense_mean_sd(a, b, cov, steps):
    if not len(steps):
        return 0.0
    scale = max(float(np.max(np.abs(b[steps]))), 1e-300)
    worst = 0.0
    for t in steps:
        sd = np.sqrt(np.maximum(np.diag(cov[t]), 0.0))
        d = np.abs(a[t] - b[t])
        if not np.all(np.isfinite(d)):
            return math.inf
        worst = max(worst, float(np.max(d / np.maximum(sd, FLOOR * scale))))
    return worst


def _run_dense(reg: DenseRegime, backend: str, dtype: str) -> dict:
    import torch

    import kalmanscan.dense as kd

    backend, device = GPU_RUNNERS.get(backend, (backend, "cpu"))
    c = lambda x: None if x is None else torch.as_tensor(_cast(x, dtype), device=device)  # noqa: E731
    kw = dict(
        offset=c(reg.offset),
        prior_mean=c(reg.prior_mean),
        prior_cov=c(reg.prior_cov),
        backend=backend,
    )
    mats = [c(x) for x in (reg.z, reg.F, reg.Q, reg.H, reg.R)]
    s = kd.smooth(*mats, **kw)
    f = s.filtered
    g = lambda x, t=np.float64: np.asarray(torch.as_tensor(x).cpu(), dtype=t)  # noqa: E731
    return dict(
        mean=g(f.mean),
        cov=g(f.cov),
        loglik=float(g(f.loglik)),
        diffuse=g(f.diffuse, bool),
        smooth_mean=g(s.mean),
        smooth_cov=g(s.cov),
    )


def _truth_moments(truth) -> dict:
    """An oracle result in the layout of :func:`_run_dense`'s output (to compare two oracles)."""
    return dict(
        mean=truth.mean,
        cov=truth.cov,
        loglik=truth.loglik,
        diffuse=truth.diffuse,
        smooth_mean=truth.smooth_mean,
        smooth_cov=truth.smooth_cov,
    )


def dense_errors(out: dict, truth) -> dict:
    proper = np.flatnonzero(~truth.diffuse)
    everywhere = np.arange(truth.mean.shape[0])
    return dict(
        filter_mean_sd=_dense_mean_sd(out["mean"], truth.mean, truth.cov, proper),
        filter_var=_dense_cov_rel(out["cov"], truth.cov, proper),
        loglik=loglik_rel(out["loglik"], truth.loglik, truth.n_loglik_terms),
        smooth_mean_sd=_dense_mean_sd(
            out["smooth_mean"], truth.smooth_mean, truth.smooth_cov, everywhere
        ),
        smooth_var=_dense_cov_rel(out["smooth_cov"], truth.smooth_cov, everywhere),
    )


COLUMNS = ("filter_mean_sd", "filter_var", "loglik", "smooth_mean_sd", "smooth_var")


def unheld_inputs(inputs: dict, dtype: str) -> tuple[str, ...]:
    """The names of the ``inputs`` (name -> float64 array) holding a value that ``dtype`` cannot
    hold: a finite value that rounds to +-inf (overflow) or a non-zero one that rounds to 0.

    >>> unheld_inputs(dict(z=[1.0, 1e78], obs_var=1e-155, decay=0.9), "float32")
    ('z', 'obs_var')
    >>> unheld_inputs(dict(z=[1.0, 1e78], obs_var=1e-155), "float64")
    ()
    """
    out = []
    for name, x in inputs.items():
        if x is None:
            continue
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", under="ignore"):
            y = _cast(x, dtype).astype(np.float64)
        fin = np.isfinite(x)
        if np.any(fin & np.isinf(y)) or np.any(fin & (x != 0) & (y == 0)):
            out.append(name)
    return tuple(out)


def _scalar_inputs(reg: ScalarRegime) -> dict:
    keys = ("z", "obs_var", "decay", "process_var", "loading", "offset", "prior_mean", "prior_var")
    return {k: getattr(reg, k) for k in keys}


def _dense_inputs(reg: DenseRegime) -> dict:
    keys = ("z", "F", "Q", "H", "R", "offset", "prior_mean", "prior_cov")
    return {k: getattr(reg, k) for k in keys}


def refusal(exc: Exception, dtype: str, unheld=()) -> bool:
    """A documented refusal, not a failure: a ValueError that names the backend to use instead
    (STYLE: a backend that cannot serve a call raises and names one that can), or one that names
    an input the dtype cannot hold (``unheld``, from :func:`unheld_inputs`: in float32
    ``obs_var = 1e-155`` rounds to 0, and the data of ``process_var = 1e155`` overflow to inf).
    A ValueError about an input the dtype holds is a failure (``dtype`` enters through
    ``unheld`` only).

    >>> refusal(ValueError("z: expected finite values, got inf"), "float32", unheld=("z",))
    True
    >>> refusal(ValueError("z: expected finite values, got inf"), "float32", unheld=("obs_var",))
    False
    """
    if not isinstance(exc, ValueError):
        return False
    msg = str(exc)
    if "use backend=" in msg:
        return True
    return any(re.search(rf"\b{re.escape(name)}\b", msg) for name in unheld)


def passes(errs: dict, dtype: str) -> bool | None:
    """float64: every column within its tolerance; float32: None (reported, not judged)."""
    if dtype != "float64":
        return None
    sd, rel = TOLERANCES[("oracle_sd", "float64")], TOLERANCES[("oracle", "float64")]
    lim = dict(filter_mean_sd=sd, smooth_mean_sd=sd, filter_var=rel, smooth_var=rel, loglik=rel)
    return all(errs[k] <= lim[k] for k in COLUMNS)


def _dense_native() -> bool:
    try:
        from kalmanscan.dense import native as dense_native
    except ImportError:
        return False
    return bool(dense_native.available())


def regime_rows(
    full: bool = False,
    backends=SCALAR_BACKENDS,
    dense_backends=DENSE_BACKENDS,
    dtypes=DTYPES,
    certify: bool = True,
    progress=None,
    names=None,
) -> list[dict]:
    """Run every regime on every backend and dtype; one dict per (regime, backend, dtype).

    Keys: ``kind`` ("scalar"/"dense"), ``regime``, ``T``, ``backend``, ``dtype``, the five
    error columns (:data:`COLUMNS`), ``passes`` (True/False; None for float32), ``error``
    (the exception a backend raised, else ""), ``oracle_dps`` and ``oracle_own`` (the oracle's
    change at 25 more digits, 40 for the dense oracle, worst of its metrics), ``seconds``
    (the backend's run).
    """
    from kalmanscan.core import native

    from .oracle import dense_oracle, scalar_oracle

    say = progress or (lambda m: None)
    rows = []
    avail = [b for b in backends if b != "native" or native.available()]
    dense_backends = [b for b in dense_backends if b != "native" or _dense_native()]
    for reg in scalar_regimes(full):
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        tr = scalar_oracle(
            reg.z,
            reg.obs_var,
            reg.decay,
            reg.process_var,
            reg.loading,
            reg.offset,
            reg.prior_mean,
            reg.prior_var,
            certify=certify,
        )
        own = max(tr.own_error.values()) if tr.own_error else float("nan")
        say(f"{reg.name}: oracle {time.perf_counter() - t0:.1f} s at {tr.dps} digits")
        for be in avail:
            for dt in dtypes:
                row = dict(kind="scalar", regime=reg.name, T=reg.T, backend=be, dtype=dt)
                t1 = time.perf_counter()
                try:
                    errs = scalar_errors(_run_scalar(reg, be, dt), tr, dt)
                    row["error"] = ""
                except Exception as exc:  # a raise on a valid model is a failure, not a crash
                    errs = {k: math.inf for k in COLUMNS}
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row["refused"] = refusal(exc, dt, unheld_inputs(_scalar_inputs(reg), dt))
                row.update(errs)
                row.update(
                    passes=None if row.get("refused") else passes(errs, dt),
                    oracle_dps=tr.dps,
                    oracle_own=own,
                    seconds=time.perf_counter() - t1,
                )
                rows.append(row)
    for reg in dense_regimes(full):
        if names and reg.name not in names:
            continue
        t0 = time.perf_counter()
        args = (reg.z, reg.F, reg.Q, reg.H, reg.R)
        kw = dict(offset=reg.offset, prior_mean=reg.prior_mean, prior_cov=reg.prior_cov)
        tr = dense_oracle(*args, **kw)
        own = float("nan")
        if certify:  # the oracle's change at 40 more digits (60 were not enough on some models)
            tr2 = dense_oracle(*args, **kw, dps=tr.dps + 40)
            own = max(dense_errors(_truth_moments(tr2), tr).values())
        say(f"{reg.name}: dense oracle {time.perf_counter() - t0:.1f} s")
        for be in dense_backends:
            for dt in dtypes:
                if be == "sequential" and dt == "float32":
                    continue  # the dense sequential reference is float64 only
                row = dict(kind="dense", regime=reg.name, T=reg.z.shape[0], backend=be, dtype=dt)
                t1 = time.perf_counter()
                try:
                    errs = dense_errors(_run_dense(reg, be, dt), tr)
                    row["error"] = ""
                except Exception as exc:
                    errs = {k: math.inf for k in COLUMNS}
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row["refused"] = refusal(exc, dt, unheld_inputs(_dense_inputs(reg), dt))
                row.update(errs)
                row.update(
                    passes=None if row.get("refused") else passes(errs, dt),
                    oracle_dps=tr.dps,
                    oracle_own=own,
                    seconds=time.perf_counter() - t1,
                )
                rows.append(row)
    return rows


def run_regimes(full: bool = False, **kw) -> list[dict]:
    """Alias of :func:`regime_rows` (kept for the validate command)."""
    return regime_rows(full=full, **kw)


def _e(x: float) -> str:
    if x != x:
        return "nan"
    if math.isinf(x):
        return "inf"
    return "0" if x == 0 else f"{x:.1e}"


def markdown(rows: list[dict], dtype: str = "float64") -> str:
    """One markdown table: regime x backend, the five errors and pass/fail (``dtype`` rows)."""
    lines = [
        "| regime | T | backend | filter mean (sd) | filter var | loglik | smoothed mean (sd) "
        "| smoothed var | status |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["dtype"] != dtype:
            continue
        st = {True: "pass", False: "**FAIL**", None: "-"}[r["passes"]]
        cells = " | ".join(_e(r[k]) for k in COLUMNS)
        if r.get("refused"):
            why = "names another backend" if "backend=" in r["error"] else "not representable"
            st, cells = f"refused ({why})", " | ".join("-" for _ in COLUMNS)
        elif r["error"]:
            st = f"**raises** {r['error'].split(':')[0]}"
        lines.append(f"| {r['regime']} | {r['T']} | {r['backend']} | {cells} | {st} |")
    return "\n".join(lines)


def _cell(r: dict | None) -> str:
    if r is None:
        return "n/a"
    if r.get("refused"):
        return "refused"
    if r["error"]:
        return f"**raises {r['error'].split(':')[0]}**"
    m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
    v = max(r["filter_var"], r["smooth_var"], r["loglik"])
    txt = f"{_e(m)} / {_e(v)}"
    return f"**{txt} FAIL**" if r["passes"] is False else txt


def compact_markdown(rows: list[dict], before: list[dict] | None = None) -> str:
    """One line per regime: per float64 backend ``worst mean error (sd) / worst relative error
    (variances, log-likelihood)``, the float32 worst over the backends, and optionally the
    float64 backends that failed in an earlier run (``before``)."""
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    idx = {(r["regime"], r["backend"], r["dtype"]): r for r in rows}
    head = "| regime | T | " + " | ".join(f"{b} float64" for b in backends) + " | float32 worst |"
    sep = "|---|---:|" + "---|" * len(backends) + "---|"
    if before is not None:
        head += " before |"
        sep += "---|"
        bidx = {(r["regime"], r["backend"], r["dtype"]): r for r in before}
    lines = [head, sep]
    for name in dict.fromkeys(r["regime"] for r in rows):
        T = next(r["T"] for r in rows if r["regime"] == name)
        cells = [_cell(idx.get((name, b, "float64"))) for b in backends]
        r32 = [idx[(name, b, "float32")] for b in backends if (name, b, "float32") in idx]
        f32 = [r for r in r32 if not r["error"]]
        raised = [r for r in r32 if r["error"] and not r.get("refused")]
        if raised:  # a raise on a valid model is never hidden behind the others' figures
            c32 = "; ".join(f"**{r['backend']} raises {r['error'].split(':')[0]}**" for r in raised)
        elif f32:
            m = max(max(r["filter_mean_sd"], r["smooth_mean_sd"]) for r in f32)
            v = max(max(r["filter_var"], r["smooth_var"], r["loglik"]) for r in f32)
            c32 = f"{_e(m)} / {_e(v)}"
        else:
            c32 = "refused" if r32 else "n/a"
        line = f"| {name} | {T} | " + " | ".join(cells) + f" | {c32} |"
        if before is not None:
            bad = []
            for b in backends:
                r = bidx.get((name, b, "float64"))
                if r is None:
                    continue
                if r["error"] and not r.get("refused"):
                    bad.append(f"{b} raised {r['error'].split(':')[0]}")
                elif r["passes"] is False:
                    m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
                    v = max(r["filter_var"], r["smooth_var"], r["loglik"])
                    bad.append(f"{b} {_e(m)} / {_e(v)}")
            seen = any((name, b, "float64") in bidx for b in backends)
            line += f" {'; '.join(bad) if bad else ('pass' if seen else 'n/a')} |"
        lines.append(line)
    return "\n".join(lines)


def float32_markdown(rows: list[dict]) -> str:
    """One line per regime: each backend's float32 ``worst mean error (sd) / worst relative
    error`` against the float64 oracle (inputs rounded to float32 first, as a user's would be)."""
    backends = list(dict.fromkeys(r["backend"] for r in rows if r["dtype"] == "float32"))
    idx = {(r["regime"], r["backend"]): r for r in rows if r["dtype"] == "float32"}
    lines = [
        "| regime | T | " + " | ".join(f"{b} float32" for b in backends) + " |",
        "|---|---:|" + "---|" * len(backends),
    ]
    for name in dict.fromkeys(r["regime"] for r in rows if r["dtype"] == "float32"):
        T = next(r["T"] for r in rows if r["regime"] == name)
        cells = []
        for b in backends:
            r = idx.get((name, b))
            if r is None:
                cells.append("n/a")
            elif r.get("refused"):
                cells.append("refused")
            elif r["error"]:
                cells.append(f"raises {r['error'].split(':')[0]}")
            else:
                m = max(r["filter_mean_sd"], r["smooth_mean_sd"])
                v = max(r["filter_var"], r["smooth_var"], r["loglik"])
                cells.append(f"{_e(m)} / {_e(v)}")
        lines.append(f"| {name} | {T} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grad_markdown(grads: list[dict]) -> str:
    """One line per regime: the gradient error of each backend (float64)."""
    backends = list(dict.fromkeys(g["backend"] for g in grads))
    idx = {(g["regime"], g["backend"]): g for g in grads}
    lines = [
        "| regime | T | " + " | ".join(f"{b} float64" for b in backends) + " |",
        "|---|---:|" + "---:|" * len(backends),
    ]
    for name in dict.fromkeys(g["regime"] for g in grads):
        cells = []
        for b in backends:
            g = idx.get((name, b))
            if g is None:
                cells.append("n/a")
            elif g["error"]:
                cells.append(f"**raises {g['error'].split(':')[0]}**")
            else:
                cells.append(_e(g["grad"]) if g["passes"] else f"**{_e(g['grad'])} FAIL**")
        T = next(g["T"] for g in grads if g["regime"] == name)
        lines.append(f"| {name} | {T} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_text(rows: list[dict]) -> str:
    head = f"{'regime':52s} {'backend':10s} {'dtype':7s} " + " ".join(
        f"{c:>14s}" for c in COLUMNS
    )
    out = [head]
    for r in rows:
        st = {True: "PASS", False: "FAIL", None: ""}[r["passes"]]
        out.append(
            f"{r['regime'][:52]:52s} {r['backend']:10s} {r['dtype']:7s} "
            + " ".join(f"{_e(r[c]):>14s}" for c in COLUMNS)
            + f"  {st} {r['error'][:60]}"
        )
    return "\n".join(out)


# the regimes `kalmanscan validate` runs by default (each broke a backend before the projective
# representation and the two-filter smoother); --full runs them all
VALIDATE_QUICK = (
    "p=0 a=0.9577 c=0.4 T=1000",
    "OU theta=0.5 sigma2=0, 500 steps",
    "obs_var 1e-155, a=0.9 p=1",
    "process_var 1e155, a=0.9",
    "diffuse, first 50 missing, a=0.95 p=0",
    "KFAS VAR(1), missing data, R=1e-10 I",
    "KFAS VAR(1), missing data, R=0 I",
)
QUANTITY = {
    "filter_mean_sd": "filtered mean (sd)",
    "filter_var": "filtered var",
    "loglik": "loglik",
    "smooth_mean_sd": "smoothed mean (sd)",
    "smooth_var": "smoothed var",
}


def validate_rows(full: bool = False, backends=None, progress=None) -> list[dict]:
    """The regime battery as rows of ``kalmanscan validate``'s table (format:
    :mod:`kalmanscan.validation`): worst error over the regimes per (truth, quantity, dtype,
    backend). float64 rows carry the oracle tolerances; float32 rows are figures (tolerance
    inf). Refusals (:func:`refusal`) are left out of the worst case and of ``n_models``; any
    other raise is an infinite error, which fails the row even at tolerance inf. The oracle's
    self-check at +25 digits is left to the tests and ``python -m ...regimes``.
    """
    names = None if full else VALIDATE_QUICK
    kw = {} if backends is None else dict(backends=tuple(backends))
    rows = regime_rows(full=full, certify=False, progress=progress, names=names, **kw)
    grads = gradient_rows(
        full=full,
        backends=[b for b in kw.get("backends", SCALAR_BACKENDS) if b not in GPU_RUNNERS],
        progress=progress,
        names=names,
    )
    out: dict[tuple, dict] = {}
    for g in grads:
        row = out.setdefault(
            ("grad", g["backend"]),
            dict(
                truth="mpmath oracle (regimes)",
                quantity="d loglik / d params",
                dtype="float64",
                backend=g["backend"],
                max_rel_err=0.0,
                tol=TOLERANCES[("kernel_grad", "float64")],
                n_models=0,
                worst_model="",
            ),
        )
        row["n_models"] += 1
        if not g["grad"] <= row["max_rel_err"]:
            row["max_rel_err"] = g["grad"]
            row["worst_model"] = g["regime"] + (f" ({g['error'][:80]})" if g["error"] else "")
    for r in rows:
        if r.get("refused"):
            continue
        truth = "mpmath oracle (regimes)" if r["kind"] == "scalar" else "dense: mpmath oracle"
        for col, q in QUANTITY.items():
            key = (truth, q, r["dtype"], r["backend"])
            if r["dtype"] == "float64":
                tol = TOLERANCES[("oracle_sd" if col.endswith("mean_sd") else "oracle", "float64")]
            else:
                tol = math.inf
            row = out.setdefault(
                key,
                dict(
                    truth=truth,
                    quantity=q,
                    dtype=r["dtype"],
                    backend=r["backend"],
                    max_rel_err=0.0,
                    tol=tol,
                    n_models=0,
                    worst_model="",
                ),
            )
            row["n_models"] += 1
            err = r[col]
            if not err <= row["max_rel_err"]:
                row["max_rel_err"] = err
                row["worst_model"] = r["regime"] + (f" ({r['error'][:80]})" if r["error"] else "")
    return list(out.values())


def _run_stamp(rows: list[dict]):
    """The ``date`` and ``device`` of each ``--json`` row (the file stays a list of rows): the
    CUDA device for the ``GPU_RUNNERS`` rows, else the CPU model (:mod:`.run_meta`)."""
    from kalmanscan.validation.run_meta import cpu_model, utc_now

    date, cpu, gpu = utc_now(), cpu_model(), None
    if any(r["backend"] in GPU_RUNNERS for r in rows):
        import torch

        gpu = torch.cuda.get_device_name()
    return lambda r: {"date": date, "device": gpu if r["backend"] in GPU_RUNNERS else cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="The regime battery against the mpmath oracle.")
    p.add_argument("--full", action="store_true", help="every regime (10^5-step lanes included)")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--backend", action="append", help="scalar backends (default all)")
    p.add_argument(
        "--dense-backend", action="append",
        help="dense backends (default sequential, torch, native; GPU: torch-cuda, triton)",
    )
    p.add_argument("--regime", action="append", help="only these regime names")
    p.add_argument("--no-certify", action="store_true", help="skip the oracle's self-check")
    p.add_argument("--no-grad", action="store_true", help="skip the log-likelihood gradients")
    p.add_argument(
        "--before", metavar="JSON", help="an earlier --json run: adds its failures as a column"
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = regime_rows(
        full=args.full,
        backends=tuple(args.backend) if args.backend else SCALAR_BACKENDS,
        dense_backends=tuple(args.dense_backend) if args.dense_backend else DENSE_BACKENDS,
        certify=not args.no_certify,
        progress=lambda m: print(f"  .. {m}", flush=True),
        names=args.regime,
    )
    print(format_text(rows))
    grads = [] if args.no_grad else gradient_rows(
        full=args.full,
        backends=tuple(args.backend) if args.backend else SCALAR_BACKENDS,
        progress=lambda m: print(f"  .. {m}", flush=True),
        names=args.regime,
    )
    for g in grads:
        st = "PASS" if g["passes"] else "FAIL"
        print(f"{'d loglik/d params: ' + g['regime']:60s} {g['backend']:10s} "
              f"{_e(g['grad']):>10s}  {st} {g['error'][:60]}")
    bad = [r for r in rows if r["passes"] is False] + [g for g in grads if not g["passes"]]
    print(f"{len(rows)} rows, {time.perf_counter() - t0:.1f} s: {len(bad)} float64 rows fail")
    if args.markdown:
        before = None
        if args.before:
            with open(args.before) as f:
                before = json.load(f)
        with open(args.markdown, "w") as f:
            f.write(compact_markdown(rows, before) + "\n\n")
            if grads:
                f.write(grad_markdown(grads) + "\n\n")
            f.write(float32_markdown(rows) + "\n\n")
            f.write(markdown(rows, "float64") + "\n\nfloat32:\n\n" + markdown(rows, "float32"))
            f.write("\n")
    if args.json:
        stamp = _run_stamp(rows + grads)
        out = [dict(r, **stamp(r)) for r in rows]
        out += [dict(g, kind="grad", **stamp(g)) for g in grads]
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
