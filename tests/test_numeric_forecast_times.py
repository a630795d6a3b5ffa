"""Forecast times of numeric labels written with few decimals (1959.1, 1959.2, ...) are those
decimals, not their float sums' noise (results.csv wrote 1968.6000000000004)."""

import numpy as np

from kalmanscan.timeseries.times import as_time_axis


def test_decimal_labels_forecast_decimal_times():
    t = np.round(np.array([1959.1 + 0.1 * i for i in range(96)]), 1)
    got = as_time_axis(t, t.size).future(4)
    assert [repr(float(x)) for x in got] == ["1968.7", "1968.8", "1968.9", "1969.0"]
    q = np.array([2.25, 2.5, 2.75, 3.0])
    assert as_time_axis(q, 4).future(2).tolist() == [3.25, 3.5]


def test_epoch_seconds_and_irregular_times_unchanged():
    e = np.arange(1709430000, 1709430000 + 3600 * 10, 3600).astype(float)
    assert as_time_axis(e, e.size).future(2).tolist() == [1709466000.0, 1709469600.0]
    r = np.cumsum(np.random.default_rng(0).exponential(1.0, size=20))
    step = np.median(np.diff(r))
    np.testing.assert_array_equal(as_time_axis(r, 20).future(2), r[-1] + np.arange(1, 3) * step)
