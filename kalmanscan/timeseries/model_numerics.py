"""The numbers the model hands the filter and reads back: the exact OU transition of each step
(:func:`ou_arrays`, ``1 - decay`` as :func:`one_minus_decay`), the default prior
(:func:`default_prior`), and the units: the per-series power of two ``c`` the filter works in
(:func:`data_unit`) and the filter's results mapped back to the data's units
(:func:`_rescale_filter`). Notation and why powers of two: :mod:`kalmanscan.timeseries.model`
(docs/model.md, "Units and scale").
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kalmanscan.core.discretize import discretize_ou
from kalmanscan.core.filter import InfoState


def ou_arrays(theta, sigma2, mu, dt, n_series_dims: int, like=None):
    """Per-step ``(decay, process_var, offset)`` for steps ``dt [T]``, shaped ``[T, 1, ...]``
    (``n_series_dims`` ones)
    broadcast against the parameters (numpy, or torch when ``like`` is a tensor).
    """
    if isinstance(like, torch.Tensor):
        dt = torch.as_tensor(np.asarray(dt), dtype=like.dtype, device=like.device)
        dt = dt.reshape((-1,) + (1,) * n_series_dims)
    else:
        dt = np.asarray(dt, dtype=np.float64).reshape((-1,) + (1,) * n_series_dims)
    decay, process_var = discretize_ou(theta, sigma2, dt)
    offset = mu * one_minus_decay(theta, dt, decay)
    return decay, process_var, offset


def one_minus_decay(theta, dt, decay):
    """``1 - decay`` as ``-expm1(-theta dt)``, in ``decay``'s type: ``1 - exp(-x)`` keeps only
    ``x``'s leading digits where ``x`` is tiny (``theta = 1e-12, mu = 1e10``: the offset 1.4e-7
    off)."""
    if isinstance(decay, torch.Tensor):
        th = torch.as_tensor(theta, dtype=decay.dtype, device=decay.device)
        return -torch.expm1(-(th * torch.as_tensor(dt, dtype=decay.dtype, device=decay.device)))
    return -np.expm1(-(np.asarray(theta, dtype=np.float64) * np.asarray(dt, dtype=np.float64)))


def default_prior(theta, sigma2, mu):
    """``(prior_mean, prior_var)``: stationary ``N(mu, sigma2/(2 theta))``, diffuse if theta = 0."""
    if isinstance(theta, torch.Tensor) or isinstance(sigma2, torch.Tensor):
        theta = torch.as_tensor(theta, dtype=torch.float64)
        sigma2 = torch.as_tensor(sigma2, dtype=theta.dtype)
        pos = theta > 0
        var = torch.where(pos, sigma2 / (2 * torch.where(pos, theta, 1.0)), math.inf)
        return mu, var
    theta = np.asarray(theta, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(
            theta > 0, np.asarray(sigma2) / (2 * np.where(theta > 0, theta, 1.0)), np.inf
        )
    return mu, (float(var) if var.ndim == 0 else var)


def _first_step(values, n_series_dims):
    """Each of ``values`` at the first step where it is given per step (more dims than
    ``n_series_dims``; ``None``: as given)."""
    if n_series_dims is None:
        return tuple(values)
    return tuple(v[0] if getattr(v, "ndim", 0) > n_series_dims else v for v in values)


def _host_array(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
    return np.asarray(v, dtype=np.float64)


def data_unit(shape, values=(), scales=()) -> np.ndarray:
    """Per-series unit ``c [*shape]``: the power of two at or above the largest finite magnitude
    among ``values`` (``|x|``) and ``scales`` (``sqrt(v)`` of variances), each reduced over its
    leading axes to ``shape``; 1 where none is positive. Arrays that do not broadcast to ``shape``
    are left for the filter's own argument check (``c = 1``).

    >>> data_unit((2,), values=[np.array([[3.0, 0.0], [-5.0, 0.0]])], scales=[4.0]).tolist()
    [8.0, 4.0]
    """
    big = np.zeros(shape)
    if big.size == 0:  # (no series)
        return np.ones(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for kind, items in (("value", values), ("scale", scales)):
            for v in items:
                if v is None:
                    continue
                a = np.abs(_host_array(v))
                if kind == "scale":
                    a = np.sqrt(a)
                a = np.where(np.isfinite(a), a, 0.0)
                if a.ndim > len(shape):
                    a = a.reshape((-1,) + a.shape[a.ndim - len(shape) :]).max(0)
                try:
                    big = np.maximum(big, np.broadcast_to(a, shape))
                except ValueError:
                    return np.ones(shape)
    _, e = np.frexp(big)
    return np.where(big > 0, np.ldexp(1.0, e), 1.0)


def _scaled(x, f):
    """``x * f`` keeping ``x``'s type and dtype (numpy array, tensor or number)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x * torch.as_tensor(f, dtype=x.dtype, device=x.device)
    x = np.asarray(x)
    if x.dtype.kind == "f":
        return x * np.asarray(f, dtype=x.dtype)
    return x * f


def _in_dtype(x, dtype: np.dtype):
    """``x`` (numpy array, tensor or number) rounded to the numpy ``dtype``, keeping its type."""
    if isinstance(x, torch.Tensor):
        return x.to(torch.from_numpy(np.zeros(0, dtype)).dtype)
    with np.errstate(under="ignore"):
        return np.asarray(x).astype(dtype)


def _rescale_filter(res, c, observed):
    """A :class:`kalmanscan.FilterResult` computed on ``z / c`` mapped to ``z``'s units. The
    log-likelihood loses ``log c`` for every observed step with a known prediction (the steps
    that contribute, see ``kalmanscan.core.steps.loglik_terms``)."""
    pp = _host_array(res.pred_precision)
    n_contrib = (observed & (pp > 0)).sum(0)
    shift = n_contrib * np.log(c)
    ll = res.loglik
    if isinstance(ll, torch.Tensor):
        ll = ll - torch.as_tensor(shift, dtype=ll.dtype, device=ll.device)
    else:
        ll = np.asarray(ll) - np.asarray(shift, dtype=np.asarray(ll).dtype)
    # precisions over c**2 as two divisions by c (1 / c**2 overflows for c below 2**-511); a
    # value beyond float64 in z's units (a variance over a gap of 1e308) is inf, as
    # kalmanscan.filter gives it
    with np.errstate(over="ignore"):
        return type(res)(
            mean=_scaled(res.mean, c),
            var=_scaled(_scaled(res.var, c), c),
            precision=_scaled(_scaled(res.precision, 1.0 / c), 1.0 / c),
            info=_scaled(res.info, 1.0 / c),
            pred_mean=_scaled(res.pred_mean, c),
            pred_var=_scaled(_scaled(res.pred_var, c), c),
            pred_precision=_scaled(_scaled(res.pred_precision, 1.0 / c), 1.0 / c),
            loglik=ll,
            final=InfoState(
                _scaled(_scaled(res.final.lam, 1.0 / c), 1.0 / c),
                _scaled(res.final.eta, 1.0 / c),
            ),
        )
