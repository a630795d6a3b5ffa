"""Issue 22 item 8, standard errors on the boundary explained: where a variance estimate sits on
its bound 0 (statsmodels' CO2, sunspots and El Nino records), ``summary()`` and the CLI report
the one-sided 95% profile-likelihood upper bound (chi-bar-squared rule: a log-likelihood drop of
chi2_1(0.90) / 2 = 1.353) in place of a NaN standard error, and say why. Each bound is checked
by an independent refit through the public ``fit_ou(fix=...)``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan.testing import assert_close, tolerance
from kalmanscan.timeseries.profile import drop_for

# (a fit on its bound, PNG drawn; conftest.png_not_rasterized)
PNG_DRAWN = {"test_cli_reports_the_bound"}

sm = pytest.importorskip("statsmodels.api")
LOCAL_LEVEL = {"theta": 0.0, "mu": 0.0}
DROP_ATOL = tolerance("profile_drop", "float64")


def _records():
    co2 = sm.datasets.co2.load_pandas().data["co2"]
    sun = sm.datasets.sunspots.load_pandas().data
    eln = sm.datasets.elnino.load_pandas().data
    return {
        "co2": (co2.to_numpy(), None),  # weekly, with gaps
        "sunspots": (sun["SUNACTIVITY"].to_numpy(), sun["YEAR"].to_numpy()),
        "elnino": (eln.iloc[:, 1:].to_numpy().ravel(), None),  # monthly, 1950-2010
    }


RECORDS = _records()


def _fit(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ks.fit_ou(*args, **kw)


def test_drop_is_the_chi_bar_squared_rule():
    assert_close(drop_for(0.95), 0.5 * 2.705543454095404, "rounding", "float64", what="drop")
    assert round(drop_for(0.95), 3) == 1.353


@pytest.mark.parametrize("fix", [None, LOCAL_LEVEL], ids=["ou", "local-level"])
@pytest.mark.parametrize("name", list(RECORDS))
def test_boundary_bound_is_where_the_profile_drops_1353(name, fix):
    z, t = RECORDS[name]
    fit = _fit(z, t, fix=fix)
    assert fit.at_boundary["obs_var"] and math.isnan(fit.stderr["obs_var"])
    b = fit.upper_bound["obs_var"]
    assert 0 < b < np.nanvar(z)
    # independent check: the public fit with obs_var held at b (and at b / 2) refits the others
    at_b = _fit(z, t, fix={**(fix or {}), "obs_var": b})
    assert fit.loglik - at_b.loglik == pytest.approx(drop_for(0.95), abs=DROP_ATOL)
    half = _fit(z, t, fix={**(fix or {}), "obs_var": b / 2})
    assert 0 <= fit.loglik - half.loglik + tolerance("fit_loglik", "float64") < drop_for(0.95)
    # interior parameters carry no bound
    assert all(math.isnan(v) for p, v in fit.upper_bound.items() if p != "obs_var")


def test_summary_reports_the_bound_and_says_why():
    z, _ = RECORDS["co2"]
    fit = _fit(z, fix=LOCAL_LEVEL)
    text = fit.summary()
    row = text.splitlines()[3].split()
    assert row[-3] == "<" + format(fit.upper_bound["obs_var"], ".4g")
    assert "nan" not in row[-3]
    assert "one-sided 95% profile-likelihood upper bound" in text
    assert "50:50 mixture of chi2_0 and chi2_1" in text and "1.353" in text


@pytest.mark.parametrize("scale", [1e-120, 1e-13, 1e13, 1e120])
def test_the_bound_scales_with_the_data(scale):
    z, _ = RECORDS["sunspots"]
    ref = _fit(z, fix=LOCAL_LEVEL).upper_bound["obs_var"]
    got = _fit(z * scale, fix=LOCAL_LEVEL).upper_bound["obs_var"]
    assert_close(got / scale**2, ref, "rescaled", "float64", what="bound / scale**2")


def test_sigma2_on_its_boundary():
    rng = np.random.default_rng(0)
    z = rng.normal(size=200)  # white noise: no level variance
    fit = _fit(z, fix=LOCAL_LEVEL)
    assert fit.at_boundary["sigma2"] and not fit.at_boundary["obs_var"]
    b = fit.upper_bound["sigma2"]
    at_b = _fit(z, fix={**LOCAL_LEVEL, "sigma2": b})
    assert fit.loglik - at_b.loglik == pytest.approx(drop_for(0.95), abs=DROP_ATOL)
    assert math.isnan(fit.upper_bound["obs_var"])


def test_several_series_bound_only_where_on_the_boundary():
    pytest.importorskip("pandas")
    eln = sm.datasets.elnino.load_pandas().data.set_index("YEAR")[["JAN", "FEB", "MAR"]]
    fit = _fit(eln)
    on = np.asarray(fit.at_boundary["obs_var"])
    ub = np.asarray(fit.upper_bound["obs_var"])
    assert on.tolist() == [False, True, True]
    assert np.isnan(ub[0]) and (ub[1:] > 0).all()
    for i in (1, 2):
        col = eln.iloc[:, i]
        one = _fit(col)
        # the batch fit is each series's own fit (the batched Newton freezes converged groups)
        assert_close(ub[i], one.upper_bound["obs_var"], "fit", "float64", what="bound")
        at_b = _fit(col, fix={"obs_var": ub[i]})
        assert one.loglik - at_b.loglik == pytest.approx(drop_for(0.95), abs=DROP_ATOL)
    assert "in series 'FEB', 'MAR'" in " ".join(fit.notes)


def test_joint_fit_bound():
    z, _ = RECORDS["sunspots"]
    Z = z[:308].reshape(2, 154).T  # the two halves of the record, one parameter set
    fit = _fit(Z, fix=LOCAL_LEVEL, joint=True)
    assert fit.at_boundary["obs_var"]
    b = fit.upper_bound["obs_var"]
    assert isinstance(b, float) and b > 0
    at_b = _fit(Z, fix={**LOCAL_LEVEL, "obs_var": b}, joint=True)
    assert fit.total_loglik - at_b.total_loglik == pytest.approx(drop_for(0.95), abs=DROP_ATOL)
    assert fit.summary().splitlines()[3].split()[-3] == "<" + format(b, ".4g")


def test_no_bound_without_stderr_or_off_the_boundary():
    z, _ = RECORDS["co2"]
    assert _fit(z, fix=LOCAL_LEVEL, stderr=False).upper_bound == {}
    from kalmanscan.timeseries import load_nile

    years, flow = load_nile()
    fit = _fit(flow, years, fix=LOCAL_LEVEL)
    assert not any(fit.at_boundary.values()) and fit.upper_bound == {}
    assert "<" not in fit.summary().splitlines()[3]


def test_cli_reports_the_bound(tmp_path, capsys):
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    co2 = sm.datasets.co2.load_pandas().data
    path = tmp_path / "co2.csv"
    co2.rename_axis("date").to_csv(path)
    args = [str(path), "--time-col", "date", "--fit", "--fix", "theta=0", "--fix", "mu=0"]
    assert filter_main([*args, "--quiet", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    want = _fit(co2["co2"], fix=LOCAL_LEVEL, time_unit="1D").upper_bound["obs_var"]
    row = [ln for ln in out.splitlines() if ln.strip().startswith("co2")][0].split()
    assert row[4] == "<" + format(want, ".4g")
    assert "one-sided 95% profile-likelihood upper bound" in out
    assert (tmp_path / "o" / "summary.txt").read_text().count("<" + format(want, ".4g")) == 1


def test_cli_several_series_report_bounds_per_series(tmp_path, capsys):
    pytest.importorskip("xarray")
    pytest.importorskip("matplotlib")
    from kalmanscan.timeseries.cli import filter_main

    eln = sm.datasets.elnino.load_pandas().data[["YEAR", "JAN", "FEB", "MAR"]]
    eln = eln.assign(YEAR=eln["YEAR"].astype(int))
    path = tmp_path / "elnino.csv"
    eln.to_csv(path, index=False)
    assert filter_main([str(path), "--time-col", "YEAR", "--fit", "--quiet",
                        "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    rows = {
        ln.split()[0]: ln.split()
        for ln in out.splitlines()
        if ln.strip()[:3] in ("JAN", "FEB", "MAR")
    }
    assert not rows["JAN"][8].startswith("<")
    assert rows["FEB"][8].startswith("<") and rows["MAR"][8].startswith("<")
    assert "series 'FEB', 'MAR': obs_var is on its bound 0" in out


def test_a_failed_profile_says_so(monkeypatch):
    import kalmanscan.timeseries.profile as profile

    monkeypatch.setattr(profile, "_MAX_ITER", 1)  # no profile fit can converge
    z, t = RECORDS["sunspots"]
    fit = _fit(z, t)
    assert fit.at_boundary["obs_var"] and math.isnan(fit.upper_bound["obs_var"])
    assert any("no profile-likelihood bound could be computed" in n for n in fit.notes)
    assert "<" not in fit.summary().splitlines()[3]


def test_bounds_are_computed_when_first_read(monkeypatch):
    """A fit does not pay for the profile refits until a bound or a note is read (then once)."""
    import kalmanscan.timeseries.profile as profile

    calls = []
    real = profile.report
    monkeypatch.setattr(profile, "report", lambda *a: calls.append(1) or real(*a))
    z, _ = RECORDS["co2"]
    fit = _fit(z, fix=LOCAL_LEVEL)
    assert fit.at_boundary["obs_var"] and calls == []
    b = fit.upper_bound["obs_var"]
    assert calls == [1] and b > 0
    assert any("profile-likelihood upper bound" in n for n in fit.notes)
    assert "<" + format(b, ".4g") in fit.summary() and calls == [1]
