"""Every result JSON under benchmarks/results/ says when it was measured (benchmarks/results/
README.md): a ``date`` at the top level, in its ``meta``, or in every row of a list; and the
regime battery's ``--json`` writes the date and device into each row."""

import datetime
import json
import os

import pytest

RESULTS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results")
FILES = sorted(f for f in os.listdir(RESULTS) if f.endswith(".json"))


def _dates(doc) -> list[str]:
    if isinstance(doc, list):
        return [row.get("date") for row in doc]
    return [doc.get("date") or doc.get("meta", {}).get("date")]


@pytest.mark.parametrize("name", FILES)
def test_result_has_date(name):
    with open(os.path.join(RESULTS, name)) as f:
        doc = json.load(f)
    dates = _dates(doc)
    assert dates and all(dates), f"{name}: no date (top level, meta, or each row)"
    for d in set(dates):
        datetime.datetime.fromisoformat(d)  # ISO 8601 (a day, or a time with its offset)


def test_regimes_json_rows_carry_date_and_device(tmp_path):
    pytest.importorskip("mpmath")
    from kalmanscan.validation.regimes import main

    out = tmp_path / "r.json"
    # a short constant-parameter regime (the sequential backend's Python loop over 500 steps,
    # 3 s; 10 s for 1000 steps): float64 and gradient rows, and a float32 row that carries an
    # error (obs_var below float32's range), stamped as well
    name = "obs_var 1e-155, a=0.9 p=1"
    main(["--regime", name, "--backend", "sequential", "--no-certify", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert {r["kind"] for r in rows} == {"scalar", "grad"}
    for r in rows:
        when = datetime.datetime.fromisoformat(r["date"])
        assert when.utcoffset() == datetime.timedelta(0)
        assert isinstance(r["device"], str) and r["device"]
