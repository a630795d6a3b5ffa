"""Plots of a :func:`kalmanscan.kla.inspect` dataset. Every function takes ``ax=None`` (or
``axes=None``) and returns what it drew on; none calls ``plt.show()``.

The x axis is the token position everywhere. In the multi-panel figures every panel spans the
same width (the curve panels keep a blank margin where the heatmaps have their colorbar) and
averages the same number of tokens per column, so a token sits at the same horizontal place in
each; long inputs are averaged into at most ``max_columns`` columns (readable widths at any
length), and heatmaps carry the surprisal of the same tokens in a strip underneath (undefined
values, such as the first token's, in red). Channels can be sorted by timescale
(``sort_by="timescale"``: the geometric mean over slots of ``-1/ln(decay)``); the y ticks then
name channel ids.
"""

from __future__ import annotations

import numpy as np

_TIME_DIMS = ("window", "time", "bin")
_CHANNEL_DIMS = ("detail_channel", "channel")


def _axes(ax, figsize):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize)
    return ax


def _check_var(ds, var):
    if var not in ds.data_vars:
        raise ValueError(f"var: expected one of {sorted(ds.data_vars)}, got {var!r}")


def _log10(values):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.asarray(values, dtype=np.float64))


def _dim(da, options, what):
    for d in options:
        if d in da.dims:
            return d
    raise ValueError(f"var: expected a variable with a {what} axis {options}, got dims {da.dims}")


# the colorbar of a heatmap, and the blank margin of a curve panel beside it: the same sizes
_CBAR_SIZE = "2%"  # of the panel's width
_CBAR_PAD = 0.1  # inches
_UNDEFINED = "#d62728"  # surprisal strip: no value (the first token, padding), red ("tab:red")


def _position(ds, name, value, dim):
    """``value`` as a position along ``ds[dim]``, else a ValueError naming ``name``."""
    n = ds.sizes[dim]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -n <= value < n:
        held = f" (ds.{dim} holds {ds[dim].values.tolist()})" if dim == "layer" else ""
        raise ValueError(
            f"{name}: expected a position along ds.{dim}, an int in [{-n}, {n}){held}, "
            f"got {value!r}"
        )
    return int(value)


def _colorbar(ax, im, label, divider):
    cax = divider.append_axes("right", size=_CBAR_SIZE, pad=_CBAR_PAD)
    ax.figure.colorbar(im, cax=cax, label=label)
    return cax


def _colorbar_margin(ax):
    """A blank margin the size of a heatmap's colorbar on the right of ``ax``, so that a curve
    panel spans the same x extent as the heatmaps of its figure."""
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    make_axes_locatable(ax).append_axes("right", size=_CBAR_SIZE, pad=_CBAR_PAD).set_axis_off()


def _columns(values, positions, max_columns, factor=None):
    """Average consecutive columns (last axis) so that at most ``max_columns`` remain, or in
    groups of ``factor``. Returns ``(values, left edges, right edge, factor)`` in token
    positions."""
    n = values.shape[-1]
    positions = np.asarray(positions, dtype=np.float64)
    step = positions[1] - positions[0] if n > 1 else 1.0
    f = max(1, int(np.ceil(n / max_columns))) if factor is None else int(factor)
    if f > 1:
        pad = (-n) % f
        v = np.concatenate([values, np.full(values.shape[:-1] + (pad,), np.nan)], axis=-1)
        with np.errstate(invalid="ignore"), _quiet():
            values = np.nanmean(v.reshape(values.shape[:-1] + (-1, f)), axis=-1)
        positions = positions[::f]
    return values, positions, positions[-1] + step * f, f


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def _describe_ids(ids) -> str:
    ids = np.asarray(ids).tolist()
    if ids and ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) > 3:
        return f"{ids[0]}..{ids[-1]}"
    if len(ids) > 20:
        return f"{ids[:10]} ... ({len(ids)} ids)"
    return str(ids)


def _check_channels(channels, available, dim: str) -> np.ndarray:
    """``channels`` as an array of ids, each one of ``available`` (the ids along ``ds[dim]``),
    else a ValueError naming ``channels``, the ids available and those that are not."""
    if isinstance(channels, (str, bytes)) or not np.iterable(channels):
        raise ValueError(
            f"channels: expected None or a sequence of channel ids from ds.{dim} "
            f"({_describe_ids(available)}), got {channels!r}"
        )
    ids = np.asarray(list(channels))
    if ids.size == 0 or ids.ndim != 1:
        raise ValueError(
            f"channels: expected at least one channel id from ds.{dim} "
            f"({_describe_ids(available)}), got {channels!r}"
        )
    have = set(np.asarray(available).tolist())
    missing = [c for c in ids.tolist() if c not in have]
    if missing:
        raise ValueError(
            f"channels: expected ids from ds.{dim} ({_describe_ids(available)}), got "
            f"{missing[0] if len(missing) == 1 else missing} (not among them)"
            + (" (inspect(..., channels=...) keeps per-lane detail only for the channels it "
               "was given)" if dim == "detail_channel" else "")
        )  # fmt: skip
    return ids


def channel_order(ds, layer=-1, channels=None, sort_by="timescale"):
    """Channel ids (from ``channels``, default all of ``ds.channel``) in plotting order:
    by increasing timescale (geometric mean over slots of ``ds.timescale``) of KLA block
    ``layer``, or as given (``sort_by=None``). An id not in ``ds.channel``: a ValueError naming
    ``channels``.

    >>> import numpy as np
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> m = KLALanguageModel(ModelConfig(d_model=8, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> ds = inspect(m, "hi", detail=False)
    >>> ids = channel_order(ds)
    >>> ts = np.exp(np.log(ds.timescale.isel(layer=-1)).mean("slot")).sel(channel=ids).values
    >>> sorted(ids.tolist()) == ds.channel.values.tolist(), bool((np.diff(ts) >= 0).all())
    (True, True)
    >>> channel_order(ds, channels=[3, 1], sort_by=None).tolist()
    [3, 1]
    """
    if channels is None:
        ids = np.asarray(ds["channel"].values)
    else:
        ids = _check_channels(channels, ds["channel"].values, "channel")
    if sort_by is None:
        return ids
    if sort_by != "timescale":
        raise ValueError(f"sort_by: expected 'timescale' or None, got {sort_by!r}")
    layer = _position(ds, "layer", layer, "layer")
    ts = ds["timescale"].isel(layer=layer).sel(channel=ids).values
    return ids[np.argsort(np.exp(np.mean(np.log(ts), axis=-1)), kind="stable")]


def _surprisal_strip(ax, ds, batch, dim, positions_sel, max_columns, divider):
    import matplotlib

    if dim == "bin":
        s = ds["binned_surprisal"].isel(batch=batch).values
        pos = ds["bin"].values
    else:
        s = ds["surprisal"].isel(batch=batch).sel(time=positions_sel).values
        pos = positions_sel
    s, left, right, _ = _columns(s[None], pos, max_columns)
    sax = divider.append_axes("bottom", size="18%", pad=0.08, sharex=ax)
    cmap = matplotlib.colormaps["Greys"].with_extremes(bad=_UNDEFINED)
    finite = s[np.isfinite(s)]
    sax.imshow(
        np.ma.masked_invalid(s), aspect="auto", interpolation="nearest", cmap=cmap,
        vmin=0.0, vmax=finite.max() if finite.size else 1.0, extent=(left[0], right, 0, 1),
    )  # fmt: skip
    sax.set_yticks([])
    if finite.size:
        label = f"surprisal\n0-{_bits(finite.max())} bits"
        label += "\nred: none" if finite.size < s.size else ""
    else:  # one token: nothing predicted
        label = "surprisal\nred: none"
    sax.set_ylabel(label, fontsize=6, rotation=0, ha="right", va="center")
    ax.tick_params(labelbottom=False)
    return sax


def _bits(value) -> str:
    """A scale's top in bits: two significant digits (``0.07``, ``8.5``), whole bits from 10."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _channel_ticks(ax, ids, sort_by):
    """Y ticks naming the channel ids of the rows (every row up to 24 rows)."""
    n = len(ids)
    ax.set_ylabel("channel" + (" (rows by timescale)" if sort_by else ""))
    if n > 24 and np.array_equal(ids, np.arange(n)):
        return  # rows are the ids: matplotlib's ticks name them
    rows = np.arange(n) if n <= 24 else np.unique(np.linspace(0, n - 1, 9).round().astype(int))
    ax.set_yticks(rows)
    ax.set_yticklabels([str(c) for c in np.asarray(ids)[rows]], fontsize=7)


def _token_ticks(ax, ds, batch, positions, factor, max_labels):
    if "token" not in ds.coords or factor > 1 or len(positions) > max_labels:
        ax.set_xlabel("token position")
        return
    text = ds["token"].isel(batch=batch).sel(time=positions).values
    ax.set_xticks(np.asarray(positions, dtype=float) + 0.5)
    from kalmanscan.plot import drawable_text

    labels, families = drawable_text(text, "monospace")
    # each label horizontal where it fits in its column, else vertical; a vertical label longer
    # than _TALL characters (a code point such as U+6771, for a character no font has) in a
    # smaller font, so that no label pushes the axis label into the panel below
    column = _axes_width_points(ax) / max(len(labels), 1)
    ticks = ax.set_xticklabels(labels, fontsize=_TOKEN_FONT, family=families)
    # (the labels matplotlib made: on axes that share x with others, those of the ticks in view)
    for tick in ticks:
        label = tick.get_text()
        if _label_width(label) > column - _LABEL_GAP:
            tick.set_rotation(90)
            if len(label) > _TALL:
                tick.set_fontsize(max(_SMALLEST, _TOKEN_FONT * _TALL / len(label)))
    ax.set_xlabel(f"tokens at positions {int(positions[0])}–{int(positions[-1])}", fontsize=8)


_TOKEN_FONT = 7.0  # points: token labels
_CHAR_WIDTH = 0.62  # a monospace character's advance, in units of the font size
_LABEL_GAP = 1.5  # points between horizontal labels
_TALL = 5  # characters: a vertical label longer than this is drawn smaller, as tall as _TALL
_SMALLEST = 4.5  # points: the smallest font of such a label


def _label_width(label: str) -> float:
    """The width of a token label at ``_TOKEN_FONT`` in points: a monospace advance per
    character, a full em for a wide one (CJK, emoji)."""
    import unicodedata

    ems = sum(1.0 if unicodedata.east_asian_width(c) in "WF" else _CHAR_WIDTH for c in label)
    return ems * _TOKEN_FONT


def _axes_width_points(ax) -> float:
    """The drawn width of ``ax`` in points (the divider of a heatmap, which gives part of the
    width to the colorbar, places its axes at draw time: their share is taken off here)."""
    fig = ax.figure
    box = ax.get_position()
    locator = ax.get_axes_locator()
    get_renderer = getattr(fig.canvas, "get_renderer", None)
    if locator is not None and get_renderer is not None:  # placed by make_axes_locatable
        try:
            box = locator(ax, get_renderer())
        except (TypeError, ValueError, AttributeError):  # a backend without a renderer yet
            pass
    return box.width * fig.get_figwidth() * 72.0


def plot_precision(
    ds,
    var="posterior_precision",
    *,
    layer=-1,
    batch=0,
    relative_to=None,
    sort_by=None,
    channels=None,
    ax=None,
    surprisal=True,
    max_columns=1500,
    max_labels=100,
    cmap="viridis",
):
    """Heatmap over channels (rows) and tokens (columns) of one layer.

    Per-lane detail variables (``posterior_precision``, ``write_gain``, ...) are shown as
    ``log10``, averaged over slots (a geometric mean); ``relative_to="baseline"`` divides by
    the no-observation baseline first (what the text added), ``"rest"`` by the resting
    precision. Binned channel views (``binned_log10_text_precision``,
    ``binned_information_bits``) are shown as they are. ``sort_by="timescale"`` orders the
    rows from short to long memory; ``channels`` selects rows (ids along the variable's
    channel axis, ``ds.detail_channel`` for per-lane variables; any other id: a ValueError
    naming ``channels``). ``layer`` is a position in ``ds.layer``. A strip of surprisal for
    the same tokens is drawn underneath.

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> cfg = ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2))
    >>> ds = inspect(KLALanguageModel(cfg), "abc")
    >>> ax = plot_precision(ds, relative_to="baseline", sort_by="timescale")
    """
    _check_var(ds, var)
    layer = _position(ds, "layer", layer, "layer")
    batch = _position(ds, "batch", batch, "batch")
    if "layer" not in ds[var].dims or "batch" not in ds[var].dims:
        raise ValueError(f"var: expected a variable with layer and batch axes, got {var!r}")
    da = ds[var].isel(layer=layer, batch=batch)
    tdim = _dim(da, _TIME_DIMS, "time")
    cdim = _dim(da, _CHANNEL_DIMS, "channel")
    if relative_to not in (None, "baseline", "rest"):
        raise ValueError(f"relative_to: expected None, 'baseline' or 'rest', got {relative_to!r}")
    if relative_to is not None and "slot" not in da.dims:
        raise ValueError(
            f"relative_to: expected a per-lane precision (dims with 'slot'), got {var!r}"
        )
    if channels is not None:
        channels = _check_channels(channels, da[cdim].values, cdim)
    ids = channel_order(ds, layer, da[cdim].values if channels is None else channels, sort_by)
    da = da.sel({cdim: ids})
    binned = var.startswith("binned_")
    if binned:
        values = da.transpose(cdim, tdim).values.astype(np.float64)
        label = var
        if var == "binned_information_bits":  # spans orders of magnitude
            values, label = _log10(values), f"log10 {var}"
    else:
        values = da.transpose(cdim, tdim, ...).values.astype(np.float64)
        label = f"log10 {var}"
        if relative_to == "baseline":
            base = ds["baseline_precision"].isel(layer=layer, batch=batch).sel({cdim: ids})
            values = values / base.transpose(cdim, tdim, ...).values
            label += " / baseline"
        elif relative_to == "rest":
            rest = ds["stationary_precision"].isel(layer=layer).sel(channel=ids).values
            values = values / rest[:, None, :]
            label += " / resting"
        values = _log10(values)
        if values.ndim == 3:
            values = values.mean(axis=-1)
            label += " (slot mean)"
    positions = da[tdim].values
    values, left, right, factor = _columns(values, positions, max_columns)
    ax = _axes(ax, (12.0, 4.0))
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    divider = make_axes_locatable(ax)  # colorbar on the right, surprisal strip underneath
    im = ax.imshow(
        values, aspect="auto", origin="lower", interpolation="nearest", cmap=cmap,
        extent=(left[0], right, -0.5, len(ids) - 0.5),
    )  # fmt: skip
    _colorbar(ax, im, label, divider)
    _channel_ticks(ax, ids, sort_by)
    title = f"{var}, layer {ds['layer'].values[layer]}"
    if tdim == "window":
        title += f", tokens {int(positions[0])}–{int(positions[-1])}"
    size = factor * (int(ds.attrs.get("bin_size", 1)) if tdim == "bin" else 1)
    if size > 1:
        title += f" (columns: means over {size} tokens)"
    ax.set_title(title, fontsize=9)
    target = ax
    if surprisal and "surprisal" in ds:
        target = _surprisal_strip(ax, ds, batch, tdim, positions, max_columns, divider)
    per_column = factor * (int(ds.attrs.get("bin_size", 1)) if tdim == "bin" else 1)
    _token_ticks(target, ds, batch, left.astype(int), per_column, max_labels)
    return ax


# A curve of at most this many points draws a marker at each: one point (a one-token text) is
# invisible as a line, a few are easy to misread. Longer curves mark their isolated points only
# (a finite value between undefined ones, such as the second token's surprisal).
_MARKED_POINTS = 16


def _plot_curve(ax, x, y, **kwargs):
    """``ax.plot(x, y, **kwargs)`` with markers where a line alone would not show the data:
    at every point of a short curve, at isolated finite points of a long one."""
    y = np.asarray(y, dtype=np.float64)
    finite = np.isfinite(y)
    if len(y) <= _MARKED_POINTS:
        marks = finite
    else:
        left = np.concatenate(([False], finite[:-1]))
        right = np.concatenate((finite[1:], [False]))
        marks = finite & ~left & ~right
    if marks.any():
        ms = kwargs.pop("ms", 3.0)
        kwargs.update(marker="o", ms=ms, markevery=np.flatnonzero(marks).tolist())
    (line,) = ax.plot(x, y, **kwargs)
    return line


def _note_if_empty(ax, values, note):
    """``note`` in the middle of ``ax`` when ``values`` hold no finite number (nothing drawn)."""
    if not np.isfinite(np.asarray(values, dtype=np.float64)).any():
        ax.text(
            0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center",
            fontsize=8, color="0.4",
        )  # fmt: skip


def _curve(values, positions, max_columns, factor=None):
    values = np.asarray(values, dtype=np.float64)[None]
    v, left, right, f = _columns(values, positions, max_columns, factor)
    step = (right - left[0]) / len(left)
    return left + step / 2, v[0], f


def plot_layer_summary(
    ds,
    var="mean_log10_text_precision",
    *,
    batch=0,
    ax=None,
    max_columns=1500,
    max_labels=100,
):
    """One curve per inspected layer against the token position.

    Summaries over lanes (``mean_log10_text_precision``, ``mean_information_bits``,
    ``mean_write_gain``, ...) are drawn as they are; per-lane detail variables as the mean of
    ``log10`` over channels and slots with a band of plus/minus one standard deviation. Long
    inputs are averaged into at most ``max_columns`` points.

    >>> import torch
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> cfg = ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2))
    >>> ds = inspect(KLALanguageModel(cfg), "abc")
    >>> ax = plot_layer_summary(ds)
    """
    _check_var(ds, var)
    batch = _position(ds, "batch", batch, "batch")
    da = ds[var]
    if "batch" in da.dims:
        da = da.isel(batch=batch)
    tdim = _dim(da, _TIME_DIMS, "time")
    if "layer" not in da.dims:
        raise ValueError(f"var: expected a variable with a layer axis, got dims {da.dims}")
    positions = da[tdim].values
    ax = _axes(ax, (12.0, 3.5))
    f = 1
    for i, layer in enumerate(ds["layer"].values):
        vals = da.isel(layer=i).transpose(tdim, ...).values.astype(np.float64)
        if vals.ndim == 1:
            x, mean, f = _curve(vals, positions, max_columns)
            _plot_curve(ax, x, mean, lw=1.0, label=f"layer {layer}")
            continue
        logv = _log10(vals).reshape(len(positions), -1)
        with _quiet():
            x, mean, f = _curve(np.nanmean(logv, axis=1), positions, max_columns)
            _, std, _ = _curve(np.nanstd(logv, axis=1), positions, max_columns)
        line = _plot_curve(ax, x, mean, lw=1.0, label=f"layer {layer}")
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_ylabel(var if var.startswith("mean_") else f"log10 {var}", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    if f > 1:
        ax.set_title(f"{var} (means over {f} tokens)", fontsize=9)
    _token_ticks(ax, ds, batch, positions, f, max_labels)
    return ax


def _whole_decades(ax, values) -> None:
    """On a log y axis, data spanning less than a decade (one token, or a flat curve) gets
    limits at the powers of ten around it, labelled there only: left to itself matplotlib
    labels such a range with long minor-tick labels (``1.065x10^-1``) that push the axis label
    off the figure."""
    import matplotlib.ticker

    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0 or np.log10(v.max() / v.min()) >= 1.0:
        return
    lo, hi = np.floor(np.log10(v.min())), np.ceil(np.log10(v.max()))
    ax.set_ylim(10.0**lo, 10.0 ** max(hi, lo + 1.0))
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10.0))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _tokens_per_column(ds, max_columns):
    """Tokens per column of the binned heatmaps (the curves of a figure average as many)."""
    return int(ds.attrs.get("bin_size", 1)) * max(1, int(np.ceil(ds.sizes["bin"] / max_columns)))


def plot_comparison(ds, var="mean_log10_text_precision", *, layer=-1, axes=None, max_columns=1500):
    """Two inputs of one model (batch 0 and 1, e.g. from :func:`kalmanscan.kla.compare`):
    (1) the difference of ``binned_log10_text_precision`` per channel (0 minus 1, channels by
    timescale), (2) ``var`` of both for one layer, (3) their difference, (4) the surprisal of
    both. Positions where either input has no token are blank. Every panel spans the same x
    extent and averages the same tokens per column. ``layer`` is a position in ``ds.layer``.
    Returns the four axes.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> from kalmanscan.kla import compare
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> axes = plot_comparison(compare(m, "for x in y:", "the cat", detail=False))
    """
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    _check_var(ds, var)
    layer = _position(ds, "layer", layer, "layer")
    if ds.sizes["batch"] < 2:
        raise ValueError(f"ds: expected two batch elements to compare, got {ds.sizes['batch']}")
    if axes is None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(4, 1, figsize=(12, 10), gridspec_kw={"hspace": 0.3})
        fig.subplots_adjust(left=0.08, right=0.93, top=0.96, bottom=0.06)
    ids = channel_order(ds, layer)
    heat = ds["binned_log10_text_precision"].isel(layer=layer).sel(channel=ids)
    diff = (heat.isel(batch=0) - heat.isel(batch=1)).transpose("channel", "bin").values
    vals, left, right, f = _columns(diff, ds["bin"].values, max_columns)
    per_column = _tokens_per_column(ds, max_columns)
    lim = np.nanmax(np.abs(vals)) if np.isfinite(vals).any() else 1.0
    im = axes[0].imshow(
        vals, aspect="auto", origin="lower", interpolation="nearest", cmap="RdBu_r",
        vmin=-lim, vmax=lim, extent=(left[0], right, -0.5, len(ids) - 0.5),
    )  # fmt: skip
    _colorbar(axes[0], im, "log10 text precision, 0 - 1", make_axes_locatable(axes[0]))
    _channel_ticks(axes[0], ids, "timescale")
    name = ds["layer"].values[layer]
    title = f"layer {name}: what input 0 added minus what input 1 added"
    if per_column > 1:
        title += f" (columns and points: means over {per_column} tokens)"
    axes[0].set_title(title, fontsize=9)
    da = ds[var].isel(layer=layer) if "layer" in ds[var].dims else ds[var]
    pos = ds["time"].values
    both = ds["mask"].isel(batch=0).values & ds["mask"].isel(batch=1).values
    curves = []
    for b in (0, 1):
        x, y, _ = _curve(da.isel(batch=b).values, pos, max_columns, per_column)
        _plot_curve(axes[1], x, y, lw=1.0, label=f"input {b}")
        curves.append(np.where(both, da.isel(batch=b).values, np.nan))
    axes[1].set_ylabel(var, fontsize=8)
    axes[1].legend(fontsize=7)
    x, d, _ = _curve(curves[0] - curves[1], pos, max_columns, per_column)
    _plot_curve(axes[2], x, d, lw=1.0, color="k")
    _note_if_empty(axes[2], d, "nothing to draw (no position where both inputs have a token)")
    axes[2].axhline(0.0, color="0.6", lw=0.5)
    axes[2].set_ylabel("input 0 - input 1", fontsize=8)
    for b in (0, 1):
        x, s, _ = _curve(ds["surprisal"].isel(batch=b).values, pos, max_columns, per_column)
        _plot_curve(axes[3], x, s, lw=0.8, label=f"input {b}")
    axes[3].set_ylabel("surprisal (bits)", fontsize=8)
    axes[3].set_xlabel("token position")
    axes[3].legend(fontsize=7)
    for ax in axes[1:]:
        _colorbar_margin(ax)
        ax.set_xlim(axes[0].get_xlim())
    return axes


def plot_overview(ds, *, layer=-1, batch=0, axes=None, max_columns=1500):
    """The figure of ``kalmanscan inspect``: (1) what the text added to each channel's
    precision (``binned_log10_text_precision``, channels by timescale) with the surprisal
    underneath, (2) the bits each channel was told (``binned_information_bits``), (3) per
    layer the mean log10 precision (solid) and the no-observation baseline (dashed), (4) per
    layer the bits told per lane and token, (5) the surprisal. Every panel spans the same x
    extent and averages the same tokens per column. ``layer`` (the heatmaps') is a position in
    ``ds.layer``. Returns the five axes.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig, inspect
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2)))
    >>> axes = plot_overview(inspect(m, "some text", detail=False))
    """
    layer = _position(ds, "layer", layer, "layer")
    batch = _position(ds, "batch", batch, "batch")
    if axes is None:
        import matplotlib.pyplot as plt

        # (no constrained layout: it does not place the appended surprisal strips)
        fig, axes = plt.subplots(
            5, 1, figsize=(12, 15),
            gridspec_kw={"height_ratios": [3, 3, 2, 2, 1.2], "hspace": 0.45},
        )  # fmt: skip
        fig.subplots_adjust(left=0.08, right=0.93, top=0.97, bottom=0.04)
    plot_precision(
        ds, "binned_log10_text_precision", layer=layer, batch=batch, sort_by="timescale",
        ax=axes[0], max_columns=max_columns, cmap="viridis",
    )  # fmt: skip
    plot_precision(
        ds, "binned_information_bits", layer=layer, batch=batch, sort_by="timescale",
        ax=axes[1], max_columns=max_columns, cmap="magma", surprisal=False,
    )  # fmt: skip
    f = _tokens_per_column(ds, max_columns)
    pos = ds["time"].values
    told = []
    for i, name in enumerate(ds["layer"].values):
        x, y, _ = _curve(ds["mean_log10_precision"].isel(layer=i, batch=batch), pos, 0, f)
        line = _plot_curve(axes[2], x, y, lw=1.0, label=f"layer {name}")
        base = ds["mean_log10_baseline_precision"].isel(layer=i)
        if "batch" in base.dims:  # rows starting at different positions: one curve per row
            base = base.isel(batch=batch)
        x, y, _ = _curve(base, pos, 0, f)
        _plot_curve(axes[2], x, y, lw=0.8, ls="--", color=line.get_color(), mfc="none")
        x, y, _ = _curve(ds["mean_information_bits"].isel(layer=i, batch=batch), pos, 0, f)
        _plot_curve(axes[3], x, y, lw=0.8, color=line.get_color(), label=f"layer {name}")
        told.append(y)
    axes[2].set_ylabel("mean log10 precision\n(dashed: no observations)", fontsize=8)
    axes[2].legend(fontsize=7, ncol=4)
    axes[3].set_ylabel("bits told per lane", fontsize=8)
    axes[3].set_yscale("log")
    _whole_decades(axes[3], np.concatenate(told))
    x, s, _ = _curve(ds["surprisal"].isel(batch=batch), pos, 0, f)
    _plot_curve(axes[4], x, s, lw=0.6, color="k")
    _note_if_empty(axes[4], s, "no surprisal to draw (the first token has none)")
    axes[4].set_ylabel("surprisal\n(bits)", fontsize=8)
    axes[4].set_xlabel(
        "token position" + (f" (columns and points: means over {f} tokens)" if f > 1 else "")
    )
    for ax in axes[2:]:
        _colorbar_margin(ax)
        ax.set_xlim(axes[0].get_xlim())
    return axes
