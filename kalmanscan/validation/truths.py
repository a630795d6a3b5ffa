"""Independent truths for one lane, all in float64 and none of them using kalmanscan.

- :func:`filterpy_truth`: filterpy's covariance-form ``KalmanFilter`` (``batch_filter`` then
  ``rts_smoother``), with per-step F, Q, H, R, B·u.
- :func:`dense_truth`: the dense joint-Gaussian oracle. It builds the (tridiagonal) precision
  matrix of ``x_1..x_t`` given ``z_1..z_t`` for every ``t`` and solves it with scipy's banded
  Cholesky: filtered moments are the last marginal of each system, smoothed moments the marginals
  of the full system, and the log-likelihood is a difference of Gaussian integrals.

Both return a :class:`Truth` of float64 arrays ``[T]`` (``loglik`` a float). Steps where the
belief is still diffuse have ``var = inf`` and ``mean = nan``. Derivations: docs/validation.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .models import Lane

__all__ = ["Truth", "NotApplicable", "filterpy_truth", "dense_truth", "diffuse_start"]

LOG2PI = float(np.log(2 * np.pi))


class NotApplicable(Exception):
    """A truth cannot represent this model (the battery records it as not compared)."""


class Truth(NamedTuple):
    mean: np.ndarray  # filtered mean [T]
    var: np.ndarray  # filtered variance [T] (inf while diffuse)
    pred_mean: np.ndarray | None  # one-step predicted mean [T] (None if the truth has none)
    pred_var: np.ndarray | None
    loglik: float  # exact-diffuse convention: steps with prior precision 0 excluded
    n_loglik_terms: int  # number of steps that contribute to loglik
    smooth_mean: np.ndarray
    smooth_var: np.ndarray
    # the truth's own rounding estimate {"moments": r, "loglik": r} (relative, same metric as the
    # battery), or None where the truth is forward stable and taken as exact to ~1e-13
    own_error: dict | None = None


def diffuse_start(lane: Lane) -> tuple[int, str]:
    """Where a diffuse lane's belief becomes proper: ``(t, how)`` with 0-based step ``t``.

    ``how == "observed"``: ``z_t`` is the first observation, the posterior at ``t`` is
    N(z_t/h_t, obs_var_t/h_t^2) and the prior at ``t`` is still flat. ``how == "forget"``:
    ``decay_t == 0`` resets the state, the prior at ``t`` is N(offset_t, process_var_t).
    For a proper prior the answer is ``(0, "prior")``.
    """
    if not lane.diffuse:
        return 0, "prior"
    observed = lane.observed
    for t in range(lane.T):
        if lane.decay[t] == 0.0:
            return t, "forget"
        if observed[t]:
            if lane.loading[t] == 0.0:
                raise NotApplicable("a zero loading at an observed diffuse step is not informative")
            return t, "observed"
    raise NotApplicable("diffuse lane without any observation: nothing is proper")


def _gauss_loglik(z, mean, var):
    return -0.5 * (LOG2PI + np.log(var) + (z - mean) ** 2 / var)


def _inv_1x1(m: np.ndarray) -> np.ndarray:
    """The inverse of a 1x1 matrix, ``1/m``: what ``np.linalg.inv`` returns for it, bit for bit
    (LAPACK's LU solve of ``m x = 1`` is the one division), without its per-call overhead, which
    was most of filterpy's time in the battery."""
    return 1.0 / m


def filterpy_truth(lane: Lane) -> Truth:
    """Filter and smooth one lane with filterpy's ``KalmanFilter`` (float64, covariance form).

    filterpy cannot hold an infinite variance, so a diffuse lane is started exactly where its
    belief becomes proper (:func:`diffuse_start`): after the first observation with
    ``x = z/h, P = obs_var/h^2`` (the exact limit of the diffuse update), or at a step with
    ``decay = 0``. Steps before are diffuse (var inf) and contribute nothing to the loglik;
    their smoothed moments follow from the RTS limit ``J = 1/a``:
    ``ms_{t-1} = (ms_t - c_t)/a_t``, ``Ps_{t-1} = (Ps_t + p_t)/a_t^2``.
    Offsets enter the filter as ``B u`` with ``B = 1, u = c_t``; filterpy's ``rts_smoother``
    has no offset term, so it smooths the offset-free model ``y_t = x_t - d_t`` with
    ``d_t = a_t d_{t-1} + c_t`` (the same covariances, means shifted by ``d``).

    >>> import numpy as np
    >>> from kalmanscan.validation.models import random_batch
    >>> tr = filterpy_truth(random_batch(0, 20, 1).lane(0))
    >>> tr.mean.shape
    (20,)
    """
    from filterpy.kalman import KalmanFilter

    T = lane.T
    observed = lane.observed
    a, p, h, c, R = lane.decay, lane.process_var, lane.loading, lane.offset, lane.obs_var
    mean = np.full(T, np.nan)
    var = np.full(T, np.inf)
    pred_mean = np.full(T, np.nan)
    pred_var = np.full(T, np.inf)
    start, how = diffuse_start(lane)
    kf = KalmanFilter(dim_x=1, dim_z=1)
    kf.inv = _inv_1x1
    if how == "prior":
        kf.x = np.array([[lane.prior_mean]])
        kf.P = np.array([[lane.prior_var]])
        first = 0
    elif how == "forget":
        kf.x = np.zeros((1, 1))  # multiplied by decay 0: any value gives the prior N(c_t, p_t)
        kf.P = np.ones((1, 1))
        first = start
    else:
        mean[start] = lane.z[start] / h[start]
        var[start] = R[start] / h[start] ** 2
        kf.x = np.array([[mean[start]]])
        kf.P = np.array([[var[start]]])
        first = start + 1
    steps = range(first, T)
    if len(steps):
        # z as a float: filterpy subtracts it from H x as it would a 1x1 array, and deep-copies
        # it at every update (cheap for a float)
        zs = [float(lane.z[t]) if observed[t] else None for t in steps]
        out = kf.batch_filter(
            zs,
            Fs=[np.array([[a[t]]]) for t in steps],
            Qs=[np.array([[p[t]]]) for t in steps],
            Hs=[np.array([[h[t]]]) for t in steps],
            Rs=[np.array([[R[t] if observed[t] else 1.0]]) for t in steps],
            Bs=[np.eye(1)] * len(steps),
            us=[np.array([[c[t]]]) for t in steps],
        )
        xs, Ps, xps, Pps = out
        mean[first:] = xs[:, 0, 0]
        var[first:] = Ps[:, 0, 0]
        pred_mean[first:] = xps[:, 0, 0]
        pred_var[first:] = Pps[:, 0, 0]
    # prediction-error decomposition on filterpy's predictive moments
    terms = [
        _gauss_loglik(lane.z[t], h[t] * pred_mean[t], h[t] ** 2 * pred_var[t] + R[t])
        for t in range(first, T)
        if observed[t]
    ]
    loglik = float(np.sum(terms)) if terms else 0.0

    # smoother over the proper part [s0, T): offset-free shift y = x - d, then back
    s0 = start
    sm_mean = np.full(T, np.nan)
    sm_var = np.full(T, np.inf)
    d = np.zeros(T)
    for t in range(s0 + 1, T):
        d[t] = a[t] * d[t - 1] + c[t]
    n = T - s0
    if n > 0:
        Xs = (mean[s0:] - d[s0:]).reshape(n, 1, 1)
        Ps_in = var[s0:].reshape(n, 1, 1).copy()
        # KalmanFilter.rts_smoother indexes like batch_filter: Fs[k] is the step into k
        Fs = [np.array([[a[t]]]) for t in range(s0, T)]
        Qs = [np.array([[p[t]]]) for t in range(s0, T)]
        xsm, Psm, _, _ = kf.rts_smoother(Xs, Ps_in, Fs=Fs, Qs=Qs, inv=_inv_1x1)
        sm_mean[s0:] = xsm[:, 0, 0] + d[s0:]
        sm_var[s0:] = Psm[:, 0, 0]
    if how == "observed":
        for t in range(s0, 0, -1):  # diffuse prefix: the RTS limit J = 1/a
            sm_mean[t - 1] = (sm_mean[t] - c[t]) / a[t]
            sm_var[t - 1] = (sm_var[t] + p[t]) / a[t] ** 2
    return Truth(mean, var, pred_mean, pred_var, loglik, len(terms), sm_mean, sm_var)


def _banded_system(lane: Lane):
    """Pieces of the precision form of ``p(x_1..x_T, z_1..z_T)``.

    Returns ``(d_own, d_next, off, b_own, b_next, C_own)``, each ``[T]`` (``off`` ``[T-1]``), where
    the log density of ``x_1..x_t`` and ``z_1..z_t`` is ``-x'Qx/2 + b'x - C/2`` with
    ``Q = tridiag(off, d_own + d_next (without the last d_next), off)``,
    ``b = b_own + b_next (without the last)``, ``C = sum(C_own[:t])``.
    """
    T = lane.T
    a, p, h, c = lane.decay, lane.process_var, lane.loading, lane.offset
    if np.any(p <= 0):
        raise NotApplicable("process_var = 0: the transition density has no precision form")
    observed = lane.observed
    rho = np.where(observed, 1.0 / np.where(observed, lane.obs_var, 1.0), 0.0)
    zo = np.where(observed, lane.z, 0.0)
    d_own = 1.0 / p + rho * h * h
    b_own = c / p + rho * h * zo
    obs_var = np.where(observed, lane.obs_var, 1.0)
    C_own = (
        np.log(2 * np.pi * p)
        + c * c / p
        + np.where(observed, np.log(2 * np.pi * obs_var) + rho * zo**2, 0.0)
    )
    # the first state: x_1 = a_1 x_0 + c_1 + w_1 with x_0 ~ N(m0, v0) integrated out
    start, how = diffuse_start(lane)
    if how == "prior":
        v1 = a[0] ** 2 * lane.prior_var + p[0]
        m1 = a[0] * lane.prior_mean + c[0]
    elif how == "forget":
        if start != 0:
            raise NotApplicable("decay = 0 inside a diffuse prefix leaves earlier states improper")
        v1, m1 = p[0], c[0]
    else:
        v1 = np.inf  # flat (improper) density 1 on x_1
        if np.any(a[1 : start + 1] == 0):
            raise NotApplicable("decay = 0 inside a diffuse prefix leaves earlier states improper")
    obs_term0 = np.log(2 * np.pi * obs_var[0]) + rho[0] * zo[0] ** 2 if observed[0] else 0.0
    if np.isfinite(v1):
        d_own[0] = 1.0 / v1 + rho[0] * h[0] ** 2
        b_own[0] = m1 / v1 + rho[0] * h[0] * zo[0]
        C_own[0] = np.log(2 * np.pi * v1) + m1 * m1 / v1 + obs_term0
    else:
        d_own[0] = rho[0] * h[0] ** 2
        b_own[0] = rho[0] * h[0] * zo[0]
        C_own[0] = obs_term0
    d_next = np.zeros(T)
    b_next = np.zeros(T)
    off = np.zeros(max(T - 1, 0))
    if T > 1:
        d_next[:-1] = a[1:] ** 2 / p[1:]
        b_next[:-1] = -a[1:] * c[1:] / p[1:]
        off[:] = -a[1:] / p[1:]
    return d_own, d_next, off, b_own, b_next, C_own, start, how


def _tridiag_matvec(diag, off, x):
    """``(Q x, |Q| |x|)`` for the symmetric tridiagonal ``Q = tridiag(off, diag, off)``."""
    y = diag * x
    ay = np.abs(diag * x)
    if x.shape[0] > 1:
        y[:-1] += off * x[1:]
        y[1:] += off * x[:-1]
        ay[:-1] += np.abs(off * x[1:])
        ay[1:] += np.abs(off * x[:-1])
    return y, ay


def _solve(diag, off, rhs, logdet=False):
    """Banded Cholesky of the tridiagonal ``Q``: ``(Q^{-1} rhs, log det Q or None, max
    diag/pivot^2)``; ``log det Q`` only where ``logdet`` is true.

    The last is the cancellation of the elimination: a pivot far below its diagonal entry was
    computed as a small difference of large numbers. LAPACK's ``dpbtrf``/``dpbtrs`` are called
    as ``scipy.linalg.cholesky_banded``/``cho_solve_banded`` call them (the same results, bit for
    bit), without those wrappers' per-call checks: the oracle makes one call per step.
    """
    from scipy.linalg import LinAlgError
    from scipy.linalg.lapack import dpbtrf, dpbtrs

    n = diag.shape[0]
    ab = np.zeros((2, n))
    ab[1] = diag
    ab[0, 1:] = off[: n - 1]
    cb, info = dpbtrf(ab, lower=0, overwrite_ab=0)
    if info == 0:
        sol, info = dpbtrs(cb, rhs, lower=0, overwrite_b=0)
    if info != 0:
        raise LinAlgError(f"banded Cholesky of the oracle's precision matrix: LAPACK info {info}")
    cancel = float(np.max(diag / cb[1] ** 2))
    return sol, (2.0 * math.fsum(np.log(cb[1])) if logdet else None), cancel


def dense_truth(lane: Lane, max_T: int = 4000) -> Truth:
    """The dense joint-Gaussian oracle for one lane (float64; needs ``process_var > 0``).

    For each ``t`` the precision matrix ``Q_t`` of ``x_1..x_t`` given ``z_1..z_t`` is solved by a
    banded Cholesky: the filtered mean and variance at ``t`` are the last entries of
    ``Q_t^{-1} b_t`` and ``Q_t^{-1} e_t``, and ``log Z_t = log ∫ p(x_{1:t}, z_{1:t}) dx`` gives the
    log-likelihood: ``log Z_T`` for a proper prior, ``log Z_T - log Z_{t0}`` for a diffuse one
    (``t0`` the first observed step; both use the same flat density on ``x_1``, whose constant
    cancels). Smoothed moments are the marginals of ``Q_T`` (inverse by banded solves).
    Cost O(T^2); ``max_T`` guards against accidental huge runs.

    The joint form is exact algebra but not always well conditioned in float64: a diagonal entry
    ``1/p_t + a_{t+1}^2/p_{t+1} + phi_t`` keeps ``phi_t`` only to ``eps * diag_t / phi_t``
    relative, and ``log Z`` is a difference of terms as large as ``sum rho z^2``. Both estimates
    are returned in ``own_error``; the battery compares against the oracle only where they are
    well below the tolerance (docs/validation.md, "When the oracle is not exact enough").

    >>> from kalmanscan.validation.models import random_batch
    >>> tr = dense_truth(random_batch(0, 20, 1).lane(0))
    >>> tr.smooth_var.shape
    (20,)
    """
    start, how = diffuse_start(lane)
    if start > 0:
        return _dense_after_diffuse_prefix(lane, start, how, max_T)
    T = lane.T
    if T > max_T:
        raise NotApplicable(f"T = {T} > max_T = {max_T} for the O(T^2) oracle")
    d_own, d_next, off, b_own, b_next, C_own, start, how = _banded_system(lane)
    observed = lane.observed
    proper_from = start if how == "observed" else 0
    mean = np.full(T, np.nan)
    var = np.full(T, np.inf)
    logZ = np.full(T, np.nan)
    cancel = 1.0
    for t in range(proper_from, T):
        n = t + 1
        diag = d_own[:n] + d_next[:n]
        diag[-1] = d_own[t]
        b = b_own[:n] + b_next[:n]
        b[-1] = b_own[t]
        e = np.zeros(n)
        e[-1] = 1.0
        normaliser = t == start and how == "observed"  # the diffuse normaliser log Z_t
        sol, logdet, cancel_t = _solve(diag, off, np.stack([b, e], axis=1), logdet=normaliser)
        cancel = max(cancel, cancel_t)
        mean[t] = sol[-1, 0]
        var[t] = sol[-1, 1]
        if normaliser:  # log Z_T comes below
            quad_t = math.fsum(b * sol[:, 0])
            parts = [-0.5 * math.fsum(C_own[:n]), 0.5 * quad_t, -0.5 * logdet, 0.5 * n * LOG2PI]
            logZ[t] = math.fsum(parts)
    n_terms = int(observed[start + 1 :].sum()) if how == "observed" else int(observed.sum())
    diag = d_own + d_next
    diag[-1] = d_own[-1]
    b = b_own + b_next
    b[-1] = b_own[-1]
    rhs = np.concatenate([b[:, None], np.eye(T)], axis=1)
    sol, logdet_T, cancel_T = _solve(diag, off, rhs, logdet=True)
    cancel = max(cancel, cancel_T)
    sm_mean = sol[:, 0]
    sm_var = np.diagonal(sol[:, 1:]).copy()
    eps = np.finfo(np.float64).eps
    # log Z_T again with one step of iterative refinement of Q^{-1} b: b'Q^{-1}b nearly cancels
    # C, so its solve error matters; the size of the correction is the estimate of that error
    Qx, absQx = _tridiag_matvec(diag, off, sm_mean)
    delta = _solve(diag, off, (b - Qx)[:, None])[0][:, 0]
    # exactly rounded sums: C and b'x are ~|loglik| * 1e5 on some lanes and nearly cancel
    quad = math.fsum(b * (sm_mean + delta))
    logZ_T = math.fsum([-0.5 * math.fsum(C_own), 0.5 * quad, -0.5 * logdet_T, 0.5 * T * LOG2PI])
    loglik = logZ_T - (float(logZ[start]) if how == "observed" else 0.0)
    quad_err = abs(float(b @ delta)) + eps * float(np.abs(b) @ (absQx + np.abs(b)))
    phi = np.where(observed, lane.loading**2 / np.where(observed, lane.obs_var, 1.0), 0.0)
    ratio = np.where(phi > 0, diag / np.where(phi > 0, phi, 1.0), 1.0)
    moments = eps * max(float(np.max(ratio)), cancel)
    terms = np.abs(C_own).sum() + abs(quad) + abs(logdet_T) + T * LOG2PI
    scale = max(abs(loglik), n_terms, 1.0)
    own = {
        "moments": moments,
        "loglik": (eps * terms + quad_err) / scale + moments * n_terms / scale,
    }
    return Truth(mean, var, None, None, loglik, n_terms, sm_mean, sm_var, own)


def _slice(lane: Lane, start: int) -> Lane:
    return Lane(
        name=lane.name,
        z=lane.z[start:],
        obs_var=lane.obs_var[start:],
        decay=lane.decay[start:],
        process_var=lane.process_var[start:],
        loading=lane.loading[start:],
        offset=lane.offset[start:],
        prior_mean=lane.prior_mean,
        prior_var=lane.prior_var,
    )


def _dense_after_diffuse_prefix(lane: Lane, start: int, how: str, max_T: int) -> Truth:
    """A diffuse lane whose first ``start`` steps see nothing.

    A flat density pushed through ``x_t = a_t x_{t-1} + c_t + w_t`` (``a_t != 0``) stays flat, so
    the states before ``start`` integrate out to a constant: the oracle runs on ``x_start..x_T``
    with a flat density on ``x_start`` (``how == "observed"``) or the proper prior
    ``N(c, p)`` of a ``decay = 0`` step (``how == "forget"``). Building them into the joint
    instead adds states whose only precision is ``a^2/p`` of the next step, an ill-conditioned
    block that pollutes every solve when some ``a`` is small. Their smoothed moments follow the
    exact backward relation of the chain, ``ms_{t-1} = (ms_t - c_t)/a_t`` and
    ``Ps_{t-1} = (Ps_t + p_t)/a_t^2``; behind a ``decay = 0`` step they stay improper.
    """
    sub = dense_truth(_slice(lane, start), max_T)
    T = lane.T

    def pad(x, fill):
        return np.concatenate([np.full(start, fill), x])

    sm_mean, sm_var = pad(sub.smooth_mean, np.nan), pad(sub.smooth_var, np.inf)
    if how == "observed":
        a, c, p = lane.decay, lane.offset, lane.process_var
        for t in range(start, 0, -1):
            sm_mean[t - 1] = (sm_mean[t] - c[t]) / a[t]
            sm_var[t - 1] = (sm_var[t] + p[t]) / a[t] ** 2
    assert sm_mean.shape == (T,)
    return Truth(
        pad(sub.mean, np.nan),
        pad(sub.var, np.inf),
        None,
        None,
        sub.loglik,
        sub.n_loglik_terms,
        sm_mean,
        sm_var,
        sub.own_error,
    )
