"""The recorder of :func:`kalmanscan.kla.inspect`: what it collects from each KLA layer.

:class:`record` hooks a :class:`_Recorder` on the selected :class:`~kalmanscan.kla.KLALayer`
modules; the recorder receives each layer's :class:`~kalmanscan.kla.KLATrace` chunk by chunk
and reduces it as it comes (summaries over lanes, binned channel views, lane means, and the
per-lane detail of a window), so memory does not grow with the text.
:func:`baseline_log10_precision` is the no-observation baseline the "text" quantities are
measured against. Notation and the quantities: :mod:`kalmanscan.kla._inspect`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math

import numpy as np
import torch

_LN2 = math.log(2.0)
_DETAIL_SLOT = (
    "posterior_precision",
    "prior_precision",
    "baseline_precision",
    "information_added",
    "write_gain",
    "forget_gate",
)
_DETAIL_CHANNEL = ("value_precision", "value", "readout_variance", "gated_readout_variance")
_SUMMARIES = (
    "mean_log10_precision",
    "mean_log10_text_precision",
    "mean_information_bits",
    "mean_write_gain",
    "mean_forget_gate",
    "mean_log10_readout_variance",
)
_BINNED = ("binned_log10_text_precision", "binned_information_bits")
_LANE = ("lane_mean_log10_text_precision", "lane_mean_information_bits", "lane_mean_write_gain")


# ---------------------------------------------------------------------- dynamics


def baseline_log10_precision(decay, process_var, positions, lam0=1.0):
    """log10 of the no-observation precision of each lane after ``n = position + 1`` predict
    steps from precision ``lam0``: ``-log10(a**(2n) / lam0 + p * sum_{j<n} a**(2j))``.

    decay, process_var ``[M, S]``; positions ``[T]`` -> ``[T, M, S]`` in the dtype of
    ``decay``.

    >>> import torch
    >>> a = torch.tensor([[0.5]], dtype=torch.float64)
    >>> p = torch.tensor([[0.1]], dtype=torch.float64)
    >>> lam = 1.0
    >>> for _ in range(3):
    ...     lam = lam / (0.25 + 0.1 * lam)   # predict step, no observation
    >>> round(lam, 10), round(float(10 ** baseline_log10_precision(a, p, torch.tensor([2]))), 10)
    (6.8085106383, 6.8085106383)
    """
    return _baseline_var(decay, process_var, positions, lam0).log10_().neg_()


def _baseline_var(decay, process_var, positions, lam0=1.0):
    """``1 / baseline`` ``[T, M, S]``: ``r + a**(2n) (1/lam0 - r)`` with ``r = p / (1 - a**2)``
    (the resting variance), or ``1/lam0 + p n`` where ``a = 1``."""
    p = process_var.to(decay.dtype)
    l2 = 2.0 * torch.log(decay)  # <= 0
    one_minus = -torch.expm1(l2)
    unit = one_minus == 0
    r = torch.where(unit, 0.0, p / torch.where(unit, 1.0, one_minus))
    n = positions.to(decay.dtype).add(1.0)[:, None, None]
    # exponents below -80 (-700 in float64) change nothing next to r and would make
    # subnormal numbers, which are many times slower on CPUs
    lo = -700.0 if decay.dtype == torch.float64 else -80.0
    var = torch.addcmul(r, (n * l2).clamp_min_(lo).exp_(), 1.0 / lam0 - r)
    if bool(unit.any()):  # inspection only: a host sync is fine here
        var = torch.where(unit, 1.0 / lam0 + p * n, var)
    return var


# ---------------------------------------------------------------------- the recorder


class _Recorder:
    """Receives each KLATrace of the selected layers and keeps reductions and the window.

    Each chunk is reduced in blocks of ``block`` tokens per batch element, as ``[T_b, M*S]``
    float views of the op's precision: every per-lane quantity is formed once per block in
    one reused buffer, reduced over lanes, slots and tokens (matrix products), and dropped, so
    no ``[B, T, M, S]`` temporary is allocated and a block stays in the CPU's cache."""

    def __init__(self, layers, B, L, mask, channels, window, bin_size, detail, npdt, device):
        self.layers = layers  # list of KLALayer in output order
        self.pos = {id(m): i for i, m in enumerate(layers)}
        self.offset = [0] * len(layers)
        self.B, self.L = B, L
        self.mask = mask  # [B, L] bool on device
        self.npdt = npdt
        first = layers[0]
        M, S, D = first.d_inner, first.d_state, first.d_model
        self.M, self.S, self.D = M, S, D
        nl = len(layers)
        self.sum = {n: np.full((nl, B, L), np.nan, npdt) for n in _SUMMARIES}
        self.base_mean = np.full((nl, L), np.nan, npdt)
        self.bin_size = bin_size
        self.nbins = -(-L // bin_size)
        self.binned = {n: torch.zeros(nl, B, self.nbins, M, dtype=torch.float64) for n in _BINNED}
        self.lane = {n: torch.zeros(nl, M, S, dtype=torch.float64) for n in _LANE}
        self.count = torch.zeros(nl, dtype=torch.float64)
        self.window = window
        # the detail's channels (None: all, in order)
        every = list(channels) == list(range(M))
        self.channels = None if every or not detail else torch.tensor(channels, device=device)
        self.padding = ~mask.cpu()  # [B, L] True where there is no token
        self.static = {}
        self.consts = {}  # per layer: dynamics-derived [M*S] vectors used by every block
        self.pool, self.pending = None, collections.deque()  # see overlap()
        self.detail = None
        if detail:
            # not filled: _detail writes every element (inspect checks that each layer saw every
            # token), and a NaN fill of these arrays (6 * 4 bytes per lane and token) costs as
            # much as the writes
            W, C = window[1] - window[0], len(channels)
            self.detail = {n: np.empty((nl, B, W, C, S), npdt) for n in _DETAIL_SLOT}
            self.detail.update({n: np.empty((nl, B, W, C), npdt) for n in _DETAIL_CHANNEL})
            self.detail.update({n: np.empty((nl, B, W, S), npdt) for n in ("key", "query")})
            self.detail["output_variance"] = np.empty((nl, B, W, D), npdt)

    # tokens per block: [64, 512 * 16] float32 is 2 MiB, which stays in cache between passes
    block = 64

    def _consts(self, i, a, p):
        """Per-layer vectors over the ``N = M*S`` lanes: reduction weights and the baseline's
        terms ``1/baseline = r + a**(2n) (1 - r)`` (lam0 = 1) with ``r = p / (1 - a**2)``.

        ``a**(2n)`` is clamped at ``exp(lo)`` (as in :func:`_baseline_var`), so a lane whose
        ``n * 2 ln a`` is below ``lo`` has settled at the constant ``rest``; lanes are sorted by
        ``2 ln a`` so that the lanes still moving at position ``n`` are a prefix."""
        c = self.consts.get(i)
        if c is not None:
            return c
        N, S = a.numel(), self.S
        l2 = (2.0 * torch.log(a)).reshape(N)
        one_minus = -torch.expm1(l2)
        unit = one_minus == 0
        r = torch.where(unit, 0.0, p.to(a.dtype).reshape(N) / torch.where(unit, 1.0, one_minus))
        lo = -700.0 if a.dtype == torch.float64 else -80.0
        rest = torch.addcmul(r, l2.new_full((), lo).exp(), 1.0 - r).log10_()
        order = torch.argsort(l2, descending=True)
        channel_sorted = torch.div(order, S, rounding_mode="floor")
        # the sorted positions of each channel's lanes in sorted order, laid out [S, M] (row k:
        # every channel's k-th lane), for the slot means of _baseline
        slot_pos = torch.argsort(channel_sorted, stable=True).view(self.M, S).T.reshape(-1)
        c = {
            # -mean and -a-weighted mean over lanes (the block holds -write_gain)
            "weights": torch.stack((torch.full_like(l2, -1.0 / N), a.reshape(N) / -N), 1),
            "mean_a": a.mean(),
            "slot_mean": torch.full((S,), 1.0 / S, dtype=a.dtype, device=a.device),
            "unit": bool(unit.any()),  # inspection only: a host sync is fine here
            "rest": rest,  # [N] log10(1/baseline) of a settled lane
            "rest_slot_mean": rest.view(-1, S).mean(-1),  # [M]
            "order": order,
            "l2_sorted": l2[order],
            "l2_host": l2[order].cpu().numpy(),
            "r_sorted": r[order],
            "c_sorted": (1.0 - r)[order],
            "rest_sorted": rest[order],
            "channel_sorted": channel_sorted,
            "slot_pos": slot_pos,
            "lo": lo,
        }
        self.consts[i] = c
        return c

    def _baseline(self, c, a, p, pos, n0, wsum, s_base, lane_base):
        """Slot means ``s_base [T_b, M]`` (written) and token sums weighted by ``wsum [T_b]``
        (added to ``lane_base [N]``) of ``log10(1/baseline)`` at positions ``pos`` (the first
        one's step count ``n0 = pos[0] + 1``); only the lanes not yet settled are computed per
        token."""
        if c["unit"]:  # lanes without decay: the general formula, every lane
            var = _baseline_var(a, p, pos).log10_()  # [T_b, M, S]
            s_base.copy_(var.mean(-1))
            lane_base.addmv_(var.reshape(len(pos), -1).T, wsum)
            return
        s_base.copy_(c["rest_slot_mean"].expand(s_base.shape))
        lane_base.add_(c["rest"] * wsum.sum())
        # lanes with n * l2 > lo at the block's first position n0 still move (counted on the
        # host, in the working dtype's rounding)
        moving = int(np.count_nonzero(c["l2_host"] * c["l2_host"].dtype.type(n0) > c["lo"]))
        if moving == 0:
            return
        n = pos.to(s_base.dtype).add(1.0)
        e = torch.outer(n, c["l2_sorted"][:moving]).clamp_min_(c["lo"]).exp_()
        e = e.mul_(c["c_sorted"][:moving]).add_(c["r_sorted"][:moving]).log10_()
        d = e.sub_(c["rest_sorted"][:moving])  # [T_b, moving]: difference to the settled value
        # slot means: each channel's terms added in sorted order, lane by lane (a strided pass
        # each) where few lanes move, else every channel's k-th lane at once (S passes over
        # the channels); the two round alike
        slots = c["slot_pos"]
        if 2 * moving < len(slots):
            s_base.index_add_(1, c["channel_sorted"][:moving], d, alpha=1.0 / self.S)
        else:
            if moving < len(slots):  # the settled lanes' terms are 0
                by_slot = d.index_select(1, slots.clamp(max=moving - 1))
                by_slot = torch.where(slots < moving, by_slot, 0)
            else:
                by_slot = d.index_select(1, slots)
            for row in by_slot.view(len(n), self.S, self.M).unbind(1):
                s_base.add_(row, alpha=1.0 / self.S)
        lane_base.index_add_(0, c["order"][:moving], wsum @ d)

    def __call__(self, layer, tr):
        i = self.pos.get(id(layer))
        if i is None:
            return
        t0 = self.offset[i]
        B, T = tr.out.shape[:2]
        if B != self.B or t0 + T > self.L:
            raise ValueError(
                f"inputs: layer {i} saw [B={B}, L={t0 + T}] tokens, expected at most "
                f"[B={self.B}, L={self.L}] (the model must call each KLA layer on the inputs' "
                "tokens, once or chunk by chunk in order)"
            )
        self.offset[i] = t0 + T
        if self.pool is None:
            self._reduce(i, tr, t0)
            return
        # at most two chunks wait (each holds its [B, T, M, S] precisions); a worker's error
        # surfaces here or at the end of overlap()
        while len(self.pending) >= 2:
            self.pending.popleft().result()
        self.pending.append(self.pool.submit(self._reduce_no_grad, i, tr, t0))

    @contextlib.contextmanager
    def overlap(self, enabled):
        """Reduce on one worker thread while the model runs the next layer (``enabled``: on the
        CPU with one intra-op thread, where the filter's small per-token operations leave the
        second core idle; elsewhere the reductions run inline)."""
        if not enabled:
            yield self
            return
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inspect")
        try:
            yield self
            while self.pending:
                self.pending.popleft().result()
        finally:
            for f in self.pending:
                f.cancel()
            self.pool.shutdown(wait=True)
            self.pool, self.pending = None, collections.deque()

    def _reduce_no_grad(self, i, tr, t0):
        with torch.no_grad():  # grad mode is per thread
            self._reduce(i, tr, t0)

    def _reduce(self, i, tr, t0):
        """Reduce one chunk's trace of layer ``i`` (tokens ``t0 : t0 + T``)."""
        B, T = tr.out.shape[:2]
        lam = tr.precision.contiguous()  # [B, T, M, S]
        fdt, dev = lam.dtype, lam.device
        a, p = tr.decay, tr.process_var
        M, S = self.M, self.S
        N = M * S
        c = self._consts(i, a, p)
        if i not in self.static:
            self.static[i] = (a.double().cpu(), p.double().cpu())
        if self.detail is not None:
            lo, hi = max(self.window[0], t0), min(self.window[1], t0 + T)
            if lo < hi:
                self._detail(i, tr, t0, lo - t0, hi - t0)
        w = self.mask[:, t0 : t0 + T].to(fdt)  # [B, T]
        Lv, k2 = tr.sensors.obs_prec, tr.sensors.k.square()
        to_bits = -0.5 / _LN2
        # per chunk: [B, T] summaries and [B, T, M] slot means, filled block by block
        s_wg = torch.empty(B, T, 2, dtype=fdt, device=dev)  # lane means of wg and a * wg
        s_bits = torch.empty(B, T, M, dtype=fdt, device=dev)  # slot means, ln(prior / lam)
        s_lam = torch.empty(B, T, M, dtype=fdt, device=dev)  # slot means, log10 lam
        s_base = torch.empty(T, M, dtype=fdt, device=dev)  # slot means, log10(1 / baseline)
        # token sums per lane: each block's in the working dtype (the text precision as
        # log10 lam + log10(1/baseline), whose terms cancel within a block), the chunk's in float64
        blk = torch.empty(3, N, dtype=fdt, device=dev)
        lane_wg, lane_bits, lane_text = blk
        lane64 = torch.zeros(3, N, dtype=torch.float64, device=dev)
        wsum = w.sum(0)  # [T]: valid batch elements at each position
        buf = torch.empty(min(self.block, T) * N, dtype=fdt, device=dev)
        pos = torch.arange(t0, t0 + T, device=dev)
        neg_lv = Lv.neg()
        for b0 in range(0, T, self.block):
            b1 = min(T, b0 + self.block)
            tb = b1 - b0
            blk.zero_()
            n0 = t0 + b0 + 1
            self._baseline(c, a, p, pos[b0:b1], n0, wsum[b0:b1], s_base[b0:b1], lane_text)
            x = buf[: tb * N].view(tb, N)
            for b in range(B):
                wb = w[b, b0:b1]
                lam_b = lam[b, b0:b1].view(tb, N)
                # -write gain = -phi / lam with phi = Lv k**2, in the buffer
                torch.mul(neg_lv[b, b0:b1, :, None], k2[b, b0:b1, None, :], out=x.view(tb, M, S))
                nwg = x.div_(lam_b)
                torch.matmul(nwg, c["weights"], out=s_wg[b, b0:b1])
                lane_wg.addmv_(nwg.T, wb, alpha=-1.0)
                ln_keep = nwg.log1p_()  # ln(prior / lam) = -2 ln2 * bits
                torch.matmul(
                    ln_keep.view(tb * M, S), c["slot_mean"], out=s_bits[b, b0:b1].view(tb * M)
                )
                lane_bits.addmv_(ln_keep.T, wb)
                log10_lam = torch.log10(lam_b, out=x)
                torch.matmul(
                    log10_lam.view(tb * M, S), c["slot_mean"], out=s_lam[b, b0:b1].view(tb * M)
                )
                lane_text.addmv_(log10_lam.T, wb)
            lane64 += blk
        keep = w.bool()
        nan = torch.tensor(float("nan"), dtype=fdt, device=dev)

        def put(name, value):
            self.sum[name][i, :, t0 : t0 + T] = torch.where(keep, value, nan).cpu().numpy()

        s_bits.mul_(to_bits)
        put("mean_write_gain", s_wg[..., 0])
        put("mean_forget_gate", c["mean_a"] - s_wg[..., 1])
        put("mean_information_bits", s_bits.mean(-1))
        mean_log10 = s_lam.mean(-1)
        base_mean = -s_base.mean(-1)
        put("mean_log10_precision", mean_log10)
        put("mean_log10_text_precision", mean_log10 - base_mean)
        put("mean_log10_readout_variance", torch.log10(tr.yvar).mean(-1))
        self.base_mean[i, t0 : t0 + T] = base_mean.cpu().numpy()
        lane = self.lane
        lane64 = lane64.view(3, M, S).cpu()
        lane["lane_mean_write_gain"][i] += lane64[0]
        lane["lane_mean_information_bits"][i] += lane64[1] * to_bits
        lane["lane_mean_log10_text_precision"][i] += lane64[2]

        # per channel, binned over tokens
        bins = torch.div(pos, self.bin_size, rounding_mode="floor").cpu()
        wm = w[..., None]
        for name, value in (
            ("binned_log10_text_precision", s_lam.add_(s_base)),
            ("binned_information_bits", s_bits),
        ):
            self.binned[name][i].index_add_(1, bins, (value * wm).double().cpu())
        self.count[i] += float(w.sum())

    def _detail(self, i, tr, t0, a0, a1):
        """Write rows ``a0:a1`` of a chunk starting at token ``t0`` into the window arrays: each
        quantity is formed in its window array (on the CPU, where the working dtype is the
        arrays'), the channels selected first, and the padding's rows set to NaN."""
        ch = self.channels
        w0 = t0 + a0 - self.window[0]
        w1 = w0 + a1 - a0
        rows = slice(a0, a1)
        lam = tr.precision[:, rows]
        fdt, dev = lam.dtype, lam.device
        copies = []

        def select(x, dim=2):
            return x if ch is None else x.index_select(dim, ch)

        def target(name):
            """The window array of ``name`` as a tensor, or a buffer copied there at the end."""
            dst = torch.from_numpy(self.detail[name][i, :, w0:w1])
            if dst.dtype == fdt and dev.type == "cpu":
                return dst
            buf = torch.empty(dst.shape, dtype=fdt, device=dev)
            copies.append((dst, buf))
            return buf

        def put(name, value):
            torch.from_numpy(self.detail[name][i, :, w0:w1]).copy_(value)

        sens = tr.sensors
        lam, Lv = select(lam), select(sens.obs_prec[:, rows])
        a, p = select(tr.decay, 0), select(tr.process_var, 0)
        phi = target("information_added")
        torch.mul(Lv[..., None], sens.k[:, rows, None, :].square(), out=phi)
        torch.sub(lam, phi, out=target("prior_precision"))
        wg = torch.div(phi, lam, out=target("write_gain"))
        # (wg - 1) * (-a) rounds as a * (1 - wg): negation is exact
        torch.sub(wg, 1.0, out=target("forget_gate")).mul_(a.neg())
        pos = torch.arange(t0 + a0, t0 + a1, device=dev)
        baseline = _baseline_var(a, p, pos).reciprocal_()  # 1 / base_var, [W, C, S]
        for dst, buf in copies:
            dst.copy_(buf)
        put("posterior_precision", lam)
        put("baseline_precision", baseline[None].expand(lam.shape))
        put("value_precision", Lv)
        put("value", select(sens.v[:, rows]))
        yvar = select(tr.yvar[:, rows])
        put("readout_variance", yvar)
        put("gated_readout_variance", yvar * select(tr.gate_act[:, rows]).to(yvar.dtype).square())
        put("key", sens.k[:, rows])
        put("query", sens.q[:, rows])
        put("output_variance", tr.out_var[:, rows])
        pad = self.padding[:, t0 + a0 : t0 + a1]
        if bool(pad.any()):
            for name in self.detail:
                torch.from_numpy(self.detail[name][i, :, w0:w1])[pad] = float("nan")


class record:
    """Context manager that installs ``recorder(layer, trace)`` on every given KLALayer (the
    layer then computes its per-token precisions and hands over a
    :class:`~kalmanscan.kla.KLATrace` on each call) and removes it on exit."""

    def __init__(self, layers, recorder):
        self.layers, self.recorder = list(layers), recorder

    def __enter__(self):
        busy = [m for m in self.layers if m._recorder is not None]
        if busy:
            raise RuntimeError("inspect: a KLALayer is already being recorded (nested inspect)")
        for m in self.layers:
            m._recorder = self.recorder
        return self

    def __exit__(self, *exc):
        for m in self.layers:
            m._recorder = None
        return False
