"""Argument handling of the filter API (:func:`kalmanscan.core.filter.filter`, ``smooth``,
``loglik``): the inputs converted (:class:`kalmanscan.core._args.Converter`) and broadcast to
the ``[T, N]`` grid (time first, lanes flattened; broadcast axes kept as expanded views), the
backend resolved, and the initial state built as a homogeneous triple ``(u, e, v)``, all in
one :class:`_Prepared`. Plain-number inputs become kept device constants (no tensor built a
call). Notation: :mod:`kalmanscan.core.filter`; the value checks:
:mod:`kalmanscan.core.filter_checks`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from kalmanscan.core import _args, backends
from kalmanscan.core.steps import compact, from_info, from_prior


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
    _args.check_dataarray_time_axis(z, axis)
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
