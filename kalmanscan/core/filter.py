"""The information-form Kalman filter and smoother for many independent scalar lanes.

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

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import _args, backends
from kalmanscan.core.steps import compact, from_info, from_prior, normalize


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
    """Smoothed ``mean`` and ``var`` (``z``'s shape) and the :class:`FilterResult` behind."""

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
    x0: tuple  # (u0, e0, v0), each [N]: the prior as a homogeneous triple
    has_init: bool  # the initial state is init = (lam, eta), not the prior
    backend: str
    mod: object  # the backend's module


def _prepare(
    z, obs_var, decay, process_var, loading, offset, prior_mean, prior_var, init, axis, backend
):
    """Convert and broadcast the inputs, resolve the backend and build the initial triple.

    Value checks are in :func:`_validate` (run before the backend unless the backend checks its
    inputs in its own pass, and whenever a backend flags a bad value).
    """
    if z is None:
        raise TypeError("z: expected an array of observations, got None")
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(
            "kalmanscan.filter, smooth and loglik do not run under torch.func transforms (grad, "
            "vmap, jacrev, ...): the backends read the tensors' memory; use torch.autograd.grad "
            "(or .backward()) for gradients, and put the series side by side on the lane axis "
            "of z instead of vmap"
        )
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
    nd = zt.ndim
    if nd == 0:
        raise ValueError("z: expected an array with a time axis (at least 1-D), got a scalar")
    if type(axis) is not int:
        axis = _args.check_int("axis", axis)
    if not -nd <= axis < nd:
        raise ValueError(
            f"axis: expected an int in [{-nd}, {nd - 1}] for z of shape "
            f"{tuple(zt.shape)}, got {axis}"
        )
    axis %= nd
    shape = tuple(zt.shape)
    T = shape[axis]
    if T == 0:
        raise ValueError(f"z: expected at least one time step along axis {axis}, got shape {shape}")
    lane_shape = shape[:axis] + shape[axis + 1 :]
    N = lane_shape[0] if nd == 2 else math.prod(lane_shape)
    dtype, device = conv.dtype, conv.device
    name = backends.resolve(backend, device)
    # Backends may declare (module attributes) that they read every input through its strides,
    # the initial state included (READS_STRIDES), and that a step with obs_var = inf counts as
    # not observed in their own pass (INF_OBS_VAR_UNOBSERVED); then nothing is materialized or
    # masked here. Python numbers become kept constants, broadcast to [T, N] (no tensor built a
    # call, no host-to-device copy on CUDA), and the default prior's triple is kept too.
    mod = backends.get(name)

    def series(key):
        v = values[key]
        if _args._plain_number(v):
            return _kept_series(float(v), dtype, device, T, N)
        t = conv.tensor(key)
        k = t.ndim
        if k == 0:  # no shape work
            return t.expand(T, N)
        if k > nd or t.shape != shape[nd - k :]:
            _broadcast_check(key, t, shape, "z's shape")
        # Keep broadcast dimensions unmaterialized: [T or 1, N or 1], then an expanded [T, N] view.
        if k == nd - 1:
            t = t.unsqueeze(0)
        elif k < nd:
            t = t.reshape((1,) * (nd - k) + tuple(t.shape))
        if axis:
            t = t.movedim(axis, 0)
        if nd != 2:
            if all(n == 1 for n in t.shape[1:]):
                t = t.reshape(t.shape[0], 1)
            else:
                t = t.expand((t.shape[0],) + lane_shape).reshape(t.shape[0], N)
        return t.expand(T, N)

    obs = series("obs_var")
    a, p, h, c = series("decay"), series("process_var"), series("loading"), series("offset")
    zz = zt if nd == 2 and not axis else (zt.movedim(axis, 0) if axis else zt).reshape(T, N)
    has_init = init is not None
    pm, pv = prior_mean, prior_var
    if not has_init and _args._plain_number(pm) and _args._plain_number(pv):
        x0 = _kept_prior(float(pm), float(pv), dtype, device, N)
    else:
        pr = _prior(conv, has_init, lane_shape)
        if has_init:
            x0 = from_info(compact(pr["init.lam"]), compact(pr["init.eta"]))
        else:
            x0 = from_prior(compact(pr["prior_mean"]), compact(pr["prior_var"]))
        x0 = tuple(x.expand(N) for x in torch.broadcast_tensors(*x0))
        if not getattr(mod, "READS_STRIDES", False):
            x0 = tuple(x.contiguous() for x in x0)
    # z alone marks the steps not observed
    if not getattr(mod, "INF_OBS_VAR_UNOBSERVED", False):
        oc = compact(obs)
        if bool(torch.isinf(oc).any()):
            zz = zz.masked_fill(torch.isinf(oc), float("nan"))
    return _Prepared(conv, axis, shape, lane_shape, zt, zz, obs, a, p, h, c, x0, has_init, name,
                     mod)  # fmt: skip


def _prior(conv, has_init: bool, lane_shape: tuple) -> dict:
    """The initial state's inputs as ``[N]`` tensors: ``init.lam, init.eta`` or ``prior_var,
    prior_mean``."""
    keys = ("init.lam", "init.eta") if has_init else ("prior_var", "prior_mean")
    N = math.prod(lane_shape)
    out = {}
    for key in keys:
        v = conv.values[key]
        if _args._plain_number(v):
            t = _device_constant(float(v), conv.dtype, conv.device)
        else:
            t = conv.tensor(key)
        _broadcast_check(key, t, lane_shape, "the lane shape (z without its time axis)")
        out[key] = t.expand(lane_shape).reshape(N)
    return out


def _broadcast_check(name, t, shape, target_desc):
    """Raise unless ``t`` broadcasts to ``shape`` (numpy rules; the message of
    :func:`kalmanscan.core._args.broadcast_to`), with plain integer comparisons."""
    ts = t.shape
    if len(ts) > len(shape) or any(
        n != 1 and n != m for n, m in zip(reversed(ts), reversed(shape), strict=False)
    ):
        _args.broadcast_to(name, t, shape, target_desc)


_CONSTANTS: dict = {}


def _device_constant(value: float, dtype, device) -> torch.Tensor:
    """A kept 0-d tensor holding ``value`` (read-only by convention: nothing writes inputs)."""
    key = (value, dtype, device)
    t = _CONSTANTS.get(key)
    if t is None:
        _trim()
        t = _CONSTANTS[key] = torch.tensor(value, dtype=dtype, device=device)
    return t


def _device_prior(mean: float, var: float, dtype, device):
    """The kept triple of the prior ``N(mean, var)`` for Python numbers (:func:`from_prior`)."""
    key = ("prior", mean, var, dtype, device)
    x0 = _CONSTANTS.get(key)
    if x0 is None:
        m = _device_constant(mean, dtype, device)
        x0 = _CONSTANTS[key] = from_prior(m, _device_constant(var, dtype, device))
    return x0


def _kept_prior(mean: float, var: float, dtype, device, N: int):
    """:func:`_device_prior` broadcast to ``N`` lanes (kept: read-only views)."""
    key = ("prior", mean, var, dtype, device, N)
    x0 = _CONSTANTS.get(key)
    if x0 is None:
        _trim()
        u, e, v = _device_prior(mean, var, dtype, device)
        x0 = _CONSTANTS[key] = (u.expand(N), e.expand(N), v.expand(N))
    return x0


def _kept_series(value: float, dtype, device, T: int, N: int) -> torch.Tensor:
    """The kept constant ``value`` as an expanded ``[T, N]`` view (read-only)."""
    key = (value, dtype, device, T, N)
    t = _CONSTANTS.get(key)
    if t is None:
        _trim()
        t = _CONSTANTS[key] = _device_constant(value, dtype, device).expand(T, N)
    return t


def _trim():
    if len(_CONSTANTS) > 256:
        _CONSTANTS.clear()


def _number(prep: _Prepared, name: str):
    """The input ``name`` as a Python float when the caller passed a plain number, else None."""
    v = prep.conv.values.get(name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _numbers_ok(prep: _Prepared) -> bool | None:
    """The checks of :func:`_values_ok` on the host when every model input is a plain number
    (the common call): no tensor work at all. None when some input is an array."""
    keys = ("obs_var", "decay", "process_var", "loading", "offset")
    keys += ("init.lam", "init.eta") if prep.has_init else ("prior_var", "prior_mean")
    vals = {k: _number(prep, k) for k in keys}
    if any(v is None for v in vals.values()):
        return None
    big = torch.finfo(prep.z.dtype).max
    fin = lambda x: math.isfinite(x) and abs(x) <= big  # noqa: E731 - representable, finite
    R, h = vals["obs_var"], vals["loading"]
    ok = (R > 0 and (R == math.inf or (fin(R) and fin(1 / R) and fin(h * h / R)))) and all(
        fin(vals[k]) for k in ("decay", "offset")
    )
    ok = ok and fin(h) and fin(vals["process_var"]) and vals["process_var"] >= 0
    tiny = torch.finfo(prep.z.dtype).tiny
    ok = ok and (h == 0 or (h * h >= tiny and (R == math.inf or h * h >= tiny * R)))
    if prep.has_init:
        lam, eta = vals["init.lam"], vals["init.eta"]
        return ok and fin(lam) and lam >= 0 and fin(eta) and not (lam == 0 and eta != 0)
    P = vals["prior_var"]
    return ok and P >= 0 and (P == math.inf or fin(P)) and fin(vals["prior_mean"])


def _tiny_information(hc, oc):
    """Where ``loading != 0`` but ``loading**2`` or ``loading**2 / obs_var`` (``obs_var``
    finite) is below the dtype's normal range (the kernels' rule: ``h*h >= tiny``,
    ``h*h >= tiny * R``; they flag it for :func:`_validate` to decide). Such an observation is
    computed exactly (:func:`_observation_scale`), except where it is refused
    (:func:`_refused_information`); docs/reliability.md."""
    tiny = torch.finfo(hc.dtype).tiny
    hh = hc * hc
    small = (hh < tiny) | ((hh < tiny * oc) & torch.isfinite(oc))
    return (hc != 0) & small


def _observation_scale(hc, oc):
    """``(s, k)``, ``s = 2**k`` over the compact loading and obs_var grid: where ``loading != 0``,
    ``loading**2`` is below the normal range and ``obs_var`` is finite, ``|s loading|`` in
    ``[1, 2)`` (capped where ``s**2 obs_var`` would pass ``finfo.max / 4``); 1 elsewhere.

    The observation ``(s z, s**2 obs_var, s loading)`` is the same one: the precision
    ``loading**2 / obs_var`` and information ``loading z / obs_var`` it adds are unchanged and its
    density is divided by ``s`` (exactly: ``s`` is a power of two), so a backend computes it
    without the underflow of ``loading**2`` (the predictive variance ``h^2 var + R`` otherwise
    loses digits where both terms are below the normal range)."""
    h, R = torch.broadcast_tensors(hc.detach(), oc.detach())
    finite = torch.isfinite(R)
    need = (h != 0) & (h * h < torch.finfo(h.dtype).tiny) & finite
    _, eh = torch.frexp(h)  # |h| in [2^(eh-1), 2^eh)
    _, eR = torch.frexp(torch.where(finite, R, 1.0))
    emax = math.frexp(torch.finfo(h.dtype).max)[1]  # finfo.max < 2^emax
    k = torch.where(need, torch.minimum(1 - eh, (emax - 2 - eR) // 2).clamp(min=0), 0)
    return torch.ldexp(torch.ones_like(h), k), k


def _first_informative(prep: _Prepared):
    """``(t_star, diffuse)`` per lane: the first step observed (``z`` not NaN, ``obs_var``
    finite) with ``loading != 0``, and whether the lane's belief is diffuse when that step
    predicts (a diffuse start and no ``decay == 0`` at or before it; False without such a
    step). A nonzero decay keeps a diffuse past, also where its square underflows."""
    z = prep.z
    T, N = z.shape
    h = prep.loading.expand(T, N)
    informative = ~torch.isnan(z) & torch.isfinite(prep.obs_var.expand(T, N)) & (h != 0)
    forget = prep.decay.expand(T, N) == 0
    has = informative.any(0)
    t_star = torch.argmax(informative.to(torch.int8), 0)
    first_forget = torch.where(forget.any(0), torch.argmax(forget.to(torch.int8), 0), T)
    return t_star, (prep.x0[0] == 0) & has & (first_forget > t_star)


def _refused_information(prep: _Prepared):
    """The first (time, lane) where a diffuse lane's first informative observation adds a
    precision ``loading**2 / obs_var`` below the normal range, or None. The lane's precision
    after it is that number, which no float of the dtype holds (a subnormal keeps a few digits,
    0 leaves the lane diffuse), and with it its mean ``z / loading``; everywhere else such an
    observation adds less than the rounding of the belief's precision (docs/reliability.md)."""
    t_star, diffuse = _first_informative(prep)
    if not bool(diffuse.any()):
        return None
    T, N = prep.z.shape
    hc, oc = compact(prep.loading).detach(), compact(prep.obs_var).detach()
    s, _ = _observation_scale(hc, oc)
    phi = (hc * s) ** 2 / (oc * s * s)  # loading**2 / obs_var without the underflow of loading**2
    small = (phi < torch.finfo(phi.dtype).tiny).expand(T, N)
    at = torch.zeros(T, N, dtype=torch.bool, device=small.device)
    lanes = torch.arange(N, device=small.device)
    at[t_star[diffuse], lanes[diffuse]] = True
    return _args.first_bad(small & at)


def _rescaled(prep: _Prepared):
    """The six ``[T, N]`` model inputs with every tiny loading's observation rescaled
    (:func:`_observation_scale`), and the per-lane log-likelihood to add back (float64): the
    sum of ``log s`` over the steps that add a term (observed, but not at a diffuse lane's first
    informative step)."""
    z = prep.z
    T, N = z.shape
    hc, oc = compact(prep.loading), compact(prep.obs_var)
    s, k = _observation_scale(hc, oc)
    ins = (z * s, (oc * s * s).expand(T, N), prep.decay, prep.process_var,
           (hc * s).expand(T, N), prep.offset)  # fmt: skip
    return ins, _log_scale_shift(prep, oc, k)


def _log_scale_shift(prep: _Prepared, oc, k):
    """The per-lane log-likelihood to add back (float64) where observations were rescaled by
    ``s = 2**k`` (``k`` over the compact grid or ``[T, N]``; ``oc`` the compact obs_var): the
    sum of ``k log 2`` over the steps that add a term (observed, but not at a diffuse lane's
    first informative step), each density having been divided by ``s``."""
    z = prep.z
    T, N = z.shape
    t_star, diffuse = _first_informative(prep)
    terms = (~torch.isnan(z) & torch.isfinite(oc).expand(T, N)) & (k != 0).expand(T, N)
    lanes = torch.arange(N, device=z.device)
    terms[t_star[diffuse], lanes[diffuse]] = False
    return torch.where(terms, k.expand(T, N), 0).sum(0, dtype=torch.float64) * math.log(2.0)


@functools.cache
def _tiny_below(dtype) -> int:
    """``log2`` of the smallest product of two variances :func:`_tiny_lanes` lets a lane keep
    its units at: the normal range's exponent plus the mantissa's bits and 12 (2^-957 ~ 1e-288 in
    float64, 2^-89 ~ 1.6e-27 in float32): its digits hold with room for a variance thousands of
    times below an observation's."""
    fi = torch.finfo(dtype)
    return math.frexp(fi.tiny)[1] + (-math.frexp(fi.eps)[1] + 1) + 12


def _plain_tiny(R, h, p, dtype) -> bool:
    """:func:`_tiny_lanes`'s test on plain numbers (the host, no tensor work)."""
    if h == 0 or not 0 < R < math.inf or not 0 <= p < math.inf:
        return False
    if R < 1 / torch.finfo(dtype).max:  # refused (its reciprocal is not finite)
        return False
    below = _tiny_below(dtype)
    scale = math.log2(R) - 2 * math.log2(abs(h))  # log2 (R / h^2)
    lp = math.log2(p) if p > 0 else -math.inf
    m = min(max(lp, scale), 0.0)  # log2 of the update's variance factor
    return (m < -32 and math.log2(R) + m < below) or (p > 0 and lp + scale < below)


def _np_compact(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy view with its broadcast (stride-0) axes cut to length 1
    (:func:`kalmanscan.core.steps.compact` in numpy: slicing there is far cheaper than torch's)."""
    x = x.detach()
    if x.device.type != "cpu":  # (plain-number parameters on a GPU: compact, then read back)
        x = x[tuple(slice(0, 1) if st == 0 else slice(None) for st in x.stride())].cpu()
    a = x.numpy()
    return a[tuple(slice(0, 1) if st == 0 else slice(None) for st in a.strides)]


def _caller_array(prep: _Prepared, key: str):
    """The input ``key`` as the caller gave it, as a float or a float numpy array (a CPU tensor
    viewed), or None (no tensor work)."""
    v = prep.conv.values.get(key)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, torch.Tensor):
        # (numpy views only these: a bfloat16 or negated view is judged on the grid instead)
        if v.device.type != "cpu" or v.dtype not in (torch.float32, torch.float64) or v.is_neg():
            return None
        v = v.detach().numpy()
    if not isinstance(v, np.ndarray) or v.size == 0 or v.dtype.kind != "f":
        return None
    return v


def _no_tiny_products(prep: _Prepared, below: int) -> bool:
    """A bound from the inputs' extremes (a few reductions of the caller's arrays): True where no
    product :func:`_tiny_lanes` tests can fall below ``2**below``, so the common call skips it."""
    R, h, p = (_caller_array(prep, k) for k in ("obs_var", "loading", "process_var"))
    if R is None or h is None or p is None:
        return False
    r_lo = R if isinstance(R, float) else float(R.min())
    h_hi = abs(h) if isinstance(h, float) else float(np.abs(h).max())
    p_lo = p if isinstance(p, float) else float(p.min())
    return extremes_clear(r_lo, h_hi, p_lo, below)


def extremes_clear(r_lo: float, h_hi: float, p_lo: float, below: int) -> bool:
    """:func:`_no_tiny_products`'s bound from the smallest ``obs_var``, the largest ``|loading|``
    and the smallest ``process_var`` (also the fit's lean call's, timeseries/fit.py)."""
    if not (0 < r_lo < math.inf and 0 < h_hi < math.inf and 0 < p_lo < math.inf):
        return False
    sc_lo = math.log2(r_lo) - 2 * math.log2(h_hi)
    return min(math.log2(r_lo) + min(sc_lo, 0.0), math.log2(p_lo) + sc_lo) >= below


def tiny_grid(Rc, hc, pc, T: int, N: int, dtype):
    """:func:`_tiny_lanes`'s test on the compact numpy grids of ``obs_var``, ``loading`` and
    ``process_var`` (broadcasting to ``[T, N]``): ``(need [N], ok, scale, lp)``, ``need`` the
    lanes where a product falls below ``2**_tiny_below(dtype)``, the others the logs the unit
    is chosen from (also the fit's lean call's, timeseries/fit.py)."""
    below = _tiny_below(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # (an obs_var whose reciprocal is not finite is refused: left to the checks)
        ok = (hc != 0) & np.isfinite(Rc) & (Rc >= 1 / torch.finfo(dtype).max)
        lr = np.log2(np.where(ok, Rc, 1.0))
        scale = np.where(ok, lr - 2 * np.log2(np.where(ok, np.abs(hc), 1.0)), np.inf)
        pos = (pc > 0) & np.isfinite(pc)
        lp = np.where(pos, np.log2(np.where(pos, pc, 1.0)), -np.inf)
        m = np.minimum(np.maximum(lp, scale), 0.0)  # log2 of the update's variance factor
        key = np.where(m < -32, lr + m, np.inf)
        key = np.where(ok, np.minimum(key, np.where(pos, lp + scale, np.inf)), np.inf)
        need = np.broadcast_to(key, (T, N)).min(0) < below
    return need, ok, scale, lp


def _tiny_lanes(prep: _Prepared, ins):
    """The lanes whose variances are all tiny, carried in smaller units: ``None``, or ``(c, ks)``.

    The filter's products pair variances: the update forms ``obs_var`` times the normalized
    predicted variance (about ``min(max(process_var, obs_var / h**2), 1)``), the scan's leaf
    ``process_var / phi = process_var obs_var / h**2``. Where both are tiny they underflow though
    the beliefs are ordinary numbers: with ``obs_var = process_var = 1e-200`` on data of scale
    1e-100 the variance came out 0 and the means and log-likelihood wrong in every backend (1e-5
    off at 1e-160; float32 from variances of ~1e-20). A lane where either product falls below
    ``2**_tiny_below`` (the update's only where its variance factor is below ``2**-32``: with a
    factor near 1 the product is ``obs_var`` itself, exact) takes a state unit ``c`` (``c**2``
    the larger of its smallest ``obs_var / h**2`` and its largest ``process_var``, to a power of
    four, where that is below 1; lowered where a huge ``process_var`` would leave the product
    of the lane's smallest filtered and backward variances below the range, as far as
    ``process_var / c**2`` and its product with the data's scale stay within ``2**-below``;
    raised where a proper prior's variance over ``c**2`` would
    pass the range, as far as the products stay representable: ``x = c x'``, so ``loading c``,
    ``process_var / c**2``, ``offset / c``, the prior's mean ``/ c`` and variance ``/ c**2``)
    and its observations a
    unit ``s = 2**ks`` (``s**2 obs_var`` in ``[1, 4)``: ``(s z, s**2 obs_var, s h)``, the
    density divided by ``s``; capped where ``s z`` would pass the range). Both are powers of
    two, so every value and gradient is the same model's, exactly; outputs are mapped back
    (:func:`_from_unit`) and ``log s`` added back to the log-likelihood. Plain numbers are
    judged on the host; arrays on the CPU from their extremes (:func:`_no_tiny_products`), then
    where those do not settle it from their compact grid; arrays on a GPU are not (the
    readback would cost a host synchronization a call: docs/reliability.md)."""
    z, R, a, pv, h, off = ins
    dtype = z.dtype
    given = R is prep.obs_var and h is prep.loading  # (not rescaled for a tiny loading)
    Rn, hn, pn = (_number(prep, k) for k in ("obs_var", "loading", "process_var"))
    if given and None not in (Rn, hn, pn):
        if not _plain_tiny(Rn, hn, pn, dtype):
            return None
    elif z.device.type != "cpu":
        return None
    below = _tiny_below(dtype)
    T, N = z.shape
    # the test in numpy on the compact grid (a view of CPU memory; a few us, where torch's ops
    # on such small tensors cost several times more a call: fit_ou makes one a Newton step)
    if given and _no_tiny_products(prep, below):
        return None
    Rc, hc, pc = (_np_compact(x) for x in (R, h, pv))
    need, ok, scale, lp = tiny_grid(Rc, hc, pc, T, N, dtype)
    if not need.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pos = (pc > 0) & np.isfinite(pc)
        smin = np.broadcast_to(scale, (T, N)).min(0)
        pmax = np.broadcast_to(lp, (T, N)).max(0)
        lc2 = np.maximum(smin, pmax)
        # where a huge process_var sets that unit, the other variances fall to the bottom of
        # the range, and the smoother's product of a filtered and a backward variance
        # (about 2**(smin + qmin) in the user's units) underflowed: 3e14 with obs_var 1e-287
        # gave the smoothed mean and variance 0 on every backend. There c**2 is lowered to
        # put that product at 2**below, as far as the largest process_var over c**2, and that
        # times the data's scale z/h over c (the scan's leaves hold h z p / max(R, h**2)),
        # stay within 2**-below (as the prior's, below)
        qmin = np.broadcast_to(np.where(ok, np.maximum(lp, scale), np.inf), (T, N)).min(0)
        low = smin + qmin - 2 * lc2 < math.log2(torch.finfo(dtype).tiny) + 12
        # (the data's largest |z/h| a lane, on z's device: one [N] read back, on this path only)
        hz = h.detach()
        zh = (z.detach() / torch.where(hz != 0, hz, 1.0)).abs()
        zh = torch.where(torch.isfinite(zh) & (hz != 0), zh, 0.0)
        lm = np.log2(zh.amax(0).cpu().numpy() if T else np.zeros(N))
        top = np.maximum(pmax + below, (pmax + lm + below) / 1.5)
        lc2 = np.where(low, np.maximum(np.minimum(lc2, (smin + qmin - below) / 2), top), lc2)
        lc2 = np.minimum(lc2, 0.0)
        # a proper prior far wider than the lane's variances (a vague 1e10 on data of scale
        # 1e-100): its variance over c**2 passes the range, and its precision there underflows.
        # Take c**2 no smaller than 2**below of it, as far as the products keep 2**below.
        u0, v0 = (_np_compact(x.detach()).ravel() for x in (prep.x0[0], prep.x0[2]))
        proper = (u0 > 0) & np.isfinite(u0) & (v0 > 0) & np.isfinite(v0)
        lv0, lu0 = (np.log2(np.where(proper, x, 1.0)) for x in (v0, u0))
        lprior = np.where(proper, lv0 - lu0, -np.inf)
        keep = np.minimum(
            qmin - below,
            (np.broadcast_to(np.where(ok & pos, lp + scale, np.inf), (T, N)).min(0) - below) / 2,
        )
        lc2 = np.maximum(lc2, np.minimum(np.minimum(lprior + below, keep), 0.0))
    kc = np.where(need & np.isfinite(lc2), np.floor(lc2 / 2), 0.0).astype(np.int32)
    c = torch.ldexp(torch.ones(N, dtype=dtype, device=z.device), torch.from_numpy(kc))
    with torch.no_grad():
        Rt = compact(R).detach()
        okt = torch.from_numpy(np.ascontiguousarray(ok))
        _, eR = torch.frexp(torch.where(okt, Rt, 1.0))  # R in [2^(eR-1), 2^eR)
        ks = torch.where(okt & (Rt < 1), (1 - eR) // 2, 0).expand(T, N)
        _, ez = torch.frexp(torch.where(torch.isfinite(z), z, 1.0).detach())
        emax = math.frexp(torch.finfo(dtype).max)[1]
        ks = torch.minimum(ks, (emax - 2 - ez).clamp(min=0))
        ks = torch.where(torch.from_numpy(need), ks, 0)
    return c, ks


def _in_units(prep: _Prepared, ins, x0, c, ks):
    """The model inputs and initial triple in the units of :func:`_tiny_lanes`, and the
    log-likelihood to add back per lane (``sum log s`` over the steps that add a term)."""
    z, R, a, pv, h, off = ins
    T, N = z.shape
    s = torch.ldexp(torch.ones_like(z), ks)
    ins = (z * s, R * (s * s), a, (compact(pv) / (c * c)).expand(T, N), h * s * c,
           (compact(off) / c).expand(T, N))  # fmt: skip
    u, e, v = x0
    # (v <= 1 and 1/c^2 <= 2^(2/3 emax): finite)
    return ins, normalize(u, e / c, v / (c * c)), _log_scale_shift(prep, compact(R), ks)


_UNIT_POWERS = {"mean": 1, "pred_mean": 1, "smooth_mean": 1, "var": 2, "pred_var": 2,
                "smooth_var": 2, "precision": -2, "pred_precision": -2, "info": -1}  # fmt: skip


def _from_unit(out: dict, c) -> dict:
    """The backend's outputs in the user's units (the state was carried in the unit ``c``)."""
    out = dict(out)
    for key, power in _UNIT_POWERS.items():
        if key in out:
            out[key] = out[key] * torch.pow(c, power)
    if "final" in out:  # the triple (u, e, v): mean e/u, variance v/u
        u, e, v = out["final"]
        out["final"] = (u, e * c, v * (c * c))
    return out


def _plain_tiny_loading(prep: _Prepared) -> bool:
    """Whether loading and obs_var are plain numbers with ``loading**2`` below the normal range
    (so the observations are rescaled before the backend runs, with no readback)."""
    h, R = _number(prep, "loading"), _number(prep, "obs_var")
    tiny = torch.finfo(prep.z.dtype).tiny
    return h is not None and R is not None and h != 0 and h * h < tiny and R < math.inf


def _values_ok(prep: _Prepared) -> bool:
    """Whether every range :func:`_validate` checks holds, from one small readback
    (:func:`kalmanscan.core._args.ranges_ok`) on the compact (unbroadcast) inputs, or on the
    host when every model input is a plain number."""
    host = _numbers_ok(prep)
    if host is not None:
        return host
    oc, hc = compact(prep.obs_var), compact(prep.loading)
    unobserved = torch.isinf(oc) & (oc > 0)
    of = torch.where(unobserved, 1.0, oc)
    specs = [
        (of, 0.0, True),
        (compact(prep.decay), None, False),
        (compact(prep.process_var), 0.0, False),
        (hc, None, False),
        (compact(prep.offset), None, False),
    ]
    pr = _prior(prep.conv, prep.has_init, prep.lane_shape)
    if prep.has_init:
        lam0, eta0 = compact(pr["init.lam"]), compact(pr["init.eta"])
        specs += [(lam0, 0.0, False), (eta0, None, False)]
        flags = [((lam0 == 0) & (eta0 != 0)).any()]
    else:
        pv = compact(pr["prior_var"])
        specs += [(torch.where(torch.isinf(pv) & (pv > 0), 1.0, pv), 0.0, False)]
        specs += [(compact(pr["prior_mean"]), None, False)]
        flags = []
    flags += [torch.isinf(of.reciprocal()).any(), (~torch.isfinite(hc * hc / of)).any()]
    flags += [_tiny_information(hc, oc).any()]
    return _args.ranges_ok(specs, flags)


def _validate(prep: _Prepared, check_z: bool) -> bool:
    """Raise the error that names the first invalid input value, if any; else return whether
    some observation's loading is to be rescaled (:func:`_observation_scale`)."""
    if not check_z and _values_ok(prep):
        return False
    prep.conv.check_rounding()  # (a tensor value its cast made NaN: say what it was)
    if check_z:
        _args.check_range("z", prep.z_in, allow_nan=True, what=_EXPECT["z"])
    specs = {
        "obs_var": dict(lo=0.0, lo_open=True, allow_inf=True),
        "decay": {},
        "process_var": dict(lo=0.0),
        "loading": {},
        "offset": {},
    }
    for name, kw in specs.items():  # on the inputs as given, so indices are the user's
        _args.check_range(name, prep.conv.tensor(name), what=_EXPECT.get(name), **kw)
    dtype = prep.z.dtype
    oc, hc = compact(prep.obs_var), compact(prep.loading)
    bad = _args.first_bad(torch.isinf(oc.reciprocal()))
    if bad is not None:
        raise ValueError(
            f"obs_var: expected values whose reciprocal is finite in {dtype} "
            f"(>= {1 / torch.finfo(dtype).max:.3g}), got {oc[bad].item()!r} at index {bad}"
        )
    info = hc * hc / oc  # information an observation adds: must be representable
    bad = _args.first_bad(torch.isinf(info) & torch.isfinite(oc))
    if bad is not None:
        o, l = oc.expand_as(info)[bad].item(), hc.expand_as(info)[bad].item()
        raise ValueError(
            f"loading: expected loading**2 / obs_var finite in {dtype}, got loading={l!r} "
            f"with obs_var={o!r} at (time, lane) {bad} (of the broadcast [time, lane] grid)"
        )
    rescale = False
    if bool(_tiny_information(hc, oc).any()):
        bad = _refused_information(prep)
        if bad is not None:
            T, N = prep.z.shape
            o = oc.expand(T, N)[bad].item()
            l = hc.expand(T, N)[bad].item()
            t = torch.finfo(dtype).tiny
            raise ValueError(
                f"loading: expected loading**2 / obs_var at least {t:.4g} (the smallest normal "
                f"{dtype}) at a diffuse lane's first informative observation (the lane's "
                f"precision after it, which the dtype cannot hold below that, and its mean "
                f"z/loading with it; rescale the state, or give a proper prior), got "
                f"loading={l!r} with obs_var={o!r} at (time, lane) {bad} (of the broadcast "
                f"[time, lane] grid)"
            )
        rescale = bool((_observation_scale(hc, oc)[1] != 0).any())
    pr = _prior(prep.conv, prep.has_init, prep.lane_shape)
    if prep.has_init:
        _args.check_range(
            "init.lam", prep.conv.tensor("init.lam"), lo=0.0, what=_EXPECT["init.lam"]
        )
        _args.check_range("init.eta", prep.conv.tensor("init.eta"), what="finite values")
        lam0, eta0 = compact(pr["init.lam"]), compact(pr["init.eta"])
        bad = _args.first_bad((lam0 == 0) & (eta0 != 0))
        if bad is not None:
            raise ValueError(
                "init.eta: expected 0 where init.lam is 0 (no information), "
                f"got {eta0.expand_as(lam0)[bad].item()!r} at lane {bad}"
            )
    else:
        _args.check_range(
            "prior_var", prep.conv.tensor("prior_var"), lo=0.0, allow_inf=True,
            what=_EXPECT["prior_var"],
        )  # fmt: skip
        _args.check_range("prior_mean", prep.conv.tensor("prior_mean"), what="finite values")
    return rescale


_EXPECT = {
    "z": "finite values or NaN (missing)",
    "obs_var": "values > 0 (inf marks a step as not observed)",
    "process_var": "values >= 0 and finite",
    "prior_var": "values >= 0 (inf: diffuse prior; 0: known exactly)",
    "init.lam": "values >= 0 and finite",
}


def _run(prep: _Prepared, kind: str = "filter", rescale: bool = False) -> dict:
    """Run the backend: ``kind`` is ``"filter"`` (every output), ``"loglik"`` or ``"smooth"``;
    ``rescale``: with the observations of tiny loadings rescaled (:func:`_rescaled`; also
    where the API's own checks or plain numbers show them). The result's ``flags`` are read by
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
    x0, tiny = p.x0, _tiny_lanes(prep, ins)
    if tiny is not None:
        ins, x0, more = _in_units(prep, ins, x0, *tiny)
        shift = more if shift is None else shift + more
    if kind == "smooth":
        out = mod.smooth_lanes(*ins, x0)
    else:
        out = mod.filter_lanes(*ins, x0, outputs="loglik" if kind == "loglik" else "all")
    if tiny is not None:
        out = _from_unit(out, tiny[0])
    if shift is not None:
        out = dict(out, loglik=out["loglik"] + shift.to(out["loglik"].dtype), rescaled=rescale)
    return out


# flag bit of a backend that checks its inputs (docs/backend-contract.md): an input out of its
# range, or a tiny loading's information (for _validate to decide)
_BAD_INPUT = 4
# flag bit of every backend: a lane's log-likelihood is NaN by design, a predicted precision
# below the dtype's normal range (steps.lost_steps; docs/reliability.md, limit 5)
_LL_LOST = 8


def _check(prep: _Prepared, out: dict) -> bool:
    """Raise if the backend flagged a value: the ``ValueError`` naming the bad input, else an
    ``OverflowError``. Returns True where the call is to be run again with tiny loadings'
    observations rescaled (a backend that checks its inputs flagged them)."""
    flags = _read_flags(out)  # the one host synchronization of a call
    lost, flags = flags & _LL_LOST, flags & ~_LL_LOST
    if not flags:
        if lost:  # (after the checks: no warning before an error, or before a call run again)
            _warn_lost(prep, out)
        return False
    rescale = _validate(prep, check_z=True)  # raises naming the bad input, if one is
    if rescale and not out.get("rescaled"):
        return True
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
    return False  # bit 4 from tiny information, computed exactly


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
        stacklevel=4,
    )


def _read_flags(out: dict) -> int:
    """The backend's flags word as an int (on a device: the call's host synchronization; a
    backend that launched more work behind its flags gives ``read_flags``, which waits for the
    flags only)."""
    read = out.get("read_flags")
    return read() if read is not None else int(out["flags"])


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
    r = _run(prep)
    res = _filter_result(prep, _with_convention(prep, r, loglik_convention))
    if _check(prep, r):
        r = _run(prep, rescale=True)
        res = _filter_result(prep, _with_convention(prep, r, loglik_convention))
        _check(prep, r)
    return res


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
    r = _run(prep, "loglik")
    res = _out_lanes(prep, _with_convention(prep, r, loglik_convention)["loglik"])
    if _check(prep, r):
        r = _run(prep, "loglik", rescale=True)
        res = _out_lanes(prep, _with_convention(prep, r, loglik_convention)["loglik"])
        _check(prep, r)
    return res


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
    out = _run(prep, "smooth")
    res = _smooth_result(prep, out, loglik_convention)
    if _check(prep, out):
        out = _run(prep, "smooth", rescale=True)
        res = _smooth_result(prep, out, loglik_convention)
        _check(prep, out)
    return res
