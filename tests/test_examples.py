"""Each script in examples/ runs end to end in a subprocess and writes its outputs."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("xarray")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

REPO = pathlib.Path(__file__).resolve().parents[1]

CASES = {
    "nile": (
        [],
        ["nile_gaps.png", "nile_gaps.nc"],
        ["-632.5456", "1971 forecast 798.3703 (s.e. 143.5279)", "loglik -380.5871"],
    ),
    "irregular_gaps": (
        [],
        ["irregular_gaps.png"],
        ["sensor_a", "widest 90% band inside the 20-day gap"],
    ),
    "many_series": (
        ["--series", "12", "--steps", "150"],
        ["params.nc", "filtered.nc"],
        ["12 series x 150 steps", "dask (4 chunks, 2 workers)"],
    ),
}


# what an example needs beyond the imports above (the xarray extra brings them)
NEEDS = {"many_series": ("dask", "distributed")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path):
    for module in NEEDS.get(name, ()):
        if importlib.util.find_spec(module) is None:  # (not imported here: the script does)
            pytest.skip(f"could not import {module!r}")
    extra, files, phrases = CASES[name]
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / f"{name}.py"), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in files:
        assert (out / f).stat().st_size > 0, f
    for phrase in phrases:
        assert phrase in proc.stdout, (phrase, proc.stdout)
