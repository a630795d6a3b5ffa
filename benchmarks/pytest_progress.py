"""A pytest plugin that writes each test's outcome and time as it finishes, for runs that a job
limit may cut (the whole suite on a GPU machine: its summary of failures comes only at the end,
and a cut ``-v`` log of pytest-xdist workers is easy to misread).

    KALMANSCAN_TEST_LOG=run.txt python -m pytest -p benchmarks.pytest_progress -n 15 tests/...
    python benchmarks/pytest_progress.py run.txt      # outcomes, failures, unfinished, slowest

Every worker appends to the file: ``start <nodeid>`` when a test starts, then ``<outcome>
<seconds> <nodeid>`` once it is done (``passed``, ``failed``, ``skipped``; a failing setup or
teardown is written as ``failed`` too, expected failures as ``xfailed`` or ``xpassed``; seconds are setup + call + teardown). A test started but
never done was running when the run was cut.
"""

from __future__ import annotations

import collections
import os
import sys
import time

_ENV = "KALMANSCAN_TEST_LOG"
_started: dict[str, float] = {}
_worst: dict[str, str] = {}
_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2}


def _write(line: str) -> None:
    path = os.environ.get(_ENV)
    if path:
        with open(path, "a") as f:  # one short append a line: workers do not interleave lines
            f.write(line + "\n")


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.perf_counter()
    _write(f"start {nodeid}")


def pytest_runtest_logreport(report):
    # a test's outcome: the worst of its setup, call and teardown
    outcome = "failed" if report.failed else report.outcome
    if hasattr(report, "wasxfail"):  # an expected failure (strict xpasses fail)
        outcome = "xfailed" if report.skipped else "xpassed"
    if _RANK[outcome] > _RANK[_worst.get(report.nodeid, "passed")]:
        _worst[report.nodeid] = outcome


def pytest_runtest_logfinish(nodeid, location):
    took = time.perf_counter() - _started.pop(nodeid, time.perf_counter())
    _write(f"{_worst.pop(nodeid, 'passed')} {took:.2f} {nodeid}")


def summarize(path: str, slowest: int = 20) -> dict:
    """The file's outcomes: counts, failed tests, tests started and never done, the slowest."""
    started, done = [], {}
    with open(path) as f:
        for line in f:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "start":
                started.append(rest)
            elif kind in _RANK:
                secs, _, nodeid = rest.partition(" ")
                done[nodeid] = (kind, float(secs))
    counts = collections.Counter(kind for kind, _ in done.values())
    return dict(
        counts=dict(counts),
        failed=sorted(n for n, (kind, _) in done.items() if kind == "failed"),
        unfinished=sorted(set(started) - set(done)),
        slowest=sorted(((s, n) for n, (_, s) in done.items()), reverse=True)[:slowest],
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python benchmarks/pytest_progress.py LOG", file=sys.stderr)
        return 2
    s = summarize(argv[0])
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items())))
    for n in s["failed"]:
        print(f"FAILED {n}")
    for n in s["unfinished"]:
        print(f"UNFINISHED {n}")
    for secs, n in s["slowest"]:
        print(f"{secs:8.1f} s  {n}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
