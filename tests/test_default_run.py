"""The cases that the default run leaves to the slow step without CUDA (tests/_default_run.py)
exist, are marked slow there, and leave a case of the same test in the default run."""

import subprocess
import sys

import torch

from tests._default_run import NODE_IDS, REPEATS


def _collected(*args):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", "-n", "0", *args, *REPEATS],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line for line in out.splitlines() if "::" in line}


def test_listed_cases_exist_and_leave_a_case_in_the_default_run():
    every = _collected()
    assert not NODE_IDS - every, sorted(NODE_IDS - every)  # renamed or removed cases
    default = _collected("-m", "not slow")
    if torch.cuda.is_available():
        assert NODE_IDS <= default  # a CUDA machine runs them all by default
        return
    assert not NODE_IDS & default  # marked slow without CUDA
    for node in NODE_IDS:  # another case of the same test stays
        test = node.split("[")[0]
        assert any(d.split("[")[0] == test for d in default), f"{test}: no case left by default"
