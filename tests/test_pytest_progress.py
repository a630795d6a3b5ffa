"""benchmarks/pytest_progress.py: a pytest run in a subprocess with the plugin writes each test's
outcome as it finishes, and the summary names the failed, the unfinished and the slowest."""

import os
import subprocess
import sys

import pytest

from benchmarks import pytest_progress as P

ROOT = os.path.join(os.path.dirname(__file__), "..")

CASES = """
import pytest

def test_ok():
    pass

def test_bad():
    assert 1 == 2

@pytest.mark.skip(reason="no")
def test_skipped():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_setup_fails(broken):
    pass

@pytest.mark.xfail(reason="known")
def test_known():
    assert 0
"""


def _run(tmp_path, log, workers):
    env = dict(os.environ, KALMANSCAN_TEST_LOG=str(log), PYTHONPATH=os.path.abspath(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)  # (this test may itself run in a worker)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider",
         "-p", "benchmarks.pytest_progress", "-c", os.devnull, "--rootdir", str(tmp_path),
         str(tmp_path / "test_cases.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_writes_every_outcome_and_the_summary_names_them(tmp_path, capsys, workers):
    (tmp_path / "test_cases.py").write_text(CASES)
    log = tmp_path / "run.txt"
    proc = _run(tmp_path, log, workers)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    s = P.summarize(str(log))
    assert s["counts"] == {"passed": 1, "failed": 2, "skipped": 1, "xfailed": 1}
    assert [n.split("::")[1] for n in s["failed"]] == ["test_bad", "test_setup_fails"]
    assert s["unfinished"] == []
    why = {n.split("::")[1]: w for n, w in s["why"].items()}
    assert "assert 1 == 2" in why["test_bad"] and "RuntimeError: setup" in why["test_setup_fails"]
    # one writer (under xdist the controller): each test's start and outcome once
    kinds = [ln.split("\t")[0] for ln in log.read_text().splitlines()]
    assert kinds.count("start") == 5 and sum(k in P._RANK for k in kinds) == 5
    # a run cut while a test ran: started, never done
    t = float(log.read_text().splitlines()[-1].split("\t")[1])
    with open(log, "a") as f:  # a run cut while two tests ran: started, never done
        for dt, name in ((10, "test_cut"), (40.5, "test_late")):
            f.write(f"start\t{t + dt}\ttest_cases.py::{name}\n")
    s = P.summarize(str(log))
    assert s["unfinished"] == ["test_cases.py::test_cut", "test_cases.py::test_late"]
    assert s["running_s"] == {"test_cases.py::test_cut": 30.5, "test_cases.py::test_late": 0.0}
    assert P.main([str(log)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "assert 1 == 2" in out
    assert "UNFINISHED test_cases.py::test_cut  (running for 30 s at the file's last line)" in out
