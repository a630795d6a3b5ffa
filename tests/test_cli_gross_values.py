"""Gross values (a -9999 missing-value code, a 1e12 data error) said once: ``kalmanscan filter
--fit`` names their rows, values, what they do to the fit and the remedies (``--missing``,
``--robust``) in one warning, absorbing ``fit_ou``'s warning and note of the same rows; from
Python, ``fit_ou`` still warns (an :class:`~kalmanscan.timeseries.robust.OutlierWarning` that
carries the rows) and keeps the note. On the El Nino sea surface temperatures (statsmodels) and
the bundled Nile flows."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

import kalmanscan as ks  # noqa: E402
from kalmanscan.timeseries import load_nile  # noqa: E402
from kalmanscan.timeseries.cli import filter_main  # noqa: E402

# (the Nile with a data error, PNG drawn; conftest.png_not_rasterized)
PNG_DRAWN = {"test_a_single_data_error_in_the_nile_is_said_once_naming_what_it_does"}


def _sst(n=240):
    sm = pytest.importorskip("statsmodels.api")
    d = sm.datasets.elnino.load_pandas().data
    return d.iloc[:, 1:].to_numpy(np.float64).ravel()[:n]


def _csv(tmp_path, columns: dict, name="sst.csv"):
    n = len(next(iter(columns.values())))
    months = pd.date_range("1950-01-01", periods=n, freq="MS").strftime("%Y-%m")
    path = tmp_path / name
    pd.DataFrame({"month": months, **columns}).to_csv(path, index=False, float_format="%.6g")
    return str(path)


def _said(text: str, row: int) -> int:
    """How many messages in ``text`` name ``row``."""
    return len(re.findall(rf"\brow {row} \(time ", text))


def test_fit_says_a_run_of_a_code_once_with_its_rows_values_effect_and_remedies(tmp_path, capsys):
    z = _sst()
    z[[50, 51]] = -9999.0
    path = _csv(tmp_path, {"sst": z})
    rc = filter_main(
        [path, "--time-col", "month", "--fit", "--quiet", "--out", str(tmp_path / "o")]
    )
    assert rc == 0
    out = capsys.readouterr()
    # stderr: one warning names the rows (the library's own warning of them is absorbed) ...
    lines = [ln for ln in out.err.splitlines() if "row 50" in ln]
    assert len(lines) == 1 and _said(out.err, 50) == 1 and _said(out.err, 51) == 1
    (line,) = lines
    assert line.startswith("kalmanscan filter: warning: 2 values lie more than 50 typical steps")
    assert "row 50 (time 1954-03-01, z = -9999), row 51 (time 1954-04-01, z = -9999)" in line
    # ... with what they do to the fit, and both remedies
    assert re.search(r"dominate the likelihood: without them sigma2 is [\d.e+-]+ instead of", line)
    assert "--missing -9999 reads such cells as missing; --robust screens them out" in line
    assert "set those values to NaN" not in out.err and "robust=True" not in out.err
    # the summary (printed and written) holds the same warning once and no note of the rows
    summary = (tmp_path / "o" / "summary.txt").read_text()
    for text in (out.out, summary):
        assert _said(text, 50) == 1 and "warning: " + line.split("warning: ", 1)[1] in text
    # the gross warning comes first: the fit's other warnings (obs_var on its bound) follow it
    warned = [ln for ln in out.err.splitlines() if ln.startswith("kalmanscan filter: warning")]
    assert "typical steps" in warned[0] and len(warned) >= 2


def test_fit_of_several_series_says_each_series_runs_once(tmp_path, capsys):
    """Several series are fitted in blocks (a progress bar's steps): the warning names each
    series' runs with their own effect, once."""
    a, b, c = _sst(), _sst()[::-1].copy(), _sst() + 1.0
    a[[50, 51]] = -9999.0
    c[200] = -9999.0
    path = _csv(tmp_path, {"a": a, "b": b, "c": c})
    rc = filter_main(
        [path, "--time-col", "month", "--fit", "--quiet", "--out", str(tmp_path / "o")]
    )
    assert rc == 0
    out = capsys.readouterr()
    for row in (50, 51, 200):
        assert _said(out.err, row) == 1 and _said(out.out, row) == 1, row
    line = next(ln for ln in out.err.splitlines() if "typical steps" in ln)
    assert "3 values lie" in line
    assert re.search(r"series 'a': row 50 .*, row 51 \(.*\) dominate the likelihood", line)
    assert re.search(r"series 'c': row 200 \(.*\) dominates the likelihood: without it", line)
    assert "series 'b'" not in line and "fit_ou: in series" not in out.err


def test_a_single_data_error_in_the_nile_is_said_once_naming_what_it_does(tmp_path, capsys):
    years, flow = load_nile()
    z = flow.astype(np.float64)
    z[30] = 1e12
    path = tmp_path / "nile.csv"
    path.write_text(
        "year,flow\n" + "".join(f"{int(y)},{v!r}\n" for y, v in zip(years, z.tolist(), strict=True))
    )
    args = [str(path), "--time-col", "year", "--fit", "--fix", "theta=0", "--fix", "mu=0"]
    assert filter_main([*args, "--quiet", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr()
    assert _said(out.err, 30) == 1 and _said(out.out, 30) == 1
    assert "row 30 (time 1901, z = 1e+12) dominates the likelihood: without it obs_var" in out.err
    assert "a data error? --robust screens them out" in out.err


def test_the_warning_is_said_before_a_fit_that_fails(tmp_path, capsys):
    """A 1e300 puts the data's scale beyond float64: the plain fit refuses, and the warning of
    the value (the likely cause) still comes, before the error."""
    z = _sst(120)
    z[40] = 1e300
    path = _csv(tmp_path, {"sst": z})
    rc = filter_main(
        [path, "--time-col", "month", "--fit", "--quiet", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 2
    assert "row 40 (time 1953-05-01, z = 1e+300); a data error?" in err[0]
    assert "expected a scale from 1e-150 to 1e150" in err[1]


def test_joint_fit_and_given_parameters_say_the_warning_once(tmp_path, capsys):
    z = _sst(120)
    z[[40, 41]] = -9999.0
    path = _csv(tmp_path, {"a": z, "b": z + 0.5})
    base = [path, "--time-col", "month", "--quiet"]
    for extra in (["--fit", "--joint"], ["--sigma2", "0.1", "--obs-var", "0.1"]):
        assert filter_main([*base, *extra, "--out", str(tmp_path / extra[1])]) == 0
        out = capsys.readouterr()
        for text in (out.err, out.out):  # one line, naming the row in each series
            assert [_said(ln, 40) for ln in text.splitlines() if _said(ln, 40)] == [2], extra
        assert "--missing -9999" in out.err


def test_fit_ou_from_python_still_warns_and_notes_the_rows():
    from kalmanscan.timeseries.robust import OutlierWarning

    z = _sst()
    z[[50, 51]] = -9999.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = ks.fit_ou(pd.DataFrame({"sst": z}))
    (w,) = [c.message for c in caught if isinstance(c.message, OutlierWarning)]
    assert isinstance(w, UserWarning) and w.gross and w.series == "sst"
    assert w.rows.tolist() == [50, 51] and str(w) == "fit_ou: " + w.note and w.note in fit.notes
    assert w.effect.startswith("dominate the likelihood: without them sigma2 is")
    # the note for Python users: the rows and values, and the remedies in Python's terms
    assert "row 50 (time 50, z = -9999), row 51 (time 51, z = -9999)" in w.note
    assert "set those values to NaN" in w.note and "robust=True" in w.note
    # Python users can filter it by its category, keeping the fit's other warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", OutlierWarning)
        ks.fit_ou(z)
    said = [str(c.message) for c in caught]
    assert said and not any("typical steps" in m for m in said)
