"""Issue 22, outliers (item 4 and "What to build"): ``fit_ou(..., robust=True)`` and
``kalmanscan filter --robust`` screen out an observation that wrecks the Gaussian fit and refit
without it; without ``robust`` a warning names the row that dominates the likelihood. On the
bundled Nile record (Durbin & Koopman's local level) with a planted 1e12."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.testing import assert_close, tolerance
from kalmanscan.timeseries import load_nile
from kalmanscan.timeseries.robust import auxiliary_residuals, default_threshold, fit_ou_robust

# (a robust fit of the Nile, PNG drawn; conftest.png_not_rasterized)
PNG_DRAWN = {"test_cli_robust"}

LOCAL_LEVEL = {"theta": 0.0, "mu": 0.0}
YEARS, FLOW = load_nile()
FLOW = FLOW.astype(np.float64)


def _planted(row=30, value=1e12):
    z = FLOW.copy()
    z[row] = value
    return z


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def clean():
    return ks.fit_ou(FLOW, YEARS, fix=LOCAL_LEVEL)


def test_the_gaussian_fit_is_wrecked_and_the_dominating_row_is_named(clean):
    fit, msgs = _quiet(ks.fit_ou, _planted(), YEARS, fix=LOCAL_LEVEL)
    assert fit.params["obs_var"] > 1e6 * clean.params["obs_var"]  # what robust=True must undo
    dom = [m for m in msgs if "dominates the likelihood" in m]
    assert len(dom) == 1 and "row 30 (time 1901" in dom[0] and "robust=True" in dom[0]


@pytest.mark.parametrize(
    "row,value", [(30, 1e12), (30, -1e12), (0, 1e12), (99, 1e12), (50, 5000.0)],
    ids=["mid-1e12", "mid-neg", "first", "last", "mid-5000"],
)  # fmt: skip
def test_robust_fit_recovers_the_clean_fit(clean, row, value):
    fit, msgs = _quiet(ks.fit_ou, _planted(row, value), YEARS, fix=LOCAL_LEVEL, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [row]
    # exactly the Gaussian fit with that year missing ...
    missing = FLOW.copy()
    missing[row] = np.nan
    want = ks.fit_ou(missing, YEARS, fix=LOCAL_LEVEL)
    for p in ("sigma2", "obs_var"):
        assert fit.params[p] == pytest.approx(want.params[p], rel=tolerance("fit", "float64"))
        # ... and within a fraction of a standard error of the clean fit (one year fewer)
        assert abs(fit.params[p] - clean.params[p]) < 0.3 * clean.stderr[p]
        assert fit.params[p] == pytest.approx(clean.params[p], rel=0.12)
    assert fit.converged and np.isnan(fit.z[row]) and fit.n_obs == 99
    assert np.isfinite(fit.stderr["obs_var"]) and np.isfinite(fit.stderr["sigma2"])
    # the forecast band is the clean one's size, not +-3.5e10
    band = fit.forecast(steps=1).var
    assert float(np.ravel(band)[0]) < 2 * float(np.ravel(clean.forecast(steps=1).var)[0])
    screened = [m for m in msgs if "screened out" in m]
    assert (
        len(screened) == 1 and f"row {row} (time {int(YEARS[row])}, z = {value:.6g})" in screened[0]
    )
    assert not any("dominates" in m for m in msgs)  # the final fit is sound
    assert any("screened out" in n for n in fit.notes)


@pytest.mark.parametrize("value", [1e300, -1e300, 1e200])
def test_robust_screens_a_value_the_plain_fit_cannot_scale(value):
    with pytest.raises(ValueError, match="expected a scale from 1e-150 to 1e150"):
        ks.fit_ou(_planted(30, value), YEARS, fix=LOCAL_LEVEL)
    fit, msgs = _quiet(ks.fit_ou, _planted(30, value), YEARS, fix=LOCAL_LEVEL, robust=True)
    missing = FLOW.copy()
    missing[30] = np.nan
    want = ks.fit_ou(missing, YEARS, fix=LOCAL_LEVEL)
    assert np.flatnonzero(fit.outliers).tolist() == [30]
    assert_close(fit.params["obs_var"], want.params["obs_var"], "fit", "float64")
    assert any(f"row 30 (time 1901, z = {value:.6g})" in m for m in msgs)


def test_robust_keeps_the_fit_error_where_nothing_is_gross():
    with pytest.raises(ValueError, match="constant series"):
        ks.fit_ou(np.ones(20), robust=True)
    spike = np.ones(50)
    spike[10] = 1e300  # screened, then the rest is constant: the fit's own message
    with pytest.raises(ValueError, match="every observed value is 1.0"):
        _quiet(ks.fit_ou, spike, robust=True)


def test_robust_on_clean_data_is_the_gaussian_fit(clean):
    fit, msgs = _quiet(ks.fit_ou, FLOW, YEARS, fix=LOCAL_LEVEL, robust=True)
    assert not fit.outliers.any() and fit.params == clean.params
    assert fit.loglik == clean.loglik and not any("screened" in m for m in msgs)


def test_robust_free_theta_and_mu():
    full = ks.fit_ou(FLOW, YEARS)
    fit, _ = _quiet(ks.fit_ou, _planted(), YEARS, robust=True)
    missing = FLOW.copy()
    missing[30] = np.nan
    want = ks.fit_ou(missing, YEARS)
    assert np.flatnonzero(fit.outliers).tolist() == [30]
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert_close(fit.params[p], want.params[p], "fit", "float64", what=p)
    assert fit.params["mu"] == pytest.approx(full.params["mu"], rel=0.01)


def test_several_outliers_of_different_sizes_in_several_series():
    Z = np.stack([FLOW, 2.0 * FLOW, FLOW], 1)
    Z[10, 0], Z[60, 0], Z[70, 1] = 1e12, 3000.0, -1e9  # 3000: hidden while 1e12 inflates obs_var
    fit, msgs = _quiet(ks.fit_ou, Z, YEARS, fix=LOCAL_LEVEL, robust=True)
    assert sorted(map(tuple, np.argwhere(fit.outliers))) == [(10, 0), (60, 0), (70, 1)]
    clean = ks.fit_ou(np.stack([FLOW, 2.0 * FLOW, FLOW], 1), YEARS, fix=LOCAL_LEVEL)
    np.testing.assert_allclose(fit.params["obs_var"], clean.params["obs_var"], rtol=0.1)
    assert fit.params["obs_var"][2] == clean.params["obs_var"][2]  # the clean series untouched
    note = [m for m in msgs if "screened out" in m][0]
    assert "3 observations" in note and "series 1: row 70" in note


def test_joint_and_pandas_input_keep_labels():
    pd = pytest.importorskip("pandas")
    Z = np.stack([FLOW, FLOW[::-1].copy()], 1)
    Z[5, 1] = 1e12
    df = pd.DataFrame(Z, index=YEARS, columns=["up", "down"])
    fit, msgs = _quiet(ks.fit_ou, df, fix=LOCAL_LEVEL, joint=True, robust=True)
    assert fit.series_labels == ["up", "down"]
    assert np.argwhere(fit.outliers).tolist() == [[5, 1]]
    assert "series 'down': row 5" in [m for m in msgs if "screened" in m][0]
    assert fit.params["obs_var"] < 1e5


@pytest.mark.parametrize("scale", [1e-150, 1e-6, 1.0, 1e100])
def test_robust_is_scale_free(scale):
    ref, _ = _quiet(ks.fit_ou, _planted(), YEARS, fix=LOCAL_LEVEL, robust=True)
    fit, _ = _quiet(ks.fit_ou, _planted() * scale, YEARS, fix=LOCAL_LEVEL, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == [30]
    assert_close(fit.params["obs_var"] / scale**2, ref.params["obs_var"], "rescaled", "float64")


def test_the_screen_is_capped_and_says_so():
    rng = np.random.default_rng(4)
    z = rng.standard_cauchy(size=80)  # heavy tails everywhere: a quarter at most is screened
    fit, msgs = _quiet(fit_ou_robust, z, threshold=0.5, fix=LOCAL_LEVEL)
    assert fit.outliers.sum() <= 20
    assert any("more than a quarter" in m for m in msgs)


def test_auxiliary_residual_is_the_deletion_residual(clean):
    """a_t is z_t against its prediction from every other year (the model held fixed)."""
    a = auxiliary_residuals(clean, FLOW[:, None], np.zeros((100, 1), bool))[:, 0]
    m = clean.model
    for t in (0, 27, 42, 99):
        drop = FLOW.copy()
        drop[t] = np.nan
        sm = m.smooth(drop, YEARS)
        want = (FLOW[t] - sm.mean[t]) / np.sqrt(sm.var[t] + m.obs_var)
        assert_close(a[t], want, "truth", "float64", what=f"a[{t}]")
    assert np.abs(a).max() < 3.5  # clean Nile: nothing beyond the threshold (1913 is ~-2.9)


def test_default_threshold():
    np.testing.assert_allclose(default_threshold([10, 100, 1000, 10**4]), [3.5, 3.5, 4.056, 4.565],
                               atol=1e-3)  # fmt: skip


@pytest.mark.parametrize(
    "kw,err,match",
    [
        (dict(robust="yes"), TypeError, "robust: expected True or False, got 'yes'"),
        (dict(robust=1), TypeError, "robust: expected True or False, got 1"),
    ],
)
def test_bad_robust_argument(kw, err, match):
    with pytest.raises(err, match=match):
        ks.fit_ou(FLOW, **kw)


@pytest.mark.parametrize(
    "kw,err,match",
    [
        (dict(threshold=0), ValueError, "threshold: expected a finite number > 0, got 0"),
        (dict(threshold="3"), TypeError, "threshold: expected a number > 0 or None, got '3'"),
        (dict(max_rounds=0), ValueError, "max_rounds: expected an int >= 1, got 0"),
    ],
)
def test_bad_screen_arguments(kw, err, match):
    with pytest.raises(err, match=match):
        fit_ou_robust(FLOW, **kw)


# --- the CLI --------------------------------------------------------------------------------------
def _nile_csv(tmp_path, z):
    path = tmp_path / "nile.csv"
    rows = "".join(f"{int(y)},{float(v)!r}\n" for y, v in zip(YEARS, z, strict=True))
    path.write_text("year,flow\n" + rows)
    return str(path)


def test_cli_robust(tmp_path, capsys, clean):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    path = _nile_csv(tmp_path, _planted())
    args = [path, "--time-col", "year", "--fit", "--fix", "theta=0", "--fix", "mu=0", "--quiet"]
    assert filter_main([*args, "--out", str(tmp_path / "plain")]) == 0
    plain = capsys.readouterr()
    assert "row 30 (time 1901" in plain.err and "dominates the likelihood" in plain.err
    assert filter_main([*args, "--robust", "--out", str(tmp_path / "rob")]) == 0
    out = capsys.readouterr()
    assert "note: robust: 1 observation screened out" in out.out and "row 30 (time 1901" in out.out
    row = [ln for ln in out.out.splitlines() if ln.strip().startswith("flow")][0].split()
    assert float(row[1]) == pytest.approx(clean.params["sigma2"], rel=0.12)
    assert float(row[3]) == pytest.approx(clean.params["obs_var"], rel=0.12)
    table = pd.read_csv(tmp_path / "rob" / "results.csv")
    data = table[table["kind"] == "data"]
    assert len(data) == 100 and data["outlier"].tolist() == [i == 30 for i in range(100)]
    assert data["observed"].iloc[30] == 1e12  # the input value kept in the table
    assert abs(data["smoothed_mean"].iloc[30] - 800) < 300  # the level ignores it
    assert "outlier" not in pd.read_csv(tmp_path / "plain" / "results.csv").columns


def test_cli_robust_needs_fit(tmp_path, capsys):
    from kalmanscan.timeseries.cli import filter_main

    path = _nile_csv(tmp_path, FLOW)
    rc = filter_main([path, "--sigma2", "1", "--obs-var", "1", "--robust", "--quiet",
                      "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert err == "kalmanscan filter: --fix, --joint and --robust only apply with --fit\n"


# --- runs of a missing-value code (-9999): they hide from a_t (fitted as the level, obs_var 0) ---
def _elnino():
    """Monthly sea surface temperatures of the El Nino region, 1950-2010 (20 to 29 degrees C)."""
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.elnino.load_pandas().data
    return d.iloc[:, 1:].to_numpy(np.float64).ravel()


@pytest.mark.parametrize(
    "rows",
    [[100, 101], [100, 101, 102], [0, 1], [729, 730, 731], [0, 1, 2], [30, 31, 400, 500, 501]],
    ids=["pair", "three", "start-pair", "end-three", "start-three", "pairs-and-one"],
)
def test_robust_screens_runs_of_a_code_in_a_temperature_record(rows):
    sst = _elnino()
    z = sst.copy()
    z[rows] = -9999.0
    plain, msgs = _quiet(ks.fit_ou, z)
    assert plain.params["sigma2"] > 1e3  # the Gaussian fit takes the code for the level
    fit, msgs = _quiet(ks.fit_ou, z, robust=True)
    assert np.flatnonzero(fit.outliers).tolist() == rows
    missing = sst.copy()
    missing[rows] = np.nan
    want, _ = _quiet(ks.fit_ou, missing)  # exactly the Gaussian fit without those months
    for p in ("theta", "sigma2", "mu", "obs_var"):
        assert fit.params[p] == pytest.approx(want.params[p], rel=tolerance("fit", "float64")), p
    assert f"{len(rows)} observations screened out" in [m for m in msgs if "screened" in m][0]


@pytest.mark.parametrize(
    "rows",
    [[100, 101], [0, 1], [729, 730, 731], [30, 31, 400, 401], [30, 31, 400, 500, 501]],
    ids=["pair", "start-pair", "end-three", "two-pairs", "pairs-and-one"],
)
def test_the_plain_fit_names_every_value_of_runs_of_a_code(rows):
    """Without robust=True, the note names the values of each run of -9999 (not the months
    after them, which the filter's innovations point at; nor nothing, for two pairs)."""
    z = _elnino()
    z[rows] = -9999.0
    fit, msgs = _quiet(ks.fit_ou, z)
    said = [n for n in fit.notes if "typical steps" in n]
    assert len(said) == 1 and [m for m in msgs if "typical steps" in m] == ["fit_ou: " + said[0]]
    named = [int(r) for r in re.findall(r"row (\d+) \(time", said[0])]
    assert named == rows
    assert all(re.search(rf"row {r} \(time {r}(\.0)?, z = -9999\)", said[0]) for r in rows)
    assert "dominate the likelihood" in said[0] and "robust=True" in said[0]
    assert "they lie more than 50 typical steps" in said[0]
    assert not any("dominates the likelihood" in n for n in fit.notes if n not in said)


def test_ordinary_records_get_no_note_of_gross_values():
    sm = pytest.importorskip("statsmodels.api")
    ds = sm.datasets
    macro = ds.macrodata.load_pandas().data.iloc[:, 2:]
    records = {
        "nile": FLOW,
        "co2": ds.co2.load_pandas().data["co2"].to_numpy(np.float64),
        "sunspots": ds.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(np.float64),
        "elnino": _elnino(),
        "macrodata": macro.to_numpy(np.float64),  # 12 series, fitted each on its own
    }
    for name, z in records.items():
        fit, msgs = _quiet(ks.fit_ou, z)
        assert not any("typical steps" in n for n in fit.notes), name
        assert not any("typical steps" in m for m in msgs), name


def test_gross_runs_finds_codes_and_no_shift_or_jump_of_real_records():
    from kalmanscan.timeseries.robust import gross_runs

    sm = pytest.importorskip("statsmodels.api")
    ds = sm.datasets
    macro = ds.macrodata.load_pandas().data.iloc[:, 2:]
    fert = ds.fertility.load_pandas().data
    japan = fert[fert.iloc[:, 0] == "Japan"].iloc[0, 4:].astype(float).to_numpy()
    records = {
        "nile": FLOW,
        "co2": ds.co2.load_pandas().data["co2"].to_numpy(np.float64),  # weekly, gaps
        "sunspots": ds.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(np.float64),
        "elnino": _elnino(),
        "japan fertility": japan,  # 1966, Hinoeuma: a one-year dip of ~15 typical steps
        **{f"macro {c}": macro[c].to_numpy(np.float64) for c in macro.columns},
    }
    # US unemployment rate 2019-2021 (%): April 2020 jumps 10 points, then falls back slowly
    records["unemployment"] = np.array([4.0, 3.8, 3.8, 3.7, 3.6, 3.6, 3.7, 3.6, 3.5, 3.6, 3.6, 3.6,
                                        3.5, 3.5, 4.4, 14.8, 13.2, 11.0, 10.2, 8.4, 7.9, 6.9, 6.7,
                                        6.7, 6.4, 6.2, 6.1, 6.1, 5.8, 5.9])  # fmt: skip
    for name, v in records.items():
        assert not gross_runs(v[:, None]).any(), name
        # the same record with a -9999 code: once, twice, three times in a row, at either end,
        # and codes a few values apart (the values between them are no run)
        for rows in ([10], [10, 11], [10, 11, 12], [0, 1], [v.size - 2, v.size - 1], [10, 13],
                     [10, 11, 14, 15], [0, 1, 3], [5, v.size - 3, v.size - 1]):  # fmt: skip
            z = v.copy()
            z[rows] = -9999.0
            if np.isnan(v[rows]).any():
                continue
            assert np.flatnonzero(gross_runs(z[:, None])[:, 0]).tolist() == rows, (name, rows)
    # level shifts (of 500 typical steps) at the middle and at the end, and a trend: no run
    rng = np.random.default_rng(7)
    walk = np.cumsum(rng.normal(size=400))
    for shift_at in (200, 398):
        z = walk.copy()
        z[shift_at:] += 500.0
        assert not gross_runs(z[:, None]).any(), shift_at
    assert not gross_runs((np.arange(400.0) ** 3)[:, None]).any()


def test_cli_warns_about_a_run_of_a_code_and_robust_screens_it(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    sst = _elnino()[:120]
    months = pd.date_range("1950-01-01", periods=120, freq="MS").strftime("%Y-%m")
    z = sst.copy()
    z[[40, 41]] = -9999.0
    path = tmp_path / "sst.csv"
    rows = "".join(f"{m},{v:g}\n" for m, v in zip(months, z, strict=True))
    path.write_text("month,sst\n" + rows)
    base = [str(path), "--time-col", "month", "--quiet"]
    given = ["--sigma2", "0.1", "--obs-var", "0.1"]
    assert filter_main([*base, *given, "--out", str(tmp_path / "g")]) == 0
    err = capsys.readouterr().err
    assert "warning: 2 values lie more than 50 typical steps" in err
    assert "row 40 (time 1953-05-01, z = -9999), row 41 (time 1953-06-01, z = -9999)" in err
    assert "--missing -9999 reads such cells as missing; --fit --robust screens them out" in err
    assert "--fit --robust screens" in (tmp_path / "g" / "summary.txt").read_text()
    assert filter_main([*base, "--fit", "--robust", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr()
    assert "typical steps" not in out.err  # --robust reports what it screened instead
    assert "2 observations screened out" in out.out
    table = pd.read_csv(tmp_path / "r" / "results.csv").query("kind == 'data'")
    assert np.flatnonzero(table["outlier"].to_numpy()).tolist() == [40, 41]
    # --missing -9999 reads the code as missing: the same estimates as the screen
    assert filter_main([*base, "--fit", "--missing", "-9999", "--out", str(tmp_path / "m")]) == 0
    text = capsys.readouterr().out
    assert "typical steps" not in text
    row = lambda t: [ln for ln in t.splitlines() if ln.strip().startswith("sst")][0].split()  # noqa: E731
    assert row(text)[1:9:2] == row(out.out)[1:9:2]  # theta, sigma2, mu, obs_var
    clean_rows = [i for i in range(120) if i not in (40, 41)]
    assert not np.isnan(table["observed"].to_numpy()[clean_rows]).any()


@pytest.mark.parametrize(
    "value,says",
    [(-9999.0, "a missing-value code? --missing -9999 reads such cells as missing"),
     (-99.9, "a missing-value code? --missing -99.9 reads such cells as missing"),
     (250000.0, "a data error? --fit --robust screens them out")],
    ids=["nines", "nines-decimal", "spike"],
)  # fmt: skip
def test_cli_warning_names_one_gross_value_and_suggests_missing_for_codes(tmp_path, capsys, value,
                                                                          says):  # fmt: skip
    pytest.importorskip("pandas")
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    z = FLOW / 100.0  # flows of 4.6 to 13.7 (10^10 m^3): -99.9 is ~90 typical steps away
    z[30] = value
    path = _nile_csv(tmp_path, z)
    args = [path, "--time-col", "year", "--sigma2", "0.15", "--obs-var", "1.5", "--quiet"]
    assert filter_main([*args, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "1 value lies more than 50 typical steps" in err
    assert f"row 30 (time 1901, z = {value:.6g}); {says}" in err
    assert ("--missing" in err) == (value != 250000.0)
