"""Public dense filter and smoother: ``kalmanscan.dense.filter`` and ``kalmanscan.dense.smooth``.

Model (state n, observation d; docs/dense.md)::

    x_t = F_t x_{t-1} + offset_t + w_t,   w_t ~ N(0, Q_t)
    z_t = H_t x_t + e_t,                  e_t ~ N(0, R_t)
    x_0 ~ N(prior_mean, prior_cov)        or information form with prior_precision (0 = diffuse)

``z`` has time on ``axis`` and the observation vector on its last axis; every other axis indexes
independent series. Each matrix argument broadcasts against ``z.shape[:-1]`` in its leading axes
(time-varying matrices carry the time axis), the prior against the series shape.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.core import backends
from kalmanscan.dense import _args, native, sequential, singular
from kalmanscan.dense.parallel import (
    cov_with_inf,
    filter_parts,
    filtered_output,
    precision_of,
    rank_tol,
    smooth_moments,
)


class DenseFilterResult(NamedTuple):
    """Filtered moments (time on ``axis`` as in ``z``).

    mean [..., n], cov [..., n, n] (``inf`` entries where the state is still diffuse),
    precision [..., n, n] (singular while diffuse; ``inf`` entries where the state is known
    exactly in some direction, kalmanscan/dense/singular.py), pred_mean/pred_cov the one-step
    predictions (finite part), loglik with the series shape (exact diffuse convention,
    docs/dense.md),
    diffuse [...] bool: the filtered state is still unbounded in some direction.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
    >>> res = kd.filter(np.cumsum(np.arange(50.0))[:, None] / 50, **m._asdict())
    >>> res._fields
    ('mean', 'cov', 'precision', 'pred_mean', 'pred_cov', 'loglik', 'diffuse')
    >>> res.cov[0].round(6).tolist(), round(float(res.loglik), 4)  # slope unknown after one step
    ([[2.0, 1.0], [1.0, inf]], -84.9129)
    """

    mean: object
    cov: object
    precision: object
    pred_mean: object
    pred_cov: object
    loglik: object
    diffuse: object


class DenseSmoothResult(NamedTuple):
    """Smoothed ``mean`` [..., n], ``cov`` and ``precision`` [..., n, n] (time on ``axis`` as in
    ``z``), and the :class:`DenseFilterResult` behind them as ``filtered``.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
    >>> res = kd.smooth(np.cumsum(np.arange(50.0))[:, None] / 50, **m._asdict())
    >>> res._fields, res.cov.shape, round(float(res.filtered.loglik), 4)
    (('mean', 'cov', 'precision', 'filtered'), (50, 2, 2), -84.9129)
    """

    mean: object
    cov: object
    precision: object
    filtered: DenseFilterResult


def _is_diag(t) -> bool:
    t = torch.as_tensor(t) if not isinstance(t, torch.Tensor) else t
    # broadcast (stride-0) axes hold one value: look at it once instead of materializing them
    t = t[tuple(0 if t.stride(i) == 0 else slice(None) for i in range(t.ndim - 2))]
    off = t - torch.diag_embed(torch.diagonal(t, dim1=-2, dim2=-1))
    return bool((off == 0).all())


def _diagonal_ok(model: _args.Model, layout: _args.Layout) -> bool:
    if layout.n != layout.d:
        return False
    mats = [model.F, model.Q, model.H, model.R]
    mats.append(model.P0 if model.P0 is not None else model.L0)
    return all(_is_diag(m) for m in mats)


def _run(
    z, F, Q, H, R, offset, prior_mean, prior_cov, prior_precision, axis, backend, smooth, chunk
):
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 2:
        raise ValueError(f"chunk: expected an int >= 2 (block length of the scan), got {chunk!r}")
    model, layout, checks = _args.prepare(
        z, F, Q, H, R, offset, prior_mean, prior_cov, prior_precision, axis, mask=False,
        defer=True,
    )  # fmt: skip
    name = backends.resolve(backend, model.z.device, op="dense")
    checked = None
    if name == "triton":
        from kalmanscan.cuda.dense import Unserved, dense_triton, unsupported

        # the value checks screened on the device, no host synchronization before the launches
        # (kalmanscan.cuda.dense._launch); a Model back: the checked model, its prior diffuse
        if unsupported(model, layout) is None:
            try:
                res = dense_triton(model, layout, smooth, chunk, checks)
            except Unserved as e:  # outside its class (a known direction, R): the torch scan
                if backend != "auto":
                    raise
                res = e.model
                name = "torch"
            if not isinstance(res, _args.Model):
                return res
            checked = res
    model = checks.run(model) if checked is None else checked
    if name == "triton" and backend == "auto":  # the model class triton serves (backends.AUTO)
        name = "torch" if unsupported(model, layout) is not None else name
    return backends.get(name, op="dense")(model, layout, smooth, chunk)


# The backends of TABLES["dense"] (kalmanscan.core.backends): each takes the laid-out model
# (NaN where missing, not yet masked), its layout, whether to smooth and the scan's block length.


def _native(model: _args.Model, layout: _args.Layout, smooth: bool, chunk: int):
    """The compiled exact sequential pass (CPU); with inputs that require grad its values carry
    the gradients of :func:`_torch` at the same inputs."""
    # (a product past the range in its host-side screens: the lost series' warning says it)
    with torch.no_grad(), np.errstate(over="ignore"):
        parts = native.run(model, smooth)
    if parts is None:  # a diffuse direction is never resolved: the scan keeps it diffuse
        return _torch(model, layout, smooth, chunk, asked="native")
    res = _package(layout, parts, smooth)
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in model):
        res = _graft(_torch(model, layout, smooth, chunk, asked="native-grad"), res)
    return res


def _torch(
    model: _args.Model, layout: _args.Layout, smooth: bool, chunk: int, asked: str = "torch"
):
    """The chunked parallel scan (any device, differentiable); a singular R where H Q H' + R is
    positive definite after the diffuse head (kalmanscan/dense/parallel.py). ``asked``: the
    backend that hands the model here, for the words of :func:`_refuse_lost` (``"native"``: a
    direction it never resolves; ``"native-grad"``: the gradients of its values)."""
    model = _args.mask_missing(model)
    try:
        parts = filter_parts(model, chunk=chunk)
    except (torch.linalg.LinAlgError, ValueError, RuntimeError) as e:
        # lu_factor raises a plain RuntimeError (not LinAlgError) on an exactly singular pivot,
        # on CPU where a prediction past the range makes a combined element singular, and on
        # CUDA; other RuntimeErrors (out of memory, devices) pass through untouched
        if type(e) is RuntimeError and not str(e).startswith("torch.linalg."):
            raise
        _refuse_lost(model, layout, asked)
        raise
    sm = smooth_moments(model, parts, chunk=chunk) if smooth else None
    filt = filtered_output(model, parts)  # kappa's coefficient on the never resolved directions
    filtered = (filt, parts.pred_mean, parts.pred_cov, parts.loglik_steps)
    return _moments_result(model, layout, filtered, sm)


_HANDED = {
    "torch": (
        ", which the parallel scan cannot carry; backend='sequential' (float64) returns that "
        "series' log-likelihood as NaN with a warning, and so does backend='native' (CPU) where "
        "every diffuse direction is resolved (it hands a model with one never resolved to this "
        "scan)"
    ),
    "native": (
        "; the model has a diffuse direction that no observation resolves, which backend "
        "'native' hands to the parallel scan (backend='torch'), and the scan cannot carry such a "
        "step; backend='sequential' (float64) returns that series' log-likelihood as NaN with a "
        "warning"
    ),
    "native-grad": (
        "; backend 'native' returns that series' log-likelihood as NaN with a warning, but takes "
        "the gradients of inputs that require grad from the parallel scan (backend='torch'), "
        "which cannot carry such a step: call it without grad, or use backend='sequential' "
        "(float64, differentiable), which returns NaN with the warning"
    ),
}


def _refuse_lost(model: _args.Model, layout: _args.Layout, asked: str = "torch") -> None:
    """Raise ``OverflowError`` where the scan failed because a predicted covariance passed the
    range (it cannot carry such a step; its Cholesky factorizations fail): decided, on this
    failure path only, by the float64 reference (:func:`_lost_steps` in the working dtype).
    The message names the backend ``asked`` (:func:`_torch`) and what it does."""
    dtype = model.z.dtype
    f64 = {
        k: v.to(torch.float64)
        for k, v in model._asdict().items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }
    pred_cov = sequential.filter_moments(model._replace(**f64))[2]
    lost = _lost_steps(pred_cov.to(dtype))
    if lost is None:
        return
    name = "native" if asked.startswith("native") else asked
    raise OverflowError(
        f"backend '{name}': {lost_message(dtype, _series_index(layout, lost[0][:, -1]))}"
        f"{_HANDED[asked]}. Rescale the state or time (docs/reliability.md, limit 5)"
    ) from None


def _sequential(model: _args.Model, layout: _args.Layout, smooth: bool, chunk: int):
    """The float64 step-by-step reference (kalmanscan/dense/sequential.py)."""
    if model.z.dtype != torch.float64:
        raise ValueError(
            f"backend: 'sequential' is the float64 reference; got {model.z.dtype} inputs, "
            "use backend='torch' or float64 inputs"
        )
    # the reference filter and smoother take a singular R (entries decorrelated by R = L Dg L';
    # the smoother raises, naming native, where an exact entry meets no process noise)
    model = _args.mask_missing(model)
    filtered = sequential.filter_moments(model)
    sm = sequential.smooth_moments(model, filtered[0]) if smooth else None
    # kappa's coefficient completed on the never resolved directions (the outputs only)
    filtered = (sequential.filtered_output(model, filtered[0]), *filtered[1:])
    return _moments_result(model, layout, filtered, sm)


def _known(model: _args.Model, m, tol, extra=None, on=None):
    """(cov with +-inf where diffuse, precision, known projectors or None, gate) of Moments
    ``m``, the steps with a direction known exactly under the rule of
    kalmanscan/dense/singular.py, in the series its gate lets through (``on`` [B], computed when
    None); ``extra`` [B, T, n, n]: directions known beforehand (the filter's, for the smoother)."""
    cov = cov_with_inf(m, tol)
    if on is None:
        with np.errstate(over="ignore"):  # F F' + Q past the range: _lost_steps reports it
            on = singular.gate(model, tol)
    screened = bool(on.any())
    prec, rows, Pd = precision_of(m, tol, screened)
    if not screened:
        return cov, prec, None, on
    rows = rows & on.unsqueeze(1)
    if extra is not None:
        rows = rows | (extra != 0).any(-1).any(-1)
    if not bool(rows.any()):
        return cov, prec, None, on
    if Pd is not None:
        Pd = torch.cat([Pd, torch.zeros_like(m.cov[:, Pd.shape[1] :])], 1)
    blocks = singular.state_blocks(model)
    return (*singular.apply(cov, prec, rows, m.cov, Pd, blocks, tol, extra), on)


def _moments_result(model: _args.Model, layout: _args.Layout, filtered, sm):
    """Results from (filtered Moments, pred_mean, pred_cov, loglik_steps) and smoothed Moments."""
    filt, pm, pP, ll = filtered
    tol = rank_tol(filt.mean.dtype)
    out = lambda t, k: _args.output(layout, t, k)  # noqa: E731
    diffuse = torch.zeros(filt.mean.shape[:2], dtype=torch.bool, device=filt.mean.device)
    if filt.ndiffuse:
        diffuse[:, : filt.ndiffuse] = torch.linalg.matrix_norm(filt.diffuse[:, : filt.ndiffuse]) > 0
    fcov, fprec, known, on = _known(model, filt, tol)
    lost = _lost_steps(pP)
    nan = lambda t, k: _nan_where(lost, t, k)  # noqa: E731
    fres = DenseFilterResult(
        mean=out(nan(filt.mean, 0), 1),
        cov=out(nan(fcov, 0), 2),
        precision=out(nan(fprec, 0), 2),
        pred_mean=out(nan(pm, 1), 1),
        pred_cov=out(nan(pP, 1), 2),
        loglik=_args.output_batch(layout, _lost_loglik(layout, lost, ll.sum(1))),
        diffuse=out(diffuse, 0),
    )
    if sm is None:
        return fres
    scov, sprec, _, _ = _known(model, sm, tol, known, on)
    return DenseSmoothResult(
        out(nan(sm.mean, 2), 1), out(nan(scov, 2), 2), out(nan(sprec, 2), 2), fres
    )


class _Graft(torch.autograd.Function):
    """``value``'s numbers with ``graded``'s gradient: the backward passes through to ``graded``."""

    @staticmethod
    def forward(ctx, graded, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _graft(graded, value):
    """Each tensor of the result ``value`` carrying the autograd graph of ``graded``'s."""
    if isinstance(value, tuple):
        return type(value)(*(_graft(g, v) for g, v in zip(graded, value, strict=True)))
    if (
        isinstance(value, torch.Tensor)
        and isinstance(graded, torch.Tensor)
        and graded.requires_grad
    ):
        return _Graft.apply(graded, value)
    return value


def _package(layout: _args.Layout, p: native.NativeParts, smooth: bool):
    lost = _lost_steps(p.pred_cov)
    out = lambda t, k, w: _args.output(layout, _nan_where(lost, t, w), k)  # noqa: E731
    fres = DenseFilterResult(
        mean=out(p.filtered_mean, 1, 0),
        cov=out(p.filtered_cov, 2, 0),
        precision=out(p.filtered_precision, 2, 0),
        pred_mean=out(p.pred_mean, 1, 1),
        pred_cov=out(p.pred_cov, 2, 1),
        loglik=_args.output_batch(layout, _lost_loglik(layout, lost, p.loglik)),
        diffuse=_args.output(layout, p.diffuse, 0),
    )
    if not smooth:
        return fres
    return DenseSmoothResult(
        out(p.smoothed_mean, 1, 2),
        out(p.smoothed_cov, 2, 2),
        out(p.smoothed_precision, 2, 2),
        fres,
    )


def _lost_steps(pred_cov):
    """None, or the [B, T] masks (filtered, predicted, smoothed) of what a predicted covariance
    [B, T, n, n] past the dtype's range leaves unknown in its series (the finite part, finite
    otherwise): the filtered moments from that step on, the predictions after it (its own is
    returned: inf where it passed) and every smoothed moment (the backward pass crosses it). The
    scalar core's rule (docs/reliability.md, limit 5), with NaN where the covariance form cannot
    carry the filter through such a step."""
    bad = ~torch.isfinite(pred_cov.detach()).flatten(2).all(2)
    if not bool(bad.any()):
        return None
    after = bad.cumsum(1) > 0
    pred = torch.cat([torch.zeros_like(after[:, :1]), after[:, :-1]], 1)
    return after, pred, after[:, -1:].expand_as(after)


def _nan_where(lost, t, which: int):
    """``t`` [B, T, ...] with NaN where ``lost[which]`` (:func:`_lost_steps`) holds."""
    if lost is None:
        return t
    mask = lost[which].reshape(*lost[which].shape, *(1,) * (t.ndim - 2))
    return torch.where(mask, torch.full((), math.nan, dtype=t.dtype, device=t.device), t)


def _lost_loglik(layout: _args.Layout, lost, loglik):
    """``loglik`` [B] NaN, its gradient too, in the series :func:`_lost_steps` marks, with a
    ``RuntimeWarning`` naming them: never ``-inf`` or a term silently left out."""
    if lost is None:
        return loglik
    series = lost[0][:, -1]
    _warn_lost(layout, series, loglik.dtype)
    nan = torch.full_like(loglik, math.nan)
    return loglik * torch.where(series, nan, torch.ones_like(loglik))


def lost_message(dtype, where=None) -> str:
    """The words of :func:`_warn_lost` (and of the torch scan's ``OverflowError``): a predicted
    covariance past ``dtype``'s range, in the series ``where`` (index tuples) if given."""
    dt = str(dtype).replace("torch.", "")
    at = ""
    if where:
        more = ", ..." if len(where) > 4 else ""
        at = f" at series index {', '.join(map(str, where[:4]))}{more}"
    return (
        f"a predicted covariance passed {dt}'s range{at} (an entry of F P F' + Q beyond "
        f"{torch.finfo(dtype).max:.3g}), where the covariance form holds neither it nor its "
        "log-likelihood term"
    )


def _series_index(layout: _args.Layout, lost):
    """The index tuples of the series ``lost`` [B] marks (None for one series)."""
    if not layout.batch_shape:
        return None
    return [tuple(i) for i in lost.reshape(layout.batch_shape).nonzero().tolist()]


def _warn_lost(layout: _args.Layout, lost, dtype) -> None:
    where = _series_index(layout, lost)
    f64 = dtype == torch.float64
    warnings.warn(
        f"kalmanscan.dense: the log-likelihood is NaN: {lost_message(dtype, where)}; that "
        "series' filtered moments from that step on and its smoothed moments are NaN. Rescale "
        "the state or time"
        f"{'' if f64 else ', or use float64'} (docs/reliability.md, limit 5)",
        RuntimeWarning,
        stacklevel=6,
    )


def _diagonal_pred_finite(pred_var, z, kwargs):
    """The scalar core's predicted variances [B, T, n] with the finite part (the other backends'
    ``pred_cov``, docs/dense.md) where a lane is still diffuse (inf): a lane is diffuse until an
    entry with a nonzero loading observes it, and until then no update touches its finite part,
    which is therefore the prediction of the lane without data from the prior's finite part (0
    in a diffuse lane): ``decay^2 P + process_var`` from 0."""
    inf = torch.isinf(pred_var)
    if not bool(inf.any()):
        return pred_var
    pv = kwargs["prior_var"]
    fin_kwargs = dict(kwargs, prior_var=torch.where(torch.isinf(pv), torch.zeros_like(pv), pv))
    free = filter_api.filter(torch.full_like(z, float("nan")), **fin_kwargs)
    return torch.where(inf, free.pred_var, pred_var)


def _diagonal(model: _args.Model, layout: _args.Layout, smooth: bool, chunk: int):
    """Independent scalar lanes: hand the diagonals to kalmanscan.filter / smooth and repackage
    (diagonal F, Q, H, R and prior with d == n)."""
    if not _diagonal_ok(model, layout):
        raise ValueError(
            "backend: 'diagonal' needs diagonal F, Q, H, R and prior with d == n; "
            "use 'torch' for this model"
        )
    model = _args.mask_missing(model)
    dg = lambda m: torch.diagonal(m, dim1=-2, dim2=-1)  # noqa: E731
    z = torch.where(model.observed, model.z, torch.full_like(model.z, float("nan")))
    if model.P0 is not None:
        pv = dg(model.P0)
    elif model.P0inf is not None:  # prior_cov with inf as given: its variances, inf diffuse
        pv = dg(model.P0inf)
    else:
        lam0 = dg(model.L0)
        pv = torch.where(
            lam0 > 0,
            1.0 / torch.where(lam0 > 0, lam0, torch.ones_like(lam0)),
            torch.full_like(lam0, float("inf")),
        )
    kwargs = dict(
        obs_var=dg(model.R),
        decay=dg(model.F),
        process_var=dg(model.Q),
        loading=dg(model.H),
        offset=model.c,
        prior_mean=model.m0,
        prior_var=pv,
        axis=1,
    )
    res = filter_api.smooth(z, **kwargs) if smooth else filter_api.filter(z, **kwargs)
    f = res.filtered if smooth else res
    out = lambda t, k: _args.output(layout, t, k)  # noqa: E731
    fres = DenseFilterResult(
        mean=out(f.mean, 1),
        cov=out(torch.diag_embed(f.var), 2),
        precision=out(torch.diag_embed(f.precision), 2),
        pred_mean=out(f.pred_mean, 1),
        pred_cov=out(torch.diag_embed(_diagonal_pred_finite(f.pred_var, z, kwargs)), 2),
        loglik=_args.output_batch(layout, f.loglik.sum(-1)),
        diffuse=out((f.precision == 0).any(-1), 0),
    )
    if not smooth:
        return fres
    return DenseSmoothResult(
        out(res.mean, 1),
        out(torch.diag_embed(res.var), 2),
        out(torch.diag_embed(1.0 / res.var), 2),
        fres,
    )


for _name, _impl in (
    ("sequential", _sequential),
    ("torch", _torch),
    ("native", _native),
    ("diagonal", _diagonal),
):
    backends.provide("dense", _name, _impl)


def filter(
    z,
    F,
    Q,
    H,
    R,
    *,
    offset=None,
    prior_mean=None,
    prior_cov=None,
    prior_precision=None,
    axis=0,
    backend="auto",
    chunk=32,
) -> DenseFilterResult:
    """Kalman filter of a dense linear-Gaussian state-space model, parallel in time.

    z: [..., T, ..., d] observations (time on ``axis``, NaN entries are missing); F, Q: [..., n, n];
    H: [..., d, n]; R: [..., d, d] (positive semidefinite; singular, R = 0 included, on ``"native"``
    and ``"sequential"``, on ``"torch"`` where H Q H' + R is positive definite after the diffuse
    head); offset: [..., n]; prior_mean: [..., n] (None: 0, also beside a proper prior_cov);
    either prior_cov [..., n, n] (``inf`` on the diagonal marks diffuse states) or
    prior_precision [..., n, n] (0 in diffuse directions); neither means fully diffuse.
    numpy in -> numpy out, torch in -> torch out (differentiable). backend: ``"auto"``
    (``"native"`` for CPU inputs when the extension is built,
    ``"torch"`` otherwise), ``"native"`` (compiled exact sequential filter and smoother, CPU,
    float64; with inputs that require grad its values carry the gradients of the torch path at the
    same inputs), ``"torch"`` (chunked parallel scan), ``"sequential"`` (float64 reference),
    ``"diagonal"`` (the scalar core :func:`kalmanscan.filter`, for a diagonal model with d == n),
    ``"triton"`` (fused GPU filter and smoother: proper prior, time-invariant matrices, n <= 8,
    no grad, a positive-definite R and no direction of the state known exactly; ``"auto"`` on
    CUDA takes it for such calls, ``"torch"`` for the rest). ``chunk`` is the block length of the
    torch scan.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
    >>> z = np.cumsum(np.arange(50.0))[:, None] / 50
    >>> res = kd.filter(z, **m._asdict())
    >>> res.mean.shape, res.cov.shape, bool(res.diffuse[0]), bool(res.diffuse[1])
    ((50, 2), (50, 2, 2), True, False)
    """
    return _run(
        z, F, Q, H, R, offset, prior_mean, prior_cov, prior_precision, axis, backend, False, chunk
    )


def smooth(
    z,
    F,
    Q,
    H,
    R,
    *,
    offset=None,
    prior_mean=None,
    prior_cov=None,
    prior_precision=None,
    axis=0,
    backend="auto",
    chunk=32,
) -> DenseSmoothResult:
    """Smoothed moments p(x_t | z_{1:T}) of a dense model; same arguments as :func:`filter`.

    >>> import numpy as np, kalmanscan.dense as kd
    >>> m = kd.local_linear_trend(level_var=1.0, slope_var=0.1, obs_var=2.0)
    >>> z = np.cumsum(np.arange(50.0))[:, None] / 50
    >>> res = kd.smooth(z, **m._asdict())
    >>> res.mean.shape, bool(np.isfinite(res.cov).all())
    ((50, 2), True)
    """
    return _run(
        z, F, Q, H, R, offset, prior_mean, prior_cov, prior_precision, axis, backend, True, chunk
    )
