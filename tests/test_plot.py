"""matplotlib helpers (kalmanscan.plot): bands, gaps, forecast region, precision panel."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

from kalmanscan import plot  # noqa: E402
from kalmanscan.testing import assert_close  # noqa: E402
from kalmanscan.timeseries import OUModel  # noqa: E402


@pytest.fixture(autouse=True)
def no_show(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("library code must not call plt.show()")

    monkeypatch.setattr(plt, "show", refuse)
    yield
    plt.close("all")


def _bands(ax):
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def _vspans(ax):
    return [
        p
        for p in ax.patches
        if p.get_label() in ("missing / no data", "forecast region")
        or p.get_label().startswith("_")
    ]


@pytest.mark.parametrize("covs", [(0.9,), (0.5, 0.9), (0.5, 0.8, 0.95)], ids=["C1", "C2", "C3"])
def test_plot_bands_synthetic_arrays(covs):
    t = np.arange(50.0)
    mean = np.sin(t / 5)
    var = np.full(50, 0.04)
    z = mean + 0.1
    z[10:15] = np.nan
    fig, ax = plt.subplots()
    out = plot.plot_bands(t, mean, var, observed=z, coverages=covs, ax=ax)
    assert out is ax
    bands = _bands(ax)
    assert len(bands) == len(covs)
    # the widest band spans mean -/+ q(0.95 or max) * sd
    q = {0.9: 1.6448536269514722, 0.95: 1.959963984540054}[max(covs)]
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert_close(ys.max(), mean.max() + q * 0.2, "rounding", "float64", what="band top")
    labels = ax.get_legend_handles_labels()[1]
    assert "missing / no data" in labels and "data" in labels


def test_missing_spans_cover_nan_runs_and_long_gaps():
    t = np.array([0.0, 1, 2, 3, 4, 5, 6, 40, 41, 42])
    z = np.array([1.0, np.nan, np.nan, 1, 1, 1, 1, 1, 1, 1])
    spans = plot._missing_spans(t, z)
    assert spans[0] == (0.5, 2.5)
    assert (6.0, 40.0) in spans
    assert plot._missing_spans(t, z, gap_factor=None) == [(0.5, 2.5)]
    tt = np.datetime64("2024-01-01") + np.array([0, 1, 2, 3], dtype="timedelta64[D]")
    assert plot._missing_spans(tt, np.array([1.0, np.nan, 1.0, 1.0]))[0][0] == np.datetime64(
        "2024-01-01T12"
    )


def test_plot_series_with_forecast_and_datetimes():
    stamps = np.datetime64("2024-01-01") + np.arange(0, 60, 2).astype("timedelta64[D]")
    m = OUModel(theta=0.1, sigma2=0.5, mu=1.0, obs_var=0.2, time_unit="1D")
    _, z = m.simulate(stamps, seed=0)
    z[5:9] = np.nan
    ds = m.to_dataset(z, stamps, forecast_steps=6, coverage=(0.5, 0.9))
    ax = plot.plot_series(ds)
    labels = ax.get_legend_handles_labels()[1]
    for want in (
        "forecast",
        "forecast region",
        "90% band",
        "90% predictive",
        "smoothed mean",
        "missing / no data",
    ):
        assert want in labels, want
    assert len(_bands(ax)) == 4  # two bands for the level, two for the forecast
    ax2 = plot.plot_series(ds, smoothed=False, coverages=(0.95,))
    assert "filtered mean" in ax2.get_legend_handles_labels()[1] and len(_bands(ax2)) == 2


def test_precision_panel_and_overview_for_several_series():
    m = OUModel(theta=0.0, sigma2=np.array([0.1, 1.0, 2.0]), obs_var=1.0)
    _, z = m.simulate(np.arange(80.0), seed=2)
    z[20:40, 1] = np.nan
    ds = m.to_dataset(z, series_coords={"series": ["a", "b", "c"]})
    ax = plot.plot_precision(ds)
    assert ax.get_yscale() == "log" and len(ax.lines) == 3
    prec_b = ax.lines[1].get_ydata()
    assert prec_b[39] < prec_b[19]  # precision decays across the gap
    axes = plot.plot_overview(ds, max_series=2)
    assert len(axes) == 3 and axes[0].get_title() == "smoothed level (series=a)"
    ax = plot.plot_series(ds, {"series": "c"})
    assert ax.get_title() == "smoothed level (series=c)"
    with pytest.raises(ValueError, match="series: the Dataset holds 3 series"):
        plot.plot_series(ds)
    with pytest.raises(ValueError, match="series: expected an index"):
        plot.plot_series(ds, 7)


def test_plot_bands_shape_check():
    with pytest.raises(ValueError, match="times, mean, var: expected equal 1-D shapes"):
        plot.plot_bands(np.arange(3.0), np.zeros(4), np.ones(4))


def test_missing_spans_outside_the_nanosecond_range():
    """Dates before 1677 or after 2262 keep their place (no wrap through datetime64[ns])."""
    from kalmanscan.plot import _missing_spans

    t = np.array(["1600-01-01", "1601-01-01", "1602-01-01", "1603-01-01", "2400-01-01"], "M8[D]")
    spans = _missing_spans(t, np.array([1.0, np.nan, 2.0, 3.0, 4.0]))
    assert spans[0] == (np.datetime64("1600-07-02"), np.datetime64("1601-07-02T12:00"))
    assert spans[1] == (np.datetime64("1603-01-01"), np.datetime64("2400-01-01"))


def test_long_series_draw_their_extremes_from_few_points():
    """Past plot.DRAW_MAX points a panel draws each half-pixel stretch's first, lowest, highest
    and last points (data markers also an even sample): the lines, bands and axes limits of all
    points, from at most a few thousand vertices an artist."""

    T = 200_000
    rng = np.random.default_rng(3)
    z = np.cumsum(rng.normal(size=T)) + rng.normal(size=T) * 5
    z[1000:1400] = np.nan
    ds = OUModel(sigma2=1.0, obs_var=25.0).to_dataset(z)
    ax = plot.plot_series(ds)
    line = [ln for ln in ax.get_lines() if ln.get_label() == "smoothed mean"][0]
    dots = [ln for ln in ax.get_lines() if ln.get_label() == "data"][0]
    assert len(line.get_xdata()) <= 4 * 2_000 + 2 and len(dots.get_xdata()) <= 20_000
    mean = ds["smoothed_mean"].values
    assert np.nanmin(line.get_ydata()) == mean.min() and np.nanmax(line.get_ydata()) == mean.max()
    assert np.nanmin(dots.get_ydata()) == np.nanmin(z) and np.nanmax(dots.get_ydata()) == np.nanmax(
        z
    )
    # the widest band's polygon reaches the band's extremes
    sd = np.sqrt(ds["smoothed_variance"].values)
    q = 1.6448536269514722  # the 90 % band
    band = [c for c in ax.collections if c.get_label() == "90% band"][0]
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    np.testing.assert_allclose([ys.min(), ys.max()], [(mean - q * sd).min(), (mean + q * sd).max()])
    # short series draw every point
    short = plot.plot_series(OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z[:500]))
    assert len([ln for ln in short.get_lines() if ln.get_label() == "data"][0].get_xdata()) == 500


def test_precision_constant_to_rounding_keeps_a_labelled_tick():
    """A fit on its bound obs_var -> 0 gives a precision of 1 / obs_var at every step, equal up
    to a few ulps; matplotlib scaled the log axis to those ulps, where no tick falls, and the
    precision panel drew empty. Now the axis spans at least a factor of 3 around the curve, and a
    curve spanning more keeps matplotlib's own limits."""
    z = np.cumsum(np.random.default_rng(3).normal(size=40))
    ds = OUModel(theta=0.05, sigma2=0.7, mu=0.0, obs_var=3.45967845e-15).to_dataset(z)
    prec = 1.0 / ds["variance"].values
    assert np.ptp(prec) < 1e-12 * prec.max()  # (constant to rounding, not exactly)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ax = plot.plot_precision(ds)
        ax.figure.canvas.draw()
    lo, hi = ax.get_ylim()
    assert hi / lo == pytest.approx(3.0) and lo < prec.min() and prec.max() < hi
    ticks = np.concatenate([ax.yaxis.get_majorticklocs(), ax.yaxis.get_minorticklocs()])
    labelled = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
    shown = [x for x, text in zip(ticks, labelled, strict=False) if lo <= x <= hi and text]
    assert shown, "no labelled tick in view"
    plt.close(ax.figure)
    gap = z.copy()
    gap[10:30] = np.nan  # (the precision falls across it: a span of a factor of about 30)
    wide = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(gap)
    ax = plot.plot_precision(wide)
    span = 1.0 / wide["variance"].values
    assert span.max() / span.min() > 3.0
    lo, hi = ax.get_ylim()
    assert lo < span.min() and hi > span.max() and hi / lo < 1.5 * span.max() / span.min()
    plt.close(ax.figure)


def _drawn_by_some_font(ch):
    from matplotlib import font_manager

    for entry in font_manager.fontManager.ttflist:
        if entry.name.startswith("Last Resort"):
            continue
        if font_manager.get_font(entry.fname).get_char_index(ord(ch)):
            return entry.name
    return None


def test_text_the_default_font_lacks_falls_back_or_shows_code_points(tmp_path):
    """Series names and file names in a script matplotlib's default font lacks (Japanese column
    names drew as empty boxes, a warning a glyph): an installed font that has the characters is
    added as a fallback (here STIX for U+2322, which DejaVu Sans lacks), and a character no
    installed font has is written as its code point."""
    from matplotlib import font_manager

    default = font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))
    frown, cat = "\u2322", "\u732b"
    assert not default.get_char_index(ord(frown)) and _drawn_by_some_font(frown)
    z = np.cumsum(np.random.default_rng(4).normal(size=30))[:, None]
    ds = OUModel(sigma2=1.0, obs_var=0.5).to_dataset(
        z, series_coords={"series": [f"a{frown}b{cat}"]}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (matplotlib warns once a missing glyph)
        axes = plot.plot_overview(ds)
        axes[0].figure.savefig(tmp_path / "x.png")
    title = axes[0].title
    cat_shown = cat if _drawn_by_some_font(cat) else "U+732B"
    assert title.get_text() == f"smoothed level (series=a{frown}b{cat_shown})"
    assert len(title.get_fontfamily()) == 2  # the default family, then the fallback
    legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
    assert legend == [f"series=a{frown}b{cat_shown}"]
    plt.close(axes[0].figure)
    texts, families = plot.drawable_text(["plain", "Höhe"])
    assert texts == ["plain", "Höhe"] and families == ["sans-serif"]
