"""OUModel over a gap of 1e308: the predicted variance after it is beyond float64 in the data's
units (inf, as kalmanscan.filter gives it), with no RuntimeWarning from the unit rescaling."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kalmanscan.timeseries import OUModel

TIMES = [0.0, 1.0, 2.0, 1e308]


@pytest.mark.parametrize("method", ["smooth", "filter"])
def test_huge_gap_no_overflow_warning(method):
    z = np.array([1.0, 2.0, 3.0, 4.0])
    m = OUModel(theta=0, sigma2=10, obs_var=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = getattr(m, method)(z, TIMES)
    f = res.filtered if method == "smooth" else res
    # sigma2 * 1e308 = 1e309 past float64's maximum: inf; the step before it is finite
    assert f.pred_var[-1] == np.inf
    np.testing.assert_allclose(f.pred_var[1], 10.3, rtol=1e-6)
    assert 0 < f.pred_precision[-1] < 1e-300
    # the last observation stands alone: its filtered mean is z, its variance obs_var
    np.testing.assert_allclose(f.mean[-1], 4.0, rtol=1e-6)
    np.testing.assert_allclose(f.var[-1], 0.3, rtol=1e-6)
    if method == "smooth":
        np.testing.assert_allclose(res.mean, [1.0291262, 2.0, 2.9708738, 4.0], rtol=1e-6)
        np.testing.assert_allclose(res.var[-1], 0.3, rtol=1e-6)


def test_huge_gap_float32_data_names_the_variance():
    """float32 data: the gap's process variance (1.6e307 in the data's units) is beyond float32,
    refused with the remedy, and no RuntimeWarning."""
    z = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^process_var: .*rounds to inf.*pass z as float64"):
            OUModel(theta=0, sigma2=10, obs_var=0.3).smooth(z, TIMES)
