"""The information-form Kalman filter and RTS smoother for many independent scalar lanes.

Model of one lane (docs/model.md; notation in docs/architecture.md)::

    x_t = decay_t * x_{t-1} + offset_t + w_t,   w_t ~ N(0, process_var_t)
    z_t = loading_t * x_t + e_t,                 e_t ~ N(0, obs_var_t)
    x_0 ~ N(prior_mean, prior_var)               (prior_var = inf: diffuse)

``z`` carries time on ``axis``; its other axes are independent lanes. Every model argument
broadcasts against ``z`` (numpy rules), so a parameter may vary along time and lanes; the prior
broadcasts against the lane shape. A time-varying parameter of a multi-lane ``z`` with time on
axis 0 therefore has shape ``[T, 1, ...]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from kalmanscan.core import _args, backends, native
from kalmanscan.core.scan import affine_scan
from kalmanscan.core.steps import compact, info_gain, predict_coeffs, predict_precision

_LOG_2PI = math.log(2 * math.pi)


class InfoState(NamedTuple):
    """A belief in information form: precision ``lam``, information vector ``eta = lam * mean``."""

    lam: object
    eta: object


class FilterResult(NamedTuple):
    """Filtered moments; arrays have ``z``'s shape unless noted.

    ``mean`` is NaN and ``var`` inf while a lane knows nothing (``precision`` 0).
    ``loglik`` has the lane shape (summed over time; steps with prior precision 0 add nothing).
    ``final`` is the last step's :class:`InfoState` (lane shape), ready to continue filtering.
    """

    mean: object
    var: object
    precision: object
    info: object
    pred_mean: object
    pred_var: object
    pred_precision: object
    loglik: object
    final: InfoState


class SmoothResult(NamedTuple):
    """RTS-smoothed ``mean`` and ``var`` (``z``'s shape) and the :class:`FilterResult` behind."""

    mean: object
    var: object
    filtered: FilterResult


class _Prepared(NamedTuple):
    conv: _args.Converter
    axis: int
    shape: tuple
    lane_shape: tuple
    z_in: torch.Tensor  # z as given (for error messages)
    z: torch.Tensor  # [T, N], NaN where not observed
    obs_var: torch.Tensor  # [T, N] (maybe an expanded view), inf or anything where z is NaN
    decay: torch.Tensor
    process_var: torch.Tensor
    loading: torch.Tensor
    offset: torch.Tensor
    lam0: torch.Tensor  # [N]
    eta0: torch.Tensor  # [N]
    backend: str


def _prepare(
    z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
):
    if z is None:
        raise TypeError("z: expected an array of observations, got None")
    values = {
        "z": z,
        "obs_var": obs_var,
        "decay": decay,
        "process_var": process_var,
        "loading": loading,
        "offset": offset,
        "prior_mean": prior_mean,
        "prior_var": prior_var,
    }
    if init is not None:
        if not (isinstance(init, tuple) and len(init) == 2):
            raise TypeError(f"init: expected an InfoState(lam, eta), got {_args._describe(init)}")
        values["init.lam"], values["init.eta"] = init
    for name, v in values.items():
        if v is None:
            raise TypeError(f"{name}: expected a real number or array, got None")
    conv = _args.Converter(values, dtype_from="z")
    zt = conv.tensor("z")
    if zt.ndim == 0:
        raise ValueError("z: expected an array with a time axis (at least 1-D), got a scalar")
    axis = _args.check_int("axis", axis)
    if not -zt.ndim <= axis < zt.ndim:
        raise ValueError(
            f"axis: expected an int in [{-zt.ndim}, {zt.ndim - 1}] for z of shape "
            f"{tuple(zt.shape)}, got {axis}"
        )
    axis %= zt.ndim
    shape = tuple(zt.shape)
    T = shape[axis]
    if T == 0:
        raise ValueError(f"z: expected at least one time step along axis {axis}, got shape {shape}")
    lane_shape = shape[:axis] + shape[axis + 1 :]
    N = math.prod(lane_shape)
    name = backends.resolve(backend, conv.device)
    if name != "native":  # the native kernel checks z for infinities in its own pass
        _args.check_range("z", zt, allow_nan=True, what=_EXPECT["z"])

    def series(name, lo=None, lo_open=False, allow_inf=False):
        t = conv.tensor(name)
        _args.check_range(
            name, t, lo=lo, lo_open=lo_open, allow_inf=allow_inf, what=_EXPECT.get(name)
        )
        _args.broadcast_to(name, t, shape, "z's shape")
        # Keep broadcast dimensions unmaterialized: [T or 1, N or 1], then an expanded [T, N] view.
        t = t.reshape((1,) * (len(shape) - t.ndim) + tuple(t.shape)).movedim(axis, 0)
        if all(n == 1 for n in t.shape[1:]):
            t = t.reshape(t.shape[0], 1)
        else:
            t = t.expand((t.shape[0],) + lane_shape).reshape(t.shape[0], N)
        return t.expand(T, N)

    def lanes(name, lo=None, lo_open=False, allow_inf=False):
        t = conv.tensor(name)
        _args.check_range(
            name, t, lo=lo, lo_open=lo_open, allow_inf=allow_inf, what=_EXPECT.get(name)
        )
        return _args.broadcast_to(
            name, t, lane_shape, "the lane shape (z without its time axis)"
        ).reshape(N)

    obs = series("obs_var", lo=0.0, lo_open=True, allow_inf=True)
    a = series("decay")
    p = series("process_var", lo=0.0)
    h = series("loading")
    c = series("offset")
    zz = zt.movedim(axis, 0).reshape(T, N)
    ac, pc = compact(a), compact(p)
    det = (ac * ac == 0) & (pc == 0)
    bad = _args.first_bad(det)
    if bad is not None:
        raise ValueError(
            "decay, process_var: expected process_var > 0 wherever decay**2 is 0 (otherwise the "
            f"state is deterministic with infinite precision), got decay={a[bad].item()!r} and "
            f"process_var=0 at (time, lane) {bad} (of the broadcast [time, lane] grid)"
        )
    if init is not None:
        lam0 = lanes("init.lam", lo=0.0)
        eta0 = lanes("init.eta")
        bad = _args.first_bad((lam0 == 0) & (eta0 != 0))
        if bad is not None:
            raise ValueError(
                "init.eta: expected 0 where init.lam is 0 (no information), "
                f"got {eta0[bad].item()!r} at lane {bad}"
            )
    else:
        pv = lanes("prior_var", lo=0.0, lo_open=True, allow_inf=True)
        pm = lanes("prior_mean")
        pvc = compact(pv)  # a lane-invariant prior costs one element, not N
        lam0 = torch.where(torch.isinf(pvc), 0.0, 1.0 / pvc)
        eta0 = (lam0 * compact(pm)).expand(N)
        lam0 = lam0.expand(N)
        if name != "native":  # the other backends take materialized [N] states
            lam0, eta0 = lam0.contiguous(), eta0.contiguous()
    oc = compact(obs)
    hc = compact(h)
    bad = _args.first_bad(torch.isinf(oc.reciprocal()))
    if bad is not None:
        raise ValueError(
            f"obs_var: expected values whose reciprocal is finite in {zt.dtype} "
            f"(>= {1 / torch.finfo(zt.dtype).max:.3g}), got {oc[bad].item()!r} at index {bad}"
        )
    info = hc * hc / oc  # information an observation adds: must be representable
    bad = _args.first_bad(torch.isinf(info) & torch.isfinite(oc))
    if bad is not None:
        o, l = oc.expand_as(info)[bad].item(), hc.expand_as(info)[bad].item()
        raise ValueError(
            f"loading: expected loading**2 / obs_var finite in {zt.dtype}, got loading={l!r} "
            f"with obs_var={o!r} at (time, lane) {bad} (of the broadcast [time, lane] grid)"
        )
    bad = _args.first_bad(torch.isinf(compact(lam0)))
    if bad is not None:
        name_ = "init.lam" if init is not None else "prior_var"
        v = (lam0 if init is not None else pv)[bad].item()
        raise ValueError(
            f"{name_}: expected a prior precision finite in {zt.dtype}, "
            f"got {name_}={v!r} at lane {bad}"
        )
    # z alone marks the steps not observed (the native kernel reads obs_var = inf itself)
    if name != "native" and bool(torch.isinf(oc).any()):
        zz = zz.masked_fill(torch.isinf(oc), float("nan"))
    return _Prepared(conv, axis, shape, lane_shape, zt, zz, obs, a, p, h, c, lam0, eta0, name)


_EXPECT = {
    "z": "finite values or NaN (missing)",
    "obs_var": "values > 0 (inf marks a step as not observed)",
    "process_var": "values >= 0 and finite",
    "prior_var": "values > 0 (inf: diffuse prior)",
    "init.lam": "values >= 0 and finite",
}


# Long inputs are filtered in time blocks of about this many elements, carrying the exact
# (lam, eta) state from block to block, so that every pass over the data stays cache-resident.
_BLOCK_ELEMS = 1 << 18
_SERIES_KEYS = ("lam", "eta", "mean", "var", "lam_pred", "mean_pred", "var_pred")


def _time_blocks(T: int, N: int):
    step = max(1, _BLOCK_ELEMS // max(N, 1))
    return [(t, min(T, t + step)) for t in range(0, T, step)]


_OUT_KEYS = _SERIES_KEYS + ("loglik",)


def _run(prep: _Prepared):
    """Filter ``[T, N]`` lanes: returns a dict of ``[T, N]`` / ``[N]`` tensors."""
    p = prep
    inputs = (p.z, p.obs_var, p.decay, p.process_var, p.loading, p.offset, p.lam0, p.eta0)
    if prep.backend == "native":  # one fused pass over all of time: no blocks needed
        if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
            outs = _NativeFilter.apply(p.z_in, *inputs)
            return dict(zip(_OUT_KEYS, outs, strict=True))
        return _run_native(p.z_in, *inputs)
    return _run_blocks(prep.backend, *inputs)


def _run_native(z_in, z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    out, flags = native.run(z, obs_var, decay, process_var, loading, offset, lam0, eta0)
    if flags & native.Z_INF:  # raises, naming the first infinity of z
        _args.check_range("z", z_in, allow_nan=True, what=_EXPECT["z"])
    if flags & native.NOT_FINITE:
        _check_overflow(out["lam"], out["eta"])
    return out


class _NativeFilter(torch.autograd.Function):
    """The native kernel's outputs, differentiable: the backward is the vector-Jacobian product
    of the torch backend's path at the same inputs (recomputed there, so the native forward
    keeps its speed and gradients stay exact to rounding)."""

    @staticmethod
    def forward(ctx, z_in, *inputs):
        ctx.save_for_backward(*inputs)
        out = _run_native(z_in, *inputs)
        return tuple(out[k] for k in _OUT_KEYS)

    @staticmethod
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors
        need = ctx.needs_input_grad[1:]
        # grad mode is on here when the caller asked for create_graph (Hessians, e.g. fit_ou's
        # standard errors): then differentiate the saved inputs themselves, keeping the graph
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            leaves = [
                x if create else x.detach().requires_grad_(n)
                for x, n in zip(inputs, need, strict=True)
            ]
            r = _run_blocks("torch", *leaves)
            pairs = [
                (r[k], g)
                for k, g in zip(_OUT_KEYS, grads, strict=True)
                if g is not None and r[k].requires_grad
            ]
            wrt = [x for x, n in zip(leaves, need, strict=True) if n]
            got = torch.autograd.grad(
                [o for o, _ in pairs],
                wrt,
                [g for _, g in pairs],
                allow_unused=True,
                create_graph=create,
            )
        it = iter(got)
        return (None,) + tuple(next(it) if n else None for n in need)


def _run_blocks(backend, z, obs_var, decay, process_var, loading, offset, lam0, eta0):
    T, N = z.shape
    parts, loglik = [], 0
    for t0, t1 in _time_blocks(T, N):
        sl = lambda x, t0=t0, t1=t1: x[t0:t1]  # noqa: E731
        r = _run_block(
            backend,
            sl(z),
            sl(obs_var),
            sl(decay),
            sl(process_var),
            sl(loading),
            sl(offset),
            lam0,
            eta0,
        )
        lam0, eta0 = r["lam"][-1], r["eta"][-1]
        loglik = loglik + r.pop("loglik")
        parts.append(r)
    out = {
        k: parts[0][k] if len(parts) == 1 else torch.cat([p[k] for p in parts])
        for k in _SERIES_KEYS
    }
    out["loglik"] = loglik
    return out


def _run_block(backend, z, obs, a, p, h, c, lam0, eta0):
    lam, eta = backends.get(backend)(z, obs, a, p, h, c, lam0, eta0)
    _check_overflow(lam, eta)
    obs, a, p, h, c = (compact(x) for x in (obs, a, p, h, c))
    lam_prev = torch.cat([lam0[None], lam[:-1]])
    eta_prev = torch.cat([eta0[None], eta[:-1]])
    q, d = predict_coeffs(a * a, p)
    lam_pred = predict_precision(lam_prev, p, q, d)
    alpha = info_gain(lam_prev, a, p, q, d)
    eta_pred = alpha * eta_prev + lam_pred * c
    if torch.is_grad_enabled() and any(x.requires_grad for x in (lam, eta, lam_pred, eta_pred)):
        # where-guarded forms: no inf/NaN in any branch, so no NaN gradients where lam = 0
        mean, var = _moments(lam, eta)
        mean_pred, var_pred = _moments(lam_pred, eta_pred)
    else:
        mean, var = (
            eta / lam,
            lam.reciprocal(),
        )  # lam = 0 gives NaN (eta = 0) and inf, as documented
        mean_pred, var_pred = eta_pred / lam_pred, lam_pred.reciprocal()
    # Log-likelihood: steps whose prior precision is 0 add nothing (exact diffuse convention),
    # unless the loading is 0 there (then z_t carries no information on the state).
    known_pred = lam_pred > 0
    observed = ~torch.isnan(z)
    contrib = observed & (known_pred | (h == 0))
    s = h * h * torch.where(known_pred, var_pred, 0.0) + torch.where(observed, obs, 1.0)
    innov = torch.where(contrib, z, 0.0) - h * torch.where(known_pred, mean_pred, 0.0)
    ll = torch.where(contrib, -0.5 * (_LOG_2PI + torch.log(s) + innov * innov / s), 0.0)
    return dict(
        lam=lam,
        eta=eta,
        mean=mean,
        var=var,
        lam_pred=lam_pred,
        mean_pred=mean_pred,
        var_pred=var_pred,
        loglik=ll.sum(0),
    )


def _check_overflow(lam, eta):
    """Raise where the precision or information overflowed (never return a silent NaN)."""
    if bool(torch.isfinite(lam).all()) and bool(torch.isfinite(eta).all()):
        return
    t, n = _args.first_bad(~(torch.isfinite(lam) & torch.isfinite(eta)))
    raise OverflowError(
        f"the filtered precision or information overflowed {lam.dtype} at step {t} of lane {n} "
        f"(within this call's time block): the state is known to below the dtype's resolution. "
        "This happens when process_var is 0 and |decay| < 1 (the precision grows like "
        "decay**(-2t)) or with extreme data; add process noise, or use float64."
    )


def _moments(lam, eta):
    known = lam > 0
    lam_safe = torch.where(known, lam, 1.0)
    return (
        torch.where(known, eta / lam_safe, float("nan")),
        torch.where(known, lam_safe.reciprocal(), float("inf")),
    )


def _out_series(prep: _Prepared, t: torch.Tensor):
    T = prep.shape[prep.axis]
    return prep.conv.out(t.reshape((T,) + prep.lane_shape).movedim(0, prep.axis))


def _out_lanes(prep: _Prepared, t: torch.Tensor):
    return prep.conv.out(t.reshape(prep.lane_shape))


def _filter_result(prep, r) -> FilterResult:
    s = lambda k: _out_series(prep, r[k])  # noqa: E731
    return FilterResult(
        mean=s("mean"),
        var=s("var"),
        precision=s("lam"),
        info=s("eta"),
        pred_mean=s("mean_pred"),
        pred_var=s("var_pred"),
        pred_precision=s("lam_pred"),
        loglik=_out_lanes(prep, r["loglik"]),
        final=InfoState(_out_lanes(prep, r["lam"][-1]), _out_lanes(prep, r["eta"][-1])),
    )


def filter(  # noqa: A001 - the public name users expect
    z,
    obs_var,
    decay,
    process_var,
    *,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
    init=None,
    axis=0,
    backend="auto",
) -> FilterResult:
    """Exact Kalman filter of independent scalar lanes, parallel in time.

    Args:
        z: observations, time on ``axis``; NaN = not observed. float32 stays float32, float64 stays
            float64 (integer numpy data becomes float64).
        obs_var: observation variance (> 0; ``inf`` = not observed), broadcasts against ``z``.
        decay: state transition ``a``, broadcasts against ``z``.
        process_var: process-noise variance (>= 0), broadcasts against ``z``.
        loading: observation loading ``h``. offset: state offset ``c``.
        prior_mean, prior_var: prior of the state before the first step, broadcast against the
            lane shape; ``prior_var = inf`` (default) is diffuse.
        init: an :class:`InfoState` ``(lam, eta)`` to start from instead of the prior (e.g. the
            ``final`` state of an earlier call); ``lam = 0`` is diffuse.
        axis: the time axis of ``z``.
        backend: ``"auto"``, ``"torch"`` (chunked parallel scans), ``"native"`` (the compiled
            single-pass CPU kernel, ``"auto"``'s choice on the CPU; its gradients come from the
            torch path's backward), ``"sequential"`` (the step-by-step reference) or
            ``"triton"`` (fused GPU kernels).

    Returns:
        :class:`FilterResult`: numpy arrays for numpy input, tensors (on ``z``'s device, with
        autograd) when any input is a tensor.

    >>> import numpy as np, kalmanscan as ks
    >>> z = np.array([1.1, 0.9, np.nan, 1.4])
    >>> res = ks.filter(z, obs_var=0.1, decay=1.0, process_var=0.01)
    >>> res.var.round(4).tolist()
    [0.1, 0.0524, 0.0624, 0.042]
    >>> float(res.loglik.round(4))
    -0.749
    """
    prep = _prepare(
        z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
    )
    return _filter_result(prep, _run(prep))


def smooth(
    z,
    obs_var,
    decay,
    process_var,
    *,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
    init=None,
    axis=0,
    backend="auto",
) -> SmoothResult:
    """Rauch–Tung–Striebel smoother: the filter, then two reverse affine scans.

    Same arguments as :func:`filter`. With the gain
    ``J_t = a_{t+1} lam^-_{t+1} / lam_t = alpha_{t+1}`` the smoothed moments follow

        ms_t = J_t ms_{t+1} + (p_{t+1} eta_t - a_{t+1} c_{t+1}) / den_{t+1}
        Ps_t = J_t^2 Ps_{t+1} + p_{t+1} / den_{t+1}          (den = a^2 + p lam_t)

    forms that stay finite where the filtered state is still diffuse (docs/algorithm.md).

    >>> import numpy as np, kalmanscan as ks
    >>> sm = ks.smooth(np.array([1.1, 0.9, np.nan, 1.4]), obs_var=0.1, decay=1.0, process_var=0.01)
    >>> sm.var.round(4).tolist()
    [0.0392, 0.0365, 0.0398, 0.042]
    """
    prep = _prepare(
        z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
    )
    r = _run(prep)
    a, p, c = prep.decay, prep.process_var, prep.offset
    T = prep.z.shape[0]
    if T > 1:
        lam, eta = r["lam"][:-1], r["eta"][:-1]
        a1, p1, c1 = (x[1:] if x.shape[0] > 1 else x for x in (a, p, c))
        q, d = predict_coeffs(a1 * a1, p1)
        forget = q > 0
        den = p1 * lam + d  # a^2 + p lam where a^2 > 0
        gain = a1 * (1 - q) / den  # info_gain(lam_t) of step t+1
        mean_off = torch.where(forget, r["mean"][:-1], (p1 * eta - a1 * c1) / den)
        var_off = torch.where(forget, r["var"][:-1], p1 / den)
        flip = lambda x: x.expand(T - 1, -1).flip(0)  # noqa: E731
        # A state is unknown (smoothed var inf) where nothing constrains it; track that with a
        # separate indicator scan and feed the moment scans finite stand-ins, so that no inf or
        # NaN enters them (nor their gradients).
        last_var = r["var"][-1]
        unknown_end = torch.isinf(last_var).to(last_var.dtype)
        unknown_off = torch.isinf(var_off).to(var_off.dtype)
        unknown = (
            affine_scan(
                flip((gain != 0).to(gain.dtype)).detach(),
                flip(unknown_off),
                unknown_end,
                annihilate=True,
            ).flip(0)
            > 0
        )
        finite = lambda x: torch.where(torch.isfinite(x), x, 0.0)  # noqa: E731
        ms = affine_scan(flip(gain), flip(finite(mean_off)), finite(r["mean"][-1])).flip(0)
        ps = affine_scan(flip(gain * gain), flip(finite(var_off)), finite(last_var)).flip(0)
        ms = torch.where(unknown, float("nan"), ms)
        ps = torch.where(unknown, float("inf"), ps)
        ms = torch.cat([ms, r["mean"][-1:]])
        ps = torch.cat([ps, r["var"][-1:]])
    else:
        ms, ps = r["mean"], r["var"]
    return SmoothResult(_out_series(prep, ms), _out_series(prep, ps), _filter_result(prep, r))
