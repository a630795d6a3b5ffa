"""Robust fitting: an outlier screen on the observation noise, iterated to a fixed point.

``fit_ou(z, robust=True)`` (or :func:`fit_ou_robust`, which takes the threshold) fits the Gaussian
model, computes every observation's standardized auxiliary residual (Harvey & Koopman 1992;
Durbin & Koopman 2012, section 2.12)

    a_t = (z_t - E[x_t | all kept data]) / sqrt(Var(z_t - E[x_t | ...]))

from the smoother (``obs_var - P_t|T`` for a kept observation, ``obs_var + P_t|T`` for a screened
one, whose smoothed state does not use it), marks the observations with ``|a_t| > threshold`` as
missing and refits, until the marked set repeats (at most ``max_rounds`` fits). The marked set is
recomputed from scratch each round, so an observation marked under a fit that an outlier wrecked
is restored once the fit is sound. ``a_t`` is the standardized deletion residual: the
observation against its prediction from all the others.

Default threshold: the two-sided Bonferroni bound at 5% family-wise for the series' ``n``
observations under the Gaussian model, at least 3.5: ``max(3.5, Phi^-1(1 - 0.025 / n))`` (3.5 for
Nile's 100 years, 4.06 for 1,000 observations, 4.56 for 10,000), so a clean Gaussian record loses
nothing with probability about 95%. At most a quarter of a series' observations are screened (the
largest ``|a_t|``); beyond that the model, not the data, is likely wrong, and a warning says so.
Where the fit puts ``obs_var`` on its bound 0 (``fit.at_boundary``, the fit's own verdict, not the
size of the estimate) a kept observation is its state: its residual is 0 over a variance of 0,
undefined, and it is not screened. A screened observation keeps its residual there, against its
prediction from the kept data, whose variance is the state's (``P_t|T``): a code screened in one
round stays screened under a fit that puts ``obs_var`` on its bound. A given (``fix``) ``obs_var``
has no bound: however small, ``a_t`` is defined, and where ``obs_var - P_t|T`` would lose its
digits (``fix={"obs_var": 1e-12}`` on the Nile) it is computed in the deletion form directly.

A move of the level is no outlier. The state's standardized innovation (the other auxiliary
residual: ``E[eta_t | kept data] / sd`` on the step into row ``t``; undefined where ``sigma2`` is on
its bound) shows a break where ``a_t`` shows an outlier. Two neighbouring observations whose
``|a_t|`` exceed the threshold with opposite signs are the two sides of one move, and neither is
screened, where the state's innovation on a step between them exceeds both ``|a_t|`` and none on
the steps from the observation before them to the one after exceeds the threshold (the state
moved once and stayed). A record held at 2.5 for 20 steps and at 2.6 for 30 shows ``a_t`` of
-4.6 and 4.6 at the two sides of its move and 6.6 on the step between: it has no outlier. An
outlier's neighbours have at most about half its ``|a_t|``, and two neighbouring outliers of
opposite sign need the state to move there and back. (A limit: an outlier directly beside a
move, on the move's side, a rate held at 2.5, one value of 3.3, then held at 3.0, shows the
move's pattern at 2.5 and 3.3 and is spared with it.)

A run of gross values masks itself: two adjacent ``-9999`` (a missing-value code) among
temperatures of 10 to 30 are fitted as a level that jumps there and back, with ``obs_var`` at 0,
so no ``a_t`` is defined and nothing would be screened. The first round therefore starts from a
fit without the :func:`gross_runs`, stretches of values more than 50 typical steps (the median
nonzero change between neighbours, leaving out the jumps of values remote from the rest) from the
values on both sides of them, to which the series then returns; at the start or end of a series,
where no return tells them from a level shift, only a run of one repeated value (a code) counts.
In a record that rests on its level (most values equal it), the values farther from the level
than it is from 0 set neither the spread nor the step (:func:`_typical_step`): -999 and -9999 in
a constant record, or -999 in one held at 1000 but for one value of 1000.5, are gross runs.
The rounds then go on from scratch as above; an ordinary level shift or trend is no such run.

Where the plain fit cannot even start (one 1e300 among values of order 1000 puts the data's
scale beyond float64), the first round screens the values more than 1e8 typical steps (the same
measure) from the median instead, and the rounds go on from there. The result is the Gaussian fit
without the screened observations: estimates, standard errors and forecasts keep their usual
meaning.
Docs: docs/model.md, "Robust fitting".

Why a screen and not Student-t noise by iterated reweighting: the t model's ``obs_var`` is a scale,
not the noise variance the Gaussian model, its standard errors and its forecast bands speak of, and
its weights only shrink an outlier of 1e12 to a weight of ~1e-20, not to nothing; on clean data
the screen gives exactly the Gaussian fit.
"""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import _args
from kalmanscan.timeseries._messages import _names, _plain, unnamed
from kalmanscan.timeseries.time_cftime import is_cftime

_MIN_THRESHOLD = 3.5
_MAX_FRACTION = 0.25
_GROSS = 1e8  # typical steps from the median: gross beyond any record a float64 fit can scale
_RUN_STEPS = 50.0  # typical steps from both sides: a gross run (largest in real records: ~10)
_REMOTE = 50.0  # spreads from the median: a value whose changes the typical step leaves out


class OutlierWarning(UserWarning):
    """``fit_ou``'s warning that a few observations of a series dominate its fit or lie in
    :func:`gross_runs`; one per series. Besides the text (``"fit_ou: "`` and the note):

    - ``series``: the series' label (e.g. its DataFrame column), else its index, or ``None`` for
      one unlabelled series;
    - ``rows``: the rows it names (from 0, in time order; ``int64 [k]``);
    - ``gross``: True where they are the series' gross runs (a missing-value code, a data error);
    - ``effect``: ``"dominate(s) the likelihood: without them <name> is <a> instead of <b> (a
      factor <f>)"``, or ``None`` where leaving them out moves no variance tenfold;
    - ``note``: the text the fit's ``notes`` hold.

    Filter it like any warning: ``warnings.simplefilter("ignore", OutlierWarning)``.
    """

    def __init__(self, note: str, *, series=None, rows=(), gross=False, effect=None):
        super().__init__("fit_ou: " + note)
        self.note, self.series, self.gross, self.effect = note, series, bool(gross), effect
        self.rows = np.asarray(rows, dtype=np.int64)


def default_threshold(n_obs) -> np.ndarray:
    """``max(3.5, Phi^-1(1 - 0.025 / n))`` per series (see the module docstring).

    >>> default_threshold([100, 1000, 10000]).round(2).tolist()
    [3.5, 4.06, 4.56]
    """
    n = np.maximum(np.asarray(n_obs, dtype=np.float64), 1.0)
    nd = NormalDist()
    bonf = np.array([nd.inv_cdf(1 - 0.025 / v) for v in n.ravel()]).reshape(n.shape)
    return np.maximum(_MIN_THRESHOLD, bonf)


class Disturbances(NamedTuple):
    """Standardized smoothed disturbances of a fit (the auxiliary residuals of Harvey & Koopman
    1992; Durbin & Koopman 2012, section 2.12), float64 arrays laid out as the data (``[T, *S]``
    from :meth:`OUFit.disturbances`, ``[T, N]`` inside this module); NaN where undefined.

    - ``observation``: ``a_t`` of the module docstring, the observation against its prediction
      from the others. NaN where ``z_t`` is missing, and for a kept observation where
      ``obs_var`` is on its bound 0 (``fit.at_boundary``): the observation is then the state,
      its noise 0 with variance 0. A screened observation keeps its residual there: against
      its prediction from the kept data, whose variance is the state's.
    - ``state``: the state's innovation on the step from row ``t - 1`` to row ``t`` (a level
      shift there, for ``theta`` near 0), ``E[eta_t | kept data] / sd``. NaN in row 0, where
      ``sigma2`` is on its bound 0 (the state moves only as the model's drift says), and on the
      steps the kept data say nothing of (after the last kept observation; before the first
      one where the start is diffuse).

    >>> import kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> d = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).disturbances()
    >>> d._fields, d.observation.shape, bool(np.isnan(d.state[0]))
    (('observation', 'state'), (100,), True)
    """

    observation: np.ndarray
    state: np.ndarray


def smoothed_disturbances(fit, z, screened) -> Disturbances:
    """Both standardized residuals (:class:`Disturbances`) of the data ``z [T, N]`` under
    ``fit`` (fitted to ``z`` with ``screened [T, N]`` set missing), from one smoother pass.
    Which of them are defined follows ``fit.at_boundary`` (the fit's own verdict that a variance
    is 0), not the size of the estimate. Derivation: docs/model.md, "Robust fitting".

    >>> import numpy as np, kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> d = smoothed_disturbances(fit, flow[:, None].astype(float), np.zeros((100, 1), bool))
    >>> top = lambda r: int(years[np.nanargmax(np.abs(r[:, 0]))])
    >>> top(d.state), top(d.observation)  # the break of 1899 and the outlier of 1913 (D&K 2.12)
    (1899, 1913)
    """
    p = _smoothed(fit, z, screened)
    T, N = z.shape
    zs, R, mean, var = p.zs, p.R, p.mean, p.var
    kept_exact = ~screened & p.obs_var_at_bound  # z_t is x_t: no noise to standardize
    v = np.where(screened, R + var, R - var)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = (zs - mean) / np.sqrt(v)
        # where obs_var is tiny beside P_t|T (a fixed 1e-12), R - P_t|T and z_t - E[x_t | data]
        # lose their digits: there the deletion form, z_t against its prediction from the others
        lost = (~screened & ~np.isnan(zs) & ~kept_exact & ~(v > 1e-6 * R)).any(0)
    for i in np.flatnonzero(lost):
        a[:, i] = _deletion_residual(p, i)
    a = np.where(np.isnan(zs) | kept_exact | ~(v > 0) & ~lost, np.nan, a)

    # the step t-1 -> t: eta_t = x_t - phi_t x_{t-1} - c_t; Var(eta_t | data) from the smoothed
    # variances and the lag-one covariance J_{t-1} P_t|T (J = phi P_t-1|t-1 / P_t|t-1)
    phi, q, c = p.phi[1:], p.q[1:], p.c[1:]
    prec, pred_prec = p.prec, p.pred_prec
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        gain = phi * pred_prec[1:] / prec[:-1]
        eta = mean[1:] - phi * mean[:-1] - c
        v_eta = q - var[1:] * (1 - 2 * phi * gain) - phi**2 * var[:-1]
        b = eta / np.sqrt(v_eta)
    # the kept data say nothing of a step with no kept observation at or after it, nor, from a
    # diffuse start (theta 0), of one with none before it: 0 over a variance of 0 there
    kept = ~screened & ~np.isnan(z)
    after = np.flip(np.logical_or.accumulate(np.flip(kept, 0), 0), 0)[1:]
    before = np.logical_or.accumulate(kept, 0)[:-1]
    informed = after & (before | ~p.diffuse)
    b = np.where(p.sigma2_at_bound | ~informed | ~(v_eta > 0), np.nan, b)
    state = np.concatenate([np.full((1, N), np.nan), b])
    return Disturbances(a, state)


class _Smoothed(NamedTuple):
    """One smoother pass of :func:`smoothed_disturbances`, ``[T, N]`` arrays in the data's
    standardized units (``zs``; ``R``, ``mean``, ``var`` alike), the steps' ``phi, q, c`` into
    each row (row 0 unused) and the per-series flags ``[N]``."""

    zs: np.ndarray
    kept: np.ndarray
    R: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    prec: np.ndarray
    pred_prec: np.ndarray
    pred_info: np.ndarray
    phi: np.ndarray
    q: np.ndarray
    c: np.ndarray
    obs_var_at_bound: np.ndarray
    sigma2_at_bound: np.ndarray
    diffuse: np.ndarray


def _smoothed(fit, z, screened) -> _Smoothed:
    from kalmanscan.timeseries.model import OUModel
    from kalmanscan.timeseries.moments import _nan_moments

    T, N = z.shape
    # in the data's units (m, s) per series: the filter in natural units underflows for data
    # of order 1e-100 and below
    m, s, _ = _nan_moments(np.where(screened, np.nan, z))
    m = np.where(np.isfinite(m), m, 0.0)
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)

    def per_series(name):
        v = np.asarray(fit.params[name], dtype=np.float64)
        return np.broadcast_to(v, fit.z.shape[1:]).reshape(N)

    def at_bound(name):
        v = np.asarray(fit.at_boundary.get(name, False), dtype=bool)
        return np.broadcast_to(v, fit.z.shape[1:]).reshape(N)

    model = OUModel(
        theta=per_series("theta"),
        sigma2=per_series("sigma2") / s**2,
        mu=(per_series("mu") - m) / s,
        obs_var=per_series("obs_var") / s**2,
        time_unit=fit.model.time_unit,
    )
    zs = (z - m) / s
    sm = model.filter_prepared(np.where(screened, np.nan, zs), fit.time_axis, smooth=True)
    args = model.filter_args(fit.time_axis, 1)
    flt = sm.filtered

    def rows(v):
        return np.broadcast_to(np.asarray(v, dtype=np.float64), (T, N))

    pred_prec = np.asarray(flt.pred_precision, dtype=np.float64).reshape(T, N)
    with np.errstate(invalid="ignore"):
        pred_info = np.where(
            pred_prec > 0, pred_prec * np.asarray(flt.pred_mean).reshape(T, N), 0.0
        )
    return _Smoothed(
        zs=zs,
        kept=~screened & ~np.isnan(z),
        R=rows(per_series("obs_var") / s**2),
        mean=np.asarray(sm.mean, dtype=np.float64).reshape(T, N),
        var=np.asarray(sm.var, dtype=np.float64).reshape(T, N),
        prec=np.asarray(flt.precision, dtype=np.float64).reshape(T, N),
        pred_prec=pred_prec,
        pred_info=pred_info,
        phi=rows(args["decay"]),
        q=rows(args["process_var"]),
        c=rows(args["offset"]),
        obs_var_at_bound=at_bound("obs_var"),
        sigma2_at_bound=at_bound("sigma2"),
        diffuse=(per_series("theta") == 0) | at_bound("theta"),
    )


def _from_after(p: _Smoothed, i: int):
    """``(lam, eta) [T]``: the information about ``x_t`` from the kept observations after row
    ``t`` of series ``i`` (the sequential backend's backward information filter through the OU
    steps)."""
    from kalmanscan.core.sequential import backward_information

    def col(x):
        return torch.as_tensor(np.ascontiguousarray(x[:, i : i + 1], dtype=np.float64))

    z = col(np.where(p.kept, p.zs, np.nan))
    U, E, V = backward_information(z, col(p.R), col(p.phi), col(p.q), torch.ones_like(z),
                                   col(p.c))  # fmt: skip
    return (U / V)[:, 0].numpy(), (E / V)[:, 0].numpy()


def _deletion_residual(p: _Smoothed, i: int) -> np.ndarray:
    """``a_t [T]`` of series ``i`` in the deletion form: ``z_t`` against its prediction from all
    the kept observations but ``z_t`` (the filter's prediction from those before it, joined with
    :func:`_from_after`), over ``sqrt(obs_var + its variance)``: the value of the smoother's
    form without its cancellation where ``obs_var`` is tiny beside ``P_t|T``."""
    lam, eta = _from_after(p, i)
    prec = p.pred_prec[:, i] + lam
    with np.errstate(invalid="ignore", divide="ignore"):
        pred = (p.pred_info[:, i] + eta) / prec
        return np.where(prec > 0, (p.zs[:, i] - pred) / np.sqrt(p.R[:, i] + 1.0 / prec), np.nan)


def auxiliary_residuals(fit, z, screened) -> np.ndarray:
    """Standardized auxiliary residuals ``[T, N]`` of the data ``z [T, N]`` under ``fit`` (fitted
    to ``z`` with ``screened [T, N]`` set missing): :func:`smoothed_disturbances`'
    ``observation`` (NaN where ``z`` is missing, and for kept observations where ``obs_var`` is
    on its bound 0).

    >>> import numpy as np, kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    >>> z = flow[:, None]
    >>> r = auxiliary_residuals(fit, z, np.zeros(z.shape, bool))
    >>> r.shape, int(years[np.nanargmax(np.abs(r[:, 0]))])  # the outlier of 1913
    ((100, 1), 1913)
    """
    return smoothed_disturbances(fit, z, screened).observation


def _level_moves(d: Disturbances, flagged, observed, c) -> np.ndarray:
    """``[T, N]`` True for the flagged observations that are the two sides of one move of the
    state (Harvey & Koopman 1992: a break shows in the state's residuals, an outlier in the
    observation's): neighbouring observations (missing rows between them skipped), both flagged
    with residuals of opposite sign, the state's innovation on a step between them larger in
    size than both residuals, and none beyond the threshold ``c [N]`` on the steps from the
    observation before to the one after them (the state moved once and stayed). An outlier does
    not show so: its neighbours' residuals are at most about half its own and the steps into
    and out of it are smaller than its residual; two neighbouring outliers of opposite sign
    need the state to move there and back (in an OU that forgets fast, its innovations are the
    observations' residuals). ``d.state`` is NaN where ``sigma2`` is on its bound: nothing is a
    move there."""
    a, b = d.observation, np.abs(d.state)
    T, N = a.shape
    out = np.zeros((T, N), bool)
    for i in np.flatnonzero(flagged.sum(0) >= 2):
        rows = np.flatnonzero(observed[:, i])
        t0, t1 = rows[:-1], rows[1:]
        pair = flagged[t0, i] & flagged[t1, i] & (np.sign(a[t0, i]) * np.sign(a[t1, i]) < 0)
        for j in np.flatnonzero(pair):
            lo = rows[j - 1] + 1 if j > 0 else 0  # the steps into t0 from the row before
            hi = rows[j + 2] if j + 2 < rows.size else T - 1  # and out of t1 to the row after
            between = b[t0[j] + 1 : t1[j] + 1, i]
            beside = np.r_[b[lo : t0[j] + 1, i], b[t1[j] + 1 : hi + 1, i]]
            shift = np.max(between, initial=-np.inf, where=~np.isnan(between))
            if shift > max(abs(a[t0[j], i]), abs(a[t1[j], i])) and not (beside > c[i]).any():
                out[[t0[j], t1[j]], i] = True
    return out


def _check(threshold, max_rounds):
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(
            threshold, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"threshold: expected a number > 0 or None, got {_plain(threshold)}")
        if not (math.isfinite(float(threshold)) and float(threshold) > 0):
            raise ValueError(f"threshold: expected a finite number > 0, got {_plain(threshold)}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, (int, np.integer)):
        raise TypeError(f"max_rounds: expected an int >= 1, got {_plain(max_rounds)}")
    if max_rounds < 1:
        raise ValueError(f"max_rounds: expected an int >= 1, got {_plain(max_rounds)}")


def _quiet_fit(fit_ou, z, times, kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = fit_ou(z, times, **kwargs)
    return fit, caught


def fit_ou_robust(z, times=None, *, threshold=None, max_rounds: int = 10, **kwargs):
    """:func:`kalmanscan.fit_ou` with an outlier screen (see the module docstring); ``kwargs``
    are ``fit_ou``'s. ``threshold``: screen ``|a_t|`` above it (default: per series,
    :func:`default_threshold`). Returns the :class:`~kalmanscan.timeseries.result.OUFit` of the last
    round, its ``z`` with the screened observations set to NaN and ``outliers [T, *S]`` marking
    them; a note (and a warning) names the screened rows.

    >>> import numpy as np, kalmanscan as ks
    >>> from kalmanscan.timeseries import load_nile
    >>> years, flow = load_nile()
    >>> bad = flow.astype(float)
    >>> bad[30] = 1e12  # a data error in 1901
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # "row 30 (time 1901, z = 1e+12) screened out"
    ...     fit = fit_ou_robust(bad, years, fix={"theta": 0.0, "mu": 0.0})
    >>> round(fit.params["obs_var"], -2), round(fit.params["sigma2"], -1)
    (15400.0, 1380.0)
    >>> np.flatnonzero(fit.outliers).tolist()
    [30]
    """
    from kalmanscan.timeseries.fit import _check_series_labels, fit_ou
    from kalmanscan.timeseries.model import series_input
    from kalmanscan.timeseries.times import as_time_axis

    _check(threshold, max_rounds)
    kwargs = dict(kwargs, robust=False)
    axis = kwargs.pop("axis", 0)
    try:
        zt, t_in, labels = series_input(z, times, axis)
    except (TypeError, ValueError):  # the fit names the argument
        fit_ou(z, times, axis=axis, **kwargs)
        raise
    zt = np.asarray(zt, dtype=np.float64)
    shape = zt.shape[1:]
    if kwargs.get("series_labels") is not None:
        labels = _check_series_labels(kwargs["series_labels"], shape)
    if labels:  # the refits, on arrays, name the series as the first fit does
        kwargs["series_labels"] = labels
    T = zt.shape[0]
    Z = zt.reshape(T, -1)
    N = Z.shape[1]
    screened = gross_runs(Z)  # a run of gross values hides from a_t: the start leaves it out
    fit = None
    if not screened.any():
        try:
            fit, caught = _quiet_fit(fit_ou, z, times, dict(kwargs, axis=axis))  # checks all once
        except ValueError:
            pass  # e.g. one 1e300 puts the data's scale beyond float64: try without gross ones
    if fit is not None:
        ax, labels = fit.time_axis, fit.series_labels
    else:
        ax = as_time_axis(t_in, T, kwargs.get("time_unit"))
        if not screened.any():
            screened = _gross(Z)
            if not screened.any():  # nothing gross: the fit's own error stands
                fit_ou(z, times, axis=axis, **kwargs)
        try:
            fit, caught = _quiet_fit(
                fit_ou, np.where(screened, np.nan, Z).reshape(zt.shape), ax, kwargs
            )
        except ValueError as e:  # (a constant record but for a code): say what was left out
            raise _without(e, "gross", ax, Z, screened, labels) from e
    n_obs = (~np.isnan(Z)).sum(0)
    c = (
        default_threshold(n_obs)
        if threshold is None
        else np.full(N, float(threshold), dtype=np.float64)
    )
    limit = np.floor(_MAX_FRACTION * n_obs).astype(np.int64)
    seen = [screened]
    capped = np.zeros(N, bool)
    rounds = 1
    settled = False
    while True:
        d = smoothed_disturbances(fit, Z, screened)
        a = np.abs(d.observation)
        new = np.nan_to_num(a, nan=0.0) > c
        new &= ~_level_moves(d, new, ~np.isnan(Z), c)  # a move of the level: no outliers
        over = new.sum(0) > limit
        capped |= over
        for i in np.flatnonzero(over):  # keep the largest |a| within the cap
            keep = np.argsort(-np.where(new[:, i], a[:, i], -1.0))[: limit[i]]
            new[:, i] = False
            new[keep, i] = True
        if any(np.array_equal(new, s) for s in seen):
            settled = np.array_equal(new, screened)
            break
        if rounds == max_rounds:
            break
        screened = new
        seen.append(new)
        Zc = np.where(screened, np.nan, Z).reshape(zt.shape)
        try:
            fit, caught = _quiet_fit(fit_ou, Zc, ax, kwargs)
        except ValueError as e:  # (constant but for the screened values)
            raise _without(e, "screened", ax, Z, screened, labels) from e
        rounds += 1
    for w in caught:  # the last fit's own warnings
        warnings.warn(w.message, w.category, stacklevel=3)
    notes = list(fit.notes)
    rows, cols = np.nonzero(screened)
    if rows.size:
        parts = []
        for i in np.unique(cols):
            r = rows[cols == i]
            shown = ", ".join(_row(ax, Z, t, i) for t in r[:5])
            more = f" and {r.size - 5} more" if r.size > 5 else ""
            who = f"series {labels[i]!r}: " if labels else (f"series {i}: " if N > 1 else "")
            parts.append(f"{who}{shown}{more}")
        text = (
            f"robust: {rows.size} observation{'s' if rows.size != 1 else ''} screened out as "
            f"outliers (|standardized auxiliary residual| > {_fmt_threshold(c)}) and fitted as "
            "missing: " + "; ".join(parts)
        )
        notes.append(text)
        warnings.warn("fit_ou: " + text, stacklevel=3)
    if capped.any():
        idx = np.flatnonzero(capped)
        where = "the series" if unnamed(N, labels) else "series " + _names(idx, labels)
        text = (
            f"robust: more than a quarter of the observations exceed the threshold in {where}; "
            "only the largest quarter were screened: the model may not suit these data"
        )
        notes.append(text)
        warnings.warn("fit_ou: " + text, stacklevel=3)
    if not settled and rows.size:
        text = (
            f"robust: the screened set had not settled after {rounds} fits (max_rounds="
            f"{max_rounds}); the last one is reported"
        )
        notes.append(text)
        warnings.warn("fit_ou: " + text, stacklevel=3)
    fit.notes = tuple(notes)
    fit.series_labels = labels
    fit.outliers = screened.reshape(zt.shape) if shape else screened[:, 0]
    fit.outlier_values = np.asarray(Z[screened], dtype=np.float64)  # (z[outliers]'s order)
    return fit


def _without(e, what, ax, Z, screened, labels) -> ValueError:
    """The fit's error ``e`` for the data ``Z [T, N]`` without the ``screened`` values, naming
    them: ``... (robust=True fitted without the gross values row 15 (time 15, z = -999))``."""
    rows, cols = np.nonzero(screened)
    N = Z.shape[1]
    shown = ", ".join(
        _row(ax, Z, t, i)
        + (f" of series {labels[i]!r}" if labels else f" of series {i}" if N > 1 else "")
        for t, i in zip(rows[:5], cols[:5], strict=True)
    ) + (f" and {rows.size - 5} more" if rows.size > 5 else "")
    return ValueError(f"{e} (robust=True fitted without the {what} values {shown})")


def _label(t) -> str:
    """A timestamp as short as it is exact: ``2024-05-07T09:00``, ``1901``, ``0.25``."""
    if isinstance(t, np.datetime64):
        return str(np.datetime_as_string(t, unit="auto"))
    if is_cftime(t):  # (a model calendar's date: 2000-02-30T00:00:00)
        return t.isoformat()
    v = float(t)
    return str(int(v)) if v.is_integer() and abs(v) < 2.0**53 else repr(v)


def _row(ax, Z, t, i) -> str:
    """Value ``Z[t, i]`` named as the notes and warnings name it: ``row 20 (time 2024-01-21,
    z = -9999)``; a period as pandas writes it: ``time 1962Q1``; a time given with a timezone
    in it: ``time 2024-04-01 00:00:00+02:00``."""
    zoned = ax.utc and not ax.is_cftime and isinstance(ax.labels[t], np.datetime64)
    label = ax.label_text(ax.labels[t])[0] if ax.period_freq or zoned else _label(ax.labels[t])
    return f"row {int(t)} (time {label}, z = {Z[t, i]:.6g})"


def _typical_step(x) -> np.ndarray:
    """The typical step of each column of ``x [T, M]`` (or ``[T]``): the median nonzero absolute
    change between neighbouring values, leaving out the changes into and out of remote values
    (``[M]``, or a float; NaN where a column never changes). A column holds its observed values
    in order, then NaN padding (:func:`_observed_first`). The one measure :func:`gross_runs` and
    the first round's screen of values beyond float64's reach count in.

    - Zero changes are left out: in a series that rests on its values (rounded data, integer
      counts, a rate held for months) they say nothing of the size of a move, and a median of
      mostly zeros would be 0.
    - Remote values are those more than ``_REMOTE`` (50) times the values' spread from their
      median, the spread being the median nonzero distance of the values from the median: a
      missing-value code or a data error. Their jumps are no moves of the series; in a series
      that seldom moves, four -9999 among rates held for months at steps of 0.25 would otherwise
      outnumber its moves and set the step (at 10,001). The spread, a median over the values
      (not the moves), is the spread of the series' own values as long as these outnumber the
      remote ones (values of real records lie within 15 spreads of their median, affairs counts
      within 48: leaving out beyond 50 leaves their step as it was).
    - In a series that rests on its level (more than half its values equal the median, which is
      not 0), the spread is taken over the values no farther from the level than the level is
      from 0: far values (a -999 in a record held at 1000, its distance 1999 about twice the
      level) cannot set it where they outnumber the series' own few moves.
    - A series that never moves but to and from far values (a constant record with -999 and
      -9999 codes; with one far value, if most values are not the level) has no step of its
      own; there the level's size stands in, ``|median| / 50``, so that a value farther from the
      level than the level is from 0 counts as gross. (A record resting on 0, such as rare 0/1
      events, has no such scale and keeps the median change.)

    >>> float(_typical_step(np.array([3.0, 3.0, 3.0, 4.0, 4.0, 6.0, 6.0, 6.0])))  # (moves 1, 2)
    1.5
    >>> held = np.repeat([2.5, 2.75, 2.75, 2.5, 2.25, 2.5], 8)
    >>> held[[5, 15, 25, 35]] = -9999.0  # a code more often than the rate moves
    >>> float(_typical_step(held))
    0.25
    >>> blip = np.full(40, 1000.0)
    >>> blip[[15, 20]] = -999.0, 1000.5  # a code, and the record's one move of its own
    >>> float(_typical_step(blip))
    0.5

    Numpy arrays are measured in numpy (the same operations, so the same values: a few
    microseconds an operation where torch's on such small arrays take several times more),
    tensors where they are (a GPU fit's screen).
    """
    if not isinstance(x, torch.Tensor):
        x = np.array(x, dtype=np.float64)
        if x.shape[0] == 0:  # (numpy's reductions refuse an empty axis)
            return _typical_step(torch.as_tensor(x)).numpy()[()]
    xp = torch if isinstance(x, torch.Tensor) else np
    with np.errstate(invalid="ignore", over="ignore"):
        level = _median_where(x, ~xp.isnan(x))
        dev = xp.abs(x - level)  # (inf where a value and the level overflow)
        scale = xp.abs(level)
        far = dev > scale  # farther from the level than the level is from 0
        # a record that rests on its level (more than half its values equal it, so their median
        # distance is 0): the spread of the values near it, where there are any; else of all
        observed = (~xp.isnan(x)).sum(0)
        resting = ((dev == 0).sum(0) > observed // 2) & (scale > 0) & xp.isfinite(scale)
        near_moves = (dev > 0) & ~far
        own = resting & near_moves.any(0)
        spread = _median_where(dev, (dev > 0) & (~far | ~own))
        near = dev <= _REMOTE * spread
        step = xp.abs(x[1:] - x[:-1])  # (inf where two values of opposite sign overflow)
        typical = _median_where(step, (step > 0) & near[1:] & near[:-1])
        # one that never moves but to and from far values (one far value, if it does not rest)
        one = xp.amin(xp.where(far, x, math.inf), 0) == xp.amax(xp.where(far, x, -math.inf), 0)
        moves = (step > 0) & ~far[1:] & ~far[:-1]
        rests = (scale > 0) & xp.isfinite(scale) & far.any(0) & ~moves.any(0) & (one | resting)
        out = xp.where(rests, scale / _RUN_STEPS, typical)
    return out if xp is torch else out[()]


def _observed_first(Z):
    """``(X, n)``: each column of ``Z [T, N]`` (numpy or torch) with its observed (non-NaN) values
    first, in time order, then NaN; ``n [N]`` the number observed."""
    xp = torch if isinstance(Z, torch.Tensor) else np
    ok = ~xp.isnan(Z)
    before = ok.cumsum(0)  # observed values up to and including each row
    n = before[-1]
    rows = xp.arange(1, Z.shape[0] + 1)[:, None]
    if xp is torch:
        rows = rows.to(Z.device)
    dest = xp.where(ok, before - 1, n + rows - before - 1)  # (a stable partition)
    if xp is torch:
        return torch.empty_like(Z).scatter_(0, dest, Z), n
    X = np.empty_like(Z)
    np.put_along_axis(X, dest, Z, axis=0)
    return X, n


def _median_where(a, keep):
    """The median over axis 0 of ``a [T, M]`` (or ``[T]``; numpy or torch) where ``keep`` (NaN
    where nothing is kept): ``nanmedian`` of the kept values, all columns in one sort."""
    T = a.shape[0]
    if T == 0:
        if isinstance(a, torch.Tensor):
            return torch.full(a.shape[1:], math.nan, dtype=a.dtype, device=a.device)
        return np.full(a.shape[1:], np.nan, dtype=a.dtype)
    xp = torch if isinstance(a, torch.Tensor) else np
    flat, k = a.reshape(T, -1), keep.reshape(T, -1)
    w = xp.where(k, flat, math.inf)
    if xp is np:
        kept = np.sort(w, axis=0)
    elif w.device.type == "cpu":  # numpy's sort along columns is several times faster than torch's
        kept = torch.from_numpy(np.sort(w.numpy(), axis=0))
    else:
        kept = torch.sort(w, dim=0).values
    c = k.sum(0)
    cols = xp.arange(flat.shape[1])
    if xp is torch:
        cols = cols.to(a.device)
    lo = kept[xp.where(c > 0, (c - 1) // 2, 0), cols]
    hi = kept[xp.where(c // 2 < T - 1, c // 2, T - 1), cols]
    return xp.where(c > 0, (lo + hi) / 2, math.nan).reshape(a.shape[1:])


def _gross(Z) -> np.ndarray:
    """``[T, N]`` True for values more than ``_GROSS`` typical steps (:func:`_typical_step`) from
    the series' median: the first round's screen when the plain fit cannot even start (a 1e300
    among values of order 1). Where no value is that far because the only moves are those to and
    from the gross values (a record of 0s with one 1e300, or a constant one with a 1e300 and a
    5e299: the typical step is theirs), and more than half the values equal the median, the
    values that differ from it. At most a quarter of a series is screened; else none of it."""
    out = np.zeros(Z.shape, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(Z.shape[1]):
            v = Z[:, i]
            ok = ~np.isnan(v)
            if ok.sum() < 3:
                continue
            med = np.median(v[ok])
            dev = np.abs(v - med)
            d = _typical_step(v[ok])
            hit = ok & (dev > _GROSS * d)
            if not hit.any() and np.median(dev[ok]) == 0:
                hit = ok & (dev > 0)
            if hit.sum() <= _MAX_FRACTION * ok.sum():
                out[:, i] = hit
    return out


def gross_runs(z, steps: float = _RUN_STEPS, *, device=None) -> np.ndarray:
    """``[T, N]`` True for the values of ``z [T, N]`` (NaN = missing) in a gross run of their
    series: consecutive observed values, at most a quarter of the series, within ``steps``
    typical steps ``d`` of each other, more than ``steps * d`` from the observed values on both
    sides, which are themselves within ``steps * d`` of each other (the series returns); at the
    start or end of the series, a run of one repeated value more than ``steps * d`` from the
    next value. ``d`` is :func:`_typical_step`, the median nonzero change between neighbouring
    observed values (zero changes left out: rounded data and counts rest on their values; so are
    the jumps into and out of values remote from the rest, so that codes cannot set ``d`` in a
    series that seldom moves). A run beside another run (two codes a few values apart) is judged
    against the nearest values outside runs (the series' median where every stretch between
    codes looks like a run), so the ordinary values between two codes are no run.
    Missing-value codes such as ``-9999`` make such runs; level shifts, trends and the largest
    jumps of real records (``statsmodels``' Nile, CO2, macrodata, sunspots, El Nino, ...: under 20
    typical steps) do not. ``device``: where the screen of all series at once runs (a GPU fit
    passes its device); the few series it names are then judged on the host.

    >>> temp = np.array([21.3, 22.0, -9999, -9999, 21.1, 20.4, 22.9, 23.5, 24.1, 23.0])
    >>> np.flatnonzero(gross_runs(temp[:, None])[:, 0]).tolist()
    [2, 3]
    >>> shift = np.array([21.3, 22.0, 21.2, 21.9, 521.1, 520.4, 522.9, 523.5, 524.1, 523.0])
    >>> bool(gross_runs(shift[:, None]).any())  # a level shift: no return
    False
    """
    device = _args.check_device("device", device)
    Z = np.asarray(z, dtype=np.float64)
    out = np.zeros(Z.shape, bool)
    if Z.ndim != 2 or Z.shape[0] < 2:
        return out
    with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (nanmedian of a constant series)
        # the typical steps of all series at once, and the series with no change between two
        # observed values beyond steps * d (no run: most series) left out of the loop below
        # (on the CPU in numpy: the same values; a GPU fit's device in torch)
        on_host = device is None or torch.device(device).type == "cpu"
        X, n_obs = _observed_first(
            Z if on_host else torch.as_tensor(Z if Z.flags.writeable else Z.copy(), device=device)
        )
        ds = _typical_step(X)
        rows = np.arange(Z.shape[0] - 1) if on_host else torch.arange(Z.shape[0] - 1, device=device)
        pair = rows[:, None] < n_obs - 1
        step = abs(X[1:] - X[:-1])
        check = (pair & ~(step <= steps * ds * (1 - 1e-9))).any(0)  # (a margin: a superset)
        if not on_host:
            check, ds = check.cpu().numpy(), ds.cpu().numpy()
        for i in np.flatnonzero(check):
            at = np.flatnonzero(~np.isnan(Z[:, i]))
            x = Z[at, i]
            n = x.size
            longest = int(np.floor(_MAX_FRACTION * n))
            if longest < 1:
                continue
            step = np.abs(np.diff(x))
            d = ds[i]
            if not (np.isfinite(d) and d > 0):
                continue
            g = steps * d
            cut = np.flatnonzero(~(step <= g)) + 1  # gross changes (inf - inf counts) start runs
            if cut.size == 0:
                continue
            start, stop = np.r_[0, cut], np.r_[cut, n]
            lo, hi = np.minimum.reduceat(x, start), np.maximum.reduceat(x, start)
            before = x[np.maximum(start - 1, 0)]
            after = x[np.minimum(stop, n - 1)]

            # every value of a run is far from a reference when its extremes are on one side
            # (its changes are <= g: it cannot jump over the band ref +- g)
            far_before = (lo > before + g) | (hi < before - g)
            far_after = (lo > after + g) | (hi < after - g)
            inside = (start > 0) & (stop < n)
            run = np.where(
                inside,
                (np.abs(after - before) <= g) & far_before & far_after,
                (lo == hi) & np.where(start == 0, far_after, far_before),
            )
            run &= stop - start <= longest
            # a run next to another run (the ordinary values between two codes, or a code
            # beside them) is judged against the nearest values outside runs instead; where
            # there are none (codes cut a resting series into stretches that each look like a
            # run), against the series' median
            k = run.size
            seg = np.arange(k)
            prev = np.r_[-1, np.maximum.accumulate(np.where(run, -1, seg))[:-1]]
            next_ = np.r_[np.minimum.accumulate(np.where(run, k, seg)[::-1])[::-1][1:], k]
            redo = run & ((prev != seg - 1) | (next_ != seg + 1))
            if redo.any():
                ref_before = x[stop[np.maximum(prev, 0)] - 1]
                ref_after = x[start[np.minimum(next_, k - 1)]]
                far_before = (lo > ref_before + g) | (hi < ref_before - g)
                far_after = (lo > ref_after + g) | (hi < ref_after - g)
                has_before, has_after = prev >= 0, next_ < k
                med = np.median(x)
                judged = np.where(
                    has_before & has_after,
                    (np.abs(ref_after - ref_before) <= g) & far_before & far_after,
                    np.where(
                        has_before | has_after,
                        (lo == hi) & np.where(has_before, far_before, far_after),
                        (lo > med + g) | (hi < med - g),
                    ),
                )
                run = np.where(redo, judged, run)
            out[at, i] = np.repeat(run, stop - start)
    return out


def _fmt_threshold(c) -> str:
    lo, hi = float(np.min(c)), float(np.max(c))
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g} to {hi:.3g} by series length"
