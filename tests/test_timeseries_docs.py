"""The runnable examples in the docstrings of the time-series layer."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["kalmanscan.timeseries.times", "kalmanscan.timeseries.model", "kalmanscan.timeseries.fit",
           "kalmanscan.timeseries.data", "kalmanscan.xarray", "kalmanscan.plot"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in ("kalmanscan.xarray", "kalmanscan.plot"):
        pytest.importorskip("xarray")
    if name == "kalmanscan.plot":
        matplotlib = pytest.importorskip("matplotlib")
        matplotlib.use("Agg")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
