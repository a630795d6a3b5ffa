"""Tiny values computed exactly in the filter API, by powers of two (docs/reliability.md):
observations whose ``loading**2`` is below the dtype's normal range are rescaled
(:func:`_rescaled`), lanes whose variances are all tiny are carried in a smaller state unit
(:func:`_tiny_lanes`, :func:`_in_units`; outputs mapped back by :func:`_from_unit`), and the
log-likelihood gets the shift back to the user's units. Arrays off the host are judged after
the call instead (:func:`_device_screen`, read with the call's flags: no synchronization of its
own). :func:`extremes_clear` and :func:`tiny_grid` are shared with the fit's lean call
(kalmanscan/timeseries/).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from kalmanscan.core.filter_prepare import _number, _Prepared
from kalmanscan.core.steps import compact, normalize


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
    return extremes_clear(r_lo, h_hi, positive_min(p), below)


def positive_min(p) -> float:
    """The smallest finite positive ``process_var`` (``inf`` where there is none): the one
    :func:`tiny_grid` pairs in a product; a step with none (0, as the first step of times
    discretized by :func:`~kalmanscan.discretize_ou`) adds only the ``obs_var`` term, which
    :func:`extremes_clear` bounds on its own. (``p.min()`` was 0 there, and every irregular
    record took the full grid: 0.57 s a fit evaluation at 10^6 steps.)

    >>> positive_min(np.array([0.0, 0.5, 2.0])), positive_min(0.0)
    (0.5, inf)
    """
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.min(p, initial=math.inf, where=(p > 0) & (p < math.inf))
    return float(lo)


def extremes_clear(r_lo: float, h_hi: float, p_lo: float, below: int) -> bool:
    """:func:`_no_tiny_products`'s bound from the smallest ``obs_var``, the largest ``|loading|``
    and the smallest finite positive ``process_var`` (:func:`positive_min`; ``inf``: none),
    also the fit's lean call's (timeseries/objective.py)."""
    if not (0 < r_lo < math.inf and 0 < h_hi < math.inf and 0 < p_lo <= math.inf):
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


def _judged_on_host(z: torch.Tensor) -> bool:
    """Whether :func:`_tiny_lanes` judges a call's arrays (``z`` its data) before the backend
    runs: CPU memory is viewed through numpy (no synchronization); arrays elsewhere are judged
    by :func:`_device_screen` with the call's flags."""
    return z.device.type == "cpu"


def _tiny_lanes(prep: _Prepared, ins, host: bool = False):
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
    where those do not settle it from their compact grid; arrays elsewhere (a GPU) only with
    ``host`` (their compact grid read back): the API runs such a call as given and judges it
    by :func:`_device_screen` with its flags, running it again with ``host`` where the screen
    flags it (docs/reliability.md)."""
    z, R, a, pv, h, off = ins
    dtype = z.dtype
    given = R is prep.obs_var and h is prep.loading  # (not rescaled for a tiny loading)
    Rn, hn, pn = (_number(prep, k) for k in ("obs_var", "loading", "process_var"))
    if given and None not in (Rn, hn, pn):
        if not _plain_tiny(Rn, hn, pn, dtype):
            return None
    elif not host and not _judged_on_host(z):
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
    # c**2 a normal number (a subnormal obs_var, 1e-308, set 2**-1024: the prior's variance
    # over it, and process_var's, inf)
    kc = np.maximum(kc, -((1 - math.frexp(torch.finfo(dtype).tiny)[1]) // 2))
    dev = z.device
    c = torch.ldexp(torch.ones(N, dtype=dtype, device=dev), torch.from_numpy(kc).to(dev))
    with torch.no_grad():
        Rt = compact(R).detach()
        okt = torch.from_numpy(np.ascontiguousarray(ok)).to(dev)
        _, eR = torch.frexp(torch.where(okt, Rt, 1.0))  # R in [2^(eR-1), 2^eR)
        ks = torch.where(okt & (Rt < 1), (1 - eR) // 2, 0).expand(T, N)
        _, ez = torch.frexp(torch.where(torch.isfinite(z), z, 1.0).detach())
        emax = math.frexp(torch.finfo(dtype).max)[1]
        ks = torch.minimum(ks, (emax - 2 - ez).clamp(min=0))
        ks = torch.where(torch.from_numpy(need).to(dev), ks, 0)
    return c, ks


class _Screen:
    """The device screen of one call (:func:`_device_screen`): the extremes that bound
    :func:`_tiny_lanes`'s products, reduced on the device and read with the call's flags."""

    __slots__ = ("ins", "dtype", "known", "vals", "host")

    def read(self, flags, read_flags=None):
        """``(flags as an int, extremes)`` with the call's one synchronization: on CUDA the
        extremes were copied to pinned memory before the backend's launches, so they are there
        once its flags are; elsewhere they are read with a tensor's flags in one read."""
        if read_flags is not None:  # (it waits for the launches before its own, ours too)
            f = read_flags()
            return f, (self.vals if self.host is None else self.host).tolist()
        if isinstance(flags, torch.Tensor):
            if self.host is not None:  # (the scalar read waits for the stream)
                return int(flags), self.host.tolist()
            both = torch.cat([flags.detach().reshape(1).to(self.vals.dtype), self.vals]).tolist()
            return int(both[0]), both[1:]
        return int(flags), self.vals.tolist()  # (a host backend's int: nothing waited for)

    def maybe(self, extremes) -> bool:
        """Whether some lane may have a product of :func:`_tiny_lanes` below the range."""
        got = dict(self.known)
        got.update(zip(_order(self.known), extremes, strict=True))
        if "p_top" in got:  # (the largest of process_var where positive, inf where one is 0)
            got["zero"] = got.pop("p_top") == math.inf
        return screen_tiny(got["r"], got["h"], got["p"], got["zero"], self.dtype)


def _order(known: dict):
    """The extremes :func:`_device_screen` reduced, in its order (those not known on the host)."""
    keys = [k for k in ("r", "h") if k not in known]
    return keys + (["p", "p_top"] if "p" not in known else [])


def screen_tiny(r: float, h: float, p: float, zero: bool, dtype) -> bool:
    """The device screen's bound: whether a product :func:`tiny_grid` tests may fall below
    ``2**_tiny_below(dtype)``, from the smallest ``obs_var`` ``r``, the largest ``|loading|``
    ``h``, the smallest positive ``process_var`` ``p`` (inf where none is) and whether one is
    0. Conservative: each extreme bounds every element's factor, so a lane
    :func:`tiny_grid` flags is flagged; it may flag a call whose extremes sit at different
    elements (then :func:`_tiny_lanes` decides exactly). Half a power of two of margin for
    plain numbers, judged before their rounding to the dtype."""
    if math.isnan(r) or math.isnan(h) or math.isnan(p) or r < 0 or p < 0:
        return True  # (an invalid input: the checks name it; a negative obs_var had no log)
    below = _tiny_below(dtype) + 0.5

    def lg(x):
        return -math.inf if x == 0 else math.log2(x)

    lr = lg(r)
    s = lr - 2 * lg(h)  # lower bound of log2(obs_var / loading**2)
    if math.isnan(s):
        return True
    lp = lg(p)
    m = min(max(-math.inf if zero else lp, s), 0.0)  # lower bound of the update's factor
    return (m < -32 and lr + m < below) or lp + s < below


def _device_screen(prep: _Prepared, ins) -> _Screen | None:
    """The screen of a call whose variances are judged off the host (:func:`_judged_on_host`),
    or None: ``obs_var``'s smallest value, ``|loading|``'s largest and ``process_var``'s
    smallest positive one, reduced on the device (a launch each, three for ``process_var``;
    plain numbers taken on the host) and copied to pinned memory on CUDA before the backend's
    launches. No readback: :meth:`_Screen.read` reads them with the call's flags, and
    :func:`screen_tiny` bounds :func:`_tiny_lanes`'s products from them."""
    z, R, _, pv, h, _ = ins
    given = R is prep.obs_var and h is prep.loading
    Rn, hn, pn = (_number(prep, k) for k in ("obs_var", "loading", "process_var"))
    if (given and None not in (Rn, hn, pn)) or _judged_on_host(z) or z.numel() == 0:
        return None
    known = {}
    if given and Rn is not None:
        known["r"] = Rn
    if given and hn is not None:
        known["h"] = abs(hn)
    if pn is not None:
        known["p"], known["zero"] = (pn if pn > 0 else math.inf), pn == 0
    order = _order(known)
    vals = torch.empty(len(order), dtype=z.dtype, device=z.device)
    with torch.no_grad():
        i = 0
        if "r" in order:
            torch.amin(compact(R).detach(), out=vals[i])
            i += 1
        if "h" in order:
            torch.linalg.vector_norm(compact(h).detach(), math.inf, out=vals[i])
            i += 1
        if "p" in order:  # (the smallest positive one; the largest is inf where one is 0)
            pc = compact(pv).detach()
            torch.aminmax(torch.where(pc > 0, pc, math.inf), out=(vals[i], vals[i + 1]))
    screen = _Screen()
    screen.ins, screen.dtype, screen.known, screen.vals = ins, z.dtype, known, vals
    screen.host = None
    if vals.is_cuda:
        screen.host = torch.empty(vals.shape, dtype=vals.dtype, pin_memory=True)
        screen.host.copy_(vals, non_blocking=True)
    return screen


def _in_units(prep: _Prepared, ins, x0, c, ks):
    """The model inputs and initial triple in the units of :func:`_tiny_lanes`, and the
    log-likelihood to add back per lane (``sum log s`` over the steps that add a term)."""
    z, R, a, pv, h, off = ins
    T, N = z.shape
    s = torch.ldexp(torch.ones_like(z), ks)
    # (R s first: s * s passes the range where obs_var is subnormal, 2**1024 at 1e-308)
    ins = (z * s, R * s * s, a, (compact(pv) / (c * c)).expand(T, N), h * s * c,
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
