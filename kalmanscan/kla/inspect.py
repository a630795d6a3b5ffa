"""Belief-state inspection: per-token precisions inside the KLA blocks of a language model.

:func:`inspect` runs the model over the tokens (chunk by chunk, carrying every block's recurrent
state, so memory stays bounded for long inputs), asks each selected KLA block for its trace, and
returns an ``xarray.Dataset``. All filter quantities come from the KLA op itself
(``kla_filter(..., return_precision=True)``); the gates are the ratios that define them:

- ``posterior_precision`` ``lam_t`` and ``information_added`` ``phi_t = Lv_t k_t**2``;
- ``prior_precision`` ``lam_t - phi_t`` (the update step adds ``phi_t`` to the prior);
- ``write_gain`` ``phi_t / lam_t`` in [0, 1] (the Kalman gain times the key) and
  ``forget_gate`` ``decay * prior / lam_t``, so that
  ``mean_t = forget_gate * mean_{t-1} + (k Lv / lam_t) v_t`` (docs/kla.md).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kalmanscan.kla.io import byte_label, encode_text

_SLOT_VARS = (
    "posterior_precision",
    "prior_precision",
    "information_added",
    "write_gain",
    "forget_gate",
)
_CHANNEL_VARS = ("value_precision", "value", "readout_variance", "gated_readout_variance")
_DESCRIPTIONS = {
    "posterior_precision": "filtered precision lam_t of each (channel, slot) lane after token t",
    "prior_precision": "one-step prior precision before token t is observed (lam_t - phi_t)",
    "information_added": "precision added by token t: phi_t = value_precision * key**2",
    "write_gain": "phi_t / lam_t: share of the posterior precision contributed by token t",
    "forget_gate": "decay * prior_precision / posterior_precision: weight on the previous mean",
    "value_precision": "value (observation) precision Lv_t = 1/(softplus(log var) + floor)",
    "value": "value v_t observed by each channel",
    "key": "key k_t (observation loading of each slot)",
    "query": "query q_t (readout weights of each slot)",
    "readout_variance": "sum_s q_s**2 / lam_s, before the gate",
    "gated_readout_variance": "readout variance times act(gate)**2",
    "output_variance": "model-space variance of the mixer output, yvar_gated @ (W_out**2)^T",
    "decay": "discrete decay a of each lane",
    "process_var": "discrete process-noise variance p of each lane",
    "stationary_precision": "(1 - a**2) / p: the precision a lane relaxes to without observations",
    "surprisal": "-log2 p(next token | tokens so far), in bits (NaN at the last position)",
}


def _as_tokens(tokens) -> torch.Tensor:
    if isinstance(tokens, (str, bytes, bytearray)):
        return encode_text(tokens)
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(tokens)
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(
            f"tokens: expected text, bytes or an integer tensor [L] or [B, L], got "
            f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')}"
        )
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(
            f"tokens: expected shape [L] or [B, L] with L >= 1, got {tuple(tokens.shape)}"
        )
    return tokens.long()


def _index_list(name, value, size, default):
    if value is None:
        return list(default)
    if isinstance(value, int):
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
        raise ValueError(f"{name}: expected indices in [0, {size}), got {bad}")
    return out


@torch.no_grad()
def inspect(
    model,
    tokens,
    *,
    layers=None,
    channels=None,
    chunk_size: int = 512,
    token_text=None,
    max_bytes: float = 2**31,
):
    """Per-token belief-state quantities of the KLA blocks of ``model`` as an ``xarray.Dataset``.

    Args:
        model: a :class:`~kalmanscan.kla.KLALanguageModel` (any device; it is not modified).
        tokens: text/bytes (encoded as UTF-8 bytes) or integer ids ``[L]`` or ``[B, L]``.
        layers: block indices to inspect (default: every KLA block).
        channels: channel indices ``m`` to keep (default: all ``M``).
        chunk_size: tokens per forward chunk; the recurrent state carries across chunks, so
            results do not depend on it and peak memory grows with it, not with ``L``.
        token_text: callable ``id -> str`` for the ``token`` coordinate (default: byte labels).
        max_bytes: refuse (ValueError) when the dataset would be larger; select fewer
            layers/channels instead.

    Returns:
        Dataset with dims ``layer, batch, time, channel, slot, feature``; variables
        ``posterior_precision, prior_precision, information_added, write_gain, forget_gate``
        ``[layer,batch,time,channel,slot]``; ``value_precision, value, readout_variance,
        gated_readout_variance`` ``[layer,batch,time,channel]``; ``key, query``
        ``[layer,batch,time,slot]``; ``output_variance`` ``[layer,batch,time,feature]``;
        ``decay, process_var, stationary_precision`` ``[layer,channel,slot]``; ``surprisal``
        ``[batch,time]``; coordinates ``token`` (text) and ``token_id`` ``[batch,time]``.

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> model = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=4)))
    >>> ds = inspect(model, "def f(x):", channels=range(8))
    >>> ds.posterior_precision.dims, ds.posterior_precision.shape
    (('layer', 'batch', 'time', 'channel', 'slot'), (2, 1, 9, 8, 4))
    """
    import xarray as xr

    if not hasattr(model, "kla_blocks"):
        raise TypeError(f"model: expected a KLALanguageModel, got {type(model).__name__}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    kla_blocks = model.kla_blocks
    if not kla_blocks:
        raise ValueError("model: expected at least one KLA block, got only attention blocks")
    layers = _index_list("layers", layers, len(model.blocks), kla_blocks)
    not_kla = [i for i in layers if i not in kla_blocks]
    if not_kla:
        raise ValueError(
            f"layers: expected KLA block indices {kla_blocks}, got non-KLA blocks {not_kla}"
        )
    first = model.blocks[layers[0]].mixer
    M, S, D = first.d_inner, first.d_state, first.d_model
    channels = _index_list("channels", channels, M, range(M))
    tokens_cpu = _as_tokens(tokens)
    if tokens_cpu.min() < 0 or tokens_cpu.max() >= model.config.vocab_size:
        raise ValueError(
            f"tokens: expected ids in [0, {model.config.vocab_size}), got range "
            f"[{int(tokens_cpu.min())}, {int(tokens_cpu.max())}]"
        )
    B, L = tokens_cpu.shape
    nl, C = len(layers), len(channels)
    wide = model.lm_head.weight.dtype == torch.float64
    npdt = np.float64 if wide else np.float32
    size = (
        np.dtype(npdt).itemsize
        * nl
        * B
        * L
        * (len(_SLOT_VARS) * C * S + len(_CHANNEL_VARS) * C + 2 * S + D)
    )
    if size > max_bytes:
        raise ValueError(
            f"layers, channels: the dataset would take {size / 2**30:.2f} GiB > max_bytes="
            f"{max_bytes / 2**30:.2f} GiB for {nl} layers x {C} channels x {L} tokens; "
            "select fewer layers or channels (or raise max_bytes)"
        )

    device = model.lm_head.weight.device
    tok = tokens_cpu.to(device)
    ch = torch.tensor(channels, device=device)
    out = {name: np.empty((nl, B, L, C, S), npdt) for name in _SLOT_VARS}
    out.update({name: np.empty((nl, B, L, C), npdt) for name in _CHANNEL_VARS})
    out.update({name: np.empty((nl, B, L, S), npdt) for name in ("key", "query")})
    out["output_variance"] = np.empty((nl, B, L, D), npdt)
    static = {name: np.empty((nl, C, S), np.float64) for name in ("decay", "process_var")}
    surprisal = np.full((B, L), np.nan, np.float64)

    def put(name, t0, value):
        out[name][:, :, t0 : t0 + value.shape[2]] = (
            value.to(torch.float64 if wide else torch.float32).cpu().numpy()
        )

    state = model.init_state(B, device=device)
    for t0 in range(0, L, chunk_size):
        chunk = tok[:, t0 : t0 + chunk_size]
        trace = {i: [] for i in layers}
        logits, state = model(chunk, state, trace=trace)
        traces = [trace[i][0] for i in layers]
        lam = torch.stack([tr.precision.index_select(2, ch) for tr in traces])
        obs_prec = torch.stack([tr.sensors.obs_prec.index_select(2, ch) for tr in traces])
        key = torch.stack([tr.sensors.k for tr in traces])
        phi = obs_prec[..., None] * key[:, :, :, None, :].square()
        decay = torch.stack([tr.decay.index_select(0, ch) for tr in traces])
        prior = lam - phi
        put("posterior_precision", t0, lam)
        put("prior_precision", t0, prior)
        put("information_added", t0, phi)
        put("write_gain", t0, phi / lam)
        put("forget_gate", t0, decay[:, None, None] * prior / lam)
        put("value_precision", t0, obs_prec)
        put("value", t0, torch.stack([tr.sensors.v.index_select(2, ch) for tr in traces]))
        put("key", t0, key)
        put("query", t0, torch.stack([tr.sensors.q for tr in traces]))
        put("readout_variance", t0, torch.stack([tr.yvar.index_select(2, ch) for tr in traces]))
        put(
            "gated_readout_variance",
            t0,
            torch.stack(
                [
                    (tr.yvar * tr.gate_act.to(tr.yvar.dtype).square()).index_select(2, ch)
                    for tr in traces
                ]
            ),
        )
        put("output_variance", t0, torch.stack([tr.out_var for tr in traces]))
        if t0 == 0:
            static["decay"][:] = decay.double().cpu().numpy()
            static["process_var"][:] = (
                torch.stack([tr.process_var.index_select(0, ch) for tr in traces])
                .double()
                .cpu()
                .numpy()
            )
        logp = torch.log_softmax(logits.double(), dim=-1)
        n = chunk.shape[1]
        targets = tok[:, t0 + 1 : t0 + n + 1]
        m = targets.shape[1]
        bits = -logp[:, :m].gather(-1, targets[..., None])[..., 0] / math.log(2)
        surprisal[:, t0 : t0 + m] = bits.cpu().numpy()
        del trace, traces, lam, obs_prec, key, phi, prior, logits, logp

    label = token_text if token_text is not None else byte_label
    text = np.array([[label(int(t)) for t in row] for row in tokens_cpu.tolist()], dtype=object)
    dims5 = ("layer", "batch", "time", "channel", "slot")
    data = {name: (dims5, out[name]) for name in _SLOT_VARS}
    data.update({name: (dims5[:4], out[name]) for name in _CHANNEL_VARS})
    data.update(
        {name: (("layer", "batch", "time", "slot"), out[name]) for name in ("key", "query")}
    )
    data["output_variance"] = (("layer", "batch", "time", "feature"), out["output_variance"])
    data.update({name: (("layer", "channel", "slot"), static[name]) for name in static})
    data["stationary_precision"] = (
        ("layer", "channel", "slot"),
        (1.0 - static["decay"] ** 2) / static["process_var"],
    )
    data["surprisal"] = (("batch", "time"), surprisal)
    ds = xr.Dataset(
        data,
        coords={
            "layer": np.array(layers),
            "batch": np.arange(B),
            "time": np.arange(L),
            "channel": np.array(channels),
            "slot": np.arange(S),
            "feature": np.arange(D),
            "token": (("batch", "time"), text),
            "token_id": (("batch", "time"), tokens_cpu.numpy()),
        },
        attrs={
            "title": "KLA belief-state inspection",
            "note": "layer = block index; precisions are per (channel, slot) lane; see docs/kla.md",
        },
    )
    for name, desc in _DESCRIPTIONS.items():
        ds[name].attrs["description"] = desc
    return ds
