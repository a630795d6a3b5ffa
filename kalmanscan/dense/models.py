"""Builders for common dense models; each returns a :class:`DenseModel` (F, Q, H, R, offset).

Pass one to the filter as ``kd.filter(z, **model._asdict())``. Continuous-time models are
discretized exactly: for dx = A x dt + L dW with E[dW dW'] = Qc dt, a step dt gives F = exp(A dt)
and Q = ∫_0^dt exp(A s) L Qc L' exp(A s)' ds (Van Loan 1978). For the kinematic models A is
nilpotent and both are polynomials in dt, evaluated in closed form (a few ulps at every dt). An
array ``dt`` (irregular sampling) gives per-step F and Q with a leading time axis.

numpy or float parameters give numpy matrices. Any torch tensor among the parameters gives torch
matrices (the tensors' floating dtype, float64 for integer tensors, on their device) built from
the tensors, so gradients of ``kd.filter``/``kd.smooth`` reach them.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core._args import float64_on
from kalmanscan.core.discretize import discretize_ou


class DenseModel(NamedTuple):
    """A model's matrices: F [..., n, n], Q [..., n, n], H [..., d, n], R [..., d, d], offset
    [..., n], what the builders return and :func:`kalmanscan.dense.filter` takes as
    ``**model._asdict()``. Build one by hand for a model no builder makes.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
    >>> m.F.tolist(), m.H.tolist(), m.offset.tolist()
    ([[1.0, 1.0], [0.0, 1.0]], [[1.0, 0.0]], [0.0, 0.0])
    >>> ar1 = kd.DenseModel(F=[[0.9]], Q=[[1.0]], H=[[1.0]], R=[[0.5]], offset=[0.0])
    >>> kd.filter(np.ones((3, 1)), **ar1._asdict()).mean.shape
    (3, 1)
    """

    F: object
    Q: object
    H: object
    R: object
    offset: object


def _scalar(name, x, lo=0.0, lo_open=False):
    """A float from a number, or from a one-element tensor a 0-d float64 tensor on its graph."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_complex():
            raise TypeError(
                f"{name}: expected a real number, got a tensor of shape {tuple(x.shape)}"
            )
        v, out = float(x.detach()), x.reshape(()).to(torch.float64)
    else:
        try:
            v = out = float(x)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"{name}: expected a real number, got {type(x).__name__} {x!r}"
            ) from err
    if not np.isfinite(v) or v < lo or (lo_open and v == lo):
        op = ">" if lo_open else ">="
        raise ValueError(f"{name}: expected a finite number {op} {lo}, got {x!r}")
    return out


def _torch_of(*xs):
    """(dtype, device) of the torch tensors among ``xs`` (promoted floating dtype, float64 when
    none is floating; the first one's device), or None when there are none."""
    ts = [x for x in xs if isinstance(x, torch.Tensor)]
    if not ts:
        return None
    floats = [t.dtype for t in ts if t.is_floating_point()]
    dtype = functools.reduce(torch.promote_types, floats) if floats else torch.float64
    return dtype, ts[0].device


def _torch_model(dtype, device, F, Q, H, R, offset) -> DenseModel:
    """A DenseModel of tensors of ``dtype`` from float64 tensors or arrays."""
    return DenseModel(*(float64_on(x, device).to(dtype) for x in (F, Q, H, R, offset)))


def local_linear_trend(level_var, slope_var, obs_var) -> DenseModel:
    """Local linear trend:

    level_t = level + slope + N(0, level_var), slope_t = slope + N(0, slope_var).

    State [level, slope]; z_t = level_t + N(0, obs_var). Matches statsmodels'
    ``UnobservedComponents(level="local linear trend")``.

    >>> import kalmanscan.dense as kd
    >>> kd.local_linear_trend(1.0, 0.1, 2.0).F
    array([[1., 1.],
           [0., 1.]])
    """
    lv, sv = _scalar("level_var", level_var), _scalar("slope_var", slope_var)
    ov = _scalar("obs_var", obs_var)
    like = _torch_of(level_var, slope_var, obs_var)
    if like is not None:
        dtype, device = like
        return _torch_model(
            dtype,
            device,
            F=[[1.0, 1.0], [0.0, 1.0]],
            Q=torch.diag(torch.stack([float64_on(lv, device), float64_on(sv, device)])),
            H=[[1.0, 0.0]],
            R=float64_on(ov, device).reshape(1, 1),
            offset=np.zeros(2),
        )
    return DenseModel(
        F=np.array([[1.0, 1.0], [0.0, 1.0]]),
        Q=np.diag([lv, sv]),
        H=np.array([[1.0, 0.0]]),
        R=np.array([[ov]]),
        offset=np.zeros(2),
    )


def seasonal_dummies(period, seasonal_var, obs_var=0.0) -> DenseModel:
    """Stochastic dummy seasonal of ``period`` seasons (state dimension period - 1).

    gamma_t = -(gamma_{t-1} + ... + gamma_{t-period+1}) + N(0, seasonal_var); z_t = gamma_t + noise.
    ``obs_var`` defaults to 0 so it can be added to other components with :func:`add_components`.

    >>> import kalmanscan.dense as kd
    >>> kd.seasonal_dummies(4, 0.1).F
    array([[-1., -1., -1.],
           [ 1.,  0.,  0.],
           [ 0.,  1.,  0.]])
    """
    if not isinstance(period, (int, np.integer)) or isinstance(period, bool) or period < 2:
        raise ValueError(f"period: expected an int >= 2, got {period!r}")
    sv, ov = _scalar("seasonal_var", seasonal_var), _scalar("obs_var", obs_var)
    k = int(period) - 1
    F = np.zeros((k, k))
    F[0, :] = -1.0
    F[1:, :-1] = np.eye(k - 1)
    H = np.zeros((1, k))
    H[0, 0] = 1.0
    like = _torch_of(seasonal_var, obs_var)
    if like is not None:
        dtype, device = like
        q_diag = torch.cat([float64_on(sv, device).reshape(1), float64_on(np.zeros(k - 1), device)])
        R = float64_on(ov, device).reshape(1, 1)
        return _torch_model(dtype, device, F, torch.diag(q_diag), H, R, np.zeros(k))
    Q = np.zeros((k, k))
    Q[0, 0] = sv
    return DenseModel(F, Q, H, np.array([[ov]]), np.zeros(k))


def _kinematic_fq(order, q, dt):
    """F, Q of an ``order``-times integrated white noise of intensity ``q`` over steps ``dt``.

    dt: array [...] -> F, Q [..., k, k], k = order + 1. The drift A is the nilpotent shift
    (A_{i,i+1} = 1) and only the last state is driven, so exp(A s) is the polynomial matrix with
    entries s^(j-i)/(j-i)! and Van Loan's integral has the closed form, with p = order,

        F_ij = dt^(j-i) / (j-i)!                                  (j >= i, else 0)
        Q_ij = q dt^(2p+1-i-j) / ((p-i)! (p-j)! (2p+1-i-j))

    (constant velocity: q [[dt^3/3, dt^2/2], [dt^2/2, dt]]; constant acceleration adds dt^5/20,
    dt^4/8, dt^3/6). Each entry is one power of dt over an exact integer, so it is correct to a few
    ulps at every dt; a truncated series for exp of the Van Loan block (torch.linalg.matrix_exp)
    loses the smallest entries at small dt and can make Q indefinite.
    """
    k = order + 1
    fact = [float(math.factorial(m)) for m in range(2 * k)]
    # dt = m 2^b and q = mq 2^bq with m, mq in [0.5, 1): the power and the product are taken on the
    # mantissas and the binary exponents are added, so no intermediate over- or underflows (q dt^5
    # stays right with q = 1e300, dt = 1e-70) and only a result outside float64 is inf or 0.
    m, b = np.frexp(dt)
    mq, bq = np.frexp(np.float64(q))

    def term(scale_m, scale_b, e, c):
        return np.ldexp(scale_m * np.power(m, e) / c, scale_b + e * b)

    F = np.zeros(dt.shape + (k, k))
    Q = np.empty(dt.shape + (k, k))
    for i in range(k):
        for j in range(i, k):
            F[..., i, j] = term(1.0, 0, j - i, fact[j - i])
        for j in range(k):
            e = 2 * order + 1 - i - j
            Q[..., i, j] = term(mq, bq, e, fact[order - i] * fact[order - j] * e)
    return F, Q


def _kinematic_fq_torch(order, q, dt, dt_np):
    """:func:`_kinematic_fq` on float64 tensors ``q`` (0-d) and ``dt`` (values ``dt_np``),
    differentiable in both: the same mantissa and binary-exponent split, the exponents taken from
    the values (constants of the graph)."""
    k = order + 1
    fact = [float(math.factorial(m)) for m in range(2 * k)]
    b = np.frexp(dt_np)[1]
    bq = np.frexp(np.float64(float(q.detach())))[1]
    m, mq = _ldexp(dt, -b), _ldexp(q, -bq)

    def term(scale_m, scale_b, e, c):
        return _ldexp(scale_m * m**e / c, scale_b + e * b)

    zero = torch.zeros_like(dt)
    F = [[term(1.0, 0, j - i, fact[j - i]) if j >= i else zero for j in range(k)] for i in range(k)]
    Q = [
        [
            term(
                mq,
                bq,
                2 * order + 1 - i - j,
                fact[order - i] * fact[order - j] * (2 * order + 1 - i - j),
            )
            for j in range(k)
        ]
        for i in range(k)
    ]
    return (torch.stack([torch.stack(row, -1) for row in a], -2) for a in (F, Q))


def _ldexp(x, e):
    """``x * 2**e`` for a tensor ``x`` and integers ``e``, in two exact steps so that neither power
    of two leaves float64 while the product fits."""
    e = np.asarray(e)
    half = e // 2
    with np.errstate(over="ignore", under="ignore"):
        lo, hi = np.ldexp(1.0, half), np.ldexp(1.0, e - half)
    return x * float64_on(lo, x.device) * float64_on(hi, x.device)


def _dt(dt):
    if isinstance(dt, torch.Tensor):
        dt = dt.detach().cpu()
    arr = np.asarray(dt, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"dt: expected finite step lengths >= 0, got {dt!r}")
    return arr


def _kinematic(order, dt, noise_var, obs_var, ndim, var_name):
    like = _torch_of(dt, noise_var, obs_var)
    dt_in, dt = dt, _dt(dt)
    q = _scalar(var_name, noise_var)
    ov = _scalar("obs_var", obs_var, lo=0.0, lo_open=True)
    if not isinstance(ndim, (int, np.integer)) or ndim < 1:
        raise ValueError(f"ndim: expected an int >= 1, got {ndim!r}")
    k = order + 1
    with np.errstate(over="ignore", under="ignore"):
        F1, Q1 = _kinematic_fq(order, float(q.detach() if isinstance(q, torch.Tensor) else q), dt)
    if not (np.all(np.isfinite(F1)) and np.all(np.isfinite(Q1))):
        big = float(np.max(dt))
        raise ValueError(
            f"dt: expected steps whose F and Q fit in float64 ({var_name} * dt^{2 * order + 1} "
            f"and dt^{order} below 1.8e308), got a step of {big!r}"
        )
    n = k * ndim
    if like is not None:
        dtype, device = like
        F1, Q1 = _kinematic_fq_torch(order, float64_on(q, device), float64_on(dt_in, device), dt)
        eye = torch.eye(ndim, dtype=torch.float64, device=device)
        F, Q = (
            torch.einsum("ab,...ij->...aibj", eye, x).reshape(dt.shape + (n, n)) for x in (F1, Q1)
        )
        H = np.kron(np.eye(ndim), np.eye(1, k))
        return _torch_model(dtype, device, F, Q, H, float64_on(ov, device) * eye, np.zeros(n))
    F = np.zeros(dt.shape + (n, n))
    Q = np.zeros(dt.shape + (n, n))
    H = np.zeros((ndim, n))
    for i in range(ndim):
        s = slice(i * k, (i + 1) * k)
        F[..., s, s] = F1
        Q[..., s, s] = Q1
        H[i, i * k] = 1.0
    return DenseModel(F, Q, H, ov * np.eye(ndim), np.zeros(n))


def constant_velocity(dt, accel_var, obs_var, ndim=1) -> DenseModel:
    """Constant velocity (white-noise acceleration of intensity ``accel_var``), position observed.

    State [pos_1, vel_1, pos_2, vel_2, ...] for ``ndim`` spatial axes; exact discretization for
    step ``dt`` (scalar or per-step array): F = [[1, dt], [0, 1]],
    Q = q [[dt^3/3, dt^2/2], [dt^2/2, dt]].

    >>> import kalmanscan.dense as kd
    >>> m = kd.constant_velocity(0.5, accel_var=2.0, obs_var=1.0)
    >>> m.F.tolist(), m.Q.round(6).tolist()
    ([[1.0, 0.5], [0.0, 1.0]], [[0.083333, 0.25], [0.25, 1.0]])
    """
    return _kinematic(1, dt, accel_var, obs_var, ndim, "accel_var")


def constant_acceleration(dt, jerk_var, obs_var, ndim=1) -> DenseModel:
    """Constant acceleration (white-noise jerk of intensity ``jerk_var``), position observed.

    State [pos, vel, acc] per spatial axis; exact discretization for step ``dt`` (scalar or
    per-step array): F = [[1, dt, dt^2/2], [0, 1, dt], [0, 0, 1]],
    Q = q [[dt^5/20, dt^4/8, dt^3/6], [dt^4/8, dt^3/3, dt^2/2], [dt^3/6, dt^2/2, dt]].

    >>> import kalmanscan.dense as kd
    >>> kd.constant_acceleration(1.0, jerk_var=1.0, obs_var=1.0).F.round(12).tolist()
    [[1.0, 1.0, 0.5], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
    """
    return _kinematic(2, dt, jerk_var, obs_var, ndim, "jerk_var")


def ou_sum(theta, sigma2, dt, obs_var, mu=0.0) -> DenseModel:
    """Sum of independent Ornstein–Uhlenbeck components observed through one noisy sum.

    theta, sigma2, mu: [k] rates, diffusions and means; dt scalar or per-step array [T];
    z_t = sum_i x_{i,t} + N(0, obs_var). Discretized exactly with :func:`kalmanscan.discretize_ou`.

    >>> import kalmanscan.dense as kd
    >>> m = kd.ou_sum([0.1, 2.0], [1.0, 0.5], dt=1.0, obs_var=0.2)
    >>> m.H.tolist(), m.F.shape
    ([[1.0, 1.0]], (2, 2))
    """
    like = _torch_of(theta, sigma2, dt, obs_var, mu)
    if like is not None:
        return _ou_sum_torch(theta, sigma2, dt, obs_var, mu, *like)
    th = np.atleast_1d(np.asarray(theta, dtype=np.float64))
    s2 = np.atleast_1d(np.asarray(sigma2, dtype=np.float64))
    mu = np.broadcast_to(np.asarray(mu, dtype=np.float64), th.shape)
    if th.ndim != 1 or s2.shape != th.shape:
        raise ValueError(
            f"theta, sigma2: expected two 1-d arrays of equal length, got {th.shape} and {s2.shape}"
        )
    dt = _dt(dt)
    ov = _scalar("obs_var", obs_var, lo=0.0, lo_open=True)
    decay, pvar = discretize_ou(th, s2, dt[..., None])
    decay, pvar = np.asarray(decay), np.asarray(pvar)
    k = th.shape[0]
    F = decay[..., None] * np.eye(k)
    Q = pvar[..., None] * np.eye(k)
    return DenseModel(F, Q, np.ones((1, k)), np.array([[ov]]), mu * (1.0 - decay))


def _ou_sum_torch(theta, sigma2, dt, obs_var, mu, dtype, device) -> DenseModel:
    th, s2 = (float64_on(x, device) for x in (theta, sigma2))
    th, s2 = (x.reshape(1) if x.ndim == 0 else x for x in (th, s2))
    if th.ndim != 1 or s2.shape != th.shape:
        raise ValueError(
            f"theta, sigma2: expected two 1-d arrays of equal length, got {tuple(th.shape)} and "
            f"{tuple(s2.shape)}"
        )
    mu = torch.broadcast_to(float64_on(mu, device), th.shape)
    _dt(dt)
    ov = _scalar("obs_var", obs_var, lo=0.0, lo_open=True)
    decay, pvar = discretize_ou(th, s2, float64_on(dt, device)[..., None])
    k = th.shape[0]
    F, Q = torch.diag_embed(decay), torch.diag_embed(pvar)
    R = float64_on(ov, device).reshape(1, 1)
    return _torch_model(dtype, device, F, Q, np.ones((1, k)), R, mu * (1.0 - decay))


def add_components(*models: DenseModel) -> DenseModel:
    """Independent components observed through the sum of their observations.

    Block-diagonal F and Q, offsets stacked, H side by side, R the sum of the components' R.

    >>> import kalmanscan.dense as kd
    >>> m = kd.add_components(kd.local_linear_trend(1.0, 0.1, 2.0), kd.seasonal_dummies(4, 0.1))
    >>> m.F.shape, m.H.tolist()
    ((5, 5), [[1.0, 0.0, 1.0, 0.0, 0.0]])
    """
    if not models:
        raise ValueError("models: expected at least one DenseModel, got none")
    dims = [tuple(np.shape(m.H))[-2] for m in models]
    if any(x != dims[0] for x in dims):
        raise ValueError(f"models: expected the same observation dimension, got {dims}")
    like = _torch_of(*(x for m in models for x in m))
    if like is not None:
        return _add_components_torch(models, *like)
    arrs = [DenseModel(*(np.asarray(x, dtype=np.float64) for x in m)) for m in models]
    d = dims[0]
    sizes = [m.F.shape[-1] for m in arrs]
    n = sum(sizes)
    lead = np.broadcast_shapes(*(m.F.shape[:-2] for m in arrs), *(m.Q.shape[:-2] for m in arrs))
    F = np.zeros(lead + (n, n))
    Q = np.zeros(lead + (n, n))
    off = np.zeros(np.broadcast_shapes(*(m.offset.shape[:-1] for m in arrs)) + (n,))
    H = np.zeros(np.broadcast_shapes(*(m.H.shape[:-2] for m in arrs)) + (d, n))
    i = 0
    for m, k in zip(arrs, sizes, strict=True):
        s = slice(i, i + k)
        F[..., s, s] = m.F
        Q[..., s, s] = m.Q
        off[..., s] = m.offset
        H[..., :, s] = m.H
        i += k
    R = sum(m.R for m in arrs)
    return DenseModel(F, Q, H, R, off)


def _add_components_torch(models, dtype, device) -> DenseModel:
    ts = [DenseModel(*(float64_on(x, device) for x in m)) for m in models]
    d = ts[0].H.shape[-2]  # (the same for every model: add_components checked)
    sizes = [m.F.shape[-1] for m in ts]
    n = sum(sizes)
    lead = np.broadcast_shapes(*(tuple(m.F.shape[:-2]) for m in ts), *(m.Q.shape[:-2] for m in ts))
    off_lead = np.broadcast_shapes(*(tuple(m.offset.shape[:-1]) for m in ts))
    h_lead = np.broadcast_shapes(*(tuple(m.H.shape[:-2]) for m in ts))
    F, Q, H, off = [], [], [], []
    i = 0
    for m, k in zip(ts, sizes, strict=True):
        square, right = (i, n - i - k, i, n - i - k), (i, n - i - k)
        F.append(torch.broadcast_to(torch.nn.functional.pad(m.F, square), lead + (n, n)))
        Q.append(torch.broadcast_to(torch.nn.functional.pad(m.Q, square), lead + (n, n)))
        H.append(torch.broadcast_to(torch.nn.functional.pad(m.H, right), h_lead + (d, n)))
        off.append(torch.broadcast_to(torch.nn.functional.pad(m.offset, right), off_lead + (n,)))
        i += k
    R = sum(m.R for m in ts)
    return _torch_model(dtype, device, sum(F), sum(Q), sum(H), R, sum(off))
