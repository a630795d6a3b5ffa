"""Docs and comments that state facts: docs/api-core.md documents the refusal of float64
parameters that change meaning in z's dtype (with the limits and the remedy the code uses, and a
doctest of the message), and the Grunfeld comment in tests/test_real_data_csv_formats.py gives
the panel statsmodels ships."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.core._args import _ROUNDED_MEANING, _rounding_limits

ROOT = Path(__file__).resolve().parents[1]
API_CORE = ROOT / "docs" / "api-core.md"
DENSE_NAMES = {"F", "H", "Q", "R", "prior_cov", "prior_precision"}


def _rounding_paragraph() -> str:
    text = API_CORE.read_text()
    start = text.index("- dtypes:")
    end = text.index("- `backend`:", start)
    return " ".join(text[start:end].split())


def test_api_core_documents_the_rounding_refusal():
    doc = _rounding_paragraph()
    assert "raises `ValueError` naming the argument" in doc
    # every parameter whose 0 means something, with its meaning, and the limits of the cast
    # (the scalar API's names here; the dense API's in docs/dense.md)
    dense = (ROOT / "docs" / "dense.md").read_text()
    for name, zero in _ROUNDED_MEANING:
        if zero:
            assert f"`{name}`" in (dense if name in DENSE_NAMES else doc), name
    to_zero, to_inf = _rounding_limits(torch.float32)
    m0 = re.search(r"magnitude ≤ ([0-9.e+-]+)\)", doc)
    mi = re.search(r"magnitude ≥ ([0-9.e+-]+)\)", doc)
    assert m0 and float(m0.group(1)) == pytest.approx(to_zero, rel=1e-2)
    assert mi and float(mi.group(1)) == pytest.approx(to_inf, rel=1e-7)
    assert "Remedy: pass `z` as float64, or rescale the data and model" in doc
    # the remedy is the message's
    with pytest.raises(ValueError, match="pass z as float64, or rescale the data and model"):
        ks.filter(np.float32([1.0, 2.0]), obs_var=1e-50, decay=1.0, process_var=0.1)


def test_api_core_rounding_example_runs():
    """The paragraph's example is a doctest (the whole file runs in tests/test_core_api.py)."""
    doc = _rounding_paragraph()
    assert ">>> ks.filter(np.float32([1.0, 2.0]), obs_var=1.0, decay=1e-50" in doc
    res = doctest.testfile(str(API_CORE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_grunfeld_comment_gives_the_shipped_panel():
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.grunfeld.load_pandas().data
    src = (ROOT / "tests" / "test_real_data_csv_formats.py").read_text()
    m = re.search(r"grunfeld\.load_pandas\(\)\.data\s+# (\d+) firms x (\d+) years", src)
    assert m, "the comment on the Grunfeld panel"
    assert (int(m.group(1)), int(m.group(2))) == (d["firm"].nunique(), d["year"].nunique())
    assert (
        f"({d['firm'].nunique()} firms x {d['year'].nunique()} years"
        in (ROOT / "docs" / "cli.md").read_text()
    )
