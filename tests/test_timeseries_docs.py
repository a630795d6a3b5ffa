"""The runnable examples in the docstrings of the time-series layer."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "kalmanscan.timeseries.times",
    "kalmanscan.timeseries.time_parse",
    "kalmanscan.timeseries.time_calendar",
    "kalmanscan.timeseries.time_periods",
    "kalmanscan.timeseries.coverage",
    "kalmanscan.timeseries.model",
    "kalmanscan.timeseries.model_input",
    "kalmanscan.timeseries.model_numerics",
    "kalmanscan.timeseries.model_forecast",
    "kalmanscan.timeseries.fit",
    "kalmanscan.timeseries.result",
    "kalmanscan.timeseries.profile",
    "kalmanscan.timeseries.robust",
    "kalmanscan.timeseries.data",
    "kalmanscan.timeseries.dataset",
    "kalmanscan.timeseries.cli",
    "kalmanscan.timeseries.csvfile",
    "kalmanscan.timeseries.csv_layout",
    "kalmanscan.timeseries.outputs",
    "kalmanscan.timeseries._messages",
    "kalmanscan.xarray",
    "kalmanscan.plot",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in ("kalmanscan.timeseries.dataset", "kalmanscan.xarray", "kalmanscan.plot"):
        pytest.importorskip("xarray")
    if name == "kalmanscan.plot":
        matplotlib = pytest.importorskip("matplotlib")
        matplotlib.use("Agg")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


def test_api_page_examples():
    import pathlib

    pytest.importorskip("polars")  # (the page's polars example; a test extra)

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
    result = doctest.testfile(
        str(page), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0


def test_getting_started_snippets_run(tmp_path, monkeypatch):
    """The python blocks of docs/getting-started.md run in order (in a scratch directory)."""
    import pathlib
    import re

    pytest.importorskip("xarray")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    repo = pathlib.Path(__file__).resolve().parents[1]
    text = (repo / "docs" / "getting-started.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(repo)
    scope = {}
    for block in blocks:
        if "da.kalman" in block:  # needs a user DataArray; run it on a small one
            import numpy as np
            import xarray as xr

            scope["da"] = xr.DataArray(
                np.random.default_rng(0).normal(size=(30, 2)).cumsum(0) + 5,
                dims=("time", "station"),
            )
        block = block.replace('savefig("bands.png")', f'savefig(r"{tmp_path / "bands.png"}")')
        exec(compile(block, "getting-started.md", "exec"), scope)
    assert scope["fc"].mean.shape == (1, 2)  # the last forecast: one timestamp, two sensors
    assert (tmp_path / "bands.png").exists()


def test_model_page_examples():
    """docs/model.md's examples (the boundary bound on statsmodels' CO2, the robust Nile fit)."""
    import pathlib

    pytest.importorskip("statsmodels")
    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "model.md"
    result = doctest.testfile(
        str(page), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted >= 8 and result.failed == 0
