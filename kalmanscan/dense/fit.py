"""Maximum-likelihood fitting of the variances of a dense model, many series at once.

Notation (docs/dense.md, "Fitting"): a model builder ``build(**x) -> DenseModel`` whose free
parameters ``x_j >= 0`` are variances, entering linearly: ``Q = Q0 + sum_j x_j Q_j``,
``R = R0 + sum_j x_j R_j`` (``Q0``, ``R0``: the fixed parameters' constant part) with ``F``,
``H`` and ``offset`` not depending on them (checked). Each series
``z [T, d]`` is standardized by ``s`` (the standard deviation of its first differences), the
parameters by ``s**2``, and the negative exact-diffuse log-likelihood per observation is minimized
over ``u_j = log(x_j / s**2)`` by :func:`kalmanscan.timeseries.optim.minimize`, the batched
Newton method of ``fit_ou`` (derivatives from a stencil of log-likelihood values, boundary
detection at 0), every stencil point of every series in one filter call. Standard errors: the
observed information, the stencil Hessian at the estimate (in ``u``, turned to natural units by
the delta method, :func:`_standard_errors`).
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import backends
from kalmanscan.dense import _args, native
from kalmanscan.dense.models import DenseModel
from kalmanscan.timeseries import optim

_STENCIL_H = 1e-3  # central-difference step in u (as fit_ou)
_STARTS = (1e-2, 0.3)  # standardized starting values tried per parameter (every combination)
MAX_PARAMS = 4  # the optimizer's stencil is sized for k <= 4


class DenseFit(NamedTuple):
    """Estimates per series (arrays with the series shape of ``z``).

    params: ``{name: variance}``; loglik: the exact diffuse log-likelihood at the estimate
    (kalmanscan's convention, as ``kd.filter``); converged: bool; at_boundary: ``{name: bool}``
    (estimate 0, the likelihood decreasing into the bound); n_iter: Newton iterations; message:
    the optimizer's status per series; stderr: ``{name: standard error}`` from the observed
    information (the inverse Hessian of the log-likelihood at the estimate), NaN for an estimate
    on its boundary (the others' are then those with it held at 0), where the fit did not
    converge or the Hessian is not positive definite; stderr_note: why a series has NaN standard
    errors ("" where it has none missing). A series without an estimate (no more observations
    than free variances; every variance on its bound 0 with none fixed, where the likelihood is
    unbounded: a constant series) has NaN params, loglik and stderr, converged False and a
    message saying why. The fitted model of series ``i`` is
    ``build(**fixed, **{p: v[i] for p, v in params.items()})``.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(60, 2, 1)).cumsum(0) + rng.normal(size=(60, 2, 1))  # 2 series
    >>> res = kd.fit(z, kd.local_linear_trend)
    >>> res.params["level_var"].round(3).tolist(), res.at_boundary["slope_var"].tolist()
    ([1.274, 1.042], [True, True])
    >>> res.converged.tolist(), res.stderr["level_var"].round(3).tolist()
    ([True, True], [0.461, 0.448])
    >>> str(res.stderr_note[0])
    "slope_var on the boundary 0 (no standard error); the others' with it at 0"
    """

    params: dict
    loglik: np.ndarray
    converged: np.ndarray
    at_boundary: dict
    n_iter: np.ndarray
    message: np.ndarray
    stderr: dict
    stderr_note: np.ndarray


def _free_names(build, fixed):
    try:
        sig = inspect.signature(build)
    except (TypeError, ValueError) as err:
        raise TypeError(f"build: expected a callable with named parameters, got {build!r}") from err
    names = [
        p.name
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in fixed
    ]
    unknown = sorted(set(fixed) - set(sig.parameters))
    if unknown:
        raise ValueError(
            f"fixed: {unknown} are not parameters of build (its parameters: {list(sig.parameters)})"
        )
    if not 1 <= len(names) <= MAX_PARAMS:
        raise ValueError(
            f"build: expected 1 to {MAX_PARAMS} free variance parameters (parameters without a "
            f"default, not in fixed), got {names}"
        )
    return names


def _as_np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _basis(build, names, fixed):
    """(F, H, offset, Q0, R0, [Q_j], [R_j]) with ``Q = Q0 + sum_j x_j Q_j`` (likewise R): the
    free parameters' unit matrices and the constant part the fixed values make (0 where none);
    raises unless the free parameters enter Q and R so and nothing else."""

    def at(vals):
        m = build(**fixed, **dict(zip(names, vals, strict=True)))
        if not isinstance(m, DenseModel):
            raise TypeError(f"build: expected it to return a DenseModel, got {type(m).__name__}")
        off = m.offset if m.offset is not None else np.zeros(np.shape(m.F)[-1])
        return [_as_np(x) for x in (m.F, m.Q, m.H, m.R, off)]

    k = len(names)  # builders may refuse 0 (obs_var > 0): differences from the point x = 1
    ones = at(np.ones(k))
    units = []
    for j in range(k):
        plus = at(np.ones(k) + np.eye(k)[j])
        diff = zip(plus, ones, strict=True)
        units.append([p - o if i in (1, 3) else p for i, (p, o) in enumerate(diff)])
    try:  # the constant part: the model at x = 0, where the builder takes it
        const = at(np.zeros(k))
        const = [const[1], const[3]]
    except (ValueError, ZeroDivisionError, FloatingPointError):
        const = [ones[i] - sum(u[i] for u in units) for i in (1, 3)]
        for c, i in enumerate((1, 3)):  # (rounding left by the differences is no fixed part)
            if np.abs(const[c]).max() <= 1e-12 * max(np.abs(u[i]).max() for u in units):
                const[c] = np.zeros_like(const[c])
    probe = np.random.default_rng(0).uniform(0.5, 2.0, size=k)
    mp = at(probe)
    for j, u in enumerate(units):
        for i, what in ((0, "F"), (2, "H"), (4, "offset")):
            if u[i].shape != mp[i].shape or not np.allclose(u[i], mp[i], rtol=1e-12, atol=0):
                raise ValueError(
                    f"build: expected {names} to be variances that enter Q and R only; "
                    f"{what} changes with {names[j]!r}"
                )
    held = f" plus a constant part from fixed {fixed}" if fixed else ""
    for c, (i, what) in enumerate(((1, "Q"), (3, "R"))):
        for x, ref in ((probe, mp[i]), (np.ones(k), ones[i])):
            lin = const[c] + sum(p * u[i] for p, u in zip(x, units, strict=True))
            scale = max(np.abs(ref).max(), 1e-300)
            if lin.shape != ref.shape or np.abs(lin - ref).max() > 1e-10 * scale:
                raise ValueError(
                    f"build: expected {what} to be linear in the free variances {names}{held} "
                    f"({what}(x) = {what}0 + sum_j x_j d{what}/dx_j); it is not"
                )
    F, H, off = mp[0], mp[2], mp[4]
    return F, H, off, const[0], const[1], [u[1] for u in units], [u[3] for u in units]


def _per_step(a, k: int, ndim: int, axis):
    """A builder's matrix ``a`` (``k`` trailing axes) laid out against ``z`` of ``ndim`` axes with
    time on ``axis``: one leading axis is the time step (a per-step ``dt``), which gets singleton
    axes for the series (time on ``axis``); anything else is returned as is."""
    a = np.asarray(a)
    if a.ndim != k + 1 or not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        return a
    ax = int(axis) + (ndim if axis < 0 else 0)
    if not 0 <= ax < ndim - 1:
        return a  # prepare names the bad axis
    shape = [1] * (ndim - 1)
    shape[ax] = a.shape[0]
    return a.reshape(*shape, *a.shape[1:])


def _scale(zl: torch.Tensor) -> np.ndarray:
    """Per-series standard deviation of the first differences of the observed entries [N]."""
    z = zl.numpy()  # [N, T, d], NaN missing
    dz = np.diff(z, axis=1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing series: scale 1
        s = np.sqrt(np.nanmean(dz**2, axis=(1, 2)) - np.nanmean(dz, axis=(1, 2)) ** 2)
        alt = np.sqrt(np.nanvar(z, axis=(1, 2)))
    s = np.where(np.isfinite(s) & (s > 0), s, alt)
    return np.where(np.isfinite(s) & (s > 0), s, 1.0)


class _Objective:
    """``fun(U [P, n, k], idx [n]) -> [P, n]``: minus the log-likelihood per observation."""

    def __init__(self, zl, F, H, off, Q0, R0, Qs, Rs, scale, n_obs, backend):
        self.N, self.T, self.d = zl.shape
        self.n = F.shape[-1]
        self.scale = np.asarray(scale, dtype=np.float64)
        self.zs = zl / torch.as_tensor(self.scale)[:, None, None]
        t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
        self.F, self.H, self.off = t(F), t(H), t(off)
        qs, rs = (
            np.broadcast_shapes(Q0.shape, *(q.shape for q in Qs)),
            np.broadcast_shapes(R0.shape, *(r.shape for r in Rs)),
        )
        self.Qs = torch.stack([t(np.broadcast_to(q, qs)) for q in Qs])  # [k, (T,) n, n]
        self.Rs = torch.stack([t(np.broadcast_to(r, rs)) for r in Rs])
        # the fixed parameters' constant part, None where it is 0
        self.Q0 = t(np.broadcast_to(Q0, qs)) if np.any(Q0 != 0) else None
        self.R0 = t(np.broadcast_to(R0, rs)) if np.any(R0 != 0) else None
        self.n_obs = np.maximum(n_obs, 1)
        self.backend = backend
        self.calls = 0

    def _lanes(self, x, idx):
        """x [L, k] standardized variances of series idx [L] -> Q [L, (T,) n, n], R [L, (T,) d,
        d], the fixed part over the series' squared scale."""
        xt = torch.as_tensor(x)
        Q = torch.einsum("lk,k...->l...", xt, self.Qs)
        R = torch.einsum("lk,k...->l...", xt, self.Rs)
        inv = torch.as_tensor(1.0 / self.scale[np.asarray(idx)] ** 2)
        if self.Q0 is not None:
            Q = Q + inv.reshape(-1, *[1] * self.Q0.ndim) * self.Q0
        if self.R0 is not None:
            R = R + inv.reshape(-1, *[1] * self.R0.ndim) * self.R0
        return Q, R

    def loglik(self, x, idx):
        """log-likelihood [L] of standardized series idx [L] at standardized variances x [L, k]."""
        self.calls += 1
        L = len(idx)
        Q, R = self._lanes(x, idx)
        z = self.zs[torch.as_tensor(idx)]
        if self.backend == "native":
            T, n, d = self.T, self.n, self.d
            per = lambda a, *tr: a.unsqueeze(1).expand(L, T, *tr) if a.ndim == 1 + len(tr) else a  # noqa: E731
            model = _args.Model(
                z=z,
                observed=None,
                F=self.F.expand(L, T, n, n),
                c=self.off.expand(L, T, n),
                Q=per(Q, n, n),
                H=self.H.expand(L, T, d, n),
                R=per(R, d, d),
                m0=torch.zeros(L, n, dtype=torch.float64),
                P0=None,
                L0=torch.zeros(L, n, n, dtype=torch.float64),
            )
            return native.loglik(model).numpy()
        import kalmanscan.dense as kd

        Qa = Q if Q.ndim == 3 else Q.movedim(1, 0)  # time-varying: [T, L, n, n]
        Ra = R if R.ndim == 3 else R.movedim(1, 0)
        # a per-step F, H or offset [T, ...] is shared by the L series of z [T, L, d]
        step = lambda a, k: a.unsqueeze(1) if a.ndim == k + 1 else a  # noqa: E731
        res = kd.filter(z.movedim(1, 0), step(self.F, 2), Qa, step(self.H, 2), Ra,
                        offset=step(self.off, 1), backend=self.backend)  # fmt: skip
        return res.loglik.detach().cpu().numpy()

    def __call__(self, U, idx):
        P, m, k = U.shape
        x = np.exp(U).reshape(P * m, k)
        ll = self.loglik(x, np.tile(idx, P))
        out = -(ll.reshape(P, m) / self.n_obs[idx])
        return np.where(np.isfinite(out), out, np.inf)


def _standard_errors(opt, est, n_obs, status, names):
    """``(se [N, k], note [N])`` in natural units from the optimizer's stencil Hessian at the
    estimate (docs/dense.md, "Fitting").

    The objective is minus the log-likelihood per observation in ``u = log x`` (the scale ``s**2``
    only shifts u), so the total's Hessian is ``H_u = n_obs * opt.H`` and, by the chain rule,
    ``H_x = diag(1/x) (H_u - diag(g_u)) diag(1/x)`` with ``g_u = n_obs * opt.g``: the covariance
    of the estimate is ``diag(x) (H_u - diag(g_u))^-1 diag(x)``. An estimate on its boundary gets
    NaN and the others the observed information with it held at 0 (the Hessian block of the
    interior coordinates), as ``fit_ou``.
    """
    N, k = opt.u.shape
    Hu = opt.H * n_obs[:, None, None] - (opt.g * n_obs[:, None])[:, :, None] * np.eye(k)
    Hu = 0.5 * (Hu + np.swapaxes(Hu, 1, 2))
    held = opt.at_boundary
    note = np.full(N, "", dtype=object)
    note[status != optim.CONVERGED] = "the fit did not converge"
    note[(note == "") & held.all(1)] = "every estimate is on its boundary"
    se = np.full((N, k), np.nan)
    for pattern, rows, keep, pd, cov in optim.held_covariances(Hu, held, note == ""):
        note[rows[~pd]] = "the Hessian is not positive definite (a variance is not identified)"
        if cov is not None:
            for c, j in enumerate(keep):
                se[rows[pd], j] = np.sqrt(cov[:, c, c]) * est[rows[pd], j]
        if pattern.any():
            on = ", ".join(names[j] for j in np.flatnonzero(pattern))
            note[rows[pd]] = f"{on} on the boundary 0 (no standard error); the others' with it at 0"
    return se, note


def _unbounded_text(z: np.ndarray) -> str:
    """Why a series ``z [T, d]`` (NaN missing) whose every variance went to 0 has no estimate."""
    seen = z[~np.isnan(z)]
    if seen.size and np.all(seen == seen[0]):
        what = f"every observed value is {float(seen[0])!r} (a constant series)"
    else:
        what = "the model without noise reproduces the observations exactly"
    return (
        f"{what}: the likelihood grows without bound as the variances go to 0, so there is no "
        "maximum-likelihood estimate"
    )


def _warn_no_estimate(none: np.ndarray, msg: np.ndarray, shape: tuple) -> None:
    """One warning naming the series (positions in the series shape) without an estimate."""
    if not none.any():
        return
    for why in dict.fromkeys(msg[none]):
        idx = np.flatnonzero(none & (msg == why))
        if shape == ():
            where = "the series has"
        else:
            pos = [tuple(int(a) for a in np.unravel_index(i, shape)) for i in idx[:5]]
            shown = ", ".join(str(p[0]) if len(p) == 1 else str(p) for p in pos)
            more = f" and {idx.size - 5} more" if idx.size > 5 else ""
            where = f"series {shown}{more} have"
        warnings.warn(
            f"kd.fit: {where} no estimate ({why}); params, loglik and stderr are NaN there and "
            "converged False",
            stacklevel=3,
        )


def fit(
    z,
    build,
    *,
    fixed=None,
    init=None,
    axis: int = 0,
    max_iter: int = 200,
    tol: float = 1e-9,
    backend: str = "auto",
) -> DenseFit:
    """Maximum-likelihood variances of a dense model, one fit per series (exact diffuse prior).

    z: [..., T, ..., d] observations (time on ``axis``, NaN missing; every other axis but the last
    is a series). build: a model builder ``build(**params) -> DenseModel`` such as
    :func:`kalmanscan.dense.local_linear_trend`; its parameters without a default that are not in
    ``fixed`` (1 to 4) are fitted and must be variances entering ``Q`` and ``R`` linearly (checked:
    a ``ValueError`` names the parameter otherwise). fixed: ``{name: value}`` passed to ``build``
    as is; a variance fixed at a nonzero value is a constant term of ``Q`` or ``R``. Series
    without an estimate (:class:`DenseFit`) are NaN, with one warning naming them. init:
    optional starting values ``{name: value or [series] array}`` (natural units);
    by default every combination of 0.01 and 0.3 times the series' squared difference scale is
    tried and the best taken. max_iter, tol: the optimizer's iteration limit and gradient
    tolerance (per observation, standardized). backend: ``"auto"`` (the native log-likelihood
    on the CPU, else the scan), ``"native"``, ``"torch"``.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> rng = np.random.default_rng(0)
    >>> slope = np.cumsum(0.1 * rng.normal(size=(300, 4)), 0)
    >>> level = np.cumsum(slope + rng.normal(size=(300, 4)), 0)
    >>> z = (level + 2.0 * rng.normal(size=(300, 4)))[..., None]  # 4 series, [T, 4, 1]
    >>> res = kd.fit(z, kd.local_linear_trend)
    >>> sorted(res.params), res.params["obs_var"].shape, bool(res.converged.all())
    (['level_var', 'obs_var', 'slope_var'], (4,), True)
    """
    fixed = dict(fixed or {})
    names = _free_names(build, fixed)
    # (the fit runs in float64 on the CPU: a float32 tensor would build float32 matrices, whose
    # rounding the linearity check of _basis rightly refuses)
    fixed = {
        p: v.detach().cpu().double() if isinstance(v, torch.Tensor) and v.is_floating_point()
        else v for p, v in fixed.items()
    }  # fmt: skip
    k = len(names)
    F, H, off, Q0, R0, Qs, Rs = _basis(build, names, fixed)
    if backend not in ("auto", "native", "torch"):
        raise ValueError(f"backend: expected 'auto', 'native' or 'torch', got {backend!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter: expected an int >= 1, got {max_iter!r}")
    if not (isinstance(tol, float | int) and tol > 0):
        raise ValueError(f"tol: expected a positive number, got {tol!r}")
    zt = z.detach().cpu() if isinstance(z, torch.Tensor) else z
    lay = lambda a, k: _per_step(a, k, np.ndim(zt), axis)  # noqa: E731
    model, layout = _args.prepare(
        zt, lay(F, 2), lay(Q0 + sum(Qs), 2), lay(H, 2), lay(R0 + sum(Rs), 2), lay(off, 1), None,
        None, None, axis, mask=False,
    )  # fmt: skip
    backend = backends.resolve(backend, torch.device("cpu"), op="dense")  # fitting runs on the CPU
    zl = model.z.to(torch.float64)
    N = zl.shape[0]
    n_obs = (~torch.isnan(zl)).sum((1, 2)).numpy().astype(np.float64)
    s = _scale(zl)
    fun = _Objective(zl, F, H, off, Q0, R0, Qs, Rs, s, n_obs, backend)
    idx_all = np.arange(N)
    if init:
        bad = sorted(set(init) - set(names))
        if bad:
            raise ValueError(f"init: {bad} are not free parameters (free: {names})")
        u0 = np.empty((N, k))
        for j, p in enumerate(names):
            if p in init:
                v = np.broadcast_to(np.asarray(init[p], dtype=np.float64).reshape(-1), (N,))
                if not np.all(np.isfinite(v) & (v > 0)):
                    raise ValueError(f"init: expected positive finite values for {p!r}")
                u0[:, j] = np.log(v / s**2)
            else:
                u0[:, j] = np.log(_STARTS[-1])
    else:
        starts = np.log(np.array(list(itertools.product(_STARTS, repeat=k))))  # [S, k]
        U = np.broadcast_to(starts[:, None, :], (len(starts), N, k))
        fv = fun(U, idx_all)
        u0 = starts[np.argmin(fv, 0)]
    usable = n_obs > k
    opt = optim.minimize(
        fun, u0, np.ones(k, bool), max_iter=max_iter, gtol=tol, h=_STENCIL_H, active=usable
    )
    x = np.where(opt.at_boundary, 0.0, np.exp(opt.u))
    est = x * (s**2)[:, None]
    ll = _Objective(zl, F, H, off, Q0, R0, Qs, Rs, np.ones(N), n_obs, backend).loglik(est, idx_all)
    status = np.where(usable, opt.status, optim.NOT_FINITE)
    msg = np.array(
        [optim.STATUS_TEXT[c] if u else f"fewer than {k + 1} observations" for c, u in
         zip(status, usable, strict=True)], dtype=object,
    )  # fmt: skip
    se, note = _standard_errors(opt, est, n_obs, status, names)
    # every variance on its bound 0 with no fixed one: the model without noise reproduces the
    # data exactly, where the likelihood is +inf (it rose without bound on the way)
    unbounded = usable & opt.at_boundary.all(1) & (not np.any(Q0) and not np.any(R0))
    status = np.where(unbounded, optim.NOT_FINITE, status)
    for i in np.flatnonzero(unbounded):
        msg[i] = _unbounded_text(zl[i].numpy())
    none = ~usable | unbounded  # no estimate: NaN, not the starting or limit values
    est[none], ll[none], se[none] = np.nan, np.nan, np.nan
    at_b = opt.at_boundary & ~none[:, None]
    note[none] = "no estimate (see message)"
    shape = layout.batch_shape
    _warn_no_estimate(none, msg, shape)
    return DenseFit(
        params={p: est[:, j].reshape(shape) for j, p in enumerate(names)},
        loglik=ll.reshape(shape),
        converged=(status == optim.CONVERGED).reshape(shape),
        at_boundary={p: at_b[:, j].reshape(shape) for j, p in enumerate(names)},
        n_iter=opt.n_iter.reshape(shape),
        message=msg.astype(str).reshape(shape),
        stderr={p: se[:, j].reshape(shape) for j, p in enumerate(names)},
        stderr_note=note.astype(str).reshape(shape),
    )
