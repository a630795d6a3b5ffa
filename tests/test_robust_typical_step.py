"""One typical step for both screens of gross values (:func:`robust._typical_step`, the median
nonzero change between neighbours): the runs of a code (:func:`robust.gross_runs`) and the values
beyond float64's reach (``robust._gross``, the first round when the plain fit cannot start). On
integer counts that rest on 0 (statsmodels' ``fair`` survey: affairs, 69% of the changes zero,
more than half the values 0) a median counting the zero changes is 0, and the old fallback (the
median absolute deviation, also 0) took every nonzero count for gross: too many to screen, so a
1e300 stayed and ``robust=True`` failed with the plain fit's scale error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries.robust import _gross, _typical_step, gross_runs


def _affairs():
    sm = pytest.importorskip("statsmodels.api")
    return sm.datasets.fair.load_pandas().data["affairs"].to_numpy(np.float64, copy=True)


def test_typical_step_leaves_out_zero_changes():
    held = np.repeat([5.0, 5.25, 5.0, 4.75, 4.5], 30)  # a rate held for a month at a time
    assert _typical_step(held) == 0.25
    assert np.isnan(_typical_step(np.ones(10)))  # never moves: no typical step
    cols = np.column_stack([held, 2 * held, np.ones(150)])
    np.testing.assert_array_equal(_typical_step(cols), [0.25, 0.5, np.nan])


def test_gross_screen_finds_a_1e300_among_counts_that_rest_on_zero():
    z = _affairs()
    assert np.median(np.abs(np.diff(z))) == 0 and np.median(np.abs(z - np.median(z))) == 0
    for rows in ([10], [10, 11]):
        bad = z.copy()
        bad[rows] = [1e300, 5e299][: len(rows)]
        assert np.flatnonzero(_gross(bad[:, None])[:, 0]).tolist() == rows
    assert not _gross(z[:, None]).any()


def test_robust_fit_of_counts_screens_two_adjacent_values_beyond_float64():
    """1e300 next to 5e299: no run of gross_runs (they differ by more than 50 steps), so the
    first round is the screen of values beyond float64's reach."""
    z = _affairs()
    z[[10, 11]] = [1e300, 5e299]
    assert not gross_runs(z[:, None]).any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="expected a scale from 1e-150 to 1e150"):
            ks.fit_ou(z)
        fit = ks.fit_ou(z, robust=True)
    assert fit.outliers[[10, 11]].all() and np.isnan(fit.z[[10, 11]]).all()
    assert np.isfinite(fit.params["obs_var"]) and fit.params["obs_var"] < 100.0


def test_a_constant_record_with_one_1e300_still_screens_it():
    """The only moves are those to and from the 1e300 (the typical step is the 1e300): where more
    than half the values are one value, the values off it are screened, at most a quarter."""
    spike = np.ones(50)
    spike[10] = 1e300
    assert np.flatnonzero(_gross(spike[:, None])[:, 0]).tolist() == [10]
    # rare events (counts of 0 and 1) and a 1e300: the typical step is 1; the 1s stay
    rare = np.zeros(50)
    rare[[3, 17, 25, 33, 41, 47]] = 1.0
    rare[10] = 1e300
    assert np.flatnonzero(_gross(rare[:, None])[:, 0]).tolist() == [10]


def test_typical_step_leaves_out_the_jumps_into_and_out_of_remote_values():
    """Five -9999 among rates held for a month at a time make ten jumps of ~10,000 against the
    rate's four moves of 0.25: counted, they were the typical step."""
    held = np.repeat([5.0, 5.25, 5.0, 4.75, 4.5], 30)
    coded = held.copy()
    coded[[10, 40, 70, 100, 130]] = -9999.0
    assert _typical_step(coded) == 0.25
    spike = held.copy()
    spike[[10, 11]] = [1e300, 5e299]  # beyond float64's reach: their jumps are left out too
    assert _typical_step(spike) == 0.25
    cols = np.column_stack([coded, 2 * coded, spike, np.ones(150)])
    np.testing.assert_array_equal(_typical_step(cols), [0.25, 0.5, 0.25, np.nan])
    assert np.flatnonzero(gross_runs(coded[:, None])[:, 0]).tolist() == [10, 40, 70, 100, 130]


def test_a_record_that_moves_only_to_and_from_one_far_value_takes_its_levels_size():
    const = np.full(40, 4.0)
    const[[10, 11, 30]] = -9999.0
    assert _typical_step(const) == 4.0 / 50  # -9999 is 2,500 "steps" from 4
    assert np.flatnonzero(gross_runs(const[:, None])[:, 0]).tolist() == [10, 11, 30]
    # a record resting on 0 has no level to take a size from (0/1 events look the same)
    zeros = np.zeros(40)
    zeros[[10, 11]] = -9999.0
    assert _typical_step(zeros) == 9999.0 and not gross_runs(zeros[:, None]).any()
