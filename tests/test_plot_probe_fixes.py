"""The plots' fixes after a probe of the docs as a user: nothing drawn across a gap
without rows, which precision the panel shows, legends off the data, forecast bands that do not
jump from the level's width to the predictive one, a title naming the series left out, and the
reference row of the Nile forecast."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
pytest.importorskip("xarray")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

from kalmanscan import plot  # noqa: E402
from kalmanscan.timeseries import OUModel  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
Q90 = 1.6448536269514722


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _gappy(extra=()):
    """30 readings, a gap of 60 steps with no rows (``extra``: rows added inside it), 30 more."""
    t = np.concatenate([np.arange(0, 30.0), np.arange(90, 120.0), np.asarray(extra, float)])
    t.sort()
    m = OUModel(theta=0.05, sigma2=0.5, mu=0.0, obs_var=0.3)
    _, z = m.simulate(t, seed=1)
    return m, t, z


def _band(ax, label="90% band"):
    return [c for c in ax.collections if c.get_label() == label][0]


def _line(ax, label):
    return [ln for ln in ax.get_lines() if ln.get_label() == label][0]


def test_nothing_is_drawn_across_a_gap_without_rows():
    """F2: the band, mean and precision were drawn straight across 60 steps without rows, a band
    as narrow as at its ends where the model's peaks mid-gap (here over 4 times as wide)."""
    m, t, z = _gappy()
    ds = m.to_dataset(z, t, coverage=(0.5, 0.9))
    ax = plot.plot_series(ds)
    assert len(_band(ax).get_paths()) == 2  # one polygon each side of the gap
    x = np.asarray(_line(ax, "smoothed mean").get_xdata(), float)
    y = np.asarray(_line(ax, "smoothed mean").get_ydata(), float)
    inside = (x > 29) & (x < 90)
    assert inside.any() and np.isnan(y[inside]).all()
    labels = ax.get_legend_handles_labels()[1]
    assert "no rows: not evaluated" in labels
    hatched = [p for p in ax.patches if p.get_label() == "no rows: not evaluated"][0]
    assert hatched.get_hatch() == "//"
    assert hatched.get_x() == pytest.approx(29.0) and hatched.get_width() == pytest.approx(61.0)
    # the precision panel too
    pax = plot.plot_precision(ds)
    px = np.asarray(pax.lines[0].get_xdata(), float)
    py = np.asarray(pax.lines[0].get_ydata(), float)
    assert np.isnan(py[(px > 29) & (px < 90)]).all()
    # what joining the ends hid: the smoothed band mid-gap, from NaN rows there (model.md)
    mq, tq, zq = _gappy(extra=np.arange(30, 90.0))
    zq[(tq >= 30) & (tq < 90)] = np.nan
    dq = mq.to_dataset(zq, tq, coverage=(0.5, 0.9))
    sd = np.sqrt(dq["smoothed_variance"].values)
    assert sd[tq == 60.0][0] > 4 * sd[tq == 29.0][0]
    qax = plot.plot_series(dq, show_missing="gaps")  # rows inside: the band is drawn through
    assert len(_band(qax).get_paths()) == 1
    assert "no rows: not evaluated" not in qax.get_legend_handles_labels()[1]


def test_a_row_between_two_gaps_shows_as_a_marker_and_bars():
    m, t, z = _gappy(extra=[60.0])
    ds = m.to_dataset(z, t, coverage=(0.5, 0.9))
    ax = plot.plot_series(ds)
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == 2  # one a coverage
    (seg,) = bars[0].get_segments()
    mean, sd = ds["smoothed_mean"].values[30], np.sqrt(ds["smoothed_variance"].values[30])
    np.testing.assert_allclose(seg, [[60.0, mean - Q90 * sd], [60.0, mean + Q90 * sd]])
    line = _line(ax, "smoothed mean")
    (k,) = line.get_markevery()
    assert line.get_xdata()[k] == 60.0 and line.get_marker() == "o"


def test_regular_records_and_long_series_are_not_cut():
    z = np.cumsum(np.random.default_rng(0).normal(size=200))
    z[50:80] = np.nan  # NaN rows: computed, drawn through
    ax = plot.plot_series(OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z))
    assert len(_band(ax).get_paths()) == 1
    assert not np.isnan(np.asarray(_line(ax, "smoothed mean").get_ydata(), float)).any()
    # past DRAW_MAX the rows either side of a gap are still drawn, and it is cut
    T = 30_000
    t = np.arange(T, dtype=float)
    t[T // 2 :] += 5_000.0
    zz = np.cumsum(np.random.default_rng(1).normal(size=T))
    ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(zz, t)
    ax = plot.plot_series(ds)
    x = np.asarray(_line(ax, "smoothed mean").get_xdata(), float)
    y = np.asarray(_line(ax, "smoothed mean").get_ydata(), float)
    k = int(np.flatnonzero(np.isnan(y))[0])
    assert np.isnan(y).sum() == 1 and x[k - 1] == T // 2 - 1 and x[k + 1] == T // 2 + 5_000


def test_the_precision_panel_says_which_precision():
    """F3: the overview's bands are smoothed, its precision panel was the filtered precision
    labelled "precision". Now it shows the same moments as the panels above and says which."""
    m, t, z = _gappy()
    ds = m.to_dataset(z, t)
    axes = plot.plot_overview(ds)
    assert axes[-1].get_ylabel() == "smoothed precision"
    y = np.asarray(axes[-1].lines[0].get_ydata(), float)
    ok = ~np.isnan(y)
    np.testing.assert_allclose(y[ok], 1.0 / ds["smoothed_variance"].values)
    assert plot.plot_overview(ds, smoothed=False)[-1].get_ylabel() == "filtered precision"
    assert plot.plot_precision(ds).get_ylabel() == "filtered precision"
    assert plot.plot_precision(ds, smoothed=True).get_ylabel() == "smoothed precision"


def test_legends_sit_outside_the_data():
    """F3: the legend (8-9 entries at "best") covered data in real-data figures. On a figure with
    a layout engine (all the ones these functions make) it sits right of the axes."""
    z = 50 + 40 * np.sin(np.arange(300) / 5.0) + np.random.default_rng(2).normal(size=300)
    ds = OUModel(theta=0.1, sigma2=10.0, mu=50.0, obs_var=1.0).to_dataset(z, forecast_steps=10)
    axes = plot.plot_overview(ds)
    fig = axes[0].figure
    fig.canvas.draw()
    for ax in axes:
        box, leg = ax.get_window_extent(), ax.get_legend().get_window_extent()
        assert leg.x0 >= box.x1, (leg, box)
        assert leg.x1 <= fig.bbox.x1 + 1  # (inside the figure: the layout made room)
    ax = plot.plot_bands(np.arange(300.0), z, np.ones(300), observed=z)
    ax.figure.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1
    # axes of a figure without a layout engine: inside, at "best", as before
    fig, own = plt.subplots()
    plot.plot_bands(np.arange(300.0), z, np.ones(300), observed=z, ax=own)
    assert own.get_legend()._loc == 0


def test_the_forecast_level_band_joins_and_the_predictive_interval_is_drawn_apart():
    """F3: the forecast band started at the last time with the level band's width and jumped to
    the predictive (level + obs_var) width at the first step. Now the shaded forecast band is the
    level's (joined without a jump), the predictive interval dotted lines from the first step."""
    stamps = np.datetime64("2024-01-01") + np.arange(0, 60, 2).astype("timedelta64[D]")
    m = OUModel(theta=0.1, sigma2=0.5, mu=1.0, obs_var=0.2, time_unit="1D")
    _, z = m.simulate(stamps, seed=0)
    ds = m.to_dataset(z, stamps, forecast_steps=6, coverage=(0.5, 0.9))
    ax = plot.plot_series(ds)
    bands = [c for c in ax.collections if c.get_label() == "90% band"]
    assert len(bands) == 2  # the level's and its forecast, one legend entry
    verts = bands[1].get_paths()[0].vertices
    t0 = matplotlib.dates.date2num(stamps[-1])
    t1 = matplotlib.dates.date2num(ds["forecast_time"].values[0])
    m_T, v_T = ds["smoothed_mean"].values[-1], ds["smoothed_variance"].values[-1]
    at_t0 = np.sort(verts[np.isclose(verts[:, 0], t0), 1])
    np.testing.assert_allclose(at_t0[[0, -1]], [m_T - Q90 * np.sqrt(v_T), m_T + Q90 * np.sqrt(v_T)])
    fm, flv = ds["forecast_mean"].values[0], ds["forecast_variance"].values[0]
    at_t1 = np.sort(verts[np.isclose(verts[:, 0], t1), 1])
    np.testing.assert_allclose(at_t1[[0, -1]], [fm - Q90 * np.sqrt(flv), fm + Q90 * np.sqrt(flv)])
    pred = _line(ax, "90% predictive")
    assert pred.get_linestyle() == ":"
    y = np.asarray(pred.get_ydata(), float)
    fsd = np.sqrt(ds["forecast_predictive_variance"].values)
    fms = ds["forecast_mean"].values
    np.testing.assert_allclose(y[:6], fms - Q90 * fsd)
    np.testing.assert_allclose(y[7:], fms + Q90 * fsd)
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts.count("90% band") == 1
    # plot_bands with the predictive variance only: no shaded forecast band to jump
    bx = plot.plot_bands(
        np.arange(5.0),
        np.zeros(5),
        np.ones(5),
        forecast_times=[5.0, 6.0],
        forecast_mean=[0.0, 0.0],
        forecast_var=[3.0, 4.0],
    )
    assert len([c for c in bx.collections if c.get_label() == "90% band"]) == 1
    assert "90% predictive" in bx.get_legend_handles_labels()[1]
    with pytest.raises(ValueError, match="forecast_level_var: expected the shape"):
        plot.plot_bands(
            np.arange(5.0),
            np.zeros(5),
            np.ones(5),
            forecast_times=[5.0, 6.0],
            forecast_mean=[0.0, 0.0],
            forecast_var=[3.0, 4.0],
            forecast_level_var=[1.0],
        )


def test_the_overview_says_which_series_it_leaves_out():
    """F3: plot_overview drew the first max_series and said nothing of the rest."""
    z = np.random.default_rng(5).normal(size=(40, 5))
    names = ["a", "b", "c", "d", "e"]
    ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z, series_coords={"series": names})
    fig = plot.plot_overview(ds)[0].figure
    assert fig._suptitle.get_text() == "the first 4 of 5 series (max_series=4); not drawn: series=e"
    assert plot.plot_overview(ds, max_series=5)[0].figure._suptitle is None
    assert plot.plot_overview(ds, series=2)[0].figure._suptitle is None
    many = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(np.ones((10, 9)))
    fig = plot.plot_overview(many, max_series=2)[0].figure
    assert fig._suptitle.get_text() == "the first 2 of 9 series (max_series=2)"
    # a title the figure has is kept, the note under it
    fig, axes = plt.subplots(5, 1, layout="constrained")
    fig.suptitle("mine")
    plot.plot_overview(ds, axes=axes)
    assert fig._suptitle.get_text().startswith("mine\nthe first 4 of 5 series")


def test_api_md_says_plot_series_needs_series_for_several():
    """F1: api.md's table gave ``series=None`` without saying it raises for several series."""
    text = (DOCS / "api.md").read_text()
    row = [ln for ln in text.splitlines() if ln.startswith("| `plot_series(")][0]
    assert "required for a Dataset of several series" in row and "ValueError" in row
    m = OUModel(sigma2=1.0, obs_var=1.0)
    with pytest.raises(ValueError, match="pick one with an int"):
        plot.plot_series(m.to_dataset(np.ones((5, 2))))


def test_model_md_nile_forecast_row_says_at_which_parameters():
    """F4: the row gave 798.3703, 143.5279 without saying these are at the published variances
    (15099, 1469.1); the MLE (what the demo prints) gives 798.3673, 143.5265."""
    import kalmanscan as ks
    from kalmanscan.timeseries import load_nile

    row = [ln for ln in (DOCS / "model.md").read_text().splitlines() if "1971 forecast" in ln][0]
    assert "(15099, 1469.1)" in row
    years, flow = load_nile()
    fit = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0})
    published = OUModel(theta=0.0, mu=0.0, obs_var=15099.0, sigma2=1469.1)
    for model in (published, fit.model):
        fc = model.forecast(flow, years, steps=1, coverage=0.9)
        mean, se = f"{fc.mean[0]:.4f}", f"{np.sqrt(fc.predictive_var[0]):.4f}"
        assert re.search(rf"{mean}, {se}", row), (mean, se, row)
        assert f"[{fc.lower[0]:.2f}, {fc.upper[0]:.2f}]" == "[562.29, 1034.45]"


def test_overlapping_missing_spans_are_shaded_once():
    """A NaN run (shaded to the midpoints with its neighbours) and the long gap between the
    observations around it overlapped, and their two alpha layers drew darker edges."""
    z = np.random.default_rng(6).normal(size=60)
    z[20:40] = np.nan
    ax = plot.plot_series(OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z))
    grey = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx((0.85,) * 3)]
    assert len(grey) == 1
    assert grey[0].get_x() == pytest.approx(19.0) and grey[0].get_width() == pytest.approx(21.0)
