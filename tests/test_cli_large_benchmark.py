"""benchmarks/cli_large.py at a small size: it runs the whole command in fresh processes and
reports wall and compute times of each run."""

import pytest

pytest.importorskip("xarray")
pytest.importorskip("matplotlib")

from benchmarks import cli_large  # noqa: E402


def test_the_benchmark_runs_the_command_and_reports_its_times(tmp_path):
    res = cli_large.run(rows=300, repeats=1)  # (each repeat a fresh process: torch's import)
    assert res["shape"] == {"rows": 300, "series": 2} and len(res["wall_s"]) == 1
    assert 0 < res["median_compute_s"] < res["median_wall_s"]
    assert res["results_csv_bytes"] > 300 * 2 * 50  # a row a step and series, every column
    assert res["command"].startswith("kalmanscan filter big.csv --time-col time")


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli_large.main(["--rows", "1"])
    assert "--rows: expected >= 2" in capsys.readouterr().err


def test_the_docs_quote_the_stored_result():
    """docs/cli.md's figure is benchmarks/results/cli-large-cpu.json's, with the command."""
    import json
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parents[1]
    res = json.loads((repo / "benchmarks" / "results" / "cli-large-cpu.json").read_text())
    text = " ".join((repo / "docs" / "cli.md").read_text().split())
    m = re.search(
        r"a million hourly rows of two series take (\d+) s end to end .*?, ([\d.]+) s of it "
        r"filtering and smoothing and ([\d.]+) s reading the CSV",
        text,
    )
    assert m, "the large-file figure in docs/cli.md"
    assert int(m[1]) == round(res["median_wall_s"])
    assert float(m[2]) == round(res["median_compute_s"], 1)
    assert float(m[3]) == round(res["median_read_s"], 1)
    assert res["shape"] == {"rows": 1000000, "series": 2}
    assert "--rows 1000000 --repeats 3 --out benchmarks/results/cli-large-cpu.json" in text
