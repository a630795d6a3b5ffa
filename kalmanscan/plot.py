"""matplotlib helpers for filtered/smoothed series with uncertainty bands.

Every function takes ``ax=None`` (a new figure) or an axes to draw on and returns the axes; none
calls ``plt.show()``. Inputs are the Datasets of :mod:`kalmanscan.xarray` (``OUFit.to_dataset()``,
``da.kalman.filter(...)``) or, for :func:`plot_bands`, plain arrays.

>>> import numpy as np, kalmanscan as ks
>>> from kalmanscan.timeseries import load_nile
>>> from kalmanscan.plot import plot_overview
>>> years, flow = load_nile()
>>> ds = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).to_dataset(forecast_steps=10)
>>> axes = plot_overview(ds)
>>> len(axes)
2
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["plot_bands", "plot_series", "plot_precision", "plot_overview"]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _clamp_dates(ax) -> None:
    """Keep a date axis inside matplotlib's years 1-9999: its autoscale margins (5 % of the span)
    pass them for a record that starts or ends near them, and its tick labels then fail. Shared
    axes follow."""
    import matplotlib.dates as mdates

    # (matplotlib's date converters: DateConverter, ConciseDateConverter, a private switcher)
    if "date" not in type(ax.xaxis.get_converter()).__name__.lower():
        return
    lo, hi = ax.get_xlim()
    first = mdates.date2num(np.datetime64("0001-01-01"))
    last = mdates.date2num(np.datetime64("9999-12-31"))
    if lo < first or hi > last:
        ax.set_xlim(max(lo, first), min(hi, last))


def _log_span_at_least(ax) -> None:
    """A log y axis spanning at least a factor of 3 around its curves. matplotlib scales a curve
    that is constant up to rounding (the precision at ``1 / obs_var`` of a fit on its bound 0,
    equal to a few ulps) to a span of a few ulps: no tick falls in it and the panel draws empty.
    A factor of 3 always holds one of the ticks ``1, 2, ..., 9 x 10^k``, which matplotlib labels
    on an axis spanning less than a decade."""
    ys = [np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.get_lines()]
    ys = np.concatenate([y[np.isfinite(y) & (y > 0)] for y in ys]) if ys else np.empty(0)
    if not ys.size:
        return
    lo, hi = float(ys.min()), float(ys.max())
    if hi < 3.0 * lo:
        mid = np.sqrt(lo) * np.sqrt(hi)  # (no overflow near the float64 range's ends)
        ax.set_ylim(mid / np.sqrt(3.0), mid * np.sqrt(3.0))


def _font_of(family) -> object:
    """The font matplotlib draws ``family`` with (its first family that resolves)."""
    from matplotlib import font_manager

    props = font_manager.FontProperties(family=[family])  # (a lone str is read as a pattern)
    return font_manager.get_font(font_manager.findfont(props))


@functools.lru_cache(maxsize=64)
def _fallback_font(chars: frozenset) -> tuple[str | None, frozenset]:
    """``(name, drawn)``: the installed font that draws the most of ``chars`` (all of them where
    one does; ``None`` where none draws any) and the characters it draws. matplotlib's own
    "Last Resort" font is left out: it draws a placeholder box for every character."""
    from matplotlib import font_manager

    best, drawn = None, frozenset()
    for entry in font_manager.fontManager.ttflist:
        if entry.name.startswith("Last Resort"):
            continue
        try:
            font = font_manager.get_font(entry.fname)
        except (OSError, RuntimeError):  # (an unreadable font file)
            continue
        has = frozenset(c for c in chars if font.get_char_index(ord(c)))
        if len(has) > len(drawn):
            best, drawn = entry.name, has
            if has == chars:
                break
    return best, drawn


def drawable_text(texts, family="sans-serif"):
    """``(texts, families)`` for drawing ``texts`` in ``family``: where its font lacks a
    character (CJK in matplotlib's default DejaVu fonts) the installed font that has it is
    added after ``family`` (matplotlib falls back to it glyph by glyph), and a character no
    installed font has is written as its code point (``U+732B``) instead of an empty box and a
    warning a glyph.

    >>> drawable_text(["a", "é", "␣"], "monospace")
    (['a', 'é', '␣'], ['monospace'])
    """
    texts = [str(t) for t in texts]
    families = [family] if isinstance(family, str) else list(family)
    chars = {c for t in texts for c in t if not c.isascii()}
    if not chars:
        return texts, families
    font = _font_of(families[0])
    missing = frozenset(c for c in chars if c.isprintable() and not font.get_char_index(ord(c)))
    if not missing:
        return texts, families
    name, drawn = _fallback_font(missing)
    if name is not None and name not in families:
        families = families + [name]
    lost = missing - drawn
    if lost:
        texts = ["".join(f"U+{ord(c):04X}" if c in lost else c for c in t) for t in texts]
    return texts, families


def make_drawable(artist) -> None:
    """Every text of ``artist`` (a figure, or one axes: its title, legend entries and axis labels)
    made drawable by :func:`drawable_text`. (Tick labels are redrawn from their formatters: fixed
    ones are made drawable where they are set.)

    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> _ = ax.set_title("level (series=Höhe)")
    >>> make_drawable(ax)
    >>> ax.get_title()
    'level (series=Höhe)'
    >>> plt.close(fig)
    """
    from matplotlib.text import Text

    for text in artist.findobj(Text):
        value = text.get_text()
        if not value or value.isascii():
            continue
        (new,), families = drawable_text([value], text.get_fontfamily())
        if new != value:
            text.set_text(new)
        if families != list(text.get_fontfamily()):
            text.set_fontfamily(families)


def _quantile(c: float) -> float:
    from kalmanscan.timeseries.coverage import normal_quantile

    return normal_quantile(c)


def _missing_spans(times, observed, gap_factor: float = 10.0, nan_runs: bool = True):
    """``[(start, end)]`` to shade: runs of NaN in ``observed`` (padded to midpoints with the
    neighbours; skipped if ``nan_runs`` is False) and stretches between consecutive observations
    longer than ``gap_factor`` times the median spacing of the observations (``None``: none).
    """
    times = _as_span_times(times)
    nan = np.isnan(observed)
    spans = []
    T = len(times)
    i = 0
    while nan_runs and i < T:
        if not nan[i]:
            i += 1
            continue
        j = i
        while j + 1 < T and nan[j + 1]:
            j += 1
        start = times[i] - (times[i] - times[i - 1]) / 2 if i > 0 else times[i]
        end = times[j] + (times[j + 1] - times[j]) / 2 if j + 1 < T else times[j]
        spans.append((start, end))
        i = j + 1
    obs_t = np.asarray(times)[~nan]
    if gap_factor is not None and len(obs_t) >= 3:
        d = np.diff(obs_t)
        d = d / np.timedelta64(1, "s") if d.dtype.kind == "m" else d.astype(np.float64)
        med = float(np.median(d))
        if med > 0:
            for k in np.flatnonzero(d > gap_factor * med):
                a, b = obs_t[k], obs_t[k + 1]
                if not any(s <= a and b <= e for s, e in spans):
                    spans.append((a, b))
    return sorted(spans, key=lambda se: se[0])


# Longer series are drawn from per-stretch extremes: a 10-inch axes at 110 dpi is about 1,000
# pixels wide, so each of 2,000 stretches is half a pixel and its first, lowest, highest and last
# points draw the lines and bands that all of its points would (data markers add an even sample).
# A million points otherwise took ~40 s to save (their markers, and the legend's placement
# testing each vertex).
DRAW_MAX = 10_000
_STRETCHES = 2_000


def _draw_index(n: int, *ys, spread: bool = False):
    """Which of ``n`` points to draw: all where ``n <= DRAW_MAX``, else for each of 2,000
    contiguous stretches its first and last point and the points where each of ``ys`` is lowest
    and highest (NaN ignored; a stretch of NaN keeps its first and last), in time order.
    ``spread`` adds every k-th point (``DRAW_MAX`` of them), for markers: a cloud of data keeps
    its inside as well as its edges.

    >>> y = np.sin(np.arange(50_000.0))
    >>> i = _draw_index(50_000, y)
    >>> len(i) <= 8_000, bool(y[i].min() == y.min()), bool(y[i].max() == y.max())
    (True, True, True)
    >>> int(i[0]), int(i[-1])
    (0, 49999)
    """
    if n <= DRAW_MAX:
        return np.arange(n)
    edges = np.linspace(0, n, _STRETCHES + 1).astype(np.int64)
    starts = edges[:-1]
    stretch = np.repeat(np.arange(_STRETCHES), np.diff(edges))
    keep = [starts, edges[1:] - 1]
    if spread:
        keep.append(np.arange(0, n, -(-n // DRAW_MAX)))
    for y in ys:
        y = np.asarray(y, dtype=np.float64)
        nan = np.isnan(y)
        for v, reduce in (
            (np.where(nan, np.inf, y), np.minimum),
            (np.where(nan, -np.inf, y), np.maximum),
        ):
            hit = np.flatnonzero(v == reduce.reduceat(v, starts)[stretch])
            keep.append(hit[np.unique(stretch[hit], return_index=True)[1]])
    return np.unique(np.concatenate(keep))


def _shade_missing(ax, times, observed, show_missing, label: str, breaks=None) -> None:
    """Grey spans over the missing stretches of ``observed`` (``show_missing="gaps"``: only the
    long gaps between observations), the first one labelled. The stretches between rows where
    ``breaks`` is True (:func:`_row_breaks`: nothing was computed there, so nothing is drawn)
    are hatched and labelled as such."""
    spans = _missing_spans(times, observed, nan_runs=show_missing != "gaps")
    rowless = []
    if breaks is not None:
        t = _as_span_times(times)
        rowless = [(t[j], t[j + 1]) for j in np.flatnonzero(breaks)]
    skip = set(rowless)
    spans = [se for se in spans if se not in skip]
    merged = []  # (overlapping spans as one: a NaN run's and its gap's drew darker edges)
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    if len(merged) > _MANY_SPANS:
        # one artist for them all: an axvspan each took 83 s for the 21,000 runs of 100,000
        # hourly rows with 30 % missing at random (making and drawing the patches)
        x0 = [a for a, _ in merged]
        ax.broken_barh(
            list(zip(x0, [b - a for a, b in merged], strict=True)),
            (0, 1),
            transform=ax.get_xaxis_transform(),
            color="0.85",
            alpha=0.6,
            lw=0,
            label=label,
            zorder=0,
        )
        merged = []
    for k, (a, b) in enumerate(merged):
        ax.axvspan(a, b, color="0.85", alpha=0.6, lw=0, label=label if k == 0 else None, zorder=0)
    for k, (a, b) in enumerate(rowless):
        ax.axvspan(
            a,
            b,
            facecolor="0.85",
            edgecolor="0.6",
            hatch="//",
            alpha=0.6,
            lw=0,
            label=_NOT_EVALUATED if k == 0 else None,
            zorder=0,
        )


_MANY_SPANS = 50  # above this many grey spans, one collection draws them
# the legend entry of a stretch without rows, where no band is drawn
_NOT_EVALUATED = "no rows: not evaluated"
GAP_FACTOR = 10.0  # (a stretch over 10x the median spacing of the observations is a gap)


def _as_span_times(times) -> np.ndarray:
    """``times`` as :func:`_missing_spans` measures them: datetimes in seconds at least, so
    midpoints are exact; never nanoseconds, whose range ends at 1677 and 2262 (years 1-9999 fit
    in datetime64[s])."""
    times = np.asarray(times)
    coarse = ("Y", "M", "W", "D", "h", "m")
    if times.dtype.kind == "M" and np.datetime_data(times.dtype)[0] in coarse:
        return times.astype("datetime64[s]")
    return times


def _row_breaks(times, observed=None, gap_factor: float = GAP_FACTOR) -> np.ndarray:
    """``[T - 1]`` bool: True where two consecutive rows are further apart than ``gap_factor``
    times the median spacing of the observations (of the rows where ``observed`` is None or
    holds fewer than 3 observations): the long gaps :func:`_missing_spans` shades, where no row
    lies inside. Nothing was computed there, and a line joining the two rows would draw a band
    narrower than the model's inside the gap (the smoothed variance peaks mid-gap).

    >>> _row_breaks(np.array([0.0, 1, 2, 3, 40, 41])).tolist()
    [False, False, False, True, False]
    """
    t = _as_span_times(times)
    T = len(t)
    if T < 2:
        return np.zeros(max(T - 1, 0), dtype=bool)

    def secs(d):
        return d / np.timedelta64(1, "s") if d.dtype.kind == "m" else d.astype(np.float64)

    d = secs(np.diff(t))
    ref = t
    if observed is not None:
        obs_t = t[~np.isnan(np.asarray(observed, dtype=np.float64))]
        if len(obs_t) >= 3:
            ref = obs_t
    if len(ref) < 3:
        return np.zeros(T - 1, dtype=bool)
    med = float(np.median(secs(np.diff(ref))))
    if not med > 0:
        return np.zeros(T - 1, dtype=bool)
    return d > gap_factor * med


def _with_breaks(times, index, breaks, *ys):
    """``(times, ys, lone)`` of the rows ``index`` (sorted) with a NaN point inserted between two
    drawn rows that have a break (:func:`_row_breaks`) between them, so lines and bands stop at
    the gap; ``lone``: the positions (in the returned arrays) of points with no drawn neighbour
    on either side, which a line or band would not show (drawn as markers or bars instead)."""
    t = np.asarray(times)[index]
    ys = [np.asarray(y, dtype=np.float64)[index] for y in ys]
    if breaks is None or not breaks.any() or len(index) < 2:
        return t, ys, np.empty(0, dtype=np.int64)
    c = np.concatenate([[0], np.cumsum(breaks)])
    cut = np.flatnonzero(c[index[1:]] - c[index[:-1]] > 0)  # a break after drawn point k
    mid = t[cut] + (t[cut + 1] - t[cut]) / 2
    t = np.insert(t, cut + 1, mid)
    ys = [np.insert(y, cut + 1, np.nan) for y in ys]
    starts = np.concatenate([[0], cut + 1])  # segments of the drawn rows (before inserting)
    ends = np.concatenate([cut, [len(index) - 1]])
    lone_rows = starts[starts == ends]
    lone = lone_rows + np.searchsorted(cut, lone_rows)  # shifted by the NaN points before them
    return t, ys, lone


def plot_bands(
    times,
    mean,
    var,
    *,
    observed=None,
    coverages=(0.5, 0.9),
    ax=None,
    color="C0",
    label="mean",
    forecast_times=None,
    forecast_mean=None,
    forecast_var=None,
    forecast_level_var=None,
    show_missing=True,
):
    """Mean with shaded central bands at ``coverages``, data, missing stretches and a forecast.

    Args:
        times, mean, var: ``[T]`` (numbers or datetimes; ``var`` may be inf while nothing is known).
        observed: ``[T]`` data (NaN = missing), drawn as points; NaN runs are shaded grey.
        coverages: band probabilities, e.g. ``(0.5, 0.9)``.
        forecast_times, forecast_mean, forecast_var: ``[H]`` forecast, drawn dashed in a shaded
            forecast region; ``forecast_var`` is the predictive variance (of a new observation),
            its intervals drawn as dotted lines from the first forecast time.
        forecast_level_var: ``[H]`` the forecast's variance of the level (optional): its bands
            are shaded in the forecast's colour from the bands at the last time on (the same
            quantity as the bands before it, so they join without a jump); the legend shows
            each band's two colours in one entry.
        show_missing: ``True`` shades NaN runs and long stretches without data (over 10 times the
            median spacing); ``"gaps"`` only the latter (for data with NaN query rows added on
            purpose); ``False`` nothing.

    Gaps without rows: where two consecutive rows are further apart than 10 times the median
    spacing of the observations, nothing was computed in between, and the mean and bands stop
    at the gap (hatched, "no rows: not evaluated") instead of joining its ends with a straight
    band, which would be narrower than the model's inside the gap (the smoothed variance peaks
    mid-gap). To draw the band inside a gap, add rows with NaN values at the times wanted: they
    are filtered as unobserved (docs/model.md, "Smoothing"; ``show_missing="gaps"`` then still
    shades the gap). A row with such gaps on both sides is drawn as a marker and bars.

    The legend goes outside the axes, to their right, where the figure has a layout engine (as
    the figure made for ``ax=None`` has: constrained), else inside at matplotlib's ``"best"``.

    >>> import numpy as np
    >>> z = np.array([0, 1, np.nan, 0, 1.0])
    >>> ax = plot_bands(np.arange(5.0), np.zeros(5), np.ones(5), observed=z)
    >>> ax.get_legend_handles_labels()[1][:3]
    ['missing / no data', 'data', '90% band']
    """
    from kalmanscan.timeseries.coverage import check_coverage, percent

    given = times
    times = _plot_times(times)
    mean, var = _reals("mean", mean), _reals("var", var)
    if times.ndim != 1 or mean.shape != times.shape or var.shape != times.shape:
        raise ValueError(
            f"times, mean, var: expected equal 1-D shapes, got {times.shape}, {mean.shape}, "
            f"{var.shape}"
        )
    covs = sorted(check_coverage(coverages, "coverages"), reverse=True)
    obs = None if observed is None else _reals("observed", observed)  # masked: missing
    if obs is not None and obs.shape != times.shape:
        raise ValueError(
            f"observed: expected the shape of times {times.shape}, got shape {obs.shape}"
        )
    has_fc = forecast_times is not None and len(forecast_times) > 0
    if has_fc:
        ft = _plot_times(forecast_times, "forecast_times")
        fm, fv = _reals("forecast_mean", forecast_mean), _reals("forecast_var", forecast_var)
        if ft.ndim != 1 or fm.shape != ft.shape or fv.shape != ft.shape:
            raise ValueError(
                "forecast_times, forecast_mean, forecast_var: expected equal 1-D shapes, got "
                f"{ft.shape}, {fm.shape}, {fv.shape}"
            )
        flv = None
        if forecast_level_var is not None:
            flv = _reals("forecast_level_var", forecast_level_var)
            if flv.shape != ft.shape:
                raise ValueError(
                    f"forecast_level_var: expected the shape of forecast_times {ft.shape}, got "
                    f"shape {flv.shape}"
                )
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4), layout="constrained")
    _calendar_axis(ax, given)
    breaks = _row_breaks(times, obs)
    if show_missing and obs is not None:
        _shade_missing(ax, times, obs, show_missing, "missing / no data", breaks)
    if obs is not None:
        i = _draw_index(len(obs), obs, spread=True)
        ax.plot(times[i], obs[i], "o", ms=3, color="0.25", label="data", zorder=3)
    finite = np.isfinite(var)
    sd = np.sqrt(np.where(finite, var, np.nan))
    bands = [(c, mean - _quantile(c) * sd, mean + _quantile(c) * sd) for c in covs]
    i = _draw_index(len(mean), mean, *(y for _, lo, hi in bands for y in (lo, hi)))
    if breaks.any():  # (the rows either side of a gap drawn, so the bands stop where it starts)
        ends = np.flatnonzero(breaks)
        i = np.union1d(i, np.concatenate([ends, ends + 1]))
    t_d, (m_d, *edges), lone = _with_breaks(
        times, i, breaks, mean, *(y for _, lo, hi in bands for y in (lo, hi))
    )
    for k, c in enumerate(covs):
        lo, hi = edges[2 * k], edges[2 * k + 1]
        alpha = 0.15 + 0.2 * k / max(len(covs) - 1, 1)
        ax.fill_between(t_d, lo, hi, color=color, alpha=alpha, lw=0, label=f"{percent(c)} band")
        if lone.size:
            ax.vlines(t_d[lone], lo[lone], hi[lone], color=color, alpha=alpha, lw=4)
    ax.plot(t_d, m_d, color=color, lw=1.6, label=label, zorder=4, **_lone_markers(lone))
    if has_fc:
        ax.axvspan(
            times[-1], ft[-1], color="C1", alpha=0.07, lw=0, label="forecast region", zorder=0
        )
        t_join = np.concatenate([times[-1:], ft])
        m_join = np.concatenate([mean[-1:], fm])
        for k, c in enumerate(covs):
            q = _quantile(c)
            alpha = 0.15 + 0.2 * k / max(len(covs) - 1, 1)
            if flv is not None:  # the level's band, on from the last time's
                sd_join = np.concatenate([sd[-1:], np.sqrt(flv)])
                ax.fill_between(
                    t_join,
                    m_join - q * sd_join,
                    m_join + q * sd_join,
                    color="C1",
                    alpha=alpha,
                    lw=0,
                    label=f"{percent(c)} band",
                )
            # a new observation's interval: lower and upper edge as one line, from the first
            # forecast time on (it is no band of the level, so it is not joined to one)
            fsd = np.sqrt(fv)
            ax.plot(
                np.concatenate([ft, ft[-1:], ft]),
                np.concatenate([fm - q * fsd, [np.nan], fm + q * fsd]),
                ls=":",
                color="C1",
                lw=1.5,
                alpha=0.55 + 0.45 * k / max(len(covs) - 1, 1),
                label=f"{percent(c)} predictive",
                marker="_" if len(ft) == 1 else None,
                zorder=4,
            )
        ax.plot(t_join, m_join, "--", color="C1", lw=1.6, label="forecast", zorder=4)
    _legend(ax, ncol=2)
    _clamp_dates(ax)
    make_drawable(ax)  # (this axes only: a figure's other panels are made so where drawn)
    return ax


def _lone_markers(lone) -> dict:
    """Line keywords marking the points ``lone`` of :func:`_with_breaks` (none: no markers)."""
    if not len(lone):
        return {}
    return {"marker": "o", "ms": 3.5, "markevery": [int(k) for k in lone]}


def _has_layout_engine(ax) -> bool:
    fig = ax.figure
    while getattr(fig, "figure", None) is not None and fig.figure is not fig:
        fig = fig.figure  # (a subfigure's root figure)
    get = getattr(fig, "get_layout_engine", None)
    return get is not None and get() is not None


def _legend(ax, ncol: int = 1):
    """``ax``'s legend, entries of one label merged (a level band and its forecast: one entry of
    both colours); outside the axes on their right where the figure has a layout engine (which
    makes room for it, so it covers no data), else inside at ``"best"``."""
    from matplotlib.legend_handler import HandlerTuple

    merged: dict = {}
    for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
        merged.setdefault(lab, []).append(h)
    handles = [hs[0] if len(hs) == 1 else tuple(hs) for hs in merged.values()]
    kw = dict(fontsize="small", handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)})
    if _has_layout_engine(ax):
        return ax.legend(
            handles,
            list(merged),
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0.0,
            **kw,
        )
    return ax.legend(handles, list(merged), loc="best", ncol=ncol, **kw)


def _reals(name, values) -> np.ndarray:
    """``values`` as float64 (masked elements and pandas' NA: NaN), refusing what is no number."""
    if values is None:
        raise TypeError(f"{name}: expected an array of real numbers, got None")
    from kalmanscan.core._args import as_real_numpy

    return as_real_numpy(name, values).astype(np.float64)


def _plot_times(times, name: str = "times") -> np.ndarray:
    """Times as matplotlib draws them and the missing stretches are measured in: numbers and
    ``datetime64`` as given, pandas periods as the times they start (matplotlib has no converter
    for them); timezone-aware times, datetime objects and timestamp strings as ``datetime64``,
    read as the filter reads them (:func:`kalmanscan.timeseries.times.as_time_axis`: times with
    a timezone or UTC offset in UTC, ambiguous day/month orders refused).

    >>> import datetime
    >>> _plot_times([datetime.date(2020, 1, 1), datetime.date(2020, 1, 3)]).dtype.kind
    'M'
    """
    import sys

    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(times, (pd.Index, pd.Series)):
        if isinstance(times.dtype, pd.PeriodDtype):
            times = times.dt.start_time if isinstance(times, pd.Series) else times.start_time
    arr = np.asarray(times)
    if arr.ndim == 1 and arr.dtype.kind in "OSU":
        # datetime objects (object arrays of Timestamps: a tz-aware index) or strings: one
        # datetime64 axis, so the missing stretches can be measured and the forecast joins on
        from kalmanscan.timeseries.time_cftime import kept_calendar
        from kalmanscan.timeseries.times import as_time_axis

        labels = as_time_axis(times, arr.shape[0], name=name).labels
        cal = kept_calendar(labels)
        if cal is not None:  # a model calendar's dates: its days since 0001-01-01
            import cftime

            return np.asarray(cftime.date2num(labels, _CF_ORIGIN, calendar=cal), np.float64)
        return labels
    return arr


_CF_ORIGIN = "days since 0001-01-01"  # (the numbers cftime dates are drawn at)


def _zone_axis(ax, coord) -> None:
    """A date axis of UTC times (a results Dataset's ``time`` with attr ``time_zone = "UTC"``)
    labelled on the clock of the record's own zone (attr ``local_time_zone``, e.g.
    ``Europe/Paris``: a local midnight is labelled 00:00, not 22:00), else in UTC; the axis
    label names the zone. The curves stay where they are (drawn in UTC: a local clock repeats
    an hour in autumn)."""
    attrs = getattr(coord, "attrs", {})
    if attrs.get("time_zone") != "UTC" or np.asarray(coord).dtype.kind != "M":
        return
    import matplotlib.dates as mdates

    from kalmanscan.timeseries.time_zones import zone_from_name

    name = attrs.get("local_time_zone", "UTC")
    try:
        tz = zone_from_name(name, "attr 'local_time_zone'")
    except ValueError:
        return  # (an unknown name: the filter refuses it; the plot keeps UTC)
    locator = mdates.AutoDateLocator(tz=tz)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=tz))
    ax.set_xlabel(f"{ax.get_xlabel() or 'time'} ({name})")


def _calendar_axis(ax, times) -> None:
    """Dates of a model calendar on ``ax``'s x axis: drawn at their days since 0001-01-01 in the
    calendar (:func:`_plot_times`), labelled as dates of that calendar."""
    from kalmanscan.timeseries.time_cftime import kept_calendar

    cal = kept_calendar(times)
    if cal is None:
        return
    import cftime
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def label(x, _pos):
        try:
            d = cftime.num2date(x, _CF_ORIGIN, calendar=cal)
        except (ValueError, OverflowError):
            return ""
        return d.strftime("%Y-%m-%d %H:%M" if (d.hour or d.minute) else "%Y-%m-%d")

    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.xaxis.set_major_formatter(FuncFormatter(label))
    ax.set_xlabel(f"{ax.get_xlabel() or 'time'} ({cal} calendar)")


def _series_dims(ds):
    tdim = ds.attrs.get("time_dim", "time")
    return tdim, [d for d in ds["mean"].dims if d != tdim]


def _select(ds, series):
    """One series of ``ds``: ``series`` is None (one series), an int index or ``{dim: label}``."""
    tdim, sdims = _series_dims(ds)
    if not sdims:
        return ds, ds.attrs.get("name", "")
    if series is None:
        n = math.prod(ds.sizes[d] for d in sdims)
        if n != 1:
            raise ValueError(
                f"series: the Dataset holds {n} series over dims {sdims}; pick one with an int or "
                f"{{dim: label}}"
            )
        series = 0
    if isinstance(series, dict):
        one = ds.sel(series)
        rest = [d for d in sdims if d not in series]
        if rest:
            raise ValueError(
                f"series: expected labels for every series dim {sdims}, got {list(series)}"
            )
        return one, ", ".join(f"{k}={v}" for k, v in series.items())
    if isinstance(series, (int, np.integer)):
        shape = tuple(ds.sizes[d] for d in sdims)
        n = math.prod(shape)
        if not -n <= series < n:
            raise ValueError(f"series: expected an index in [0, {n}), got {series}")
        idx = dict(zip(sdims, np.unravel_index(int(series) % n, shape), strict=False))
        one = ds.isel(idx)
        label = ", ".join(
            f"{d}={one[d].values}" if d in one.coords else f"{d}={i}" for d, i in idx.items()
        )
        return one, label
    raise TypeError(
        f"series: expected None, an int or a dict {{dim: label}}, got {type(series).__name__}"
    )


def plot_series(
    ds,
    series=None,
    *,
    smoothed: bool = True,
    coverages=None,
    ax=None,
    title=None,
    show_missing=True,
):
    """One series of a results Dataset: data, smoothed (or filtered) mean, bands, gaps, forecast.

    Args:
        ds: a Dataset from :mod:`kalmanscan.xarray`. series: which series, an int index or
            ``{dim: label}``; ``None`` only for a Dataset of one series (a Dataset of several
            raises ValueError: pick one; :func:`plot_overview` draws several).
        smoothed: draw the smoothed moments (if present) instead of the filtered ones.
        coverages: band probabilities (default the Dataset's ``coverage`` attr).
        ax: the axes to draw on (default a new figure). title: the axes' title (default which
            moments are drawn).
        show_missing: as in :func:`plot_bands`.

    The forecast (where the Dataset has one) is drawn as in :func:`plot_bands`: the level's
    bands (``forecast_variance``) shaded on from the last time's, a new observation's
    predictive intervals (``forecast_predictive_variance``) as dotted lines. Gaps without rows
    are left undrawn, as there. Returns the axes.

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.array([0.0, 1.0, np.nan, 2.0]))
    >>> plot_series(ds).get_title()
    'smoothed level'
    """
    one, label = _select(ds, series)
    tdim, _ = _series_dims(ds)
    covs = coverages if coverages is not None else ds.attrs.get("coverage", (0.5, 0.9))
    use_smooth = smoothed and "smoothed_mean" in one
    m = one["smoothed_mean"] if use_smooth else one["mean"]
    v = one["smoothed_variance"] if use_smooth else one["variance"]
    kind = "smoothed" if use_smooth else "filtered"
    fc = {}
    if "forecast_mean" in one:
        fc = dict(
            forecast_times=one["forecast_time"].values,
            forecast_mean=one["forecast_mean"].values,
            forecast_var=one["forecast_predictive_variance"].values,
        )
        if "forecast_variance" in one:
            fc["forecast_level_var"] = one["forecast_variance"].values
    ax = plot_bands(
        one[tdim].values,
        m.values,
        v.values,
        observed=one["observed"].values,
        coverages=covs,
        ax=ax,
        label=f"{kind} mean",
        show_missing=show_missing,
        **fc,
    )
    ax.set_title(
        title if title is not None else (f"{kind} level" + (f" ({label})" if label else ""))
    )
    ax.set_xlabel(tdim)
    _calendar_axis(ax, one[tdim].values)
    _zone_axis(ax, one[tdim])
    _clamp_dates(ax)
    make_drawable(ax)
    return ax


def plot_precision(
    ds, series=None, *, ax=None, smoothed: bool = False, max_series: int = 8, show_missing=True
):
    """Precision (1 / variance) of the level over time, log scale; all series if ``series`` is None.

    Precision grows with each observation and decays across gaps, so missing stretches show as dips.
    ``series``: an int index or ``{dim: label}``; ``smoothed``: the smoothed precision where the
    Dataset has it (the y axis says which: "filtered precision" or "smoothed precision");
    ``max_series``: at most this many curves; ``show_missing``: as in :func:`plot_bands`. Gaps
    without rows (over 10 times the median spacing of the observations) are left undrawn, as in
    :func:`plot_bands`: the precision inside is not computed. Returns the axes (``ax=None``: a
    new figure).

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.array([0.0, 1.0, np.nan, 2.0]))
    >>> plot_precision(ds).get_yscale()
    'log'
    """
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.5), layout="constrained")
    tdim, sdims = _series_dims(ds)
    var_name = "smoothed_variance" if smoothed and "smoothed_variance" in ds else "variance"
    kind = "smoothed" if var_name.startswith("smoothed") else "filtered"
    if series is None and sdims:
        n = math.prod(ds.sizes[d] for d in sdims)
        picks = [_select(ds, i) for i in range(min(n, max_series))]
    else:
        picks = [_select(ds, series)]
    for k, (one, label) in enumerate(picks):
        times = _plot_times(one[tdim].values, f"coordinate {tdim!r}")
        prec = 1.0 / one[var_name].values
        shown = np.where(prec > 0, prec, np.nan)
        observed = one["observed"].values if "observed" in one else None
        breaks = _row_breaks(times, observed)
        i = _draw_index(len(shown), shown)
        if breaks.any():
            ends = np.flatnonzero(breaks)
            i = np.union1d(i, np.concatenate([ends, ends + 1]))
        t_d, (p_d,), lone = _with_breaks(times, i, breaks, shown)
        ax.plot(t_d, p_d, lw=1.3, color=f"C{k}", label=label or kind, **_lone_markers(lone))
        if "forecast_variance" in one and len(picks) == 1:
            ft = _plot_times(one["forecast_time"].values, "coordinate 'forecast_time'")
            fprec = 1.0 / one["forecast_variance"].values
            ax.plot(
                np.concatenate([times[-1:], ft]),
                np.concatenate([prec[-1:], fprec]),
                "--",
                color="C1",
                lw=1.3,
                label="forecast",
            )
        if observed is not None and len(picks) == 1 and show_missing:
            _shade_missing(ax, times, observed, show_missing, "missing", breaks)
    ax.set_yscale("log")
    _log_span_at_least(ax)
    ax.set_ylabel(f"{kind} precision")
    ax.set_xlabel(tdim)
    _calendar_axis(ax, picks[0][0][tdim].values)
    _zone_axis(ax, picks[0][0][tdim])
    _legend(ax)
    _clamp_dates(ax)
    make_drawable(ax)
    return ax


def _overview_picks(ds, series, max_series: int):
    """``(picks, n)``: the series :func:`plot_overview` draws (``[None]`` for a Dataset of one
    series) and how many the Dataset holds."""
    _tdim, sdims = _series_dims(ds)
    n = math.prod(ds.sizes[d] for d in sdims) if sdims else 1
    if series is not None:
        return [series], n
    if sdims:
        return list(range(min(n, max_series))), n
    return [None], n


def plot_overview(
    ds,
    *,
    series=None,
    smoothed: bool = True,
    coverages=None,
    max_series: int = 4,
    axes=None,
    show_missing=True,
):
    """Bands panels (one per series, at most ``max_series``) above a shared precision panel.

    ``series``: one series to draw (an int or ``{dim: label}``; default the first
    ``max_series``); ``smoothed``, ``coverages``, ``show_missing``: as in :func:`plot_series`.
    The precision panel shows the same moments as the panels above (``smoothed=True``: the
    smoothed precision, ``1 / smoothed_variance``; its y axis says which). Where the Dataset
    holds more than ``max_series`` series, the figure's title says so ("the first 4 of 6 series
    (max_series=4); not drawn: ...", naming those left out where they are at most 3; appended
    to a title the figure has). Legends sit to the
    right of the panels. Gaps without rows are left undrawn (:func:`plot_bands`). Returns the
    array of axes (``axes=None`` makes a new figure with the right number of rows).

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.ones((4, 2)))
    >>> len(plot_overview(ds))
    3
    """
    plt = _plt()
    picks, n = _overview_picks(ds, series, max_series)
    rows = len(picks) + 1
    if axes is None:
        fig, axes = plt.subplots(
            rows,
            1,
            figsize=(11, 3.2 * len(picks) + 2.4),
            sharex=True,
            gridspec_kw={"height_ratios": [3] * len(picks) + [1.6]},
        )
        fig.set_layout_engine("constrained")
    axes = np.atleast_1d(axes)
    if len(axes) != rows:
        raise ValueError(
            f"axes: expected {rows} axes ({rows - 1} series panels + precision), got {len(axes)}"
        )
    for ax, s in zip(axes[:-1], picks, strict=False):
        plot_series(ds, s, smoothed=smoothed, coverages=coverages, ax=ax, show_missing=show_missing)
    plot_precision(
        ds,
        series,
        ax=axes[-1],
        smoothed=smoothed,
        max_series=max(len(picks), 1),
        show_missing=show_missing,
    )
    if series is None and n > len(picks):  # say on the figure that some are not drawn
        left = [_select(ds, k)[1] for k in range(len(picks), n)] if n - len(picks) <= 3 else []
        note = f"the first {len(picks)} of {n} series (max_series={max_series})"
        if left:
            note += "; not drawn: " + ", ".join(left)
        fig = axes[0].figure
        had = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        fig.suptitle(f"{had}\n{note}" if had else note)
        make_drawable(fig._suptitle)
    _clamp_dates(axes[-1])  # (each panel's texts were made drawable where it was drawn)
    return axes
