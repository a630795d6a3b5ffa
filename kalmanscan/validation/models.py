"""Lane models for the validation battery: seeded random models and named extreme regimes.

A *lane* is one scalar state-space model (SPEC §1)::

    x_t = decay_t * x_{t-1} + offset_t + w_t,   w_t ~ N(0, process_var_t)
    z_t = loading_t * x_t + e_t,                e_t ~ N(0, obs_var_t)
    x_0 ~ N(prior_mean, prior_var)              (prior_var = inf: diffuse)

A :class:`LaneBatch` holds ``N`` lanes of one length ``T`` as float64 arrays ``[T, N]`` so that
kalmanscan filters the whole batch in one call while the truths run lane by lane.
Missing observations are ``z = NaN`` or ``obs_var = inf`` (both forms occur in the battery).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Lane", "LaneBatch", "random_batch", "named_regimes", "growth_families"]


@dataclass
class Lane:
    """One lane as float64 arrays of shape ``[T]`` plus a scalar prior."""

    name: str
    z: np.ndarray
    obs_var: np.ndarray
    decay: np.ndarray
    process_var: np.ndarray
    loading: np.ndarray
    offset: np.ndarray
    prior_mean: float
    prior_var: float

    @property
    def T(self) -> int:
        return int(self.z.shape[0])

    @property
    def observed(self) -> np.ndarray:
        """Boolean ``[T]``: True where ``z_t`` is observed (finite z and finite obs_var)."""
        return np.isfinite(self.z) & np.isfinite(self.obs_var)

    @property
    def diffuse(self) -> bool:
        return bool(np.isinf(self.prior_var))


@dataclass
class LaneBatch:
    """``N`` lanes of one length ``T``: arrays ``[T, N]``, priors ``[N]``, one name per lane."""

    family: str
    z: np.ndarray
    obs_var: np.ndarray
    decay: np.ndarray
    process_var: np.ndarray
    loading: np.ndarray
    offset: np.ndarray
    prior_mean: np.ndarray
    prior_var: np.ndarray
    names: list[str] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.z.shape)  # type: ignore[return-value]

    def lane(self, n: int) -> Lane:
        return Lane(
            name=self.names[n],
            z=self.z[:, n],
            obs_var=self.obs_var[:, n],
            decay=self.decay[:, n],
            process_var=self.process_var[:, n],
            loading=self.loading[:, n],
            offset=self.offset[:, n],
            prior_mean=float(self.prior_mean[n]),
            prior_var=float(self.prior_var[n]),
        )

    def lanes(self) -> list[Lane]:
        return [self.lane(n) for n in range(self.shape[1])]

    @staticmethod
    def stack(family: str, lanes: list[Lane]) -> LaneBatch:
        """Stack lanes of one length into a batch."""
        lengths = {ln.T for ln in lanes}
        if len(lengths) != 1:
            raise ValueError(f"lanes: expected one common length, got lengths {sorted(lengths)}")

        def col(attr):
            return np.stack([getattr(ln, attr) for ln in lanes], axis=1)

        return LaneBatch(
            family=family,
            z=col("z"),
            obs_var=col("obs_var"),
            decay=col("decay"),
            process_var=col("process_var"),
            loading=col("loading"),
            offset=col("offset"),
            prior_mean=np.array([ln.prior_mean for ln in lanes], dtype=np.float64),
            prior_var=np.array([ln.prior_var for ln in lanes], dtype=np.float64),
            names=[ln.name for ln in lanes],
        )


def _simulate(rng, decay, process_var, loading, offset, obs_var, prior_mean, prior_var):
    """Draw z from the model (a diffuse prior starts the state at prior_mean)."""
    T = decay.shape[0]
    x = prior_mean + (0.0 if np.isinf(prior_var) else np.sqrt(prior_var) * rng.standard_normal())
    z = np.empty(T)
    for t in range(T):
        x = decay[t] * x + offset[t] + np.sqrt(process_var[t]) * rng.standard_normal()
        z[t] = loading[t] * x + np.sqrt(obs_var[t]) * rng.standard_normal()
    return z


def _maybe_varying(rng, T, base, spread, p_varying):
    """Constant ``base`` or a time-varying series around it (log-normal factor ``spread``)."""
    if rng.random() < p_varying:
        return base * np.exp(spread * rng.standard_normal(T))
    return np.full(T, base)


def _random_lane(rng: np.random.Generator, T: int, name: str) -> Lane:
    kind = rng.choice(["ou_irregular", "ar", "local_level", "signed_ar"])
    if kind == "ou_irregular":
        # exact OU steps on irregular timestamps (SPEC §1), computed here with numpy only
        theta = 10 ** rng.uniform(-2, 1)
        sigma2 = 10 ** rng.uniform(-2, 1)
        dt = rng.exponential(10 ** rng.uniform(-2, 0), size=T)
        decay = np.exp(-theta * dt)
        process_var = -sigma2 * np.expm1(-2 * theta * dt) / (2 * theta)
        process_var = np.maximum(process_var, 1e-12)  # dt may be ~0: keep p > 0 for the oracle
    else:
        if kind == "local_level":
            decay = np.ones(T)
        elif kind == "ar":
            decay = _maybe_varying(rng, T, rng.uniform(0.3, 0.999), 0.0, 0.0)
            if rng.random() < 0.5:
                decay = np.clip(decay + 0.05 * rng.standard_normal(T), 0.05, 1.2)
        else:
            decay = (
                rng.uniform(-1.0, 1.0, size=T)
                if rng.random() < 0.5
                else np.full(T, -rng.uniform(0.2, 0.99))
            )
        process_var = _maybe_varying(rng, T, 10 ** rng.uniform(-3, 1), 0.5, 0.4)
    obs_var = _maybe_varying(rng, T, 10 ** rng.uniform(-2, 2), 0.7, 0.4)
    loading = (
        np.ones(T)
        if rng.random() < 0.5
        else _maybe_varying(rng, T, rng.uniform(0.3, 2.0), 0.3, 0.5)
    )
    if rng.random() < 0.25:
        loading = -loading
    offset = (
        np.zeros(T)
        if rng.random() < 0.5
        else rng.normal(0, 1) + 0.3 * rng.standard_normal(T) * (rng.random() < 0.5)
    )
    diffuse = rng.random() < 0.4
    prior_mean = float(rng.normal(0, 3))
    prior_var = np.inf if diffuse else float(10 ** rng.uniform(-2, 2))
    # a units change: scale states, data, offsets and noise together
    scale = 10 ** rng.uniform(-3, 3)
    offset, prior_mean = offset * scale, prior_mean * scale
    process_var, obs_var = process_var * scale**2, obs_var * scale**2
    if not diffuse:
        prior_var = prior_var * scale**2
    z = _simulate(rng, decay, process_var, loading, offset, obs_var, prior_mean, prior_var)
    # missing data: scattered, in blocks, as NaN or as obs_var = inf
    frac = rng.choice([0.0, 0.1, 0.3, 0.6])
    miss = rng.random(T) < frac
    if T > 20 and rng.random() < 0.3:
        start = rng.integers(0, T - 10)
        miss[start : start + rng.integers(5, max(6, T // 4))] = True
    if diffuse and T > 1 and rng.random() < 0.7:
        miss[0] = False  # most diffuse lanes see their first step; the rest start with gaps
    if miss.all():
        miss[T // 2] = False
    z = z.copy()
    obs_var = obs_var.copy()
    if rng.random() < 0.5:
        z[miss] = np.nan
    else:
        obs_var[miss] = np.inf
        z[miss] = rng.normal(0, 1, size=int(miss.sum()))  # finite garbage that must be ignored
    tag = f"{kind}-{'diffuse' if diffuse else 'prior'}-miss{frac:.1f}-s{scale:.0e}"
    return Lane(
        name=f"{name}:{tag}",
        z=z,
        obs_var=obs_var,
        decay=decay,
        process_var=process_var,
        loading=loading,
        offset=offset,
        prior_mean=prior_mean,
        prior_var=prior_var,
    )


def random_batch(seed: int, T: int, n_lanes: int) -> LaneBatch:
    """``n_lanes`` seeded random lanes of length ``T`` (time-varying, gaps, priors, offsets).

    >>> b = random_batch(0, 63, 4)
    >>> b.shape
    (63, 4)
    """
    rng = np.random.default_rng([seed, T, n_lanes])
    lanes = [_random_lane(rng, T, f"random-T{T}-{i}") for i in range(n_lanes)]
    return LaneBatch.stack(f"random T={T}", lanes)


def _lane(
    name,
    T,
    *,
    decay,
    process_var,
    obs_var,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=np.inf,
    rng,
    missing=0.0,
    lead_missing=0,
):
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (T,)).copy()  # noqa: E731
    decay, process_var, obs_var = full(decay), full(process_var), full(obs_var)
    loading, offset = full(loading), full(offset)
    z = _simulate(
        rng,
        decay,
        process_var,
        loading,
        offset,
        obs_var,
        prior_mean,
        prior_var if np.isfinite(prior_var) else 0.0,
    )
    miss = rng.random(T) < missing
    miss[:lead_missing] = True
    if miss.all():
        miss[-1] = False
    z[miss] = np.nan
    return Lane(
        name=name,
        z=z,
        obs_var=obs_var,
        decay=decay,
        process_var=process_var,
        loading=loading,
        offset=offset,
        prior_mean=float(prior_mean),
        prior_var=float(prior_var),
    )


def named_regimes(seed: int, quick: bool) -> list[LaneBatch]:
    """The named extreme regimes, each a small batch of lanes of one length.

    Regimes: decay near 0 (and exactly 0: total forgetting), decay near 1, no process noise,
    huge and tiny observation variances, large offsets, diffuse prior with leading gaps,
    lengths 1/2/3, and long lanes (10^5 steps; 10^4 in quick mode).
    """
    rng = np.random.default_rng([seed, 7])
    out = []

    def batch(family, T, specs):
        out.append(
            LaneBatch.stack(family, [_lane(f"{family}:{k}", T, rng=rng, **kw) for k, kw in specs])
        )

    batch(
        "decay near 0",
        200,
        [
            ("a=1e-8,diffuse", dict(decay=1e-8, process_var=1.0, obs_var=0.5, missing=0.2)),
            (
                "a=1e-3,prior",
                dict(decay=1e-3, process_var=2.0, obs_var=1.0, prior_var=1.0, missing=0.2),
            ),
            (
                "a=0,prior",
                dict(
                    decay=0.0,
                    process_var=1.0,
                    obs_var=1.0,
                    prior_mean=3.0,
                    prior_var=4.0,
                    missing=0.2,
                ),
            ),
        ],
    )
    batch(
        "decay near 1",
        1000,
        [
            ("a=1-1e-9,p=1e-6", dict(decay=1 - 1e-9, process_var=1e-6, obs_var=1.0, missing=0.1)),
            (
                "a=1-1e-6,p=1e-3,prior",
                dict(decay=1 - 1e-6, process_var=1e-3, obs_var=1.0, prior_var=10.0),
            ),
            ("a=1,p=1e-4,offset", dict(decay=1.0, process_var=1e-4, obs_var=0.1, offset=0.01)),
            ("a=1,p=1e-7", dict(decay=1.0, process_var=1e-7, obs_var=1.0, missing=0.1)),
        ],
    )
    batch(
        "no process noise",
        300,
        [
            ("a=1,diffuse", dict(decay=1.0, process_var=0.0, obs_var=1.0, missing=0.2)),
            (
                "a=0.9,prior",
                dict(decay=0.9, process_var=0.0, obs_var=1.0, prior_mean=5.0, prior_var=2.0),
            ),
            ("a=1.001,offset,diffuse", dict(decay=1.001, process_var=0.0, obs_var=0.3, offset=0.1)),
        ],
    )
    batch(
        "huge obs var",
        500,
        [
            ("R=1e8,p=1", dict(decay=0.99, process_var=1.0, obs_var=1e8)),
            ("R=1e12,rw,diffuse", dict(decay=1.0, process_var=1.0, obs_var=1e12, missing=0.3)),
        ],
    )
    batch(
        "tiny obs var",
        500,
        [
            ("R=1e-8", dict(decay=0.9, process_var=1.0, obs_var=1e-8)),
            ("R=1e-12,diffuse,gaps", dict(decay=1.0, process_var=1.0, obs_var=1e-12, missing=0.3)),
        ],
    )
    batch(
        "large offsets",
        400,
        [
            (
                "c=1e4,a=0.5",
                dict(decay=0.5, process_var=1.0, obs_var=1.0, offset=1e4, prior_var=1.0),
            ),
            ("c=1e3,rw,diffuse", dict(decay=1.0, process_var=0.1, obs_var=1.0, offset=1e3)),
        ],
    )
    batch(
        "diffuse, leading gaps",
        100,
        [
            ("5 missing", dict(decay=0.95, process_var=0.5, obs_var=1.0, lead_missing=5)),
            (
                "rw, 20 missing",
                dict(decay=1.0, process_var=1.0, obs_var=2.0, lead_missing=20, loading=0.7),
            ),
            (
                "decay 0 inside the gap",
                dict(
                    decay=np.r_[0.9, 0.9, 0.9, 0.0, np.full(96, 0.9)],
                    process_var=0.5,
                    obs_var=1.0,
                    lead_missing=6,
                ),
            ),
            (
                "decay 0.01 inside the gap",
                dict(
                    decay=np.r_[0.9, 0.9, 0.9, 0.01, np.full(96, 0.9)],
                    process_var=0.5,
                    obs_var=1.0,
                    lead_missing=6,
                ),
            ),
        ],
    )
    for T in (1, 2, 3):
        batch(
            f"length {T}",
            T,
            [
                ("diffuse", dict(decay=0.9, process_var=1.0, obs_var=1.0)),
                (
                    "prior",
                    dict(decay=0.9, process_var=1.0, obs_var=1.0, prior_mean=1.0, prior_var=2.0),
                ),
            ],
        )
    T_long = 10_000 if quick else 100_000
    batch(
        f"long lanes T={T_long}",
        T_long,
        [
            ("rw, gaps, diffuse", dict(decay=1.0, process_var=0.1, obs_var=1.0, missing=0.2)),
            ("a=0.999", dict(decay=0.999, process_var=0.01, obs_var=1.0, prior_var=1.0)),
        ],
    )
    return out


def growth_families(seed: int, T: int) -> LaneBatch:
    """Model families for the error-against-length study, each one lane of length ``T``."""
    rng = np.random.default_rng([seed, 11, T])
    lanes = [
        _lane(
            "local level (Nile-like)",
            T,
            decay=1.0,
            process_var=1469.1,
            obs_var=15099.0,
            prior_mean=1000.0,
            rng=rng,
            missing=0.1,
            offset=0.0,
        ),
        _lane("AR a=0.9", T, decay=0.9, process_var=1.0, obs_var=1.0, prior_var=1.0, rng=rng),
        _lane("a=1-1e-9, p=1e-6", T, decay=1 - 1e-9, process_var=1e-6, obs_var=1.0, rng=rng),
        _lane(
            "rw + offset 1e-2", T, decay=1.0, process_var=1e-4, obs_var=0.1, offset=0.01, rng=rng
        ),
        # p * phi = 6e-8, about half a float32 ulp of 1: the Möbius leaf entry 1 + p*phi loses the
        # most there (docs/validation.md, "Where float32 drifts")
        _lane(
            "rw, p*phi=6e-8", T, decay=1.0, process_var=6e-8, obs_var=1.0, prior_var=1.0, rng=rng
        ),
    ]
    return LaneBatch.stack(f"growth T={T}", lanes)
