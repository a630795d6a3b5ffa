"""The data's moments behind a fit: its standardization and the starting values.

:func:`_nan_moments` gives each series' mean, scale and standard deviation with NaNs, free of
overflow; :func:`_location_scale` makes of them the standardization ``(m, s)`` in whose units
:mod:`kalmanscan.timeseries.fit` optimizes (pooled over series when ``joint``); :func:`_start`
gives standardized starting values from lag-1 and lag-2 moments. Each takes a numpy array or a
tensor ``[T, N]`` (time first, ``N`` series), runs where the data lives and returns numpy.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def _xp(x):
    """The array module of ``x`` (numpy, or torch for a tensor): the moments below run where the
    data lives (on the device for a GPU fit; about 1 s of host numpy at 16,384 x 500 otherwise)."""
    return torch if isinstance(x, torch.Tensor) else np


def _host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


def _col_mean(x, ok):
    """Mean over axis 0 of ``x`` where ``ok`` (NaN where nothing is): ``np.nanmean`` without
    its copies, for numpy arrays and tensors alike."""
    xp = _xp(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.where(ok, x, 0.0).sum(0) / ok.sum(0)


def _nan_moments(Z):
    """Per-column ``(mean, scale, sd)`` of ``Z [T, N]`` with NaNs, free of overflow. ``scale`` is
    the smaller of the standard deviation and the root of half the mean squared change between
    consecutive observed rows: the size of the noise in white-noise-like data and of the step in
    trending data (the scale at which variance estimates are compared with 0). ``Z``: a numpy
    array or a tensor (the result is numpy either way)."""
    xp = _xp(Z)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ok = ~xp.isnan(Z)
        amax = xp.amax(xp.where(ok, xp.abs(Z), 0.0), 0)
        a = xp.where(xp.isfinite(amax) & (amax > 0), amax, 1.0)
        Zn = Z / a
        mean = _col_mean(Zn, ok)
        sd = xp.sqrt(_col_mean((Zn - mean) ** 2, ok))
        d = Zn[1:] - Zn[:-1]
        step = xp.sqrt(0.5 * _col_mean(d * d, ok[1:] & ok[:-1]))
    scale = xp.where(xp.isfinite(step) & (step > 0), xp.where(step < sd, step, sd), sd)
    return _host(mean * a), _host(scale * a), _host(sd * a)


def _location_scale(Z, joint: bool, moments=None):
    """``(m [N], s [N])``: the standardization of each series (pooled over series when
    ``joint``), see :func:`_nan_moments` (``moments``: its result for ``Z``, if known)."""
    m, s, sd = _nan_moments(Z) if moments is None else moments
    if not joint:
        return m, s
    N = Z.shape[1]
    m1, _, sd1 = _nan_moments(Z.reshape(-1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        step = np.sqrt(np.nanmean(np.where(sd > 0, s / sd, np.nan) ** 2))  # pooled step / sd
    s1 = sd1[0] * (min(step, 1.0) if np.isfinite(step) else 1.0)
    return np.full(N, m1[0]), np.full(N, s1)


def _start(zs: np.ndarray, dt: np.ndarray, fixed: dict, joint: bool) -> dict:
    """Standardized starting values ``{name: [G]}`` from lag-1 and lag-2 moments of ``zs [T, N]``
    (mean 0 per series; or pooled when ``joint``)."""
    xp = _xp(zs)
    ok0 = ~xp.isnan(zs)
    span = np.cumsum(dt)

    def total(x):
        return _host(x.sum() if joint else x.sum(0))

    def lag(k):
        d = zs[k:] - zs[:-k]
        step = span[k:] - span[:-k]
        pos = step > 0
        if xp is torch:
            step = torch.as_tensor(step, dtype=zs.dtype, device=zs.device)
            pos = torch.as_tensor(pos, device=zs.device)
        w = ok0[k:] & ok0[:-k] & pos[:, None]
        cnt = total(w)
        with np.errstate(invalid="ignore", divide="ignore"):
            msd = total(xp.where(w, d * d, 0.0)) / cnt
            mdt = total(xp.where(w, step[:, None], 0.0)) / cnt
            rho = total(xp.where(w, zs[k:] * zs[:-k], 0.0)) / cnt
        return msd, mdt, rho

    with np.errstate(invalid="ignore", divide="ignore"):
        v0 = total(xp.where(ok0, zs * zs, 0.0)) / total(ok0)  # zs has mean 0; variance >= 1
    v0 = np.where(np.isfinite(v0) & (v0 > 0), v0, 1.0)
    d1, t1, r1 = lag(1)
    d2, t2, r2 = lag(2) if zs.shape[0] > 2 else (d1, 2 * t1, r1 * r1)
    r1, r2 = r1 / v0, r2 / v0
    G = 1 if joint else zs.shape[1]
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (G,)).copy()  # noqa: E731
    t1 = np.where(np.isfinite(t1) & (t1 > 0), t1, 1.0)
    d1 = np.where(np.isfinite(d1) & (d1 > 0), d1, 1.0)
    # random walk + noise: E d1 = sigma2 t1 + 2 obs_var, E d2 = sigma2 t2 + 2 obs_var
    with np.errstate(invalid="ignore", divide="ignore"):
        s2_rw = (d2 - d1) / (t2 - t1)
    s2_rw = np.clip(np.where(np.isfinite(s2_rw), s2_rw, 0.5 * d1 / t1), 0.05 * d1 / t1, d1 / t1)
    ov_rw = np.maximum(0.5 * (d1 - s2_rw * t1), 0.05 * d1)
    # OU + noise: rho_k = phi^k vx (variance 1), phi = exp(-theta t1)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.clip(np.where(r1 > 0.05, r2 / r1, 0.5), 0.05, 0.99)
    phi = np.where(np.isfinite(phi), phi, 0.5)
    th = fixed.get("theta")
    if th is not None and joint:
        th = np.array([th.mean()])
    theta = -np.log(phi) / t1 if th is None else np.where(th > 0, th, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        vx = np.clip(r1 / np.exp(-theta * t1), 0.05, 0.95)
    vx = np.where(np.isfinite(vx), vx, 0.5)
    rw = np.zeros(G, bool) if th is None else full(th == 0)
    return {
        "theta": full(theta),
        "sigma2": np.where(rw, full(s2_rw), full(2 * theta * vx * v0)),
        "mu": np.zeros(G),
        "obs_var": np.where(rw, full(ov_rw), full((1 - vx) * v0)),
    }
