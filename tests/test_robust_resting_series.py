"""Codes in series that seldom move. The typical step of :func:`robust.gross_runs` (the median
nonzero change between neighbours, :func:`robust._typical_step`) counted the jumps into and out
of a -9999 code among the series' own moves: in a rate held for months whose moves a code's jumps
outnumber, the step was the code's own size (10,001 for four codes among rates of 2.25 to 2.75),
nothing was a gross run, and ``fit_ou(robust=True)`` fitted the codes as the level. A record held
at 2.5 but for one move (or none) and ending in two -9999 got no warning, and the robust fit
screened rows 47 and 48 (a 2.5 and the first code) instead of the codes at 48 and 49. The step now
leaves out the changes into and out of values remote from the rest, and a record that never moves
but to and from one far value takes its level's size."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.timeseries.robust import OutlierWarning, _typical_step, gross_runs


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, caught


def _held_rate():
    """48 months of a rate held at 2.25 to 2.75: four moves of 0.25."""
    return np.repeat([2.5, 2.75, 2.75, 2.5, 2.25, 2.5], 8)


def _one_move():
    """A rate held at 2.5 for 20 months and at 2.6 for 30: one move."""
    z = np.full(50, 2.5)
    z[20:] = 2.6
    return z


def test_four_isolated_codes_in_a_rate_held_for_months_are_gross_runs():
    clean = _held_rate()
    z = clean.copy()
    rows = [5, 15, 25, 35]
    z[rows] = -9999.0  # eight jumps of ~10,000 against the rate's four moves of 0.25
    assert _typical_step(z) == 0.25 == _typical_step(clean)
    assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows
    fit, _ = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == rows
    missing = clean.copy()
    missing[rows] = np.nan
    want, _ = _quiet(ks.fit_ou, missing)  # exactly the Gaussian fit without those months
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert fit.params[p] == pytest.approx(want.params[p], rel=1e-6, abs=1e-12), p


@pytest.mark.parametrize(
    "rows", [[48, 49], [0, 1], [30, 31], [5, 15, 30, 40]],
    ids=["last-two", "first-two", "middle-two", "four-isolated"],
)  # fmt: skip
def test_codes_in_a_record_held_but_for_one_move_are_gross_runs(rows):
    z = _one_move()
    z[rows] = -9999.0
    assert _typical_step(z) == pytest.approx(0.1)
    assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows
    fit, caught = _quiet(ks.fit_ou, z)  # the plain fit names exactly the codes
    gross = [w.message for w in caught if isinstance(w.message, OutlierWarning)]
    assert len(gross) == 1 and gross[0].gross and gross[0].rows.tolist() == rows


def test_the_robust_fit_screens_the_codes_in_the_last_two_rows_not_the_rows_before():
    z = _one_move()
    z[[48, 49]] = -9999.0
    fit, _ = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [48, 49]
    assert fit.z[47] == 2.6 and np.isnan(fit.z[[48, 49]]).all()
    missing = _one_move()
    missing[[48, 49]] = np.nan
    want, _ = _quiet(ks.fit_ou, missing)
    for p in ("sigma2", "mu"):
        assert fit.params[p] == pytest.approx(want.params[p], rel=1e-6), p


@pytest.mark.parametrize(
    "rows", [[48, 49], [0, 1], [20, 21], [5, 15, 30, 40]],
    ids=["last-two", "first-two", "middle-two", "four-isolated"],
)  # fmt: skip
def test_codes_in_a_constant_record_are_gross_and_the_robust_fit_says_the_rest_is_constant(rows):
    """No move of its own: the level's size (2.5) stands in for the step. Without the codes the
    record is constant, which has no estimate: the robust fit says so and names the codes,
    instead of screening other rows (47 and 48 for the last two) and fitting the codes."""
    z = np.full(50, 2.5)
    z[rows] = -9999.0
    assert _typical_step(z) == pytest.approx(2.5 / 50)
    assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows
    with pytest.raises(ValueError, match="every observed value is 2.5") as err:
        _quiet(ks.fit_ou, z, robust=True)
    named = f"row {rows[0]} (time {rows[0]}, z = -9999), row {rows[1]} (time {rows[1]}, z = -9999)"
    assert f"robust=True fitted without the gross values {named}" in str(err.value)


def test_codes_that_cut_a_resting_series_into_short_stretches():
    """Every stretch between codes is short (at most a quarter of the series) and, in a resting
    series, the first and last are one repeated value: each looks like a run, and no value
    outside runs was left to judge them against (nothing was flagged). The series' median is
    that reference now."""
    cases = [
        (np.full(50, 2.5), [9, 22, 30, 40]),
        (_one_move(), [10, 20, 31, 37]),
        (_held_rate(), [3, 11, 24, 28, 38, 45]),
    ]
    for clean, rows in cases:
        z = clean.copy()
        z[rows] = -9999.0
        assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows, rows


def test_records_that_rest_on_zero_keep_their_events():
    """Rare 0/1 events and counts resting on 0 have no level to stand in for a step: their
    moves are the step, and no event is gross."""
    rare = np.zeros(60)
    rare[[7, 19, 33, 47]] = 1.0
    end = np.zeros(60)
    end[[58, 59]] = 1.0  # an event at the end: a level shift or a start, not a code
    counts = np.zeros(60)
    counts[[3, 11, 12, 30, 41, 55]] = [2.0, 1.0, 5.0, 1.0, 3.0, 1.0]
    for z in (rare, end, counts):
        assert not gross_runs(z[:, None]).any()
    assert _typical_step(rare) == 1.0 == _typical_step(end)
    assert _typical_step(counts) == 2.0


def _records():
    sm = pytest.importorskip("statsmodels.api")
    ds = sm.datasets
    out = {
        "nile": ds.nile.load_pandas().data["volume"].to_numpy(np.float64),
        "sunspots": ds.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(np.float64),
        "elnino": ds.elnino.load_pandas().data.iloc[:, 1:].to_numpy(np.float64).ravel(),
        "affairs": ds.fair.load_pandas().data["affairs"].to_numpy(np.float64),
    }
    for c, v in ds.cpunish.load_pandas().data.items():
        out[f"cpunish {c}"] = v.to_numpy(np.float64)
    for c, v in ds.strikes.load_pandas().data.items():
        out[f"strikes {c}"] = v.to_numpy(np.float64)
    tbil = ds.macrodata.load_pandas().data["tbilrate"].to_numpy(np.float64)
    out["tbilrate in 0.25"] = np.round(tbil * 4) / 4
    out["tbilrate in 0.25, held 3 months"] = np.repeat(out["tbilrate in 0.25"], 3)
    out["nile to 100"] = np.round(out["nile"], -2)
    out["elnino to 1"] = np.round(out["elnino"])
    out["sunspots to 10"] = np.round(out["sunspots"], -1)
    return out


def test_real_records_keep_their_typical_step_and_have_no_gross_run():
    """Leaving out remote values changes the step of no real record (the counts of affairs reach
    47 spreads from their median, under the 50 that makes a value remote)."""
    for name, v in _records().items():
        assert not gross_runs(v[:, None]).any(), name
        step = np.abs(np.diff(v))
        assert _typical_step(v) == np.median(step[step > 0]), name


def test_four_isolated_codes_in_a_real_rate_held_for_months():
    v = _records()["tbilrate in 0.25, held 3 months"]  # 76% of the changes are 0
    for rows in ([40, 200, 350, 500], [0, 1], [v.size - 2, v.size - 1], [200]):
        z = v.copy()
        z[rows] = -9999.0
        assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows, rows
        assert _typical_step(z) == _typical_step(v), rows


def test_cli_warns_about_codes_ending_a_rate_held_for_months(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    z = _one_move()
    z[[48, 49]] = -9999.0
    months = pd.date_range("2001-01-01", periods=50, freq="MS").strftime("%Y-%m")
    path = tmp_path / "rate.csv"
    pd.DataFrame({"month": months, "rate": z}).to_csv(path, index=False)
    args = [str(path), "--time-col", "month", "--sigma2", "0.01", "--obs-var", "0.01", "--quiet"]
    assert filter_main([*args, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "warning: 2 values lie more than 50 typical steps" in err
    assert "row 48 (time 2005-01-01, z = -9999), row 49 (time 2005-02-01, z = -9999)" in err
