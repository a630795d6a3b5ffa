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
    times = np.asarray(times)
    if times.dtype.kind == "M" and np.datetime_data(times.dtype)[0] in (
        "Y",
        "M",
        "W",
        "D",
        "h",
        "m",
    ):
        # seconds at least, so midpoints are exact; never nanoseconds, whose range ends at 1677
        # and 2262 (years 1-9999 fit in datetime64[s])
        times = times.astype("datetime64[s]")
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


def _shade_missing(ax, times, observed, show_missing, label: str) -> None:
    """Grey spans over the missing stretches of ``observed`` (``show_missing="gaps"``: only the
    long gaps between observations), the first one labelled."""
    spans = _missing_spans(times, observed, nan_runs=show_missing != "gaps")
    for k, (a, b) in enumerate(spans):
        ax.axvspan(a, b, color="0.85", alpha=0.6, lw=0, label=label if k == 0 else None, zorder=0)


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
    show_missing=True,
):
    """Mean with shaded central bands at ``coverages``, data, missing stretches and a forecast.

    Args:
        times, mean, var: ``[T]`` (numbers or datetimes; ``var`` may be inf while nothing is known).
        observed: ``[T]`` data (NaN = missing), drawn as points; NaN runs are shaded grey.
        coverages: band probabilities, e.g. ``(0.5, 0.9)``.
        forecast_times, forecast_mean, forecast_var: ``[H]`` forecast (predictive variance) drawn
            dashed in a shaded forecast region.
        show_missing: ``True`` shades NaN runs and long stretches without data (over 10 times the
            median spacing); ``"gaps"`` only the latter (for data with NaN query rows added on
            purpose); ``False`` nothing.

    >>> import numpy as np
    >>> z = np.array([0, 1, np.nan, 0, 1.0])
    >>> ax = plot_bands(np.arange(5.0), np.zeros(5), np.ones(5), observed=z)
    >>> ax.get_legend_handles_labels()[1][:3]
    ['missing / no data', 'data', '90% band']
    """
    from kalmanscan.timeseries.coverage import check_coverage

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
    if forecast_times is not None and len(forecast_times):
        ft = _plot_times(forecast_times, "forecast_times")
        fm, fv = _reals("forecast_mean", forecast_mean), _reals("forecast_var", forecast_var)
        if ft.ndim != 1 or fm.shape != ft.shape or fv.shape != ft.shape:
            raise ValueError(
                "forecast_times, forecast_mean, forecast_var: expected equal 1-D shapes, got "
                f"{ft.shape}, {fm.shape}, {fv.shape}"
            )
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    _calendar_axis(ax, given)
    if show_missing and obs is not None:
        _shade_missing(ax, times, obs, show_missing, "missing / no data")
    if obs is not None:
        i = _draw_index(len(obs), obs, spread=True)
        ax.plot(times[i], obs[i], "o", ms=3, color="0.25", label="data", zorder=3)
    finite = np.isfinite(var)
    sd = np.sqrt(np.where(finite, var, np.nan))
    bands = [(c, mean - _quantile(c) * sd, mean + _quantile(c) * sd) for c in covs]
    i = _draw_index(len(mean), mean, *(y for _, lo, hi in bands for y in (lo, hi)))
    for k, (c, lo, hi) in enumerate(bands):
        alpha = 0.15 + 0.2 * k / max(len(covs) - 1, 1)
        ax.fill_between(
            times[i], lo[i], hi[i], color=color, alpha=alpha, lw=0, label=f"{c:.0%} band"
        )
    ax.plot(times[i], mean[i], color=color, lw=1.6, label=label, zorder=4)
    if forecast_times is not None and len(forecast_times):
        fsd = np.sqrt(fv)
        t_join = np.concatenate([times[-1:], ft])
        m_join = np.concatenate([mean[-1:], fm])
        sd_join = np.concatenate([sd[-1:], fsd])
        ax.axvspan(
            times[-1], ft[-1], color="C1", alpha=0.07, lw=0, label="forecast region", zorder=0
        )
        for k, c in enumerate(covs):
            q = _quantile(c)
            alpha = 0.15 + 0.2 * k / max(len(covs) - 1, 1)
            ax.fill_between(
                t_join,
                m_join - q * sd_join,
                m_join + q * sd_join,
                color="C1",
                alpha=alpha,
                lw=0,
                label=f"{c:.0%} predictive",
            )
        ax.plot(t_join, m_join, "--", color="C1", lw=1.6, label="forecast", zorder=4)
    ax.legend(loc="best", fontsize="small", ncol=2)
    _clamp_dates(ax)
    make_drawable(ax)  # (this axes only: a figure's other panels are made so where drawn)
    return ax


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
            ``{dim: label}`` (``None``: the Dataset's only series).
        smoothed: draw the smoothed moments (if present) instead of the filtered ones.
        coverages: band probabilities (default the Dataset's ``coverage`` attr).
        ax: the axes to draw on (default a new figure). title: the axes' title (default which
            moments are drawn).
        show_missing: as in :func:`plot_bands`.

    Returns the axes.

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
    _clamp_dates(ax)
    make_drawable(ax)
    return ax


def plot_precision(
    ds, series=None, *, ax=None, smoothed: bool = False, max_series: int = 8, show_missing=True
):
    """Precision (1 / variance) of the level over time, log scale; all series if ``series`` is None.

    Precision grows with each observation and decays across gaps, so missing stretches show as dips.
    ``series``: an int index or ``{dim: label}``; ``smoothed``: the smoothed precision where the
    Dataset has it; ``max_series``: at most this many curves; ``show_missing``: as in
    :func:`plot_bands`. Returns the axes (``ax=None``: a new figure).

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.array([0.0, 1.0, np.nan, 2.0]))
    >>> plot_precision(ds).get_yscale()
    'log'
    """
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    tdim, sdims = _series_dims(ds)
    var_name = "smoothed_variance" if smoothed and "smoothed_variance" in ds else "variance"
    if series is None and sdims:
        n = math.prod(ds.sizes[d] for d in sdims)
        picks = [_select(ds, i) for i in range(min(n, max_series))]
    else:
        picks = [_select(ds, series)]
    for k, (one, label) in enumerate(picks):
        times = _plot_times(one[tdim].values, f"coordinate {tdim!r}")
        prec = 1.0 / one[var_name].values
        shown = np.where(prec > 0, prec, np.nan)
        i = _draw_index(len(shown), shown)
        ax.plot(
            times[i],
            shown[i],
            lw=1.3,
            color=f"C{k}",
            label=label or ("smoothed" if var_name.startswith("smoothed") else "filtered"),
        )
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
        if "observed" in one and len(picks) == 1 and show_missing:
            _shade_missing(ax, times, one["observed"].values, show_missing, "missing")
    ax.set_yscale("log")
    _log_span_at_least(ax)
    ax.set_ylabel("precision")
    ax.set_xlabel(tdim)
    _calendar_axis(ax, picks[0][0][tdim].values)
    ax.legend(loc="best", fontsize="small")
    _clamp_dates(ax)
    make_drawable(ax)
    return ax


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
    Returns the array of axes (``axes=None`` makes a new figure with the right number of rows).

    >>> import numpy as np
    >>> from kalmanscan.timeseries import OUModel
    >>> ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.ones((4, 2)))
    >>> len(plot_overview(ds))
    3
    """
    plt = _plt()
    tdim, sdims = _series_dims(ds)
    if series is not None:
        picks = [series]
    elif sdims:
        picks = list(range(min(math.prod(ds.sizes[d] for d in sdims), max_series)))
    else:
        picks = [None]
    rows = len(picks) + 1
    if axes is None:
        fig, axes = plt.subplots(
            rows,
            1,
            figsize=(10, 3.2 * len(picks) + 2.4),
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
        ds, series, ax=axes[-1], max_series=max(len(picks), 1), show_missing=show_missing
    )
    _clamp_dates(axes[-1])  # (each panel's texts were made drawable where it was drawn)
    return axes
