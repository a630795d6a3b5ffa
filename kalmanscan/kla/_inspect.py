"""Belief-state inspection: what the text did to the filters inside KLA layers, separated from
what their dynamics do on their own.

:func:`inspect` runs a model with a recording hook on each :class:`~kalmanscan.kla.KLALayer`
(any ``nn.Module`` containing them; a :class:`~kalmanscan.kla.KLALanguageModel` is streamed
chunk by chunk with its recurrent state carried), reduces each layer's per-token, per-lane
quantities as they are produced, and returns an ``xarray.Dataset``. Per lane ``(channel m,
slot s)`` and token ``t`` (notation of docs/kla.md):

- ``lam_t`` posterior precision, from the op (``kla_filter(..., return_precision=True)``);
- ``phi_t = Lv_t[m] k_t[s]**2`` information added, ``prior_t = lam_t - phi_t``;
- ``write_gain = phi_t / lam_t`` and ``forget_gate = a prior_t / lam_t`` (so that
  ``mean_t = forget_gate * mean_{t-1} + (k Lv / lam_t) v_t``);
- ``information_bits = -log2(1 - write_gain) / 2 = log2(lam_t / prior_t) / 2``, the bits the
  token told the lane (entropy drop of its Gaussian belief);
- ``baseline_t``: the precision the same dynamics reach from the same starting state
  (``lam = 1``) with no observations, ``1 / (a**(2n) + p (1 - a**(2n)) / (1 - a**2))`` after
  ``n = t + 1`` steps. ``lam_t / baseline_t`` is the part of the precision the text put there.

Memory does not grow with the text: summaries over lanes are ``[layer, batch, time]``,
channel views are averaged into bins of ``bin_size`` tokens, and the full per-lane detail is
kept only for a ``window`` of tokens and a selection of ``channels``.

The per-chunk reductions (:class:`~kalmanscan.kla.inspect_record.record`, the hook each layer
hands its trace to) and the no-observation baseline are in :mod:`kalmanscan.kla.inspect_record`;
this module checks the inputs, runs the model and assembles, summarizes and saves the Dataset.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import numpy as np
import torch

from kalmanscan.kla.inspect_record import (  # noqa: F401 - baseline_log10_precision re-exported
    _BINNED,
    _DETAIL_CHANNEL,
    _DETAIL_SLOT,
    _LANE,
    _LN2,
    _SUMMARIES,
    _baseline_var,
    _Recorder,
    baseline_log10_precision,
    record,
)
from kalmanscan.kla.io import byte_label, byte_labels, encode_text
from kalmanscan.kla.layer import KLALayer

_DESCRIPTIONS = {
    "surprisal": "-log2 p(token t | tokens before t), bits (NaN at t=0 and at padding)",
    "mask": "True where the batch element has a token (False at padding)",
    "mean_log10_precision": "mean over lanes of log10 lam_t (posterior precision)",
    "mean_log10_baseline_precision": "mean over lanes of log10 of the no-observation baseline "
    "(counted from each row's first token)",
    "mean_log10_text_precision": "mean over lanes of log10(lam_t / baseline_t): precision the "
    "text added beyond what the dynamics alone give from the same state",
    "mean_information_bits": "mean over lanes of log2(lam_t / prior_t) / 2: bits token t told "
    "a lane",
    "mean_write_gain": "mean over lanes of phi_t / lam_t",
    "mean_forget_gate": "mean over lanes of decay * prior_t / lam_t (weight on the old mean)",
    "mean_log10_readout_variance": "mean over channels of log10 sum_s q_s**2 / lam_s",
    "binned_log10_text_precision": "log10(lam/baseline), mean over slots and the bin's tokens",
    "binned_information_bits": "information bits, mean over slots and the bin's tokens",
    "binned_surprisal": "surprisal, mean over the bin's tokens",
    "lane_mean_log10_text_precision": "log10(lam/baseline) averaged over every valid token",
    "lane_mean_information_bits": "information bits averaged over every valid token",
    "lane_mean_write_gain": "write gain averaged over every valid token",
    "decay": "discrete decay a of each lane",
    "process_var": "discrete process-noise variance p of each lane",
    "stationary_precision": "(1 - a**2) / p: the precision a lane rests at without observations",
    "timescale": "-1 / ln(a) = 1 / (theta * dt): memory of a lane in tokens",
    "process_noise_at_floor": "process noise at or below its floor (1e-7): no gradient reaches it",
    "posterior_precision": "lam_t of each lane after token t",
    "prior_precision": "lam_t - phi_t: precision before token t is observed",
    "baseline_precision": "precision with no observations from the same starting state",
    "information_added": "phi_t = value_precision * key**2",
    "write_gain": "phi_t / lam_t: share of the posterior precision contributed by token t",
    "forget_gate": "decay * prior_t / lam_t: weight on the previous mean",
    "value_precision": "value (observation) precision Lv_t = 1/(softplus(log var) + floor)",
    "value": "value v_t observed by each channel",
    "key": "key k_t (observation loading of each slot)",
    "query": "query q_t (readout weights of each slot)",
    "readout_variance": "sum_s q_s**2 / lam_s, before the gate",
    "gated_readout_variance": "readout variance times act(gate)**2",
    "output_variance": "model-space variance of the mixer output, yvar_gated @ (W_out**2)^T",
}


# ---------------------------------------------------------------------- inputs


def _pad(rows, name):
    lengths = [len(r) for r in rows]
    if not rows or min(lengths) == 0:
        raise ValueError(f"{name}: expected non-empty sequences, got lengths {lengths}")
    ids = torch.zeros(len(rows), max(lengths), dtype=torch.int64)
    mask = torch.zeros(len(rows), max(lengths), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
        mask[b, : len(row)] = True
    return ids, mask


def _as_ids(tokens):
    """``tokens`` -> ``(ids [B, L] int64, mask [B, L] bool or None)``."""
    if isinstance(tokens, (str, bytes, bytearray)):
        return encode_text(tokens), None
    if (
        isinstance(tokens, (list, tuple))
        and tokens
        and all(isinstance(t, (str, bytes, bytearray)) for t in tokens)
    ):
        return _pad([encode_text(t)[0] for t in tokens], "tokens")
    if (
        isinstance(tokens, (list, tuple))
        and tokens
        and all(isinstance(t, (list, tuple, np.ndarray, torch.Tensor)) for t in tokens)
    ):
        rows = [torch.as_tensor(t) for t in tokens]
        if any(r.ndim != 1 or r.is_floating_point() for r in rows):
            raise TypeError("tokens: expected a list of 1-D integer sequences")
        return _pad(rows, "tokens")
    if isinstance(tokens, (list, tuple)) and not tokens:
        raise ValueError(
            f"tokens: expected at least one sequence, got an empty {type(tokens).__name__}"
        )
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(tokens)
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(
            "tokens: expected text, bytes, a list of them, integer ids [L] or [B, L], a list of "
            f"id sequences or a tokenizer's output, got {type(tokens).__name__} "
            f"{getattr(tokens, 'dtype', '')}"
        )
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise ValueError(
            "tokens: expected shape [L] or [B, L] with B >= 1 and L >= 1, got "
            f"{tuple(tokens.shape)}"
        )
    return tokens.long(), None


def _index_list(name, value, size, default):
    if value is None:
        return list(default)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected ints, got {v!r}")
        out.append(int(v))
    if not out:
        raise ValueError(f"{name}: expected at least one index, got none")
    bad = [v for v in out if not 0 <= v < size]
    if bad:
        shown = ", ".join(str(v) for v in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise ValueError(
            f"{name}: expected indices in [0, {size}), got {len(bad)} outside it ({shown})"
        )
    return out


def kla_layers(model) -> dict:
    """The :class:`~kalmanscan.kla.KLALayer` modules of ``model`` in module order, keyed by
    their layer label: the block index in a :class:`~kalmanscan.kla.KLALanguageModel`, the
    module path (``"encoder.2.mixer"``) otherwise.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> cfg = ModelConfig(d_model=16, n_layers=2, mixers=["attention", "kla"],
    ...                   kla=KLAConfig(d_state=2))
    >>> list(kla_layers(KLALanguageModel(cfg)))
    [1]
    """
    if isinstance(model, KLALayer):
        return {0: model}
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    from kalmanscan.kla.model import KLALanguageModel

    if isinstance(model, KLALanguageModel):
        return {i: model.blocks[i].mixer for i in model.kla_blocks}
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, KLALayer)}


# ---------------------------------------------------------------------- running the model


def _logits_of(output, B, L):
    if isinstance(output, torch.Tensor):
        out = output
    elif hasattr(output, "logits"):
        out = output.logits
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        out = output[0]
    else:
        return None
    if out.ndim == 3 and tuple(out.shape[:2]) == (B, L) and out.is_floating_point():
        return out
    return None


def _surprisal(logits, ids, prev_logits):
    """-log2 p(ids[t] | <t) for the chunk's positions, from the chunk's logits [B, T, V]
    and the logits of the position before the chunk (or None at the start)."""
    B, T = ids.shape
    rows = logits[:, :-1] if prev_logits is None else torch.cat((prev_logits, logits[:, :-1]), 1)
    targets = ids if prev_logits is not None else ids[:, 1:]
    logp = torch.log_softmax(rows.double(), -1)
    bits = -logp.gather(-1, targets[..., None].to(logp.device))[..., 0] / _LN2
    out = torch.full((B, T), float("nan"), dtype=torch.float64)
    out[:, T - bits.shape[1] :] = bits.cpu()
    return out


# ---------------------------------------------------------------------- padding on the left


def _runs(on) -> str:
    """The positions ``on`` (sorted ints) as runs, ``"0, 2-3"`` (at most 5 runs shown)."""
    cuts = np.flatnonzero(np.diff(on) > 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(on, cuts)]
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:5])
    return text + (f", ... ({len(runs)} runs)" if len(runs) > 5 else "")


def _token_spans(mask):
    """``(first, stop)`` int arrays ``[B]``: each row's tokens are ``first:stop``. A row of
    ``mask`` that is not one contiguous run of True (no token, or a gap between tokens) raises
    a ValueError naming ``attention_mask``, the layouts handled and the row received."""
    m = mask.numpy()
    B, L = m.shape
    first = np.zeros(B, dtype=np.int64)
    stop = np.zeros(B, dtype=np.int64)
    expected = (
        "attention_mask: expected each row to be one contiguous run of ones (the tokens, with "
        "padding on the right, the left or both)"
    )
    for b in range(B):
        on = np.flatnonzero(m[b])
        shown = f" {m[b].astype(int).tolist()}" if L <= 32 else ""
        if on.size == 0:
            raise ValueError(f"{expected}, got row {b}{shown} with no token (all zeros)")
        if on[-1] - on[0] + 1 != on.size:
            raise ValueError(
                f"{expected}, got row {b}{shown} with ones at positions {_runs(on)} (a gap "
                "between tokens; inspect rows with gaps one run at a time)"
            )
        first[b], stop[b] = on[0], on[-1] + 1
    return first, stop


class _Shifted(_Recorder):
    """The recorder of rows whose first token is at position ``start`` > 0 (padding on the
    left). The model is run on the tokens from ``start`` on, so it never sees the padding;
    the recorder receives them at their positions in the input (the window, the bins and every
    array keep the input's positions), and the no-observation baseline counts its steps from
    ``start``, as it does from 0 for the same text unpadded."""

    def __init__(self, *args, start):
        super().__init__(*args)
        self.start = start
        self.offset = [start] * len(self.layers)
        if self.detail is not None:  # window positions before the first token: never written
            before = min(start, self.window[1]) - self.window[0]
            if before > 0:
                for arr in self.detail.values():
                    arr[:, :, :before] = np.nan

    def _baseline(self, c, a, p, pos, n0, wsum, s_base, lane_base):
        return super()._baseline(c, a, p, pos - self.start, n0 - self.start, wsum, s_base,
                                 lane_base)  # fmt: skip

    def _detail(self, i, tr, t0, a0, a1):
        super()._detail(i, tr, t0, a0, a1)
        # the detail's baseline, counted from the first token (as _Recorder._detail forms it)
        ch = self.channels
        a, p = tr.decay, tr.process_var
        if ch is not None:
            a, p = a.index_select(0, ch), p.index_select(0, ch)
        pos = torch.arange(t0 + a0 - self.start, t0 + a1 - self.start, device=a.device)
        baseline = _baseline_var(a, p, pos).reciprocal_()
        w0 = t0 + a0 - self.window[0]
        dst = torch.from_numpy(self.detail["baseline_precision"][i, :, w0 : w0 + a1 - a0])
        dst.copy_(baseline[None].expand(dst.shape))
        pad = self.padding[:, t0 + a0 : t0 + a1]
        if bool(pad.any()):
            dst[pad] = float("nan")


def _rows_of(inputs, rows, start, B, L):
    """The inputs of batch rows ``rows`` from position ``start`` on: every tensor (or array,
    or nested list) shaped ``[B, L, ...]`` cut to ``[rows, start:, ...]``, one shaped ``[B,
    ...]`` to its rows; anything else as it is."""

    def cut(x):
        if not isinstance(x, torch.Tensor):
            if not isinstance(x, (list, tuple, np.ndarray)):
                return x
            try:
                arr = np.asarray(x)
            except ValueError:  # ragged
                return x
            if arr.dtype == object or arr.ndim < 2 or arr.shape[:2] != (B, L):
                return x
            x = torch.as_tensor(arr)
        if x.ndim >= 1 and x.shape[0] == B:
            x = x[torch.as_tensor(rows, device=x.device)]
            if x.ndim >= 2 and x.shape[1] == L:
                x = x[:, start:]
        return x

    if isinstance(inputs, Mapping):
        return {k: cut(v) for k, v in inputs.items()}
    return cut(inputs)


def _merged(recs, B):
    """One recorder-like record of the whole batch from ``[(rows, recorder)]`` of groups of
    rows with different first positions; ``base_mean`` becomes ``[layer, batch, time]``."""
    r0 = recs[0][1]
    nl, L = len(r0.layers), r0.L
    out = types.SimpleNamespace(
        B=B, L=L, M=r0.M, S=r0.S, D=r0.D, npdt=r0.npdt, bin_size=r0.bin_size, nbins=r0.nbins,
        static=r0.static, count=sum(r.count for _, r in recs),
    )  # fmt: skip
    out.sum = {n: np.full((nl, B, L), np.nan, r0.npdt) for n in r0.sum}
    out.base_mean = np.full((nl, B, L), np.nan, r0.npdt)
    out.binned = {
        n: torch.zeros((nl, B) + v.shape[2:], dtype=v.dtype) for n, v in r0.binned.items()
    }
    out.lane = {n: sum(r.lane[n] for _, r in recs) for n in r0.lane}
    out.detail = None
    if r0.detail is not None:
        out.detail = {n: np.empty((nl, B) + v.shape[2:], v.dtype) for n, v in r0.detail.items()}
    for rows, r in recs:
        for n in out.sum:
            out.sum[n][:, rows] = r.sum[n]
        out.base_mean[:, rows] = r.base_mean[:, None]
        for n in out.binned:
            out.binned[n][:, torch.as_tensor(rows)] = r.binned[n]
        if out.detail is not None:
            for n in out.detail:
                out.detail[n][:, rows] = r.detail[n]
    return out


@torch.no_grad()
def inspect(
    model,
    tokens,
    *,
    layers=None,
    channels=None,
    window=None,
    detail: bool = True,
    bin_size: int | None = None,
    chunk_size: int = 512,
    attention_mask=None,
    forward=None,
    token_text=None,
    max_detail_bytes: float = 2**30,
):
    """Per-token belief-state quantities of the KLA layers of ``model`` as an ``xarray.Dataset``.

    Args:
        model: a :class:`~kalmanscan.kla.KLALanguageModel` (streamed ``chunk_size`` tokens at
            a time with every block's state carried) or any ``nn.Module`` containing
            :class:`~kalmanscan.kla.KLALayer` modules (called once, as ``forward(model,
            inputs)``). Not modified; any device.
        tokens: text or bytes (UTF-8 bytes are the tokens), a list of them (a batch, padded on
            the right and masked), integer ids ``[L]`` / ``[B, L]`` or a list of id sequences,
            or a tokenizer's output (a mapping with ``input_ids`` and optionally
            ``attention_mask``, passed to the model as keyword arguments).
        layers: which KLA layers, as labels (block indices of a language model, module paths
            otherwise) or positions in :func:`kla_layers`; default all.
        channels: channels kept in the per-lane detail (default all).
        window: ``(start, stop)`` token positions kept in the per-lane detail (default all).
        detail: False keeps only the summaries, the binned channel views and lane statistics,
            whose size does not depend on the selection (for long texts).
        bin_size: tokens per column of the binned channel views (default: about 1000 columns).
        chunk_size: tokens per forward call of a language model. On the CPU with one intra-op
            thread (``torch.set_num_threads(1)``, as ``kalmanscan inspect`` runs) each chunk's
            reductions run on a worker thread while the model runs the next layer.
        attention_mask: ``[B, L]``, nonzero where there is a token (default: from ``tokens``).
            Each row must be one contiguous run of ones: padding on the right, on the left (a
            row is then run from its first token on, so that it gives exactly what its text
            gives unpadded, laid out at the input's positions) or both; any other row (``[1, 0,
            1]``, or all zeros) is refused with a ValueError naming the row.
        forward: ``callable(model, inputs) -> output`` for other modules (default
            ``model(inputs)``, or ``model(**inputs)`` for a mapping). Logits ``[B, L, V]``
            (the output, its ``.logits`` or first element) give the surprisal.
        token_text: ``callable(id) -> str`` labels (default: for byte ids, the UTF-8 text's
            characters, each on its first byte, see :func:`~kalmanscan.kla.io.byte_labels`).
        max_detail_bytes: refuse (ValueError) a per-lane detail larger than this.

    Returns:
        Dataset with dims ``layer, batch, time`` (every token), ``window`` (detail tokens,
        labelled by position), ``channel`` (all channels), ``detail_channel``, ``slot``,
        ``bin``, ``feature``. Summaries over lanes ``[layer, batch, time]``:
        ``mean_log10_precision``, ``mean_log10_text_precision`` (against the no-observation
        baseline), ``mean_information_bits``, ``mean_write_gain``, ``mean_forget_gate``,
        ``mean_log10_readout_variance``, and ``mean_log10_baseline_precision [layer, time]``
        (``[layer, batch, time]`` where the rows' first tokens are at different positions);
        ``surprisal, mask [batch, time]``; channel views ``[layer, batch, bin, channel]``;
        per lane ``[layer, channel, slot]``: ``decay, process_var, stationary_precision,
        timescale, process_noise_at_floor`` and ``lane_mean_*`` over the valid tokens;
        detail ``[layer, batch, window, detail_channel, slot]``: ``posterior_precision,
        prior_precision, baseline_precision, information_added, write_gain, forget_gate``,
        ``[.., detail_channel]``: ``value_precision, value, readout_variance,
        gated_readout_variance``, ``key, query [.., slot]``, ``output_variance [.., feature]``.
        Padding positions are NaN (but in the one baseline curve ``[layer, time]`` of rows that
        all start at position 0, which runs on over right padding). Each variable's
        ``description`` attribute defines it.

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> model = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=4)))
    >>> ds = inspect(model, ["def f(x):", "pass"], channels=range(8))
    >>> ds.posterior_precision.dims, ds.posterior_precision.shape
    (('layer', 'batch', 'window', 'detail_channel', 'slot'), (2, 2, 9, 8, 4))
    >>> ds.mean_information_bits.shape, int(ds.mask.sum())
    ((2, 2, 9), 13)
    """
    import xarray as xr

    from kalmanscan.kla.model import KLALanguageModel

    found = kla_layers(model)
    if not found:
        raise ValueError(
            f"model: expected a module containing KLALayers, found none in {type(model).__name__}"
        )
    labels = list(found)
    if layers is None:
        chosen = labels
    else:
        if isinstance(layers, (int, str, np.integer)):
            want = [layers]
        else:
            try:
                want = list(layers)
            except TypeError:
                raise TypeError(
                    f"layers: expected a layer label or a list of them, got {layers!r}"
                ) from None
        chosen = []
        for w in want:
            if w in found:
                chosen.append(w)
            elif (
                isinstance(w, (int, np.integer))
                and not isinstance(w, bool)
                and (not isinstance(labels[0], int) and 0 <= w < len(labels))
            ):
                chosen.append(labels[int(w)])
            else:
                raise ValueError(f"layers: expected KLA layer labels {labels}, got {w!r}")
        if not chosen:
            raise ValueError("layers: expected at least one layer, got none")
        twice = sorted({c for c in chosen if chosen.count(c) > 1}, key=chosen.index)
        if twice:
            raise ValueError(f"layers: expected distinct layers, got {twice} more than once")
    mods = [found[c] for c in chosen]
    sizes = {(m.d_inner, m.d_state, m.d_model) for m in mods}
    if len(sizes) != 1:
        raise ValueError(
            f"layers: the selected KLA layers differ in (channels, slots, width) {sorted(sizes)}; "
            "inspect layers of one size at a time"
        )
    M, S, D = mods[0].d_inner, mods[0].d_state, mods[0].d_model
    for name, v in (("chunk_size", chunk_size), ("bin_size", bin_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: expected a positive int, got {v!r}")

    # inputs -> ids [B, L], mask [B, L], what the model is called with
    is_lm = isinstance(model, KLALanguageModel)
    call_inputs = tokens
    if isinstance(tokens, Mapping):
        if "input_ids" not in tokens:
            raise ValueError(f"tokens: expected a mapping with 'input_ids', got {list(tokens)}")
        ids, mask = _as_ids(torch.as_tensor(tokens["input_ids"]))
        if attention_mask is None and tokens.get("attention_mask") is not None:
            attention_mask = tokens["attention_mask"]
        call_inputs = dict(tokens)
    elif isinstance(tokens, torch.Tensor) and tokens.is_floating_point() and not is_lm:
        ids, mask = None, None  # e.g. embeddings [B, L, D] fed to a module
        if tokens.ndim < 2:
            raise ValueError(f"tokens: expected [B, L, ...] inputs, got {tuple(tokens.shape)}")
    else:
        ids, mask = _as_ids(tokens)
        call_inputs = ids
    B, L = ids.shape if ids is not None else tuple(tokens.shape[:2])
    if attention_mask is not None:
        am = torch.as_tensor(attention_mask)
        if tuple(am.shape) != (B, L):
            raise ValueError(
                f"attention_mask: expected shape {(B, L)} (that of the tokens), "
                f"got {tuple(am.shape)}"
            )
        mask = am.cpu() != 0
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool)
    first, stop = _token_spans(mask)  # each row's tokens: one run (padding left and/or right)
    if is_lm:
        V = model.config.vocab_size
        fed = ids[torch.arange(L) >= torch.as_tensor(first)[:, None]]  # left padding is not run
        if int(fed.min()) < 0 or int(fed.max()) >= V:
            raise ValueError(
                f"tokens: expected ids in [0, {V}), got range [{int(fed.min())}, {int(fed.max())}]"
            )
    if window is None:
        window = (0, L)
    try:
        w0, w1 = (int(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected (start, stop) ints, got {window!r}") from None
    if not 0 <= w0 < w1 or w0 >= L:
        raise ValueError(f"window: expected 0 <= start < stop with start < L={L}, got {window!r}")
    window = (w0, min(w1, L))
    channels = _index_list("channels", channels, M, range(M))
    wide = any(p.dtype == torch.float64 for p in mods[0].parameters())
    npdt = np.float64 if wide else np.float32
    if detail:
        W, C = window[1] - window[0], len(channels)
        size = np.dtype(npdt).itemsize * len(mods) * B * W * (6 * C * S + 4 * C + 2 * S + D)
        if size > max_detail_bytes:
            raise ValueError(
                f"window, channels: the per-lane detail would take {size / 2**30:.2f} GiB > "
                f"max_detail_bytes={max_detail_bytes / 2**30:.2f} GiB ({len(mods)} layers x "
                f"{C} channels x {W} tokens); pass a window=(start, stop), fewer channels or "
                "detail=False (summaries only, any length)"
            )
    if bin_size is None:
        bin_size = max(1, -(-L // 1000))

    device = next(mods[0].parameters()).device
    # Rows are run in groups by the position of their first token: a row padded on the left is
    # run from its first token on (the model never sees its padding), so that each row gives
    # what its text gives unpadded; the recorder keeps the input's positions.
    starts = np.unique(first)
    surprisal = np.full((B, L), np.nan)
    overlap = is_lm and device.type == "cpu" and torch.get_num_threads() == 1
    if not is_lm and forward is None:

        def forward(m, x):
            return m(**x) if isinstance(x, Mapping) else m(x)

    recs = []
    for s in starts.tolist():
        rows = np.flatnonzero(first == s)
        whole = len(rows) == B
        g_mask = mask if whole else mask[torch.as_tensor(rows)]
        args = (mods, len(rows), L, g_mask.to(device), channels, window, bin_size, detail, npdt,
                device)  # fmt: skip
        rec = _Recorder(*args) if s == 0 else _Shifted(*args, start=s)
        with record(mods, rec), rec.overlap(overlap):
            if is_lm:
                tok = (ids if whole else ids[torch.as_tensor(rows)])[:, s:].to(device)
                state = model.init_state(len(rows), device=device)
                prev = None
                for t0 in range(0, L - s, chunk_size):
                    chunk = tok[:, t0 : t0 + chunk_size]
                    logits, state = model(chunk, state)
                    bits = _surprisal(logits, chunk, prev).numpy()
                    surprisal[rows, s + t0 : s + t0 + chunk.shape[1]] = bits
                    prev = logits[:, -1:]
            else:
                inputs = call_inputs
                if not (whole and s == 0):
                    inputs = _rows_of(call_inputs, rows, s, B, L)
                if isinstance(inputs, torch.Tensor):
                    inputs = inputs.to(device)
                elif isinstance(inputs, dict):
                    inputs = {
                        k: v.to(device) if isinstance(v, torch.Tensor) else v
                        for k, v in inputs.items()
                    }
                output = forward(model, inputs)
                logits = _logits_of(output, len(rows), L - s)
                if logits is not None and ids is not None:
                    g_ids = (ids if whole else ids[torch.as_tensor(rows)])[:, s:]
                    bits = _surprisal(logits, g_ids.to(logits.device), None).numpy()
                    surprisal[rows, s:] = bits
        short = [c for c, off in zip(chosen, rec.offset, strict=True) if off != L]
        if short:
            raise ValueError(
                f"inputs: KLA layers {short} saw "
                f"{[rec.offset[chosen.index(c)] - s for c in short]} tokens, expected {L - s}"
            )
        recs.append((rows, rec))
    rec = recs[0][1] if len(recs) == 1 else _merged(recs, B)
    surprisal[~mask.numpy()] = np.nan
    return _dataset(
        xr, rec, chosen, mods, ids, mask, surprisal, channels, window, token_text, first, stop
    )


def _dataset(
    xr, rec, chosen, mods, ids, mask, surprisal, channels, window, token_text, first, stop
):
    nl, B, L = len(mods), rec.B, rec.L
    M, S, D = rec.M, rec.S, rec.D
    data = {n: (("layer", "batch", "time"), rec.sum[n]) for n in _SUMMARIES}
    # one baseline curve where every row starts at the same position; one per row otherwise
    base_dims = ("layer", "time") if rec.base_mean.ndim == 2 else ("layer", "batch", "time")
    base = rec.base_mean
    if base.ndim == 3:  # per row: NaN at its padding on either side, as the other variables
        base = np.where(mask.numpy()[None], base, np.nan)
    data["mean_log10_baseline_precision"] = (base_dims, base)
    data["surprisal"] = (("batch", "time"), surprisal)
    data["mask"] = (("batch", "time"), mask.numpy())
    # channel views: means over each bin's valid tokens
    pos = np.arange(L)
    binid = pos // rec.bin_size
    counts = np.zeros((B, rec.nbins))
    np.add.at(counts, (slice(None), binid), mask.numpy().astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        for n in _BINNED:
            v = rec.binned[n].numpy() / counts[None, :, :, None]
            data[n] = (("layer", "batch", "bin", "channel"), v.astype(rec.npdt))
        s = np.where(np.isnan(surprisal), 0.0, surprisal)
        ok = (~np.isnan(surprisal)).astype(np.float64)
        ssum = np.zeros((B, rec.nbins))
        scnt = np.zeros((B, rec.nbins))
        np.add.at(ssum, (slice(None), binid), s)
        np.add.at(scnt, (slice(None), binid), ok)
        data["binned_surprisal"] = (("batch", "bin"), ssum / scnt)
        for n in _LANE:
            v = rec.lane[n].numpy() / rec.count.numpy()[:, None, None]
            data[n] = (("layer", "channel", "slot"), v.astype(rec.npdt))
    decay = np.stack([rec.static[i][0].numpy() for i in range(nl)])
    pvar = np.stack([rec.static[i][1].numpy() for i in range(nl)])
    lane = ("layer", "channel", "slot")
    data["decay"] = (lane, decay)
    data["process_var"] = (lane, pvar)
    with np.errstate(divide="ignore"):
        data["stationary_precision"] = (lane, (1.0 - decay**2) / pvar)
        data["timescale"] = (lane, -1.0 / np.log(decay))
    floor = [m.process_noise_at_floor().cpu() for m in mods]
    data["process_noise_at_floor"] = (lane, torch.stack(floor).numpy())
    coords = {
        "layer": np.array(chosen),
        "batch": np.arange(B),
        "time": np.arange(L),
        "channel": np.arange(M),
        "slot": np.arange(S),
        "bin": np.arange(rec.nbins) * rec.bin_size,
    }
    if rec.detail is not None:
        d5 = ("layer", "batch", "window", "detail_channel", "slot")
        data.update({n: (d5, rec.detail[n]) for n in _DETAIL_SLOT})
        data.update({n: (d5[:4], rec.detail[n]) for n in _DETAIL_CHANNEL})
        data.update({n: (d5[:3] + ("slot",), rec.detail[n]) for n in ("key", "query")})
        data["output_variance"] = (d5[:3] + ("feature",), rec.detail["output_variance"])
        coords["window"] = np.arange(window[0], window[1])
        coords["detail_channel"] = np.array(channels)
        coords["feature"] = np.arange(D)
    if ids is not None:
        # each row's labels from its tokens alone (the padding is not part of its text)
        text = np.full((B, L), "", dtype=object)
        for b, row in enumerate(ids.tolist()):
            row = row[first[b] : stop[b]]
            if token_text is not None:
                labels = [token_text(int(t)) for t in row]
            elif all(0 <= t < 256 for t in row):  # bytes: a character's label on its first byte
                labels = byte_labels(row)
            else:
                labels = [byte_label(t) if 0 <= t < 256 else str(t) for t in row]
            text[b, first[b] : stop[b]] = labels
        coords["token"] = (("batch", "time"), text)
        coords["token_id"] = (("batch", "time"), ids.numpy())
    ds = xr.Dataset(
        data,
        coords=coords,
        attrs={
            "title": "KLA belief-state inspection",
            "bin_size": rec.bin_size,
            "note": "lanes are (channel, slot) filters; 'text' quantities are relative to the "
            "no-observation baseline from the same starting state (lam = 1); see docs/kla.md",
        },
    )
    for name, desc in _DESCRIPTIONS.items():
        if name in ds:
            ds[name].attrs["description"] = desc
    return ds


def compare(model, text_a, text_b, **kwargs):
    """Inspect two inputs under the same model, as batch elements 0 and 1 (padded to a common
    length and masked); :func:`kalmanscan.kla.plot_comparison` draws their difference.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> ds = compare(m, "for x in y:", "the cat sat", detail=False)
    >>> ds.sizes["batch"], ds.attrs["comparison"]
    (2, 'batch 0 vs batch 1')
    """
    seqs = []
    for name, text in (("text_a", text_a), ("text_b", text_b)):
        try:
            ids, _ = _as_ids(text)
        except (TypeError, ValueError) as err:  # name the input (its message says "text:")
            message = str(err).partition(": ")[2] or str(err)
            raise type(err)(f"{name}: {message}") from None
        if ids.shape[0] != 1:
            raise ValueError(
                f"{name}: expected one text or one id sequence, got a batch of {ids.shape[0]}"
            )
        seqs.append(ids[0])
    tokens = seqs
    if all(isinstance(t, (str, bytes, bytearray)) for t in (text_a, text_b)):
        tokens = [text_a, text_b]
    ds = inspect(model, tokens, **kwargs)
    ds.attrs["comparison"] = "batch 0 vs batch 1"
    return ds


def summarize(ds):
    """Per-layer summary table (a ``pandas.DataFrame``, one row per inspected layer).

    Columns: ``floor_fraction`` (share of lanes whose process noise is at its floor),
    ``timescale_median`` (tokens), ``log10_precision_end`` (lane mean at the last token),
    ``dynamics_share`` (share of that log10 precision the no-observation baseline reaches),
    ``text_log10_precision`` (token mean of ``mean_log10_text_precision``),
    ``information_bits`` and ``write_gain`` (token means of the lane means), and
    ``surprisal_spearman`` (rank correlation of surprisal with ``mean_information_bits``
    over the valid tokens after the first).

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2)))
    >>> list(summarize(inspect(m, "some text here", detail=False)).index)
    [0, 1]
    """
    import pandas as pd

    _check_inspect_dataset(ds)
    rows = []
    mask = np.asarray(ds["mask"].values, dtype=bool)  # (an int8 mask of an older file too)
    last = np.array([np.nonzero(r)[0].max() for r in mask])
    surprisal = ds["surprisal"].values
    for i, layer in enumerate(ds["layer"].values):
        lam = ds["mean_log10_precision"].values[i]
        base = ds["mean_log10_baseline_precision"].values[i]
        if base.ndim == 1:  # one curve for every row, or one per row (rows starting apart)
            base = np.broadcast_to(base, lam.shape)
        end = np.mean([lam[b, last[b]] for b in range(len(last))])
        base_end = np.mean([base[b, last[b]] for b in range(len(last))])
        bits = ds["mean_information_bits"].values[i]
        ok = ~np.isnan(surprisal) & ~np.isnan(bits)
        rho = _spearman(surprisal[ok], bits[ok]) if ok.sum() > 2 else np.nan
        rows.append(
            {
                "layer": layer,
                "floor_fraction": float(ds["process_noise_at_floor"].values[i].mean()),
                "timescale_median": float(np.median(ds["timescale"].values[i])),
                "log10_precision_end": float(end),
                "dynamics_share": float(base_end / end) if end != 0 else np.nan,
                "text_log10_precision": float(np.nanmean(ds["mean_log10_text_precision"][i])),
                "information_bits": float(np.nanmean(bits)),
                "write_gain": float(np.nanmean(ds["mean_write_gain"].values[i])),
                "surprisal_spearman": rho,
            }
        )
    return pd.DataFrame(rows).set_index("layer")


_SUMMARIZED = (
    "mask", "surprisal", "mean_log10_precision", "mean_log10_baseline_precision",
    "mean_information_bits", "mean_log10_text_precision", "mean_write_gain",
    "process_noise_at_floor", "timescale",
)  # fmt: skip


def _check_inspect_dataset(ds) -> None:
    """A ValueError naming ``ds`` unless it holds what :func:`summarize` reads."""
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        raise TypeError(
            f"ds: expected the xarray.Dataset returned by inspect() (or read back from "
            f"save_dataset's file), got {type(ds).__name__}"
        )
    missing = [n for n in _SUMMARIZED if n not in ds.variables]
    if missing or "layer" not in ds.dims:
        raise ValueError(
            f"ds: expected a Dataset returned by inspect() (variables {list(_SUMMARIZED)} "
            f"and a layer axis), got one without {missing or ['the layer axis']}"
        )
    mask = np.asarray(ds["mask"].values)
    if mask.ndim != 2 or not mask.astype(bool).any(axis=1).all():
        raise ValueError(
            f"ds: expected a mask [batch, time] with a token in every row, got one of shape "
            f"{mask.shape} with {int((~mask.astype(bool).any(axis=-1)).sum())} rows without"
        )


def _spearman(x, y) -> float:
    import scipy.stats

    return float(scipy.stats.spearmanr(x, y).statistic)


def save_dataset(ds, path):
    """Write ``ds`` to netCDF at ``path``; returns the engine used. With h5netcdf or netCDF4
    installed: netCDF-4, zlib level 4, chunks of at most 4096 along ``time`` and ``window``;
    otherwise scipy's uncompressed netCDF-3 (the summaries of 100 kB of text are about 10 MB
    there). The boolean variables (``mask``, ``process_noise_at_floor``) read back as bool with
    ``xarray.open_dataset``, with any engine.

    >>> import os, tempfile
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> path = os.path.join(tempfile.mkdtemp(), "inspect.nc")
    >>> save_dataset(inspect(m, "hello", detail=False), path) in ("h5netcdf", "netcdf4", "scipy")
    True
    """
    import importlib.util

    engine = next(
        (e for e, mod in (("h5netcdf", "h5netcdf"), ("netcdf4", "netCDF4"))
         if importlib.util.find_spec(mod)),
        "scipy",
    )  # fmt: skip
    encoding = {}
    if engine != "scipy":
        for name, var in ds.data_vars.items():
            if var.dtype.kind not in "fiub":
                continue
            chunks = tuple(
                min(n, 4096) if d in ("time", "window") else n
                for d, n in zip(var.dims, var.shape, strict=True)
            )
            encoding[name] = {"zlib": True, "complevel": 4, "chunksizes": chunks}
    # bool variables (mask, process_noise_at_floor): xarray stores them as int8 with the
    # attribute dtype="bool" and reads them back as bool (an int8 mask would index by value)
    ds.to_netcdf(path, engine=engine, encoding=encoding)
    return engine
