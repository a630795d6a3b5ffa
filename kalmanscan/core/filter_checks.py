"""Value checks of the filter API's inputs (a :class:`~kalmanscan.core.filter_prepare._Prepared`):
:func:`_values_ok` says from one small readback (or host arithmetic, for plain numbers) whether
every range holds; :func:`_validate` raises the ``ValueError`` that names the first bad input
with the user's indices, and tells whether observations with a tiny loading are to be rescaled
(refusing the one case no float holds: docs/reliability.md).
"""

from __future__ import annotations

import math

import torch

from kalmanscan.core import _args
from kalmanscan.core.filter_prepare import _number, _Prepared, _prior
from kalmanscan.core.filter_units import _first_informative, _observation_scale
from kalmanscan.core.steps import compact


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
