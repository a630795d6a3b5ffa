"""Many missing stretches are shaded by one artist (an axvspan each took 83 s in the CLI for the
21,000 runs of 100,000 hourly rows with 30 % missing at random)."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("xarray")


def _dataset(T, frac, seed=0):
    import pandas as pd

    import kalmanscan as ks

    rng = np.random.default_rng(seed)
    z = rng.normal(size=T).cumsum() * 0.1
    z[rng.random(T) < frac] = np.nan
    t = pd.date_range("2020-01-01", periods=T, freq="h")
    return ks.OUModel(theta=0.01, sigma2=0.01, obs_var=1.0, time_unit="1h").to_dataset(
        pd.Series(z, index=t)
    ), z


def test_many_runs_one_collection_same_spans():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from kalmanscan.plot import _missing_spans, plot_series

    ds, z = _dataset(3000, 0.3)
    ax = plot_series(ds)
    grey = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_label() != ""]
    bars = [c for c in grey if "missing" in c.get_label()]
    assert len(bars) == 1  # one artist, labelled once
    spans = _missing_spans(ds["time"].values, z)
    assert len(spans) > 500
    assert len(bars[0].get_paths()) == len(spans)  # every run is drawn
    assert len(ax.patches) < 50  # no patch a run
    # the rectangles are the runs' spans, in the axes' x units
    import matplotlib.dates as mdates

    x0 = [p.vertices[:, 0].min() for p in bars[0].get_paths()]
    want = mdates.date2num(np.array([a for a, _ in spans], dtype="datetime64[s]"))
    np.testing.assert_allclose(sorted(x0), sorted(want), rtol=0, atol=1e-9)
    plt.close(ax.figure)


def test_few_runs_keep_spans():
    import matplotlib.pyplot as plt

    from kalmanscan.plot import plot_series

    ds, _ = _dataset(200, 0.02, seed=1)
    ax = plot_series(ds)
    assert 0 < len([p for p in ax.patches if p.get_label() != "_nolegend_"]) <= 50
    plt.close(ax.figure)
