"""Messages print numbers as Python writes them (``-1.0``, never ``np.float64(-1.0)``) and give
no index for a single number (0-d value): ``fit_ou_robust``'s threshold and max_rounds,
``check_coverage`` (forecast, to_dataset) and ``kalmanscan.filter``'s range checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.timeseries import OUModel
from kalmanscan.timeseries.coverage import check_coverage
from kalmanscan.timeseries.robust import fit_ou_robust

Z = np.array([1.0, 2.0, 0.5, 3.0, 2.0, 1.0])


def _no_numpy_repr(msg):
    assert "np." not in msg and "array(" not in msg, msg


def test_plain_has_one_implementation():
    from kalmanscan.timeseries import coverage, fit, model, robust
    from kalmanscan.timeseries._messages import _plain

    assert fit._plain is robust._plain is coverage._plain is model._plain is _plain
    assert (_plain(np.float64(-1.0)), _plain(np.float32(1.5)), _plain(np.int64(0))) == (
        "-1.0", "1.5", "0",
    )  # fmt: skip
    assert _plain("3") == "'3'" and _plain(2.5) == "2.5"


@pytest.mark.parametrize(
    ("kw", "err", "text"),
    [
        (dict(threshold=np.float64(-1.0)), ValueError,
         "threshold: expected a finite number > 0, got -1.0"),
        (dict(threshold=np.float32(np.inf)), ValueError,
         "threshold: expected a finite number > 0, got inf"),
        (dict(threshold=np.int64(0)), ValueError, "threshold: expected a finite number > 0, got 0"),
        (dict(max_rounds=np.int64(0)), ValueError, "max_rounds: expected an int >= 1, got 0"),
        (dict(max_rounds=np.float64(2.0)), TypeError, "max_rounds: expected an int >= 1, got 2.0"),
    ],
    ids=["threshold-f64-neg", "threshold-f32-inf", "threshold-i64-0", "max_rounds-i64-0",
         "max_rounds-f64"],
)  # fmt: skip
def test_robust_messages_print_plain_numbers(kw, err, text):
    with pytest.raises(err) as info:
        fit_ou_robust(Z, **kw)
    assert str(info.value) == text
    _no_numpy_repr(str(info.value))


@pytest.mark.parametrize(
    ("coverage", "got"),
    [
        (np.float64(1.5), "got 1.5"),
        (np.float32(0.0), "got 0.0"),
        (1.5, "got 1.5"),
        ([0.5, np.float64(1.5)], "got 1.5 among [0.5, 1.5]"),
        (np.array([0.5, np.nan]), "got nan among [0.5, nan]"),
        ([], "got none"),
    ],
    ids=["f64-scalar", "f32-zero", "python-float", "list-with-np", "array-nan", "empty"],
)
def test_coverage_messages_print_plain_numbers(coverage, got):
    want = f"coverage: expected probabilities strictly between 0 and 1, {got}"
    with pytest.raises(ValueError) as info:
        check_coverage(coverage)
    assert str(info.value) == want
    _no_numpy_repr(str(info.value))
    # what users call: a forecast's coverage
    if np.ndim(coverage) == 0:
        with pytest.raises(ValueError, match=re.escape(want)):
            OUModel(sigma2=1.0, obs_var=1.0).forecast(Z, steps=2, coverage=coverage)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ((np.float64(-1), 1.0, 1.0), "obs_var: expected values > 0 (inf marks a step as not "
                                     "observed), got -1.0"),
        ((-1.0, 1.0, 1.0), "obs_var: expected values > 0 (inf marks a step as not observed), "
                           "got -1.0"),
        ((torch.tensor(-1.0), 1.0, 1.0), "obs_var: expected values > 0 (inf marks a step as not "
                                         "observed), got -1.0"),
        ((1.0, 1.0, np.float64(np.nan)), "process_var: expected values >= 0 and finite, got NaN"),
        ((1.0, 1.0, np.float64(-3.0)), "process_var: expected values >= 0 and finite, got -3.0"),
        ((1.0, 1.0, np.float64(np.inf)), "process_var: expected values >= 0 and finite, got inf"),
    ],
    ids=["obs_var-np0d", "obs_var-python", "obs_var-tensor0d", "process_var-nan",
         "process_var-neg", "process_var-inf"],
)  # fmt: skip
def test_filter_message_has_no_empty_index_for_a_single_number(args, want):
    with pytest.raises(ValueError) as info:
        ks.filter(Z, *args)
    assert str(info.value) == want
    assert "at index ()" not in str(info.value)


def test_filter_message_keeps_the_index_of_an_array_element():
    with pytest.raises(ValueError) as info:
        ks.filter(Z.reshape(3, 2), np.array([[1.0, 1.0], [1.0, -1.0], [1.0, 1.0]]), 1.0, 1.0)
    assert str(info.value).endswith("got -1.0 at index (1, 1)")
