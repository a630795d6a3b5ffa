"""benchmarks/pytest_progress.py: a pytest run in a subprocess with the plugin writes each test's
outcome as it finishes, and the summary names the failed, the unfinished and the slowest."""

import os
import subprocess
import sys

from benchmarks import pytest_progress as P

ROOT = os.path.join(os.path.dirname(__file__), "..")

CASES = '''
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
'''


def test_a_run_writes_every_outcome_and_the_summary_names_them(tmp_path, capsys):
    (tmp_path / "test_cases.py").write_text(CASES)
    log = tmp_path / "run.txt"
    env = dict(os.environ, KALMANSCAN_TEST_LOG=str(log), PYTHONPATH=os.path.abspath(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
         "benchmarks.pytest_progress", "-c", os.devnull, "--rootdir", str(tmp_path),
         str(tmp_path / "test_cases.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    s = P.summarize(str(log))
    assert s["counts"] == {"passed": 1, "failed": 2, "skipped": 1, "xfailed": 1}
    assert [n.split("::")[1] for n in s["failed"]] == ["test_bad", "test_setup_fails"]
    assert s["unfinished"] == []
    # a run cut while a test ran: started, never done
    with open(log, "a") as f:
        f.write("start test_cases.py::test_cut\n")
    assert P.summarize(str(log))["unfinished"] == ["test_cases.py::test_cut"]
    assert P.main([str(log)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "UNFINISHED test_cases.py::test_cut" in out
