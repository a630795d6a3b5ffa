"""Plots of a :func:`kalmanscan.kla.inspect` dataset: precision heatmaps over tokens and per-layer
summary curves. Each function takes ``ax=None`` (a new figure) and returns the axes.
"""

from __future__ import annotations

import numpy as np


def _axes(ax, figsize):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize)
    return ax


def _check_var(ds, var):
    if var not in ds.data_vars:
        raise ValueError(f"var: expected one of {sorted(ds.data_vars)}, got {var!r}")


def _token_ticks(ax, ds, batch, max_labels, axis="x"):
    text = ds["token"].isel(batch=batch).values
    n = len(text)
    step = max(1, int(np.ceil(n / max_labels)))
    ticks = np.arange(0, n, step)
    labels = [str(text[i]) for i in ticks]
    if axis == "x":
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=90 if step == 1 else 60, fontsize=7, family="monospace")
    return ax


def _log10(values):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.asarray(values, dtype=np.float64))


def plot_precision(
    ds, var="posterior_precision", *, layer=-1, batch=0, ax=None, max_labels=100, cmap="viridis"
):
    """Heatmap of ``log10(var)`` over channels (rows) and tokens (columns), text on the x axis.

    ``var`` with a ``slot`` axis is averaged over slots in log space (geometric mean).
    ``layer`` is a position in ``ds.layer`` (default: the last inspected KLA block).

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> cfg = ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2))
    >>> ds = inspect(KLALanguageModel(cfg), "abc")
    >>> ax = plot_precision(ds)
    """
    _check_var(ds, var)
    da = ds[var].isel(layer=layer, batch=batch)
    if "time" not in da.dims or "channel" not in da.dims:
        raise ValueError(f"var: expected a variable with time and channel axes, got dims {da.dims}")
    logv = _log10(da.transpose("time", "channel", ...).values)
    if logv.ndim == 3:
        logv = logv.mean(axis=-1)
    ax = _axes(ax, (max(6.0, 0.12 * logv.shape[0]), 4.0))
    im = ax.imshow(logv.T, aspect="auto", origin="lower", interpolation="nearest", cmap=cmap)
    ax.figure.colorbar(
        im, ax=ax, label=f"log10 {var}" + (" (slot mean)" if "slot" in da.dims else "")
    )
    ax.set_ylabel("channel")
    chans = ds["channel"].values
    if len(chans) <= 16:
        ax.set_yticks(np.arange(len(chans)))
        ax.set_yticklabels([str(c) for c in chans])
    ax.set_title(f"{var}, block {int(ds['layer'].values[layer])}")
    return _token_ticks(ax, ds, batch, max_labels)


def plot_layer_summary(ds, var="posterior_precision", *, batch=0, ax=None, max_labels=100):
    """One curve per inspected block: the mean over channels (and slots) of ``log10(var)``
    against the tokens, with a band of plus/minus one standard deviation.

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> cfg = ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2))
    >>> ds = inspect(KLALanguageModel(cfg), "abc")
    >>> ax = plot_layer_summary(ds)
    """
    _check_var(ds, var)
    da = ds[var].isel(batch=batch)
    if "layer" not in da.dims or "time" not in da.dims:
        raise ValueError(f"var: expected a variable with layer and time axes, got dims {da.dims}")
    ax = _axes(ax, (max(6.0, 0.12 * ds.sizes["time"]), 3.5))
    t = np.arange(ds.sizes["time"])
    for i, layer in enumerate(ds["layer"].values):
        values = _log10(da.isel(layer=i).transpose("time", ...).values).reshape(len(t), -1)
        mean, std = values.mean(axis=1), values.std(axis=1)
        (line,) = ax.plot(t, mean, label=f"block {int(layer)}")
        ax.fill_between(t, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_ylabel(f"log10 {var}")
    ax.legend(fontsize=8, loc="best")
    ax.set_xlim(-0.5, len(t) - 0.5)
    return _token_ticks(ax, ds, batch, max_labels)
