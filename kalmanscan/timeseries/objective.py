"""The fit's log-likelihood evaluations: the standardized problem (:class:`_Data`), its
parameters per stencil point, the filter call a Newton step makes (through
:func:`kalmanscan.loglik`, or on the CPU the lean call of the compiled kernel: the same values to
the last bit), the objective for :func:`kalmanscan.timeseries.optim.minimize`, and exact
gradients and their Hessian in natural units (:func:`_natural_hessian`). Used by
:mod:`kalmanscan.timeseries.fit`."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.core.discretize import ou_transition
from kalmanscan.core.steps import hold_exponent

_POSITIVE = ("theta", "sigma2", "obs_var")
_NAT_REL = 1e-4  # relative step of the gradient differences (_natural_hessian)
_SMALL = 1e-3  # a positive estimate below this (standardized) is finished in natural coordinates


def _loglik(z, obs_var, decay, process_var, offset, prior_mean, prior_var, backend):
    """Per-lane log-likelihood ``[*L]`` of time-first ``z [T, *L]``: the one filter call fitting
    makes (the exact diffuse convention of :func:`kalmanscan.filter`)."""
    with torch.no_grad():
        return filter_api.loglik(
            z,
            obs_var=obs_var,
            decay=decay,
            process_var=process_var,
            offset=offset,
            prior_mean=prior_mean,
            prior_var=prior_var,
            axis=0,
            backend=backend,
        )


def _lane_arrays(theta, sigma2, mu, dt, theta_zero: bool):
    """``(decay, process_var, offset, prior_mean, prior_var)`` for lanes ``[*L]`` on steps ``dt``:
    ``[T]`` gives per-step arrays ``[T, *L]``; a 0-d ``dt`` (a regular grid) gives lane arrays for
    every step, the first included: under the default prior (stationary, which the OU transition
    leaves unchanged, or diffuse) the first step's transition changes nothing."""
    dtb = dt.reshape((-1,) + (1,) * theta.dim()) if dt.dim() else dt
    if theta_zero:  # the local level: decay 1, no offset, diffuse prior
        return 1.0, sigma2 * dtb, 0.0, mu, math.inf
    decay, process_var = ou_transition(theta, sigma2, dtb)
    pos = theta > 0
    prior_var = torch.where(pos, sigma2 / (2 * torch.where(pos, theta, 1.0)), math.inf)
    return decay, process_var, mu * (1 - decay), mu, prior_var


class _Data(NamedTuple):
    """A standardized fitting problem: ``zs [T, N]`` (torch), ``dt [T]`` (torch) in units of
    ``tau``; ``fixed`` standardized fixed values ``{name: [N]}``; ``group [N]`` (group of each
    series); ``n_obs [N]``; ``free`` names; ``theta_zero`` (theta fixed at 0 everywhere)."""

    zs: torch.Tensor
    dt: torch.Tensor
    fixed: dict
    group: np.ndarray
    n_obs: np.ndarray
    free: tuple
    theta_zero: bool
    joint: bool
    backend: str
    lean: bool = False  # log-likelihoods from the lean native call (:func:`_lean_loglik`)


def _params_of(data: _Data, u, series):
    """Standardized parameters ``{name: [P, n]}`` (torch) of ``series [n]`` at ``u [P, n, k]``."""
    like = data.zs
    out = {}
    for j, p in enumerate(data.free):
        v = torch.as_tensor(np.array(u[..., j]), dtype=like.dtype, device=like.device)
        out[p] = torch.exp(v) if p in _POSITIVE else v
    P, n = u.shape[:2]
    for p, v in data.fixed.items():
        out[p] = torch.as_tensor(v[series], dtype=like.dtype, device=like.device).expand(P, n)
    return out


def _series_loglik(data: _Data, x: dict, series, outputs: bool = False, grad: bool = False):
    """Log-likelihood ``[P, n]`` of ``series [n]`` (standardized) at ``x {name: [P, n]}``;
    with ``outputs`` the whole :class:`kalmanscan.FilterResult` (lanes ``[n, P]``); with
    ``grad`` differentiable (autograd) in ``x``."""
    P, n = x["obs_var"].shape
    cols = np.repeat(np.asarray(series), P)  # lanes (series, point): one gather
    if data.zs.device.type == "cpu":  # numpy's take is several times faster than torch's here
        z = torch.from_numpy(np.take(data.zs.numpy(), cols, axis=1))
    else:
        z = data.zs.index_select(1, torch.as_tensor(cols, device=data.zs.device))
    z = z.reshape(-1, n, P)
    xt = {p: v.T for p, v in x.items()}
    decay, pv, off, pm, pvar = _lane_arrays(
        xt["theta"], xt["sigma2"], xt["mu"], data.dt, data.theta_zero
    )
    args = dict(
        obs_var=xt["obs_var"], decay=decay, process_var=pv, offset=off,
        prior_mean=pm, prior_var=pvar,
    )  # fmt: skip
    if outputs:
        return filter_api.filter(z, **args, axis=0, backend=data.backend)
    if grad:
        return filter_api.loglik(z, **args, axis=0, backend=data.backend).T
    return _loglik(z, *args.values(), data.backend).T


# ------------------------------------------------------------------ the lean native call
# A fit's filter calls on the CPU (backend "native", float64) with the lane arrays built in numpy
# and the compiled kernel called directly: the same kernel on the same inputs as
# :func:`kalmanscan.loglik` / :func:`kalmanscan.filter` give it, without their conversions and
# checks (the inputs are valid by construction), so the same values to the last bit. Where
# those could differ (lanes :func:`kalmanscan.core.filter_units._tiny_lanes` would carry in other
# units, or a flag from the kernel: overflow, a value out of range) the call goes through them.


def _lean_available(backend, zs: torch.Tensor) -> bool:
    """Whether the fit's filter calls may take the lean native call: float64 data on the CPU and
    ``backend`` resolving to the compiled kernel there (an invalid name: no, the usual path
    raises)."""
    if zs.device.type != "cpu" or zs.dtype != torch.float64:
        return False
    from kalmanscan.core import backends, native

    try:
        return native.available() and backends.resolve(backend, zs.device) == "native"
    except ValueError:
        return False


def _torch_fn(fn, a: np.ndarray) -> np.ndarray:
    """``fn`` (``torch.exp``, ``torch.expm1``) of a float64 numpy array: torch's values, which
    are those of each element alone whatever the array's size or layout (numpy's differ in the
    last bit on some inputs), so the lean path's transcendentals are the usual path's."""
    return fn(torch.from_numpy(np.asarray(a))).numpy()


def _ou_transition_np(theta, sigma2, dt):
    """:func:`kalmanscan.core.discretize.ou_transition` on numpy arrays, operation for
    operation (IEEE arithmetic in both; exp and expm1 are torch's, :func:`_torch_fn`)."""
    x = 2.0 * theta * dt
    small = x < 1e-4
    large = x > 1.0
    x_mid = np.where(small | large, 1.0, x)
    series = 1 - x * (0.5 - x * (1.0 / 6 - x / 24))
    em = _torch_fn(torch.expm1, np.stack([-x_mid, -np.where(large, x, 1.0)]))
    factor = np.where(small, series, -em[0] / x_mid)
    theta_l = np.where(large, theta, 1.0)
    p_large = sigma2 * (-0.5 * em[1] / theta_l)
    p = np.where(large, p_large, sigma2 * (dt * factor))
    return _torch_fn(torch.exp, -theta * dt), p  # (of one shape: no broadcast)


def _lane_arrays_np(theta, sigma2, mu, dt, theta_zero: bool):
    """:func:`_lane_arrays` in numpy on lanes ``[N]`` (``dt``: a 0-d array, or ``[T, 1]``),
    value for value. With steps ``[T, 1]`` the transition is computed once a distinct ``theta``
    (a stencil's 21 lanes hold 3) and ``process_var`` as ``sigma2`` times it, the product
    :func:`_ou_transition_np` ends with: the same values."""
    if theta_zero:
        return 1.0, sigma2 * dt, 0.0, mu, math.inf
    if np.ndim(dt) == 2 and np.ndim(theta) == 1 and theta.size > 1:
        uniq, inv = np.unique(theta, return_inverse=True)
        if uniq.size < theta.size:
            a, unit = _ou_transition_np(uniq, np.ones_like(uniq), dt)
            decay, process_var = a[:, inv], sigma2 * unit[:, inv]
            pos = theta > 0
            prior_var = np.where(pos, sigma2 / (2 * np.where(pos, theta, 1.0)), np.inf)
            return decay, process_var, mu * (1 - decay), mu, prior_var
    decay, process_var = _ou_transition_np(theta, sigma2, dt)
    pos = theta > 0
    prior_var = np.where(pos, sigma2 / (2 * np.where(pos, theta, 1.0)), np.inf)
    return decay, process_var, mu * (1 - decay), mu, prior_var


def _from_prior_np(mean, var):
    """:func:`kalmanscan.core.steps.from_prior` on numpy arrays ``[N]``, value for value."""
    diffuse = np.isposinf(var)
    big = (var > 1) & ~diffuse
    var_s = np.where(big, var, 1.0)
    u = np.where(diffuse, 0.0, 1 / var_s)
    e = np.where(diffuse, 0 * mean, mean / var_s)
    v = np.where(big | diffuse, 1.0, var)
    # a variance above 2**G (and whose precision is a normal number): the held triple
    G, top = hold_exponent(torch.float64), 1 - math.frexp(np.finfo(np.float64).tiny)[1]
    with np.errstate(invalid="ignore", over="ignore"):
        hold = (v > u * 2.0**G) & (u > 0) & (v <= u * 2.0**top)
    low = 2.0**-G
    return (np.where(hold, low, u), np.where(hold, mean * low, e), np.where(hold, var * low, v))


_LEAN_CONST: dict = {}


def _lean_const(value: float) -> torch.Tensor:
    """A kept ``[1, 1]`` float64 tensor holding ``value`` (the kernel only reads its inputs)."""
    t = _LEAN_CONST.get(value)
    if t is None:
        t = _LEAN_CONST[value] = torch.full((1, 1), value, dtype=torch.float64)
    return t


def _no_tiny_lanes(R: np.ndarray, p: np.ndarray, T: int) -> bool:
    """Whether :func:`kalmanscan.core.filter_units._tiny_lanes` keeps every lane in its units
    (returns None) for loading 1, ``obs_var`` ``R [N]`` and ``process_var`` ``p`` (``[N]`` or
    ``[T, N]``): its test, by its own functions (the bound from the extremes, then the grid)."""
    below = filter_api._tiny_below(torch.float64)
    if filter_api.extremes_clear(float(R.min()), 1.0, filter_api.positive_min(p), below):
        return True
    N = R.shape[0]
    need = filter_api.tiny_grid(R[None], np.ones((1, 1)), p.reshape(-1, N), T, N, torch.float64)[0]
    return not need.any()


def _lean_run(data: _Data, lanes: dict, series, P: int, outputs: str):
    """The kernel's output dict for lanes ``(series [n], point [P])`` (series-major) at the
    standardized parameters ``lanes {name: [n * P]}`` (numpy), or None where
    :func:`kalmanscan.loglik` would not be that one plain call (see above)."""
    from kalmanscan.core import native

    zs = data.zs.numpy()
    T = zs.shape[0]
    z = torch.from_numpy(np.take(zs, np.repeat(np.asarray(series), P), axis=1))
    dt = data.dt.numpy()
    dt = dt[:, None] if dt.ndim else dt
    with np.errstate(all="ignore"):
        decay, pv, off, pm, pvar = _lane_arrays_np(
            lanes["theta"], lanes["sigma2"], lanes["mu"], dt, data.theta_zero
        )
        R = lanes["obs_var"]
        if not _no_tiny_lanes(R, pv, T):
            return None
        if data.theta_zero:  # diffuse: (0, 0 * mean, 1)
            x0 = (_lean_const(0.0)[0], 0 * pm, _lean_const(1.0)[0])
        else:
            x0 = _from_prior_np(pm, pvar)

    def arg(a):
        if isinstance(a, float):
            return _lean_const(a)
        return torch.from_numpy(a.reshape(-1, a.shape[-1]))

    params = (arg(R), arg(decay), arg(pv), _lean_const(1.0), arg(off))
    x0 = tuple(x if isinstance(x, torch.Tensor) else torch.from_numpy(x) for x in x0)
    out = native._run(z, params, x0, outputs=outputs)
    return None if out["flags"] else out


def _lean_loglik(data: _Data, u, series):
    """:func:`_series_loglik` at ``u [P, n, k]`` (``_params_of``'s parameters) by the lean call:
    the same ``[P, n]`` tensor, or None where that call does not serve."""
    P, n, k = u.shape
    ut = np.moveaxis(u, 0, 1).reshape(n * P, k)  # lanes (series, point)
    pos = [j for j, p in enumerate(data.free) if p in _POSITIVE]
    e = _torch_fn(torch.exp, np.ascontiguousarray(ut[:, pos].T)) if pos else None
    lanes = {}
    for j, p in enumerate(data.free):
        lanes[p] = e[pos.index(j)] if j in pos else np.ascontiguousarray(ut[:, j])
    for p, v in data.fixed.items():
        lanes[p] = np.repeat(v[series], P)
    out = _lean_run(data, lanes, series, P, "loglik")
    if out is None:
        return None
    return out["loglik"].reshape(n, P).T


def _lean_filter(data: _Data, x: dict):
    """:func:`_series_loglik` with ``outputs`` at one point per series, ``x {name: [N]}``
    (numpy), by the lean call: the same :class:`kalmanscan.FilterResult` (lanes ``[N, 1]``), or
    None where that call does not serve."""
    N = data.zs.shape[1]
    lanes = {p: np.ascontiguousarray(v, dtype=np.float64).reshape(N) for p, v in x.items()}
    out = _lean_run(data, lanes, np.arange(N), 1, "all")
    if out is None:
        return None
    from kalmanscan.core.native import FILTER_KEYS

    T = data.zs.shape[0]
    s = {k: out[k].reshape(T, N, 1) for k in FILTER_KEYS}
    return filter_api.FilterResult(
        **s,
        loglik=out["loglik"].reshape(N, 1),
        final=filter_api.InfoState(out["precision"][-1].reshape(N, 1),
                                   out["info"][-1].reshape(N, 1)),
    )  # fmt: skip


def _objective(data: _Data):
    """``fun(U [P, n, k], idx [n]) -> [P, n]``: negative log-likelihood per observation of groups
    ``idx`` (numpy), for :func:`kalmanscan.timeseries.optim.minimize`."""
    N = data.zs.shape[1]
    total = float(max(data.n_obs.sum(), 1))

    def loglik(u, series):
        ll = _lean_loglik(data, u, series) if data.lean else None
        if ll is None:
            ll = _series_loglik(data, _params_of(data, u, series), series)
        return ll

    def fun(U, idx):
        if data.joint:  # one group: every series at each point
            series = np.arange(N)
            u = np.broadcast_to(U[:, :1, :], (U.shape[0], N, U.shape[2]))
            ll = loglik(u, series)
            return -(ll.sum(1, keepdim=True) / total).cpu().numpy()
        ll = loglik(U, idx)
        return -(ll.cpu().numpy() / np.maximum(data.n_obs[idx], 1))

    return fun


def _natural_grad(data: _Data, X: np.ndarray, idx) -> tuple:
    """``(ll [P, n], g [P, n, k])``: the total log-likelihood of groups ``idx [n]`` at ``X [P, n,
    k]``, the free parameters in natural standardized units (not logs), and its exact gradient
    in them (autograd: the compiled kernel's adjoint, or the backend's own)."""
    like = data.zs
    P, n, k = X.shape
    Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=like.dtype, device=like.device)
    Xt.requires_grad_(True)
    with torch.enable_grad():
        if data.joint:  # one group: every series at each point
            series = np.arange(like.shape[1])
            Xs = Xt[:, :1, :].expand(P, series.size, k)
        else:
            series = np.asarray(idx)
            Xs = Xt
        x = {p: Xs[..., j] for j, p in enumerate(data.free)}
        for p, v in data.fixed.items():
            x[p] = torch.as_tensor(v[series], dtype=like.dtype, device=like.device).expand(
                P, series.size
            )
        ll = _series_loglik(data, x, series, grad=True)
        if data.joint:
            ll = ll.sum(1, keepdim=True)
        (g,) = torch.autograd.grad(ll.sum(), Xt)
    return ll.detach().cpu().numpy(), g.cpu().numpy()


def _natural_hessian(data: _Data, x: np.ndarray, idx, on_bound=None) -> tuple:
    """``(f [n], g [n, k], H [n, k, k])``: the total negative log-likelihood of groups ``idx
    [n]`` at ``x [n, k]`` (free parameters, natural standardized units), its exact gradient and
    its Hessian by central differences of exact gradients, one call of ``1 + 2k`` points.

    Steps: ``_NAT_REL`` times ``x`` for a positive parameter (the point stays inside its
    range, however close to 0), times ``max(|x|, 1)`` for ``mu``. The log-likelihood varies on a
    scale of at least the parameter itself, so the truncation error is ``O(_NAT_REL**2)``
    relative; the rounding error is that of the gradients over the step, ~1e-11 relative at 1e-4
    of the data's scale (the stencil in ``log x`` of the fit loses the curvature of a small
    variance to rounding: its second differences are ``x**2 d2L/dx2 h**2``). ``on_bound [n,
    k]``: estimates on their bound 0 (~1e-14), differenced forward by ``_NAT_REL * _SMALL``."""
    n, k = x.shape
    positive = np.array([p in _POSITIVE for p in data.free], dtype=bool)
    fwd = np.zeros((n, k), bool) if on_bound is None else np.asarray(on_bound, bool)
    h = _NAT_REL * np.where(positive, np.abs(x), np.maximum(np.abs(x), 1.0))
    h = np.where(fwd, _NAT_REL * _SMALL, h)
    X = np.repeat(x[None], 1 + 2 * k, 0)
    for j in range(k):
        X[1 + 2 * j, :, j] += h[:, j]
        X[2 + 2 * j, :, j] -= np.where(fwd[:, j], 0.0, h[:, j])
    ll, g = _natural_grad(data, X, idx)
    g = -g
    H = np.empty((n, k, k))
    for j in range(k):
        span = np.where(fwd[:, j], 1.0, 2.0) * h[:, j]
        H[:, :, j] = (g[1 + 2 * j] - g[2 + 2 * j]) / span[:, None]
    return -ll[0], g[0], 0.5 * (H + np.swapaxes(H, 1, 2))


def _held(data: _Data, at_boundary: np.ndarray) -> np.ndarray:
    """``[G, k]``: the free estimates held in the observed information: those on their bound,
    ``mu`` where the random walk does not depend on it (``theta`` on its bound, or fixed at 0),
    and ``theta`` where the level is constant (``sigma2`` on its bound: no ``theta`` moves it)."""
    free = data.free
    bound = np.asarray(at_boundary, dtype=bool)
    held = bound.copy()
    if "mu" in free:
        m = free.index("mu")
        if "theta" in free:
            held[:, m] |= bound[:, free.index("theta")]
        elif "theta" in data.fixed:
            zero = np.asarray(data.fixed["theta"]) == 0
            held[:, m] |= np.array([zero.all()]) if data.joint else zero
    if "theta" in free and "sigma2" in free:  # (mu stays: the constant level is mu)
        held[:, free.index("theta")] |= bound[:, free.index("sigma2")]
    return held
