"""The information-form Kalman filter and smoother for many independent scalar lanes.

Model of one lane (docs/model.md; notation in docs/architecture.md)::

    x_t = decay_t * x_{t-1} + offset_t + w_t,   w_t ~ N(0, process_var_t)
    z_t = loading_t * x_t + e_t,                 e_t ~ N(0, obs_var_t)
    x_0 ~ N(prior_mean, prior_var)               (prior_var = inf: diffuse)

``z`` carries time on ``axis``; its other axes are independent lanes. Every model argument
broadcasts against ``z`` (numpy rules), so a parameter may vary along time and lanes; the prior
broadcasts against the lane shape. A time-varying parameter of a multi-lane ``z`` with time on
axis 0 therefore has shape ``[T, 1, ...]``.

Modules, by role: this one holds the entry points (:func:`filter`, :func:`loglik`,
:func:`smooth`), their result types, the backend call and the check of its flags, and the
outputs' shaping (the log-likelihood conventions included); ``filter_prepare`` converts and
broadcasts the arguments, ``filter_checks`` checks their values, ``filter_units`` computes tiny
values exactly by powers of two. Their names are importable from here as well.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from kalmanscan.core.filter_checks import (  # noqa: F401 - also this module's names before the split
    _EXPECT,
    _numbers_ok,
    _refused_information,
    _tiny_information,
    _validate,
    _values_ok,
)
from kalmanscan.core.filter_prepare import (  # noqa: F401 - as above
    _CONSTANTS,
    _broadcast_check,
    _device_constant,
    _device_prior,
    _kept_prior,
    _kept_series,
    _number,
    _prepare,
    _Prepared,
    _prior,
    _trim,
)
from kalmanscan.core.filter_units import (  # noqa: F401 - as above
    _UNIT_POWERS,
    _caller_array,
    _device_screen,
    _first_informative,
    _from_unit,
    _in_units,
    _judged_on_host,
    _log_scale_shift,
    _no_tiny_products,
    _np_compact,
    _observation_scale,
    _plain_tiny,
    _plain_tiny_loading,
    _rescaled,
    _Screen,
    _tiny_below,
    _tiny_lanes,
    extremes_clear,
    positive_min,
    tiny_grid,
)
from kalmanscan.core.steps import compact


class InfoState(NamedTuple):
    """A belief in information form: precision ``lam``, information vector ``eta = lam * mean``
    (lane shape). A filter's ``final`` is one; pass it as ``init`` to continue filtering, or
    build one for a prior (``lam = 0``: diffuse).

    >>> import numpy as np, kalmanscan as ks
    >>> r = ks.filter(np.array([1.0, 2.0]), 1.0, 0.9, 0.5)
    >>> round(float(r.final.eta / r.final.lam), 4)  # the last filtered mean
    1.5238
    >>> bool(np.isclose(ks.filter(np.array([2.0]), 1.0, 0.9, 0.5, init=ks.filter(
    ...     np.array([1.0]), 1.0, 0.9, 0.5).final).mean[0], r.mean[1]))
    True
    """

    lam: object
    eta: object


class FilterResult(NamedTuple):
    """Filtered moments; arrays have ``z``'s shape unless noted.

    ``mean`` is NaN and ``var`` inf while a lane knows nothing (``precision`` 0).
    ``loglik`` has the lane shape (summed over time; steps with prior precision 0 add nothing).
    ``final`` is the last step's :class:`InfoState` (lane shape), ready to continue filtering.

    >>> import numpy as np, kalmanscan as ks
    >>> r = ks.filter(np.array([1.0, np.nan, 2.0]), 1.0, 0.9, 0.5)
    >>> r.mean.round(4), r.var.round(4)  # (the default prior is diffuse: var 1 = obs_var)
    (array([1.    , 0.9   , 1.5354]), array([1.    , 1.31  , 0.6095]))
    >>> r.pred_var.round(4), float(r.loglik.round(4))
    (array([   inf, 1.31  , 1.5611]), -1.6656)
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
    """Smoothed ``mean`` and ``var`` (``z``'s shape) and the :class:`FilterResult` behind.

    >>> import numpy as np, kalmanscan as ks
    >>> s = ks.smooth(np.array([1.0, np.nan, 2.0]), 1.0, 0.9, 0.5)
    >>> s.mean.round(4), s.var.round(4)
    (array([1.3764, 1.4478, 1.5354]), array([0.7438, 0.7672, 0.6095]))
    >>> bool(s.mean[-1] == s.filtered.mean[-1])  # the last step: smoothed = filtered
    True
    """

    mean: object
    var: object
    filtered: FilterResult


def _run(prep: _Prepared, kind: str = "filter", rescale: bool = False, host: bool = False) -> dict:
    """Run the backend: ``kind`` is ``"filter"`` (every output), ``"loglik"`` or ``"smooth"``;
    ``rescale``: with the observations of tiny loadings rescaled (:func:`_rescaled`; also
    where the API's own checks or plain numbers show them); ``host``: tiny variances judged on
    the host also for arrays off it (:func:`_tiny_lanes`; else those come with their device
    screen, ``out["screen"]``: :func:`_device_screen`). The result's ``flags`` are read by
    :func:`_check` once the caller has built its outputs (on a device the read waits for the
    kernels, so the host work before it overlaps them)."""
    mod = prep.mod
    if not getattr(mod, "CHECKS_INPUTS", False):
        rescale = _validate(prep, check_z=False) or rescale
    elif _plain_tiny_loading(prep):
        rescale = True
    p = prep
    ins, shift = (p.z, p.obs_var, p.decay, p.process_var, p.loading, p.offset), None
    if rescale:
        ins, shift = _rescaled(prep)
    x0, tiny = p.x0, _tiny_lanes(prep, ins, host)
    screen = None
    if tiny is not None:
        ins, x0, more = _in_units(prep, ins, x0, *tiny)
        shift = more if shift is None else shift + more
    elif not host:
        screen = _device_screen(prep, ins)  # (None where judged on the host)
    if kind == "smooth":
        out = mod.smooth_lanes(*ins, x0)
    else:
        out = mod.filter_lanes(*ins, x0, outputs="loglik" if kind == "loglik" else "all")
    if tiny is not None:
        out = _from_unit(out, tiny[0])
    if shift is not None:
        out = dict(out, loglik=out["loglik"] + shift.to(out["loglik"].dtype), rescaled=rescale)
    if screen is not None:
        out = dict(out, screen=screen)
    return out


def _call(prep: _Prepared, kind: str, build):
    """``build(out)`` of the backend's result, run again where :func:`_check` asks (tiny
    loadings' observations rescaled; lanes the device screen flagged, judged on the host and
    carried in their units): at most three runs, each adding one of the two."""
    opts = {}
    while True:
        out = _run(prep, kind, **opts)
        res = build(out)
        more = {k: True for k, v in (_check(prep, out) or {}).items() if v and not opts.get(k)}
        if not more:
            return res
        opts.update(more)


# flag bit of a backend that checks its inputs (docs/backend-contract.md): an input out of its
# range, or a tiny loading's information (for _validate to decide)
_BAD_INPUT = 4
# flag bit of every backend: a lane's log-likelihood is NaN by design, a predicted precision
# below the dtype's normal range (steps.lost_steps; docs/reliability.md, limit 5)
_LL_LOST = 8
# flag bit of the API, never of a backend (theirs are 1, 2, 4 and 8: docs/backend-contract.md):
# the device screen of tiny variances (filter_units._device_screen, read with the flags) says a
# lane's products may leave the range; the API judges the call's arrays on the host and, where
# they do, runs it again in the lanes' units (docs/reliability.md, "Every variance tiny")
_MAYBE_TINY = 16


def _check(prep: _Prepared, out: dict) -> dict | None:
    """Raise if the backend flagged a value: the ``ValueError`` naming the bad input, else an
    ``OverflowError``. Returns the options of :func:`_run` to run the call again with, or None:
    ``rescale`` where tiny loadings' observations are to be rescaled (a backend that checks its
    inputs flagged them), ``host`` where the device screen flagged tiny variances and the
    host's test finds lanes to carry in smaller units (this run's values and flags stand for
    nothing then, except an invalid input)."""
    flags = _read_flags(out)  # the one host synchronization of a call
    if flags & _MAYBE_TINY:
        flags &= ~_MAYBE_TINY
        if _tiny_lanes(prep, out["screen"].ins, host=True) is not None:
            rescale = bool(flags & ~_LL_LOST) and _validate(prep, check_z=True)  # (raises)
            return {"host": True, "rescale": rescale or bool(out.get("rescaled"))}
    lost, flags = flags & _LL_LOST, flags & ~_LL_LOST
    if not flags:
        if lost:  # (after the checks: no warning before an error, or before a call run again)
            _warn_lost(prep, out)
        return None
    rescale = _validate(prep, check_z=True)  # raises naming the bad input, if one is
    if rescale and not out.get("rescaled"):
        return {"rescale": True}
    hc, oc = compact(prep.loading), compact(prep.obs_var)
    if flags & ~_BAD_INPUT or not bool(_tiny_information(hc, oc).any()):
        remedy = (
            "rescale the data, or use float64"
            if prep.z.dtype != torch.float64
            # (float64: rescaling keeps the ratio of a far value to the variances)
            else "a value far beyond the others and the model's variances (a missing-value "
            "code, a data error) can be set to NaN; kalmanscan.timeseries.fit_ou(robust=True) "
            "screens such values"
        )
        raise OverflowError(
            f"the filter's values are not representable in {prep.z.dtype}: the data or "
            "parameters are beyond what the dtype can hold (e.g. squared innovations past its "
            f"maximum); {remedy}"
        )
    if lost:
        _warn_lost(prep, out)
    return None  # bit 4 from tiny information, computed exactly


def _warn_lost(prep: _Prepared, out: dict) -> None:
    """A ``RuntimeWarning`` naming the lanes whose log-likelihood is NaN because a predicted
    variance passed the dtype's range (the backend flagged :data:`_LL_LOST`)."""
    import warnings

    mark = out.get("mark_lost")  # (a backend whose gradients learn of it here)
    if mark is not None:
        mark()
    bad = torch.isnan(out["loglik"].detach()).reshape(prep.lane_shape)
    where = [tuple(i) for i in bad.nonzero().tolist()]
    lanes = (
        ""
        if not prep.lane_shape
        else f" at lane index {', '.join(map(str, where[:4]))}{', ...' if len(where) > 4 else ''}"
    )
    dtype = prep.z.dtype
    warnings.warn(
        f"kalmanscan: the log-likelihood is NaN{lanes}: a predicted variance passed "
        f"{str(dtype).replace('torch.', '')}'s range (above 1/{torch.finfo(dtype).tiny:.3g}, "
        "from decay**2 * variance), where its log-likelihood term is not representable; the "
        "filtered and smoothed moments are unaffected. Rescale the state or time"
        f"{'' if dtype == torch.float64 else ', or use float64'} (docs/reliability.md, limit 5)",
        RuntimeWarning,
        stacklevel=5,  # (the caller of filter, smooth or loglik: through _call, _check)
    )


def _read_flags(out: dict) -> int:
    """The backend's flags word as an int (on a device: the call's host synchronization; a
    backend that launched more work behind its flags gives ``read_flags``, which waits for the
    flags only), with :data:`_MAYBE_TINY` where the call's device screen (``out["screen"]``,
    read in the same synchronization) flags tiny variances."""
    read = out.get("read_flags")
    screen: _Screen | None = out.get("screen")
    if screen is None:
        return read() if read is not None else int(out["flags"])
    flags, extremes = screen.read(out["flags"], read)
    return flags | (_MAYBE_TINY if screen.maybe(extremes) else 0)


LOGLIK_CONVENTIONS = ("diffuse-omitted", "kfas", "statsmodels")


def _check_convention(convention):
    if convention not in LOGLIK_CONVENTIONS:
        raise ValueError(
            f"loglik_convention: expected one of {LOGLIK_CONVENTIONS}, got {convention!r}"
        )


def _with_convention(prep: _Prepared, r: dict, convention) -> dict:
    """Shift ``r["loglik"]`` from the diffuse-omitted convention to ``convention``.

    A lane whose prior is diffuse has exactly one diffuse step: its first observed step with
    ``h != 0``, unless a total-forgetting step (``decay == 0``) comes first. There the peers add
    ``-1/2 log F_inf`` (KFAS) or ``-1/2 (log 2π + log F_inf)`` (Durbin & Koopman), with
    ``F_inf = h_t^2 P_inf,t`` and ``P_inf,t = prod_{s=1..t} decay_s^2`` (1 at the first step).
    """
    if convention == "diffuse-omitted":
        return r
    T, N = prep.z.shape
    h = prep.loading.expand(T, N)
    a = prep.decay.expand(T, N)
    forget = a == 0
    t_star, diffuse = _first_informative(prep)
    log_a2 = 2 * torch.log(torch.where(forget, 1.0, a.abs()))  # (finite where a^2 underflows)
    log_pinf = log_a2.cumsum(0).gather(0, t_star[None])[0] - log_a2[0]
    h_star = torch.where(diffuse, h.gather(0, t_star[None])[0], 1.0)  # no log(0) (nor NaN grad)
    log_f = torch.log(h_star * h_star) + log_pinf
    shift = 0.5 * (log_f + (math.log(2 * math.pi) if convention == "statsmodels" else 0.0))
    r = dict(r)
    r["loglik"] = r["loglik"] - torch.where(diffuse, shift, 0.0)
    return r


def _out_series(prep: _Prepared, t: torch.Tensor):
    if t.shape != prep.shape:
        T = prep.shape[prep.axis]
        t = t.reshape((T,) + prep.lane_shape)
        if prep.axis:
            t = t.movedim(0, prep.axis)
    return prep.conv.out(t)


def _out_lanes(prep: _Prepared, t: torch.Tensor):
    if t.shape != prep.lane_shape:
        t = t.reshape(prep.lane_shape)
    return prep.conv.out(t)


def _filter_result(prep, r) -> FilterResult:
    s = lambda k: _out_series(prep, r[k])  # noqa: E731
    lane = lambda k: _out_lanes(prep, r[k][-1])  # noqa: E731
    return FilterResult(
        mean=s("mean"),
        var=s("var"),
        precision=s("precision"),
        info=s("info"),
        pred_mean=s("pred_mean"),
        pred_var=s("pred_var"),
        pred_precision=s("pred_precision"),
        loglik=_out_lanes(prep, r["loglik"]),
        final=InfoState(lane("precision"), lane("info")),
    )


def _smooth_result(prep: _Prepared, out: dict, convention) -> SmoothResult:
    r = _with_convention(prep, out, convention)
    return SmoothResult(
        _out_series(prep, r["smooth_mean"]),
        _out_series(prep, r["smooth_var"]),
        _filter_result(prep, r),
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
    loglik_convention="diffuse-omitted",
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
            lane shape; ``prior_var = inf`` (default) is diffuse, ``prior_var = 0`` known exactly.
        init: an :class:`InfoState` ``(lam, eta)`` to start from instead of the prior (e.g. the
            ``final`` state of an earlier call); ``lam = 0`` is diffuse.
        axis: the time axis of ``z``.
        backend: ``"auto"``, ``"torch"`` (the chunked projective scan), ``"native"`` (the
            compiled single-pass CPU kernel, ``"auto"``'s choice on the CPU), ``"sequential"``
            (the step-by-step reference) or ``"triton"`` (fused GPU kernels).
        loglik_convention: what a diffuse prior's first informative observation contributes
            to ``loglik``: ``"diffuse-omitted"`` (default: nothing, the exact diffuse
            likelihood of the observations after it), ``"kfas"`` (R KFAS: ``-1/2 log F_inf``,
            ``F_inf = h^2 P_inf``) or ``"statsmodels"`` (Durbin & Koopman, statsmodels'
            ``use_exact_diffuse=True``: ``-1/2 (log 2π + log F_inf)``). ``P_inf`` is the diffuse
            part of the predicted variance, 1 at the first step (docs/validation.md).

    Returns:
        :class:`FilterResult`: numpy arrays for numpy input, tensors (on ``z``'s device, with
        autograd) when any input is a tensor. A state known exactly (``process_var = 0`` with
        ``|decay| < 1`` over many steps, ``prior_var = 0``, ``decay = process_var = 0``) has
        ``precision`` inf and ``var`` 0, and ``info`` is then ``±inf``; ``mean`` stays exact.

    Raises:
        ValueError naming the argument for an invalid value; OverflowError only for data no
        float of the dtype can hold (e.g. squared innovations past its maximum).

    >>> import numpy as np, kalmanscan as ks
    >>> z = np.array([1.1, 0.9, np.nan, 1.4])
    >>> res = ks.filter(z, obs_var=0.1, decay=1.0, process_var=0.01)
    >>> res.var.round(4).tolist()
    [0.1, 0.0524, 0.0624, 0.042]
    >>> float(res.loglik.round(4))
    -0.749
    """
    _check_convention(loglik_convention)
    prep = _prepare(
        z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
    )
    return _call(
        prep, "filter", lambda r: _filter_result(prep, _with_convention(prep, r, loglik_convention))
    )


def loglik(
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
    loglik_convention="diffuse-omitted",
):
    """Per-lane log-likelihood only: :func:`filter`'s ``loglik`` without its ``[T, N]`` outputs.

    Same arguments as :func:`filter`. Nothing of ``z``'s size is written (the fitting path); with
    torch inputs the result is differentiable in every input that requires grad (on ``native``
    and ``triton`` by the kernel's own adjoint).

    >>> import numpy as np, kalmanscan as ks
    >>> z = np.array([1.1, 0.9, np.nan, 1.4])
    >>> float(ks.loglik(z, obs_var=0.1, decay=1.0, process_var=0.01).round(4))
    -0.749
    """
    _check_convention(loglik_convention)
    prep = _prepare(
        z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
    )
    return _call(
        prep,
        "loglik",
        lambda r: _out_lanes(prep, _with_convention(prep, r, loglik_convention)["loglik"]),
    )


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
    loglik_convention="diffuse-omitted",
) -> SmoothResult:
    """Smoothed moments: the filter, a backward information filter, precisions added.

    Same arguments as :func:`filter`. The backward filter carries the information about ``x_t``
    from the observations after ``t`` as a homogeneous triple ``(U, E, V)``; with the filtered
    ``(u, e, v)`` the smoothed ``mean = (e V + E v) / (u V + U v)`` and
    ``var = v V / (u V + U v)``: no subtraction, so it stays accurate where the covariance-form
    Rauch–Tung–Striebel recursion amplifies rounding (docs/algorithm.md).

    >>> import numpy as np, kalmanscan as ks
    >>> sm = ks.smooth(np.array([1.1, 0.9, np.nan, 1.4]), obs_var=0.1, decay=1.0, process_var=0.01)
    >>> sm.var.round(4).tolist()
    [0.0392, 0.0365, 0.0398, 0.042]
    """
    _check_convention(loglik_convention)
    prep = _prepare(
        z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
    )
    return _call(prep, "smooth", lambda out: _smooth_result(prep, out, loglik_convention))
