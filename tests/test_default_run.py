"""The cases that the default run leaves to the slow step without CUDA (tests/_default_run.py)
exist, are marked slow there, and leave a case of the same test in the default run."""

import subprocess
import sys

import torch

from tests._default_run import NODE_IDS, REPEATS

# one collection (a fresh interpreter importing torch and the listed files): pytest's own
# ``-m "not slow"`` selects the default run's cases, and the cases it deselects are printed
# too, so that the two together are every collected case
_COLLECT = """
import sys, pytest
class Deselected:
    def pytest_deselected(self, items):
        for item in items:
            print("DESELECTED " + item.nodeid)
sys.exit(pytest.main(sys.argv[1:], plugins=[Deselected()]))
"""


def _collected(collected):
    """``(every, default)``: the node ids of the files of REPEATS, and those ``-m "not slow"``
    keeps: from this process's own collection (``collected``, tests/conftest.py's) where it
    holds every file of REPEATS (a whole run's, each worker's under xdist), else from a
    collection of those files in a fresh interpreter."""
    if set(REPEATS) <= {node.split("::")[0] for node in collected}:
        every = {node for node in collected if node.split("::")[0] in REPEATS}
        return every, {node for node in every if not collected[node]}
    out = subprocess.run(
        [sys.executable, "-c", _COLLECT, "--collect-only", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", "-n", "0", "-m", "not slow", *REPEATS],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if "::" in line]
    deselected = {
        line.removeprefix("DESELECTED ") for line in lines if line.startswith("DESELECTED ")
    }
    default = {line for line in lines if not line.startswith("DESELECTED ")}
    return default | deselected, default


def test_listed_cases_exist_and_leave_a_case_in_the_default_run(pytestconfig):
    every, default = _collected(getattr(pytestconfig, "collected_cases", {}))
    if torch.cuda.is_available():
        # a CUDA machine runs every listed case its own parametrization has by default (some
        # tests take GPU sizes there: the CPU cases listed need not exist)
        assert NODE_IDS & every <= default, sorted(NODE_IDS & every - default)
        return
    assert not NODE_IDS - every, sorted(NODE_IDS - every)  # renamed or removed cases
    assert not NODE_IDS & default  # marked slow without CUDA
    for node in NODE_IDS:  # another case of the same test stays
        test = node.split("[")[0]
        assert any(d.split("[")[0] == test for d in default), f"{test}: no case left by default"
