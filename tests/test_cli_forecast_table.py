"""The summary's forecast table (``kalmanscan filter --forecast N``) in significant digits: El Nino
sea surface temperatures (statsmodels) in units of 1e12 degrees (1e-11) printed as 0.0000
with the interval [0.00, 0.00]; and it says what it leaves to results.csv (steps past the tenth,
series past the fourth) instead of stopping silently."""

from __future__ import annotations

import re

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("xarray")
pytest.importorskip("matplotlib")
sm = pytest.importorskip("statsmodels.api")

from kalmanscan.timeseries.cli import filter_main  # noqa: E402

ROW = re.compile(r"^\s+(\d{4}-\d\d-\d\d|\d+)\s+(\S+)\s+(\S+)\s+\[(\S+), (\S+)\]$")


def _table(text):
    return [m.groups() for m in map(ROW.match, text.splitlines()) if m]


@pytest.mark.parametrize("scale", [1e-12, 1.0, 1e12], ids=["tiny", "unit", "huge"])
def test_forecast_table_shows_the_values_at_any_scale(tmp_path, capsys, scale):
    sst = sm.datasets.elnino.load_pandas().data.iloc[:, 1:].to_numpy(np.float64).ravel()[:240]
    months = pd.date_range("1950-01-01", periods=240, freq="MS").strftime("%Y-%m-%d")
    path = tmp_path / "sst.csv"
    pd.DataFrame({"date": months, "sst": sst * scale}).to_csv(
        path, index=False, float_format="%.17g"
    )
    out = tmp_path / "o"
    args = [str(path), "--time-col", "date", "--fit", "--forecast", "12", "--quiet"]
    assert filter_main([*args, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = _table(text)
    assert len(rows) == 10 and rows[0][0] == "1970-01-01"
    fc = pd.read_csv(out / "results.csv").query("kind == 'forecast'")
    for (when, mean, se, lo, hi), (_, want) in zip(rows, fc.iterrows(), strict=False):
        assert when == want["time"]
        assert float(mean) == pytest.approx(want["mean"], rel=1e-6)
        assert float(se) == pytest.approx(want["predictive_sd"], rel=1e-4)
        assert float(lo) == pytest.approx(want["lower90"], rel=1e-4)
        assert float(hi) == pytest.approx(want["upper90"], rel=1e-4)
        assert 20 * scale < float(mean) < 30 * scale and float(se) > 0 and float(lo) < float(hi)
    assert "  ... 2 more steps (to 1970-12-01) in results.csv" in text


def test_forecast_table_names_the_series_it_leaves_out(tmp_path, capsys):
    d = sm.datasets.macrodata.load_pandas().data
    cols = ["infl", "unemp", "tbilrate", "realint", "cpi", "pop"]
    quarters = [f"{int(y)}Q{int(q)}" for y, q in zip(d.year, d.quarter, strict=True)]
    path = tmp_path / "macro.csv"
    pd.DataFrame({"quarter": quarters, **{c: d[c] for c in cols}}).to_csv(path, index=False)
    args = [str(path), "--time-col", "quarter", "--sigma2", "0.01", "--obs-var", "0.01"]
    assert filter_main([*args, "--forecast", "3", "--quiet", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert [ln.strip() for ln in text.splitlines() if ln.startswith("  series=")] == [
        f"series={c}" for c in cols[:4]
    ]
    assert "  ... 2 more series in results.csv" in text and "more steps" not in text
    assert len(_table(text)) == 12
