"""results.png says when it draws only some of the series."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("xarray")


def _titles(monkeypatch, n_series, tmp_path):
    import matplotlib.figure

    from kalmanscan.timeseries import OUModel
    from kalmanscan.timeseries.outputs import _write_outputs

    seen = []
    real = matplotlib.figure.Figure.suptitle

    def suptitle(self, t, **kw):
        seen.append(t)
        return real(self, t, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", suptitle)
    z = np.random.default_rng(0).normal(size=(30, n_series))
    ds = OUModel(sigma2=1.0, obs_var=1.0).to_dataset(z)
    paths = _write_outputs(ds, str(tmp_path / f"o{n_series}"), "results", "s", title="T")
    assert all(p for p in paths)
    return seen


def test_some_series_said(monkeypatch, tmp_path):
    # plot_overview's own title says it first; results.png's replaces it (once, with the files)
    title = _titles(monkeypatch, 6, tmp_path)[-1]
    assert title.startswith("T\n") and title.count("first 4 of 6 series") == 1
    assert "results.nc" in title and "results.csv" in title


def test_all_series_no_note(monkeypatch, tmp_path):
    assert _titles(monkeypatch, 4, tmp_path) == ["T"]
