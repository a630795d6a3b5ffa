"""Issue 22 item 9: the examples of docs/getting-started.md and docs/cli.md run exactly as written
(python blocks in order in one scope; the `kalmanscan` command lines through the CLI), in a scratch
directory holding a copy of examples/data; and examples/nile.py says which parameters it uses."""

from __future__ import annotations

import pathlib
import re
import shlex
import shutil

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("xarray")
matplotlib = pytest.importorskip("matplotlib")

from kalmanscan.cli import main  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def _scratch(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    shutil.copytree(REPO / "examples" / "data", tmp_path / "examples" / "data")
    monkeypatch.chdir(tmp_path)


def _commands(text):
    """Indented `kalmanscan ...` lines that are runnable (no [optional] placeholders)."""
    lines = re.findall(r"^    (kalmanscan [^\n]+)$", text, flags=re.M)
    return [c for c in lines if "[" not in c]


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_cli_page_runs_as_written(tmp_path, monkeypatch):
    _scratch(tmp_path, monkeypatch)
    text = (REPO / "docs" / "cli.md").read_text()
    commands = _commands(text)
    assert any("irregular_sensors.csv" in c for c in commands)
    for command in commands:
        assert main(shlex.split(command)[1:] + ["--quiet"] * ("filter" in command)) == 0, command
    scope = {}
    for block in _python_blocks(text):
        exec(compile(block, "cli.md", "exec"), scope)
    assert scope["ds"].sizes["series"] == 2


def test_getting_started_runs_as_written(tmp_path, monkeypatch):
    _scratch(tmp_path, monkeypatch)
    text = (REPO / "docs" / "getting-started.md").read_text()
    rng = np.random.default_rng(0)
    rows = "".join(f"{i},{v:.4f},{w:.4f}\n" for i, (v, w) in enumerate(rng.normal(size=(40, 2))))
    (tmp_path / "data.csv").write_text("t,y,y2\n" + rows)  # the page's "your own CSV"
    for command in _commands(text):
        assert main(shlex.split(command)[1:]) == 0, command
    scope = {}
    for block in _python_blocks(text):
        exec(compile(block, "getting-started.md", "exec"), scope)  # no names filled in
    assert scope["out"]["mean"].dims == ("time", "station")
    assert scope["params"]["sigma2"].sizes["station"] == 2
    assert (tmp_path / "bands.png").exists()


def test_getting_started_forecast_comment_matches_the_code(tmp_path, monkeypatch):
    text = (REPO / "docs" / "getting-started.md").read_text()
    m = re.search(r"print\(fc\.mean\[0\], fc\.lower\[0\], fc\.upper\[0\]\)\s+# ([\d. ]+)", text)
    assert m, "the forecast line and its comment"
    import kalmanscan as ks
    from kalmanscan.timeseries import load_nile

    years, flow = load_nile()
    fc = ks.fit_ou(flow, years, fix={"theta": 0.0, "mu": 0.0}).forecast(10, coverage=0.9)
    want = [float(x) for x in m.group(1).split()]
    got = [fc.mean[0], fc.lower[0], fc.upper[0]]
    for w, g in zip(want, got, strict=True):
        decimals = len(str(w).split(".")[1])
        assert round(float(g), decimals) == pytest.approx(w, abs=10.0**-decimals), (want, got)


def test_nile_example_says_it_uses_the_published_parameters():
    text = (REPO / "examples" / "nile.py").read_text()
    assert "published parameters" in text.split('"""')[1]  # the module docstring
    assert 'print("steps 2 and 3 use the published parameters' in text


def test_cli_page_robust_example_screens_what_it_says(tmp_path, monkeypatch):
    """docs/cli.md's --robust example: one reading of sensor_a, 6.621 on 7 May 2024."""
    import pandas as pd

    _scratch(tmp_path, monkeypatch)
    text = (REPO / "docs" / "cli.md").read_text()
    command = [c for c in _commands(text) if "--robust" in c]
    assert len(command) == 1 and "6.621 on 7 May 2024" in text
    assert main(shlex.split(command[0])[1:] + ["--quiet"]) == 0
    table = pd.read_csv(tmp_path / "robust" / "results.csv")
    hit = table[table["outlier"].fillna(False).astype(bool)]
    assert hit[["series", "observed"]].values.tolist() == [["sensor_a", 6.621]]
    assert hit["time"].iloc[0].startswith("2024-05-07")
