"""Fused Triton kernels of the scalar filter: the ``"triton"`` backend of ``kalmanscan.filter``,
``kalmanscan.smooth`` and ``kalmanscan.loglik`` (docs/backend-contract.md)::

    filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all") -> dict
    smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0) -> dict

Inputs ``[T, N]`` (any strides, stride-0 views read as such, never materialized), ``x0 = (u0,
e0, v0)`` three ``[N]``; every output in the projective representation's moments (kernels.py).
Every output is written in the pass that computes it; no host synchronization: ``flags`` is a
0-d int32 tensor on the device (bits in kernels.py, ``4`` included: the kernels check the
inputs' ranges, ``CHECKS_INPUTS``), read by the caller once.

Two regimes, one set of kernels (chosen from the shape):

- many lanes (``N >= 16384``): one thread walks a lane through all of time, the state in
  registers; loads software-pipelined (``tl.range(num_stages=NS)``); inputs constant in time
  read once. One launch (plus the flags' fill).
- few long lanes: time is cut into chunks. Pass 1 composes each chunk's steps into one map on
  ``(u, v | e)`` (and the smoother's backward map), a carry kernel walks the maps to each chunk's
  true start (a chunk holding a decay whose square is below the normal range step by step,
  which its map cannot carry), pass 2 reruns every chunk from there writing the outputs; the
  log-likelihood's per-chunk float64 sums are added in chunk order by a last small kernel.

The smoother adds one reverse pass (the backward information filter, combined with the filtered
state at each step). Gradients: ``outputs="loglik"`` has the fused adjoint (adjoint.py);
``outputs="all"`` and the smoother differentiate the torch backend at the same inputs.
"""

from __future__ import annotations

import torch

from kalmanscan.cuda._common import (
    cdiv,
    empty,
    interpreting,
    lanes_config,
    launch_site,
    next_pow2,
)
from kalmanscan.cuda.filter.adjoint import adjoint_carry_kernel, adjoint_kernel
from kalmanscan.cuda.filter.kernels import carry_kernel, filter_kernel, smooth_kernel

__all__ = ["CHECKS_INPUTS", "filter_lanes", "smooth_lanes"]

# The kernels check the inputs' ranges themselves (flag bit 4), so the API may skip its own pass;
# they read every input (the initial state included) through its strides, and count a step with
# obs_var = inf as not observed, so the API need not materialize nor mask anything.
CHECKS_INPUTS = True
READS_STRIDES = True
INF_OBS_VAR_UNOBSERVED = True

# Lane-steps of parallel work the chunked regime aims for, and the lane count from which one
# thread per lane over all of time already fills the GPU.
_TARGET_WORK = 65536
_MANY_LANES = 16384
# NS: pipeline stages of the per-step loads; NS_CARRY: those of the smoother's backward carry,
# which walks its chunk maps one after the other, bound by the loads' latency; CK: checkpoint
# interval of the adjoint (chunk lengths are multiples of it); the forward's and the adjoint's
# carries scan tiles of CARRY_TILE / ADJ_CARRY_TILE chunks by CARRY_LANES lanes
TUNING = {
    "NS": 8,
    "NS_CARRY": 8,
    "CK": 16,
    "CARRY_TILE": 64,
    "ADJ_CARRY_TILE": 32,
    "CARRY_LANES": 16,
}

SERIES = ("mean", "var", "precision", "info", "pred_mean", "pred_var", "pred_precision")

_PLANS = {}


def _plan(T: int, N: int):
    """``(CH, NC, CK, BLOCK, num_warps)``: chunk length and count, checkpoint interval, tile."""
    key = (T, N, _MANY_LANES, _TARGET_WORK, tuple(TUNING.items()), interpreting())
    plan = _PLANS.get(key)
    if plan is None:
        CK = 4 if interpreting() else TUNING["CK"]
        block, warps = lanes_config(N)
        if N >= _MANY_LANES:
            NC = 1
        else:
            NC = max(1, min(cdiv(T, 4 * CK), cdiv(_TARGET_WORK, N)))
        CH = cdiv(cdiv(T, NC), CK) * CK
        NC = cdiv(T, CH)
        plan = (CH, NC, CK, block, warps)
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _compact(x):
    """``x`` ``[T, N]`` as its compact tensor (size 1 along stride-0 dimensions): the kernels
    read it through strides and its gradient comes back in that shape. A compact tensor that
    is its base's whole contiguous memory (a ``[N]`` parameter, a kept constant) is a plain
    view of the base, whose gradient is a reshape; else, where ``x`` needs a gradient, a view
    of ``x``'s base, so autograd never materializes the broadcast."""
    T, N = x.shape
    st, sn = x.stride()
    ct = T if (st != 0 or T == 1) else 1
    cn = N if (sn != 0 or N == 1) else 1
    if ct == T and cn == N:
        return x
    base = x._base
    grad = x.requires_grad
    if base is not None and (not grad or base.requires_grad):
        if (
            base.is_contiguous()
            and base.numel() == ct * cn
            and base.storage_offset() == x.storage_offset()
        ):
            c = base.view(ct, cn)
            if (ct == 1 or c.stride(0) == st) and (cn == 1 or c.stride(1) == sn):
                return c
        if grad:
            return base.as_strided((ct, cn), (st, sn), x.storage_offset())
    if not grad:
        return x.as_strided((ct, cn), (st, sn))
    return x[:ct, :cn]


def _strides(x):
    """``(time stride, lane stride)`` of a compact input (0 along its size-1 dimensions)."""
    return (x.stride(0) if x.shape[0] > 1 else 0, x.stride(1) if x.shape[1] > 1 else 0)


def _check_size(T, N, ins):
    """Kernels index with 32-bit offsets: ``T * N`` and every input's span stay below 2**31."""
    big = T * N >= 2**31 or any(
        sum((n - 1) * abs(s) for n, s in zip(x.shape, x.stride(), strict=True)) >= 2**31
        for x in ins
    )
    if big:
        raise ValueError(
            f"z: the triton backend handles up to 2**31 elements per [T, N] input, got shape "
            f"({T}, {N}); use backend='torch'"
        )


class _Sig:
    """What the launches of one call signature share, kept per :func:`_signature` key: sizes,
    the plan, the inputs' strides, the kernels' constexprs and grids, and (``sites``) the
    compiled kernels of each launch (:func:`kalmanscan.cuda._common.launch_site`)."""

    __slots__ = ("T", "N", "CH", "NC", "CK", "BLOCK", "grid", "ia", "x0s", "vary", "warps",
                 "sites", "carry", "adj")  # fmt: skip

    def __init__(self, T, N, ins, x0):
        _check_size(T, N, ins)
        self.T, self.N = T, N
        self.CH, self.NC, self.CK, self.BLOCK, self.warps = _plan(T, N)
        ia, self.vary = [], {}
        for name, x in zip(("VZ", "VR", "VA", "VP", "VH", "VC"), ins, strict=True):
            st, sn = _strides(x)
            ia += [None, st, sn]
            self.vary[name] = st != 0
        self.ia = ia  # the inputs' arguments, tensors at 0::3
        self.x0s = tuple(t.stride(0) if t.shape[0] > 1 else 0 for t in x0)
        self.grid = (cdiv(N, self.BLOCK), self.NC)
        self.sites = {}
        self.carry = {}
        self.adj = {}

    def cfg(self, **kw):
        return dict(self.vary, NS=TUNING["NS"], BLOCK=self.BLOCK, num_warps=self.warps, **kw)

    def args(self, ins):
        """The six inputs' kernel arguments ``(ptr, time stride, lane stride)``."""
        ia = self.ia.copy()
        ia[0::3] = ins
        return ia


_SIGS: dict = {}


def _signature(T, N, ins, x0) -> _Sig:
    """The kept :class:`_Sig` of these inputs: keyed by everything a launch specializes on
    (device, dtype, sizes, strides, 16-byte alignment of every input) and the tuning, so that
    every call with the key launches the same compiled kernels."""
    z = ins[0]
    key = [z.device, z.dtype, T, N, _MANY_LANES, _TARGET_WORK, interpreting(), *TUNING.values()]
    if z.is_cuda:
        key.append(torch.cuda.current_device())
    for x in ins:
        key += (x.shape, x.stride(), x.data_ptr() & 15)
    for x in x0:
        key += (x.shape, x.stride(), x.data_ptr() & 15, x.dtype)
    key = tuple(key)
    sig = _SIGS.get(key)
    if sig is None:
        if len(_SIGS) > 256:
            _SIGS.clear()
        sig = _SIGS[key] = _Sig(T, N, ins, x0)
    return sig


def _forward(T, N, ins, x0, write, ckpt=False, smooth=False):
    """Run the filter: ``(sig, series, loglik, final [3, N], flags, checkpoints, backward ends
    or, with ``ckpt`` and chunks, the adjoint's chunk maps)``. With chunks, the first launch
    (the chunk maps) goes out before the other buffers are allocated, so that their host time
    overlaps it."""
    z = ins[0]
    sig = _signature(T, N, ins, x0)
    CH, NC, CK, grid = sig.CH, sig.NC, sig.CK, sig.grid
    sites = sig.sites
    ia = sig.args(ins)
    x0a = (*x0, *sig.x0s)
    tang = ckpt and not write and NC > 1  # the gradient's forward: the adjoint's chunk maps too
    slot = (write, ckpt, smooth)
    if NC > 1:
        comp = empty((16 if smooth else 9, NC, N), z)
        # the chunk maps read the inputs only: z stands for every other buffer
        zs = (z,) * 12
        launch_site(sites, ("maps",) + slot, filter_kernel, grid,
            (*ia, *x0a, *zs, comp, T, N, CH, NC, CK),
            lambda: sig.cfg(MAPS=True, BMAPS=smooth, FROM_X0=True, WRITE=False, PARTIAL=False,
                    CKPT=False, TANG=False))  # fmt: skip
    flags = torch.zeros(1, dtype=torch.int32, device=z.device)
    series = empty((len(SERIES), T, N), z).unbind(0) if write else (z,) * len(SERIES)
    fin = empty((3, N), z)
    ll = empty((N,), z)
    ck = empty((cdiv(T, CK), 3, N), z) if ckpt else z
    if NC == 1:
        launch_site(sites, ("one",) + slot, filter_kernel, grid,
            (*ia, *x0a, z, *series, ll, fin, flags, ck, z, T, N, CH, NC, CK),
            lambda: sig.cfg(MAPS=False, BMAPS=False, FROM_X0=True, WRITE=write, PARTIAL=False,
                    CKPT=ckpt, TANG=False))  # fmt: skip
        return sig, series, ll, fin, flags, ck, None
    start = empty((3, NC, N), z)
    bend = empty((3, NC, N), z) if smooth else z
    key = ("carry", smooth)
    if key not in sig.carry:
        sig.carry[key] = _carry_config(N, NC, TUNING["CARRY_TILE"])
    CB, CT, cwarps = sig.carry[key]
    launch_site(sites, key, carry_kernel, (cdiv(N, CB),),
        (comp, *x0a, start, bend, N, NC, *ia, T, CH),
        lambda: dict(FWD=True, BWD=smooth, NS=TUNING["NS_CARRY"], CT=CT, BLOCK=CB,
             num_warps=cwarps))  # fmt: skip
    part = empty((NC, N), dtype=torch.float64, device=z.device)
    amap = empty((12, NC, N), z) if tang else z
    launch_site(sites, ("rerun",) + slot, filter_kernel, grid,
        (*ia, *x0a, start, *series, part, fin, flags, ck, amap, T, N, CH, NC, CK),
        lambda: sig.cfg(MAPS=False, BMAPS=False, FROM_X0=False, WRITE=write, PARTIAL=True,
                CKPT=ckpt, TANG=tang))  # fmt: skip
    # the chunks' float64 partial sums, added by one reduction (a kernel walking the chunks in
    # sequence is bound by the loads' latency: ~0.1 ms at 1024 chunks)
    torch.sum(part, 0, out=ll) if ll.dtype == torch.float64 else ll.copy_(part.sum(0))
    return sig, series, ll, fin, flags, ck, (bend if smooth else (amap if tang else None))


def _carry_config(N: int, NC: int, tile: int):
    """``(lanes a program, chunks a tile, warps)`` of a carry's tile scan (``tile`` chunks at
    most)."""
    if interpreting():
        return min(16, next_pow2(N)), min(4, next_pow2(max(NC - 1, 2))), 1
    CT = min(tile, next_pow2(max(NC - 1, 2)))
    return TUNING["CARRY_LANES"], CT, 4


def _smooth(T, N, ins, x0):
    sig, series, ll, fin, flags, _, bend = _forward(T, N, ins, x0, write=True, smooth=True)
    z = ins[0]
    sm, sv = empty((2, T, N), z).unbind(0)
    launch_site(sig.sites, "smooth", smooth_kernel, sig.grid,
        (*sig.args(ins), series[0], series[1], z if bend is None else bend, sm, sv, T, N,
         sig.CH, sig.NC),
        lambda: dict(sig.vary, FROM_END=sig.NC == 1, NS=TUNING["NS"], BLOCK=sig.BLOCK,
             num_warps=sig.warps))  # fmt: skip
    return series, ll, fin, flags, sm, sv


class _Adj:
    """The adjoint's buffers of one forward call (allocated by the forward, before its flags
    are read, so that the backward's host path before its first launch is short). The
    gradients returned may be views of ``part`` and ``g0``, so a second backward through the
    same graph (``retain_graph``) takes new buffers (``used``)."""

    __slots__ = ("needs", "modes", "n_part", "part", "scratch", "g0", "xend", "used")


def _adjoint_modes(sig, ins, needs):
    """Per input: 0 no gradient, 1 a ``[T, N]`` gradient, 2 summed over time."""
    key = ("modes", needs)
    modes = sig.adj.get(key)
    if modes is None:
        modes = sig.adj[key] = tuple(
            0 if not need else (1 if _strides(x)[0] != 0 else 2)
            for x, need in zip(ins, needs, strict=True)
        )
    return modes


def _adjoint_buffers(sig, ins, needs):
    """The :class:`_Adj` of a forward call whose inputs need ``needs`` (six booleans); None
    when the segment scratch would pass 32-bit offsets (the backward then raises)."""
    z = ins[0]
    N, NC, CK, BLOCK = sig.N, sig.NC, sig.CK, sig.BLOCK
    size = NC * sig.grid[0] * CK * 3 * BLOCK
    if size >= 2**31:  # 32-bit offsets into the segment scratch
        return None
    adj = _Adj()
    adj.needs, adj.used = needs, False
    adj.modes = _adjoint_modes(sig, ins, needs)
    adj.n_part = n_part = sum(m == 2 for m in adj.modes)
    # one buffer and one sum for every input constant in time
    adj.part = empty((n_part, NC, N), z) if n_part else None
    adj.scratch = empty((size,), z)
    adj.g0 = empty((3, N), z)
    adj.xend = empty((3, NC, N), z) if NC > 1 else None
    return adj


_KEPT: dict = {}


def _kept(shape, like, value=0.0):
    """A kept tensor filled with ``value`` (read-only by convention: the kernels only read it)."""
    key = (shape, value, like.dtype, like.device)
    t = _KEPT.get(key)
    if t is None:
        if len(_KEPT) > 64:
            _KEPT.clear()
        t = _KEPT[key] = torch.full(shape, value, dtype=like.dtype, device=like.device)
    return t


def _adjoint(sig, ins, ck, amap, adj, gll, gfin, lane_sums=True):
    """Gradients of ``sum(gll * loglik) + <gfin, final>`` with respect to the six compact inputs
    (``None`` where not needed) and to ``x0`` (``[3, N]``), into the buffers ``adj`` of the
    forward call; ``amap``: the forward's adjoint chunk maps (with chunks). Without
    ``lane_sums`` an input shared by the lanes gets its per-lane gradients (``[1, N]``)."""
    z = ins[0]
    T, N, NC = sig.T, sig.N, sig.NC
    if adj is None:
        raise ValueError(
            f"z: the triton backend's log-likelihood gradient handles up to "
            f"{2**31 // (sig.CK * 3)} lanes, got shape ({T}, {N}); use backend='torch'"
        )
    if adj.used:  # the first backward's gradients may be views of these buffers
        adj = _adjoint_buffers(sig, ins, adj.needs)
    adj.used = True
    if gll is None:
        gll = _kept((N,), z)
    gsn = gll.stride(0) if N > 1 else 0  # read through its stride (sum()'s gradient: stride 0)
    if gfin[0] is None and gfin[1] is None and gfin[2] is None:
        xlast = _kept((3, N), z)
    else:
        # (the kernels take the final normalization's derivative, as every step's)
        xlast = torch.stack([torch.zeros(N, dtype=z.dtype, device=z.device) if g is None else g
                             for g in gfin])  # fmt: skip
    # gll comes from the caller: its stride class and alignment are part of the launch's key
    gkey = (gll.dtype, gsn, gll.data_ptr() & 15, xlast.data_ptr() & 15)
    sites = sig.sites
    if NC == 1:
        xend = xlast
    else:
        xend = adj.xend
        key = ("adj_carry",)
        if key not in sig.carry:
            sig.carry[key] = _carry_config(N, NC, TUNING["ADJ_CARRY_TILE"])
        CB, CT, cwarps = sig.carry[key]
        launch_site(sites, ("adj_carry",) + gkey, adjoint_carry_kernel, (cdiv(N, CB),),
                    (amap, gll, gsn, xlast, xend, N, NC),
                    lambda: dict(CT=CT, BLOCK=CB, num_warps=cwarps))  # fmt: skip
    modes, part = adj.modes, adj.part
    bufs, j = [], 0
    for mode in modes:
        if mode == 1:
            bufs.append(empty((T, N), z))
        elif mode == 2:
            bufs.append(part[j])
            j += 1
        else:
            bufs.append(z)
    names = ("GZ", "GR", "GA", "GP", "GH", "GC")
    launch_site(sites, ("adj", modes) + gkey, adjoint_kernel, sig.grid,
        (*sig.args(ins), ck, adj.scratch, gll, gsn, xend, *bufs, adj.g0, T, N, sig.CH, NC,
         sig.CK),
        lambda: sig.cfg(**dict(zip(names, modes, strict=True))))  # fmt: skip
    summed = part.sum(1, keepdim=True) if (part is not None and NC > 1) else part
    grads, j = [], 0
    for x, mode, buf in zip(ins, modes, bufs, strict=True):
        if mode == 0:
            grads.append(None)
            continue
        if mode == 2:
            g = summed[j]
            j += 1
        else:
            g = buf
        if lane_sums and x.shape[1] == 1 and N > 1:
            g = g.sum(1, keepdim=True)
        grads.append(g)
    return grads, adj.g0


def _torch_vjp(T, N, inputs, needs, pairs, smooth, outputs="all"):
    """Gradients by the torch backend's vector-Jacobian product at the same inputs.
    ``pairs``: ``(key, index or None, incoming gradient)`` of the outputs to differentiate."""
    from kalmanscan.core import parallel

    create = torch.is_grad_enabled()  # create_graph: differentiate the saved inputs themselves
    with torch.enable_grad():
        leaves = [x if create else x.detach().requires_grad_(n)
                  for x, n in zip(inputs, needs, strict=True)]  # fmt: skip
        series = [x.expand(T, N) for x in leaves[:6]]
        # obs_var = inf marks a step not observed here (INF_OBS_VAR_UNOBSERVED); the torch
        # backend reads that from z alone (one elementwise op, no host synchronization)
        series[0] = series[0].masked_fill(torch.isinf(series[1]), float("nan"))
        x0 = tuple(leaves[6:9])
        if smooth:
            r = parallel.smooth_lanes(*series, x0)
        else:
            r = parallel.filter_lanes(*series, x0, outputs=outputs)
        outs, gs = [], []
        for key, idx, g in pairs:
            o = r[key] if idx is None else r[key][idx]
            if g is not None and o.requires_grad:
                outs.append(o)
                gs.append(g)
        wrt = [x for x, n in zip(leaves, needs, strict=True) if n]
        got = torch.autograd.grad(outs, wrt, gs, allow_unused=True, create_graph=create)
    it = iter(got)
    return tuple(next(it) if n else None for n in needs)


_LL_KEYS = (("loglik", None), ("final", 0), ("final", 1), ("final", 2))


# The log-likelihood's gradient with respect to inputs constant in time (the fitting case) is
# linear in each lane's incoming weight, so the forward launches the adjoint for unit weights
# right after its own kernels and waits only for those (its flags copied to the host behind
# them): the adjoint runs on the device while autograd's engine reaches the backward, which
# scales the per-lane results by the weights (H200, 2^20 x 64, ks.loglik + gradient:
# benchmarks/results/h200-public.json). A gradient of the final state too, a [T, N] input's
# gradient or a graph of the gradient take the backward's own adjoint as before.
EAGER_ADJOINT = True


def _flags_reader(flags):
    """A function returning the flags word as an int that waits for the kernels launched so far
    only (a copy to pinned host memory behind them and an event), not for later launches."""
    if not flags.is_cuda:
        return lambda: int(flags[0])
    host = torch.empty((1,), dtype=flags.dtype, pin_memory=True)
    host.copy_(flags, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def read():
        done.synchronize()
        return int(host[0])

    return read


class _Loglik(torch.autograd.Function):
    """``outputs="loglik"``: the fused forward and the fused adjoint. ``fwd`` is the result of
    the forward's kernels (:func:`_forward`, launched before this function is applied, so that
    the GPU starts before autograd's bookkeeping runs); ``box`` receives ``read_flags`` where
    the forward also launched the unit-weight adjoint (``EAGER_ADJOINT``)."""

    @staticmethod
    def forward(ctx, fwd, box, z, R, a, p, h, c, u0, e0, v0):
        sig, _, ll, fin, flags, ck, amap = fwd
        ins = (z, R, a, p, h, c)
        ctx.save_for_backward(*ins, u0, e0, v0, ck, z if amap is None else amap, ll)
        ctx.sig = sig
        # the API calls mark_lost where the flags hold LL_LOST (read after this function, with
        # no synchronization of its own): the lanes whose log-likelihood is NaN by design get
        # NaN gradients
        state = ctx.lost = {"lost": False}
        box["mark_lost"] = lambda: state.update(lost=True)
        ctx.adj = adj = _adjoint_buffers(sig, ins, ctx.needs_input_grad[2:8])
        ctx.eager = None
        if EAGER_ADJOINT and adj is not None and 1 not in adj.modes:
            box["read_flags"] = _flags_reader(flags)
            ctx.eager = _adjoint(sig, ins, ck, amap, adj, _kept((sig.N,), z, 1.0),
                                 (None, None, None), lane_sums=False)  # fmt: skip
        flag = flags[0]
        ctx.mark_non_differentiable(flag)
        ctx.set_materialize_grads(False)
        fu, fe, fv = fin.unbind(0)
        return ll, fu, fe, fv, flag

    @staticmethod
    def backward(ctx, gll, gu, ge, gv, _gflags):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        if ctx.lost["lost"] and gll is not None:
            gll = torch.where(torch.isnan(saved[11]), float("nan"), gll)
        if torch.is_grad_enabled():  # a graph of the gradient (Hessians): the torch backend's
            pairs = [(k, i, g) for (k, i), g in zip(_LL_KEYS, (gll, gu, ge, gv), strict=True)]
            sig = ctx.sig
            vjp = _torch_vjp(sig.T, sig.N, saved[:9], needs, pairs, False, "loglik")
            return (None, None, *vjp)
        if ctx.eager is not None and gll is not None and gu is None and ge is None and gv is None:
            units, g0 = ctx.eager
            N = ctx.sig.N
            grads = []
            for x, g in zip(saved[:6], units, strict=True):
                if g is not None:
                    g = g * gll
                    if x.shape[1] == 1 and N > 1:
                        g = g.sum(1, keepdim=True)
                grads.append(g)
            g0 = g0 * gll if any(needs[6:9]) else g0
        else:
            grads, g0 = _adjoint(ctx.sig, saved[:6], saved[9], saved[10], ctx.adj, gll,
                                 (gu, ge, gv))  # fmt: skip
        return (None, None, *grads, g0[0] if needs[6] else None, g0[1] if needs[7] else None,
                g0[2] if needs[8] else None)  # fmt: skip


_ALL_KEYS = tuple((k, None) for k in SERIES) + _LL_KEYS
_SMOOTH_KEYS = _ALL_KEYS + (("smooth_mean", None), ("smooth_var", None))


def _run_all(T, N, ins, x0, smooth):
    if smooth:
        series, ll, fin, flags, sm, sv = _smooth(T, N, ins, x0)
        return (*series, ll, *fin.unbind(0), sm, sv, flags[0])
    _, series, ll, fin, flags, _, _ = _forward(T, N, ins, x0, write=True)
    return (*series, ll, *fin.unbind(0), flags[0])


class _All(torch.autograd.Function):
    """``outputs="all"`` and the smoother: fused forward; backward by the torch backend."""

    @staticmethod
    def forward(ctx, smooth, T, N, z, R, a, p, h, c, u0, e0, v0):
        out = _run_all(T, N, (z, R, a, p, h, c), (u0, e0, v0), smooth)
        ctx.save_for_backward(z, R, a, p, h, c, u0, e0, v0)
        ctx.T, ctx.N, ctx.smooth = T, N, smooth
        ctx.mark_non_differentiable(out[-1])
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, *grads):
        keys = _SMOOTH_KEYS if ctx.smooth else _ALL_KEYS
        pairs = [(k, i, g) for (k, i), g in zip(keys, grads[:-1], strict=True)]
        vjp = _torch_vjp(ctx.T, ctx.N, ctx.saved_tensors, ctx.needs_input_grad[3:], pairs,
                         ctx.smooth)  # fmt: skip
        return (None, None, None, *vjp)


def _prepare(z, obs_var, decay, process_var, loading, offset, x0):
    T, N = z.shape
    ins = (_compact(z), _compact(obs_var), _compact(decay), _compact(process_var),
           _compact(loading), _compact(offset))  # fmt: skip
    x0 = tuple(x0)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*ins, *x0))
    return T, N, ins, x0, grad


def _as_dict(out, smooth):
    d = dict(zip(SERIES, out[:7], strict=True))
    d["loglik"] = out[7]
    d["final"] = (out[8], out[9], out[10])
    if smooth:
        d["smooth_mean"], d["smooth_var"] = out[11], out[12]
    d["flags"] = out[-1]
    return d


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    """Filter ``N`` lanes on a CUDA device (docs/backend-contract.md).

    ``z, obs_var, decay, process_var, loading, offset``: ``[T, N]`` (any strides; ``z`` NaN
    where not observed); ``x0 = (u0, e0, v0)``: ``[N]`` each. One dtype (float32 or float64).
    Returns a dict: the ``[T, N]`` series ``mean, var, precision, info, pred_mean, pred_var,
    pred_precision`` (``outputs="all"`` only), ``loglik [N]``, ``final`` (three ``[N]``) and
    ``flags`` (0-d int32 on the device).

    >>> import torch  # doctest: +SKIP
    >>> from kalmanscan.cuda.filter import filter_lanes
    >>> T, N = 1000, 64
    >>> z = torch.randn(T, N, device="cuda")
    >>> one = torch.ones(1, 1, device="cuda").expand(T, N)
    >>> x0 = (torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda"),
    ...       torch.ones(N, device="cuda"))                      # diffuse
    >>> r = filter_lanes(z, one, 0.9 * one, 0.1 * one, one, 0 * one, x0)
    >>> r["mean"].shape, r["loglik"].shape, int(r["flags"])
    (torch.Size([1000, 64]), torch.Size([64]), 0)
    """
    if outputs not in ("all", "loglik"):
        raise ValueError(f"outputs: expected 'all' or 'loglik', got {outputs!r}")
    T, N, ins, x0, grad = _prepare(z, obs_var, decay, process_var, loading, offset, x0)
    if outputs == "loglik":
        if grad:
            fwd = _forward(T, N, ins, x0, write=False, ckpt=True)
            box = {}
            ll, fu, fe, fv, flags = _Loglik.apply(fwd, box, *ins, *x0)
            return {"loglik": ll, "final": (fu, fe, fv), "flags": flags, **box}
        _, _, ll, fin, flags, _, _ = _forward(T, N, ins, x0, write=False)
        return {"loglik": ll, "final": tuple(fin.unbind(0)), "flags": flags[0]}
    out = _All.apply(False, T, N, *ins, *x0) if grad else _run_all(T, N, ins, x0, False)
    return _as_dict(out, False)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    """Everything of :func:`filter_lanes` plus ``smooth_mean``, ``smooth_var`` ``[T, N]``
    (two-filter form, docs/backend-contract.md)."""
    T, N, ins, x0, grad = _prepare(z, obs_var, decay, process_var, loading, offset, x0)
    out = _All.apply(True, T, N, *ins, *x0) if grad else _run_all(T, N, ins, x0, True)
    return _as_dict(out, True)
