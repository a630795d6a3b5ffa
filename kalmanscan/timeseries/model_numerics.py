"""The numbers the model hands the filter and reads back: the exact OU transition of each step
(:func:`ou_arrays`, ``1 - decay`` as :func:`one_minus_decay`), the default prior
(:func:`default_prior`), and the units: the per-series power of two ``c`` the filter works in
(:func:`data_unit`) and the filter's results mapped back to the data's units
(:func:`_rescale_filter`). Notation and why powers of two: :mod:`kalmanscan.timeseries.model`
(docs/model.md, "Units and scale").
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core.discretize import discretize_ou, ou_transition
from kalmanscan.core.filter import InfoState


def ou_arrays(theta, sigma2, mu, dt, n_series_dims: int, like=None, classes=False):
    """Per-step ``(decay, process_var, offset)`` for steps ``dt [T]``, shaped ``[T, 1, ...]``
    (``n_series_dims`` ones)
    broadcast against the parameters (numpy, or torch when ``like`` is a tensor).

    Where steps repeat (:func:`step_classes`: a regular grid, or a record of few distinct steps)
    and no parameter varies per step, each distinct step is discretized once and its values
    gathered to the steps: the same values, elementwise, as discretizing every step.
    ``classes``: ``step_classes(dt)`` where the caller has it.
    """
    shape = (-1,) + (1,) * n_series_dims
    if isinstance(like, torch.Tensor):
        classes = None
        dt = torch.as_tensor(np.asarray(dt), dtype=like.dtype, device=like.device).reshape(shape)
    else:
        dt = np.asarray(dt, dtype=np.float64)
        per_step = any(getattr(v, "ndim", 0) > n_series_dims for v in (theta, sigma2, mu))
        if per_step or dt.ndim != 1:
            classes = None
        elif classes is False:
            classes = step_classes(dt)
        dt = dt.reshape(shape)
    if classes is None:
        decay, process_var = _discretize(theta, sigma2, dt)
        offset = mu * one_minus_decay(theta, dt, decay)
        return decay, process_var, offset
    dt = classes.values.reshape(shape)
    decay, process_var = _discretize_small(theta, sigma2, dt)
    offset = mu * one_minus_decay(theta, dt, decay)
    return tuple(_gather(v, classes) for v in (decay, process_var, offset))


def _discretize(theta, sigma2, dt):
    """:func:`kalmanscan.discretize_ou` of ``theta``, ``sigma2``, ``dt``, the same numbers: where
    each is a Python float or a native float64 numpy array (or scalar), its argument checks
    (finite, ``>= 0``, shapes that broadcast) run here on the host values and its math
    (:func:`~kalmanscan.core.discretize.ou_transition`) on the float64 tensors it would make of
    them, without its conversions and device read-back (most of a 100-step model call); other
    values, and values it refuses (for its message), go to it."""
    values = (theta, sigma2, dt)
    if not all(map(_host_float64_ok, values)):
        return discretize_ou(theta, sigma2, dt)
    try:
        np.broadcast_shapes(*(np.shape(v) for v in values))
    except ValueError:
        return discretize_ou(theta, sigma2, dt)
    decay, process_var = ou_transition(*map(_float64_tensor, values))
    return _host_result(decay), _host_result(process_var)


# (decay, process_var) of the last few small (theta, sigma2, dt) given to _discretize_small, by
# their float64 bits and shapes
_SMALL_CACHE: dict = {}
_SMALL_CACHE_MAX = 16
_SMALL_SIZE = 64


def _discretize_small(theta, sigma2, dt):
    """:func:`_discretize` of inputs of at most ``_SMALL_SIZE`` elements each (a regular grid's
    two steps, parameters per series), remembered by their bits: a model called again on
    series of the same scale (many small series, one by one) repeats them. The results are
    read-only arrays (the caller gathers them to the steps) or numbers."""
    values = (theta, sigma2, dt)
    small = all(
        type(v) is float
        or (type(v) in (np.ndarray, np.float64) and v.dtype == np.float64 and v.size <= _SMALL_SIZE)
        for v in values
    )
    if not small:
        return _discretize(theta, sigma2, dt)
    key = tuple(
        ((), np.float64(v).tobytes()) if type(v) is float else (v.shape, v.tobytes())
        for v in values
    )
    hit = _SMALL_CACHE.get(key)
    if hit is None:
        hit = _discretize(theta, sigma2, dt)
        for a in hit:
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        if len(_SMALL_CACHE) >= _SMALL_CACHE_MAX:
            _SMALL_CACHE.clear()
        _SMALL_CACHE[key] = hit
    return hit


def _host_float64_ok(v) -> bool:
    """Whether ``v`` is a Python float or native float64 numpy value (no mask, no negative
    stride) whose elements are finite and ``>= 0`` (:func:`_discretize`)."""
    if type(v) is float:
        return 0.0 <= v < math.inf
    if type(v) is np.float64:
        return 0.0 <= float(v) < math.inf
    if type(v) is not np.ndarray or v.dtype != np.float64 or any(st < 0 for st in v.strides):
        return False
    # (NaN fails both comparisons)
    return v.size == 0 or bool(v.min() >= 0.0) and bool(v.max() < math.inf)


def _float64_tensor(v) -> torch.Tensor:
    """``v`` as the float64 tensor :func:`kalmanscan.discretize_ou` makes of it: a new one for a
    Python float, numpy's memory otherwise."""
    if type(v) is float:
        return torch.tensor(v, dtype=torch.float64)
    v = np.asarray(v)
    if not v.flags.writeable:  # (read-only views: never written to)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.as_tensor(v, dtype=torch.float64)
    return torch.as_tensor(v, dtype=torch.float64)


def _host_result(t: torch.Tensor):
    """A result tensor as :func:`kalmanscan.discretize_ou` returns it for host inputs."""
    a = t.numpy()
    return a[()] if a.ndim == 0 else a


# steps sampled to judge whether a record's steps repeat (step_classes)
_STEP_SAMPLE = 4096


class StepClasses(NamedTuple):
    """The distinct steps ``values [U]`` of a record and each step's index ``inverse [T]`` among
    them; ``regular``: the first step and one other (``inverse`` 0, then 1s)."""

    values: np.ndarray
    inverse: np.ndarray
    regular: bool


def step_classes(dt: np.ndarray) -> StepClasses | None:
    """:class:`StepClasses`: the distinct steps of ``dt [T]`` (distinct as bit patterns, so a
    step of ``-0.0`` is not one of ``0.0``) and each step's index among them, with
    ``values[inverse]`` equal to ``dt`` bit for bit; ``None`` where steps hardly repeat
    (more than one distinct value in 8 among the first steps) or the record is short.

    A regular grid (the first step 0, the others equal) is found by one comparison; other
    records are sorted only where a sample of their steps repeats.

    >>> v, i, regular = step_classes(np.array([0.0] + [1.0, 1.0, 1.0, 1.0, 3.0] * 8))
    >>> v.tolist(), i[:7].tolist(), regular
    ([0.0, 1.0, 3.0], [0, 1, 1, 1, 1, 2, 1], False)
    >>> step_classes(np.array([0.0, 1.0, 1.5, 2.5, 4.0])) is None
    True
    """
    T = dt.shape[0]
    if T < 4:
        return None
    bits = dt.view(np.dtype(f"u{dt.dtype.itemsize}"))
    rest = bits[1:]
    if (rest == rest[0]).all():
        inverse = np.ones(T, np.intp)
        inverse[0] = 0
        return StepClasses(dt[:2].copy(), inverse, True)
    # the number of distinct steps in the sample, counted on its sorted bits (np.unique's count;
    # its hash table costs several times the sort here)
    sample = np.sort(bits[:_STEP_SAMPLE])
    if (1 + np.count_nonzero(sample[1:] != sample[:-1])) * 8 > sample.size:
        return None
    values, inverse = np.unique(bits, return_inverse=True)
    return StepClasses(values.view(dt.dtype), inverse.reshape(T), False)


def median_step(dt: np.ndarray, classes: StepClasses | None = None) -> float:
    """The median of the positive steps of ``dt`` (1 where there are none); of a regular grid
    (``classes.regular``) its step, which is that median."""
    if classes is not None and classes.regular:
        return float(classes.values[1]) if classes.values[1] > 0 else 1.0
    pos = dt[dt > 0]
    return float(np.median(pos)) if pos.size else 1.0


def _gather(v, classes: StepClasses):
    """``v [U, ...]`` taken at ``classes.inverse [T]`` along its first axis (a tensor by
    ``index_select``, so gradients flow back to ``v``)."""
    if isinstance(v, torch.Tensor):
        return v.index_select(0, torch.from_numpy(classes.inverse).to(v.device))
    out = _empty((classes.inverse.shape[0],) + v.shape[1:], v.dtype)
    if classes.regular:  # (the first step, then the other)
        out[:1] = v[:1]
        out[1:] = v[1:2]
        return out
    return np.take(v, classes.inverse, axis=0, out=out)


def _empty(shape, dtype) -> np.ndarray:
    """An uninitialized array, on a block the native backend keeps for reuse where it is built
    (``kalmanscan.core.native._pooled``: a fresh block costs a page fault per page)."""
    from kalmanscan.core import native

    if not native.available() or math.prod(shape) * np.dtype(dtype).itemsize < native._POOL_MIN:
        return np.empty(shape, dtype)  # (small: numpy's allocator, as native._empty)
    return native._pooled(int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype, shape)


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
    one = 0.0  # the largest of the values and scales given as one number (host floats)
    with np.errstate(invalid="ignore", over="ignore"):
        for kind, items in (("value", values), ("scale", scales)):
            for v in items:
                if v is None:
                    continue
                x = _one_number(v)
                if x is not None:  # (what the array path below gives, without arrays)
                    x = abs(x) if kind == "value" else math.sqrt(abs(x))
                    if math.isfinite(x) and x > one:
                        one = x
                    continue
                if kind == "value" and _large_float_array(v, shape):
                    # max |x| as max(max x, -min x), NaN skipped: no array of v's size made
                    lead = v.reshape((-1,) + v.shape[v.ndim - len(shape) :])
                    a = np.fmax(np.fmax.reduce(lead, 0), -np.fmin.reduce(lead, 0))
                    if not np.isinf(a).any():  # (an inf: as below, where it counts as 0)
                        big = np.maximum(big, np.fmax(a.astype(np.float64), 0.0))
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
    if one > 0:
        big = np.maximum(big, one)
    _, e = np.frexp(big)
    return np.where(big > 0, np.ldexp(1.0, e), 1.0)


def _one_number(v) -> float | None:
    """``v`` as a Python float where it is one float64 on the host (a Python float, a numpy
    float64 scalar or 0-d array); else None."""
    if type(v) is float or type(v) is np.float64:
        return float(v)
    if type(v) is np.ndarray and v.ndim == 0 and v.dtype == np.float64:
        return float(v)
    return None


def _large_float_array(v, shape) -> bool:
    """Whether ``v`` is a numpy float array of the values of many steps of series ``shape``."""
    return (
        isinstance(v, np.ndarray)
        and v.dtype.kind == "f"
        and v.size > 4096
        and v.ndim > len(shape)
        and v.shape[v.ndim - len(shape) :] == tuple(shape)
    )


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
    ll = _loglik_in_data_units(res.loglik, (observed & (pp > 0)).sum(0), c)
    # precisions over c**2 as two divisions by c (1 / c**2 overflows for c below 2**-511); a
    # value beyond float64 in z's units (a variance over a gap of 1e308) is inf, as
    # kalmanscan.filter gives it; one beyond float32 is refused (_check_held)
    inv = 1.0 / c
    with np.errstate(over="ignore"):
        out = type(res)(
            mean=_scaled(res.mean, c),
            var=_scaled(_scaled(res.var, c), c),
            precision=_scaled(_scaled(res.precision, inv), inv),
            info=_scaled(res.info, inv),
            pred_mean=_scaled(res.pred_mean, c),
            pred_var=_scaled(_scaled(res.pred_var, c), c),
            pred_precision=_scaled(_scaled(res.pred_precision, inv), inv),
            loglik=ll,
            final=InfoState(_scaled(_scaled(res.final.lam, inv), inv), _scaled(res.final.eta, inv)),
        )
    _check_held(c, [(f"filtered {k}", getattr(res, k), getattr(out, k)) for k in _HELD])
    return out


def _rescale_smoothed(res, c, observed):
    """A :class:`kalmanscan.SmoothResult` computed on ``z / c`` mapped to ``z``'s units
    (:func:`_rescale_filter`)."""
    with np.errstate(over="ignore"):  # (beyond float64 in z's units: inf, as in the filter)
        mean, var = _scaled(res.mean, c), _scaled(_scaled(res.var, c), c)
    _check_held(c, [("smoothed mean", res.mean, mean), ("smoothed var", res.var, var)])
    return type(res)(mean, var, _rescale_filter(res.filtered, c, observed))


# the results _check_held looks at: the variances (so the precisions, their reciprocals, and
# the final state's) and the means
_HELD = ("var", "pred_var", "mean", "pred_mean")
_NAMES = {
    "filtered var": "filtered variance",
    "filtered pred_var": "predicted variance",
    "filtered pred_mean": "predicted mean",
    "smoothed var": "smoothed variance",
}


def _check_held(c, items):
    """Raise ``ValueError`` where a float32 (any but float64) result loses its meaning on the
    way from units of ``c`` to the data's: ``items`` are ``(label, x, y)``, ``x`` a mean or
    variance in units of ``c`` (``label`` ending in ``var``) and ``y`` it times ``c`` or
    ``c**2`` in the result's dtype. A finite mean must stay finite, and a variance in
    ``[tiny, 1/tiny]`` (where the dtype's normal numbers hold it and its reciprocal, the
    precision) must stay in it (a subnormal keeps a few digits, 0 and inf none; the filter API
    refuses inputs that float32 changes so, docs/api-core.md). float64 results are left as
    they are (inf beyond float64, as :func:`kalmanscan.filter` gives them). Tensors are
    checked where they are, with one host sync for all of ``items``."""
    c = np.asarray(c, dtype=np.float64)
    up, down = bool((c > 1).any()), bool((c < 1).any())  # (the ways a value can leave)
    if not (up or down) or items[0][2].dtype in (np.float64, torch.float64):
        return
    losses = [(label, x, y, _lost(label, x, y, up, down)) for label, x, y in items]
    flags = [lost.any() for *_, lost in losses if lost is not None]
    if not flags or not (torch.stack(flags).any() if torch.is_tensor(flags[0]) else any(flags)):
        return
    for label, x, y, lost in losses:
        if lost is None or not bool(lost.any()):
            continue
        x, y, lost = (np.asarray(a.detach().cpu().numpy() if torch.is_tensor(a) else a)
                      for a in (x, y, lost))  # fmt: skip
        lo, hi = _normal_range(y.dtype)
        at = tuple(int(i) for i in np.argwhere(lost)[0])
        cs = float(np.broadcast_to(c, x.shape[1:])[at[1:]])
        true = float(x[at]) * cs * (cs if label.endswith("var") else 1.0)
        where = f"time step {at[0]}" + (f" of series {at[1:]}" if len(at) > 1 else "")
        raise ValueError(
            f"z: expected data and model whose results {y.dtype} (z's dtype, so the results') "
            f"holds in the data's units: variances and their reciprocals, the precisions, "
            f"normal numbers ({lo:.3g} to {hi:.3g}), means finite; got a "
            f"{_NAMES.get(label, label)} of {true:.4g} at {where} ({y.dtype}: "
            f"{float(y[at]):.4g}); pass z as float64 (to fit_ou too, for a fit's results), or "
            f"rescale the data and model so that {y.dtype} holds them"
        )


def _normal_range(dtype) -> tuple[float, float]:
    """``(tiny, 1 / tiny)`` of a numpy or torch floating dtype."""
    tiny = float(
        torch.finfo(dtype).tiny if isinstance(dtype, torch.dtype) else np.finfo(dtype).tiny
    )
    return tiny, 1 / tiny


def _lost(label, x, y, up: bool, down: bool):
    """Where ``y`` (``x`` rescaled, :func:`_check_held`) lost what ``x`` held, as a boolean
    array or tensor beside ``y``; ``None`` where nothing can have been lost (a mean only
    overflows, where some unit exceeds 1)."""
    lo, hi = _normal_range(y.dtype)
    isinf = torch.isinf if torch.is_tensor(y) else np.isinf
    isfinite = torch.isfinite if torch.is_tensor(y) else np.isfinite
    if not label.endswith("var"):
        return (isinf(y) & isfinite(x)) if up else None
    with np.errstate(invalid="ignore"):
        low = ((y < lo) & (x >= lo)) if down else None
        high = ((y > hi) & (x <= hi)) if up else None
    return low if high is None else high if low is None else (low | high)


def _loglik_in_data_units(ll, n_contrib, c):
    """The log-likelihood ``ll`` of ``z / c`` as that of ``z``: ``log c`` less for each of the
    ``n_contrib`` contributing steps (:func:`_rescale_filter`, :func:`contributing_steps`)."""
    shift = n_contrib * np.log(c)
    if isinstance(ll, torch.Tensor):
        return ll - torch.as_tensor(shift, dtype=ll.dtype, device=ll.device)
    return np.asarray(ll) - np.asarray(shift, dtype=np.asarray(ll).dtype)


def contributing_steps(observed: np.ndarray, decay, process_var, prior_var) -> np.ndarray:
    """Per series ``[*S]``: the number of steps that add to the filter's log-likelihood, the
    observed steps with a known prediction (predicted precision > 0; loading 1, finite positive
    observation variances), counted from the filter's inputs without running it: ``observed
    [T, *S]``, the filter's ``decay`` and ``process_var`` (broadcasting to it) and the prior's
    variance (``inf``: diffuse).

    A prediction is known where the state before the step was (a known prior, or any earlier
    observation), unless the step forgets it (``process_var = inf``); a step that forgets the
    state (``decay = 0``) with a finite ``process_var`` knows it afresh. A lane whose predicted
    precision falls below the range on the way has a NaN log-likelihood (the filter says so),
    which no count changes.

    >>> obs = np.array([True, True, False, True])
    >>> contributing_steps(obs, 1.0, 0.5, np.inf).tolist(), contributing_steps(obs, 1.0, 0.5, 2.0)
    (2, array(3))
    """
    prior_known = np.isfinite(_host_array(prior_var))
    decay = _host_array(decay)
    process_var = _host_array(process_var)
    forgets, fresh = ~np.isfinite(process_var), decay == 0
    n_obs = observed.sum(0)
    if not (forgets.any() or fresh.any()):
        # known from the first observation on, or throughout with a known prior
        return np.where(prior_known, n_obs, np.maximum(n_obs - 1, 0))
    shape = observed.shape
    fresh = np.broadcast_to(fresh & ~forgets, shape)
    forgets = np.broadcast_to(forgets, shape)
    # the latest event before each prediction, as a key: the transition of step s (2 s; it
    # comes first) and its observation (2 s + 1); -1 where there is none (the prior holds)
    two_t = 2 * np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    seen = np.maximum.accumulate(np.where(observed, two_t + 1, -1), axis=0)
    seen = np.concatenate([np.full((1,) + shape[1:], -1), seen[:-1]], axis=0)
    good = np.maximum(seen, np.maximum.accumulate(np.where(fresh, two_t, -1), axis=0))
    lost = np.maximum.accumulate(np.where(forgets, two_t, -1), axis=0)
    known = np.where((good < 0) & (lost < 0), np.broadcast_to(prior_known, shape[1:]), good > lost)
    return (observed & known).sum(0)
