"""``OUFit`` lives in kalmanscan.timeseries.result; the old path kalmanscan.timeseries.fit.OUFit
(imports, and pickles written before the split) still names the same class."""

from __future__ import annotations

import pickle
from collections.abc import Mapping

import numpy as np

import kalmanscan
import kalmanscan.timeseries.fit as fit_module
import kalmanscan.timeseries.result as result_module
from kalmanscan.timeseries import load_nile

LL = {"theta": 0.0, "mu": 0.0}


def _same_fit(a, b):
    assert type(a) is type(b) is result_module.OUFit
    for name in ("params", "stderr", "fixed", "loglik", "at_boundary", "upper_bound"):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, Mapping):  # (np.testing compares a Mapping not a dict with ==)
            x, y = dict(x), dict(y)
        np.testing.assert_equal(x, y)  # NaN equal to NaN
    assert (a.converged, a.n_iter, a.n_obs, a.joint, tuple(a.notes)) == (
        b.converged, b.n_iter, b.n_obs, b.joint, tuple(b.notes),
    )  # fmt: skip
    np.testing.assert_array_equal(a.z, b.z)
    np.testing.assert_array_equal(a.time_axis.t, b.time_axis.t)
    assert a.summary() == b.summary()


def test_one_class_under_both_paths():
    assert fit_module.OUFit is result_module.OUFit
    assert kalmanscan.OUFit is kalmanscan.timeseries.OUFit is result_module.OUFit
    assert result_module.OUFit.__module__ == "kalmanscan.timeseries.result"
    assert fit_module._decimals is result_module._decimals


def test_pickle_round_trip_of_a_fit():
    years, flow = load_nile()
    fit = kalmanscan.fit_ou(flow, years, fix=LL)
    data = pickle.dumps(fit)
    assert b"kalmanscan.timeseries.result" in data
    _same_fit(pickle.loads(data), fit)


def test_a_pickle_naming_the_old_path_loads(monkeypatch):
    years, flow = load_nile()
    fit = kalmanscan.fit_ou(flow, years, fix=LL)
    with monkeypatch.context() as m:  # written as before the split: kalmanscan.timeseries.fit
        m.setattr(result_module.OUFit, "__module__", "kalmanscan.timeseries.fit")
        data = pickle.dumps(fit)
    assert b"kalmanscan.timeseries.fit" in data and b"kalmanscan.timeseries.result" not in data
    _same_fit(pickle.loads(data), fit)


def test_pickle_and_copy_of_a_fit_with_an_estimate_on_its_bound():
    """White noise fitted as a local level: sigma2 on its bound 0, whose profile bound and notes
    are computed when first read. Pickling and deepcopy take them as values (the lazy objects
    held a function local to the fit and could not be pickled)."""
    import copy
    import warnings

    z = np.random.default_rng(0).normal(size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = kalmanscan.fit_ou(z, fix=LL)
    assert fit.at_boundary["sigma2"]
    for back in (pickle.loads(pickle.dumps(fit)), copy.deepcopy(fit)):
        _same_fit(back, fit)
        assert isinstance(back.upper_bound, dict) and isinstance(back.notes, tuple)
        assert back.upper_bound["sigma2"] > 0
