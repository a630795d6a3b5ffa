"""Series ``fit_ou`` cannot fit (fewer than 2 observations; constant) keep their starting values,
and their log-likelihoods there, which depend on those values only, are left out of
``total_loglik`` and the summary's total (which says so); ``fit.notes`` names them and why."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(40, 3)).cumsum(0), columns=["a", "b", "c"])
    df.iloc[:39, 1] = np.nan  # 'b': a single observation
    df["c"] = 2.0  # 'c': constant
    return df


def _fit(z, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(z, **kw)


def test_total_leaves_out_the_series_not_fitted(frame):
    fit = _fit(frame)
    alone = _fit(frame[["a"]])
    assert fit.converged.tolist() == [True, False, False]
    assert np.isfinite(fit.loglik).all()  # each series' own value is still reported
    assert fit.total_loglik == pytest.approx(alone.total_loglik, rel=1e-12)
    assert fit.total_loglik == pytest.approx(float(fit.loglik[0]), rel=1e-15)


def test_summary_total_line_says_what_it_leaves_out(frame):
    fit = _fit(frame)
    total = [ln for ln in fit.summary().splitlines() if ln.startswith("total loglik")]
    assert len(total) == 1
    line = total[0]
    want = ks.timeseries.result._decimals(fit.total_loglik)
    assert line.startswith(f"total loglik {want} over 40 observations")
    assert "2 series not fitted ('b', 'c') left out" in line
    # a fit of fitted series only says nothing of the kind
    assert "left out" not in _fit(frame[["a"]]).summary()


def test_notes_name_the_series_not_fitted(frame):
    fit = _fit(frame)
    notes = [n for n in fit.notes if "not fitted" in n]
    assert len(notes) == 1, fit.notes
    note = notes[0]
    assert "series 'b' have fewer than 2 observations" in note
    assert "series 'c' are constant" in note
    assert "total_loglik" in note
    assert f"note: {note}" in fit.summary()


def test_positions_name_unlabelled_series_and_joint_fits_count_every_series(frame):
    Z = frame.to_numpy()
    fit = _fit(Z)
    assert fit.total_loglik == pytest.approx(float(fit.loglik[0]), rel=1e-15)
    assert any("series 1 have fewer than 2 observations" in n for n in fit.notes)
    # one parameter set for all: every series' likelihood is at the fitted values
    two = np.stack([Z[:, 0], Z[:, 0][::-1]], 1)
    two[:39, 1] = np.nan
    joint = _fit(two, joint=True)
    assert joint.total_loglik == pytest.approx(float(np.sum(joint.loglik)), rel=1e-15)
    assert not any("not fitted" in n for n in joint.notes)
