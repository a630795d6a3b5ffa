"""The regimes of the battery (:mod:`kalmanscan.validation.regimes`): valid but degenerate
scalar lanes (:class:`ScalarRegime`, :func:`scalar_regimes`) and dense series
(:class:`DenseRegime`, :func:`dense_regimes`), each seeded and flagged for the quick battery or
only the full one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kalmanscan.validation.models import Lane

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
    for r, seed, miss in (
        (1e-12, 0, 0.0),
        (1e-12, 3, 0.0),
        (1e-10, 0, 0.0),
        (1e-12, 13, 0.3),
        (1e-12, 28, 0.0),
    ):
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
    out.append(
        DenseRegime(
            "LLT, singular Q (level_var 0), gap",
            z,
            F,
            Q,
            np.array([[1.0, 0.0]]),
            np.array([[0.25]]),
        )
    )
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
