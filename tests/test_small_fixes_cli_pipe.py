"""The ``kalmanscan`` command whose reader has gone (``kalmanscan filter nile.csv ... | head -1``)
ends quietly with exit status 141 (128 + SIGPIPE, as the shell reports for ``seq ... | head -1``),
no BrokenPipeError traceback nor "Exception ignored" note on stderr. The reader is closed before
the command starts, so every write to stdout fails: deterministic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kalmanscan

ROOT = Path(kalmanscan.__file__).resolve().parents[1]  # (the tree under test, in the child too)
NILE = ROOT / "kalmanscan" / "data" / "nile.csv"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def _run_into_closed_pipe(args, cwd):
    r, w = os.pipe()
    os.close(r)  # the reader is gone
    try:
        p = subprocess.run(
            [sys.executable, "-m", "kalmanscan", *args],
            stdout=w, stderr=subprocess.PIPE, cwd=cwd, env=ENV, timeout=300,
        )  # fmt: skip
    finally:
        os.close(w)
    return p.returncode, p.stderr.decode()


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["filter", str(NILE), "--time-col", "year", "--fit", "--forecast", "3", "--quiet"],
    ],
    ids=["version", "help", "filter-nile-fit"],
)
def test_closed_pipe_exits_quietly(args, tmp_path):
    if args[0] == "filter":
        args = [*args, "--out", str(tmp_path / "out")]
    rc, err = _run_into_closed_pipe(args, tmp_path)
    assert rc == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception" not in err, err


def test_open_pipe_still_gets_everything(tmp_path):
    """A reader that reads to the end gets the whole output and status 0."""
    args = ["filter", str(NILE), "--time-col", "year", "--fit", "--quiet", "--out",
            str(tmp_path / "out")]  # fmt: skip
    p = subprocess.run([sys.executable, "-m", "kalmanscan", *args], capture_output=True,
                       cwd=tmp_path, env=ENV, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().startswith(f"{NILE}: 100 time steps")
    assert "log-likelihood per series: flow=" in p.stdout.decode()
