"""The uncertainty a fit reports: standard errors from the observed information at the
estimate, and for an estimate on its bound 0 the one-sided profile upper bound in its place.

Shapes: ``G`` fit groups (the series, or 1 for a joint fit), ``k`` free parameters in the order
of ``free``. The standard errors come from the Hessian of the total negative log-likelihood
(:func:`_standard_errors`): the optimizer's stencil Hessian in ``u = log x``, or, for the groups
:func:`_needs_exact_hessian` picks (a small positive estimate, one on its bound, a stencil Hessian
that is not positive definite), the Hessian in natural coordinates from exact gradients
(:func:`_information`). An estimate on its bound gets none; the others' are those with it held
at 0 (docs/model.md, "Estimates on a boundary"). Such an estimate's upper bound
(:func:`kalmanscan.timeseries.profile.report`, a few dozen refits) is computed when
``OUFit.upper_bound`` or ``OUFit.notes`` is first read (:class:`_LazyBounds`, :class:`_LazyNotes`).
:func:`_natural` and :func:`_jacobi` also serve the fit's Newton steps in natural coordinates
(:func:`kalmanscan.timeseries.fit._refine_small`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kalmanscan.timeseries import optim
from kalmanscan.timeseries.model import PARAMS
from kalmanscan.timeseries.objective import _POSITIVE, _SMALL, _held, _natural_hessian

if TYPE_CHECKING:
    from kalmanscan.timeseries.fit import _Core


def _natural(u: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """The free parameters in natural standardized units from the optimizer's ``u``."""
    with np.errstate(over="ignore", under="ignore"):
        return np.where(positive, np.exp(u), u)


def _jacobi(H: np.ndarray) -> tuple:
    """``(H scaled by its diagonal, dj)``: ``dj = |diag H|^-1/2`` (1 where that is not a
    positive number), so that tests of positive definiteness do not depend on the parameters'
    units (``theta`` of 5e-5 beside ``mu`` of 200 standardized)."""
    diag = np.abs(np.diagonal(H, axis1=1, axis2=2))
    with np.errstate(divide="ignore", invalid="ignore"):
        dj = np.where(np.isfinite(diag) & (diag > 0), 1 / np.sqrt(diag), 1.0)
    return H * dj[:, :, None] * dj[:, None, :], dj


def _mu_unused(core: _Core, joint: bool) -> np.ndarray:
    """``[G]``: groups whose ``theta`` is fixed at 0, where ``mu`` does not enter the
    likelihood (the random walk forgets its mean)."""
    zero = np.asarray(core.est["theta"]) == 0
    return np.array([zero.all()]) if joint else zero


def _needs_exact_hessian(core: _Core, free, why) -> np.ndarray | None:
    """The converged groups whose standard errors take the Hessian from exact gradients
    (:func:`_information`), or None: those with a free positive estimate below ``_SMALL`` of the
    scale off its bound (the stencil's curvature in ``log x`` is rounding there: CO2's near
    random walk, ``theta`` 2e-4 a week, had ``mu``'s 4.6 % off), those with an estimate on its
    bound (the others' errors with it held: the stencil's are ~1e-5 off the closed form), and
    those whose stencil Hessian is not positive definite. The rest keep the stencil's (equal to
    statsmodels' to ~1e-5; the exact one costs a filter call of ``1 + 2k`` gradient points,
    ~1.5 ms on the Nile)."""
    opt = core.opt
    k = opt.u.shape[1]
    if not k:
        return None
    positive = np.array([p in _POSITIVE for p in free], dtype=bool)
    with np.errstate(over="ignore", under="ignore"):
        x = _natural(opt.u, positive)
    small = (positive[None, :] & ~opt.at_boundary & (x < _SMALL)).any(1)
    not_pd = np.array(["positive definite" in str(w) for w in why], dtype=bool)
    need = (opt.status == optim.CONVERGED) & (small | not_pd | opt.at_boundary.any(1))
    return np.flatnonzero(need) if need.any() else None


def _information(core: _Core, free, idx=None) -> np.ndarray:
    """``[G, k, k]``: the Hessian of the total negative log-likelihood in the free parameters
    (natural standardized units) at the estimate of the converged groups ``idx`` (all when
    None), from exact gradients (:func:`_natural_hessian`; NaN elsewhere); the fit's own where
    its last steps made one there (``_Core.exact_hessian``)."""
    opt, data = core.opt, core.data
    G, k = opt.u.shape
    H = np.full((G, k, k), np.nan)
    conv = np.flatnonzero(opt.status == optim.CONVERGED)
    idx = conv if idx is None else np.intersect1d(conv, idx)
    if idx.size and k and core.exact_hessian is not None:  # made by the fit's last steps
        known = np.isfinite(core.exact_hessian[idx]).all((1, 2))
        H[idx[known]] = core.exact_hessian[idx[known]]
        idx = idx[~known]
    if idx.size and k:
        positive = np.array([p in _POSITIVE for p in free], dtype=bool)
        x = _natural(opt.u[idx], positive)
        H[idx] = _natural_hessian(data, x, idx, opt.at_boundary[idx])[2]
    return H


def _standard_errors(core: _Core, free, joint, hess=None):
    """``({name: [G]}, ok [G], why [G])``: standard errors in natural units from the Hessian at
    the estimate, where the estimate is converged and the Hessian positive definite; ``why``
    holds the reason (a short text) where not.

    ``hess [G, k, k]``: the Hessian of the total negative log-likelihood in the natural
    standardized parameters (:func:`_information`: exact gradients differenced, right however
    small a variance); without it, the fit's stencil Hessian in ``u = log x`` (whose curvature
    in a variance of ~1e-5 of the data's scale is rounding noise).

    A parameter on its bound 0 gets none (``OUFit.upper_bound`` bounds it instead); the others get
    the observed information of the free parameters with it held at 0: the Hessian block of the
    interior coordinates, evaluated with the boundary coordinate at its held value (an effect of
    ~1e-14 of the data's scale). ``theta`` on its bound also holds ``mu``, which does not enter
    the likelihood of a random walk, and ``sigma2`` on its bound holds ``theta``, which does not
    enter that of a constant level. docs/model.md, "Estimates on a boundary".
    """
    opt = core.opt
    G, k = opt.u.shape
    s = core.s[:1] if joint else core.s
    if hess is None:
        nobs = core.data.n_obs
        n = np.array([nobs.sum()]) if joint else nobs
        positive = np.array([p in _POSITIVE for p in free])
        # Hessian of the total negative log-likelihood in u; u = log x adds g_j on the diagonal
        Hu = opt.H * n[:, None, None] - (opt.g * n[:, None] * positive)[:, :, None] * np.eye(k)
        jac = np.stack(
            [np.abs(core.est[p][:1] if joint else core.est[p]) if p in _POSITIVE else s
             for p in free],
            1,
        )  # d natural / d u, [G, k]  # fmt: skip
    else:
        Hu, dj = _jacobi(hess)  # (units aside in the test of positive definiteness)
        tau = core.tau
        unit = {"theta": 1 / tau, "sigma2": s**2 / tau, "mu": s, "obs_var": s**2}
        jac = np.stack([np.broadcast_to(unit[p], (G,)) for p in free], 1) * dj  # natural / std
    Hu = 0.5 * (Hu + np.swapaxes(Hu, 1, 2))
    held = _held(core.data, opt.at_boundary)  # (the bounds, and what they leave unidentified)
    why = np.full(G, "", dtype=object)
    why[opt.status != optim.CONVERGED] = "the fit did not converge"
    why[(why == "") & held.all(1)] = "every free estimate is on its boundary"
    se = {p: np.full(G, np.nan) for p in PARAMS}
    for _, rows, keep, pd, cov in optim.held_covariances(Hu, held, why == ""):
        why[rows[~pd]] = "the Hessian is not positive definite (a parameter is not identified)"
        if cov is not None:
            for c, j in enumerate(keep):
                se[free[j]][rows[pd]] = np.sqrt(cov[:, c, c]) * jac[rows[pd], j]
    ok = why == ""
    return se, ok, why


def _fit_standard_errors(core: _Core, free, joint, exact: bool):
    """:func:`_standard_errors` at a fit's estimate: from the stencil Hessian, and, where
    ``exact``, from exact gradients (:func:`_information`) for the groups
    :func:`_needs_exact_hessian` picks."""
    se, ok, why = _standard_errors(core, free, joint)
    idx = _needs_exact_hessian(core, free, why) if exact else None
    if idx is not None:
        se_x, ok_x, why_x = _standard_errors(core, free, joint, _information(core, free, idx))
        for p in se:
            se[p][idx] = se_x[p][idx]
        ok[idx], why[idx] = ok_x[idx], why_x[idx]
    return se, ok, why


def _boundary_note(p: str, where: str, free) -> str:
    """Why free parameter ``p``, on its bound 0 (``where``: in which series, or ""), has no
    standard error, and what the others' are (a note of the fit, and its warning)."""
    ref = "the data's scale squared" if p != "theta" else "one over the median time step"
    return (
        f"{p} is at its lower bound 0{where} (estimate below {optim.BOUNDARY:g} times "
        f"{ref}): the likelihood is largest there, so {p} has no standard error (at a "
        "boundary the likelihood is one-sided and the normal approximation behind "
        "standard errors does not hold); the other parameters' standard errors are "
        f"those with {p} held at 0 (the observed information of the others)"
        + (
            "; mu, which the random walk at theta = 0 does not depend on, has none either"
            if p == "theta" and "mu" in free
            else ""
        )
    )


def _level_ridge(Z, t, fixed_flat, free, joint, usable) -> np.ndarray:
    """``[G]``: the groups whose local level (``theta`` fixed at 0, so a diffuse prior) cannot
    tell ``sigma2`` and ``obs_var`` apart: each usable series of the group has exactly 2
    observations, the same positive time apart (``Z [T, N]``, times ``t [T]``). A series of two
    has one innovation, ``z2 - z1 ~ N(0, sigma2 dt + 2 obs_var)``, so the likelihood is flat
    along that sum (:func:`_ridge_note`); the Hessian need not show it where the optimizer stops
    with one of the two on its bound."""
    N = Z.shape[1]
    G = 1 if joint else N
    theta = fixed_flat.get("theta")
    if theta is None or not {"sigma2", "obs_var"} <= set(free):
        return np.zeros(G, bool)
    obs = ~np.isnan(Z)
    first = np.argmax(obs, 0)
    last = Z.shape[0] - 1 - np.argmax(obs[::-1], 0)
    gap = np.asarray(t, dtype=np.float64)[last] - np.asarray(t, dtype=np.float64)[first]
    ridge = (np.asarray(theta) == 0) & (obs.sum(0) == 2) & (gap > 0) & usable
    if not joint:
        return ridge
    g = gap[usable]
    same = g.size > 0 and bool(np.all(np.abs(g - g[0]) <= 1e-12 * g[0]))
    return np.array([same and bool(ridge[usable].all())])


def _ridge_note(where: str) -> str:
    """The note (and warning) of a fit :func:`_level_ridge` finds (``where``: in which series,
    or "")."""
    return (
        f"sigma2 and obs_var are not identified{where}: with two observations a series has one "
        "innovation (the second value less the first), and the local level's likelihood depends "
        "on sigma2 and obs_var only through its variance sigma2 * dt + 2 obs_var (dt the time "
        "between them), the same all along that line; the estimates are one point of it, with "
        "no standard errors and no boundary verdict; fix one of them (e.g. obs_var, a "
        "measurement's known error variance) or give more observations"
    )


def _bounds_on_read(profile_args: tuple, notes, shaped) -> tuple:
    """``(OUFit.upper_bound, OUFit.notes)``: the boundary estimates' profile bounds
    (:func:`kalmanscan.timeseries.profile.report` on ``profile_args``), shaped by ``shaped``, and
    ``notes`` followed by the bounds' own, both computed when first read."""
    lazy = _LazyProfile(profile_args)
    return _LazyBounds(lazy, shaped), _LazyNotes(tuple(notes), lazy)


class _LazyProfile:
    """:func:`kalmanscan.timeseries.profile.report` on a fit's arguments, run once on demand."""

    def __init__(self, args):
        self._args, self._result = args, None

    def result(self):
        if self._result is None:
            from kalmanscan.timeseries import profile

            self._result = profile.report(*self._args)
            self._args = None
        return self._result


class _LazyBounds(Mapping):
    """``OUFit.upper_bound``: ``{name: bound}`` (shaped as the fit's other per-series results
    by ``shaped``), computed on first access."""

    def __init__(self, lazy: _LazyProfile, shaped):
        self._lazy, self._shaped, self._d = lazy, shaped, None

    def _dict(self):
        if self._d is None:
            self._d = {p: self._shaped(v) for p, v in self._lazy.result()[0].items()}
        return self._d

    def __getitem__(self, key):
        return self._dict()[key]

    def __iter__(self):
        return iter(self._dict())

    def __len__(self):
        return len(self._dict())

    def __repr__(self):
        return repr(self._dict())

    def __reduce__(self):  # (pickled and copied as its values: the bounds computed then)
        return dict, (self._dict(),)


class _LazyNotes(Sequence):
    """``OUFit.notes``: the fit's notes, then the profile bounds' notes once computed."""

    def __init__(self, first: tuple, lazy: _LazyProfile):
        self._first, self._lazy = first, lazy

    def _all(self):
        return self._first + tuple(self._lazy.result()[1])

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self):
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __repr__(self):
        return repr(self._all())

    def __reduce__(self):  # (pickled and copied as its values, as _LazyBounds)
        return tuple, (self._all(),)
